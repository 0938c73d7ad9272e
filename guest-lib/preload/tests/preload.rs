//! The preload layer under real programs that know nothing of ulnic:
//! `tests/progs/sockcheck.c` (built here with gcc) and Debian's
//! redis-server, redis-benchmark, iperf3 and sockperf, as separate
//! processes attached to nodes of a device, with
//! `LD_PRELOAD=libulnic_preload.so`. Bytes arrive intact and in order;
//! a killed peer ends reads with end of stream or ECONNRESET and writes
//! with EPIPE, never a hang; one epoll set mixes ulnic and kernel
//! descriptors; fork and exec keep working.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ulnic_device::{Configuration, Device};

const INET: &str = "10.81.0.0/24";

/// The directory cargo built this test's profile into.
fn built() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn preload() -> PathBuf {
    let p = built().join("libulnic_preload.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// `sockcheck`, built once.
fn sockcheck() -> &'static Path {
    static BIN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &BIN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("sockcheck");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/sockcheck.c");
        let out = Command::new("gcc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror"])
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (dir, exe)
    })
    .1
}

/// A device with `nodes` nodes of 256 endpoints each.
fn device(nodes: u32) -> (tempfile::TempDir, Device) {
    let dir = tempfile::tempdir().unwrap();
    let config = Configuration::builder(Configuration::socket_paths(dir.path(), nodes))
        .max_endpoints(256)
        .build()
        .unwrap();
    // The device goes first when the pair is dropped (its sockets must
    // still exist to wake its node threads).
    (dir, Device::start(config).unwrap())
}

/// `prog args` on node `node`, under the layer.
fn on(dev: &Device, node: usize, prog: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_PRELOAD", preload())
        .env("ULNIC_INET", INET)
        .env("ULNIC_SOCKET", &dev.sockets()[node])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A running program and its output lines.
struct Running {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Running {
    fn start(mut c: Command) -> Running {
        let mut child = c.spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap());
        Running { child, lines }
    }

    /// The next line of output (empty at its end).
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.lines.read_line(&mut l).unwrap();
        l
    }

    /// Waits for the line `want` (the program's readiness).
    fn expect(&mut self, want: &str) {
        let l = self.line();
        assert_eq!(l.trim(), want, "the program said {l:?}");
    }

    /// The rest of the output once the program ends, within `limit`;
    /// with its status.
    fn finish(mut self, limit: Duration) -> (String, bool) {
        let deadline = Instant::now() + limit;
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let out = self.child.wait_with_output().unwrap();
                panic!(
                    "still running after {limit:?} (hung); stderr: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut rest = String::new();
        while let Ok(n) = self.lines.read_line(&mut rest) {
            if n == 0 {
                break;
            }
        }
        let out = self.child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        (rest + &err, out.status.success())
    }
}

fn ok(r: Running, limit: Duration) -> String {
    let (out, success) = r.finish(limit);
    assert!(success && out.contains("ok "), "{out}");
    out
}

#[test]
fn a_stream_of_megabytes_in_odd_writes_comes_back_intact() {
    let (_dir, dev) = device(2);
    let mut srv = Running::start(on(&dev, 1, sockcheck(), &["serve", "7100"]));
    srv.expect("ready");
    let cli = Running::start(on(
        &dev,
        0,
        sockcheck(),
        &["stream", "10.81.0.2", "7100", "3000000"],
    ));
    let out = ok(cli, Duration::from_secs(60));
    assert!(out.contains("ok 3000000 bytes echoed intact"), "{out}");
    let out = ok(srv, Duration::from_secs(10));
    assert!(out.contains("ok served 3000000 bytes"), "{out}");
}

#[test]
fn datagrams_of_every_size_to_1500_come_back_from_the_right_address() {
    let (_dir, dev) = device(2);
    let mut srv = Running::start(on(&dev, 1, sockcheck(), &["udp-echo", "7200", "300"]));
    srv.expect("ready");
    let cli = Running::start(on(
        &dev,
        0,
        sockcheck(),
        &["udp", "10.81.0.2", "7200", "300"],
    ));
    let out = ok(cli, Duration::from_secs(60));
    assert!(
        out.contains("300 datagrams echoed intact from 10.81.0.2:7200"),
        "{out}"
    );
    ok(srv, Duration::from_secs(10));
}

#[test]
fn one_epoll_set_holds_a_ulnic_socket_a_pipe_and_a_kernel_socket() {
    let (_dir, dev) = device(2);
    let mut srv = Running::start(on(&dev, 1, sockcheck(), &["serve", "7300"]));
    srv.expect("ready");
    let cli = Running::start(on(&dev, 0, sockcheck(), &["epoll", "10.81.0.2", "7300"]));
    let out = ok(cli, Duration::from_secs(60));
    assert!(out.contains("each woke the set alone"), "{out}");
}

#[test]
fn a_forked_child_can_close_or_use_an_inherited_connection() {
    let (_dir, dev) = device(2);
    for (port, mode, said, echoed) in [
        (
            "7400",
            "fork-child-closes",
            "the parent's connection went on",
            "served 6 bytes",
        ),
        (
            "7401",
            "fork-child-uses",
            "the parent's copy said EBUSY",
            "served 5 bytes",
        ),
    ] {
        let mut srv = Running::start(on(&dev, 1, sockcheck(), &["serve", port]));
        srv.expect("ready");
        let cli = Running::start(on(&dev, 0, sockcheck(), &[mode, "10.81.0.2", port]));
        let out = ok(cli, Duration::from_secs(60));
        assert!(out.contains(said), "{out}");
        let out = ok(srv, Duration::from_secs(10));
        assert!(out.contains(echoed), "{mode}: {out}");
    }
}

#[test]
fn exec_keeps_the_layer_when_the_environment_is_emptied() {
    let (_dir, dev) = device(1);
    let exe = sockcheck().to_str().unwrap().to_string();
    let r = Running::start(on(&dev, 0, sockcheck(), &["exec"]));
    let out = ok(r, Duration::from_secs(10));
    assert!(out.contains("loaded"), "{out}");
    // Without the layer, the same program says so (the check can fail).
    let out = Command::new(&exe).arg("loaded").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "not loaded");
}

#[test]
fn a_writer_killed_mid_stream_ends_the_readers_stream_after_intact_bytes() {
    let (_dir, dev) = device(2);
    let mut sink = Running::start(on(&dev, 1, sockcheck(), &["sink", "7500"]));
    sink.expect("ready");
    let mut src = Running::start(on(&dev, 0, sockcheck(), &["source", "10.81.0.2", "7500"]));
    src.expect("connected");
    sink.expect("connected");
    std::thread::sleep(Duration::from_millis(300));
    src.child.kill().unwrap(); // SIGKILL: only the device speaks for it now
    let _ = src.child.wait();
    let out = ok(sink, Duration::from_secs(15));
    assert!(
        out.contains("then Connection reset by peer") || out.contains("then end of stream"),
        "{out}"
    );
    let n: u64 = out.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(n > 0, "nothing was read before the kill: {out}");
}

#[test]
fn a_reader_killed_mid_stream_ends_the_writers_writes() {
    let (_dir, dev) = device(2);
    let mut sink = Running::start(on(&dev, 1, sockcheck(), &["sink", "7600"]));
    sink.expect("ready");
    let mut src = Running::start(on(&dev, 0, sockcheck(), &["source", "10.81.0.2", "7600"]));
    src.expect("connected");
    sink.expect("connected");
    std::thread::sleep(Duration::from_millis(300));
    sink.child.kill().unwrap();
    let _ = sink.child.wait();
    let out = ok(src, Duration::from_secs(15));
    assert!(
        out.contains("then Broken pipe") || out.contains("then Connection reset by peer"),
        "{out}"
    );
}

#[test]
fn addresses_outside_the_network_stay_with_the_kernel() {
    let (_dir, dev) = device(2);
    let mut srv = Running::start(on(&dev, 1, sockcheck(), &["serve", "7700"]));
    srv.expect("ready");
    // 127.0.0.1 is the kernel's: the listener bound to any address takes
    // the kernel connection beside its ulnic side.
    let cli = Running::start(on(
        &dev,
        0,
        sockcheck(),
        &["stream", "127.0.0.1", "7700", "200000"],
    ));
    let out = ok(cli, Duration::from_secs(60));
    assert!(out.contains("ok 200000 bytes echoed intact"), "{out}");
    ok(srv, Duration::from_secs(10));
}

/// A Debian program the test command installs.
fn debian(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(p.exists(), "{name} is missing: ci/test.sh installs it (apt-get install redis-server redis-tools iperf3 sockperf)");
    p
}

#[test]
fn unmodified_redis_iperf3_and_sockperf_run_over_ulnic() {
    let (dir, dev) = device(4);
    // redis: server on node 1, benchmark on node 0.
    let mut c = on(
        &dev,
        1,
        &debian("redis-server"),
        &[
            "--port",
            "6390",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
        ],
    );
    c.arg(dir.path());
    let mut redis = Running::start(c);
    // redis-benchmark spins for ever when its server is not up yet (over
    // the kernel's TCP too): start it only once the server says so.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !redis.line().contains("Ready to accept connections") {
        assert!(Instant::now() < deadline, "redis-server did not start");
    }
    let out = on(
        &dev,
        0,
        &debian("redis-benchmark"),
        &[
            "-h",
            "10.81.0.2",
            "-p",
            "6390",
            "-t",
            "set,get",
            "-n",
            "2000",
            "-q",
        ],
    )
    .output()
    .unwrap();
    let bench = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    assert!(
        bench.contains("SET:") && bench.contains("GET:") && bench.contains("requests per second"),
        "{bench}"
    );
    redis.child.kill().unwrap();
    let _ = redis.child.wait();
    // iperf3: one test, then the server ends by itself.
    let srv = Running::start(on(&dev, 3, &debian("iperf3"), &["-s", "-1", "-p", "5290"]));
    let mut client = None;
    for _ in 0..50 {
        let out = on(
            &dev,
            2,
            &debian("iperf3"),
            &["-c", "10.81.0.4", "-p", "5290", "-t", "1"],
        )
        .output()
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            client = Some(text);
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let client = client.expect("iperf3 never connected");
    assert!(
        client.contains("sender") && client.contains("receiver") && client.contains("iperf Done"),
        "{client}"
    );
    let (out, success) = srv.finish(Duration::from_secs(20));
    assert!(success, "{out}");
    // sockperf: UDP ping-pong.
    let mut srv = Running::start(on(
        &dev,
        1,
        &debian("sockperf"),
        &["server", "-i", "10.81.0.2", "-p", "11190"],
    ));
    let mut pong = String::new();
    for _ in 0..50 {
        let out = on(
            &dev,
            0,
            &debian("sockperf"),
            &["ping-pong", "-i", "10.81.0.2", "-p", "11190", "-t", "1"],
        )
        .output()
        .unwrap();
        pong = String::from_utf8_lossy(&out.stdout).to_string();
        if pong.contains("Summary: Latency is") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        pong.contains("Summary: Latency is") && pong.contains("percentile 50"),
        "{pong}"
    );
    srv.child.kill().unwrap();
    let _ = srv.child.wait();
}
