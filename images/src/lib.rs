//! Guest images and the QEMU that runs them, built from Debian packages into
//! a cache (`$XDG_CACHE_HOME/ulnic`, else `~/.cache/ulnic`).
//!
//! - **QEMU.** A system `qemu-system-x86_64` of version 10.2 or later when
//!   there is one (it has `vhost-user-test-device-pci`); otherwise Debian
//!   trixie-backports' QEMU, resolved against an empty system by a private
//!   apt, unpacked into the cache and run through its own dynamic loader.
//! - **Guest.** Debian bookworm-backports' cloud kernel (the version is
//!   resolved from the `linux-image-cloud-amd64` metapackage at build time)
//!   with its headers for building the module, and an initramfs holding
//!   busybox-static and ulnic's init.
//!
//! A build is redone only when an input changes: the resolved package
//! versions or this builder's own files. Versions are resolved again after
//! a day or on `force` (see `resolved`), so a warm start runs no apt.

mod apt;
mod error;
mod fnv;
pub mod newc;
mod packages;
mod resolved;
pub mod vm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use error::Error;
use fnv::fnv;
use resolved::Resolved;

/// Bumped when the build recipe changes in a way the inputs do not show.
const RECIPE: u32 = 3;
const INIT: &str = include_str!("init.sh");
/// The Linux driver's sources, built against the guest kernel's headers.
const MODULE_SOURCES: [(&str, &str); 6] = [
    (
        "ulnic_main.c",
        include_str!("../../guest-driver/linux/ulnic_main.c"),
    ),
    (
        "ulnic_pio.c",
        include_str!("../../guest-driver/linux/ulnic_pio.c"),
    ),
    (
        "ulnic_watch.c",
        include_str!("../../guest-driver/linux/ulnic_watch.c"),
    ),
    ("ulnic.h", include_str!("../../guest-driver/linux/ulnic.h")),
    (
        "ulnic_abi.h",
        include_str!("../../guest-driver/linux/ulnic_abi.h"),
    ),
    ("Kbuild", include_str!("../../guest-driver/linux/Kbuild")),
];
const BOOKWORM: [&str; 2] = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-backports main",
];
const TRIXIE: [&str; 2] = [
    "deb http://deb.debian.org/debian trixie main",
    "deb http://deb.debian.org/debian trixie-backports main",
];

/// The cache folder.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("ulnic")
}

/// How QEMU is run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Qemu {
    /// A system QEMU new enough.
    System {
        /// The binary.
        path: PathBuf,
        /// Its version.
        version: String,
    },
    /// Debian's QEMU unpacked into the cache.
    Bundle {
        /// The unpacked root.
        root: PathBuf,
        /// Its package version.
        version: String,
    },
}

impl Qemu {
    /// A command that runs `qemu-system-x86_64`, ready for arguments.
    pub fn command(&self) -> Command {
        match self {
            Qemu::System { path, .. } => Command::new(path),
            Qemu::Bundle { root, .. } => {
                let lib = format!(
                    "{r}/usr/lib/x86_64-linux-gnu:{r}/lib/x86_64-linux-gnu",
                    r = root.display()
                );
                let mut c = Command::new(root.join("usr/lib64/ld-linux-x86-64.so.2"));
                c.arg("--library-path")
                    .arg(lib)
                    .arg(root.join("usr/bin/qemu-system-x86_64"));
                c.arg("-L").arg(root.join("usr/share/qemu"));
                c.arg("-L").arg(root.join("usr/share/seabios"));
                // Its own modules only: another build's modules make it abort.
                c.env(
                    "QEMU_MODULE_DIR",
                    root.join("usr/lib/x86_64-linux-gnu/qemu"),
                );
                c
            }
        }
    }

    /// The version in use.
    pub fn version(&self) -> &str {
        match self {
            Qemu::System { version, .. } | Qemu::Bundle { version, .. } => version,
        }
    }
}

/// A built guest image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Image {
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initramfs: PathBuf,
    /// Kernel release (`uname -r`).
    pub kernel_release: String,
    /// Kernel package version.
    pub kernel_version: String,
    /// Headers tree to build modules against (`.../build`).
    pub headers: PathBuf,
    /// The ulnic kernel module built for this kernel.
    pub module: PathBuf,
    /// Debian's vde_switch (the guests' private Ethernet segment).
    pub vde_switch: PathBuf,
    /// QEMU to run it with.
    pub qemu: Qemu,
}

/// What a build did, for people and `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct BuildReport {
    /// The image.
    pub image: Image,
    /// False when everything was already in the cache and current.
    pub rebuilt: bool,
    /// Bytes of packages downloaded this time (not already in the cache).
    pub downloaded_bytes: u64,
    /// Packages downloaded this time.
    pub packages: Vec<String>,
    /// Wall time of the build.
    pub seconds: f64,
}

#[derive(Serialize, Deserialize, PartialEq, Eq)]
struct Stamp {
    recipe: u32,
    init: String,
    module: String,
    tools: Vec<String>,
    kernel_pkg: String,
    kernel_version: String,
    busybox_version: String,
    qemu: Qemu,
}

/// Parses `QEMU emulator version 11.1.3 (...)` into (major, minor).
fn parse_qemu_version(out: &str) -> Option<(u32, u32, String)> {
    let v = out
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)?;
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor, v.to_string()))
}

fn system_qemu() -> Option<Qemu> {
    let out = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()?;
    let (major, minor, version) = parse_qemu_version(&String::from_utf8_lossy(&out.stdout))?;
    if (major, minor) >= (10, 2) {
        let path = PathBuf::from("qemu-system-x86_64");
        return Some(Qemu::System { path, version });
    }
    None
}

/// Builds (or reuses) the default image with `tools` (host binaries, copied
/// with the shared libraries they need) in its `/bin`, shared libraries
/// among them (`*.so`) in its `/lib`; `progress` receives one line per
/// step.
pub fn build(
    force: bool,
    tools: &[PathBuf],
    progress: &mut dyn FnMut(&str),
) -> Result<BuildReport, Error> {
    let t0 = Instant::now();
    host_tools_present()?;
    let cache = cache_dir();
    let dir = cache.join("image");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    // One build at a time per cache: concurrent runs share apt state and files.
    let _lock = build_lock(&cache)?;
    let mut fetched = Fetched::default();

    let deb = Apt::new(&cache.join("apt-bookworm"), &BOOKWORM)?;
    let system = system_qemu();
    let resolved = resolve(&cache, &deb, system.is_some(), force, progress)?;
    progress("[2/4] QEMU");
    let qemu = find_qemu(
        &cache,
        system,
        &resolved.qemu_bundle_version,
        force,
        &mut fetched,
        progress,
    )?;

    let stamp = Stamp {
        recipe: RECIPE,
        init: fnv(INIT),
        module: fnv(&MODULE_SOURCES
            .iter()
            .map(|(n, c)| format!("{n}\n{c}"))
            .collect::<String>()),
        tools: tools
            .iter()
            .map(|t| tool_identity(t))
            .collect::<Result<_, _>>()?,
        kernel_pkg: resolved.kernel_pkg.clone(),
        kernel_version: resolved.kernel_version.clone(),
        busybox_version: resolved.busybox_version.clone(),
        qemu: qemu.clone(),
    };
    let stamp_path = dir.join("stamp.json");
    let image_path = dir.join("image.json");
    let cached = if force {
        None
    } else {
        cached_image(&stamp_path, &image_path, &stamp)
    };
    if let Some(image) = cached {
        progress("[3/4] kernel: cached and current");
        progress("[4/4] initramfs: cached and current");
        return Ok(BuildReport {
            image,
            rebuilt: false,
            downloaded_bytes: fetched.bytes,
            packages: fetched.packages,
            seconds: t0.elapsed().as_secs_f64(),
        });
    }

    let k = fetch_kernel(&dir, &deb, &resolved, &mut fetched, progress)?;
    let initramfs = write_initramfs(&dir, &k, tools, progress)?;
    let image = Image {
        kernel: k.kernel,
        initramfs,
        kernel_release: k.release,
        kernel_version: resolved.kernel_version,
        headers: k.headers,
        module: k.module,
        vde_switch: k.root.join("usr/bin/vde_switch"),
        qemu,
    };
    let write = |p: &Path, v: &[u8]| std::fs::write(p, v).map_err(|e| Error::io(p, e));
    write(
        &image_path,
        &serde_json::to_vec_pretty(&image).unwrap_or_default(),
    )?;
    write(
        &stamp_path,
        &serde_json::to_vec_pretty(&stamp).unwrap_or_default(),
    )?;
    Ok(BuildReport {
        image,
        rebuilt: true,
        downloaded_bytes: fetched.bytes,
        packages: fetched.packages,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The apt of Debian trixie, asked only when QEMU must come from there.
fn trixie_apt(cache: &Path) -> Result<Apt, Error> {
    Apt::new(&cache.join("apt-trixie"), &TRIXIE)
}

/// Step 1: the packages to build from, as resolved within the day, or
/// asked of apt now (with `force`, or when the stored resolution is old
/// or names no QEMU while the system has none); without network the last
/// resolution serves.
fn resolve(
    cache: &Path,
    deb: &Apt,
    system_qemu: bool,
    force: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Resolved, Error> {
    let stored = Resolved::load(cache);
    // A stored resolution serves only if it names a QEMU whenever the
    // system has none.
    let usable = |r: &Resolved| system_qemu || r.qemu_bundle_version.is_some();
    if let Some(r) = stored
        .clone()
        .filter(|r| !force && r.is_fresh() && usable(r))
    {
        progress(&format!(
            "[1/4] packages as resolved {} ago (asked again after a day, or with --force)",
            resolved::describe_age(r.age())
        ));
        return Ok(r);
    }
    progress("[1/4] resolving packages (bookworm-backports kernel, busybox-static)");
    let bundle = (!system_qemu).then(|| trixie_apt(cache)).transpose()?;
    match resolve_now(deb, bundle.as_ref()) {
        Ok(r) => {
            r.store(cache);
            Ok(r)
        }
        Err(e) => match stored.filter(usable) {
            Some(r) => {
                progress(&format!(
                    "      warning: {e}; using the packages resolved {} ago",
                    resolved::describe_age(r.age())
                ));
                Ok(r)
            }
            None => Err(e),
        },
    }
}

/// Step 2: the system's QEMU, else Debian trixie-backports' QEMU of
/// version `bundle`, unpacked into the cache unless it is there already
/// (or with `force`).
fn find_qemu(
    cache: &Path,
    system: Option<Qemu>,
    bundle: &Option<String>,
    force: bool,
    fetched: &mut Fetched,
    progress: &mut dyn FnMut(&str),
) -> Result<Qemu, Error> {
    let version = match (system, bundle) {
        (Some(q), _) => {
            progress(&format!("      using system QEMU {}", q.version()));
            return Ok(q);
        }
        (None, None) => {
            return Err(Error::Resolve(
                "no system QEMU and no trixie-backports QEMU resolved".into(),
            ))
        }
        (None, Some(version)) => version.clone(),
    };
    let root = cache.join(format!("qemu-{}", version.replace([':', '~', '+'], "_")));
    if !root.join("usr/bin/qemu-system-x86_64").exists() || force {
        progress(&format!(
            "      fetching Debian trixie-backports QEMU {version} and its libraries"
        ));
        let tri = trixie_apt(cache)?;
        if !tri.has_lists() {
            tri.update()?;
        }
        let before = tri.cached()?;
        let debs = tri.download_closure("qemu-system-x86", "trixie-backports")?;
        let tmp = root.with_extension("partial");
        let _ = std::fs::remove_dir_all(&tmp);
        unpack(&debs, &before, &tmp, fetched)?;
        let _ = std::fs::remove_dir_all(&root);
        std::fs::rename(&tmp, &root).map_err(|e| Error::io(&root, e))?;
        progress(&format!(
            "      unpacked {} packages into {}",
            debs.len(),
            root.display()
        ));
    } else {
        progress(&format!("      cached QEMU {version}"));
    }
    Ok(Qemu::Bundle { root, version })
}

/// The image built before, if it was built from `stamp`'s inputs and its
/// files are still there.
fn cached_image(stamp_path: &Path, image_path: &Path, stamp: &Stamp) -> Option<Image> {
    let current = std::fs::read(stamp_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Stamp>(&b).ok());
    if current.as_ref() != Some(stamp) {
        return None;
    }
    std::fs::read(image_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Image>(&b).ok())
        .filter(|image| image.kernel.exists() && image.initramfs.exists())
}

/// What step 3 made: the kernel's packages unpacked, and the module
/// built against its headers.
struct Kernel {
    /// Where the packages are unpacked.
    root: PathBuf,
    /// The kernel image.
    kernel: PathBuf,
    /// Its release (`uname -r`).
    release: String,
    /// Its headers tree.
    headers: PathBuf,
    /// ulnic.ko.
    module: PathBuf,
}

/// Step 3: the kernel, its headers, busybox-static and vde-switch
/// fetched and unpacked into `dir`/root, and the ulnic module built.
fn fetch_kernel(
    dir: &Path,
    deb: &Apt,
    resolved: &Resolved,
    fetched: &mut Fetched,
    progress: &mut dyn FnMut(&str),
) -> Result<Kernel, Error> {
    let kernel_pkg = &resolved.kernel_pkg;
    progress(&format!(
        "[3/4] kernel {kernel_pkg} {} with headers",
        resolved.kernel_version
    ));
    let release = kernel_pkg.trim_start_matches("linux-image-").to_string();
    let abi = release.trim_end_matches("-cloud-amd64").to_string();
    let want = [
        kernel_pkg.clone(),
        format!("linux-headers-{release}"),
        format!("linux-headers-{abi}-common"),
        format!("linux-kbuild-{abi}"),
        "busybox-static".to_string(),
        "vde-switch".to_string(),
        // A userland's tables for daemons: Debian's static users and
        // groups, and /etc/services, /etc/protocols, /etc/rpc.
        "base-passwd".to_string(),
        "netbase".to_string(),
    ];
    let want_ref: Vec<&str> = want.iter().map(String::as_str).collect();
    if !deb.has_lists() {
        deb.update()?;
    }
    let before = deb.cached()?;
    let debs = deb.download(&want_ref)?;
    let kroot = dir.join("root");
    let _ = std::fs::remove_dir_all(&kroot);
    unpack(&debs, &before, &kroot, fetched)?;
    let kernel = kroot.join(format!("boot/vmlinuz-{release}"));
    if !kernel.exists() {
        return Err(Error::Resolve(format!(
            "{} has no kernel image",
            kernel_pkg
        )));
    }
    let headers = kroot.join(format!("usr/src/linux-headers-{release}"));
    relocate_headers(
        &headers,
        &kroot.join(format!("usr/src/linux-headers-{abi}-common")),
    )?;
    progress(if sparse_available() {
        "      building the ulnic kernel module (W=1 and sparse; warnings are errors)"
    } else {
        "      building the ulnic kernel module (W=1, warnings are errors; sparse not installed)"
    });
    let module = build_module(&dir.join("module"), &headers)?;
    Ok(Kernel {
        root: kroot,
        kernel,
        release,
        headers,
        module,
    })
}

/// Step 4: the initramfs (busybox, ulnic.ko, the virtio-net modules,
/// `tools`, ulnic's init) written to `dir`/initramfs.cpio.
fn write_initramfs(
    dir: &Path,
    k: &Kernel,
    tools: &[PathBuf],
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, Error> {
    progress("[4/4] initramfs (busybox-static, ulnic.ko, ulnic init)");
    let busybox = k.root.join("bin/busybox");
    let bb = std::fs::read(&busybox).map_err(|e| Error::io(&busybox, e))?;
    let mut a = newc::Archive::default();
    for d in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "etc",
        "lib",
        "lib/modules",
        "root",
        "var",
        "var/cache",
        "var/lib",
        "var/log",
        "var/mail",
        "var/spool",
        "run/lock",
    ] {
        a.dir(d);
    }
    a.symlink("var/run", "/run");
    a.symlink("var/lock", "/run/lock");
    a.symlink("var/tmp", "/tmp");
    for (from, to) in USERLAND_FILES {
        let path = k.root.join(from);
        let data = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        // The guests have no bash: a login shell is busybox's.
        a.file(
            to,
            0o644,
            data.replace(":/bin/bash\n", ":/bin/sh\n").as_bytes(),
        );
    }
    a.file("etc/nsswitch.conf", 0o644, NSSWITCH.as_bytes());
    a.file("bin/busybox", 0o755, &bb);
    let ko = std::fs::read(&k.module).map_err(|e| Error::io(&k.module, e))?;
    a.file("lib/modules/ulnic.ko", 0o644, &ko);
    // virtio-net for the TCP baseline between guests (modules in this kernel).
    let kmods = k.root.join(format!("lib/modules/{}/kernel", k.release));
    for (rel, name) in NET_MODULES {
        let data = unxz(&kmods.join(rel))?;
        a.file(&format!("lib/modules/{name}"), 0o644, &data);
    }
    add_tools(&mut a, tools, &dir.join("tools"))?;
    a.symlink("bin/sh", "busybox");
    a.file("init", 0o755, INIT.as_bytes());
    let initramfs = dir.join("initramfs.cpio");
    let mut f = std::fs::File::create(&initramfs).map_err(|e| Error::io(&initramfs, e))?;
    a.finish(&mut f).map_err(|e| Error::io(&initramfs, e))?;
    Ok(initramfs)
}

/// Asks apt (after refreshing its lists) which packages to build from;
/// `bundle` is the trixie apt when QEMU must come from there.
fn resolve_now(deb: &Apt, bundle: Option<&Apt>) -> Result<Resolved, Error> {
    deb.update()?;
    let kernel_pkg = deb.resolve_meta("linux-image-cloud-amd64", "bookworm-backports")?;
    let kernel_version = deb.version(&kernel_pkg, Some("bookworm-backports"))?;
    let busybox_version = deb.version("busybox-static", None)?;
    let qemu_bundle_version = match bundle {
        Some(tri) => {
            tri.update()?;
            Some(tri.version("qemu-system-x86", Some("trixie-backports"))?)
        }
        None => None,
    };
    Ok(Resolved {
        at_unix: resolved::now_unix(),
        kernel_pkg,
        kernel_version,
        busybox_version,
        qemu_bundle_version,
    })
}

/// Files of Debian's base-passwd and netbase for the guests' /etc (in the
/// unpacked root, where they go): daemons look up users and groups when
/// they drop privileges, and services and protocols by name.
const USERLAND_FILES: [(&str, &str); 5] = [
    ("usr/share/base-passwd/passwd.master", "etc/passwd"),
    ("usr/share/base-passwd/group.master", "etc/group"),
    ("etc/services", "etc/services"),
    ("etc/protocols", "etc/protocols"),
    ("etc/rpc", "etc/rpc"),
];

/// Name services from the files above and /etc/hosts (which init writes
/// with every node's name); there is no DNS on the segment.
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files\n\
networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n";

/// Kernel modules for virtio-net, in load order (path under kernel/, name).
const NET_MODULES: [(&str, &str); 3] = [
    ("net/core/failover.ko.xz", "failover.ko"),
    ("drivers/net/net_failover.ko.xz", "net_failover.ko"),
    ("drivers/net/virtio_net.ko.xz", "virtio_net.ko"),
];

/// Decompresses an .xz file with xz-utils (busybox's insmod cannot).
fn unxz(path: &Path) -> Result<Vec<u8>, Error> {
    let out = Command::new("xz")
        .arg("-dc")
        .arg(path)
        .output()
        .map_err(|e| Error::Tool {
            tool: "xz".into(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(Error::Tool {
            tool: format!("xz -dc {}", path.display()),
            detail: String::from_utf8_lossy(&out.stderr).into(),
        });
    }
    Ok(out.stdout)
}

/// Debian's per-flavour headers include the common tree by absolute path;
/// point it at the copy in our cache instead.
fn relocate_headers(headers: &Path, common: &Path) -> Result<(), Error> {
    let mk = headers.join("Makefile");
    std::fs::write(&mk, format!("include {}/Makefile\n", common.display()))
        .map_err(|e| Error::io(&mk, e))
}

/// Takes the cache's build lock until the returned file is dropped.
fn build_lock(cache: &Path) -> Result<std::fs::File, Error> {
    let lock_path = cache.join("build.lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
    // SAFETY: flock on a descriptor we own; released when `lock` drops.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
        return Err(Error::io(&lock_path, std::io::Error::last_os_error()));
    }
    Ok(lock)
}

/// Builds (or finds in the cache) an initramfs piece holding the Debian
/// bookworm packages `names` and the shared libraries their programs need
/// (for [`with_pieces`]); `progress` gets a line per step.
pub fn packages(names: &[String], progress: &mut dyn FnMut(&str)) -> Result<PathBuf, Error> {
    let cache = cache_dir();
    let dir = cache.join("image");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let _lock = build_lock(&cache)?;
    let deb = Apt::new(&cache.join("apt-bookworm"), &BOOKWORM)?;
    packages::build(&deb, &dir, names, progress)
}

/// An initramfs piece holding host directory `dir` at `guest` (an
/// absolute guest path), made afresh each time.
pub fn directory_piece(dir: &Path, guest: &str) -> Result<PathBuf, Error> {
    let pieces = cache_dir().join("image/pieces");
    std::fs::create_dir_all(&pieces).map_err(|e| Error::io(&pieces, e))?;
    let out = pieces.join(format!(
        "dir-{}.cpio",
        fnv(&format!("{}:{guest}", dir.display()))
    ));
    packages::directory(dir, guest, &out)?;
    Ok(out)
}

/// `image` with `pieces` unpacked after its own initramfs (the kernel
/// unpacks concatenated archives in order): one file in the cache per set
/// of inputs, made again when one of them is newer than it (a directory
/// piece is made afresh on every run, so it is rewritten in place rather
/// than left behind under a new name).
pub fn with_pieces(image: &Image, pieces: &[PathBuf]) -> Result<Image, Error> {
    if pieces.is_empty() {
        return Ok(image.clone());
    }
    let inputs: Vec<&PathBuf> = std::iter::once(&image.initramfs).chain(pieces).collect();
    let key: String = inputs.iter().map(|p| format!("{};", p.display())).collect();
    let out = cache_dir().join(format!("image/pieces/initramfs-{}.cpio", fnv(&key)));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified());
    let mut stale = true;
    if let Ok(made) = modified(&out) {
        stale = false;
        for p in &inputs {
            stale |= modified(p).map_err(|e| Error::io(p, e))? >= made;
        }
    }
    if stale {
        std::fs::create_dir_all(out.parent().unwrap_or(Path::new("/")))
            .map_err(|e| Error::io(&out, e))?;
        let tmp = out.with_extension("partial");
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        for p in &inputs {
            let mut src = std::fs::File::open(p).map_err(|e| Error::io(p, e))?;
            std::io::copy(&mut src, &mut f).map_err(|e| Error::io(&tmp, e))?;
        }
        std::fs::rename(&tmp, &out).map_err(|e| Error::io(&out, e))?;
    }
    Ok(Image {
        initramfs: out,
        ..image.clone()
    })
}

/// The host programs an image build runs, and the Debian package of each:
/// checked before anything is fetched, so a fresh machine learns the
/// whole install line at once rather than one failure per run.
pub const HOST_TOOLS: [(&str, &str); 6] = [
    ("apt-get", "apt"),
    ("dpkg-deb", "dpkg"),
    ("make", "make"),
    // Debian's 6.12 kernel headers build modules with gcc-12.
    ("gcc-12", "gcc-12"),
    ("xz", "xz-utils"),
    ("ldd", "libc-bin"),
];

/// Fails with the install line when one of [`HOST_TOOLS`] is missing.
fn host_tools_present() -> Result<(), Error> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |tool: &str| std::env::split_paths(&path).any(|d| d.join(tool).is_file());
    let missing: Vec<&str> = HOST_TOOLS
        .iter()
        .filter(|(tool, _)| !found(tool))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::Tool {
        tool: "host tools".into(),
        detail: format!(
            "building the guest image needs {}; install with: sudo apt-get install {}",
            missing.join(", "),
            missing.join(" ")
        ),
    })
}

/// Builds guest-driver/linux against `headers` in `dir`; returns the .ko.
/// BTF generation is skipped (it needs pahole and only adds debug data).
pub fn build_module(dir: &Path, headers: &Path) -> Result<PathBuf, Error> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    for (name, text) in MODULE_SOURCES {
        std::fs::write(dir.join(name), text).map_err(|e| Error::io(dir.join(name), e))?;
    }
    // Sparse (C=2: check every source) where it is installed; the test
    // command installs it, and any finding fails the build like a warning.
    let sparse = sparse_available();
    let out = Command::new("make")
        .arg("-C")
        .arg(headers)
        .arg(format!("M={}", dir.display()))
        .args(["W=1", "KCFLAGS=-Werror", "CONFIG_DEBUG_INFO_BTF_MODULES="])
        .args(sparse.then_some("C=2"))
        .arg("modules")
        .output()
        .map_err(|e| Error::Tool {
            tool: "make (kernel module)".into(),
            detail: e.to_string(),
        })?;
    let ko = dir.join("ulnic.ko");
    if !out.status.success() || !ko.exists() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Tool {
            tool: "kernel module build".into(),
            detail: err
                .lines()
                .filter(|l| l.contains("error") || l.contains("warning"))
                .take(10)
                .collect::<Vec<_>>()
                .join(" | "),
        });
    }
    // Sparse reports as "file:line:col: warning|error: ..." and does not
    // fail make: any such line about our sources fails the build here.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let findings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with(&*dir.to_string_lossy()) && l.contains(": "))
        .collect();
    if !findings.is_empty() {
        return Err(Error::Tool {
            tool: "kernel module check (sparse)".into(),
            detail: findings.join(" | "),
        });
    }
    Ok(ko)
}

/// Whether module builds include the sparse check (it is installed).
pub fn sparse_available() -> bool {
    Command::new("sparse")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Size and modification time: enough to notice a rebuilt tool.
fn tool_identity(t: &Path) -> Result<String, Error> {
    let m = std::fs::metadata(t).map_err(|e| Error::io(t, e))?;
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Ok(format!("{}:{}:{}", t.display(), m.len(), mtime))
}

/// Copies each tool (debug info stripped) into /bin and the shared
/// libraries `ldd` names at their own paths; the guest runs the same binary.
fn add_tools(a: &mut newc::Archive, tools: &[PathBuf], scratch: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(scratch).map_err(|e| Error::io(scratch, e))?;
    let mut libs: Vec<String> = Vec::new();
    let mut providers: Vec<Vec<u8>> = Vec::new();
    for t in tools {
        let name = file_name(t);
        let stripped = scratch.join(&name);
        let st = Command::new("objcopy")
            .arg("--strip-debug")
            .arg(t)
            .arg(&stripped)
            .status();
        if !st.is_ok_and(|s| s.success()) {
            std::fs::copy(t, &stripped).map_err(|e| Error::io(t, e))?;
        }
        let data = std::fs::read(&stripped).map_err(|e| Error::io(&stripped, e))?;
        if name == FABRIC_PROVIDER {
            // libfabric's own provider directory, under the name it loads
            // (`*-fi.so`); libfabric itself comes with the packages that
            // use it (`--packages libfabric-bin`), not with every image.
            providers.push(data);
            continue;
        }
        // Shared libraries (the preload layer, the C API) go where the
        // dynamic loader looks; programs go on the PATH.
        let at = if name.contains(".so") { "lib" } else { "bin" };
        a.file(&format!("{at}/{name}"), 0o755, &data);
        if name == "libulnic.so" {
            a.symlink("lib/libulnic.so.0", "libulnic.so");
        }
        let out = Command::new("ldd")
            .arg(t)
            .output()
            .map_err(|e| Error::Tool {
                tool: "ldd".into(),
                detail: e.to_string(),
            })?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = match line.split("=>").nth(1) {
                Some(rest) => rest.split_whitespace().next(),
                None => line
                    .split_whitespace()
                    .next()
                    .filter(|p| p.starts_with('/')),
            };
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                if !libs.iter().any(|l| l == p) {
                    libs.push(p.to_string());
                }
            }
        }
    }
    let mut dirs: Vec<String> = Vec::new();
    for lib in &libs {
        let p = Path::new(lib);
        let mut prefix = PathBuf::new();
        for c in p.parent().into_iter().flat_map(|d| d.components()).skip(1) {
            prefix.push(c);
            let d = prefix.display().to_string();
            if !dirs.contains(&d) && d != "lib" {
                a.dir(&d);
                dirs.push(d);
            }
        }
        // Follow symlinks: the archive holds the library itself.
        let data = std::fs::read(p).map_err(|e| Error::io(p, e))?;
        a.file(lib.trim_start_matches('/'), 0o755, &data);
    }
    for data in providers {
        let mut prefix = String::new();
        for c in FABRIC_PROVIDER_DIR.split('/') {
            prefix = if prefix.is_empty() {
                c.to_string()
            } else {
                format!("{prefix}/{c}")
            };
            if !dirs.contains(&prefix) {
                a.dir(&prefix);
                dirs.push(prefix.clone());
            }
        }
        a.file(
            &format!("{FABRIC_PROVIDER_DIR}/libulnic-fi.so"),
            0o755,
            &data,
        );
    }
    Ok(())
}

/// The libfabric provider as cargo builds it (docs/libfabric.md).
pub const FABRIC_PROVIDER: &str = "libulnic_fabric.so";
/// Where Debian's libfabric looks for providers by default.
pub const FABRIC_PROVIDER_DIR: &str = "usr/lib/x86_64-linux-gnu/libfabric";

/// Packages downloaded in this build, and their bytes.
#[derive(Default)]
struct Fetched {
    packages: Vec<String>,
    bytes: u64,
}

/// Unpacks `debs` into `dest`, counting those that were not in the cache
/// (`before`) as fetched.
fn unpack(
    debs: &[PathBuf],
    before: &[PathBuf],
    dest: &Path,
    fetched: &mut Fetched,
) -> Result<(), Error> {
    for d in debs {
        if !before.contains(d) {
            fetched.bytes += std::fs::metadata(d).map(|m| m.len()).unwrap_or(0);
            fetched.packages.push(file_name(d));
        }
        apt::extract(d, dest)?;
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("?")
        .to_string()
}

use apt::Apt;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_version_parsing() {
        let (a, b, v) =
            parse_qemu_version("QEMU emulator version 11.1.3 (Debian 1:11.1.3+ds-1~bpo13+1)\n")
                .unwrap();
        assert_eq!((a, b, v.as_str()), (11, 1, "11.1.3"));
        assert!(parse_qemu_version("garbage").is_none());
    }
}
