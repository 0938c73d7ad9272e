//! The libfabric provider between two TCG guests (docs/libfabric.md):
//! guest images carry it in libfabric's own provider directory, so
//! Debian's `fi_info` and `fi_pingpong` find it with no setting at all,
//! through the guest driver (/dev/ulnic0). fi_pingpong's out-of-band
//! handshake crosses the guests' virtio-net; its messages cross ulnic,
//! every payload checked (`-c`).
mod cli;
use cli::{run as ulnic, text};

struct Down(String);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = ulnic(&["cluster", "down", "--name", &self.0]);
    }
}

fn exec(cluster: &str, node: &str, cmd: &str) -> String {
    let o = ulnic(&["cluster", "exec", node, "--name", cluster, "--", cmd]);
    assert!(o.status.success(), "{cmd}:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// fi_pingpong in `mode` ("msg" or "tagged"): server on node 1 as a job,
/// client on node 0 (retried until the server listens); the client's
/// table.
fn pingpong(cluster: &str, mode: &str, port: u16) -> String {
    let args = format!("-p ulnic -e rdm -m {mode} -I 20 -c");
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
    let client = format!(
        "for i in $(seq 60); do fi_pingpong {args} -P {port} node1 > /tmp/pp.out 2>&1 && \
         {{ cat /tmp/pp.out; exit 0; }}; grep -q 'Connection refused\\|ctrl/connect' /tmp/pp.out || \
         {{ cat /tmp/pp.out; exit 1; }}; sleep 1; done; cat /tmp/pp.out; exit 1"
    );
    exec(cluster, "0", &client)
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
    for (mode, port) in [("msg", 47_611), ("tagged", 47_612)] {
        let table = pingpong(&cluster, mode, port);
        eprintln!("fi_pingpong -m {mode} between guests:\n{table}");
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
