//! Debian packages for the guests, beside the base image: the named
//! packages' files and the shared libraries their programs need (found
//! by following every ELF file's `DT_NEEDED` through the packages apt
//! resolves for them), as an initramfs piece the kernel unpacks after
//! the base one; and a host directory as such a piece.
//!
//! A dependency is taken whole, like the named packages, when it is part
//! of the same program: built from the same Debian source package as a
//! named one (nginx and nginx-common, apache2 and apache2-bin), or a
//! direct dependency of a named package that ships no program of its own
//! (a metapackage or a flavour package standing for the one with the
//! binary), and then its own same-source kin. From every other dependency
//! only shared libraries are taken: maintainer-script helpers (perl,
//! debconf, adduser) that apt would install never run in a guest; but
//! a library kept in a private directory of the library tree
//! (`usr/lib/<triplet>/<dir>/`, as PMIx's `pmix2/`) comes with that
//! whole directory, its plugins and help texts, which it opens at run
//! time by path. Each build says which packages it took whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::apt::{self, Apt};
use crate::error::Error;
use crate::newc::Archive;

/// Parts of a package a guest never reads.
const SKIP: [&str; 7] = [
    "usr/share/doc/",
    "usr/share/man/",
    "usr/share/info/",
    "usr/share/locale/",
    "usr/share/lintian/",
    "usr/share/bug/",
    "usr/share/bash-completion/",
];

/// Whether `name` can be a Debian package name (what apt is given).
pub fn valid_name(name: &str) -> bool {
    name.len() >= 2
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// Builds (or finds in `cache`) the piece holding `names` (resolved with
/// `apt`): its path.
pub fn build(
    apt: &Apt,
    cache: &Path,
    names: &[String],
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, Error> {
    if let Some(bad) = names.iter().find(|n| !valid_name(n)) {
        return Err(Error::Resolve(format!(
            "'{bad}' is not a Debian package name"
        )));
    }
    if !apt.has_lists() {
        apt.update()?;
    }
    let wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    let closure = apt.closure(&wanted)?;
    if closure.is_empty() {
        return Err(Error::Resolve(format!(
            "apt resolves nothing for {}",
            names.join(", ")
        )));
    }
    // The piece is named by what went into it: the packages asked for and
    // every version resolved
    // (and by the rules that pick what is taken: 10, with empty
    // directories, the packages programs link into, the
    // architecture-independent ones, and the alternatives postinst
    // scripts install, and libraries' private directories).
    let mut key = format!("rule 10 {}", names.join(","));
    for (n, v) in &closure {
        key.push_str(&format!(" {n}={v}"));
    }
    let out = cache.join(format!("packages-{}.cpio", crate::fnv::fnv(&key)));
    if out.exists() {
        progress(&format!("      packages {}: cached", names.join(", ")));
        return Ok(out);
    }
    progress(&format!(
        "      packages {}: {} resolved with their dependencies; fetching",
        names.join(", "),
        closure.len()
    ));
    let all: Vec<&str> = closure.iter().map(|(n, _)| n.as_str()).collect();
    let debs = apt.download(&all)?;
    let pool = cache.join("packages-pool");
    let _ = std::fs::remove_dir_all(&pool);
    std::fs::create_dir_all(&pool).map_err(|e| Error::io(&pool, e))?;
    let (roots, controls, alternatives) = unpack(&closure, &debs, &pool)?;
    Alternative::install_chosen(alternatives, &roots, progress);
    let libs = libraries(&roots)?;
    // The asked-for packages and their parts whole (but their
    // documentation), then the libraries every ELF file of the selection
    // needs, until none is new.
    let whole = whole_packages(
        names,
        &controls,
        |n| has_program(&roots[n]),
        |n| programs_link_into(n, &roots),
    )?;
    progress(&format!(
        "      taken whole (named, built from the same source, what a metapackage or a program's link stands for, architecture-independent): {}",
        whole.iter().cloned().collect::<Vec<_>>().join(", ")
    ));
    let mut take: BTreeSet<PathBuf> = BTreeSet::new();
    for n in &whole {
        let root = &roots[n];
        for f in walk(root)? {
            let rel = f
                .strip_prefix(root)
                .unwrap_or(&f)
                .to_string_lossy()
                .to_string();
            if !SKIP.iter().any(|s| rel.starts_with(s)) {
                take.insert(f);
            }
        }
    }
    let mut missing = follow_needs(&mut take, &libs, &roots)?;
    // Libraries the base image has (the C library and its kin come from
    // it) are not missing; anything else would fail at run time, so say so.
    missing.retain(|m| !BASE_LIBS.iter().any(|b| m.starts_with(b)));
    if !missing.is_empty() {
        progress(&format!(
            "      warning: no package of the closure holds {}",
            missing.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let mut a = Archive::default();
    let mut dirs = BTreeSet::new();
    for f in &take {
        let root = roots
            .values()
            .find(|r| f.starts_with(r))
            .cloned()
            .unwrap_or_default();
        let rel = f.strip_prefix(&root).unwrap_or(f);
        add_path(&mut a, &mut dirs, f, &rel.to_string_lossy())?;
    }
    let tmp = out.with_extension("partial");
    let mut file = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    a.finish(&mut file).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &out).map_err(|e| Error::io(&out, e))?;
    let _ = std::fs::remove_dir_all(&pool);
    progress(&format!(
        "      packages {}: {} files",
        names.join(", "),
        take.len()
    ));
    Ok(out)
}

/// An alternative a maintainer script installs
/// (`update-alternatives --install LINK NAME PATH PRIORITY`). Scripts are
/// not run, so the link they would make (libpsm-infinipath1's library,
/// which libfabric1 needs, exists only that way) is made here, to the
/// highest-priority choice among the packages taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alternative {
    link: String,
    name: String,
    path: String,
    priority: i64,
}

impl Alternative {
    /// The `--install` lines of a script (continued lines joined).
    pub fn in_script(script: &str) -> Vec<Alternative> {
        let joined = script.replace("\\\n", " ");
        let mut found = Vec::new();
        for line in joined.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some(i) = words.iter().position(|w| *w == "--install") else {
                continue;
            };
            if !words[..i]
                .iter()
                .any(|w| w.ends_with("update-alternatives"))
            {
                continue;
            }
            if let [link, name, path, prio, ..] = words[i + 1..] {
                if let (true, Ok(priority)) =
                    (link.starts_with('/') && path.starts_with('/'), prio.parse())
                {
                    found.push(Alternative {
                        link: link.into(),
                        name: name.into(),
                        path: path.into(),
                        priority,
                    });
                }
            }
        }
        found
    }

    /// The highest-priority alternative of each name.
    pub fn chosen(all: Vec<Alternative>) -> Vec<Alternative> {
        let mut best: BTreeMap<String, Alternative> = BTreeMap::new();
        for a in all {
            match best.get(&a.name) {
                Some(b) if b.priority >= a.priority => {}
                _ => {
                    best.insert(a.name.clone(), a);
                }
            }
        }
        best.into_values().collect()
    }

    /// Makes the links of the highest-priority alternatives, saying each.
    fn install_chosen(
        all: Vec<Alternative>,
        roots: &BTreeMap<String, PathBuf>,
        progress: &mut dyn FnMut(&str),
    ) {
        for alt in Alternative::chosen(all) {
            if let Some(made) = alt.install(roots) {
                progress(&format!("      alternative {made}"));
            }
        }
    }

    /// Makes the link in the package that holds the chosen path, when one
    /// does and the link is not there already: what was made.
    fn install(&self, roots: &BTreeMap<String, PathBuf>) -> Option<String> {
        let rel = |p: &str| p.trim_start_matches('/').to_string();
        let root = roots.values().find(|r| r.join(rel(&self.path)).exists())?;
        let link = root.join(rel(&self.link));
        if std::fs::symlink_metadata(&link).is_ok() {
            return None;
        }
        std::fs::create_dir_all(link.parent()?).ok()?;
        std::os::unix::fs::symlink(&self.path, &link).ok()?;
        Some(format!("{} -> {}", self.link, self.path))
    }
}

/// Unpacks every package of `closure` (from `debs`) under `pool`: the
/// roots, the control fields and the alternatives their postinst
/// scripts install.
#[allow(clippy::type_complexity)]
fn unpack(
    closure: &[(String, String)],
    debs: &[PathBuf],
    pool: &Path,
) -> Result<
    (
        BTreeMap<String, PathBuf>,
        BTreeMap<String, Control>,
        Vec<Alternative>,
    ),
    Error,
> {
    let mut roots: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut controls = BTreeMap::new();
    let mut alternatives = Vec::new();
    for (name, _) in closure {
        let deb = debs
            .iter()
            .find(|d| {
                d.file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with(&format!("{name}_")))
            })
            .ok_or_else(|| Error::Resolve(format!("{name} was not downloaded")))?;
        let root = pool.join(name);
        apt::extract(deb, &root)?;
        if let Some(script) = apt::control_script(deb, "postinst")? {
            alternatives.extend(Alternative::in_script(&script));
        }
        roots.insert(name.clone(), root);
        controls.insert(name.clone(), Control::of(deb)?);
    }
    Ok((roots, controls, alternatives))
}

/// Adds to `take` what its files need, until nothing is new: a link's
/// target, every library an ELF file needs (those no package holds go to
/// the answer), and the private directories of the libraries taken.
fn follow_needs(
    take: &mut BTreeSet<PathBuf>,
    libs: &BTreeMap<String, PathBuf>,
    roots: &BTreeMap<String, PathBuf>,
) -> Result<BTreeSet<String>, Error> {
    let mut todo: Vec<PathBuf> = take.iter().cloned().collect();
    let mut missing = BTreeSet::new();
    while !todo.is_empty() {
        while let Some(f) = todo.pop() {
            // A link brings its target (libfoo.so.1 -> libfoo.so.1.2.3), from
            // whichever package of the closure holds it.
            if std::fs::read_link(&f).is_ok() {
                if let Some((_, t)) = link_target(&f, roots) {
                    if take.insert(t.clone()) {
                        todo.push(t);
                    }
                }
                continue;
            }
            for need in needed(&f) {
                match libs.get(&need) {
                    Some(lib) => {
                        if take.insert(lib.clone()) {
                            todo.push(lib.clone());
                        }
                    }
                    None => {
                        missing.insert(need);
                    }
                }
            }
        }
        todo = private_directories(take, roots)?
            .into_iter()
            .filter(|f| take.insert(f.clone()))
            .collect();
    }
    Ok(missing)
}

/// The files of the private library directories (`usr/lib/<triplet>/
/// <dir>/...`) that hold a library of `take`, in the package that
/// holds it: plugins and data the library opens by path at run time.
fn private_directories(
    take: &BTreeSet<PathBuf>,
    roots: &BTreeMap<String, PathBuf>,
) -> Result<Vec<PathBuf>, Error> {
    let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
    for f in take {
        let Some(root) = roots.values().find(|r| f.starts_with(r)) else {
            continue;
        };
        let rel = f.strip_prefix(root).unwrap_or(f);
        let parts: Vec<_> = rel.components().collect();
        // usr / lib / <triplet> / <dir> / ... / lib*.so*
        let is_private = parts.len() >= 5
            && parts[0].as_os_str() == "usr"
            && parts[1].as_os_str() == "lib"
            && parts[2].as_os_str().to_string_lossy().contains("-linux-");
        if is_private {
            dirs.insert(root.join(parts[..4].iter().collect::<PathBuf>()));
        }
    }
    let mut files = Vec::new();
    for d in dirs {
        files.extend(walk(&d)?);
    }
    Ok(files)
}

/// Every shared library the unpacked packages (`roots`) hold, by file
/// name.
fn libraries(roots: &BTreeMap<String, PathBuf>) -> Result<BTreeMap<String, PathBuf>, Error> {
    let mut libs: BTreeMap<String, PathBuf> = BTreeMap::new();
    for root in roots.values() {
        for f in walk(root)? {
            let rel = f.strip_prefix(root).unwrap_or(&f);
            let in_lib = rel
                .components()
                .any(|c| c.as_os_str().to_str().is_some_and(|s| s.starts_with("lib")));
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if in_lib && name.starts_with("lib") && name.contains(".so") {
                libs.entry(name.to_string()).or_insert(f.clone());
            }
        }
    }
    Ok(libs)
}

/// Whether an unpacked package (at `root`) ships a program.
/// Where the link `f` (in one of `roots`) points: the package that holds
/// its target and the target there, when one does.
fn link_target(f: &Path, roots: &BTreeMap<String, PathBuf>) -> Option<(String, PathBuf)> {
    let target = std::fs::read_link(f).ok()?;
    let (_, root) = roots.iter().find(|(_, r)| f.starts_with(r))?;
    let rel_dir = f.parent()?.strip_prefix(root).ok()?;
    // The target as a path inside a package, `..` resolved.
    let mut inside = PathBuf::new();
    let joined = if target.is_absolute() {
        target
    } else {
        rel_dir.join(target)
    };
    for c in joined.components() {
        match c {
            std::path::Component::Normal(p) => inside.push(p),
            std::path::Component::ParentDir => {
                inside.pop();
            }
            _ => {}
        }
    }
    roots.iter().find_map(|(n, r)| {
        let t = r.join(&inside);
        std::fs::symlink_metadata(&t)
            .is_ok()
            .then(|| (n.clone(), t))
    })
}

/// The other packages that package `n`'s programs are links into.
fn programs_link_into(n: &str, roots: &BTreeMap<String, PathBuf>) -> Vec<String> {
    let Some(root) = roots.get(n) else {
        return Vec::new();
    };
    walk(root)
        .unwrap_or_default()
        .iter()
        .filter(|f| is_program_path(root, f) && std::fs::read_link(f).is_ok())
        .filter_map(|f| link_target(f, roots))
        .map(|(p, _)| p)
        .filter(|p| p != n)
        .collect()
}

fn is_program_path(root: &Path, f: &Path) -> bool {
    let rel = f.strip_prefix(root).unwrap_or(f);
    ["bin", "sbin", "usr/bin", "usr/sbin"]
        .iter()
        .any(|d| rel.parent() == Some(Path::new(d)))
}

fn has_program(root: &Path) -> Result<bool, Error> {
    Ok(walk(root)?.iter().any(|f| is_program_path(root, f)))
}

/// What a package's control file says of its kin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Control {
    /// The source package it was built from (its own name when the
    /// control file names none).
    pub source: String,
    /// The packages it depends on (every alternative, without versions).
    pub depends: Vec<String>,
    /// `Architecture: all`: data and scripts (JavaScript, Python or Perl
    /// modules, tables) rather than machine code.
    pub arch_all: bool,
}

impl Control {
    /// Read with `dpkg-deb -f`.
    fn of(deb: &Path) -> Result<Control, Error> {
        let out = Command::new("dpkg-deb")
            .arg("-f")
            .arg(deb)
            .args([
                "Package",
                "Source",
                "Depends",
                "Pre-Depends",
                "Architecture",
            ])
            .output()
            .map_err(|e| Error::Tool {
                tool: "dpkg-deb".into(),
                detail: e.to_string(),
            })?;
        Ok(Control::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    /// From `Field: value` lines.
    pub fn parse(text: &str) -> Control {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .unwrap_or("")
        };
        let names = |v: &str| -> Vec<String> {
            v.split([',', '|'])
                .filter_map(|d| d.split_whitespace().next())
                .map(|d| d.split(':').next().unwrap_or(d).to_string())
                .filter(|d| !d.is_empty())
                .collect()
        };
        let source = field("Source").split_whitespace().next().unwrap_or("");
        let mut depends = names(field("Depends"));
        depends.extend(names(field("Pre-Depends")));
        Control {
            source: if source.is_empty() {
                field("Package").to_string()
            } else {
                source.to_string()
            },
            depends,
            arch_all: field("Architecture") == "all",
        }
    }
}

/// The packages of the closure (`controls`) taken whole for `names`: the
/// named ones; for a named one with no program (`has_program` false), its
/// direct dependencies in the closure; and every package built from the
/// same source as one of those.
pub fn whole_packages(
    names: &[String],
    controls: &BTreeMap<String, Control>,
    mut has_program: impl FnMut(&str) -> Result<bool, Error>,
    mut links_into: impl FnMut(&str) -> Vec<String>,
) -> Result<BTreeSet<String>, Error> {
    let mut whole: BTreeSet<String> = names.iter().cloned().collect();
    for n in names {
        // A program that is a link into another package (python3's
        // /usr/bin/python3 -> python3.11) stands for that package.
        whole.extend(links_into(n));
        if has_program(n)? {
            continue;
        }
        if let Some(c) = controls.get(n) {
            whole.extend(
                c.depends
                    .iter()
                    .filter(|d| controls.contains_key(*d))
                    .cloned(),
            );
        }
    }
    let sources: BTreeSet<&str> = whole
        .iter()
        .filter_map(|n| controls.get(n).map(|c| c.source.as_str()))
        .collect();
    let kin: Vec<String> = controls
        .iter()
        .filter(|(_, c)| sources.contains(c.source.as_str()))
        .map(|(n, _)| n.clone())
        .collect();
    whole.extend(kin);
    // What programs read at run time besides libraries: the
    // architecture-independent packages that what is taken depends on,
    // directly or through a library (nodejs's node-cjs-module-lexer
    // through libnode108), but not through a program that is not taken
    // (apache2-bin's perl would bring perl's modules without perl) nor the
    // packaging machinery, which only maintainer scripts use.
    let mut todo: Vec<&str> = whole.iter().map(String::as_str).collect();
    let mut seen: BTreeSet<&str> = todo.iter().copied().collect();
    let mut data = BTreeSet::new();
    while let Some(n) = todo.pop() {
        for d in controls.get(n).map(|c| c.depends.as_slice()).unwrap_or(&[]) {
            let Some(c) = controls.get(d) else { continue };
            if MACHINERY.contains(&d.as_str()) || !seen.insert(d.as_str()) {
                continue;
            }
            if c.arch_all && !d.ends_with("-doc") {
                data.insert(d.clone());
                todo.push(d.as_str());
            } else if d.starts_with("lib") {
                todo.push(d.as_str());
            }
        }
    }
    whole.extend(data);
    Ok(whole)
}

/// Packages only maintainer scripts use (they are not run in guests).
const MACHINERY: [&str; 11] = [
    "debconf",
    "debconf-2.0",
    "cdebconf",
    "po-debconf",
    "init-system-helpers",
    "adduser",
    "lsb-base",
    "sensible-utils",
    "ucf",
    "dpkg",
    "install-info",
];

/// The C library's own files, which the base image holds already.
const BASE_LIBS: [&str; 8] = [
    "libc.so",
    "libm.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "libgcc_s.so",
    "ld-linux",
    "libresolv.so",
];

/// The piece holding host directory `dir` at `guest` in the guest.
pub fn directory(dir: &Path, guest: &str, out: &Path) -> Result<(), Error> {
    let guest = guest.trim_matches('/');
    if guest.is_empty() || guest.split('/').any(|c| c == ".." || c.is_empty()) {
        return Err(Error::Resolve(format!(
            "'{guest}' is not a guest path like /opt/app"
        )));
    }
    let mut a = Archive::default();
    let mut dirs = BTreeSet::new();
    for f in walk(dir)? {
        let rel = f.strip_prefix(dir).unwrap_or(&f);
        add_path(
            &mut a,
            &mut dirs,
            &f,
            &format!("{guest}/{}", rel.to_string_lossy()),
        )?;
    }
    let mut file = std::fs::File::create(out).map_err(|e| Error::io(out, e))?;
    a.finish(&mut file).map_err(|e| Error::io(out, e))
}

/// Adds `f` (a file, symbolic link or directory) as `name`, with its
/// parents.
fn add_path(
    a: &mut Archive,
    dirs: &mut BTreeSet<String>,
    f: &Path,
    name: &str,
) -> Result<(), Error> {
    let mut parent = String::new();
    for c in Path::new(name)
        .parent()
        .into_iter()
        .flat_map(|p| p.components())
    {
        if !parent.is_empty() {
            parent.push('/');
        }
        parent.push_str(&c.as_os_str().to_string_lossy());
        if dirs.insert(parent.clone()) {
            a.dir(&parent);
        }
    }
    let meta = std::fs::symlink_metadata(f).map_err(|e| Error::io(f, e))?;
    if meta.is_dir() {
        if dirs.insert(name.to_string()) {
            a.dir(name);
        }
    } else if meta.file_type().is_symlink() {
        let target = std::fs::read_link(f).map_err(|e| Error::io(f, e))?;
        a.symlink(name, &target.to_string_lossy());
    } else {
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(f).map_err(|e| Error::io(f, e))?;
        a.file(name, meta.permissions().mode() & 0o7777, &data);
    }
    Ok(())
}

/// Every file and symbolic link under `dir`, and every empty directory
/// (a package's /var/log/nginx: daemons expect the directories their
/// package ships).
fn walk(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let mut empty = true;
        for e in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let e = e.map_err(|e| Error::io(&d, e))?;
            empty = false;
            let t = e.file_type().map_err(|err| Error::io(e.path(), err))?;
            if t.is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
        if empty && d != dir {
            out.push(d);
        }
    }
    out.sort();
    Ok(out)
}

/// The libraries an ELF file names as needed (none for anything else).
fn needed(f: &Path) -> Vec<String> {
    let is_elf = std::fs::File::open(f)
        .and_then(|mut h| {
            let mut magic = [0u8; 4];
            std::io::Read::read_exact(&mut h, &mut magic).map(|_| magic)
        })
        .is_ok_and(|m| m == *b"\x7fELF");
    if !is_elf || std::fs::symlink_metadata(f).is_ok_and(|m| m.file_type().is_symlink()) {
        return Vec::new();
    }
    let Ok(out) = Command::new("readelf").arg("-d").arg(f).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_file_names_its_source_and_dependencies() {
        let c = Control::parse(
            "Package: nginx\nSource: nginx (1.22.1-9)\nDepends: nginx-common (= 1.22.1-9), libc6 (>= 2.34), libssl3:any | libssl1\nPre-Depends: init-system-helpers\n",
        );
        assert_eq!(c.source, "nginx");
        assert_eq!(
            c.depends,
            [
                "nginx-common",
                "libc6",
                "libssl3",
                "libssl1",
                "init-system-helpers"
            ]
        );
        assert!(!c.arch_all);
        let own = Control::parse("Package: iperf3\nDepends: libiperf0\n");
        assert_eq!(own.source, "iperf3", "no Source field: its own name");
        assert!(Control::parse("Package: tzdata\nArchitecture: all\n").arch_all);
    }

    #[test]
    fn parts_of_the_same_program_are_taken_whole_and_libraries_are_not() {
        let c = |src: &str, deps: &[&str]| Control {
            source: src.into(),
            depends: deps.iter().map(|d| d.to_string()).collect(),
            arch_all: false,
        };
        let controls: BTreeMap<String, Control> = [
            ("apache2", c("apache2", &["apache2-bin", "perl"])),
            ("apache2-bin", c("apache2", &["libapr1"])),
            ("apache2-data", c("apache2", &[])),
            ("perl", c("perl", &[])),
            ("libapr1", c("apr", &[])),
            (
                "default-mysql-server",
                c("mysql-defaults", &["mariadb-server"]),
            ),
            ("mariadb-server", c("mariadb", &["mariadb-server-core"])),
            ("mariadb-server-core", c("mariadb", &["libssl3"])),
            ("libssl3", c("openssl", &[])),
        ]
        .into_iter()
        .map(|(n, c)| (n.to_string(), c))
        .collect();
        // apache2 has programs (apachectl): its same-source kin only.
        let none = |_: &str| Vec::new();
        let w = whole_packages(&["apache2".into()], &controls, |_| Ok(true), none).unwrap();
        assert_eq!(
            w.into_iter().collect::<Vec<_>>(),
            ["apache2", "apache2-bin", "apache2-data"]
        );
        // A metapackage brings what it stands for, and its kin.
        let w = whole_packages(
            &["default-mysql-server".into()],
            &controls,
            |n| Ok(n != "default-mysql-server"),
            none,
        )
        .unwrap();
        assert_eq!(
            w.into_iter().collect::<Vec<_>>(),
            [
                "default-mysql-server",
                "mariadb-server",
                "mariadb-server-core"
            ]
        );
        // A flavour package whose program is a link into another package
        // (python3 -> python3.11-minimal) brings it, and its kin, and the
        // architecture-independent packages they need (tzdata), but not
        // through the packaging machinery (debconf, and perl after it).
        let controls: BTreeMap<String, Control> = [
            ("python3", c("python3-defaults", &["python3.11", "debconf"])),
            (
                "debconf",
                Control {
                    arch_all: true,
                    ..c("debconf", &["perl-modules"])
                },
            ),
            (
                "perl-modules",
                Control {
                    arch_all: true,
                    ..c("perl", &[])
                },
            ),
            ("python3.11", c("python3.11", &["python3.11-minimal"])),
            ("python3.11-minimal", c("python3.11", &[])),
            ("libpython3.11-stdlib", c("python3.11", &["tzdata"])),
            ("libssl3", c("openssl", &[])),
            (
                "tzdata",
                Control {
                    arch_all: true,
                    ..c("tzdata", &[])
                },
            ),
        ]
        .into_iter()
        .map(|(n, c)| (n.to_string(), c))
        .collect();
        let w = whole_packages(
            &["python3".into()],
            &controls,
            |_| Ok(true),
            |n| {
                if n == "python3" {
                    vec!["python3.11-minimal".into()]
                } else {
                    vec![]
                }
            },
        )
        .unwrap();
        assert_eq!(
            w.into_iter().collect::<Vec<_>>(),
            [
                "libpython3.11-stdlib",
                "python3",
                "python3.11",
                "python3.11-minimal",
                "tzdata"
            ]
        );
    }

    #[test]
    fn links_are_followed_into_other_packages() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (
            d.path().join("python3"),
            d.path().join("python3.11-minimal"),
        );
        std::fs::create_dir_all(a.join("usr/bin")).unwrap();
        std::fs::create_dir_all(b.join("usr/bin")).unwrap();
        std::fs::write(b.join("usr/bin/python3.11"), b"elf").unwrap();
        std::os::unix::fs::symlink("python3.11", a.join("usr/bin/python3")).unwrap();
        std::os::unix::fs::symlink("../../gone", a.join("usr/bin/dangling")).unwrap();
        let roots: BTreeMap<String, PathBuf> = [
            ("python3".to_string(), a.clone()),
            ("python3.11-minimal".to_string(), b.clone()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            programs_link_into("python3", &roots),
            ["python3.11-minimal"]
        );
        assert_eq!(
            link_target(&a.join("usr/bin/python3"), &roots),
            Some((
                "python3.11-minimal".to_string(),
                b.join("usr/bin/python3.11")
            ))
        );
        assert_eq!(link_target(&a.join("usr/bin/dangling"), &roots), None);
    }

    #[test]
    fn alternatives_are_read_from_scripts_and_the_highest_priority_wins() {
        let script = "#! /bin/sh\nset -e\nupdate-alternatives --install /usr/lib/x/libpsm.so.1 libpsm.so.1 \\\n    /usr/lib/libpsm1/libpsm.so.1.16 40\nupdate-alternatives --remove foo /x\nexit 0\n";
        let found = Alternative::in_script(script);
        assert_eq!(
            found,
            vec![Alternative {
                link: "/usr/lib/x/libpsm.so.1".into(),
                name: "libpsm.so.1".into(),
                path: "/usr/lib/libpsm1/libpsm.so.1.16".into(),
                priority: 40,
            }]
        );
        let mut other = found[0].clone();
        other.path = "/usr/lib/libpsm2/libpsm.so.2".into();
        other.priority = 50;
        assert_eq!(
            Alternative::chosen(vec![found[0].clone(), other.clone()]),
            vec![other]
        );
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pkg");
        std::fs::create_dir_all(root.join("usr/lib/libpsm1")).unwrap();
        std::fs::write(root.join("usr/lib/libpsm1/libpsm.so.1.16"), b"elf").unwrap();
        let roots = BTreeMap::from([("pkg".to_string(), root.clone())]);
        assert!(found[0].install(&roots).is_some());
        assert_eq!(
            std::fs::read_link(root.join("usr/lib/x/libpsm.so.1")).unwrap(),
            PathBuf::from("/usr/lib/libpsm1/libpsm.so.1.16")
        );
        assert_eq!(found[0].install(&roots), None, "made once");
    }

    #[test]
    fn package_names_are_checked_before_apt_sees_them() {
        assert!(valid_name("redis-server") && valid_name("libstdc++6") && valid_name("g++"));
        assert!(!valid_name("-o") && !valid_name("a b") && !valid_name("x") && !valid_name("Foo"));
    }

    #[test]
    fn a_directory_becomes_a_piece_under_its_guest_path() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/f"), b"hi").unwrap();
        // An empty directory comes too (daemons' /var/log/<name>).
        std::fs::create_dir_all(d.path().join("sub/log/empty")).unwrap();
        let out = d.path().join("x.cpio");
        directory(&d.path().join("sub"), "/opt/app", &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("opt/app/f") && text.contains("TRAILER!!!"));
        assert!(text.contains("opt/app/log/empty"));
        assert!(directory(d.path(), "/opt/../etc", &out).is_err());
    }
}
