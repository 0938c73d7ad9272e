//! `ulnic`: the user-level library of the ulnic emulated user-level NIC.
//!
//! Explicit resources in the style of ef_vi and libibverbs: open a [`Nic`],
//! allocate a [`ProtectionDomain`], create an [`Endpoint`] with send, receive,
//! free and event rings in memory shared with the device, then post and poll
//! entirely in user space. Nothing runs behind your back: no threads, no
//! hidden copies; blocking ([`Endpoint::wait`]) is opt-in.
//!
//! ```no_run
//! use ulnic::{Address, EndpointConfig, Nic};
//! # fn main() -> Result<(), ulnic::Error> {
//! let nic = Nic::open()?; // ULNIC_SOCKET names the device port
//! let pd = nic.alloc_pd()?;
//! let mut ep = pd.create_endpoint(&EndpointConfig::default())?;
//! ep.bind(7)?;
//! ep.post_send_inline(Address { node: 1, port: 7 }, 0, b"hello", 1)?;
//! loop {
//!     if let Some(m) = ep.poll_recv() {
//!         println!("{} bytes from {:?}", m.len, m.src);
//!         break;
//!     }
//! }
//! # Ok(()) }
//! ```

use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod backend;
mod dmq;
mod host;
mod kernel;
mod rdma;
mod utlb;
mod zero_copy;

pub use dmq::{DmqKind, DmqReceiver, DmqSender};
pub use rdma::{Immediate, Permissions, TripwireOn};
pub use utlb::{Registration, Translation, UserBuffer, UtlbConfig, UtlbStats};

use backend::{Domain, EpMemory};
use ulnic_abi::{
    cmd, ctrl, event, recv_flags, redirect, send_flags, tx_error, DeviceInfo, FreeDesc, RecvDesc,
    RingLayout, SendDesc, CONDITION_RESERVE, EVENT_SIZE, FREE_DESC_SIZE, INLINE_OFFSET,
    RECV_DESC_SIZE, SEND_DESC_SIZE,
};
pub use ulnic_abi::{Cookie, Event as RawEvent, FilterEntry, ANY, INLINE_MAX};
use ulnic_host_attach::HostAttach;

/// Environment variable naming the device port socket to attach to.
pub const SOCKET_ENV: &str = "ULNIC_SOCKET";
/// Environment variable naming the guest device file (default `/dev/ulnic0`).
pub const DEVICE_ENV: &str = "ULNIC_DEVICE";
/// The first guest device file.
pub const DEFAULT_DEVICE: &str = "/dev/ulnic0";
/// Environment variable giving the shared-memory size for host attach (bytes).
pub const MEMORY_ENV: &str = "ULNIC_MEMORY";

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

/// A network address: a node of the fabric and a port bound on it.
///
/// ```
/// let a = ulnic::Address { node: 0, port: 80 };
/// assert_eq!(a.to_string(), "0:80");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Address {
    /// Node (device port) number.
    pub node: u32,
    /// Port bound on that node.
    pub port: u32,
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.port)
    }
}

/// An open NIC.
///
/// ```no_run
/// let nic = ulnic::Nic::open()?;
/// println!("node {}", nic.node());
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Clone)]
pub struct Nic {
    port: Port,
    info: DeviceInfo,
}

#[derive(Clone)]
enum Port {
    /// Host attach: this process drives a device port over vhost-user.
    Host(Arc<HostAttach>),
    /// The Linux driver: each protection domain is an open of this file.
    Kernel(std::path::PathBuf),
}

impl Nic {
    /// Opens the NIC: the guest device file (`ULNIC_DEVICE`, default
    /// `/dev/ulnic0`) when it exists, otherwise the port socket named by
    /// `ULNIC_SOCKET` (host attach).
    ///
    /// ```no_run
    /// let nic = ulnic::Nic::open()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn open() -> Result<Nic, Error> {
        let dev = std::env::var_os(DEVICE_ENV).unwrap_or_else(|| DEFAULT_DEVICE.into());
        if Path::new(&dev).exists() {
            return Nic::open_device(Path::new(&dev));
        }
        let path = std::env::var_os(SOCKET_ENV).ok_or(Error::NoDevice)?;
        Nic::attach(Path::new(&path))
    }

    /// Opens a guest device file of the Linux driver.
    ///
    /// ```no_run
    /// let nic = ulnic::Nic::open_device("/dev/ulnic0".as_ref())?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn open_device(path: &Path) -> Result<Nic, Error> {
        let info = kernel::device_info(path)?;
        Ok(Nic {
            port: Port::Kernel(path.to_path_buf()),
            info,
        })
    }

    /// Attaches to a device port socket directly.
    ///
    /// ```no_run
    /// let nic = ulnic::Nic::attach("/tmp/ulnic/node0.sock".as_ref())?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn attach(socket: &Path) -> Result<Nic, Error> {
        let mem = std::env::var(MEMORY_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ulnic_host_attach::DEFAULT_MEMORY);
        Nic::attach_with_memory(socket, mem)
    }

    /// Attaches with `bytes` of memory shared with the device (rings and
    /// segments of every endpoint come out of it).
    ///
    /// ```no_run
    /// let nic = ulnic::Nic::attach_with_memory("/tmp/ulnic/node0.sock".as_ref(), 256 << 20)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn attach_with_memory(socket: &Path, bytes: usize) -> Result<Nic, Error> {
        let hw = Arc::new(HostAttach::connect(socket, bytes)?);
        Ok(Nic {
            info: *hw.info(),
            port: Port::Host(hw),
        })
    }

    /// This NIC's node address.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let me = nic.node();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn node(&self) -> u32 {
        self.info.node
    }

    /// Number of nodes in the fabric.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// assert!(nic.nodes() > nic.node());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn nodes(&self) -> u32 {
        self.info.nodes
    }

    /// Largest message the device moves.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let limit = nic.max_message();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn max_message(&self) -> u32 {
        self.info.max_message
    }

    /// Allocates a protection domain (like `ef_pd_alloc` / `ibv_alloc_pd`).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let pd = nic.alloc_pd()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, Error> {
        let inner: Arc<dyn Domain> = match &self.port {
            Port::Host(hw) => Arc::new(host::HostDomain::new(hw.clone())?),
            Port::Kernel(path) => Arc::new(kernel::KernelDomain::open(path, self.info)?),
        };
        Ok(ProtectionDomain {
            inner,
            utlb: Default::default(),
        })
    }
}

/// A protection domain: endpoints in it share nothing with other domains.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// let pd = nic.alloc_pd()?;
/// let ep = pd.create_endpoint(&ulnic::EndpointConfig::default())?;
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct ProtectionDomain {
    inner: Arc<dyn Domain>,
    utlb: utlb::SharedTranslations,
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
    /// An event this library version does not know.
    Unknown(RawEvent),
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
    /// A code this library does not know.
    Other(u16),
}

impl SendError {
    fn from_code(c: u16) -> Self {
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
            c => SendError::Other(c),
        }
    }
    fn code(&self) -> u16 {
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
            SendError::Other(c) => *c,
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(tx_error::name(self.code()))
    }
}

/// An endpoint: the application's own send, receive, free and event rings and
/// its communication segment, shared with the device.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// let pd = nic.alloc_pd()?;
/// let mut ep = pd.create_endpoint(&ulnic::EndpointConfig::default())?;
/// ep.bind(5)?;
/// ep.write_segment(0, &[1u8; 4096]);
/// ep.post_send(ulnic::Address { node: 1, port: 5 }, 0, 0, 4096, 42, false)?;
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct Endpoint {
    dom: Arc<dyn Domain>,
    mem: EpMemory,
    utlb: utlb::SharedTranslations,
    zc: zero_copy::EndpointUtlb,
    id: u32,
    port: Option<u32>,
    layout: RingLayout,
    send_producer: u32,
    recv_consumer: u32,
    free_producer: u32,
    event_consumer: u32,
    arm_seq: u32,
    notify_enabled: bool,
}

impl ProtectionDomain {
    /// Gives the domain a UTLB (VMMC-2): afterwards endpoints can send and
    /// RDMA from any [`UserBuffer`] of the domain without copying it into
    /// their segment; the driver installs translations as they are needed.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let pd = nic.alloc_pd()?;
    /// pd.enable_utlb(ulnic::UtlbConfig { entries: 4096, ..Default::default() })?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn enable_utlb(&self, cfg: UtlbConfig) -> Result<(), Error> {
        if cfg.entries == 0 || cfg.entries > ulnic_abi::MAX_UTLB_ENTRIES {
            return Err(Error::InvalidArgument(
                "UTLB entries must be 1..=MAX_UTLB_ENTRIES",
            ));
        }
        if cfg.fallback && cfg.bounce_bytes.div_ceil(4096) as u64 * 2 > u64::from(cfg.entries) {
            return Err(Error::InvalidArgument(
                "the bounce buffer would take more than half the UTLB: lower bounce_bytes or raise entries",
            ));
        }
        if self.utlb.get().is_some() {
            return Err(Error::InvalidArgument("this domain already has a UTLB"));
        }
        self.inner.utlb_init(cfg.entries)?;
        let _ = self
            .utlb
            .set(std::sync::Mutex::new(utlb::Translations::new(cfg)));
        Ok(())
    }

    /// Allocates memory the device can reach through the UTLB (with host
    /// attach it must come from the shared memory; in a guest any pages
    /// would do, and these are anonymous ones).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let pd = nic.alloc_pd()?;
    /// let buf = pd.alloc_buffer(1 << 20)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn alloc_buffer(&self, bytes: usize) -> Result<UserBuffer, Error> {
        UserBuffer::new(self.inner.clone(), self.utlb.clone(), bytes)
    }

    /// Makes sure `range` of `buf` is translated (the explicit "service
    /// this miss now" call), and says what it cost.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # pd.enable_utlb(Default::default())?;
    /// let buf = pd.alloc_buffer(16 * 4096)?;
    /// let first = pd.register(&buf, 0..buf.len())?;
    /// assert!(!first.hit);
    /// assert!(pd.register(&buf, 0..buf.len())?.hit);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn register(
        &self,
        buf: &UserBuffer,
        range: std::ops::Range<usize>,
    ) -> Result<Registration, Error> {
        let (va, len) = buf.span(&range)?;
        let t = self
            .utlb
            .get()
            .ok_or(Error::InvalidArgument("no UTLB: call enable_utlb first"))?;
        let t0 = Instant::now();
        let mut t = utlb::lock(t);
        let before = t.stats.driver_ns;
        let (_, hit) = t.find_or_install(&*self.inner, va, len)?;
        let driver = Duration::from_nanos(t.stats.driver_ns - before);
        Ok(Registration {
            hit,
            library: t0.elapsed().saturating_sub(driver),
            driver,
        })
    }

    /// The library's UTLB counters (the device's are in
    /// [`Endpoint::stats`]: `utlb_hits`, `utlb_misses`, `utlb_fetch_ns`).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// println!("{:?}", pd.utlb_stats());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn utlb_stats(&self) -> UtlbStats {
        self.utlb
            .get()
            .map(|t| utlb::lock(t).stats)
            .unwrap_or_default()
    }

    /// Creates an endpoint: allocates and registers its rings and segment.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// let ep = pd.create_endpoint(&ulnic::EndpointConfig { segment_bytes: 1 << 20, ..Default::default() })?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn create_endpoint(&self, cfg: &EndpointConfig) -> Result<Endpoint, Error> {
        let layout = RingLayout {
            send_entries: cfg.send_entries,
            recv_entries: cfg.recv_entries,
            free_entries: cfg.free_entries,
            // Room for every send's event, the conditions, and one pending
            // event per tripwire (spec §5.13).
            event_entries: (cfg.send_entries
                + CONDITION_RESERVE
                + self.inner.info().max_tripwires
                + ulnic_abi::MAX_REDIRECTS)
                .next_power_of_two(),
        };
        layout.validate().map_err(Error::InvalidArgument)?;
        let mem = self.inner.create_endpoint(&layout, cfg.segment_bytes)?;
        let mut ep = Endpoint {
            dom: self.inner.clone(),
            utlb: self.utlb.clone(),
            zc: Default::default(),
            id: mem.id,
            mem,
            port: None,
            layout,
            send_producer: 0,
            recv_consumer: 0,
            free_producer: 0,
            event_consumer: 0,
            arm_seq: 0,
            notify_enabled: false,
        };
        ep.prepare_bounce();
        Ok(ep)
    }
}

/// How long dropping an endpoint waits for the device to take its posted
/// sends (like `SO_LINGER`): an orderly close does not lose messages.
pub const LINGER: Duration = Duration::from_secs(1);

impl Drop for Endpoint {
    fn drop(&mut self) {
        let deadline = Instant::now() + LINGER;
        while !self.sends_done() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        self.dom.destroy_endpoint(&self.mem);
        // The device has let go of the endpoint: its UTLB holds can go.
        self.release_utlb();
    }
}

impl Endpoint {
    fn word(&self, off: u64) -> &std::sync::atomic::AtomicU32 {
        self.mem.word(off)
    }

    /// The endpoint's id on its node (its doorbell is queue 2 + id).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// println!("endpoint {}", ep.id());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn id(&self) -> u32 {
        self.id
    }

    /// This endpoint's address, once bound.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(9)?;
    /// assert_eq!(ep.address().unwrap().port, 9);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn address(&self) -> Option<Address> {
        self.port.map(|port| Address {
            node: self.dom.info().node,
            port,
        })
    }

    /// Binds the endpoint to `port` on its node; messages to (node, port) reach it.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(4000)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn bind(&mut self, port: u32) -> Result<(), Error> {
        let mut p = self.id.to_le_bytes().to_vec();
        p.extend_from_slice(&port.to_le_bytes());
        self.dom.ep_command(cmd::BIND_PORT, &p)?;
        self.port = Some(port);
        Ok(())
    }

    /// Accepts only messages matching one of `filters` (empty: accept all).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// use ulnic::{FilterEntry, ANY};
    /// ep.set_filter(&[FilterEntry { node: 0, port: ANY, tag: 0, tag_mask: 0 }])?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_filter(&self, filters: &[FilterEntry]) -> Result<(), Error> {
        let mut p = self.id.to_le_bytes().to_vec();
        p.extend_from_slice(&(filters.len() as u32).to_le_bytes());
        filters.iter().for_each(|f| f.encode_into(&mut p));
        self.dom.ep_command(cmd::SET_FILTER, &p)?;
        Ok(())
    }

    /// Segment size in bytes.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert!(ep.segment_len() >= 4096);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn segment_len(&self) -> usize {
        self.mem.seg_len
    }

    fn seg_check(&self, offset: usize, len: usize) {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|e| e <= self.mem.seg_len),
            "segment range {offset}+{len} out of bounds"
        );
    }

    /// Copies `data` into the segment at `offset` (where a send will take it
    /// from). Panics if the range is outside the segment.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.write_segment(0, b"payload");
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn write_segment(&self, offset: usize, data: &[u8]) {
        self.seg_check(offset, data.len());
        self.mem.seg_write(offset, data);
    }

    /// Copies segment bytes at `offset` into `out` (e.g. a received buffer).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let mut out = [0u8; 16];
    /// ep.read_segment(0, &mut out);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn read_segment(&self, offset: usize, out: &mut [u8]) {
        self.seg_check(offset, out.len());
        self.mem.seg_read(offset, out);
    }

    /// The segment bytes at `offset` in place, for building a payload
    /// without a copy (zero-copy sends and RDMA writes).
    ///
    /// # Safety
    ///
    /// While the slice lives the device must not touch the range: it is not
    /// posted as a free buffer, not inside an aperture exported for remote
    /// access, and no send or RDMA from or into it is in flight. The caller
    /// must not create two overlapping slices.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// // SAFETY: bytes 0..4096 are this program's own, nothing in flight.
    /// let buf = unsafe { ep.segment_mut(0, 4096) };
    /// buf.fill(7);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    #[allow(clippy::mut_from_ref)] // shared memory; exclusivity is the caller's promise
    pub unsafe fn segment_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        self.seg_check(offset, len);
        // SAFETY: in bounds (checked); exclusive use is the caller's
        // obligation (see above); the mapping outlives `&self`.
        unsafe { std::slice::from_raw_parts_mut(self.mem.seg.add(offset), len) }
    }

    /// The segment bytes at `offset` in place, for reading a received
    /// buffer or an RDMA read's data without a copy.
    ///
    /// # Safety
    ///
    /// As for [`Endpoint::segment_mut`]: the device must not write the range
    /// while the slice lives.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// // SAFETY: nothing can write bytes 0..16 now.
    /// let first = unsafe { ep.segment(0, 16) }[0];
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub unsafe fn segment(&self, offset: usize, len: usize) -> &[u8] {
        self.seg_check(offset, len);
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.mem.seg.add(offset), len) }
    }

    /// Send descriptors that can be posted now.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert_eq!(ep.send_space(), 256);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn send_space(&self) -> u32 {
        let done = u32::from_le(self.word(ctrl::SEND_CONSUMER).load(Ordering::Acquire));
        let in_flight = self
            .send_producer
            .wrapping_sub(done)
            .min(self.layout.send_entries);
        self.layout.send_entries - in_flight
    }

    /// Whether every posted send has been processed by the device.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert!(ep.sends_done());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn sends_done(&self) -> bool {
        self.send_space() == self.layout.send_entries
    }

    fn push_send(&mut self, desc: &SendDesc, inline: &[u8]) -> Result<(), Error> {
        let mut b = [0u8; SEND_DESC_SIZE as usize];
        desc.encode_header(&mut b);
        b[INLINE_OFFSET..INLINE_OFFSET + inline.len()].copy_from_slice(inline);
        let used = if inline.is_empty() {
            INLINE_OFFSET + 8
        } else {
            INLINE_OFFSET + inline.len()
        };
        self.push_slot(&b[..used])
    }

    /// Writes the first bytes of the next send slot and publishes it.
    fn push_slot(&mut self, b: &[u8]) -> Result<(), Error> {
        if self.send_space() == 0 {
            return Err(Error::WouldBlock);
        }
        let slot = u64::from(self.send_producer & (self.layout.send_entries - 1));
        self.mem
            .ctrl_write(self.layout.send_offset() + slot * SEND_DESC_SIZE, b);
        self.send_producer = self.send_producer.wrapping_add(1);
        self.word(ctrl::SEND_PRODUCER)
            .store(self.send_producer.to_le(), Ordering::Release);
        self.doorbell_if_wanted();
        Ok(())
    }

    /// Rings the endpoint's doorbell now. Posting calls rings it only when
    /// the device asked (it stopped polling); this is for tools and tests.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.ring_doorbell();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn ring_doorbell(&self) {
        self.dom.ring_doorbell(&self.mem);
    }

    /// Whether the doorbell is a page mapped into this process (a store
    /// rings it) rather than a system call.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// println!("doorbell mapped: {}", ep.doorbell_mapped());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn doorbell_mapped(&self) -> bool {
        !self.mem.doorbell.is_null()
    }

    fn doorbell_if_wanted(&self) {
        // Pairs with the device's "set wanted, fence, re-poll" before it sleeps.
        fence(Ordering::SeqCst);
        if self.word(ctrl::DOORBELL_WANTED).load(Ordering::Acquire) != 0 {
            self.dom.ring_doorbell(&self.mem);
        }
    }

    /// Sends a small message (at most [`INLINE_MAX`] bytes) carried in the
    /// descriptor itself: no buffer management at all.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.post_send_inline(ulnic::Address { node: 1, port: 5 }, 0, b"ping", 1)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_send_inline(
        &mut self,
        dest: Address,
        tag: u32,
        data: &[u8],
        id: u64,
    ) -> Result<(), Error> {
        if data.len() > INLINE_MAX as usize {
            return Err(Error::InvalidArgument(
                "inline payload larger than INLINE_MAX",
            ));
        }
        let d = SendDesc {
            opcode: ulnic_abi::op::SEND,
            flags: send_flags::INLINE,
            len: data.len() as u32,
            dest_node: dest.node,
            dest_port: dest.port,
            tag,
            user_id: id,
            seg_offset: 0,
        };
        self.push_send(&d, data)
    }

    /// Leaves a close message (at most [`INLINE_MAX`] bytes) that the device
    /// sends to `dest` when this endpoint is destroyed, however that
    /// happens: dropped, its process killed, its VM rebooted (CLAN's close
    /// message). The receiver sees it with [`Received::close`] set, after
    /// every message this endpoint sent it before. Replaces any earlier one.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(6)?;
    /// ep.set_close_message(ulnic::Address { node: 0, port: 5 }, 0, b"bye")?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_close_message(&mut self, dest: Address, tag: u32, data: &[u8]) -> Result<(), Error> {
        if data.len() > INLINE_MAX as usize {
            return Err(Error::InvalidArgument(
                "close message larger than INLINE_MAX",
            ));
        }
        let mut b = [0u8; SEND_DESC_SIZE as usize];
        SendDesc {
            opcode: 0, // published last, below
            flags: send_flags::INLINE,
            len: data.len() as u32,
            dest_node: dest.node,
            dest_port: dest.port,
            tag,
            user_id: 0,
            seg_offset: 0,
        }
        .encode_header(&mut b);
        b[INLINE_OFFSET..INLINE_OFFSET + data.len()].copy_from_slice(data);
        self.clear_close_message();
        self.mem.ctrl_write(ctrl::CLOSE_MESSAGE, &b);
        let head = u32::from(ulnic_abi::op::SEND) | u32::from(send_flags::INLINE) << 16;
        self.word(ctrl::CLOSE_MESSAGE)
            .store(head.to_le(), Ordering::Release);
        Ok(())
    }

    /// Withdraws the close message, for an orderly close whose peer was
    /// already told.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.clear_close_message();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn clear_close_message(&mut self) {
        self.word(ctrl::CLOSE_MESSAGE).store(0, Ordering::Release);
    }

    /// Sends `len` bytes at `offset` in the segment (zero-copy). With
    /// `completion`, a [`Event::SendDone`] reports delivery; failures are
    /// always reported as [`Event::SendFailed`]. The bytes may be reused once
    /// [`Endpoint::send_space`] shows the descriptor retired.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.write_segment(8192, &[7u8; 1000]);
    /// ep.post_send(ulnic::Address { node: 1, port: 5 }, 3, 8192, 1000, 2, true)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_send(
        &mut self,
        dest: Address,
        tag: u32,
        offset: u64,
        len: u32,
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        let d = SendDesc {
            opcode: ulnic_abi::op::SEND,
            flags: if completion {
                send_flags::COMPLETION
            } else {
                0
            },
            len,
            dest_node: dest.node,
            dest_port: dest.port,
            tag,
            user_id: id,
            seg_offset: offset,
        };
        self.push_send(&d, &[])
    }

    /// Posts a receive buffer of `len` bytes at `offset` in the segment.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// for i in 0..16u64 {
    ///     ep.post_free(i * 65536, 65536, i)?;
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_free(&mut self, offset: u64, len: u32, id: u64) -> Result<(), Error> {
        let done = u32::from_le(self.word(ctrl::FREE_CONSUMER).load(Ordering::Acquire));
        if self.free_producer.wrapping_sub(done) >= self.layout.free_entries {
            return Err(Error::WouldBlock);
        }
        let slot = u64::from(self.free_producer & (self.layout.free_entries - 1));
        let mut b = [0u8; FREE_DESC_SIZE as usize];
        FreeDesc {
            seg_offset: offset,
            len,
            user_id: id,
        }
        .encode(&mut b);
        self.mem
            .ctrl_write(self.layout.free_offset() + slot * FREE_DESC_SIZE, &b);
        self.free_producer = self.free_producer.wrapping_add(1);
        self.word(ctrl::FREE_PRODUCER)
            .store(self.free_producer.to_le(), Ordering::Release);
        self.doorbell_if_wanted();
        Ok(())
    }

    /// Free buffers posted and not yet filled.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert_eq!(ep.free_posted(), 0);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn free_posted(&self) -> u32 {
        let done = u32::from_le(self.word(ctrl::FREE_CONSUMER).load(Ordering::Acquire));
        self.free_producer.wrapping_sub(done)
    }

    /// Takes the next received message, if any (never blocks).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// while let Some(m) = ep.poll_recv() {
    ///     println!("{} bytes", m.len);
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn poll_recv(&mut self) -> Option<Received> {
        let prod = u32::from_le(self.word(ctrl::RECV_PRODUCER).load(Ordering::Acquire));
        if prod == self.recv_consumer {
            return None;
        }
        let slot = u64::from(self.recv_consumer & (self.layout.recv_entries - 1));
        let mut b = [0u8; RECV_DESC_SIZE as usize];
        let addr = self.layout.recv_offset() + slot * RECV_DESC_SIZE;
        self.mem.ctrl_read(addr, &mut b[..INLINE_OFFSET]);
        let d = RecvDesc::decode(&b);
        let payload = if d.flags & recv_flags::INLINE != 0 {
            let n = (d.len as usize).min(INLINE_MAX as usize);
            self.mem.ctrl_read(
                addr + INLINE_OFFSET as u64,
                &mut b[INLINE_OFFSET..INLINE_OFFSET + n],
            );
            let mut data = [0u8; INLINE_MAX as usize];
            data[..n].copy_from_slice(&b[INLINE_OFFSET..INLINE_OFFSET + n]);
            Payload::Inline(data)
        } else {
            self.mem.ctrl_read(
                addr + INLINE_OFFSET as u64,
                &mut b[INLINE_OFFSET..INLINE_OFFSET + 8],
            );
            Payload::Buffer {
                offset: RecvDesc::decode(&b).buf_offset,
                id: d.buf_id,
            }
        };
        self.recv_consumer = self.recv_consumer.wrapping_add(1);
        self.word(ctrl::RECV_CONSUMER)
            .store(self.recv_consumer.to_le(), Ordering::Release);
        Some(Received {
            src: Address {
                node: d.src_node,
                port: d.src_port,
            },
            tag: d.tag,
            len: d.len,
            payload,
            close: d.flags & recv_flags::CLOSE != 0,
        })
    }

    /// Takes the next event, if any (never blocks).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// while let Some(ev) = ep.poll_event() {
    ///     println!("{ev:?}");
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn poll_event(&mut self) -> Option<Event> {
        let prod = u32::from_le(self.word(ctrl::EVENT_PRODUCER).load(Ordering::Acquire));
        if prod == self.event_consumer {
            return None;
        }
        let slot = u64::from(self.event_consumer & (self.layout.event_entries - 1));
        let mut b = [0u8; EVENT_SIZE as usize];
        self.mem
            .ctrl_read(self.layout.event_offset() + slot * EVENT_SIZE, &mut b);
        let e = RawEvent::decode(&b);
        self.event_consumer = self.event_consumer.wrapping_add(1);
        self.word(ctrl::EVENT_CONSUMER)
            .store(self.event_consumer.to_le(), Ordering::Release);
        Some(match e.kind {
            event::TX_DONE => Event::SendDone { id: e.user_id },
            event::TX_ERROR => Event::SendFailed {
                id: e.user_id,
                dest: Address {
                    node: e.node,
                    port: e.port,
                },
                len: e.len,
                reason: SendError::from_code(e.code),
            },
            event::CONDITION => {
                if u32::from(e.code) < CONDITION_RESERVE {
                    // Re-enable this condition (CLAN duplicate suppression).
                    self.mem
                        .ctrl_write(ctrl::CONDITION_PENDING + u64::from(e.code), &[0]);
                }
                Event::Condition(e.code)
            }
            event::TRIPWIRE => {
                self.clear_tripwire_flag(e.aux);
                Event::Tripwire {
                    id: e.aux,
                    user: e.user_id,
                    from: Address {
                        node: e.node,
                        port: e.port,
                    },
                    len: e.len,
                    read: e.code != 0,
                }
            }
            event::REDIRECTED => {
                self.redirect_ended(e.user_id);
                Event::Redirected {
                    id: e.user_id,
                    outcome: match e.code {
                        redirect::FULL => RedirectOutcome::Full,
                        redirect::PARTIAL => RedirectOutcome::Partial,
                        redirect::NONE => RedirectOutcome::None,
                        _ => RedirectOutcome::Refused(SendError::from_code(e.aux as u16)),
                    },
                    start: u64::from(e.aux) * u64::from(e.code != redirect::REFUSED),
                    bytes: u64::from(e.len),
                    from: Address {
                        node: e.node,
                        port: e.port,
                    },
                }
            }
            _ => Event::Unknown(e),
        })
    }

    fn has_work(&self) -> bool {
        let rp = u32::from_le(self.word(ctrl::RECV_PRODUCER).load(Ordering::Acquire));
        let ep = u32::from_le(self.word(ctrl::EVENT_PRODUCER).load(Ordering::Acquire));
        rp != self.recv_consumer || ep != self.event_consumer
    }

    /// Blocks until a message or event is waiting, or `timeout` passes;
    /// returns whether there is something to poll. Check, arm, re-check,
    /// block: a message arriving at any point is never slept through.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// if ep.wait(std::time::Duration::from_secs(1))? {
    ///     let m = ep.poll_recv();
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        if self.has_work() {
            return Ok(true);
        }
        if !self.notify_enabled {
            self.dom.ep_command(cmd::ARM, &self.id.to_le_bytes())?;
            self.notify_enabled = true;
        }
        let deadline = Instant::now() + timeout;
        loop {
            self.arm_seq = self.arm_seq.wrapping_add(1);
            self.word(ctrl::ARM_REQUEST)
                .store(self.arm_seq.to_le(), Ordering::Release);
            fence(Ordering::SeqCst);
            if self.has_work() {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            if self.dom.wait(self.id, left)? && self.has_work() {
                return Ok(true);
            }
        }
    }

    /// The device's counters for this endpoint, by name (`ulnic_abi::STAT_NAMES`).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// for (name, value) in ep.stats()? {
    ///     println!("{name} = {value}");
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn stats(&self) -> Result<Vec<(&'static str, u64)>, Error> {
        let r = self
            .dom
            .ep_command(cmd::GET_STATS, &self.id.to_le_bytes())?;
        Ok(ulnic_abi::STAT_NAMES
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                r.get(i * 8..i * 8 + 8)
                    .map(|b| (*n, ulnic_abi::read_le64(b, 0)))
            })
            .collect())
    }
}
