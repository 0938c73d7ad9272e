//! `ulnic send` / `ulnic recv` host-attached, as separate processes: a
//! stream arrives complete and in order (with returns resent), and a
//! receiver killed mid-stream reaches the sender as its close message.
#[path = "../../device/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn ulnic(sock: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ulnic"));
    c.args(args)
        .env("ULNIC_SOCKET", sock)
        .env("ULNIC_DEVICE", "/nonexistent");
    c
}

/// Starts a receiver and waits until it listens.
fn receiver(sock: &std::path::Path, args: &[&str]) -> Child {
    let mut child = ulnic(sock, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let mut lines = BufReader::new(err).lines();
    assert!(
        lines.any(|l| l.unwrap().contains("listening")),
        "receiver did not start"
    );
    child
}

#[test]
fn stream_arrives_whole_and_in_order() {
    let (dev, _dir) = common::device(2);
    for size in ["64", "8192"] {
        let rx = receiver(&common::socket(&dev, 1), &["recv", "--port", "5", "--json"]);
        let out = ulnic(
            &common::socket(&dev, 0),
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
        let got = rx.wait_with_output().unwrap();
        assert!(
            got.status.success(),
            "recv: {}",
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
    let (dev, _dir) = common::device(2);
    let mut rx = receiver(
        &common::socket(&dev, 1),
        &["recv", "--port", "5", "--close-to", "0:6"],
    );
    let tx = ulnic(
        &common::socket(&dev, 0),
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
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    rx.kill().unwrap(); // SIGKILL: no cleanup in the process
    rx.wait().unwrap();
    let out = tx.wait_with_output().unwrap();
    assert!(out.status.success());
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["outcome"], "peer-closed");
    assert_eq!(r["close_message"], "ulnic recv: endpoint closed");
}
