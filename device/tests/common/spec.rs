//! A frontend written from docs/spec.md alone, for the conformance tests
//! (device/tests/conformance*.rs): the vhost-user bring-up of §2.4, shared
//! memory in one memfd (§2.3), the control queue (§4) and the notification
//! queue (§6) laid out by hand, endpoints whose rings it reads and writes
//! itself (§5). Every payload, descriptor and record is a `ulnic_abi::wire`
//! struct; nothing here goes through the device's own code paths, the
//! host-attach driver or the library.
//!
//! Included by each conformance test file with
//! `#[path = "common/spec.rs"] mod spec;` (beside `use ulnic_testkit as common;`).
#![allow(dead_code)]

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ulnic_abi::wire::{
    BindPort, CmdHeader, ConfigSpace, Cookie, CreateEndpoint, CreatePd, EndpointCreated,
    EventRecord, Export, FreeDesc, NotifyRecord, ObjectId, PdCreated, RecvDesc, RespHeader,
    SendBuffer, SendDesc,
};
use ulnic_abi::{bitmap, cmd, ctrl, op, send_flags, status, RingLayout, PAGE_SIZE};
use ulnic_device::nic::node::ObjectCounts;
use ulnic_device::Device;
use vhost::vhost_user::message::{
    FrontendReq, VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_ring::{
    vring_avail, vring_used, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::split::{Descriptor, VirtqUsedElem};
use vm_memory::ByteValued;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes};

/// The frontend's shared memory: GPA = offset in it (§2.4 step 4).
pub const MEM: usize = 8 << 20;
/// Entries of every virtqueue this frontend sets up.
pub const QUEUE: u16 = 8;
/// Queue q's descriptor table at RINGS + q * 0x1000, its available ring
/// 0x400 further, its used ring 0x800 further.
pub const RINGS: u64 = 0x1_0000;
const AVAIL: u64 = 0x400;
const USED: u64 = 0x800;
/// The request being sent, and its response buffer.
pub const REQ: u64 = 0x8_0000;
pub const RESP: u64 = 0x8_1000;
/// Notification buffer i at NOTES + 8 i (§6).
pub const NOTES: u64 = 0x8_2000;
/// Where `alloc` starts handing out pages.
const HEAP: u64 = 0x10_0000;
pub const F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
pub const F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
const AVAIL_IDX: u64 = offset_of!(vring_avail, idx) as u64;
const AVAIL_RING: u64 = offset_of!(vring_avail, ring) as u64;
const USED_IDX: u64 = offset_of!(vring_used, idx) as u64;
const USED_RING: u64 = offset_of!(vring_used, ring) as u64;
/// §2: `VIRTIO_F_VERSION_1` is bit 32, vhost-user's `PROTOCOL_FEATURES` 30.
pub const VERSION_1: u64 = 1 << 32;
pub const PROTOCOL_FEATURES: u64 = 1 << 30;
/// §2: the protocol features the device offers.
pub fn protocols() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::BACKEND_REQ
        | VhostUserProtocolFeatures::BACKEND_SEND_FD
        | VhostUserProtocolFeatures::SHMEM
}
/// How long anything the spec promises may take here.
pub const WAIT: Duration = Duration::from_secs(10);
/// §7: the counters of GET_STATS, in the order docs/spec.md lists them
/// (read from the spec itself, so the test checks the document).
pub fn spec_counters() -> Vec<String> {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/spec.md"))
        .expect("docs/spec.md");
    let section = spec.split("\n## 7. Counters").nth(1).expect("spec §7");
    let list = section
        .split('`')
        .nth(1)
        .expect("§7 lists the counters in backquotes");
    list.split(',').map(|n| n.trim().to_string()).collect()
}
/// Rings of 8 (events 64: at least 8 + `CONDITION_RESERVE`, §3).
pub const SMALL: RingLayout = RingLayout {
    send_entries: 8,
    recv_entries: 8,
    free_entries: 8,
    event_entries: 64,
};

/// Waits (up to `WAIT`) until `done`; fails the test naming `what`.
pub fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Waits until the device has done all it was asked: every kick of
/// `raws` taken, then the engine settled (`Device::settle`). The fact a
/// test waits for before asserting that something did not happen.
pub fn settled(dev: &ulnic_device::device::Device, raws: &[&Raw]) {
    until("kicks taken", || raws.iter().all(|r| r.kicks_taken()));
    assert!(
        dev.settle(WAIT),
        "the device did not settle within {WAIT:?}"
    );
}

/// Fills an eventfd's counter to its limit (2^64 - 2): the next signal
/// cannot be taken (§8).
pub fn fill_counter(e: &EventFd) {
    loop {
        let _ = e.read();
        if e.write(u64::MAX - 1).is_ok() {
            return;
        }
    }
}

/// A split-ring descriptor.
pub fn desc(addr: u64, len: u32, flags: u16, next: u16) -> Descriptor {
    Descriptor::new(addr, len, flags, next)
}

/// A memfd of `len` bytes that allows sealing (§2.3 asks for one).
pub fn memfd(len: usize) -> File {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: a valid NUL-terminated name; the descriptor is ours.
    let fd = unsafe { libc::memfd_create(c"ulnic-conformance".as_ptr(), flags) };
    assert!(fd >= 0, "memfd_create failed");
    // SAFETY: a fresh descriptor nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len as u64).unwrap();
    file
}

/// How a frontend shares its memory (§2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// One region with SET_MEM_TABLE (§2.4 step 4).
    Table,
    /// Two adjacent regions with SET_MEM_TABLE.
    Halves,
    /// One region with ADD_MEM_REGION (needs CONFIGURE_MEM_SLOTS accepted).
    AddRegion,
}

/// Sends one vhost-user message by hand on `fe`'s socket: the header
/// (request, flags: version 1, NEED_REPLY if `reply`, size) and `body`;
/// with `reply`, the u64 of the answer (None if the connection ended).
pub fn raw_message(fe: &Frontend, request: FrontendReq, body: &[u8], reply: bool) -> Option<u64> {
    let flags = 1 | if reply {
        VhostUserHeaderFlag::NEED_REPLY.bits()
    } else {
        0
    };
    let mut m: Vec<u8> = [u32::from(request), flags, body.len() as u32]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    m.extend_from_slice(body);
    // SAFETY: writing our bytes to the frontend's socket, which outlives
    // the call.
    let n = unsafe { libc::write(fe.as_raw_fd(), m.as_ptr().cast(), m.len()) };
    assert_eq!(n, m.len() as isize);
    if !reply {
        return None;
    }
    let mut answer = [0u8; 20];
    let mut got = 0;
    while got < answer.len() {
        // SAFETY: reading into the rest of `answer`.
        let n = unsafe {
            libc::read(
                fe.as_raw_fd(),
                answer[got..].as_mut_ptr().cast(),
                answer.len() - got,
            )
        };
        if n <= 0 {
            return None;
        }
        got += n as usize;
    }
    Some(u64::from_le_bytes(answer[12..].try_into().unwrap()))
}

/// A protection domain as CREATE_PD made it (§4.2, §5.8).
#[derive(Clone, Copy, Debug)]
pub struct Pd {
    pub id: u32,
    /// Its doorbell queue (`2 + slot`).
    pub queue: u32,
    /// Its doorbell bitmap's GPA (a page of its own, zeroed).
    pub bitmap: u64,
}

/// An endpoint as CREATE_ENDPOINT made it, with the user's indices (§5.2).
#[derive(Clone, Debug)]
pub struct Ep {
    pub id: u32,
    pub pd: Pd,
    /// The control region's GPA and its ring sizes (§5.1).
    pub ctrl: u64,
    pub layout: RingLayout,
    /// The segment: `seg_len` bytes of contiguous memory at `seg`.
    pub seg: u64,
    pub seg_len: u64,
    pub send_prod: u32,
    pub recv_cons: u32,
    pub free_prod: u32,
    pub event_cons: u32,
}

/// A SEND of `data` carried inline (§5.3).
pub fn send_inline(dest: (u32, u32), tag: u32, user: u64, data: &[u8]) -> SendDesc {
    let mut d = SendDesc::new_zeroed();
    d.opcode = op::SEND.into();
    d.flags = send_flags::INLINE.into();
    d.len = (data.len() as u32).into();
    d.dest_node = dest.0.into();
    d.dest_port = dest.1.into();
    d.tag = tag.into();
    d.user_id = user.into();
    d.data[..data.len()].copy_from_slice(data);
    d
}

/// A SEND of `len` bytes at `offset` in the sender's segment (§5.3).
pub fn send_segment(dest: (u32, u32), tag: u32, user: u64, offset: u64, len: u32) -> SendDesc {
    let mut d = send_inline(dest, tag, user, &[]);
    d.flags = 0.into();
    d.len = len.into();
    let b = SendBuffer {
        offset: offset.into(),
        utlb_first: 0.into(),
        utlb_count: 0.into(),
    };
    d.data[..size_of::<SendBuffer>()].copy_from_slice(b.as_bytes());
    d
}

/// The inline payload of a receive descriptor (§5.4).
pub fn payload(r: &RecvDesc) -> &[u8] {
    &r.data[..r.len.get() as usize]
}

/// The buffer offset of a receive descriptor that is not inline (§5.4).
pub fn buffer_offset(r: &RecvDesc) -> u64 {
    U64::read_from_prefix(&r.data).unwrap().0.get()
}

/// A byte pattern that differs for each `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A frontend written from spec §2.4: negotiated, memory shared, every
/// queue started; every message acknowledged (`REPLY_ACK`), so a refusal
/// is seen at the message refused.
pub struct Raw {
    pub fe: Frontend,
    mem: *mut u8,
    pub file: File,
    /// Queue q's kick and call eventfds (calls are non-blocking, so a test
    /// can see whether one was signalled).
    pub kicks: Vec<EventFd>,
    pub calls: Vec<EventFd>,
    /// Available and used indices of the control (0) and notification (1)
    /// queues.
    avail: [u16; 2],
    used: [u16; 2],
    heap: u64,
    /// Whether `start_queue` ends with `SET_VRING_ENABLE`.
    enable: bool,
}

impl Raw {
    /// Bring-up §2.4 in full, accepting every implemented device bit.
    pub fn new(path: &Path) -> Raw {
        Self::with_features(path, ulnic_abi::F_IMPLEMENTED)
    }

    /// Bring-up §2.4 in full, accepting the device bits `bits`.
    pub fn with_features(path: &Path, bits: u64) -> Raw {
        let mut raw = Self::bare(path, bits);
        raw.post_notification_buffers();
        raw
    }

    /// Steps 1 to 5 of §2.4 (no notification buffers posted yet).
    pub fn bare(path: &Path, bits: u64) -> Raw {
        Self::sharing(path, bits, Sharing::Table)
    }

    /// Steps 1 to 5 of §2.4, the memory shared as `how` says.
    pub fn sharing(path: &Path, bits: u64, how: Sharing) -> Raw {
        let mut fe = Frontend::connect(path, 64).expect("connect");
        let offered = fe.get_features().expect("GET_FEATURES");
        let must = VERSION_1 | PROTOCOL_FEATURES | ulnic_abi::F_MESSAGING;
        assert_eq!(offered & must, must, "offered {offered:#x}");
        fe.set_owner().unwrap();
        fe.set_features(VERSION_1 | PROTOCOL_FEATURES | bits)
            .unwrap();
        let pf = fe.get_protocol_features().unwrap();
        let mut accepted = pf & protocols();
        if how == Sharing::AddRegion {
            accepted |= VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        }
        fe.set_protocol_features(accepted).unwrap();
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        assert_eq!(fe.get_queue_num().unwrap(), 64, "GET_QUEUE_NUM");
        Self::attach(fe, how, true)
    }

    /// Steps 4 and 5 of §2.4 on a negotiated frontend: the memory shared
    /// as `how` says, then every queue set up, and enabled if `enable`
    /// (`SET_VRING_ENABLE` needs `PROTOCOL_FEATURES`).
    pub fn attach(fe: Frontend, how: Sharing, enable: bool) -> Raw {
        let file = memfd(MEM);
        let mem = ulnic_host_attach::map_shared(file.as_raw_fd(), MEM, 0).unwrap();
        let mut raw = Raw {
            fe,
            mem: mem.cast(),
            file,
            kicks: Vec::new(),
            calls: Vec::new(),
            avail: [0; 2],
            used: [0; 2],
            heap: HEAP,
            enable,
        };
        match how {
            Sharing::Table => raw.fe.set_mem_table(&[raw.region()]).map(|_| ()),
            Sharing::Halves => raw.fe.set_mem_table(&raw.halves()).map(|_| ()),
            Sharing::AddRegion => raw.fe.add_mem_region(&raw.region()).map(|_| ()),
        }
        .expect("memory shared");
        for q in 0..ulnic_abi::QUEUE_COUNT as usize {
            raw.start_queue(q).unwrap();
        }
        raw
    }

    /// The memory as two regions of `MEM / 2` (GPAs still offsets).
    pub fn halves(&self) -> [VhostUserMemoryRegionInfo; 2] {
        let half = MEM as u64 / 2;
        let mut low = self.region();
        low.memory_size = half;
        let mut high = low;
        high.guest_phys_addr = half;
        high.userspace_addr += half;
        high.mmap_offset = half;
        [low, high]
    }

    /// The one memory region (§2.4 step 4).
    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM as u64,
            userspace_addr: self.mem as u64,
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    /// Sets queue `q` up and enables it (§2.4 step 5), with new eventfds.
    pub fn start_queue(&mut self, q: usize) -> Result<(), vhost::Error> {
        self.start_queue_at(q, 0)
    }

    /// What QEMU's `stop` and `cont` do to queue `q` (§2.5): stopped
    /// (`GET_VRING_BASE`), then started again at the index it stopped at,
    /// its rings untouched; then kicked, as QEMU does at every start.
    pub fn stop_and_resume_queue(&mut self, q: usize) {
        let base = self.fe.get_vring_base(q).unwrap();
        self.start_queue_at(q, base as u16).unwrap();
        self.kicks[q].write(1).unwrap();
    }

    fn start_queue_at(&mut self, q: usize, at: u16) -> Result<(), vhost::Error> {
        let base = self.mem as u64 + RINGS + q as u64 * 0x1000;
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
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
        self.fe.set_vring_base(q, at)?;
        self.fe.set_vring_kick(q, &kick)?;
        self.fe.set_vring_call(q, &call)?;
        if q < self.kicks.len() {
            self.kicks[q] = kick;
            self.calls[q] = call;
        } else {
            self.kicks.push(kick);
            self.calls.push(call);
        }
        if self.enable {
            self.fe.set_vring_enable(q, true)?;
        }
        Ok(())
    }

    /// Starts control or notification queue `q` again after it was
    /// stopped (`GET_VRING_BASE`), its rings cleared and base 0.
    pub fn restart_queue(&mut self, q: usize) {
        self.clear_queue(q);
        self.start_queue(q).unwrap();
    }

    /// Clears control or notification queue `q`'s rings and indices (for
    /// a queue set up again from base 0).
    pub fn clear_queue(&mut self, q: usize) {
        self.fill(RINGS + q as u64 * 0x1000, 0x1000, 0);
        self.avail[q] = 0;
        self.used[q] = 0;
    }

    fn at(&self, gpa: u64, n: usize) -> *mut u8 {
        assert!(gpa as usize + n <= MEM, "{gpa:#x}+{n} outside memory");
        // SAFETY: in bounds of the live mapping (checked above).
        unsafe { self.mem.add(gpa as usize) }
    }

    pub fn write(&self, gpa: u64, bytes: &[u8]) {
        let to = self.at(gpa, bytes.len());
        // SAFETY: in bounds of our live mapping; the device may read it
        // meanwhile, and bytes are all it looks at.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), to, bytes.len()) };
    }

    pub fn read(&self, gpa: u64, n: usize) -> Vec<u8> {
        let from = self.at(gpa, n);
        let mut v = vec![0u8; n];
        // SAFETY: in bounds of our live mapping.
        unsafe { std::ptr::copy_nonoverlapping(from, v.as_mut_ptr(), n) };
        v
    }

    pub fn fill(&self, gpa: u64, n: usize, byte: u8) {
        self.write(gpa, &vec![byte; n]);
    }

    pub fn read_obj<T: FromBytes>(&self, gpa: u64) -> T {
        T::read_from_bytes(&self.read(gpa, size_of::<T>())).unwrap()
    }

    pub fn write_obj<T: IntoBytes + Immutable>(&self, gpa: u64, v: &T) {
        self.write(gpa, v.as_bytes());
    }

    fn atomic32(&self, gpa: u64) -> &AtomicU32 {
        assert_eq!(gpa % 4, 0);
        // SAFETY: aligned, in bounds, and the mapping lives as long as self.
        unsafe { AtomicU32::from_ptr(self.at(gpa, 4).cast()) }
    }

    fn atomic16(&self, gpa: u64) -> &AtomicU16 {
        assert_eq!(gpa % 2, 0);
        // SAFETY: as `atomic32`.
        unsafe { AtomicU16::from_ptr(self.at(gpa, 2).cast()) }
    }

    /// Little-endian words, as single aligned atomic accesses (§8).
    pub fn load32(&self, gpa: u64) -> u32 {
        u32::from_le(self.atomic32(gpa).load(Ordering::Acquire))
    }

    pub fn store32(&self, gpa: u64, v: u32) {
        self.atomic32(gpa).store(v.to_le(), Ordering::Release);
    }

    pub fn load16(&self, gpa: u64) -> u16 {
        u16::from_le(self.atomic16(gpa).load(Ordering::Acquire))
    }

    pub fn store16(&self, gpa: u64, v: u16) {
        self.atomic16(gpa).store(v.to_le(), Ordering::Release);
    }

    pub fn load64(&self, gpa: u64) -> u64 {
        assert_eq!(gpa % 8, 0);
        // SAFETY: as `atomic32`.
        let a = unsafe { AtomicU64::from_ptr(self.at(gpa, 8).cast()) };
        u64::from_le(a.load(Ordering::Acquire))
    }

    /// Atomic OR of `bits` into the little-endian word at `gpa` (§5.8).
    pub fn or64(&self, gpa: u64, bits: u64) {
        assert_eq!(gpa % 8, 0);
        // SAFETY: as `atomic32`.
        let a = unsafe { AtomicU64::from_ptr(self.at(gpa, 8).cast()) };
        a.fetch_or(bits.to_le(), Ordering::SeqCst);
    }

    /// `bytes` of fresh zeroed memory, page aligned.
    pub fn alloc(&mut self, bytes: u64) -> u64 {
        let at = self.heap;
        self.heap += bytes.max(1).next_multiple_of(PAGE_SIZE);
        assert!(self.heap as usize <= MEM, "out of test memory");
        at
    }

    /// Makes chain `head` available on control or notification queue `q`.
    pub fn publish_avail(&mut self, q: usize, head: u16) {
        let base = RINGS + q as u64 * 0x1000;
        let slot = u64::from(self.avail[q] % QUEUE);
        self.store16(base + AVAIL + AVAIL_RING + slot * 2, head);
        self.avail[q] = self.avail[q].wrapping_add(1);
        self.store16(base + AVAIL + AVAIL_IDX, self.avail[q]);
    }

    /// The available index of queue `q` as published, stored as `idx`
    /// without any chain behind it (§2.1's broken queue).
    pub fn publish_avail_index(&mut self, q: usize, idx: u16) {
        self.store16(RINGS + q as u64 * 0x1000 + AVAIL + AVAIL_IDX, idx);
    }

    /// Queue `q`'s used index as the device published it.
    pub fn used_index(&self, q: usize) -> u16 {
        self.load16(RINGS + q as u64 * 0x1000 + USED + USED_IDX)
    }

    /// The next used element of queue `q` (id, length), if any.
    pub fn take_used(&mut self, q: usize) -> Option<(u32, u32)> {
        let base = RINGS + q as u64 * 0x1000;
        if self.used_index(q) == self.used[q] {
            return None;
        }
        let slot = usize::from(self.used[q] % QUEUE);
        let at = base + USED + USED_RING + (size_of::<VirtqUsedElem>() * slot) as u64;
        let e = self.read(at, size_of::<VirtqUsedElem>());
        let e = VirtqUsedElem::from_slice(&e).copied().unwrap();
        self.used[q] = self.used[q].wrapping_add(1);
        Some((e.id(), e.len()))
    }

    /// Posts one chain on the control queue (`descs[i]` at table index i,
    /// starting at `head`), kicks it and waits for its completion: the used
    /// length.
    pub fn control_chain(&mut self, descs: &[Descriptor], head: u16) -> u32 {
        self.submit(descs, head);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some((id, len)) = self.take_used(0) {
                assert_eq!(id, u32::from(head), "completed another chain");
                return len;
            }
            assert!(
                Instant::now() < deadline,
                "no completion on the control queue"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Posts one chain on the control queue and kicks it, without waiting.
    pub fn submit(&mut self, descs: &[Descriptor], head: u16) {
        for (i, d) in descs.iter().enumerate() {
            self.write(RINGS + (i * size_of::<Descriptor>()) as u64, d.as_slice());
        }
        self.publish_avail(0, head);
        self.kicks[0].write(1).unwrap();
    }

    /// The response at `RESP` after a completion of `used` bytes: (used,
    /// status, result). The header's reserved word must be 0 (§4).
    pub fn response(&self, used: u32) -> (u32, u32, Vec<u8>) {
        let h: RespHeader = self.read_obj(RESP);
        if used < size_of::<RespHeader>() as u32 {
            return (used, u32::MAX, Vec::new());
        }
        assert_eq!(h.reserved.get(), 0, "response header reserved word");
        (used, h.status.get(), self.read(RESP + 8, used as usize - 8))
    }

    /// Sends request bytes `req` (one readable descriptor) with a response
    /// buffer of 8 + `room` bytes: (used, status, result).
    pub fn request_bytes(&mut self, req: &[u8], room: u32) -> (u32, u32, Vec<u8>) {
        self.write(REQ, req);
        self.fill(RESP, 0x1000, 0xee);
        let descs = [
            desc(REQ, req.len() as u32, F_NEXT, 1),
            desc(RESP, 8 + room, F_WRITE, 0),
        ];
        let used = self.control_chain(&descs, 0);
        self.response(used)
    }

    /// A request with header (opcode, reserved) and `payload`, and `room`
    /// bytes for the result: (used, status, result).
    pub fn request(
        &mut self,
        opcode: u32,
        reserved: u32,
        payload: &[u8],
        room: u32,
    ) -> (u32, u32, Vec<u8>) {
        let h = CmdHeader {
            opcode: opcode.into(),
            reserved: reserved.into(),
        };
        let mut req = h.as_bytes().to_vec();
        req.extend_from_slice(payload);
        self.request_bytes(&req, room)
    }

    /// One command with room for any result: (status, result).
    pub fn command(&mut self, opcode: u32, payload: &[u8]) -> (u32, Vec<u8>) {
        let (used, code, result) = self.request(opcode, 0, payload, 504);
        assert_eq!(used as usize, 8 + result.len());
        (code, result)
    }

    /// A command that must succeed: its result.
    pub fn ok(&mut self, opcode: u32, payload: &[u8]) -> Vec<u8> {
        let (code, result) = self.command(opcode, payload);
        assert_eq!(code, status::OK, "command {opcode:#x} failed");
        result
    }

    /// The status of a command.
    pub fn status(&mut self, opcode: u32, payload: &(impl IntoBytes + Immutable + ?Sized)) -> u32 {
        self.command(opcode, payload.as_bytes()).0
    }

    /// CREATE_PD with a zeroed bitmap on a page of its own.
    pub fn pd(&mut self) -> Pd {
        let bitmap = self.alloc(PAGE_SIZE);
        let a = CreatePd {
            doorbell_gpa: bitmap.into(),
        };
        let r = self.ok(cmd::CREATE_PD, a.as_bytes());
        let c = PdCreated::read_from_bytes(&r).expect("8-byte CREATE_PD result");
        Pd {
            id: c.id.get(),
            queue: c.doorbell_queue.get(),
            bitmap,
        }
    }

    /// A CREATE_ENDPOINT payload on fresh memory: a control region for
    /// `layout`, `pages` contiguous segment pages and their page table.
    pub fn endpoint_args(&mut self, pd: u32, layout: RingLayout, pages: u32) -> CreateEndpoint {
        let ctrl_len = layout.region_size().next_multiple_of(PAGE_SIZE);
        let ctrl = self.alloc(ctrl_len);
        let seg = self.alloc(u64::from(pages) * PAGE_SIZE);
        let table = self.alloc(u64::from(pages) * 8);
        let entries: Vec<U64> = (0..u64::from(pages))
            .map(|i| U64::new(seg + i * PAGE_SIZE))
            .collect();
        self.write(table, entries.as_bytes());
        CreateEndpoint {
            pd: pd.into(),
            send_entries: layout.send_entries.into(),
            recv_entries: layout.recv_entries.into(),
            free_entries: layout.free_entries.into(),
            event_entries: layout.event_entries.into(),
            seg_pages: pages.into(),
            ctrl_gpa: ctrl.into(),
            ctrl_len: ctrl_len.into(),
            seg_table_gpa: table.into(),
        }
    }

    /// CREATE_ENDPOINT with `args` made by `endpoint_args` (segment pages
    /// contiguous from the first table entry).
    pub fn create(&mut self, pd: Pd, args: &CreateEndpoint) -> Ep {
        let r = self.ok(cmd::CREATE_ENDPOINT, args.as_bytes());
        let c = EndpointCreated::read_from_bytes(&r).expect("8-byte result");
        assert_eq!(c.doorbell_queue.get(), pd.queue, "its domain's doorbell");
        let pages = u64::from(args.seg_pages.get());
        let seg = if pages > 0 {
            self.read_obj::<U64>(args.seg_table_gpa.get()).get()
        } else {
            0
        };
        Ep {
            id: c.id.get(),
            pd,
            ctrl: args.ctrl_gpa.get(),
            layout: RingLayout {
                send_entries: args.send_entries.get(),
                recv_entries: args.recv_entries.get(),
                free_entries: args.free_entries.get(),
                event_entries: args.event_entries.get(),
            },
            seg,
            seg_len: pages * PAGE_SIZE,
            send_prod: 0,
            recv_cons: 0,
            free_prod: 0,
            event_cons: 0,
        }
    }

    /// An endpoint of `pd` with rings `layout` and `pages` segment pages.
    pub fn endpoint_in(&mut self, pd: Pd, layout: RingLayout, pages: u32) -> Ep {
        let args = self.endpoint_args(pd.id, layout, pages);
        self.create(pd, &args)
    }

    pub fn bind(&mut self, ep: &Ep, port: u32) {
        let a = BindPort {
            endpoint: ep.id.into(),
            port: port.into(),
        };
        self.ok(cmd::BIND_PORT, a.as_bytes());
    }

    /// An endpoint in a domain of its own, rings `SMALL`, two segment
    /// pages, bound to `port`.
    pub fn bound(&mut self, port: u32) -> Ep {
        let pd = self.pd();
        let ep = self.endpoint_in(pd, SMALL, 2);
        self.bind(&ep, port);
        ep
    }

    /// GET_STATS of `ep`, as the spec's §7 names them.
    pub fn stats(&mut self, ep: &Ep) -> Vec<(&'static str, u64)> {
        let r = self.ok(cmd::GET_STATS, ObjectId { id: ep.id.into() }.as_bytes());
        assert_eq!(r.len(), 136, "17 u64 counters");
        let values = <[U64]>::ref_from_bytes(&r).unwrap();
        ulnic_abi::STAT_NAMES
            .iter()
            .zip(values)
            .map(|(n, v)| (*n, v.get()))
            .collect()
    }

    /// One counter of `ep` (§7).
    pub fn stat(&mut self, ep: &Ep, name: &str) -> u64 {
        let s = self.stats(ep);
        s.iter().find(|(n, _)| *n == name).expect("a §7 counter").1
    }

    /// The control-block word at `off` (§5.2).
    pub fn word(&self, ep: &Ep, off: u64) -> u32 {
        self.load32(ep.ctrl + off)
    }

    pub fn set_word(&self, ep: &Ep, off: u64, v: u32) {
        self.store32(ep.ctrl + off, v);
    }

    /// Condition `c`'s pending byte (§5.2, §5.10).
    pub fn pending(&self, ep: &Ep, c: u16) -> u8 {
        self.read(ep.ctrl + ctrl::CONDITION_PENDING + u64::from(c), 1)[0]
    }

    pub fn clear_pending(&self, ep: &Ep, c: u16) {
        self.write(ep.ctrl + ctrl::CONDITION_PENDING + u64::from(c), &[0]);
    }

    /// Writes `d` into `ep`'s next send slot and publishes the producer
    /// index, without a doorbell.
    pub fn publish(&self, ep: &mut Ep, d: &[u8]) {
        assert_eq!(d.len() as u64, ulnic_abi::SEND_DESC_SIZE);
        let slot = u64::from(ep.send_prod % ep.layout.send_entries);
        let at = ep.ctrl + ep.layout.send_offset() + slot * ulnic_abi::SEND_DESC_SIZE;
        self.write(at, d);
        ep.send_prod = ep.send_prod.wrapping_add(1);
        self.set_word(ep, ctrl::SEND_PRODUCER, ep.send_prod);
    }

    /// Posts `d` as §5.8 says: publish, full fence, read `doorbell
    /// wanted`, and ring if it is set.
    pub fn post(&self, ep: &mut Ep, d: &(impl IntoBytes + Immutable)) {
        self.publish(ep, d.as_bytes());
        fence(Ordering::SeqCst);
        if self.word(ep, ctrl::DOORBELL_WANTED) != 0 {
            self.ring(ep);
        }
    }

    /// Sets `ep`'s bit in its domain's bitmap and kicks the doorbell.
    pub fn ring(&self, ep: &Ep) {
        self.set_bit(ep.pd, ep.id);
        self.kick(ep.pd.queue);
    }

    /// Sets endpoint `e`'s bit in `pd`'s doorbell bitmap (§5.8).
    pub fn set_bit(&self, pd: Pd, e: u32) {
        self.or64(pd.bitmap + bitmap::word_offset(e), bitmap::mask(e));
    }

    pub fn kick(&self, q: u32) {
        self.kicks[q as usize].write(1).unwrap();
    }

    /// Waits until the device has consumed `n` send descriptors of `ep`.
    pub fn until_sent(&self, ep: &Ep, n: u32) {
        until("send descriptors consumed", || {
            self.word(ep, ctrl::SEND_CONSUMER) == n
        });
    }

    /// Events posted and not consumed yet.
    pub fn events(&self, ep: &Ep) -> u32 {
        self.word(ep, ctrl::EVENT_PRODUCER)
            .wrapping_sub(ep.event_cons)
    }

    /// The next event of `ep` (waiting for it); its consumer index moves.
    pub fn event(&self, ep: &mut Ep) -> EventRecord {
        until("an event", || self.events(ep) > 0);
        let slot = u64::from(ep.event_cons % ep.layout.event_entries);
        let at = ep.ctrl + ep.layout.event_offset() + slot * ulnic_abi::EVENT_SIZE;
        let e: EventRecord = self.read_obj(at);
        ep.event_cons = ep.event_cons.wrapping_add(1);
        self.set_word(ep, ctrl::EVENT_CONSUMER, ep.event_cons);
        e
    }

    /// Messages delivered and not consumed yet.
    pub fn received(&self, ep: &Ep) -> u32 {
        self.word(ep, ctrl::RECV_PRODUCER)
            .wrapping_sub(ep.recv_cons)
    }

    /// The next receive descriptor of `ep` (waiting for it).
    pub fn recv(&self, ep: &mut Ep) -> RecvDesc {
        until("a message", || self.received(ep) > 0);
        let slot = u64::from(ep.recv_cons % ep.layout.recv_entries);
        let at = ep.ctrl + ep.layout.recv_offset() + slot * ulnic_abi::RECV_DESC_SIZE;
        let r: RecvDesc = self.read_obj(at);
        ep.recv_cons = ep.recv_cons.wrapping_add(1);
        self.set_word(ep, ctrl::RECV_CONSUMER, ep.recv_cons);
        r
    }

    /// Posts a free descriptor (§5.5) as given.
    pub fn give_desc(&self, ep: &mut Ep, f: &FreeDesc) {
        let slot = u64::from(ep.free_prod % ep.layout.free_entries);
        let at = ep.ctrl + ep.layout.free_offset() + slot * ulnic_abi::FREE_DESC_SIZE;
        self.write_obj(at, f);
        ep.free_prod = ep.free_prod.wrapping_add(1);
        self.set_word(ep, ctrl::FREE_PRODUCER, ep.free_prod);
    }

    /// Posts a free buffer of `len` bytes at `offset` of the segment.
    pub fn give(&self, ep: &mut Ep, offset: u64, len: u32, user: u64) {
        let f = FreeDesc {
            seg_offset: offset.into(),
            len: len.into(),
            reserved0: 0.into(),
            user_id: user.into(),
            reserved1: 0.into(),
        };
        self.give_desc(ep, &f);
    }

    /// The config space (§2.2).
    pub fn config(&mut self) -> ConfigSpace {
        let (_, b) = self
            .fe
            .get_config(0, 64, VhostUserConfigFlags::WRITABLE, &[0; 64])
            .unwrap();
        ConfigSpace::read_from_bytes(&b).expect("64 bytes of config space")
    }

    /// The config-space word at `offset`.
    pub fn config_word(&mut self, offset: u32) -> u32 {
        let (_, b) = self
            .fe
            .get_config(offset, 4, VhostUserConfigFlags::WRITABLE, &[0; 4])
            .unwrap();
        u32::from_le_bytes(b[..4].try_into().unwrap())
    }

    /// §2.4 step 6: every notification buffer posted, then one kick.
    pub fn post_notification_buffers(&mut self) {
        for i in 0..QUEUE {
            let at = RINGS + 0x1000 + u64::from(i) * size_of::<Descriptor>() as u64;
            self.write(at, desc(NOTES + u64::from(i) * 8, 8, F_WRITE, 0).as_slice());
            self.publish_avail(1, i);
        }
        self.kicks[1].write(1).unwrap();
    }

    /// The next notification record (§6) within `wait`, as (used length,
    /// record); its buffer is posted again (and kicked: T = 1).
    pub fn notification(&mut self, wait: Duration) -> Option<(u32, NotifyRecord)> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some((id, len)) = self.take_used(1) {
                let at = NOTES + u64::from(id) * 8;
                let rec: NotifyRecord = self.read_obj(at);
                self.fill(at, 8, 0xee);
                self.publish_avail(1, id as u16);
                self.kicks[1].write(1).unwrap();
                return Some((len, rec));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// A notification that came before the device settled (`settled`).
    pub fn notification_once_settled(
        &mut self,
        dev: &ulnic_device::device::Device,
    ) -> Option<(u32, NotifyRecord)> {
        settled(dev, &[self]);
        self.notification(Duration::ZERO)
    }

    /// Whether every kick written to the device was taken (its eventfd
    /// reads empty).
    pub fn kicks_taken(&self) -> bool {
        self.kicks.iter().all(|k| {
            let mut p = libc::pollfd {
                fd: k.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            unsafe { libc::poll(&mut p, 1, 0) == 0 }
        })
    }

    /// Whether the device closed the connection: a request fails.
    pub fn closed(&mut self) -> bool {
        let deadline = Instant::now() + WAIT;
        while self.fe.get_features().is_ok() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `bare`, used by nothing
        // else (the device has its own).
        unsafe { libc::munmap(self.mem.cast(), MEM) };
    }
}

/// Node `node`'s live endpoints, epoch and queue errors, as the device
/// holds them.
pub fn node_state(dev: &Device, node: usize) -> (usize, u32, u64) {
    let shard = dev.shard_of(node as u32);
    let f = shard.lock();
    let n = &f.nodes[node];
    let live = n.endpoints.iter().filter(|e| e.is_some()).count();
    (live, n.epoch, n.queue_errors)
}

/// The objects node `node` holds (a refused command changes none, §4).
pub fn counts(dev: &Device, node: usize) -> ObjectCounts {
    dev.shard_of(node as u32).lock().nodes[node].object_counts()
}

/// Waits until node `node` has no frontend (its last one was released),
/// so the next connection is served (§2: one frontend at a time).
pub fn released(dev: &Device, node: usize) {
    until("the node released", || {
        dev.shard_of(node as u32).lock().nodes[node]
            .disconnect
            .is_none()
    });
}

/// The device's accepted virtio features, as the frontend crate names the
/// protocol bit.
pub fn protocol_bit() -> u64 {
    VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
}

/// §4.2's table, numbers as the spec writes them: (opcode, payload bytes,
/// result bytes, features). SET_FILTER's payload is 8 + 16 × count; 8
/// here (count 0).
pub const COMMANDS: [(u32, usize, usize, u64); 23] = {
    use ulnic_abi::{F_MESSAGING as M, F_PIO as P, F_RDMA as R, F_TRIPWIRE as T, F_UTLB as U};
    [
        (0x01, 0, 40, 0),          // GET_INFO
        (0x02, 8, 8, M),           // CREATE_PD
        (0x03, 4, 0, M),           // DESTROY_PD
        (0x04, 4, 0, 0),           // ACK_RESET
        (0x10, 48, 8, M),          // CREATE_ENDPOINT
        (0x11, 4, 0, M),           // DESTROY_ENDPOINT
        (0x12, 8, 0, M),           // BIND_PORT
        (0x13, 8, 0, M),           // SET_FILTER
        (0x14, 4, 0, M),           // ARM
        (0x15, 4, 0, M),           // DISARM
        (0x16, 4, 136, M),         // GET_STATS
        (0x17, 16, 0, M),          // SET_EVENT_QUEUE
        (0x18, 16, 24, M | P),     // EXPORT_PIO
        (0x19, 24, 16, M | P),     // IMPORT_PIO
        (0x1a, 8, 0, M | P),       // REVOKE_PIO
        (0x1b, 8, 0, M | P),       // RELEASE_PIO
        (0x20, 16, 0, M | U),      // UTLB_SET_TABLE
        (0x21, 12, 0, M | U),      // UTLB_INVALIDATE
        (0x30, 24, 24, M | R),     // EXPORT
        (0x31, 8, 0, M | R),       // REVOKE
        (0x32, 32, 24, M | R | U), // EXPORT_BUFFER
        (0x40, 40, 4, M | R | T),  // SET_TRIPWIRE
        (0x41, 8, 0, M | R | T),   // CLEAR_TRIPWIRE
    ]
};

impl Raw {
    /// Leaves `d` as `ep`'s close message (§5.11): the descriptor first,
    /// its first word last.
    pub fn set_close_message(&self, ep: &Ep, d: &SendDesc) {
        let at = ep.ctrl + ctrl::CLOSE_MESSAGE;
        self.write(at + 4, &d.as_bytes()[4..]);
        self.write(at, &d.as_bytes()[..4]);
    }

    /// DESTROY_ENDPOINT, which must succeed.
    pub fn destroy(&mut self, ep: &Ep) {
        self.ok(
            cmd::DESTROY_ENDPOINT,
            ObjectId { id: ep.id.into() }.as_bytes(),
        );
    }
}

impl Raw {
    /// EXPORT of `[offset, offset + len)` of `ep`'s segment, which must
    /// succeed: the cookie (§5.12).
    pub fn export(&mut self, ep: &Ep, offset: u64, len: u64, perms: u32) -> Cookie {
        let a = Export {
            endpoint: ep.id.into(),
            perms: perms.into(),
            offset: offset.into(),
            len: len.into(),
        };
        let r = self.ok(cmd::EXPORT, a.as_bytes());
        Cookie::read_from_bytes(&r).expect("a 24-byte cookie")
    }
}
