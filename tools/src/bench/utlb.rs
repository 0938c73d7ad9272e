//! `ulnic bench utlb`: what address translation costs (VMMC-2 Table 1) and
//! how it degrades when the working set outgrows the translation table
//! (Schoinas & Hill's stress, with and without single-copy fallback).
//!
//! Both run host-attached between nodes 0 and 1 of a device, in one
//! process, like the RDMA benchmarks.

use crate::bench::nodes::NodePair;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use ulnic::{
    Address, Endpoint, EndpointConfig, Nic, Payload, ProtectionDomain, UserBuffer, UtlbConfig,
};

use super::payload::{fill_lines, touch_lines};
use super::record::Record;

const PAGE: usize = 4096;
const PORT: u32 = 9;
/// Receive buffers of the sink (each holds the largest message).
const SINK_SLOTS: u64 = 256;
const SINK_SLOT: u64 = 16384;

fn err(e: ulnic::Error) -> io::Error {
    io::Error::other(e)
}

/// The sender's and the receiver's NIC: the pair's nodes, or (None) this
/// guest's device twice, the receiver on this same node.
fn nics(sockets: Option<&NodePair>) -> io::Result<(Nic, Nic)> {
    let attach = |s: &Path| Nic::attach_with_memory(s, 128 << 20).map_err(err);
    match sockets {
        Some(p) => Ok((attach(&p.client)?, attach(&p.server)?)),
        None => Ok((Nic::open().map_err(err)?, Nic::open().map_err(err)?)),
    }
}

/// A receiving endpoint on node 1 with buffers posted.
fn sink(nic: &Nic) -> io::Result<Endpoint> {
    let mut ep = nic
        .alloc_pd()
        .map_err(err)?
        .create_endpoint(&EndpointConfig {
            recv_entries: 512,
            free_entries: 512,
            segment_bytes: (SINK_SLOTS * SINK_SLOT) as usize,
            ..Default::default()
        })
        .map_err(err)?;
    ep.bind(PORT).map_err(err)?;
    for i in 0..SINK_SLOTS {
        ep.post_free(i * SINK_SLOT, SINK_SLOT as u32, i)
            .map_err(err)?;
    }
    Ok(ep)
}

/// Takes one message if there is one, reading every byte (the payload is
/// touched on the receiving side too); returns whether it took one.
fn drain_one(ep: &mut Endpoint, sink: &mut u64) -> io::Result<bool> {
    let Some(m) = ep.poll_recv() else {
        return Ok(false);
    };
    match m.payload {
        Payload::Inline(b) => *sink = sink.wrapping_add(touch_lines(&b[..m.len as usize])),
        Payload::Buffer { offset, id } => {
            // SAFETY: this buffer was just delivered and is handed back
            // below, after the borrow ends.
            let bytes = unsafe { ep.segment(offset as usize, m.len as usize) };
            *sink = sink.wrapping_add(touch_lines(bytes));
            ep.post_free(offset, SINK_SLOT as u32, id).map_err(err)?;
        }
    }
    Ok(true)
}

fn line(mode: &str, transport: &str, size: u32, samples: &mut [u64]) -> Record {
    let mut r = Record {
        bench: "utlb".into(),
        transport: transport.into(),
        size,
        mode: mode.into(),
        payload: Some("lines".into()),
        ..Default::default()
    };
    r.set_latencies(samples);
    r
}

fn device_counter(ep: &Endpoint, name: &str) -> io::Result<u64> {
    Ok(ep
        .stats()
        .map_err(err)?
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v))
}

/// The VMMC-2 Table 1 analogue for buffers of `pages` pages: a library
/// hit, a host miss split into the library's and the driver's time, and
/// the device's time to fetch the entries it misses on; with a memcpy of
/// the same bytes (what the single-copy fallback pays instead) as baseline.
pub fn table_lines(pages: u32, iters: u64, sockets: Option<&NodePair>) -> io::Result<Vec<Record>> {
    let (a, b) = nics(sockets)?;
    let rx_node = b.node();
    let mut rx = sink(&b)?;
    let pd = a.alloc_pd().map_err(err)?;
    let entries = 256u32;
    pd.enable_utlb(UtlbConfig {
        entries,
        fallback: false,
        ..Default::default()
    })
    .map_err(err)?;
    let mut tx = pd
        .create_endpoint(&EndpointConfig::default())
        .map_err(err)?;
    tx.bind(1).map_err(err)?;
    let bytes = pages as usize * PAGE;
    // More buffers than the table holds, used round robin: with LRU every
    // registration of the next one misses.
    let pool: Vec<UserBuffer> = (0..(2 * entries / pages + 2))
        .map(|_| pd.alloc_buffer(bytes).map_err(err))
        .collect::<io::Result<_>>()?;
    let size = bytes as u32;
    let to = Address {
        node: rx_node,
        port: PORT,
    };

    let mut hit = Vec::with_capacity(iters as usize);
    pd.register(&pool[0], 0..bytes).map_err(err)?;
    for _ in 0..iters {
        let r = pd.register(&pool[0], 0..bytes).map_err(err)?;
        if !r.hit {
            return Err(io::Error::other("a registered buffer missed"));
        }
        hit.push(r.library.as_nanos() as u64);
    }

    let (mut lib, mut drv, mut dev) = (Vec::new(), Vec::new(), Vec::new());
    let mut sink_sum = 0u64;
    // Each miss costs a driver call; the device-miss sample a send and two
    // counter reads: fewer rounds keep the benchmark short.
    let rounds = iters.min(2000);
    for i in 0..rounds {
        let buf = &pool[(i as usize + 1) % pool.len()];
        let r = pd.register(buf, 0..bytes).map_err(err)?;
        if r.hit {
            return Err(io::Error::other("a buffer evicted by LRU hit"));
        }
        lib.push(r.library.as_nanos() as u64);
        drv.push(r.driver.as_nanos() as u64);
        // Installing invalidated the device's lines for these entries: the
        // send makes the device fetch all of them from the table.
        let (ns0, miss0) = (
            device_counter(&tx, "utlb_fetch_ns")?,
            device_counter(&tx, "utlb_misses")?,
        );
        let len = bytes.min(SINK_SLOT as usize);
        tx.post_send_buffer(to, 0, buf, 0..len, i, false)
            .map_err(err)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !drain_one(&mut rx, &mut sink_sum)? {
            if Instant::now() > deadline {
                return Err(io::Error::other("a send through the UTLB never arrived"));
            }
            std::thread::yield_now();
        }
        let fetched = device_counter(&tx, "utlb_misses")? - miss0;
        if fetched < u64::from(len.div_ceil(PAGE) as u32) {
            return Err(io::Error::other(format!(
                "the device fetched {fetched} entries for a freshly installed buffer"
            )));
        }
        dev.push(device_counter(&tx, "utlb_fetch_ns")? - ns0);
    }
    std::hint::black_box(sink_sum);

    let mut src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut copy = Vec::with_capacity(iters as usize);
    for i in 0..iters {
        fill_lines(&mut src, i);
        let t = Instant::now();
        dst.copy_from_slice(&src);
        copy.push(t.elapsed().as_nanos() as u64);
        std::hint::black_box(&dst);
    }
    let mut out = vec![
        line("hit", "ulnic", size, &mut hit),
        line("miss-library", "ulnic", size, &mut lib),
        line("miss-driver", "ulnic", size, &mut drv),
        line("device-miss", "ulnic", size, &mut dev),
        line("copy", "memcpy", size, &mut copy),
    ];
    for r in &mut out {
        r.pages = Some(pages);
    }
    Ok(out)
}

/// How the stress's sender gets its bytes to the device.
#[derive(Debug, Clone, Copy)]
pub enum Policy {
    /// Copy every message into the segment and send from there (the
    /// baseline: no translation at all).
    SingleCopy,
    /// Zero-copy; a miss is serviced by the driver before sending.
    MissInline,
    /// Zero-copy on hits; misses copied through the bounce buffer, at most
    /// one serviced per this many bytes (0: after every fallback).
    Fallback(u64),
}

impl Policy {
    fn name(self) -> String {
        match self {
            Policy::SingleCopy => "single-copy".into(),
            Policy::MissInline => "miss-inline".into(),
            Policy::Fallback(0) => "fallback-every".into(),
            Policy::Fallback(n) => format!("fallback-{}k", n / 1024),
        }
    }
}

/// The policies the stress compares, baseline first.
pub const POLICIES: [Policy; 5] = [
    Policy::SingleCopy,
    Policy::MissInline,
    Policy::Fallback(0),
    Policy::Fallback(16 << 10),
    Policy::Fallback(64 << 10),
];

/// Schoinas & Hill's stress: a one-way stream of `size`-byte messages
/// from `buffers` one-page buffers on distinct pages, taken round robin,
/// through a table of `entries` entries, under each policy. The sender
/// writes each message before sending it, the receiver reads it.
pub fn stress_lines(
    size: u32,
    buffers: u32,
    entries: u32,
    iters: u64,
    sockets: Option<&NodePair>,
) -> io::Result<Vec<Record>> {
    if size == 0 || size as usize > PAGE {
        return Err(io::Error::other("utlb stress sizes are 1..=4096 bytes"));
    }
    let (a, b) = nics(sockets)?;
    let mut out = Vec::new();
    for policy in POLICIES {
        let mut rx = sink(&b)?;
        let pd = a.alloc_pd().map_err(err)?;
        pd.enable_utlb(UtlbConfig {
            entries,
            fallback: matches!(policy, Policy::Fallback(_)),
            miss_every_bytes: match policy {
                Policy::Fallback(n) => n,
                _ => 0,
            },
            // A quarter of the table (at most the default 256 KiB).
            bounce_bytes: (entries as usize / 4 * PAGE).clamp(PAGE, 256 << 10),
        })
        .map_err(err)?;
        let mut r = stream(&pd, &mut rx, b.node(), policy, size, buffers, iters)?;
        let s = pd.utlb_stats();
        r.buffers = Some(buffers);
        r.table_entries = Some(entries);
        if !matches!(policy, Policy::SingleCopy) {
            r.hit_ratio = Some(s.hits as f64 / s.lookups.max(1) as f64);
            r.misses_serviced = Some(s.misses_serviced);
            r.fallback_bytes = Some(s.fallback_bytes);
        }
        out.push(r);
    }
    Ok(out)
}

fn stream(
    pd: &ProtectionDomain,
    rx: &mut Endpoint,
    rx_node: u32,
    policy: Policy,
    size: u32,
    buffers: u32,
    iters: u64,
) -> io::Result<Record> {
    let slots = 64usize;
    let mut tx = pd
        .create_endpoint(&EndpointConfig {
            send_entries: slots as u32,
            segment_bytes: slots * PAGE,
            ..Default::default()
        })
        .map_err(err)?;
    tx.bind(1).map_err(err)?;
    let mut bufs: Vec<UserBuffer> = (0..buffers)
        .map(|_| pd.alloc_buffer(PAGE).map_err(err))
        .collect::<io::Result<_>>()?;
    let to = Address {
        node: rx_node,
        port: PORT,
    };
    let len = size as usize;
    let (mut sent, mut got, mut sink_sum) = (0u64, 0u64, 0u64);
    let mut post = Vec::with_capacity(iters as usize);
    let deadline = Instant::now() + Duration::from_secs(120);
    let start = Instant::now();
    while got < iters {
        if Instant::now() > deadline {
            return Err(io::Error::other(format!(
                "{} stalled at {sent} sent, {got} received",
                policy.name()
            )));
        }
        // Keep fewer messages outstanding than the sink has buffers.
        if sent < iters && sent - got < SINK_SLOTS / 2 && tx.send_space() > 0 {
            let k = sent as usize % bufs.len();
            fill_lines(&mut bufs[k].as_mut_slice()[..len], sent);
            let t = Instant::now();
            let r = match policy {
                Policy::SingleCopy => {
                    let slot = (sent as usize % slots) * PAGE;
                    // SAFETY: the send ring holds `slots` descriptors, so
                    // the send that last used this slot has retired.
                    unsafe { tx.segment_mut(slot, len) }
                        .copy_from_slice(&bufs[k].as_slice()[..len]);
                    tx.post_send(to, 0, slot as u64, size, sent, false)
                }
                _ => tx
                    .post_send_buffer(to, 0, &bufs[k], 0..len, sent, false)
                    .map(|_| ()),
            };
            match r {
                Ok(()) => {
                    post.push(t.elapsed().as_nanos() as u64);
                    sent += 1;
                    continue;
                }
                Err(ulnic::Error::WouldBlock) => {}
                Err(e) => return Err(err(e)),
            }
        }
        if let Some(e) = tx.poll_event() {
            return Err(io::Error::other(format!("unexpected {e:?}")));
        }
        if drain_one(rx, &mut sink_sum)? {
            got += 1;
        } else {
            std::thread::yield_now();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(sink_sum);
    let mut r = line(&policy.name(), "ulnic", size, &mut post);
    r.bench = "utlb-stress".into();
    r.mbytes_per_s = Some(iters as f64 * f64::from(size) / secs / 1e6);
    r.msgs_per_s = Some(iters as f64 / secs);
    r.seconds = Some(secs);
    Ok(r)
}
