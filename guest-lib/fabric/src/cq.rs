//! Completion queues (fi_cq): completions the endpoints bound to the
//! queue produce, read in the queue's format. Progress is manual
//! (FI_PROGRESS_MANUAL): reading a queue moves its endpoints along.
//!
//! Waiting (`crate::wait`): a queue that has found nothing for a while
//! (`spin()`) sleeps in its next empty read until something arrives for
//! one of its endpoints or the read's bound passes (`ULNIC_FI_IDLE_US`,
//! default 1000 us; 0 spins for ever), on the queue's own watcher, whose
//! descriptor FI_WAIT_FD hands out too (docs/libfabric.md §3): a program
//! that only polls must not keep the core the device's engine, or in a
//! TCG guest the vCPU the NIC's interrupts need, from running. The bound
//! is the non-blocking read's, not a look for lost wake-ups: a read whose
//! sleep the bound ends and that then finds work counts it as found by
//! timer.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::engine::Completion;
use crate::fi::{self, fid_ops, nosys, sys};
use crate::progress::Progress;
use crate::wait::Waiting;

/// How long reads find nothing before an empty read may sleep
/// (`ULNIC_FI_SPIN_US`, default 50 us).
fn spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| micros_from_env("ULNIC_FI_SPIN_US", 50))
}

fn micros_from_env(name: &str, default: u64) -> Duration {
    let us = std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(default);
    Duration::from_micros(us)
}

/// Nanoseconds since the first call (never 0), for `CqQueue::idle_since`.
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

/// How long an idle read may sleep (`ULNIC_FI_IDLE_US`).
fn idle_wait() -> Duration {
    static IDLE: OnceLock<Duration> = OnceLock::new();
    *IDLE.get_or_init(|| micros_from_env("ULNIC_FI_IDLE_US", 1000))
}

/// A completion with its sender as the reader's fi_addr_t.
pub struct Entry {
    /// The completion.
    pub c: Completion,
    /// `c.src` in the endpoint's AV (`FI_ADDR_NOTAVAIL` if absent).
    pub src: u64,
}

/// A queue's state, shared with the endpoints that post to it.
#[derive(Default)]
pub struct CqQueue {
    entries: Mutex<VecDeque<Entry>>,
    eps: Mutex<Vec<Weak<dyn Progress>>>,
    /// When reads began to find nothing (`now_ns`), 0 while they find
    /// something.
    idle_since: AtomicU64,
    /// How readers sleep (`crate::wait`).
    waiting: Waiting,
}

impl CqQueue {
    /// Adds a completion.
    pub fn push(&self, e: Entry) {
        if let Ok(mut q) = self.entries.lock() {
            q.push_back(e);
        }
        // Pushed by another thread's progress, a reader asleep wakes.
        self.waiting.changed();
    }

    /// Makes `ep` progress when this queue is read.
    pub fn attach(&self, ep: Weak<dyn Progress>) {
        if let Ok(mut v) = self.eps.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(ep);
        }
    }

    fn sources(&self) -> Vec<Arc<dyn Progress>> {
        match self.eps.lock() {
            Ok(v) => v.iter().filter_map(Weak::upgrade).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn progress(&self) {
        for ep in self.sources() {
            ep.progress();
        }
    }

    /// The descriptor that becomes readable when an endpoint of this
    /// queue has something (FI_GETWAIT).
    pub fn wait_fd(&self) -> Option<c_int> {
        self.waiting.fd()
    }

    fn empty(&self) -> bool {
        self.entries.lock().is_ok_and(|q| q.is_empty())
    }

    /// `fi_trywait`: takes the queue's old wake-ups, arms every endpoint,
    /// and says whether sleeping on the descriptor is safe now (nothing
    /// queued, nothing arrived meanwhile).
    pub fn try_wait(&self) -> bool {
        self.waiting.try_wait(&self.sources(), || self.empty())
    }

    /// Sleeps until an endpoint of this queue has something, another
    /// thread's progress gives it something, or `until` (at once if
    /// something is waiting).
    fn sleep(&self, until: Option<Instant>) {
        self.waiting.sleep(&self.sources(), until, || self.empty());
    }

    /// After an empty read: give the core away, and once the queue has
    /// been idle a while, sleep until something arrives.
    fn idle(&self) {
        let idle = idle_wait();
        let now = now_ns();
        let since = match self.idle_since.load(Ordering::Relaxed) {
            0 => {
                self.idle_since.store(now, Ordering::Relaxed);
                now
            }
            t => t,
        };
        if !idle.is_zero() && now - since >= spin().as_nanos() as u64 {
            self.sleep(Some(Instant::now() + idle));
        } else {
            std::thread::yield_now();
        }
    }
}

/// An open completion queue.
#[repr(C)]
pub struct Cq {
    fid: sys::fid_cq,
    format: sys::fi_cq_format,
    /// FI_WAIT_FD: `fi_control(FI_GETWAIT)` hands out the descriptor.
    wait_fd: bool,
    pub(crate) queue: Arc<CqQueue>,
}

/// Opens a completion queue (`fi_cq_open`).
///
/// # Safety
/// `attr` and `out` are valid pointers from libfabric.
pub unsafe fn open(
    attr: *mut sys::fi_cq_attr,
    out: *mut *mut sys::fid_cq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes a valid attr.
    let Some(attr) = (unsafe { attr.as_mut() }) else {
        return -fi::EINVAL;
    };
    let format = match attr.format {
        sys::fi_cq_format_FI_CQ_FORMAT_UNSPEC => sys::fi_cq_format_FI_CQ_FORMAT_CONTEXT,
        f @ (sys::fi_cq_format_FI_CQ_FORMAT_CONTEXT
        | sys::fi_cq_format_FI_CQ_FORMAT_MSG
        | sys::fi_cq_format_FI_CQ_FORMAT_DATA
        | sys::fi_cq_format_FI_CQ_FORMAT_TAGGED) => f,
        _ => return -fi::ENOSYS,
    };
    let wait_fd = match attr.wait_obj {
        sys::fi_wait_obj_FI_WAIT_NONE | sys::fi_wait_obj_FI_WAIT_UNSPEC => false,
        sys::fi_wait_obj_FI_WAIT_FD => true,
        _ => return -fi::ENOSYS,
    };
    if attr.wait_cond != sys::fi_cq_wait_cond_FI_CQ_COND_NONE || attr.flags != 0 {
        return -fi::ENOSYS;
    }
    attr.format = format;
    let cq = Box::new(Cq {
        fid: sys::fid_cq {
            fid: sys::fid {
                fclass: sys::FI_CLASS_CQ as usize,
                context,
                ops: &CQ_FI_OPS as *const _ as *mut _,
            },
            ops: &CQ_OPS as *const _ as *mut _,
        },
        format,
        wait_fd,
        queue: Arc::new(CqQueue::default()),
    });
    // SAFETY: `out` is libfabric's valid out-pointer.
    unsafe { *out = Box::into_raw(cq).cast() };
    0
}

/// The queue behind a fid.
///
/// # Safety
/// `fid` must be a fid this provider made, not yet closed.
pub unsafe fn from_fid<'a>(fid: *mut sys::fid) -> Option<&'a Cq> {
    // SAFETY: `Cq` is repr(C) with its fid first; the caller's promise.
    let cq = unsafe { fid.cast::<Cq>().as_ref()? };
    (cq.fid.fid.fclass == sys::FI_CLASS_CQ as usize).then_some(cq)
}

unsafe extern "C" fn cq_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a fid it got from `open`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Cq>()) });
    0
}

impl Cq {
    fn entry_size(&self) -> usize {
        match self.format {
            sys::fi_cq_format_FI_CQ_FORMAT_CONTEXT => std::mem::size_of::<sys::fi_cq_entry>(),
            sys::fi_cq_format_FI_CQ_FORMAT_MSG => std::mem::size_of::<sys::fi_cq_msg_entry>(),
            sys::fi_cq_format_FI_CQ_FORMAT_DATA => std::mem::size_of::<sys::fi_cq_data_entry>(),
            _ => std::mem::size_of::<sys::fi_cq_tagged_entry>(),
        }
    }

    /// Takes up to `count` good completions into `buf` (and their
    /// senders into `src`): how many, `-FI_EAVAIL` when an error is
    /// first, `-FI_EAGAIN` when there is none.
    fn read(&self, buf: *mut c_void, count: usize, src: *mut u64) -> isize {
        self.queue.progress();
        let Ok(mut q) = self.queue.entries.lock() else {
            return -(fi::EIO as isize);
        };
        let mut n = 0;
        while n < count {
            let Some(e) = q.front() else { break };
            if e.c.error.is_some() {
                if n == 0 {
                    return -(fi::EAVAIL as isize);
                }
                break;
            }
            let Some(e) = q.pop_front() else { break };
            let t = sys::fi_cq_tagged_entry {
                op_context: e.c.context as *mut c_void,
                flags: e.c.flags,
                len: e.c.len,
                buf: e.c.buf as *mut c_void,
                data: e.c.data,
                tag: e.c.tag,
            };
            let size = self.entry_size();
            // SAFETY: the caller's buffer holds `count` entries of the
            // queue's format, each a prefix of fi_cq_tagged_entry.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&t as *const sys::fi_cq_tagged_entry).cast::<u8>(),
                    buf.cast::<u8>().add(n * size),
                    size,
                );
                if !src.is_null() {
                    *src.add(n) = e.src;
                }
            }
            n += 1;
        }
        if n == 0 {
            drop(q);
            // The device's engine is a thread of another process that
            // needs a core to move what this program waits for; a program
            // spinning on fi_cq_read (as fi_pingpong does) would take it
            // on a machine with fewer cores than spinners (module doc).
            self.queue.idle();
            -(fi::EAGAIN as isize)
        } else {
            self.queue.idle_since.store(0, Ordering::Relaxed);
            n as isize
        }
    }
}

unsafe extern "C" fn cq_read(cq: *mut sys::fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: libfabric dispatched through this queue's ops.
    match unsafe { from_fid(cq.cast()) } {
        Some(cq) => cq.read(buf, count, std::ptr::null_mut()),
        None => -(fi::EINVAL as isize),
    }
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
) -> isize {
    // SAFETY: as in cq_read.
    match unsafe { from_fid(cq.cast()) } {
        Some(cq) => cq.read(buf, count, src),
        None => -(fi::EINVAL as isize),
    }
}

unsafe extern "C" fn cq_sread(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: as in cq_read.
    unsafe { cq_sreadfrom(cq, buf, count, std::ptr::null_mut(), _cond, timeout) }
}

unsafe extern "C" fn cq_sreadfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: as in cq_read.
    let Some(cq) = (unsafe { from_fid(cq.cast()) }) else {
        return -(fi::EINVAL as isize);
    };
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    loop {
        let r = cq.read(buf, count, src);
        if r != -(fi::EAGAIN as isize) {
            return r;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return r;
        }
        // Woken by an arrival (the queue's own watcher: no other queue
        // takes its wake-ups) or the deadline.
        cq.queue.sleep(deadline);
    }
}

unsafe extern "C" fn cq_readerr(
    cq: *mut sys::fid_cq,
    buf: *mut sys::fi_cq_err_entry,
    _flags: u64,
) -> isize {
    // SAFETY: as in cq_read.
    let Some(cq) = (unsafe { from_fid(cq.cast()) }) else {
        return -(fi::EINVAL as isize);
    };
    // SAFETY: libfabric passes a valid entry to fill (or null).
    let Some(out) = (unsafe { buf.as_mut() }) else {
        return -(fi::EINVAL as isize);
    };
    let Ok(mut q) = cq.queue.entries.lock() else {
        return -(fi::EIO as isize);
    };
    if q.front().is_none_or(|e| e.c.error.is_none()) {
        return -(fi::EAGAIN as isize);
    }
    let Some(e) = q.pop_front() else {
        return -(fi::EAGAIN as isize);
    };
    let (err, olen) = e.c.error.unwrap_or((fi::EIO, 0));
    out.op_context = e.c.context as *mut c_void;
    out.flags = e.c.flags;
    out.len = e.c.len;
    out.buf = e.c.buf as *mut c_void;
    out.data = e.c.data;
    out.tag = e.c.tag;
    out.olen = olen;
    out.err = err;
    out.prov_errno = err;
    // No provider error data: err_data is left as the caller set it.
    out.err_data_size = 0;
    1
}

unsafe extern "C" fn cq_strerror(
    _cq: *mut sys::fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: forwarded as given.
    unsafe { fi::strerror(prov_errno, buf, len) }
}

fid_ops!(
    CQ_FI_OPS,
    cq_close,
    nosys!(c_int; *mut sys::fid, *mut sys::fid, u64),
    Some(cq_control)
);

/// `fi_control(FI_GETWAIT)` on a queue opened with FI_WAIT_FD: the ulnic
/// notification descriptor (sleep on it after `fi_trywait` says so).
unsafe extern "C" fn cq_control(fid: *mut sys::fid, command: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: libfabric dispatched through this queue's ops.
    let Some(cq) = (unsafe { from_fid(fid) }) else {
        return -fi::EINVAL;
    };
    if command as u32 != sys::FI_GETWAIT {
        return -fi::ENOSYS;
    }
    if !cq.wait_fd {
        return -fi::ENODATA;
    }
    if arg.is_null() {
        return -fi::EINVAL;
    }
    match cq.queue.wait_fd() {
        Some(fd) => {
            // SAFETY: FI_GETWAIT with FI_WAIT_FD passes an int to fill.
            unsafe { *arg.cast::<c_int>() = fd };
            0
        }
        None => -fi::ENODATA,
    }
}

/// `fi_trywait` for one fid: 0 if it is a completion queue with a wait
/// descriptor and sleeping on it is safe now, `-FI_EAGAIN` if something
/// is waiting, `-FI_EINVAL` for anything else.
///
/// # Safety
/// `fid` is a fid of this provider.
pub unsafe fn try_wait_fid(fid: *mut sys::fid) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { from_fid(fid) } {
        Some(cq) if cq.wait_fd => {
            if cq.queue.try_wait() {
                0
            } else {
                -fi::EAGAIN
            }
        }
        _ => -fi::EINVAL,
    }
}

static CQ_OPS: sys::fi_ops_cq = sys::fi_ops_cq {
    size: std::mem::size_of::<sys::fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: nosys!(c_int; *mut sys::fid_cq),
    strerror: Some(cq_strerror),
};
