//! The device's vhost-user message handling (spec §2), through a real
//! node socket of a running device: each input is one frontend's whole
//! connection. Optionally a valid bring-up first (features, a memory
//! table whose memfd holds a ring the input fills, one queue set up,
//! enabled and kicked), then arbitrary messages with arbitrary headers,
//! payloads and attached descriptors (eventfds, memfds of any size, a pipe,
//! none). The device must survive every connection (a crash or SIGBUS ends
//! the run) and let go of the node within a few seconds of the frontend
//! leaving, so that the next connection is served.
#![no_main]

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vhost::vhost_user::message::{
    FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use ulnic_device::{Configuration, Device};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Where the frontend says its memory lives in its own address space.
const USER_BASE: u64 = 0x7f00_0000_0000;
const MEM_LEN: u64 = 64 << 10;
const QUEUE_SIZE: u32 = 8;
const DESC: u64 = 0;
const AVAIL: u64 = 0x800;
const USED: u64 = 0x1000;
/// Where the input's buffer bytes land (descriptors may point here).
const BUFFERS: u64 = 0x2000;

// vhost-user request codes used by the bring-up: the vhost crate's.
const GET_FEATURES: u32 = FrontendReq::GET_FEATURES as u32;
const SET_FEATURES: u32 = FrontendReq::SET_FEATURES as u32;
const SET_OWNER: u32 = FrontendReq::SET_OWNER as u32;
const SET_MEM_TABLE: u32 = FrontendReq::SET_MEM_TABLE as u32;
const SET_VRING_NUM: u32 = FrontendReq::SET_VRING_NUM as u32;
const SET_VRING_ADDR: u32 = FrontendReq::SET_VRING_ADDR as u32;
const SET_VRING_BASE: u32 = FrontendReq::SET_VRING_BASE as u32;
const SET_VRING_KICK: u32 = FrontendReq::SET_VRING_KICK as u32;
const SET_VRING_CALL: u32 = FrontendReq::SET_VRING_CALL as u32;
const SET_PROTOCOL_FEATURES: u32 = FrontendReq::SET_PROTOCOL_FEATURES as u32;
const SET_VRING_ENABLE: u32 = FrontendReq::SET_VRING_ENABLE as u32;
/// Version 1, as every frontend request carries.
const VERSION: u32 = 1;
const PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
const VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
const PROTOCOLS: u64 = VhostUserProtocolFeatures::MQ
    .union(VhostUserProtocolFeatures::REPLY_ACK)
    .union(VhostUserProtocolFeatures::CONFIG)
    .bits();

struct Target {
    device: Device,
    _dir: TempDir,
    socket: std::path::PathBuf,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn target() -> &'static Target {
    static T: OnceLock<Target> = OnceLock::new();
    T.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ulnic-fuzz-vhost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let sockets = Configuration::socket_paths(&dir, 2);
        let config = Configuration::builder(sockets.clone())
            .max_endpoints(4)
            .poll_for(Duration::from_micros(50))
            .build()
            .expect("a valid configuration");
        let device = Device::start(config).expect("device starts");
        Target {
            device: device,
            _dir: TempDir(dir),
            socket: sockets[0].clone(),
        }
    })
}

/// Reads fuzz input front to back; runs dry as zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let s = self.bytes(4);
        b[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(b)
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

fn memfd(len: u64, fill: &[u8]) -> File {
    // SAFETY: valid NUL-terminated name; the new descriptor is ours.
    let fd = unsafe { libc::memfd_create(c"ulnic-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nothing else owns.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).expect("memfd size");
    let _ = f.write_all(&fill[..fill.len().min(len as usize)]);
    f
}

fn send(sock: &UnixStream, request: u32, flags: u32, payload: &[u8], fds: &[RawFd]) {
    let mut msg = Vec::with_capacity(12 + payload.len());
    msg.extend_from_slice(&request.to_le_bytes());
    msg.extend_from_slice(&flags.to_le_bytes());
    msg.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    msg.extend_from_slice(payload);
    // The device may already have hung up on an earlier message: that is
    // its right, and the rest of the input simply goes nowhere.
    let _ = sock.send_with_fds(&[&msg[..]], fds);
}

fn pair(a: u32, b: u32) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

/// The valid bring-up of one queue over a memfd whose ring the input fills.
/// Returns the memfd (to watch the used ring) and the kick eventfd.
fn bring_up(sock: &UnixStream, input: &mut Input<'_>) -> (File, EventFd, u32) {
    let features = input.u64() & ulnic_abi::F_IMPLEMENTED;
    let queue = u32::from(input.u8() % 3);
    let mut image = vec![0u8; MEM_LEN as usize];
    let ring = input.bytes(16 * QUEUE_SIZE as usize + 4 + 2 * QUEUE_SIZE as usize);
    let (desc, avail) = ring.split_at(ring.len().min(16 * QUEUE_SIZE as usize));
    image[DESC as usize..][..desc.len()].copy_from_slice(desc);
    image[AVAIL as usize..][..avail.len()].copy_from_slice(avail);
    let buffers = input.bytes(1024);
    image[BUFFERS as usize..][..buffers.len()].copy_from_slice(buffers);
    let mem = memfd(MEM_LEN, &image);

    send(sock, SET_OWNER, VERSION, &[], &[]);
    send(sock, GET_FEATURES, VERSION, &[], &[]);
    send(
        sock,
        SET_FEATURES,
        VERSION,
        &(VERSION_1 | PROTOCOL_FEATURES | features).to_le_bytes(),
        &[],
    );
    send(
        sock,
        SET_PROTOCOL_FEATURES,
        VERSION,
        &PROTOCOLS.to_le_bytes(),
        &[],
    );
    let mut table = pair(1, 0);
    for v in [0, MEM_LEN, USER_BASE, 0] {
        table.extend_from_slice(&u64::to_le_bytes(v));
    }
    send(sock, SET_MEM_TABLE, VERSION, &table, &[mem.as_raw_fd()]);
    send(sock, SET_VRING_NUM, VERSION, &pair(queue, QUEUE_SIZE), &[]);
    let mut addr = pair(queue, 0);
    for v in [USER_BASE + DESC, USER_BASE + USED, USER_BASE + AVAIL, 0] {
        addr.extend_from_slice(&u64::to_le_bytes(v));
    }
    send(sock, SET_VRING_ADDR, VERSION, &addr, &[]);
    send(sock, SET_VRING_BASE, VERSION, &pair(queue, 0), &[]);
    let kick = EventFd::new(libc::EFD_NONBLOCK).expect("eventfd");
    let call = EventFd::new(libc::EFD_NONBLOCK).expect("eventfd");
    for (request, fd) in [(SET_VRING_KICK, &kick), (SET_VRING_CALL, &call)] {
        let index = u64::from(queue).to_le_bytes();
        send(sock, request, VERSION, &index, &[fd.as_raw_fd()]);
    }
    send(sock, SET_VRING_ENABLE, VERSION, &pair(queue, 1), &[]);
    (mem, kick, queue)
}

/// One arbitrary message: request code, flags, payload and descriptors all
/// from the input.
fn arbitrary_message(sock: &UnixStream, input: &mut Input<'_>, keep: &mut Vec<OwnedFd>) {
    let request = u32::from(input.u8() % 48);
    let shape = input.u8();
    // Mostly well-formed headers (version 1, maybe NEED_REPLY), sometimes raw.
    let flags = if shape & 0x80 == 0 {
        VERSION | u32::from(shape & 0x08)
    } else {
        input.u32()
    };
    let len = usize::from(input.u8()) + if shape & 0x40 != 0 { 256 } else { 0 };
    let payload = input.bytes(len).to_vec();
    let mut fds = Vec::new();
    match shape & 0x07 {
        1 | 2 => {
            let e = EventFd::new(libc::EFD_NONBLOCK).expect("eventfd");
            // SAFETY: dup of a live eventfd gives a descriptor we own.
            keep.push(unsafe { OwnedFd::from_raw_fd(libc::dup(e.as_raw_fd())) });
        }
        3 | 4 => {
            let pages = u64::from(input.u8() % 32);
            let fill = input.bytes(64).to_vec();
            keep.push(memfd(pages * 4096 + u64::from(shape & 1) * 100, &fill).into());
        }
        5 => {
            let mut p = [0; 2];
            // SAFETY: pipe writes two descriptors into the array, which we own.
            if unsafe { libc::pipe(p.as_mut_ptr()) } == 0 {
                // SAFETY: both descriptors are fresh and ours.
                unsafe {
                    keep.push(OwnedFd::from_raw_fd(p[0]));
                    keep.push(OwnedFd::from_raw_fd(p[1]));
                }
            }
        }
        _ => {}
    }
    if shape & 0x07 != 0 {
        fds.extend(
            keep.iter()
                .rev()
                .take(1 + usize::from(shape & 0x10 != 0))
                .map(|f| f.as_raw_fd()),
        );
    }
    send(sock, request, flags, &payload, &fds);
}

/// Waits for the device to have let go of the node after our connection
/// ended; a device that holds on to it would refuse every later frontend.
fn wait_released(before: u64) {
    let t = target();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        {
            let f = t.device.shard().lock();
            let n = &f.nodes[0];
            if n.connections > before && n.disconnect.is_none() {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the device did not release node 0 within 10 s of the frontend leaving"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

fuzz_target!(|data: &[u8]| {
    let t = target();
    let mut input = Input(data);
    let before = t.device.shard().lock().nodes[0].connections;
    let sock = UnixStream::connect(&t.socket).expect("connect to node 0");
    let mode = input.u8();
    let mut keep = Vec::new();
    let ring = (mode & 1 != 0).then(|| bring_up(&sock, &mut input));
    for _ in 0..(mode >> 1) % 16 {
        if input.0.is_empty() {
            break;
        }
        arbitrary_message(&sock, &mut input, &mut keep);
    }
    if let Some((mem, kick, _queue)) = &ring {
        let _ = kick.write(1);
        // Give the device a moment to walk the ring before the frontend
        // leaves (it may answer with a used entry, or break the queue).
        let deadline = Instant::now() + Duration::from_millis(2);
        let mut idx = [0u8; 2];
        while Instant::now() < deadline {
            use std::os::unix::fs::FileExt;
            if mem.read_exact_at(&mut idx, USED + 2).is_ok() && idx != [0, 0] {
                break;
            }
            std::thread::yield_now();
        }
    }
    drop(sock);
    wait_released(before);
});
