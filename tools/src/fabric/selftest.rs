//! `ulnic fabric selftest`: starts a device with an emulated fabric whose
//! links drop, corrupt, duplicate and reorder packets, attaches a host
//! process to each node, and has every node send numbered messages to
//! every other; then reports what arrived: sent, delivered, lost,
//! duplicated, out of order, returned, and the transport's counters. The
//! reliable transport (spec §10.4) should make lost, duplicated and
//! out_of_order zero, and delivered equal to sent, whatever the faults.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use ulnic::{Address, EndpointConfig, Event, Nic, Payload};
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::topology::{Faults, Topology};
use ulnic_device::fabric::transport::TransportConfig;

/// The port every node's endpoint binds.
const PORT: u32 = 1;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes (attached from host processes), at least 2.
    pub nodes: u32,
    /// Messages in all, spread evenly over the nodes.
    pub messages: u64,
    /// Faults set on every link (unless `fabric` came from a file and
    /// none were given).
    pub faults: Option<Faults>,
    /// The fabric; the default is one switch.
    pub fabric: Option<FabricConfig>,
    /// Seed of the faults.
    pub seed: u64,
    /// Cut node 1's link this long after the start, for this long.
    pub partition: Option<(Duration, Duration)>,
    /// Give up waiting for stragglers after this much quiet.
    pub quiet: Duration,
}

/// What happened.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// Nodes.
    pub nodes: u32,
    /// Messages sent.
    pub sent: u64,
    /// Messages delivered (counted once each).
    pub delivered: u64,
    /// Sent, neither delivered nor returned.
    pub lost: u64,
    /// Deliveries of a message already delivered.
    pub duplicated: u64,
    /// Messages that arrived after a later one from the same sender.
    pub out_of_order: u64,
    /// Messages the fabric handed back to their sender.
    pub returned: u64,
    /// UNREACHABLE events: a node the transport gave up on (spec §10.4).
    pub unreachable: u64,
    /// Seconds from the first send to the last delivery.
    pub seconds: f64,
    /// Messages delivered per second.
    pub rate: f64,
    /// Transport counters, summed over the nodes.
    pub retransmissions: u64,
    /// Timeouts.
    pub timeouts: u64,
    /// NACKs sent.
    pub nacks: u64,
    /// Duplicate packets the transport dropped.
    pub duplicates_dropped: u64,
    /// Packets ahead of their turn the transport dropped.
    pub out_of_order_dropped: u64,
    /// Link counters, summed: packets carried.
    pub packets: u64,
    /// Packets the faults dropped (or a cut link lost).
    pub packets_dropped: u64,
    /// Packets corrupted (all caught by the CRC).
    pub packets_corrupted: u64,
    /// Corrupt packets the far ends discarded.
    pub crc_errors: u64,
    /// Packets duplicated by the faults.
    pub packets_duplicated: u64,
    /// Packets reordered by the faults.
    pub packets_reordered: u64,
}

/// Shared progress, to know when everything is settled.
#[derive(Default)]
struct Tally {
    delivered: AtomicU64,
    duplicated: AtomicU64,
    out_of_order: AtomicU64,
    returned: AtomicU64,
    unreachable: AtomicU64,
    last_progress_ms: AtomicU64,
}

/// Runs the self-test; `say` gets progress lines.
pub fn run(o: &Options, say: &mut dyn FnMut(&str)) -> anyhow::Result<Report> {
    anyhow::ensure!(o.nodes >= 2, "--nodes must be at least 2");
    anyhow::ensure!(o.messages >= 1, "--messages must be at least 1");
    let fabric = fabric_of(o)?;
    let run = super::InProcess::start(fabric.clone(), 2)?;
    let (dev, sockets) = (&run.device, run.sockets.clone());
    say(&format!(
        "device up: {} nodes on {} switch(es); {} messages, seed {}",
        o.nodes,
        fabric.topology.switches().len(),
        o.messages,
        o.seed
    ));

    let tally = Arc::new(Tally::default());
    let sent_total = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Nobody sends before every endpoint is bound: a message to a port
    // not yet bound is refused (and returned), which is not what this
    // tests.
    let ready = Arc::new(std::sync::Barrier::new(o.nodes as usize));
    let start = Instant::now();
    let per_node = o.messages / u64::from(o.nodes);
    let extra = o.messages % u64::from(o.nodes);
    let mut threads = Vec::new();
    for n in 0..o.nodes {
        let quota = per_node + u64::from(u64::from(n) < extra);
        let socket = sockets[n as usize].clone();
        let (tally, sent_total, stop) = (tally.clone(), sent_total.clone(), stop.clone());
        let ready = ready.clone();
        let nodes = o.nodes;
        threads.push(std::thread::spawn(move || {
            node_main(
                n,
                nodes,
                quota,
                &socket,
                &tally,
                &sent_total,
                &stop,
                &ready,
                start,
            )
        }));
    }
    let progress = Progress {
        tally: &tally,
        sent_total: &sent_total,
        start,
    };
    watch(o, dev, &fabric, &progress, &threads, say)?;
    let seconds = tally.last_progress_ms.load(Ordering::Relaxed) as f64 / 1000.0;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a node thread panicked"))?
            .context("a node failed")?;
    }
    let r = report(o, dev, &tally, sent_total.load(Ordering::Relaxed), seconds)?;
    drop(run);
    Ok(r)
}

/// The fabric to run: `o`'s or one switch, with `o`'s seed and faults,
/// whole in this process.
fn fabric_of(o: &Options) -> anyhow::Result<FabricConfig> {
    let mut fabric = o.fabric.clone().unwrap_or_else(|| FabricConfig {
        topology: Topology::single_switch(o.nodes),
        seed: o.seed,
        transport: TransportConfig::default(),
        span: None,
        mapping: None,
    });
    anyhow::ensure!(
        fabric.topology.nodes() == o.nodes,
        "the topology has {} nodes, not --nodes {}",
        fabric.topology.nodes(),
        o.nodes
    );
    fabric.seed = o.seed;
    // All nodes in this process: a topology spread over devices is run
    // here whole.
    fabric.span = None;
    if let Some(f) = o.faults {
        for link in 0..fabric.topology.links().len() {
            fabric.topology.set_faults(link, f)?;
        }
    }
    Ok(fabric)
}

/// What the node threads share with the watcher.
struct Progress<'a> {
    tally: &'a Tally,
    sent_total: &'a AtomicU64,
    start: Instant,
}

/// Waits until every message is delivered or returned (or nothing moved
/// for `o.quiet`), cutting and healing node 1's link on the way when `o`
/// asks for a partition, with a progress line every 2 s.
fn watch(
    o: &Options,
    dev: &ulnic_device::device::Device,
    fabric: &FabricConfig,
    p: &Progress<'_>,
    threads: &[std::thread::JoinHandle<anyhow::Result<()>>],
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let (tally, start) = (p.tally, p.start);
    // The partition, if any: node 1's link goes down and comes back.
    let host_link = fabric.topology.attachment(1).0;
    let mut cut = o.partition.map(|(at, len)| (at, at + len, false));
    let mut last_report = Instant::now();
    loop {
        let done = tally.delivered.load(Ordering::Relaxed) + tally.returned.load(Ordering::Relaxed);
        let all_sent = threads.iter().all(|t| t.is_finished())
            || p.sent_total.load(Ordering::Relaxed) == o.messages;
        if all_sent && done >= o.messages {
            return Ok(());
        }
        let quiet = start.elapsed().as_millis() as u64
            - tally
                .last_progress_ms
                .load(Ordering::Relaxed)
                .min(start.elapsed().as_millis() as u64);
        if quiet > o.quiet.as_millis() as u64 {
            say(&format!("no progress for {:?}; stopping", o.quiet));
            return Ok(());
        }
        if let Some((at, until, down)) = &mut cut {
            let now = start.elapsed();
            if !*down && now >= *at && now < *until {
                dev.set_link_faults(
                    host_link,
                    Faults {
                        down: true,
                        ..link_faults(fabric, host_link)
                    },
                )?;
                *down = true;
                say(&format!("node 1's link cut at {:?}", now));
            } else if *down && now >= *until {
                dev.set_link_faults(host_link, link_faults(fabric, host_link))?;
                say(&format!("node 1's link healed at {:?}", now));
                cut = None;
            }
        }
        if last_report.elapsed() > Duration::from_secs(2) {
            last_report = Instant::now();
            say(&format!(
                "{} of {} delivered, {} returned",
                tally.delivered.load(Ordering::Relaxed),
                o.messages,
                tally.returned.load(Ordering::Relaxed)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The report: what the nodes counted and the device's transport and
/// link counters, summed.
fn report(
    o: &Options,
    dev: &ulnic_device::device::Device,
    tally: &Tally,
    sent: u64,
    seconds: f64,
) -> anyhow::Result<Report> {
    let counters = dev.fabric_counters().context("the device has no fabric")?;
    let delivered = tally.delivered.load(Ordering::Relaxed);
    let returned = tally.returned.load(Ordering::Relaxed);
    let mut r = Report {
        nodes: o.nodes,
        sent,
        delivered,
        lost: sent.saturating_sub(delivered + returned),
        duplicated: tally.duplicated.load(Ordering::Relaxed),
        out_of_order: tally.out_of_order.load(Ordering::Relaxed),
        returned,
        unreachable: tally.unreachable.load(Ordering::Relaxed),
        seconds,
        rate: if seconds > 0.0 {
            delivered as f64 / seconds
        } else {
            0.0
        },
        ..Report::default()
    };
    for t in &counters.transport {
        r.retransmissions += t.retransmissions;
        r.timeouts += t.timeouts;
        r.nacks += t.nacks_sent;
        r.duplicates_dropped += t.duplicates_dropped;
        r.out_of_order_dropped += t.out_of_order_dropped;
    }
    for l in &counters.lanes {
        r.packets += l.packets;
        r.packets_dropped += l.dropped + l.dropped_down;
        r.packets_corrupted += l.corrupted;
        r.crc_errors += l.crc_errors;
        r.packets_duplicated += l.duplicated;
        r.packets_reordered += l.reordered;
    }
    Ok(r)
}

fn link_faults(f: &FabricConfig, link: usize) -> Faults {
    f.topology.links()[link].params.faults
}

/// One node: sends its quota round-robin to the others, each message
/// carrying (source, per-destination sequence number), and checks what it
/// receives for gaps, repeats and order.
#[allow(clippy::too_many_arguments)]
fn node_main(
    n: u32,
    nodes: u32,
    quota: u64,
    socket: &std::path::Path,
    tally: &Tally,
    sent_total: &AtomicU64,
    stop: &AtomicBool,
    ready: &std::sync::Barrier,
    start: Instant,
) -> anyhow::Result<()> {
    let setup = || -> anyhow::Result<_> {
        let nic = Nic::attach(socket).with_context(|| format!("node {n}: attach"))?;
        let pd = nic.alloc_pd()?;
        let mut ep = pd.create_endpoint(&EndpointConfig {
            send_entries: 256,
            recv_entries: 1024,
            free_entries: 16,
            segment_bytes: 1 << 16,
        })?;
        ep.bind(PORT)?;
        Ok((nic, pd, ep))
    };
    let made = setup();
    // Everyone waits here, failed or not, so no thread waits forever.
    ready.wait();
    let (_nic, _pd, mut ep) = made?;
    let mut next_to = vec![0u64; nodes as usize];
    // Per source: which sequence numbers arrived, and the highest.
    let mut seen: Vec<Vec<u64>> = vec![Vec::new(); nodes as usize];
    let mut highest: Vec<Option<u64>> = vec![None; nodes as usize];
    let mut sent = 0u64;
    let progress = |tally: &Tally| {
        tally
            .last_progress_ms
            .fetch_max(start.elapsed().as_millis() as u64, Ordering::Relaxed)
    };
    while !stop.load(Ordering::Relaxed) {
        let mut busy = false;
        while sent < quota {
            let dst = (n + 1 + (sent % u64::from(nodes - 1)) as u32) % nodes;
            let mut msg = [0u8; 16];
            msg[..4].copy_from_slice(&n.to_le_bytes());
            msg[8..].copy_from_slice(&next_to[dst as usize].to_le_bytes());
            let to = Address {
                node: dst,
                port: PORT,
            };
            match ep.post_send_inline(to, 0, &msg, sent) {
                Ok(()) => {
                    next_to[dst as usize] += 1;
                    sent += 1;
                    sent_total.fetch_add(1, Ordering::Relaxed);
                    busy = true;
                }
                Err(ulnic::Error::WouldBlock) => break,
                Err(e) => return Err(e).context(format!("node {n}: send")),
            }
        }
        while let Some(m) = ep.poll_recv() {
            busy = true;
            progress(tally);
            let Payload::Inline(b) = m.payload else {
                anyhow::bail!("node {n}: a message came in a buffer");
            };
            if m.returned {
                tally.returned.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let src = u32::from_le_bytes(b[..4].try_into()?) as usize;
            let seq = u64::from_le_bytes(b[8..16].try_into()?);
            anyhow::ensure!(
                src < nodes as usize && src == m.src.node as usize,
                "node {n}: message from {} claims {src}",
                m.src.node
            );
            let (word, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
            let bits = &mut seen[src];
            if bits.len() <= word {
                bits.resize(word + 1, 0);
            }
            if bits[word] & bit != 0 {
                tally.duplicated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            bits[word] |= bit;
            if highest[src].is_some_and(|h| seq < h) {
                tally.out_of_order.fetch_add(1, Ordering::Relaxed);
            }
            highest[src] = Some(highest[src].map_or(seq, |h| h.max(seq)));
            tally.delivered.fetch_add(1, Ordering::Relaxed);
        }
        while let Some(ev) = ep.poll_event() {
            busy = true;
            match ev {
                Event::SendFailed { .. } | Event::Condition(_) => {}
                Event::Unreachable { .. } => {
                    tally.unreachable.fetch_add(1, Ordering::Relaxed);
                }
                other => anyhow::bail!("node {n}: unexpected event {other:?}"),
            }
        }
        if !busy {
            ep.wait(Duration::from_millis(1))?;
        }
    }
    Ok(())
}
