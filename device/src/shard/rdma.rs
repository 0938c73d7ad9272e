//! The remote-memory operations of the send ring (spec §5.12 to §5.15):
//! RDMA write, read and write-immediate against an aperture named by a
//! cookie, anywhere on the shard, and REDIRECT / REDIRECT_END on one's
//! own apertures. Tripwires fire and redirections land here.
//!
//! Everything here runs under the shard lock, as commands do, so a REVOKE
//! and an access never interleave: an access completes before a revocation
//! or fails after it.

use ulnic_abi::wire::RedirectDesc;
use ulnic_abi::{
    event, op, perm, redirect, send_flags, tx_error, EventRecord, RdmaDesc, MAX_RDMA,
    MAX_REDIRECTS, PAGE_SIZE, RDMA_UTLB_REF_OFFSET, SEND_DESC_SIZE,
};
use vm_memory::GuestMemoryMmap;

use crate::memory::guest::{self, MemGuard};
use crate::nic::aperture::Access;
use crate::nic::endpoint::Endpoint;
use crate::nic::node::Node;
use crate::nic::redirect::Redirect;
use crate::nic::utlb::{Utlb, UtlbRef};

/// Carries out one RDMA descriptor of endpoint `e` on node `n` (taken
/// out of its slot as `ep`); the target's owner is woken when a
/// tripwire posted an event for it.
pub fn execute(
    nodes: &mut [Node],
    utlb: &mut Utlb,
    mems: &[Option<MemGuard>],
    (n, e): (u32, u32),
    ep: &mut Endpoint,
    raw: &[u8; SEND_DESC_SIZE as usize],
    wake: &mut Vec<(u32, u32)>,
) -> Result<(), u16> {
    let d = RdmaDesc::decode(raw);
    let imm = d.opcode == op::WRITE_IMMEDIATE;
    let read = d.opcode == op::RDMA_READ;
    let len = u64::from(d.len);
    if d.flags & !(send_flags::COMPLETION | send_flags::UTLB) != 0 {
        return Err(tx_error::BAD_DESCRIPTOR);
    }
    let by_utlb = d.flags & send_flags::UTLB != 0;
    let smem: &GuestMemoryMmap<()> = mems[n as usize].as_deref().ok_or(tx_error::BAD_ADDRESS)?;
    // The local buffer: the segment, or a user buffer named by UTLB
    // entries (its offset field is then the offset in the first page).
    let mut translated = None;
    if imm {
        if by_utlb || !(d.len == 4 || d.len == 8) || !d.remote_offset.is_multiple_of(len) {
            return Err(tx_error::BAD_DESCRIPTOR);
        }
    } else {
        if d.len == 0 || d.len > MAX_RDMA {
            return Err(tx_error::BAD_DESCRIPTOR);
        }
        if by_utlb {
            let r = UtlbRef::decode(raw, RDMA_UTLB_REF_OFFSET, d.local_offset);
            let tag = (n, ep.pd);
            translated = Some(utlb.cache.translate(
                smem,
                utlb.tables.get(tag),
                tag,
                r,
                len,
                &mut ep.stats,
            )?);
        }
        let local = translated.as_ref().unwrap_or(&ep.segment);
        if !local.contains(d.local_offset, len) {
            return Err(tx_error::BAD_ADDRESS);
        }
    }
    let tn = d.cookie.node;
    let tmem: &GuestMemoryMmap<()> = mems
        .get(tn as usize)
        .and_then(|m| m.as_deref())
        .ok_or(tx_error::BAD_COOKIE)?;
    let ap = nodes[tn as usize]
        .aperture_for(&d.cookie)
        .ok_or(tx_error::BAD_COOKIE)?;
    let need = if read { perm::READ } else { perm::WRITE };
    if ap.perms & need == 0 {
        return Err(tx_error::PERMISSION_DENIED);
    }
    if d.remote_offset
        .checked_add(len)
        .is_none_or(|end| end > ap.len)
    {
        return Err(tx_error::OUT_OF_RANGE);
    }
    let mut target_off = ap.seg_offset + d.remote_offset;
    // A user buffer exported through the UTLB: the pages this access
    // touches, translated in the owner's domain now.
    let buffer = match ap.buffer {
        Some(r) => {
            let owner_pd = if (tn, ap.ep) == (n, e) {
                Some(ep.pd)
            } else {
                nodes[tn as usize].endpoint_mut(ap.ep).map(|o| o.pd)
            };
            let tag = (tn, owner_pd.ok_or(tx_error::BAD_COOKIE)?);
            let page = target_off / PAGE_SIZE;
            let touched = UtlbRef {
                first: r.first.saturating_add(page as u32),
                count: (target_off % PAGE_SIZE + len).div_ceil(PAGE_SIZE) as u32,
                offset: target_off % PAGE_SIZE,
            };
            target_off = touched.offset;
            let stats = &mut ep.stats;
            Some(
                utlb.cache
                    .translate(tmem, utlb.tables.get(tag), tag, touched, len, stats)?,
            )
        }
        None => None,
    };
    // Where aperture offset 0 would be in the segment used (for a
    // buffer, relative to the touched pages: it may lie before them,
    // hence modular arithmetic; only offsets of this access are used).
    let ap_base = target_off.wrapping_sub(d.remote_offset);
    let access = Access {
        aperture: d.cookie.aperture,
        offset: d.remote_offset,
        len,
        read,
        from: (n, ep.port.unwrap_or(0)),
    };
    let bad = |_| tx_error::BAD_ADDRESS;
    if (tn, ap.ep) == (n, e) {
        // The initiator's own aperture: one segment is both ends.
        let seg = buffer.as_ref().unwrap_or(&ep.segment);
        let local = translated.as_ref().unwrap_or(seg);
        if imm {
            guest::store_segment_word(smem, seg, target_off, d.immediate, d.len).map_err(bad)?;
        } else {
            let ((from_seg, from), (to_seg, to)) = if read {
                ((seg, target_off), (local, d.local_offset))
            } else {
                ((local, d.local_offset), (seg, target_off))
            };
            let mut staged = vec![0u8; d.len as usize];
            guest::read_segment(smem, from_seg, from, &mut staged).map_err(bad)?;
            if read || ep.redirects.is_empty() {
                guest::write_segment(smem, to_seg, to, &staged).map_err(bad)?;
            } else {
                let done = ep
                    .landing(
                        (&mut utlb.cache, &utlb.tables),
                        n,
                        smem,
                        d.cookie.aperture,
                        (buffer.as_ref(), ap_base),
                    )
                    .write(
                        d.remote_offset,
                        len,
                        access.from,
                        &mut |seg, dst, rel, count| {
                            let bytes = &staged[rel as usize..(rel + count) as usize];
                            guest::write_segment(smem, seg, dst, bytes).map_err(bad)
                        },
                    )?;
                for r in done {
                    ep.post_event(smem, &r.report(redirect::FULL));
                }
            }
        }
        ep.fire_tripwires(smem, &access);
        return Ok(());
    }
    let local = translated.as_ref().unwrap_or(&ep.segment);
    let mut redirected = false;
    let tgt = nodes[tn as usize]
        .endpoint_mut(ap.ep)
        .ok_or(tx_error::BAD_COOKIE)?;
    let tseg = buffer.as_ref().unwrap_or(&tgt.segment);
    if imm {
        guest::store_segment_word(tmem, tseg, target_off, d.immediate, d.len)
    } else if read {
        guest::copy_between(tmem, tseg, target_off, smem, local, d.local_offset, len)
    } else if tgt.redirects.is_empty() {
        guest::copy_between(smem, local, d.local_offset, tmem, tseg, target_off, len)
    } else {
        // Parts the owner redirected go to its user buffers (§5.15).
        let done = tgt
            .landing(
                (&mut utlb.cache, &utlb.tables),
                tn,
                tmem,
                d.cookie.aperture,
                (buffer.as_ref(), ap_base),
            )
            .write(
                d.remote_offset,
                len,
                access.from,
                &mut |seg, dst, rel, count| {
                    guest::copy_between(smem, local, d.local_offset + rel, tmem, seg, dst, count)
                        .map_err(bad)
                },
            )?;
        for r in done {
            redirected |= tgt.post_event(tmem, &r.report(redirect::FULL));
        }
        Ok(())
    }
    .map_err(bad)?;
    let fired = tgt.fire_tripwires(tmem, &access);
    if (fired || redirected) && tgt.take_arm(tmem) {
        wake.push((tn, ap.ep));
    }
    if let Some(seg) = translated {
        utlb.cache.recycle(seg);
    }
    Ok(())
}

fn refused(id: u64, code: u16) -> EventRecord {
    EventRecord {
        kind: event::REDIRECTED,
        code: redirect::REFUSED,
        user_id: id,
        aux: u32::from(code),
        ..Default::default()
    }
}

/// Serves a REDIRECT or REDIRECT_END descriptor of endpoint `e` on node
/// `n`: the event to post for it.
pub fn redirect(
    nodes: &mut [Node],
    utlb: &mut Utlb,
    mems: &[Option<MemGuard>],
    n: u32,
    e: u32,
    ep: &mut Endpoint,
    raw: &[u8; SEND_DESC_SIZE as usize],
) -> EventRecord {
    let d: &RedirectDesc = zerocopy::transmute_ref!(raw);
    let (opcode, id) = (d.opcode.get(), d.id.get());
    if opcode == op::REDIRECT_END {
        return match ep.redirects.iter().position(|r| r.id == id) {
            Some(i) => {
                let r = ep.redirects.swap_remove(i);
                r.report(if r.bytes == 0 {
                    redirect::NONE
                } else {
                    redirect::PARTIAL
                })
            }
            None => EventRecord {
                kind: event::TX_ERROR,
                code: tx_error::BAD_DESCRIPTOR,
                user_id: id,
                ..Default::default()
            },
        };
    }
    match check_redirect(nodes, utlb, mems, n, e, ep, raw) {
        Ok(r) => {
            ep.redirects.push(r);
            // Nothing to report until it ends.
            EventRecord::default()
        }
        Err(code) => {
            ep.stats.tx_errors += 1;
            refused(id, code)
        }
    }
}

fn check_redirect(
    nodes: &mut [Node],
    utlb: &mut Utlb,
    mems: &[Option<MemGuard>],
    n: u32,
    e: u32,
    ep: &mut Endpoint,
    raw: &[u8; SEND_DESC_SIZE as usize],
) -> Result<Redirect, u16> {
    let d: &RedirectDesc = zerocopy::transmute_ref!(raw);
    let flags = d.flags.get();
    let len = u64::from(d.len.get());
    let (aperture, id, offset) = (d.aperture.get(), d.id.get(), d.offset.get());
    let target = UtlbRef {
        first: d.utlb_first.get(),
        count: d.utlb_count.get(),
        offset: d.page_offset.get(),
    };
    if flags & send_flags::UTLB == 0
        || flags & !(send_flags::UTLB | send_flags::COMPLETION) != 0
        || len == 0
        || len > u64::from(MAX_RDMA)
        || ep.redirects.iter().any(|r| r.id == id)
    {
        return Err(tx_error::BAD_DESCRIPTOR);
    }
    let ap = nodes[n as usize]
        .apertures
        .get(aperture)
        .filter(|a| a.ep == e)
        .ok_or(tx_error::BAD_COOKIE)?;
    if offset.checked_add(len).is_none_or(|end| end > ap.len) {
        return Err(tx_error::OUT_OF_RANGE);
    }
    let mem: &GuestMemoryMmap<()> = mems[n as usize].as_deref().ok_or(tx_error::BAD_ADDRESS)?;
    let tag = (n, ep.pd);
    let seg = utlb
        .cache
        .translate(mem, utlb.tables.get(tag), tag, target, len, &mut ep.stats)?;
    utlb.cache.recycle(seg);
    if ep.redirects.len() >= MAX_REDIRECTS as usize {
        return Err(tx_error::TOO_MANY_REDIRECTS);
    }
    Ok(Redirect {
        id,
        aperture,
        offset,
        len,
        target,
        start: 0,
        bytes: 0,
        writer: (0, 0),
    })
}
