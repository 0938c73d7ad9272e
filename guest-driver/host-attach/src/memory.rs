//! The memory a host-attached process shares with the device: one memfd,
//! mapped here and sent to the device, with a small page allocator on top.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::error::Error;

const PAGE: usize = 4096;

/// A block of shared memory: its device-visible address and where it is mapped here.
#[derive(Debug, Clone, Copy)]
pub struct DmaBuffer {
    /// Address the device uses (offset into the shared memory).
    pub gpa: u64,
    /// Where it is mapped in this process.
    pub ptr: NonNull<u8>,
    /// Length in bytes (a multiple of the page size).
    pub len: usize,
}

// SAFETY: a DmaBuffer is an address range in a mapping that lives as long as
// its DmaMemory; sending the description between threads is harmless.
unsafe impl Send for DmaBuffer {}
// SAFETY: as above; access through it goes through atomics or is the
// owner's responsibility.
unsafe impl Sync for DmaBuffer {}

/// The shared memory.
pub struct DmaMemory {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    /// Free page runs (first page, count), kept sorted and merged.
    free: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: the mapping is shared memory meant for concurrent access; the
// allocator state is behind a mutex.
unsafe impl Send for DmaMemory {}
// SAFETY: as above.
unsafe impl Sync for DmaMemory {}

impl DmaMemory {
    /// Creates and maps `len` bytes (rounded up to pages), sealed so that
    /// its size can never change (spec §2.3: the device relies on it).
    pub fn new(len: usize) -> Result<DmaMemory, Error> {
        Self::with_sealing(len, true)
    }

    /// As [`DmaMemory::new`]; `seal: false` leaves the file resizable and
    /// unsealable, which the device tolerates by containing faults. For
    /// testing that containment; drivers use [`DmaMemory::new`].
    pub fn with_sealing(len: usize, seal: bool) -> Result<DmaMemory, Error> {
        let len = len.div_ceil(PAGE) * PAGE;
        let os = |what| move |source| Error::Os { what, source };
        let flags = libc::MFD_CLOEXEC | if seal { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: the name is a valid NUL-terminated string.
        let raw = unsafe { libc::memfd_create(c"ulnic-host-attach".as_ptr(), flags) };
        if raw < 0 {
            return Err(os("memfd_create")(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on an fd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os("ftruncate shared memory")(
                std::io::Error::last_os_error(),
            ));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own; no pointers.
        if seal && unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os("seal shared memory")(std::io::Error::last_os_error()));
        }
        let p = map_shared(fd.as_raw_fd(), len, 0).map_err(os("mmap shared memory"))?;
        let base = NonNull::new(p).ok_or(Error::OutOfMemory(len))?;
        Ok(DmaMemory {
            fd,
            base,
            len,
            free: Mutex::new(vec![(0, len / PAGE)]),
        })
    }

    /// Total size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory is empty (never, once created).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the memory is mapped in this process.
    pub fn host_base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Allocates zeroed, page-aligned memory.
    pub fn alloc(&self, len: usize) -> Result<DmaBuffer, Error> {
        let pages = len.max(1).div_ceil(PAGE);
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = free
            .iter()
            .position(|&(_, n)| n >= pages)
            .ok_or(Error::OutOfMemory(len))?;
        let (first, n) = free[i];
        if n == pages {
            free.remove(i);
        } else {
            free[i] = (first + pages, n - pages);
        }
        drop(free);
        let off = first * PAGE;
        // SAFETY: `off + pages*PAGE <= self.len`, inside the mapping.
        let ptr = unsafe { self.base.as_ptr().add(off) };
        // SAFETY: the range is ours (just allocated) and inside the mapping.
        unsafe { std::ptr::write_bytes(ptr, 0, pages * PAGE) };
        Ok(DmaBuffer {
            gpa: off as u64,
            ptr: NonNull::new(ptr).ok_or(Error::OutOfMemory(len))?,
            len: pages * PAGE,
        })
    }

    /// Returns a buffer from `alloc`.
    pub fn free(&self, buf: DmaBuffer) {
        let (first, n) = (buf.gpa as usize / PAGE, buf.len / PAGE);
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let i = free.partition_point(|&(f, _)| f < first);
        free.insert(i, (first, n));
        // Merge with neighbours.
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }

    fn check(&self, gpa: u64, len: usize) -> usize {
        let off = gpa as usize;
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "driver bug: {gpa:#x}+{len} outside shared memory"
        );
        off
    }

    /// Copies bytes into shared memory.
    pub fn write(&self, gpa: u64, data: &[u8]) {
        let off = self.check(gpa, data.len());
        // SAFETY: range checked above; the device may read concurrently,
        // which is the point of shared memory (plain bytes, no references).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(off), data.len())
        };
    }

    /// Copies bytes out of shared memory.
    pub fn read(&self, gpa: u64, out: &mut [u8]) {
        let off = self.check(gpa, out.len());
        // SAFETY: range checked above.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
    }

    /// An atomic view of the aligned u32 at `gpa`.
    pub fn atomic_u32(&self, gpa: u64) -> &AtomicU32 {
        let off = self.check(gpa, 4);
        assert!(off.is_multiple_of(4), "unaligned atomic at {gpa:#x}");
        // SAFETY: in range, aligned, and the mapping outlives `&self`;
        // AtomicU32 has the layout of u32 and tolerates concurrent access.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// An atomic view of the aligned u16 at `gpa`.
    pub fn atomic_u16(&self, gpa: u64) -> &std::sync::atomic::AtomicU16 {
        let off = self.check(gpa, 2);
        assert!(off.is_multiple_of(2), "unaligned atomic at {gpa:#x}");
        // SAFETY: as for `atomic_u32`.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(off)
                .cast::<std::sync::atomic::AtomicU16>()
        }
    }

    /// Release-stores `v` at `gpa`.
    pub fn store_u16(&self, gpa: u64, v: u16) {
        self.atomic_u16(gpa).store(v.to_le(), Ordering::Release);
    }
}

/// Maps `len` bytes of `fd` at `offset`, shared and read-write, where the
/// kernel chooses. Shared by every place that maps device or ring memory.
pub fn map_shared(fd: RawFd, len: usize, offset: u64) -> std::io::Result<*mut u8> {
    let off = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
    // SAFETY: a new mapping at an address the kernel picks cannot alias
    // anything of ours; the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

impl AsRawFd for DmaMemory {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for DmaMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `new`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_merges() {
        let m = DmaMemory::new(16 * PAGE).unwrap();
        let a = m.alloc(1).unwrap();
        let b = m.alloc(PAGE * 2).unwrap();
        let c = m.alloc(PAGE).unwrap();
        assert_eq!((a.gpa, b.gpa, c.gpa), (0, 4096, 3 * 4096));
        m.free(b);
        m.free(a);
        m.free(c);
        assert_eq!(*m.free.lock().unwrap(), vec![(0, 16)]);
        assert!(m.alloc(17 * PAGE).is_err());
    }
}
