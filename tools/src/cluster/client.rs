//! The commands people type against a persistent cluster: `up` (with boot
//! progress), `exec` (streamed output, exit status), `put`, `reboot`,
//! `status`, `down`. They talk to the supervisor (see `supervisor`).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use ulnic_images::Image;

use super::agent::kind;
use super::protocol::{ClusterStatus, DeviceRestarted, JobStatus, NodeState, Rebooted, Request};
use super::supervisor::{self, finish, request, SuperviseArgs};

/// Boots a cluster in `dir` and returns its status once every guest is
/// ready; on failure the cluster is taken down and the reason (with the
/// console tail) returned.
pub fn up(
    dir: &Path,
    image: &Image,
    args: &SuperviseArgs,
    timeout: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<ClusterStatus> {
    let mut child = supervisor::spawn_supervisor(dir, image, args)?;
    let started = Instant::now();
    let mut reported = vec![false; args.nodes as usize];
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(anyhow::anyhow!(
                "the supervisor exited ({st}); its log:\n{}",
                super::log_tail(&dir.join("supervisor.log"), 20)
            ));
        }
        if let Ok(s) = supervisor::status(dir) {
            for (n, node) in s.nodes.iter().enumerate() {
                match node.state {
                    NodeState::Ready if !reported[n] => {
                        reported[n] = true;
                        say(&format!(
                            "[node {n}] ready after {:.1} s",
                            node.boot_seconds.unwrap_or(0.0)
                        ));
                    }
                    NodeState::Stopped => {
                        let why = node.reason.clone().unwrap_or_default();
                        let tail = super::log_tail(&dir.join(format!("node{n}.console.log")), 15);
                        let _ = down(dir);
                        return Err(anyhow::anyhow!(
                            "node {n} did not boot: {why}; console tail:\n{tail}"
                        ));
                    }
                    _ => {}
                }
            }
            if reported.iter().all(|&r| r) {
                return Ok(s);
            }
        }
        if started.elapsed() > timeout {
            let waiting: Vec<String> = (0..args.nodes)
                .filter(|&n| !reported[n as usize])
                .map(|n| {
                    format!(
                        "node {n}; console tail:\n{}",
                        super::log_tail(&dir.join(format!("node{n}.console.log")), 10)
                    )
                })
                .collect();
            let _ = down(dir);
            return Err(anyhow::anyhow!(
                "not ready after {} s: {}",
                timeout.as_secs(),
                waiting.join("\n")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Nodes named by `target`: a number, or `all`.
pub fn nodes_of(dir: &Path, target: &str) -> anyhow::Result<Vec<u32>> {
    if target == "all" {
        let s = supervisor::status(dir)?;
        return Ok(s.nodes.iter().map(|n| n.node).collect());
    }
    target
        .parse()
        .map(|n| vec![n])
        .map_err(|_| anyhow::anyhow!("'{target}' is not a node number or 'all'"))
}

/// Splits a byte stream into lines and prints each with a prefix.
struct Prefixer {
    prefix: String,
    partial: Vec<u8>,
}

impl Prefixer {
    fn feed(&mut self, data: &[u8], out: &mut dyn Write) {
        self.partial.extend_from_slice(data);
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            let _ = out.write_all(self.prefix.as_bytes());
            let _ = out.write_all(&line);
        }
    }
    fn flush(&mut self, out: &mut dyn Write) {
        if !self.partial.is_empty() {
            self.feed(b"\n", out);
        }
    }
}

/// Runs `command` on `nodes` at once. With one node its output passes
/// through untouched; with several each line is prefixed `[node N] `.
/// Returns each node's exit status (an error when the command could not
/// run to the end).
pub fn exec(dir: &Path, nodes: &[u32], command: &str) -> Vec<(u32, anyhow::Result<i32>)> {
    let prefix = nodes.len() > 1;
    let handles: Vec<_> = nodes
        .iter()
        .map(|&n| {
            let dir = dir.to_path_buf();
            let command = command.to_string();
            std::thread::spawn(move || {
                let mut s = request(
                    &dir,
                    &Request::Exec {
                        node: n,
                        command,
                        detach: false,
                    },
                )?;
                let p = || Prefixer {
                    prefix: if prefix {
                        format!("[node {n}] ")
                    } else {
                        String::new()
                    },
                    partial: Vec::new(),
                };
                let (mut po, mut pe) = (p(), p());
                let r = finish(&mut s, |f| {
                    if !prefix {
                        let _ = match f.kind {
                            kind::STDERR => std::io::stderr().write_all(&f.data),
                            _ => std::io::stdout().write_all(&f.data),
                        };
                        return;
                    }
                    match f.kind {
                        kind::STDERR => pe.feed(&f.data, &mut std::io::stderr().lock()),
                        _ => po.feed(&f.data, &mut std::io::stdout().lock()),
                    }
                });
                po.flush(&mut std::io::stdout().lock());
                pe.flush(&mut std::io::stderr().lock());
                r
            })
        })
        .collect();
    nodes
        .iter()
        .zip(handles)
        .map(|(&n, h)| {
            (
                n,
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("the client thread panicked"))),
            )
        })
        .collect()
}

/// Starts `command` on `node` as a background job whose output goes to a
/// log on the host (`cluster exec --detach`).
pub fn start_job(dir: &Path, node: u32, command: &str) -> anyhow::Result<JobStatus> {
    let mut s = request(
        dir,
        &Request::Exec {
            node,
            command: command.to_string(),
            detach: true,
        },
    )?;
    let mut job = None;
    let code = finish(&mut s, |f| {
        if f.kind == kind::INFO {
            job = serde_json::from_slice(&f.data).ok();
        }
    })?;
    match job {
        Some(j) if code == 0 => Ok(j),
        _ => Err(anyhow::anyhow!("the supervisor did not start the job")),
    }
}

/// Sends `signal` to background job `job`'s process group.
pub fn signal_job(dir: &Path, job: u32, signal: i32) -> anyhow::Result<()> {
    let mut s = request(dir, &Request::Signal { job, signal })?;
    finish(&mut s, |_| {}).map(|_| ())
}

/// Copies local file `local` to `remote` on `node`, keeping its mode.
pub fn put(dir: &Path, node: u32, local: &Path, remote: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let data = std::fs::read(local).map_err(|e| anyhow::anyhow!("{}: {e}", local.display()))?;
    let mode = std::fs::metadata(local)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    let mut s = request(
        dir,
        &Request::Put {
            node,
            path: remote.to_string(),
            mode,
            len: data.len() as u64,
        },
    )?;
    s.write_all(&data)?;
    match finish(&mut s, |_| {})? {
        0 => Ok(()),
        c => Err(anyhow::anyhow!("node {node}: copy failed ({c})")),
    }
}

/// Resets `node` (QMP system_reset) and waits until it is ready again;
/// returns its boot time.
pub fn reboot(dir: &Path, node: u32, timeout: Duration) -> anyhow::Result<f64> {
    let mut s = request(
        dir,
        &Request::Reboot {
            node,
            timeout: timeout.as_secs(),
        },
    )?;
    let mut answer = None;
    finish(&mut s, |f| {
        if f.kind == kind::INFO {
            answer = serde_json::from_slice::<Rebooted>(&f.data).ok();
        }
    })?;
    answer
        .map(|r| r.boot_seconds)
        .ok_or_else(|| anyhow::anyhow!("the supervisor did not say how long node {node} took"))
}

/// Stops the cluster's device and starts a new one under the running
/// guests; returns the supervisor's report (seconds to stop, seconds until
/// every guest reconnected, which nodes).
pub fn restart_device(dir: &Path, timeout: Duration) -> anyhow::Result<DeviceRestarted> {
    let mut s = request(
        dir,
        &Request::RestartDevice {
            timeout: timeout.as_secs(),
        },
    )?;
    let mut report = None;
    finish(&mut s, |f| {
        if f.kind == kind::INFO {
            report = serde_json::from_slice::<DeviceRestarted>(&f.data).ok();
        }
    })?;
    report.ok_or_else(|| anyhow::anyhow!("the supervisor sent no restart report"))
}

/// Stalls node `node`'s control queue on the cluster's device, or serves
/// it again (`Shard::stall_control`).
pub fn stall_control(dir: &Path, node: u32, stalled: bool) -> anyhow::Result<()> {
    let mut s = request(dir, &Request::StallControl { node, stalled })?;
    finish(&mut s, |_| {}).map(|_| ())
}

/// Pauses node `node`'s guest (`paused`) or resumes it.
pub fn pause(dir: &Path, node: u32, paused: bool) -> anyhow::Result<()> {
    let mut s = request(dir, &Request::Pause { node, paused })?;
    finish(&mut s, |_| {}).map(|_| ())
}

/// Stops every guest and the supervisor.
pub fn down(dir: &Path) -> anyhow::Result<()> {
    let mut s = request(dir, &Request::Down)?;
    finish(&mut s, |_| {}).map(|_| ())
}
