//! The C library's own functions behind the ones this library interposes
//! (found with `dlsym(RTLD_NEXT)`), and errno.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use libc::{nfds_t, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec};

macro_rules! reals {
    ($( $name:ident : fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// Every interposed function's real one.
        #[allow(missing_docs)]
        pub struct Real {
            $( pub $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        fn resolve() -> Real {
            Real {
                $( $name: {
                    let name = concat!(stringify!($name), "\0");
                    // SAFETY: a NUL-terminated name; RTLD_NEXT is the next
                    // object after this one in lookup order (the C library).
                    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
                    if p.is_null() {
                        missing(name)
                    } else {
                        // SAFETY: the C library's function of this name has
                        // this signature (glibc's, x86_64).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                    }
                }, )*
            }
        }
    };
}

reals! {
    socket: fn(c_int, c_int, c_int) -> c_int;
    bind: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    listen: fn(c_int, c_int) -> c_int;
    accept4: fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    connect: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    shutdown: fn(c_int, c_int) -> c_int;
    getsockname: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    getpeername: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    setsockopt: fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    getsockopt: fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    read: fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: fn(c_int, *const c_void, size_t) -> ssize_t;
    readv: fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    writev: fn(c_int, *const libc::iovec, c_int) -> ssize_t;
    send: fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
    recv: fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
    sendto: fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
    recvfrom: fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    sendmsg: fn(c_int, *const libc::msghdr, c_int) -> ssize_t;
    recvmsg: fn(c_int, *mut libc::msghdr, c_int) -> ssize_t;
    close: fn(c_int) -> c_int;
    dup: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    fcntl: fn(c_int, c_int, libc::c_ulong) -> c_int;
    ioctl: fn(c_int, libc::c_ulong, libc::c_ulong) -> c_int;
    poll: fn(*mut pollfd, nfds_t, c_int) -> c_int;
    ppoll: fn(*mut pollfd, nfds_t, *const timespec, *const sigset_t) -> c_int;
    select: fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *mut libc::timeval) -> c_int;
    pselect: fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *const timespec, *const sigset_t) -> c_int;
    epoll_ctl: fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
    epoll_pwait: fn(c_int, *mut libc::epoll_event, c_int, c_int, *const sigset_t) -> c_int;
    epoll_pwait2: fn(c_int, *mut libc::epoll_event, c_int, *const timespec, *const sigset_t) -> c_int;
    sendfile: fn(c_int, c_int, *mut libc::off_t, size_t) -> ssize_t;
    splice: fn(c_int, *mut libc::loff_t, c_int, *mut libc::loff_t, size_t, libc::c_uint) -> ssize_t;
    fork: fn() -> libc::pid_t;
    execve: fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> c_int;
    execvpe: fn(*const libc::c_char, *const *const libc::c_char, *const *const libc::c_char) -> c_int;
}

/// A function the C library lacks: this library cannot stand in for it,
/// so the program must not go on thinking it called it.
fn missing(name: &str) -> ! {
    let msg = format!(
        "libulnic_preload: the C library has no {}; unload the layer\n",
        name.trim_end_matches('\0')
    );
    // SAFETY: writes a buffer we own to stderr.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort()
}

/// The real functions (resolved at the first call).
pub fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(resolve)
}

/// This thread's errno.
pub fn errno() -> c_int {
    // SAFETY: glibc's per-thread errno location.
    unsafe { *libc::__errno_location() }
}

/// Sets errno to `e` and returns -1, as a failed call does.
pub fn fail(e: c_int) -> c_int {
    // SAFETY: glibc's per-thread errno location.
    unsafe { *libc::__errno_location() = e };
    -1
}

/// As `fail`, for calls that return a size.
pub fn fail_size(e: c_int) -> ssize_t {
    fail(e) as ssize_t
}

/// Writes one line to stderr (no logger: its writes would come back
/// through the interposed `write`).
pub fn warn(msg: &str) {
    let line = format!("libulnic_preload: {msg}\n");
    // SAFETY: writes a buffer we own to stderr.
    unsafe { (real().write)(2, line.as_ptr().cast(), line.len()) };
}

/// Whether `ULNIC_TRACE` asks for a line per call on an interposed socket.
pub fn tracing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ULNIC_TRACE").is_some_and(|v| v != "0"))
}

/// Writes a trace line when `ULNIC_TRACE` is set.
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::real::tracing() {
            $crate::real::warn(&format!("[{}] {}", std::process::id(), format_args!($($arg)*)));
        }
    };
}
pub(crate) use trace;
