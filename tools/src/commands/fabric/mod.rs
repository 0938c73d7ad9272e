//! `ulnic fabric`: topology files and their routes (`routes`), the
//! reliable transport's self-test (`selftest`), a running device's link
//! faults (`set`) and map (`map`), the device processes of a fabric
//! spread over machines (`up`, `down`), and the fabric benchmarks
//! (`bench`, in the child module). The work is done in `crate::fabric`,
//! `crate::control` and `crate::bench::fabric`; here are the options and
//! what is printed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::commands::ExitStatus;
use crate::control::{Client, FaultSpec, MapReport, Request};
use crate::fabric::file::RouteLine;
use crate::fabric::launch::{self, Member};
use crate::fabric::selftest::Report;
use crate::print::outln;

pub mod bench;

/// `ulnic fabric`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum FabricCmd {
    /// Read a topology file (docs/spec.md §10.1), check it, and print the
    /// route every node takes to every other: up*/down* routes, free of
    /// deadlock on any connected topology.
    ///
    /// Examples:
    ///   ulnic fabric routes --topology two-switches.toml
    ///   ulnic fabric routes --topology two-switches.toml --json
    #[command(verbatim_doc_comment)]
    Routes {
        /// The topology file (TOML).
        #[arg(long, value_name = "FILE")]
        topology: PathBuf,
        /// Print one JSON object per route.
        #[arg(long)]
        json: bool,
    },
    /// Check the fabric's reliable transport end to end: start a device
    /// whose links drop, corrupt, duplicate and reorder packets (each link's
    /// faults drawn from a seeded generator: --seed), attach one host
    /// process per node, have
    /// every node send numbered messages to every other, and count what
    /// arrives. With the transport working, lost, duplicated and
    /// out_of_order are 0 and delivered equals sent. Exits 1 otherwise.
    ///
    /// Examples:
    ///   ulnic fabric selftest --nodes 4 --messages 100000 --drop 0.05 --corrupt 0.01 \
    ///       --duplicate 0.01 --reorder 0.05 --seed 7
    ///   ulnic fabric selftest --nodes 4 --messages 20000 --partition-ms 50:200 --json
    ///   ulnic fabric selftest --topology docs/topologies/two-switches.toml --nodes 8 --drop 0.01
    #[command(verbatim_doc_comment)]
    Selftest(SelftestArgs),
    /// Benchmark the emulated fabric, on a device started in this process
    /// with host-attached nodes.
    ///
    /// link: is a link what it was configured to be? Its one-way latency
    /// (half the median ping-pong difference against an ideal link, in
    /// interleaved rounds) and the rate bytes leave on it while 64 KiB
    /// messages stream over it, against the configured values.
    ///
    /// hotspot: N clients send one-way 8-byte messages to one server
    /// endpoint; the aggregate rate and every client's share as N grows
    /// (VN Figs. 7-8 load a server with request/reply Active Messages
    /// instead).
    ///
    /// hops, loss, reliability: 8-byte ping-pong and a 64 KiB stream between
    /// two nodes across 1, 2 and 3 switches; with 0 to 10 % packet loss
    /// along the path (split over its two links); without a fabric and
    /// with an ideal one (the cost of the transport). Links are 10 Gb/s,
    /// 1 us, 4 KiB packets. Payloads are not touched. "of (1-l)R" is the
    /// stream's payload rate over (1 - path loss) times the link rate.
    ///
    /// Examples:
    ///   ulnic fabric bench link --link 1:10,10:5
    ///   ulnic fabric bench hotspot --clients 1,4,16,64 --json
    ///   ulnic fabric bench loss
    ///   ulnic fabric bench drain --engine-threads 1,2
    ///   ulnic fabric bench logp
    ///   ulnic fabric bench permutation
    ///
    /// drain: the engine alone. Send rings are filled while the engine is
    /// held (8-byte messages from node 0 to 1 and from node 2 to 3, on two
    /// switches), then the time for it to deliver them all, with each
    /// number of engine threads, in interleaved rounds.
    #[command(verbatim_doc_comment)]
    Bench(bench::FabricBenchArgs),
    /// Change the faults of a link of a running device (one started with
    /// --topology). The link's faults become exactly those given: what is
    /// not given is 0 (so `--up` alone heals a link completely).
    ///
    /// Examples:
    ///   ulnic fabric set --device /tmp/ulnic --node 1 --down      # partition node 1
    ///   ulnic fabric set --device /tmp/ulnic --node 1 --up        # and heal it
    ///   ulnic fabric set --device /tmp/ulnic --link 0 --drop 0.01 --reorder 0.05
    #[command(verbatim_doc_comment)]
    Set(FabricSetArgs),
    /// Start the device processes of a fabric spread over machines
    /// (docs/spec.md §10.7): one `ulnic device --member` per member, here
    /// or on the hosts of an MPI-style hostfile through ssh. Writes
    /// DIR/fabric.toml and a fresh key DIR/fabric.key (mode 0600), copies
    /// both to each remote host (same path), starts every member
    /// detached, waits for each to be up and records them in
    /// DIR/members.json for `ulnic fabric down`. Node i's socket is
    /// DIR/node{i}.sock on the host of the member serving it.
    ///
    /// Without --topology the fabric is a star: one switch per device,
    /// joined to the first, nodes in contiguous blocks, member dK at
    /// host K's address, UDP port --port + K.
    ///
    /// Hostfile lines: HOST [slots=N] [address=IP]  (member k runs on the
    /// k-th slot; a host whose address is this machine's is started here
    /// without ssh). Hosts need `ulnic` (--remote-ulnic) and ssh access.
    ///
    /// Under Slurm, write the files with --dry-run and let srun start the
    /// members (one task per node, member dK on the K-th node):
    ///   scontrol show hostnames "$SLURM_JOB_NODELIST" > hosts
    ///   ulnic fabric up --nodes 16 --devices "$SLURM_NNODES" --hostfile hosts \
    ///       --dir "$PWD/ulnic" --dry-run
    ///   srun --ntasks-per-node=1 bash -c 'ulnic device --nodes 16 \
    ///       --topology "$PWD/ulnic/fabric.toml" --member "d$SLURM_PROCID" \
    ///       --key-file "$PWD/ulnic/fabric.key" --socket-dir /tmp/ulnic'
    ///
    /// Examples:
    ///   ulnic fabric up --nodes 4 --devices 2 --dir /tmp/ulnic      # both here
    ///   ulnic fabric up --nodes 8 --devices 2 --hostfile hosts --dir /tmp/ulnic
    ///   ulnic bench pingpong --device-dir /tmp/ulnic --nodes 0,7 --transport ulnic
    ///   ulnic fabric down --dir /tmp/ulnic
    #[command(verbatim_doc_comment)]
    Up(FabricUpArgs),
    /// Stop the device processes `ulnic fabric up` started from DIR (here
    /// and, through ssh, on other hosts).
    ///
    /// Example: ulnic fabric down --dir /tmp/ulnic
    #[command(verbatim_doc_comment)]
    Down {
        /// The state directory given to `fabric up`.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The ssh command for members on other hosts.
        #[arg(long, default_value = "ssh -o BatchMode=yes", value_name = "CMD")]
        ssh: String,
    },
    /// Map a running device's fabric over the fabric itself (docs/spec.md
    /// §10.9): the mapper's node sends probes through every switch gate,
    /// switches and nodes answer, and what answered is printed with how it
    /// compares to the topology file. On a fabric with a [mapping] section
    /// the routes every node uses come from these rounds (run on their own
    /// every interval, and this one); otherwise the round only looks.
    ///
    /// Exits 0 when the map matches the topology file with every link up,
    /// 3 when it differs (a link down, a switch cut off), 1 on error.
    ///
    /// Examples:
    ///   ulnic fabric map --device /tmp/ulnic
    ///   ulnic fabric map --device /tmp/ulnic --json
    #[command(verbatim_doc_comment)]
    Map {
        /// The device's socket directory.
        #[arg(long, value_name = "DIR")]
        device: PathBuf,
        /// With a fabric spread over devices: which member to ask (the one
        /// serving the mapper's node maps; others look from their first
        /// node).
        #[arg(long, value_name = "NAME")]
        member: Option<String>,
        /// Print the map as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// A link of a running device, named by index or by the node on it
/// (`fabric set` and `capture`).
#[derive(clap::Args, Debug)]
pub struct LinkTarget {
    /// The device's socket directory.
    #[arg(long, value_name = "DIR")]
    pub device: PathBuf,
    /// The link, by index in the topology (`ulnic stats` lists them).
    #[arg(long, conflicts_with = "node", required_unless_present = "node")]
    pub link: Option<usize>,
    /// Or the link this node hangs on.
    #[arg(long)]
    pub node: Option<u32>,
    /// With a fabric spread over devices: which member (each emulates the
    /// lanes it sends on).
    #[arg(long, value_name = "NAME")]
    pub member: Option<String>,
}

/// `fabric set`'s options.
#[derive(clap::Args, Debug)]
pub struct FabricSetArgs {
    #[command(flatten)]
    pub at: LinkTarget,
    /// Probability a packet is lost.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub drop: f64,
    /// Probability a bit of a packet flips.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub corrupt: f64,
    /// Probability a packet arrives twice.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub duplicate: f64,
    /// Probability later packets overtake a packet.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub reorder: f64,
    /// Probability a packet is delayed by --delay-us.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub delay: f64,
    /// How late a delayed packet is.
    #[arg(long, default_value_t = 100.0, value_name = "US")]
    pub delay_us: f64,
    /// Cut the link (a partition).
    #[arg(long, conflicts_with = "up")]
    pub down: bool,
    /// The link works (the default; says so explicitly).
    #[arg(long)]
    pub up: bool,
}

/// `fabric up`'s options.
#[derive(clap::Args, Debug)]
pub struct FabricUpArgs {
    /// State directory: the topology, key, logs, members.json and the
    /// node sockets (the same path on every host).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// A topology file with [[device]] entries (else a star of --devices).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["nodes", "devices"])]
    pub topology: Option<PathBuf>,
    /// Nodes of the star fabric.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub nodes: u32,
    /// Device processes of the star fabric.
    #[arg(long, default_value_t = 2, value_name = "D")]
    pub devices: u32,
    /// Hosts to run the members on (HOST [slots=N] [address=IP] per line);
    /// default: all on this host, on loopback.
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<PathBuf>,
    /// How to reach a host (split like a shell command; the host and the
    /// remote command are appended).
    #[arg(long, default_value = "ssh -o BatchMode=yes", value_name = "CMD")]
    pub ssh: String,
    /// The ulnic binary on remote hosts.
    #[arg(long, default_value = "ulnic", value_name = "PATH")]
    pub remote_ulnic: String,
    /// First UDP port of the star's members (member K: PORT + K).
    #[arg(long, default_value_t = 7300, value_name = "PORT")]
    pub port: u16,
    /// Endpoints per node.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub endpoints: u32,
    /// Each member's `--poll-us`: microseconds its engine polls the
    /// resident endpoints after its last work before it sleeps and asks
    /// for doorbells (docs/spec.md §5.8).
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_POLL_US, value_name = "US")]
    pub poll_us: u64,
    /// Write the topology and key, print each member's command, start
    /// nothing (for srun or your own launcher).
    #[arg(long)]
    pub dry_run: bool,
    /// Print the members as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `fabric selftest`'s options.
#[derive(clap::Args, Debug)]
pub struct SelftestArgs {
    /// Nodes (attached from host processes).
    #[arg(long, default_value_t = 4)]
    pub nodes: u32,
    /// Operations in all, spread over the nodes and over the kinds --ops
    /// names (with the default --ops send: numbered messages).
    #[arg(long, default_value_t = 100_000)]
    pub messages: u64,
    /// The kinds of operation to mix, comma-separated: send (numbered
    /// messages, checked for gaps, repeats and order), rdma-write (64-byte
    /// writes into slots the target checks at the end), rdma-read (256-byte
    /// reads of a pattern, checked by the reader), immediate (data, then a
    /// write-immediate the target sees only after that data), close (an
    /// endpoint given a close message and destroyed; the target checks it
    /// arrives once, with the closed endpoint's session). Each node posts
    /// them round-robin, each to every other node in turn.
    #[arg(long, value_name = "LIST", default_value = "send")]
    pub ops: String,
    /// Engine threads of the device (the engine is split by switch:
    /// without --topology, one switch per thread, nodes in blocks).
    #[arg(long, value_name = "T", default_value_t = 1)]
    pub threads: u32,
    /// Run the nodes on D device processes on this machine, joined over
    /// loopback UDP (a star of one switch each, as `fabric up` makes),
    /// instead of one device in this process. The faults are set on every
    /// member; the partition cuts node 1's link on all of them.
    #[arg(long, value_name = "D", default_value_t = 1)]
    pub devices: u32,
    /// Probability that a link loses a packet.
    #[arg(long, value_name = "P")]
    pub drop: Option<f64>,
    /// Probability that a link flips a bit of a packet (the CRC catches it).
    #[arg(long, value_name = "P")]
    pub corrupt: Option<f64>,
    /// Probability that a link delivers a packet twice.
    #[arg(long, value_name = "P")]
    pub duplicate: Option<f64>,
    /// Probability that a link holds a packet back so later ones pass it.
    #[arg(long, value_name = "P")]
    pub reorder: Option<f64>,
    /// Seed of the faults: each link draws its faults from a generator
    /// seeded with it, so the same seed gives the same sequence of fault
    /// decisions per link. Which packets they fall on still depends on
    /// timing (the senders' threads and the engine interleave differently
    /// from run to run), so two runs with one seed are alike, not equal.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Cut node 1's link at START ms for LEN ms, then heal it.
    #[arg(long, value_name = "START:LEN")]
    pub partition_ms: Option<String>,
    /// A topology file (docs/spec.md §10.1) instead of one switch; the
    /// fault flags, when given, replace its links' faults.
    #[arg(long, value_name = "FILE")]
    pub topology: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ulnic fabric ...`.
pub fn run(c: FabricCmd) -> anyhow::Result<()> {
    match c {
        FabricCmd::Routes { topology, json } => routes(&topology, json),
        FabricCmd::Selftest(a) => selftest(a),
        FabricCmd::Bench(a) => bench::run(a),
        FabricCmd::Set(a) => set(a),
        FabricCmd::Up(a) => up(a),
        FabricCmd::Down { dir, ssh } => {
            launch::down(&dir, &ssh, &mut |l| eprintln!("ulnic fabric down: {l}")).map(|_| ())
        }
        FabricCmd::Map {
            device,
            member,
            json,
        } => map(&device, member.as_deref(), json),
    }
}

/// `fabric routes`.
fn routes(path: &Path, json: bool) -> anyhow::Result<()> {
    let topo = crate::fabric::load(path)?.topology;
    let lines = crate::fabric::route_lines(&topo);
    if json {
        return crate::print::print_json_lines(&lines);
    }
    print!("{}", routes_table(&topo, &lines));
    Ok(())
}

/// `fabric routes`' table.
fn routes_table(topo: &ulnic_device::fabric::topology::Topology, lines: &[RouteLine]) -> String {
    let mut out = String::new();
    outln!(
        out,
        "{} nodes, {} switches, {} links; routes (up*/down*):",
        topo.nodes(),
        topo.switches().len(),
        topo.links().len()
    );
    for l in lines {
        outln!(
            out,
            "  {:>4} -> {:<4} via {}",
            l.src,
            l.dst,
            l.switches.join(" -> ")
        );
    }
    out
}

/// `--partition-ms START:LEN`.
fn parse_partition(s: &str) -> anyhow::Result<(Duration, Duration)> {
    let (at, len) = s
        .split_once(':')
        .and_then(|(x, y)| Some((x.parse::<u64>().ok()?, y.parse::<u64>().ok()?)))
        .ok_or_else(|| {
            anyhow::anyhow!("--partition-ms takes START:LEN in milliseconds, e.g. 50:200")
        })?;
    Ok((Duration::from_millis(at), Duration::from_millis(len)))
}

/// `fabric selftest`: fails unless every message arrived once, in order
/// (and, without a partition, none came back).
fn selftest(a: SelftestArgs) -> anyhow::Result<()> {
    use ulnic_device::fabric::topology::Faults;
    let given = [a.drop, a.corrupt, a.duplicate, a.reorder];
    let faults = given.iter().any(Option::is_some).then(|| Faults {
        drop: a.drop.unwrap_or(0.0),
        corrupt: a.corrupt.unwrap_or(0.0),
        duplicate: a.duplicate.unwrap_or(0.0),
        reorder: a.reorder.unwrap_or(0.0),
        ..Faults::default()
    });
    let partition = a.partition_ms.as_deref().map(parse_partition).transpose()?;
    let fabric = a.topology.as_deref().map(crate::fabric::load).transpose()?;
    let opts = crate::fabric::selftest::Options {
        nodes: a.nodes,
        messages: a.messages,
        ops: crate::fabric::selftest::layout::Op::parse_list(&a.ops)?,
        threads: a.threads,
        devices: a.devices,
        faults,
        fabric,
        seed: a.seed,
        partition,
        quiet: Duration::from_secs(30),
    };
    let json = a.json;
    let r = crate::fabric::selftest::run(&opts, &mut |l| {
        if !json {
            eprintln!("{l}")
        }
    })?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", selftest_table(&r));
    }
    if !r.clean_but_given_up() {
        anyhow::bail!("the fabric lost, repeated, reordered or misplaced operations");
    }
    if partition.is_none() && r.failures() > 0 {
        anyhow::bail!("operations failed with no partition to explain it");
    }
    Ok(())
}

/// `fabric selftest`'s report, a figure a line.
fn selftest_table(r: &Report) -> String {
    use crate::fabric::selftest::layout::Op;
    let mut out = String::new();
    outln!(out, "{:<22} {:>12}", "sent", r.sent);
    outln!(out, "{:<22} {:>12}", "delivered", r.delivered);
    outln!(out, "{:<22} {:>12}", "lost", r.lost);
    outln!(out, "{:<22} {:>12}", "duplicated", r.duplicated);
    outln!(out, "{:<22} {:>12}", "out_of_order", r.out_of_order);
    outln!(out, "{:<22} {:>12}", "returned", r.returned);
    outln!(out, "{:<22} {:>12}", "unreachable events", r.unreachable);
    if r.ops.iter().any(|op| *op != Op::Send) {
        outln!(
            out,
            "{:<12} {:>9} {:>9} {:>7} {:>6} {:>9} {:>6} {:>6} {:>6}",
            "operation",
            "posted",
            "completed",
            "failed",
            "lost",
            "checked",
            "wrong",
            "dup",
            "order"
        );
        for (op, c) in [
            (Op::RdmaWrite, &r.rdma_write),
            (Op::RdmaRead, &r.rdma_read),
            (Op::Immediate, &r.immediate),
            (Op::Close, &r.close),
        ] {
            if r.ops.contains(&op) {
                outln!(
                    out,
                    "{:<12} {:>9} {:>9} {:>7} {:>6} {:>9} {:>6} {:>6} {:>6}",
                    op.name(),
                    c.posted,
                    c.completed,
                    c.failed,
                    c.lost,
                    c.checked,
                    c.wrong,
                    c.duplicated,
                    c.out_of_order
                );
            }
        }
    }
    outln!(out, "{:<22} {:>12.2}", "seconds", r.seconds);
    outln!(out, "{:<22} {:>12.0}", "operations/s", r.rate);
    outln!(out, "transport:");
    outln!(out, "{:<22} {:>12}", "  retransmissions", r.retransmissions);
    outln!(out, "{:<22} {:>12}", "  timeouts", r.timeouts);
    outln!(out, "{:<22} {:>12}", "  nacks", r.nacks);
    outln!(
        out,
        "{:<22} {:>12}",
        "  duplicates dropped",
        r.duplicates_dropped
    );
    outln!(
        out,
        "{:<22} {:>12}",
        "  early packets dropped",
        r.out_of_order_dropped
    );
    outln!(out, "links:");
    outln!(out, "{:<22} {:>12}", "  packets", r.packets);
    outln!(out, "{:<22} {:>12}", "  dropped", r.packets_dropped);
    outln!(out, "{:<22} {:>12}", "  corrupted", r.packets_corrupted);
    outln!(out, "{:<22} {:>12}", "  crc errors", r.crc_errors);
    outln!(out, "{:<22} {:>12}", "  duplicated", r.packets_duplicated);
    outln!(out, "{:<22} {:>12}", "  reordered", r.packets_reordered);
    out
}

/// `fabric set`.
fn set(a: FabricSetArgs) -> anyhow::Result<()> {
    let mut c = Client::connect(&a.at.device, a.at.member.as_deref())?;
    c.send(&Request::SetFaults {
        link: a.at.link,
        node: a.at.node,
        faults: FaultSpec {
            drop: a.drop,
            corrupt: a.corrupt,
            duplicate: a.duplicate,
            reorder: a.reorder,
            delay: a.delay,
            delay_us: a.delay_us,
            down: a.down,
        },
    })?;
    c.checked_line()?;
    Ok(())
}

/// `fabric up`.
fn up(a: FabricUpArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let hosts = match &a.hostfile {
        None => Vec::new(),
        Some(p) => launch::parse_hostfile(
            &std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        )
        .with_context(|| p.display().to_string())?,
    };
    let dir = std::path::absolute(&a.dir)?;
    let o = launch::UpOptions {
        dir: dir.clone(),
        topology: a.topology,
        nodes: a.nodes,
        devices: a.devices,
        hosts,
        ssh: a.ssh,
        remote_ulnic: a.remote_ulnic,
        port: a.port,
        settings: launch::NodeSettings {
            endpoints: a.endpoints,
            poll_us: a.poll_us,
        },
        dry_run: a.dry_run,
    };
    let members = launch::up(&o, &mut |l| eprintln!("ulnic fabric up: {l}"))?;
    if a.dry_run {
        return Ok(());
    }
    if a.json {
        println!("{}", serde_json::to_string(&members)?);
        return Ok(());
    }
    print!("{}", members_table(&members, &dir));
    Ok(())
}

/// `fabric up`'s table of the members it started.
fn members_table(members: &[Member], dir: &Path) -> String {
    let mut out = String::new();
    outln!(
        out,
        "{:<8} {:<22} {:<16} {:>8}  nodes",
        "member",
        "udp address",
        "host",
        "pid"
    );
    for m in members {
        let nodes: Vec<String> = m.nodes.iter().map(u32::to_string).collect();
        outln!(
            out,
            "{:<8} {:<22} {:<16} {:>8}  {}",
            m.name,
            m.address,
            m.host.as_deref().unwrap_or("(here)"),
            m.pid,
            nodes.join(",")
        );
    }
    outln!(
        out,
        "node sockets: {}/node<N>.sock on each member's host; stop with `ulnic fabric down --dir {}`",
        dir.display(),
        dir.display()
    );
    out
}

/// `fabric map`: exits 3 (`ExitStatus`) when the map differs from the
/// topology file.
fn map(dir: &Path, member: Option<&str>, json: bool) -> anyhow::Result<()> {
    let mut c = Client::connect(dir, member)?;
    c.send(&Request::Map)?;
    let line = c.checked_line()?;
    let m: MapReport = serde_json::from_str(&line)?;
    if json {
        println!("{line}");
    } else {
        print!("{}", map_report(&m));
    }
    if !m.matches_topology {
        return Err(ExitStatus(3).into());
    }
    Ok(())
}

/// `fabric map`'s report: the round, the switches with their routes, the
/// links, the nodes, and how it compares to the topology file.
fn map_report(m: &MapReport) -> String {
    let mut out = String::new();
    outln!(
        out,
        "round {} from node {}: {} switches, {} links, {} nodes, {} probes ({} unanswered), {:.0} us",
        m.round,
        m.mapper,
        m.switches.len(),
        m.links.len(),
        m.nodes.len(),
        m.probes,
        m.timeouts,
        m.took_us
    );
    if m.generation > 0 {
        outln!(
            out,
            "routes: generation {} (the fabric routes by this map)",
            m.generation
        );
    } else {
        outln!(
            out,
            "routes: from the topology file (no [mapping]; this round only looked)"
        );
    }
    outln!(
        out,
        "\n{:<16} {:>4} {:>6}  route from the mapper",
        "switch",
        "id",
        "gates"
    );
    for s in &m.switches {
        let route: Vec<String> = s.route.iter().map(u8::to_string).collect();
        let route = if route.is_empty() {
            "-".to_string()
        } else {
            route.join(",")
        };
        outln!(out, "{:<16} {:>4} {:>6}  {route}", s.name, s.id, s.gates);
    }
    outln!(out, "\nlinks");
    for l in &m.links {
        outln!(out, "  {}:{} - {}:{}", l.a.0, l.a.1, l.b.0, l.b.1);
    }
    outln!(out, "\nnodes");
    for (n, s, p) in &m.nodes {
        outln!(out, "  node {n} on {s}:{p}");
    }
    if m.matches_topology {
        outln!(out, "\nmatches the topology file");
    } else {
        outln!(out, "\ndiffers from the topology file:");
        for d in &m.differences {
            outln!(out, "  {d}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};
    use crate::control::{MapLink, MapSwitch};
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<FabricCmd, clap::Error> {
        let mut all = vec!["fabric"];
        all.extend_from_slice(args);
        match try_parse(&all)? {
            Cmd::Fabric(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn selftest_options() {
        let FabricCmd::Selftest(a) = parse(&["selftest"]).unwrap() else {
            panic!()
        };
        assert_eq!((a.nodes, a.messages, a.seed), (4, 100_000, 1));
        assert_eq!(
            (a.drop, a.corrupt, a.duplicate, a.reorder),
            (None, None, None, None)
        );
        assert_eq!((a.partition_ms, a.topology, a.json), (None, None, false));
        let FabricCmd::Selftest(a) = parse(&[
            "selftest",
            "--drop",
            "0.05",
            "--reorder",
            "0.1",
            "--partition-ms",
            "50:200",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!((a.drop, a.reorder), (Some(0.05), Some(0.1)));
        let p = parse_partition(a.partition_ms.as_deref().unwrap()).unwrap();
        assert_eq!(p, (Duration::from_millis(50), Duration::from_millis(200)));
    }

    #[test]
    fn partitions_are_start_colon_length() {
        for bad in ["50", "50:", ":200", "a:b", "50:-1", "50:200:3"] {
            assert_eq!(
                parse_partition(bad).unwrap_err().to_string(),
                "--partition-ms takes START:LEN in milliseconds, e.g. 50:200",
                "{bad}"
            );
        }
    }

    #[test]
    fn set_names_one_link() {
        let FabricCmd::Set(a) = parse(&["set", "--device", "/d", "--node", "1", "--down"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((a.at.link, a.at.node, a.at.member), (None, Some(1), None));
        assert!(a.down && !a.up);
        assert_eq!((a.drop, a.delay, a.delay_us), (0.0, 0.0, 100.0));
        let FabricCmd::Set(a) =
            parse(&["set", "--device", "/d", "--link", "0", "--drop", "0.01"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((a.at.link, a.drop), (Some(0), 0.01));
        for (args, kind) in [
            (
                &["set", "--device", "/d"][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["set", "--device", "/d", "--link", "0", "--node", "1"],
                ErrorKind::ArgumentConflict,
            ),
            (
                &["set", "--device", "/d", "--node", "1", "--down", "--up"],
                ErrorKind::ArgumentConflict,
            ),
            (&["set", "--node", "1"], ErrorKind::MissingRequiredArgument),
        ] {
            assert_eq!(parse(args).unwrap_err().kind(), kind, "{args:?}");
        }
    }

    #[test]
    fn up_options() {
        let FabricCmd::Up(a) = parse(&["up", "--dir", "/tmp/f"]).unwrap() else {
            panic!()
        };
        assert_eq!((a.nodes, a.devices, a.port, a.endpoints), (4, 2, 7300, 16));
        assert_eq!(
            (a.ssh.as_str(), a.remote_ulnic.as_str()),
            ("ssh -o BatchMode=yes", "ulnic")
        );
        assert!(!a.dry_run && !a.json && a.hostfile.is_none() && a.topology.is_none());
        let e = parse(&["up", "--dir", "/f", "--topology", "t.toml", "--nodes", "8"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
        let e = parse(&["up", "--nodes", "8"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let FabricCmd::Down { dir, ssh } = parse(&["down", "--dir", "/f"]).unwrap() else {
            panic!()
        };
        assert_eq!(
            (dir, ssh.as_str()),
            (PathBuf::from("/f"), "ssh -o BatchMode=yes")
        );
    }

    #[test]
    fn routes_and_map_options() {
        let FabricCmd::Routes { topology, json } =
            parse(&["routes", "--topology", "t.toml", "--json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((topology, json), (PathBuf::from("t.toml"), true));
        assert_eq!(
            parse(&["routes"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        let FabricCmd::Map {
            device,
            member,
            json,
        } = parse(&["map", "--device", "/d", "--member", "d1"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (device, member.as_deref(), json),
            (PathBuf::from("/d"), Some("d1"), false)
        );
    }

    #[test]
    fn the_routes_table() {
        let topo = crate::fabric::file::parse(
            r#"nodes = 3
[[switch]]
name = "left"
[[switch]]
name = "right"
[[link]]
between = ["left", "right"]
[[attach]]
nodes = [0, 1]
switch = "left"
[[attach]]
nodes = [2]
switch = "right"
"#,
        )
        .unwrap()
        .topology;
        let lines = crate::fabric::route_lines(&topo);
        assert_eq!(
            routes_table(&topo, &lines),
            "3 nodes, 2 switches, 4 links; routes (up*/down*):\n\
             \x20    0 -> 1    via left\n\
             \x20    0 -> 2    via left -> right\n\
             \x20    1 -> 0    via left\n\
             \x20    1 -> 2    via left -> right\n\
             \x20    2 -> 0    via right -> left\n\
             \x20    2 -> 1    via right -> left\n"
        );
        let json = crate::print::json_lines(&lines).unwrap();
        assert_eq!(
            json.lines().nth(1),
            Some(r#"{"src":0,"dst":2,"switches":["left","right"]}"#)
        );
    }

    #[test]
    fn the_selftest_table() {
        let r = Report {
            nodes: 4,
            sent: 1000,
            delivered: 1000,
            seconds: 0.5,
            rate: 2000.0,
            retransmissions: 7,
            packets: 1234,
            crc_errors: 2,
            ..Report::default()
        };
        let t = selftest_table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 22);
        assert_eq!(lines[0], "sent                           1000");
        assert_eq!(lines[6], "unreachable events                0");
        assert_eq!(lines[7], "seconds                        0.50");
        assert_eq!(lines[8], "operations/s                   2000");
        assert_eq!(lines[9], "transport:");
        assert_eq!(lines[10], "  retransmissions                 7");
        assert_eq!(lines[14], "  early packets dropped            0");
        assert_eq!(lines[15], "links:");
        assert_eq!(lines[16], "  packets                      1234");
        assert_eq!(lines[19], "  crc errors                      2");
    }

    #[test]
    fn the_members_table() {
        let m = Member {
            name: "d0".into(),
            host: None,
            address: "127.0.0.1:7300".into(),
            nodes: vec![0, 1],
            pid: 4242,
            log: "/f/d0.log".into(),
        };
        let far = Member {
            name: "d1".into(),
            host: Some("node7".into()),
            address: "10.0.0.7:7301".into(),
            nodes: vec![2, 3],
            pid: 17,
            log: "/f/d1.log".into(),
        };
        assert_eq!(
            members_table(&[m, far], Path::new("/f")),
            "member   udp address            host                  pid  nodes\n\
             d0       127.0.0.1:7300         (here)               4242  0,1\n\
             d1       10.0.0.7:7301          node7                  17  2,3\n\
             node sockets: /f/node<N>.sock on each member's host; stop with `ulnic fabric down --dir /f`\n"
        );
    }

    fn map(matches: bool) -> MapReport {
        MapReport {
            round: 2,
            mapper: 0,
            generation: if matches { 3 } else { 0 },
            took_us: 123.4,
            probes: 9,
            timeouts: 1,
            switches: vec![
                MapSwitch {
                    id: 0,
                    name: "left".into(),
                    gates: 3,
                    route: vec![],
                },
                MapSwitch {
                    id: 1,
                    name: "right".into(),
                    gates: 2,
                    route: vec![2],
                },
            ],
            links: vec![MapLink {
                a: ("left".into(), 2),
                b: ("right".into(), 0),
            }],
            nodes: vec![(0, "left".into(), 0), (2, "right".into(), 1)],
            matches_topology: matches,
            differences: if matches {
                vec![]
            } else {
                vec!["node 1 missing".into()]
            },
        }
    }

    #[test]
    fn the_map_report() {
        assert_eq!(
            map_report(&map(true)),
            "round 2 from node 0: 2 switches, 1 links, 2 nodes, 9 probes (1 unanswered), 123 us\n\
             routes: generation 3 (the fabric routes by this map)\n\
             \n\
             switch             id  gates  route from the mapper\n\
             left                0      3  -\n\
             right               1      2  2\n\
             \n\
             links\n\
             \x20 left:2 - right:0\n\
             \n\
             nodes\n\
             \x20 node 0 on left:0\n\
             \x20 node 2 on right:1\n\
             \n\
             matches the topology file\n"
        );
        let differs = map_report(&map(false));
        assert!(differs
            .contains("routes: from the topology file (no [mapping]; this round only looked)\n"));
        assert!(differs.ends_with("\ndiffers from the topology file:\n  node 1 missing\n"));
    }
}
