//! The sender's side of a channel: messages numbered and cut into DATA
//! packets, the window, timeouts and retransmission, ACKs, NACKs and the
//! RESPONSE packets that answer reads, and return to sender.

use std::cmp::Reverse;
use std::collections::VecDeque;

use ulnic_abi::wire::SackHole;
use ulnic_abi::{op, packet, tx_error};
use zerocopy::FromBytes;

use super::{
    before, ChannelKey, Message, Sink, Transport, MAX_NACK_BACKOFF, MAX_SEND_CHANNELS,
    NACK_BACKOFF, NO_ROOM_BOUND,
};

/// The shortest wait, after the last SACK, before the oldest message's
/// repairs go again unasked (a probe).
const MIN_PROBE_WAIT: Nanos = 100_000;
/// A fragment's `repaired_tx` while it waits to go again.
const QUEUED: u64 = u64::MAX;
use crate::fabric::link::Nanos;
use crate::fabric::packet::Packet;

/// The fragments of a read's answer that came.
struct Answer {
    got: Vec<bool>,
    missing: u32,
}

pub(super) struct Unacked {
    seq: u32,
    pub(super) msg: Message,
    /// When its last fragment was first handed to the link; `None` once it
    /// is sent again (Karn: a retransmitted message gives no RTT sample).
    sent_at: Option<Nanos>,
    /// Sent in full at least once: sending it again is a retransmission.
    transmitted: bool,
    /// Sent more than once.
    again: bool,
    /// When the transport took it from the send ring.
    submitted_at: Nanos,
    /// A read: what came of its answer.
    answer: Option<Answer>,
    /// The channel's `tx` when its first fragment first left (0: not yet).
    first_tx: u64,
    /// Per fragment, the channel's `tx` when it last went again
    /// (`QUEUED` while it waits to; empty until a fragment goes again).
    repaired_tx: Vec<u64>,
}

impl Unacked {
    fn is_read(&self) -> bool {
        self.msg.opcode == op::RDMA_READ
    }
}

pub(super) struct SendChannel {
    epoch: u32,
    next_seq: u32,
    /// In sequence order; the front is the oldest unacknowledged.
    pub(super) unacked: VecDeque<Unacked>,
    /// Messages at the front already transmitted in this round.
    sent: usize,
    /// The next fragment of `unacked[sent]` to transmit.
    frag: u32,
    /// Fragments a SACK asked for again (sequence number, fragment): they
    /// go before anything new.
    repairs: VecDeque<(u32, u16)>,
    /// When to send the oldest message's repairs again if it is still
    /// not settled (a lost repair, with nothing else arriving to draw
    /// another SACK).
    probe_at: Option<Nanos>,
    /// When a SACK last arrived: a message sent before it may have waited
    /// at the receiver behind a hole, so its ACK gives no RTT sample.
    sacked_at: Nanos,
    /// DATA packets sent so far: the order packets left in, which SACKs
    /// are read against.
    tx: u64,
    /// Reads among the first `sent`: until they are answered only reads
    /// may follow them.
    reads_out: usize,
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
    /// The receiver's room from its last ACK: no message numbered this or
    /// later leaves while another is in flight (`None`: no bound).
    room_end: Option<u32>,
    timeouts: u32,
    nacks: u32,
    /// ROOM packets sent since an answer last gave room (spec §10.4).
    room_asks: u32,
    /// In the node's ready queue.
    pub(super) queued: bool,
    /// Its messages were last returned unreachable and nothing has been
    /// heard since: further ones get one retry, not `retries`, so a sender
    /// to a partitioned node gets them back in milliseconds.
    unreachable: bool,
}

impl SendChannel {
    /// Whether its next message may go now: there is one, and it is a
    /// read or no read before it waits for its answer.
    /// The receiver's room must allow it too, unless nothing is in flight
    /// (then `must_ask_room` says whether it asks first).
    pub(super) fn can_send(&self) -> bool {
        !self.repairs.is_empty()
            || self.unacked.get(self.sent).is_some_and(|u| {
                (self.reads_out == 0 || u.is_read())
                    && (self.sent == 0 || self.room_end.is_none_or(|end| before(u.seq, end)))
            })
    }

    /// Whether the next message is beyond the receiver's room with nothing
    /// in flight: the channel asks (a ROOM packet) instead of sending it.
    fn must_ask_room(&self) -> bool {
        self.repairs.is_empty()
            && self.sent == 0
            && self.frag == 0
            && self.unacked.front().is_some_and(|u| {
                !u.is_read() && self.room_end.is_some_and(|end| !before(u.seq, end))
            })
    }

    /// How long to wait after a NACK or a ROOM, `n` of them in a row:
    /// 5 us doubling, at most 1 ms.
    fn hold_for(n: u32) -> Nanos {
        (NACK_BACKOFF << n.min(20)).min(MAX_NACK_BACKOFF)
    }

    /// A packet of `kind` about message `u` of channel `key`: its
    /// addresses, epoch, number, length and operation (the caller adds
    /// the rest and seals it).
    fn packet_about(&self, kind: u16, key: &ChannelKey, u: &Unacked) -> Packet {
        let mut p = Packet::new(kind);
        let h = &mut p.header;
        h.src_node = key.src.into();
        h.dst_node = key.dst.into();
        h.src_endpoint = key.endpoint.into();
        h.src_port = u.msg.src_port.into();
        h.dst_port = key.port.into();
        h.epoch = self.epoch.into();
        h.seq = u.seq.into();
        h.msg_len = (u.msg.bytes.len() as u32).into();
        h.opcode = u.msg.opcode.into();
        p
    }

    /// The ROOM packet asking for room for the oldest message.
    fn room_packet(&self, key: &ChannelKey) -> Option<Packet> {
        let mut p = self.packet_about(packet::ROOM, key, self.unacked.front()?);
        p.seal();
        Some(p)
    }

    fn rewind(&mut self) {
        self.sent = 0;
        self.frag = 0;
        self.reads_out = 0;
        // Everything goes again: nothing is a repair any more.
        self.repairs.clear();
        for u in &mut self.unacked {
            u.repaired_tx.clear();
        }
    }

    /// Drops the repairs waiting to go: their fragments are no longer
    /// marked as waiting (a fragment is `QUEUED` exactly while it is in
    /// `repairs`).
    fn drop_repairs(&mut self) {
        let repairs = std::mem::take(&mut self.repairs);
        for (seq, f) in repairs {
            let i = self.index_of(seq);
            if let Some(t) = i
                .and_then(|i| self.unacked.get_mut(i))
                .and_then(|u| u.repaired_tx.get_mut(usize::from(f)))
            {
                if *t == QUEUED {
                    *t = 0;
                }
            }
        }
    }

    /// How long a channel that asked for repairs may stay silent before
    /// the oldest message's go again: two smoothed round trips.
    fn probe_wait(&self) -> Nanos {
        (2 * self.srtt.map_or(self.base_timeout / 4, |(srtt, _)| srtt)).max(MIN_PROBE_WAIT)
    }

    /// The probe fell due: if the oldest message was repaired and is still
    /// not settled, its repaired fragments go again (one of them may have
    /// been lost, and nothing else may come to draw a SACK). True if any
    /// did.
    fn probe(&mut self, now: Nanos) -> bool {
        self.probe_at = None;
        if self.sent == 0 {
            return false;
        }
        let wait = self.probe_wait();
        let Some(u) = self.unacked.front_mut().filter(|u| !u.is_read()) else {
            // A read sent again is served again: its answer, or a timeout,
            // settles it.
            return false;
        };
        let seq = u.seq;
        let mut again = false;
        for (f, t) in u.repaired_tx.iter_mut().enumerate() {
            if *t != 0 && *t != QUEUED {
                *t = QUEUED;
                self.repairs.push_back((seq, f as u16));
                again = true;
            }
        }
        if again {
            self.probe_at = Some(now + wait);
        }
        again
    }

    /// Queues every fragment of the oldest message, if it was sent in
    /// full, to go again ahead of anything new, and the last fragment of
    /// the last message sent in full: arriving last, it draws a SACK that
    /// names every hole between. False if nothing was sent in full.
    fn resend_oldest(&mut self) -> bool {
        if self.sent == 0 {
            return false;
        }
        self.drop_repairs();
        for i in [0, self.sent - 1] {
            let frags = self.frags_of(&self.unacked[i]);
            let u = &mut self.unacked[i];
            if u.repaired_tx.len() != frags {
                u.repaired_tx = vec![0; frags];
            }
            let from = if i == 0 { 0 } else { frags - 1 };
            for f in from..frags {
                if u.repaired_tx[f] != QUEUED {
                    u.repaired_tx[f] = QUEUED;
                    self.repairs.push_back((u.seq, f as u16));
                }
            }
        }
        true
    }

    /// Whether fragment `frag` of message `seq` is held and last left in
    /// order (not as a repair).
    fn in_order(&self, seq: u32, frag: u16) -> bool {
        self.index_of(seq)
            .and_then(|i| self.unacked.get(i))
            .is_some_and(|u| {
                u.first_tx != 0 && u.repaired_tx.get(usize::from(frag)).is_none_or(|&t| t == 0)
            })
    }

    /// When (in `tx`) fragment `frag` of message `seq` last left, at the
    /// earliest: 0 if the channel does not hold it.
    fn sent_tx(&self, seq: u32, frag: u16) -> u64 {
        let Some(u) = self.index_of(seq).and_then(|i| self.unacked.get(i)) else {
            return 0;
        };
        match u.repaired_tx.get(usize::from(frag)) {
            Some(&t) if t != 0 && t != QUEUED => t,
            _ if u.first_tx == 0 => 0,
            // Its fragments left in order, perhaps with others between.
            _ => u.first_tx + u64::from(frag),
        }
    }

    /// Where message `seq` would be in `unacked` (sequence numbers are
    /// consecutive from the oldest); `None` when nothing is held.
    fn index_of(&self, seq: u32) -> Option<usize> {
        Some(seq.wrapping_sub(self.unacked.front()?.seq) as usize)
    }

    /// Where message `seq` is among those sent in full this round.
    fn sent_index(&self, seq: u32) -> Option<usize> {
        self.index_of(seq).filter(|&i| i < self.sent)
    }

    /// The DATA packets `u` is cut into on this channel.
    fn frags_of(&self, u: &Unacked) -> usize {
        u.msg.bytes.len().div_ceil(self.mtu as usize).max(1)
    }

    /// Fragment `frag` of `unacked[i]` as a DATA packet of channel `key`.
    fn data_packet(&self, key: &ChannelKey, i: usize, frag: u32) -> Packet {
        let u = &self.unacked[i];
        let len = u.msg.bytes.len();
        let frags = self.frags_of(u);
        let off = frag as usize * self.mtu as usize;
        let end = (off + self.mtu as usize).min(len);
        let mut p = self.packet_about(packet::DATA, key, u);
        let h = &mut p.header;
        h.frag = (frag as u16).into();
        h.frags = (frags as u16).into();
        h.offset = (off as u32).into();
        h.tag = u.msg.tag.into();
        h.flags = u.msg.flags.into();
        h.session = u.msg.session.into();
        p.payload = u.msg.bytes[off..end].to_vec();
        p.seal();
        p
    }

    /// The next fragment a SACK asked for that is still wanted, as a
    /// packet; the message it belongs to gives no RTT sample now.
    fn next_repair(&mut self, key: &ChannelKey) -> Option<Packet> {
        while let Some((seq, frag)) = self.repairs.pop_front() {
            let Some(i) = self.sent_index(seq) else {
                continue; // settled meanwhile
            };
            let p = self.data_packet(key, i, u32::from(frag));
            self.tx += 1;
            let u = &mut self.unacked[i];
            if let Some(t) = u.repaired_tx.get_mut(usize::from(frag)) {
                *t = self.tx;
            }
            u.again = true;
            u.sent_at = None;
            return Some(p);
        }
        None
    }

    /// Takes the oldest message off, keeping the round's counts right.
    fn pop(&mut self) -> Option<Unacked> {
        let u = self.unacked.pop_front()?;
        if self.sent > 0 {
            self.sent -= 1;
            if u.is_read() {
                self.reads_out = self.reads_out.saturating_sub(1);
            }
        } else {
            self.frag = 0;
        }
        Some(u)
    }
}

impl Transport {
    /// Takes a message for channel `key` at `now`. `path` gives the MTU of
    /// its path and the round trip when idle; it is asked only when the
    /// channel is new. The caller checked `has_room` (a close message may
    /// go past it).
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
                    repairs: VecDeque::new(),
                    probe_at: None,
                    sacked_at: 0,
                    tx: 0,
                    reads_out: 0,
                    mtu,
                    base_timeout: base,
                    srtt: None,
                    floor: base,
                    timeout: base,
                    deadline: None,
                    hold_until: 0,
                    room_end: None,
                    timeouts: 0,
                    nacks: 0,
                    room_asks: 0,
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
            answer: None,
            first_tx: 0,
            repaired_tx: Vec::new(),
        });
        self.counters[key.src as usize].messages_sent += 1;
        self.make_ready(key);
    }

    /// When message `seq` of channel `key` was taken, if it is the oldest
    /// the sender holds and was sent once (the sender is on this device).
    pub(super) fn submitted_once(&self, key: &ChannelKey, seq: u32) -> Option<Nanos> {
        let u = self.send.get(key)?.unacked.front()?;
        (u.seq == seq && !u.again).then_some(u.submitted_at)
    }

    /// The next DATA packet of the channel whose turn it is at node `n`.
    pub(super) fn next_data(&mut self, n: u32, now: Nanos) -> Option<Packet> {
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
            if c.must_ask_room() {
                let Some(p) = c.room_packet(&key) else {
                    c.queued = false;
                    continue;
                };
                c.room_asks += 1;
                c.hold_until = now + SendChannel::hold_for(c.nacks + c.room_asks);
                self.timers.push(Reverse((c.hold_until, key)));
                // Its silence is timed as a message's: a receiver gone
                // quiet is found as it would be by a message.
                if c.deadline.is_none() {
                    let d = now + c.timeout;
                    c.deadline = Some(d);
                    self.timers.push(Reverse((d, key)));
                }
                c.queued = false;
                self.counters[n as usize].room_asks += 1;
                return Some(p);
            }
            if !c.can_send() {
                // Nothing more, or a read's answer to wait for (its
                // arrival puts the channel back).
                c.queued = false;
                continue;
            }
            if let Some(p) = c.next_repair(&key) {
                self.counters[n as usize].retransmissions += 1;
                if c.can_send() {
                    ready.push_back(key);
                } else {
                    c.queued = false;
                }
                return Some(p);
            }
            if !c.can_send() {
                // Only repairs were asked for, of messages settled since.
                c.queued = false;
                continue;
            }
            let p = c.data_packet(&key, c.sent, c.frag);
            c.tx += 1;
            let (tx, frag) = (c.tx, c.frag);
            let u = &mut c.unacked[c.sent];
            if frag == 0 {
                // Its latest transmission in order: what a SACK is read
                // against.
                u.first_tx = tx;
            }
            let u = &c.unacked[c.sent];
            let frags = c.frags_of(u);
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
                if u.is_read() {
                    c.reads_out += 1;
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
            if c.can_send() {
                ready.push_back(key);
            } else {
                c.queued = false;
            }
            return Some(p);
        }
        None
    }

    /// Runs every timer due by `now`: timeouts retransmit (or, past the
    /// retries, return the messages and mark the destination unreachable)
    /// and NACK hold-offs end.
    pub fn tick(&mut self, now: Nanos, sink: &mut dyn Sink) {
        while let Some(&Reverse((t, key))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let lost = self.is_lost(key.src, key.dst);
            let Some(c) = self.send.get_mut(&key) else {
                continue;
            };
            if c.hold_until != 0 && c.hold_until <= now {
                c.hold_until = 0;
                self.make_ready(key);
                continue;
            }
            if c.probe_at.is_some_and(|t| t <= now) {
                if c.probe(now) {
                    if let Some(t) = c.probe_at {
                        self.timers.push(Reverse((t, key)));
                    }
                    self.make_ready(key);
                }
                let Some(c) = self.send.get_mut(&key) else {
                    continue;
                };
                if c.deadline.is_none_or(|d| d > now) {
                    continue;
                }
            }
            let Some(c) = self.send.get_mut(&key) else {
                continue;
            };
            match c.deadline {
                Some(d) if d <= now && !c.unacked.is_empty() => {}
                _ => continue, // stale entry
            }
            c.timeouts += 1;
            self.counters[key.src as usize].timeouts += 1;
            let retries = if c.unreachable || lost {
                1
            } else {
                self.config.retries
            };
            if c.timeouts > retries {
                self.return_all(key, tx_error::UNREACHABLE, sink);
                self.mark_lost(key.src, key.dst, sink);
                continue;
            }
            c.timeout = (c.timeout * 2).min(self.config.max_timeout);
            if c.timeouts == 1 && c.resend_oldest() {
                // First, only the oldest message goes again: its packets
                // draw a SACK naming every hole (or, if it was delivered
                // and its ACK lost, an ACK), without sending the window
                // again.
                let d = now + c.timeout;
                c.deadline = Some(d);
                self.timers.push(Reverse((d, key)));
            } else {
                c.rewind();
                // Timed again when the first message has gone again.
                c.deadline = None;
            }
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
        c.rewind();
        c.deadline = None;
        c.hold_until = 0;
        c.room_end = None;
        c.timeouts = 0;
        c.nacks = 0;
        c.room_asks = 0;
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
            u.answer = None;
        }
        c.next_seq = c.unacked.len() as u32;
        c.rewind();
        c.timeouts = 0;
        c.nacks = 0;
        c.room_asks = 0;
        c.hold_until = 0;
        c.room_end = None;
        c.timeout = c.base_timeout;
        c.deadline = None;
        self.counters[key.src as usize].returned += 1;
        self.release(&key, 1, first.msg.bytes.len());
        sink.returned(key, first.msg, code);
        self.make_ready(key);
    }

    /// Settles channel `key` from its oldest message on: every message up
    /// to sequence number `seq`, except a read not answered in full, and
    /// past it every read answered in full (an answer shows that what came
    /// before it was delivered).
    fn settle(&mut self, key: ChannelKey, seq: u32, now: Nanos, sink: &mut dyn Sink) {
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        let (mut done, mut done_bytes) = (0u32, 0usize);
        let mut settled = Vec::new();
        while let Some(u) = c.unacked.front() {
            let go = if u.is_read() {
                u.answer.as_ref().is_some_and(|a| a.missing == 0)
            } else {
                !before(seq, u.seq)
            };
            if !go {
                break;
            }
            let Some(u) = c.pop() else {
                break;
            };
            done += 1;
            done_bytes += u.msg.bytes.len();
            if let (Some(t), false) = (u.sent_at.filter(|&t| t > c.sacked_at), u.again) {
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
            settled.push(u.msg);
        }
        if done > 0 {
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
        for m in settled {
            sink.acked(key, m);
        }
        // A read answered may let what waited behind it go.
        self.make_ready(key);
    }

    /// The engine stalled: every running timeout moves `late` later (and
    /// none falls due before `now + late`), as the emulated NIC was not
    /// running to take the answers meanwhile.
    pub fn postpone(&mut self, now: Nanos, late: Nanos) {
        for (key, c) in self.send.iter_mut() {
            if let Some(d) = c.deadline.as_mut() {
                *d = (*d).max(now) + late;
                self.timers.push(Reverse((*d, *key)));
            }
            if let Some(p) = c.probe_at.as_mut() {
                *p = (*p).max(now) + late;
                self.timers.push(Reverse((*p, *key)));
            }
        }
    }

    /// An ACK of `seq` in `epoch` with `code`; `holes`, a SACK's payload
    /// (empty for a plain ACK), says what to send again.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn receive_ack(
        &mut self,
        key: ChannelKey,
        (epoch, seq): (u32, u32),
        code: u16,
        holes: &[u8],
        room: u32,
        now: Nanos,
        sink: &mut dyn Sink,
    ) {
        // Of this epoch, and of a message sent (a later number is no
        // NIC's ACK: nothing is settled by it).
        let sent = |c: &&mut SendChannel| c.epoch == epoch && before(seq, c.next_seq);
        let Some(c) = self.send.get_mut(&key).filter(sent) else {
            return;
        };
        let settles = c.unacked.front().is_some_and(|u| !before(seq, u.seq));
        let answer = code == packet::ACK_ROOM;
        if answer && c.sent == 0 {
            // The ROOM was answered: its silence is no longer timed.
            c.deadline = None;
        }
        if answer && room == 0 {
            // Still no room: the wait set when the ROOM left stands.
            c.room_end = Some(seq.wrapping_add(1));
            let patient = c.unacked.front().is_some_and(|u| u.msg.patient);
            if c.nacks + c.room_asks > self.config.nack_retries && !patient {
                self.return_all(key, tx_error::NO_BUFFER, sink);
            }
            return;
        }
        if answer {
            // Room at last: the refused or held message goes now.
            c.nacks = 0;
            c.room_asks = 0;
            c.hold_until = 0;
            c.room_end = (room != NO_ROOM_BOUND).then(|| seq.wrapping_add(1).wrapping_add(room));
            self.make_ready(key);
        } else if c.nacks > 0 && !settles {
            // After a NACK for want of a buffer, only an answer about the
            // refused message lifts the hold and its room bound: a SACK
            // that followed the NACK knows nothing newer.
        } else if room == 0 {
            c.room_end = Some(seq.wrapping_add(1));
            // No room: a ROOM asks after a pause, not at once.
            if c.hold_until <= now {
                c.hold_until = now + NACK_BACKOFF;
                self.timers.push(Reverse((c.hold_until, key)));
            }
        } else {
            // The receiver took this one and has room: no more holding.
            c.room_end = (room != NO_ROOM_BOUND).then(|| seq.wrapping_add(1).wrapping_add(room));
            c.hold_until = 0;
        }
        self.settle(key, seq, now, sink);
        if !holes.is_empty() {
            self.repair(key, holes, now);
        }
    }

    /// A SACK of channel `key`: `payload` names the packet that drew it,
    /// then the holes (`SackHole` entries). A missing fragment of a message
    /// sent in full goes again if it never went again, or if it did before
    /// the packet that drew the SACK left (that packet came; on an ordered
    /// path the repair would have come before it). What the channel does
    /// not hold is ignored.
    fn repair(&mut self, key: ChannelKey, payload: &[u8], now: Nanos) {
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        let entries =
            (payload.len() / std::mem::size_of::<SackHole>()).min(1 + packet::MAX_SACK_HOLES);
        let Ok((entries, _)) = <[SackHole]>::ref_from_prefix_with_elems(payload, entries) else {
            return;
        };
        let Some((drew, holes)) = entries.split_first() else {
            return;
        };
        c.sacked_at = now;
        if c.sent > 0 && c.in_order(drew.seq.get(), drew.first.get()) {
            // The receiver is taking packets sent in order: the stream
            // moves. Under load a repair waits behind every queued packet
            // of the path, longer than an idle round trip's timeout. (A
            // SACK drawn by a repair or a probe does not count: a message
            // the receiver keeps refusing must still time out.)
            let d = now + c.timeout;
            c.deadline = Some(d);
            self.timers.push(Reverse((d, key)));
        }
        let drew = c.sent_tx(drew.seq.get(), drew.first.get());
        for hole in holes {
            let seq = hole.seq.get();
            let Some(i) = c.sent_index(seq) else {
                continue;
            };
            let frags = c.frags_of(&c.unacked[i]);
            let u = &mut c.unacked[i];
            if u.repaired_tx.len() != frags {
                u.repaired_tx = vec![0; frags];
            }
            let last = usize::from(hole.last.get()).min(frags - 1);
            for f in usize::from(hole.first.get())..=last {
                let t = &mut u.repaired_tx[f];
                if *t == QUEUED || (*t != 0 && drew <= *t) {
                    continue; // waiting to go, or may still be on its way
                }
                *t = QUEUED;
                c.repairs.push_back((seq, f as u16));
            }
        }
        if !c.repairs.is_empty() || c.probe_at.is_some() {
            // Silence from here on means the repairs, or the SACK that
            // would tell of their loss, were lost.
            let t = now + c.probe_wait();
            c.probe_at = Some(t);
            self.timers.push(Reverse((t, key)));
        }
        self.make_ready(key);
    }

    pub(super) fn receive_nack(
        &mut self,
        key: ChannelKey,
        epoch: u32,
        seq: u32,
        code: u16,
        now: Nanos,
        sink: &mut dyn Sink,
    ) {
        let nack_retries = self.config.nack_retries;
        let Some(c) = self.send.get(&key) else {
            return;
        };
        let patient = match c.unacked.front() {
            Some(u) if u.seq == seq && c.epoch == epoch => u.msg.patient,
            _ => return, // about a message already settled
        };
        if code != tx_error::NO_BUFFER {
            self.return_first(key, code, sink);
            return;
        }
        let Some(c) = self.send.get_mut(&key) else {
            return;
        };
        c.nacks += 1;
        c.timeouts = 0;
        c.unreachable = false;
        if c.nacks > nack_retries && !patient {
            self.return_all(key, tx_error::NO_BUFFER, sink);
            return;
        }
        let wait = (NACK_BACKOFF << c.nacks.min(20)).min(MAX_NACK_BACKOFF);
        c.hold_until = now + wait;
        // The refused message goes again alone; what followed it waits
        // for an ACK's room.
        c.room_end = Some(seq);
        c.rewind();
        let d = c.hold_until + c.timeout;
        c.deadline = Some(d);
        self.timers.push(Reverse((c.hold_until, key)));
        self.timers.push(Reverse((d, key)));
    }

    /// A RESPONSE reached the node that sent the read: its bytes go to the
    /// NIC, and the last of them settles the read.
    pub(super) fn receive_response(
        &mut self,
        key: ChannelKey,
        p: &Packet,
        now: Nanos,
        sink: &mut dyn Sink,
    ) {
        let h = &p.header;
        let n = key.src as usize;
        let (epoch, seq, frag, frags) = (h.epoch.get(), h.seq.get(), h.frag.get(), h.frags.get());
        let (msg_len, off) = (h.msg_len.get(), h.offset.get());
        let Some(c) = self.send.get_mut(&key) else {
            self.counters[n].stale_dropped += 1;
            return;
        };
        if c.epoch != epoch {
            self.counters[n].stale_dropped += 1;
            return;
        }
        let Some(u) = c.unacked.iter_mut().find(|u| u.seq == seq && u.is_read()) else {
            self.counters[n].duplicates_dropped += 1;
            return;
        };
        let len = u.msg.response_len();
        let end = u64::from(off) + p.payload.len() as u64;
        if msg_len != len || frags == 0 || frag >= frags || end > u64::from(len) {
            self.counters[n].malformed_dropped += 1;
            return;
        }
        // A read served again may be cut differently (routes changed):
        // its fragments start afresh.
        let a = match &mut u.answer {
            Some(a) if a.got.len() == usize::from(frags) => a,
            slot => slot.insert(Answer {
                got: vec![false; usize::from(frags)],
                missing: u32::from(frags),
            }),
        };
        if a.got[usize::from(frag)] {
            self.counters[n].duplicates_dropped += 1;
            return;
        }
        a.got[usize::from(frag)] = true;
        a.missing -= 1;
        let complete = a.missing == 0;
        sink.read_data(key, &u.msg, off, &p.payload);
        if complete {
            self.settle(key, seq, now, sink);
        }
    }
}
