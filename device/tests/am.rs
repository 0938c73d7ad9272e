//! Active Messages (`ulnic::am`, docs/am.md) between host-attached nodes
//! of one device: request and reply handlers, the implicit answer that
//! returns a credit, credits running out, returned messages (no endpoint,
//! no handler, outside the region) at the error handler, bulk transfers
//! inline and from the segment, forged answers, and two endpoints that
//! request of each other with no credit left.
use ulnic_testkit as common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ulnic::am::{AmConfig, AmEndpoint, Kind, ReturnReason, Returned};
use ulnic::{Address, EndpointConfig, Nic, SendError};

fn am_on(nic: &Nic, port: u32, cfg: AmConfig) -> AmEndpoint {
    let mut ep = nic
        .alloc_pd()
        .unwrap()
        .create_endpoint(&EndpointConfig {
            segment_bytes: 1 << 20,
            ..Default::default()
        })
        .unwrap();
    ep.bind(port).unwrap();
    AmEndpoint::new(ep, cfg).unwrap()
}

/// Polls every endpoint until `done` holds (at most 20 s).
fn pump(eps: &mut [&mut AmEndpoint], mut done: impl FnMut(&[&mut AmEndpoint]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(eps) {
        assert!(Instant::now() < deadline, "timed out");
        let mut any = 0;
        for e in eps.iter_mut() {
            any += e.poll().unwrap();
        }
        if any == 0 {
            std::thread::yield_now();
        }
    }
}

const A1: Address = Address { node: 1, port: 1 };

#[test]
fn requests_run_handlers_and_replies_come_back_to_theirs() {
    let (_dev, a, b) = common::two_nodes();
    let mut client = am_on(&a, 1, AmConfig::default());
    let mut server = am_on(&b, 1, AmConfig::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    server.set_request_handler(7, |t, m| {
        assert_eq!(m.src, Address { node: 0, port: 1 });
        assert_eq!(t.source(), m.src);
        t.reply4(9, [m.words[0] + 1, m.words[1], m.words[2], m.words[3]])
            .unwrap();
        // Once only.
        assert!(t.reply4(9, m.words).is_err());
    });
    let s = seen.clone();
    client.set_reply_handler(9, move |m| {
        assert_eq!(m.src, A1);
        s.lock().unwrap().push(m.words);
    });
    for i in 0..100u64 {
        client.request4(A1, 7, [i, i * 3, u64::MAX, 42]).unwrap();
        pump(&mut [&mut client, &mut server], |e| e[0].credits() == 4);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 100);
    for (i, w) in seen.iter().enumerate() {
        let i = i as u64;
        assert_eq!(*w, [i + 1, i * 3, u64::MAX, 42]);
    }
    assert_eq!(server.stats().requests_handled, 100);
    assert_eq!(client.stats().replies_handled, 100);
    assert_eq!(server.stats().credits_sent, 0);
}

#[test]
fn a_handler_that_does_not_reply_still_returns_the_credit_and_credits_bound_requests() {
    let (_dev, a, b) = common::two_nodes();
    let cfg = AmConfig {
        credits: 2,
        ..Default::default()
    };
    let mut client = am_on(&a, 1, cfg);
    let mut server = am_on(&b, 1, AmConfig::default());
    let count = Arc::new(Mutex::new(0u64));
    let c = count.clone();
    server.set_request_handler(1, move |_, m| *c.lock().unwrap() += m.words[0]);
    client.try_request4(A1, 1, [1, 0, 0, 0]).unwrap();
    client.try_request4(A1, 1, [2, 0, 0, 0]).unwrap();
    assert_eq!(client.credits(), 0);
    // No credit: the third waits, however long the server takes.
    assert!(matches!(
        client.try_request4(A1, 1, [4, 0, 0, 0]),
        Err(ulnic::Error::WouldBlock)
    ));
    std::thread::sleep(Duration::from_millis(50));
    client.poll().unwrap();
    assert_eq!(client.credits(), 0, "no answer before the server polls");
    pump(&mut [&mut client, &mut server], |e| e[0].credits() == 2);
    assert_eq!(*count.lock().unwrap(), 3);
    assert_eq!(server.stats().credits_sent, 2);
    assert_eq!(client.stats().replies_handled, 0);
}

fn collect_errors(am: &mut AmEndpoint) -> Arc<Mutex<Vec<Returned>>> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    am.set_error_handler(move |r| g.lock().unwrap().push(*r));
    got
}

#[test]
fn undeliverable_and_refused_messages_reach_the_error_handler_with_their_words() {
    let (_dev, a, b) = common::two_nodes();
    let mut client = am_on(&a, 1, AmConfig::default());
    let mut server = am_on(
        &b,
        1,
        AmConfig {
            region_bytes: 4096,
            ..Default::default()
        },
    );
    server.set_request_handler(1, |_, _| {});
    let errors = collect_errors(&mut client);
    // Nobody at port 5; no handler 2; a transfer past the region's end.
    client
        .request4(Address { node: 1, port: 5 }, 1, [5, 5, 5, 5])
        .unwrap();
    client.request4(A1, 2, [2, 2, 2, 2]).unwrap();
    client.xfer(A1, 4000, 1, &[1u8; 200], [3, 3, 3, 3]).unwrap();
    pump(&mut [&mut client, &mut server], |e| {
        e[0].credits() == 4 && e[0].stats().returned == 3
    });
    let mut errors = errors.lock().unwrap().clone();
    errors.sort_by_key(|r| r.handler);
    assert_eq!(errors.len(), 3, "{errors:?}");
    let no_endpoint = errors.iter().find(|r| r.dest.port == 5).unwrap();
    assert_eq!(
        (no_endpoint.kind, no_endpoint.words, no_endpoint.reason),
        (
            Kind::Request,
            Some([5; 4]),
            ReturnReason::Send(SendError::NoEndpoint)
        )
    );
    let no_handler = errors.iter().find(|r| r.handler == 2).unwrap();
    assert_eq!(
        (no_handler.words, no_handler.reason),
        (Some([2; 4]), ReturnReason::Refused(1))
    );
    let outside = errors.iter().find(|r| r.kind == Kind::Xfer).unwrap();
    assert_eq!(
        (outside.words, outside.reason),
        (Some([3; 4]), ReturnReason::Refused(2))
    );
    assert!(server.region().iter().all(|&b| b == 0), "nothing landed");
    assert_eq!(server.stats().refusals_sent, 2);
}

#[test]
fn transfers_land_in_the_region_before_their_handler_runs() {
    let (_dev, a, b) = common::two_nodes();
    let mut client = am_on(&a, 1, AmConfig::default());
    let mut server = am_on(&b, 1, AmConfig::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    server.set_request_handler(3, move |t, m| {
        s.lock().unwrap().push((m.offset, m.data.to_vec(), m.words));
        t.reply4(4, [m.data.len() as u64, 0, 0, 0]).unwrap();
    });
    let replies = Arc::new(Mutex::new(Vec::new()));
    let r = replies.clone();
    client.set_reply_handler(4, move |m| r.lock().unwrap().push(m.words[0]));
    // Inline (40 + 16 bytes fit a descriptor), then from the segment at
    // the largest size.
    let small: Vec<u8> = (0..16u8).collect();
    let big: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    client.xfer(A1, 100, 3, &small, [1, 0, 0, 0]).unwrap();
    client.xfer(A1, 65536, 3, &big, [2, 0, 0, 0]).unwrap();
    assert!(matches!(
        client.xfer(A1, 0, 3, &[0u8; 8193], [0; 4]),
        Err(ulnic::Error::InvalidArgument(_))
    ));
    pump(&mut [&mut client, &mut server], |e| e[0].credits() == 4);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], (100, small.clone(), [1, 0, 0, 0]));
    assert_eq!(seen[1], (65536, big.clone(), [2, 0, 0, 0]));
    assert_eq!(&server.region()[100..116], &small[..]);
    assert_eq!(&server.region()[65536..65536 + 8192], &big[..]);
    assert_eq!(*replies.lock().unwrap(), vec![16, 8192]);
}

#[test]
fn forged_answers_free_no_credit() {
    let (_dev, a, b) = common::two_nodes();
    let mut client = am_on(&a, 1, AmConfig::default());
    // The server's node holds a plain endpoint that never answers as AM,
    // and a forger on another port of the same node.
    let mut silent = b
        .alloc_pd()
        .unwrap()
        .create_endpoint(&Default::default())
        .unwrap();
    silent.bind(1).unwrap();
    let mut forger = b
        .alloc_pd()
        .unwrap()
        .create_endpoint(&Default::default())
        .unwrap();
    forger.bind(2).unwrap();
    client.request4(A1, 1, [0; 4]).unwrap();
    assert_eq!(client.credits(), 3);
    // Every slot and generation a guess could name, as REPLY and CREDIT,
    // from port 2 (not where the request went), plus junk tags.
    let to = Address { node: 0, port: 1 };
    let mut sent = 0;
    for tag in (0..4u32).flat_map(|slot| {
        (0..4u32).flat_map(move |g| {
            [2u32, 4].map(move |kind| kind << 8 | 1 << 12 | slot << 16 | g << 24)
        })
    }) {
        forger.post_send_inline(to, tag, &[0u8; 32], sent).unwrap();
        sent += 1;
    }
    forger
        .post_send_inline(to, 0xdead_beef, b"junk", 99)
        .unwrap();
    pump(&mut [&mut client], |e| {
        let s = e[0].stats();
        s.stray + s.foreign == sent + 1
    });
    assert_eq!(client.credits(), 3, "a forged answer freed a credit");
    assert_eq!(client.stats().replies_handled, 0);
    // The request did arrive at the silent endpoint.
    let deadline = Instant::now() + Duration::from_secs(5);
    while silent.poll_recv().is_none() {
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
}

#[test]
fn two_endpoints_requesting_of_each_other_without_credits_do_not_deadlock() {
    let (_dev, a, b) = common::two_nodes();
    let cfg = AmConfig {
        credits: 1,
        ..Default::default()
    };
    let mut x = am_on(&a, 1, cfg);
    let mut y = am_on(&b, 1, cfg);
    for am in [&mut x, &mut y] {
        am.set_request_handler(1, |t, m| t.reply4(1, m.words).unwrap());
        am.set_reply_handler(1, |_| {});
    }
    let peer_of_y = Address { node: 0, port: 1 };
    let x_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = x_done.clone();
    let t = std::thread::spawn(move || {
        for i in 0..2000 {
            y.request4(peer_of_y, 1, [i; 4]).unwrap();
        }
        // Keep answering x until it is done.
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            if y.poll().unwrap() == 0 {
                std::thread::yield_now();
            }
        }
        y
    });
    for i in 0..2000 {
        x.request4(A1, 1, [i; 4]).unwrap();
    }
    while x.credits() < 1 {
        x.poll().unwrap();
    }
    x_done.store(true, std::sync::atomic::Ordering::Relaxed);
    // Keep answering y until it is done too: x may finish first, and y's
    // last requests then wait for x's replies (the test hung so once).
    while !t.is_finished() {
        if x.poll().unwrap() == 0 {
            std::thread::yield_now();
        }
    }
    let mut y = t.join().unwrap();
    pump(&mut [&mut x, &mut y], |e| e[1].credits() == 1);
    assert_eq!(x.stats().replies_handled, 2000);
    assert_eq!(y.stats().replies_handled, 2000);
}
