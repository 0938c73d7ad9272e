//! Endpoints: rings and a segment shared with the device; messages,
//! events and blocking.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use ulnic::{Address, Endpoint, EndpointConfig, Event, FilterEntry, Payload, RedirectOutcome};

use crate::nic::{put, ulnic_buffer, ulnic_pd};
use crate::status::{guard, handle, invalid};

/// An endpoint (U-Net): send, receive, free and event rings and a segment.
/// One thread at a time.
pub struct ulnic_ep {
    pub(crate) ep: Endpoint,
}

/// A node and port: where messages go and come from.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ulnic_address {
    /// Node number (one vhost-user socket of a device).
    pub node: u32,
    /// Port number an endpoint is bound to on that node.
    pub port: u32,
}

impl From<ulnic_address> for Address {
    fn from(a: ulnic_address) -> Address {
        Address {
            node: a.node,
            port: a.port,
        }
    }
}

impl From<Address> for ulnic_address {
    fn from(a: Address) -> ulnic_address {
        ulnic_address {
            node: a.node,
            port: a.port,
        }
    }
}

/// Sizes of a new endpoint (`ulnic_ep_config_default` fills it).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ulnic_ep_config {
    /// Send ring entries (a power of two).
    pub send_entries: u32,
    /// Receive ring entries (a power of two).
    pub recv_entries: u32,
    /// Free ring entries (a power of two).
    pub free_entries: u32,
    /// Must be 0.
    pub reserved: u32,
    /// Segment bytes (rounded up to pages).
    pub segment_bytes: u64,
}

/// An accept filter entry (`ulnic_ep_set_filter`); `ULNIC_ANY` matches any
/// node or port, and the tag matches when `tag & tag_mask` agree.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ulnic_filter {
    /// Source node, or `ULNIC_ANY`.
    pub node: u32,
    /// Source port, or `ULNIC_ANY`.
    pub port: u32,
    /// Tag value.
    pub tag: u32,
    /// Tag bits compared.
    pub tag_mask: u32,
}

/// Matches any node or port in a filter.
pub const ULNIC_ANY: u32 = u32::MAX;
/// Bytes a message may carry inline in its descriptor.
pub const ULNIC_INLINE_MAX: u32 = 96;
// cbindgen needs the literal; the contract decides the value.
const _: () = assert!(ULNIC_INLINE_MAX == ulnic_abi::INLINE_MAX);
const _: () = assert!(ULNIC_ANY == ulnic_abi::ANY);
/// Ask for a `ULNIC_EVENT_SEND_DONE` when the send or RDMA is done.
pub const ULNIC_COMPLETION: u32 = 1;

/// `ulnic_recv.flags`: the payload is in `data`.
pub const ULNIC_RECV_INLINE: u32 = 1;
/// `ulnic_recv.flags`: a close message (the sender's endpoint is gone).
pub const ULNIC_RECV_CLOSE: u32 = 2;
/// `ulnic_recv.flags`: one of this endpoint's own messages, handed back by
/// the fabric (`src` is where it was going).
pub const ULNIC_RECV_RETURNED: u32 = 4;

/// A received message (`ulnic_ep_poll_recv`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ulnic_recv {
    /// Who sent it, as the device stamped it.
    pub src: ulnic_address,
    /// The sender's tag.
    pub tag: u32,
    /// Payload bytes.
    pub len: u32,
    /// `ULNIC_RECV_*` bits.
    pub flags: u32,
    /// The sending endpoint's session id (a port's next holder has
    /// another; `ulnic_ep_session`).
    pub session: u32,
    /// Not inline: the segment offset of the free buffer that holds it.
    pub buffer_offset: u64,
    /// Not inline: the id that buffer was posted with.
    pub buffer_id: u64,
    /// Inline: the payload (`len` bytes).
    pub data: [u8; ULNIC_INLINE_MAX as usize],
}

/// `ulnic_event.kind`: a send or RDMA posted with `ULNIC_COMPLETION` is
/// done (`id`).
pub const ULNIC_EVENT_SEND_DONE: u32 = 1;
/// `ulnic_event.kind`: a send or RDMA failed (`id`, `addr` its
/// destination, `len`, `code` the reason, `error` as an errno).
pub const ULNIC_EVENT_SEND_FAILED: u32 = 2;
/// `ulnic_event.kind`: a condition (`code`: 0 ring index, 1 bad free
/// descriptor, 2 a message dropped for want of a buffer).
pub const ULNIC_EVENT_CONDITION: u32 = 3;
/// `ulnic_event.kind`: a tripwire fired (`tripwire`, `id` its user
/// value, `addr` who accessed, `len` bytes inside, `code` 1 for a read).
pub const ULNIC_EVENT_TRIPWIRE: u32 = 4;
/// `ulnic_event.kind`: a redirection ended (`id`, `code` 0 full,
/// 1 partial, 2 none, 3 refused; `start`, `bytes`; `addr` the last writer).
pub const ULNIC_EVENT_REDIRECTED: u32 = 5;
/// `ulnic_event.kind`: an out-of-band message (`ulnic_ep_post_oob`): `id`
/// holds its bytes (byte i in bits 8i), `len` their count, `code` the tag,
/// `addr` the sender, `session` its session.
pub const ULNIC_EVENT_OOB: u32 = 6;
/// `ulnic_event.kind`: the fabric gave up on node `addr.node`; sends and
/// RDMA to it fail with `EHOSTUNREACH`.
pub const ULNIC_EVENT_UNREACHABLE: u32 = 7;
/// `ulnic_event.kind`, on an event queue (`ulnic_ep_set_event_queue`):
/// one of its sources had something; `id` is the source's cookie, `code`
/// its endpoint id. Serve that source, then arm it again.
pub const ULNIC_EVENT_QUEUED: u32 = 8;
/// `ulnic_event.kind`: a PIO window this endpoint imported was revoked
/// (docs/spec.md §6.2): `code` is the import, `id` the window's key,
/// `addr.node` the exporter's node. Its memory is gone (a store faults).
pub const ULNIC_EVENT_PIO_REVOKED: u32 = 9;
/// `ulnic_event.kind`: an event this library does not know.
pub const ULNIC_EVENT_UNKNOWN: u32 = 255;

/// An event (`ulnic_ep_poll_event`); which fields mean something depends
/// on `kind` (see the `ULNIC_EVENT_*` kinds).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ulnic_event {
    /// `ULNIC_EVENT_*`.
    pub kind: u32,
    /// Per kind: the device's reason code, condition, outcome or read flag.
    pub code: u32,
    /// The send's or redirection's id, or a tripwire's user value.
    pub id: u64,
    /// The destination of a send, or who accessed memory.
    pub addr: ulnic_address,
    /// Bytes concerned.
    pub len: u32,
    /// The tripwire that fired.
    pub tripwire: u32,
    /// A redirection's first redirected byte, from its start.
    pub start: u64,
    /// Bytes redirected.
    pub bytes: u64,
    /// A failed send's reason as a positive errno (ECONNREFUSED,
    /// ENOBUFS, EHOSTUNREACH, ...).
    pub error: i32,
    /// An out-of-band message's sender's session id (else 0).
    pub session: u32,
}

/// Fills `cfg` with the default endpoint sizes (256 sends, 512 receives,
/// 256 free buffers, a 4 MiB segment).
///
/// ```c
/// struct ulnic_ep_config cfg;
/// ulnic_ep_config_default(&cfg);
/// cfg.segment_bytes = 1 << 20;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_config_default(cfg: *mut ulnic_ep_config) {
    let d = EndpointConfig::default();
    put(
        cfg,
        ulnic_ep_config {
            send_entries: d.send_entries,
            recv_entries: d.recv_entries,
            free_entries: d.free_entries,
            reserved: 0,
            segment_bytes: d.segment_bytes as u64,
        },
    );
}

/// Creates an endpoint in `pd`; `cfg` NULL takes the defaults. Free it
/// with `ulnic_ep_destroy`.
///
/// ```c
/// struct ulnic_ep *ep;
/// int err = ulnic_ep_create(pd, NULL, &ep);
/// if (err == 0) err = ulnic_ep_bind(ep, 7);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_create(
    pd: *mut ulnic_pd,
    cfg: *const ulnic_ep_config,
    out: *mut *mut ulnic_ep,
) -> i32 {
    let p = handle!(pd, "ulnic_ep_create");
    if out.is_null() {
        return invalid("ulnic_ep_create", "out is NULL");
    }
    // SAFETY: NULL or a config the caller filled.
    let c = match unsafe { cfg.as_ref() } {
        None => EndpointConfig::default(),
        Some(c) if c.reserved != 0 => return invalid("ulnic_ep_create", "reserved is not 0"),
        Some(c) => EndpointConfig {
            send_entries: c.send_entries,
            recv_entries: c.recv_entries,
            free_entries: c.free_entries,
            segment_bytes: c.segment_bytes as usize,
        },
    };
    guard("ulnic_ep_create", || {
        let ep = p.pd.create_endpoint(&c)?;
        put(out, Box::into_raw(Box::new(ulnic_ep { ep })));
        Ok(0)
    })
}

/// Destroys an endpoint, after waiting (up to a second) for the device to
/// take what it posted; its close message, if any, is sent. NULL is
/// ignored.
///
/// ```c
/// ulnic_ep_destroy(ep);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_destroy(ep: *mut ulnic_ep) {
    if !ep.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(ep) });
    }
}

/// The endpoint's id on its node (0 if `ep` is NULL).
///
/// ```c
/// printf("endpoint %u\n", ulnic_ep_id(ep));
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_id(ep: *const ulnic_ep) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { ep.as_ref() }.map_or(0, |e| e.ep.id())
}

/// The endpoint's session id (0 if `ep` is NULL): the device stamps it
/// on what the endpoint sends (`ulnic_recv.session`), and no other
/// endpoint of its node has had it lately, so a peer can tell this
/// endpoint from an earlier holder of its port.
///
/// ```c
/// printf("session %u\n", ulnic_ep_session(ep));
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_session(ep: *const ulnic_ep) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { ep.as_ref() }.map_or(0, |e| e.ep.session())
}

/// Binds the endpoint to `port` on its node: messages to (node, port)
/// reach it. `-EADDRINUSE` if another endpoint has it.
///
/// ```c
/// int err = ulnic_ep_bind(ep, 7);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_bind(ep: *mut ulnic_ep, port: u32) -> i32 {
    let e = handle!(ep, "ulnic_ep_bind");
    guard("ulnic_ep_bind", || e.ep.bind(port).map(|_| 0))
}

/// Makes `queue`, an endpoint of the same domain, this endpoint's event
/// queue (CLAN's, spec §6.1): while `ep` is armed (`ulnic_ep_arm`), a
/// message or event reaching it posts one `ULNIC_EVENT_QUEUED` carrying
/// `cookie` to `queue`, which is notified if armed, instead of `ep` being
/// notified. One report per arm: serve `ep`, then arm it again.
/// `-EINVAL` for a queue of another domain, `ep` itself, or a queue that
/// has a queue; `-ENOSPC` when `queue` has as many sources as its event
/// ring leaves room for. `ep` is then never notified itself, so
/// `ulnic_ep_wait` on it fails with `-EINVAL`; attach it with
/// `ulnic_evq_attach` instead to keep blocking on it.
///
/// ```c
/// ulnic_ep_set_event_queue(ep, queue, 42);
/// ulnic_ep_arm(ep);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_set_event_queue(
    ep: *mut ulnic_ep,
    queue: *const ulnic_ep,
    cookie: u64,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_set_event_queue");
    // SAFETY: a live handle or NULL.
    let Some(q) = (unsafe { queue.as_ref() }) else {
        return invalid("ulnic_ep_set_event_queue", "queue is NULL");
    };
    guard("ulnic_ep_set_event_queue", || {
        e.ep.set_event_queue(&q.ep, cookie).map(|_| 0)
    })
}

/// Detaches `ep` from its event queue: it is notified itself again.
///
/// ```c
/// ulnic_ep_clear_event_queue(ep);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_clear_event_queue(ep: *mut ulnic_ep) -> i32 {
    let e = handle!(ep, "ulnic_ep_clear_event_queue");
    guard("ulnic_ep_clear_event_queue", || {
        e.ep.clear_event_queue().map(|_| 0)
    })
}

/// Accepts only messages matching one of `count` entries (0: all).
///
/// ```c
/// struct ulnic_filter only = { .node = 1, .port = ULNIC_ANY, .tag = 0, .tag_mask = 0 };
/// ulnic_ep_set_filter(ep, &only, 1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_set_filter(
    ep: *mut ulnic_ep,
    filters: *const ulnic_filter,
    count: usize,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_set_filter");
    if count > 0 && filters.is_null() {
        return invalid("ulnic_ep_set_filter", "filters is NULL");
    }
    let list: Vec<FilterEntry> = (0..count)
        .map(|i| {
            // SAFETY: `count` entries at `filters`, as the caller says.
            let f = unsafe { *filters.add(i) };
            FilterEntry {
                node: f.node,
                port: f.port,
                tag: f.tag,
                tag_mask: f.tag_mask,
            }
        })
        .collect();
    guard("ulnic_ep_set_filter", || e.ep.set_filter(&list).map(|_| 0))
}

/// The endpoint's segment: `*len` bytes (if `len` is not NULL) that sends
/// read and free buffers receive into. Write a payload here, then post
/// it; read a received buffer at its `buffer_offset`.
///
/// ```c
/// size_t seg_len;
/// char *seg = ulnic_ep_segment(ep, &seg_len);
/// memcpy(seg + 4096, "hello", 5);
/// ulnic_ep_post_send(ep, dest, 0, 4096, 5, 1, 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_segment(ep: *mut ulnic_ep, len: *mut usize) -> *mut c_void {
    // SAFETY: a live handle or NULL.
    let Some(e) = (unsafe { ep.as_mut() }) else {
        return std::ptr::null_mut();
    };
    let n = e.ep.segment_len();
    put(len, n);
    // SAFETY: the whole segment, in bounds; C takes over the promise not
    // to touch what the device is using (the header says so).
    unsafe { e.ep.segment_mut(0, n) }.as_mut_ptr().cast()
}

/// The `len` bytes at `data` (none when `len` is 0; `None` when `data` is
/// NULL with a length).
///
/// # Safety
/// `data` must point to `len` readable bytes that stay unchanged while
/// the slice lives.
unsafe fn caller_bytes<'a>(data: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if data.is_null() {
        return None;
    }
    // SAFETY: as the caller promises.
    Some(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

/// Sends `len` bytes (at most `ULNIC_INLINE_MAX`) carried in the
/// descriptor: no buffer to manage. `-EAGAIN` when the send ring is full
/// (poll events and retry).
///
/// ```c
/// struct ulnic_address to = { .node = 1, .port = 7 };
/// while (ulnic_ep_post_send_inline(ep, to, 0, "ping", 4, 1) == -EAGAIN)
///     ;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_post_send_inline(
    ep: *mut ulnic_ep,
    dest: ulnic_address,
    tag: u32,
    data: *const c_void,
    len: usize,
    id: u64,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_post_send_inline");
    // SAFETY: `len` readable bytes at `data`, as the caller says.
    let Some(bytes) = (unsafe { caller_bytes(data, len) }) else {
        return invalid("ulnic_ep_post_send_inline", "data is NULL");
    };
    guard("ulnic_ep_post_send_inline", || {
        e.ep.post_send_inline(dest.into(), tag, bytes, id)
            .map(|_| 0)
    })
}

/// Sends an out-of-band message of `len` bytes (at most 8): the receiver
/// gets it as a `ULNIC_EVENT_OOB` event, ahead of the messages waiting in
/// its receive queue. `flags & ULNIC_COMPLETION` asks for an event when
/// it is delivered. `-EAGAIN` when the send ring is full.
///
/// ```c
/// ulnic_ep_post_oob(ep, to, 0, "stop", 4, 7, 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_post_oob(
    ep: *mut ulnic_ep,
    dest: ulnic_address,
    tag: u32,
    data: *const c_void,
    len: usize,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_post_oob");
    // SAFETY: `len` readable bytes at `data`, as the caller says.
    let Some(bytes) = (unsafe { caller_bytes(data, len) }) else {
        return invalid("ulnic_ep_post_oob", "data is NULL");
    };
    let completion = flags & ULNIC_COMPLETION != 0;
    guard("ulnic_ep_post_oob", || {
        e.ep.post_oob(dest.into(), tag, bytes, id, completion)
            .map(|_| 0)
    })
}

/// Sends `len` bytes at `offset` in the segment, without a copy; with
/// `flags & ULNIC_COMPLETION` an event reports delivery (failures always
/// do). The bytes may be reused once `ulnic_ep_send_space` shows the
/// descriptor retired.
///
/// ```c
/// ulnic_ep_post_send(ep, to, 0, 4096, 1000, 42, ULNIC_COMPLETION);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_post_send(
    ep: *mut ulnic_ep,
    dest: ulnic_address,
    tag: u32,
    offset: u64,
    len: u32,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_post_send");
    guard("ulnic_ep_post_send", || {
        let completion = flags & ULNIC_COMPLETION != 0;
        e.ep.post_send(dest.into(), tag, offset, len, id, completion)
            .map(|_| 0)
    })
}

/// Sends `len` bytes at `offset` of a user buffer of the endpoint's domain
/// (which has a UTLB), translated by the device: no copy when the pages
/// are registered, else (with fallback) through the bounce buffer.
/// Returns 0 for a translation hit, 1 for a miss serviced first, 2 when
/// the message went through the bounce buffer.
///
/// ```c
/// int how = ulnic_ep_post_send_buffer(ep, to, 0, buf, 0, 65536, 7, 0);
/// ```
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ulnic_ep_post_send_buffer(
    ep: *mut ulnic_ep,
    dest: ulnic_address,
    tag: u32,
    buf: *mut ulnic_buffer,
    offset: usize,
    len: usize,
    id: u64,
    flags: u32,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_post_send_buffer");
    let b = handle!(buf, "ulnic_ep_post_send_buffer");
    let Some(end) = offset.checked_add(len) else {
        return invalid("ulnic_ep_post_send_buffer", "offset + len overflows");
    };
    guard("ulnic_ep_post_send_buffer", || {
        let completion = flags & ULNIC_COMPLETION != 0;
        e.ep.post_send_buffer(dest.into(), tag, &b.buf, offset..end, id, completion)
            .map(translation_code)
    })
}

pub(crate) fn translation_code(t: ulnic::Translation) -> i32 {
    match t {
        ulnic::Translation::Hit => 0,
        ulnic::Translation::Miss => 1,
        ulnic::Translation::Fallback => 2,
    }
}

/// Posts a receive buffer: `len` bytes at `offset` in the segment, named
/// `id` in the message that fills it. `-EAGAIN` when the free ring is full.
///
/// ```c
/// for (uint64_t i = 0; i < 16; i++)
///     ulnic_ep_post_free(ep, i * 65536, 65536, i);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_post_free(
    ep: *mut ulnic_ep,
    offset: u64,
    len: u32,
    id: u64,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_post_free");
    guard("ulnic_ep_post_free", || {
        e.ep.post_free(offset, len, id).map(|_| 0)
    })
}

/// Takes the next received message into `out`: 1 if there was one, 0 if
/// not (never blocks).
///
/// ```c
/// struct ulnic_recv m;
/// while (ulnic_ep_poll_recv(ep, &m) == 0)
///     ;
/// const char *bytes = (m.flags & ULNIC_RECV_INLINE) ? (char *)m.data : seg + m.buffer_offset;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_poll_recv(ep: *mut ulnic_ep, out: *mut ulnic_recv) -> i32 {
    let e = handle!(ep, "ulnic_ep_poll_recv");
    if out.is_null() {
        return invalid("ulnic_ep_poll_recv", "out is NULL");
    }
    let Some(m) = e.ep.poll_recv() else {
        return 0;
    };
    let mut r = ulnic_recv {
        src: m.src.into(),
        tag: m.tag,
        len: m.len,
        flags: u32::from(m.close) * ULNIC_RECV_CLOSE + u32::from(m.returned) * ULNIC_RECV_RETURNED,
        session: m.session,
        buffer_offset: 0,
        buffer_id: 0,
        data: [0; ULNIC_INLINE_MAX as usize],
    };
    match m.payload {
        Payload::Inline(d) => {
            r.flags |= ULNIC_RECV_INLINE;
            r.data = d;
        }
        Payload::Buffer { offset, id } => {
            r.buffer_offset = offset;
            r.buffer_id = id;
        }
    }
    put(out, r);
    1
}

/// Messages waiting in the receive ring (0 if `ep` is NULL).
///
/// ```c
/// if (ulnic_ep_recv_ready(ep) > 0) ;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_recv_ready(ep: *const ulnic_ep) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { ep.as_ref() }.map_or(0, |e| e.ep.recv_ready())
}

/// Takes the next event into `out`: 1 if there was one, 0 if not.
///
/// ```c
/// struct ulnic_event ev;
/// while (ulnic_ep_poll_event(ep, &ev) == 1)
///     if (ev.kind == ULNIC_EVENT_SEND_FAILED)
///         fprintf(stderr, "send %llu failed: %s\n", (unsigned long long)ev.id, strerror(ev.error));
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_poll_event(ep: *mut ulnic_ep, out: *mut ulnic_event) -> i32 {
    let e = handle!(ep, "ulnic_ep_poll_event");
    if out.is_null() {
        return invalid("ulnic_ep_poll_event", "out is NULL");
    }
    let Some(ev) = e.ep.poll_event() else {
        return 0;
    };
    put(out, event_to_c(ev));
    1
}

fn event_to_c(ev: Event) -> ulnic_event {
    let mut c = ulnic_event::default();
    match ev {
        Event::SendDone { id } => {
            c.kind = ULNIC_EVENT_SEND_DONE;
            c.id = id;
        }
        Event::SendFailed {
            id,
            dest,
            len,
            reason,
        } => {
            c.kind = ULNIC_EVENT_SEND_FAILED;
            c.id = id;
            c.addr = dest.into();
            c.len = len;
            c.code = u32::from(reason.code());
            c.error = reason.errno();
        }
        Event::Condition(code) => {
            c.kind = ULNIC_EVENT_CONDITION;
            c.code = u32::from(code);
        }
        Event::Tripwire {
            id,
            user,
            from,
            len,
            read,
        } => {
            c.kind = ULNIC_EVENT_TRIPWIRE;
            c.tripwire = id;
            c.id = user;
            c.addr = from.into();
            c.len = len;
            c.code = u32::from(read);
        }
        Event::Redirected {
            id,
            outcome,
            start,
            bytes,
            from,
        } => {
            c.kind = ULNIC_EVENT_REDIRECTED;
            c.id = id;
            c.start = start;
            c.bytes = bytes;
            c.addr = from.into();
            (c.code, c.error) = match outcome {
                RedirectOutcome::Full => (0, 0),
                RedirectOutcome::Partial => (1, 0),
                RedirectOutcome::None => (2, 0),
                RedirectOutcome::Refused(r) => (3, r.errno()),
            };
        }
        Event::OutOfBand {
            from,
            tag,
            data,
            len,
            session,
        } => {
            c.kind = ULNIC_EVENT_OOB;
            c.id = u64::from_le_bytes(data);
            c.len = u32::from(len);
            c.code = tag;
            c.addr = from.into();
            c.session = session;
        }
        Event::Unreachable { node } => {
            c.kind = ULNIC_EVENT_UNREACHABLE;
            c.addr = ulnic_address { node, port: 0 };
        }
        Event::Queued { cookie, source } => {
            c.kind = ULNIC_EVENT_QUEUED;
            c.id = cookie;
            c.code = source;
        }
        Event::PioRevoked { import, key, node } => {
            c.kind = ULNIC_EVENT_PIO_REVOKED;
            c.code = import;
            c.id = key;
            c.addr = ulnic_address { node, port: 0 };
        }
        Event::Unknown(raw) => {
            c.kind = ULNIC_EVENT_UNKNOWN;
            c.code = u32::from(raw.code);
            c.id = raw.user_id;
        }
    }
    c
}

/// Send descriptors that can be posted now (0 if `ep` is NULL).
///
/// ```c
/// while (ulnic_ep_send_space(ep) == 0)
///     ;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_send_space(ep: *const ulnic_ep) -> u32 {
    // SAFETY: a live handle or NULL.
    unsafe { ep.as_ref() }.map_or(0, |e| e.ep.send_space())
}

/// Blocks until a message or event waits, or `timeout_ms` passes (-1:
/// forever): 1 if there is something to poll, 0 on timeout. Checks, arms,
/// re-checks and sleeps, so nothing arriving is slept through.
///
/// ```c
/// if (ulnic_ep_wait(ep, 1000) == 1 && ulnic_ep_poll_recv(ep, &m) == 1) ;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_wait(ep: *mut ulnic_ep, timeout_ms: i32) -> i32 {
    let e = handle!(ep, "ulnic_ep_wait");
    let timeout = timeout_arg(timeout_ms);
    guard("ulnic_ep_wait", || e.ep.wait(timeout).map(i32::from))
}

/// A timeout in milliseconds from C: negative is "forever".
pub(crate) fn timeout_arg(ms: i32) -> Duration {
    u64::try_from(ms).map_or(
        Duration::from_secs(u64::from(u32::MAX)),
        Duration::from_millis,
    )
}

/// Asks for one notification when the next message or event arrives, for
/// a program that sleeps in `poll`, `select` or `epoll` on `ulnic_ep_fd`:
/// 1 when something already waits (poll the endpoint instead of
/// sleeping), 0 when armed.
///
/// ```c
/// if (ulnic_ep_arm(ep) == 0) {
///     struct pollfd p = { .fd = ulnic_ep_fd(ep), .events = POLLIN };
///     poll(&p, 1, 1000);
///     ulnic_ep_take_notification(ep);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_arm(ep: *mut ulnic_ep) -> i32 {
    let e = handle!(ep, "ulnic_ep_arm");
    guard("ulnic_ep_arm", || e.ep.arm().map(i32::from))
}

/// The file descriptor that becomes readable when an armed endpoint of
/// this endpoint's domain is notified (for `poll`, `select`, `epoll`), or
/// a negative errno. Shared by the domain's endpoints (and under host
/// attach by the process's): after a wake-up, poll yours.
///
/// ```c
/// int fd = ulnic_ep_fd(ep);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_fd(ep: *const ulnic_ep) -> i32 {
    // SAFETY: a live handle or NULL.
    match unsafe { ep.as_ref() } {
        Some(e) => {
            e.ep.notification_fd()
                .unwrap_or_else(|| invalid("ulnic_ep_fd", "this NIC has no pollable descriptor"))
        }
        None => invalid("ulnic_ep_fd", "ep is NULL"),
    }
}

/// Takes this endpoint's notification, if any, so its descriptor stops
/// being readable for it: 1 if there was one, 0 if not. Never blocks.
///
/// ```c
/// ulnic_ep_take_notification(ep);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_take_notification(ep: *mut ulnic_ep) -> i32 {
    let e = handle!(ep, "ulnic_ep_take_notification");
    guard("ulnic_ep_take_notification", || {
        e.ep.take_notification().map(i32::from)
    })
}

/// Leaves a close message (at most `ULNIC_INLINE_MAX` bytes) the device
/// sends to `dest` when this endpoint is destroyed, however that happens
/// (freed, its process killed, its VM reset): the receiver gets it with
/// `ULNIC_RECV_CLOSE`, after every message this endpoint sent it.
///
/// ```c
/// ulnic_ep_set_close_message(ep, peer, 0, "bye", 3);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_set_close_message(
    ep: *mut ulnic_ep,
    dest: ulnic_address,
    tag: u32,
    data: *const c_void,
    len: usize,
) -> i32 {
    let e = handle!(ep, "ulnic_ep_set_close_message");
    if len > 0 && data.is_null() {
        return invalid("ulnic_ep_set_close_message", "data is NULL");
    }
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: `len` readable bytes at `data`, as the caller says.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
    };
    guard("ulnic_ep_set_close_message", || {
        e.ep.set_close_message(dest.into(), tag, bytes).map(|_| 0)
    })
}

/// Withdraws the close message.
///
/// ```c
/// ulnic_ep_clear_close_message(ep);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_clear_close_message(ep: *mut ulnic_ep) -> i32 {
    let e = handle!(ep, "ulnic_ep_clear_close_message");
    e.ep.clear_close_message();
    0
}

/// Reads the device's counters for the endpoint into `values` (at most
/// `count` of them, in `ulnic_stat_name` order): how many there are, or a
/// negative errno.
///
/// ```c
/// uint64_t v[32];
/// int n = ulnic_ep_stats(ep, v, 32);
/// for (int i = 0; i < n; i++) printf("%s %llu\n", ulnic_stat_name(i), (unsigned long long)v[i]);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_ep_stats(ep: *mut ulnic_ep, values: *mut u64, count: usize) -> i32 {
    let e = handle!(ep, "ulnic_ep_stats");
    if count > 0 && values.is_null() {
        return invalid("ulnic_ep_stats", "values is NULL");
    }
    guard("ulnic_ep_stats", || {
        let s = e.ep.stats()?;
        for (i, (_, v)) in s.iter().take(count).enumerate() {
            // SAFETY: `count` writable entries at `values`.
            unsafe { values.add(i).write(*v) };
        }
        Ok(s.len() as i32)
    })
}

/// The name of counter `i` of `ulnic_ep_stats` (NULL past the last).
///
/// ```c
/// const char *first = ulnic_stat_name(0); // "tx_messages"
/// ```
#[no_mangle]
pub extern "C" fn ulnic_stat_name(i: u32) -> *const c_char {
    static NAMES: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
    NAMES
        .get_or_init(|| {
            ulnic_abi::STAT_NAMES
                .iter()
                .map(|n| std::ffi::CString::new(*n).unwrap_or_default())
                .collect()
        })
        .get(i as usize)
        .map_or(std::ptr::null(), |n| n.as_ptr())
}
