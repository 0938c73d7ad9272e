//! The distributed message queue (library over apertures, RDMA and
//! tripwires) between two nodes, host-attached: order, contents, wrap-around
//! with messages split across the ring's end, full-ring blocking, and the
//! fixed-entry variant.
use ulnic_testkit as common;

use std::time::Duration;

use rand::{Rng, SeedableRng};
use ulnic::{DmqKind, DmqReceiver, DmqSender, EndpointConfig, Nic};

const T: Duration = Duration::from_secs(20);
/// Sent after the numbered messages.
const SENTINEL: &[u8] = b"sentinel: that was all";

fn message(seq: u64, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|i| (seq as u8).wrapping_add((i as u8).wrapping_mul(3)))
        .collect();
    if len >= 8 {
        m[..8].copy_from_slice(&seq.to_le_bytes());
    }
    m
}

fn pair(dev: &ulnic_device::Device, ring: u64, kind: DmqKind) -> (DmqSender, DmqReceiver) {
    let cfg = EndpointConfig {
        segment_bytes: 1 << 20,
        ..Default::default()
    };
    let a = Nic::attach(&common::socket(dev, 0)).unwrap();
    let b = Nic::attach(&common::socket(dev, 1)).unwrap();
    let tx_ep = a.alloc_pd().unwrap().create_endpoint(&cfg).unwrap();
    let rx_ep = b.alloc_pd().unwrap().create_endpoint(&cfg).unwrap();
    let mut rx = DmqReceiver::new(rx_ep, 4096, ring, kind).unwrap();
    let tx = DmqSender::new(tx_ep, 8192, ring, rx.cookie(), kind).unwrap();
    rx.connect(tx.cookie());
    (tx, rx)
}

fn run(ring: u64, kind: DmqKind, count: u64, max_len: usize) {
    let dev = common::device(2);
    let (mut tx, mut rx) = pair(&dev, ring, kind);
    let sender = std::thread::spawn(move || {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for seq in 0..count {
            let len = rng.gen_range(8..=max_len);
            tx.send(&message(seq, len), T).unwrap();
        }
        tx.send(SENTINEL, T).unwrap();
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut got = Vec::new();
    for seq in 0..count {
        let len = rng.gen_range(8..=max_len);
        assert!(rx.recv(&mut got, T).unwrap(), "message {seq} never came");
        assert_eq!(got.len(), len, "message {seq}: length");
        assert!(
            got == message(seq, len),
            "message {seq} out of order or corrupted"
        );
    }
    // Exactly once: the next message is the sentinel sent after all the
    // others, so an extra or repeated one would come before it.
    assert!(rx.recv(&mut got, T).unwrap(), "the sentinel never came");
    assert!(
        got == SENTINEL,
        "an extra message before the sentinel: {got:?}"
    );
    sender.join().unwrap();
    assert!(
        !rx.try_recv(&mut got).unwrap(),
        "a message after the sentinel"
    );
}

#[test]
fn byte_queue_wraps_splits_and_blocks() {
    // A 16 KiB ring and messages up to 3000 bytes: most sends wait for
    // room, and many messages straddle the ring's end.
    run(16384, DmqKind::Bytes, 20_000, 3000);
}

#[test]
fn fixed_entry_queue() {
    run(64 * 128, DmqKind::Fixed { entry: 128 }, 20_000, 124);
}

#[test]
fn arguments_are_checked() {
    let dev = common::device(3);
    let (mut tx, _rx) = pair(&dev, 1024, DmqKind::Fixed { entry: 64 });
    assert!(tx.send(&[0u8; 61], T).is_err(), "larger than an entry");
    // Node 2: a node serves one frontend at a time.
    let nic = Nic::attach(&common::socket(&dev, 2)).unwrap();
    let ep = nic
        .alloc_pd()
        .unwrap()
        .create_endpoint(&Default::default())
        .unwrap();
    assert!(
        DmqReceiver::new(ep, 0, 1000, DmqKind::Fixed { entry: 64 }).is_err(),
        "entry does not divide the ring"
    );
}
