//! `ulnic stats`: a running device's counters through its control socket
//! (per node and endpoint, and with a fabric per link, per switch and the
//! transport's per node), as a table or the device's JSON object, once or
//! every --watch seconds.

use std::path::PathBuf;

use crate::control::{Client, Request, Stats};
use crate::print::{outln, positive_secs};

/// `ulnic stats`' options.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// The device's socket directory (as given to `ulnic device --socket-dir`),
    /// or a cluster's directory (the `dir` of `ulnic cluster status --json`):
    /// its supervisor answers for the device it runs.
    #[arg(long, value_name = "DIR")]
    pub device: PathBuf,
    /// With a fabric spread over devices: which member's counters.
    #[arg(long, value_name = "NAME")]
    pub member: Option<String>,
    /// Print again every SECS seconds, until interrupted.
    #[arg(long, value_name = "SECS")]
    pub watch: Option<f64>,
    /// One JSON object (per print).
    #[arg(long)]
    pub json: bool,
}

/// Runs `ulnic stats`.
pub fn run(a: StatsArgs) -> anyhow::Result<()> {
    let every = positive_secs(a.watch, "--watch")?;
    let mut c = Client::connect(&a.device, a.member.as_deref())?;
    loop {
        c.send(&Request::Stats)?;
        let line = c.checked_line()?;
        if a.json {
            println!("{line}");
        } else {
            let s: Stats = serde_json::from_str(&line)?;
            print!("{}", print_stats(&s));
        }
        match every {
            Some(d) => std::thread::sleep(d),
            None => return Ok(()),
        }
    }
}

/// The table `ulnic stats` prints: nodes, endpoints, links and switches
/// (with a fabric), UDP (spanning fabric), totals.
pub fn print_stats(s: &Stats) -> String {
    let mut out = String::new();
    let get = |m: &std::collections::BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    outln!(out, "nodes:");
    outln!(
        out,
        "  {:>4} {:>9} {:>3} {:>12} {:>12} {:>10} {:>10} {:>8} {:>8}",
        "node",
        "attached",
        "eps",
        "tx msgs",
        "rx msgs",
        "tx errors",
        "retrans",
        "timeouts",
        "returned"
    );
    for n in &s.nodes {
        let (mut tx, mut rx, mut err) = (0, 0, 0);
        for e in &n.endpoints {
            tx += get(&e.counters, "tx_messages");
            rx += get(&e.counters, "rx_messages");
            err += get(&e.counters, "tx_errors");
        }
        let t = n.transport.clone().unwrap_or_default();
        outln!(
            out,
            "  {:>4} {:>9} {:>3} {:>12} {:>12} {:>10} {:>10} {:>8} {:>8}",
            n.node,
            if n.attached { "yes" } else { "no" },
            n.endpoints.len(),
            tx,
            rx,
            err,
            get(&t, "retransmissions"),
            get(&t, "timeouts"),
            get(&t, "returned")
        );
    }
    let eps: Vec<_> = s
        .nodes
        .iter()
        .flat_map(|n| n.endpoints.iter().map(move |e| (n.node, e)))
        .collect();
    if !eps.is_empty() {
        outln!(out, "endpoints:");
        outln!(
            out,
            "  {:>4} {:>4} {:>6} {:>12} {:>14} {:>12} {:>14} {:>9} {:>7}",
            "node",
            "ep",
            "port",
            "tx msgs",
            "tx bytes",
            "rx msgs",
            "rx bytes",
            "no buffer",
            "flight"
        );
        for (n, e) in eps {
            outln!(
                out,
                "  {:>4} {:>4} {:>6} {:>12} {:>14} {:>12} {:>14} {:>9} {:>7}",
                n,
                e.id,
                e.port.map_or("-".to_string(), |p| p.to_string()),
                get(&e.counters, "tx_messages"),
                get(&e.counters, "tx_bytes"),
                get(&e.counters, "rx_messages"),
                get(&e.counters, "rx_bytes"),
                get(&e.counters, "rx_dropped_no_buffer"),
                e.in_flight
            );
        }
    }
    if !s.links.is_empty() {
        outln!(
            out,
            "links (each direction: packets, bytes, dropped, crc errors, stalls):"
        );
        for l in &s.links {
            let d = |m: &std::collections::BTreeMap<String, u64>| {
                format!(
                    "{:>10} {:>13} {:>8} {:>6} {:>8}",
                    get(m, "packets"),
                    get(m, "bytes"),
                    get(m, "dropped") + get(m, "dropped_down"),
                    get(m, "crc_errors"),
                    get(m, "stalls")
                )
            };
            let state = if l.faults.down { " DOWN" } else { "" };
            outln!(out, "  {:>3} {:<14}{state}", l.link, l.name);
            outln!(out, "        -> {}", d(&l.directions[0]));
            outln!(out, "        <- {}", d(&l.directions[1]));
        }
        outln!(out, "switches:");
        for w in &s.switches {
            outln!(
                out,
                "  {:<14} forwarded {:>12}  misrouted {}",
                w.name,
                w.forwarded,
                w.misrouted
            );
        }
    }
    if let Some(u) = &s.udp {
        outln!(out,
            "udp: sent {}, received {}, rejected: not a member {}, bad MAC {}, malformed {}; overflow {}",
            get(u, "sent"),
            get(u, "received"),
            get(u, "rejected_sender"),
            get(u, "rejected_mac"),
            get(u, "rejected_malformed"),
            get(u, "overflow")
        );
    }
    outln!(
        out,
        "totals: delivered {}, returned {}, notifications {}",
        get(&s.totals, "delivered"),
        get(&s.totals, "returned"),
        get(&s.totals, "notifications")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};

    #[test]
    fn options() {
        let Cmd::Stats(a) = try_parse(&["stats", "--device", "/tmp/u"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.device, PathBuf::from("/tmp/u"));
        assert_eq!((a.member, a.watch, a.json), (None, None, false));
        let Cmd::Stats(a) = try_parse(&[
            "stats", "--device", "/d", "--watch", "0.5", "--member", "d1", "--json",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            (a.member.as_deref(), a.watch, a.json),
            (Some("d1"), Some(0.5), true)
        );
        let e = try_parse(&["stats"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let e = try_parse(&["stats", "--device", "/d", "--watch", "soon"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
    }

    /// A device without a fabric: nodes and endpoints, then the totals.
    #[test]
    fn the_table_without_a_fabric() {
        let s: Stats = serde_json::from_value(serde_json::json!({
            "schema": 1,
            "nodes": [
                {"node": 0, "attached": true, "connections": 1, "queue_errors": 0,
                 "memory_faults": 0, "transport": null,
                 "endpoints": [
                    {"id": 0, "port": 5, "in_flight": 2,
                     "counters": {"tx_messages": 10, "tx_bytes": 640, "rx_messages": 3,
                                  "rx_bytes": 24, "tx_errors": 1}},
                    {"id": 1, "port": null, "in_flight": 0,
                     "counters": {"rx_dropped_no_buffer": 4}}]},
                {"node": 1, "attached": false, "connections": 0, "queue_errors": 0,
                 "memory_faults": 0, "transport": null, "endpoints": []}],
            "totals": {"delivered": 13, "notifications": 2},
            "links": [],
            "switches": []
        }))
        .unwrap();
        assert_eq!(
            print_stats(&s),
            "nodes:\n\
             \x20 node  attached eps      tx msgs      rx msgs  tx errors    retrans timeouts returned\n\
             \x20    0       yes   2           10            3          1          0        0        0\n\
             \x20    1        no   0            0            0          0          0        0        0\n\
             endpoints:\n\
             \x20 node   ep   port      tx msgs       tx bytes      rx msgs       rx bytes no buffer  flight\n\
             \x20    0    0      5           10            640            3             24         0       2\n\
             \x20    0    1      -            0              0            0              0         4       0\n\
             totals: delivered 13, returned 0, notifications 2\n"
        );
    }

    /// With a fabric: the transport per node, links both ways, switches,
    /// and the UDP counters of a spanning fabric.
    #[test]
    fn the_table_with_a_fabric() {
        let s: Stats = serde_json::from_value(serde_json::json!({
            "nodes": [
                {"node": 0, "attached": true, "connections": 1, "queue_errors": 0,
                 "memory_faults": 0,
                 "transport": {"retransmissions": 7, "timeouts": 1, "returned": 2},
                 "endpoints": []}],
            "totals": {"delivered": 5, "returned": 2, "notifications": 0},
            "links": [
                {"link": 0, "name": "node 0", "faults": {"down": true},
                 "directions": [
                    {"packets": 100, "bytes": 6400, "dropped": 3, "dropped_down": 2,
                     "crc_errors": 1, "stalls": 4},
                    {}]}],
            "switches": [{"name": "left", "forwarded": 100, "misrouted": 0}],
            "udp": {"sent": 9, "received": 8, "rejected_mac": 1}
        }))
        .unwrap();
        let t = print_stats(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[2],
            "     0       yes   0            0            0          0          7        1        2"
        );
        assert_eq!(
            lines[3..],
            [
                "links (each direction: packets, bytes, dropped, crc errors, stalls):",
                "    0 node 0         DOWN",
                "        ->        100          6400        5      1        4",
                "        <-          0             0        0      0        0",
                "switches:",
                "  left           forwarded          100  misrouted 0",
                "udp: sent 9, received 8, rejected: not a member 0, bad MAC 1, malformed 0; overflow 0",
                "totals: delivered 5, returned 2, notifications 0",
            ]
        );
    }
}
