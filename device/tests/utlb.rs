//! The UTLB through the real vhost-user path (host attach): sends and RDMA
//! from user buffers, the library's lookup, misses, fallback with rate
//! control, the device's cache, and entries never recycled while in use.
use ulnic_testkit as common;

use common::next_event;

use std::time::{Duration, Instant};

use ulnic::{
    Address, Endpoint, EndpointConfig, Event, Nic, Payload, Permissions, ProtectionDomain,
    SendError, Translation, UserBuffer, UtlbConfig,
};

const SLOT: usize = 65536;

fn receiver(nic: &Nic, port: u32) -> Endpoint {
    let pd = nic.alloc_pd().unwrap();
    let mut ep = pd
        .create_endpoint(&EndpointConfig {
            segment_bytes: 64 * SLOT,
            ..Default::default()
        })
        .unwrap();
    ep.bind(port).unwrap();
    for i in 0..64u64 {
        ep.post_free(i * SLOT as u64, SLOT as u32, i).unwrap();
    }
    ep
}

fn sender(nic: &Nic, cfg: UtlbConfig) -> (ProtectionDomain, Endpoint) {
    let pd = nic.alloc_pd().unwrap();
    pd.enable_utlb(cfg).unwrap();
    let mut ep = pd
        .create_endpoint(&EndpointConfig {
            send_entries: 64,
            ..Default::default()
        })
        .unwrap();
    ep.bind(1).unwrap();
    (pd, ep)
}

/// The next message's bytes and tag (the receive buffer goes back).
fn recv(ep: &mut Endpoint) -> (u32, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(m) = ep.poll_recv() {
            let n = m.len as usize;
            let bytes = match m.payload {
                Payload::Inline(b) => b[..n].to_vec(),
                Payload::Buffer { offset, id } => {
                    let mut v = vec![0u8; n];
                    ep.read_segment(offset as usize, &mut v);
                    ep.post_free(offset, SLOT as u32, id).unwrap();
                    v
                }
            };
            return (m.tag, bytes);
        }
        assert!(Instant::now() < deadline, "no message within 10 s");
        ep.wait(Duration::from_millis(100)).unwrap();
    }
}

fn fill(buf: &mut UserBuffer, seed: u8) {
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13).wrapping_add(seed);
    }
}

fn stat(ep: &Endpoint, name: &str) -> u64 {
    ep.stats()
        .unwrap()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1
}

const DEST: Address = Address { node: 1, port: 9 };

#[test]
fn sends_from_user_buffers_miss_once_then_hit() {
    let (_dev, a, b) = common::two_nodes();
    let mut rx = receiver(&b, 9);
    let (pd, mut tx) = sender(
        &a,
        UtlbConfig {
            fallback: false,
            ..Default::default()
        },
    );
    let mut buf = pd.alloc_buffer(5 * 4096).unwrap();
    fill(&mut buf, 3);
    // 3 pages' worth starting mid-page: 4 entries.
    let range = 1000..1000 + 3 * 4096;
    let how = tx
        .post_send_buffer(DEST, 7, &buf, range.clone(), 1, true)
        .unwrap();
    assert_eq!(how, Translation::Miss);
    assert_eq!(next_event(&mut tx), Event::SendDone { id: 1 });
    assert_eq!(recv(&mut rx), (7, buf.as_slice()[range.clone()].to_vec()));
    assert_eq!(stat(&tx, "utlb_misses"), 4, "the device fetched 4 entries");

    // The same buffer again, and a part of it: library and device hit.
    for (id, r) in [(2u64, range.clone()), (3, 5000..5100)] {
        let how = tx
            .post_send_buffer(DEST, 8, &buf, r.clone(), id, true)
            .unwrap();
        assert_eq!(how, Translation::Hit);
        assert_eq!(next_event(&mut tx), Event::SendDone { id });
        assert_eq!(recv(&mut rx), (8, buf.as_slice()[r].to_vec()));
    }
    assert_eq!(stat(&tx, "utlb_misses"), 4);
    assert_eq!(stat(&tx, "utlb_hits"), 5);
    let s = pd.utlb_stats();
    assert_eq!(
        (s.lookups, s.hits, s.misses, s.misses_serviced),
        (3, 2, 1, 1)
    );

    // Changing the buffer's bytes is seen: no copy was taken.
    buf.as_mut_slice()[1000] = 0xee;
    tx.post_send_buffer(DEST, 9, &buf, 1000..1001, 4, false)
        .unwrap();
    assert_eq!(recv(&mut rx), (9, vec![0xee]));

    // Argument checks.
    assert!(tx
        .post_send_buffer(DEST, 0, &buf, 10..10, 5, false)
        .is_err());
    assert!(tx
        .post_send_buffer(DEST, 0, &buf, 0..buf.len() + 1, 5, false)
        .is_err());
}

#[test]
fn rdma_from_and_into_user_buffers() {
    let (_dev, a, b) = common::two_nodes();
    let target = b
        .alloc_pd()
        .unwrap()
        .create_endpoint(&EndpointConfig {
            segment_bytes: 1 << 20,
            ..Default::default()
        })
        .unwrap();
    let cookie = target.export(0, 1 << 20, Permissions::READ_WRITE).unwrap();
    let (pd, mut init) = sender(&a, UtlbConfig::default());
    let mut src = pd.alloc_buffer(300_000).unwrap();
    fill(&mut src, 11);
    let how = init
        .rdma_write_buffer(&cookie, 4096, &src, 123..200_123, 1, true)
        .unwrap();
    // With fallback on (the default), a first miss is copied through the
    // 256 KiB bounce buffer.
    assert_eq!(how, Translation::Fallback);
    assert_eq!(next_event(&mut init), Event::SendDone { id: 1 });
    let mut landed = vec![0u8; 200_000];
    target.read_segment(4096, &mut landed);
    assert!(landed == src.as_slice()[123..200_123], "write landed wrong");

    // Read it back into another buffer through the UTLB.
    let dst = pd.alloc_buffer(300_000).unwrap();
    // SAFETY: `dst` is not touched until the read's completion.
    let how = unsafe { init.rdma_read_buffer(&cookie, 4096, &dst, 7..200_007, 2, true) }.unwrap();
    assert_eq!(how, Translation::Miss, "reads service the miss first");
    assert_eq!(next_event(&mut init), Event::SendDone { id: 2 });
    assert!(
        dst.as_slice()[7..200_007] == landed[..],
        "read landed wrong"
    );
    assert!(dst.as_slice()[..7].iter().all(|&b| b == 0));
    assert!(dst.as_slice()[200_007..].iter().all(|&b| b == 0));
}

#[test]
fn fallback_copies_and_services_one_miss_per_budget() {
    let (_dev, a, b) = common::two_nodes();
    let mut rx = receiver(&b, 9);
    let (pd, mut tx) = sender(
        &a,
        UtlbConfig {
            entries: 256,
            fallback: true,
            miss_every_bytes: 8192,
            bounce_bytes: 64 << 10,
        },
    );
    let mut bufs: Vec<UserBuffer> = (0..16)
        .map(|k| {
            let mut b = pd.alloc_buffer(4096).unwrap();
            fill(&mut b, k as u8);
            b
        })
        .collect();
    bufs[0].as_mut_slice()[0] = 0xab;
    let mut how = Vec::new();
    for round in 0..3 {
        for (k, buf) in bufs.iter().enumerate() {
            let id = (round * 100 + k) as u64;
            how.push(
                tx.post_send_buffer(DEST, k as u32, buf, 0..2048, id, false)
                    .unwrap(),
            );
            let (tag, bytes) = recv(&mut rx);
            assert_eq!(tag, k as u32);
            assert!(bytes == buf.as_slice()[..2048], "round {round} buffer {k}");
        }
    }
    let s = pd.utlb_stats();
    let count = |t| how.iter().filter(|&&h| h == t).count() as u64;
    assert_eq!(
        count(Translation::Miss),
        0,
        "with fallback no send waits for the driver"
    );
    assert_eq!(s.fallback_sends, count(Translation::Fallback));
    assert_eq!(s.fallback_bytes, 2048 * count(Translation::Fallback));
    // 48 sends of 2 KiB = 96 KiB: at most one serviced miss per 8 KiB
    // (plus the bounce buffer's own registration).
    assert!(s.misses_serviced <= 96 / 8 + 1, "{s:?}");
    assert!(s.misses_serviced >= 96 / 8 - 2, "{s:?}");
    // Serviced buffers hit on later rounds.
    assert!(count(Translation::Hit) >= 8, "{how:?}");
    assert_eq!(s.hits, count(Translation::Hit));
}

#[test]
fn entries_in_use_are_never_recycled_under_pressure() {
    let (_dev, a, b) = common::two_nodes();
    let mut rx = receiver(&b, 9);
    // 8 entries for 64 one-page buffers, with up to 64 sends in flight:
    // every miss must find entries that no posted send still reads.
    let (pd, mut tx) = sender(
        &a,
        UtlbConfig {
            entries: 8,
            fallback: false,
            ..Default::default()
        },
    );
    let bufs: Vec<UserBuffer> = (0..64)
        .map(|k| {
            let mut b = pd.alloc_buffer(4096).unwrap();
            b.as_mut_slice().fill(k as u8);
            b
        })
        .collect();
    let total = 2000u32;
    let (mut sent, mut got, mut blocked) = (0u32, 0u32, 0u64);
    let deadline = Instant::now() + Duration::from_secs(60);
    while got < total {
        assert!(
            Instant::now() < deadline,
            "stalled at {sent} sent, {got} received"
        );
        // Keep fewer messages outstanding than the receiver has buffers.
        if sent < total && sent - got < 48 {
            let k = (sent as usize * 7) % bufs.len();
            match tx.post_send_buffer(DEST, k as u32, &bufs[k], 0..4096, u64::from(sent), false) {
                Ok(_) => {
                    sent += 1;
                    continue;
                }
                Err(ulnic::Error::WouldBlock) => blocked += 1,
                Err(e) => panic!("{e}"),
            }
        }
        if let Some(e) = tx.poll_event() {
            panic!("unexpected {e:?}");
        }
        if let Some(m) = rx.poll_recv() {
            let Payload::Buffer { offset, id } = m.payload else {
                panic!("4 KiB arrived inline");
            };
            let mut v = vec![0u8; m.len as usize];
            rx.read_segment(offset as usize, &mut v);
            rx.post_free(offset, SLOT as u32, id).unwrap();
            assert!(
                v.iter().all(|&x| x == m.tag as u8),
                "message {got} (buffer {}) carried another buffer's bytes",
                m.tag
            );
            got += 1;
        }
    }
    let s = pd.utlb_stats();
    assert!(s.evictions > 100, "no pressure: {s:?}");
    eprintln!("{s:?}, {blocked} posts waited for entries or ring space");
}

/// An endpoint's RDMA into its own exported user buffer takes its source
/// from its segment and puts a read back into its segment (the device once
/// read the source at the buffer's pages).
#[test]
fn an_endpoint_reaches_its_own_exported_buffer_from_its_segment() {
    let (_dev, _a, b) = common::two_nodes();
    let (pd, mut owner) = sender(&b, UtlbConfig::default());
    let mut buf = pd.alloc_buffer(4 * 4096).unwrap();
    fill(&mut buf, 3);
    // SAFETY: `buf` outlives the export; it is read after the write completed.
    let cookie =
        unsafe { owner.export_buffer(&buf, 1000..13_000, Permissions::READ_WRITE) }.unwrap();
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 1) as u8).collect();
    owner.write_segment(0, &data);
    owner.rdma_write(&cookie, 2000, 0, 5000, 1, true).unwrap();
    assert_eq!(next_event(&mut owner), Event::SendDone { id: 1 });
    assert!(
        buf.as_slice()[3000..8000] == data[..],
        "the write did not come from the segment"
    );
    owner.rdma_read(&cookie, 0, 8192, 12_000, 2, true).unwrap();
    assert_eq!(next_event(&mut owner), Event::SendDone { id: 2 });
    let mut got = vec![0u8; 12_000];
    owner.read_segment(8192, &mut got);
    assert!(
        got == buf.as_slice()[1000..13_000],
        "the read did not land in the segment"
    );
}

#[test]
fn user_buffers_exported_as_apertures() {
    let (_dev, a, b) = common::two_nodes();
    // Node 1 exports 40 000 bytes of a user buffer, starting mid-page.
    let (pd, mut owner) = sender(&b, UtlbConfig::default());
    let mut buf = pd.alloc_buffer(16 * 4096).unwrap();
    fill(&mut buf, 21);
    // SAFETY: `buf` outlives the export; it is read after the writes
    // completed.
    let cookie =
        unsafe { owner.export_buffer(&buf, 5000..45_000, Permissions::READ_WRITE) }.unwrap();
    let tw = owner
        .set_tripwire(&cookie, 39_992, 8, ulnic::TripwireOn::Writes, false, 5)
        .unwrap();
    let mut init = a
        .alloc_pd()
        .unwrap()
        .create_endpoint(&EndpointConfig {
            segment_bytes: 1 << 20,
            ..Default::default()
        })
        .unwrap();
    // Read it all, across pages, then write part of it and an immediate.
    init.rdma_read(&cookie, 0, 0, 40_000, 1, true).unwrap();
    assert_eq!(next_event(&mut init), Event::SendDone { id: 1 });
    let mut got = vec![0u8; 40_000];
    init.read_segment(0, &mut got);
    assert!(got == buf.as_slice()[5000..45_000], "read other bytes");
    let data: Vec<u8> = (0..9000u32).map(|i| (i * 11) as u8).collect();
    init.write_segment(100_000, &data);
    init.rdma_write(&cookie, 3000, 100_000, 9000, 2, true)
        .unwrap();
    assert_eq!(next_event(&mut init), Event::SendDone { id: 2 });
    init.write_immediate(&cookie, 39_992, ulnic::Immediate::U64(77), 3, true)
        .unwrap();
    assert_eq!(next_event(&mut init), Event::SendDone { id: 3 });
    assert!(owner
        .wait_tripwire(tw, 0, 0, Duration::from_secs(10))
        .unwrap());
    assert!(
        buf.as_slice()[8000..17_000] == data[..],
        "write landed wrong"
    );
    assert_eq!(buf.as_slice()[44_992..45_000], 77u64.to_le_bytes());
    // The bytes just before and after the exported range are untouched.
    assert_eq!(
        buf.as_slice()[4999],
        (4999u32 as u8).wrapping_mul(13).wrapping_add(21)
    );
    assert_eq!(
        buf.as_slice()[45_000],
        (45_000u32 as u8).wrapping_mul(13).wrapping_add(21)
    );
    // Out of range and revoked accesses are refused and write nothing.
    init.rdma_write(&cookie, 39_999, 0, 2, 4, true).unwrap();
    assert!(matches!(
        next_event(&mut init),
        Event::SendFailed {
            reason: SendError::OutOfRange,
            ..
        }
    ));
    owner.revoke(&cookie).unwrap();
    init.rdma_write(&cookie, 0, 0, 8, 5, true).unwrap();
    assert!(matches!(
        next_event(&mut init),
        Event::SendFailed {
            reason: SendError::BadCookie,
            ..
        }
    ));
    // An export holds its entries until revoked.
    let pd2 = b.alloc_pd().unwrap();
    pd2.enable_utlb(UtlbConfig {
        entries: 11,
        fallback: false,
        ..Default::default()
    })
    .unwrap();
    let owner2 = pd2.create_endpoint(&EndpointConfig::default()).unwrap();
    let big = pd2.alloc_buffer(11 * 4096).unwrap();
    // SAFETY: as above.
    let c = unsafe { owner2.export_buffer(&big, 0..11 * 4096, Permissions::READ) }.unwrap();
    let other = pd2.alloc_buffer(4096).unwrap();
    assert!(
        matches!(pd2.register(&other, 0..4096), Err(ulnic::Error::WouldBlock)),
        "an exported buffer's entries were reused"
    );
    owner2.revoke(&c).unwrap();
    assert!(!pd2.register(&other, 0..4096).unwrap().hit);
}
