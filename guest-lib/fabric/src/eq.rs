//! Event queues (fi_eq): where connection events go (FI_CONNREQ,
//! FI_CONNECTED, FI_SHUTDOWN, and errors such as a refused connect).
//! Reading a queue moves along the endpoints and passive endpoints bound
//! to it (manual progress). RDM endpoints post nothing; the application
//! may write its own events (fi_eq_write).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::fi::{self, fid_ops, sys};
use crate::wait::Waiting;

/// One event: its code and bytes, or an error entry.
struct Event {
    code: u32,
    bytes: Vec<u8>,
    error: bool,
}

pub use crate::progress::Progress;

/// A queue's events, shared with what posts to it.
#[derive(Default)]
pub struct EqQueue {
    events: Mutex<VecDeque<Event>>,
    sources: Mutex<Vec<Weak<dyn Progress>>>,
    /// How `fi_eq_sread` sleeps (`crate::wait`).
    waiting: Waiting,
}

impl EqQueue {
    /// Makes `p` progress when this queue is read.
    pub fn attach(&self, p: Weak<dyn Progress>) {
        if let Ok(mut v) = self.sources.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(p);
        }
    }

    fn push(&self, e: Event) {
        if let Ok(mut q) = self.events.lock() {
            q.push_back(e);
        }
        // Posted by another thread (its progress, fi_eq_write): a reader
        // asleep wakes.
        self.waiting.changed();
    }

    /// Posts a connection event (`struct fi_eq_cm_entry` and `params`).
    pub fn cm(&self, code: u32, fid: usize, info: *mut sys::fi_info, params: &[u8]) {
        let mut bytes = Vec::with_capacity(16 + params.len());
        bytes.extend_from_slice(&fid.to_ne_bytes());
        bytes.extend_from_slice(&(info as usize).to_ne_bytes());
        bytes.extend_from_slice(params);
        self.push(Event {
            code,
            bytes,
            error: false,
        });
    }

    /// Posts an error entry (`struct fi_eq_err_entry`) for `fid`.
    pub fn error(&self, fid: usize, err: i32) {
        let e = sys::fi_eq_err_entry {
            fid: fid as *mut sys::fid,
            context: std::ptr::null_mut(),
            data: 0,
            err,
            prov_errno: err,
            err_data: std::ptr::null_mut(),
            err_data_size: 0,
        };
        // SAFETY: a plain C struct read as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const sys::fi_eq_err_entry).cast::<u8>(),
                std::mem::size_of::<sys::fi_eq_err_entry>(),
            )
        }
        .to_vec();
        self.push(Event {
            code: 0,
            bytes,
            error: true,
        });
    }

    fn sources(&self) -> Vec<Arc<dyn Progress>> {
        match self.sources.lock() {
            Ok(v) => v.iter().filter_map(Weak::upgrade).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn progress(&self) {
        for s in self.sources() {
            s.progress();
        }
    }
}

/// An open event queue.
#[repr(C)]
pub struct Eq {
    fid: sys::fid_eq,
    pub(crate) queue: Arc<EqQueue>,
}

/// The queue behind a fid.
///
/// # Safety
/// `fid` must be a fid this provider made, not yet closed.
pub unsafe fn from_fid<'a>(fid: *mut sys::fid) -> Option<&'a Eq> {
    // SAFETY: `Eq` is repr(C) with its fid first; the caller's promise.
    let e = unsafe { fid.cast::<Eq>().as_ref()? };
    (e.fid.fid.fclass == sys::FI_CLASS_EQ as usize).then_some(e)
}

/// Opens an event queue (`fi_eq_open`).
///
/// # Safety
/// `attr` and `out` are valid pointers from libfabric.
pub unsafe extern "C" fn open(
    _fabric: *mut sys::fid_fabric,
    attr: *mut sys::fi_eq_attr,
    out: *mut *mut sys::fid_eq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes a valid attr.
    let Some(attr) = (unsafe { attr.as_ref() }) else {
        return -fi::EINVAL;
    };
    match attr.wait_obj {
        sys::fi_wait_obj_FI_WAIT_NONE | sys::fi_wait_obj_FI_WAIT_UNSPEC => {}
        _ => return -fi::ENOSYS,
    }
    let eq = Box::new(Eq {
        fid: sys::fid_eq {
            fid: sys::fid {
                fclass: sys::FI_CLASS_EQ as usize,
                context,
                ops: &EQ_FI_OPS as *const _ as *mut _,
            },
            ops: &EQ_OPS as *const _ as *mut _,
        },
        queue: Arc::new(EqQueue::default()),
    });
    // SAFETY: libfabric's out-pointer.
    unsafe { *out = Box::into_raw(eq).cast() };
    0
}

fn eq<'a>(p: *mut sys::fid_eq) -> Option<&'a EqQueue> {
    // SAFETY: libfabric calls a queue's ops with that queue.
    unsafe { from_fid(p.cast()) }.map(|e| &*e.queue)
}

unsafe extern "C" fn eq_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a queue it got from `open`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Eq>()) });
    0
}

impl EqQueue {
    /// Takes (or with FI_PEEK looks at) the first event if it is not an
    /// error: its size in bytes.
    fn read(&self, event: *mut u32, buf: *mut c_void, len: usize, flags: u64) -> isize {
        self.progress();
        let Ok(mut q) = self.events.lock() else {
            return -(fi::EIO as isize);
        };
        let Some(e) = q.front() else {
            return -(fi::EAGAIN as isize);
        };
        if e.error {
            return -(fi::EAVAIL as isize);
        }
        if len < e.bytes.len() || (buf.is_null() && !e.bytes.is_empty()) {
            return -(fi::ETOOSMALL as isize);
        }
        // SAFETY: the caller's out-pointers; `buf` holds `len` bytes.
        unsafe {
            if !event.is_null() {
                *event = e.code;
            }
            std::ptr::copy_nonoverlapping(e.bytes.as_ptr(), buf.cast(), e.bytes.len());
        }
        let n = e.bytes.len() as isize;
        if flags & fi::PEEK == 0 {
            q.pop_front();
        }
        n
    }
}

unsafe extern "C" fn eq_read(
    e: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    eq(e).map_or(-(fi::EINVAL as isize), |q| q.read(event, buf, len, flags))
}

unsafe extern "C" fn eq_sread(
    e: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    // Woken by an arrival for a source (a connection request, its
    // answer, a shutdown), an event another thread posted, or the
    // deadline; a negative timeout waits for ever.
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    eq(e).map_or(-(fi::EINVAL as isize), |q| loop {
        let r = q.read(event, buf, len, flags);
        if r != -(fi::EAGAIN as isize) || deadline.is_some_and(|d| Instant::now() >= d) {
            return r;
        }
        let empty = || q.events.lock().is_ok_and(|e| e.is_empty());
        q.waiting.sleep(&q.sources(), deadline, empty);
    })
}

unsafe extern "C" fn eq_readerr(
    e: *mut sys::fid_eq,
    buf: *mut sys::fi_eq_err_entry,
    flags: u64,
) -> isize {
    let Some(q) = eq(e) else {
        return -(fi::EINVAL as isize);
    };
    q.progress();
    let Ok(mut q) = q.events.lock() else {
        return -(fi::EIO as isize);
    };
    if !q.front().is_some_and(|e| e.error) {
        return -(fi::EAGAIN as isize);
    }
    let size = std::mem::size_of::<sys::fi_eq_err_entry>();
    if buf.is_null() {
        return -(fi::EINVAL as isize);
    }
    if let Some(e) = q.front() {
        let n = e.bytes.len().min(size);
        // SAFETY: `buf` is the caller's entry; `n <= size`.
        unsafe { std::ptr::copy_nonoverlapping(e.bytes.as_ptr(), buf.cast::<u8>(), n) };
    }
    if flags & fi::PEEK == 0 {
        q.pop_front();
    }
    size as isize
}

unsafe extern "C" fn eq_write(
    e: *mut sys::fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    _flags: u64,
) -> isize {
    let Some(q) = eq(e) else {
        return -(fi::EINVAL as isize);
    };
    if buf.is_null() && len > 0 {
        return -(fi::EINVAL as isize);
    }
    let bytes = if len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec()
    };
    q.push(Event {
        code: event,
        bytes,
        error: false,
    });
    len as isize
}

unsafe extern "C" fn eq_strerror(
    _eq: *mut sys::fid_eq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: forwarded; the same contract as a CQ's strerror.
    unsafe { fi::strerror(prov_errno, buf, len) }
}

fid_ops!(EQ_FI_OPS, eq_close);

static EQ_OPS: sys::fi_ops_eq = sys::fi_ops_eq {
    size: std::mem::size_of::<sys::fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};
