//! `ulnic send` / `ulnic recv` host-attached, as separate processes: a
//! stream arrives complete and in order (with returns resent), and a
//! receiver killed mid-stream reaches the sender as its close message.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ulnic_testkit::{device, endpoint_on, stat, wait_for, wait_for_path, TestChild};

fn ulnic(sock: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ulnic"));
    c.args(args)
        .env("ULNIC_SOCKET", sock)
        .env("ULNIC_DEVICE", "/nonexistent");
    c
}

/// Starts `ulnic recv ARGS` and waits until its ready file says it is
/// bound with its buffers posted.
fn receiver(sock: &Path, dir: &Path, args: &[&str]) -> TestChild {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let ready = dir.join(format!("recv-{}.ready", N.fetch_add(1, Ordering::Relaxed)));
    let child = TestChild::spawn(
        "ulnic recv",
        ulnic(sock, args).arg("--ready-file").arg(&ready),
    );
    wait_for_path(&ready, Duration::from_secs(20));
    child
}

#[test]
fn stream_arrives_whole_and_in_order() {
    let dev = device(2);
    for size in ["64", "8192"] {
        let rx = receiver(
            &dev.socket(1),
            dev.dir.path(),
            &["recv", "--port", "5", "--json"],
        );
        let out = ulnic(
            &dev.socket(0),
            &[
                "send", "--to", "1:5", "--count", "20000", "--size", size, "--json",
            ],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "send: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let sent: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(sent["outcome"], "finished");
        assert_eq!(sent["messages"], 20000);
        let got = rx.finish(Duration::from_secs(60));
        assert!(
            got.status.success(),
            "recv ({}): {}",
            got.status,
            String::from_utf8_lossy(&got.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
        assert_eq!(r["messages"], 20000);
        assert_eq!(r["from"], "0:6");
        assert_eq!(r["bytes"], 20000 * size.parse::<u64>().unwrap());
    }
}

#[test]
fn killed_receiver_sends_its_close_message() {
    let dev = device(2);
    let mut rx = receiver(
        &dev.socket(1),
        dev.dir.path(),
        &["recv", "--port", "5", "--close-to", "0:6"],
    );
    let tx = TestChild::spawn(
        "ulnic send",
        &mut ulnic(
            &dev.socket(0),
            &[
                "send",
                "--to",
                "1:5",
                "--count",
                "4000000000",
                "--expect-close",
                "--json",
                "--timeout",
                "60",
            ],
        ),
    );
    // Mid-stream: the receiving endpoint has taken 10,000 messages.
    wait_for(
        Duration::from_secs(20),
        "10,000 messages into the receiver (the stream never started)",
        || endpoint_on(&dev, 1, 5).map(|e| stat(&e, "rx_messages")),
        |n| n.is_some_and(|n| n >= 10_000),
    );
    rx.kill(); // SIGKILL: no cleanup in the process
    let out = tx.finish(Duration::from_secs(90));
    assert!(
        out.status.success(),
        "send ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["outcome"], "peer-closed");
    assert_eq!(r["close_message"], "ulnic recv: endpoint closed");
    assert!(r["messages"].as_u64().unwrap() >= 10_000, "{r}");
}

#[test]
fn a_send_to_nobody_fails_and_never_reads_its_own_returned_fin_as_a_confirmation() {
    // Nothing is bound to 1:5: every message and the FIN come back or are
    // refused. A returned FIN carries the sender's own count and the
    // destination as its source; taken for the receiver's answer it once
    // made this report "finished".
    let dev = device(2);
    let out = ulnic(
        &dev.socket(0),
        &["send", "--to", "1:5", "--count", "10", "--json"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a send to nobody succeeded: {err}");
    assert!(err.contains("gone (no endpoint)"), "{err}");
}
