//! The ulnic device ABI: every constant and wire layout of `docs/spec.md`,
//! defined once and shared by the device, the host-attach driver, the library
//! and (through a generated C header, in a later issue) the Linux driver.
//!
//! All multi-byte fields are little endian. Structures are encoded and decoded
//! explicitly (no transmutes), so a hostile guest can only ever produce a
//! well-formed value of the Rust type, which the device then validates.

#![forbid(unsafe_code)]

pub mod wire;

use zerocopy::little_endian::{U32, U64};
use zerocopy::{Immutable, IntoBytes};

/// Specification version implemented (major changes break drivers).
pub const SPEC_VERSION_MAJOR: u16 = 0;
/// Specification minor version (compatible additions).
pub const SPEC_VERSION_MINOR: u16 = 9;

/// The virtio device id QEMU presents the device under. QEMU's generic
/// vhost-user device only accepts ids in its own name table (QEMU 11.1
/// aborts on 46 and above, and on the unnamed 42 and 44), and the id must be
/// one no stock Linux driver claims: 21, the virtio spec's "signal
/// distribution module", has a QEMU name and no driver anywhere.
pub const VIRTIO_ID_ULNIC: u32 = 21;
/// Magic at config offset 0: "ULNC" in little endian.
pub const CONFIG_MAGIC: u32 = 0x434e_4c55;
/// Size of the device config space in bytes.
pub const CONFIG_SIZE: usize = core::mem::size_of::<wire::ConfigSpace>();

/// Device feature bit: U-Net messaging (send/receive/free rings). Implemented.
pub const F_MESSAGING: u64 = 1 << 0;
/// Device feature bit: UTLB translation table (not implemented yet).
pub const F_UTLB: u64 = 1 << 1;
/// Device feature bit: apertures, cookies and RDMA (spec §5.12).
pub const F_RDMA: u64 = 1 << 2;
/// Device feature bit: tripwires (spec §5.13).
pub const F_TRIPWIRE: u64 = 1 << 3;
/// Device feature bit: close messages (spec §5.11): a message pre-formed in
/// the control block that the device sends when the endpoint is destroyed.
pub const F_CLOSE_MESSAGE: u64 = 1 << 4;
/// Device feature bit: out-of-band messages (not implemented yet).
pub const F_OOB: u64 = 1 << 5;
/// Device feature bit: return to sender (spec §10.4): a message the
/// fabric's transport gives up on comes back into the sender's receive
/// queue, payload and all, flagged `recv_flags::RETURNED`. Without it the
/// sender sees only the `TX_ERROR` event.
pub const F_RETURN_TO_SENDER: u64 = 1 << 6;
/// Feature bits this version of the device implements.
pub const F_IMPLEMENTED: u64 =
    F_MESSAGING | F_UTLB | F_CLOSE_MESSAGE | F_RDMA | F_TRIPWIRE | F_RETURN_TO_SENDER;

/// Apertures one endpoint may export at once.
pub const MAX_APERTURES: u32 = 64;
/// Largest tripwire count per endpoint a device may be configured with
/// (their fired bytes fill the control block from `ctrl::TRIPWIRE_FIRED`).
pub const MAX_TRIPWIRES_LIMIT: u32 = 3072;
/// Tripwires per endpoint unless the device is told otherwise.
pub const DEFAULT_TRIPWIRES: u32 = 64;
/// Longest RDMA read or write one descriptor may ask for.
pub const MAX_RDMA: u32 = 16 << 20;
/// Largest UTLB translation table per protection domain, in entries.
pub const MAX_UTLB_ENTRIES: u32 = 1 << 20;
/// Most UTLB entries one descriptor may name (a `MAX_RDMA` buffer at any
/// page offset).
pub const MAX_UTLB_RUN: u32 = MAX_RDMA / PAGE_SIZE as u32 + 1;
/// Default size of the device's translation cache (VMMC-2's 8192 lines).
pub const DEFAULT_UTLB_CACHE: u32 = 8192;
/// Where a send descriptor with `send_flags::UTLB` names its buffer's
/// entries (u32 first index, u32 count); its offset field is then the
/// offset into the first entry's page.
pub const SEND_UTLB_REF_OFFSET: usize = core::mem::offset_of!(wire::SendDesc, data)
    + core::mem::offset_of!(wire::SendBuffer, utlb_first);
/// The same for RDMA descriptors (after their 64 bytes).
pub const RDMA_UTLB_REF_OFFSET: usize = core::mem::offset_of!(wire::RdmaDesc, utlb_first);

/// Queue 0: control queue (driver -> device request, device -> driver response).
pub const CONTROL_QUEUE: u16 = 0;
/// Queue 1: notification queue (device -> driver endpoint wake-ups).
pub const NOTIFY_QUEUE: u16 = 1;
/// Queue index of doorbell slot 0; the protection domain in slot `s`
/// rings queue `FIRST_DOORBELL_QUEUE + s` (spec §5.8).
pub const FIRST_DOORBELL_QUEUE: u16 = 2;
/// Virtqueues of every node, whatever its number of endpoints (QEMU's
/// `num_vqs`; the vhost-user backend crate's limit).
pub const QUEUE_COUNT: u32 = 64;
/// Doorbell queues of a node: one per protection domain, so also the
/// limit on protection domains per node.
pub const DOORBELL_QUEUES: u32 = QUEUE_COUNT - FIRST_DOORBELL_QUEUE as u32;
/// The doorbell queue of doorbell slot `slot`.
pub const fn doorbell_queue(slot: u32) -> u32 {
    FIRST_DOORBELL_QUEUE as u32 + slot
}
/// Upper bound on endpoints per node (spec §3).
pub const MAX_ENDPOINTS_LIMIT: u32 = 4096;
/// Endpoints of a node the device polls without a doorbell (spec §5.8).
pub const RESIDENT_MAX: u32 = 64;
/// Bytes of a doorbell bitmap for a node of `endpoints` endpoints: one bit
/// per endpoint, in whole u64 words (spec §5.8).
pub const fn doorbell_bitmap_bytes(endpoints: u32) -> u64 {
    (endpoints as u64).div_ceil(64) * 8
}

/// Guest page size the device assumes for segment page tables.
pub const PAGE_SIZE: u64 = 4096;
/// Largest payload carried inline in a send or receive descriptor.
pub const INLINE_MAX: u32 = 96;
/// Largest message the device moves (one free buffer holds one message).
pub const MAX_MESSAGE: u32 = 1 << 20;
/// Smallest ring (entries); ring sizes are powers of two.
pub const MIN_RING_ENTRIES: u32 = 2;
/// Largest ring (entries).
pub const MAX_RING_ENTRIES: u32 = 1 << 16;
/// Largest segment, in pages (1 GiB).
pub const MAX_SEGMENT_PAGES: u32 = 1 << 18;
/// Number of accept-filter entries an endpoint may hold.
pub const MAX_FILTERS: usize = 16;
/// Wildcard for node, port and (with mask 0) tag in filters.
pub const ANY: u32 = u32::MAX;
/// Event slots the device keeps in reserve for condition events; an event
/// ring must have at least `send_entries + CONDITION_RESERVE` entries.
pub const CONDITION_RESERVE: u32 = 32;

/// Byte offsets of the words in an endpoint's control block (the first
/// `CONTROL_BLOCK_SIZE` bytes of its control region). Each index sits on its
/// own 64-byte line so producer and consumer never share a cache line.
pub mod ctrl {
    /// Size of the control block; the rings follow it.
    pub const CONTROL_BLOCK_SIZE: u64 = 4096;
    /// Send ring: producer index, written by the user.
    pub const SEND_PRODUCER: u64 = 0x000;
    /// Send ring: consumer index, written by the device (descriptors before it are done).
    pub const SEND_CONSUMER: u64 = 0x040;
    /// Receive ring: producer index, written by the device.
    pub const RECV_PRODUCER: u64 = 0x080;
    /// Receive ring: consumer index, written by the user.
    pub const RECV_CONSUMER: u64 = 0x0c0;
    /// Free ring: producer index, written by the user.
    pub const FREE_PRODUCER: u64 = 0x100;
    /// Free ring: consumer index, written by the device.
    pub const FREE_CONSUMER: u64 = 0x140;
    /// Event ring: producer index, written by the device.
    pub const EVENT_PRODUCER: u64 = 0x180;
    /// Event ring: consumer index, written by the user.
    pub const EVENT_CONSUMER: u64 = 0x1c0;
    /// Non-zero when the device is about to sleep and needs a doorbell to see
    /// new send or free descriptors. Written by the device.
    pub const DOORBELL_WANTED: u64 = 0x200;
    /// Arm request sequence, written by the driver to prime one notification.
    pub const ARM_REQUEST: u64 = 0x240;
    /// Arm acknowledgement, written by the device when it consumed a prime.
    pub const ARM_ACK: u64 = 0x280;
    /// `CONDITION_RESERVE` bytes: 1 while a condition event of that index is
    /// pending (set by the device), cleared to 0 by the user after consuming it.
    pub const CONDITION_PENDING: u64 = 0x2c0;
    /// The close message: a 128-byte send descriptor (opcode SEND, INLINE)
    /// that the device sends when the endpoint is destroyed, however that
    /// happens. Written by the user; opcode 0 means none.
    pub const CLOSE_MESSAGE: u64 = 0x300;
    /// One byte per tripwire id: 1 once it fired (set by the device),
    /// cleared to 0 by the user.
    pub const TRIPWIRE_FIRED: u64 = 0x400;
}

/// Entry sizes of the four rings.
pub const SEND_DESC_SIZE: u64 = core::mem::size_of::<wire::SendDesc>() as u64;
/// Receive descriptor size.
pub const RECV_DESC_SIZE: u64 = core::mem::size_of::<wire::RecvDesc>() as u64;
/// Free descriptor size.
pub const FREE_DESC_SIZE: u64 = core::mem::size_of::<wire::FreeDesc>() as u64;
/// Event record size.
pub const EVENT_SIZE: u64 = core::mem::size_of::<wire::EventRecord>() as u64;
/// Bytes of one entry of a page table (a segment's pages, spec §4.3; a
/// UTLB table, §5.14): a little-endian u64 page address.
pub const PAGE_ENTRY_SIZE: u64 = core::mem::size_of::<U64>() as u64;
/// Size of a notification record (spec §6).
pub const NOTIFY_RECORD_SIZE: usize = core::mem::size_of::<wire::NotifyRecord>();

/// Ring sizes of one endpoint, and where each ring lives in its control region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Send ring entries.
    pub send_entries: u32,
    /// Receive ring entries.
    pub recv_entries: u32,
    /// Free ring entries.
    pub free_entries: u32,
    /// Event ring entries.
    pub event_entries: u32,
}

impl RingLayout {
    /// Offset of the send ring within the control region.
    pub fn send_offset(&self) -> u64 {
        ctrl::CONTROL_BLOCK_SIZE
    }
    /// Offset of the receive ring.
    pub fn recv_offset(&self) -> u64 {
        self.send_offset() + u64::from(self.send_entries) * SEND_DESC_SIZE
    }
    /// Offset of the free ring.
    pub fn free_offset(&self) -> u64 {
        self.recv_offset() + u64::from(self.recv_entries) * RECV_DESC_SIZE
    }
    /// Offset of the event ring.
    pub fn event_offset(&self) -> u64 {
        self.free_offset() + u64::from(self.free_entries) * FREE_DESC_SIZE
    }
    /// Bytes the control region must have at least.
    pub fn region_size(&self) -> u64 {
        self.event_offset() + u64::from(self.event_entries) * EVENT_SIZE
    }
    /// Checks the rules of spec §5.2; returns the failing rule.
    pub fn validate(&self) -> Result<(), &'static str> {
        for n in [
            self.send_entries,
            self.recv_entries,
            self.free_entries,
            self.event_entries,
        ] {
            if !n.is_power_of_two() || !(MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&n) {
                return Err("ring entries must be a power of two in [2, 65536]");
            }
        }
        if self.event_entries < self.send_entries + CONDITION_RESERVE {
            return Err("event ring must hold send_entries + 32 events");
        }
        Ok(())
    }
}

/// Control command opcodes (spec §4).
pub mod cmd {
    /// Device information.
    pub const GET_INFO: u32 = 0x01;
    /// Create a protection domain.
    pub const CREATE_PD: u32 = 0x02;
    /// Destroy a protection domain and every endpoint in it.
    pub const DESTROY_PD: u32 = 0x03;
    /// Create an endpoint.
    pub const CREATE_ENDPOINT: u32 = 0x10;
    /// Destroy an endpoint.
    pub const DESTROY_ENDPOINT: u32 = 0x11;
    /// Bind an endpoint to a port number on this node.
    pub const BIND_PORT: u32 = 0x12;
    /// Replace an endpoint's accept filter.
    pub const SET_FILTER: u32 = 0x13;
    /// Enable notifications (interrupts) for an endpoint.
    pub const ARM: u32 = 0x14;
    /// Disable notifications for an endpoint.
    pub const DISARM: u32 = 0x15;
    /// Read an endpoint's counters.
    pub const GET_STATS: u32 = 0x16;
    /// Export a segment range as an aperture; returns its cookie.
    pub const EXPORT: u32 = 0x30;
    /// Revoke an aperture.
    pub const REVOKE: u32 = 0x31;
    /// Export a user buffer named by UTLB entries as an aperture.
    pub const EXPORT_BUFFER: u32 = 0x32;
    /// Set a tripwire on an aperture range.
    pub const SET_TRIPWIRE: u32 = 0x40;
    /// Remove a tripwire.
    pub const CLEAR_TRIPWIRE: u32 = 0x41;
    /// Driver only: give a protection domain its UTLB translation table.
    pub const UTLB_SET_TABLE: u32 = 0x20;
    /// Driver only: drop cached translations of UTLB entries (after
    /// rewriting them, before unpinning the old pages).
    pub const UTLB_INVALIDATE: u32 = 0x21;
    /// Opcodes reserved for features not implemented yet (UTLB 0x22..=0x2f,
    /// out-of-band messages 0x50..=0x5f); they answer `NOT_SUPPORTED`.
    pub fn is_reserved(opcode: u32) -> bool {
        (0x22..=0x2f).contains(&opcode) || (0x50..=0x5f).contains(&opcode)
    }

    /// Bytes of result payload a successful command returns (spec §4.2).
    /// The device refuses a command with `BAD_LENGTH`, before running it,
    /// when the response buffer has less room than this after the header.
    pub fn result_len(opcode: u32) -> usize {
        match opcode {
            GET_INFO => crate::DeviceInfo::SIZE,
            CREATE_PD => 8,
            CREATE_ENDPOINT => 8,
            GET_STATS => crate::STAT_NAMES.len() * 8,
            EXPORT | EXPORT_BUFFER => crate::Cookie::SIZE,
            SET_TRIPWIRE => 4,
            _ => 0,
        }
    }

    /// The feature bits a driver must have accepted (SET_FEATURES) for the
    /// device to run a command; without them it answers `NOT_SUPPORTED`.
    pub fn required_features(opcode: u32) -> u64 {
        match opcode {
            GET_INFO => 0,
            UTLB_SET_TABLE | UTLB_INVALIDATE => crate::F_MESSAGING | crate::F_UTLB,
            EXPORT | REVOKE => crate::F_MESSAGING | crate::F_RDMA,
            EXPORT_BUFFER => crate::F_MESSAGING | crate::F_RDMA | crate::F_UTLB,
            SET_TRIPWIRE | CLEAR_TRIPWIRE => crate::F_MESSAGING | crate::F_RDMA | crate::F_TRIPWIRE,
            _ => crate::F_MESSAGING,
        }
    }
}

/// Status codes of control responses (spec §4.1).
pub mod status {
    /// Success.
    pub const OK: u32 = 0;
    /// Unknown opcode.
    pub const UNKNOWN_COMMAND: u32 = 1;
    /// Request or response buffer too short, or malformed chain.
    pub const BAD_LENGTH: u32 = 2;
    /// An argument is out of range.
    pub const INVALID_ARGUMENT: u32 = 3;
    /// A limit was reached (endpoints, domains).
    pub const NO_RESOURCES: u32 = 4;
    /// No such protection domain or endpoint on this node.
    pub const NOT_FOUND: u32 = 5;
    /// The port number is already bound on this node.
    pub const ADDRESS_IN_USE: u32 = 6;
    /// A guest address is outside the memory the driver shared.
    pub const BAD_ADDRESS: u32 = 7;
    /// The command belongs to a feature this device does not implement.
    pub const NOT_SUPPORTED: u32 = 8;

    /// A short name for a status code.
    pub fn name(code: u32) -> &'static str {
        match code {
            OK => "ok",
            UNKNOWN_COMMAND => "unknown command",
            BAD_LENGTH => "bad length",
            INVALID_ARGUMENT => "invalid argument",
            NO_RESOURCES => "no resources",
            NOT_FOUND => "not found",
            ADDRESS_IN_USE => "address in use",
            BAD_ADDRESS => "bad guest address",
            NOT_SUPPORTED => "not supported",
            _ => "unknown status",
        }
    }
}

/// Send descriptor opcodes.
pub mod op {
    /// Send a message to (node, port).
    pub const SEND: u16 = 1;
    /// Copy local segment bytes into a remote aperture.
    pub const RDMA_WRITE: u16 = 2;
    /// Copy bytes of a remote aperture into the local segment.
    pub const RDMA_READ: u16 = 3;
    /// Store a 4- or 8-byte value into a remote aperture.
    pub const WRITE_IMMEDIATE: u16 = 4;
    /// Redirect part of one of this endpoint's apertures into a user
    /// buffer (VMMC-2 transfer redirection).
    pub const REDIRECT: u16 = 5;
    /// End a redirection and get its report.
    pub const REDIRECT_END: u16 = 6;
}

/// Active redirections per endpoint (spec §5.15).
pub const MAX_REDIRECTS: u32 = 16;

/// Outcomes in `event::REDIRECTED`'s code.
pub mod redirect {
    /// Every byte of the redirection went to the user buffer.
    pub const FULL: u16 = 0;
    /// Some did (one contiguous part).
    pub const PARTIAL: u16 = 1;
    /// None did.
    pub const NONE: u16 = 2;
    /// The redirection was refused; `aux` holds the `tx_error` code.
    pub const REFUSED: u16 = 3;
}

/// Aperture permissions (EXPORT).
pub mod perm {
    /// Remote reads allowed.
    pub const READ: u32 = 1 << 0;
    /// Remote writes (and immediates) allowed.
    pub const WRITE: u32 = 1 << 1;
    /// All permission bits.
    pub const ALL: u32 = READ | WRITE;
}

/// Tripwire flags (SET_TRIPWIRE).
pub mod tripwire_flags {
    /// Fire on remote writes and immediates.
    pub const WRITE: u32 = 1 << 0;
    /// Fire on remote reads.
    pub const READ: u32 = 1 << 1;
    /// Fire on every match, not once.
    pub const PERSISTENT: u32 = 1 << 2;
    /// All flags.
    pub const ALL: u32 = WRITE | READ | PERSISTENT;
}

/// Send descriptor flags.
pub mod send_flags {
    /// The payload is inline in the descriptor.
    pub const INLINE: u16 = 1 << 0;
    /// Post a `TX_DONE` event when the message was delivered.
    pub const COMPLETION: u16 = 1 << 1;
    /// The local buffer is named by UTLB entries, not a segment offset.
    pub const UTLB: u16 = 1 << 2;
    /// All flags defined.
    pub const ALL: u16 = INLINE | COMPLETION | UTLB;
}

/// Receive descriptor flags.
pub mod recv_flags {
    /// The payload is inline in the descriptor (no free buffer used).
    pub const INLINE: u16 = 1 << 0;
    /// A close message: the sender's endpoint no longer exists (spec §5.11).
    pub const CLOSE: u16 = 1 << 1;
    /// A message of this endpoint's own that the fabric gave up on (spec
    /// §10.4): `src_node`/`src_port` name where it was going, the tag and
    /// payload are the original's.
    pub const RETURNED: u16 = 1 << 2;
}

/// Fabric packets (spec §10.3; the header is `wire::PacketHeader`).
pub mod packet {
    /// `magic`: "UL" in little endian.
    pub const MAGIC: u16 = 0x4c55;
    /// `version`: 2 carries a source route after the header.
    pub const VERSION: u16 = 2;
    /// A fragment of a message.
    pub const DATA: u16 = 1;
    /// Every message of the channel's epoch up to `seq` was delivered.
    pub const ACK: u16 = 2;
    /// Message `seq` was not delivered; `code` says why.
    pub const NACK: u16 = 3;
    /// A mapper's probe (spec §10.9): the switch where its route ends, or
    /// the node it reaches, answers with a `PROBE_REPLY`.
    pub const PROBE: u16 = 4;
    /// The answer to a probe: who is there.
    pub const PROBE_REPLY: u16 = 5;
    /// Routes from the mapper for the destination node's route table.
    pub const ROUTES: u16 = 6;
    /// Switches a route may cross: the most source-route bytes a packet
    /// carries.
    pub const MAX_ROUTE: usize = 16;
    /// Size of the header.
    pub const HEADER_SIZE: usize = core::mem::size_of::<super::wire::PacketHeader>();
}

/// Event kinds.
pub mod event {
    /// A send asked for completion was delivered.
    pub const TX_DONE: u16 = 1;
    /// A send failed; `code` says why (see [`super::tx_error`]); the message
    /// was returned to the sender and nothing was written at the target.
    pub const TX_ERROR: u16 = 2;
    /// A condition (see [`super::condition`]); duplicate-suppressed.
    pub const CONDITION: u16 = 3;
    /// A tripwire fired; code 0 for a write, 1 for a read; `aux` is the
    /// tripwire id, `user_id` its user cookie, node/port the initiator.
    pub const TRIPWIRE: u16 = 4;
    /// A redirection ended; `code` is a `redirect` outcome, `len` the bytes
    /// redirected, `aux` their offset from the redirection's start.
    pub const REDIRECTED: u16 = 5;
}

/// Codes of `TX_ERROR` events.
pub mod tx_error {
    /// No endpoint is bound to the destination (node, port), or it went away.
    pub const NO_ENDPOINT: u16 = 1;
    /// The receiver had no free buffer or no receive slot (return to sender).
    pub const NO_BUFFER: u16 = 2;
    /// The receiver's accept filter refused the message.
    pub const REJECTED: u16 = 3;
    /// The message was larger than the receiver's next free buffer.
    pub const BUFFER_TOO_SMALL: u16 = 4;
    /// The descriptor was malformed (opcode, flags, length).
    pub const BAD_DESCRIPTOR: u16 = 5;
    /// The payload range lies outside the sender's segment.
    pub const BAD_ADDRESS: u16 = 6;
    /// The sending endpoint is not bound to a port.
    pub const NOT_BOUND: u16 = 7;
    /// RDMA: the cookie names no live aperture (or a wrong key/generation).
    pub const BAD_COOKIE: u16 = 8;
    /// RDMA: the aperture does not allow this access.
    pub const PERMISSION_DENIED: u16 = 9;
    /// RDMA: the range runs past the aperture's end.
    pub const OUT_OF_RANGE: u16 = 10;
    /// UTLB: an entry outside the domain's table, not installed, or a
    /// buffer longer than its entries.
    pub const NO_TRANSLATION: u16 = 11;
    /// Redirection: `MAX_REDIRECTS` are active on the endpoint already.
    pub const TOO_MANY_REDIRECTS: u16 = 12;
    /// Fabric: no acknowledgement after the configured retries (the
    /// destination is partitioned away or its device is gone).
    pub const UNREACHABLE: u16 = 13;

    /// A short name for a TX error code.
    pub fn name(code: u16) -> &'static str {
        match code {
            NO_ENDPOINT => "no endpoint at destination",
            NO_BUFFER => "receiver had no buffer",
            REJECTED => "rejected by receiver's filter",
            BUFFER_TOO_SMALL => "receiver's buffer too small",
            BAD_DESCRIPTOR => "malformed send descriptor",
            BAD_ADDRESS => "payload outside the segment",
            NOT_BOUND => "endpoint not bound to a port",
            BAD_COOKIE => "no such aperture (bad or revoked cookie)",
            PERMISSION_DENIED => "aperture does not permit this access",
            OUT_OF_RANGE => "range outside the aperture",
            NO_TRANSLATION => "UTLB entries missing or too few",
            TOO_MANY_REDIRECTS => "too many redirections active",
            UNREACHABLE => "destination unreachable (retries exhausted)",
            _ => "unknown error",
        }
    }
}

/// Condition indices (byte offsets into `ctrl::CONDITION_PENDING`).
pub mod condition {
    /// A published ring index was impossible (more entries than the ring
    /// holds); the device ignored it.
    pub const RING_INDEX: u16 = 0;
    /// A free descriptor was malformed or outside the segment; it was discarded.
    pub const BAD_FREE_DESCRIPTOR: u16 = 1;
    /// A message to this endpoint was returned to its sender for lack of a
    /// buffer or receive slot.
    pub const RECV_DROPPED: u16 = 2;
}

/// Writes a wire struct over the start of `b` (which holds at least its
/// size: the callers' slots are sized by the same structs).
fn write_prefix<T: IntoBytes + Immutable>(b: &mut [u8], w: &T) {
    let bytes = w.as_bytes();
    b[..bytes.len()].copy_from_slice(bytes);
}

/// Offset of inline data in send and receive descriptors.
pub const INLINE_OFFSET: usize = core::mem::offset_of!(wire::SendDesc, data);

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
        w.reserved1 = 0.into();
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
    /// TRIPWIRE events: the tripwire id (0 otherwise).
    pub aux: u32,
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
            reserved: 0.into(),
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

/// `GET_STATS` result: per-endpoint counters, in this order, as u64.
pub const STAT_NAMES: [&str; 17] = [
    "tx_messages",
    "tx_bytes",
    "rx_messages",
    "rx_bytes",
    "tx_errors",
    "returned_no_buffer",
    "rx_dropped_no_buffer",
    "rx_rejected",
    "bad_descriptors",
    "ring_errors",
    "events_lost",
    "notifications",
    "doorbells",
    "tripwires_fired",
    "utlb_hits",
    "utlb_misses",
    "utlb_fetch_ns",
];

/// Reads a little-endian u32 at `o`; the caller checked the length.
pub fn read_le32(b: &[u8], o: usize) -> u32 {
    wire::read::<U32>(b.get(o..).unwrap_or_default()).get()
}
/// Reads a little-endian u64 at `o`; the caller checked the length.
pub fn read_le64(b: &[u8], o: usize) -> u64 {
    wire::read::<U64>(b.get(o..).unwrap_or_default()).get()
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
}

/// The Linux driver's character device interface (spec §9): ioctl
/// numbers and argument layouts shared by `ulnic.c` and the library.
pub mod uapi {
    /// ioctl type byte ('U').
    pub const IOC_TYPE: u32 = 0x55;
    use super::wire::{DeviceInfo, IocCommand, IocCreateEp, IocNotified, IocUtlbInstall, IocWait};

    /// `_IOC(dir, 'U', nr, sizeof(T))`: the argument's size is its type's.
    const fn ioc<T>(dir: u32, nr: u32) -> u32 {
        (dir << 30) | ((core::mem::size_of::<T>() as u32) << 16) | (IOC_TYPE << 8) | nr
    }
    const WRITE: u32 = 1;
    const READ: u32 = 2;

    /// Read the device information (`wire::DeviceInfo`).
    pub const IOC_INFO: u32 = ioc::<DeviceInfo>(READ, 1);
    /// Create an endpoint in the file's protection domain
    /// (`wire::IocCreateEp`).
    pub const IOC_CREATE_EP: u32 = ioc::<IocCreateEp>(READ | WRITE, 2);
    /// Destroy one of the file's endpoints (u32 id).
    pub const IOC_DESTROY_EP: u32 = ioc::<u32>(WRITE, 3);
    /// Run BIND_PORT, SET_FILTER, ARM, DISARM, GET_STATS, EXPORT, REVOKE,
    /// EXPORT_BUFFER, SET_TRIPWIRE or CLEAR_TRIPWIRE on an endpoint the
    /// file owns (the payload's first u32; `wire::IocCommand`).
    pub const IOC_COMMAND: u32 = ioc::<IocCommand>(READ | WRITE, 4);
    /// Ring an owned endpoint's doorbell (u32 id): set its bit in the
    /// file's doorbell bitmap and kick the file's doorbell queue.
    pub const IOC_KICK: u32 = ioc::<u32>(WRITE, 5);
    /// Block until an owned endpoint is notified (`wire::IocWait`);
    /// returns 1 when notified, 0 on timeout.
    pub const IOC_WAIT: u32 = ioc::<IocWait>(WRITE, 6);
    /// mmap offset of endpoint `e`'s control region; its segment is at
    /// `+ MMAP_SEGMENT`.
    pub const fn mmap_ctrl(e: u32) -> u64 {
        (e as u64) << MMAP_ID_SHIFT
    }
    /// An mmap offset's endpoint id is the offset shifted right by this.
    pub const MMAP_ID_SHIFT: u32 = 32;
    /// Added to `mmap_ctrl(e)` for the segment.
    pub const MMAP_SEGMENT: u64 = 1 << 31;
    /// mmap offset of the open file's doorbell page, one page; writing
    /// the doorbell queue index (u16) to its start rings the doorbell
    /// without a system call (spec §9).
    pub const MMAP_DOORBELL: u64 = 1 << 48;
    /// mmap offset of the page holding the open file's doorbell bitmap (at
    /// its start; spec §5.8).
    pub const MMAP_DOORBELL_BITS: u64 = MMAP_DOORBELL + 4096;
    /// Give the file's protection domain a UTLB of `entries` (u32) entries.
    pub const IOC_UTLB_INIT: u32 = ioc::<u32>(WRITE, 7);
    /// Pin `count` pages of this process from virtual address `va` (page
    /// aligned) and install them at UTLB entries `first..first+count`,
    /// unpinning what was there: u32 first, u32 count, u64 va.
    pub const IOC_UTLB_INSTALL: u32 = ioc::<IocUtlbInstall>(WRITE, 8);
    /// Take every notification of the file's endpoints at once
    /// (`wire::IocNotified`): for a program that sleeps in `poll` or
    /// `epoll` on the file for many endpoints.
    pub const IOC_TAKE_NOTIFIED: u32 = ioc::<IocNotified>(READ, 9);
    /// Direction of an ioctl's argument, as `_IOR`, `_IOW`, `_IOWR` say.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Dir {
        /// The driver writes the argument.
        Read,
        /// The driver reads the argument.
        Write,
        /// Both.
        ReadWrite,
    }

    /// Every ioctl: name, direction, number, C argument type, and the
    /// number Rust computes (which the C header asserts equal to its own).
    pub fn ioctls() -> [(&'static str, Dir, u32, &'static str, u32); 9] {
        [
            (
                "IOC_INFO",
                Dir::Read,
                1,
                "struct ulnic_device_info",
                IOC_INFO,
            ),
            (
                "IOC_CREATE_EP",
                Dir::ReadWrite,
                2,
                "struct ulnic_ioc_create_ep",
                IOC_CREATE_EP,
            ),
            ("IOC_DESTROY_EP", Dir::Write, 3, "__u32", IOC_DESTROY_EP),
            (
                "IOC_COMMAND",
                Dir::ReadWrite,
                4,
                "struct ulnic_ioc_command",
                IOC_COMMAND,
            ),
            ("IOC_KICK", Dir::Write, 5, "__u32", IOC_KICK),
            ("IOC_WAIT", Dir::Write, 6, "struct ulnic_ioc_wait", IOC_WAIT),
            ("IOC_UTLB_INIT", Dir::Write, 7, "__u32", IOC_UTLB_INIT),
            (
                "IOC_UTLB_INSTALL",
                Dir::Write,
                8,
                "struct ulnic_ioc_utlb_install",
                IOC_UTLB_INSTALL,
            ),
            (
                "IOC_TAKE_NOTIFIED",
                Dir::Read,
                9,
                "struct ulnic_ioc_notified",
                IOC_TAKE_NOTIFIED,
            ),
        ]
    }

    /// Largest control region the driver allocates (physically contiguous).
    pub const MAX_CTRL_BYTES: u64 = 4 << 20;
    /// Largest segment the driver allocates.
    pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;
    /// Largest UTLB table the driver allocates (physically contiguous):
    /// 65536 entries.
    pub const MAX_UTLB_TABLE_BYTES: u64 = 512 << 10;
}

/// The C header for the Linux driver (`guest-driver/linux/ulnic_abi.h`),
/// generated from the constants above so they are defined once. A test
/// fails when the committed header differs; regenerate with
/// `ULNIC_BLESS=1 cargo test -p ulnic-abi`.
pub fn c_header() -> String {
    let mut defs: Vec<(&str, u64)> = vec![
        ("ULNIC_SPEC_VERSION_MAJOR", SPEC_VERSION_MAJOR.into()),
        ("ULNIC_SPEC_VERSION_MINOR", SPEC_VERSION_MINOR.into()),
        ("ULNIC_VIRTIO_ID", VIRTIO_ID_ULNIC.into()),
        ("ULNIC_CONFIG_MAGIC", CONFIG_MAGIC.into()),
        ("ULNIC_CONFIG_SIZE", CONFIG_SIZE as u64),
        ("ULNIC_F_MESSAGING_BIT", F_MESSAGING.trailing_zeros().into()),
        ("ULNIC_F_UTLB_BIT", F_UTLB.trailing_zeros().into()),
        ("ULNIC_F_RDMA_BIT", F_RDMA.trailing_zeros().into()),
        ("ULNIC_F_TRIPWIRE_BIT", F_TRIPWIRE.trailing_zeros().into()),
        (
            "ULNIC_F_CLOSE_MESSAGE_BIT",
            F_CLOSE_MESSAGE.trailing_zeros().into(),
        ),
        (
            "ULNIC_F_RETURN_TO_SENDER_BIT",
            F_RETURN_TO_SENDER.trailing_zeros().into(),
        ),
        ("ULNIC_CONTROL_QUEUE", CONTROL_QUEUE.into()),
        ("ULNIC_NOTIFY_QUEUE", NOTIFY_QUEUE.into()),
        ("ULNIC_FIRST_DOORBELL_QUEUE", FIRST_DOORBELL_QUEUE.into()),
        ("ULNIC_MAX_ENDPOINTS_LIMIT", MAX_ENDPOINTS_LIMIT.into()),
        ("ULNIC_QUEUE_COUNT", QUEUE_COUNT.into()),
        ("ULNIC_DOORBELL_QUEUES", DOORBELL_QUEUES.into()),
        ("ULNIC_PAGE_SIZE", PAGE_SIZE),
        ("ULNIC_INLINE_MAX", INLINE_MAX.into()),
        ("ULNIC_MAX_MESSAGE", MAX_MESSAGE.into()),
        ("ULNIC_MAX_RING_ENTRIES", MAX_RING_ENTRIES.into()),
        ("ULNIC_MAX_SEGMENT_PAGES", MAX_SEGMENT_PAGES.into()),
        ("ULNIC_CONDITION_RESERVE", CONDITION_RESERVE.into()),
        ("ULNIC_CMD_HEADER_SIZE", CMD_HEADER_SIZE as u64),
        ("ULNIC_RESP_HEADER_SIZE", RESP_HEADER_SIZE as u64),
        ("ULNIC_MAX_CMD_PAYLOAD", MAX_CMD_PAYLOAD as u64),
        ("ULNIC_CMD_GET_INFO", cmd::GET_INFO.into()),
        ("ULNIC_CMD_CREATE_PD", cmd::CREATE_PD.into()),
        ("ULNIC_CMD_DESTROY_PD", cmd::DESTROY_PD.into()),
        ("ULNIC_CMD_CREATE_ENDPOINT", cmd::CREATE_ENDPOINT.into()),
        ("ULNIC_CMD_DESTROY_ENDPOINT", cmd::DESTROY_ENDPOINT.into()),
        ("ULNIC_CMD_BIND_PORT", cmd::BIND_PORT.into()),
        ("ULNIC_CMD_SET_FILTER", cmd::SET_FILTER.into()),
        ("ULNIC_CMD_ARM", cmd::ARM.into()),
        ("ULNIC_CMD_DISARM", cmd::DISARM.into()),
        ("ULNIC_CMD_GET_STATS", cmd::GET_STATS.into()),
        ("ULNIC_CMD_EXPORT", cmd::EXPORT.into()),
        ("ULNIC_CMD_REVOKE", cmd::REVOKE.into()),
        ("ULNIC_CMD_SET_TRIPWIRE", cmd::SET_TRIPWIRE.into()),
        ("ULNIC_CMD_CLEAR_TRIPWIRE", cmd::CLEAR_TRIPWIRE.into()),
        ("ULNIC_CMD_UTLB_SET_TABLE", cmd::UTLB_SET_TABLE.into()),
        ("ULNIC_CMD_EXPORT_BUFFER", cmd::EXPORT_BUFFER.into()),
        ("ULNIC_CMD_UTLB_INVALIDATE", cmd::UTLB_INVALIDATE.into()),
        ("ULNIC_MAX_UTLB_ENTRIES", MAX_UTLB_ENTRIES.into()),
        ("ULNIC_STATUS_OK", status::OK.into()),
        (
            "ULNIC_STATUS_UNKNOWN_COMMAND",
            status::UNKNOWN_COMMAND.into(),
        ),
        ("ULNIC_STATUS_BAD_LENGTH", status::BAD_LENGTH.into()),
        (
            "ULNIC_STATUS_INVALID_ARGUMENT",
            status::INVALID_ARGUMENT.into(),
        ),
        ("ULNIC_STATUS_NO_RESOURCES", status::NO_RESOURCES.into()),
        ("ULNIC_STATUS_NOT_FOUND", status::NOT_FOUND.into()),
        ("ULNIC_STATUS_ADDRESS_IN_USE", status::ADDRESS_IN_USE.into()),
        ("ULNIC_STATUS_BAD_ADDRESS", status::BAD_ADDRESS.into()),
        ("ULNIC_STATUS_NOT_SUPPORTED", status::NOT_SUPPORTED.into()),
        ("ULNIC_CTRL_BLOCK_SIZE", ctrl::CONTROL_BLOCK_SIZE),
        ("ULNIC_CTRL_ARM_REQUEST", ctrl::ARM_REQUEST),
        ("ULNIC_CTRL_ARM_ACK", ctrl::ARM_ACK),
        ("ULNIC_CTRL_CLOSE_MESSAGE", ctrl::CLOSE_MESSAGE),
        ("ULNIC_SEND_DESC_SIZE", SEND_DESC_SIZE),
        ("ULNIC_RECV_DESC_SIZE", RECV_DESC_SIZE),
        ("ULNIC_FREE_DESC_SIZE", FREE_DESC_SIZE),
        ("ULNIC_EVENT_SIZE", EVENT_SIZE),
        ("ULNIC_NOTIFY_RECORD_SIZE", NOTIFY_RECORD_SIZE as u64),
        ("ULNIC_PAGE_ENTRY_SIZE", PAGE_ENTRY_SIZE),
        ("ULNIC_IOC_TYPE", uapi::IOC_TYPE.into()),
        ("ULNIC_MMAP_SEGMENT", uapi::MMAP_SEGMENT),
        ("ULNIC_MMAP_ID_SHIFT", uapi::MMAP_ID_SHIFT.into()),
        ("ULNIC_MMAP_DOORBELL", uapi::MMAP_DOORBELL),
        ("ULNIC_MMAP_DOORBELL_BITS", uapi::MMAP_DOORBELL_BITS),
        ("ULNIC_MAX_CTRL_BYTES", uapi::MAX_CTRL_BYTES),
        ("ULNIC_MAX_SEGMENT_BYTES", uapi::MAX_SEGMENT_BYTES),
        ("ULNIC_MAX_UTLB_TABLE_BYTES", uapi::MAX_UTLB_TABLE_BYTES),
        ("ULNIC_CTRL_RING_OFFSET", ctrl::CONTROL_BLOCK_SIZE),
    ];
    defs.sort_by_key(|d| d.0);
    let mut h = String::from(
        "/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */\n\
         /* Generated from abi/src/{lib,wire}.rs by ulnic_abi::c_header(); do not edit.\n \
         * Regenerate: ULNIC_BLESS=1 cargo test -p ulnic-abi */\n\
         #ifndef ULNIC_ABI_H\n#define ULNIC_ABI_H\n\n\
         #include <linux/types.h>\n#include <linux/ioctl.h>\n\n",
    );
    for (name, v) in defs {
        h.push_str(&format!("#define {name} {v:#x}\n"));
    }
    h.push_str(&c_structs(&wire::all()));
    h.push_str("\n/* ioctls of /dev/ulnicN (spec \u{a7}9); arguments are the structs above. */\n");
    for (name, dir, nr, arg, value) in uapi::ioctls() {
        let mac = match dir {
            uapi::Dir::Read => "_IOR",
            uapi::Dir::Write => "_IOW",
            uapi::Dir::ReadWrite => "_IOWR",
        };
        h.push_str(&format!(
            "#define ULNIC_{name} {mac}(ULNIC_IOC_TYPE, {nr}, {arg})\n\
             _Static_assert(ULNIC_{name} == {value:#x}u, \"ULNIC_{name}\");\n"
        ));
    }
    h.push_str("\n#endif /* ULNIC_ABI_H */\n");
    h
}

/// The C declarations of `structs` (as `wire::all` gives them), each with
/// a `_Static_assert` of its size and of every field's offset.
pub fn c_structs(structs: &[(&str, &str, usize, Vec<wire::Field>)]) -> String {
    let mut h = String::new();
    for (name, summary, size, fields) in structs {
        h.push_str(&format!("\n/* {} */\nstruct {name} {{\n", summary.trim()));
        for f in fields {
            match f.array {
                Some(n) => h.push_str(&format!("\t{} {}[{n}];\n", f.c_type, f.name)),
                None => h.push_str(&format!("\t{} {};\n", f.c_type, f.name)),
            }
        }
        h.push_str("};\n");
        h.push_str(&format!(
            "_Static_assert(sizeof(struct {name}) == {size}, \"struct {name}: size\");\n"
        ));
        for f in fields {
            h.push_str(&format!(
                "_Static_assert(__builtin_offsetof(struct {name}, {}) == {}, \"struct {name}: {}\");\n",
                f.name, f.offset, f.name
            ));
        }
    }
    h
}

#[cfg(test)]
mod header_tests {
    use std::path::Path;
    use std::process::Command;

    /// Compiles `header` as C (`cc`, the kernel's `-std=gnu11`), in user
    /// space with the UAPI headers: the compiler's error output, if any.
    fn compile(dir: &Path, header: &str) -> Result<(), String> {
        std::fs::write(dir.join("ulnic_abi.h"), header).unwrap();
        std::fs::write(
            dir.join("check.c"),
            "#include \"ulnic_abi.h\"\nint main(void) { return 0; }\n",
        )
        .unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-std=gnu11", "-Wall", "-Werror", "-fsyntax-only", "check.c"])
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The C compiler lays every struct out as Rust does: the header's
    /// asserts of every size, offset and ioctl number hold in C.
    #[test]
    fn c_compiler_agrees_with_every_size_and_offset() {
        let dir = std::env::temp_dir().join(format!("ulnic-abi-cc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let result = compile(&dir, &super::c_header());
        // The same check fails when Rust and C disagree: one offset moved.
        let mut structs = super::wire::all();
        structs[0].3[1].offset += 2;
        let broken = format!(
            "#include <linux/types.h>\n{}",
            super::c_structs(&structs[..1])
        );
        let refused = compile(&dir, &broken);
        let _ = std::fs::remove_dir_all(&dir);
        result.unwrap();
        let err = refused.expect_err("a wrong offset must not compile");
        assert!(err.contains("version_major"), "{err}");
    }
    #[test]
    fn committed_c_header_matches_the_rust_abi() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../guest-driver/linux/ulnic_abi.h"
        );
        let want = super::c_header();
        if std::env::var_os("ULNIC_BLESS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "{path} is out of date: run ULNIC_BLESS=1 cargo test -p ulnic-abi"
        );
    }
}
