//! CLAN's event queue as one object (spec §6.1): sources attached to it
//! report their activity with a cookie, and blocking calls on a source
//! (`ulnic_ep_wait`, `ulnic_ep_wait_tripwire`) sleep on the queue too.

use std::collections::VecDeque;

use ulnic::EventQueue;

use crate::endpoint::{timeout_arg, ulnic_ep};
use crate::nic::{put, ulnic_pd};
use crate::status::{guard, handle, invalid};

/// An event queue (`ulnic_evq_create`). Its calls are made by one thread
/// at a time; other threads may block on its sources meanwhile.
pub struct ulnic_evq {
    q: EventQueue,
    /// Cookies taken from the queue that did not fit a caller's array.
    pending: VecDeque<u64>,
}

/// Creates an event queue in `pd`. Free it with `ulnic_evq_destroy` (after
/// its sources, or they keep it alive until they are destroyed).
///
/// ```c
/// struct ulnic_evq *evq;
/// int err = ulnic_evq_create(pd, &evq);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_evq_create(pd: *mut ulnic_pd, out: *mut *mut ulnic_evq) -> i32 {
    let p = handle!(pd, "ulnic_evq_create");
    if out.is_null() {
        return invalid("ulnic_evq_create", "out is NULL");
    }
    guard("ulnic_evq_create", || {
        let q = EventQueue::new(&p.pd)?;
        let h = Box::new(ulnic_evq {
            q,
            pending: VecDeque::new(),
        });
        put(out, Box::into_raw(h));
        Ok(0)
    })
}

/// Frees an event queue handle; NULL is ignored.
///
/// ```c
/// ulnic_evq_destroy(evq);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_evq_destroy(evq: *mut ulnic_evq) {
    if !evq.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(evq) });
    }
}

/// Attaches `ep` (an endpoint of the queue's domain) with `cookie` and
/// arms it: its next message or event reports `cookie` to the queue, and
/// a `ulnic_ep_wait` on it sleeps on the queue. `-EINVAL` for an endpoint
/// of another domain or one that is a queue; `-ENOSPC` when the queue is
/// full of sources.
///
/// ```c
/// ulnic_evq_attach(evq, ep, 3);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_evq_attach(
    evq: *mut ulnic_evq,
    ep: *mut ulnic_ep,
    cookie: u64,
) -> i32 {
    let q = handle!(evq, "ulnic_evq_attach");
    let e = handle!(ep, "ulnic_evq_attach");
    guard("ulnic_evq_attach", || {
        q.q.attach(&mut e.ep, cookie).map(|_| 0)
    })
}

/// Detaches `ep` from the queue: it is notified itself again. `-EINVAL`
/// if it is not attached to this queue.
///
/// ```c
/// ulnic_evq_detach(evq, ep);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_evq_detach(evq: *mut ulnic_evq, ep: *mut ulnic_ep) -> i32 {
    let q = handle!(evq, "ulnic_evq_detach");
    let e = handle!(ep, "ulnic_evq_detach");
    guard("ulnic_evq_detach", || q.q.detach(&mut e.ep).map(|_| 0))
}

/// Stores in `cookies` (room for `max`) the cookies of sources that
/// reported, in the order they came, once each: how many; waits up to
/// `timeout_ms` (-1: forever) when none has. A source some thread is
/// blocked on (`ulnic_ep_wait`) is that thread's, not reported here.
/// Serve each source, then arm it again (`ulnic_ep_arm`). A zero timeout
/// also arms the queue, for a program that sleeps on `ulnic_evq_fd`.
///
/// ```c
/// uint64_t ready[16];
/// int n = ulnic_evq_wait(evq, ready, 16, 1000);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_evq_wait(
    evq: *mut ulnic_evq,
    cookies: *mut u64,
    max: usize,
    timeout_ms: i32,
) -> i32 {
    let q = handle!(evq, "ulnic_evq_wait");
    if cookies.is_null() || max == 0 {
        return invalid("ulnic_evq_wait", "cookies is NULL or max is 0");
    }
    let timeout = timeout_arg(timeout_ms);
    guard("ulnic_evq_wait", || {
        if q.pending.is_empty() {
            q.pending.extend(q.q.wait(timeout)?);
        }
        let n = q.pending.len().min(max).min(i32::MAX as usize);
        for (i, c) in q.pending.drain(..n).enumerate() {
            // SAFETY: the caller gives room for `max` cookies; i < max.
            unsafe { cookies.add(i).write(c) };
        }
        Ok(n as i32)
    })
}

/// The descriptor that becomes readable when the queue is notified (for
/// `poll`, `select`, `epoll`), or a negative errno. Call `ulnic_evq_wait`
/// with a zero timeout before sleeping on it, and after it wakes.
///
/// ```c
/// int fd = ulnic_evq_fd(evq);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_evq_fd(evq: *const ulnic_evq) -> i32 {
    // SAFETY: a live handle or NULL.
    match unsafe { evq.as_ref() } {
        Some(q) => {
            q.q.notification_fd()
                .unwrap_or_else(|| invalid("ulnic_evq_fd", "this NIC has no pollable descriptor"))
        }
        None => invalid("ulnic_evq_fd", "evq is NULL"),
    }
}
