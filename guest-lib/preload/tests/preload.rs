//! The preload layer under real programs that know nothing of ulnic:
//! `tests/progs/sockcheck.c` (built here with gcc) and Debian's
//! redis-server, redis-benchmark, iperf3 and sockperf, as separate
//! processes attached to nodes of a device, with
//! `LD_PRELOAD=libulnic_preload.so`. Bytes arrive intact and in order;
//! a killed peer ends reads with end of stream or ECONNRESET and writes
//! with EPIPE, never a hang; one epoll set mixes ulnic and kernel
//! descriptors; fork and exec keep working.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ulnic::sock::{DGRAM_BASE, LISTEN_BASE};
use ulnic_device::Device;
use ulnic_testkit::{stat, wait_bound, wait_for, TestChild, TestDevice};

const INET: &str = "10.81.0.0/24";
const MIB: u64 = 1 << 20;

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
    ulnic_testkit::c_program(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/sockcheck.c"))
}

/// A device with `nodes` nodes of 256 endpoints each.
fn device(nodes: u32) -> TestDevice {
    ulnic_testkit::device_with(nodes, |b| b.max_endpoints(256))
}

/// `prog args` on node `node`, under the layer.
fn on(dev: &Device, node: usize, prog: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_PRELOAD", preload())
        .env("ULNIC_INET", INET)
        .env("ULNIC_SOCKET", &dev.sockets()[node])
        // Each process says at exit how its waits ended: no wake-up may
        // have been found by timer (docs/sockets.md §6).
        .env("ULNIC_STATS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Starts `prog args` on node `node` under the layer: a child killed when
/// the test drops it, its output drained as it comes.
fn start(dev: &Device, node: usize, prog: &Path, args: &[&str]) -> TestChild {
    let name = format!(
        "{} {}",
        prog.file_name().unwrap().to_string_lossy(),
        args.join(" ")
    );
    TestChild::spawn(&name, &mut on(dev, node, prog, args))
}

/// How long a program may take to say it is ready.
const READY: Duration = Duration::from_secs(20);

/// Its output (stdout, then stderr) once it ended within `limit` (killed
/// past it), and whether it succeeded.
fn finish(r: TestChild, limit: Duration) -> (String, bool) {
    let out = r.finish(limit);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    no_wakeup_found_by_timer(&text);
    (text, out.status.success())
}

/// Fails if a process of the layer reported a wake-up found by timer (a
/// lost one) in its `ULNIC_STATS` line.
fn no_wakeup_found_by_timer(text: &str) {
    for l in text.lines().filter(|l| l.contains("wakes pid")) {
        assert!(
            l.contains("found_by_timer 0 "),
            "a lost wake-up: {l}\n{text}"
        );
    }
}

/// N of the program's "ok read N ..." or "ok wrote N ..." line.
fn ok_count(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("ok "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in the ok line: {out}"))
}

fn ok(r: TestChild, limit: Duration) -> String {
    let (out, success) = finish(r, limit);
    assert!(success && out.contains("ok "), "{out}");
    out
}

/// Waits until the connection endpoint on node `node` has received at
/// least `bytes` bytes of stream: the stream is flowing.
fn until_received(dev: &Device, node: usize, bytes: u64) {
    wait_for(
        Duration::from_secs(20),
        &format!("{bytes} bytes into node {node}"),
        || {
            dev.snapshot().nodes[node]
                .endpoints
                .iter()
                .map(|e| stat(e, "rx_bytes"))
                .max()
                .unwrap_or(0)
        },
        |got| *got >= bytes,
    );
}

#[test]
fn a_stream_of_megabytes_in_odd_writes_comes_back_intact() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["serve", "7100"]);
    srv.expect_line("ready", READY);
    let cli = start(
        &dev,
        0,
        sockcheck(),
        &["stream", "10.81.0.2", "7100", "3000000"],
    );
    let out = ok(cli, Duration::from_secs(60));
    assert!(out.contains("ok 3000000 bytes echoed intact"), "{out}");
    let out = ok(srv, Duration::from_secs(10));
    assert!(out.contains("ok served 3000000 bytes"), "{out}");
}

#[test]
fn datagrams_of_every_size_to_1500_come_back_from_the_right_address() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["udp-echo", "7200", "300"]);
    srv.expect_line("ready", READY);
    let cli = start(&dev, 0, sockcheck(), &["udp", "10.81.0.2", "7200", "300"]);
    let out = ok(cli, Duration::from_secs(60));
    assert!(
        out.contains("300 datagrams echoed intact from 10.81.0.2:7200"),
        "{out}"
    );
    ok(srv, Duration::from_secs(10));
}

#[test]
fn one_epoll_set_holds_a_ulnic_socket_a_pipe_and_a_kernel_socket() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["serve", "7300"]);
    srv.expect_line("ready", READY);
    let cli = start(&dev, 0, sockcheck(), &["epoll", "10.81.0.2", "7300"]);
    let out = ok(cli, Duration::from_secs(60));
    assert!(out.contains("each woke the set alone"), "{out}");
}

#[test]
fn a_socket_taken_out_of_its_epoll_set_and_put_back_wakes_for_its_reply() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["serve", "7310"]);
    srv.expect_line("ready", READY);
    let cli = start(&dev, 0, sockcheck(), &["epoll-readd", "10.81.0.2", "7310"]);
    let out = ok(cli, Duration::from_secs(120));
    assert!(out.contains("each woke for the reply"), "{out}");
}

/// An event-driven server that sleeps in epoll with no timeout (as
/// lighttpd does between its ticks) wakes for every connection's
/// request: under host attach the set must also sleep on the
/// attachment's notification descriptor, which feeds the watcher (the
/// watcher made before anything was watched once left it out, and each
/// request waited for the server's next tick).
#[test]
fn an_epoll_server_without_timeouts_wakes_for_every_request() {
    let dev = device(2);
    let prog = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/epoll_accept.py");
    let python = Path::new("/usr/bin/python3");
    let p = prog.to_str().unwrap();
    let mut srv = start(&dev, 1, python, &[p, "serve", "7320", "20"]);
    srv.expect_line("ready", READY);
    let cli = start(&dev, 0, python, &[p, "fetch", "10.81.0.2", "7320", "20"]);
    let (out, success) = finish(cli, Duration::from_secs(120));
    assert!(success && out.contains("fetched 20"), "{out}");
    let (out, success) = finish(srv, Duration::from_secs(30));
    assert!(success && out.contains("served 20"), "{out}");
}

/// `TCP_INFO` reports a ulnic socket's own state (it reported the
/// unconnected kernel body's, CLOSE, before): LISTEN, ESTABLISHED, and
/// CLOSE once both ends ended; the same program over the kernel passes too.
#[test]
fn tcp_info_reports_a_ulnic_sockets_own_state() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["serve", "7320"]);
    srv.expect_line("ready", READY);
    let cli = start(&dev, 0, sockcheck(), &["tcp-info", "10.81.0.2", "7320"]);
    let out = ok(cli, Duration::from_secs(60));
    assert!(
        out.contains("ok tcp states: LISTEN, ESTABLISHED, then CLOSE"),
        "{out}"
    );
    ok(srv, Duration::from_secs(10));
}

#[test]
fn a_forked_child_can_close_or_use_an_inherited_connection() {
    let dev = device(2);
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
        let mut srv = start(&dev, 1, sockcheck(), &["serve", port]);
        srv.expect_line("ready", READY);
        let cli = start(&dev, 0, sockcheck(), &[mode, "10.81.0.2", port]);
        let out = ok(cli, Duration::from_secs(60));
        assert!(out.contains(said), "{out}");
        let out = ok(srv, Duration::from_secs(10));
        assert!(out.contains(echoed), "{mode}: {out}");
    }
}

/// sendfile (with and without an offset) and splice from a pipe send a
/// file's bytes over a ulnic connection, and splice into a pipe takes
/// them back: 3 MB and a byte, checked, with the file position and the
/// offset moved by exactly what was sent. Before the layer carried them,
/// these reached the unconnected kernel socket and failed (the test fails
/// so: "fail sendfile with an offset").
#[test]
fn sendfile_and_splice_move_a_files_bytes_over_a_connection() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["serve", "7403"]);
    srv.expect_line("ready", READY);
    let cli = start(
        &dev,
        0,
        sockcheck(),
        &["zero-copy", "10.81.0.2", "7403", "3000001"],
    );
    let out = ok(cli, Duration::from_secs(60));
    assert!(out.contains("ok zero-copy 3000001 bytes"), "{out}");
    let out = ok(srv, Duration::from_secs(10));
    // (10.81.0.2 is no kernel address here: only ulnic reaches it.)
    assert!(out.contains("served 3000001 bytes"), "{out}");
}

/// A pre-forking server on a host port: the forked child of a
/// host-attached process cannot attach to the device again, so it cannot
/// make the connection's endpoint; its accept fails with EOPNOTSUPP and
/// says why, rather than building the connection on the parent's
/// attachment (which the parent's own state would contradict: the client
/// saw a reset, and in guests workers crashed).
#[test]
fn a_forked_child_of_a_host_attached_server_cannot_accept_and_says_why() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["serve-in-child", "7402"]);
    srv.expect_line("ready", READY);
    let cli = start(
        &dev,
        0,
        sockcheck(),
        &["stream", "10.81.0.2", "7402", "1000"],
    );
    let (out, _) = finish(srv, Duration::from_secs(30));
    assert!(
        out.contains("fail accept: Operation not supported"),
        "{out}"
    );
    assert!(out.contains("the child exited with 1"), "{out}");
    assert!(out.contains("cannot attach to the device again"), "{out}");
    drop(cli);
}

#[test]
fn exec_keeps_the_layer_when_the_environment_is_emptied() {
    let dev = device(1);
    let exe = sockcheck().to_str().unwrap().to_string();
    let r = start(&dev, 0, sockcheck(), &["exec"]);
    let out = ok(r, Duration::from_secs(10));
    assert!(out.contains("loaded"), "{out}");
    // Without the layer, the same program says so (the check can fail).
    let out = Command::new(&exe).arg("loaded").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "not loaded");
}

#[test]
fn a_writer_killed_mid_stream_ends_the_readers_stream_after_intact_bytes() {
    let dev = device(2);
    let mut sink = start(&dev, 1, sockcheck(), &["sink", "7500"]);
    sink.expect_line("ready", READY);
    let mut src = start(&dev, 0, sockcheck(), &["source", "10.81.0.2", "7500"]);
    src.expect_line("connected", READY);
    sink.expect_line("connected", READY);
    // Mid-stream: the reader's connection has taken a MiB.
    until_received(&dev, 1, MIB);
    src.kill(); // SIGKILL: only the device speaks for it now
    let out = ok(sink, Duration::from_secs(15));
    assert!(
        out.contains("then Connection reset by peer") || out.contains("then end of stream"),
        "{out}"
    );
    // What reached its connection before the kill is read before the end.
    let n = ok_count(&out);
    assert!(n >= MIB, "only {n} bytes were read before the end: {out}");
}

#[test]
fn a_reader_killed_mid_stream_ends_the_writers_writes() {
    let dev = device(2);
    let mut sink = start(&dev, 1, sockcheck(), &["sink", "7600"]);
    sink.expect_line("ready", READY);
    let mut src = start(&dev, 0, sockcheck(), &["source", "10.81.0.2", "7600"]);
    src.expect_line("connected", READY);
    sink.expect_line("connected", READY);
    // Mid-stream: the reader's connection has taken a MiB.
    until_received(&dev, 1, MIB);
    sink.kill();
    let out = ok(src, Duration::from_secs(15));
    assert!(
        out.contains("then Broken pipe") || out.contains("then Connection reset by peer"),
        "{out}"
    );
    // It wrote at least what arrived.
    let n = ok_count(&out);
    assert!(n >= MIB, "only {n} bytes written: {out}");
}

#[test]
fn addresses_outside_the_network_stay_with_the_kernel() {
    let dev = device(2);
    let mut srv = start(&dev, 1, sockcheck(), &["serve", "7700"]);
    srv.expect_line("ready", READY);
    // 127.0.0.1 is the kernel's: the listener bound to any address takes
    // the kernel connection beside its ulnic side.
    let cli = start(
        &dev,
        0,
        sockcheck(),
        &["stream", "127.0.0.1", "7700", "200000"],
    );
    let out = ok(cli, Duration::from_secs(60));
    assert!(out.contains("ok 200000 bytes echoed intact"), "{out}");
    ok(srv, Duration::from_secs(10));
}

/// A Debian program the test command installs.
/// Event libraries and runtimes as their users run them: a libevent
/// echo pair (bufferevents; `tests/progs/evecho.c`, linked statically
/// with libevent_core), Python asyncio's echo pair and a Node.js HTTP
/// pair, each server on node 1 and client on node 0, every byte checked
/// by the programs themselves.
#[test]
fn libevent_asyncio_and_node_pairs_exchange_checked_bytes() {
    let dev = device(2);
    let progs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs");
    let evecho = ulnic_testkit::c_program_with(
        &progs.join("evecho.c"),
        &["-Wl,-Bstatic", "-levent_core", "-Wl,-Bdynamic"],
    );
    let asyncio = progs.join("asyncio_echo.py");
    let asyncio = asyncio.to_str().unwrap();
    let node = progs.join("node_http.js");
    let node = node.to_str().unwrap();
    let pairs: [(&Path, Vec<&str>, Vec<&str>); 3] = [
        (
            evecho,
            vec!["server", "7130", "20"],
            vec!["client", "10.81.0.2", "7130", "20", "200000"],
        ),
        (
            Path::new("python3"),
            vec![asyncio, "server", "7131", "30"],
            vec![asyncio, "client", "10.81.0.2", "7131", "30"],
        ),
        (
            Path::new("node"),
            vec![node, "server", "7132", "40"],
            vec![node, "client", "10.81.0.2", "7132", "40"],
        ),
    ];
    for (prog, server, client) in pairs {
        let mut srv = start(&dev, 1, prog, &server);
        srv.expect_line("ready", READY);
        let cli = ok(start(&dev, 0, prog, &client), Duration::from_secs(60));
        let srv = ok(srv, Duration::from_secs(20));
        eprintln!(
            "{} | {}",
            cli.trim(),
            srv.lines().last().unwrap_or_default()
        );
    }
}

fn debian(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(p.exists(), "{name} is missing: ci/test.sh installs it (apt-get install redis-server redis-tools iperf3 sockperf)");
    p
}

#[test]
fn unmodified_redis_iperf3_and_sockperf_run_over_ulnic() {
    let dev = device(4);
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
    c.arg(dev.dir.path());
    let mut redis = TestChild::spawn("redis-server", &mut c);
    // redis-benchmark spins for ever when its server is not up yet (over
    // the kernel's TCP too): start it only once the server says so.
    redis.expect_line("Ready to accept connections", READY);
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
    no_wakeup_found_by_timer(&String::from_utf8_lossy(&out.stderr));
    let bench = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    assert!(
        bench.contains("SET:") && bench.contains("GET:") && bench.contains("requests per second"),
        "{bench}"
    );
    redis.kill();
    // iperf3: one test, then the server ends by itself. The client runs
    // once its listener (the layer's endpoint on LISTEN_BASE + port,
    // docs/sockets.md) is bound on node 3.
    let srv = start(&dev, 3, &debian("iperf3"), &["-s", "-1", "-p", "5290"]);
    wait_bound(&dev, 3, LISTEN_BASE + 5290, READY);
    let out = on(
        &dev,
        2,
        &debian("iperf3"),
        &["-c", "10.81.0.4", "-p", "5290", "-t", "1"],
    )
    .output()
    .unwrap();
    no_wakeup_found_by_timer(&String::from_utf8_lossy(&out.stderr));
    let client = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && client.contains("sender")
            && client.contains("receiver")
            && client.contains("iperf Done"),
        "{client}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (out, success) = finish(srv, Duration::from_secs(20));
    assert!(success, "{out}");
    // sockperf: UDP ping-pong, once the server's datagram socket (the
    // layer's endpoint on DGRAM_BASE + port) is bound on node 1.
    let _srv = start(
        &dev,
        1,
        &debian("sockperf"),
        &["server", "-i", "10.81.0.2", "-p", "11190"],
    );
    wait_bound(&dev, 1, DGRAM_BASE + 11190, READY);
    let out = on(
        &dev,
        0,
        &debian("sockperf"),
        &["ping-pong", "-i", "10.81.0.2", "-p", "11190", "-t", "1"],
    )
    .output()
    .unwrap();
    let pong = String::from_utf8_lossy(&out.stdout);
    assert!(
        pong.contains("Summary: Latency is") && pong.contains("percentile 50"),
        "{pong}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
