//! The Active Message layer's messages (docs/am.md §1): what a ulnic
//! tag and payload carry.

/// Bytes of a message's 4 words.
pub const WORDS_BYTES: usize = 32;
/// Bytes before a transfer's data: 4 words and the destination offset.
pub const XFER_HEADER: usize = WORDS_BYTES + 8;
/// The layer's version, in every tag.
pub const VERSION: u32 = 1;

/// What a message is (tag bits 8-11).
///
/// ```
/// use ulnic::am::Kind;
/// assert!(Kind::Xfer.is_request() && !Kind::Reply.is_request());
/// assert_eq!(Kind::Refused as u32, 5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A short request: 4 words.
    Request = 1,
    /// A reply: 4 words.
    Reply = 2,
    /// A bulk transfer into the receiver's region, then its handler.
    Xfer = 3,
    /// The answer the layer sends for a request its handler did not reply to.
    Credit = 4,
    /// The answer for a request the receiver could not run (word 0: why).
    Refused = 5,
}

impl Kind {
    fn from_bits(b: u32) -> Option<Kind> {
        Some(match b {
            1 => Kind::Request,
            2 => Kind::Reply,
            3 => Kind::Xfer,
            4 => Kind::Credit,
            5 => Kind::Refused,
            _ => return None,
        })
    }

    /// A request or transfer (it takes a credit and is answered).
    ///
    /// ```
    /// assert!(ulnic::am::Kind::Request.is_request());
    /// ```
    pub fn is_request(self) -> bool {
        matches!(self, Kind::Request | Kind::Xfer)
    }
}

/// Why a receiver refused a request (a REFUSED answer's word 0).
pub mod refusal {
    /// No request handler at that index.
    pub const NO_HANDLER: u64 = 1;
    /// The transfer does not fit the receiver's region.
    pub const OUTSIDE_REGION: u64 = 2;
    /// The payload length does not fit the kind.
    pub const MALFORMED: u64 = 3;
}

/// A message's tag, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    /// The handler to run.
    pub handler: u8,
    /// What the message is.
    pub kind: Kind,
    /// The request's credit slot.
    pub slot: u8,
    /// The slot's generation when the request was sent.
    pub generation: u8,
}

impl Tag {
    /// The 32-bit ulnic tag.
    pub fn encode(self) -> u32 {
        u32::from(self.handler)
            | (self.kind as u32) << 8
            | VERSION << 12
            | u32::from(self.slot) << 16
            | u32::from(self.generation) << 24
    }

    /// The tag's fields, or None for another version or an unknown kind.
    pub fn decode(t: u32) -> Option<Tag> {
        if (t >> 12) & 0xf != VERSION {
            return None;
        }
        Some(Tag {
            handler: t as u8,
            kind: Kind::from_bits((t >> 8) & 0xf)?,
            slot: (t >> 16) as u8,
            generation: (t >> 24) as u8,
        })
    }
}

/// 4 words as bytes.
pub fn encode_words(w: &[u64; 4]) -> [u8; WORDS_BYTES] {
    let mut b = [0u8; WORDS_BYTES];
    for (i, v) in w.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// The 4 words at the start of `b` (None if it is shorter).
pub fn decode_words(b: &[u8]) -> Option<[u64; 4]> {
    let b = b.get(..WORDS_BYTES)?;
    let mut w = [0u64; 4];
    for (i, v) in w.iter_mut().enumerate() {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[i * 8..i * 8 + 8]);
        *v = u64::from_le_bytes(x);
    }
    Some(w)
}

/// A transfer's header: its words and destination offset.
pub fn encode_xfer_header(w: &[u64; 4], offset: u64) -> [u8; XFER_HEADER] {
    let mut b = [0u8; XFER_HEADER];
    b[..WORDS_BYTES].copy_from_slice(&encode_words(w));
    b[WORDS_BYTES..].copy_from_slice(&offset.to_le_bytes());
    b
}

/// A transfer's words and destination offset (None if `b` is shorter
/// than the header).
pub fn decode_xfer_header(b: &[u8]) -> Option<([u64; 4], u64)> {
    let w = decode_words(b)?;
    let mut o = [0u8; 8];
    o.copy_from_slice(b.get(WORDS_BYTES..XFER_HEADER)?);
    Some((w, u64::from_le_bytes(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_foreign_ones_are_refused() {
        let t = Tag {
            handler: 200,
            kind: Kind::Xfer,
            slot: 254,
            generation: 255,
        };
        assert_eq!(Tag::decode(t.encode()), Some(t));
        assert_eq!(t.encode() >> 12 & 0xf, 1);
        // Another version, an unknown kind.
        assert_eq!(Tag::decode(t.encode() ^ (3 << 12)), None);
        assert_eq!(Tag::decode((t.encode() & !0xf00) | 9 << 8), None);
        assert_eq!(Tag::decode(0), None);
    }

    #[test]
    fn words_and_headers_round_trip() {
        let w = [1, u64::MAX, 3 << 40, 0];
        assert_eq!(decode_words(&encode_words(&w)), Some(w));
        assert_eq!(decode_words(&[0u8; 31]), None);
        let h = encode_xfer_header(&w, 4096);
        assert_eq!(decode_xfer_header(&h), Some((w, 4096)));
        assert_eq!(decode_xfer_header(&h[..39]), None);
    }
}
