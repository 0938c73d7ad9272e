//! CPython's socket suites inside a guest (a TCG guest with Debian's
//! python3.11 and libpython3.11-testsuite from `--packages`): over the
//! guest kernel's TCP and under the preload layer in loopback mode, where
//! the guest's node sends to itself through the device and its kernel
//! driver. The comparison and the known differences are the host test's
//! (guest-lib/preload/tests/cpython.rs, docs/sockets.md §7).
//!
//! The suites are the host test's. In the test command (about 6.5
//! minutes on 2 cores, most of it the suites over TCG).
mod cli;
use cli::{run as ulnic, text, Down};
use std::path::{Path, PathBuf};

fn runner() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-lib/preload/tests/cpython_suite.py")
}

/// Takes cluster `.0` down however the test ends.
/// Runs `cmd` on node 0 of `cluster`: its standard output.
fn exec(cluster: &str, cmd: &str) -> String {
    let o = ulnic(&["cluster", "exec", "0", "--name", cluster, "--", cmd]);
    assert!(o.status.success(), "{cmd}:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cpython_socket_suites_in_a_guest_pass_over_ulnic_as_over_its_kernel() {
    let name = format!("test-cpython-{}", std::process::id());
    let up = ulnic(&[
        "cluster",
        "up",
        "--nodes",
        "1",
        "--accel",
        "tcg",
        "--memory",
        "1024",
        "--packages",
        "python3,libpython3.11-testsuite",
        "--name",
        &name,
    ]);
    let _down = Down(name.clone());
    assert!(up.status.success(), "cluster up:\n{}", text(&up));
    let put = ulnic(&[
        "cluster",
        "put",
        "0",
        runner().to_str().unwrap(),
        "/root/cpython_suite.py",
        "--name",
        &name,
    ]);
    assert!(put.status.success(), "{}", text(&put));
    // Loopback is ulnic's in the guest too: the layer's trace says so.
    let said = exec(
        &name,
        "LD_PRELOAD=/lib/libulnic_preload.so ULNIC_INET=127.0.0.0/8 ULNIC_TRACE=1 \
         python3.11 -c \"import socket; s = socket.create_server(('127.0.0.1', 0)); \
         c = socket.create_connection(s.getsockname()); a, _ = s.accept(); \
         c.sendall(b'x'); assert a.recv(1) == b'x'\" 2>&1",
    );
    assert!(
        said.contains("to Node(0, ") && said.contains(": connected"),
        "the connection was not ulnic's:\n{said}"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut results = Vec::new();
    for (label, env) in [
        ("kernel", ""),
        (
            "ulnic",
            "LD_PRELOAD=/lib/libulnic_preload.so ULNIC_INET=127.0.0.0/8 ",
        ),
    ] {
        let json = exec(
            &name,
            &format!(
                "cd /tmp && {env}python3.11 /root/cpython_suite.py --out /tmp/{label}.json \
                 --timeout 60 >/dev/null 2>&1; cat /tmp/{label}.json"
            ),
        );
        let path = dir.path().join(format!("{label}.json"));
        std::fs::write(&path, json).unwrap();
        results.push(path);
    }
    let cmp = std::process::Command::new("python3")
        .arg(runner())
        .arg("--compare")
        .args(&results)
        .arg("--doc")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/sockets.md"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&cmp.stdout);
    println!("in a TCG guest:\n{table}");
    let passed = std::fs::read_to_string(&results[1])
        .unwrap()
        .matches("\"pass\"")
        .count();
    assert!(
        passed > 500,
        "too few tests passed under the layer: {passed}\n{table}"
    );
    assert!(
        cmp.status.success(),
        "a test passed over the guest's kernel, not over ulnic, and is not listed in docs/sockets.md:\n{table}{}",
        String::from_utf8_lossy(&cmp.stderr)
    );
}
