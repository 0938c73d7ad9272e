//! The provider's packet header (docs/libfabric.md §2): every ulnic
//! message the provider sends starts with it. A libfabric message larger
//! than one packet travels as several, in order; the sequence number lets
//! the receiver put back in order a packet the device returned for lack
//! of a buffer and the sender posted again.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `Header::magic`: "OF" and the protocol version 1.
pub const MAGIC: u16 = 0x4f01;
/// Bytes of the header.
pub const HEADER: usize = 32;

/// A sender posts no packet `WINDOW` or more past its oldest one to that
/// receiver still in flight; a receiver drops one further ahead
/// (docs/libfabric.md §2).
pub const WINDOW: u32 = 64;

/// An untagged message (FI_MSG).
pub const KIND_MSG: u8 = 1;
/// A tagged message (FI_TAGGED).
pub const KIND_TAGGED: u8 = 2;

/// Connection request, client endpoint to passive endpoint (FI_EP_MSG);
/// the payload is the connect parameters.
pub const KIND_CONNREQ: u8 = 3;
/// Connection accepted, the server's endpoint to the client's; the
/// payload is the accept parameters.
pub const KIND_ACCEPT: u8 = 4;
/// Connection rejected, passive endpoint to client; the payload is the
/// reject parameters.
pub const KIND_REJECT: u8 = 5;
/// The connection is shut down (fi_shutdown, or the peer's close message).
pub const KIND_SHUTDOWN: u8 = 6;

/// RMA write (FI_RMA): `tag` is the region's key, `data` the offset in
/// it; the payload starts with the writer's operation id (8 bytes) and,
/// with `FLAG_RMA_CQ_DATA`, the remote CQ data (8 bytes), then the bytes.
pub const KIND_WRITE: u8 = 7;
/// RMA read request: `tag` the key, `data` the offset; the payload is the
/// reader's operation id and the length (8 bytes each).
pub const KIND_READ_REQ: u8 = 8;
/// RMA read response: `tag` the reader's operation id; the payload is the
/// bytes, or with `FLAG_ERROR` none and `data` the error.
pub const KIND_READ_RESP: u8 = 9;
/// RMA write acknowledgement: `tag` the writer's operation id; with
/// `FLAG_ERROR`, `data` the error.
pub const KIND_WRITE_ACK: u8 = 10;

/// `Header::flags`: `data` carries remote CQ data.
pub const FLAG_DATA: u8 = 1;
/// `Header::flags` of a write: its payload carries remote CQ data.
pub const FLAG_RMA_CQ_DATA: u8 = 2;
/// `Header::flags` of a response or acknowledgement: the access failed,
/// `data` is the positive libfabric errno.
pub const FLAG_ERROR: u8 = 4;

/// The header of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Header {
    /// `MAGIC`.
    pub magic: U16,
    /// `KIND_*`.
    pub kind: u8,
    /// `FLAG_*`.
    pub flags: u8,
    /// The sender's packet number towards this receiver, from 0.
    pub seq: U32,
    /// Bytes of the whole message.
    pub msg_len: U32,
    /// Bytes of the message before this packet's payload.
    pub offset: U32,
    /// The message's tag (0 for FI_MSG).
    pub tag: U64,
    /// Remote CQ data, with `FLAG_DATA`.
    pub data: U64,
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER);

impl Header {
    /// Parses the first `HEADER` bytes of a packet; `None` when they are
    /// not a header of this protocol (a stray message to the port).
    pub fn parse(b: &[u8]) -> Option<Header> {
        let h = Header::read_from_prefix(b).ok()?.0;
        (h.magic.get() == MAGIC && (KIND_MSG..=KIND_WRITE_ACK).contains(&h.kind)).then_some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_strays_are_refused() {
        let h = Header {
            magic: MAGIC.into(),
            kind: KIND_TAGGED,
            flags: FLAG_DATA,
            seq: 7.into(),
            msg_len: 100.into(),
            offset: 64.into(),
            tag: 0xfeed.into(),
            data: 9.into(),
        };
        let b = h.as_bytes().to_vec();
        assert_eq!(Header::parse(&b), Some(h));
        assert_eq!(Header::parse(&b[..HEADER - 1]), None);
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert_eq!(Header::parse(&bad), None);
        let mut kind = b;
        kind[2] = KIND_WRITE_ACK + 1;
        assert_eq!(Header::parse(&kind), None);
    }
}
