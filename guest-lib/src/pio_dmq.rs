//! The distributed message queue over PIO windows (CLAN §5.3.1 as CLAN
//! built it): the ring lives in a window the receiver exported, and the
//! sender stores each message straight into it with plain stores, then
//! its write index (a release store, so the payload is seen first). The
//! receiver hands back its read index the same way, in the same window.
//! No RDMA, no descriptor, no device step per message; but no tripwire
//! either (the device never sees the stores, spec §6.2), so both sides
//! wait by polling.
//!
//! Window: `[write index: u64][56 pad][read index: u64][56 pad][ring]`;
//! indices count bytes, free running; messages as [`crate::DmqReceiver`]'s
//! (`u32` length, payload, padded to 8; fixed entries one slot each).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::dmq::{take_message, DmqKind};
use crate::endpoint::pio::{PioGrant, PioImport, PioWindow};
use crate::endpoint::Endpoint;
use crate::error::Error;

const WRITE: usize = 0;
const READ: usize = 64;
/// Bytes before the ring in the window.
const HEADER: usize = 128;
const LEN_BYTES: u64 = 4;

/// Copies `data` into the ring at free-running position `pos`, wrapping.
fn ring_store(store: &dyn Fn(usize, &[u8]), ring: u64, pos: u64, data: &[u8]) {
    let at = pos % ring;
    let first = ((ring - at) as usize).min(data.len());
    store(HEADER + at as usize, &data[..first]);
    if first < data.len() {
        store(HEADER, &data[first..]);
    }
}

/// The receiving end: owns the ring, in a window it exported.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// let mut rx = ulnic::PioDmqReceiver::new(&ep, 65536, ulnic::DmqKind::Bytes, None)?;
/// let grant = rx.grant(); // give it to the sender
/// let mut m = Vec::new();
/// rx.recv(&mut m, std::time::Duration::from_secs(1))?;
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct PioDmqReceiver {
    window: PioWindow,
    ring: u64,
    kind: DmqKind,
    read: u64,
}

impl PioDmqReceiver {
    /// A queue of `ring` bytes (a non-zero multiple of 8; for fixed
    /// entries, of the entry) in a new window of `ep`, which node
    /// `sender` (or any node) may map.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let rx = ulnic::PioDmqReceiver::new(&ep, 4096, ulnic::DmqKind::Fixed { entry: 64 }, Some(1))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new(
        ep: &Endpoint,
        ring: u64,
        kind: DmqKind,
        sender: Option<u32>,
    ) -> Result<Self, Error> {
        kind.check(ring)?;
        let window = ep.export_pio(HEADER + ring as usize, sender)?;
        Ok(PioDmqReceiver {
            window,
            ring,
            kind,
            read: 0,
        })
    }

    /// The grant the sender maps the ring with.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let rx = ulnic::PioDmqReceiver::new(&ep, 4096, ulnic::DmqKind::Bytes, None)?;
    /// let bytes = rx.grant().to_bytes();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn grant(&self) -> PioGrant {
        self.window.grant()
    }

    /// Takes the next message into `out` without waiting; false when the
    /// queue is empty.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let mut rx = ulnic::PioDmqReceiver::new(&ep, 4096, ulnic::DmqKind::Bytes, None)?;
    /// let mut m = Vec::new();
    /// while rx.try_recv(&mut m)? { /* use m */ }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn try_recv(&mut self, out: &mut Vec<u8>) -> Result<bool, Error> {
        let written = self.window.word(WRITE).load(Ordering::Acquire);
        if written == self.read {
            return Ok(false);
        }
        let (kind, ring, read) = (self.kind, self.ring, self.read);
        self.read += take_message(kind, ring, read, written, out, |at, b| {
            self.ring_load(at, b)
        })?;
        self.window.word(READ).store(self.read, Ordering::Release);
        Ok(true)
    }

    /// Takes the next message, polling up to `timeout`; false on timeout.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let mut rx = ulnic::PioDmqReceiver::new(&ep, 4096, ulnic::DmqKind::Bytes, None)?;
    /// let mut m = Vec::new();
    /// let got = rx.recv(&mut m, std::time::Duration::from_millis(100))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn recv(&mut self, out: &mut Vec<u8>, timeout: Duration) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            if self.try_recv(out)? {
                return Ok(true);
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                std::thread::yield_now();
            }
        }
    }

    fn ring_load(&self, pos: u64, out: &mut [u8]) {
        let at = pos % self.ring;
        let first = ((self.ring - at) as usize).min(out.len());
        let (a, b) = out.split_at_mut(first);
        self.window.read(HEADER + at as usize, a);
        self.window.read(HEADER, b);
    }
}

/// The sending end: stores messages into the receiver's window.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// # let grant = ulnic::PioGrant { node: 1, window: 1, key: 0 };
/// let mut tx = ulnic::PioDmqSender::new(&ep, grant, 65536, ulnic::DmqKind::Bytes)?;
/// tx.send(b"hello", std::time::Duration::from_secs(1))?;
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct PioDmqSender {
    import: PioImport,
    ring: u64,
    kind: DmqKind,
    write: u64,
}

impl PioDmqSender {
    /// Maps the receiver's ring of `ring` bytes (as it was made) with
    /// its grant.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let grant = ulnic::PioGrant { node: 1, window: 1, key: 0 };
    /// let tx = ulnic::PioDmqSender::new(&ep, grant, 4096, ulnic::DmqKind::Fixed { entry: 64 })?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new(ep: &Endpoint, grant: PioGrant, ring: u64, kind: DmqKind) -> Result<Self, Error> {
        kind.check(ring)?;
        let import = ep.import_pio(grant)?;
        if import.len() < HEADER + ring as usize {
            return Err(Error::InvalidArgument(
                "the window is smaller than the ring",
            ));
        }
        let write = import.word(WRITE).load(Ordering::Acquire);
        Ok(PioDmqSender {
            import,
            ring,
            kind,
            write,
        })
    }

    /// Queues `data`, polling up to `timeout` while the ring is full;
    /// `WouldBlock` if still full then.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let mut tx = ulnic::PioDmqSender::new(&ep, ulnic::PioGrant { node: 1, window: 1, key: 0 }, 4096, ulnic::DmqKind::Bytes)?;
    /// tx.send(&[1, 2, 3], std::time::Duration::from_secs(1))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn send(&mut self, data: &[u8], timeout: Duration) -> Result<(), Error> {
        let len = data.len() as u64;
        let need = self.kind.room_for(len, self.ring)?;
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            let read = self.import.word(READ).load(Ordering::Acquire);
            if self.write.wrapping_sub(read) + need <= self.ring {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                if Instant::now() >= deadline {
                    return Err(Error::WouldBlock);
                }
                std::thread::yield_now();
            }
        }
        let store = |at: usize, d: &[u8]| self.import.write(at, d);
        ring_store(&store, self.ring, self.write, &(len as u32).to_le_bytes());
        ring_store(&store, self.ring, self.write + LEN_BYTES, data);
        self.write += need;
        // Release: the message is in place before the index says so.
        self.import.word(WRITE).store(self.write, Ordering::Release);
        Ok(())
    }
}
