//! The process's interposition state, made at the first interposed call,
//! and what the calls share: finding a descriptor's socket, handing a
//! socket to the kernel, closing one, warnings.

use std::ffi::c_int;
use std::sync::{Arc, OnceLock};

use crate::env::Env;
use crate::epoll::Registry;
use crate::real::real;
use crate::sock::{self, Kind, Sock};
use crate::table::Table;

/// Everything the interposed calls share.
pub struct Ctx {
    /// Addresses, the socket context, counts across fork.
    pub env: Env,
    /// Interposed descriptors.
    pub table: Table,
    /// Epoll sets with interposed sockets.
    pub epolls: Registry,
}

/// The state (made at the first call). Nothing here calls an interposed
/// function while it is being made.
pub fn ctx() -> &'static Ctx {
    static CTX: OnceLock<Ctx> = OnceLock::new();
    CTX.get_or_init(|| {
        // SAFETY: registers a plain function to run at exit().
        unsafe { libc::atexit(at_exit) };
        Ctx {
            env: Env::new(),
            table: Table::default(),
            epolls: Registry::default(),
        }
    })
}

/// At `exit`, every socket still open is closed as the kernel closes a
/// TCP socket of an exiting process: what was written is sent (the
/// device takes it, the send buffer drains), then the FIN. Without this,
/// bytes a program wrote just before it exited would go with its
/// endpoints. (`_exit` and signals skip it: the device's close messages
/// then reset the peers.)
extern "C" fn at_exit() {
    let c = ctx();
    for (fd, s) in c.table.all_fds() {
        c.table.remove(fd);
        close_name(c, fd, &s);
    }
    if std::env::var_os("ULNIC_STATS").is_some_and(|v| v != "0") {
        report_wakes();
    }
}

/// With `ULNIC_STATS=1`: how this process's waits ended (docs/sockets.md
/// §6), one line on standard error, for tests and users to check that no
/// wake-up was found by timer.
pub fn report_wakes() {
    // `ULNIC_STATS=/a/file` appends there; otherwise standard error,
    // through the real write (the program's `write` is interposed).
    if let Some(line) = ulnic::sock::wake_report("libulnic_preload") {
        // SAFETY: writes a buffer we own to stderr.
        unsafe { (real().write)(2, line.as_ptr().cast(), line.len()) };
    }
}

/// Makes the kernel descriptor non-blocking (the program's own view is
/// kept in the socket's state).
pub fn kernel_nonblocking(fd: c_int, on: bool) {
    // SAFETY: plain fcntl on a descriptor the program owns.
    unsafe {
        let fl = (real().fcntl)(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let want = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            (real().fcntl)(fd, libc::F_SETFL, want as libc::c_ulong);
        }
    }
}

/// The socket goes to the kernel for good: every descriptor naming it
/// stops being interposed, its blocking mode and epoll registrations
/// become the program's own again, and any ulnic side it had is closed.
pub fn handover(c: &Ctx, sock: &Arc<Sock>) {
    let fds: Vec<c_int> = c
        .table
        .all_fds()
        .into_iter()
        .filter(|(_, s)| Arc::ptr_eq(s, sock))
        .map(|(fd, _)| fd)
        .collect();
    {
        let mut st = sock.lock();
        for &fd in &fds {
            kernel_nonblocking(fd, st.nonblock);
        }
        sock::restore_kernel_regs(&mut st);
        st.regs.clear();
        sock::finish(&mut st);
        st.kind = Kind::Kernel;
    }
    c.epolls.forget(sock);
    for fd in fds {
        c.table.remove(fd);
    }
    if let (Some(a), Some(i)) = (&c.env.arena, sock.slot) {
        a.release(i);
    }
}

/// `fd`, one name of `sock`, is being closed: the last name in the last
/// process that holds the socket closes it (in order, or with a reset).
pub fn close_name(c: &Ctx, fd: c_int, sock: &Arc<Sock>) {
    c.epolls.closed(fd, sock);
    if c.table.names(sock) > 0 {
        return; // another descriptor of this process still names it
    }
    // The owner's close ends the connection (the others cannot use it);
    // with no owner, the last close does; another's copy is only dropped.
    let end = match (&c.env.arena, sock.slot) {
        (Some(a), Some(i)) => {
            let last = a.release(i);
            a.owned_by_me(i).unwrap_or(last)
        }
        _ => true,
    };
    let mut st = sock.lock();
    if end {
        sock::finish(&mut st);
    } else {
        sock::forget(&mut st);
    }
}
