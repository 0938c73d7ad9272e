//! `ulnic driver-fuzz`: a hostile process against the Linux driver
//! (spec §9). From a seed, it calls every ioctl of /dev/ulnicN with random
//! and boundary arguments (bad pointers included), maps and unmaps the
//! driver's regions at random offsets and lengths (partial unmaps too),
//! scribbles over its own rings and rings doorbells, opens and closes the
//! device under live mappings. Afterwards it reads the kernel log: an Oops,
//! BUG, WARNING or general protection fault there fails the run. The same
//! seed gives the same sequence of calls.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use ulnic_abi::uapi;
use ulnic_abi::wire::{self, IocCommand, IocCreateEp, IocUtlbInstall, IocWait, ObjectId};
use zerocopy::{FromZeros, IntoBytes};

/// What one run did, by operation and outcome.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    /// The seed the run used.
    pub seed: u64,
    /// Operations performed.
    pub operations: u64,
    /// Per operation: outcome ("ok" or an errno name) -> count.
    pub outcomes: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// Kernel log lines that show a driver or kernel fault.
    pub kernel_faults: Vec<String>,
}

/// One open of the device (one protection domain) and what it created.
struct Domain {
    file: File,
    endpoints: Vec<Endpoint>,
}

#[derive(Clone, Copy)]
struct Endpoint {
    id: u32,
    ctrl_len: u64,
    seg_len: u64,
}

/// A live mapping of one of the driver's regions.
struct Mapping {
    addr: usize,
    len: usize,
    /// The doorbell page takes only aligned 16-bit stores of a queue index.
    doorbell: bool,
}

const PAGE: usize = ulnic_abi::PAGE_SIZE as usize;
/// Pages of our own memory offered to UTLB_INSTALL.
const BUFFER_PAGES: usize = 64;
/// The driver's fault-injection toggle and memory budget.
const FAIL_ALLOC: &str = "/sys/module/ulnic/parameters/fail_alloc";
const MEM_LIMIT: &str = "/sys/module/ulnic/parameters/mem_limit_mb";
/// An address in the kernel's direct map: never a user address.
const KERNEL_ADDRESS: u64 = 0xffff_8880_0000_0000;

fn boundary_u32(rng: &mut StdRng) -> u32 {
    const B: [u32; 20] = [
        0,
        1,
        2,
        7,
        8,
        16,
        63,
        64,
        65,
        4095,
        4096,
        4097,
        65535,
        65536,
        65537,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_fffe,
        0xffff_ffff,
        0x1_0000 * 16,
    ];
    if rng.gen_bool(0.2) {
        rng.gen()
    } else {
        *B.choose(rng).unwrap_or(&0)
    }
}

fn boundary_u64(rng: &mut StdRng) -> u64 {
    const B: [u64; 12] = [
        0,
        1,
        4095,
        4096,
        4097,
        1 << 16,
        1 << 20,
        uapi::MAX_SEGMENT_BYTES,
        uapi::MAX_SEGMENT_BYTES + 1,
        1 << 32,
        u64::MAX - 4095,
        u64::MAX,
    ];
    if rng.gen_bool(0.2) {
        rng.gen()
    } else {
        *B.choose(rng).unwrap_or(&0)
    }
}

pub(crate) fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ENOENT) => "ENOENT".into(),
        Some(libc::EINTR) => "EINTR".into(),
        Some(libc::EIO) => "EIO".into(),
        Some(libc::ENOMEM) => "ENOMEM".into(),
        Some(libc::EFAULT) => "EFAULT".into(),
        Some(libc::EBUSY) => "EBUSY".into(),
        Some(libc::EEXIST) => "EEXIST".into(),
        Some(libc::ENODEV) => "ENODEV".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::ENOSPC) => "ENOSPC".into(),
        Some(libc::ENOTTY) => "ENOTTY".into(),
        Some(libc::EAGAIN) => "EAGAIN".into(),
        Some(libc::EPROTO) => "EPROTO".into(),
        Some(libc::ETIMEDOUT) => "ETIMEDOUT".into(),
        Some(n) => format!("errno {n}"),
        None => e.to_string(),
    }
}

struct Fuzzer {
    rng: StdRng,
    path: String,
    domains: Vec<Domain>,
    maps: Vec<Mapping>,
    /// Our own pages for UTLB_INSTALL.
    buffer: Vec<u8>,
    report: Report,
}

impl Fuzzer {
    fn record(&mut self, op: &'static str, r: Result<i32, std::io::Error>) {
        let outcome = match r {
            Ok(_) => "ok".to_string(),
            Err(e) => errno_name(&e),
        };
        *self
            .report
            .outcomes
            .entry(op)
            .or_default()
            .entry(outcome)
            .or_default() += 1;
        self.report.operations += 1;
    }

    fn open(&mut self) -> Result<i32, std::io::Error> {
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&self.path)?;
        self.domains.push(Domain {
            file,
            endpoints: Vec::new(),
        });
        Ok(0)
    }

    /// Some domain, or none when every file is closed.
    fn domain(&mut self) -> Option<usize> {
        (!self.domains.is_empty()).then(|| self.rng.gen_range(0..self.domains.len()))
    }

    /// An endpoint id: mostly one the domain owns, else a boundary value.
    fn endpoint_id(&mut self, d: usize) -> u32 {
        let own = &self.domains[d].endpoints;
        if !own.is_empty() && self.rng.gen_bool(0.7) {
            own[self.rng.gen_range(0..own.len())].id
        } else if self.rng.gen_bool(0.5) {
            self.rng.gen_range(0..20)
        } else {
            boundary_u32(&mut self.rng)
        }
    }

    /// A pointer argument: mostly `buf`, sometimes NULL, a kernel address,
    /// or an address just past a page we do not have.
    fn pointer(&mut self, buf: &mut [u8]) -> *mut u8 {
        match self.rng.gen_range(0..20) {
            0 => std::ptr::null_mut(),
            1 => KERNEL_ADDRESS as *mut u8,
            2 => 8 as *mut u8,
            _ => buf.as_mut_ptr(),
        }
    }

    fn ioctl(&self, d: usize, req: u32, arg: *mut u8) -> Result<i32, std::io::Error> {
        // SAFETY: every buffer passed is at least the size `req` encodes,
        // and the bad pointers (NULL, kernel, unmapped) are what this tool
        // is for: the kernel must refuse them with EFAULT.
        unsafe { crate::raw_driver::ioctl_ptr(&self.domains[d].file, req, arg) }
    }

    fn step(&mut self) {
        let Some(d) = self.domain() else {
            let r = self.open();
            self.record("open", r);
            return;
        };
        match self.rng.gen_range(0..100) {
            0..=2 => {
                let r = if self.domains.len() < 3 {
                    self.open()
                } else {
                    Ok(0)
                };
                self.record("open", r);
            }
            3..=4 => {
                // Closing under live mappings: they keep the file alive.
                self.domains.swap_remove(d);
                self.record("close", Ok(0));
            }
            5..=9 => {
                let mut b = [0u8; 256];
                let p = self.pointer(&mut b);
                let r = self.ioctl(d, uapi::IOC_INFO, p);
                self.record("INFO", r);
            }
            10..=24 => self.create_endpoint(d),
            25..=31 => {
                let id = self.endpoint_id(d);
                let mut b = id.to_le_bytes().to_vec();
                b.resize(64, 0);
                let p = self.pointer(&mut b);
                let r = self.ioctl(d, uapi::IOC_DESTROY_EP, p);
                if r.is_ok() {
                    self.domains[d].endpoints.retain(|e| e.id != id);
                }
                self.record("DESTROY_EP", r);
            }
            32..=41 => {
                // Random bytes with an opcode, lengths at the boundaries
                // and (mostly) an endpoint of this file first.
                let mut c = IocCommand::new_zeroed();
                self.rng.fill(c.as_mut_bytes());
                c.opcode = self.rng.gen_range(0u32..24).into();
                c.in_len = boundary_u32(&mut self.rng).into();
                c.out_len = boundary_u32(&mut self.rng).into();
                let id: ObjectId = ObjectId {
                    id: self.endpoint_id(d).into(),
                };
                c.data[..size_of::<ObjectId>()].copy_from_slice(id.as_bytes());
                let mut b = c.as_bytes().to_vec();
                b.resize(b.len() + 64, 0);
                self.rng.fill(&mut b[size_of::<IocCommand>()..]);
                let p = self.pointer(&mut b);
                let r = self.ioctl(d, uapi::IOC_COMMAND, p);
                self.record("COMMAND", r);
            }
            42..=49 => {
                let mut b = self.endpoint_id(d).to_le_bytes().to_vec();
                b.resize(64, 0);
                let p = self.pointer(&mut b);
                let r = self.ioctl(d, uapi::IOC_KICK, p);
                self.record("KICK", r);
            }
            50..=53 => {
                let arg = IocWait {
                    id: self.endpoint_id(d).into(),
                    timeout_ms: self.rng.gen_range(0u32..3).into(),
                };
                let mut b = arg.as_bytes().to_vec();
                b.resize(64, 0);
                let p = self.pointer(&mut b);
                let r = self.ioctl(d, uapi::IOC_WAIT, p);
                self.record("WAIT", r);
            }
            54..=57 => {
                let entries = if self.rng.gen_bool(0.5) {
                    self.rng.gen_range(1..=128)
                } else {
                    boundary_u32(&mut self.rng)
                };
                let mut b = entries.to_le_bytes().to_vec();
                b.resize(64, 0);
                let p = self.pointer(&mut b);
                let r = self.ioctl(d, uapi::IOC_UTLB_INIT, p);
                self.record("UTLB_INIT", r);
            }
            58..=65 => self.utlb_install(d),
            66..=69 => {
                // Any other request number of the driver's type, any size
                // and direction, and numbers of no type at all.
                let nr = self.rng.gen_range(0u32..32);
                let size = self.rng.gen_range(0u32..1024);
                let dir = self.rng.gen_range(0u32..4);
                let req = if self.rng.gen_bool(0.8) {
                    (dir << 30) | (size << 16) | (uapi::IOC_TYPE << 8) | nr
                } else {
                    self.rng.gen()
                };
                let mut b = vec![0u8; 1024];
                self.rng.fill(&mut b[..]);
                let p = self.pointer(&mut b);
                let r = self.ioctl(d, req, p);
                self.record("other ioctl", r);
            }
            70..=84 => self.map(d),
            85..=93 => self.unmap(),
            94..=96 => self.scribble(),
            97 => {
                // The driver's own fault injection and memory budget (test
                // parameters): error paths taken at random points.
                let (param, value) = if self.rng.gen_bool(0.5) {
                    (FAIL_ALLOC, if self.rng.gen_bool(0.5) { "1" } else { "0" })
                } else {
                    (
                        MEM_LIMIT,
                        *["0", "1", "2", "8"].choose(&mut self.rng).unwrap_or(&"0"),
                    )
                };
                let r = std::fs::write(param, value).map(|_| 0);
                self.record("inject", r);
            }
            _ => {
                let mut pfd = libc::pollfd {
                    fd: self.domains[d].file.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; zero timeout.
                let r = unsafe { libc::poll(&mut pfd, 1, 0) };
                self.record("poll", Ok(r));
            }
        }
    }

    fn create_endpoint(&mut self, d: usize) {
        // Mostly sizes that fit a small guest; sometimes the boundaries.
        let sane = self.rng.gen_bool(0.6);
        // send, recv, free and event entries (spec §5.1: powers of two,
        // the event ring at least send + 32).
        let sane_entries: [&[u32]; 4] = [&[2, 8, 64], &[2, 8, 256], &[2, 8, 256], &[128, 512]];
        let mut entries = [0u32; 4];
        for (v, choices) in entries.iter_mut().zip(sane_entries) {
            *v = if sane {
                *choices.choose(&mut self.rng).unwrap_or(&128)
            } else {
                boundary_u32(&mut self.rng)
            };
        }
        let seg = if sane {
            *[1u64, 4096, 65536, 1 << 20]
                .choose(&mut self.rng)
                .unwrap_or(&4096)
        } else {
            boundary_u64(&mut self.rng)
        };
        // The output fields hold garbage on the way in: the driver must
        // not read them.
        let mut arg = IocCreateEp::new_zeroed();
        self.rng.fill(arg.as_mut_bytes());
        arg.send_entries = entries[0].into();
        arg.recv_entries = entries[1].into();
        arg.free_entries = entries[2].into();
        arg.event_entries = entries[3].into();
        arg.segment_bytes = seg.into();
        let mut a = arg.as_bytes().to_vec();
        a.resize(a.len() + 64, 0);
        let p = self.pointer(&mut a);
        let r = self.ioctl(d, uapi::IOC_CREATE_EP, p);
        if r.is_ok() && p == a.as_mut_ptr() {
            let out: IocCreateEp = wire::read(&a);
            self.domains[d].endpoints.push(Endpoint {
                id: out.id.get(),
                ctrl_len: out.ctrl_len.get(),
                seg_len: out.segment_len.get(),
            });
        }
        self.record("CREATE_EP", r);
    }

    fn utlb_install(&mut self, d: usize) {
        let first = if self.rng.gen_bool(0.6) {
            self.rng.gen_range(0..130)
        } else {
            boundary_u32(&mut self.rng)
        };
        let count = if self.rng.gen_bool(0.7) {
            self.rng.gen_range(1..=BUFFER_PAGES as u32)
        } else {
            boundary_u32(&mut self.rng)
        };
        let base = (self.buffer.as_ptr() as u64).next_multiple_of(PAGE as u64);
        let va = match self.rng.gen_range(0..10) {
            0 => 0,
            1 => KERNEL_ADDRESS,
            2 => base + 1,
            3 => self.rng.gen::<u64>() & !(PAGE as u64 - 1),
            _ => base + PAGE as u64 * self.rng.gen_range(0..BUFFER_PAGES as u64),
        };
        let arg = IocUtlbInstall {
            first: first.into(),
            count: count.into(),
            va: va.into(),
        };
        let mut a = arg.as_bytes().to_vec();
        a.resize(a.len() + 64, 0);
        let p = self.pointer(&mut a);
        let r = self.ioctl(d, uapi::IOC_UTLB_INSTALL, p);
        self.record("UTLB_INSTALL", r);
    }

    fn map(&mut self, d: usize) {
        let ep = self.domains[d].endpoints.choose(&mut self.rng).copied();
        let id = match ep {
            Some(e) if self.rng.gen_bool(0.8) => e.id,
            _ => self.endpoint_id(d),
        };
        let (ctrl_len, seg_len) =
            ep.map_or((PAGE as u64, PAGE as u64), |e| (e.ctrl_len, e.seg_len));
        let (region, full) = match self.rng.gen_range(0..5) {
            0 => (0, ctrl_len),
            1 => (uapi::MMAP_SEGMENT, seg_len),
            2 => (uapi::MMAP_DOORBELL, PAGE as u64),
            3 => (uapi::MMAP_DOORBELL_BITS, PAGE as u64),
            _ => (
                self.rng.gen_range(0..0x1_0000u64) * PAGE as u64,
                PAGE as u64,
            ),
        };
        let len = match self.rng.gen_range(0..5) {
            0 => PAGE as u64,
            1 => full + PAGE as u64,
            2 => 2 * PAGE as u64,
            _ => full,
        }
        .clamp(PAGE as u64, 128 << 20) as usize;
        // Offsets past off_t's range reach the kernel as negative numbers:
        // that is one more boundary to try.
        // The doorbell and its bitmap are the file's, not an endpoint's.
        let offset = if region >= uapi::MMAP_DOORBELL {
            region
        } else {
            uapi::mmap_ctrl(id) + region
        } as libc::off_t;
        // Private copies are refused (the device must see what is written).
        let share = if self.rng.gen_bool(0.1) {
            libc::MAP_PRIVATE
        } else {
            libc::MAP_SHARED
        };
        // SAFETY: a new mapping at an address the kernel picks aliases
        // nothing of ours; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                share,
                self.domains[d].file.as_raw_fd(),
                offset,
            )
        };
        let r = if p == libc::MAP_FAILED {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(p)
        };
        match r {
            Ok(p) => {
                self.maps.push(Mapping {
                    addr: p as usize,
                    len,
                    doorbell: region == uapi::MMAP_DOORBELL,
                });
                self.record("mmap", Ok(0));
            }
            Err(e) => self.record("mmap", Err(e)),
        }
    }

    fn unmap(&mut self) {
        if self.maps.is_empty() {
            return;
        }
        let i = self.rng.gen_range(0..self.maps.len());
        let m = self.maps.swap_remove(i);
        let pages = m.len / PAGE;
        // Whole, or one page of it (which splits the mapping in two).
        let (start, n) = if pages > 1 && self.rng.gen_bool(0.4) {
            (self.rng.gen_range(0..pages), 1)
        } else {
            (0, pages)
        };
        // SAFETY: the range lies inside a mapping this tool made and no
        // reference into it is held.
        let r = unsafe { libc::munmap((m.addr + start * PAGE) as *mut libc::c_void, n * PAGE) };
        if start > 0 {
            self.maps.push(Mapping {
                addr: m.addr,
                len: start * PAGE,
                doorbell: m.doorbell,
            });
        }
        if start + n < pages {
            self.maps.push(Mapping {
                addr: m.addr + (start + n) * PAGE,
                len: (pages - start - n) * PAGE,
                doorbell: m.doorbell,
            });
        }
        let r = if r == 0 {
            Ok(0)
        } else {
            Err(std::io::Error::last_os_error())
        };
        self.record("munmap", r);
    }

    /// Random bytes over a page of one of our ring or segment mappings, or
    /// a random queue index rung on a doorbell page: the device must cope
    /// with whatever a process does to its own rings.
    fn scribble(&mut self) {
        let Some(m) = self.maps.choose(&mut self.rng) else {
            return;
        };
        let (addr, len, doorbell) = (m.addr, m.len, m.doorbell);
        if doorbell {
            let q: u16 = self.rng.gen();
            // SAFETY: the first bytes of a live doorbell mapping; the
            // driver allows exactly this aligned 16-bit store.
            unsafe { std::ptr::write_volatile(addr as *mut u16, q) };
        } else {
            let page = self.rng.gen_range(0..len / PAGE);
            let at = addr + page * PAGE + self.rng.gen_range(0..PAGE - 64);
            let mut b = [0u8; 64];
            self.rng.fill(&mut b[..]);
            // SAFETY: 64 bytes inside a live shared mapping of our own
            // endpoint memory (a mapping longer than the region it maps is
            // refused by the driver, so every page is backed).
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), at as *mut u8, b.len()) };
        }
        self.record("scribble", Ok(0));
    }
}

/// Kernel log lines that mean the kernel or a driver faulted.
pub(crate) fn kernel_faults() -> Vec<String> {
    const SIGNS: [&str; 7] = [
        "Oops",
        "BUG:",
        "kernel BUG",
        "WARNING:",
        "general protection fault",
        "Kernel panic",
        "UBSAN:",
    ];
    let mut log = String::new();
    // /dev/kmsg gives one record per read; stop when none is left.
    if let Ok(mut k) = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
    {
        let mut rec = vec![0u8; 8192];
        loop {
            match k.read(&mut rec) {
                Ok(0) => break,
                Ok(n) => {
                    log.push_str(&String::from_utf8_lossy(&rec[..n]));
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
    }
    log.lines()
        .filter(|l| SIGNS.iter().any(|s| l.contains(s)))
        .map(str::to_string)
        .collect()
}

/// Runs `operations` random operations against `path` from `seed`, cleans
/// up, and checks the kernel log.
pub fn run(path: &str, seed: u64, operations: u64) -> anyhow::Result<Report> {
    File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| {
            anyhow::anyhow!("{path}: {e} (driver-fuzz needs the Linux driver's device)")
        })?;
    let before = kernel_faults();
    let mut f = Fuzzer {
        rng: StdRng::seed_from_u64(seed),
        path: path.to_string(),
        domains: Vec::new(),
        maps: Vec::new(),
        buffer: vec![0u8; (BUFFER_PAGES + 1) * PAGE],
        report: Report {
            seed,
            ..Default::default()
        },
    };
    let limit = std::fs::read_to_string(MEM_LIMIT).ok();
    while f.report.operations < operations {
        f.step();
    }
    let _ = std::fs::write(FAIL_ALLOC, "0");
    if let Some(l) = limit {
        let _ = std::fs::write(MEM_LIMIT, l.trim());
    }
    for m in f.maps.drain(..) {
        // SAFETY: a mapping this tool made; nothing refers into it.
        unsafe { libc::munmap(m.addr as *mut libc::c_void, m.len) };
    }
    f.domains.clear();
    let mut report = f.report;
    report.kernel_faults = kernel_faults()
        .into_iter()
        .filter(|l| !before.contains(l))
        .collect();
    Ok(report)
}

impl Report {
    /// The human table: one line per operation and outcome.
    pub fn table(&self) -> String {
        let mut s = format!(
            "driver-fuzz: {} operations from seed {}\n{:<14} {:<12} {:>8}\n",
            self.operations, self.seed, "operation", "outcome", "count"
        );
        for (op, outcomes) in &self.outcomes {
            for (o, n) in outcomes {
                s.push_str(&format!("{op:<14} {o:<12} {n:>8}\n"));
            }
        }
        if self.kernel_faults.is_empty() {
            s.push_str("kernel log: no Oops, BUG or WARNING\n");
        } else {
            s.push_str("kernel log shows faults:\n");
            for l in &self.kernel_faults {
                s.push_str(&format!("  {l}\n"));
            }
        }
        s
    }
}
