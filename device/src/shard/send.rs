//! SEND and OOB (spec §5.3, §5.9): a message from the send ring to the
//! endpoint bound to (node, port): to its own node straight into the
//! receive queue (or event queue), to another node handed to the fabric's
//! transport, which delivers it later (spec §10.4), or carried by the
//! shortcut when that changes nothing (spec §10).

use ulnic_abi::{
    op, send_flags, tx_error, SendDesc, INLINE_MAX, INLINE_OFFSET, MAX_MESSAGE, OOB_MAX,
    SEND_DESC_SIZE, SEND_UTLB_REF_OFFSET,
};
use vm_memory::GuestMemoryMmap;

use crate::fabric::network::Network;
use crate::fabric::transport::{self, ChannelKey};
use crate::memory::guest::{self, Segment};
use crate::nic::receive::{deliver_and_arm, Message, Payload};
use crate::nic::utlb::UtlbRef;
use crate::shard::pass::{Initiator, Oob, Pass};

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
    /// Refused at its receiver by the shortcut: reported as the transport
    /// would report its NACK, the message returned to its sender.
    Returned(u16, ChannelKey, transport::Message),
}

/// Checks a SEND or OOB and delivers it or hands it to the fabric; on any
/// failure nothing was written at the receiver and the error code is
/// returned.
pub fn serve(
    pass: &mut Pass<'_>,
    net: Option<&mut Network>,
    from: &mut Initiator<'_>,
    d: &SendDesc,
    raw: &[u8; SEND_DESC_SIZE as usize],
) -> Result<Sent, u16> {
    let inline = d.flags & send_flags::INLINE != 0;
    let by_utlb = d.flags & send_flags::UTLB != 0;
    let oob = d.opcode == op::OOB;
    if d.flags & !send_flags::ALL != 0
        || d.len > MAX_MESSAGE
        || (inline && (d.len > INLINE_MAX || by_utlb))
        || (oob && (!inline || d.len > OOB_MAX))
    {
        return Err(tx_error::BAD_DESCRIPTOR);
    }
    // A full channel holds the descriptor in the ring: looked at before
    // any translation, which a retry would repeat.
    let dn = d.dest_node;
    let channel = net
        .filter(|_| dn != from.node && (dn as usize) < pass.nodes.len())
        .map(|net| {
            let key = ChannelKey::new(from.node, from.id, dn, d.dest_port, d.opcode);
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
    let session = from.ep.session;
    if d.opcode == op::OOB {
        let o = Oob::new(src, session, d.tag, inline_bytes);
        return match channel {
            Some((key, net)) => shortcut_oob(pass, net, key, d, &o),
            None => pass
                .deliver_oob(d.dest_node, d.dest_port, &o)
                .map(|()| Sent::Done),
        };
    }
    let payload = if inline {
        Payload::Bytes(inline_bytes)
    } else {
        Payload::Segment {
            mem: from.mem,
            seg: src_seg,
            offset: d.seg_offset,
        }
    };
    let msg = Message::new(src, d.tag, d.len, payload).in_session(session);
    if let Some((key, net)) = channel {
        if net.idle(&key) && net.shortcut(from.node, d.dest_node, d.len as usize) {
            match pass.deliver(d.dest_node, d.dest_port, &msg) {
                Ok(()) => {
                    net.count_shortcut(from.node);
                    return Ok(Sent::Done);
                }
                // No room: the transport NACKs and retries it.
                Err(tx_error::NO_BUFFER) => {}
                Err(code) => {
                    let m = to_transport(d, src_port, session, inline_bytes, src_seg, from.mem)?;
                    return Ok(Sent::Returned(code, key, m));
                }
            }
        }
        let m = to_transport(d, src_port, session, inline_bytes, src_seg, from.mem)?;
        net.submit(key, m);
        return Ok(Sent::InFabric);
    }
    let to_self = d.dest_node == from.node
        && pass.nodes[from.node as usize].ports.get(&d.dest_port) == Some(&from.id);
    if !to_self {
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
    let msg = Message::bytes(src, d.tag, bytes).in_session(session);
    let (r, woke) = deliver_and_arm(from.mem, from.ep, &msg);
    if woke {
        pass.wake.push((from.node, from.id));
    }
    r.map(|()| Sent::Done)
}

/// An OOB message to another node: by the shortcut when it may (a
/// refusal reported as its NACK would be, no room left to the transport),
/// else handed to the transport.
fn shortcut_oob(
    pass: &mut Pass<'_>,
    net: &mut Network,
    key: ChannelKey,
    d: &SendDesc,
    o: &Oob,
) -> Result<Sent, u16> {
    if net.idle(&key) && net.shortcut(key.src, key.dst, d.len as usize) {
        match pass.deliver_oob(key.dst, key.port, o) {
            Ok(()) => {
                net.count_shortcut(key.src);
                return Ok(Sent::Done);
            }
            Err(tx_error::NO_BUFFER) => {}
            Err(code) => return Err(code),
        }
    }
    net.submit(
        key,
        transport::Message {
            opcode: op::OOB,
            session: o.session,
            src_port: o.src.1,
            tag: o.tag,
            user_id: d.user_id,
            completion: d.flags & send_flags::COMPLETION != 0,
            bytes: o.bytes().to_vec(),
            ..Default::default()
        },
    );
    Ok(Sent::InFabric)
}

/// A checked SEND's payload copied into a message for the transport.
fn to_transport(
    d: &SendDesc,
    src_port: u32,
    session: u32,
    inline_bytes: &[u8],
    src_seg: &Segment,
    smem: &GuestMemoryMmap<()>,
) -> Result<transport::Message, u16> {
    let bytes = if d.flags & send_flags::INLINE != 0 {
        inline_bytes.to_vec()
    } else {
        let mut b = vec![0; d.len as usize];
        guest::read_segment(smem, src_seg, d.seg_offset, &mut b)
            .map_err(|_| tx_error::BAD_ADDRESS)?;
        b
    };
    Ok(transport::Message {
        opcode: op::SEND,
        session,
        src_port,
        tag: d.tag,
        user_id: d.user_id,
        completion: d.flags & send_flags::COMPLETION != 0,
        bytes,
        ..Default::default()
    })
}
