//! Opening a NIC (a device node attached from the host, or the Linux
//! driver's device file) and its protection domains.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ulnic_abi::{DeviceInfo, RingLayout, CONDITION_RESERVE};
use ulnic_host_attach::HostAttach;

use crate::backend::Domain;
use crate::endpoint::Endpoint;
use crate::env::{DEFAULT_DEVICE, DEVICE_ENV, MEMORY_ENV, SOCKET_ENV};
use crate::error::Error;
use crate::types::EndpointConfig;
use crate::utlb::{self, Registration, UserBuffer, UtlbConfig, UtlbStats};
use crate::{host, kernel};

/// An open NIC.
///
/// ```no_run
/// let nic = ulnic::Nic::open()?;
/// println!("node {}", nic.node());
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Clone)]
pub struct Nic {
    attachment: Attachment,
    info: DeviceInfo,
}

/// How this process reaches its node.
#[derive(Clone)]
enum Attachment {
    /// Host attach: this process drives a device node over vhost-user.
    Host(Arc<HostAttach>),
    /// The Linux driver: each protection domain is an open of this file.
    Kernel(std::path::PathBuf),
}

impl Nic {
    /// Opens the NIC: the guest device file (`ULNIC_DEVICE`, default
    /// `/dev/ulnic0`) when it exists, otherwise the node socket named by
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
            attachment: Attachment::Kernel(path.to_path_buf()),
            info,
        })
    }

    /// Attaches to a device node's socket directly.
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
            attachment: Attachment::Host(hw),
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
        let inner: Arc<dyn Domain> = match &self.attachment {
            Attachment::Host(hw) => Arc::new(host::HostDomain::new(hw.clone())?),
            Attachment::Kernel(path) => Arc::new(kernel::KernelDomain::open(path, self.info)?),
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
    pub(crate) inner: Arc<dyn Domain>,
    pub(crate) utlb: utlb::SharedTranslations,
}

impl ProtectionDomain {
    /// A new watcher of this domain's device (spec §6 "Several waiters"):
    /// one waiter's wake-up for the notifications of the endpoints it
    /// watches, of this domain or any other of the device.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let w = nic.alloc_pd()?.new_watcher()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new_watcher(&self) -> Result<std::sync::Arc<crate::watcher::Watcher>, Error> {
        crate::watcher::Watcher::of(&self.inner)
    }

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

    /// The descriptor that becomes readable when one of the domain's armed
    /// endpoints is notified (the Linux driver's open file; under host
    /// attach the attachment's notification eventfd), for a program that
    /// waits for many endpoints at once in `poll`, `select` or `epoll`.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let pd = nic.alloc_pd()?;
    /// let fd = pd.notification_fd();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.notification_fd()
    }

    /// Takes every notification of the domain's endpoints at once (one
    /// call to the driver, whatever their number): the endpoints that were
    /// notified. Afterwards the descriptor is unreadable until a new one
    /// comes. Never blocks.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// let woken: Vec<u32> = pd.take_notified()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn take_notified(&self) -> Result<Vec<u32>, Error> {
        self.inner.take_notified()
    }

    /// The endpoint memory the device holds now (every domain's, bytes)
    /// and the most it may hold: in a guest the driver's budget (spec §9),
    /// under host attach the attachment's shared memory. `None` when the
    /// driver does not say (an older one).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// if let Some((used, limit)) = pd.memory_use() {
    ///     println!("{} of {} MiB", used >> 20, limit >> 20);
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn memory_use(&self) -> Option<(u64, u64)> {
        self.inner.memory_use()
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
            reporting: Default::default(),
        };
        ep.prepare_bounce();
        Ok(ep)
    }
}
