//! Watchers (spec §6 "Several waiters", §9): one waiter's wake-up for the
//! notifications of many endpoints, which no other waiter can take. A
//! thread blocked on a socket, a `poll` call and an `epoll` set each wait
//! on a watcher of their own; the driver (or, under host attach, whoever
//! reads the notification queue) adds one to every watcher of an endpoint
//! for each notification, so a wake-up that one of them takes is never
//! missing from another.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::backend::Domain;
use crate::error::Error;

/// One waiter's wake-up for the endpoints it watches.
///
/// Made by [`crate::ProtectionDomain::new_watcher`]. Watch the endpoints
/// ([`crate::Endpoint::watch`]), arm them ([`crate::Endpoint::arm`]),
/// look at them once more, then sleep in [`Watcher::wait`] (or in
/// `poll`/`epoll` on [`Watcher::fds`], then [`Watcher::take`]). Every
/// notification of a watched endpoint after the watch wakes it, whatever
/// other waiters of the same endpoint do.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let pd = nic.alloc_pd()?;
/// # let mut a = pd.create_endpoint(&Default::default())?;
/// # let mut b = pd.create_endpoint(&Default::default())?;
/// let w = pd.new_watcher()?;
/// a.watch(&w)?;
/// b.watch(&w)?;
/// if !a.arm()? && !b.arm()? {
///     w.wait(std::time::Duration::from_secs(1))?;
/// }
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct Watcher {
    fd: OwnedFd,
    /// Which domains' endpoints it can watch ([`Domain::watcher_pool`]).
    pool: u64,
    /// The domain it was made from: under host attach its notification
    /// queue feeds the watcher from the start, so [`Watcher::fds`] holds
    /// the queue's descriptor before anything is watched (a caller may
    /// add the descriptors to its own `epoll` set once). Weak, as below.
    maker: Weak<dyn Domain>,
    /// The process that made it: a forked child's copy is the parent's
    /// watcher, never to be waited on or unwatched from the child.
    pid: u32,
    /// What it watches: by (domain's address, endpoint id). Weak: a
    /// watcher (a thread's lives as long as the thread) must not keep a
    /// domain, and under host attach its attachment, alive once the
    /// program has dropped it.
    watched: Mutex<HashMap<(usize, u32), Weak<dyn Domain>>>,
}

thread_local! {
    /// This thread's watchers, one per pool, and the process they were
    /// made in (a forked child makes its own: the copies it inherited
    /// are the parent's).
    static MINE: std::cell::RefCell<Vec<(u32, Arc<Watcher>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Every live watcher of this process, so that a change user space makes
/// wakes the waiters of the endpoint it concerns ([`poke_endpoint`]).
static LIVE: Mutex<Vec<Weak<Watcher>>> = Mutex::new(Vec::new());

/// A domain's identity in a watcher's table.
fn key(dom: &Arc<dyn Domain>) -> usize {
    Arc::as_ptr(dom).cast::<()>() as usize
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watcher {
    /// This thread's watcher, made from `dom` the first time (what a
    /// thread blocked on endpoints sleeps on).
    pub(crate) fn this_thread(dom: &Arc<dyn Domain>) -> Result<Arc<Watcher>, Error> {
        MINE.with(|m| {
            let mut m = m.borrow_mut();
            let pid = std::process::id();
            // A forked child's copies are the parent's; a driver's watcher
            // from before a device reset is dead for good (EPOLLERR).
            m.retain(|(p, w)| *p == pid && !w.broken());
            let pool = dom.watcher_pool();
            if let Some((_, w)) = m.iter().find(|(_, w)| w.pool == pool) {
                return Ok(w.clone());
            }
            let w = Watcher::of(dom)?;
            m.push((pid, w.clone()));
            Ok(w)
        })
    }

    pub(crate) fn of(dom: &Arc<dyn Domain>) -> Result<Arc<Watcher>, Error> {
        let w = Arc::new(Watcher {
            fd: dom.new_watcher()?,
            pool: dom.watcher_pool(),
            maker: Arc::downgrade(dom),
            pid: std::process::id(),
            watched: Mutex::new(HashMap::new()),
        });
        let mut live = lock(&LIVE);
        live.retain(|x| x.strong_count() > 0);
        live.push(Arc::downgrade(&w));
        Ok(w)
    }

    pub(crate) fn watch_id(&self, dom: &Arc<dyn Domain>, id: u32) -> Result<(), Error> {
        let mut w = lock(&self.watched);
        let key = (key(dom), id);
        if w.contains_key(&key) {
            return Ok(());
        }
        dom.watch(id, self.fd.as_raw_fd(), true)?;
        w.insert(key, Arc::downgrade(dom));
        Ok(())
    }

    pub(crate) fn unwatch_id(&self, dom: &Arc<dyn Domain>, id: u32) -> Result<(), Error> {
        if lock(&self.watched).remove(&(key(dom), id)).is_some() {
            // The endpoint may be gone already, and its watches with it.
            let _ = dom.watch(id, self.fd.as_raw_fd(), false);
        }
        Ok(())
    }

    /// Whether the driver ended it (the device reset or went away: it
    /// polls as an error from then on). Never blocks.
    fn broken(&self) -> bool {
        if self.pool == 0 {
            return false; // an eventfd of this process: never ended
        }
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1, no waiting.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
    }

    /// Whether it watches endpoint `id` of `dom`.
    pub(crate) fn watches(&self, dom: &Arc<dyn Domain>, id: u32) -> bool {
        lock(&self.watched).contains_key(&(key(dom), id))
    }

    /// The descriptors to sleep on in `poll` or `epoll` for this watcher:
    /// its own, and under host attach the notification queue's, which
    /// must be read with [`Watcher::take`] when readable (the process
    /// reads the records that feed watchers itself).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let w = nic.alloc_pd()?.new_watcher()?;
    /// for fd in w.fds() {
    ///     println!("poll {fd} for POLLIN");
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn fds(&self) -> Vec<RawFd> {
        let mut v = vec![self.fd.as_raw_fd()];
        v.extend(self.feeds().iter().map(|f| f.1));
        v
    }

    /// The domains whose records feed this watcher in this process, and
    /// their descriptors (host attach: each attachment's notification
    /// queue), once each.
    fn feeds(&self) -> Vec<(Arc<dyn Domain>, RawFd)> {
        let mut v: Vec<(Arc<dyn Domain>, RawFd)> = Vec::new();
        let maker = self.maker.upgrade();
        // One domain per attachment, however many of its endpoints are
        // watched (an epoll set of a thousand sockets has one or two):
        // each domain is upgraded once, on this path of every wake-up.
        let mut seen: Vec<usize> = Vec::new();
        let watched: Vec<Arc<dyn Domain>> = lock(&self.watched)
            .iter()
            .filter(|((d, _), _)| {
                let new = !seen.contains(d);
                if new {
                    seen.push(*d);
                }
                new
            })
            .filter_map(|(_, d)| d.upgrade())
            .collect();
        for d in maker.into_iter().chain(watched) {
            if let Some(f) = d.watch_feed() {
                if !v.iter().any(|(_, g)| *g == f) {
                    v.push((d, f));
                }
            }
        }
        v
    }

    /// Whether every endpoint it watches feeds it in this process (false
    /// in a forked child under host attach, whose parent reads the
    /// notification queue: such a child can only look again later).
    pub fn fed(&self) -> bool {
        let maker_fed = match self.maker.upgrade() {
            Some(d) => d.watchers_fed(),
            None => true,
        };
        maker_fed
            && lock(&self.watched)
                .values()
                .filter_map(Weak::upgrade)
                .all(|d| d.watchers_fed())
    }

    /// Takes the wake-ups that came (reading the records that feed it
    /// first, under host attach): how many; 0 when none. Never blocks.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let w = nic.alloc_pd()?.new_watcher()?;
    /// if w.take() > 0 { /* look at the watched endpoints */ }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn take(&self) -> u64 {
        for (d, _) in self.feeds() {
            d.feed_watchers();
        }
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a u64 from our own descriptor, which
        // never blocks (EAGAIN when the count is 0).
        let r = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut n as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if r == 8 {
            n
        } else {
            0
        }
    }

    /// Wakes this watcher's waiters as a notification would (for a change
    /// user space made, such as a shutdown in another thread).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let w = nic.alloc_pd()?.new_watcher()?;
    /// w.poke();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn poke(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 to our own descriptor.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Sleeps until woken (true) or `timeout` passes (false), taking the
    /// wake-ups. A signal caught meanwhile ends it with `EINTR`.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let w = nic.alloc_pd()?.new_watcher()?;
    /// let woken = w.wait(std::time::Duration::from_millis(100))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        self.wait_with(&mut [], timeout, None)
    }

    /// Sleeps until woken (true), one of `extra` is ready as asked, or
    /// `timeout` passes; takes the wake-ups. `extra`'s `revents` are
    /// filled in (all 0 when it returns for another reason). A signal
    /// caught meanwhile ends it with `EINTR`.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let w = nic.alloc_pd()?.new_watcher()?;
    /// let mut stdin = [libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 }];
    /// let woken = w.wait_with(&mut stdin, std::time::Duration::from_secs(1), None)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    ///
    /// `sigmask`, if given, is the signal mask while it sleeps (as
    /// `ppoll`'s).
    pub fn wait_with(
        &self,
        extra: &mut [libc::pollfd],
        timeout: Duration,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        extra.iter_mut().for_each(|p| p.revents = 0);
        loop {
            if self.take() > 0 {
                return Ok(true);
            }
            let mut p: Vec<libc::pollfd> = extra.to_vec();
            for fd in self.fds() {
                p.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = libc::timespec {
                tv_sec: left.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            let mask = sigmask.map_or(std::ptr::null(), |m| m as *const libc::sigset_t);
            // SAFETY: a valid array of pollfds, a timespec and a mask (or
            // null) for the duration of the call.
            let r = unsafe { libc::ppoll(p.as_mut_ptr(), p.len() as libc::nfds_t, &ts, mask) };
            if r < 0 {
                // EINTR included: a signal ends the wait, as it ends the
                // system call the caller stands for.
                return Err(Error::Os(std::io::Error::last_os_error()));
            }
            let n = extra.len();
            extra.copy_from_slice(&p[..n]);
            // Our own descriptor in error: the device reset or went away;
            // it will never be woken again (and would poll at once).
            if p[n].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                return Err(Error::Os(std::io::Error::from_raw_os_error(libc::ENODEV)));
            }
            // Only our own descriptors woke: take at the top of the loop.
            if extra.iter().any(|x| x.revents != 0) || r == 0 {
                return Ok(self.take() > 0);
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            return; // a copy inherited across fork: the watches are the parent's
        }
        for ((_, id), d) in lock(&self.watched).drain() {
            // A domain already gone took its watches with it.
            if let Some(d) = d.upgrade() {
                let _ = d.watch(id, self.fd.as_raw_fd(), false);
            }
        }
    }
}

/// Wakes every watcher of this process that watches endpoint `id` of
/// `dom` (a change user space made to what its waiters wait for).
pub(crate) fn poke_endpoint(dom: &Arc<dyn Domain>, id: u32) {
    let live: Vec<Arc<Watcher>> = lock(&LIVE).iter().filter_map(Weak::upgrade).collect();
    for w in live {
        if w.pid == std::process::id() && w.watches(dom, id) {
            w.poke();
        }
    }
}
