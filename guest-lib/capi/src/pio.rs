//! PIO windows (CLAN's PIO apertures, docs/spec.md §6.2): memory an
//! endpoint exports that another node's process maps and writes with
//! plain stores; tripwires on windows, fired by the writer's sync.

use std::ffi::c_void;

use ulnic::{PioGrant, PioImport, PioWindow};

use crate::endpoint::{ulnic_ep, ULNIC_COMPLETION};
use crate::nic::put;
use crate::rdma::ULNIC_TRIPWIRE_PERSISTENT;
use crate::status::{guard, handle, invalid};

/// What an importer needs to map a window. Plain data: send it to the
/// importer by any means.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ulnic_pio_grant {
    /// The exporter's node.
    pub node: u32,
    /// The window on that node.
    pub window: u32,
    /// 64 random bits.
    pub key: u64,
}

impl From<PioGrant> for ulnic_pio_grant {
    fn from(g: PioGrant) -> Self {
        ulnic_pio_grant {
            node: g.node,
            window: g.window,
            key: g.key,
        }
    }
}

/// A window this process exported. One thread at a time.
pub struct ulnic_pio_window {
    w: PioWindow,
}

/// A window of another node mapped here. One thread at a time.
pub struct ulnic_pio_import {
    w: PioImport,
}

/// Exports a window of `bytes` (whole pages), zero-filled and mapped here
/// too, that node `importer` (or any: `ULNIC_ANY`) may map with its
/// grant (`ulnic_pio_window_grant`). `-ENOSPC` when this process's
/// aperture is full (4 windows mapped at most), `-EOPNOTSUPP` where PIO
/// windows are not available (a device started with --pio-aperture 0).
///
/// ```c
/// struct ulnic_pio_window *w;
/// int err = ulnic_pio_export(ep, 4096, ULNIC_ANY, &w);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_export(
    ep: *mut ulnic_ep,
    bytes: u64,
    importer: u32,
    out: *mut *mut ulnic_pio_window,
) -> i32 {
    let e = handle!(ep, "ulnic_pio_export");
    if out.is_null() {
        return invalid("ulnic_pio_export", "out is NULL");
    }
    guard("ulnic_pio_export", || {
        let who = (importer != ulnic::ANY).then_some(importer);
        let w = e.ep.export_pio(bytes as usize, who)?;
        put(out, Box::into_raw(Box::new(ulnic_pio_window { w })));
        Ok(0)
    })
}

/// The window's grant, for `ulnic_pio_import` on the importer.
///
/// ```c
/// struct ulnic_pio_grant g;
/// ulnic_pio_window_grant(w, &g);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_window_grant(
    w: *const ulnic_pio_window,
    out: *mut ulnic_pio_grant,
) -> i32 {
    // SAFETY: a live handle or NULL.
    let Some(w) = (unsafe { w.as_ref() }) else {
        return invalid("ulnic_pio_window_grant", "w is NULL");
    };
    if !put(out, w.w.grant().into()) {
        return invalid("ulnic_pio_window_grant", "out is NULL");
    }
    0
}

/// The window's first byte in this process (NULL for a NULL handle).
///
/// ```c
/// volatile uint64_t *words = ulnic_pio_window_addr(w);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_window_addr(w: *const ulnic_pio_window) -> *mut c_void {
    // SAFETY: a live handle or NULL.
    unsafe { w.as_ref() }.map_or(std::ptr::null_mut(), |w| w.w.as_ptr().cast())
}

/// The window's bytes (0 for a NULL handle).
///
/// ```c
/// uint64_t n = ulnic_pio_window_len(w);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_window_len(w: *const ulnic_pio_window) -> u64 {
    // SAFETY: a live handle or NULL.
    unsafe { w.as_ref() }.map_or(0, |w| w.w.len() as u64)
}

/// Revokes the window: when this returns, no importer's store reaches it
/// and each importer got `ULNIC_EVENT_PIO_REVOKED`; it stays mapped here
/// until freed.
///
/// ```c
/// ulnic_pio_window_revoke(w);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_window_revoke(w: *mut ulnic_pio_window) -> i32 {
    let w = handle!(w, "ulnic_pio_window_revoke");
    guard("ulnic_pio_window_revoke", || w.w.revoke().map(|()| 0))
}

/// Revokes the window if needed and frees it (NULL is ignored).
///
/// ```c
/// ulnic_pio_window_free(w);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_window_free(w: *mut ulnic_pio_window) {
    if !w.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(w) });
    }
}

/// Maps the window `grant` names. `-ENOENT` for a forged, revoked or
/// foreign grant, `-ENOSPC` for a full aperture.
///
/// ```c
/// struct ulnic_pio_import *imp;
/// int err = ulnic_pio_import(ep, &g, &imp);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_import(
    ep: *mut ulnic_ep,
    grant: *const ulnic_pio_grant,
    out: *mut *mut ulnic_pio_import,
) -> i32 {
    let e = handle!(ep, "ulnic_pio_import");
    // SAFETY: NULL or a grant the caller owns.
    let Some(g) = (unsafe { grant.as_ref() }) else {
        return invalid("ulnic_pio_import", "grant is NULL");
    };
    if out.is_null() {
        return invalid("ulnic_pio_import", "out is NULL");
    }
    guard("ulnic_pio_import", || {
        let w = e.ep.import_pio(PioGrant {
            node: g.node,
            window: g.window,
            key: g.key,
        })?;
        put(out, Box::into_raw(Box::new(ulnic_pio_import { w })));
        Ok(0)
    })
}

/// The imported window's first byte here (NULL for a NULL handle). A
/// store after its revocation faults.
///
/// ```c
/// volatile uint64_t *words = ulnic_pio_import_addr(imp);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_import_addr(w: *const ulnic_pio_import) -> *mut c_void {
    // SAFETY: a live handle or NULL.
    unsafe { w.as_ref() }.map_or(std::ptr::null_mut(), |w| w.w.as_ptr().cast())
}

/// The imported window's bytes (0 for a NULL handle).
///
/// ```c
/// uint64_t n = ulnic_pio_import_len(imp);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_import_len(w: *const ulnic_pio_import) -> u64 {
    // SAFETY: a live handle or NULL.
    unsafe { w.as_ref() }.map_or(0, |w| w.w.len() as u64)
}

/// The import's id, as `ULNIC_EVENT_PIO_REVOKED`'s `code` names it.
///
/// ```c
/// uint32_t id = ulnic_pio_import_id(imp);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_import_id(w: *const ulnic_pio_import) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { w.as_ref() }.map_or(0, |w| w.w.id())
}

/// Releases the import (NULL is ignored).
///
/// ```c
/// ulnic_pio_import_free(imp);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_import_free(w: *mut ulnic_pio_import) {
    if !w.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(w) });
    }
}

/// Makes every earlier store of this thread visible to the window's other
/// users before any later load (a full fence; docs/spec.md §6.2). Data
/// followed by a flag stored with release semantics needs none.
///
/// ```c
/// ulnic_pio_flush();
/// ```
#[no_mangle]
pub extern "C" fn ulnic_pio_flush() {
    ulnic::pio_flush();
}

/// Tells the device that this process stored into `len` bytes at `offset`
/// of the window `grant` names: the tripwires its exporter set on that
/// range (`ulnic_pio_window_tripwire`) fire and wake it, and it finds the
/// stores made before this call. One descriptor per sync, none per store;
/// the window need not be mapped here. `flags`: `ULNIC_COMPLETION` for a
/// `ULNIC_EVENT_SEND_DONE`; a wrong or revoked grant ends in
/// `ULNIC_EVENT_SEND_FAILED` (BAD_COOKIE), a range past the window in
/// OUT_OF_RANGE. `-EAGAIN` when the send ring is full.
///
/// ```c
/// words[0] = 42;
/// ulnic_pio_sync(ep, &g, 0, 8, 1, ULNIC_COMPLETION);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_sync(
    ep: *mut ulnic_ep,
    grant: *const ulnic_pio_grant,
    offset: u64,
    len: u32,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_pio_sync");
    // SAFETY: NULL or a grant the caller owns.
    let Some(g) = (unsafe { grant.as_ref() }) else {
        return invalid("ulnic_pio_sync", "grant is NULL");
    };
    if flags & !ULNIC_COMPLETION != 0 {
        return invalid("ulnic_pio_sync", "unknown flags");
    }
    let grant = PioGrant {
        node: g.node,
        window: g.window,
        key: g.key,
    };
    guard("ulnic_pio_sync", || {
        e.ep.pio_sync(&grant, offset, len, id, flags & ULNIC_COMPLETION != 0)
            .map(|()| 0)
    })
}

/// Sets a tripwire on `len` bytes at `offset` of window `w`, which `ep`
/// exported: an importer's `ulnic_pio_sync` touching the range posts
/// `ULNIC_EVENT_TRIPWIRE` with `user` and wakes a waiter. `flags`: 0 (it
/// fires once) or `ULNIC_TRIPWIRE_PERSISTENT`. `*id` names it for
/// `ulnic_ep_clear_tripwire`. `-ENOENT` for another endpoint's window.
///
/// ```c
/// uint32_t tw;
/// ulnic_pio_window_tripwire(ep, w, 0, 4096, 0, 77, &tw);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_pio_window_tripwire(
    ep: *mut ulnic_ep,
    w: *const ulnic_pio_window,
    offset: u64,
    len: u64,
    flags: u32,
    user: u64,
    id: *mut u32,
) -> i32 {
    let e = handle!(ep, "ulnic_pio_window_tripwire");
    // SAFETY: NULL or a live handle.
    let (Some(w), false, 0) = (
        unsafe { w.as_ref() },
        id.is_null(),
        flags & !ULNIC_TRIPWIRE_PERSISTENT,
    ) else {
        return invalid(
            "ulnic_pio_window_tripwire",
            "window or id is NULL, or unknown flags",
        );
    };
    let persistent = flags & ULNIC_TRIPWIRE_PERSISTENT != 0;
    guard("ulnic_pio_window_tripwire", || {
        put(
            id,
            e.ep.set_pio_tripwire(&w.w, offset, len, persistent, user)?,
        );
        Ok(0)
    })
}
