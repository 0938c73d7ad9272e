//! How this process's blocking waits ended (docs/sockets.md §6): the
//! counters behind `ulnic::sock::wake_stats` and `ULNIC_STATS=1`. A leaf:
//! every waiter counts here, whatever it waits on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
