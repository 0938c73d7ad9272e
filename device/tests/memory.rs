//! Shared memory that would crash the device (SIGBUS) costs only the
//! frontend that shared it (spec §2.3). Each attack is followed by a
//! message exchange between two other nodes of the same device, and by a
//! good frontend attaching to the attacked node again.
use ulnic_testkit as common;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

use ulnic_device::Device;
use ulnic_host_attach::{DmaMemory, HostAttach};
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::VhostBackend;
use vhost::VhostUserMemoryRegionInfo;

const MIB: u64 = 1 << 20;
/// Where the attacker claims its memory lives in its own address space.
const USER_BASE: u64 = 0x7000_0000_0000;

fn memfd(len: u64) -> File {
    // SAFETY: valid NUL-terminated name; the descriptor is ours.
    let fd = unsafe { libc::memfd_create(c"ulnic-attacker".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

/// Sends one region (`size` bytes of `file` from `offset`) as the memory
/// table; returns whether SET_MEM_TABLE was accepted. (Both attacks below
/// must be refused right there: nothing after an acceptance could make
/// the test pass, so the rings are never set up in the region.)
fn share_region(path: &std::path::Path, file: &File, size: u64, offset: u64) -> bool {
    let fe = common::frontend(
        path,
        VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK,
    );
    // Ask for a reply to each request, so a refusal is seen at once.
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: size,
        userspace_addr: USER_BASE,
        mmap_offset: offset,
        mmap_handle: file.as_raw_fd(),
    };
    fe.set_mem_table(&[region]).is_ok()
}

/// The attacked node serves a well-behaved frontend again.
fn node_usable_again(dev: &Device, node: usize) {
    assert_eq!(common::attach_again(dev, node).node(), node as u32);
}

#[test]
fn a_region_longer_than_its_file_is_refused() {
    let dev = common::device(3);
    let file = memfd(MIB);
    // 2 MiB claimed over a 1 MiB file.
    let accepted = share_region(&common::socket(&dev, 0), &file, 2 * MIB, 0);
    assert!(!accepted, "SET_MEM_TABLE must fail");
    common::exchange(&dev, 1, 2);
    node_usable_again(&dev, 0);
    common::exchange(&dev, 0, 1);
}

#[test]
fn a_region_offset_past_the_end_of_its_file_is_refused() {
    let dev = common::device(3);
    let file = memfd(MIB);
    let accepted = share_region(&common::socket(&dev, 0), &file, MIB, 2 * MIB);
    assert!(!accepted, "SET_MEM_TABLE must fail");
    common::exchange(&dev, 1, 2);
    node_usable_again(&dev, 0);
}

#[test]
fn a_file_shrunk_after_setup_costs_only_its_node() {
    let dev = common::device(3);
    // Memory the device cannot seal (no MFD_ALLOW_SEALING): it must
    // contain the fault rather than prevent it.
    let memory = DmaMemory::with_sealing(4 * MIB as usize, false).unwrap();
    let fd = memory.as_raw_fd();
    let hw = HostAttach::connect_with_memory(&common::socket(&dev, 0), memory).unwrap();
    let resp = hw.memory().alloc(4096).unwrap();
    // Keep the first MiB (the rings and `resp` live there), lose the rest.
    // SAFETY: plain syscall on a descriptor the attachment holds.
    assert_eq!(unsafe { libc::ftruncate(fd, MIB as libc::off_t) }, 0);
    // A command whose request lies in the lost pages. The device answers
    // nothing useful (its view of the node is gone), so do not wait for it.
    let hw = std::sync::Arc::new(hw);
    let attacker = hw.clone();
    std::thread::spawn(move || attacker.raw_control_chain(&[(3 * MIB, 8)], &[(resp.gpa, 512)]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while dev.shard().lock().nodes[0].memory_faults == 0 {
        assert!(Instant::now() < deadline, "fault not contained");
        std::thread::sleep(Duration::from_millis(10));
    }
    common::exchange(&dev, 1, 2);
    drop(hw);
    node_usable_again(&dev, 0);
    common::exchange(&dev, 0, 2);
}

#[test]
fn sealed_memory_cannot_shrink() {
    let dev = common::device(1);
    let hw = HostAttach::connect(&common::socket(&dev, 0), 4 * MIB as usize).unwrap();
    let fd = hw.memory().as_raw_fd();
    // SAFETY: plain syscall on a descriptor the attachment holds.
    let r = unsafe { libc::ftruncate(fd, MIB as libc::off_t) };
    assert_eq!(r, -1, "the shared memory is sealed against shrinking");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
}
