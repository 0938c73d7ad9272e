//! `ulnic bench rdma-write` and `rdma-read`: bandwidth of one-sided RDMA
//! between two nodes (two host attachments, each with its own memory, as
//! two machines would have), against `memcpy` between two buffers of one
//! process for the same sizes in the same run: the copy the device does,
//! without the device.
//!
//! Payloads are touched as an application would: a writer fills each
//! buffer before it is written out, a reader reads each buffer it fetched;
//! the memcpy line does the same work around its copy.

use crate::bench::nodes::NodePair;
use std::io;
use std::time::{Duration, Instant};

use ulnic::{Endpoint, EndpointConfig, Event, Nic, Permissions};

use super::payload::{fill_lines, touch_lines};
use super::record::Record;

/// Largest amount of buffer space per side.
const SPACE: usize = 32 << 20;
/// Most operations in flight.
const WINDOW: usize = 16;

/// Which direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Local buffer to remote aperture.
    Write,
    /// Remote aperture to local buffer.
    Read,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Write => "rdma-write",
            Direction::Read => "rdma-read",
        }
    }
}

fn window(size: usize) -> usize {
    (SPACE / size).clamp(1, WINDOW)
}

fn record(dir: Direction, transport: &str, size: u32, lat: &mut [u64], secs: f64) -> Record {
    let iters = lat.len() as u64;
    let mut r = Record {
        bench: dir.name().into(),
        transport: transport.into(),
        size,
        mode: "poll".into(),
        mbytes_per_s: Some(iters as f64 * f64::from(size) / secs / 1e6),
        msgs_per_s: Some(iters as f64 / secs),
        seconds: Some(secs),
        payload: Some("lines".into()),
        ..Default::default()
    };
    r.set_latencies(lat);
    r
}

/// `dst.copy_from_slice(src)` in pieces of the device's `COPY_CHUNK`, as
/// the device copies: glibc's `rep movsb`
/// path for larger blocks runs at about 2.7 GB/s on AMD EPYC under KVM when
/// both buffers are page-aligned, which would make the baseline a straw man.
fn copy_in_chunks(dst: &mut [u8], src: &[u8]) {
    let chunk = ulnic_device::memory::guest::COPY_CHUNK;
    for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
        d.copy_from_slice(s);
    }
}

/// The memcpy baseline: the same buffers, touches and window of slots.
pub fn memcpy_line(dir: Direction, size: u32, iters: u64) -> Record {
    let s = size as usize;
    let w = window(s);
    let mut src = vec![1u8; s * w];
    let mut dst = vec![0u8; s * w];
    let mut lat = Vec::with_capacity(iters as usize);
    let mut sink = 0u64;
    let start = Instant::now();
    for i in 0..iters {
        let slot = (i as usize % w) * s;
        let t = Instant::now();
        if dir == Direction::Write {
            fill_lines(&mut src[slot..slot + s], i);
        }
        copy_in_chunks(&mut dst[slot..slot + s], &src[slot..slot + s]);
        if dir == Direction::Read {
            sink = sink.wrapping_add(touch_lines(&dst[slot..slot + s]));
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    record(dir, "memcpy", size, &mut lat, secs)
}

fn endpoint(nic: &Nic, bytes: usize) -> io::Result<Endpoint> {
    let pd = nic.alloc_pd().map_err(io::Error::other)?;
    pd.create_endpoint(&EndpointConfig {
        segment_bytes: bytes.next_multiple_of(4096),
        ..Default::default()
    })
    .map_err(io::Error::other)
}

/// RDMA between the pair's client (initiator) and server (exporter).
pub fn ulnic_line(dir: Direction, size: u32, iters: u64, sockets: &NodePair) -> io::Result<Record> {
    let s = size as usize;
    let w = window(s);
    let memory = (s * w * 2).max(64 << 20);
    let a = Nic::attach_with_memory(&sockets.client, memory).map_err(io::Error::other)?;
    let b = Nic::attach_with_memory(&sockets.server, memory).map_err(io::Error::other)?;
    let mut init = endpoint(&a, s * w)?;
    let target = endpoint(&b, s * w)?;
    let perms = match dir {
        Direction::Write => Permissions::WRITE,
        Direction::Read => Permissions::READ,
    };
    let cookie = target
        .export(0, (s * w) as u64, perms)
        .map_err(io::Error::other)?;
    target.write_segment(0, &vec![1u8; s * w]);
    run_window(&mut init, &cookie, dir, size, iters)
}

/// Keeps `window(size)` RDMA operations of `size` bytes in flight between
/// `init`'s segment and the aperture, slot by slot, until `iters` have
/// completed; the payload is touched on this side (filled before a write,
/// read after a read).
fn run_window(
    init: &mut Endpoint,
    cookie: &ulnic::Cookie,
    dir: Direction,
    size: u32,
    iters: u64,
) -> io::Result<Record> {
    let s = size as usize;
    let w = window(s);
    let cookie = *cookie;
    let mut posted_at = vec![Instant::now(); w];
    let mut lat = Vec::with_capacity(iters as usize);
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut sink = 0u64;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120);
    while completed < iters {
        if posted < iters && (posted - completed) < w as u64 {
            let slot = (posted as usize % w) * s;
            posted_at[posted as usize % w] = Instant::now();
            if dir == Direction::Write {
                // SAFETY: the slot's previous RDMA completed (at most `w`
                // in flight, completions in order); it is not exported.
                fill_lines(unsafe { init.segment_mut(slot, s) }, posted);
            }
            let r = match dir {
                Direction::Write => {
                    init.rdma_write(&cookie, slot as u64, slot as u64, size, posted, true)
                }
                Direction::Read => {
                    init.rdma_read(&cookie, slot as u64, slot as u64, size, posted, true)
                }
            };
            if r.is_ok() {
                posted += 1;
                continue;
            }
        }
        match init.poll_event() {
            Some(Event::SendDone { id }) if id == completed => {
                lat.push(posted_at[id as usize % w].elapsed().as_nanos() as u64);
                if dir == Direction::Read {
                    let slot = (id as usize % w) * s;
                    // SAFETY: this read completed; the slot is reused only
                    // by a later post, after this borrow ends.
                    sink = sink.wrapping_add(touch_lines(unsafe { init.segment(slot, s) }));
                }
                completed += 1;
            }
            Some(other) => return Err(io::Error::other(format!("unexpected {other:?}"))),
            None => {
                if Instant::now() > deadline {
                    return Err(io::Error::other("RDMA benchmark stalled"));
                }
                std::thread::yield_now();
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    Ok(record(dir, "ulnic", size, &mut lat, secs))
}

/// How long the waiter is given to block again before the next write.
const SETTLE: Duration = Duration::from_micros(200);

/// Latency from a remote write-immediate to its tripwire's blocked owner
/// running (CLAN's synchronisation path: device, notification, wake-up),
/// one way, measured on one clock (the owner is a thread of this process,
/// attached to another node).
pub fn tripwire_line(iters: u64, sockets: &NodePair) -> io::Result<Record> {
    let a = Nic::attach(&sockets.client).map_err(io::Error::other)?;
    let b = Nic::attach(&sockets.server).map_err(io::Error::other)?;
    let mut init = endpoint(&a, 4096)?;
    let mut owner = endpoint(&b, 4096)?;
    let cookie = owner
        .export(0, 4096, Permissions::WRITE)
        .map_err(io::Error::other)?;
    let tw = owner
        .set_tripwire(&cookie, 0, 8, ulnic::TripwireOn::Writes, true, 0)
        .map_err(io::Error::other)?;
    let (woke_tx, woke_rx) = std::sync::mpsc::channel::<Instant>();
    let waiter = std::thread::spawn(move || -> io::Result<()> {
        let mut seen = 0;
        for _ in 1..=iters {
            // The word is the truth; a firing may be reported for a write
            // already seen (its flag or event outlives the value check).
            while owner.read_u64(0) == seen {
                if !owner
                    .wait_tripwire(tw, 0, seen, Duration::from_secs(10))
                    .map_err(io::Error::other)?
                {
                    return Err(io::Error::other("tripwire never fired"));
                }
            }
            let now = Instant::now();
            seen = owner.read_u64(0);
            while owner.poll_event().is_some() {}
            if woke_tx.send(now).is_err() {
                break;
            }
        }
        Ok(())
    });
    let mut lat = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for i in 1..=iters {
        std::thread::sleep(SETTLE);
        let t0 = Instant::now();
        init.write_immediate(&cookie, 0, ulnic::Immediate::U64(i), i, false)
            .map_err(io::Error::other)?;
        let Ok(woke) = woke_rx.recv_timeout(Duration::from_secs(20)) else {
            // Report the waiter's own error (why it stopped), not just ours.
            drop(woke_rx);
            return Err(match waiter.join() {
                Ok(Err(e)) => e,
                _ => io::Error::other(format!("the owner did not wake for write {i}")),
            });
        };
        lat.push(woke.saturating_duration_since(t0).as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    waiter
        .join()
        .map_err(|_| io::Error::other("waiter panicked"))??;
    let mut r = record(Direction::Write, "ulnic", 8, &mut lat, secs);
    r.bench = "tripwire".into();
    r.mode = "block".into();
    r.mbytes_per_s = None;
    Ok(r)
}

/// The kernel baseline for `tripwire_line`: a thread blocked reading a
/// Unix socket, woken by an 8-byte write.
pub fn unix_wake_line(iters: u64) -> io::Result<Record> {
    use std::io::{Read, Write};
    let (mut rd, mut wr) = std::os::unix::net::UnixStream::pair()?;
    let (woke_tx, woke_rx) = std::sync::mpsc::channel::<Instant>();
    let waiter = std::thread::spawn(move || {
        let mut b = [0u8; 8];
        while rd.read_exact(&mut b).is_ok() {
            if woke_tx.send(Instant::now()).is_err() {
                break;
            }
        }
    });
    let mut lat = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for i in 1..=iters {
        std::thread::sleep(SETTLE);
        let t0 = Instant::now();
        wr.write_all(&i.to_le_bytes())?;
        let woke = woke_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| io::Error::other("the reader did not wake"))?;
        lat.push(woke.saturating_duration_since(t0).as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    drop(wr);
    let _ = waiter.join();
    let mut r = record(Direction::Write, "unix", 8, &mut lat, secs);
    r.bench = "tripwire".into();
    r.mode = "block".into();
    r.mbytes_per_s = None;
    Ok(r)
}

/// `ulnic bench dmq`: ping-pong (a queue each way) and stream over the
/// distributed message queue between two nodes, with a Unix socket pair
/// doing the same in the same run. Each message is written by its sender
/// and read by its receiver.
pub fn dmq_lines(size: u32, iters: u64, sockets: &NodePair) -> io::Result<Vec<Record>> {
    use std::io::{Read, Write};
    use ulnic::{DmqKind, DmqReceiver, DmqSender};
    const RING: u64 = 256 << 10;
    const T: Duration = Duration::from_secs(30);
    let e = io::Error::other;
    let seg = (2 * (RING + 4096)) as usize;
    let a = Nic::attach(&sockets.client).map_err(e)?;
    let b = Nic::attach(&sockets.server).map_err(e)?;
    // A queue each way: a->b lives in b's memory, b->a in a's.
    let (a_tx, a_rx) = (endpoint(&a, seg)?, endpoint(&a, seg)?);
    let (b_tx, b_rx) = (endpoint(&b, seg)?, endpoint(&b, seg)?);
    let mut rx_b = DmqReceiver::new(b_rx, 0, RING, DmqKind::Bytes).map_err(e)?;
    let mut tx_a = DmqSender::new(a_tx, 0, RING, rx_b.cookie(), DmqKind::Bytes).map_err(e)?;
    rx_b.connect(tx_a.cookie());
    let mut rx_a = DmqReceiver::new(a_rx, 0, RING, DmqKind::Bytes).map_err(e)?;
    let mut tx_b = DmqSender::new(b_tx, 0, RING, rx_a.cookie(), DmqKind::Bytes).map_err(e)?;
    rx_a.connect(tx_b.cookie());
    let s = size as usize;
    let mut out = Vec::new();

    // Ping-pong over the queues; then over a socket pair.
    let echo = std::thread::spawn(move || -> io::Result<(DmqReceiver, DmqSender)> {
        let mut m = Vec::new();
        for _ in 0..iters {
            if !rx_b.recv(&mut m, T).map_err(io::Error::other)? {
                return Err(io::Error::other("dmq ping lost"));
            }
            std::hint::black_box(touch_lines(&m));
            tx_b.send(&m, T).map_err(io::Error::other)?;
        }
        Ok((rx_b, tx_b))
    });
    let mut msg = vec![0u8; s];
    let mut back = vec![0u8; s];
    let mut lat = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for i in 0..iters {
        fill_lines(&mut msg, i);
        let t = Instant::now();
        tx_a.send(&msg, T).map_err(e)?;
        if !rx_a.recv(&mut back, T).map_err(e)? || back != msg {
            return Err(io::Error::other("dmq pong lost or changed"));
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    let (mut rx_b, _tx_b) = echo
        .join()
        .map_err(|_| io::Error::other("echo panicked"))??;
    let mut r = record(Direction::Write, "ulnic", size, &mut lat, secs);
    (r.bench, r.mode, r.mbytes_per_s) = ("dmq-pingpong".into(), "block".into(), None);
    out.push(r);
    out.extend(pio_dmq_lines(size, iters, &a, &b)?);

    let (mut p, mut q) = std::os::unix::net::UnixStream::pair()?;
    let echo = std::thread::spawn(move || -> io::Result<()> {
        let mut m = vec![0u8; s];
        for _ in 0..iters {
            q.read_exact(&mut m)?;
            std::hint::black_box(touch_lines(&m));
            q.write_all(&m)?;
        }
        Ok(())
    });
    let mut lat = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for i in 0..iters {
        fill_lines(&mut msg, i);
        let t = Instant::now();
        p.write_all(&msg)?;
        p.read_exact(&mut back[..s])?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    echo.join()
        .map_err(|_| io::Error::other("echo panicked"))??;
    let mut r = record(Direction::Write, "unix", size, &mut lat, secs);
    (r.bench, r.mode, r.mbytes_per_s) = ("dmq-pingpong".into(), "block".into(), None);
    out.push(r);

    // Stream: a->b as fast as the ring allows; the receiver reads all.
    let n = iters * 10;
    let sink = std::thread::spawn(move || -> io::Result<u64> {
        let (mut m, mut sum) = (Vec::new(), 0u64);
        for _ in 0..n {
            if !rx_b.recv(&mut m, T).map_err(io::Error::other)? {
                return Err(io::Error::other("dmq stream stalled"));
            }
            sum = sum.wrapping_add(touch_lines(&m));
        }
        Ok(sum)
    });
    let start = Instant::now();
    for i in 0..n {
        fill_lines(&mut msg, i);
        tx_a.send(&msg, T).map_err(e)?;
    }
    sink.join()
        .map_err(|_| io::Error::other("sink panicked"))??;
    out.push(stream_record(
        "ulnic",
        size,
        n,
        start.elapsed().as_secs_f64(),
    ));

    let (mut p, mut q) = std::os::unix::net::UnixStream::pair()?;
    let sink = std::thread::spawn(move || -> io::Result<u64> {
        let (mut m, mut sum) = (vec![0u8; s], 0u64);
        for _ in 0..n {
            q.read_exact(&mut m)?;
            sum = sum.wrapping_add(touch_lines(&m));
        }
        Ok(sum)
    });
    let start = Instant::now();
    for i in 0..n {
        fill_lines(&mut msg, i);
        p.write_all(&msg)?;
    }
    sink.join()
        .map_err(|_| io::Error::other("sink panicked"))??;
    out.push(stream_record(
        "unix",
        size,
        n,
        start.elapsed().as_secs_f64(),
    ));
    Ok(out)
}

/// The same ping-pong and stream over CLAN's queue in PIO windows
/// (`ulnic::PioDmqSender`): the sender stores into the receiver's ring;
/// both sides poll (no tripwire sees PIO stores). Transport "pio".
fn pio_dmq_lines(size: u32, iters: u64, a: &Nic, b: &Nic) -> io::Result<Vec<Record>> {
    use ulnic::{DmqKind, PioDmqReceiver, PioDmqSender};
    const RING: u64 = 256 << 10;
    const T: Duration = Duration::from_secs(30);
    let e = io::Error::other;
    let (ea, eb) = (endpoint(a, 4096)?, endpoint(b, 4096)?);
    let mut rx_b = PioDmqReceiver::new(&eb, RING, DmqKind::Bytes, None).map_err(e)?;
    let mut tx_a = PioDmqSender::new(&ea, rx_b.grant(), RING, DmqKind::Bytes).map_err(e)?;
    let mut rx_a = PioDmqReceiver::new(&ea, RING, DmqKind::Bytes, None).map_err(e)?;
    let mut tx_b = PioDmqSender::new(&eb, rx_a.grant(), RING, DmqKind::Bytes).map_err(e)?;
    let n = iters * 10;
    let echo = std::thread::spawn(move || -> io::Result<u64> {
        let mut m = Vec::new();
        for _ in 0..iters {
            if !rx_b.recv(&mut m, T).map_err(io::Error::other)? {
                return Err(io::Error::other("pio dmq ping lost"));
            }
            std::hint::black_box(touch_lines(&m));
            tx_b.send(&m, T).map_err(io::Error::other)?;
        }
        let mut sum = 0u64;
        for _ in 0..n {
            if !rx_b.recv(&mut m, T).map_err(io::Error::other)? {
                return Err(io::Error::other("pio dmq stream stalled"));
            }
            sum = sum.wrapping_add(touch_lines(&m));
        }
        Ok(sum)
    });
    let (mut msg, mut back) = (vec![0u8; size as usize], Vec::new());
    let mut lat = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for i in 0..iters {
        fill_lines(&mut msg, i);
        let t = Instant::now();
        tx_a.send(&msg, T).map_err(e)?;
        if !rx_a.recv(&mut back, T).map_err(e)? || back != msg {
            return Err(io::Error::other("pio dmq pong lost or changed"));
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    let mut r = record(Direction::Write, "pio", size, &mut lat, secs);
    (r.bench, r.mbytes_per_s) = ("dmq-pingpong".into(), None);
    let start = Instant::now();
    for i in 0..n {
        fill_lines(&mut msg, i);
        tx_a.send(&msg, T).map_err(e)?;
    }
    echo.join()
        .map_err(|_| io::Error::other("echo panicked"))??;
    let mut s = stream_record("pio", size, n, start.elapsed().as_secs_f64());
    s.mode = "poll".into();
    Ok(vec![r, s])
}

fn stream_record(transport: &str, size: u32, n: u64, secs: f64) -> Record {
    Record {
        bench: "dmq-stream".into(),
        transport: transport.into(),
        size,
        iters: n,
        mode: "block".into(),
        median_ns: None,
        p95_ns: None,
        p99_ns: None,
        min_ns: None,
        mbytes_per_s: Some(n as f64 * f64::from(size) / secs / 1e6),
        msgs_per_s: Some(n as f64 / secs),
        seconds: Some(secs),
        payload: Some("lines".into()),
        ..Default::default()
    }
}

/// Port the cross-guest RDMA benchmark's exporter binds.
const RDMA_PEER_PORT: u32 = 7002;
const TAG_HELLO: u32 = 0x4845;
const TAG_COOKIE: u32 = 0x434b;
const TAG_VERDICT: u32 = 0x5644;

/// The next message from anyone, waiting up to `timeout`; one of ours
/// the fabric handed back (its receiver was not bound yet) is skipped.
fn next_message(ep: &mut Endpoint, timeout: Duration) -> io::Result<ulnic::Received> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(m) = ep.poll_recv() {
            if !m.returned {
                return Ok(m);
            }
            continue;
        }
        while ep.poll_event().is_some() {}
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::other("the other node never answered"));
        }
        ep.wait(left.min(Duration::from_millis(20)))
            .map_err(io::Error::other)?;
    }
}

fn inline_bytes(m: &ulnic::Received) -> &[u8] {
    match &m.payload {
        ulnic::Payload::Inline(b) => &b[..(m.len as usize).min(b.len())],
        ulnic::Payload::Buffer { .. } => &[],
    }
}

/// `cluster bench rdma-write` between two guests (each side in its own
/// guest, through the kernel driver): node 1 exports a window of slots
/// and hands its cookie to node 0 in a message; node 0 RDMA-writes
/// `iters` buffers of `size` bytes (filling each first) and then an
/// immediate with the count; node 1, woken by a tripwire on that word,
/// reads every slot, checks each holds the last buffer written to it, and
/// answers with its verdict. Node 0 returns the result line.
pub fn rdma_peer(
    server: bool,
    size: u32,
    iters: u64,
    peer_node: Option<u32>,
) -> io::Result<Option<Record>> {
    let e = io::Error::other;
    let s = size as usize;
    let w = window(s);
    let flag = (s * w).next_multiple_of(4096) as u64;
    let nic = Nic::open().map_err(e)?;
    let mut ep = endpoint(&nic, flag as usize + 4096)?;
    ep.bind(RDMA_PEER_PORT).map_err(e)?;
    // Node 1 exports, node 0 writes.
    let peer = ulnic::Address {
        node: peer_node.unwrap_or(if server { 0 } else { 1 }),
        port: RDMA_PEER_PORT,
    };
    if server {
        let cookie = ep.export(0, flag + 4096, Permissions::WRITE).map_err(e)?;
        let tw = ep
            .set_tripwire(&cookie, flag, 8, ulnic::TripwireOn::Writes, true, 0)
            .map_err(e)?;
        // Whoever says hello gets the cookie (the client retries until
        // this side is up).
        loop {
            let m = next_message(&mut ep, Duration::from_secs(120))?;
            if m.tag == TAG_HELLO {
                break;
            }
        }
        ep.post_send_inline(peer, TAG_COOKIE, &cookie.encode(), 0)
            .map_err(e)?;
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let seen = ep.read_u64(flag);
            if seen == iters {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::other(format!(
                    "only {seen} of {iters} writes were announced"
                )));
            }
            ep.wait_tripwire(tw, flag, seen, left).map_err(e)?;
            while ep.poll_event().is_some() {}
        }
        // Slot k holds the last buffer i < iters with i % w == k, whose
        // every cache line starts with the byte i.
        let mut bad = 0u64;
        for k in 0..(w as u64).min(iters) {
            let last = k + (iters - 1 - k) / w as u64 * w as u64;
            // SAFETY: the writer is done (it announced the count), and
            // nothing else writes this window.
            let slot = unsafe { ep.segment(k as usize * s, s) };
            bad += slot.chunks(64).filter(|c| c[0] != last as u8).count() as u64;
        }
        ep.post_send_inline(peer, TAG_VERDICT, &bad.to_le_bytes(), 1)
            .map_err(e)?;
        // Let the verdict leave before the endpoint goes.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ep.sends_done() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        return if bad == 0 {
            Ok(None)
        } else {
            Err(io::Error::other(format!(
                "{bad} cache lines held other bytes"
            )))
        };
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let cookie = loop {
        if Instant::now() > deadline {
            return Err(io::Error::other("node 1 never sent its cookie"));
        }
        ep.post_send_inline(peer, TAG_HELLO, &[], 0).map_err(e)?;
        match next_message(&mut ep, Duration::from_millis(200)) {
            Ok(m) if m.tag == TAG_COOKIE && inline_bytes(&m).len() == ulnic::Cookie::SIZE => {
                break ulnic::Cookie::decode(inline_bytes(&m));
            }
            _ => continue,
        }
    };
    let mut rec = run_window(&mut ep, &cookie, Direction::Write, size, iters)?;
    ep.write_immediate(&cookie, flag, ulnic::Immediate::U64(iters), u64::MAX, true)
        .map_err(e)?;
    let verdict = loop {
        let m = next_message(&mut ep, Duration::from_secs(60))?;
        if m.tag == TAG_VERDICT {
            break u64::from_le_bytes(inline_bytes(&m).try_into().unwrap_or([0xff; 8]));
        }
    };
    if verdict != 0 {
        return Err(io::Error::other(format!(
            "node 1 found {verdict} cache lines holding other bytes"
        )));
    }
    rec.mode = "block".into();
    Ok(Some(rec))
}
