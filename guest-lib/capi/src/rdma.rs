//! Remote memory: apertures and cookies, RDMA write, read and immediate,
//! tripwires, and transfer redirection (spec §5.12-5.15).

use ulnic::{Cookie, Immediate, Permissions, TripwireOn};

use crate::endpoint::{timeout_arg, translation_code, ulnic_ep, ULNIC_COMPLETION};
use crate::nic::{put, ulnic_buffer};
use crate::status::{guard, handle, invalid};

/// An aperture's cookie: the capability to access it, from any node.
/// Plain data: send it to whoever should have access.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ulnic_cookie {
    /// The node of the exporting endpoint.
    pub node: u32,
    /// The aperture on that node.
    pub aperture: u32,
    /// How often the aperture's slot was reused.
    pub generation: u32,
    /// Zero.
    pub reserved: u32,
    /// 64 random bits.
    pub key: u64,
}

impl From<Cookie> for ulnic_cookie {
    fn from(c: Cookie) -> Self {
        ulnic_cookie {
            node: c.node,
            aperture: c.aperture,
            generation: c.generation,
            reserved: 0,
            key: c.key,
        }
    }
}

impl From<ulnic_cookie> for Cookie {
    fn from(c: ulnic_cookie) -> Self {
        Cookie {
            node: c.node,
            aperture: c.aperture,
            generation: c.generation,
            key: c.key,
        }
    }
}

/// Remote nodes may read the aperture.
pub const ULNIC_PERM_READ: u32 = 1;
/// Remote nodes may write the aperture.
pub const ULNIC_PERM_WRITE: u32 = 2;

/// A tripwire fires on remote writes.
pub const ULNIC_TRIPWIRE_WRITES: u32 = 1;
/// A tripwire fires on remote reads.
pub const ULNIC_TRIPWIRE_READS: u32 = 2;
/// A tripwire fires on every matching access, not once.
pub const ULNIC_TRIPWIRE_PERSISTENT: u32 = 4;

fn perms(bits: u32) -> Option<Permissions> {
    match bits {
        ULNIC_PERM_READ => Some(Permissions::READ),
        ULNIC_PERM_WRITE => Some(Permissions::WRITE),
        3 => Some(Permissions::READ_WRITE),
        _ => None,
    }
}

fn cookie_arg(c: *const ulnic_cookie) -> Option<Cookie> {
    // SAFETY: NULL or a cookie the caller holds.
    unsafe { c.as_ref() }.map(|c| (*c).into())
}

/// Exports `len` bytes at `offset` of the endpoint's segment (8-byte
/// aligned) with `perms` (`ULNIC_PERM_*`): `*cookie` is the capability.
///
/// ```c
/// struct ulnic_cookie c;
/// int err = ulnic_ep_export(ep, 0, 65536, ULNIC_PERM_READ | ULNIC_PERM_WRITE, &c);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_export(
    ep: *mut ulnic_ep,
    offset: u64,
    len: u64,
    perms_bits: u32,
    cookie: *mut ulnic_cookie,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_export");
    let (Some(p), false) = (perms(perms_bits), cookie.is_null()) else {
        return invalid("ulnic_ep_export", "unknown permissions, or cookie is NULL");
    };
    guard("ulnic_ep_export", || {
        put(cookie, e.ep.export(offset, len, p)?.into());
        Ok(0)
    })
}

/// Exports `len` bytes at `offset` of a user buffer of the endpoint's
/// domain (which has a UTLB). The buffer must stay allocated until the
/// export is revoked.
///
/// ```c
/// ulnic_ep_export_buffer(ep, buf, 0, ulnic_buffer_len(buf), ULNIC_PERM_WRITE, &c);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_export_buffer(
    ep: *mut ulnic_ep,
    buf: *mut ulnic_buffer,
    offset: usize,
    len: usize,
    perms_bits: u32,
    cookie: *mut ulnic_cookie,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_export_buffer");
    let b = handle!(buf, "ulnic_ep_export_buffer");
    let (Some(p), Some(end), false) =
        (perms(perms_bits), offset.checked_add(len), cookie.is_null())
    else {
        return invalid(
            "ulnic_ep_export_buffer",
            "unknown permissions, a range that overflows, or cookie is NULL",
        );
    };
    guard("ulnic_ep_export_buffer", || {
        // SAFETY: the header makes the caller keep `buf` until the revoke.
        let c = unsafe { e.ep.export_buffer(&b.buf, offset..end, p) }?;
        put(cookie, c.into());
        Ok(0)
    })
}

/// Revokes one of this endpoint's exports: no access through the cookie
/// completes after this returns.
///
/// ```c
/// ulnic_ep_revoke(ep, &c);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_revoke(ep: *mut ulnic_ep, cookie: *const ulnic_cookie) -> i32 {
    let e = handle!(ep, "ulnic_ep_revoke");
    let Some(c) = cookie_arg(cookie) else {
        return invalid("ulnic_ep_revoke", "cookie is NULL");
    };
    guard("ulnic_ep_revoke", || e.ep.revoke(&c).map(|_| 0))
}

/// RDMA-writes `len` bytes at `local` in this endpoint's segment to
/// `remote` in the aperture `cookie` names (one-sided; the target is not
/// told unless a tripwire matches). Writes from one endpoint arrive in
/// the order posted. `-EAGAIN` when the send ring is full.
///
/// ```c
/// ulnic_ep_rdma_write(ep, &c, 0, 4096, 65536, 9, ULNIC_COMPLETION);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_rdma_write(
    ep: *mut ulnic_ep,
    cookie: *const ulnic_cookie,
    remote: u64,
    local: u64,
    len: u32,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_rdma_write");
    let Some(c) = cookie_arg(cookie) else {
        return invalid("ulnic_ep_rdma_write", "cookie is NULL");
    };
    guard("ulnic_ep_rdma_write", || {
        e.ep.rdma_write(&c, remote, local, len, id, flags & ULNIC_COMPLETION != 0)
            .map(|_| 0)
    })
}

/// RDMA-reads `len` bytes at `remote` of the aperture into `local` of this
/// endpoint's segment; the data is there once the read completes
/// (`ULNIC_EVENT_SEND_DONE` with `ULNIC_COMPLETION`).
///
/// ```c
/// ulnic_ep_rdma_read(ep, &c, 0, 0, 4096, 10, ULNIC_COMPLETION);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_rdma_read(
    ep: *mut ulnic_ep,
    cookie: *const ulnic_cookie,
    remote: u64,
    local: u64,
    len: u32,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_rdma_read");
    let Some(c) = cookie_arg(cookie) else {
        return invalid("ulnic_ep_rdma_read", "cookie is NULL");
    };
    guard("ulnic_ep_rdma_read", || {
        e.ep.rdma_read(&c, remote, local, len, id, flags & ULNIC_COMPLETION != 0)
            .map(|_| 0)
    })
}

/// RDMA-writes `len` bytes at `offset` of a user buffer (UTLB) to
/// `remote` in the aperture; returns how it was translated, as
/// `ulnic_ep_post_send_buffer`.
///
/// ```c
/// ulnic_ep_rdma_write_buffer(ep, &c, 0, buf, 0, 65536, 11, 0);
/// ```
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ulnic_ep_rdma_write_buffer(
    ep: *mut ulnic_ep,
    cookie: *const ulnic_cookie,
    remote: u64,
    buf: *mut ulnic_buffer,
    offset: usize,
    len: usize,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_rdma_write_buffer");
    let b = handle!(buf, "ulnic_ep_rdma_write_buffer");
    let (Some(c), Some(end)) = (cookie_arg(cookie), offset.checked_add(len)) else {
        return invalid(
            "ulnic_ep_rdma_write_buffer",
            "cookie is NULL or the range overflows",
        );
    };
    guard("ulnic_ep_rdma_write_buffer", || {
        e.ep.rdma_write_buffer(
            &c,
            remote,
            &b.buf,
            offset..end,
            id,
            flags & ULNIC_COMPLETION != 0,
        )
        .map(translation_code)
    })
}

/// RDMA-reads `len` bytes at `remote` into `offset` of a user buffer
/// (UTLB). Leave that range alone and keep the buffer until the read
/// completes.
///
/// ```c
/// ulnic_ep_rdma_read_buffer(ep, &c, 0, buf, 0, 65536, 12, ULNIC_COMPLETION);
/// ```
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ulnic_ep_rdma_read_buffer(
    ep: *mut ulnic_ep,
    cookie: *const ulnic_cookie,
    remote: u64,
    buf: *mut ulnic_buffer,
    offset: usize,
    len: usize,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_rdma_read_buffer");
    let b = handle!(buf, "ulnic_ep_rdma_read_buffer");
    let (Some(c), Some(end)) = (cookie_arg(cookie), offset.checked_add(len)) else {
        return invalid(
            "ulnic_ep_rdma_read_buffer",
            "cookie is NULL or the range overflows",
        );
    };
    guard("ulnic_ep_rdma_read_buffer", || {
        // SAFETY: the header makes the caller leave the range alone until
        // the read completes.
        unsafe {
            e.ep.rdma_read_buffer(
                &c,
                remote,
                &b.buf,
                offset..end,
                id,
                flags & ULNIC_COMPLETION != 0,
            )
        }
        .map(translation_code)
    })
}

/// Stores `size` (4 or 8) bytes of `value` at `remote` (aligned to `size`)
/// in the aperture with one aligned store; never overtakes an RDMA write
/// posted before it.
///
/// ```c
/// ulnic_ep_write_immediate(ep, &c, 0, 42, 8, 13, 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_write_immediate(
    ep: *mut ulnic_ep,
    cookie: *const ulnic_cookie,
    remote: u64,
    value: u64,
    size: u32,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_write_immediate");
    let Some(c) = cookie_arg(cookie) else {
        return invalid("ulnic_ep_write_immediate", "cookie is NULL");
    };
    let v = match size {
        4 => Immediate::U32(value as u32),
        8 => Immediate::U64(value),
        _ => return invalid("ulnic_ep_write_immediate", "size must be 4 or 8"),
    };
    guard("ulnic_ep_write_immediate", || {
        e.ep.write_immediate(&c, remote, v, id, flags & ULNIC_COMPLETION != 0)
            .map(|_| 0)
    })
}

/// Sets a tripwire on `len` bytes at `offset` of one of this endpoint's
/// apertures (`cookie`): `flags` are `ULNIC_TRIPWIRE_*`; a firing posts
/// `ULNIC_EVENT_TRIPWIRE` with `user` and wakes a waiter. `*id` names it.
///
/// ```c
/// uint32_t tw;
/// ulnic_ep_set_tripwire(ep, &c, 0, 8, ULNIC_TRIPWIRE_WRITES, 77, &tw);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_set_tripwire(
    ep: *mut ulnic_ep,
    cookie: *const ulnic_cookie,
    offset: u64,
    len: u64,
    flags: u32,
    user: u64,
    id: *mut u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_set_tripwire");
    let on = match flags & (ULNIC_TRIPWIRE_WRITES | ULNIC_TRIPWIRE_READS) {
        ULNIC_TRIPWIRE_WRITES => TripwireOn::Writes,
        ULNIC_TRIPWIRE_READS => TripwireOn::Reads,
        3 => TripwireOn::Both,
        _ => {
            return invalid(
                "ulnic_ep_set_tripwire",
                "flags name neither writes nor reads",
            )
        }
    };
    let known = ULNIC_TRIPWIRE_WRITES | ULNIC_TRIPWIRE_READS | ULNIC_TRIPWIRE_PERSISTENT;
    let (Some(c), true, false) = (cookie_arg(cookie), flags & !known == 0, id.is_null()) else {
        return invalid(
            "ulnic_ep_set_tripwire",
            "cookie or id is NULL, or unknown flags",
        );
    };
    let persistent = flags & ULNIC_TRIPWIRE_PERSISTENT != 0;
    guard("ulnic_ep_set_tripwire", || {
        put(
            id,
            e.ep.set_tripwire(&c, offset, len, on, persistent, user)?,
        );
        Ok(0)
    })
}

/// Clears tripwire `id`.
///
/// ```c
/// ulnic_ep_clear_tripwire(ep, tw);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_clear_tripwire(ep: *mut ulnic_ep, id: u32) -> i32 {
    let e = handle!(ep, "ulnic_ep_clear_tripwire");
    guard("ulnic_ep_clear_tripwire", || {
        e.ep.clear_tripwire(id).map(|_| 0)
    })
}

/// Whether tripwire `id` fired since last asked (1 or 0), clearing its
/// fired flag: a look in shared memory, no call to the device.
///
/// ```c
/// if (ulnic_ep_take_tripwire_fired(ep, tw)) ;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_take_tripwire_fired(ep: *mut ulnic_ep, id: u32) -> i32 {
    let e = handle!(ep, "ulnic_ep_take_tripwire_fired");
    i32::from(e.ep.take_tripwire_fired(id))
}

/// Whether `offset` names an aligned 64-bit word inside the segment.
fn word_of_segment(ep: &ulnic::Endpoint, offset: u64) -> bool {
    offset.is_multiple_of(8) && offset.saturating_add(8) <= ep.segment_len() as u64
}

/// Reads the aligned 64-bit word at `offset` of the segment as the device
/// last stored it (for values remote writes change).
///
/// ```c
/// uint64_t v = ulnic_ep_read_u64(ep, 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_read_u64(ep: *const ulnic_ep, offset: u64) -> u64 {
    // SAFETY: a live handle or NULL.
    let Some(e) = (unsafe { ep.as_ref() }) else {
        return 0;
    };
    if !word_of_segment(&e.ep, offset) {
        return 0;
    }
    e.ep.read_u64(offset)
}

/// CLAN's "check, arm, re-check, block": waits until tripwire `id` fires
/// or the word at `offset` of the segment is no longer `unchanged`, or
/// `timeout_ms` passes (-1: forever). 1 when it fired or changed, 0 on
/// timeout, -ECONNRESET when a close message waits in the endpoint's
/// receive queue (the peer went away; the message stays queued).
///
/// ```c
/// uint64_t seen = ulnic_ep_read_u64(ep, 0);
/// if (ulnic_ep_wait_tripwire(ep, tw, 0, seen, 1000) == 1) ;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_wait_tripwire(
    ep: *mut ulnic_ep,
    id: u32,
    offset: u64,
    unchanged: u64,
    timeout_ms: i32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_wait_tripwire");
    if !word_of_segment(&e.ep, offset) {
        return invalid(
            "ulnic_ep_wait_tripwire",
            "offset is not an aligned word of the segment",
        );
    }
    let t = timeout_arg(timeout_ms);
    guard("ulnic_ep_wait_tripwire", || {
        e.ep.wait_tripwire(id, offset, unchanged, t).map(i32::from)
    })
}

/// Redirects `len` bytes at `offset` of this endpoint's aperture
/// `aperture` into `offset`..`offset + len` of a user buffer (VMMC-2):
/// RDMA writes landing there after the device takes this go straight to
/// the buffer; `ULNIC_EVENT_REDIRECTED` with `id` says what was. Leave the
/// range alone and keep the buffer until then.
///
/// ```c
/// ulnic_ep_post_redirect(ep, &default_cookie, 4096, buf, 0, 65536, 7);
/// ```
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ulnic_ep_post_redirect(
    ep: *mut ulnic_ep,
    aperture: *const ulnic_cookie,
    aperture_offset: u64,
    buf: *mut ulnic_buffer,
    offset: usize,
    len: usize,
    id: u64,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_post_redirect");
    let b = handle!(buf, "ulnic_ep_post_redirect");
    let (Some(c), Some(end)) = (cookie_arg(aperture), offset.checked_add(len)) else {
        return invalid(
            "ulnic_ep_post_redirect",
            "aperture is NULL or the range overflows",
        );
    };
    guard("ulnic_ep_post_redirect", || {
        // SAFETY: the header makes the caller leave the range alone until
        // the REDIRECTED event.
        unsafe {
            e.ep.post_redirect(&c, aperture_offset, &b.buf, offset..end, id)
        }
        .map(|_| 0)
    })
}

/// Ends redirection `id`; the device reports what was redirected.
///
/// ```c
/// ulnic_ep_end_redirect(ep, 7);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_end_redirect(ep: *mut ulnic_ep, id: u64) -> i32 {
    let e = handle!(ep, "ulnic_ep_end_redirect");
    guard("ulnic_ep_end_redirect", || e.ep.end_redirect(id).map(|_| 0))
}
