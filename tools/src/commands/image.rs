//! `ulnic image`: the guest image (kernel, initramfs with this `ulnic`,
//! the preload layer and the C library) and the QEMU that runs it, built
//! by `ulnic-images` into its cache.

use std::path::PathBuf;

use ulnic_images::BuildReport;

use crate::print::outln;

/// `ulnic image`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ImageCmd {
    /// Fetch and build the default guest (Debian cloud kernel, busybox
    /// initramfs) and QEMU into the cache; rebuilds only when an input
    /// changed. Package versions are resolved with apt at most once a day
    /// (kept in the cache's resolved.json); without network the last
    /// resolution is used.
    ///
    /// Examples:
    ///   ulnic image build
    ///   ulnic image build --json
    #[command(verbatim_doc_comment)]
    Build {
        /// Ask apt for the newest packages now and rebuild even when the
        /// cache is current.
        #[arg(long)]
        force: bool,
        /// Print the result as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `ulnic image ...`.
pub fn run(c: ImageCmd) -> anyhow::Result<()> {
    let ImageCmd::Build { force, json } = c;
    // The guest gets this very binary (so `ulnic` runs the same inside),
    // the preload layer and the C library.
    let tools = image_tools();
    eprintln!(
        "ulnic: building the guest image in {}",
        ulnic_images::cache_dir().display()
    );
    let r = ulnic_images::build(force, &tools, &mut |line| eprintln!("{line}"))?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", report(&r));
    }
    Ok(())
}

/// What a build did, for people.
fn report(r: &BuildReport) -> String {
    let mut out = String::new();
    outln!(
        out,
        "image ready in {:.1} s ({}; {} packages, {:.1} MB fetched)\n  kernel    {} ({})\n  initramfs {}\n  qemu      {}",
        r.seconds,
        if r.rebuilt { "built" } else { "cached" },
        r.packages.len(),
        r.downloaded_bytes as f64 / 1e6,
        r.image.kernel.display(),
        r.image.kernel_release,
        r.image.initramfs.display(),
        r.image.qemu.version()
    );
    out
}

/// What goes into guest images from this host: this `ulnic` binary, and
/// the preload layer, C library and libfabric provider built beside it
/// (when they were).
pub fn image_tools() -> Vec<PathBuf> {
    let exe = std::env::current_exe().ok();
    let dir = exe
        .as_ref()
        .and_then(|e| e.parent().map(|d| d.to_path_buf()));
    let mut tools: Vec<PathBuf> = exe.into_iter().collect();
    for lib in [
        "libulnic_preload.so",
        "libulnic.so",
        ulnic_images::FABRIC_PROVIDER,
    ] {
        if let Some(p) = dir.as_ref().map(|d| d.join(lib)).filter(|p| p.exists()) {
            tools.push(p);
        }
    }
    tools
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};

    #[test]
    fn build_flags() {
        let Cmd::Image(ImageCmd::Build { force, json }) = try_parse(&["image", "build"]).unwrap()
        else {
            panic!()
        };
        assert!(!force && !json);
        let Cmd::Image(ImageCmd::Build { force, json }) =
            try_parse(&["image", "build", "--force", "--json"]).unwrap()
        else {
            panic!()
        };
        assert!(force && json);
        let e = try_parse(&["image"]).unwrap_err();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
    }

    #[test]
    fn the_report_names_every_piece() {
        let r = BuildReport {
            image: ulnic_images::Image {
                kernel: "/c/image/root/boot/vmlinuz-6.12".into(),
                initramfs: "/c/image/initramfs.cpio".into(),
                kernel_release: "6.12.9+bpo-cloud-amd64".into(),
                kernel_version: "6.12.9-1~bpo12+1".into(),
                headers: "/c/h".into(),
                module: "/c/m/ulnic.ko".into(),
                vde_switch: "/c/vde_switch".into(),
                qemu: ulnic_images::Qemu::System {
                    path: "qemu-system-x86_64".into(),
                    version: "10.2.0".into(),
                },
            },
            rebuilt: false,
            downloaded_bytes: 12_345_678,
            packages: vec!["a".into(), "b".into()],
            seconds: 3.21,
        };
        assert_eq!(
            report(&r),
            "image ready in 3.2 s (cached; 2 packages, 12.3 MB fetched)\n  \
             kernel    /c/image/root/boot/vmlinuz-6.12 (6.12.9+bpo-cloud-amd64)\n  \
             initramfs /c/image/initramfs.cpio\n  qemu      10.2.0\n"
        );
    }

    #[test]
    fn the_image_gets_this_binary_first() {
        let tools = image_tools();
        assert_eq!(tools[0], std::env::current_exe().unwrap());
        assert!(tools[1..].iter().all(|t| t.ends_with("libulnic_preload.so")
            || t.ends_with("libulnic.so")
            || t.ends_with(ulnic_images::FABRIC_PROVIDER)));
    }
}
