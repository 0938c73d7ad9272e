//! Every wire layout of the spec, defined once as a `#[repr(C)]` struct of
//! little-endian fields: config space, control commands and their results,
//! ring entries, events, the notification record, and the Linux driver's
//! ioctl arguments. The C header (`guest-driver/linux/ulnic_abi.h`) is
//! generated from these definitions (`crate::c_header`), with a
//! `_Static_assert` for every size and offset, so C and Rust cannot
//! disagree.
//!
//! The structs are plain bytes (zerocopy): any bytes are a valid value, so
//! reading one from guest memory cannot fail or produce an invalid value;
//! the device then checks the fields.
//!
//! ```
//! use ulnic_abi::wire::{EventRecord, Layout};
//! use zerocopy::{FromBytes, IntoBytes};
//! let e = EventRecord { kind: 1.into(), user_id: 7.into(), ..FromZeros::new_zeroed() };
//! # use zerocopy::FromZeros;
//! let bytes = e.as_bytes();
//! assert_eq!(bytes.len(), 32);
//! assert_eq!(EventRecord::read_from_bytes(bytes).unwrap().user_id.get(), 7);
//! assert_eq!(EventRecord::C_NAME, "ulnic_event_record");
//! ```

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Largest control request payload the device reads (spec §4).
pub const MAX_CMD_PAYLOAD: usize = 512;

/// One field of a wire struct, as the C header declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Field name (the same in C and Rust).
    pub name: &'static str,
    /// C element type (`__le32`, `__u8`, `struct ulnic_cookie`).
    pub c_type: &'static str,
    /// Array length, for byte arrays.
    pub array: Option<usize>,
    /// Offset in the struct.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// A wire struct: its C name and fields, for the header generator.
pub trait Layout: Sized {
    /// The C struct's name (without `struct`).
    const C_NAME: &'static str;
    /// What it is, for the header's comment.
    const SUMMARY: &'static str;
    /// Its fields in order.
    fn fields() -> Vec<Field>;
    /// Its size.
    fn size() -> usize {
        core::mem::size_of::<Self>()
    }
}

/// How a field type is spelled in C.
pub trait CType {
    /// The element type.
    const C_TYPE: &'static str;
    /// Array length, if an array.
    const ARRAY: Option<usize> = None;
}

impl CType for u8 {
    const C_TYPE: &'static str = "__u8";
}
impl CType for U16 {
    const C_TYPE: &'static str = "__le16";
}
impl CType for U32 {
    const C_TYPE: &'static str = "__le32";
}
impl CType for U64 {
    const C_TYPE: &'static str = "__le64";
}
impl<const N: usize> CType for [u8; N] {
    const C_TYPE: &'static str = "__u8";
    const ARRAY: Option<usize> = Some(N);
}
impl<const N: usize> CType for [U64; N] {
    const C_TYPE: &'static str = "__le64";
    const ARRAY: Option<usize> = Some(N);
}

/// Defines a wire struct and its [`Layout`].
macro_rules! wire {
    ($(
        $(#[doc = $doc:literal])*
        pub struct $name:ident = $c:literal {
            $( $(#[doc = $fdoc:literal])* pub $f:ident : $t:ty, )*
        }
    )*) => {$(
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
        pub struct $name {
            $( $(#[doc = $fdoc])* pub $f: $t, )*
        }

        impl CType for $name {
            const C_TYPE: &'static str = concat!("struct ", $c);
        }

        impl Layout for $name {
            const C_NAME: &'static str = $c;
            const SUMMARY: &'static str = concat!($($doc),*);
            fn fields() -> Vec<Field> {
                vec![$(Field {
                    name: stringify!($f),
                    c_type: <$t as CType>::C_TYPE,
                    array: <$t as CType>::ARRAY,
                    offset: core::mem::offset_of!($name, $f),
                    size: core::mem::size_of::<$t>(),
                }),*]
            }
        }
    )*};
}

wire! {
    /// Device config space (spec §2.2), 64 bytes, read-only.
    pub struct ConfigSpace = "ulnic_config" {
        /// `CONFIG_MAGIC`.
        pub magic: U32,
        /// Spec major version.
        pub version_major: U16,
        /// Spec minor version.
        pub version_minor: U16,
        /// This node's address.
        pub node: U32,
        /// Endpoints per node.
        pub endpoints: U32,
        /// `INLINE_MAX`.
        pub inline_max: U32,
        /// `MAX_MESSAGE`.
        pub max_message: U32,
        /// `FIRST_DOORBELL_QUEUE`.
        pub first_doorbell_queue: U32,
        /// `MAX_RING_ENTRIES`.
        pub max_ring_entries: U32,
        /// Nodes in the fabric.
        pub nodes: U32,
        /// Tripwires per endpoint.
        pub tripwires: U32,
        /// Implemented feature bits.
        pub features: U64,
        /// Apertures per endpoint.
        pub apertures: U32,
        /// Broken queues, a bit per queue (§2.1).
        pub broken_queues: U32,
        /// Connection epoch (§2.5).
        pub epoch: U32,
        /// Reserved, 0.
        pub reserved: U32,
    }

    /// Control request header (spec §4), followed by the payload.
    pub struct CmdHeader = "ulnic_cmd_header" {
        /// `cmd::*`.
        pub opcode: U32,
        /// Reserved, 0.
        pub reserved: U32,
    }

    /// Control response header (spec §4), followed by the result.
    pub struct RespHeader = "ulnic_resp_header" {
        /// `status::*`.
        pub status: U32,
        /// Reserved, 0.
        pub reserved: U32,
    }

    /// A command payload naming one object: DESTROY_PD (a domain),
    /// DESTROY_ENDPOINT, ARM, DISARM and GET_STATS (an endpoint).
    pub struct ObjectId = "ulnic_object_id" {
        /// Domain or endpoint id.
        pub id: U32,
    }

    /// CREATE_PD payload (spec §4.2, §5.8).
    pub struct CreatePd = "ulnic_create_pd" {
        /// The domain's doorbell bitmap: `doorbell_bitmap_bytes(E)` bytes,
        /// 8-byte aligned, within one page of shared memory.
        pub doorbell_gpa: U64,
    }

    /// CREATE_PD result.
    pub struct PdCreated = "ulnic_pd_created" {
        /// The new domain.
        pub id: U32,
        /// Its doorbell queue (`FIRST_DOORBELL_QUEUE + slot`).
        pub doorbell_queue: U32,
    }

    /// CREATE_ENDPOINT payload (spec §4.3).
    pub struct CreateEndpoint = "ulnic_create_endpoint" {
        /// Protection domain.
        pub pd: U32,
        /// Send ring entries.
        pub send_entries: U32,
        /// Receive ring entries.
        pub recv_entries: U32,
        /// Free ring entries.
        pub free_entries: U32,
        /// Event ring entries.
        pub event_entries: U32,
        /// Pages in the segment.
        pub seg_pages: U32,
        /// Control region address (page aligned, contiguous).
        pub ctrl_gpa: U64,
        /// Control region length.
        pub ctrl_len: U64,
        /// Address of the segment's page table (`seg_pages` u64 addresses).
        pub seg_table_gpa: U64,
    }

    /// CREATE_ENDPOINT result.
    pub struct EndpointCreated = "ulnic_endpoint_created" {
        /// The endpoint's id.
        pub id: U32,
        /// Its domain's doorbell queue.
        pub doorbell_queue: U32,
    }

    /// BIND_PORT payload.
    pub struct BindPort = "ulnic_bind_port" {
        /// Endpoint.
        pub endpoint: U32,
        /// Port number.
        pub port: U32,
    }

    /// SET_FILTER payload header, followed by `count` filter entries.
    pub struct SetFilter = "ulnic_set_filter" {
        /// Endpoint.
        pub endpoint: U32,
        /// Filter entries that follow.
        pub count: U32,
    }

    /// An accept-filter entry (spec §5.7).
    pub struct FilterEntry = "ulnic_filter_entry" {
        /// Source node or `ANY`.
        pub node: U32,
        /// Source port or `ANY`.
        pub port: U32,
        /// Tag value.
        pub tag: U32,
        /// Bits of the tag compared.
        pub tag_mask: U32,
    }

    /// SET_EVENT_QUEUE payload (spec §6.1).
    pub struct SetEventQueue = "ulnic_set_event_queue" {
        /// The source endpoint.
        pub endpoint: U32,
        /// The queue endpoint, or `DETACH`.
        pub queue: U32,
        /// What the source's QUEUED events carry.
        pub cookie: U64,
    }

    /// EXPORT_PIO payload (spec §6.2).
    pub struct ExportPio = "ulnic_export_pio" {
        /// The exporting endpoint.
        pub endpoint: U32,
        /// Window size in pages of 4096 bytes.
        pub pages: U32,
        /// The node allowed to import it, or `ANY`.
        pub importer: U32,
        /// Reserved, 0.
        pub reserved: U32,
    }

    /// EXPORT_PIO result (spec §6.2).
    pub struct PioExported = "ulnic_pio_exported" {
        /// Window id on the exporter's node.
        pub window: U32,
        /// Reserved, 0.
        pub reserved: U32,
        /// 64 random bits an importer must present.
        pub key: U64,
        /// Where the window is in the exporter's aperture.
        pub offset: U64,
    }

    /// IMPORT_PIO payload (spec §6.2).
    pub struct ImportPio = "ulnic_import_pio" {
        /// The importing endpoint.
        pub endpoint: U32,
        /// The exporter's node.
        pub node: U32,
        /// The window id.
        pub window: U32,
        /// Reserved, 0.
        pub reserved: U32,
        /// The window's key.
        pub key: U64,
    }

    /// IMPORT_PIO result (spec §6.2).
    pub struct PioImported = "ulnic_pio_imported" {
        /// Import id on the importer's node.
        pub import: U32,
        /// The window's size in pages.
        pub pages: U32,
        /// Where the window is in the importer's aperture.
        pub offset: U64,
    }

    /// REVOKE_PIO and RELEASE_PIO payload (spec §6.2).
    pub struct PioObject = "ulnic_pio_object" {
        /// Endpoint.
        pub endpoint: U32,
        /// Window (REVOKE_PIO), or import or window (RELEASE_PIO).
        pub id: U32,
    }

    /// EXPORT payload (spec §5.12); the result is a cookie.
    pub struct Export = "ulnic_export" {
        /// Endpoint.
        pub endpoint: U32,
        /// `perm::*`.
        pub perms: U32,
        /// Offset in the segment.
        pub offset: U64,
        /// Length.
        pub len: U64,
    }

    /// EXPORT_BUFFER payload (spec §5.14); the result is a cookie.
    pub struct ExportBuffer = "ulnic_export_buffer" {
        /// Endpoint.
        pub endpoint: U32,
        /// `perm::*`.
        pub perms: U32,
        /// Offset of the buffer in its first page.
        pub page_offset: U64,
        /// Length.
        pub len: U64,
        /// First UTLB entry.
        pub utlb_first: U32,
        /// UTLB entries.
        pub utlb_count: U32,
    }

    /// REVOKE payload.
    pub struct Revoke = "ulnic_revoke" {
        /// Endpoint.
        pub endpoint: U32,
        /// Aperture.
        pub aperture: U32,
    }

    /// SET_TRIPWIRE payload (spec §5.13); the result is the tripwire id
    /// (`ObjectId`).
    pub struct SetTripwire = "ulnic_set_tripwire" {
        /// Endpoint.
        pub endpoint: U32,
        /// Aperture.
        pub aperture: U32,
        /// Offset in the aperture.
        pub offset: U64,
        /// Length.
        pub len: U64,
        /// `tripwire_flags::*`.
        pub flags: U32,
        /// Reserved, 0.
        pub reserved: U32,
        /// The user's cookie, returned in the event.
        pub user: U64,
    }

    /// CLEAR_TRIPWIRE payload.
    pub struct ClearTripwire = "ulnic_clear_tripwire" {
        /// Endpoint.
        pub endpoint: U32,
        /// Tripwire id.
        pub tripwire: U32,
    }

    /// UTLB_SET_TABLE payload (spec §5.14).
    pub struct UtlbSetTable = "ulnic_utlb_set_table" {
        /// Protection domain.
        pub pd: U32,
        /// Entries in the table.
        pub entries: U32,
        /// Table address.
        pub table_gpa: U64,
    }

    /// UTLB_INVALIDATE payload (spec §5.14).
    pub struct UtlbInvalidate = "ulnic_utlb_invalidate" {
        /// Protection domain.
        pub pd: U32,
        /// First entry.
        pub first: U32,
        /// Entries.
        pub count: U32,
    }

    /// GET_INFO result (spec §4.2).
    pub struct DeviceInfo = "ulnic_device_info" {
        /// Spec major version.
        pub version_major: U16,
        /// Spec minor version.
        pub version_minor: U16,
        /// This node's address.
        pub node: U32,
        /// Endpoints per node.
        pub max_endpoints: U32,
        /// Inline payload limit.
        pub inline_max: U32,
        /// Message size limit.
        pub max_message: U32,
        /// Nodes in the fabric.
        pub nodes: U32,
        /// Implemented feature bits.
        pub features: U64,
        /// Tripwires per endpoint.
        pub max_tripwires: U32,
        /// Apertures per endpoint.
        pub max_apertures: U32,
    }

    /// An aperture's cookie (spec §5.12).
    pub struct Cookie = "ulnic_cookie" {
        /// Exporting node.
        pub node: U32,
        /// Aperture id.
        pub aperture: U32,
        /// Reuse count of the slot.
        pub generation: U32,
        /// Reserved, 0.
        pub reserved: U32,
        /// 64 random bits.
        pub key: U64,
    }

    /// A send descriptor (spec §5.3), 128 bytes.
    pub struct SendDesc = "ulnic_send_desc" {
        /// `op::SEND`.
        pub opcode: U16,
        /// `send_flags::*`.
        pub flags: U16,
        /// Payload length.
        pub len: U32,
        /// Destination node.
        pub dest_node: U32,
        /// Destination port.
        pub dest_port: U32,
        /// Tag.
        pub tag: U32,
        /// Reserved, 0.
        pub reserved: U32,
        /// The user's id, returned in events.
        pub user_id: U64,
        /// INLINE: the payload; otherwise a `SendBuffer`.
        pub data: [u8; 96],
    }

    /// Where a non-inline send's payload is: the first bytes of
    /// `SendDesc::data` (spec §5.3).
    pub struct SendBuffer = "ulnic_send_buffer" {
        /// Segment offset; with UTLB, the offset in the first entry's page.
        pub offset: U64,
        /// UTLB only: first entry.
        pub utlb_first: U32,
        /// UTLB only: entries.
        pub utlb_count: U32,
    }

    /// An RDMA descriptor in the send ring (spec §5.12), 128 bytes.
    pub struct RdmaDesc = "ulnic_rdma_desc" {
        /// `op::RDMA_WRITE`, `RDMA_READ` or `WRITE_IMMEDIATE`.
        pub opcode: U16,
        /// `send_flags::*`.
        pub flags: U16,
        /// Bytes (immediates: 4 or 8).
        pub len: U32,
        /// Cookie: node.
        pub cookie_node: U32,
        /// Cookie: aperture.
        pub cookie_aperture: U32,
        /// Cookie: generation.
        pub cookie_generation: U32,
        /// Reserved, 0.
        pub reserved: U32,
        /// The user's id, returned in events.
        pub user_id: U64,
        /// Cookie: key.
        pub cookie_key: U64,
        /// Offset in the aperture.
        pub remote_offset: U64,
        /// Local segment offset (with UTLB: offset in the first page).
        pub local_offset: U64,
        /// The immediate value.
        pub immediate: U64,
        /// UTLB only: first entry.
        pub utlb_first: U32,
        /// UTLB only: entries.
        pub utlb_count: U32,
        /// Unused.
        pub unused: [u8; 56],
    }

    /// A REDIRECT or REDIRECT_END descriptor (spec §5.15), 128 bytes.
    pub struct RedirectDesc = "ulnic_redirect_desc" {
        /// `op::REDIRECT` or `op::REDIRECT_END`.
        pub opcode: U16,
        /// `send_flags::*`.
        pub flags: U16,
        /// REDIRECT: length.
        pub len: U32,
        /// REDIRECT: aperture.
        pub aperture: U32,
        /// Unused.
        pub unused0: [u8; 12],
        /// The redirection's id.
        pub id: U64,
        /// Unused.
        pub unused1: [u8; 8],
        /// REDIRECT: offset in the aperture.
        pub offset: U64,
        /// REDIRECT: offset into the first UTLB entry's page.
        pub page_offset: U64,
        /// Unused.
        pub unused2: [u8; 8],
        /// REDIRECT: first UTLB entry.
        pub utlb_first: U32,
        /// REDIRECT: UTLB entries.
        pub utlb_count: U32,
        /// Unused.
        pub unused3: [u8; 56],
    }

    /// A receive descriptor (spec §5.4), 128 bytes.
    pub struct RecvDesc = "ulnic_recv_desc" {
        /// `recv_flags::*`.
        pub flags: U16,
        /// Reserved, 0.
        pub reserved0: U16,
        /// Payload length.
        pub len: U32,
        /// Source node, stamped by the device.
        pub src_node: U32,
        /// Source port, stamped by the device.
        pub src_port: U32,
        /// The sender's tag.
        pub tag: U32,
        /// The sending endpoint's session id, stamped by the device.
        pub session: U32,
        /// Id of the free buffer used (0 if inline).
        pub buf_id: U64,
        /// INLINE: the payload; otherwise the buffer's u64 segment offset.
        pub data: [u8; 96],
    }

    /// A free descriptor (spec §5.5).
    pub struct FreeDesc = "ulnic_free_desc" {
        /// Buffer offset in the segment.
        pub seg_offset: U64,
        /// Buffer length.
        pub len: U32,
        /// Reserved, 0.
        pub reserved0: U32,
        /// The user's id, returned in the receive descriptor.
        pub user_id: U64,
        /// Reserved, 0.
        pub reserved1: U64,
    }

    /// An event record: one entry of the event ring (spec §5.6).
    pub struct EventRecord = "ulnic_event_record" {
        /// `event::*`.
        pub kind: U16,
        /// Error or condition code.
        pub code: U16,
        /// Tripwire id, redirection offset; else 0.
        pub aux: U32,
        /// The user's id.
        pub user_id: U64,
        /// Node.
        pub node: U32,
        /// Port.
        pub port: U32,
        /// Length.
        pub len: U32,
        /// OOB: the sender's session id; else 0.
        pub session: U32,
    }

    /// A notification record (spec §6).
    pub struct NotifyRecord = "ulnic_notify_record" {
        /// The endpoint notified.
        pub endpoint: U32,
        /// Reason: `notify_reason::ENDPOINT` (0) or `RESET` (1).
        pub reason: U32,
    }

    /// A fabric packet's header (spec §10.3), 72 bytes, followed by
    /// `len` payload bytes. Used between switches inside a device, between
    /// devices over UDP and in captures.
    pub struct PacketHeader = "ulnic_packet_header" {
        /// `packet::MAGIC`.
        pub magic: U16,
        /// `packet::VERSION`.
        pub version: U16,
        /// `packet::DATA`, `ACK`, `NACK`, `RESPONSE`, `PROBE`, `PROBE_REPLY`
        /// or `ROUTES`.
        pub kind: U16,
        /// Switches passed so far: the index of the next route byte to
        /// use; not covered by the CRC.
        pub hop: U16,
        /// Source node.
        pub src_node: U32,
        /// Destination node.
        pub dst_node: U32,
        /// The sending endpoint's index on the source node: with the four
        /// addresses it names the transport channel.
        pub src_endpoint: U32,
        /// The sending endpoint's port (stamped by the source NIC).
        pub src_port: U32,
        /// Destination port.
        pub dst_port: U32,
        /// The channel's epoch: a new one starts after a message is
        /// returned or refused, and sequence numbers restart at 0.
        pub epoch: U32,
        /// DATA: the message's sequence number; ACK: the last one
        /// delivered; NACK: the one refused; RESPONSE: the read answered.
        pub seq: U32,
        /// DATA: this fragment's index.
        pub frag: U16,
        /// DATA: fragments in the message.
        pub frags: U16,
        /// DATA: the whole message's length.
        pub msg_len: U32,
        /// DATA: this fragment's offset in the message.
        pub offset: U32,
        /// Payload bytes after the header.
        pub len: U32,
        /// DATA: the sender's tag.
        pub tag: U32,
        /// NACK: why (a `tx_error` code).
        pub code: U16,
        /// Source-route bytes between the header and the payload, one
        /// gate to leave by per switch; not covered by the CRC.
        pub route_len: U16,
        /// CRC-32 (IEEE) of the header, with `hop`, `route_len` and `crc`
        /// zero, and the payload.
        pub crc: U32,
        /// DATA: the operation, a send-ring `op` (SEND, RDMA_WRITE,
        /// RDMA_READ, WRITE_IMMEDIATE, OOB); ACK, NACK, RESPONSE: that of
        /// the DATA they answer. It names the channel's class.
        pub opcode: U16,
        /// DATA of a SEND: the `recv_flags` it arrives with (CLOSE); else 0.
        pub flags: U16,
        /// DATA: the sending endpoint's session id (spec §5.4).
        pub session: U32,
    }

    /// The start of a remote access's payload in the fabric (spec §10.4),
    /// 48 bytes: the cookie, then what to access.
    pub struct RemoteAccess = "ulnic_remote_access" {
        /// Cookie: node (the receiving node).
        pub cookie_node: U32,
        /// Cookie: aperture.
        pub cookie_aperture: U32,
        /// Cookie: generation.
        pub cookie_generation: U32,
        /// Reserved, 0 (the cookie's).
        pub cookie_reserved: U32,
        /// Cookie: key.
        pub cookie_key: U64,
        /// Offset in the aperture.
        pub offset: U64,
        /// Bytes accessed (a read: bytes to return; an immediate: 4 or 8).
        pub len: U32,
        /// Reserved, 0.
        pub reserved: U32,
        /// The immediate's value (else 0).
        pub immediate: U64,
    }

    /// One hole a SACK reports (spec §10.4): fragments `first..=last` of
    /// message `seq` did not come (`last` = `packet::SACK_TO_END`: none
    /// from `first` on, the message's length unknown).
    pub struct SackHole = "ulnic_sack_hole" {
        /// The message's sequence number.
        pub seq: U32,
        /// First missing fragment.
        pub first: U16,
        /// Last missing fragment, inclusive.
        pub last: U16,
    }

    /// The start of a datagram between device processes (spec §10.7),
    /// followed by one packet (§10.3) and `datagram::MAC_SIZE` bytes of
    /// HMAC-SHA256 over everything before them.
    pub struct DatagramHeader = "ulnic_datagram_header" {
        /// `datagram::MAGIC`.
        pub magic: U32,
        /// The lane the packet crossed: `datagram::lane(link, direction)`.
        pub lane: U32,
    }

    /// A PROBE_REPLY's payload (spec §10.9); a switch's name (UTF-8, at
    /// most `mapping::MAX_SWITCH_NAME` bytes) follows, a node's reply ends
    /// here.
    pub struct ProbeReply = "ulnic_probe_reply" {
        /// `mapping::ANSWER_SWITCH` or `mapping::ANSWER_NODE`.
        pub answer: u8,
        /// A switch: the gate the probe came in by.
        pub in_gate: u8,
        /// A switch: its gate count.
        pub gates: u8,
        /// Reserved, 0.
        pub reserved: u8,
        /// A switch: its id; a node: its number.
        pub id: U32,
    }

    /// The fixed start of a ROUTES entry (spec §10.9), followed by
    /// `route_len` gate bytes; entries follow each other unaligned.
    pub struct RouteEntryHead = "ulnic_route_entry_head" {
        /// The destination node.
        pub dst_node: U32,
        /// Gate bytes that follow.
        pub route_len: u8,
    }

    /// `IOC_CREATE_EP` argument (spec §9).
    pub struct IocCreateEp = "ulnic_ioc_create_ep" {
        /// In: send ring entries.
        pub send_entries: U32,
        /// In: receive ring entries.
        pub recv_entries: U32,
        /// In: free ring entries.
        pub free_entries: U32,
        /// In: event ring entries.
        pub event_entries: U32,
        /// In: segment bytes asked for.
        pub segment_bytes: U64,
        /// Out: the endpoint's id.
        pub id: U32,
        /// Out: its doorbell queue.
        pub doorbell_queue: U32,
        /// Out: control region bytes (to mmap).
        pub ctrl_len: U64,
        /// Out: segment bytes (to mmap).
        pub segment_len: U64,
        /// Reserved, 0.
        pub reserved: [u8; 16],
    }

    /// `IOC_COMMAND` argument (spec §9).
    pub struct IocCommand = "ulnic_ioc_command" {
        /// In: opcode.
        pub opcode: U32,
        /// Out: device status.
        pub status: U32,
        /// In: payload bytes.
        pub in_len: U32,
        /// Out: result bytes.
        pub out_len: U32,
        /// In: payload; out: result.
        pub data: [u8; MAX_CMD_PAYLOAD],
    }

    /// `IOC_WAIT` argument (spec §9).
    pub struct IocWait = "ulnic_ioc_wait" {
        /// Endpoint.
        pub id: U32,
        /// Timeout in milliseconds.
        pub timeout_ms: U32,
    }

    /// `IOC_UTLB_INSTALL` argument (spec §9).
    pub struct IocUtlbInstall = "ulnic_ioc_utlb_install" {
        /// First entry.
        pub first: U32,
        /// Entries (pages).
        pub count: U32,
        /// Page-aligned virtual address of the first page.
        pub va: U64,
    }

    /// `IOC_WATCH` argument (spec §9).
    pub struct IocWatch = "ulnic_ioc_watch" {
        /// The file's endpoint.
        pub id: U32,
        /// The watcher's descriptor (`IOC_WATCHER`).
        pub watcher: U32,
        /// `uapi::WATCH_REMOVE` or 0.
        pub flags: U32,
        /// Reserved, 0.
        pub reserved: U32,
    }

    /// `IOC_TAKE_NOTIFIED` result (spec §9): which of the file's
    /// endpoints were notified, now taken.
    pub struct IocNotified = "ulnic_ioc_notified" {
        /// Bit `e % 64` of word `e / 64` set for endpoint `e`.
        pub bits: [U64; 64],
    }
}

/// Every wire struct, for the header generator and its tests: (C name,
/// summary, size, fields).
pub fn all() -> Vec<(&'static str, &'static str, usize, Vec<Field>)> {
    fn one<T: Layout>() -> (&'static str, &'static str, usize, Vec<Field>) {
        (T::C_NAME, T::SUMMARY, T::size(), T::fields())
    }
    vec![
        one::<ConfigSpace>(),
        one::<CmdHeader>(),
        one::<RespHeader>(),
        one::<ObjectId>(),
        one::<CreatePd>(),
        one::<PdCreated>(),
        one::<CreateEndpoint>(),
        one::<EndpointCreated>(),
        one::<BindPort>(),
        one::<SetFilter>(),
        one::<FilterEntry>(),
        one::<Export>(),
        one::<ExportBuffer>(),
        one::<Revoke>(),
        one::<SetEventQueue>(),
        one::<ExportPio>(),
        one::<PioExported>(),
        one::<ImportPio>(),
        one::<PioImported>(),
        one::<PioObject>(),
        one::<SetTripwire>(),
        one::<ClearTripwire>(),
        one::<UtlbSetTable>(),
        one::<UtlbInvalidate>(),
        one::<DeviceInfo>(),
        one::<Cookie>(),
        one::<SendDesc>(),
        one::<SendBuffer>(),
        one::<RdmaDesc>(),
        one::<RedirectDesc>(),
        one::<RecvDesc>(),
        one::<FreeDesc>(),
        one::<EventRecord>(),
        one::<NotifyRecord>(),
        one::<PacketHeader>(),
        one::<IocCreateEp>(),
        one::<IocCommand>(),
        one::<IocWait>(),
        one::<IocUtlbInstall>(),
        one::<IocNotified>(),
        one::<IocWatch>(),
    ]
}

/// The fabric's layouts (spec §10): packets, datagrams between device
/// processes and the mapper's payloads. No driver needs them; the
/// Wireshark dissector's tables are generated from them.
pub fn fabric() -> Vec<(&'static str, &'static str, usize, Vec<Field>)> {
    fn one<T: Layout>() -> (&'static str, &'static str, usize, Vec<Field>) {
        (T::C_NAME, T::SUMMARY, T::size(), T::fields())
    }
    vec![
        one::<PacketHeader>(),
        one::<RemoteAccess>(),
        one::<SackHole>(),
        one::<DatagramHeader>(),
        one::<ProbeReply>(),
        one::<RouteEntryHead>(),
    ]
}

/// A wire struct read from the start of `b`; bytes past the end of a
/// short `b` read as zero (callers check lengths; this never panics).
pub fn read<T: FromBytes + IntoBytes>(b: &[u8]) -> T {
    let mut v = T::new_zeroed();
    let n = b.len().min(core::mem::size_of::<T>());
    v.as_mut_bytes()[..n].copy_from_slice(&b[..n]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_those_of_the_spec() {
        let want = [
            ("ulnic_config", 64),
            ("ulnic_create_endpoint", 48),
            ("ulnic_device_info", 40),
            ("ulnic_cookie", 24),
            ("ulnic_send_desc", 128),
            ("ulnic_rdma_desc", 128),
            ("ulnic_redirect_desc", 128),
            ("ulnic_recv_desc", 128),
            ("ulnic_free_desc", 32),
            ("ulnic_event_record", 32),
            ("ulnic_notify_record", 8),
            ("ulnic_packet_header", 72),
            ("ulnic_remote_access", 48),
            ("ulnic_sack_hole", 8),
            ("ulnic_ioc_create_ep", 64),
            ("ulnic_ioc_command", 528),
            ("ulnic_datagram_header", 8),
            ("ulnic_probe_reply", 8),
            ("ulnic_route_entry_head", 5),
        ];
        let all: Vec<_> = all().into_iter().chain(fabric()).collect();
        for (name, size) in want {
            let got = all.iter().find(|s| s.0 == name).unwrap().2;
            assert_eq!(got, size, "{name}");
        }
    }

    #[test]
    fn every_field_is_naturally_aligned() {
        // So the C compiler lays the struct out the same with no packing,
        // on 64-bit and (compat_ioctl) 32-bit alike.
        for (name, _, size, fields) in all() {
            let mut end = 0;
            for f in &fields {
                let align = if f.array.is_some() || f.c_type.starts_with("struct") {
                    1
                } else {
                    f.size
                };
                assert_eq!(f.offset % align, 0, "{name}.{}", f.name);
                assert_eq!(f.offset, end, "{name}.{} leaves a gap", f.name);
                end = f.offset + f.size;
            }
            assert_eq!(end, size, "{name}");
            assert_eq!(size % 4, 0, "{name}");
        }
    }

    #[test]
    fn fabric_layouts_have_no_gaps() {
        for (name, _, size, fields) in fabric() {
            let mut end = 0;
            for f in &fields {
                assert_eq!(f.offset, end, "{name}.{} leaves a gap", f.name);
                end = f.offset + f.size;
            }
            assert_eq!(end, size, "{name}");
        }
    }

    #[test]
    fn short_input_reads_as_zero_past_its_end() {
        let e: EventRecord = read(&[1, 0, 2]);
        assert_eq!((e.kind.get(), e.code.get(), e.user_id.get()), (1, 2, 0));
    }
}
