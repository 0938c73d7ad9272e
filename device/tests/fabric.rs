//! The emulated fabric (spec §10) through the real path: host-attached
//! nodes of a device, hanging on two switches with a small MTU, so
//! messages are cut into packets, cross links and switches, and come back
//! to their sender when they cannot be delivered.
use ulnic_testkit as common;

use std::time::{Duration, Instant};

use ulnic::{Address, EndpointConfig, Event, Nic, Payload, SendError};
use ulnic_device::fabric::mapping::{FabricMap, MappingConfig};
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::topology::{End, Faults, Link, LinkParams, Topology};
use ulnic_device::fabric::transport::TransportConfig;

/// Nodes 0 and 1 on switch "a", node 2 on switch "b"; 256-byte MTU, some
/// latency, and a quick transport so the unreachable case is short.
fn fabric() -> FabricConfig {
    let params = LinkParams {
        mtu: 256,
        latency: Duration::from_micros(5),
        bandwidth_bps: Some(10_000_000_000),
        ..LinkParams::default()
    };
    let link = |a, b| Link { a, b, params };
    let links = vec![
        link(End::Switch(0), End::Switch(1)),
        link(End::Node(0), End::Switch(0)),
        link(End::Node(1), End::Switch(0)),
        link(End::Node(2), End::Switch(1)),
    ];
    FabricConfig {
        topology: Topology::new(3, vec!["a".into(), "b".into()], links).unwrap(),
        seed: 9,
        transport: TransportConfig {
            retries: 3,
            min_timeout: 200_000,
            ..TransportConfig::default()
        },
        span: None,
        mapping: None,
    }
}

/// The device (its socket directory goes after it).
fn start() -> common::TestDevice {
    start_with_threads(1)
}

/// With `threads` engine threads: 2 puts switch "a" (nodes 0, 1) and
/// switch "b" (node 2) on threads of their own.
fn start_with_threads(threads: u32) -> common::TestDevice {
    start_on(fabric(), threads)
}

/// A device of three nodes on `fabric`, with `threads` engine threads.
fn start_on(fabric: FabricConfig, threads: u32) -> common::TestDevice {
    common::device_with(3, |b| b.fabric(fabric).engine_threads(threads))
}

fn endpoint(nic: &Nic, port: u32) -> ulnic::Endpoint {
    let mut ep = nic
        .alloc_pd()
        .unwrap()
        .create_endpoint(&EndpointConfig {
            segment_bytes: 1 << 20,
            ..Default::default()
        })
        .unwrap();
    ep.bind(port).unwrap();
    ep
}

fn recv(ep: &mut ulnic::Endpoint) -> ulnic::Received {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(m) = ep.poll_recv() {
            return m;
        }
        assert!(Instant::now() < deadline, "nothing received within 20 s");
        ep.wait(Duration::from_millis(50)).unwrap();
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

#[test]
fn a_large_message_crosses_two_switches_in_packets_and_completes_on_its_ack() {
    let dev = start();
    let (a, c) = (
        Nic::attach(&common::socket(&dev, 0)).unwrap(),
        Nic::attach(&common::socket(&dev, 2)).unwrap(),
    );
    let mut tx = endpoint(&a, 1);
    let mut rx = endpoint(&c, 2);
    rx.post_free(0, 65536, 77).unwrap();
    let data = pattern(50_000, 5); // 196 packets of 256 bytes
    tx.write_segment(4096, &data);
    tx.post_send(
        Address { node: 2, port: 2 },
        3,
        4096,
        data.len() as u32,
        11,
        true,
    )
    .unwrap();
    let m = recv(&mut rx);
    assert_eq!(
        (m.src, m.tag, m.len),
        (Address { node: 0, port: 1 }, 3, 50_000)
    );
    let Payload::Buffer { offset, id } = m.payload else {
        panic!("a 50 kB message came inline");
    };
    assert_eq!(id, 77);
    let mut got = vec![0; data.len()];
    rx.read_segment(offset as usize, &mut got);
    assert!(got == data, "payload damaged on the way");
    assert_eq!(common::next_event(&mut tx), Event::SendDone { id: 11 });
    let counters = dev.shard().fabric_counters().unwrap();
    let packets: u64 = counters.transport.iter().map(|t| t.data_packets).sum();
    assert!(
        packets >= 196,
        "only {packets} data packets for 50 kB at MTU 256"
    );
    // Node 0 hangs on switch "a", node 2 on "b": every data packet
    // crossed both, and none went astray.
    for (i, s) in counters.switches.iter().enumerate() {
        assert!(s.forwarded >= 196, "switch {i}: {s:?}");
        assert_eq!(s.misrouted, 0, "switch {i}: {s:?}");
    }
}

#[test]
fn a_full_receiver_is_retried_until_it_posts_a_buffer() {
    let dev = start();
    let (a, b) = (
        Nic::attach(&common::socket(&dev, 0)).unwrap(),
        Nic::attach(&common::socket(&dev, 1)).unwrap(),
    );
    let mut tx = endpoint(&a, 1);
    let mut rx = endpoint(&b, 2);
    let data = pattern(1000, 9); // too big to go inline: needs a free buffer
    tx.write_segment(0, &data);
    tx.post_send(Address { node: 1, port: 2 }, 0, 0, 1000, 1, true)
        .unwrap();
    // Refused and asked about meanwhile (a NACK, then ROOM packets
    // answered with no room), not failed: many more than its 3 retries,
    // so they are not charged to them.
    let refusals = || -> u64 {
        dev.shard()
            .fabric_counters()
            .unwrap()
            .transport
            .iter()
            .map(|t| t.nacks_received + t.room_asks)
            .sum()
    };
    common::wait_for(
        Duration::from_secs(10),
        "the sender to be refused or told of no room 10 times",
        refusals,
        |n| *n >= 10,
    );
    assert_eq!(tx.poll_event(), None, "the send failed instead of waiting");
    rx.post_free(0, 4096, 5).unwrap();
    let m = recv(&mut rx);
    assert_eq!(m.len, 1000);
    assert_eq!(common::next_event(&mut tx), Event::SendDone { id: 1 });
}

#[test]
fn undeliverable_messages_come_back_to_their_sender_with_their_payload() {
    let dev = start();
    let a = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let _c = Nic::attach(&common::socket(&dev, 2)).unwrap();
    let mut tx = endpoint(&a, 1);
    for i in 0..4 {
        tx.post_free(65536 + i * 4096, 4096, 100 + i).unwrap();
    }
    // No endpoint at node 2 port 9: refused there, returned at once.
    let data = pattern(700, 1);
    tx.write_segment(0, &data);
    tx.post_send(Address { node: 2, port: 9 }, 42, 0, 700, 1, false)
        .unwrap();
    let m = recv(&mut tx);
    assert!(m.returned, "{m:?}");
    assert_eq!(
        (m.src, m.tag, m.len),
        (Address { node: 2, port: 9 }, 42, 700)
    );
    let Payload::Buffer { offset, .. } = m.payload else {
        panic!("700 bytes came back inline");
    };
    let mut got = vec![0; 700];
    tx.read_segment(offset as usize, &mut got);
    assert!(got == data, "the returned payload is not the original");
    match common::next_event(&mut tx) {
        Event::SendFailed { id: 1, reason, .. } => assert_eq!(reason, SendError::NoEndpoint),
        other => panic!("unexpected {other:?}"),
    }

    // Node 2's link cut: no answer at all, so back after the retries.
    // (Counted from here: a slow host may have timed the refused message
    // out once before its NACK came.)
    let timeouts = || -> u64 {
        dev.shard()
            .fabric_counters()
            .unwrap()
            .transport
            .iter()
            .map(|t| t.timeouts)
            .sum()
    };
    let before = timeouts();
    dev.shard()
        .set_link_faults(
            3,
            Faults {
                down: true,
                ..Faults::default()
            },
        )
        .unwrap();
    tx.post_send_inline(Address { node: 2, port: 2 }, 43, b"anyone?", 2)
        .unwrap();
    let m = recv(&mut tx);
    assert!(m.returned);
    assert_eq!((m.src, m.tag), (Address { node: 2, port: 2 }, 43));
    assert!(matches!(m.payload, Payload::Inline(d) if &d[..7] == b"anyone?"));
    match common::next_event(&mut tx) {
        Event::SendFailed { id: 2, reason, .. } => assert_eq!(reason, SendError::Unreachable),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        timeouts() - before,
        4,
        "three retries, then the fourth timeout returns it"
    );
}

#[test]
fn two_engine_threads_carry_messages_within_and_across_their_shards() {
    let dev = start_with_threads(2);
    assert_eq!(dev.shards().len(), 2);
    assert!(!std::sync::Arc::ptr_eq(dev.shard_of(0), dev.shard_of(2)));
    let nics: Vec<Nic> = (0..3)
        .map(|n| Nic::attach(&common::socket(&dev, n)).unwrap())
        .collect();
    let mut tx = endpoint(&nics[0], 1);
    let mut same = endpoint(&nics[1], 2);
    let mut other = endpoint(&nics[2], 2);
    same.post_free(0, 65536, 1).unwrap();
    other.post_free(0, 65536, 2).unwrap();
    let data = pattern(30_000, 3);
    tx.write_segment(0, &data);
    for (node, rx) in [(1u32, &mut same), (2, &mut other)] {
        tx.post_send(
            Address { node, port: 2 },
            7,
            0,
            30_000,
            u64::from(node),
            true,
        )
        .unwrap();
        let t = Instant::now();
        let m = loop {
            if let Some(m) = rx.poll_recv() {
                break m;
            }
            if t.elapsed() > Duration::from_secs(20) {
                panic!("nothing reached node {node}: {:#?}", dev.fabric_counters());
            }
            rx.wait(Duration::from_millis(50)).unwrap();
        };
        assert_eq!((m.src, m.len), (Address { node: 0, port: 1 }, 30_000));
        let Payload::Buffer { offset, .. } = m.payload else {
            panic!("30 kB came inline");
        };
        let mut got = vec![0; 30_000];
        rx.read_segment(offset as usize, &mut got);
        assert!(got == data, "damaged on the way to node {node}");
        assert_eq!(
            common::next_event(&mut tx),
            Event::SendDone {
                id: u64::from(node)
            }
        );
    }
    // The counters come from the shard serving each node, summed where
    // both count (a lane crossing shards: sent by one, received by the
    // other).
    let snap = dev.snapshot();
    let rx_of = |n: usize| snap.nodes[n].endpoints[0].stats[2];
    assert_eq!((rx_of(1), rx_of(2)), (1, 1));
    let c = dev.fabric_counters().unwrap();
    let delivered: u64 = c.transport.iter().map(|t| t.messages_delivered).sum();
    assert_eq!(delivered, 2);
    // 30,000 bytes at MTU 256 are at least 118 packets from shard "a" to
    // shard "b"; every packet one shard sent the other took, or counted
    // as an overflow (the last ACKs may still be on their way).
    let span = common::wait_for(
        Duration::from_secs(10),
        "every packet sent between the shards to be taken",
        || dev.fabric_counters().unwrap().span.unwrap(),
        |s| s.received + s.overflow == s.sent,
    );
    assert!(
        span.sent >= 118,
        "too few crossed between the shards: {span:?}"
    );
}

#[test]
fn a_mapper_routes_a_fabric_split_between_engine_threads() {
    // The mapper on node 0 (shard "a") finds switch "b" through the
    // shards' memory queues, and node 2 (shard "b") gets its routes in
    // ROUTES packets the same way.
    let mut f = fabric();
    f.mapping = Some(MappingConfig {
        mapper: 0,
        interval: Duration::from_millis(20),
        // Slow enough that a busy host cannot make a round miss an
        // answer (and the map change shape once).
        probe_timeout: Duration::from_millis(100),
        ..MappingConfig::default()
    });
    let dev = start_on(f.clone(), 2);
    let map = dev.map_fabric(Duration::from_secs(20)).unwrap();
    assert_eq!(
        map.differences(&FabricMap::expected(&f.topology)),
        Vec::<String>::new()
    );
    // The first map, and every round since found the same shape.
    assert_eq!(map.generation, 1, "{map:?}");
    let nics: Vec<Nic> = (0..3)
        .map(|n| Nic::attach(&common::socket(&dev, n)).unwrap())
        .collect();
    let mut tx = endpoint(&nics[0], 1);
    let mut rx = endpoint(&nics[2], 2);
    rx.post_free(0, 65536, 1).unwrap();
    tx.write_segment(0, b"routed");
    tx.post_send(Address { node: 2, port: 2 }, 5, 0, 6, 9, true)
        .unwrap();
    let m = recv(&mut rx);
    assert_eq!((m.src, m.tag, m.len), (Address { node: 0, port: 1 }, 5, 6));
    // Its ACK came back over node 2's mapped route.
    assert_eq!(common::next_event(&mut tx), Event::SendDone { id: 9 });
}

/// Event queues (spec §6.1) across the fabric and engine threads: node
/// 2's queue (switch "b", its own thread) hears messages that crossed from
/// node 0, once per arm, and node 0's sender, attached to a
/// queue of its own, hears its delivery reports, which the transport
/// settles on the other thread's acknowledgement.
#[test]
fn event_queues_hear_what_crosses_the_fabric_between_engine_threads() {
    let dev = start_with_threads(2);
    let (a, c) = (
        Nic::attach(&common::socket(&dev, 0)).unwrap(),
        Nic::attach(&common::socket(&dev, 2)).unwrap(),
    );
    let pc = c.alloc_pd().unwrap();
    let cfg = EndpointConfig::default();
    let mut queue = pc.create_endpoint(&cfg).unwrap();
    let mut sources: Vec<ulnic::Endpoint> =
        (0..2).map(|_| pc.create_endpoint(&cfg).unwrap()).collect();
    for (i, s) in sources.iter_mut().enumerate() {
        s.bind(40 + i as u32).unwrap();
        s.post_free(0, 65536, 1).unwrap();
        s.post_free(65536, 65536, 2).unwrap();
        s.set_event_queue(&queue, 500 + i as u64).unwrap();
        assert!(!s.arm().unwrap());
    }
    let pa = a.alloc_pd().unwrap();
    let mut own_queue = pa.create_endpoint(&cfg).unwrap();
    let mut sender = pa.create_endpoint(&cfg).unwrap();
    sender.bind(39).unwrap();
    sender.set_event_queue(&own_queue, 77).unwrap();
    assert!(!sender.arm().unwrap());
    let big = vec![5u8; 1000]; // several 256-byte packets
    sender.write_segment(0, &big);
    sender
        .post_send(Address { node: 2, port: 41 }, 0, 0, 1000, 1, true)
        .unwrap();
    sender
        .post_send(Address { node: 2, port: 40 }, 0, 0, 1000, 2, true)
        .unwrap();
    sender
        .post_send(Address { node: 2, port: 41 }, 0, 0, 1000, 3, true)
        .unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && Instant::now() < deadline {
        if let Some(Event::Queued { cookie, .. }) = queue.poll_event() {
            got.push(cookie);
        }
        std::thread::yield_now();
    }
    // Each source once (its second message came before it was armed
    // again); the order across two pairs of endpoints is the fabric's.
    got.sort_unstable();
    assert_eq!(got, [500, 501], "node 2's queue");
    // The sender's own queue: one report for its delivery reports, until
    // it is armed again.
    let mut mine = Vec::new();
    while mine.is_empty() && Instant::now() < deadline {
        mine.extend(std::iter::from_fn(|| own_queue.poll_event()));
        std::thread::yield_now();
    }
    assert!(
        matches!(mine[..], [Event::Queued { cookie: 77, .. }]),
        "{mine:?}"
    );
    let mut done = 0;
    while done < 3 && Instant::now() < deadline {
        if let Some(Event::SendDone { .. }) = sender.poll_event() {
            done += 1;
        }
    }
    assert_eq!(done, 3);
    assert!(queue.poll_event().is_none() && own_queue.poll_event().is_none());
}

/// PIO windows between nodes of two engine threads' shards: stores land
/// (the fabric carries none of them), a PIO_SYNC crosses to the other
/// shard and fires the window's tripwire there, and the revocation
/// reaches the importer's endpoint on the other shard.
#[test]
fn pio_windows_join_nodes_of_two_engine_threads() {
    let dev = start_with_threads(2);
    let (a, c) = (
        Nic::attach(&common::socket(&dev, 0)).unwrap(),
        Nic::attach(&common::socket(&dev, 2)).unwrap(),
    );
    let cfg = EndpointConfig::default();
    let mut exporter = a.alloc_pd().unwrap().create_endpoint(&cfg).unwrap();
    let mut importer = c.alloc_pd().unwrap().create_endpoint(&cfg).unwrap();
    let w = exporter.export_pio(8192, Some(2)).unwrap();
    let tw = exporter.set_pio_tripwire(&w, 0, 8192, true, 5).unwrap();
    let imp = importer.import_pio(w.grant()).unwrap();
    for i in 0..1024 {
        imp.word(i * 8)
            .store(i as u64 + 7, std::sync::atomic::Ordering::Release);
    }
    for i in 0..1024 {
        assert_eq!(
            w.word(i * 8).load(std::sync::atomic::Ordering::Acquire),
            i as u64 + 7
        );
    }
    importer.pio_sync(&w.grant(), 0, 8192, 1, true).unwrap();
    assert_eq!(
        common::next_event(&mut importer),
        ulnic::Event::SendDone { id: 1 }
    );
    match common::next_event(&mut exporter) {
        ulnic::Event::Tripwire {
            id,
            user,
            from,
            len,
            ..
        } => {
            assert_eq!((id, user, from.node, len), (tw, 5, 2, 8192));
        }
        other => panic!("{other:?}"),
    }
    w.revoke().unwrap();
    let t = std::time::Instant::now();
    loop {
        match importer.poll_event() {
            Some(ulnic::Event::PioRevoked { import, node, .. }) => {
                assert_eq!((import, node), (imp.id(), 0));
                break;
            }
            Some(other) => panic!("{other:?}"),
            None => assert!(t.elapsed() < Duration::from_secs(5), "no PIO_REVOKED"),
        }
    }
}
