//! A fabric spread over two device processes in two network namespaces,
//! joined by a veth pair (spec §10.7): `ulnic bench` ping-pong and stream
//! between a node of each; datagrams from a stranger and from a device
//! with the wrong key are dropped and counted. Needs root (ip netns), as
//! CI has.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cli;

fn ulnic() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ulnic"))
}

fn ip(args: &[&str]) {
    let o = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Two namespaces joined by a veth pair, removed when dropped.
struct Namespaces {
    names: [String; 2],
    addrs: [String; 2],
}

impl Namespaces {
    fn new() -> Namespaces {
        let id = std::process::id() % 10_000;
        let names = [format!("ulnic{id}a"), format!("ulnic{id}b")];
        let net = 100 + id % 150;
        let addrs = [format!("10.211.{net}.1"), format!("10.211.{net}.2")];
        let ns = Namespaces { names, addrs };
        let (a, b) = (&ns.names[0], &ns.names[1]);
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        let (va, vb) = (format!("uv{id}a"), format!("uv{id}b"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
        ip(&["link", "set", &va, "netns", a]);
        ip(&["link", "set", &vb, "netns", b]);
        for (n, v, addr) in [(a, &va, &ns.addrs[0]), (b, &vb, &ns.addrs[1])] {
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", v]);
            ip(&["-n", n, "link", "set", v, "up"]);
            ip(&["-n", n, "link", "set", "lo", "up"]);
        }
        ns
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn device_in(ns: &str, dir: &Path, topo: &Path, member: &str, key: &Path) -> Proc {
    let control = dir.join(format!("control-{member}.sock"));
    let _ = std::fs::remove_file(&control); // a previous device's
    let p = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            env!("CARGO_BIN_EXE_ulnic"),
            "device",
            "--nodes",
            "4",
        ])
        .arg("--socket-dir")
        .arg(dir)
        .arg("--topology")
        .arg(topo)
        .args(["--member", member, "--key-file"])
        .arg(key)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !control.exists() {
        assert!(Instant::now() < deadline, "device {member} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Proc(p)
}

fn udp_stats(dir: &Path, member: &str) -> serde_json::Value {
    let d = dir.to_str().unwrap();
    let s = cli::json_lines(&["stats", "--device", d, "--member", member, "--json"]);
    s[0]["udp"].clone()
}

#[test]
fn two_devices_in_two_namespaces_are_one_fabric_and_strangers_are_kept_out() {
    let ns = Namespaces::new();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let topo = dir.join("fabric.toml");
    let base = std::fs::read_to_string(format!(
        "{}/../docs/topologies/two-devices.toml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let text = base
        .replace("127.0.0.1:7301", &format!("{}:7301", ns.addrs[0]))
        .replace("127.0.0.1:7302", &format!("{}:7301", ns.addrs[1]));
    std::fs::write(&topo, text).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, b"a secret of the test fabric, 48 bytes long......").unwrap();
    let mut a = device_in(&ns.names[0], dir, &topo, "a", &key);
    let _b = device_in(&ns.names[1], dir, &topo, "b", &key);
    let d = dir.to_str().unwrap();

    // Node 0 (device a, namespace a) and node 2 (device b, namespace b).
    for (workload, size, iters) in [("pingpong", "8", "500"), ("stream", "65536", "300")] {
        let r = cli::json_lines(&[
            "bench",
            workload,
            "--device-dir",
            d,
            "--nodes",
            "0,2",
            "--transport",
            "ulnic",
            "--size",
            size,
            "--iters",
            iters,
            "--json",
        ]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0]["transport"], "ulnic");
        assert_eq!(r[0]["payload"], "write+verify", "{}", r[0]);
    }
    let before = udp_stats(dir, "b");
    assert!(before["received"].as_u64().unwrap() > 500, "{before}");
    assert_eq!(before["rejected_mac"], 0);

    // A stranger in namespace a sends to device b: not a member.
    let o = Command::new("ip")
        .args(["netns", "exec", &ns.names[0], "bash", "-c"])
        .arg(format!(
            "printf 'ULUDnot a packet at all' > /dev/udp/{}/7301",
            ns.addrs[1]
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Device a replaced by one with another key, at the same address: its
    // datagrams fail the MAC, so a sender through it gets its message back.
    let _ = a.0.kill();
    let _ = a.0.wait();
    let wrong = dir.join("wrong-key");
    std::fs::write(&wrong, b"not the fabric's secret, but long enough").unwrap();
    a = device_in(&ns.names[0], dir, &topo, "a", &wrong);
    let cut = ulnic()
        .args(["send", "--to", "2:5", "--count", "3"])
        .env("ULNIC_SOCKET", dir.join("node0.sock"))
        .output()
        .unwrap();
    assert!(!cut.status.success());
    let err = String::from_utf8_lossy(&cut.stderr);
    assert!(err.contains("unreachable"), "{err}");
    let after = udp_stats(dir, "b");
    assert!(after["rejected_sender"].as_u64().unwrap() >= 1, "{after}");
    assert!(after["rejected_mac"].as_u64().unwrap() >= 1, "{after}");
    drop(a);
}
