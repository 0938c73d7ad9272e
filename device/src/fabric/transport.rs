//! VN's reliable transport between nodes (spec §10.4; Chun, Mainwaring
//! and Culler, IEEE Micro 1998, §4.2-4.4), kept per channel: one channel
//! per (source endpoint, destination node and port), so order holds per
//! pair of endpoints and one full receiver never blocks another.
//!
//! A channel is go-back-N over whole messages with a window: every
//! message carries the channel's epoch and a sequence number and is cut
//! into fragments at the path MTU; the receiver takes only the next
//! sequence number, reassembles it and hands it to the endpoint, then
//! acknowledges it (cumulative ACK). A receiver with no buffer answers
//! NACK and the sender tries again after a back-off; a refusal that
//! retrying cannot cure (no endpoint, filter, buffer too small) is
//! answered with a NACK carrying the reason, and the sender returns that
//! message and goes on in a new epoch. With no answer at all the sender
//! retransmits from the oldest unacknowledged message after a timeout
//! that doubles; after `retries` of them it returns every message it
//! holds to their sender (return-to-sender) and starts a new epoch.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use ulnic_abi::{packet, tx_error, MAX_MESSAGE};

use crate::fabric::link::Nanos;
use crate::fabric::packet::Packet;

/// The transport's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportConfig {
    /// Messages a channel may have unacknowledged.
    pub window: u32,
    /// Timeouts in a row (no ACK, no NACK) before the messages go back
    /// to their sender.
    pub retries: u32,
    /// NACKs for want of a buffer in a row before the message goes back.
    pub nack_retries: u32,
    /// The first timeout, before doubling; the path's round trip is added.
    pub min_timeout: Nanos,
    /// The longest timeout.
    pub max_timeout: Nanos,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            window: 16,
            // About one second of silence (the timeouts double from
            // 0.5 ms to 50 ms): a partition that heals within it loses
            // nothing. VN waited "several seconds" (255 retries).
            retries: 26,
            nack_retries: 10_000,
            min_timeout: 500_000,
            max_timeout: 50_000_000,
        }
    }
}

/// First wait after a NACK; it doubles with each NACK in a row.
const NACK_BACKOFF: Nanos = 5_000;
/// Longest wait after a NACK.
const MAX_NACK_BACKOFF: Nanos = 1_000_000;
/// ACKs and NACKs a node may have waiting to leave; beyond this they are
/// dropped (and counted): the timeouts recover.
const MAX_CONTROL_BACKLOG: usize = 1 << 16;
/// Messages one sending endpoint may have in the transport's care, over
/// all its channels: what a guest can make the device hold is bounded.
pub const MAX_ENDPOINT_MESSAGES: u32 = 256;
/// Payload bytes one sending endpoint may have in the transport's care
/// (a single message is always taken when the endpoint holds none).
pub const MAX_ENDPOINT_BYTES: usize = 8 << 20;
/// Send channels kept; past this the empty ones are forgotten (a channel
/// made again starts a new epoch, which its receiver takes as new).
const MAX_SEND_CHANNELS: usize = 1 << 16;

/// A channel: the sending endpoint (node and index) and the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelKey {
    /// Source node.
    pub src: u32,
    /// The sending endpoint's index on `src`.
    pub endpoint: u32,
    /// Destination node.
    pub dst: u32,
    /// Destination port.
    pub port: u32,
}

/// A message in the transport's care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sender's port, stamped.
    pub src_port: u32,
    /// The sender's tag.
    pub tag: u32,
    /// The send descriptor's user id.
    pub user_id: u64,
    /// The sender asked for a completion event.
    pub completion: bool,
    /// The payload.
    pub bytes: Vec<u8>,
}

/// Where the transport's outcomes go: the NIC.
pub trait Sink {
    /// Hands a complete message to endpoint `port` of node `dst`: `Ok`, or
    /// the `tx_error` code why not (`NO_BUFFER` is retried).
    fn deliver(
        &mut self,
        dst: u32,
        port: u32,
        src: u32,
        src_port: u32,
        tag: u32,
        bytes: &[u8],
    ) -> Result<(), u16>;
    /// The message was delivered.
    fn acked(&mut self, key: ChannelKey, msg: Message);
    /// The message was not delivered and comes back, with the reason.
    fn returned(&mut self, key: ChannelKey, msg: Message, code: u16);
}

/// What the transport of one node has done.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TransportCounters {
    /// Messages accepted for sending.
    pub messages_sent: u64,
    /// Messages delivered here.
    pub messages_delivered: u64,
    /// DATA packets sent, first time.
    pub data_packets: u64,
    /// DATA packets sent again.
    pub retransmissions: u64,
    /// Timeouts that caused retransmission.
    pub timeouts: u64,
    /// ACKs sent.
    pub acks_sent: u64,
    /// NACKs sent (no buffer, or a refusal).
    pub nacks_sent: u64,
    /// NACKs received.
    pub nacks_received: u64,
    /// Packets of messages already delivered, dropped.
    pub duplicates_dropped: u64,
    /// Packets ahead of the next expected message, dropped.
    pub out_of_order_dropped: u64,
    /// Packets of an old epoch, dropped.
    pub stale_dropped: u64,
    /// Packets that make no sense (lengths, fragments), dropped.
    pub malformed_dropped: u64,
    /// Messages returned to their sender.
    pub returned: u64,
    /// ACKs or NACKs dropped because too many waited to leave.
    pub control_dropped: u64,
    /// Packets the node could not send for want of a route (before the
    /// first map, or to a node the mapper did not find).
    pub unrouted: u64,
}

summable!(TransportCounters {
    messages_sent,
    messages_delivered,
    data_packets,
    retransmissions,
    timeouts,
    acks_sent,
    nacks_sent,
    nacks_received,
    duplicates_dropped,
    out_of_order_dropped,
    stale_dropped,
    malformed_dropped,
    returned,
    control_dropped,
    unrouted
});

struct Unacked {
    seq: u32,
    msg: Message,
    /// When its last fragment was first handed to the link; `None` once it
    /// is sent again (Karn: a retransmitted message gives no RTT sample).
    sent_at: Option<Nanos>,
    /// Sent in full at least once: sending it again is a retransmission.
    transmitted: bool,
    /// Sent more than once.
    again: bool,
    /// When the transport took it from the send ring.
    submitted_at: Nanos,
}

struct SendChannel {
    epoch: u32,
    next_seq: u32,
    /// In sequence order; the front is the oldest unacknowledged.
    unacked: VecDeque<Unacked>,
    /// Messages at the front already transmitted in this round.
    sent: usize,
    /// The next fragment of `unacked[sent]` to transmit.
    frag: u32,
    mtu: u32,
    /// The timeout while nothing is lost: the larger of the configured
    /// minimum plus four idle round trips, and the estimate below.
    base_timeout: Nanos,
    /// Smoothed round trip and its mean deviation (Jacobson/Karels),
    /// measured from sends to their ACKs: they include queueing behind
    /// slow links, which the idle round trip does not.
    srtt: Option<(Nanos, Nanos)>,
    floor: Nanos,
    timeout: Nanos,
    /// When the oldest message times out.
    deadline: Option<Nanos>,
    /// No transmission before this (after a NACK).
    hold_until: Nanos,
    timeouts: u32,
    nacks: u32,
    /// In the node's ready queue.
    queued: bool,
    /// Its messages were last returned unreachable and nothing has been
    /// heard since: further ones get one retry, not `retries`, so a sender
    /// to a partitioned node gets them back in milliseconds.
    unreachable: bool,
}

impl SendChannel {
    fn has_more(&self) -> bool {
        self.sent < self.unacked.len()
    }

    fn rewind(&mut self) {
        self.sent = 0;
        self.frag = 0;
    }
}

struct Assembly {
    seq: u32,
    frags: u16,
    got: Vec<bool>,
    missing: u32,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct RecvChannel {
    epoch: u32,
    next: u32,
    assembly: Option<Assembly>,
}

/// The transport of every node of one fabric.
pub struct Transport {
    config: TransportConfig,
    send: HashMap<ChannelKey, SendChannel>,
    recv: HashMap<ChannelKey, RecvChannel>,
    /// Per node: channels with something to transmit, served in turn.
    ready: Vec<VecDeque<ChannelKey>>,
    /// Per node: ACKs and NACKs waiting to leave (they go first).
    control: Vec<VecDeque<Packet>>,
    /// Deadlines and hold-offs, earliest first (entries may be stale).
    timers: BinaryHeap<Reverse<(Nanos, ChannelKey)>>,
    next_epoch: u32,
    /// Per node.
    pub counters: Vec<TransportCounters>,
    /// The last one-way delays (submit to delivery) of messages whose
    /// sender is on this device too, for the link benchmark.
    delays: VecDeque<Nanos>,
    /// Per sending endpoint (node, index): messages and payload bytes held.
    held: HashMap<(u32, u32), (u32, usize)>,
    /// Messages held, all endpoints.
    in_flight: usize,
    /// ACKs and NACKs waiting to leave, all nodes.
    control_waiting: usize,
}

/// One-way delays kept.
const MAX_DELAYS: usize = 1 << 16;

/// The first epoch of a transport: the wall clock in milliseconds, so a
/// device that restarts starts its channels in epochs its peers (other
/// devices of a fabric, which kept their receive state) take as newer.
fn first_epoch() -> u32 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u32);
    ms.max(1)
}

/// `a` comes before `b` in sequence space.
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

impl Transport {
    /// The transport of `nodes` nodes.
    pub fn new(nodes: u32, config: TransportConfig) -> Transport {
        Transport {
            config,
            send: HashMap::new(),
            recv: HashMap::new(),
            ready: (0..nodes).map(|_| VecDeque::new()).collect(),
            control: (0..nodes).map(|_| VecDeque::new()).collect(),
            timers: BinaryHeap::new(),
            next_epoch: first_epoch(),
            counters: vec![TransportCounters::default(); nodes as usize],
            delays: VecDeque::new(),
            held: HashMap::new(),
            in_flight: 0,
            control_waiting: 0,
        }
    }

    /// Its settings.
    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    fn new_epoch(&mut self) -> u32 {
        let e = self.next_epoch;
        self.next_epoch = self.next_epoch.wrapping_add(1).max(1);
        e
    }

    /// Whether channel `key` takes another message of `len` bytes: its
    /// window has room, and its sending endpoint is within its budget.
    pub fn has_room(&self, key: &ChannelKey, len: usize) -> bool {
        let window = self
            .send
            .get(key)
            .is_none_or(|c| c.unacked.len() < self.config.window as usize);
        let budget = match self.held.get(&(key.src, key.endpoint)) {
            None => true,
            Some(&(msgs, bytes)) => {
                msgs < MAX_ENDPOINT_MESSAGES && bytes + len <= MAX_ENDPOINT_BYTES
            }
        };
        window && budget
    }

    /// Takes a message for channel `key` at `now`. `path` gives the MTU of
    /// its path and the round trip when idle; it is asked only when the
    /// channel is new. The caller checked `has_room`.
    pub fn submit(
        &mut self,
        key: ChannelKey,
        msg: Message,
        now: Nanos,
        path: impl FnOnce() -> (u32, Nanos),
    ) {
        if !self.send.contains_key(&key) {
            if self.send.len() >= MAX_SEND_CHANNELS {
                self.send.retain(|_, c| !c.unacked.is_empty());
            }
            let (mtu, rtt) = path();
            let epoch = self.new_epoch();
            let base = self.config.min_timeout + 4 * rtt;
            self.send.insert(
                key,
                SendChannel {
                    epoch,
                    next_seq: 0,
                    unacked: VecDeque::new(),
                    sent: 0,
                    frag: 0,
                    mtu,
                    base_timeout: base,
                    srtt: None,
                    floor: base,
                    timeout: base,
                    deadline: None,
                    hold_until: 0,
                    timeouts: 0,
                    nacks: 0,
                    queued: false,
                    unreachable: false,
                },
            );
        }
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        let held = self.held.entry((key.src, key.endpoint)).or_default();
        held.0 += 1;
        held.1 += msg.bytes.len();
        self.in_flight += 1;
        let seq = c.next_seq;
        c.next_seq = c.next_seq.wrapping_add(1);
        c.unacked.push_back(Unacked {
            seq,
            msg,
            sent_at: None,
            transmitted: false,
            again: false,
            submitted_at: now,
        });
        self.counters[key.src as usize].messages_sent += 1;
        self.make_ready(key);
    }

    /// Takes `msgs` messages of `bytes` bytes off what channel `key`'s
    /// endpoint holds: they were delivered or returned.
    fn release(&mut self, key: &ChannelKey, msgs: u32, bytes: usize) {
        self.in_flight = self.in_flight.saturating_sub(msgs as usize);
        let e = (key.src, key.endpoint);
        if let Some(h) = self.held.get_mut(&e) {
            h.0 = h.0.saturating_sub(msgs);
            h.1 = h.1.saturating_sub(bytes);
            if h.0 == 0 {
                self.held.remove(&e);
            }
        }
    }

    fn make_ready(&mut self, key: ChannelKey) {
        if let Some(c) = self.send.get_mut(&key) {
            if !c.queued && c.has_more() {
                c.queued = true;
                self.ready[key.src as usize].push_back(key);
            }
        }
    }

    /// Drops every channel of endpoint `endpoint` of node `node` (it was
    /// destroyed; its messages have no one to go back to).
    pub fn forget_endpoint(&mut self, node: u32, endpoint: u32) {
        self.send
            .retain(|k, _| !(k.src == node && k.endpoint == endpoint));
        self.ready[node as usize].retain(|k| k.endpoint != endpoint);
        if let Some((msgs, _)) = self.held.remove(&(node, endpoint)) {
            self.in_flight = self.in_flight.saturating_sub(msgs as usize);
        }
    }

    /// Whether node `n` has a packet to send.
    pub fn wants_to_send(&self, n: u32) -> bool {
        !self.control[n as usize].is_empty() || !self.ready[n as usize].is_empty()
    }

    /// Whether any message is unacknowledged or any packet waits.
    pub fn busy(&self) -> bool {
        self.in_flight > 0 || self.control_waiting > 0
    }

    /// The next packet node `n` sends, if any may go at `now`: an ACK or
    /// NACK first, else the next fragment of the channel whose turn it is.
    pub fn next_packet(&mut self, n: u32, now: Nanos) -> Option<Packet> {
        if let Some(p) = self.control[n as usize].pop_front() {
            self.control_waiting -= 1;
            return Some(p);
        }
        let ready = &mut self.ready[n as usize];
        for _ in 0..ready.len() {
            let key = ready.pop_front()?;
            let Some(c) = self.send.get_mut(&key) else {
                continue;
            };
            if c.hold_until > now {
                // Held after a NACK: its timer puts it back.
                c.queued = false;
                self.timers.push(Reverse((c.hold_until, key)));
                continue;
            }
            if !c.has_more() {
                c.queued = false;
                continue;
            }
            let u = &c.unacked[c.sent];
            let len = u.msg.bytes.len();
            let frags = len.div_ceil(c.mtu as usize).max(1);
            let off = c.frag as usize * c.mtu as usize;
            let end = (off + c.mtu as usize).min(len);
            let mut p = Packet::new(packet::DATA);
            let h = &mut p.header;
            h.src_node = key.src.into();
            h.dst_node = key.dst.into();
            h.src_endpoint = key.endpoint.into();
            h.src_port = u.msg.src_port.into();
            h.dst_port = key.port.into();
            h.epoch = c.epoch.into();
            h.seq = u.seq.into();
            h.frag = (c.frag as u16).into();
            h.frags = (frags as u16).into();
            h.msg_len = (len as u32).into();
            h.offset = (off as u32).into();
            h.tag = u.msg.tag.into();
            p.payload = u.msg.bytes[off..end].to_vec();
            p.seal();
            let counters = &mut self.counters[n as usize];
            if u.transmitted {
                counters.retransmissions += 1;
            } else {
                counters.data_packets += 1;
            }
            c.frag += 1;
            let whole = c.frag as usize >= frags;
            if whole {
                let u = &mut c.unacked[c.sent];
                if u.transmitted {
                    u.again = true;
                    u.sent_at = None;
                } else {
                    u.transmitted = true;
                    u.sent_at = Some(now);
                }
                c.frag = 0;
                c.sent += 1;
            }
            // The timer runs from a message's last fragment: a message of
            // many packets may take longer to leave (credits, a slow link,
            // a slow host) than a round trip, and must not time out while
            // it leaves. Once running it times the oldest message, as an
            // ACK restarts it (one timer entry per window, not per message).
            if whole && c.deadline.is_none() {
                let d = now + c.timeout;
                c.deadline = Some(d);
                self.timers.push(Reverse((d, key)));
            }
            if c.has_more() {
                ready.push_back(key);
            } else {
                c.queued = false;
            }
            return Some(p);
        }
        None
    }

    /// When the earliest timer is due.
    pub fn next_timer(&self) -> Option<Nanos> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Runs every timer due by `now`: timeouts retransmit (or, past the
    /// retries, return the messages) and NACK hold-offs end.
    pub fn tick(&mut self, now: Nanos, sink: &mut dyn Sink) {
        while let Some(&Reverse((t, key))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(c) = self.send.get_mut(&key) else {
                continue;
            };
            if c.hold_until != 0 && c.hold_until <= now {
                c.hold_until = 0;
                self.make_ready(key);
                continue;
            }
            match c.deadline {
                Some(d) if d <= now && !c.unacked.is_empty() => {}
                _ => continue, // stale entry
            }
            c.timeouts += 1;
            self.counters[key.src as usize].timeouts += 1;
            let retries = if c.unreachable {
                1
            } else {
                self.config.retries
            };
            if c.timeouts > retries {
                self.return_all(key, tx_error::UNREACHABLE, sink);
                continue;
            }
            c.timeout = (c.timeout * 2).min(self.config.max_timeout);
            c.rewind();
            // Timed again when the first message has gone again.
            c.deadline = None;
            self.make_ready(key);
        }
    }

    /// Hands every message channel `key` holds back with `code`, and
    /// starts a new epoch.
    fn return_all(&mut self, key: ChannelKey, code: u16, sink: &mut dyn Sink) {
        let epoch = self.new_epoch();
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        let msgs: Vec<Unacked> = c.unacked.drain(..).collect();
        c.epoch = epoch;
        c.next_seq = 0;
        c.sent = 0;
        c.frag = 0;
        c.deadline = None;
        c.hold_until = 0;
        c.timeouts = 0;
        c.nacks = 0;
        c.timeout = c.base_timeout;
        c.unreachable = code == tx_error::UNREACHABLE;
        self.counters[key.src as usize].returned += msgs.len() as u64;
        let bytes = msgs.iter().map(|u| u.msg.bytes.len()).sum();
        self.release(&key, msgs.len() as u32, bytes);
        for u in msgs {
            sink.returned(key, u.msg, code);
        }
    }

    /// Returns the oldest message of channel `key` with `code` and sends
    /// the rest again in a new epoch.
    fn return_first(&mut self, key: ChannelKey, code: u16, sink: &mut dyn Sink) {
        let epoch = self.new_epoch();
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        let Some(first) = c.unacked.pop_front() else {
            return;
        };
        c.epoch = epoch;
        for (i, u) in c.unacked.iter_mut().enumerate() {
            u.seq = i as u32;
        }
        c.next_seq = c.unacked.len() as u32;
        c.rewind();
        c.timeouts = 0;
        c.nacks = 0;
        c.hold_until = 0;
        c.timeout = c.base_timeout;
        c.deadline = None;
        self.counters[key.src as usize].returned += 1;
        self.release(&key, 1, first.msg.bytes.len());
        sink.returned(key, first.msg, code);
        self.make_ready(key);
    }

    /// Takes a packet that reached node `n`.
    pub fn receive(&mut self, n: u32, p: Packet, now: Nanos, sink: &mut dyn Sink) {
        let h = p.header;
        if h.dst_node.get() != n {
            self.counters[n as usize].malformed_dropped += 1;
            return;
        }
        match h.kind.get() {
            packet::DATA => self.receive_data(n, p, now, sink),
            packet::ACK | packet::NACK => {
                // The channel as the DATA named it: its ends swapped back.
                let key = ChannelKey {
                    src: n,
                    endpoint: h.src_endpoint.get(),
                    dst: h.src_node.get(),
                    port: h.dst_port.get(),
                };
                if h.kind.get() == packet::ACK {
                    self.receive_ack(key, h.epoch.get(), h.seq.get(), now, sink);
                } else {
                    self.counters[n as usize].nacks_received += 1;
                    self.receive_nack(key, h.epoch.get(), h.seq.get(), h.code.get(), now, sink);
                }
            }
            _ => self.counters[n as usize].malformed_dropped += 1,
        }
    }

    fn receive_ack(
        &mut self,
        key: ChannelKey,
        epoch: u32,
        seq: u32,
        now: Nanos,
        sink: &mut dyn Sink,
    ) {
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        if c.epoch != epoch {
            return;
        }
        let mut progress = false;
        let (mut done, mut done_bytes) = (0u32, 0usize);
        while c.unacked.front().is_some_and(|u| !before(seq, u.seq)) {
            let Some(u) = c.unacked.pop_front() else {
                break;
            };
            progress = true;
            done += 1;
            done_bytes += u.msg.bytes.len();
            if c.sent > 0 {
                c.sent -= 1;
            } else {
                c.frag = 0;
            }
            if let (Some(t), false) = (u.sent_at, u.again) {
                let sample = now.saturating_sub(t);
                let (srtt, var) = match c.srtt {
                    None => (sample, sample / 2),
                    Some((srtt, var)) => (
                        (7 * srtt + sample) / 8,
                        (3 * var + srtt.abs_diff(sample)) / 4,
                    ),
                };
                c.srtt = Some((srtt, var));
                c.base_timeout = c.floor.max(srtt + 4 * var).min(self.config.max_timeout);
            }
            sink.acked(key, u.msg);
        }
        if progress {
            c.unreachable = false;
            c.timeouts = 0;
            c.nacks = 0;
            c.timeout = c.base_timeout;
            c.deadline = None;
            if c.sent > 0 {
                // Transmitted messages still wait: time the oldest afresh.
                let d = now + c.timeout;
                c.deadline = Some(d);
                self.timers.push(Reverse((d, key)));
            }
        }
        self.release(&key, done, done_bytes);
    }

    fn receive_nack(
        &mut self,
        key: ChannelKey,
        epoch: u32,
        seq: u32,
        code: u16,
        now: Nanos,
        sink: &mut dyn Sink,
    ) {
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        if c.epoch != epoch || c.unacked.front().is_none_or(|u| u.seq != seq) {
            return; // about a message already settled
        }
        if code != tx_error::NO_BUFFER {
            self.return_first(key, code, sink);
            return;
        }
        c.nacks += 1;
        c.timeouts = 0;
        c.unreachable = false;
        if c.nacks > self.config.nack_retries {
            self.return_all(key, tx_error::NO_BUFFER, sink);
            return;
        }
        let wait = (NACK_BACKOFF << c.nacks.min(20)).min(MAX_NACK_BACKOFF);
        c.hold_until = now + wait;
        c.rewind();
        let d = c.hold_until + c.timeout;
        c.deadline = Some(d);
        self.timers.push(Reverse((c.hold_until, key)));
        self.timers.push(Reverse((d, key)));
    }

    /// Takes the one-way delays recorded since the last call: from when the
    /// transport took a message to when it was delivered, for messages
    /// sent and received on this device, sent once.
    pub fn take_delays(&mut self) -> Vec<Nanos> {
        self.delays.drain(..).collect()
    }

    fn receive_data(&mut self, n: u32, p: Packet, now: Nanos, sink: &mut dyn Sink) {
        let h = p.header;
        let (frag, frags, msg_len, off) = (
            h.frag.get(),
            h.frags.get(),
            h.msg_len.get(),
            h.offset.get() as u64,
        );
        let counters = &mut self.counters[n as usize];
        if frags == 0
            || frag >= frags
            || msg_len > MAX_MESSAGE
            || off + p.payload.len() as u64 > u64::from(msg_len)
        {
            counters.malformed_dropped += 1;
            return;
        }
        let key = ChannelKey {
            src: h.src_node.get(),
            endpoint: h.src_endpoint.get(),
            dst: n,
            port: h.dst_port.get(),
        };
        let (epoch, seq) = (h.epoch.get(), h.seq.get());
        let ch = self.recv.entry(key).or_default();
        if epoch != ch.epoch {
            if before(epoch, ch.epoch) && ch.epoch != 0 {
                counters.stale_dropped += 1;
                return;
            }
            if seq != 0 {
                counters.out_of_order_dropped += 1;
                return;
            }
            *ch = RecvChannel {
                epoch,
                next: 0,
                assembly: None,
            };
        }
        if before(seq, ch.next) {
            counters.duplicates_dropped += 1;
            if frag + 1 == frags {
                let last = ch.next.wrapping_sub(1);
                self.control_packet(key, epoch, last, packet::ACK, 0);
            }
            return;
        }
        if seq != ch.next {
            counters.out_of_order_dropped += 1;
            return;
        }
        let a = match &mut ch.assembly {
            Some(a) if a.seq == seq && a.frags == frags && a.bytes.len() == msg_len as usize => a,
            slot => slot.insert(Assembly {
                seq,
                frags,
                got: vec![false; frags as usize],
                missing: u32::from(frags),
                bytes: vec![0; msg_len as usize],
            }),
        };
        if a.got[frag as usize] {
            counters.duplicates_dropped += 1;
            return;
        }
        a.got[frag as usize] = true;
        a.missing -= 1;
        a.bytes[off as usize..off as usize + p.payload.len()].copy_from_slice(&p.payload);
        if a.missing > 0 {
            return;
        }
        let Some(done) = ch.assembly.take() else {
            return;
        };
        let r = sink.deliver(
            n,
            key.port,
            key.src,
            h.src_port.get(),
            h.tag.get(),
            &done.bytes,
        );
        match r {
            Ok(()) => {
                ch.next = ch.next.wrapping_add(1);
                self.counters[n as usize].messages_delivered += 1;
                let first = self.send.get(&key).and_then(|c| c.unacked.front());
                if let Some(u) = first.filter(|u| u.seq == seq && !u.again) {
                    if self.delays.len() == MAX_DELAYS {
                        self.delays.pop_front();
                    }
                    self.delays.push_back(now.saturating_sub(u.submitted_at));
                }
                self.control_packet(key, epoch, seq, packet::ACK, 0);
            }
            // No buffer: dropped, and tried again. A refusal: the channel
            // stays at this message until the sender starts a new epoch.
            Err(code) => {
                if code == tx_error::NO_ENDPOINT {
                    // Nothing to keep for a port nobody holds: a guest
                    // writing to every port number leaves no state here.
                    self.recv.remove(&key);
                }
                self.control_packet(key, epoch, seq, packet::NACK, code)
            }
        }
    }

    /// Queues an ACK or NACK from the receiver of channel `key`.
    fn control_packet(&mut self, key: ChannelKey, epoch: u32, seq: u32, kind: u16, code: u16) {
        let counters = &mut self.counters[key.dst as usize];
        let q = &mut self.control[key.dst as usize];
        if q.len() >= MAX_CONTROL_BACKLOG {
            counters.control_dropped += 1;
            return;
        }
        if kind == packet::ACK {
            counters.acks_sent += 1;
        } else {
            counters.nacks_sent += 1;
        }
        let mut p = Packet::new(kind);
        let h = &mut p.header;
        h.src_node = key.dst.into();
        h.dst_node = key.src.into();
        h.src_endpoint = key.endpoint.into();
        h.dst_port = key.port.into();
        h.epoch = epoch.into();
        h.seq = seq.into();
        h.code = code.into();
        p.seal();
        q.push_back(p);
        self.control_waiting += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that records everything; endpoint 9 of every node refuses,
    /// and a node's buffers run out while `full` says so.
    #[derive(Default)]
    struct Record {
        delivered: Vec<(u32, u32, Vec<u8>)>,
        acked: Vec<u64>,
        returned: Vec<(u64, u16)>,
        full: bool,
    }

    impl Sink for Record {
        fn deliver(
            &mut self,
            dst: u32,
            port: u32,
            src: u32,
            _: u32,
            _: u32,
            b: &[u8],
        ) -> Result<(), u16> {
            if port == 9 {
                return Err(tx_error::NO_ENDPOINT);
            }
            if self.full {
                return Err(tx_error::NO_BUFFER);
            }
            self.delivered.push((src, dst, b.to_vec()));
            Ok(())
        }
        fn acked(&mut self, _: ChannelKey, m: Message) {
            self.acked.push(m.user_id);
        }
        fn returned(&mut self, _: ChannelKey, m: Message, code: u16) {
            self.returned.push((m.user_id, code));
        }
    }

    fn msg(id: u64, len: usize) -> Message {
        Message {
            src_port: 1,
            tag: 0,
            user_id: id,
            completion: true,
            bytes: (0..len).map(|i| (i as u64 * 7 + id) as u8).collect(),
        }
    }

    /// Two nodes' transport and its clock.
    struct Net {
        t: Transport,
        now: Nanos,
        sent: u64,
    }

    impl Net {
        fn new(cfg: TransportConfig) -> Net {
            Net {
                t: Transport::new(2, cfg),
                now: 0,
                sent: 0,
            }
        }

        /// Moves packets between the nodes for `span` ns, in 10 us steps;
        /// `lose(i)` drops the i-th packet sent.
        fn run(&mut self, sink: &mut Record, mut lose: impl FnMut(u64) -> bool, span: Nanos) {
            let until = self.now + span;
            while self.now < until {
                for n in 0..2 {
                    while let Some(p) = self.t.next_packet(n, self.now) {
                        self.sent += 1;
                        if !lose(self.sent) {
                            let to = p.header.dst_node.get();
                            self.t.receive(to, p, self.now, sink);
                        }
                    }
                }
                self.t.tick(self.now, sink);
                self.now += 10_000;
            }
        }
    }

    const KEY: ChannelKey = ChannelKey {
        src: 0,
        endpoint: 0,
        dst: 1,
        port: 1,
    };

    #[test]
    fn messages_arrive_once_and_in_order_through_loss() {
        let mut net = Net::new(TransportConfig::default());
        let mut s = Record::default();
        let mut submitted = 0;
        let mut r = 1u64;
        for _ in 0..400 {
            while net.t.has_room(&KEY, 3000) && submitted < 500 {
                net.t.submit(KEY, msg(submitted, 3000), 0, || (1024, 0));
                submitted += 1;
            }
            // Lose about a fifth, pseudo-randomly.
            let lose = |_| {
                r = r.wrapping_mul(6364136223846793005).wrapping_add(1);
                (r >> 33).is_multiple_of(5)
            };
            net.run(&mut s, lose, 2_000_000);
        }
        assert_eq!(s.delivered.len(), 500, "each delivered exactly once");
        for (i, (_, _, b)) in s.delivered.iter().enumerate() {
            assert_eq!(
                b,
                &msg(i as u64, 3000).bytes,
                "message {i} out of order or damaged"
            );
        }
        assert_eq!(s.acked, (0..500).collect::<Vec<_>>());
        assert!(s.returned.is_empty());
        let c = &net.t.counters;
        assert!(c[0].retransmissions > 0 && c[0].timeouts > 0, "{c:?}");
        assert!(
            c[1].duplicates_dropped + c[1].out_of_order_dropped > 0,
            "{c:?}"
        );
    }

    #[test]
    fn a_full_receiver_is_retried_not_failed() {
        let mut net = Net::new(TransportConfig::default());
        let mut s = Record {
            full: true,
            ..Default::default()
        };
        net.t.submit(KEY, msg(1, 10), 0, || (1024, 0));
        net.run(&mut s, |_| false, 3_000_000);
        assert!(s.delivered.is_empty() && s.returned.is_empty());
        assert!(net.t.counters[0].nacks_received > 3);
        s.full = false;
        net.run(&mut s, |_| false, 3_000_000);
        assert_eq!(s.delivered.len(), 1);
        assert_eq!(s.acked, [1]);
    }

    #[test]
    fn a_refusal_returns_that_message_and_the_rest_go_on() {
        let mut net = Net::new(TransportConfig::default());
        let mut s = Record::default();
        let bad = ChannelKey { port: 9, ..KEY };
        net.t.submit(bad, msg(1, 10), 0, || (1024, 0));
        net.t.submit(bad, msg(3, 10), 0, || (1024, 0));
        net.t.submit(KEY, msg(2, 10), 0, || (1024, 0));
        net.run(&mut s, |_| false, 1_000_000);
        let no = tx_error::NO_ENDPOINT;
        assert_eq!(s.returned, [(1, no), (3, no)]);
        assert_eq!(s.acked, [2]);
    }

    #[test]
    fn an_unreachable_destination_gets_every_message_returned() {
        let cfg = TransportConfig {
            retries: 3,
            ..Default::default()
        };
        let mut net = Net::new(cfg);
        let mut s = Record::default();
        for i in 0..5 {
            net.t.submit(KEY, msg(i, 10), 0, || (1024, 0));
        }
        net.run(&mut s, |_| true, 100_000_000);
        let ids: Vec<u64> = s.returned.iter().map(|r| r.0).collect();
        assert_eq!(ids, [0, 1, 2, 3, 4]);
        assert!(s.returned.iter().all(|r| r.1 == tx_error::UNREACHABLE));
        assert_eq!(net.t.counters[0].timeouts, 4);
        // Known unreachable: the next message comes back after one retry.
        net.t.submit(KEY, msg(5, 10), 0, || (1024, 0));
        net.run(&mut s, |_| true, 5_000_000);
        assert_eq!(s.returned.last(), Some(&(5, tx_error::UNREACHABLE)));
        assert_eq!(net.t.counters[0].timeouts, 6);
        // The channel works again in its new epoch once the path does.
        net.t.submit(KEY, msg(7, 10), 0, || (1024, 0));
        net.run(&mut s, |_| false, 1_000_000);
        assert_eq!(s.acked, [7]);
    }
}
