//! VN's reliable transport between nodes (spec §10.4; Chun, Mainwaring
//! and Culler, IEEE Micro 1998, §4.2-4.4), kept per channel: one channel
//! per (source endpoint, destination node and port, class), so order holds
//! per pair of endpoints and one full receiver never blocks another.
//!
//! A channel carries whole messages in order with a window: every
//! message carries the channel's epoch and a sequence number and is cut
//! into fragments at the path MTU; the receiver reassembles the expected
//! message and up to a window of later ones (kept early), hands them to
//! the node in order and acknowledges each (cumulative ACK). A packet
//! that arrives past a hole draws a SACK naming the holes, and the
//! sender sends just those fragments again (selective repeat), again
//! only once the SACK shows a repair was lost. A receiver with no buffer
//! answers NACK and the sender tries again after a back-off; a refusal
//! that retrying cannot cure (no endpoint, filter, buffer too small, a
//! cookie refused) is answered with a NACK carrying the reason, and the
//! sender returns that message and goes on in a new epoch. With no answer
//! at all the sender times out (the timeout doubles): the first time it
//! sends the oldest message and the newest's last fragment again, after
//! that everything from the oldest on; after `retries` timeouts it
//! returns every message it holds to their sender (return-to-sender),
//! starts a new epoch and marks the destination node unreachable.
//!
//! A message is a send, an out-of-band message or a remote access (its
//! `opcode`, which also names the channel's class). A read is answered by
//! RESPONSE packets instead of an ACK; nothing after a read is sent until
//! it is answered, except further reads, so a read never sees what a later
//! write of its channel put there and a lost answer is recovered by
//! serving the read again.
//!
//! `send` holds the sender's side of a channel, `receive` the receiver's
//! and the answers a node sends back.

mod receive;
mod send;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

use ulnic_abi::wire::{self, RemoteAccess};
use ulnic_abi::{op, packet};

use crate::fabric::link::Nanos;
use crate::fabric::packet::Packet;
use receive::{RecvChannel, Response};
use send::SendChannel;

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
/// Payload bytes one node may hold in messages reassembled ahead of the
/// one their channel expects (spec §10.4); past this early packets are
/// dropped and sent again.
pub const MAX_EARLY_BYTES: usize = 64 << 20;
/// RESPONSE bytes one node may have waiting to leave (spec §10.4); a read
/// past this is NACKed for want of a buffer and retried.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// What a channel carries, from the opcode of its messages (spec §10.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Sends, close messages included, to one port.
    Messages,
    /// Out-of-band messages to one port.
    Urgent,
    /// Remote accesses to one node.
    Memory,
}

impl Class {
    /// The class of a message of `opcode`.
    pub fn of(opcode: u16) -> Class {
        match opcode {
            op::OOB => Class::Urgent,
            op::RDMA_WRITE | op::RDMA_READ | op::WRITE_IMMEDIATE | op::PIO_SYNC => Class::Memory,
            _ => Class::Messages,
        }
    }
}

/// A channel: the sending endpoint (node and index), the destination and
/// the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelKey {
    /// Source node.
    pub src: u32,
    /// The sending endpoint's index on `src`.
    pub endpoint: u32,
    /// Destination node.
    pub dst: u32,
    /// Destination port (0 for the memory class).
    pub port: u32,
    /// What it carries.
    pub class: Class,
}

impl ChannelKey {
    /// The channel a message of `opcode` from endpoint `endpoint` of node
    /// `src` to `(dst, port)` takes.
    pub fn new(src: u32, endpoint: u32, dst: u32, port: u32, opcode: u16) -> ChannelKey {
        let class = Class::of(opcode);
        ChannelKey {
            src,
            endpoint,
            dst,
            port: if class == Class::Memory { 0 } else { port },
            class,
        }
    }
}

/// A message in the transport's care.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// What it is: a send-ring opcode (SEND, OOB, RDMA_WRITE, RDMA_READ,
    /// WRITE_IMMEDIATE).
    pub opcode: u16,
    /// Receive flags it arrives with (CLOSE).
    pub flags: u16,
    /// The sending endpoint's session id.
    pub session: u32,
    /// The sender's port, stamped.
    pub src_port: u32,
    /// The sender's tag.
    pub tag: u32,
    /// The send descriptor's user id.
    pub user_id: u64,
    /// The sender asked for a completion event.
    pub completion: bool,
    /// The payload (a remote access: its header, then a write's bytes).
    pub bytes: Vec<u8>,
    /// The NIC's own bookkeeping for it (0: none); the transport only
    /// hands it back.
    pub handle: u64,
    /// Where a piece of an access starts in the whole access.
    pub offset: u64,
    /// Never returned for want of a buffer (a close message).
    pub patient: bool,
}

impl Message {
    /// The bytes a read's RESPONSE brings (0 for anything else).
    pub fn response_len(&self) -> u32 {
        if self.opcode != op::RDMA_READ {
            return 0;
        }
        wire::read::<RemoteAccess>(&self.bytes).len.get()
    }
}

/// A complete message as its receiving node gets it.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// Receiving node.
    pub dst: u32,
    /// Destination port (0 for a remote access).
    pub port: u32,
    /// Sending node.
    pub src: u32,
    /// Sending endpoint's port.
    pub src_port: u32,
    /// The sender's tag.
    pub tag: u32,
    /// What it is.
    pub opcode: u16,
    /// Receive flags it arrives with.
    pub flags: u16,
    /// The sending endpoint's session id.
    pub session: u32,
    /// The payload.
    pub bytes: &'a [u8],
}

/// What a delivered message gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivered {
    /// Carried out: acknowledge it.
    Done,
    /// A read: these bytes go back in RESPONSE packets.
    Read(Vec<u8>),
}

/// Where the transport's outcomes go: the NIC.
pub trait Sink {
    /// Carries out a complete message at its receiving node: `Ok`, or the
    /// `tx_error` code why not (`NO_BUFFER` is retried).
    fn deliver(&mut self, a: &Arrival<'_>) -> Result<Delivered, u16>;
    /// Bytes of read `msg`'s answer arrived, `at` bytes into it.
    fn read_data(&mut self, key: ChannelKey, msg: &Message, at: u32, bytes: &[u8]);
    /// The message was delivered (a read: answered in full).
    fn acked(&mut self, key: ChannelKey, msg: Message);
    /// The message was not delivered and comes back, with the reason.
    fn returned(&mut self, key: ChannelKey, msg: Message, code: u16);
    /// Node `node` marked node `lost` unreachable: its endpoints
    /// `endpoints` had channels to it, and `ports` received from it.
    fn unreachable(&mut self, node: u32, lost: u32, endpoints: &[u32], ports: &[u32]);
    /// How many more messages of `len` bytes the endpoint bound to `port`
    /// on node `dst` could take now (an ACK's room, spec §10.4).
    fn room(&mut self, _dst: u32, _port: u32, _len: usize) -> u32 {
        NO_ROOM_BOUND
    }
    /// Whether an endpoint is bound to `port` on node `dst`.
    fn bound(&mut self, _dst: u32, _port: u32) -> bool {
        true
    }
}

/// An ACK's room when it sets no bound.
pub const NO_ROOM_BOUND: u32 = u32::MAX;

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
    /// RESPONSE packets sent (answers to reads, again included).
    pub responses_sent: u64,
    /// NACKs received.
    pub nacks_received: u64,
    /// ROOM packets sent: a sender held by the receiver's room asking.
    pub room_asks: u64,
    /// Packets of messages already delivered, dropped.
    pub duplicates_dropped: u64,
    /// Packets too far ahead of the next expected message to keep
    /// (beyond the window or the early budget), dropped.
    pub out_of_order_dropped: u64,
    /// Packets of an old epoch, dropped.
    pub stale_dropped: u64,
    /// Packets that make no sense (lengths, fragments, headers), dropped.
    pub malformed_dropped: u64,
    /// Messages returned to their sender.
    pub returned: u64,
    /// ACKs or NACKs dropped because too many waited to leave.
    pub control_dropped: u64,
    /// Packets the node could not send for want of a route (before the
    /// first map, or to a node the mapper did not find).
    pub unrouted: u64,
    /// Operations carried by the shortcut (spec §10), not in packets.
    pub shortcuts: u64,
    /// Times a destination node was marked unreachable.
    pub unreachable: u64,
}

summable!(TransportCounters {
    messages_sent,
    messages_delivered,
    data_packets,
    retransmissions,
    timeouts,
    acks_sent,
    nacks_sent,
    responses_sent,
    nacks_received,
    room_asks,
    duplicates_dropped,
    out_of_order_dropped,
    stale_dropped,
    malformed_dropped,
    returned,
    control_dropped,
    unrouted,
    shortcuts,
    unreachable
});

/// The transport of every node of one fabric.
pub struct Transport {
    config: TransportConfig,
    send: HashMap<ChannelKey, SendChannel>,
    recv: HashMap<ChannelKey, RecvChannel>,
    /// Per node: channels with something to transmit, served in turn.
    ready: Vec<VecDeque<ChannelKey>>,
    /// Per node: ACKs and NACKs waiting to leave (they go first).
    control: Vec<VecDeque<Packet>>,
    /// Per node: answers to reads waiting to leave, and their bytes.
    responses: Vec<VecDeque<Response>>,
    response_bytes: Vec<usize>,
    /// Per node: payload bytes held in reassembly (`MAX_EARLY_BYTES`
    /// bounds the part ahead of what channels expect).
    early_bytes: Vec<usize>,
    /// Per node: whether an answer goes before data next (they take turns).
    answer_next: Vec<bool>,
    /// The payload size of RESPONSE packets (the fabric's smallest MTU:
    /// the way back may differ from the way there).
    response_mtu: u32,
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
    /// (node, destination) pairs marked unreachable, until heard from.
    lost: HashSet<(u32, u32)>,
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
    /// The transport of `nodes` nodes; reads are answered in packets of
    /// `response_mtu` payload bytes.
    pub fn new(nodes: u32, config: TransportConfig, response_mtu: u32) -> Transport {
        let per_node = |_| VecDeque::new();
        Transport {
            config,
            send: HashMap::new(),
            recv: HashMap::new(),
            ready: (0..nodes).map(per_node).collect(),
            control: (0..nodes).map(|_| VecDeque::new()).collect(),
            responses: (0..nodes).map(|_| VecDeque::new()).collect(),
            response_bytes: vec![0; nodes as usize],
            early_bytes: vec![0; nodes as usize],
            answer_next: vec![false; nodes as usize],
            response_mtu: response_mtu.max(1),
            timers: BinaryHeap::new(),
            next_epoch: first_epoch(),
            counters: vec![TransportCounters::default(); nodes as usize],
            delays: VecDeque::new(),
            held: HashMap::new(),
            in_flight: 0,
            control_waiting: 0,
            lost: HashSet::new(),
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

    /// Whether channel `key` holds nothing: a message may then take the
    /// shortcut without overtaking one of its channel (spec §10).
    pub fn idle(&self, key: &ChannelKey) -> bool {
        // Nothing held anywhere (the common case on ideal paths): no
        // lookup on the send path.
        self.in_flight == 0 || self.send.get(key).is_none_or(|c| c.unacked.is_empty())
    }

    /// Counts an operation node `n` carried by the shortcut.
    pub fn count_shortcut(&mut self, n: u32) {
        if let Some(c) = self.counters.get_mut(n as usize) {
            c.shortcuts += 1;
        }
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
            if !c.queued && c.can_send() {
                c.queued = true;
                self.ready[key.src as usize].push_back(key);
            }
        }
    }

    /// Whether node `n` has a packet to send.
    pub fn wants_to_send(&self, n: u32) -> bool {
        let n = n as usize;
        !self.control[n].is_empty() || !self.ready[n].is_empty() || !self.responses[n].is_empty()
    }

    /// Whether any message is unacknowledged or any packet waits.
    pub fn busy(&self) -> bool {
        self.in_flight > 0 || self.control_waiting > 0 || self.response_bytes.iter().any(|&b| b > 0)
    }

    /// The next packet node `n` sends, if any may go at `now`: an ACK or
    /// NACK first, then answers to reads and data in turn.
    pub fn next_packet(&mut self, n: u32, now: Nanos) -> Option<Packet> {
        let i = n as usize;
        if let Some(p) = self.control[i].pop_front() {
            self.control_waiting -= 1;
            return Some(p);
        }
        if !self.responses[i].is_empty() && (self.answer_next[i] || self.ready[i].is_empty()) {
            self.answer_next[i] = false;
            return self.next_response(n);
        }
        self.answer_next[i] = true;
        self.next_data(n, now).or_else(|| self.next_response(n))
    }

    /// When the earliest timer is due.
    pub fn next_timer(&self) -> Option<Nanos> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Takes the one-way delays recorded since the last call: from when the
    /// transport took a message to when it was delivered, for messages
    /// sent and received on this device, sent once.
    pub fn take_delays(&mut self) -> Vec<Nanos> {
        self.delays.drain(..).collect()
    }

    fn record_delay(&mut self, d: Nanos) {
        if self.delays.len() == MAX_DELAYS {
            self.delays.pop_front();
        }
        self.delays.push_back(d);
    }

    /// Takes a packet that reached node `n`.
    pub fn receive(&mut self, n: u32, p: Packet, now: Nanos, sink: &mut dyn Sink) {
        let h = p.header;
        if h.dst_node.get() != n || h.src_node.get() as usize >= self.counters.len() {
            self.counters[n as usize].malformed_dropped += 1;
            return;
        }
        // Anything from a node shows it can be reached again.
        self.lost.remove(&(n, h.src_node.get()));
        match h.kind.get() {
            packet::DATA => self.receive_data(n, p, now, sink),
            packet::ROOM => self.answer_room(n, &h, sink),
            packet::ACK | packet::NACK | packet::RESPONSE => {
                // The channel as the DATA named it: its ends swapped back.
                let key = ChannelKey {
                    src: n,
                    endpoint: h.src_endpoint.get(),
                    dst: h.src_node.get(),
                    port: h.dst_port.get(),
                    class: Class::of(h.opcode.get()),
                };
                match h.kind.get() {
                    packet::ACK => {
                        let (epoch, seq, room) = (h.epoch.get(), h.seq.get(), h.tag.get());
                        let code = h.code.get();
                        let holes: &[u8] = if code == packet::ACK_GAP {
                            &p.payload
                        } else {
                            &[]
                        };
                        self.receive_ack(key, (epoch, seq), code, holes, room, now, sink)
                    }
                    packet::NACK => {
                        self.counters[n as usize].nacks_received += 1;
                        let (epoch, seq, code) = (h.epoch.get(), h.seq.get(), h.code.get());
                        self.receive_nack(key, epoch, seq, code, now, sink);
                    }
                    _ => self.receive_response(key, &p, now, sink),
                }
            }
            _ => self.counters[n as usize].malformed_dropped += 1,
        }
    }

    /// Node `n` gave up on node `lost`: marks it, and tells the NIC which
    /// endpoints talked to it (once per mark).
    fn mark_lost(&mut self, n: u32, lost: u32, sink: &mut dyn Sink) {
        if !self.lost.insert((n, lost)) {
            return;
        }
        self.counters[n as usize].unreachable += 1;
        // What node n reassembles from the lost node would wait for
        // packets that come again in a new epoch, if ever: its budget goes
        // back to the other channels.
        let mut freed = 0;
        for (_, ch) in self
            .recv
            .iter_mut()
            .filter(|(k, _)| k.src == lost && k.dst == n)
        {
            freed += ch.drop_pending();
        }
        self.early_bytes[n as usize] = self.early_bytes[n as usize].saturating_sub(freed);
        let mut endpoints: Vec<u32> = self
            .send
            .keys()
            .filter(|k| k.src == n && k.dst == lost)
            .map(|k| k.endpoint)
            .collect();
        endpoints.sort_unstable();
        endpoints.dedup();
        let mut ports: Vec<u32> = self
            .recv
            .keys()
            .filter(|k| k.src == lost && k.dst == n && k.class != Class::Memory)
            .map(|k| k.port)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        sink.unreachable(n, lost, &endpoints, &ports);
    }

    /// Whether node `n` has marked node `d` unreachable.
    fn is_lost(&self, n: u32, d: u32) -> bool {
        self.lost.contains(&(n, d))
    }
}
