//! The receive side of an endpoint: a checked message lands inline in a
//! receive descriptor or in the next free buffer (spec §5.4, §5.5), and
//! whatever went wrong is counted and posted as a condition.

use ulnic_abi::{
    condition, recv_flags, tx_error, FreeDesc, RecvDesc, INLINE_MAX, INLINE_OFFSET, RECV_DESC_SIZE,
};
use vm_memory::GuestMemoryMmap;

use crate::memory::guest::{self, Segment};
use crate::nic::endpoint::Endpoint;

/// Where a message's payload comes from.
pub enum Payload<'a> {
    /// Bytes already in hand (inline sends, or a copy for a send to oneself).
    Bytes(&'a [u8]),
    /// A range of the sender's segment.
    Segment {
        mem: &'a GuestMemoryMmap<()>,
        seg: &'a Segment,
        offset: u64,
    },
}

impl Payload<'_> {
    /// Copies `n` of its bytes, from `rel` bytes in, to offset `dst_off`
    /// of segment `dst` in `dst_mem`.
    pub fn copy_into(
        &self,
        rel: u64,
        n: u64,
        dst_mem: &GuestMemoryMmap<()>,
        dst: &Segment,
        dst_off: u64,
    ) -> Result<(), guest::BadAddress> {
        match self {
            Payload::Bytes(b) => {
                let bytes = usize::try_from(rel)
                    .ok()
                    .zip(usize::try_from(rel.saturating_add(n)).ok())
                    .and_then(|(from, to)| b.get(from..to))
                    .ok_or(guest::BadAddress { addr: rel, len: n })?;
                guest::write_segment(dst_mem, dst, dst_off, bytes)
            }
            Payload::Segment { mem, seg, offset } => {
                guest::copy_between(mem, seg, offset + rel, dst_mem, dst, dst_off, n)
            }
        }
    }
}

/// A message on its way through the shard.
pub struct Message<'a> {
    /// Receive flags added to the descriptor (`recv_flags::CLOSE`).
    pub flags: u16,
    /// Sender's node.
    pub src_node: u32,
    /// Sender's bound port.
    pub src_port: u32,
    /// The sender's tag.
    pub tag: u32,
    /// The sending endpoint's session id (spec §5.4).
    pub session: u32,
    /// Payload length.
    pub len: u32,
    /// Where the payload is.
    pub payload: Payload<'a>,
}

impl<'a> Message<'a> {
    /// A message of `len` bytes from `(src_node, src_port)` with the
    /// sender's tag, and no receive flags.
    pub fn new(src: (u32, u32), tag: u32, len: u32, payload: Payload<'a>) -> Self {
        Message {
            flags: 0,
            src_node: src.0,
            src_port: src.1,
            tag,
            session: 0,
            len,
            payload,
        }
    }

    /// The message of `bytes`, in hand, from `src`.
    pub fn bytes(src: (u32, u32), tag: u32, bytes: &'a [u8]) -> Self {
        Self::new(src, tag, bytes.len() as u32, Payload::Bytes(bytes))
    }

    /// The same message with receive flags (`recv_flags::CLOSE`,
    /// `recv_flags::RETURNED`).
    pub fn flagged(self, flags: u16) -> Self {
        Message { flags, ..self }
    }

    /// The same message stamped with the sender's session id.
    pub fn in_session(self, session: u32) -> Self {
        Message { session, ..self }
    }
}

/// Delivers, and reports whether the receiver must be woken: anything it
/// was given (a message, or a condition such as RECV_DROPPED on failure)
/// wakes it if it armed.
pub fn deliver_and_arm(
    mem: &GuestMemoryMmap<()>,
    rx: &mut Endpoint,
    m: &Message<'_>,
) -> (Result<(), u16>, bool) {
    let before = rx.posted_mark();
    let r = deliver(mem, rx, m);
    let wake = rx.posted_mark() != before && rx.take_arm(mem);
    (r, wake)
}

/// Whether `rx` has what a message of `len` bytes needs now (a receive
/// slot, and a free buffer when it cannot go inline), looked at without
/// counting a drop or raising a condition: for retrying held messages.
pub fn has_room_for(mem: &GuestMemoryMmap<()>, rx: &mut Endpoint, len: u32) -> bool {
    rx.recv_room(mem).unwrap_or(0) > 0 && (len <= INLINE_MAX || rx.free_pending(mem) > 0)
}

/// Delivers a checked message into receiver `rx`: inline into the receive
/// descriptor when small, otherwise into the next free buffer. Every check
/// happens before the first byte is written.
pub fn deliver(mem: &GuestMemoryMmap<()>, rx: &mut Endpoint, m: &Message<'_>) -> Result<(), u16> {
    // A message coming back to its own sender is not subject to the filter.
    if m.flags & recv_flags::RETURNED == 0 && !rx.accepts(m.src_node, m.src_port, m.tag) {
        rx.stats.rx_rejected += 1;
        return Err(tx_error::REJECTED);
    }
    if rx.recv_room(mem).unwrap_or(0) == 0 {
        return Err(no_buffer(mem, rx));
    }
    let mut desc = RecvDesc {
        flags: m.flags,
        len: m.len,
        src_node: m.src_node,
        src_port: m.src_port,
        tag: m.tag,
        session: m.session,
        buf_id: 0,
        buf_offset: 0,
    };
    let mut slot = [0u8; RECV_DESC_SIZE as usize];
    if m.len <= INLINE_MAX {
        desc.flags |= recv_flags::INLINE;
        let data = &mut slot[INLINE_OFFSET..INLINE_OFFSET + m.len as usize];
        match m.payload {
            Payload::Bytes(b) => data.copy_from_slice(b),
            Payload::Segment {
                mem: smem,
                seg,
                offset,
            } => guest::read_segment(smem, seg, offset, data).map_err(|_| tx_error::BAD_ADDRESS)?,
        }
    } else {
        let buf = take_free_buffer(mem, rx, m.len)?;
        match m.payload {
            Payload::Bytes(b) => guest::write_segment(mem, &rx.segment, buf.seg_offset, b),
            Payload::Segment {
                mem: smem,
                seg,
                offset,
            } => guest::copy_between(
                smem,
                seg,
                offset,
                mem,
                &rx.segment,
                buf.seg_offset,
                u64::from(m.len),
            ),
        }
        .map_err(|_| tx_error::BAD_ADDRESS)?;
        rx.consume_free(mem);
        desc.buf_id = buf.user_id;
        desc.buf_offset = buf.seg_offset;
    }
    desc.encode_header(&mut slot);
    let written = if m.len <= INLINE_MAX {
        INLINE_OFFSET + m.len as usize
    } else {
        INLINE_OFFSET + 8
    };
    guest::write(mem, rx.recv_slot(), &slot[..written]).map_err(|_| no_buffer(mem, rx))?;
    rx.publish_recv(mem);
    rx.stats.rx_messages += 1;
    rx.stats.rx_bytes += u64::from(m.len);
    Ok(())
}

pub fn no_buffer(mem: &GuestMemoryMmap<()>, rx: &mut Endpoint) -> u16 {
    rx.stats.rx_dropped_no_buffer += 1;
    rx.post_condition(mem, condition::RECV_DROPPED);
    tx_error::NO_BUFFER
}

/// Finds the next usable free buffer without consuming it; malformed free
/// descriptors ahead of it are discarded and reported.
pub fn take_free_buffer(
    mem: &GuestMemoryMmap<()>,
    rx: &mut Endpoint,
    len: u32,
) -> Result<FreeDesc, u16> {
    loop {
        if rx.free_pending(mem) == 0 {
            return Err(no_buffer(mem, rx));
        }
        let mut raw = [0u8; ulnic_abi::FREE_DESC_SIZE as usize];
        let read = guest::read(mem, rx.free_slot(), &mut raw).is_ok();
        let usable = read
            .then(|| FreeDesc::decode_checked(&raw))
            .flatten()
            .filter(|f| f.len > 0 && rx.segment.contains(f.seg_offset, u64::from(f.len)));
        if let Some(f) = usable {
            if f.len < len {
                return Err(tx_error::BUFFER_TOO_SMALL);
            }
            return Ok(f);
        }
        rx.stats.bad_descriptors += 1;
        rx.post_condition(mem, condition::BAD_FREE_DESCRIPTOR);
        rx.consume_free(mem);
    }
}
