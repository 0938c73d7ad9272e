//! `ulnic fabric up` / `down`: the device processes of a fabric spread
//! over machines (spec §10.7), started here or through ssh on the hosts of
//! a hostfile, as MPI's and Slurm's launchers do.
//!
//! `up` writes the topology and a fresh key into the state directory,
//! copies both to every remote host, starts one `ulnic device --member`
//! per member, waits for each member's control socket and records where
//! every process runs (`members.json`), which `down` reads to stop them.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use ulnic_device::fabric::network::FabricConfig;

use crate::control::{Client, FaultSpec, Request};

/// One line of a hostfile: `HOST [slots=N] [address=IP]` (MPI's form);
/// `#` starts a comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// What ssh connects to.
    pub name: String,
    /// Device processes it runs.
    pub slots: u32,
    /// The address the other members reach it at (default: `name`
    /// resolved here).
    pub address: Option<IpAddr>,
}

/// Reads a hostfile's text.
pub fn parse_hostfile(text: &str) -> anyhow::Result<Vec<Host>> {
    let mut hosts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        let mut host = Host {
            name: name.to_string(),
            slots: 1,
            address: None,
        };
        for w in words {
            let bad = || {
                anyhow::anyhow!(
                    "hostfile line {}: '{w}' is not slots=N or address=IP",
                    i + 1
                )
            };
            match w.split_once('=') {
                Some(("slots", n)) => host.slots = n.parse().map_err(|_| bad())?,
                Some(("address", a)) => host.address = Some(a.parse().map_err(|_| bad())?),
                _ => return Err(bad()),
            }
        }
        anyhow::ensure!(
            host.slots > 0,
            "hostfile line {}: slots must be at least 1",
            i + 1
        );
        hosts.push(host);
    }
    anyhow::ensure!(!hosts.is_empty(), "the hostfile names no host");
    Ok(hosts)
}

/// Whether `ip` is an address of this machine (a UDP socket binds to it).
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// The topology of `nodes` nodes over `devices` device processes: one
/// switch per device, every other switch joined to the first (a star: any
/// two nodes are at most three switches apart), the nodes in contiguous
/// blocks, device `k` at `addresses[k]`.
pub fn star_topology(nodes: u32, addresses: &[SocketAddr]) -> anyhow::Result<String> {
    let devices = addresses.len() as u32;
    anyhow::ensure!(devices >= 1, "a fabric needs at least one device");
    anyhow::ensure!(
        nodes >= devices,
        "{nodes} nodes cannot be spread over {devices} devices (each serves at least one)"
    );
    let mut t = String::new();
    t += "# Written by `ulnic fabric up`: one switch per device process, a star\n";
    t += "# around d0's switch, nodes in contiguous blocks (docs/spec.md §10.7).\n";
    t += &format!("nodes = {nodes}\n");
    for k in 0..devices {
        t += &format!("\n[[switch]]\nname = \"s{k}\"\n");
    }
    for k in 1..devices {
        // Links between devices cross UDP: an MTU a datagram carries.
        t += &format!("\n[[link]]\nbetween = [\"s0\", \"s{k}\"]\nmtu = 8192\n");
    }
    for k in 0..devices {
        let (first, end) = (k * nodes / devices, (k + 1) * nodes / devices);
        let list: Vec<String> = (first..end).map(|n| n.to_string()).collect();
        t += &format!(
            "\n[[attach]]\nnodes = [{}]\nswitch = \"s{k}\"\n",
            list.join(", ")
        );
    }
    for (k, a) in addresses.iter().enumerate() {
        t += &format!("\n[[device]]\nname = \"d{k}\"\naddress = \"{a}\"\nswitches = [\"s{k}\"]\n");
    }
    Ok(t)
}

/// Where one member runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Member {
    /// Its name in the topology.
    pub name: String,
    /// The host ssh reached (`None`: started here).
    pub host: Option<String>,
    /// Its UDP address.
    pub address: String,
    /// The nodes it serves.
    pub nodes: Vec<u32>,
    /// Its process id, on its host.
    pub pid: u32,
    /// Its log file, on its host.
    pub log: PathBuf,
}

/// What `up` needs.
pub struct UpOptions {
    /// State directory (here and, by default, on every host).
    pub dir: PathBuf,
    /// The fabric: a topology file with `[[device]]` entries, or `None`
    /// for a star of `devices` devices over `nodes` nodes.
    pub topology: Option<PathBuf>,
    /// Nodes (with no topology file).
    pub nodes: u32,
    /// Device processes (with no topology file).
    pub devices: u32,
    /// Hosts to start members on, member k on the k-th slot; none: all here.
    pub hosts: Vec<Host>,
    /// The ssh command (split like a shell would).
    pub ssh: String,
    /// `ulnic` on the remote hosts.
    pub remote_ulnic: String,
    /// First UDP port (member k uses port + k).
    pub port: u16,
    /// What each member gives its nodes.
    pub settings: NodeSettings,
    /// Write the files and print the commands, start nothing.
    pub dry_run: bool,
}

/// The members' state file.
fn members_file(dir: &Path) -> PathBuf {
    dir.join("members.json")
}

/// Starts the members; returns where they run.
pub fn up(o: &UpOptions, say: &mut dyn FnMut(&str)) -> anyhow::Result<Vec<Member>> {
    std::fs::create_dir_all(&o.dir)
        .with_context(|| format!("cannot create {}", o.dir.display()))?;
    anyhow::ensure!(
        !members_file(&o.dir).exists() || o.dry_run,
        "{} exists: a fabric is up there (`ulnic fabric down --dir {}` first)",
        members_file(&o.dir).display(),
        o.dir.display()
    );
    // Member k runs on the k-th host slot.
    let slots: Vec<&Host> = o
        .hosts
        .iter()
        .flat_map(|h| std::iter::repeat_n(h, h.slots as usize))
        .collect();
    let text = match &o.topology {
        Some(t) => {
            std::fs::read_to_string(t).with_context(|| format!("cannot read {}", t.display()))?
        }
        None => {
            let mut addrs = Vec::new();
            for k in 0..o.devices {
                let ip = match slots.get(k as usize) {
                    None if !o.hosts.is_empty() => anyhow::bail!(
                        "{} devices but the hostfile has {} slots",
                        o.devices,
                        slots.len()
                    ),
                    None => IpAddr::from([127, 0, 0, 1]),
                    Some(h) => match h.address {
                        Some(a) => a,
                        None => resolve(&h.name)?,
                    },
                };
                let port = o
                    .port
                    .checked_add(k as u16)
                    .context("the UDP ports run past 65535")?;
                addrs.push(SocketAddr::new(ip, port));
            }
            star_topology(o.nodes, &addrs)?
        }
    };
    // Checked here, before anything starts anywhere.
    let config = super::file::parse(&text).context("the fabric's topology")?;
    let span = config
        .span
        .as_ref()
        .context("the topology has no [[device]] entries: nothing to spread")?;
    anyhow::ensure!(
        o.hosts.is_empty() || slots.len() >= span.members.len(),
        "{} members but the hostfile has {} slots",
        span.members.len(),
        slots.len()
    );
    let topo_path = o.dir.join("fabric.toml");
    std::fs::write(&topo_path, &text)?;
    let key_path = o.dir.join("fabric.key");
    let key = fresh_key(&key_path)?;
    let nodes = config.topology.nodes();
    let mut members = Vec::new();
    for (k, (name, addr)) in span.members.iter().enumerate() {
        let served = served_by(&config, k);
        // A slot on this machine is started here, without ssh.
        let host = match slots.get(k) {
            Some(h) if !is_local(h.address.map_or_else(|| resolve(&h.name), Ok)?) => Some(*h),
            _ => None,
        };
        let log = o.dir.join(format!("{name}.log"));
        let args = device_args(&o.settings, &o.dir, name, nodes, &topo_path, &key_path);
        if o.dry_run {
            let cmd = shlex::try_join(args.iter().map(String::as_str))?;
            match host {
                Some(h) => say(&format!(
                    "member {name} ({addr}) on {}: {} {cmd}",
                    h.name, o.remote_ulnic
                )),
                None => say(&format!("member {name} ({addr}) here: ulnic {cmd}")),
            }
            continue;
        }
        say(&format!(
            "member {name}: starting on {} ({addr}), nodes {served:?}",
            host.map_or("this host", |h| h.name.as_str())
        ));
        let pid = match host {
            None => spawn_here(&args, &log, Lifetime::Detached)?.id(),
            Some(h) => start_remote(o, &h.name, &args, &log, &text, &key)?,
        };
        members.push(Member {
            name: name.clone(),
            host: host.map(|h| h.name.clone()),
            address: addr.to_string(),
            nodes: served,
            pid,
            log,
        });
        // Recorded at once, so `down` stops what did start if a later
        // member fails.
        std::fs::write(members_file(&o.dir), serde_json::to_vec_pretty(&members)?)?;
    }
    if o.dry_run {
        return Ok(members);
    }
    for m in &members {
        wait_up(&o.dir, &o.ssh, m).map_err(|e| {
            anyhow::anyhow!(
                "{e:#}\n(the members started are still running: `ulnic fabric down --dir {}`)",
                o.dir.display()
            )
        })?;
        say(&format!("member {}: up", m.name));
    }
    Ok(members)
}

fn resolve(host: &str) -> anyhow::Result<IpAddr> {
    (host, 0)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve host '{host}'"))?
        .find(|a| a.is_ipv4())
        .or_else(|| (host, 0).to_socket_addrs().ok()?.next())
        .map(|a| a.ip())
        .with_context(|| format!("host '{host}' has no address"))
}

/// A new random 32-byte key in `path` (mode 0600).
fn fresh_key(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut key = vec![0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(&key)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(key)
}

/// The nodes member `k` of `config`'s span serves.
fn served_by(config: &FabricConfig, k: usize) -> Vec<u32> {
    let Some(span) = &config.span else {
        return Vec::new();
    };
    let topo = &config.topology;
    (0..topo.nodes())
        .filter(|&n| span.switch_owner.get(topo.attachment(n).1) == Some(&k))
        .collect()
}

/// What a device process gives each of its nodes (its `ulnic device`
/// options beyond the fabric's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSettings {
    /// Endpoints per node (`--endpoints`).
    pub endpoints: u32,
    /// Microseconds the engine polls after its last work before it sleeps
    /// and asks for doorbells (`--poll-us`, docs/spec.md §5.8).
    pub poll_us: u64,
}

impl NodeSettings {
    /// `endpoints` per node, the device's default idle period.
    pub fn with_endpoints(endpoints: u32) -> NodeSettings {
        NodeSettings {
            endpoints,
            poll_us: ulnic_device::config::DEFAULT_POLL_US,
        }
    }
}

/// The arguments of `ulnic device` for member `name`, sockets in `dir`.
fn device_args(
    settings: &NodeSettings,
    dir: &Path,
    name: &str,
    nodes: u32,
    topo: &Path,
    key: &Path,
) -> Vec<String> {
    vec![
        "device".into(),
        "--nodes".into(),
        nodes.to_string(),
        "--endpoints".into(),
        settings.endpoints.to_string(),
        "--poll-us".into(),
        settings.poll_us.to_string(),
        "--topology".into(),
        topo.display().to_string(),
        "--member".into(),
        name.into(),
        "--key-file".into(),
        key.display().to_string(),
        "--socket-dir".into(),
        dir.display().to_string(),
    ]
}

/// How long a member started here lives.
#[derive(Clone, Copy)]
enum Lifetime {
    /// In a session of its own: it outlives the command (`fabric up`).
    Detached,
    /// Killed when the thread that started it ends (a cluster's members).
    TiedToParent,
}

/// Starts `ulnic device ARGS` here, its output in `log`.
fn spawn_here(args: &[String], log: &Path, life: Lifetime) -> anyhow::Result<Child> {
    let out =
        std::fs::File::create(log).with_context(|| format!("cannot write {}", log.display()))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: setsid and prctl are async-signal-safe and touch no memory
    // of the parent.
    unsafe {
        cmd.pre_exec(move || {
            match life {
                Lifetime::Detached => {
                    libc::setsid();
                }
                Lifetime::TiedToParent => {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                }
            }
            Ok(())
        });
    }
    cmd.spawn().context("cannot start ulnic device")
}

/// The ssh command line (`ssh_cmd`, split like a shell would) for `host`,
/// running `remote` (a shell command).
fn ssh(ssh_cmd: &str, host: &str, remote: &str) -> anyhow::Result<Command> {
    let words =
        shlex::split(ssh_cmd).with_context(|| format!("--ssh '{ssh_cmd}' does not parse"))?;
    let (prog, rest) = words.split_first().context("--ssh is empty")?;
    let mut cmd = Command::new(prog);
    cmd.args(rest).arg(host).arg(remote);
    Ok(cmd)
}

/// Runs `remote` on `host` with `input` on its stdin; its stdout.
fn ssh_run(ssh_cmd: &str, host: &str, remote: &str, input: &[u8]) -> anyhow::Result<String> {
    let mut child = ssh(ssh_cmd, host, remote)?
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {ssh_cmd}"))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(input)?;
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "ssh {host} '{remote}' failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Copies the topology and key to `host` and starts the member there,
/// detached; its pid there.
fn start_remote(
    o: &UpOptions,
    host: &str,
    args: &[String],
    log: &Path,
    topology: &str,
    key: &[u8],
) -> anyhow::Result<u32> {
    let q = |p: &Path| shlex::try_quote(&p.display().to_string()).map(|s| s.into_owned());
    let dir = q(&o.dir)?;
    ssh_run(
        &o.ssh,
        host,
        &format!("mkdir -p {dir} && cat > {}", q(&o.dir.join("fabric.toml"))?),
        topology.as_bytes(),
    )?;
    ssh_run(
        &o.ssh,
        host,
        &format!("umask 077 && cat > {}", q(&o.dir.join("fabric.key"))?),
        key,
    )?;
    let cmd = shlex::try_join(
        std::iter::once(o.remote_ulnic.as_str()).chain(args.iter().map(String::as_str)),
    )?;
    let out = ssh_run(
        &o.ssh,
        host,
        &format!("setsid {cmd} > {} 2>&1 < /dev/null & echo $!", q(log)?),
        &[],
    )?;
    out.trim().parse().with_context(|| {
        format!(
            "{host} did not say the device's pid (said '{}')",
            out.trim()
        )
    })
}

/// Waits (30 s at most) for member `m`'s control socket in `dir` (on its
/// host, through `ssh_cmd`).
fn wait_up(dir: &Path, ssh_cmd: &str, m: &Member) -> anyhow::Result<()> {
    let sock = crate::control::socket_path(dir, Some(&m.name));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = match &m.host {
            None => sock.exists(),
            Some(h) => {
                let q = shlex::try_quote(&sock.display().to_string())?.into_owned();
                ssh_run(
                    ssh_cmd,
                    h,
                    &format!("test -S {q} && echo up || echo down"),
                    &[],
                )?
                .trim()
                    == "up"
            }
        };
        if up {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "member {} did not start within 30 s; see its log {}{}",
                m.name,
                m.host.as_ref().map_or(String::new(), |h| format!("{h}:")),
                m.log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Stops every member `up` started in `dir` (SIGTERM, here or through
/// ssh) and forgets them; the members stopped.
pub fn down(dir: &Path, ssh_cmd: &str, say: &mut dyn FnMut(&str)) -> anyhow::Result<usize> {
    let path = members_file(dir);
    let members: Vec<Member> =
        serde_json::from_slice(&std::fs::read(&path).with_context(|| {
            format!(
                "no fabric is up in {} (no {})",
                dir.display(),
                path.display()
            )
        })?)
        .with_context(|| format!("{} is damaged", path.display()))?;
    let mut failed = Vec::new();
    for m in &members {
        let r = match &m.host {
            None => {
                // SAFETY: kill has no memory effects; a pid that is gone
                // (or reused by another user's process) just fails.
                let rc = unsafe { libc::kill(m.pid as i32, libc::SIGTERM) };
                if rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!(
                        "kill {}: {}",
                        m.pid,
                        std::io::Error::last_os_error()
                    ))
                }
            }
            Some(h) => ssh_run(
                ssh_cmd,
                h,
                &format!("kill {} 2>/dev/null; true", m.pid),
                &[],
            )
            .map(|_| ()),
        };
        match r {
            Ok(()) => say(&format!("member {}: stopped", m.name)),
            Err(e) => failed.push(format!("member {}: {e:#}", m.name)),
        }
    }
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("\n"));
    std::fs::remove_file(&path)?;
    Ok(members.len())
}

/// Device processes of a star fabric on this machine, over loopback,
/// that die with this process (and are stopped when dropped): what
/// `ulnic cluster run --devices D` puts its guests on.
pub struct LocalMembers {
    children: Vec<std::process::Child>,
    /// Where each member runs.
    pub members: Vec<Member>,
}

impl LocalMembers {
    /// Starts `devices` members serving `nodes` nodes in `dir` (topology,
    /// key, logs and node sockets there), on free loopback UDP ports, and
    /// waits until each is up.
    pub fn start(
        dir: &Path,
        nodes: u32,
        devices: u32,
        settings: &NodeSettings,
    ) -> anyhow::Result<LocalMembers> {
        let addrs = free_loopback_ports(devices)?;
        let text = star_topology(nodes, &addrs)?;
        Self::start_with(dir, &text, settings)
    }

    /// Starts one member for each [[device]] entry of topology `text`
    /// (written to `dir` with a fresh key), here, and waits until each is
    /// up.
    pub fn start_with(
        dir: &Path,
        text: &str,
        settings: &NodeSettings,
    ) -> anyhow::Result<LocalMembers> {
        let topo = dir.join("fabric.toml");
        std::fs::write(&topo, text)?;
        let key = dir.join("fabric.key");
        fresh_key(&key)?;
        let config = super::file::parse(text)?;
        let nodes = config.topology.nodes();
        let span = config
            .span
            .as_ref()
            .context("the topology has no [[device]] entries")?;
        let mut started = LocalMembers {
            children: Vec::new(),
            members: Vec::new(),
        };
        for (k, (name, addr)) in span.members.iter().enumerate() {
            let log = dir.join(format!("{name}.log"));
            let args = device_args(settings, dir, name, nodes, &topo, &key);
            // Tied to the thread that started it: the run's (or the
            // supervisor's) main thread, which lives as long as the guests.
            let child = spawn_here(&args, &log, Lifetime::TiedToParent)?;
            started.members.push(Member {
                name: name.clone(),
                host: None,
                address: addr.to_string(),
                nodes: served_by(&config, k),
                pid: child.id(),
                log,
            });
            started.children.push(child);
        }
        for m in &started.members {
            wait_up(dir, "", m)?;
        }
        Ok(started)
    }
}

impl LocalMembers {
    /// Sets `faults` on every link of the fabric they run (topology in
    /// `dir`), on every member: each emulates the lanes it sends on.
    pub fn set_every_link(&self, dir: &Path, faults: FaultSpec) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(dir.join("fabric.toml"))?;
        let links = super::file::parse(&text)?.topology.links().len();
        for m in &self.members {
            let mut c = Client::connect(dir, Some(&m.name))?;
            for link in 0..links {
                c.send(&Request::SetFaults {
                    link: Some(link),
                    node: None,
                    faults,
                })?;
                c.checked_line()
                    .with_context(|| format!("member {}", m.name))?;
            }
        }
        Ok(())
    }
}

impl Drop for LocalMembers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `count` consecutive UDP ports free on 127.0.0.1 (found by binding; a
/// port taken between this and the device's bind makes that device fail
/// to start, with the reason in its log).
pub fn free_loopback_ports(count: u32) -> anyhow::Result<Vec<SocketAddr>> {
    for _ in 0..64 {
        let first = UdpSocket::bind("127.0.0.1:0")?;
        let base = first.local_addr()?.port();
        let mut held = vec![first];
        let ok = (1..count).all(|k| {
            base.checked_add(k as u16)
                .and_then(|p| UdpSocket::bind(("127.0.0.1", p)).ok())
                .map(|s| held.push(s))
                .is_some()
        });
        if ok {
            return Ok(held.iter().filter_map(|s| s.local_addr().ok()).collect());
        }
    }
    anyhow::bail!("found no {count} consecutive free UDP ports on 127.0.0.1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostfiles_read_as_mpi_writes_them() {
        let h =
            parse_hostfile("# cluster\nnode1 slots=2\n\nnode2 address=10.0.0.2 # spare\n").unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(
            (h[0].name.as_str(), h[0].slots, h[0].address),
            ("node1", 2, None)
        );
        assert_eq!(h[1].address, Some("10.0.0.2".parse().unwrap()));
        assert!(parse_hostfile("node1 cores=4").is_err());
        assert!(parse_hostfile("node1 slots=0").is_err());
        assert!(parse_hostfile("# nothing\n").is_err());
    }

    #[test]
    fn a_star_spreads_nodes_over_devices_and_is_a_valid_fabric() {
        let addrs: Vec<SocketAddr> = (0..3)
            .map(|k| format!("127.0.0.1:{}", 7400 + k).parse().unwrap())
            .collect();
        let text = star_topology(8, &addrs).unwrap();
        let config = crate::fabric::file::parse(&text).unwrap();
        let span = config.span.unwrap();
        assert_eq!(span.members.len(), 3);
        let owner = |n: u32| span.switch_owner[config.topology.attachment(n).1];
        let by_member: Vec<usize> = (0..8).map(owner).collect();
        assert_eq!(by_member, [0, 0, 1, 1, 1, 2, 2, 2]);
        assert!(star_topology(2, &addrs).is_err());
    }
}
