//! A running device: the switch, one thread per port socket and the
//! engine thread, stopped in order when dropped.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::{info, warn};
use vhost::vhost_user::Listener;

use crate::config::{Configuration, Error};
use crate::memory::region;
use crate::switch::{engine, Switch};
use crate::vhost::port::serve_port;

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
        region::install();
        let switch = Arc::new(Switch::new(&config)?);
        let mut ports = Vec::new();
        for (node, path) in config.sockets().iter().enumerate() {
            if !config.is_local(node as u32) {
                continue; // served by another device of the fabric
            }
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
                config.sockets()[node].display()
            );
        }
        let sw = switch.clone();
        let poll_for = config.poll_for();
        let engine = std::thread::Builder::new()
            .name("ulnic-engine".into())
            .spawn(move || engine::run(sw, poll_for))
            .map_err(|source| Error::Os {
                what: "engine thread",
                source,
            })?;
        Ok(Device {
            switch,
            sockets: config
                .sockets()
                .iter()
                .enumerate()
                .filter(|(n, _)| config.is_local(*n as u32))
                .map(|(_, p)| p.clone())
                .collect(),
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
