//! Signals into a frontend's eventfds, and reads of its kick eventfds,
//! that can never hold the device (spec §8).
//!
//! A queue's call fd belongs to the frontend: it chose the file, and it
//! shares the file description, flags included, with the device. An eventfd
//! whose counter is one short of its limit blocks a writer until someone
//! reads it, unless the description is non-blocking, and the frontend can
//! clear `O_NONBLOCK` whenever it likes. The device signals notification
//! queues from its engine while it holds the shard lock, so one such write
//! would stop every node. Checking first (poll for `POLLOUT`) races with a
//! frontend that fills the counter in between.
//!
//! So every signal is a plain write, bracketed: the writing thread marks
//! itself busy, and a watchdog thread that finds the same write still in
//! progress on two looks in a row (one [`TICK`] apart) interrupts it with a
//! signal whose handler does nothing and does not restart the call. The
//! write returns `EINTR` and [`signal`] reports [`SignalError::Full`], as it
//! does for `EAGAIN` (the same full counter, non-blocking): the caller stops
//! that queue. A write that was only slow (the thread preempted) is not
//! affected: the interruption only ends a sleep, and a thread that is
//! running takes the empty handler and goes on.
//!
//! An honest frontend never gets there: the device writes 1 at a time and
//! the counter's limit is 2^64 - 2.
//!
//! Kicks are the mirror case: epoll says a kick eventfd is readable, the
//! frontend reads it first, and the device's read of a blocking eventfd
//! sleeps, holding that queue's lock, which the engine then waits for.
//! [`consume`] is bracketed the same way and reports the interrupted read
//! as [`ConsumeError::Blocked`].

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use log::{error, warn};

/// How often the watchdog looks; a blocked write is interrupted within
/// two of these.
pub const TICK: Duration = Duration::from_millis(20);

/// Why a signal did not reach the frontend.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// The eventfd's counter cannot take another signal: the frontend
    /// filled it (and, unless it is non-blocking, the write was stopped by
    /// the watchdog).
    #[error("its eventfd cannot take another signal (the frontend filled its counter)")]
    Full,
    /// Any other failure of the write (not an eventfd, closed, ...).
    #[error("cannot write its eventfd: {0}")]
    Io(io::Error),
}

/// One thread that writes frontends' eventfds, as the watchdog sees it.
struct Writer {
    thread: libc::pthread_t,
    /// Odd while a write is in progress; bumped at its start and its end.
    state: AtomicU64,
    /// `state` at the watchdog's previous look (only the watchdog writes it).
    seen: AtomicU64,
}

/// Every thread that has signalled and is still alive. A thread takes
/// itself out (under this lock) before it exits, so the watchdog never
/// signals a thread that is gone.
static WRITERS: Mutex<Vec<Arc<Writer>>> = Mutex::new(Vec::new());
/// Whether the interrupting signal's handler is ours (another handler for
/// it in this process means the watchdog must not send it).
static ARMED: AtomicBool = AtomicBool::new(false);
/// Writes the watchdog interrupted since the process started.
static INTERRUPTED: AtomicU64 = AtomicU64::new(0);

/// This thread's registration; it leaves `WRITERS` when the thread exits.
struct Registration(Arc<Writer>);

impl Registration {
    fn new() -> Self {
        let w = Arc::new(Writer {
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() },
            state: AtomicU64::new(0),
            seen: AtomicU64::new(0),
        });
        lock_writers().push(w.clone());
        Registration(w)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock_writers().retain(|w| !Arc::ptr_eq(w, &self.0));
    }
}

thread_local! {
    static MINE: Registration = Registration::new();
}

fn lock_writers() -> std::sync::MutexGuard<'static, Vec<Arc<Writer>>> {
    // The list stays consistent whatever a panicking holder did.
    WRITERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The signal that interrupts a blocked write: a real-time one, which
/// nothing else in the device uses.
fn interrupt_signal() -> libc::c_int {
    libc::SIGRTMIN() + 6
}

extern "C" fn on_interrupt(_: libc::c_int) {}

/// Installs the interrupting signal's handler and starts the watchdog,
/// once per process. Without them (another handler already owns the
/// signal) writes are still made, just not rescued.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "default" value that we
        // then fill in; sigaction only reads `sa` and writes `old`.
        let ours = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            // No SA_RESTART: the interrupted write must return EINTR.
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            let sig = interrupt_signal();
            if libc::sigaction(sig, &sa, &mut old) != 0 {
                false
            } else if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
                // Someone else's: put it back.
                libc::sigaction(sig, &old, std::ptr::null_mut());
                false
            } else {
                true
            }
        };
        if !ours {
            warn!(
                "signal {} has another handler: a frontend that fills its call eventfd can hold the device",
                interrupt_signal()
            );
            return;
        }
        ARMED.store(true, Ordering::Release);
        let spawned = std::thread::Builder::new()
            .name("ulnic-watchdog".into())
            .spawn(watch);
        if let Err(e) = spawned {
            ARMED.store(false, Ordering::Release);
            error!("cannot start the eventfd watchdog: {e}");
        }
    });
}

/// The watchdog: interrupts every write that made no progress since its
/// last look.
fn watch() {
    loop {
        std::thread::sleep(TICK);
        let writers = lock_writers();
        for w in writers.iter() {
            let now = w.state.load(Ordering::Acquire);
            let before = w.seen.swap(now, Ordering::Relaxed);
            if now % 2 == 1 && now == before {
                INTERRUPTED.fetch_add(1, Ordering::Relaxed);
                // SAFETY: `w.thread` is alive: it would have taken itself
                // out of `writers`, whose lock we hold, before exiting.
                unsafe { libc::pthread_kill(w.thread, interrupt_signal()) };
            }
        }
    }
}

/// Runs `op`, an 8-byte read or write of eventfd `fd`, where the watchdog
/// can end it; returns its result and errno. `ready` is the poll readiness that
/// says `op` would not block, checked instead when this thread is exiting
/// (its registration gone): then `None` if `fd` is not ready.
fn guarded(fd: RawFd, ready: libc::c_short, op: impl Fn() -> isize) -> Option<(isize, io::Error)> {
    let run = || {
        let n = op();
        (n, io::Error::last_os_error())
    };
    match MINE.try_with(|r| {
        r.0.state.fetch_add(1, Ordering::AcqRel);
        let out = run();
        r.0.state.fetch_add(1, Ordering::AcqRel);
        out
    }) {
        Ok(out) => Some(out),
        Err(_) => {
            let mut p = libc::pollfd {
                fd,
                events: ready,
                revents: 0,
            };
            // SAFETY: one valid pollfd, zero timeout.
            if unsafe { libc::poll(&mut p, 1, 0) } != 1 {
                return None;
            }
            Some(run())
        }
    }
}

/// Writes the 8-byte value 1 to eventfd `fd` (a queue's call fd, or a kick
/// fd the device rings for its driver). Never blocks for longer than two
/// [`TICK`]s once [`install`] ran.
pub fn signal(fd: RawFd) -> Result<(), SignalError> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer to a descriptor the caller
    // holds; a descriptor of another kind only fails the write.
    let write = || unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
    let Some((n, err)) = guarded(fd, libc::POLLOUT, write) else {
        return Err(SignalError::Full);
    };
    if n == one.len() as isize {
        return Ok(());
    }
    match err.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EINTR) => Err(SignalError::Full),
        _ => Err(SignalError::Io(err)),
    }
}

/// What reading a frontend's kick eventfd found.
#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    /// Nothing to read: someone else (the frontend itself) took the count,
    /// and the eventfd is non-blocking.
    #[error("its kick eventfd was empty")]
    Empty,
    /// The read slept on an empty blocking eventfd (the frontend drained it
    /// itself) until the watchdog ended it.
    #[error("its kick eventfd was drained by the frontend and blocks the device's read")]
    Blocked,
    /// Any other failure of the read.
    #[error("cannot read its kick eventfd: {0}")]
    Io(io::Error),
}

/// Reads (and so resets) eventfd `fd`, a queue's kick fd that epoll said
/// was readable. Never blocks for longer than two [`TICK`]s once
/// [`install`] ran.
pub fn consume(fd: RawFd) -> Result<(), ConsumeError> {
    let read = || {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer from a
        // descriptor the caller holds.
        unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) }
    };
    let Some((n, err)) = guarded(fd, libc::POLLIN, read) else {
        return Err(ConsumeError::Empty);
    };
    if n == 8 {
        return Ok(());
    }
    match err.raw_os_error() {
        Some(libc::EAGAIN) => Err(ConsumeError::Empty),
        Some(libc::EINTR) => Err(ConsumeError::Blocked),
        _ => Err(ConsumeError::Io(err)),
    }
}

/// Writes the watchdog has interrupted in this process.
pub fn interrupted() -> u64 {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Whether blocked writes are rescued (see [`install`]).
pub fn armed() -> bool {
    ARMED.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    fn fill(e: &EventFd) {
        e.write(u64::MAX - 1).unwrap();
    }

    #[test]
    fn a_signal_adds_one() {
        install();
        let e = EventFd::new(EFD_NONBLOCK).unwrap();
        signal(std::os::fd::AsRawFd::as_raw_fd(&e)).unwrap();
        signal(std::os::fd::AsRawFd::as_raw_fd(&e)).unwrap();
        assert_eq!(e.read().unwrap(), 2);
    }

    #[test]
    fn a_full_nonblocking_eventfd_is_reported_at_once() {
        install();
        let e = EventFd::new(EFD_NONBLOCK).unwrap();
        fill(&e);
        assert!(matches!(
            signal(std::os::fd::AsRawFd::as_raw_fd(&e)),
            Err(SignalError::Full)
        ));
    }

    /// Runs `f` on a thread of its own and gives up on it after a minute:
    /// a watchdog that never interrupts fails the test instead of hanging
    /// it.
    fn aside<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(f());
        });
        result
            .recv_timeout(Duration::from_secs(60))
            .expect("still blocked after 60 s: the watchdog did not interrupt it")
    }

    /// The errno of a guarded 8-byte write of 1 to `fd` from this thread
    /// (`None` when the write went through).
    fn guarded_write_errno(fd: RawFd) -> Option<i32> {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to the caller's eventfd.
        let write = || unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
        let (n, err) = guarded(fd, libc::POLLOUT, write).expect("this thread is registered");
        (n != 8).then(|| err.raw_os_error().unwrap_or(0))
    }

    #[test]
    fn a_full_blocking_eventfd_is_interrupted_not_waited_on() {
        install();
        assert!(armed());
        let (r, errno, counter) = aside(|| {
            let e = EventFd::new(0).unwrap();
            fill(&e);
            let fd = std::os::fd::AsRawFd::as_raw_fd(&e);
            // Nobody reads the eventfd: only the watchdog ends these
            // writes. A blocking write that returns without writing was
            // interrupted by a signal (EINTR), and only the watchdog sends
            // this thread one: this thread's own write was interrupted,
            // whatever other tests' writes the process-wide count saw.
            let r = signal(fd);
            let errno = guarded_write_errno(fd);
            (r, errno, e.read().unwrap())
        });
        assert!(matches!(r, Err(SignalError::Full)), "{r:?}");
        assert_eq!(errno, Some(libc::EINTR));
        // The counter is untouched: nothing was added.
        assert_eq!(counter, u64::MAX - 1);
        assert!(
            interrupted() >= 2,
            "the process counted fewer interruptions"
        );
    }

    #[test]
    fn a_kick_is_read_and_an_empty_eventfd_is_not_waited_on() {
        install();
        let e = EventFd::new(EFD_NONBLOCK).unwrap();
        e.write(3).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&e);
        consume(fd).unwrap();
        assert!(matches!(consume(fd), Err(ConsumeError::Empty)));
        // Blocking and empty (the frontend drained it): only the watchdog
        // ends this read. `Blocked` is an EINTR, which only the watchdog's
        // signal to this thread causes: this read was interrupted.
        let r = aside(|| {
            let blocking = EventFd::new(0).unwrap();
            consume(std::os::fd::AsRawFd::as_raw_fd(&blocking))
        });
        assert!(matches!(r, Err(ConsumeError::Blocked)), "{r:?}");
        assert!(interrupted() >= 1, "the process counted no interruption");
    }

    #[test]
    fn other_descriptors_fail_plainly() {
        install();
        assert!(matches!(signal(-1), Err(SignalError::Io(_))));
        assert!(matches!(consume(-1), Err(ConsumeError::Io(_))));
    }
}
