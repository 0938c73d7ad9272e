//! How sockets sleep (docs/sockets.md §6): poll for the configured budget
//! (`SockConfig::spin`), then watch the socket's endpoint with this
//! thread's [`Watcher`] (spec §6 "Several waiters"), arm it, look once
//! more, and sleep until a notification, the socket's own timer (a
//! keepalive, a connect deadline) or the caller's deadline. Nothing is
//! found by looking again on a clock: a wake-up by the clock that finds
//! work no notification announced is counted as found by timer
//! ([`WakeStats`]), which is a lost wake-up, a bug.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Domain;
use crate::sock::stream::io_err;
use crate::watcher::Watcher;

/// Counters of how this process's socket waits ended (docs/sockets.md
/// §6): printed at exit by the preload layer with `ULNIC_STATS=1`.
///
/// ```
/// let s = ulnic::sock::wake_stats();
/// assert_eq!(s.found_by_timer, 0);
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WakeStats {
    /// Sleeps a notification (or a poke, or a kernel descriptor) ended.
    pub notified: u64,
    /// Sleeps the clock ended for a timer that was due: a keepalive, a
    /// connect deadline, the caller's own timeout.
    pub timer: u64,
    /// Sleeps the clock ended after which the endpoint had work that no
    /// notification announced: lost wake-ups, found late. 0 unless a bug.
    pub found_by_timer: u64,
    /// Looks again on a clock where nothing can notify this process (a
    /// child forked under host attach, whose parent reads the
    /// notification queue; docs/sockets.md §7 "fork").
    pub unfed_looks: u64,
}

static NOTIFIED: AtomicU64 = AtomicU64::new(0);
static TIMER: AtomicU64 = AtomicU64::new(0);
static FOUND_BY_TIMER: AtomicU64 = AtomicU64::new(0);
static UNFED: AtomicU64 = AtomicU64::new(0);

/// This process's [`WakeStats`] so far.
///
/// ```
/// println!("{:?}", ulnic::sock::wake_stats());
/// ```
pub fn wake_stats() -> WakeStats {
    WakeStats {
        notified: NOTIFIED.load(Ordering::Relaxed),
        timer: TIMER.load(Ordering::Relaxed),
        found_by_timer: FOUND_BY_TIMER.load(Ordering::Relaxed),
        unfed_looks: UNFED.load(Ordering::Relaxed),
    }
}

/// How a sleep ended, to be counted with [`count_wake`].
///
/// ```
/// ulnic::sock::count_wake(ulnic::sock::WakeKind::Notified);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeKind {
    /// A notification, a poke or a kernel descriptor.
    Notified,
    /// The clock, for a timer that was due.
    Timer,
    /// The clock, and then work no notification announced.
    FoundByTimer,
    /// The clock, where nothing can notify (see [`WakeStats::unfed_looks`]).
    Unfed,
}

/// Counts one sleep's end (for waits outside the library, such as the
/// preload layer's `poll` and `epoll`).
///
/// ```
/// ulnic::sock::count_wake(ulnic::sock::WakeKind::Timer);
/// ```
pub fn count_wake(kind: WakeKind) {
    let c = match kind {
        WakeKind::Notified => &NOTIFIED,
        WakeKind::Timer => &TIMER,
        WakeKind::FoundByTimer => &FOUND_BY_TIMER,
        WakeKind::Unfed => &UNFED,
    };
    c.fetch_add(1, Ordering::Relaxed);
}

/// How long a waiter that nothing can notify sleeps before it looks again
/// (`WakeStats::unfed_looks`).
pub const UNFED_LOOK: Duration = Duration::from_millis(10);

/// This thread's watcher, made from `dom` the first time.
pub(crate) fn thread_watcher(dom: &Arc<dyn Domain>) -> io::Result<Arc<Watcher>> {
    Watcher::this_thread(dom).map_err(io_err)
}

/// Ends a thread watcher's watch of one endpoint when dropped.
pub(crate) struct Watching {
    w: Arc<Watcher>,
    dom: Arc<dyn Domain>,
    id: u32,
}

impl Watching {
    /// Starts watching endpoint `id` of `dom` with this thread's watcher.
    pub(crate) fn start(dom: &Arc<dyn Domain>, id: u32) -> io::Result<Watching> {
        let w = thread_watcher(dom)?;
        w.watch_id(dom, id).map_err(io_err)?;
        Ok(Watching {
            w,
            dom: dom.clone(),
            id,
        })
    }

    /// The watcher.
    pub(crate) fn watcher(&self) -> &Arc<Watcher> {
        &self.w
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.w.unwatch_id(&self.dom, self.id);
    }
}

/// How a [`sleep`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// A notification or poke.
    Notified,
    /// The clock.
    Clock,
}

/// Sleeps on `w` until woken or `until` (`None`: no limit); a signal ends
/// it with `EINTR`. Where nothing feeds the watcher (a forked child under
/// host attach), sleeps at most `UNFED_LOOK`.
pub(crate) fn sleep(w: &Watcher, until: Option<Instant>) -> io::Result<Woke> {
    let fed = w.fed();
    let mut left = until.map_or(Duration::from_secs(3600), |u| {
        u.saturating_duration_since(Instant::now())
    });
    if !fed {
        left = left.min(UNFED_LOOK);
    }
    if w.wait(left).map_err(io_err)? {
        count_wake(WakeKind::Notified);
        return Ok(Woke::Notified);
    }
    if !fed {
        count_wake(WakeKind::Unfed);
    }
    Ok(Woke::Clock)
}

/// After a sleep the clock ended: `work` is whether the endpoint has work
/// now (its re-arm's answer). Counts the wake-up: found by timer when work
/// came that no notification announced (the watcher was not woken even
/// now), else a timer's.
///
/// ```no_run
/// # let net = ulnic::sock::Net::open()?;
/// let w = net.watcher()?;
/// ulnic::sock::count_clock(&w, false);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn count_clock(w: &Watcher, work: bool) {
    if !w.fed() {
        return; // counted as an unfed look already
    }
    if work && w.take() == 0 {
        count_wake(WakeKind::FoundByTimer);
    } else {
        count_wake(WakeKind::Timer);
    }
}

/// Waits until `ready(s)` or `deadline`: true when ready. Polls (yielding
/// the core) for `spin`, then sleeps as the module says; `arm(s)` arms the
/// endpoint and says whether work waits; `timer(s)` is the socket's own
/// next timer.
pub(crate) fn until<S>(
    s: &mut S,
    spin: Duration,
    deadline: Option<Instant>,
    endpoint: (&Arc<dyn Domain>, u32),
    mut ready: impl FnMut(&mut S) -> bool,
    mut arm: impl FnMut(&mut S) -> io::Result<bool>,
) -> io::Result<bool> {
    let spin_until = Instant::now() + spin;
    let mut watching: Option<Watching> = None;
    loop {
        if ready(s) {
            return Ok(true);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(false);
        }
        if now < spin_until {
            std::thread::yield_now();
            continue;
        }
        if watching.is_none() {
            watching = Some(Watching::start(endpoint.0, endpoint.1)?);
        }
        let w = watching.as_ref().map(Watching::watcher).cloned();
        let Some(w) = w else { continue };
        if arm(s)? {
            continue;
        }
        if sleep(&w, deadline)? == Woke::Clock {
            let work = arm(s)?;
            count_clock(&w, work);
        }
    }
}
