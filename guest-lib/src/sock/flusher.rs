//! Bytes written beyond a peer's credit leave without their program's
//! help: a thread of the library's looks at every connection with bytes
//! waiting (every millisecond, while there are any) and sends what new
//! credit allows, as a kernel sends a socket's buffer while its program
//! does something else. It also holds the connections their programs
//! closed before they were accepted, until they are finished (the
//! kernel's orphaned sockets).

use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

/// A connection the flusher can push along.
pub(crate) trait Flushable: Send + Sync {
    /// Takes in credit and sends what it allows, if the connection is not
    /// busy in its program's hands; true while bytes still wait.
    fn try_flush(&self) -> bool;
}

/// A connection the thread looks at.
enum Entry {
    /// Its program holds it.
    Watched(Weak<dyn Flushable>),
    /// Its program closed it; the thread holds it, in process `pid` (a
    /// forked child's copy is the parent's to finish).
    Orphan(u32, Arc<dyn Flushable>),
}

impl Entry {
    /// Looks at it: true to keep it.
    fn keep(&self) -> bool {
        match self {
            Entry::Watched(c) => c.upgrade().is_some_and(|c| c.try_flush()),
            Entry::Orphan(pid, c) => *pid == std::process::id() && c.try_flush(),
        }
    }
}

struct Flusher {
    watched: Mutex<Vec<Entry>>,
    wake: Condvar,
    /// The process the thread runs in (a forked child starts its own).
    pid: Mutex<u32>,
}

fn flusher() -> &'static Flusher {
    static F: OnceLock<Flusher> = OnceLock::new();
    F.get_or_init(|| Flusher {
        watched: Mutex::new(Vec::new()),
        wake: Condvar::new(),
        pid: Mutex::new(0),
    })
}

/// Watches `c` until nothing waits in it.
pub(crate) fn watch(c: Weak<dyn Flushable>) {
    add(Entry::Watched(c));
}

/// Holds `c`, which its program closed, until it is finished.
pub(crate) fn adopt(c: Arc<dyn Flushable>) {
    add(Entry::Orphan(std::process::id(), c));
}

fn add(e: Entry) {
    let f = flusher();
    {
        let mut pid = f.pid.lock().unwrap_or_else(|p| p.into_inner());
        if *pid != std::process::id() {
            *pid = std::process::id();
            let spawned = std::thread::Builder::new()
                .name("ulnic-flusher".into())
                .spawn(run);
            if spawned.is_err() {
                // Without the thread, bytes still leave whenever their
                // program calls into the connection.
                log::warn!("ulnic: no flusher thread; waiting bytes go at the next call");
            }
        }
    }
    f.watched.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    f.wake.notify_one();
}

fn run() {
    let f = flusher();
    loop {
        let list: Vec<Entry> = {
            let mut w = f.watched.lock().unwrap_or_else(|p| p.into_inner());
            while w.is_empty() {
                w = f.wake.wait(w).unwrap_or_else(|p| p.into_inner());
            }
            std::mem::take(&mut *w)
        };
        let mut keep = Vec::with_capacity(list.len());
        for e in list {
            if e.keep() {
                keep.push(e);
            } else if let Entry::Orphan(pid, c) = e {
                if pid != std::process::id() {
                    // The parent's: dropping it here would destroy the
                    // parent's endpoint.
                    std::mem::forget(c);
                }
            }
        }
        f.watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(keep);
        std::thread::sleep(Duration::from_millis(1));
    }
}
