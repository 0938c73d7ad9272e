//! One node of the device (one vhost-user socket and its NIC state): its
//! endpoint slots, protection domains, bound port numbers, exported
//! apertures, the notification queue, and what its frontend broke.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use log::{debug, error, warn};
use ulnic_abi::wire::NotifyRecord;
use ulnic_abi::{notify_reason, Cookie, NOTIFY_QUEUE};
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;
use zerocopy::IntoBytes;

use crate::chain::{self, RingFault};
use crate::memory::guest::NodeMemory;
use crate::nic::aperture::{Aperture, ApertureTable, WindowRef};
use crate::nic::endpoint::{Endpoint, QueueLink};

/// A virtqueue of a node, as handed over by the vhost-user backend.
pub type NodeVring = crate::vring::NodeVring<NodeMemory>;

/// One node of the device: a vhost-user socket's frontend and its NIC
/// state.
pub struct Node {
    /// Node address.
    pub id: u32,
    /// The connected frontend's memory, while connected.
    pub mem: Option<NodeMemory>,
    /// Endpoint slots; the index is the endpoint id.
    pub endpoints: Vec<Option<Endpoint>>,
    /// Live protection domains.
    pub pds: HashMap<u32, Pd>,
    /// Doorbell slots kicked since the engine last looked, a bit per
    /// slot: set by the thread that receives the kick without the
    /// shard's lock (the engine may hold it for a whole pass), taken by
    /// the engine under it.
    pub kicked: Arc<AtomicU64>,
    /// Resident endpoints: the ones the engine polls (spec §5.8), each
    /// with when it last had work.
    pub resident: Vec<(u32, Instant)>,
    /// Endpoints to make resident at the engine's next pass (they left
    /// with work waiting, or their doorbell was found).
    pub rung: Vec<u32>,
    /// Next protection domain id to hand out.
    pub next_pd: u32,
    /// The last session id handed out (spec §5.4): the next endpoint gets
    /// the one after it. Starts random and is kept across resets, so a
    /// slot's or port's next holder always has another.
    pub last_session: u32,
    /// Bound ports: port number -> endpoint id.
    pub ports: HashMap<u32, u32>,
    /// The notification queue, once the frontend set it up.
    pub notify: Option<NodeVring>,
    /// Endpoints owed a notification that found no notification buffer,
    /// each at most once (so at most one per endpoint slot).
    pub notify_backlog: VecDeque<u32>,
    /// Connections served so far (for logs).
    pub connections: u64,
    /// Apertures exported by this node's endpoints.
    pub apertures: ApertureTable,
    /// Its PIO windows not revoked, by id (kept by `pio::Pio`).
    pub windows: HashMap<u32, WindowRef>,
    /// Feature bits the frontend accepted (SET_FEATURES); only these are
    /// acted on.
    pub features: u64,
    /// SET_FEATURES came on this connection: until it has, the control
    /// queue is left unserved (a frontend without PROTOCOL_FEATURES has
    /// its queues started just before its bits reach the device).
    pub features_set: bool,
    /// Virtqueues this node's frontend broke (impossible avail index),
    /// counted over the device's life.
    pub queue_errors: u64,
    /// The queues broken now, a bit per queue index (spec §2.1, config
    /// space word 52); cleared when the queue is stopped or the node reset.
    pub broken_queues: u32,
    /// Faults in this node's shared memory that cost it its connection.
    pub memory_faults: u64,
    /// Ends the current frontend's connection (set while one is attached).
    pub disconnect: Option<vhost_user_backend::ShutdownHandle>,
    /// The thread reading the current frontend's vhost-user socket (its
    /// wake-ups are `ulnic stats`' `vhost_wakeups`).
    pub vhost_reader: Option<i32>,
    /// Config-space connection epoch (spec §2.2): new for each connection,
    /// so a driver can tell that the device it talks to forgot its state.
    pub epoch: u32,
    /// While set, the control queue is left unserved: a fault injected on
    /// purpose (`Shard::stall_control`), kept across resets.
    pub control_stalled: bool,
    /// The control queue, once the frontend kicked it (to serve it again
    /// when a stall ends).
    pub control: Option<NodeVring>,
    /// When the node was last reset (its frontend left, reset the device,
    /// or its guest rebooted).
    pub reset_at: Option<std::time::Instant>,
    /// The control queue stopped under a driver and the node forgot its
    /// objects: when the queue is next served, a driver that kept running
    /// is told (spec §2.5).
    pub forgotten: bool,
    /// The RESET record was given and `ACK_RESET` has not come: every
    /// other command is refused with `RESET` (spec §2.5, §4).
    pub reset_unacked: bool,
    /// Resets told to a running driver, the latest RESET record's number
    /// (spec §2.5): only its `ACK_RESET` lifts the refusal. Kept across
    /// resets.
    pub resets_told: u32,
}

impl Node {
    pub fn new(id: u32, max_endpoints: u32) -> Self {
        Node {
            id,
            mem: None,
            endpoints: (0..max_endpoints).map(|_| None).collect(),
            pds: HashMap::new(),
            kicked: Arc::new(AtomicU64::new(0)),
            resident: Vec::new(),
            rung: Vec::new(),
            next_pd: 1,
            last_session: rand::random(),
            ports: HashMap::new(),
            notify: None,
            notify_backlog: VecDeque::new(),
            connections: 0,
            apertures: Default::default(),
            windows: HashMap::new(),
            features: 0,
            features_set: false,
            queue_errors: 0,
            broken_queues: 0,
            memory_faults: 0,
            vhost_reader: None,
            disconnect: None,
            epoch: 0,
            control_stalled: false,
            control: None,
            reset_at: None,
            forgotten: false,
            reset_unacked: false,
            resets_told: 0,
        }
    }

    /// Kicks the control queue as its driver would, so the node's own
    /// thread serves the commands that waited in it (after a stall, or
    /// for the bits of SET_FEATURES).
    pub fn kick_control(&self) {
        let Some(vring) = &self.control else {
            return;
        };
        if let Some(kick) = vring.get_ref().get_kick() {
            // The frontend's eventfd: a full one (or another kind of fd)
            // only leaves the queue unkicked.
            if let Err(e) = crate::notifier::signal(kick.as_raw_fd()) {
                log::warn!("node {}: cannot kick the control queue: {e}", self.id);
            }
        }
    }

    /// The session id the next endpoint created here gets (`last_session`
    /// moves on once it exists): never 0, and different from the last
    /// 2^32 - 1 handed out here.
    pub fn next_session(&self) -> u32 {
        self.last_session.wrapping_add(1).max(1)
    }

    /// Gives the node a new nonzero epoch, unlikely to repeat one the
    /// driver has seen: from now on nothing created before exists.
    pub fn renew_epoch(&mut self) {
        self.epoch = loop {
            let e: u32 = rand::random();
            if e != 0 && e != self.epoch {
                break e;
            }
        };
    }

    /// Frees everything the last frontend created (disconnect or reset).
    pub fn reset(&mut self) {
        let live = self.endpoints.iter().filter(|e| e.is_some()).count();
        if live > 0 || !self.pds.is_empty() {
            debug!(
                "node {}: freeing {} endpoints and {} protection domains",
                self.id,
                live,
                self.pds.len()
            );
        }
        self.endpoints.iter_mut().for_each(|e| *e = None);
        self.pds.clear();
        self.kicked.store(0, Ordering::Relaxed);
        self.resident.clear();
        self.rung.clear();
        self.ports.clear();
        self.apertures.clear();
        self.windows.clear();
        self.notify = None;
        self.control = None;
        self.notify_backlog.clear();
        self.next_pd = 1;
        self.broken_queues = 0;
        self.reset_at = Some(std::time::Instant::now());
        self.forgotten = false;
        self.reset_unacked = false;
    }

    /// Whether queue `q` is broken.
    pub fn queue_broken(&self, q: u16) -> bool {
        self.broken_queues & queue_bit(u32::from(q)) != 0
    }

    /// Breaks queue `q` (a driver error it cannot recover from until it
    /// is stopped or the device reset): counted and logged once.
    pub fn break_queue(&mut self, q: u16, fault: RingFault) {
        if !self.queue_broken(q) {
            self.broken_queues |= queue_bit(u32::from(q));
            self.queue_errors += 1;
            error!(
                "node {}: queue {q} stopped until the driver resets it: {fault}",
                self.id
            );
        }
    }

    /// Puts one notification record (endpoint id, reason) into the node's
    /// notification queue and signals the frontend; false when the driver
    /// has posted no buffer (or broke the queue). `e` =
    /// `notify_reason::RESET_ENDPOINT` is the node-wide RESET record (its
    /// endpoint field carries `resets_told`).
    pub fn push_notification(&mut self, mem: &GuestMemoryMmap<()>, e: u32) -> bool {
        let record = if e == notify_reason::RESET_ENDPOINT {
            NotifyRecord {
                endpoint: self.resets_told.into(),
                reason: notify_reason::RESET.into(),
            }
        } else {
            NotifyRecord {
                endpoint: e.into(),
                reason: notify_reason::ENDPOINT.into(),
            }
        };
        self.push_record(mem, &record)
    }

    /// Puts `record` into the next notification buffer and signals the
    /// queue; false when there is none (or the queue is broken).
    pub fn push_record(&mut self, mem: &GuestMemoryMmap<()>, record: &NotifyRecord) -> bool {
        if self.queue_broken(NOTIFY_QUEUE) {
            return false;
        }
        let Some(vring) = self.notify.as_ref() else {
            return false;
        };
        let mut st = vring.get_mut();
        if !st.get_queue().ready() {
            return false;
        }
        let chain = match chain::pop_checked(st.get_queue_mut(), mem) {
            Ok(Some(chain)) => chain,
            Ok(None) => return false,
            Err(RingFault::Indirect { head }) => {
                warn!("notification buffer {head} uses indirect descriptors (not offered); completed empty");
                let _ = st.get_queue_mut().add_used(mem, head, 0);
                return false;
            }
            Err(fault) => {
                drop(st);
                self.break_queue(NOTIFY_QUEUE, fault);
                return false;
            }
        };
        let head = chain.head_index();
        let rec = record.as_bytes();
        let written = match chain.writer(mem) {
            Ok(mut w) if w.available_bytes() >= rec.len() => {
                match std::io::Write::write_all(&mut w, rec) {
                    Ok(()) => rec.len() as u32,
                    Err(_) => 0,
                }
            }
            _ => {
                warn!("notification buffer too small or malformed; completing it empty");
                0
            }
        };
        // Through the validated memory, never the vhost-user handler's copy.
        if st.get_queue_mut().add_used(mem, head, written).is_err() {
            return false;
        }
        // Signalled through the guard already held, not a second lock.
        let signalled = crate::vring::signal_call(&st);
        drop(st);
        match signalled {
            Ok(()) => {}
            Err(crate::notifier::SignalError::Full) => {
                self.break_queue(NOTIFY_QUEUE, RingFault::CallFull)
            }
            Err(err) => warn!("cannot signal the notification queue: {err}"),
        }
        written > 0
    }

    /// How many objects the frontend has created and not destroyed: a
    /// refused command must leave these unchanged (spec §4).
    pub fn object_counts(&self) -> ObjectCounts {
        let eps = self.endpoints.iter().flatten();
        ObjectCounts {
            pds: self.pds.len(),
            endpoints: eps.clone().count(),
            ports: self.ports.len(),
            apertures: self.apertures.live(),
            tripwires: eps
                .clone()
                .map(|e| e.tripwires.iter().flatten().count())
                .sum(),
            filters: eps.map(|e| e.filters.len()).sum(),
        }
    }

    /// Endpoint `id`'s event queue (spec §6.1), if it has one that still
    /// exists: the endpoint it names has the session it was attached to.
    pub fn queue_of(&self, id: u32) -> Option<QueueLink> {
        let link = self.endpoints.get(id as usize)?.as_ref()?.queue?;
        let q = self.endpoints.get(link.id as usize)?.as_ref()?;
        (q.session == link.session).then_some(link)
    }

    /// The ids of the endpoints whose live event queue is `queue`.
    pub fn sources_of(&self, queue: u32) -> impl Iterator<Item = u32> + '_ {
        (0..self.endpoints.len() as u32)
            .filter(move |&e| self.queue_of(e).is_some_and(|l| l.id == queue))
    }

    /// A live endpoint by id.
    pub fn endpoint_mut(&mut self, id: u32) -> Option<&mut Endpoint> {
        self.endpoints.get_mut(id as usize).and_then(|e| e.as_mut())
    }

    /// Removes an endpoint and its port binding.
    pub fn remove_endpoint(&mut self, id: u32) -> Option<Endpoint> {
        let ep = self.endpoints.get_mut(id as usize)?.take()?;
        self.resident.retain(|&(e, _)| e != id);
        // A kept notification would name an endpoint that is gone, or the
        // next one given its id (spec §2.1).
        self.notify_backlog.retain(|&e| e != id);
        if let Some(p) = ep.port {
            self.ports.remove(&p);
        }
        self.apertures.revoke_all(id);
        Some(ep)
    }
}

impl Node {
    /// The lowest doorbell slot no domain holds (spec §5.8).
    pub fn free_doorbell_slot(&self) -> Option<u32> {
        (0..ulnic_abi::DOORBELL_QUEUES).find(|s| self.pds.values().all(|p| p.slot != *s))
    }

    /// The domain holding doorbell slot `slot`, and its bitmap's address.
    pub fn doorbell_of_slot(&self, slot: u32) -> Option<(u32, u64)> {
        self.pds
            .iter()
            .find(|(_, p)| p.slot == slot)
            .map(|(&id, p)| (id, p.doorbell_gpa))
    }
}

/// A protection domain: its doorbell slot and bitmap (spec §5.8).
#[derive(Debug, Clone, Copy)]
pub struct Pd {
    /// Its doorbell queue is `FIRST_DOORBELL_QUEUE + slot`.
    pub slot: u32,
    /// Guest address of its doorbell bitmap (checked at CREATE_PD).
    pub doorbell_gpa: u64,
}

/// Queue `q`'s bit in [`Node::broken_queues`]; 0 for queues past 31,
/// which (being doorbell queues the device never walks) cannot break.
pub fn queue_bit(q: u32) -> u32 {
    1u32.checked_shl(q).unwrap_or(0)
}

/// Objects of one node (see [`Node::object_counts`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Protection domains.
    pub pds: usize,
    /// Endpoints.
    pub endpoints: usize,
    /// Bound port numbers.
    pub ports: usize,
    /// Exported apertures.
    pub apertures: usize,
    /// Tripwires set.
    pub tripwires: usize,
    /// Filter entries over all endpoints.
    pub filters: usize,
}

impl Node {
    /// The aperture a cookie names on this node, if the cookie is right.
    pub fn aperture_for(&self, c: &Cookie) -> Option<Aperture> {
        let a = *self.apertures.get(c.aperture)?;
        (a.generation == c.generation && a.key == c.key).then_some(a)
    }

    /// The PIO window a grant names on this node, if the grant is right
    /// and node `from` may use it (spec §6.2).
    pub fn window_for(&self, c: &Cookie, from: u32) -> Option<WindowRef> {
        let w = *self.windows.get(&c.aperture)?;
        let allowed = w.importer == ulnic_abi::ANY || w.importer == from;
        (c.generation == 0 && w.key == c.key && allowed).then_some(w)
    }
}
