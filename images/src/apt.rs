//! A private apt: its own sources, state and cache under our cache folder,
//! so resolving and downloading packages of another Debian release never
//! touches the system's package state.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::Error;

/// One private apt root.
pub struct Apt {
    root: PathBuf,
}

impl Apt {
    /// Creates (or reuses) a private apt root at `root` with these source lines.
    pub fn new(root: &Path, sources: &[&str]) -> Result<Apt, Error> {
        for d in ["etc", "state/lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(root.join(d)).map_err(|e| Error::io(root.join(d), e))?;
        }
        let status = root.join("state/status");
        if !status.exists() {
            std::fs::write(&status, b"").map_err(|e| Error::io(&status, e))?;
        }
        let list = root.join("etc/sources.list");
        std::fs::write(&list, sources.join("\n") + "\n").map_err(|e| Error::io(&list, e))?;
        Ok(Apt {
            root: root.to_path_buf(),
        })
    }

    fn options(&self) -> Vec<String> {
        let r = self.root.display();
        vec![
            format!("-oDir::State={r}/state"),
            format!("-oDir::State::status={r}/state/status"),
            format!("-oDir::Etc::sourcelist={r}/etc/sources.list"),
            "-oDir::Etc::sourceparts=-".into(),
            format!("-oDir::Cache={r}/cache"),
            "-oAPT::Install-Recommends=false".into(),
            "-oDebug::NoLocking=1".into(),
            // Downloads land in our cache as root; apt's sandbox user cannot write there.
            "-oAPT::Sandbox::User=root".into(),
        ]
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<String, Error> {
        let out = Command::new(tool)
            .args(self.options())
            .args(args)
            .current_dir(self.root.join("cache/archives"))
            .output()
            .map_err(|e| Error::Tool {
                tool: tool.into(),
                detail: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(Error::Tool {
                tool: format!("{tool} {}", args.join(" ")),
                detail: String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join(" | "),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Refreshes the package lists.
    pub fn update(&self) -> Result<(), Error> {
        self.run("apt-get", &["-q", "update"]).map(|_| ())
    }

    /// Whether package lists were fetched before (downloads need them).
    pub fn has_lists(&self) -> bool {
        std::fs::read_dir(self.root.join("state/lists")).is_ok_and(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
        })
    }

    /// The first dependency of a metapackage in `release` (e.g. the kernel
    /// ABI package that `linux-image-cloud-amd64` points at today).
    pub fn resolve_meta(&self, meta: &str, release: &str) -> Result<String, Error> {
        let out = self.run(
            "apt-cache",
            &["-t", release, "depends", "--no-recommends", meta],
        )?;
        out.lines()
            .find_map(|l| l.trim().strip_prefix("Depends: "))
            .map(|s| s.trim().to_string())
            .ok_or_else(|| Error::Resolve(format!("{meta} has no dependency in {release}")))
    }

    /// The candidate version of a package.
    pub fn version(&self, pkg: &str, release: Option<&str>) -> Result<String, Error> {
        let mut args = vec!["policy", pkg];
        if let Some(r) = release {
            args = vec!["-t", r, "policy", pkg];
        }
        let out = self.run("apt-cache", &args)?;
        out.lines()
            .find_map(|l| l.trim().strip_prefix("Candidate: "))
            .filter(|v| *v != "(none)")
            .map(str::to_string)
            .ok_or_else(|| Error::Resolve(format!("no candidate for {pkg}")))
    }

    /// Downloads exactly these packages (no dependencies); returns the .deb paths.
    pub fn download(&self, pkgs: &[&str]) -> Result<Vec<PathBuf>, Error> {
        self.run("apt-get", &[&["-q", "download"][..], pkgs].concat())?;
        self.debs_matching(pkgs)
    }

    /// Downloads a package and everything it depends on, resolved against an
    /// empty system (so the result runs without the host's libraries).
    pub fn download_closure(&self, pkg: &str, release: &str) -> Result<Vec<PathBuf>, Error> {
        self.run(
            "apt-get",
            &["-q", "-y", "--download-only", "-t", release, "install", pkg],
        )?;
        self.debs_matching(&[])
    }

    /// What installing `pkgs` on an empty system would install, each
    /// with its version (dependencies resolved, no recommends).
    pub fn closure(&self, pkgs: &[&str]) -> Result<Vec<(String, String)>, Error> {
        let out = self.run("apt-get", &[&["-q", "-s", "install"][..], pkgs].concat())?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("Inst ")?;
                let (name, rest) = rest.split_once(' ')?;
                let version = rest.trim_start_matches('(').split_whitespace().next()?;
                Some((name.to_string(), version.to_string()))
            })
            .collect())
    }

    /// The .deb files already in the cache.
    pub fn cached(&self) -> Result<Vec<PathBuf>, Error> {
        self.debs_matching(&[])
    }

    fn debs_matching(&self, pkgs: &[&str]) -> Result<Vec<PathBuf>, Error> {
        let dir = self.root.join("cache/archives");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(&dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                pkgs.is_empty() || pkgs.iter().any(|k| name.starts_with(&format!("{k}_")))
            })
            .collect();
        v.sort();
        Ok(v)
    }
}

/// Unpacks a .deb into `dest` with dpkg-deb (no maintainer scripts run).
pub fn extract(deb: &Path, dest: &Path) -> Result<(), Error> {
    dpkg_deb("-x", deb, dest)
}

/// A maintainer script of a .deb (`postinst`, ...), if it has one.
pub fn control_script(deb: &Path, script: &str) -> Result<Option<String>, Error> {
    let dir = tempfile::tempdir().map_err(|e| Error::io(deb, e))?;
    dpkg_deb("-e", deb, dir.path())?;
    Ok(std::fs::read_to_string(dir.path().join(script)).ok())
}

/// `dpkg-deb OP DEB DEST`.
fn dpkg_deb(op: &str, deb: &Path, dest: &Path) -> Result<(), Error> {
    let st = Command::new("dpkg-deb")
        .arg(op)
        .arg(deb)
        .arg(dest)
        .status()
        .map_err(|e| Error::Tool {
            tool: "dpkg-deb".into(),
            detail: e.to_string(),
        })?;
    if !st.success() {
        return Err(Error::Tool {
            tool: format!("dpkg-deb {op} {}", deb.display()),
            detail: st.to_string(),
        });
    }
    Ok(())
}
