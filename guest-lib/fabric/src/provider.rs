//! The provider's entry (`fi_prov_ini`) and `fi_getinfo`: what it offers,
//! matched against the caller's hints (docs/libfabric.md §3).

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use crate::engine::{MAX_MESSAGE, QUEUE_DEPTH};
use crate::fi::{self, sys};

/// The provider's name.
pub const NAME: &CStr = c"ulnic";
/// The provider's version (this crate's 0.1).
pub const VERSION: u32 = fi::version(0, 1);
/// Capabilities offered.
pub const CAPS: u64 = fi::MSG
    | fi::TAGGED
    | fi::SEND
    | fi::RECV
    | fi::DIRECTED_RECV
    | fi::LOCAL_COMM
    | fi::REMOTE_COMM
    | RMA_CAPS;
/// The remote memory access capabilities (they need FI_MR_PROV_KEY).
pub const RMA_CAPS: u64 = fi::RMA | fi::READ | fi::WRITE | fi::REMOTE_READ | fi::REMOTE_WRITE;

/// Whether the hints allow provider-chosen keys (RMA's registrations
/// need them): no hints, or FI_MR_PROV_KEY in their mr_mode.
///
/// # Safety
/// `h`'s domain_attr is valid or null.
unsafe fn prov_key_allowed(h: Option<&sys::fi_info>) -> bool {
    // SAFETY: the caller's promise.
    h.is_none_or(|h| {
        unsafe { h.domain_attr.as_ref() }.is_some_and(|d| d.mr_mode as u64 & fi::MR_PROV_KEY != 0)
    })
}
/// Bytes fi_inject takes (it copies at once).
pub const INJECT_SIZE: usize = 4096;

/// Whether this process can reach a ulnic NIC at all: a host-attach
/// socket named, or the guest device file present.
fn nic_present() -> bool {
    if std::env::var_os(ulnic::SOCKET_ENV).is_some() {
        return true;
    }
    let dev = std::env::var_os(ulnic::DEVICE_ENV).unwrap_or_else(|| ulnic::DEFAULT_DEVICE.into());
    std::path::Path::new(&dev).exists()
}

/// Why the hints cannot be met, if they cannot.
///
/// # Safety
/// `h` is a valid fi_info from the caller (its attr pointers may be null).
unsafe fn refuse(h: &sys::fi_info) -> Option<&'static str> {
    if h.caps & !CAPS != 0 {
        return Some("capabilities not offered");
    }
    if h.addr_format != sys::FI_FORMAT_UNSPEC {
        return Some("address format");
    }
    // SAFETY: the caller's attrs are valid or null.
    if h.caps & RMA_CAPS != 0 && !unsafe { prov_key_allowed(Some(h)) } {
        return Some("RMA needs FI_MR_PROV_KEY in mr_mode");
    }
    // SAFETY: the caller's attrs are valid or null.
    let (ep, dom, fab, tx, rx) = unsafe {
        (
            h.ep_attr.as_ref(),
            h.domain_attr.as_ref(),
            h.fabric_attr.as_ref(),
            h.tx_attr.as_ref(),
            h.rx_attr.as_ref(),
        )
    };
    if let Some(ep) = ep {
        if ep.type_ != sys::fi_ep_type_FI_EP_UNSPEC && !crate::ep::offered_type(ep.type_) {
            return Some("endpoint type");
        }
        if ep.max_msg_size > MAX_MESSAGE {
            return Some("max_msg_size");
        }
        if ep.tx_ctx_cnt > 1 || ep.rx_ctx_cnt > 1 {
            return Some("scalable endpoints");
        }
    }
    if let Some(d) = dom {
        if d.data_progress == sys::fi_progress_FI_PROGRESS_AUTO
            || d.control_progress == sys::fi_progress_FI_PROGRESS_AUTO
        {
            return Some("automatic progress");
        }
        // SAFETY: a C string when not null.
        if !d.name.is_null() && unsafe { CStr::from_ptr(d.name) } != NAME {
            return Some("domain name");
        }
    }
    if let Some(f) = fab {
        // SAFETY: as above.
        if !f.name.is_null() && unsafe { CStr::from_ptr(f.name) } != NAME {
            return Some("fabric name");
        }
    }
    if tx.is_some_and(|t| t.caps & !CAPS != 0) || rx.is_some_and(|r| r.caps & !CAPS != 0) {
        return Some("capabilities not offered");
    }
    None
}

/// Ports a service number names: `SERVICE_BASE + service` in the
/// provider's range (automatic ports stay below it).
pub const SERVICE_BASE: u32 = crate::engine::PORT_BASE + 0x0080_0000;

/// The node a `fi_getinfo` node string names: a node number ("1"), a
/// cluster host name ("node1"), or an IPv4 address of the `ULNIC_INET`
/// network (node n is the network address + n + 1, as for sockets);
/// 127.x.x.x and "localhost" are this node (`av::THIS_NODE`).
pub fn resolve_node(s: &str) -> Option<u32> {
    if let Ok(n) = s.parse::<u32>() {
        return Some(n);
    }
    if let Some(n) = s.strip_prefix("node").and_then(|n| n.parse().ok()) {
        return Some(n);
    }
    let ip: std::net::Ipv4Addr = if s == "localhost" {
        std::net::Ipv4Addr::LOCALHOST
    } else {
        s.parse().ok()?
    };
    if ip.is_loopback() {
        return Some(crate::av::THIS_NODE);
    }
    let net = std::env::var("ULNIC_INET").ok()?;
    let (base, len) = net.split_once('/')?;
    let base: std::net::Ipv4Addr = base.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| (8..=30).contains(l))?;
    let mask = u32::MAX << (32 - len);
    let off = u32::from(ip).wrapping_sub(u32::from(base) & mask);
    (off >= 1 && off < (1 << (32 - len)) - 1).then(|| off - 1)
}

/// The port a service string names.
pub fn resolve_service(s: &str) -> Option<u32> {
    let n: u32 = s.parse().ok()?;
    (n < 0x0080_0000).then_some(SERVICE_BASE + n)
}

/// The fi_getinfo node and service as an address: with FI_SOURCE (or no
/// node) this endpoint's own (`src`), else the peer's (`dest`).
fn addresses(
    node: Option<&str>,
    service: Option<&str>,
    flags: u64,
) -> Result<(Option<ulnic::Address>, Option<ulnic::Address>), ()> {
    let port = match service {
        Some(s) => Some(resolve_service(s).ok_or(())?),
        None => None,
    };
    let node_num = match node {
        Some(n) => Some(resolve_node(n).ok_or(())?),
        None => None,
    };
    let addr = |n: Option<u32>| ulnic::Address {
        node: n.unwrap_or(crate::av::THIS_NODE),
        port: port.unwrap_or(0),
    };
    if flags & fi::SOURCE != 0 || node.is_none() {
        Ok((port.map(|_| addr(node_num)), None))
    } else {
        Ok((None, Some(addr(node_num))))
    }
}

/// Copies `len` bytes at `p` into malloc'd memory (fi_freeinfo frees
/// fi_info's addresses with free).
///
/// # Safety
/// `p` holds `len` readable bytes.
unsafe fn malloc_copy(p: *const u8, len: usize) -> *mut std::ffi::c_void {
    // SAFETY: malloc of `len`, then a copy of the caller's bytes.
    unsafe {
        let m = libc::malloc(len);
        if !m.is_null() {
            std::ptr::copy_nonoverlapping(p, m.cast(), len);
        }
        m
    }
}

unsafe extern "C" fn getinfo(
    _version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const sys::fi_info,
    out: *mut *mut sys::fi_info,
) -> c_int {
    if out.is_null() {
        return -fi::EINVAL;
    }
    // SAFETY: libfabric passes valid hints or null.
    let hints = unsafe { hints.as_ref() };
    // SAFETY: as above.
    if let Some(why) = hints.and_then(|h| unsafe { refuse(h) }) {
        let _ = why;
        return -fi::ENODATA;
    }
    if !nic_present() {
        return -fi::ENODATA;
    }
    // SAFETY: C strings when not null.
    let text = |p: *const c_char| unsafe {
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    };
    let Ok((src, dest)) = addresses(text(node).as_deref(), text(service).as_deref(), flags) else {
        return -fi::ENODATA; // a node or service that names no ulnic address
    };
    // SAFETY: the hints' attrs are valid or null.
    let asked = hints
        .and_then(|h| unsafe { h.ep_attr.as_ref() })
        .map_or(sys::fi_ep_type_FI_EP_UNSPEC, |e| e.type_);
    let types = [sys::fi_ep_type_FI_EP_RDM, sys::fi_ep_type_FI_EP_MSG];
    let wants_rma = hints.is_some_and(|h| h.caps & RMA_CAPS != 0);
    let mut head: *mut sys::fi_info = std::ptr::null_mut();
    for t in types.into_iter().rev() {
        if asked != sys::fi_ep_type_FI_EP_UNSPEC && asked != t {
            continue;
        }
        // RMA is offered on reliable-datagram endpoints only (`fill`).
        if wants_rma && t != sys::fi_ep_type_FI_EP_RDM {
            continue;
        }
        // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with every
        // attr.
        let info = unsafe { sys::fi_dupinfo(std::ptr::null()) };
        if info.is_null() {
            // SAFETY: the list made so far, ours to free.
            unsafe { sys::fi_freeinfo(head) };
            return -fi::ENOMEM;
        }
        // SAFETY: a fresh fi_info with its attrs allocated.
        unsafe {
            fill(&mut *info, hints, t);
            for (a, at, len) in [
                (src, &mut (*info).src_addr, &mut (*info).src_addrlen),
                (dest, &mut (*info).dest_addr, &mut (*info).dest_addrlen),
            ] {
                if let Some(a) = a {
                    let name = crate::av::name(a);
                    libc::free(*at);
                    *at = malloc_copy(name.as_ptr(), name.len());
                    *len = if at.is_null() { 0 } else { name.len() };
                }
            }
            (*info).next = head;
        }
        head = info;
    }
    if head.is_null() {
        return -fi::ENODATA; // no endpoint type offers what was asked
    }
    // SAFETY: libfabric's out-pointer.
    unsafe { *out = head };
    0
}

/// Writes what the provider offers into `i`.
///
/// # Safety
/// `i` came from `fi_dupinfo(NULL)`: every attr pointer is valid.
unsafe fn fill(i: &mut sys::fi_info, hints: Option<&sys::fi_info>, ep_type: sys::fi_ep_type) {
    let asked = hints.map_or(0, |h| h.caps);
    // SAFETY: the hints' attrs are valid or null.
    let prov_key = unsafe { prov_key_allowed(hints) };
    // RMA on reliable-datagram endpoints only: a connected endpoint with
    // RMA would have libfabric's rxm utility layer itself over this
    // provider and offer "ulnic;ofi_rxm" ahead of it.
    let caps = if asked != 0 {
        asked | (CAPS & (fi::LOCAL_COMM | fi::REMOTE_COMM))
    } else if prov_key && ep_type == sys::fi_ep_type_FI_EP_RDM {
        CAPS
    } else {
        CAPS & !RMA_CAPS
    };
    i.caps = caps;
    i.mode = 0;
    i.addr_format = sys::FI_FORMAT_UNSPEC;
    // SAFETY: hints' dest_addr holds dest_addrlen bytes; copied with
    // malloc, as fi_freeinfo frees it with free.
    if let Some(h) = hints.filter(|h| !h.dest_addr.is_null() && h.dest_addrlen > 0) {
        unsafe {
            i.dest_addr = malloc_copy(h.dest_addr.cast(), h.dest_addrlen);
            i.dest_addrlen = if i.dest_addr.is_null() {
                0
            } else {
                h.dest_addrlen
            };
        }
    }
    // SAFETY: as above, the hints' src_addr.
    if let Some(h) = hints.filter(|h| !h.src_addr.is_null() && h.src_addrlen > 0) {
        unsafe {
            i.src_addr = malloc_copy(h.src_addr.cast(), h.src_addrlen);
            i.src_addrlen = if i.src_addr.is_null() {
                0
            } else {
                h.src_addrlen
            };
        }
    }
    let order = fi::ORDER_SAS;
    // SAFETY: the caller's promise.
    let (tx, rx, ep, dom, fab) = unsafe {
        (
            &mut *i.tx_attr,
            &mut *i.rx_attr,
            &mut *i.ep_attr,
            &mut *i.domain_attr,
            &mut *i.fabric_attr,
        )
    };
    // SAFETY: the hints' attrs are valid or null.
    let (htx, hrx) = hints.map_or((None, None), |h| unsafe {
        (h.tx_attr.as_ref(), h.rx_attr.as_ref())
    });
    tx.caps = caps;
    tx.op_flags = htx.map_or(0, |t| t.op_flags & fi::COMPLETION);
    rx.op_flags = hrx.map_or(0, |r| r.op_flags & fi::COMPLETION);
    tx.msg_order = order;
    tx.inject_size = INJECT_SIZE;
    tx.size = QUEUE_DEPTH;
    tx.iov_limit = 1;
    rx.caps = caps;
    rx.msg_order = order;
    rx.size = QUEUE_DEPTH;
    rx.iov_limit = 1;
    ep.type_ = ep_type;
    ep.max_msg_size = MAX_MESSAGE;
    // All 64 tag bits are matched (with the receive's ignore bits).
    ep.mem_tag_format = u64::MAX;
    ep.tx_ctx_cnt = 1;
    ep.rx_ctx_cnt = 1;
    // SAFETY: strdup of a C string; freed by fi_freeinfo.
    dom.name = unsafe { libc::strdup(NAME.as_ptr()) };
    dom.threading = sys::fi_threading_FI_THREAD_SAFE;
    dom.control_progress = sys::fi_progress_FI_PROGRESS_MANUAL;
    dom.data_progress = sys::fi_progress_FI_PROGRESS_MANUAL;
    dom.resource_mgmt = sys::fi_resource_mgmt_FI_RM_ENABLED;
    dom.av_type = match hints.and_then(|h| unsafe { h.domain_attr.as_ref() }) {
        Some(d) if d.av_type == sys::fi_av_type_FI_AV_MAP => sys::fi_av_type_FI_AV_MAP,
        _ => sys::fi_av_type_FI_AV_TABLE,
    };
    // Keys are the provider's; remote addresses are offsets into the
    // region (no FI_MR_VIRT_ADDR); local buffers need no registration.
    dom.mr_mode = if caps & RMA_CAPS != 0 {
        fi::MR_PROV_KEY as c_int
    } else {
        0
    };
    dom.mr_key_size = 8;
    dom.cq_data_size = 8;
    dom.cq_cnt = 256;
    dom.ep_cnt = 256;
    dom.tx_ctx_cnt = 256;
    dom.rx_ctx_cnt = 256;
    dom.max_ep_tx_ctx = 1;
    dom.max_ep_rx_ctx = 1;
    dom.mr_iov_limit = 1;
    dom.mr_cnt = 1 << 16;
    dom.caps = fi::LOCAL_COMM | fi::REMOTE_COMM;
    // SAFETY: as for the domain name.
    fab.name = unsafe { libc::strdup(NAME.as_ptr()) };
    fab.prov_version = VERSION;
}

/// libfabric's entry into a provider loaded from `FI_PROVIDER_PATH`:
/// the provider's description. libfabric writes into it (its context
/// words), so it lives on the heap, made once per load.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut sys::fi_provider {
    if std::env::var_os("ULNIC_STATS").is_some_and(|v| v != "0") {
        // SAFETY: registers a plain function to run at exit().
        unsafe { libc::atexit(report_wakes) };
    }
    Box::into_raw(Box::new(sys::fi_provider {
        version: VERSION,
        fi_version: fi::API_VERSION,
        context: sys::fi_context {
            internal: [std::ptr::null_mut(); 4],
        },
        name: NAME.as_ptr(),
        getinfo: Some(getinfo),
        fabric: Some(crate::domain::open_fabric),
        cleanup: None,
    }))
}

/// With `ULNIC_STATS=1`, at exit: how the provider's waits ended
/// (docs/libfabric.md §3), one line on standard error, if it waited.
extern "C" fn report_wakes() {
    // `ULNIC_STATS=/a/file` appends there, as the layer does; otherwise
    // one write to stderr, so that the line leaves whole as the process
    // ends (an MPI launcher forwards it).
    if let Some(line) = ulnic::sock::wake_report("ulnic provider") {
        // SAFETY: writes a buffer we own to stderr.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ulnic::Address;

    #[test]
    fn nodes_and_services_name_ulnic_addresses() {
        assert_eq!(resolve_node("3"), Some(3));
        assert_eq!(resolve_node("node12"), Some(12));
        assert_eq!(resolve_node("127.0.0.1"), Some(crate::av::THIS_NODE));
        assert_eq!(resolve_node("localhost"), Some(crate::av::THIS_NODE));
        assert_eq!(resolve_node("example.org"), None);
        assert_eq!(resolve_service("9228"), Some(SERVICE_BASE + 9228));
        assert_eq!(resolve_service("http"), None);
        let port = SERVICE_BASE + 7;
        // A server: its own address, on this node.
        assert_eq!(
            addresses(None, Some("7"), 0),
            Ok((
                Some(Address {
                    node: crate::av::THIS_NODE,
                    port
                }),
                None
            ))
        );
        // A client: the server's.
        assert_eq!(
            addresses(Some("node1"), Some("7"), 0),
            Ok((None, Some(Address { node: 1, port })))
        );
        assert_eq!(addresses(Some("nowhere"), Some("7"), 0), Err(()));
        assert_eq!(addresses(None, None, 0), Ok((None, None)));
    }
}
