//! Descriptors: `close`, `dup`, `dup2`, `dup3`, `fcntl` (and `fcntl64`),
//! `ioctl`. An interposed socket's kernel descriptor stays non-blocking;
//! `O_NONBLOCK` and `FIONBIO` change the program's view, which these
//! calls report.

use std::ffi::c_int;

use libc::c_ulong;

use crate::calls::socket::closing;
use crate::context::ctx;
use crate::real::{fail, real};
use crate::sock::Kind;

/// `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    closing(fd);
    // SAFETY: the program's argument, passed on.
    unsafe { (real().close)(fd) }
}

/// `new` names what `old` names (after a successful dup).
fn duplicated(old: c_int, new: c_int) {
    let c = ctx();
    if let Some(s) = c.table.get(old) {
        c.table.insert(new, s);
    }
}

/// `dup`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the program's argument, passed on.
    let n = unsafe { (real().dup)(fd) };
    if n >= 0 {
        duplicated(fd, n);
    }
    n
}

/// `dup2`: `new` is closed first (if it names an interposed socket, as a
/// name of it), then names what `old` names.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: the program's arguments, passed on.
    unsafe { dup3_impl(old, new, None) }
}

/// `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the program's arguments, passed on.
    unsafe { dup3_impl(old, new, Some(flags)) }
}

unsafe fn dup3_impl(old: c_int, new: c_int, flags: Option<c_int>) -> c_int {
    if old == new {
        // dup2 of a descriptor onto itself changes nothing; dup3 refuses.
        return match flags {
            // SAFETY: the program's arguments, passed on.
            None => unsafe { (real().dup2)(old, new) },
            Some(_) => fail(libc::EINVAL),
        };
    }
    // SAFETY: as above.
    let r = unsafe {
        match flags {
            None => (real().dup2)(old, new),
            Some(f) => (real().dup3)(old, new, f),
        }
    };
    if r >= 0 {
        closing(new);
        duplicated(old, new);
    }
    r
}

/// `fcntl`.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let c = ctx();
    let Some(s) = c.table.get(fd) else {
        // SAFETY: the program's arguments, passed on (the third argument
        // is passed in a register whatever its type, on x86_64).
        return unsafe { (real().fcntl)(fd, cmd, arg) };
    };
    match cmd {
        libc::F_GETFL => {
            // SAFETY: as above.
            let fl = unsafe { (real().fcntl)(fd, cmd, arg) };
            if fl < 0 {
                return fl;
            }
            let nb = if s.lock().nonblock {
                libc::O_NONBLOCK
            } else {
                0
            };
            (fl & !libc::O_NONBLOCK) | nb
        }
        libc::F_SETFL => {
            // SAFETY: as above; the kernel descriptor stays non-blocking.
            let r = unsafe { (real().fcntl)(fd, cmd, arg | libc::O_NONBLOCK as c_ulong) };
            if r == 0 {
                s.lock().nonblock = arg & libc::O_NONBLOCK as c_ulong != 0;
            }
            r
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: as above.
            let n = unsafe { (real().fcntl)(fd, cmd, arg) };
            if n >= 0 {
                duplicated(fd, n);
            }
            n
        }
        // SAFETY: as above.
        _ => unsafe { (real().fcntl)(fd, cmd, arg) },
    }
}

/// `fcntl64` (what glibc's headers call `fcntl` with 64-bit offsets).
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the same call.
    unsafe { fcntl(fd, cmd, arg) }
}

/// `ioctl`: `FIONBIO` sets the program's view of blocking; `FIONREAD` of
/// a ulnic connection counts its received bytes.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    let c = ctx();
    if let Some(s) = c.table.get(fd) {
        let p = arg as *mut c_int;
        match req {
            libc::FIONBIO if !p.is_null() => {
                // SAFETY: FIONBIO's argument is an int the program gives.
                s.lock().nonblock = unsafe { std::ptr::read_unaligned(p) } != 0;
                return 0;
            }
            libc::FIONREAD if !p.is_null() => {
                if let Err(e) = s.usable(&c.env) {
                    return fail(e);
                }
                let mut st = s.lock();
                if let Kind::Stream(x) = &mut st.kind {
                    let n = x.available().min(c_int::MAX as usize) as c_int;
                    // SAFETY: FIONREAD's argument is an int to fill.
                    unsafe { std::ptr::write_unaligned(p, n) };
                    return 0;
                }
            }
            _ => {}
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { (real().ioctl)(fd, req, arg) }
}
