//! The plain types an application sees: addresses, endpoint sizes,
//! received messages, events, send errors, and what remote-memory calls
//! take.

use ulnic_abi::{perm, tx_error, EventRecord, INLINE_MAX};

/// A network address: a node of the fabric and a port bound on it.
///
/// ```
/// let a = ulnic::Address { node: 0, port: 80 };
/// assert_eq!(a.to_string(), "0:80");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Address {
    /// Node number (one vhost-user socket of a device).
    pub node: u32,
    /// Port bound on that node.
    pub port: u32,
}

/// Parses `NODE:PORT`, the form [`Address`] displays as.
///
/// ```
/// let a: ulnic::Address = "1:5".parse().unwrap();
/// assert_eq!(a, ulnic::Address { node: 1, port: 5 });
/// assert!("15".parse::<ulnic::Address>().is_err());
/// ```
impl std::str::FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (n, p) = s
            .split_once(':')
            .ok_or_else(|| format!("'{s}': expected NODE:PORT, e.g. 1:5"))?;
        let node = n
            .parse()
            .map_err(|_| format!("'{n}' is not a node number"))?;
        let port = p
            .parse()
            .map_err(|_| format!("'{p}' is not a port number"))?;
        Ok(Address { node, port })
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.port)
    }
}

/// Sizes of a new endpoint's rings and segment.
///
/// ```
/// let cfg = ulnic::EndpointConfig { segment_bytes: 1 << 20, ..Default::default() };
/// assert!(cfg.send_entries.is_power_of_two());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct EndpointConfig {
    /// Send ring entries (power of two).
    pub send_entries: u32,
    /// Receive ring entries (power of two).
    pub recv_entries: u32,
    /// Free ring entries (power of two).
    pub free_entries: u32,
    /// Size of the communication segment in bytes (rounded up to pages).
    pub segment_bytes: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            send_entries: 256,
            recv_entries: 512,
            free_entries: 256,
            segment_bytes: 4 << 20,
        }
    }
}

/// Where a received message's payload is.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let pd = nic.alloc_pd()?;
/// # let mut ep = pd.create_endpoint(&Default::default())?;
/// if let Some(m) = ep.poll_recv() {
///     match m.payload {
///         ulnic::Payload::Inline(bytes) => println!("{:?}", &bytes[..m.len as usize]),
///         ulnic::Payload::Buffer { offset, id } => println!("buffer {id} at {offset}"),
///     }
/// }
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// Small message carried in the receive descriptor (first `len` bytes).
    Inline([u8; INLINE_MAX as usize]),
    /// In the segment, in the free buffer the application posted with `id`.
    Buffer {
        /// Offset of the buffer in the segment.
        offset: u64,
        /// The id given to [`Endpoint::post_free`].
        id: u64,
    },
}

/// A received message.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let pd = nic.alloc_pd()?;
/// # let mut ep = pd.create_endpoint(&Default::default())?;
/// if let Some(m) = ep.poll_recv() {
///     println!("{} bytes, tag {}, from {}", m.len, m.tag, m.src);
/// }
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The true source, stamped by the device.
    pub src: Address,
    /// The sender's tag.
    pub tag: u32,
    /// Payload length.
    pub len: u32,
    /// Where the payload is.
    pub payload: Payload,
    /// A close message: the sending endpoint no longer exists, and this is
    /// the message it left with [`Endpoint::set_close_message`].
    pub close: bool,
    /// A message of this endpoint's own that the fabric gave up on
    /// (return to sender, spec §10.4): `src` is where it was going, tag
    /// and payload are the original's. Its `SendFailed` event says why.
    pub returned: bool,
    /// The sending endpoint's session id (spec §5.4): a port's next holder
    /// has another, so a close message from an earlier peer on the same
    /// address can be told apart (see [`Endpoint::session`]).
    pub session: u32,
}

/// A completion or error event.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let pd = nic.alloc_pd()?;
/// # let mut ep = pd.create_endpoint(&Default::default())?;
/// match ep.poll_event() {
///     Some(ulnic::Event::SendFailed { id, reason, .. }) => eprintln!("send {id}: {reason}"),
///     _ => {}
/// }
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A send posted with `completion = true` was delivered.
    SendDone {
        /// The send's id.
        id: u64,
    },
    /// A send failed and was returned; nothing was written at the target.
    SendFailed {
        /// The send's id.
        id: u64,
        /// Destination.
        dest: Address,
        /// Length.
        len: u32,
        /// Why.
        reason: SendError,
    },
    /// A condition the device reports once until consumed (`ulnic_abi::condition`).
    Condition(u16),
    /// A tripwire of this endpoint fired (see [`Endpoint::set_tripwire`]).
    /// Taking the event re-enables events for it.
    Tripwire {
        /// The tripwire's id.
        id: u32,
        /// The cookie given when it was set.
        user: u64,
        /// Who accessed the aperture (port 0: an unbound endpoint).
        from: Address,
        /// Bytes of the access inside the tripwire's range.
        len: u32,
        /// A read (else a write).
        read: bool,
    },
    /// A transfer redirection ended ([`Endpoint::post_redirect`]): exactly
    /// which part of it went to the user buffer.
    Redirected {
        /// The redirection's id.
        id: u64,
        /// Full, partial, none, or refused.
        outcome: RedirectOutcome,
        /// Offset of the redirected part from the redirection's start.
        start: u64,
        /// Bytes redirected (`start..start + bytes`); the rest of the
        /// redirection's range is in the aperture.
        bytes: u64,
        /// Who wrote the last redirected bytes.
        from: Address,
    },
    /// An out-of-band message arrived ([`Endpoint::post_oob`]): ahead of
    /// the messages waiting in the receive queue.
    OutOfBand {
        /// The sender, stamped by the device.
        from: Address,
        /// The sender's tag.
        tag: u32,
        /// Its bytes: the first `len` of `data`.
        data: [u8; 8],
        /// How many bytes it carries (0 to 8).
        len: u8,
        /// The sender's session id (spec §5.4).
        session: u32,
    },
    /// The fabric gave up on reaching node `node` (spec §10.4): this
    /// endpoint sent to it or received from it. Its messages and remote
    /// accesses to that node end in `SendFailed` with
    /// [`SendError::Unreachable`].
    Unreachable {
        /// The node lost.
        node: u32,
    },
    /// One of this event queue's sources had something (spec §6.1,
    /// [`Endpoint::set_event_queue`]): serve it, then arm it again.
    Queued {
        /// The cookie the source was attached with.
        cookie: u64,
        /// The source's endpoint id.
        source: u32,
    },
    /// A PIO window this endpoint imported was revoked by its exporter,
    /// or its exporter went away (spec §6.2): the import's memory is gone
    /// (a store to it faults); drop the [`crate::PioImport`] to release
    /// its range.
    PioRevoked {
        /// The import ([`crate::PioImport::id`]).
        import: u32,
        /// The window's key.
        key: u64,
        /// The exporter's node.
        node: u32,
    },
    /// An event this library version does not know.
    Unknown(EventRecord),
}

/// How a transfer redirection ended (VMMC-2 §3).
///
/// ```
/// assert_ne!(ulnic::RedirectOutcome::Full, ulnic::RedirectOutcome::Partial);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectOutcome {
    /// Everything went to the user buffer: no copy needed.
    Full,
    /// One contiguous part did; copy the rest from the aperture.
    Partial,
    /// Nothing did (the data came before the redirection, or not at all).
    None,
    /// The device refused the redirection.
    Refused(SendError),
}

/// Why a send failed.
///
/// ```
/// assert_eq!(ulnic::SendError::NoBuffer.to_string(), "receiver had no buffer");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// No endpoint bound at the destination.
    NoEndpoint,
    /// The receiver had no free buffer or receive slot (return to sender).
    NoBuffer,
    /// The receiver's filter refused it.
    Rejected,
    /// The receiver's next buffer was too small.
    BufferTooSmall,
    /// The descriptor was malformed.
    BadDescriptor,
    /// The payload range was outside the segment.
    BadAddress,
    /// The endpoint is not bound to a port.
    NotBound,
    /// RDMA: the cookie names no live aperture (wrong, stale or revoked).
    BadCookie,
    /// RDMA: the aperture does not allow this access.
    PermissionDenied,
    /// RDMA: the range runs past the aperture's end.
    OutOfRange,
    /// UTLB: the buffer's translations are missing.
    NoTranslation,
    /// Redirection: too many are active on the endpoint.
    TooManyRedirects,
    /// Fabric: no acknowledgement after the configured retries; the
    /// message also comes back through the receive queue, `returned` set.
    Unreachable,
    /// A code this library does not know.
    Other(u16),
}

impl SendError {
    pub(crate) fn from_code(c: u16) -> Self {
        match c {
            tx_error::NO_ENDPOINT => SendError::NoEndpoint,
            tx_error::NO_BUFFER => SendError::NoBuffer,
            tx_error::REJECTED => SendError::Rejected,
            tx_error::BUFFER_TOO_SMALL => SendError::BufferTooSmall,
            tx_error::BAD_DESCRIPTOR => SendError::BadDescriptor,
            tx_error::BAD_ADDRESS => SendError::BadAddress,
            tx_error::NOT_BOUND => SendError::NotBound,
            tx_error::BAD_COOKIE => SendError::BadCookie,
            tx_error::PERMISSION_DENIED => SendError::PermissionDenied,
            tx_error::OUT_OF_RANGE => SendError::OutOfRange,
            tx_error::NO_TRANSLATION => SendError::NoTranslation,
            tx_error::TOO_MANY_REDIRECTS => SendError::TooManyRedirects,
            tx_error::UNREACHABLE => SendError::Unreachable,
            c => SendError::Other(c),
        }
    }
    /// The device's TX_ERROR code for this failure (spec §5.9).
    ///
    /// ```
    /// assert_eq!(ulnic::SendError::Unreachable.code(), 13);
    /// ```
    pub fn code(&self) -> u16 {
        match self {
            SendError::NoEndpoint => tx_error::NO_ENDPOINT,
            SendError::NoBuffer => tx_error::NO_BUFFER,
            SendError::Rejected => tx_error::REJECTED,
            SendError::BufferTooSmall => tx_error::BUFFER_TOO_SMALL,
            SendError::BadDescriptor => tx_error::BAD_DESCRIPTOR,
            SendError::BadAddress => tx_error::BAD_ADDRESS,
            SendError::NotBound => tx_error::NOT_BOUND,
            SendError::BadCookie => tx_error::BAD_COOKIE,
            SendError::PermissionDenied => tx_error::PERMISSION_DENIED,
            SendError::OutOfRange => tx_error::OUT_OF_RANGE,
            SendError::NoTranslation => tx_error::NO_TRANSLATION,
            SendError::TooManyRedirects => tx_error::TOO_MANY_REDIRECTS,
            SendError::Unreachable => tx_error::UNREACHABLE,
            SendError::Other(c) => *c,
        }
    }
}

impl SendError {
    /// The `errno` value nearest to this failure (always positive): no
    /// endpoint is `ECONNREFUSED`, no buffer `ENOBUFS`, unreachable
    /// `EHOSTUNREACH`, a bad or revoked cookie `EACCES`.
    ///
    /// ```
    /// assert_eq!(ulnic::SendError::NoEndpoint.errno(), libc::ECONNREFUSED);
    /// ```
    pub fn errno(&self) -> i32 {
        match self {
            SendError::NoEndpoint => libc::ECONNREFUSED,
            SendError::NoBuffer => libc::ENOBUFS,
            SendError::Rejected | SendError::PermissionDenied => libc::EPERM,
            SendError::BufferTooSmall => libc::EMSGSIZE,
            SendError::BadDescriptor | SendError::NotBound => libc::EINVAL,
            SendError::BadAddress | SendError::OutOfRange => libc::EFAULT,
            SendError::BadCookie => libc::EACCES,
            SendError::NoTranslation => libc::ENOENT,
            SendError::TooManyRedirects => libc::ENOSPC,
            SendError::Unreachable => libc::EHOSTUNREACH,
            SendError::Other(_) => libc::EPROTO,
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(tx_error::name(self.code()))
    }
}

/// What an exported aperture lets cookie holders do.
///
/// ```
/// let p = ulnic::Permissions::READ_WRITE;
/// assert!(p.contains(ulnic::Permissions::READ));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permissions(pub(crate) u32);

impl Permissions {
    /// The wire value (`ulnic_abi::perm`).
    pub(crate) fn bits(self) -> u32 {
        self.0
    }

    /// Remote reads.
    pub const READ: Permissions = Permissions(perm::READ);
    /// Remote writes and immediates.
    pub const WRITE: Permissions = Permissions(perm::WRITE);
    /// Both.
    pub const READ_WRITE: Permissions = Permissions(perm::ALL);

    /// Whether every right in `other` is included.
    ///
    /// ```
    /// assert!(!ulnic::Permissions::READ.contains(ulnic::Permissions::WRITE));
    /// ```
    pub fn contains(self, other: Permissions) -> bool {
        self.0 & other.0 == other.0
    }
}

/// The value of a write-immediate: one 32- or 64-bit word, stored with a
/// single store so the target never sees half of it.
///
/// ```
/// let v = ulnic::Immediate::U64(7);
/// assert_eq!(v, ulnic::Immediate::U64(7));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Immediate {
    /// Four bytes (the remote offset must be 4-aligned).
    U32(u32),
    /// Eight bytes (the remote offset must be 8-aligned).
    U64(u64),
}

/// Which remote accesses fire a tripwire.
///
/// ```
/// let on = ulnic::TripwireOn::Writes;
/// assert_ne!(on, ulnic::TripwireOn::Reads);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TripwireOn {
    /// RDMA writes and immediates.
    Writes,
    /// RDMA reads.
    Reads,
    /// Both.
    Both,
}
