//! `poll`, `ppoll`, `select` and `pselect` over interposed sockets and
//! kernel descriptors together: the sockets' readiness is computed in
//! user space, the rest asked of the kernel; to sleep, the sockets are
//! armed and the domain's notification descriptor waited on beside the
//! kernel's.

use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::pollfd;

use crate::env::Env;
use crate::real::{fail, real};
use crate::sock::{earliest, sleep, Slept, Sock};
use crate::table::Table;
use ulnic::Watcher;

/// The real `ppoll` with `timeout` (`None`: forever).
fn kernel_poll(
    fds: &mut [pollfd],
    timeout: Option<Duration>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a valid array and timespec for the duration of the call;
    // the program's mask passed on.
    unsafe { (real().ppoll)(fds.as_mut_ptr(), fds.len() as libc::nfds_t, tsp, sigmask) }
}

/// `poll` of `fds` (some naming interposed sockets): the count ready, or
/// -1 with errno.
pub fn poll_many(
    env: &Env,
    table: &Table,
    fds: &mut [pollfd],
    timeout: Option<Duration>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let socks: Vec<Option<Arc<Sock>>> = fds.iter().map(|p| table.get(p.fd)).collect();
    if socks.iter().all(Option::is_none) {
        return kernel_poll(fds, timeout, sigmask);
    }
    // What the kernel is asked about: every descriptor that is not a
    // ulnic-only socket (those get fd -1: ignored by poll).
    let mut kern: Vec<pollfd> = fds
        .iter()
        .zip(&socks)
        .map(|(p, s)| match s {
            Some(s) if !s.lock().kernel_side_live() => pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            },
            _ => pollfd { revents: 0, ..*p },
        })
        .collect();
    let start = Instant::now();
    let mut spins = 0u32;
    let mut look_kernel = true;
    let mut watched = Watched::default();
    loop {
        let mut ready = 0;
        for (p, s) in fds.iter_mut().zip(&socks) {
            p.revents = 0;
            if let Some(s) = s {
                let always = (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) as u32;
                let r = if s.usable(env).is_err() {
                    (libc::POLLERR | libc::POLLHUP) as u32
                } else {
                    s.lock().ready().0 & (p.events as u32 | always)
                };
                p.revents = r as i16;
            }
        }
        let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
        let spinning = start.elapsed() < env.spin;
        let any_user = fds.iter().any(|p| p.revents != 0);
        if any_user
            || look_kernel
            || left.is_some_and(|l| l.is_zero())
            || (spinning && spins.is_multiple_of(16))
        {
            let k = kernel_poll(&mut kern, Some(Duration::ZERO), sigmask);
            if k < 0 {
                return k;
            }
            for (p, k) in fds.iter_mut().zip(&kern) {
                p.revents |= k.revents;
            }
            look_kernel = false;
        }
        ready = fds.iter().filter(|p| p.revents != 0).count().max(ready);
        if ready > 0 || left.is_some_and(|l| l.is_zero()) {
            return ready as c_int;
        }
        spins += 1;
        if spinning {
            std::thread::yield_now();
            continue;
        }
        // Sleep: every socket watched by this thread's watcher and armed
        // (something already there means look again instead), then
        // until a notification, a kernel descriptor, a connection's own
        // timer or the program's timeout (docs/sockets.md §6).
        if !watched.started {
            watched.start(&socks);
        }
        if arm_any(&socks) {
            continue;
        }
        let until = socks
            .iter()
            .flatten()
            .fold(timeout.map(|t| start + t), |u, s| {
                earliest(u, s.lock().next_timer())
            });
        let mut sleep_on = kern.clone();
        let ulnic = socks.iter().flatten().any(|s| s.lock().has_ulnic());
        match sleep(watched.w.as_deref(), ulnic, &mut sleep_on, until, sigmask) {
            Slept::Interrupted => return fail(libc::EINTR),
            Slept::Woken => {}
            Slept::Clock(w) => {
                let work = arm_any(&socks);
                if let Some(w) = w {
                    ulnic::sock::count_clock(w, work);
                }
            }
        }
        // Whatever woke us, look at everything once more.
        look_kernel = true;
    }
}

/// Arms every socket: true when one has something already.
fn arm_any(socks: &[Option<Arc<Sock>>]) -> bool {
    socks
        .iter()
        .flatten()
        .any(|s| s.lock().arm().unwrap_or(true))
}

/// The sockets a `poll` watches with this thread's watcher while it
/// sleeps; the watches end with it.
#[derive(Default)]
struct Watched {
    started: bool,
    w: Option<Arc<Watcher>>,
    socks: Vec<Arc<Sock>>,
}

impl Watched {
    fn start(&mut self, socks: &[Option<Arc<Sock>>]) {
        self.started = true;
        for s in socks.iter().flatten() {
            let st = s.lock();
            let ok = match &self.w {
                Some(w) => st.watch(w, true),
                None => {
                    self.w = st.start_watch();
                    self.w.is_some()
                }
            };
            if ok {
                self.socks.push(s.clone());
            }
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(w) = &self.w {
            for s in &self.socks {
                s.lock().watch(w, false);
            }
        }
    }
}

/// The three sets of a `select` (each NULL or the program's).
pub struct FdSets {
    /// For reading.
    pub read: *mut libc::fd_set,
    /// For writing.
    pub write: *mut libc::fd_set,
    /// For exceptional conditions.
    pub except: *mut libc::fd_set,
}

/// `select` over `nfds` descriptors, as `poll_many`.
pub fn select_many(
    env: &Env,
    table: &Table,
    nfds: c_int,
    sets: FdSets,
    timeout: Option<Duration>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let FdSets {
        read,
        write,
        except,
    } = sets;
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        return fail(libc::EINVAL);
    }
    let isset = |set: *mut libc::fd_set, fd: c_int| -> bool {
        // SAFETY: NULL or the program's fd_set; fd < FD_SETSIZE.
        !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
    };
    let mut fds: Vec<pollfd> = Vec::new();
    for fd in 0..nfds {
        let mut mask = 0;
        if isset(read, fd) {
            mask |= libc::POLLIN;
        }
        if isset(write, fd) {
            mask |= libc::POLLOUT;
        }
        if isset(except, fd) {
            mask |= libc::POLLPRI;
        }
        if mask != 0 {
            fds.push(pollfd {
                fd,
                events: mask,
                revents: 0,
            });
        }
    }
    let r = poll_many(env, table, &mut fds, timeout, sigmask);
    if r < 0 {
        return r;
    }
    for set in [read, write, except] {
        if !set.is_null() {
            // SAFETY: the program's fd_set.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut count = 0;
    for p in &fds {
        if p.revents & libc::POLLNVAL != 0 {
            return fail(libc::EBADF);
        }
        let rd = libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP;
        let wr = libc::POLLOUT | libc::POLLERR;
        for (set, bits, asked) in [
            (read, rd, libc::POLLIN),
            (write, wr, libc::POLLOUT),
            (except, libc::POLLPRI, libc::POLLPRI),
        ] {
            if p.events & asked != 0 && p.revents & bits != 0 && !set.is_null() {
                // SAFETY: the program's fd_set; fd < nfds <= FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        }
    }
    count
}
