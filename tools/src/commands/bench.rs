//! `ulnic bench`: the workloads between host processes (ping-pong and
//! stream over ulnic and the baselines, RDMA, tripwire, DMQ, UTLB),
//! `compare` and `apps`, and their printers: the result table (fabtests'
//! columns), the comparison table and the apps tables, or one JSON object
//! per line with `--json`. The benchmarks themselves are in `crate::bench`.

use crate::bench::nodes::NodePair;
use std::path::{Path, PathBuf};

use ulnic_device::{Configuration, Device};

use crate::bench::apps::{self, AppResult, AppsArgs};
use crate::bench::compare::{self, Kind, Row};
use crate::bench::payload::Touch;
use crate::bench::{run_one, Mode, Record, Spec, Transport, Workload};
use crate::commands::device::UtlbCacheArgs;
use crate::print::{human_bytes, outln};

/// `ulnic bench`'s options.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Workload.
    #[arg(value_enum)]
    pub workload: Workload,
    /// Transports to compare, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ulnic,shm,unix,tcp"
    )]
    pub transport: Vec<Transport>,
    /// Message sizes in bytes (RDMA workloads sweep 4096..1048576 unless
    /// sizes are given).
    #[arg(long, value_delimiter = ',', default_value = "0,4,40,400,4096,65536")]
    pub size: Vec<u32>,
    /// Measured iterations per size (default: 5000 round trips; for stream,
    /// about 256 MB of payload, at least 2000 messages).
    #[arg(long)]
    pub iters: Option<u64>,
    /// How receivers wait: busy-poll (yielding) or block in the kernel.
    /// Sockets always block; shm always polls; each line says what ran.
    #[arg(long, value_enum, default_value = "poll")]
    pub mode: Mode,
    /// Use a running device's socket directory (nodes 0 and 1, or
    /// --nodes) instead of starting one.
    #[arg(long, value_name = "DIR")]
    pub device_dir: Option<PathBuf>,
    /// With --device-dir: the client's and the server's nodes (their
    /// sockets nodeN.sock may belong to different devices of one fabric).
    #[arg(long, value_parser = parse_node_pair, default_value = "0,1",
          value_name = "CLIENT,SERVER", requires = "device_dir")]
    pub nodes: (u32, u32),
    /// Print one JSON object per result line.
    #[arg(long)]
    pub json: bool,
    /// The device this benchmark starts (not with --device-dir).
    #[command(flatten)]
    pub utlb_cache: UtlbCacheArgs,
    /// utlb stress: numbers of distinct one-page buffers to sweep.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,1024")]
    pub buffers: Vec<u32>,
    /// utlb stress: entries in the sender's UTLB table (the "cache" the
    /// buffers are swept past).
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub utlb_entries: u32,
    /// pingpong and stream: flip one byte of measured message N (from 0)
    /// after the sender wrote it. The receiver checks every byte of every
    /// message, so the run must fail: a check that the checks run.
    #[arg(long, value_name = "N")]
    pub corrupt_at: Option<u64>,
    /// pingpong and stream: how payloads are touched. write+verify (the
    /// default): the sender writes every byte of every message and the
    /// receiver checks every byte. write: the sender writes, the receiver
    /// does not read. none: neither (the transfer alone, as fabtests by
    /// default). Every result line says which ran. ulnic payloads are
    /// written and read in place in the registered segment, the others'
    /// through a user buffer; a ping-pong's answer is written afresh, so
    /// both directions are touched, and round trips include the touching.
    /// With none, ulnic sends every message from one buffer into one, as
    /// fabtests do; otherwise each message in flight has its own slot (64
    /// a side). Lines say which ("buffers" in --json).
    #[arg(long, value_enum, default_value = "write+verify")]
    pub payload: Touch,
    /// compare: interleaved rounds (each peer once per round).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub rounds: u32,
    /// pingpong and stream over ulnic: endpoints each peer keeps open on
    /// its node, all but the measured one having exchanged a message
    /// first. The device polls at most 64 per node and the others wait
    /// for doorbells (spec §5.8), so this shows what a node's endpoint
    /// count costs the one in use. Lines say "ulnic:Nep".
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(ulnic_abi::MAX_ENDPOINTS_LIMIT)))]
    pub endpoints: u32,
    /// pingpong and stream over ulnic: each peer's endpoint reports to a
    /// CLAN event queue (`ulnic::EventQueue`, spec §6.1) and its blocking
    /// waits go through the queue; with --mode block this shows what the
    /// queue adds to a wake-up. Lines say "ulnic:evq".
    #[arg(long)]
    pub event_queue: bool,
    /// compare: also boot QEMU guests (TCG unless KVM works here; the
    /// guest image is built on first use): 8-byte round trips between two
    /// guests over ulnic against kernel TCP on their virtio-net link, and
    /// how long `cluster up` takes for 2 and for 8 guests. Adds minutes.
    #[arg(long)]
    pub guests: bool,
    #[command(flatten)]
    pub apps: AppsArgs,
}

/// "A,B": two node numbers.
fn parse_node_pair(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("'{s}' is not CLIENT,SERVER (e.g. 0,2)"))?;
    let n = |x: &str| x.trim().parse::<u32>().map_err(|e| format!("'{x}': {e}"));
    let (a, b) = (n(a)?, n(b)?);
    if a == b {
        return Err("the client and the server need different nodes".into());
    }
    Ok((a, b))
}

/// `--size`'s default, as parsed.
const DEFAULT_SIZES: [u32; 6] = [0, 4, 40, 400, 4096, 65536];

/// Iterations of `w` at `size` when --iters is not given.
fn default_iters(w: Workload, size: u32) -> u64 {
    match w {
        Workload::Pingpong | Workload::Pio => 5000,
        Workload::Stream => (256_000_000 / u64::from(size.max(1))).clamp(2000, 200_000),
        Workload::RdmaWrite | Workload::RdmaRead => {
            (512_000_000 / u64::from(size.max(1))).clamp(200, 100_000)
        }
        Workload::Tripwire => 2000,
        Workload::Dmq => 2000,
        Workload::Utlb => 20_000,
        Workload::Compare | Workload::Apps => 2000,
    }
}

/// Runs `ulnic bench`.
pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    if a.workload == Workload::Apps {
        return run_apps_host(&a);
    }
    // Sockets, shm files and the device of this run; removed when done.
    let scratch_dir = tempfile::Builder::new()
        .prefix("ulnic-bench-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("cannot make a scratch directory: {e}"))?;
    let scratch = scratch_dir.path().to_path_buf();
    let mut own = None;
    let dir = match &a.device_dir {
        Some(d) => d.clone(),
        None if (a.transport.contains(&Transport::Ulnic)
            || a.transport.contains(&Transport::Pio)
            || a.workload == Workload::Pio)
            && !in_guest(&a) =>
        {
            let config = Configuration::builder(Configuration::socket_paths(&scratch, 2))
                .max_endpoints((a.endpoints + 4).min(ulnic_abi::MAX_ENDPOINTS_LIMIT))
                .utlb_cache(a.utlb_cache.config())
                .build()?;
            own = Some(Device::start(config)?);
            scratch.clone()
        }
        None => scratch.clone(),
    };
    if a.workload == Workload::Compare {
        return run_compare(&a, &dir, &scratch);
    }
    if a.workload == Workload::Pio {
        return run_pio(&a, &dir, &scratch);
    }

    anyhow::ensure!(
        a.corrupt_at.is_none() || a.payload == Touch::WriteVerify,
        "--corrupt-at needs --payload write+verify: only a receiver that checks can catch the flipped byte"
    );
    if !a.json {
        print!("{}", record_header());
    }
    let failed = if a.workload.is_rdma() {
        run_rdma_bench(&a, &dir)
    } else {
        run_two_process(&a, &dir, &scratch)
    };
    drop(own);
    drop(scratch_dir);
    if failed {
        Err(anyhow::anyhow!("some benchmarks failed"))
    } else {
        Ok(())
    }
}

/// The workloads between two processes (ping-pong, stream): every size
/// over every transport, a line each. Returns whether something failed.
fn run_two_process(a: &BenchArgs, dir: &Path, scratch: &Path) -> bool {
    let mut failed = false;
    for &size in &a.size {
        for &t in &a.transport {
            let spec = Spec {
                workload: a.workload,
                transport: t,
                size,
                iters: a.iters.unwrap_or(default_iters(a.workload, size)),
                mode: a.mode,
                corrupt_at: a.corrupt_at,
                nodes: a.nodes,
                payload: a.payload,
                endpoints: a.endpoints,
                event_queue: a.event_queue,
            };
            let progress = !a.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
            if progress {
                eprint!("running {:?} over {:?}, {} bytes...\r", a.workload, t, size);
            }
            let result = run_one(&spec, dir, scratch);
            if progress {
                eprint!("{:60}\r", "");
            }
            match result {
                Ok(r) => print!("{}", record_line(&r, a.json)),
                Err(e) => {
                    failed = true;
                    eprintln!(
                        "ulnic: {:?} over {:?} at {} bytes failed: {e}",
                        a.workload, t, size
                    );
                }
            }
        }
    }
    failed
}

/// The human table's header: fabtests' columns (bytes, iters, total,
/// time, MB/s, usec/xfer, Mxfers/s), then the latency percentiles and how
/// payloads were touched.
pub fn record_header() -> String {
    let mut out = String::new();
    outln!(
        out,
        "{:<12} {:<6} {:<5} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9} {:>9} {:>9}  {}",
        "bench",
        "trans",
        "mode",
        "bytes",
        "iters",
        "total",
        "time",
        "MB/s",
        "usec/xfer",
        "Mxfers/s",
        "p50_us",
        "p95_us",
        "payload"
    );
    out
}

/// One result: a JSON object with `json`, else a row of the table.
pub fn record_line(r: &Record, json: bool) -> String {
    let mut out = String::new();
    if json {
        outln!(out, "{}", serde_json::to_string(r).unwrap_or_default());
        return out;
    }
    let total = f64::from(r.size) * r.iters as f64;
    let secs = r.seconds.unwrap_or(0.0);
    let per = |v: f64| if secs > 0.0 { v / secs } else { 0.0 };
    let mbps = r.mbytes_per_s.unwrap_or_else(|| per(total) / 1e6);
    let usec = |v: Option<u64>| {
        v.map(|ns| format!("{:.2}", ns as f64 / 1e3))
            .unwrap_or_default()
    };
    outln!(
        out,
        "{:<12} {:<6} {:<5} {:>8} {:>8} {:>8} {:>7.2}s {:>9.1} {:>10.2} {:>9.3} {:>9} {:>9}  {}",
        r.bench,
        r.transport,
        r.mode,
        r.size,
        r.iters,
        human_bytes(total),
        secs,
        mbps,
        if r.iters > 0 {
            secs * 1e6 / r.iters as f64
        } else {
            0.0
        },
        per(r.iters as f64) / 1e6,
        usec(r.median_ns),
        usec(r.p95_ns),
        r.payload.as_deref().unwrap_or("-"),
    );
    if let Some(d) = r.doorbells_per_op {
        // After the payload rule, so the columns before it keep their
        // places: a doorbell is an exit in a guest (docs/spec.md §5.8).
        out.pop();
        outln!(out, "  doorbells/op {d:.2}");
    }
    out
}

/// The one-process workloads (RDMA, tripwire, DMQ): per size, the ulnic
/// lines and their baseline from the same run. Returns whether something
/// failed.
fn run_rdma_bench(a: &BenchArgs, dir: &Path) -> bool {
    use crate::bench::rdma::{self as bench_rdma, Direction};
    // The message-size default means nothing here: each workload has its own.
    if a.workload == Workload::Utlb {
        return run_utlb_bench(a, dir);
    }
    let sizes: Vec<u32> = match a.workload {
        Workload::Tripwire => vec![8], // one word is written
        _ if a.size != DEFAULT_SIZES => a.size.clone(),
        Workload::Dmq => vec![8, 1024, 16384],
        _ => vec![4096, 16384, 65536, 262144, 1 << 20],
    };
    let pair = NodePair::of(dir, a.nodes);
    let mut failed = false;
    for size in sizes {
        let iters = a.iters.unwrap_or(default_iters(a.workload, size));
        let lines: std::io::Result<Vec<Record>> = match a.workload {
            Workload::Tripwire => bench_rdma::tripwire_line(iters, &pair)
                .and_then(|u| Ok(vec![u, bench_rdma::unix_wake_line(iters)?])),
            Workload::Dmq => bench_rdma::dmq_lines(size, iters, &pair),
            w if size == 0 || size > ulnic_abi::MAX_RDMA => Err(std::io::Error::other(format!(
                "{w:?} sizes are 1..={} bytes",
                ulnic_abi::MAX_RDMA
            ))),
            w => {
                let d = if w == Workload::RdmaWrite {
                    Direction::Write
                } else {
                    Direction::Read
                };
                bench_rdma::ulnic_line(d, size, iters, &pair)
                    .map(|u| vec![u, bench_rdma::memcpy_line(d, size, iters)])
            }
        };
        match lines {
            Ok(lines) => lines
                .iter()
                .for_each(|r| print!("{}", record_line(r, a.json))),
            Err(e) => {
                failed = true;
                eprintln!("ulnic: {:?} at {size} bytes: {e}", a.workload);
            }
        }
    }
    failed
}

/// `bench utlb`: the translation cost table, then the stress sweep;
/// inside a guest (its device file present, no --device-dir) through the
/// kernel driver, sender and receiver on this node.
fn run_utlb_bench(a: &BenchArgs, dir: &Path) -> bool {
    use crate::bench::utlb as bench_utlb;
    let pair = (!in_guest(a)).then(|| NodePair::of(dir, a.nodes));
    let mut failed = false;
    let mut report = |what: String, lines: std::io::Result<Vec<Record>>| match lines {
        Ok(lines) => lines
            .iter()
            .for_each(|r| print!("{}", record_line(r, a.json))),
        Err(e) => {
            failed = true;
            eprintln!("ulnic: utlb {what}: {e}");
        }
    };
    let iters = a.iters.unwrap_or(default_iters(Workload::Utlb, 0));
    for pages in [1, 4, 16] {
        report(
            format!("table, {pages} pages"),
            bench_utlb::table_lines(pages, iters, pair.as_ref()),
        );
    }
    let sizes = if a.size == DEFAULT_SIZES {
        vec![512, 2048]
    } else {
        a.size.clone()
    };
    for size in sizes {
        for &n in &a.buffers {
            report(
                format!("stress, {size} bytes from {n} buffers"),
                bench_utlb::stress_lines(size, n, a.utlb_entries, iters, pair.as_ref()),
            );
        }
    }
    failed
}

/// Whether `bench utlb` runs through this guest's kernel driver.
fn in_guest(a: &BenchArgs) -> bool {
    a.workload == Workload::Utlb
        && a.device_dir.is_none()
        && Path::new(&std::env::var_os("ULNIC_DEVICE").unwrap_or_else(|| "/dev/ulnic0".into()))
            .exists()
}

/// `ulnic bench compare`: ulnic against the baselines and Debian's peers.
/// `ulnic bench pio`: PIO windows beside the shm spin ring and ulnic
/// messages, a table (or JSON lines) of medians and PIO's ratios.
fn run_pio(a: &BenchArgs, dir: &Path, scratch: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(a.rounds > 0, "--rounds must be at least 1");
    let sizes = if a.size == DEFAULT_SIZES {
        vec![8]
    } else {
        a.size.clone()
    };
    let iters = a.iters.unwrap_or(default_iters(Workload::Pingpong, 8));
    let mut say = |s: &str| {
        if !a.json {
            eprintln!("{s}");
        }
    };
    if !a.json {
        println!(
            "{:<14} {:<6} {:>6} {:>7} {:>11} {:>9} {:>10}  payload",
            "transport", "mode", "size", "iters", "median us", "p95 us", "pio/this"
        );
    }
    for size in sizes {
        let rows =
            crate::bench::pio_rounds::compare(size, iters, a.rounds, dir, scratch, &mut say)?;
        for r in rows {
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{:<14} {:<6} {:>6} {:>7} {:>11.2} {:>9.2} {:>10.3}  {}",
                    format!("{:?}", r.transport).to_lowercase(),
                    format!("{:?}", r.mode).to_lowercase(),
                    r.size,
                    r.iters,
                    r.median_us,
                    r.p95_us,
                    r.pio_ratio,
                    r.payload
                );
            }
        }
    }
    if !a.json {
        println!(
            "(medians of {} interleaved rounds; pio/this is the median of the rounds' ratios to PIO waiting the same way: polling, a spin on the ring; blocking, a tripwire fired by the sender's PIO_SYNC)",
            a.rounds
        );
    }
    // CLAN's other PIO experiments: set-up costs (Table 4.1) and the
    // sender's cost per message by size (Fig. 3.5).
    say("set-up costs");
    let mut costs = crate::bench::pio_rounds::setup_costs(dir, 200)?;
    say("transmit costs");
    let sizes = [8, 64, 256, 1024, 4096, 16384, 65536];
    costs.extend(crate::bench::pio_rounds::transmit_costs(dir, &sizes, 2000)?);
    if !a.json {
        println!(
            "\n{:<9} {:<16} {:>6} {:>6} {:>11} {:>9}",
            "bench", "operation", "size", "iters", "median us", "p95 us"
        );
    }
    for c in costs {
        if a.json {
            println!("{}", serde_json::to_string(&c)?);
        } else {
            println!(
                "{:<9} {:<20} {:>6} {:>6} {:>11.2} {:>9.2}",
                c.bench, c.op, c.size, c.iters, c.median_us, c.p95_us
            );
        }
    }
    Ok(())
}

fn run_compare(a: &BenchArgs, dir: &Path, scratch: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(a.rounds > 0, "--rounds must be at least 1");
    // Without --size: 8-byte and 64 KiB round trips, 8-byte blocking
    // round trips and message rate, 64 KiB streams and RDMA writes (the
    // rows of the performance issue's table); with it, every section at
    // those sizes.
    let given = a.size != DEFAULT_SIZES;
    let sizes = |default: &[u32]| {
        if given {
            a.size.clone()
        } else {
            default.to_vec()
        }
    };
    // The endpoints section: round trips with thousands of endpoints open
    // on each node against one, on a device whose nodes have room for
    // them (or on the one given with --device-dir).
    let many = if a.endpoints > 1 {
        a.endpoints
    } else {
        ulnic_abi::MAX_ENDPOINTS_LIMIT
    };
    let mut _endpoints_device = None;
    let endpoints_dir = match &a.device_dir {
        Some(d) => d.clone(),
        None => {
            let d = scratch.join("endpoints");
            std::fs::create_dir_all(&d)?;
            let config = Configuration::builder(Configuration::socket_paths(&d, 2))
                .max_endpoints((many + 4).min(ulnic_abi::MAX_ENDPOINTS_LIMIT))
                .build()?;
            _endpoints_device = Some(Device::start(config)?);
            d
        }
    };
    let o = compare::Options {
        pingpong_sizes: sizes(&[8, 65536]),
        block_sizes: sizes(&[8]),
        stream_sizes: sizes(&[65536]),
        rate_sizes: sizes(&[8]),
        rdma_sizes: sizes(&[65536]),
        endpoint_sizes: sizes(&[8]),
        rounds: a.rounds,
        iters: a.iters.unwrap_or(2000),
        stream_iters: a.iters.unwrap_or(3000),
        rate_iters: a.iters.unwrap_or(100_000),
        touch: a.payload,
        endpoints: Some((many, endpoints_dir)),
        guests: a.guests,
        nodes: a.nodes,
    };
    let rows = compare::compare(&o, dir, scratch, &mut |l| eprintln!("{l}"))?;
    if a.json {
        return crate::print::print_json_lines(&rows);
    }
    print!("{}", compare_table(&rows, a.rounds));
    Ok(())
}

/// `bench compare`'s table.
fn compare_table(rows: &[Row], rounds: u32) -> String {
    let mut out = String::new();
    outln!(
        out,
        "compare: {} interleaved rounds; each figure the median of the rounds; ulnic/peer the median of each round's ratio",
        rounds
    );
    outln!(
        out,
        "{:<11} {:>6}  {:<21} {:<16} {:<7} {:>14}  {:>10}",
        "workload",
        "bytes",
        "peer",
        "payload",
        "stat",
        "figure",
        "ulnic/peer"
    );
    for r in rows {
        let figure = r.value.map_or("-".into(), |v| r.workload.show(v));
        let ratio = r.ulnic_ratio.map_or("-".into(), |x| format!("{x:.2}x"));
        let size = if r.workload == Kind::ClusterUp {
            "-".to_string()
        } else {
            r.size.to_string()
        };
        outln!(
            out,
            "{:<11} {:>6}  {:<21} {:<16} {:<7} {:>14}  {:>10}{}",
            r.workload.label(),
            size,
            r.peer,
            r.payload,
            r.statistic,
            figure,
            ratio,
            r.missing
                .as_ref()
                .map_or(String::new(), |m| format!("  missing: {m}"))
        );
    }
    outln!(out, "(pingpong, block-cpu, endpoints and vm-pingpong: ulnic/peer below 1 is ulnic ahead (endpoints: RTT with the many over RTT with one); stream, rate and rdma-write: above 1 is. block-cpu: user+system time of both peers and the device per round trip, warm-up and start-up included; cluster-up: seconds until every guest is ready, guest image cached)");
    out
}

/// `ulnic bench apps`: the programs between two host processes attached
/// to nodes 0 and 1 of a device this process starts, against loopback TCP.
fn run_apps_host(a: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.device_dir.is_none(),
        "bench apps starts its own device (one connection is one endpoint: redis-benchmark's \
         --clients need as many), so it takes no --device-dir"
    );
    anyhow::ensure!(
        !a.apps.apps.contains(&apps::App::Nginx),
        "bench apps --apps nginx runs only between guests (ulnic cluster bench apps --apps nginx): \
         nginx's workers are forked children, and under host attach a forked child cannot \
         accept connections (its parent's attachment holds the commands, docs/sockets.md §7)"
    );
    let scratch = tempfile::Builder::new().prefix("ulnic-apps-").tempdir()?;
    let nodes = apps::Attach::host_nodes(a.apps.apps.len(), a.apps.app_rounds);
    let sockets = Configuration::socket_paths(scratch.path(), nodes);
    let config = Configuration::builder(sockets.clone())
        .max_endpoints(apps_endpoints(&a.apps))
        .build()?;
    let device = Device::start(config)?;
    let quiet = a.json;
    let mut say = |l: &str| {
        if !quiet {
            eprintln!("{l}")
        }
    };
    let results = apps::run_local(&a.apps, &sockets, scratch.path(), &mut say);
    drop(device);
    let (results, wakes) = results?;
    let extra = serde_json::json!({"where": "host"});
    print!(
        "{}",
        apps_output(&results, Some(&wakes), &a.apps, &extra, a.json)
    );
    Ok(())
}

/// Endpoints a node needs for `bench apps`: one per connection (the
/// benchmark's, the servers' listeners, their accepted ones) with room
/// for connections still closing.
pub fn apps_endpoints(a: &AppsArgs) -> u32 {
    let most = a.concurrency.iter().copied().fold(a.clients, u32::max);
    (most.saturating_mul(2).saturating_add(64)).clamp(256, ulnic_abi::MAX_ENDPOINTS_LIMIT)
}

/// `bench apps`' results: a table of measurements and one of ratios, or
/// one JSON object per line (measurements, then ratios, each with the
/// fields of `extra` added) with `json`.
pub fn apps_output(
    results: &[AppResult],
    wakes: Option<&apps::Wakes>,
    a: &AppsArgs,
    extra: &serde_json::Value,
    json: bool,
) -> String {
    let rs = apps::ratios(results);
    let mut out = String::new();
    if json {
        let with = |mut v: serde_json::Value| {
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            v
        };
        for r in results {
            outln!(out, "{}", with(serde_json::to_value(r).unwrap_or_default()));
        }
        for r in &rs {
            outln!(out, "{}", with(serde_json::to_value(r).unwrap_or_default()));
        }
        if let Some(w) = wakes {
            let mut v = serde_json::to_value(w).unwrap_or_default();
            v["bench"] = "apps-wakes".into();
            outln!(out, "{}", with(v));
        }
        return out;
    }
    let opt = |v: Option<f64>, prec: usize| v.map(|x| format!("{x:.prec$}")).unwrap_or_default();
    outln!(
        out,
        "{:<9} {:<10} {:<6} {:>5} {:>11} {:>8} {:>10} {:>10} {:>10}",
        "app",
        "test",
        "trans",
        "round",
        "ops/s",
        "Gbit/s",
        "p50_us",
        "p99_us",
        "mean_us"
    );
    for r in results {
        outln!(
            out,
            "{:<9} {:<10} {:<6} {:>5} {:>11} {:>8} {:>10} {:>10} {:>10}",
            r.app.name(),
            r.test,
            r.transport,
            r.round,
            opt(r.ops_per_s, 0),
            opt(r.gbit_per_s, 2),
            opt(r.p50_us, 1),
            opt(r.p99_us, 1),
            opt(r.mean_us, 1)
        );
    }
    outln!(out);
    outln!(
        out,
        "{:<9} {:<10} {:<11} {:>11} {:>11} {:>7} {:>6}  result",
        "app",
        "test",
        "metric",
        "ulnic",
        "tcp",
        "ratio",
        "goal"
    );
    for r in &rs {
        outln!(
            out,
            "{:<9} {:<10} {:<11} {:>11.2} {:>11.2} {:>6.2}x {:>6}  {}",
            r.app.name(),
            r.test,
            r.metric,
            r.ulnic,
            r.tcp,
            r.ratio,
            r.goal,
            if r.goal == "-" {
                ""
            } else if r.met {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    outln!(
        out,
        "redis-benchmark: {} requests per test over {} connections; iperf3: one TCP stream for {} s; \
         sockperf: TCP ping-pong of 14-byte messages for {} s, full round trips; \
         memcached (memcaslap, 90 % get), nginx and lighttpd (ab, a 512-byte page): {} s at each of {:?} clients, \
         one request outstanding each, mean_us per request. \
         ulnic: the same binaries under LD_PRELOAD=libulnic_preload.so.",
        a.requests,
        a.clients,
        a.seconds,
        a.seconds,
        a.seconds,
        a.concurrency
    );
    if let Some(w) = wakes {
        outln!(
            out,
            "wake-ups under the layer ({} processes): notified {}, timer {}, found_by_timer {} (lost wake-ups; must be 0), unfed_looks {}",
            w.processes,
            w.notified,
            w.timer,
            w.found_by_timer,
            w.unfed_looks
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Cmd};
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let mut all = vec!["ulnic", "bench"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all)?.command {
            Cmd::Bench(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let a = parse(&["pingpong"]).unwrap();
        assert_eq!(a.workload, Workload::Pingpong);
        assert_eq!(
            a.transport,
            [
                Transport::Ulnic,
                Transport::Shm,
                Transport::Unix,
                Transport::Tcp
            ]
        );
        assert_eq!(a.size, DEFAULT_SIZES);
        assert_eq!(a.iters, None);
        assert_eq!(a.mode, Mode::Poll);
        assert_eq!(a.device_dir, None);
        assert_eq!(a.nodes, (0, 1));
        assert!(!a.json && !a.guests);
        assert_eq!(a.buffers, [64, 128, 256, 512, 1024]);
        assert_eq!(a.utlb_entries, 256);
        assert_eq!(a.corrupt_at, None);
        assert_eq!(a.payload, Touch::WriteVerify);
        assert_eq!(a.rounds, 5);
        assert_eq!(a.endpoints, 1);
        assert!(!a.event_queue);
        assert_eq!(
            a.utlb_cache.utlb_cache_entries,
            ulnic_abi::DEFAULT_UTLB_CACHE
        );
        assert_eq!(a.utlb_cache.utlb_cache_ways, 1);
        assert_eq!(a.apps.apps.len(), 3);
        assert_eq!(
            (
                a.apps.requests,
                a.apps.clients,
                a.apps.seconds,
                a.apps.app_rounds
            ),
            (20_000, 50, 5, 1)
        );
    }

    #[test]
    fn lists_and_values() {
        let a = parse(&[
            "stream",
            "--transport",
            "tcp,ulnic",
            "--size",
            "8,65536",
            "--iters",
            "7",
            "--mode",
            "block",
            "--payload",
            "none",
            "--endpoints",
            "4096",
            "--event-queue",
            "--json",
        ])
        .unwrap();
        assert!(a.event_queue);
        assert_eq!(a.transport, [Transport::Tcp, Transport::Ulnic]);
        assert_eq!(a.size, [8, 65536]);
        assert_eq!(a.iters, Some(7));
        assert_eq!(a.mode, Mode::Block);
        assert_eq!(a.payload, Touch::None);
        assert_eq!(a.endpoints, 4096);
        assert!(a.json);
    }

    #[test]
    fn node_pairs_need_a_device_dir() {
        let a = parse(&["pingpong", "--device-dir", "/tmp/u", "--nodes", "0,2"]).unwrap();
        assert_eq!(a.nodes, (0, 2));
        assert_eq!(a.device_dir.as_deref(), Some(Path::new("/tmp/u")));
        let a = parse(&["pingpong", "--device-dir", "/tmp/u", "--nodes", " 3, 1"]).unwrap();
        assert_eq!(a.nodes, (3, 1));
        let e = parse(&["pingpong", "--nodes", "0,2"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--device-dir <DIR>"), "{e}");
    }

    #[test]
    fn bad_node_pairs_say_why() {
        for (arg, why) in [
            ("2", "'2' is not CLIENT,SERVER (e.g. 0,2)"),
            ("1,1", "the client and the server need different nodes"),
            ("0,x", "'x': invalid digit found in string"),
        ] {
            let e = parse(&["pingpong", "--device-dir", "/d", "--nodes", arg]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
            assert!(e.to_string().contains(why), "{arg}: {e}");
        }
        assert_eq!(parse_node_pair("4,5"), Ok((4, 5)));
    }

    #[test]
    fn bad_values_fail() {
        use clap::error::ErrorKind::{InvalidValue, ValueValidation};
        for (args, kind) in [
            (&["pingpong", "--endpoints", "0"][..], ValueValidation),
            (&["pingpong", "--endpoints", "4097"], ValueValidation),
            (&["pingpong", "--transport", "rdma"], InvalidValue),
            (&["pingpong", "--payload", "verify"], InvalidValue),
            (&["pingpong", "--size", "8,x"], ValueValidation),
            (&["warp"], InvalidValue),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), kind, "{args:?}");
        }
        let e = parse(&["pingpong", "--endpoints", "4097"]).unwrap_err();
        assert!(e.to_string().contains("4097 is not in 1..=4096"), "{e}");
        let e = parse(&["pingpong", "--transport", "rdma"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("[possible values: ulnic, tcp, unix, shm, pio]"),
            "{e}"
        );
    }

    #[test]
    fn iterations_by_workload_and_size() {
        assert_eq!(default_iters(Workload::Pingpong, 65536), 5000);
        assert_eq!(default_iters(Workload::Stream, 0), 200_000);
        assert_eq!(default_iters(Workload::Stream, 65536), 3906);
        assert_eq!(default_iters(Workload::Stream, 1 << 20), 2000);
        assert_eq!(default_iters(Workload::RdmaWrite, 4096), 100_000);
        assert_eq!(default_iters(Workload::RdmaRead, 1 << 20), 488);
        assert_eq!(default_iters(Workload::Utlb, 0), 20_000);
    }

    fn record() -> Record {
        Record {
            bench: "pingpong".into(),
            transport: "ulnic".into(),
            size: 40,
            iters: 5000,
            mode: "poll".into(),
            median_ns: Some(1234),
            p95_ns: Some(2500),
            seconds: Some(0.5),
            payload: Some("write+verify".into()),
            ..Record::default()
        }
    }

    #[test]
    fn record_rows_line_up_under_the_header() {
        assert_eq!(
            record_header(),
            "bench        trans  mode     bytes    iters    total     time      MB/s  usec/xfer  Mxfers/s    p50_us    p95_us  payload\n"
        );
        assert_eq!(
            record_line(&record(), false),
            "pingpong     ulnic  poll        40     5000     195k    0.50s       0.4     100.00     0.010      1.23      2.50  write+verify\n"
        );
        // A stream line gives its own MB/s; no latencies, no time.
        let r = Record {
            bench: "stream".into(),
            transport: "tcp".into(),
            size: 65536,
            iters: 0,
            mode: "block".into(),
            mbytes_per_s: Some(1500.25),
            ..Record::default()
        };
        assert_eq!(
            record_line(&r, false),
            "stream       tcp    block    65536        0        0    0.00s    1500.2       0.00     0.000                      -\n"
        );
    }

    #[test]
    fn record_json_is_one_line() {
        let line = record_line(&record(), true);
        assert!(line.ends_with("}\n") && line.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["bench"], "pingpong");
        assert_eq!(v["median_ns"], 1234);
        assert!(v.get("mbytes_per_s").is_none());
    }

    #[test]
    fn compare_rows() {
        let rows = [
            Row {
                workload: Kind::Pingpong,
                size: 8,
                peer: "ulnic".into(),
                payload: "write+verify",
                statistic: "median",
                rounds: vec![2.0, 2.5],
                value: Some(2.25),
                ulnic_ratio: None,
                missing: None,
            },
            Row {
                workload: Kind::ClusterUp,
                size: 2,
                peer: "fi_pingpong tcp".into(),
                payload: "none",
                statistic: "mean",
                rounds: vec![],
                value: None,
                ulnic_ratio: Some(0.5),
                missing: Some("not installed".into()),
            },
        ];
        let t = compare_table(&rows, 3);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("compare: 3 interleaved rounds;"));
        assert_eq!(
            lines[1],
            "workload     bytes  peer                  payload          stat            figure  ulnic/peer"
        );
        assert_eq!(
            lines[2],
            "pingpong         8  ulnic                 write+verify     median     2.25 us RTT           -"
        );
        assert_eq!(
            lines[3],
            "cluster-up       -  fi_pingpong tcp       none             mean                 -       0.50x  missing: not installed"
        );
    }

    fn app_result(transport: &str, ops: f64, p50: f64) -> AppResult {
        AppResult {
            bench: "apps".into(),
            app: apps::App::Redis,
            test: "GET".into(),
            transport: transport.into(),
            round: 0,
            ops_per_s: Some(ops),
            gbit_per_s: None,
            p50_us: Some(p50),
            p99_us: Some(p50 * 2.0),
            mean_us: None,
        }
    }

    #[test]
    fn apps_tables() {
        let a = parse(&["apps"]).unwrap().apps;
        let results = [
            app_result("ulnic", 90000.0, 20.0),
            app_result("tcp", 30000.0, 50.0),
        ];
        let t = apps_output(&results, None, &a, &serde_json::json!({}), false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[..3],
            [
                "app       test       trans  round       ops/s   Gbit/s     p50_us     p99_us    mean_us",
                "redis     GET        ulnic      0       90000                20.0       40.0           ",
                "redis     GET        tcp        0       30000                50.0      100.0           ",
            ]
        );
        assert_eq!(lines[3], "");
        assert_eq!(
            lines[4],
            "app       test       metric            ulnic         tcp   ratio   goal  result"
        );
        assert_eq!(
            lines[5],
            "redis     GET        ops/s          90000.00    30000.00   3.00x   >= 2  met"
        );
        assert!(lines
            .last()
            .unwrap()
            .starts_with("redis-benchmark: 20000 requests per test over 50 connections;"));
    }

    #[test]
    fn apps_json_carries_the_extra_fields() {
        let a = parse(&["apps"]).unwrap().apps;
        let results = [
            app_result("ulnic", 90000.0, 20.0),
            app_result("tcp", 30000.0, 50.0),
        ];
        let wakes = apps::Wakes {
            processes: 2,
            notified: 10,
            ..Default::default()
        };
        let out = apps_output(
            &results,
            Some(&wakes),
            &a,
            &serde_json::json!({"where": "host"}),
            true,
        );
        let rows: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows[0]["transport"], "ulnic");
        assert_eq!(rows[1]["transport"], "tcp");
        assert!(rows.iter().all(|r| r["where"] == "host"));
        assert_eq!(rows[2]["bench"], "apps-ratio");
        assert_eq!(rows[2]["ratio"], 3.0);
        let last = rows.last().unwrap();
        assert_eq!(
            (&last["bench"], &last["found_by_timer"], &last["processes"]),
            (&"apps-wakes".into(), &0.into(), &2.into())
        );
    }

    #[test]
    fn apps_endpoints_cover_the_connections() {
        let mut a = parse(&["apps"]).unwrap().apps;
        assert_eq!(apps_endpoints(&a), 256);
        a.clients = 500;
        assert_eq!(apps_endpoints(&a), 1064);
        a.clients = 5000;
        assert_eq!(apps_endpoints(&a), ulnic_abi::MAX_ENDPOINTS_LIMIT);
    }
}
