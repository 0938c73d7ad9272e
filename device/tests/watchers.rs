//! Watchers under host attach (spec §6 "Several waiters"): every waiter
//! of an endpoint is woken by every notification, one watcher serves
//! endpoints of several attachments, and a thread's watcher does not keep
//! an attachment its program has dropped.
use std::sync::{Arc, Barrier};
use std::time::Duration;
use ulnic_testkit as common;

use ulnic::{Address, EndpointConfig, Nic};

fn to(node: u32, port: u32) -> Address {
    Address { node, port }
}

#[test]
fn one_watcher_wakes_for_endpoints_of_two_attachments() {
    let dev = common::device(3);
    let (a, b) = (
        Nic::attach(&common::socket(&dev, 0)).unwrap(),
        Nic::attach(&common::socket(&dev, 1)).unwrap(),
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut ea = pa.create_endpoint(&EndpointConfig::default()).unwrap();
    let mut eb = pb.create_endpoint(&EndpointConfig::default()).unwrap();
    ea.bind(20).unwrap();
    eb.bind(21).unwrap();
    let w = pa.new_watcher().unwrap();
    ea.watch(&w).unwrap();
    eb.watch(&w).unwrap();
    let sender = Nic::attach(&common::socket(&dev, 2)).unwrap();
    let mut es = sender
        .alloc_pd()
        .unwrap()
        .create_endpoint(&EndpointConfig::default())
        .unwrap();
    es.bind(22).unwrap();
    // A message to each attachment in turn: the watcher must wake for
    // both, though only `a`'s notification queue fed it at first.
    for (round, (node, port)) in [(1, 21), (0, 20), (1, 21)].into_iter().enumerate() {
        assert!(
            !ea.arm().unwrap() && !eb.arm().unwrap(),
            "nothing waits yet"
        );
        es.post_send_inline(to(node, port), 1, b"wake", round as u64)
            .unwrap();
        assert!(
            w.wait(Duration::from_secs(10)).unwrap(),
            "round {round}: no wake-up for node {node}'s endpoint"
        );
        let ep = if node == 0 { &mut ea } else { &mut eb };
        let _ = ep.take_notification();
        let m = common::next_message(ep);
        assert_eq!(m.len, 4);
    }
}

#[test]
fn two_threads_waiting_on_one_endpoint_both_wake() {
    let dev = common::device(2);
    let nic = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut ep = pd.create_endpoint(&EndpointConfig::default()).unwrap();
    ep.bind(30).unwrap();
    let ready = Arc::new(Barrier::new(3));
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let w = pd.new_watcher().unwrap();
            ep.watch(&w).unwrap();
            let ready = ready.clone();
            std::thread::spawn(move || {
                ready.wait();
                w.wait(Duration::from_secs(10)).unwrap()
            })
        })
        .collect();
    assert!(!ep.arm().unwrap());
    ready.wait();
    let sender = common::attach_again(&dev, 1);
    let mut es = sender
        .alloc_pd()
        .unwrap()
        .create_endpoint(&EndpointConfig::default())
        .unwrap();
    es.bind(31).unwrap();
    es.post_send_inline(to(0, 30), 1, b"one", 1).unwrap();
    for t in waiters {
        assert!(t.join().unwrap(), "a waiter lost its wake-up to the other");
    }
    assert_eq!(common::next_message(&mut ep).len, 3);
}

#[test]
fn a_thread_that_waited_does_not_keep_its_attachment() {
    let dev = common::device(2);
    for _ in 0..3 {
        let nic = common::attach_again(&dev, 0);
        let mut ep = nic
            .alloc_pd()
            .unwrap()
            .create_endpoint(&EndpointConfig::default())
            .unwrap();
        // Waiting made this thread's watcher from the attachment.
        assert!(!ep.wait(Duration::from_millis(1)).unwrap());
        drop(ep);
        drop(nic);
        // The node serves one frontend at a time: attaching again works
        // only once the device saw this one leave.
    }
    drop(common::attach_again(&dev, 0));
}
