//! Remote accesses through the fabric, at their initiator (spec §10.4): an
//! RDMA descriptor handed to the transport in pieces of at most
//! `RDMA_PIECE` bytes, the device's record of it until every piece is
//! settled, a read's answer written into its local buffer as it arrives,
//! and the descriptor's one event at the end.

use std::collections::HashMap;

use ulnic_abi::wire::RemoteAccess;
use ulnic_abi::{event, packet, tx_error, EventRecord};
use zerocopy::IntoBytes;

use crate::fabric::network::Network;
use crate::fabric::transport::{ChannelKey, Message};
use crate::memory::guest::{self, Segment};
use crate::shard::access::{Kind, Request};
use crate::shard::pass::{Initiator, Pass};
use crate::shard::send::Sent;

/// An RDMA descriptor in the fabric's care.
pub struct RemoteOp {
    node: u32,
    endpoint: u32,
    session: u32,
    /// The event it ends with: user id, cookie node and aperture, length.
    event: EventRecord,
    completion: bool,
    /// Pieces handed to the transport and not yet settled.
    pieces: u32,
    /// Every piece has been handed over.
    submitted: bool,
    /// The first failure among the pieces.
    code: Option<u16>,
    /// A read: the local buffer and where in it the access starts.
    landing: Option<(Segment, u64)>,
}

/// A shard's remote accesses in flight, by the handle their pieces carry.
#[derive(Default)]
pub struct RemoteOps {
    ops: HashMap<u64, RemoteOp>,
    next: u64,
}

impl RemoteOps {
    /// Forgets the accesses of endpoint `id` of node `node` (it was
    /// destroyed: their pieces are carried on, their outcomes go nowhere
    /// and a read's answer is not written). Returns their local buffers.
    pub fn forget(&mut self, node: u32, id: u32) -> Vec<Segment> {
        let gone: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, o)| (o.node, o.endpoint) == (node, id))
            .map(|(&h, _)| h)
            .collect();
        gone.into_iter()
            .filter_map(|h| self.ops.remove(&h)?.landing.map(|l| l.0))
            .collect()
    }

    /// Accesses in flight.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether none is in flight.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn open(&mut self, from: &Initiator<'_>, req: &Request) -> u64 {
        self.next = self.next.wrapping_add(1).max(1);
        let handle = self.next;
        self.ops.insert(
            handle,
            RemoteOp {
                node: from.node,
                endpoint: from.id,
                session: from.ep.session,
                event: EventRecord {
                    user_id: req.user_id,
                    node: req.cookie.node,
                    port: req.cookie.aperture,
                    len: req.len as u32,
                    ..Default::default()
                },
                completion: req.completion,
                pieces: 0,
                submitted: false,
                code: None,
                landing: None,
            },
        );
        handle
    }
}

/// Hands a checked access to the fabric, as many of its pieces as channel
/// `key` takes now: `InFabric` once the last one is taken (its event comes
/// when all are settled), `Blocked` before (the descriptor stays in the
/// ring, and the next pass goes on from where this one stopped).
pub fn submit(
    net: &mut Network,
    ops: &mut RemoteOps,
    key: ChannelKey,
    from: &mut Initiator<'_>,
    req: &mut Request,
) -> Result<Sent, u16> {
    let (handle, mut done) = match from.ep.pieces {
        Some((h, done)) if ops.ops.contains_key(&h) => (h, done),
        _ => (ops.open(from, req), 0),
    };
    let src_port = from.ep.port.unwrap_or(0);
    while done < req.len || (done == 0 && req.kind == Kind::Immediate) {
        let piece = if matches!(req.kind, Kind::Immediate | Kind::Sync) {
            req.len
        } else {
            (req.len - done).min(u64::from(packet::RDMA_PIECE))
        };
        let body = if req.kind == Kind::Write { piece } else { 0 };
        if !net.has_room(&key, packet::ACCESS_HEADER_SIZE + body as usize) {
            from.ep.pieces = Some((handle, done));
            return Ok(Sent::Blocked);
        }
        let head = RemoteAccess {
            cookie_node: req.cookie.node.into(),
            cookie_aperture: req.cookie.aperture.into(),
            cookie_generation: req.cookie.generation.into(),
            cookie_reserved: 0.into(),
            cookie_key: req.cookie.key.into(),
            offset: (req.remote_offset + done).into(),
            len: (piece as u32).into(),
            reserved: 0.into(),
            immediate: req.immediate.into(),
        };
        let mut bytes = Vec::with_capacity(packet::ACCESS_HEADER_SIZE + body as usize);
        bytes.extend_from_slice(head.as_bytes());
        if body > 0 {
            let local = req.translated.as_ref().unwrap_or(&from.ep.segment);
            let at = bytes.len();
            bytes.resize(at + body as usize, 0);
            if guest::read_segment(from.mem, local, req.local_offset + done, &mut bytes[at..])
                .is_err()
            {
                // Checked at `check`; a remapped segment fails here.
                abandon(ops, handle, from);
                return Err(tx_error::BAD_ADDRESS);
            }
        }
        let msg = Message {
            opcode: req.opcode,
            session: from.ep.session,
            src_port,
            user_id: req.user_id,
            completion: req.completion,
            bytes,
            handle,
            offset: done,
            ..Default::default()
        };
        net.submit(key, msg);
        if let Some(op) = ops.ops.get_mut(&handle) {
            op.pieces += 1;
        }
        done += piece.max(1);
    }
    from.ep.pieces = None;
    if let Some(op) = ops.ops.get_mut(&handle) {
        op.submitted = true;
        if req.kind == Kind::Read {
            // The answer lands in the local buffer: keep it until then.
            let seg = req
                .translated
                .take()
                .unwrap_or_else(|| from.ep.segment.clone());
            op.landing = Some((seg, req.local_offset));
        }
    }
    Ok(Sent::InFabric)
}

/// An access whose bytes could not be read after its checks passed (its
/// memory went away under it): its record goes, so pieces already handed
/// over end with no second event, and the descriptor fails at once.
fn abandon(ops: &mut RemoteOps, handle: u64, from: &mut Initiator<'_>) {
    from.ep.pieces = None;
    ops.ops.remove(&handle);
}

/// Writes `bytes` of a read's answer, `at` bytes into piece `msg`, into
/// the read's local buffer (nothing if the access is gone).
pub fn land_answer(pass: &Pass<'_>, ops: &mut RemoteOps, msg: &Message, at: u32, bytes: &[u8]) {
    let Some(op) = ops.ops.get_mut(&msg.handle) else {
        return;
    };
    let Some((seg, local)) = &op.landing else {
        return;
    };
    let Some(mem) = pass.mem(op.node) else {
        return;
    };
    let offset = local + msg.offset + u64::from(at);
    if guest::write_segment(mem, seg, offset, bytes).is_err() {
        op.code.get_or_insert(tx_error::BAD_ADDRESS);
    }
}

/// A remote access whose last piece was settled.
pub struct Settled {
    /// Its endpoint: node, id and session.
    pub node: u32,
    pub endpoint: u32,
    pub session: u32,
    /// Its length.
    pub len: u32,
    /// Its one event, if any.
    pub event: Option<EventRecord>,
    /// Its local buffer, to recycle.
    pub landing: Option<Segment>,
}

/// One piece was settled (`code`: returned with it). When it was the
/// last, the access's record goes, and this says what became of it.
pub fn settle(ops: &mut RemoteOps, handle: u64, code: Option<u16>) -> Option<Settled> {
    let op = ops.ops.get_mut(&handle)?;
    op.pieces = op.pieces.saturating_sub(1);
    if let Some(c) = code {
        op.code.get_or_insert(c);
    }
    if !op.submitted || op.pieces > 0 {
        return None;
    }
    let op = ops.ops.remove(&handle)?;
    let event = match op.code {
        None => op.completion.then_some(EventRecord {
            kind: event::TX_DONE,
            ..op.event
        }),
        Some(c) => Some(EventRecord {
            kind: event::TX_ERROR,
            code: c,
            ..op.event
        }),
    };
    Some(Settled {
        node: op.node,
        endpoint: op.endpoint,
        session: op.session,
        len: op.event.len,
        event,
        landing: op.landing.map(|l| l.0),
    })
}
