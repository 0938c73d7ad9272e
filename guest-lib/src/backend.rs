//! How the library reaches a device: host attach (vhost-user, this process
//! plays the driver) or the Linux driver (`/dev/ulnicN`). Both give an
//! endpoint's control region and segment as memory mapped in this process.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

use ulnic_abi::{DeviceInfo, RingLayout};

use crate::error::Error;

/// An endpoint's memory as mapped in this process.
pub(crate) struct EpMemory {
    /// Endpoint id on its node.
    pub id: u32,
    pub ctrl: *mut u8,
    pub ctrl_len: usize,
    pub seg: *mut u8,
    pub seg_len: usize,
    /// The value that rings its domain's doorbell page (the domain's queue
    /// index), when the domain has one mapped (`Domain::doorbell_mapped`).
    pub doorbell_queue: u16,
}

// SAFETY: the pointers name shared mappings that live as long as the
// endpoint; all access goes through bounds-checked copies or atomics.
unsafe impl Send for EpMemory {}
// SAFETY: as above.
unsafe impl Sync for EpMemory {}

impl EpMemory {
    fn check(len: usize, off: usize, n: usize) {
        assert!(
            off.checked_add(n).is_some_and(|e| e <= len),
            "ulnic: access {off}+{n} outside a {len}-byte region"
        );
    }

    /// The aligned u32 at `off` in the control region.
    pub fn word(&self, off: u64) -> &AtomicU32 {
        let off = off as usize;
        Self::check(self.ctrl_len, off, 4);
        assert!(off.is_multiple_of(4));
        // SAFETY: in bounds and aligned (the region is page aligned); the
        // mapping outlives `&self`; AtomicU32 has u32's layout.
        unsafe { &*self.ctrl.add(off).cast::<AtomicU32>() }
    }

    /// The aligned u64 at `off` in the segment.
    pub fn seg_word64(&self, off: usize) -> &AtomicU64 {
        Self::check(self.seg_len, off, 8);
        assert!(
            off.is_multiple_of(8),
            "ulnic: unaligned 64-bit word at {off}"
        );
        // SAFETY: in bounds and aligned (the segment is page aligned); the
        // mapping outlives `&self`; AtomicU64 has u64's layout.
        unsafe { &*self.seg.add(off).cast::<AtomicU64>() }
    }

    /// Copies into the control region.
    pub fn ctrl_write(&self, off: u64, data: &[u8]) {
        Self::check(self.ctrl_len, off as usize, data.len());
        // SAFETY: bounds checked; plain bytes in shared memory.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ctrl.add(off as usize), data.len())
        }
    }

    /// Copies out of the control region.
    pub fn ctrl_read(&self, off: u64, out: &mut [u8]) {
        Self::check(self.ctrl_len, off as usize, out.len());
        // SAFETY: bounds checked.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ctrl.add(off as usize), out.as_mut_ptr(), out.len())
        }
    }

    /// Copies into the segment.
    pub fn seg_write(&self, off: usize, data: &[u8]) {
        Self::check(self.seg_len, off, data.len());
        // SAFETY: bounds checked.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.seg.add(off), data.len()) }
    }

    /// Copies out of the segment.
    pub fn seg_read(&self, off: usize, out: &mut [u8]) {
        Self::check(self.seg_len, off, out.len());
        // SAFETY: bounds checked.
        unsafe { std::ptr::copy_nonoverlapping(self.seg.add(off), out.as_mut_ptr(), out.len()) }
    }
}

/// One protection domain on some device.
pub(crate) trait Domain: Send + Sync {
    /// The device's information.
    fn info(&self) -> &DeviceInfo;
    /// Allocates, registers and maps an endpoint.
    fn create_endpoint(&self, layout: &RingLayout, segment_bytes: usize)
        -> Result<EpMemory, Error>;
    /// Destroys an endpoint and releases its memory.
    fn destroy_endpoint(&self, ep: &EpMemory);
    /// A control command on one of this domain's endpoints (the payload's
    /// first u32 is its id).
    fn ep_command(&self, opcode: u32, payload: &[u8]) -> Result<Vec<u8>, Error>;
    /// Rings an endpoint's doorbell.
    fn ring_doorbell(&self, ep: &EpMemory);
    /// Whether ringing is a store to a page mapped here rather than a call.
    fn doorbell_mapped(&self) -> bool {
        false
    }
    /// Blocks until the endpoint is notified (true) or `timeout` (false).
    fn wait(&self, ep: u32, timeout: Duration) -> Result<bool, Error>;
    /// A file descriptor readable while one of the domain's endpoints is
    /// notified (the Linux driver's open file; under host attach the
    /// notification queue's call eventfd, shared by the attach's domains).
    fn notification_fd(&self) -> Option<std::os::fd::RawFd>;
    /// Takes every notification of the domain's endpoints (under host
    /// attach, of the attachment's): the endpoints notified. Never blocks.
    fn take_notified(&self) -> Result<Vec<u32>, Error>;
    /// A new watcher (spec §6 "Several waiters", §9): a descriptor whose
    /// 8-byte count grows with every notification of the endpoints it
    /// watches (the driver's watcher; under host attach an eventfd).
    fn new_watcher(&self) -> Result<std::os::fd::OwnedFd, Error>;
    /// Which watchers can watch this domain's endpoints: those made from
    /// a domain of the same pool (the driver's watchers belong to one
    /// device; under host attach any eventfd will do, pool 0).
    fn watcher_pool(&self) -> u64 {
        0
    }
    /// Makes `watcher` watch endpoint `ep` of this domain, or stop.
    fn watch(&self, ep: u32, watcher: std::os::fd::RawFd, on: bool) -> Result<(), Error>;
    /// A descriptor a waiter polls beside its watcher, and reads with
    /// [`Domain::feed_watchers`] when readable, where this process itself
    /// reads the records that feed watchers (host attach); `None` where
    /// the driver feeds them.
    fn watch_feed(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Reads the records that came, feeding watchers (see `watch_feed`).
    fn feed_watchers(&self) {}
    /// Whether this process's watchers of this domain's endpoints are fed
    /// at all (false in a forked child under host attach, whose parent
    /// reads the notification queue).
    fn watchers_fed(&self) -> bool {
        true
    }
    /// Memory for user buffers the device can reach once their pages are
    /// installed in the UTLB (page aligned, zeroed).
    fn alloc_user_memory(&self, bytes: usize) -> Result<UserMemory, Error>;
    /// Returns memory from `alloc_user_memory`.
    fn free_user_memory(&self, m: &UserMemory);
    /// Gives the domain a UTLB of `entries` entries (driver: allocates the
    /// table, UTLB_SET_TABLE).
    fn utlb_init(&self, entries: u32) -> Result<(), Error>;
    /// The endpoint memory the device holds now and the most it may
    /// (bytes), where the backend bounds it: the driver's budget (spec
    /// §9, sysfs), the attachment's shared memory. `None`: unknown.
    /// Whether PIO windows can be mapped here (spec §6.2).
    fn has_pio(&self) -> bool {
        false
    }

    /// Maps endpoint `ep`'s PIO window or import at `offset` of the
    /// aperture, `len` bytes, into this process.
    fn map_pio(&self, _ep: u32, _offset: u64, _len: u64) -> Result<*mut u8, Error> {
        Err(Error::NotSupported("no PIO aperture"))
    }

    /// Undoes `map_pio` (the window is released).
    fn unmap_pio(&self, _ptr: *mut u8, _len: usize) {}

    fn memory_use(&self) -> Option<(u64, u64)> {
        None
    }
    /// Installs the `count` pages from virtual address `va` at entries
    /// `first..first+count` (driver: pins them, writes the table,
    /// UTLB_INVALIDATE, unpins what was there). The library guarantees no
    /// posted descriptor uses these entries.
    fn utlb_install(&self, first: u32, va: usize, count: u32) -> Result<(), Error>;
}

/// User memory from `Domain::alloc_user_memory`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UserMemory {
    pub ptr: std::ptr::NonNull<u8>,
    pub len: usize,
}

// SAFETY: a description of a mapping owned by a `UserBuffer`.
unsafe impl Send for UserMemory {}
// SAFETY: as above.
unsafe impl Sync for UserMemory {}
