//! Processes: `fork` (inherited sockets are open in both processes and
//! close when the last of them closes them; the child makes new sockets
//! in a protection domain of its own) and `execve`/`execvpe` (the layer
//! and its settings stay in the new program's environment).

use std::ffi::{c_char, c_int, CStr, CString};

use crate::context::ctx;
use crate::real::real;
use crate::sock::Kind;

/// `fork`.
#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    let c = ctx();
    let socks = c.table.all();
    let arena = c.env.arena.as_ref();
    // Counted before the child exists, so neither can close the last one
    // while the other still holds it. A listener in a guest is shared
    // instead of handed over: every process may accept on it (the
    // connections are each acceptor's own), as a pre-forking server's
    // workers do. Under host attach a child cannot make connections, so
    // a listener is handed over like any socket.
    let share_listeners = !crate::env::host_attached();
    for (_, s) in &socks {
        if let (Some(a), Some(i)) = (arena, s.slot) {
            a.add(i);
            let shared = share_listeners
                && match &mut s.lock().kind {
                    Kind::Listener(l) => l.share_across_fork().is_ok(),
                    _ => false,
                };
            if !shared {
                a.forking(i);
            }
        }
    }
    // SAFETY: the real fork.
    let pid = unsafe { (real().fork)() };
    if pid < 0 {
        for (_, s) in &socks {
            if let (Some(a), Some(i)) = (arena, s.slot) {
                a.release(i);
            }
        }
    } else if pid == 0 {
        c.env.forked();
    }
    pid
}

/// The variables the layer needs in a new program's environment.
const KEEP: [&str; 7] = [
    "LD_PRELOAD",
    "ULNIC_INET",
    "ULNIC_SOCKET",
    "ULNIC_DEVICE",
    "ULNIC_SOCK_CREDITS",
    "ULNIC_SOCK_BUFFER",
    "ULNIC_SPIN_US",
];

/// `envp` with the layer's variables from this process's environment
/// added where it lacks them (a program that builds its children's
/// environment would otherwise drop the layer).
fn with_layer(envp: *const *const c_char) -> Option<Vec<CString>> {
    let mut vars: Vec<CString> = Vec::new();
    let mut p = envp;
    // SAFETY: a NULL-terminated array of C strings from the program.
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            vars.push(CStr::from_ptr(*p).to_owned());
            p = p.add(1);
        }
    }
    let mut added = false;
    for name in KEEP {
        let present = vars.iter().any(|v| {
            let b = v.to_bytes();
            b.len() > name.len() && b.starts_with(name.as_bytes()) && b[name.len()] == b'='
        });
        if present {
            continue;
        }
        if let Some(val) = std::env::var_os(name) {
            let mut s = format!("{name}=").into_bytes();
            s.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(val.as_os_str()));
            if let Ok(c) = CString::new(s) {
                vars.push(c);
                added = true;
            }
        }
    }
    added.then_some(vars)
}

fn pointers(vars: &[CString]) -> Vec<*const c_char> {
    vars.iter()
        .map(|v| v.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Runs `exec` with `envp`, or with `envp` and the layer's variables
/// where it lacks them.
fn exec_with_layer(
    envp: *const *const c_char,
    exec: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    match with_layer(envp) {
        Some(vars) => exec(pointers(&vars).as_ptr()),
        None => exec(envp),
    }
}

/// `execve`.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the program's path and arguments; its environment or ours.
    exec_with_layer(envp, |env| unsafe { (real().execve)(path, argv, env) })
}

/// `execvpe`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: as `execve`.
    exec_with_layer(envp, |env| unsafe { (real().execvpe)(file, argv, env) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_without_the_layer_gets_it_back() {
        std::env::set_var("ULNIC_INET", "10.81.0.0/24");
        let bare = [CString::new("HOME=/tmp").unwrap()];
        let p = pointers(&bare);
        let out = with_layer(p.as_ptr()).expect("ULNIC_INET is added");
        assert!(out
            .iter()
            .any(|v| v.to_bytes() == b"ULNIC_INET=10.81.0.0/24"));
        assert!(out.iter().any(|v| v.to_bytes() == b"HOME=/tmp"));
        let full = pointers(&out);
        let again = with_layer(full.as_ptr());
        assert!(again.is_none(), "nothing to add the second time");
    }
}
