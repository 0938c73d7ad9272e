//! Generates the libfabric ABI from the installed headers (Debian's
//! libfabric-dev, 1.17): the provider's structures must match the
//! library that loads it, field for field, so they are never written by
//! hand.

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=fabric");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*")
        .allowlist_function("fi_dupinfo|fi_freeinfo|fi_strerror")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen over libfabric's headers failed ({e}): install libfabric-dev and libclang-dev")
        })
        .write_to_file(out.join("fi.rs"))
        .expect("writing the generated bindings");
}
