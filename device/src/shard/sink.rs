//! The NIC as the fabric's transport sees it (spec §10.4): where messages
//! and remote accesses that crossed the fabric are carried out, where
//! senders learn the outcome of theirs (an RDMA descriptor once all its
//! pieces are settled), where returned messages wait for room at their
//! sender, and who hears that a node was lost.

use std::collections::VecDeque;

use log::debug;
use ulnic_abi::{event, op, recv_flags, tx_error, EventRecord, F_RETURN_TO_SENDER};

use crate::fabric::transport::{self, Arrival, ChannelKey, Delivered, Sink};
use crate::nic::receive::{deliver_and_arm, has_room_for, Message};
use crate::shard::counters::Counters;
use crate::shard::pass::{Initiator, Oob, Pass};
use crate::shard::rdma;
use crate::shard::remote::{self, RemoteOps};

/// Returned messages waiting for room in their sender's receive queue,
/// device-wide; beyond this the oldest is dropped (and counted).
const MAX_PENDING_RETURNS: usize = 4096;

/// A message the fabric returned, waiting for room at its sender.
pub struct PendingReturn {
    key: ChannelKey,
    msg: transport::Message,
}

impl PendingReturn {
    /// Whether it was sent by endpoint `id` of node `node`.
    pub fn from(&self, node: u32, id: u32) -> bool {
        (self.key.src, self.key.endpoint) == (node, id)
    }
}

/// The NIC during one pass, as the transport sees it.
pub struct NicSink<'a, 'p> {
    /// The pass it runs in.
    pub pass: &'a mut Pass<'p>,
    /// The shard's totals.
    pub counters: &'a mut Counters,
    /// Returned messages waiting for room at their sender.
    pub pending: &'a mut VecDeque<PendingReturn>,
    /// Remote accesses in flight from this shard's nodes.
    pub remote: &'a mut RemoteOps,
}

/// The outcome event of the message `msg` on channel `key`.
fn outcome(key: ChannelKey, msg: &transport::Message, kind: u16, code: u16) -> EventRecord {
    EventRecord {
        kind,
        code,
        user_id: msg.user_id,
        node: key.dst,
        port: key.port,
        len: msg.bytes.len() as u32,
        ..Default::default()
    }
}

impl NicSink<'_, '_> {
    /// Posts an event to endpoint `id` of node `n` if it is still the
    /// one of session `session`, settling one of the event slots its send
    /// reserved, and wakes its owner if armed. False when that endpoint is
    /// gone (its outcomes go nowhere).
    fn settle(
        &mut self,
        (n, id, session): (u32, u32, u32),
        delivered: Option<u32>,
        ev: Option<EventRecord>,
    ) -> bool {
        let Some(mem) = self.pass.mem(n) else {
            return false;
        };
        let Some(ep) = self.pass.nodes[n as usize]
            .endpoint_mut(id)
            .filter(|e| e.session == session)
        else {
            return false;
        };
        ep.events_owed = ep.events_owed.saturating_sub(1);
        if let Some(len) = delivered {
            ep.stats.tx_messages += 1;
            ep.stats.tx_bytes += u64::from(len);
        }
        if let Some(ev) = ev {
            if ev.kind == event::TX_ERROR {
                ep.stats.tx_errors += 1;
            }
            ep.post_event(mem, &ev);
            if ep.take_arm(mem) {
                self.pass.wake.push((n, id));
            }
        }
        true
    }

    /// A piece of a remote access was settled: when it was the last, the
    /// descriptor's one event.
    fn settle_piece(&mut self, handle: u64, code: Option<u16>) {
        let Some(done) = remote::settle(self.remote, handle, code) else {
            return;
        };
        if let Some(seg) = done.landing {
            self.pass.utlb.recycle(seg);
        }
        let delivered = done
            .event
            .filter(|e| e.kind == event::TX_ERROR)
            .is_none()
            .then_some(done.len);
        self.settle(
            (done.node, done.endpoint, done.session),
            delivered,
            done.event,
        );
    }

    /// Whether the sending endpoint of `key` could take a message of `len`
    /// bytes back now (a gone endpoint "could": `put_back` then counts it
    /// lost).
    fn room_for(&mut self, key: ChannelKey, len: u32) -> bool {
        let Some(mem) = self.pass.mem(key.src) else {
            return true;
        };
        match self.pass.nodes[key.src as usize].endpoint_mut(key.endpoint) {
            Some(ep) => has_room_for(mem, ep, len),
            None => true,
        }
    }

    /// Puts a returned message into its sender's receive queue.
    fn put_back(&mut self, key: ChannelKey, msg: &transport::Message) -> Result<(), u16> {
        let mem = self.pass.mem(key.src).ok_or(tx_error::NO_ENDPOINT)?;
        let node = &mut self.pass.nodes[key.src as usize];
        let features = node.features;
        let ep = node
            .endpoint_mut(key.endpoint)
            .filter(|e| e.session == msg.session)
            .ok_or(tx_error::NO_ENDPOINT)?;
        let back = Back {
            counters: self.counters,
            wake: self.pass.wake,
        };
        back.place(features, mem, ep, key, msg)
    }

    /// `return_to_sender` for the endpoint whose descriptor is being served
    /// (out of its slot meanwhile).
    pub fn return_to_sender_from(
        &mut self,
        from: &mut Initiator<'_>,
        key: ChannelKey,
        msg: transport::Message,
    ) {
        let features = self.pass.nodes[from.node as usize].features;
        let back = Back {
            counters: self.counters,
            wake: self.pass.wake,
        };
        if back.place(features, from.mem, from.ep, key, &msg) == Err(tx_error::NO_BUFFER) {
            self.keep(key, msg);
        }
    }

    /// Returns message `msg` of channel `key` to its sender's receive
    /// queue, or keeps it until the sender has room (its TX_ERROR is
    /// already posted).
    pub fn return_to_sender(&mut self, key: ChannelKey, msg: transport::Message) {
        if self.put_back(key, &msg) == Err(tx_error::NO_BUFFER) {
            self.keep(key, msg);
        }
    }

    /// Keeps a returned message until its sender has room.
    fn keep(&mut self, key: ChannelKey, msg: transport::Message) {
        if self.pending.len() >= MAX_PENDING_RETURNS {
            self.pending.pop_front();
            self.counters.returns_lost += 1;
        }
        self.pending.push_back(PendingReturn { key, msg });
    }

    /// Tries the returned messages that waited for a receive slot, only
    /// when their sender has room now: a sender that posts no buffers costs
    /// a look per pass, not a counted drop and a condition. Returns how
    /// many went back.
    pub fn retry_returns(&mut self) -> usize {
        let mut moved = 0;
        for _ in 0..self.pending.len() {
            let Some(r) = self.pending.pop_front() else {
                break;
            };
            if self.room_for(r.key, r.msg.bytes.len() as u32)
                && self.put_back(r.key, &r.msg) != Err(tx_error::NO_BUFFER)
            {
                moved += 1;
            } else {
                self.pending.push_back(r);
            }
        }
        moved
    }
}

/// What placing a returned message back touches beside its endpoint.
struct Back<'a> {
    counters: &'a mut Counters,
    wake: &'a mut Vec<(u32, u32)>,
}

impl Back<'_> {
    /// Puts returned message `msg` of channel `key` into endpoint `ep` (its
    /// sender, on a node that accepted `features`), flagged RETURNED and
    /// stamped with where it was going; the filter does not apply.
    fn place(
        self,
        features: u64,
        mem: &vm_memory::GuestMemoryMmap<()>,
        ep: &mut crate::nic::endpoint::Endpoint,
        key: ChannelKey,
        msg: &transport::Message,
    ) -> Result<(), u16> {
        if features & F_RETURN_TO_SENDER == 0 {
            return Ok(()); // the driver did not ask for them: the event says it all
        }
        let m = Message::bytes((key.dst, key.port), msg.tag, &msg.bytes)
            .flagged(recv_flags::RETURNED)
            .in_session(msg.session);
        let (r, w) = deliver_and_arm(mem, ep, &m);
        if w {
            self.wake.push((key.src, key.endpoint));
        }
        match r {
            Ok(()) => self.counters.returned_to_sender += 1,
            Err(tx_error::NO_BUFFER) => {}
            Err(_) => self.counters.returns_lost += 1,
        }
        r
    }
}

impl Sink for NicSink<'_, '_> {
    fn room(&mut self, dst: u32, port: u32, len: usize) -> u32 {
        self.pass.room(dst, port, len)
    }

    fn bound(&mut self, dst: u32, port: u32) -> bool {
        self.pass.bound(dst, port).is_ok()
    }

    fn deliver(&mut self, a: &Arrival<'_>) -> Result<Delivered, u16> {
        let delivered = match a.opcode {
            op::SEND => {
                // Only a close message's flag crosses the fabric.
                let m = Message::bytes((a.src, a.src_port), a.tag, a.bytes)
                    .flagged(a.flags & recv_flags::CLOSE)
                    .in_session(a.session);
                self.pass
                    .deliver(a.dst, a.port, &m)
                    .map(|()| Delivered::Done)
            }
            op::OOB => {
                let o = Oob::new((a.src, a.src_port), a.session, a.tag, a.bytes);
                self.pass
                    .deliver_oob(a.dst, a.port, &o)
                    .map(|()| Delivered::Done)
            }
            _ => rdma::arrive(self.pass, a).map(|r| r.map_or(Delivered::Done, Delivered::Read)),
        }?;
        self.counters.delivered += 1;
        Ok(delivered)
    }

    fn read_data(&mut self, _: ChannelKey, msg: &transport::Message, at: u32, bytes: &[u8]) {
        remote::land_answer(self.pass, self.remote, msg, at, bytes);
    }

    fn acked(&mut self, key: ChannelKey, msg: transport::Message) {
        if msg.handle != 0 {
            self.settle_piece(msg.handle, None);
            return;
        }
        if msg.flags & recv_flags::CLOSE != 0 {
            self.counters.closes_delivered += 1;
            return;
        }
        let ev = msg
            .completion
            .then(|| outcome(key, &msg, event::TX_DONE, 0));
        let len = msg.bytes.len() as u32;
        self.settle((key.src, key.endpoint, msg.session), Some(len), ev);
    }

    fn returned(&mut self, key: ChannelKey, msg: transport::Message, code: u16) {
        self.counters.returned += 1;
        debug!(
            "node {} ep {}: message {} to {}:{} returned: {}",
            key.src,
            key.endpoint,
            msg.user_id,
            key.dst,
            key.port,
            tx_error::name(code)
        );
        if msg.handle != 0 {
            self.settle_piece(msg.handle, Some(code));
            return;
        }
        if msg.flags & recv_flags::CLOSE != 0 {
            self.counters.closes_undeliverable += 1;
            return;
        }
        let ev = outcome(key, &msg, event::TX_ERROR, code);
        if !self.settle((key.src, key.endpoint, msg.session), None, Some(ev)) {
            self.counters.returns_lost += 1;
            return;
        }
        if msg.opcode == op::SEND {
            self.return_to_sender(key, msg);
        }
    }

    fn unreachable(&mut self, node: u32, lost: u32, endpoints: &[u32], ports: &[u32]) {
        debug!("node {node}: node {lost} is unreachable");
        let bound = self.pass.nodes.get(node as usize).map(|n| {
            ports
                .iter()
                .filter_map(|p| n.ports.get(p).copied())
                .collect::<Vec<u32>>()
        });
        let mut told: Vec<u32> = endpoints.to_vec();
        told.extend(bound.unwrap_or_default());
        told.sort_unstable();
        told.dedup();
        for e in told {
            self.pass.report_unreachable(node, e, lost);
        }
    }
}
