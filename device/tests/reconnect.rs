//! A frontend that dies mid-stream (SIGKILL, no cleanup) and reconnects, as
//! a rebooting VM does: its peer gets errors, not silence; the device frees
//! the node's state and sends the dead endpoint's close message; the new
//! connection works.
use ulnic_testkit as common;

use std::process::Command;
use std::time::{Duration, Instant};
use ulnic::{Address, EndpointConfig, Event, Nic, SendError};

const CHILD_ENV: &str = "ULNIC_TEST_CHILD_SOCKET";

/// Runs only as the child process: a receiver that never cleans up.
#[test]
fn child_receiver() {
    let Ok(sock) = std::env::var(CHILD_ENV) else {
        return;
    };
    let nic = Nic::attach(sock.as_ref()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut ep = pd.create_endpoint(&EndpointConfig::default()).unwrap();
    ep.bind(2).unwrap();
    ep.set_close_message(Address { node: 0, port: 1 }, 77, b"receiver gone")
        .unwrap();
    println!("READY");
    loop {
        while ep.poll_recv().is_some() {}
        std::thread::yield_now();
    }
}

#[test]
fn killed_peer_is_reported_and_node_recovers() {
    let dev = common::device(2);
    let a = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let pa = a.alloc_pd().unwrap();
    let mut ea = pa.create_endpoint(&EndpointConfig::default()).unwrap();
    ea.bind(1).unwrap();
    let dest = Address { node: 1, port: 2 };
    let mut sent = 0u64;
    for round in 0..3 {
        let mut child = common::TestChild::spawn(
            "the receiving child",
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "child_receiver",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD_ENV, common::socket(&dev, 1)),
        );
        child.expect_line("READY", Duration::from_secs(20));
        // Stream until 100 messages were delivered this round.
        let start = ea.stats().unwrap()[0].1;
        while ea.stats().unwrap()[0].1 < start + 100 {
            if ea
                .post_send_inline(dest, 0, &sent.to_le_bytes(), sent)
                .is_ok()
            {
                sent += 1;
            }
            if let Some(ev) = ea.poll_event() {
                panic!("round {round}: unexpected {ev:?} while the peer lives");
            }
        }
        child.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut reported = false;
        let mut closed = false;
        while !reported || !closed {
            assert!(
                Instant::now() < deadline,
                "round {round}: the peer's death was never reported (error {reported}, close {closed})"
            );
            while let Some(m) = ea.poll_recv() {
                if m.returned {
                    // Sent after the peer went: the fabric hands it back.
                    assert_eq!(m.src, dest, "round {round}: returned from elsewhere");
                    continue;
                }
                assert!(m.close, "round {round}: only a close message was expected");
                assert!(!closed, "round {round}: a second close message");
                assert_eq!((m.src, m.tag, m.len), (dest, 77, 13));
                match m.payload {
                    ulnic::Payload::Inline(b) => assert_eq!(&b[..13], b"receiver gone"),
                    other => panic!("close message not inline: {other:?}"),
                }
                closed = true;
            }
            if ea.post_send_inline(dest, 0, &[0; 8], sent).is_ok() {
                sent += 1;
            }
            while let Some(ev) = ea.poll_event() {
                match ev {
                    Event::SendFailed {
                        reason: SendError::NoEndpoint,
                        dest: d,
                        ..
                    } => {
                        assert_eq!(d, dest);
                        reported = true;
                    }
                    Event::SendFailed {
                        reason: SendError::NoBuffer,
                        ..
                    } => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        while !ea.sends_done() {
            std::thread::yield_now();
        }
        // Every send settled, in the fabric too (spec §10.6.1 in_flight).
        common::wait_until(Duration::from_secs(10), "every send settled", || {
            let n = &dev.snapshot().nodes[0];
            n.endpoints.iter().all(|e| e.in_flight == 0)
        });
        while ea.poll_event().is_some() {}
        while ea.poll_recv().is_some() {}
    }
    // Every send is counted once, when its outcome is known: delivered
    // (tx_messages) or failed (tx_errors; spec §7).
    let s: std::collections::HashMap<_, _> = ea.stats().unwrap().into_iter().collect();
    assert_eq!(s["tx_messages"] + s["tx_errors"], sent, "{s:?}");
}

#[test]
fn a_second_frontend_on_a_busy_node_is_refused_at_once() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let first = Nic::attach(&sock).unwrap();
    // Before the fix the second attach waited in the backlog until the
    // first left (here: forever); a hang guard, not a timing check.
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = sock.clone();
    std::thread::spawn(move || tx.send(Nic::attach(&s2).map(|_| ())));
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Err(ulnic::Error::Driver(ulnic_host_attach::Error::NodeBusy(p)))) => {
            assert_eq!(p, sock)
        }
        Ok(Err(e)) => panic!("expected node busy, got {e}"),
        Ok(Ok(())) => panic!("a second frontend was attached to a busy node"),
        Err(_) => panic!("the second attach blocked instead of being refused"),
    }
    // The first keeps working; once it leaves, the node takes a new one.
    let pd = first.alloc_pd().unwrap();
    drop(pd);
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Nic::attach(&sock) {
            Ok(n) => {
                n.alloc_pd().unwrap();
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "node did not free up: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Reads config-space word 56, the connection epoch (spec §2.2, §2.5),
/// over a fresh vhost-user connection to `path`.
fn connection_epoch(path: &std::path::Path) -> u32 {
    use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
    use vhost::vhost_user::VhostUserFrontend;
    let mut fe = common::frontend(path, VhostUserProtocolFeatures::CONFIG);
    let (_, word) = fe
        .get_config(56, 4, VhostUserConfigFlags::WRITABLE, &[0; 4])
        .unwrap();
    u32::from_le_bytes(word[..4].try_into().unwrap())
}

#[test]
fn every_connection_has_a_new_epoch() {
    let dev = common::device(1);
    let path = common::socket(&dev, 0);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let e = connection_epoch(&path);
        assert_ne!(e, 0, "the epoch is never 0");
        assert!(!seen.contains(&e), "epoch {e:#x} repeated: {seen:x?}");
        seen.push(e);
        // The next connection is accepted once this one is gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while dev.shard().lock().nodes[0].disconnect.is_some() {
            assert!(Instant::now() < deadline, "the node was not released");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
