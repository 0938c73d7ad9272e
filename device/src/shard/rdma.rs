//! The remote-memory operations of the send ring (spec §5.12 to §5.15):
//! RDMA write, read and write-immediate against an aperture named by a
//! cookie, anywhere on the shard, REDIRECT / REDIRECT_END on one's own
//! apertures, and PIO_SYNC, which fires the tripwires of a PIO window
//! named by its grant (spec §6.2). Tripwires fire and redirections land
//! here.
//!
//! An RDMA descriptor is served in three steps: `check` (the initiator's
//! side: the descriptor and its local buffer), `target` (the cookie: the
//! aperture, its permissions and range, and a user buffer's translation in
//! its owner's domain) and `carry` (the bytes move: a write lands, its
//! redirected parts in their user buffers, a read is copied back, an
//! immediate is stored; tripwires fire). Nothing is written before the
//! first two have passed. An access to another node goes through the
//! fabric (`remote`) unless it may take the shortcut (spec §10); one that
//! arrived through the fabric is checked and carried out by `arrive`.
//!
//! Everything here runs under the shard lock, as commands do, so a REVOKE
//! and an access never interleave: an access completes before a revocation
//! or fails after it.

use ulnic_abi::wire::{self, RedirectDesc, RemoteAccess};
use ulnic_abi::{
    op, packet, perm, redirect, send_flags, tx_error, Cookie, EventRecord, RdmaDesc, MAX_RDMA,
    MAX_REDIRECTS, PAGE_SIZE, RDMA_UTLB_REF_OFFSET, SEND_DESC_SIZE,
};
use vm_memory::GuestMemoryMmap;

use crate::fabric::network::Network;
use crate::fabric::transport::{Arrival, ChannelKey};
use crate::memory::guest::{self, Segment};
use crate::nic::aperture::Access;
use crate::nic::endpoint::Endpoint;
use crate::nic::receive::Payload;
use crate::nic::redirect::Redirect;
use crate::nic::utlb::{Utlb, UtlbRef};
use crate::shard::access::{Kind, Request};
use crate::shard::pass::{Initiator, Pass};
use crate::shard::remote::{self, RemoteOps};
use crate::shard::send::Sent;

/// Where an access lands.
struct Target {
    node: u32,
    ep: u32,
    aperture: u32,
    /// The pages of an exported user buffer this access touches (else the
    /// owner's segment).
    buffer: Option<Segment>,
    /// Offset of the access's first byte in that segment.
    offset: u64,
    /// Where aperture offset 0 would be in that segment: for a buffer it
    /// may lie before the touched pages, hence modular; only offsets of
    /// this access are used.
    base: u64,
}

/// Serves one RDMA descriptor of the initiator: carried out here (to its
/// own node, or by the shortcut), or handed to the fabric (`InFabric`, or
/// `Blocked` while its pieces wait for room). The target's owner is woken
/// when a tripwire or a redirection posted an event for it.
pub fn serve(
    pass: &mut Pass<'_>,
    net: Option<&mut Network>,
    ops: &mut RemoteOps,
    from: &mut Initiator<'_>,
    raw: &[u8; SEND_DESC_SIZE as usize],
) -> Result<Sent, u16> {
    let mut req = check(pass.utlb, from, raw)?;
    let tn = req.cookie.node;
    let result = match net.filter(|_| tn != from.node) {
        None => local(pass, from, &req).map(|()| Sent::Done),
        // No such node: nobody could check the cookie.
        Some(_) if tn as usize >= pass.nodes.len() => Err(tx_error::BAD_COOKIE),
        Some(net) => {
            let key = ChannelKey::new(from.node, from.id, tn, 0, req.opcode);
            // A sync's len names a range of the window; it carries no
            // bytes (a write carries them, a read's answer brings them).
            let carried = if req.kind == Kind::Sync { 0 } else { req.len };
            let bytes = packet::ACCESS_HEADER_SIZE + carried as usize;
            if from.ep.pieces.is_none() && net.idle(&key) && net.shortcut(from.node, tn, bytes) {
                net.count_shortcut(from.node);
                local(pass, from, &req).map(|()| Sent::Done)
            } else {
                remote::submit(net, ops, key, from, &mut req)
            }
        }
    };
    if let Some(seg) = req.translated.take() {
        pass.utlb.recycle(seg);
    }
    result
}

/// Carries out a checked access whose target is served by this shard.
fn local(pass: &mut Pass<'_>, from: &mut Initiator<'_>, req: &Request) -> Result<(), u16> {
    if req.kind == Kind::Sync {
        let access = Access {
            aperture: req.cookie.aperture,
            pio: true,
            offset: req.remote_offset,
            len: req.len,
            read: false,
            from: from.writer(),
        };
        return sync(pass, Some(from), &req.cookie, &access);
    }
    target(pass, from, req).and_then(|mut t| {
        let r = carry(pass, from, req, &t);
        if let Some(seg) = t.buffer.take() {
            pass.utlb.recycle(seg);
        }
        r
    })
}

/// Checks and carries out a remote access that arrived through the fabric
/// at its target node (spec §10.4; the transport checked the header's
/// shape): the bytes a read returns, or `None`.
pub fn arrive(pass: &mut Pass<'_>, a: &Arrival<'_>) -> Result<Option<Vec<u8>>, u16> {
    let h: RemoteAccess = wire::read(a.bytes);
    let kind = Kind::of(a.opcode);
    let (tn, len) = (a.dst, u64::from(h.len.get()));
    let cookie = Cookie {
        node: tn,
        aperture: h.cookie_aperture.get(),
        generation: h.cookie_generation.get(),
        key: h.cookie_key.get(),
    };
    let remote_offset = h.offset.get();
    if kind == Kind::Sync {
        let access = Access {
            aperture: cookie.aperture,
            pio: true,
            offset: remote_offset,
            len,
            read: false,
            from: (a.src, a.src_port),
        };
        return sync(pass, None, &cookie, &access).map(|()| None);
    }
    let tmem = pass.mem(tn).ok_or(tx_error::BAD_COOKIE)?;
    let ap = pass
        .nodes
        .get(tn as usize)
        .and_then(|n| n.aperture_for(&cookie))
        .ok_or(tx_error::BAD_COOKIE)?;
    permitted(ap.perms, ap.len, kind, remote_offset, len)?;
    let mut offset = ap.seg_offset + remote_offset;
    let tgt = pass.nodes[tn as usize]
        .endpoint_mut(ap.ep)
        .ok_or(tx_error::BAD_COOKIE)?;
    let buffer = match ap.buffer {
        Some(r) => {
            let touched = touched_pages(r, offset, len);
            offset = touched.offset;
            let tag = (tn, tgt.pd);
            Some(
                pass.utlb
                    .translate(tmem, tag, touched, len, &mut tgt.stats)?,
            )
        }
        None => None,
    };
    let t = Target {
        node: tn,
        ep: ap.ep,
        aperture: cookie.aperture,
        buffer,
        offset,
        base: offset.wrapping_sub(remote_offset),
    };
    let access = Access {
        aperture: t.aperture,
        pio: false,
        offset: remote_offset,
        len,
        read: kind == Kind::Read,
        from: (a.src, a.src_port),
    };
    let data = a
        .bytes
        .get(packet::ACCESS_HEADER_SIZE..)
        .unwrap_or_default();
    let tseg = t.buffer.as_ref().unwrap_or(&tgt.segment);
    let bad = |_| tx_error::BAD_ADDRESS;
    let result = match kind {
        Kind::Immediate => {
            guest::store_segment_word(tmem, tseg, t.offset, h.immediate.get(), len as u32)
                .map_err(bad)
                .map(|()| (None, false))
        }
        Kind::Read => {
            let mut b = vec![0u8; len as usize];
            guest::read_segment(tmem, tseg, t.offset, &mut b)
                .map_err(bad)
                .map(|()| (Some(b), false))
        }
        Kind::Write | Kind::Sync => land(
            pass.utlb,
            tgt,
            tmem,
            &t,
            len,
            &Payload::Bytes(data),
            access.from,
        )
        .map(|posted| (None, posted)),
    };
    let mut t = t;
    if let Some(seg) = t.buffer.take() {
        pass.utlb.recycle(seg);
    }
    let (answer, redirected) = result?;
    let fired = tgt.fire_tripwires(tmem, &access);
    if (fired || redirected) && tgt.take_arm(tmem) {
        pass.wake.push((t.node, t.ep));
    }
    Ok(answer)
}

/// The permission and range checks of an access to an aperture of
/// `perms` and `ap_len` bytes.
fn permitted(perms: u32, ap_len: u64, kind: Kind, offset: u64, len: u64) -> Result<(), u16> {
    let need = if kind == Kind::Read {
        perm::READ
    } else {
        perm::WRITE
    };
    if perms & need == 0 {
        return Err(tx_error::PERMISSION_DENIED);
    }
    if offset.checked_add(len).is_none_or(|end| end > ap_len) {
        return Err(tx_error::OUT_OF_RANGE);
    }
    Ok(())
}

/// The UTLB entries of an exported buffer (`r`) that an access of `len`
/// bytes at `offset` from its start touches.
fn touched_pages(r: UtlbRef, offset: u64, len: u64) -> UtlbRef {
    UtlbRef {
        first: r.first.saturating_add((offset / PAGE_SIZE) as u32),
        count: (offset % PAGE_SIZE + len).div_ceil(PAGE_SIZE) as u32,
        offset: offset % PAGE_SIZE,
    }
}

/// The initiator's side: flags, length, and the local buffer (translated
/// now when named through the UTLB) with the range inside it.
fn check(
    utlb: &mut Utlb,
    from: &mut Initiator<'_>,
    raw: &[u8; SEND_DESC_SIZE as usize],
) -> Result<Request, u16> {
    let d = RdmaDesc::decode(raw);
    let kind = Kind::of(d.opcode);
    let len = u64::from(d.len);
    if d.flags & !(send_flags::COMPLETION | send_flags::UTLB) != 0 {
        return Err(tx_error::BAD_DESCRIPTOR);
    }
    let by_utlb = d.flags & send_flags::UTLB != 0;
    let mut req = Request {
        kind,
        opcode: d.opcode,
        cookie: d.cookie,
        remote_offset: d.remote_offset,
        len,
        local_offset: d.local_offset,
        translated: None,
        immediate: d.immediate,
        user_id: d.user_id,
        completion: d.flags & send_flags::COMPLETION != 0,
    };
    if kind == Kind::Immediate {
        if by_utlb || !(d.len == 4 || d.len == 8) || !d.remote_offset.is_multiple_of(len) {
            return Err(tx_error::BAD_DESCRIPTOR);
        }
        return Ok(req);
    }
    if kind == Kind::Sync {
        // A range of the window, nothing local: no buffer to name, and no
        // bytes move, so no MAX_RDMA bound (the window bounds it).
        if by_utlb || d.len == 0 || d.local_offset != 0 || d.immediate != 0 {
            return Err(tx_error::BAD_DESCRIPTOR);
        }
        return Ok(req);
    }
    if d.len == 0 || d.len > MAX_RDMA {
        return Err(tx_error::BAD_DESCRIPTOR);
    }
    if by_utlb {
        // The offset field is then the offset in the first entry's page.
        let r = UtlbRef::decode(raw, RDMA_UTLB_REF_OFFSET, d.local_offset);
        let tag = from.domain();
        req.translated = Some(utlb.translate(from.mem, tag, r, len, &mut from.ep.stats)?);
    }
    let local = req.translated.as_ref().unwrap_or(&from.ep.segment);
    if !local.contains(d.local_offset, len) {
        if let Some(seg) = req.translated.take() {
            utlb.recycle(seg);
        }
        return Err(tx_error::BAD_ADDRESS);
    }
    Ok(req)
}

/// The cookie's side: a live aperture with the permission, the range
/// inside it, and, for an exported user buffer, the pages this access
/// touches, translated in the owner's domain now.
fn target(pass: &mut Pass<'_>, from: &mut Initiator<'_>, req: &Request) -> Result<Target, u16> {
    let tn = req.cookie.node;
    let tmem = pass.mem(tn).ok_or(tx_error::BAD_COOKIE)?;
    let ap = pass
        .nodes
        .get(tn as usize)
        .and_then(|n| n.aperture_for(&req.cookie))
        .ok_or(tx_error::BAD_COOKIE)?;
    permitted(ap.perms, ap.len, req.kind, req.remote_offset, req.len)?;
    let mut offset = ap.seg_offset + req.remote_offset;
    let buffer = match ap.buffer {
        Some(r) => {
            let owner_pd = if (tn, ap.ep) == (from.node, from.id) {
                Some(from.ep.pd)
            } else {
                pass.nodes[tn as usize].endpoint_mut(ap.ep).map(|o| o.pd)
            };
            let tag = (tn, owner_pd.ok_or(tx_error::BAD_COOKIE)?);
            let touched = touched_pages(r, offset, req.len);
            offset = touched.offset;
            let stats = &mut from.ep.stats;
            Some(pass.utlb.translate(tmem, tag, touched, req.len, stats)?)
        }
        None => None,
    };
    Ok(Target {
        node: tn,
        ep: ap.ep,
        aperture: req.cookie.aperture,
        buffer,
        offset,
        base: offset.wrapping_sub(req.remote_offset),
    })
}

/// Moves the bytes, then fires the target's tripwires and wakes its owner
/// if that posted an event.
fn carry(
    pass: &mut Pass<'_>,
    from: &mut Initiator<'_>,
    req: &Request,
    t: &Target,
) -> Result<(), u16> {
    let access = Access {
        aperture: t.aperture,
        pio: false,
        offset: req.remote_offset,
        len: req.len,
        read: req.kind == Kind::Read,
        from: from.writer(),
    };
    let tmem = pass.mem(t.node).ok_or(tx_error::BAD_COOKIE)?;
    let posted = if (t.node, t.ep) == (from.node, from.id) {
        carry_within(pass.utlb, from, req, t, &access)?
    } else {
        let tgt = pass.nodes[t.node as usize]
            .endpoint_mut(t.ep)
            .ok_or(tx_error::BAD_COOKIE)?;
        let local = req.translated.as_ref().unwrap_or(&from.ep.segment);
        let source = Payload::Segment {
            mem: from.mem,
            seg: local,
            offset: req.local_offset,
        };
        let tseg = t.buffer.as_ref().unwrap_or(&tgt.segment);
        match req.kind {
            Kind::Immediate => store_immediate(tmem, tseg, t, req)?,
            Kind::Read => guest::copy_between(
                tmem,
                tseg,
                t.offset,
                from.mem,
                local,
                req.local_offset,
                req.len,
            )
            .map_err(|_| tx_error::BAD_ADDRESS)?,
            // A sync never gets here (`local` serves it).
            Kind::Write | Kind::Sync => {}
        }
        let redirected = req.kind == Kind::Write
            && land(pass.utlb, tgt, tmem, t, req.len, &source, access.from)?;
        let fired = tgt.fire_tripwires(tmem, &access);
        redirected || fired
    };
    let owner = if (t.node, t.ep) == (from.node, from.id) {
        Some(&mut *from.ep)
    } else {
        pass.nodes[t.node as usize].endpoint_mut(t.ep)
    };
    if posted && owner.is_some_and(|o| o.take_arm(tmem)) {
        pass.wake.push((t.node, t.ep));
    }
    Ok(())
}

/// `carry` when the initiator's own aperture is the target: one segment is
/// both ends, so the bytes are staged first. Whether an event was posted.
fn carry_within(
    utlb: &mut Utlb,
    from: &mut Initiator<'_>,
    req: &Request,
    t: &Target,
    access: &Access,
) -> Result<bool, u16> {
    let bad = |_| tx_error::BAD_ADDRESS;
    let mem = from.mem;
    let tseg = t.buffer.as_ref().unwrap_or(&from.ep.segment);
    let local = req.translated.as_ref().unwrap_or(&from.ep.segment);
    let mut staged = vec![0u8; req.len as usize];
    let redirected = match req.kind {
        Kind::Immediate => {
            store_immediate(mem, tseg, t, req)?;
            false
        }
        Kind::Read => {
            guest::read_segment(mem, tseg, t.offset, &mut staged).map_err(bad)?;
            guest::write_segment(mem, local, req.local_offset, &staged).map_err(bad)?;
            false
        }
        Kind::Sync => false,
        Kind::Write => {
            guest::read_segment(mem, local, req.local_offset, &mut staged).map_err(bad)?;
            let source = Payload::Bytes(&staged);
            land(utlb, from.ep, mem, t, req.len, &source, access.from)?
        }
    };
    Ok(from.ep.fire_tripwires(mem, access) || redirected)
}

/// Stores an immediate's `len` low bytes at the target.
fn store_immediate(
    mem: &GuestMemoryMmap<()>,
    seg: &Segment,
    t: &Target,
    req: &Request,
) -> Result<(), u16> {
    guest::store_segment_word(mem, seg, t.offset, req.immediate, req.len as u32)
        .map_err(|_| tx_error::BAD_ADDRESS)
}

/// Lands a write of `len` bytes from `source` in the target endpoint:
/// straight into the aperture, or the parts its owner redirected into
/// their user buffers (spec §5.15), each redirection that completes
/// reported FULL. Whether a report was posted.
fn land(
    utlb: &mut Utlb,
    tgt: &mut Endpoint,
    mem: &GuestMemoryMmap<()>,
    t: &Target,
    len: u64,
    source: &Payload<'_>,
    writer: (u32, u32),
) -> Result<bool, u16> {
    let bad = |_| tx_error::BAD_ADDRESS;
    if tgt.redirects.is_empty() {
        let seg = t.buffer.as_ref().unwrap_or(&tgt.segment);
        source.copy_into(0, len, mem, seg, t.offset).map_err(bad)?;
        return Ok(false);
    }
    let at = t.offset.wrapping_sub(t.base);
    let done = tgt
        .landing(
            (&mut utlb.cache, &utlb.tables),
            t.node,
            mem,
            t.aperture,
            (t.buffer.as_ref(), t.base),
        )
        .write(at, len, writer, &mut |seg, dst, rel, count| {
            source.copy_into(rel, count, mem, seg, dst).map_err(bad)
        })?;
    let mut posted = false;
    for r in done {
        posted |= tgt.post_event(mem, &r.report(redirect::FULL));
    }
    Ok(posted)
}

/// A PIO_SYNC at the window's node (spec §6.2): the grant (the access's
/// window and the cookie's key, for the initiator's node) and the range
/// checked, then the window's PIO tripwires fired on it and their owner
/// woken if that posted an event. `from` is the initiator when it is
/// served here (the window's owner may be that very endpoint).
fn sync(
    pass: &mut Pass<'_>,
    from: Option<&mut Initiator<'_>>,
    cookie: &Cookie,
    access: &Access,
) -> Result<(), u16> {
    let tn = cookie.node;
    let w = pass
        .nodes
        .get(tn as usize)
        .and_then(|n| n.window_for(cookie, access.from.0))
        .ok_or(tx_error::BAD_COOKIE)?;
    if access
        .offset
        .checked_add(access.len)
        .is_none_or(|end| end > w.len)
    {
        return Err(tx_error::OUT_OF_RANGE);
    }
    let tmem = pass.mem(tn).ok_or(tx_error::BAD_COOKIE)?;
    let owner = match from {
        Some(f) if (f.node, f.id) == (tn, w.ep) => Some(&mut *f.ep),
        _ => pass.nodes[tn as usize].endpoint_mut(w.ep),
    };
    let owner = owner
        .filter(|o| o.session == w.session)
        .ok_or(tx_error::BAD_COOKIE)?;
    if owner.fire_tripwires(tmem, access) && owner.take_arm(tmem) {
        pass.wake.push((tn, w.ep));
    }
    Ok(())
}

fn refused(id: u64, code: u16) -> EventRecord {
    EventRecord {
        kind: ulnic_abi::event::REDIRECTED,
        code: redirect::REFUSED,
        user_id: id,
        aux: u32::from(code),
        ..Default::default()
    }
}

/// Serves a REDIRECT or REDIRECT_END descriptor of the initiator: the event
/// to post for it (none, kind 0, while a redirection starts).
pub fn redirect(
    pass: &mut Pass<'_>,
    from: &mut Initiator<'_>,
    raw: &[u8; SEND_DESC_SIZE as usize],
) -> EventRecord {
    let d: &RedirectDesc = zerocopy::transmute_ref!(raw);
    let (opcode, id) = (d.opcode.get(), d.id.get());
    if opcode == op::REDIRECT_END {
        return match from.ep.redirects.iter().position(|r| r.id == id) {
            Some(i) => {
                let r = from.ep.redirects.swap_remove(i);
                r.report(if r.bytes == 0 {
                    redirect::NONE
                } else {
                    redirect::PARTIAL
                })
            }
            None => EventRecord {
                kind: ulnic_abi::event::TX_ERROR,
                code: tx_error::BAD_DESCRIPTOR,
                user_id: id,
                ..Default::default()
            },
        };
    }
    match check_redirect(pass, from, d) {
        Ok(r) => {
            from.ep.redirects.push(r);
            // Nothing to report until it ends.
            EventRecord::default()
        }
        Err(code) => {
            from.ep.stats.tx_errors += 1;
            refused(id, code)
        }
    }
}

fn check_redirect(
    pass: &mut Pass<'_>,
    from: &mut Initiator<'_>,
    d: &RedirectDesc,
) -> Result<Redirect, u16> {
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
        || from.ep.redirects.iter().any(|r| r.id == id)
    {
        return Err(tx_error::BAD_DESCRIPTOR);
    }
    let ap = pass.nodes[from.node as usize]
        .apertures
        .get(aperture)
        .filter(|a| a.ep == from.id)
        .ok_or(tx_error::BAD_COOKIE)?;
    if offset.checked_add(len).is_none_or(|end| end > ap.len) {
        return Err(tx_error::OUT_OF_RANGE);
    }
    let tag = from.domain();
    let seg = pass
        .utlb
        .translate(from.mem, tag, target, len, &mut from.ep.stats)?;
    pass.utlb.recycle(seg);
    if from.ep.redirects.len() >= MAX_REDIRECTS as usize {
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
