//! The provider under libfabric's own programs and the public API, as
//! separate processes attached to nodes of a device (host attach):
//! Debian's `fi_info` and `fi_pingpong` (FI_EP_RDM untagged and tagged,
//! FI_EP_MSG; 64 B to 1 MiB, every payload checked with `-c`),
//! `tests/progs/fi_check.c` for the semantics fi_pingpong does not
//! reach (tag matching with ignore bits, unexpected messages, FI_PEEK,
//! truncation, remote CQ data, directed receives, cancel, inject, and
//! -FI_ENOSYS for what is not offered), and `tests/progs/fi_cm.c` for
//! connection management (refused, rejected, accepted with parameters,
//! data both ways, shutdown).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ulnic_testkit::{TestChild, TestDevice};

/// A directory holding the provider under the name libfabric loads
/// (`lib<name>-fi.so`).
fn provider_dir() -> tempfile::TempDir {
    let exe = std::env::current_exe().unwrap();
    let built = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let so: PathBuf = built.join("libulnic_fabric.so");
    assert!(so.exists(), "{} not built", so.display());
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&so, dir.path().join("libulnic-fi.so")).unwrap();
    dir
}

fn device() -> TestDevice {
    ulnic_testkit::device_with(2, |b| b.max_endpoints(64))
}

fn fi_cmd(prog: &str, prov: &Path, socket: &Path) -> Command {
    let mut c = Command::new(prog);
    c.env("FI_PROVIDER_PATH", prov)
        .env("ULNIC_SOCKET", socket)
        .env_remove("ULNIC_DEVICE");
    c
}

#[test]
fn fi_info_lists_the_provider_only_where_a_nic_is() {
    let prov = provider_dir();
    let dev = device();
    let out = fi_cmd("fi_info", prov.path(), &dev.socket(0))
        .args(["-p", "ulnic", "-v"])
        .output()
        .expect("fi_info (Debian's libfabric-bin)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fi_info: {text}");
    for want in [
        "prov_name: ulnic",
        "type: FI_EP_RDM",
        "type: FI_EP_MSG",
        "FI_TAGGED",
        "threading: FI_THREAD_SAFE",
        "max_msg_size: 1073741824",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    // No NIC in reach: the provider offers nothing rather than failing
    // later.
    let out = Command::new("fi_info")
        .args(["-p", "ulnic"])
        .env("FI_PROVIDER_PATH", prov.path())
        .env_remove("ULNIC_SOCKET")
        .env("ULNIC_DEVICE", "/nonexistent/ulnic0")
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// fi_pingpong between nodes 0 and 1: endpoint type `ep` ("rdm" or
/// "msg"), `mode` ("msg" or "tagged").
fn pingpong(ep: &str, mode: &str, oob_port: u16) {
    let prov = provider_dir();
    let dev = device();
    let port = oob_port.to_string();
    let args = ["-p", "ulnic", "-e", ep, "-m", mode, "-I", "100", "-c"];
    let mut server = TestChild::spawn(
        "fi_pingpong server",
        fi_cmd("fi_pingpong", prov.path(), &dev.socket(0))
            .args(args)
            .args(["-B", &port]),
    );
    std::thread::sleep(Duration::from_millis(300));
    let client = TestChild::spawn(
        "fi_pingpong client",
        fi_cmd("fi_pingpong", prov.path(), &dev.socket(1))
            .args(args)
            .args(["-P", &port, "127.0.0.1"]),
    );
    let out = client.finish(Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "client: {text}\n{}\nserver: {}",
        String::from_utf8_lossy(&out.stderr),
        server.said()
    );
    // Every size ran, 100 round trips each, none with a bad payload.
    for size in ["64 ", "256 ", "1k ", "4k ", "64k ", "1m "] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(size) && l.contains("=100")),
            "no {size}line in:\n{text}"
        );
    }
    assert!(!text.contains("Error at iteration"), "{text}");
    let status = server
        .try_wait()
        .or_else(|| {
            std::thread::sleep(Duration::from_secs(2));
            server.try_wait()
        })
        .unwrap_or_else(|| server.kill());
    assert!(status.success(), "server: {}", server.said());
}

#[test]
fn fi_pingpong_rdm_messages_between_host_ports() {
    pingpong("rdm", "msg", 47_601);
}

#[test]
fn fi_pingpong_rdm_tagged_between_host_ports() {
    pingpong("rdm", "tagged", 47_602);
}

#[test]
fn fi_pingpong_connected_endpoints_between_host_ports() {
    pingpong("msg", "msg", 47_603);
}

#[test]
fn the_public_api_behaves_as_libfabrics_manual_says() {
    run_check("fi_check.c");
}

#[test]
fn connections_are_made_refused_rejected_and_shut_down() {
    run_check("fi_cm.c");
}

/// Builds `tests/progs/NAME` against libfabric and runs it on node 0.
fn run_check(name: &str) {
    let prov = provider_dir();
    let dev = device();
    let exe = ulnic_testkit::c_program_with(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/progs")
            .join(name),
        &["-lfabric"],
    );
    // A low bound on unexpected messages, so fi_check's 6.6 MB of them
    // go past it (docs/libfabric.md).
    let out = fi_cmd(exe.to_str().unwrap(), prov.path(), &dev.socket(0))
        .env("ULNIC_FI_UNEXPECTED_MAX", "1048576")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("ok all"), "{text}");
    if let Some(l) = text
        .lines()
        .find(|l| l.starts_with("ok bounded-unexpected"))
    {
        // The receiver stopped taking packets at the bound: not every
        // send could complete before receives were posted (all 1000 do
        // without the bound).
        assert!(
            !l.contains(": 100 of 100"),
            "the bound held nothing back: {l}"
        );
        eprintln!("{l}");
    }
}
