//! Transfer redirection (VMMC-2 §3, spec §5.15): the owner of an aperture
//! (the default receive buffer) redirects part of it into a user buffer
//! named through the UTLB; writes arriving there afterwards land in the
//! user buffer. The device orders posts and arrivals under its shard
//! lock and reports exactly which part was redirected.

use ulnic_abi::{event, EventRecord};
use vm_memory::GuestMemoryMmap;

use crate::memory::guest::Segment;
use crate::nic::stats::Stats;
use crate::nic::utlb::{Tables, TranslationCache, UtlbRef};

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
    pub fn report(&self, outcome: u16) -> EventRecord {
        EventRecord {
            session: 0,
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

/// Moves `n` bytes of a write, starting `src_relative` bytes into it, to
/// `dst_offset` of a segment: `copy(segment, dst_offset, src_relative, n)`.
pub type CopyPiece<'a> = dyn FnMut(&Segment, u64, u64, u64) -> Result<(), u16> + 'a;

/// Where an arriving write lands.
pub struct Landing<'a> {
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
