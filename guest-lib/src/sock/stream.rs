//! A stream connection (docs/sockets.md §3-4): bytes in order over one
//! endpoint per side, credit flow control, orderly and abortive ends.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ulnic_abi::INLINE_MAX;
use zerocopy::IntoBytes;

use crate::endpoint::{Endpoint, LINGER};
use crate::error::Error;
use crate::sock::addr::{visible_port, Ready, SockAddr, Wakes, CONN_BASE, CONN_PORTS, LISTEN_BASE};
use crate::sock::flusher::{self, Flushable};
use crate::sock::held::Held;
use crate::sock::net::{Net, Shape};
use crate::sock::wait;
use crate::sock::wire::{self, Hello};
use crate::types::{Address, Event, SendError};
use crate::FilterEntry;

pub(crate) mod handle;
mod state;

/// User ids of the messages whose fate matters.
const ID_CONNECT: u64 = 1;
const ID_FIN: u64 = 2;
const ID_KEEPALIVE: u64 = 3;

/// How long a closing connection waits for its peer to take more of what
/// was written before it gives up and resets.
const STALLED: Duration = Duration::from_secs(10);

/// How long a connection may hear nothing from its peer before it sends a
/// keepalive (docs/sockets.md §4).
const KEEPALIVE: Duration = Duration::from_secs(1);

/// An `io::Error` for `errno`.
pub(crate) fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// The library's error as an `io::Error`.
pub(crate) fn io_err(e: Error) -> io::Error {
    errno(e.errno())
}

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// CONNECT sent; waiting for its delivery until the deadline.
    Connecting { deadline: Instant },
    /// Connected: the CONNECT is in the listener's queue (the device
    /// delivered it), as a TCP client is once its handshake put it in the
    /// accept queue. Writes wait in the send buffer for the ACCEPT.
    Queued,
    /// Connected and accepted: the peer's hello came.
    Open,
    /// The connect failed (errno); reported once, then `ENOTCONN`.
    Failed(i32),
}

/// Our FIN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fin {
    /// Not asked for.
    No,
    /// Asked for; posted when the send ring has room.
    Wanted,
    /// Posted; its completion not yet seen.
    Posted,
    /// Delivered (or its send failed: the connection is gone anyway).
    Done,
}

/// What `shutdown` shuts.
///
/// ```
/// let how = ulnic::sock::Shutdown::Write;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// No more reads: what arrives is discarded.
    Read,
    /// No more writes: the peer reads end of stream after what was sent.
    Write,
    /// Both.
    Both,
}

/// The state of a connection, shared with the flusher thread.
pub(crate) struct Core {
    ep: Endpoint,
    net: Net,
    /// This side's buffers (chosen when it was made).
    shape: Shape,
    local: SockAddr,
    peer: SockAddr,
    /// Where our messages go: the listener while connecting, then the
    /// peer's connection endpoint.
    peer_ep: Address,
    /// The session id of the peer's connection endpoint (spec §5.4; 0
    /// while connecting): a message from an earlier holder of its port,
    /// such as that holder's late close message, is not the peer's.
    peer_session: u32,
    phase: Phase,
    /// DATA messages we may still send.
    credits: u32,
    /// Credits we owe the peer (messages consumed, not yet announced).
    owed: u32,
    /// The largest DATA the peer takes.
    peer_buffer: u32,
    /// Received DATA not yet read, in order.
    queue: VecDeque<Held>,
    /// Bytes of the front of `queue` already read.
    head_used: u32,
    /// The peer's FIN came (after everything in `queue`).
    fin_in: bool,
    /// The connection was reset (RST, the peer's close message, a send
    /// that failed or came back): reads fail once the queue is read.
    reset: bool,
    /// The reset was reported to a read.
    reset_told: bool,
    /// What a reset reports: ECONNRESET, or ETIMEDOUT when the transport
    /// gave up on the peer's node (docs/sockets.md §4).
    reset_errno: i32,
    /// When the peer was last heard from (any message of its).
    last_heard: Instant,
    /// When this side last sent a keepalive.
    keepalive_at: Option<Instant>,
    /// A keepalive not yet delivered: no second one is sent meanwhile
    /// (a peer that does not read would otherwise have its ring filled).
    keepalive_out: bool,
    fin_out: Fin,
    shut_read: bool,
    /// Registered with the flusher (bytes wait).
    watched: bool,
    /// Bytes written while the peer had no credit for them, waiting to
    /// go (in order, before anything written later; the FIN after them).
    pending: Vec<u8>,
    /// How much of `pending` went already.
    pending_sent: usize,
    /// Messages dropped for coming from a stranger or making no sense.
    stray: u64,
    /// DATA messages queued for reading so far (`Wakes::input`).
    arrivals: u64,
    /// A write found no room; cleared (and `space_wakes` counted) when
    /// there is room again.
    no_space: bool,
    /// Times there was room again after `no_space` (`Wakes::output`).
    space_wakes: u64,
    /// Aborted by its program before it was accepted: once accepted, what
    /// was written goes, then the RST (as TCP's, whose bytes had gone).
    aborting: bool,
    /// Closed by its program before it was accepted: the flusher finishes
    /// it (sends what was written and the FIN once the ACCEPT comes) until
    /// then, as a kernel keeps an orphaned socket.
    orphan_until: Option<Instant>,
    /// `shutdown` calls, failed ones too: each wakes every waiter, as the
    /// kernel's does.
    shutdowns: u64,
}

impl Core {
    fn start_connect(net: &Net, to: SockAddr, port: Option<u16>) -> io::Result<Core> {
        if to.port == 0 || to.node >= net.nodes() {
            return Err(errno(if to.port == 0 {
                libc::EINVAL
            } else {
                libc::ENETUNREACH
            }));
        }
        let (mut ep, k, shape) = net.stream_endpoint().map_err(io_err)?;
        let local = SockAddr {
            node: net.node(),
            port: port.unwrap_or_else(|| visible_port(k)),
        };
        let cfg = *net.config();
        let listener = Address {
            node: to.node,
            port: LISTEN_BASE + u32::from(to.port),
        };
        post_connect(&mut ep, listener, shape, local.port)?;
        Ok(Core::new(
            (ep, shape),
            net,
            local,
            to,
            listener,
            Phase::Connecting {
                deadline: Instant::now() + cfg.connect_timeout,
            },
        ))
    }

    fn accepted(
        net: &Net,
        client: Address,
        session: u32,
        hello: Hello,
        port: u16,
    ) -> io::Result<Core> {
        let (mut ep, _, shape) = net.stream_endpoint().map_err(io_err)?;
        ep.set_filter(&[only(client)]).map_err(io_err)?;
        ep.set_close_message(client, wire::tag(wire::RST, 0), &[])
            .map_err(io_err)?;
        let mine = Hello::new(shape.credits, shape.buffer, port);
        post_inline(
            &mut ep,
            client,
            wire::tag(wire::ACCEPT, 0),
            mine.as_bytes(),
            0,
        )?;
        let local = SockAddr {
            node: net.node(),
            port,
        };
        let peer = SockAddr {
            node: client.node,
            port: hello.port.get(),
        };
        let mut s = Core::new((ep, shape), net, local, peer, client, Phase::Open);
        s.peer_session = session;
        s.credits = hello.credits.get();
        s.peer_buffer = hello.buffer.get();
        Ok(s)
    }

    fn new(
        (ep, shape): (Endpoint, Shape),
        net: &Net,
        local: SockAddr,
        peer: SockAddr,
        peer_ep: Address,
        phase: Phase,
    ) -> Core {
        Core {
            ep,
            net: net.clone(),
            shape,
            local,
            peer,
            peer_ep,
            peer_session: 0,
            phase,
            credits: 0,
            owed: 0,
            peer_buffer: INLINE_MAX,
            queue: VecDeque::new(),
            head_used: 0,
            fin_in: false,
            reset: false,
            reset_told: false,
            reset_errno: libc::ECONNRESET,
            last_heard: Instant::now(),
            keepalive_at: None,
            keepalive_out: false,
            fin_out: Fin::No,
            shut_read: false,
            watched: false,
            pending: Vec::new(),
            pending_sent: 0,
            stray: 0,
            arrivals: 0,
            no_space: false,
            space_wakes: 0,
            aborting: false,
            orphan_until: None,
            shutdowns: 0,
        }
    }

    pub(crate) fn local_addr(&self) -> SockAddr {
        self.local
    }

    pub(crate) fn peer_addr(&self) -> SockAddr {
        self.peer
    }

    pub(crate) fn is_connected(&mut self) -> bool {
        self.progress();
        self.connected()
    }

    /// Connected, accepted or not yet.
    fn connected(&self) -> bool {
        matches!(self.phase, Phase::Open | Phase::Queued)
    }

    pub(crate) fn available(&mut self) -> usize {
        self.progress();
        let total: usize = self.queue.iter().map(|h| h.len() as usize).sum();
        total - self.head_used as usize
    }

    pub(crate) fn stray(&self) -> u64 {
        self.stray
    }

    pub(crate) fn take_error(&mut self) -> Option<i32> {
        self.progress();
        match self.phase {
            Phase::Failed(e) if e != 0 => {
                self.phase = Phase::Failed(0);
                Some(e)
            }
            _ if self.reset && !self.reset_told && self.queue.is_empty() => {
                self.reset_told = true;
                Some(self.reset_errno)
            }
            _ => None,
        }
    }

    /// Takes what arrived into the socket: data into the queue, credits,
    /// the handshake's answer, ends and resets; the outcome of sends.
    fn progress(&mut self) {
        // The outcome of sends first: a CONNECT delivered before the
        // listener's REFUSE came is a connection reset, not refused.
        self.take_events();
        let mut heard = false;
        while let Some(m) = self.ep.poll_recv() {
            heard |= self.is_peer(&m);
            let held = Held::of(&m);
            let consumed = self.take(&m, held);
            if !consumed {
                self.give_back(held);
            }
        }
        if heard {
            // Once per look, not per message: the clock is read here only.
            self.last_heard = Instant::now();
        }
        self.take_events();
        self.keep_alive();
        if let Phase::Connecting { deadline } = self.phase {
            if Instant::now() >= deadline {
                self.phase = Phase::Failed(libc::ETIMEDOUT);
            }
        }
        self.flush();
        if self.fin_out == Fin::Wanted && self.unsent() == 0 {
            self.post_fin();
        }
        // DATA consumed as it came (after shutdown(SHUT_RD)) owes credit.
        self.return_due_credits();
    }

    /// Takes the outcome of sends (and the fabric's word on the peer's
    /// node) from the event queue.
    fn take_events(&mut self) {
        while let Some(ev) = self.ep.poll_event() {
            match ev {
                Event::SendDone { id: ID_CONNECT } => {
                    if let Phase::Connecting { .. } = self.phase {
                        self.phase = Phase::Queued;
                        self.last_heard = Instant::now();
                    }
                }
                // The listener's backlog and ring are full: the transport
                // retried it and gave up. Sent again until the deadline,
                // as TCP retransmits a SYN a full listener dropped.
                Event::SendFailed {
                    id: ID_CONNECT,
                    reason: SendError::NoBuffer,
                    ..
                } if matches!(self.phase, Phase::Connecting { .. }) => {
                    let (to, shape, port) = (self.peer_ep, self.shape, self.local.port);
                    if post_connect(&mut self.ep, to, shape, port).is_err() {
                        self.phase = Phase::Failed(libc::ENOBUFS);
                    }
                }
                Event::SendDone { id: ID_FIN } => self.fin_out = Fin::Done,
                Event::SendDone { id: ID_KEEPALIVE } => self.keepalive_out = false,
                // A keepalive the peer had no room for: it is there, and
                // not reading; that is no reason to end the connection.
                Event::SendFailed {
                    id: ID_KEEPALIVE,
                    reason: SendError::NoBuffer,
                    ..
                } => self.keepalive_out = false,
                // Our FIN to a peer that ended and closed already: its
                // endpoint is gone, as a TCP peer's socket is once both
                // FINs crossed. Not an error (TCP's orphan takes the FIN).
                Event::SendFailed {
                    id: ID_FIN,
                    reason: SendError::NoEndpoint,
                    ..
                } if self.fin_in => self.fin_out = Fin::Done,
                Event::SendFailed { id, reason, .. } => {
                    if id == ID_KEEPALIVE {
                        self.keepalive_out = false;
                    }
                    if id == ID_FIN {
                        self.fin_out = Fin::Done;
                    }
                    match self.phase {
                        Phase::Connecting { .. } if id == ID_CONNECT => {
                            self.phase = Phase::Failed(match reason {
                                SendError::NoEndpoint => libc::ECONNREFUSED,
                                SendError::Unreachable => libc::EHOSTUNREACH,
                                r => r.errno(),
                            });
                        }
                        Phase::Open | Phase::Queued => {
                            if reason == SendError::Unreachable {
                                self.reset_errno = libc::ETIMEDOUT;
                            }
                            self.reset = true;
                        }
                        _ => {}
                    }
                }
                Event::Unreachable { node }
                    if node == self.peer_ep.node && self.connected() && !self.reset =>
                {
                    self.reset_errno = libc::ETIMEDOUT;
                    self.reset = true;
                }
                _ => {}
            }
        }
    }

    /// After `KEEPALIVE` without a word from the peer, sends it a CREDIT of
    /// nothing (once per `KEEPALIVE`, and only once the last was
    /// delivered): a peer on a node the transport gives up on makes the
    /// send fail UNREACHABLE, and the connection fails with ETIMEDOUT
    /// instead of waiting for ever (docs/sockets.md §4).
    ///
    /// While queued, the keepalive goes to the listener (which ignores
    /// it): a listener whose endpoint is gone (its program died) makes it
    /// fail NO_ENDPOINT, which resets the connection.
    fn keep_alive(&mut self) {
        if !self.connected() || self.reset || self.keepalive_out || self.ep.send_space() == 0 {
            return;
        }
        let now = Instant::now();
        let quiet = |t: Instant| now.saturating_duration_since(t) >= KEEPALIVE;
        if quiet(self.last_heard) && self.keepalive_at.is_none_or(quiet) {
            let tag = wire::tag(wire::CREDIT, 0);
            let to = self.peer_ep;
            if self
                .ep
                .post_send_inline_completion(to, tag, &[], ID_KEEPALIVE)
                .is_ok()
            {
                self.keepalive_at = Some(now);
                self.keepalive_out = true;
            }
        }
    }

    /// Something waits to leave: bytes, or a FIN waiting for them or for
    /// the ACCEPT.
    fn has_waiting(&self) -> bool {
        let fin_waits = self.fin_out == Fin::Wanted;
        (self.unsent() > 0 || fin_waits) && self.connected() && !self.reset
    }

    /// Bytes written and not yet sent (waiting for credit).
    fn unsent(&self) -> usize {
        self.pending.len() - self.pending_sent
    }

    /// The most bytes writes may leave waiting for credit: twice what
    /// the peer's credits carry, as a kernel's send buffer holds more than
    /// the window.
    fn send_buffer(&self) -> usize {
        2 * self.shape.credits as usize * self.message_max()
    }

    /// The largest DATA this side sends: what the peer's buffers hold
    /// (its hello says; a peer's word, so no more than this side's own
    /// send slots hold either).
    fn message_max(&self) -> usize {
        if self.phase == Phase::Queued {
            // Not known yet: what is written before the ACCEPT is cut to
            // the peer's size when it goes.
            return self.shape.buffer.max(INLINE_MAX) as usize;
        }
        self.peer_buffer.min(self.shape.buffer).max(INLINE_MAX) as usize
    }

    /// Sends one message of `bytes` (at most the peer's buffer), taking a
    /// credit: false when the ring has no room.
    fn send_message(&mut self, bytes: &[u8]) -> io::Result<bool> {
        // The slot is the ring position's: with the ring full, the send
        // that last used it is not done yet, so nothing may be written.
        if self.ep.send_space() == 0 {
            return Ok(false);
        }
        let tag = wire::tag(wire::DATA, self.owed);
        // The send that fills the ring asks for its completion, whose
        // event notifies a writer waiting for room (the ring's consumer
        // moving notifies nobody).
        let last = self.ep.send_space() == 1;
        let posted = if bytes.len() <= INLINE_MAX as usize && last {
            self.ep
                .post_send_inline_completion(self.peer_ep, tag, bytes, 0)
        } else if bytes.len() <= INLINE_MAX as usize {
            self.ep.post_send_inline(self.peer_ep, tag, bytes, 0)
        } else {
            let slot = self.shape.send_slot(self.ep.send_position());
            self.ep.write_segment(slot as usize, bytes);
            self.ep
                .post_send(self.peer_ep, tag, slot, bytes.len() as u32, 0, last)
        };
        match posted {
            Ok(()) => {
                self.owed = 0;
                self.credits -= 1;
                Ok(true)
            }
            Err(Error::WouldBlock) => Ok(false),
            Err(e) => Err(io_err(e)),
        }
    }

    /// Sends what waits for credit, as far as credit and ring room go.
    fn flush(&mut self) {
        // Sent straight from the buffer (taken out for the loop, so
        // send_message may borrow the rest of self), not from a copy.
        let pending = std::mem::take(&mut self.pending);
        while pending.len() > self.pending_sent
            && self.credits > 0
            && self.phase == Phase::Open
            && !self.reset
        {
            let n = (pending.len() - self.pending_sent).min(self.message_max());
            match self.send_message(&pending[self.pending_sent..self.pending_sent + n]) {
                Ok(true) => self.pending_sent += n,
                Ok(false) => break,
                Err(_) => {
                    self.reset = true;
                    break;
                }
            }
        }
        self.pending = pending;
        if self.pending_sent == self.pending.len() {
            self.pending.clear();
            self.pending_sent = 0;
        } else if self.pending_sent > self.pending.len() / 2 {
            self.pending.drain(..self.pending_sent);
            self.pending_sent = 0;
        }
    }

    /// Takes message `m` in; false when it is not kept (its buffer goes
    /// back at once).
    fn take(&mut self, m: &crate::Received, held: Held) -> bool {
        let (kind, credits) = wire::untag(m.tag);
        if m.returned {
            // One of ours came back: the peer never got it. A keepalive
            // (a CREDIT of nothing) only met a full ring.
            let keepalive = kind == wire::CREDIT && credits == 0;
            self.reset |= self.phase == Phase::Open && !keepalive;
            return false;
        }
        match self.phase {
            Phase::Connecting { .. } | Phase::Queued => {
                if m.src.node != self.peer_ep.node {
                    self.stray += 1;
                } else if kind == wire::ACCEPT && is_conn_port(m.src.port) {
                    match (held, Hello::parse(&inline_bytes(held))) {
                        (Held::Inline { .. }, Some(h)) => self.opened(m.src, m.session, h),
                        _ => self.stray += 1,
                    }
                } else if kind == wire::REFUSE && m.src == self.peer_ep {
                    // Refused before it was delivered, or reset after: the
                    // listener closed, or could not make the connection.
                    if self.phase == Phase::Queued {
                        self.reset = true;
                    } else {
                        self.phase = Phase::Failed(libc::ECONNREFUSED);
                    }
                } else {
                    self.stray += 1;
                }
                false
            }
            Phase::Open if !self.is_peer(m) => {
                self.stray += 1;
                false
            }
            Phase::Open if m.close => {
                self.reset = true;
                false
            }
            Phase::Open => {
                self.credits = self.credits.saturating_add(credits);
                match kind {
                    wire::DATA if self.shut_read || held.len() == 0 => {
                        // Consumed at once: its credit goes back.
                        self.owed += 1;
                        false
                    }
                    wire::DATA => {
                        self.queue.push_back(held);
                        self.arrivals += 1;
                        true
                    }
                    wire::CREDIT => false,
                    wire::FIN => {
                        self.fin_in = true;
                        false
                    }
                    // Both ends had ended: as TCP's closed socket, nothing
                    // is left to reset.
                    wire::RST if self.ended_both_ways() => false,
                    wire::RST => {
                        self.reset = true;
                        false
                    }
                    _ => {
                        self.stray += 1;
                        false
                    }
                }
            }
            Phase::Failed(_) => false,
        }
    }

    /// Whether `m` is from the peer's connection endpoint: its address
    /// and, once open, its session.
    fn is_peer(&self, m: &crate::Received) -> bool {
        m.src == self.peer_ep && (self.peer_session == 0 || m.session == self.peer_session)
    }

    /// The ACCEPT from `server`'s connection endpoint (session `session`)
    /// came: connected.
    fn opened(&mut self, server: Address, session: u32, h: Hello) {
        self.peer_ep = server;
        self.peer_session = session;
        self.credits = h.credits.get();
        self.peer_buffer = h.buffer.get();
        self.phase = Phase::Open;
        // Only the peer from now on; our death resets it. A forked child
        // of a host-attached process cannot set a filter (commands are
        // its parent's, spec §2.4): the session check alone keeps
        // strangers out then.
        let filtered = match self.ep.set_filter(&[only(server)]) {
            Err(e) if e.is_forked_child() => Ok(()),
            r => r,
        };
        let farewell = self
            .ep
            .set_close_message(server, wire::tag(wire::RST, 0), &[]);
        if filtered.is_err() || farewell.is_err() {
            // Without them the connection is not what the protocol says.
            self.reset = true;
        }
    }

    fn give_back(&mut self, held: Held) {
        let size = self.shape.buffer;
        if held.release(&mut self.ep, size).is_err() {
            self.reset = true;
        }
    }

    pub(crate) fn poll(&mut self) -> Ready {
        self.progress();
        let mut r = Ready::NONE;
        match self.phase {
            Phase::Connecting { .. } => {}
            Phase::Failed(e) => {
                r = Ready::WRITE | Ready::HUP;
                if e != 0 {
                    r |= Ready::ERROR;
                }
            }
            Phase::Open | Phase::Queued => {
                if self.reset {
                    // As TCP's after a reset: both directions shut.
                    r = Ready::READ | Ready::WRITE | Ready::HUP | Ready::READ_HUP;
                    if !self.reset_told {
                        r |= Ready::ERROR;
                    }
                    return r;
                }
                if !self.queue.is_empty() || self.fin_in || self.shut_read {
                    r |= Ready::READ;
                }
                if self.fin_in {
                    r |= Ready::READ_HUP;
                }
                if self.fin_out != Fin::No {
                    r |= Ready::WRITE; // a write says EPIPE
                    if self.fin_in {
                        r |= Ready::HUP;
                    }
                } else if self.unsent() < self.send_buffer() {
                    r |= Ready::WRITE;
                    if self.no_space {
                        self.no_space = false;
                        self.space_wakes += 1;
                    }
                }
            }
        }
        r
    }

    /// Returns the credits owed in a CREDIT message once they are half
    /// the peer's window; fewer ride on the next DATA or FIN. The peer
    /// then always has credit for a message we have not consumed yet or
    /// more than half its window, so it never waits for a CREDIT that
    /// does not come; and a request-response exchange sends no CREDIT at
    /// all (each would cost the peer a wake-up for nothing).
    fn return_due_credits(&mut self) {
        if self.owed >= self.shape.credits.div_ceil(2) {
            self.return_credits();
        }
    }

    /// Sends every credit owed in a CREDIT message, if there are any and
    /// the ring has room (else they go with the next message).
    fn return_credits(&mut self) {
        if self.owed > 0 && self.phase == Phase::Open && !self.reset && self.ep.send_space() > 0 {
            let tag = wire::tag(wire::CREDIT, self.owed);
            if self.ep.post_send_inline(self.peer_ep, tag, &[], 0).is_ok() {
                self.owed = 0;
            }
        }
    }

    pub(crate) fn try_read(&mut self, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        self.progress();
        match self.phase {
            Phase::Connecting { .. } => return Err(io::ErrorKind::WouldBlock.into()),
            Phase::Failed(_) => return Err(errno(libc::ENOTCONN)),
            Phase::Open | Phase::Queued => {}
        }
        let mut n = 0;
        let mut used = self.head_used;
        let mut i = 0;
        while n < buf.len() {
            let Some(h) = self.queue.get(i).copied() else {
                break;
            };
            let got = h.copy_out(&self.ep, used, &mut buf[n..]);
            n += got;
            used += got as u32;
            if used < h.len() {
                break;
            }
            used = 0;
            if peek {
                i += 1;
            } else {
                self.queue.pop_front();
                self.give_back(h);
                self.owed += 1;
            }
        }
        if !peek {
            self.head_used = used;
            self.return_due_credits();
        }
        if n > 0 || buf.is_empty() {
            return Ok(n);
        }
        // The peer's FIN first: an end it said in order stays an end,
        // whatever broke after it (our credits to a peer that has gone).
        if self.fin_in || self.shut_read {
            return Ok(0);
        }
        if self.reset {
            if !self.reset_told {
                self.reset_told = true;
                return Err(errno(self.reset_errno));
            }
            return Ok(0);
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    pub(crate) fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.progress();
        match self.phase {
            Phase::Connecting { .. } => return Err(io::ErrorKind::WouldBlock.into()),
            Phase::Failed(_) => return Err(errno(libc::ENOTCONN)),
            Phase::Open | Phase::Queued => {}
        }
        if self.reset && self.reset_errno == libc::ETIMEDOUT && !self.reset_told {
            // As over TCP: the timeout is reported once, then EPIPE.
            self.reset_told = true;
            return Err(errno(libc::ETIMEDOUT));
        }
        if self.reset || self.fin_out != Fin::No {
            return Err(errno(libc::EPIPE));
        }
        let mut sent = 0;
        // Straight out while there is credit and nothing waits before it.
        while self.unsent() == 0 && sent < buf.len() && self.credits > 0 {
            let n = (buf.len() - sent).min(self.message_max());
            if !self.send_message(&buf[sent..sent + n])? {
                break;
            }
            sent += n;
        }
        // The rest waits for credit, as far as the send buffer goes.
        let room = self.send_buffer().saturating_sub(self.unsent());
        let take = room.min(buf.len() - sent);
        self.pending.extend_from_slice(&buf[sent..sent + take]);
        sent += take;
        if sent == 0 && !buf.is_empty() {
            self.no_space = true;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(sent)
    }

    /// The socket's wake-ups so far (after `poll`, which takes in what
    /// arrived).
    pub(crate) fn wakes(&self) -> Wakes {
        let state = [
            !matches!(self.phase, Phase::Connecting { .. }),
            matches!(self.phase, Phase::Failed(_)),
            self.fin_in,
            self.reset,
            self.fin_out == Fin::Done,
        ];
        Wakes {
            input: self.arrivals,
            output: self.space_wakes,
            state: state.iter().map(|&b| u64::from(b)).sum::<u64>() + self.shutdowns,
        }
    }

    pub(crate) fn arm(&mut self) -> io::Result<bool> {
        // No look at the rings first: what that took in would be ready
        // without the caller knowing. The caller looked just before; the
        // arm's own re-check sees anything since.
        self.ep.arm().map_err(io_err)
    }

    pub(crate) fn waiter(&self) -> crate::Waiter {
        self.ep.waiter()
    }

    /// The connection's endpoint: its domain and id.
    pub(crate) fn endpoint(&self) -> (std::sync::Arc<dyn crate::backend::Domain>, u32) {
        (self.ep.dom.clone(), self.ep.id())
    }

    /// When the connection next has something to do by itself, with no
    /// message coming: its keepalive (docs/sockets.md §4) or its connect
    /// deadline. A waiter sleeps no longer than this.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        let connect = match self.phase {
            Phase::Connecting { deadline } => Some(deadline),
            _ => None,
        };
        // A keepalive waits for the last one's delivery (its event
        // notifies) and for ring room (the send that filled the ring asks
        // for its completion).
        let keepalive =
            (self.connected() && !self.reset && !self.keepalive_out && self.ep.send_space() > 0)
                .then(|| {
                    self.keepalive_at
                        .map_or(self.last_heard, |k| k.max(self.last_heard))
                        + KEEPALIVE
                });
        match (connect, keepalive) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        self.progress();
        self.shutdowns += 1;
        // As TCP's: a connection reset, or ended both ways with our FIN
        // delivered, is closed, no longer connected.
        let closed = self.reset || self.ended_both_ways();
        if !self.connected() || closed {
            return Err(errno(libc::ENOTCONN));
        }
        if how != Shutdown::Write {
            self.shut_read = true;
            // What waits unread is consumed: its credits go back.
            while let Some(h) = self.queue.pop_front() {
                self.give_back(h);
                self.owed += 1;
            }
            self.head_used = 0;
        }
        if how != Shutdown::Read && self.fin_out == Fin::No {
            self.fin_out = Fin::Wanted;
            if self.unsent() == 0 {
                self.post_fin();
            }
        }
        Ok(())
    }

    /// Both FINs crossed (the peer's came, ours was delivered): what TCP
    /// calls closed.
    fn ended_both_ways(&self) -> bool {
        self.fin_in && self.fin_out == Fin::Done
    }

    /// Posts the FIN (once accepted: until then it waits, `Fin::Wanted`).
    fn post_fin(&mut self) {
        if self.reset {
            self.fin_out = Fin::Done;
            return;
        }
        if self.phase != Phase::Open {
            return;
        }
        let tag = wire::tag(wire::FIN, self.owed);
        let d = self.peer_ep;
        if self.ep.send_space() > 0 && post_inline(&mut self.ep, d, tag, &[], ID_FIN).is_ok() {
            self.owed = 0;
            self.fin_out = Fin::Posted;
        }
    }

    fn abort(&mut self) {
        self.progress();
        if self.phase == Phase::Queued && !self.reset {
            // Finished when the ACCEPT comes (the drop that follows
            // leaves it to the flusher).
            self.aborting = true;
            return;
        }
        self.reset_peer();
    }

    /// Sends RST (if connected and not already reset) and withdraws the
    /// close message that would say the same.
    fn reset_peer(&mut self) {
        if self.phase == Phase::Open && !self.reset {
            let d = self.peer_ep;
            let _ = post_inline(&mut self.ep, d, wire::tag(wire::RST, 0), &[], 0);
            self.reset = true;
        }
        self.ep.clear_close_message();
    }

    /// One look at a connection its program closed before it was
    /// accepted: true while it still has something to do (wait for the
    /// ACCEPT, send what was written, the FIN). Once done, or at its
    /// deadline, it is closed as [`Core::close`] would.
    fn finish_orphan(&mut self) -> bool {
        self.progress();
        let expired = self.orphan_until.is_none_or(|t| Instant::now() >= t);
        let busy = match self.phase {
            Phase::Queued => !self.reset,
            Phase::Open => {
                let unread = !self.queue.is_empty() && !self.ended_both_ways();
                if unread || (self.aborting && self.unsent() == 0) {
                    // Aborted, or its program will not read what came.
                    self.reset_peer();
                }
                !self.reset && self.fin_out != Fin::Done
            }
            _ => false,
        };
        if busy && !expired {
            return true;
        }
        if busy && self.phase == Phase::Open {
            self.reset_peer();
        }
        self.ep.clear_close_message();
        false
    }

    /// An orderly close: FIN after everything sent, then (for at most
    /// `LINGER`) waiting for it to be delivered; a reset instead when data
    /// was left unread.
    fn close(&mut self) {
        self.progress();
        if self.phase != Phase::Open || self.reset {
            self.ep.clear_close_message();
            return;
        }
        if !self.queue.is_empty() && !self.ended_both_ways() {
            self.reset_peer();
            return;
        }
        if self.fin_out == Fin::No {
            self.fin_out = Fin::Wanted;
        }
        // What was written goes before the FIN, however slowly the peer
        // reads: the close waits while bytes keep leaving, and gives up
        // (a reset, so the peer knows) only when none has left for
        // `STALLED` or the connection broke.
        let mut last = (self.unsent(), Instant::now());
        loop {
            self.progress();
            if self.fin_out == Fin::Done || self.reset {
                break;
            }
            let now = Instant::now();
            if self.unsent() != last.0 {
                last = (self.unsent(), now);
            }
            let limit = if self.unsent() > 0 { STALLED } else { LINGER };
            if now.duration_since(last.1) > limit {
                if self.unsent() > 0 {
                    self.reset_peer();
                }
                break;
            }
            // Woken by the FIN's completion or the peer's credit; the
            // clock ends it only at the limit.
            let left = (last.1 + limit).saturating_duration_since(now);
            let _ = self.ep.wait(left + Duration::from_millis(1));
        }
        self.ep.clear_close_message();
    }
}

impl Flushable for Mutex<Core> {
    fn try_flush(&self) -> bool {
        // Held by its program only briefly (never across a sleep).
        let mut c = self.lock().unwrap_or_else(|p| p.into_inner());
        if c.orphan_until.is_some() {
            return c.finish_orphan();
        }
        c.progress();
        let waiting = c.has_waiting();
        c.watched = waiting;
        waiting
    }

    fn watch_arm(&self, w: &crate::watcher::Watcher) -> bool {
        let mut c = self.lock().unwrap_or_else(|p| p.into_inner());
        let (dom, id) = c.endpoint();
        if w.watch_id(&dom, id).is_err() {
            return true; // cannot be woken: look again
        }
        c.arm().unwrap_or(true)
    }

    fn unwatch(&self, w: &crate::watcher::Watcher) {
        let c = self.lock().unwrap_or_else(|p| p.into_inner());
        let (dom, id) = c.endpoint();
        let _ = w.unwatch_id(&dom, id);
    }

    fn next_timer(&self) -> Option<Instant> {
        let c = self.lock().unwrap_or_else(|p| p.into_inner());
        match (c.next_timer(), c.orphan_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn new_watcher(&self) -> Option<std::sync::Arc<crate::watcher::Watcher>> {
        let c = self.lock().unwrap_or_else(|p| p.into_inner());
        crate::watcher::Watcher::of(&c.ep.dom).ok()
    }
}

/// A filter entry letting only `a` in.
fn only(a: Address) -> FilterEntry {
    FilterEntry {
        node: a.node,
        port: a.port,
        tag: 0,
        tag_mask: 0,
    }
}

/// Whether `port` is some side's connection port.
fn is_conn_port(port: u32) -> bool {
    port > CONN_BASE && port < CONN_BASE + CONN_PORTS
}

/// The bytes of an inline message (none for a buffer).
fn inline_bytes(h: Held) -> Vec<u8> {
    match h {
        Held::Inline { data, len } => data[..len as usize].to_vec(),
        Held::Buffer { .. } => Vec::new(),
    }
}

/// Sends CONNECT with this side's hello to the listener `to`, asking for
/// its completion (its delivery connects).
fn post_connect(ep: &mut Endpoint, to: Address, shape: Shape, port: u16) -> io::Result<()> {
    let hello = Hello::new(shape.credits, shape.buffer, port);
    let tag = wire::tag(wire::CONNECT, 0);
    post_inline(ep, to, tag, hello.as_bytes(), ID_CONNECT)
}

/// Posts an inline message with user id `id`, and a completion for the
/// CONNECT and the FIN (whose delivery the connect and a close wait for).
pub(crate) fn post_inline(
    ep: &mut Endpoint,
    to: Address,
    tag: u32,
    bytes: &[u8],
    id: u64,
) -> io::Result<()> {
    let r = if id == ID_FIN || id == ID_CONNECT {
        ep.post_send_inline_completion(to, tag, bytes, id)
    } else {
        ep.post_send_inline(to, tag, bytes, id)
    };
    r.map_err(io_err)
}
