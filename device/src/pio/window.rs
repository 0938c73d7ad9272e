//! PIO windows' memory and the ranges of a frontend's aperture (spec
//! §6.2): state only.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use ulnic_abi::PAGE_SIZE;

/// A window's memory: a sealed memfd the device owns, zero-filled, so a
/// frontend that maps it is never handed the exporter's own memory.
#[derive(Debug)]
pub struct WindowFile {
    /// The file, handed to frontends with `SHMEM_MAP`.
    pub fd: OwnedFd,
    /// Its size: whole pages.
    pub bytes: u64,
}

impl WindowFile {
    /// A new window of `pages` zero-filled pages.
    pub fn create(pages: u32) -> io::Result<WindowFile> {
        let bytes = u64::from(pages) * PAGE_SIZE;
        // SAFETY: the name is a NUL-terminated literal; the flags are valid.
        let raw = unsafe {
            libc::memfd_create(
                c"ulnic-pio".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` was just returned by memfd_create and is owned by
        // nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `raw` is the open memfd owned by `fd`.
        if unsafe { libc::ftruncate(raw, bytes as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // A frontend that could shrink the file would make the others'
        // mappings fault; none can once it is sealed.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above; F_ADD_SEALS takes an int.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WindowFile { fd, bytes })
    }
}

/// The page-aligned ranges in use in one aperture, handed out first fit.
#[derive(Debug, Default)]
pub struct Ranges {
    size: u64,
    /// Offset to length of each range in use.
    used: BTreeMap<u64, u64>,
}

impl Ranges {
    /// An empty aperture of `size` bytes.
    pub fn new(size: u64) -> Ranges {
        Ranges {
            size,
            used: BTreeMap::new(),
        }
    }

    /// The lowest free range of `len` bytes (a multiple of the page
    /// size), now in use; `None` when no gap is that long.
    pub fn take(&mut self, len: u64) -> Option<u64> {
        let mut at = 0u64;
        for (&off, &l) in &self.used {
            if off - at >= len {
                break;
            }
            at = off + l;
        }
        if at.checked_add(len)? > self.size {
            return None;
        }
        self.used.insert(at, len);
        Some(at)
    }

    /// Frees the range at `offset`.
    pub fn free(&mut self, offset: u64) {
        self.used.remove(&offset);
    }

    /// Bytes in use.
    pub fn in_use(&self) -> u64 {
        self.used.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_first_fit_and_reused_once_freed() {
        let mut r = Ranges::new(16 * PAGE_SIZE);
        let a = r.take(4 * PAGE_SIZE).unwrap();
        let b = r.take(8 * PAGE_SIZE).unwrap();
        let c = r.take(4 * PAGE_SIZE).unwrap();
        assert_eq!((a, b, c), (0, 4 * PAGE_SIZE, 12 * PAGE_SIZE));
        assert_eq!(r.take(PAGE_SIZE), None, "full");
        r.free(b);
        assert_eq!(r.take(9 * PAGE_SIZE), None, "the gap is 8 pages");
        assert_eq!(r.take(2 * PAGE_SIZE), Some(4 * PAGE_SIZE));
        assert_eq!(r.take(6 * PAGE_SIZE), Some(6 * PAGE_SIZE));
        assert_eq!(r.in_use(), 16 * PAGE_SIZE);
    }

    #[test]
    fn a_window_file_is_zeroed_sealed_and_sized() {
        let w = WindowFile::create(3).unwrap();
        assert_eq!(w.bytes, 3 * PAGE_SIZE);
        let f = std::fs::File::from(w.fd.try_clone().unwrap());
        assert_eq!(f.metadata().unwrap().len(), 3 * PAGE_SIZE);
        assert!(f.set_len(PAGE_SIZE).is_err(), "sealed against shrinking");
    }
}
