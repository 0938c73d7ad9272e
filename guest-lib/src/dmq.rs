//! The distributed message queue (CLAN §5.3.1), built only on apertures,
//! RDMA and tripwires: the ring lives in the receiver's memory, the sender
//! writes messages into it remotely and then advances the receiver's write
//! index with a write-immediate (which never overtakes the payload); the
//! receiver hands back its read index lazily, by write-immediate into the
//! sender's memory. Each side blocks on a tripwire on the index it waits
//! for. Two variants: byte-granular (messages packed back to back, split
//! across the ring's end) and fixed-entry (one slot per message).
//!
//! Receiver's aperture: `[write index: u64][56 bytes pad][ring]`.
//! Sender's aperture: `[read index: u64]`. Indices count bytes, free running.
//! A message is `u32 length` then the payload, padded to 8 bytes (fixed
//! entries: the slot size).

use std::time::{Duration, Instant};

use ulnic_abi::Cookie;

use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::types::{Event, Immediate, Permissions, SendError, TripwireOn};

/// Bytes before the ring in the receiver's aperture.
const HEADER: u64 = 64;
/// Length prefix of each message.
const LEN_BYTES: u64 = 4;

fn pad8(n: u64) -> u64 {
    n.next_multiple_of(8)
}

/// Which flavour of queue.
///
/// ```
/// let k = ulnic::DmqKind::Fixed { entry: 256 };
/// assert_ne!(k, ulnic::DmqKind::Bytes);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmqKind {
    /// Messages packed back to back (any size up to the ring's).
    Bytes,
    /// One slot of `entry` bytes (a multiple of 8, prefix included) per
    /// message.
    Fixed {
        /// Slot size.
        entry: u32,
    },
}

impl DmqKind {
    pub(crate) fn footprint(self, len: u64) -> u64 {
        match self {
            DmqKind::Bytes => pad8(LEN_BYTES + len),
            DmqKind::Fixed { entry } => u64::from(entry),
        }
    }
    /// The ring bytes a message of `len` bytes takes, or why it cannot be
    /// queued at all.
    pub(crate) fn room_for(self, len: u64, ring: u64) -> Result<u64, Error> {
        let need = self.footprint(len);
        if need > ring
            || len > u64::from(u32::MAX)
            || (self != DmqKind::Bytes && LEN_BYTES + len > need)
        {
            return Err(Error::InvalidArgument("message larger than a queue entry"));
        }
        Ok(need)
    }

    pub(crate) fn check(self, ring: u64) -> Result<(), Error> {
        if ring == 0 || !ring.is_multiple_of(8) {
            return Err(Error::InvalidArgument(
                "ring length must be a non-zero multiple of 8",
            ));
        }
        if let DmqKind::Fixed { entry } = self {
            let e = u64::from(entry);
            if e <= LEN_BYTES || !e.is_multiple_of(8) || !ring.is_multiple_of(e) {
                return Err(Error::InvalidArgument(
                    "entry must be a multiple of 8 above 4 that divides the ring",
                ));
            }
        }
        Ok(())
    }
}

/// Takes the message at free-running position `read` of a ring of
/// `ring` bytes whose writer has reached `written` (not `read`) into
/// `out`, loading ring bytes with `load`; returns the bytes it took in
/// the ring. A writer's index or length past what the ring can hold is
/// refused: the sender wrote them, and it is not trusted.
pub(crate) fn take_message(
    kind: DmqKind,
    ring: u64,
    read: u64,
    written: u64,
    out: &mut Vec<u8>,
    mut load: impl FnMut(u64, &mut [u8]),
) -> Result<u64, Error> {
    if written.wrapping_sub(read) > ring {
        return Err(Error::InvalidArgument(
            "queue index corrupted by the sender",
        ));
    }
    let mut len = [0u8; LEN_BYTES as usize];
    load(read, &mut len);
    let len = u64::from(u32::from_le_bytes(len));
    let room = match kind {
        DmqKind::Bytes => ring,
        DmqKind::Fixed { entry } => u64::from(entry),
    } - LEN_BYTES;
    if len > room {
        return Err(Error::InvalidArgument(
            "message length corrupted by the sender",
        ));
    }
    out.resize(len as usize, 0);
    load(read + LEN_BYTES, out);
    Ok(kind.footprint(len))
}

/// Drains an endpoint's events (tripwire events only re-arm: their flags
/// are read directly) and returns the first failed RDMA, if any.
fn drain(ep: &mut Endpoint) -> Option<SendError> {
    let mut failed = None;
    while let Some(ev) = ep.poll_event() {
        if let Event::SendFailed { reason, .. } = ev {
            failed.get_or_insert(reason);
        }
    }
    failed
}

/// The receiving end: owns the ring in its segment.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// let ep = nic.alloc_pd()?.create_endpoint(&ulnic::EndpointConfig { segment_bytes: 1 << 20, ..Default::default() })?;
/// let mut rx = ulnic::DmqReceiver::new(ep, 0, 65536, ulnic::DmqKind::Bytes)?;
/// let cookie = rx.cookie(); // give it to the sender; take theirs:
/// # let sender_cookie = cookie;
/// rx.connect(sender_cookie);
/// let mut msg = Vec::new();
/// if rx.recv(&mut msg, std::time::Duration::from_secs(1))? { println!("{} bytes", msg.len()); }
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct DmqReceiver {
    ep: Endpoint,
    base: u64,
    ring: u64,
    kind: DmqKind,
    cookie: Cookie,
    tripwire: u32,
    read: u64,
    published: u64,
    sender: Option<Cookie>,
}

impl DmqReceiver {
    /// A queue whose header and `ring` bytes start at `offset` (8-aligned)
    /// in `ep`'s segment; exports them for writing.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let rx = ulnic::DmqReceiver::new(ep, 0, 4096, ulnic::DmqKind::Fixed { entry: 64 })?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new(ep: Endpoint, offset: u64, ring: u64, kind: DmqKind) -> Result<Self, Error> {
        kind.check(ring)?;
        ep.write_segment(offset as usize, &[0u8; HEADER as usize]);
        let cookie = ep.export(offset, HEADER + ring, Permissions::WRITE)?;
        let tripwire = ep.set_tripwire(&cookie, 0, 8, TripwireOn::Writes, true, 0)?;
        Ok(DmqReceiver {
            ep,
            base: offset,
            ring,
            kind,
            cookie,
            tripwire,
            read: 0,
            published: 0,
            sender: None,
        })
    }

    /// The cookie the sender needs.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let rx = ulnic::DmqReceiver::new(ep, 0, 4096, ulnic::DmqKind::Bytes)?;
    /// let bytes = rx.cookie().encode();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn cookie(&self) -> Cookie {
        self.cookie
    }

    /// Where to hand back the read index: the sender's cookie.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let mut rx = ulnic::DmqReceiver::new(ep, 0, 4096, ulnic::DmqKind::Bytes)?;
    /// # let c = rx.cookie();
    /// rx.connect(c);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn connect(&mut self, sender: Cookie) {
        self.sender = Some(sender);
    }

    fn ring_read(&self, at: u64, out: &mut [u8]) {
        let pos = at % self.ring;
        let first = (self.ring - pos).min(out.len() as u64) as usize;
        let start = (self.base + HEADER + pos) as usize;
        self.ep.read_segment(start, &mut out[..first]);
        if first < out.len() {
            self.ep
                .read_segment((self.base + HEADER) as usize, &mut out[first..]);
        }
    }

    /// Hands the read index back (lazily: after a quarter of the ring, or
    /// whenever the queue is found empty, so a waiting sender always wakes).
    fn publish(&mut self, empty: bool) -> Result<(), Error> {
        let Some(sender) = self.sender else {
            return Ok(());
        };
        if self.read != self.published && (empty || self.read - self.published >= self.ring / 4) {
            // Never skip it: a receiver that then blocks with its read index
            // unpublished would leave a sender waiting for room forever.
            loop {
                match self
                    .ep
                    .write_immediate(&sender, 0, Immediate::U64(self.read), 0, false)
                {
                    Ok(()) => break,
                    Err(Error::WouldBlock) => {
                        // The device is behind; its events may be what it waits on.
                        if drain(&mut self.ep).is_some() {
                            self.sender = None;
                            return Ok(());
                        }
                        std::thread::yield_now();
                    }
                    Err(e) => return Err(e),
                }
            }
            self.published = self.read;
        }
        Ok(())
    }

    /// Takes the next message into `out` without blocking; false when the
    /// queue is empty.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let mut rx = ulnic::DmqReceiver::new(ep, 0, 4096, ulnic::DmqKind::Bytes)?;
    /// let mut m = Vec::new();
    /// while rx.try_recv(&mut m)? { /* use m */ }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn try_recv(&mut self, out: &mut Vec<u8>) -> Result<bool, Error> {
        if drain(&mut self.ep).is_some() {
            // Handing back the read index failed: the sender went away.
            // What it queued is still here to read.
            self.sender = None;
        }
        let written = self.ep.read_u64(self.base);
        if written == self.read {
            self.publish(true)?;
            return Ok(false);
        }
        let (kind, ring, read) = (self.kind, self.ring, self.read);
        self.read += take_message(kind, ring, read, written, out, |at, b| {
            self.ring_read(at, b)
        })?;
        self.publish(false)?;
        Ok(true)
    }

    /// Takes the next message, blocking (on a tripwire on the write index)
    /// up to `timeout`; false on timeout.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let mut rx = ulnic::DmqReceiver::new(ep, 0, 4096, ulnic::DmqKind::Bytes)?;
    /// let mut m = Vec::new();
    /// let got = rx.recv(&mut m, std::time::Duration::from_millis(100))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn recv(&mut self, out: &mut Vec<u8>, timeout: Duration) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.try_recv(out)? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let (tw, at, read) = (self.tripwire, self.base, self.read);
            self.ep.wait_tripwire(tw, at, read, left)?;
        }
    }
}

/// The sending end: writes into the receiver's ring remotely.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// let ep = nic.alloc_pd()?.create_endpoint(&ulnic::EndpointConfig { segment_bytes: 1 << 20, ..Default::default() })?;
/// # let receiver_cookie: ulnic::Cookie = Default::default();
/// let mut tx = ulnic::DmqSender::new(ep, 0, 65536, receiver_cookie, ulnic::DmqKind::Bytes)?;
/// let my_cookie = tx.cookie(); // the receiver connects to it
/// tx.send(b"hello", std::time::Duration::from_secs(1))?;
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct DmqSender {
    ep: Endpoint,
    base: u64,
    ring: u64,
    kind: DmqKind,
    receiver: Cookie,
    cookie: Cookie,
    tripwire: u32,
    write: u64,
    read: u64,
}

impl DmqSender {
    /// A sender to the ring `receiver` names (of `ring` bytes, same kind);
    /// uses `[offset, offset + 64 + ring)` of `ep`'s segment: the read
    /// index the receiver writes back, and a mirror of the ring the
    /// payloads are staged in.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let c: ulnic::Cookie = Default::default();
    /// let tx = ulnic::DmqSender::new(ep, 0, 4096, c, ulnic::DmqKind::Bytes)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new(
        ep: Endpoint,
        offset: u64,
        ring: u64,
        receiver: Cookie,
        kind: DmqKind,
    ) -> Result<Self, Error> {
        kind.check(ring)?;
        ep.write_segment(offset as usize, &[0u8; HEADER as usize]);
        let cookie = ep.export(offset, 8, Permissions::WRITE)?;
        let tripwire = ep.set_tripwire(&cookie, 0, 8, TripwireOn::Writes, true, 0)?;
        Ok(DmqSender {
            ep,
            base: offset,
            ring,
            kind,
            receiver,
            cookie,
            tripwire,
            write: 0,
            read: 0,
        })
    }

    /// The cookie the receiver hands its read index back to.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let tx = ulnic::DmqSender::new(ep, 0, 4096, Default::default(), ulnic::DmqKind::Bytes)?;
    /// let c = tx.cookie();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn cookie(&self) -> Cookie {
        self.cookie
    }

    fn post(&mut self, f: impl Fn(&mut Endpoint) -> Result<(), Error>) -> Result<(), Error> {
        loop {
            match f(&mut self.ep) {
                Err(Error::WouldBlock) => {
                    if let Some(e) = drain(&mut self.ep) {
                        return Err(Error::Remote(e));
                    }
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// Queues `data`, blocking (on a tripwire on the read index) up to
    /// `timeout` while the ring is full; `WouldBlock` if still full then.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let mut tx = ulnic::DmqSender::new(ep, 0, 4096, Default::default(), ulnic::DmqKind::Bytes)?;
    /// tx.send(&[1, 2, 3], std::time::Duration::from_secs(1))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn send(&mut self, data: &[u8], timeout: Duration) -> Result<(), Error> {
        let len = data.len() as u64;
        let need = self.kind.room_for(len, self.ring)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = drain(&mut self.ep) {
                return Err(Error::Remote(e)); // the receiver's ring is gone
            }
            self.read = self.ep.read_u64(self.base);
            if self.write - self.read + need <= self.ring {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::WouldBlock);
            }
            let (tw, at, read) = (self.tripwire, self.base, self.read);
            self.ep.wait_tripwire(tw, at, read, left)?;
        }
        // Stage the message in the mirror at its ring position: that space
        // was consumed by the receiver, so no RDMA still reads it.
        let mut msg = Vec::with_capacity((LEN_BYTES + len) as usize);
        msg.extend_from_slice(&(len as u32).to_le_bytes());
        msg.extend_from_slice(data);
        let pos = self.write % self.ring;
        let first = (self.ring - pos).min(msg.len() as u64);
        let mirror = self.base + HEADER;
        let pieces = [(pos, 0u64, first), (0, first, msg.len() as u64 - first)];
        for (ring_at, from, n) in pieces.into_iter().filter(|p| p.2 > 0) {
            self.ep.write_segment(
                (mirror + ring_at) as usize,
                &msg[from as usize..(from + n) as usize],
            );
            let (rx, local) = (self.receiver, mirror + ring_at);
            self.post(|ep| ep.rdma_write(&rx, HEADER + ring_at, local, n as u32, 0, false))?;
        }
        self.write += need;
        let (rx, w) = (self.receiver, self.write);
        self.post(|ep| ep.write_immediate(&rx, 0, Immediate::U64(w), 0, false))
    }
}
