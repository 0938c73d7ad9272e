//! `bench apps`: unmodified Debian programs over ulnic sockets (the
//! LD_PRELOAD layer, docs/sockets.md §7) against the same programs over
//! the kernel's TCP: redis-benchmark against redis-server (SET and GET),
//! iperf3 (a TCP stream) and sockperf (TCP ping-pong); and three server
//! shapes ([`super::servers`]) at 1 and at 20 clients: memcached (a
//! libevent server handing connections to worker threads), nginx (forked
//! workers in epoll with signals) and lighttpd (event-driven), both HTTP
//! servers under ApacheBench.
//!
//! One side starts every server twice, once under the layer and once
//! without it, on ports of its own ([`port`]); the other runs each
//! client against both, the two transports taking turns within a round.
//! Between two host processes attached to one device ([`run_local`]) the
//! kernel's side is loopback; between two guests (`cluster bench apps`,
//! [`peer`]) it is the guests' virtio-net link, and the two sides meet
//! over a kernel TCP connection that the server side accepts once its
//! servers listen and the client side closes when it is done.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use ulnic_images::vm::GUEST_INET;

/// A program pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum App {
    /// redis-benchmark against redis-server: SET and GET, requests per
    /// second and p50/p99 latency.
    Redis,
    /// iperf3: one TCP stream, throughput.
    Iperf3,
    /// sockperf ping-pong over TCP: round-trip time (p50, p99).
    Sockperf,
    /// memcaslap against memcached (threads fed connections by a
    /// listener thread): requests per second, mean time per request.
    Memcached,
    /// ApacheBench against nginx (a master and forked workers waiting in
    /// epoll with signals).
    Nginx,
    /// ApacheBench against lighttpd (one event-driven process).
    Lighttpd,
}

impl App {
    /// The Debian packages that carry the app's programs.
    pub fn packages(self) -> &'static [&'static str] {
        match self {
            App::Redis => &["redis-server", "redis-tools"],
            App::Iperf3 => &["iperf3"],
            App::Sockperf => &["sockperf"],
            App::Memcached => &["memcached", "libmemcached-tools"],
            App::Nginx => &["nginx", "apache2-utils"],
            App::Lighttpd => &["lighttpd", "apache2-utils"],
        }
    }

    /// Its server shape, measured at each `--concurrency`
    /// ([`super::servers`]); `None` for the three programs.
    pub fn shape(self) -> Option<super::servers::Shape> {
        use super::servers::Shape;
        match self {
            App::Memcached => Some(Shape::Memcached),
            App::Nginx => Some(Shape::Nginx),
            App::Lighttpd => Some(Shape::Lighttpd),
            App::Redis | App::Iperf3 | App::Sockperf => None,
        }
    }

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            App::Redis => "redis",
            App::Iperf3 => "iperf3",
            App::Sockperf => "sockperf",
            App::Memcached => "memcached",
            App::Nginx => "nginx",
            App::Lighttpd => "lighttpd",
        }
    }
}

/// What `bench apps` runs (flattened into `ulnic bench` and
/// `ulnic cluster bench`).
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "apps")]
pub struct AppsArgs {
    /// apps: the programs to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "redis,iperf3,sockperf"
    )]
    pub apps: Vec<App>,
    /// apps: redis-benchmark's requests per test (-n).
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub requests: u64,
    /// apps: redis-benchmark's parallel connections (-c).
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub clients: u32,
    /// apps: seconds of each iperf3 and sockperf run (sockperf spends
    /// 0.4 s of it warming up).
    #[arg(long, default_value_t = 5, value_name = "S")]
    pub seconds: u32,
    /// apps: interleaved rounds (ulnic, then the kernel, for each app in
    /// each round); the table gives medians and the median of the ratios
    /// paired within a round.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub app_rounds: u32,
    /// apps: the clients memcached, nginx and lighttpd are measured with,
    /// each with one request outstanding (1: latency; more: throughput).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,20",
        value_name = "N,..."
    )]
    pub concurrency: Vec<u32>,
}

/// The port an app's server listens on: ulnic's under the layer, the
/// kernel's (without it) the next one.
fn port(app: App, over_ulnic: bool) -> u16 {
    let base = match app {
        App::Redis => 6379,
        App::Iperf3 => 5201,
        App::Sockperf => 11111,
        // Not the programs' own defaults, where a system service may be
        // listening already.
        App::Memcached => 11311,
        App::Nginx => 8280,
        App::Lighttpd => 8290,
    };
    base + u16::from(!over_ulnic)
}

/// How the programs' processes reach ulnic.
#[derive(Debug, Clone)]
pub enum Attach {
    /// In a guest: every process opens the guest's NIC (/dev/ulnic0);
    /// the servers are on the other guest, `server`.
    Guest {
        /// The server guest's node.
        server: u32,
    },
    /// On the host: each process attaches to a node of its own (host
    /// attach takes one process per node), `sockets[n]` being node n's:
    /// node 1 + i serves app i, the clients of round r take the nodes
    /// after those.
    Host {
        /// The device's sockets.
        sockets: Vec<PathBuf>,
    },
}

impl Attach {
    /// Nodes a host run of `apps` in `rounds` rounds needs: a client
    /// node 0 left unused, a server node per app, a client node per app
    /// and round.
    pub fn host_nodes(apps: usize, rounds: u32) -> u32 {
        1 + apps as u32 * (1 + rounds.max(1))
    }

    fn server_node(&self, apps: &[App], app: App) -> u32 {
        match self {
            Attach::Guest { server } => *server,
            Attach::Host { .. } => 1 + apps.iter().position(|&a| a == app).unwrap_or(0) as u32,
        }
    }

    fn client_node(&self, apps: &[App], app: App, round: u32) -> Option<u32> {
        match self {
            Attach::Guest { .. } => None,
            Attach::Host { .. } => {
                let i = apps.iter().position(|&a| a == app).unwrap_or(0) as u32;
                Some(1 + apps.len() as u32 * (1 + round) + i)
            }
        }
    }

    /// What a process on `node` (None: the guest's own NIC) needs in its
    /// environment to use ulnic, besides LD_PRELOAD.
    fn env(&self, node: Option<u32>) -> anyhow::Result<Vec<(String, OsString)>> {
        let mut env = Vec::new();
        if matches!(self, Attach::Host { .. }) || std::env::var_os("ULNIC_INET").is_none() {
            env.push(("ULNIC_INET".to_string(), OsString::from(GUEST_INET)));
        }
        if let (Attach::Host { sockets }, Some(n)) = (self, node) {
            let socket = sockets
                .get(n as usize)
                .ok_or_else(|| anyhow::anyhow!("the device has no node {n}"))?;
            env.push(("ULNIC_SOCKET".to_string(), socket.as_os_str().into()));
        }
        Ok(env)
    }
}

/// Where the programs are and how a process reaches ulnic.
#[derive(Debug, Clone)]
pub struct Setting {
    /// `libulnic_preload.so`.
    pub preload: PathBuf,
    /// How processes attach.
    pub attach: Attach,
    /// The server's address over the kernel.
    pub kernel_addr: String,
    /// Where the servers' logs go.
    pub scratch: PathBuf,
}

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppResult {
    /// "apps".
    pub bench: String,
    /// The program pair.
    pub app: App,
    /// Its test: SET, GET, stream, ping-pong.
    pub test: String,
    /// "ulnic" (under the layer) or "tcp" (the kernel).
    pub transport: String,
    /// The round, from 0.
    pub round: u32,
    /// Requests (redis) or round trips (sockperf) per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_s: Option<f64>,
    /// Throughput (iperf3, as its receiver counted it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gbit_per_s: Option<f64>,
    /// Median latency: a request (redis), a round trip (sockperf).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    /// 99th percentile latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    /// Mean time per request of one client (the server shapes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_us: Option<f64>,
}

/// The servers of one side; killed when dropped.
pub struct Servers {
    running: Vec<(String, Child, PathBuf)>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        // SIGTERM first: servers exit through exit(3), and the layer then
        // reports their wake-ups; whatever still runs after 5 s is killed.
        for (_, child, _) in &mut self.running {
            if matches!(child.try_wait(), Ok(None)) {
                // SAFETY: a signal to a child this process started and has
                // not reaped (checked just above), so the pid is still its.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, child, _) in &mut self.running {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where the processes under the layer append their wake-up counts.
const WAKES_FILE: &str = "wakes";

/// How the sleeps of the programs under the layer ended, summed over
/// their processes (docs/sockets.md §6): `found_by_timer` is a lost
/// wake-up and must be 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wakes {
    /// Processes that reported.
    pub processes: u64,
    /// Sleeps a notification ended.
    pub notified: u64,
    /// Sleeps a timer (the program's timeout, a keepalive) ended.
    pub timer: u64,
    /// Timer wake-ups that found work no notification announced.
    pub found_by_timer: u64,
    /// Looks again of waiters nothing can notify (forked children under
    /// host attach).
    pub unfed_looks: u64,
}

impl Wakes {
    /// The counts the processes of `scratch` reported.
    pub fn read(scratch: &Path) -> Wakes {
        let text = std::fs::read_to_string(scratch.join(WAKES_FILE)).unwrap_or_default();
        let mut w = Wakes::default();
        for c in text.lines().filter_map(ulnic::sock::WakeStats::from_report) {
            w.processes += 1;
            w.notified += c.notified;
            w.timer += c.timer;
            w.found_by_timer += c.found_by_timer;
            w.unfed_looks += c.unfed_looks;
        }
        w
    }

    /// Both sides' counts.
    pub fn add(self, o: Wakes) -> Wakes {
        Wakes {
            processes: self.processes + o.processes,
            notified: self.notified + o.notified,
            timer: self.timer + o.timer,
            found_by_timer: self.found_by_timer + o.found_by_timer,
            unfed_looks: self.unfed_looks + o.unfed_looks,
        }
    }
}

fn program(name: &str) -> anyhow::Result<PathBuf> {
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
    {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    let pkgs: Vec<&str> = <App as clap::ValueEnum>::value_variants()
        .iter()
        .flat_map(|a| a.packages().iter().copied())
        .collect();
    anyhow::bail!(
        "{name} is not installed (Debian: apt-get install {}; \
         in guests: --packages, which cluster bench apps adds itself)",
        pkgs.join(" ")
    )
}

/// A command under the layer (`over_ulnic`) or plainly.
fn command(prog: &Path, ulnic_node: Option<Option<u32>>, s: &Setting) -> anyhow::Result<Command> {
    let mut c = Command::new(prog);
    c.stdin(Stdio::null());
    match ulnic_node {
        Some(node) => {
            c.env("LD_PRELOAD", &s.preload);
            // Each process under the layer appends how its sleeps ended
            // at exit (docs/sockets.md §6): read back by [`Wakes::read`].
            // Absolute, or the layer prints to standard error instead.
            let file = std::path::absolute(s.scratch.join(WAKES_FILE))?;
            c.env("ULNIC_STATS", file);
            for (k, v) in s.attach.env(node)? {
                c.env(k, v);
            }
        }
        None => {
            c.env_remove("LD_PRELOAD");
        }
    }
    Ok(c)
}

/// Ports the kernel lists as listening (TCP, IPv4 and IPv6).
fn listening() -> Vec<u16> {
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (f.get(1), f.get(3)) else {
                continue;
            };
            if *state != "0A" {
                continue;
            }
            if let Some(p) = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                ports.push(p);
            }
        }
    }
    ports
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Starts each app's servers, under the layer and plainly, and returns
/// once all of them listen (the layer's listeners bound to any address
/// listen in the kernel too, so the kernel's table shows every one).
pub fn start_servers(
    apps: &[App],
    s: &Setting,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Servers> {
    let mut servers = Servers {
        running: Vec::new(),
    };
    let mut want = Vec::new();
    for &app in apps {
        for over_ulnic in [true, false] {
            let port = port(app, over_ulnic);
            let (prog, args): (&str, Vec<String>) = match app {
                App::Redis => (
                    "redis-server",
                    [
                        "--port",
                        &port.to_string(),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--protected-mode",
                        "no",
                        "--dir",
                        &s.scratch.display().to_string(),
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                App::Iperf3 => ("iperf3", vec!["-s".into(), "-p".into(), port.to_string()]),
                App::Sockperf => (
                    "sockperf",
                    vec![
                        "server".into(),
                        "--tcp".into(),
                        "-p".into(),
                        port.to_string(),
                    ],
                ),
                App::Memcached | App::Nginx | App::Lighttpd => {
                    let shape = app.shape().ok_or_else(|| anyhow::anyhow!("not a shape"))?;
                    super::servers::server(shape, port, &s.scratch)?
                }
            };
            let label = format!(
                "{prog} on port {port} ({})",
                if over_ulnic { "ulnic" } else { "kernel" }
            );
            let log = s.scratch.join(format!("{prog}-{port}.log"));
            let out = std::fs::File::create(&log)?;
            let node = Some(match s.attach {
                Attach::Guest { .. } => None,
                Attach::Host { .. } => Some(s.attach.server_node(apps, app)),
            });
            let child = command(&program(prog)?, over_ulnic.then_some(node).flatten(), s)?
                .args(&args)
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot start {label}: {e}"))?;
            say(&format!("started {label}"));
            servers.running.push((label, child, log));
            want.push(port);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for (label, child, log) in &mut servers.running {
            if let Ok(Some(status)) = child.try_wait() {
                anyhow::bail!("{label} exited ({status}):\n{}", tail(log));
            }
        }
        let up = listening();
        let missing: Vec<u16> = want.iter().copied().filter(|p| !up.contains(p)).collect();
        if missing.is_empty() {
            return Ok(servers);
        }
        if Instant::now() > deadline {
            anyhow::bail!("servers on ports {missing:?} did not listen within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a client to its end (within `limit`) and returns its output.
fn run(mut c: Command, label: &str, limit: Duration) -> anyhow::Result<String> {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {label}: {e}"))?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut text);
        }
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut text);
        }
        text
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("{label} still ran after {} s: killed", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    anyhow::ensure!(
        status.success(),
        "{label} failed ({status}): {}{}",
        text.chars()
            .rev()
            .take(600)
            .collect::<String>()
            .chars()
            .rev()
            .collect::<String>(),
        err
    );
    Ok(text)
}

/// redis-benchmark's `--csv`: "test","rps","avg","min","p50","p95","p99","max".
fn parse_redis(text: &str) -> Vec<(String, f64, f64, f64)> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').map(|w| w.trim_matches('"')).collect();
        if f.len() < 7 {
            continue;
        }
        let num = |i: usize| f[i].parse::<f64>().ok();
        if let (Some(rps), Some(p50), Some(p99)) = (num(1), num(4), num(6)) {
            rows.push((f[0].to_string(), rps, p50 * 1e3, p99 * 1e3));
        }
    }
    rows
}

/// iperf3 `-J`: what the receiver counted.
fn parse_iperf3(text: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
}

/// sockperf's summary with `--full-rtt`: round trips per second, p50 and
/// p99 in microseconds.
fn parse_sockperf(text: &str) -> Option<(f64, f64, f64)> {
    let mut p50 = None;
    let mut p99 = None;
    let mut rate = None;
    for line in text.lines() {
        let value = |l: &str| {
            l.rsplit('=')
                .next()
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        if line.contains("percentile 50.000") {
            p50 = value(line);
        } else if line.contains("percentile 99.000") {
            p99 = value(line);
        } else if line.contains("[Valid Duration]") {
            // "RunTime=0.550 sec; SentMessages=10187; ReceivedMessages=10187"
            let field = |name: &str| {
                line.split(name)
                    .nth(1)
                    .and_then(|r| r.split([' ', ';']).next())
                    .and_then(|v| v.parse::<f64>().ok())
            };
            if let (Some(t), Some(n)) = (field("RunTime="), field("ReceivedMessages=")) {
                if t > 0.0 {
                    rate = Some(n / t);
                }
            }
        }
    }
    Some((rate?, p50?, p99?))
}

/// Runs every app's client against the server side, ulnic and the
/// kernel in turn, `rounds` times; a result per measurement.
pub fn run_clients(
    a: &AppsArgs,
    s: &Setting,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<AppResult>> {
    let mut results = Vec::new();
    for round in 0..a.app_rounds.max(1) {
        for &app in &a.apps {
            for over_ulnic in [true, false] {
                let transport = if over_ulnic { "ulnic" } else { "tcp" };
                say(&format!("round {round}: {} over {transport}", app.name()));
                let base = AppResult {
                    bench: "apps".into(),
                    app,
                    test: String::new(),
                    transport: transport.into(),
                    round,
                    ops_per_s: None,
                    gbit_per_s: None,
                    p50_us: None,
                    p99_us: None,
                    mean_us: None,
                };
                results.extend(measure(a, s, &base, over_ulnic)?);
            }
        }
    }
    Ok(results)
}

/// One app's client run(s) over one transport.
fn measure(
    a: &AppsArgs,
    s: &Setting,
    base: &AppResult,
    over_ulnic: bool,
) -> anyhow::Result<Vec<AppResult>> {
    let (app, round) = (base.app, base.round);
    let secs = a.seconds.max(1);
    // Generous: TCG guests run these programs tens of times slower.
    let limit = Duration::from_secs(u64::from(secs) * 4 + 60 + a.requests / 500);
    let ulnic_addr = ulnic_images::vm::node_ipv4(s.attach.server_node(&a.apps, app)).to_string();
    let addr = if over_ulnic {
        &ulnic_addr
    } else {
        &s.kernel_addr
    };
    let node = over_ulnic.then(|| s.attach.client_node(&a.apps, app, round));
    let port_n = port(app, over_ulnic);
    let port = port_n.to_string();
    let label = format!("{} over {}", app.name(), base.transport);
    let mut results = Vec::new();
    match app {
        App::Redis => {
            let mut c = command(&program("redis-benchmark")?, node, s)?;
            c.args(["-h", addr, "-p", &port, "-t", "set,get", "--csv"])
                .args(["-n", &a.requests.to_string()])
                .args(["-c", &a.clients.to_string()]);
            let text = run(c, &label, limit)?;
            let rows = parse_redis(&text);
            anyhow::ensure!(
                rows.len() >= 2,
                "{label}: no SET and GET lines in redis-benchmark's output: {text}"
            );
            for (test, rps, p50, p99) in rows {
                results.push(AppResult {
                    test,
                    ops_per_s: Some(rps),
                    p50_us: Some(p50),
                    p99_us: Some(p99),
                    ..base.clone()
                });
            }
        }
        App::Iperf3 => {
            let mut c = command(&program("iperf3")?, node, s)?;
            c.args(["-c", addr, "-p", &port, "-J"])
                .args(["-t", &secs.to_string()]);
            let text = run(c, &label, limit)?;
            let g = parse_iperf3(&text).ok_or_else(|| {
                anyhow::anyhow!("{label}: no receiver total in iperf3's JSON: {text}")
            })?;
            results.push(AppResult {
                test: "stream".into(),
                gbit_per_s: Some(g),
                ..base.clone()
            });
        }
        App::Sockperf => {
            let mut c = command(&program("sockperf")?, node, s)?;
            c.args(["ping-pong", "--tcp", "--full-rtt", "-i", addr, "-p", &port])
                .args(["-t", &secs.to_string()]);
            let text = run(c, &label, limit)?;
            let (rate, p50, p99) = parse_sockperf(&text).ok_or_else(|| {
                anyhow::anyhow!("{label}: no percentiles in sockperf's output: {text}")
            })?;
            results.push(AppResult {
                test: "ping-pong".into(),
                ops_per_s: Some(rate),
                p50_us: Some(p50),
                p99_us: Some(p99),
                ..base.clone()
            });
        }
        App::Memcached | App::Nginx | App::Lighttpd => {
            let shape = app.shape().ok_or_else(|| anyhow::anyhow!("not a shape"))?;
            for &clients in &a.concurrency {
                let clients = clients.max(1);
                let (prog, args) = super::servers::client(shape, addr, port_n, clients, secs);
                let mut c = command(&program(prog)?, node, s)?;
                c.args(&args);
                let label = format!("{label}, {clients} client(s)");
                let text = run(c, &label, limit)?;
                let (rate, mean) = super::servers::parse(shape, clients, &text)
                    .map_err(|e| anyhow::anyhow!("{label}: {e}"))?;
                results.push(AppResult {
                    test: clients_test(clients),
                    ops_per_s: Some(rate),
                    mean_us: Some(mean),
                    ..base.clone()
                });
            }
        }
    }
    Ok(results)
}

/// A server shape's test name at `clients` clients.
fn clients_test(clients: u32) -> String {
    if clients == 1 {
        "1 client".into()
    } else {
        format!("{clients} clients")
    }
}

/// A goal of issue 13: ulnic against the kernel, per app and metric.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// "apps-ratio".
    pub bench: &'static str,
    /// The program pair.
    pub app: App,
    /// Its test.
    pub test: String,
    /// What is compared.
    pub metric: &'static str,
    /// Median over rounds, over ulnic.
    pub ulnic: f64,
    /// Median over rounds, over the kernel's TCP.
    pub tcp: f64,
    /// Median of the ratios ulnic / tcp paired within rounds.
    pub ratio: f64,
    /// The goal, as text (">= 2", "<= 0.3").
    pub goal: &'static str,
    /// Whether the ratio meets it.
    pub met: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The paired ratios against the goals: redis ops/s and iperf3
/// throughput at least 2x the kernel's, sockperf's round trip at most
/// 0.3x (and, for reading, redis p50 and sockperf p99 without a goal).
pub fn ratios(results: &[AppResult]) -> Vec<Ratio> {
    struct Metric {
        name: &'static str,
        pick: fn(&AppResult) -> Option<f64>,
        goal: &'static str,
        /// (higher is better, bound)
        bound: Option<(bool, f64)>,
    }
    let mut out = Vec::new();
    let mut tests: Vec<(App, String)> = Vec::new();
    for r in results {
        if !tests.iter().any(|(a, t)| *a == r.app && *t == r.test) {
            tests.push((r.app, r.test.clone()));
        }
    }
    for (app, test) in tests {
        let metrics: &[Metric] = match app {
            App::Redis => &[
                Metric {
                    name: "ops/s",
                    pick: |r| r.ops_per_s,
                    goal: ">= 2",
                    bound: Some((true, 2.0)),
                },
                Metric {
                    name: "p50 us",
                    pick: |r| r.p50_us,
                    goal: "-",
                    bound: None,
                },
            ],
            App::Iperf3 => &[Metric {
                name: "Gbit/s",
                pick: |r| r.gbit_per_s,
                goal: ">= 2",
                bound: Some((true, 2.0)),
            }],
            App::Memcached | App::Nginx | App::Lighttpd if test == clients_test(1) => &[Metric {
                name: "mean us",
                pick: |r| r.mean_us,
                goal: "<= 1",
                bound: Some((false, 1.0)),
            }],
            App::Memcached | App::Nginx | App::Lighttpd => &[Metric {
                name: "ops/s",
                pick: |r| r.ops_per_s,
                goal: ">= 1",
                bound: Some((true, 1.0)),
            }],
            App::Sockperf => &[
                Metric {
                    name: "RTT p50 us",
                    pick: |r| r.p50_us,
                    goal: "<= 0.3",
                    bound: Some((false, 0.3)),
                },
                Metric {
                    name: "RTT p99 us",
                    pick: |r| r.p99_us,
                    goal: "-",
                    bound: None,
                },
            ],
        };
        for m in metrics {
            let (metric, pick, goal, bound) = (m.name, m.pick, m.goal, m.bound);
            let of = |t: &str| -> Vec<(u32, f64)> {
                results
                    .iter()
                    .filter(|r| r.app == app && r.test == test && r.transport == t)
                    .filter_map(|r| pick(r).map(|v| (r.round, v)))
                    .collect()
            };
            let (u, k) = (of("ulnic"), of("tcp"));
            let paired: Vec<f64> = u
                .iter()
                .filter_map(|(round, v)| {
                    k.iter()
                        .find(|(r2, _)| r2 == round)
                        .filter(|(_, kv)| *kv > 0.0)
                        .map(|(_, kv)| v / kv)
                })
                .collect();
            if paired.is_empty() {
                continue;
            }
            let ratio = median(paired);
            out.push(Ratio {
                bench: "apps-ratio",
                app,
                test: test.clone(),
                metric,
                ulnic: median(u.iter().map(|x| x.1).collect()),
                tcp: median(k.iter().map(|x| x.1).collect()),
                ratio,
                goal,
                met: match bound {
                    Some((true, b)) => ratio >= b,
                    Some((false, b)) => ratio <= b,
                    None => true,
                },
            });
        }
    }
    out
}

/// `libulnic_preload.so`: beside this program (a build tree, an
/// install), else in /lib (guests).
pub fn find_preload() -> anyhow::Result<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("libulnic_preload.so")));
    for p in beside.into_iter().chain(
        [
            "/lib/libulnic_preload.so",
            "/usr/local/lib/libulnic_preload.so",
        ]
        .map(PathBuf::from),
    ) {
        if p.is_file() {
            return Ok(p);
        }
    }
    anyhow::bail!(
        "libulnic_preload.so is not beside this ulnic nor in /lib: build it (cargo build --release builds it into target/release)"
    )
}

/// Both sides in this process's care, on nodes of one device (host
/// attach, one node per process as [`Attach::Host`] assigns them): the
/// kernel's side over loopback.
pub fn run_local(
    a: &AppsArgs,
    sockets: &[PathBuf],
    scratch: &Path,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<(Vec<AppResult>, Wakes)> {
    let s = Setting {
        preload: find_preload()?,
        attach: Attach::Host {
            sockets: sockets.to_vec(),
        },
        kernel_addr: "127.0.0.1".into(),
        scratch: scratch.to_path_buf(),
    };
    let servers = start_servers(&a.apps, &s, say)?;
    let results = run_clients(a, &s, say);
    drop(servers);
    Ok((results?, Wakes::read(scratch)))
}

/// The port the two guests meet on (kernel TCP over virtio-net).
const MEET_PORT: u16 = 7990;

/// One guest's side of `cluster bench apps` (`ulnic apps-peer`).
#[derive(clap::Args, Debug)]
pub struct PeerArgs {
    /// "server" or "client".
    #[arg(long, value_parser = ["server", "client"])]
    pub role: String,
    /// The other guest.
    #[arg(long)]
    pub peer_node: u32,
    #[command(flatten)]
    pub apps: AppsArgs,
}

/// Runs one guest's side. The server side starts its servers, then
/// accepts the client side's connection and holds them until that
/// connection closes; the client side prints `RESULT {json}` lines.
pub fn peer(p: &PeerArgs) -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let peer_addr = ulnic_images::vm::node_ipv4(p.peer_node);
    let mut say = |l: &str| eprintln!("{l}");
    if p.role == "server" {
        let s = Setting {
            preload: find_preload()?,
            attach: Attach::Guest { server: 0 },
            kernel_addr: String::new(),
            scratch: scratch.path().to_path_buf(),
        };
        let servers = start_servers(&p.apps.apps, &s, &mut say)?;
        let meet = TcpListener::bind(("0.0.0.0", MEET_PORT))?;
        let (mut conn, _) = meet.accept()?;
        conn.write_all(b"ready\n")?;
        // Held until the client side is done (end of stream).
        let mut sink = Vec::new();
        let _ = conn.read_to_end(&mut sink);
        drop(servers);
        // The servers' wake-ups, back to the client side that reports.
        // Best effort: a client side that failed is not listening.
        let wakes = serde_json::to_string(&Wakes::read(scratch.path()))?;
        let _ = conn.write_all(format!("WAKES {wakes}\n").as_bytes());
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut conn = loop {
        match TcpStream::connect((peer_addr, MEET_PORT)) {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => {
                anyhow::bail!("the server guest {peer_addr} never became ready: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let mut ready = [0u8; 6];
    conn.read_exact(&mut ready)?;
    let s = Setting {
        preload: find_preload()?,
        attach: Attach::Guest {
            server: p.peer_node,
        },
        kernel_addr: peer_addr.to_string(),
        scratch: scratch.path().to_path_buf(),
    };
    let results = run_clients(&p.apps, &s, &mut say)?;
    for r in &results {
        println!("RESULT {}", serde_json::to_string(r)?);
    }
    // Done: the server side stops its servers and answers with their
    // wake-ups.
    conn.shutdown(std::net::Shutdown::Write)?;
    // The server side stops its servers (at most 5 s) first.
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    let theirs: Option<Wakes> = reply
        .trim()
        .strip_prefix("WAKES ")
        .and_then(|j| serde_json::from_str(j).ok());
    let ours = Wakes::read(scratch.path());
    match theirs {
        Some(t) => println!("WAKES {}", serde_json::to_string(&ours.add(t))?),
        // The results stand; the sum would be only half of it.
        None => eprintln!("the server guest sent no wake-up counts: {reply:?}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_csv_is_read() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"124999.99\",\"0.250\",\"0.072\",\"0.191\",\"0.319\",\"3.879\",\"3.951\"\n\
                    \"GET\",\"153846.16\",\"0.178\",\"0.056\",\"0.175\",\"0.279\",\"0.343\",\"0.519\"\n";
        let rows = parse_redis(text);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].0, "SET");
        assert!((rows[0].1 - 124999.99).abs() < 1e-6);
        assert!((rows[1].2 - 175.0).abs() < 1e-6);
        assert!((rows[1].3 - 343.0).abs() < 1e-6);
    }

    #[test]
    fn sockperf_summary_is_read() {
        let text = "sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=10187; ReceivedMessages=10187\n\
                    sockperf: ---> percentile 99.000 =   44.704\n\
                    sockperf: ---> percentile 50.000 =   27.385\n";
        let (rate, p50, p99) = parse_sockperf(text).unwrap();
        assert!((rate - 10187.0 / 0.55).abs() < 1e-6);
        assert!((p50 - 27.385).abs() < 1e-9);
        assert!((p99 - 44.704).abs() < 1e-9);
        assert!(parse_sockperf("sockperf: ERROR: Can`t connect socket").is_none());
    }

    #[test]
    fn iperf3_json_is_read() {
        let text = r#"{"end":{"sum_received":{"bits_per_second":1.5e9}}}"#;
        assert_eq!(parse_iperf3(text), Some(1.5));
        assert_eq!(parse_iperf3("{}"), None);
    }

    #[test]
    fn ratios_pair_rounds_and_judge_goals() {
        let r = |transport: &str, round, ops, p50| AppResult {
            bench: "apps".into(),
            app: App::Sockperf,
            test: "ping-pong".into(),
            transport: transport.into(),
            round,
            ops_per_s: Some(ops),
            gbit_per_s: None,
            p50_us: Some(p50),
            p99_us: None,
            mean_us: None,
        };
        let rs = ratios(&[
            r("ulnic", 0, 1.0, 20.0),
            r("tcp", 0, 1.0, 100.0),
            r("ulnic", 1, 1.0, 35.0),
            r("tcp", 1, 1.0, 100.0),
        ]);
        assert_eq!(rs.len(), 1);
        // The median of the paired ratios 0.2 and 0.35.
        assert!((rs[0].ratio - 0.275).abs() < 1e-9);
        assert!((rs[0].ulnic - 27.5).abs() < 1e-9 && (rs[0].tcp - 100.0).abs() < 1e-9);
        assert!(rs[0].met);
        let rs = ratios(&[r("ulnic", 0, 1.0, 50.0), r("tcp", 0, 1.0, 100.0)]);
        assert!(!rs[0].met);
    }
}
