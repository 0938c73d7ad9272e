//! `ulnic fabric`: the topology file (spec §10.1), read into the device's
//! checked `Topology`, and the routes the fabric would take through it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use ulnic_device::fabric::routing::Routes;
use ulnic_device::fabric::topology::{End, Link, LinkParams, Topology};

/// A topology file as written (TOML).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// Nodes 0..nodes of the fabric.
    nodes: u32,
    #[serde(default, rename = "switch")]
    switches: Vec<SwitchEntry>,
    #[serde(default, rename = "link")]
    links: Vec<LinkEntry>,
    #[serde(default, rename = "attach")]
    attach: Vec<AttachEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchEntry {
    name: String,
}

/// The parameters any link may set; unset ones take the defaults.
#[derive(Debug, Default, Clone, Copy)]
struct Params {
    latency_us: Option<f64>,
    bandwidth_gbps: Option<f64>,
    mtu: Option<u32>,
    queue: Option<u32>,
}

/// A link between two switches. (The link parameters are spelled out in
/// both entries: serde cannot flatten and refuse unknown fields at once.)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkEntry {
    between: [String; 2],
    latency_us: Option<f64>,
    bandwidth_gbps: Option<f64>,
    mtu: Option<u32>,
    queue: Option<u32>,
}

/// Nodes hanging on a switch, each on a link of its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachEntry {
    nodes: Vec<u32>,
    switch: String,
    latency_us: Option<f64>,
    bandwidth_gbps: Option<f64>,
    mtu: Option<u32>,
    queue: Option<u32>,
}

impl Params {
    fn resolve(&self, what: &str) -> anyhow::Result<LinkParams> {
        let d = LinkParams::default();
        let latency = match self.latency_us {
            Some(us) if us.is_finite() && us >= 0.0 => Duration::from_secs_f64(us / 1e6),
            Some(us) => anyhow::bail!("{what}: latency_us {us} is not a duration"),
            None => d.latency,
        };
        let bandwidth_bps = match self.bandwidth_gbps {
            Some(g) if g.is_finite() && g > 0.0 => Some((g * 1e9) as u64),
            Some(g) => anyhow::bail!("{what}: bandwidth_gbps {g} is not a rate"),
            None => d.bandwidth_bps,
        };
        Ok(LinkParams {
            latency,
            bandwidth_bps,
            mtu: self.mtu.unwrap_or(d.mtu),
            queue_packets: self.queue.unwrap_or(d.queue_packets),
        })
    }
}

/// Reads and checks a topology file.
pub fn load(path: &Path) -> anyhow::Result<Topology> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text).with_context(|| format!("topology file {}", path.display()))
}

/// Parses and checks a topology file's text.
pub fn parse(text: &str) -> anyhow::Result<Topology> {
    let f: File = toml::from_str(text)?;
    let names: Vec<String> = f.switches.iter().map(|s| s.name.clone()).collect();
    let switch = |name: &str| -> anyhow::Result<usize> {
        names
            .iter()
            .position(|n| n == name)
            .with_context(|| format!("no switch named '{name}'"))
    };
    let mut links = Vec::new();
    for (i, l) in f.links.iter().enumerate() {
        links.push(Link {
            a: End::Switch(switch(&l.between[0])?),
            b: End::Switch(switch(&l.between[1])?),
            params: Params {
                latency_us: l.latency_us,
                bandwidth_gbps: l.bandwidth_gbps,
                mtu: l.mtu,
                queue: l.queue,
            }
            .resolve(&format!("link {i}"))?,
        });
    }
    for a in &f.attach {
        let s = switch(&a.switch)?;
        let params = Params {
            latency_us: a.latency_us,
            bandwidth_gbps: a.bandwidth_gbps,
            mtu: a.mtu,
            queue: a.queue,
        }
        .resolve(&format!("attach to {}", a.switch))?;
        links.extend(a.nodes.iter().map(|&n| Link {
            a: End::Node(n),
            b: End::Switch(s),
            params,
        }));
    }
    Ok(Topology::new(f.nodes, names, links)?)
}

/// One route, for printing.
#[derive(Debug, Serialize)]
pub struct RouteLine {
    /// Source node.
    pub src: u32,
    /// Destination node.
    pub dst: u32,
    /// Switches crossed.
    pub switches: Vec<String>,
}

/// Every node-to-node route of `topo`, by the switches each crosses.
pub fn route_lines(topo: &Topology) -> Vec<RouteLine> {
    let routes = Routes::up_down(topo);
    let mut out = Vec::new();
    for src in 0..topo.nodes() {
        for dst in (0..topo.nodes()).filter(|&d| d != src) {
            let mut switches = Vec::new();
            let mut at = End::Node(src);
            for h in routes.path(src, dst) {
                let l = &topo.links()[h.link];
                at = if at == l.a { l.b } else { l.a };
                if let End::Switch(s) = at {
                    switches.push(topo.switches()[s].clone());
                }
            }
            out.push(RouteLine { src, dst, switches });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
        nodes = 4
        [[switch]]
        name = "left"
        [[switch]]
        name = "right"
        [[link]]
        between = ["left", "right"]
        latency_us = 5
        bandwidth_gbps = 10
        mtu = 4096
        [[attach]]
        nodes = [0, 1]
        switch = "left"
        [[attach]]
        nodes = [2, 3]
        switch = "right"
        latency_us = 1.5
    "#;

    #[test]
    fn a_two_switch_file_reads_and_routes() {
        let t = parse(TWO).unwrap();
        assert_eq!(t.switches(), ["left", "right"]);
        let trunk = &t.links()[0].params;
        assert_eq!(trunk.latency, Duration::from_micros(5));
        assert_eq!(trunk.bandwidth_bps, Some(10_000_000_000));
        assert_eq!(trunk.mtu, 4096);
        let lines = route_lines(&t);
        let r = lines.iter().find(|r| (r.src, r.dst) == (0, 3)).unwrap();
        assert_eq!(r.switches, ["left", "right"]);
        let r = lines.iter().find(|r| (r.src, r.dst) == (0, 1)).unwrap();
        assert_eq!(r.switches, ["left"]);
    }

    #[test]
    fn mistakes_are_reported() {
        let err = |t: &str| format!("{:#}", parse(t).unwrap_err());
        assert!(
            err(&TWO.replace("\"right\"]", "\"nowhere\"]")).contains("no switch named 'nowhere'")
        );
        assert!(
            err(&TWO.replace("nodes = [2, 3]", "nodes = [2]")).contains("node 3 hangs on 0 links")
        );
        assert!(err(&TWO.replace("mtu = 4096", "mtu = 4096\ncolour = 1")).contains("unknown field"));
        assert!(err(&TWO.replace("latency_us = 5", "latency_us = -5")).contains("not a duration"));
    }
}
