//! Counters (fi_cntr): how many operations of the endpoints bound to a
//! counter completed, and how many failed, whether or not they report to
//! a completion queue (selective completion, inject). Reading a counter
//! moves its endpoints along (manual progress); `fi_cntr_wait` sleeps on
//! the counter's own watcher (`crate::wait`) until something arrives for
//! its endpoints or another thread counts into it.

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::fi::{self, fid_ops, sys};
use crate::progress::Progress;
use crate::wait::Waiting;

/// A counter's values, shared with the endpoints that count into it.
#[derive(Default)]
pub struct CntrShared {
    value: AtomicU64,
    errors: AtomicU64,
    eps: Mutex<Vec<Weak<dyn Progress>>>,
    waiting: Waiting,
}

impl CntrShared {
    /// Counts one finished operation (or one failed).
    pub fn hit(&self, failed: bool) {
        let c = if failed { &self.errors } else { &self.value };
        c.fetch_add(1, Ordering::AcqRel);
        // Counted by another thread's progress: a waiter asleep wakes.
        self.waiting.changed();
    }

    /// Makes `ep` progress when this counter is read.
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

    /// `fi_cntr_wait`: until the value reaches `threshold` (0), an error
    /// is counted (`-FI_EAVAIL`), or `timeout` ms pass (`-FI_ETIMEDOUT`;
    /// negative: no limit).
    fn wait(&self, threshold: u64, timeout: c_int) -> c_int {
        let deadline =
            (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        let errors = self.errors.load(Ordering::Acquire);
        let done = || {
            self.value.load(Ordering::Acquire) >= threshold
                || self.errors.load(Ordering::Acquire) != errors
        };
        loop {
            self.progress();
            if self.value.load(Ordering::Acquire) >= threshold {
                return 0;
            }
            if self.errors.load(Ordering::Acquire) != errors {
                return -fi::EAVAIL;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return -fi::ETIMEDOUT;
            }
            // Woken by an arrival, another thread's count, or the
            // deadline; never to look again.
            self.waiting.sleep(&self.sources(), deadline, || !done());
        }
    }
}

/// An open counter.
#[repr(C)]
pub struct Cntr {
    fid: sys::fid_cntr,
    pub(crate) shared: Arc<CntrShared>,
}

/// Opens a counter (`fi_cntr_open`): completion events, no wait object
/// (or unspecified: `fi_cntr_wait` works either way).
///
/// # Safety
/// `attr` is null or valid; `out` is libfabric's out-pointer.
pub unsafe fn open(
    attr: *mut sys::fi_cntr_attr,
    out: *mut *mut sys::fid_cntr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes a valid attr or none.
    if let Some(a) = unsafe { attr.as_ref() } {
        if a.events != sys::fi_cntr_events_FI_CNTR_EVENTS_COMP || a.flags != 0 {
            return -fi::ENOSYS;
        }
        match a.wait_obj {
            sys::fi_wait_obj_FI_WAIT_NONE | sys::fi_wait_obj_FI_WAIT_UNSPEC => {}
            _ => return -fi::ENOSYS,
        }
    }
    if out.is_null() {
        return -fi::EINVAL;
    }
    let c = Box::new(Cntr {
        fid: sys::fid_cntr {
            fid: sys::fid {
                fclass: sys::FI_CLASS_CNTR as usize,
                context,
                ops: &CNTR_FI_OPS as *const _ as *mut _,
            },
            ops: &CNTR_OPS as *const _ as *mut _,
        },
        shared: Arc::new(CntrShared::default()),
    });
    // SAFETY: `out` is non-null, libfabric's out-pointer.
    unsafe { *out = Box::into_raw(c).cast() };
    0
}

/// The counter behind a fid.
///
/// # Safety
/// `fid` must be a fid this provider made, not yet closed.
pub unsafe fn from_fid<'a>(fid: *mut sys::fid) -> Option<&'a Cntr> {
    // SAFETY: `Cntr` is repr(C) with its fid first; the caller's promise.
    let c = unsafe { fid.cast::<Cntr>().as_ref()? };
    (c.fid.fid.fclass == sys::FI_CLASS_CNTR as usize).then_some(c)
}

unsafe extern "C" fn cntr_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a fid it got from `open`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Cntr>()) });
    0
}

fn shared<'a>(c: *mut sys::fid_cntr) -> Option<&'a CntrShared> {
    // SAFETY: libfabric dispatched through this counter's ops.
    unsafe { from_fid(c.cast()) }.map(|c| &*c.shared)
}

unsafe extern "C" fn cntr_read(c: *mut sys::fid_cntr) -> u64 {
    shared(c).map_or(0, |s| {
        s.progress();
        s.value.load(Ordering::Acquire)
    })
}

unsafe extern "C" fn cntr_readerr(c: *mut sys::fid_cntr) -> u64 {
    shared(c).map_or(0, |s| {
        s.progress();
        s.errors.load(Ordering::Acquire)
    })
}

fn apply(c: *mut sys::fid_cntr, f: impl FnOnce(&CntrShared)) -> c_int {
    match shared(c) {
        Some(s) => {
            f(s);
            0
        }
        None => -fi::EINVAL,
    }
}

unsafe extern "C" fn cntr_add(c: *mut sys::fid_cntr, v: u64) -> c_int {
    apply(c, |s| {
        s.value.fetch_add(v, Ordering::AcqRel);
        s.waiting.changed();
    })
}

unsafe extern "C" fn cntr_set(c: *mut sys::fid_cntr, v: u64) -> c_int {
    apply(c, |s| {
        s.value.store(v, Ordering::Release);
        s.waiting.changed();
    })
}

unsafe extern "C" fn cntr_adderr(c: *mut sys::fid_cntr, v: u64) -> c_int {
    apply(c, |s| {
        s.errors.fetch_add(v, Ordering::AcqRel);
        s.waiting.changed();
    })
}

unsafe extern "C" fn cntr_seterr(c: *mut sys::fid_cntr, v: u64) -> c_int {
    apply(c, |s| {
        s.errors.store(v, Ordering::Release);
        s.waiting.changed();
    })
}

unsafe extern "C" fn cntr_wait(c: *mut sys::fid_cntr, threshold: u64, timeout: c_int) -> c_int {
    shared(c).map_or(-fi::EINVAL, |s| s.wait(threshold, timeout))
}

fid_ops!(CNTR_FI_OPS, cntr_close);

static CNTR_OPS: sys::fi_ops_cntr = sys::fi_ops_cntr {
    size: std::mem::size_of::<sys::fi_ops_cntr>(),
    read: Some(cntr_read),
    readerr: Some(cntr_readerr),
    add: Some(cntr_add),
    set: Some(cntr_set),
    wait: Some(cntr_wait),
    adderr: Some(cntr_adderr),
    seterr: Some(cntr_seterr),
};
