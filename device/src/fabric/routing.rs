//! Routes through a fabric (spec §10.2): up*/down* routing (Autonet,
//! Schroeder et al. 1991, as Myrinet's mapper uses), which is free of
//! deadlock for every connected topology.
//!
//! Switches are ranked by a breadth-first search from a root switch: a
//! hop goes *up* when it reaches a switch of lower (level, index). A legal
//! route takes zero or more up hops, then zero or more down hops, never up
//! after down. No cycle of channel dependencies can then form, so
//! back-pressured queues cannot wait on each other in a circle. Among legal
//! routes each pair gets a shortest one.
//!
//! Routes are computed on a [`Graph`]: the topology file's (static routes)
//! or the one a mapper found (spec §10.9); either way each becomes a
//! source route of gates to leave by.

use std::collections::VecDeque;

use crate::fabric::packet::Route;
use crate::fabric::topology::{End, Topology};

/// A directed use of a link: the link, and whether it is crossed from its
/// first end to its second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hop {
    /// The link.
    pub link: usize,
    /// Crossed from `a` to `b` (else from `b` to `a`).
    pub forward: bool,
}

/// A fabric's wiring as routing sees it: switches, and links whose ends
/// are switch gates or nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Graph {
    /// Number of switches.
    pub switches: usize,
    /// The switch the up*/down* ranking starts from.
    pub root: usize,
    /// Each link's two ends, with the gate number at a switch end (0 at a
    /// node).
    pub links: Vec<[(End, u8); 2]>,
    /// By node number: the link it hangs on, if it was found.
    pub host_link: Vec<Option<usize>>,
}

impl Graph {
    /// The wiring of `topo`: every link in file order, and a switch's
    /// gates numbered by the order its links appear in the file.
    pub fn of(topo: &Topology) -> Graph {
        let mut next_gate = vec![0u8; topo.switches().len()];
        let mut end = |e: End| match e {
            End::Switch(s) => {
                let p = next_gate[s];
                next_gate[s] = p.wrapping_add(1);
                (e, p)
            }
            End::Node(_) => (e, 0),
        };
        let links = topo.links().iter().map(|l| [end(l.a), end(l.b)]).collect();
        Graph {
            switches: topo.switches().len(),
            root: 0,
            links,
            host_link: (0..topo.nodes())
                .map(|n| Some(topo.attachment(n).0))
                .collect(),
        }
    }

    /// Links between switches: (link, from, to) both ways.
    fn switch_hops(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(i, [(a, _), (b, _)])| match (a, b) {
                (End::Switch(x), End::Switch(y)) => Some([(i, *x, *y), (i, *y, *x)]),
                _ => None,
            })
            .flatten()
    }

    /// The switch node `n` hangs on.
    fn switch_of(&self, n: u32) -> Option<(usize, usize)> {
        let l = (*self.host_link.get(n as usize)?)?;
        let s = self.links[l].iter().find_map(|(e, _)| match e {
            End::Switch(s) => Some(*s),
            End::Node(_) => None,
        })?;
        Some((l, s))
    }

    /// The end a hop leaves from and its gate there.
    fn leaving_end(&self, h: Hop) -> (End, u8) {
        self.links[h.link][usize::from(!h.forward)]
    }
}

/// Every node's route to every other node.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    nodes: u32,
    /// By `src * nodes + dst`: the hops from `src`'s host link to `dst`'s,
    /// `None` when one of them was not found.
    paths: Vec<Option<Vec<Hop>>>,
    /// The same as the gates to leave by at each switch.
    gate_routes: Vec<Option<Route>>,
}

impl Routes {
    /// Up*/down* routes for `g`, among the switches reachable from its
    /// root. A route crossing more than `MAX_ROUTE` switches is left out.
    pub fn up_down(g: &Graph) -> Routes {
        let rank = rank(g);
        // For each source switch, the shortest legal path to every switch.
        let between: Vec<Vec<Option<Vec<Hop>>>> = (0..g.switches)
            .map(|s| shortest_legal(g, &rank, s))
            .collect();
        let nodes = g.host_link.len() as u32;
        let mut paths = Vec::with_capacity((nodes * nodes) as usize);
        for src in 0..nodes {
            for dst in 0..nodes {
                let p = match (g.switch_of(src), g.switch_of(dst)) {
                    _ if src == dst => Some(Vec::new()),
                    (Some((sl, ss)), Some((dl, ds))) => between[ss][ds].as_ref().map(|mid| {
                        let mut p = vec![Hop {
                            link: sl,
                            forward: matches!(g.links[sl][0].0, End::Node(_)),
                        }];
                        p.extend_from_slice(mid);
                        p.push(Hop {
                            link: dl,
                            forward: matches!(g.links[dl][1].0, End::Node(_)),
                        });
                        p
                    }),
                    _ => None,
                };
                paths.push(p);
            }
        }
        // Every hop after the first leaves a switch by a gate.
        let gate_routes = paths
            .iter()
            .map(|p| {
                let p = p.as_ref()?;
                let gates: Vec<u8> = p.iter().skip(1).map(|h| g.leaving_end(*h).1).collect();
                Route::new(&gates)
            })
            .collect();
        Routes {
            nodes,
            paths,
            gate_routes,
        }
    }

    /// The hops from node `src` to node `dst` (empty for a node to
    /// itself, which never leaves the node), if there is a route.
    pub fn path(&self, src: u32, dst: u32) -> Option<&[Hop]> {
        if src >= self.nodes || dst >= self.nodes {
            return None;
        }
        let i = (src * self.nodes + dst) as usize;
        self.gate_routes[i]?;
        self.paths[i].as_deref()
    }

    /// The source route from `src` to `dst`, if there is one.
    pub fn route(&self, src: u32, dst: u32) -> Option<Route> {
        if src >= self.nodes || dst >= self.nodes {
            return None;
        }
        self.gate_routes[(src * self.nodes + dst) as usize]
    }

    /// Number of nodes.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }
}

/// Each switch's (BFS level from the root, index): a hop to a lower rank
/// goes up. A switch the root cannot reach ranks last.
fn rank(g: &Graph) -> Vec<(usize, usize)> {
    let n = g.switches;
    let mut level = vec![usize::MAX; n];
    if n == 0 {
        return Vec::new();
    }
    level[g.root] = 0;
    let hops: Vec<(usize, usize, usize)> = g.switch_hops().collect();
    let mut q = VecDeque::from([g.root]);
    while let Some(s) = q.pop_front() {
        for &(_, from, to) in &hops {
            if from == s && level[to] == usize::MAX {
                level[to] = level[s] + 1;
                q.push_back(to);
            }
        }
    }
    (0..n).map(|s| (level[s], s)).collect()
}

/// Shortest legal (up* then down*) hops from switch `src` to each switch
/// (`None` for one it cannot reach).
fn shortest_legal(g: &Graph, rank: &[(usize, usize)], src: usize) -> Vec<Option<Vec<Hop>>> {
    let n = g.switches;
    // State: (switch, gone down yet). Predecessor: (state, hop).
    let idx = |s: usize, down: bool| s * 2 + usize::from(down);
    let mut prev: Vec<Option<(usize, Hop)>> = vec![None; n * 2];
    let mut seen = vec![false; n * 2];
    seen[idx(src, false)] = true;
    let mut q = VecDeque::from([(src, false)]);
    let hops: Vec<(usize, usize, usize)> = g.switch_hops().collect();
    while let Some((s, down)) = q.pop_front() {
        for &(link, from, to) in &hops {
            if from != s {
                continue;
            }
            let up = rank[to] < rank[from];
            if up && down {
                continue; // never up after down
            }
            let next = (to, down || !up);
            if !seen[idx(next.0, next.1)] {
                seen[idx(next.0, next.1)] = true;
                let forward = g.links[link][0].0 == End::Switch(from);
                prev[idx(next.0, next.1)] = Some((idx(s, down), Hop { link, forward }));
                q.push_back(next);
            }
        }
    }
    (0..n)
        .map(|dst| {
            let end = [idx(dst, false), idx(dst, true)]
                .into_iter()
                .filter(|&i| seen[i])
                .min_by_key(|&i| walk(&prev, i).len())?;
            let mut p = walk(&prev, end);
            p.reverse();
            Some(p)
        })
        .collect()
}

/// The hops back from state `i` to the start, last first.
fn walk(prev: &[Option<(usize, Hop)>], mut i: usize) -> Vec<Hop> {
    let mut p = Vec::new();
    while let Some((from, hop)) = prev[i] {
        p.push(hop);
        i = from;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::topology::Topology;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// Whether the channel dependency graph of all `paths` (hop -> next
    /// hop of the same route) has a cycle: the condition for deadlock
    /// under back-pressure (Dally and Seitz).
    fn dependencies_cycle(paths: &[Vec<Hop>]) -> bool {
        let mut next: BTreeMap<Hop, BTreeSet<Hop>> = BTreeMap::new();
        for p in paths {
            for w in p.windows(2) {
                next.entry(w[0]).or_default().insert(w[1]);
            }
        }
        // Depth-first search for a back edge.
        fn visit(
            h: Hop,
            next: &BTreeMap<Hop, BTreeSet<Hop>>,
            state: &mut BTreeMap<Hop, u8>,
        ) -> bool {
            state.insert(h, 1);
            for &n in next.get(&h).into_iter().flatten() {
                match state.get(&n).copied() {
                    Some(1) => return true,
                    None if visit(n, next, state) => return true,
                    _ => {}
                }
            }
            state.insert(h, 2);
            false
        }
        let mut state = BTreeMap::new();
        let keys: Vec<Hop> = next.keys().copied().collect();
        keys.into_iter()
            .any(|h| !state.contains_key(&h) && visit(h, &next, &mut state))
    }

    /// Every route of `r` in `topo`: node to node, each hop leaving the
    /// end the previous one reached.
    fn assert_connected_routes(topo: &Topology, r: &Routes) {
        for src in 0..topo.nodes() {
            for dst in 0..topo.nodes() {
                let p = r.path(src, dst).expect("a route");
                if src == dst {
                    assert!(p.is_empty());
                    continue;
                }
                let mut at = End::Node(src);
                for h in p {
                    let l = &topo.links()[h.link];
                    let (from, to) = if h.forward { (l.a, l.b) } else { (l.b, l.a) };
                    assert_eq!(from, at, "{src}->{dst}: {p:?}");
                    at = to;
                }
                assert_eq!(at, End::Node(dst), "{src}->{dst}: {p:?}");
                // The source route names the same links, gate by gate.
                let g = Graph::of(topo);
                let route = r.route(src, dst).expect("a route");
                assert_eq!(route.len(), p.len() - 1);
                for (h, gate) in p.iter().skip(1).zip(route.gates()) {
                    assert_eq!(g.leaving_end(*h).1, *gate);
                }
            }
        }
    }

    #[test]
    fn a_ring_routes_without_a_dependency_cycle() {
        let t = crate::fabric::topology::testing::ring();
        let r = Routes::up_down(&Graph::of(&t));
        assert_connected_routes(&t, &r);
        let all: Vec<Vec<Hop>> = (0..4)
            .flat_map(|s| (0..4).map(move |d| (s, d)))
            .map(|(s, d)| r.path(s, d).unwrap_or_default().to_vec())
            .collect();
        assert!(!dependencies_cycle(&all));
        // Shortest paths around the ring, clockwise, would deadlock: the
        // check above can see a cycle.
        let clockwise: Vec<Vec<Hop>> = (0..4)
            .map(|s| {
                (0..3)
                    .map(|k| Hop {
                        link: (s + k) % 4,
                        forward: true,
                    })
                    .collect()
            })
            .collect();
        assert!(dependencies_cycle(&clockwise));
    }

    #[test]
    fn one_switch_routes_through_it() {
        let t = Topology::single_switch(3);
        let r = Routes::up_down(&Graph::of(&t));
        assert_connected_routes(&t, &r);
        assert_eq!(r.path(0, 2).map(<[Hop]>::len), Some(2));
        assert_eq!(r.route(0, 2).map(|r| r.gates().to_vec()), Some(vec![2]));
    }

    proptest! {
        /// Any connected topology: every pair has a route, every route is
        /// up* then down*, and no channel dependency cycle forms.
        #[test]
        fn up_down_routes_never_deadlock(
            switches in 1usize..8,
            tree in proptest::collection::vec(any::<prop::sample::Index>(), 7),
            extra in proptest::collection::vec((0usize..8, 0usize..8), 0..10),
            hosts in proptest::collection::vec(0usize..8, 1..10),
        ) {
            let t = crate::fabric::topology::testing::random(switches, &tree, &extra, &hosts);
            let r = Routes::up_down(&Graph::of(&t));
            assert_connected_routes(&t, &r);
            let rank = rank(&Graph::of(&t));
            let mut all = Vec::new();
            for s in 0..t.nodes() {
                for d in 0..t.nodes() {
                    let p = r.path(s, d).unwrap_or_default().to_vec();
                    // Between the host links: up hops, then down hops.
                    let mut gone_down = false;
                    for h in p.iter().skip(1).take(p.len().saturating_sub(2)) {
                        let l = &t.links()[h.link];
                        let (End::Switch(x), End::Switch(y)) = (l.a, l.b) else {
                            panic!("a host link inside a route: {p:?}");
                        };
                        let (from, to) = if h.forward { (x, y) } else { (y, x) };
                        let up = rank[to] < rank[from];
                        prop_assert!(!(up && gone_down), "up after down: {p:?}");
                        gone_down |= !up;
                    }
                    all.push(p);
                }
            }
            prop_assert!(!dependencies_cycle(&all));
        }
    }
}
