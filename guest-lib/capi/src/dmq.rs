//! Distributed message queues over RDMA and tripwires (CLAN): one sender
//! writes into the receiver's ring, nobody copies twice.

use std::ffi::c_void;

use ulnic::{DmqKind, DmqReceiver, DmqSender};

use crate::endpoint::{timeout_arg, ulnic_ep};
use crate::nic::put;
use crate::rdma::ulnic_cookie;
use crate::status::{guard, handle, invalid};

/// The receiving end of a queue. One thread at a time.
pub struct ulnic_dmq_receiver {
    q: DmqReceiver,
    /// A message taken that did not fit the caller's buffer, kept for the
    /// next call.
    held: Option<Vec<u8>>,
}

/// The sending end of a queue. One thread at a time.
pub struct ulnic_dmq_sender {
    q: DmqSender,
}

fn kind(entry: u32) -> DmqKind {
    if entry == 0 {
        DmqKind::Bytes
    } else {
        DmqKind::Fixed { entry }
    }
}

/// Takes the endpoint out of its handle: the queue owns it from now on
/// (do not destroy `ep` yourself).
fn take_ep(ep: *mut ulnic_ep) -> ulnic::Endpoint {
    // SAFETY: a live handle from this library, given up by the caller.
    unsafe { Box::from_raw(ep) }.ep
}

/// Makes a queue's receiving end in `ring` bytes at `offset` of `ep`'s
/// segment (plus a 64-byte header before it): `entry` 0 carries messages
/// of any length, else fixed entries of `entry` bytes. The queue takes
/// `ep` over, also when this fails (do not destroy it yourself). Send
/// `ulnic_dmq_receiver_cookie` to the sender.
///
/// ```c
/// struct ulnic_dmq_receiver *rx;
/// int err = ulnic_dmq_receiver_create(ep, 0, 1 << 16, 0, &rx);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_receiver_create(
    ep: *mut ulnic_ep,
    offset: u64,
    ring: u64,
    entry: u32,
    out: *mut *mut ulnic_dmq_receiver,
) -> i32 {
    if ep.is_null() || out.is_null() {
        return invalid("ulnic_dmq_receiver_create", "ep or out is NULL");
    }
    let ep = take_ep(ep);
    guard("ulnic_dmq_receiver_create", || {
        let q = DmqReceiver::new(ep, offset, ring, kind(entry))?;
        put(
            out,
            Box::into_raw(Box::new(ulnic_dmq_receiver { q, held: None })),
        );
        Ok(0)
    })
}

/// The receiver's cookie, for `ulnic_dmq_sender_create` on the sender.
///
/// ```c
/// struct ulnic_cookie c;
/// ulnic_dmq_receiver_cookie(rx, &c);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_receiver_cookie(
    rx: *mut ulnic_dmq_receiver,
    out: *mut ulnic_cookie,
) -> i32 {
    let r = handle!(rx, "ulnic_dmq_receiver_cookie");
    if !put(out, r.q.cookie().into()) {
        return invalid("ulnic_dmq_receiver_cookie", "out is NULL");
    }
    0
}

/// Tells the receiver its sender's cookie, so it can say how far it has
/// read (the sender waits for room on it).
///
/// ```c
/// ulnic_dmq_receiver_connect(rx, &sender_cookie);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_receiver_connect(
    rx: *mut ulnic_dmq_receiver,
    sender: *const ulnic_cookie,
) -> i32 {
    let r = handle!(rx, "ulnic_dmq_receiver_connect");
    // SAFETY: NULL or a cookie the caller holds.
    let Some(c) = (unsafe { sender.as_ref() }) else {
        return invalid("ulnic_dmq_receiver_connect", "sender is NULL");
    };
    r.q.connect((*c).into());
    0
}

/// Takes the next message into `buf` (`cap` bytes), waiting up to
/// `timeout_ms` (-1: forever; 0: a look): 1 with `*len` its length, 0 if
/// none came, `-EMSGSIZE` with `*len` the length needed when it does not
/// fit (it is kept for the next call).
///
/// ```c
/// char msg[4096]; size_t n;
/// if (ulnic_dmq_recv(rx, msg, sizeof msg, &n, 1000) == 1)
///     fwrite(msg, 1, n, stdout);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_recv(
    rx: *mut ulnic_dmq_receiver,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    timeout_ms: i32,
) -> i32 {
    let r = handle!(rx, "ulnic_dmq_recv");
    if len.is_null() || (cap > 0 && buf.is_null()) {
        return invalid("ulnic_dmq_recv", "len or buf is NULL");
    }
    let timeout = timeout_arg(timeout_ms);
    guard("ulnic_dmq_recv", || {
        let msg = match r.held.take() {
            Some(m) => m,
            None => {
                let mut m = Vec::new();
                let got = if timeout.is_zero() {
                    r.q.try_recv(&mut m)?
                } else {
                    r.q.recv(&mut m, timeout)?
                };
                if !got {
                    return Ok(0);
                }
                m
            }
        };
        put(len, msg.len());
        if msg.len() > cap {
            r.held = Some(msg);
            return Ok(-libc::EMSGSIZE);
        }
        // SAFETY: `cap` writable bytes at `buf`, and msg.len() <= cap.
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast(), msg.len()) };
        Ok(1)
    })
}

/// Frees the receiving end and its endpoint. NULL is ignored.
///
/// ```c
/// ulnic_dmq_receiver_free(rx);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_receiver_free(rx: *mut ulnic_dmq_receiver) {
    if !rx.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(rx) });
    }
}

/// Makes a queue's sending end towards `receiver` (its cookie), with a
/// mirror of the receiver's `ring` bytes at `offset` of `ep`'s segment
/// (plus a 64-byte header); `ring` and `entry` as the receiver's. The
/// queue takes `ep` over, also when this fails. Send
/// `ulnic_dmq_sender_cookie` to the receiver (`ulnic_dmq_receiver_connect`).
///
/// ```c
/// struct ulnic_dmq_sender *tx;
/// ulnic_dmq_sender_create(ep, 0, 1 << 16, &receiver_cookie, 0, &tx);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_sender_create(
    ep: *mut ulnic_ep,
    offset: u64,
    ring: u64,
    receiver: *const ulnic_cookie,
    entry: u32,
    out: *mut *mut ulnic_dmq_sender,
) -> i32 {
    if ep.is_null() || out.is_null() || receiver.is_null() {
        return invalid("ulnic_dmq_sender_create", "ep, receiver or out is NULL");
    }
    let ep = take_ep(ep);
    // SAFETY: non-null, a cookie the caller holds.
    let rx = unsafe { *receiver }.into();
    guard("ulnic_dmq_sender_create", || {
        let q = DmqSender::new(ep, offset, ring, rx, kind(entry))?;
        put(out, Box::into_raw(Box::new(ulnic_dmq_sender { q })));
        Ok(0)
    })
}

/// The sender's cookie, for `ulnic_dmq_receiver_connect`.
///
/// ```c
/// struct ulnic_cookie c;
/// ulnic_dmq_sender_cookie(tx, &c);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_sender_cookie(
    tx: *mut ulnic_dmq_sender,
    out: *mut ulnic_cookie,
) -> i32 {
    let s = handle!(tx, "ulnic_dmq_sender_cookie");
    if !put(out, s.q.cookie().into()) {
        return invalid("ulnic_dmq_sender_cookie", "out is NULL");
    }
    0
}

/// Sends `len` bytes, waiting up to `timeout_ms` (-1: forever) for room in
/// the receiver's ring: 0 when sent, `-EAGAIN` when there was no room in
/// time.
///
/// ```c
/// ulnic_dmq_send(tx, "hello", 5, -1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_send(
    tx: *mut ulnic_dmq_sender,
    data: *const c_void,
    len: usize,
    timeout_ms: i32,
) -> i32 {
    let s = handle!(tx, "ulnic_dmq_send");
    if len > 0 && data.is_null() {
        return invalid("ulnic_dmq_send", "data is NULL");
    }
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: `len` readable bytes at `data`.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
    };
    let t = timeout_arg(timeout_ms);
    guard("ulnic_dmq_send", || s.q.send(bytes, t).map(|_| 0))
}

/// Frees the sending end and its endpoint. NULL is ignored.
///
/// ```c
/// ulnic_dmq_sender_free(tx);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_dmq_sender_free(tx: *mut ulnic_dmq_sender) {
    if !tx.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(tx) });
    }
}
