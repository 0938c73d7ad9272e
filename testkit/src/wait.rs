//! Waiting on facts: a condition polled until a deadline, failing with
//! what was last seen, never a guessed sleep.

use std::fmt::Debug;
use std::path::Path;
use std::time::{Duration, Instant};

/// The pause between two looks: short at first, then up to 10 ms.
fn pause(looks: u32) {
    match looks {
        0..=9 => std::thread::yield_now(),
        10..=99 => std::thread::sleep(Duration::from_micros(100)),
        _ => std::thread::sleep(Duration::from_millis(10)),
    }
}

/// Looks at `probe` until `done` accepts what it returns, for at most
/// `timeout`; returns that value. Panics with `what` and the value last
/// seen once the deadline passed.
pub fn wait_for<V: Debug>(
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> V,
    done: impl Fn(&V) -> bool,
) -> V {
    let deadline = Instant::now() + timeout;
    let mut looks = 0;
    loop {
        let v = probe();
        if done(&v) {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not within {timeout:?}; last seen {v:?}");
        }
        pause(looks);
        looks += 1;
    }
}

/// Waits until `cond` holds, for at most `timeout`; panics with `what`.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    wait_for(timeout, what, &mut cond, |ok| *ok);
}

/// Waits until `probe` returns a value, for at most `timeout`, and
/// returns it; panics with `what`.
pub fn eventually<T>(timeout: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let mut got = None;
    wait_until(timeout, what, || {
        got = probe();
        got.is_some()
    });
    got.expect("the probe returned a value")
}

/// Waits until `path` exists, for at most `timeout`.
pub fn wait_for_path(path: &Path, timeout: Duration) {
    wait_until(timeout, &format!("{} to appear", path.display()), || {
        path.exists()
    });
}

/// The calling thread's id, for [`until_blocked`].
pub fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The scheduler state of thread `tid` of this process (`R`, `S`, ...),
/// from /proc/self/task/TID/stat; `None` once it is gone.
fn thread_state(tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses.
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
}

/// Waits (up to 10 s) until thread `tid` of this process sleeps, state `S`
/// in /proc/self/task/TID/stat: a thread about to block in a call is then
/// blocked in it. Readiness by observation, not by a guessed sleep.
pub fn until_blocked(tid: i32) {
    wait_for(
        Duration::from_secs(10),
        &format!("thread {tid} to block"),
        || thread_state(tid),
        |s| *s == Some('S'),
    );
}

/// Whether `fd` becomes readable (`POLLIN`) within `ms` milliseconds, by
/// poll(2): for the tests of a notification descriptor.
pub fn readable(fd: std::os::fd::RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLIN != 0 }
}
