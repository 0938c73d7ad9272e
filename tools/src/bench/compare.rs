//! `ulnic bench compare`: ulnic beside the baselines in this binary (a
//! shared-memory spin ring, a Unix socket, loopback TCP, memcpy) and
//! beside real peers a user installs (fi_pingpong of Debian's
//! libfabric-bin over its shm and tcp providers; sockperf; fabtests'
//! fi_rdm_tagged_bw, fi_msg_bw and fi_rma_bw, which Debian does not
//! package), in interleaved rounds: round trips polling, CPU time per
//! round trip blocking, streams, message rate, RDMA writes, round trips
//! with thousands of endpoints open against one, and (asked for) round
//! trips between QEMU guests and `cluster up` times. Each ratio
//! is ulnic's figure over the peer's in the same round, and the median of
//! those is reported, so a noisy round weighs on both sides. A peer that
//! is not installed is reported missing, never as zero.

use crate::bench::nodes::NodePair;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::link::Mode;
use super::payload::Touch;
use super::pingpong::{run_one, warmup, Spec, Transport, Workload};
use super::rdma::{memcpy_line, ulnic_line, Direction};
use super::record::Record;

/// What a section of the comparison measures (its JSON name: the
/// variant's in kebab case, as [`Kind::label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Round trips, receivers polling: microseconds.
    Pingpong,
    /// Round trips, receivers blocking in the kernel: CPU time of both
    /// sides and the device per round trip, microseconds.
    BlockCpu,
    /// One-way messages as fast as flow control allows: MB/s.
    Stream,
    /// The same, counted in messages: millions per second.
    Rate,
    /// One-sided writes into the peer's memory: MB/s.
    RdmaWrite,
    /// Round trips polling with thousands of endpoints open on each node
    /// against one: microseconds.
    Endpoints,
    /// Round trips between processes on two QEMU guests, blocking (as
    /// kernel TCP does): microseconds.
    VmPingpong,
    /// `ulnic cluster up` until every guest is ready, warm image cache:
    /// seconds. No ratio: its goal is absolute.
    ClusterUp,
}

impl Kind {
    /// Its name in the table.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Pingpong => "pingpong",
            Kind::BlockCpu => "block-cpu",
            Kind::Stream => "stream",
            Kind::Rate => "rate",
            Kind::RdmaWrite => "rdma-write",
            Kind::Endpoints => "endpoints",
            Kind::VmPingpong => "vm-pingpong",
            Kind::ClusterUp => "cluster-up",
        }
    }

    /// Its figure with the unit.
    pub fn show(self, v: f64) -> String {
        match self {
            Kind::Pingpong | Kind::Endpoints | Kind::VmPingpong => format!("{v:.2} us RTT"),
            Kind::ClusterUp => format!("{v:.1} s"),
            Kind::BlockCpu => format!("{v:.2} us CPU"),
            Kind::Rate => format!("{v:.2} M msg/s"),
            Kind::Stream | Kind::RdmaWrite => format!("{v:.0} MB/s"),
        }
    }
}

/// One peer: who, and how it touches payloads.
#[derive(Debug, Clone, Copy)]
enum Peer {
    /// A transport of `ulnic bench`.
    Internal(Transport),
    /// `fi_pingpong -p PROVIDER -e EP -c`.
    FiPingpong(&'static str, &'static str),
    /// `sockperf ping-pong --tcp --full-rtt`.
    Sockperf,
    /// memcpy between two buffers of this process (the RDMA baseline).
    Memcpy,
    /// A fabtests bandwidth test: tool, provider, its other arguments.
    Fabtest(&'static str, &'static str, &'static [&'static str]),
    /// ulnic ping-pong with this many endpoints open on each node (on the
    /// device made for the endpoints section).
    UlnicEndpoints(u32),
    /// `ulnic cluster bench pingpong` on two guests: its ulnic line, or
    /// (`Tcp`) its kernel TCP line over the guests' virtio-net.
    Guests(Transport),
    /// `ulnic cluster up --nodes N`.
    ClusterUp(u32),
}

impl Peer {
    fn name(self) -> String {
        match self {
            Peer::Internal(Transport::Ulnic) => "ulnic".into(),
            Peer::Internal(Transport::Shm) => "shm spin ring".into(),
            Peer::Internal(Transport::Pio) => "pio windows".into(),
            Peer::Internal(Transport::Unix) => "unix socket".into(),
            Peer::Internal(Transport::Tcp) => "tcp loopback".into(),
            Peer::FiPingpong(p, _) => format!("fi_pingpong {p}"),
            Peer::Sockperf => "sockperf tcp".into(),
            Peer::Memcpy => "memcpy".into(),
            Peer::Fabtest(tool, p, _) => format!("{tool} {p}"),
            Peer::UlnicEndpoints(1) => "ulnic, 1 endpoint".into(),
            Peer::UlnicEndpoints(n) => format!("ulnic, {n} endpoints"),
            Peer::Guests(Transport::Ulnic) => "guests: ulnic".into(),
            Peer::Guests(_) => "guests: kernel tcp".into(),
            Peer::ClusterUp(n) => format!("cluster up --nodes {n}"),
        }
    }

    /// How it touches payloads when `touch` is asked for, and which
    /// statistic it reports. fabtests can only fill and check (`-c`) or
    /// touch nothing, so `write` runs them untouched; sockperf never
    /// touches payloads.
    fn rules(self, touch: Touch) -> (&'static str, &'static str) {
        match self {
            Peer::Internal(_) | Peer::UlnicEndpoints(_) => (touch.label(), "median"),
            // The guests' ping-pong writes and checks every byte both ways.
            Peer::Guests(_) => ("write+verify", "median"),
            Peer::ClusterUp(_) => ("-", "wall"),
            Peer::FiPingpong(..) if touch == Touch::WriteVerify => ("fill+check (-c)", "mean"),
            Peer::FiPingpong(..) => ("none", "mean"),
            Peer::Sockperf => ("none", "median"),
            // A copy reads and writes every byte; neither side looks.
            Peer::Memcpy => ("copy", "mean"),
            Peer::Fabtest(..) if touch == Touch::WriteVerify => ("fill+check (-v)", "mean"),
            Peer::Fabtest(..) => ("none", "mean"),
        }
    }

    /// Why it cannot run here with messages of `size` bytes, if it
    /// cannot.
    fn missing(self, size: u32) -> Option<String> {
        let (tool, hint) = match self {
            Peer::Internal(_)
            | Peer::Memcpy
            | Peer::UlnicEndpoints(_)
            | Peer::Guests(_)
            | Peer::ClusterUp(_) => return None,
            Peer::Fabtest(tool, ..) => (
                tool,
                "fabtests, which Debian does not package: README.md, under `ulnic bench compare`, says how to build them",
            ),
            Peer::FiPingpong(..) => ("fi_pingpong", "apt install libfabric-bin"),
            Peer::Sockperf if size > SOCKPERF_MAX => {
                return Some(format!(
                    "sockperf's messages are at most {SOCKPERF_MAX} bytes"
                ))
            }
            Peer::Sockperf => ("sockperf", "apt install sockperf"),
        };
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        (!found).then(|| format!("{tool} not found ({hint})"))
    }
}

/// One line of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What the row measures, in which unit ([`Kind`]).
    pub workload: Kind,
    /// Message size in bytes.
    pub size: u32,
    /// The peer.
    pub peer: String,
    /// How it touches payloads.
    pub payload: &'static str,
    /// The statistic of each round's figure ("median" or "mean").
    pub statistic: &'static str,
    /// Each round's figure (round trip in us, or MB/s).
    pub rounds: Vec<f64>,
    /// Median of the rounds.
    pub value: Option<f64>,
    /// Median over the rounds of ulnic's figure over this peer's (round
    /// trips and CPU time: below 1 is ulnic ahead; the others: above 1 is).
    pub ulnic_ratio: Option<f64>,
    /// Why the peer did not run.
    pub missing: Option<String>,
}

/// What to compare.
pub struct Options {
    /// Ping-pong sizes.
    pub pingpong_sizes: Vec<u32>,
    /// Sizes of blocking round trips (CPU time).
    pub block_sizes: Vec<u32>,
    /// Stream sizes.
    pub stream_sizes: Vec<u32>,
    /// Message-rate sizes.
    pub rate_sizes: Vec<u32>,
    /// RDMA write sizes.
    pub rdma_sizes: Vec<u32>,
    /// Sizes of the endpoints section's and the guests' round trips.
    pub endpoint_sizes: Vec<u32>,
    /// Interleaved rounds.
    pub rounds: u32,
    /// Round trips per ping-pong run.
    pub iters: u64,
    /// Messages per stream and RDMA run.
    pub stream_iters: u64,
    /// Messages per message-rate run.
    pub rate_iters: u64,
    /// How payloads are touched (each row says what its peer did).
    pub touch: Touch,
    /// The endpoints section: endpoints per node, and the socket
    /// directory of a device whose nodes have that many (and a few more);
    /// `None` leaves the section out.
    pub endpoints: Option<(u32, std::path::PathBuf)>,
    /// Also boot QEMU guests: round trips between two of them, and how
    /// long `cluster up` takes for 2 and for 8.
    pub guests: bool,
    /// The ulnic peers' nodes (client, server) on the device of
    /// `ulnic_dir`.
    pub nodes: (u32, u32),
}

/// Runs the comparison; `ulnic_dir` holds a running device's sockets
/// (nodes 0 and 1), `scratch` the baselines' sockets.
pub fn compare(
    o: &Options,
    ulnic_dir: &Path,
    scratch: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Row>> {
    let pingpong_peers = [
        Peer::Internal(Transport::Ulnic),
        Peer::Internal(Transport::Shm),
        Peer::Internal(Transport::Unix),
        Peer::Internal(Transport::Tcp),
        Peer::FiPingpong("shm", "rdm"),
        Peer::FiPingpong("tcp", "msg"),
        Peer::Sockperf,
    ];
    let block_peers = [
        Peer::Internal(Transport::Ulnic),
        Peer::Internal(Transport::Unix),
    ];
    let tagged = Peer::Fabtest("fi_rdm_tagged_bw", "shm", &[]);
    let stream_peers = [
        Peer::Internal(Transport::Ulnic),
        Peer::Internal(Transport::Shm),
        Peer::Internal(Transport::Unix),
        Peer::Internal(Transport::Tcp),
        tagged,
        Peer::Fabtest("fi_msg_bw", "tcp", &[]),
    ];
    let rate_peers = [
        Peer::Internal(Transport::Ulnic),
        Peer::Internal(Transport::Shm),
        tagged,
    ];
    let rdma_peers = [
        Peer::Internal(Transport::Ulnic),
        Peer::Memcpy,
        Peer::Fabtest("fi_rma_bw", "shm", &["-e", "rdm", "-o", "write"]),
    ];
    let endpoint_peers = match &o.endpoints {
        Some((n, _)) => vec![Peer::UlnicEndpoints(*n), Peer::UlnicEndpoints(1)],
        None => Vec::new(),
    };
    let (guest_peers, up_peers) = if o.guests {
        (
            vec![Peer::Guests(Transport::Ulnic), Peer::Guests(Transport::Tcp)],
            vec![Peer::ClusterUp(2), Peer::ClusterUp(8)],
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let mut rows = Vec::new();
    let mut at = Where {
        ulnic_dir,
        nodes: o.nodes,
        scratch,
        guest_lines: None,
    };
    for (kind, sizes, peers) in [
        (Kind::Pingpong, &o.pingpong_sizes[..], &pingpong_peers[..]),
        (Kind::BlockCpu, &o.block_sizes, &block_peers[..]),
        (Kind::Stream, &o.stream_sizes, &stream_peers[..]),
        (Kind::Rate, &o.rate_sizes, &rate_peers[..]),
        (Kind::RdmaWrite, &o.rdma_sizes, &rdma_peers[..]),
        (Kind::Endpoints, &o.endpoint_sizes, &endpoint_peers),
        (Kind::VmPingpong, &o.endpoint_sizes, &guest_peers),
        (Kind::ClusterUp, &[0], &up_peers),
    ] {
        if peers.is_empty() {
            continue;
        }
        if kind == Kind::VmPingpong {
            // Build the guest image (or find it cached) once, before the
            // guest sections, so no round's figure includes the build.
            say("compare: guest image (built on first use)");
            run_self(&["image", "build"])?;
        }
        let iters = match kind {
            Kind::Pingpong | Kind::BlockCpu | Kind::Endpoints => o.iters,
            Kind::Stream | Kind::RdmaWrite => o.stream_iters,
            Kind::Rate => o.rate_iters,
            // 0.2-0.6 ms each under TCG: about a second a run.
            Kind::VmPingpong => o.iters.min(1000),
            Kind::ClusterUp => 1,
        };
        at.ulnic_dir = match (&o.endpoints, kind) {
            (Some((_, d)), Kind::Endpoints) => d.as_path(),
            _ => ulnic_dir,
        };
        for &size in sizes {
            let first = rows.len();
            for &p in peers {
                let (payload, statistic) = p.rules(o.touch);
                rows.push(Row {
                    workload: kind,
                    size,
                    peer: p.name(),
                    payload,
                    statistic,
                    rounds: Vec::new(),
                    value: None,
                    ulnic_ratio: None,
                    missing: p.missing(size),
                });
            }
            for r in 0..o.rounds {
                say(&format!(
                    "compare: {} {size} B, round {} of {}",
                    kind.label(),
                    r + 1,
                    o.rounds
                ));
                for (i, &p) in peers.iter().enumerate() {
                    let row = &mut rows[first + i];
                    if row.missing.is_some() {
                        continue;
                    }
                    match measure(p, kind, size, iters, o.touch, &mut at) {
                        Ok(v) => row.rounds.push(v),
                        Err(e) => {
                            row.missing = Some(format!("failed: {e}"));
                            row.rounds.clear();
                        }
                    }
                }
            }
            let ulnic = rows[first].rounds.clone();
            for row in &mut rows[first..] {
                if row.rounds.is_empty() {
                    continue;
                }
                row.value = Some(median(row.rounds.clone()));
                if kind == Kind::ClusterUp {
                    continue;
                }
                let paired: Vec<f64> = ulnic.iter().zip(&row.rounds).map(|(u, p)| u / p).collect();
                if !paired.is_empty() {
                    row.ulnic_ratio = Some(median(paired));
                }
            }
        }
    }
    Ok(rows)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Where runs happen: the ulnic device's socket directory and the nodes
/// used on it, and a scratch directory for the baselines; and the lines of this
/// round's guest ping-pong, which its ulnic peer runs and its TCP peer
/// reads (one run of `cluster bench` measures both).
struct Where<'a> {
    ulnic_dir: &'a Path,
    nodes: (u32, u32),
    scratch: &'a Path,
    guest_lines: Option<Vec<Record>>,
}

/// One run of `p`, in `kind`'s unit.
fn measure(
    p: Peer,
    kind: Kind,
    size: u32,
    iters: u64,
    touch: Touch,
    at: &mut Where,
) -> anyhow::Result<f64> {
    let (ulnic_dir, scratch) = (at.ulnic_dir, at.scratch);
    let spec = |transport, workload, mode| Spec {
        workload,
        transport,
        size,
        iters,
        mode,
        corrupt_at: None,
        nodes: at.nodes,
        payload: touch,
        endpoints: 1,
        event_queue: false,
    };
    let mbytes = |r: Record| {
        r.mbytes_per_s
            .ok_or_else(|| anyhow::anyhow!("no rate measured"))
    };
    let micros = |r: &Record| {
        r.median_ns
            .map(|ns| ns as f64 / 1e3)
            .ok_or_else(|| anyhow::anyhow!("no round trip measured"))
    };
    match (p, kind) {
        (Peer::Internal(Transport::Ulnic), Kind::RdmaWrite) => mbytes(ulnic_line(
            Direction::Write,
            size,
            iters,
            &NodePair::of(ulnic_dir, at.nodes),
        )?),
        (Peer::Memcpy, _) => mbytes(memcpy_line(Direction::Write, size, iters)),
        (Peer::Internal(t), Kind::Pingpong) => micros(&run_one(
            &spec(t, Workload::Pingpong, Mode::Poll),
            ulnic_dir,
            scratch,
        )?),
        (Peer::Internal(t), Kind::Stream) => mbytes(run_one(
            &spec(t, Workload::Stream, Mode::Poll),
            ulnic_dir,
            scratch,
        )?),
        (Peer::Internal(t), Kind::Rate) => {
            anyhow::ensure!(size > 0, "a message rate needs messages of at least a byte");
            let r = run_one(&spec(t, Workload::Stream, Mode::Poll), ulnic_dir, scratch)?;
            Ok(mbytes(r)? / f64::from(size))
        }
        (Peer::Internal(t), Kind::BlockCpu) => {
            // Both peers are children, the device a thread of this
            // process (idle but for this run): the CPU time of all of them.
            let before = cpu_seconds();
            run_one(
                &spec(t, Workload::Pingpong, Mode::Block),
                ulnic_dir,
                scratch,
            )?;
            let used = cpu_seconds() - before;
            Ok(used * 1e6 / (iters + warmup(iters)) as f64)
        }
        (Peer::FiPingpong(provider, ep), _) => {
            fi_pingpong(provider, ep, size, iters, touch == Touch::WriteVerify)
        }
        (Peer::Sockperf, _) => sockperf(size),
        (Peer::Fabtest(tool, provider, extra), _) => {
            let (mb, mmsg) = fabtest_bw(
                tool,
                provider,
                extra,
                size,
                iters,
                touch == Touch::WriteVerify,
            )?;
            Ok(if kind == Kind::Rate { mmsg } else { mb })
        }
        (Peer::UlnicEndpoints(n), Kind::Endpoints) => {
            let mut s = spec(Transport::Ulnic, Workload::Pingpong, Mode::Poll);
            s.endpoints = n;
            micros(&run_one(&s, ulnic_dir, scratch)?)
        }
        (Peer::Guests(t), Kind::VmPingpong) => {
            if t == Transport::Ulnic {
                // A failed run leaves nothing for the TCP peer, not the
                // last round's lines.
                at.guest_lines = None;
                let size = size.to_string();
                let iters = iters.to_string();
                let out = run_self(&[
                    "cluster", "bench", "pingpong", "--nodes", "2", "--mode", "block", "--size",
                    &size, "--iters", &iters, "--json",
                ])?;
                at.guest_lines = Some(
                    out.lines()
                        .filter_map(|l| serde_json::from_str::<Record>(l).ok())
                        .collect(),
                );
            }
            let want = if t == Transport::Ulnic {
                "ulnic"
            } else {
                "tcp"
            };
            let records = at
                .guest_lines
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("the guests' ulnic run failed"))?;
            let line = records
                .iter()
                .find(|r| r.transport.starts_with(want))
                .ok_or_else(|| anyhow::anyhow!("cluster bench printed no {want} line"))?;
            micros(line)
        }
        (Peer::ClusterUp(n), Kind::ClusterUp) => {
            let name = format!("compare-{}", std::process::id());
            let nodes = n.to_string();
            let started = Instant::now();
            let up = run_self(&["cluster", "up", "--nodes", &nodes, "--name", &name]);
            let seconds = started.elapsed().as_secs_f64();
            // Down whether or not it came up: nothing is left running.
            let down = run_self(&["cluster", "down", "--name", &name]);
            up?;
            down?;
            Ok(seconds)
        }
        (p, k) => anyhow::bail!("{} does not run {}", p.name(), k.label()),
    }
}

/// CPU seconds used so far by this process and its waited-for children.
fn cpu_seconds() -> f64 {
    let usage = |who| {
        // SAFETY: getrusage fills the struct it is given; a zeroed rusage
        // is a valid value of that plain C struct.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid, writable rusage for the call.
        unsafe { libc::getrusage(who, &mut u) };
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(u.ru_utime) + t(u.ru_stime)
    };
    usage(libc::RUSAGE_SELF) + usage(libc::RUSAGE_CHILDREN)
}

/// A fabtests bandwidth test on loopback: (MB/s, millions of messages a
/// second) from the client's result line for `size`. `-s 127.0.0.1` on
/// both sides (the shm provider names its endpoints from it).
fn fabtest_bw(
    tool: &str,
    provider: &str,
    extra: &[&str],
    size: u32,
    iters: u64,
    check: bool,
) -> anyhow::Result<(f64, f64)> {
    let args = [&["-s", "127.0.0.1"], extra].concat();
    let check = check.then_some("-v");
    let text = fabtests_pair(
        tool,
        provider,
        &fabtests_args(provider, &args, check, size, iters),
    )?;
    parse_fabtest_bw(&text, size)
        .ok_or_else(|| anyhow::anyhow!("{tool} printed no result line: {text}"))
}

/// A fabtests program's arguments for both sides: `-p provider`, `extra`,
/// the check flag when payloads are checked (`-c` or `-v`, by program),
/// `-S size -I iters`.
fn fabtests_args<'a>(
    provider: &'a str,
    extra: &'a [&'a str],
    check: Option<&'a str>,
    size: u32,
    iters: u64,
) -> impl Fn(&mut Command) + 'a {
    move |c: &mut Command| {
        c.args(["-p", provider]).args(extra).args(check);
        c.arg("-S")
            .arg(size.to_string())
            .arg("-I")
            .arg(iters.to_string());
    }
}

/// The columns of a fabtests result line for `size` (its first column),
/// when it has at least `min` of them.
fn fabtests_line(text: &str, size: u32, min: usize) -> Option<Vec<&str>> {
    let label = fabtests_size(size);
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.len() >= min && cols[0] == label)
}

/// Runs a fabtests program's server (`-B port`) and client (`-P port
/// 127.0.0.1`) on loopback, each with `args`; the client's output. The
/// client is started again while the server is not listening yet.
fn fabtests_pair(
    tool: &str,
    provider: &str,
    args: &dyn Fn(&mut Command),
) -> anyhow::Result<String> {
    let port = free_port()?.to_string();
    let mut srv = Command::new(tool);
    args(&mut srv);
    let _server = Server(
        srv.args(["-B", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut cli = Command::new(tool);
        args(&mut cli);
        let out = cli.args(["-P", &port, "127.0.0.1"]).output()?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{tool} -p {provider}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// MB/sec and Mxfers/sec of a fabtests bandwidth line for `size`
/// (columns: bytes, iters, total, time, MB/sec, usec/xfer, Mxfers/sec).
fn parse_fabtest_bw(text: &str, size: u32) -> Option<(f64, f64)> {
    let cols = fabtests_line(text, size, 7)?;
    Some((cols[4].parse().ok()?, cols[6].parse().ok()?))
}

/// sockperf's largest message.
const SOCKPERF_MAX: u32 = 65_506;

/// A free TCP port on loopback (the peers take a port number).
fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A child killed when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fi_pingpong`'s mean round trip in microseconds: twice its usec/xfer
/// (a transfer is one direction of a round trip).
fn fi_pingpong(
    provider: &str,
    ep: &str,
    size: u32,
    iters: u64,
    check: bool,
) -> anyhow::Result<f64> {
    let extra = ["-e", ep];
    let args = fabtests_args(provider, &extra, check.then_some("-c"), size, iters);
    let text = fabtests_pair("fi_pingpong", provider, &args)?;
    parse_fi_pingpong(&text, size)
        .ok_or_else(|| anyhow::anyhow!("fi_pingpong printed no result line: {text}"))
}

/// `size` as fabtests print it: whole kilo-, mega- or gigabytes (of 1024)
/// with a suffix, or plain bytes.
fn fabtests_size(size: u32) -> String {
    for (unit, suffix) in [(1u32 << 30, 'g'), (1 << 20, 'm'), (1 << 10, 'k')] {
        if size >= unit {
            return format!("{}{suffix}", size / unit);
        }
    }
    size.to_string()
}

/// The round trip (2 x usec/xfer) in fi_pingpong's result line for `size`.
fn parse_fi_pingpong(text: &str, size: u32) -> Option<f64> {
    let cols = fabtests_line(text, size, 8)?;
    cols[6].parse::<f64>().ok().map(|us| 2.0 * us)
}

/// sockperf's median round trip over TCP on loopback, in microseconds
/// (messages of at least its 14-byte header).
fn sockperf(size: u32) -> anyhow::Result<f64> {
    let port = free_port()?.to_string();
    let _server = Server(
        Command::new("sockperf")
            .args(["sr", "--tcp", "-i", "127.0.0.1", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("sockperf")
            .args([
                "pp",
                "--tcp",
                "--full-rtt",
                "-i",
                "127.0.0.1",
                "-p",
                &port,
                "-t",
                "1",
                "-m",
            ])
            .arg(size.max(14).to_string())
            .output()?;
        // Its report goes to either stream, depending on the version.
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(v) = parse_sockperf(&text) {
            return Ok(v);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "sockperf printed no median: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The 50th percentile in sockperf's report.
fn parse_sockperf(text: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.split("percentile 50.000 =").nth(1)?;
        rest.trim().parse().ok()
    })
}

/// Runs this very program with `args` (a cluster or the image builder,
/// which live in the same binary), its progress on stderr passed
/// through; its stdout, or an error with the tail of what it said.
fn run_self(args: &[&str]) -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let out = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "`ulnic {}` failed ({}): {}",
        args.join(" "),
        out.status,
        stdout.lines().rev().take(3).collect::<Vec<_>>().join(" / ")
    );
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_reports_parse() {
        let fi = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                  8       2k      =2k      31k         0.01s      3.19       2.50       0.40\n";
        assert_eq!(parse_fi_pingpong(fi, 8), Some(5.0));
        assert_eq!(parse_fi_pingpong(fi, 16), None);
        let big = "64k     300     =300     37m         0.08s    465.87     140.67       0.01\n";
        assert_eq!(parse_fi_pingpong(big, 65536), Some(281.34));
        assert_eq!(fabtests_size(1 << 20), "1m");
        let sp = "sockperf: ---> percentile 75.000 =   18.288\n\
                  sockperf: ---> percentile 50.000 =   12.197\n";
        assert_eq!(parse_sockperf(sp), Some(12.197));
        assert_eq!(parse_sockperf("nothing"), None);
        let bw = "bytes   iters   total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                  8       100k    781k        0.05s     17.71       0.45       2.21\n";
        assert_eq!(parse_fabtest_bw(bw, 8), Some((17.71, 2.21)));
        assert_eq!(parse_fabtest_bw(bw, 64), None);
    }
}
