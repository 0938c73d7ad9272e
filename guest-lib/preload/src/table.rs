//! Which descriptors are interposed sockets. A program that never makes
//! one pays one atomic load per interposed call.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::sock::Sock;

/// Descriptor to socket (several descriptors may name one, by `dup`).
#[derive(Default)]
pub struct Table {
    map: RwLock<HashMap<c_int, Arc<Sock>>>,
    count: AtomicUsize,
}

impl Table {
    /// The socket `fd` names, if it is interposed.
    pub fn get(&self, fd: c_int) -> Option<Arc<Sock>> {
        if self.count.load(Ordering::Acquire) == 0 || fd < 0 {
            return None;
        }
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fd)
            .cloned()
    }

    /// Whether any descriptor is interposed.
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// `fd` names `sock` from now on (replacing what it named).
    pub fn insert(&self, fd: c_int, sock: Arc<Sock>) -> Option<Arc<Sock>> {
        let mut m = self.map.write().unwrap_or_else(|p| p.into_inner());
        let old = m.insert(fd, sock);
        self.count.store(m.len(), Ordering::Release);
        old
    }

    /// `fd` is no longer interposed: what it named.
    pub fn remove(&self, fd: c_int) -> Option<Arc<Sock>> {
        let mut m = self.map.write().unwrap_or_else(|p| p.into_inner());
        let old = m.remove(&fd);
        self.count.store(m.len(), Ordering::Release);
        old
    }

    /// Every interposed socket (once each) with one descriptor naming it.
    pub fn all(&self) -> Vec<(c_int, Arc<Sock>)> {
        let m = self.map.read().unwrap_or_else(|p| p.into_inner());
        let mut seen: Vec<*const Sock> = Vec::new();
        let mut out = Vec::new();
        for (&fd, s) in m.iter() {
            let p = Arc::as_ptr(s);
            if !seen.contains(&p) {
                seen.push(p);
                out.push((fd, s.clone()));
            }
        }
        out
    }

    /// Every interposed descriptor and its socket.
    pub fn all_fds(&self) -> Vec<(c_int, Arc<Sock>)> {
        let m = self.map.read().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(&fd, s)| (fd, s.clone())).collect()
    }

    /// How many descriptors name `sock`.
    pub fn names(&self, sock: &Arc<Sock>) -> usize {
        let m = self.map.read().unwrap_or_else(|p| p.into_inner());
        m.values().filter(|s| Arc::ptr_eq(s, sock)).count()
    }
}
