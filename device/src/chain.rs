//! Taking descriptor chains from a driver's virtqueue without trusting it
//! (spec §2.1): an avail index that claims more chains than the queue holds
//! breaks the queue visibly, and indirect descriptors (never offered) are
//! refused rather than followed. Loops cannot hang the device: a chain is
//! never walked for more descriptors than the queue has.

use std::sync::atomic::Ordering;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Size of one split-ring descriptor.
const DESC_SIZE: u64 = std::mem::size_of::<Descriptor>() as u64;

/// What went wrong with a queue or one of its chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingFault {
    /// The published avail index is more than the queue size ahead of what
    /// the device consumed: the queue is broken until the driver resets it.
    #[error("avail index {avail} is {ahead} chains ahead of the device on a queue of {size}")]
    AvailIndex {
        /// The driver's avail index.
        avail: u16,
        /// How far ahead of the device it is.
        ahead: u16,
        /// The queue size.
        size: u16,
    },
    /// A chain uses an indirect descriptor, a feature the device does not
    /// offer; the chain is completed with nothing written.
    #[error("descriptor chain at head {head} uses an indirect table, which was not negotiated")]
    Indirect {
        /// The chain's head index.
        head: u16,
    },
    /// The queue's call eventfd cannot take another signal: the frontend
    /// filled its counter (spec §8). The device does not wait on it.
    #[error("its call eventfd cannot take another signal (the frontend filled its counter)")]
    CallFull,
}

/// The next available chain, checked: `Ok(None)` when there is none,
/// `Err(AvailIndex)` when the queue is broken (nothing is consumed), and
/// `Err(Indirect)` for a refused chain, which has been consumed and must be
/// completed with used length 0.
pub fn pop_checked<'m>(
    queue: &mut Queue,
    mem: &'m GuestMemoryMmap<()>,
) -> Result<Option<DescriptorChain<&'m GuestMemoryMmap<()>>>, RingFault> {
    if !queue.ready() {
        return Ok(None);
    }
    let Ok(avail) = queue.avail_idx(mem, Ordering::Acquire) else {
        return Ok(None); // ring outside memory: nothing can be read from it
    };
    let ahead = avail.0.wrapping_sub(queue.next_avail());
    if ahead > queue.size() {
        return Err(RingFault::AvailIndex {
            avail: avail.0,
            ahead,
            size: queue.size(),
        });
    }
    let Some(chain) = queue.pop_descriptor_chain(mem) else {
        return Ok(None);
    };
    if uses_indirect(mem, queue.desc_table(), queue.size(), chain.head_index()) {
        return Err(RingFault::Indirect {
            head: chain.head_index(),
        });
    }
    Ok(Some(chain))
}

/// Whether the chain starting at `head` contains a descriptor flagged
/// INDIRECT. Walks at most `size` descriptors, so a loop ends.
fn uses_indirect(mem: &GuestMemoryMmap<()>, table: u64, size: u16, head: u16) -> bool {
    let mut idx = head;
    for _ in 0..size {
        if idx >= size {
            return false;
        }
        let base = table.wrapping_add(u64::from(idx) * DESC_SIZE);
        let Ok(d) = mem.read_obj::<Descriptor>(GuestAddress(base)) else {
            return false; // unreadable: the chain itself yields nothing
        };
        if d.refers_to_indirect_table() {
            return true;
        }
        if !d.has_next() {
            return false;
        }
        idx = d.next();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;

    fn mem() -> GuestMemoryMmap<()> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    fn desc(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, next))
    }

    #[test]
    fn a_plain_chain_is_returned() {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 16);
        let descs = [
            desc(0x8000, 16, VRING_DESC_F_NEXT, 1),
            desc(
                0x9000,
                16,
                virtio_bindings::virtio_ring::VRING_DESC_F_WRITE,
                0,
            ),
        ];
        vq.add_desc_chains(&descs, 0).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let c = pop_checked(&mut q, &m).unwrap().unwrap();
        assert_eq!(c.head_index(), 0);
        assert!(pop_checked(&mut q, &m).unwrap().is_none());
    }

    #[test]
    fn indirect_descriptors_are_refused_not_followed() {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 16);
        let descs = [
            desc(0x8000, 16, VRING_DESC_F_NEXT, 1),
            desc(0xa000, 32, VRING_DESC_F_INDIRECT, 0),
        ];
        vq.add_desc_chains(&descs, 0).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        assert_eq!(
            pop_checked(&mut q, &m).unwrap_err(),
            RingFault::Indirect { head: 0 }
        );
        // Consumed: the queue goes on.
        assert!(pop_checked(&mut q, &m).unwrap().is_none());
    }

    #[test]
    fn a_looping_chain_ends() {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 4);
        let descs = [
            desc(0x8000, 16, VRING_DESC_F_NEXT, 1),
            desc(0x8000, 16, VRING_DESC_F_NEXT, 0),
        ];
        vq.add_desc_chains(&descs, 0).unwrap();
        // Close the loop by hand: descriptor 1 points back to 0.
        let mut q: Queue = vq.create_queue().unwrap();
        let c = pop_checked(&mut q, &m).unwrap().unwrap();
        assert!(c.count() <= 4);
    }

    #[test]
    fn an_impossible_avail_index_breaks_the_queue() {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 8);
        let mut q: Queue = vq.create_queue().unwrap();
        vq.avail().idx().store(u16::to_le(200));
        let err = pop_checked(&mut q, &m).unwrap_err();
        assert_eq!(
            err,
            RingFault::AvailIndex {
                avail: 200,
                ahead: 200,
                size: 8
            }
        );
        assert_eq!(q.next_avail(), 0, "nothing consumed");
    }
}
