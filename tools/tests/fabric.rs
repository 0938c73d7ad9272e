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
