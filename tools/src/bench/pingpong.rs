//! `ulnic bench`: ping-pong and stream between two processes over ulnic and,
//! in the same run, over the baselines (TCP loopback, a Unix socket, and a
//! raw shared-memory ring, the physical limit of the machine).
//!
//! Every payload byte is written by the sender and read by the receiver.
//! The parent process starts a device (unless pointed at one) and two child
//! processes (`ulnic bench-peer`), collects their results and prints them.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::{Duration, Instant};

use serde::Serialize;

use super::link::{Link, Mode, ShmLink, SHM_RING};
use super::payload::{check_bytes, fill_bytes, Touch};
use super::record::Record;

/// Which workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Round trips of one message each way.
    Pingpong,
    /// One-way messages as fast as flow control allows.
    Stream,
    /// One-sided RDMA writes into another node's aperture (bandwidth),
    /// against memcpy.
    RdmaWrite,
    /// One-sided RDMA reads from another node's aperture, against memcpy.
    RdmaRead,
    /// Latency from a remote write to the blocked owner of a tripwire
    /// running, against a thread woken by a Unix socket.
    Tripwire,
    /// Ping-pong and stream over the distributed message queue (RDMA and
    /// tripwires), against a Unix socket pair.
    Dmq,
    /// The UTLB: translation costs for 1, 4 and 16 pages (VMMC-2 Table 1)
    /// against memcpy, then a stream from N distinct pages swept past the
    /// table size under each miss policy (Schoinas & Hill), against
    /// single-copy.
    Utlb,
    /// The performance table in one run: ulnic beside the baselines and
    /// the peers a user installs (fi_pingpong over shm and tcp, sockperf,
    /// fabtests) in interleaved rounds with paired ratios: round trips,
    /// CPU per blocking round trip, streams, message rate, RDMA writes,
    /// 4096 endpoints against one; with --guests, round trips between
    /// QEMU guests and `cluster up` times. A peer not installed is
    /// reported missing.
    Compare,
    /// Unmodified Debian programs (redis-benchmark and redis-server,
    /// iperf3, sockperf) under the LD_PRELOAD layer against the same
    /// programs over the kernel's TCP.
    Apps,
    /// Round trips over PIO windows (CLAN's PIO apertures: plain stores
    /// into a window the peer exported) beside the shared-memory spin
    /// ring and ulnic messages, host-attached, in interleaved rounds
    /// (8 bytes unless --size). Between guests: `ulnic cluster bench`.
    Pio,
}

impl Workload {
    /// Whether this is an RDMA workload (one process, no peer).
    pub fn is_rdma(self) -> bool {
        matches!(
            self,
            Workload::RdmaWrite
                | Workload::RdmaRead
                | Workload::Tripwire
                | Workload::Dmq
                | Workload::Utlb
        )
    }
}

/// Which transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// The ulnic device, host-attached.
    Ulnic,
    /// TCP over loopback.
    Tcp,
    /// A Unix stream socket.
    Unix,
    /// A shared-memory ring between the two processes.
    Shm,
    /// The same ring in PIO windows of the ulnic device (docs/spec.md
    /// §6.2): each host-attached peer stores into the window the other
    /// exported; the device only maps them.
    Pio,
}

/// One benchmark to run.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Workload.
    pub workload: Workload,
    /// Transport.
    pub transport: Transport,
    /// Message size in bytes.
    pub size: u32,
    /// Measured iterations (round trips or messages).
    pub iters: u64,
    /// Receive mode.
    pub mode: Mode,
    /// Flip one byte of measured message N (from 0): a fault injected on
    /// purpose, which the receiver's check must catch.
    pub corrupt_at: Option<u64>,
    /// ulnic on a host: the client's and the server's nodes (sockets
    /// `nodeN.sock` in the device directory).
    pub nodes: (u32, u32),
    /// How payloads are touched.
    pub payload: Touch,
    /// ulnic: endpoints each peer keeps open (see `ulnic bench --help`).
    pub endpoints: u32,
    /// ulnic: each peer's endpoint reports to an `EventQueue` and blocks
    /// through it (see `ulnic bench --help`).
    pub event_queue: bool,
}

// ---------------------------------------------------------------- streams

/// TCP and Unix sockets: length-prefixed messages.
struct StreamLink<S: Read + Write> {
    s: S,
}

impl<S: Read + Write> Link for StreamLink<S> {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        let mut frame = Vec::with_capacity(4 + data.len());
        frame.extend_from_slice(&(data.len() as u32).to_le_bytes());
        frame.extend_from_slice(data);
        self.s.write_all(&frame)
    }
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut h = [0u8; 4];
        self.s.read_exact(&mut h).map_err(silent_peer)?;
        let n = u32::from_le_bytes(h) as usize;
        if n > buf.len() {
            return Err(io::Error::other("message larger than buffer"));
        }
        self.s.read_exact(&mut buf[..n]).map_err(silent_peer)?;
        Ok(n)
    }
    fn mode(&self) -> Mode {
        Mode::Block
    }
}

/// How long a TCP peer may stay silent in the middle of a benchmark: a
/// peer whose guest powered off without a reset must end the run with an
/// error, not leave it blocked in a read for ever (the 8-guest soak, issue
/// 29 point 9, saw a client connected as its server's guest went away).
const PEER_SILENCE: Duration = Duration::from_secs(60);

/// A read that timed out, said as what it means.
fn silent_peer(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer sent nothing for {} s", PEER_SILENCE.as_secs()),
        ),
        _ => e,
    }
}

/// Bounds how long `s` blocks in a read or a write.
fn bounded(s: TcpStream) -> io::Result<TcpStream> {
    s.set_read_timeout(Some(PEER_SILENCE))?;
    s.set_write_timeout(Some(PEER_SILENCE))?;
    Ok(s)
}

// ---------------------------------------------------------------- ulnic

/// The port both bench peers bind on their nodes.
const BENCH_PORT: u32 = 1;
const TAG_DATA: u32 = 0;
const TAG_CREDIT: u32 = 1;
const TAG_HELLO: u32 = 2;
/// The send id of greetings (data sends count up from 0).
const HELLO_ID: u64 = u64::MAX;
/// Receive buffers the receiver keeps posted (and the sender's credits).
const CREDITS: u32 = 64;

/// How long a receive may wait for the peer before the run is reported as
/// stalled (far beyond any round trip, even between TCG guests).
const STALL: Duration = Duration::from_secs(30);

/// After a stall, how long to wait once the doorbell was rung by hand.
const STALL_KICKED: Duration = Duration::from_secs(5);

/// First port of the endpoints `--endpoints` adds beside the measured one.
const OTHERS_PORT: u32 = 1000;

/// Opens `n` small endpoints on `nic` (ports `OTHERS_PORT..`); each sends
/// one message to the next (in a ring) and receives one, so every one has
/// been active before the measurement starts.
fn open_others(
    nic: &ulnic::Nic,
    pd: &ulnic::ProtectionDomain,
    n: u32,
) -> io::Result<Vec<ulnic::Endpoint>> {
    let small = ulnic::EndpointConfig {
        send_entries: 2,
        recv_entries: 2,
        free_entries: 2,
        segment_bytes: 4096,
    };
    let mut eps = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut e = pd.create_endpoint(&small).map_err(io::Error::other)?;
        e.bind(OTHERS_PORT + i).map_err(io::Error::other)?;
        eps.push(e);
    }
    for (i, e) in eps.iter_mut().enumerate() {
        let to = ulnic::Address {
            node: nic.node(),
            port: OTHERS_PORT + (i as u32 + 1) % n,
        };
        e.post_send_inline(to, 0, b"hi", 0)
            .map_err(io::Error::other)?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for e in eps.iter_mut() {
        while e.poll_recv().is_none() {
            if Instant::now() > deadline {
                return Err(io::Error::other("an extra endpoint received nothing"));
            }
            std::thread::yield_now();
        }
    }
    Ok(eps)
}

/// How many distinct payload buffers a ulnic peer cycles through on each
/// side (send slots; receive buffers posted).
///
/// When nothing writes or reads payloads (`--payload none`), every message
/// goes from one send buffer into one receive buffer (the one buffer is
/// posted `CREDITS` times), as fabtests post every transfer from one tx
/// buffer into one rx buffer. When payloads are written, each message in
/// flight has its own slot, so its bytes are never rewritten while it is
/// in flight. The footprint decides whether copies run from a core's cache
/// or from memory (64 slots of 64 KiB are 8 MiB a side, beyond a core's
/// L2), so result lines say which ran (`buffers`).
pub(crate) fn ulnic_buffers(payload: Touch) -> u32 {
    if payload == Touch::None {
        1
    } else {
        CREDITS
    }
}

/// ulnic: inline sends up to INLINE_MAX, segment sends beyond; credit-based
/// flow control (the receiver returns credits every CREDITS/2 messages) so
/// nothing is ever returned for lack of a buffer.
struct UlnicLink {
    ep: ulnic::Endpoint,
    /// Endpoints kept open beside the measured one (`--endpoints`).
    _others: Vec<ulnic::Endpoint>,
    /// The queue `ep` reports to (`--event-queue`): dropped after it.
    _queue: Option<ulnic::EventQueue>,
    _nic: ulnic::Nic,
    peer: ulnic::Address,
    mode: Mode,
    slot: u64,
    /// Distinct send slots and receive buffers (`ulnic_buffers`).
    buffers: u32,
    send_seq: u64,
    credits: u32,
    consumed: u32,
}

impl UlnicLink {
    /// `socket` None: the guest device (`Nic::open`).
    /// `others`: endpoints to open first, each of which sends one message
    /// to the next and receives one, then stays open and idle.
    /// `payload` decides the buffers (`ulnic_buffers`).
    fn open(
        socket: Option<&Path>,
        peer_node: u32,
        max: u32,
        mode: Mode,
        others: u32,
        payload: Touch,
        event_queue: bool,
    ) -> io::Result<UlnicLink> {
        let buffers = ulnic_buffers(payload);
        let slot = u64::from(max.max(1)).div_ceil(4096) * 4096;
        let seg = (slot * u64::from(2 * CREDITS)) as usize;
        // A small endpoint: its control pages, a segment page, its table,
        // with room to spare.
        let small_bytes = (others as usize) * 8 * 4096;
        std::env::set_var(
            ulnic::MEMORY_ENV,
            (seg + small_bytes + (16 << 20)).to_string(),
        );
        let nic = match socket {
            Some(s) => ulnic::Nic::attach(s),
            None => ulnic::Nic::open(),
        }
        .map_err(io::Error::other)?;
        let pd = nic.alloc_pd().map_err(io::Error::other)?;
        let others = open_others(&nic, &pd, others)?;
        let cfg = ulnic::EndpointConfig {
            send_entries: CREDITS,
            recv_entries: 2 * CREDITS,
            free_entries: CREDITS,
            segment_bytes: seg,
        };
        let mut ep = pd.create_endpoint(&cfg).map_err(io::Error::other)?;
        ep.bind(BENCH_PORT).map_err(io::Error::other)?;
        let queue = if event_queue {
            let q = ulnic::EventQueue::new(&pd).map_err(io::Error::other)?;
            q.attach(&mut ep, 0).map_err(io::Error::other)?;
            Some(q)
        } else {
            None
        };
        // Receive buffers live in the second half of the segment; with
        // one buffer, every descriptor names the same bytes.
        for i in 0..u64::from(CREDITS) {
            let at = u64::from(CREDITS) + i % u64::from(buffers);
            ep.post_free(slot * at, slot as u32, i)
                .map_err(io::Error::other)?;
        }
        Ok(UlnicLink {
            ep,
            _others: others,
            _queue: queue,
            _nic: nic,
            peer: ulnic::Address {
                node: peer_node,
                port: BENCH_PORT,
            },
            mode,
            slot,
            buffers,
            send_seq: 0,
            credits: CREDITS,
            consumed: 0,
        })
    }

    /// Client: greet until the server answers (sends to a server not yet
    /// bound come back as NO_ENDPOINT and are simply repeated). Server:
    /// wait for the greeting and answer it.
    fn handshake(&mut self, server: bool) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last = Instant::now() - Duration::from_secs(1);
        loop {
            if Instant::now() > deadline {
                return Err(io::Error::other("the other node never answered"));
            }
            if !server && last.elapsed() > Duration::from_millis(20) && self.ep.send_space() > 0 {
                self.ep
                    .post_send_inline(self.peer, TAG_HELLO, &[], HELLO_ID)
                    .map_err(io::Error::other)?;
                last = Instant::now();
            }
            while self.ep.poll_event().is_some() {}
            if let Some(m) = self.ep.poll_recv() {
                // A hello of ours the fabric handed back (the server was
                // not bound yet: spec §10.4) is not the server's answer.
                if m.tag == TAG_HELLO && !m.returned {
                    if server {
                        self.ep
                            .post_send_inline(self.peer, TAG_HELLO, &[], HELLO_ID)
                            .map_err(io::Error::other)?;
                    }
                    return Ok(());
                }
            }
            std::thread::yield_now();
        }
    }

    fn handle_events(&mut self) -> io::Result<()> {
        while let Some(ev) = self.ep.poll_event() {
            if let ulnic::Event::SendFailed { id, reason, .. } = ev {
                // A greeting sent before the peer was bound comes back
                // (NO_ENDPOINT), possibly after the peer has answered one.
                if id != HELLO_ID {
                    return Err(io::Error::other(format!("send {id} failed: {reason}")));
                }
            }
        }
        Ok(())
    }

    fn post(&mut self, tag: u32, data: &[u8]) -> io::Result<()> {
        if data.len() <= ulnic::INLINE_MAX as usize {
            return self.post_descriptor(tag, Some(data), data.len());
        }
        // Written once, before any retry (the slot is free: see
        // `send_filled`).
        self.ep.write_segment(self.send_offset(), data);
        self.post_descriptor(tag, None, data.len())
    }

    /// The segment offset of the next send's slot.
    fn send_offset(&self) -> usize {
        ((self.send_seq % u64::from(self.buffers)) * self.slot) as usize
    }

    /// Posts the next send: `inline` bytes, or `len` bytes already in its
    /// slot; retried while the send ring is full.
    fn post_descriptor(&mut self, tag: u32, inline: Option<&[u8]>, len: usize) -> io::Result<()> {
        let off = self.send_offset() as u64;
        loop {
            let r = match inline {
                Some(data) => self
                    .ep
                    .post_send_inline(self.peer, tag, data, self.send_seq),
                None => self
                    .ep
                    .post_send(self.peer, tag, off, len as u32, self.send_seq, false),
            };
            match r {
                Ok(()) => {
                    self.send_seq += 1;
                    return Ok(());
                }
                Err(ulnic::Error::WouldBlock) => {
                    self.handle_events()?;
                    std::thread::yield_now();
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }

    /// Next message of any tag from the peer, waiting per the mode. One of
    /// ours handed back by the fabric is skipped: its send failed, which
    /// its TX_ERROR event reports.
    ///
    /// A peer silent for `STALL` is a fault, never a hang: the endpoint's
    /// state is recorded, its doorbell rung by hand (a descriptor the
    /// device never looked at would move then), and after `STALL_KICKED`
    /// more the run fails, saying what it saw either way.
    fn next(&mut self) -> io::Result<ulnic::Received> {
        // The clock is read only once nothing was there: a message
        // already waiting costs no more than before.
        let mut started: Option<Instant> = None;
        let mut kicked: Option<(Instant, String)> = None;
        loop {
            if let Some(m) = self.ep.poll_recv() {
                if !m.returned {
                    if let Some((_, before)) = kicked {
                        return Err(io::Error::other(format!(
                            "stalled {} s, then a message came after the doorbell was rung by hand (a send the device did not see?); before: {before}",
                            STALL.as_secs()
                        )));
                    }
                    return Ok(m);
                }
            }
            self.handle_events()?;
            let waited = started.get_or_insert_with(Instant::now).elapsed();
            if waited > STALL {
                match &kicked {
                    None => {
                        kicked = Some((Instant::now(), self.describe()));
                        self.ep.ring_doorbell();
                    }
                    Some((at, before)) if at.elapsed() > STALL_KICKED => {
                        return Err(io::Error::other(format!(
                            "nothing from the peer for {} s, nor after the doorbell was rung by hand; before: {before}; now: {}",
                            waited.as_secs(),
                            self.describe()
                        )));
                    }
                    Some(_) => {}
                }
            }
            match self.mode {
                Mode::Poll => std::thread::yield_now(),
                Mode::Block => {
                    self.ep
                        .wait(Duration::from_secs(1))
                        .map_err(io::Error::other)?;
                }
            }
        }
    }

    /// This side's state for a stall report: sequence, credits, rings and
    /// the device's counters for the endpoint.
    fn describe(&self) -> String {
        let stats = self.ep.stats().map_or_else(
            |e| format!("stats unavailable: {e}"),
            |s| {
                s.iter()
                    .filter(|(_, v)| *v != 0)
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        );
        format!(
            "sent {} credits {} consumed {} send_space {} sends_done {} control block: {} device: {stats}",
            self.send_seq,
            self.credits,
            self.consumed,
            self.ep.send_space(),
            self.ep.sends_done(),
            self.ep.control_words()
        )
    }
}

impl Link for UlnicLink {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        self.wait_for_credit()?;
        self.post(TAG_DATA, data)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let cap = buf.len();
        self.recv_with(cap, &mut |d| {
            buf[..d.len()].copy_from_slice(d);
            Ok(())
        })
    }

    fn mode(&self) -> Mode {
        self.mode
    }

    fn send_filled(
        &mut self,
        scratch: &mut [u8],
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> io::Result<()> {
        self.wait_for_credit()?;
        let len = scratch.len();
        if len <= ulnic::INLINE_MAX as usize {
            fill(scratch);
            return self.post_descriptor(TAG_DATA, Some(scratch), len);
        }
        if self.buffers == 1 {
            // Messages in flight share the one slot, so nothing writes
            // payloads (`ulnic_buffers`), and no slice of bytes the device
            // may be reading is made.
            fill(scratch);
            return self.post_descriptor(TAG_DATA, None, len);
        }
        let off = self.send_offset();
        // SAFETY: the send slot is free (at most CREDITS messages are
        // unconsumed by the peer, so the send that last used it has been
        // delivered) and no other slice of it exists.
        fill(unsafe { self.ep.segment_mut(off, len) });
        self.post_descriptor(TAG_DATA, None, len)
    }

    fn recv_seen(
        &mut self,
        scratch: &mut [u8],
        look: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<usize> {
        self.recv_with(scratch.len(), look)
    }

    fn doorbells(&self) -> Option<u64> {
        let stats = self.ep.stats().ok()?;
        stats
            .iter()
            .find(|(name, _)| *name == "doorbells")
            .map(|&(_, v)| v)
    }
}

impl UlnicLink {
    fn wait_for_credit(&mut self) -> io::Result<()> {
        while self.credits == 0 {
            let m = self.next()?;
            self.take(m, 0, &mut |_| Ok(()))?;
        }
        self.credits -= 1;
        Ok(())
    }

    fn recv_with(
        &mut self,
        cap: usize,
        look: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<usize> {
        loop {
            let m = self.next()?;
            if let Some(n) = self.take(m, cap, look)? {
                return Ok(n);
            }
        }
    }

    /// Consumes a received message: credits update the sender; data of at
    /// most `cap` bytes is shown to `look` where it lies and its buffer
    /// reposted. Returns the data length.
    fn take(
        &mut self,
        m: ulnic::Received,
        cap: usize,
        look: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<Option<usize>> {
        if m.tag == TAG_HELLO {
            return Ok(None); // a repeated greeting from the start-up handshake
        }
        if m.tag == TAG_CREDIT {
            if let ulnic::Payload::Inline(d) = m.payload {
                self.credits += u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
            }
            return Ok(None);
        }
        let n = m.len as usize;
        if n > cap {
            return Err(io::Error::other("message larger than buffer"));
        }
        match m.payload {
            ulnic::Payload::Inline(d) => look(&d[..n])?,
            ulnic::Payload::Buffer { offset, id } => {
                // SAFETY: a delivered buffer is ours until posted free
                // again below; the device does not write it meanwhile.
                look(unsafe { self.ep.segment(offset as usize, n) })?;
                self.ep
                    .post_free(offset, self.slot as u32, id)
                    .map_err(io::Error::other)?;
            }
        }
        self.consumed += 1;
        if self.consumed >= CREDITS / 2 {
            let c = self.consumed;
            self.consumed = 0;
            self.post(TAG_CREDIT, &c.to_le_bytes())?;
        }
        Ok(Some(n))
    }
}

// ---------------------------------------------------------------- workloads

pub(crate) fn warmup(iters: u64) -> u64 {
    (iters / 10).clamp(10, 10_000)
}

fn client(link: &mut dyn Link, spec: &Spec) -> io::Result<Record> {
    let size = spec.size as usize;
    let mut out = vec![0u8; size];
    let mut inb = vec![0u8; size.max(4)];
    let mut rec = Record {
        bench: format!("{:?}", spec.workload).to_lowercase(),
        transport: match spec.transport {
            Transport::Ulnic => {
                let mut t = "ulnic".to_string();
                if spec.endpoints > 1 {
                    t += &format!(":{}ep", spec.endpoints);
                }
                if spec.event_queue {
                    t += ":evq";
                }
                t
            }
            t => format!("{t:?}").to_lowercase(),
        },
        size: spec.size,
        iters: spec.iters,
        mode: format!("{:?}", link.mode()).to_lowercase(),
        payload: Some(spec.payload.label().into()),
        buffers: (spec.transport == Transport::Ulnic).then(|| ulnic_buffers(spec.payload)),
        ..Default::default()
    };
    // A fault injected on purpose: one byte of one measured message
    // flipped after it was filled, which the receiver must catch.
    let corrupt_at = spec.corrupt_at;
    let touch = spec.payload;
    match spec.workload {
        // `bench pio` runs ping-pongs (over PIO windows and its peers).
        Workload::Pingpong | Workload::Pio => {
            let w = warmup(spec.iters);
            let mut samples = Vec::with_capacity(spec.iters as usize);
            let mut rung = None;
            for i in 0..w + spec.iters {
                if i == w {
                    rung = link.doorbells();
                }
                // The round trip includes writing and checking payloads
                // (when asked for), as it does for every transport.
                let t = Instant::now();
                link.send_filled(&mut out, &mut |o| {
                    fill(touch, o, i);
                    if corrupt_at.is_some_and(|n| i == w + n) {
                        corrupt(o);
                    }
                })?;
                let n = link.recv_seen(&mut inb, &mut |d| check(touch, d, i))?;
                let dt = t.elapsed().as_nanos() as u64;
                if n != size {
                    return Err(io::Error::other("echo of wrong size"));
                }
                if i >= w {
                    samples.push(dt);
                }
            }
            rec.set_latencies(&mut samples);
            rec.doorbells_per_op = per_op(rung, link.doorbells(), spec.iters);
        }
        Workload::Stream => {
            let w = warmup(spec.iters);
            for i in 0..w {
                link.send_filled(&mut out, &mut |o| fill(touch, o, i))?;
            }
            link.recv(&mut inb)?; // the receiver drained the warm-up
            let rung = link.doorbells();
            let t = Instant::now();
            for i in 0..spec.iters {
                link.send_filled(&mut out, &mut |o| {
                    fill(touch, o, i);
                    if corrupt_at == Some(i) {
                        corrupt(o);
                    }
                })?;
            }
            link.recv(&mut inb)?; // the receiver has read everything
            let s = t.elapsed().as_secs_f64();
            rec.seconds = Some(s);
            rec.mbytes_per_s = Some(spec.iters as f64 * f64::from(spec.size) / s / 1e6);
            rec.msgs_per_s = Some(spec.iters as f64 / s);
            rec.doorbells_per_op = per_op(rung, link.doorbells(), spec.iters);
        }
        Workload::RdmaWrite
        | Workload::RdmaRead
        | Workload::Tripwire
        | Workload::Dmq
        | Workload::Utlb
        | Workload::Compare
        | Workload::Apps => return Err(rdma_has_no_peers()),
    }
    Ok(rec)
}

/// Doorbells per operation between two readings of the counter.
fn per_op(before: Option<u64>, after: Option<u64>, ops: u64) -> Option<f64> {
    let rung = after?.checked_sub(before?)?;
    (ops > 0).then(|| rung as f64 / ops as f64)
}

/// Writes message `i`'s payload unless payloads are not touched.
fn fill(touch: Touch, out: &mut [u8], i: u64) {
    if touch != Touch::None {
        fill_bytes(out, i);
    }
}

/// Checks message `i`'s payload when payloads are verified.
fn check(touch: Touch, data: &[u8], i: u64) -> io::Result<()> {
    if touch == Touch::WriteVerify {
        check_bytes(data, i)?;
    }
    Ok(())
}

/// Flips the first byte (`--corrupt-at`).
fn corrupt(out: &mut [u8]) {
    if let Some(b) = out.first_mut() {
        *b ^= 0xff;
    }
}

fn rdma_has_no_peers() -> io::Error {
    io::Error::other("RDMA benchmarks run in one process (bench_rdma), not with peers")
}

fn server(link: &mut dyn Link, spec: &Spec) -> io::Result<()> {
    if spec.workload.is_rdma() {
        return Err(rdma_has_no_peers());
    }
    let size = spec.size as usize;
    let mut buf = vec![0u8; size.max(4)];
    let mut out = vec![0u8; size];
    let touch = spec.payload;
    let w = warmup(spec.iters);
    match spec.workload {
        // `bench pio` runs ping-pongs (over PIO windows and its peers).
        Workload::Pingpong | Workload::Pio => {
            for i in 0..w + spec.iters {
                let n = link.recv_seen(&mut buf, &mut |d| check(touch, d, i))?;
                // The answer is written afresh (message i's pattern), not
                // echoed, so each direction is written and checked.
                link.send_filled(&mut out[..n], &mut |o| fill(touch, o, i))?;
            }
        }
        Workload::Stream => {
            for (start, count) in [(0, w), (0, spec.iters)] {
                for i in start..count {
                    link.recv_seen(&mut buf, &mut |d| check(touch, d, i))?;
                }
                link.send(&[1])?;
            }
        }
        Workload::RdmaWrite
        | Workload::RdmaRead
        | Workload::Tripwire
        | Workload::Dmq
        | Workload::Utlb
        | Workload::Compare
        | Workload::Apps => return Err(rdma_has_no_peers()),
    }
    Ok(())
}

// ---------------------------------------------------------------- processes

/// Arguments of the hidden `bench-peer` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    /// "server" or "client".
    #[arg(long)]
    pub role: String,
    /// Workload.
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// Transport.
    #[arg(long, value_enum)]
    pub transport: Transport,
    /// Size.
    #[arg(long)]
    pub size: u32,
    /// Iterations.
    #[arg(long)]
    pub iters: u64,
    /// Mode.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// Rendezvous: socket path, TCP port, shm file, or ulnic node socket.
    #[arg(long)]
    pub at: String,
    /// Flip one byte of measured message N (see `ulnic bench --help`).
    #[arg(long)]
    pub corrupt_at: Option<u64>,
    /// ulnic in a guest: the other peer's node (default: the server is
    /// node 1 and the client node 0), so pairs of guests can run at once.
    #[arg(long)]
    pub peer_node: Option<u32>,
    /// ulnic on a host: this peer's node (default: server 1, client 0).
    #[arg(long)]
    pub my_node: Option<u32>,
    /// How payloads are touched (see `ulnic bench --help`).
    #[arg(long, value_enum, default_value = "write+verify")]
    pub payload: Touch,
    /// ulnic: endpoints this peer keeps open (see `ulnic bench --help`).
    #[arg(long, default_value_t = 1)]
    pub endpoints: u32,
    /// ulnic: block through an event queue (see `ulnic bench --help`).
    #[arg(long)]
    pub event_queue: bool,
}

/// TCP port of the benchmark server inside guests.
const GUEST_TCP_PORT: u16 = 7000;

/// Connects to node `n`'s benchmark server over the guests' Ethernet
/// segment, retrying while it boots (and while the link-local address is
/// still tentative).
fn connect_guest(n: u32) -> io::Result<TcpStream> {
    let name = std::ffi::CString::new("eth0").map_err(io::Error::other)?;
    // SAFETY: a valid NUL-terminated interface name.
    let scope = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if scope == 0 {
        return Err(io::Error::other(
            "no eth0: the guest has no cluster network",
        ));
    }
    let addr = std::net::SocketAddrV6::new(
        ulnic_images::vm::node_link_local(n),
        GUEST_TCP_PORT,
        0,
        scope,
    );
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120);
    let mut reset = false;
    // Each distinct error met while retrying, with how often: a run that
    // never connects should say whether its SYNs went unanswered or the
    // peer's address never resolved.
    let mut seen: Vec<(String, u32)> = Vec::new();
    loop {
        match TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) => {
                let text = e.to_string();
                match seen.iter_mut().find(|(t, _)| *t == text) {
                    Some((_, count)) => *count += 1,
                    None => seen.push((text, 1)),
                }
                if !reset && start.elapsed() > DEAF_AFTER {
                    reset_link();
                    reset = true;
                }
                if Instant::now() > deadline {
                    let tried: Vec<String> =
                        seen.iter().map(|(t, n)| format!("{n}x {t}")).collect();
                    eprintln!("ulnic: connecting to {addr}: {}", tried.join(", "));
                    print_network_state();
                    return Err(e);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// How long a TCP leg waits for its peer before it checks that eth0
/// receives at all.
const DEAF_AFTER: Duration = Duration::from_secs(10);

/// The 8-guest soak (issue 29 point 9) caught guests whose eth0 stopped
/// receiving (0 packets since boot in one run, 5 in another) while they
/// sent, their peer receiving and answering every neighbour solicitation:
/// a receive stall between the VDE segment and the guest's virtio-net,
/// outside ulnic. Taking the link down and up makes the driver post its
/// receive buffers and kick the queue again. Done once per leg that has
/// not met its peer within `DEAF_AFTER`, and said.
fn reset_link() {
    let rx =
        std::fs::read_to_string("/sys/class/net/eth0/statistics/rx_packets").unwrap_or_default();
    eprintln!(
        "ulnic: no peer after {} s (eth0 has received {} packets since boot); taking the link down and up",
        DEAF_AFTER.as_secs(),
        rx.trim()
    );
    // Said on the console too: the leg's own output arrives only at its end.
    let _ = std::fs::write(
        "/dev/console",
        format!(
            "ulnic-guest: no peer after 10 s, eth0 rx {}; link reset\n",
            rx.trim()
        ),
    );
    for state in ["down", "up"] {
        let _ = std::process::Command::new("ip")
            .args(["link", "set", "eth0", state])
            .status();
    }
}

/// Prints the guest's view of its Ethernet segment to stderr (addresses
/// with their flags, DAD's among them; neighbours; link state; counters)
/// for a TCP leg that could not meet its peer: the soak's only failures so
/// far were such legs, and their logs could not say why. The guest's `ip`
/// is busybox's, hence the /proc files.
fn print_network_state() {
    for args in [
        &["-6", "neigh", "show", "dev", "eth0"][..],
        &["link", "show", "eth0"][..],
    ] {
        match std::process::Command::new("ip").args(args).output() {
            Ok(out) => eprintln!(
                "ulnic: ip {}:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("ulnic: ip {}: {e}", args.join(" ")),
        }
    }
    let keep = |file: &str, line: &str| match file {
        "/proc/net/snmp6" => line.contains("Neighbor") || line.starts_with("Ip6InNoRoutes"),
        _ => true,
    };
    for file in ["/proc/net/if_inet6", "/proc/net/dev", "/proc/net/snmp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| e.to_string());
        let lines: Vec<&str> = text.lines().filter(|l| keep(file, l)).collect();
        eprintln!("ulnic: {file}:\n{}", lines.join("\n"));
    }
}

/// How long a TCP server waits for its client: longer than the client
/// tries to connect (120 s), so a client that gave up ends the server too
/// instead of leaving it (and the guest, and the cluster run) waiting for
/// ever (the 8-guest soak, issue 29 point 9, caught that once).
const ACCEPT_WAIT: Duration = Duration::from_secs(150);

/// The first connection to `l` within `wait`, or `TimedOut`.
fn accept_within(l: &TcpListener, wait: Duration, guest: bool) -> io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let start = Instant::now();
    let deadline = start + wait;
    let mut reset = false;
    loop {
        if guest && !reset && start.elapsed() > DEAF_AFTER {
            reset_link();
            reset = true;
        }
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no client connected within {} s", wait.as_secs()),
                ));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs one side of a benchmark (in a child process). The server prints
/// READY when the client may start; the client prints its JSON record.
pub fn peer(a: &PeerArgs) -> io::Result<()> {
    if a.workload == Workload::RdmaWrite && a.transport == Transport::Ulnic {
        // One-sided: the exporter (server) and the writer meet over ulnic.
        let rec = super::rdma::rdma_peer(a.role == "server", a.size, a.iters, a.peer_node)?;
        if let Some(rec) = rec {
            println!(
                "RESULT {}",
                serde_json::to_string(&rec).map_err(io::Error::other)?
            );
        }
        return Ok(());
    }
    let spec = Spec {
        workload: a.workload,
        transport: a.transport,
        size: a.size,
        iters: a.iters,
        mode: a.mode,
        corrupt_at: a.corrupt_at,
        nodes: (0, 1),
        payload: a.payload,
        endpoints: a.endpoints,
        event_queue: a.event_queue,
    };
    let is_server = a.role == "server";
    let ready = || {
        println!("READY");
        let _ = io::stdout().flush();
    };
    let mut link: Box<dyn Link> = match a.transport {
        Transport::Tcp => {
            // `at`: a loopback port (host), or in guests "listen" (server)
            // and "node=N" (client: node N's link-local address on eth0).
            if is_server {
                let l = if a.at == "listen" {
                    TcpListener::bind((std::net::Ipv6Addr::UNSPECIFIED, GUEST_TCP_PORT))?
                } else {
                    TcpListener::bind(("127.0.0.1", 0))?
                };
                println!("PORT {}", l.local_addr()?.port());
                ready();
                let s = accept_within(&l, ACCEPT_WAIT, a.at == "listen").inspect_err(|_| {
                    if a.at == "listen" {
                        print_network_state();
                    }
                })?;
                let s = bounded(s)?;
                s.set_nodelay(true)?;
                Box::new(StreamLink { s })
            } else {
                let s = match a.at.strip_prefix("node=") {
                    Some(n) => connect_guest(n.parse().map_err(io::Error::other)?)?,
                    None => TcpStream::connect((
                        "127.0.0.1",
                        a.at.parse::<u16>().map_err(io::Error::other)?,
                    ))?,
                };
                let s = bounded(s)?;
                s.set_nodelay(true)?;
                Box::new(StreamLink { s })
            }
        }
        Transport::Unix => {
            if is_server {
                let _ = std::fs::remove_file(&a.at);
                let l = UnixListener::bind(&a.at)?;
                ready();
                Box::new(StreamLink { s: l.accept()?.0 })
            } else {
                Box::new(StreamLink {
                    s: UnixStream::connect(&a.at)?,
                })
            }
        }
        Transport::Shm => {
            let l = ShmLink::open(Path::new(&a.at), is_server)?;
            if is_server {
                ready();
            }
            Box::new(l)
        }
        Transport::Pio => {
            let (mine, default_peer) = if is_server { (1, 0) } else { (0, 1) };
            let mine = a.my_node.unwrap_or(mine);
            let peer = a.peer_node.unwrap_or(default_peer);
            let sock = PathBuf::from(&a.at).join(format!("node{mine}.sock"));
            let sock = (a.at != "device").then_some(sock.as_path());
            let mut ready = ready;
            Box::new(super::pio::PioLink::open(
                sock, peer, is_server, spec.mode, &mut ready,
            )?)
        }
        Transport::Ulnic => {
            // Node 0 is the client, node 1 the server, unless told the
            // peer; `at` is the socket dir, or "device" inside a guest
            // (the device file: this node is whichever the guest is).
            let (mine, default_peer) = if is_server { (1, 0) } else { (0, 1) };
            let mine = a.my_node.unwrap_or(mine);
            let peer = a.peer_node.unwrap_or(default_peer);
            let sock = PathBuf::from(&a.at).join(format!("node{mine}.sock"));
            let mut l = UlnicLink::open(
                (a.at != "device").then_some(sock.as_path()),
                peer,
                spec.size,
                spec.mode,
                spec.endpoints.saturating_sub(1),
                spec.payload,
                spec.event_queue,
            )?;
            if a.at == "device" {
                // Guests come up at different times: meet first.
                l.handshake(is_server)?;
            }
            if is_server {
                ready();
            }
            Box::new(l)
        }
    };
    if is_server {
        server(link.as_mut(), &spec)
    } else {
        let rec = client(link.as_mut(), &spec)?;
        println!(
            "RESULT {}",
            serde_json::to_string(&rec).map_err(io::Error::other)?
        );
        Ok(())
    }
}

fn spawn_peer(spec: &Spec, role: &str, at: &str) -> io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["bench-peer", "--role", role, "--at", at])
        .args(["--workload", &format!("{:?}", spec.workload).to_lowercase()])
        .args([
            "--transport",
            &format!("{:?}", spec.transport).to_lowercase(),
        ])
        .args([
            "--size",
            &spec.size.to_string(),
            "--iters",
            &spec.iters.to_string(),
        ])
        .args(["--mode", &format!("{:?}", spec.mode).to_lowercase()])
        .args(["--payload", spec.payload.label()])
        .args(["--endpoints", &spec.endpoints.to_string()])
        .args(spec.event_queue.then_some("--event-queue"))
        .args(
            spec.corrupt_at
                .map(|n| vec!["--corrupt-at".to_string(), n.to_string()])
                .unwrap_or_default(),
        )
        .args(if spec.nodes == (0, 1) {
            Vec::new()
        } else {
            let (me, peer) = if role == "server" {
                (spec.nodes.1, spec.nodes.0)
            } else {
                spec.nodes
            };
            vec![
                "--my-node".to_string(),
                me.to_string(),
                "--peer-node".to_string(),
                peer.to_string(),
            ]
        })
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
}

/// Runs one benchmark with two child processes; `ulnic_dir` is the socket
/// directory of a running device with at least two nodes.
pub fn run_one(spec: &Spec, ulnic_dir: &Path, scratch: &Path) -> io::Result<Record> {
    let at = match spec.transport {
        Transport::Ulnic | Transport::Pio => ulnic_dir.display().to_string(),
        Transport::Unix => scratch.join("bench.sock").display().to_string(),
        Transport::Shm => {
            let p = scratch.join("bench.shm");
            let f = std::fs::File::create(&p)?;
            f.set_len(2 * (128 + SHM_RING as u64))?;
            p.display().to_string()
        }
        Transport::Tcp => String::new(),
    };
    let mut srv = spawn_peer(spec, "server", &at)?;
    let mut out = BufReader::new(
        srv.stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout"))?,
    );
    let mut at = at;
    loop {
        let mut line = String::new();
        if out.read_line(&mut line)? == 0 {
            let _ = srv.wait();
            return Err(io::Error::other(
                "benchmark server exited before it was ready",
            ));
        }
        if let Some(p) = line.strip_prefix("PORT ") {
            at = p.trim().to_string();
        }
        if line.trim() == "READY" {
            break;
        }
    }
    let mut cli = spawn_peer(spec, "client", &at)?;
    let mut cli_out = cli
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = cli_out.read_to_string(&mut s);
        s
    });
    // A peer that dies leaves the other waiting forever: give the survivor
    // a grace period, then stop it. A peer that failed closed its socket
    // before it printed why, so the survivor is not stopped at once: its
    // own error (the corrupted payload it found) must reach stderr first.
    let mut dead_since: Option<Instant> = None;
    let (cli_status, srv_status) = loop {
        match (cli.try_wait()?, srv.try_wait()?) {
            (Some(c), Some(s)) => break (c, s),
            (c, s) => {
                let failed = c.is_some_and(|c| !c.success()) || s.is_some_and(|s| !s.success());
                if c.is_some() || s.is_some() {
                    let since = *dead_since.get_or_insert_with(Instant::now);
                    let grace = Duration::from_secs(if failed { 2 } else { 10 });
                    if since.elapsed() > grace {
                        let _ = cli.kill();
                        let _ = srv.kill();
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    let rec = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| io::Error::other(format!("benchmark client failed ({cli_status})")))?;
    if !srv_status.success() {
        return Err(io::Error::other(format!(
            "benchmark server failed ({srv_status})"
        )));
    }
    serde_json::from_str(rec).map_err(io::Error::other)
}
