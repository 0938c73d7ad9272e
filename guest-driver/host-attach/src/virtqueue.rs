//! The driver side of a split virtqueue (virtio 1.x §2.7), just enough for
//! the control and notification queues: add a chain, publish it, reap used
//! entries.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{fence, Ordering};

use ulnic_abi::PAGE_SIZE;
use virtio_bindings::virtio_ring::{
    vring_avail, vring_used, vring_used_elem, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::ByteValued;
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::error::Error;
use crate::memory::{DmaBuffer, DmaMemory};

/// The largest queue this driver sets up: each of its three rings then
/// fits in one page.
pub const MAX_SIZE: u16 = 256;
const _: () = assert!(size_of::<Descriptor>() * MAX_SIZE as usize <= PAGE_SIZE as usize);
const _: () = assert!(
    offset_of!(vring_used, ring) + size_of::<vring_used_elem>() * MAX_SIZE as usize
        <= PAGE_SIZE as usize
);

/// A used-ring element as the device writes it (little endian): the
/// layout of virtio-bindings' `vring_used_elem`, whose fields are native.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct UsedElem {
    id: U32,
    len: U32,
}
const _: () = assert!(size_of::<UsedElem>() == size_of::<vring_used_elem>());

/// One split virtqueue in shared memory.
pub struct DriverQueue {
    size: u16,
    mem: DmaBuffer,
    free: Vec<u16>,
    avail_idx: u16,
    last_used: u16,
    /// Descriptors in each chain, by head, to free them on completion.
    chains: Vec<Vec<u16>>,
}

impl DriverQueue {
    /// Allocates the rings for a queue of `size` entries.
    pub fn new(mem: &DmaMemory, size: u16) -> Result<DriverQueue, Error> {
        // Three pages: descriptor table, available ring, used ring.
        debug_assert!(size <= MAX_SIZE);
        let buf = mem.alloc(3 * PAGE_SIZE as usize)?;
        Ok(DriverQueue {
            size,
            mem: buf,
            free: (0..size).rev().collect(),
            avail_idx: 0,
            last_used: 0,
            chains: vec![Vec::new(); usize::from(size)],
        })
    }

    /// Address of the descriptor table.
    pub fn desc_gpa(&self) -> u64 {
        self.mem.gpa
    }
    /// Address of the available ring.
    pub fn avail_gpa(&self) -> u64 {
        self.mem.gpa + PAGE_SIZE
    }
    /// Address of the used ring.
    pub fn used_gpa(&self) -> u64 {
        self.mem.gpa + 2 * PAGE_SIZE
    }

    /// Adds a chain of device-readable then device-writable buffers and
    /// publishes it. Panics if the queue is full (callers bound their use).
    pub fn add(&mut self, mem: &DmaMemory, readable: &[(u64, u32)], writable: &[(u64, u32)]) {
        let total = readable.len() + writable.len();
        assert!(
            total > 0 && total <= self.free.len(),
            "virtqueue overcommitted"
        );
        let ids: Vec<u16> = (0..total).filter_map(|_| self.free.pop()).collect();
        let all = readable
            .iter()
            .map(|b| (b, 0))
            .chain(writable.iter().map(|b| (b, VRING_DESC_F_WRITE as u16)));
        for (i, (&(addr, len), flags)) in all.enumerate() {
            let next = ids.get(i + 1).copied();
            let f = flags
                | if next.is_some() {
                    VRING_DESC_F_NEXT as u16
                } else {
                    0
                };
            let d = Descriptor::new(addr, len, f, next.unwrap_or(0));
            let at = u64::from(ids[i]) * size_of::<Descriptor>() as u64;
            mem.write(self.desc_gpa() + at, d.as_slice());
        }
        let head = ids[0];
        let slot = u64::from(self.avail_idx % self.size);
        let ring = offset_of!(vring_avail, ring) as u64;
        mem.store_u16(self.avail_gpa() + ring + 2 * slot, head);
        self.chains[usize::from(head)] = ids;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        fence(Ordering::Release);
        mem.store_u16(
            self.avail_gpa() + offset_of!(vring_avail, idx) as u64,
            self.avail_idx,
        );
        fence(Ordering::SeqCst);
    }

    /// Takes the next used entry: (head, bytes written).
    pub fn pop_used(&mut self, mem: &DmaMemory) -> Option<(u16, u32)> {
        let used_idx = mem.load_u16(self.used_gpa() + offset_of!(vring_used, idx) as u64);
        if used_idx == self.last_used {
            return None;
        }
        let slot = u64::from(self.last_used % self.size);
        let mut e = UsedElem::new_zeroed();
        let at = offset_of!(vring_used, ring) as u64 + size_of::<UsedElem>() as u64 * slot;
        mem.read(self.used_gpa() + at, e.as_mut_bytes());
        self.last_used = self.last_used.wrapping_add(1);
        let (id, len) = (e.id.get(), e.len.get());
        let head = u16::try_from(id).ok().filter(|h| *h < self.size)?;
        let ids = std::mem::take(&mut self.chains[usize::from(head)]);
        self.free.extend(ids);
        Some((head, len))
    }
}
