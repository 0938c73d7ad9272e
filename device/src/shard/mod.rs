//! A shard: the state every node thread and the engine share (the
//! nodes behind one lock, the engine's wake-up, fault injection), the
//! data path between nodes (`nodes`), remote memory (`rdma`) and the
//! engine thread (`engine`).

pub mod access;
pub mod counters;
pub mod engine;
pub mod nodes;
pub mod pass;
pub mod rdma;
pub mod remote;
pub mod send;
pub mod sink;
pub mod snapshot;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::{error, info};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::{Configuration, Error};
use std::sync::mpsc::SyncSender;

use crate::fabric::mapping::FabricMap;
use crate::fabric::network::{Captured, FabricConfig, FabricCounters, Network};
use crate::fabric::topology::Faults;
use crate::memory::region;
use crate::nic::utlb::TranslationCache;
use crate::shard::nodes::Nodes;
use crate::shard::snapshot::{EndpointSnapshot, NodeSnapshot, Snapshot};

/// State shared by every node thread and the engine.
pub struct Shard {
    state: Mutex<Nodes>,
    wake: EventFd,
    /// A spanning fabric's UDP socket (owned by the network, which lives
    /// as long as the shard): a datagram wakes the engine too.
    udp: Option<std::os::fd::RawFd>,
    /// Set to stop the engine.
    pub stop: AtomicBool,
    /// Set to hold the engine still (the drain benchmark fills rings
    /// first); control commands still run.
    pub paused: AtomicBool,
    /// Set while the engine sleeps waiting for doorbells: a kick is then
    /// served by the thread that received it (`kicked`).
    sleeping: AtomicBool,
    /// Each node's `Node::kicked` word, reachable without the lock.
    kicks: Vec<Arc<AtomicU64>>,
    /// When the engine last finished a pass that moved something, in
    /// nanoseconds after `born` (the drain benchmark's end, read without
    /// a lock or a thread polling beside the engines).
    busy_at: AtomicU64,
    /// Engine passes, and how many of the latest in a row found nothing
    /// to do with nothing due (`Device::settle`).
    passes: AtomicU64,
    quiet_run: AtomicU64,
    born: Instant,
    /// Endpoints per node.
    pub max_endpoints: u32,
    /// Number of nodes.
    pub nodes: u32,
    /// Node `i` watches its shared memory under key `watch_base + i`
    /// (`region`).
    pub watch_base: u32,
}

impl Shard {
    /// The only shard of a device configured by `config`, its nodes empty.
    pub fn new(config: &Configuration) -> Result<Shard, Error> {
        let network = Network::new(config.fabric().clone()).map_err(|source| Error::Os {
            what: "the fabric's UDP socket",
            source,
        })?;
        Self::with_network(config, Some(network))
    }

    /// Shard `me` of a device whose engine is split by switch (spec
    /// §10.8): its own nodes, lock and engine, the fabric's switches
    /// `switch_owner` gives it, and queues to the other shards.
    pub fn nth(
        config: &Configuration,
        me: usize,
        switch_owner: Vec<usize>,
        shared: Arc<crate::fabric::span::MemoryShared>,
    ) -> Result<Shard, Error> {
        let network = Network::shard(config.fabric().clone(), me, switch_owner, shared);
        Self::with_network(config, Some(network))
    }

    fn with_network(config: &Configuration, network: Option<Network>) -> Result<Shard, Error> {
        let count = config.sockets().len() as u32;
        let mut nodes = Nodes::new(count, config.max_endpoints());
        nodes.max_tripwires = config.tripwires();
        nodes.resident_idle = config.poll_for();
        nodes.utlb.cache = TranslationCache::new(config.utlb_cache());
        nodes.network = network;
        let udp = nodes.network.as_ref().and_then(Network::wire_fd);
        let kicks = nodes.nodes.iter().map(|n| n.kicked.clone()).collect();
        Ok(Shard {
            udp,
            state: Mutex::new(nodes),
            wake: EventFd::new(EFD_NONBLOCK).map_err(|source| Error::Os {
                what: "eventfd",
                source,
            })?,
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            kicks,
            busy_at: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            quiet_run: AtomicU64::new(0),
            born: Instant::now(),
            max_endpoints: config.max_endpoints(),
            nodes: count,
            watch_base: region::reserve_keys(count).map_err(|e| Error::Config(e.to_string()))?,
        })
    }

    /// Locks the nodes. A panic elsewhere cannot leave them half-updated in a
    /// way that matters more than stopping would, so poisoning is ignored.
    pub fn lock(&self) -> MutexGuard<'_, Nodes> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the engine's pass that ended at `at` moved something.
    pub fn mark_busy(&self, at: Instant) {
        let ns = at.saturating_duration_since(self.born).as_nanos() as u64;
        self.busy_at.store(ns, Ordering::Release);
    }

    /// When the engine last finished a pass that moved something (its
    /// creation if never).
    pub fn last_busy(&self) -> Instant {
        self.born + Duration::from_nanos(self.busy_at.load(Ordering::Acquire))
    }

    /// Records one engine pass: `quiet` if it moved nothing and nothing
    /// was due.
    pub fn count_pass(&self, quiet: bool) {
        // Only the engine thread writes these: plain loads and stores, no
        // locked instruction on a path taken every pass. The run is
        // written first, so a reader that sees the new total sees it.
        let run = self.quiet_run.load(Ordering::Relaxed);
        let run = if quiet { run + 1 } else { 0 };
        self.quiet_run.store(run, Ordering::Relaxed);
        let passes = self.passes.load(Ordering::Relaxed);
        self.passes.store(passes + 1, Ordering::Release);
    }

    /// Engine passes so far, and how many of the latest in a row were
    /// quiet.
    pub fn passes(&self) -> (u64, u64) {
        // The total first (Acquire: the run written before it is seen),
        // then the run: a pass counted between the two loads can only
        // make the run look newer than the total, which `settle` allows
        // for by asking for several passes.
        let passes = self.passes.load(Ordering::Acquire);
        (passes, self.quiet_run.load(Ordering::Relaxed))
    }

    /// Wakes the engine if it sleeps.
    pub fn wake(&self) {
        let _ = self.wake.write(1);
    }

    /// Ends the connection of every node whose shared memory faulted
    /// (a file shrunk under the device, spec §2.3): that frontend loses its
    /// node, everyone else goes on. Cheap when nothing faulted.
    pub fn disconnect_faulted(&self) {
        if !region::pending() {
            return;
        }
        for key in region::take_faulted(self.watch_base, self.nodes) {
            let node = key - self.watch_base;
            let mut f = self.lock();
            let Some(n) = f.nodes.get_mut(node as usize) else {
                continue;
            };
            n.memory_faults += 1;
            error!(
                "node {node}: its shared memory shrank under the device (contained fault {} in all); disconnecting its frontend",
                region::fault_count()
            );
            let disconnect = n.disconnect.take();
            // Nothing more is read from that memory, and the state is
            // gone before the frontend sees its connection end (spec §8).
            f.reset_node(node);
            let n = &mut f.nodes[node as usize];
            n.mem = None;
            n.renew_epoch();
            if let Some(d) = disconnect {
                d.shutdown();
            }
        }
    }

    /// Stops serving node `node`'s control queue (`stalled`), or serves it
    /// again: a fault injected on purpose, to see how a driver copes with
    /// a device that stops answering commands. Commands wait in the ring
    /// while doorbells, data and notifications go on; when the stall ends
    /// the waiting commands run. Kept across resets of the node.
    pub fn stall_control(&self, node: u32, stalled: bool) -> Result<(), Error> {
        let mut f = self.lock();
        let n = f.nodes.get_mut(node as usize).ok_or(Error::NoSuchNode {
            node,
            nodes: self.nodes,
        })?;
        n.control_stalled = stalled;
        info!(
            "node {node}: control queue {}",
            if stalled {
                "stalled (fault injected)"
            } else {
                "served again"
            }
        );
        if !stalled {
            n.kick_control();
        }
        Ok(())
    }

    /// Replaces the faults link `link` injects, on a running device
    /// (`ulnic fabric set`); an error when the device has no fabric or no
    /// such link, or the faults are out of range.
    pub fn set_link_faults(&self, link: usize, faults: Faults) -> Result<(), Error> {
        let mut f = self.lock();
        let net = f
            .network
            .as_mut()
            .ok_or_else(|| Error::Config("this device has no emulated fabric".into()))?;
        net.set_faults(link, faults).map_err(Error::Config)?;
        info!("link {link}: faults now {faults:?}");
        Ok(())
    }

    /// Asks this shard's mapper for a round and wakes the engine to run
    /// it; the round to wait for, or `None` when no mapper runs here.
    pub fn request_map(&self) -> Option<u64> {
        let round = self.lock().network.as_mut()?.request_map();
        self.wake();
        round
    }

    /// What this shard's mapper found last, if it runs here and finished
    /// a round.
    pub fn last_map(&self) -> Option<FabricMap> {
        self.lock().network.as_ref()?.last_map().cloned()
    }

    /// The fabric's counters, if the device has a fabric.
    pub fn fabric_counters(&self) -> Option<FabricCounters> {
        self.lock().network.as_ref().map(Network::counters)
    }

    /// One-way delays through the fabric (ns) of messages between this
    /// device's nodes since the last call (empty without a fabric).
    pub fn take_fabric_delays(&self) -> Vec<u64> {
        self.lock()
            .network
            .as_mut()
            .map(Network::take_delays)
            .unwrap_or_default()
    }

    /// The fabric's shape and settings (faults as last set), if any.
    pub fn fabric_config(&self) -> Option<FabricConfig> {
        self.lock().network.as_ref().map(|n| n.config().clone())
    }

    /// Starts capturing the packets handed to `lanes` (`2 * link` and
    /// `2 * link + 1` are a link's two directions) into `to`, until its
    /// receiver is dropped. An error when the device has no fabric.
    pub fn capture(&self, lanes: Vec<usize>, to: SyncSender<Captured>) -> Result<(), Error> {
        let mut f = self.lock();
        let net = f
            .network
            .as_mut()
            .ok_or_else(|| Error::Config("this device has no emulated fabric".into()))?;
        net.tap(lanes, to);
        Ok(())
    }

    /// Every counter of the device, at one moment.
    pub fn snapshot(&self) -> Snapshot {
        let f = self.lock();
        let nodes = f
            .nodes
            .iter()
            .map(|n| NodeSnapshot {
                node: n.id,
                attached: n.mem.is_some(),
                connections: n.connections,
                endpoints: n
                    .endpoints
                    .iter()
                    .enumerate()
                    .filter_map(|(i, e)| {
                        let e = e.as_ref()?;
                        Some(EndpointSnapshot {
                            id: i as u32,
                            port: e.port,
                            stats: e.stats.to_array(),
                            in_flight: e.events_owed,
                        })
                    })
                    .collect(),
                queue_errors: n.queue_errors,
                memory_faults: n.memory_faults,
                vhost_wakeups: n.vhost_reader.and_then(crate::vhost::reader::wakeups),
            })
            .collect();
        let fabric = f.network.as_ref().map(|net| {
            let topo = &net.config().topology;
            let links = (0..topo.links().len()).map(|l| topo.link_name(l)).collect();
            (net.counters(), links, topo.switches().to_vec())
        });
        Snapshot {
            nodes,
            totals: f.counters,
            fabric,
        }
    }

    /// When node `node` was last reset (its frontend left, reset the
    /// device, or its guest rebooted); `None` if never.
    pub fn last_reset(&self, node: u32) -> Option<std::time::Instant> {
        self.lock()
            .nodes
            .get(node as usize)
            .and_then(|n| n.reset_at)
    }

    /// A kick of node `node`'s virtqueue `queue` (a doorbell, spec §5.8).
    /// While the engine runs, it is recorded for the engine's next pass,
    /// without the lock. While the engine sleeps, this thread does the
    /// pass the engine would have woken for: the kicked endpoints' sends
    /// are served and their receivers notified from here, without waiting
    /// for the engine to wake. Then the engine is woken to poll them for
    /// its idle period; with none (`poll_for` zero) it sleeps on, so a
    /// blocking message costs the device one thread wake-up, not two.
    pub fn kicked(&self, node: u32, queue: u16) {
        let Some(kicked) = self.kicks.get(node as usize) else {
            return;
        };
        crate::nic::doorbell::record_kick(kicked, queue);
        // Pairs with `sleep_for_doorbells`: either it sees the kick and
        // does not sleep, or this sees it sleeping.
        if !self.sleeping.load(Ordering::SeqCst) {
            return;
        }
        if self.paused.load(Ordering::Relaxed) {
            // Served when the pause ends (which wakes the engine).
            return;
        }
        self.disconnect_faulted();
        let mut nodes = self.lock();
        nodes.counters.kicks_served_asleep += 1;
        if nodes.poll() > 0 {
            self.mark_busy(Instant::now());
        }
        if nodes.resident_total() == 0 {
            return;
        }
        // With an idle period to poll for, the engine takes the kicked
        // endpoints over, as it would have after waking (an owner that
        // sends again soon is then polled, not rung for). Without one,
        // they ask for doorbells again and the engine sleeps on, unless
        // sends wait that this pass could not serve.
        if !nodes.resident_idle.is_zero() || nodes.leave_all() > 0 {
            drop(nodes);
            self.wake();
        }
    }

    /// The engine's sleep when idle: until woken, a kick or `timeout`.
    /// Returns at once if a kick came since the engine last looked.
    /// True when only the clock ended it (no wake, kick or datagram).
    pub fn sleep_for_doorbells(&self, timeout: Duration) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        let kicked = self.kicks.iter().any(|k| k.load(Ordering::SeqCst) != 0);
        let clock = !kicked && !self.sleep(timeout);
        self.sleeping.store(false, Ordering::SeqCst);
        clock && !self.kicks.iter().any(|k| k.load(Ordering::SeqCst) != 0)
    }

    /// Counts a lost wake-up found by the engine's safety net (the
    /// `found_by_timer` total, spec §10.6.1).
    pub fn count_found_by_timer(&self) {
        self.lock().counters.found_by_timer += 1;
    }

    /// Sleeps until woken or `timeout`: true when woken (the wake eventfd
    /// or a datagram), false when the clock ended it.
    pub fn sleep(&self, timeout: Duration) -> bool {
        let fd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // A negative fd is ignored by poll: no UDP socket, no second entry.
        let mut pfds = [fd(self.wake.as_raw_fd()), fd(self.udp.unwrap_or(-1))];
        // SAFETY: `pfds` is a valid array of two pollfds for the duration
        // of the call, and the count passed is its length.
        let r = unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                timeout.as_millis() as i32,
            )
        };
        let _ = self.wake.read();
        r != 0
    }
}
