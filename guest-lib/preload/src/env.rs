//! What every socket of the process shares: the ulnic network's address
//! range, its socket context (opened at first use), the counts that
//! survive fork, and how long calls poll before they sleep.

use std::sync::Mutex;
use std::time::Duration;

use ulnic::sock::{Net, SockConfig};

use crate::config::{Inet, Target};
use crate::share::Arena;

/// The socket context, once asked for.
enum NetState {
    Unopened,
    Open(Net),
    /// Opening failed, or this process may not make sockets on the NIC
    /// (a forked child of a host-attached process): the kernel serves.
    Unavailable,
}

/// The process's shared socket state.
pub struct Env {
    /// Which addresses are ulnic's (`None`: none; the layer passes
    /// everything to the kernel).
    pub inet: Option<Inet>,
    net: Mutex<NetState>,
    /// Counts of sockets inherited across fork.
    pub arena: Option<Arena>,
    /// How long a call polls before it sleeps.
    pub spin: Duration,
}

impl Env {
    /// From the environment.
    pub fn new() -> Env {
        Env {
            inet: Inet::from_env(),
            net: Mutex::new(NetState::Unopened),
            arena: Arena::new(),
            spin: SockConfig::from_env().spin,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, NetState> {
        self.net.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The socket context, opened at the first call (`None` when there is
    /// no NIC: the kernel serves, as without the layer).
    pub fn net(&self) -> Option<Net> {
        let mut st = self.state();
        if let NetState::Unopened = *st {
            *st = match Net::open() {
                Ok(n) => NetState::Open(n),
                Err(e) => {
                    crate::real::warn(&format!(
                        "no ulnic NIC ({e}); sockets to ulnic addresses go to the kernel"
                    ));
                    NetState::Unavailable
                }
            };
        }
        match &*st {
            NetState::Open(n) => Some(n.clone()),
            _ => None,
        }
    }

    /// Where the socket address at `addr` (`len` bytes) points: the
    /// kernel when no range is set; this node's number for a loopback
    /// address in loopback mode (the kernel's when there is no NIC).
    ///
    /// # Safety
    /// `addr` is NULL or points to `len` readable bytes.
    pub unsafe fn target(&self, addr: *const libc::sockaddr, len: libc::socklen_t) -> Target {
        let Some(inet) = self.inet else {
            return Target::Kernel;
        };
        // SAFETY: the caller's promise.
        match unsafe { inet.target(addr, len) } {
            Target::Local(port) => match self.net() {
                Some(net) => Target::Node(net.node(), port),
                None => Target::Kernel,
            },
            t => t,
        }
    }

    /// The context if it is open (never opens it).
    pub fn net_if_open(&self) -> Option<Net> {
        match &*self.state() {
            NetState::Open(n) => Some(n.clone()),
            _ => None,
        }
    }

    /// In a forked child: sockets made from now on get a protection domain
    /// of the child's own (the inherited one may outlive the child's use
    /// of it in the parent). A host attachment cannot be shared that way:
    /// the child's new sockets are the kernel's.
    pub fn forked(&self) {
        let mut st = self.state();
        *st = if host_attached() {
            NetState::Unavailable
        } else {
            NetState::Unopened
        };
    }
}

/// Whether the NIC is reached by host attach (one process per node: a
/// forked child cannot attach again) rather than through a guest's driver.
pub fn host_attached() -> bool {
    std::env::var_os(ulnic::SOCKET_ENV).is_some()
        && !std::path::Path::new(ulnic::DEFAULT_DEVICE).exists()
}
