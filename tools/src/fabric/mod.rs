//! `ulnic fabric`: the topology file (`file`), the device processes of
//! a fabric spread over machines (`launch`), the self-test of the
//! reliable transport (`selftest`), and what the self-test and the
//! fabric benchmarks (`bench::fabric`) share: a device with a fabric,
//! started in this process, its nodes on temporary sockets.

pub mod file;
pub mod launch;
pub mod selftest;

pub use file::{load, route_lines};

use ulnic_device::config::Configuration;
use ulnic_device::device::Device;
use ulnic_device::fabric::network::FabricConfig;

/// A device with `fabric`, one socket per node, in this process. Drops
/// the device before its socket directory.
pub struct InProcess {
    /// The device.
    pub device: Device,
    /// Node `i`'s socket is `sockets[i]`.
    pub sockets: Vec<std::path::PathBuf>,
    _dir: tempfile::TempDir,
}

impl InProcess {
    /// Starts it, with `endpoints` endpoints per node.
    pub fn start(fabric: FabricConfig, endpoints: u32) -> anyhow::Result<InProcess> {
        let nodes = fabric.topology.nodes();
        Self::start_with(nodes, Some(fabric), endpoints)
    }

    /// Starts a device of `nodes` nodes with `fabric`, or with none (nodes
    /// one copy apart, no transport).
    pub fn start_with(
        nodes: u32,
        fabric: Option<FabricConfig>,
        endpoints: u32,
    ) -> anyhow::Result<InProcess> {
        Self::start_full(nodes, fabric, endpoints, 1)
    }

    /// Starts one with `fabric` and `threads` engine threads.
    pub fn start_sharded(
        fabric: FabricConfig,
        endpoints: u32,
        threads: u32,
    ) -> anyhow::Result<InProcess> {
        Self::start_full(fabric.topology.nodes(), Some(fabric), endpoints, threads)
    }

    fn start_full(
        nodes: u32,
        fabric: Option<FabricConfig>,
        endpoints: u32,
        threads: u32,
    ) -> anyhow::Result<InProcess> {
        let dir = tempfile::Builder::new().prefix("ulnic-fabric-").tempdir()?;
        let sockets = Configuration::socket_paths(dir.path(), nodes);
        let mut builder = Configuration::builder(sockets.clone())
            .max_endpoints(endpoints)
            .engine_threads(threads);
        if let Some(f) = fabric {
            builder = builder.fabric(f);
        }
        let config = builder.build()?;
        Ok(InProcess {
            device: Device::start(config)?,
            sockets,
            _dir: dir,
        })
    }
}
