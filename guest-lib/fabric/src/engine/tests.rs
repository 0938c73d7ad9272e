//! The engine against a hostile sender: raw packets posted with the ulnic
//! library to an engine's endpoint on a test device.

use std::sync::Arc;

use ulnic::{Address, EndpointConfig, Nic};
use zerocopy::IntoBytes;

use super::*;
use crate::mr::MrTable;

/// A one-byte message packet numbered `seq`.
fn packet(seq: u32, byte: u8) -> Vec<u8> {
    let h = Header {
        magic: MAGIC.into(),
        kind: KIND_MSG,
        flags: 0,
        seq: seq.into(),
        msg_len: 1.into(),
        offset: 0.into(),
        tag: 0.into(),
        data: 0.into(),
    };
    let mut b = h.as_bytes().to_vec();
    b.push(byte);
    b
}

#[test]
fn a_packet_past_the_window_is_dropped_not_kept() {
    let dev = ulnic_testkit::device(1);
    let nic = Nic::attach(&dev.socket(0)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut engine = Engine::open(&pd, Some(PORT_BASE + 1), Arc::new(MrTable::default())).unwrap();
    let mut raw = pd.create_endpoint(&EndpointConfig::default()).unwrap();
    raw.bind(PORT_BASE + 2).unwrap();
    let to = Address {
        node: 0,
        port: PORT_BASE + 1,
    };
    // In order 0, then far ahead (a peer breaking the protocol), then
    // just ahead, then 1: 0 and 1 are delivered, the packet just ahead is
    // kept aside and then delivered, the far one is never kept.
    for (seq, byte) in [(0, b'a'), (WINDOW + 5000, b'x'), (2, b'c'), (1, b'b')] {
        raw.post_send_inline(to, 0, &packet(seq, byte), 0).unwrap();
    }
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while engine.unexpected.len() < 3 && std::time::Instant::now() < deadline {
        engine.progress(&mut out);
    }
    let got: Vec<u8> = engine.unexpected.iter().map(|u| u.bytes[0]).collect();
    assert_eq!(got, b"abc");
    let src = Address {
        node: 0,
        port: PORT_BASE + 2,
    };
    let peer = &engine.peers[&src];
    assert!(
        peer.stash.is_empty(),
        "{} packets kept aside",
        peer.stash.len()
    );
    assert_eq!(peer.next, 3);
    // WINDOW - 1 ahead is still kept (a sender may have that many).
    raw.post_send_inline(to, 0, &packet(3 + WINDOW - 1, b'y'), 0)
        .unwrap();
    while engine.peers[&src].stash.is_empty() && std::time::Instant::now() < deadline {
        engine.progress(&mut out);
    }
    assert_eq!(engine.peers[&src].stash.len(), 1);
}

#[test]
fn read_requests_stop_being_taken_past_the_bound() {
    use crate::mr::MrEntry;
    use crate::wire::KIND_READ_REQ;
    const MIB: usize = 1 << 20;
    let dev = ulnic_testkit::device(1);
    let nic = Nic::attach(&dev.socket(0)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let region = vec![7u8; MIB];
    let mrs = Arc::new(MrTable::default());
    let key = mrs.register(MrEntry {
        base: region.as_ptr() as usize,
        len: MIB,
        access: crate::fi::REMOTE_READ,
    });
    let mut engine = Engine::open(&pd, Some(PORT_BASE + 1), mrs).unwrap();
    engine.hold_max = 4 * MIB;
    // A reader that posts no buffer: the 1 MiB responses cannot land, so
    // they stay owed while it keeps asking.
    let mut raw = pd.create_endpoint(&EndpointConfig::default()).unwrap();
    raw.bind(PORT_BASE + 2).unwrap();
    let to = Address {
        node: 0,
        port: PORT_BASE + 1,
    };
    for seq in 0..40u32 {
        let h = Header {
            magic: MAGIC.into(),
            kind: KIND_READ_REQ,
            flags: 0,
            seq: seq.into(),
            msg_len: 16.into(),
            offset: 0.into(),
            tag: key.into(),
            data: 0.into(),
        };
        let mut b = h.as_bytes().to_vec();
        b.extend_from_slice(&u64::from(seq).to_le_bytes());
        b.extend_from_slice(&(MIB as u64).to_le_bytes());
        raw.post_send_inline(to, 0, &b, 0).unwrap();
    }
    let mut out = Vec::new();
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_millis(500) {
        engine.progress(&mut out);
    }
    assert!(engine.owed_bytes > 0, "no request was served");
    assert!(
        engine.owed_bytes <= engine.hold_max + MIB,
        "{} MiB of responses owed",
        engine.owed_bytes / MIB
    );
    assert!(raw.recv_ready() == 0, "a response landed without a buffer");
}
