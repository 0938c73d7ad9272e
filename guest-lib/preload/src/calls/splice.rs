//! The calls servers send files with, on ulnic streams: `sendfile` (and
//! `sendfile64`) from a file and `splice` to or from a pipe. The device
//! has no path from a file to a ring, so the layer copies through a
//! buffer of its own; what the program sees is the kernel's contract: the
//! count moved, the file offset or `*offset` advanced by exactly that,
//! and nothing taken from a pipe or a stream that was not passed on.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use libc::{loff_t, off_t, size_t, ssize_t};

use crate::calls::io::{movable, recv_on, send_on, Source};
use crate::context::{ctx, Ctx};
use crate::real::{errno, fail_size, real, trace};
use crate::sock::{Kind, Sock};

/// The most one step copies (one buffer; the call returns what it moved).
const STEP: usize = 1 << 16;

/// A ulnic stream (a connection, not a listener or datagram socket).
fn stream(c: &Ctx, fd: c_int) -> Option<Arc<Sock>> {
    movable(c, fd).filter(|s| matches!(s.lock().kind, Kind::Stream(_)))
}

/// `sendfile`.
#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    let c = ctx();
    if movable(c, in_fd).is_some() {
        // As the kernel: the source must be a file, not a socket.
        return fail_size(libc::EINVAL);
    }
    let Some(s) = stream(c, out_fd) else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { (real().sendfile)(out_fd, in_fd, offset, count) };
    };
    // From `*offset`, or from the file's position (which then moves).
    let start = if offset.is_null() {
        // SAFETY: plain system call.
        unsafe { libc::lseek(in_fd, 0, libc::SEEK_CUR) }
    } else {
        // SAFETY: the program's offset.
        unsafe { *offset }
    };
    if start < 0 {
        // A pipe or socket as the source: the layer could not give back
        // what the stream did not take, so it refuses as the kernel
        // did before Linux 5.12.
        return fail_size(if errno() == libc::ESPIPE {
            libc::EINVAL
        } else {
            errno()
        });
    }
    let mut buf = vec![0u8; count.min(STEP)];
    let mut done = 0usize;
    while done < count {
        let want = (count - done).min(buf.len());
        // SAFETY: `want` bytes of our buffer; plain system call.
        let n = unsafe {
            libc::pread(
                in_fd,
                buf.as_mut_ptr().cast::<c_void>(),
                want,
                start + done as off_t,
            )
        };
        if n < 0 {
            if done > 0 {
                break;
            }
            return -1;
        }
        if n == 0 {
            break; // end of file
        }
        let n = n as usize;
        let w = send_on(c, out_fd, &s, &buf[..n], 0, None);
        if w < 0 {
            if done > 0 {
                break;
            }
            return -1;
        }
        done += w as usize;
        if (w as usize) < n {
            break; // a non-blocking stream took part of it
        }
    }
    let end = start + done as off_t;
    if offset.is_null() {
        // SAFETY: plain system call.
        unsafe { libc::lseek(in_fd, end, libc::SEEK_SET) };
    } else {
        // SAFETY: the program's offset.
        unsafe { *offset = end };
    }
    trace!("sendfile({out_fd}, {in_fd}, {count} bytes from {start}): {done}");
    done as ssize_t
}

/// `sendfile64` (the same call where `off_t` is 64 bits).
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: as `sendfile`.
    unsafe { sendfile(out_fd, in_fd, offset, count) }
}

/// `splice`: between a pipe and a ulnic stream, either way.
#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut loff_t,
    fd_out: c_int,
    off_out: *mut loff_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    let c = ctx();
    let nonblock = flags & libc::SPLICE_F_NONBLOCK != 0;
    match (stream(c, fd_in), stream(c, fd_out)) {
        (None, Some(s)) if off_in.is_null() && off_out.is_null() => {
            pipe_to_stream(c, fd_in, fd_out, &s, len, nonblock)
        }
        (Some(s), None) if off_in.is_null() && off_out.is_null() => {
            stream_to_pipe(c, fd_in, &s, fd_out, len, nonblock)
        }
        // A socket has no offset.
        (Some(_), _) | (_, Some(_)) if !off_in.is_null() || !off_out.is_null() => {
            fail_size(libc::ESPIPE)
        }
        (Some(_), Some(_)) => fail_size(libc::EINVAL), // one end must be a pipe
        // SAFETY: the program's arguments, passed on.
        _ => unsafe { (real().splice)(fd_in, off_in, fd_out, off_out, len, flags) },
    }
}

/// Whether `fd` is a pipe (splice's other end must be one).
fn is_pipe(fd: c_int) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is ours to fill; plain system call.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstat filled it.
    let st = unsafe { st.assume_init() };
    st.st_mode & libc::S_IFMT == libc::S_IFIFO
}

/// From a pipe to a stream. What is read from the pipe cannot be put back,
/// so the stream is first asked whether it can take anything (a
/// non-blocking one that cannot is `EAGAIN` with the pipe untouched), and
/// what was read is then sent whole, waiting if it must.
fn pipe_to_stream(
    c: &Ctx,
    pipe: c_int,
    fd: c_int,
    s: &Arc<Sock>,
    len: size_t,
    nonblock: bool,
) -> ssize_t {
    if !is_pipe(pipe) {
        return fail_size(libc::EINVAL);
    }
    let stream_nonblock = s.lock().nonblock;
    if (nonblock || stream_nonblock) && !writable(c, fd, Some(std::time::Duration::ZERO)) {
        return fail_size(libc::EAGAIN);
    }
    if nonblock && !pipe_ready(pipe, libc::POLLIN) {
        return fail_size(libc::EAGAIN);
    }
    let mut buf = vec![0u8; len.min(STEP)];
    // SAFETY: our buffer; the program's pipe.
    let n = unsafe { (real().read)(pipe, buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return n;
    }
    let n = n as usize;
    let mut sent = 0;
    while sent < n {
        let w = send_on(c, fd, s, &buf[sent..n], 0, None);
        if w < 0 {
            if errno() == libc::EAGAIN {
                writable(c, fd, None);
                continue;
            }
            // The stream broke: what it did not take is lost with it,
            // as the kernel's socket loses it.
            return if sent > 0 { sent as ssize_t } else { -1 };
        }
        sent += w as usize;
    }
    trace!("splice({pipe} -> {fd}, {len}): {sent}");
    sent as ssize_t
}

/// From a stream to a pipe: the bytes are peeked, written to the pipe,
/// and only what the pipe took is then consumed from the stream.
fn stream_to_pipe(
    c: &Ctx,
    fd: c_int,
    s: &Arc<Sock>,
    pipe: c_int,
    len: size_t,
    nonblock: bool,
) -> ssize_t {
    if !is_pipe(pipe) {
        return fail_size(libc::EINVAL);
    }
    if nonblock && !pipe_ready(pipe, libc::POLLOUT) {
        return fail_size(libc::EAGAIN);
    }
    let mut buf = vec![0u8; len.min(STEP)];
    let peek = libc::MSG_PEEK | if nonblock { libc::MSG_DONTWAIT } else { 0 };
    let n = recv_on(c, fd, s, &mut buf, peek, &mut Source::none());
    if n <= 0 {
        return n; // end of stream, or the error
    }
    // SAFETY: our buffer; the program's pipe.
    let w = unsafe { (real().write)(pipe, buf.as_ptr().cast(), n as usize) };
    if w <= 0 {
        return w;
    }
    // The peeked bytes are still first in the stream: this takes exactly
    // them, without waiting.
    let taken = recv_on(c, fd, s, &mut buf[..w as usize], 0, &mut Source::none());
    trace!("splice({fd} -> {pipe}, {len}): {taken}");
    taken
}

/// Whether the stream `fd` can take a byte, waiting up to `wait` (`None`:
/// until it can, or has failed).
fn writable(c: &Ctx, fd: c_int, wait: Option<std::time::Duration>) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    }];
    crate::poll::poll_many(&c.env, &c.table, &mut p, wait, std::ptr::null()) > 0
}

/// Whether the pipe is ready for `events` (`POLLIN`: it has bytes or its
/// writers are gone; `POLLOUT`: it has room).
fn pipe_ready(pipe: c_int, events: libc::c_short) -> bool {
    let mut p = libc::pollfd {
        fd: pipe,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd of ours.
    unsafe { (real().poll)(&mut p, 1, 0) > 0 }
}
