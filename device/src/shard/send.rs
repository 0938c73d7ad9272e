//! SEND (spec §5.3, §5.9): a message from the send ring to the endpoint
//! bound to (node, port), straight into its receive queue, or handed to the
//! fabric's transport, which delivers it later (spec §10.4).

use ulnic_abi::{
    send_flags, tx_error, SendDesc, INLINE_MAX, INLINE_OFFSET, MAX_MESSAGE, SEND_DESC_SIZE,
    SEND_UTLB_REF_OFFSET,
};
use vm_memory::GuestMemoryMmap;

use crate::fabric::network::Network;
use crate::fabric::transport::{self, ChannelKey};
use crate::memory::guest::{self, Segment};
use crate::nic::receive::{deliver_and_arm, Message, Payload};
use crate::nic::utlb::UtlbRef;
use crate::shard::pass::{Initiator, Pass};

/// What became of a send-ring descriptor that was served.
pub enum Sent {
    /// Delivered, or carried out (RDMA).
    Done,
    /// Handed to the fabric's transport; its outcome comes later.
    InFabric,
    /// The fabric channel is full: the descriptor stays in the ring.
    Blocked,
    /// Served, and this is the event it reports (a redirection's; kind 0
    /// for none).
    Reported(ulnic_abi::EventRecord),
}

/// Checks a SEND and delivers it or hands it to the fabric; on any failure
/// nothing was written at the receiver and the error code is returned.
pub fn serve(
    pass: &mut Pass<'_>,
    net: Option<&mut Network>,
    from: &mut Initiator<'_>,
    d: &SendDesc,
    raw: &[u8; SEND_DESC_SIZE as usize],
) -> Result<Sent, u16> {
    let inline = d.flags & send_flags::INLINE != 0;
    let by_utlb = d.flags & send_flags::UTLB != 0;
    if d.flags & !send_flags::ALL != 0
        || d.len > MAX_MESSAGE
        || (inline && (d.len > INLINE_MAX || by_utlb))
    {
        return Err(tx_error::BAD_DESCRIPTOR);
    }
    // With a fabric, a full channel holds the descriptor in the ring:
    // looked at before any translation, which a retry would repeat.
    let dn = d.dest_node;
    let channel = net
        .filter(|_| dn != from.node && (dn as usize) < pass.nodes.len())
        .map(|net| {
            let key = ChannelKey {
                src: from.node,
                endpoint: from.id,
                dst: dn,
                port: d.dest_port,
            };
            (key, net)
        });
    if channel
        .as_ref()
        .is_some_and(|(key, net)| !net.has_room(key, d.len as usize))
    {
        return Ok(Sent::Blocked);
    }
    // The payload's source: a range of the segment, or a user buffer named
    // by UTLB entries (translated as a segment of its own).
    let translated = if by_utlb {
        let r = UtlbRef::decode(raw, SEND_UTLB_REF_OFFSET, d.seg_offset);
        let tag = from.domain();
        Some(
            pass.utlb
                .translate(from.mem, tag, r, u64::from(d.len), &mut from.ep.stats)?,
        )
    } else {
        None
    };
    let r = carry(pass, channel, from, d, raw, translated.as_ref());
    if let Some(seg) = translated {
        pass.utlb.recycle(seg);
    }
    r
}

/// The checks of a SEND past its translation, then the message moves.
fn carry(
    pass: &mut Pass<'_>,
    channel: Option<(ChannelKey, &mut Network)>,
    from: &mut Initiator<'_>,
    d: &SendDesc,
    raw: &[u8; SEND_DESC_SIZE as usize],
    translated: Option<&Segment>,
) -> Result<Sent, u16> {
    let inline = d.flags & send_flags::INLINE != 0;
    let inline_bytes = &raw[INLINE_OFFSET..INLINE_OFFSET + d.len.min(INLINE_MAX) as usize];
    let src_seg = translated.unwrap_or(&from.ep.segment);
    if !inline && !src_seg.contains(d.seg_offset, u64::from(d.len)) {
        return Err(tx_error::BAD_ADDRESS);
    }
    let src_port = from.ep.port.ok_or(tx_error::NOT_BOUND)?;
    let src = (from.node, src_port);
    if let Some((key, net)) = channel {
        return to_fabric(net, key, d, inline_bytes, src_seg, src_port, from.mem);
    }
    let to_self = d.dest_node == from.node
        && pass.nodes[from.node as usize].ports.get(&d.dest_port) == Some(&from.id);
    if !to_self {
        let payload = if inline {
            Payload::Bytes(inline_bytes)
        } else {
            Payload::Segment {
                mem: from.mem,
                seg: src_seg,
                offset: d.seg_offset,
            }
        };
        let msg = Message::new(src, d.tag, d.len, payload);
        return pass
            .deliver(d.dest_node, d.dest_port, &msg)
            .map(|()| Sent::Done);
    }
    // A send to oneself: the segment is both source and destination, so
    // the bytes are staged (rare; keeps the borrow rules simple).
    let mut staged = Vec::new();
    let bytes = if inline {
        inline_bytes
    } else {
        staged.resize(d.len as usize, 0);
        guest::read_segment(from.mem, src_seg, d.seg_offset, &mut staged)
            .map_err(|_| tx_error::BAD_ADDRESS)?;
        &staged
    };
    let msg = Message::bytes(src, d.tag, bytes);
    let (r, woke) = deliver_and_arm(from.mem, from.ep, &msg);
    if woke {
        pass.wake.push((from.node, from.id));
    }
    r.map(|()| Sent::Done)
}

/// Copies a checked SEND's payload and hands it to the fabric's transport
/// on channel `key` (the caller saw it had room).
fn to_fabric(
    net: &mut Network,
    key: ChannelKey,
    d: &SendDesc,
    inline_bytes: &[u8],
    src_seg: &Segment,
    src_port: u32,
    smem: &GuestMemoryMmap<()>,
) -> Result<Sent, u16> {
    let bytes = if d.flags & send_flags::INLINE != 0 {
        inline_bytes.to_vec()
    } else {
        let mut b = vec![0; d.len as usize];
        guest::read_segment(smem, src_seg, d.seg_offset, &mut b)
            .map_err(|_| tx_error::BAD_ADDRESS)?;
        b
    };
    net.submit(
        key,
        transport::Message {
            src_port,
            tag: d.tag,
            user_id: d.user_id,
            completion: d.flags & send_flags::COMPLETION != 0,
            bytes,
        },
    );
    Ok(Sent::InFabric)
}
