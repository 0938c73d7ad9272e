//! PIO windows (spec §6.2), CLAN's PIO apertures: memory an endpoint
//! exports that other nodes' processes map and write with plain stores,
//! no command, descriptor or doorbell on the way; tripwires on windows,
//! fired by a writer's PIO_SYNC.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use ulnic_abi::{cmd, op, tripwire_flags, wire, Cookie, ANY, PAGE_SIZE};
use zerocopy::IntoBytes;

use super::Endpoint;
use crate::backend::Domain;
use crate::error::Error;

/// What an importer needs to map a window: its exporter's node, its id
/// and its key. Hand it over by any means (a message: [`Self::to_bytes`]).
///
/// ```
/// let g = ulnic::PioGrant { node: 1, window: 7, key: 0xfeed };
/// assert_eq!(ulnic::PioGrant::from_bytes(&g.to_bytes()), g);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PioGrant {
    /// The exporter's node.
    pub node: u32,
    /// The window's id there.
    pub window: u32,
    /// Its 64 random bits: a grant is the right to map it.
    pub key: u64,
}

impl PioGrant {
    /// Its 16 bytes: node, window, key, little endian.
    ///
    /// ```
    /// let g = ulnic::PioGrant { node: 1, window: 2, key: 3 };
    /// assert_eq!(g.to_bytes()[0], 1);
    /// ```
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.node.to_le_bytes());
        b[4..8].copy_from_slice(&self.window.to_le_bytes());
        b[8..].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// The grant `to_bytes` wrote.
    ///
    /// ```
    /// let g = ulnic::PioGrant::from_bytes(&[0; 16]);
    /// assert_eq!(g.key, 0);
    /// ```
    pub fn from_bytes(b: &[u8; 16]) -> PioGrant {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        PioGrant {
            node: word(0),
            window: word(4),
            key: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }
}

/// Mapped window memory, reached only through raw copies and atomics:
/// another process writes it at any time, and a revocation can take it
/// away (an access then faults: SIGSEGV host-attached, SIGBUS in a guest).
#[derive(Debug)]
struct Mapped {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is shared with other processes by design; every
// access is a raw copy or an atomic through a raw pointer, so sharing
// the handle between threads adds nothing a second process does not.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

impl Mapped {
    fn check(&self, offset: usize, n: usize, align: usize) {
        let end = offset.checked_add(n).expect("PIO offset overflows");
        assert!(end <= self.len, "PIO access past the window's end");
        assert!(offset.is_multiple_of(align), "PIO access misaligned");
    }

    fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len(), 1);
        // SAFETY: inside the mapped window (checked), which `data` (our
        // own memory) cannot overlap. A plain copy, as into any shared
        // memory: what orders it for the other side is the atomic store
        // (release) or the fence that follows it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
    }

    fn read(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len(), 1);
        // SAFETY: as in `write`, the other way; ordered by the acquire
        // load that told the caller the bytes are there.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8, 8);
        // SAFETY: an aligned word inside the mapped window (checked),
        // which lives as long as the handle that lends it out.
        unsafe { AtomicU64::from_ptr(self.ptr.add(offset).cast()) }
    }
}

/// A PIO window this process exported ([`Endpoint::export_pio`]): its
/// memory, mapped here too. Dropping it revokes it and frees it.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// let w: ulnic::PioWindow = ep.export_pio(4096, None)?;
/// let flag = w.word(0);
/// while flag.load(std::sync::atomic::Ordering::Acquire) == 0 {}
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct PioWindow {
    dom: Arc<dyn Domain>,
    ep: u32,
    grant: PioGrant,
    mem: Mapped,
}

/// Another node's PIO window mapped here ([`Endpoint::import_pio`]).
/// Dropping it releases the import.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// # let grant = ulnic::PioGrant { node: 0, window: 1, key: 0 };
/// let w: ulnic::PioImport = ep.import_pio(grant)?;
/// w.write(8, b"hello");
/// w.word(0).store(1, std::sync::atomic::Ordering::Release);
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct PioImport {
    dom: Arc<dyn Domain>,
    ep: u32,
    id: u32,
    grant: PioGrant,
    mem: Mapped,
}

/// Makes every store this thread made before it visible to every
/// importer and exporter of the windows it wrote, before any later load
/// (a full fence, `mfence` on x86-64; spec §6.2's memory model). Data
/// followed by a flag stored with `Release` needs no flush; a store
/// followed by a load of a word the other side writes does.
///
/// ```
/// ulnic::pio_flush();
/// ```
pub fn pio_flush() {
    fence(Ordering::SeqCst);
}

macro_rules! window_access {
    ($t:ty) => {
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("grant", &self.grant)
                    .field("len", &self.mem.len)
                    .finish()
            }
        }

        impl $t {
            /// The window's bytes.
            pub fn len(&self) -> usize {
                self.mem.len
            }

            /// Never: a window has at least one page.
            pub fn is_empty(&self) -> bool {
                self.mem.len == 0
            }

            /// Its first byte in this process.
            pub fn as_ptr(&self) -> *mut u8 {
                self.mem.ptr
            }

            /// The grant that names the window.
            pub fn grant(&self) -> PioGrant {
                self.grant
            }

            /// Stores `data` at `offset` with plain stores (panics past
            /// the end).
            pub fn write(&self, offset: usize, data: &[u8]) {
                self.mem.write(offset, data)
            }

            /// Loads `out.len()` bytes at `offset` (panics past the end).
            pub fn read(&self, offset: usize, out: &mut [u8]) {
                self.mem.read(offset, out)
            }

            /// The 8-byte word at `offset` (8-aligned), for flags and
            /// counters shared with the other side.
            pub fn word(&self, offset: usize) -> &AtomicU64 {
                self.mem.word(offset)
            }
        }
    };
}
window_access!(PioWindow);
window_access!(PioImport);

impl PioWindow {
    /// Revokes the window: when this returns, no importer's store reaches
    /// it, no grant of it maps it again, and each importer was told
    /// ([`crate::Event::PioRevoked`]). It stays mapped here, with what
    /// was written, until dropped.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let w = ep.export_pio(4096, None)?;
    /// w.revoke()?;
    /// let last = w.word(0).load(std::sync::atomic::Ordering::Acquire);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn revoke(&self) -> Result<(), Error> {
        self.command(cmd::REVOKE_PIO)
    }

    fn command(&self, opcode: u32) -> Result<(), Error> {
        let p = wire::PioObject {
            endpoint: self.ep.into(),
            id: self.grant.window.into(),
        };
        self.dom.ep_command(opcode, p.as_bytes())?;
        Ok(())
    }
}

impl Drop for PioWindow {
    fn drop(&mut self) {
        let _ = self.command(cmd::RELEASE_PIO);
        if !self.mem.ptr.is_null() {
            self.dom.unmap_pio(self.mem.ptr, self.mem.len);
        }
    }
}

impl PioImport {
    /// The import's id (what [`crate::Event::PioRevoked`] names).
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for PioImport {
    fn drop(&mut self) {
        let p = wire::PioObject {
            endpoint: self.ep.into(),
            id: self.id.into(),
        };
        let _ = self.dom.ep_command(cmd::RELEASE_PIO, p.as_bytes());
        if !self.mem.ptr.is_null() {
            self.dom.unmap_pio(self.mem.ptr, self.mem.len);
        }
    }
}

/// Why a NIC without an aperture has none.
const NO_APERTURE: Error = Error::NotSupported(
    "this NIC has no PIO aperture: the device was started with --pio-aperture 0",
);

/// The window endpoint `ep` has at `offset` of the aperture, mapped here.
fn mapped(dom: &dyn Domain, ep: u32, offset: u64, len: u64) -> Result<Mapped, Error> {
    let ptr = dom.map_pio(ep, offset, len)?;
    Ok(Mapped {
        ptr,
        len: len as usize,
    })
}

impl Endpoint {
    /// Tells the device that this process stored into `[offset,
    /// offset+len)` of the window `grant` names: the tripwires its
    /// exporter set there ([`Endpoint::set_pio_tripwire`]) fire, waking a
    /// reader blocked on one (spec §6.2). The stores before it are seen
    /// by whoever the event wakes (the descriptor is posted after them).
    /// One descriptor per sync, none per store; no mapping of the window
    /// is needed. With `completion` a [`crate::Event::SendDone`] follows;
    /// a wrong or revoked grant ends in [`crate::SendError::BadCookie`], a
    /// range past the window in [`crate::SendError::OutOfRange`].
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let grant = ulnic::PioGrant { node: 1, window: 7, key: 0xfeed };
    /// let import = ep.import_pio(grant)?;
    /// import.word(0).store(42, std::sync::atomic::Ordering::Release);
    /// ep.pio_sync(&grant, 0, 8, 1, false)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn pio_sync(
        &mut self,
        grant: &PioGrant,
        offset: u64,
        len: u32,
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        let cookie = Cookie {
            node: grant.node,
            aperture: grant.window,
            generation: 0,
            key: grant.key,
        };
        let d = Self::rdma_desc(op::PIO_SYNC, &cookie, offset, 0, len, id, completion);
        self.post_rdma(d)
    }

    /// Sets a tripwire on `[offset, offset+len)` of a window this
    /// endpoint exported: when an importer's [`Endpoint::pio_sync`]
    /// touches the range, a [`crate::Event::Tripwire`] carrying `user`
    /// arrives and a blocked owner wakes, as for a tripwire on an
    /// aperture (the device does not see the stores themselves). A
    /// one-shot tripwire (`persistent = false`) fires once. Returns its
    /// id, for [`Endpoint::clear_tripwire`] and
    /// [`Endpoint::take_tripwire_fired`].
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let w = ep.export_pio(4096, None)?;
    /// let tw = ep.set_pio_tripwire(&w, 0, 4096, false, 7)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_pio_tripwire(
        &self,
        window: &PioWindow,
        offset: u64,
        len: u64,
        persistent: bool,
        user: u64,
    ) -> Result<u32, Error> {
        let mut flags = tripwire_flags::WRITE | tripwire_flags::PIO;
        if persistent {
            flags |= tripwire_flags::PERSISTENT;
        }
        self.set_tripwire_on(window.grant.window, offset, len, flags, user)
    }

    /// Exports a PIO window of `bytes` (rounded up to whole pages) that
    /// node `importer` (or any node: `None`) may map with the grant
    /// [`PioWindow::grant`] names. Its memory, zero-filled, is mapped
    /// here as well. Fails with `ENOSPC` when the aperture has no room
    /// (at most 4 windows mapped per process, spec §3), `EOPNOTSUPP`
    /// where PIO windows are not available.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let w = ep.export_pio(64 << 10, Some(1))?;
    /// let grant = w.grant();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn export_pio(&self, bytes: usize, importer: Option<u32>) -> Result<PioWindow, Error> {
        if !self.dom.has_pio() {
            return Err(NO_APERTURE);
        }
        let pages = (bytes as u64).div_ceil(PAGE_SIZE);
        let pages = u32::try_from(pages).map_err(|_| Error::InvalidArgument("window too large"))?;
        let p = wire::ExportPio {
            endpoint: self.id.into(),
            pages: pages.into(),
            importer: importer.unwrap_or(ANY).into(),
            reserved: 0.into(),
        };
        let r = self.dom.ep_command(cmd::EXPORT_PIO, p.as_bytes())?;
        let out: wire::PioExported = wire::read(&r);
        let grant = PioGrant {
            node: self.dom.info().node,
            window: out.window.get(),
            key: out.key.get(),
        };
        let len = u64::from(pages) * PAGE_SIZE;
        let mut w = PioWindow {
            dom: self.dom.clone(),
            ep: self.id,
            grant,
            mem: Mapped {
                ptr: std::ptr::null_mut(),
                len: 0,
            },
        };
        w.mem = mapped(&*self.dom, self.id, out.offset.get(), len)?;
        Ok(w)
    }

    /// Maps the window `grant` names into this process. A forged,
    /// revoked or foreign grant fails with `ENOENT`, a full aperture with
    /// `ENOSPC`.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let grant = ulnic::PioGrant { node: 0, window: 1, key: 0 };
    /// let w = ep.import_pio(grant)?;
    /// w.write(0, &[1, 2, 3]);
    /// ulnic::pio_flush();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn import_pio(&self, grant: PioGrant) -> Result<PioImport, Error> {
        if !self.dom.has_pio() {
            return Err(NO_APERTURE);
        }
        let p = wire::ImportPio {
            endpoint: self.id.into(),
            node: grant.node.into(),
            window: grant.window.into(),
            reserved: 0.into(),
            key: grant.key.into(),
        };
        let r = match self.dom.ep_command(cmd::IMPORT_PIO, p.as_bytes()) {
            Err(Error::Driver(ulnic_host_attach::Error::Command { status, .. }))
                if status == ulnic_abi::status::NOT_SUPPORTED =>
            {
                // This NIC has an aperture: the window's node is elsewhere.
                return Err(Error::NotSupported(
                    "the window's node is served by another device process (a fabric \
                     spread over devices shares no memory between them): PIO windows \
                     reach only nodes of the same device process",
                ));
            }
            r => r?,
        };
        let out: wire::PioImported = wire::read(&r);
        let len = u64::from(out.pages.get()) * PAGE_SIZE;
        let mut w = PioImport {
            dom: self.dom.clone(),
            ep: self.id,
            id: out.import.get(),
            grant,
            mem: Mapped {
                ptr: std::ptr::null_mut(),
                len: 0,
            },
        };
        w.mem = mapped(&*self.dom, self.id, out.offset.get(), len)?;
        Ok(w)
    }
}
