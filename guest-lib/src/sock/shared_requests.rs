//! A listener's queued connection requests in memory that survives
//! `fork`, under a robust process-shared mutex, so that every process
//! forked from the one that listens can accept on it (a pre-forking
//! server's workers; docs/sockets.md §7). The listener's ring cursors need
//! no copy here: the endpoint publishes them in its control page, which
//! the processes share already (`Endpoint::resync_cursors`).

use std::collections::VecDeque;
use std::io;

use crate::sock::wire::Hello;
use crate::types::Address;

/// A queued request: who asks, its session id, its hello.
pub(crate) type Request = (Address, u32, Hello);

/// A listener's counts, kept beside its queue.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Requests refused because the backlog was full.
    pub refused: u64,
    /// Messages that were not requests.
    pub stray: u64,
    /// Requests queued so far (`Wakes::input`).
    pub arrivals: u64,
}

#[repr(C)]
struct Header {
    lock: libc::pthread_mutex_t,
    len: u32,
    _reserved: u32,
    counts: Counts,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Entry {
    node: u32,
    port: u32,
    session: u32,
    hello: Hello,
}

/// The shared queue (this process's mapping of it).
pub(crate) struct SharedRequests {
    base: *mut Header,
    cap: usize,
    bytes: usize,
}

// SAFETY: the mapping is only reached under its process-shared mutex (or,
// for the unmapping, by the one owner of this handle).
unsafe impl Send for SharedRequests {}
// SAFETY: as above.
unsafe impl Sync for SharedRequests {}

/// The queue, locked; unlocked when dropped.
pub(crate) struct Locked<'a> {
    q: &'a SharedRequests,
}

impl SharedRequests {
    /// Room for `cap` requests, in a fresh shared anonymous mapping.
    pub(crate) fn new(cap: usize) -> io::Result<SharedRequests> {
        let bytes = std::mem::size_of::<Header>() + cap * std::mem::size_of::<Entry>();
        // SAFETY: a fresh shared anonymous mapping; nothing else refers to it.
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
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let q = SharedRequests {
            base: p.cast(),
            cap,
            bytes,
        };
        // SAFETY: the mapping is ours and zeroed; the attributes live on
        // this stack for the initialisation only.
        let r = unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            let r = libc::pthread_mutex_init(&mut (*q.base).lock, &attr);
            libc::pthread_mutexattr_destroy(&mut attr);
            r
        };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(q)
    }

    /// Takes the lock. A holder that died with it (a worker killed
    /// mid-accept) leaves the queue as its last store did: taken over.
    pub(crate) fn lock(&self) -> Locked<'_> {
        // SAFETY: the mutex was initialised in `new` and lives as long as
        // the mapping.
        unsafe {
            let m = &mut (*self.base).lock;
            if libc::pthread_mutex_lock(m) == libc::EOWNERDEAD {
                libc::pthread_mutex_consistent(m);
            }
        }
        Locked { q: self }
    }
}

impl Locked<'_> {
    fn entries(&self) -> *mut Entry {
        // SAFETY: the entries follow the header inside the mapping.
        unsafe { self.q.base.add(1).cast() }
    }

    /// The shared queue and counts into the caller's.
    pub(crate) fn load(&self, queue: &mut VecDeque<Request>, counts: &mut Counts) {
        // SAFETY: under the lock; `len <= cap` (only `store` sets it).
        unsafe {
            let h = &*self.q.base;
            *counts = h.counts;
            queue.clear();
            for i in 0..(h.len as usize).min(self.q.cap) {
                let e = *self.entries().add(i);
                let from = Address {
                    node: e.node,
                    port: e.port,
                };
                queue.push_back((from, e.session, e.hello));
            }
        }
    }

    /// The caller's queue (its first `cap` requests) and counts back.
    pub(crate) fn store(&self, queue: &VecDeque<Request>, counts: Counts) {
        // SAFETY: under the lock; at most `cap` entries are written.
        unsafe {
            let h = &mut *self.q.base;
            h.counts = counts;
            let mut n = 0;
            for (from, session, hello) in queue.iter().take(self.q.cap) {
                *self.entries().add(n) = Entry {
                    node: from.node,
                    port: from.port,
                    session: *session,
                    hello: *hello,
                };
                n += 1;
            }
            h.len = n as u32;
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: this process holds the lock (taken in `lock`).
        unsafe { libc::pthread_mutex_unlock(&mut (*self.q.base).lock) };
    }
}

impl Drop for SharedRequests {
    fn drop(&mut self) {
        // SAFETY: this process's mapping, made in `new`; other processes
        // keep theirs.
        unsafe { libc::munmap(self.base.cast(), self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(port: u16) -> Hello {
        Hello::new(4, 4096, port)
    }

    #[test]
    fn a_forked_child_takes_what_the_parent_queued_and_the_parent_sees_it_gone() {
        let q = SharedRequests::new(8).unwrap();
        let mut mine: VecDeque<Request> = VecDeque::new();
        for i in 0..3u32 {
            mine.push_back((
                Address {
                    node: 1,
                    port: 100 + i,
                },
                i,
                hello(i as u16),
            ));
        }
        let counts = Counts {
            refused: 2,
            stray: 5,
            arrivals: 3,
        };
        q.lock().store(&mine, counts);
        // SAFETY: the child only uses the shared queue and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let (mut got, mut counts) = (VecDeque::new(), Counts::default());
            let l = q.lock();
            l.load(&mut got, &mut counts);
            let first = got.pop_front();
            counts.stray += 1;
            l.store(&got, counts);
            drop(l);
            let ok = first.is_some_and(|(a, s, _)| a.port == 100 && s == 0);
            // SAFETY: leaving the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child took the first request"
        );
        let mut counts = Counts::default();
        q.lock().load(&mut mine, &mut counts);
        let ports: Vec<u32> = mine.iter().map(|(a, _, _)| a.port).collect();
        assert_eq!(ports, [101, 102], "what the child took is gone here too");
        assert_eq!((counts.refused, counts.stray, counts.arrivals), (2, 6, 3));
    }

    #[test]
    fn a_holder_killed_with_the_lock_does_not_stop_the_others() {
        let q = SharedRequests::new(2).unwrap();
        // SAFETY: the child takes the lock and dies holding it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            std::mem::forget(q.lock());
            // SAFETY: leaving with the lock held.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let (mut got, mut counts) = (VecDeque::new(), Counts::default());
        q.lock().load(&mut got, &mut counts);
        assert!(got.is_empty());
        // And again: the lock was made consistent and released.
        drop(q.lock());
    }
}
