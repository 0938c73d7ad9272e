//! A persistent cluster: `ulnic cluster up` starts a supervisor process
//! that holds the device, the VDE segment and the QEMU guests, and serves
//! `exec`, `put`, `reboot`, `status` and `down` requests on a Unix socket
//! in the cluster's state directory. Commands reach the guests through the
//! guest agent (see `agent`), files too; a reboot is a QMP `system_reset`.
//!
//! Client protocol: one JSON request line, answered with frames (the agent's
//! framing): STDOUT/STDERR bytes, INFO JSON, and finally EXIT or ERROR.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use ulnic_images::vm::{self, VmConfig};
use ulnic_images::Image;

use super::agent::{kind, read_frame, write_frame, Frame};
use super::jobs::Jobs;
use super::protocol::{ClusterStatus, DeviceRestarted, NodeState, NodeStatus, Rebooted, Request};
use crate::fabric::launch::NodeSettings;
use ulnic_device::{Configuration, Device};

/// Where cluster `name` keeps its sockets and logs.
pub fn state_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            std::env::temp_dir().join(format!("ulnic-{uid}"))
        });
    base.join("ulnic-clusters").join(name)
}

fn control_socket(dir: &Path) -> PathBuf {
    dir.join("control.sock")
}

/// Lifecycle of one guest.
#[derive(Debug, Clone)]
enum Phase {
    Booting(Instant),
    Ready {
        boot_seconds: f64,
    },
    Stopped(String),
    /// Paused by `cluster pause` (resumed, it is ready again).
    Paused {
        boot_seconds: f64,
    },
}

struct Slot {
    phase: Phase,
    qemu_pid: u32,
    boots: u32,
}

/// The supervisor's shared state.
struct Sup {
    dir: PathBuf,
    accel: String,
    slots: Mutex<Vec<Slot>>,
    changed: Condvar,
    /// Open streams: id -> (node, where the agent's frames for it go).
    routes: Mutex<HashMap<u32, (u32, mpsc::Sender<Frame>)>>,
    next_id: AtomicU32,
    /// Write side of each node's agent channel, once connected.
    agents: Vec<Mutex<Option<UnixStream>>>,
    stopping: AtomicBool,
    /// The device, and how to start it again (`cluster restart-device`);
    /// `None` with `--devices` above 1.
    device: Mutex<Option<Device>>,
    device_config: Configuration,
    /// `FabricArgs::describe`, for `status`.
    fabric: String,
    /// With `--devices` above 1: the device processes (a star fabric over
    /// loopback UDP), stopped with the supervisor.
    members: Option<crate::fabric::launch::LocalMembers>,
    /// Each guest's VM configuration (to plug its NIC again).
    vms: Mutex<Vec<VmConfig>>,
    /// Background jobs (`cluster exec --detach`).
    jobs: Arc<Jobs>,
}

/// Options of the supervisor process (`ulnic cluster supervise`).
#[derive(Debug, Clone, clap::Args)]
pub struct SuperviseArgs {
    /// State directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// Number of guests.
    #[arg(long)]
    pub nodes: u32,
    /// Accelerator already chosen: kvm or tcg.
    #[arg(long)]
    pub accel: String,
    /// Guest RAM in MiB.
    #[arg(long)]
    pub memory: u32,
    /// Endpoints per node.
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_ENDPOINTS)]
    pub endpoints: u32,
    /// The engine's idle period in microseconds (the device's `--poll-us`).
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_POLL_US)]
    pub poll_us: u64,
    /// Device processes the guests' NICs are spread over (1: one device
    /// in the supervisor).
    #[arg(long, default_value_t = 1)]
    pub devices: u32,
    /// The fabric the guests sit behind.
    #[command(flatten)]
    pub fabric: super::fabric::FabricArgs,
}

impl Sup {
    fn set_phase(&self, n: u32, phase: Phase) {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = s.get_mut(n as usize) {
            if matches!(phase, Phase::Booting(_)) {
                slot.boots += 1;
            }
            slot.phase = phase;
        }
        self.changed.notify_all();
    }

    /// Counts a boot nobody asked for (the guest rebooted itself) and
    /// returns its time: since the device last saw node `n` reset.
    fn rebooted_itself(&self, n: u32) -> f64 {
        if let Some(slot) = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(n as usize)
        {
            slot.boots += 1;
        }
        let reset = self
            .device
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|d| d.shard_of(n).last_reset(n));
        reset.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    fn phase(&self, n: u32) -> Option<Phase> {
        let s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.get(n as usize).map(|slot| slot.phase.clone())
    }

    /// Ends every open stream of node `n` with an error.
    fn fail_routes(&self, n: u32, why: &str) {
        let mut r = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|&id, (node, tx)| {
            if *node == n {
                let _ = tx.send(Frame::new(kind::ERROR, id, why));
                false
            } else {
                true
            }
        });
    }

    fn to_agent(&self, n: u32, f: &Frame) -> anyhow::Result<()> {
        let mut g = self.agents[n as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let s = g
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("node {n}: agent not connected"))?;
        write_frame(s, f).map_err(|e| anyhow::anyhow!("node {n}: agent channel: {e}"))
    }

    fn status(&self) -> ClusterStatus {
        let s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let nodes = s
            .iter()
            .enumerate()
            .map(|(n, slot)| {
                let (state, boot_seconds, reason) = match &slot.phase {
                    Phase::Booting(_) => (NodeState::Booting, None, None),
                    Phase::Ready { boot_seconds } => (NodeState::Ready, Some(*boot_seconds), None),
                    Phase::Stopped(why) => (NodeState::Stopped, None, Some(why.clone())),
                    Phase::Paused { boot_seconds } => {
                        (NodeState::Paused, Some(*boot_seconds), None)
                    }
                };
                NodeStatus {
                    node: n as u32,
                    state,
                    boot_seconds,
                    boots: slot.boots,
                    reason,
                    console_log: self.dir.join(format!("node{n}.console.log")),
                }
            })
            .collect();
        ClusterStatus {
            dir: self.dir.clone(),
            accel: self.accel.clone(),
            pid: std::process::id(),
            fabric: self.fabric.clone(),
            nodes,
            jobs: self.jobs.status(),
        }
    }
}

/// Runs the supervisor (the detached process `cluster up` starts) until a
/// `down` request.
pub fn supervise(a: &SuperviseArgs) -> anyhow::Result<()> {
    let image: Image = serde_json::from_slice(
        &std::fs::read(a.dir.join("image.json")).map_err(|e| anyhow::anyhow!("image.json: {e}"))?,
    )
    .map_err(|e| anyhow::anyhow!("image.json: {e}"))?;
    let sockets = a.fabric.sockets(&a.dir, a.nodes)?;
    let settings = NodeSettings {
        endpoints: a.endpoints,
        poll_us: a.poll_us,
    };
    let config = super::fabric::configuration(&sockets, &settings, &a.fabric)?;
    eprintln!("supervisor: fabric: {}", a.fabric.describe(a.devices));
    let (device, members) = if a.devices > 1 {
        let (_, m) =
            super::fabric::start_devices(&a.dir, &sockets, a.devices, &settings, &a.fabric)?;
        for member in m.iter().flat_map(|m| &m.members) {
            eprintln!(
                "supervisor: device {} at {} serves nodes {:?}",
                member.name, member.address, member.nodes
            );
        }
        (None, m)
    } else {
        (Some(Device::start(config.clone())?), None)
    };
    let _switch = super::start_segment(&image, &a.dir.join("segment"))?;
    // Clients wait for the path: it appears once the socket listens.
    let listener = crate::control::listen_in_place(&control_socket(&a.dir))?;
    let sup = Arc::new(Sup {
        dir: a.dir.clone(),
        accel: a.accel.clone(),
        slots: Mutex::new(Vec::new()),
        changed: Condvar::new(),
        routes: Mutex::new(HashMap::new()),
        next_id: AtomicU32::new(1),
        agents: (0..a.nodes).map(|_| Mutex::new(None)).collect(),
        stopping: AtomicBool::new(false),
        device: Mutex::new(device),
        device_config: config,
        fabric: a.fabric.describe(a.devices),
        members,
        vms: Mutex::new(Vec::new()),
        jobs: Arc::new(Jobs::new(&a.dir)),
    });
    for n in 0..a.nodes {
        let cfg = VmConfig {
            memory_mb: a.memory,
            ulnic_socket: Some(sockets[n as usize].clone()),
            // The NIC is hotplugged, so restart-device can plug it again.
            ulnic_hotplug: true,
            accel: a.accel.clone(),
            append: format!("ulnic.node={n} ulnic.nodes={} ulnic.agent", a.nodes),
            vde: Some((a.dir.join("segment"), n)),
            agent_socket: Some(a.dir.join(format!("node{n}.agent"))),
            qmp_socket: Some(a.dir.join(format!("node{n}.qmp"))),
            allow_reboot: true,
        };
        let mut cmd = vm::command(&image, &cfg);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; the guest dies with the
        // supervisor (this thread, the main one, lives until exit).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start QEMU: {e}"))?;
        if let Err(e) = plug_nic(&sup, n, &cfg, false) {
            let _ = child.kill();
            return Err(e);
        }
        sup.vms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(cfg.clone());
        sup.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Slot {
                phase: Phase::Booting(Instant::now()),
                qemu_pid: child.id(),
                boots: 1,
            });
        watch_guest(&sup, n, child);
        let s = sup.clone();
        std::thread::spawn(move || agent_link(&s, n));
    }
    eprintln!("supervisor: {} guests starting ({})", a.nodes, a.accel);
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let s = sup.clone();
        // The process ends in the `down` request's own thread, once it
        // has answered: leaving this loop when `stopping` is seen would
        // end it first (the test command once caught `cluster down`
        // failing with "failed to fill whole buffer" that way).
        std::thread::spawn(move || {
            if let Err(e) = serve_client(&s, conn) {
                eprintln!("supervisor: request failed: {e}");
            }
        });
    }
    Ok(())
}

/// Logs a guest's console and marks it stopped when QEMU exits.
fn watch_guest(sup: &Arc<Sup>, n: u32, mut child: Child) {
    let log_path = sup.dir.join(format!("node{n}.console.log"));
    let log = Arc::new(Mutex::new(std::fs::File::create(&log_path).ok()));
    let streams: Vec<Box<dyn Read + Send>> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as _),
    ]
    .into_iter()
    .flatten()
    .collect();
    // QEMU keeps a guest it stopped for an error paused, not exited: it
    // is killed here, so the node is not left "booting" until a timeout.
    let stopped_by: Arc<Mutex<Option<&'static str>>> = Arc::default();
    let pid = child.id();
    for s in streams {
        let (log, stopped_by) = (log.clone(), stopped_by.clone());
        std::thread::spawn(move || {
            for l in BufReader::new(s).lines().map_while(Result::ok) {
                if let Some(f) = log.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                    let _ = writeln!(f, "{l}");
                }
                if let Some(why) = vm::guest_stopped_by(&l) {
                    stopped_by
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(why);
                    // SAFETY: kill(2) on a QEMU this process started; it
                    // stays alive (paused) after that line, so it is not
                    // reaped yet and the pid is still its own.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
            }
        });
    }
    let sup = sup.clone();
    std::thread::spawn(move || {
        let status = child.wait();
        let stopped = *stopped_by.lock().unwrap_or_else(|p| p.into_inner());
        let why = match (stopped, status) {
            (Some(why), _) => why.to_string(),
            (None, Ok(s)) => format!("QEMU exited ({s})"),
            (None, Err(e)) => format!("QEMU lost: {e}"),
        };
        if !sup.stopping.load(Ordering::Acquire) {
            eprintln!("supervisor: node {n}: {why}");
        }
        sup.fail_routes(n, &why);
        sup.set_phase(n, Phase::Stopped(why));
    });
}

/// Connects to node `n`'s agent channel (QEMU listens) and dispatches what
/// the agent sends: READY marks the node booted, the rest goes to streams.
fn agent_link(sup: &Arc<Sup>, n: u32) {
    let path = sup.dir.join(format!("node{n}.agent"));
    let mut stream = loop {
        if matches!(sup.phase(n), Some(Phase::Stopped(_))) || sup.stopping.load(Ordering::Acquire) {
            return;
        }
        match UnixStream::connect(&path) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    if let Ok(w) = stream.try_clone() {
        *sup.agents[n as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(w);
    }
    loop {
        let f = match read_frame(&mut stream) {
            Ok(f) => f,
            Err(e) => {
                if !sup.stopping.load(Ordering::Acquire) {
                    eprintln!("supervisor: node {n}: agent channel closed: {e}");
                }
                return;
            }
        };
        if f.kind == kind::READY {
            let boot_seconds = match sup.phase(n) {
                Some(Phase::Booting(t)) => t.elapsed().as_secs_f64(),
                // The guest rebooted on its own: a boot, timed from when
                // the device saw its node reset.
                _ => sup.rebooted_itself(n),
            };
            // Streams from before a reboot cannot finish any more.
            sup.fail_routes(n, "the guest rebooted");
            eprintln!("supervisor: node {n}: ready after {boot_seconds:.1} s");
            sup.set_phase(n, Phase::Ready { boot_seconds });
            continue;
        }
        let mut routes = sup.routes.lock().unwrap_or_else(|p| p.into_inner());
        let last = matches!(f.kind, kind::EXIT | kind::ERROR);
        if let Some((_, tx)) = routes.get(&f.id) {
            let _ = tx.send(f.clone());
        }
        if last {
            routes.remove(&f.id);
        }
    }
}

fn reply(w: &mut UnixStream, kind: u8, data: impl Into<Vec<u8>>) -> std::io::Result<()> {
    write_frame(w, &Frame::new(kind, 0, data))
}

/// The device control protocol (`crate::control`) for the device this
/// supervisor runs, from request `first` on: each request holds the
/// device while it is answered, so a restart waits for it; a capture,
/// which would hold it until the client hangs up, is refused.
fn serve_device_control(
    sup: &Arc<Sup>,
    first: &str,
    rd: BufReader<UnixStream>,
    mut conn: UnixStream,
) -> anyhow::Result<()> {
    use crate::control::{answer, reply, Request as DeviceRequest};
    let lines = std::iter::once(Ok(first.to_string())).chain(rd.lines());
    for line in lines {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let req: DeviceRequest = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                reply(&mut conn, Err(anyhow::anyhow!("bad request: {e}")))?;
                continue;
            }
        };
        if matches!(req, DeviceRequest::Capture { .. }) {
            let why = "this cluster's device runs inside its supervisor, which does not \
                       stream captures: start the cluster with --devices 2 (each device \
                       process has a control socket of its own) or capture an `ulnic device`";
            reply(&mut conn, Err(anyhow::anyhow!(why)))?;
            continue;
        }
        let device = sup.device.lock().unwrap_or_else(|p| p.into_inner());
        match device.as_ref() {
            Some(d) => answer(d, req, &mut conn)?,
            None => reply(
                &mut conn,
                Err(anyhow::anyhow!(
                    "this cluster's devices are separate processes (--devices): \
                     name one with --member"
                )),
            )?,
        }
    }
    Ok(())
}

fn serve_client(sup: &Arc<Sup>, mut conn: UnixStream) -> anyhow::Result<()> {
    let mut rd = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    rd.read_line(&mut line)?;
    let req: Request = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(_) if serde_json::from_str::<crate::control::Request>(&line).is_ok() => {
            // `ulnic stats` (or `fabric set`, `fabric map`) given this
            // directory: the device this supervisor runs answers.
            return serve_device_control(sup, &line, rd, conn);
        }
        Err(e) => {
            let msg = format!("bad request: {e}");
            let _ = reply(&mut conn, kind::ERROR, msg.clone());
            return Err(anyhow::anyhow!(msg));
        }
    };
    let node = req.node();
    let nodes = sup.agents.len() as u32;
    // Tells the client why, and ends its request with that error.
    let err = |conn: &mut UnixStream, msg: String| {
        let _ = reply(conn, kind::ERROR, msg.clone());
        Err::<(), anyhow::Error>(anyhow::anyhow!(msg))
    };
    if let Some(n) = node {
        if n >= nodes {
            return err(
                &mut conn,
                format!("no node {n}: the cluster has nodes 0..{}", nodes - 1),
            );
        }
    }
    match req {
        Request::Status => {
            let status = serde_json::to_string(&sup.status())?;
            reply(&mut conn, kind::INFO, status).map_err(anyhow::Error::from)
        }
        Request::Exec { node: n, .. } | Request::Put { node: n, .. } => {
            if let Err(e) = serve_stream(sup, &mut conn, &mut rd, &req, n) {
                return err(&mut conn, format!("{e:#}"));
            }
            Ok(())
        }
        Request::Signal { job, signal } => {
            let sent = sup.jobs.running(job).and_then(|(n, stream)| {
                sup.to_agent(n, &Frame::new(kind::KILL, stream, signal.to_le_bytes()))
            });
            match sent {
                Ok(()) => {
                    reply(&mut conn, kind::EXIT, 0i32.to_le_bytes()).map_err(anyhow::Error::from)
                }
                Err(e) => err(&mut conn, format!("{e:#}")),
            }
        }
        Request::Pause { node: n, paused } => match pause(sup, n, paused) {
            Ok(()) => reply(&mut conn, kind::EXIT, 0i32.to_le_bytes()).map_err(anyhow::Error::from),
            Err(e) => err(&mut conn, format!("node {n}: {e:#}")),
        },
        Request::Reboot { node: n, timeout } => match reboot(sup, n, timeout) {
            Ok(secs) => {
                let _ = reply(
                    &mut conn,
                    kind::INFO,
                    serde_json::to_string(&Rebooted { boot_seconds: secs })?,
                );
                reply(&mut conn, kind::EXIT, 0i32.to_le_bytes()).map_err(anyhow::Error::from)
            }
            Err(e) => err(&mut conn, format!("node {n}: {e:#}")),
        },
        Request::StallControl { node: n, stalled } => {
            let done = match sup
                .device
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
            {
                Some(d) => d
                    .shard_of(n)
                    .stall_control(n, stalled)
                    .map_err(anyhow::Error::from),
                None => Err(anyhow::anyhow!(
                    "the device is not in the supervisor (not running, or separate processes with --devices)"
                )),
            };
            match done {
                Ok(()) => {
                    reply(&mut conn, kind::EXIT, 0i32.to_le_bytes()).map_err(anyhow::Error::from)
                }
                Err(e) => err(&mut conn, format!("{e:#}")),
            }
        }
        Request::RestartDevice { timeout } => {
            let timeout = Duration::from_secs(timeout);
            match restart_device(sup, timeout) {
                Ok(v) => {
                    let _ = reply(&mut conn, kind::INFO, serde_json::to_string(&v)?);
                    reply(&mut conn, kind::EXIT, 0i32.to_le_bytes()).map_err(anyhow::Error::from)
                }
                Err(e) => err(&mut conn, format!("{e:#}")),
            }
        }
        Request::Down => {
            sup.stopping.store(true, Ordering::Release);
            let pids: Vec<u32> = sup
                .slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|s| s.qemu_pid)
                .collect();
            for pid in pids {
                // SAFETY: kill(2) on a QEMU this process started.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline
                && (0..nodes).any(|n| !matches!(sup.phase(n), Some(Phase::Stopped(_))))
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = std::fs::remove_file(control_socket(&sup.dir));
            let _ = reply(&mut conn, kind::EXIT, 0i32.to_le_bytes());
            eprintln!("supervisor: down");
            std::process::exit(0);
        }
    }
}

/// Stops the device (every guest's connection closes, as if it had
/// crashed), starts a new one on the same sockets and plugs each running
/// guest's NIC again: the guest's driver sees the old NIC removed (what was
/// open fails with ENODEV, waiters wake) and a new one appear, without a
/// reboot. Waits until every driver has started the new NIC.
fn restart_device(sup: &Sup, timeout: Duration) -> anyhow::Result<DeviceRestarted> {
    anyhow::ensure!(
        sup.members.is_none(),
        "restart-device restarts the supervisor's own device; this cluster's are separate processes (--devices)"
    );
    if let Some(n) =
        (0..sup.agents.len() as u32).find(|&n| matches!(sup.phase(n), Some(Phase::Paused { .. })))
    {
        anyhow::bail!(
            "node {n} is paused (its NIC cannot be unplugged): `ulnic cluster resume {n}` first"
        );
    }
    let mut slot = sup.device.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    drop(slot.take());
    let stopped = t0.elapsed().as_secs_f64();
    let device = Device::start(sup.device_config.clone())
        .map_err(|e| anyhow::anyhow!("the new device did not start: {e}"))?;
    let running: Vec<u32> = (0..sup.agents.len() as u32)
        .filter(|&n| matches!(sup.phase(n), Some(Phase::Ready { .. } | Phase::Booting(_))))
        .collect();
    let shards: Vec<_> = running
        .iter()
        .map(|&n| (n, device.shard_of(n).clone()))
        .collect();
    *slot = Some(device);
    drop(slot);
    let vms = sup.vms.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for &n in &running {
        plug_nic(sup, n, &vms[n as usize], true)?;
    }
    let deadline = Instant::now() + timeout;
    loop {
        // A driver that accepted features has started the new NIC.
        let waiting: Vec<u32> = shards
            .iter()
            .filter(|(n, shard)| shard.lock().nodes[*n as usize].features == 0)
            .map(|(n, _)| *n)
            .collect();
        if waiting.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(anyhow::anyhow!(
                "the device restarted, but the driver of node(s) {waiting:?} did not start the new NIC within {} s",
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "supervisor: device restarted; {} guest NIC(s) plugged again",
        running.len()
    );
    Ok(DeviceRestarted {
        stopped_seconds: stopped,
        reconnected_seconds: t0.elapsed().as_secs_f64(),
        nodes: running,
    })
}

/// Resets node `n`'s guest and waits (`timeout` seconds at most) until it
/// is ready again; its boot time.
fn reboot(sup: &Sup, n: u32, timeout: u64) -> anyhow::Result<f64> {
    if matches!(sup.phase(n), Some(Phase::Paused { .. })) {
        anyhow::bail!("it is paused: `ulnic cluster resume {n}` first");
    }
    qmp_reset(&sup.dir.join(format!("node{n}.qmp")))
        .map_err(|e| anyhow::anyhow!("reset failed: {e}"))?;
    sup.fail_routes(n, "the guest rebooted");
    sup.set_phase(n, Phase::Booting(Instant::now()));
    wait_ready(sup, n, Duration::from_secs(timeout))
}

/// Pauses node `n`'s guest (QMP `stop`: its vCPUs stop and QEMU stops
/// its NIC's rings, which the device takes for a reset, spec §2.5) or
/// resumes it (`cont`).
fn pause(sup: &Sup, n: u32, paused: bool) -> anyhow::Result<()> {
    let qmp_path = sup.dir.join(format!("node{n}.qmp"));
    match (sup.phase(n), paused) {
        (Some(Phase::Ready { boot_seconds }), true) => {
            qmp(&qmp_path, &[json!({ "execute": "stop" })])?;
            sup.set_phase(n, Phase::Paused { boot_seconds });
            Ok(())
        }
        (Some(Phase::Paused { boot_seconds }), false) => {
            qmp(&qmp_path, &[json!({ "execute": "cont" })])?;
            sup.set_phase(n, Phase::Ready { boot_seconds });
            Ok(())
        }
        (p, true) => anyhow::bail!("cannot pause: it is {}", phase_name(p)),
        (p, false) => anyhow::bail!("cannot resume: it is {}, not paused", phase_name(p)),
    }
}

fn phase_name(p: Option<Phase>) -> String {
    match p {
        Some(Phase::Paused { .. }) => "paused".into(),
        Some(Phase::Booting(t)) => format!("booting for {:.0} s", t.elapsed().as_secs_f64()),
        Some(Phase::Ready { .. }) => "ready".into(),
        Some(Phase::Stopped(why)) => format!("stopped: {why}"),
        None => "unknown".into(),
    }
}

/// When the client goes away before its command ends (Ctrl-C), the
/// command's process group in the guest is killed.
/// An exec or put on node `n`: the agent's frames for it go back to the
/// client until EXIT or ERROR (a detached exec answers with its job at
/// once). An error is the reason to give the client.
fn serve_stream(
    sup: &Arc<Sup>,
    conn: &mut UnixStream,
    rd: &mut BufReader<UnixStream>,
    req: &Request,
    n: u32,
) -> anyhow::Result<()> {
    if !matches!(sup.phase(n), Some(Phase::Ready { .. })) {
        anyhow::bail!("node {n} is not ready ({})", phase_name(sup.phase(n)));
    }
    let id = sup.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    sup.routes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, (n, tx));
    if let Request::Exec {
        command,
        detach: true,
        ..
    } = req
    {
        let job = start_job(sup, n, id, command, rx)?;
        let _ = reply(conn, kind::INFO, serde_json::to_string(&job)?);
        return reply(conn, kind::EXIT, 0i32.to_le_bytes()).map_err(anyhow::Error::from);
    }
    let sent = match req {
        Request::Exec { command, .. } => sup
            .to_agent(n, &Frame::new(kind::EXEC, id, command.as_str()))
            .map(|()| watch_hangup(sup, conn, n, id)),
        Request::Put {
            path, mode, len, ..
        } => put_file(sup, n, id, (path, *mode, *len), rd),
        _ => Err(anyhow::anyhow!("not a stream request")),
    };
    if let Err(e) = sent {
        sup.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        return Err(e);
    }
    for f in rx {
        let last = matches!(f.kind, kind::EXIT | kind::ERROR);
        if write_frame(conn, &Frame::new(f.kind, 0, f.data)).is_err() || last {
            break;
        }
    }
    Ok(())
}

/// Starts `command` on node `n` as a background job on agent stream
/// `id` (already routed to `frames`): its output goes to the job's log.
fn start_job(
    sup: &Arc<Sup>,
    n: u32,
    id: u32,
    command: &str,
    frames: mpsc::Receiver<Frame>,
) -> anyhow::Result<super::protocol::JobStatus> {
    let started = sup.jobs.start(n, id, command, frames).and_then(|job| {
        sup.to_agent(n, &Frame::new(kind::EXEC, id, command))
            .map(|()| job)
    });
    if started.is_err() {
        // Its recorder then ends the job as lost.
        sup.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
    started
}

fn watch_hangup(sup: &Arc<Sup>, conn: &UnixStream, n: u32, id: u32) {
    let Ok(mut c) = conn.try_clone() else { return };
    let sup = sup.clone();
    std::thread::spawn(move || {
        let mut b = [0u8; 64];
        while matches!(c.read(&mut b), Ok(k) if k > 0) {}
        let open = sup
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&id);
        if open {
            let _ = sup.to_agent(n, &Frame::new(kind::KILL, id, libc::SIGKILL.to_le_bytes()));
        }
    });
}

fn put_file(
    sup: &Arc<Sup>,
    n: u32,
    id: u32,
    (path, mode, len): (&str, u32, u64),
    rd: &mut BufReader<UnixStream>,
) -> anyhow::Result<()> {
    let mut left = len;
    let mut begin = mode.to_le_bytes().to_vec();
    begin.extend_from_slice(path.as_bytes());
    sup.to_agent(n, &Frame::new(kind::PUT_BEGIN, id, begin))?;
    let mut buf = vec![0u8; 256 << 10];
    while left > 0 {
        let k = (left as usize).min(buf.len());
        rd.read_exact(&mut buf[..k])
            .map_err(|e| anyhow::anyhow!("the client's file ended early: {e}"))?;
        sup.to_agent(n, &Frame::new(kind::PUT_DATA, id, &buf[..k]))?;
        left -= k as u64;
    }
    sup.to_agent(n, &Frame::new(kind::PUT_END, id, Vec::new()))
}

fn wait_ready(sup: &Sup, n: u32, timeout: Duration) -> anyhow::Result<f64> {
    let deadline = Instant::now() + timeout;
    let mut s = sup.slots.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        match &s[n as usize].phase {
            Phase::Ready { boot_seconds } => return Ok(*boot_seconds),
            Phase::Stopped(why) => return Err(anyhow::anyhow!("{why}")),
            Phase::Booting(_) | Phase::Paused { .. } => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(anyhow::anyhow!("not ready after {} s", timeout.as_secs()));
        }
        s = sup
            .changed
            .wait_timeout(s, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Resets a guest through QEMU's QMP socket (a hardware reset: the guest
/// reboots without its cooperation; the device sees the node reset).
fn qmp_reset(path: &Path) -> anyhow::Result<()> {
    qmp(path, &[json!({ "execute": "system_reset" })])
}

/// Runs QMP `commands` in order on the socket at `path` (waiting up to 10 s
/// for QEMU to create it); the first error stops.
fn qmp(path: &Path, commands: &[Value]) -> anyhow::Result<()> {
    let steps: Vec<(Value, Option<&[&str]>)> = commands.iter().map(|c| (c.clone(), None)).collect();
    qmp_steps(path, &steps)
}

/// Like [`qmp`], and after a command with a QMP message pattern, waits (up
/// to 60 s) for a QMP message line that contains every string of the
/// pattern.
fn qmp_steps(path: &Path, steps: &[(Value, Option<&[&str]>)]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(anyhow::anyhow!("{}: {e}", path.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut w = s.try_clone()?;
    let mut lines = BufReader::new(s).lines();
    let expect_return = |lines: &mut std::io::Lines<BufReader<UnixStream>>| {
        for l in lines.by_ref() {
            let l = l?;
            if l.contains("\"return\"") {
                return Ok(());
            }
            if l.contains("\"error\"") {
                anyhow::bail!("QMP: {l}");
            }
        }
        Err(anyhow::anyhow!("QMP closed"))
    };
    lines.next(); // greeting
    writeln!(w, "{{\"execute\":\"qmp_capabilities\"}}")?;
    expect_return(&mut lines)?;
    for (c, awaited) in steps {
        writeln!(w, "{c}")?;
        expect_return(&mut lines)?;
        if let Some(pattern) = awaited {
            loop {
                match lines.next() {
                    Some(Ok(l)) if pattern.iter().all(|p| l.contains(p)) => break,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(anyhow::anyhow!("waiting for {pattern:?}: {e}")),
                    None => return Err(anyhow::anyhow!("QMP closed before {pattern:?}")),
                }
            }
        }
    }
    Ok(())
}

/// Gives a guest its NIC over QMP: at start (the guest is paused with
/// `ulnic_hotplug`; it then runs) or again after a device restart
/// (`replug`: the old NIC is removed, which the guest's driver sees as a
/// device removal, and its chardev connected to the new device).
fn plug_nic(sup: &Sup, n: u32, cfg: &VmConfig, replug: bool) -> anyhow::Result<()> {
    let qmp_path = sup.dir.join(format!("node{n}.qmp"));
    if replug {
        let sock = cfg
            .ulnic_socket
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("the guest has no NIC"))?;
        let deleted = format!("\"device\": \"{}\"", vm::ULNIC_DEVICE_ID);
        qmp_steps(
            &qmp_path,
            &[
                (
                    json!({ "execute": "device_del", "arguments": { "id": vm::ULNIC_DEVICE_ID } }),
                    Some(&["\"event\": \"DEVICE_DELETED\"", &deleted][..]),
                ),
                (
                    json!({ "execute": "chardev-remove", "arguments": { "id": vm::ULNIC_CHARDEV_ID } }),
                    None,
                ),
                (vm::ulnic_chardev_add(sock), None),
            ],
        )
        .map_err(|e| anyhow::anyhow!("node {n}: removing the old NIC: {e}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let connected = match &sup.members {
            Some(m) => member_sees(&sup.dir, m, n),
            None => sup
                .device
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|d| d.shard_of(n).lock().nodes[n as usize].disconnect.is_some()),
        };
        if connected {
            break;
        }
        if Instant::now() >= deadline {
            return Err(anyhow::anyhow!(
                "node {n}: QEMU did not connect to the device within 30 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut steps = vec![vm::ulnic_device_add()];
    if !replug {
        steps.push(json!({ "execute": "cont" }));
    }
    qmp(&qmp_path, &steps).map_err(|e| anyhow::anyhow!("node {n}: adding the NIC: {e}"))
}

/// Whether QEMU has connected to node `n`'s socket of the device process
/// serving it (the member has had a frontend; it gets its memory table
/// only once the NIC is plugged), asked on that member's control socket.
fn member_sees(dir: &Path, members: &crate::fabric::launch::LocalMembers, n: u32) -> bool {
    let Some(m) = members.members.iter().find(|m| m.nodes.contains(&n)) else {
        return false;
    };
    let ask = || -> anyhow::Result<bool> {
        let mut c = crate::control::Client::connect(dir, Some(&m.name))?;
        c.send(&crate::control::Request::Stats)?;
        let s: crate::control::Stats = serde_json::from_str(&c.checked_line()?)?;
        Ok(s.nodes.iter().any(|x| x.node == n && x.connections > 0))
    };
    ask().unwrap_or(false)
}

// ---- the client side: what `ulnic cluster up/exec/...` call ----

/// Sends one request to cluster `dir`'s supervisor.
pub fn request(dir: &Path, req: &Request) -> anyhow::Result<UnixStream> {
    let mut s = UnixStream::connect(control_socket(dir)).map_err(|e| {
        anyhow::anyhow!(
            "no cluster is up at {} ({e}); start one with `ulnic cluster up`",
            dir.display()
        )
    })?;
    let line = serde_json::to_string(req)?;
    writeln!(s, "{line}")?;
    Ok(s)
}

/// The cluster's status document.
pub fn status(dir: &Path) -> anyhow::Result<ClusterStatus> {
    let mut s = request(dir, &Request::Status)?;
    let f = read_frame(&mut s).map_err(|e| anyhow::anyhow!("supervisor: {e}"))?;
    match f.kind {
        kind::INFO => serde_json::from_slice(&f.data).map_err(anyhow::Error::from),
        _ => Err(anyhow::anyhow!("{}", String::from_utf8_lossy(&f.data))),
    }
}

/// Reads a stream's frames until EXIT (its status) or ERROR.
pub fn finish(s: &mut UnixStream, mut on_frame: impl FnMut(&Frame)) -> anyhow::Result<i32> {
    loop {
        let f = read_frame(s).map_err(|e| anyhow::anyhow!("supervisor: {e}"))?;
        match f.kind {
            kind::EXIT => return Ok(f.exit_code()),
            kind::ERROR => return Err(anyhow::anyhow!("{}", String::from_utf8_lossy(&f.data))),
            _ => on_frame(&f),
        }
    }
}

/// Starts a supervisor for cluster `dir` and returns it; the caller polls
/// `status` until the guests are ready.
pub fn spawn_supervisor(dir: &Path, image: &Image, args: &SuperviseArgs) -> anyhow::Result<Child> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    if UnixStream::connect(control_socket(dir)).is_ok() {
        return Err(anyhow::anyhow!(
            "a cluster is already up at {}; `ulnic cluster down` first, or pick another --name",
            dir.display()
        ));
    }
    // Leftovers of a cluster that was not taken down (its sockets refuse).
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(&p);
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    std::fs::write(dir.join("image.json"), serde_json::to_vec(image)?)?;
    let log = std::fs::File::create(dir.join("supervisor.log"))?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["cluster", "supervise", "--dir"])
        .arg(dir)
        .args(["--nodes", &args.nodes.to_string()])
        .args(["--accel", &args.accel])
        .args(["--memory", &args.memory.to_string()])
        .args(["--endpoints", &args.endpoints.to_string()])
        .args(["--poll-us", &args.poll_us.to_string()])
        .args(["--devices", &args.devices.to_string()])
        .args(args.fabric.to_args())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; the supervisor leaves the
    // caller's session so it outlives `cluster up` and its terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the supervisor: {e}"))
}
