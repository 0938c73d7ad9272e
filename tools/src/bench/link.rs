//! The message link the ping-pong and stream benchmarks run over, and
//! the shared-memory spin ring (the baseline, and the ring PIO windows
//! carry).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// How a receiver waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Busy-poll, yielding the core to other runnable threads between polls.
    Poll,
    /// Block in the kernel until data arrives.
    Block,
}

/// A message link between the two peers; `recv` reads every payload byte.
pub trait Link {
    fn send(&mut self, data: &[u8]) -> io::Result<()>;
    /// Receives one message into `buf`, returning its length.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// The mode that really runs.
    fn mode(&self) -> Mode;

    /// Sends a message of `scratch.len()` bytes that `fill` writes. Sockets
    /// and the shm ring take a user buffer and copy it, so it is written
    /// into `scratch` and sent; ulnic overrides this to write it in place
    /// in its registered segment, as its applications do.
    fn send_filled(
        &mut self,
        scratch: &mut [u8],
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<()> {
        fill(scratch);
        self.send(scratch)
    }

    /// Receives one message and shows it to `look` where it lies: sockets
    /// and the shm ring copy it into `scratch` first; ulnic overrides this
    /// to show the delivered buffer in its segment. Returns the length.
    fn recv_seen(
        &mut self,
        scratch: &mut [u8],
        look: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<usize> {
        let n = self.recv(scratch)?;
        look(&scratch[..n])?;
        Ok(n)
    }

    /// ulnic: doorbells this side's endpoint has rung so far (the
    /// device's `doorbells` counter, docs/spec.md §5.8); other transports
    /// have none.
    fn doorbells(&self) -> Option<u64> {
        None
    }
}

/// Bytes of each direction's ring in the shared-memory baseline.
pub const SHM_RING: usize = 4 << 20;

/// One direction of the shared-memory baseline: an SPSC byte ring with
/// free-running head and tail counters, messages length-prefixed.
pub struct ShmRing {
    /// Its 128-byte header (head, tail), then `SHM_RING` bytes of data.
    pub base: *mut u8,
}

impl ShmRing {
    fn head(&self) -> &AtomicU64 {
        // SAFETY: the mapping holds the two counters at offsets 0 and 64,
        // aligned, for as long as the ring is used.
        unsafe { &*(self.base as *const AtomicU64) }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { &*(self.base.add(64) as *const AtomicU64) }
    }
    fn data(&self) -> *mut u8 {
        // SAFETY: the data area follows the 128-byte header.
        unsafe { self.base.add(128) }
    }
    fn copy_in(&self, pos: u64, src: &[u8]) {
        let off = (pos % SHM_RING as u64) as usize;
        let first = src.len().min(SHM_RING - off);
        // SAFETY: both pieces lie inside the data area of SHM_RING bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data().add(off), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data(), src.len() - first);
        }
    }
    fn copy_out(&self, pos: u64, dst: &mut [u8]) {
        let off = (pos % SHM_RING as u64) as usize;
        let first = dst.len().min(SHM_RING - off);
        let len = dst.len();
        // SAFETY: both pieces lie inside the data area of SHM_RING bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(off), dst.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.data(), dst.as_mut_ptr().add(first), len - first);
        }
    }
}

pub struct ShmLink {
    tx: ShmRing,
    rx: ShmRing,
}

impl ShmLink {
    /// Both rings in the file at `path`, the server's first.
    pub fn open(path: &Path, server: bool) -> io::Result<ShmLink> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = 2 * (128 + SHM_RING);
        let p = ulnic_host_attach::map_shared(std::os::fd::AsRawFd::as_raw_fd(&f), len, 0)?;
        let a = p;
        // SAFETY: the second ring starts inside the mapping.
        let b = unsafe { a.add(128 + SHM_RING) };
        let (tx, rx) = if server { (b, a) } else { (a, b) };
        Ok(ShmLink {
            tx: ShmRing { base: tx },
            rx: ShmRing { base: rx },
        })
    }
}

impl ShmLink {
    /// A link over two rings already mapped: send on `tx`, receive on `rx`.
    pub fn over(tx: ShmRing, rx: ShmRing) -> ShmLink {
        ShmLink { tx, rx }
    }
}

impl Link for ShmLink {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        let need = 4 + data.len() as u64;
        let head = self.tx.head().load(Ordering::Relaxed);
        while head + need - self.tx.tail().load(Ordering::Acquire) > SHM_RING as u64 {
            std::thread::yield_now();
        }
        self.tx.copy_in(head, &(data.len() as u32).to_le_bytes());
        self.tx.copy_in(head + 4, data);
        self.tx.head().store(head + need, Ordering::Release);
        Ok(())
    }
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let tail = self.rx.tail().load(Ordering::Relaxed);
        while self.rx.head().load(Ordering::Acquire) == tail {
            std::thread::yield_now();
        }
        let mut h = [0u8; 4];
        self.rx.copy_out(tail, &mut h);
        let n = u32::from_le_bytes(h) as usize;
        if n > buf.len() {
            return Err(io::Error::other("message larger than buffer"));
        }
        self.rx.copy_out(tail + 4, &mut buf[..n]);
        self.rx.tail().store(tail + 4 + n as u64, Ordering::Release);
        Ok(n)
    }
    fn mode(&self) -> Mode {
        Mode::Poll
    }
}
