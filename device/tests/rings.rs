//! Control-queue rings written by hand through the real vhost-user
//! protocol (issue 9's findings at 8c66b57): an indirect descriptor, which
//! the device never offered, is completed unexecuted; a descriptor loop
//! ends after the queue's size and is refused; an avail index further ahead than the ring is
//! long breaks that queue visibly (config space word 52, the node's error
//! count) instead of stopping it silently; other nodes never notice, and
//! the node serves its next frontend.
use ulnic_testkit as common;

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

use ulnic_abi::{cmd, status};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_ring::{
    vring_avail, vring_used, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::split::{Descriptor, VirtqUsedElem};
use vm_memory::ByteValued;
use vmm_sys_util::eventfd::EventFd;

const MEM: usize = 1 << 20;
const QUEUE: u16 = 8;
// Ring and buffer offsets in the shared memory (guest-physical = offset).
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x1800;
const USED: u64 = 0x2000;
const INDIRECT: u64 = 0x3000;
const REQ: u64 = 0x4000;
const RESP: u64 = 0x5000;
const F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
const F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
const F_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;
/// Where the avail ring's index and entries are, and the used ring's index.
const AVAIL_IDX: u64 = offset_of!(vring_avail, idx) as u64;
const AVAIL_RING: u64 = offset_of!(vring_avail, ring) as u64;
const USED_IDX: u64 = offset_of!(vring_used, idx) as u64;

/// A frontend whose control queue lives in memory this test writes.
struct Rings {
    fe: Frontend,
    mem: *mut u8,
    kick: EventFd,
    _call: EventFd,
    _file: File,
    avail_idx: u16,
}

impl Rings {
    fn new(path: &std::path::Path) -> Rings {
        let mut fe = common::frontend(
            path,
            VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::REPLY_ACK,
        );
        // SAFETY: valid NUL-terminated name; the descriptor is ours.
        let fd = unsafe { libc::memfd_create(c"ulnic-rings".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(MEM as u64).unwrap();
        let mem = ulnic_host_attach::map_shared(file.as_raw_fd(), MEM, 0).unwrap();
        let base = mem as u64;
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM as u64,
            userspace_addr: base,
            mmap_offset: 0,
            mmap_handle: file.as_raw_fd(),
        }])
        .unwrap();
        let (kick, call) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
        fe.set_vring_num(0, QUEUE).unwrap();
        fe.set_vring_addr(
            0,
            &VringConfigData {
                queue_max_size: QUEUE,
                queue_size: QUEUE,
                flags: 0,
                desc_table_addr: base + DESC,
                used_ring_addr: base + USED,
                avail_ring_addr: base + AVAIL,
                log_addr: None,
            },
        )
        .unwrap();
        fe.set_vring_base(0, 0).unwrap();
        fe.set_vring_kick(0, &kick).unwrap();
        fe.set_vring_call(0, &call).unwrap();
        fe.set_vring_enable(0, true).unwrap();
        Rings {
            fe,
            mem: mem.cast(),
            kick,
            _call: call,
            _file: file,
            avail_idx: 0,
        }
    }

    fn write(&self, at: u64, bytes: &[u8]) {
        assert!(at as usize + bytes.len() <= MEM);
        // SAFETY: in bounds of our live mapping (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.add(at as usize), bytes.len())
        };
    }

    fn read(&self, at: u64, n: usize) -> Vec<u8> {
        assert!(at as usize + n <= MEM);
        let mut v = vec![0u8; n];
        // SAFETY: in bounds of our live mapping (checked above); the device
        // may write concurrently, and bytes are all the test looks at.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.add(at as usize), v.as_mut_ptr(), n) };
        v
    }

    fn u16_at(&self, at: u64) -> u16 {
        u16::from_le_bytes(self.read(at, 2).try_into().unwrap())
    }

    /// Writes a virtq descriptor into the table at `table`.
    fn desc(&self, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = Descriptor::new(addr, len, flags, next);
        self.write(
            table + u64::from(i) * size_of::<Descriptor>() as u64,
            d.as_slice(),
        );
    }

    /// Makes chain `head` available (index `avail_idx` advanced by
    /// `advance`, 1 for an honest driver) and kicks.
    fn offer(&mut self, head: u16, advance: u16) {
        let slot = self.avail_idx % QUEUE;
        self.write(
            AVAIL + AVAIL_RING + u64::from(slot) * 2,
            &head.to_le_bytes(),
        );
        self.avail_idx = self.avail_idx.wrapping_add(advance);
        self.write(AVAIL + AVAIL_IDX, &self.avail_idx.to_le_bytes());
        self.kick.write(1).unwrap();
    }

    /// Waits for used entry `n` and returns (id, len).
    fn used(&self, n: u16) -> (u32, u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.u16_at(USED + USED_IDX) <= n {
            assert!(Instant::now() < deadline, "used entry {n} never came");
            std::thread::yield_now();
        }
        let at = offset_of!(vring_used, ring) + size_of::<VirtqUsedElem>() * usize::from(n % QUEUE);
        let e = VirtqUsedElem::from_slice(&self.read(USED + at as u64, size_of::<VirtqUsedElem>()))
            .copied()
            .unwrap();
        (e.id(), e.len())
    }

    /// The 32-bit config-space word at `offset`.
    fn config_word(&mut self, offset: u32) -> u32 {
        let (_, b) = self
            .fe
            .get_config(offset, 4, VhostUserConfigFlags::WRITABLE, &[0; 4])
            .unwrap();
        u32::from_le_bytes(b[..4].try_into().unwrap())
    }

    /// A GET_INFO request at `REQ` and a zeroed response buffer at `RESP`.
    fn get_info_buffers(&self) {
        let mut req = [0u8; 8];
        req[..4].copy_from_slice(&cmd::GET_INFO.to_le_bytes());
        self.write(REQ, &req);
        self.write(RESP, &[0xee; 64]);
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`, used by nothing else.
        unsafe { libc::munmap(self.mem.cast(), MEM) };
    }
}

#[test]
fn indirect_descriptors_are_refused_and_loops_end() {
    let dev = common::device(3);
    let mut r = Rings::new(&common::socket(&dev, 0));
    r.get_info_buffers();
    // Head 0 is indirect: its table holds a well-formed GET_INFO chain.
    r.desc(INDIRECT, 0, REQ, 8, F_NEXT, 1);
    r.desc(INDIRECT, 1, RESP, 64, F_WRITE, 0);
    r.desc(DESC, 0, INDIRECT, 32, F_INDIRECT, 0);
    r.offer(0, 1);
    assert_eq!(r.used(0), (0, 0), "an indirect chain is completed empty");
    assert_eq!(r.read(RESP, 4), [0xee; 4], "and never executed");
    // Heads 1 and 2 point at each other: a loop. It is walked for the
    // queue's size (8 descriptors) and ends there (spec §2.1): four copies
    // of the 8-byte header are a 32-byte GET_INFO, refused as BAD_LENGTH.
    r.desc(DESC, 1, REQ, 8, F_NEXT, 2);
    r.desc(DESC, 2, RESP, 64, F_WRITE | F_NEXT, 1);
    r.offer(1, 1);
    assert_eq!(r.used(1), (1, 8), "a looping chain ends");
    assert_eq!(r.read(RESP, 4), status::BAD_LENGTH.to_le_bytes());
    // The queue still serves a well-formed chain.
    r.desc(DESC, 3, REQ, 8, F_NEXT, 4);
    r.desc(DESC, 4, RESP, 64, F_WRITE, 0);
    r.offer(3, 1);
    assert_eq!(r.used(2), (3, 8 + ulnic_abi::DeviceInfo::SIZE as u32));
    assert_eq!(r.read(RESP, 4), status::OK.to_le_bytes());
    assert_eq!(r.config_word(52), 0, "no queue broken");
    common::exchange(&dev, 1, 2);
}

#[test]
fn an_impossible_avail_index_breaks_only_that_queue_visibly() {
    let dev = common::device(3);
    let mut r = Rings::new(&common::socket(&dev, 0));
    r.get_info_buffers();
    r.desc(DESC, 0, REQ, 8, F_NEXT, 1);
    r.desc(DESC, 1, RESP, 64, F_WRITE, 0);
    r.offer(0, 1);
    assert_eq!(r.used(0).1, 8 + ulnic_abi::DeviceInfo::SIZE as u32);
    // 100 new chains in a ring of 8: no driver can have made them.
    r.write(RESP, &[0xee; 8]);
    r.offer(0, 100);
    let deadline = Instant::now() + Duration::from_secs(10);
    while r.config_word(52) & 1 == 0 {
        assert!(Instant::now() < deadline, "the control queue never broke");
        std::thread::yield_now();
    }
    assert_eq!(dev.shard().lock().nodes[0].queue_errors, 1);
    assert_eq!(r.u16_at(USED + USED_IDX), 1, "nothing used after the jump");
    assert_eq!(r.read(RESP, 4), [0xee; 4], "nothing executed");
    // The rest of the device never noticed.
    common::exchange(&dev, 1, 2);
    // The node serves its next frontend with a working control queue.
    drop(r);
    let nic = common::attach_again(&dev, 0);
    nic.alloc_pd().unwrap();
    assert_eq!(dev.shard().lock().nodes[0].broken_queues, 0);
}
