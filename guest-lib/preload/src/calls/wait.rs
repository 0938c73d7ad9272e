//! Waiting for descriptors: `poll`, `ppoll`, `select`, `pselect`,
//! `epoll_ctl`, `epoll_wait`, `epoll_pwait`, `epoll_pwait2`, and the
//! fortified `__poll_chk`.

use std::ffi::c_int;
use std::time::Duration;

use libc::{epoll_event, nfds_t, pollfd, sigset_t, timespec};

use crate::context::ctx;
use crate::poll::{poll_many, select_many, FdSets};
use crate::real::{fail, real, trace};

fn ms_timeout(ms: c_int) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

fn ts_timeout(ts: *const timespec) -> Option<Duration> {
    // SAFETY: NULL or the program's timespec.
    unsafe { ts.as_ref() }.map(|t| {
        Duration::new(
            t.tv_sec.max(0) as u64,
            t.tv_nsec.clamp(0, 999_999_999) as u32,
        )
    })
}

fn pollfds<'a>(fds: *mut pollfd, n: nfds_t) -> &'a mut [pollfd] {
    if fds.is_null() || n == 0 {
        return &mut [];
    }
    // SAFETY: the program gives `n` pollfds at `fds`.
    unsafe { std::slice::from_raw_parts_mut(fds, n as usize) }
}

/// Whether any of `fds` is interposed.
fn any_ours(fds: &[pollfd]) -> bool {
    let t = &ctx().table;
    t.any() && fds.iter().any(|p| t.get(p.fd).is_some())
}

/// `poll`.
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    let c = ctx();
    let list = pollfds(fds, n);
    if !any_ours(list) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().poll)(fds, n, timeout) };
    }
    poll_many(
        &c.env,
        &c.table,
        list,
        ms_timeout(timeout),
        std::ptr::null(),
    )
}

/// `__poll_chk`.
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: usize,
) -> c_int {
    if (n as usize).saturating_mul(std::mem::size_of::<pollfd>()) > fdslen {
        crate::real::warn("buffer overflow detected");
        std::process::abort();
    }
    // SAFETY: as `poll`.
    unsafe { poll(fds, n, timeout) }
}

/// `ppoll`.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    let c = ctx();
    let list = pollfds(fds, n);
    if !any_ours(list) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().ppoll)(fds, n, ts, mask) };
    }
    poll_many(&c.env, &c.table, list, ts_timeout(ts), mask)
}

/// Whether any descriptor of the sets is interposed.
fn any_ours_in(nfds: c_int, sets: [*mut libc::fd_set; 3]) -> bool {
    let t = &ctx().table;
    t.any()
        && (0..nfds.clamp(0, libc::FD_SETSIZE as c_int)).any(|fd| {
            // SAFETY: NULL or the program's fd_sets; fd < FD_SETSIZE.
            sets.iter()
                .any(|&s| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) })
                && t.get(fd).is_some()
        })
}

/// `select`.
#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    if !any_ours_in(nfds, [r, w, e]) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().select)(nfds, r, w, e, tv) };
    }
    // SAFETY: NULL or the program's timeval.
    let timeout = unsafe { tv.as_ref() }.map(|t| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    });
    select_ours(nfds, [r, w, e], timeout, std::ptr::null())
}

/// `select` and `pselect` over sets that hold interposed sockets.
fn select_ours(
    nfds: c_int,
    [read, write, except]: [*mut libc::fd_set; 3],
    timeout: Option<Duration>,
    mask: *const sigset_t,
) -> c_int {
    let c = ctx();
    let sets = FdSets {
        read,
        write,
        except,
    };
    select_many(&c.env, &c.table, nfds, sets, timeout, mask)
}

/// `pselect`.
#[no_mangle]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if !any_ours_in(nfds, [r, w, e]) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().pselect)(nfds, r, w, e, ts, mask) };
    }
    select_ours(nfds, [r, w, e], ts_timeout(ts), mask)
}

/// `epoll_ctl`.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    let c = ctx();
    match c.table.get(fd) {
        Some(s) => {
            let r = c.epolls.ctl(epfd, op, fd, &s, ev);
            // SAFETY: NULL or the program's epoll_event.
            let interest = unsafe { ev.as_ref() }.map(|e| e.events);
            trace!("epoll_ctl({epfd}, op {op}, {fd}, interest {interest:x?}): {r}");
            r
        }
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().epoll_ctl)(epfd, op, fd, ev) },
    }
}

/// `epoll_wait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: as `epoll_pwait`.
    unsafe { epoll_pwait(epfd, ev, max, timeout, std::ptr::null()) }
}

/// `epoll_pwait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    let c = ctx();
    if !c.epolls.has(epfd) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().epoll_pwait)(epfd, ev, max, timeout, mask) };
    }
    c.epolls
        .wait(&c.env, epfd, ev, max, ms_timeout(timeout), mask)
}

/// `epoll_pwait2`.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    let c = ctx();
    if !c.epolls.has(epfd) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().epoll_pwait2)(epfd, ev, max, ts, mask) };
    }
    if max <= 0 {
        return fail(libc::EINVAL);
    }
    c.epolls.wait(&c.env, epfd, ev, max, ts_timeout(ts), mask)
}
