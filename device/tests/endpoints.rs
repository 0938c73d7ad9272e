//! Many endpoints on one node (spec §5.8, VN's endpoint virtualization):
//! thousands exist, a bounded number are polled, the rest come back by
//! doorbell; every one of them sends and receives.
mod common;
use std::time::{Duration, Instant};

use ulnic::{Address, Nic, Payload};

#[test]
fn four_thousand_endpoints_on_one_node_each_exchange_a_message() {
    const N: u32 = ulnic_abi::MAX_ENDPOINTS_LIMIT;
    let (dev, _dir) = common::device_with(1, |b| {
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
