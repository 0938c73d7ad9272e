//! A device that stops answering commands (`Shard::stall_control`, the
//! fault `ulnic cluster stall-control` injects), driven through the real
//! vhost-user protocol by the host-attach driver: while one node's control
//! queue is stalled its data path, doorbells and the other nodes go on; a
//! command that waited runs when the stall ends; and a command that timed
//! out leaves the attachment's control queue dead for good, so a late
//! answer is never read as a later command's (spec §4).
use ulnic_testkit as common;

use std::sync::mpsc;
use std::time::Duration;
use ulnic::{Address, Endpoint, EndpointConfig, Nic, Payload, ProtectionDomain};

/// Sends `count` inline messages from `tx` to `rx` (bound at `to`) and
/// checks each arrives intact.
fn exchange(tx: &mut Endpoint, rx: &mut Endpoint, to: Address, count: u64) {
    for i in 0..count {
        tx.post_send_inline(to, 5, &i.to_le_bytes(), i).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let m = loop {
            if let Some(m) = rx.poll_recv() {
                break m;
            }
            assert!(std::time::Instant::now() < deadline, "message {i} lost");
            std::thread::yield_now();
        };
        assert!(
            matches!(m.payload, Payload::Inline(ref d) if d[..8] == i.to_le_bytes()),
            "message {i}: {m:?}"
        );
        while tx.poll_event().is_some() {}
    }
}

fn attach(dev: &ulnic_device::Device, node: usize) -> Nic {
    Nic::attach(&common::socket(dev, node)).unwrap()
}

/// A new domain of `nic` and an endpoint in it bound to `port`.
fn bound(nic: &Nic, port: u32) -> (ProtectionDomain, Endpoint) {
    let pd = nic.alloc_pd().unwrap();
    let mut ep = pd.create_endpoint(&EndpointConfig::default()).unwrap();
    ep.bind(port).unwrap();
    (pd, ep)
}

#[test]
fn stalled_control_queue_holds_commands_and_nothing_else() {
    let dev = common::device(2);
    let (nic0, nic1) = (attach(&dev, 0), attach(&dev, 1));
    let (_pd0, mut a) = bound(&nic0, 1);
    let (pd1, mut b) = bound(&nic1, 2);
    let to_b = Address { node: 1, port: 2 };
    exchange(&mut a, &mut b, to_b, 10);

    dev.shard().stall_control(0, true).unwrap();
    std::thread::scope(|s| {
        let (done_tx, done_rx) = mpsc::channel();
        let (tid_tx, tid_rx) = mpsc::channel();
        let nic0 = &nic0;
        s.spawn(move || {
            tid_tx.send(common::thread_id()).unwrap();
            let r = nic0.alloc_pd().map(|_| ());
            done_tx.send(r).unwrap();
        });
        // The command is issued and its thread asleep waiting for the
        // answer.
        common::until_blocked(tid_rx.recv().unwrap());
        // Node 0's data path and node 1's commands go on meanwhile.
        exchange(&mut a, &mut b, to_b, 200);
        let other = pd1.create_endpoint(&EndpointConfig::default()).unwrap();
        drop(other);
        assert!(
            done_rx.try_recv().is_err(),
            "a command was answered while the control queue was stalled"
        );
        dev.shard().stall_control(0, false).unwrap();
        let r = done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the waiting command runs once the stall ends");
        assert!(r.is_ok(), "{r:?}");
    });
    exchange(&mut a, &mut b, to_b, 10);
    assert!(dev.shard().stall_control(2, true).is_err(), "no node 2");
}

#[test]
fn timed_out_command_kills_the_control_queue_not_the_data_path() {
    let dev = common::device(2);
    let (nic0, nic1) = (attach(&dev, 0), attach(&dev, 1));
    let (pd0, mut a) = bound(&nic0, 1);
    let (_pd1, mut b) = bound(&nic1, 2);
    let to_b = Address { node: 1, port: 2 };

    dev.shard().stall_control(0, true).unwrap();
    let e = nic0.alloc_pd().err().expect("a stalled device times out");
    assert!(
        e.to_string().contains("did not answer command"),
        "first error: {e}"
    );
    // The late answer arrives (into the old buffer) and is never taken
    // for the next command's.
    let pds = dev.shard().lock().nodes[0].pds.len();
    dev.shard().stall_control(0, false).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dev.shard().lock().nodes[0].pds.len() == pds {
        assert!(
            std::time::Instant::now() < deadline,
            "the late command never ran"
        );
        std::thread::yield_now();
    }
    let e = nic0.alloc_pd().err().expect("the control queue stays dead");
    assert!(
        e.to_string().contains("an earlier command timed out"),
        "later error: {e}"
    );
    // Endpoints that exist still move data.
    exchange(&mut a, &mut b, to_b, 50);
    // A new attachment to the same node works (the device is fine).
    drop((a, pd0, nic0));
    let nic0 = common::attach_again(&dev, 0);
    let (_pd0, mut a) = bound(&nic0, 1);
    exchange(&mut a, &mut b, to_b, 10);
}
