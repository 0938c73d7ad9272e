//! Checked access to a driver's memory, and the segment translation table.
//!
//! Every access goes through vm-memory, which refuses addresses outside the
//! regions the frontend shared: a hostile address yields an error, never an
//! access outside what the guest granted.

use std::sync::atomic::{fence, Ordering};

use ulnic_abi::PAGE_SIZE;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryLoadGuard,
    GuestMemoryMmap, VolatileMemory, VolatileSlice,
};

/// The memory of one node's frontend, as the vhost-user backend hands it over.
pub type NodeMemory = GuestMemoryAtomic<GuestMemoryMmap<()>>;
/// A snapshot of that memory, valid while held.
pub type MemGuard = GuestMemoryLoadGuard<GuestMemoryMmap<()>>;

/// A guest address was outside the shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("guest address range {addr:#x}+{len} is outside the shared memory")]
pub struct BadAddress {
    /// Start of the range.
    pub addr: u64,
    /// Length of the range.
    pub len: u64,
}

/// Loads a little-endian u32 with acquire ordering.
pub fn load_u32(mem: &GuestMemoryMmap<()>, addr: u64) -> Result<u32, BadAddress> {
    mem.load::<u32>(GuestAddress(addr), Ordering::Acquire)
        .map(u32::from_le)
        .map_err(|_| BadAddress { addr, len: 4 })
}

/// Stores a little-endian u32 with release ordering.
pub fn store_u32(mem: &GuestMemoryMmap<()>, addr: u64, val: u32) -> Result<(), BadAddress> {
    mem.store(val.to_le(), GuestAddress(addr), Ordering::Release)
        .map_err(|_| BadAddress { addr, len: 4 })
}

/// Atomically exchanges the u64 at `addr` (8-byte aligned) with `val`;
/// returns the old value as stored (little endian).
pub fn swap_u64(mem: &GuestMemoryMmap<()>, addr: u64, val: u64) -> Result<u64, BadAddress> {
    let bad = BadAddress { addr, len: 8 };
    let slice = mem.get_slice(GuestAddress(addr), 8).map_err(|_| bad)?;
    let word = slice
        .get_atomic_ref::<std::sync::atomic::AtomicU64>(0)
        .map_err(|_| bad)?;
    Ok(word.swap(val, Ordering::AcqRel))
}

/// Full fence between our stores and our subsequent loads (the doorbell and
/// notification handshakes are Dekker-style and need it).
pub fn full_fence() {
    fence(Ordering::SeqCst);
}

/// Copies guest bytes at `addr` into `buf`.
pub fn read(mem: &GuestMemoryMmap<()>, addr: u64, buf: &mut [u8]) -> Result<(), BadAddress> {
    mem.read_slice(buf, GuestAddress(addr))
        .map_err(|_| BadAddress {
            addr,
            len: buf.len() as u64,
        })
}

/// Copies `buf` into guest memory at `addr`.
pub fn write(mem: &GuestMemoryMmap<()>, addr: u64, buf: &[u8]) -> Result<(), BadAddress> {
    mem.write_slice(buf, GuestAddress(addr))
        .map_err(|_| BadAddress {
            addr,
            len: buf.len() as u64,
        })
}

/// Whether `[addr, addr+len)` lies entirely in shared memory.
pub fn range_ok(mem: &GuestMemoryMmap<()>, addr: u64, len: u64) -> bool {
    match (addr.checked_add(len), usize::try_from(len)) {
        (Some(_), Ok(l)) => len == 0 || mem.check_range(GuestAddress(addr), l),
        _ => false,
    }
}

/// A physically contiguous piece of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Offset of the piece within the segment.
    pub seg_offset: u64,
    /// Guest-physical address of the piece.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u64,
}

/// An endpoint's segment: the device's copy of the page table the driver
/// supplied at creation, with adjacent pages merged into extents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segment {
    extents: Vec<Extent>,
    len: u64,
}

impl Segment {
    /// Builds a segment from page addresses, checking each page lies in
    /// shared memory and is page aligned.
    pub fn from_pages(
        mem: &GuestMemoryMmap<()>,
        pages: impl IntoIterator<Item = u64>,
    ) -> Result<Segment, BadAddress> {
        let mut seg = Segment::default();
        for gpa in pages {
            seg.push_page(mem, gpa)?;
        }
        Ok(seg)
    }

    /// Appends a page, checking it lies in shared memory and is aligned.
    pub fn push_page(&mut self, mem: &GuestMemoryMmap<()>, gpa: u64) -> Result<(), BadAddress> {
        if !gpa.is_multiple_of(PAGE_SIZE) || !range_ok(mem, gpa, PAGE_SIZE) {
            return Err(BadAddress {
                addr: gpa,
                len: PAGE_SIZE,
            });
        }
        match self.extents.last_mut() {
            Some(last) if last.gpa + last.len == gpa => last.len += PAGE_SIZE,
            _ => self.extents.push(Extent {
                seg_offset: self.len,
                gpa,
                len: PAGE_SIZE,
            }),
        }
        self.len += PAGE_SIZE;
        Ok(())
    }

    /// Empties the segment, keeping its allocation.
    pub fn clear(&mut self) {
        self.extents.clear();
        self.len = 0;
    }

    /// Segment length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the segment is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of physically contiguous extents.
    pub fn extents(&self) -> usize {
        self.extents.len()
    }

    /// Whether `[offset, offset+len)` lies inside the segment.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// The guest-physical pieces of `[offset, offset+len)`, in order. The
    /// caller checked `contains`.
    pub fn pieces(&self, offset: u64, len: u64) -> Pieces<'_> {
        let first = self
            .extents
            .partition_point(|e| e.seg_offset + e.len <= offset);
        Pieces {
            seg: self,
            idx: first,
            offset,
            remaining: len,
        }
    }
}

/// Iterator over `(gpa, len)` pieces of a segment range.
pub struct Pieces<'a> {
    seg: &'a Segment,
    idx: usize,
    offset: u64,
    remaining: u64,
}

impl Iterator for Pieces<'_> {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.remaining == 0 {
            return None;
        }
        let e = self.seg.extents.get(self.idx)?;
        let within = self.offset - e.seg_offset;
        let n = (e.len - within).min(self.remaining);
        self.idx += 1;
        self.offset += n;
        self.remaining -= n;
        Some((e.gpa + within, n))
    }
}

/// Copies `len` bytes from a source segment range to a destination segment
/// range, possibly in different nodes' memories. Both ranges were checked
/// with `Segment::contains`; each piece is still checked by vm-memory.
pub fn copy_between(
    src_mem: &GuestMemoryMmap<()>,
    src: &Segment,
    src_off: u64,
    dst_mem: &GuestMemoryMmap<()>,
    dst: &Segment,
    dst_off: u64,
    len: u64,
) -> Result<(), BadAddress> {
    let mut dst_pieces = dst.pieces(dst_off, len);
    let mut cur_dst: Option<(u64, u64)> = None;
    for (mut sgpa, mut slen) in src.pieces(src_off, len) {
        while slen > 0 {
            let (dgpa, dlen) = match cur_dst.take() {
                Some(p) => p,
                None => dst_pieces.next().ok_or(BadAddress { addr: dst_off, len })?,
            };
            let n = slen.min(dlen);
            let bad_src = BadAddress { addr: sgpa, len: n };
            let s = src_mem
                .get_slice(GuestAddress(sgpa), n as usize)
                .map_err(|_| bad_src)?;
            let d = dst_mem
                .get_slice(GuestAddress(dgpa), n as usize)
                .map_err(|_| BadAddress { addr: dgpa, len: n })?;
            copy_in_chunks(&s, &d);
            sgpa += n;
            slen -= n;
            if dlen > n {
                cur_dst = Some((dgpa + n, dlen - n));
            }
        }
    }
    Ok(())
}

/// Largest piece handed to one `memcpy`. glibc copies larger blocks with
/// `rep movsb`, which on AMD EPYC under KVM runs at about 2.7 GB/s when
/// source and destination share their offset within a page (segment
/// buffers are page-aligned, so they usually do); below its threshold it
/// uses vector moves, at about 21 GB/s there (`ulnic bench rdma-write`).
pub const COPY_CHUNK: usize = 2048;

/// Copies `src` into `dst` (equal lengths) in `COPY_CHUNK` pieces.
fn copy_in_chunks<B: BitmapSlice>(src: &VolatileSlice<'_, B>, dst: &VolatileSlice<'_, B>) {
    let len = src.len().min(dst.len());
    let mut off = 0;
    while off < len {
        let n = COPY_CHUNK.min(len - off);
        // Both slices are at least `len` long, so neither subslice fails.
        if let (Ok(s), Ok(d)) = (src.subslice(off, n), dst.subslice(off, n)) {
            s.copy_to_volatile_slice(d);
        }
        off += n;
    }
}

/// Writes `data` into a segment range (checked by the caller).
pub fn write_segment(
    mem: &GuestMemoryMmap<()>,
    seg: &Segment,
    off: u64,
    data: &[u8],
) -> Result<(), BadAddress> {
    let mut done = 0usize;
    for (gpa, n) in seg.pieces(off, data.len() as u64) {
        write(mem, gpa, &data[done..done + n as usize])?;
        done += n as usize;
    }
    Ok(())
}

/// Stores a 4- or 8-byte little-endian value at a segment offset aligned to
/// its size (checked by the caller) with one atomic store, so a reader never
/// sees half of it.
pub fn store_segment_word(
    mem: &GuestMemoryMmap<()>,
    seg: &Segment,
    off: u64,
    val: u64,
    size: u32,
) -> Result<(), BadAddress> {
    let bad = BadAddress {
        addr: off,
        len: u64::from(size),
    };
    // Aligned and at most 8 bytes: never crosses a page, so one piece.
    let (gpa, n) = seg.pieces(off, u64::from(size)).next().ok_or(bad)?;
    if n != u64::from(size) {
        return Err(bad);
    }
    let r = if size == 4 {
        mem.store((val as u32).to_le(), GuestAddress(gpa), Ordering::Release)
    } else {
        mem.store(val.to_le(), GuestAddress(gpa), Ordering::Release)
    };
    r.map_err(|_| bad)
}

/// Reads a segment range (checked by the caller) into `buf`.
pub fn read_segment(
    mem: &GuestMemoryMmap<()>,
    seg: &Segment,
    off: u64,
    buf: &mut [u8],
) -> Result<(), BadAddress> {
    let mut done = 0usize;
    let len = buf.len() as u64;
    for (gpa, n) in seg.pieces(off, len) {
        read(mem, gpa, &mut buf[done..done + n as usize])?;
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn mem(size: usize) -> GuestMemoryMmap<()> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).unwrap()
    }

    #[test]
    fn segment_merges_adjacent_pages_and_translates() {
        let m = mem(1 << 20);
        let seg = Segment::from_pages(&m, [0x1000, 0x2000, 0x8000, 0x3000]).unwrap();
        assert_eq!(seg.len(), 4 * 4096);
        assert_eq!(seg.extents(), 3);
        let p: Vec<_> = seg.pieces(0x1ff0, 0x20).collect();
        assert_eq!(p, vec![(0x2ff0, 0x10), (0x8000, 0x10)]);
        let p: Vec<_> = seg.pieces(0x3000, 0x1000).collect();
        assert_eq!(p, vec![(0x3000, 0x1000)]);
        assert!(seg.contains(0, 4 * 4096));
        assert!(!seg.contains(1, 4 * 4096));
        assert!(!seg.contains(u64::MAX, 2));
    }

    #[test]
    fn segment_rejects_unaligned_and_outside_pages() {
        let m = mem(1 << 16);
        assert!(Segment::from_pages(&m, [0x1001]).is_err());
        assert!(Segment::from_pages(&m, [0x10000]).is_err());
        assert!(Segment::from_pages(&m, [!0xfffu64]).is_err());
    }

    #[test]
    fn copy_between_scattered_segments() {
        let m = mem(1 << 20);
        let a = Segment::from_pages(&m, [0x10000, 0x30000, 0x50000]).unwrap();
        let b = Segment::from_pages(&m, [0x80000, 0x70000]).unwrap();
        let data: Vec<u8> = (0..6000u32).map(|i| (i * 7) as u8).collect();
        write_segment(&m, &a, 3000, &data).unwrap();
        copy_between(&m, &a, 3000, &m, &b, 100, 6000).unwrap();
        let mut out = vec![0u8; 6000];
        read_segment(&m, &b, 100, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn range_checks() {
        let m = mem(1 << 16);
        assert!(range_ok(&m, 0, 1 << 16));
        assert!(!range_ok(&m, 1, 1 << 16));
        assert!(!range_ok(&m, u64::MAX, 2));
        assert!(load_u32(&m, 1 << 16).is_err());
    }
}
