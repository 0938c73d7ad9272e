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

impl std::fmt::Display for WakeStats {
    /// The counters as the `ULNIC_STATS` report prints them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "notified {} timer {} found_by_timer {} unfed_looks {}",
            self.notified, self.timer, self.found_by_timer, self.unfed_looks
        )
    }
}

impl WakeStats {
    /// The counters of one `ULNIC_STATS` report line (`... wakes pid P:
    /// notified N timer T found_by_timer F unfed_looks U`); `None` for
    /// any other line.
    ///
    /// ```
    /// let l = "libulnic_preload: wakes pid 7: notified 3 timer 1 found_by_timer 0 unfed_looks 0";
    /// assert_eq!(ulnic::sock::WakeStats::from_report(l).unwrap().notified, 3);
    /// ```
    pub fn from_report(line: &str) -> Option<WakeStats> {
        let (_, counts) = line.split_once("wakes pid ")?.1.split_once(": ")?;
        let field = |name: &str| -> Option<u64> {
            let mut words = counts.split_whitespace();
            words.find(|w| *w == name)?;
            words.next()?.parse().ok()
        };
        Some(WakeStats {
            notified: field("notified")?,
            timer: field("timer")?,
            found_by_timer: field("found_by_timer")?,
            unfed_looks: field("unfed_looks")?,
        })
    }
}

/// This process's `ULNIC_STATS` report, from `who` (the layer, the
/// provider): nothing when it never slept on ulnic. With
/// `ULNIC_STATS=/a/file` the line is appended there (one line per
/// process) and `None` comes back; otherwise the line comes back for the
/// caller to write to standard error its own way.
///
/// ```no_run
/// if let Some(line) = ulnic::sock::wake_report("myprog") {
///     eprintln!("{line}");
/// }
/// ```
pub fn wake_report(who: &str) -> Option<String> {
    let w = wake_stats();
    if w == WakeStats::default() {
        return None;
    }
    let line = format!("{who}: wakes pid {}: {w}\n", std::process::id());
    match std::env::var("ULNIC_STATS") {
        Ok(path) if path.starts_with('/') => {
            use std::io::Write;
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path);
            if let Ok(mut f) = f {
                let _ = f.write_all(line.as_bytes());
            }
            None
        }
        _ => Some(line),
    }
}
