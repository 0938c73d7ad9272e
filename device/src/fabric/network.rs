//! The network (spec §10.3): every link's two lanes, the switches that pass
//! packets between them along their source routes, each node's transport
//! endpoint and route table, and the mapper (§10.9) when one runs here;
//! `advance` moves time forward.
//!
//! A switch serves its inputs in turn, one packet from each per round,
//! starting one further along each pass, so no input starves another; a
//! packet whose output lane has no credit waits at the head of its input,
//! and that input's lane fills and pushes back upstream.

use std::collections::VecDeque;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, Instant};

use ulnic_abi::mapping::ROUTES_ROOM;
use ulnic_abi::packet;

use crate::fabric::link::{Lane, LaneCounters, Nanos, RemoteEnd};
use crate::fabric::mapping::{self, Answer, FabricMap, Mapper, MappingConfig};
use crate::fabric::packet::{Packet, Route};
use crate::fabric::routing::{Graph, Routes};
use crate::fabric::span::{MemoryShared, Span, SpanCounters, Udp, Wire};
use crate::fabric::topology::{End, Faults, Topology};
use crate::fabric::transport::{ChannelKey, Message, Sink, Transport, TransportConfig};

/// Passes of `advance` at one instant at most: enough for a packet to
/// cross several ideal hops and its ACK to come back.
const MAX_ROUNDS: usize = 16;

/// A fabric's settings: its shape, the seed of its faults and its
/// transport.
#[derive(Debug, Clone, PartialEq)]
pub struct FabricConfig {
    /// Switches, links and nodes.
    pub topology: Topology,
    /// Seeds every lane's fault generator.
    pub seed: u64,
    /// The reliable transport's settings.
    pub transport: TransportConfig,
    /// When the fabric spans several device processes: who they are and
    /// which this is (spec §10.7).
    pub span: Option<Span>,
    /// With a mapper, routes come from what it finds (spec §10.9); without,
    /// from the topology.
    pub mapping: Option<MappingConfig>,
}

impl FabricConfig {
    /// The default fabric of `nodes` nodes (spec §10): one switch, every
    /// node on an ideal link, the default transport, no faults.
    pub fn ideal(nodes: u32) -> FabricConfig {
        FabricConfig {
            topology: Topology::single_switch(nodes),
            seed: 0,
            transport: TransportConfig::default(),
            span: None,
            mapping: None,
        }
    }

    /// Whether node `n` is served by this device (always, unless the
    /// fabric spans devices and `n` hangs on another member's switch).
    pub fn is_local(&self, n: u32) -> bool {
        match &self.span {
            None => true,
            Some(s) => {
                let (_, sw) = self.topology.attachment(n);
                s.switch_owner.get(sw) == Some(&s.me)
            }
        }
    }
}

/// Everything the fabric counts, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricCounters {
    /// Per lane, by `2 * link + direction` (0: from the link's first end).
    pub lanes: Vec<LaneCounters>,
    /// Per switch.
    pub switches: Vec<SwitchCounters>,
    /// Per node.
    pub transport: Vec<crate::fabric::transport::TransportCounters>,
    /// Datagrams to and from other devices, when the fabric spans them.
    pub span: Option<SpanCounters>,
}

/// A packet seen by a capture tap: what was handed to a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The lane, `2 * link + direction`.
    pub lane: usize,
    /// The fabric's clock when it was handed over.
    pub at: Nanos,
    /// The packet, header and payload, as it went onto the link (before
    /// any fault the link injects).
    pub bytes: Vec<u8>,
}

/// A capture of some lanes' packets, delivered to a bounded channel; a
/// packet that finds the channel full is counted, not waited for.
struct Tap {
    lanes: Vec<usize>,
    to: SyncSender<Captured>,
}

impl FabricCounters {
    /// Adds another shard's counts to these.
    pub fn add(&mut self, o: &FabricCounters) {
        for (a, b) in self.lanes.iter_mut().zip(&o.lanes) {
            a.add(b);
        }
        for (a, b) in self.switches.iter_mut().zip(&o.switches) {
            a.add(b);
        }
        for (a, b) in self.transport.iter_mut().zip(&o.transport) {
            a.add(b);
        }
        match (&mut self.span, &o.span) {
            (Some(a), Some(b)) => a.add(b),
            (None, Some(b)) => self.span = Some(*b),
            _ => {}
        }
    }
}

/// Counters of one switch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SwitchCounters {
    /// Packets passed from an input to an output.
    pub forwarded: u64,
    /// Packets whose route did not go on from here (dropped).
    pub misrouted: u64,
    /// Mapper probes this switch answered.
    pub probes_answered: u64,
}

summable!(SwitchCounters {
    forwarded,
    misrouted,
    probes_answered
});

struct SwitchState {
    /// Lanes that end here.
    inputs: Vec<usize>,
    /// By gate: the lane leaving on it.
    out: Vec<usize>,
    /// Where the round-robin starts next.
    turn: usize,
    counters: SwitchCounters,
}

/// Every lane, switch and node transport of one fabric.
pub struct Network {
    config: FabricConfig,
    /// Per source node, by destination: the route its NIC puts on packets.
    tables: Vec<Vec<Option<Route>>>,
    /// Per node: the mapper's generation its table comes from.
    table_generation: Vec<u64>,
    /// By `2 * link + (0 if crossed a to b, else 1)`.
    lanes: Vec<Lane>,
    /// Per lane ending at a switch: the switch and the gate it enters by.
    lane_entry: Vec<Option<(usize, u8)>>,
    /// Per node: packets its NIC makes itself (mapper probes and routes,
    /// answers to probes), sent before the transport's.
    nic_out: Vec<VecDeque<Packet>>,
    /// Packets in `nic_out`, all nodes: `busy` asks every pass.
    nic_waiting: usize,
    /// The mapper, on the device serving its node.
    mapper: Option<Mapper>,
    /// The smallest MTU of any link: a channel's packet size when routes
    /// may change under it.
    min_mtu: u32,
    switches: Vec<SwitchState>,
    /// Per node: the lane from it into the fabric, and the one back.
    host_out: Vec<usize>,
    host_in: Vec<usize>,
    transport: Transport,
    start: Instant,
    taps: Vec<Tap>,
    /// The largest payload that may take the shortcut from each node to
    /// each (`src * nodes + dst`; `None`: none may), worked out again
    /// after routes, faults or captures change (`shortcut_stale`).
    shortcut_fit: Vec<Option<usize>>,
    shortcut_stale: bool,
    /// When the engine should next look (the earliest due time after the
    /// last `advance`), to tell a stalled engine from a silent path.
    expect_by: Option<Nanos>,
    /// Packets a full capture channel could not take.
    pub capture_dropped: u64,
    /// With a spanning fabric: the UDP side, and per lane the member that
    /// owns its far end and the one that owns its sending end (`None`: this
    /// device).
    wire: Option<Wire>,
    far_owner: Vec<Option<usize>>,
    near_owner: Vec<Option<usize>>,
}

/// Most packets a NIC holds of its own making (probes, answers, routes);
/// past this they are dropped, and the mapper's timeouts recover.
const MAX_NIC_BACKLOG: usize = 4096;

/// The lanes a packet leaving by lane `first` along `route` crosses
/// (`entry`: where each lane enters a switch).
fn lanes_along(
    switches: &[SwitchState],
    first: usize,
    entry: &[Option<(usize, u8)>],
    route: &Route,
) -> Vec<usize> {
    let mut lanes = vec![first];
    let mut at = first;
    for &gate in route.gates() {
        let Some((s, _)) = entry[at] else {
            break;
        };
        match switches[s].out.get(usize::from(gate)) {
            Some(&l) => {
                lanes.push(l);
                at = l;
            }
            None => break,
        }
    }
    lanes
}

/// The MTU of a path from lane `first` along `route` (its smallest link
/// MTU, or `fixed_mtu` when a mapper may change routes under a channel)
/// and the round trip of a full-size packet there and back when the links
/// are idle. Takes the network's parts, so the transport can ask for it
/// while it is borrowed.
fn path_shape(
    switches: &[SwitchState],
    entry: &[Option<(usize, u8)>],
    lanes: &[Lane],
    first: usize,
    route: Option<Route>,
    fixed_mtu: Option<u32>,
) -> (u32, Nanos) {
    let path = lanes_along(switches, first, entry, &route.unwrap_or_default());
    let mtu = if let Some(m) = fixed_mtu {
        m
    } else {
        path.iter()
            .map(|&l| lanes[l].params().mtu)
            .min()
            .unwrap_or(u32::MAX)
    };
    let rtt: Nanos = path
        .iter()
        .map(|&l| {
            let p = lanes[l].params();
            let ser = p.bandwidth_bps.map_or(0, |b| {
                (u64::from(mtu.min(65536)) * 8 * 1_000_000_000) / b.max(1)
            });
            p.latency.as_nanos() as Nanos + ser
        })
        .sum::<Nanos>()
        * 2;
    (mtu, rtt)
}

/// How much later than due the engine may look before it counts as
/// stalled (a sleep's usual overshoot is less).
const STALL_SLACK: Nanos = 200_000;

impl Network {
    /// The network `config` describes, all queues empty; with a span, its
    /// UDP socket bound.
    pub fn new(config: FabricConfig) -> std::io::Result<Network> {
        let Some(span) = config.span.clone() else {
            return Ok(Self::build(config, None, None));
        };
        let owners = (span.switch_owner.clone(), span.me);
        let wire = Wire::Udp(Udp::bind(span)?);
        let mut net = Self::build(config, Some(owners), Some(wire));
        for lane in 0..net.lanes.len() {
            if net.far_owner[lane].is_some() || net.near_owner[lane].is_some() {
                net.lanes[lane].set_remote(RemoteEnd::Datagrams);
            }
        }
        Ok(net)
    }

    /// Shard `me` of a device whose engine is split by switch:
    /// `switch_owner` gives each switch's shard, `shared` joins them.
    pub fn shard(
        config: FabricConfig,
        me: usize,
        switch_owner: Vec<usize>,
        shared: std::sync::Arc<MemoryShared>,
    ) -> Network {
        let wire = Wire::Memory(me, shared.clone(), SpanCounters::default());
        let mut net = Self::build(config, Some((switch_owner, me)), Some(wire));
        // Lanes between shards share their credits.
        for lane in 0..net.lanes.len() {
            let Some(c) = shared.credit(lane) else {
                continue;
            };
            if net.far_owner[lane].is_some() {
                net.lanes[lane].set_remote(RemoteEnd::Sender(c));
            } else if net.near_owner[lane].is_some() {
                net.lanes[lane].set_remote(RemoteEnd::Receiver(c));
            }
        }
        net
    }

    fn build(
        config: FabricConfig,
        owners: Option<(Vec<usize>, usize)>,
        wire: Option<Wire>,
    ) -> Network {
        let topo = &config.topology;
        let graph = Graph::of(topo);
        let mut lanes = Vec::new();
        let mut lane_entry = Vec::new();
        let mut switches: Vec<SwitchState> = (0..topo.switches().len())
            .map(|_| SwitchState {
                inputs: Vec::new(),
                out: Vec::new(),
                turn: 0,
                counters: SwitchCounters::default(),
            })
            .collect();
        let nodes = topo.nodes() as usize;
        let (mut host_out, mut host_in) = (vec![0; nodes], vec![0; nodes]);
        let (mut far_owner, mut near_owner) = (Vec::new(), Vec::new());
        let owner = |e: End| -> Option<usize> {
            let (switch_owner, me) = owners.as_ref()?;
            let sw = match e {
                End::Switch(s) => s,
                End::Node(n) => topo.attachment(n).1,
            };
            let o = *switch_owner.get(sw)?;
            (o != *me).then_some(o)
        };
        for (i, l) in topo.links().iter().enumerate() {
            let ends = graph.links[i];
            for (dir, (from, to)) in [(l.a, l.b), (l.b, l.a)].into_iter().enumerate() {
                let lane = 2 * i + dir;
                // A switch's gates are numbered in link order, so the
                // lane leaving gate p is pushed p-th.
                if let End::Switch(s) = from {
                    switches[s].out.push(lane);
                }
                lane_entry.push(match to {
                    End::Switch(s) => Some((s, ends[1 - dir].1)),
                    End::Node(_) => None,
                });
                near_owner.push(owner(from));
                far_owner.push(owner(to));
                // A different, reproducible stream per lane.
                let seed = config
                    .seed
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .wrapping_add(lane as u64);
                lanes.push(Lane::new(l.params, seed));
                match (from, to) {
                    (End::Node(n), _) => host_out[n as usize] = lane,
                    (_, End::Node(n)) => host_in[n as usize] = lane,
                    _ => {}
                }
                if let End::Switch(s) = to {
                    switches[s].inputs.push(lane);
                }
            }
        }
        let min_mtu = topo
            .links()
            .iter()
            .map(|l| l.params.mtu)
            .min()
            .unwrap_or(u32::MAX);
        let transport = Transport::new(topo.nodes(), config.transport, min_mtu);
        // Without a mapper every node starts with the topology's routes;
        // with one, with none until the mapper's arrive.
        let tables = match config.mapping {
            Some(_) => vec![Vec::new(); nodes],
            None => {
                let routes = Routes::up_down(&graph);
                (0..topo.nodes())
                    .map(|s| (0..topo.nodes()).map(|d| routes.route(s, d)).collect())
                    .collect()
            }
        };
        // The mapper runs on its configured node when that is served here;
        // without mapping, any device can still look, from its first node.
        let local = |n: u32| match &owners {
            None => true,
            Some((switch_owner, me)) => switch_owner.get(topo.attachment(n).1) == Some(me),
        };
        let mapper = match config.mapping {
            Some(m) => local(m.mapper).then(|| Mapper::new(m.mapper, m, true)),
            None => (0..topo.nodes()).find(|&n| local(n)).map(|n| {
                Mapper::new(
                    n,
                    MappingConfig {
                        mapper: n,
                        ..MappingConfig::default()
                    },
                    false,
                )
            }),
        };
        Network {
            config,
            tables,
            table_generation: vec![0; nodes],
            lane_entry,
            nic_out: vec![VecDeque::new(); nodes],
            nic_waiting: 0,
            mapper,
            min_mtu,
            lanes,
            switches,
            host_out,
            host_in,
            transport,
            start: Instant::now(),
            taps: Vec::new(),
            shortcut_fit: Vec::new(),
            shortcut_stale: true,
            expect_by: None,
            capture_dropped: 0,
            wire,
            far_owner,
            near_owner,
        }
    }

    /// What the engine waits on for packets from the other members or
    /// shards (a UDP socket, or an eventfd).
    pub fn wire_fd(&self) -> Option<std::os::fd::RawFd> {
        self.wire.as_ref().map(Wire::fd)
    }

    /// Takes the packets other members sent: each goes into the far-end
    /// buffer of its lane here.
    fn receive_remote(&mut self, now: Nanos) -> usize {
        let Some(wire) = self.wire.as_mut() else {
            return 0;
        };
        let (far, near, lanes) = (&self.far_owner, &self.near_owner, &mut self.lanes);
        let accepts = |lane: usize, member: usize| {
            lane < far.len() && far[lane].is_none() && near[lane] == Some(member)
        };
        let mut n = 0;
        wire.receive_all(&accepts, &mut |lane, p| {
            if lanes[lane].inject(now, p) {
                n += 1;
            }
        });
        n
    }

    /// Sends what arrived at the far end of lanes that end on another
    /// member.
    fn send_remote(&mut self) -> usize {
        let Some(wire) = self.wire.as_mut() else {
            return 0;
        };
        let mut n = 0;
        for (lane, owner) in self.far_owner.iter().enumerate() {
            let Some(to) = *owner else { continue };
            while let Some(p) = self.lanes[lane].hand_over() {
                wire.send(to, lane, p);
                n += 1;
            }
        }
        n
    }

    /// Its settings (the faults as last set).
    pub fn config(&self) -> &FabricConfig {
        &self.config
    }

    /// The fabric's clock now.
    pub fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// Whether channel `key` takes another message of `len` bytes now.
    pub fn has_room(&self, key: &ChannelKey, len: usize) -> bool {
        self.transport.has_room(key, len)
    }

    /// Hands a message to the transport. The caller checked `has_room`,
    /// and that the destination is another node.
    pub fn submit(&mut self, key: ChannelKey, msg: Message) {
        let now = self.now();
        let route = self.tables[key.src as usize]
            .get(key.dst as usize)
            .copied()
            .flatten();
        let fixed_mtu = self.config.mapping.map(|_| self.min_mtu);
        let first = self.host_out[key.src as usize];
        let (switches, entry, lanes) = (&self.switches, &self.lane_entry, &self.lanes);
        self.transport.submit(key, msg, now, || {
            path_shape(switches, entry, lanes, first, route, fixed_mtu)
        });
    }

    /// The one-way delays (the transport taking a message to its
    /// delivery) of messages sent once between nodes of this device, since
    /// the last call.
    pub fn take_delays(&mut self) -> Vec<Nanos> {
        self.transport.take_delays()
    }

    /// Whether channel `key` holds nothing (a message of it may take the
    /// shortcut without overtaking one).
    pub fn idle(&self, key: &ChannelKey) -> bool {
        self.transport.idle(key)
    }

    /// Whether an operation of `len` payload bytes from node `src` to node
    /// `dst` may take the shortcut (spec §10): both served here, a route
    /// between them whose links are all ideal (no latency, no rate limit,
    /// no faults, an MTU it fits in) and no capture on them. The caller
    /// also checks that its channel is idle.
    pub fn shortcut(&mut self, src: u32, dst: u32, len: usize) -> bool {
        let nodes = self.host_out.len();
        if self.shortcut_stale {
            self.shortcut_fit = (0..nodes * nodes)
                .map(|i| self.shortcut_fit_of(i / nodes, i % nodes))
                .collect();
            self.shortcut_stale = false;
        }
        let (src, dst) = (src as usize, dst as usize);
        src < nodes
            && dst < nodes
            && self.shortcut_fit[src * nodes + dst].is_some_and(|fit| len <= fit)
    }

    /// The largest payload the shortcut may carry from `src` to `dst`: the
    /// smallest MTU along their route if every lane on it qualifies.
    fn shortcut_fit_of(&self, src: usize, dst: usize) -> Option<usize> {
        let route = self.tables.get(src)?.get(dst)?.as_ref()?;
        let path = lanes_along(&self.switches, self.host_out[src], &self.lane_entry, route);
        // The route must end at dst's own link, every lane inside this
        // device's part of the fabric.
        if path.last() != Some(&self.host_in[dst]) {
            return None;
        }
        path.iter().try_fold(usize::MAX, |fit, &l| {
            let p = self.lanes[l].params();
            let ideal = self.far_owner[l].is_none()
                && self.near_owner[l].is_none()
                && p.latency.is_zero()
                && p.bandwidth_bps.is_none()
                && p.faults.none()
                && !self.taps.iter().any(|t| t.lanes.contains(&l));
            ideal.then_some(fit.min(p.mtu as usize))
        })
    }

    /// Counts an operation node `n` carried by the shortcut.
    pub fn count_shortcut(&mut self, n: u32) {
        self.transport.count_shortcut(n);
    }

    /// Replaces the faults of link `link` (both lanes).
    pub fn set_faults(&mut self, link: usize, faults: Faults) -> Result<(), String> {
        self.config
            .topology
            .set_faults(link, faults)
            .map_err(|e| e.to_string())?;
        for lane in [2 * link, 2 * link + 1] {
            self.lanes[lane].set_faults(faults);
            self.shortcut_stale = true;
        }
        Ok(())
    }

    /// Nothing to move: no packet, timer, datagram or mapping round
    /// (`advance` would do nothing).
    pub fn idle_everywhere(&self) -> bool {
        !self.busy() && self.wire.as_ref().is_none_or(Wire::quiet) && !self.mapping()
    }

    /// Whether anything is in flight: a packet on a link, a message not
    /// yet acknowledged, a packet a NIC made waiting to leave.
    pub fn busy(&self) -> bool {
        self.transport.busy() || self.lanes.iter().any(Lane::busy) || self.nic_waiting > 0
    }

    /// How long until something is due (a packet arrives, a timer fires,
    /// the mapper's next step), if anything is.
    pub fn next_due(&self) -> Option<Duration> {
        let lanes = self.lanes.iter().filter_map(Lane::next_arrival);
        let mapper = self.mapper.as_ref().and_then(Mapper::next_due);
        let t = lanes
            .chain(self.transport.next_timer())
            .chain(mapper)
            .min()?;
        Some(Duration::from_nanos(t.saturating_sub(self.now())))
    }

    /// Moves everything due by now: arrivals, switching, timers, the
    /// mapper, and every node's next packets while its link takes them.
    /// Returns the packets moved (0 when nothing happened).
    pub fn advance(&mut self, sink: &mut dyn Sink) -> usize {
        // The engine calls this every pass: with nothing anywhere, return
        // before reading the clock or walking the lanes and switches.
        if self.idle_everywhere() {
            return 0;
        }
        let now = self.now();
        // The engine came later than something was due (its thread was
        // not running: two cores shared with the applications). The
        // emulated NIC was stopped, not the path silent: timeouts are
        // postponed by the delay, so a stall is not taken for a loss.
        if let Some(late) = self.expect_by.take().map(|e| now.saturating_sub(e)) {
            if late > STALL_SLACK {
                self.transport.postpone(now, late);
            }
        }
        let mut moved = 0;
        let mut ticked = false;
        self.tick_mapper(now);
        for _ in 0..MAX_ROUNDS {
            let mut round = self.receive_remote(now);
            for lane in &mut self.lanes {
                lane.arrive(now);
            }
            round += self.send_remote();
            // Into the nodes: the transport takes what is its own; the NIC
            // answers probes and takes routes.
            for n in 0..self.host_in.len() {
                let lane = self.host_in[n];
                while let Some(p) = self.lanes[lane].pop(now) {
                    round += 1;
                    match p.header.kind.get() {
                        packet::PROBE | packet::PROBE_REPLY | packet::ROUTES => {
                            self.nic_receive(n as u32, p, now)
                        }
                        _ => self.transport.receive(n as u32, p, now, sink),
                    }
                }
            }
            round += self.switch_all(now);
            // Timers run once everything already due has moved as far as
            // it can: after a stall of the engine, an ACK that arrived
            // meanwhile is taken before its message's timeout fires.
            if round == 0 && !ticked {
                self.transport.tick(now, sink);
                ticked = true;
            }
            round += self.transmit(now);
            moved += round;
            if round == 0 {
                break;
            }
        }
        if !ticked {
            self.transport.tick(now, sink);
            moved += self.transmit(now);
        }
        // With nothing left in flight nothing is due (a timer entry left
        // in the heap is stale): an engine idle from now on is not late.
        self.expect_by = if self.idle_everywhere() {
            None
        } else {
            self.next_due().map(|d| now + d.as_nanos() as Nanos)
        };
        moved
    }

    /// Every node's next packets, while its link has credit: those its
    /// NIC made first, then the transport's, each given the node's route
    /// to its destination.
    fn transmit(&mut self, now: Nanos) -> usize {
        let mut sent = 0;
        for n in 0..self.host_out.len() {
            let lane = self.host_out[n];
            while !self.nic_out[n].is_empty() || self.transport.wants_to_send(n as u32) {
                if !self.lanes[lane].has_credit() {
                    self.lanes[lane].stalled();
                    break;
                }
                let p = match self.nic_out[n].pop_front() {
                    Some(p) => {
                        self.nic_waiting -= 1;
                        p
                    }
                    None => {
                        let Some(mut p) = self.transport.next_packet(n as u32, now) else {
                            break;
                        };
                        let dst = p.header.dst_node.get() as usize;
                        match self.tables[n].get(dst).copied().flatten() {
                            Some(r) => p.set_route(r),
                            None => {
                                // No way there (yet): lost, as on a NIC
                                // without a route; the transport's timers
                                // send it again.
                                self.transport.counters[n].unrouted += 1;
                                continue;
                            }
                        }
                        p
                    }
                };
                self.hand(lane, now, p);
                sent += 1;
            }
        }
        sent
    }

    /// Queues a packet node `n`'s NIC made itself.
    fn nic_send(&mut self, n: u32, p: Packet) {
        if let Some(q) = self.nic_out.get_mut(n as usize) {
            if q.len() < MAX_NIC_BACKLOG {
                q.push_back(p);
                self.nic_waiting += 1;
            }
        }
    }

    /// Takes a mapping packet that reached node `n`: a probe is answered,
    /// a reply goes to the mapper, routes from the mapper are installed.
    fn nic_receive(&mut self, n: u32, p: Packet, now: Nanos) {
        match p.header.kind.get() {
            packet::PROBE => {
                if let Some(r) = mapping::reply(&p, &Answer::Node(n)) {
                    self.nic_send(n, r);
                }
            }
            packet::PROBE_REPLY => {
                let mut out = Vec::new();
                let done = match self.mapper.as_mut() {
                    Some(m) if m.node() == n => m.answer(&p, now, &mut out),
                    _ => None,
                };
                for probe in out {
                    self.nic_send(n, probe);
                }
                if let Some(map) = done {
                    self.mapped(map);
                }
            }
            _ => self.install_routes(n, &p),
        }
    }

    /// Routes for node `n` from the mapper: taken only from the configured
    /// mapper's node, and only for a generation at least the node's.
    fn install_routes(&mut self, n: u32, p: &Packet) {
        let Some(m) = self.config.mapping else {
            return;
        };
        let generation = u64::from(p.header.seq.get());
        let n = n as usize;
        if p.header.src_node.get() != m.mapper || generation < self.table_generation[n] {
            return;
        }
        let Some(entries) = mapping::parse_routes(&p.payload) else {
            return;
        };
        if generation > self.table_generation[n] {
            self.table_generation[n] = generation;
            self.tables[n].clear();
            self.shortcut_stale = true;
        }
        let nodes = self.host_out.len();
        for (dst, r) in entries {
            let dst = dst as usize;
            if dst < nodes {
                if self.tables[n].len() <= dst {
                    self.tables[n].resize(dst + 1, None);
                }
                self.tables[n][dst] = Some(r);
                self.shortcut_stale = true;
            }
        }
    }

    /// Runs the mapper's timers: a round starts, probes go again.
    fn tick_mapper(&mut self, now: Nanos) {
        let Some(m) = self.mapper.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        let done = m.tick(now, &mut out);
        let node = m.node();
        for p in out {
            self.nic_send(node, p);
        }
        if let Some(map) = done {
            self.mapped(map);
        }
    }

    /// A round finished: with a mapper that installs, every found node
    /// gets its routes, here directly and elsewhere in `ROUTES` packets
    /// along the mapper's route to it. Sent every round, so a node that
    /// missed some (a lossy link) gets them again.
    fn mapped(&mut self, map: FabricMap) {
        let Some(m) = self.mapper.as_ref().filter(|m| m.installs()) else {
            return;
        };
        let mapper = m.node();
        let tables = mapping::tables(&map);
        let nodes = self.host_out.len();
        let own = tables.get(mapper as usize).cloned().unwrap_or_default();
        for (n, table) in tables.into_iter().enumerate().take(nodes) {
            if map.nodes.iter().all(|x| x.0 as usize != n) {
                continue;
            }
            let local = self.far_owner[self.host_in[n]].is_none();
            if local {
                self.tables[n] = table;
                self.shortcut_stale = true;
                self.table_generation[n] = map.generation;
            } else if let Some(route) = own.get(n).copied().flatten() {
                let ps = mapping::routes_packets(
                    mapper,
                    n as u32,
                    map.generation,
                    &table,
                    route,
                    ROUTES_ROOM,
                );
                for p in ps {
                    self.nic_send(mapper, p);
                }
            }
        }
        log::debug!(
            "map round {}: {} switches, {} links, {} nodes, generation {}",
            map.round,
            map.switches.len(),
            map.links.len(),
            map.nodes.len(),
            map.generation
        );
    }

    /// Whether the mapper here has work now or on a timer.
    pub fn mapping(&self) -> bool {
        self.mapper.as_ref().is_some_and(Mapper::active)
    }

    /// Asks the mapper here for a round; the round it will be, or `None`
    /// when no mapper runs on this device.
    pub fn request_map(&mut self) -> Option<u64> {
        self.mapper.as_mut().map(Mapper::request)
    }

    /// What the mapper here found last, if it runs here and finished a
    /// round.
    pub fn last_map(&self) -> Option<&FabricMap> {
        self.mapper.as_ref().and_then(Mapper::last)
    }

    /// One pass of every switch; returns the packets passed on.
    fn switch_all(&mut self, now: Nanos) -> usize {
        let mut moved = 0;
        for s in 0..self.switches.len() {
            let inputs = self.switches[s].inputs.len();
            if inputs == 0 {
                continue;
            }
            let start = self.switches[s].turn;
            self.switches[s].turn = (start + 1) % inputs;
            // Rounds of one packet per input until none can move.
            loop {
                let mut progress = false;
                for k in 0..inputs {
                    let input = self.switches[s].inputs[(start + k) % inputs];
                    match self.forward(s, input, now) {
                        Forward::Moved => {
                            progress = true;
                            moved += 1;
                        }
                        Forward::Dropped => progress = true,
                        Forward::Blocked | Forward::Empty => {}
                    }
                }
                if !progress {
                    break;
                }
            }
        }
        moved
    }

    /// Passes the packet at the head of lane `input` (ending at switch
    /// `s`) on by the gate its route names, if that lane has credit. A
    /// probe whose route ends here is answered instead.
    ///
    /// It is passed on at the time it could have been (it arrived, the
    /// packet ahead of it left, a credit came free), not when the engine
    /// got to it: a switch costs no more than its links however late the
    /// engine runs, so a path of many hops is not slower than its links
    /// say when the engine shares its cores.
    fn forward(&mut self, s: usize, input: usize, now: Nanos) -> Forward {
        let Some((arrived, p)) = self.lanes[input].front() else {
            return Forward::Empty;
        };
        let hop = usize::from(p.header.hop.get());
        let probe = p.header.kind.get() == packet::PROBE;
        let Some(gate) = p.route.gate(hop) else {
            let Some(p) = self.lanes[input].pop(now) else {
                return Forward::Empty;
            };
            if probe && hop == p.route.len() {
                self.answer_probe(s, input, now, p);
            } else {
                self.switches[s].counters.misrouted += 1;
            }
            return Forward::Dropped;
        };
        let Some(&out) = self.switches[s].out.get(usize::from(gate)) else {
            self.lanes[input].pop(now);
            self.switches[s].counters.misrouted += 1;
            return Forward::Dropped;
        };
        if !self.lanes[out].has_credit() {
            self.lanes[out].stalled();
            return Forward::Blocked;
        }
        let at = arrived
            .max(self.lanes[input].taken_at())
            .max(self.lanes[out].freed_at())
            .min(now);
        let Some(mut p) = self.lanes[input].pop(at) else {
            return Forward::Empty;
        };
        p.header.hop = (p.header.hop.get() + 1).into();
        if probe {
            // The trail home: the gate it came in by.
            if let Some((_, in_gate)) = self.lane_entry[input] {
                p.payload.push(in_gate);
                p.seal();
            }
        }
        self.hand(out, at, p);
        self.switches[s].counters.forwarded += 1;
        Forward::Moved
    }

    /// Switch `s` answers probe `p`, which came in on lane `input`: its id,
    /// name and gates, back the way the probe came (dropped, like any
    /// packet a switch cannot place, when that lane has no credit).
    fn answer_probe(&mut self, s: usize, input: usize, now: Nanos, mut p: Packet) {
        let Some((_, in_gate)) = self.lane_entry[input] else {
            return;
        };
        p.payload.push(in_gate);
        let answer = Answer::Switch {
            id: s as u32,
            name: self.config.topology.switches()[s].clone(),
            gates: self.switches[s].out.len() as u8,
            in_gate,
        };
        let Some(mut r) = mapping::reply(&p, &answer) else {
            return;
        };
        let out = self.switches[s].out[usize::from(in_gate)];
        if !self.lanes[out].has_credit() {
            return;
        }
        // The reply's first route byte is this switch's own.
        r.header.hop = 1.into();
        self.switches[s].counters.probes_answered += 1;
        self.hand(out, now, r);
    }

    /// Hands `p` to lane `lane`, showing it to the taps on that lane.
    fn hand(&mut self, lane: usize, now: Nanos, p: Packet) {
        if !self.taps.is_empty() {
            let (taps, dropped) = (self.taps.len(), &mut self.capture_dropped);
            // A tap whose reader went away is forgotten.
            self.taps.retain(|t| {
                if !t.lanes.contains(&lane) {
                    return true;
                }
                let c = Captured {
                    lane,
                    at: now,
                    bytes: p.to_bytes(),
                };
                match t.to.try_send(c) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) => {
                        *dropped += 1;
                        true
                    }
                    Err(TrySendError::Disconnected(_)) => false,
                }
            });
            self.shortcut_stale |= self.taps.len() != taps;
        }
        self.lanes[lane].send(now, p);
    }

    /// Starts a capture of the packets handed to `lanes` (both lanes of a
    /// link are `2 * link` and `2 * link + 1`); they go to `to` until its
    /// receiver is dropped.
    pub fn tap(&mut self, lanes: Vec<usize>, to: SyncSender<Captured>) {
        self.taps.push(Tap { lanes, to });
        self.shortcut_stale = true;
    }

    /// Every lane's counters, by `2 * link + direction`.
    pub fn lane_counters(&self) -> Vec<LaneCounters> {
        self.lanes.iter().map(|l| l.counters).collect()
    }

    /// Everything it counts.
    pub fn counters(&self) -> FabricCounters {
        FabricCounters {
            lanes: self.lane_counters(),
            switches: self.switches.iter().map(|s| s.counters).collect(),
            transport: self.transport.counters.clone(),
            span: self.wire.as_ref().map(Wire::counters),
        }
    }
}

enum Forward {
    Moved,
    Dropped,
    Blocked,
    Empty,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::topology::{Link, LinkParams};
    use crate::fabric::transport::{Arrival, Class, Delivered};

    #[derive(Default)]
    struct Count {
        delivered: Vec<(u32, u32, u32)>,
        acked: u64,
        returned: u64,
    }

    impl Sink for Count {
        fn deliver(&mut self, a: &Arrival<'_>) -> Result<Delivered, u16> {
            self.delivered.push((a.src, a.dst, a.tag));
            Ok(Delivered::Done)
        }
        fn read_data(&mut self, _: ChannelKey, _: &Message, _: u32, _: &[u8]) {}
        fn acked(&mut self, _: ChannelKey, _: Message) {
            self.acked += 1;
        }
        fn returned(&mut self, _: ChannelKey, _: Message, _: u16) {
            self.returned += 1;
        }
        fn unreachable(&mut self, _: u32, _: u32, _: &[u32], _: &[u32]) {}
    }

    /// Two switches, nodes 0-1 on the first and 2-3 on the second, every
    /// link with `faults`.
    fn two_switches(faults: Faults) -> Network {
        let params = LinkParams {
            faults,
            mtu: 512,
            queue_packets: 4,
            ..LinkParams::default()
        };
        let link = |a, b| Link { a, b, params };
        let mut links = vec![link(End::Switch(0), End::Switch(1))];
        for n in 0..4 {
            links.push(link(End::Node(n), End::Switch(n as usize / 2)));
        }
        let topology = Topology::new(4, vec!["a".into(), "b".into()], links).unwrap();
        Network::new(FabricConfig {
            topology,
            seed: 42,
            transport: TransportConfig {
                min_timeout: 200_000,
                ..TransportConfig::default()
            },
            span: None,
            mapping: None,
        })
        .unwrap()
    }

    fn message(tag: u32, len: usize) -> Message {
        Message {
            opcode: ulnic_abi::op::SEND,
            src_port: 1,
            tag,
            user_id: u64::from(tag),
            bytes: vec![tag as u8; len],
            ..Default::default()
        }
    }

    #[test]
    fn messages_cross_switches_in_order_through_faults_and_small_queues() {
        let faults = Faults {
            drop: 0.05,
            corrupt: 0.02,
            duplicate: 0.02,
            reorder: 0.05,
            ..Faults::default()
        };
        let mut net = two_switches(faults);
        let mut sink = Count::default();
        let per_pair = 200u32;
        let pairs = [(0u32, 2u32), (1, 3), (2, 1), (3, 0)];
        let mut next = [0u32; 4];
        let deadline = Instant::now() + Duration::from_secs(60);
        while sink.acked < u64::from(per_pair) * 4 && Instant::now() < deadline {
            for (i, &(src, dst)) in pairs.iter().enumerate() {
                let key = ChannelKey {
                    src,
                    endpoint: 0,
                    dst,
                    port: 1,
                    class: Class::Messages,
                };
                while next[i] < per_pair && net.has_room(&key, 1500) {
                    net.submit(key, message(next[i], 1500));
                    next[i] += 1;
                }
            }
            net.advance(&mut sink);
        }
        assert_eq!(sink.returned, 0);
        assert_eq!(sink.acked, u64::from(per_pair) * 4);
        for &(src, dst) in &pairs {
            let tags: Vec<u32> = sink
                .delivered
                .iter()
                .filter(|d| (d.0, d.1) == (src, dst))
                .map(|d| d.2)
                .collect();
            assert_eq!(tags, (0..per_pair).collect::<Vec<_>>(), "{src}->{dst}");
        }
        let lanes = net.lane_counters();
        assert!(lanes.iter().map(|l| l.crc_errors).sum::<u64>() > 0);
        assert!(
            lanes.iter().map(|l| l.stalls).sum::<u64>() > 0,
            "queues of 4 never pushed back"
        );
        // Stragglers (duplicates, late ACKs) drain and nothing is left.
        while net.busy() && Instant::now() < deadline {
            net.advance(&mut sink);
        }
        assert!(!net.busy());
        assert_eq!(sink.delivered.len(), per_pair as usize * 4);
    }

    #[test]
    fn switches_pass_packets_on_when_they_arrived_not_when_the_engine_runs() {
        // Node 0, six switches in a row, node 1: seven links of 100 us.
        let params = LinkParams {
            latency: Duration::from_micros(100),
            ..LinkParams::default()
        };
        let mut links = vec![Link {
            a: End::Node(0),
            b: End::Switch(0),
            params,
        }];
        for s in 1..6 {
            links.push(Link {
                a: End::Switch(s - 1),
                b: End::Switch(s),
                params,
            });
        }
        links.push(Link {
            a: End::Node(1),
            b: End::Switch(5),
            params,
        });
        let names = (0..6).map(|s| format!("s{s}")).collect();
        let mut net = Network::new(FabricConfig {
            topology: Topology::new(2, names, links).unwrap(),
            seed: 1,
            transport: TransportConfig::default(),
            span: None,
            mapping: None,
        })
        .unwrap();
        let mut sink = Count::default();
        let key = ChannelKey {
            src: 0,
            endpoint: 0,
            dst: 1,
            port: 1,
            class: Class::Messages,
        };
        net.submit(key, message(7, 64));
        net.advance(&mut sink);
        // An engine that comes back after the whole path's time finds the
        // packet at the far end, not one hop further per visit.
        std::thread::sleep(Duration::from_millis(2));
        net.advance(&mut sink);
        assert_eq!(sink.delivered, [(0, 1, 7)]);
    }

    #[test]
    fn a_cut_link_returns_messages_and_healing_restores_traffic() {
        let mut net = two_switches(Faults::default());
        net.config.transport.retries = 2;
        net.transport = Transport::new(
            4,
            TransportConfig {
                retries: 2,
                min_timeout: 100_000,
                ..Default::default()
            },
            512,
        );
        net.set_faults(
            0,
            Faults {
                down: true,
                ..Faults::default()
            },
        )
        .unwrap();
        let mut sink = Count::default();
        let key = ChannelKey {
            src: 0,
            endpoint: 0,
            dst: 2,
            port: 1,
            class: Class::Messages,
        };
        net.submit(key, message(1, 100));
        let deadline = Instant::now() + Duration::from_secs(10);
        while sink.returned == 0 && Instant::now() < deadline {
            net.advance(&mut sink);
        }
        assert_eq!((sink.returned, sink.acked), (1, 0));
        net.set_faults(0, Faults::default()).unwrap();
        net.submit(key, message(2, 100));
        while sink.acked == 0 && Instant::now() < deadline {
            net.advance(&mut sink);
        }
        assert_eq!(sink.delivered, [(0, 2, 2)]);
    }

    /// A network on `topology` routed by a mapper on `mapper` with quick
    /// probes (2 ms, `tries` each).
    /// A network mapped by node `mapper`; a probe unanswered for 2 ms,
    /// `tries` times, means nothing is there (short, for lossy links).
    fn mapped(topology: Topology, interval: Duration, mapper: u32, tries: u32) -> Network {
        mapped_with(topology, interval, mapper, tries, Duration::from_millis(2))
    }

    /// As `mapped`, with the probe timeout given: on ideal links a test
    /// must not mistake a descheduled thread for a missing switch.
    fn mapped_with(
        topology: Topology,
        interval: Duration,
        mapper: u32,
        tries: u32,
        probe_timeout: Duration,
    ) -> Network {
        Network::new(FabricConfig {
            topology,
            seed: 7,
            transport: TransportConfig {
                min_timeout: 200_000,
                ..TransportConfig::default()
            },
            span: None,
            mapping: Some(MappingConfig {
                mapper,
                interval,
                probe_timeout,
                probe_tries: tries,
            }),
        })
        .unwrap()
    }

    /// Runs `net` until `done` holds; panics after 20 s.
    fn run_until(
        net: &mut Network,
        sink: &mut Count,
        mut done: impl FnMut(&Network, &Count) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(net, sink) {
            assert!(Instant::now() < deadline, "timed out");
            net.advance(sink);
        }
    }

    #[test]
    fn after_a_link_fails_the_mapper_reroutes_and_nothing_is_lost() {
        let topo = crate::fabric::topology::testing::ring();
        let mut net = mapped(topo.clone(), Duration::from_millis(10), 0, 2);
        let mut sink = Count::default();
        run_until(&mut net, &mut sink, |n, _| n.last_map().is_some());
        let first = net.last_map().unwrap().clone();
        assert_eq!(
            first.differences(&FabricMap::expected(&topo)),
            Vec::<String>::new()
        );
        assert_eq!(first.generation, 1);
        // Node 0's route to node 2, and the first switch-to-switch link on it.
        let route = net.tables[0][2].unwrap();
        let lanes = lanes_along(&net.switches, net.host_out[0], &net.lane_entry, &route);
        let cut = lanes[1] / 2;
        let key = ChannelKey {
            src: 0,
            endpoint: 0,
            dst: 2,
            port: 1,
            class: Class::Messages,
        };
        let total = 400u32;
        let mut next = 0u32;
        while sink.acked < u64::from(total) {
            if next == 100 {
                let down = Faults {
                    down: true,
                    ..Faults::default()
                };
                net.set_faults(cut, down).unwrap();
            }
            while next < total && net.has_room(&key, 1000) {
                net.submit(key, message(next, 1000));
                next += 1;
                if next == 100 {
                    break;
                }
            }
            net.advance(&mut sink);
            assert!(sink.returned == 0, "a message came back");
        }
        let tags: Vec<u32> = sink.delivered.iter().map(|d| d.2).collect();
        assert_eq!(tags, (0..total).collect::<Vec<_>>());
        let now = net.last_map().unwrap();
        assert!(now.generation >= 2, "routes were not recomputed");
        let diff = now.differences(&FabricMap::expected(&topo));
        assert_eq!(diff.len(), 1, "{diff:?}");
        assert!(diff[0].starts_with("missing: link"), "{diff:?}");
        assert_ne!(net.tables[0][2], Some(route), "still the old route");
    }

    #[test]
    fn the_mapper_finds_the_fabric_through_lossy_links() {
        let mut topo = crate::fabric::topology::testing::ring();
        let faults = Faults {
            drop: 0.05,
            corrupt: 0.02,
            duplicate: 0.05,
            reorder: 0.05,
            ..Faults::default()
        };
        for l in 0..topo.links().len() {
            topo.set_faults(l, faults).unwrap();
        }
        let mut net = mapped(topo.clone(), Duration::from_secs(60), 2, 12);
        let mut sink = Count::default();
        run_until(&mut net, &mut sink, |n, _| n.last_map().is_some());
        let map = net.last_map().unwrap().clone();
        assert_eq!(
            map.differences(&FabricMap::expected(&topo)),
            Vec::<String>::new()
        );
        assert_eq!(map.mapper, 2);
        // Lost, corrupted and doubled probes and answers were met.
        let lanes = net.lane_counters();
        assert!(
            lanes
                .iter()
                .map(|l| l.dropped + l.crc_errors + l.duplicated)
                .sum::<u64>()
                > 0
        );
        // Every node (all served here) has a route to every node, itself
        // included.
        for n in 0..4 {
            assert_eq!(
                net.tables[n].iter().flatten().count(),
                4,
                "node {n}: {:?}",
                net.tables[n]
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// On any topology the mapper finds exactly what the file says,
        /// and its routes take a message between every pair of nodes.
        #[test]
        fn the_mapper_finds_any_topology_and_its_routes_work(
            switches in 1usize..7,
            tree in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 6),
            extra in proptest::collection::vec((0usize..7, 0usize..7), 0..6),
            hosts in proptest::collection::vec(0usize..7, 2..6),
        ) {
            let topo = crate::fabric::topology::testing::random(switches, &tree, &extra, &hosts);
            let mut net = mapped_with(topo.clone(), Duration::from_secs(60), 0, 2, Duration::from_secs(2));
            let mut sink = Count::default();
            run_until(&mut net, &mut sink, |n, _| n.last_map().is_some());
            let map = net.last_map().unwrap().clone();
            proptest::prop_assert_eq!(map.differences(&FabricMap::expected(&topo)), Vec::<String>::new());
            proptest::prop_assert_eq!(map.timeouts, 0);
            let nodes = topo.nodes();
            let mut sent = 0;
            for src in 0..nodes {
                for dst in (0..nodes).filter(|&d| d != src) {
                    let key = ChannelKey::new(src, 0, dst, 1, ulnic_abi::op::SEND);
                    net.submit(key, message(src * 100 + dst, 64));
                    sent += 1;
                }
            }
            run_until(&mut net, &mut sink, |_, s| s.acked == sent);
            proptest::prop_assert_eq!(sink.returned, 0);
        }
    }
}
