//! docs/spec.md, section by section, checked through a frontend written
//! from the spec: raw vhost-user messages, rings laid out by hand in a
//! memfd, commands encoded with the contract's wire structs. Each test is
//! named after the section it checks; a disagreement between the spec and
//! the device shows up here first (issue 32).
mod common;

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

use ulnic_abi::wire::{self, CmdHeader, CreateEndpoint, CreatePd, SetFilter};
use ulnic_abi::{cmd, status, FilterEntry, RingLayout, MAX_FILTERS};
use ulnic_device::Device;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_ring::{
    vring_avail, vring_used, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::split::{Descriptor, VirtqUsedElem};
use vm_memory::ByteValued;
use vmm_sys_util::eventfd::EventFd;
use zerocopy::IntoBytes;

/// The frontend's shared memory: GPA = offset in it.
const MEM: usize = 4 << 20;
const QUEUE: u16 = 8;
/// Where each queue's rings start: queue q at RINGS + q * 0x1000.
const RINGS: u64 = 0x1_0000;
/// The command being sent and its response.
const REQ: u64 = 0x8_0000;
const RESP: u64 = 0x8_1000;
/// The doorbell bitmap of the domain this frontend creates.
const BITMAP: u64 = 0x9_0000;
/// The endpoint's segment page table and its control region and segment.
const TABLE: u64 = 0x9_1000;
const CTRL: u64 = 0x10_0000;
const SEG: u64 = 0x20_0000;
/// Each queue's available and used rings, after its descriptor table.
const AVAIL: u64 = 0x400;
const USED: u64 = 0x800;
const F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
const F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
const AVAIL_IDX: u64 = offset_of!(vring_avail, idx) as u64;
const AVAIL_RING: u64 = offset_of!(vring_avail, ring) as u64;
const USED_IDX: u64 = offset_of!(vring_used, idx) as u64;
const USED_RING: u64 = offset_of!(vring_used, ring) as u64;

/// A frontend written from spec §2.4: shared memory, the control and
/// notification queues set up, every message acknowledged (`REPLY_ACK`),
/// so a refusal is seen at the message refused.
struct Raw {
    fe: Frontend,
    mem: *mut u8,
    file: File,
    kicks: Vec<EventFd>,
    calls: Vec<EventFd>,
    avail: u16,
    used: u16,
}

impl Raw {
    fn new(path: &std::path::Path) -> Raw {
        let fe = common::frontend(
            path,
            VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::REPLY_ACK,
        );
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        // SAFETY: valid NUL-terminated name; the descriptor is ours.
        let fd = unsafe { libc::memfd_create(c"ulnic-conformance".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(MEM as u64).unwrap();
        let mem = ulnic_host_attach::map_shared(file.as_raw_fd(), MEM, 0).unwrap();
        let mut raw = Raw {
            fe,
            mem: mem.cast(),
            file,
            kicks: Vec::new(),
            calls: Vec::new(),
            avail: 0,
            used: 0,
        };
        raw.fe.set_mem_table(&[raw.region()]).unwrap();
        for q in 0..2 {
            raw.start_queue(q).unwrap();
        }
        raw
    }

    fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM as u64,
            userspace_addr: self.mem as u64,
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    /// Sets queue `q` up and enables it (spec §2.4 step 5).
    fn start_queue(&mut self, q: usize) -> Result<(), vhost::Error> {
        let base = self.mem as u64 + RINGS + q as u64 * 0x1000;
        let (kick, call) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
        self.fe.set_vring_num(q, QUEUE)?;
        self.fe.set_vring_addr(
            q,
            &VringConfigData {
                queue_max_size: QUEUE,
                queue_size: QUEUE,
                flags: 0,
                desc_table_addr: base,
                avail_ring_addr: base + AVAIL,
                used_ring_addr: base + USED,
                log_addr: None,
            },
        )?;
        self.fe.set_vring_base(q, 0)?;
        self.fe.set_vring_kick(q, &kick)?;
        self.fe.set_vring_call(q, &call)?;
        self.kicks.push(kick);
        self.calls.push(call);
        self.fe.set_vring_enable(q, true)
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
        // SAFETY: in bounds of our live mapping; the device may write
        // meanwhile, and bytes are all this looks at.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.add(at as usize), v.as_mut_ptr(), n) };
        v
    }

    fn u16_at(&self, at: u64) -> u16 {
        u16::from_le_bytes(self.read(at, 2).try_into().unwrap())
    }

    /// One command on the control queue (spec §4): the status and result.
    fn command(&mut self, opcode: u32, payload: &[u8]) -> (u32, Vec<u8>) {
        let header = CmdHeader {
            opcode: opcode.into(),
            reserved: 0.into(),
        };
        let mut req = header.as_bytes().to_vec();
        req.extend_from_slice(payload);
        self.write(REQ, &req);
        self.write(RESP, &[0xee; 512]);
        let ring = RINGS;
        let desc = |i: u64, addr: u64, len: u32, flags: u16, next: u16| {
            let d = Descriptor::new(addr, len, flags, next);
            self.write(ring + i * size_of::<Descriptor>() as u64, d.as_slice());
        };
        desc(0, REQ, req.len() as u32, F_NEXT, 1);
        desc(1, RESP, 512, F_WRITE, 0);
        let slot = u64::from(self.avail % QUEUE);
        self.write(ring + AVAIL + AVAIL_RING + slot * 2, &0u16.to_le_bytes());
        self.avail = self.avail.wrapping_add(1);
        self.write(ring + AVAIL + AVAIL_IDX, &self.avail.to_le_bytes());
        self.kicks[0].write(1).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.u16_at(ring + USED + USED_IDX) == self.used {
            assert!(
                Instant::now() < deadline,
                "no answer to command {opcode:#x}"
            );
            std::thread::yield_now();
        }
        let at = USED_RING + (size_of::<VirtqUsedElem>() * usize::from(self.used % QUEUE)) as u64;
        let e = self.read(ring + USED + at, size_of::<VirtqUsedElem>());
        let e = VirtqUsedElem::from_slice(&e).copied().unwrap();
        self.used = self.used.wrapping_add(1);
        let len = e.len() as usize;
        assert!(len >= 8, "command {opcode:#x}: used length {len}");
        let resp = self.read(RESP, len);
        let code = u32::from_le_bytes(resp[0..4].try_into().unwrap());
        (code, resp[8..].to_vec())
    }

    /// CREATE_PD with the bitmap at `BITMAP`: the domain's id.
    fn create_pd(&mut self) -> u32 {
        let a = CreatePd {
            doorbell_gpa: BITMAP.into(),
        };
        let (code, r) = self.command(cmd::CREATE_PD, a.as_bytes());
        assert_eq!(code, status::OK);
        u32::from_le_bytes(r[0..4].try_into().unwrap())
    }

    /// CREATE_ENDPOINT in domain `pd`, rings of 8 and one segment page.
    fn create_endpoint(&mut self, pd: u32) -> u32 {
        let layout = RingLayout {
            send_entries: 8,
            recv_entries: 8,
            free_entries: 8,
            event_entries: 64,
        };
        self.write(TABLE, &SEG.to_le_bytes());
        let a = CreateEndpoint {
            pd: pd.into(),
            send_entries: 8.into(),
            recv_entries: 8.into(),
            free_entries: 8.into(),
            event_entries: 64.into(),
            seg_pages: 1.into(),
            ctrl_gpa: CTRL.into(),
            ctrl_len: layout.region_size().next_multiple_of(4096).into(),
            seg_table_gpa: TABLE.into(),
        };
        let (code, r) = self.command(cmd::CREATE_ENDPOINT, a.as_bytes());
        assert_eq!(code, status::OK);
        u32::from_le_bytes(r[0..4].try_into().unwrap())
    }

    /// An endpoint bound to `port`, as the spec's bring-up leaves it.
    fn bound_endpoint(&mut self, port: u32) -> u32 {
        let pd = self.create_pd();
        let ep = self.create_endpoint(pd);
        let bind = wire::BindPort {
            endpoint: ep.into(),
            port: port.into(),
        };
        assert_eq!(self.command(cmd::BIND_PORT, bind.as_bytes()).0, status::OK);
        ep
    }

    /// The config-space word at `offset` (spec §2.2).
    fn config_word(&mut self, offset: u32) -> u32 {
        let (_, b) = self
            .fe
            .get_config(offset, 4, VhostUserConfigFlags::WRITABLE, &[0; 4])
            .unwrap();
        u32::from_le_bytes(b[..4].try_into().unwrap())
    }

    /// Whether the device closed the connection: a request fails.
    fn closed(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.fe.get_features().is_ok() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`, used by nothing else.
        unsafe { libc::munmap(self.mem.cast(), MEM) };
    }
}

/// Node `node`'s live endpoints and epoch, as the device holds them.
fn node_state(dev: &Device, node: usize) -> (usize, u32, u64) {
    let shard = dev.shard_of(node as u32);
    let f = shard.lock();
    let n = &f.nodes[node];
    let live = n.endpoints.iter().filter(|e| e.is_some()).count();
    (live, n.epoch, n.queue_errors)
}

/// §2.1/§5.8: all 62 doorbell queues are set up and started like the
/// others (the kicks themselves: device/tests/endpoints.rs
/// `every_doorbell_queue_serves_its_domain`).
#[test]
fn s2_1_every_queue_can_be_started() {
    let (dev, _dir) = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    for q in 2..ulnic_abi::QUEUE_COUNT as usize {
        raw.start_queue(q).unwrap();
    }
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
}

/// §2.4 step 5: a kick must be an eventfd; another kind of file is
/// refused when the queue starts, and the connection ends.
#[test]
fn s2_4_a_kick_that_is_no_eventfd_is_refused() {
    let (dev, _dir) = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let regular = tempfile::tempfile().unwrap();
    raw.fe.set_vring_num(2, QUEUE).unwrap();
    let base = raw.mem as u64 + RINGS + 2 * 0x1000;
    raw.fe
        .set_vring_addr(
            2,
            &VringConfigData {
                queue_max_size: QUEUE,
                queue_size: QUEUE,
                flags: 0,
                desc_table_addr: base,
                avail_ring_addr: base + AVAIL,
                used_ring_addr: base + USED,
                log_addr: None,
            },
        )
        .unwrap();
    raw.fe.set_vring_base(2, 0).unwrap();
    // SAFETY: the file's descriptor is valid while `regular` lives, and the
    // borrowed EventFd is forgotten, never closing it.
    let not_eventfd =
        std::mem::ManuallyDrop::new(unsafe { EventFd::from_raw_fd(regular.as_raw_fd()) });
    // Acknowledged: the queue is not enabled yet, so nothing starts.
    raw.fe.set_vring_kick(2, &not_eventfd).unwrap();
    raw.fe.set_vring_call(2, &EventFd::new(0).unwrap()).unwrap();
    assert!(
        raw.fe.set_vring_enable(2, true).is_err(),
        "a queue started on a kick that is no eventfd"
    );
    assert!(raw.closed(), "the connection stays open");
    drop(raw);
    common::exchange(&dev, 1, 0);
}

/// §2.4 step 5: a started queue keeps its kick; a new one is refused and
/// the connection ends (QEMU stops a queue before it changes its kick).
#[test]
fn s2_4_a_started_queue_keeps_its_kick() {
    let (dev, _dir) = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let other = EventFd::new(0).unwrap();
    assert!(
        raw.fe.set_vring_kick(0, &other).is_err(),
        "a new kick for a started queue was taken"
    );
    assert!(raw.closed(), "the connection stays open");
    drop(raw);
    common::exchange(&dev, 1, 0);
}

/// §2.3: a refused memory table ends the connection, and the node's state
/// is freed before the failure reply.
#[test]
fn s2_3_a_refused_table_frees_the_node_before_the_reply() {
    let (dev, _dir) = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    raw.bound_endpoint(9);
    let epoch = raw.config_word(56);
    assert_eq!(node_state(&dev, 0).0, 1);
    // A region longer than its file.
    let mut bad = raw.region();
    bad.memory_size = 2 * MEM as u64;
    assert!(raw.fe.set_mem_table(&[bad]).is_err(), "the table was taken");
    // The reply came: the state is gone already, with a new epoch.
    let (live, now, _) = node_state(&dev, 0);
    assert_eq!(live, 0, "endpoints outlived the refusal");
    assert_ne!(now, epoch, "the epoch did not change");
    assert!(raw.closed());
}

/// §8: a control-queue call the device cannot signal ends the connection;
/// the node's state is freed (counted in its queue errors) before the
/// frontend sees the connection end.
#[test]
fn s8_a_call_that_cannot_be_signalled_ends_the_connection() {
    let (dev, _dir) = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    raw.bound_endpoint(9);
    // The read end of a pipe: a write to it fails (EBADF).
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh and owned here from now on.
    let (r, _w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: as above; the borrowed EventFd is never dropped.
    let unwritable = std::mem::ManuallyDrop::new(unsafe { EventFd::from_raw_fd(r.as_raw_fd()) });
    raw.fe.set_vring_call(0, &unwritable).unwrap();
    let before = node_state(&dev, 0).2;
    // Served and answered in the ring, then the signal fails.
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
    assert!(raw.closed(), "the connection stays open");
    let (live, _, errors) = node_state(&dev, 0);
    assert_eq!(live, 0, "endpoints outlived the end of the connection");
    assert_eq!(errors, before + 1, "not counted in the node's queue errors");
    drop(raw);
    common::exchange(&dev, 1, 0);
}

/// §4 step 6 before step 7: SET_FILTER's length is checked against its
/// count before the count itself.
#[test]
fn s4_2_set_filter_checks_its_length_before_its_count() {
    let (dev, _dir) = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let ep = raw.bound_endpoint(9);
    let filter = |count: u32, entries: usize| {
        let mut p = SetFilter {
            endpoint: ep.into(),
            count: count.into(),
        }
        .as_bytes()
        .to_vec();
        p.resize(p.len() + entries * FilterEntry::SIZE, 0);
        p
    };
    let over = MAX_FILTERS as u32 + 1;
    assert_eq!(
        raw.command(cmd::SET_FILTER, &filter(over, 0)).0,
        status::BAD_LENGTH
    );
    assert_eq!(
        raw.command(cmd::SET_FILTER, &filter(over, over as usize)).0,
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        raw.command(cmd::SET_FILTER, &filter(over - 1, over as usize - 1))
            .0,
        status::OK
    );
}
