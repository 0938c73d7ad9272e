//! A stream listener: connection requests queued up to a backlog and
//! accepted into connections of their own (docs/sockets.md §3).

use std::collections::VecDeque;
use std::io;
use std::time::Instant;

use zerocopy::IntoBytes;

use crate::endpoint::Endpoint;
use crate::sock::addr::{Ready, SockAddr, Wakes, CONN_BASE, CONN_PORTS};
use crate::sock::net::Net;
use crate::sock::shared_requests::{Counts, Request, SharedRequests};
use crate::sock::stream::handle::Stream;
use crate::sock::stream::{errno, io_err, post_inline};
use crate::sock::wire::{self, Hello};
use crate::types::{Address, Payload};

/// A listening stream socket on a port of this node.
///
/// ```no_run
/// use std::io::{Read, Write};
/// let net = ulnic::sock::Net::open()?;
/// let mut l = ulnic::sock::Listener::bind(&net, 7, 128)?;
/// let (mut s, from) = l.accept()?;
/// let mut buf = [0u8; 4];
/// s.read_exact(&mut buf)?;
/// s.write_all(&buf)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Listener {
    ep: Endpoint,
    net: Net,
    port: u16,
    backlog: usize,
    /// Requests waiting: the connecting endpoint, its session id (spec
    /// §5.4) and its hello.
    queue: VecDeque<Request>,
    nonblocking: bool,
    counts: Counts,
    /// Once shared across fork: the queue and counts every holder uses,
    /// under their lock.
    shared: Option<SharedRequests>,
}

/// A listener that closes refuses the requests it had queued (not one
/// shared across fork: other processes may still accept them).
impl Drop for Listener {
    fn drop(&mut self) {
        if self.shared.is_none() {
            self.refuse_queued();
        }
    }
}

impl Listener {
    /// Listens on `port` (1..=65535) of this node, queueing up to
    /// `backlog` requests (more wait in its endpoint's ring, and beyond
    /// that their CONNECTs are retried until their connect timeout):
    /// `EADDRINUSE` if another socket listens there.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let l = ulnic::sock::Listener::bind(&net, 6379, 511)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn bind(net: &Net, port: u16, backlog: u32) -> io::Result<Listener> {
        if port == 0 {
            return Err(errno(libc::EINVAL));
        }
        let backlog = backlog.clamp(1, 4000);
        let ep = net.listener_endpoint(port, backlog).map_err(io_err)?;
        Ok(Listener {
            ep,
            net: net.clone(),
            port,
            backlog: backlog as usize,
            queue: VecDeque::new(),
            nonblocking: false,
            counts: Counts::default(),
            shared: None,
        })
    }

    /// Makes the listener usable by every process forked from this one
    /// after the call (a pre-forking server's workers): its queue moves to
    /// memory the processes share, and each call on it takes a lock the
    /// processes share and reloads the ring cursors first, so each request
    /// is taken by one process, once. Call it before `fork`; the accepting
    /// process gives its own context to [`Self::try_accept_in`]. Idempotent.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let mut l = ulnic::sock::Listener::bind(&net, 80, 511)?;
    /// l.share_across_fork()?;
    /// // fork workers; each opens its own Net and accepts with try_accept_in
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn share_across_fork(&mut self) -> io::Result<()> {
        if self.shared.is_none() {
            let shared = SharedRequests::new(self.backlog)?;
            shared.lock().store(&self.queue, self.counts);
            self.shared = Some(shared);
        }
        Ok(())
    }

    /// Runs `f` as the listener's one user: for a shared listener, under
    /// the processes' lock with the cursors and queue reloaded before and
    /// the queue stored after.
    fn exclusive<R>(&mut self, f: impl FnOnce(&mut Listener) -> R) -> R {
        let Some(shared) = self.shared.take() else {
            return f(self);
        };
        let r = {
            let locked = shared.lock();
            self.ep.resync_cursors();
            locked.load(&mut self.queue, &mut self.counts);
            let r = f(self);
            locked.store(&self.queue, self.counts);
            r
        };
        self.shared = Some(shared);
        r
    }

    /// Takes the notifications of the listener's own context (after a
    /// wake-up on [`Self::notification_fd`]): for a process that waits on
    /// a listener it inherited, whose context is the parent's.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// l.take_notified()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn take_notified(&self) -> io::Result<()> {
        self.net.take_notified().map(|_| ()).map_err(io_err)
    }

    /// The descriptor that becomes readable when the armed listener is
    /// notified (its context's; see [`crate::sock::Net::notification_fd`]).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let fd = l.notification_fd();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        self.net.notification_fd()
    }

    /// The address it listens on.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// assert_eq!(l.local_addr().port, 7);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn local_addr(&self) -> SockAddr {
        SockAddr {
            node: self.net.node(),
            port: self.port,
        }
    }

    /// Makes `accept` return `WouldBlock` instead of blocking.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// l.set_nonblocking(true);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_nonblocking(&mut self, on: bool) {
        self.nonblocking = on;
    }

    /// The endpoint under the listener (for its notification descriptor).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let fd = l.endpoint().notification_fd();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Requests refused: by a close with requests queued, or because
    /// their connection could not be made (no endpoint or memory left).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// assert_eq!(l.refused(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn refused(&mut self) -> u64 {
        self.exclusive(|l| l.counts.refused)
    }

    /// Answers a request it will not accept with REFUSE (and why), and
    /// counts it.
    fn refuse(&mut self, client: Address, why: i32) {
        self.counts.refused += 1;
        let _ = post_inline(
            &mut self.ep,
            client,
            wire::tag(wire::REFUSE, 0),
            (why as u32).to_le_bytes().as_bytes(),
            0,
        );
    }

    /// Closing: answers every queued request (and any still in the ring)
    /// with REFUSE, so its client fails at once, as TCP resets the
    /// connections a closed listener had queued. The refusals are sent
    /// before the endpoint goes (100 ms at most).
    fn refuse_queued(&mut self) {
        let give_up = std::time::Instant::now() + std::time::Duration::from_millis(100);
        loop {
            // The ring's requests come in as the queue empties.
            self.progress();
            let Some((client, _, _)) = self.queue.pop_front() else {
                break;
            };
            while self.ep.send_space() == 0 && std::time::Instant::now() < give_up {
                std::thread::yield_now();
            }
            self.refuse(client, libc::ECONNREFUSED);
        }
        while !self.ep.sends_done() && std::time::Instant::now() < give_up {
            std::thread::yield_now();
        }
    }

    /// Takes requests from the ring into the queue, up to the backlog:
    /// the rest wait in the ring (their clients are connected: the device
    /// delivered their CONNECT), and once the ring is full too, new
    /// CONNECTs meet NO_BUFFER and their clients send them again.
    fn progress(&mut self) {
        while self.queue.len() < self.backlog {
            let Some(m) = self.ep.poll_recv() else {
                break;
            };
            let (kind, credits) = wire::untag(m.tag);
            let hello = match m.payload {
                Payload::Inline(d) => Hello::parse(&d[..m.len.min(96) as usize]),
                Payload::Buffer { .. } => None,
            };
            let from_conn = m.src.port > CONN_BASE && m.src.port < CONN_BASE + CONN_PORTS;
            match (kind, hello) {
                (wire::CONNECT, Some(h)) if from_conn && !m.close && !m.returned => {
                    self.queue.push_back((m.src, m.session, h));
                    self.counts.arrivals += 1;
                }
                // A queued client's keepalive: it only asks whether the
                // listener is still there.
                (wire::CREDIT, None) if from_conn && credits == 0 && m.len == 0 => {}
                _ => self.counts.stray += 1,
            }
        }
        // Refusals that found nobody need no answer.
        while self.ep.poll_event().is_some() {}
    }

    /// Whether a request waits (`Ready::READ`).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// if l.poll().contains(ulnic::sock::Ready::READ) { let _ = l.accept()?; }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn poll(&mut self) -> Ready {
        self.exclusive(|l| {
            l.progress();
            if l.queue.is_empty() {
                Ready::NONE
            } else {
                Ready::READ
            }
        })
    }

    /// What has woken this listener so far ([`Wakes`]): requests queued,
    /// by whichever process sharing it took them in. Call
    /// [`Listener::poll`] first.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let _ = l.poll();
    /// let requests_so_far = l.wakes().input;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wakes(&mut self) -> Wakes {
        Wakes {
            input: self.exclusive(|l| l.counts.arrivals),
            ..Wakes::default()
        }
    }

    /// Accepts the next request without blocking: the connection and the
    /// client's address, or `WouldBlock`.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// match l.try_accept() {
    ///     Ok((s, from)) => println!("connection from {from}"),
    ///     Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn try_accept(&mut self) -> io::Result<(Stream, SockAddr)> {
        let net = self.net.clone();
        self.try_accept_in(&net)
    }

    /// As [`Self::try_accept`], with the connection's endpoint made in
    /// `net` rather than in the listener's own context: a process that
    /// inherited the listener across `fork` makes its connections in a
    /// context of its own, since the parent's context keeps per-process
    /// state the child's copy of would contradict.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let mine = ulnic::sock::Net::open()?;
    /// match l.try_accept_in(&mine) {
    ///     Ok((s, from)) => println!("connection from {from}"),
    ///     Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn try_accept_in(&mut self, net: &Net) -> io::Result<(Stream, SockAddr)> {
        self.exclusive(|l| {
            l.progress();
            let Some((client, session, hello)) = l.queue.pop_front() else {
                return Err(io::ErrorKind::WouldBlock.into());
            };
            // Its place in the backlog goes to the next in the ring,
            // whose place there a waiting CONNECT can take.
            l.progress();
            let s = match Stream::accepted(net, client, session, hello, l.port) {
                Ok(s) => s,
                Err(e) => {
                    // The request is taken: answer it, so that its client
                    // fails now (with why: no endpoint or memory left
                    // here) instead of at its connect timeout.
                    l.refuse(client, e.raw_os_error().unwrap_or(libc::ECONNREFUSED));
                    return Err(e);
                }
            };
            let from = s.peer_addr();
            Ok((s, from))
        })
    }

    /// Accepts the next request, blocking unless non-blocking.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let (s, from) = l.accept()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn accept(&mut self) -> io::Result<(Stream, SockAddr)> {
        loop {
            match self.try_accept() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.nonblocking => {
                    self.wait(None)?;
                }
                r => return r,
            }
        }
    }

    /// Asks for a notification when something new arrives, for a
    /// program that sleeps on [`crate::sock::Net::notification_fd`] for many sockets:
    /// true when something is waiting already (look again instead of
    /// sleeping). Check, arm, re-check: nothing arriving is slept through.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut s = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// if !s.arm()? {
    ///     // sleep in poll(2) on net.notification_fd(), then net.take_notified()
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn arm(&mut self) -> io::Result<bool> {
        // No look at the rings first: what that took in would be ready
        // without the caller knowing. The caller looked just before; the
        // arm's own re-check sees anything since.
        self.exclusive(|l| l.ep.arm().map_err(io_err))
    }

    /// Makes `w` watch this socket's endpoint (or stop, `on` false), so
    /// that its notifications wake `w` (arm with [`Self::arm`] before
    /// sleeping on `w`).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let w = net.watcher()?;
    /// s.watch(&w, true)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn watch(&self, w: &crate::watcher::Watcher, on: bool) -> io::Result<()> {
        if on {
            self.ep.watch(w).map_err(io_err)
        } else {
            self.ep.unwatch(w).map_err(io_err)
        }
    }

    /// This thread's watcher (made from this socket's NIC the first time):
    /// what a thread blocked on sockets sleeps on.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let w = s.thread_watcher()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn thread_watcher(&self) -> io::Result<std::sync::Arc<crate::watcher::Watcher>> {
        crate::sock::wait::thread_watcher(&self.ep.dom)
    }

    /// A handle that sleeps until this socket's endpoint is notified,
    /// without holding the socket (after [`Self::arm`]).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut s = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let w = s.waiter();
    /// if !s.arm()? {
    ///     w.wait(std::time::Duration::from_millis(100))?;
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn waiter(&self) -> crate::Waiter {
        self.ep.waiter()
    }

    /// Waits until a request waits or `deadline` passes: true when one
    /// does.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut l = ulnic::sock::Listener::bind(&net, 7, 16)?;
    /// let soon = std::time::Instant::now() + std::time::Duration::from_secs(1);
    /// if l.wait(Some(soon))? { let _ = l.accept()?; }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait(&mut self, deadline: Option<Instant>) -> io::Result<bool> {
        let spin = self.net.config().spin;
        let (dom, id) = (self.ep.dom.clone(), self.ep.id());
        super::wait::until(
            self,
            spin,
            deadline,
            (&dom, id),
            |l| l.poll().contains(Ready::READ),
            |l| l.arm(),
        )
    }
}
