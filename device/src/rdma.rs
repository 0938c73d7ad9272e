//! Remote memory (spec §5.12, §5.13): apertures exported from an endpoint's
//! segment and named by cookies, RDMA write, read and write-immediate
//! against them, and tripwires that fire on remote access.
//!
//! Everything here runs under the fabric lock, as commands do, so a REVOKE
//! and an access never interleave: an access completes before a revocation
//! or fails after it.

use ulnic_abi::{
    ctrl, event, op, perm, redirect, send_flags, tripwire_flags, tx_error, Cookie, Event, RdmaDesc,
    MAX_APERTURES, MAX_RDMA, PAGE_SIZE, RDMA_UTLB_REF_OFFSET, SEND_DESC_SIZE,
};
use vm_memory::GuestMemoryMmap;

use crate::redirect::Landing;
use crate::utlb::UtlbRef;

use crate::endpoint::Endpoint;
use crate::fabric::{Fabric, Node};
use crate::guest::{self, MemGuard};

/// An exported range of one endpoint's segment.
#[derive(Debug, Clone, Copy)]
pub struct Aperture {
    /// The exporting endpoint (on this node).
    pub ep: u32,
    /// Where the aperture starts in that endpoint's segment.
    pub seg_offset: u64,
    /// Its length.
    pub len: u64,
    /// `perm::*`.
    pub perms: u32,
    /// Reuse count of the slot, part of the cookie.
    pub generation: u32,
    /// The cookie's random key.
    pub key: u64,
    /// A user buffer's UTLB entries, when the aperture is one (spec
    /// §5.12); `seg_offset` is then the offset into the translated pages.
    pub buffer: Option<UtlbRef>,
}

/// A tripwire set by an endpoint on one of its apertures.
#[derive(Debug, Clone, Copy)]
pub struct Tripwire {
    /// Aperture id (on the endpoint's node).
    pub aperture: u32,
    /// Range inside the aperture.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// `tripwire_flags::*`.
    pub flags: u32,
    /// The user's cookie, returned in the event.
    pub user: u64,
    /// False once a one-shot tripwire fired.
    pub active: bool,
}

/// The per-node aperture table: slot id -> aperture, with each slot's
/// generation kept across reuse.
#[derive(Debug, Default)]
pub struct ApertureTable {
    slots: Vec<Option<Aperture>>,
    generations: Vec<u32>,
}

impl ApertureTable {
    /// Live apertures.
    pub fn live(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// A live aperture by id.
    pub fn get(&self, id: u32) -> Option<&Aperture> {
        self.slots.get(id as usize).and_then(|a| a.as_ref())
    }

    /// Exports `[seg_offset, +len)` of endpoint `ep` (checked by the
    /// caller); None when the endpoint has `MAX_APERTURES` already.
    pub fn export(
        &mut self,
        ep: u32,
        seg_offset: u64,
        len: u64,
        perms: u32,
        buffer: Option<UtlbRef>,
    ) -> Option<Cookie> {
        let owned = self.slots.iter().flatten().filter(|a| a.ep == ep).count();
        if owned >= MAX_APERTURES as usize {
            return None;
        }
        let id = match self.slots.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.generations.push(0);
                self.slots.len() - 1
            }
        };
        self.generations[id] = self.generations[id].wrapping_add(1);
        let key = rand::RngCore::next_u64(&mut rand::rngs::OsRng);
        let a = Aperture {
            ep,
            seg_offset,
            len,
            perms,
            generation: self.generations[id],
            key,
            buffer,
        };
        self.slots[id] = Some(a);
        Some(Cookie {
            node: 0, // filled in by the caller, which knows the node
            aperture: id as u32,
            generation: a.generation,
            key,
        })
    }

    /// Revokes aperture `id` of endpoint `ep`; false if it has no such one.
    pub fn revoke(&mut self, ep: u32, id: u32) -> bool {
        match self.slots.get_mut(id as usize) {
            Some(slot) if slot.is_some_and(|a| a.ep == ep) => {
                *slot = None;
                true
            }
            _ => false,
        }
    }

    /// Revokes every aperture of endpoint `ep` (it is being destroyed).
    pub fn revoke_all(&mut self, ep: u32) {
        for slot in &mut self.slots {
            if slot.is_some_and(|a| a.ep == ep) {
                *slot = None;
            }
        }
    }

    /// Forgets everything (the port was reset); generations are kept, so
    /// cookies from before stay dead.
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
    }
}

/// What a matching access did, for the tripwire event.
#[derive(Debug, Clone, Copy)]
pub struct Access {
    /// The aperture accessed.
    pub aperture: u32,
    /// Range inside it.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// A read (else a write).
    pub read: bool,
    /// The initiator's node and port.
    pub from: (u32, u32),
}

impl Endpoint {
    /// Sets a tripwire; None when the endpoint has `cap` already.
    pub fn set_tripwire(&mut self, t: Tripwire, cap: u32) -> Option<u32> {
        let id = match self.tripwires.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None if (self.tripwires.len() as u32) < cap => {
                self.tripwires.push(None);
                self.tripwires.len() - 1
            }
            None => return None,
        };
        self.tripwires[id] = Some(t);
        Some(id as u32)
    }

    /// Fires every active tripwire `access` matches: sets its fired byte,
    /// posts its event if the byte was clear. True when an event was posted.
    pub fn fire_tripwires(&mut self, mem: &GuestMemoryMmap<()>, access: &Access) -> bool {
        let want = if access.read {
            tripwire_flags::READ
        } else {
            tripwire_flags::WRITE
        };
        let mut fired = Vec::new();
        for (id, slot) in self.tripwires.iter_mut().enumerate() {
            let Some(t) = slot.as_mut() else { continue };
            if !t.active || t.aperture != access.aperture || t.flags & want == 0 {
                continue;
            }
            let start = access.offset.max(t.offset);
            let end = (access.offset + access.len).min(t.offset + t.len);
            if start >= end {
                continue;
            }
            if t.flags & tripwire_flags::PERSISTENT == 0 {
                t.active = false;
            }
            fired.push((id as u32, t.user, end - start));
        }
        if fired.is_empty() {
            return false;
        }
        // Dekker with the owner's "clear the flag, fence, read the data": the
        // access's stores must be visible before its flags are read, or the
        // owner can read old data after clearing while the device reads the
        // old flag (set) and posts nothing: a lost wake-up.
        guest::full_fence();
        let mut posted = false;
        for (id, user, bytes) in fired {
            self.stats.tripwires_fired += 1;
            let flag = self.ctrl + ctrl::TRIPWIRE_FIRED + u64::from(id);
            let mut was = [0u8];
            // A driver that unmapped its control block loses the event, not
            // the device its footing.
            if guest::read(mem, flag, &mut was).is_err() {
                continue;
            }
            // Set only a clear flag: re-writing 1 over a flag just read as 1
            // could land after the owner's clear and leave it set with no
            // event behind it, so no later firing would post one.
            if was[0] != 0 || guest::write(mem, flag, &[1]).is_err() {
                continue;
            }
            posted |= self.post_event(
                mem,
                &Event {
                    kind: event::TRIPWIRE,
                    code: u16::from(access.read),
                    user_id: user,
                    node: access.from.0,
                    port: access.from.1,
                    len: bytes.min(u64::from(u32::MAX)) as u32,
                    aux: id,
                },
            );
        }
        posted
    }
}

impl Node {
    /// The aperture a cookie names on this node, if the cookie is right.
    fn aperture_for(&self, c: &Cookie) -> Option<Aperture> {
        let a = *self.apertures.get(c.aperture)?;
        (a.generation == c.generation && a.key == c.key).then_some(a)
    }
}

impl Fabric {
    /// Carries out one RDMA descriptor of endpoint `e` on node `n` (taken
    /// out of its slot as `ep`); the target's owner is woken when a
    /// tripwire posted an event for it.
    pub(crate) fn rdma(
        &mut self,
        mems: &[Option<MemGuard>],
        n: u32,
        e: u32,
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
        let smem: &GuestMemoryMmap<()> =
            mems[n as usize].as_deref().ok_or(tx_error::BAD_ADDRESS)?;
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
                translated = Some(self.utlb_cache.translate(
                    smem,
                    self.utlb_tables.get(tag),
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
        let ap = self.nodes[tn as usize]
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
                    self.nodes[tn as usize].endpoint_mut(ap.ep).map(|o| o.pd)
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
                Some(self.utlb_cache.translate(
                    tmem,
                    self.utlb_tables.get(tag),
                    tag,
                    touched,
                    len,
                    stats,
                )?)
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
                guest::store_segment_word(smem, seg, target_off, d.immediate, d.len)
                    .map_err(bad)?;
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
                    let done = Landing::new(
                        &mut self.utlb_cache,
                        &self.utlb_tables,
                        n,
                        ep,
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
        let tgt = self.nodes[tn as usize]
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
            let done = Landing::new(
                &mut self.utlb_cache,
                &self.utlb_tables,
                tn,
                tgt,
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
            self.utlb_cache.recycle(seg);
        }
        Ok(())
    }
}
