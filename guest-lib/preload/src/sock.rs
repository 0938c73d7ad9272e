//! One interposed socket: what the program made with `socket()` and what
//! it became (a ulnic listener, connection or datagram socket, or still
//! undecided), and the socket calls on it. Errors are errno values.
//!
//! Every interposed socket keeps its kernel descriptor: the program's
//! descriptor number, what `fstat`, `fcntl` and options see, and for a
//! listener or datagram socket bound to any address, the kernel socket
//! that serves kernel peers beside ulnic ones. That descriptor is kept
//! non-blocking; the program's own view is `State::nonblock`.

use std::ffi::c_int;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ulnic::sock::{Datagram, Listener, Net, Ready, Shutdown, SockAddr, Stream, Wakes};
use ulnic::Watcher;

use crate::config::Target;
use crate::env::Env;
use crate::real::real;

/// Kernel epoll registrations of interposed sockets carry `TAG | fd` as
/// their data, so their readiness can be given the program's own.
pub const TAG: u64 = 0x756c_6e00_0000_0000;

/// The bits of `TAG`.
pub const TAG_MASK: u64 = 0xffff_ff00_0000_0000;

/// The tagged data of `fd`'s kernel registration.
pub fn epoll_tag(fd: c_int) -> u64 {
    TAG | u64::from(fd as u32)
}

/// What a socket is.
pub enum Kind {
    /// Made, not yet connected, bound or listening anywhere ulnic: the
    /// kernel's for now.
    Fresh,
    /// A listener on ulnic (and on the kernel too when `kernel_listening`).
    Listener(Listener),
    /// A ulnic connection.
    Stream(Stream),
    /// A ulnic datagram socket (and a kernel one when `kernel_bound`).
    Datagram(Datagram),
    /// Gone to the kernel for good (its table entry is being dropped).
    Kernel,
}

/// An `epoll` registration of one of the socket's descriptors.
#[derive(Debug, Clone, Copy)]
pub struct Reg {
    /// The epoll set.
    pub epfd: c_int,
    /// The descriptor registered (a socket may have several, by `dup`).
    pub fd: c_int,
    /// The readiness asked for (`epoll_event.events`).
    pub interest: u32,
    /// The program's data.
    pub data: u64,
    /// A one-shot registration that fired (until `EPOLL_CTL_MOD`).
    pub disabled: bool,
    /// Edge-triggered: the socket's wake-ups when the set last looked
    /// (`None` since `ADD` or `MOD`, which look at once, as the kernel's).
    pub seen: Option<Wakes>,
}

/// A socket's state, under its lock.
pub struct State {
    /// What it is.
    pub kind: Kind,
    /// `AF_INET` or `AF_INET6`: how addresses are shown.
    pub family: c_int,
    /// A datagram socket (else a stream).
    pub dgram: bool,
    /// The program's `O_NONBLOCK`.
    pub nonblock: bool,
    /// The port bound, if any.
    pub port: Option<u16>,
    /// Bound to any address (or only to this node's ulnic one).
    pub any: bool,
    /// The kernel socket listens too.
    pub kernel_listening: bool,
    /// The kernel socket is bound (datagrams: kernel peers reach it).
    pub kernel_bound: bool,
    /// `SO_LINGER` with a zero timeout: close aborts.
    pub linger_zero: bool,
    /// `SO_RCVTIMEO` and `SO_SNDTIMEO`.
    pub rcvtimeo: Option<Duration>,
    /// As above.
    pub sndtimeo: Option<Duration>,
    /// Its epoll registrations.
    pub regs: Vec<Reg>,
}

/// An interposed socket, shared by the descriptors that name it (`dup`).
pub struct Sock {
    st: Mutex<State>,
    /// Its count in the fork-shared arena.
    pub slot: Option<usize>,
}

/// A result whose error is an errno.
pub type Res<T> = Result<T, c_int>;

/// The errno of an I/O error (`EIO` if it has none).
pub fn errno_of(e: &io::Error) -> c_int {
    if e.kind() == io::ErrorKind::WouldBlock {
        libc::EAGAIN
    } else {
        e.raw_os_error().unwrap_or(libc::EIO)
    }
}

fn res<T>(r: io::Result<T>) -> Res<T> {
    r.map_err(|e| errno_of(&e))
}

impl Sock {
    /// A fresh socket of `family` (a datagram one with `dgram`).
    pub fn new(env: &Env, family: c_int, dgram: bool, nonblock: bool) -> Arc<Sock> {
        Arc::new(Sock {
            st: Mutex::new(State {
                kind: Kind::Fresh,
                family,
                dgram,
                nonblock,
                port: None,
                any: true,
                kernel_listening: false,
                kernel_bound: false,
                linger_zero: false,
                rcvtimeo: None,
                sndtimeo: None,
                regs: Vec::new(),
            }),
            slot: env.arena.as_ref().and_then(|a| a.claim()),
        })
    }

    /// Whether this process may use the socket: `EBUSY` when, after a
    /// fork, the other process used it first (it owns it now; this one may
    /// only close its copy).
    pub fn usable(&self, env: &Env) -> Res<()> {
        match (&env.arena, self.slot) {
            (Some(a), Some(i)) => match a.claim_use(i) {
                crate::share::Use::Mine => Ok(()),
                crate::share::Use::Theirs(pid) => {
                    static TOLD: std::sync::Once = std::sync::Once::new();
                    TOLD.call_once(|| {
                        crate::real::warn(&format!(
                            "a ulnic socket inherited across fork is process {pid}'s now (it used it first); this process may only close it (EBUSY)"
                        ))
                    });
                    Err(libc::EBUSY)
                }
            },
            _ => Ok(()),
        }
    }

    /// Its state, locked.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `op` until it does not report `EAGAIN`, sleeping between
    /// tries unless the socket is non-blocking (or `dontwait`): polls for
    /// the spin time, then watches the socket's endpoint with this
    /// thread's watcher, arms it and sleeps until notified, until the
    /// kernel socket `fd` (for a socket with a live kernel side) is ready
    /// as `want` says, or until the connection's own timer (docs/sockets.md
    /// §6). `timeout` (`SO_RCVTIMEO`-like) ends the wait with `EAGAIN`.
    pub fn block<T>(
        &self,
        env: &Env,
        fd: c_int,
        want: Ready,
        dontwait: bool,
        timeout: Option<Duration>,
        mut op: impl FnMut(&mut State) -> Res<T>,
    ) -> Res<T> {
        let _ = env;
        let start = Instant::now();
        let mut watched: Option<Arc<Watcher>> = None;
        let r = loop {
            let mut st = self.lock();
            match op(&mut st) {
                Err(libc::EAGAIN) => {}
                r => break r,
            }
            if st.nonblock || dontwait {
                break Err(libc::EAGAIN);
            }
            let elapsed = start.elapsed();
            if timeout.is_some_and(|t| elapsed >= t) {
                break Err(libc::EAGAIN);
            }
            if elapsed < env.spin {
                drop(st);
                std::thread::yield_now();
                continue;
            }
            if watched.is_none() {
                watched = st.start_watch();
            }
            match st.arm() {
                Ok(true) => continue, // something came meanwhile
                Ok(false) => {}
                Err(e) => break Err(e),
            }
            let until = earliest(timeout.map(|t| start + t), st.next_timer());
            let live = st.kernel_side_live();
            drop(st);
            let mut kernel = [libc::pollfd {
                fd,
                events: (want.0 & (libc::POLLIN | libc::POLLOUT) as u32) as i16,
                revents: 0,
            }];
            let extra: &mut [libc::pollfd] = if live { &mut kernel } else { &mut [] };
            // A signal ends the call with EINTR, as it ends a kernel
            // socket's blocking call whose handler has no SA_RESTART (a
            // program that asked for SA_RESTART sees it too: the layer
            // cannot tell which signal came).
            let ulnic = st_has_ulnic(self);
            match sleep(watched.as_deref(), ulnic, extra, until, std::ptr::null()) {
                Slept::Interrupted => break Err(libc::EINTR),
                Slept::Woken => {}
                Slept::Clock(w) => {
                    let work = self.lock().arm().unwrap_or(true);
                    if let Some(w) = w {
                        ulnic::sock::count_clock(w, work);
                    }
                }
            }
        };
        if let Some(w) = watched {
            self.lock().watch(&w, false);
        }
        r
    }
}

/// Whether the socket has a ulnic side (something a watcher must wake
/// it for).
fn st_has_ulnic(s: &Sock) -> bool {
    s.lock().has_ulnic()
}

/// The earlier of two optional instants.
pub fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How a [`sleep`] ended.
pub enum Slept<'a> {
    /// A signal.
    Interrupted,
    /// A notification, a poke, or one of the kernel descriptors.
    Woken,
    /// The clock, with the watcher slept on (none: there was none).
    Clock(Option<&'a Watcher>),
}

/// Sleeps on watcher `w` and the kernel descriptors `extra` until one
/// wakes or `until` (`None`: no limit). Where a ulnic side waits (`ulnic`)
/// and nothing feeds `w` (a child forked under host attach) or there is no
/// watcher, at most `UNFED_LOOK`, counted as an unfed look.
pub fn sleep<'a>(
    w: Option<&'a Watcher>,
    ulnic: bool,
    extra: &mut [libc::pollfd],
    until: Option<Instant>,
    sigmask: *const libc::sigset_t,
) -> Slept<'a> {
    // Only kernel descriptors to wait for: nothing needs feeding.
    let fed = !ulnic || w.is_some_and(Watcher::fed);
    let cap = (!fed).then(|| Instant::now() + ulnic::sock::UNFED_LOOK);
    let deadline = earliest(until, cap);
    // The real ppoll, not the library's wait: the program's descriptors in
    // `extra` may be interposed sockets, which the layer's own poll would
    // take for its own.
    let mut p: Vec<libc::pollfd> = extra.to_vec();
    let own = w.map_or_else(Vec::new, |w| w.fds());
    p.extend(own.iter().map(|&fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }));
    loop {
        if w.is_some_and(|w| w.take() > 0) {
            extra.iter_mut().for_each(|x| x.revents = 0);
            ulnic::sock::count_wake(ulnic::sock::WakeKind::Notified);
            return Slept::Woken;
        }
        p.iter_mut().for_each(|x| x.revents = 0);
        let ts = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            libc::timespec {
                tv_sec: left.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            }
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: a valid array of pollfds, a timespec (or null) and the
        // program's mask (or null) for the duration of the call.
        let r = unsafe { (real().ppoll)(p.as_mut_ptr(), p.len() as libc::nfds_t, tsp, sigmask) };
        if r < 0 && crate::real::errno() == libc::EINTR {
            return Slept::Interrupted;
        }
        let n = extra.len();
        extra.copy_from_slice(&p[..n]);
        if extra.iter().any(|x| x.revents != 0) {
            ulnic::sock::count_wake(ulnic::sock::WakeKind::Notified);
            return Slept::Woken;
        }
        if r > 0 {
            continue; // the watcher's own descriptors: taken at the top
        }
        if w.is_some_and(|w| w.take() > 0) {
            ulnic::sock::count_wake(ulnic::sock::WakeKind::Notified);
            return Slept::Woken;
        }
        if !fed {
            ulnic::sock::count_wake(ulnic::sock::WakeKind::Unfed);
            return Slept::Clock(None);
        }
        return Slept::Clock(w);
    }
}

impl State {
    /// Whether the kernel socket is part of what the program sees.
    pub fn kernel_side_live(&self) -> bool {
        match self.kind {
            Kind::Fresh | Kind::Kernel => true,
            Kind::Listener(_) => self.kernel_listening,
            Kind::Datagram(_) => self.kernel_bound,
            Kind::Stream(_) => false,
        }
    }

    /// What the ulnic side is ready for (nothing for a fresh socket).
    pub fn ready(&mut self) -> Ready {
        match &mut self.kind {
            Kind::Listener(l) => l.poll(),
            Kind::Stream(s) => s.poll(),
            Kind::Datagram(d) => d.poll(),
            Kind::Fresh | Kind::Kernel => Ready::NONE,
        }
    }

    /// What has woken the ulnic side so far (after `ready`).
    pub fn wakes(&mut self) -> Wakes {
        match &mut self.kind {
            Kind::Listener(l) => l.wakes(),
            Kind::Stream(s) => s.wakes(),
            Kind::Datagram(d) => d.wakes(),
            Kind::Fresh | Kind::Kernel => Wakes::default(),
        }
    }

    /// Arms the ulnic side: true when something waits already.
    pub fn arm(&mut self) -> Res<bool> {
        match &mut self.kind {
            Kind::Listener(l) => res(l.arm()),
            Kind::Stream(s) => res(s.arm()),
            Kind::Datagram(d) => res(d.arm()),
            Kind::Fresh | Kind::Kernel => Ok(false),
        }
    }

    /// Whether it has a ulnic side (a listener, connection or datagram
    /// socket on ulnic).
    pub fn has_ulnic(&self) -> bool {
        !matches!(self.kind, Kind::Fresh | Kind::Kernel)
    }

    /// Starts watching the ulnic side's endpoint with this thread's
    /// watcher: the watcher, or `None` for a socket with no ulnic side.
    pub fn start_watch(&self) -> Option<Arc<Watcher>> {
        let w = match &self.kind {
            Kind::Listener(l) => l.thread_watcher().ok()?,
            Kind::Stream(s) => s.thread_watcher().ok()?,
            Kind::Datagram(d) => d.thread_watcher().ok()?,
            Kind::Fresh | Kind::Kernel => return None,
        };
        self.watch(&w, true).then_some(w)
    }

    /// Makes `w` watch the ulnic side's endpoint (or stop): false when
    /// there is none, or it cannot.
    pub fn watch(&self, w: &Watcher, on: bool) -> bool {
        match &self.kind {
            Kind::Listener(l) => l.watch(w, on).is_ok(),
            Kind::Stream(s) => s.watch(w, on).is_ok(),
            Kind::Datagram(d) => d.watch(w, on).is_ok(),
            Kind::Fresh | Kind::Kernel => false,
        }
    }

    /// When the ulnic side next acts by itself (a connection's keepalive
    /// or connect deadline): a sleep for it ends by then.
    pub fn next_timer(&self) -> Option<Instant> {
        match &self.kind {
            Kind::Stream(s) => s.next_timer(),
            _ => None,
        }
    }

    /// The ulnic datagram socket, made (bound to the port asked for, or a
    /// free one) if there is none yet.
    pub fn datagram(&mut self, net: &Net) -> Res<&mut Datagram> {
        if !matches!(self.kind, Kind::Datagram(_)) {
            let d = res(Datagram::bind(net, self.port))?;
            self.port = Some(d.local_addr().port);
            self.kind = Kind::Datagram(d);
            if !self.kernel_bound {
                drop_kernel_regs(self);
            }
        }
        match &mut self.kind {
            Kind::Datagram(d) => Ok(d),
            _ => Err(libc::EIO),
        }
    }
}

/// What `connect` decided.
pub enum Connected {
    /// Done on ulnic (or failed there, with the errno).
    Ulnic(Res<()>),
    /// The kernel's: the caller hands the socket over and connects it.
    Kernel,
}

/// `connect` of a socket to `target`.
pub fn connect(env: &Env, sock: &Sock, fd: c_int, target: Target) -> Connected {
    let Target::Node(node, port) = target else {
        return Connected::Kernel;
    };
    let Some(net) = env.net().filter(|n| node < n.nodes()) else {
        return Connected::Kernel;
    };
    let to = SockAddr { node, port };
    let mut st = sock.lock();
    if st.dgram {
        let r = st.datagram(&net).map(|d| d.connect(Some(to)));
        return Connected::Ulnic(r);
    }
    match &mut st.kind {
        Kind::Fresh => {}
        Kind::Stream(s) if s.is_connected() => return Connected::Ulnic(Err(libc::EISCONN)),
        Kind::Stream(_) => return Connected::Ulnic(Err(libc::EALREADY)),
        Kind::Listener(_) => return Connected::Ulnic(Err(libc::EINVAL)),
        Kind::Datagram(_) | Kind::Kernel => return Connected::Kernel,
    }
    // A port bound first is the one the connection shows.
    let started = match st.port {
        Some(p) => Stream::start_connect_from(&net, to, p),
        None => Stream::start_connect(&net, to),
    };
    let s = match started {
        Ok(s) => s,
        Err(e) => return Connected::Ulnic(Err(errno_of(&e))),
    };
    st.kind = Kind::Stream(s);
    // The placeholder's kernel readiness means nothing now.
    drop_kernel_regs(&mut st);
    if st.nonblock {
        return Connected::Ulnic(Err(libc::EINPROGRESS));
    }
    drop(st);
    let deadline = net.config().connect_timeout;
    let r = sock.block(
        env,
        fd,
        Ready::WRITE,
        false,
        Some(deadline),
        |st| match &mut st.kind {
            Kind::Stream(s) => {
                if s.poll()
                    .intersects(Ready::WRITE | Ready::ERROR | Ready::HUP)
                {
                    if s.is_connected() {
                        // Even if reset since: its reads say so.
                        return Ok(());
                    }
                    match s.take_error() {
                        Some(e) => Err(e),
                        None => Ok(()),
                    }
                } else {
                    Err(libc::EAGAIN)
                }
            }
            _ => Err(libc::EBADF),
        },
    );
    Connected::Ulnic(r.map_err(|e| {
        if e == libc::EAGAIN {
            libc::ETIMEDOUT
        } else {
            e
        }
    }))
}

/// Takes the socket's descriptors out of the kernel's epoll sets (the
/// socket is ulnic's only now: its placeholder's readiness, hang-up
/// included, means nothing; the user-space registrations speak for it).
pub fn drop_kernel_regs(st: &mut State) {
    for r in &st.regs {
        // SAFETY: plain system call on descriptors the program owns.
        unsafe { (real().epoll_ctl)(r.epfd, libc::EPOLL_CTL_DEL, r.fd, std::ptr::null_mut()) };
    }
}

/// Gives the socket's kernel registrations the program's own interest and
/// data (the socket is the kernel's from now on).
pub fn restore_kernel_regs(st: &mut State) {
    for r in &st.regs {
        let mut e = libc::epoll_event {
            events: r.interest,
            u64: r.data,
        };
        // SAFETY: as above.
        unsafe { (real().epoll_ctl)(r.epfd, libc::EPOLL_CTL_MOD, r.fd, &mut e) };
    }
}

/// `bind` of a fresh socket to `target` (the kernel socket was bound, or
/// refused with `kernel_err`): records the port, and for a datagram
/// socket makes its ulnic side at once.
pub fn bind(
    env: &Env,
    sock: &Sock,
    target: Target,
    kernel_port: Option<u16>,
    kernel_err: Option<c_int>,
) -> Res<()> {
    let mut st = sock.lock();
    if !matches!(st.kind, Kind::Fresh) {
        return Err(libc::EINVAL);
    }
    let (port, any) = match target {
        Target::Any(p) => (p, true),
        Target::Node(n, p) => {
            let Some(net) = env.net() else {
                return kernel_err.map_or(Ok(()), Err);
            };
            if n != net.node() {
                return Err(libc::EADDRNOTAVAIL);
            }
            (p, false)
        }
        // Local: resolved by `Env::target` (never here).
        Target::Kernel | Target::Local(_) => return kernel_err.map_or(Ok(()), Err),
    };
    // The kernel's port when it chose one (bind to port 0).
    let port = if port == 0 {
        kernel_port.unwrap_or(0)
    } else {
        port
    };
    st.kernel_bound = kernel_err.is_none();
    if let (Some(e), true) = (kernel_err, any) {
        return Err(e);
    }
    st.port = (port != 0).then_some(port);
    st.any = any;
    if st.dgram {
        if let Some(net) = env.net() {
            st.datagram(&net)?;
        }
    }
    Ok(())
}

/// `listen`: a ulnic listener on the bound port, beside the kernel's
/// (`kernel_listening`) when bound to any address. `Ok(false)` when
/// ulnic cannot listen there: the socket is the kernel's.
pub fn listen(env: &Env, sock: &Sock, backlog: c_int, kernel_listening: bool) -> Res<bool> {
    let mut st = sock.lock();
    match st.kind {
        Kind::Fresh => {}
        Kind::Listener(_) => return Ok(true),
        _ => return Err(libc::EINVAL),
    }
    let (Some(net), Some(port)) = (env.net(), st.port) else {
        return Ok(false);
    };
    let backlog = if backlog <= 0 { 128 } else { backlog as u32 };
    match Listener::bind(&net, port, backlog) {
        Ok(l) => {
            st.kind = Kind::Listener(l);
            st.kernel_listening = kernel_listening;
            if !kernel_listening {
                drop_kernel_regs(&mut st);
            }
            Ok(true)
        }
        // Another socket listens there on ulnic (an IPv6 twin of this
        // IPv4 one, or another process): the kernel serves this one.
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && st.any => Ok(false),
        Err(e) => Err(errno_of(&e)),
    }
}

/// What `accept` found.
pub enum Accepted {
    /// A ulnic connection, and who it is from.
    Ulnic(Stream, SockAddr),
    /// The kernel's (descriptor already accepted).
    Kernel(c_int),
}

/// One `accept` try on a listener, ulnic first, then the kernel socket:
/// `EAGAIN` when neither has a connection. A ulnic connection is made in
/// `net`, this process's own context (a listener inherited across fork
/// belongs to the parent's); with none (the forked child of a
/// host-attached process, which cannot attach again), a ulnic request
/// cannot be taken: `EOPNOTSUPP`, said once, rather than a connection
/// built on the parent's attachment.
pub fn try_accept(
    st: &mut State,
    net: Option<&Net>,
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
    flags: c_int,
) -> Res<Accepted> {
    let kernel = st.kernel_listening;
    let Kind::Listener(l) = &mut st.kind else {
        return Err(libc::EINVAL);
    };
    match net {
        Some(net) => match l.try_accept_in(net) {
            Ok((s, from)) => return Ok(Accepted::Ulnic(s, from)),
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(errno_of(&e)),
            Err(_) => {}
        },
        None if l.poll().contains(Ready::READ) => {
            static TOLD: std::sync::Once = std::sync::Once::new();
            TOLD.call_once(|| {
                crate::real::warn(
                    "a forked child of a host-attached process cannot make ulnic connections (it cannot attach to the device again): accept fails with EOPNOTSUPP; accept in the parent, or run the server in a guest",
                )
            });
            return Err(libc::EOPNOTSUPP);
        }
        None => {}
    }
    if kernel {
        // The kernel descriptor is non-blocking: this never waits.
        // SAFETY: the program's own arguments, passed on.
        let k = unsafe { (real().accept4)(fd, addr, len, flags) };
        if k >= 0 {
            return Ok(Accepted::Kernel(k));
        }
        let e = crate::real::errno();
        if e != libc::EAGAIN && e != libc::EWOULDBLOCK {
            return Err(e);
        }
    }
    Err(libc::EAGAIN)
}

/// Reads from a stream (`peek` keeps the bytes).
pub fn stream_read(st: &mut State, buf: &mut [u8], peek: bool) -> Res<usize> {
    match &mut st.kind {
        Kind::Stream(s) => res(s.try_read(buf, peek)),
        _ => Err(libc::ENOTCONN),
    }
}

/// Writes to a stream.
pub fn stream_write(st: &mut State, buf: &[u8]) -> Res<usize> {
    match &mut st.kind {
        Kind::Stream(s) => res(s.try_write(buf)),
        _ => Err(libc::ENOTCONN),
    }
}

/// `shutdown`.
pub fn shutdown(st: &mut State, how: c_int) -> Res<()> {
    let how = match how {
        libc::SHUT_RD => Shutdown::Read,
        libc::SHUT_WR => Shutdown::Write,
        libc::SHUT_RDWR => Shutdown::Both,
        _ => return Err(libc::EINVAL),
    };
    match &mut st.kind {
        Kind::Stream(s) => res(s.shutdown(how)),
        _ => Err(libc::ENOTCONN),
    }
}

/// The socket's last holder let go: closes its ulnic side in order (or
/// aborts it, with `SO_LINGER` 0).
pub fn finish(st: &mut State) {
    let kind = std::mem::replace(&mut st.kind, Kind::Kernel);
    match kind {
        Kind::Stream(s) if st.linger_zero => s.abort(),
        other => drop(other),
    }
}

/// Forgets the socket's ulnic side without closing it: another process
/// (a fork) still holds it.
pub fn forget(st: &mut State) {
    std::mem::forget(std::mem::replace(&mut st.kind, Kind::Kernel));
}
