//! The libfabric provider between two TCG guests (docs/libfabric.md):
//! guest images carry it in libfabric's own provider directory, so
//! Debian's `fi_info` and `fi_pingpong` find it with no setting at all,
//! through the guest driver (/dev/ulnic0), reliable-datagram (untagged
//! and tagged) and connected endpoints. fi_pingpong's out-of-band
//! handshake crosses the guests' virtio-net; its messages cross ulnic,
//! every payload checked (`-c`). Then `fi_check` (guest-lib/fabric's
//! check of the public API: tag matching, peek and claim, cancel, wait
//! descriptors, counters, RMA) inside a guest, where the notification
//! descriptor is the driver's /dev/ulnic0.
mod cli;
use cli::{exec_ok as exec, run as ulnic, text, Down};

/// fi_pingpong with endpoint type `ep` in `mode` ("msg" or "tagged"):
/// server on node 1 as a job, client on node 0 (retried until the server
/// listens); the client's table.
fn pingpong(cluster: &str, ep: &str, mode: &str, port: u16) -> String {
    let args = format!("-p ulnic -e {ep} -m {mode} -I 20 -c");
    let o = ulnic(&[
        "cluster",
        "exec",
        "--detach",
        "1",
        "--name",
        cluster,
        "--",
        &format!("fi_pingpong {args} -B {port}"),
    ]);
    assert!(o.status.success(), "server:\n{}", text(&o));
    let job = jobs(cluster).as_array().unwrap().len();
    let client = format!(
        "for i in $(seq 60); do fi_pingpong {args} -P {port} node1 > /tmp/pp.out 2>&1 && \
         {{ cat /tmp/pp.out; exit 0; }}; grep -q 'Connection refused\\|ctrl/connect' /tmp/pp.out || \
         {{ cat /tmp/pp.out; exit 1; }}; sleep 1; done; cat /tmp/pp.out; exit 1"
    );
    let table = exec(cluster, "0", &client);
    // The server ends too, and well, once its client is done.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let j = jobs(cluster)[job - 1].clone();
        if j["state"] != "running" {
            assert_eq!(
                (&j["state"], &j["code"]),
                (&"exited".into(), &0.into()),
                "{j}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "server still running: {j}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    table
}

/// The cluster's background jobs (`cluster status --json`).
fn jobs(cluster: &str) -> serde_json::Value {
    let o = ulnic(&["cluster", "status", "--name", cluster, "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    s["jobs"].clone()
}

#[test]
fn fi_pingpong_between_two_guests() {
    let cluster = format!("test-libfabric-{}", std::process::id());
    let _down = Down(cluster.clone());
    let up = ulnic(&[
        "cluster",
        "up",
        "--nodes",
        "2",
        "--accel",
        "tcg",
        "--packages",
        "libfabric-bin",
        "--name",
        &cluster,
    ]);
    assert!(up.status.success(), "cluster up:\n{}", text(&up));
    for node in ["0", "1"] {
        let info = exec(&cluster, node, "fi_info -p ulnic -v");
        assert!(
            info.contains("prov_name: ulnic") && info.contains("FI_EP_RDM"),
            "node {node}: {info}"
        );
    }
    let check = ulnic_testkit::c_program_with(
        std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../guest-lib/fabric/tests/progs/fi_check.c"
        )),
        &["-lfabric"],
    );
    let put = ulnic(&[
        "cluster",
        "put",
        "0",
        check.to_str().unwrap(),
        "/root/fi_check",
        "--name",
        &cluster,
    ]);
    assert!(put.status.success(), "put:\n{}", text(&put));
    let said = exec(&cluster, "0", "/root/fi_check");
    eprintln!("fi_check in a guest:\n{said}");
    for want in [
        "ok claim-discard",
        "ok wait-fd",
        "ok counters",
        "ok rma",
        "ok all",
    ] {
        assert!(said.contains(want), "{want} missing:\n{said}");
    }
    for (ep, mode, port) in [
        ("rdm", "msg", 47_611),
        ("rdm", "tagged", 47_612),
        ("msg", "msg", 47_613),
    ] {
        let table = pingpong(&cluster, ep, mode, port);
        eprintln!("fi_pingpong -e {ep} -m {mode} between guests:\n{table}");
        for size in ["64 ", "256 ", "1k ", "4k ", "64k ", "1m "] {
            assert!(
                table
                    .lines()
                    .any(|l| l.starts_with(size) && l.contains("=20")),
                "no {size}line in:\n{table}"
            );
        }
        assert!(!table.contains("Error at iteration"), "{table}");
    }
}
