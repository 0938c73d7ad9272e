//! A fabric's shape (spec §10): switches, the links between them and the
//! link each node hangs on, with each link's parameters. Built from a
//! topology file by the tools, or `Topology::single_switch` by default;
//! checked when made, so a `Topology` is always one the routes can serve.

use std::collections::HashMap;
use std::time::Duration;

/// What a link emulates. The default is an ideal link: no latency, no
/// rate limit, the largest MTU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkParams {
    /// One-way latency.
    pub latency: Duration,
    /// Rate in bits per second; `None` is unlimited.
    pub bandwidth_bps: Option<u64>,
    /// Largest packet payload in bytes.
    pub mtu: u32,
    /// Packets a link's queue holds before it pushes back.
    pub queue_packets: u32,
    /// Faults injected on the link (both directions).
    pub faults: Faults,
}

/// Faults a link injects (spec §10.5), each a probability per packet in
/// 0..=1, drawn from the link's own seeded generator, so the same seed and
/// the same traffic give the same faults.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// The packet is lost.
    pub drop: f64,
    /// One bit of the packet flips (its CRC no longer matches; the far
    /// end discards it).
    pub corrupt: f64,
    /// The packet arrives twice.
    pub duplicate: f64,
    /// The packet is held back so later packets overtake it.
    pub reorder: f64,
    /// The packet arrives `delay_by` late.
    pub delay: f64,
    /// How late a delayed packet arrives.
    pub delay_by: Duration,
    /// The link is cut: every packet is lost (a partition).
    pub down: bool,
}

impl Faults {
    /// Whether the link injects nothing.
    pub fn none(&self) -> bool {
        *self
            == Faults {
                delay_by: self.delay_by,
                ..Faults::default()
            }
    }

    /// Refuses probabilities outside 0..=1 and delays past 10 s.
    pub fn check(&self) -> Result<(), String> {
        for (name, p) in [
            ("drop", self.drop),
            ("corrupt", self.corrupt),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("delay", self.delay),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} probability {p} is not in 0..=1"));
            }
        }
        if self.delay_by > Duration::from_secs(10) {
            return Err(format!("a delay of {:?} is past 10 s", self.delay_by));
        }
        Ok(())
    }
}

pub use ulnic_abi::fabric::{MAX_GATES, MAX_MTU, MIN_MTU};

impl Default for LinkParams {
    fn default() -> Self {
        LinkParams {
            latency: Duration::ZERO,
            bandwidth_bps: None,
            mtu: MAX_MTU,
            queue_packets: 64,
            faults: Faults::default(),
        }
    }
}

/// One end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum End {
    /// A switch, by index.
    Switch(usize),
    /// A node (one vhost-user socket of a device), by number.
    Node(u32),
}

/// A full-duplex link between two ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// One end.
    pub a: End,
    /// The other end.
    pub b: End,
    /// What it emulates.
    pub params: LinkParams,
}

/// Why a topology was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// A fabric needs at least one switch and one node.
    #[error("a fabric needs at least one switch and one node")]
    Empty,
    /// Two switches share a name.
    #[error("two switches are named '{0}'")]
    DuplicateSwitch(String),
    /// A link names a switch or node that does not exist.
    #[error("link {link} names {end}, which does not exist")]
    NoSuchEnd {
        /// The link, by index.
        link: usize,
        /// What it named.
        end: String,
    },
    /// A link joins two nodes, or an end to itself.
    #[error("link {0} must join two switches or a node to a switch")]
    BadLink(usize),
    /// A node hangs on no link, or on more than one.
    #[error("node {node} hangs on {links} links; every node hangs on exactly one")]
    NodeLinks {
        /// The node.
        node: u32,
        /// How many links it has.
        links: usize,
    },
    /// A switch has more links than a route byte can number.
    #[error("switch '{0}' has more than {MAX_GATES} links")]
    TooManyGates(String),
    /// Some switches cannot reach the others.
    #[error("switch '{0}' is not connected to switch '{1}'")]
    Disconnected(String, String),
    /// A link's parameters are out of range.
    #[error("link {link}: {why}")]
    BadParams {
        /// The link, by index.
        link: usize,
        /// What is wrong.
        why: String,
    },
}

/// A checked fabric shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    switches: Vec<String>,
    links: Vec<Link>,
    nodes: u32,
    /// The link each node hangs on, by node number.
    host_link: Vec<usize>,
}

impl Topology {
    /// The default fabric: one switch with every node on an ideal link.
    pub fn single_switch(nodes: u32) -> Topology {
        let links = (0..nodes)
            .map(|n| Link {
                a: End::Node(n),
                b: End::Switch(0),
                params: LinkParams::default(),
            })
            .collect();
        Topology {
            switches: vec!["switch0".into()],
            links,
            nodes,
            host_link: (0..nodes as usize).collect(),
        }
    }

    /// A topology of `nodes` nodes over `switches`, if it is one the
    /// fabric can route: names unique, every link joining two switches or
    /// a node to a switch, every node on exactly one link, every switch
    /// reachable from every other, parameters in range.
    pub fn new(
        nodes: u32,
        switches: Vec<String>,
        links: Vec<Link>,
    ) -> Result<Topology, TopologyError> {
        if switches.is_empty() || nodes == 0 {
            return Err(TopologyError::Empty);
        }
        let mut names = HashMap::new();
        for (i, s) in switches.iter().enumerate() {
            if names.insert(s.as_str(), i).is_some() {
                return Err(TopologyError::DuplicateSwitch(s.clone()));
            }
        }
        let mut host_link = vec![Vec::new(); nodes as usize];
        for (i, l) in links.iter().enumerate() {
            for end in [l.a, l.b] {
                let exists = match end {
                    End::Switch(s) => s < switches.len(),
                    End::Node(n) => n < nodes,
                };
                if !exists {
                    return Err(TopologyError::NoSuchEnd {
                        link: i,
                        end: format!("{end:?}"),
                    });
                }
            }
            match (l.a, l.b) {
                (End::Switch(x), End::Switch(y)) if x != y => {}
                (End::Node(n), End::Switch(_)) | (End::Switch(_), End::Node(n)) => {
                    host_link[n as usize].push(i)
                }
                _ => return Err(TopologyError::BadLink(i)),
            }
            check_params(i, &l.params)?;
        }
        for (i, name) in switches.iter().enumerate() {
            let gates = links
                .iter()
                .filter(|l| l.a == End::Switch(i) || l.b == End::Switch(i))
                .count();
            if gates > MAX_GATES {
                return Err(TopologyError::TooManyGates(name.clone()));
            }
        }
        let host_link = host_link
            .into_iter()
            .enumerate()
            .map(|(n, ls)| match ls.as_slice() {
                [one] => Ok(*one),
                _ => Err(TopologyError::NodeLinks {
                    node: n as u32,
                    links: ls.len(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let t = Topology {
            switches,
            links,
            nodes,
            host_link,
        };
        let reach = t.reachable_from(0);
        if let Some(s) = reach.iter().position(|r| !r) {
            return Err(TopologyError::Disconnected(
                t.switches[s].clone(),
                t.switches[0].clone(),
            ));
        }
        Ok(t)
    }

    /// Switch names, by index.
    pub fn switches(&self) -> &[String] {
        &self.switches
    }

    /// Every link, by index.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// Number of nodes.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// The link node `n` hangs on, and the switch at its other end.
    pub fn attachment(&self, n: u32) -> (usize, usize) {
        let l = self.host_link[n as usize];
        let s = match (self.links[l].a, self.links[l].b) {
            (End::Switch(s), _) | (_, End::Switch(s)) => s,
            // `new` refused links between two nodes.
            _ => 0,
        };
        (l, s)
    }

    /// Replaces link `link`'s faults (`ulnic fabric set`); the shape and
    /// the other parameters stay.
    pub fn set_faults(&mut self, link: usize, faults: Faults) -> Result<(), TopologyError> {
        faults
            .check()
            .map_err(|why| TopologyError::BadParams { link, why })?;
        let l = self.links.get_mut(link).ok_or(TopologyError::BadParams {
            link,
            why: "no such link".into(),
        })?;
        l.params.faults = faults;
        Ok(())
    }

    /// The link's name for people: "node N" for a host link, else
    /// "A-B" by switch names.
    pub fn link_name(&self, link: usize) -> String {
        let name = |e: End| match e {
            End::Switch(s) => self.switches[s].clone(),
            End::Node(n) => format!("node {n}"),
        };
        let l = &self.links[link];
        match (l.a, l.b) {
            (End::Node(n), _) | (_, End::Node(n)) => format!("node {n}"),
            (a, b) => format!("{}-{}", name(a), name(b)),
        }
    }

    /// Links between switches: (link, from, to) both ways.
    pub fn switch_hops(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match (l.a, l.b) {
                (End::Switch(x), End::Switch(y)) => Some([(i, x, y), (i, y, x)]),
                _ => None,
            })
            .flatten()
    }

    fn reachable_from(&self, root: usize) -> Vec<bool> {
        let mut seen = vec![false; self.switches.len()];
        seen[root] = true;
        let mut todo = vec![root];
        while let Some(s) = todo.pop() {
            for (_, from, to) in self.switch_hops() {
                if from == s && !seen[to] {
                    seen[to] = true;
                    todo.push(to);
                }
            }
        }
        seen
    }
}

fn check_params(link: usize, p: &LinkParams) -> Result<(), TopologyError> {
    let bad = |why: String| Err(TopologyError::BadParams { link, why });
    if !(MIN_MTU..=MAX_MTU).contains(&p.mtu) {
        return bad(format!("MTU {} is not in {MIN_MTU}..={MAX_MTU}", p.mtu));
    }
    if p.queue_packets == 0 {
        return bad("a queue must hold at least one packet".into());
    }
    if p.bandwidth_bps == Some(0) {
        return bad("a bandwidth of 0 carries nothing".into());
    }
    if p.latency > Duration::from_secs(10) {
        return bad(format!("a latency of {:?} is past 10 s", p.latency));
    }
    p.faults.check().or_else(bad)
}

/// Test topologies shared by the fabric's tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A connected topology drawn by proptest: a spanning tree over
    /// `switches` (switch s joined to one of 0..s), `extra` links (even
    /// parallel ones), and node n on switch `hosts[n]`; ideal links.
    pub(crate) fn random(
        switches: usize,
        tree: &[proptest::sample::Index],
        extra: &[(usize, usize)],
        hosts: &[usize],
    ) -> Topology {
        let link = |a, b| Link {
            a,
            b,
            params: LinkParams::default(),
        };
        let mut links: Vec<Link> = (1..switches)
            .map(|s| link(End::Switch(s), End::Switch(tree[s - 1].index(s))))
            .collect();
        links.extend(
            extra
                .iter()
                .map(|&(a, b)| (a % switches, b % switches))
                .filter(|(a, b)| a != b)
                .map(|(a, b)| link(End::Switch(a), End::Switch(b))),
        );
        links.extend(
            hosts
                .iter()
                .enumerate()
                .map(|(n, &s)| link(End::Node(n as u32), End::Switch(s % switches))),
        );
        let names = (0..switches).map(|s| format!("s{s}")).collect();
        Topology::new(hosts.len() as u32, names, links).expect("a connected topology")
    }

    /// A ring of four switches, node n on switch n.
    pub(crate) fn ring() -> Topology {
        let link = |a, b| Link {
            a,
            b,
            params: LinkParams::default(),
        };
        let mut links: Vec<Link> = (0..4)
            .map(|s| link(End::Switch(s), End::Switch((s + 1) % 4)))
            .collect();
        links.extend((0..4).map(|n| link(End::Node(n), End::Switch(n as usize))));
        let names = (0..4).map(|s| format!("s{s}")).collect();
        Topology::new(4, names, links).expect("a ring is connected")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(a: End, b: End) -> Link {
        Link {
            a,
            b,
            params: LinkParams::default(),
        }
    }

    #[test]
    fn the_default_is_one_switch_with_every_node() {
        let t = Topology::single_switch(3);
        assert_eq!(t.switches().len(), 1);
        assert_eq!(t.attachment(2), (2, 0));
        assert_eq!(Topology::new(3, t.switches.clone(), t.links.clone()), Ok(t));
    }

    #[test]
    fn bad_shapes_are_refused_with_their_reason() {
        let sw = || vec!["a".to_string(), "b".to_string()];
        let (n0, n1) = (End::Node(0), End::Node(1));
        let (a, b) = (End::Switch(0), End::Switch(1));
        assert_eq!(
            Topology::new(2, sw(), vec![link(n0, a), link(n1, b)]),
            Err(TopologyError::Disconnected("b".into(), "a".into()))
        );
        assert_eq!(
            Topology::new(2, sw(), vec![link(n0, a), link(a, b)]),
            Err(TopologyError::NodeLinks { node: 1, links: 0 })
        );
        assert_eq!(
            Topology::new(2, sw(), vec![link(n0, n1), link(a, b)]),
            Err(TopologyError::BadLink(0))
        );
        assert_eq!(
            Topology::new(1, sw(), vec![link(n0, End::Switch(5))]),
            Err(TopologyError::NoSuchEnd {
                link: 0,
                end: "Switch(5)".into()
            })
        );
        assert_eq!(
            Topology::new(1, vec!["a".into(), "a".into()], vec![]),
            Err(TopologyError::DuplicateSwitch("a".into()))
        );
        let mut tiny = link(n0, a);
        tiny.params.mtu = 100;
        assert!(matches!(
            Topology::new(1, vec!["a".into()], vec![tiny]),
            Err(TopologyError::BadParams { link: 0, .. })
        ));
    }
}
