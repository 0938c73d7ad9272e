//! `ulnic cluster run`: one device process, N QEMU guests each with a ulnic
//! node, a command run on every node, output collected, all torn down.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;
use ulnic_images::vm::{self, VmConfig};
use ulnic_images::Image;

use ulnic_device::Device;

pub mod agent;
pub mod client;
pub mod fabric;
pub mod jobs;
pub mod protocol;
pub mod supervisor;

/// Which accelerator to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// KVM if a guest really runs under it here, else TCG.
    Auto,
    /// Hardware virtualisation.
    Kvm,
    /// Software emulation (always works, slower).
    Tcg,
}

/// Options of a cluster run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Number of guests (nodes).
    pub nodes: u32,
    /// Accelerator choice.
    pub accel: Accel,
    /// Guest RAM in MiB.
    pub memory_mb: u32,
    /// Give up on a node after this long.
    pub timeout: Duration,
    /// Endpoints per node.
    pub endpoints: u32,
    /// The engine's idle period in microseconds (the device's `--poll-us`).
    pub poll_us: u64,
    /// Device processes the nodes are spread over (1: one device in this
    /// process, nodes one copy apart; more: a star fabric of that many
    /// `ulnic device` processes joined over loopback UDP).
    pub devices: u32,
    /// The fabric the guests sit behind.
    pub fabric: fabric::FabricArgs,
}

impl RunOptions {
    /// What the device gives each node.
    pub fn settings(&self) -> crate::fabric::launch::NodeSettings {
        crate::fabric::launch::NodeSettings {
            endpoints: self.endpoints,
            poll_us: self.poll_us,
        }
    }
}

/// What happened on one node.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeResult {
    /// Node number.
    pub node: u32,
    /// The command's exit status, if it ran to the end.
    pub exit: Option<i32>,
    /// Seconds from QEMU start to the guest's ready line.
    pub boot_seconds: Option<f64>,
    /// Where the full console log is.
    pub console_log: PathBuf,
    /// Why it failed, when it did (with the console tail).
    pub error: Option<String>,
}

/// Picks the accelerator; `auto` boots a probe guest under KVM once per host
/// boot and remembers the verdict (nested KVM may exist and still hang).
pub fn choose_accel(image: &Image, accel: Accel, say: &mut dyn FnMut(&str)) -> &'static str {
    match accel {
        Accel::Kvm => return "kvm",
        Accel::Tcg => return "tcg",
        Accel::Auto => {}
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        say("accelerator: tcg (no usable /dev/kvm)");
        return "tcg";
    }
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let memo = ulnic_images::cache_dir().join("kvm-probe");
    if let Ok(m) = std::fs::read_to_string(&memo) {
        if let Some((id, verdict)) = m.split_once('\n') {
            if id == boot_id.trim() {
                let v = if verdict.trim() == "kvm" {
                    "kvm"
                } else {
                    "tcg"
                };
                say(&format!("accelerator: {v} (probed earlier on this boot)"));
                return v;
            }
        }
    }
    say("accelerator: probing KVM with a test guest (up to 30 s)...");
    let cfg = VmConfig {
        accel: "kvm".into(),
        append: "ulnic.poweroff".into(),
        memory_mb: 256,
        ..Default::default()
    };
    let ok = boot_until(image, &cfg, "ulnic-guest: ready", Duration::from_secs(30));
    let v = if ok { "kvm" } else { "tcg" };
    let _ = std::fs::write(&memo, format!("{}\n{v}\n", boot_id.trim()));
    say(&format!(
        "accelerator: {v} ({})",
        if ok {
            "KVM guest booted"
        } else {
            "KVM guest did not boot; falling back"
        }
    ));
    v
}

fn boot_until(image: &Image, cfg: &VmConfig, marker: &str, limit: Duration) -> bool {
    let Ok(mut child) = vm::command(image, cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take();
    let marker = marker.to_string();
    std::thread::spawn(move || {
        if let Some(out) = out {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if l.contains(&marker) {
                    let _ = tx.send(());
                    return;
                }
            }
        }
    });
    let ok = rx.recv_timeout(limit).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    ok
}

/// Starts the guests' private Ethernet segment: a VDE switch with no
/// uplink at `segment`. It exits when its stdin (held by the returned
/// child) closes, so it dies with its parent.
pub fn start_segment(image: &Image, segment: &std::path::Path) -> anyhow::Result<Child> {
    let mut switch = std::process::Command::new(&image.vde_switch)
        .arg("-s")
        .arg(segment)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", image.vde_switch.display()))?;
    let ready = Instant::now();
    while !segment.join("ctl").exists() {
        if ready.elapsed() > Duration::from_secs(10) {
            let _ = switch.kill();
            return Err(anyhow::anyhow!("the VDE switch did not come up"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(switch)
}

/// The last `n` lines of a log file.
pub fn log_tail(path: &std::path::Path, n: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(n).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

enum Line {
    Console(u32, String),
    Exited(u32),
}

/// Boots the cluster, runs `command` (a shell command line) on every node,
/// streams its output prefixed by node, and tears everything down.
pub fn run(
    opts: &RunOptions,
    image: &Image,
    command: &str,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<NodeResult>> {
    let accel = choose_accel(image, opts.accel, say);
    // Sockets and the segment switch of this run; removed when it ends
    // (declared first, so dropped after the device and the guests).
    let dir_guard = tempfile::Builder::new()
        .prefix("ulnic-cluster-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("cannot make a run directory: {e}"))?;
    let dir = dir_guard.path().to_path_buf();
    let sockets = opts.fabric.sockets(&dir, opts.nodes)?;
    let (device, members) = start_devices(opts, &dir, &sockets, say)?;
    let segment = dir.join("segment");
    let mut switch = start_segment(image, &segment)?;
    let cmd64 = base64::engine::general_purpose::STANDARD.encode(command);
    // The command rides on the kernel command line (x86: 2048 bytes in
    // all); a longer one would not boot at all.
    if cmd64.len() > MAX_COMMAND_BASE64 {
        anyhow::bail!(
            "the command is {} bytes, too long for the guests' kernel command line (at most {}); \
             start a cluster with `ulnic cluster up` and copy a script in with `ulnic cluster put`",
            command.len(),
            MAX_COMMAND_BASE64 / 4 * 3
        );
    }
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = Vec::new();
    let mut results: Vec<NodeResult> = Vec::new();
    let started = Instant::now();
    for n in 0..opts.nodes {
        let cfg = VmConfig {
            memory_mb: opts.memory_mb,
            ulnic_socket: Some(sockets[n as usize].clone()),
            accel: accel.into(),
            append: format!(
                "ulnic.node={n} ulnic.nodes={} ulnic.cmd={cmd64} ulnic.poweroff",
                opts.nodes
            ),
            vde: Some((segment.clone(), n)),
            ..Default::default()
        };
        children.push(start_guest(image, &cfg, n, &tx)?);
        results.push(NodeResult {
            node: n,
            exit: None,
            boot_seconds: None,
            console_log: dir.join(format!("node{n}.console.log")),
            error: None,
        });
        say(&format!("[node {n}] booting ({accel})"));
    }
    drop(tx);
    let stopped = follow_consoles(&rx, &mut results, &mut children, started, opts.timeout, say)?;
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    drop(device);
    drop(members);
    let _ = switch.kill();
    let _ = switch.wait();
    for (r, stopped) in results.iter_mut().zip(stopped) {
        if r.exit.is_none() || r.exit != Some(0) {
            let why = match (stopped, r.boot_seconds, r.exit) {
                (Some(why), _, _) => why,
                (None, None, _) => "did not boot",
                (None, Some(_), None) => "command did not finish",
                (None, Some(_), Some(_)) => "command failed",
            };
            r.error = Some(format!(
                "{why}; console tail:\n{}",
                log_tail(&r.console_log, 15)
            ));
        }
    }
    // A failed run keeps its console logs for reading; a good one leaves
    // nothing behind.
    if results.iter().any(|r| r.error.is_some()) {
        let kept = dir_guard.keep();
        say(&format!("console logs kept in {}", kept.display()));
    }
    Ok(results)
}

/// The guests' device: in this process (`sockets` are its nodes), or
/// spread over `opts.devices` processes with their sockets in `dir`,
/// behind the fabric `opts.fabric` asks for.
fn start_devices(
    opts: &RunOptions,
    dir: &std::path::Path,
    sockets: &[PathBuf],
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<(Option<Device>, Option<crate::fabric::launch::LocalMembers>)> {
    say(&format!("fabric: {}", opts.fabric.describe(opts.devices)));
    let (device, members) =
        fabric::start_devices(dir, sockets, opts.devices, &opts.settings(), &opts.fabric)?;
    for member in members.iter().flat_map(|m| &m.members) {
        say(&format!(
            "device {} at {}: nodes {:?}",
            member.name, member.address, member.nodes
        ));
    }
    Ok((device, members))
}

/// Starts node `n`'s QEMU; its console lines (stdout and stderr) go to
/// `tx`, then an `Exited` for each stream.
fn start_guest(
    image: &Image,
    cfg: &VmConfig,
    n: u32,
    tx: &mpsc::Sender<Line>,
) -> anyhow::Result<Child> {
    let mut child = vm::command(image, cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start QEMU: {e}"))?;
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as _),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(Line::Console(n, l));
            }
            let _ = tx.send(Line::Exited(n));
        });
    }
    Ok(child)
}

/// Follows the guests' consoles until every one has closed both streams
/// or `timeout` has passed since they were `started` (then every guest is
/// killed): writes each line to its node's console log, passes on the
/// command's output, notes boot times and exit statuses in `results`.
fn follow_consoles(
    rx: &mpsc::Receiver<Line>,
    results: &mut [NodeResult],
    children: &mut [Child],
    started: Instant,
    timeout: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Option<&'static str>>> {
    let deadline = started + timeout;
    // QEMU keeps a guest it stopped for an error paused, not exited: such
    // a node is stopped here at once instead of at the timeout.
    let mut stopped = vec![None; results.len()];
    let mut logs: Vec<std::fs::File> = results
        .iter()
        .map(|r| {
            std::fs::File::create(&r.console_log)
                .map_err(|e| anyhow::anyhow!("{}: {e}", r.console_log.display()))
        })
        .collect::<Result<_, _>>()?;
    let mut closed = vec![0u8; results.len()];
    while closed.iter().any(|&c| c < 2) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(Line::Console(n, l)) => {
                let r = &mut results[n as usize];
                let _ = writeln!(logs[n as usize], "{l}");
                if let Some(out) = l.split("ulnic-out: ").nth(1) {
                    say(&format!("[node {n}] {out}"));
                } else if l.contains("ulnic-guest: ready") && r.boot_seconds.is_none() {
                    r.boot_seconds = Some(started.elapsed().as_secs_f64());
                    say(&format!(
                        "[node {n}] ready after {:.1} s",
                        started.elapsed().as_secs_f64()
                    ));
                } else if let Some(code) = l.split("ulnic-guest: exit=").nth(1) {
                    r.exit = code.trim().parse().ok();
                } else if let Some(why) = vm::guest_stopped_by(&l) {
                    if stopped[n as usize].is_none() {
                        say(&format!("[node {n}] {why}"));
                        stopped[n as usize] = Some(why);
                        let _ = children[n as usize].kill();
                    }
                }
            }
            Ok(Line::Exited(n)) => closed[n as usize] += 1,
            Err(_) => {
                say("timeout: stopping every node");
                children.iter_mut().for_each(|c| {
                    let _ = c.kill();
                });
                break;
            }
        }
    }
    Ok(stopped)
}

/// Room for `ulnic cluster run`'s command, base64, on the guests' kernel
/// command line: 2048 bytes on x86, less what the rest of it takes.
const MAX_COMMAND_BASE64: usize = 1700;

/// One word is taken as a shell command line as it stands; several words
/// are quoted as needed (shlex) and joined. A word holding a NUL byte
/// cannot be passed to a shell at all.
pub fn shell_join(words: &[String]) -> anyhow::Result<String> {
    if let [one] = words {
        return Ok(one.clone());
    }
    shlex::try_join(words.iter().map(String::as_str))
        .map_err(|e| anyhow::anyhow!("cannot pass that command to a shell: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn shell_join_quotes_what_needs_it() {
        let w: Vec<String> = ["echo", "a b", "it's", "x=1", "$HOME"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let joined = super::shell_join(&w).unwrap();
        assert_eq!(shlex::split(&joined), Some(w));
        assert!(joined.starts_with("echo "), "{joined}");
        assert_eq!(
            super::shell_join(&["echo $X | wc".to_string()]).unwrap(),
            "echo $X | wc"
        );
        assert!(super::shell_join(&["a".into(), "b\0c".into()]).is_err());
    }
}
