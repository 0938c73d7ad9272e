//! The decoded companions of the wire structs: descriptors, cookies,
//! event records and command payloads as plain Rust values, each with its
//! `encode` and `decode` (a hostile guest can only ever produce a
//! well-formed value of the type, which the device then validates).

use zerocopy::little_endian::U64;
use zerocopy::{Immutable, IntoBytes};

use crate::constants::*;
use crate::wire;

/// Writes a wire struct over the start of `b` (which holds at least its
/// size: the callers' slots are sized by the same structs).
fn write_prefix<T: IntoBytes + Immutable>(b: &mut [u8], w: &T) {
    let bytes = w.as_bytes();
    b[..bytes.len()].copy_from_slice(bytes);
}

/// The 32-byte header of a send descriptor (spec §5.3). Bytes 32..128 hold
/// either the inline payload or, at 32, the u64 segment offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendDesc {
    /// `op::SEND`.
    pub opcode: u16,
    /// `send_flags`.
    pub flags: u16,
    /// Payload length in bytes.
    pub len: u32,
    /// Destination node.
    pub dest_node: u32,
    /// Destination port.
    pub dest_port: u32,
    /// Tag matched by the receiver's filter and delivered with the message.
    pub tag: u32,
    /// The user's request id, returned in events.
    pub user_id: u64,
    /// Offset of the payload in the sender's segment (non-inline only).
    pub seg_offset: u64,
}

impl SendDesc {
    /// Decodes the fixed fields of a descriptor (read in place: this is
    /// the device's per-message path).
    pub fn decode(b: &[u8; SEND_DESC_SIZE as usize]) -> Self {
        let w: &wire::SendDesc = zerocopy::transmute_ref!(b);
        let buf: wire::SendBuffer = wire::read(&w.data);
        SendDesc {
            opcode: w.opcode.get(),
            flags: w.flags.get(),
            len: w.len.get(),
            dest_node: w.dest_node.get(),
            dest_port: w.dest_port.get(),
            tag: w.tag.get(),
            user_id: w.user_id.get(),
            seg_offset: buf.offset.get(),
        }
    }
    /// Encodes the header (and, when not inline, the segment offset) in
    /// place, leaving the rest of `b` (an inline payload) as it is.
    pub fn encode_header(&self, b: &mut [u8; SEND_DESC_SIZE as usize]) {
        let w: &mut wire::SendDesc = zerocopy::transmute_mut!(b);
        w.opcode = self.opcode.into();
        w.flags = self.flags.into();
        w.len = self.len.into();
        w.dest_node = self.dest_node.into();
        w.dest_port = self.dest_port.into();
        w.tag = self.tag.into();
        w.reserved = 0.into();
        w.user_id = self.user_id.into();
        if self.flags & send_flags::INLINE == 0 {
            let offset = self.seg_offset.to_le_bytes();
            w.data[..offset.len()].copy_from_slice(&offset);
        }
    }
}

/// A receive descriptor's fixed fields (spec §5.4). Bytes 32..128 hold the
/// inline payload, or for buffered messages nothing (the free descriptor's
/// offset and id are in the header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvDesc {
    /// `recv_flags`.
    pub flags: u16,
    /// Payload length.
    pub len: u32,
    /// True source node, stamped by the device.
    pub src_node: u32,
    /// True source port, stamped by the device.
    pub src_port: u32,
    /// The sender's tag.
    pub tag: u32,
    /// The sending endpoint's session id, stamped by the device (spec §5.4).
    pub session: u32,
    /// `user_id` of the free buffer used (0 for inline).
    pub buf_id: u64,
    /// Segment offset of the free buffer used (0 for inline).
    pub buf_offset: u64,
}

impl RecvDesc {
    /// Decodes a descriptor (read in place: the library's per-message
    /// path).
    pub fn decode(b: &[u8; RECV_DESC_SIZE as usize]) -> Self {
        let w: &wire::RecvDesc = zerocopy::transmute_ref!(b);
        let flags = w.flags.get();
        RecvDesc {
            flags,
            len: w.len.get(),
            src_node: w.src_node.get(),
            src_port: w.src_port.get(),
            tag: w.tag.get(),
            session: w.session.get(),
            buf_id: w.buf_id.get(),
            buf_offset: if flags & recv_flags::INLINE == 0 {
                wire::read::<U64>(&w.data).get()
            } else {
                0
            },
        }
    }
    /// Encodes the header (and the buffer offset when not inline) in
    /// place, leaving the rest of `b` (an inline payload) as it is.
    pub fn encode_header(&self, b: &mut [u8; RECV_DESC_SIZE as usize]) {
        let w: &mut wire::RecvDesc = zerocopy::transmute_mut!(b);
        w.flags = self.flags.into();
        w.reserved0 = 0.into();
        w.len = self.len.into();
        w.src_node = self.src_node.into();
        w.src_port = self.src_port.into();
        w.tag = self.tag.into();
        w.session = self.session.into();
        w.buf_id = self.buf_id.into();
        if self.flags & recv_flags::INLINE == 0 {
            let offset = self.buf_offset.to_le_bytes();
            w.data[..offset.len()].copy_from_slice(&offset);
        }
    }
}

/// A free descriptor (spec §5.5): one receive buffer in the segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeDesc {
    /// Offset of the buffer in the receiver's segment.
    pub seg_offset: u64,
    /// Buffer length.
    pub len: u32,
    /// The user's buffer id, returned in the receive descriptor.
    pub user_id: u64,
}

impl FreeDesc {
    /// Decodes a descriptor.
    pub fn decode(b: &[u8]) -> Self {
        let w: wire::FreeDesc = wire::read(b);
        FreeDesc {
            seg_offset: w.seg_offset.get(),
            len: w.len.get(),
            user_id: w.user_id.get(),
        }
    }
    /// Decodes a descriptor whose reserved fields are 0, as spec §5.5
    /// requires; `None` for one that must be discarded.
    pub fn decode_checked(b: &[u8; FREE_DESC_SIZE as usize]) -> Option<Self> {
        let w: &wire::FreeDesc = zerocopy::transmute_ref!(b);
        (w.reserved0.get() == 0 && w.reserved1.get() == 0).then(|| FreeDesc {
            seg_offset: w.seg_offset.get(),
            len: w.len.get(),
            user_id: w.user_id.get(),
        })
    }
    /// Encodes into a 32-byte slot.
    pub fn encode(&self, b: &mut [u8]) {
        let w = wire::FreeDesc {
            seg_offset: self.seg_offset.into(),
            len: self.len.into(),
            reserved0: 0.into(),
            user_id: self.user_id.into(),
            reserved1: 0.into(),
        };
        write_prefix(b, &w);
    }
}

/// An aperture's cookie (spec §5.12): the capability to access it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cookie {
    /// Node of the exporting endpoint.
    pub node: u32,
    /// Aperture id on that node.
    pub aperture: u32,
    /// Reuse count of the aperture slot.
    pub generation: u32,
    /// 64 random bits.
    pub key: u64,
}

impl Cookie {
    /// Encoded size.
    pub const SIZE: usize = core::mem::size_of::<wire::Cookie>();
    /// Encodes.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        zerocopy::transmute!(wire::Cookie {
            node: self.node.into(),
            aperture: self.aperture.into(),
            generation: self.generation.into(),
            reserved: 0.into(),
            key: self.key.into(),
        })
    }
    /// Decodes (`b` holds at least `SIZE` bytes).
    pub fn decode(b: &[u8]) -> Self {
        let w: wire::Cookie = wire::read(b);
        Cookie {
            node: w.node.get(),
            aperture: w.aperture.get(),
            generation: w.generation.get(),
            key: w.key.get(),
        }
    }
}

/// An RDMA descriptor in the send ring (spec §5.12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaDesc {
    /// `op::RDMA_WRITE`, `op::RDMA_READ` or `op::WRITE_IMMEDIATE`.
    pub opcode: u16,
    /// `send_flags::COMPLETION` only.
    pub flags: u16,
    /// Bytes (immediates: 4 or 8).
    pub len: u32,
    /// The target aperture.
    pub cookie: Cookie,
    /// The user's request id, returned in events.
    pub user_id: u64,
    /// Offset in the aperture.
    pub remote_offset: u64,
    /// Offset in the initiator's segment.
    pub local_offset: u64,
    /// The immediate value.
    pub immediate: u64,
}

impl RdmaDesc {
    /// Decodes.
    pub fn decode(b: &[u8; SEND_DESC_SIZE as usize]) -> Self {
        let w: &wire::RdmaDesc = zerocopy::transmute_ref!(b);
        RdmaDesc {
            opcode: w.opcode.get(),
            flags: w.flags.get(),
            len: w.len.get(),
            cookie: Cookie {
                node: w.cookie_node.get(),
                aperture: w.cookie_aperture.get(),
                generation: w.cookie_generation.get(),
                key: w.cookie_key.get(),
            },
            user_id: w.user_id.get(),
            remote_offset: w.remote_offset.get(),
            local_offset: w.local_offset.get(),
            immediate: w.immediate.get(),
        }
    }
    /// Encodes into the first 64 bytes of a send slot (up to the UTLB
    /// reference, which it leaves as it is).
    pub fn encode(&self, b: &mut [u8]) {
        let mut w: wire::RdmaDesc = wire::read(b);
        w.opcode = self.opcode.into();
        w.flags = self.flags.into();
        w.len = self.len.into();
        w.cookie_node = self.cookie.node.into();
        w.cookie_aperture = self.cookie.aperture.into();
        w.cookie_generation = self.cookie.generation.into();
        w.reserved = 0.into();
        w.user_id = self.user_id.into();
        w.cookie_key = self.cookie.key.into();
        w.remote_offset = self.remote_offset.into();
        w.local_offset = self.local_offset.into();
        w.immediate = self.immediate.into();
        // Only up to the UTLB reference: `b` may be just that long.
        let fields = &w.as_bytes()[..RDMA_UTLB_REF_OFFSET];
        b[..fields.len()].copy_from_slice(fields);
    }
}

/// An event record (spec §5.6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventRecord {
    /// `event::*`.
    pub kind: u16,
    /// Error or condition code.
    pub code: u16,
    /// The send descriptor's `user_id` (TX events).
    pub user_id: u64,
    /// TX events: destination node.
    pub node: u32,
    /// TX events: destination port.
    pub port: u32,
    /// TX events: message length.
    pub len: u32,
    /// TRIPWIRE events: the tripwire id; OOB events: the tag (0 otherwise).
    pub aux: u32,
    /// OOB events: the sender's session id (0 otherwise).
    pub session: u32,
}

impl EventRecord {
    /// Decodes an event.
    pub fn decode(b: &[u8]) -> Self {
        let w: wire::EventRecord = wire::read(b);
        EventRecord {
            kind: w.kind.get(),
            code: w.code.get(),
            user_id: w.user_id.get(),
            node: w.node.get(),
            port: w.port.get(),
            len: w.len.get(),
            aux: w.aux.get(),
            session: w.session.get(),
        }
    }
    /// Encodes into a 32-byte slot.
    pub fn encode(&self, b: &mut [u8]) {
        let w = wire::EventRecord {
            kind: self.kind.into(),
            code: self.code.into(),
            aux: self.aux.into(),
            user_id: self.user_id.into(),
            node: self.node.into(),
            port: self.port.into(),
            len: self.len.into(),
            session: self.session.into(),
        };
        write_prefix(b, &w);
    }
}

/// Header of every control request (8 bytes) followed by the command payload.
pub const CMD_HEADER_SIZE: usize = core::mem::size_of::<wire::CmdHeader>();
/// Header of every control response (8 bytes: status, reserved) followed by
/// the result payload.
pub const RESP_HEADER_SIZE: usize = core::mem::size_of::<wire::RespHeader>();
/// Largest request payload the device reads.
pub use wire::MAX_CMD_PAYLOAD;

/// Payload of `CREATE_ENDPOINT` (48 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateEndpoint {
    /// Protection domain.
    pub pd: u32,
    /// Ring sizes.
    pub send_entries: u32,
    /// Receive ring entries.
    pub recv_entries: u32,
    /// Free ring entries.
    pub free_entries: u32,
    /// Event ring entries.
    pub event_entries: u32,
    /// Guest-physical address of the control region (page aligned, contiguous).
    pub ctrl_gpa: u64,
    /// Length of the control region.
    pub ctrl_len: u64,
    /// Guest-physical address of the segment page table (u64 page addresses).
    pub seg_table_gpa: u64,
    /// Number of pages in the segment.
    pub seg_pages: u32,
}

impl CreateEndpoint {
    /// Encoded size.
    pub const SIZE: usize = core::mem::size_of::<wire::CreateEndpoint>();
    /// Decodes; `b` must hold `SIZE` bytes.
    pub fn decode(b: &[u8]) -> Self {
        let w: wire::CreateEndpoint = wire::read(b);
        CreateEndpoint {
            pd: w.pd.get(),
            send_entries: w.send_entries.get(),
            recv_entries: w.recv_entries.get(),
            free_entries: w.free_entries.get(),
            event_entries: w.event_entries.get(),
            ctrl_gpa: w.ctrl_gpa.get(),
            ctrl_len: w.ctrl_len.get(),
            seg_table_gpa: w.seg_table_gpa.get(),
            seg_pages: w.seg_pages.get(),
        }
    }
    /// Encodes into `SIZE` bytes.
    pub fn encode(&self) -> Vec<u8> {
        wire::CreateEndpoint {
            pd: self.pd.into(),
            send_entries: self.send_entries.into(),
            recv_entries: self.recv_entries.into(),
            free_entries: self.free_entries.into(),
            event_entries: self.event_entries.into(),
            seg_pages: self.seg_pages.into(),
            ctrl_gpa: self.ctrl_gpa.into(),
            ctrl_len: self.ctrl_len.into(),
            seg_table_gpa: self.seg_table_gpa.into(),
        }
        .as_bytes()
        .to_vec()
    }
    /// The ring layout requested.
    pub fn layout(&self) -> RingLayout {
        RingLayout {
            send_entries: self.send_entries,
            recv_entries: self.recv_entries,
            free_entries: self.free_entries,
            event_entries: self.event_entries,
        }
    }
}

/// One accept-filter entry (16 bytes): a message is accepted when
/// `(src_node == node || node == ANY) && (src_port == port || port == ANY)
/// && (tag & tag_mask) == (self.tag & tag_mask)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterEntry {
    /// Source node or `ANY`.
    pub node: u32,
    /// Source port or `ANY`.
    pub port: u32,
    /// Tag value.
    pub tag: u32,
    /// Bits of the tag compared.
    pub tag_mask: u32,
}

impl FilterEntry {
    /// Encoded size.
    pub const SIZE: usize = core::mem::size_of::<wire::FilterEntry>();
    /// Accepts everything.
    pub const ACCEPT_ALL: FilterEntry = FilterEntry {
        node: ANY,
        port: ANY,
        tag: 0,
        tag_mask: 0,
    };
    /// Whether a message from (node, port) with `tag` matches.
    pub fn matches(&self, node: u32, port: u32, tag: u32) -> bool {
        (self.node == ANY || self.node == node)
            && (self.port == ANY || self.port == port)
            && (tag & self.tag_mask) == (self.tag & self.tag_mask)
    }
    /// Decodes 16 bytes.
    pub fn decode(b: &[u8]) -> Self {
        let w: wire::FilterEntry = wire::read(b);
        FilterEntry {
            node: w.node.get(),
            port: w.port.get(),
            tag: w.tag.get(),
            tag_mask: w.tag_mask.get(),
        }
    }
    /// Appends the encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let w = wire::FilterEntry {
            node: self.node.into(),
            port: self.port.into(),
            tag: self.tag.into(),
            tag_mask: self.tag_mask.into(),
        };
        out.extend_from_slice(w.as_bytes());
    }
}

/// `GET_INFO` result (`DeviceInfo::SIZE` bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Spec major version.
    pub version_major: u16,
    /// Spec minor version.
    pub version_minor: u16,
    /// This node's address.
    pub node: u32,
    /// Endpoints this node supports.
    pub max_endpoints: u32,
    /// Inline payload limit.
    pub inline_max: u32,
    /// Message size limit.
    pub max_message: u32,
    /// Number of nodes in the fabric.
    pub nodes: u32,
    /// Implemented feature bits (`F_*`).
    pub features: u64,
    /// Tripwires each endpoint may set.
    pub max_tripwires: u32,
    /// Apertures each endpoint may export.
    pub max_apertures: u32,
}

impl DeviceInfo {
    /// Encoded size.
    pub const SIZE: usize = core::mem::size_of::<wire::DeviceInfo>();
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        wire::DeviceInfo {
            version_major: self.version_major.into(),
            version_minor: self.version_minor.into(),
            node: self.node.into(),
            max_endpoints: self.max_endpoints.into(),
            inline_max: self.inline_max.into(),
            max_message: self.max_message.into(),
            nodes: self.nodes.into(),
            features: self.features.into(),
            max_tripwires: self.max_tripwires.into(),
            max_apertures: self.max_apertures.into(),
        }
        .as_bytes()
        .to_vec()
    }
    /// Decodes.
    pub fn decode(b: &[u8]) -> Self {
        let w: wire::DeviceInfo = wire::read(b);
        DeviceInfo {
            version_major: w.version_major.get(),
            version_minor: w.version_minor.get(),
            node: w.node.get(),
            max_endpoints: w.max_endpoints.get(),
            inline_max: w.inline_max.get(),
            max_message: w.max_message.get(),
            nodes: w.nodes.get(),
            features: w.features.get(),
            max_tripwires: w.max_tripwires.get(),
            max_apertures: w.max_apertures.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_offsets_are_contiguous() {
        let l = RingLayout {
            send_entries: 64,
            recv_entries: 128,
            free_entries: 128,
            event_entries: 128,
        };
        assert_eq!(l.send_offset(), 4096);
        assert_eq!(l.recv_offset(), 4096 + 64 * 128);
        assert_eq!(l.free_offset(), l.recv_offset() + 128 * 128);
        assert_eq!(l.event_offset(), l.free_offset() + 128 * 32);
        assert_eq!(l.region_size(), l.event_offset() + 128 * 32);
        assert!(l.validate().is_ok());
        assert!(RingLayout {
            event_entries: 64,
            ..l
        }
        .validate()
        .is_err());
        assert!(RingLayout {
            send_entries: 3,
            ..l
        }
        .validate()
        .is_err());
        assert!(RingLayout {
            recv_entries: 1 << 17,
            ..l
        }
        .validate()
        .is_err());
    }

    #[test]
    fn control_block_words_fit_and_do_not_share_lines() {
        let words = [
            ctrl::SEND_PRODUCER,
            ctrl::SEND_CONSUMER,
            ctrl::RECV_PRODUCER,
            ctrl::RECV_CONSUMER,
            ctrl::FREE_PRODUCER,
            ctrl::FREE_CONSUMER,
            ctrl::EVENT_PRODUCER,
            ctrl::EVENT_CONSUMER,
            ctrl::DOORBELL_WANTED,
            ctrl::ARM_REQUEST,
            ctrl::ARM_ACK,
            ctrl::CONDITION_PENDING,
        ];
        for w in words.windows(2) {
            assert!(w[1] - w[0] >= 64);
        }
        assert!(ctrl::CONDITION_PENDING + u64::from(CONDITION_RESERVE) <= ctrl::CONTROL_BLOCK_SIZE);
    }

    #[test]
    fn descriptors_round_trip() {
        let s = SendDesc {
            opcode: op::SEND,
            flags: 0,
            len: 77,
            dest_node: 3,
            dest_port: 9,
            tag: 0xdead,
            user_id: u64::MAX - 1,
            seg_offset: 1 << 40,
        };
        let mut b = [0u8; 128];
        s.encode_header(&mut b);
        assert_eq!(SendDesc::decode(&b), s);
        let r = RecvDesc {
            flags: 0,
            len: 5,
            src_node: 1,
            src_port: 2,
            tag: 3,
            session: 6,
            buf_id: 4,
            buf_offset: 4096,
        };
        let mut b = [0u8; 128];
        r.encode_header(&mut b);
        assert_eq!(RecvDesc::decode(&b), r);
        let f = FreeDesc {
            seg_offset: 8192,
            len: 2048,
            user_id: 42,
        };
        let mut b = [0u8; 32];
        f.encode(&mut b);
        assert_eq!(FreeDesc::decode(&b), f);
        let e = EventRecord {
            kind: event::TX_ERROR,
            code: tx_error::NO_BUFFER,
            user_id: 7,
            node: 1,
            port: 2,
            len: 3,
            aux: 9,
            session: 11,
        };
        let mut b = [0u8; 32];
        e.encode(&mut b);
        assert_eq!(EventRecord::decode(&b), e);
        let r = RdmaDesc {
            opcode: op::WRITE_IMMEDIATE,
            flags: send_flags::COMPLETION,
            len: 8,
            cookie: Cookie {
                node: 1,
                aperture: 2,
                generation: 3,
                key: 0xdead_beef_0bad_cafe,
            },
            user_id: 4,
            remote_offset: 5,
            local_offset: 6,
            immediate: 7,
        };
        let mut b = [0u8; SEND_DESC_SIZE as usize];
        r.encode(&mut b);
        assert_eq!(RdmaDesc::decode(&b), r);
        assert_eq!(Cookie::decode(&r.cookie.encode()), r.cookie);
        let c = CreateEndpoint {
            pd: 1,
            send_entries: 2,
            recv_entries: 4,
            free_entries: 8,
            event_entries: 64,
            ctrl_gpa: 0x1000,
            ctrl_len: 0x9000,
            seg_table_gpa: 0x20000,
            seg_pages: 5,
        };
        assert_eq!(CreateEndpoint::decode(&c.encode()), c);
        let i = DeviceInfo {
            version_major: 0,
            version_minor: 1,
            node: 2,
            max_endpoints: 16,
            inline_max: 96,
            max_message: 1 << 20,
            nodes: 3,
            features: 1,
            max_tripwires: 64,
            max_apertures: 64,
        };
        assert_eq!(DeviceInfo::decode(&i.encode()), i);
    }

    #[test]
    fn filter_matching() {
        let f = FilterEntry {
            node: 1,
            port: ANY,
            tag: 0x10,
            tag_mask: 0xf0,
        };
        assert!(f.matches(1, 5, 0x1f));
        assert!(!f.matches(2, 5, 0x1f));
        assert!(!f.matches(1, 5, 0x2f));
        assert!(FilterEntry::ACCEPT_ALL.matches(9, 9, 9));
    }

    #[test]
    fn a_bitmap_bit_is_linux_set_bit_le() {
        for e in 0..MAX_ENDPOINTS_LIMIT {
            let mut bytes = vec![0u8; doorbell_bitmap_bytes(MAX_ENDPOINTS_LIMIT) as usize];
            let at = bitmap::word_offset(e) as usize;
            bytes[at..at + 8].copy_from_slice(&bitmap::mask(e).to_le_bytes());
            // set_bit_le(e): bit e % 8 of byte e / 8.
            let mut want = vec![0u8; bytes.len()];
            want[e as usize / 8] = 1 << (e % 8);
            assert_eq!(bytes, want, "endpoint {e}");
            let word = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            let back: Vec<u32> = bitmap::endpoints(bitmap::word(e), word).collect();
            assert_eq!(back, [e]);
        }
    }

    #[test]
    fn every_failing_status_has_its_errno() {
        for &(name, code) in status::ALL {
            let listed = status::ERRNO.iter().any(|e| e.0 == code);
            assert_eq!(listed, code != status::OK, "{name}");
        }
        assert_eq!(status::errno(99), status::OTHER_ERRNO);
        assert_eq!(status::errno(status::BAD_LENGTH), status::Errno::EINVAL);
    }
}
