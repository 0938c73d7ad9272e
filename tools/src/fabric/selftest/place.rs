//! Where the self-test's nodes live: one device in this process (one or
//! more engine threads), or device processes on this machine joined over
//! loopback UDP (spec §10.7). Either way: the nodes' sockets, a node's
//! link cut and healed, and the transport and link counters summed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use ulnic_device::config::Configuration;
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::topology::Faults;

use crate::control::{Client, FaultSpec, Request, Stats};
use crate::fabric::launch::{star_topology, LocalMembers, NodeSettings};
use crate::fabric::InProcess;

/// Counters by name, summed over nodes (transport) or lanes (links).
#[derive(Debug, Default)]
pub struct Sums {
    /// Transport counters (spec §10.4), summed over the nodes.
    pub transport: BTreeMap<String, u64>,
    /// Link counters, summed over every lane.
    pub lanes: BTreeMap<String, u64>,
}

impl Sums {
    /// The transport counter `k` (0 if absent).
    pub fn transport(&self, k: &str) -> u64 {
        self.transport.get(k).copied().unwrap_or(0)
    }

    /// The link counter `k` (0 if absent).
    pub fn lanes(&self, k: &str) -> u64 {
        self.lanes.get(k).copied().unwrap_or(0)
    }
}

fn add_all<'a>(to: &mut BTreeMap<String, u64>, from: impl IntoIterator<Item = (&'a str, u64)>) {
    for (k, v) in from {
        *to.entry(k.to_string()).or_default() += v;
    }
}

/// The device (or devices) under test.
pub enum Place {
    /// One device in this process.
    Here {
        /// It, with its sockets.
        run: InProcess,
        /// Its fabric (for the faults to restore after a cut).
        fabric: Box<FabricConfig>,
    },
    /// Device processes over loopback UDP.
    Members {
        /// They (killed when dropped).
        members: LocalMembers,
        /// Their directory: topology, key, sockets, control sockets, logs.
        dir: tempfile::TempDir,
        /// Node `i`'s socket.
        sockets: Vec<PathBuf>,
        /// The faults every link has.
        faults: FaultSpec,
    },
}

impl Place {
    /// A device in this process with `threads` engine threads, behind
    /// `fabric`.
    pub fn here(fabric: FabricConfig, endpoints: u32, threads: u32) -> anyhow::Result<Place> {
        let run = InProcess::start_sharded(fabric.clone(), endpoints, threads)?;
        Ok(Place::Here {
            run,
            fabric: Box::new(fabric),
        })
    }

    /// `devices` device processes serving `nodes` nodes, a star of one
    /// switch each, every link with `faults`.
    pub fn members(
        nodes: u32,
        devices: u32,
        endpoints: u32,
        faults: Faults,
    ) -> anyhow::Result<Place> {
        let dir = tempfile::Builder::new()
            .prefix("ulnic-selftest-")
            .tempdir()?;
        let members = LocalMembers::start(
            dir.path(),
            nodes,
            devices,
            &NodeSettings::with_endpoints(endpoints),
        )?;
        let spec = FaultSpec::of(&faults);
        members.set_every_link(dir.path(), spec)?;
        Ok(Place::Members {
            sockets: Configuration::socket_paths(dir.path(), nodes),
            members,
            dir,
            faults: spec,
        })
    }

    /// Node `i`'s socket is the `i`-th.
    pub fn sockets(&self) -> Vec<PathBuf> {
        match self {
            Place::Here { run, .. } => run.sockets.clone(),
            Place::Members { sockets, .. } => sockets.clone(),
        }
    }

    /// Switches and links, for the progress line.
    pub fn shape(&self) -> String {
        match self {
            Place::Here { fabric, run } => format!(
                "{} switch(es) in this process, {} engine thread(s)",
                fabric.topology.switches().len(),
                run.device.shards().len()
            ),
            Place::Members { members, .. } => format!(
                "{} device processes joined over loopback UDP",
                members.members.len()
            ),
        }
    }

    /// Sends `r` to every member (each emulates the lanes it sends on).
    fn tell_all(&self, r: &Request) -> anyhow::Result<()> {
        let Place::Members { members, dir, .. } = self else {
            anyhow::bail!("no device processes");
        };
        for m in &members.members {
            let mut c = Client::connect(dir.path(), Some(&m.name))?;
            c.send(r)?;
            c.checked_line()
                .with_context(|| format!("member {}", m.name))?;
        }
        Ok(())
    }

    /// Cuts (`down`) or heals the link `node` hangs on.
    pub fn cut(&self, node: u32, down: bool) -> anyhow::Result<()> {
        match self {
            Place::Here { run, fabric } => {
                let link = fabric.topology.attachment(node).0;
                let faults = fabric.topology.links()[link].params.faults;
                run.device
                    .set_link_faults(link, Faults { down, ..faults })?;
                Ok(())
            }
            Place::Members { faults, .. } => self.tell_all(&Request::SetFaults {
                link: None,
                node: Some(node),
                faults: FaultSpec { down, ..*faults },
            }),
        }
    }

    /// The counters now, summed.
    pub fn sums(&self) -> anyhow::Result<Sums> {
        let mut s = Sums::default();
        match self {
            Place::Here { run, .. } => {
                let c = run
                    .device
                    .fabric_counters()
                    .context("the device has no fabric")?;
                for t in &c.transport {
                    add_all(&mut s.transport, t.named());
                }
                for l in &c.lanes {
                    add_all(&mut s.lanes, l.named());
                }
            }
            Place::Members { members, dir, .. } => {
                for m in &members.members {
                    let mut c = Client::connect(dir.path(), Some(&m.name))?;
                    c.send(&Request::Stats)?;
                    let stats: Stats = serde_json::from_str(&c.line()?)
                        .with_context(|| format!("member {}'s stats", m.name))?;
                    for n in &stats.nodes {
                        if let Some(t) = &n.transport {
                            add_all(&mut s.transport, t.iter().map(|(k, v)| (k.as_str(), *v)));
                        }
                    }
                    for l in &stats.links {
                        for d in &l.directions {
                            add_all(&mut s.lanes, d.iter().map(|(k, v)| (k.as_str(), *v)));
                        }
                    }
                }
            }
        }
        Ok(s)
    }
}

/// One switch per engine thread (the engine is split by switch), nodes
/// dealt in blocks, whole in this process: what `--threads T` runs on
/// when no topology is given.
pub fn switches_for_threads(nodes: u32, threads: u32) -> anyhow::Result<FabricConfig> {
    // The star's [[device]] entries are dropped (the fabric is run here
    // whole): its addresses are placeholders, never bound.
    let addresses: Vec<std::net::SocketAddr> = (0..threads)
        .map(|k| std::net::SocketAddr::from(([127, 0, 0, 1], 1 + k as u16)))
        .collect();
    let mut f = crate::fabric::file::parse(&star_topology(nodes, &addresses)?)?;
    f.span = None;
    Ok(f)
}
