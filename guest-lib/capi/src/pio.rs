//! PIO windows (CLAN's PIO apertures, docs/spec.md §6.2): memory an
//! endpoint exports that another node's process maps and writes with
//! plain stores.

use std::ffi::c_void;

use ulnic::{PioGrant, PioImport, PioWindow};

use crate::endpoint::ulnic_ep;
use crate::nic::put;
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
