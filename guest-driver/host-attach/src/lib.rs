//! The ulnic host-attach driver: attaches an ordinary host process straight
//! to a ulnic device node over vhost-user, the way DPDK's virtio-user does.
//!
//! The process plays the part a VM and its kernel driver play elsewhere: it
//! creates memfd-backed "guest" memory, shares it with the device
//! (`SET_MEM_TABLE`), sets up every virtqueue, and drives the control and
//! notification queues exactly as docs/spec.md asks of the Linux driver.
//! Addresses it hands the device are offsets into that memory (its
//! guest-physical addresses start at 0).
//!
//! Inside: `memory` (the shared memfd memory and allocations in it),
//! `virtqueue` (the driver side of a split virtqueue), `error`, and here
//! the attachment itself (`HostAttach`: handshake, commands, kicks,
//! notifications).

mod aperture;
mod error;
mod memory;
mod virtqueue;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use log::debug;
use ulnic_abi::wire::NotifyRecord;
use ulnic_abi::{
    bitmap, cmd, status, DeviceInfo, CMD_HEADER_SIZE, FIRST_DOORBELL_QUEUE, NOTIFY_QUEUE,
    RESP_HEADER_SIZE,
};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

pub use error::{Error, COMMAND_TIMEOUT};

pub use memory::{map_shared, DmaBuffer, DmaMemory};
use virtqueue::DriverQueue;

/// Takes a lock even when a holder panicked: nothing here is left half
/// updated across a call that can panic.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A protection domain made by [`HostAttach::create_pd`]: its id, for
/// commands, and its doorbell (spec §5.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtectionDomain {
    /// The domain's id.
    pub id: u32,
    /// Its doorbell queue.
    pub doorbell_queue: u16,
    /// Where its doorbell bitmap is in shared memory.
    pub doorbell_gpa: u64,
}

/// Default size of the memory a process shares with the device.
pub const DEFAULT_MEMORY: usize = 64 << 20;
/// Size of the control and notification virtqueues.
const QUEUE_SIZE: u16 = 64;
/// Size of the doorbell virtqueues (only their kick eventfds are used).
const DOORBELL_QUEUE_SIZE: u16 = 2;
/// virtio VERSION_1 feature bit.
const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

fn proto(step: &'static str) -> impl FnOnce(vhost::Error) -> Error {
    move |source| Error::Protocol { step, source }
}

/// A process attached to one device node.
pub struct HostAttach {
    /// The vhost-user connection, kept open while attached: closing it is
    /// what detaches (the device then frees everything this process made;
    /// `RESET_OWNER` would not, spec §2).
    _frontend: Mutex<Frontend>,
    memory: DmaMemory,
    control: Mutex<ControlQueue>,
    notify: Mutex<NotifyQueue>,
    /// The notification queue's call eventfd; waited on without holding
    /// `notify`, so waiters for different endpoints do not serialise.
    notify_call: EventFd,
    /// Kick eventfds of the doorbell queues, by doorbell slot.
    doorbells: Vec<EventFd>,
    /// Doorbell bitmaps of the domains made by `create_pd`, by domain id.
    doorbell_bits: Mutex<std::collections::HashMap<u32, DmaBuffer>>,
    _unused_call: EventFd,
    /// Notified endpoints not yet taken: bit `e % 64` of word `e / 64`.
    pending: Box<[AtomicU64]>,
    /// Watchers (eventfds of this process) of each endpoint: every
    /// record naming the endpoint adds one to each (spec §6, "Several
    /// waiters").
    watchers: Mutex<std::collections::HashMap<u32, Vec<std::os::fd::RawFd>>>,
    /// Threads inside `wait_notification`, which sleep on `notify_call`
    /// itself: whoever reads it for records must wake them again.
    sleepers: std::sync::atomic::AtomicUsize,
    info: DeviceInfo,
    /// The process that attached: only it may use the queues.
    owner: u32,
    /// The PIO aperture, when the device offers one (spec §6.2).
    pio: Option<aperture::Aperture>,
}

struct ControlQueue {
    queue: DriverQueue,
    kick: EventFd,
    call: EventFd,
    buf: DmaBuffer,
    /// A command timed out: the device may still answer it, into `buf`
    /// and the used ring, so the queue is never used again (spec §4).
    dead: bool,
}

struct NotifyQueue {
    queue: DriverQueue,
    kick: EventFd,
    bufs: DmaBuffer,
    reposts: RepostKicks,
}

/// When to kick the notification queue for reposted buffers (spec §6): the
/// device reads the available ring whenever it has a record to post, so a
/// repost need not wake it. It runs out only when none of the `B` buffers
/// is visible to it: the `i` reposted since the last kick but not yet
/// visible were counted, and reposting the other `B - i` brings the count
/// to at least `B`, so any `every <= B` kicks after the device looked. Half
/// the queue keeps a device from running out often.
#[derive(Debug)]
struct RepostKicks {
    every: u16,
    unkicked: u16,
}

impl RepostKicks {
    fn new(buffers: u16) -> RepostKicks {
        RepostKicks {
            every: (buffers / 2).max(1),
            unkicked: 0,
        }
    }

    /// Counts `n` reposted buffers (already published); true when the
    /// queue must be kicked now.
    fn reposted(&mut self, n: u16) -> bool {
        self.unkicked = self.unkicked.saturating_add(n);
        if self.unkicked >= self.every {
            self.unkicked = 0;
            return true;
        }
        false
    }
}

/// Size of one notification record buffer.
const NOTIFY_RECORD: u32 = ulnic_abi::NOTIFY_RECORD_SIZE as u32;

/// Names a failed OS call.
fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Os { what, source }
}

/// The vhost-user handshake up to the queues: features (the device's
/// that this driver knows and `accept`s, spec §2), owner, protocol
/// features (MQ; CONFIG if offered; for PIO windows REPLY_ACK,
/// BACKEND_REQ, BACKEND_SEND_FD and SHMEM, if all offered). Returns the
/// device's queue count, and whether PIO's protocol features were taken.
fn negotiate(fe: &mut Frontend, path: &Path, accept: u64) -> Result<(usize, bool), Error> {
    // The device closes a second frontend's connection before reading
    // anything: the first request then finds the socket closed.
    let features = fe.get_features().map_err(|e| match e {
        vhost::Error::VhostUserProtocol(
            vhost::vhost_user::Error::Disconnected
            | vhost::vhost_user::Error::SocketBroken(_)
            | vhost::vhost_user::Error::PartialMessage,
        ) => Error::NodeBusy(path.to_path_buf()),
        e => proto("GET_FEATURES")(e),
    })?;
    let want = VIRTIO_F_VERSION_1
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
        | ulnic_abi::F_MESSAGING;
    if features & want != want {
        return Err(Error::Incompatible(format!(
            "device features {features:#x} lack {want:#x}"
        )));
    }
    fe.set_owner().map_err(proto("SET_OWNER"))?;
    // Accept every device feature this driver knows: the device acts
    // only on accepted ones (spec §2).
    fe.set_features(want | (features & accept & ulnic_abi::F_IMPLEMENTED))
        .map_err(proto("SET_FEATURES"))?;
    let pf = fe
        .get_protocol_features()
        .map_err(proto("GET_PROTOCOL_FEATURES"))?;
    if !pf.contains(VhostUserProtocolFeatures::MQ) {
        return Err(Error::Incompatible(
            "device does not offer the MQ protocol feature".into(),
        ));
    }
    // The device's map and unmap requests need replies (REPLY_ACK) to
    // tell when a revocation took effect (spec §6.2).
    let pio = VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::BACKEND_REQ
        | VhostUserProtocolFeatures::BACKEND_SEND_FD
        | VhostUserProtocolFeatures::SHMEM;
    let with_pio = accept & ulnic_abi::F_PIO != 0 && pf.contains(pio);
    let mut take = pf & (VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG);
    if with_pio {
        take |= pio;
    }
    fe.set_protocol_features(take)
        .map_err(proto("SET_PROTOCOL_FEATURES"))?;
    let queues = fe.get_queue_num().map_err(proto("GET_QUEUE_NUM"))? as usize;
    if queues < usize::from(FIRST_DOORBELL_QUEUE) + 1 || queues > ulnic_abi::QUEUE_COUNT as usize {
        return Err(Error::Incompatible(format!("device has {queues} queues")));
    }
    Ok((queues, with_pio))
}

/// The PIO aperture the device offers (`GET_SHMEM_CONFIG`, region 0),
/// served; `None` when it offers none.
fn pio_aperture(fe: &mut Frontend) -> Result<Option<aperture::Aperture>, Error> {
    let config = fe.get_shmem_config().map_err(proto("GET_SHMEM_CONFIG"))?;
    let size = config.memory_sizes[0];
    if config.nregions == 0 || size == 0 {
        return Ok(None);
    }
    aperture::Aperture::serve(fe, size).map(Some)
}

/// Sets up and enables the device's `queues` virtqueues in `memory`: the
/// control and notification queues (with their call eventfds) and the
/// doorbell queues, whose calls all go to `unused_call`. Returns the
/// control queue, the notification queue and its call eventfd, and the
/// doorbells' kick eventfds.
fn set_up_queues(
    fe: &mut Frontend,
    memory: &DmaMemory,
    queues: usize,
    unused_call: &EventFd,
) -> Result<(ControlQueue, NotifyQueue, EventFd, Vec<EventFd>), Error> {
    let mut control = None;
    let mut notify = None;
    let mut doorbells = Vec::new();
    for q in 0..queues {
        let size = if q < usize::from(FIRST_DOORBELL_QUEUE) {
            QUEUE_SIZE
        } else {
            DOORBELL_QUEUE_SIZE
        };
        let queue = DriverQueue::new(memory, size)?;
        let kick = EventFd::new(EFD_NONBLOCK).map_err(os("eventfd"))?;
        let call = if q < usize::from(FIRST_DOORBELL_QUEUE) {
            Some(EventFd::new(EFD_NONBLOCK).map_err(os("eventfd"))?)
        } else {
            None
        };
        set_up_vring(
            fe,
            memory,
            q,
            size,
            &queue,
            &kick,
            call.as_ref().unwrap_or(unused_call),
        )?;
        match (q as u16, call) {
            (ulnic_abi::CONTROL_QUEUE, Some(call)) => {
                // The request in one half, the response in the other.
                let buf = memory.alloc(ulnic_abi::PAGE_SIZE as usize)?;
                control = Some(ControlQueue {
                    queue,
                    kick,
                    call,
                    buf,
                    dead: false,
                });
            }
            (NOTIFY_QUEUE, Some(call)) => {
                let bufs = memory.alloc(usize::from(QUEUE_SIZE) * NOTIFY_RECORD as usize)?;
                notify = Some((
                    NotifyQueue {
                        queue,
                        kick,
                        bufs,
                        reposts: RepostKicks::new(size),
                    },
                    call,
                ));
            }
            _ => doorbells.push(kick),
        }
    }
    let (Some(control), Some((notify, notify_call))) = (control, notify) else {
        return Err(Error::Incompatible(
            "control or notification queue missing".into(),
        ));
    };
    Ok((control, notify, notify_call, doorbells))
}

/// Tells the device virtqueue `q`'s size and where it is in shared
/// memory, its kick and call eventfds, and enables it.
fn set_up_vring(
    fe: &mut Frontend,
    memory: &DmaMemory,
    q: usize,
    size: u16,
    queue: &DriverQueue,
    kick: &EventFd,
    call: &EventFd,
) -> Result<(), Error> {
    fe.set_vring_num(q, size).map_err(proto("SET_VRING_NUM"))?;
    let cfg = VringConfigData {
        queue_max_size: size,
        queue_size: size,
        flags: 0,
        desc_table_addr: memory.host_base() as u64 + queue.desc_gpa(),
        used_ring_addr: memory.host_base() as u64 + queue.used_gpa(),
        avail_ring_addr: memory.host_base() as u64 + queue.avail_gpa(),
        log_addr: None,
    };
    fe.set_vring_addr(q, &cfg)
        .map_err(proto("SET_VRING_ADDR"))?;
    fe.set_vring_base(q, 0).map_err(proto("SET_VRING_BASE"))?;
    fe.set_vring_kick(q, kick)
        .map_err(proto("SET_VRING_KICK"))?;
    fe.set_vring_call(q, call)
        .map_err(proto("SET_VRING_CALL"))?;
    fe.set_vring_enable(q, true)
        .map_err(proto("SET_VRING_ENABLE"))?;
    Ok(())
}

impl HostAttach {
    /// Connects to the node socket at `path`, sharing `memory_size` bytes.
    pub fn connect(path: &Path, memory_size: usize) -> Result<HostAttach, Error> {
        Self::connect_with_memory(path, DmaMemory::new(memory_size)?)
    }

    /// Connects to the node socket at `path`, sharing `memory`.
    pub fn connect_with_memory(path: &Path, memory: DmaMemory) -> Result<HostAttach, Error> {
        Self::connect_accepting(path, memory, ulnic_abi::F_IMPLEMENTED)
    }

    /// As [`HostAttach::connect_with_memory`], accepting only the device
    /// feature bits in `accept` (F_MESSAGING always): the device then
    /// refuses what needs the others (spec §2). For testing that.
    pub fn connect_accepting(
        path: &Path,
        memory: DmaMemory,
        accept: u64,
    ) -> Result<HostAttach, Error> {
        let mut fe =
            Frontend::connect(path, u64::from(ulnic_abi::QUEUE_COUNT)).map_err(proto("connect"))?;
        let (queues, with_pio) = negotiate(&mut fe, path, accept)?;
        let pio = if with_pio {
            pio_aperture(&mut fe)?
        } else {
            None
        };
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: memory.len() as u64,
            userspace_addr: memory.host_base() as u64,
            mmap_offset: 0,
            mmap_handle: memory.as_raw_fd(),
        };
        fe.set_mem_table(&[region])
            .map_err(proto("SET_MEM_TABLE"))?;

        let unused_call = EventFd::new(EFD_NONBLOCK).map_err(os("eventfd"))?;
        let (control, mut notify, notify_call, doorbells) =
            set_up_queues(&mut fe, &memory, queues, &unused_call)?;
        for i in 0..QUEUE_SIZE {
            let gpa = notify.bufs.gpa + u64::from(i) * u64::from(NOTIFY_RECORD);
            notify.queue.add(&memory, &[], &[(gpa, NOTIFY_RECORD)]);
        }
        let _ = notify.kick.write(1);
        let mut this = HostAttach {
            owner: std::process::id(),
            _frontend: Mutex::new(fe),
            memory,
            control: Mutex::new(control),
            notify: Mutex::new(notify),
            notify_call,
            doorbells,
            doorbell_bits: Mutex::new(std::collections::HashMap::new()),
            _unused_call: unused_call,
            watchers: Mutex::new(std::collections::HashMap::new()),
            sleepers: std::sync::atomic::AtomicUsize::new(0),
            pending: (0..bitmap::words(ulnic_abi::MAX_ENDPOINTS_LIMIT))
                .map(|_| AtomicU64::new(0))
                .collect(),
            info: DeviceInfo::default(),
            pio,
        };
        this.info = this.device_info()?;
        debug!(
            "attached to node {} ({} endpoints)",
            this.info.node, this.info.max_endpoints
        );
        Ok(this)
    }

    /// The device's GET_INFO, checked: its spec version must be this
    /// driver's.
    fn device_info(&self) -> Result<DeviceInfo, Error> {
        let info = self.command(cmd::GET_INFO, &[])?;
        if info.len() < DeviceInfo::SIZE {
            return Err(Error::BadResponse(cmd::GET_INFO));
        }
        let info = DeviceInfo::decode(&info);
        // Before 1.0 a minor version may change the wire (semver's rule).
        if info.version_major != ulnic_abi::SPEC_VERSION_MAJOR
            || (ulnic_abi::SPEC_VERSION_MAJOR == 0
                && info.version_minor != ulnic_abi::SPEC_VERSION_MINOR)
        {
            return Err(Error::Incompatible(format!(
                "device implements spec {}.{}, this driver {}.{}",
                info.version_major,
                info.version_minor,
                ulnic_abi::SPEC_VERSION_MAJOR,
                ulnic_abi::SPEC_VERSION_MINOR
            )));
        }
        Ok(info)
    }

    /// What the device reported at attach time.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Whether the calling process is the one that attached (a forked
    /// child's copy of the attachment may not use its queues).
    fn is_owner(&self) -> bool {
        std::process::id() == self.owner
    }

    /// The PIO aperture (spec §6.2): its first byte and its length; a
    /// window the device reports at offset `o` is at `base + o`. `None`
    /// when the device offers no aperture.
    pub fn pio_aperture(&self) -> Option<(*mut u8, u64)> {
        self.pio.as_ref().map(|a| (a.base(), a.len()))
    }

    /// The shared memory.
    pub fn memory(&self) -> &DmaMemory {
        &self.memory
    }

    /// Runs one control command and returns its result payload.
    pub fn command(&self, opcode: u32, payload: &[u8]) -> Result<Vec<u8>, Error> {
        if !self.is_owner() {
            return Err(Error::ForkedChild(opcode, self.owner));
        }
        let mut c = lock(&self.control);
        let half = c.buf.len / 2;
        if CMD_HEADER_SIZE + payload.len() > half {
            return Err(Error::Command {
                opcode,
                status: status::BAD_LENGTH,
            });
        }
        let header = ulnic_abi::wire::CmdHeader {
            opcode: opcode.into(),
            reserved: 0.into(),
        };
        let mut req = Vec::with_capacity(CMD_HEADER_SIZE + payload.len());
        req.extend_from_slice(zerocopy::IntoBytes::as_bytes(&header));
        req.extend_from_slice(payload);
        if c.dead {
            return Err(Error::ControlQueueDead(opcode));
        }
        self.memory.write(c.buf.gpa, &req);
        let (req_gpa, resp_gpa) = (c.buf.gpa, c.buf.gpa + half as u64);
        let used = Self::submit(
            &self.memory,
            &mut c,
            opcode,
            &[(req_gpa, req.len() as u32)],
            &[(resp_gpa, half as u32)],
        )?;
        let len = used as usize;
        if len < RESP_HEADER_SIZE {
            return Err(Error::BadResponse(opcode));
        }
        let mut resp = vec![0u8; len.min(half)];
        self.memory.read(resp_gpa, &mut resp);
        let st = ulnic_abi::wire::read::<ulnic_abi::wire::RespHeader>(&resp)
            .status
            .get();
        if st != status::OK {
            return Err(Error::Command { opcode, status: st });
        }
        Ok(resp[RESP_HEADER_SIZE..].to_vec())
    }

    /// Posts one chain on the control queue and waits for the device to
    /// use it: the used length. After `COMMAND_TIMEOUT` the queue is dead
    /// for good (spec §4).
    fn submit(
        memory: &DmaMemory,
        c: &mut ControlQueue,
        opcode: u32,
        readable: &[(u64, u32)],
        writable: &[(u64, u32)],
    ) -> Result<u32, Error> {
        if c.dead {
            return Err(Error::ControlQueueDead(opcode));
        }
        let ControlQueue {
            queue,
            kick,
            call,
            dead,
            ..
        } = c;
        queue.add(memory, readable, writable);
        let _ = kick.write(1);
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            if let Some((_, len)) = queue.pop_used(memory) {
                return Ok(len);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                *dead = true;
                return Err(Error::Timeout(opcode));
            }
            let _ = wait_readable(call, left);
            let _ = call.read();
        }
    }

    /// Posts a hand-made chain of (address, length) buffers on the
    /// control queue and returns the length the device used (0: it found
    /// the chain malformed and did nothing). For testing a device's
    /// validation; drivers use [`HostAttach::command`].
    pub fn raw_control_chain(
        &self,
        readable: &[(u64, u32)],
        writable: &[(u64, u32)],
    ) -> Result<u32, Error> {
        let mut c = lock(&self.control);
        Self::submit(&self.memory, &mut c, 0, readable, writable)
    }

    /// Creates a protection domain with a zeroed doorbell bitmap of its
    /// own (CREATE_PD, spec §5.8).
    pub fn create_pd(&self) -> Result<ProtectionDomain, Error> {
        let bytes = ulnic_abi::doorbell_bitmap_bytes(self.info.max_endpoints);
        let bits = self.memory.alloc(bytes as usize)?;
        let payload = ulnic_abi::wire::CreatePd {
            doorbell_gpa: bits.gpa.into(),
        };
        let created = self
            .command(cmd::CREATE_PD, payload.as_bytes())
            .and_then(|r| {
                ulnic_abi::wire::PdCreated::read_from_prefix(&r)
                    .map(|(c, _)| c)
                    .map_err(|_| Error::BadResponse(cmd::CREATE_PD))
            });
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                self.memory.free(bits);
                return Err(e);
            }
        };
        let pd = ProtectionDomain {
            id: created.id.get(),
            doorbell_queue: created.doorbell_queue.get() as u16,
            doorbell_gpa: bits.gpa,
        };
        lock(&self.doorbell_bits).insert(pd.id, bits);
        Ok(pd)
    }

    /// Destroys a domain made by [`HostAttach::create_pd`] and its
    /// endpoints (DESTROY_PD); its bitmap is freed once the device let go.
    pub fn destroy_pd(&self, pd: &ProtectionDomain) -> Result<(), Error> {
        let id = ulnic_abi::wire::ObjectId { id: pd.id.into() };
        self.command(cmd::DESTROY_PD, id.as_bytes())?;
        if let Some(bits) = lock(&self.doorbell_bits).remove(&pd.id) {
            self.memory.free(bits);
        }
        Ok(())
    }

    /// Rings endpoint `endpoint`'s doorbell: sets its bit in its domain's
    /// bitmap, then kicks the domain's doorbell queue (spec §5.8).
    pub fn ring_doorbell(&self, pd: &ProtectionDomain, endpoint: u32) {
        if endpoint < self.info.max_endpoints {
            let word = pd.doorbell_gpa + bitmap::word_offset(endpoint);
            self.memory.fetch_or_u64(word, bitmap::mask(endpoint));
        }
        let slot = pd
            .doorbell_queue
            .wrapping_sub(ulnic_abi::FIRST_DOORBELL_QUEUE);
        if let Some(k) = self.doorbells.get(usize::from(slot)) {
            let _ = k.write(1);
        }
    }

    /// The notification queue's call eventfd, for `poll`, `select` and
    /// `epoll`: readable once the device has posted a notification record
    /// (for any endpoint) that no `wait_notification` has taken yet. A
    /// `wait_notification` with a zero timeout takes what came and makes
    /// it unreadable again.
    ///
    /// ```no_run
    /// # let hw = ulnic_host_attach::HostAttach::connect("/tmp/u/node0.sock".as_ref(), 64 << 20)?;
    /// let mut p = libc::pollfd { fd: hw.notification_fd(), events: libc::POLLIN, revents: 0 };
    /// // SAFETY: one valid pollfd.
    /// unsafe { libc::poll(&mut p, 1, 100) };
    /// # Ok::<(), ulnic_host_attach::Error>(())
    /// ```
    pub fn notification_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.notify_call)
    }

    /// Waits up to `timeout` for a notification for `endpoint`; true when one
    /// came. Notifications for other endpoints are kept for their waiters.
    pub fn wait_notification(&self, endpoint: u32, timeout: Duration) -> bool {
        self.wait_notification_interruptible(endpoint, timeout)
            .unwrap_or(false)
    }

    /// As [`Self::wait_notification`], but a signal arriving while it
    /// sleeps ends the wait with `Err(Interrupted)`, as it would end a
    /// system call the caller stands for.
    ///
    /// ```no_run
    /// # let hw = ulnic_host_attach::HostAttach::connect("/tmp/u/node0.sock".as_ref(), 64 << 20)?;
    /// match hw.wait_notification_interruptible(3, std::time::Duration::from_millis(10)) {
    ///     Ok(notified) => println!("notified: {notified}"),
    ///     Err(_) => println!("a signal came"),
    /// }
    /// # Ok::<(), ulnic_host_attach::Error>(())
    /// ```
    pub fn wait_notification_interruptible(
        &self,
        endpoint: u32,
        timeout: Duration,
    ) -> Result<bool, std::io::Error> {
        let Some(word) = self.pending.get(bitmap::word(endpoint)) else {
            return Ok(false);
        };
        if !self.is_owner() {
            // A forked child: the notification queue is the parent's.
            std::thread::sleep(timeout);
            return Ok(false);
        }
        let bit = bitmap::mask(endpoint);
        let deadline = Instant::now() + timeout;
        // Counted before its first look, so that a reader of the eventfd
        // that drains after it wakes it (`feed_watchers`).
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let r = self.wait_counted(word, bit, endpoint, deadline, timeout.is_zero());
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// `wait_notification_interruptible`'s loop, while counted a sleeper.
    fn wait_counted(
        &self,
        word: &AtomicU64,
        bit: u64,
        endpoint: u32,
        deadline: Instant,
        look: bool,
    ) -> Result<bool, std::io::Error> {
        if look {
            // A look, for a caller that polls `notification_fd`: leave it
            // unreadable unless a record comes after this (records read
            // below set `pending`; others' waiters are woken there).
            let _ = self.notify_call.read();
        }
        loop {
            if word.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
                return Ok(true);
            }
            let (reposted, for_others, _) = self.drain_notifications(endpoint);
            if for_others {
                // Another thread may be asleep on the eventfd whose count
                // this thread consumed: wake everyone to look again.
                let _ = self.notify_call.write(1);
            }
            if reposted {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            if !wait_readable(&self.notify_call, left) {
                return Err(std::io::Error::from_raw_os_error(libc::EINTR));
            }
            let _ = self.notify_call.read();
        }
    }

    /// Makes eventfd `watcher` watch `endpoint` (or stop, `on` false):
    /// each notification record for the endpoint that this process reads
    /// from now on adds one to it, whoever reads it (spec §6, "Several
    /// waiters"). A caller must stop every watch of an eventfd before it
    /// closes it. Records are read only by the process that attached (a
    /// forked child's watches are never fed: `watch_feedable`).
    ///
    /// ```no_run
    /// # let hw = ulnic_host_attach::HostAttach::connect("/tmp/u/node0.sock".as_ref(), 64 << 20)?;
    /// let ev = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    /// hw.watch(3, std::os::fd::AsRawFd::as_raw_fd(&ev), true);
    /// hw.feed_watchers();
    /// hw.watch(3, std::os::fd::AsRawFd::as_raw_fd(&ev), false);
    /// # Ok::<(), ulnic_host_attach::Error>(())
    /// ```
    pub fn watch(&self, endpoint: u32, watcher: std::os::fd::RawFd, on: bool) {
        let mut w = lock(&self.watchers);
        let list = w.entry(endpoint).or_default();
        let at = list.iter().position(|&f| f == watcher);
        match (on, at) {
            (true, None) => list.push(watcher),
            (false, Some(i)) => {
                list.swap_remove(i);
            }
            _ => {}
        }
        if list.is_empty() {
            w.remove(&endpoint);
        }
    }

    /// Ends every watch of `endpoint` (it was destroyed: its id may name
    /// another endpoint later).
    ///
    /// ```no_run
    /// # let hw = ulnic_host_attach::HostAttach::connect("/tmp/u/node0.sock".as_ref(), 64 << 20)?;
    /// hw.unwatch_endpoint(3);
    /// # Ok::<(), ulnic_host_attach::Error>(())
    /// ```
    pub fn unwatch_endpoint(&self, endpoint: u32) {
        lock(&self.watchers).remove(&endpoint);
    }

    /// Whether this process reads the notification records that feed
    /// watchers (the process that attached; a forked child does not).
    pub fn watch_feedable(&self) -> bool {
        self.is_owner()
    }

    /// Reads the notification records that came, feeding the watchers of
    /// the endpoints they name; call it when [`Self::notification_fd`]
    /// is readable. Notifications of endpoints nobody watches stay for
    /// [`Self::wait_notification`] and [`Self::take_notified`].
    ///
    /// ```no_run
    /// # let hw = ulnic_host_attach::HostAttach::connect("/tmp/u/node0.sock".as_ref(), 64 << 20)?;
    /// hw.feed_watchers();
    /// # Ok::<(), ulnic_host_attach::Error>(())
    /// ```
    pub fn feed_watchers(&self) {
        if !self.is_owner() {
            return;
        }
        let _ = self.notify_call.read();
        let (any, _, _) = self.drain_notifications(u32::MAX);
        if any && self.sleepers.load(Ordering::SeqCst) > 0 {
            // A thread asleep in wait_notification may have lost the
            // eventfd's count to the read above; its bit is in `pending`.
            let _ = self.notify_call.write(1);
        }
    }

    /// Takes every notification that came, for any endpoint of this
    /// attachment (for a process that slept on `notification_fd` for many):
    /// the endpoints notified. Never blocks; the descriptor is unreadable
    /// afterwards unless a record comes later.
    ///
    /// ```no_run
    /// # let hw = ulnic_host_attach::HostAttach::connect("/tmp/u/node0.sock".as_ref(), 64 << 20)?;
    /// for ep in hw.take_notified() {
    ///     println!("endpoint {ep} was notified");
    /// }
    /// # Ok::<(), ulnic_host_attach::Error>(())
    /// ```
    pub fn take_notified(&self) -> Vec<u32> {
        if !self.is_owner() {
            return Vec::new(); // a forked child: the queue is the parent's
        }
        // A thread asleep in wait_notification meanwhile may lose its
        // wake-up to this read; it finds its bit taken at its next look
        // (taking everything is what this call means).
        let _ = self.notify_call.read();
        self.drain_notifications(u32::MAX);
        let words = self.pending.iter().enumerate();
        words
            .flat_map(|(i, w)| bitmap::endpoints(i, w.swap(0, Ordering::AcqRel)))
            .collect()
    }

    /// Adds one to every watcher of `ep`: whether it has any.
    fn feed(&self, ep: u32) -> bool {
        let w = lock(&self.watchers);
        let Some(list) = w.get(&ep) else {
            return false;
        };
        for &fd in list {
            // SAFETY: an eventfd of this process, watched until its owner
            // stops the watch (before closing it); 8 bytes from a u64.
            unsafe { libc::write(fd, (&1u64 as *const u64).cast(), 8) };
        }
        true
    }

    /// Moves notification records into `pending`, feeds the watchers of
    /// the endpoints they name, and reposts their buffers; returns (any
    /// record, any record for an endpoint other than the caller's, any
    /// record for an endpoint nobody watches). Records are only read under the lock, never waited for.
    fn drain_notifications(&self, caller: u32) -> (bool, bool, bool) {
        let mut n = lock(&self.notify);
        let NotifyQueue {
            queue,
            kick,
            bufs,
            reposts,
        } = &mut *n;
        let (mut any, mut others, mut unwatched) = (false, false, false);
        let mut reposted = 0u16;
        while let Some((id, len)) = queue.pop_used(&self.memory) {
            let gpa = bufs.gpa + u64::from(id) * u64::from(NOTIFY_RECORD);
            if len as usize >= std::mem::size_of::<NotifyRecord>() {
                let mut rec = NotifyRecord::new_zeroed();
                self.memory.read(gpa, rec.as_mut_bytes());
                let ep = rec.endpoint.get();
                // The device names the endpoint; one past the limit is
                // nobody's, and only wakes the caller. Other reasons
                // (RESET, PIO_UNMAPPED: this process's aperture is
                // changed by the backend channel) name no endpoint.
                if rec.reason.get() == ulnic_abi::notify_reason::ENDPOINT {
                    if let Some(w) = self.pending.get(bitmap::word(ep)) {
                        w.fetch_or(bitmap::mask(ep), Ordering::AcqRel);
                    }
                    let watched = self.feed(ep);
                    others |= ep != caller;
                    unwatched |= !watched;
                }
            }
            queue.add(&self.memory, &[], &[(gpa, NOTIFY_RECORD)]);
            reposted = reposted.saturating_add(1);
            any = true;
        }
        if reposts.reposted(reposted) {
            let _ = kick.write(1);
        }
        (any, others, unwatched)
    }
}

/// Blocks until `fd` is readable or `timeout` passes.
/// Sleeps until `fd` is readable or `timeout` passes: false when a signal
/// came meanwhile (the caller's call is interrupted, as a system call
/// would be).
fn wait_readable(fd: &EventFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd, count 1.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    !(r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted)
}

#[cfg(test)]
mod tests {
    use super::RepostKicks;

    /// The notification queue between a device and a driver that counts its
    /// reposts with `RepostKicks`, stepped in a pseudo-random interleaving.
    /// A drain takes records, then publishes their buffers and decides on
    /// a kick; a publication becomes visible to the device later (a store
    /// still in flight), or at once when the driver kicks (the kick is a
    /// system call, after the store).
    struct Model {
        avail: u32,
        /// Published, not yet visible to the device.
        in_flight: u32,
        used: u32,
        taken: u32,
        /// The device found no buffer for a record and waits for a kick.
        waiting: bool,
        kicks: RepostKicks,
    }

    impl Model {
        fn publish(&mut self) {
            self.in_flight += self.taken;
            let n = self.taken as u16;
            self.taken = 0;
            if self.kicks.reposted(n) {
                self.avail += std::mem::take(&mut self.in_flight);
                self.waiting = false; // the kick makes the device look again
            }
        }
    }

    /// Runs `steps` random steps, then lets the driver drain everything:
    /// returns whether the device was left waiting with buffers available
    /// (a lost kick).
    fn lost_kick(buffers: u16, every: Option<u16>, seed: u64, steps: u32) -> bool {
        let mut kicks = RepostKicks::new(buffers);
        if let Some(e) = every {
            kicks.every = e;
        }
        let mut m = Model {
            avail: u32::from(buffers),
            in_flight: 0,
            used: 0,
            taken: 0,
            waiting: false,
            kicks,
        };
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = |n: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % u64::from(n)) as u32
        };
        for _ in 0..steps {
            // The device steps more often than the driver, so it runs out.
            match next(8).saturating_sub(4) {
                // The device has a record to post: it takes a buffer it
                // sees, or keeps the record and waits.
                0 if !m.waiting => {
                    if m.avail > 0 {
                        m.avail -= 1;
                        m.used += 1;
                    } else {
                        m.waiting = true;
                    }
                }
                1 if m.taken == 0 && m.used > 0 => {
                    let k = 1 + next(m.used);
                    m.used -= k;
                    m.taken = k;
                }
                2 if m.taken > 0 => m.publish(),
                3 => m.avail += std::mem::take(&mut m.in_flight),
                _ => {}
            }
        }
        // The driver drains whatever is left; the device posts nothing more.
        m.publish();
        while m.used > 0 {
            m.taken = std::mem::take(&mut m.used);
            m.publish();
        }
        m.avail += m.in_flight;
        m.waiting && m.avail > 0
    }

    #[test]
    fn a_device_that_ran_out_of_notification_buffers_is_always_kicked() {
        for buffers in [1u16, 2, 3, 8, 64] {
            for seed in 1..300 {
                assert!(
                    !lost_kick(buffers, None, seed, 5000),
                    "{buffers} buffers, seed {seed}: kick lost"
                );
            }
        }
        // The bound itself: once per `buffers` reposts is still enough.
        for seed in 1..300 {
            assert!(!lost_kick(64, Some(64), seed, 5000), "seed {seed}");
        }
    }

    /// The check can fail: kicking more rarely than once per `buffers`
    /// reposts loses a kick in some interleaving.
    #[test]
    fn kicking_too_rarely_is_caught() {
        assert!((1..300).any(|seed| lost_kick(64, Some(65), seed, 5000)));
        assert!((1..300).any(|seed| lost_kick(8, Some(12), seed, 5000)));
    }
}
