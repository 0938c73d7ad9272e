//! Making, naming, connecting and tuning sockets: `socket`, `bind`,
//! `listen`, `accept`, `accept4`, `connect`, `shutdown`, `getsockname`,
//! `getpeername`, `setsockopt`, `getsockopt`.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

use libc::{sockaddr, socklen_t};

use crate::config::{write_addr, Target};
use crate::context::{close_name, ctx, handover, kernel_nonblocking};
use crate::real::{fail, real, trace};
use crate::sock::{self, Accepted, Connected, Kind, Sock};

/// `socket`: TCP and UDP sockets of IPv4 and IPv6 are interposed (while
/// `ULNIC_INET` names a network); everything else is the kernel's alone.
#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: the program's arguments, passed on.
    let fd = unsafe { (real().socket)(domain, ty, proto) };
    let c = ctx();
    if fd < 0 || c.env.inet.is_none() || (domain != libc::AF_INET && domain != libc::AF_INET6) {
        return fd;
    }
    let base = ty & 0xf;
    let dgram = match (base, proto) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => false,
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => true,
        _ => return fd,
    };
    let nonblock = ty & libc::SOCK_NONBLOCK != 0;
    kernel_nonblocking(fd, true);
    c.table
        .insert(fd, Sock::new(&c.env, domain, dgram, nonblock));
    fd
}

/// The port a bound kernel socket has.
fn kernel_port(fd: c_int) -> Option<u16> {
    let mut a: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: a buffer of `len` bytes we own.
    if unsafe { (real().getsockname)(fd, (&mut a as *mut libc::sockaddr_storage).cast(), &mut len) }
        != 0
    {
        return None;
    }
    let p = match c_int::from(a.ss_family) {
        // SAFETY: the family says which struct it is.
        libc::AF_INET => unsafe { (*(&a as *const _ as *const libc::sockaddr_in)).sin_port },
        // SAFETY: as above.
        libc::AF_INET6 => unsafe { (*(&a as *const _ as *const libc::sockaddr_in6)).sin6_port },
        _ => return None,
    };
    Some(u16::from_be(p))
}

/// `bind`.
#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let c = ctx();
    let Some(s) = c.table.get(fd) else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().bind)(fd, addr, len) };
    };
    if c.env.inet.is_none() {
        // SAFETY: as above.
        return unsafe { (real().bind)(fd, addr, len) };
    }
    // SAFETY: the program gives `len` bytes at `addr`.
    let target = unsafe { c.env.target(addr, len) };
    if target == Target::Kernel {
        handover(c, &s);
        // SAFETY: as above.
        return unsafe { (real().bind)(fd, addr, len) };
    }
    // SAFETY: as above.
    let k = unsafe { (real().bind)(fd, addr, len) };
    let kerr = (k < 0).then(crate::real::errno);
    match sock::bind(&c.env, &s, target, kernel_port(fd), kerr) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `listen`: a ulnic listener on the bound port, and the kernel's beside
/// it when the kernel socket is bound.
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    let c = ctx();
    let Some(s) = c.table.get(fd) else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().listen)(fd, backlog) };
    };
    if s.lock().dgram {
        return fail(libc::EOPNOTSUPP);
    }
    // The kernel listens too wherever it could bind (an unbound socket
    // gets a port here, which ulnic takes too).
    let never_bound = s.lock().port.is_none();
    let k = if s.lock().kernel_bound || never_bound {
        // SAFETY: as above.
        unsafe { (real().listen)(fd, backlog) }
    } else {
        -1
    };
    if never_bound {
        let mut st = s.lock();
        st.port = kernel_port(fd);
        st.kernel_bound = k == 0;
    }
    match sock::listen(&c.env, &s, backlog, k == 0) {
        Ok(true) => 0,
        Ok(false) if k == 0 => {
            handover(c, &s);
            0
        }
        Ok(false) => fail(libc::EADDRNOTAVAIL),
        Err(e) => fail(e),
    }
}

/// `accept`.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the program's arguments, passed on.
    unsafe { accept4(fd, addr, len, 0) }
}

/// `accept4`: a ulnic connection, or the kernel's, whichever comes first.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let c = ctx();
    let Some(s) = c
        .table
        .get(fd)
        .filter(|s| matches!(s.lock().kind, Kind::Listener(_)))
    else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().accept4)(fd, addr, len, flags) };
    };
    if let Err(e) = s.usable(&c.env) {
        return fail(e);
    }
    let net = c.env.net();
    let r = s.block(&c.env, fd, ulnic::sock::Ready::READ, false, None, |st| {
        sock::try_accept(st, net.as_ref(), fd, addr, len, flags)
    });
    let (stream, from) = match r {
        Ok(Accepted::Kernel(k)) => return k,
        Ok(Accepted::Ulnic(stream, from)) => (stream, from),
        Err(e) => return fail(e),
    };
    let family = s.lock().family;
    // SAFETY: a fresh socket of our own, as the program's descriptor.
    let nfd =
        unsafe { (real().socket)(family, libc::SOCK_STREAM | (flags & libc::SOCK_CLOEXEC), 0) };
    if nfd < 0 {
        let e = crate::real::errno();
        stream.abort();
        return fail(e);
    }
    kernel_nonblocking(nfd, true);
    let ns = Sock::new(&c.env, family, false, flags & libc::SOCK_NONBLOCK != 0);
    {
        let mut st = ns.lock();
        st.port = Some(stream.local_addr().port);
        st.kind = Kind::Stream(stream);
    }
    c.table.insert(nfd, ns);
    trace!("accept({fd}): {nfd} from {from}");
    if let Some(inet) = c.env.inet {
        // SAFETY: NULL or the program's buffer of `*len` bytes.
        unsafe { write_addr(family, inet.addr_of(from.node), from.port, addr, len) };
    }
    nfd
}

/// `connect`: over ulnic to a ulnic address, else by the kernel.
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let c = ctx();
    let (Some(s), Some(_)) = (c.table.get(fd), c.env.inet) else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().connect)(fd, addr, len) };
    };
    if let Err(e) = s.usable(&c.env) {
        return fail(e);
    }
    // SAFETY: the program gives `len` bytes at `addr`.
    let target = unsafe { c.env.target(addr, len) };
    match sock::connect(&c.env, &s, fd, target) {
        Connected::Ulnic(Ok(())) => {
            trace!("connect({fd}) to {target:?}: connected");
            0
        }
        Connected::Ulnic(Err(e)) => {
            trace!(
                "connect({fd}) to {target:?}: {}",
                std::io::Error::from_raw_os_error(e)
            );
            fail(e)
        }
        Connected::Kernel => {
            trace!("connect({fd}) to {target:?}: the kernel's");
            handover(c, &s);
            // SAFETY: as above.
            unsafe { (real().connect)(fd, addr, len) }
        }
    }
}

/// `shutdown`.
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    let c = ctx();
    if let Some(s) = c.table.get(fd) {
        if let Err(e) = s.usable(&c.env) {
            return fail(e);
        }
        let mut st = s.lock();
        if matches!(st.kind, Kind::Stream(_)) {
            return match sock::shutdown(&mut st, how) {
                Ok(()) => 0,
                Err(e) => fail(e),
            };
        }
        if matches!(st.kind, Kind::Listener(_)) {
            return fail(libc::ENOTCONN);
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { (real().shutdown)(fd, how) }
}

/// This node's address and `port`, as the socket's family shows it.
fn own_addr(s: &Arc<Sock>, port: u16, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let c = ctx();
    let (Some(inet), Some(net)) = (c.env.inet, c.env.net_if_open()) else {
        return fail(libc::ENOTSOCK);
    };
    let family = s.lock().family;
    // SAFETY: NULL or the program's buffer of `*len` bytes.
    unsafe { write_addr(family, inet.addr_of(net.node()), port, addr, len) };
    0
}

/// `getsockname`.
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(s) = ctx().table.get(fd) {
        let st = s.lock();
        let port = match &st.kind {
            Kind::Stream(x) => Some(x.local_addr().port),
            Kind::Listener(_) | Kind::Datagram(_) if !st.kernel_bound => st.port,
            _ => None,
        };
        drop(st);
        if let Some(p) = port {
            return own_addr(&s, p, addr, len);
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { (real().getsockname)(fd, addr, len) }
}

/// `getpeername`.
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let c = ctx();
    if let (Some(s), Some(inet)) = (c.table.get(fd), c.env.inet) {
        let st = s.lock();
        let peer = match &st.kind {
            Kind::Stream(x) if x.is_connected() => Some(x.peer_addr()),
            Kind::Stream(_) | Kind::Listener(_) => return fail(libc::ENOTCONN),
            Kind::Datagram(d) => d.peer_addr(),
            _ => None,
        };
        if let Some(p) = peer {
            // SAFETY: NULL or the program's buffer of `*len` bytes.
            unsafe { write_addr(st.family, inet.addr_of(p.node), p.port, addr, len) };
            return 0;
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { (real().getpeername)(fd, addr, len) }
}

fn timeval_arg(val: *const c_void, len: socklen_t) -> Option<Option<Duration>> {
    if val.is_null() || (len as usize) < std::mem::size_of::<libc::timeval>() {
        return None;
    }
    // SAFETY: `len` readable bytes at `val`, checked above.
    let tv = unsafe { std::ptr::read_unaligned(val.cast::<libc::timeval>()) };
    let d = Duration::from_secs(tv.tv_sec.max(0) as u64)
        + Duration::from_micros(tv.tv_usec.max(0) as u64);
    Some((!d.is_zero()).then_some(d))
}

/// `setsockopt`: the kernel socket takes every option (its answer is the
/// program's); the ulnic side heeds `SO_LINGER`, `SO_RCVTIMEO` and
/// `SO_SNDTIMEO`.
#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { (real().setsockopt)(fd, level, name, val, len) };
    if r != 0 || level != libc::SOL_SOCKET {
        return r;
    }
    if let Some(s) = ctx().table.get(fd) {
        let mut st = s.lock();
        match name {
            libc::SO_LINGER
                if !val.is_null() && len as usize >= std::mem::size_of::<libc::linger>() =>
            {
                // SAFETY: checked size.
                let l = unsafe { std::ptr::read_unaligned(val.cast::<libc::linger>()) };
                st.linger_zero = l.l_onoff != 0 && l.l_linger == 0;
            }
            libc::SO_RCVTIMEO => {
                if let Some(t) = timeval_arg(val, len) {
                    st.rcvtimeo = t;
                }
            }
            libc::SO_SNDTIMEO => {
                if let Some(t) = timeval_arg(val, len) {
                    st.sndtimeo = t;
                }
            }
            _ => {}
        }
    }
    r
}

/// `getsockopt`: `SO_ERROR` of a ulnic connection is its own (a connect's
/// failure, a reset); the rest is the kernel socket's answer.
#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if level == libc::SOL_SOCKET && name == libc::SO_ERROR && !val.is_null() && !len.is_null() {
        if let Some(s) = ctx().table.get(fd) {
            if let Err(e) = s.usable(&ctx().env) {
                return fail(e);
            }
            let mut st = s.lock();
            if let Kind::Stream(x) = &mut st.kind {
                let e: c_int = x.take_error().unwrap_or(0);
                // SAFETY: the program's buffer; its size is checked.
                unsafe {
                    if (*len as usize) < std::mem::size_of::<c_int>() {
                        return fail(libc::EINVAL);
                    }
                    std::ptr::write_unaligned(val.cast::<c_int>(), e);
                    *len = std::mem::size_of::<c_int>() as socklen_t;
                }
                return 0;
            }
        }
    }
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { (real().getsockopt)(fd, level, name, val, len) };
    if r == 0 && level == libc::IPPROTO_TCP && name == libc::TCP_INFO {
        tcp_info_state(fd, val, len);
    }
    r
}

/// Linux's number for a listening socket (include/net/tcp_states.h).
const TCP_LISTEN: u8 = 10;

/// `TCP_INFO` of a ulnic connection or listener: the kernel filled in its
/// body's (an unconnected socket); `tcpi_state`, the first byte, becomes
/// the connection's own.
fn tcp_info_state(fd: c_int, val: *mut c_void, len: *mut socklen_t) {
    let Some(s) = ctx().table.get(fd) else {
        return;
    };
    if s.usable(&ctx().env).is_err() {
        return;
    }
    let state = match &s.lock().kind {
        Kind::Stream(x) => x.state().linux_tcp_state(),
        Kind::Listener(_) => TCP_LISTEN,
        _ => return,
    };
    // SAFETY: the kernel accepted the program's buffer and wrote `*len`
    // bytes of it; the state is its first.
    unsafe {
        if !val.is_null() && !len.is_null() && *len >= 1 {
            *val.cast::<u8>() = state;
        }
    }
}

/// Closes one name of an interposed socket (`close` and `dup2` onto it).
pub fn closing(fd: c_int) {
    let c = ctx();
    if let Some(s) = c.table.remove(fd) {
        trace!("close({fd})");
        close_name(c, fd, &s);
    } else {
        // It may have been an epoll set this layer knows: a set made
        // later under the same number must start empty.
        c.epolls.epoll_closed(fd);
    }
}
