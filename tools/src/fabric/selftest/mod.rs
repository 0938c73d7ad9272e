//! `ulnic fabric selftest`: starts a device (or device processes joined
//! over UDP) with an emulated fabric whose links drop, corrupt, duplicate
//! and reorder packets, attaches a host process to each node, and has
//! every node run a mix of operations against every other: numbered
//! messages, RDMA writes, reads and write-immediates, and close messages.
//! Then it reports what arrived and what the targets found, per kind,
//! with the transport's and links' counters. The reliable transport
//! (spec §10.4) should make every kind's lost, duplicated, out_of_order
//! and wrong zero, whatever the faults.

pub mod counts;
pub mod layout;
pub mod node;
pub mod place;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::topology::{Faults, Topology};
use ulnic_device::fabric::transport::TransportConfig;

use counts::{Counts, Ledger, OpCounts, Tally};
use layout::{Op, MAX_NODES};
use node::Shared;
use place::{Place, Sums};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes (attached from host processes), at least 2.
    pub nodes: u32,
    /// Operations in all, spread evenly over the nodes and the kinds.
    pub messages: u64,
    /// The kinds of operation to mix.
    pub ops: Vec<Op>,
    /// Faults set on every link (unless `fabric` came from a file and
    /// none were given).
    pub faults: Option<Faults>,
    /// The fabric; the default is one switch (one per engine thread).
    pub fabric: Option<FabricConfig>,
    /// Seed of the faults.
    pub seed: u64,
    /// Cut node 1's link this long after the start, for this long.
    pub partition: Option<(Duration, Duration)>,
    /// Give up waiting for stragglers after this much quiet.
    pub quiet: Duration,
    /// Engine threads of the device in this process.
    pub threads: u32,
    /// Device processes (over loopback UDP); 1: the device runs in this
    /// process.
    pub devices: u32,
}

/// What happened. The first fields are the numbered messages' (kept from
/// before the other kinds); each other kind has its own counts.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Report {
    /// Nodes.
    pub nodes: u32,
    /// Device processes.
    pub devices: u32,
    /// Engine threads (of the device in this process).
    pub threads: u32,
    /// The kinds mixed.
    pub ops: Vec<Op>,
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
    /// RDMA writes.
    pub rdma_write: OpCounts,
    /// RDMA reads.
    pub rdma_read: OpCounts,
    /// Write-immediates.
    pub immediate: OpCounts,
    /// Close messages.
    pub close: OpCounts,
    /// UNREACHABLE events: a node the transport gave up on (spec §10.4).
    pub unreachable: u64,
    /// Seconds from the first post to the last settlement.
    pub seconds: f64,
    /// Operations settled per second.
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

impl Report {
    /// Every kind arrived once, in order, and checked right.
    pub fn clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.out_of_order == 0
            && [self.rdma_write, self.rdma_read, self.immediate, self.close]
                .iter()
                .all(OpCounts::clean)
    }

    /// Every kind arrived once, in order, and checked right, except close
    /// messages lost to a node given up on (reported UNREACHABLE: nobody
    /// is left to hand them back to).
    pub fn clean_but_given_up(&self) -> bool {
        let mut close = self.close;
        if self.unreachable > 0 {
            close.lost = 0;
        }
        Report {
            close,
            ..self.clone()
        }
        .clean()
    }

    /// Something came back or failed (what a partition past the retry
    /// budget does, and nothing else should).
    pub fn failures(&self) -> u64 {
        self.returned
            + self.unreachable
            + self.rdma_write.failed
            + self.rdma_read.failed
            + self.immediate.failed
    }
}

/// Runs the self-test; `say` gets progress lines.
pub fn run(o: &Options, say: &mut dyn FnMut(&str)) -> anyhow::Result<Report> {
    anyhow::ensure!(o.nodes >= 2, "--nodes must be at least 2");
    anyhow::ensure!(o.messages >= 1, "--messages must be at least 1");
    let mixes = o.ops != [Op::Send];
    anyhow::ensure!(
        !mixes || o.nodes <= MAX_NODES,
        "--ops beyond send supports at most {MAX_NODES} nodes (each node's segment holds a slot area per peer)"
    );
    let place = place_of(o)?;
    say(&format!(
        "device up: {} nodes, {}; {} operations ({}), seed {}",
        o.nodes,
        place.shape(),
        o.messages,
        o.ops
            .iter()
            .map(|op| op.name())
            .collect::<Vec<_>>()
            .join(","),
        o.seed
    ));
    let shared = Shared {
        nodes: o.nodes,
        ops: o.ops.clone(),
        tally: Tally::new(),
        ledger: Ledger::new(o.nodes),
        cookies: (0..o.nodes).map(|_| OnceLock::new()).collect(),
        ready: Barrier::new(o.nodes as usize),
        stop: AtomicBool::new(false),
    };
    let per_node = o.messages / u64::from(o.nodes);
    let extra = o.messages % u64::from(o.nodes);
    let sockets = place.sockets();
    let counts = std::thread::scope(|scope| -> anyhow::Result<Counts> {
        let mut threads = Vec::new();
        for n in 0..o.nodes {
            let quota = per_node + u64::from(u64::from(n) < extra);
            let (socket, shared) = (&sockets[n as usize], &shared);
            threads.push(scope.spawn(move || node::run(n, quota, socket, shared)));
        }
        let watched = watch(o, &place, &shared, say);
        shared.stop.store(true, Ordering::Relaxed);
        let mut sum = Counts::default();
        for t in threads {
            let c = t
                .join()
                .map_err(|_| anyhow::anyhow!("a node thread panicked"))??;
            sum.add(&c);
        }
        watched?;
        Ok(sum)
    })?;
    let seconds = shared.tally.last_progress_ms.load(Ordering::Relaxed) as f64 / 1000.0;
    report(o, &place.sums()?, counts, seconds)
}

/// Where the nodes run: `o.devices` processes, or a device here.
fn place_of(o: &Options) -> anyhow::Result<Place> {
    let endpoints = 4;
    if o.devices <= 1 {
        return Place::here(fabric_of(o)?, endpoints, o.threads);
    }
    anyhow::ensure!(
        o.fabric.is_none(),
        "--devices builds its own star of one switch per device process; --topology cannot be combined with it"
    );
    anyhow::ensure!(
        o.threads <= 1,
        "--threads applies to a device in this process: each of --devices' processes has one switch, so one engine thread"
    );
    Place::members(o.nodes, o.devices, endpoints, o.faults.unwrap_or_default())
}

/// The fabric to run: `o`'s or one switch, with `o`'s seed and faults,
/// whole in this process.
fn fabric_of(o: &Options) -> anyhow::Result<FabricConfig> {
    let mut fabric = match &o.fabric {
        Some(f) => f.clone(),
        None if o.threads > 1 => place::switches_for_threads(o.nodes, o.threads)?,
        None => FabricConfig {
            topology: Topology::single_switch(o.nodes),
            seed: o.seed,
            transport: TransportConfig::default(),
            span: None,
            mapping: None,
        },
    };
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

/// Quiet after an UNREACHABLE event that ends the wait for the rest.
const GIVEN_UP_QUIET_MS: u64 = 2000;

/// Waits until every node posted its share and every operation settled
/// (or nothing moved for `o.quiet`), cutting and healing node 1's link on
/// the way when `o` asks for a partition, with a progress line every 2 s.
fn watch(o: &Options, place: &Place, s: &Shared, say: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
    let tally = &s.tally;
    let mut cut = o.partition.map(|(at, len)| (at, at + len, false));
    let mut last_report = Instant::now();
    loop {
        let posted = tally.posted.load(Ordering::Relaxed);
        let settled = tally.settled.load(Ordering::Relaxed);
        let finished = tally.finished.load(Ordering::Relaxed) == u64::from(o.nodes);
        if finished && settled >= posted {
            return Ok(());
        }
        let now_ms = tally.start.elapsed().as_millis() as u64;
        let quiet = now_ms.saturating_sub(tally.last_progress_ms.load(Ordering::Relaxed));
        // A close message to or from a node the transport gave up on has
        // nobody to come back to (its endpoint is gone): the UNREACHABLE
        // events stand for it, and it is counted lost.
        if finished && tally.unreachable.load(Ordering::Relaxed) > 0 && quiet > GIVEN_UP_QUIET_MS {
            say("every node still reachable settled; the rest went to a node given up on");
            return Ok(());
        }
        if quiet > o.quiet.as_millis() as u64 {
            say(&format!(
                "no progress for {:?}; stopping ({settled} of {posted} settled)",
                o.quiet
            ));
            return Ok(());
        }
        if let Some((at, until, down)) = &mut cut {
            let now = tally.start.elapsed();
            if !*down && now >= *at && now < *until {
                place.cut(1, true)?;
                *down = true;
                say(&format!("node 1's link cut at {now:?}"));
            } else if *down && now >= *until {
                place.cut(1, false)?;
                say(&format!("node 1's link healed at {now:?}"));
                cut = None;
            }
        }
        if last_report.elapsed() > Duration::from_secs(2) {
            last_report = Instant::now();
            say(&format!(
                "{settled} of {posted} operations settled ({} of {} posted)",
                posted, o.messages
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The report: what the nodes counted and the transport and link
/// counters, summed.
fn report(o: &Options, sums: &Sums, mut c: Counts, seconds: f64) -> anyhow::Result<Report> {
    for k in [
        &mut c.send,
        &mut c.rdma_write,
        &mut c.rdma_read,
        &mut c.immediate,
        &mut c.close,
    ] {
        k.settle();
    }
    let settled = c.send.completed
        + c.send.failed
        + [c.rdma_write, c.rdma_read, c.immediate]
            .iter()
            .map(|k| k.completed + k.failed)
            .sum::<u64>()
        + c.close.completed;
    Ok(Report {
        nodes: o.nodes,
        devices: o.devices.max(1),
        threads: o.threads.max(1),
        ops: o.ops.clone(),
        sent: c.send.posted,
        delivered: c.send.completed,
        lost: c.send.lost,
        duplicated: c.send.duplicated,
        out_of_order: c.send.out_of_order,
        returned: c.send.failed,
        rdma_write: c.rdma_write,
        rdma_read: c.rdma_read,
        immediate: c.immediate,
        close: c.close,
        unreachable: c.unreachable,
        seconds,
        rate: if seconds > 0.0 {
            settled as f64 / seconds
        } else {
            0.0
        },
        retransmissions: sums.transport("retransmissions"),
        timeouts: sums.transport("timeouts"),
        nacks: sums.transport("nacks_sent"),
        duplicates_dropped: sums.transport("duplicates_dropped"),
        out_of_order_dropped: sums.transport("out_of_order_dropped"),
        packets: sums.lanes("packets"),
        packets_dropped: sums.lanes("dropped") + sums.lanes("dropped_down"),
        packets_corrupted: sums.lanes("corrupted"),
        crc_errors: sums.lanes("crc_errors"),
        packets_duplicated: sums.lanes("duplicated"),
        packets_reordered: sums.lanes("reordered"),
    })
}
