//! NICs, protection domains and user buffers.

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;

use ulnic::{Nic, ProtectionDomain, UserBuffer, UtlbConfig};

use crate::status::{guard, handle, invalid};

/// An open NIC: a device node attached from a host process, or a guest's
/// `/dev/ulnicN`. Thread-safe.
pub struct ulnic_nic {
    pub(crate) nic: Nic,
}

/// A protection domain: endpoints in it share a UTLB and, in a guest, one
/// doorbell and one open file of the driver. Thread-safe.
pub struct ulnic_pd {
    pub(crate) pd: ProtectionDomain,
}

/// Memory the device can reach through a domain's UTLB once registered
/// (page aligned, zeroed, whole pages).
pub struct ulnic_buffer {
    pub(crate) buf: UserBuffer,
}

/// How a domain's UTLB behaves (`ulnic_pd_enable_utlb`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ulnic_utlb_config {
    /// Translation entries (pages) the domain's table holds.
    pub entries: u32,
    /// Nonzero: a send from a buffer that misses is copied through the
    /// endpoint's bounce buffer instead of waiting for the driver.
    pub fallback: u32,
    /// With fallback, at most one deferred miss is serviced per this many
    /// bytes sent.
    pub miss_every_bytes: u64,
    /// With fallback, the bounce buffer's size.
    pub bounce_bytes: u64,
}

/// Stores `value` through `out`, a pointer C passed for a result.
pub(crate) fn put<T>(out: *mut T, value: T) -> bool {
    if out.is_null() {
        return false;
    }
    // SAFETY: `out` is non-null and the caller gives it for a result.
    unsafe { out.write(value) };
    true
}

/// Opens the NIC the environment names: `ULNIC_DEVICE` or `/dev/ulnic0`
/// when it exists (in a guest), else the device node socket in
/// `ULNIC_SOCKET` (a host process). Free it with `ulnic_close`.
///
/// ```c
/// struct ulnic_nic *nic;
/// int err = ulnic_open(&nic);
/// if (err < 0) { fprintf(stderr, "%s\n", ulnic_last_error()); return 1; }
/// printf("node %u of %u\n", ulnic_node(nic), ulnic_nodes(nic));
/// ulnic_close(nic);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_open(out: *mut *mut ulnic_nic) -> i32 {
    if out.is_null() {
        return invalid("ulnic_open", "out is NULL");
    }
    guard("ulnic_open", || {
        let nic = Nic::open()?;
        put(out, Box::into_raw(Box::new(ulnic_nic { nic })));
        Ok(0)
    })
}

fn path_arg<'a>(p: *const c_char) -> Option<&'a Path> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string from C, read only during the call.
    let s = unsafe { CStr::from_ptr(p) };
    std::str::from_utf8(s.to_bytes()).ok().map(Path::new)
}

/// Opens a guest's device file (`/dev/ulnic0`) explicitly.
///
/// ```c
/// struct ulnic_nic *nic;
/// if (ulnic_open_device("/dev/ulnic0", &nic) == 0)
///     ulnic_close(nic);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_open_device(path: *const c_char, out: *mut *mut ulnic_nic) -> i32 {
    let (Some(p), false) = (path_arg(path), out.is_null()) else {
        return invalid("ulnic_open_device", "path or out is NULL, or not UTF-8");
    };
    guard("ulnic_open_device", || {
        let nic = Nic::open_device(p)?;
        put(out, Box::into_raw(Box::new(ulnic_nic { nic })));
        Ok(0)
    })
}

/// Attaches this process to a device node (the socket `ulnic device`
/// made, e.g. `/tmp/ulnic/node0.sock`): the process is that node. One
/// process (or VM) per node at a time; `-EBUSY` otherwise.
///
/// ```c
/// struct ulnic_nic *nic;
/// int err = ulnic_attach("/tmp/ulnic/node0.sock", &nic);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_attach(socket: *const c_char, out: *mut *mut ulnic_nic) -> i32 {
    let (Some(p), false) = (path_arg(socket), out.is_null()) else {
        return invalid("ulnic_attach", "socket or out is NULL, or not UTF-8");
    };
    guard("ulnic_attach", || {
        let nic = Nic::attach(p)?;
        put(out, Box::into_raw(Box::new(ulnic_nic { nic })));
        Ok(0)
    })
}

/// Closes a NIC handle. Domains and endpoints made from it stay usable
/// until they are freed themselves. NULL is ignored.
///
/// ```c
/// ulnic_close(nic);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_close(nic: *mut ulnic_nic) {
    if !nic.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(nic) });
    }
}

/// This NIC's node address (0 if `nic` is NULL).
///
/// ```c
/// uint32_t me = ulnic_node(nic);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_node(nic: *const ulnic_nic) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { nic.as_ref() }.map_or(0, |n| n.nic.node())
}

/// Nodes in the fabric (0 if `nic` is NULL).
///
/// ```c
/// for (uint32_t n = 0; n < ulnic_nodes(nic); n++) ;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_nodes(nic: *const ulnic_nic) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { nic.as_ref() }.map_or(0, |n| n.nic.nodes())
}

/// The largest message, in bytes (0 if `nic` is NULL).
///
/// ```c
/// uint32_t max = ulnic_max_message(nic);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_max_message(nic: *const ulnic_nic) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { nic.as_ref() }.map_or(0, |n| n.nic.max_message())
}

/// Allocates a protection domain. Free it with `ulnic_pd_free`.
///
/// ```c
/// struct ulnic_pd *pd;
/// int err = ulnic_pd_alloc(nic, &pd);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pd_alloc(nic: *mut ulnic_nic, out: *mut *mut ulnic_pd) -> i32 {
    let n = handle!(nic, "ulnic_pd_alloc");
    if out.is_null() {
        return invalid("ulnic_pd_alloc", "out is NULL");
    }
    guard("ulnic_pd_alloc", || {
        let pd = n.nic.alloc_pd()?;
        put(out, Box::into_raw(Box::new(ulnic_pd { pd })));
        Ok(0)
    })
}

/// Frees a domain handle; the domain itself goes when its last endpoint
/// and buffer are freed too. NULL is ignored.
///
/// ```c
/// ulnic_pd_free(pd);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pd_free(pd: *mut ulnic_pd) {
    if !pd.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(pd) });
    }
}

/// Fills `cfg` with the default UTLB settings.
///
/// ```c
/// struct ulnic_utlb_config cfg;
/// ulnic_utlb_config_default(&cfg);
/// cfg.fallback = 0;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_utlb_config_default(cfg: *mut ulnic_utlb_config) {
    let d = UtlbConfig::default();
    put(
        cfg,
        ulnic_utlb_config {
            entries: d.entries,
            fallback: u32::from(d.fallback),
            miss_every_bytes: d.miss_every_bytes,
            bounce_bytes: d.bounce_bytes as u64,
        },
    );
}

/// Gives the domain a UTLB (VMMC-2): sends and RDMA from user buffers
/// translated by the device. `cfg` NULL takes the defaults.
///
/// ```c
/// int err = ulnic_pd_enable_utlb(pd, NULL);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pd_enable_utlb(
    pd: *mut ulnic_pd,
    cfg: *const ulnic_utlb_config,
) -> i32 {
    let p = handle!(pd, "ulnic_pd_enable_utlb");
    // SAFETY: NULL or a config the caller filled.
    let c = match unsafe { cfg.as_ref() } {
        None => UtlbConfig::default(),
        Some(c) => UtlbConfig {
            entries: c.entries,
            fallback: c.fallback != 0,
            miss_every_bytes: c.miss_every_bytes,
            bounce_bytes: c.bounce_bytes as usize,
        },
    };
    guard("ulnic_pd_enable_utlb", || p.pd.enable_utlb(c).map(|_| 0))
}

/// Allocates `bytes` (rounded up to pages) of buffer memory in the domain,
/// zeroed. Free it with `ulnic_buffer_free`.
///
/// ```c
/// struct ulnic_buffer *buf;
/// ulnic_buffer_alloc(pd, 1 << 20, &buf);
/// memcpy(ulnic_buffer_data(buf), "hello", 5);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_buffer_alloc(
    pd: *mut ulnic_pd,
    bytes: usize,
    out: *mut *mut ulnic_buffer,
) -> i32 {
    let p = handle!(pd, "ulnic_buffer_alloc");
    if out.is_null() {
        return invalid("ulnic_buffer_alloc", "out is NULL");
    }
    guard("ulnic_buffer_alloc", || {
        let buf = p.pd.alloc_buffer(bytes)?;
        put(out, Box::into_raw(Box::new(ulnic_buffer { buf })));
        Ok(0)
    })
}

/// The buffer's bytes (NULL if `buf` is NULL).
///
/// ```c
/// char *p = ulnic_buffer_data(buf);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_buffer_data(buf: *mut ulnic_buffer) -> *mut c_void {
    // SAFETY: a live handle or NULL.
    match unsafe { buf.as_mut() } {
        Some(b) => b.buf.as_mut_slice().as_mut_ptr().cast(),
        None => std::ptr::null_mut(),
    }
}

/// The buffer's length in bytes (whole pages; 0 if `buf` is NULL).
///
/// ```c
/// size_t n = ulnic_buffer_len(buf);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_buffer_len(buf: *const ulnic_buffer) -> usize {
    // SAFETY: a live handle or NULL.
    unsafe { buf.as_ref() }.map_or(0, |b| b.buf.len())
}

/// Registers `len` bytes at `offset` of the buffer now (installs their
/// translations), so the first send from them does not miss.
///
/// ```c
/// ulnic_pd_register(pd, buf, 0, ulnic_buffer_len(buf));
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pd_register(
    pd: *mut ulnic_pd,
    buf: *mut ulnic_buffer,
    offset: usize,
    len: usize,
) -> i32 {
    let p = handle!(pd, "ulnic_pd_register");
    let b = handle!(buf, "ulnic_pd_register");
    let Some(end) = offset.checked_add(len) else {
        return invalid("ulnic_pd_register", "offset + len overflows");
    };
    guard("ulnic_pd_register", || {
        p.pd.register(&b.buf, offset..end).map(|_| 0)
    })
}

/// Frees a buffer. Nothing in flight may still use it. NULL is ignored.
///
/// ```c
/// ulnic_buffer_free(buf);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_buffer_free(buf: *mut ulnic_buffer) {
    if !buf.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(buf) });
    }
}
