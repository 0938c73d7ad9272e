//! The mapper (spec §10.9, after VN §4.4.3 and Myrinet's mapper): one
//! node's NIC finds the fabric by sending probes through it, computes
//! up*/down* routes on what it found and hands every node its routes.
//!
//! A probe carries a source route. Each switch it passes appends the gate
//! it came in by, so whoever answers knows the way back: the switch where
//! the route ends answers with its id, name and gate count, and a node the
//! route leads to answers with its number. The mapper starts with the empty
//! route (its own switch), then probes every gate of every switch it has
//! found; a probe unanswered after its tries means nothing (or a dead link)
//! is on that gate. Probes are packets like any other: they cross the same
//! lanes, with the same latency, credits and faults.
//!
//! This module is the mapper's state; the network sends and receives its
//! packets (`network`).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use ulnic_abi::packet;

use crate::fabric::link::Nanos;
use crate::fabric::packet::{Packet, Route};
use crate::fabric::routing::{Graph, Routes};
use crate::fabric::topology::{End, Topology};

/// How the fabric maps itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingConfig {
    /// The node whose NIC runs the mapper.
    pub mapper: u32,
    /// Time from the end of one round to the start of the next.
    pub interval: Duration,
    /// How long a probe waits for its answer before it is sent again.
    pub probe_timeout: Duration,
    /// Sends of one probe before its gate is taken as empty.
    pub probe_tries: u32,
}

impl Default for MappingConfig {
    fn default() -> Self {
        MappingConfig {
            mapper: 0,
            interval: Duration::from_millis(100),
            probe_timeout: Duration::from_millis(5),
            probe_tries: 3,
        }
    }
}

impl MappingConfig {
    /// Refuses settings the mapper cannot work with.
    pub fn check(&self, nodes: u32) -> Result<(), String> {
        if self.mapper >= nodes {
            return Err(format!(
                "the mapper is node {}, but the fabric has {nodes} nodes",
                self.mapper
            ));
        }
        if self.probe_tries == 0 || self.probe_timeout.is_zero() {
            return Err("a probe needs at least one try and a timeout above 0".into());
        }
        if self.interval > Duration::from_secs(3600) || self.probe_timeout > Duration::from_secs(10)
        {
            return Err("the interval is at most 1 h and the probe timeout 10 s".into());
        }
        Ok(())
    }
}

/// A switch the mapper found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundSwitch {
    /// Its id (its index in the topology file: what the switch reports).
    pub id: u32,
    /// Its name.
    pub name: String,
    /// How many gates it has.
    pub gates: u8,
    /// The route from the mapper to it.
    pub route: Route,
}

/// A link between two switch gates, by found-switch index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FoundLink {
    /// One end: (switch, gate), the smaller of the two.
    pub a: (usize, u8),
    /// The other end.
    pub b: (usize, u8),
}

/// What a mapping round found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FabricMap {
    /// The round (1 for the first).
    pub round: u64,
    /// The node the mapper ran on.
    pub mapper: u32,
    /// Switches, in the order found (the mapper's own first).
    pub switches: Vec<FoundSwitch>,
    /// Links between switches.
    pub links: Vec<FoundLink>,
    /// Nodes: (node, switch, gate).
    pub nodes: Vec<(u32, usize, u8)>,
    /// Probes sent, counting resends.
    pub probes: u64,
    /// Probes that went unanswered in time.
    pub timeouts: u64,
    /// Fabric time the round took.
    pub took: Nanos,
    /// The route set installed after this round (0: this mapper only
    /// looks, it does not install).
    pub generation: u64,
}

impl FabricMap {
    /// The wiring for routing, rooted at the switch with the lowest id (so
    /// the ranking does not depend on where the mapper sits).
    pub fn graph(&self) -> Graph {
        let mut links: Vec<[(End, u8); 2]> = self
            .links
            .iter()
            .map(|l| [(End::Switch(l.a.0), l.a.1), (End::Switch(l.b.0), l.b.1)])
            .collect();
        let top = self.nodes.iter().map(|n| n.0 + 1).max().unwrap_or(0);
        let mut host_link = vec![None; top as usize];
        for &(n, s, p) in &self.nodes {
            host_link[n as usize] = Some(links.len());
            links.push([(End::Node(n), 0), (End::Switch(s), p)]);
        }
        let root = (0..self.switches.len())
            .min_by_key(|&s| self.switches[s].id)
            .unwrap_or(0);
        Graph {
            switches: self.switches.len(),
            root,
            links,
            host_link,
        }
    }

    /// What a mapper should find in `topo` with every link up: the
    /// switches by index, links and nodes on their gates.
    pub fn expected(topo: &Topology) -> FabricMap {
        let g = Graph::of(topo);
        let switches = topo
            .switches()
            .iter()
            .enumerate()
            .map(|(i, name)| FoundSwitch {
                id: i as u32,
                name: name.clone(),
                gates: g
                    .links
                    .iter()
                    .flatten()
                    .filter(|(e, _)| *e == End::Switch(i))
                    .count() as u8,
                route: Route::default(),
            })
            .collect();
        let mut links = Vec::new();
        let mut nodes = Vec::new();
        for ends in &g.links {
            match *ends {
                [(End::Switch(a), pa), (End::Switch(b), pb)] => links.push(FoundLink {
                    a: (a, pa).min((b, pb)),
                    b: (a, pa).max((b, pb)),
                }),
                [(End::Node(n), _), (End::Switch(s), p)]
                | [(End::Switch(s), p), (End::Node(n), _)] => nodes.push((n, s, p)),
                _ => {}
            }
        }
        links.sort_unstable();
        nodes.sort_unstable();
        FabricMap {
            switches,
            links,
            nodes,
            ..FabricMap::default()
        }
    }

    /// The same wiring, ignoring the order things were found in and the
    /// counts: whether two rounds saw the same fabric.
    pub fn same_shape(&self, o: &FabricMap) -> bool {
        self.shape() == o.shape()
    }

    /// How this map differs from `expected`, for people: links and nodes
    /// one has and the other has not, by switch name and gate.
    pub fn differences(&self, expected: &FabricMap) -> Vec<String> {
        let (mine, theirs) = (self.shape(), expected.shape());
        let name = |m: &FabricMap, id: u32| {
            m.switches
                .iter()
                .find(|s| s.id == id)
                .map_or_else(|| format!("switch {id}"), |s| s.name.clone())
        };
        let mut out = Vec::new();
        for (what, from, to, m) in [
            ("missing", &theirs, &mine, expected),
            ("unexpected", &mine, &theirs, self),
        ] {
            for l in from.0.difference(&to.0) {
                out.push(format!(
                    "{what}: link {}:{} - {}:{}",
                    name(m, l.0),
                    l.1,
                    name(m, l.2),
                    l.3
                ));
            }
            for n in from.1.difference(&to.1) {
                out.push(format!("{what}: node {} on {}:{}", n.0, name(m, n.1), n.2));
            }
        }
        out
    }

    fn shape(&self) -> Shape {
        let id = |s: usize| self.switches[s].id;
        let links = self
            .links
            .iter()
            .map(|l| {
                let (a, b) = ((id(l.a.0), l.a.1), (id(l.b.0), l.b.1));
                let (a, b) = if a <= b { (a, b) } else { (b, a) };
                (a.0, a.1, b.0, b.1)
            })
            .collect();
        let nodes = self.nodes.iter().map(|&(n, s, p)| (n, id(s), p)).collect();
        (links, nodes)
    }
}

/// A map's wiring by switch id: links as (id, gate, id, gate), smaller end
/// first, and nodes as (node, id, gate).
type Shape = (BTreeSet<(u32, u8, u32, u8)>, BTreeSet<(u32, u32, u8)>);

pub use ulnic_abi::mapping::FROM_SWITCH;
use ulnic_abi::mapping::{ANSWER_NODE, ANSWER_SWITCH, MAX_SWITCH_NAME};
use ulnic_abi::wire::{ProbeReply, RouteEntryHead};
use zerocopy::{FromBytes, IntoBytes};

/// Who answered a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A switch: its id, name, gate count and the gate the probe came in
    /// by.
    Switch {
        /// Id.
        id: u32,
        /// Name.
        name: String,
        /// Gates.
        gates: u8,
        /// The gate the probe arrived on.
        in_gate: u8,
    },
    /// A node, by number.
    Node(u32),
}

/// The probe with id `id` of round `round`, from node `mapper` along
/// `route`.
pub fn probe(mapper: u32, round: u64, id: u32, route: Route) -> Packet {
    let mut p = Packet::new(packet::PROBE);
    p.header.src_node = mapper.into();
    p.header.epoch = (round as u32).into();
    p.header.seq = id.into();
    p.set_route(route);
    p.seal();
    p
}

/// The answer to probe `p` (whose payload is its trail of input gates),
/// going back the way it came.
pub fn reply(p: &Packet, answer: &Answer) -> Option<Packet> {
    let back = Route::new(&p.payload)?.reversed();
    let mut r = Packet::new(packet::PROBE_REPLY);
    r.header.dst_node = p.header.src_node;
    r.header.epoch = p.header.epoch;
    r.header.seq = p.header.seq;
    let (src, head, name) = match answer {
        Answer::Switch {
            id,
            name,
            gates,
            in_gate,
        } => {
            let head = ProbeReply {
                answer: ANSWER_SWITCH,
                in_gate: *in_gate,
                gates: *gates,
                reserved: 0,
                id: (*id).into(),
            };
            let name = name.as_bytes();
            (FROM_SWITCH, head, &name[..name.len().min(MAX_SWITCH_NAME)])
        }
        Answer::Node(n) => {
            let head = ProbeReply {
                answer: ANSWER_NODE,
                in_gate: 0,
                gates: 0,
                reserved: 0,
                id: (*n).into(),
            };
            (*n, head, &[][..])
        }
    };
    r.header.src_node = src.into();
    r.payload = head.as_bytes().to_vec();
    r.payload.extend_from_slice(name);
    r.set_route(back);
    r.seal();
    Some(r)
}

fn parse_answer(payload: &[u8]) -> Option<Answer> {
    let (head, name) = ProbeReply::read_from_prefix(payload).ok()?;
    if head.reserved != 0 {
        return None;
    }
    let id = head.id.get();
    match head.answer {
        ANSWER_SWITCH if name.len() <= MAX_SWITCH_NAME => Some(Answer::Switch {
            id,
            name: String::from_utf8_lossy(name).into_owned(),
            gates: head.gates,
            in_gate: head.in_gate,
        }),
        ANSWER_NODE if name.is_empty() => Some(Answer::Node(id)),
        _ => None,
    }
}

/// `ROUTES` packets carrying node `dst`'s route table `table` (by
/// destination) of generation `generation`, from the mapper along `route`;
/// each at most `room` payload bytes.
pub fn routes_packets(
    mapper: u32,
    dst: u32,
    generation: u64,
    table: &[Option<Route>],
    route: Route,
    room: usize,
) -> Vec<Packet> {
    let mut out = Vec::new();
    let mut payload = Vec::new();
    let entries = table
        .iter()
        .enumerate()
        .filter_map(|(d, r)| Some((d as u32, (*r)?)));
    let mut send = |payload: &mut Vec<u8>| {
        let mut p = Packet::new(packet::ROUTES);
        p.header.src_node = mapper.into();
        p.header.dst_node = dst.into();
        p.header.seq = (generation as u32).into();
        p.payload = std::mem::take(payload);
        p.set_route(route);
        p.seal();
        out.push(p);
    };
    for (d, r) in entries {
        if payload.len() + size_of::<RouteEntryHead>() + r.len() > room {
            send(&mut payload);
        }
        let head = RouteEntryHead {
            dst_node: d.into(),
            route_len: r.len() as u8,
        };
        payload.extend_from_slice(head.as_bytes());
        payload.extend_from_slice(r.gates());
    }
    if !payload.is_empty() {
        send(&mut payload);
    }
    out
}

/// The (destination, route) entries of a `ROUTES` payload; `None` when it
/// does not parse.
pub fn parse_routes(payload: &[u8]) -> Option<Vec<(u32, Route)>> {
    let mut out = Vec::new();
    let mut rest = payload;
    while !rest.is_empty() {
        let (head, after) = RouteEntryHead::read_from_prefix(rest).ok()?;
        let len = usize::from(head.route_len);
        out.push((head.dst_node.get(), Route::new(after.get(..len)?)?));
        rest = &after[len..];
    }
    Some(out)
}

/// What a probe asked.
#[derive(Debug, Clone, Copy)]
struct Pending {
    route: Route,
    /// The switch and gate probed (`None`: the mapper's own switch).
    from: Option<(usize, u8)>,
    sent_at: Nanos,
    tries: u32,
}

/// A round in progress.
struct Round {
    map: FabricMap,
    pending: HashMap<u32, Pending>,
    next_id: u32,
    by_id: HashMap<u32, usize>,
    links: BTreeSet<FoundLink>,
}

/// One node's mapper.
pub struct Mapper {
    node: u32,
    config: MappingConfig,
    /// Whether it runs rounds on its own and installs the routes (else it
    /// only looks when asked).
    installs: bool,
    rounds: u64,
    round: Option<Round>,
    next_round: Option<Nanos>,
    requested: bool,
    last: Option<FabricMap>,
    generation: u64,
}

impl Mapper {
    /// A mapper on node `node`. With `installs`, it starts a round at once
    /// and again every interval, and the network installs its routes.
    pub fn new(node: u32, config: MappingConfig, installs: bool) -> Mapper {
        Mapper {
            node,
            config,
            installs,
            rounds: 0,
            round: None,
            next_round: installs.then_some(0),
            requested: false,
            last: None,
            generation: 0,
        }
    }

    /// The node it runs on.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Whether its routes are the fabric's.
    pub fn installs(&self) -> bool {
        self.installs
    }

    /// Asks for a round as soon as possible; returns the number it will
    /// have (or the one running, which counts).
    pub fn request(&mut self) -> u64 {
        if self.round.is_some() {
            return self.rounds;
        }
        self.requested = true;
        self.rounds + 1
    }

    /// What the last finished round found.
    pub fn last(&self) -> Option<&FabricMap> {
        self.last.as_ref()
    }

    /// Whether it has something to do now or soon (a round running, one
    /// asked for, or rounds on a timer).
    pub fn active(&self) -> bool {
        self.round.is_some() || self.requested || self.next_round.is_some()
    }

    /// When it next needs to run.
    pub fn next_due(&self) -> Option<Nanos> {
        if let Some(r) = &self.round {
            let t = self.config.probe_timeout.as_nanos() as Nanos;
            return r.pending.values().map(|p| p.sent_at + t).min();
        }
        if self.requested {
            return Some(0);
        }
        self.next_round
    }

    /// Starts a round when one is due, sends probes again whose time is
    /// up, and gives up on those out of tries. Probes to send go to `out`;
    /// a round that finishes is returned.
    pub fn tick(&mut self, now: Nanos, out: &mut Vec<Packet>) -> Option<FabricMap> {
        if self.round.is_none() && (self.requested || self.next_round.is_some_and(|t| t <= now)) {
            self.requested = false;
            self.next_round = None;
            self.rounds += 1;
            let mut r = Round {
                map: FabricMap {
                    round: self.rounds,
                    mapper: self.node,
                    took: now,
                    ..FabricMap::default()
                },
                pending: HashMap::new(),
                next_id: 0,
                by_id: HashMap::new(),
                links: BTreeSet::new(),
            };
            Self::send_to(self.node, &mut r, Route::default(), None, now, out);
            self.round = Some(r);
        }
        let r = self.round.as_mut()?;
        let timeout = self.config.probe_timeout.as_nanos() as Nanos;
        let late: Vec<u32> = r
            .pending
            .iter()
            .filter(|(_, p)| p.sent_at + timeout <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            r.map.timeouts += 1;
            let Some(p) = r.pending.get_mut(&id) else {
                continue;
            };
            if p.tries >= self.config.probe_tries {
                r.pending.remove(&id);
                continue;
            }
            p.tries += 1;
            p.sent_at = now;
            r.map.probes += 1;
            out.push(probe(self.node, r.map.round, id, p.route));
        }
        self.finish_if_done(now)
    }

    /// Takes a `PROBE_REPLY` that reached the mapper's node; new probes go
    /// to `out`. A round that finishes is returned.
    pub fn answer(&mut self, p: &Packet, now: Nanos, out: &mut Vec<Packet>) -> Option<FabricMap> {
        let r = self.round.as_mut()?;
        if u64::from(p.header.epoch.get()) != r.map.round & 0xffff_ffff {
            return None; // an old round's
        }
        let pending = r.pending.remove(&p.header.seq.get())?;
        match parse_answer(&p.payload) {
            Some(Answer::Node(n)) => {
                if let Some((s, gate)) = pending.from {
                    if !r.map.nodes.iter().any(|x| x.0 == n) {
                        r.map.nodes.push((n, s, gate));
                    }
                }
            }
            Some(Answer::Switch {
                id,
                name,
                gates,
                in_gate,
            }) => {
                let known = r.by_id.get(&id).copied();
                let s = match known {
                    Some(s) => s,
                    None => {
                        let s = r.map.switches.len();
                        r.by_id.insert(id, s);
                        r.map.switches.push(FoundSwitch {
                            id,
                            name,
                            gates,
                            route: pending.route,
                        });
                        s
                    }
                };
                if let Some(from) = pending.from {
                    let (a, b) = if from <= (s, in_gate) {
                        (from, (s, in_gate))
                    } else {
                        ((s, in_gate), from)
                    };
                    r.links.insert(FoundLink { a, b });
                }
                if known.is_none() {
                    // Probe each of its gates but the one the probe came in by
                    // (whatever is there was reached already).
                    for gate in 0..gates {
                        let came_by = pending.from.is_some() && gate == in_gate;
                        let mut route = pending.route;
                        if came_by || !route.push(gate) {
                            continue;
                        }
                        Self::send_to(self.node, r, route, Some((s, gate)), now, out);
                    }
                }
            }
            None => {}
        }
        self.finish_if_done(now)
    }

    fn send_to(
        node: u32,
        r: &mut Round,
        route: Route,
        from: Option<(usize, u8)>,
        now: Nanos,
        out: &mut Vec<Packet>,
    ) {
        let id = r.next_id;
        r.next_id += 1;
        r.pending.insert(
            id,
            Pending {
                route,
                from,
                sent_at: now,
                tries: 1,
            },
        );
        r.map.probes += 1;
        out.push(probe(node, r.map.round, id, route));
    }

    fn finish_if_done(&mut self, now: Nanos) -> Option<FabricMap> {
        if self.round.as_ref()?.pending.is_empty() {
            let r = self.round.take()?;
            let mut map = r.map;
            map.links = r.links.into_iter().collect();
            map.nodes.sort_unstable();
            map.took = now.saturating_sub(map.took);
            if self.installs {
                let changed = self.last.as_ref().is_none_or(|l| !l.same_shape(&map));
                if changed {
                    self.generation += 1;
                }
                map.generation = self.generation;
                self.next_round = Some(now + self.config.interval.as_nanos() as Nanos);
            }
            self.last = Some(map.clone());
            return Some(map);
        }
        None
    }
}

/// Every found node's route table (by source, then destination) from
/// `map`: up*/down* on what was found.
pub fn tables(map: &FabricMap) -> Vec<Vec<Option<Route>>> {
    let routes = Routes::up_down(&map.graph());
    let n = routes.nodes();
    (0..n)
        .map(|src| (0..n).map(|dst| routes.route(src, dst)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_go_back_the_way_the_probe_came() {
        let mut p = probe(3, 1, 9, Route::new(&[4, 1]).unwrap());
        // Two switches passed: it came in on gate 2, then on gate 0.
        p.payload = vec![2, 0];
        p.seal();
        let answer = Answer::Switch {
            id: 7,
            name: "spine".into(),
            gates: 5,
            in_gate: 0,
        };
        let r = reply(&p, &answer).unwrap();
        assert_eq!(r.route.gates(), [0, 2]);
        assert_eq!(r.header.dst_node.get(), 3);
        assert_eq!(r.header.seq.get(), 9);
        assert!(r.intact());
        assert_eq!(parse_answer(&r.payload), Some(answer));
        let r = reply(&p, &Answer::Node(12)).unwrap();
        assert_eq!(parse_answer(&r.payload), Some(Answer::Node(12)));
    }

    #[test]
    fn route_tables_survive_chunking() {
        let table: Vec<Option<Route>> = (0..100u8)
            .map(|d| (d % 7 != 0).then(|| Route::new(&[d % 5, d % 3, 1]).unwrap()))
            .collect();
        let ps = routes_packets(0, 5, 3, &table, Route::new(&[1]).unwrap(), 200);
        assert!(ps.len() > 1);
        let mut got = vec![None; table.len()];
        for p in &ps {
            assert!(p.payload.len() <= 200 && p.intact());
            for (d, r) in parse_routes(&p.payload).unwrap() {
                got[d as usize] = Some(r);
            }
        }
        assert_eq!(got, table);
        assert_eq!(parse_routes(&[1, 0, 0, 0, 3, 1]), None);
    }
}
