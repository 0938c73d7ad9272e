//! Active Messages (VN's AM-II, docs/am.md) over an endpoint: request and
//! reply handlers as C functions with a user pointer, credits, bulk
//! transfers into a region, returned messages at an error handler.

use std::ffi::c_void;

use ulnic::am::{AmConfig, AmEndpoint, Kind, Message, RequestToken, ReturnReason, Returned};

use crate::endpoint::{ulnic_address, ulnic_ep};
use crate::nic::put;
use crate::status::{guard, handle, invalid};

/// An Active Message endpoint. One thread at a time.
pub struct ulnic_am {
    am: AmEndpoint,
}

/// What a request handler replies through; valid only while the handler
/// runs.
pub struct ulnic_am_token {
    /// The handler's `RequestToken`, for the length of the call.
    t: *mut c_void,
}

impl ulnic_am_token {
    /// The token behind the handle.
    ///
    /// # Safety
    /// Only while the handler it was given to runs.
    unsafe fn token<'a>(&self) -> &'a mut RequestToken<'a> {
        // SAFETY: `t` was made from a `&mut RequestToken` that lives
        // until the handler returns, the caller's promise.
        unsafe { &mut *self.t.cast::<RequestToken<'a>>() }
    }
}

/// Sizes of an AM endpoint (`ulnic_am_config_default` fills it).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ulnic_am_config {
    /// Requests in flight at once (VN's k_user), 1 to 254.
    pub credits: u32,
    /// Largest transfer, bytes.
    pub bulk_max: u32,
    /// Receive buffers for transfers longer than an inline message.
    pub bulk_buffers: u32,
    /// Must be 0.
    pub reserved: u32,
    /// Bytes of the region transfers land in.
    pub region_bytes: u64,
}

/// A message as a handler sees it (valid during the handler only).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ulnic_am_message {
    /// The sender, stamped by the device.
    pub src: ulnic_address,
    /// The handler index it named.
    pub handler: u32,
    /// Must be ignored.
    pub reserved: u32,
    /// Its 4 words.
    pub words: [u64; 4],
    /// A transfer: where its data landed in the region.
    pub offset: u64,
    /// A transfer: its data, in the region (NULL for short messages).
    pub data: *const c_void,
    /// Bytes at `data`.
    pub len: usize,
}

/// A message given back to its sender (`ulnic_am_set_error_handler`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ulnic_am_returned {
    /// Where it was going.
    pub dest: ulnic_address,
    /// What it was: 1 request, 2 reply, 3 transfer, 4 credit, 5 refusal.
    pub kind: u32,
    /// The handler index it named.
    pub handler: u32,
    /// 1 when `words` holds its words (requests and transfers).
    pub has_words: u32,
    /// 0: ulnic could not deliver it (`code` is the device's reason);
    /// 1: the receiver refused it (`code`: 1 no handler, 2 outside its
    /// region, 3 malformed).
    pub refused: u32,
    /// The reason's code.
    pub code: u64,
    /// Its words, if `has_words`.
    pub words: [u64; 4],
}

/// An AM endpoint's counters (`ulnic_am_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ulnic_am_stats {
    /// Requests and transfers whose handler ran here.
    pub requests_handled: u64,
    /// Replies whose handler ran here.
    pub replies_handled: u64,
    /// CREDIT answers sent for requests not replied to.
    pub credits_sent: u64,
    /// REFUSED answers sent.
    pub refusals_sent: u64,
    /// Messages that came back.
    pub returned: u64,
    /// Answers that matched no request in flight.
    pub stray: u64,
    /// Messages of another version or kind, or malformed.
    pub foreign: u64,
    /// Replies naming a reply handler that is not set.
    pub unhandled_replies: u64,
}

/// A request handler: `token` replies (once), `m` is the request.
pub type ulnic_am_request_fn = Option<
    unsafe extern "C" fn(token: *mut ulnic_am_token, m: *const ulnic_am_message, user: *mut c_void),
>;
/// A reply handler (it cannot reply: it has no token).
pub type ulnic_am_reply_fn =
    Option<unsafe extern "C" fn(m: *const ulnic_am_message, user: *mut c_void)>;
/// An error handler: a message that came back.
pub type ulnic_am_error_fn =
    Option<unsafe extern "C" fn(r: *const ulnic_am_returned, user: *mut c_void)>;

/// A caller's pointer, handed back to its handlers on the thread that
/// polls (the AM endpoint is used by one thread at a time).
#[derive(Clone, Copy)]
struct User(*mut c_void);
// SAFETY: the pointer is only given back to the caller's own functions,
// on whichever thread the caller polls from; the library never reads it.
unsafe impl Send for User {}

fn message(m: &Message<'_>) -> ulnic_am_message {
    ulnic_am_message {
        src: m.src.into(),
        handler: u32::from(m.handler),
        reserved: 0,
        words: m.words,
        offset: m.offset,
        data: if m.data.is_empty() {
            std::ptr::null()
        } else {
            m.data.as_ptr().cast()
        },
        len: m.data.len(),
    }
}

fn returned(r: &Returned) -> ulnic_am_returned {
    let (refused, code) = match r.reason {
        ReturnReason::Send(e) => (0, u64::from(e.code())),
        ReturnReason::Refused(c) => (1, c),
    };
    ulnic_am_returned {
        dest: r.dest.into(),
        kind: r.kind as u32,
        handler: u32::from(r.handler),
        has_words: u32::from(r.words.is_some()),
        refused,
        code,
        words: r.words.unwrap_or_default(),
    }
}

/// Fills `cfg` with the defaults (4 credits, 8,192-byte transfers, 32
/// bulk buffers, a 1 MiB region).
///
/// ```c
/// struct ulnic_am_config cfg;
/// ulnic_am_config_default(&cfg);
/// cfg.credits = 8;
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_config_default(cfg: *mut ulnic_am_config) -> i32 {
    let d = AmConfig::default();
    let c = ulnic_am_config {
        credits: u32::from(d.credits),
        bulk_max: d.bulk_max,
        bulk_buffers: d.bulk_buffers,
        reserved: 0,
        region_bytes: d.region_bytes as u64,
    };
    if !put(cfg, c) {
        return invalid("ulnic_am_config_default", "cfg is NULL");
    }
    0
}

/// Makes the bound endpoint `ep` an AM endpoint with `cfg` (NULL: the
/// defaults). The AM endpoint takes `ep` over, also when this fails (do
/// not destroy it yourself).
///
/// ```c
/// struct ulnic_am *am;
/// ulnic_ep_bind(ep, 9);
/// int err = ulnic_am_create(ep, NULL, &am);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_create(
    ep: *mut ulnic_ep,
    cfg: *const ulnic_am_config,
    out: *mut *mut ulnic_am,
) -> i32 {
    if ep.is_null() || out.is_null() {
        return invalid("ulnic_am_create", "ep or out is NULL");
    }
    // SAFETY: a live handle from this library, given up by the caller.
    let ep = unsafe { Box::from_raw(ep) }.ep;
    // SAFETY: NULL or the caller's config.
    let cfg = match unsafe { cfg.as_ref() } {
        None => AmConfig::default(),
        Some(c) if c.reserved != 0 => return invalid("ulnic_am_create", "reserved is not 0"),
        Some(c) => match (u8::try_from(c.credits), usize::try_from(c.region_bytes)) {
            (Ok(credits), Ok(region_bytes)) => AmConfig {
                credits,
                bulk_max: c.bulk_max,
                bulk_buffers: c.bulk_buffers,
                region_bytes,
            },
            _ => return invalid("ulnic_am_create", "credits must be 1 to 254"),
        },
    };
    guard("ulnic_am_create", || {
        let am = AmEndpoint::new(ep, cfg)?;
        put(out, Box::into_raw(Box::new(ulnic_am { am })));
        Ok(0)
    })
}

/// Frees the AM endpoint and its endpoint. NULL is ignored.
///
/// ```c
/// ulnic_am_free(am);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_free(am: *mut ulnic_am) {
    if !am.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once.
        drop(unsafe { Box::from_raw(am) });
    }
}

/// Sets request handler `index` (0-255) to `f`, called with `user`
/// (NULL `f` removes it: requests for it are refused).
///
/// ```c
/// static void echo(struct ulnic_am_token *t, const struct ulnic_am_message *m, void *user)
/// {
///     ulnic_am_reply4(t, 1, m->words);
/// }
/// ulnic_am_set_request_handler(am, 1, echo, NULL);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_set_request_handler(
    am: *mut ulnic_am,
    index: u32,
    f: ulnic_am_request_fn,
    user: *mut c_void,
) -> i32 {
    let a = handle!(am, "ulnic_am_set_request_handler");
    let Ok(index) = u8::try_from(index) else {
        return invalid("ulnic_am_set_request_handler", "index must be 0 to 255");
    };
    let user = User(user);
    match f {
        Some(f) => a.am.set_request_handler(index, move |t, m| {
            let user = user;
            let c = message(m);
            let mut token = ulnic_am_token {
                t: (t as *mut RequestToken<'_>).cast(),
            };
            // SAFETY: the token and message live for the call; the
            // caller's function and pointer.
            unsafe { f(&mut token, &c, user.0) };
        }),
        None => a.am.clear_request_handler(index),
    }
    0
}

/// Sets reply handler `index` (0-255) to `f`, called with `user` (NULL
/// `f` removes it).
///
/// ```c
/// static void got(const struct ulnic_am_message *m, void *user) { *(uint64_t *)user = m->words[0]; }
/// ulnic_am_set_reply_handler(am, 1, got, &answer);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_set_reply_handler(
    am: *mut ulnic_am,
    index: u32,
    f: ulnic_am_reply_fn,
    user: *mut c_void,
) -> i32 {
    let a = handle!(am, "ulnic_am_set_reply_handler");
    let Ok(index) = u8::try_from(index) else {
        return invalid("ulnic_am_set_reply_handler", "index must be 0 to 255");
    };
    let user = User(user);
    match f {
        Some(f) => a.am.set_reply_handler(index, move |m| {
            let user = user;
            let c = message(m);
            // SAFETY: the caller's function and pointer; `c` lives for
            // the call.
            unsafe { f(&c, user.0) };
        }),
        None => a.am.clear_reply_handler(index),
    }
    0
}

/// Sets the error handler, called with `user` for every message that
/// comes back (NULL: such messages are only counted).
///
/// ```c
/// static void back(const struct ulnic_am_returned *r, void *user) { fprintf(stderr, "returned\n"); }
/// ulnic_am_set_error_handler(am, back, NULL);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_set_error_handler(
    am: *mut ulnic_am,
    f: ulnic_am_error_fn,
    user: *mut c_void,
) -> i32 {
    let a = handle!(am, "ulnic_am_set_error_handler");
    let user = User(user);
    match f {
        Some(f) => a.am.set_error_handler(move |r| {
            let user = user;
            let c = returned(r);
            // SAFETY: the caller's function and pointer; `c` lives for
            // the call.
            unsafe { f(&c, user.0) };
        }),
        None => a.am.clear_error_handler(),
    }
    0
}

fn words_arg(words: *const u64) -> Option<[u64; 4]> {
    if words.is_null() {
        return None;
    }
    let mut w = [0u64; 4];
    // SAFETY: the caller passes 4 readable words.
    unsafe { std::ptr::copy_nonoverlapping(words, w.as_mut_ptr(), 4) };
    Some(w)
}

/// Sends a 4-word request to `dest`'s request handler `handler`. With
/// `wait` it polls (running handlers) until a credit is free; without,
/// `-EAGAIN` when none is.
///
/// ```c
/// uint64_t w[4] = { 1, 2, 3, 4 };
/// ulnic_am_request4(am, &(struct ulnic_address){ 1, 9 }, 1, w, 1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_request4(
    am: *mut ulnic_am,
    dest: *const ulnic_address,
    handler: u32,
    words: *const u64,
    wait: i32,
) -> i32 {
    let a = handle!(am, "ulnic_am_request4");
    // SAFETY: NULL or the caller's address.
    let (Some(dest), Some(w), Ok(h)) = (
        unsafe { dest.as_ref() },
        words_arg(words),
        u8::try_from(handler),
    ) else {
        return invalid(
            "ulnic_am_request4",
            "dest or words is NULL, or handler > 255",
        );
    };
    guard("ulnic_am_request4", || {
        if wait != 0 {
            a.am.request4((*dest).into(), h, w)?;
        } else {
            a.am.try_request4((*dest).into(), h, w)?;
        }
        Ok(0)
    })
}

/// Transfers `len` bytes at `data` into `dest`'s region at `offset`, then
/// runs its request handler `handler` with `words` (copied at once: the
/// buffer is free when this returns). `wait` as for `ulnic_am_request4`.
///
/// ```c
/// ulnic_am_xfer(am, &server, 4096, 2, buf, 1024, w, 1);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_xfer(
    am: *mut ulnic_am,
    dest: *const ulnic_address,
    offset: u64,
    handler: u32,
    data: *const c_void,
    len: usize,
    words: *const u64,
    wait: i32,
) -> i32 {
    let a = handle!(am, "ulnic_am_xfer");
    // SAFETY: NULL or the caller's address.
    let (Some(dest), Some(w), Ok(h)) = (
        unsafe { dest.as_ref() },
        words_arg(words),
        u8::try_from(handler),
    ) else {
        return invalid("ulnic_am_xfer", "dest or words is NULL, or handler > 255");
    };
    if len > 0 && data.is_null() {
        return invalid("ulnic_am_xfer", "data is NULL");
    }
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: `len` readable bytes at `data`.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
    };
    guard("ulnic_am_xfer", || {
        if wait != 0 {
            a.am.xfer((*dest).into(), offset, h, bytes, w)?;
        } else {
            a.am.try_xfer((*dest).into(), offset, h, bytes, w)?;
        }
        Ok(0)
    })
}

/// From a request handler: replies with 4 words to the requester's reply
/// handler `handler`; once per request (again: `-EINVAL`).
///
/// ```c
/// ulnic_am_reply4(token, 1, m->words);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_reply4(
    token: *mut ulnic_am_token,
    handler: u32,
    words: *const u64,
) -> i32 {
    let t = handle!(token, "ulnic_am_reply4");
    let (Some(w), Ok(h)) = (words_arg(words), u8::try_from(handler)) else {
        return invalid("ulnic_am_reply4", "words is NULL or handler > 255");
    };
    // SAFETY: a token is used only inside its handler (the header says so).
    let token = unsafe { t.token() };
    guard("ulnic_am_reply4", || token.reply4(h, w).map(|_| 0))
}

/// The requester of the request a token answers.
///
/// ```c
/// struct ulnic_address from = ulnic_am_token_source(token);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_token_source(token: *const ulnic_am_token) -> ulnic_address {
    // SAFETY: NULL or a token passed to a running handler.
    match unsafe { token.as_ref() } {
        // SAFETY: as above.
        Some(t) => unsafe { t.token() }.source().into(),
        None => ulnic_address::default(),
    }
}

/// Runs the handlers of what has arrived and come back: how many
/// messages and events it handled (0: nothing was waiting).
///
/// ```c
/// while (ulnic_am_credits(am) < 4)
///     ulnic_am_poll(am);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_poll(am: *mut ulnic_am) -> i32 {
    let a = handle!(am, "ulnic_am_poll");
    guard("ulnic_am_poll", || {
        a.am.poll().map(|n| i32::try_from(n).unwrap_or(i32::MAX))
    })
}

/// Credits free now (NULL: 0).
///
/// ```c
/// if (ulnic_am_credits(am) == 0) ulnic_am_poll(am);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_credits(am: *const ulnic_am) -> u32 {
    // SAFETY: NULL or a live handle.
    unsafe { am.as_ref() }.map_or(0, |a| a.am.credits())
}

/// The region transfers land in: its first byte and length.
///
/// ```c
/// uint8_t *region; size_t n;
/// ulnic_am_region(am, (void **)&region, &n);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_region(
    am: *mut ulnic_am,
    base: *mut *mut c_void,
    len: *mut usize,
) -> i32 {
    let a = handle!(am, "ulnic_am_region");
    let r = a.am.region_mut();
    if !put(base, r.as_mut_ptr().cast()) || !put(len, r.len()) {
        return invalid("ulnic_am_region", "base or len is NULL");
    }
    0
}

/// The AM endpoint's counters.
///
/// ```c
/// struct ulnic_am_stats s;
/// ulnic_am_stats(am, &s);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ulnic_am_stats(am: *mut ulnic_am, out: *mut ulnic_am_stats) -> i32 {
    let a = handle!(am, "ulnic_am_stats");
    let s = a.am.stats();
    let c = ulnic_am_stats {
        requests_handled: s.requests_handled,
        replies_handled: s.replies_handled,
        credits_sent: s.credits_sent,
        refusals_sent: s.refusals_sent,
        returned: s.returned,
        stray: s.stray,
        foreign: s.foreign,
        unhandled_replies: s.unhandled_replies,
    };
    if !put(out, c) {
        return invalid("ulnic_am_stats", "out is NULL");
    }
    0
}

/// Kinds as `ulnic_am_returned.kind` numbers them (docs/am.md §1).
const _: () = {
    assert!(Kind::Request as u32 == 1 && Kind::Reply as u32 == 2 && Kind::Xfer as u32 == 3);
    assert!(Kind::Credit as u32 == 4 && Kind::Refused as u32 == 5);
};
