//! The fabric a cluster's guests sit behind (`--topology`, fault flags):
//! the device (or device processes) started for a cluster with it, and
//! how `cluster status` describes it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use ulnic_device::config::Configuration;
use ulnic_device::fabric::topology::Faults;
use ulnic_device::Device;

use crate::control::FaultSpec;
use crate::fabric::launch::{free_loopback_ports, LocalMembers, NodeSettings};

/// Where a cluster's guests sit (flattened into `cluster up/run/bench`
/// and the supervisor's arguments).
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FabricArgs {
    /// Put the guests behind the emulated fabric this topology file
    /// describes (docs/spec.md §10: switches, links with rate, latency,
    /// MTU and faults; node i is guest i, so its `nodes` must be at
    /// least --nodes: nodes beyond the guests are ports with nothing
    /// plugged in). With --devices D its switches are dealt to D device
    /// processes in contiguous blocks (it needs at least D switches and
    /// no [[device]] entries of its own). Without it: one switch, ideal
    /// links. Examples in docs/topologies/. Faults can be changed on a
    /// running cluster with `ulnic fabric set --device STATE_DIR --member
    /// dK` only when it has --devices 2 or more (one device lives inside
    /// the cluster's supervisor, which has no device control socket).
    #[arg(long, value_name = "FILE")]
    pub topology: Option<PathBuf>,
    /// Probability each link loses a packet (every link, both ways).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub drop: f64,
    /// Probability each link flips a bit of a packet (its CRC then fails).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub corrupt: f64,
    /// Probability each link delivers a packet twice.
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub duplicate: f64,
    /// Probability each link lets a packet be overtaken.
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub reorder: f64,
}

impl FabricArgs {
    /// The faults every link gets, as the control protocol spells them.
    fn spec(&self) -> FaultSpec {
        FaultSpec {
            drop: self.drop,
            corrupt: self.corrupt,
            duplicate: self.duplicate,
            reorder: self.reorder,
            ..FaultSpec::default()
        }
    }

    /// The faults every link gets (checked).
    fn faults(&self) -> anyhow::Result<Faults> {
        let f = self.spec().faults()?;
        f.check()
            .map_err(|why| anyhow::anyhow!("fault flags: {why}"))?;
        Ok(f)
    }

    fn faulty(&self) -> bool {
        self.faults().is_ok_and(|f| !f.none())
    }

    /// The device's sockets for a cluster of `nodes` guests in `dir`: one
    /// per node of the topology (guest i is node i; nodes beyond the
    /// guests are switch ports with nothing plugged in), or one per guest
    /// without a topology. Refuses a topology with fewer nodes than guests.
    pub fn sockets(&self, dir: &Path, nodes: u32) -> anyhow::Result<Vec<PathBuf>> {
        let count = match &self.topology {
            None => nodes,
            Some(t) => {
                let have = crate::fabric::load(t)?.topology.nodes();
                anyhow::ensure!(
                    have >= nodes,
                    "the topology {} has {have} nodes, fewer than --nodes {nodes} (guest i is node i)",
                    t.display()
                );
                have
            }
        };
        Ok(Configuration::socket_paths(dir, count))
    }

    /// The same, with the topology's path made absolute (the supervisor
    /// process may not share this one's directory), checked to exist and
    /// to have a node for each of `nodes` guests.
    pub fn resolved(&self, nodes: u32) -> anyhow::Result<FabricArgs> {
        self.faults()?;
        self.sockets(Path::new("."), nodes)?;
        let mut f = self.clone();
        if let Some(t) = &self.topology {
            f.topology = Some(
                std::fs::canonicalize(t)
                    .with_context(|| format!("the topology {}", t.display()))?,
            );
        }
        Ok(f)
    }

    /// The same flags as a command line (for the supervisor process).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(t) = &self.topology {
            a.push("--topology".into());
            a.push(t.display().to_string());
        }
        for (flag, p) in [
            ("--drop", self.drop),
            ("--corrupt", self.corrupt),
            ("--duplicate", self.duplicate),
            ("--reorder", self.reorder),
        ] {
            if p != 0.0 {
                a.push(flag.into());
                a.push(p.to_string());
            }
        }
        a
    }

    /// One line for `cluster status` and progress.
    pub fn describe(&self, devices: u32) -> String {
        let shape = match &self.topology {
            Some(t) if devices > 1 => format!(
                "topology {}, its switches dealt to {devices} device processes",
                t.display()
            ),
            Some(t) => format!("topology {}", t.display()),
            None if devices > 1 => format!("a star of {devices} device processes"),
            None => "one switch, ideal links".into(),
        };
        if self.faulty() {
            format!(
                "{shape}; every link: drop {} corrupt {} duplicate {} reorder {}",
                self.drop, self.corrupt, self.duplicate, self.reorder
            )
        } else {
            shape
        }
    }
}

/// The configuration of a cluster's device in one process: `sockets`,
/// each node given `settings`, behind the fabric `f` asks for.
pub fn configuration(
    sockets: &[PathBuf],
    settings: &NodeSettings,
    f: &FabricArgs,
) -> anyhow::Result<Configuration> {
    let faults = f.faults()?;
    let mut b = Configuration::builder(sockets.to_vec())
        .max_endpoints(settings.endpoints)
        .poll_for(std::time::Duration::from_micros(settings.poll_us));
    if f.topology.is_some() || !faults.none() {
        let mut fabric = match &f.topology {
            Some(t) => crate::fabric::load(t)?,
            None => ulnic_device::fabric::network::FabricConfig::ideal(sockets.len() as u32),
        };
        anyhow::ensure!(
            fabric.span.is_none(),
            "the topology names device processes ([[device]]): a cluster deals them with --devices"
        );
        for l in 0..fabric.topology.links().len() {
            fabric.topology.set_faults(l, faults)?;
        }
        b = b.fabric(fabric);
    }
    Ok(b.build()?)
}

/// The guests' device for `sockets` (in `dir`): in this process, or
/// spread over `devices` processes joined over loopback UDP, behind the
/// fabric `f` asks for, each node given `settings`.
pub fn start_devices(
    dir: &Path,
    sockets: &[PathBuf],
    devices: u32,
    settings: &NodeSettings,
    f: &FabricArgs,
) -> anyhow::Result<(Option<Device>, Option<LocalMembers>)> {
    let faults = f.faults()?;
    let nodes = sockets.len() as u32;
    if devices <= 1 {
        let config = configuration(sockets, settings, f)?;
        return Ok((Some(Device::start(config)?), None));
    }
    let members = match &f.topology {
        Some(t) => {
            let text = std::fs::read_to_string(t)
                .with_context(|| format!("cannot read {}", t.display()))?;
            let spread = spread(&text, &free_loopback_ports(devices)?)?;
            LocalMembers::start_with(dir, &spread, settings)?
        }
        None => LocalMembers::start(dir, nodes, devices, settings)?,
    };
    if !faults.none() {
        members.set_every_link(dir, f.spec())?;
    }
    Ok((None, Some(members)))
}

/// `text` (a topology without [[device]] entries) spread over one device
/// process per address: switch s of S to process `s * D / S`.
pub fn spread(text: &str, addresses: &[std::net::SocketAddr]) -> anyhow::Result<String> {
    let config = crate::fabric::file::parse(text)?;
    anyhow::ensure!(
        config.span.is_none(),
        "the topology names device processes ([[device]]): a cluster deals them with --devices"
    );
    let switches = config.topology.switches();
    let d = addresses.len();
    anyhow::ensure!(
        switches.len() >= d,
        "{} switch(es) cannot be spread over {d} device processes (each needs one)",
        switches.len()
    );
    let mut t = text.to_string();
    t += "\n# Added by `ulnic cluster`: the switches dealt to device processes.\n";
    for (k, a) in addresses.iter().enumerate() {
        let mine: Vec<String> = switches
            .iter()
            .enumerate()
            .filter(|(s, _)| s * d / switches.len() == k)
            .map(|(_, name)| format!("\"{name}\""))
            .collect();
        t += &format!(
            "\n[[device]]\nname = \"d{k}\"\naddress = \"{a}\"\nswitches = [{}]\n",
            mine.join(", ")
        );
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_is_dealt_to_device_processes_in_blocks() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/topologies/two-switches.toml"
        ))
        .unwrap();
        let addrs: Vec<std::net::SocketAddr> = vec![
            "127.0.0.1:7400".parse().unwrap(),
            "127.0.0.1:7401".parse().unwrap(),
        ];
        let t = spread(&text, &addrs).unwrap();
        let c = crate::fabric::file::parse(&t).unwrap();
        let span = c.span.expect("members");
        assert_eq!(span.members.len(), 2);
        // Each switch has its own member.
        assert_eq!(span.switch_owner, vec![0, 1]);
        // Three members for two switches cannot be.
        let three: Vec<std::net::SocketAddr> = (0..3)
            .map(|i| format!("127.0.0.1:{}", 7400 + i).parse().unwrap())
            .collect();
        assert!(spread(&text, &three).is_err());
        // A file that already names members is refused.
        assert!(spread(&t, &addrs).is_err());
    }

    #[test]
    fn flags_go_to_the_supervisor_and_are_described() {
        let f = FabricArgs {
            topology: Some("t.toml".into()),
            drop: 0.01,
            ..FabricArgs::default()
        };
        assert_eq!(f.to_args(), ["--topology", "t.toml", "--drop", "0.01"]);
        assert_eq!(
            f.describe(1),
            "topology t.toml; every link: drop 0.01 corrupt 0 duplicate 0 reorder 0"
        );
        assert_eq!(
            f.describe(2),
            "topology t.toml, its switches dealt to 2 device processes; every link: drop 0.01 corrupt 0 duplicate 0 reorder 0"
        );
        assert_eq!(FabricArgs::default().describe(1), "one switch, ideal links");
        let bad = FabricArgs {
            drop: 2.0,
            ..FabricArgs::default()
        };
        assert!(bad.faults().is_err());
    }
}
