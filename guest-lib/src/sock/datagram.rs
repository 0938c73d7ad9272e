//! A datagram socket (docs/sockets.md §5): whole messages, kept in order
//! and intact, dropped (and counted) when a receiver has no buffer.

use std::collections::VecDeque;
use std::io;
use std::time::Instant;

use ulnic_abi::INLINE_MAX;

use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::sock::addr::{Ready, SockAddr, Wakes, DGRAM_BASE};
use crate::sock::held::Held;
use crate::sock::net::{Net, DATAGRAM_BUFFER};
use crate::sock::stream::{errno, io_err};
use crate::sock::wire;
use crate::types::{Address, Event};

/// The largest datagram, as over UDP.
pub const MAX_DATAGRAM: usize = 65_507;

/// A datagram socket bound to a port of this node.
///
/// ```no_run
/// let net = ulnic::sock::Net::open()?;
/// let mut d = ulnic::sock::Datagram::bind(&net, Some(5000))?;
/// d.send_to(b"hello", ulnic::sock::SockAddr { node: 1, port: 5000 })?;
/// let mut buf = [0u8; 2048];
/// let (n, full, from) = d.recv_from(&mut buf, false)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Datagram {
    ep: Endpoint,
    net: Net,
    port: u16,
    peer: Option<SockAddr>,
    queue: VecDeque<(SockAddr, Held)>,
    nonblocking: bool,
    /// Datagrams of ours that found no buffer (or nobody) and came back
    /// or failed: dropped, as UDP drops them.
    undelivered: u64,
    stray: u64,
    /// Datagrams queued so far (`Wakes::input`).
    arrivals: u64,
}

impl Datagram {
    /// A datagram socket on `port`, or on a free port from 32768 with
    /// `None`: `EADDRINUSE` if another socket has the port.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let d = ulnic::sock::Datagram::bind(&net, None)?;
    /// println!("bound to {}", d.local_addr());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn bind(net: &Net, port: Option<u16>) -> io::Result<Datagram> {
        if port == Some(0) {
            return Datagram::bind(net, None);
        }
        let (ep, port) = net.datagram_endpoint(port).map_err(io_err)?;
        Ok(Datagram {
            ep,
            net: net.clone(),
            port,
            peer: None,
            queue: VecDeque::new(),
            nonblocking: false,
            undelivered: 0,
            stray: 0,
            arrivals: 0,
        })
    }

    /// Its address.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let d = ulnic::sock::Datagram::bind(&net, Some(9))?;
    /// assert_eq!(d.local_addr().port, 9);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn local_addr(&self) -> SockAddr {
        SockAddr {
            node: self.net.node(),
            port: self.port,
        }
    }

    /// Takes datagrams only from `peer` and sends to it by default
    /// (`None`: from anyone again).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// d.connect(Some(ulnic::sock::SockAddr { node: 1, port: 5000 }));
    /// d.send(b"hi")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn connect(&mut self, peer: Option<SockAddr>) {
        self.peer = peer;
    }

    /// The peer it is connected to, if any.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let d = ulnic::sock::Datagram::bind(&net, None)?;
    /// assert!(d.peer_addr().is_none());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn peer_addr(&self) -> Option<SockAddr> {
        self.peer
    }

    /// Makes sends, receives and waits return `WouldBlock` instead of
    /// blocking.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// d.set_nonblocking(true);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_nonblocking(&mut self, on: bool) {
        self.nonblocking = on;
    }

    /// The endpoint under the socket.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let d = ulnic::sock::Datagram::bind(&net, None)?;
    /// let fd = d.endpoint().notification_fd();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Datagrams this socket sent that were not delivered (no buffer or
    /// nobody at the destination), dropped as UDP drops them.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let d = ulnic::sock::Datagram::bind(&net, None)?;
    /// assert_eq!(d.undelivered(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn undelivered(&self) -> u64 {
        self.undelivered
    }

    fn progress(&mut self) {
        while let Some(m) = self.ep.poll_recv() {
            let held = Held::of(&m);
            let (kind, _) = wire::untag(m.tag);
            let from = (m.src.port > DGRAM_BASE && m.src.port <= DGRAM_BASE + u32::from(u16::MAX))
                .then(|| SockAddr {
                    node: m.src.node,
                    port: (m.src.port - DGRAM_BASE) as u16,
                });
            let keep = match from {
                _ if m.returned => {
                    self.undelivered += 1;
                    false
                }
                Some(f)
                    if kind == wire::DATAGRAM && !m.close && self.peer.is_none_or(|p| p == f) =>
                {
                    self.queue.push_back((f, held));
                    self.arrivals += 1;
                    true
                }
                _ => {
                    self.stray += 1;
                    false
                }
            };
            if !keep {
                let _ = held.release(&mut self.ep, DATAGRAM_BUFFER);
            }
        }
        while let Some(ev) = self.ep.poll_event() {
            if matches!(ev, Event::SendFailed { .. }) {
                self.undelivered += 1;
            }
        }
    }

    /// What has woken this socket so far ([`Wakes`]): datagrams queued.
    /// Call [`Datagram::poll`] first.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// let _ = d.poll();
    /// let datagrams_so_far = d.wakes().input;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wakes(&self) -> Wakes {
        Wakes {
            input: self.arrivals,
            ..Wakes::default()
        }
    }

    /// What it is ready for: `READ` when a datagram waits, `WRITE` when the
    /// send ring has room.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// let r = d.poll();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn poll(&mut self) -> Ready {
        self.progress();
        let mut r = Ready::NONE;
        if !self.queue.is_empty() {
            r |= Ready::READ;
        }
        if self.ep.send_space() > 0 {
            r |= Ready::WRITE;
        }
        r
    }

    /// Sends `buf` as one datagram to `to` without blocking (`WouldBlock`
    /// when the send ring is full); `EMSGSIZE` past 65,507 bytes.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// d.try_send_to(b"x", ulnic::sock::SockAddr { node: 0, port: 53 })?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn try_send_to(&mut self, buf: &[u8], to: SockAddr) -> io::Result<usize> {
        self.progress();
        if buf.len() > MAX_DATAGRAM {
            return Err(errno(libc::EMSGSIZE));
        }
        if to.port == 0 {
            return Err(errno(libc::EINVAL));
        }
        if to.node >= self.net.nodes() {
            return Err(errno(libc::ENETUNREACH));
        }
        let dest = Address {
            node: to.node,
            port: DGRAM_BASE + u32::from(to.port),
        };
        let tag = wire::tag(wire::DATAGRAM, 0);
        // The send that fills the ring asks for its completion, whose
        // event notifies a writer waiting for room (the ring's consumer
        // moving notifies nobody).
        let last = self.ep.send_space() == 1;
        let r = if buf.len() <= INLINE_MAX as usize && last {
            self.ep.post_send_inline_completion(dest, tag, buf, 0)
        } else if buf.len() <= INLINE_MAX as usize {
            self.ep.post_send_inline(dest, tag, buf, 0)
        } else if self.ep.send_space() == 0 {
            Err(Error::WouldBlock)
        } else {
            let slot = self.net.datagram_slot(self.ep.send_position());
            self.ep.write_segment(slot as usize, buf);
            self.ep
                .post_send(dest, tag, slot, buf.len() as u32, 0, last)
        };
        match r {
            Ok(()) => Ok(buf.len()),
            Err(Error::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(io_err(e)),
        }
    }

    /// Sends one datagram to `to`, blocking while the ring is full unless
    /// non-blocking.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// d.send_to(b"x", ulnic::sock::SockAddr { node: 0, port: 53 })?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn send_to(&mut self, buf: &[u8], to: SockAddr) -> io::Result<usize> {
        loop {
            match self.try_send_to(buf, to) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.nonblocking => {
                    self.wait(Ready::WRITE, None)?;
                }
                r => return r,
            }
        }
    }

    /// Sends one datagram to the connected peer (`EDESTADDRREQ` when not
    /// connected).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// # d.connect(Some(ulnic::sock::SockAddr { node: 1, port: 5000 }));
    /// d.send(b"x")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn send(&mut self, buf: &[u8]) -> io::Result<usize> {
        let to = self.peer.ok_or_else(|| errno(libc::EDESTADDRREQ))?;
        self.send_to(buf, to)
    }

    /// Receives the next datagram without blocking into `buf`: bytes
    /// copied, its full length (more than copied when it was truncated),
    /// and who sent it; with `peek` it stays to be received again.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// let mut buf = [0u8; 1500];
    /// if let Ok((n, full, from)) = d.try_recv_from(&mut buf, false) {
    ///     assert!(n <= full);
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn try_recv_from(
        &mut self,
        buf: &mut [u8],
        peek: bool,
    ) -> io::Result<(usize, usize, SockAddr)> {
        self.progress();
        let Some(&(from, h)) = self.queue.front() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let n = h.copy_out(&self.ep, 0, buf);
        if !peek {
            self.queue.pop_front();
            let _ = h.release(&mut self.ep, DATAGRAM_BUFFER);
        }
        Ok((n, h.len() as usize, from))
    }

    /// Receives the next datagram, blocking unless non-blocking.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// let mut buf = [0u8; 1500];
    /// let (n, _, from) = d.recv_from(&mut buf, false)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn recv_from(
        &mut self,
        buf: &mut [u8],
        peek: bool,
    ) -> io::Result<(usize, usize, SockAddr)> {
        loop {
            match self.try_recv_from(buf, peek) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.nonblocking => {
                    self.wait(Ready::READ, None)?;
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
    /// # let mut s = ulnic::sock::Datagram::bind(&net, None)?;
    /// if !s.arm()? {
    ///     // sleep in poll(2) on net.notification_fd(), then net.take_notified()
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn arm(&mut self) -> io::Result<bool> {
        // No look at the rings first: what that took in would be ready
        // without the caller knowing. The caller looked just before; the
        // arm's own re-check sees anything since.
        self.ep.arm().map_err(io_err)
    }

    /// Makes `w` watch this socket's endpoint (or stop, `on` false), so
    /// that its notifications wake `w` (arm with [`Self::arm`] before
    /// sleeping on `w`).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Datagram::bind(&net, None)?;
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
    /// # let s = ulnic::sock::Datagram::bind(&net, None)?;
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
    /// # let mut s = ulnic::sock::Datagram::bind(&net, None)?;
    /// let w = s.waiter();
    /// if !s.arm()? {
    ///     w.wait(std::time::Duration::from_millis(100))?;
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn waiter(&self) -> crate::Waiter {
        self.ep.waiter()
    }

    /// Waits until ready for something in `want` or `deadline` passes.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut d = ulnic::sock::Datagram::bind(&net, None)?;
    /// let soon = std::time::Instant::now() + std::time::Duration::from_secs(1);
    /// d.wait(ulnic::sock::Ready::READ, Some(soon))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait(&mut self, want: Ready, deadline: Option<Instant>) -> io::Result<bool> {
        let spin = self.net.config().spin;
        let (dom, id) = (self.ep.dom.clone(), self.ep.id());
        super::wait::until(
            self,
            spin,
            deadline,
            (&dom, id),
            |d| d.poll().intersects(want),
            |d| d.arm(),
        )
    }
}
