//! A fabric spread over two device processes in two network namespaces,
//! joined by a veth pair (spec §10.7): `ulnic bench` ping-pong and stream
//! between a node of each; datagrams from a stranger and from a device
//! with the wrong key are dropped and counted; and `ulnic fabric up`
//! starting the far member through ssh (Debian's sshd, run by the test in
//! the far namespace). Needs root (ip netns), as CI has.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ulnic_testkit::{wait_for, wait_for_path, wait_until, TestChild};

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
        // Tests of this file run at once: each pair gets its own names.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let salt = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = (std::process::id() * 4 + salt) % 10_000;
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

/// `ulnic device` member `member` in namespace `ns`, once its control
/// socket is there; killed when dropped (its stderr printed if the test
/// fails).
fn device_in(ns: &str, dir: &Path, topo: &Path, member: &str, key: &Path) -> TestChild {
    let control = dir.join(format!("control-{member}.sock"));
    let _ = std::fs::remove_file(&control); // a previous device's
    let p = TestChild::spawn(
        &format!("device {member}"),
        Command::new("ip")
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
            .arg(key),
    );
    wait_for_path(&control, Duration::from_secs(20));
    p
}

/// Counter `k` of `v`.
fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("no counter {k}: {v}"))
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
    // PIO windows are memory of one device process: node 0 cannot map
    // node 2's, and is told why.
    let far = ulnic::Nic::attach(&dir.join("node2.sock")).unwrap();
    let near = ulnic::Nic::attach(&dir.join("node0.sock")).unwrap();
    let ep = |nic: &ulnic::Nic| {
        nic.alloc_pd()
            .unwrap()
            .create_endpoint(&Default::default())
            .unwrap()
    };
    // The window's owner reports to an event queue, so the sync below
    // reaches a queue across device processes too.
    let far_pd = far.alloc_pd().unwrap();
    let queue = ulnic::EventQueue::new(&far_pd).unwrap();
    let mut exporter = far_pd.create_endpoint(&Default::default()).unwrap();
    let mut importer = ep(&near);
    let window = exporter.export_pio(4096, None).unwrap();
    let refused = importer.import_pio(window.grant()).unwrap_err();
    assert_eq!(refused.errno(), libc::EOPNOTSUPP, "{refused}");
    assert!(
        refused.to_string().contains("another device process"),
        "{refused}"
    );
    // A sync needs no mapping: it crosses to device b as an access and
    // fires the window's tripwire there.
    let tw = exporter
        .set_pio_tripwire(&window, 0, 4096, false, 9)
        .unwrap();
    queue.attach(&mut exporter, 77).unwrap();
    importer.pio_sync(&window.grant(), 8, 8, 1, true).unwrap();
    let mut reported = Vec::new();
    let t = std::time::Instant::now();
    while reported.is_empty() && t.elapsed() < std::time::Duration::from_secs(10) {
        reported = queue.wait(std::time::Duration::from_secs(1)).unwrap();
    }
    assert_eq!(reported, [77], "the owner's queue got the sync's report");
    let next = |ep: &mut ulnic::Endpoint| {
        let t = std::time::Instant::now();
        loop {
            if let Some(e) = ep.poll_event() {
                return e;
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "no event");
            ep.wait(std::time::Duration::from_millis(100)).unwrap();
        }
    };
    assert_eq!(next(&mut importer), ulnic::Event::SendDone { id: 1 });
    match next(&mut exporter) {
        ulnic::Event::Tripwire { id, user, from, .. } => {
            assert_eq!((id, user, from.node), (tw, 9, 0));
        }
        other => panic!("{other:?}"),
    }
    drop((window, exporter, importer, queue, far_pd, near, far));

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
    let stranger = n(&before, "rejected_sender") + 1;
    wait_for(
        Duration::from_secs(10),
        "device b to reject the stranger's datagram",
        || udp_stats(dir, "b"),
        |s| n(s, "rejected_sender") == stranger,
    );

    // Device a replaced by one with another key, at the same address: its
    // datagrams fail the MAC, so a sender through it gets its message back.
    a.kill();
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
    assert_eq!(n(&after, "rejected_sender"), stranger, "{after}");
    // Every datagram of device a's sends (each of the 3 messages at
    // least once) failed the MAC.
    assert!(n(&after, "rejected_mac") >= 3, "{after}");
    drop(a);
}

/// Whether process `pid` is still there (and not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// An sshd of the test's own in namespace b, on b's address only, that
/// lets in a key made in `dir`; returns it (killed when dropped) and the
/// ssh command that reaches it, once it answers from namespace a.
fn sshd_in_b(ns: &Namespaces, dir: &Path) -> (TestChild, String) {
    let keygen = |name: &str| {
        let o = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(name))
            .output()
            .expect("ssh-keygen (ci/test.sh installs openssh-client)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    keygen("client");
    keygen("host");
    std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys")).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap(); // sshd's privilege separation
    let sshd = |o: &str| format!("-o{o}");
    let server = TestChild::spawn(
        "sshd",
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.names[1],
                "/usr/sbin/sshd",
                "-D",
                "-e",
                "-p",
                "2222",
            ])
            .arg("-h")
            .arg(dir.join("host"))
            .arg(sshd(&format!("ListenAddress={}", ns.addrs[1])))
            .arg(sshd(&format!(
                "AuthorizedKeysFile={}",
                dir.join("authorized_keys").display()
            )))
            .args([
                sshd("StrictModes=no"),
                sshd("UsePAM=no"),
                sshd("PidFile=none"),
                sshd("PermitRootLogin=prohibit-password"),
            ]),
    );
    let ssh = format!(
        "ssh -i {} -p 2222 -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        dir.join("client").display()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut words: Vec<&str> = ssh.split(' ').collect();
        words.extend([ns.addrs[1].as_str(), "true"]);
        if Command::new("ip")
            .args(["netns", "exec", &ns.names[0]])
            .args(&words)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sshd in namespace b did not answer:\n{}",
            server.said()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, ssh)
}

/// The members `ulnic fabric up` started, stopped when dropped if the
/// test did not get to stop them: `fabric down` (through ssh for the far
/// one), then SIGKILL for any recorded pid still there.
struct FabricUp {
    down: Command,
    pids: Vec<u32>,
}

impl Drop for FabricUp {
    fn drop(&mut self) {
        if self.pids.is_empty() && !std::thread::panicking() {
            return;
        }
        let _ = self
            .down
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        for &p in &self.pids {
            if alive(p) {
                // SAFETY: kill(2) on a pid this test's fabric up reported.
                unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}

#[test]
fn fabric_up_starts_a_member_through_ssh_in_another_namespace() {
    let ns = Namespaces::new();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let d = dir.to_str().unwrap();
    let (_sshd, ssh) = sshd_in_b(&ns, dir);
    let in_a = |args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns.names[0]]).args(args);
        c
    };

    // From namespace a: member d0 here (a's own address), d1 through ssh.
    let hostfile = dir.join("hosts");
    std::fs::write(
        &hostfile,
        format!("# two hosts\n{}\n{} slots=1\n", ns.addrs[0], ns.addrs[1]),
    )
    .unwrap();
    // Whatever fails from here, the members stop.
    let mut members_up = FabricUp {
        down: in_a(&[
            env!("CARGO_BIN_EXE_ulnic"),
            "fabric",
            "down",
            "--dir",
            d,
            "--ssh",
            &ssh,
        ]),
        pids: Vec::new(),
    };
    let up = in_a(&[
        env!("CARGO_BIN_EXE_ulnic"),
        "fabric",
        "up",
        "--nodes",
        "4",
        "--devices",
        "2",
    ])
    .args([
        "--port",
        "7400",
        "--json",
        "--dir",
        d,
        "--ssh",
        &ssh,
        "--hostfile",
    ])
    .arg(&hostfile)
    .args(["--remote-ulnic", env!("CARGO_BIN_EXE_ulnic")])
    .output()
    .unwrap();
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let members: serde_json::Value = serde_json::from_slice(&up.stdout).unwrap();
    assert_eq!(members[0]["host"], serde_json::Value::Null, "{members}");
    assert_eq!(members[1]["host"], ns.addrs[1].as_str(), "{members}");
    assert_eq!(members[1]["nodes"], serde_json::json!([2, 3]));
    let pids: Vec<u32> = (0..2)
        .map(|k| members[k]["pid"].as_u64().unwrap() as u32)
        .collect();
    members_up.pids.clone_from(&pids);
    assert!(pids.iter().all(|&p| alive(p)), "{members}");
    // The key the launcher made is private.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.join("fabric.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // Node 0 (d0, namespace a) and node 3 (d1, namespace b), over UDP.
    for (workload, size) in [("pingpong", "8"), ("stream", "65536")] {
        let r = cli::json_lines(&[
            "bench",
            workload,
            "--device-dir",
            d,
            "--nodes",
            "0,3",
            "--transport",
            "ulnic",
            "--size",
            size,
            "--iters",
            "200",
            "--json",
        ]);
        assert_eq!(r.len(), 1, "{r:?}");
    }
    let udp = udp_stats(dir, "d1");
    assert!(udp["received"].as_u64().unwrap() > 200, "{udp}");

    // Down stops both, the far one through ssh.
    let down = in_a(&[
        env!("CARGO_BIN_EXE_ulnic"),
        "fabric",
        "down",
        "--dir",
        d,
        "--ssh",
        &ssh,
    ])
    .output()
    .unwrap();
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    wait_until(
        Duration::from_secs(20),
        "every member to end after fabric down",
        || !pids.iter().any(|&p| alive(p)),
    );
    members_up.pids.clear();
    assert!(!dir.join("members.json").exists());
}
