//! The ulnic device: a vhost-user backend emulating a user-level NIC, one
//! process serving many ports (nodes) joined by a switch fabric.
//!
//! Layout follows rust-vmm's vhost-device crates: `backend` (the vhost-user
//! side of one port), `control` (control-queue commands), `fabric` (nodes and
//! the data path), `endpoint` (one endpoint's rings), `engine` (the polling
//! thread), `guest` (checked guest-memory access).

pub mod backend;
pub mod bench;
pub mod bench_rdma;
pub mod bench_utlb;
pub mod chain;
pub mod cluster;
pub mod control;
pub mod driver_check;
pub mod driver_fuzz;
pub mod endpoint;
pub mod engine;
pub mod fabric;
pub mod guest;
pub mod raw_driver;
pub mod rdma;
pub mod redirect;
pub mod region;
pub mod selftest;
pub mod transfer;
pub mod utlb;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use log::{error, info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserDaemon, VringT};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::backend::PortBackend;
use crate::fabric::Fabric;

/// Errors starting or steering the device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is not usable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A port socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: vhost::vhost_user::Error,
    },
    /// A node number past the device's last port.
    #[error("no node {node}: the device has {nodes} node(s), numbered from 0")]
    NoSuchNode {
        /// The number asked for.
        node: u32,
        /// How many nodes there are.
        nodes: u32,
    },
    /// An OS resource could not be created.
    #[error("cannot create {what}: {source}")]
    Os {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// A validated device configuration.
#[derive(Debug, Clone)]
pub struct Configuration {
    /// One socket per port; port `i` is node `i`.
    pub sockets: Vec<PathBuf>,
    /// Endpoints per port.
    pub max_endpoints: u32,
    /// How long the engine keeps polling after the last work before it asks
    /// for doorbells and sleeps.
    pub poll_for: Duration,
    /// Tripwires each endpoint may set.
    pub tripwires: u32,
    /// Shape of the device's UTLB translation cache.
    pub utlb_cache: utlb::CacheConfig,
}

impl Configuration {
    /// Checks the limits of spec §3.
    pub fn validate(&self) -> Result<(), Error> {
        if self.sockets.is_empty() {
            return Err(Error::Config("at least one port socket is needed".into()));
        }
        if self.sockets.len() > region::MAX_PORTS {
            return Err(Error::Config(format!(
                "at most {} ports (nodes) per device",
                region::MAX_PORTS
            )));
        }
        if !(1..=ulnic_abi::MAX_TRIPWIRES_LIMIT).contains(&self.tripwires) {
            return Err(Error::Config(format!(
                "--tripwires must be between 1 and {}",
                ulnic_abi::MAX_TRIPWIRES_LIMIT
            )));
        }
        self.utlb_cache.validate().map_err(Error::Config)?;
        if !(1..=ulnic_abi::MAX_ENDPOINTS_LIMIT).contains(&self.max_endpoints) {
            return Err(Error::Config(format!(
                "--endpoints must be between 1 and {}",
                ulnic_abi::MAX_ENDPOINTS_LIMIT
            )));
        }
        Ok(())
    }

    /// Socket paths `dir/node0.sock` ... for `n` nodes.
    pub fn socket_paths(dir: &Path, n: u32) -> Vec<PathBuf> {
        (0..n).map(|i| dir.join(format!("node{i}.sock"))).collect()
    }
}

/// State shared by every port thread and the engine.
pub struct Switch {
    fabric: Mutex<Fabric>,
    wake: EventFd,
    /// Set to stop the engine.
    pub stop: AtomicBool,
    /// Endpoints per port.
    pub max_endpoints: u32,
    /// Number of nodes.
    pub nodes: u32,
    /// Node `i` watches its shared memory under key `watch_base + i`
    /// (`region`).
    pub watch_base: u32,
}

impl Switch {
    /// Locks the fabric. A panic elsewhere cannot leave it half-updated in a
    /// way that matters more than stopping would, so poisoning is ignored.
    pub fn lock(&self) -> MutexGuard<'_, Fabric> {
        self.fabric.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the engine if it sleeps.
    pub fn wake(&self) {
        let _ = self.wake.write(1);
    }

    /// Ends the connection of every port whose shared memory faulted
    /// (a file shrunk under the device, spec §2.3): that frontend loses its
    /// port, everyone else goes on. Cheap when nothing faulted.
    pub fn disconnect_faulted(&self) {
        if !region::pending() {
            return;
        }
        for key in region::take_faulted(self.watch_base, self.nodes) {
            let node = key - self.watch_base;
            let mut f = self.lock();
            let Some(n) = f.nodes.get_mut(node as usize) else {
                continue;
            };
            n.memory_faults += 1;
            error!(
                "node {node}: its shared memory shrank under the device (contained fault {} in all); disconnecting its frontend",
                region::fault_count()
            );
            if let Some(d) = n.disconnect.take() {
                d.shutdown();
            }
            // Nothing more is read from that memory.
            f.reset_node(node);
        }
    }

    /// Stops serving port `node`'s control queue (`stalled`), or serves it
    /// again: a fault injected on purpose, to see how a driver copes with
    /// a device that stops answering commands. Commands wait in the ring
    /// while doorbells, data and notifications go on; when the stall ends
    /// the waiting commands run. Kept across resets of the port.
    pub fn stall_control(&self, node: u32, stalled: bool) -> Result<(), Error> {
        let mut f = self.lock();
        let n = f.nodes.get_mut(node as usize).ok_or(Error::NoSuchNode {
            node,
            nodes: self.nodes,
        })?;
        n.control_stalled = stalled;
        info!(
            "node {node}: control queue {}",
            if stalled {
                "stalled (fault injected)"
            } else {
                "served again"
            }
        );
        if !stalled {
            if let Some(vring) = &n.control {
                // Kicks the queue as the driver would, so the port's own
                // thread serves what waited.
                if let Some(kick) = vring.get_ref().get_kick() {
                    let one = 1u64.to_ne_bytes();
                    // SAFETY: writes 8 bytes from a live buffer to the kick
                    // fd the port thread polls; if the frontend gave some
                    // other kind of fd the write just fails.
                    unsafe { libc::write(kick.as_raw_fd(), one.as_ptr().cast(), one.len()) };
                }
            }
        }
        Ok(())
    }

    /// Sleeps until woken or `timeout`.
    pub fn sleep(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd for the duration of the call, and
        // the count passed is 1.
        unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
        let _ = self.wake.read();
    }
}

/// A running device.
pub struct Device {
    switch: Arc<Switch>,
    sockets: Vec<PathBuf>,
    engine: Option<JoinHandle<()>>,
    ports: Vec<JoinHandle<()>>,
}

impl Device {
    /// Creates the port sockets, starts one thread per port and the engine.
    /// Clients may connect as soon as this returns.
    pub fn start(config: Configuration) -> Result<Device, Error> {
        config.validate()?;
        region::install();
        let nodes = config.sockets.len() as u32;
        let switch = Arc::new(Switch {
            fabric: Mutex::new({
                let mut f = Fabric::new(nodes, config.max_endpoints);
                f.max_tripwires = config.tripwires;
                f.utlb_cache = utlb::TranslationCache::new(config.utlb_cache);
                f
            }),
            wake: EventFd::new(EFD_NONBLOCK).map_err(|source| Error::Os {
                what: "eventfd",
                source,
            })?,
            stop: AtomicBool::new(false),
            max_endpoints: config.max_endpoints,
            nodes,
            watch_base: region::reserve_keys(nodes).map_err(|e| Error::Config(e.to_string()))?,
        });
        let mut ports = Vec::new();
        for (node, path) in config.sockets.iter().enumerate() {
            let listener = Listener::new(path, true).map_err(|source| Error::Listen {
                path: path.clone(),
                source,
            })?;
            let sw = switch.clone();
            let path = path.clone();
            let port = std::thread::Builder::new()
                .name(format!("ulnic-port{node}"))
                .spawn(move || serve_port(node as u32, sw, listener, &path))
                .map_err(|source| Error::Os {
                    what: "port thread",
                    source,
                })?;
            ports.push(port);
            info!(
                "node {node}: listening on {}",
                config.sockets[node].display()
            );
        }
        let sw = switch.clone();
        let poll_for = config.poll_for;
        let engine = std::thread::Builder::new()
            .name("ulnic-engine".into())
            .spawn(move || engine::run(sw, poll_for))
            .map_err(|source| Error::Os {
                what: "engine thread",
                source,
            })?;
        Ok(Device {
            switch,
            sockets: config.sockets,
            engine: Some(engine),
            ports,
        })
    }

    /// The shared state, for reports and tests.
    pub fn switch(&self) -> &Arc<Switch> {
        &self.switch
    }

    /// The port sockets.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }
}

/// How long stopping a device waits for each port thread to finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

impl Drop for Device {
    /// Stops the device as a crash would, but in order: every frontend's
    /// connection is closed (to QEMU its backend is gone), the port threads
    /// and the engine end, and the sockets are removed.
    fn drop(&mut self) {
        self.switch.stop.store(true, Ordering::Relaxed);
        let handles: Vec<_> = self
            .switch
            .lock()
            .nodes
            .iter_mut()
            .filter_map(|n| n.disconnect.take())
            .collect();
        for h in handles {
            h.shutdown();
        }
        // A port thread waiting in accept() is woken by a connection that
        // ends at once; it then sees `stop`.
        for s in &self.sockets {
            let _ = std::os::unix::net::UnixStream::connect(s);
        }
        self.switch.wake();
        if let Some(e) = self.engine.take() {
            let _ = e.join();
        }
        let deadline = std::time::Instant::now() + STOP_GRACE;
        for p in self.ports.drain(..) {
            while !p.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if p.is_finished() {
                let _ = p.join();
            } else {
                warn!("a port thread did not stop within {STOP_GRACE:?}");
            }
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// How long a pending connection waits for the current frontend to leave
/// before it is refused.
const REFUSE_GRACE: Duration = Duration::from_secs(2);

/// Accepts and closes connections to a port that already has a frontend,
/// until `connected` clears and `ended` is signalled: one VM or process per
/// port (spec §2). Waiting on `ended` as well as the listener lets the port
/// take its next frontend the moment the current one leaves.
fn refuse_others(node: u32, listener: &Listener, connected: &AtomicBool, ended: &EventFd) {
    while connected.load(Ordering::Relaxed) {
        let mut pfd = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: ended.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds for descriptors that outlive the call.
        let ready = unsafe { libc::poll(pfd.as_mut_ptr(), 2, 1000) };
        if ready <= 0 || pfd[0].revents == 0 {
            continue;
        }
        // A frontend that just left may not be noticed yet, and its
        // successor (a process attaching again at once) is no intruder:
        // give the current connection a moment to end before refusing.
        let grace = std::time::Instant::now() + REFUSE_GRACE;
        while connected.load(Ordering::Relaxed) && std::time::Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
        }
        if connected.load(Ordering::Relaxed) {
            if let Ok(Some(extra)) = listener.accept() {
                warn!("node {node}: refused a second frontend (the port is in use)");
                drop(extra);
            }
        }
    }
}

/// Serves one port forever: a connection at a time, freeing the port's state
/// when a frontend goes away so a rebooted VM starts clean.
fn serve_port(node: u32, switch: Arc<Switch>, mut listener: Listener, path: &Path) {
    // Written when a connection ends, so `refuse_others` stops at once.
    let left = match EventFd::new(EFD_NONBLOCK) {
        Ok(e) => e,
        Err(e) => {
            error!("node {node}: eventfd: {e}");
            return;
        }
    };
    loop {
        if switch.stop.load(Ordering::Relaxed) {
            return;
        }
        let backend = Arc::new(PortBackend::new(node, switch.clone()));
        let mut daemon = match VhostUserDaemon::new(
            format!("ulnic-node{node}"),
            backend.clone(),
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        ) {
            Ok(d) => d,
            Err(e) => {
                error!("node {node}: cannot create vhost-user daemon: {e}");
                return;
            }
        };
        if let Err(e) = daemon.start(&mut listener) {
            drop(daemon);
            backend.close_exit_events();
            error!("node {node}: accept on {} failed: {e}", path.display());
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        {
            let mut f = switch.lock();
            f.nodes[node as usize].disconnect = daemon.shutdown_handle();
            f.nodes[node as usize].connections += 1;
            // A new connection is a new device as far as the driver can
            // tell: nothing it created before exists (spec §2.2, §2.5).
            f.nodes[node as usize].renew_epoch();
            info!(
                "node {node}: frontend connected (connection {})",
                f.nodes[node as usize].connections
            );
        }
        // While this frontend is attached, others are told at once (their
        // connection is closed) instead of waiting in the backlog.
        let connected = AtomicBool::new(true);
        // The last connection's signal, if nobody consumed it.
        let _ = left.read();
        let ended = std::thread::scope(|s| {
            s.spawn(|| refuse_others(node, &listener, &connected, &left));
            let r = daemon.wait();
            connected.store(false, Ordering::Relaxed);
            let _ = left.write(1);
            r
        });
        match ended {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => info!("node {node}: frontend disconnected"),
            Err(e) => warn!("node {node}: frontend connection ended: {e}"),
        }
        drop(daemon);
        backend.close_exit_events();
        let mut f = switch.lock();
        // Closing the node's endpoints sends their close messages first.
        f.reset_node(node);
        let c = f.counters;
        info!(
            "node {node}: state freed; fabric totals: {} delivered, {} returned to sender, {} notifications, {} close messages delivered, {} undeliverable",
            c.delivered, c.returned, c.notifications, c.closes_delivered, c.closes_undeliverable
        );
        let n = &mut f.nodes[node as usize];
        n.mem = None;
        n.features = 0;
        n.disconnect = None;
        drop(f);
        region::unwatch(switch.watch_base + node);
    }
}
