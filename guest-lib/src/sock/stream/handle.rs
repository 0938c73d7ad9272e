//! The public face of a stream connection: [`Stream`], a handle on
//! its shared [`Core`].

use super::*;

/// A stream socket: connected, or connecting. Reads and writes bytes in
/// order ([`std::io::Read`], [`std::io::Write`]); blocks unless set
/// non-blocking. Dropping it closes it in order (its peer reads end of
/// stream), or with a reset if data it never read was waiting.
///
/// ```no_run
/// use std::io::{Read, Write};
/// let net = ulnic::sock::Net::open()?;
/// let mut s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
/// s.write_all(b"ping")?;
/// let mut answer = [0u8; 4];
/// s.read_exact(&mut answer)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Stream {
    pub(super) core: Arc<Mutex<Core>>,
    pub(super) nonblocking: bool,
}

impl Stream {
    fn wrap(core: Core) -> Stream {
        Stream {
            core: Arc::new(Mutex::new(core)),
            nonblocking: false,
        }
    }

    pub(super) fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connects to a listener at `to`, waiting for its answer (at most
    /// the configured connect timeout): `ECONNREFUSED` if nobody listens,
    /// `EHOSTUNREACH` if the fabric cannot reach the node, `ETIMEDOUT` if
    /// nobody answers.
    ///
    /// ```no_run
    /// let net = ulnic::sock::Net::open()?;
    /// let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 6379 })?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn connect(net: &Net, to: SockAddr) -> io::Result<Stream> {
        let s = Stream::start_connect(net, to)?;
        let deadline = Instant::now() + net.config().connect_timeout;
        while !s.wait(Ready::WRITE, Some(deadline))? {}
        // Connected, even if reset since (its reads say so), as TCP's
        // connect returned before a reset came.
        if s.is_connected() {
            return Ok(s);
        }
        match s.take_error() {
            Some(e) => Err(errno(e)),
            None => Ok(s),
        }
    }

    /// Starts connecting to `to` and returns at once (a non-blocking
    /// connect): the stream becomes writable when it is connected, or
    /// reports the failure ([`Stream::take_error`]).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let mut s = ulnic::sock::Stream::start_connect(&net, ulnic::sock::SockAddr { node: 1, port: 80 })?;
    /// while !s.poll().contains(ulnic::sock::Ready::WRITE) {}
    /// assert!(s.take_error().is_none(), "connected");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_connect(net: &Net, to: SockAddr) -> io::Result<Stream> {
        Core::start_connect(net, to, None).map(Stream::wrap)
    }

    /// As [`Stream::start_connect`], showing `port` as this side's port
    /// (a socket bound to a port before it connects, as `bind` then
    /// `connect`): the peer sees it as the client's port. Informational
    /// (docs/sockets.md §1): the connection's own endpoint port differs.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let to = ulnic::sock::SockAddr { node: 1, port: 80 };
    /// let s = ulnic::sock::Stream::start_connect_from(&net, to, 40000)?;
    /// assert_eq!(s.local_addr().port, 40000);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_connect_from(net: &Net, to: SockAddr, port: u16) -> io::Result<Stream> {
        Core::start_connect(net, to, Some(port)).map(Stream::wrap)
    }

    /// The server's side of a connection a listener took from `client`:
    /// binds a connection endpoint, lets only the client's endpoint in,
    /// leaves an RST as its close message and sends ACCEPT.
    pub(crate) fn accepted(
        net: &Net,
        client: Address,
        session: u32,
        hello: Hello,
        port: u16,
    ) -> io::Result<Stream> {
        Core::accepted(net, client, session, hello, port).map(Stream::wrap)
    }

    /// This side's address.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// println!("{}", s.local_addr());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn local_addr(&self) -> SockAddr {
        self.core().local_addr()
    }

    /// The peer's address (the one connected to, or the client's).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// assert_eq!(s.peer_addr().node, 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn peer_addr(&self) -> SockAddr {
        self.core().peer_addr()
    }

    /// Makes reads, writes and waits return `WouldBlock` instead of
    /// blocking (or blocks again).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let mut s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// s.set_nonblocking(true);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_nonblocking(&mut self, on: bool) {
        self.nonblocking = on;
    }

    /// Whether calls return `WouldBlock` rather than block.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// assert!(!s.is_nonblocking());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// Whether the connection is established.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// assert!(s.is_connected());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_connected(&self) -> bool {
        self.core().is_connected()
    }

    /// The descriptor that becomes readable when this socket, armed, has
    /// something new (its domain's; shared with the domain's sockets).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let fd = s.notification_fd();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        self.core().ep.notification_fd()
    }

    /// Bytes received and not yet read (`FIONREAD`).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let waiting = s.available();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn available(&self) -> usize {
        self.core().available()
    }

    /// Messages dropped because they came from someone other than the
    /// peer or made no sense.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// assert_eq!(s.stray(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stray(&self) -> u64 {
        self.core().stray()
    }

    /// The connect's failure, or a reset, once (`SO_ERROR`): `None` when
    /// connected or still connecting.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::start_connect(&net, ulnic::sock::SockAddr { node: 1, port: 80 })?;
    /// if let Some(e) = s.take_error() {
    ///     eprintln!("connect failed: {}", std::io::Error::from_raw_os_error(e));
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn take_error(&self) -> Option<i32> {
        self.core().take_error()
    }

    /// What the socket is ready for now (and what came is taken in).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// if s.poll().contains(ulnic::sock::Ready::READ) { /* a read will not block */ }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn poll(&self) -> Ready {
        self.core().poll()
    }

    /// Reads into `buf` without blocking: the bytes read, 0 at end of
    /// stream, or `WouldBlock`; `ECONNRESET` once after a reset. With
    /// `peek` the bytes stay to be read again.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let mut buf = [0u8; 4096];
    /// match s.try_read(&mut buf, false) {
    ///     Ok(0) => println!("end of stream"),
    ///     Ok(n) => println!("{n} bytes"),
    ///     Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn try_read(&self, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        self.core().try_read(buf, peek)
    }

    /// Writes from `buf` without blocking: sent at once as far as the
    /// peer's credit goes, the rest kept in the send buffer (twice the
    /// credit's worth) and sent as credit comes back, by the library's
    /// flusher thread if the program does not call again; the bytes
    /// taken, or `WouldBlock` when the send buffer is full; `EPIPE` after
    /// a reset or our own shutdown.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let n = s.try_write(b"hello")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        let mut c = self.core();
        let n = c.try_write(buf)?;
        self.watch_if_waiting(&mut c);
        Ok(n)
    }

    /// Has the flusher send what waits (bytes, a FIN) without the
    /// program's help.
    fn watch_if_waiting(&self, c: &mut Core) {
        if c.has_waiting() && !c.watched {
            c.watched = true;
            let weak: std::sync::Weak<dyn Flushable> = Arc::downgrade(&self.core) as _;
            flusher::watch(weak);
        }
    }

    /// Asks for a notification when something new arrives, for a
    /// program that sleeps on [`crate::sock::Net::notification_fd`] for
    /// many sockets: true when something is waiting already (look again
    /// instead of sleeping). Check, arm, re-check: nothing arriving is
    /// slept through.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// if !s.arm()? {
    ///     // sleep in poll(2) on net.notification_fd(), then net.take_notified()
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn arm(&self) -> io::Result<bool> {
        self.core().arm()
    }

    /// What has woken this socket so far ([`Wakes`]), for edge-triggered
    /// readiness: call [`Stream::poll`] first, which takes in what arrived.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let before = s.wakes();
    /// let _ = s.poll();
    /// let new_data = s.wakes().input > before.input;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wakes(&self) -> Wakes {
        self.core().wakes()
    }

    /// Makes `w` watch this connection's endpoint (or stop, `on` false),
    /// so that its notifications wake `w` (arm with [`Self::arm`] before
    /// sleeping on `w`; sleep no longer than [`Self::next_timer`]).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let w = net.watcher()?;
    /// s.watch(&w, true)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn watch(&self, w: &crate::watcher::Watcher, on: bool) -> io::Result<()> {
        let (dom, id) = self.core().endpoint();
        if on {
            w.watch_id(&dom, id).map_err(io_err)
        } else {
            w.unwatch_id(&dom, id).map_err(io_err)
        }
    }

    /// When the connection next acts by itself, with nothing arriving: its
    /// keepalive or connect deadline (docs/sockets.md §4). A program
    /// sleeping for it wakes by then and looks ([`Self::poll`]).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let due = s.next_timer();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn next_timer(&self) -> Option<Instant> {
        self.core().next_timer()
    }

    /// This thread's watcher (made from this socket's NIC the first time):
    /// what a thread blocked on sockets sleeps on.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let w = s.thread_watcher()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn thread_watcher(&self) -> io::Result<std::sync::Arc<crate::watcher::Watcher>> {
        let (dom, _) = self.core().endpoint();
        wait::thread_watcher(&dom)
    }

    /// A handle that sleeps until this socket's endpoint is notified,
    /// without holding the socket (after [`Stream::arm`]).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// let w = s.waiter();
    /// if !s.arm()? {
    ///     w.wait(std::time::Duration::from_millis(100))?;
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn waiter(&self) -> crate::Waiter {
        self.core().waiter()
    }

    /// Waits until the socket is ready for something in `want` (or has an
    /// error or hang-up to report), or `deadline` passes (`None`: no
    /// limit): true when ready. Polls for the configured spin time, then
    /// sleeps in the driver.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// use ulnic::sock::Ready;
    /// let soon = std::time::Instant::now() + std::time::Duration::from_secs(1);
    /// if s.wait(Ready::WRITE, Some(soon))? { /* writable */ }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait(&self, want: Ready, deadline: Option<Instant>) -> io::Result<bool> {
        let spin_until = Instant::now() + self.core().net.config().spin;
        let mut watching: Option<wait::Watching> = None;
        loop {
            let (w, until) = {
                let mut c = self.core();
                if c.poll().intersects(want | Ready::ERROR | Ready::HUP) {
                    return Ok(true);
                }
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Ok(false);
                }
                if now < spin_until {
                    drop(c);
                    std::thread::yield_now();
                    continue;
                }
                if watching.is_none() {
                    let (dom, id) = c.endpoint();
                    watching = Some(wait::Watching::start(&dom, id)?);
                }
                if c.arm()? {
                    continue; // something came meanwhile
                }
                let w = watching.as_ref().map(|x| x.watcher().clone());
                // Woken for the connection's own timer too (a keepalive,
                // the connect deadline), never to look again.
                let until = match (deadline, c.next_timer()) {
                    (Some(d), Some(t)) => Some(d.min(t)),
                    (d, t) => d.or(t),
                };
                (w, until)
            };
            let Some(w) = w else { continue };
            if wait::sleep(&w, until)? == wait::Woke::Clock {
                let work = self.core().arm()?;
                wait::count_clock(&w, work);
            }
        }
    }

    /// Shuts one or both directions: after `Write` the peer reads end of
    /// stream once it has read what was sent (and what waits to be).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// s.shutdown(ulnic::sock::Shutdown::Write)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut c = self.core();
        let r = c.shutdown(how);
        self.watch_if_waiting(&mut c);
        let (dom, id) = c.endpoint();
        drop(c);
        // Its waiters in other threads see what changed (the kernel wakes
        // a socket's waiters at every shutdown, even a failed one).
        crate::watcher::poke_endpoint(&dom, id);
        r
    }

    /// Aborts the connection now: the peer's reads fail with `ECONNRESET`
    /// (`SO_LINGER` of 0). The socket is closed.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// # let s = ulnic::sock::Stream::connect(&net, ulnic::sock::SockAddr { node: 1, port: 7 })?;
    /// s.abort();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn abort(self) {
        self.core().abort();
    }
}

/// Closes in order: what was written (and waits in the send buffer) goes,
/// then the FIN; a reset instead when data was left unread. A connection
/// not accepted yet is left to the flusher, which finishes it once the
/// ACCEPT comes (or gives up at the connect timeout).
impl Drop for Stream {
    fn drop(&mut self) {
        let mut c = self.core();
        c.progress();
        if c.phase == Phase::Queued && !c.reset {
            c.orphan_until = Some(Instant::now() + c.net.config().connect_timeout);
            if c.fin_out == Fin::No && !c.aborting {
                c.fin_out = Fin::Wanted;
            }
            drop(c);
            flusher::adopt(self.core.clone());
            return;
        }
        c.close();
    }
}

/// Blocks unless non-blocking; end of stream is `Ok(0)`.
impl io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.try_read(buf, false) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.nonblocking => {
                    self.wait(Ready::READ, None)?;
                }
                r => return r,
            }
        }
    }
}

/// Blocks until at least one byte is taken, unless non-blocking.
impl io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match self.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.nonblocking => {
                    self.wait(Ready::WRITE, None)?;
                }
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
