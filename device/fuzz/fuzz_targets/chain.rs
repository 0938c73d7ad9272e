//! Descriptor-chain walking (spec §2.1): a virtqueue whose rings and
//! descriptors are arbitrary bytes never panics or loops, and every chain
//! returned reads and writes only inside guest memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use ulnic_device::chain::{pop_checked, RingFault};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let Some((&size_sel, bytes)) = data.split_first() else {
        return;
    };
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let _ = mem.write_slice(&bytes[..bytes.len().min(MEM)], GuestAddress(0));
    let size = 1u16 << (size_sel % 9); // 1..=256
    let mut q = Queue::new(256).unwrap();
    q.set_size(size);
    q.set_desc_table_address(Some(0), Some(0));
    q.set_avail_ring_address(Some(0x100), Some(0));
    q.set_used_ring_address(Some(0x300), Some(0));
    q.set_ready(true);
    for _ in 0..512 {
        match pop_checked(&mut q, &mem) {
            Ok(Some(chain)) => {
                let (r, w) = (chain.clone().reader(&mem), chain.writer(&mem));
                if let (Ok(mut r), Ok(mut w)) = (r, w) {
                    let mut buf = vec![0u8; r.available_bytes().min(4096)];
                    let _ = r.read_exact(&mut buf);
                    let n = w.available_bytes().min(4096);
                    let _ = w.write_all(&vec![0xa5; n]);
                }
            }
            Ok(None) => break,
            Err(RingFault::Indirect { .. }) => continue,
            Err(_) => break,
        }
    }
});
