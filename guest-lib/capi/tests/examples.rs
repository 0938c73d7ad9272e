//! The C examples, built as a user builds them (`install.sh` into a
//! prefix, then `gcc ... $(pkg-config --cflags --libs ulnic)`), run in
//! pairs of host processes attached to two nodes of a device (ping-pong,
//! RDMA write, tripwire wait, an event queue, sockets). One is also
//! linked against `libulnic.a`. (tools/tests/cluster_up.rs runs them in
//! guests.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use ulnic_device::Device;
use ulnic_testkit::{TestChild, TestDevice};

/// The directory cargo built this test's profile into (where libulnic is).
fn built() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A prefix with libulnic installed by the install script, once.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<tempfile::TempDir> = OnceLock::new();
    PREFIX
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let out = Command::new("bash")
                .arg(crate_dir().join("install.sh"))
                .arg("--prefix")
                .arg(dir.path())
                .arg("--from")
                .arg(built())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "install.sh failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir
        })
        .path()
}

fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("ulnic")
        .env("PKG_CONFIG_PATH", prefix().join("lib/pkgconfig"))
        .output()
        .expect("pkg-config runs (ci/test.sh installs it)");
    assert!(out.status.success(), "pkg-config {args:?} ulnic failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Builds examples/`name`.c into `dir`, with `gcc $(pkg-config --cflags
/// --libs ulnic)`, or against libulnic.a with `statically`.
fn build(name: &str, dir: &Path, statically: bool) -> PathBuf {
    let exe = dir.join(if statically {
        format!("{name}-static")
    } else {
        name.to_string()
    });
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(crate_dir().join("examples").join(format!("{name}.c")))
        .args(pkg_config(&["--cflags"]))
        .arg("-o")
        .arg(&exe);
    if statically {
        gcc.arg(prefix().join("lib/libulnic.a")).args(
            pkg_config(&["--static", "--libs-only-l"])
                .iter()
                .filter(|l| *l != "-lulnic"),
        );
    } else {
        gcc.args(pkg_config(&["--libs"]));
    }
    let out = gcc.output().unwrap();
    assert!(
        out.status.success(),
        "gcc {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn device() -> TestDevice {
    ulnic_testkit::device(2)
}

/// Runs `exe server_args` on node 1 until it says it is ready, then `exe
/// client_args` on node 0; both must succeed. Returns both outputs.
fn pair(dev: &Device, exe: &Path, server: &[&str], client: &[&str]) -> (String, String) {
    let run = |node: usize, args: &[&str]| {
        let mut c = Command::new(exe);
        c.args(args)
            .env("ULNIC_SOCKET", &dev.sockets()[node])
            .env("LD_LIBRARY_PATH", prefix().join("lib"));
        c
    };
    let name = |args: &[&str]| format!("{} {}", exe.display(), args.join(" "));
    // Killed if the client fails; its output kept whole for the end.
    let mut srv = TestChild::spawn(&name(server), &mut run(1, server));
    srv.expect_line("on node 1", Duration::from_secs(20));
    let cli = TestChild::spawn(&name(client), &mut run(0, client)).finish(Duration::from_secs(60));
    let client_out = String::from_utf8_lossy(&cli.stdout).to_string();
    assert!(
        cli.status.success(),
        "{exe:?} {client:?} failed ({}): {client_out}{}",
        cli.status,
        String::from_utf8_lossy(&cli.stderr)
    );
    // The server ends by itself once the client is done.
    let srv = srv.finish(Duration::from_secs(20));
    assert!(
        srv.status.success(),
        "{exe:?} {server:?} failed ({}): {}",
        srv.status,
        String::from_utf8_lossy(&srv.stderr)
    );
    (
        String::from_utf8_lossy(&srv.stdout).into_owned(),
        client_out,
    )
}

#[test]
fn pingpong_in_c_checks_every_byte_inline_and_in_buffers() {
    let bin = tempfile::tempdir().unwrap();
    let dev = device();
    for (exe, sizes) in [
        (build("pingpong", bin.path(), false), ["8", "65536"]),
        (build("pingpong", bin.path(), true), ["0", "4096"]),
    ] {
        for size in sizes {
            let (server, client) = pair(
                &dev,
                &exe,
                &["server", "7"],
                &["client", "1", "7", "500", size],
            );
            assert!(server.contains("answered 500 messages"), "{server}");
            assert!(
                client.contains(&format!("500 round trips of {size} bytes with node 1"))
                    && client.contains("every byte checked"),
                "{client}"
            );
        }
    }
}

#[test]
fn active_messages_in_c_reply_transfer_and_return_refusals() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("am_echo", bin.path(), false);
    let dev = device();
    let (server, client) = pair(&dev, &exe, &["server", "9"], &["client", "1", "9", "2000"]);
    assert!(
        server.contains("answered 2000 requests and 200000 transfer bytes (1 refused)"),
        "{server}"
    );
    assert!(
        client.contains("2000 replies and 200 transfer replies checked, 1 refusal returned"),
        "{client}"
    );
}

#[test]
fn rdma_write_in_c_lands_in_order_before_its_immediate() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("rdma_write", bin.path(), false);
    let dev = device();
    let (target, initiator) = pair(
        &dev,
        &exe,
        &["target", "9"],
        &["initiator", "1", "9", "65536", "50"],
    );
    assert!(
        target.contains("50 writes of 65536 bytes arrived, every byte checked"),
        "{target}"
    );
    assert!(
        initiator.contains("50 writes of 65536 bytes to node 1"),
        "{initiator}"
    );
}

#[test]
fn tripwire_wait_in_c_wakes_the_sleeping_owner() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("tripwire_wait", bin.path(), false);
    let dev = device();
    let (owner, writer) = pair(&dev, &exe, &["owner", "11"], &["writer", "1", "11", "4242"]);
    assert!(
        owner.contains("woken by a remote write") && owner.contains("now 4242"),
        "{owner}"
    );
    assert!(writer.contains("woke and read 4242"), "{writer}");
}

/// PIO windows from C: the writer maps the owner's window with its grant
/// and plays ping-pong through it with plain stores; the owner's
/// revocation reaches the writer as an event naming its import.
#[test]
fn pio_windows_in_c_carry_a_ping_pong_of_plain_stores_then_revoke() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("pio_pingpong", bin.path(), false);
    let dev = device();
    let (owner, writer) = pair(
        &dev,
        &exe,
        &["owner", "21"],
        &["writer", "1", "21", "20000"],
    );
    assert!(
        owner.contains("answered 20000 round trips, then revoked"),
        "{owner}"
    );
    assert!(
        writer.contains("20000 round trips through node 1's window")
            && writer.contains("window revoked by node 1"),
        "{writer}"
    );
}

/// A million words stored into another node's PIO window with plain
/// stores, all read back by the owner; after the revocation a store
/// faults and the window stays as it was.
#[test]
fn a_million_pio_stores_land_and_fault_after_revocation_in_c() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("pio_words", bin.path(), false);
    let dev = device();
    let (owner, writer) = pair(
        &dev,
        &exe,
        &["owner", "23", "1000000"],
        &["writer", "1", "23"],
    );
    assert!(
        owner.contains("all 1000000 words the writer stored read back")
            && owner.contains("the window is unchanged since"),
        "{owner}"
    );
    assert!(
        writer.contains("a store after the revocation faulted")
            && writer.contains("a forged grant is refused (ENOENT)")
            && writer.contains("the revoked grant is refused (ENOENT)"),
        "{writer}"
    );
}

/// CLAN's event queue from C: one epoll sleep on the queue's descriptor
/// serves four endpoints, each report names its source, none twice
/// before its source is armed again, and an endpoint is refused as its
/// own queue (the example fails otherwise).
#[test]
fn an_event_queue_in_c_serves_four_endpoints_from_one_epoll_sleep() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("event_queue", bin.path(), false);
    let dev = device();
    let (server, client) = pair(&dev, &exe, &["server", "30"], &["client", "1", "30", "500"]);
    assert!(
        server.contains("answered 2000 messages on 4 endpoints")
            && server.contains(" 0 duplicates"),
        "{server}"
    );
    assert!(
        client.contains("2000 answers from 4 endpoints of node 1 checked"),
        "{client}"
    );
}

/// `ulnic_evq`: the main thread serves three sources through
/// `ulnic_evq_wait` while a thread blocks in `ulnic_ep_wait` on the
/// fourth, both on one queue; every message is answered and the queue
/// never reports the thread's source to the main thread (the example
/// fails otherwise).
#[test]
fn an_evq_in_c_is_shared_by_its_consumer_and_a_thread_blocked_on_a_source() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("event_queue", bin.path(), false);
    let dev = device();
    let (server, client) = pair(
        &dev,
        &exe,
        &["server-evq", "30"],
        &["client", "1", "30", "500"],
    );
    assert!(
        server.contains("answered 2000 messages on 4 endpoints: 1500 through ulnic_evq_wait")
            && server.contains("500 by a thread blocked in ulnic_ep_wait"),
        "{server}"
    );
    assert!(
        client.contains("2000 answers from 4 endpoints of node 1 checked"),
        "{client}"
    );
}

#[test]
fn sockets_in_c_echo_a_datagram_and_a_stream_without_blocking() {
    let bin = tempfile::tempdir().unwrap();
    let exe = build("sock_echo", bin.path(), false);
    let dev = device();
    let (server, client) = pair(
        &dev,
        &exe,
        &["server", "7"],
        &["client", "1", "7", "1000000"],
    );
    assert!(
        server.contains("echoed a datagram and 1000000 bytes from node 0"),
        "{server}"
    );
    assert!(
        client.contains("a datagram and 1000000 bytes echoed by node 1, every byte checked"),
        "{client}"
    );
}
