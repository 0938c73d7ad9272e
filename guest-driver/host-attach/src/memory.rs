//! The memory a host-attached process shares with the device: one memfd,
//! mapped here through vm-memory and sent to the device, with a small page
//! allocator on top.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileMemory,
};

use crate::error::Error;

const PAGE: usize = ulnic_abi::PAGE_SIZE as usize;

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

/// The shared memory: a memfd mapped through vm-memory (one region at
/// guest address 0), with a page allocator on top.
pub struct DmaMemory {
    mem: GuestMemoryMmap<()>,
    file: Arc<File>,
    /// Where the region is mapped here (an address, kept as a number so the
    /// memory stays Send and Sync without help).
    base: usize,
    len: usize,
    /// Free page runs (first page, count), kept sorted and merged.
    free: Mutex<Vec<(usize, usize)>>,
}

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
        let file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        file.set_len(len as u64).map_err(os("size shared memory"))?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor we own; no pointers.
        if seal && unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os("seal shared memory")(std::io::Error::last_os_error()));
        }
        let file = Arc::new(file);
        let mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            len,
            Some(FileOffset::from_arc(file.clone(), 0)),
        )])
        .map_err(|e| os("map shared memory")(std::io::Error::other(e)))?;
        let base = mem
            .get_host_address(GuestAddress(0))
            .map_err(|e| os("map shared memory")(std::io::Error::other(e)))?
            as usize;
        Ok(DmaMemory {
            mem,
            file,
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

    /// Bytes allocated now (whole pages).
    pub fn in_use(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        self.len - free.iter().map(|&(_, n)| n * PAGE).sum::<usize>()
    }

    /// Where the memory is mapped in this process.
    pub fn host_base(&self) -> *mut u8 {
        self.base as *mut u8
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
        let gpa = GuestAddress((first * PAGE) as u64);
        let bytes = pages * PAGE;
        // Reused pages start zeroed, like fresh ones.
        self.mem
            .write_slice(&vec![0u8; bytes], gpa)
            .map_err(|_| Error::OutOfMemory(len))?;
        let ptr = self
            .mem
            .get_host_address(gpa)
            .ok()
            .and_then(NonNull::new)
            .ok_or(Error::OutOfMemory(len))?;
        Ok(DmaBuffer {
            gpa: gpa.0,
            ptr,
            len: bytes,
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

    /// Copies bytes into shared memory. The driver only names its own
    /// allocations: a range outside is a bug in this crate.
    pub fn write(&self, gpa: u64, data: &[u8]) {
        if let Err(e) = self.mem.write_slice(data, GuestAddress(gpa)) {
            panic!(
                "driver bug: {gpa:#x}+{} outside shared memory: {e}",
                data.len()
            );
        }
    }

    /// Copies bytes out of shared memory.
    pub fn read(&self, gpa: u64, out: &mut [u8]) {
        if let Err(e) = self.mem.read_slice(out, GuestAddress(gpa)) {
            panic!(
                "driver bug: {gpa:#x}+{} outside shared memory: {e}",
                out.len()
            );
        }
    }

    /// Acquire-loads the little-endian u32 at `gpa`.
    pub fn load_u32(&self, gpa: u64) -> u32 {
        match self.mem.load::<u32>(GuestAddress(gpa), Ordering::Acquire) {
            Ok(v) => u32::from_le(v),
            Err(e) => panic!("driver bug: u32 at {gpa:#x}: {e}"),
        }
    }

    /// Release-stores `v` (little endian) at `gpa`.
    pub fn store_u32(&self, gpa: u64, v: u32) {
        if let Err(e) = self
            .mem
            .store(v.to_le(), GuestAddress(gpa), Ordering::Release)
        {
            panic!("driver bug: u32 at {gpa:#x}: {e}");
        }
    }

    /// Atomically ORs `bits` into the little-endian u64 at `gpa` (8-byte
    /// aligned), with release ordering.
    pub fn fetch_or_u64(&self, gpa: u64, bits: u64) {
        let slice = match self.mem.get_slice(GuestAddress(gpa), 8) {
            Ok(s) => s,
            Err(e) => panic!("driver bug: u64 at {gpa:#x}: {e}"),
        };
        match slice.get_atomic_ref::<AtomicU64>(0) {
            Ok(w) => {
                w.fetch_or(bits.to_le(), Ordering::AcqRel);
            }
            Err(e) => panic!("driver bug: u64 at {gpa:#x}: {e}"),
        }
    }

    /// Acquire-loads the little-endian u16 at `gpa`.
    pub fn load_u16(&self, gpa: u64) -> u16 {
        match self.mem.load::<u16>(GuestAddress(gpa), Ordering::Acquire) {
            Ok(v) => u16::from_le(v),
            Err(e) => panic!("driver bug: u16 at {gpa:#x}: {e}"),
        }
    }

    /// Release-stores `v` (little endian) at `gpa`.
    pub fn store_u16(&self, gpa: u64, v: u16) {
        if let Err(e) = self
            .mem
            .store(v.to_le(), GuestAddress(gpa), Ordering::Release)
        {
            panic!("driver bug: u16 at {gpa:#x}: {e}");
        }
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
        self.file.as_raw_fd()
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
