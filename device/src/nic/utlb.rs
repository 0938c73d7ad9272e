//! The UTLB (VMMC-2 §4): per protection domain, a table of page addresses
//! in guest memory that only the driver writes, and the device's
//! translation cache in front of it (the NI's SRAM cache in VMMC-2:
//! 8192 lines, direct-mapped, tagged by the domain).
//!
//! A descriptor names a buffer by (first index, count) of contiguous
//! entries plus an offset into the first page; the device turns that into
//! a `Segment` and moves the bytes with the same code as for segments.

use std::collections::HashMap;
use std::time::Instant;

use ulnic_abi::{tx_error, MAX_UTLB_RUN, PAGE_SIZE};
use vm_memory::GuestMemoryMmap;
use zerocopy::little_endian::U32;

use crate::memory::guest::{self, Segment};
use crate::nic::stats::Stats;

/// A domain's translation table as the driver registered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    /// Guest-physical address of `entries` little-endian u64 page addresses.
    pub gpa: u64,
    /// Number of entries.
    pub entries: u32,
}

/// How a full set picks its victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replacement {
    /// Least recently used line of the set.
    #[default]
    Lru,
    /// A pseudo-random line of the set (Schoinas & Hill's NI designs).
    Random,
}

/// The cache's shape (device start options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Lines in total (a multiple of `ways`).
    pub entries: u32,
    /// Lines per set: 1 is direct-mapped, `entries` fully associative.
    pub ways: u32,
    /// Victim choice in a set.
    pub replacement: Replacement,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            entries: ulnic_abi::DEFAULT_UTLB_CACHE,
            ways: 1,
            replacement: Replacement::Lru,
        }
    }
}

impl CacheConfig {
    /// Checks the shape; the error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.entries == 0 || self.ways == 0 || self.ways > self.entries {
            return Err(format!(
                "UTLB cache of {} entries and {} ways: need 1 <= ways <= entries",
                self.entries, self.ways
            ));
        }
        if !self.entries.is_multiple_of(self.ways) {
            return Err(format!(
                "UTLB cache: {} entries is not a multiple of {} ways",
                self.entries, self.ways
            ));
        }
        Ok(())
    }
}

/// Whose translation a line holds: (node, protection domain).
type Tag = (u32, u32);

#[derive(Debug, Clone, Copy)]
struct Line {
    tag: Tag,
    index: u32,
    page: u64,
    used: u64,
}

/// The device-wide translation cache, tagged by (node, domain).
pub struct TranslationCache {
    config: CacheConfig,
    sets: u32,
    lines: Vec<Option<Line>>,
    clock: u64,
    rng: u64,
    /// A translated segment handed back for reuse (no allocation per
    /// descriptor on the data path).
    spare: Segment,
}

impl TranslationCache {
    /// An empty cache; `config` must have passed `validate`.
    pub fn new(config: CacheConfig) -> Self {
        let config = if config.validate().is_ok() {
            config
        } else {
            CacheConfig::default()
        };
        TranslationCache {
            sets: config.entries / config.ways,
            lines: vec![None; config.entries as usize],
            config,
            clock: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
            spare: Segment::default(),
        }
    }

    /// The cache's shape.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// The set of entry `index` of `tag`'s table: consecutive entries of
    /// one domain go to consecutive sets, and each domain starts at its
    /// own hashed offset, so domains that all use their low entries do not
    /// evict each other line for line (VMMC-2 leaves the mapping open).
    fn set_of(&self, tag: Tag, index: u32) -> std::ops::Range<usize> {
        let offset = tag.0.wrapping_mul(0x9e37_79b1) ^ tag.1.wrapping_mul(0x85eb_ca6b);
        let set = (u64::from(index) + u64::from(offset)) % u64::from(self.sets);
        let first = set as usize * self.config.ways as usize;
        first..first + self.config.ways as usize
    }

    /// The cached page of entry `index` of `tag`'s table.
    fn lookup(&mut self, tag: Tag, index: u32) -> Option<u64> {
        self.clock += 1;
        let now = self.clock;
        let set = self.set_of(tag, index);
        self.lines[set].iter_mut().flatten().find_map(|l| {
            (l.tag == tag && l.index == index).then(|| {
                l.used = now;
                l.page
            })
        })
    }

    fn insert(&mut self, tag: Tag, index: u32, page: u64) {
        let set = self.set_of(tag, index);
        let ways = set.len();
        let slot = match self.lines[set.clone()].iter().position(Option::is_none) {
            Some(free) => free,
            None => match self.config.replacement {
                Replacement::Lru => self.lines[set.clone()]
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, l)| l.map_or(0, |l| l.used))
                    .map_or(0, |(i, _)| i),
                Replacement::Random => {
                    // xorshift64: cheap, and the victim needs no quality.
                    self.rng ^= self.rng << 13;
                    self.rng ^= self.rng >> 7;
                    self.rng ^= self.rng << 17;
                    (self.rng % ways as u64) as usize
                }
            },
        };
        self.lines[set.start + slot] = Some(Line {
            tag,
            index,
            page,
            used: self.clock,
        });
    }

    /// Drops the lines of entries `first..first+count` of `tag`'s table.
    pub fn invalidate(&mut self, tag: Tag, first: u32, count: u32) {
        let end = u64::from(first) + u64::from(count);
        if u64::from(count) >= u64::from(self.sets) {
            self.invalidate_where(|l| {
                l.tag == tag && u64::from(l.index) >= u64::from(first) && u64::from(l.index) < end
            });
            return;
        }
        for index in first..first.saturating_add(count) {
            let set = self.set_of(tag, index);
            for l in &mut self.lines[set] {
                if l.is_some_and(|l| l.tag == tag && l.index == index) {
                    *l = None;
                }
            }
        }
    }

    /// Drops every line of a domain (table replaced or domain destroyed).
    pub fn invalidate_domain(&mut self, tag: Tag) {
        self.invalidate_where(|l| l.tag == tag);
    }

    /// Drops every line of a node (its frontend went away).
    pub fn invalidate_node(&mut self, node: u32) {
        self.invalidate_where(|l| l.tag.0 == node);
    }

    fn invalidate_where(&mut self, drop: impl Fn(&Line) -> bool) {
        for l in &mut self.lines {
            if l.is_some_and(|l| drop(&l)) {
                *l = None;
            }
        }
    }

    /// Translates the buffer (first, count, offset, len) of domain `tag`
    /// through its table: the pages as a segment, and the buffer's offset
    /// in it. Misses read the entry from the table in guest memory; an
    /// entry outside the table or 0 (not installed) is `NO_TRANSLATION`, an
    /// entry naming memory the driver did not share is `BAD_ADDRESS`.
    #[allow(clippy::too_many_arguments)]
    pub fn translate(
        &mut self,
        mem: &GuestMemoryMmap<()>,
        table: Option<&Table>,
        tag: Tag,
        r: UtlbRef,
        len: u64,
        stats: &mut Stats,
    ) -> Result<Segment, u16> {
        let table = table.ok_or(tx_error::NO_TRANSLATION)?;
        let end = u64::from(r.first) + u64::from(r.count);
        if r.count == 0 || r.count > MAX_UTLB_RUN || end > u64::from(table.entries) {
            return Err(tx_error::NO_TRANSLATION);
        }
        if r.offset >= PAGE_SIZE
            || r.offset
                .checked_add(len)
                .is_none_or(|e| e > u64::from(r.count) * PAGE_SIZE)
        {
            return Err(tx_error::NO_TRANSLATION);
        }
        let mut seg = std::mem::take(&mut self.spare);
        seg.clear();
        for index in r.first..r.first + r.count {
            let page = match self.lookup(tag, index) {
                Some(p) => {
                    stats.utlb_hits += 1;
                    p
                }
                None => {
                    let t0 = Instant::now();
                    let mut b = [0u8; 8];
                    let at = table
                        .gpa
                        .checked_add(u64::from(index) * ulnic_abi::PAGE_ENTRY_SIZE)
                        .ok_or(tx_error::BAD_ADDRESS)?;
                    guest::read(mem, at, &mut b).map_err(|_| tx_error::BAD_ADDRESS)?;
                    let p = u64::from_le_bytes(b);
                    stats.utlb_misses += 1;
                    stats.utlb_fetch_ns += t0.elapsed().as_nanos() as u64;
                    if p == 0 {
                        return Err(tx_error::NO_TRANSLATION);
                    }
                    if !p.is_multiple_of(PAGE_SIZE) || !guest::range_ok(mem, p, PAGE_SIZE) {
                        return Err(tx_error::BAD_ADDRESS);
                    }
                    self.insert(tag, index, p);
                    p
                }
            };
            seg.push_page(mem, page)
                .map_err(|_| tx_error::BAD_ADDRESS)?;
        }
        Ok(seg)
    }

    /// Takes back a segment `translate` returned, to reuse its memory.
    pub fn recycle(&mut self, seg: Segment) {
        self.spare = seg;
    }
}

/// A descriptor's reference to UTLB entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtlbRef {
    /// First entry.
    pub first: u32,
    /// Entries.
    pub count: u32,
    /// Offset of the buffer in the first entry's page.
    pub offset: u64,
}

impl UtlbRef {
    /// Reads the (first, count) pair at `at` of a raw descriptor.
    pub fn decode(raw: &[u8], at: usize, offset: u64) -> Self {
        let [first, count]: [U32; 2] = ulnic_abi::wire::read(raw.get(at..).unwrap_or_default());
        UtlbRef {
            first: first.get(),
            count: count.get(),
            offset,
        }
    }
}

/// Every domain's table, by (node, domain).
#[derive(Default)]
pub struct Tables(HashMap<Tag, Table>);

impl Tables {
    /// The table of a domain, if its driver registered one.
    pub fn get(&self, tag: Tag) -> Option<&Table> {
        self.0.get(&tag)
    }
    /// Registers (or replaces) a domain's table.
    pub fn set(&mut self, tag: Tag, t: Table) {
        self.0.insert(tag, t);
    }
    /// Forgets a domain's table.
    pub fn remove(&mut self, tag: Tag) {
        self.0.remove(&tag);
    }
    /// Forgets every table of a node.
    pub fn remove_node(&mut self, node: u32) {
        self.0.retain(|t, _| t.0 != node);
    }
}

/// The UTLB as the shard holds it: every domain's table and the one
/// translation cache in front of them all.
pub struct Utlb {
    /// Tables by (node, domain).
    pub tables: Tables,
    /// The device's translation cache.
    pub cache: TranslationCache,
}

impl Default for Utlb {
    fn default() -> Self {
        Utlb {
            tables: Tables::default(),
            cache: TranslationCache::new(CacheConfig::default()),
        }
    }
}

impl Utlb {
    /// Translates `len` bytes of the buffer `r` names in the table of
    /// domain `tag` (node, domain), through the cache; `stats` counts the
    /// hit or miss. Give the segment back with `recycle` when done.
    pub fn translate(
        &mut self,
        mem: &GuestMemoryMmap<()>,
        tag: Tag,
        r: UtlbRef,
        len: u64,
        stats: &mut Stats,
    ) -> Result<Segment, u16> {
        self.cache
            .translate(mem, self.tables.get(tag), tag, r, len, stats)
    }

    /// Returns a translated segment's storage for the next translation.
    pub fn recycle(&mut self, seg: Segment) {
        self.cache.recycle(seg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::guest::tests::mem;

    fn table_with(m: &GuestMemoryMmap<()>, pages: &[u64]) -> Table {
        let gpa = 0x10_0000;
        for (i, p) in pages.iter().enumerate() {
            guest::write(m, gpa + i as u64 * 8, &p.to_le_bytes()).unwrap();
        }
        Table {
            gpa,
            entries: pages.len() as u32,
        }
    }

    fn r(first: u32, count: u32, offset: u64) -> UtlbRef {
        UtlbRef {
            first,
            count,
            offset,
        }
    }

    #[test]
    fn hits_after_a_miss_and_invalidation_refetches() {
        let m = mem(4 << 20);
        let t = table_with(&m, &[0x1000, 0x3000, 0x2000, 0]);
        let mut c = TranslationCache::new(CacheConfig::default());
        let mut s = Stats::default();
        let seg = c
            .translate(&m, Some(&t), (0, 1), r(0, 3, 16), 3 * 4096 - 16, &mut s)
            .unwrap();
        assert_eq!(seg.len(), 3 * 4096);
        assert_eq!((s.utlb_hits, s.utlb_misses), (0, 3));
        c.translate(&m, Some(&t), (0, 1), r(1, 1, 0), 4096, &mut s)
            .unwrap();
        assert_eq!((s.utlb_hits, s.utlb_misses), (1, 3));
        // Another domain with the same index misses (the tag differs).
        c.translate(&m, Some(&t), (0, 2), r(1, 1, 0), 4096, &mut s)
            .unwrap();
        assert_eq!(s.utlb_misses, 4);
        // The driver rewrites entry 1 and invalidates: the new page is used.
        guest::write(&m, t.gpa + 8, &0x5000u64.to_le_bytes()).unwrap();
        c.invalidate((0, 1), 1, 1);
        let seg = c
            .translate(&m, Some(&t), (0, 1), r(1, 1, 0), 4096, &mut s)
            .unwrap();
        let mut pieces = seg.pieces(0, 4096);
        assert_eq!(pieces.next().map(|p| p.0), Some(0x5000));
    }

    #[test]
    fn bad_references_are_refused() {
        let m = mem(4 << 20);
        let t = table_with(&m, &[0x1000, 0x2000, 0, 0x1234, 1 << 40]);
        let mut c = TranslationCache::new(CacheConfig::default());
        let mut s = Stats::default();
        let mut go = |rf: UtlbRef, len: u64, t: Option<&Table>| {
            c.translate(&m, t, (0, 1), rf, len, &mut s).err()
        };
        let no = Some(tx_error::NO_TRANSLATION);
        assert_eq!(go(r(0, 1, 0), 8, None), no, "no table");
        assert_eq!(go(r(0, 0, 0), 0, Some(&t)), no, "count 0");
        assert_eq!(go(r(4, 2, 0), 8, Some(&t)), no, "past the table");
        assert_eq!(go(r(u32::MAX, 2, 0), 8, Some(&t)), no, "overflow");
        assert_eq!(go(r(0, 2, 4096), 8, Some(&t)), no, "offset past a page");
        assert_eq!(go(r(0, 2, 100), 8192, Some(&t)), no, "longer than entries");
        assert_eq!(go(r(2, 1, 0), 8, Some(&t)), no, "not installed");
        let bad = Some(tx_error::BAD_ADDRESS);
        assert_eq!(go(r(3, 1, 0), 8, Some(&t)), bad, "unaligned page");
        assert_eq!(go(r(4, 1, 0), 8, Some(&t)), bad, "outside memory");
        let far = Table {
            gpa: u64::MAX - 7,
            entries: 4,
        };
        assert_eq!(go(r(1, 1, 0), 8, Some(&far)), bad, "table outside memory");
    }

    #[test]
    fn associativity_and_replacement() {
        let m = mem(4 << 20);
        let pages: Vec<u64> = (1..=16).map(|p| p * 4096).collect();
        let t = table_with(&m, &pages);
        // 4 lines, 2 ways, LRU: entries 0, 2, 4 share a set.
        let mut c = TranslationCache::new(CacheConfig {
            entries: 4,
            ways: 2,
            replacement: Replacement::Lru,
        });
        let mut s = Stats::default();
        let mut touch = |c: &mut TranslationCache, i: u32| {
            c.translate(&m, Some(&t), (0, 1), r(i, 1, 0), 1, &mut s)
                .unwrap();
        };
        for i in [0, 2, 0, 4, 0, 2] {
            touch(&mut c, i);
        }
        // 0 miss, 2 miss, 0 hit, 4 miss (evicts 2), 0 hit, 2 miss (evicts 4).
        assert_eq!((s.utlb_hits, s.utlb_misses), (2, 4));
    }
}
