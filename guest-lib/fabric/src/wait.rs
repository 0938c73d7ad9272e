//! The one wait completion queues, counters and event queues share
//! (prov/util's util_wait in libfabric): a watcher of their own (spec §6
//! "Several waiters") watching the endpoints bound to them, so that no
//! queue takes another's wake-up, and a poke when another thread's progress
//! hands them something (a completion, a count, a connection event) while
//! one of their readers sleeps. Nothing is found by looking again on a
//! clock: a sleep the clock ends (a read's own bound, a caller's timeout)
//! that then finds work no notification announced is counted as found by
//! timer (docs/libfabric.md §3, `ULNIC_STATS=1`).

use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ulnic::Watcher;

use crate::nic;
use crate::progress::Progress;

/// A queue's wait: its watcher, and who sleeps on it.
#[derive(Default)]
pub struct Waiting {
    watcher: OnceLock<Option<Arc<Watcher>>>,
    /// Readers of the queue asleep (or about to be) inside the provider.
    sleepers: AtomicUsize,
    /// FI_GETWAIT handed the descriptor out: the program may sleep on it
    /// itself, so every change pokes.
    given: AtomicBool,
    /// What FI_GETWAIT hands out where the watcher has more than one
    /// descriptor (host attach: its eventfd, which pokes reach, and the
    /// notification descriptor, whose records feed it): an epoll set of
    /// both, readable while either is.
    joined: OnceLock<Option<std::os::fd::OwnedFd>>,
}

impl Waiting {
    /// The queue's watcher, made from the process's NIC the first time.
    fn watcher(&self) -> Option<&Arc<Watcher>> {
        self.watcher
            .get_or_init(|| nic::shared().ok()?.pd.new_watcher().ok())
            .as_ref()
    }

    /// FI_GETWAIT's descriptor: readable once something arrives for one
    /// of the queue's endpoints or another thread's progress gives the
    /// queue something (the watcher's; under host attach an epoll set of
    /// the watcher's eventfd and the attachment's notification
    /// descriptor, whose records this process reads itself in
    /// `fi_trywait` and reads).
    pub fn fd(&self) -> Option<c_int> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        self.given.store(true, Ordering::SeqCst);
        let fds = self.watcher()?.fds();
        if let [only] = fds[..] {
            return Some(only);
        }
        let joined = self.joined.get_or_init(|| {
            // SAFETY: plain system call; the descriptor it returns is new.
            let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if ep < 0 {
                return None;
            }
            // SAFETY: a new descriptor nothing else owns.
            let ep = unsafe { OwnedFd::from_raw_fd(ep) };
            for fd in &fds {
                let mut e = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: *fd as u64,
                };
                // SAFETY: our epoll set, a descriptor of the watcher, and
                // an event that lives for the call.
                if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, *fd, &mut e) } < 0
                {
                    return None;
                }
            }
            Some(ep)
        });
        joined.as_ref().map(|j| j.as_raw_fd())
    }

    /// Another thread's progress gave the queue something: a reader asleep
    /// on the queue (or the program, on the descriptor it was given) wakes.
    pub fn changed(&self) {
        // Pairs with `sleep`'s count and look: either the sleeper sees
        // what was pushed, or this sees the sleeper.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 || self.given.load(Ordering::SeqCst) {
            if let Some(w) = self.watcher.get().and_then(Option::as_ref) {
                w.poke();
            }
        }
    }

    /// Watches and arms `sources`, then checks `empty` (the queue's own
    /// entries): true when sleeping is safe, nothing having come
    /// meanwhile (`fi_trywait`).
    pub fn try_wait(&self, sources: &[Arc<dyn Progress>], empty: impl Fn() -> bool) -> bool {
        let mut ready = false;
        if let Some(w) = self.watcher() {
            // Old wake-ups go (and under host attach the records that
            // came are read): the arms below ask for new ones.
            w.take();
            for s in sources {
                s.watch(w);
            }
        }
        for s in sources {
            ready |= s.arm();
        }
        !ready && empty()
    }

    /// Sleeps until an endpoint of `sources` has something, another
    /// thread's progress gave the queue something, or `until` (at once if
    /// something waits already); counts how it ended. Without a watcher
    /// (the NIC cannot be opened) it gives the core away once.
    pub fn sleep(
        &self,
        sources: &[Arc<dyn Progress>],
        until: Option<Instant>,
        empty: impl Fn() -> bool,
    ) {
        let Some(w) = self.watcher() else {
            std::thread::yield_now();
            return;
        };
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.try_wait(sources, &empty) {
            let left = until.map_or(Duration::from_secs(3600), |u| {
                u.saturating_duration_since(Instant::now())
            });
            let woken = w.wait(left).unwrap_or(true);
            if woken {
                ulnic::sock::count_wake(ulnic::sock::WakeKind::Notified);
            } else {
                // The clock: work no notification (nor poke) announced is
                // a lost wake-up.
                let work = sources.iter().any(|s| s.arm()) || !empty();
                ulnic::sock::count_clock(w, work);
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}
