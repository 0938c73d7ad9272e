//! Bytes written beyond a peer's credit leave without their program's
//! help: a thread of the library's watches every connection with bytes
//! waiting and, woken by their notifications (credit coming back), sends
//! what new credit allows, as a kernel sends a socket's buffer while its
//! program does something else. It also holds the connections their
//! programs closed before they were accepted, until they are finished (the
//! kernel's orphaned sockets). It sleeps on a watcher of its own (spec §6
//! "Several waiters"), never looking again on a clock except for a
//! connection's own timers (its keepalive, an orphan's deadline).

use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant;

use crate::sock::wait;
use crate::watcher::Watcher;

/// A connection the flusher can push along.
pub(crate) trait Flushable: Send + Sync {
    /// Takes in credit and sends what it allows; true while bytes still
    /// wait (or, for an orphan, while it is not finished).
    fn try_flush(&self) -> bool;
    /// Watches the connection's endpoint with `w` and arms it: true when
    /// something waits already (look again instead of sleeping).
    fn watch_arm(&self, w: &Watcher) -> bool;
    /// Stops `w`'s watch of the connection's endpoint.
    fn unwatch(&self, w: &Watcher);
    /// The connection's next timer (`Core::next_timer`, an orphan's
    /// deadline).
    fn next_timer(&self) -> Option<Instant>;
    /// A watcher of the connection's device, for the flusher thread.
    fn new_watcher(&self) -> Option<Arc<Watcher>>;
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
    /// The connection, if it is this process's to look at.
    fn conn(&self) -> Option<Arc<dyn Flushable>> {
        match self {
            Entry::Watched(c) => c.upgrade(),
            Entry::Orphan(pid, c) => (*pid == std::process::id()).then(|| c.clone()),
        }
    }
}

struct Flusher {
    watched: Mutex<Vec<Entry>>,
    wake: Condvar,
    /// The process the thread runs in (a forked child starts its own).
    pid: Mutex<u32>,
    /// The thread's watcher, poked when a connection is added.
    watcher: Mutex<Option<Arc<Watcher>>>,
}

fn flusher() -> &'static Flusher {
    static F: OnceLock<Flusher> = OnceLock::new();
    F.get_or_init(|| Flusher {
        watched: Mutex::new(Vec::new()),
        wake: Condvar::new(),
        pid: Mutex::new(0),
        watcher: Mutex::new(None),
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
    if let Some(w) = f.watcher.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        w.poke();
    }
}

fn run() {
    let f = flusher();
    let mut watcher: Option<Arc<Watcher>> = None;
    loop {
        let list: Vec<Entry> = {
            let mut w = f.watched.lock().unwrap_or_else(|p| p.into_inner());
            while w.is_empty() {
                w = f.wake.wait(w).unwrap_or_else(|p| p.into_inner());
            }
            std::mem::take(&mut *w)
        };
        if watcher.is_none() {
            watcher = list
                .iter()
                .filter_map(Entry::conn)
                .find_map(|c| c.new_watcher());
            *f.watcher.lock().unwrap_or_else(|p| p.into_inner()) = watcher.clone();
        }
        let mut keep = Vec::with_capacity(list.len());
        let mut again = false;
        let mut until: Option<Instant> = None;
        for e in list {
            let Some(c) = e.conn() else {
                if let Entry::Orphan(pid, c) = e {
                    if pid != std::process::id() {
                        // The parent's: dropping it here would destroy
                        // the parent's endpoint.
                        std::mem::forget(c);
                    }
                }
                continue;
            };
            if !c.try_flush() {
                if let Some(w) = &watcher {
                    c.unwatch(w);
                }
                continue;
            }
            match &watcher {
                Some(w) => again |= c.watch_arm(w),
                None => again = true,
            }
            if let Some(t) = c.next_timer() {
                until = Some(until.map_or(t, |u| u.min(t)));
            }
            keep.push(e);
        }
        f.watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(keep);
        match &watcher {
            _ if again => std::thread::yield_now(),
            Some(w) => {
                if let Ok(wait::Woke::Clock) = wait::sleep(w, until) {
                    // The next pass looks at every connection; what it
                    // finds was due (a timer), or would have notified.
                    crate::wakes::count_wake(crate::wakes::WakeKind::Timer);
                }
            }
            // No watcher could be made (no memory for one): bytes still
            // leave whenever their program calls into the connection.
            None => std::thread::sleep(crate::wakes::UNFED_LOOK),
        }
    }
}
