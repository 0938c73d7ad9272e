//! The control-command decoder and executor (spec §4) against guest memory
//! the input also fills: any request is answered, never panics, and a
//! refused command leaves the node's objects as they were.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ulnic_device::shard::nodes::Nodes;
use ulnic_device::vhost::control::execute;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // First byte: how many requests; then 2-byte-length-prefixed requests;
    // whatever remains seeds guest memory (tables, rings, pages).
    let Some((&n, mut rest)) = data.split_first() else {
        return;
    };
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    let mut nodes = Nodes::new(2, 4);
    nodes.nodes[0].features = ulnic_abi::F_IMPLEMENTED;
    // Guest memory gets a copy of the whole input, so tables point at it.
    let _ = mem.write_slice(&data[..data.len().min(MEM)], GuestAddress(0x8000));
    for _ in 0..(n % 16) {
        if rest.len() < 2 {
            break;
        }
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % 600;
        rest = &rest[2..];
        let req = &rest[..len.min(rest.len())];
        rest = &rest[req.len()..];
        let before = nodes.nodes[0].object_counts();
        let room = usize::from(n & 0xf0) * 4; // 0..=960 bytes of response room
        let r = execute(&mut nodes, 0, &mem, req, room);
        if r.status != ulnic_abi::status::OK {
            assert_eq!(
                nodes.nodes[0].object_counts(),
                before,
                "refused command changed state"
            );
            assert!(r.payload.is_empty());
        }
        assert!(
            nodes.nodes[1].object_counts() == Default::default(),
            "another node changed"
        );
    }
    // Polling the data path over whatever was created must not panic.
    nodes.poll();
});
