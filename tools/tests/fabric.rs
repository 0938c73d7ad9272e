//! `ulnic fabric routes` on the example topologies in docs/topologies:
//! they stay valid, and every node reaches every other.

use std::process::Command;

mod cli;

fn routes(file: &str) -> Vec<serde_json::Value> {
    let path = format!("{}/../docs/topologies/{file}", env!("CARGO_MANIFEST_DIR"));
    cli::json_lines(&["fabric", "routes", "--topology", &path, "--json"])
}

#[test]
fn example_topologies_route_every_pair() {
    let two = routes("two-switches.toml");
    assert_eq!(two.len(), 4 * 3);
    let cross = two.iter().find(|r| r["src"] == 1 && r["dst"] == 2).unwrap();
    assert_eq!(cross["switches"], serde_json::json!(["left", "right"]));
    let ring = routes("ring.toml");
    assert_eq!(ring.len(), 4 * 3);
    // Neighbours on the ring are one trunk apart; the pair opposite the
    // root (s2, s3 side) may go round through it, never further than 3.
    for r in &ring {
        let hops = r["switches"].as_array().unwrap().len();
        assert!((2..=4).contains(&hops), "{r}");
    }
}

#[test]
fn a_bad_topology_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "nodes = 2\n[[switch]]\nname = \"a\"\n[[attach]]\nnodes = [0]\nswitch = \"a\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ulnic"))
        .args(["fabric", "routes", "--topology"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("node 1 hangs on 0 links"), "{err}");
}

fn selftest(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["fabric", "selftest", "--json"];
    args.extend_from_slice(extra);
    let mut lines = cli::json_lines(&args);
    assert_eq!(lines.len(), 1);
    lines.remove(0)
}

fn assert_exactly_once_in_order(r: &serde_json::Value) {
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["duplicated"], 0, "{r}");
    assert_eq!(r["out_of_order"], 0, "{r}");
}

#[test]
fn the_transport_delivers_everything_once_and_in_order_through_every_fault() {
    let r = selftest(&[
        "--nodes",
        "4",
        "--messages",
        "40000",
        "--drop",
        "0.05",
        "--corrupt",
        "0.01",
        "--duplicate",
        "0.01",
        "--reorder",
        "0.05",
        "--seed",
        "3",
    ]);
    assert_exactly_once_in_order(&r);
    assert_eq!(r["delivered"], r["sent"], "{r}");
    assert_eq!(r["sent"], 40000);
    // The faults really happened, and the transport really worked.
    for k in [
        "packets_dropped",
        "packets_corrupted",
        "crc_errors",
        "packets_duplicated",
        "packets_reordered",
        "retransmissions",
        "timeouts",
        "duplicates_dropped",
    ] {
        assert!(r[k].as_u64().unwrap() > 0, "{k} is 0: {r}");
    }
}

#[test]
fn a_partition_that_heals_loses_nothing() {
    let r = selftest(&[
        "--nodes",
        "4",
        "--messages",
        "20000",
        "--partition-ms",
        "5:150",
        "--drop",
        "0.01",
    ]);
    assert_exactly_once_in_order(&r);
    assert_eq!(r["delivered"], r["sent"], "{r}");
    assert_eq!(r["returned"], 0, "{r}");
    assert!(
        r["timeouts"].as_u64().unwrap() > 0,
        "the partition never bit: {r}"
    );
}

#[test]
fn a_permanent_partition_gives_senders_their_messages_back() {
    let r = selftest(&[
        "--nodes",
        "3",
        "--messages",
        "6000",
        "--partition-ms",
        "0:600000",
    ]);
    assert_exactly_once_in_order(&r);
    // Node 1 is cut off from the start: what it sent and what was sent to
    // it all comes back; the rest (node 0 <-> node 2) is delivered.
    let (sent, delivered, returned) = (
        r["sent"].as_u64().unwrap(),
        r["delivered"].as_u64().unwrap(),
        r["returned"].as_u64().unwrap(),
    );
    assert_eq!(sent, delivered + returned, "{r}");
    assert!(returned >= 2000, "{r}");
}

/// A `ulnic device` child process, killed when dropped.
struct DeviceProcess(std::process::Child);

impl Drop for DeviceProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ulnic() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ulnic"))
}

fn wait_for(path: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `ulnic send` from node 0 to `ulnic recv` on node 2 port 5 of the
/// device in `dir`: `count` checked messages of `size` bytes; what the
/// sender said. Panics unless both succeed.
fn checked_stream(dir: &std::path::Path, count: u32, size: u32) -> String {
    use std::process::Stdio;
    let recv = ulnic()
        .args(["recv", "--port", "5"])
        .env("ULNIC_SOCKET", dir.join("node2.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let sent = ulnic()
        .args(["send", "--to", "2:5"])
        .args(["--count", &count.to_string(), "--size", &size.to_string()])
        .env("ULNIC_SOCKET", dir.join("node0.sock"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&sent.stdout),
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(sent.status.success(), "{said}");
    let got = recv.wait_with_output().unwrap();
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    said
}

/// `ulnic device` of four nodes on `docs/topologies/NAME`, sockets in
/// `dir`, once its control socket is there.
fn device_on(name: &str, dir: &std::path::Path) -> DeviceProcess {
    let topo = format!("{}/../docs/topologies/{name}", env!("CARGO_MANIFEST_DIR"));
    let dev = DeviceProcess(
        ulnic()
            .args([
                "device",
                "--nodes",
                "4",
                "--topology",
                &topo,
                "--socket-dir",
            ])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&dir.join("control.sock"));
    dev
}

#[test]
fn a_running_device_reports_counters_takes_faults_and_captures_packets() {
    use std::io::BufRead;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let _dev = device_on("two-switches.toml", d);
    let dev_arg = d.to_str().unwrap();

    // A capture of node 0's link, ready before traffic starts.
    let pcap = d.join("node0.pcap");
    let mut capture = ulnic()
        .args([
            "capture", "--device", dev_arg, "--node", "0", "--count", "40", "-o",
        ])
        .arg(&pcap)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut cap_err = std::io::BufReader::new(capture.stderr.take().unwrap());
    let mut first = String::new();
    cap_err.read_line(&mut first).unwrap();
    assert!(first.contains("capturing to"), "{first}");

    checked_stream(d, 2000, 5000);
    assert!(capture.wait().unwrap().success());

    // The counters: 5000-byte messages at a 4096-byte MTU are two packets.
    let stats = &cli::json_lines(&["stats", "--device", dev_arg, "--json"])[0];
    let node0_link = &stats["links"][1];
    assert_eq!(node0_link["name"], "node 0");
    assert!(
        node0_link["directions"][0]["packets"].as_u64().unwrap() >= 4000,
        "{node0_link}"
    );
    assert!(
        stats["nodes"][0]["transport"]["messages_sent"]
            .as_u64()
            .unwrap()
            >= 2000
    );
    assert!(
        stats["switches"][0]["forwarded"].as_u64().unwrap() > 0,
        "left forwarded nothing"
    );

    // The capture reads back through the Wireshark dissector.
    let lua = format!(
        "lua_script:{}/wireshark/ulnic.lua",
        env!("CARGO_MANIFEST_DIR")
    );
    let fields = Command::new("tshark")
        .args([
            "-X",
            &lua,
            "-T",
            "fields",
            "-e",
            "ulnic.kind",
            "-e",
            "ulnic.src_node",
        ])
        .args([
            "-e",
            "ulnic.dst_node",
            "-e",
            "ulnic.dst_port",
            "-e",
            "ulnic.msg_len",
            "-r",
        ])
        .arg(&pcap)
        .output()
        .expect("tshark (ci/test.sh installs it)");
    let text = String::from_utf8_lossy(&fields.stdout);
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 40, "{text}");
    assert!(
        rows.contains(&"1\t0\t2\t5\t5000"),
        "no DATA 0 -> 2:5 of 5000 bytes: {text}"
    );

    // A partition: node 2 cut off, a sender gets its messages back.
    let set = |args: &[&str]| {
        let mut c = ulnic();
        c.args(["fabric", "set", "--device", dev_arg]).args(args);
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    set(&["--node", "2", "--down"]);
    let stats = &cli::json_lines(&["stats", "--device", dev_arg, "--json"])[0];
    assert_eq!(stats["links"][3]["faults"]["down"], true);
    let cut = ulnic()
        .args(["send", "--to", "2:5", "--count", "10"])
        .env("ULNIC_SOCKET", d.join("node0.sock"))
        .output()
        .unwrap();
    assert!(!cut.status.success());
    let err = String::from_utf8_lossy(&cut.stderr);
    assert!(err.contains("unreachable"), "{err}");
    set(&["--node", "2", "--up"]);
    let stats = &cli::json_lines(&["stats", "--device", dev_arg, "--json"])[0];
    assert_eq!(stats["links"][3]["faults"]["down"], false);
    assert!(stats["nodes"][0]["transport"]["returned"].as_u64().unwrap() >= 1);

    // Mistakes are explained.
    let o = ulnic()
        .args([
            "fabric", "set", "--device", dev_arg, "--link", "99", "--drop", "0.1",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no link 99"));
}

#[test]
fn a_mapped_fabric_finds_itself_and_routes_around_a_cut_link() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let _dev = device_on("mapped-ring.toml", d);
    let dev_arg = d.to_str().unwrap();

    // The mapper finds the ring as the file draws it, and routes by it.
    let map = &cli::json_lines(&["fabric", "map", "--device", dev_arg, "--json"])[0];
    assert_eq!(map["matches_topology"], true, "{map}");
    assert_eq!(map["switches"].as_array().unwrap().len(), 4);
    assert_eq!(map["links"].as_array().unwrap().len(), 4);
    assert_eq!(map["nodes"].as_array().unwrap().len(), 4);
    assert!(map["generation"].as_u64().unwrap() >= 1, "{map}");

    // Node 0 reaches node 2 through s1 (link 1, s1-s2). Cut that link,
    // then stream: the next round routes around by s3, and nothing is
    // returned or lost.
    let o = ulnic()
        .args([
            "fabric", "set", "--device", dev_arg, "--link", "1", "--down",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = checked_stream(d, 5000, 1000);
    assert!(said.contains("0 returned"), "{said}");

    let stats = &cli::json_lines(&["stats", "--device", dev_arg, "--json"])[0];
    let s3_s0 = &stats["links"][3];
    assert_eq!(s3_s0["name"], "s3-s0");
    assert!(
        s3_s0["directions"][1]["bytes"].as_u64().unwrap() >= 5_000_000,
        "the stream did not go round by s3: {s3_s0}"
    );
    assert_eq!(stats["nodes"][0]["transport"]["returned"], 0);

    // The map now lacks the cut link, and says so with exit status 3.
    let o = ulnic()
        .args(["fabric", "map", "--device", dev_arg, "--json"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    let map: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        map["differences"],
        serde_json::json!(["missing: link s1:1 - s2:0"]),
        "{map}"
    );
    assert!(map["generation"].as_u64().unwrap() >= 2, "{map}");
}

#[test]
fn the_fabric_benchmarks_report_what_they_measured() {
    // Invariants only: no test asserts on timing.
    let drain = cli::json_lines(&[
        "fabric",
        "bench",
        "drain",
        "--engine-threads",
        "1,2",
        "--rounds",
        "2",
        "--messages",
        "500",
        "--json",
    ]);
    assert_eq!(drain.len(), 2, "{drain:?}");
    for (d, k) in drain.iter().zip([1, 2]) {
        assert_eq!(d["engine_threads"], k);
        assert_eq!(d["messages"], 1000);
        assert_eq!(d["rounds"].as_array().unwrap().len(), 2);
        assert!(d["speedup"].as_f64().unwrap() > 0.0, "{d}");
    }
    assert_eq!(drain[0]["speedup"], 1.0);
    let link = cli::json_lines(&[
        "fabric",
        "bench",
        "link",
        "--link",
        "1:10",
        "--rounds",
        "1",
        "--iters",
        "50",
        "--seconds",
        "0.1",
        "--json",
    ]);
    assert_eq!(link.len(), 1);
    let l = &link[0];
    assert_eq!(l["configured_gbps"], 1.0);
    assert_eq!(l["payload"], "none");
    assert!(l["achieved_gbps"].as_f64().unwrap() > 0.0, "{l}");
    assert!(l["link_rtt_us"].as_f64().unwrap() > 0.0, "{l}");
    let c = l["configured_one_way_us"].as_f64().unwrap();
    assert!(
        (c - 10.592).abs() < 0.01,
        "10 us plus 74 bytes at 1 Gb/s: {l}"
    );

    let logp = cli::json_lines(&[
        "fabric",
        "bench",
        "logp",
        "--iters",
        "100",
        "--seconds",
        "0.1",
        "--json",
    ]);
    assert_eq!(logp.len(), 2, "{logp:?}");
    for r in &logp {
        for k in ["o_s_us", "o_r_us", "g_us", "rtt_us"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
        }
    }

    let perm = cli::json_lines(&[
        "fabric",
        "bench",
        "permutation",
        "--seconds",
        "0.1",
        "--json",
    ]);
    assert_eq!(perm.len(), 2, "{perm:?}");
    for r in &perm {
        let per = r["per_stream_mbytes_per_s"].as_array().unwrap();
        assert_eq!(per.len(), 4, "{r}");
        let sum: f64 = per.iter().map(|x| x.as_f64().unwrap()).sum();
        let agg = r["aggregate_mbytes_per_s"].as_f64().unwrap();
        assert!((sum - agg).abs() < 1e-6 && agg > 0.0, "{r}");
    }

    let hot = cli::json_lines(&[
        "fabric",
        "bench",
        "hotspot",
        "--clients",
        "1,4",
        "--seconds",
        "0.1",
        "--json",
    ]);
    assert_eq!(hot.len(), 2);
    for (h, n) in hot.iter().zip([1usize, 4]) {
        let shares = h["shares"].as_array().unwrap();
        assert_eq!(shares.len(), n, "{h}");
        let sum: f64 = shares.iter().map(|s| s.as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-9, "shares sum to {sum}: {h}");
        assert!(h["aggregate_per_s"].as_f64().unwrap() > 0.0, "{h}");
    }
}
