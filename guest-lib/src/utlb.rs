//! The library's half of the UTLB (VMMC-2 §4.1, Schoinas & Hill §4.3–4.4):
//! which of this process's pages the driver has installed in the domain's
//! translation table, at which entries, and the policy for misses.
//!
//! The table belongs to the driver; the library only decides which pages
//! go where. A buffer is named to the device by (first entry, count,
//! offset in the first page), so a buffer's pages occupy consecutive
//! entries. On a miss the library picks the least recently used run of
//! entries that no posted descriptor is using (each entry counts the
//! descriptors in flight on it), asks the driver to install the pages
//! there, and goes on. With fallback enabled it instead copies the
//! message through the endpoint's pre-registered bounce buffer and services
//! at most one miss per `miss_every_bytes` transferred, so a working set
//! larger than the table degrades to single-copy, not to a system call per
//! message.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::{Domain, UserMemory};
use crate::error::Error;

const PAGE: usize = ulnic_abi::PAGE_SIZE as usize;

/// How a protection domain's UTLB behaves ([`crate::ProtectionDomain::enable_utlb`]).
///
/// ```
/// let cfg = ulnic::UtlbConfig { entries: 1024, ..Default::default() };
/// assert!(cfg.fallback);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtlbConfig {
    /// Entries in the domain's translation table (pages translatable at once).
    pub entries: u32,
    /// On a miss, copy through the bounce buffer and service the miss later
    /// (Schoinas & Hill's single-copy fallback) instead of installing the
    /// translation before sending.
    pub fallback: bool,
    /// With fallback: service at most one miss per this many bytes
    /// transferred (0: after every fallback, no rate control).
    pub miss_every_bytes: u64,
    /// Each endpoint's bounce buffer, in bytes (registered once, on its
    /// first fallback; a larger message is never copied).
    pub bounce_bytes: usize,
}

impl Default for UtlbConfig {
    fn default() -> Self {
        UtlbConfig {
            entries: ulnic_abi::DEFAULT_UTLB_CACHE,
            fallback: true,
            miss_every_bytes: 64 << 10,
            bounce_bytes: 256 << 10,
        }
    }
}

/// The library's UTLB counters for a protection domain.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let pd = nic.alloc_pd()?;
/// let s = pd.utlb_stats();
/// println!("{} hits, {} misses, {} bytes copied", s.hits, s.misses, s.fallback_bytes);
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UtlbStats {
    /// Buffers looked up.
    pub lookups: u64,
    /// Lookups that found every page installed.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Misses serviced (translations installed by the driver).
    pub misses_serviced: u64,
    /// Installed entries replaced to make room.
    pub evictions: u64,
    /// Transfers copied through the bounce buffer instead.
    pub fallback_sends: u64,
    /// Bytes so copied.
    pub fallback_bytes: u64,
    /// Time in the library's miss handling (choosing entries), total.
    pub library_ns: u64,
    /// Time in the driver installing translations, total.
    pub driver_ns: u64,
}

/// How a transfer from a [`UserBuffer`] was translated.
///
/// ```
/// assert_ne!(ulnic::Translation::Hit, ulnic::Translation::Fallback);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Translation {
    /// Every page was installed: zero-copy.
    Hit,
    /// A miss serviced before the transfer (a driver call): zero-copy.
    Miss,
    /// A miss served by copying through the bounce buffer.
    Fallback,
}

/// What explicit registration did ([`crate::ProtectionDomain::register`]).
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let pd = nic.alloc_pd()?;
/// # pd.enable_utlb(Default::default())?;
/// let buf = pd.alloc_buffer(4096)?;
/// let r = pd.register(&buf, 0..4096)?;
/// println!("hit: {}, driver took {:?}", r.hit, r.driver);
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The pages were installed already.
    pub hit: bool,
    /// Time the library spent (lookup, and on a miss choosing entries).
    pub library: Duration,
    /// Time the driver spent installing (zero on a hit).
    pub driver: Duration,
}

/// A reference to installed entries, as descriptors carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UtlbRef {
    pub first: u32,
    pub count: u32,
    pub offset: u64,
}

/// Pages `[first page, first page + count)` and the offset into the first.
fn pages_of(va: usize, len: usize) -> (usize, u32, u64) {
    let first = va - va % PAGE;
    let end = (va + len.max(1)).next_multiple_of(PAGE);
    (first, ((end - first) / PAGE) as u32, (va - first) as u64)
}

/// The domain's view of its table.
pub(crate) struct Translations {
    pub cfg: UtlbConfig,
    /// Page address installed at each entry (0: none).
    page_at: Vec<usize>,
    /// Posted descriptors using each entry.
    refs: Vec<u32>,
    /// When each entry was last used (0: never).
    used: Vec<u64>,
    /// The same order as a list (S&H's doubly-linked LRU list), so a
    /// one-page miss finds its victim without scanning the table.
    lru: LruList,
    /// Entry of each installed page.
    index_of: FxHashMap<usize, u32>,
    clock: u64,
    /// Bytes transferred since a miss was last serviced.
    bytes_since_service: u64,
    /// Misses served by fallback, newest last, not yet serviced.
    deferred: VecDeque<(usize, usize)>,
    pub stats: UtlbStats,
}

/// Deferred misses remembered; older ones are forgotten (sampling).
const MAX_DEFERRED: usize = 64;

impl Translations {
    pub fn new(cfg: UtlbConfig) -> Self {
        let n = cfg.entries as usize;
        Translations {
            cfg,
            page_at: vec![0; n],
            refs: vec![0; n],
            used: vec![0; n],
            lru: LruList::new(n),
            index_of: FxHashMap::default(),
            clock: 0,
            bytes_since_service: 0,
            deferred: VecDeque::new(),
            stats: UtlbStats::default(),
        }
    }

    /// The entries holding `[va, va+len)` in order, if all are installed.
    pub fn lookup(&mut self, va: usize, len: usize) -> Option<UtlbRef> {
        let (p0, count, offset) = pages_of(va, len);
        let first = *self.index_of.get(&p0)?;
        let end = first as usize + count as usize;
        if end > self.page_at.len() {
            return None;
        }
        let run = first as usize..end;
        if !run
            .clone()
            .enumerate()
            .all(|(k, i)| self.page_at[i] == p0 + k * PAGE)
        {
            return None;
        }
        self.clock += 1;
        for i in run {
            self.used[i] = self.clock;
            self.lru.make_newest(i);
        }
        Some(UtlbRef {
            first,
            count,
            offset,
        })
    }

    /// The least recently used run of `n` entries none of which is in
    /// use (its most recent use is the oldest among all such runs; free
    /// entries count as never used).
    fn choose_run(&self, n: usize) -> Option<usize> {
        let len = self.page_at.len();
        if n == 0 || n > len {
            return None;
        }
        if n == 1 {
            // Oldest first; only entries in use are passed over.
            return self.lru.oldest_first().find(|&i| self.refs[i] == 0);
        }
        // Sliding window: busy entries in the window, and a deque of
        // indices whose `used` is decreasing (front: the window's newest).
        let mut busy = 0usize;
        let mut newest: VecDeque<usize> = VecDeque::new();
        let mut best: Option<(u64, usize)> = None;
        for i in 0..len {
            busy += usize::from(self.refs[i] > 0);
            while newest.back().is_some_and(|&j| self.used[j] <= self.used[i]) {
                newest.pop_back();
            }
            newest.push_back(i);
            if i + 1 < n {
                continue;
            }
            let start = i + 1 - n;
            if start > 0 {
                busy -= usize::from(self.refs[start - 1] > 0);
            }
            while newest.front().is_some_and(|&j| j < start) {
                newest.pop_front();
            }
            let age = newest.front().map_or(0, |&j| self.used[j]);
            if busy == 0 && best.is_none_or(|(a, _)| age < a) {
                best = Some((age, start));
                if age == 0 {
                    break; // free entries: cannot do better
                }
            }
        }
        best.map(|(_, s)| s)
    }

    /// Installs `[va, va+len)` through the driver; `WouldBlock` when every
    /// run of the size needed is in use by posted descriptors.
    pub fn install(&mut self, dom: &dyn Domain, va: usize, len: usize) -> Result<UtlbRef, Error> {
        let t0 = Instant::now();
        let (p0, count, offset) = pages_of(va, len);
        if count > self.cfg.entries || count > ulnic_abi::MAX_UTLB_RUN {
            return Err(Error::InvalidArgument("buffer larger than the UTLB"));
        }
        let first = self.choose_run(count as usize).ok_or(Error::WouldBlock)?;
        self.clock += 1;
        for (k, i) in (first..first + count as usize).enumerate() {
            let old = std::mem::replace(&mut self.page_at[i], p0 + k * PAGE);
            if old != 0 {
                self.stats.evictions += 1;
                if self.index_of.get(&old) == Some(&(i as u32)) {
                    self.index_of.remove(&old);
                }
            }
            self.index_of.insert(p0 + k * PAGE, i as u32);
            self.used[i] = self.clock;
            self.lru.make_newest(i);
        }
        let t1 = Instant::now();
        let r = dom.utlb_install(first as u32, p0, count);
        let t2 = Instant::now();
        self.stats.library_ns += (t1 - t0).as_nanos() as u64;
        self.stats.driver_ns += (t2 - t1).as_nanos() as u64;
        if let Err(e) = r {
            // The driver may have installed part of it: treat as free.
            for i in first..first + count as usize {
                self.index_of.remove(&self.page_at[i]);
                self.page_at[i] = 0;
                self.used[i] = 0;
                self.lru.make_oldest(i);
            }
            return Err(e);
        }
        self.stats.misses_serviced += 1;
        Ok(UtlbRef {
            first: first as u32,
            count,
            offset,
        })
    }

    /// The entries of `[va, va+len)`, installing them on a miss (counted
    /// in the stats), and whether they were there already.
    pub fn find_or_install(
        &mut self,
        dom: &dyn Domain,
        va: usize,
        len: usize,
    ) -> Result<(UtlbRef, bool), Error> {
        self.stats.lookups += 1;
        if let Some(r) = self.lookup(va, len) {
            self.stats.hits += 1;
            return Ok((r, true));
        }
        self.stats.misses += 1;
        Ok((self.install(dom, va, len)?, false))
    }

    /// Marks entries as used by one more posted descriptor.
    pub fn acquire(&mut self, r: &UtlbRef) {
        for i in r.first..r.first + r.count {
            self.refs[i as usize] += 1;
        }
    }

    /// A descriptor using `r` retired.
    pub fn release(&mut self, r: &UtlbRef) {
        for i in r.first..r.first + r.count {
            let c = &mut self.refs[i as usize];
            *c = c.saturating_sub(1);
        }
    }

    /// Forgets the translations of a buffer being freed (entries still in
    /// use stay reserved until their descriptors retire).
    pub fn forget(&mut self, va: usize, len: usize) {
        let (p0, count, _) = pages_of(va, len);
        for k in 0..count as usize {
            if let Some(i) = self.index_of.remove(&(p0 + k * PAGE)) {
                self.page_at[i as usize] = 0;
                self.used[i as usize] = 0;
                self.lru.make_oldest(i as usize);
            }
        }
        self.deferred.retain(|&(d, l)| d + l <= va || d >= va + len);
    }

    /// Counts transferred bytes toward the miss budget.
    pub fn transferred(&mut self, bytes: u64) {
        self.bytes_since_service = self.bytes_since_service.saturating_add(bytes);
    }

    /// Remembers a miss served by fallback.
    pub fn defer(&mut self, va: usize, len: usize) {
        if self.deferred.len() == MAX_DEFERRED {
            self.deferred.pop_front();
        }
        self.deferred.push_back((va, len));
    }

    /// Services the newest deferred miss if the budget allows (at most one
    /// per `miss_every_bytes`); never fails the caller's transfer.
    pub fn service_deferred(&mut self, dom: &dyn Domain) {
        if self.bytes_since_service < self.cfg.miss_every_bytes {
            return;
        }
        while let Some((va, len)) = self.deferred.pop_back() {
            if self.lookup(va, len).is_some() {
                continue; // serviced meanwhile
            }
            if self.install(dom, va, len).is_ok() {
                self.bytes_since_service = 0;
            }
            return;
        }
    }
}

/// Entries from least to most recently used, as a doubly-linked list in
/// two index arrays.
struct LruList {
    older: Vec<u32>,
    newer: Vec<u32>,
    oldest: u32,
    newest: u32,
}

const NIL: u32 = u32::MAX;

impl LruList {
    /// Entries 0..n, 0 the oldest.
    fn new(n: usize) -> Self {
        let n = n as u32;
        LruList {
            older: (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect(),
            newer: (0..n)
                .map(|i| if i + 1 == n { NIL } else { i + 1 })
                .collect(),
            oldest: if n == 0 { NIL } else { 0 },
            newest: if n == 0 { NIL } else { n - 1 },
        }
    }

    fn unlink(&mut self, i: u32) {
        let (o, n) = (self.older[i as usize], self.newer[i as usize]);
        match o {
            NIL => self.oldest = n,
            o => self.newer[o as usize] = n,
        }
        match n {
            NIL => self.newest = o,
            n => self.older[n as usize] = o,
        }
    }

    fn make_newest(&mut self, i: usize) {
        let i = i as u32;
        if self.newest == i {
            return;
        }
        self.unlink(i);
        self.older[i as usize] = self.newest;
        self.newer[i as usize] = NIL;
        if self.newest != NIL {
            self.newer[self.newest as usize] = i;
        }
        self.newest = i;
        if self.oldest == NIL {
            self.oldest = i;
        }
    }

    fn make_oldest(&mut self, i: usize) {
        let i = i as u32;
        if self.oldest == i {
            return;
        }
        self.unlink(i);
        self.newer[i as usize] = self.oldest;
        self.older[i as usize] = NIL;
        if self.oldest != NIL {
            self.older[self.oldest as usize] = i;
        }
        self.oldest = i;
        if self.newest == NIL {
            self.newest = i;
        }
    }

    fn oldest_first(&self) -> impl Iterator<Item = usize> + '_ {
        let mut at = self.oldest;
        std::iter::from_fn(move || {
            (at != NIL).then(|| {
                let i = at;
                at = self.newer[i as usize];
                i as usize
            })
        })
    }
}

/// A domain's UTLB, shared by its endpoints and buffers.
pub(crate) type SharedTranslations = Arc<std::sync::OnceLock<Mutex<Translations>>>;

pub(crate) fn lock(t: &Mutex<Translations>) -> MutexGuard<'_, Translations> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

/// Memory the device can reach through the UTLB: from the shared memory
/// with host attach, anonymous memory the driver pins on demand in a
/// guest ([`crate::ProtectionDomain::alloc_buffer`]). Keep it alive until
/// transfers from it have retired.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let pd = nic.alloc_pd()?;
/// let mut buf = pd.alloc_buffer(8192)?;
/// buf.as_mut_slice()[..5].copy_from_slice(b"hello");
/// assert_eq!(buf.len(), 8192);
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct UserBuffer {
    dom: Arc<dyn Domain>,
    utlb: SharedTranslations,
    mem: UserMemory,
}

impl UserBuffer {
    pub(crate) fn new(
        dom: Arc<dyn Domain>,
        utlb: SharedTranslations,
        bytes: usize,
    ) -> Result<Self, Error> {
        let mem = dom.alloc_user_memory(bytes)?;
        Ok(UserBuffer { dom, utlb, mem })
    }

    /// Length in bytes (whole pages).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let buf = nic.alloc_pd()?.alloc_buffer(100)?;
    /// assert_eq!(buf.len(), 4096);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Whether it has no bytes (never: buffers are whole pages).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let buf = nic.alloc_pd()?.alloc_buffer(1)?;
    /// assert!(!buf.is_empty());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// The bytes.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let buf = nic.alloc_pd()?.alloc_buffer(4096)?;
    /// assert_eq!(buf.as_slice()[0], 0);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is ours for `len` bytes while `self` lives;
        // the device writes into it only for an unsafe RDMA read whose
        // caller promised not to look meanwhile.
        unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr(), self.mem.len) }
    }

    /// The bytes, to fill.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut buf = nic.alloc_pd()?.alloc_buffer(4096)?;
    /// buf.as_mut_slice().fill(7);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr(), self.mem.len) }
    }

    /// Address of byte `offset` (the UTLB's key), after checking `range`.
    pub(crate) fn span(&self, range: &Range<usize>) -> Result<(usize, usize), Error> {
        if range.start >= range.end || range.end > self.mem.len {
            return Err(Error::InvalidArgument("range empty or outside the buffer"));
        }
        Ok((
            self.mem.ptr.as_ptr() as usize + range.start,
            range.end - range.start,
        ))
    }
}

impl Drop for UserBuffer {
    fn drop(&mut self) {
        if let Some(t) = self.utlb.get() {
            lock(t).forget(self.mem.ptr.as_ptr() as usize, self.mem.len);
        }
        self.dom.free_user_memory(&self.mem);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver that records installs.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(u32, usize, u32)>>, ulnic_abi::DeviceInfo);

    impl Domain for Recorder {
        fn info(&self) -> &ulnic_abi::DeviceInfo {
            &self.1
        }
        fn create_endpoint(
            &self,
            _: &ulnic_abi::RingLayout,
            _: usize,
        ) -> Result<crate::backend::EpMemory, Error> {
            Err(Error::WouldBlock)
        }
        fn destroy_endpoint(&self, _: &crate::backend::EpMemory) {}
        fn ep_command(&self, _: u32, _: &[u8]) -> Result<Vec<u8>, Error> {
            Err(Error::WouldBlock)
        }
        fn ring_doorbell(&self, _: &crate::backend::EpMemory) {}
        fn wait(&self, _: u32, _: Duration) -> Result<bool, Error> {
            Ok(false)
        }
        fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
        fn take_notified(&self) -> Result<Vec<u32>, Error> {
            Ok(Vec::new())
        }
        fn new_watcher(&self) -> Result<std::os::fd::OwnedFd, Error> {
            Err(Error::WouldBlock)
        }
        fn watch(&self, _: u32, _: std::os::fd::RawFd, _: bool) -> Result<(), Error> {
            Err(Error::WouldBlock)
        }
        fn alloc_user_memory(&self, _: usize) -> Result<UserMemory, Error> {
            Err(Error::WouldBlock)
        }
        fn free_user_memory(&self, _: &UserMemory) {}
        fn utlb_init(&self, _: u32) -> Result<(), Error> {
            Ok(())
        }
        fn utlb_install(&self, first: u32, va: usize, count: u32) -> Result<(), Error> {
            self.0.lock().unwrap().push((first, va, count));
            Ok(())
        }
    }

    fn table(entries: u32) -> Translations {
        Translations::new(UtlbConfig {
            entries,
            ..Default::default()
        })
    }

    #[test]
    fn buffers_hit_after_install_including_sub_ranges() {
        let d = Recorder::default();
        let mut t = table(16);
        let va = 0x10_0000 + 100;
        assert_eq!(t.lookup(va, 3 * PAGE), None);
        let r = t.install(&d, va, 3 * PAGE).unwrap();
        assert_eq!((r.count, r.offset), (4, 100));
        assert_eq!(t.lookup(va, 3 * PAGE), Some(r));
        // A range inside it hits at the right entry.
        let sub = t.lookup(0x10_0000 + PAGE + 8, 10).unwrap();
        assert_eq!((sub.first, sub.count, sub.offset), (r.first + 1, 1, 8));
        assert_eq!(d.0.lock().unwrap().len(), 1);
        t.forget(0x10_0000, 4 * PAGE);
        assert_eq!(t.lookup(va, 8), None);
    }

    #[test]
    fn entries_in_use_are_never_chosen_and_lru_is() {
        let d = Recorder::default();
        let mut t = table(8);
        // Fill the table with 8 one-page buffers; hold 0..4 in flight.
        let refs: Vec<UtlbRef> = (0..8)
            .map(|k| t.install(&d, (k + 1) * 0x10_0000, 1).unwrap())
            .collect();
        for r in &refs[..4] {
            t.acquire(r);
        }
        // Touch 4 and 5 so 6 is the least recently used free-of-use entry.
        t.lookup(5 * 0x10_0000, 1).unwrap();
        t.lookup(6 * 0x10_0000, 1).unwrap();
        let n = t.install(&d, 0x90_0000, 1).unwrap();
        assert_eq!(n.first, refs[6].first);
        // Two pages: the only free-of-use pair left not newer than others.
        let two = t.install(&d, 0xa0_0000, 2 * PAGE).unwrap();
        assert!(two.first >= 4, "{two:?} overlaps entries in use");
        // Everything in use: no room, and the in-use entries are untouched.
        for i in 4..8 {
            t.refs[i] = 1;
        }
        assert!(matches!(
            t.install(&d, 0xb0_0000, 1),
            Err(Error::WouldBlock)
        ));
        for (k, r) in refs[..4].iter().enumerate() {
            assert_eq!(t.page_at[r.first as usize], (k + 1) * 0x10_0000);
        }
        t.release(&refs[0]);
        assert_eq!(t.install(&d, 0xb0_0000, 1).unwrap().first, refs[0].first);
    }

    #[test]
    fn random_pressure_never_recycles_a_held_entry() {
        use proptest::prelude::*;
        proptest!(|(ops in proptest::collection::vec((0usize..40, 1usize..4, any::<bool>()), 1..300))| {
            let d = Recorder::default();
            let mut t = table(12);
            let mut held: VecDeque<(UtlbRef, usize)> = VecDeque::new();
            for (buf, pages, release) in ops {
                if release {
                    if let Some((r, _)) = held.pop_front() { t.release(&r); }
                    continue;
                }
                let va = (buf + 1) * 0x10_0000;
                let r = match t.lookup(va, pages * PAGE) {
                    Some(r) => r,
                    None => match t.install(&d, va, pages * PAGE) {
                        Ok(r) => r,
                        Err(_) => continue,
                    },
                };
                t.acquire(&r);
                held.push_back((r, va));
                // The list picks a least recently used entry not in use,
                // as a scan of the stamps would.
                let oldest = (0..t.refs.len()).filter(|&i| t.refs[i] == 0).map(|i| t.used[i]).min();
                prop_assert_eq!(t.choose_run(1).map(|i| t.used[i]), oldest);
                // Every held run still maps the pages it was taken for.
                for (r, va) in &held {
                    for k in 0..r.count as usize {
                        prop_assert_eq!(t.page_at[r.first as usize + k], va + k * PAGE);
                    }
                }
            }
        });
    }

    #[test]
    fn misses_are_serviced_at_most_once_per_budget() {
        let d = Recorder::default();
        let mut t = Translations::new(UtlbConfig {
            entries: 64,
            fallback: true,
            miss_every_bytes: 10_000,
            bounce_bytes: 4096,
        });
        for k in 0..10 {
            t.transferred(2048);
            t.defer((k + 1) * 0x10_0000, 2048);
            t.service_deferred(&d);
        }
        // 20480 bytes: serviced after the 5th transfer, and the 10th.
        assert_eq!(d.0.lock().unwrap().len(), 2);
        assert_eq!(t.stats.misses_serviced, 2);
    }
}
