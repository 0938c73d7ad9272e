//! Package versions as last resolved, kept beside the cache so a warm start
//! does not run apt at all: refreshing the lists and asking apt-cache took
//! about 5 s of every `cluster up`. A resolution is reused for a day (the
//! pace at which Debian's backports move), refreshed on `--force`, and kept
//! as a fallback when the mirror cannot be reached.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How long a resolution is reused before apt is asked again.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// Which packages the image is built from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Resolved {
    /// When apt answered, seconds since the epoch.
    pub at_unix: u64,
    /// The kernel ABI package (`linux-image-<abi>-cloud-amd64`).
    pub kernel_pkg: String,
    /// Its version.
    pub kernel_version: String,
    /// busybox-static's version.
    pub busybox_version: String,
    /// trixie-backports' QEMU version, when the bundle is used.
    pub qemu_bundle_version: Option<String>,
}

impl Resolved {
    /// Where it is kept in `cache`.
    pub fn path(cache: &Path) -> PathBuf {
        cache.join("resolved.json")
    }

    /// The stored resolution, if there is a readable one.
    pub fn load(cache: &Path) -> Option<Resolved> {
        let bytes = std::fs::read(Self::path(cache)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Stores it (best effort: a cache that cannot be written only costs
    /// the next start a fresh resolution).
    pub fn store(&self, cache: &Path) {
        if let Ok(bytes) = serde_json::to_vec_pretty(self) {
            let _ = std::fs::write(Self::path(cache), bytes);
        }
    }

    /// How long ago apt answered (zero if the clock went backwards).
    pub fn age(&self) -> Duration {
        Duration::from_secs(now_unix().saturating_sub(self.at_unix))
    }

    /// Whether it may be reused without asking apt.
    pub fn is_fresh(&self) -> bool {
        self.age() < MAX_AGE
    }
}

/// Now, in seconds since the epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// "3 h", "12 min", "40 s": an age for a progress line.
pub fn describe_age(age: Duration) -> String {
    let s = age.as_secs();
    if s >= 3600 {
        format!("{} h", s / 3600)
    } else if s >= 60 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_unix: u64) -> Resolved {
        Resolved {
            at_unix,
            kernel_pkg: "linux-image-6.12.95+deb12-cloud-amd64".into(),
            kernel_version: "6.12.95-1~bpo12+1".into(),
            busybox_version: "1:1.35.0-4+b3".into(),
            qemu_bundle_version: None,
        }
    }

    #[test]
    fn round_trips_and_ages() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(Resolved::load(dir.path()), None);
        let fresh = sample(now_unix() - 60);
        fresh.store(dir.path());
        assert_eq!(Resolved::load(dir.path()), Some(fresh.clone()));
        assert!(fresh.is_fresh());
        assert!(!sample(now_unix() - MAX_AGE.as_secs() - 1).is_fresh());
        // A clock set back makes it look new, not negative.
        assert_eq!(sample(now_unix() + 1000).age(), Duration::ZERO);
    }

    #[test]
    fn unreadable_file_is_no_resolution() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(Resolved::path(dir.path()), b"{not json").expect("write");
        assert_eq!(Resolved::load(dir.path()), None);
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(describe_age(Duration::from_secs(40)), "40 s");
        assert_eq!(describe_age(Duration::from_secs(12 * 60 + 5)), "12 min");
        assert_eq!(describe_age(Duration::from_secs(3 * 3600 + 100)), "3 h");
    }
}
