//! `ulnic cluster`: clusters of QEMU guests joined by one ulnic device.
//! The persistent cluster (`up`, `exec`, `put`, `reboot`,
//! `stall-control`, `restart-device`, `status`, `down`, and the hidden
//! `supervise`) over `crate::cluster`'s supervisor and client; the
//! one-shot runs (`run`, and `bench` with its result table, pairs of
//! guests or `apps`) over `crate::cluster::run`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bench::apps::{AppResult, AppsArgs};
use crate::bench::{Mode, Record, Workload};
use crate::cluster::client;
use crate::cluster::supervisor::{self, state_dir, SuperviseArgs};
use crate::cluster::{shell_join, Accel, RunOptions};
use crate::commands::bench::{apps_endpoints, apps_output, record_header, record_line};
use crate::commands::ExitStatus;
use crate::print::outln;

/// `ulnic cluster`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ClusterCmd {
    /// Boot N guests on one device and keep them running (a supervisor
    /// process holds them) until `ulnic cluster down`.
    ///
    /// Each guest has a ulnic node and a virtio-net NIC on a private
    /// segment (no uplink; node i is 10.81.0.(i+1)/24 there, and has IPv6
    /// link-local addresses too); console logs are kept per node
    /// in the cluster's directory (shown by `status`).
    ///
    /// Examples:
    ///   ulnic cluster up --nodes 3
    ///   ulnic cluster exec all -- 'ulnic selftest'
    ///   ulnic cluster down
    #[command(verbatim_doc_comment)]
    Up {
        #[command(flatten)]
        opts: ClusterOpts,
        #[command(flatten)]
        name: ClusterName,
        /// Print the cluster's status as JSON when it is up.
        #[arg(long)]
        json: bool,
    },
    /// Run a shell command on one guest or all, with its output streamed
    /// (prefixed by node when several) and its exit status returned (with
    /// several nodes: the first non-zero). ULNIC_NODE and ULNIC_NODES are
    /// set. Ctrl-C kills the command in the guest.
    ///
    /// With --detach the command becomes a background job: exec returns at
    /// once with the job's number, the command keeps running (in its own
    /// process group), and its output goes to a log on the host that
    /// `cluster status` names, with the job's state. `cluster kill JOB`
    /// signals it. Run daemons in the foreground (`nginx -g 'daemon off;'`,
    /// `sshd -D`): one that forks away into its own session leaves the job
    /// (which then ends) and `cluster kill` cannot reach it.
    ///
    /// Examples:
    ///   ulnic cluster exec 1 -- ulnic recv --port 5
    ///   ulnic cluster exec all -- 'echo $ULNIC_NODE; uname -r'
    ///   ulnic cluster exec --detach 1 -- nginx -g 'daemon off;'
    #[command(verbatim_doc_comment)]
    Exec {
        /// A node number, or `all`.
        target: String,
        #[command(flatten)]
        name: ClusterName,
        /// Start it as a background job and return.
        #[arg(long)]
        detach: bool,
        /// The command (a shell command line; words are joined).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Copy a file into guests (e.g. your own program; it runs with the
    /// guest's libc, the one `ulnic` uses, or link it statically).
    ///
    /// Example: ulnic cluster put all ./target/release/my-app /bin/my-app
    Put {
        /// A node number, or `all`.
        target: String,
        /// The local file.
        local: PathBuf,
        /// Where it goes in the guest (default: /bin/<file name>).
        remote: Option<String>,
        #[command(flatten)]
        name: ClusterName,
    },
    /// Reset one guest (like pressing its reset button) and wait until it
    /// is ready again. Its ulnic node is reset: its endpoints go, their
    /// close messages are sent; the other guests keep running.
    Reboot {
        /// The node.
        node: u32,
        #[command(flatten)]
        name: ClusterName,
        /// Seconds to wait for the guest.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Stop the cluster's device and start a new one while the guests run
    /// (as after a device crash). Each guest's NIC is unplugged and plugged
    /// again over QMP: its driver sees the old NIC removed, so what was open
    /// fails with ENODEV (the library says "the ulnic device went away")
    /// and blocked waiters wake; new endpoints work at once, without a
    /// reboot.
    ///
    /// Examples:
    ///   ulnic cluster restart-device
    ///   ulnic cluster restart-device --name ci --json
    #[command(verbatim_doc_comment)]
    RestartDevice {
        #[command(flatten)]
        name: ClusterName,
        /// Seconds to wait for every guest to reconnect.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make one guest's NIC stop answering control commands (`on`), or
    /// answer them again (`off`): an injected fault, to see how drivers and
    /// programs cope with a device that hangs. Commands wait in the queue;
    /// data, doorbells and the other nodes go on. The Linux driver gives up
    /// on a command after 10 s (ETIMEDOUT) and then fails every later one
    /// with EIO until the device is plugged again (`restart-device`).
    ///
    /// Examples:
    ///   ulnic cluster stall-control 1 on
    ///   ulnic cluster stall-control 1 off
    #[command(verbatim_doc_comment)]
    StallControl {
        /// The node.
        node: u32,
        /// `on` stalls the control queue, `off` serves it again (commands
        /// that waited run then).
        #[arg(value_parser = ["on", "off"])]
        state: String,
        #[command(flatten)]
        name: ClusterName,
    },
    /// Pause one guest (QEMU `stop`): its vCPUs stop, and QEMU stops its
    /// NIC's rings. The device cannot tell that from a reset of the guest,
    /// so it forgets the node's endpoints (peers get their close
    /// messages); on `resume` it tells the guest's driver, and every
    /// program on that guest gets ENODEV ("the ulnic device went away")
    /// from the endpoints it had; new ones work (docs/spec.md §2.5). Exec,
    /// put, reboot and restart-device refuse a paused guest.
    ///
    /// Examples:
    ///   ulnic cluster pause 1
    ///   ulnic cluster resume 1
    #[command(verbatim_doc_comment)]
    Pause {
        /// The node.
        node: u32,
        #[command(flatten)]
        name: ClusterName,
    },
    /// Resume a guest `pause` stopped (QEMU `cont`).
    Resume {
        /// The node.
        node: u32,
        #[command(flatten)]
        name: ClusterName,
    },
    /// Show the guests' state, boot times and console logs, and the
    /// background jobs (`exec --detach`) with their state and logs.
    Status {
        #[command(flatten)]
        name: ClusterName,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a signal to a background job (`cluster exec --detach`): to
    /// its whole process group in the guest.
    ///
    /// Examples:
    ///   ulnic cluster kill 3
    ///   ulnic cluster kill 3 --signal KILL
    #[command(verbatim_doc_comment)]
    Kill {
        /// The job's number (`cluster status` lists them).
        job: u32,
        /// A signal name (TERM, KILL, INT, HUP, QUIT, USR1, USR2) or number.
        #[arg(long, default_value = "TERM", value_parser = parse_signal)]
        signal: i32,
        #[command(flatten)]
        name: ClusterName,
    },
    /// Stop every guest, the device and the supervisor.
    Down {
        #[command(flatten)]
        name: ClusterName,
    },
    /// The supervisor process (started by `cluster up`).
    #[command(hide = true)]
    Supervise(SuperviseArgs),
    /// Boot N guests on one device, run CMD on every node (with ULNIC_NODE
    /// and ULNIC_NODES set), stream its output, tear down; exit non-zero if
    /// any node failed.
    ///
    /// Examples:
    ///   ulnic cluster run --nodes 2 -- ulnic selftest
    ///   ulnic cluster run --nodes 2 -- 'echo node $ULNIC_NODE of $ULNIC_NODES'
    #[command(verbatim_doc_comment)]
    Run {
        #[command(flatten)]
        opts: ClusterOpts,
        /// The command (a shell command line; words are joined).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Ping-pong, stream or RDMA writes between processes on pairs of
    /// guests, over ulnic and over kernel TCP on the guests' virtio-net
    /// link. Every node takes part: nodes 0 and 1, 2 and 3, ... run at
    /// once, the even node of each pair the client (an odd last node sits
    /// out); each result line names its pair.
    ///
    /// rdma-write: the odd node exports, the even one writes and the odd
    /// one checks every byte that landed; its TCP baseline is a stream of
    /// the same sizes.
    ///
    /// Examples:
    ///   ulnic cluster bench pingpong --size 8 --json
    ///   ulnic cluster bench pingpong --nodes 8 --size 4096
    ///   ulnic cluster bench rdma-write --size 65536 --iters 200
    Bench(ClusterBenchArgs),
}

/// `--name`.
#[derive(clap::Args, Debug)]
pub struct ClusterName {
    /// Which cluster (several may be up at once).
    #[arg(long, default_value = "default")]
    pub name: String,
}

/// How a cluster is made: `up`, `run` and `bench` take these.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterOpts {
    /// Number of guests.
    #[arg(long, default_value_t = 2)]
    pub nodes: u32,
    /// Accelerator: auto probes whether KVM really runs a guest here.
    #[arg(long, value_enum, default_value = "auto")]
    pub accel: Accel,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 512)]
    pub memory: u32,
    /// Seconds before the run is abandoned.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Endpoints per guest NIC, 1 to 4096 (each ulnic socket, and each
    /// process's library context, uses one or more).
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_ENDPOINTS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(ulnic_abi::MAX_ENDPOINTS_LIMIT)))]
    pub endpoints: u32,
    /// Microseconds the device's engine keeps polling the guests' send
    /// rings after its last work before it sleeps and asks their drivers
    /// for doorbells (MMIO writes, each an exit; docs/spec.md §5.8). 0:
    /// every send rings the doorbell and nothing polls between messages.
    /// Default 200, except 0 for `cluster bench --mode poll`: polling pays
    /// while a core is spare (guests that block), and costs the guests
    /// their cores when their programs busy-poll on a host with no core
    /// to spare (measured under TCG on 2 cores: an 8-byte round trip of
    /// 0.19 ms polled against 0.26 ms rung when the guests block, 4 ms
    /// against 0.02-0.03 ms when they poll).
    #[arg(long, value_name = "US")]
    pub poll_us: Option<u64>,
    /// Device processes to spread the guests' NICs over: more than 1 is a
    /// star fabric (one switch per device, nodes in contiguous blocks)
    /// of `ulnic device` processes joined over loopback UDP with a fresh
    /// key, as `ulnic fabric up` makes (docs/spec.md §10.7). A cluster
    /// up this way cannot `restart-device`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub devices: u32,
    #[command(flatten)]
    pub fabric: crate::cluster::fabric::FabricArgs,
    /// Debian (bookworm) packages to add to the guests, with the shared
    /// libraries their programs need; fetched once into the cache. Parts
    /// of the same program come whole (packages built from the same
    /// source, and what a metapackage stands for, config files included);
    /// from other dependencies only libraries (no maintainer scripts run:
    /// users they would create do not exist; Debian's static users, such
    /// as www-data and nobody, do).
    /// Example: --packages redis-server,redis-tools,iperf3,sockperf
    #[arg(long, value_delimiter = ',', value_name = "PKG,...")]
    pub packages: Vec<String>,
    /// A host directory to copy into the guests: HOST_DIR[:GUEST_DIR]
    /// (default /opt/<its name>). May be given more than once.
    #[arg(long = "add", value_name = "HOST_DIR[:GUEST_DIR]")]
    pub add: Vec<String>,
}

/// `ulnic cluster bench`'s options.
#[derive(clap::Args, Debug)]
pub struct ClusterBenchArgs {
    /// Workload.
    #[arg(value_enum)]
    pub workload: Workload,
    #[command(flatten)]
    pub opts: ClusterOpts,
    /// Message sizes.
    #[arg(long, value_delimiter = ',', default_value = "8")]
    pub size: Vec<u32>,
    /// Iterations per size.
    #[arg(long, default_value_t = 2000)]
    pub iters: u64,
    /// How ulnic receivers wait: block (in the driver; halted vCPUs
    /// leave the cores to others, best under TCG) or poll.
    #[arg(long, value_enum, default_value = "block")]
    pub mode: Mode,
    /// Print the JSON result lines only.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub apps: AppsArgs,
}

/// Runs `ulnic cluster ...`.
pub fn run(c: ClusterCmd) -> anyhow::Result<()> {
    match c {
        ClusterCmd::Up { opts, name, json } => up(&opts, &name.name, json),
        ClusterCmd::Exec {
            target,
            name,
            detach: false,
            command,
        } => exec(&name.name, &target, &shell_join(&command)?),
        ClusterCmd::Exec {
            target,
            name,
            detach: true,
            command,
        } => detach(&name.name, &target, &shell_join(&command)?),
        ClusterCmd::Kill { job, signal, name } => {
            client::signal_job(&state_dir(&name.name), job, signal)?;
            eprintln!("job {job}: sent signal {signal}");
            Ok(())
        }
        ClusterCmd::Put {
            target,
            local,
            remote,
            name,
        } => put(&name.name, &target, &local, remote),
        ClusterCmd::Reboot {
            node,
            name,
            timeout,
        } => {
            let dir = state_dir(&name.name);
            eprintln!("[node {node}] resetting");
            let s = client::reboot(&dir, node, Duration::from_secs(timeout))?;
            eprintln!("[node {node}] ready again after {s:.1} s");
            Ok(())
        }
        ClusterCmd::StallControl { node, state, name } => {
            let stalled = state == "on";
            client::stall_control(&state_dir(&name.name), node, stalled)?;
            eprintln!(
                "[node {node}] control queue {}",
                if stalled { "stalled" } else { "served again" }
            );
            Ok(())
        }
        ClusterCmd::Pause { node, name } => {
            client::pause(&state_dir(&name.name), node, true)?;
            eprintln!("[node {node}] paused");
            Ok(())
        }
        ClusterCmd::Resume { node, name } => {
            client::pause(&state_dir(&name.name), node, false)?;
            eprintln!("[node {node}] resumed");
            Ok(())
        }
        ClusterCmd::RestartDevice {
            name,
            timeout,
            json,
        } => restart_device(&name.name, timeout, json),
        ClusterCmd::Status { name, json } => status(&name.name, json),
        ClusterCmd::Down { name } => {
            client::down(&state_dir(&name.name))?;
            eprintln!("cluster '{}' is down", name.name);
            Ok(())
        }
        ClusterCmd::Supervise(a) => supervisor::supervise(&a),
        ClusterCmd::Run { opts, command } => {
            run_on_guests(&opts, &shell_join(&command)?, false).map(|_| ())
        }
        ClusterCmd::Bench(a) if a.workload == Workload::Apps => {
            bench_apps(&a.opts, &a.apps, a.json)
        }
        ClusterCmd::Bench(a) => bench(&a),
    }
}

/// `cluster up`.
fn up(o: &ClusterOpts, name: &str, json: bool) -> anyhow::Result<()> {
    let dir = state_dir(name);
    let image = cluster_image(o, &mut |l| eprintln!("{l}"))?;
    let accel = crate::cluster::choose_accel(&image, o.accel, &mut |l| eprintln!("{l}"));
    let args = SuperviseArgs {
        dir: dir.clone(),
        nodes: o.nodes,
        accel: accel.into(),
        memory: o.memory,
        endpoints: o.endpoints,
        poll_us: o.poll_us(),
        devices: o.devices,
        fabric: o.fabric.resolved(o.nodes)?,
    };
    eprintln!("cluster '{name}': booting {} guests ({accel})", o.nodes);
    let status = client::up(
        &dir,
        &image,
        &args,
        Duration::from_secs(o.timeout),
        &mut |l| eprintln!("{l}"),
    )?;
    if json {
        println!("{}", serde_json::to_string(&status)?);
    } else {
        eprintln!(
            "cluster '{name}' is up: {} nodes ({accel}); logs in {}\n  ulnic cluster exec all -- CMD    run a command\n  ulnic cluster put all FILE       copy a program in\n  ulnic cluster down               stop it",
            o.nodes,
            dir.display()
        );
    }
    Ok(())
}

/// `cluster exec`: fails with the first non-zero remote status (255 for
/// a node that could not run it), as ssh does.
fn exec(name: &str, target: &str, command: &str) -> anyhow::Result<()> {
    let dir = state_dir(name);
    let nodes = client::nodes_of(&dir, target)?;
    let results = client::exec(&dir, &nodes, command);
    let mut code = 0;
    for (n, r) in results {
        match r {
            Ok(0) => {}
            Ok(c) => {
                if nodes.len() > 1 {
                    eprintln!("[node {n}] exit {c}");
                }
                if code == 0 {
                    code = c;
                }
            }
            Err(e) => {
                eprintln!("[node {n}] {e}");
                if code == 0 {
                    code = 255;
                }
            }
        }
    }
    if code != 0 {
        // The remote status, like ssh (clamped into an exit code).
        return Err(ExitStatus(code.clamp(1, 255) as u8).into());
    }
    Ok(())
}

/// `cluster exec --detach`: one job per node, each named with its log.
fn detach(name: &str, target: &str, command: &str) -> anyhow::Result<()> {
    let dir = state_dir(name);
    for n in client::nodes_of(&dir, target)? {
        let j = client::start_job(&dir, n, command)?;
        eprintln!(
            "[node {n}] job {} started; output in {}",
            j.job,
            j.log.display()
        );
    }
    Ok(())
}

/// A signal by name (with or without SIG) or number.
fn parse_signal(s: &str) -> Result<i32, String> {
    if let Ok(n) = s.parse::<i32>() {
        return if (1..=64).contains(&n) {
            Ok(n)
        } else {
            Err(format!("no signal {n}"))
        };
    }
    let name = s.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    [
        ("TERM", libc::SIGTERM),
        ("KILL", libc::SIGKILL),
        ("INT", libc::SIGINT),
        ("HUP", libc::SIGHUP),
        ("QUIT", libc::SIGQUIT),
        ("USR1", libc::SIGUSR1),
        ("USR2", libc::SIGUSR2),
        ("STOP", libc::SIGSTOP),
        ("CONT", libc::SIGCONT),
    ]
    .iter()
    .find(|(n, _)| *n == name)
    .map(|&(_, v)| v)
    .ok_or_else(|| {
        format!(
            "unknown signal '{s}' (TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT or a number)"
        )
    })
}

/// `cluster put`.
fn put(name: &str, target: &str, local: &Path, remote: Option<String>) -> anyhow::Result<()> {
    let dir = state_dir(name);
    let remote = match remote {
        Some(r) => r,
        None => format!(
            "/bin/{}",
            local
                .file_name()
                .ok_or_else(|| anyhow::anyhow!("the local path names no file"))?
                .to_string_lossy()
        ),
    };
    for n in client::nodes_of(&dir, target)? {
        client::put(&dir, n, local, &remote)?;
        eprintln!("[node {n}] {} -> {remote}", local.display());
    }
    Ok(())
}

/// `cluster restart-device`.
fn restart_device(name: &str, timeout: u64, json: bool) -> anyhow::Result<()> {
    let r = client::restart_device(&state_dir(name), Duration::from_secs(timeout))?;
    if json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        eprintln!(
            "device restarted: stopped in {:.2} s, {} guest(s) reconnected after {:.2} s",
            r.stopped_seconds,
            r.nodes.len(),
            r.reconnected_seconds
        );
    }
    Ok(())
}

/// `cluster status`.
fn status(name: &str, json: bool) -> anyhow::Result<()> {
    let s = supervisor::status(&state_dir(name))?;
    if json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    print!("{}", status_table(name, &s));
    Ok(())
}

/// `cluster status`'s lines: the cluster, then a line per node.
fn status_table(name: &str, s: &crate::cluster::protocol::ClusterStatus) -> String {
    let mut out = String::new();
    outln!(out, "cluster '{name}' ({}), {}", s.accel, s.dir.display());
    if !s.fabric.is_empty() {
        outln!(out, "  fabric: {}", s.fabric);
    }
    for n in &s.nodes {
        outln!(
            out,
            "  node {}: {}{}{}  boots {}  log {}",
            n.node,
            n.state,
            n.boot_seconds
                .map(|b| format!(" (booted in {b:.1} s)"))
                .unwrap_or_default(),
            n.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default(),
            n.boots,
            n.console_log.display()
        );
    }
    for j in &s.jobs {
        outln!(
            out,
            "  job {} on node {}: {} after {:.0} s  log {}\n    {}",
            j.job,
            j.node,
            j.state,
            j.seconds,
            j.log.display(),
            j.command
        );
    }
    out
}

/// The guests' image: the base one, with the packages and host
/// directories `o` asks for unpacked after it.
fn cluster_image(
    o: &ClusterOpts,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<ulnic_images::Image> {
    let tools = crate::commands::image::image_tools();
    let provider = tools
        .iter()
        .any(|t| t.ends_with(ulnic_images::FABRIC_PROVIDER));
    let wants_fabric = o
        .packages
        .iter()
        .any(|p| p.contains("libfabric") || p.contains("openmpi"));
    if wants_fabric && !provider {
        // Not built by default (its bindings need libclang): say so
        // before the guests boot without it.
        say(&format!(
            "[!] the libfabric provider ({}) is not built beside this program: the guests' \
             libfabric has no ulnic provider. Build it with `cargo build --release -p ulnic-fabric` \
             (needs: apt-get install libfabric-dev libclang-dev)",
            ulnic_images::FABRIC_PROVIDER
        ));
    }
    let r = ulnic_images::build(false, &tools, say)?;
    let mut pieces = Vec::new();
    if !o.packages.is_empty() {
        say(&format!("[+] packages: {}", o.packages.join(", ")));
        pieces.push(ulnic_images::packages(&o.packages, say)?);
    }
    for a in &o.add {
        let (host, guest) = add_dirs(a)?;
        anyhow::ensure!(
            host.is_dir(),
            "--add {a}: {} is not a directory",
            host.display()
        );
        say(&format!("[+] {} -> {guest}", host.display()));
        pieces.push(ulnic_images::directory_piece(&host, &guest)?);
    }
    Ok(ulnic_images::with_pieces(&r.image, &pieces)?)
}

/// `--add HOST_DIR[:GUEST_DIR]`: the host directory and where it goes
/// (default /opt/<its name>).
fn add_dirs(a: &str) -> anyhow::Result<(PathBuf, String)> {
    Ok(match a.split_once(':') {
        Some((h, g)) => (PathBuf::from(h), g.to_string()),
        None => {
            let h = PathBuf::from(a);
            let name = h
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .ok_or_else(|| anyhow::anyhow!("--add {a}: name a directory"))?;
            (h, format!("/opt/{name}"))
        }
    })
}

/// Runs `command` on a cluster (`cluster run`); returns each node's
/// output lines.
fn run_on_guests(o: &ClusterOpts, command: &str, quiet: bool) -> anyhow::Result<Vec<Vec<String>>> {
    let mut outputs: Vec<Vec<String>> = vec![Vec::new(); o.nodes as usize];
    let mut say = |l: &str| {
        if let Some((n, text)) = node_line(l) {
            if let Some(v) = outputs.get_mut(n) {
                v.push(text.to_string());
            }
        }
        if !quiet {
            eprintln!("{l}");
        }
    };
    let image = cluster_image(o, &mut |l| {
        if !quiet {
            eprintln!("{l}")
        }
    })?;
    let opts = RunOptions {
        nodes: o.nodes,
        accel: o.accel,
        memory_mb: o.memory,
        timeout: Duration::from_secs(o.timeout),
        endpoints: o.endpoints,
        poll_us: o.poll_us(),
        devices: o.devices,
        fabric: o.fabric.clone(),
    };
    let results = crate::cluster::run(&opts, &image, command, &mut say)?;
    let mut failed = 0;
    for r in &results {
        match &r.error {
            None => eprintln!(
                "[node {}] exit 0 (booted in {:.1} s)",
                r.node,
                r.boot_seconds.unwrap_or(0.0)
            ),
            Some(e) => {
                failed += 1;
                eprintln!(
                    "[node {}] FAILED: {e}\n  full console log: {}",
                    r.node,
                    r.console_log.display()
                );
            }
        }
    }
    if failed > 0 {
        return Err(anyhow::anyhow!(
            "{failed} of {} nodes failed",
            results.len()
        ));
    }
    Ok(outputs)
}

/// A node's output line, `[node N] TEXT`: N and TEXT.
fn node_line(l: &str) -> Option<(usize, &str)> {
    let (n, text) = l.strip_prefix("[node ")?.split_once("] ")?;
    Some((n.parse().ok()?, text))
}

impl ClusterOpts {
    /// The device's idle period in microseconds: `--poll-us`, or the
    /// device's default.
    pub fn poll_us(&self) -> u64 {
        self.poll_us
            .unwrap_or(ulnic_device::config::DEFAULT_POLL_US)
    }
}

/// `cluster bench` of a workload between pairs of guests.
fn bench(a: &ClusterBenchArgs) -> anyhow::Result<()> {
    let mut o = a.opts.clone();
    if a.mode == Mode::Poll && o.poll_us.is_none() {
        // Busy-polling guests leave the engine no core to poll with: each
        // message rings instead (`--poll-us`'s help has the figures).
        o.poll_us = Some(0);
        eprintln!(
            "cluster bench: --mode poll: the device polls no send ring between messages (--poll-us 0); each send rings its doorbell"
        );
    }
    let o = &o;
    if o.nodes < 2 {
        return Err(anyhow::anyhow!(
            "a cluster benchmark needs --nodes 2 or more (nodes pair up: 0 with 1, 2 with 3, ...)"
        ));
    }
    // Every node takes part: pairs (0, 1), (2, 3), ... run at once, each
    // even node the client of the odd one after it.
    let pairs = o.nodes / 2;
    if !matches!(
        a.workload,
        Workload::Pingpong | Workload::Stream | Workload::RdmaWrite
    ) {
        return Err(anyhow::anyhow!(
            "cluster bench runs pingpong, stream and rdma-write between guests, not {:?}",
            a.workload
        ));
    }
    // PIO windows join nodes of one device process only (spec §6.2).
    let pio = o.devices == 1;
    if !pio && a.workload == Workload::Pingpong {
        eprintln!(
            "cluster bench: no PIO leg: the guests' NICs are on {} device processes, which share no memory",
            o.devices
        );
    }
    let script = bench_script(a.workload, &a.size, a.iters, a.mode, pairs, pio);
    let outputs = run_on_guests(o, &script, a.json)?;
    if !a.json {
        print!("{}", record_header());
    }
    for (pair, lines) in outputs.iter().step_by(2).take(pairs as usize).enumerate() {
        if !a.json && pairs > 1 {
            println!("node {} -> node {}:", pair * 2, pair * 2 + 1);
        }
        for line in lines {
            let Some(rec) = line.strip_prefix("RESULT ") else {
                continue;
            };
            let r: Record = serde_json::from_str(rec)?;
            if a.json {
                let mut v = pair_json(&r, pair, pairs, o.devices)?;
                v["fabric"] = o.fabric.describe(o.devices).into();
                v["poll_us"] = o.poll_us().into();
                println!("{v}");
            } else {
                print!("{}", record_line(&r, false));
            }
        }
    }
    Ok(())
}

/// The script every guest of `cluster bench` runs: same VMs, same sizes,
/// ulnic through the device, then kernel TCP over the virtio-net segment.
/// The script rides on the kernel command line, so one shell function `b`
/// holds what every line shares: the even node of a pair is the client,
/// its server the next node; a last odd node sits out. Each leg is named
/// on the console as it starts (the command's own output comes through a
/// pipe, in one piece at the end), so a run that hangs shows where.
fn bench_script(
    w: Workload,
    sizes: &[u32],
    iters: u64,
    mode: Mode,
    pairs: u32,
    pio: bool,
) -> String {
    let m = format!("{mode:?}").to_lowercase();
    let mut script = format!(
        "set -e\nP=$((ULNIC_NODE+1)); Q=$((ULNIC_NODE-1))\n\
         b() {{ echo \"ulnic-guest: leg $* at $(cut -d' ' -f1 /proc/uptime)\" >/dev/console; if [ $ULNIC_NODE -ge {last} ]; then :; \
         elif [ $((ULNIC_NODE%2)) = 0 ]; then ulnic bench-peer --role client --workload $1 --transport $2 --size $3 --iters {iters} --mode $6 --at $4 --peer-node $P; \
         else ulnic bench-peer --role server --workload $1 --transport $2 --size $3 --iters {iters} --mode $6 --at $5 --peer-node $Q >/dev/null; fi; }}\n",
        last = pairs * 2
    );
    let wl = clap::ValueEnum::to_possible_value(&w)
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    // Round trips also through PIO windows (plain stores into BAR 4):
    // polling on the ring, and, when the others block, sleeping on a
    // tripwire the sender's PIO_SYNC fires.
    let mut legs: Vec<(&str, &str, &str, &str)> = vec![("ulnic", "device", "device", &m)];
    if w == Workload::Pingpong && pio {
        legs.push(("pio", "device", "device", "poll"));
        if mode == Mode::Block {
            legs.push(("pio", "device", "device", "block"));
        }
    }
    legs.push(("tcp", "node=$P", "listen", &m));
    for s in sizes {
        for &(t, client_at, server_at, leg_mode) in &legs {
            // RDMA's baseline is a TCP stream of the same buffers.
            let wl = if t == "tcp" && w == Workload::RdmaWrite {
                "stream"
            } else {
                &wl
            };
            script.push_str(&format!(
                "b {wl} {t} {s} {client_at} {server_at} {leg_mode}\n"
            ));
        }
    }
    script
}

/// A guest pair's result as `cluster bench --json` prints it: the record
/// with where it ran.
fn pair_json(
    r: &Record,
    pair: usize,
    pairs: u32,
    devices: u32,
) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(r)?;
    v["where"] = "guests".into();
    v["pair"] = pair.into();
    v["pairs"] = pairs.into();
    v["devices"] = devices.into();
    Ok(v)
}

/// `ulnic cluster bench apps`: node 1 serves, node 0 runs the clients;
/// the guests get the programs' packages.
fn bench_apps(o: &ClusterOpts, a: &AppsArgs, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        o.nodes >= 2,
        "cluster bench apps needs --nodes 2 or more (node 1 serves, node 0 runs the clients)"
    );
    let mut o = o.clone();
    for p in a.apps.iter().flat_map(|app| app.packages()) {
        if !o.packages.iter().any(|q| q == p) {
            o.packages.push(p.to_string());
        }
    }
    let need = apps_endpoints(a);
    if o.endpoints < need {
        if !json {
            eprintln!(
                "ulnic: bench apps gives each guest {need} endpoints (one per connection), not {}",
                o.endpoints
            );
        }
        o.endpoints = need;
    }
    let args = apps_peer_args(a);
    let script = format!(
        "case $ULNIC_NODE in
         0) ulnic apps-peer --role client --peer-node 1 {args};;
         1) ulnic apps-peer --role server --peer-node 0 {args};;
         esac
"
    );
    let outputs = run_on_guests(&o, &script, json)?;
    let mut results = Vec::new();
    let mut wakes = None;
    for line in outputs.first().into_iter().flatten() {
        if let Some(rec) = line.strip_prefix("RESULT ") {
            results.push(serde_json::from_str::<AppResult>(rec)?);
        } else if let Some(rec) = line.strip_prefix("WAKES ") {
            wakes = Some(serde_json::from_str::<crate::bench::apps::Wakes>(rec)?);
        }
    }
    anyhow::ensure!(!results.is_empty(), "node 0 reported no results");
    let extra = serde_json::json!({"where": "guests", "nodes": [0, 1]});
    print!("{}", apps_output(&results, wakes.as_ref(), a, &extra, json));
    Ok(())
}

/// The apps options again, as `ulnic apps-peer` takes them.
fn apps_peer_args(a: &AppsArgs) -> String {
    let names: Vec<String> = a
        .apps
        .iter()
        .filter_map(|x| clap::ValueEnum::to_possible_value(x).map(|v| v.get_name().to_string()))
        .collect();
    format!(
        "--apps {} --requests {} --clients {} --seconds {} --app-rounds {} --concurrency {}",
        names.join(","),
        a.requests,
        a.clients,
        a.seconds,
        a.app_rounds,
        a.concurrency
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};
    use crate::cluster::protocol::{ClusterStatus, NodeState, NodeStatus};
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<ClusterCmd, clap::Error> {
        let mut all = vec!["cluster"];
        all.extend_from_slice(args);
        match try_parse(&all)? {
            Cmd::Cluster(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn up_defaults() {
        let ClusterCmd::Up { opts, name, json } = parse(&["up"]).unwrap() else {
            panic!()
        };
        assert_eq!(name.name, "default");
        assert!(!json);
        assert_eq!(
            (opts.nodes, opts.accel, opts.memory, opts.timeout),
            (2, Accel::Auto, 512, 600)
        );
        assert_eq!(opts.endpoints, ulnic_device::config::DEFAULT_ENDPOINTS);
        assert_eq!(opts.devices, 1);
        assert!(opts.packages.is_empty() && opts.add.is_empty());
        assert_eq!(opts.poll_us, None);
        assert_eq!(opts.poll_us(), 200, "the device's own default");
    }

    #[test]
    fn up_options() {
        let ClusterCmd::Up { opts, name, json } = parse(&[
            "up",
            "--nodes",
            "3",
            "--accel",
            "tcg",
            "--name",
            "ci",
            "--devices",
            "2",
            "--packages",
            "redis-server,iperf3",
            "--add",
            "/a",
            "--add",
            "/b:/opt/b",
            "--poll-us",
            "0",
            "--json",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(opts.poll_us(), 0);
        assert_eq!((opts.nodes, opts.accel, opts.devices), (3, Accel::Tcg, 2));
        assert_eq!(name.name, "ci");
        assert!(json);
        assert_eq!(opts.packages, ["redis-server", "iperf3"]);
        assert_eq!(opts.add, ["/a", "/b:/opt/b"]);
    }

    #[test]
    fn bad_cluster_options_fail() {
        for (args, kind) in [
            (&["up", "--devices", "0"][..], ErrorKind::ValueValidation),
            (&["up", "--devices", "65"], ErrorKind::ValueValidation),
            (&["up", "--endpoints", "4097"], ErrorKind::ValueValidation),
            (&["up", "--accel", "hvf"], ErrorKind::InvalidValue),
            (&["stall-control", "1", "maybe"], ErrorKind::InvalidValue),
            (&["reboot"], ErrorKind::MissingRequiredArgument),
            (&["exec", "1"], ErrorKind::MissingRequiredArgument),
            (&["run", "--nodes", "2"], ErrorKind::MissingRequiredArgument),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), kind, "{args:?}: {e}");
        }
        let e = parse(&["up", "--devices", "65"]).unwrap_err();
        assert!(e.to_string().contains("65 is not in 1..=64"), "{e}");
    }

    #[test]
    fn exec_takes_the_command_after_dashes() {
        let ClusterCmd::Exec {
            target,
            name,
            command,
            detach,
        } = parse(&["exec", "all", "--name", "ci", "--", "echo", "$ULNIC_NODE"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((target.as_str(), name.name.as_str()), ("all", "ci"));
        assert!(!detach);
        assert_eq!(command, ["echo", "$ULNIC_NODE"]);
        // Flags after `--` are the command's.
        let ClusterCmd::Run { opts, command } =
            parse(&["run", "--nodes", "4", "--", "ulnic", "selftest", "--json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(opts.nodes, 4);
        assert_eq!(command, ["ulnic", "selftest", "--json"]);
    }

    #[test]
    fn small_commands() {
        let ClusterCmd::Put {
            target,
            local,
            remote,
            name,
        } = parse(&["put", "0", "./my-app"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((target.as_str(), name.name.as_str()), ("0", "default"));
        assert_eq!((local, remote), (PathBuf::from("./my-app"), None));
        let ClusterCmd::Reboot { node, timeout, .. } = parse(&["reboot", "1"]).unwrap() else {
            panic!()
        };
        assert_eq!((node, timeout), (1, 300));
        let ClusterCmd::RestartDevice { timeout, json, .. } =
            parse(&["restart-device", "--json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((timeout, json), (60, true));
        let ClusterCmd::StallControl { node, state, .. } =
            parse(&["stall-control", "2", "off"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((node, state.as_str()), (2, "off"));
        assert!(matches!(
            parse(&["status", "--json"]).unwrap(),
            ClusterCmd::Status { json: true, .. }
        ));
        let ClusterCmd::Kill { job, signal, .. } = parse(&["kill", "3"]).unwrap() else {
            panic!()
        };
        assert_eq!((job, signal), (3, libc::SIGTERM));
        let ClusterCmd::Kill { signal, .. } = parse(&["kill", "3", "--signal", "sigkill"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(signal, libc::SIGKILL);
        assert!(parse(&["kill", "3", "--signal", "FLY"]).is_err());
        assert!(parse(&["kill", "3", "--signal", "99"]).is_err());
        let ClusterCmd::Exec {
            detach, command, ..
        } = parse(&["exec", "--detach", "1", "--", "sleep", "9"]).unwrap()
        else {
            panic!()
        };
        assert!(detach);
        assert_eq!(command, ["sleep", "9"]);
        assert!(matches!(
            parse(&["down", "--name", "x"]).unwrap(),
            ClusterCmd::Down { name } if name.name == "x"
        ));
    }

    #[test]
    fn bench_options() {
        let ClusterCmd::Bench(a) = parse(&["bench", "pingpong"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.workload, Workload::Pingpong);
        assert_eq!((a.size, a.iters, a.mode), (vec![8], 2000, Mode::Block));
        assert_eq!(a.opts.nodes, 2);
        let ClusterCmd::Bench(a) = parse(&[
            "bench",
            "rdma-write",
            "--size",
            "4096,65536",
            "--nodes",
            "8",
            "--mode",
            "poll",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(a.workload, Workload::RdmaWrite);
        assert_eq!(
            (a.size, a.opts.nodes, a.mode),
            (vec![4096, 65536], 8, Mode::Poll)
        );
    }

    #[test]
    fn the_bench_script_pairs_nodes() {
        let s = bench_script(Workload::RdmaWrite, &[8, 4096], 200, Mode::Block, 2, true);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "set -e");
        assert_eq!(lines[1], "P=$((ULNIC_NODE+1)); Q=$((ULNIC_NODE-1))");
        assert!(lines[2].starts_with(
            "b() { echo \"ulnic-guest: leg $* at $(cut -d' ' -f1 /proc/uptime)\" >/dev/console; \
             if [ $ULNIC_NODE -ge 4 ]; then :; "
        ));
        assert!(lines[2].contains(
            "then ulnic bench-peer --role client --workload $1 --transport $2 --size $3 \
             --iters 200 --mode $6 --at $4 --peer-node $P; else"
        ));
        assert!(lines[2].ends_with("--peer-node $Q >/dev/null; fi; }"));
        assert_eq!(
            lines[3..],
            [
                "b rdma-write ulnic 8 device device block",
                "b stream tcp 8 node=$P listen block",
                "b rdma-write ulnic 4096 device device block",
                "b stream tcp 4096 node=$P listen block",
            ]
        );
        // A ping-pong adds PIO: polling, and blocking on tripwires when
        // the others block.
        let s = bench_script(Workload::Pingpong, &[8], 9, Mode::Block, 1, true);
        assert_eq!(
            s.lines().skip(3).collect::<Vec<_>>(),
            [
                "b pingpong ulnic 8 device device block",
                "b pingpong pio 8 device device poll",
                "b pingpong pio 8 device device block",
                "b pingpong tcp 8 node=$P listen block",
            ]
        );
    }

    /// What the script's `b` runs parses as `ulnic bench-peer`.
    #[test]
    fn the_bench_script_speaks_bench_peer() {
        let s = bench_script(Workload::Pingpong, &[8], 7, Mode::Poll, 1, true);
        let call = s
            .split("then ulnic ")
            .nth(1)
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .replace("$1", "pingpong")
            .replace("$2", "ulnic")
            .replace("$3", "8")
            .replace("$4", "device")
            .replace("$6", "poll")
            .replace("$P", "1");
        let words: Vec<&str> = call.split_whitespace().collect();
        let Cmd::BenchPeer(p) = try_parse(&words).unwrap() else {
            panic!("{call}")
        };
        assert_eq!((p.role.as_str(), p.size, p.iters), ("client", 8, 7));
        assert_eq!((p.workload, p.mode), (Workload::Pingpong, Mode::Poll));
        assert_eq!((p.at.as_str(), p.peer_node), ("device", Some(1)));
    }

    #[test]
    fn apps_peers_get_the_same_options() {
        let ClusterCmd::Bench(a) = parse(&[
            "bench",
            "apps",
            "--apps",
            "redis,sockperf",
            "--clients",
            "8",
        ])
        .unwrap() else {
            panic!()
        };
        let args = apps_peer_args(&a.apps);
        assert_eq!(
            args,
            "--apps redis,sockperf --requests 20000 --clients 8 --seconds 5 --app-rounds 1 --concurrency 1,20"
        );
        let mut words = vec!["apps-peer", "--role", "server", "--peer-node", "0"];
        words.extend(args.split(' '));
        let Cmd::AppsPeer(p) = try_parse(&words).unwrap() else {
            panic!()
        };
        assert_eq!(p.apps.apps, a.apps.apps);
        assert_eq!(p.apps.clients, 8);
    }

    #[test]
    fn node_lines() {
        assert_eq!(node_line("[node 3] RESULT {}"), Some((3, "RESULT {}")));
        assert_eq!(node_line("[node x] hello"), None);
        assert_eq!(node_line("[node 3]no space"), None);
        assert_eq!(node_line("booting"), None);
    }

    #[test]
    fn add_puts_directories_under_opt() {
        assert_eq!(
            add_dirs("/srv/data").unwrap(),
            (PathBuf::from("/srv/data"), "/opt/data".to_string())
        );
        assert_eq!(
            add_dirs("./x:/usr/share/x").unwrap(),
            (PathBuf::from("./x"), "/usr/share/x".to_string())
        );
        assert_eq!(
            add_dirs("/").unwrap_err().to_string(),
            "--add /: name a directory"
        );
    }

    #[test]
    fn pair_results_say_where() {
        let r = Record {
            bench: "pingpong".into(),
            transport: "tcp".into(),
            ..Record::default()
        };
        let v = pair_json(&r, 1, 2, 1).unwrap();
        assert_eq!(v["bench"], "pingpong");
        assert_eq!(
            (&v["where"], &v["pair"], &v["pairs"], &v["devices"]),
            (
                &serde_json::json!("guests"),
                &serde_json::json!(1),
                &serde_json::json!(2),
                &serde_json::json!(1)
            )
        );
    }

    #[test]
    fn status_lines() {
        let s = ClusterStatus {
            dir: "/run/ulnic/ci".into(),
            accel: "tcg".into(),
            pid: 42,
            fabric: "topology two-switches.toml".into(),
            nodes: vec![
                NodeStatus {
                    node: 0,
                    state: NodeState::Ready,
                    boot_seconds: Some(4.56),
                    boots: 1,
                    reason: None,
                    console_log: "/run/ulnic/ci/node0.console.log".into(),
                },
                NodeStatus {
                    node: 1,
                    state: NodeState::Stopped,
                    boot_seconds: None,
                    boots: 2,
                    reason: Some("QEMU exited".into()),
                    console_log: "/run/ulnic/ci/node1.console.log".into(),
                },
            ],
            jobs: vec![crate::cluster::protocol::JobStatus {
                job: 1,
                node: 0,
                command: "nginx -g 'daemon off;'".into(),
                state: crate::cluster::protocol::JobState::Running,
                seconds: 12.4,
                log: "/run/ulnic/ci/jobs/job1-node0.log".into(),
            }],
        };
        assert_eq!(
            status_table("ci", &s),
            "cluster 'ci' (tcg), /run/ulnic/ci\n\
             \x20 fabric: topology two-switches.toml\n\
             \x20 node 0: ready (booted in 4.6 s)  boots 1  log /run/ulnic/ci/node0.console.log\n\
             \x20 node 1: stopped: QEMU exited  boots 2  log /run/ulnic/ci/node1.console.log\n\
             \x20 job 1 on node 0: running after 12 s  log /run/ulnic/ci/jobs/job1-node0.log\n\
             \x20   nginx -g 'daemon off;'\n"
        );
    }
}
