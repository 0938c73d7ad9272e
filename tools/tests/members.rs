//! Two device processes started by `ulnic fabric up --nodes 4 --devices 2`
//! (nodes 0-1 on member d0, 2-3 on d1, the trunk between them over UDP,
//! spec §10.7): what one process's death tells a peer on the other
//! member. A receiver killed with SIGKILL is a close message to its peer
//! (library); under the preload layer a writer killed mid-stream ends its
//! reader's stream with ECONNRESET (or end of stream) after the bytes
//! that reached it, never a hang; RDMA crosses the members with the
//! exporting member checking the cookie; a trunk cut for good returns a
//! sender's messages UNREACHABLE.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ulnic_testkit::{wait_for, wait_for_path, TestChild};

mod cli;

fn ulnic() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ulnic"))
}

/// The members of one `fabric up`, stopped when dropped.
struct Members {
    dir: tempfile::TempDir,
}

impl Members {
    fn up() -> Members {
        let dir = tempfile::tempdir().unwrap();
        // Tests of this file run at once: each fabric its own UDP ports.
        static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = 20_000 + (std::process::id() % 2_000) as u16 * 8 + 2 * k;
        let out = ulnic()
            .args(["fabric", "up", "--nodes", "4", "--devices", "2", "--port"])
            .arg(port.to_string())
            .arg("--dir")
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fabric up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Members { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn socket(&self, node: u32) -> PathBuf {
        self.path().join(format!("node{node}.sock"))
    }

    /// `ulnic args` attached to node `node`.
    fn on(&self, node: u32, args: &[&str]) -> Command {
        let mut c = ulnic();
        c.args(args)
            .env("ULNIC_SOCKET", self.socket(node))
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        let _ = ulnic()
            .args(["fabric", "down", "--dir"])
            .arg(self.dir.path())
            .output();
    }
}

#[test]
fn a_receiver_killed_on_one_member_is_a_close_message_on_the_other() {
    let m = Members::up();
    let (ready, flowing) = (m.path().join("recv.ready"), m.path().join("recv.flowing"));
    let mut recv = TestChild::spawn(
        "recv on node 2",
        m.on(2, &["recv", "--port", "9", "--close-to", "0:5"])
            .arg("--ready-file")
            .arg(&ready)
            .args(["--progress-after", "1000", "--progress-file"])
            .arg(&flowing),
    );
    wait_for_path(&ready, Duration::from_secs(20));
    let send = TestChild::spawn(
        "send on node 0",
        &mut m.on(
            0,
            &[
                "send",
                "--to",
                "2:9",
                "--port",
                "5",
                "--count",
                "4000000000",
                "--expect-close",
                "--json",
                "--timeout",
                "60",
            ],
        ),
    );
    // Mid-stream (a thousand messages in), the receiver dies without a
    // word of its own.
    wait_for_path(&flowing, Duration::from_secs(20));
    let killed = Instant::now();
    recv.kill();
    let out = send.finish(Duration::from_secs(30));
    let took = killed.elapsed();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!(r["outcome"], "peer-closed", "{r}");
    assert_eq!(r["close_message"], "ulnic recv: endpoint closed", "{r}");
    eprintln!("close message across members {took:?} after SIGKILL");
}

/// The preload layer's library and its test program (built by the
/// preload crate's tests; compiled here once).
fn preload() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("libulnic_preload.so");
    assert!(
        p.exists(),
        "{} not built (cargo build -p ulnic-preload)",
        p.display()
    );
    p
}

fn sockcheck() -> &'static Path {
    ulnic_testkit::c_program(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-lib/preload/tests/progs/sockcheck.c"),
    )
}

/// `sockcheck args` on node `node` under the preload layer.
fn sockcheck_on(m: &Members, node: u32, args: &[&str]) -> TestChild {
    TestChild::spawn(
        &format!("sockcheck {}", args.join(" ")),
        Command::new(sockcheck())
            .args(args)
            .env("LD_PRELOAD", preload())
            .env("ULNIC_INET", "10.81.0.0/24")
            .env("ULNIC_SOCKET", m.socket(node))
            .stdin(Stdio::null()),
    )
}

/// Bytes node `node`'s endpoints have received (its member's counters).
fn rx_bytes(m: &Members, node: usize) -> u64 {
    let member = if node < 2 { "d0" } else { "d1" };
    let d = m.path().to_str().unwrap();
    let s = cli::json_lines(&["stats", "--device", d, "--member", member, "--json"]);
    s[0]["nodes"][node]["endpoints"]
        .as_array()
        .map_or(0, |eps| {
            eps.iter()
                .filter_map(|e| e["counters"]["rx_bytes"].as_u64())
                .sum()
        })
}

/// A sockcheck stream on TCP port `port` from node 0 (member d0) to node
/// 2 (d1, 10.81.0.3), once a MiB has reached node 2: (reader, writer).
fn mid_stream(m: &Members, port: &str) -> (TestChild, TestChild) {
    let ready = Duration::from_secs(20);
    let mut sink = sockcheck_on(m, 2, &["sink", port]);
    sink.expect_line("ready", ready);
    let mut src = sockcheck_on(m, 0, &["source", "10.81.0.3", port]);
    src.expect_line("connected", ready);
    sink.expect_line("connected", ready);
    wait_for(
        Duration::from_secs(20),
        "a MiB into node 2 (the stream never started)",
        || rx_bytes(m, 2),
        |n| *n >= 1 << 20,
    );
    (sink, src)
}

#[test]
fn a_writer_killed_on_one_member_resets_its_reader_on_the_other() {
    let m = Members::up();
    let (sink, mut src) = mid_stream(&m, "7500");
    let killed = Instant::now();
    src.kill(); // SIGKILL: only the device on member d0 speaks for it
    let out = sink.finish(Duration::from_secs(30));
    let took = killed.elapsed();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("then Connection reset by peer") || said.contains("then end of stream"),
        "{said}"
    );
    let read = said
        .lines()
        .find_map(|l| l.strip_prefix("ok read "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        read >= 1 << 20,
        "only {read} bytes read before the end: {said}"
    );
    eprintln!("reader's stream ended {took:?} after the writer's SIGKILL: {said}");
}

#[test]
fn rdma_crosses_the_members_and_a_cut_trunk_returns_messages() {
    let m = Members::up();
    let d = m.path().to_str().unwrap();
    for workload in ["rdma-write", "rdma-read"] {
        let r = cli::json_lines(&[
            "bench",
            workload,
            "--device-dir",
            d,
            "--nodes",
            "0,2",
            "--size",
            "65536",
            "--iters",
            "200",
            "--json",
        ]);
        let ours = r
            .iter()
            .find(|l| l["transport"] == "ulnic")
            .unwrap_or_else(|| panic!("no ulnic line: {r:?}"));
        assert_eq!(ours["size"], 65536, "{ours}");
    }
    // The trunk (link 0) down for good, from d0's side: node 0's messages
    // to node 2 come back UNREACHABLE, within the transport's budget.
    let cut = ulnic()
        .args(["fabric", "set", "--device", d, "--member", "d0"])
        .args(["--link", "0", "--down"])
        .output()
        .unwrap();
    assert!(
        cut.status.success(),
        "{}",
        String::from_utf8_lossy(&cut.stderr)
    );
    let send = m
        .on(
            0,
            &["send", "--to", "2:5", "--count", "3", "--timeout", "30"],
        )
        .output()
        .unwrap();
    assert!(!send.status.success());
    let err = String::from_utf8_lossy(&send.stderr);
    assert!(err.contains("unreachable"), "{err}");
}

#[test]
fn a_partition_ends_blocked_sockets_with_etimedout() {
    let m = Members::up();
    let (sink, src) = mid_stream(&m, "7600");
    // The trunk cut for good, both ways (each member emulates the lane
    // it sends on): neither side can say anything to the other again.
    let d = m.path().to_str().unwrap();
    let cut = Instant::now();
    for member in ["d0", "d1"] {
        let o = ulnic()
            .args(["fabric", "set", "--device", d, "--member", member])
            .args(["--link", "0", "--down"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // The reader blocks once the data stops, the writer once its credits
    // run out; both hear of the peer's node given up on through their
    // keepalives (docs/sockets.md §4).
    for (who, p, then) in [
        ("reader", sink, "then Connection timed out"),
        ("writer", src, "then Connection timed out"),
    ] {
        let out = p.finish(Duration::from_secs(60));
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && said.contains(then), "{who}: {said}");
        eprintln!("{who} ended {:?} after the cut: {said}", cut.elapsed());
    }
}
