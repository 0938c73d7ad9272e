//! Ordered, exactly-once delivery of many messages of random sizes between
//! two host-attached clients over the real vhost-user protocol.
use ulnic_testkit as common;

use std::time::Duration;
use ulnic::{Address, Endpoint, EndpointConfig, Event, Nic, Payload};

const SLOT: u64 = 16384;
const CREDITS: u32 = 64;
const TAG_CREDIT: u32 = 1;
/// The last message, tagged with the count of those before it.
const SENTINEL: &[u8] = b"that was all";

fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq.wrapping_mul(0x9e37_79b9).wrapping_add(i as u64 * 7) >> 3) as u8)
        .collect()
}

fn size_of(seq: u64) -> usize {
    // Mix of inline (<= 96) and buffered sizes up to one slot.
    let x = seq
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        >> 33;
    if x.is_multiple_of(3) {
        (x % 97) as usize
    } else {
        (x % SLOT) as usize
    }
}

fn endpoint(nic: &Nic, port: u32) -> (ulnic::ProtectionDomain, Endpoint) {
    let pd = nic.alloc_pd().unwrap();
    let cfg = EndpointConfig {
        send_entries: CREDITS,
        recv_entries: 2 * CREDITS,
        free_entries: CREDITS,
        segment_bytes: (SLOT * 2 * u64::from(CREDITS)) as usize,
    };
    let mut ep = pd.create_endpoint(&cfg).unwrap();
    ep.bind(port).unwrap();
    (pd, ep)
}

fn no_failures(ep: &mut Endpoint) {
    if let Some(ev) = ep.poll_event() {
        panic!("unexpected event {ev:?}");
    }
}

#[test]
fn million_messages_ordered_exactly_once() {
    let total: u64 = std::env::var("ULNIC_TEST_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dev = common::device(2);
    let (s0, s1) = (common::socket(&dev, 0), common::socket(&dev, 1));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || {
        let nic = Nic::attach(&s1).unwrap();
        let (_pd, mut ep) = endpoint(&nic, 2);
        for i in 0..u64::from(CREDITS) {
            ep.post_free((u64::from(CREDITS) + i) * SLOT, SLOT as u32, i)
                .unwrap();
        }
        ready_tx.send(()).unwrap();
        let back = Address { node: 0, port: 1 };
        let mut consumed = 0u32;
        let mut buf = vec![0u8; SLOT as usize];
        let mut bytes = 0u64;
        for seq in 0..total {
            let m = loop {
                if let Some(m) = ep.poll_recv() {
                    break m;
                }
                no_failures(&mut ep);
                ep.wait(Duration::from_millis(50)).unwrap();
            };
            let n = m.len as usize;
            assert_eq!(
                m.src,
                Address { node: 0, port: 1 },
                "message {seq}: wrong source"
            );
            assert_eq!(
                m.tag, seq as u32,
                "message {seq}: out of order or duplicated"
            );
            assert_eq!(n, size_of(seq), "message {seq}: wrong length");
            match m.payload {
                Payload::Inline(d) => buf[..n].copy_from_slice(&d[..n]),
                Payload::Buffer { offset, id } => {
                    ep.read_segment(offset as usize, &mut buf[..n]);
                    ep.post_free(offset, SLOT as u32, id).unwrap();
                }
            }
            assert!(
                buf[..n] == payload(seq, n)[..],
                "message {seq}: contents differ"
            );
            bytes += n as u64;
            consumed += 1;
            if consumed == CREDITS / 2 {
                while ep
                    .post_send_inline(back, TAG_CREDIT, &consumed.to_le_bytes(), 0)
                    .is_err()
                {
                    std::thread::yield_now();
                }
                consumed = 0;
            }
        }
        // Exactly once: the next message is the sender's sentinel, sent
        // after all the others on the same (ordered) channel, so an extra
        // or repeated message would come before it.
        let m = common::next_message(&mut ep);
        assert_eq!(
            (m.tag, m.len),
            (total as u32, SENTINEL.len() as u32),
            "an extra message arrived before the sentinel: {m:?}"
        );
        assert!(ep.poll_recv().is_none(), "a message after the sentinel");
        let stats: std::collections::HashMap<_, _> = ep.stats().unwrap().into_iter().collect();
        assert_eq!(stats["rx_messages"], total + 1);
        assert_eq!(stats["rx_bytes"], bytes + SENTINEL.len() as u64);
        assert_eq!(stats["rx_dropped_no_buffer"], 0);
        bytes
    });
    let nic = Nic::attach(&s0).unwrap();
    let (_pd, mut ep) = endpoint(&nic, 1);
    // Start only once the receiver is bound: earlier sends would (rightly) fail.
    ready_rx.recv().unwrap();
    let dest = Address { node: 1, port: 2 };
    let mut credits = CREDITS;
    for seq in 0..total {
        while credits == 0 {
            match ep.poll_recv() {
                Some(m) => {
                    assert_eq!(m.tag, TAG_CREDIT);
                    let Payload::Inline(d) = m.payload else {
                        panic!("credit not inline")
                    };
                    credits += u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
                }
                None => {
                    no_failures(&mut ep);
                    ep.wait(Duration::from_millis(50)).unwrap();
                }
            }
        }
        let n = size_of(seq);
        let data = payload(seq, n);
        loop {
            let r = if n <= ulnic::INLINE_MAX as usize {
                ep.post_send_inline(dest, seq as u32, &data, seq)
            } else {
                let off = (seq % u64::from(CREDITS)) * SLOT;
                // The slot is free: at most CREDITS sends are in the ring.
                ep.write_segment(off as usize, &data);
                ep.post_send(dest, seq as u32, off, n as u32, seq, false)
            };
            match r {
                Ok(()) => break,
                Err(ulnic::Error::WouldBlock) => std::thread::yield_now(),
                Err(e) => panic!("send {seq}: {e}"),
            }
        }
        credits -= 1;
        if let Some(Event::SendFailed { id, reason, .. }) = ep.poll_event() {
            panic!("send {id} failed: {reason}");
        }
    }
    // The sentinel: inline, so it needs no free buffer, and the receive
    // ring has room for it beside every credited message.
    loop {
        match ep.post_send_inline(dest, total as u32, SENTINEL, total) {
            Ok(()) => break,
            Err(ulnic::Error::WouldBlock) => std::thread::yield_now(),
            Err(e) => panic!("the sentinel: {e}"),
        }
    }
    let bytes = receiver.join().unwrap();
    eprintln!("{total} messages, {bytes} bytes delivered in order, exactly once");
}
