//! How sockets sleep (docs/sockets.md §6): poll for the configured budget
//! (`SockConfig::spin`), then watch the socket's endpoint with this
//! thread's [`Watcher`] (spec §6 "Several waiters"), arm it, look once
//! more, and sleep until a notification, the socket's own timer (a
//! keepalive, a connect deadline) or the caller's deadline. Nothing is
//! found by looking again on a clock: a wake-up by the clock that finds
//! work no notification announced is counted as found by timer
//! ([`WakeStats`]), which is a lost wake-up, a bug.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Domain;
use crate::error::Error;
use crate::wakes::{count_wake, WakeKind, UNFED_LOOK};
use crate::watcher::Watcher;

/// The library's error as an `io::Error` (its errno).
fn io_err(e: Error) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

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

/// How long a notification may still be on its way when the clock ended
/// a sleep just as work came (`count_clock`).
const NOTIFICATION_GRACE: Duration = Duration::from_millis(20);

/// After a sleep the clock ended: `work` is whether the endpoint has work
/// now (its re-arm's answer). Counts the wake-up: found by timer when work
/// came that no notification announced (the watcher was not woken even
/// now, nor within `NOTIFICATION_GRACE`), else a timer's.
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
    // Work whose notification is still on its way (the clock ended just
    // as it came; in a TCG guest an interrupt can take a while) is no
    // lost wake-up: it is given a moment to arrive.
    if work && w.take() == 0 && !w.wait(NOTIFICATION_GRACE).unwrap_or(true) {
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
