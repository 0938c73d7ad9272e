//! A peer's test suite for the sockets layer: CPython's own socket tests
//! (Debian's libpython3.11-testsuite) run over the kernel and then under
//! `LD_PRELOAD=libulnic_preload.so` in loopback mode (`ULNIC_INET=
//! 127.0.0.0/8`: 127.0.0.1 is this node, which sends to itself through
//! the device). Every test that passes over the kernel passes over ulnic
//! or is listed, with why, in docs/sockets.md §7 ("CPython's socket
//! tests"); the counts of both runs are printed side by side. The suites
//! are the runner's (`cpython_suite.py`, `SUITES`).

use std::path::{Path, PathBuf};
use std::process::Command;

use ulnic_testkit::TestDevice;

/// Debian's interpreter, whose test package the test command installs.
const PYTHON: &str = "/usr/bin/python3.11";

/// Seconds a test may take before it counts as hung.
const TEST_TIMEOUT: &str = "15";

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn runner() -> PathBuf {
    here().join("tests/cpython_suite.py")
}

fn preload() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libulnic_preload.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// Runs the suites into `out` (under the layer on `ulnic`'s node 0 when
/// given); how many tests passed.
fn run(ulnic: Option<&TestDevice>, out: &Path) -> usize {
    let stats = out.with_extension("wakes");
    let mut c = Command::new(PYTHON);
    c.arg(runner())
        .args(["--out", out.to_str().unwrap(), "--timeout", TEST_TIMEOUT])
        .current_dir(out.parent().unwrap());
    if let Some(dev) = ulnic {
        c.env("LD_PRELOAD", preload())
            .env("ULNIC_INET", "127.0.0.0/8")
            .env("ULNIC_SOCKET", &dev.sockets()[0])
            .env("ULNIC_STATS", &stats);
    }
    let st = c.status().expect("python3.11 runs");
    assert!(st.success(), "the suite runner failed: {st}");
    if ulnic.is_some() {
        // Every process that waited on a ulnic socket and ended through
        // exit(3) said how its waits ended: none may have found a wake-up
        // by timer. (One process runs the suites, its threads sharing the
        // counts; the children the tests fork end with os._exit, and a
        // retry of a failed test is one more.)
        let said = std::fs::read_to_string(&stats).unwrap_or_default();
        let lost: Vec<&str> = said
            .lines()
            .filter(|l| !l.contains("found_by_timer 0 "))
            .collect();
        assert!(
            said.lines().count() >= 1 && lost.is_empty(),
            "lost wake-ups under CPython's suites: {lost:?} ({} processes reported)",
            said.lines().count()
        );
        eprintln!(
            "CPython's suites: {} processes waited on ulnic sockets, none found a wake-up by timer",
            said.lines().count()
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    v["tests"]
        .as_object()
        .unwrap()
        .values()
        .filter(|o| *o == "pass")
        .count()
}

/// A connection to 127.0.0.1 in loopback mode is ulnic's (the layer's
/// trace says so), so the suites' traffic is too.
fn loopback_goes_over_ulnic(dev: &TestDevice) {
    let script = "import socket\n\
        s = socket.create_server(('127.0.0.1', 0))\n\
        c = socket.create_connection(s.getsockname())\n\
        a, _ = s.accept()\n\
        c.sendall(b'over ulnic')\n\
        assert a.recv(10) == b'over ulnic'\n";
    let out = Command::new(PYTHON)
        .args(["-c", script])
        .env("LD_PRELOAD", preload())
        .env("ULNIC_INET", "127.0.0.0/8")
        .env("ULNIC_SOCKET", &dev.sockets()[0])
        .env("ULNIC_TRACE", "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("to Node(0, ") && said.contains(": connected"),
        "the connection was not ulnic's:\n{said}"
    );
}

#[test]
fn cpython_socket_suites_pass_over_ulnic_as_over_the_kernel() {
    assert!(
        Path::new("/usr/lib/python3.11/test/test_socket.py").exists(),
        "Debian's libpython3.11-testsuite is not installed (ci/test.sh installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (kernel, ulnic) = (
        dir.path().join("kernel.json"),
        dir.path().join("ulnic.json"),
    );
    run(None, &kernel);
    let dev = ulnic_testkit::device_with(1, |b| b.max_endpoints(1024));
    loopback_goes_over_ulnic(&dev);
    let passed = run(Some(&dev), &ulnic);
    assert!(
        passed > 900,
        "too few tests passed under the layer: {passed}"
    );
    let cmp = Command::new(PYTHON)
        .arg(runner())
        .arg("--compare")
        .args([&kernel, &ulnic])
        .arg("--doc")
        .arg(here().join("../../docs/sockets.md"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&cmp.stdout);
    println!("{table}");
    assert!(
        cmp.status.success(),
        "a test passed over the kernel, not over ulnic, and is not listed in docs/sockets.md:\n{table}{}",
        String::from_utf8_lossy(&cmp.stderr)
    );
}
