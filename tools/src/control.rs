//! The control socket of a running `ulnic device` (`DIR/control.sock`,
//! mode 0600): `ulnic stats`, `ulnic fabric set`, `ulnic fabric map` and
//! `ulnic capture` talk
//! to the device through it. One JSON request per line, answered by JSON
//! lines; a capture streams one line per packet until the client hangs up.
//!
//! The device model knows nothing of this: the server turns requests into
//! calls on the `Device` (snapshot, set_link_faults, capture).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use ulnic_device::fabric::mapping::FabricMap;
use ulnic_device::fabric::topology::{Faults, Topology};
use ulnic_device::shard::snapshot::Snapshot;
use ulnic_device::Device;

/// The control socket of a device whose node sockets are in `dir`
/// (`control-MEMBER.sock` for a member of a fabric spread over devices,
/// which may share the directory).
pub fn socket_path(dir: &Path, member: Option<&str>) -> PathBuf {
    match member {
        Some(m) => dir.join(format!("control-{m}.sock")),
        None => dir.join("control.sock"),
    }
}

/// Faults as the control protocol and the command line spell them.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// Probability a packet is lost.
    #[serde(default)]
    pub drop: f64,
    /// Probability a bit flips.
    #[serde(default)]
    pub corrupt: f64,
    /// Probability a packet arrives twice.
    #[serde(default)]
    pub duplicate: f64,
    /// Probability a packet is overtaken.
    #[serde(default)]
    pub reorder: f64,
    /// Probability a packet is delayed.
    #[serde(default)]
    pub delay: f64,
    /// How late, microseconds.
    #[serde(default)]
    pub delay_us: f64,
    /// The link is cut.
    #[serde(default)]
    pub down: bool,
}

impl FaultSpec {
    /// The device's faults these spell (not yet checked against their
    /// ranges: the topology does that where they are set).
    pub fn faults(&self) -> anyhow::Result<Faults> {
        anyhow::ensure!(
            self.delay_us.is_finite() && self.delay_us >= 0.0,
            "delay_us must be 0 or more"
        );
        Ok(Faults {
            drop: self.drop,
            corrupt: self.corrupt,
            duplicate: self.duplicate,
            reorder: self.reorder,
            delay: self.delay,
            delay_by: Duration::from_secs_f64(self.delay_us / 1e6),
            down: self.down,
        })
    }

    /// How the control protocol spells the device's faults `f`.
    pub fn of(f: &Faults) -> FaultSpec {
        FaultSpec {
            drop: f.drop,
            corrupt: f.corrupt,
            duplicate: f.duplicate,
            reorder: f.reorder,
            delay: f.delay,
            delay_us: f.delay_by.as_secs_f64() * 1e6,
            down: f.down,
        }
    }
}

/// A request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Every counter.
    Stats,
    /// Replace a link's faults.
    SetFaults {
        /// The link, by index in the topology (a node's own link is
        /// found by `node`).
        link: Option<usize>,
        /// Or: the link node N hangs on.
        node: Option<u32>,
        /// The new faults.
        faults: FaultSpec,
    },
    /// Run a mapping round and report what it found.
    Map,
    /// Stream the packets handed to a link (both directions), or to and
    /// from a node.
    Capture {
        /// The link.
        link: Option<usize>,
        /// Or: the node.
        node: Option<u32>,
    },
}

/// One endpoint's counters.
#[derive(Debug, Serialize, Deserialize)]
pub struct EndpointStats {
    /// Id.
    pub id: u32,
    /// Bound port.
    pub port: Option<u32>,
    /// Sends in the fabric not yet settled.
    pub in_flight: u32,
    /// Counters by name (spec §7).
    pub counters: std::collections::BTreeMap<String, u64>,
}

/// One node's counters.
#[derive(Debug, Serialize, Deserialize)]
pub struct NodeStats {
    /// Node.
    pub node: u32,
    /// A frontend is attached and has shared its memory (read as
    /// `connected` from devices before schema 1).
    #[serde(alias = "connected")]
    pub attached: bool,
    /// Frontends it has had.
    pub connections: u64,
    /// Virtqueue errors.
    pub queue_errors: u64,
    /// Memory faults.
    pub memory_faults: u64,
    /// Wake-ups of the thread reading its frontend's vhost-user socket
    /// (spec §10.6.1): unchanged means no vhost-user message came.
    #[serde(default)]
    pub vhost_wakeups: Option<u64>,
    /// Transport counters (with a fabric).
    pub transport: Option<std::collections::BTreeMap<String, u64>>,
    /// Its endpoints.
    pub endpoints: Vec<EndpointStats>,
}

/// One link's counters, per direction.
#[derive(Debug, Serialize, Deserialize)]
pub struct LinkStats {
    /// Index in the topology.
    pub link: usize,
    /// "node N" or "A-B".
    pub name: String,
    /// Its faults now.
    pub faults: FaultSpec,
    /// From its first end to its second, then back.
    pub directions: [std::collections::BTreeMap<String, u64>; 2],
}

/// One switch's counters.
#[derive(Debug, Serialize, Deserialize)]
pub struct SwitchStats {
    /// Its name.
    pub name: String,
    /// Packets it passed on.
    pub forwarded: u64,
    /// Packets it discarded for a route it could not follow.
    pub misrouted: u64,
}

/// The schema of the `stats` answer (spec §10.6.1): a key may be added
/// without changing it; renaming, removing or retyping one increments it.
pub const STATS_SCHEMA: u32 = 1;

/// The answer to `stats` (spec §10.6.1).
#[derive(Debug, Serialize, Deserialize)]
pub struct Stats {
    /// `STATS_SCHEMA` (0 from devices before schema 1).
    #[serde(default)]
    pub schema: u32,
    /// Per node.
    pub nodes: Vec<NodeStats>,
    /// Device totals.
    pub totals: std::collections::BTreeMap<String, u64>,
    /// Per link (with a fabric).
    pub links: Vec<LinkStats>,
    /// Per switch.
    pub switches: Vec<SwitchStats>,
    /// Datagrams to and from the other devices of a spanning fabric.
    #[serde(default)]
    pub udp: Option<std::collections::BTreeMap<String, u64>>,
}

/// A switch the mapper found.
#[derive(Debug, Serialize, Deserialize)]
pub struct MapSwitch {
    /// Its id (its index in the topology file).
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Gates it has (read as `ports` from devices that named them so).
    #[serde(alias = "ports")]
    pub gates: u8,
    /// The route from the mapper to it, gate by gate.
    pub route: Vec<u8>,
}

/// A link the mapper found between two switch gates.
#[derive(Debug, Serialize, Deserialize)]
pub struct MapLink {
    /// One switch, by name, and its gate.
    pub a: (String, u8),
    /// The other.
    pub b: (String, u8),
}

/// The answer to `map`.
#[derive(Debug, Serialize, Deserialize)]
pub struct MapReport {
    /// The mapping round.
    pub round: u64,
    /// The node the mapper runs on.
    pub mapper: u32,
    /// The route set the fabric uses from this round (0: routes come from
    /// the topology file; the mapper only looked).
    pub generation: u64,
    /// Fabric time the round took, microseconds.
    pub took_us: f64,
    /// Probes sent, counting resends.
    pub probes: u64,
    /// Probes unanswered in time (an empty gate, a dead link, a loss).
    pub timeouts: u64,
    /// Switches found.
    pub switches: Vec<MapSwitch>,
    /// Links between switches found.
    pub links: Vec<MapLink>,
    /// Nodes found: (node, switch name, gate).
    pub nodes: Vec<(u32, String, u8)>,
    /// Whether it is the topology file's fabric with every link up.
    pub matches_topology: bool,
    /// How it differs from the topology file.
    pub differences: Vec<String>,
}

/// The `map` answer for what a round found in a fabric of `topo`.
pub fn map_report(m: &FabricMap, topo: &Topology) -> MapReport {
    let name = |s: usize| m.switches[s].name.clone();
    let differences = m.differences(&FabricMap::expected(topo));
    MapReport {
        round: m.round,
        mapper: m.mapper,
        generation: m.generation,
        took_us: m.took as f64 / 1e3,
        probes: m.probes,
        timeouts: m.timeouts,
        switches: m
            .switches
            .iter()
            .map(|s| MapSwitch {
                id: s.id,
                name: s.name.clone(),
                gates: s.gates,
                route: s.route.gates().to_vec(),
            })
            .collect(),
        links: m
            .links
            .iter()
            .map(|l| MapLink {
                a: (name(l.a.0), l.a.1),
                b: (name(l.b.0), l.b.1),
            })
            .collect(),
        nodes: m.nodes.iter().map(|&(n, s, p)| (n, name(s), p)).collect(),
        matches_topology: differences.is_empty(),
        differences,
    }
}

/// A captured packet, as streamed.
#[derive(Debug, Serialize, Deserialize)]
pub struct CapturedLine {
    /// Link.
    pub link: usize,
    /// 0: from the link's first end; 1: back.
    pub direction: u8,
    /// Fabric clock, ns.
    pub at_ns: u64,
    /// The packet, base64.
    pub packet: String,
}

/// A reply that is not data.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

/// Counters by name, as the stats answer carries them.
fn map(named: Vec<(&'static str, u64)>) -> std::collections::BTreeMap<String, u64> {
    named.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The `stats` answer for a snapshot.
pub fn stats_of(s: &Snapshot, faults: &[Faults]) -> Stats {
    let transport = s.fabric.as_ref().map(|f| &f.0.transport);
    Stats {
        schema: STATS_SCHEMA,
        nodes: s
            .nodes
            .iter()
            .map(|n| NodeStats {
                node: n.node,
                attached: n.attached,
                connections: n.connections,
                queue_errors: n.queue_errors,
                memory_faults: n.memory_faults,
                vhost_wakeups: n.vhost_wakeups,
                transport: transport
                    .and_then(|t| t.get(n.node as usize))
                    .map(|t| map(t.named())),
                endpoints: n
                    .endpoints
                    .iter()
                    .map(|e| EndpointStats {
                        id: e.id,
                        port: e.port,
                        in_flight: e.in_flight,
                        counters: ulnic_abi::STAT_NAMES
                            .iter()
                            .zip(e.stats)
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
        totals: map(s.totals.named()),
        links: s
            .fabric
            .as_ref()
            .map(|(c, names, _)| {
                names
                    .iter()
                    .enumerate()
                    .map(|(l, name)| LinkStats {
                        link: l,
                        name: name.clone(),
                        faults: faults.get(l).map(FaultSpec::of).unwrap_or_default(),
                        directions: [map(c.lanes[2 * l].named()), map(c.lanes[2 * l + 1].named())],
                    })
                    .collect()
            })
            .unwrap_or_default(),
        switches: s
            .fabric
            .as_ref()
            .map(|(c, _, names)| {
                names
                    .iter()
                    .zip(&c.switches)
                    .map(|(n, sc)| SwitchStats {
                        name: n.clone(),
                        forwarded: sc.forwarded,
                        misrouted: sc.misrouted,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        udp: s
            .fabric
            .as_ref()
            .and_then(|f| f.0.span.as_ref())
            .map(|u| map(u.named())),
    }
}

/// A Unix socket listening at `path`, private to this user, that appears
/// there only once it listens: it is bound under another name and renamed
/// into place, so a client that sees the path can connect (between bind
/// and listen a connect is refused, which made waiters fail at random).
pub fn listen_in_place(path: &Path) -> anyhow::Result<UnixListener> {
    let mut staged = path.as_os_str().to_owned();
    staged.push(".new");
    let staged = PathBuf::from(staged);
    let _ = std::fs::remove_file(&staged);
    let listener = UnixListener::bind(&staged)
        .with_context(|| format!("cannot listen on {}", staged.display()))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&staged, path)
        .with_context(|| format!("cannot move {} into place", staged.display()))?;
    Ok(listener)
}

/// Serves the control socket at `path` for `device` on a thread of its
/// own, a thread per client.
pub fn serve(device: Arc<Device>, path: &Path) -> anyhow::Result<()> {
    let listener = listen_in_place(path)?;
    std::thread::Builder::new()
        .name("ulnic-control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let device = device.clone();
                let _ = std::thread::Builder::new()
                    .name("ulnic-control-client".into())
                    .spawn(move || {
                        if let Err(e) = client(&device, conn) {
                            log::debug!("control client: {e:#}");
                        }
                    });
            }
        })?;
    Ok(())
}

/// The lanes of `link`, or of the link `node` hangs on.
fn lanes_of(device: &Device, link: Option<usize>, node: Option<u32>) -> anyhow::Result<usize> {
    let fabric = device
        .fabric_config()
        .context("this device has no emulated fabric (start it with --topology)")?;
    let topo = &fabric.topology;
    let l = match (link, node) {
        (Some(l), None) => l,
        (None, Some(n)) => {
            anyhow::ensure!(
                n < topo.nodes(),
                "no node {n}: the fabric has {}",
                topo.nodes()
            );
            topo.attachment(n).0
        }
        _ => anyhow::bail!("name a link or a node, not both"),
    };
    anyhow::ensure!(
        l < topo.links().len(),
        "no link {l}: the fabric has {}",
        topo.links().len()
    );
    Ok(l)
}

fn client(device: &Device, conn: UnixStream) -> anyhow::Result<()> {
    let mut out = conn.try_clone()?;
    let reader = BufReader::new(conn);
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(req) => answer(device, req, &mut out)?,
            Err(e) => reply(&mut out, Err(anyhow::anyhow!("bad request: {e}")))?,
        }
    }
    Ok(())
}

/// Answers one request of the control protocol for `device` on `out`
/// (a capture streams until the client hangs up).
pub fn answer(device: &Device, req: Request, out: &mut UnixStream) -> anyhow::Result<()> {
    match req {
        Request::Stats => {
            let faults: Vec<Faults> = device
                .fabric_config()
                .map(|f| f.topology.links().iter().map(|l| l.params.faults).collect())
                .unwrap_or_default();
            let s = stats_of(&device.snapshot(), &faults);
            writeln!(out, "{}", serde_json::to_string(&s)?)?;
        }
        Request::SetFaults { link, node, faults } => {
            let r = lanes_of(device, link, node).and_then(|l| {
                device
                    .set_link_faults(l, faults.faults()?)
                    .map_err(anyhow::Error::from)
            });
            reply(out, r)?;
        }
        Request::Map => {
            let r = device
                .fabric_config()
                .context("this device has no emulated fabric (start it with --topology)")
                .and_then(|f| {
                    let m = device.map_fabric(Duration::from_secs(30))?;
                    Ok(map_report(&m, &f.topology))
                });
            match r {
                Ok(report) => writeln!(out, "{}", serde_json::to_string(&report)?)?,
                Err(e) => reply(out, Err(e))?,
            }
        }
        Request::Capture { link, node } => {
            let l = match lanes_of(device, link, node) {
                Ok(l) => l,
                Err(e) => return reply(out, Err(e)),
            };
            let (tx, rx) = std::sync::mpsc::sync_channel(4096);
            device.capture(vec![2 * l, 2 * l + 1], tx)?;
            reply(out, Ok(()))?;
            // Until the client hangs up (a write fails); dropping `rx`
            // ends the tap.
            let b64 = base64::engine::general_purpose::STANDARD;
            loop {
                let c = match rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(c) => c,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        // A heartbeat, so a gone client is noticed.
                        writeln!(out)?;
                        continue;
                    }
                    Err(_) => return Ok(()),
                };
                let line = CapturedLine {
                    link: c.lane / 2,
                    direction: (c.lane % 2) as u8,
                    at_ns: c.at,
                    packet: b64.encode(&c.bytes),
                };
                writeln!(out, "{}", serde_json::to_string(&line)?)?;
            }
        }
    }
    Ok(())
}

/// Writes the reply line of a request that returns nothing else.
pub fn reply(out: &mut UnixStream, r: anyhow::Result<()>) -> anyhow::Result<()> {
    let rep = match r {
        Ok(()) => Reply {
            ok: true,
            error: None,
        },
        Err(e) => Reply {
            ok: false,
            error: Some(format!("{e:#}")),
        },
    };
    writeln!(out, "{}", serde_json::to_string(&rep)?)?;
    Ok(())
}

/// A connection to a running device's control socket.
pub struct Client {
    out: UnixStream,
    lines: std::io::Lines<BufReader<UnixStream>>,
}

impl Client {
    /// Connects to the device whose sockets are in `dir` (member `member`
    /// of a fabric spread over devices).
    pub fn connect(dir: &Path, member: Option<&str>) -> anyhow::Result<Client> {
        let path = socket_path(dir, member);
        let s = UnixStream::connect(&path).with_context(|| {
            format!(
                "cannot reach a device at {} (is `ulnic device --socket-dir {}` running?)",
                path.display(),
                dir.display()
            )
        })?;
        Ok(Client {
            out: s.try_clone()?,
            lines: BufReader::new(s).lines(),
        })
    }

    /// Sends a request.
    pub fn send(&mut self, r: &Request) -> anyhow::Result<()> {
        writeln!(self.out, "{}", serde_json::to_string(r)?)?;
        Ok(())
    }

    /// The next non-empty line of the answer.
    pub fn line(&mut self) -> anyhow::Result<String> {
        loop {
            let l = self.raw_line()?;
            if !l.trim().is_empty() {
                return Ok(l);
            }
        }
    }

    /// The next line, empty for a capture's heartbeat (sent every 500 ms
    /// while no packet comes).
    pub fn raw_line(&mut self) -> anyhow::Result<String> {
        Ok(self
            .lines
            .next()
            .context("the device closed the control connection")??)
    }

    /// The next line, if it is an error reply; else the line.
    pub fn checked_line(&mut self) -> anyhow::Result<String> {
        let l = self.line()?;
        if let Ok(r) = serde_json::from_str::<Reply>(&l) {
            if !r.ok {
                anyhow::bail!("{}", r.error.unwrap_or_else(|| "refused".into()));
            }
        }
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of a JSON object, sorted.
    fn keys(v: &serde_json::Value) -> Vec<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    /// The `stats` answer of a device with a fabric has exactly the keys
    /// spec §10.6.1 (schema 1) documents, at every level.
    #[test]
    fn the_stats_answer_is_schema_1() {
        let dir = tempfile::tempdir().unwrap();
        let fabric = crate::fabric::file::parse(
            "nodes = 2\n[[switch]]\nname = \"s\"\n[[attach]]\nnodes = [0, 1]\nswitch = \"s\"\n",
        )
        .unwrap();
        let config = ulnic_device::Configuration::builder(
            ulnic_device::Configuration::socket_paths(dir.path(), 2),
        )
        .fabric(fabric)
        .build()
        .unwrap();
        let dev = Device::start(config).unwrap();
        let nic = ulnic::Nic::attach(&dir.path().join("node0.sock")).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let mut ep = pd
            .create_endpoint(&ulnic::EndpointConfig::default())
            .unwrap();
        ep.bind(5).unwrap();
        let faults: Vec<Faults> = vec![Faults::default(); 2];
        let v = serde_json::to_value(stats_of(&dev.snapshot(), &faults)).unwrap();
        let want = |k: &[&str]| {
            let mut k: Vec<String> = k.iter().map(|s| s.to_string()).collect();
            k.sort();
            k
        };
        assert_eq!(v["schema"], 1);
        assert_eq!(
            keys(&v),
            want(&["schema", "nodes", "totals", "links", "switches", "udp"])
        );
        let node = &v["nodes"][0];
        assert_eq!(
            keys(node),
            want(&[
                "node",
                "attached",
                "connections",
                "queue_errors",
                "memory_faults",
                "vhost_wakeups",
                "transport",
                "endpoints"
            ])
        );
        assert_eq!(node["attached"], true);
        assert_eq!(
            keys(&node["endpoints"][0]),
            want(&["id", "port", "in_flight", "counters"])
        );
        assert_eq!(
            keys(&node["endpoints"][0]["counters"]),
            want(&ulnic_abi::STAT_NAMES)
        );
        assert_eq!(
            keys(&node["transport"]),
            want(&[
                "messages_sent",
                "data_packets",
                "retransmissions",
                "timeouts",
                "nacks_received",
                "room_asks",
                "returned",
                "shortcuts",
                "unreachable",
                "messages_delivered",
                "acks_sent",
                "nacks_sent",
                "responses_sent",
                "duplicates_dropped",
                "out_of_order_dropped",
                "stale_dropped",
                "control_dropped",
                "malformed_dropped",
                "unrouted",
            ])
        );
        assert_eq!(
            keys(&v["totals"]),
            want(&[
                "delivered",
                "returned",
                "notifications",
                "closes_delivered",
                "closes_undeliverable",
                "returned_to_sender",
                "returns_lost",
                "kicks_served_asleep",
                "found_by_timer",
                "pio_maps",
                "pio_unmaps",
                "pio_commands",
            ])
        );
        let link = &v["links"][0];
        assert_eq!(keys(link), want(&["link", "name", "faults", "directions"]));
        assert_eq!(
            keys(&link["directions"][0]),
            want(&[
                "packets",
                "bytes",
                "dropped",
                "dropped_down",
                "corrupted",
                "crc_errors",
                "duplicated",
                "reordered",
                "delayed",
                "stalls",
                "overflow",
            ])
        );
        assert_eq!(
            keys(&v["switches"][0]),
            want(&["name", "forwarded", "misrouted"])
        );
        assert!(v["udp"].is_null());
    }

    #[test]
    fn a_map_switch_is_written_with_gates_and_read_with_gates_or_ports() {
        let s = MapSwitch {
            id: 1,
            name: "a".into(),
            gates: 3,
            route: vec![0],
        };
        assert!(serde_json::to_string(&s).unwrap().contains(r#""gates":3"#));
        // Devices of a spread fabric may run an older build, which wrote
        // the key as `ports`.
        for key in ["gates", "ports"] {
            let line = format!(r#"{{"id":1,"name":"a","{key}":3,"route":[0]}}"#);
            let s: MapSwitch = serde_json::from_str(&line).unwrap();
            assert_eq!(s.gates, 3);
        }
    }
}
