//! The device's configuration (validated before anything starts) and the
//! errors of starting and steering it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::fabric::network::FabricConfig;
use crate::memory::region;
use crate::nic::utlb::CacheConfig;

/// Errors starting or steering the device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is not usable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A node's socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: vhost::vhost_user::Error,
    },
    /// A node number past the device's last node.
    #[error("no node {node}: the device has {nodes} node(s), numbered from 0")]
    NoSuchNode {
        /// The number asked for.
        node: u32,
        /// How many nodes there are.
        nodes: u32,
    },
    /// An OS resource could not be created.
    #[error("cannot create {what}: {source}")]
    Os {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// A validated device configuration, made with [`Configuration::builder`].
#[derive(Debug, Clone)]
pub struct Configuration {
    sockets: Vec<PathBuf>,
    max_endpoints: u32,
    poll_for: Duration,
    tripwires: u32,
    utlb_cache: CacheConfig,
    fabric: FabricConfig,
    engine_threads: u32,
    pio_aperture: u64,
}

impl Configuration {
    /// A builder for a device with one node per socket (socket `i` is node
    /// `i`), with the defaults: 1024 endpoints per node, 200 us of polling
    /// before sleeping, the default tripwire cap and UTLB cache, and the
    /// default fabric: one switch, every node on an ideal link (spec §10).
    pub fn builder(sockets: Vec<PathBuf>) -> ConfigurationBuilder {
        let fabric = FabricConfig::ideal(sockets.len() as u32);
        ConfigurationBuilder(Configuration {
            sockets,
            max_endpoints: DEFAULT_ENDPOINTS,
            poll_for: DEFAULT_POLL_FOR,
            tripwires: ulnic_abi::DEFAULT_TRIPWIRES,
            utlb_cache: CacheConfig::default(),
            fabric,
            engine_threads: 1,
            pio_aperture: ulnic_abi::DEFAULT_PIO_APERTURE,
        })
    }

    /// Socket paths `dir/node0.sock` ... for `n` nodes.
    pub fn socket_paths(dir: &Path, n: u32) -> Vec<PathBuf> {
        (0..n).map(|i| dir.join(format!("node{i}.sock"))).collect()
    }

    /// One socket per node; socket `i` is node `i`.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// Endpoints per node.
    pub fn max_endpoints(&self) -> u32 {
        self.max_endpoints
    }

    /// How long the engine keeps polling after the last work before it
    /// asks for doorbells and sleeps.
    pub fn poll_for(&self) -> Duration {
        self.poll_for
    }

    /// Tripwires each endpoint may set.
    pub fn tripwires(&self) -> u32 {
        self.tripwires
    }

    /// Bytes of each frontend's PIO aperture, its shared-memory region
    /// (spec §6.2); 0 when PIO windows are off.
    pub fn pio_aperture(&self) -> u64 {
        self.pio_aperture
    }

    /// Shape of the device's UTLB translation cache.
    pub fn utlb_cache(&self) -> CacheConfig {
        self.utlb_cache
    }

    /// The emulated fabric: the one set, or one switch with every node on
    /// an ideal link (spec §10).
    pub fn fabric(&self) -> &FabricConfig {
        &self.fabric
    }

    /// Engine threads (shards; spec §10.8).
    pub fn engine_threads(&self) -> u32 {
        self.engine_threads
    }

    /// With more than one engine thread: the shard of each switch of the
    /// fabric, in contiguous blocks (switches `0..S/K` to shard 0, and so
    /// on), so nodes on the same or neighbouring switches share a shard.
    pub fn shard_plan(&self) -> Option<Vec<usize>> {
        let k = self.engine_threads as usize;
        if k <= 1 {
            return None;
        }
        let switches = self.fabric.topology.switches().len();
        Some((0..switches).map(|s| s * k / switches).collect())
    }

    /// The shard serving node `n` (0 with one engine thread).
    pub fn shard_of(&self, n: u32) -> usize {
        match self.shard_plan() {
            Some(plan) => plan[self.fabric.topology.attachment(n).1],
            None => 0,
        }
    }

    /// Whether this device serves node `n` (with a fabric spanning
    /// devices, only the nodes on its own switches).
    pub fn is_local(&self, n: u32) -> bool {
        self.fabric.is_local(n)
    }

    /// Checks the limits of spec §3.
    fn validate(&self) -> Result<(), Error> {
        if self.engine_threads == 0 || self.engine_threads > 64 {
            return Err(Error::Config("--engine-threads must be 1 to 64".into()));
        }
        if self.engine_threads > 1 {
            let f = &self.fabric;
            if f.span.is_some() {
                return Err(Error::Config(
                    "a fabric spread over devices runs one engine thread per device".into(),
                ));
            }
            if f.topology.switches().len() < self.engine_threads as usize {
                return Err(Error::Config(format!(
                    "{} engine threads need at least as many switches: the engine is split by switch (the topology has {}; without --topology, one)",
                    self.engine_threads,
                    f.topology.switches().len()
                )));
            }
        }
        {
            let f = &self.fabric;
            if f.topology.nodes() as usize != self.sockets.len() {
                return Err(Error::Config(format!(
                    "the topology has {} nodes but the device {} nodes",
                    f.topology.nodes(),
                    self.sockets.len()
                )));
            }
            if let Some(span) = &f.span {
                if span.me >= span.members.len()
                    || span.switch_owner.len() != f.topology.switches().len()
                    || span.switch_owner.iter().any(|&o| o >= span.members.len())
                {
                    return Err(Error::Config(
                        "the fabric's members do not match its switches".into(),
                    ));
                }
                for (i, l) in f.topology.links().iter().enumerate() {
                    let owner = |e| match e {
                        crate::fabric::topology::End::Switch(s) => span.switch_owner[s],
                        crate::fabric::topology::End::Node(n) => {
                            span.switch_owner[f.topology.attachment(n).1]
                        }
                    };
                    let limit = ulnic_abi::datagram::MAX_MTU;
                    if owner(l.a) != owner(l.b) && l.params.mtu as usize > limit {
                        return Err(Error::Config(format!(
                            "link {i} joins two devices over UDP: its MTU must be at most {limit}"
                        )));
                    }
                }
            }
            let t = &f.transport;
            if !(1..=1024).contains(&t.window) || t.retries == 0 {
                return Err(Error::Config(
                    "the transport needs a window of 1 to 1024 and at least one retry".into(),
                ));
            }
        }
        if self.sockets.is_empty() {
            return Err(Error::Config("at least one node socket is needed".into()));
        }
        if self.sockets.len() > region::MAX_NODES {
            return Err(Error::Config(format!(
                "at most {} nodes per device",
                region::MAX_NODES
            )));
        }
        if !(1..=ulnic_abi::MAX_TRIPWIRES_LIMIT).contains(&self.tripwires) {
            return Err(Error::Config(format!(
                "--tripwires must be between 1 and {}",
                ulnic_abi::MAX_TRIPWIRES_LIMIT
            )));
        }
        self.utlb_cache.validate().map_err(Error::Config)?;
        let a = self.pio_aperture;
        if a != 0 && (!a.is_power_of_two() || !(MIN_PIO_APERTURE..=MAX_PIO_APERTURE).contains(&a)) {
            // QEMU asserts that a BAR is a power of two (spec §2).
            return Err(Error::Config(format!(
                "--pio-aperture must be 0 or a power of two from {} MiB to {} MiB, not {a} bytes",
                MIN_PIO_APERTURE >> 20,
                MAX_PIO_APERTURE >> 20
            )));
        }
        if !(1..=ulnic_abi::MAX_ENDPOINTS_LIMIT).contains(&self.max_endpoints) {
            return Err(Error::Config(format!(
                "--endpoints must be between 1 and {}",
                ulnic_abi::MAX_ENDPOINTS_LIMIT
            )));
        }
        Ok(())
    }
}

/// Endpoints per node unless set: room for a server's connections (each
/// ulnic socket is an endpoint). A slot costs the device about 330 bytes
/// until used; a guest's driver, nothing measurable (MemAvailable and
/// boot time the same at 8 and 1024, issue 33). What bounds connections
/// is then the memory they hold (the driver's `mem_limit_mb`).
pub const DEFAULT_ENDPOINTS: u32 = 1024;

/// Smallest PIO aperture (spec §3).
pub const MIN_PIO_APERTURE: u64 = 1 << 20;
/// Largest PIO aperture (spec §3): a BAR that firmware can still place.
pub const MAX_PIO_APERTURE: u64 = 1 << 30;

/// Polling time before the engine sleeps, unless set.
pub const DEFAULT_POLL_FOR: Duration = Duration::from_micros(DEFAULT_POLL_US);

/// [`DEFAULT_POLL_FOR`] in microseconds, as `--poll-us` options take it.
pub const DEFAULT_POLL_US: u64 = 200;

/// Builds a [`Configuration`]; [`ConfigurationBuilder::build`] checks it.
#[derive(Debug, Clone)]
pub struct ConfigurationBuilder(Configuration);

impl ConfigurationBuilder {
    /// Endpoints per node (1 to `ulnic_abi::MAX_ENDPOINTS_LIMIT`).
    pub fn max_endpoints(mut self, n: u32) -> Self {
        self.0.max_endpoints = n;
        self
    }

    /// How long the engine polls after the last work before it sleeps.
    pub fn poll_for(mut self, d: Duration) -> Self {
        self.0.poll_for = d;
        self
    }

    /// Tripwires each endpoint may set (1 to
    /// `ulnic_abi::MAX_TRIPWIRES_LIMIT`).
    pub fn tripwires(mut self, n: u32) -> Self {
        self.0.tripwires = n;
        self
    }

    /// Bytes of each frontend's PIO aperture (0 turns PIO windows off;
    /// else a power of two from 1 MiB to 1 GiB).
    pub fn pio_aperture(mut self, bytes: u64) -> Self {
        self.0.pio_aperture = bytes;
        self
    }

    /// Shape of the UTLB translation cache.
    pub fn utlb_cache(mut self, c: CacheConfig) -> Self {
        self.0.utlb_cache = c;
        self
    }

    /// Engine threads: more than one splits the engine by switch (needs a
    /// fabric with at least that many switches; spec §10.8).
    pub fn engine_threads(mut self, n: u32) -> Self {
        self.0.engine_threads = n;
        self
    }

    /// An emulated fabric between the nodes (spec §10): messages between
    /// nodes then cross its links as packets under the reliable transport.
    pub fn fabric(mut self, f: FabricConfig) -> Self {
        self.0.fabric = f;
        self
    }

    /// The configuration, if it is within the limits of spec §3.
    pub fn build(self) -> Result<Configuration, Error> {
        self.0.validate()?;
        Ok(self.0)
    }
}
