//! Reference counts that survive `fork`: a socket inherited by a child is
//! open in both processes, and only the last `close` ends the connection
//! (as the kernel counts a TCP socket's descriptors).
//!
//! The counts live in one anonymous shared mapping made before any fork,
//! so parent and child see the same memory.

use std::sync::atomic::{AtomicU32, Ordering};

/// Counts the arena holds: sockets open at once, over every process
/// descended from the first that made one.
const SLOTS: usize = 16384;

/// The shared counts.
pub struct Arena {
    base: *const AtomicU32,
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
        let bytes = SLOTS * std::mem::size_of::<AtomicU32>();
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

    /// Claims a free count, set to 1.
    pub fn claim(&self) -> Option<usize> {
        (0..SLOTS).find(|&i| {
            self.slot(i)
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
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
