//! `include/ulnic.h` is what cbindgen makes of this crate today, and it
//! compiles as C and C++ with every warning an error.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut out);
    String::from_utf8(out).expect("UTF-8")
}

#[test]
fn the_header_is_current() {
    let path = crate_dir().join("include/ulnic.h");
    let fresh = generate();
    if std::env::var_os("ULNIC_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "{} is stale: run ULNIC_BLESS=1 cargo test -p ulnic-capi --test header",
        path.display()
    );
}

fn compiles(compiler: &str, lang: &str, std: &str, header: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(format!("use.{lang}"));
    std::fs::write(
        &src,
        "#include <ulnic.h>\nint main(void) { return ulnic_version() >> 16 == ULNIC_API_MAJOR ? 0 : 1; }\n",
    )
    .unwrap();
    let out = Command::new(compiler)
        .args([
            "-fsyntax-only",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            std,
        ])
        .arg("-I")
        .arg(header.parent().unwrap())
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("{compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {std} rejects ulnic.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_header_compiles_as_c_and_cpp() {
    // The generated text, so this test does not race a blessing rewrite.
    let dir = tempfile::tempdir().unwrap();
    let header = dir.path().join("ulnic.h");
    std::fs::write(&header, generate()).unwrap();
    compiles("gcc", "c", "-std=c99", &header);
    compiles("g++", "cc", "-std=c++11", &header);
}
