//! The socket protocol's messages (docs/sockets.md §2): kinds and
//! returned credits in the tag, and the hello of a connection's set-up.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol's version, carried in every hello.
pub const PROTOCOL_VERSION: u16 = 1;

/// Connection request, client to listener.
pub const CONNECT: u32 = 1;
/// Connection accepted, server connection to client connection.
pub const ACCEPT: u32 = 2;
/// Connection refused, listener to client.
pub const REFUSE: u32 = 3;
/// Stream bytes.
pub const DATA: u32 = 4;
/// Credits returned, nothing else.
pub const CREDIT: u32 = 5;
/// No more data in this direction.
pub const FIN: u32 = 6;
/// The connection is aborted.
pub const RST: u32 = 7;
/// A datagram.
pub const DATAGRAM: u32 = 8;

/// Credits one tag can return.
pub const MAX_TAG_CREDITS: u32 = (1 << 24) - 1;

/// The tag of a message of `kind` returning `credits`.
pub fn tag(kind: u32, credits: u32) -> u32 {
    kind << 28 | credits.min(MAX_TAG_CREDITS)
}

/// The kind and the credits a tag carries (reserved bits set: kind 0,
/// which no receiver takes).
pub fn untag(tag: u32) -> (u32, u32) {
    if tag & 0x0f00_0000 != 0 {
        return (0, 0);
    }
    (tag >> 28, tag & MAX_TAG_CREDITS)
}

/// The payload of CONNECT and ACCEPT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Hello {
    /// `PROTOCOL_VERSION`.
    pub version: U16,
    /// 0.
    pub flags: U16,
    /// Receive buffers the sender posted: messages the receiver may send.
    pub credits: U32,
    /// Bytes each buffer holds: the largest DATA the receiver may send.
    pub buffer: U32,
    /// The port the sender shows as its own.
    pub port: U16,
    /// 0.
    pub reserved: U16,
}

impl Hello {
    /// A hello of this version.
    pub fn new(credits: u32, buffer: u32, port: u16) -> Hello {
        Hello {
            version: PROTOCOL_VERSION.into(),
            flags: 0.into(),
            credits: credits.into(),
            buffer: buffer.into(),
            port: port.into(),
            reserved: 0.into(),
        }
    }

    /// The hello in `bytes`, if they are one of this version with sane
    /// values.
    pub fn parse(bytes: &[u8]) -> Option<Hello> {
        let (h, _) = Hello::read_from_prefix(bytes).ok()?;
        (h.version.get() == PROTOCOL_VERSION
            && h.flags.get() == 0
            && h.reserved.get() == 0
            && h.credits.get() >= 1
            && h.buffer.get() > ulnic_abi::INLINE_MAX)
            .then_some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_carry_kind_and_credits_and_refuse_reserved_bits() {
        assert_eq!(untag(tag(DATA, 5)), (DATA, 5));
        assert_eq!(untag(tag(CREDIT, u32::MAX)), (CREDIT, MAX_TAG_CREDITS));
        assert_eq!(untag(tag(RST, 0) | 1 << 24), (0, 0));
    }

    #[test]
    fn hellos_round_trip_and_bad_ones_are_refused() {
        let h = Hello::new(8, 16384, 40000);
        assert_eq!(Hello::parse(h.as_bytes()), Some(h));
        assert_eq!(h.as_bytes().len(), 16);
        let mut old = h;
        old.version = 2.into();
        assert_eq!(Hello::parse(old.as_bytes()), None);
        assert_eq!(Hello::parse(&h.as_bytes()[..10]), None);
        let mut tiny = h;
        tiny.buffer = 96.into();
        assert_eq!(Hello::parse(tiny.as_bytes()), None);
    }
}
