//! The vhost-user backend of one node: virtio identity, config space, the
//! control queue, and kicks that wake the data-path engine.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, RwLock};

use log::{debug, error, warn};
use ulnic_abi::{
    CMD_HEADER_SIZE, CONFIG_MAGIC, CONFIG_SIZE, CONTROL_QUEUE, FIRST_DOORBELL_QUEUE, F_IMPLEMENTED,
    INLINE_MAX, MAX_CMD_PAYLOAD, MAX_MESSAGE, MAX_RING_ENTRIES, NOTIFY_QUEUE, RESP_HEADER_SIZE,
    SPEC_VERSION_MAJOR, SPEC_VERSION_MINOR,
};
use vhost::vhost_user::message::{
    VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserVirtioFeatures,
};
use vhost::vhost_user::Backend;
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::QueueT;
use vm_memory::{
    GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use ulnic_abi::wire::ConfigSpace;

use crate::chain::{pop_checked, RingFault};
use crate::memory::guest::NodeMemory;
use crate::memory::region;
use crate::nic::node::{queue_bit, NodeVring};
use crate::pio::{self, Pio};
use crate::shard::Shard;
use crate::vhost::control;

/// Descriptors per virtqueue the device accepts.
pub const MAX_QUEUE_SIZE: usize = 256;

/// The mask naming the first `n` queues (at most 64).
fn all_queues(n: usize) -> u64 {
    match n {
        0 => 0,
        n if n >= 64 => u64::MAX,
        n => (1u64 << n) - 1,
    }
}

/// One node's backend; the state it acts on lives in the shared shard.
pub struct NodeBackend {
    node: u32,
    shard: Arc<Shard>,
    /// The frontend's memory as validated by `update_memory`. The
    /// vhost-user handler installs a new table in its own copy before it
    /// tells the backend, so the device never reads through that copy.
    mem: RwLock<Option<NodeMemory>>,
    num_queues: usize,
    /// Exit eventfds (consumer ends) handed to the vhost-user worker threads.
    /// vhost-user-backend 0.24 turns each into a raw fd for its epoll and
    /// never closes it (VringEpollHandler::new): one eventfd per connection
    /// would leak until the device ran out of descriptors (found by the
    /// vhost_user fuzz target after ~20,000 connections). The node closes
    /// them once the connection's daemon is gone: `close_exit_fds`.
    exit_fds: Mutex<Vec<RawFd>>,
    /// Every node's PIO windows (spec §6.2).
    pio: Arc<Pio>,
}

impl NodeBackend {
    /// A backend for node `node`.
    pub fn new(node: u32, shard: Arc<Shard>, pio: Arc<Pio>) -> Self {
        let num_queues = ulnic_abi::QUEUE_COUNT as usize;
        NodeBackend {
            node,
            shard,
            mem: RwLock::new(None),
            num_queues,
            exit_fds: Mutex::new(Vec::new()),
            pio,
        }
    }

    /// Revokes and releases what the node's destroyed endpoints held in
    /// PIO windows, on a thread of its own: neither the thread answering
    /// the frontend's messages nor its control queue's may wait for
    /// another frontend's reply to a map or unmap (the vhost crates give
    /// such replies no timeout), nor for a command that waits for one.
    fn sweep_pio_later(&self) {
        let (pio, node) = (self.pio.clone(), self.node);
        let spawned = std::thread::Builder::new()
            .name(format!("ulnic-pio{node}"))
            .spawn(move || pio.sweep(node));
        if let Err(e) = spawned {
            warn!("node {node}: cannot start the PIO sweep: {e}");
        }
    }

    /// Closes the exit eventfds handed out for this connection.
    /// Call only after its daemon, and so every worker thread and epoll
    /// that used them, is gone.
    pub fn close_exit_fds(&self) {
        let fds = std::mem::take(&mut *self.exit_fds.lock().unwrap_or_else(|p| p.into_inner()));
        for fd in fds {
            // SAFETY: `fd` is a consumer this backend created and gave away
            // in `exit_event`; vhost-user-backend 0.24 keeps it only as a
            // raw number in an epoll that no longer exists, so nothing else
            // owns or will close it.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }

    /// The config space (spec §2.2).
    pub fn config_space(&self) -> [u8; CONFIG_SIZE] {
        let (tripwires, broken, epoch) = {
            let f = self.shard.lock();
            let n = &f.nodes[self.node as usize];
            (f.max_tripwires, n.broken_queues, n.epoch)
        };
        zerocopy::transmute!(ConfigSpace {
            magic: CONFIG_MAGIC.into(),
            version_major: SPEC_VERSION_MAJOR.into(),
            version_minor: SPEC_VERSION_MINOR.into(),
            node: self.node.into(),
            endpoints: self.shard.max_endpoints.into(),
            inline_max: INLINE_MAX.into(),
            max_message: MAX_MESSAGE.into(),
            first_doorbell_queue: u32::from(FIRST_DOORBELL_QUEUE).into(),
            max_ring_entries: MAX_RING_ENTRIES.into(),
            nodes: self.shard.nodes.into(),
            tripwires: tripwires.into(),
            features: F_IMPLEMENTED.into(),
            apertures: ulnic_abi::MAX_APERTURES.into(),
            broken_queues: broken.into(),
            epoch: epoch.into(),
            reserved: 0.into(),
        })
    }

    fn process_control(&self, vring: &NodeVring) -> io::Result<()> {
        let Some(atomic) = self
            .mem
            .read()
            .map_err(|_| io::Error::other("poisoned"))?
            .clone()
        else {
            return Ok(());
        };
        let mem = atomic.memory();
        {
            let mut f = self.shard.lock();
            let node = &mut f.nodes[self.node as usize];
            node.control = Some(vring.clone());
            if node.queue_broken(CONTROL_QUEUE) || node.control_stalled || !node.features_set {
                return Ok(());
            }
            if std::mem::take(&mut node.forgotten) {
                tell_reset(node, vring, &mem);
            }
        }
        // A kick: the frontend's vhost device runs (spec §6.2).
        self.pio.started(self.node);
        let mut any = false;
        loop {
            let mut state = vring.get_mut();
            let queue = state.get_queue_mut();
            let (head, used) = match pop_checked(queue, &mem) {
                Ok(None) => break,
                Ok(Some(chain)) => {
                    let head = chain.head_index();
                    (head, self.serve_command(&mem, chain))
                }
                Err(RingFault::Indirect { head }) => {
                    warn!(
                        "node {}: control chain {head} uses indirect descriptors (not offered); completed unexecuted",
                        self.node
                    );
                    (head, 0)
                }
                Err(fault) => {
                    drop(state);
                    self.shard.lock().nodes[self.node as usize].break_queue(CONTROL_QUEUE, fault);
                    break;
                }
            };
            any = true;
            // Completed through the validated memory, never the handler's copy.
            if queue.add_used(&*mem, head, used).is_err() {
                warn!(
                    "node {}: cannot complete control descriptor {head}",
                    self.node
                );
            }
        }
        if any {
            let signalled = crate::vring::signal_call(&vring.get_ref());
            match signalled {
                Ok(()) => {}
                Err(crate::notifier::SignalError::Full) => self.shard.lock().nodes
                    [self.node as usize]
                    .break_queue(CONTROL_QUEUE, RingFault::CallFull),
                Err(crate::notifier::SignalError::Io(e)) => {
                    self.end_connection(&format!(
                        "its control queue's call cannot be signalled: {e}"
                    ));
                    return Ok(());
                }
            }
        }
        self.shard.disconnect_faulted();
        Ok(())
    }

    /// Frees the node's state before the device itself ends the
    /// connection or refuses a message that ends it (spec §8): nothing
    /// more is delivered into the frontend's memory or read from it, and
    /// the epoch changes. The connection's own end frees it again (a
    /// command already being served may have created something since).
    fn detach(&self, why: &str) {
        warn!(
            "node {}: {why}; freeing its state and ending the connection",
            self.node
        );
        if let Ok(mut m) = self.mem.write() {
            *m = None;
        }
        let mut f = self.shard.lock();
        // Close messages are read from the memory before it goes.
        f.reset_node(self.node);
        let n = &mut f.nodes[self.node as usize];
        n.mem = None;
        n.renew_epoch();
    }

    /// Frees the node's state, then closes the connection (a kick that
    /// cannot be read, a call that cannot be signalled): counted in the
    /// node's queue errors.
    fn end_connection(&self, why: &str) {
        self.detach(why);
        let mut f = self.shard.lock();
        let n = &mut f.nodes[self.node as usize];
        n.queue_errors += 1;
        if let Some(d) = n.disconnect.take() {
            d.shutdown();
        }
    }

    /// Checks the frontend's memory table and, when every region passes,
    /// makes it the one the device reads and writes through.
    fn install_memory(&self, mem: NodeMemory) -> io::Result<()> {
        // Check every region before the device reads through any of it
        // (spec §2.3); a bad one ends this connection and nothing else.
        let table: GuestMemoryMmap<()> = (*mem.memory()).clone();
        let mut ranges = Vec::new();
        for region in table.iter() {
            let refuse = |why: String| {
                error!(
                    "node {}: refused memory region at {:#x} ({} bytes): {why}",
                    self.node,
                    region.start_addr().0,
                    region.len()
                );
                io::Error::other(why)
            };
            let file = region
                .file_offset()
                .ok_or_else(|| refuse("not backed by a file descriptor".into()))?;
            let protection = region::check_region(file.file(), file.start(), region.len())
                .map_err(|e| refuse(e.to_string()))?;
            let host = region
                .get_host_address(MemoryRegionAddress(0))
                .map_err(|e| refuse(e.to_string()))?;
            debug!(
                "node {}: memory region at {:#x}, {} bytes, {protection:?}",
                self.node,
                region.start_addr().0,
                region.len()
            );
            ranges.push((host as usize, region.len() as usize));
        }
        region::watch(self.shard.watch_base + self.node, &ranges).map_err(io::Error::other)?;
        let validated = GuestMemoryAtomic::new(table);
        *self.mem.write().map_err(|_| io::Error::other("poisoned"))? = Some(validated.clone());
        self.shard.lock().nodes[self.node as usize].mem = Some(validated);
        Ok(())
    }

    /// Reads one request, executes it, writes the response; returns the
    /// bytes written (0 when the chain cannot hold a response header).
    fn serve_command(
        &self,
        mem: &GuestMemoryMmap<()>,
        chain: virtio_queue::DescriptorChain<&GuestMemoryMmap<()>>,
    ) -> u32 {
        let (Ok(mut reader), Ok(mut writer)) = (chain.clone().reader(mem), chain.writer(mem))
        else {
            warn!("node {}: malformed control descriptor chain", self.node);
            return 0;
        };
        if writer.available_bytes() < RESP_HEADER_SIZE {
            warn!(
                "node {}: control response buffer shorter than {RESP_HEADER_SIZE} bytes",
                self.node
            );
            return 0;
        }
        let n = reader.available_bytes();
        if n > CMD_HEADER_SIZE + MAX_CMD_PAYLOAD {
            // Longer than any command: refused unread (spec §4).
            let bytes = control::Response::err(ulnic_abi::status::BAD_LENGTH).encode();
            return match writer.write_all(&bytes) {
                Ok(()) => bytes.len() as u32,
                Err(_) => 0,
            };
        }
        let mut req = vec![0u8; n];
        // Checked against the result's length before the command runs.
        let room = writer.available_bytes() - RESP_HEADER_SIZE;
        let resp = match reader.read_exact(&mut req) {
            Ok(()) => self.run_command(mem, &req, room),
            Err(_) => control::Response::err(ulnic_abi::status::BAD_LENGTH),
        };
        self.shard.wake();
        let mut bytes = resp.encode();
        if bytes.len() > writer.available_bytes() {
            // Cannot happen for a known command (checked above); kept so a
            // response never overruns the driver's buffer.
            bytes = control::Response::err(ulnic_abi::status::BAD_LENGTH).encode();
        }
        match writer.write_all(&bytes) {
            Ok(()) => bytes.len() as u32,
            Err(_) => 0,
        }
    }

    /// Runs one command: PIO commands outside the shard's lock (they wait
    /// for frontends' replies), the rest under it.
    fn run_command(&self, mem: &GuestMemoryMmap<()>, req: &[u8], room: usize) -> control::Response {
        let mut fabric = self.shard.lock();
        match control::pio_request(&fabric, self.node, req, room) {
            Some(Ok((opcode, payload))) => {
                drop(fabric);
                match self.pio.execute(self.node, opcode, payload) {
                    Ok(payload) => control::Response {
                        status: ulnic_abi::status::OK,
                        payload,
                    },
                    Err(pio::Fail(s)) => control::Response::err(s),
                }
            }
            Some(Err(refused)) => refused,
            None => {
                let r = control::execute(&mut fabric, self.node, mem, req, room);
                drop(fabric);
                // A request shorter than its header was refused above.
                let opcode = req.first_chunk::<4>().map(|b| u32::from_le_bytes(*b));
                let destroys = matches!(
                    opcode,
                    Some(ulnic_abi::cmd::DESTROY_ENDPOINT | ulnic_abi::cmd::DESTROY_PD)
                );
                // What the endpoints held in PIO windows goes too. No thread
                // per destroyed endpoint when the node holds nothing (a
                // socket server destroys one per connection); its PIO
                // commands come through this same queue, so none is
                // half done now.
                if destroys && r.status == ulnic_abi::status::OK && self.pio.holds_any(self.node) {
                    self.sweep_pio_later();
                }
                r
            }
        }
    }

    /// A kicked queue: the control queue's commands, the notification
    /// queue's room, a domain's doorbell.
    fn handle_kick(&self, queue: u16, ready: EventSet, vrings: &[NodeVring]) -> io::Result<()> {
        if ready != EventSet::IN {
            return Err(io::Error::other(format!("unexpected readiness {ready:?}")));
        }
        if vrings
            .get(usize::from(queue))
            .is_some_and(NodeVring::kick_failed)
        {
            self.end_connection(&format!("queue {queue}'s kick cannot be read"));
            return Ok(());
        }
        match queue {
            CONTROL_QUEUE => {
                if let Some(v) = vrings.get(usize::from(NOTIFY_QUEUE)) {
                    self.shard.lock().nodes[self.node as usize].notify = Some(v.clone());
                }
                let vring = vrings
                    .get(usize::from(CONTROL_QUEUE))
                    .ok_or_else(|| io::Error::other("no control queue"))?;
                self.process_control(vring)
            }
            NOTIFY_QUEUE => {
                if let Some(v) = vrings.get(usize::from(NOTIFY_QUEUE)) {
                    self.shard.lock().nodes[self.node as usize].notify = Some(v.clone());
                }
                self.shard.wake();
                Ok(())
            }
            q => {
                // A domain's doorbell: its bitmap is read on the engine's
                // next pass, or now if the engine sleeps (spec §5.8),
                // counting a doorbell for each endpoint named there.
                self.shard.kicked(self.node, q);
                Ok(())
            }
        }
    }
}

/// The control queue of `node`, which forgot its objects at a stop, is
/// served again: if it did not start afresh (its next index is not 0) the
/// driver kept running and is told with the RESET record, and commands
/// wait for its `ACK_RESET` (spec §2.5).
fn tell_reset(node: &mut crate::nic::node::Node, control: &NodeVring, mem: &GuestMemoryMmap<()>) {
    use virtio_queue::QueueT;
    if control.get_ref().get_queue().next_avail() == 0 {
        return;
    }
    debug!(
        "node {}: its driver went on after a ring stop; telling it the node was reset",
        node.id
    );
    node.reset_unacked = true;
    node.resets_told = node.resets_told.wrapping_add(1).max(1);
    // A command completed as the queue stopped may have lost its
    // interrupt (the call eventfd was let go at the stop).
    let _ = crate::vring::signal_call(&control.get_ref());
    let reset = ulnic_abi::notify_reason::RESET_ENDPOINT;
    if !node.push_notification(mem, reset) {
        node.notify_backlog.push_front(reset);
    }
}

impl VhostUserBackend for NodeBackend {
    type Bitmap = ();
    type Vring = NodeVring;

    fn num_queues(&self) -> usize {
        self.num_queues
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    /// One worker thread serves every queue. The crate's default mask
    /// (0xffff_ffff) covers queues 0..=31 only: the kicks of doorbell
    /// slots 30 and up would never be watched, and never fail either.
    fn queues_per_thread(&self) -> Vec<u64> {
        vec![all_queues(self.num_queues)]
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | F_IMPLEMENTED
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // Never CONFIGURE_MEM_SLOTS: QEMU 11.1.3 crashes restarting a
        // device reset with shared-memory mappings live (spec §2).
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::BACKEND_SEND_FD
            | VhostUserProtocolFeatures::SHMEM
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        self.pio.connected(self.node, backend);
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        // One region, shmid 0, the PIO aperture (spec §2, §6.2).
        Ok(match self.pio.aperture() {
            0 => VhostUserShMemConfig::new(0, &[]),
            a => VhostUserShMemConfig::new(1, &[a]),
        })
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn acked_features(&self, features: u64) {
        // Only what the driver accepted is acted on (spec §2). Commands
        // that came before (queues started early) are served now.
        let mut f = self.shard.lock();
        let n = &mut f.nodes[self.node as usize];
        n.features = features;
        if !n.features_set {
            n.features_set = true;
            n.kick_control();
        }
    }

    fn reset_device(&self) {
        debug!("node {}: device reset", self.node);
        self.pio.stopped(self.node);
        let mut f = self.shard.lock();
        f.reset_node(self.node);
        let n = &mut f.nodes[self.node as usize];
        n.features = 0;
        n.features_set = false;
        n.renew_epoch();
        drop(f);
        self.sweep_pio_later();
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // The driver stops the control queue when it resets the device or
        // the VM reboots: everything it created is gone with it.
        let mut f = self.shard.lock();
        if queue_index == u32::from(CONTROL_QUEUE) {
            // Stopped: QEMU must not be sent a map or unmap now.
            self.pio.stopped(self.node);
            let running = f.nodes[self.node as usize].features_set;
            f.reset_node(self.node);
            let n = &mut f.nodes[self.node as usize];
            n.renew_epoch();
            // A paused VM's driver goes on after the restart and must be
            // told (spec §2.5); a reset guest's new driver starts at 0.
            n.forgotten = running;
        }
        // A stopped queue starts again clean.
        f.nodes[self.node as usize].broken_queues &= !queue_bit(queue_index);
        drop(f);
        if queue_index == u32::from(CONTROL_QUEUE) {
            self.sweep_pio_later();
        }
        Ok(())
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let c = self.config_space();
        let (o, s) = (offset as usize, size as usize);
        match o.checked_add(s) {
            Some(end) if end <= c.len() => c[o..end].to_vec(),
            _ => Vec::new(),
        }
    }

    fn update_memory(&self, mem: NodeMemory) -> io::Result<()> {
        // A refused table ends the connection (the crate replies and
        // closes); the node's state is freed before that (spec §2.3).
        let r = self.install_memory(mem);
        if r.is_err() {
            self.detach("its memory table was refused");
        }
        r
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()?;
        self.exit_fds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        queue: u16,
        ready: EventSet,
        vrings: &[Self::Vring],
        _thread: usize,
    ) -> io::Result<()> {
        let served = self.handle_kick(queue, ready, vrings);
        crate::vring::kick_served();
        served
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Configuration;
    use ulnic_abi::wire::{CmdHeader, RespHeader};
    use ulnic_abi::{cmd, status, DeviceInfo};
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic};
    use zerocopy::IntoBytes;

    const REQUEST: u64 = 0x8000;
    const RESPONSE: u64 = 0x9000;
    const QUEUE_SIZE: u16 = 16;

    /// A one-node backend whose frontend shared `mem` and accepted every
    /// feature (what the vhost-user handshake would have done).
    fn backend(mem: &GuestMemoryMmap<()>) -> NodeBackend {
        let config = Configuration::builder(vec!["unused.sock".into()])
            .build()
            .unwrap();
        let shard = Arc::new(Shard::new(&config).unwrap());
        let pio = Arc::new(Pio::new(vec![Some(shard.clone())], 0));
        let b = NodeBackend::new(0, shard, pio);
        *b.mem.write().unwrap() = Some(GuestMemoryAtomic::new(mem.clone()));
        let mut f = b.shard.lock();
        f.nodes[0].features = F_IMPLEMENTED;
        f.nodes[0].features_set = true;
        drop(f);
        b
    }

    /// The control queue as the vhost-user handler would hand it over,
    /// built on `mock`'s rings.
    fn vrings(
        mem: &GuestMemoryMmap<()>,
        mock: &MockSplitQueue<GuestMemoryMmap<()>>,
    ) -> Vec<NodeVring> {
        let control =
            NodeVring::new(GuestMemoryAtomic::new(mem.clone()), MAX_QUEUE_SIZE as u16).unwrap();
        control.set_queue_size(QUEUE_SIZE);
        control
            .set_queue_info(
                mock.desc_table_addr().0,
                mock.avail_addr().0,
                mock.used_addr().0,
            )
            .unwrap();
        control.set_queue_ready(true);
        vec![control]
    }

    fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
    }

    /// Posts `opcode` with `payload` on the control queue, kicks it, and
    /// returns the used length and the response (header, result).
    fn command(opcode: u32, reserved: u32, payload: &[u8]) -> (u32, RespHeader, Vec<u8>) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let b = backend(&mem);
        let mock = MockSplitQueue::new(&mem, QUEUE_SIZE);
        let header = CmdHeader {
            opcode: opcode.into(),
            reserved: reserved.into(),
        };
        let mut req = header.as_bytes().to_vec();
        req.extend_from_slice(payload);
        mem.write_slice(&req, GuestAddress(REQUEST)).unwrap();
        mock.add_desc_chains(
            &[
                desc(REQUEST, req.len() as u32, VRING_DESC_F_NEXT, 1),
                desc(RESPONSE, 128, VRING_DESC_F_WRITE, 0),
            ],
            0,
        )
        .unwrap();
        let rings = vrings(&mem, &mock);
        b.handle_event(CONTROL_QUEUE, EventSet::IN, &rings, 0)
            .unwrap();
        let used = mock.used();
        assert_eq!(used.idx().load(), 1, "one chain completed");
        let len = used.ring().ref_at(0).unwrap().load().len();
        let mut out = vec![0u8; 128];
        mem.read_slice(&mut out, GuestAddress(RESPONSE)).unwrap();
        let resp: RespHeader = ulnic_abi::wire::read(&out);
        (len, resp, out[size_of::<RespHeader>()..].to_vec())
    }

    #[test]
    fn one_thread_watches_every_queue() {
        assert_eq!(all_queues(64), u64::MAX);
        assert_eq!(all_queues(2), 0b11);
        assert_eq!(all_queues(0), 0);
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let b = backend(&mem);
        let masks = b.queues_per_thread();
        assert_eq!(masks.len(), 1);
        assert_eq!(masks[0].count_ones(), ulnic_abi::QUEUE_COUNT);
    }

    #[test]
    fn get_info_is_answered_through_the_control_queue() {
        let (len, resp, result) = command(cmd::GET_INFO, 0, &[]);
        assert_eq!(resp.status.get(), status::OK);
        assert_eq!(len as usize, size_of::<RespHeader>() + DeviceInfo::SIZE);
        let info = DeviceInfo::decode(&result);
        assert_eq!(
            (info.node, info.max_endpoints, info.nodes),
            (0, crate::config::DEFAULT_ENDPOINTS, 1)
        );
        assert_eq!(info.features, F_IMPLEMENTED);
    }

    #[test]
    fn refused_commands_are_answered_with_their_status() {
        let (len, resp, _) = command(0x7777, 0, &[]);
        assert_eq!(resp.status.get(), status::UNKNOWN_COMMAND);
        assert_eq!(len as usize, size_of::<RespHeader>());
        let (_, resp, _) = command(cmd::GET_INFO, 1, &[]);
        assert_eq!(resp.status.get(), status::INVALID_ARGUMENT);
        let (_, resp, _) = command(cmd::CREATE_PD, 0, &[0; 4]);
        assert_eq!(resp.status.get(), status::BAD_LENGTH);
    }

    #[test]
    fn an_impossible_avail_index_breaks_only_the_control_queue() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let b = backend(&mem);
        let mock = MockSplitQueue::new(&mem, QUEUE_SIZE);
        mock.avail().idx().store(u16::to_le(100));
        let rings = vrings(&mem, &mock);
        b.handle_event(CONTROL_QUEUE, EventSet::IN, &rings, 0)
            .unwrap();
        assert_eq!(mock.used().idx().load(), 0, "nothing consumed");
        let config: ulnic_abi::wire::ConfigSpace = ulnic_abi::wire::read(&b.config_space());
        assert_eq!(
            config.broken_queues.get(),
            1 << CONTROL_QUEUE,
            "config space reports the broken queue"
        );
        assert_eq!(b.shard.lock().nodes[0].queue_errors, 1);
    }
}
