//! The provider's data path over one ulnic endpoint (docs/libfabric.md
//! §2): messages cut into packets and sent from send slots in the
//! endpoint's segment, packets put back in order per sender, matched
//! against posted receives (FIFO, tags with ignore bits), kept as
//! unexpected messages when nothing matches, and completions handed back
//! to the caller. It knows nothing of libfabric's objects; `ep` does.
//! Remote memory access is in `rma`.

mod rma;
mod rma_state;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use ulnic::{
    Address, Endpoint, EndpointConfig, Error, Event, Payload, ProtectionDomain, SendError,
};
use zerocopy::IntoBytes;

use crate::mr::MrTable;
use crate::wire::{
    Header, FLAG_DATA, HEADER, KIND_MSG, KIND_READ_REQ, KIND_SHUTDOWN, KIND_TAGGED, KIND_WRITE,
    MAGIC, WINDOW,
};
use rma_state::{Incoming, RmaTarget};

#[cfg(test)]
mod tests;

/// Bytes of one packet buffer (header included).
pub const PACKET: usize = 64 << 10;
/// Payload bytes one packet carries.
pub const CHUNK: usize = PACKET - HEADER;
/// Receive buffers posted to the device.
const RX_BUFFERS: u32 = 32;
/// Send slots: packets in flight at once.
const TX_SLOTS: u32 = 32;
/// Messages (sends and receives) the caller may have outstanding.
pub const QUEUE_DEPTH: usize = 1024;
/// The largest message: libfabric's programs try 1 MiB.
pub const MAX_MESSAGE: usize = 1 << 30;
/// Ports the provider binds: `PORT_BASE + k` (docs/libfabric.md §1).
pub const PORT_BASE: u32 = 0x4600_0000;
/// Packets taken off the receive ring per progress call, so one busy
/// peer does not starve the caller.
const RX_BATCH: usize = 64;

/// Bytes an endpoint holds for its peers (unexpected messages, and the
/// read responses and acknowledgements it owes) before it stops taking
/// packets off its receive ring (`ULNIC_FI_UNEXPECTED_MAX`, default 64
/// MiB; docs/libfabric.md §2): senders' packets then wait at the device
/// and come back for want of a buffer, to be sent again.
fn unexpected_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("ULNIC_FI_UNEXPECTED_MAX")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(64 << 20)
    })
}

/// What a finished operation reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// A transmit (else a receive).
    pub tx: bool,
    /// The caller's context pointer.
    pub context: usize,
    /// FI_SEND/FI_RECV with FI_MSG/FI_TAGGED (and FI_REMOTE_CQ_DATA).
    pub flags: u64,
    /// Bytes transferred.
    pub len: usize,
    /// The receive buffer (receives only).
    pub buf: usize,
    /// Remote CQ data.
    pub data: u64,
    /// The tag.
    pub tag: u64,
    /// Who sent it (receives only).
    pub src: Address,
    /// An error: positive errno (`FI_ETRUNC`, `FI_EIO`, ...) and the bytes
    /// that did not fit.
    pub error: Option<(i32, usize)>,
    /// Goes to the completion queue (else only counters see it:
    /// selective completion, inject).
    pub report: bool,
}

/// Where the bytes of a send come from.
enum TxData {
    /// Copied at post time (inject).
    Owned(Vec<u8>),
    /// The caller's buffer (its address), valid until the send's
    /// completion: kept as an address so the engine can move between
    /// the threads of an FI_THREAD_SAFE program.
    Borrowed(usize),
}

/// A send not yet finished.
struct TxOp {
    data: TxData,
    len: usize,
    /// Bytes already placed in packets.
    placed: usize,
    /// Packets posted and not yet delivered.
    outstanding: u32,
    dest: Address,
    kind: u8,
    tag: u64,
    cq_data: Option<u64>,
    context: usize,
    /// Report a completion (not for inject).
    report: bool,
    error: Option<i32>,
    /// Header flags beyond `FLAG_DATA`.
    flags: u8,
    /// What its last packet's delivery means.
    then: Then,
}

/// What a send's delivery means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The operation is done (messages).
    Complete,
    /// An RMA write: done when the target acknowledges it.
    AwaitAck,
    /// A read request: the read (this id) is done when the response has
    /// come; only a failure to deliver the request ends it here.
    Read(u64),
    /// A response or acknowledgement: nothing to report.
    Quiet,
}

/// A packet in flight in a send slot.
struct Slot {
    op: u64,
    dest: Address,
    /// Its sequence number to `dest`.
    seq: u32,
    len: usize,
    /// The packet itself when it went inline (kept to send it again).
    inline: Option<Vec<u8>>,
}

/// A posted receive.
#[derive(Debug, Clone)]
pub struct PostedRecv {
    /// The caller's buffer.
    pub buf: usize,
    /// Its length.
    pub len: usize,
    /// Only from this sender.
    pub src: Option<Address>,
    /// Tagged (else untagged).
    pub tagged: bool,
    /// Tag and the bits of it to ignore.
    pub tag: u64,
    /// Ignored tag bits.
    pub ignore: u64,
    /// The caller's context.
    pub context: usize,
    /// Report a completion.
    pub report: bool,
}

impl PostedRecv {
    fn matches(&self, src: Address, tagged: bool, tag: u64) -> bool {
        self.tagged == tagged
            && self.src.is_none_or(|s| s == src)
            && (!tagged || (self.tag ^ tag) & !self.ignore == 0)
    }
}

/// What a peek does to the message it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeekMode {
    /// Only looks (FI_PEEK).
    Look,
    /// Reserves it for a receive with FI_CLAIM (FI_PEEK | FI_CLAIM).
    Claim,
    /// Drops it (FI_PEEK | FI_DISCARD).
    Discard,
}

/// A message that arrived before a receive matched it.
struct Unexpected {
    src: Address,
    tagged: bool,
    tag: u64,
    data: Option<u64>,
    msg_len: usize,
    bytes: Vec<u8>,
    done: bool,
    /// Claimed by a peek with FI_CLAIM (its context): only the receive
    /// with FI_CLAIM and that context takes it.
    claimed: Option<usize>,
}

/// Where the packets of the message a peer is sending now go.
enum Current {
    Posted {
        recv: PostedRecv,
        got: usize,
        tag: u64,
        data: Option<u64>,
        msg_len: usize,
    },
    /// Index-free: the newest unexpected message from this peer.
    Unexpected,
    /// An RMA write into a region (`rma`).
    Write(Incoming),
}

/// What a receiver knows of one sender.
#[derive(Default)]
struct PeerIn {
    /// The sending endpoint's session id (`Received::session`): a later
    /// endpoint on the same port starts its sequence afresh.
    session: u32,
    next: u32,
    stash: BTreeMap<u32, (Header, Vec<u8>)>,
    current: Option<Current>,
}

/// One endpoint's data path.
pub struct Engine {
    ep: Endpoint,
    port: u32,
    slots: Vec<Option<Slot>>,
    free_slots: Vec<u32>,
    retry: VecDeque<u32>,
    ops: HashMap<u64, TxOp>,
    next_op: u64,
    /// Ops with bytes still to place, oldest first.
    pending: VecDeque<u64>,
    seq_out: HashMap<Address, u32>,
    peers: HashMap<Address, PeerIn>,
    posted: VecDeque<PostedRecv>,
    unexpected: VecDeque<Unexpected>,
    /// Bytes the unexpected messages hold.
    unexpected_bytes: usize,
    /// Bytes of the responses and acknowledgements queued to peers.
    owed_bytes: usize,
    /// Past this many bytes held for peers, no packet is taken.
    hold_max: usize,
    control: VecDeque<Control>,
    /// Remote memory access: the domain's regions, reads and writes in
    /// flight.
    rma: RmaTarget,
}

/// A connection-management packet that arrived (FI_EP_MSG): its kind
/// (`wire::KIND_CONNREQ` ...), sender and parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    /// `wire::KIND_*`.
    pub kind: u8,
    /// Who sent it.
    pub from: Address,
    /// Its parameters.
    pub params: Vec<u8>,
}

/// The context of a connection-management send: its failure is reported
/// to the event queue, never to a completion queue.
pub const CONTROL_CONTEXT: usize = usize::MAX;

impl Engine {
    /// An endpoint on `pd`, bound to `port` or else to a free port of the
    /// provider's range, its receive buffers posted.
    pub fn open(
        pd: &ProtectionDomain,
        port: Option<u32>,
        mrs: Arc<MrTable>,
    ) -> Result<Engine, Error> {
        let mut ep = pd.create_endpoint(&EndpointConfig {
            send_entries: TX_SLOTS.next_power_of_two(),
            recv_entries: 512,
            free_entries: RX_BUFFERS.next_power_of_two(),
            segment_bytes: (RX_BUFFERS + TX_SLOTS) as usize * PACKET,
        })?;
        let port = match port {
            Some(p) => {
                ep.bind(p)?;
                p
            }
            None => bind_free(&mut ep)?,
        };
        for i in 0..RX_BUFFERS {
            ep.post_free(u64::from(i) * PACKET as u64, PACKET as u32, u64::from(i))?;
        }
        Ok(Engine {
            ep,
            port,
            slots: (0..TX_SLOTS).map(|_| None).collect(),
            free_slots: (0..TX_SLOTS).rev().collect(),
            retry: VecDeque::new(),
            ops: HashMap::new(),
            next_op: 0,
            pending: VecDeque::new(),
            seq_out: HashMap::new(),
            peers: HashMap::new(),
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            unexpected_bytes: 0,
            owed_bytes: 0,
            hold_max: unexpected_max(),
            control: VecDeque::new(),
            rma: RmaTarget::new(mrs),
        })
    }

    /// The endpoint's address.
    pub fn address(&self, node: u32) -> Address {
        Address {
            node,
            port: self.port,
        }
    }

    /// Takes the next connection-management packet that arrived.
    pub fn take_control(&mut self) -> Option<Control> {
        self.control.pop_front()
    }

    /// Sends a connection-management packet of `kind` with `params`;
    /// its failure comes back as an error completion whose context is
    /// `CONTROL_CONTEXT`.
    pub fn send_control(&mut self, dest: Address, kind: u8, params: &[u8]) -> Result<(), Error> {
        self.queue(
            dest,
            params.as_ptr(),
            params.len(),
            true,
            kind,
            0,
            None,
            CONTROL_CONTEXT,
            false,
        )
    }

    /// Leaves a SHUTDOWN for `peer` with the device, delivered if this
    /// endpoint goes away without saying so (its process dies).
    pub fn set_close_message(&mut self, peer: Address) -> Result<(), Error> {
        self.ep.set_close_message(peer, 0, &[])
    }

    /// Sends left before `send` answers `WouldBlock`.
    pub fn tx_room(&self) -> usize {
        QUEUE_DEPTH.saturating_sub(self.ops.len())
    }

    /// Receives left before `post_recv` answers `WouldBlock`.
    pub fn rx_room(&self) -> usize {
        QUEUE_DEPTH.saturating_sub(self.posted.len())
    }

    /// Queues a message. `data` is either copied now (`owned`) or read
    /// from `ptr` until the completion.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        dest: Address,
        ptr: *const u8,
        len: usize,
        owned: bool,
        tagged: bool,
        tag: u64,
        cq_data: Option<u64>,
        context: usize,
        report: bool,
    ) -> Result<(), Error> {
        let kind = if tagged { KIND_TAGGED } else { KIND_MSG };
        self.queue(dest, ptr, len, owned, kind, tag, cq_data, context, report)
    }

    #[allow(clippy::too_many_arguments)]
    fn queue(
        &mut self,
        dest: Address,
        ptr: *const u8,
        len: usize,
        owned: bool,
        kind: u8,
        tag: u64,
        cq_data: Option<u64>,
        context: usize,
        report: bool,
    ) -> Result<(), Error> {
        if len > MAX_MESSAGE {
            return Err(Error::InvalidArgument("message larger than max_msg_size"));
        }
        if self.ops.len() >= QUEUE_DEPTH {
            return Err(Error::WouldBlock);
        }
        let data = if owned {
            // SAFETY: the caller passes a buffer of `len` readable bytes
            // (libfabric's contract for inject); it is copied before return.
            TxData::Owned(unsafe { slice_or_empty(ptr, len) }.to_vec())
        } else {
            TxData::Borrowed(ptr as usize)
        };
        let op = TxOp {
            data,
            len,
            placed: 0,
            outstanding: 0,
            dest,
            kind,
            tag,
            cq_data,
            context,
            report,
            error: None,
            flags: 0,
            then: Then::Complete,
        };
        self.queue_op(op).map(|_| ())
    }

    /// Queues `op`: its id.
    fn queue_op(&mut self, op: TxOp) -> Result<u64, Error> {
        if op.len > MAX_MESSAGE {
            return Err(Error::InvalidArgument("message larger than max_msg_size"));
        }
        if self.ops.len() >= QUEUE_DEPTH {
            return Err(Error::WouldBlock);
        }
        Ok(self.enqueue(op))
    }

    /// Queues `op` whatever the queue's depth (a response or an
    /// acknowledgement owed to a peer, which must not be lost): its id.
    fn enqueue(&mut self, op: TxOp) -> u64 {
        if matches!(op.then, Then::Quiet) {
            self.owed_bytes += op.len;
        }
        let id = self.next_op;
        self.next_op += 1;
        self.ops.insert(id, op);
        self.pending.push_back(id);
        id
    }

    /// Posts a receive, or completes it at once from an unexpected
    /// message that matches.
    pub fn post_recv(&mut self, r: PostedRecv, out: &mut Vec<Completion>) -> Result<(), Error> {
        if self.posted.len() >= QUEUE_DEPTH {
            return Err(Error::WouldBlock);
        }
        let hit = self
            .unexpected
            .iter()
            .position(|u| u.claimed.is_none() && r.matches(u.src, u.tagged, u.tag));
        let Some(i) = hit else {
            self.posted.push_back(r);
            return Ok(());
        };
        let Some(u) = self.take_unexpected(i) else {
            return Ok(());
        };
        let got = copy_to(&r, 0, &u.bytes);
        if u.done {
            push_rx(out, &r, u.src, u.tag, u.data, u.msg_len);
        } else if let Some(peer) = self.peers.get_mut(&u.src) {
            // The rest of it is still arriving: it goes straight to `r`.
            peer.current = Some(Current::Posted {
                recv: r,
                got,
                tag: u.tag,
                data: u.data,
                msg_len: u.msg_len,
            });
        }
        Ok(())
    }

    /// Takes unexpected message `i` out of the queue.
    fn take_unexpected(&mut self, i: usize) -> Option<Unexpected> {
        let u = self.unexpected.remove(i)?;
        self.unexpected_bytes -= u.bytes.len();
        Some(u)
    }

    /// Looks for an unexpected message matching `r` without taking it
    /// (FI_PEEK): its length, tag, data and sender.
    pub fn peek(
        &mut self,
        r: &PostedRecv,
        how: PeekMode,
    ) -> Option<(usize, u64, Option<u64>, Address)> {
        let i = self
            .unexpected
            .iter()
            .position(|u| u.done && u.claimed.is_none() && r.matches(u.src, u.tagged, u.tag))?;
        let u = &mut self.unexpected[i];
        let found = (u.msg_len, u.tag, u.data, u.src);
        match how {
            PeekMode::Look => {}
            PeekMode::Claim => u.claimed = Some(r.context),
            PeekMode::Discard => {
                self.take_unexpected(i);
            }
        }
        Some(found)
    }

    /// FI_CLAIM: the message a peek claimed with `r.context` goes into
    /// `r` (or with `discard` nowhere), completing `r`; false if no
    /// message is claimed with that context.
    pub fn take_claimed(
        &mut self,
        r: PostedRecv,
        discard: bool,
        out: &mut Vec<Completion>,
    ) -> bool {
        let Some(i) = self
            .unexpected
            .iter()
            .position(|u| u.claimed == Some(r.context))
        else {
            return false;
        };
        let Some(u) = self.take_unexpected(i) else {
            return false;
        };
        let r = if discard {
            PostedRecv { len: 0, ..r }
        } else {
            r
        };
        copy_to(&r, 0, &u.bytes);
        let len = if discard { 0 } else { u.msg_len };
        push_rx(out, &r, u.src, u.tag, u.data, len);
        true
    }

    /// Takes back a posted receive (fi_cancel): true when it was still
    /// posted.
    pub fn cancel(&mut self, context: usize) -> bool {
        match self.posted.iter().position(|r| r.context == context) {
            Some(i) => {
                self.posted.remove(i);
                true
            }
            None => false,
        }
    }

    /// Moves everything along: events, received packets, sends waiting for
    /// a slot. Finished operations are appended to `out`.
    /// Arms the ulnic endpoint's notification: true if a message or event
    /// is waiting (or arming failed, so a caller does not sleep on it).
    ///
    /// Packets in flight count as work: their delivery reports come
    /// within microseconds, so a caller waiting for them gives the core
    /// away and looks again rather than sleeping on a notification.
    /// Only this endpoint's old notification is taken: the descriptor is
    /// the process's, and another queue may be waiting on it for its own.
    pub fn arm(&mut self) -> bool {
        // Packets in flight are no reason to stay awake: their delivery
        // reports notify (between two TCG guests, sleeping for them made
        // an 8 B round trip 178-211 us against 221-374 us spinning).
        self.ep.arm().unwrap_or(true)
    }

    /// Makes `w` watch the engine's endpoint.
    pub fn watch(&self, w: &ulnic::Watcher) {
        let _ = self.ep.watch(w);
    }

    pub fn progress(&mut self, out: &mut Vec<Completion>) {
        while let Some(ev) = self.ep.poll_event() {
            self.on_event(ev, out);
        }
        for _ in 0..RX_BATCH {
            // Past the bound, packets wait at the device until receives
            // take unexpected messages; a message under way is still
            // taken whole (a peek finds only whole ones).
            let held = self.unexpected_bytes + self.owed_bytes;
            if held >= self.hold_max && self.unexpected.iter().all(|u| u.done) {
                break;
            }
            let Some(m) = self.ep.poll_recv() else { break };
            self.on_receive(m, out);
        }
        self.place_sends(out);
    }

    fn on_event(&mut self, ev: Event, out: &mut Vec<Completion>) {
        match ev {
            Event::SendDone { id } => self.packet_done(id, None, out),
            Event::SendFailed {
                id,
                reason: SendError::NoBuffer,
                ..
            } if self.slot(id).is_some() => {
                // The receiver had no buffer free: send it again (its
                // sequence number puts it back in place).
                self.retry.push_back(id as u32);
            }
            Event::SendFailed { id, reason, .. } => {
                let errno = match reason {
                    SendError::NoEndpoint | SendError::Unreachable => libc::EHOSTUNREACH,
                    _ => libc::EIO,
                };
                self.packet_done(id, Some(errno), out);
            }
            _ => {}
        }
    }

    fn slot(&self, id: u64) -> Option<&Slot> {
        self.slots.get(usize::try_from(id).ok()?)?.as_ref()
    }

    fn packet_done(&mut self, id: u64, error: Option<i32>, out: &mut Vec<Completion>) {
        let Some(slot) = usize::try_from(id)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
            .and_then(Option::take)
        else {
            return;
        };
        self.free_slots.push(id as u32);
        let Some(op) = self.ops.get_mut(&slot.op) else {
            return;
        };
        op.outstanding -= 1;
        if op.error.is_none() {
            op.error = error;
        }
        self.finish_if_done(slot.op, out);
    }

    fn finish_if_done(&mut self, id: u64, out: &mut Vec<Completion>) {
        let done = self
            .ops
            .get(&id)
            .is_some_and(|op| op.outstanding == 0 && (op.placed == op.len || op.error.is_some()));
        if !done {
            return;
        }
        let Some(op) = self.ops.remove(&id) else {
            return;
        };
        self.pending.retain(|&p| p != id);
        match op.then {
            Then::Complete => out.push(Completion {
                report: op.report || op.error.is_some(),
                tx: true,
                context: op.context,
                flags: op_flags(op.kind, false),
                len: op.len,
                buf: 0,
                data: 0,
                tag: op.tag,
                src: op.dest,
                error: op.error.map(|e| (e, 0)),
            }),
            Then::AwaitAck => self.write_delivered(id, &op, out),
            Then::Read(read) => {
                if let Some(e) = op.error {
                    self.read_done(read, Some(e), out);
                }
            }
            Then::Quiet => self.owed_bytes -= op.len,
        }
    }

    /// Fills free slots from waiting sends, oldest first (so packets to a
    /// peer leave in message order), and posts them.
    /// Whether the next packet to `dest` would be `WINDOW` or more past
    /// the oldest one to it still in flight.
    fn window_full(&self, dest: Address) -> bool {
        let next = self.seq_out.get(&dest).copied().unwrap_or(0);
        self.slots
            .iter()
            .flatten()
            .any(|s| s.dest == dest && next.wrapping_sub(s.seq) >= WINDOW)
    }

    fn place_sends(&mut self, out: &mut Vec<Completion>) {
        while let Some(&s) = self.retry.front() {
            if !self.post_slot(s) {
                return;
            }
            self.retry.pop_front();
        }
        while let Some(&id) = self.pending.front() {
            // The receiver keeps at most WINDOW packets aside: none past
            // that while an older one to it is being sent again.
            if self
                .ops
                .get(&id)
                .is_some_and(|op| self.window_full(op.dest))
            {
                return;
            }
            let Some(slot) = self.free_slots.pop() else {
                return;
            };
            let Some(op) = self.ops.get_mut(&id) else {
                self.free_slots.push(slot);
                self.pending.pop_front();
                continue;
            };
            let n = (op.len - op.placed).min(CHUNK);
            let seq = self.seq_out.entry(op.dest).or_insert(0);
            let this_seq = *seq;
            let h = Header {
                magic: MAGIC.into(),
                kind: op.kind,
                flags: op.flags | if op.cq_data.is_some() { FLAG_DATA } else { 0 },
                seq: (*seq).into(),
                msg_len: (op.len as u32).into(),
                offset: (op.placed as u32).into(),
                tag: op.tag.into(),
                data: op.cq_data.unwrap_or(0).into(),
            };
            *seq = seq.wrapping_add(1);
            let src = match &op.data {
                TxData::Owned(v) => &v[op.placed..op.placed + n],
                // SAFETY: the caller keeps the send's buffer of `len`
                // bytes valid until its completion, which has not come.
                TxData::Borrowed(p) => unsafe { slice_or_empty((p + op.placed) as *const u8, n) },
            };
            let inline = (HEADER + n <= ulnic::INLINE_MAX as usize).then(|| {
                let mut b = h.as_bytes().to_vec();
                b.extend_from_slice(src);
                b
            });
            if inline.is_none() {
                let at = slot as usize * PACKET + RX_BUFFERS as usize * PACKET;
                self.ep.write_segment(at, h.as_bytes());
                self.ep.write_segment(at + HEADER, src);
            }
            op.placed += n;
            op.outstanding += 1;
            let last = op.placed == op.len;
            self.slots[slot as usize] = Some(Slot {
                op: id,
                dest: op.dest,
                seq: this_seq,
                len: HEADER + n,
                inline,
            });
            if last {
                self.pending.pop_front();
            }
            if !self.post_slot(slot) {
                self.retry.push_back(slot);
                return;
            }
        }
        let _ = out;
    }

    /// Posts the packet in `slot`; false when the send ring is full.
    fn post_slot(&mut self, slot: u32) -> bool {
        let Some(s) = self.slots[slot as usize].as_ref() else {
            return true;
        };
        let r = match &s.inline {
            Some(b) => self
                .ep
                .post_send_inline_completion(s.dest, 0, b, u64::from(slot)),
            None => self.ep.post_send(
                s.dest,
                0,
                (slot as usize * PACKET + RX_BUFFERS as usize * PACKET) as u64,
                s.len as u32,
                u64::from(slot),
                true,
            ),
        };
        !matches!(r, Err(Error::WouldBlock))
    }

    fn on_receive(&mut self, m: ulnic::Received, out: &mut Vec<Completion>) {
        let mut head = [0u8; HEADER];
        let (h, body): (Option<Header>, Body) = match m.payload {
            Payload::Inline(b) => {
                let n = (m.len as usize).min(b.len());
                let h = Header::parse(&b[..n]);
                let body = b.get(HEADER..n).map(<[u8]>::to_vec).unwrap_or_default();
                (h, Body::Bytes(body))
            }
            Payload::Buffer { offset, id } => {
                let len = (m.len as usize).min(PACKET);
                if len >= HEADER {
                    self.ep.read_segment(offset as usize, &mut head);
                }
                (
                    Header::parse(&head),
                    Body::Buffer {
                        offset: offset as usize + HEADER,
                        len: len.saturating_sub(HEADER),
                        id,
                    },
                )
            }
        };
        if m.close {
            // The peer's endpoint is gone (its close message, left when
            // the connection was made).
            self.control.push_back(Control {
                kind: KIND_SHUTDOWN,
                from: m.src,
                params: Vec::new(),
            });
        } else if let (Some(h), false) = (h, m.returned) {
            self.on_packet(m.src, m.session, h, &body, out);
        }
        if let Body::Buffer { offset, id, .. } = body {
            let _ = self
                .ep
                .post_free((offset - HEADER) as u64, PACKET as u32, id);
        }
    }

    /// Handles a packet of `src`: now if it is the next one, else kept
    /// until the ones before it came.
    fn on_packet(
        &mut self,
        src: Address,
        session: u32,
        h: Header,
        body: &Body,
        out: &mut Vec<Completion>,
    ) {
        let peer = self.peers.entry(src).or_default();
        if peer.session != session {
            *peer = PeerIn {
                session,
                ..PeerIn::default()
            };
        }
        let seq = h.seq.get();
        let ahead = seq.wrapping_sub(peer.next);
        if ahead != 0 {
            // Behind: a duplicate; WINDOW or more ahead: a peer breaking
            // the protocol. Neither is kept.
            if ahead < WINDOW {
                let bytes = body_bytes(&self.ep, body);
                if let Some(p) = self.peers.get_mut(&src) {
                    p.stash.insert(seq, (h, bytes));
                }
            }
            return;
        }
        self.deliver(src, h, body, out);
        loop {
            let Some(p) = self.peers.get_mut(&src) else {
                return;
            };
            let next = p.next;
            let Some((h, bytes)) = p.stash.remove(&next) else {
                return;
            };
            self.deliver(src, h, &Body::Bytes(bytes), out);
        }
    }

    /// One in-order packet: the first of a message is matched, every one
    /// is copied to where its message goes, the last completes it.
    fn deliver(&mut self, src: Address, h: Header, body: &Body, out: &mut Vec<Completion>) {
        if h.kind >= KIND_WRITE {
            if let Some(peer) = self.peers.get_mut(&src) {
                peer.next = peer.next.wrapping_add(1);
            }
            self.on_rma(src, h, body, out);
            return;
        }
        if h.kind != KIND_MSG && h.kind != KIND_TAGGED {
            if let Some(peer) = self.peers.get_mut(&src) {
                peer.next = peer.next.wrapping_add(1);
            }
            self.control.push_back(Control {
                kind: h.kind,
                from: src,
                params: body_bytes(&self.ep, body),
            });
            return;
        }
        let tagged = h.kind == KIND_TAGGED;
        let data = (h.flags & FLAG_DATA != 0).then_some(h.data.get());
        let msg_len = h.msg_len.get() as usize;
        let offset = h.offset.get() as usize;
        let Some(peer) = self.peers.get_mut(&src) else {
            return;
        };
        peer.next = peer.next.wrapping_add(1);
        if offset == 0 {
            let hit = self
                .posted
                .iter()
                .position(|r| r.matches(src, tagged, h.tag.get()));
            peer.current = Some(match hit.and_then(|i| self.posted.remove(i)) {
                Some(recv) => Current::Posted {
                    recv,
                    got: 0,
                    tag: h.tag.get(),
                    data,
                    msg_len,
                },
                None => {
                    self.unexpected.push_back(Unexpected {
                        src,
                        tagged,
                        tag: h.tag.get(),
                        data,
                        msg_len,
                        bytes: Vec::with_capacity(msg_len.min(1 << 20)),
                        done: false,
                        claimed: None,
                    });
                    Current::Unexpected
                }
            });
        }
        let len = body.len();
        let last = offset + len >= msg_len;
        match peer.current.as_mut() {
            Some(Current::Posted { recv, got, .. }) => {
                let room = recv.len.saturating_sub(*got).min(body.len());
                // SAFETY: the receive's buffer of `recv.len` bytes stays
                // valid until its completion (libfabric's contract);
                // `got + room <= recv.len`.
                let dst = unsafe { slice_mut_or_empty(recv.buf, *got, room) };
                copy_body(&self.ep, body, 0, dst);
                *got += room;
            }
            Some(Current::Unexpected) => {
                let bytes = body_bytes(&self.ep, body);
                if let Some(u) = self.unexpected.iter_mut().rev().find(|u| u.src == src) {
                    u.bytes.extend_from_slice(&bytes);
                    u.done = last;
                    self.unexpected_bytes += bytes.len();
                }
            }
            Some(Current::Write(_)) | None => {}
        }
        if !last {
            return;
        }
        let Some(peer) = self.peers.get_mut(&src) else {
            return;
        };
        if let Some(Current::Posted {
            recv,
            tag,
            data,
            msg_len,
            ..
        }) = peer.current.take()
        {
            push_rx(out, &recv, src, tag, data, msg_len);
        }
    }
}

/// A packet's payload: copied out already, or still in a receive buffer.
enum Body {
    Bytes(Vec<u8>),
    Buffer { offset: usize, len: usize, id: u64 },
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Bytes(b) => b.len(),
            Body::Buffer { len, .. } => *len,
        }
    }
}

/// Copies `dst.len()` bytes of a packet's payload from `skip` on into
/// `dst` (straight from the receive buffer, no copy in between); the
/// caller keeps `skip + dst.len() <= body.len()`.
fn copy_body(ep: &Endpoint, body: &Body, skip: usize, dst: &mut [u8]) {
    match body {
        Body::Bytes(b) => dst.copy_from_slice(&b[skip..skip + dst.len()]),
        Body::Buffer { offset, .. } => ep.read_segment(offset + skip, dst),
    }
}

/// A packet's payload as bytes of its own.
fn body_bytes(ep: &Endpoint, body: &Body) -> Vec<u8> {
    match body {
        Body::Bytes(b) => b.clone(),
        Body::Buffer { offset, len, .. } => {
            let mut v = vec![0u8; *len];
            ep.read_segment(*offset, &mut v);
            v
        }
    }
}

/// FI_SEND or FI_RECV, with FI_MSG or FI_TAGGED; FI_RMA with FI_WRITE
/// or FI_READ for the initiator's remote accesses.
fn op_flags(kind: u8, rx: bool) -> u64 {
    match kind {
        KIND_WRITE => return crate::fi::RMA | crate::fi::WRITE,
        KIND_READ_REQ => return crate::fi::RMA | crate::fi::READ,
        _ => {}
    }
    let dir = if rx { crate::fi::RECV } else { crate::fi::SEND };
    dir | if kind == KIND_TAGGED {
        crate::fi::TAGGED
    } else {
        crate::fi::MSG
    }
}

/// Reports a finished receive (always when it failed, else when asked).
fn push_rx(
    out: &mut Vec<Completion>,
    r: &PostedRecv,
    src: Address,
    tag: u64,
    data: Option<u64>,
    msg_len: usize,
) {
    out.push(rx_completion(r, src, tag, data, msg_len));
}

fn rx_completion(
    r: &PostedRecv,
    src: Address,
    tag: u64,
    data: Option<u64>,
    msg_len: usize,
) -> Completion {
    let kind = if r.tagged { KIND_TAGGED } else { KIND_MSG };
    let mut flags = op_flags(kind, true);
    if data.is_some() {
        flags |= crate::fi::REMOTE_CQ_DATA;
    }
    let len = msg_len.min(r.len);
    let error = (msg_len > r.len).then_some((crate::fi::ETRUNC, msg_len - r.len));
    Completion {
        report: r.report || error.is_some(),
        tx: false,
        context: r.context,
        flags,
        len,
        buf: r.buf,
        data: data.unwrap_or(0),
        tag,
        src,
        error,
    }
}

/// Copies `b` into `r`'s buffer at `at`, as much as fits: bytes copied.
fn copy_to(r: &PostedRecv, at: usize, b: &[u8]) -> usize {
    let n = r.len.saturating_sub(at).min(b.len());
    // SAFETY: the receive's buffer of `r.len` bytes stays valid until its
    // completion (libfabric's contract); `at + n <= r.len`.
    unsafe { slice_mut_or_empty(r.buf, at, n) }.copy_from_slice(&b[..n]);
    n
}

/// `len` bytes at `p` (an empty slice for a null or zero-length buffer).
///
/// # Safety
/// Unless `len` is 0 or `p` null, `p..p+len` must be readable for the
/// slice's lifetime.
unsafe fn slice_or_empty<'a>(p: *const u8, len: usize) -> &'a [u8] {
    if len == 0 || p.is_null() {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

/// `len` bytes at `base + at` for writing (empty for a null or zero-length
/// range).
///
/// # Safety
/// Unless `len` is 0 or `base` null, `base+at..base+at+len` must be
/// writable and not otherwise borrowed for the slice's lifetime.
unsafe fn slice_mut_or_empty<'a>(base: usize, at: usize, len: usize) -> &'a mut [u8] {
    if len == 0 || base == 0 {
        &mut []
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts_mut((base + at) as *mut u8, len) }
    }
}

/// Binds `ep` to a free port `PORT_BASE + k`. Each endpoint a process
/// makes tries a port its earlier ones did not (a process-wide counter
/// from a start drawn from the process id): a receiver keeps per-sender
/// sequence numbers by address, and a new endpoint on a port just given
/// up would be numbered afresh by a sender that still counts on (the
/// session id tells the receiver, not the sender; docs/libfabric.md §2).
fn bind_free(ep: &mut Endpoint) -> Result<u32, Error> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(2654435761) >> 8;
    let mut last = None;
    for _ in 0..64u32 {
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Below the ports services name (provider::SERVICE_BASE).
        let port = PORT_BASE + (start.wrapping_add(k.wrapping_mul(7919)) & 0x007f_ffff);
        match ep.bind(port) {
            Ok(()) => return Ok(port),
            Err(e) if e.errno() == libc::EADDRINUSE => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(Error::InvalidArgument("no free port")))
}
