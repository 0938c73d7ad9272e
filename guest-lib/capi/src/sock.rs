//! Sockets over endpoints (docs/sockets.md): stream listeners and
//! connections, and datagram sockets, addressed by (node, port).
//!
//! Blocking calls take a timeout in milliseconds: `-1` waits for ever, `0`
//! does not wait (`-EAGAIN` when the call would block). A program that
//! waits for many sockets at once arms each (`ulnic_stream_arm`, ...) and
//! sleeps in poll or epoll on `ulnic_sock_notification_fd` beside its
//! other descriptors.

use std::ffi::c_void;
use std::io;
use std::time::{Duration, Instant};

use ulnic::sock::{Datagram, Listener, Net, Ready, Shutdown, SockAddr, Stream};

use crate::nic::put;
use crate::status::{handle, invalid, set_last};

/// A process's sockets: one protection domain on the NIC the environment
/// names (as `ulnic_open`). Thread-safe.
pub struct ulnic_sock_net {
    net: Net,
}

/// A stream listener on a port.
pub struct ulnic_listener {
    l: Listener,
}

/// A byte-stream connection.
pub struct ulnic_stream {
    s: Stream,
}

/// A datagram socket.
pub struct ulnic_dgram {
    d: Datagram,
}

/// A socket address: a node and a 16-bit port.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ulnic_sockaddr {
    /// The node.
    pub node: u32,
    /// The port.
    pub port: u16,
    /// Zero.
    pub reserved: u16,
}

impl From<SockAddr> for ulnic_sockaddr {
    fn from(a: SockAddr) -> Self {
        ulnic_sockaddr {
            node: a.node,
            port: a.port,
            reserved: 0,
        }
    }
}

impl From<ulnic_sockaddr> for SockAddr {
    fn from(a: ulnic_sockaddr) -> Self {
        SockAddr {
            node: a.node,
            port: a.port,
        }
    }
}

/// Readiness: a read (or accept) would not block (`POLLIN`).
pub const ULNIC_SOCK_READ: u32 = 0x1;
/// A write would not block (`POLLOUT`).
pub const ULNIC_SOCK_WRITE: u32 = 0x4;
/// An error is pending (`POLLERR`).
pub const ULNIC_SOCK_ERROR: u32 = 0x8;
/// Both directions are shut (`POLLHUP`).
pub const ULNIC_SOCK_HUP: u32 = 0x10;
/// The peer sent its end of stream (`POLLRDHUP`).
pub const ULNIC_SOCK_READ_HUP: u32 = 0x2000;

/// Runs `f`, turning an I/O error (or a panic) into `-errno` and the last
/// error's text.
fn guard_io(what: &str, f: impl FnOnce() -> io::Result<i64>) -> i64 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            let errno = match e.kind() {
                io::ErrorKind::WouldBlock => libc::EAGAIN,
                io::ErrorKind::TimedOut => libc::ETIMEDOUT,
                _ => e.raw_os_error().unwrap_or(libc::EIO),
            };
            set_last(&format!("{what}: {e}"));
            -i64::from(errno)
        }
        Err(_) => {
            set_last(&format!("{what}: internal error (a bug in libulnic)"));
            -i64::from(libc::EIO)
        }
    }
}

/// The deadline of a timeout in milliseconds (-1: none).
fn deadline(timeout_ms: i32) -> Option<Instant> {
    (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64))
}

/// Repeats `op` on `sock` until it does not say "would block", letting
/// `wait` sleep in between, until the timeout.
fn blocking<S, T>(
    sock: &mut S,
    timeout_ms: i32,
    mut op: impl FnMut(&mut S) -> io::Result<T>,
    mut wait: impl FnMut(&mut S, Option<Instant>) -> io::Result<bool>,
) -> io::Result<T> {
    let until = deadline(timeout_ms);
    loop {
        match op(sock) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        if timeout_ms == 0 || !wait(sock, until)? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
    }
}

fn slice<'a>(buf: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: the caller gives `len` readable bytes at `buf` (the header
    // says so), not written by anyone during the call.
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts(buf as *const u8, len) })
}

fn slice_mut<'a>(buf: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    // SAFETY: the caller gives `len` writable bytes at `buf`, used by no
    // one else during the call.
    (!buf.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) })
}

/// Opens this process's sockets on the NIC the environment names
/// (`ULNIC_SOCKET` on a host, `/dev/ulnic0` in a guest), with the
/// settings of `ULNIC_SOCK_CREDITS`, `ULNIC_SOCK_BUFFER` and
/// `ULNIC_SPIN_US`. Free with `ulnic_sock_close_net` after every socket.
///
/// ```c
/// struct ulnic_sock_net *net;
/// if (ulnic_sock_open(&net) < 0) { fprintf(stderr, "%s\n", ulnic_last_error()); return 1; }
/// printf("this is node %u\n", ulnic_sock_node(net));
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_sock_open(out: *mut *mut ulnic_sock_net) -> i32 {
    if out.is_null() {
        return invalid("ulnic_sock_open", "out is NULL");
    }
    crate::status::guard("ulnic_sock_open", || {
        let net = Net::open()?;
        put(out, Box::into_raw(Box::new(ulnic_sock_net { net })));
        Ok(0)
    })
}

/// Frees what `ulnic_sock_open` made (NULL is ignored). Close its
/// sockets first.
///
/// ```c
/// ulnic_sock_close_net(net);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_sock_close_net(net: *mut ulnic_sock_net) {
    if !net.is_null() {
        // SAFETY: made by ulnic_sock_open, freed once (the caller's word).
        drop(unsafe { Box::from_raw(net) });
    }
}

/// This process's node (0 for NULL).
///
/// ```c
/// uint32_t me = ulnic_sock_node(net);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_sock_node(net: *const ulnic_sock_net) -> u32 {
    // SAFETY: a handle from ulnic_sock_open, or NULL.
    unsafe { net.as_ref() }.map_or(0, |n| n.net.node())
}

/// The descriptor that becomes readable when an armed socket of `net`
/// has something: put it in a poll or epoll set, then call
/// `ulnic_sock_take_notified`. `-ENOTSUP` when the NIC has none.
///
/// ```c
/// struct pollfd p = { .fd = ulnic_sock_notification_fd(net), .events = POLLIN };
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_sock_notification_fd(net: *const ulnic_sock_net) -> i32 {
    // SAFETY: a handle from ulnic_sock_open, or NULL.
    let Some(n) = (unsafe { net.as_ref() }) else {
        return invalid("ulnic_sock_notification_fd", "net is NULL");
    };
    match n.net.notification_fd() {
        Some(fd) => fd,
        None => {
            set_last("ulnic_sock_notification_fd: this NIC has no notification descriptor");
            -libc::ENOTSUP
        }
    }
}

/// Clears the notification descriptor's readiness after a wake-up; then
/// look at each socket (`ulnic_stream_poll`, ...) and arm again those to
/// sleep on. Returns the number of endpoints that had notified.
///
/// ```c
/// ulnic_sock_take_notified(net);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_sock_take_notified(net: *const ulnic_sock_net) -> i32 {
    // SAFETY: a handle from ulnic_sock_open, or NULL.
    let Some(n) = (unsafe { net.as_ref() }) else {
        return invalid("ulnic_sock_take_notified", "net is NULL");
    };
    crate::status::guard("ulnic_sock_take_notified", || {
        Ok(n.net.take_notified()?.len() as i32)
    })
}

/// Listens on `port` for up to `backlog` waiting connections.
///
/// ```c
/// struct ulnic_listener *l;
/// int err = ulnic_listen(net, 7, 16, &l);   // -EADDRINUSE if taken
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_listen(
    net: *const ulnic_sock_net,
    port: u16,
    backlog: u32,
    out: *mut *mut ulnic_listener,
) -> i32 {
    // SAFETY: a handle from ulnic_sock_open, or NULL.
    let (Some(n), false) = (unsafe { net.as_ref() }, out.is_null()) else {
        return invalid("ulnic_listen", "net or out is NULL");
    };
    guard_io("ulnic_listen", || {
        let l = Listener::bind(&n.net, port, backlog)?;
        put(out, Box::into_raw(Box::new(ulnic_listener { l })));
        Ok(0)
    }) as i32
}

/// Takes the next connection, waiting up to `timeout_ms`; the peer's
/// address goes to `peer` unless NULL.
///
/// ```c
/// struct ulnic_stream *s;
/// struct ulnic_sockaddr from;
/// int err = ulnic_accept(l, -1, &s, &from);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_accept(
    l: *mut ulnic_listener,
    timeout_ms: i32,
    out: *mut *mut ulnic_stream,
    peer: *mut ulnic_sockaddr,
) -> i32 {
    let l = handle!(l, "ulnic_accept");
    if out.is_null() {
        return invalid("ulnic_accept", "out is NULL");
    }
    guard_io("ulnic_accept", || {
        let (s, from) = blocking(&mut l.l, timeout_ms, Listener::try_accept, Listener::wait)?;
        put(out, Box::into_raw(Box::new(ulnic_stream { s })));
        if !peer.is_null() {
            put(peer, from.into());
        }
        Ok(0)
    }) as i32
}

/// Arms the listener: 1 when a connection waits already (do not sleep),
/// 0 when the notification descriptor will wake for the next.
///
/// ```c
/// if (ulnic_listener_arm(l) == 0) poll(&p, 1, -1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_listener_arm(l: *mut ulnic_listener) -> i32 {
    let l = handle!(l, "ulnic_listener_arm");
    guard_io("ulnic_listener_arm", || Ok(i64::from(l.l.arm()?))) as i32
}

/// Stops listening; connections not yet accepted are refused. NULL is
/// ignored.
///
/// ```c
/// ulnic_listener_close(l);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_listener_close(l: *mut ulnic_listener) {
    if !l.is_null() {
        // SAFETY: made by ulnic_listen, freed once (the caller's word).
        drop(unsafe { Box::from_raw(l) });
    }
}

/// Connects to a listener (`-ECONNREFUSED` when nothing listens there,
/// `-EHOSTUNREACH`, `-ETIMEDOUT` after 30 s).
///
/// ```c
/// struct ulnic_sockaddr to = { .node = 1, .port = 7 };
/// struct ulnic_stream *s;
/// int err = ulnic_connect(net, to, &s);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_connect(
    net: *const ulnic_sock_net,
    to: ulnic_sockaddr,
    out: *mut *mut ulnic_stream,
) -> i32 {
    // SAFETY: a handle from ulnic_sock_open, or NULL.
    let (Some(n), false) = (unsafe { net.as_ref() }, out.is_null()) else {
        return invalid("ulnic_connect", "net or out is NULL");
    };
    if to.reserved != 0 {
        return invalid("ulnic_connect", "to.reserved is not zero");
    }
    guard_io("ulnic_connect", || {
        let s = Stream::connect(&n.net, to.into())?;
        put(out, Box::into_raw(Box::new(ulnic_stream { s })));
        Ok(0)
    }) as i32
}

/// Reads up to `len` bytes, waiting up to `timeout_ms` for the first:
/// the count, 0 at the end of the stream, `-ECONNRESET` when the peer
/// aborted or died, `-EAGAIN` when the time ran out.
///
/// ```c
/// char buf[4096];
/// int64_t n = ulnic_stream_read(s, buf, sizeof buf, -1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_read(
    s: *mut ulnic_stream,
    buf: *mut c_void,
    len: usize,
    timeout_ms: i32,
) -> i64 {
    let s = handle!(s, "ulnic_stream_read");
    let Some(b) = slice_mut(buf, len) else {
        return i64::from(invalid("ulnic_stream_read", "buf is NULL"));
    };
    guard_io("ulnic_stream_read", || {
        let n = blocking(
            &mut s.s,
            timeout_ms,
            |s| s.try_read(b, false),
            |s, until| s.wait(Ready::READ, until),
        )?;
        Ok(n as i64)
    })
}

/// Writes up to `len` bytes, waiting up to `timeout_ms` for room: the
/// count taken (perhaps fewer than `len`), `-EPIPE` after a shutdown or
/// the peer's end, `-ECONNRESET`, `-EAGAIN` when the time ran out.
///
/// ```c
/// int64_t n = ulnic_stream_write(s, "hello", 5, -1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_write(
    s: *mut ulnic_stream,
    buf: *const c_void,
    len: usize,
    timeout_ms: i32,
) -> i64 {
    let s = handle!(s, "ulnic_stream_write");
    let Some(b) = slice(buf, len) else {
        return i64::from(invalid("ulnic_stream_write", "buf is NULL"));
    };
    guard_io("ulnic_stream_write", || {
        let n = blocking(
            &mut s.s,
            timeout_ms,
            |s| s.try_write(b),
            |s, until| s.wait(Ready::WRITE, until),
        )?;
        Ok(n as i64)
    })
}

/// What the stream is ready for now: `ULNIC_SOCK_*` bits.
///
/// ```c
/// if (ulnic_stream_poll(s) & ULNIC_SOCK_READ) { ... }  // a read will not block
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_poll(s: *mut ulnic_stream) -> i32 {
    let s = handle!(s, "ulnic_stream_poll");
    s.s.poll().0 as i32
}

/// Arms the stream: 1 when something is there already (do not sleep), 0
/// when the notification descriptor will wake for what comes next.
///
/// ```c
/// if (ulnic_stream_arm(s) == 0) poll(&p, 1, -1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_arm(s: *mut ulnic_stream) -> i32 {
    let s = handle!(s, "ulnic_stream_arm");
    guard_io("ulnic_stream_arm", || Ok(i64::from(s.s.arm()?))) as i32
}

/// Shuts the reading (`SHUT_RD`), writing (`SHUT_WR`: the peer reads the
/// end once it has read the rest) or both (`SHUT_RDWR`) directions.
///
/// ```c
/// ulnic_stream_shutdown(s, SHUT_WR);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_shutdown(s: *mut ulnic_stream, how: i32) -> i32 {
    let s = handle!(s, "ulnic_stream_shutdown");
    let how = match how {
        libc::SHUT_RD => Shutdown::Read,
        libc::SHUT_WR => Shutdown::Write,
        libc::SHUT_RDWR => Shutdown::Both,
        _ => {
            return invalid(
                "ulnic_stream_shutdown",
                "how is not SHUT_RD, SHUT_WR or SHUT_RDWR",
            )
        }
    };
    guard_io("ulnic_stream_shutdown", || s.s.shutdown(how).map(|()| 0)) as i32
}

/// The stream's own and its peer's address.
///
/// ```c
/// struct ulnic_sockaddr me, peer;
/// ulnic_stream_addrs(s, &me, &peer);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_addrs(
    s: *mut ulnic_stream,
    local: *mut ulnic_sockaddr,
    peer: *mut ulnic_sockaddr,
) -> i32 {
    let s = handle!(s, "ulnic_stream_addrs");
    put(local, s.s.local_addr().into());
    put(peer, s.s.peer_addr().into());
    0
}

/// Closes in order: what was written still goes, then the end of the
/// stream (a reset instead when data was left unread). NULL is ignored.
///
/// ```c
/// ulnic_stream_close(s);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_close(s: *mut ulnic_stream) {
    if !s.is_null() {
        // SAFETY: made by ulnic_accept or ulnic_connect, freed once.
        drop(unsafe { Box::from_raw(s) });
    }
}

/// Closes by aborting: the peer's reads fail with `ECONNRESET` (as
/// `SO_LINGER` of 0). NULL is ignored.
///
/// ```c
/// ulnic_stream_abort(s);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_stream_abort(s: *mut ulnic_stream) {
    if !s.is_null() {
        // SAFETY: made by ulnic_accept or ulnic_connect, freed once.
        let s = unsafe { Box::from_raw(s) };
        s.s.abort();
    }
}

/// A datagram socket on `port` (0: a free one).
///
/// ```c
/// struct ulnic_dgram *d;
/// int err = ulnic_dgram_bind(net, 9, &d);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dgram_bind(
    net: *const ulnic_sock_net,
    port: u16,
    out: *mut *mut ulnic_dgram,
) -> i32 {
    // SAFETY: a handle from ulnic_sock_open, or NULL.
    let (Some(n), false) = (unsafe { net.as_ref() }, out.is_null()) else {
        return invalid("ulnic_dgram_bind", "net or out is NULL");
    };
    guard_io("ulnic_dgram_bind", || {
        let d = Datagram::bind(&n.net, (port != 0).then_some(port))?;
        put(out, Box::into_raw(Box::new(ulnic_dgram { d })));
        Ok(0)
    }) as i32
}

/// Sends one datagram of `len` bytes (at most 65,507) to `to`, waiting
/// up to `timeout_ms` for ring room: `len`, or `-EMSGSIZE`, `-EAGAIN`.
///
/// ```c
/// struct ulnic_sockaddr to = { .node = 1, .port = 9 };
/// ulnic_dgram_send_to(d, "ping", 4, to, -1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dgram_send_to(
    d: *mut ulnic_dgram,
    buf: *const c_void,
    len: usize,
    to: ulnic_sockaddr,
    timeout_ms: i32,
) -> i64 {
    let d = handle!(d, "ulnic_dgram_send_to");
    let Some(b) = slice(buf, len) else {
        return i64::from(invalid("ulnic_dgram_send_to", "buf is NULL"));
    };
    let to: SockAddr = to.into();
    guard_io("ulnic_dgram_send_to", || {
        let n = blocking(
            &mut d.d,
            timeout_ms,
            |d| d.try_send_to(b, to),
            |d, until| d.wait(Ready::WRITE, until),
        )?;
        Ok(n as i64)
    })
}

/// Receives the next datagram into `buf`, waiting up to `timeout_ms`:
/// its full length (more than `len` when it was truncated, as UDP's
/// MSG_TRUNC says), its sender in `from` unless NULL.
///
/// ```c
/// char buf[1500];
/// struct ulnic_sockaddr from;
/// int64_t n = ulnic_dgram_recv_from(d, buf, sizeof buf, &from, -1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dgram_recv_from(
    d: *mut ulnic_dgram,
    buf: *mut c_void,
    len: usize,
    from: *mut ulnic_sockaddr,
    timeout_ms: i32,
) -> i64 {
    let d = handle!(d, "ulnic_dgram_recv_from");
    let Some(b) = slice_mut(buf, len) else {
        return i64::from(invalid("ulnic_dgram_recv_from", "buf is NULL"));
    };
    guard_io("ulnic_dgram_recv_from", || {
        let (_, full, src) = blocking(
            &mut d.d,
            timeout_ms,
            |d| d.try_recv_from(b, false),
            |d, until| d.wait(Ready::READ, until),
        )?;
        if !from.is_null() {
            put(from, src.into());
        }
        Ok(full as i64)
    })
}

/// Closes a datagram socket (NULL is ignored).
///
/// ```c
/// ulnic_dgram_close(d);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dgram_close(d: *mut ulnic_dgram) {
    if !d.is_null() {
        // SAFETY: made by ulnic_dgram_bind, freed once.
        drop(unsafe { Box::from_raw(d) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_bits_are_the_poll_bits_the_library_uses() {
        assert_eq!(ULNIC_SOCK_READ, Ready::READ.0);
        assert_eq!(ULNIC_SOCK_WRITE, Ready::WRITE.0);
        assert_eq!(ULNIC_SOCK_ERROR, Ready::ERROR.0);
        assert_eq!(ULNIC_SOCK_HUP, Ready::HUP.0);
        assert_eq!(ULNIC_SOCK_READ_HUP, Ready::READ_HUP.0);
    }
}
