//! docs/spec.md §5.1 to §5.11 and §7 (endpoint memory, descriptors,
//! events, addressing, doorbells, delivery rules, conditions, close
//! messages, counters), walked in spec order through the frontend of
//! device/tests/common/spec.rs. See conformance.rs for the whole walk.
use ulnic_testkit as common;
#[path = "common/spec.rs"]
mod spec;

use std::sync::atomic::{fence, Ordering};

use spec::{buffer_offset, pattern, payload, send_inline, send_segment, until, Ep, Raw, SMALL};
use ulnic_abi::wire::{
    EventRecord, FilterEntry, FreeDesc, ObjectId, RecvDesc, SendDesc, SetFilter,
};
use ulnic_abi::{
    cmd, condition, ctrl, event, op, recv_flags, send_flags, tx_error, RingLayout, ANY, STAT_NAMES,
};
use vhost::VhostBackend;
use zerocopy::IntoBytes;

/// (kind, code) of an event.
fn kc(e: &EventRecord) -> (u16, u16) {
    (e.kind.get(), e.code.get())
}

/// A sender bound to port 5 and a receiver bound to port 9, on node 0.
fn pair(raw: &mut Raw) -> (Ep, Ep) {
    (raw.bound(5), raw.bound(9))
}

/// SET_FILTER of `ep` with `entries` (node, port, tag, mask).
fn set_filter(raw: &mut Raw, ep: &Ep, entries: &[(u32, u32, u32, u32)]) {
    let mut p = SetFilter {
        endpoint: ep.id.into(),
        count: (entries.len() as u32).into(),
    }
    .as_bytes()
    .to_vec();
    for &(node, port, tag, tag_mask) in entries {
        let e = FilterEntry {
            node: node.into(),
            port: port.into(),
            tag: tag.into(),
            tag_mask: tag_mask.into(),
        };
        p.extend_from_slice(e.as_bytes());
    }
    raw.ok(cmd::SET_FILTER, &p);
}

/// §5.1: the control region is the control block (4096 bytes), then the
/// send, receive, free and event rings, each entries × entry size, no
/// padding; the device writes receive descriptors and events there.
#[test]
fn s5_1_the_rings_follow_the_control_block_in_order() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let l = RingLayout {
        send_entries: 2,
        recv_entries: 4,
        free_entries: 8,
        event_entries: 64,
    };
    let (recv, free, events) = (
        4096 + 2 * 128,
        4096 + 2 * 128 + 4 * 128,
        4096 + 768 + 8 * 32,
    );
    assert_eq!((l.send_offset(), l.recv_offset()), (4096, recv));
    assert_eq!((l.free_offset(), l.event_offset()), (free, events));
    assert_eq!(l.region_size(), events + 64 * 32);
    let pd = raw.pd();
    let mut r = raw.endpoint_in(pd, l, 2);
    raw.bind(&r, 9);
    let mut s = raw.bound(5);
    raw.give(&mut r, 0, 4096, 3);
    raw.post(&mut s, &send_segment((0, 9), 6, 0, 0, 200));
    until("a message", || raw.received(&r) == 1);
    let m: RecvDesc = raw.read_obj(r.ctrl + recv);
    assert_eq!((m.len.get(), m.src_port.get(), m.buf_id.get()), (200, 5, 3));
    let f: FreeDesc = raw.read_obj(r.ctrl + free);
    assert_eq!(f.user_id.get(), 3, "the free ring moved");
    raw.post(&mut r, &send_inline((0, 77), 0, 8, b"x"));
    until("an event", || raw.events(&r) == 1);
    let e: EventRecord = raw.read_obj(r.ctrl + events);
    assert_eq!(
        (kc(&e), e.user_id.get()),
        ((event::TX_ERROR, tx_error::NO_ENDPOINT), 8)
    );
}

/// §5.2: the control block's words at the spec's offsets, each index on
/// its own 64-byte line, and the device moving its own.
#[test]
fn s5_2_control_block_words() {
    let words = [
        ctrl::SEND_PRODUCER,
        ctrl::SEND_CONSUMER,
        ctrl::RECV_PRODUCER,
        ctrl::RECV_CONSUMER,
        ctrl::FREE_PRODUCER,
        ctrl::FREE_CONSUMER,
        ctrl::EVENT_PRODUCER,
        ctrl::EVENT_CONSUMER,
        ctrl::DOORBELL_WANTED,
        ctrl::ARM_REQUEST,
        ctrl::ARM_ACK,
        ctrl::CONDITION_PENDING,
    ];
    assert_eq!(words, std::array::from_fn(|i| 0x40 * i as u64));
    assert_eq!((ctrl::CLOSE_MESSAGE, ctrl::TRIPWIRE_FIRED), (0x300, 0x400));
    assert_eq!(ctrl::CONTROL_BLOCK_SIZE, 4096);
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    raw.give(&mut r, 0, 4096, 1);
    let mut d = send_segment((0, 9), 0, 4, 0, 100);
    d.flags = send_flags::COMPLETION.into();
    raw.post(&mut s, &d);
    raw.until_sent(&s, 1);
    until("delivered", || raw.word(&r, ctrl::RECV_PRODUCER) == 1);
    assert_eq!(raw.word(&r, ctrl::FREE_CONSUMER), 1);
    assert_eq!(raw.word(&s, ctrl::EVENT_PRODUCER), 1);
    assert_eq!(raw.word(&r, ctrl::EVENT_PRODUCER), 0);
    assert_eq!(kc(&raw.event(&mut s)), (event::TX_DONE, 0));
    assert_eq!(raw.recv(&mut r).len.get(), 100);
}

/// §5.3, §5.9: one endpoint's send ring is served in order (across the
/// ring's wrap), inline and segment sends alike, every byte as sent.
#[test]
fn s5_3_a_send_ring_is_served_in_order() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let pd = raw.pd();
    let mut r = raw.endpoint_in(pd, SMALL, 4);
    raw.bind(&r, 9);
    let sizes = [0usize, 1, 96, 97, 200, 4096, 50];
    raw.write(s.seg, &pattern(8192, 9));
    let inline = |k: usize, len: usize| len <= 96 && k.is_multiple_of(2);
    let mut seq = 0u32;
    for _round in 0..4 {
        let mut buffer = 0;
        for (k, &len) in sizes.iter().enumerate() {
            if len > 96 {
                raw.give(&mut r, 4096 * buffer, 4096, u64::from(seq));
                buffer += 1;
            }
            let d = if inline(k, len) {
                send_inline((0, 9), seq, 0, &pattern(len, seq as u8))
            } else {
                send_segment((0, 9), seq, 0, u64::from(seq), len as u32)
            };
            raw.post(&mut s, &d);
            seq += 1;
        }
        for (k, &len) in sizes.iter().enumerate() {
            let tag = seq - sizes.len() as u32 + k as u32;
            let m = raw.recv(&mut r);
            assert_eq!(
                (m.tag.get(), m.len.get() as usize),
                (tag, len),
                "out of order"
            );
            let want = if inline(k, len) {
                pattern(len, tag as u8)
            } else {
                pattern(8192, 9)[tag as usize..tag as usize + len].to_vec()
            };
            let got = if len <= 96 {
                assert_eq!(m.flags.get(), recv_flags::INLINE);
                payload(&m).to_vec()
            } else {
                assert_eq!(m.buf_id.get(), u64::from(tag));
                raw.read(r.seg + buffer_offset(&m), len)
            };
            assert_eq!(got, want, "message {tag}");
        }
    }
    assert_eq!(raw.word(&s, ctrl::SEND_CONSUMER), seq);
}

/// §5.3, §5.4: a send of length 0 is a valid message, delivered inline
/// with no payload and no free buffer, whether sent inline or not.
#[test]
fn s5_3_a_send_of_length_0_is_delivered_inline() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    raw.give(&mut r, 0, 4096, 1);
    raw.post(&mut s, &send_segment((0, 9), 1, 0, 0, 0));
    raw.post(&mut s, &send_inline((0, 9), 2, 0, &[]));
    for tag in [1, 2] {
        let m = raw.recv(&mut r);
        assert_eq!(
            (m.flags.get(), m.len.get(), m.tag.get()),
            (recv_flags::INLINE, 0, tag)
        );
        assert_eq!(m.buf_id.get(), 0);
    }
    assert_eq!(
        raw.word(&r, ctrl::FREE_CONSUMER),
        0,
        "a free buffer was used"
    );
}

/// §5.4: messages of at most INLINE_MAX bytes are always delivered inline,
/// however they were sent; longer ones fill the next free buffer (its id
/// and offset in the descriptor). The device stamps the source.
#[test]
fn s5_4_messages_up_to_inline_max_are_always_inline() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    raw.write(s.seg, &pattern(200, 4));
    raw.give(&mut r, 4096, 1000, 42);
    raw.post(&mut s, &send_segment((0, 9), 7, 0, 0, 96));
    let m = raw.recv(&mut r);
    assert_eq!(
        (m.flags.get(), m.len.get(), m.buf_id.get()),
        (recv_flags::INLINE, 96, 0)
    );
    assert_eq!((m.src_node.get(), m.src_port.get(), m.tag.get()), (0, 5, 7));
    // §5.4: the sender's session id, as its control block says.
    let session = raw.word(&s, ctrl::SESSION);
    assert_ne!(session, 0);
    assert_eq!((m.reserved0.get(), m.session.get()), (0, session));
    assert_eq!(payload(&m), &pattern(200, 4)[..96]);
    assert_eq!(raw.word(&r, ctrl::FREE_CONSUMER), 0);
    raw.post(&mut s, &send_segment((0, 9), 8, 0, 0, 97));
    let m = raw.recv(&mut r);
    assert_eq!((m.flags.get(), m.len.get(), m.buf_id.get()), (0, 97, 42));
    assert_eq!(buffer_offset(&m), 4096);
    assert_eq!(raw.read(r.seg + 4096, 97), &pattern(200, 4)[..97]);
    assert_eq!(raw.word(&r, ctrl::FREE_CONSUMER), 1);
}

/// §5.5, §5.9: free descriptors with a reserved field set, of length 0 or
/// outside the segment are discarded when reached, counted in
/// bad_descriptors and reported with one BAD_FREE_DESCRIPTOR condition.
#[test]
fn s5_5_bad_free_descriptors_are_discarded() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    let good = FreeDesc {
        seg_offset: 0.into(),
        len: 4096.into(),
        reserved0: 0.into(),
        user_id: 5.into(),
        reserved1: 0.into(),
    };
    let bad = [
        FreeDesc {
            reserved0: 1.into(),
            ..good
        },
        FreeDesc {
            reserved1: 1.into(),
            ..good
        },
        FreeDesc {
            len: 0.into(),
            ..good
        },
        FreeDesc {
            seg_offset: (8192 - 8).into(),
            len: 16.into(),
            ..good
        },
        FreeDesc {
            seg_offset: (u64::MAX - 7).into(),
            len: 16.into(),
            ..good
        },
    ];
    for f in &bad {
        raw.give_desc(&mut r, f);
    }
    raw.give_desc(&mut r, &good);
    raw.post(&mut s, &send_segment((0, 9), 0, 0, 0, 200));
    let m = raw.recv(&mut r);
    assert_eq!((m.buf_id.get(), m.len.get()), (5, 200));
    assert_eq!(raw.word(&r, ctrl::FREE_CONSUMER), 6);
    assert_eq!(raw.stat(&r, "bad_descriptors"), 5);
    let e = raw.event(&mut r);
    assert_eq!(kc(&e), (event::CONDITION, condition::BAD_FREE_DESCRIPTOR));
    assert_eq!(raw.events(&r), 0, "the condition was not suppressed");
    assert_eq!(raw.pending(&r, condition::BAD_FREE_DESCRIPTOR), 1);
}

/// §5.9: a free buffer shorter than the message is BUFFER_TOO_SMALL and
/// stays the next buffer (not consumed).
#[test]
fn s5_5_a_buffer_too_small_is_not_consumed() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    raw.give(&mut r, 0, 100, 3);
    raw.post(&mut s, &send_segment((0, 9), 0, 1, 0, 200));
    assert_eq!(
        kc(&raw.event(&mut s)),
        (event::TX_ERROR, tx_error::BUFFER_TOO_SMALL)
    );
    assert_eq!(raw.word(&r, ctrl::FREE_CONSUMER), 0);
    assert_eq!(raw.received(&r), 0);
    raw.post(&mut s, &send_segment((0, 9), 0, 2, 0, 100));
    assert_eq!(raw.recv(&mut r).buf_id.get(), 3);
}

/// §5.6: TX_DONE for a delivered send with COMPLETION, none without; user
/// id, node, port and len copied from the descriptor, aux and the reserved
/// word 0; TX_ERROR the same with its code.
#[test]
fn s5_6_the_events_of_sends() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    raw.post(&mut s, &send_inline((0, 9), 1, 10, b"quiet"));
    let mut d = send_inline((0, 9), 2, 11, b"tell me");
    d.flags = (send_flags::INLINE | send_flags::COMPLETION).into();
    raw.post(&mut s, &d);
    raw.post(&mut s, &send_inline((0, 99), 3, 12, b"nobody"));
    raw.until_sent(&s, 3);
    let done = raw.event(&mut s);
    let fields = |e: &EventRecord| {
        let f = (e.user_id.get(), e.node.get(), e.port.get(), e.len.get());
        (kc(e), e.aux.get(), f, e.session.get())
    };
    assert_eq!(fields(&done), ((event::TX_DONE, 0), 0, (11, 0, 9, 7), 0));
    let err = raw.event(&mut s);
    let no_endpoint = (event::TX_ERROR, tx_error::NO_ENDPOINT);
    assert_eq!(fields(&err), (no_endpoint, 0, (12, 0, 99, 6), 0));
    assert_eq!(raw.events(&s), 0, "an event for a quiet send");
    assert_eq!(raw.received(&r), 2);
    assert_eq!(payload(&raw.recv(&mut r)), b"quiet");
}

/// §5.6: the device posts a send's event before it moves the send
/// consumer past it.
#[test]
fn s5_6_an_event_is_posted_before_the_consumer_moves() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    for i in 1..=40u32 {
        raw.post(&mut s, &send_inline((0, 99), 0, u64::from(i), b"x"));
        until("consumed", || raw.word(&s, ctrl::SEND_CONSUMER) == i);
        assert_eq!(raw.events(&s), 1, "send {i} passed before its event");
        assert_eq!(raw.event(&mut s).user_id.get(), u64::from(i));
    }
}

/// §5.6: a send descriptor is taken only while the event ring has more
/// than CONDITION_RESERVE (32) free slots; the others wait in the ring,
/// and are served once the user has consumed events (and rung, §5.8).
#[test]
fn s5_6_a_send_is_taken_only_with_room_for_its_event() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let failing = |i: u32| send_inline((0, 99), 0, u64::from(i), b"x");
    for i in 0..32 {
        raw.post(&mut s, &failing(i));
        raw.until_sent(&s, i + 1);
    }
    assert_eq!(raw.events(&s), 32);
    for i in 32..40 {
        raw.post(&mut s, &failing(i));
    }
    spec::settled(&dev, &[&raw]);
    assert_eq!(
        raw.word(&s, ctrl::SEND_CONSUMER),
        32,
        "taken with no room left"
    );
    assert_eq!(raw.events(&s), 32);
    for i in 0..8 {
        assert_eq!(raw.event(&mut s).user_id.get(), i);
    }
    fence(Ordering::SeqCst);
    if raw.word(&s, ctrl::DOORBELL_WANTED) != 0 {
        raw.ring(&s);
    }
    raw.until_sent(&s, 40);
    assert_eq!(raw.events(&s), 32);
    assert_eq!(raw.stat(&s, "events_lost"), 0);
}

/// §5.7: the device stamps a receive descriptor with the sender's true
/// node and bound port.
#[test]
fn s5_7_the_receiver_sees_the_senders_true_node_and_port() {
    let dev = common::device(2);
    let mut r0 = Raw::new(&common::socket(&dev, 0));
    let mut rx = r0.bound(9);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut s = r1.bound(77);
    r1.post(&mut s, &send_inline((0, 9), 0x33, 0, b"from 1"));
    let m = r0.recv(&mut rx);
    let src = (m.src_node.get(), m.src_port.get(), m.tag.get());
    assert_eq!(src, (1, 77, 0x33));
    r1.bind(&s, 78);
    r1.post(&mut s, &send_inline((0, 9), 0x34, 0, b"again"));
    let m = r0.recv(&mut rx);
    assert_eq!((m.src_node.get(), m.src_port.get()), (1, 78));
}

/// A receiver (node 0, port 9) and senders on node 0 (port 78) and node 1
/// (port 77).
struct Filtering {
    r0: Raw,
    rx: Ep,
    s0: Ep,
    r1: Raw,
    s1: Ep,
    rejected: u64,
}

impl Filtering {
    fn set(&mut self, entries: &[(u32, u32, u32, u32)]) {
        set_filter(&mut self.r0, &self.rx, entries);
    }

    /// Node `node`'s sender sends tag `tag`; the receiver takes it or the
    /// sender gets REJECTED.
    fn check(&mut self, node: u32, tag: u32, accepted: bool) {
        let Filtering {
            r0, rx, s0, r1, s1, ..
        } = self;
        let (from, s) = if node == 1 { (r1, s1) } else { (&mut *r0, s0) };
        from.post(s, &send_inline((0, 9), tag, 1, b"?"));
        let refused = (!accepted).then(|| from.event(s));
        match refused {
            None => assert_eq!(r0.recv(rx).tag.get(), tag),
            Some(e) => {
                assert_eq!(
                    kc(&e),
                    (event::TX_ERROR, tx_error::REJECTED),
                    "tag {tag:#x}"
                );
                self.rejected += 1;
                assert_eq!(r0.stat(rx, "rx_rejected"), self.rejected);
                assert_eq!(r0.received(rx), 0);
            }
        }
    }
}

/// §5.7, §5.9: a receiver's filter accepts a message when some entry
/// matches (node and port equal or ANY, tag & mask equal); an empty list
/// accepts all; a refusal is REJECTED at the sender, rx_rejected at the
/// receiver.
#[test]
fn s5_7_filters_match_node_port_and_masked_tag() {
    let dev = common::device(2);
    let mut r0 = Raw::new(&common::socket(&dev, 0));
    let (rx, s0) = (r0.bound(9), r0.bound(78));
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let s1 = r1.bound(77);
    let mut f = Filtering {
        r0,
        rx,
        s0,
        r1,
        s1,
        rejected: 0,
    };
    f.set(&[(ANY, 77, 0x10, 0xf0)]);
    f.check(1, 0x1f, true);
    f.check(1, 0x2f, false);
    f.check(0, 0x1f, false);
    f.set(&[(0, ANY, 0, 0), (1, 77, 5, u32::MAX)]);
    f.check(0, 0xabc, true);
    f.check(1, 4, false);
    f.check(1, 5, true);
    f.set(&[]);
    f.check(1, 0x2f, true);
    f.check(0, 0, true);
}

/// §5.8: an endpoint left idle asks for a doorbell (`doorbell wanted`
/// non-zero); a descriptor published then is not served until the
/// driver sets its bit and kicks its domain's doorbell queue; the kick
/// serves every descriptor published before it, counts one doorbell, and
/// the device clears the bitmap word.
#[test]
fn s5_8_an_idle_endpoint_is_served_when_rung() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    until("doorbell wanted", || {
        raw.word(&s, ctrl::DOORBELL_WANTED) != 0
    });
    for i in 0..6 {
        raw.publish(&mut s, send_inline((0, 9), i, 0, b"x").as_bytes());
    }
    spec::settled(&dev, &[&raw]);
    assert_eq!(
        raw.word(&s, ctrl::SEND_CONSUMER),
        0,
        "served without a doorbell"
    );
    assert_eq!(raw.stat(&s, "doorbells"), 0);
    raw.ring(&s);
    raw.until_sent(&s, 6);
    for i in 0..6 {
        assert_eq!(raw.recv(&mut r).tag.get(), i);
    }
    assert_eq!(raw.stat(&s, "doorbells"), 1);
    assert_eq!(
        raw.load64(s.pd.bitmap),
        0,
        "the bitmap word was not cleared"
    );
}

/// §5.8: on a kick the device clears the domain's bitmap; bits naming no
/// endpoint, or one of another domain, are ignored (no doorbell counted,
/// nothing served).
#[test]
fn s5_8_bits_for_another_domains_endpoints_are_ignored() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut a, mut r) = pair(&mut raw);
    let b = raw.bound(6);
    assert_ne!(a.pd.queue, b.pd.queue);
    until("doorbell wanted", || {
        raw.word(&a, ctrl::DOORBELL_WANTED) != 0
    });
    raw.publish(&mut a, send_inline((0, 9), 1, 0, b"x").as_bytes());
    raw.set_bit(b.pd, a.id);
    let unused = (0..8).find(|e| ![a.id, b.id, r.id].contains(e)).unwrap();
    raw.set_bit(b.pd, unused);
    // Past the bitmap's one word (E = 8): the device never writes there.
    raw.fill(b.pd.bitmap + 8, 4088, 0xa5);
    raw.kick(b.pd.queue);
    until("the bitmap cleared", || raw.load64(b.pd.bitmap) == 0);
    assert_eq!(raw.read(b.pd.bitmap + 8, 4088), vec![0xa5; 4088]);
    spec::settled(&dev, &[&raw]);
    assert_eq!(
        raw.word(&a, ctrl::SEND_CONSUMER),
        0,
        "served by another's doorbell"
    );
    assert_eq!(raw.stat(&a, "doorbells"), 0);
    raw.ring(&a);
    assert_eq!(raw.recv(&mut r).tag.get(), 1);
    assert_eq!(raw.stat(&a, "doorbells"), 1);
}

/// §5.8, §4.2: CREATE_PD's doorbell bitmap (ceil(E/64) words) must be
/// 8-byte aligned (INVALID_ARGUMENT) and lie within one page and in
/// shared memory (BAD_ADDRESS).
#[test]
fn s5_8_create_pd_checks_its_bitmap() {
    let dev = common::device_with(1, |b| b.max_endpoints(200));
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let page = raw.alloc(4096);
    let end = spec::MEM as u64;
    let cases = [
        (page + 4, ulnic_abi::status::INVALID_ARGUMENT),
        (page + 4096 - 24, ulnic_abi::status::BAD_ADDRESS),
        (end, ulnic_abi::status::BAD_ADDRESS),
        (end - 8, ulnic_abi::status::BAD_ADDRESS),
        (page + 4096 - 32, ulnic_abi::status::OK),
        (end - 32, ulnic_abi::status::OK),
    ];
    for (gpa, want) in cases {
        let a = ulnic_abi::wire::CreatePd {
            doorbell_gpa: gpa.into(),
        };
        assert_eq!(raw.status(cmd::CREATE_PD, &a), want, "bitmap at {gpa:#x}");
    }
}

/// §5.9: the sender's checks in order: BAD_DESCRIPTOR (reserved word,
/// opcode, flags, lengths), then BAD_ADDRESS (payload outside the
/// segment), then NOT_BOUND; each a TX_ERROR with the descriptor's fields,
/// nothing at any receiver.
#[test]
fn s5_9_the_senders_checks_in_order() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let mut u = raw.endpoint_in(pd, SMALL, 2);
    let r = raw.bound(9);
    let big = ulnic_abi::MAX_MESSAGE + 1;
    let with = |d: SendDesc, f: &dyn Fn(&mut SendDesc)| {
        let mut d = d;
        f(&mut d);
        d
    };
    let inline = send_inline((0, 9), 0, 0, b"hello");
    let outside = send_segment((0, 9), 0, 0, 8192 - 50, 100);
    let bad = tx_error::BAD_DESCRIPTOR;
    let cases = [
        (
            with(send_segment((7, 9), 0, 0, 1 << 40, big), &|d| {
                d.reserved = 1.into()
            }),
            bad,
        ),
        (with(inline, &|d| d.reserved = 1.into()), bad),
        (with(inline, &|d| d.opcode = 0.into()), bad),
        (with(inline, &|d| d.opcode = 8.into()), bad),
        // OOB (opcode 7): at most 8 bytes, inline only.
        (
            with(inline, &|d| {
                d.opcode = op::OOB.into();
                d.len = 9.into();
            }),
            bad,
        ),
        (
            with(outside, &|d| {
                d.opcode = op::OOB.into();
                d.len = 8.into();
            }),
            bad,
        ),
        (
            with(inline, &|d| d.flags = (send_flags::INLINE | 8).into()),
            bad,
        ),
        (with(inline, &|d| d.len = 97.into()), bad),
        (
            with(inline, &|d| {
                d.flags = (send_flags::INLINE | send_flags::UTLB).into()
            }),
            bad,
        ),
        (with(outside, &|d| d.len = big.into()), bad),
        (outside, tx_error::BAD_ADDRESS),
        (
            send_segment((0, 9), 0, 0, u64::MAX - 10, 100),
            tx_error::BAD_ADDRESS,
        ),
        (send_segment((1, 9), 0, 0, 0, 100), tx_error::NOT_BOUND),
        (inline, tx_error::NOT_BOUND),
    ];
    for (i, (d, want)) in cases.iter().enumerate() {
        let mut d = *d;
        d.user_id = (100 + i as u64).into();
        raw.post(&mut u, &d);
        let e = raw.event(&mut u);
        assert_eq!(kc(&e), (event::TX_ERROR, *want), "case {i}");
        let f = (e.user_id.get(), e.node.get(), e.port.get(), e.len.get());
        let want = (
            100 + i as u64,
            d.dest_node.get(),
            d.dest_port.get(),
            d.len.get(),
        );
        assert_eq!((f, e.aux.get()), (want, 0), "case {i}");
    }
    assert_eq!(raw.received(&r), 0);
    assert_eq!(raw.stat(&u, "tx_errors"), cases.len() as u64);
}

/// §5.9: the receiver's checks in order: NO_ENDPOINT (no such node, node
/// not connected, port not bound), REJECTED (filter), NO_BUFFER (with a
/// RECV_DROPPED condition at the receiver, counted on both sides),
/// BUFFER_TOO_SMALL; nothing is written at the receiver.
#[test]
fn s5_9_the_receivers_checks_in_order() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    set_filter(&mut raw, &r, &[(ANY, ANY, 1, 1)]);
    // Room for the one message the fabric returns (§10.4).
    raw.give(&mut s, 4096, 1000, 77);
    let cases = [
        ((7, 9), 1, tx_error::NO_ENDPOINT),
        ((1, 9), 1, tx_error::NO_ENDPOINT),
        ((0, 99), 1, tx_error::NO_ENDPOINT),
        ((0, 9), 2, tx_error::REJECTED),
        ((0, 9), 1, tx_error::NO_BUFFER),
    ];
    for (dest, tag, want) in cases {
        raw.post(&mut s, &send_segment(dest, tag, 0, 0, 200));
        assert_eq!(kc(&raw.event(&mut s)), (event::TX_ERROR, want), "{dest:?}");
    }
    // Node 1 is another node: its refusal came back through the fabric,
    // with the message (RETURNED, stamped with where it was going).
    let back = raw.recv(&mut s);
    assert_eq!(back.flags.get(), recv_flags::RETURNED);
    assert_eq!(
        (back.src_node.get(), back.src_port.get(), back.tag.get()),
        (1, 9, 1)
    );
    assert_eq!(
        raw.received(&s),
        0,
        "returned twice, or a node-local refusal returned"
    );
    let e = raw.event(&mut r);
    assert_eq!(kc(&e), (event::CONDITION, condition::RECV_DROPPED));
    assert_eq!(raw.pending(&r, condition::RECV_DROPPED), 1);
    assert_eq!(raw.stat(&r, "rx_dropped_no_buffer"), 1);
    assert_eq!(raw.stat(&s, "returned_no_buffer"), 1);
    raw.give(&mut r, 0, 100, 1);
    raw.post(&mut s, &send_segment((0, 9), 1, 0, 0, 200));
    assert_eq!(
        kc(&raw.event(&mut s)),
        (event::TX_ERROR, tx_error::BUFFER_TOO_SMALL)
    );
    assert_eq!(raw.received(&r), 0, "written at the receiver");
    assert_eq!(raw.word(&r, ctrl::FREE_CONSUMER), 0);
}

/// §5.9: a full receive ring refuses even an inline message: NO_BUFFER,
/// with RECV_DROPPED at the receiver.
#[test]
fn s5_9_a_full_receive_ring_is_no_buffer() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let pd = raw.pd();
    let two = RingLayout {
        recv_entries: 2,
        ..SMALL
    };
    let mut r = raw.endpoint_in(pd, two, 1);
    raw.bind(&r, 9);
    for i in 0..3 {
        raw.post(&mut s, &send_inline((0, 9), i, 0, b"x"));
    }
    assert_eq!(
        kc(&raw.event(&mut s)),
        (event::TX_ERROR, tx_error::NO_BUFFER)
    );
    assert_eq!(raw.received(&r), 2);
    assert_eq!(
        kc(&raw.event(&mut r)),
        (event::CONDITION, condition::RECV_DROPPED)
    );
}

/// §5.10: a condition is posted only while its pending byte is 0, and
/// sets it; the user clears it to hear of the next one.
#[test]
fn s5_10_conditions_are_duplicate_suppressed() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    assert_eq!(
        (condition::RING_INDEX, condition::BAD_FREE_DESCRIPTOR),
        (0, 1)
    );
    assert_eq!(condition::RECV_DROPPED, 2);
    for i in 0..3 {
        raw.post(&mut s, &send_segment((0, 9), 0, i, 0, 200));
    }
    raw.until_sent(&s, 3);
    assert_eq!(
        kc(&raw.event(&mut r)),
        (event::CONDITION, condition::RECV_DROPPED)
    );
    spec::settled(&dev, &[&raw]);
    assert_eq!(raw.events(&r), 0, "a duplicate condition");
    raw.clear_pending(&r, condition::RECV_DROPPED);
    raw.post(&mut s, &send_segment((0, 9), 0, 3, 0, 200));
    assert_eq!(
        kc(&raw.event(&mut r)),
        (event::CONDITION, condition::RECV_DROPPED)
    );
    assert_eq!(raw.stat(&r, "rx_dropped_no_buffer"), 4);
}

/// §5.11: when an endpoint is destroyed the device sends its close
/// message as an inline message flagged CLOSE, stamped with the destroyed
/// endpoint's node and port, after every message it sent that receiver
/// (sends it took: those still in the ring are never sent).
#[test]
fn s5_11_a_close_message_is_delivered_when_its_endpoint_is_destroyed() {
    let dev = common::device(2);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut rx = r1.bound(9);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    raw.set_close_message(&s, &send_inline((1, 9), 0xc105e, 0, b"goodbye"));
    for i in 0..3 {
        raw.post(&mut s, &send_inline((1, 9), i, 0, b"data"));
    }
    raw.until_sent(&s, 3);
    raw.destroy(&s);
    for i in 0..3 {
        let m = r1.recv(&mut rx);
        assert_eq!((m.tag.get(), m.flags.get()), (i, recv_flags::INLINE));
    }
    let m = r1.recv(&mut rx);
    assert_eq!(m.flags.get(), recv_flags::INLINE | recv_flags::CLOSE);
    let fields = (m.src_node.get(), m.src_port.get(), m.tag.get(), m.len.get());
    assert_eq!(fields, (0, 5, 0xc105e, 7));
    assert_eq!(payload(&m), b"goodbye");
}

/// §5.11: close messages are sent for endpoints destroyed by DESTROY_PD
/// and by the frontend disconnecting, and one finding the receive ring
/// full waits in the device until a slot frees.
#[test]
fn s5_11_close_messages_on_destroy_pd_on_disconnect_and_into_a_full_ring() {
    let dev = common::device(2);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let pd = r1.pd();
    let two = RingLayout {
        recv_entries: 2,
        ..SMALL
    };
    let mut rx = r1.endpoint_in(pd, two, 1);
    r1.bind(&rx, 9);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    for (port, tag) in [(5, 1), (6, 2), (7, 3)] {
        let ep = raw.bound(port);
        raw.set_close_message(&ep, &send_inline((1, 9), tag, 0, b"bye"));
        if port == 5 {
            raw.ok(
                cmd::DESTROY_PD,
                ObjectId {
                    id: ep.pd.id.into(),
                }
                .as_bytes(),
            );
        }
    }
    until("the first close message", || r1.received(&rx) == 1);
    drop(raw);
    until("two close messages", || r1.received(&rx) == 2);
    // The third is held by the transport, which keeps asking for room
    // (ROOM packets after the first NACK): once twice more, it was tried
    // against the full ring (it never settles while it waits).
    let refusals = || {
        dev.fabric_counters().map_or(0, |c| {
            c.transport
                .iter()
                .map(|t| t.nacks_received + t.room_asks)
                .sum::<u64>()
        })
    };
    let before = refusals();
    until("the third refused for room", || refusals() >= before + 2);
    assert_eq!(r1.received(&rx), 2, "delivered into a full ring");
    let first = r1.recv(&mut rx);
    let close = recv_flags::INLINE | recv_flags::CLOSE;
    assert_eq!(
        (first.tag.get(), first.src_port.get(), first.flags.get()),
        (1, 5, close)
    );
    let mut tags = [r1.recv(&mut rx).tag.get(), r1.recv(&mut rx).tag.get()];
    tags.sort_unstable();
    assert_eq!(tags, [2, 3]);
}

/// §5.11: close messages are also sent when the frontend stops the
/// control queue, and when the device ends the connection itself (§8).
#[test]
fn s5_11_close_messages_on_a_control_queue_stop_and_a_connection_ended() {
    let dev = common::device(2);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut rx = r1.bound(9);
    let sock = common::socket(&dev, 0);
    let mut raw = Raw::new(&sock);
    let ep = raw.bound(5);
    raw.set_close_message(&ep, &send_inline((1, 9), 1, 0, b"reset"));
    raw.fe.get_vring_base(0).unwrap();
    assert_eq!(r1.recv(&mut rx).tag.get(), 1);
    raw.restart_queue(0);
    let ep = raw.bound(6);
    raw.set_close_message(&ep, &send_inline((1, 9), 2, 0, b"ended"));
    // A region longer than its file: refused, and the device ends the
    // connection (§2.3).
    let mut bad = raw.region();
    bad.memory_size *= 2;
    assert!(raw.fe.set_mem_table(&[bad]).is_err());
    let m = r1.recv(&mut rx);
    assert_eq!(
        (m.tag.get(), m.src_port.get(), payload(&m)),
        (2, 6, &b"ended"[..])
    );
}

/// Destroys a new endpoint of `raw` (bound to `port` if any) whose close
/// message is `d`.
fn close_with(raw: &mut Raw, port: Option<u32>, d: &SendDesc) {
    let pd = raw.pd();
    let ep = raw.endpoint_in(pd, SMALL, 1);
    if let Some(p) = port {
        raw.bind(&ep, p);
    }
    raw.set_close_message(&ep, d);
    raw.destroy(&ep);
}

/// §5.11: opcode 0 is no close message; a malformed one (other opcode,
/// not inline, too long, unknown flags) or one of an unbound endpoint is
/// not sent.
#[test]
fn s5_11_malformed_close_messages_are_not_sent() {
    let dev = common::device(2);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut rx = r1.bound(9);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let good = send_inline((1, 9), 1, 0, b"bye");
    let with = |f: &dyn Fn(&mut SendDesc)| {
        let mut d = good;
        f(&mut d);
        d
    };
    let malformed = [
        with(&|d| d.opcode = 0.into()),
        with(&|d| d.flags = 0.into()),
        with(&|d| d.opcode = ulnic_abi::op::RDMA_WRITE.into()),
        with(&|d| d.opcode = 7.into()),
        with(&|d| d.len = 97.into()),
        with(&|d| d.flags = (send_flags::INLINE | 8).into()),
    ];
    for d in &malformed {
        close_with(&mut raw, Some(5), d);
    }
    close_with(&mut raw, None, &good);
    close_with(&mut raw, Some(5), &with(&|d| d.tag = 2.into()));
    let m = r1.recv(&mut rx);
    assert_eq!(m.tag.get(), 2, "a malformed close message was sent");
    spec::settled(&dev, &[&r1, &raw]);
    assert_eq!(r1.received(&rx), 0, "a malformed close message was sent");
}

/// §5.11: a close message is "a send descriptor with opcode SEND, flag
/// INLINE"; one with other flags, or a reserved word that is not zero, is
/// malformed and not sent.
#[test]
fn s5_11_a_close_message_with_other_flags_is_not_sent() {
    let dev = common::device(2);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut rx = r1.bound(9);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let good = send_inline((1, 9), 1, 0, b"bye");
    for flags in [send_flags::COMPLETION, send_flags::UTLB] {
        let mut d = good;
        d.flags = (send_flags::INLINE | flags).into();
        close_with(&mut raw, Some(5), &d);
    }
    let mut reserved = good;
    reserved.reserved = 1.into();
    close_with(&mut raw, Some(5), &reserved);
    let mut last = good;
    last.tag = 2.into();
    close_with(&mut raw, Some(5), &last);
    let m = r1.recv(&mut rx);
    assert_eq!(m.tag.get(), 2, "a close message with other flags was sent");
}

/// §7: GET_STATS returns the 17 counters in the spec's order.
#[test]
fn s7_get_stats_counts_in_the_spec_order() {
    assert_eq!(STAT_NAMES.to_vec(), spec::spec_counters());
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = pair(&mut raw);
    raw.give(&mut r, 0, 4096, 1);
    raw.post(&mut s, &send_inline((0, 9), 0, 0, &[7; 10]));
    raw.post(&mut s, &send_segment((0, 9), 0, 0, 0, 200));
    raw.post(&mut s, &send_inline((0, 99), 0, 0, &[7; 5]));
    raw.until_sent(&s, 3);
    raw.recv(&mut r);
    raw.recv(&mut r);
    let sent = raw.stats(&s);
    let got = |s: &[(&str, u64)], i: usize| s[i].1;
    assert_eq!((got(&sent, 0), got(&sent, 1), got(&sent, 4)), (2, 210, 1));
    assert_eq!((got(&sent, 2), got(&sent, 3)), (0, 0));
    let received = raw.stats(&r);
    assert_eq!((got(&received, 2), got(&received, 3)), (2, 210));
    assert_eq!((got(&received, 0), got(&received, 4)), (0, 0));
}
