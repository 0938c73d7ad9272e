//! A running device: its shards, one thread per node socket and the
//! engine thread, stopped in order when dropped.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{info, warn};
use vhost::vhost_user::Listener;

use std::sync::mpsc::SyncSender;

use crate::config::{Configuration, Error};
use crate::fabric::mapping::FabricMap;
use crate::fabric::network::{Captured, FabricConfig, FabricCounters};
use crate::fabric::span::MemoryShared;
use crate::fabric::topology::Faults;
use crate::memory::region;
use crate::pio::Pio;
use crate::shard::snapshot::Snapshot;
use crate::shard::{engine, Shard};
use crate::vhost::socket::serve_node;

/// A running device.
pub struct Device {
    /// One per engine thread (shard); usually one.
    shards: Vec<Arc<Shard>>,
    /// The shard serving each node.
    node_shard: Vec<usize>,
    sockets: Vec<PathBuf>,
    engines: Vec<JoinHandle<()>>,
    /// Each node's thread, and its listening socket (shut down to end an
    /// accept() the thread may be waiting in).
    node_threads: Vec<(JoinHandle<()>, std::os::fd::OwnedFd)>,
    /// Every node's PIO windows.
    pio: Arc<Pio>,
}

impl Device {
    /// Creates the node sockets, starts one thread per node and the engine
    /// (one thread per shard with `engine_threads`). Clients may connect as
    /// soon as this returns.
    pub fn start(config: Configuration) -> Result<Device, Error> {
        region::install();
        crate::notifier::install();
        let shards: Vec<Arc<Shard>> = match config.shard_plan() {
            None => vec![Arc::new(Shard::new(&config)?)],
            Some(plan) => {
                let k = config.engine_threads() as usize;
                let lanes = 2 * config.fabric().topology.links().len();
                let shared = MemoryShared::new(k, lanes).map_err(|source| Error::Os {
                    what: "the engine shards' queues",
                    source,
                })?;
                (0..k)
                    .map(|me| Shard::nth(&config, me, plan.clone(), shared.clone()).map(Arc::new))
                    .collect::<Result<_, _>>()?
            }
        };
        let node_shard: Vec<usize> = (0..config.sockets().len() as u32)
            .map(|n| config.shard_of(n))
            .collect();
        let pio = Arc::new(Pio::new(
            (0..config.sockets().len() as u32)
                .map(|n| {
                    config
                        .is_local(n)
                        .then(|| shards[node_shard[n as usize]].clone())
                })
                .collect(),
            config.pio_aperture(),
        ));
        let mut node_threads = Vec::new();
        for (node, path) in config.sockets().iter().enumerate() {
            if !config.is_local(node as u32) {
                continue; // served by another device of the fabric
            }
            let listener = Listener::new(path, true).map_err(|source| Error::Listen {
                path: path.clone(),
                source,
            })?;
            // SAFETY: the listener's descriptor is open for this call; the
            // borrow ends when the duplicate is made.
            let listening = unsafe {
                std::os::fd::BorrowedFd::borrow_raw(std::os::fd::AsRawFd::as_raw_fd(&listener))
            }
            .try_clone_to_owned()
            .map_err(|source| Error::Os {
                what: "the node's listening socket",
                source,
            })?;
            let shard = shards[node_shard[node]].clone();
            let pio = pio.clone();
            let path = path.clone();
            let thread = std::thread::Builder::new()
                .name(format!("ulnic-node{node}"))
                .spawn(move || serve_node(node as u32, shard, pio, listener, &path))
                .map_err(|source| Error::Os {
                    what: "node thread",
                    source,
                })?;
            node_threads.push((thread, listening));
            info!(
                "node {node}: listening on {}",
                config.sockets()[node].display()
            );
        }
        let poll_for = config.poll_for();
        let mut engines = Vec::new();
        for (k, shard) in shards.iter().enumerate() {
            let shard = shard.clone();
            let engine = std::thread::Builder::new()
                .name(format!("ulnic-engine{k}"))
                .spawn(move || engine::run(shard, poll_for))
                .map_err(|source| Error::Os {
                    what: "engine thread",
                    source,
                })?;
            engines.push(engine);
        }
        Ok(Device {
            shards,
            node_shard,
            sockets: config
                .sockets()
                .iter()
                .enumerate()
                .filter(|(n, _)| config.is_local(*n as u32))
                .map(|(_, p)| p.clone())
                .collect(),
            engines,
            node_threads,
            pio,
        })
    }

    /// The shared state of the first (usually only) shard, for reports and
    /// tests; `shard_of` finds a node's.
    pub fn shard(&self) -> &Arc<Shard> {
        &self.shards[0]
    }

    /// The shard serving node `n`.
    pub fn shard_of(&self, n: u32) -> &Arc<Shard> {
        let k = self.node_shard.get(n as usize).copied().unwrap_or(0);
        &self.shards[k]
    }

    /// Every shard.
    pub fn shards(&self) -> &[Arc<Shard>] {
        &self.shards
    }

    /// The node sockets.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// Holds every engine thread still (true) or lets them go: the drain
    /// benchmark fills rings first. Control commands still run.
    pub fn pause(&self, paused: bool) {
        for s in &self.shards {
            s.paused.store(paused, Ordering::Relaxed);
            s.wake();
        }
    }

    /// Waits until nothing more will happen without a new request: no
    /// kick read and not acted on, and the last `SETTLED_PASSES` passes of
    /// every engine thread, all made after this call, moved nothing with
    /// nothing due (no packet in flight, no retry or timer pending).
    /// Whether that happened within `timeout`. Tests use it before
    /// asserting that something did not happen; a frontend's own kick
    /// must have been taken first (its eventfd read empty).
    pub fn settle(&self, timeout: Duration) -> bool {
        const SETTLED_PASSES: u64 = 3;
        let deadline = Instant::now() + timeout;
        let mut from: Vec<u64> = self.shards.iter().map(|s| s.passes().0).collect();
        loop {
            if crate::vring::kicks_in_hand() > 0 {
                from = self.shards.iter().map(|s| s.passes().0).collect();
            } else if self.shards.iter().zip(&from).all(|(s, f)| {
                let (passes, run) = s.passes();
                passes >= f + SETTLED_PASSES && run >= SETTLED_PASSES
            }) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // An engine asleep makes a pass when woken.
            for s in &self.shards {
                s.wake();
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// When an engine thread last finished a pass that moved something
    /// (the latest over the shards).
    pub fn last_busy(&self) -> std::time::Instant {
        self.shards
            .iter()
            .map(|s| s.last_busy())
            .max()
            .unwrap_or_else(std::time::Instant::now)
    }

    /// The fabric's counters, summed over the shards (each counts the
    /// lanes it sends on, the switches and nodes it serves).
    pub fn fabric_counters(&self) -> Option<FabricCounters> {
        let mut all = self.shards.iter().filter_map(|s| s.fabric_counters());
        let mut sum = all.next()?;
        for c in all {
            sum.add(&c);
        }
        Some(sum)
    }

    /// Changes a link's faults (in every shard: the one sending on a lane
    /// emulates it).
    pub fn set_link_faults(&self, link: usize, faults: Faults) -> Result<(), Error> {
        for s in &self.shards {
            s.set_link_faults(link, faults)?;
        }
        Ok(())
    }

    /// Captures a link's packets from every shard into `to`.
    pub fn capture(&self, lanes: Vec<usize>, to: SyncSender<Captured>) -> Result<(), Error> {
        for s in &self.shards {
            s.capture(lanes.clone(), to.clone())?;
        }
        Ok(())
    }

    /// Runs a mapping round on the shard serving the mapper's node and
    /// waits up to `timeout` for it: what it found. An error when the
    /// device has no fabric, or the round does not finish in time.
    pub fn map_fabric(&self, timeout: Duration) -> Result<FabricMap, Error> {
        let no_mapper = || {
            Error::Config("no mapper runs on this device (it has no fabric, or the mapper's node is on another member)".into())
        };
        let (shard, round) = self
            .shards
            .iter()
            .find_map(|s| Some((s, s.request_map()?)))
            .ok_or_else(no_mapper)?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(m) = shard.last_map().filter(|m| m.round >= round) {
                return Ok(m);
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::Config(format!(
                    "mapping round {round} did not finish within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The fabric's settings, if any.
    pub fn fabric_config(&self) -> Option<FabricConfig> {
        self.shards[0].fabric_config()
    }

    /// One-way delays through the fabric since the last call, every shard.
    pub fn take_fabric_delays(&self) -> Vec<u64> {
        self.shards
            .iter()
            .flat_map(|s| s.take_fabric_delays())
            .collect()
    }

    /// Every counter of the device: each node from the shard serving it,
    /// the fabric's summed.
    pub fn snapshot(&self) -> Snapshot {
        let mut shots: Vec<Snapshot> = self.shards.iter().map(|s| s.snapshot()).collect();
        let mut out = shots.remove(0);
        for (n, node) in out.nodes.iter_mut().enumerate() {
            let k = self.node_shard.get(n).copied().unwrap_or(0);
            if k > 0 {
                if let Some(theirs) = shots[k - 1].nodes.get(n) {
                    *node = theirs.clone();
                }
            }
        }
        for s in &shots {
            out.totals.add(&s.totals);
            if let (Some(mine), Some(theirs)) = (out.fabric.as_mut(), s.fabric.as_ref()) {
                mine.0.add(&theirs.0);
            }
        }
        let pio = &self.pio.counters;
        out.totals.pio_maps = pio.maps.load(Ordering::Relaxed);
        out.totals.pio_unmaps = pio.unmaps.load(Ordering::Relaxed);
        out.totals.pio_commands = pio.commands.load(Ordering::Relaxed);
        out
    }
}

/// How long stopping a device waits for each node thread to finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

impl Drop for Device {
    /// Stops the device as a crash would, but in order: every frontend's
    /// connection is closed (to QEMU its backend is gone), the node threads
    /// and the engine end, and the sockets are removed.
    fn drop(&mut self) {
        let mut handles = Vec::new();
        for shard in &self.shards {
            shard.stop.store(true, Ordering::Relaxed);
            handles.extend(
                shard
                    .lock()
                    .nodes
                    .iter_mut()
                    .filter_map(|n| n.disconnect.take()),
            );
        }
        for h in handles {
            h.shutdown();
        }
        // A node thread waiting in accept() returns from it once its
        // listening socket is shut down (whether or not the socket's path
        // is still there), and then sees `stop`.
        for (_, listening) in &self.node_threads {
            // SAFETY: shutdown on a descriptor this device owns.
            unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(listening), libc::SHUT_RDWR) };
        }
        for shard in &self.shards {
            shard.wake();
        }
        for e in self.engines.drain(..) {
            let _ = e.join();
        }
        let deadline = std::time::Instant::now() + STOP_GRACE;
        for (p, _listening) in self.node_threads.drain(..) {
            while !p.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if p.is_finished() {
                let _ = p.join();
            } else {
                warn!("a node thread did not stop within {STOP_GRACE:?}");
            }
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

impl Device {
    /// What PIO windows sent the frontends so far (spec §6.2).
    pub fn pio_counters(&self) -> &crate::pio::PioCounters {
        &self.pio.counters
    }
}
