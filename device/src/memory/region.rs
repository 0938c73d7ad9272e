//! Memory regions a frontend shares, made harmless to the device (spec §2.3).
//!
//! A frontend shares its memory as file descriptors that the device maps.
//! An access to a mapped page past the end of its file raises SIGBUS, whose
//! default action kills the whole device and every VM on it. Three ways to
//! get there: a region longer than its file, an offset past the file's end,
//! and a file shrunk after it was mapped. The first two are refused when the
//! region is set up ([`check_region`]). The third is prevented by a seal
//! where the file allows one, and otherwise contained: SIGBUS at an address
//! inside a watched region maps zero pages over the whole region, marks its
//! node faulted and lets the access finish; the device then disconnects
//! that node ([`take_faulted`]). Nothing else notices.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

/// Why a shared region was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The file behind the region could not be examined.
    #[error("cannot stat the region's file: {0}")]
    Stat(io::Error),
    /// Only regular files (memfd, tmpfs, hugetlbfs) have a size to check.
    #[error("the region's file descriptor is not a regular file")]
    NotRegular,
    /// The region reaches past the end of its file.
    #[error("region of {len} bytes at file offset {offset} reaches past the file's end ({file_len} bytes)")]
    PastEnd {
        /// mmap offset of the region.
        offset: u64,
        /// Region length.
        len: u64,
        /// Size of the file.
        file_len: u64,
    },
    /// Every watch slot is in use.
    #[error("the device watches at most {MAX_WATCHED} shared regions")]
    TooMany,
}

/// How a checked region is protected against shrinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// The file carries `F_SEAL_SHRINK` (set by the frontend, or now by the
    /// device): it can never become shorter.
    Sealed,
    /// The file cannot be sealed (not a memfd, or sealing was not allowed
    /// when it was created): a fault is contained instead.
    Contained,
}

/// Checks that `[offset, offset + len)` lies inside the regular file
/// `file`, and seals the file against shrinking when it allows that.
pub fn check_region(file: &File, offset: u64, len: u64) -> Result<Protection, RegionError> {
    let meta = file.metadata().map_err(RegionError::Stat)?;
    if !meta.file_type().is_file() {
        return Err(RegionError::NotRegular);
    }
    let file_len = meta.len();
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(RegionError::PastEnd {
            offset,
            len,
            file_len,
        });
    }
    Ok(seal_against_shrinking(file))
}

fn seal_against_shrinking(file: &File) -> Protection {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we hold; no pointers involved.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals >= 0 && seals & libc::F_SEAL_SHRINK != 0 {
        return Protection::Sealed;
    }
    // SAFETY: as above. Fails (EPERM, EINVAL) for files that cannot be
    // sealed, which is then handled by containment.
    let added = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
    if added == 0 {
        Protection::Sealed
    } else {
        Protection::Contained
    }
}

/// Most regions watched at once, over all nodes.
pub const MAX_WATCHED: usize = 1024;
/// Most nodes one device may have.
pub const MAX_NODES: usize = 4096;
/// Watch keys a process can hand out (each node of each device started in
/// the process takes one; tests start many devices in one process).
const MAX_KEYS: usize = 1 << 16;
static NEXT_KEY: AtomicU32 = AtomicU32::new(0);

/// Reserves `n` consecutive watch keys for the nodes of one device: node
/// `i` then watches and faults under key `base + i`.
pub fn reserve_keys(n: u32) -> Result<u32, RegionError> {
    let base = NEXT_KEY.fetch_add(n, Ordering::Relaxed);
    if (base as usize).saturating_add(n as usize) > MAX_KEYS {
        return Err(RegionError::TooMany);
    }
    Ok(base)
}

const FREE: u32 = u32::MAX;

struct Slot {
    key: AtomicU32,
    start: AtomicUsize,
    end: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    key: AtomicU32::new(FREE),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
};
static SLOTS: [Slot; MAX_WATCHED] = [EMPTY_SLOT; MAX_WATCHED];
#[allow(clippy::declare_interior_mutable_const)]
const NO_FAULT: AtomicU64 = AtomicU64::new(0);
static FAULTED: [AtomicU64; MAX_KEYS / 64] = [NO_FAULT; MAX_KEYS / 64];
static PENDING: AtomicBool = AtomicBool::new(false);
static FAULTS: AtomicU64 = AtomicU64::new(0);
/// Serialises changes to `SLOTS` (the signal handler only reads them).
static WATCH_LOCK: Mutex<()> = Mutex::new(());
static INSTALL: Once = Once::new();
/// The SIGBUS disposition found at install time, for faults not ours.
static PREVIOUS_RAW: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_FLAGS: AtomicUsize = AtomicUsize::new(0);

/// Installs the SIGBUS handler (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "no handler" value; we fill
        // in a handler with the signature SA_SIGINFO requires and an empty
        // mask, and keep the previous disposition for faults not ours.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &sa, &mut old) == 0 {
                PREVIOUS_RAW.store(old.sa_sigaction, Ordering::Relaxed);
                PREVIOUS_FLAGS.store(old.sa_flags as usize, Ordering::Relaxed);
            }
        }
    });
}

/// Watches the regions of the node with watch key `key`, given as host
/// `(address, length)` ranges, replacing whatever was watched for it.
pub fn watch(key: u32, ranges: &[(usize, usize)]) -> Result<(), RegionError> {
    let _g = WATCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let free = SLOTS
        .iter()
        .filter(|s| {
            let p = s.key.load(Ordering::Relaxed);
            p == FREE || p == key
        })
        .count();
    if free < ranges.len() {
        return Err(RegionError::TooMany);
    }
    // New ranges first, old ones after: the node stays covered throughout.
    let mut added = Vec::with_capacity(ranges.len());
    for &(start, len) in ranges {
        let Some(slot) = SLOTS
            .iter()
            .enumerate()
            .find(|(_, s)| s.key.load(Ordering::Relaxed) == FREE)
        else {
            break;
        };
        slot.1.start.store(start, Ordering::Relaxed);
        slot.1
            .end
            .store(start.saturating_add(len), Ordering::Relaxed);
        slot.1.key.store(key, Ordering::Release);
        added.push(slot.0);
    }
    for (i, s) in SLOTS.iter().enumerate() {
        if s.key.load(Ordering::Relaxed) == key && !added.contains(&i) {
            s.key.store(FREE, Ordering::Release);
        }
    }
    Ok(())
}

/// Stops watching `key`'s regions (its memory is being released).
pub fn unwatch(key: u32) {
    let _g = WATCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for s in SLOTS.iter() {
        if s.key.load(Ordering::Relaxed) == key {
            s.key.store(FREE, Ordering::Release);
        }
    }
}

/// Whether some node faulted and was not taken yet: one relaxed load,
/// cheap enough for the engine's loop.
pub fn pending() -> bool {
    PENDING.load(Ordering::Relaxed)
}

/// The keys in `[base, base + n)` whose memory faulted since the last
/// call, each once.
pub fn take_faulted(base: u32, n: u32) -> Vec<u32> {
    let mut keys = Vec::new();
    for key in base..base.saturating_add(n).min(MAX_KEYS as u32) {
        let (word, bit) = (&FAULTED[key as usize / 64], 1u64 << (key % 64));
        if word.load(Ordering::Acquire) & bit != 0
            && word.fetch_and(!bit, Ordering::AcqRel) & bit != 0
        {
            keys.push(key);
        }
    }
    if FAULTED.iter().all(|w| w.load(Ordering::Acquire) == 0) {
        PENDING.store(false, Ordering::Release);
    }
    keys
}

/// Faults contained since the device started.
pub fn fault_count() -> u64 {
    FAULTS.load(Ordering::Relaxed)
}

/// The SIGBUS handler. Async-signal-safe: atomics and one mmap only.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in SLOTS.iter() {
        let key = slot.key.load(Ordering::Acquire);
        if key == FREE {
            continue;
        }
        let (start, end) = (
            slot.start.load(Ordering::Relaxed),
            slot.end.load(Ordering::Relaxed),
        );
        if addr < start || addr >= end {
            continue;
        }
        // Replace the whole region with zero pages: its node is lost
        // anyway, and a region-sized mapping suits any page size (a 4 KiB
        // mapping cannot split a hugetlbfs region).
        // SAFETY: [start, end) is a mapping the device made of this node's
        // shared file; replacing it keeps the range mapped (so no other
        // mapping can land there) and only ever affects that node's view.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            break;
        }
        if let Some(word) = FAULTED.get(key as usize / 64) {
            word.fetch_or(1 << (key % 64), Ordering::AcqRel);
        }
        FAULTS.fetch_add(1, Ordering::Relaxed);
        PENDING.store(true, Ordering::Release);
        return;
    }
    // Not a shared region: behave as if this handler did not exist.
    let prev = PREVIOUS_RAW.load(Ordering::Relaxed);
    let flags = PREVIOUS_FLAGS.load(Ordering::Relaxed) as libc::c_int;
    if prev != libc::SIG_DFL && prev != libc::SIG_IGN && flags & libc::SA_SIGINFO != 0 {
        // SAFETY: `prev` is the SA_SIGINFO handler that was installed before
        // ours, called with the arguments we were given.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
        return;
    }
    // SAFETY: resetting to the default action; returning re-executes the
    // faulting access, which then terminates the process as it would have.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn memfd(len: u64, sealing: bool) -> File {
        let flags = libc::MFD_CLOEXEC | if sealing { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: valid NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"ulnic-region-test".as_ptr(), flags) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn regions_past_the_end_are_refused() {
        let f = memfd(8192, true);
        assert!(matches!(
            check_region(&f, 0, 8193),
            Err(RegionError::PastEnd { .. })
        ));
        assert!(matches!(
            check_region(&f, 8192, 1),
            Err(RegionError::PastEnd { .. })
        ));
        assert!(matches!(
            check_region(&f, u64::MAX, 2),
            Err(RegionError::PastEnd { .. })
        ));
        assert_eq!(check_region(&f, 4096, 4096).unwrap(), Protection::Sealed);
        // Sealed now: the file can no longer shrink.
        assert!(f.set_len(4096).is_err());
    }

    #[test]
    fn a_fault_in_a_watched_region_is_contained_and_reported() {
        install();
        let key = reserve_keys(1).unwrap();
        let f = memfd(4 * 4096, false);
        // SAFETY: mapping a file we own; unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        watch(key, &[(p as usize, 4 * 4096)]).unwrap();
        f.set_len(4096).unwrap();
        // SAFETY: inside the mapping; the page is past the file's new end,
        // which the handler turns into a zero page.
        let v = unsafe { std::ptr::read_volatile((p as *const u8).add(2 * 4096 + 5)) };
        assert_eq!(v, 0);
        assert_eq!(take_faulted(key, 1), vec![key]);
        assert!(take_faulted(key, 1).is_empty(), "reported once");
        unwatch(key);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 4 * 4096) };
    }

    #[test]
    fn unsealable_files_are_contained_and_pipes_refused() {
        let f = memfd(8192, false);
        assert_eq!(check_region(&f, 0, 8192).unwrap(), Protection::Contained);
        let (r, mut w) = std::io::pipe().unwrap();
        w.write_all(b"x").unwrap();
        let r: File = std::os::fd::OwnedFd::from(r).into();
        assert!(matches!(
            check_region(&r, 0, 1),
            Err(RegionError::NotRegular)
        ));
    }
}
