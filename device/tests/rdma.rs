//! Apertures, cookies, RDMA and tripwires through the real vhost-user path
//! (host attach): two nodes, each a separate frontend with its own memory.
use ulnic_testkit as common;

use common::next_event;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use ulnic::{
    Cookie, Endpoint, EndpointConfig, Event, Immediate, Nic, Permissions, SendError, TripwireOn,
};

const SEG: usize = 1 << 20;

fn endpoint(nic: &Nic) -> Endpoint {
    let pd = nic.alloc_pd().unwrap();
    pd.create_endpoint(&EndpointConfig {
        segment_bytes: SEG,
        ..Default::default()
    })
    .unwrap()
}

fn failed(ep: &mut Endpoint, id: u64) -> SendError {
    match next_event(ep) {
        Event::SendFailed {
            id: got, reason, ..
        } if got == id => reason,
        other => panic!("expected the failure of {id}, got {other:?}"),
    }
}

fn done(ep: &mut Endpoint, id: u64) {
    match next_event(ep) {
        Event::SendDone { id: got } if got == id => {}
        other => panic!("expected completion of {id}, got {other:?}"),
    }
}

fn segment(ep: &Endpoint, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ep.read_segment(off, &mut v);
    v
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_read_and_immediate_between_nodes() {
    let (_dev, a, b) = common::two_nodes();
    let mut init = endpoint(&a);
    let target = endpoint(&b);
    let cookie = target
        .export(65536, 262144, Permissions::READ_WRITE)
        .unwrap();
    assert_eq!(cookie.node, 1);

    // Write 200 000 bytes (crossing pages) and read them back elsewhere.
    let data = pattern(200_000, 7);
    init.write_segment(0, &data);
    init.rdma_write(&cookie, 1000, 0, data.len() as u32, 1, true)
        .unwrap();
    done(&mut init, 1);
    assert_eq!(segment(&target, 65536 + 1000, data.len()), data);
    init.rdma_read(&cookie, 1000, 400_000, data.len() as u32, 2, true)
        .unwrap();
    done(&mut init, 2);
    assert_eq!(segment(&init, 400_000, data.len()), data);

    // Immediates: one aligned store of 4 or 8 bytes.
    init.write_immediate(&cookie, 8, Immediate::U64(0x0102_0304_0506_0708), 3, true)
        .unwrap();
    done(&mut init, 3);
    assert_eq!(target.read_u64(65536 + 8), 0x0102_0304_0506_0708);
    init.write_immediate(&cookie, 4, Immediate::U32(0xaabb_ccdd), 4, true)
        .unwrap();
    done(&mut init, 4);
    assert_eq!(segment(&target, 65536 + 4, 4), 0xaabb_ccddu32.to_le_bytes());
    init.write_immediate(&cookie, 3, Immediate::U32(1), 5, true)
        .unwrap();
    assert_eq!(
        failed(&mut init, 5),
        SendError::BadDescriptor,
        "unaligned immediate"
    );

    // The initiator's own aperture works too (one segment, both ends).
    let own = init.export(500_000, 4096, Permissions::READ_WRITE).unwrap();
    init.rdma_write(&own, 0, 0, 4096, 6, true).unwrap();
    done(&mut init, 6);
    assert_eq!(segment(&init, 500_000, 4096), data[..4096]);
}

#[test]
fn payload_then_immediate_arrive_in_order() {
    let (_dev, a, b) = common::two_nodes();
    let mut init = endpoint(&a);
    let mut target = endpoint(&b);
    let cookie = target.export(0, SEG as u64, Permissions::WRITE).unwrap();
    let flag_at = 8;
    let tw = target
        .set_tripwire(&cookie, flag_at, 8, TripwireOn::Writes, true, 5)
        .unwrap();
    // Rounds: many writes, then an immediate naming the round. When the
    // owner sees the flag, every payload of the round must be there.
    for round in 1..=50u64 {
        for k in 0..16u64 {
            let data = pattern(4096, (round * 16 + k) as u8);
            let local = (k as usize) * 4096;
            init.write_segment(local, &data);
            while init
                .rdma_write(&cookie, 65536 + k * 4096, local as u64, 4096, k, false)
                .is_err()
            {
                std::thread::yield_now();
            }
        }
        while init
            .write_immediate(&cookie, flag_at, Immediate::U64(round), 100, false)
            .is_err()
        {
            std::thread::yield_now();
        }
        assert!(target
            .wait_tripwire(tw, flag_at, round - 1, Duration::from_secs(10))
            .unwrap());
        assert_eq!(target.read_u64(flag_at), round);
        for k in 0..16u64 {
            assert_eq!(
                segment(&target, 65536 + (k as usize) * 4096, 4096),
                pattern(4096, (round * 16 + k) as u8),
                "round {round}: payload {k} overtaken by the immediate"
            );
        }
        // Wait until the initiator's sends have all been taken (they were
        // not asked to complete), so the next round's buffers are free.
        while !init.sends_done() {
            std::thread::yield_now();
        }
        while let Some(ev) = target.poll_event() {
            assert!(
                matches!(ev, Event::Tripwire { id, user: 5, .. } if id == tw),
                "{ev:?}"
            );
        }
    }
}

#[test]
fn wrong_cookies_permissions_and_ranges_write_nothing() {
    let (_dev, a, b) = common::two_nodes();
    let mut init = endpoint(&a);
    let target = endpoint(&b);
    let rw = target.export(0, 65536, Permissions::READ_WRITE).unwrap();
    let ro = target.export(65536, 4096, Permissions::READ).unwrap();
    let wo = target.export(131072, 4096, Permissions::WRITE).unwrap();
    init.write_segment(0, &[0xee; 8192]);
    let before = segment(&target, 0, 200_000);

    // Random cookies never hit: right node, any aperture id nearby, random
    // generation and key; and the real aperture with a random key.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut bad = 0;
    let mut count = |ev: Event| match ev {
        Event::SendFailed {
            reason: SendError::BadCookie,
            ..
        } => bad += 1,
        other => panic!("a random cookie did something: {other:?}"),
    };
    for i in 0..2000u64 {
        let c = if i % 2 == 0 {
            Cookie {
                node: 1,
                aperture: rng.gen_range(0..8),
                generation: rng.gen_range(0..4),
                key: rng.gen(),
            }
        } else {
            Cookie {
                key: rng.gen(),
                ..rw
            }
        };
        while init.rdma_write(&c, 0, 0, 64, i, false).is_err() {
            while let Some(ev) = init.poll_event() {
                count(ev);
            }
        }
    }
    // Every send makes an error event, and the device takes sends only
    // while the event ring has room: drain while waiting.
    loop {
        let done = init.sends_done();
        while let Some(ev) = init.poll_event() {
            count(ev);
        }
        if done {
            break;
        }
        std::thread::yield_now();
    }
    assert_eq!(bad, 2000, "every random cookie is refused");
    // Another node, or no such node.
    for (i, node) in [(1u64, 0u32), (2, 99)] {
        init.rdma_write(&Cookie { node, ..rw }, 0, 0, 64, 10_000 + i, true)
            .unwrap();
        assert_eq!(failed(&mut init, 10_000 + i), SendError::BadCookie);
    }
    init.rdma_write(&ro, 0, 0, 64, 1, true).unwrap();
    assert_eq!(failed(&mut init, 1), SendError::PermissionDenied);
    init.write_immediate(&ro, 0, Immediate::U64(1), 2, true)
        .unwrap();
    assert_eq!(failed(&mut init, 2), SendError::PermissionDenied);
    init.rdma_read(&wo, 0, 0, 64, 3, true).unwrap();
    assert_eq!(failed(&mut init, 3), SendError::PermissionDenied);
    init.rdma_write(&rw, 65536 - 63, 0, 64, 4, true).unwrap();
    assert_eq!(failed(&mut init, 4), SendError::OutOfRange);
    init.rdma_write(&rw, u64::MAX - 10, 0, 64, 5, true).unwrap();
    assert_eq!(failed(&mut init, 5), SendError::OutOfRange);
    init.rdma_write(&rw, 0, SEG as u64 - 10, 64, 6, true)
        .unwrap();
    assert_eq!(
        failed(&mut init, 6),
        SendError::BadAddress,
        "local range outside the segment"
    );
    assert_eq!(
        segment(&target, 0, 200_000),
        before,
        "a refused access wrote something"
    );

    // A stale cookie: revoked, the slot exported again (new generation, new key).
    target.revoke(&wo).unwrap();
    let again = target.export(131072, 4096, Permissions::WRITE).unwrap();
    assert_eq!(again.aperture, wo.aperture, "the slot is reused");
    assert_ne!(again.generation, wo.generation);
    init.rdma_write(&wo, 0, 0, 64, 7, true).unwrap();
    assert_eq!(failed(&mut init, 7), SendError::BadCookie);
    init.rdma_write(&again, 0, 0, 64, 8, true).unwrap();
    done(&mut init, 8);

    // The exporter's end: the cookie dies with its endpoint.
    drop(target);
    init.rdma_write(&again, 0, 0, 64, 9, true).unwrap();
    assert_eq!(failed(&mut init, 9), SendError::BadCookie);
}

#[test]
fn revocation_stops_racing_writes() {
    let (_dev, a, b) = common::two_nodes();
    let mut init = endpoint(&a);
    let target = endpoint(&b);
    let cookie = target.export(0, 65536, Permissions::WRITE).unwrap();
    init.write_segment(0, &[0xab; 65536]);
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let writer = std::thread::spawn(move || {
        let (mut ok, mut refused, mut i) = (0u64, 0u64, 0u64);
        fn take_events(init: &mut ulnic::Endpoint, ok: &mut u64, refused: &mut u64) {
            while let Some(ev) = init.poll_event() {
                match ev {
                    Event::SendDone { .. } => *ok += 1,
                    Event::SendFailed {
                        reason: SendError::BadCookie,
                        ..
                    } => *refused += 1,
                    other => panic!("{other:?}"),
                }
            }
        }
        while !s.load(Ordering::Relaxed) || refused < 1000 {
            if init
                .rdma_write(&cookie, (i % 16) * 4096, 0, 4096, i, true)
                .is_ok()
            {
                i += 1;
            }
            take_events(&mut init, &mut ok, &mut refused);
        }
        // Every posted write gets exactly one event: done or refused.
        common::wait_until(
            Duration::from_secs(10),
            "an event for every posted write",
            || {
                take_events(&mut init, &mut ok, &mut refused);
                ok + refused >= i
            },
        );
        (ok, refused, i)
    });
    // Let writes land, revoke mid-stream, then clear the region: nothing
    // may land after the revocation returned.
    let t = Instant::now();
    while segment(&target, 0, 1)[0] != 0xab {
        assert!(t.elapsed() < Duration::from_secs(10), "no write landed");
        std::thread::yield_now();
    }
    target.revoke(&cookie).unwrap();
    target.write_segment(0, &[0; 65536]);
    stop.store(true, Ordering::Relaxed);
    let (ok, refused, posted) = writer.join().unwrap();
    assert_eq!(ok + refused, posted, "ok {ok}, refused {refused}");
    assert!(
        segment(&target, 0, 65536).iter().all(|&b| b == 0),
        "a write landed after REVOKE returned"
    );
}

#[test]
fn tripwires_fire_as_set() {
    let (_dev, a, b) = common::two_nodes();
    let mut init = endpoint(&a);
    init.bind(3).unwrap();
    let mut target = endpoint(&b);
    let cookie = target.export(0, 65536, Permissions::READ_WRITE).unwrap();
    let once = target
        .set_tripwire(&cookie, 4096, 4096, TripwireOn::Writes, false, 11)
        .unwrap();
    let reads = target
        .set_tripwire(&cookie, 0, 64, TripwireOn::Reads, true, 12)
        .unwrap();
    let every = target
        .set_tripwire(&cookie, 16384, 8, TripwireOn::Writes, true, 13)
        .unwrap();

    // One-shot: ten writes into its range, and writes beside it, fire it once.
    for i in 0..10u64 {
        init.rdma_write(&cookie, 4096 + i * 100, 0, 50, i, true)
            .unwrap();
        done(&mut init, i);
        init.rdma_write(&cookie, 8192, 0, 64, 100 + i, true)
            .unwrap();
        done(&mut init, 100 + i);
    }
    let mut seen = Vec::new();
    while let Some(ev) = target.poll_event() {
        seen.push(ev);
    }
    assert_eq!(seen.len(), 1, "one-shot fired {seen:?}");
    assert!(
        matches!(seen[0], Event::Tripwire { id, user: 11, from, len: 50, read: false } if id == once && from.node == 0 && from.port == 3),
        "{seen:?}"
    );
    assert!(
        !target.take_tripwire_fired(once),
        "the event already consumed the flag"
    );

    // Reads fire read tripwires, not write ones.
    init.rdma_read(&cookie, 0, 0, 32, 50, true).unwrap();
    done(&mut init, 50);
    assert!(
        matches!(next_event(&mut target), Event::Tripwire { id, user: 12, read: true, .. } if id == reads)
    );

    // Persistent: each write fires; while unconsumed, further firings set
    // the flag but post no second event.
    init.write_immediate(&cookie, 16384, Immediate::U64(1), 60, true)
        .unwrap();
    done(&mut init, 60);
    init.write_immediate(&cookie, 16384, Immediate::U64(2), 61, true)
        .unwrap();
    done(&mut init, 61);
    assert!(matches!(next_event(&mut target), Event::Tripwire { id, user: 13, .. } if id == every));
    assert!(target.poll_event().is_none(), "a duplicate tripwire event");
    init.write_immediate(&cookie, 16384, Immediate::U64(3), 62, true)
        .unwrap();
    done(&mut init, 62);
    assert!(target.take_tripwire_fired(every));
    let stats: std::collections::HashMap<_, _> = target.stats().unwrap().into_iter().collect();
    assert_eq!(stats["tripwires_fired"], 1 + 1 + 3);

    // A blocked owner wakes on the write.
    target.clear_tripwire(every).unwrap();
    let tw = target
        .set_tripwire(&cookie, 32768, 8, TripwireOn::Writes, false, 14)
        .unwrap();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        tid_tx.send(common::thread_id()).unwrap();
        let woke = target
            .wait_tripwire(tw, 32768, 0, Duration::from_secs(20))
            .unwrap();
        (woke, target.read_u64(32768))
    });
    common::until_blocked(tid_rx.recv().unwrap());
    init.write_immediate(&cookie, 32768, Immediate::U64(77), 70, true)
        .unwrap();
    done(&mut init, 70);
    assert_eq!(waiter.join().unwrap(), (true, 77));
}

#[test]
fn tripwire_and_export_arguments_are_checked() {
    let dev = common::device(1);
    let nic = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let ep = endpoint(&nic);
    let other = endpoint(&nic);
    let c = ep.export(0, 4096, Permissions::WRITE).unwrap();
    let invalid = |r: Result<_, ulnic::Error>| {
        matches!(
            r,
            Err(ulnic::Error::Driver(ulnic_host_attach::Error::Command {
                status: 3,
                ..
            }))
        )
    };
    assert!(
        invalid(ep.export(4, 64, Permissions::WRITE).map(|_| ())),
        "unaligned export"
    );
    assert!(
        invalid(ep.export(0, 0, Permissions::WRITE).map(|_| ())),
        "empty export"
    );
    assert!(
        invalid(
            ep.export(SEG as u64 - 8, 64, Permissions::WRITE)
                .map(|_| ())
        ),
        "past the segment"
    );
    assert!(
        invalid(
            ep.set_tripwire(&c, 4000, 200, TripwireOn::Writes, false, 0)
                .map(|_| ())
        ),
        "past the aperture"
    );
    assert!(
        other
            .set_tripwire(&c, 0, 8, TripwireOn::Writes, false, 0)
            .is_err(),
        "another endpoint's aperture"
    );
    assert!(other.revoke(&c).is_err(), "another endpoint revoked it");
    // The cap: DEFAULT_TRIPWIRES per endpoint.
    let ids: Vec<u32> = (0..ulnic_abi::DEFAULT_TRIPWIRES)
        .map(|i| {
            ep.set_tripwire(&c, 0, 8, TripwireOn::Writes, false, u64::from(i))
                .unwrap()
        })
        .collect();
    assert!(
        ep.set_tripwire(&c, 0, 8, TripwireOn::Writes, false, 0)
            .is_err(),
        "over the cap"
    );
    ep.clear_tripwire(ids[3]).unwrap();
    assert_eq!(
        ep.set_tripwire(&c, 0, 8, TripwireOn::Writes, false, 0)
            .unwrap(),
        ids[3]
    );
    // The aperture cap.
    let mut n = 1;
    while ep.export(0, 4096, Permissions::READ).is_ok() {
        n += 1;
        assert!(n <= ulnic_abi::MAX_APERTURES, "more apertures than the cap");
    }
    assert_eq!(n, ulnic_abi::MAX_APERTURES);
}

/// Spec §5.11 (CLAN): a close message wakes a thread blocked on its
/// endpoint's tripwire, and the wait reports the peer closed; the message
/// stays queued.
#[test]
fn a_close_message_ends_a_blocked_tripwire_wait() {
    let (_dev, a, b) = common::two_nodes();
    let mut writer = endpoint(&a);
    let mut target = endpoint(&b);
    target.bind(9).unwrap();
    writer.bind(5).unwrap();
    let cookie = target.export(0, SEG as u64, Permissions::WRITE).unwrap();
    let tw = target
        .set_tripwire(&cookie, 64, 8, TripwireOn::Writes, false, 1)
        .unwrap();
    writer
        .set_close_message(ulnic::Address { node: 1, port: 9 }, 3, b"bye")
        .unwrap();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        tid_tx.send(common::thread_id()).unwrap();
        let woke = target.wait_tripwire(tw, 64, 0, Duration::from_secs(20));
        (woke, target)
    });
    common::until_blocked(tid_rx.recv().unwrap());
    drop(writer); // destroyed: the device sends its close message
    let (woke, mut target) = waiter.join().unwrap();
    match woke {
        Err(ulnic::Error::PeerClosed { from }) => {
            assert_eq!((from.node, from.port), (0, 5));
        }
        other => panic!("the wait ended with {other:?}"),
    }
    let m = target.poll_recv().expect("the close message stays queued");
    assert!(m.close && m.tag == 3, "{m:?}");
}
