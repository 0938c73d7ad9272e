//! A shard's data path: every node of one device process, and the engine
//! pass that serves their send rings and moves messages between their
//! endpoints.
//!
//! One engine thread runs `Nodes::poll`; control commands run on the node
//! threads. Both hold the shard lock, so the data path sees a consistent
//! endpoint table and never races a destroy.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use log::{debug, warn};
use ulnic_abi::{
    ctrl, event, op, recv_flags, send_flags, tx_error, EventRecord, SendDesc, F_CLOSE_MESSAGE,
    F_MESSAGING, F_OOB, F_PIO, F_RDMA, F_UTLB, INLINE_MAX, INLINE_OFFSET, SEND_DESC_SIZE,
};
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use crate::fabric::network::Network;
use crate::fabric::transport::{self, ChannelKey};
use crate::memory::guest::{self, MemGuard};
use crate::nic::endpoint::Endpoint;
use crate::nic::node::Node;
use crate::nic::receive::Message;
use crate::nic::utlb::Utlb;
use crate::shard::counters::Counters;
use crate::shard::pass::{Initiator, Pass};
use crate::shard::rdma;
use crate::shard::remote::RemoteOps;
use crate::shard::send::{self, Sent};
use crate::shard::sink::{NicSink, PendingReturn};

/// Send descriptors served per endpoint per pass, for fairness.
const SEND_BATCH: u32 = 32;

/// Close messages waiting for room at their receiver, shard-wide; beyond
/// this the oldest is discarded (and counted), so a receiver that never
/// drains cannot make the device grow without bound.
const MAX_PENDING_CLOSES: usize = 4096;

/// A close message taken from a destroyed endpoint, waiting until its
/// receiver has a free receive slot.
#[derive(Debug, Clone)]
struct PendingClose {
    src_node: u32,
    src_port: u32,
    session: u32,
    dest_node: u32,
    dest_port: u32,
    tag: u32,
    len: u32,
    bytes: [u8; INLINE_MAX as usize],
}

/// Every node of one device process, and what they share: the UTLB,
/// close messages in flight, totals.
pub struct Nodes {
    /// Nodes by address.
    pub nodes: Vec<Node>,
    /// Totals.
    pub counters: Counters,
    /// Scratch for `poll`'s memory snapshot (kept to avoid an allocation
    /// per pass).
    mems: Vec<Option<MemGuard>>,
    /// Close messages whose receiver had no free receive slot yet.
    pending_closes: VecDeque<PendingClose>,
    /// Tripwires each endpoint may set.
    pub max_tripwires: u32,
    /// Every protection domain's UTLB table, and the device's translation
    /// cache in front of them.
    pub utlb: Utlb,
    /// The emulated fabric, when the device has one (spec §10); without
    /// it a message goes straight from sender to receiver.
    pub network: Option<Network>,
    pending_returns: VecDeque<PendingReturn>,
    /// Remote accesses of this shard's endpoints in the fabric.
    pub remote: RemoteOps,
    /// A resident endpoint with no send descriptor for this long leaves
    /// the polled set (spec §5.8; the device's `--poll-us`).
    pub resident_idle: Duration,
}

impl Nodes {
    /// `nodes` nodes with `max_endpoints` endpoint slots each.
    pub fn new(nodes: u32, max_endpoints: u32) -> Self {
        Nodes {
            nodes: (0..nodes).map(|i| Node::new(i, max_endpoints)).collect(),
            counters: Counters::default(),
            mems: Vec::new(),
            pending_closes: VecDeque::new(),
            max_tripwires: ulnic_abi::DEFAULT_TRIPWIRES,
            utlb: Utlb::default(),
            network: None,
            pending_returns: VecDeque::new(),
            remote: RemoteOps::default(),
            resident_idle: crate::config::DEFAULT_POLL_FOR,
        }
    }

    /// Destroys endpoint `id` of node `n` and sends its close message, if
    /// it left one (spec §5.11). False when there is no such endpoint.
    pub fn close_endpoint(&mut self, n: u32, id: u32) -> bool {
        let Some(node) = self.nodes.get_mut(n as usize) else {
            return false;
        };
        let Some(ep) = node.remove_endpoint(id) else {
            return false;
        };
        // What it had in the fabric is carried on, its outcomes to nobody.
        for seg in self.remote.forget(n, id) {
            self.utlb.recycle(seg);
        }
        self.pending_returns.retain(|r| !r.from(n, id));
        let Some(mem) = node.mem.as_ref().map(|m| m.memory()) else {
            return true; // no memory to read a close message from
        };
        let mut raw = [0u8; SEND_DESC_SIZE as usize];
        if guest::read(&mem, ep.ctrl + ctrl::CLOSE_MESSAGE, &mut raw).is_err() {
            return true;
        }
        let d = SendDesc::decode(&raw);
        if d.opcode == 0 || node.features & F_CLOSE_MESSAGE == 0 {
            return true; // none registered, or the feature was not accepted
        }
        let w: &ulnic_abi::wire::SendDesc = zerocopy::transmute_ref!(&raw);
        let well_formed = d.opcode == op::SEND
            && d.flags == send_flags::INLINE
            && w.reserved.get() == 0
            && d.len <= INLINE_MAX;
        let (Some(src_port), true) = (ep.port, well_formed) else {
            self.counters.closes_undeliverable += 1;
            debug!("node {n} ep {id}: close message malformed or endpoint unbound; not sent");
            return true;
        };
        let mut bytes = [0u8; INLINE_MAX as usize];
        let len = d.len as usize;
        bytes[..len].copy_from_slice(&raw[INLINE_OFFSET..INLINE_OFFSET + len]);
        if let Some(net) = self.network.as_mut().filter(|_| d.dest_node != n) {
            // After everything it sent that receiver, on the same channel,
            // and never given up for want of room (spec §5.11).
            let key = ChannelKey::new(n, id, d.dest_node, d.dest_port, op::SEND);
            let msg = transport::Message {
                opcode: op::SEND,
                flags: recv_flags::CLOSE,
                session: ep.session,
                src_port,
                tag: d.tag,
                bytes: bytes[..len].to_vec(),
                patient: true,
                ..Default::default()
            };
            net.submit(key, msg);
            return true;
        }
        if self.pending_closes.len() >= MAX_PENDING_CLOSES {
            self.pending_closes.pop_front();
            self.counters.closes_undeliverable += 1;
            warn!("too many close messages waiting for receive slots; discarded the oldest");
        }
        self.pending_closes.push_back(PendingClose {
            src_node: n,
            src_port,
            session: ep.session,
            dest_node: d.dest_node,
            dest_port: d.dest_port,
            tag: d.tag,
            len: d.len,
            bytes,
        });
        self.flush_closes();
        true
    }

    /// Destroys every endpoint of node `n` (each sends its close message)
    /// and frees the rest of its state: the frontend disconnected or reset.
    pub fn reset_node(&mut self, n: u32) {
        let Some(node) = self.nodes.get(n as usize) else {
            return;
        };
        let live: Vec<u32> = (0..node.endpoints.len() as u32)
            .filter(|&i| node.endpoints[i as usize].is_some())
            .collect();
        for id in live {
            self.close_endpoint(n, id);
        }
        self.nodes[n as usize].reset();
        self.utlb.tables.remove_node(n);
        self.utlb.cache.invalidate_node(n);
    }

    /// Tries to deliver every waiting close message once; one whose
    /// receiver still has no receive slot stays queued, in order.
    fn flush_closes(&mut self) {
        if self.pending_closes.is_empty() {
            return;
        }
        let mems: Vec<Option<MemGuard>> = self.memories().collect();
        let mut wake = Vec::new();
        let mut keep = VecDeque::new();
        while let Some(c) = self.pending_closes.pop_front() {
            let msg = Message::bytes((c.src_node, c.src_port), c.tag, &c.bytes[..c.len as usize])
                .flagged(recv_flags::CLOSE)
                .in_session(c.session);
            let mut pass = Pass {
                nodes: &mut self.nodes,
                utlb: &mut self.utlb,
                mems: &mems,
                wake: &mut wake,
            };
            match pass.deliver(c.dest_node, c.dest_port, &msg) {
                Ok(()) => self.counters.closes_delivered += 1,
                Err(tx_error::NO_BUFFER) => keep.push_back(c),
                Err(code) => {
                    self.counters.closes_undeliverable += 1;
                    debug!(
                        "close message to {}:{}: {}",
                        c.dest_node,
                        c.dest_port,
                        tx_error::name(code)
                    );
                }
            }
        }
        self.pending_closes = keep;
        for (n, e) in wake {
            self.notify(n, e, &mems);
        }
    }

    /// One pass of the data path over every endpoint; returns the number of
    /// descriptors handled (0 means idle).
    pub fn poll(&mut self) -> usize {
        // The snapshot vector is reused: this runs in the engine's spin loop.
        let mut mems = std::mem::take(&mut self.mems);
        mems.extend(self.memories());
        let mut work = 0;
        let mut wake: Vec<(u32, u32)> = Vec::new();
        let now = Instant::now();
        for n in 0..self.nodes.len() {
            let Some(smem) = mems[n].as_deref() else {
                continue;
            };
            if self.nodes[n].doorbells_waiting() {
                self.nodes[n].take_doorbells(smem, now);
            }
            // Only resident endpoints are polled (spec §5.8).
            let mut i = 0;
            while i < self.nodes[n].resident.len() {
                let e = self.nodes[n].resident[i].0 as usize;
                // Look first; move the endpoint out of its slot (to borrow the
                // shard for delivery) only when it has sends waiting.
                let Some(ep) = self.nodes[n].endpoints.get_mut(e).and_then(Option::as_mut) else {
                    self.nodes[n].resident.swap_remove(i);
                    continue;
                };
                let before = ep.posted_mark();
                let pending = ep.send_pending(smem).min(SEND_BATCH);
                let taken = if pending > 0 {
                    self.nodes[n].endpoints[e].take()
                } else {
                    None
                };
                if pending > 0 {
                    self.nodes[n].resident[i].1 = now;
                } else if self.nodes[n].leave_if_idle(smem, i, now, self.resident_idle) {
                    continue; // the next one took its place in `resident`
                }
                if let Some(mut owned) = taken {
                    for _ in 0..pending {
                        if !owned.event_room_for_send(smem) {
                            break; // back-pressure: the owner must drain its events first
                        }
                        if !self.serve_send(&mems, &mut wake, (n as u32, e as u32), &mut owned) {
                            break; // back-pressure from the fabric
                        }
                        work += 1;
                    }
                    self.nodes[n].endpoints[e] = Some(owned);
                }
                i += 1;
                // Completions, errors and conditions all wake an armed owner.
                let Some(ep) = self.nodes[n].endpoints[e].as_mut() else {
                    continue;
                };
                if ep.posted_mark() != before && ep.take_arm(smem) {
                    wake.push((n as u32, e as u32));
                }
            }
            if !self.nodes[n].notify_backlog.is_empty() {
                self.flush_backlog(n, smem);
            }
        }
        // Cheap when the fabric has nothing to move (every pass of an
        // engine whose messages all took the shortcut).
        let idle = self.network.as_ref().is_none_or(Network::idle_everywhere);
        if !idle || !self.pending_returns.is_empty() {
            work += self.advance_fabric(&mems, &mut wake);
        }
        for (n, e) in wake {
            self.notify(n, e, &mems);
        }
        if !self.pending_closes.is_empty() {
            self.flush_closes();
        }
        // Drop the guards (old memory maps are released) but keep capacity.
        mems.clear();
        self.mems = mems;
        work
    }

    /// Each node's memory now (`None`: no frontend), by node.
    fn memories(&self) -> impl Iterator<Item = Option<MemGuard>> + '_ {
        self.nodes
            .iter()
            .map(|n| n.mem.as_ref().map(|m| m.memory()))
    }

    /// How many endpoints are resident on all nodes (those the engine
    /// polls).
    pub fn resident_total(&self) -> usize {
        self.nodes.iter().map(|n| n.resident.len()).sum()
    }

    /// Before the engine sleeps: every resident endpoint of every node
    /// asks for doorbells (spec §5.8). Returns how many had descriptors
    /// waiting and stay resident (see `Node::leave_all`).
    pub fn leave_all(&mut self) -> usize {
        let now = Instant::now();
        let mut stayed = 0;
        for node in &mut self.nodes {
            let Some(mem) = node.mem.as_ref().map(|m| m.memory()) else {
                continue;
            };
            stayed += node.leave_all(&mem, now);
        }
        stayed
    }

    /// Reads one send descriptor of `ep` (endpoint `e` of node `n`, taken
    /// out of its slot by the caller), matches its opcode once, has the
    /// operation carry it out, and retires it with its event. False when
    /// the fabric pushed back and the descriptor stays in the ring.
    fn serve_send(
        &mut self,
        mems: &[Option<MemGuard>],
        wake: &mut Vec<(u32, u32)>,
        (n, e): (u32, u32),
        ep: &mut Endpoint,
    ) -> bool {
        let smem: &GuestMemoryMmap<()> = mems[n as usize].as_deref().expect("caller checked");
        let mut raw = [0u8; SEND_DESC_SIZE as usize];
        let desc = match guest::read(smem, ep.send_slot(), &mut raw) {
            Ok(()) => SendDesc::decode(&raw),
            Err(_) => SendDesc::default(), // unreadable slot: reported as a bad descriptor below
        };
        let allowed = descriptor_allowed(&desc, &raw, self.nodes[n as usize].features);
        let mut from = Initiator {
            node: n,
            id: e,
            ep,
            mem: smem,
        };
        let mut pass = Pass {
            nodes: &mut self.nodes,
            utlb: &mut self.utlb,
            mems,
            wake,
        };
        // Each operation checks the rest of its descriptor.
        let outcome = match desc.opcode {
            _ if !allowed => Err(tx_error::BAD_DESCRIPTOR),
            op::SEND | op::OOB => {
                send::serve(&mut pass, self.network.as_mut(), &mut from, &desc, &raw)
            }
            op::RDMA_WRITE | op::RDMA_READ | op::WRITE_IMMEDIATE | op::PIO_SYNC => {
                let net = self.network.as_mut();
                rdma::serve(&mut pass, net, &mut self.remote, &mut from, &raw)
            }
            op::REDIRECT | op::REDIRECT_END => {
                Ok(Sent::Reported(rdma::redirect(&mut pass, &mut from, &raw)))
            }
            _ => Err(tx_error::BAD_DESCRIPTOR),
        };
        self.retire(mems, wake, &mut from, &desc, outcome)
    }

    /// Counts a served descriptor and posts its event, before the send
    /// consumer moves past it: a retired send with no event succeeded
    /// (spec §5.6). False when it stays in the ring (`Sent::Blocked`).
    fn retire(
        &mut self,
        mems: &[Option<MemGuard>],
        wake: &mut Vec<(u32, u32)>,
        from: &mut Initiator<'_>,
        d: &SendDesc,
        outcome: Result<Sent, u16>,
    ) -> bool {
        let (outcome, returned) = match outcome {
            Ok(Sent::Returned(code, key, msg)) => (Err(code), Some((key, msg))),
            other => (other, None),
        };
        let ep = &mut *from.ep;
        let ev = match outcome {
            Ok(Sent::Blocked) => return false,
            Ok(Sent::Returned(..)) => None, // made an error above
            Ok(Sent::Reported(ev)) => (ev.kind != 0).then_some(ev),
            Ok(Sent::InFabric) => {
                // Its event, if any, and its counting come when the
                // transport settles it.
                ep.events_owed += 1;
                None
            }
            Ok(Sent::Done) => {
                ep.stats.tx_messages += 1;
                ep.stats.tx_bytes += u64::from(d.len);
                self.counters.delivered += 1;
                (d.flags & send_flags::COMPLETION != 0).then(|| outcome_event(d, event::TX_DONE, 0))
            }
            Err(code) => {
                ep.stats.tx_errors += 1;
                if code == tx_error::NO_BUFFER {
                    ep.stats.returned_no_buffer += 1;
                }
                if matches!(code, tx_error::BAD_DESCRIPTOR | tx_error::BAD_ADDRESS) {
                    ep.stats.bad_descriptors += 1;
                }
                self.counters.returned += 1;
                debug!(
                    "node {} ep {}: send {} to {}:{} failed: {}",
                    from.node,
                    from.id,
                    d.user_id,
                    d.dest_node,
                    d.dest_port,
                    tx_error::name(code)
                );
                Some(outcome_event(d, event::TX_ERROR, code))
            }
        };
        if let Some(ev) = ev {
            ep.post_event(from.mem, &ev);
        }
        ep.complete_send(from.mem);
        if let Some((key, msg)) = returned {
            // Refused by the shortcut: after its event, as the transport
            // would report its NACK, the message goes back to its sender.
            self.return_to_sender(mems, wake, from, key, msg);
        }
        true
    }

    /// Puts a message the shortcut's receiver refused back with its sender
    /// (the endpoint being served), as the transport returns one.
    fn return_to_sender(
        &mut self,
        mems: &[Option<MemGuard>],
        wake: &mut Vec<(u32, u32)>,
        from: &mut Initiator<'_>,
        key: ChannelKey,
        msg: transport::Message,
    ) {
        self.with_sink(mems, wake, |sink, _| {
            sink.return_to_sender_from(from, key, msg)
        });
    }

    /// Moves the fabric on: packets cross links and switches, messages
    /// reach their receivers, and senders learn the outcome. Returns the
    /// packets moved.
    fn advance_fabric(&mut self, mems: &[Option<MemGuard>], wake: &mut Vec<(u32, u32)>) -> usize {
        self.with_sink(mems, wake, |sink, net| {
            net.map_or(0, |net| net.advance(sink)) + sink.retry_returns()
        })
    }

    /// Runs `f` with the NIC as the fabric's transport sees it, for this
    /// pass, and the network.
    fn with_sink<R>(
        &mut self,
        mems: &[Option<MemGuard>],
        wake: &mut Vec<(u32, u32)>,
        f: impl FnOnce(&mut NicSink<'_, '_>, Option<&mut Network>) -> R,
    ) -> R {
        let mut pass = Pass {
            nodes: &mut self.nodes,
            utlb: &mut self.utlb,
            mems,
            wake,
        };
        let mut sink = NicSink {
            pass: &mut pass,
            counters: &mut self.counters,
            pending: &mut self.pending_returns,
            remote: &mut self.remote,
        };
        f(&mut sink, self.network.as_mut())
    }

    /// How long the engine may sleep before the fabric has something due;
    /// `None` when nothing is in flight.
    pub fn fabric_due(&self) -> Option<std::time::Duration> {
        let net = self.network.as_ref()?;
        if !net.busy() && !net.mapping() && self.pending_returns.is_empty() {
            return None;
        }
        Some(
            net.next_due()
                .unwrap_or(std::time::Duration::from_millis(1)),
        )
    }

    /// The session of endpoint `e` of node `n`, if it exists.
    pub fn session_of(&self, n: u32, e: u32) -> Option<u32> {
        let node = self.nodes.get(n as usize)?;
        Some(node.endpoints.get(e as usize)?.as_ref()?.session)
    }

    /// Posts `ev` to endpoint `e` of node `n` if it still has session
    /// `session` (an event of the control path: PIO_REVOKED), notifying
    /// it if armed. False when it is gone or its event ring is full.
    pub fn post_event_to(&mut self, n: u32, e: u32, session: u32, ev: &EventRecord) -> bool {
        if self.session_of(n, e) != Some(session) {
            return false;
        }
        let mems: Vec<Option<MemGuard>> = self.memories().collect();
        let Some(mem) = mems[n as usize].as_deref() else {
            return false;
        };
        let Some(ep) = self.nodes[n as usize].endpoint_mut(e) else {
            return false;
        };
        let posted = ep.post_event(mem, ev);
        if posted && ep.take_arm(mem) {
            self.notify(n, e, &mems);
        }
        posted
    }

    /// Tells node `n`'s driver that its PIO import or window `id` is no
    /// longer mapped (a PIO_UNMAPPED record, spec §6): a guest's driver
    /// zaps its processes' mappings. False when no buffer was posted (the
    /// record is not kept: the mapping then points at nothing, and a
    /// store through it is lost, not delivered anywhere).
    pub fn tell_pio_unmapped(&mut self, n: u32, id: u32) -> bool {
        let mems: Vec<Option<MemGuard>> = self.memories().collect();
        let Some(mem) = mems.get(n as usize).and_then(|m| m.as_deref()) else {
            return false;
        };
        let record = ulnic_abi::wire::NotifyRecord {
            endpoint: id.into(),
            reason: ulnic_abi::notify_reason::PIO_UNMAPPED.into(),
        };
        self.nodes[n as usize].push_record(mem, &record)
    }

    /// Raises a notification for endpoint `e` of node `n`.
    fn notify(&mut self, n: u32, e: u32, mems: &[Option<MemGuard>]) {
        let Some(mem) = mems[n as usize].as_deref() else {
            return;
        };
        let node = &mut self.nodes[n as usize];
        // A source of an event queue reports to it instead (spec §6.1);
        // the queue is notified if it is armed.
        let e = match queued(node, n, e, mem) {
            Queued::No => e,
            Queued::Posted => return,
            Queued::NotifyQueue(q) => q,
        };
        if let Some(ep) = node.endpoint_mut(e) {
            ep.stats.notifications += 1;
        }
        self.counters.notifications += 1;
        // One kept record per endpoint says all a second would (spec §6),
        // and bounds what a driver that posts no buffers can make us hold.
        if !node.push_notification(mem, e) && !node.notify_backlog.contains(&e) {
            node.notify_backlog.push_back(e);
        }
    }

    fn flush_backlog(&mut self, n: usize, mem: &GuestMemoryMmap<()>) {
        let node = &mut self.nodes[n];
        while let Some(&e) = node.notify_backlog.front() {
            if !node.push_notification(mem, e) {
                break;
            }
            node.notify_backlog.pop_front();
        }
    }
}

/// What became of a source's notification.
enum Queued {
    /// Not a source of a live queue: notify it.
    No,
    /// Its QUEUED event went to its queue (or was counted lost there),
    /// which is not armed: nobody is notified.
    Posted,
    /// As `Posted`, and the queue's arm was taken: notify queue `.0`.
    NotifyQueue(u32),
}

/// Posts endpoint `e`'s QUEUED event to its queue, if it has a live one.
fn queued(node: &mut Node, node_id: u32, e: u32, mem: &GuestMemoryMmap<()>) -> Queued {
    // A queue since destroyed (its id may be another's now) counts for
    // nothing: the source is notified itself.
    let Some(link) = node.queue_of(e) else {
        return Queued::No;
    };
    let port = node.endpoint_mut(e).and_then(|s| s.port).unwrap_or(0);
    let Some(q) = node.endpoint_mut(link.id) else {
        return Queued::No;
    };
    let ev = EventRecord {
        kind: event::QUEUED,
        user_id: link.cookie,
        node: node_id,
        port,
        aux: e,
        ..EventRecord::default()
    };
    q.post_event(mem, &ev);
    if q.take_arm(mem) {
        Queued::NotifyQueue(link.id)
    } else {
        Queued::Posted
    }
}

/// The TX_DONE or TX_ERROR event of a send-ring descriptor: user id,
/// node, port and length copied from it (spec §5.6).
fn outcome_event(d: &SendDesc, kind: u16, code: u16) -> EventRecord {
    EventRecord {
        kind,
        code,
        user_id: d.user_id,
        node: d.dest_node,
        port: d.dest_port,
        len: d.len,
        ..Default::default()
    }
}

/// Whether a send-ring descriptor may be served at all: its reserved word
/// (offset 20) is zero, and it uses only features the driver accepted
/// (spec §5.3, §5.9). Everything else about it is checked where it is served.
fn descriptor_allowed(d: &SendDesc, raw: &[u8; SEND_DESC_SIZE as usize], features: u64) -> bool {
    let mut need = F_MESSAGING;
    match d.opcode {
        op::OOB => need |= F_OOB,
        op::RDMA_WRITE | op::RDMA_READ | op::WRITE_IMMEDIATE => need |= F_RDMA,
        op::REDIRECT | op::REDIRECT_END => need |= F_RDMA | F_UTLB,
        op::PIO_SYNC => need |= F_PIO,
        _ => {}
    }
    if d.flags & send_flags::UTLB != 0 {
        need |= F_UTLB;
    }
    // Every send-ring layout has its reserved word where SEND's is.
    let w: &ulnic_abi::wire::SendDesc = zerocopy::transmute_ref!(raw);
    w.reserved.get() == 0 && features & need == need
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::guest::tests::mem;
    use crate::memory::guest::Segment;
    use crate::nic::receive::take_free_buffer;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use std::mem::size_of;
    use ulnic_abi::{ctrl, wire, Cookie, RingLayout, FREE_DESC_SIZE, PAGE_ENTRY_SIZE};
    use ulnic_abi::{FreeDesc, RecvDesc, RECV_DESC_SIZE};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic};
    use zerocopy::{FromBytes, FromZeros, IntoBytes};

    const MEM: usize = 1 << 20;
    // Per node: control region at CTRL, segment pages at SEG (two pages).
    const CTRL: [u64; 2] = [0x10000, 0x40000];
    const SEG: [u64; 2] = [0x80000, 0xa0000];
    /// Per node: the UTLB table of endpoint 0's domain (the device only
    /// reads it): entries name the segment's pages, a page outside memory,
    /// a misaligned one, and nothing.
    const TABLE: [u64; 2] = [0xc0000, 0xc1000];
    const SENTINEL: u8 = 0xa5;

    fn utlb_entries(n: usize) -> [u64; 6] {
        [
            SEG[n],
            SEG[n] + 4096,
            SEG[1 - n] + 4096,
            0,
            1 << 40,
            SEG[n] + 8,
        ]
    }

    fn layout() -> RingLayout {
        RingLayout {
            send_entries: 4,
            recv_entries: 4,
            free_entries: 4,
            event_entries: 64,
        }
    }

    /// Two nodes sharing one mock memory, one bound endpoint each.
    fn setup() -> (Nodes, GuestMemoryMmap<()>) {
        let m = mem(MEM);
        m.write_slice(&vec![SENTINEL; MEM], GuestAddress(0))
            .unwrap();
        let atomic = GuestMemoryAtomic::new(m.clone());
        let mut f = Nodes::new(2, 2);
        for n in 0..2 {
            f.nodes[n].features = ulnic_abi::F_IMPLEMENTED;
            // Payload bytes differ from the sentinel, so a stray copy shows.
            let pattern: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8 ^ 0x5a).collect();
            m.write_slice(&pattern, GuestAddress(SEG[n])).unwrap();
            let seg = Segment::from_pages(&m, [SEG[n], SEG[n] + 4096]).unwrap();
            let mut ep = Endpoint::new(1, CTRL[n], layout(), seg);
            ep.init_shared(&m).unwrap();
            ep.port = Some(7);
            f.nodes[n].mem = Some(atomic.clone());
            f.nodes[n].ports.insert(7, 0);
            f.nodes[n].endpoints[0] = Some(ep);
            f.nodes[n].make_resident(&m, 0, Instant::now());
            let entries: Vec<u8> = utlb_entries(n)
                .iter()
                .flat_map(|e| e.to_le_bytes())
                .collect();
            m.write_slice(&entries, GuestAddress(TABLE[n])).unwrap();
            f.utlb.tables.set(
                (n as u32, 1),
                crate::nic::utlb::Table {
                    gpa: TABLE[n],
                    entries: 6,
                },
            );
        }
        (f, m)
    }

    fn granted(addr: u64) -> bool {
        (0..2).any(|n| {
            (CTRL[n]..CTRL[n] + layout().region_size()).contains(&addr)
                || (SEG[n]..SEG[n] + 8192).contains(&addr)
        })
    }

    fn write_close_message(m: &GuestMemoryMmap<()>, n: usize, flags: u16, data: &[u8]) {
        let mut b = [0u8; SEND_DESC_SIZE as usize];
        SendDesc {
            opcode: op::SEND,
            flags,
            len: data.len() as u32,
            dest_node: 1,
            dest_port: 7,
            tag: 9,
            user_id: 0,
            seg_offset: 0,
        }
        .encode_header(&mut b);
        b[INLINE_OFFSET..INLINE_OFFSET + data.len()].copy_from_slice(data);
        m.write_slice(&b, GuestAddress(CTRL[n] + ctrl::CLOSE_MESSAGE))
            .unwrap();
    }

    #[test]
    fn close_message_waits_for_a_receive_slot() {
        let (mut f, m) = setup();
        // The receiver's ring is full: 4 descriptors produced, none consumed.
        f.nodes[1].endpoints[0].as_mut().unwrap().recv_producer = 4;
        write_close_message(&m, 0, send_flags::INLINE, b"bye");
        assert!(f.close_endpoint(0, 0));
        assert!(!f.close_endpoint(0, 0), "closed twice");
        assert_eq!(f.counters.closes_delivered, 0);
        f.poll();
        assert_eq!(f.counters.closes_delivered, 0, "delivered into a full ring");
        guest::store_u32(&m, CTRL[1] + ctrl::RECV_CONSUMER, 1).unwrap();
        f.poll();
        assert_eq!(f.counters.closes_delivered, 1);
        let slot = CTRL[1] + layout().recv_offset(); // index 4 mod 4
        let mut raw = [0u8; RECV_DESC_SIZE as usize];
        m.read_slice(&mut raw, GuestAddress(slot)).unwrap();
        let d = RecvDesc::decode(&raw);
        assert_eq!(d.flags, recv_flags::INLINE | recv_flags::CLOSE);
        assert_eq!((d.src_node, d.src_port, d.tag, d.len), (0, 7, 9, 3));
        assert_eq!(&raw[INLINE_OFFSET..INLINE_OFFSET + 3], b"bye");
    }

    #[test]
    fn a_driver_without_notification_buffers_costs_one_record_per_endpoint() {
        let (mut f, _m) = setup();
        let mems: Vec<Option<MemGuard>> = f.memories().collect();
        // No notification queue: every notification is kept, merged per
        // endpoint however often the endpoint is notified.
        for _ in 0..10_000 {
            f.notify(1, 0, &mems);
            f.notify(1, 1, &mems);
        }
        assert_eq!(f.nodes[1].notify_backlog, [0, 1]);
        assert_eq!(f.counters.notifications, 20_000);
    }

    #[test]
    fn a_destroyed_endpoint_takes_its_kept_notification_with_it() {
        let (mut f, _m) = setup();
        let mems: Vec<Option<MemGuard>> = f.memories().collect();
        f.notify(1, 0, &mems);
        f.notify(1, 1, &mems);
        assert_eq!(f.nodes[1].notify_backlog, [0, 1]);
        assert!(f.close_endpoint(1, 0));
        // The kept record of endpoint 0 would name whoever gets its id next.
        assert_eq!(f.nodes[1].notify_backlog, [1]);
    }

    #[test]
    fn free_descriptors_with_reserved_bits_are_discarded() {
        let (mut f, m) = setup();
        let rx = f.nodes[1].endpoints[0].as_mut().unwrap();
        let free = CTRL[1] + layout().free_offset();
        let good = |b: &mut [u8; 32]| {
            FreeDesc {
                seg_offset: 0,
                len: 4096,
                user_id: 7,
            }
            .encode(b)
        };
        for (slot, reserved_at) in [(0u64, 12usize), (1, 24), (2, 31)] {
            let mut b = [0u8; 32];
            good(&mut b);
            b[reserved_at] = 1;
            m.write_slice(&b, GuestAddress(free + slot * FREE_DESC_SIZE))
                .unwrap();
        }
        let mut b = [0u8; 32];
        good(&mut b);
        m.write_slice(&b, GuestAddress(free + 3 * FREE_DESC_SIZE))
            .unwrap();
        guest::store_u32(&m, CTRL[1] + ctrl::FREE_PRODUCER, 4).unwrap();
        let taken = take_free_buffer(&m, rx, 100).unwrap();
        assert_eq!((taken.seg_offset, taken.user_id), (0, 7));
        assert_eq!(rx.stats.bad_descriptors, 3, "three discarded first");
    }

    #[test]
    fn malformed_close_message_is_not_sent() {
        let (mut f, m) = setup();
        // Not inline: a close message must carry its bytes itself.
        write_close_message(&m, 0, 0, b"bye");
        assert!(f.close_endpoint(0, 0));
        f.poll();
        assert_eq!(f.counters.closes_delivered, 0);
        assert_eq!(f.counters.closes_undeliverable, 1);
        assert_eq!(
            guest::load_u32(&m, CTRL[1] + ctrl::RECV_PRODUCER).unwrap(),
            0
        );
    }

    #[test]
    fn rdma_immediate_lands_at_the_target() {
        let (mut f, m) = setup();
        let mut c = f.nodes[1]
            .apertures
            .export(0, 0, 8192, ulnic_abi::perm::ALL, None)
            .unwrap();
        c.node = 1;
        let d = ulnic_abi::RdmaDesc {
            opcode: op::WRITE_IMMEDIATE,
            flags: send_flags::COMPLETION,
            len: 8,
            cookie: c,
            user_id: 9,
            remote_offset: 16,
            local_offset: 0,
            immediate: 0x1122_3344_5566_7788,
        };
        let mut b = [0u8; 64];
        d.encode(&mut b);
        m.write_slice(&b, GuestAddress(CTRL[0] + layout().send_offset()))
            .unwrap();
        guest::store_u32(&m, CTRL[0] + ctrl::SEND_PRODUCER, 1).unwrap();
        assert_eq!(f.poll(), 1);
        let mut got = [0u8; 8];
        m.read_slice(&mut got, GuestAddress(SEG[1] + 16)).unwrap();
        assert_eq!(u64::from_le_bytes(got), 0x1122_3344_5566_7788);
        let mut ev = [0u8; 32];
        m.read_slice(&mut ev, GuestAddress(CTRL[0] + layout().event_offset()))
            .unwrap();
        let ev = EventRecord::decode(&ev);
        assert_eq!((ev.kind, ev.user_id), (event::TX_DONE, 9));
    }

    /// Up to three bytes XORed anywhere: whatever a plausible descriptor
    /// gets wrong, a hostile one may.
    fn flips(len: usize) -> impl Strategy<Value = Vec<(usize, u8)>> {
        proptest::collection::vec((0..len, 1u8..), 0..3)
    }

    fn flipped<T: IntoBytes + FromBytes>(mut v: T, f: &[(usize, u8)]) -> T {
        for &(i, x) in f {
            v.as_mut_bytes()[i] ^= x;
        }
        v
    }

    /// A send: mostly a well-formed SEND to port 7 of either node (inline,
    /// or from a segment offset below 64), sometimes any bytes; then flipped.
    fn send_desc() -> impl Strategy<Value = wire::SendDesc> {
        let plausible = (
            (
                any::<bool>(),
                any::<bool>(),
                0u32..2,
                0u32..4096,
                0..=INLINE_MAX,
            ),
            (
                any::<u32>(),
                any::<u64>(),
                0u64..64,
                any::<[u8; INLINE_MAX as usize]>(),
            ),
        )
            .prop_map(
                |((inline, completion, node, len, inline_len), (tag, user_id, offset, data))| {
                    let mut flags = if inline { send_flags::INLINE } else { 0 };
                    if completion {
                        flags |= send_flags::COMPLETION;
                    }
                    let mut d = wire::SendDesc {
                        opcode: op::SEND.into(),
                        flags: flags.into(),
                        len: if inline { inline_len } else { len }.into(),
                        dest_node: node.into(),
                        dest_port: 7.into(),
                        tag: tag.into(),
                        reserved: 0.into(),
                        user_id: user_id.into(),
                        data,
                    };
                    if !inline {
                        let b = wire::SendBuffer {
                            offset: offset.into(),
                            utlb_first: 0.into(),
                            utlb_count: 0.into(),
                        };
                        d.data[..size_of::<wire::SendBuffer>()].copy_from_slice(b.as_bytes());
                    }
                    d
                },
            );
        let arbitrary = any::<[u8; SEND_DESC_SIZE as usize]>()
            .prop_map(|b| wire::SendDesc::read_from_bytes(&b).unwrap());
        (
            prop_oneof![3 => plausible, 1 => arbitrary],
            flips(SEND_DESC_SIZE as usize),
        )
            .prop_map(|(d, f)| flipped(d, &f))
    }

    /// A free buffer: offset below 4 KiB, length in [4, 8) KiB (mostly
    /// inside the 8 KiB segment, sometimes past its end); then flipped.
    fn free_desc() -> impl Strategy<Value = wire::FreeDesc> {
        (
            0u64..4096,
            4096u32..8192,
            any::<u64>(),
            flips(FREE_DESC_SIZE as usize),
        )
            .prop_map(|(o, l, id, f)| {
                let d = wire::FreeDesc {
                    seg_offset: o.into(),
                    len: l.into(),
                    reserved0: 0.into(),
                    user_id: id.into(),
                    reserved1: 0.into(),
                };
                flipped(d, &f)
            })
    }

    /// An RDMA or redirection descriptor of endpoint 0 of a node.
    #[derive(Debug, Clone)]
    struct Remote {
        node: usize,
        slot: u64,
        opcode: u16,
        remote: u64,
        local: u64,
        len: u32,
        right_key: bool,
        other_node: bool,
        utlb: Option<(u32, u32)>,
    }

    fn remote() -> impl Strategy<Value = Remote> {
        // Offsets and lengths around the 8 KiB segment and aperture:
        // mostly inside, sometimes past the end.
        (
            (0usize..2, 0u64..4, 2u16..=6),
            (0u64..0x2400, 0u64..0x2400, 0u32..0x2100),
            (proptest::bool::weighted(0.9), any::<bool>()),
            proptest::option::weighted(0.4, (0u32..7, 0u32..4)),
        )
            .prop_map(
                |((node, slot, opcode), (remote, local, len), (right_key, other_node), utlb)| {
                    Remote {
                        node,
                        slot,
                        opcode,
                        remote,
                        local,
                        len,
                        right_key,
                        other_node,
                        utlb,
                    }
                },
            )
    }

    /// The 128-byte send-ring slot of `r`, built from the wire structs.
    fn remote_slot(r: &Remote, cookies: &[Cookie], buffers: &[Cookie]) -> [u8; 128] {
        let mut flags = send_flags::COMPLETION;
        if r.utlb.is_some() {
            flags |= send_flags::UTLB;
        }
        let (first, count) = r.utlb.unwrap_or((0, 0));
        if matches!(r.opcode, op::REDIRECT | op::REDIRECT_END) {
            let mut w = wire::RedirectDesc::new_zeroed();
            w.opcode = r.opcode.into();
            w.flags = flags.into();
            w.len = r.len.into();
            // One of its own apertures (or a number that is none).
            w.aperture = u32::from(r.other_node).into();
            w.id = r.remote.into();
            w.offset = r.remote.into();
            w.page_offset = (r.local % 4200).into();
            w.utlb_first = first.into();
            w.utlb_count = count.into();
            return zerocopy::transmute!(w);
        }
        let to = if r.other_node { 1 - r.node } else { r.node };
        let mut cookie = if r.local.is_multiple_of(3) {
            buffers[to]
        } else {
            cookies[to]
        };
        if !r.right_key {
            cookie.key ^= r.remote | 1;
        }
        let imm = r.opcode == op::WRITE_IMMEDIATE;
        let d = ulnic_abi::RdmaDesc {
            opcode: r.opcode,
            flags,
            len: if imm { 4 << (r.len & 1) } else { r.len },
            cookie,
            user_id: 0,
            remote_offset: if imm { r.remote & !7 } else { r.remote },
            local_offset: if r.utlb.is_some() {
                r.local % 4200
            } else {
                r.local
            },
            immediate: 0x0123_4567_89ab_cdef, // not the sentinel
        };
        let mut w = wire::RdmaDesc::new_zeroed();
        d.encode(w.as_mut_bytes());
        w.utlb_first = first.into();
        w.utlb_count = count.into();
        zerocopy::transmute!(w)
    }

    /// What a hostile driver writes: bytes anywhere in its control regions,
    /// descriptors in its rings, and indices.
    #[derive(Debug, Clone)]
    struct Hostile {
        writes: Vec<(usize, u64, Vec<u8>)>,
        indices: Vec<(usize, usize, u32)>,
        offered: Vec<(u32, u32)>,
        descs: Vec<(usize, u64, wire::SendDesc, wire::FreeDesc)>,
        remotes: Vec<Remote>,
    }

    fn hostile() -> impl Strategy<Value = Hostile> {
        (
            proptest::collection::vec(
                (
                    0usize..2,
                    0u64..0x8000,
                    proptest::collection::vec(any::<u8>(), 1..64),
                ),
                0..40,
            ),
            proptest::collection::vec((0usize..2, 0usize..4, any::<u32>()), 0..3),
            proptest::collection::vec((0u32..=4, 0u32..=4), 2),
            proptest::collection::vec((0usize..2, 0u64..4, send_desc(), free_desc()), 0..12),
            proptest::collection::vec(remote(), 0..8),
        )
            .prop_map(|(writes, indices, offered, descs, remotes)| Hostile {
                writes,
                indices,
                offered,
                descs,
                remotes,
            })
    }

    /// Sets two nodes up, writes `h` into their memory and runs eight
    /// engine passes.
    fn run_hostile(h: &Hostile) -> (Nodes, GuestMemoryMmap<()>) {
        let (mut f, m) = setup();
        // Each endpoint exports its whole segment and sets a tripwire, so
        // RDMA descriptors with the right cookie reach the data path.
        let mut cookies = Vec::new();
        let mut buffers = Vec::new();
        for n in 0..2u32 {
            let apertures = &mut f.nodes[n as usize].apertures;
            let mut c = apertures
                .export(0, 0, 8192, ulnic_abi::perm::ALL, None)
                .unwrap();
            c.node = n;
            cookies.push(c);
            // And a user buffer through the UTLB (entries 0..3 of its
            // table: two pages of the segment and the other node's).
            let r = crate::nic::utlb::UtlbRef {
                first: 0,
                count: 3,
                offset: 8,
            };
            let mut b = apertures
                .export(0, 8, 3 * 4096 - 8, ulnic_abi::perm::ALL, Some(r))
                .unwrap();
            b.node = n;
            buffers.push(b);
            let t = crate::nic::aperture::Tripwire {
                aperture: c.aperture,
                offset: 0,
                len: 64,
                flags: ulnic_abi::tripwire_flags::ALL,
                user: 1,
                active: true,
            };
            let ep = f.nodes[n as usize].endpoints[0].as_mut().unwrap();
            ep.set_tripwire(t, 4).unwrap();
        }
        for (n, off, bytes) in &h.writes {
            let off = off % layout().region_size();
            let len = bytes.len().min((layout().region_size() - off) as usize);
            m.write_slice(&bytes[..len], GuestAddress(CTRL[*n] + off))
                .unwrap();
        }
        for (n, slot, d, fd) in &h.descs {
            let base = CTRL[*n] + layout().send_offset() + slot * SEND_DESC_SIZE;
            m.write_slice(d.as_bytes(), GuestAddress(base)).unwrap();
            let free = CTRL[*n] + layout().free_offset() + slot * FREE_DESC_SIZE;
            m.write_slice(fd.as_bytes(), GuestAddress(free)).unwrap();
        }
        for r in &h.remotes {
            let base = CTRL[r.node] + layout().send_offset() + r.slot * SEND_DESC_SIZE;
            m.write_slice(&remote_slot(r, &cookies, &buffers), GuestAddress(base))
                .unwrap();
        }
        for (n, (sends, frees)) in h.offered.iter().enumerate() {
            guest::store_u32(&m, CTRL[n] + ctrl::SEND_PRODUCER, *sends).unwrap();
            guest::store_u32(&m, CTRL[n] + ctrl::FREE_PRODUCER, *frees).unwrap();
        }
        let words = [
            ctrl::SEND_PRODUCER,
            ctrl::FREE_PRODUCER,
            ctrl::RECV_CONSUMER,
            ctrl::EVENT_CONSUMER,
        ];
        for &(n, w, v) in &h.indices {
            guest::store_u32(&m, CTRL[n] + words[w], v).unwrap();
        }
        for _ in 0..8 {
            f.poll();
        }
        (f, m)
    }

    /// The device wrote nothing outside what the two nodes granted, and
    /// never wrote a UTLB table.
    fn contained(m: &GuestMemoryMmap<()>) -> Result<(), String> {
        // The tables hold what the test wrote; then forget them for the
        // scan below.
        let table_len = 6 * PAGE_ENTRY_SIZE as usize;
        for (n, &table) in TABLE.iter().enumerate() {
            let mut t = vec![0u8; table_len];
            m.read_slice(&mut t, GuestAddress(table)).unwrap();
            let want: Vec<u8> = utlb_entries(n)
                .iter()
                .flat_map(|e| e.to_le_bytes())
                .collect();
            if t != want {
                return Err(format!("node {n}'s UTLB table was written"));
            }
            m.write_slice(&vec![SENTINEL; table_len], GuestAddress(table))
                .unwrap();
        }
        let mut all = vec![0u8; MEM];
        m.read_slice(&mut all, GuestAddress(0)).unwrap();
        match all
            .iter()
            .enumerate()
            .find(|&(addr, b)| *b != SENTINEL && !granted(addr as u64))
        {
            Some((addr, _)) => Err(format!("device wrote outside the grant at {addr:#x}")),
            None => Ok(()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Whatever a hostile driver writes into its rings and indices, the
        /// device neither panics nor writes outside the granted memory.
        #[test]
        fn hostile_rings_stay_contained(h in hostile()) {
            let (_f, m) = run_hostile(&h);
            prop_assert_eq!(contained(&m), Ok(()));
        }
    }

    /// The cases proptest once shrank failures to (from its regression
    /// files of the generator's earlier shapes), kept as they were meant.
    #[test]
    fn past_failures_stay_contained() {
        let plain = |n, remote, local, len, opcode, right_key, utlb| Remote {
            node: n,
            slot: 0,
            opcode,
            remote,
            local,
            len,
            right_key,
            other_node: false,
            utlb,
        };
        let send = |node: u32, len: u32| wire::SendDesc {
            opcode: op::SEND.into(),
            len: len.into(),
            dest_node: node.into(),
            dest_port: 7.into(),
            ..wire::SendDesc::new_zeroed()
        };
        let free = wire::FreeDesc {
            len: 4096.into(),
            ..wire::FreeDesc::new_zeroed()
        };
        let case = |offered: [(u32, u32); 2], descs, remotes| Hostile {
            writes: Vec::new(),
            indices: Vec::new(),
            offered: offered.to_vec(),
            descs,
            remotes,
        };
        let cases = [
            // A 256-byte send from node 1 to node 0, which has a free buffer.
            case(
                [(0, 1), (2, 0)],
                vec![(1, 0, send(0, 256), free), (0, 0, send(0, 0), free)],
                vec![],
            ),
            // A write-immediate of 4 bytes into one's own aperture.
            case(
                [(0, 0), (1, 0)],
                vec![],
                vec![plain(1, 0, 0, 0, op::WRITE_IMMEDIATE, true, None)],
            ),
            // An RDMA read of 1 byte into a user buffer not installed.
            case(
                [(1, 0), (0, 0)],
                vec![],
                vec![plain(0, 0, 0, 1, op::RDMA_READ, true, Some((3, 1)))],
            ),
            // An RDMA write of 0 bytes with a wrong key.
            case(
                [(1, 0), (0, 0)],
                vec![],
                vec![plain(0, 0, 0, 0, op::RDMA_WRITE, false, None)],
            ),
        ];
        for (i, h) in cases.iter().enumerate() {
            let (_f, m) = run_hostile(h);
            assert_eq!(contained(&m), Ok(()), "case {i}");
        }
    }

    /// The hostile generator reaches what it is meant to attack: SENDs
    /// received (into free buffers too) and RDMA carried out, not only
    /// refusals. Deterministic, so the counts below are the same each run.
    #[test]
    fn the_hostile_generator_reaches_delivery() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut carried, mut received, mut bytes) = (0, 0, 0);
        for _ in 0..200 {
            let h = hostile().new_tree(&mut runner).unwrap().current();
            let (f, _m) = run_hostile(&h);
            carried += f.counters.delivered;
            for e in f.nodes.iter().filter_map(|n| n.endpoints[0].as_ref()) {
                received += e.stats.rx_messages;
                bytes += e.stats.rx_bytes;
            }
        }
        eprintln!(
            "{carried} descriptors carried out, {received} messages and {bytes} bytes received"
        );
        assert!(
            carried >= 40,
            "{carried} descriptors carried out in 200 cases"
        );
        assert!(received >= 20, "{received} messages received in 200 cases");
        assert!(
            bytes > 4 * u64::from(INLINE_MAX),
            "{bytes} bytes received: no buffered receive"
        );
    }
}
