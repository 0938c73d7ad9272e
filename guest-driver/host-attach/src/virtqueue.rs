//! The driver side of a split virtqueue (virtio 1.x §2.7), just enough for
//! the control and notification queues: add a chain, publish it, reap used
//! entries.

use std::sync::atomic::{fence, Ordering};

use crate::error::Error;
use crate::memory::{DmaBuffer, DmaMemory};

const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;

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
        // Three pages: descriptor table, available ring, used ring (sizes <= 256).
        let buf = mem.alloc(3 * 4096)?;
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
        self.mem.gpa + 4096
    }
    /// Address of the used ring.
    pub fn used_gpa(&self) -> u64 {
        self.mem.gpa + 8192
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
            .chain(writable.iter().map(|b| (b, VIRTQ_DESC_F_WRITE)));
        for (i, (&(addr, len), flags)) in all.enumerate() {
            let next = ids.get(i + 1).copied();
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            let f = flags | if next.is_some() { VIRTQ_DESC_F_NEXT } else { 0 };
            d[12..14].copy_from_slice(&f.to_le_bytes());
            d[14..16].copy_from_slice(&next.unwrap_or(0).to_le_bytes());
            mem.write(self.desc_gpa() + u64::from(ids[i]) * 16, &d);
        }
        let head = ids[0];
        let slot = self.avail_idx % self.size;
        mem.store_u16(self.avail_gpa() + 4 + 2 * u64::from(slot), head);
        self.chains[usize::from(head)] = ids;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        fence(Ordering::Release);
        mem.store_u16(self.avail_gpa() + 2, self.avail_idx);
        fence(Ordering::SeqCst);
    }

    /// Takes the next used entry: (head, bytes written).
    pub fn pop_used(&mut self, mem: &DmaMemory) -> Option<(u16, u32)> {
        let used_idx = mem.load_u16(self.used_gpa() + 2);
        if used_idx == self.last_used {
            return None;
        }
        let slot = u64::from(self.last_used % self.size);
        let mut e = [0u8; 8];
        mem.read(self.used_gpa() + 4 + 8 * slot, &mut e);
        self.last_used = self.last_used.wrapping_add(1);
        let id = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        let len = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let head = u16::try_from(id).ok().filter(|h| *h < self.size)?;
        let ids = std::mem::take(&mut self.chains[usize::from(head)]);
        self.free.extend(ids);
        Some((head, len))
    }
}
