//! The wait of a socket that sleeps on its own endpoint (a listener, a
//! datagram socket): poll for the configured budget
//! (`SockConfig::spin`), then sleep in the driver in slices.

use std::io;
use std::time::{Duration, Instant};

/// Longest single sleep: a wait looks again at least this often.
const SLICE: Duration = Duration::from_millis(100);

/// Waits until `ready(s)` or `deadline`: true when ready. Polls (yielding
/// the core) for `spin`, then sleeps with `sleep(s, at_most)`.
pub(crate) fn until<S>(
    s: &mut S,
    spin: Duration,
    deadline: Option<Instant>,
    ready: impl Fn(&mut S) -> bool,
    sleep: impl Fn(&mut S, Duration) -> io::Result<()>,
) -> io::Result<bool> {
    let spin_until = Instant::now() + spin;
    loop {
        if ready(s) {
            return Ok(true);
        }
        let now = Instant::now();
        let left = deadline.map_or(SLICE, |d| d.saturating_duration_since(now));
        if left.is_zero() {
            return Ok(false);
        }
        if now < spin_until {
            std::thread::yield_now();
        } else {
            sleep(s, left.min(SLICE))?;
        }
    }
}
