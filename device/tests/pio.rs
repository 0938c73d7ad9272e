//! PIO windows (spec §6.2) through host attach: the device maps a
//! window into importers with vhost-user SHMEM_MAP on their backend
//! channels; stores land with no message; revocation makes them fault;
//! grants cannot be forged.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ulnic::{Endpoint, Error, Event, Nic, PioGrant};
use ulnic_testkit as common;

fn endpoint(nic: &Nic) -> Endpoint {
    nic.alloc_pd()
        .unwrap()
        .create_endpoint(&Default::default())
        .unwrap()
}

fn errno(r: Result<impl std::fmt::Debug, Error>) -> i32 {
    r.expect_err("refused").errno()
}

/// What the device sent the frontends so far: maps, unmaps, PIO commands.
fn sent(dev: &ulnic_device::Device) -> (u64, u64, u64) {
    let c = dev.pio_counters();
    (
        c.maps.load(Ordering::Relaxed),
        c.unmaps.load(Ordering::Relaxed),
        c.commands.load(Ordering::Relaxed),
    )
}

/// Per node, the wake-ups of the thread reading its frontend's
/// vhost-user socket (unchanged: no message came).
fn vhost_wakeups(dev: &ulnic_device::Device) -> Vec<Option<u64>> {
    dev.snapshot()
        .nodes
        .iter()
        .map(|n| n.vhost_wakeups)
        .collect()
}

/// Runs `store` in a forked child; the signal that ended it (0 if it
/// exited).
fn child_signal(store: impl FnOnce()) -> i32 {
    // SAFETY: the child only runs `store` (plain stores, no allocation,
    // no lock) and then _exit, so the other threads' state it inherits
    // is never touched.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        store();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFSIGNALED(status) {
        libc::WTERMSIG(status)
    } else {
        0
    }
}

fn next_revoked(ep: &mut Endpoint) -> (u32, u64, u32) {
    let t = std::time::Instant::now();
    loop {
        match ep.poll_event() {
            Some(Event::PioRevoked { import, key, node }) => return (import, key, node),
            Some(other) => panic!("unexpected event {other:?}"),
            None => {
                assert!(t.elapsed() < Duration::from_secs(5), "no PIO_REVOKED");
                std::thread::yield_now();
            }
        }
    }
}

const WORDS: usize = 1_000_000;

#[test]
fn a_million_stores_land_with_no_message_and_fault_once_revoked() {
    let (dev, a, b) = common::two_nodes();
    let exporter = endpoint(&a);
    let mut importer = endpoint(&b);
    let w = exporter.export_pio(WORDS * 8, Some(1)).unwrap();
    assert_eq!(w.len(), (WORDS * 8).div_ceil(4096) * 4096, "whole pages");
    let imp = importer.import_pio(w.grant()).unwrap();
    assert_eq!(imp.len(), w.len());
    assert_ne!(imp.as_ptr(), w.as_ptr(), "two mappings of one window");

    let before = sent(&dev);
    let woken = vhost_wakeups(&dev);
    assert!(woken.iter().all(Option::is_some), "{woken:?}");
    let words = imp.as_ptr().cast::<u64>();
    for i in 0..WORDS {
        // SAFETY: inside the imported window (WORDS words), mapped.
        unsafe { words.add(i).write_volatile(i as u64 * 0x9e37_79b9 + 1) };
    }
    ulnic::pio_flush();
    assert_eq!(
        sent(&dev),
        before,
        "no map, unmap or command during the stores"
    );
    assert_eq!(
        vhost_wakeups(&dev),
        woken,
        "no vhost-user message from a frontend during the stores"
    );
    let mine = w.as_ptr().cast::<u64>();
    for i in 0..WORDS {
        // SAFETY: inside the exported window, mapped here.
        let v = unsafe { mine.add(i).read_volatile() };
        assert_eq!(v, i as u64 * 0x9e37_79b9 + 1, "word {i}");
    }

    w.revoke().unwrap();
    let (import, key, node) = next_revoked(&mut importer);
    assert_eq!((import, key, node), (imp.id(), w.grant().key, 0));
    let first = imp.as_ptr().cast::<u64>();
    let sig = child_signal(|| {
        // SAFETY: a store to the revoked window, meant to fault.
        unsafe { first.write_volatile(0xdead) };
    });
    assert_eq!(sig, libc::SIGSEGV, "a store to a revoked window faults");
    // SAFETY: the exporter's own mapping stays until it drops the window.
    assert_eq!(
        unsafe { mine.read_volatile() },
        1,
        "the exporter's memory unchanged"
    );
    assert_eq!(
        errno(importer.import_pio(w.grant())),
        libc::ENOENT,
        "revoked"
    );
}

#[test]
fn grants_cannot_be_forged_and_windows_end_where_they_end() {
    let (_dev, a, b) = common::two_nodes();
    let exporter = endpoint(&a);
    let other = endpoint(&a);
    let importer = endpoint(&b);
    let w = exporter.export_pio(4096, Some(1)).unwrap();
    let g = w.grant();
    let forged = PioGrant {
        key: g.key ^ 1,
        ..g
    };
    assert_eq!(
        errno(importer.import_pio(forged)),
        libc::ENOENT,
        "wrong key"
    );
    let elsewhere = PioGrant {
        window: g.window + 1000,
        ..g
    };
    assert_eq!(
        errno(importer.import_pio(elsewhere)),
        libc::ENOENT,
        "no such window"
    );
    let no_node = PioGrant { node: 9, ..g };
    assert_eq!(
        errno(importer.import_pio(no_node)),
        libc::ENOENT,
        "no such node"
    );
    assert_eq!(
        errno(other.import_pio(g)),
        libc::ENOENT,
        "granted to node 1 only"
    );

    // Beyond the window's one page is the aperture's reservation: a
    // store there faults and reaches nothing.
    let imp = importer.import_pio(g).unwrap();
    let past = imp.as_ptr().wrapping_add(imp.len());
    let sig = child_signal(|| {
        // SAFETY: a store past the window, meant to fault.
        unsafe { past.write_volatile(1) };
    });
    assert_eq!(sig, libc::SIGSEGV, "a store past the window faults");
    imp.write(4095, &[7]);
    let mut got = [0u8];
    w.read(4095, &mut got);
    assert_eq!(got, [7]);
}

#[test]
fn an_aperture_maps_four_windows_and_keeps_revoked_ranges_until_released() {
    let dev = common::device_with(2, |c| c.pio_aperture(1 << 20));
    let a = Nic::attach(&dev.socket(0)).unwrap();
    let b = Nic::attach(&dev.socket(1)).unwrap();
    let exporter = endpoint(&a);
    let importer = endpoint(&b);
    let windows: Vec<_> = (0..4)
        .map(|_| exporter.export_pio(8192, None).unwrap())
        .collect();
    assert_eq!(
        errno(exporter.export_pio(4096, None)),
        libc::ENOSPC,
        "a fifth mapping in one aperture"
    );
    let imports: Vec<_> = windows
        .iter()
        .map(|w| importer.import_pio(w.grant()).unwrap())
        .collect();
    drop(windows);
    drop(imports);
    // Half the 1 MiB aperture, imported, then revoked and freed by its
    // exporter: the range stays the importer's until it releases it.
    let big = exporter.export_pio(512 << 10, None).unwrap();
    let old = importer.import_pio(big.grant()).unwrap();
    drop(big);
    let bigger = exporter.export_pio(3 << 18, None).unwrap();
    assert_eq!(
        errno(importer.import_pio(bigger.grant())),
        libc::ENOSPC,
        "the revoked import's range is still reserved"
    );
    drop(old);
    let again = importer.import_pio(bigger.grant()).unwrap();
    again.word(0).store(5, Ordering::Release);
    assert_eq!(bigger.word(0).load(Ordering::Acquire), 5);
}

#[test]
fn a_destroyed_exporter_or_a_detached_process_revokes_its_windows() {
    let dev = common::device(3);
    let a = Nic::attach(&dev.socket(0)).unwrap();
    let b = Nic::attach(&dev.socket(1)).unwrap();
    let exporter = endpoint(&a);
    let mut importer = endpoint(&b);
    let w = exporter.export_pio(4096, None).unwrap();
    let g = w.grant();
    let imp = importer.import_pio(g).unwrap();
    std::mem::forget(w); // no RELEASE: the endpoint's destruction must do it
    drop(exporter);
    assert_eq!(next_revoked(&mut importer).0, imp.id());
    drop(imp);

    // A process that detaches (its connection ends, here without
    // destroying anything first) takes its windows with it.
    let hw = ulnic_host_attach::HostAttach::connect(&dev.socket(2), 4 << 20).unwrap();
    let raw = common::raw::raw_endpoint(&hw, common::raw::create_pd(&hw));
    let req = ulnic_abi::wire::ExportPio {
        endpoint: raw.id.into(),
        pages: 1.into(),
        importer: ulnic::ANY.into(),
        reserved: 0.into(),
    };
    let r = hw.command(
        ulnic_abi::cmd::EXPORT_PIO,
        zerocopy::IntoBytes::as_bytes(&req),
    );
    let out: ulnic_abi::wire::PioExported = ulnic_abi::wire::read(&r.unwrap());
    let g = PioGrant {
        node: 2,
        window: out.window.get(),
        key: out.key.get(),
    };
    let imp = importer.import_pio(g).unwrap();
    let _ = raw; // the endpoint is never destroyed: the connection ends
    drop(hw);
    assert_eq!(next_revoked(&mut importer).0, imp.id());
    let (maps, unmaps, _) = sent(&dev);
    assert!(maps >= 4 && unmaps >= 4, "{maps} maps, {unmaps} unmaps");
}

#[test]
fn without_an_aperture_pio_commands_are_not_supported() {
    let dev = common::device_with(2, |c| c.pio_aperture(0));
    let a = Nic::attach(&dev.socket(0)).unwrap();
    let ep = endpoint(&a);
    assert_eq!(errno(ep.export_pio(4096, None)), libc::EOPNOTSUPP);
}

/// CLAN's distributed message queue over a PIO window: the sender stores
/// messages into the receiver's ring; every message arrives intact and
/// in order across many wraps of the ring, in both kinds of queue.
#[test]
fn a_message_queue_over_a_pio_window_carries_every_message_in_order() {
    use ulnic::{DmqKind, PioDmqReceiver, PioDmqSender};
    let (_dev, a, b) = common::two_nodes();
    let (rx_ep, tx_ep) = (endpoint(&b), endpoint(&a));
    for kind in [DmqKind::Bytes, DmqKind::Fixed { entry: 256 }] {
        let ring = 4096;
        let mut rx = PioDmqReceiver::new(&rx_ep, ring, kind, Some(0)).unwrap();
        let mut tx = PioDmqSender::new(&tx_ep, rx.grant(), ring, kind).unwrap();
        let t = Duration::from_secs(10);
        let sender = std::thread::spawn(move || {
            for i in 0..5000u32 {
                let len = (i as usize * 37) % 200;
                let m: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
                tx.send(&m, t).unwrap();
            }
            tx
        });
        let mut m = Vec::new();
        for i in 0..5000u32 {
            assert!(rx.recv(&mut m, t).unwrap(), "message {i} lost");
            let len = (i as usize * 37) % 200;
            let want: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
            assert_eq!(m, want, "message {i}");
        }
        let mut tx = sender.join().unwrap();
        assert!(!rx.try_recv(&mut m).unwrap(), "nothing more");
        let big = vec![0u8; ring as usize];
        assert_eq!(
            errno(tx.send(&big, t)),
            libc::EINVAL,
            "larger than the ring"
        );
    }
}

/// The outcome of the sync `id` the importer posted: None for TX_DONE.
fn sync_outcome(ep: &mut Endpoint, id: u64) -> Option<ulnic::SendError> {
    match common::next_event(ep) {
        Event::SendDone { id: done } if done == id => None,
        Event::SendFailed {
            id: failed, reason, ..
        } if failed == id => Some(reason),
        other => panic!("sync {id}: {other:?}"),
    }
}

/// Issue 31, point 2: tripwires on a PIO window fire on an importer's
/// PIO_SYNC of their range (the device never sees the stores), wake an
/// exporter blocked on its event, and see the stores made before the
/// sync; a sync elsewhere fires nothing, a wrong grant, a node the grant
/// does not name, a range past the window or a revoked window fail, and
/// only the window's exporter may set tripwires on it.
#[test]
fn pio_sync_fires_the_window_tripwires_and_wakes_the_exporter() {
    let (_dev, a, b) = common::two_nodes();
    let mut exporter = endpoint(&a);
    let mut importer = endpoint(&b);
    let mut bystander = endpoint(&a);
    let w = exporter.export_pio(16384, Some(1)).unwrap();
    let grant = w.grant();
    let once = exporter
        .set_pio_tripwire(&w, 4096, 4096, false, 77)
        .unwrap();
    let every = exporter.set_pio_tripwire(&w, 0, 8, true, 78).unwrap();
    assert_eq!(
        errno(exporter.set_pio_tripwire(&w, 16000, 1000, false, 0)),
        libc::EINVAL,
        "a range past the window"
    );
    assert_eq!(
        errno(bystander.set_pio_tripwire(&w, 0, 8, false, 0)),
        libc::ENOENT,
        "another endpoint's window"
    );
    let imp = importer.import_pio(grant).unwrap();

    // The exporter sleeps until the tripwire's event wakes it, then reads
    // what was stored before the sync.
    let waiter = std::thread::spawn(move || {
        let ev = common::next_event(&mut exporter);
        (exporter, ev)
    });
    std::thread::sleep(Duration::from_millis(50));
    imp.write(4096 + 8, b"synced!!");
    importer.pio_sync(&grant, 4096 + 8, 8, 1, true).unwrap();
    assert_eq!(sync_outcome(&mut importer, 1), None);
    let (mut exporter, ev) = waiter.join().unwrap();
    match ev {
        Event::Tripwire {
            id,
            user,
            from,
            len,
            read,
        } => {
            assert_eq!((id, user, from.node, len, read), (once, 77, 1, 8, false));
        }
        other => panic!("{other:?}"),
    }
    let mut got = [0u8; 8];
    w.read(4096 + 8, &mut got);
    assert_eq!(&got, b"synced!!");

    // A one-shot tripwire fired once; a sync outside every range fires
    // nothing; a persistent one fires each time (its event, once taken,
    // re-enables it).
    importer.pio_sync(&grant, 4096, 16, 2, true).unwrap();
    importer.pio_sync(&grant, 12288, 8, 3, true).unwrap();
    assert_eq!(sync_outcome(&mut importer, 2), None);
    assert_eq!(sync_outcome(&mut importer, 3), None);
    assert_eq!(exporter.poll_event(), None, "nothing fired");
    for round in 0..2 {
        importer.pio_sync(&grant, 0, 4, 10 + round, true).unwrap();
        assert_eq!(sync_outcome(&mut importer, 10 + round), None);
        assert!(matches!(
            common::next_event(&mut exporter),
            Event::Tripwire { id, user: 78, len: 4, .. } if id == every
        ));
    }

    // Refusals: each fails at the window's node and fires nothing.
    let forged = PioGrant {
        key: grant.key ^ 1,
        ..grant
    };
    importer.pio_sync(&forged, 0, 8, 20, true).unwrap();
    assert_eq!(
        sync_outcome(&mut importer, 20),
        Some(ulnic::SendError::BadCookie)
    );
    importer.pio_sync(&grant, 16380, 8, 21, true).unwrap();
    assert_eq!(
        sync_outcome(&mut importer, 21),
        Some(ulnic::SendError::OutOfRange)
    );
    importer.pio_sync(&grant, 0, 0, 22, true).unwrap();
    assert_eq!(
        sync_outcome(&mut importer, 22),
        Some(ulnic::SendError::BadDescriptor)
    );
    bystander.pio_sync(&grant, 0, 8, 23, true).unwrap();
    assert_eq!(
        sync_outcome(&mut bystander, 23),
        Some(ulnic::SendError::BadCookie),
        "the grant names node 1 only"
    );
    assert_eq!(
        exporter.poll_event(),
        None,
        "a refused sync fired something"
    );
    w.revoke().unwrap();
    assert_eq!(next_revoked(&mut importer).0, imp.id());
    importer.pio_sync(&grant, 0, 8, 24, true).unwrap();
    assert_eq!(
        sync_outcome(&mut importer, 24),
        Some(ulnic::SendError::BadCookie),
        "a revoked window"
    );
    assert_eq!(exporter.poll_event(), None);
}

/// Issue 31, point 4: the sources CLAN's event queue gathers include PIO
/// syncs and close messages. The exporter's window tripwire and a close
/// message reach one `EventQueue` as reports of their endpoints, waking
/// a consumer blocked in `EventQueue::wait`; the exporter's own wait on
/// the tripwire sleeps on the same queue.
#[test]
fn a_pio_sync_and_a_close_message_report_to_an_event_queue() {
    let (_dev, a, b) = common::two_nodes();
    let pd = a.alloc_pd().unwrap();
    let queue = ulnic::EventQueue::new(&pd).unwrap();
    let mut exporter = pd.create_endpoint(&Default::default()).unwrap();
    let mut listener = pd.create_endpoint(&Default::default()).unwrap();
    listener.bind(40).unwrap();
    queue.attach(&mut exporter, 1).unwrap();
    queue.attach(&mut listener, 2).unwrap();
    let w = exporter.export_pio(4096, Some(1)).unwrap();
    let tw = exporter.set_pio_tripwire(&w, 0, 8, true, 5).unwrap();
    let mut importer = endpoint(&b);
    let imp = importer.import_pio(w.grant()).unwrap();

    // A consumer blocked on the queue wakes for the sync.
    let q = queue.clone();
    let consumer = std::thread::spawn(move || q.wait(Duration::from_secs(10)).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    imp.write(0, &42u64.to_le_bytes());
    importer.pio_sync(&w.grant(), 0, 8, 1, true).unwrap();
    assert_eq!(sync_outcome(&mut importer, 1), None);
    assert_eq!(consumer.join().unwrap(), [1], "the exporter reported");
    assert!(matches!(
        exporter.poll_event(),
        Some(Event::Tripwire { id, user: 5, .. }) if id == tw
    ));

    // The exporter's own wait on the tripwire sleeps on the queue.
    let waiter = std::thread::spawn(move || {
        let woke = exporter.wait(Duration::from_secs(10)).unwrap();
        (woke, exporter.poll_event())
    });
    std::thread::sleep(Duration::from_millis(50));
    importer.pio_sync(&w.grant(), 0, 8, 2, true).unwrap();
    assert_eq!(sync_outcome(&mut importer, 2), None);
    let (woke, ev) = waiter.join().unwrap();
    assert!(woke);
    assert!(
        matches!(ev, Some(Event::Tripwire { user: 5, .. })),
        "{ev:?}"
    );

    // A close message: the peer's endpoint goes, the listener reports.
    let mut peer = endpoint(&b);
    peer.bind(41).unwrap();
    peer.set_close_message(ulnic::Address { node: 0, port: 40 }, 9, b"bye")
        .unwrap();
    drop(peer);
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    while got.is_empty() && t.elapsed() < Duration::from_secs(10) {
        got = queue.wait(Duration::from_secs(1)).unwrap();
    }
    assert_eq!(got, [2], "the listener reported the close message");
    let m = listener.poll_recv().expect("the close message");
    assert_eq!(m.tag, 9);
}
