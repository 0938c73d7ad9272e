//! `ulnic fabric bench`: which benchmark, its options, and its table
//! (one per benchmark) or JSON lines. The benchmarks are in
//! `crate::bench::fabric`.

use crate::bench::am::{self as am_bench, AmHotspotResult, AmLogPResult, HotspotFigure};
use crate::bench::fabric::{
    self as fabric_bench, DrainResult, HotspotResult, LinkCase, LinkResult, LogPResult,
    PermutationResult, Sweep, SweepResult,
};
use crate::bench::plot;
use crate::print::{outln, positive_secs, print_json_lines};

/// The fabric benchmarks.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricBenchKind {
    /// Achieved against configured bandwidth and latency of a link.
    Link,
    /// N clients send one-way messages to one server endpoint.
    Hotspot,
    /// Ping-pong and stream across 1, 2 and 3 switches.
    Hops,
    /// Throughput and round trip against packet loss.
    Loss,
    /// The transport's cost: no fabric (no transport) against an ideal
    /// fabric with the transport.
    Reliability,
    /// The engine alone, with 1 and 2 (or --engine-threads) threads.
    Drain,
    /// LogP (o_s, o_r, g, L) of one-way 8-byte messages, without a fabric
    /// and with an ideal one (VN Fig. 5's parameters; VN measures Active
    /// Message requests and replies).
    Logp,
    /// VN Table 1: four streams at once between neighbours, then across
    /// the bisection of two switches.
    Permutation,
    /// VN Fig. 5: LogP of a 4-word Active Message request and its reply
    /// (`ulnic::am`), without a fabric and with an ideal one.
    AmLogp,
    /// VN Fig. 7: N clients send 4-word AM requests, each answered with
    /// a 4-word reply, to one server endpoint: aggregate and per-client
    /// rates.
    AmHotspot,
    /// VN Fig. 8: as am-hotspot with 1 KB bulk requests into the server's
    /// region: aggregate and per-client bandwidth.
    AmBulk,
    /// VN Fig. 9: the round trip clients see under am-hotspot's load,
    /// against N.
    AmRtt,
}

/// `fabric bench`'s options.
#[derive(clap::Args, Debug)]
pub struct FabricBenchArgs {
    /// Which benchmark.
    #[arg(value_enum)]
    pub which: FabricBenchKind,
    /// link: the links to measure, as GBPS:LATENCY_US pairs.
    #[arg(long, value_delimiter = ',', default_value = "1:10,10:5")]
    pub link: Vec<String>,
    /// link, am-logp: interleaved rounds (ideal link, measured link, ...;
    /// no fabric, ideal fabric, ...).
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// link: round trips per ping-pong measurement.
    #[arg(long, default_value_t = 2000)]
    pub iters: usize,
    /// drain: engine threads to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub engine_threads: Vec<u32>,
    /// drain: messages per pair of nodes (two pairs; at most 32000).
    #[arg(long, default_value_t = 30_000)]
    pub messages: u32,
    /// hotspot: numbers of clients to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub clients: Vec<u32>,
    /// Seconds each stream (link) or each N (hotspot) runs, after a
    /// warm-up of a fifth of that.
    #[arg(long, default_value_t = 0.5)]
    pub seconds: f64,
    /// Print one JSON object per result.
    #[arg(long)]
    pub json: bool,
    /// am-logp, am-hotspot, am-bulk, am-rtt: also draw VN's figure into
    /// this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

/// Runs `fabric bench WHICH`.
pub fn run(a: FabricBenchArgs) -> anyhow::Result<()> {
    let span = positive_secs(Some(a.seconds), "--seconds")?.unwrap_or_default();
    let json = a.json;
    let mut say = |l: &str| {
        if !json {
            eprintln!("{l}")
        }
    };
    let am = matches!(
        a.which,
        FabricBenchKind::AmLogp
            | FabricBenchKind::AmHotspot
            | FabricBenchKind::AmBulk
            | FabricBenchKind::AmRtt
    );
    anyhow::ensure!(
        a.plot.is_none() || am,
        "--plot draws VN's Active Message figures: am-logp, am-hotspot, am-bulk, am-rtt"
    );
    match a.which {
        FabricBenchKind::AmLogp => {
            let results = am_bench::logp(a.rounds, a.iters, span, &mut say)?;
            if let Some(p) = &a.plot {
                plot::logp(p, &results)?;
                say(&format!("figure written to {}", p.display()));
            }
            show(&results, json, am_logp_table)
        }
        FabricBenchKind::AmHotspot | FabricBenchKind::AmBulk | FabricBenchKind::AmRtt => {
            let figure = match a.which {
                FabricBenchKind::AmBulk => HotspotFigure::Bulk,
                FabricBenchKind::AmRtt => HotspotFigure::Rtt,
                _ => HotspotFigure::Rate,
            };
            let results = am_bench::hotspot(figure, &a.clients, span, &mut say)?;
            if let Some(p) = &a.plot {
                plot::hotspot(p, figure, &results)?;
                say(&format!("figure written to {}", p.display()));
            }
            show(&results, json, |r| am_hotspot_table(figure, r))
        }
        FabricBenchKind::Link => {
            let cases = parse_links(&a.link)?;
            anyhow::ensure!(
                a.rounds >= 1 && a.iters >= 10,
                "--rounds >= 1 and --iters >= 10"
            );
            let results = fabric_bench::link(&cases, a.rounds, a.iters, span, &mut say)?;
            show(&results, json, |r| link_table(r, a.rounds))
        }
        FabricBenchKind::Hotspot => show(
            &fabric_bench::hotspot(&a.clients, span, &mut say)?,
            json,
            hotspot_table,
        ),
        FabricBenchKind::Permutation => show(
            &fabric_bench::permutations(span, &mut say)?,
            json,
            permutation_table,
        ),
        FabricBenchKind::Logp => show(
            &fabric_bench::logp(a.iters, span, &mut say)?,
            json,
            logp_table,
        ),
        FabricBenchKind::Drain => {
            let results = fabric_bench::drain(&a.engine_threads, a.messages, a.rounds, &mut say)?;
            show(&results, json, |r| drain_table(r, a.rounds))
        }
        FabricBenchKind::Hops | FabricBenchKind::Loss | FabricBenchKind::Reliability => {
            let which = match a.which {
                FabricBenchKind::Hops => Sweep::Hops,
                FabricBenchKind::Loss => Sweep::Loss,
                _ => Sweep::Reliability,
            };
            show(
                &fabric_bench::sweep(which, a.iters, span, &mut say)?,
                json,
                sweep_table,
            )
        }
    }
}

/// Prints a benchmark's results: one JSON object per line with `json`,
/// else its table.
fn show<T: serde::Serialize>(
    results: &[T],
    json: bool,
    table: impl FnOnce(&[T]) -> String,
) -> anyhow::Result<()> {
    if json {
        return print_json_lines(results);
    }
    print!("{}", table(results));
    Ok(())
}

/// `--link GBPS:LATENCY_US,...`.
fn parse_links(links: &[String]) -> anyhow::Result<Vec<LinkCase>> {
    links
        .iter()
        .map(|c| {
            let (g, l) = c
                .split_once(':')
                .and_then(|(g, l)| Some((g.parse().ok()?, l.parse().ok()?)))
                .ok_or_else(|| {
                    anyhow::anyhow!("--link takes GBPS:LATENCY_US, e.g. 1:10; got {c}")
                })?;
            Ok(LinkCase {
                gbps: g,
                latency_us: l,
            })
        })
        .collect()
}

/// `link`: configured against achieved bandwidth and latency.
fn link_table(results: &[LinkResult], rounds: u32) -> String {
    let mut out = String::new();
    outln!(
        out,
        "link accuracy ({} interleaved rounds, medians; payloads not touched)",
        rounds
    );
    outln!(
        out,
        "{:>10} {:>10} {:>7} {:>10} | {:>12} {:>12} {:>7} | {:>10} {:>9} {:>9}",
        "Gb/s set",
        "achieved",
        "ratio",
        "MB/s",
        "one-way set",
        "achieved",
        "ratio",
        "app sees",
        "RTT ideal",
        "RTT link"
    );
    for r in results {
        outln!(
            out,
            "{:>10.3} {:>10.3} {:>7.3} {:>10.1} | {:>10.2}us {:>10.2}us {:>7.3} | {:>8.2}us {:>7.2}us {:>7.2}us",
            r.configured_gbps,
            r.achieved_gbps,
            r.bandwidth_ratio,
            r.payload_mbytes_per_s,
            r.configured_one_way_us,
            r.achieved_one_way_us,
            r.latency_ratio,
            r.app_one_way_us,
            r.ideal_rtt_us,
            r.link_rtt_us
        );
    }
    out
}

/// `am-logp`: VN Fig. 5's parameters per case.
fn am_logp_table(results: &[AmLogPResult]) -> String {
    let mut t = String::from(
        "VN Fig. 5: LogP of a 4-word Active Message request and reply (ulnic::am), microseconds\n",
    );
    outln!(
        t,
        "{:<14} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "case",
        "o_s",
        "o_r",
        "g",
        "L",
        "RTT",
        "RTT p95"
    );
    for r in results {
        outln!(
            t,
            "{:<14} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>9.2}",
            r.case,
            r.o_s_us,
            r.o_r_us,
            r.g_us,
            r.l_us,
            r.rtt_us,
            r.rtt_p95_us
        );
    }
    t
}

/// `am-hotspot`, `am-bulk`, `am-rtt`: one line per N.
fn am_hotspot_table(figure: HotspotFigure, results: &[AmHotspotResult]) -> String {
    let head = match figure {
        HotspotFigure::Rate => "VN Fig. 7: 4-word requests and replies to one server endpoint",
        HotspotFigure::Bulk => "VN Fig. 8: 1 KB bulk requests, 4-word replies, one server endpoint",
        HotspotFigure::Rtt => "VN Fig. 9: round trip against clients (Fig. 7's load)",
    };
    let mut t = format!("{head}\n");
    outln!(
        t,
        "{:>7} {:>12} {:>9} {:>12} {:>9} {:>9} {:>6} {:>9} {:>9}",
        "clients",
        "aggregate/s",
        "MB/s",
        "per client/s",
        "min*N",
        "max*N",
        "jain",
        "RTT us",
        "p95 us"
    );
    for r in results {
        outln!(
            t,
            "{:>7} {:>12.0} {:>9.2} {:>12.0} {:>9.2} {:>9.2} {:>6.3} {:>9.1} {:>9.1}",
            r.clients,
            r.aggregate_per_s,
            r.aggregate_mbytes_per_s,
            r.aggregate_per_s / f64::from(r.clients.max(1)),
            r.min_share_x_n,
            r.max_share_x_n,
            r.jain,
            r.rtt_median_us,
            r.rtt_p95_us
        );
    }
    t
}

/// `hotspot`: the aggregate and the spread of the shares per N, then
/// every client's share at the largest N.
fn hotspot_table(results: &[HotspotResult]) -> String {
    let mut out = String::new();
    outln!(
        out,
        "hot spot: N clients send one-way 8-byte messages to one server endpoint"
    );
    outln!(
        out,
        "{:>8} {:>14} {:>12} {:>12} {:>8}",
        "clients",
        "aggregate/s",
        "min share*N",
        "max share*N",
        "Jain"
    );
    for r in results {
        outln!(
            out,
            "{:>8} {:>14.0} {:>12.3} {:>12.3} {:>8.4}",
            r.clients,
            r.aggregate_per_s,
            r.min_share_x_n,
            r.max_share_x_n,
            r.jain
        );
    }
    let Some(r) = results.iter().max_by_key(|r| r.clients) else {
        return out;
    };
    if r.clients < 2 {
        return out;
    }
    outln!(out, "per-client shares with {} clients (%):", r.clients);
    for (i, chunk) in r.shares.chunks(8).enumerate() {
        let cells: Vec<String> = chunk.iter().map(|s| format!("{:6.3}", s * 100.0)).collect();
        outln!(
            out,
            "  clients {:>3}-{:<3} {}",
            i * 8 + 1,
            i * 8 + chunk.len(),
            cells.join(" ")
        );
    }
    out
}

/// `permutation`: aggregate and per-stream rates per pattern.
fn permutation_table(results: &[PermutationResult]) -> String {
    let mut out = String::new();
    outln!(out, "permutations (VN Table 1): 8 nodes, 4 per switch, 1 Gb/s 2 us links, one trunk; four 64 KiB streams");
    outln!(
        out,
        "{:<11} {:>16} {:>40}",
        "pattern",
        "aggregate MB/s",
        "per stream MB/s"
    );
    for r in results {
        let per: Vec<String> = r
            .per_stream_mbytes_per_s
            .iter()
            .map(|x| format!("{x:.1}"))
            .collect();
        outln!(
            out,
            "{:<11} {:>16.1} {:>40}",
            r.pattern,
            r.aggregate_mbytes_per_s,
            per.join(" ")
        );
    }
    out
}

/// `logp`: the LogP parameters per case.
fn logp_table(results: &[LogPResult]) -> String {
    let mut out = String::new();
    outln!(
        out,
        "LogP of one-way 8-byte messages (VN Fig. 5's parameters; RTT = 2 (o_s + o_r + L)), microseconds"
    );
    outln!(
        out,
        "{:<14} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "case",
        "o_s",
        "o_r",
        "g",
        "L",
        "RTT"
    );
    for r in results {
        outln!(
            out,
            "{:<14} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            r.case,
            r.o_s_us,
            r.o_r_us,
            r.g_us,
            r.l_us,
            r.rtt_us
        );
    }
    out
}

/// `drain`: the engine's rate per thread count.
fn drain_table(results: &[DrainResult], rounds: u32) -> String {
    let mut out = String::new();
    outln!(
        out,
        "drain: the engine alone, {} messages, {} interleaved rounds (medians)",
        results.first().map_or(0, |r| r.messages),
        rounds
    );
    outln!(
        out,
        "{:>8} {:>14} {:>10} {:>14}",
        "threads",
        "messages/s",
        "speed-up",
        "CPU ns/msg"
    );
    for r in results {
        outln!(
            out,
            "{:>8} {:>14.0} {:>9.2}x {:>14.0}",
            r.engine_threads,
            r.messages_per_s,
            r.speedup,
            r.cpu_ns_per_message
        );
    }
    outln!(
        out,
        "(speed-up: median of each round's ratio to the first thread count)"
    );
    out
}

/// `hops`, `loss`, `reliability`: round trips and streams per case.
fn sweep_table(results: &[SweepResult]) -> String {
    let mut out = String::new();
    if let Some(r) = results.first() {
        outln!(out, "{}: {} (payloads not touched)", r.bench, r.after);
    }
    outln!(
        out,
        "{:<40} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10} {:>9} {:>8}",
        "case",
        "RTT p50",
        "RTT p95",
        "stream MB/s",
        "of (1-l)R",
        "packets",
        "retrans",
        "timeouts",
        "NACKs"
    );
    for r in results {
        outln!(
            out,
            "{:<40} {:>8.2}us {:>8.2}us {:>12.1} {:>10} {:>10} {:>10} {:>9} {:>8}",
            r.case,
            r.rtt_median_us,
            r.rtt_p95_us,
            r.stream_mbytes_per_s,
            r.of_lossy_link_rate
                .map_or("-".to_string(), |x| format!("{:.1} %", x * 100.0)),
            r.data_packets,
            r.retransmissions,
            r.timeouts,
            r.nacks
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};
    use crate::commands::fabric::FabricCmd;

    fn parse(args: &[&str]) -> Result<FabricBenchArgs, clap::Error> {
        let mut all = vec!["fabric", "bench"];
        all.extend_from_slice(args);
        match try_parse(&all)? {
            Cmd::Fabric(FabricCmd::Bench(a)) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let a = parse(&["link"]).unwrap();
        assert_eq!(a.which, FabricBenchKind::Link);
        assert_eq!(a.link, ["1:10", "10:5"]);
        assert_eq!((a.rounds, a.iters, a.messages), (5, 2000, 30_000));
        assert_eq!(a.engine_threads, [1, 2]);
        assert_eq!(a.clients, [1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(a.seconds, 0.5);
        assert!(!a.json);
    }

    #[test]
    fn kinds_and_lists() {
        for (name, kind) in [
            ("hotspot", FabricBenchKind::Hotspot),
            ("hops", FabricBenchKind::Hops),
            ("loss", FabricBenchKind::Loss),
            ("reliability", FabricBenchKind::Reliability),
            ("drain", FabricBenchKind::Drain),
            ("logp", FabricBenchKind::Logp),
            ("permutation", FabricBenchKind::Permutation),
            ("am-logp", FabricBenchKind::AmLogp),
            ("am-hotspot", FabricBenchKind::AmHotspot),
            ("am-bulk", FabricBenchKind::AmBulk),
            ("am-rtt", FabricBenchKind::AmRtt),
        ] {
            assert_eq!(parse(&[name]).unwrap().which, kind);
        }
        let a = parse(&["hotspot", "--clients", "1,4,16,64", "--json"]).unwrap();
        assert_eq!(a.clients, [1, 4, 16, 64]);
        assert!(a.json);
        let a = parse(&["drain", "--engine-threads", "1,2,4"]).unwrap();
        assert_eq!(a.engine_threads, [1, 2, 4]);
        let e = parse(&["bisection"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
        let e = parse(&["drain", "--engine-threads", "1,two"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn links_are_gbps_colon_latency() {
        let a = parse(&["link", "--link", "1:10,2.5:0.5"]).unwrap();
        let cases = parse_links(&a.link).unwrap();
        assert_eq!(
            cases
                .iter()
                .map(|c| (c.gbps, c.latency_us))
                .collect::<Vec<_>>(),
            [(1.0, 10.0), (2.5, 0.5)]
        );
        for bad in ["10", "x:1", "1:", "1:2:3"] {
            assert_eq!(
                parse_links(&[bad.to_string()]).unwrap_err().to_string(),
                format!("--link takes GBPS:LATENCY_US, e.g. 1:10; got {bad}")
            );
        }
    }

    #[test]
    fn the_link_table() {
        let r = LinkResult {
            bench: "fabric-link",
            configured_gbps: 1.0,
            achieved_gbps: 0.987_6,
            bandwidth_ratio: 0.987_6,
            payload_mbytes_per_s: 120.25,
            configured_one_way_us: 10.0,
            achieved_one_way_us: 10.4,
            latency_ratio: 1.04,
            app_one_way_us: 11.0,
            ideal_rtt_us: 3.5,
            link_rtt_us: 25.5,
            rounds: 5,
            payload: "none",
        };
        assert_eq!(
            link_table(&[r], 5),
            "link accuracy (5 interleaved rounds, medians; payloads not touched)\n  \
             Gb/s set   achieved   ratio       MB/s |  one-way set     achieved   ratio |   app sees RTT ideal  RTT link\n     \
             1.000      0.988   0.988      120.2 |      10.00us      10.40us   1.040 |    11.00us    3.50us   25.50us\n"
        );
    }

    fn hotspot(clients: u32) -> HotspotResult {
        HotspotResult {
            bench: "fabric-hotspot",
            clients,
            aggregate_per_s: 1_000_000.0,
            shares: vec![1.0 / f64::from(clients); clients as usize],
            min_share_x_n: 0.95,
            max_share_x_n: 1.05,
            jain: 0.99876,
            seconds: 0.5,
        }
    }

    #[test]
    fn the_hotspot_table() {
        let t = hotspot_table(&[hotspot(1), hotspot(10)]);
        assert_eq!(
            t,
            "hot spot: N clients send one-way 8-byte messages to one server endpoint\n \
             clients    aggregate/s  min share*N  max share*N     Jain\n       \
             1        1000000        0.950        1.050   0.9988\n      \
             10        1000000        0.950        1.050   0.9988\n\
             per-client shares with 10 clients (%):\n  \
             clients   1-8   10.000 10.000 10.000 10.000 10.000 10.000 10.000 10.000\n  \
             clients   9-10  10.000 10.000\n"
        );
        // One client: no shares to show.
        assert!(!hotspot_table(&[hotspot(1)]).contains("per-client"));
        assert_eq!(hotspot_table(&[]).lines().count(), 2);
    }

    #[test]
    fn the_drain_table() {
        let r = |threads, rate, speedup| DrainResult {
            bench: "fabric-drain",
            engine_threads: threads,
            messages: 60_000,
            messages_per_s: rate,
            rounds: vec![],
            cpu_ns_per_message: 250.4,
            speedup,
        };
        assert_eq!(
            drain_table(&[r(1, 2_000_000.0, 1.0), r(2, 3_500_000.0, 1.75)], 3),
            "drain: the engine alone, 60000 messages, 3 interleaved rounds (medians)\n \
             threads     messages/s   speed-up     CPU ns/msg\n       \
             1        2000000      1.00x            250\n       \
             2        3500000      1.75x            250\n\
             (speed-up: median of each round's ratio to the first thread count)\n"
        );
    }

    #[test]
    fn the_sweep_table() {
        let r = SweepResult {
            bench: "fabric-loss",
            after: "VMMC-2",
            case: "1 % loss".into(),
            rtt_median_us: 12.345,
            rtt_p95_us: 20.0,
            stream_mbytes_per_s: 800.06,
            of_lossy_link_rate: Some(0.8081),
            data_packets: 9000,
            retransmissions: 12,
            timeouts: 0,
            nacks: 3,
            room_asks: 5,
            payload: "none",
        };
        let t = sweep_table(&[r]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "fabric-loss: VMMC-2 (payloads not touched)");
        assert_eq!(
            lines[2],
            "1 % loss                                    12.35us    20.00us        800.1     80.8 %       9000         12         0        3"
        );
        // No results: the header alone.
        assert_eq!(sweep_table(&[]).lines().count(), 1);
    }

    #[test]
    fn the_logp_and_permutation_tables() {
        let l = LogPResult {
            bench: "fabric-logp",
            case: "ideal fabric".into(),
            o_s_us: 1.0,
            o_r_us: 2.0,
            g_us: 0.5,
            l_us: 3.25,
            rtt_us: 12.5,
        };
        assert_eq!(
            logp_table(&[l]).lines().nth(2),
            Some("ideal fabric       1.00     2.00     0.50     3.25    12.50")
        );
        let p = PermutationResult {
            bench: "fabric-permutation",
            pattern: "bisection".into(),
            pairs: vec![(0, 4), (1, 5)],
            aggregate_mbytes_per_s: 230.04,
            per_stream_mbytes_per_s: vec![115.0, 115.04],
            seconds: 0.5,
        };
        assert_eq!(
            permutation_table(&[p]).lines().nth(2),
            Some("bisection              230.0                              115.0 115.0")
        );
    }
}
