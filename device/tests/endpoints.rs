//! Many endpoints on one node (spec §5.8, VN's endpoint virtualization):
//! thousands exist, a bounded number are polled, the rest come back by
//! doorbell; every one of them sends and receives.
use std::time::{Duration, Instant};
use ulnic_testkit as common;

use ulnic::{Address, Nic, Payload};

#[test]
fn four_thousand_endpoints_on_one_node_each_exchange_a_message() {
    const N: u32 = ulnic_abi::MAX_ENDPOINTS_LIMIT;
    let dev = common::device_with(1, |b| {
        b.max_endpoints(N).poll_for(Duration::from_micros(200))
    });
    // Small rings: a 2-page control region and a 1-page segment each.
    let nic = Nic::attach_with_memory(&common::socket(&dev, 0), 96 << 20).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut eps = common::small_endpoints(&pd, N, 1000);
    assert!(
        dev.shard().lock().nodes[0].resident.len() <= ulnic_abi::RESIDENT_MAX as usize,
        "more endpoints polled than the resident limit"
    );
    // Endpoint i sends to endpoint i+1 (a ring over all of them), in
    // batches, so most senders are not resident when they post and must
    // ring their doorbell.
    let to = |i: u32| Address {
        node: 0,
        port: 1000 + (i + 1) % N,
    };
    for (i, e) in eps.iter_mut().enumerate() {
        let i = i as u32;
        e.post_send_inline(to(i), i, &i.to_le_bytes(), u64::from(i))
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, e) in eps.iter_mut().enumerate() {
        let i = i as u32;
        let from = (i + N - 1) % N;
        let m = loop {
            if let Some(m) = e.poll_recv() {
                break m;
            }
            assert!(Instant::now() < deadline, "endpoint {i} received nothing");
            std::thread::yield_now();
        };
        assert_eq!(
            m.src,
            Address {
                node: 0,
                port: 1000 + from
            },
            "endpoint {i}"
        );
        assert_eq!(m.tag, from);
        assert!(
            matches!(m.payload, Payload::Inline(d) if d[..4] == from.to_le_bytes()),
            "endpoint {i}: wrong payload"
        );
        assert_eq!(e.poll_recv(), None, "endpoint {i}: a second message");
    }
    // Doorbells brought the senders back: far more than the resident few.
    let rung: u64 = eps
        .iter()
        .map(|e| {
            e.stats()
                .unwrap()
                .into_iter()
                .find(|(n, _)| *n == "doorbells")
                .map_or(0, |(_, v)| v)
        })
        .sum();
    assert!(
        rung >= u64::from(N - ulnic_abi::RESIDENT_MAX),
        "only {rung} doorbells for {N} endpoints"
    );
    assert!(dev.shard().lock().nodes[0].resident.len() <= ulnic_abi::RESIDENT_MAX as usize);
}

/// Every one of a node's 62 doorbell queues serves its domain's kicks
/// (spec §2.1, §5.8). With 1, 2, ... 62 domains open, each domain's
/// endpoint waits until the device has asked it for a doorbell (it is not
/// resident), then sends: the send is served only if its domain's doorbell
/// queue is read. The vhost-user crate once watched only queues 0..=31, so
/// from the 31st domain on such a send never left.
#[test]
fn every_doorbell_queue_serves_its_domain() {
    const DOMAINS: u32 = ulnic_abi::DOORBELL_QUEUES;
    // No idle period: an endpoint leaves the polled set as soon as the
    // engine sleeps, so every send below needs its doorbell.
    let dev = common::device_with(2, |b| b.max_endpoints(DOMAINS + 2).poll_for(Duration::ZERO));
    let a = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let b = Nic::attach(&common::socket(&dev, 1)).unwrap();
    let pb = b.alloc_pd().unwrap();
    let mut rx = pb
        .create_endpoint(&ulnic::EndpointConfig::default())
        .unwrap();
    rx.bind(1).unwrap();
    let not_resident = |id: u32| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let resident = dev.shard().lock().nodes[0]
                .resident
                .iter()
                .any(|&(e, _)| e == id);
            if !resident {
                return;
            }
            assert!(Instant::now() < deadline, "endpoint {id} stays resident");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let mut domains = Vec::new();
    for k in 0..DOMAINS {
        let pd = a.alloc_pd().unwrap();
        let e = common::small_endpoints(&pd, 1, 100 + k).pop().unwrap();
        domains.push((pd, e));
        // Every domain open so far sends once more.
        for (i, (_, e)) in domains.iter_mut().enumerate() {
            not_resident(e.id());
            let tag = k * DOMAINS + i as u32;
            e.post_send_inline(Address { node: 1, port: 1 }, tag, b"d", 0)
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let m = loop {
                if let Some(m) = rx.poll_recv() {
                    break m;
                }
                assert!(
                    Instant::now() < deadline,
                    "with {} domains open, domain {i}'s send never left",
                    k + 1
                );
                std::thread::yield_now();
            };
            assert_eq!(
                (m.src, m.tag),
                (
                    Address {
                        node: 0,
                        port: 100 + i as u32
                    },
                    tag
                )
            );
        }
    }
    // Every send came by doorbell: each was posted while its endpoint was
    // not resident.
    let rung: u64 = domains
        .iter()
        .map(|(_, e)| {
            e.stats()
                .unwrap()
                .into_iter()
                .find(|(n, _)| *n == "doorbells")
                .map_or(0, |(_, v)| v)
        })
        .sum();
    let sends = u64::from(DOMAINS * (DOMAINS + 1) / 2);
    assert_eq!(rung, sends, "doorbells counted for {sends} sends");
}
