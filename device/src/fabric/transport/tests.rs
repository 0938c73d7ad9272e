//! The transport's unit tests, against a sink that records what it is given.

use super::*;
use ulnic_abi::tx_error;
use zerocopy::IntoBytes;

/// A sink that records everything; endpoint 9 of every node refuses, a
/// node's buffers run out while `full` says so, and a read of `len` bytes
/// returns bytes numbered from its offset (plus `generation`, bumped on
/// every read served, so a read served twice is seen).
#[derive(Default)]
struct Record {
    delivered: Vec<(u32, u32, Vec<u8>)>,
    acked: Vec<u64>,
    returned: Vec<(u64, u16)>,
    /// Per read handle: its answer as assembled.
    answers: HashMap<u64, Vec<u8>>,
    reads_served: u32,
    unreachable: Vec<(u32, u32, Vec<u32>, Vec<u32>)>,
    full: bool,
    /// Receive slots left, when counted: each delivery takes one.
    slots: Option<u32>,
    /// Ports whose endpoint went away.
    unbound: Vec<u32>,
}

impl Sink for Record {
    fn deliver(&mut self, a: &Arrival<'_>) -> Result<Delivered, u16> {
        if a.port == 9 || self.unbound.contains(&a.port) {
            return Err(tx_error::NO_ENDPOINT);
        }
        if self.full || self.slots == Some(0) {
            return Err(tx_error::NO_BUFFER);
        }
        if let Some(n) = self.slots.as_mut() {
            *n -= 1;
        }
        if a.opcode == op::RDMA_READ {
            self.reads_served += 1;
            let r: RemoteAccess = wire::read(a.bytes);
            let off = r.offset.get();
            let bytes = (0..u64::from(r.len.get()))
                .map(|i| (off + i) as u8 ^ 0x5a)
                .collect();
            return Ok(Delivered::Read(bytes));
        }
        self.delivered.push((a.src, a.dst, a.bytes.to_vec()));
        Ok(Delivered::Done)
    }
    fn read_data(&mut self, _: ChannelKey, m: &Message, at: u32, b: &[u8]) {
        let v = self
            .answers
            .entry(m.handle)
            .or_insert_with(|| vec![0; m.response_len() as usize]);
        v[at as usize..at as usize + b.len()].copy_from_slice(b);
    }
    fn acked(&mut self, _: ChannelKey, m: Message) {
        self.acked.push(m.user_id);
    }
    fn returned(&mut self, _: ChannelKey, m: Message, code: u16) {
        self.returned.push((m.user_id, code));
    }
    fn room(&mut self, _: u32, _: u32, _: usize) -> u32 {
        if self.full {
            0
        } else {
            self.slots.unwrap_or(NO_ROOM_BOUND)
        }
    }
    fn unreachable(&mut self, node: u32, lost: u32, endpoints: &[u32], ports: &[u32]) {
        self.unreachable
            .push((node, lost, endpoints.to_vec(), ports.to_vec()));
    }
    fn bound(&mut self, _: u32, port: u32) -> bool {
        port != 9 && !self.unbound.contains(&port)
    }
}

fn msg(id: u64, len: usize) -> Message {
    Message {
        opcode: op::SEND,
        src_port: 1,
        user_id: id,
        completion: true,
        bytes: (0..len).map(|i| (i as u64 * 7 + id) as u8).collect(),
        ..Default::default()
    }
}

/// A remote access of `opcode` to node 1: `len` bytes at `offset`, and a
/// write's bytes.
fn access(id: u64, opcode: u16, offset: u64, len: u32) -> Message {
    let head = RemoteAccess {
        cookie_node: 1.into(),
        cookie_aperture: 0.into(),
        cookie_generation: 0.into(),
        cookie_reserved: 0.into(),
        cookie_key: 0.into(),
        offset: offset.into(),
        len: len.into(),
        reserved: 0.into(),
        immediate: 0.into(),
    };
    let mut bytes = head.as_bytes().to_vec();
    if opcode == op::RDMA_WRITE {
        bytes.extend((0..len).map(|i| i as u8));
    }
    Message {
        opcode,
        user_id: id,
        handle: id,
        completion: true,
        bytes,
        ..Default::default()
    }
}

/// The bytes `Record` answers a read of `len` at `offset` with.
fn answer(offset: u64, len: u32) -> Vec<u8> {
    (0..u64::from(len))
        .map(|i| (offset + i) as u8 ^ 0x5a)
        .collect()
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
            t: Transport::new(2, cfg, 1024),
            now: 0,
            sent: 0,
        }
    }

    /// Moves packets between the nodes for `span` ns, in 10 us steps;
    /// `lose(i, p)` drops the i-th packet sent.
    fn run(&mut self, sink: &mut Record, mut lose: impl FnMut(u64, &Packet) -> bool, span: Nanos) {
        let until = self.now + span;
        while self.now < until {
            for n in 0..2 {
                while let Some(p) = self.t.next_packet(n, self.now) {
                    self.sent += 1;
                    if !lose(self.sent, &p) {
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
    class: Class::Messages,
};

const MEMORY: ChannelKey = ChannelKey {
    src: 0,
    endpoint: 0,
    dst: 1,
    port: 0,
    class: Class::Memory,
};

/// A pseudo-random loss of about one packet in `one_in`.
fn lossy(one_in: u64) -> impl FnMut(u64, &Packet) -> bool {
    let mut r = 1u64;
    move |_, _| {
        r = r.wrapping_mul(6364136223846793005).wrapping_add(1);
        (r >> 33).is_multiple_of(one_in)
    }
}

#[test]
fn messages_arrive_once_and_in_order_through_loss() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    let mut submitted = 0;
    let mut lose = lossy(5);
    let mut lost = 0u64;
    for _ in 0..400 {
        while net.t.has_room(&KEY, 3000) && submitted < 500 {
            net.t.submit(KEY, msg(submitted, 3000), 0, || (1024, 0));
            submitted += 1;
        }
        net.run(
            &mut s,
            |i, p| {
                let l = lose(i, p);
                lost += u64::from(l && p.header.kind.get() == packet::DATA);
                l
            },
            2_000_000,
        );
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
    // Every DATA packet lost was sent again (go-back-N sends more).
    assert!(
        c[0].retransmissions >= lost && lost > 0,
        "{lost} lost: {c:?}"
    );
    assert_eq!(c[0].data_packets, 500 * 3, "{c:?}");
}

#[test]
fn a_full_receiver_is_retried_not_failed() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record {
        full: true,
        ..Default::default()
    };
    net.t.submit(KEY, msg(1, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 3_000_000);
    assert!(s.delivered.is_empty() && s.returned.is_empty());
    // Refused once, then asked (ROOM) without sending it again.
    let c = net.t.counters[0];
    assert_eq!((c.nacks_received, c.retransmissions), (1, 0), "{c:?}");
    assert!(c.room_asks > 3, "{c:?}");
    s.full = false;
    net.run(&mut s, |_, _| false, 3_000_000);
    assert_eq!(s.delivered.len(), 1);
    assert_eq!(s.acked, [1]);
    // It went again once, when an answer gave room.
    assert_eq!(net.t.counters[0].retransmissions, 1);
}

/// A receiver that runs out of room holds its sender back: the sender
/// asks (ROOM) until the receiver has room, and no message is sent to be
/// refused and sent again.
#[test]
fn a_receiver_without_room_is_asked_not_sent_to() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record {
        slots: Some(2),
        ..Default::default()
    };
    // The first ACK gives the room; the rest are bound by it.
    net.t.submit(KEY, msg(0, 3000), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 100_000);
    for i in 1..6 {
        net.t.submit(KEY, msg(i, 3000), net.now, || (1024, 0));
    }
    net.run(&mut s, |_, _| false, 3_000_000);
    assert_eq!(s.delivered.len(), 2);
    let c = net.t.counters[0];
    assert_eq!((c.nacks_received, c.retransmissions), (0, 0), "{c:?}");
    assert!(c.room_asks >= 3, "{c:?}");
    s.slots = Some(10);
    net.run(&mut s, |_, _| false, 3_000_000);
    assert_delivered_in_order(&s, 6, 3000);
    let c = &net.t.counters[0];
    assert_eq!((c.nacks_received, c.retransmissions), (0, 0), "{c:?}");
    assert_eq!(c.data_packets, 6 * 3, "{c:?}");
}

/// A ROOM to a port nobody holds is answered NO_ENDPOINT: the message is
/// returned, not asked about forever.
#[test]
fn a_room_to_a_port_let_go_returns_the_message() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record {
        slots: Some(1),
        ..Default::default()
    };
    net.t.submit(KEY, msg(0, 10), 0, || (1024, 0));
    net.t.submit(KEY, msg(1, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 100_000);
    assert_eq!(s.delivered.len(), 1);
    assert!(net.t.counters[0].room_asks >= 1);
    s.unbound.push(KEY.port);
    net.run(&mut s, |_, _| false, 3_000_000);
    assert_eq!(s.returned, [(1, tx_error::NO_ENDPOINT)]);
}

#[test]
fn a_patient_message_outlasts_the_nack_budget() {
    let cfg = TransportConfig {
        nack_retries: 3,
        ..Default::default()
    };
    let mut net = Net::new(cfg);
    let mut s = Record {
        full: true,
        ..Default::default()
    };
    let impatient = ChannelKey { port: 2, ..KEY };
    net.t.submit(impatient, msg(1, 10), 0, || (1024, 0));
    let close = Message {
        patient: true,
        ..msg(2, 10)
    };
    net.t.submit(KEY, close, 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 50_000_000);
    assert_eq!(s.returned, [(1, tx_error::NO_BUFFER)]);
    assert!(net.t.counters[0].room_asks > 20);
    s.full = false;
    net.run(&mut s, |_, _| false, 3_000_000);
    assert_eq!(s.acked, [2], "the patient one waited for room");
}

#[test]
fn a_refusal_returns_that_message_and_the_rest_go_on() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    let bad = ChannelKey { port: 9, ..KEY };
    net.t.submit(bad, msg(1, 10), 0, || (1024, 0));
    net.t.submit(bad, msg(3, 10), 0, || (1024, 0));
    net.t.submit(KEY, msg(2, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 1_000_000);
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
    net.run(&mut s, |_, _| true, 100_000_000);
    let ids: Vec<u64> = s.returned.iter().map(|r| r.0).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    assert!(s.returned.iter().all(|r| r.1 == tx_error::UNREACHABLE));
    assert_eq!(net.t.counters[0].timeouts, 4);
    // Known unreachable: the next message comes back after one retry.
    net.t.submit(KEY, msg(5, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| true, 5_000_000);
    assert_eq!(s.returned.last(), Some(&(5, tx_error::UNREACHABLE)));
    assert_eq!(net.t.counters[0].timeouts, 6);
    // The channel works again in its new epoch once the path does.
    net.t.submit(KEY, msg(7, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 1_000_000);
    assert_eq!(s.acked, [7]);
}

#[test]
fn giving_up_marks_the_node_once_and_names_who_talked_to_it() {
    let cfg = TransportConfig {
        retries: 2,
        ..Default::default()
    };
    let mut net = Net::new(cfg);
    let mut s = Record::default();
    // Node 1's endpoint on port 4 has heard from node 0 (a receive
    // channel); node 0's endpoints 0 and 3 send to node 1.
    net.t.submit(KEY, msg(1, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 1_000_000);
    let back = ChannelKey {
        src: 1,
        endpoint: 2,
        dst: 0,
        port: 4,
        class: Class::Messages,
    };
    net.t.submit(back, msg(2, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 1_000_000);
    let other = ChannelKey {
        endpoint: 3,
        class: Class::Memory,
        port: 0,
        ..KEY
    };
    net.t.submit(KEY, msg(3, 10), 0, || (1024, 0));
    net.t
        .submit(other, access(4, op::WRITE_IMMEDIATE, 0, 8), 0, || (1024, 0));
    net.run(&mut s, |_, _| true, 100_000_000);
    assert_eq!(s.unreachable, [(0, 1, vec![0, 3], vec![4])]);
    assert_eq!(net.t.counters[0].unreachable, 1);
    // Heard from again: the mark goes, and a later give-up marks anew.
    net.t.submit(KEY, msg(5, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 1_000_000);
    net.t.submit(KEY, msg(6, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| true, 100_000_000);
    assert_eq!(s.unreachable.len(), 2);
}

#[test]
fn reads_are_answered_whole_through_loss_and_in_order_with_writes() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    let mut lose = lossy(4);
    let mut ids = Vec::new();
    for i in 0..40u64 {
        // Reads of 3000 bytes (three RESPONSE packets) between writes.
        let m = if i % 3 == 0 {
            access(i, op::RDMA_WRITE, i * 10, 100)
        } else {
            access(i, op::RDMA_READ, i * 10, 3000)
        };
        while !net.t.has_room(&MEMORY, m.bytes.len()) {
            net.run(&mut s, &mut lose, 1_000_000);
        }
        net.t.submit(MEMORY, m, 0, || (1024, 0));
        ids.push(i);
    }
    net.run(&mut s, &mut lose, 2_000_000_000);
    assert_eq!(s.acked, ids, "every access settled once, in order");
    assert!(s.returned.is_empty());
    for i in (0..40u64).filter(|i| i % 3 != 0) {
        assert_eq!(s.answers[&i], answer(i * 10, 3000), "read {i}");
    }
    let writes: Vec<_> = s.delivered.iter().map(|d| d.2.len()).collect();
    assert_eq!(writes.len(), 14, "each write carried out once");
    assert!(net.t.counters[1].responses_sent > 26 * 3);
    assert!(s.reads_served >= 26);
}

#[test]
fn nothing_but_reads_follows_a_read_before_its_answer() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    net.t
        .submit(MEMORY, access(1, op::RDMA_READ, 0, 100), 0, || (1024, 0));
    net.t
        .submit(MEMORY, access(2, op::RDMA_READ, 0, 100), 0, || (1024, 0));
    net.t
        .submit(MEMORY, access(3, op::RDMA_WRITE, 0, 100), 0, || (1024, 0));
    // Node 0 sends both reads, then waits: the write does not leave.
    let first: Vec<u16> = std::iter::from_fn(|| net.t.next_packet(0, 0))
        .map(|p| p.header.opcode.get())
        .collect();
    assert_eq!(first, [op::RDMA_READ, op::RDMA_READ]);
    net.run(&mut s, |_, _| false, 1_000_000);
    assert_eq!(s.acked, [1, 2, 3]);
}

#[test]
fn a_lost_answer_has_the_read_served_again() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    net.t
        .submit(MEMORY, access(1, op::RDMA_READ, 5, 2500), 0, || (1024, 0));
    let mut dropped = false;
    net.run(
        &mut s,
        |_, p| {
            let answer = p.header.kind.get() == packet::RESPONSE;
            let drop = answer && p.header.frag.get() == 1 && !dropped;
            dropped |= drop;
            drop
        },
        10_000_000,
    );
    assert_eq!(s.acked, [1]);
    assert_eq!(s.reads_served, 2, "served again after the timeout");
    assert_eq!(s.answers[&1], answer(5, 2500));
}

#[test]
fn an_ack_does_not_settle_an_unanswered_read() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    net.t
        .submit(MEMORY, access(1, op::RDMA_READ, 0, 100), 0, || (1024, 0));
    let read = net.t.next_packet(0, 0).unwrap();
    let (epoch, seq) = (read.header.epoch.get(), read.header.seq.get());
    net.t
        .receive_ack(MEMORY, (epoch, seq), 0, &[], NO_ROOM_BOUND, 0, &mut s);
    assert!(s.acked.is_empty(), "settled without its bytes");
}

#[test]
fn a_malformed_access_is_dropped_not_answered() {
    let mut net = Net::new(TransportConfig {
        retries: 1,
        ..Default::default()
    });
    let mut s = Record::default();
    let mut bad = access(1, op::RDMA_WRITE, 0, 100);
    bad.bytes.pop(); // one byte short of its header's length
    net.t.submit(MEMORY, bad, 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 10_000_000);
    assert!(net.t.counters[1].malformed_dropped > 0);
    assert!(s.delivered.is_empty());
    assert_eq!(s.returned, [(1, tx_error::UNREACHABLE)]);
}

/// A port let go after its channel delivered: the refusal's NACK lost,
/// the receiver (which keeps nothing for the port) answers the message
/// sent again with NO_ENDPOINT, instead of leaving the sender to time out
/// and give up on the whole node.
#[test]
fn a_lost_refusal_of_a_port_let_go_is_said_again() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    net.t.submit(KEY, msg(1, 10), 0, || (1024, 0));
    net.run(&mut s, |_, _| false, 1_000_000);
    assert_eq!(s.acked, [1]);
    s.unbound.push(KEY.port);
    net.t.submit(KEY, msg(2, 10), net.now, || (1024, 0));
    let mut nacks = 0;
    let lose_first_nack = |_: u64, p: &Packet| {
        if p.header.kind.get() == packet::NACK {
            nacks += 1;
            return nacks == 1;
        }
        false
    };
    net.run(&mut s, lose_first_nack, 20_000_000);
    assert_eq!(s.returned, [(2, tx_error::NO_ENDPOINT)]);
    assert!(s.unreachable.is_empty(), "{:?}", s.unreachable);
}

/// Eight messages of 64 bytes on `KEY`, moved for `span` ns with the
/// first transmission of message `lost` lost.
fn eight_with_one_lost(lost: u32, span: Nanos) -> (Net, Record) {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    for id in 0..8 {
        net.t.submit(KEY, msg(id, 64), 0, || (1024, 0));
    }
    let mut dropped = false;
    net.run(
        &mut s,
        |_, p| {
            let h = &p.header;
            let first = h.kind.get() == packet::DATA && h.seq.get() == lost && !dropped;
            dropped |= first;
            first
        },
        span,
    );
    assert!(dropped);
    (net, s)
}

/// Messages `0..count` of `len` bytes (as `msg` makes them) were
/// delivered once each, in order.
fn assert_delivered_in_order(s: &Record, count: u64, len: usize) {
    let want: Vec<Vec<u8>> = (0..count).map(|id| msg(id, len).bytes).collect();
    let got: Vec<Vec<u8>> = s.delivered.iter().map(|d| d.2.clone()).collect();
    assert_eq!(got, want, "delivered once each, in order");
}

/// A lost message followed by others: the receiver keeps those that come
/// early, the first of them draws one SACK naming the lost one, and only
/// it goes again, long before the 0.5 ms timeout (spec §10.4).
#[test]
fn a_lost_message_alone_is_sent_again_at_once() {
    // Message 1's first transmission is lost; 200 us is well under the
    // timeout.
    let (net, s) = eight_with_one_lost(1, 200_000);
    assert_eq!(s.acked, (0..8).collect::<Vec<_>>(), "all settled in order");
    assert_delivered_in_order(&s, 8, 64);
    let c = &net.t.counters[0];
    assert_eq!(c.timeouts, 0, "the gap waited for a timeout");
    assert_eq!(c.retransmissions, 1, "only message 1 went again");
    // One SACK for the hole, not one per early packet; nothing dropped.
    let r = &net.t.counters[1];
    assert_eq!(r.out_of_order_dropped, 0);
    assert_eq!(r.acks_sent, 8 + 1);
}

/// Lost fragments of long messages are asked for one by one: what goes
/// again is what was lost, a lost repair goes again when a SACK drawn by
/// a packet sent after it still lists it, and nothing waits for a timeout.
#[test]
fn lost_fragments_alone_are_sent_again_and_a_lost_repair_too() {
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    // Eight messages of 8 fragments (1 KiB MTU).
    for id in 0..8 {
        net.t.submit(KEY, msg(id, 8 << 10), 0, || (1024, 0));
    }
    // Lose fragments 2 and 5 of message 0, 7 of message 3, and the first
    // repair of message 0's fragment 2.
    let mut seen: HashMap<(u32, u16), u32> = HashMap::new();
    net.run(
        &mut s,
        |_, p| {
            let h = &p.header;
            if h.kind.get() != packet::DATA {
                return false;
            }
            let at = (h.seq.get(), h.frag.get());
            let n = seen.entry(at).or_default();
            *n += 1;
            matches!((at, *n), ((0, 2), 1 | 2) | ((0, 5), 1) | ((3, 7), 1))
        },
        400_000,
    );
    assert_delivered_in_order(&s, 8, 8 << 10);
    assert_eq!(s.acked, (0..8).collect::<Vec<_>>());
    let c = &net.t.counters[0];
    assert_eq!(c.timeouts, 0);
    // The three lost fragments, then the lost repair once more: the
    // repair of fragment 5, sent after it, came first.
    assert_eq!(c.retransmissions, 4);
    assert_eq!(net.t.counters[1].out_of_order_dropped, 0);
}

/// Random loss of 10 % on a stream: every message arrives once and in
/// order, and what goes again stays close to what was lost.
#[test]
fn under_random_loss_retransmissions_follow_the_losses() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut net = Net::new(TransportConfig::default());
    let mut s = Record::default();
    let mut next = 0u64;
    let mut lost = 0u64;
    while s.acked.len() < 400 && net.now < 2_000_000_000 {
        while next < 400 && net.t.has_room(&KEY, 4 << 10) {
            net.t.submit(KEY, msg(next, 4 << 10), net.now, || (1024, 0));
            next += 1;
        }
        net.run(
            &mut s,
            |_, _| {
                let drop = rng.gen::<f64>() < 0.1;
                lost += u64::from(drop);
                drop
            },
            10_000,
        );
    }
    assert_delivered_in_order(&s, 400, 4 << 10);
    let c = &net.t.counters[0];
    assert!(
        c.retransmissions <= 2 * lost,
        "{} retransmissions for {lost} packets lost",
        c.retransmissions
    );
}

/// A repair that completes a message the receiver cannot take draws a
/// NACK NO_BUFFER, and no SACK after it undoes the NACK's back-off: the
/// sender waits (5 us, doubling) instead of sending the window again every
/// round trip.
#[test]
fn a_refused_repair_backs_off_and_is_not_undone_by_a_sack() {
    // Message 0's first transmission is lost; the others are kept early.
    // Then the receiver runs out of buffers before the repair comes.
    let (mut net, mut s) = eight_with_one_lost(0, 10_000);
    s.full = true;
    net.run(&mut s, |_, _| false, 5_000_000);
    let c = &net.t.counters[0];
    let refusals = c.nacks_received + c.room_asks;
    assert!(
        (3..=40).contains(&refusals),
        "{refusals} NACKs and ROOMs in 5 ms: the back-off was undone"
    );
    s.full = false;
    net.run(&mut s, |_, _| false, 5_000_000);
    assert_delivered_in_order(&s, 8, 64);
}
