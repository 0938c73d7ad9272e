//! CLAN's event queues (spec §6.1) through host attach: sources report to
//! one queue, in order, once per arm; the queue's descriptor wakes poll
//! and epoll; refused attachments change nothing.

use std::time::Duration;
use ulnic::{Address, Endpoint, EndpointConfig, Event, Nic};
use ulnic_testkit as common;

/// The queue's QUEUED cookies waiting now, in order.
fn cookies(q: &mut Endpoint) -> Vec<u64> {
    std::iter::from_fn(|| q.poll_event())
        .map(|e| match e {
            Event::Queued { cookie, .. } => cookie,
            other => panic!("the queue got {other:?}"),
        })
        .collect()
}

/// Takes every message waiting at `ep`: how many.
fn drain(ep: &mut Endpoint) -> usize {
    std::iter::from_fn(|| ep.poll_recv()).count()
}

fn send(from: &mut Endpoint, port: u32, byte: u8) {
    from.post_send_inline(Address { node: 0, port }, 0, &[byte], 0)
        .unwrap();
}

/// Sends until the device has delivered everything `from` posted.
fn settle(from: &Endpoint) {
    let t = std::time::Instant::now();
    while !from.sends_done() {
        assert!(t.elapsed() < Duration::from_secs(5), "sends not taken");
        std::thread::yield_now();
    }
}

#[test]
fn sources_report_to_their_queue_in_order_once_per_arm() {
    let dev = common::device(1);
    let nic = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cfg = EndpointConfig::default();
    let mut q = pd.create_endpoint(&cfg).unwrap();
    let mut sources: Vec<Endpoint> = (0..3).map(|_| pd.create_endpoint(&cfg).unwrap()).collect();
    let mut sender = pd.create_endpoint(&cfg).unwrap();
    sender.bind(9).unwrap();
    for (i, s) in sources.iter_mut().enumerate() {
        s.bind(10 + i as u32).unwrap();
        s.set_event_queue(&q, 100 + i as u64).unwrap();
        assert!(!s.arm().unwrap());
    }
    let fd = q.notification_fd().expect("a pollable descriptor");
    assert!(!q.arm().unwrap());
    // To 11, 10, 11 again, 12: 11's second message, before it is armed
    // again, reports nothing more.
    for (port, byte) in [(11, 1), (10, 2), (11, 3), (12, 4)] {
        send(&mut sender, port, byte);
    }
    settle(&sender);
    assert!(
        common::readable(fd, 5000),
        "the queue's descriptor did not wake"
    );
    assert!(q.take_notification().unwrap());
    // The device posts the reports after its pass over the sends: the
    // first may wake the queue before the others are in.
    let mut got = cookies(&mut q);
    let t = std::time::Instant::now();
    while got.len() < 3 && t.elapsed() < Duration::from_secs(5) {
        got.extend(cookies(&mut q));
    }
    assert_eq!(got, [101, 100, 102]);
    // The sources were not notified themselves: their queue was.
    for s in sources.iter_mut() {
        assert!(!s.take_notification().unwrap());
    }
    assert_eq!(drain(&mut sources[1]), 2);
    // Served and armed again: the next message reports again; one to a
    // source not armed again does not.
    assert!(!sources[1].arm().unwrap());
    assert!(!q.arm().unwrap());
    send(&mut sender, 11, 5);
    send(&mut sender, 10, 6);
    settle(&sender);
    assert!(common::readable(fd, 5000));
    assert!(q.take_notification().unwrap());
    assert_eq!(cookies(&mut q), [101]);
    // Detached, a source is notified itself again.
    assert_eq!(drain(&mut sources[0]), 2);
    sources[0].clear_event_queue().unwrap();
    assert!(!sources[0].arm().unwrap());
    send(&mut sender, 10, 7);
    settle(&sender);
    assert!(sources[0].wait(Duration::from_secs(5)).unwrap());
    assert_eq!(cookies(&mut q), Vec::<u64>::new());
    // A destroyed queue: its sources are notified themselves, and an
    // endpoint given its id is no queue of theirs.
    let q_id = q.id();
    drop(q);
    let mut other = pd.create_endpoint(&cfg).unwrap();
    assert_eq!(other.id(), q_id, "the queue's id is given again");
    // The stale links name nothing: the endpoint with that id is neither
    // a queue with sources nor refused as a source itself.
    let r = pd.create_endpoint(&cfg).unwrap();
    other.set_event_queue(&r, 1).unwrap();
    other.clear_event_queue().unwrap();
    assert_eq!(drain(&mut sources[2]), 1);
    assert!(!sources[2].arm().unwrap());
    send(&mut sender, 12, 8);
    settle(&sender);
    assert!(sources[2].wait(Duration::from_secs(5)).unwrap());
    assert!(other.poll_event().is_none());
}

#[test]
fn a_queue_wakes_epoll_for_a_tripwire_and_an_out_of_band_message() {
    let dev = common::device(1);
    let nic = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cfg = EndpointConfig::default();
    let mut q = pd.create_endpoint(&cfg).unwrap();
    let mut a = pd.create_endpoint(&cfg).unwrap();
    let mut b = pd.create_endpoint(&cfg).unwrap();
    let mut sender = pd.create_endpoint(&cfg).unwrap();
    sender.bind(19).unwrap();
    a.bind(20).unwrap();
    b.bind(21).unwrap();
    a.set_event_queue(&q, 7).unwrap();
    b.set_event_queue(&q, 8).unwrap();
    let cookie = a.export(0, 4096, ulnic::Permissions::READ_WRITE).unwrap();
    a.set_tripwire(&cookie, 0, 8, ulnic::TripwireOn::Writes, true, 55)
        .unwrap();
    // SAFETY: epoll_create1 with no flags.
    let ep = unsafe { libc::epoll_create1(0) };
    assert!(ep >= 0);
    let fd = q.notification_fd().unwrap();
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 1,
    };
    // SAFETY: a valid epoll set, descriptor and event.
    assert_eq!(
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) },
        0
    );
    for (port, what) in [(21, "an out-of-band message"), (20, "a tripwire")] {
        assert!(!a.arm().unwrap() && !b.arm().unwrap() && !q.arm().unwrap());
        if port == 21 {
            sender
                .post_oob(Address { node: 0, port }, 3, b"hi", 1, false)
                .unwrap();
        } else {
            sender.write_segment(0, &[9u8; 8]);
            sender.rdma_write(&cookie, 0, 0, 8, 2, false).unwrap();
        }
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: room for 4 events.
        let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 4, 5000) };
        assert_eq!(n, 1, "{what} did not wake epoll");
        assert!(q.take_notification().unwrap());
        let want = if port == 21 { 8 } else { 7 };
        assert_eq!(cookies(&mut q), [want], "{what}");
        let source = if port == 21 { &mut b } else { &mut a };
        assert!(source.poll_event().is_some(), "{what} is at its source");
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(ep) };
}

#[test]
fn refused_attachments_change_nothing() {
    let dev = common::device_with(1, |b| b.max_endpoints(256));
    let nic = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let (pd, pd2) = (nic.alloc_pd().unwrap(), nic.alloc_pd().unwrap());
    let cfg = EndpointConfig::default();
    let q = pd.create_endpoint(&cfg).unwrap();
    let mut a = pd.create_endpoint(&cfg).unwrap();
    let mut b = pd.create_endpoint(&cfg).unwrap();
    let mut foreign = pd2.create_endpoint(&cfg).unwrap();
    let errno = |r: Result<(), ulnic::Error>| r.unwrap_err().errno();
    // Another domain's queue (the source itself as its queue cannot be
    // asked for in Rust; the C API's test asks).
    assert_eq!(errno(foreign.set_event_queue(&q, 1)), libc::EINVAL);
    // A chain: b reports to a, so a cannot have a queue, and a queue
    // with a queue takes no sources.
    b.set_event_queue(&a, 1).unwrap();
    assert_eq!(errno(a.set_event_queue(&q, 2)), libc::EINVAL);
    let mut c = pd.create_endpoint(&cfg).unwrap();
    a.clear_event_queue().unwrap();
    assert_eq!(errno(c.set_event_queue(&b, 3)), libc::EINVAL);
    drop(c);
    // Room: the default endpoint's ring leaves 144 sources (spec §6.1).
    let mut many: Vec<Endpoint> = Vec::new();
    let small = EndpointConfig {
        send_entries: 8,
        recv_entries: 8,
        free_entries: 8,
        segment_bytes: 4096,
    };
    let mut refused = None;
    for i in 0..200u64 {
        let mut s = pd.create_endpoint(&small).unwrap();
        match s.set_event_queue(&q, i) {
            Ok(()) => many.push(s),
            Err(e) => {
                refused = Some((i, e.errno()));
                break;
            }
        }
    }
    assert_eq!(refused, Some((144, libc::ENOSPC)));
    // Moving a source within its queue is not a new one.
    many[0].set_event_queue(&q, 999).unwrap();
    // Detaching one makes room for another.
    many.pop().unwrap().clear_event_queue().unwrap();
    let mut s = pd.create_endpoint(&small).unwrap();
    s.set_event_queue(&q, 1).unwrap();
}

/// `ulnic::EventQueue`: the library's own waits on attached endpoints
/// sleep on the queue, beside a thread that serves the queue itself.
#[test]
fn waits_on_attached_endpoints_and_the_queue_share_one_notification() {
    let dev = common::device(1);
    let nic = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cfg = EndpointConfig::default();
    let queue = ulnic::EventQueue::new(&pd).unwrap();
    let mut sources: Vec<Endpoint> = (0..3).map(|_| pd.create_endpoint(&cfg).unwrap()).collect();
    for (i, s) in sources.iter_mut().enumerate() {
        s.bind(30 + i as u32).unwrap();
        queue.attach(s, 200 + i as u64).unwrap();
    }
    let mut sender = pd.create_endpoint(&cfg).unwrap();
    sender.bind(29).unwrap();
    let mut c = sources.pop().unwrap();
    let b = sources.pop().unwrap();
    let mut a = sources.pop().unwrap();
    // Nothing came: the queue reports nothing, and a wait on a source
    // times out.
    assert!(queue.wait(Duration::ZERO).unwrap().is_empty());
    assert!(!a.wait(Duration::from_millis(20)).unwrap());
    // One thread blocks in a's own wait, another in b's waiter: one of
    // them sleeps in the driver, the other on the queue's lock, and
    // whichever takes the queue's events hands the other its report.
    let waiter_b = b.waiter();
    let ta = std::thread::spawn(move || {
        let woke = a.wait(Duration::from_secs(10)).unwrap();
        (woke, a.poll_recv().map(|m| m.len))
    });
    let tb = std::thread::spawn(move || waiter_b.wait(Duration::from_secs(10)).unwrap());
    std::thread::sleep(Duration::from_millis(100));
    send(&mut sender, 30, 1);
    send(&mut sender, 31, 2);
    settle(&sender);
    assert_eq!(ta.join().unwrap(), (true, Some(1)));
    assert!(tb.join().unwrap(), "b's waiter woke");
    // Then the queue's consumer: c's report. (a's too when a's thread
    // started after its message came and found it without sleeping: a
    // report left behind only sends the consumer to look at a.)
    send(&mut sender, 32, 3);
    settle(&sender);
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    while !got.contains(&202) && t.elapsed() < Duration::from_secs(10) {
        got.extend(queue.wait(Duration::from_secs(1)).unwrap());
    }
    assert!(got.contains(&202), "c reported: {got:?}");
    assert!(got.iter().all(|c| [200, 202].contains(c)), "{got:?}");
    assert_eq!(drain(&mut c), 1);
    // Served and armed again, c reports again; a message to b, whose
    // waiter is gone, is the consumer's now.
    assert!(!c.arm().unwrap());
    let mut b = b;
    assert_eq!(drain(&mut b), 1);
    assert!(!b.arm().unwrap());
    send(&mut sender, 31, 4);
    send(&mut sender, 32, 5);
    settle(&sender);
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    while got.len() < 2 && t.elapsed() < Duration::from_secs(10) {
        got.extend(queue.wait(Duration::from_secs(1)).unwrap());
    }
    got.sort_unstable();
    assert_eq!(got, [201, 202]);
    // A program sleeping on the queue's descriptor: a zero wait arms the
    // queue, a message makes the descriptor readable, the next zero wait
    // takes the report and the notification (no longer readable).
    assert_eq!(drain(&mut b), 1);
    assert!(!b.arm().unwrap());
    let fd = queue.notification_fd().unwrap();
    assert!(queue.wait(Duration::ZERO).unwrap().is_empty());
    assert!(!common::readable(fd, 0));
    send(&mut sender, 31, 6);
    settle(&sender);
    assert!(common::readable(fd, 5000), "the queue's descriptor woke");
    let mut got = queue.wait(Duration::ZERO).unwrap();
    let t = std::time::Instant::now();
    while got.is_empty() && t.elapsed() < Duration::from_secs(5) {
        got = queue.wait(Duration::ZERO).unwrap();
    }
    assert_eq!(got, [201]);
    assert!(!common::readable(fd, 0), "the notification was taken");
    // A tripwire on an attached endpoint: its wait sleeps on the queue.
    assert_eq!(drain(&mut b), 1);
    let cookie = b.export(0, 4096, ulnic::Permissions::WRITE).unwrap();
    let tw = b
        .set_tripwire(&cookie, 0, 8, ulnic::TripwireOn::Writes, false, 9)
        .unwrap();
    let tt = std::thread::spawn(move || {
        let woke = b.wait_tripwire(tw, 0, 0, Duration::from_secs(10)).unwrap();
        (woke, b.read_u64(0))
    });
    std::thread::sleep(Duration::from_millis(50));
    sender.write_segment(0, &7u64.to_le_bytes());
    sender.rdma_write(&cookie, 0, 0, 8, 3, false).unwrap();
    assert_eq!(tt.join().unwrap(), (true, 7));
    // Detached, an endpoint waits on itself again; one attached with the
    // raw call cannot wait on itself and says so.
    queue.detach(&mut c).unwrap();
    assert_eq!(
        queue.detach(&mut c).unwrap_err().errno(),
        libc::EINVAL,
        "not attached any more"
    );
    assert_eq!(drain(&mut c), 1);
    assert!(!c.arm().unwrap());
    send(&mut sender, 32, 7);
    settle(&sender);
    assert!(c.wait(Duration::from_secs(5)).unwrap());
    assert_eq!(drain(&mut c), 1);
    // A waiter made before its endpoint is attached waits the way the
    // endpoint is notified now: through the queue.
    let early = c.waiter();
    queue.attach(&mut c, 203).unwrap();
    let te = std::thread::spawn(move || early.wait(Duration::from_secs(10)).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    send(&mut sender, 32, 8);
    settle(&sender);
    assert!(
        te.join().unwrap(),
        "the early waiter woke through the queue"
    );
    assert_eq!(drain(&mut c), 1);
    queue.detach(&mut c).unwrap();
    let raw_queue = pd.create_endpoint(&cfg).unwrap();
    c.set_event_queue(&raw_queue, 1).unwrap();
    assert_eq!(
        c.wait(Duration::from_millis(10)).unwrap_err().errno(),
        libc::EINVAL
    );
}
