//! Passive endpoints (fi_passive_ep, FI_EP_MSG): a ulnic endpoint that
//! takes connection requests and posts them to its event queue as
//! FI_CONNREQ, each with an fi_info whose `handle` names the request, for
//! `fi_endpoint` + `fi_accept` or `fi_reject` (docs/libfabric.md §2).

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex};

use ulnic::Address;

use crate::av;
use crate::engine::Engine;
use crate::eq::{EqQueue, Progress};
use crate::fi::{self, fid_ops, nosys, sys};
use crate::nic::SharedNic;
use crate::wire::{KIND_CONNREQ, KIND_REJECT};

/// A connection request: the fid an FI_CONNREQ's fi_info carries as its
/// handle.
#[repr(C)]
struct ConnReq {
    fid: sys::fid,
    from: Address,
}

/// What a passive endpoint's queue reads move along.
struct PepShared {
    engine: Mutex<Engine>,
    eq: Mutex<Option<Arc<EqQueue>>>,
    listening: Mutex<bool>,
    /// The requests handed out, freed with the passive endpoint (an
    /// fi_info may name one after the request was answered). Boxed: a
    /// handle is a pointer to one, which must not move as the list grows.
    #[allow(clippy::vec_box)]
    requests: Mutex<Vec<Box<ConnReq>>>,
    /// The fi_info the passive endpoint was made with: FI_CONNREQ's
    /// fi_info is a copy of it.
    info: usize,
    fid: Mutex<usize>,
    _nic: Arc<SharedNic>,
}

// SAFETY: `info` is an fi_info this object owns (fi_dupinfo) and only
// reads under the engine's lock; the rest is Send and Sync.
unsafe impl Send for PepShared {}
// SAFETY: as above.
unsafe impl Sync for PepShared {}

/// An open passive endpoint.
#[repr(C)]
struct Pep {
    fid: sys::fid_pep,
    shared: Arc<PepShared>,
}

impl Progress for PepShared {
    fn arm(&self) -> bool {
        self.engine.lock().map_or(true, |mut e| e.arm())
    }

    fn watch(&self, w: &ulnic::Watcher) {
        if let Ok(e) = self.engine.lock() {
            e.watch(w);
        }
    }

    fn progress(&self) {
        let mut reqs = Vec::new();
        if let Ok(mut e) = self.engine.lock() {
            let mut done = Vec::new();
            e.progress(&mut done);
            while let Some(c) = e.take_control() {
                if c.kind == KIND_CONNREQ {
                    reqs.push(c);
                }
            }
        }
        if reqs.is_empty() || !self.listening.lock().is_ok_and(|l| *l) {
            return;
        }
        let Some(eq) = self.eq.lock().ok().and_then(|e| e.clone()) else {
            return;
        };
        let fid = self.fid.lock().map_or(0, |f| *f);
        for r in reqs {
            let mut req = Box::new(ConnReq {
                fid: sys::fid {
                    fclass: sys::FI_CLASS_CONNREQ as usize,
                    context: std::ptr::null_mut(),
                    ops: &REQ_FI_OPS as *const _ as *mut _,
                },
                from: r.from,
            });
            let handle: *mut sys::fid = &mut req.fid;
            // SAFETY: `info` is the fi_info this passive endpoint owns.
            let info = unsafe { sys::fi_dupinfo(self.info as *const sys::fi_info) };
            if info.is_null() {
                continue;
            }
            // SAFETY: a fresh fi_info; dest_addr is malloc'd, as
            // fi_freeinfo frees it with free.
            unsafe {
                (*info).handle = handle;
                // The server's endpoint gets a port of its own: the
                // passive endpoint keeps the one it listens on.
                libc::free((*info).src_addr);
                (*info).src_addr = std::ptr::null_mut();
                (*info).src_addrlen = 0;
                libc::free((*info).dest_addr);
                let name = av::name(r.from);
                let p = libc::malloc(name.len());
                if !p.is_null() {
                    std::ptr::copy_nonoverlapping(name.as_ptr(), p.cast(), name.len());
                }
                (*info).dest_addr = p;
                (*info).dest_addrlen = if p.is_null() { 0 } else { name.len() };
            }
            if let Ok(mut v) = self.requests.lock() {
                v.push(req);
            }
            eq.cm(sys::FI_CONNREQ, fid, info, &r.params);
        }
    }
}

/// The requester a connection-request handle names.
///
/// # Safety
/// `handle` is null or a fid some provider made.
pub unsafe fn requester(handle: *mut sys::fid) -> Option<Address> {
    // SAFETY: the caller's promise; ConnReq is repr(C), fid first.
    let f = unsafe { handle.as_ref()? };
    if f.fclass != sys::FI_CLASS_CONNREQ as usize || !std::ptr::eq(f.ops, &REQ_FI_OPS) {
        return None;
    }
    // SAFETY: a ConnReq of ours (its ops are ours).
    Some(unsafe { handle.cast::<ConnReq>().as_ref()? }.from)
}

/// Opens a passive endpoint (`fi_passive_ep`).
///
/// # Safety
/// `info` and `out` are valid pointers from libfabric.
pub unsafe extern "C" fn open(
    _fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    out: *mut *mut sys::fid_pep,
    context: *mut c_void,
) -> c_int {
    if info.is_null() || out.is_null() {
        return -fi::EINVAL;
    }
    let nic = match crate::nic::shared() {
        Ok(n) => n,
        Err(e) => return -e.errno(),
    };
    // SAFETY: libfabric's fi_info.
    let port = unsafe { crate::av::bound_port(&*info) };
    let engine = match Engine::open(&nic.pd, port, Default::default()) {
        Ok(e) => e,
        Err(e) => return -e.errno(),
    };
    // SAFETY: libfabric's fi_info, copied; freed with the passive endpoint.
    let copy = unsafe { sys::fi_dupinfo(info) };
    if copy.is_null() {
        return -fi::ENOMEM;
    }
    let pep = Box::new(Pep {
        fid: sys::fid_pep {
            fid: sys::fid {
                fclass: sys::FI_CLASS_PEP as usize,
                context,
                ops: &PEP_FI_OPS as *const _ as *mut _,
            },
            ops: &PEP_OPS as *const _ as *mut _,
            cm: &PEP_CM_OPS as *const _ as *mut _,
        },
        shared: Arc::new(PepShared {
            engine: Mutex::new(engine),
            eq: Mutex::new(None),
            listening: Mutex::new(false),
            requests: Mutex::new(Vec::new()),
            info: copy as usize,
            fid: Mutex::new(0),
            _nic: nic,
        }),
    });
    let shared = pep.shared.clone();
    let raw = Box::into_raw(pep);
    if let Ok(mut f) = shared.fid.lock() {
        *f = raw as usize;
    }
    // SAFETY: libfabric's out-pointer.
    unsafe { *out = raw.cast() };
    0
}

fn pep<'a>(p: *mut sys::fid) -> Option<&'a Pep> {
    // SAFETY: libfabric calls a passive endpoint's ops with it (repr(C),
    // fid first).
    let pe = unsafe { p.cast::<Pep>().as_ref()? };
    (pe.fid.fid.fclass == sys::FI_CLASS_PEP as usize).then_some(pe)
}

unsafe extern "C" fn pep_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a passive endpoint it got from `open`, once.
    let p = unsafe { Box::from_raw(fid.cast::<Pep>()) };
    // SAFETY: the fi_info this passive endpoint owned.
    unsafe { sys::fi_freeinfo(p.shared.info as *mut sys::fi_info) };
    0
}

unsafe extern "C" fn pep_bind(fid: *mut sys::fid, bfid: *mut sys::fid, _flags: u64) -> c_int {
    let Some(p) = pep(fid) else {
        return -fi::EINVAL;
    };
    // SAFETY: libfabric binds a fid some provider made.
    let Some(q) = (unsafe { crate::eq::from_fid(bfid) }) else {
        return -fi::EINVAL; // only an event queue binds to a passive endpoint
    };
    if let Ok(mut e) = p.shared.eq.lock() {
        *e = Some(q.queue.clone());
    }
    let me: Arc<dyn Progress> = p.shared.clone();
    q.queue.attach(Arc::downgrade(&me));
    0
}

unsafe extern "C" fn pep_listen(p: *mut sys::fid_pep) -> c_int {
    let Some(p) = pep(p.cast()) else {
        return -fi::EINVAL;
    };
    if p.shared.eq.lock().map_or(true, |e| e.is_none()) {
        return -fi::ENOEQ;
    }
    if let Ok(mut l) = p.shared.listening.lock() {
        *l = true;
    }
    0
}

unsafe extern "C" fn pep_getname(fid: sys::fid_t, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    let Some(p) = pep(fid) else {
        return -fi::EINVAL;
    };
    let nic = &p.shared._nic;
    let me = match p.shared.engine.lock() {
        Ok(e) => e.address(nic.nic.node()),
        Err(_) => return -fi::EIO,
    };
    // SAFETY: libfabric's buffer and in/out length.
    unsafe { av::copy_name(me, addr, addrlen) }
}

unsafe extern "C" fn pep_reject(
    p: *mut sys::fid_pep,
    handle: sys::fid_t,
    param: *const c_void,
    paramlen: usize,
) -> c_int {
    let Some(p) = pep(p.cast()) else {
        return -fi::EINVAL;
    };
    // SAFETY: a handle from an FI_CONNREQ (checked to be ours).
    let Some(from) = (unsafe { requester(handle) }) else {
        return -fi::EINVAL;
    };
    if paramlen > crate::ep::PARAMS_MAX {
        return -fi::EINVAL;
    }
    // SAFETY: fi_reject's parameters.
    let params = unsafe { crate::ep::params(param, paramlen) };
    match p.shared.engine.lock() {
        Ok(mut e) => match e.send_control(from, KIND_REJECT, params) {
            Ok(()) => {
                let mut done = Vec::new();
                e.progress(&mut done);
                0
            }
            Err(err) => -err.errno(),
        },
        Err(_) => -fi::EIO,
    }
}

unsafe extern "C" fn req_close(_fid: *mut sys::fid) -> c_int {
    0 // freed with its passive endpoint
}

fid_ops!(
    PEP_FI_OPS,
    pep_close,
    Some(pep_bind),
    nosys!(c_int; *mut sys::fid, c_int, *mut c_void)
);
fid_ops!(REQ_FI_OPS, req_close);

static PEP_OPS: sys::fi_ops_ep = sys::fi_ops_ep {
    size: std::mem::size_of::<sys::fi_ops_ep>(),
    cancel: nosys!(isize; sys::fid_t, *mut c_void),
    getopt: nosys!(c_int; sys::fid_t, c_int, c_int, *mut c_void, *mut usize),
    setopt: nosys!(c_int; sys::fid_t, c_int, c_int, *const c_void, usize),
    tx_ctx: nosys!(c_int; *mut sys::fid_ep, c_int, *mut sys::fi_tx_attr, *mut *mut sys::fid_ep, *mut c_void),
    rx_ctx: nosys!(c_int; *mut sys::fid_ep, c_int, *mut sys::fi_rx_attr, *mut *mut sys::fid_ep, *mut c_void),
    rx_size_left: nosys!(isize; *mut sys::fid_ep),
    tx_size_left: nosys!(isize; *mut sys::fid_ep),
};

static PEP_CM_OPS: sys::fi_ops_cm = sys::fi_ops_cm {
    size: std::mem::size_of::<sys::fi_ops_cm>(),
    setname: nosys!(c_int; sys::fid_t, *mut c_void, usize),
    getname: Some(pep_getname),
    getpeer: nosys!(c_int; *mut sys::fid_ep, *mut c_void, *mut usize),
    connect: nosys!(c_int; *mut sys::fid_ep, *const c_void, *const c_void, usize),
    listen: Some(pep_listen),
    accept: nosys!(c_int; *mut sys::fid_ep, *const c_void, usize),
    reject: Some(pep_reject),
    shutdown: nosys!(c_int; *mut sys::fid_ep, u64),
    join: nosys!(c_int; *mut sys::fid_ep, *const c_void, u64, *mut *mut sys::fid_mc, *mut c_void),
};
