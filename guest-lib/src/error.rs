//! The library's errors.

use crate::env::SOCKET_ENV;
use crate::types::SendError;

/// Errors of the library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No device: `ULNIC_SOCKET` is unset and there is no guest device.
    #[error("no ulnic device: set {SOCKET_ENV} to a port socket of `ulnic device` (guest device files come with the kernel driver)")]
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
    /// A remote access (RDMA) a library structure made failed.
    #[error("remote access failed: {0}")]
    Remote(SendError),
}
