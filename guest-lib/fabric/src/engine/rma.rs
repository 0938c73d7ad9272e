//! Remote memory access over the provider's packets (docs/libfabric.md
//! §2, "Remote memory access"): a write is a message into a registered
//! region that the target's provider checks (key, bounds, rights) and
//! copies, then acknowledges; a read is a request the target answers
//! with the bytes. The target moves them when its endpoint progresses
//! (FI_PROGRESS_MANUAL), as libfabric's software providers do: the
//! device reaches only memory shared with it, not every buffer a program
//! registers.

use ulnic::Address;

use super::rma_state::{Incoming, ReadOp, Waiting};
use super::{
    body_bytes, copy_body, slice_mut_or_empty, slice_or_empty, Body, Completion, Current, Engine,
    Then, TxData, TxOp,
};
use crate::fi;
use crate::wire::{
    Header, FLAG_ERROR, FLAG_RMA_CQ_DATA, KIND_READ_REQ, KIND_READ_RESP, KIND_WRITE, KIND_WRITE_ACK,
};

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let mut x = [0u8; 8];
    x.copy_from_slice(b.get(at..at + 8)?);
    Some(u64::from_le_bytes(x))
}

/// A send with no completion of its own (a response or acknowledgement).
fn quiet(dest: Address, kind: u8, tag: u64, payload: Vec<u8>, error: Option<i32>) -> TxOp {
    TxOp {
        len: payload.len(),
        data: TxData::Owned(payload),
        placed: 0,
        outstanding: 0,
        dest,
        kind,
        tag,
        cq_data: error.map(|e| e as u64),
        context: 0,
        report: false,
        error: None,
        flags: if error.is_some() { FLAG_ERROR } else { 0 },
        then: Then::Quiet,
    }
}

impl Engine {
    /// Queues a write of `len` bytes at `ptr` (copied now) into region
    /// `key` of `dest` at `offset`, with remote CQ data if given.
    #[allow(clippy::too_many_arguments)]
    pub fn rma_write(
        &mut self,
        dest: Address,
        ptr: *const u8,
        len: usize,
        key: u64,
        offset: u64,
        cq_data: Option<u64>,
        context: usize,
        report: bool,
    ) -> Result<(), ulnic::Error> {
        let mut payload = Vec::with_capacity(16 + len);
        payload.extend_from_slice(&self.next_op.to_le_bytes());
        if let Some(d) = cq_data {
            payload.extend_from_slice(&d.to_le_bytes());
        }
        // SAFETY: the caller's `len` readable bytes at `ptr`.
        payload.extend_from_slice(unsafe { slice_or_empty(ptr, len) });
        let op = TxOp {
            len: payload.len(),
            data: TxData::Owned(payload),
            placed: 0,
            outstanding: 0,
            dest,
            kind: KIND_WRITE,
            tag: key,
            cq_data: Some(offset),
            context,
            report,
            error: None,
            flags: if cq_data.is_some() {
                FLAG_RMA_CQ_DATA
            } else {
                0
            },
            then: Then::AwaitAck,
        };
        self.queue_op(op).map(|_| ())
    }

    /// Queues a read of `len` bytes of region `key` of `dest` at `offset`
    /// into `buf` (valid until the read's completion).
    #[allow(clippy::too_many_arguments)]
    pub fn rma_read(
        &mut self,
        dest: Address,
        buf: usize,
        len: usize,
        key: u64,
        offset: u64,
        context: usize,
        report: bool,
    ) -> Result<(), ulnic::Error> {
        let id = self.next_op;
        let mut payload = id.to_le_bytes().to_vec();
        payload.extend_from_slice(&(len as u64).to_le_bytes());
        let mut op = quiet(dest, KIND_READ_REQ, key, payload, None);
        op.cq_data = Some(offset);
        op.then = Then::Read(id);
        self.queue_op(op)?;
        self.rma.reads.insert(
            id,
            ReadOp {
                buf,
                len,
                context,
                report,
                dest,
            },
        );
        Ok(())
    }

    /// A write's packets were all delivered: it waits for its
    /// acknowledgement (or fails now).
    pub(super) fn write_delivered(&mut self, id: u64, op: &TxOp, out: &mut Vec<Completion>) {
        let prefix = if op.flags & FLAG_RMA_CQ_DATA != 0 {
            16
        } else {
            8
        };
        let w = Waiting {
            len: op.len.saturating_sub(prefix),
            context: op.context,
            report: op.report,
            dest: op.dest,
        };
        match (op.error, self.rma.early.remove(&id)) {
            (Some(e), _) => push_tx(out, KIND_WRITE, &w, Some(e)),
            (None, Some(outcome)) => push_tx(out, KIND_WRITE, &w, outcome),
            (None, None) => {
                self.rma.acks.insert(id, w);
            }
        }
    }

    /// Ends read `id` (with `error`, or done).
    pub(super) fn read_done(&mut self, id: u64, error: Option<i32>, out: &mut Vec<Completion>) {
        if let Some(r) = self.rma.reads.remove(&id) {
            let w = Waiting {
                len: r.len,
                context: r.context,
                report: r.report,
                dest: r.dest,
            };
            push_tx(out, KIND_READ_REQ, &w, error);
        }
    }

    /// An in-order RMA packet from `src`.
    pub(super) fn on_rma(
        &mut self,
        src: Address,
        h: Header,
        body: &Body,
        out: &mut Vec<Completion>,
    ) {
        match h.kind {
            KIND_WRITE => self.write_packet(src, h, body, out),
            KIND_READ_REQ => self.read_request(src, h, body),
            KIND_READ_RESP => self.read_response(src, h, body, out),
            KIND_WRITE_ACK => {
                let id = h.tag.get();
                let error = (h.flags & FLAG_ERROR != 0).then_some(h.data.get() as i32);
                if self.rma.acks.get(&id).is_some_and(|w| w.dest == src) {
                    if let Some(w) = self.rma.acks.remove(&id) {
                        push_tx(out, KIND_WRITE, &w, error);
                    }
                } else if self
                    .ops
                    .get(&id)
                    .is_some_and(|op| op.dest == src && op.kind == KIND_WRITE)
                {
                    // Before the device said its last packet was delivered.
                    self.rma.early.insert(id, error);
                }
            }
            _ => {}
        }
    }

    fn write_packet(&mut self, src: Address, h: Header, body: &Body, out: &mut Vec<Completion>) {
        let (offset, msg_len, len) = (
            h.offset.get() as usize,
            h.msg_len.get() as usize,
            body.len(),
        );
        let mut skip = 0;
        if offset == 0 {
            let with_data = h.flags & FLAG_RMA_CQ_DATA != 0;
            let prefix = if with_data { 16 } else { 8 };
            let mut head = [0u8; 16];
            let head = &mut head[..prefix.min(len)];
            copy_body(&self.ep, body, 0, head);
            let Some(op) = u64_at(head, 0) else {
                return; // malformed: nothing to acknowledge
            };
            let total = msg_len.saturating_sub(prefix);
            let ok = self
                .rma
                .mrs
                .reach(h.tag.get(), h.data.get(), total, fi::REMOTE_WRITE)
                .is_some();
            let w = Incoming {
                key: h.tag.get(),
                offset: h.data.get(),
                ok,
                got: 0,
                total,
                op,
                cq_data: if with_data { u64_at(head, 8) } else { None },
            };
            if let Some(p) = self.peers.get_mut(&src) {
                p.current = Some(Current::Write(w));
            }
            skip = head.len();
        }
        let Some(peer) = self.peers.get_mut(&src) else {
            return;
        };
        let Some(Current::Write(w)) = peer.current.as_mut() else {
            return; // a stray packet of a write whose start was refused
        };
        let chunk = len - skip;
        let n = chunk.min(w.total.saturating_sub(w.got));
        let at = w.offset.saturating_add(w.got as u64);
        match self.rma.mrs.reach(w.key, at, n, fi::REMOTE_WRITE) {
            // SAFETY: `d..d + n` is inside a region registered now (the
            // table checked it this moment); the application keeps a
            // registered region valid. The bytes go there straight from
            // the receive buffer.
            Some(d) if w.ok => {
                copy_body(&self.ep, body, skip, unsafe { slice_mut_or_empty(d, 0, n) })
            }
            _ => w.ok = false,
        }
        w.got += chunk;
        if offset + len < msg_len {
            return;
        }
        let Some(Current::Write(w)) = peer.current.take() else {
            return;
        };
        let error = (!w.ok).then_some(fi::EACCES);
        self.enqueue(quiet(src, KIND_WRITE_ACK, w.op, Vec::new(), error));
        if let (Some(data), None) = (w.cq_data, error) {
            out.push(Completion {
                report: true,
                tx: false,
                context: 0,
                flags: fi::RMA | fi::REMOTE_WRITE | fi::REMOTE_CQ_DATA,
                len: w.total,
                buf: 0,
                data,
                tag: 0,
                src,
                error: None,
            });
        }
    }

    fn read_request(&mut self, src: Address, h: Header, body: &Body) {
        let bytes = body_bytes(&self.ep, body);
        let (Some(id), Some(len)) = (u64_at(&bytes, 0), u64_at(&bytes, 8)) else {
            return;
        };
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let reply = match self
            .rma
            .mrs
            .reach(h.tag.get(), h.data.get(), len, fi::REMOTE_READ)
        {
            // SAFETY: a registered region's checked range (as above); it
            // is copied now.
            Some(p) => quiet(
                src,
                KIND_READ_RESP,
                id,
                unsafe { slice_or_empty(p as *const u8, len) }.to_vec(),
                None,
            ),
            None => quiet(src, KIND_READ_RESP, id, Vec::new(), Some(fi::EACCES)),
        };
        self.enqueue(reply);
    }

    fn read_response(&mut self, src: Address, h: Header, body: &Body, out: &mut Vec<Completion>) {
        let id = h.tag.get();
        let Some(r) = self.rma.reads.get(&id).filter(|r| r.dest == src) else {
            return; // not ours: a forgery or a leftover
        };
        if h.flags & FLAG_ERROR != 0 {
            self.read_done(id, Some(h.data.get() as i32), out);
            return;
        }
        let offset = h.offset.get() as usize;
        let n = r.len.saturating_sub(offset).min(body.len());
        // SAFETY: the read's buffer of `r.len` bytes stays valid until its
        // completion (libfabric's contract); `offset + n <= r.len`.
        copy_body(&self.ep, body, 0, unsafe {
            slice_mut_or_empty(r.buf, offset, n)
        });
        if offset + body.len() >= h.msg_len.get() as usize {
            self.read_done(id, None, out);
        }
    }
}

/// The initiator's completion of a write (`KIND_WRITE`) or read.
fn push_tx(out: &mut Vec<Completion>, kind: u8, w: &Waiting, error: Option<i32>) {
    out.push(Completion {
        report: w.report || error.is_some(),
        tx: true,
        context: w.context,
        flags: super::op_flags(kind, false),
        len: w.len,
        buf: 0,
        data: 0,
        tag: 0,
        src: w.dest,
        error: error.map(|e| (e, 0)),
    });
}
