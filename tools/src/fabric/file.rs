//! The topology file (spec §10.1), read into the device's checked
//! `FabricConfig`, and the routes the fabric would take through it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use ulnic_device::fabric::mapping::MappingConfig;
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::routing::{Graph, Routes};
use ulnic_device::fabric::span::Span;
use ulnic_device::fabric::topology::{End, Faults, Link, LinkParams, Topology};
use ulnic_device::fabric::transport::TransportConfig;

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
    /// Seeds the faults; the same seed and traffic give the same faults.
    seed: Option<u64>,
    transport: Option<TransportEntry>,
    /// Device processes the fabric spans (spec §10.7).
    #[serde(default, rename = "device")]
    devices: Vec<DeviceEntry>,
    /// A mapper finds the fabric and sets the routes (spec §10.9).
    mapping: Option<MappingEntry>,
}

/// `[mapping]`: the mapper's node and timing; every key optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MappingEntry {
    mapper: Option<u32>,
    interval_ms: Option<u64>,
    probe_timeout_ms: Option<u64>,
    probe_tries: Option<u32>,
}

/// `[[device]]`: a device process of a fabric that spans several, the
/// switches it serves (and so the nodes on them) and its UDP address.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceEntry {
    name: String,
    address: String,
    switches: Vec<String>,
}

/// `[transport]`: the reliable transport's settings (spec §10.4).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransportEntry {
    window: Option<u32>,
    retries: Option<u32>,
    nack_retries: Option<u32>,
    timeout_us: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchEntry {
    name: String,
}

/// The parameters any link may set; unset ones take the defaults.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct Params {
    latency_us: Option<f64>,
    bandwidth_gbps: Option<f64>,
    mtu: Option<u32>,
    queue: Option<u32>,
    drop: Option<f64>,
    corrupt: Option<f64>,
    duplicate: Option<f64>,
    reorder: Option<f64>,
    delay: Option<f64>,
    delay_us: Option<f64>,
    down: Option<bool>,
}

/// The keys of `Params`, for the unknown-key check (serde cannot refuse
/// unknown fields of a struct with a flattened one).
const PARAM_KEYS: [&str; 11] = [
    "latency_us",
    "bandwidth_gbps",
    "mtu",
    "queue",
    "drop",
    "corrupt",
    "duplicate",
    "reorder",
    "delay",
    "delay_us",
    "down",
];

/// A link between two switches.
#[derive(Debug, Deserialize)]
struct LinkEntry {
    between: [String; 2],
    #[serde(flatten)]
    params: Params,
}

/// Nodes hanging on a switch, each on a link of its own.
#[derive(Debug, Deserialize)]
struct AttachEntry {
    nodes: Vec<u32>,
    switch: String,
    #[serde(flatten)]
    params: Params,
}

/// Refuses a key of a `[[link]]` or `[[attach]]` table that is neither
/// `own` nor a link parameter.
fn check_keys(text: &str) -> anyhow::Result<()> {
    let table: toml::Table = toml::from_str(text)?;
    for (array, own) in [
        ("link", &["between"][..]),
        ("attach", &["nodes", "switch"][..]),
    ] {
        let Some(entries) = table.get(array).and_then(|v| v.as_array()) else {
            continue;
        };
        for (i, e) in entries.iter().enumerate() {
            let Some(t) = e.as_table() else { continue };
            if let Some(k) = t
                .keys()
                .find(|k| !own.contains(&k.as_str()) && !PARAM_KEYS.contains(&k.as_str()))
            {
                anyhow::bail!("[[{array}]] {i}: unknown field `{k}`");
            }
        }
    }
    Ok(())
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
        let delay_by = match self.delay_us {
            Some(us) if us.is_finite() && us >= 0.0 => Duration::from_secs_f64(us / 1e6),
            Some(us) => anyhow::bail!("{what}: delay_us {us} is not a duration"),
            None => Duration::from_micros(100),
        };
        Ok(LinkParams {
            latency,
            bandwidth_bps,
            mtu: self.mtu.unwrap_or(d.mtu),
            queue_packets: self.queue.unwrap_or(d.queue_packets),
            faults: Faults {
                drop: self.drop.unwrap_or(0.0),
                corrupt: self.corrupt.unwrap_or(0.0),
                duplicate: self.duplicate.unwrap_or(0.0),
                reorder: self.reorder.unwrap_or(0.0),
                delay: self.delay.unwrap_or(0.0),
                delay_by,
                down: self.down.unwrap_or(false),
            },
        })
    }
}

/// Reads and checks a topology file.
pub fn load(path: &Path) -> anyhow::Result<FabricConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse(&text).with_context(|| format!("topology file {}", path.display()))
}

/// Parses and checks a topology file's text: the fabric it describes.
pub fn parse(text: &str) -> anyhow::Result<FabricConfig> {
    check_keys(text)?;
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
            params: l.params.resolve(&format!("link {i}"))?,
        });
    }
    for a in &f.attach {
        let s = switch(&a.switch)?;
        let params = a.params.resolve(&format!("attach to {}", a.switch))?;
        links.extend(a.nodes.iter().map(|&n| Link {
            a: End::Node(n),
            b: End::Switch(s),
            params,
        }));
    }
    let d = TransportConfig::default();
    let transport = match f.transport {
        None => d,
        Some(t) => TransportConfig {
            window: t.window.unwrap_or(d.window),
            retries: t.retries.unwrap_or(d.retries),
            nack_retries: t.nack_retries.unwrap_or(d.nack_retries),
            min_timeout: t
                .timeout_us
                .map_or(d.min_timeout, |us| us.saturating_mul(1000)),
            max_timeout: d.max_timeout,
        },
    };
    let span = if f.devices.is_empty() {
        None
    } else {
        let mut switch_owner = vec![usize::MAX; names.len()];
        let mut members = Vec::new();
        for (i, d) in f.devices.iter().enumerate() {
            anyhow::ensure!(
                !members.iter().any(|(n, _): &(String, _)| n == &d.name),
                "two devices are named '{}'",
                d.name
            );
            let addr: std::net::SocketAddr = d.address.parse().with_context(|| {
                format!(
                    "device '{}': address '{}' is not IP:PORT",
                    d.name, d.address
                )
            })?;
            for sname in &d.switches {
                let s = switch(sname)?;
                anyhow::ensure!(
                    switch_owner[s] == usize::MAX,
                    "switch '{sname}' is claimed by two devices"
                );
                switch_owner[s] = i;
            }
            members.push((d.name.clone(), addr));
        }
        if let Some(s) = switch_owner.iter().position(|&o| o == usize::MAX) {
            anyhow::bail!("switch '{}' belongs to no [[device]]", names[s]);
        }
        // Which member this process is, and the key, come from the
        // command line (`join`).
        Some(Span {
            me: usize::MAX,
            members,
            switch_owner,
            key: [0; 32],
        })
    };
    let topology = Topology::new(f.nodes, names, links)?;
    check_routes(&topology)?;
    let mapping = match f.mapping {
        None => None,
        Some(m) => {
            let d = MappingConfig::default();
            let m = MappingConfig {
                mapper: m.mapper.unwrap_or(d.mapper),
                interval: m.interval_ms.map_or(d.interval, Duration::from_millis),
                probe_timeout: m
                    .probe_timeout_ms
                    .map_or(d.probe_timeout, Duration::from_millis),
                probe_tries: m.probe_tries.unwrap_or(d.probe_tries),
            };
            m.check(f.nodes)
                .map_err(|e| anyhow::anyhow!("[mapping]: {e}"))?;
            Some(m)
        }
    };
    Ok(FabricConfig {
        topology,
        seed: f.seed.unwrap_or(0),
        transport,
        span,
        mapping,
    })
}

/// Refuses a topology where some route crosses more switches than a
/// packet's route can name.
fn check_routes(topo: &Topology) -> anyhow::Result<()> {
    let routes = Routes::up_down(&Graph::of(topo));
    for src in 0..topo.nodes() {
        for dst in 0..topo.nodes() {
            anyhow::ensure!(
                routes.route(src, dst).is_some(),
                "the route from node {src} to node {dst} crosses more than {} switches",
                ulnic_abi::packet::MAX_ROUTE
            );
        }
    }
    Ok(())
}

/// Makes `config` the fabric of member `member`, authenticated with the
/// key in `key_file` (its SHA-256: any secret file of at least 16 bytes,
/// the same on every member). An error if the topology spans no devices,
/// or names no such member.
pub fn join(
    mut config: FabricConfig,
    member: Option<&str>,
    key_file: Option<&Path>,
) -> anyhow::Result<FabricConfig> {
    let Some(span) = config.span.as_mut() else {
        anyhow::ensure!(
            member.is_none() && key_file.is_none(),
            "--member and --key-file are for topologies with [[device]] entries"
        );
        return Ok(config);
    };
    let names: Vec<&str> = span.members.iter().map(|m| m.0.as_str()).collect();
    let member = member.with_context(|| {
        format!(
            "this topology spans devices {}: say which this is with --member",
            names.join(", ")
        )
    })?;
    span.me = names.iter().position(|n| *n == member).with_context(|| {
        format!(
            "no device '{member}' in the topology (it has {})",
            names.join(", ")
        )
    })?;
    let key_file = key_file.context(
        "a fabric that spans devices needs --key-file (the same secret on every member)",
    )?;
    let secret =
        std::fs::read(key_file).with_context(|| format!("cannot read {}", key_file.display()))?;
    anyhow::ensure!(
        secret.len() >= 16,
        "{}: a key needs at least 16 bytes",
        key_file.display()
    );
    span.key = Sha256::digest(&secret).into();
    Ok(config)
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
    let routes = Routes::up_down(&Graph::of(topo));
    let mut out = Vec::new();
    for src in 0..topo.nodes() {
        for dst in (0..topo.nodes()).filter(|&d| d != src) {
            let mut switches = Vec::new();
            let mut at = End::Node(src);
            for h in routes.path(src, dst).unwrap_or_default() {
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
        let t = parse(TWO).unwrap().topology;
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
