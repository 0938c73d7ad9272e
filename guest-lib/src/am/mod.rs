//! Active Messages (Virtual Networks' AM-II) over one endpoint
//! (docs/am.md): request and reply handlers run when the endpoint is
//! polled, requests are flow-controlled by credits (VN's k_user), bulk
//! transfers land in the receiver's region, and what the network gives
//! back reaches a per-endpoint error handler.
//!
//! ```no_run
//! use ulnic::am::{AmConfig, AmEndpoint};
//! use ulnic::{Address, EndpointConfig, Nic};
//! # fn main() -> Result<(), ulnic::Error> {
//! let nic = Nic::open()?;
//! let mut ep = nic.alloc_pd()?.create_endpoint(&EndpointConfig::default())?;
//! ep.bind(9)?;
//! let mut am = AmEndpoint::new(ep, AmConfig::default())?;
//! // Handler 1 answers with its first word doubled, to reply handler 2.
//! am.set_request_handler(1, |token, m| {
//!     let _ = token.reply4(2, [m.words[0] * 2, 0, 0, 0]);
//! });
//! am.set_reply_handler(2, |m| println!("{} says {}", m.src, m.words[0]));
//! am.request4(Address { node: 1, port: 9 }, 1, [21, 0, 0, 0])?;
//! while am.credits() < AmConfig::default().credits as u32 {
//!     am.poll()?;
//! }
//! # Ok(()) }
//! ```

mod credits;
mod wire;

use std::collections::VecDeque;

use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::types::{Address, Event, Payload, Received, SendError};
use credits::{Credits, Outstanding};
pub use wire::Kind;
use wire::{refusal, Tag, WORDS_BYTES, XFER_HEADER};

/// An AM endpoint's sizes (docs/am.md §3, §5).
///
/// ```
/// let cfg = ulnic::am::AmConfig::default();
/// assert_eq!((cfg.credits, cfg.bulk_max), (4, 8192));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct AmConfig {
    /// Requests in flight at once (VN's k_user), 1 to 255.
    pub credits: u8,
    /// Largest transfer, bytes.
    pub bulk_max: u32,
    /// Receive buffers for transfers that do not fit an inline message.
    pub bulk_buffers: u32,
    /// Bytes of the region transfers land in.
    pub region_bytes: usize,
}

impl Default for AmConfig {
    fn default() -> Self {
        AmConfig {
            credits: 4,
            bulk_max: 8192,
            bulk_buffers: 32,
            region_bytes: 1 << 20,
        }
    }
}

/// A message as its handler sees it.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// # ep.bind(9)?;
/// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
/// am.set_reply_handler(0, |m: &ulnic::am::Message| {
///     println!("from {}: {:?}, {} bulk bytes at {}", m.src, m.words, m.data.len(), m.offset);
/// });
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug)]
pub struct Message<'a> {
    /// The sender, stamped by the device.
    pub src: Address,
    /// The handler index it named.
    pub handler: u8,
    /// Its 4 words.
    pub words: [u64; 4],
    /// A transfer: where its data landed in this endpoint's region.
    pub offset: u64,
    /// A transfer: its data, in the region (empty for short messages).
    pub data: &'a [u8],
}

/// Why a message came back.
///
/// ```
/// use ulnic::am::ReturnReason;
/// let r = ReturnReason::Send(ulnic::SendError::NoEndpoint);
/// assert_ne!(r, ReturnReason::Refused(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnReason {
    /// ulnic could not deliver it.
    Send(SendError),
    /// The receiver refused the request (docs/am.md §1: 1 no handler,
    /// 2 outside its region, 3 malformed).
    Refused(u64),
}

/// A message given back to its sender (VN's return to sender).
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// # ep.bind(9)?;
/// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
/// am.set_error_handler(|r: &ulnic::am::Returned| {
///     eprintln!("{:?} for handler {} to {} came back: {:?}", r.kind, r.handler, r.dest, r.reason);
/// });
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Returned {
    /// Where it was going.
    pub dest: Address,
    /// What it was.
    pub kind: Kind,
    /// The handler it named.
    pub handler: u8,
    /// Its words (requests and transfers; answers are not kept).
    pub words: Option<[u64; 4]>,
    /// Why.
    pub reason: ReturnReason,
}

/// An AM endpoint's counters.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// # ep.bind(9)?;
/// # let am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
/// let s = am.stats();
/// println!("{} requests handled, {} stray answers", s.requests_handled, s.stray);
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AmStats {
    /// Requests and transfers whose handler ran here.
    pub requests_handled: u64,
    /// Replies whose handler ran here.
    pub replies_handled: u64,
    /// CREDIT answers sent for requests whose handler did not reply.
    pub credits_sent: u64,
    /// REFUSED answers sent.
    pub refusals_sent: u64,
    /// Messages that came back (each given to the error handler, if any).
    pub returned: u64,
    /// Answers that matched no request in flight (dropped).
    pub stray: u64,
    /// Messages of another version or kind, or malformed (dropped).
    pub foreign: u64,
    /// Replies naming a reply handler that is not set (dropped).
    pub unhandled_replies: u64,
}

type RequestHandler = Box<dyn FnMut(&mut RequestToken<'_>, &Message<'_>) + Send>;
type ReplyHandler = Box<dyn FnMut(&Message<'_>) + Send>;
type ErrorHandler = Box<dyn FnMut(&Returned) + Send>;

/// Send ids of answers have this bit (requests' ids name their slot).
const ANSWER: u64 = 1 << 63;
/// Messages taken from the receive queue per `poll`.
const POLL_BATCH: usize = 64;

/// The endpoint and what the layer keeps for it, apart from the handlers
/// (so a handler can be given a token that sends).
struct Net {
    ep: Endpoint,
    cfg: AmConfig,
    credits: Credits,
    /// Events taken while waiting for send-ring room inside a handler,
    /// handled at the next poll.
    deferred: VecDeque<Event>,
    stats: AmStats,
    /// Bytes of one send or receive buffer.
    buffer: u64,
}

/// Where a received message's bytes are: in its descriptor, or in a
/// receive buffer of the segment that goes back to the free ring once
/// they are read (`Net::release`).
enum Body {
    Inline([u8; ulnic_abi::INLINE_MAX as usize], usize),
    Segment { offset: usize, len: usize, id: u64 },
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Inline(_, n) => *n,
            Body::Segment { len, .. } => *len,
        }
    }
}

/// What a request handler answers through (docs/am.md §2).
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// # ep.bind(9)?;
/// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
/// am.set_request_handler(4, |token: &mut ulnic::am::RequestToken, m| {
///     let from = token.source();
///     let _ = token.reply4(5, [from.node as u64, m.words[0], 0, 0]);
/// });
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct RequestToken<'a> {
    net: &'a mut Net,
    src: Address,
    slot: u8,
    generation: u8,
    replied: bool,
}

impl RequestToken<'_> {
    /// Who sent the request.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.set_request_handler(0, |t, _| println!("{}", t.source()));
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn source(&self) -> Address {
        self.src
    }

    /// Replies with 4 words, naming the requester's reply handler
    /// `handler`; once per request (a second reply is `InvalidArgument`).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.set_request_handler(0, |t, m| {
    ///     t.reply4(1, m.words).expect("first reply");
    ///     assert!(t.reply4(1, m.words).is_err());
    /// });
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn reply4(&mut self, handler: u8, words: [u64; 4]) -> Result<(), Error> {
        if self.replied {
            return Err(Error::InvalidArgument("a request is replied to once"));
        }
        let tag = Tag {
            handler,
            kind: Kind::Reply,
            slot: self.slot,
            generation: self.generation,
        };
        self.net.answer(self.src, tag, words)?;
        self.replied = true;
        Ok(())
    }
}

/// An Active Message endpoint over one bound ulnic endpoint.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// ep.bind(9)?;
/// let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
/// am.poll()?;
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct AmEndpoint {
    net: Net,
    requests: Vec<Option<RequestHandler>>,
    replies: Vec<Option<ReplyHandler>>,
    on_error: Option<ErrorHandler>,
    region: Vec<u8>,
}

impl AmEndpoint {
    /// Makes `ep` (bound to a port) an AM endpoint: checks that its
    /// segment holds the send and receive buffers (docs/am.md §5) and
    /// posts the receive buffers.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(9)?;
    /// let cfg = ulnic::am::AmConfig { credits: 8, ..Default::default() };
    /// let am = ulnic::am::AmEndpoint::new(ep, cfg)?;
    /// assert_eq!(am.credits(), 8);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new(mut ep: Endpoint, cfg: AmConfig) -> Result<AmEndpoint, Error> {
        if ep.address().is_none() {
            return Err(Error::InvalidArgument(
                "bind the endpoint before AM uses it",
            ));
        }
        if cfg.credits == 0 || cfg.credits == 255 {
            return Err(Error::InvalidArgument("credits must be 1 to 254"));
        }
        if cfg.bulk_max == 0 || cfg.bulk_max > ulnic_abi::MAX_MESSAGE - XFER_HEADER as u32 {
            return Err(Error::InvalidArgument(
                "bulk_max must be 1 to MAX_MESSAGE - 40",
            ));
        }
        let buffer = (XFER_HEADER as u64 + u64::from(cfg.bulk_max)).next_multiple_of(64);
        let buffers = u64::from(cfg.credits) + u64::from(cfg.bulk_buffers);
        if buffers * buffer > ep.segment_len() as u64 {
            return Err(Error::InvalidArgument(
                "the segment is too small for credits + bulk_buffers buffers of 40 + bulk_max bytes",
            ));
        }
        for j in 0..u64::from(cfg.bulk_buffers) {
            let offset = (u64::from(cfg.credits) + j) * buffer;
            ep.post_free(offset, buffer as u32, offset)?;
        }
        Ok(AmEndpoint {
            net: Net {
                ep,
                cfg,
                credits: Credits::new(cfg.credits),
                deferred: VecDeque::new(),
                stats: AmStats::default(),
                buffer,
            },
            requests: (0..256).map(|_| None).collect(),
            replies: (0..256).map(|_| None).collect(),
            on_error: None,
            region: vec![0; cfg.region_bytes],
        })
    }

    /// Sets the request handler `index` (it runs for requests and
    /// transfers naming it, and may reply once through its token).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.set_request_handler(1, |t, m| { let _ = t.reply4(1, m.words); });
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_request_handler<F>(&mut self, index: u8, f: F)
    where
        F: FnMut(&mut RequestToken<'_>, &Message<'_>) + Send + 'static,
    {
        self.requests[usize::from(index)] = Some(Box::new(f));
    }

    /// Removes the request handler `index` (requests for it are then
    /// refused, docs/am.md §2).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.clear_request_handler(1);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn clear_request_handler(&mut self, index: u8) {
        self.requests[usize::from(index)] = None;
    }

    /// Removes the reply handler `index` (replies for it are counted in
    /// `unhandled_replies`).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.clear_reply_handler(1);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn clear_reply_handler(&mut self, index: u8) {
        self.replies[usize::from(index)] = None;
    }

    /// Removes the error handler (returned messages are then only
    /// counted).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.clear_error_handler();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn clear_error_handler(&mut self) {
        self.on_error = None;
    }

    /// Sets the reply handler `index` (it has no token: it cannot reply).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.set_reply_handler(1, |m| println!("{:?}", m.words));
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_reply_handler<F>(&mut self, index: u8, f: F)
    where
        F: FnMut(&Message<'_>) + Send + 'static,
    {
        self.replies[usize::from(index)] = Some(Box::new(f));
    }

    /// Sets the error handler: it gets every message that comes back.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.set_error_handler(|r| eprintln!("returned: {r:?}"));
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_error_handler<F>(&mut self, f: F)
    where
        F: FnMut(&Returned) + Send + 'static,
    {
        self.on_error = Some(Box::new(f));
    }

    /// Credits free now (requests that can be sent without waiting).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// if am.credits() == 0 { /* every request is in flight */ }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn credits(&self) -> u32 {
        self.net.credits.available()
    }

    /// The region transfers land in.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// let first = am.region()[0];
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn region(&self) -> &[u8] {
        &self.region
    }

    /// The region, to write (for instance to clear it).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.region_mut().fill(0);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn region_mut(&mut self) -> &mut [u8] {
        &mut self.region
    }

    /// The counters.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// assert_eq!(am.stats().stray, 0);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn stats(&self) -> AmStats {
        self.net.stats
    }

    /// The ulnic endpoint underneath (its address, notification fd).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// println!("{:?}", am.endpoint().address());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn endpoint(&self) -> &Endpoint {
        &self.net.ep
    }

    /// Sends a 4-word request to `dest`'s request handler `handler`,
    /// waiting (and polling, so handlers run) while no credit is free.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.request4(ulnic::Address { node: 1, port: 9 }, 1, [1, 2, 3, 4])?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn request4(&mut self, dest: Address, handler: u8, words: [u64; 4]) -> Result<(), Error> {
        self.waiting(|am| am.try_request4(dest, handler, words))
    }

    /// As [`AmEndpoint::request4`], but `WouldBlock` when no credit is
    /// free (or the send ring is full).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// match am.try_request4(ulnic::Address { node: 1, port: 9 }, 1, [0; 4]) {
    ///     Err(ulnic::Error::WouldBlock) => { am.poll()?; }
    ///     r => r?,
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn try_request4(
        &mut self,
        dest: Address,
        handler: u8,
        words: [u64; 4],
    ) -> Result<(), Error> {
        self.net
            .request(dest, Kind::Request, handler, words, 0, &[])
    }

    /// Transfers `data` into `dest`'s region at `offset`, then runs its
    /// request handler `handler` with `words` (AM-II's bulk request);
    /// waits for a credit like [`AmEndpoint::request4`]. `data` is copied
    /// at once: the caller may reuse it when this returns.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// am.xfer(ulnic::Address { node: 1, port: 9 }, 4096, 2, &[7u8; 1024], [0; 4])?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn xfer(
        &mut self,
        dest: Address,
        offset: u64,
        handler: u8,
        data: &[u8],
        words: [u64; 4],
    ) -> Result<(), Error> {
        self.waiting(|am| am.try_xfer(dest, offset, handler, data, words))
    }

    /// As [`AmEndpoint::xfer`], but `WouldBlock` when no credit is free.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// let _ = am.try_xfer(ulnic::Address { node: 1, port: 9 }, 0, 2, b"bulk", [0; 4]);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn try_xfer(
        &mut self,
        dest: Address,
        offset: u64,
        handler: u8,
        data: &[u8],
        words: [u64; 4],
    ) -> Result<(), Error> {
        if data.len() > self.net.cfg.bulk_max as usize {
            return Err(Error::InvalidArgument("transfer longer than bulk_max"));
        }
        self.net
            .request(dest, Kind::Xfer, handler, words, offset, data)
    }

    /// Runs `attempt` until it is not `WouldBlock`, polling in between.
    fn waiting(
        &mut self,
        mut attempt: impl FnMut(&mut AmEndpoint) -> Result<(), Error>,
    ) -> Result<(), Error> {
        loop {
            match attempt(self) {
                Err(Error::WouldBlock) => {
                    if self.poll()? == 0 {
                        std::thread::yield_now();
                    }
                }
                r => return r,
            }
        }
    }

    /// Runs the handlers of what has arrived (at most 64 messages) and of
    /// what came back: how many messages and events it handled.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # ep.bind(9)?;
    /// # let mut am = ulnic::am::AmEndpoint::new(ep, Default::default())?;
    /// loop {
    ///     if am.poll()? == 0 { std::thread::yield_now(); }
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn poll(&mut self) -> Result<usize, Error> {
        let mut done = 0;
        while let Some(ev) = self.net.deferred.pop_front() {
            self.event(ev);
            done += 1;
        }
        while let Some(ev) = self.net.ep.poll_event() {
            self.event(ev);
            done += 1;
        }
        for _ in 0..POLL_BATCH {
            let Some(m) = self.net.ep.poll_recv() else {
                break;
            };
            self.dispatch(m)?;
            done += 1;
        }
        Ok(done)
    }

    /// An event: a failed send is a returned message.
    fn event(&mut self, ev: Event) {
        let Event::SendFailed {
            id, dest, reason, ..
        } = ev
        else {
            return;
        };
        let returned = if id & ANSWER != 0 {
            Returned {
                dest,
                kind: match (id >> 8) as u8 {
                    4 => Kind::Credit,
                    5 => Kind::Refused,
                    _ => Kind::Reply,
                },
                handler: id as u8,
                words: None,
                reason: ReturnReason::Send(reason),
            }
        } else {
            // Settled already (its copy came back first, or an answer).
            let Some(o) = self.net.credits.settle(id as u8, (id >> 8) as u8, None) else {
                return;
            };
            Returned {
                dest: o.dest,
                kind: o.kind,
                handler: o.handler,
                words: Some(o.words),
                reason: ReturnReason::Send(reason),
            }
        };
        self.give_back(&returned);
    }

    fn give_back(&mut self, r: &Returned) {
        self.net.stats.returned += 1;
        if let Some(h) = self.on_error.as_mut() {
            h(r);
        }
    }

    /// A received message: its handler, an answer's settling, or nothing.
    fn dispatch(&mut self, m: Received) -> Result<(), Error> {
        let body = self.net.body(&m);
        let handled = match Tag::decode(m.tag) {
            // A returned message's failure is its send's event (§4).
            _ if m.returned || m.close => Ok(()),
            None => {
                self.net.stats.foreign += 1;
                Ok(())
            }
            Some(tag) if tag.kind.is_request() => self.request(m.src, tag, &body),
            Some(tag) => {
                self.answer(m.src, tag, &body);
                Ok(())
            }
        };
        self.net.release(&body)?;
        handled
    }

    /// A request or transfer: its handler, then an answer if it gave none.
    fn request(&mut self, src: Address, tag: Tag, body: &Body) -> Result<(), Error> {
        let refuse = |net: &mut Net, why: u64| {
            net.stats.refusals_sent += 1;
            let t = Tag {
                kind: Kind::Refused,
                ..tag
            };
            net.answer(src, t, [why, 0, 0, 0])
        };
        let len = body.len();
        let mut head = [0u8; XFER_HEADER];
        let head = &mut head[..len.min(XFER_HEADER)];
        self.net.read(body, 0, head);
        let (words, offset, n) = match tag.kind {
            Kind::Request if len == WORDS_BYTES => (wire::decode_words(head), 0, 0),
            Kind::Xfer if len >= XFER_HEADER => match wire::decode_xfer_header(head) {
                Some((w, o)) => (Some(w), o, len - XFER_HEADER),
                None => (None, 0, 0),
            },
            _ => (None, 0, 0),
        };
        let Some(words) = words else {
            self.net.stats.foreign += 1;
            return refuse(&mut self.net, refusal::MALFORMED);
        };
        let Some(handler) = self.requests[usize::from(tag.handler)].as_mut() else {
            return refuse(&mut self.net, refusal::NO_HANDLER);
        };
        let landed = match usize::try_from(offset) {
            Ok(o) if o.checked_add(n).is_some_and(|end| end <= self.region.len()) => o..o + n,
            _ => return refuse(&mut self.net, refusal::OUTSIDE_REGION),
        };
        // Straight from the receive buffer into the region: one copy.
        self.net
            .read(body, XFER_HEADER, &mut self.region[landed.clone()]);
        let message = Message {
            src,
            handler: tag.handler,
            words,
            offset,
            data: &self.region[landed],
        };
        let mut token = RequestToken {
            net: &mut self.net,
            src,
            slot: tag.slot,
            generation: tag.generation,
            replied: false,
        };
        handler(&mut token, &message);
        let replied = token.replied;
        self.net.stats.requests_handled += 1;
        if !replied {
            self.net.stats.credits_sent += 1;
            let t = Tag {
                kind: Kind::Credit,
                ..tag
            };
            self.net.answer(src, t, [0; 4])?;
        }
        Ok(())
    }

    /// An answer: settles its request (if it is one of ours), then runs
    /// the reply handler or gives a refusal to the error handler.
    fn answer(&mut self, src: Address, tag: Tag, body: &Body) {
        let mut b = [0u8; WORDS_BYTES];
        let len = body.len();
        if len == WORDS_BYTES {
            self.net.read(body, 0, &mut b);
        }
        let words = match wire::decode_words(&b) {
            Some(w) if len == WORDS_BYTES => w,
            _ => {
                self.net.stats.foreign += 1;
                return;
            }
        };
        let Some(o) = self.net.credits.settle(tag.slot, tag.generation, Some(src)) else {
            self.net.stats.stray += 1;
            return;
        };
        match tag.kind {
            Kind::Reply => match self.replies[usize::from(tag.handler)].as_mut() {
                Some(h) => {
                    self.net.stats.replies_handled += 1;
                    h(&Message {
                        src,
                        handler: tag.handler,
                        words,
                        offset: 0,
                        data: &[],
                    });
                }
                None => self.net.stats.unhandled_replies += 1,
            },
            Kind::Refused => self.give_back(&Returned {
                dest: o.dest,
                kind: o.kind,
                handler: o.handler,
                words: Some(o.words),
                reason: ReturnReason::Refused(words[0]),
            }),
            _ => {}
        }
    }
}

impl Net {
    /// Sends a request or transfer in a free slot (`WouldBlock` if none,
    /// or if the send ring is full: the slot is free again then).
    fn request(
        &mut self,
        dest: Address,
        kind: Kind,
        handler: u8,
        words: [u64; 4],
        offset: u64,
        data: &[u8],
    ) -> Result<(), Error> {
        let o = Outstanding {
            dest,
            kind,
            handler,
            words,
        };
        let (slot, generation) = self.credits.take(o).ok_or(Error::WouldBlock)?;
        let tag = Tag {
            handler,
            kind,
            slot,
            generation,
        }
        .encode();
        let id = u64::from(slot) | u64::from(generation) << 8;
        let sent = match kind {
            Kind::Xfer => {
                let header = wire::encode_xfer_header(&words, offset);
                let total = XFER_HEADER + data.len();
                if total <= ulnic_abi::INLINE_MAX as usize {
                    let mut b = [0u8; ulnic_abi::INLINE_MAX as usize];
                    b[..XFER_HEADER].copy_from_slice(&header);
                    b[XFER_HEADER..total].copy_from_slice(data);
                    self.ep.post_send_inline(dest, tag, &b[..total], id)
                } else {
                    let at = u64::from(slot) * self.buffer;
                    self.ep.write_segment(at as usize, &header);
                    self.ep.write_segment(at as usize + XFER_HEADER, data);
                    self.ep.post_send(dest, tag, at, total as u32, id, false)
                }
            }
            _ => self
                .ep
                .post_send_inline(dest, tag, &wire::encode_words(&words), id),
        };
        if sent.is_err() {
            self.credits.settle(slot, generation, None);
        }
        sent
    }

    /// Sends an answer, waiting for send-ring room (events taken meanwhile
    /// are kept for the next poll).
    fn answer(&mut self, dest: Address, tag: Tag, words: [u64; 4]) -> Result<(), Error> {
        let id = ANSWER | (tag.kind as u64) << 8 | u64::from(tag.handler);
        let bytes = wire::encode_words(&words);
        loop {
            match self.ep.post_send_inline(dest, tag.encode(), &bytes, id) {
                Err(Error::WouldBlock) => {
                    while let Some(ev) = self.ep.poll_event() {
                        self.deferred.push_back(ev);
                    }
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// Where a received message's bytes are (nothing is copied yet). A
    /// buffer the device names outside the segment holds nothing.
    fn body(&self, m: &Received) -> Body {
        let len = (m.len as usize).min(self.buffer as usize);
        match m.payload {
            Payload::Inline(b) => Body::Inline(b, len.min(b.len())),
            Payload::Buffer { offset, id } => {
                let fits = offset
                    .checked_add(len as u64)
                    .is_some_and(|end| end <= self.ep.segment_len() as u64);
                Body::Segment {
                    offset: offset as usize,
                    len: if fits { len } else { 0 },
                    id,
                }
            }
        }
    }

    /// Copies `dst.len()` bytes of `body` from `at` on into `dst`; the
    /// caller keeps `at + dst.len() <= body.len()`.
    fn read(&self, body: &Body, at: usize, dst: &mut [u8]) {
        match body {
            Body::Inline(b, _) => dst.copy_from_slice(&b[at..at + dst.len()]),
            Body::Segment { offset, .. } => self.ep.read_segment(offset + at, dst),
        }
    }

    /// Gives a receive buffer back to the free ring once its bytes are read.
    fn release(&mut self, body: &Body) -> Result<(), Error> {
        match *body {
            Body::Segment { offset, id, .. } => {
                self.ep.post_free(offset as u64, self.buffer as u32, id)
            }
            Body::Inline(..) => Ok(()),
        }
    }
}
