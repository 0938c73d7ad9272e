//! Routes through a fabric (spec §10.2): up*/down* routing (Autonet,
//! Schroeder et al. 1991, as Myrinet's mapper uses), which is free of
//! deadlock for every connected topology.
//!
//! Switches are ranked by a breadth-first search from switch 0: a hop
//! goes *up* when it reaches a switch of lower (level, index). A legal
//! route takes zero or more up hops, then zero or more down hops, never up
//! after down. No cycle of channel dependencies can then form, so
//! back-pressured queues cannot wait on each other in a circle. Among legal
//! routes each pair gets a shortest one.

use std::collections::VecDeque;

use crate::fabric::topology::Topology;

/// A directed use of a link: the link, and whether it is crossed from its
/// `a` end to its `b` end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hop {
    /// The link.
    pub link: usize,
    /// Crossed from `a` to `b` (else from `b` to `a`).
    pub forward: bool,
}

/// Every node's route to every other node.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    nodes: u32,
    /// By `src * nodes + dst`: the hops from `src`'s host link to `dst`'s.
    paths: Vec<Vec<Hop>>,
}

impl Routes {
    /// Up*/down* routes for `topo`.
    pub fn up_down(topo: &Topology) -> Routes {
        let rank = rank(topo);
        let switches = topo.switches().len();
        // For each source switch, the shortest legal path to every switch.
        let between: Vec<Vec<Vec<Hop>>> = (0..switches)
            .map(|s| shortest_legal(topo, &rank, s))
            .collect();
        let nodes = topo.nodes();
        let mut paths = Vec::with_capacity((nodes * nodes) as usize);
        for src in 0..nodes {
            let (sl, ss) = topo.attachment(src);
            for dst in 0..nodes {
                if src == dst {
                    paths.push(Vec::new());
                    continue;
                }
                let (dl, ds) = topo.attachment(dst);
                let mut p = vec![hop_from_node(topo, sl)];
                p.extend_from_slice(&between[ss][ds]);
                p.push(hop_to_node(topo, dl));
                paths.push(p);
            }
        }
        Routes { nodes, paths }
    }

    /// The hops from node `src` to node `dst` (empty for a node to
    /// itself, which never leaves its port).
    pub fn path(&self, src: u32, dst: u32) -> &[Hop] {
        &self.paths[(src * self.nodes + dst) as usize]
    }

    /// Number of nodes.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }
}

/// Each switch's (BFS level from switch 0, index): a hop to a lower rank
/// goes up.
fn rank(topo: &Topology) -> Vec<(usize, usize)> {
    let n = topo.switches().len();
    let mut level = vec![usize::MAX; n];
    level[0] = 0;
    let mut q = VecDeque::from([0]);
    while let Some(s) = q.pop_front() {
        for (_, from, to) in topo.switch_hops() {
            if from == s && level[to] == usize::MAX {
                level[to] = level[s] + 1;
                q.push_back(to);
            }
        }
    }
    (0..n).map(|s| (level[s], s)).collect()
}

/// Shortest legal (up* then down*) hops from switch `src` to each switch.
fn shortest_legal(topo: &Topology, rank: &[(usize, usize)], src: usize) -> Vec<Vec<Hop>> {
    let n = topo.switches().len();
    // State: (switch, gone down yet). Predecessor: (state, hop).
    let idx = |s: usize, down: bool| s * 2 + usize::from(down);
    let mut prev: Vec<Option<(usize, Hop)>> = vec![None; n * 2];
    let mut seen = vec![false; n * 2];
    seen[idx(src, false)] = true;
    let mut q = VecDeque::from([(src, false)]);
    let hops: Vec<(usize, usize, usize)> = topo.switch_hops().collect();
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
                let forward = topo.links()[link].a == crate::fabric::topology::End::Switch(from);
                prev[idx(next.0, next.1)] = Some((idx(s, down), Hop { link, forward }));
                q.push_back(next);
            }
        }
    }
    (0..n)
        .map(|dst| {
            // The switch graph is connected, and up* alone reaches the root
            // from anywhere and down* the rest, so one state is reached.
            let end = [idx(dst, false), idx(dst, true)]
                .into_iter()
                .filter(|&i| seen[i])
                .min_by_key(|&i| walk(&prev, i).len())
                .unwrap_or(idx(src, false));
            let mut p = walk(&prev, end);
            p.reverse();
            p
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

fn hop_from_node(topo: &Topology, link: usize) -> Hop {
    let forward = matches!(topo.links()[link].a, crate::fabric::topology::End::Node(_));
    Hop { link, forward }
}

fn hop_to_node(topo: &Topology, link: usize) -> Hop {
    let forward = matches!(topo.links()[link].b, crate::fabric::topology::End::Node(_));
    Hop { link, forward }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::topology::{End, Link, LinkParams};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn link(a: End, b: End) -> Link {
        Link {
            a,
            b,
            params: LinkParams::default(),
        }
    }

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

    /// A ring of four switches, one node on each.
    fn ring() -> Topology {
        let mut links: Vec<Link> = (0..4)
            .map(|s| link(End::Switch(s), End::Switch((s + 1) % 4)))
            .collect();
        links.extend((0..4).map(|n| link(End::Node(n), End::Switch(n as usize))));
        Topology::new(4, (0..4).map(|s| format!("s{s}")).collect(), links).unwrap()
    }

    /// Every route of `r` in `topo`: node to node, each hop leaving the
    /// end the previous one reached.
    fn assert_connected_routes(topo: &Topology, r: &Routes) {
        for src in 0..topo.nodes() {
            for dst in 0..topo.nodes() {
                let p = r.path(src, dst);
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
            }
        }
    }

    #[test]
    fn a_ring_routes_without_a_dependency_cycle() {
        let t = ring();
        let r = Routes::up_down(&t);
        assert_connected_routes(&t, &r);
        let all: Vec<Vec<Hop>> = (0..4)
            .flat_map(|s| (0..4).map(move |d| (s, d)))
            .map(|(s, d)| r.path(s, d).to_vec())
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
        let r = Routes::up_down(&t);
        assert_connected_routes(&t, &r);
        assert_eq!(r.path(0, 2).len(), 2);
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
            // A random spanning tree, then random extra (even parallel) links.
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
            let t = Topology::new(hosts.len() as u32, names, links).unwrap();
            let r = Routes::up_down(&t);
            assert_connected_routes(&t, &r);
            let rank = rank(&t);
            let mut all = Vec::new();
            for s in 0..t.nodes() {
                for d in 0..t.nodes() {
                    let p = r.path(s, d).to_vec();
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
