//! The NIC as the fabric's transport sees it (spec §10.4): where messages
//! that crossed the fabric are delivered, where senders learn the outcome
//! of theirs, and where returned messages wait for room at their sender.

use std::collections::VecDeque;

use log::debug;
use ulnic_abi::{event, recv_flags, tx_error, EventRecord, F_RETURN_TO_SENDER};

use crate::fabric::transport::{self, ChannelKey, Sink};
use crate::nic::receive::{deliver_and_arm, has_room_for, Message};
use crate::shard::counters::Counters;
use crate::shard::pass::Pass;

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
        aux: 0,
    }
}

impl NicSink<'_, '_> {
    /// Posts an event to the sending endpoint of `key`, settling one of the
    /// event slots its send reserved, and wakes its owner if armed.
    fn settle(&mut self, key: ChannelKey, ev: Option<EventRecord>) -> bool {
        let Some(mem) = self.pass.mem(key.src) else {
            return false;
        };
        let Some(ep) = self.pass.nodes[key.src as usize].endpoint_mut(key.endpoint) else {
            return false;
        };
        ep.events_owed = ep.events_owed.saturating_sub(1);
        if let Some(ev) = ev {
            ep.post_event(mem, &ev);
            if ep.take_arm(mem) {
                self.pass.wake.push((key.src, key.endpoint));
            }
        }
        true
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
        if node.features & F_RETURN_TO_SENDER == 0 {
            return Ok(()); // the driver did not ask for them: the event says it all
        }
        let ep = node
            .endpoint_mut(key.endpoint)
            .ok_or(tx_error::NO_ENDPOINT)?;
        // Stamped with where it was going; the filter does not apply.
        let m =
            Message::bytes((key.dst, key.port), msg.tag, &msg.bytes).flagged(recv_flags::RETURNED);
        let (r, w) = deliver_and_arm(mem, ep, &m);
        if w {
            self.pass.wake.push((key.src, key.endpoint));
        }
        match r {
            Ok(()) => self.counters.returned_to_sender += 1,
            Err(tx_error::NO_BUFFER) => {}
            Err(_) => self.counters.returns_lost += 1,
        }
        r
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

impl Sink for NicSink<'_, '_> {
    fn deliver(
        &mut self,
        dst: u32,
        port: u32,
        src: u32,
        src_port: u32,
        tag: u32,
        bytes: &[u8],
    ) -> Result<(), u16> {
        let m = Message::bytes((src, src_port), tag, bytes);
        let r = self.pass.deliver(dst, port, &m);
        if r.is_ok() {
            self.counters.delivered += 1;
        }
        r
    }

    fn acked(&mut self, key: ChannelKey, msg: transport::Message) {
        let ev = msg
            .completion
            .then(|| outcome(key, &msg, event::TX_DONE, 0));
        self.settle(key, ev);
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
        let ev = outcome(key, &msg, event::TX_ERROR, code);
        if !self.settle(key, Some(ev)) {
            self.counters.returns_lost += 1;
            return;
        }
        if let Some(ep) = self.pass.nodes[key.src as usize].endpoint_mut(key.endpoint) {
            ep.stats.tx_errors += 1;
        }
        if self.put_back(key, &msg) == Err(tx_error::NO_BUFFER) {
            if self.pending.len() >= MAX_PENDING_RETURNS {
                self.pending.pop_front();
                self.counters.returns_lost += 1;
            }
            self.pending.push_back(PendingReturn { key, msg });
        }
    }
}
