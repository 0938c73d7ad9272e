//! `epoll` over interposed sockets and kernel descriptors in one set.
//!
//! An interposed socket's registration is kept here (its readiness is
//! user space's to compute); its kernel descriptor is also in the
//! kernel's set while its kernel side is live (a fresh socket, a listener
//! or datagram socket bound to any address), with data tagged so its
//! readiness comes back to the program with the program's data. To sleep, the
//! sockets are armed and the domain's notification descriptor is in the
//! set too (data `MAGIC`), so a message wakes the same `epoll_wait` a
//! kernel descriptor would. Neither the tag nor `MAGIC` ever reaches the
//! program.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::epoll_event;

use crate::env::Env;
use crate::real::{fail, real};
use crate::sock::{earliest, epoll_tag, Kind, Reg, Sock, TAG, TAG_MASK};
use ulnic::sock::Wakes;
use ulnic::Watcher;

/// Data of the notification descriptor's registration.
pub const MAGIC: u64 = 0x756c_6e69_635f_6e66; // "ulnic_nf"

/// The interposed sockets of each epoll set.
#[derive(Default)]
pub struct Registry {
    sets: Mutex<HashMap<c_int, Set>>,
}

#[derive(Default, Clone)]
struct Set {
    /// Registered descriptors naming interposed sockets.
    socks: Vec<(c_int, Arc<Sock>)>,
    /// Where the next look starts in `socks`: after the last socket
    /// reported, so that with more ready than `maxevents` every one gets
    /// its turn (the kernel queues a reported level-triggered entry at
    /// the end of its ready list).
    next: Arc<AtomicUsize>,
    /// The last `epoll_wait` filled every entry with ulnic sockets, so
    /// the kernel's entries were not looked at: the next looks at them
    /// first (neither kind starves the other; no extra system call when
    /// there was room for both).
    kernel_first: Arc<AtomicBool>,
    /// The set's watcher (spec §6 "Several waiters"), made when it first
    /// sleeps: it watches the set's sockets, and its descriptors are in
    /// the kernel's set (data `MAGIC`).
    watcher: Option<Arc<Watcher>>,
    /// The descriptors added to the kernel's set for it.
    notify: Vec<c_int>,
}

impl Registry {
    fn sets(&self) -> std::sync::MutexGuard<'_, HashMap<c_int, Set>> {
        self.sets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `epfd` has interposed sockets (or the notification
    /// descriptor, whose readiness must not reach the program).
    pub fn has(&self, epfd: c_int) -> bool {
        self.sets()
            .get(&epfd)
            .is_some_and(|s| !s.socks.is_empty() || !s.notify.is_empty())
    }

    /// Drops `fd` from set `epfd`; the notification descriptor leaves the
    /// kernel's set with the last socket.
    fn unregister(sets: &mut HashMap<c_int, Set>, epfd: c_int, fd: c_int) {
        if let Some(s) = sets.get_mut(&epfd) {
            let gone: Vec<Arc<Sock>> = s
                .socks
                .iter()
                .filter(|(f, _)| *f == fd)
                .map(|(_, x)| x.clone())
                .collect();
            s.socks.retain(|(f, _)| *f != fd);
            if let Some(w) = &s.watcher {
                for sock in gone {
                    // Still in the set under another descriptor (dup):
                    // still watched.
                    if !s.socks.iter().any(|(_, x)| Arc::ptr_eq(x, &sock)) {
                        sock.lock().watch(w, false);
                    }
                }
            }
        }
    }

    /// `epoll_ctl` for `fd`, which names `sock`.
    pub fn ctl(
        &self,
        epfd: c_int,
        op: c_int,
        fd: c_int,
        sock: &Arc<Sock>,
        ev: *mut epoll_event,
    ) -> c_int {
        // SAFETY: NULL or the program's epoll_event (DEL may pass NULL).
        let ev = unsafe { ev.as_ref() }.copied();
        let mut st = sock.lock();
        let at = st.regs.iter().position(|r| r.epfd == epfd && r.fd == fd);
        match (op, at, ev) {
            (libc::EPOLL_CTL_ADD, Some(_), _) => return fail(libc::EEXIST),
            (libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL, None, _) => return fail(libc::ENOENT),
            (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, _, None) => return fail(libc::EFAULT),
            _ => {}
        }
        // The kernel's set holds the socket's descriptor only while its
        // kernel side is live (a placeholder's own readiness, hang-up
        // included, would be noise); then the kernel's answer (a bad
        // epfd, a closed fd) is the program's.
        if st.kernel_side_live() {
            let r = match op {
                libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD => {
                    let mut k = epoll_event {
                        events: ev.map_or(0, |e| e.events),
                        u64: epoll_tag(fd),
                    };
                    // SAFETY: plain system call with our own epoll_event.
                    unsafe { (real().epoll_ctl)(epfd, op, fd, &mut k) }
                }
                // SAFETY: as above.
                _ => unsafe { (real().epoll_ctl)(epfd, op, fd, std::ptr::null_mut()) },
            };
            if r < 0 {
                return r;
            }
        }
        match (op, at, ev) {
            (libc::EPOLL_CTL_DEL, Some(i), _) => {
                st.regs.remove(i);
                drop(st);
                Registry::unregister(&mut self.sets(), epfd, fd);
            }
            (libc::EPOLL_CTL_MOD, Some(i), Some(e)) => {
                st.regs[i] = Reg {
                    epfd,
                    fd,
                    interest: e.events,
                    data: e.u64,
                    disabled: false,
                    seen: None,
                };
            }
            (_, _, Some(e)) => {
                st.regs.push(Reg {
                    epfd,
                    fd,
                    interest: e.events,
                    data: e.u64,
                    disabled: false,
                    seen: None,
                });
                drop(st);
                self.sets()
                    .entry(epfd)
                    .or_default()
                    .socks
                    .push((fd, sock.clone()));
            }
            _ => {}
        }
        0
    }

    /// `fd` was closed: its registrations go (the kernel drops its own
    /// when the last descriptor of the file goes).
    pub fn closed(&self, fd: c_int, sock: &Sock) {
        let epfds: Vec<c_int> = {
            let mut st = sock.lock();
            let e = st
                .regs
                .iter()
                .filter(|r| r.fd == fd)
                .map(|r| r.epfd)
                .collect();
            st.regs.retain(|r| r.fd != fd);
            e
        };
        let mut sets = self.sets();
        for epfd in epfds {
            Registry::unregister(&mut sets, epfd, fd);
        }
    }

    /// `fd` was closed and may have been an epoll set: forget the set.
    pub fn epoll_closed(&self, fd: c_int) {
        let Some(set) = self.sets().remove(&fd) else {
            return;
        };
        // Its sockets' registrations go with it: a set made later with
        // the same number starts empty, as the kernel's does.
        for (_, sock) in &set.socks {
            sock.lock().regs.retain(|r| r.epfd != fd);
        }
    }

    /// `sock` went to the kernel: its registrations speak for themselves
    /// now (the caller gave them back their data).
    pub fn forget(&self, sock: &Arc<Sock>) {
        for s in self.sets().values_mut() {
            s.socks.retain(|(_, x)| !Arc::ptr_eq(x, sock));
        }
    }

    fn snapshot(&self, epfd: c_int) -> Option<Set> {
        self.sets().get(&epfd).cloned()
    }

    /// Set `epfd`'s watcher, made (from this process's NIC) the first
    /// time.
    fn watcher(&self, env: &Env, epfd: c_int) -> Option<Arc<Watcher>> {
        let mut sets = self.sets();
        let s = sets.get_mut(&epfd)?;
        if s.watcher.is_none() {
            s.watcher = Some(env.net_if_open()?.new_watcher().ok()?);
        }
        s.watcher.clone()
    }

    /// Puts `w`'s descriptors in the kernel's set, once its watches are
    /// made (under host attach a watched socket of another attachment
    /// brings that attachment's notification descriptor: without it in
    /// the set, nothing would read the records that wake the watcher).
    fn sleep_on(&self, epfd: c_int, w: &Watcher) {
        let mut sets = self.sets();
        let Some(s) = sets.get_mut(&epfd) else {
            return;
        };
        for nfd in w.fds() {
            // Added every time, EEXIST meaning it is there: a number seen
            // before may name a new descriptor (an attachment closed, the
            // kernel dropped it from the set, another got the number).
            let mut e = epoll_event {
                events: libc::EPOLLIN as u32,
                u64: MAGIC,
            };
            // SAFETY: plain system call with our own epoll_event.
            unsafe { (real().epoll_ctl)(epfd, libc::EPOLL_CTL_ADD, nfd, &mut e) };
            if !s.notify.contains(&nfd) {
                s.notify.push(nfd);
            }
        }
    }

    /// `epoll_wait` on a set with interposed sockets (`timeout` `None`:
    /// forever).
    pub fn wait(
        &self,
        env: &Env,
        epfd: c_int,
        out: *mut epoll_event,
        max: c_int,
        timeout: Option<Duration>,
        sigmask: *const libc::sigset_t,
    ) -> c_int {
        if out.is_null() || max <= 0 {
            return fail(libc::EINVAL);
        }
        let Some(set) = self.snapshot(epfd) else {
            return kernel_wait(epfd, out, max, timeout, sigmask);
        };
        // SAFETY: the program gives `max` entries of room.
        let out = unsafe { std::slice::from_raw_parts_mut(out, max as usize) };
        let start = Instant::now();
        let mut spins = 0u32;
        if set.kernel_first.swap(false, Ordering::Relaxed) {
            let k = kernel_wait(epfd, out.as_mut_ptr(), max, Some(Duration::ZERO), sigmask);
            if k < 0 {
                return k;
            }
            let kn = merge(&set, epfd, out, 0, k as usize);
            if kn > 0 {
                let un = user_ready(env, &set, epfd, &mut out[kn..]);
                return join_same(out, kn, kn + un) as c_int;
            }
        }
        loop {
            let mut n = user_ready(env, &set, epfd, out);
            if n == out.len() {
                set.kernel_first.store(true, Ordering::Relaxed);
            }
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            let spinning = start.elapsed() < env.spin;
            let look_kernel = n > 0
                || left.is_some_and(|l| l.is_zero())
                || (spinning && spins.is_multiple_of(16));
            if look_kernel {
                let k = kernel_wait(
                    epfd,
                    out[n..].as_mut_ptr(),
                    (max as usize - n) as c_int,
                    Some(Duration::ZERO),
                    sigmask,
                );
                if k < 0 {
                    return k;
                }
                n = merge(&set, epfd, out, n, k as usize);
            }
            if n > 0 || left.is_some_and(|l| l.is_zero()) {
                return n as c_int;
            }
            spins += 1;
            if spinning {
                std::thread::yield_now();
                continue;
            }
            // Sleep: every socket watched by the set's watcher and armed
            // (something already there means look again instead), until a
            // notification, a kernel descriptor, a connection's own timer
            // or the program's timeout (docs/sockets.md §6).
            let w = self.watcher(env, epfd);
            if let Some(w) = &w {
                for (_, sock) in &set.socks {
                    sock.lock().watch(w, true);
                }
                self.sleep_on(epfd, w);
            }
            if arm_all(&set, epfd) {
                continue;
            }
            let until = set
                .socks
                .iter()
                .fold(timeout.map(|t| start + t), |u, (_, s)| {
                    earliest(u, s.lock().next_timer())
                });
            // Only kernel descriptors (fresh sockets) need no feeding.
            let ulnic = set.socks.iter().any(|(_, s)| s.lock().has_ulnic());
            let fed = !ulnic || w.as_ref().is_some_and(|w| w.fed());
            let mut nap = until.map(|u| u.saturating_duration_since(Instant::now()));
            if !fed {
                nap = Some(nap.map_or(ulnic::sock::UNFED_LOOK, |n| n.min(ulnic::sock::UNFED_LOOK)));
            }
            let k = kernel_wait(epfd, out.as_mut_ptr(), max, nap, sigmask);
            if k < 0 {
                return k;
            }
            let mut notified = false;
            let mut kept = 0;
            for i in 0..k as usize {
                if out[i].u64 == MAGIC {
                    notified = true;
                } else {
                    out[kept] = out[i];
                    kept += 1;
                }
            }
            if let (true, Some(w)) = (notified, &w) {
                w.take();
            }
            if notified || kept > 0 {
                ulnic::sock::count_wake(ulnic::sock::WakeKind::Notified);
            } else if !fed {
                ulnic::sock::count_wake(ulnic::sock::WakeKind::Unfed);
            } else if let Some(w) = &w {
                let work = arm_all(&set, epfd);
                ulnic::sock::count_clock(w, work);
            }
            if kept > 0 {
                // Kernel descriptors are ready; the sockets' state joins
                // them (without sleeping again).
                let kernel: Vec<epoll_event> = out[..kept].to_vec();
                let n = user_ready(env, &set, epfd, out);
                let room = max as usize - n;
                let k = kernel.len().min(room);
                out[n..n + k].copy_from_slice(&kernel[..k]);
                return merge(&set, epfd, out, n, k) as c_int;
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return 0;
            }
        }
    }
}

/// The real `epoll_pwait` with `timeout`.
fn kernel_wait(
    epfd: c_int,
    out: *mut epoll_event,
    max: c_int,
    timeout: Option<Duration>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    if max <= 0 {
        return 0;
    }
    let ms = timeout.map_or(-1, |t| {
        if t.is_zero() {
            0
        } else {
            t.as_millis().clamp(1, i32::MAX as u128) as c_int
        }
    });
    // SAFETY: the program's buffer (`max` entries) and mask, passed on.
    unsafe { (real().epoll_pwait)(epfd, out, max, ms, sigmask) }
}

/// Wake-ups of these kinds reach a registration only if it asks for one
/// of them (the kernel's wake-up keys; a change of state reaches all).
const INPUT: u32 = (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDNORM | libc::EPOLLRDBAND) as u32;
const OUTPUT: u32 = (libc::EPOLLOUT | libc::EPOLLWRNORM | libc::EPOLLWRBAND) as u32;

/// Whether an edge-triggered registration that asks for `interest` and
/// last saw `seen` is woken by `now`: as the kernel's, when ADD or MOD
/// looked (`None`) or a wake-up it listens for came since.
fn woken(interest: u32, seen: Option<Wakes>, now: Wakes) -> bool {
    seen.is_none_or(|s| {
        now.state != s.state
            || (interest & INPUT != 0 && now.input != s.input)
            || (interest & OUTPUT != 0 && now.output != s.output)
    })
}

/// Fills `out` with the interposed sockets' readiness: how many entries.
/// Level-triggered registrations report what is ready; edge-triggered
/// ones only after a wake-up they listen for; one-shot ones once.
fn user_ready(env: &Env, set: &Set, epfd: c_int, out: &mut [epoll_event]) -> usize {
    let mut n = 0;
    let count = set.socks.len();
    let start = set.next.load(Ordering::Relaxed);
    for k in 0..count {
        if n == out.len() {
            break;
        }
        let at = (start + k) % count;
        let (fd, sock) = &set.socks[at];
        // Another process's since a fork: an error to report.
        let theirs = sock.usable(env).is_err();
        let mut st = sock.lock();
        if matches!(st.kind, Kind::Fresh | Kind::Kernel) {
            continue; // the kernel's registration speaks for it
        }
        let Some(i) = st.regs.iter().position(|r| r.epfd == epfd && r.fd == *fd) else {
            continue;
        };
        let reg = st.regs[i];
        if reg.disabled {
            continue;
        }
        let always = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
        let ev = if theirs {
            always
        } else {
            st.ready().0 & (reg.interest | always)
        };
        if reg.interest & libc::EPOLLET as u32 != 0 && !theirs {
            let now = st.wakes();
            st.regs[i].seen = Some(now);
            if !woken(reg.interest, reg.seen, now) {
                continue;
            }
        }
        if ev != 0 {
            out[n] = epoll_event {
                events: ev,
                u64: reg.data,
            };
            n += 1;
            set.next.store(at + 1, Ordering::Relaxed);
            if reg.interest & libc::EPOLLONESHOT as u32 != 0 {
                st.regs[i].disabled = true;
            }
        }
    }
    n
}

/// Turns the `k` kernel entries after the first `n` of `out` into the
/// program's: tagged ones get the program's data (joined with the same
/// socket's user-space readiness, if any); `MAGIC` ones go. Returns the count.
fn merge(set: &Set, epfd: c_int, out: &mut [epoll_event], n: usize, k: usize) -> usize {
    let mut total = n;
    for i in n..n + k {
        let e = out[i];
        if e.u64 == MAGIC {
            continue;
        }
        if e.u64 & TAG_MASK == TAG {
            let fd = (e.u64 & 0xffff_ffff) as c_int;
            let Some((_, sock)) = set.socks.iter().find(|(f, _)| *f == fd) else {
                continue;
            };
            let st = sock.lock();
            let Some(reg) = st
                .regs
                .iter()
                .find(|r| r.epfd == epfd && r.fd == fd)
                .copied()
            else {
                continue;
            };
            if !st.kernel_side_live() {
                continue; // a placeholder's own state: noise
            }
            drop(st);
            if let Some(j) = out[..total].iter().position(|x| x.u64 == reg.data) {
                out[j].events |= e.events;
                continue;
            }
            out[total] = epoll_event {
                events: e.events,
                u64: reg.data,
            };
        } else {
            out[total] = e;
        }
        total += 1;
    }
    total
}

/// Folds each of `out[from..to]` into an earlier entry with the same data
/// (the same socket's kernel side reported first): how many are left.
fn join_same(out: &mut [epoll_event], from: usize, to: usize) -> usize {
    let mut n = from;
    for i in from..to {
        let e = out[i];
        match out[..from].iter().position(|x| x.u64 == e.u64) {
            Some(j) => out[j].events |= e.events,
            None => {
                out[n] = e;
                n += 1;
            }
        }
    }
    n
}

/// Arms every registered socket: true when one has something already.
fn arm_all(set: &Set, epfd: c_int) -> bool {
    for (fd, sock) in &set.socks {
        let mut st = sock.lock();
        let live = st
            .regs
            .iter()
            .any(|r| r.epfd == epfd && r.fd == *fd && !r.disabled);
        if live && st.arm().unwrap_or(true) {
            return true;
        }
    }
    false
}
