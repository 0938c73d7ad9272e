//! The library's errors.

use crate::env::SOCKET_ENV;
use crate::types::SendError;

/// Errors of the library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No device: `ULNIC_SOCKET` is unset and there is no guest device.
    #[error("no ulnic device: set {SOCKET_ENV} to a node socket of `ulnic device` (guest device files come with the kernel driver)")]
    NoDevice,
    /// The driver failed (attach, command, memory).
    #[error(transparent)]
    Driver(#[from] ulnic_host_attach::Error),
    /// A call to the kernel driver failed.
    #[error("ulnic driver: {0}")]
    Os(std::io::Error),
    /// The NIC this handle was opened on is gone: the device was removed,
    /// or restarted (`ulnic cluster restart-device` replugs it). Its
    /// endpoints and everything created with them no longer exist; open
    /// the NIC again ([`Nic::open`]) to continue.
    ///
    /// ```
    /// let e = ulnic::Error::DeviceGone;
    /// assert!(e.to_string().contains("open it again"));
    /// ```
    #[error(
        "the ulnic device went away (removed or restarted): its endpoints are gone; open it again"
    )]
    DeviceGone,
    /// The device stopped answering commands: one timed out (ETIMEDOUT),
    /// and the driver has run none since (EIO), as the device may still
    /// answer the old one late (spec §4, §9). Endpoints already open still
    /// move data; nothing can be created or changed until the device is
    /// plugged again (`ulnic cluster restart-device`).
    ///
    /// ```
    /// let e = ulnic::Error::DeviceNotAnswering;
    /// assert!(e.to_string().contains("stopped answering"));
    /// ```
    #[error(
        "the ulnic device stopped answering commands (one timed out): open endpoints still move data, but nothing can be set up until the device is restarted"
    )]
    DeviceNotAnswering,
    /// A ring is full; retry after polling.
    #[error("ring full; poll events or receives and retry")]
    WouldBlock,
    /// An argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// What was asked cannot work in this setting (EOPNOTSUPP); the text
    /// says why.
    ///
    /// ```
    /// let e = ulnic::Error::NotSupported("no PIO aperture");
    /// assert_eq!(e.errno(), libc::EOPNOTSUPP);
    /// ```
    #[error("not supported here: {0}")]
    NotSupported(&'static str),
    /// A remote access (RDMA) a library structure made failed.
    #[error("remote access failed: {0}")]
    Remote(SendError),
    /// A blocking call returned because a close message (spec §5.11) from
    /// `from` waits in the endpoint's receive queue: the peer went away,
    /// as CLAN wakes every thread blocked on an endpoint when its close
    /// message arrives. The message stays queued for
    /// [`Endpoint::poll_recv`](crate::Endpoint::poll_recv).
    ///
    /// ```
    /// let e = ulnic::Error::PeerClosed { from: ulnic::Address { node: 1, port: 5 } };
    /// assert_eq!(e.errno(), libc::ECONNRESET);
    /// ```
    #[error("the peer {}:{} closed: its close message arrived", .from.node, .from.port)]
    PeerClosed {
        /// Who sent the close message.
        from: crate::types::Address,
    },
}

impl Error {
    /// Whether the host-attach driver refused a command because the caller
    /// is a forked child of the process that attached (spec §2.4).
    ///
    /// ```
    /// assert!(!ulnic::Error::WouldBlock.is_forked_child());
    /// ```
    pub fn is_forked_child(&self) -> bool {
        matches!(
            self,
            Error::Driver(ulnic_host_attach::Error::ForkedChild(..))
        )
    }

    /// The `errno` value that stands for this error, for C callers and
    /// for the socket layer (always positive): a device status maps as
    /// the Linux driver maps it (spec §9), a failed remote access as the
    /// nearest socket error.
    ///
    /// ```
    /// assert_eq!(ulnic::Error::WouldBlock.errno(), libc::EAGAIN);
    /// assert_eq!(ulnic::Error::DeviceGone.errno(), libc::ENODEV);
    /// ```
    pub fn errno(&self) -> i32 {
        use ulnic_host_attach::Error as D;
        match self {
            Error::NoDevice | Error::DeviceGone => libc::ENODEV,
            Error::Os(e) => e.raw_os_error().unwrap_or(libc::EIO),
            Error::DeviceNotAnswering => libc::EIO,
            Error::WouldBlock => libc::EAGAIN,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::Remote(e) => e.errno(),
            Error::PeerClosed { .. } => libc::ECONNRESET,
            Error::Driver(d) => match d {
                D::Command { status, .. } => status_errno(*status),
                D::OutOfMemory(_) => libc::ENOMEM,
                D::NodeBusy(_) | D::ForkedChild(..) => libc::EBUSY,
                D::Incompatible(_) | D::BadResponse(_) => libc::EPROTO,
                D::Timeout(_) => libc::ETIMEDOUT,
                D::ControlQueueDead(_) => libc::EIO,
                D::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
                _ => libc::EIO,
            },
        }
    }
}

/// The errno for a device status, as the Linux driver gives it (spec §9):
/// the contract's table, `ulnic_abi::status::ERRNO`, which the driver's is
/// generated from.
fn status_errno(status: u32) -> i32 {
    use ulnic_abi::status::Errno;
    // Exhaustive: an errno added to the table does not build until mapped.
    match ulnic_abi::status::errno(status) {
        Errno::EINVAL => libc::EINVAL,
        Errno::ENOSPC => libc::ENOSPC,
        Errno::ENOENT => libc::ENOENT,
        Errno::EADDRINUSE => libc::EADDRINUSE,
        Errno::EFAULT => libc::EFAULT,
        Errno::EOPNOTSUPP => libc::EOPNOTSUPP,
        Errno::EPROTO => libc::EPROTO,
        Errno::ENODEV => libc::ENODEV,
    }
}

/// An `io::Error` of the kind the errno names, keeping the message (the
/// socket layer's calls return `io::Result`).
///
/// ```
/// let e: std::io::Error = ulnic::Error::WouldBlock.into();
/// assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
/// ```
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = std::io::Error::from_raw_os_error(e.errno()).kind();
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed command's errno is the contract's, which the Linux driver's
    /// (generated into ulnic_abi.h) is too: the same program sees the same
    /// errno under either driver.
    #[test]
    fn a_command_status_is_the_contracts_errno() {
        let errno =
            |status| Error::Driver(ulnic_host_attach::Error::Command { opcode: 0, status }).errno();
        let want = [
            (ulnic_abi::status::UNKNOWN_COMMAND, libc::EPROTO),
            (ulnic_abi::status::BAD_LENGTH, libc::EINVAL),
            (ulnic_abi::status::INVALID_ARGUMENT, libc::EINVAL),
            (ulnic_abi::status::NO_RESOURCES, libc::ENOSPC),
            (ulnic_abi::status::NOT_FOUND, libc::ENOENT),
            (ulnic_abi::status::ADDRESS_IN_USE, libc::EADDRINUSE),
            (ulnic_abi::status::BAD_ADDRESS, libc::EFAULT),
            (ulnic_abi::status::NOT_SUPPORTED, libc::EOPNOTSUPP),
            (ulnic_abi::status::RESET, libc::ENODEV),
            (99, libc::EPROTO),
        ];
        for (status, e) in want {
            assert_eq!(errno(status), e, "status {status}");
        }
        assert_eq!(want.len() - 1, ulnic_abi::status::ERRNO.len());
    }
}
