//! Remote memory state (spec §5.12, §5.13): apertures exported from an
//! endpoint's segment or a UTLB-named user buffer and named by cookies,
//! and the tripwires set on them. The operations that use them (RDMA,
//! redirection) live in `shard::rdma`.

use ulnic_abi::{Cookie, MAX_APERTURES};

use crate::nic::utlb::UtlbRef;

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

/// A PIO window as its node's NIC sees it (spec §6.2): what checks a
/// PIO_SYNC's grant and a PIO tripwire's owner. `pio::Pio` adds it when
/// the window is exported and removes it when it is revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRef {
    /// The exporting endpoint and its session (an id reused later is
    /// another endpoint).
    pub ep: u32,
    pub session: u32,
    /// The grant's key.
    pub key: u64,
    /// Its bytes.
    pub len: u64,
    /// The node allowed to import and sync it, or `ANY`.
    pub importer: u32,
}

/// A tripwire set by an endpoint on one of its apertures, or with flag
/// PIO on one of its PIO windows.
#[derive(Debug, Clone, Copy)]
pub struct Tripwire {
    /// Aperture id (on the endpoint's node), or window id with flag PIO.
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

    /// Forgets everything (the node was reset); generations are kept, so
    /// cookies from before stay dead.
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
    }
}

/// What a matching access did, for the tripwire event.
#[derive(Debug, Clone, Copy)]
pub struct Access {
    /// The aperture accessed, or the PIO window synced.
    pub aperture: u32,
    /// A PIO_SYNC of a window (it matches only PIO tripwires).
    pub pio: bool,
    /// Range inside it.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// A read (else a write).
    pub read: bool,
    /// The initiator's node and port.
    pub from: (u32, u32),
}
