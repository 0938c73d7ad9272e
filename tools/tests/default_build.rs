//! The README's main command on a fresh machine: a plain `cargo build`
//! (what `cargo run --release -- cluster bench ...` builds) needs a Rust
//! toolchain and a C compiler, nothing else. bindgen, which needs libclang
//! and libfabric's headers, belongs only to the libfabric provider, built
//! with `-p ulnic-fabric` or `--workspace`.

use std::path::Path;
use std::process::Command;

/// The crates a plain build at the workspace root compiles (normal and
/// build dependencies of the default members).
fn default_build_crates() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "tree",
            "--offline",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn a_plain_build_needs_no_libclang() {
    let crates = default_build_crates();
    assert!(
        crates.iter().any(|c| c == "ulnic-tools"),
        "the default build must hold the ulnic program: {crates:?}"
    );
    for needs_libclang in ["bindgen", "clang-sys", "ulnic-fabric"] {
        assert!(
            !crates.iter().any(|c| c == needs_libclang),
            "{needs_libclang} is in the default build: the README's main command \
             would need libclang (keep ulnic-fabric out of default-members)"
        );
    }
}
