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
