//! Reference counts that survive `fork`: a socket inherited by a child is
//! open in both processes, and only the last `close` ends the connection
//! (as the kernel counts a TCP socket's descriptors).
//!
//! Each count has an owner beside it. A socket nobody forked with has
//! none; at a fork it becomes unclaimed, and the first process to use it
//! afterwards owns it: the other may close its copy (which leaves the
//! connection to the owner) but not use it, since each process keeps its
//! own copy of the socket's state, which one of them would then make
//! wrong. The kernel lets two processes share a TCP socket; this layer
//! lets them hand one over.
//!
//! The counts live in one anonymous shared mapping made before any fork,
//! so parent and child see the same memory.

use std::sync::atomic::{AtomicU32, Ordering};

/// Counts the arena holds: sockets open at once, over every process
/// descended from the first that made one.
const SLOTS: usize = 16384;

/// The shared counts (and after them, their owners).
pub struct Arena {
    base: *const AtomicU32,
}

/// An owner word: never forked.
const NOBODY: u32 = 0;
/// An owner word: forked, not yet used since.
const UNCLAIMED: u32 = u32::MAX;

/// Whether a process may use a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Yes.
    Mine,
    /// No: another process (this pid) has used it since the fork.
    Theirs(u32),
}

/// This process's id, kept: `getpid` is a system call, and a socket
/// inherited across fork is checked on every call on it.
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn forgot_pid() {
    PID.store(0, Ordering::Relaxed);
}

/// This process's id (looked up once, and again in a forked child).
fn my_pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            static AT_FORK: std::sync::Once = std::sync::Once::new();
            // SAFETY: registers a handler that stores to an atomic, run in
            // the child of every fork.
            AT_FORK.call_once(|| unsafe {
                libc::pthread_atfork(None, None, Some(forgot_pid));
            });
            let me = std::process::id();
            PID.store(me, Ordering::Relaxed);
            me
        }
        me => me,
    }
}

// SAFETY: the mapping is never unmapped and holds only atomics.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// A fresh arena (`None` if the mapping cannot be made: then sockets
    /// are counted per process, and a forked child's close of an
    /// inherited one is taken as the last).
    pub fn new() -> Option<Arena> {
        let bytes = 2 * SLOTS * std::mem::size_of::<AtomicU32>();
        // SAFETY: a fresh shared anonymous mapping; nothing else refers
        // to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| Arena { base: p.cast() })
    }

    fn slot(&self, i: usize) -> &AtomicU32 {
        // SAFETY: `i < SLOTS` (callers), inside the mapping, which lives
        // for the rest of the process.
        unsafe { &*self.base.add(i) }
    }

    fn owner(&self, i: usize) -> &AtomicU32 {
        // SAFETY: as above; owners follow the counts.
        unsafe { &*self.base.add(SLOTS + i) }
    }

    /// Whether the calling process may use socket `i`, claiming it if
    /// it is unclaimed.
    pub fn claim_use(&self, i: usize) -> Use {
        let o = self.owner(i);
        let owner = o.load(Ordering::Acquire);
        if owner == NOBODY {
            return Use::Mine; // never forked: every call of an unforked program
        }
        let me = my_pid();
        match owner {
            x if x == me => Use::Mine,
            UNCLAIMED => {
                match o.compare_exchange(UNCLAIMED, me, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => Use::Mine,
                    Err(x) if x == me => Use::Mine,
                    Err(x) => Use::Theirs(x),
                }
            }
            x => Use::Theirs(x),
        }
    }

    /// Whether the calling process owns socket `i`: `None` when nobody
    /// does (never forked, or not used since the fork).
    pub fn owned_by_me(&self, i: usize) -> Option<bool> {
        match self.owner(i).load(Ordering::Acquire) {
            NOBODY | UNCLAIMED => None,
            x => Some(x == my_pid()),
        }
    }

    /// Socket `i` is being forked: whoever uses it next owns it.
    pub fn forking(&self, i: usize) {
        self.owner(i).store(UNCLAIMED, Ordering::Release);
    }

    /// Claims a free count, set to 1, owned by nobody.
    pub fn claim(&self) -> Option<usize> {
        let i = (0..SLOTS).find(|&i| {
            self.slot(i)
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        self.owner(i).store(NOBODY, Ordering::Release);
        Some(i)
    }

    /// One more holder (a fork).
    pub fn add(&self, i: usize) {
        self.slot(i).fetch_add(1, Ordering::AcqRel);
    }

    /// One holder fewer: true when it was the last.
    pub fn release(&self, i: usize) -> bool {
        self.slot(i).fetch_sub(1, Ordering::AcqRel) <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_shared_with_a_forked_child() {
        let a = Arena::new().unwrap();
        let i = a.claim().unwrap();
        let j = a.claim().unwrap();
        assert_ne!(i, j);
        a.add(i);
        // SAFETY: the child only touches the shared count and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let last = a.release(i);
            // SAFETY: leaving the child at once.
            unsafe { libc::_exit(if last { 1 } else { 0 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child's release was not the last"
        );
        assert!(a.release(i), "the parent's release is the last");
        assert!(a.release(j));
        assert_eq!(
            a.claim(),
            Some(i.min(j)),
            "released counts are claimed again"
        );
    }
}
