//! Moving bytes: `read`, `write`, `readv`, `writev`, `recv`, `send`,
//! `recvfrom`, `sendto`, `recvmsg`, `sendmsg`, and the fortified
//! `__read_chk`, `__recv_chk` and `__recvfrom_chk` that programs built
//! with `_FORTIFY_SOURCE` call instead.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use libc::{iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};
use ulnic::sock::{Ready, SockAddr};

use crate::config::{write_addr, Target};
use crate::context::{ctx, Ctx};
use crate::real::{fail_size, real, trace};
use crate::sock::{self, Kind, Sock};

/// The program's buffer as a slice.
fn buf_mut<'a>(p: *mut c_void, n: size_t) -> &'a mut [u8] {
    if n == 0 || p.is_null() {
        return &mut [];
    }
    // SAFETY: the program gives `n` writable bytes at `p`.
    unsafe { std::slice::from_raw_parts_mut(p.cast(), n) }
}

fn buf<'a>(p: *const c_void, n: size_t) -> &'a [u8] {
    if n == 0 || p.is_null() {
        return &[];
    }
    // SAFETY: the program gives `n` readable bytes at `p`.
    unsafe { std::slice::from_raw_parts(p.cast(), n) }
}

/// A kernel call's result as ours (`EAGAIN` keeps a wait going).
fn kernel_res(r: ssize_t) -> sock::Res<usize> {
    if r < 0 {
        Err(crate::real::errno())
    } else {
        Ok(r as usize)
    }
}

/// Sends SIGPIPE to this thread, as a write to a broken TCP connection
/// does (unless `MSG_NOSIGNAL`).
fn sigpipe() {
    // SAFETY: signals the calling thread.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
}

/// Where a datagram's source goes (NULL for none), and whether it did not
/// fit the buffer.
pub(crate) struct Source {
    addr: *mut sockaddr,
    len: *mut socklen_t,
    truncated: bool,
}

impl Source {
    pub(crate) fn none() -> Source {
        Source::at(std::ptr::null_mut(), std::ptr::null_mut())
    }

    fn at(addr: *mut sockaddr, len: *mut socklen_t) -> Source {
        Source {
            addr,
            len,
            truncated: false,
        }
    }
}

/// Receives into `out` from socket `s` (descriptor `fd`): the bytes (with
/// `MSG_TRUNC` on a datagram, its full length) and, for a datagram, its
/// source, written where `src` says.
pub(crate) fn recv_on(
    c: &Ctx,
    fd: c_int,
    s: &Arc<Sock>,
    out: &mut [u8],
    flags: c_int,
    src: &mut Source,
) -> ssize_t {
    let (addr, alen) = (src.addr, src.len);
    let peek = flags & libc::MSG_PEEK != 0;
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    let (timeout, is_stream) = {
        let st = s.lock();
        (st.rcvtimeo, matches!(st.kind, Kind::Stream(_)))
    };
    if is_stream {
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
        let mut got = 0;
        loop {
            let r = s.block(&c.env, fd, Ready::READ, dontwait, timeout, |st| {
                sock::stream_read(st, &mut out[got..], peek)
            });
            trace!("read({fd}, {} bytes): {r:?}", out.len() - got);
            match r {
                Ok(0) => return got as ssize_t,
                Ok(n) => {
                    got += n;
                    if !waitall || got == out.len() {
                        return got as ssize_t;
                    }
                }
                Err(_) if got > 0 => return got as ssize_t,
                Err(e) => return fail_size(e),
            }
        }
    }
    let inet = c.env.inet;
    let r = s.block(&c.env, fd, Ready::READ, dontwait, timeout, |st| {
        let family = st.family;
        let kernel = st.kernel_side_live();
        if let Kind::Datagram(d) = &mut st.kind {
            match d.try_recv_from(out, peek) {
                Ok((n, full, from)) => {
                    if let Some(inet) = inet {
                        // SAFETY: NULL or the program's buffer.
                        unsafe {
                            write_addr(family, inet.addr_of(from.node), from.port, addr, alen)
                        };
                    }
                    src.truncated = full > n;
                    return Ok(if flags & libc::MSG_TRUNC != 0 {
                        full
                    } else {
                        n
                    });
                }
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                    return Err(sock::errno_of(&e))
                }
                Err(_) => {}
            }
        }
        if !kernel {
            return Err(libc::EAGAIN);
        }
        // The kernel descriptor is non-blocking: a look, never a wait.
        // SAFETY: the program's buffer and address, passed on.
        let r = unsafe {
            (real().recvfrom)(
                fd,
                out.as_mut_ptr().cast(),
                out.len(),
                flags | libc::MSG_DONTWAIT,
                addr,
                alen,
            )
        };
        kernel_res(r)
    });
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail_size(e),
    }
}

/// Sends `data` on socket `s` (to `dest` for a datagram, when given).
pub(crate) fn send_on(
    c: &Ctx,
    fd: c_int,
    s: &Arc<Sock>,
    data: &[u8],
    flags: c_int,
    dest: Option<(*const sockaddr, socklen_t)>,
) -> ssize_t {
    if let Err(e) = s.usable(&c.env) {
        return fail_size(e);
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    let nosignal = flags & libc::MSG_NOSIGNAL != 0;
    let (timeout, is_stream, nonblock) = {
        let st = s.lock();
        (st.sndtimeo, matches!(st.kind, Kind::Stream(_)), st.nonblock)
    };
    if is_stream {
        let mut sent = 0;
        loop {
            let r = s.block(&c.env, fd, Ready::WRITE, dontwait, timeout, |st| {
                sock::stream_write(st, &data[sent..])
            });
            trace!("write({fd}, {} bytes): {r:?}", data.len() - sent);
            match r {
                Ok(n) => {
                    sent += n;
                    // A blocking socket takes everything, as TCP does.
                    if sent == data.len() || nonblock || dontwait {
                        return sent as ssize_t;
                    }
                }
                Err(_) if sent > 0 => return sent as ssize_t,
                Err(e) => {
                    if e == libc::EPIPE && !nosignal {
                        sigpipe();
                    }
                    return fail_size(e);
                }
            }
        }
    }
    // A datagram socket, or a fresh one: ulnic peers by ulnic, the rest
    // by the kernel.
    let target = match dest {
        // SAFETY: the program gives `len` bytes at `addr`.
        Some((a, l)) => unsafe { c.env.target(a, l) },
        None => Target::Kernel,
    };
    let connected = match &s.lock().kind {
        Kind::Datagram(d) => d.peer_addr(),
        _ => None,
    };
    let to = match (target, dest, connected) {
        (Target::Node(n, p), _, _) => Some(SockAddr { node: n, port: p }),
        (_, None, Some(peer)) => Some(peer),
        _ => None,
    };
    let net = to.and(c.env.net());
    let r = s.block(&c.env, fd, Ready::WRITE, dontwait, timeout, |st| {
        match (to, &net) {
            (Some(to), Some(net)) if st.dgram => {
                let d = st.datagram(net)?;
                d.try_send_to(data, to).map_err(|e| sock::errno_of(&e))
            }
            _ => {
                let (a, l) = dest.unwrap_or((std::ptr::null(), 0));
                // The kernel descriptor is non-blocking: never a wait here.
                // SAFETY: the program's data and address, passed on.
                kernel_res(unsafe {
                    (real().sendto)(
                        fd,
                        data.as_ptr().cast(),
                        data.len(),
                        flags | libc::MSG_DONTWAIT,
                        a,
                        l,
                    )
                })
            }
        }
    });
    trace!("send({fd}, {} bytes): {r:?}", data.len());
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            if e == libc::EPIPE && !nosignal {
                sigpipe();
            }
            fail_size(e)
        }
    }
}

/// An interposed socket that moves bytes itself (anything else — a
/// listener — is left to the kernel, which gives its usual errors).
pub(crate) fn movable(c: &Ctx, fd: c_int) -> Option<Arc<Sock>> {
    c.table
        .get(fd)
        .filter(|s| !matches!(s.lock().kind, Kind::Listener(_) | Kind::Kernel))
}

/// `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, b: *mut c_void, n: size_t) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => recv_on(c, fd, &s, buf_mut(b, n), 0, &mut Source::none()),
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().read)(fd, b, n) },
    }
}

/// `__read_chk`: `read` with the buffer's size known to the compiler.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: as `read`.
    unsafe { read(fd, b, n) }
}

/// `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => send_on(c, fd, &s, buf(b, n), 0, None),
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().write)(fd, b, n) },
    }
}

/// `recv`.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, b: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => recv_on(c, fd, &s, buf_mut(b, n), flags, &mut Source::none()),
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().recv)(fd, b, n, flags) },
    }
}

/// `__recv_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: as `recv`.
    unsafe { recv(fd, b, n, flags) }
}

/// `send`.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, b: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => send_on(c, fd, &s, buf(b, n), flags, None),
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().send)(fd, b, n, flags) },
    }
}

/// `recvfrom`.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => recv_on(c, fd, &s, buf_mut(b, n), flags, &mut Source::at(addr, alen)),
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().recvfrom)(fd, b, n, flags, addr, alen) },
    }
}

/// `__recvfrom_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: as `recvfrom`.
    unsafe { recvfrom(fd, b, n, flags, addr, alen) }
}

/// `sendto`.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    b: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => {
            let dest = (!addr.is_null()).then_some((addr, alen));
            send_on(c, fd, &s, buf(b, n), flags, dest)
        }
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().sendto)(fd, b, n, flags, addr, alen) },
    }
}

/// The program's iovecs.
fn iovecs<'a>(iov: *const iovec, n: c_int) -> &'a [iovec] {
    if iov.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: the program gives `n` iovecs at `iov`.
    unsafe { std::slice::from_raw_parts(iov, n as usize) }
}

/// Copies `data` out over `iov`.
fn scatter(data: &[u8], iov: &[iovec]) {
    let mut at = 0;
    for v in iov {
        let n = v.iov_len.min(data.len() - at);
        if n > 0 {
            // SAFETY: each iovec is `iov_len` writable bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(data[at..].as_ptr(), v.iov_base.cast::<u8>(), n)
            };
        }
        at += n;
        if at == data.len() {
            break;
        }
    }
}

fn gather(iov: &[iovec]) -> Vec<u8> {
    let mut out = Vec::with_capacity(iov.iter().map(|v| v.iov_len).sum());
    for v in iov {
        out.extend_from_slice(buf(v.iov_base, v.iov_len));
    }
    out
}

/// Receives into the iovecs of a message (`readv`, `recvmsg`).
fn recv_iov(
    c: &Ctx,
    fd: c_int,
    s: &Arc<Sock>,
    iov: &[iovec],
    flags: c_int,
    src: &mut Source,
) -> ssize_t {
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let mut tmp = vec![0u8; total.min(4 << 20)];
    let n = recv_on(c, fd, s, &mut tmp, flags, src);
    if n > 0 {
        scatter(&tmp[..(n as usize).min(tmp.len())], iov);
    }
    n
}

/// `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => recv_iov(c, fd, &s, iovecs(iov, n), 0, &mut Source::none()),
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().readv)(fd, iov, n) },
    }
}

/// `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let c = ctx();
    match movable(c, fd) {
        Some(s) => send_on(c, fd, &s, &gather(iovecs(iov, n)), 0, None),
        // SAFETY: the program's arguments, passed on.
        None => unsafe { (real().writev)(fd, iov, n) },
    }
}

/// `recvmsg` (no control data comes from a ulnic socket).
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let c = ctx();
    // SAFETY: NULL or the program's message.
    let (Some(s), Some(m)) = (movable(c, fd), unsafe { msg.as_mut() }) else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().recvmsg)(fd, msg, flags) };
    };
    let mut alen = m.msg_namelen;
    let mut src = Source::at(m.msg_name.cast(), &mut alen);
    let n = recv_iov(
        c,
        fd,
        &s,
        iovecs(m.msg_iov, m.msg_iovlen as c_int),
        flags,
        &mut src,
    );
    if n >= 0 {
        if !m.msg_name.is_null() {
            m.msg_namelen = alen;
        }
        m.msg_controllen = 0;
        m.msg_flags = if src.truncated { libc::MSG_TRUNC } else { 0 };
    }
    n
}

/// `sendmsg` (control data is not carried by ulnic sockets).
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let c = ctx();
    // SAFETY: NULL or the program's message.
    let (Some(s), Some(m)) = (movable(c, fd), unsafe { msg.as_ref() }) else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().sendmsg)(fd, msg, flags) };
    };
    let dest = (!m.msg_name.is_null()).then_some((m.msg_name as *const sockaddr, m.msg_namelen));
    send_on(
        c,
        fd,
        &s,
        &gather(iovecs(m.msg_iov, m.msg_iovlen as c_int)),
        flags,
        dest,
    )
}

/// What glibc's `__chk_fail` does: the program overflowed its buffer.
fn chk_fail() -> ! {
    crate::real::warn("buffer overflow detected");
    std::process::abort()
}
