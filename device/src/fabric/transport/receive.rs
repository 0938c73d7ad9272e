//! The receiver's side of a channel: DATA packets taken in order and
//! reassembled, complete messages handed to the node (a remote access's
//! header checked first), and what the node sends back: ACKs, NACKs and
//! the RESPONSE packets that carry a read's bytes.

use std::collections::VecDeque;

use ulnic_abi::wire::{self, PacketHeader, RemoteAccess, SackHole};
use ulnic_abi::{op, packet, tx_error, MAX_MESSAGE};
use zerocopy::IntoBytes;

use super::{
    before, Arrival, ChannelKey, Class, Delivered, Sink, Transport, MAX_CONTROL_BACKLOG,
    MAX_EARLY_BYTES, MAX_RESPONSE_BYTES, NO_ROOM_BOUND,
};
use crate::fabric::link::Nanos;
use crate::fabric::packet::Packet;

struct Assembly {
    /// The header of its first packet to come (what the node is told).
    header: PacketHeader,
    frags: u16,
    got: Vec<bool>,
    missing: u32,
    bytes: Vec<u8>,
}

impl Assembly {
    fn fits(&self, h: &PacketHeader) -> bool {
        self.frags == h.frags.get() && self.bytes.len() == h.msg_len.get() as usize
    }
}

/// Packets taken between SACKs while holes remain.
const SACK_EVERY: u32 = 8;

#[derive(Default)]
pub(super) struct RecvChannel {
    epoch: u32,
    next: u32,
    /// Messages being reassembled: entry `i` is message `next + i` (the
    /// expected one, then early ones), `None` while nothing of it came.
    pending: VecDeque<Option<Assembly>>,
    /// The length of the last message delivered: the room a repeated ACK
    /// reports is for messages like it.
    last_len: usize,
    /// The packet taken last: sequence number, fragment, fragments.
    last_taken: Option<(u32, u16, u16)>,
    /// The last SACK listed holes.
    holes: bool,
    /// Packets taken since the last SACK.
    since_sack: u32,
}

impl RecvChannel {
    /// Payload bytes it holds in reassembly.
    pub(super) fn held_bytes(&self) -> usize {
        self.pending.iter().flatten().map(|a| a.bytes.len()).sum()
    }

    /// Drops every message being reassembled: the bytes it held.
    pub(super) fn drop_pending(&mut self) -> usize {
        let held = self.held_bytes();
        self.pending.clear();
        self.holes = false;
        held
    }

    /// Whether packet (`seq`, `frag`) follows the one taken before it.
    fn follows(&self, seq: u32, frag: u16) -> bool {
        match self.last_taken {
            Some((s, f, n)) if f + 1 < n => seq == s && frag == f + 1,
            Some((s, _, _)) => seq == s.wrapping_add(1) && frag == 0,
            None => seq == self.next && frag == 0,
        }
    }

    /// What is missing before the furthest packet taken, from the
    /// expected message on (at most `packet::MAX_SACK_HOLES`).
    fn holes(&self) -> Vec<SackHole> {
        let Some(furthest) = self.pending.iter().rposition(Option::is_some) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut push = |seq: u32, first: usize, last: u16| {
            if out.len() < packet::MAX_SACK_HOLES {
                out.push(SackHole {
                    seq: seq.into(),
                    first: (first as u16).into(),
                    last: last.into(),
                });
            }
        };
        for (i, slot) in self.pending.iter().enumerate().take(furthest + 1) {
            let seq = self.next.wrapping_add(i as u32);
            let Some(a) = slot else {
                push(seq, 0, packet::SACK_TO_END);
                continue;
            };
            // In the furthest message, what follows its last packet taken
            // may still be on its way.
            let end = if i == furthest {
                a.got.iter().rposition(|&g| g).unwrap_or(0)
            } else {
                a.got.len()
            };
            let mut f = 0;
            while f < end {
                if a.got[f] {
                    f += 1;
                    continue;
                }
                let first = f;
                while f < end && !a.got[f] {
                    f += 1;
                }
                push(seq, first, (f - 1) as u16);
            }
        }
        out
    }
}

/// A read's bytes on their way back to the node that asked.
pub(super) struct Response {
    /// The channel as its DATA named it (the reader is `src`).
    key: ChannelKey,
    epoch: u32,
    seq: u32,
    bytes: Vec<u8>,
    /// The next fragment to send.
    frag: u32,
}

/// The channel a packet from its sender names, arriving at node `n`.
fn arriving(h: &PacketHeader, n: u32, class: Class) -> ChannelKey {
    ChannelKey {
        src: h.src_node.get(),
        endpoint: h.src_endpoint.get(),
        dst: n,
        port: h.dst_port.get(),
        class,
    }
}

/// Whether a remote access's payload holds together for node `n` (spec
/// §10.4): a whole header naming this node with its reserved fields 0, a
/// length fit for the operation, and a write's bytes after the header.
fn access_well_formed(n: u32, opcode: u16, bytes: &[u8]) -> bool {
    let Some(head) = bytes.get(..packet::ACCESS_HEADER_SIZE) else {
        return false;
    };
    let a: RemoteAccess = wire::read(head);
    let len = a.len.get();
    let body = bytes.len() - packet::ACCESS_HEADER_SIZE;
    let fits = match opcode {
        op::RDMA_WRITE => len > 0 && body == len as usize,
        op::RDMA_READ => body == 0 && (1..=packet::RDMA_PIECE).contains(&len),
        op::WRITE_IMMEDIATE => body == 0 && (len == 4 || len == 8),
        op::PIO_SYNC => body == 0 && len > 0,
        _ => false,
    };
    fits && a.cookie_node.get() == n && a.cookie_reserved.get() == 0 && a.reserved.get() == 0
}

impl Transport {
    pub(super) fn receive_data(&mut self, n: u32, p: Packet, now: Nanos, sink: &mut dyn Sink) {
        let h = p.header;
        let (frag, frags, msg_len, off) = (
            h.frag.get(),
            h.frags.get(),
            h.msg_len.get(),
            h.offset.get() as u64,
        );
        let class = Class::of(h.opcode.get());
        let counters = &mut self.counters[n as usize];
        if frags == 0
            || frag >= frags
            || msg_len > MAX_MESSAGE
            || off + p.payload.len() as u64 > u64::from(msg_len)
            || (class == Class::Memory && h.dst_port.get() != 0)
        {
            counters.malformed_dropped += 1;
            return;
        }
        let key = arriving(&h, n, class);
        let (epoch, seq) = (h.epoch.get(), h.seq.get());
        let fresh = !self.recv.contains_key(&key);
        let ch = self.recv.entry(key).or_default();
        if epoch != ch.epoch {
            if before(epoch, ch.epoch) && ch.epoch != 0 {
                counters.stale_dropped += 1;
                return;
            }
            if seq != 0 {
                counters.out_of_order_dropped += 1;
                if fresh {
                    // Nothing kept for a channel this packet cannot open
                    // (and nothing was held in it).
                    self.recv.remove(&key);
                    if key.class != Class::Memory && !sink.bound(n, key.port) {
                        // The port was let go and its NACK NO_ENDPOINT
                        // lost (the channel went with it): say it again,
                        // so the sender is not left to time out.
                        let op = h.opcode.get();
                        self.control_packet(
                            key,
                            epoch,
                            seq,
                            packet::NACK,
                            tx_error::NO_ENDPOINT,
                            op,
                            0,
                        );
                    }
                }
                return;
            }
            self.early_bytes[n as usize] =
                self.early_bytes[n as usize].saturating_sub(ch.held_bytes());
            *ch = RecvChannel {
                epoch,
                ..RecvChannel::default()
            };
        }
        if before(seq, ch.next) {
            counters.duplicates_dropped += 1;
            if frag + 1 == frags {
                if h.opcode.get() == op::RDMA_READ && frags == 1 {
                    // Its answer was lost: a read is served again.
                    self.serve(n, key, &h, p.payload.clone(), now, sink);
                } else {
                    let last = ch.next.wrapping_sub(1);
                    let room = room_for(sink, n, key, ch.last_len);
                    self.control_packet(key, epoch, last, packet::ACK, 0, h.opcode.get(), room);
                }
            }
            return;
        }
        let ahead = seq.wrapping_sub(ch.next) as usize;
        if ahead >= self.config.window.max(1) as usize {
            counters.out_of_order_dropped += 1;
            return;
        }
        if ch.pending.len() <= ahead {
            ch.pending.resize_with(ahead + 1, || None);
        }
        let early = &mut self.early_bytes[n as usize];
        let a = match &mut ch.pending[ahead] {
            Some(a) if a.fits(&h) => a,
            slot => {
                // An early message is kept only within the node's budget;
                // the expected one always is.
                let old = slot.as_ref().map_or(0, |a| a.bytes.len());
                let after = early.saturating_sub(old) + msg_len as usize;
                if ahead > 0 && after > MAX_EARLY_BYTES {
                    counters.out_of_order_dropped += 1;
                    return;
                }
                *early = after;
                slot.insert(Assembly {
                    header: h,
                    frags,
                    got: vec![false; frags as usize],
                    missing: u32::from(frags),
                    bytes: vec![0; msg_len as usize],
                })
            }
        };
        if a.got[frag as usize] {
            counters.duplicates_dropped += 1;
            if frag + 1 == frags {
                // The last fragment of a kept message came again: a sender
                // that timed out asks what is missing (spec §10.4).
                self.maybe_sack(key, (seq, frag), false, h.opcode.get(), sink);
            }
            return;
        }
        a.got[frag as usize] = true;
        a.missing -= 1;
        a.bytes[off as usize..off as usize + p.payload.len()].copy_from_slice(&p.payload);
        let follows = ch.follows(seq, frag);
        ch.last_taken = Some((seq, frag, frags));
        if self.deliver_ready(n, key, now, sink) {
            self.maybe_sack(key, (seq, frag), follows, h.opcode.get(), sink);
        }
    }

    /// Delivers the channel's expected message while it is complete, and
    /// the early ones complete behind it, in order; stops at one the node
    /// did not take (the sender will send it again). False if one was not
    /// taken (its NACK says what to do; a SACK after it would not).
    fn deliver_ready(&mut self, n: u32, key: ChannelKey, now: Nanos, sink: &mut dyn Sink) -> bool {
        loop {
            let Some(ch) = self.recv.get_mut(&key) else {
                return false;
            };
            if !matches!(ch.pending.front(), Some(Some(a)) if a.missing == 0) {
                return true;
            }
            let Some(Some(a)) = ch.pending.pop_front() else {
                return true;
            };
            let expected = ch.next;
            self.early_bytes[n as usize] =
                self.early_bytes[n as usize].saturating_sub(a.bytes.len());
            self.serve(n, key, &a.header, a.bytes, now, sink);
            match self.recv.get_mut(&key) {
                Some(ch) if ch.next == expected => {
                    ch.pending.push_front(None);
                    return false;
                }
                Some(_) => {}
                None => return false,
            }
        }
    }

    /// Answers packet `drew` (sequence number, fragment) with a SACK when
    /// it did not follow the one before it and left a hole, or every
    /// `SACK_EVERY` packets while holes remain.
    fn maybe_sack(
        &mut self,
        key: ChannelKey,
        drew: (u32, u16),
        follows: bool,
        opcode: u16,
        sink: &mut dyn Sink,
    ) {
        let Some(ch) = self.recv.get_mut(&key) else {
            return;
        };
        if follows {
            if !ch.holes {
                return;
            }
            ch.since_sack += 1;
            if ch.since_sack < SACK_EVERY {
                return;
            }
        }
        let holes = ch.holes();
        ch.holes = !holes.is_empty();
        ch.since_sack = 0;
        if holes.is_empty() {
            return;
        }
        let (epoch, last, len) = (ch.epoch, ch.next.wrapping_sub(1), ch.last_len);
        let room = room_for(sink, key.dst, key, len);
        if !self.control_packet(key, epoch, last, packet::ACK, packet::ACK_GAP, opcode, room) {
            return;
        }
        if let Some(p) = self.control[key.dst as usize].back_mut() {
            let drew = SackHole {
                seq: drew.0.into(),
                first: drew.1.into(),
                last: drew.1.into(),
            };
            p.payload = drew.as_bytes().to_vec();
            p.payload.extend_from_slice(holes.as_bytes());
            p.seal();
        }
    }

    /// Forgets what node `n` keeps for channel `key`.
    fn forget_recv(&mut self, n: u32, key: &ChannelKey) {
        if let Some(ch) = self.recv.remove(key) {
            self.early_bytes[n as usize] =
                self.early_bytes[n as usize].saturating_sub(ch.held_bytes());
        }
    }

    /// Hands complete message `bytes` (of the channel `key`, as header `h`
    /// of one of its packets says) to node `n`'s NIC, and answers: ACK, NACK, or a read's
    /// RESPONSE. A message served again (a read whose answer was lost)
    /// leaves the channel where it is.
    fn serve(
        &mut self,
        n: u32,
        key: ChannelKey,
        h: &PacketHeader,
        bytes: Vec<u8>,
        now: Nanos,
        sink: &mut dyn Sink,
    ) {
        let (epoch, seq, opcode) = (h.epoch.get(), h.seq.get(), h.opcode.get());
        let i = n as usize;
        if key.class == Class::Memory && !access_well_formed(n, opcode, &bytes) {
            // Only a NIC makes packets: this one is broken, not refused.
            self.counters[i].malformed_dropped += 1;
            return;
        }
        let answer_len = if opcode == op::RDMA_READ {
            wire::read::<RemoteAccess>(&bytes).len.get() as usize
        } else {
            0
        };
        if self.response_bytes[i] + answer_len > MAX_RESPONSE_BYTES {
            self.control_packet(
                key,
                epoch,
                seq,
                packet::NACK,
                tx_error::NO_BUFFER,
                opcode,
                0,
            );
            return;
        }
        let arrival = Arrival {
            dst: n,
            port: key.port,
            src: key.src,
            src_port: h.src_port.get(),
            tag: h.tag.get(),
            opcode,
            flags: h.flags.get(),
            session: h.session.get(),
            bytes: &bytes,
        };
        let again = self.recv.get(&key).is_none_or(|ch| before(seq, ch.next));
        match sink.deliver(&arrival) {
            Ok(outcome) => {
                if !again {
                    if let Some(ch) = self.recv.get_mut(&key) {
                        ch.next = ch.next.wrapping_add(1);
                        ch.last_len = bytes.len();
                    }
                    self.counters[i].messages_delivered += 1;
                    if let Some(t) = self.submitted_once(&key, seq) {
                        self.record_delay(now.saturating_sub(t));
                    }
                }
                match outcome {
                    Delivered::Done => {
                        let room = room_for(sink, n, key, bytes.len());
                        self.control_packet(key, epoch, seq, packet::ACK, 0, opcode, room);
                    }
                    Delivered::Read(b) => self.queue_response(n, key, epoch, seq, b),
                }
            }
            // No buffer: dropped, and tried again. A refusal: the channel
            // stays at this message until the sender starts a new epoch.
            Err(code) => {
                if code == tx_error::NO_ENDPOINT && key.class != Class::Memory {
                    // Nothing to keep for a port nobody holds: a guest
                    // writing to every port number leaves no state here.
                    self.forget_recv(n, &key);
                }
                self.control_packet(key, epoch, seq, packet::NACK, code, opcode, 0);
            }
        }
    }

    /// Answers a ROOM packet that reached node `n` (spec §10.4): an ACK
    /// of the message before the one asked about, code ROOM, with the
    /// room now; NACK NO_ENDPOINT when nobody holds the port. No state
    /// is kept for it.
    pub(super) fn answer_room(&mut self, n: u32, h: &PacketHeader, sink: &mut dyn Sink) {
        let class = Class::of(h.opcode.get());
        if class == Class::Memory {
            self.counters[n as usize].malformed_dropped += 1;
            return;
        }
        let key = arriving(h, n, class);
        let (epoch, seq, opcode) = (h.epoch.get(), h.seq.get(), h.opcode.get());
        if !sink.bound(n, key.port) {
            let code = tx_error::NO_ENDPOINT;
            self.control_packet(key, epoch, seq, packet::NACK, code, opcode, 0);
            return;
        }
        let room = room_for(sink, n, key, h.msg_len.get() as usize);
        let last = seq.wrapping_sub(1);
        self.control_packet(
            key,
            epoch,
            last,
            packet::ACK,
            packet::ACK_ROOM,
            opcode,
            room,
        );
    }

    /// Queues an ACK (with the receiver's `room`) or NACK from the
    /// receiver of channel `key`; false if too many wait (it is dropped).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn control_packet(
        &mut self,
        key: ChannelKey,
        epoch: u32,
        seq: u32,
        kind: u16,
        code: u16,
        opcode: u16,
        room: u32,
    ) -> bool {
        let counters = &mut self.counters[key.dst as usize];
        let q = &mut self.control[key.dst as usize];
        if q.len() >= MAX_CONTROL_BACKLOG {
            counters.control_dropped += 1;
            return false;
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
        h.opcode = opcode.into();
        h.tag = room.into();
        p.seal();
        q.push_back(p);
        self.control_waiting += 1;
        true
    }

    /// Queues read `seq`'s bytes to go back from node `n`.
    fn queue_response(&mut self, n: u32, key: ChannelKey, epoch: u32, seq: u32, bytes: Vec<u8>) {
        self.response_bytes[n as usize] += bytes.len();
        self.responses[n as usize].push_back(Response {
            key,
            epoch,
            seq,
            bytes,
            frag: 0,
        });
    }

    /// The next RESPONSE packet node `n` sends, if any.
    pub(super) fn next_response(&mut self, n: u32) -> Option<Packet> {
        let i = n as usize;
        let mtu = self.response_mtu as usize;
        let r = self.responses[i].front_mut()?;
        let len = r.bytes.len();
        let frags = len.div_ceil(mtu).max(1);
        let off = r.frag as usize * mtu;
        let end = (off + mtu).min(len);
        let mut p = Packet::new(packet::RESPONSE);
        let h = &mut p.header;
        h.src_node = n.into();
        h.dst_node = r.key.src.into();
        h.src_endpoint = r.key.endpoint.into();
        h.dst_port = r.key.port.into();
        h.epoch = r.epoch.into();
        h.seq = r.seq.into();
        h.frag = (r.frag as u16).into();
        h.frags = (frags as u16).into();
        h.msg_len = (len as u32).into();
        h.offset = (off as u32).into();
        h.opcode = op::RDMA_READ.into();
        p.payload = r.bytes[off..end].to_vec();
        p.seal();
        r.frag += 1;
        if r.frag as usize >= frags {
            self.response_bytes[i] -= len;
            self.responses[i].pop_front();
        }
        self.counters[i].responses_sent += 1;
        Some(p)
    }
}

/// The room an ACK of channel `key` reports (spec §10.4): messages of
/// `len` bytes the receiving endpoint could take now; no bound for the
/// memory class.
fn room_for(sink: &mut dyn Sink, n: u32, key: ChannelKey, len: usize) -> u32 {
    if key.class == Class::Memory {
        return NO_ROOM_BOUND;
    }
    sink.room(n, key.port, len)
}
