//! Running the `ulnic` command from the tools' tests.
#![allow(dead_code)]

use std::process::Command;

/// Runs `ulnic ARGS`, checks it succeeded, and returns its stdout as
/// JSON lines (the command's `--json` output).
pub fn json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ulnic"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ulnic {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
