//! A peer's test suite for the sockets layer: CPython's own socket tests
//! (Debian's libpython3.11-testsuite) run over the kernel and then under
//! `LD_PRELOAD=libulnic_preload.so` in loopback mode (`ULNIC_INET=
//! 127.0.0.0/8`: 127.0.0.1 is this node, which sends to itself through
//! the device). Every test that passes over the kernel passes over ulnic
//! or is listed, with why, in docs/sockets.md §7 ("CPython's socket
//! tests"); the counts of both runs are printed side by side.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ulnic_testkit::TestDevice;

/// The suites run (test_ssl is left out: its socket parts need TLS
/// certificates' hostnames, which loopback mode does not change).
const MODULES: &[&str] = &[
    "test.test_socket",
    "test.test_selectors",
    "test.test_epoll",
    "test.test_poll",
    "test.test_select",
    "test.test_socketserver",
    "test.test_httplib",
    "test.test_asyncio.test_sock_lowlevel",
    "test.test_asyncio.test_streams",
    "test.test_asyncio.test_server",
    "test.test_asyncio.test_sendfile",
];

/// Debian's interpreter, whose test package the test command installs.
const PYTHON: &str = "/usr/bin/python3.11";

/// Seconds a test may take before it counts as hung.
const TEST_TIMEOUT: &str = "15";

/// Each test's outcome, by id.
type Outcomes = BTreeMap<String, String>;

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
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

/// Runs the suites (under the layer on `ulnic`'s node 0 when given).
fn run(ulnic: Option<&TestDevice>, out: &Path) -> (Outcomes, BTreeMap<String, String>) {
    let mut c = Command::new(PYTHON);
    c.arg(here().join("tests/cpython_suite.py"))
        .args(["--out", out.to_str().unwrap(), "--timeout", TEST_TIMEOUT])
        .args(MODULES)
        .current_dir(out.parent().unwrap());
    if let Some(dev) = ulnic {
        c.env("LD_PRELOAD", preload())
            .env("ULNIC_INET", "127.0.0.0/8")
            .env("ULNIC_SOCKET", &dev.sockets()[0]);
    }
    let st = c.status().expect("python3.11 runs");
    assert!(st.success(), "the suite runner failed: {st}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    let map = |k: &str| -> BTreeMap<String, String> {
        v[k].as_object()
            .unwrap()
            .iter()
            .map(|(id, o)| (id.clone(), o.as_str().unwrap_or("").to_string()))
            .collect()
    };
    (map("tests"), map("why"))
}

/// The tests docs/sockets.md lists as failing over ulnic, by id.
fn listed() -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(here().join("../../docs/sockets.md")).unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `test_"))
        .filter_map(|l| {
            let (id, rest) = l.split_once('`')?;
            Some((
                format!("test.test_{id}"),
                rest.trim_matches([' ', '|']).to_string(),
            ))
        })
        .collect()
}

/// The module a test id belongs to (one of `MODULES`).
fn module_of(id: &str) -> &'static str {
    MODULES
        .iter()
        .filter(|m| id.starts_with(&format!("{m}.")))
        .max_by_key(|m| m.len())
        .copied()
        .unwrap_or("(other)")
}

fn counts(o: &Outcomes, module: &str) -> String {
    let n = |kind: &[&str]| {
        o.iter()
            .filter(|(id, v)| module_of(id) == module && kind.contains(&v.as_str()))
            .count()
    };
    format!(
        "{:>4} {:>4} {:>4} {:>4}",
        n(&["pass", "xfail"]),
        n(&["fail", "error", "upass"]),
        n(&["skip"]),
        n(&["hang"])
    )
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
    let (kernel, _) = run(None, &dir.path().join("kernel.json"));
    let dev = ulnic_testkit::device_with(1, |b| b.max_endpoints(1024));
    loopback_goes_over_ulnic(&dev);
    let (ulnic, why) = run(Some(&dev), &dir.path().join("ulnic.json"));
    println!(
        "CPython 3.11 socket suites (pass fail skip hang), kernel TCP vs ulnic loopback mode:"
    );
    println!(
        "{:<40} {:<19}   {:<19}",
        "module", "kernel (pass fail skip hang)", "ulnic"
    );
    for m in MODULES {
        println!("{m:<40} {}   {}", counts(&kernel, m), counts(&ulnic, m));
    }
    let total = |o: &Outcomes| {
        let n = |kind: &[&str]| o.values().filter(|v| kind.contains(&v.as_str())).count();
        let (p, f) = (n(&["pass", "xfail"]), n(&["fail", "error", "upass"]));
        format!("{p:>4} {f:>4} {:>4} {:>4}", n(&["skip"]), n(&["hang"]))
    };
    println!("{:<40} {}   {}", "total", total(&kernel), total(&ulnic));
    let listed = listed();
    let mut unexplained = Vec::new();
    let mut now_pass = Vec::new();
    for (id, k) in &kernel {
        let u = ulnic.get(id).map_or("missing", String::as_str);
        let passes = |o: &str| o == "pass" || o == "xfail";
        if passes(k) && !passes(u) && !listed.contains_key(id) {
            unexplained.push(format!(
                "{id}: {u} ({})",
                why.get(id).map_or("", String::as_str)
            ));
        }
        if listed.contains_key(id) && passes(u) {
            now_pass.push(id.clone());
        }
    }
    for id in &now_pass {
        println!("listed in docs/sockets.md but passed this run: {id}");
    }
    assert!(
        ulnic.values().filter(|v| *v == "pass").count() > 1000,
        "too few tests ran under the layer"
    );
    assert!(
        unexplained.is_empty(),
        "passed over the kernel, not over ulnic, and not listed in docs/sockets.md:\n{}",
        unexplained.join("\n")
    );
}
