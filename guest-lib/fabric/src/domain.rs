//! The fabric and domain objects (fi_fabric, fi_domain) and memory
//! registration (fi_mr_reg). A domain is one open NIC (`Nic::open`: the
//! guest device file, or host attach through `ULNIC_SOCKET`) and one
//! protection domain on it; every endpoint of the domain is a ulnic
//! endpoint in that protection domain.

use std::ffi::c_void;
use std::os::raw::c_int;

use std::sync::Arc;

use crate::mr::{MrEntry, MrTable};
use crate::nic::SharedNic;

use crate::engine::Engine;
use crate::fi::{self, fid_ops, nosys, sys};

/// An open fabric.
#[repr(C)]
struct Fabric {
    fid: sys::fid_fabric,
}

/// An open domain.
#[repr(C)]
struct Domain {
    fid: sys::fid_domain,
    nic: Arc<SharedNic>,
    /// The registrations peers may reach (RMA).
    mrs: Arc<MrTable>,
}

/// A registration: local buffers need none (the provider copies); with
/// FI_REMOTE_READ or FI_REMOTE_WRITE peers reach it by its key, drawn at
/// random (FI_MR_PROV_KEY), until it is closed.
#[repr(C)]
struct Mr {
    fid: sys::fid_mr,
    mrs: Arc<MrTable>,
}

/// Opens the fabric (`fi_fabric`, through the provider's entry).
///
/// # Safety
/// `out` is libfabric's valid out-pointer.
pub unsafe extern "C" fn open_fabric(
    _attr: *mut sys::fi_fabric_attr,
    out: *mut *mut sys::fid_fabric,
    context: *mut c_void,
) -> c_int {
    let f = Box::new(Fabric {
        fid: sys::fid_fabric {
            fid: sys::fid {
                fclass: sys::FI_CLASS_FABRIC as usize,
                context,
                ops: &FABRIC_FI_OPS as *const _ as *mut _,
            },
            ops: &FABRIC_OPS as *const _ as *mut _,
            api_version: fi::API_VERSION,
        },
    });
    // SAFETY: the caller's promise.
    unsafe { *out = Box::into_raw(f).cast() };
    0
}

unsafe extern "C" fn fabric_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a fabric it got from `open_fabric`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Fabric>()) });
    0
}

unsafe extern "C" fn open_domain(
    _fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    out: *mut *mut sys::fid_domain,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes the fi_info the domain is for.
    if let Some(ep) = unsafe { info.as_ref().and_then(|i| i.ep_attr.as_ref()) } {
        if !crate::ep::offered_type(ep.type_) && ep.type_ != sys::fi_ep_type_FI_EP_UNSPEC {
            return -fi::ENOSYS;
        }
    }
    let nic = match crate::nic::shared() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("ulnic provider: cannot open the NIC: {e}");
            return -fi::ENODEV;
        }
    };
    let d = Box::new(Domain {
        fid: sys::fid_domain {
            fid: sys::fid {
                fclass: sys::FI_CLASS_DOMAIN as usize,
                context,
                ops: &DOMAIN_FI_OPS as *const _ as *mut _,
            },
            ops: &DOMAIN_OPS as *const _ as *mut _,
            mr: &MR_OPS as *const _ as *mut _,
        },
        nic,
        mrs: Arc::new(MrTable::default()),
    });
    // SAFETY: libfabric's valid out-pointer.
    unsafe { *out = Box::into_raw(d).cast() };
    0
}

/// The domain behind a fid.
///
/// # Safety
/// `fid` is a fid this provider made, not yet closed.
unsafe fn domain<'a>(fid: *mut sys::fid) -> Option<&'a Domain> {
    // SAFETY: `Domain` is repr(C) with its fid first; the caller's promise.
    let d = unsafe { fid.cast::<Domain>().as_ref()? };
    (d.fid.fid.fclass == sys::FI_CLASS_DOMAIN as usize).then_some(d)
}

unsafe extern "C" fn domain_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a domain it got from `open_domain`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Domain>()) });
    0
}

unsafe extern "C" fn av_open(
    _d: *mut sys::fid_domain,
    attr: *mut sys::fi_av_attr,
    out: *mut *mut sys::fid_av,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's attr and out-pointer.
    unsafe { crate::av::open(attr, out, context) }
}

unsafe extern "C" fn cq_open(
    _d: *mut sys::fid_domain,
    attr: *mut sys::fi_cq_attr,
    out: *mut *mut sys::fid_cq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's attr and out-pointer.
    unsafe { crate::cq::open(attr, out, context) }
}

unsafe extern "C" fn cntr_open(
    _d: *mut sys::fid_domain,
    attr: *mut sys::fi_cntr_attr,
    out: *mut *mut sys::fid_cntr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric's attr and out-pointer.
    unsafe { crate::cntr::open(attr, out, context) }
}

unsafe extern "C" fn endpoint(
    d: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    out: *mut *mut sys::fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric dispatched through this domain's ops.
    let Some(d) = (unsafe { domain(d.cast()) }) else {
        return -fi::EINVAL;
    };
    // SAFETY: libfabric's fi_info for the endpoint.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return -fi::EINVAL;
    };
    // SAFETY: its attrs are valid or null.
    let (ep_attr, tx_attr, rx_attr) = unsafe {
        (
            info.ep_attr.as_ref(),
            info.tx_attr.as_ref(),
            info.rx_attr.as_ref(),
        )
    };
    let op_flags = (
        tx_attr.map_or(0, |t| t.op_flags),
        rx_attr.map_or(0, |r| r.op_flags),
    );
    let connected = match ep_attr.map(|ep| ep.type_) {
        Some(sys::fi_ep_type_FI_EP_RDM) => false,
        Some(sys::fi_ep_type_FI_EP_MSG) => true,
        _ => return -fi::ENOSYS,
    };
    let caps = info.caps | rx_attr.map_or(0, |r| r.caps);
    // A server's endpoint is made for a connection request (its handle).
    // SAFETY: a handle in an fi_info is a fid a provider made or null.
    let peer = unsafe { crate::pep::requester(info.handle) };
    // SAFETY: the fi_info's src_addr holds src_addrlen bytes.
    let port = unsafe { crate::av::bound_port(info) };
    match Engine::open(&d.nic.pd, port, d.mrs.clone()) {
        Ok(e) => {
            let me = e.address(d.nic.nic.node());
            let conn = connected.then(|| crate::ep::Conn::new(peer));
            // SAFETY: libfabric's out-pointer.
            unsafe { crate::ep::open(e, me, caps, op_flags, conn, out, context) }
        }
        Err(e) => -e.errno(),
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn mr_reg(
    fid: *mut sys::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    _offset: u64,
    _requested_key: u64,
    flags: u64,
    out: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric dispatched through this domain's ops.
    let Some(d) = (unsafe { domain(fid) }) else {
        return -fi::EINVAL;
    };
    if out.is_null() || flags != 0 || (buf.is_null() && len != 0) {
        return -fi::EINVAL;
    }
    // Keys are the provider's (FI_MR_PROV_KEY): a requested key is not
    // honoured, so no peer can name a region by a key it chose.
    let key = d.mrs.register(MrEntry {
        base: buf as usize,
        len,
        access: access & (fi::REMOTE_READ | fi::REMOTE_WRITE),
    });
    let mr = Box::new(Mr {
        fid: sys::fid_mr {
            fid: sys::fid {
                fclass: sys::FI_CLASS_MR as usize,
                context,
                ops: &MR_FI_OPS as *const _ as *mut _,
            },
            mem_desc: std::ptr::null_mut(),
            key,
        },
        mrs: d.mrs.clone(),
    });
    // SAFETY: libfabric's out-pointer.
    unsafe { *out = Box::into_raw(mr).cast() };
    0
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn mr_regv(
    fid: *mut sys::fid,
    iov: *const sys::iovec,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    out: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    let (base, len) = match iov_one(iov, count) {
        Ok(v) => v,
        Err(e) => return e,
    };
    // SAFETY: forwarded as given.
    unsafe {
        mr_reg(
            fid,
            base,
            len,
            access,
            offset,
            requested_key,
            flags,
            out,
            context,
        )
    }
}

unsafe extern "C" fn mr_regattr(
    fid: *mut sys::fid,
    attr: *const sys::fi_mr_attr,
    flags: u64,
    out: *mut *mut sys::fid_mr,
) -> c_int {
    // SAFETY: libfabric's attr.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return -fi::EINVAL;
    };
    let (base, len) = match iov_one(a.mr_iov, a.iov_count) {
        Ok(v) => v,
        Err(e) => return e,
    };
    // SAFETY: forwarded as given.
    unsafe {
        mr_reg(
            fid,
            base,
            len,
            a.access,
            a.offset,
            a.requested_key,
            flags,
            out,
            a.context,
        )
    }
}

/// `one_iov` (ep.rs) with a registration's argument types.
fn iov_one(iov: *const sys::iovec, count: usize) -> Result<(*const c_void, usize), c_int> {
    // SAFETY: libfabric passes `count` iovecs.
    unsafe { crate::ep::one_iov(iov.cast(), count) }
        .map(|(b, l)| (b.cast_const(), l))
        .map_err(|e| e as c_int)
}

unsafe extern "C" fn mr_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a registration it got from `mr_reg`, once.
    let mr = unsafe { Box::from_raw(fid.cast::<Mr>()) };
    mr.mrs.remove(mr.fid.key);
    0
}

fid_ops!(FABRIC_FI_OPS, fabric_close);
fid_ops!(DOMAIN_FI_OPS, domain_close);
fid_ops!(MR_FI_OPS, mr_close);

/// `fi_trywait`: 0 when the application may sleep on every queue's
/// descriptor, `-FI_EAGAIN` when one of them has something (read it
/// first), `-FI_EINVAL` for a fid without a wait descriptor.
unsafe extern "C" fn trywait(_fabric: Fab, fids: *mut *mut sys::fid, count: c_int) -> c_int {
    if fids.is_null() || count < 0 {
        return -fi::EINVAL;
    }
    for i in 0..count as usize {
        // SAFETY: libfabric passes `count` fids of this provider.
        let r = unsafe { crate::cq::try_wait_fid(*fids.add(i)) };
        if r != 0 {
            return r;
        }
    }
    0
}

type Dom = *mut sys::fid_domain;
type Fab = *mut sys::fid_fabric;

static FABRIC_OPS: sys::fi_ops_fabric = sys::fi_ops_fabric {
    size: std::mem::size_of::<sys::fi_ops_fabric>(),
    domain: Some(open_domain),
    passive_ep: Some(crate::pep::open),
    eq_open: Some(crate::eq::open),
    wait_open: nosys!(c_int; Fab, *mut sys::fi_wait_attr, *mut *mut sys::fid_wait),
    trywait: Some(trywait),
    domain2: nosys!(c_int; Fab, *mut sys::fi_info, *mut *mut sys::fid_domain, u64, *mut c_void),
};

static DOMAIN_OPS: sys::fi_ops_domain = sys::fi_ops_domain {
    size: std::mem::size_of::<sys::fi_ops_domain>(),
    av_open: Some(av_open),
    cq_open: Some(cq_open),
    endpoint: Some(endpoint),
    scalable_ep: nosys!(c_int; Dom, *mut sys::fi_info, *mut *mut sys::fid_ep, *mut c_void),
    cntr_open: Some(cntr_open),
    poll_open: nosys!(c_int; Dom, *mut sys::fi_poll_attr, *mut *mut sys::fid_poll),
    stx_ctx: nosys!(c_int; Dom, *mut sys::fi_tx_attr, *mut *mut sys::fid_stx, *mut c_void),
    srx_ctx: nosys!(c_int; Dom, *mut sys::fi_rx_attr, *mut *mut sys::fid_ep, *mut c_void),
    query_atomic: nosys!(c_int; Dom, sys::fi_datatype, sys::fi_op, *mut sys::fi_atomic_attr, u64),
    query_collective: nosys!(c_int; Dom, sys::fi_collective_op, *mut sys::fi_collective_attr, u64),
    endpoint2: nosys!(c_int; Dom, *mut sys::fi_info, *mut *mut sys::fid_ep, u64, *mut c_void),
};

static MR_OPS: sys::fi_ops_mr = sys::fi_ops_mr {
    size: std::mem::size_of::<sys::fi_ops_mr>(),
    reg: Some(mr_reg),
    regv: Some(mr_regv),
    regattr: Some(mr_regattr),
};
