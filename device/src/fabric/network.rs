//! The network (spec §10.3): every link's two lanes, the switches that pass
//! packets between them along the up*/down* routes, and each node's
//! transport endpoint; `advance` moves time forward.
//!
//! A switch serves its inputs in turn, one packet from each per round,
//! starting one further along each pass, so no input starves another; a
//! packet whose output lane has no credit waits at the head of its input,
//! and that input's lane fills and pushes back upstream.

use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, Instant};

use crate::fabric::link::{Lane, LaneCounters, Nanos, RemoteEnd};
use crate::fabric::packet::Packet;
use crate::fabric::routing::{Hop, Routes};
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
}

impl FabricConfig {
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
}

summable!(SwitchCounters {
    forwarded,
    misrouted
});

struct SwitchState {
    /// Lanes that end here.
    inputs: Vec<usize>,
    /// Where the round-robin starts next.
    turn: usize,
    counters: SwitchCounters,
}

/// Every lane, switch and node transport of one fabric.
pub struct Network {
    config: FabricConfig,
    routes: Routes,
    /// By `2 * link + (0 if crossed a to b, else 1)`.
    lanes: Vec<Lane>,
    switches: Vec<SwitchState>,
    /// Per node: the lane from it into the fabric, and the one back.
    host_out: Vec<usize>,
    host_in: Vec<usize>,
    transport: Transport,
    start: Instant,
    taps: Vec<Tap>,
    /// Packets a full capture channel could not take.
    pub capture_dropped: u64,
    /// With a spanning fabric: the UDP side, and per lane the member that
    /// owns its far end and the one that owns its sending end (`None`: this
    /// device).
    wire: Option<Wire>,
    far_owner: Vec<Option<usize>>,
    near_owner: Vec<Option<usize>>,
}

fn lane_of(h: Hop) -> usize {
    2 * h.link + usize::from(!h.forward)
}

/// The MTU of `key`'s path (its smallest link MTU) and the round trip of
/// a full-size packet there and back when the links are idle.
fn path_shape(routes: &Routes, lanes: &[Lane], key: &ChannelKey) -> (u32, Nanos) {
    let path = routes.path(key.src, key.dst);
    let mtu = path
        .iter()
        .map(|h| lanes[lane_of(*h)].params().mtu)
        .min()
        .unwrap_or(u32::MAX);
    let rtt: Nanos = path
        .iter()
        .map(|h| {
            let p = lanes[lane_of(*h)].params();
            let ser = p.bandwidth_bps.map_or(0, |b| {
                (u64::from(mtu.min(65536)) * 8 * 1_000_000_000) / b.max(1)
            });
            p.latency.as_nanos() as Nanos + ser
        })
        .sum::<Nanos>()
        * 2;
    (mtu, rtt)
}

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
        let routes = Routes::up_down(topo);
        let mut lanes = Vec::new();
        let mut switches: Vec<SwitchState> = (0..topo.switches().len())
            .map(|_| SwitchState {
                inputs: Vec::new(),
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
            for (dir, (from, to)) in [(l.a, l.b), (l.b, l.a)].into_iter().enumerate() {
                let lane = 2 * i + dir;
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
        let transport = Transport::new(topo.nodes(), config.transport);
        Network {
            config,
            routes,
            lanes,
            switches,
            host_out,
            host_in,
            transport,
            start: Instant::now(),
            taps: Vec::new(),
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
    fn receive_remote(&mut self) -> usize {
        let Some(wire) = self.wire.as_mut() else {
            return 0;
        };
        let (far, near, lanes) = (&self.far_owner, &self.near_owner, &mut self.lanes);
        let accepts = |lane: usize, member: usize| {
            lane < far.len() && far[lane].is_none() && near[lane] == Some(member)
        };
        let mut n = 0;
        wire.receive_all(&accepts, &mut |lane, p| {
            if lanes[lane].inject(p) {
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
        let (routes, lanes) = (&self.routes, &self.lanes);
        self.transport
            .submit(key, msg, now, || path_shape(routes, lanes, &key));
    }

    /// The one-way delays (the transport taking a message to its
    /// delivery) of messages sent once between nodes of this device, since
    /// the last call.
    pub fn take_delays(&mut self) -> Vec<Nanos> {
        self.transport.take_delays()
    }

    /// Drops every channel of endpoint `endpoint` of node `node`.
    pub fn forget_endpoint(&mut self, node: u32, endpoint: u32) {
        self.transport.forget_endpoint(node, endpoint);
    }

    /// Replaces the faults of link `link` (both lanes).
    pub fn set_faults(&mut self, link: usize, faults: Faults) -> Result<(), String> {
        self.config
            .topology
            .set_faults(link, faults)
            .map_err(|e| e.to_string())?;
        for lane in [2 * link, 2 * link + 1] {
            self.lanes[lane].set_faults(faults);
        }
        Ok(())
    }

    /// Whether anything is in flight: a packet on a link, a message not
    /// yet acknowledged.
    pub fn busy(&self) -> bool {
        self.transport.busy() || self.lanes.iter().any(Lane::busy)
    }

    /// How long until something is due (a packet arrives, a timer fires),
    /// if anything is.
    pub fn next_due(&self) -> Option<Duration> {
        let lanes = self.lanes.iter().filter_map(Lane::next_arrival);
        let t = lanes.chain(self.transport.next_timer()).min()?;
        Some(Duration::from_nanos(t.saturating_sub(self.now())))
    }

    /// Moves everything due by now: arrivals, switching, timers, and
    /// every node's next packets while its link takes them. Returns the
    /// packets moved (0 when nothing happened).
    pub fn advance(&mut self, sink: &mut dyn Sink) -> usize {
        // The engine calls this every pass: with nothing anywhere, return
        // before reading the clock or walking the lanes and switches.
        if !self.busy() && self.wire.as_ref().is_none_or(Wire::quiet) {
            return 0;
        }
        let now = self.now();
        let mut moved = 0;
        let mut ticked = false;
        for _ in 0..MAX_ROUNDS {
            let mut round = self.receive_remote();
            for lane in &mut self.lanes {
                lane.arrive(now);
            }
            round += self.send_remote();
            // Into the nodes: the transport always takes what arrives.
            for n in 0..self.host_in.len() {
                let lane = self.host_in[n];
                while let Some(p) = self.lanes[lane].pop() {
                    round += 1;
                    self.transport.receive(n as u32, p, now, sink);
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
        moved
    }

    /// Every node's next packets, while its link has credit.
    fn transmit(&mut self, now: Nanos) -> usize {
        let mut sent = 0;
        for n in 0..self.host_out.len() {
            let lane = self.host_out[n];
            while self.transport.wants_to_send(n as u32) {
                if !self.lanes[lane].has_credit() {
                    self.lanes[lane].stalled();
                    break;
                }
                let Some(p) = self.transport.next_packet(n as u32, now) else {
                    break;
                };
                self.hand(lane, now, p);
                sent += 1;
            }
        }
        sent
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
    /// `s`) on to its next lane, if that lane has credit.
    fn forward(&mut self, s: usize, input: usize, now: Nanos) -> Forward {
        let Some(p) = self.lanes[input].front() else {
            return Forward::Empty;
        };
        let next = self.next_lane(p);
        let Some(out) = next else {
            self.lanes[input].pop();
            self.switches[s].counters.misrouted += 1;
            return Forward::Dropped;
        };
        if !self.lanes[out].has_credit() {
            self.lanes[out].stalled();
            return Forward::Blocked;
        }
        let Some(mut p) = self.lanes[input].pop() else {
            return Forward::Empty;
        };
        p.header.hop = (p.header.hop.get() + 1).into();
        self.hand(out, now, p);
        self.switches[s].counters.forwarded += 1;
        Forward::Moved
    }

    /// Hands `p` to lane `lane`, showing it to the taps on that lane.
    fn hand(&mut self, lane: usize, now: Nanos, p: Packet) {
        if !self.taps.is_empty() {
            let dropped = &mut self.capture_dropped;
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
        }
        self.lanes[lane].send(now, p);
    }

    /// Starts a capture of the packets handed to `lanes` (both lanes of a
    /// link are `2 * link` and `2 * link + 1`); they go to `to` until its
    /// receiver is dropped.
    pub fn tap(&mut self, lanes: Vec<usize>, to: SyncSender<Captured>) {
        self.taps.push(Tap { lanes, to });
    }

    /// The lane a packet takes next: hop `hop + 1` of its route.
    fn next_lane(&self, p: &Packet) -> Option<usize> {
        let (src, dst) = (p.header.src_node.get(), p.header.dst_node.get());
        if src >= self.routes.nodes() || dst >= self.routes.nodes() {
            return None;
        }
        let hop = usize::from(p.header.hop.get()) + 1;
        self.routes.path(src, dst).get(hop).map(|h| lane_of(*h))
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

    #[derive(Default)]
    struct Count {
        delivered: Vec<(u32, u32, u32)>,
        acked: u64,
        returned: u64,
    }

    impl Sink for Count {
        fn deliver(
            &mut self,
            dst: u32,
            _: u32,
            src: u32,
            _: u32,
            tag: u32,
            _: &[u8],
        ) -> Result<(), u16> {
            self.delivered.push((src, dst, tag));
            Ok(())
        }
        fn acked(&mut self, _: ChannelKey, _: Message) {
            self.acked += 1;
        }
        fn returned(&mut self, _: ChannelKey, _: Message, _: u16) {
            self.returned += 1;
        }
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
        })
        .unwrap()
    }

    fn message(tag: u32, len: usize) -> Message {
        Message {
            src_port: 1,
            tag,
            user_id: u64::from(tag),
            completion: false,
            bytes: vec![tag as u8; len],
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
}
