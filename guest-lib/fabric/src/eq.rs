//! Event queues (fi_eq): where connection events go. RDM endpoints post
//! none; the application may write its own (fi_eq_write) and read them
//! back, and libfabric's programs open one for every endpoint type.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::fi::{self, nosys, sys};

/// One event: its code and bytes, or an error entry.
struct Event {
    code: u32,
    bytes: Vec<u8>,
    error: bool,
}

/// An open event queue.
#[repr(C)]
pub struct Eq {
    fid: sys::fid_eq,
    events: Mutex<VecDeque<Event>>,
    ready: Condvar,
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
        events: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
    });
    // SAFETY: libfabric's out-pointer.
    unsafe { *out = Box::into_raw(eq).cast() };
    0
}

fn eq<'a>(p: *mut sys::fid_eq) -> Option<&'a Eq> {
    // SAFETY: libfabric calls a queue's ops with that queue, one of ours
    // (repr(C), fid first).
    let e = unsafe { p.cast::<Eq>().as_ref()? };
    (e.fid.fid.fclass == sys::FI_CLASS_EQ as usize).then_some(e)
}

unsafe extern "C" fn eq_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a queue it got from `open`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Eq>()) });
    0
}

impl Eq {
    /// Takes (or with FI_PEEK looks at) the first event if it is not an
    /// error: its size in bytes.
    fn read(
        &self,
        event: *mut u32,
        buf: *mut c_void,
        len: usize,
        flags: u64,
        wait: Option<Duration>,
    ) -> isize {
        let Ok(mut q) = self.events.lock() else {
            return -(fi::EIO as isize);
        };
        if q.is_empty() {
            if let Some(t) = wait {
                q = match self.ready.wait_timeout_while(q, t, |q| q.is_empty()) {
                    Ok((q, _)) => q,
                    Err(_) => return -(fi::EIO as isize),
                };
            }
        }
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
    eq(e).map_or(-(fi::EINVAL as isize), |q| {
        q.read(event, buf, len, flags, None)
    })
}

unsafe extern "C" fn eq_sread(
    e: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    // A negative timeout waits for ever: a day at a time.
    let t = Duration::from_millis(if timeout < 0 {
        86_400_000
    } else {
        timeout as u64
    });
    eq(e).map_or(-(fi::EINVAL as isize), |q| loop {
        let r = q.read(event, buf, len, flags, Some(t));
        if r != -(fi::EAGAIN as isize) || timeout >= 0 {
            return r;
        }
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
    let Ok(mut v) = q.events.lock() else {
        return -(fi::EIO as isize);
    };
    v.push_back(Event {
        code: event,
        bytes,
        error: false,
    });
    q.ready.notify_all();
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
    unsafe { crate::cq::strerror(prov_errno, buf, len) }
}

static EQ_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(eq_close),
    bind: nosys!(c_int; *mut sys::fid, *mut sys::fid, u64),
    control: nosys!(c_int; *mut sys::fid, c_int, *mut c_void),
    ops_open: nosys!(c_int; *mut sys::fid, *const c_char, u64, *mut *mut c_void, *mut c_void),
    tostr: nosys!(c_int; *const sys::fid, *mut c_char, usize),
    ops_set: nosys!(c_int; *mut sys::fid, *const c_char, u64, *mut c_void, *mut c_void),
};

static EQ_OPS: sys::fi_ops_eq = sys::fi_ops_eq {
    size: std::mem::size_of::<sys::fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};
