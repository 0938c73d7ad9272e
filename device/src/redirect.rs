//! Transfer redirection (VMMC-2 §3, spec §5.15): the owner of an aperture
//! (the default receive buffer) redirects part of it into a user buffer
//! named through the UTLB; writes arriving there afterwards land in the
//! user buffer. The device orders posts and arrivals under its fabric
//! lock and reports exactly which part was redirected.

use ulnic_abi::{event, op, redirect, send_flags, tx_error, Event, MAX_RDMA, MAX_REDIRECTS};
use ulnic_abi::{RDMA_UTLB_REF_OFFSET, SEND_DESC_SIZE};
use vm_memory::GuestMemoryMmap;

use crate::endpoint::{Endpoint, Stats};
use crate::fabric::Fabric;
use crate::guest::{MemGuard, Segment};
use crate::utlb::{Tables, TranslationCache, UtlbRef};

/// An active redirection of part of an aperture.
#[derive(Debug, Clone)]
pub struct Redirect {
    /// The owner's id for it.
    pub id: u64,
    /// Aperture it covers part of.
    pub aperture: u32,
    /// Start of the covered part in the aperture.
    pub offset: u64,
    /// Length of the covered part.
    pub len: u64,
    /// The user buffer, in the owner's UTLB.
    pub target: UtlbRef,
    /// The redirected part so far: `[start, start + bytes)` from `offset`.
    pub start: u64,
    pub bytes: u64,
    /// Who wrote the last redirected bytes (node, port).
    pub writer: (u32, u32),
}

impl Redirect {
    /// The event that ends it.
    pub fn report(&self, outcome: u16) -> Event {
        Event {
            kind: event::REDIRECTED,
            code: outcome,
            user_id: self.id,
            node: self.writer.0,
            port: self.writer.1,
            len: self.bytes as u32,
            aux: self.start as u32,
        }
    }

    fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Whether aperture offset `at` may be redirected now: it extends the
    /// redirected part (or starts it).
    fn accepts(&self, at: u64) -> bool {
        (self.offset..self.end()).contains(&at)
            && (self.bytes == 0 || at - self.offset == self.start + self.bytes)
    }
}

fn refused(id: u64, code: u16) -> Event {
    Event {
        kind: event::REDIRECTED,
        code: redirect::REFUSED,
        user_id: id,
        aux: u32::from(code),
        ..Default::default()
    }
}

impl Fabric {
    /// Serves a REDIRECT or REDIRECT_END descriptor of endpoint `e` on node
    /// `n`: the event to post for it.
    pub(crate) fn redirect_op(
        &mut self,
        mems: &[Option<MemGuard>],
        n: u32,
        e: u32,
        ep: &mut Endpoint,
        raw: &[u8; SEND_DESC_SIZE as usize],
    ) -> Event {
        let opcode = u16::from_le_bytes([raw[0], raw[1]]);
        let id = ulnic_abi::read_le64(raw, 24);
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
                None => Event {
                    kind: event::TX_ERROR,
                    code: tx_error::BAD_DESCRIPTOR,
                    user_id: id,
                    ..Default::default()
                },
            };
        }
        match self.check_redirect(mems, n, e, ep, raw) {
            Ok(r) => {
                ep.redirects.push(r);
                // Nothing to report until it ends.
                Event::default()
            }
            Err(code) => {
                ep.stats.tx_errors += 1;
                refused(id, code)
            }
        }
    }

    fn check_redirect(
        &mut self,
        mems: &[Option<MemGuard>],
        n: u32,
        e: u32,
        ep: &mut Endpoint,
        raw: &[u8; SEND_DESC_SIZE as usize],
    ) -> Result<Redirect, u16> {
        let flags = u16::from_le_bytes([raw[2], raw[3]]);
        let len = u64::from(ulnic_abi::read_le32(raw, 4));
        let aperture = ulnic_abi::read_le32(raw, 8);
        let id = ulnic_abi::read_le64(raw, 24);
        let offset = ulnic_abi::read_le64(raw, 40);
        let target = UtlbRef::decode(raw, RDMA_UTLB_REF_OFFSET, ulnic_abi::read_le64(raw, 48));
        if flags & send_flags::UTLB == 0
            || flags & !(send_flags::UTLB | send_flags::COMPLETION) != 0
            || len == 0
            || len > u64::from(MAX_RDMA)
            || ep.redirects.iter().any(|r| r.id == id)
        {
            return Err(tx_error::BAD_DESCRIPTOR);
        }
        let ap = self.nodes[n as usize]
            .apertures
            .get(aperture)
            .filter(|a| a.ep == e)
            .ok_or(tx_error::BAD_COOKIE)?;
        if offset.checked_add(len).is_none_or(|end| end > ap.len) {
            return Err(tx_error::OUT_OF_RANGE);
        }
        let mem: &GuestMemoryMmap<()> = mems[n as usize].as_deref().ok_or(tx_error::BAD_ADDRESS)?;
        let tag = (n, ep.pd);
        let seg = self.utlb_cache.translate(
            mem,
            self.utlb_tables.get(tag),
            tag,
            target,
            len,
            &mut ep.stats,
        )?;
        self.utlb_cache.recycle(seg);
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
}

/// Moves `n` bytes of a write, starting `src_relative` bytes into it, to
/// `dst_offset` of a segment: `copy(segment, dst_offset, src_relative, n)`.
pub(crate) type CopyPiece<'a> = dyn FnMut(&Segment, u64, u64, u64) -> Result<(), u16> + 'a;

/// Where an arriving write lands.
pub(crate) struct Landing<'a> {
    pub cache: &'a mut TranslationCache,
    pub tables: &'a Tables,
    /// The owner's (node, protection domain).
    pub tag: (u32, u32),
    pub mem: &'a GuestMemoryMmap<()>,
    pub segment: &'a Segment,
    pub redirects: &'a mut Vec<Redirect>,
    pub stats: &'a mut Stats,
    pub aperture: u32,
    /// Where the aperture starts in the owner's segment.
    pub ap_seg_offset: u64,
}

impl<'a> Landing<'a> {
    /// Where writes into aperture `aperture` of `owner`, on node `node`
    /// with memory `mem`, land: at `ap_seg_offset` of the owner's segment,
    /// or of `buffer` (the translated user buffer of a buffer aperture).
    pub fn new(
        cache: &'a mut TranslationCache,
        tables: &'a Tables,
        node: u32,
        owner: &'a mut Endpoint,
        mem: &'a GuestMemoryMmap<()>,
        aperture: u32,
        (buffer, ap_seg_offset): (Option<&'a Segment>, u64),
    ) -> Self {
        Landing {
            cache,
            tables,
            tag: (node, owner.pd),
            mem,
            segment: buffer.unwrap_or(&owner.segment),
            redirects: &mut owner.redirects,
            stats: &mut owner.stats,
            aperture,
            ap_seg_offset,
        }
    }

    /// Lands a write of `len` bytes at aperture offset `at`; `copy(seg,
    /// dst_offset, src_relative, n)` moves `n` source bytes starting
    /// `src_relative` into the write into `seg` at `dst_offset`. Returns
    /// the redirections completed by it (already removed).
    pub fn write(
        &mut self,
        at: u64,
        len: u64,
        writer: (u32, u32),
        copy: &mut CopyPiece<'_>,
    ) -> Result<Vec<Redirect>, u16> {
        let end = at + len;
        let mut cursor = at;
        while cursor < end {
            let here = self
                .redirects
                .iter()
                .position(|r| r.aperture == self.aperture && r.accepts(cursor));
            if let Some(i) = here {
                let piece = self.redirects[i].end().min(end) - cursor;
                if self
                    .redirect_piece(i, cursor, cursor - at, piece, copy)
                    .is_ok()
                {
                    let r = &mut self.redirects[i];
                    if r.bytes == 0 {
                        r.start = cursor - r.offset;
                    }
                    r.bytes += piece;
                    r.writer = writer;
                    cursor += piece;
                    continue;
                }
                // The user buffer cannot be reached: those bytes land in
                // the aperture, and the report says they were not moved.
            }
            // Up to where some redirection could start taking bytes.
            let next = self
                .redirects
                .iter()
                .filter(|r| r.aperture == self.aperture)
                .flat_map(|r| [r.offset, r.offset + r.start + r.bytes])
                .filter(|&b| b > cursor)
                .min()
                .unwrap_or(end)
                .min(end);
            copy(
                self.segment,
                self.ap_seg_offset.wrapping_add(cursor),
                cursor - at,
                next - cursor,
            )?;
            cursor = next;
        }
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.redirects.len() {
            if self.redirects[i].bytes == self.redirects[i].len {
                done.push(self.redirects.swap_remove(i));
            } else {
                i += 1;
            }
        }
        Ok(done)
    }

    fn redirect_piece(
        &mut self,
        i: usize,
        cursor: u64,
        rel: u64,
        piece: u64,
        copy: &mut CopyPiece<'_>,
    ) -> Result<(), u16> {
        let r = &self.redirects[i];
        let seg = self.cache.translate(
            self.mem,
            self.tables.get(self.tag),
            self.tag,
            r.target,
            r.len,
            self.stats,
        )?;
        let at = r.target.offset + (cursor - r.offset);
        let result = copy(&seg, at, rel, piece);
        self.cache.recycle(seg);
        result
    }
}
