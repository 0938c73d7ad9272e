//! One node's socket: a vhost-user connection at a time, served by a
//! [`NodeBackend`]; the node's state is freed when its frontend leaves,
//! and a second frontend is refused while one is attached (spec §2).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use log::{error, info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::memory::region;
use crate::pio::Pio;
use crate::shard::Shard;
use crate::vhost::backend::NodeBackend;
use crate::vhost::reader;

/// How long a pending connection waits for the current frontend to leave
/// before it is refused.
const REFUSE_GRACE: Duration = Duration::from_secs(2);

/// Accepts and closes connections to a node that already has a frontend,
/// until `connected` clears and `ended` is signalled: one VM or process per
/// node (spec §2). Waiting on `ended` as well as the listener lets the node
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
                warn!("node {node}: refused a second frontend (the node is in use)");
                drop(extra);
            }
        }
    }
}

/// Serves one node forever: a connection at a time, freeing the node's state
/// when a frontend goes away so a rebooted VM starts clean.
pub fn serve_node(
    node: u32,
    shard: Arc<Shard>,
    pio: Arc<Pio>,
    mut listener: Listener,
    path: &Path,
) {
    // Written when a connection ends, so `refuse_others` stops at once.
    let left = match EventFd::new(EFD_NONBLOCK) {
        Ok(e) => e,
        Err(e) => {
            error!("node {node}: eventfd: {e}");
            return;
        }
    };
    loop {
        if shard.stop.load(Ordering::Relaxed) {
            return;
        }
        let backend = Arc::new(NodeBackend::new(node, shard.clone(), pio.clone()));
        // A name no other reader of this process has (tests run several
        // devices in one process), so its thread can be found by it.
        let name = reader::unique_name();
        let mut daemon = match VhostUserDaemon::new(
            name.clone(),
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
            backend.close_exit_fds();
            if shard.stop.load(Ordering::Relaxed) {
                return; // the device shut the listening socket to stop
            }
            error!("node {node}: accept on {} failed: {e}", path.display());
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        {
            let mut f = shard.lock();
            f.nodes[node as usize].disconnect = daemon.shutdown_handle();
            f.nodes[node as usize].connections += 1;
            // A new connection is a new device as far as the driver can
            // tell: nothing it created before exists (spec §2.2, §2.5).
            f.nodes[node as usize].renew_epoch();
            info!(
                "node {node}: frontend connected (connection {}, read by thread {name})",
                f.nodes[node as usize].connections
            );
        }
        // The reader names itself once it runs: give it a moment (after
        // the epoch is renewed: the frontend is already talking).
        let mut tid = None;
        for _ in 0..50 {
            tid = reader::find_thread(&name);
            if tid.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        shard.lock().nodes[node as usize].vhost_reader = tid;
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
        backend.close_exit_fds();
        let mut f = shard.lock();
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
        n.features_set = false;
        n.disconnect = None;
        n.vhost_reader = None;
        drop(f);
        // Its windows are revoked from their importers, its imports
        // forgotten (nothing can be sent to it now).
        pio.disconnected(node);
        region::unwatch(shard.watch_base + node);
    }
}
