//! The constants of the spec: versions, identities, feature bits, limits,
//! queue numbers, control-block offsets, sizes derived from the wire
//! structs, and the code namespaces (commands, statuses, opcodes, flags,
//! event kinds, TX errors, conditions). Re-exported at the crate's root.

use crate::wire;

/// Defines a namespace's codes: each a `pub const`, and a list of every
/// (name, value) in order, from which the C header and the Wireshark
/// dissector's tables are generated.
macro_rules! codes {
    ($all:ident: $t:ty { $( $(#[doc = $d:literal])* $name:ident = $v:expr, )* }) => {
        $( $(#[doc = $d])* pub const $name: $t = $v; )*
        /// Every code of this namespace by name, in order.
        pub const $all: &[(&str, $t)] = &[ $( (stringify!($name), $name), )* ];
    };
}

use zerocopy::little_endian::{U32, U64};

/// Specification version implemented (major changes break drivers).
pub const SPEC_VERSION_MAJOR: u16 = 0;
/// Specification minor version (compatible additions).
pub const SPEC_VERSION_MINOR: u16 = 14;

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
/// Device feature bit: out-of-band messages (spec §5.3): at most
/// `OOB_MAX` bytes, delivered as an event ahead of queued messages.
pub const F_OOB: u64 = 1 << 5;
/// Device feature bit: return to sender (spec §10.4): a message the
/// fabric's transport gives up on comes back into the sender's receive
/// queue, payload and all, flagged `recv_flags::RETURNED`. Without it the
/// sender sees only the `TX_ERROR` event.
pub const F_RETURN_TO_SENDER: u64 = 1 << 6;
/// Device feature bit: PIO windows (spec §6.2): memory one frontend
/// exports, mapped into another frontend's shared-memory region and
/// written with plain stores.
pub const F_PIO: u64 = 1 << 7;
/// Feature bits this version of the device implements.
pub const F_IMPLEMENTED: u64 = F_MESSAGING
    | F_UTLB
    | F_CLOSE_MESSAGE
    | F_RDMA
    | F_TRIPWIRE
    | F_OOB
    | F_RETURN_TO_SENDER
    | F_PIO;
/// PIO windows mapped into one frontend's aperture at a time (spec §6.2).
pub const MAX_PIO_MAPPINGS: u32 = 4;
/// Largest PIO window, in pages (64 MiB).
pub const MAX_PIO_PAGES: u32 = 16384;
/// The device's PIO aperture per frontend unless told otherwise (64 MiB).
pub const DEFAULT_PIO_APERTURE: u64 = 64 << 20;

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

/// Notification record reasons (spec §6).
pub mod notify_reason {
    /// An endpoint's notification.
    pub const ENDPOINT: u32 = 0;
    /// The node's objects were forgotten under a running driver (spec
    /// §2.5); the record's endpoint field is the reset's number.
    pub const RESET: u32 = 1;
    /// A PIO window this node imported was revoked, or an import or a
    /// window of it released (spec §6.2): the endpoint field is the
    /// import's or window's id; a driver zaps its processes' mappings.
    pub const PIO_UNMAPPED: u32 = 2;
    /// The device's own name for the RESET record in its notification
    /// backlog (no endpoint has this id); not on the wire.
    pub const RESET_ENDPOINT: u32 = u32::MAX;
}
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
    bitmap::words(endpoints) as u64 * 8
}

/// Bitmaps of endpoints in little-endian u64 words: a domain's doorbell
/// bitmap (spec §5.8) and `IOC_TAKE_NOTIFIED`'s report (§9). Bit `e % 64`
/// of word `e / 64` stands for endpoint `e`, which is also Linux's
/// `set_bit_le` on the same bytes.
pub mod bitmap {
    /// Bits per word.
    pub const WORD_BITS: u32 = 64;

    /// The index of the word holding endpoint `e`'s bit.
    pub const fn word(e: u32) -> usize {
        (e / WORD_BITS) as usize
    }

    /// Endpoint `e`'s bit in its word (a native value: store it
    /// little endian).
    pub const fn mask(e: u32) -> u64 {
        1 << (e % WORD_BITS)
    }

    /// The byte offset of `e`'s word from the bitmap's start.
    pub const fn word_offset(e: u32) -> u64 {
        word(e) as u64 * 8
    }

    /// Words for `endpoints` endpoints.
    pub const fn words(endpoints: u32) -> usize {
        endpoints.div_ceil(WORD_BITS) as usize
    }

    /// The endpoints whose bits are set in word `index`, which holds `bits`.
    pub fn endpoints(index: usize, mut bits: u64) -> impl Iterator<Item = u32> {
        core::iter::from_fn(move || {
            (bits != 0).then(|| {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                index as u32 * WORD_BITS + b
            })
        })
    }
}

// IOC_TAKE_NOTIFIED reports a bit for every endpoint a node may have.
const _: () =
    assert!(core::mem::size_of::<wire::IocNotified>() == bitmap::words(MAX_ENDPOINTS_LIMIT) * 8);
// A domain's whole doorbell bitmap fits in the page the driver maps.
const _: () = assert!(doorbell_bitmap_bytes(MAX_ENDPOINTS_LIMIT) <= PAGE_SIZE);

/// Offset of inline data in send and receive descriptors.
pub const INLINE_OFFSET: usize = core::mem::offset_of!(wire::SendDesc, data);
// The descriptors' inline data is exactly INLINE_MAX bytes.
const _: () =
    assert!(INLINE_OFFSET + INLINE_MAX as usize == core::mem::size_of::<wire::SendDesc>());
const _: () = assert!(
    core::mem::offset_of!(wire::RecvDesc, data) + INLINE_MAX as usize
        == core::mem::size_of::<wire::RecvDesc>()
);

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

/// SET_EVENT_QUEUE's queue to detach a source from its queue (spec §6.1).
pub const EVENT_QUEUE_DETACH: u32 = 0xffff_ffff;

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
    /// The endpoint's session id (u32, spec §5.4), written by the device
    /// when the endpoint is created.
    pub const SESSION: u64 = 0x380;
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
    codes!(ALL: u32 {
        /// Device information.
        GET_INFO = 0x01,
        /// Create a protection domain.
        CREATE_PD = 0x02,
        /// Destroy a protection domain and every endpoint in it.
        DESTROY_PD = 0x03,
        /// Driver only: RESET notification R was taken (spec §2.5); if R
        /// is the latest, commands run again.
        ACK_RESET = 0x04,
        /// Create an endpoint.
        CREATE_ENDPOINT = 0x10,
        /// Destroy an endpoint.
        DESTROY_ENDPOINT = 0x11,
        /// Bind an endpoint to a port number on this node.
        BIND_PORT = 0x12,
        /// Replace an endpoint's accept filter.
        SET_FILTER = 0x13,
        /// Enable notifications (interrupts) for an endpoint.
        ARM = 0x14,
        /// Disable notifications for an endpoint.
        DISARM = 0x15,
        /// Read an endpoint's counters.
        GET_STATS = 0x16,
        /// Attach an endpoint to an event queue (or detach it).
        SET_EVENT_QUEUE = 0x17,
        /// Create a PIO window and map it into the exporter's aperture.
        EXPORT_PIO = 0x18,
        /// Map another node's PIO window into this frontend's aperture.
        IMPORT_PIO = 0x19,
        /// Unmap a PIO window everywhere and destroy it.
        REVOKE_PIO = 0x1a,
        /// Drop an import of a PIO window, freeing its aperture range.
        RELEASE_PIO = 0x1b,
        /// Export a segment range as an aperture; returns its cookie.
        EXPORT = 0x30,
        /// Revoke an aperture.
        REVOKE = 0x31,
        /// Export a user buffer named by UTLB entries as an aperture.
        EXPORT_BUFFER = 0x32,
        /// Set a tripwire on an aperture range.
        SET_TRIPWIRE = 0x40,
        /// Remove a tripwire.
        CLEAR_TRIPWIRE = 0x41,
        /// Driver only: give a protection domain its UTLB translation table.
        UTLB_SET_TABLE = 0x20,
        /// Driver only: drop cached translations of UTLB entries (after
        /// rewriting them, before unpinning the old pages).
        UTLB_INVALIDATE = 0x21,
    });
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
            GET_INFO => core::mem::size_of::<crate::wire::DeviceInfo>(),
            CREATE_PD => core::mem::size_of::<crate::wire::PdCreated>(),
            CREATE_ENDPOINT => core::mem::size_of::<crate::wire::EndpointCreated>(),
            GET_STATS => crate::constants::STAT_NAMES.len() * 8,
            EXPORT | EXPORT_BUFFER => core::mem::size_of::<crate::wire::Cookie>(),
            SET_TRIPWIRE => core::mem::size_of::<crate::wire::ObjectId>(),
            EXPORT_PIO => core::mem::size_of::<crate::wire::PioExported>(),
            IMPORT_PIO => core::mem::size_of::<crate::wire::PioImported>(),
            _ => 0,
        }
    }

    /// The feature bits a driver must have accepted (SET_FEATURES) for the
    /// device to run a command; without them it answers `NOT_SUPPORTED`.
    pub fn required_features(opcode: u32) -> u64 {
        match opcode {
            GET_INFO | ACK_RESET => 0,
            UTLB_SET_TABLE | UTLB_INVALIDATE => {
                crate::constants::F_MESSAGING | crate::constants::F_UTLB
            }
            EXPORT | REVOKE => crate::constants::F_MESSAGING | crate::constants::F_RDMA,
            EXPORT_PIO | IMPORT_PIO | REVOKE_PIO | RELEASE_PIO => {
                crate::constants::F_MESSAGING | crate::constants::F_PIO
            }
            EXPORT_BUFFER => {
                crate::constants::F_MESSAGING | crate::constants::F_RDMA | crate::constants::F_UTLB
            }
            SET_TRIPWIRE | CLEAR_TRIPWIRE => {
                crate::constants::F_MESSAGING
                    | crate::constants::F_RDMA
                    | crate::constants::F_TRIPWIRE
            }
            _ => crate::constants::F_MESSAGING,
        }
    }
}

/// Status codes of control responses (spec §4.1).
pub mod status {
    codes!(ALL: u32 {
        /// Success.
        OK = 0,
        /// Unknown opcode.
        UNKNOWN_COMMAND = 1,
        /// Request or response buffer too short, or malformed chain.
        BAD_LENGTH = 2,
        /// An argument is out of range.
        INVALID_ARGUMENT = 3,
        /// A limit was reached (endpoints, domains).
        NO_RESOURCES = 4,
        /// No such protection domain or endpoint on this node.
        NOT_FOUND = 5,
        /// The port number is already bound on this node.
        ADDRESS_IN_USE = 6,
        /// A guest address is outside the memory the driver shared.
        BAD_ADDRESS = 7,
        /// The command belongs to a feature this device does not implement.
        NOT_SUPPORTED = 8,
        /// The node's objects were forgotten under a running driver (spec
        /// §2.5); nothing runs until `ACK_RESET`.
        RESET = 9,
    });

    /// An errno a driver gives for a status other than OK (spec §9), by
    /// its Linux name (the numbers are the platform's).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[allow(clippy::upper_case_acronyms)]
    pub enum Errno {
        /// Invalid argument.
        EINVAL,
        /// No space left (a limit was reached).
        ENOSPC,
        /// No such entry.
        ENOENT,
        /// Address in use.
        EADDRINUSE,
        /// Bad address.
        EFAULT,
        /// Operation not supported.
        EOPNOTSUPP,
        /// Protocol error.
        EPROTO,
        /// No such device (its objects are gone).
        ENODEV,
    }

    impl Errno {
        /// Its C name.
        pub const fn name(self) -> &'static str {
            match self {
                Errno::EINVAL => "EINVAL",
                Errno::ENOSPC => "ENOSPC",
                Errno::ENOENT => "ENOENT",
                Errno::EADDRINUSE => "EADDRINUSE",
                Errno::EFAULT => "EFAULT",
                Errno::EOPNOTSUPP => "EOPNOTSUPP",
                Errno::EPROTO => "EPROTO",
                Errno::ENODEV => "ENODEV",
            }
        }
    }

    /// Every status other than OK and the errno a driver gives for it
    /// (spec §9); any other code is `OTHER_ERRNO`. The Linux driver's
    /// table is generated from this one, the library's uses it.
    pub const ERRNO: [(u32, Errno); 9] = [
        (UNKNOWN_COMMAND, Errno::EPROTO),
        (BAD_LENGTH, Errno::EINVAL),
        (INVALID_ARGUMENT, Errno::EINVAL),
        (NO_RESOURCES, Errno::ENOSPC),
        (NOT_FOUND, Errno::ENOENT),
        (ADDRESS_IN_USE, Errno::EADDRINUSE),
        (BAD_ADDRESS, Errno::EFAULT),
        (NOT_SUPPORTED, Errno::EOPNOTSUPP),
        (RESET, Errno::ENODEV),
    ];
    /// The errno of a code `ERRNO` does not list.
    pub const OTHER_ERRNO: Errno = Errno::EPROTO;

    /// The errno a driver gives for a command that failed with `code`.
    pub fn errno(code: u32) -> Errno {
        ERRNO
            .iter()
            .find(|e| e.0 == code)
            .map_or(OTHER_ERRNO, |e| e.1)
    }

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
            RESET => "node reset, not yet acknowledged",
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
    /// Send an out-of-band message (at most `OOB_MAX` bytes, inline),
    /// delivered as an `event::OOB`.
    pub const OOB: u16 = 7;
    /// Fire the tripwires on a range of a PIO window the writer stored
    /// into (spec §6.2); the RDMA layout, the grant as its cookie.
    pub const PIO_SYNC: u16 = 8;
}

/// Bytes an out-of-band message carries at most (spec §5.3).
pub const OOB_MAX: u32 = 8;

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
    /// The range is in a PIO window (spec §6.2), fired by PIO_SYNC.
    pub const PIO: u32 = 1 << 3;
    /// All flags.
    pub const ALL: u32 = WRITE | READ | PERSISTENT | PIO;
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
    /// `version`: 3 named the operation and the sender's session; 4 adds
    /// the SACK (an ACK with code `ACK_GAP` lists what is missing); 5 the
    /// ROOM packet (a sender asks for the receiver's room instead of
    /// sending a message to be refused).
    pub const VERSION: u16 = 5;
    codes!(KINDS: u16 {
        /// A fragment of a message.
        DATA = 1,
        /// Every message of the channel's epoch up to `seq` was delivered.
        ACK = 2,
        /// Message `seq` was not delivered; `code` says why.
        NACK = 3,
        /// A mapper's probe (spec §10.9): the switch where its route ends, or
        /// the node it reaches, answers with a `PROBE_REPLY`.
        PROBE = 4,
        /// The answer to a probe: who is there.
        PROBE_REPLY = 5,
        /// Routes from the mapper for the destination node's route table.
        ROUTES = 6,
        /// Bytes a read returns (spec §10.4): settles the read like an ACK.
        RESPONSE = 7,
        /// A sender held by the receiver's room asks for it (spec §10.4):
        /// answered with an ACK of code `ACK_ROOM`, or NACK NO_ENDPOINT.
        ROOM = 8,
    });
    /// An ACK's `code`: a SACK, whose payload lists what is missing
    /// (`wire::SackHole` entries, spec §10.4).
    pub const ACK_GAP: u16 = 1;
    /// An ACK's `code`: the answer to a ROOM packet, with the receiver's
    /// room now (spec §10.4).
    pub const ACK_ROOM: u16 = 2;
    /// Holes a SACK lists at most (after the entry naming the packet that
    /// drew it).
    pub const MAX_SACK_HOLES: usize = 31;
    /// A `SackHole`'s `last` when the whole message is missing.
    pub const SACK_TO_END: u16 = 0xffff;
    const _: () = assert!(
        (1 + MAX_SACK_HOLES) * core::mem::size_of::<crate::wire::SackHole>()
            <= crate::constants::fabric::MIN_MTU as usize
    );
    /// Largest piece of an RDMA access carried as one message (spec §10.4).
    pub const RDMA_PIECE: u32 = 512 << 10;
    /// Bytes of the remote-access header before a write's data.
    pub const ACCESS_HEADER_SIZE: usize = core::mem::size_of::<crate::wire::RemoteAccess>();
    const _: () =
        assert!(RDMA_PIECE as usize + ACCESS_HEADER_SIZE <= crate::constants::MAX_MESSAGE as usize);
    /// Switches a route may cross: the most source-route bytes a packet
    /// carries.
    pub const MAX_ROUTE: usize = 16;
    /// Size of the header.
    pub const HEADER_SIZE: usize = core::mem::size_of::<crate::wire::PacketHeader>();
}

/// The fabric's links (spec §10.1).
pub mod fabric {
    /// Smallest MTU a link may have: an inline message fits in one packet.
    pub const MIN_MTU: u32 = 256;
    /// Largest MTU a link may have (a message is at most `MAX_MESSAGE`).
    pub const MAX_MTU: u32 = crate::constants::MAX_MESSAGE;
    /// Most links one switch may have: a route names a gate in one byte.
    pub const MAX_GATES: usize = 256;
    const _: () = assert!(MIN_MTU >= crate::constants::INLINE_MAX);
}

/// Datagrams between device processes (spec §10.7): the header is
/// `wire::DatagramHeader`.
pub mod datagram {
    use crate::constants::{fabric, packet, MAX_MESSAGE};
    use crate::wire::DatagramHeader;

    /// `magic`: "ULUD" in little endian.
    pub const MAGIC: u32 = 0x4455_4c55;
    /// Bytes of the HMAC-SHA256 that ends every datagram.
    pub const MAC_SIZE: usize = 32;
    /// Bytes before the packet.
    pub const HEADER_SIZE: usize = core::mem::size_of::<DatagramHeader>();
    /// The largest UDP payload over IPv4.
    pub const MAX_UDP_PAYLOAD: usize = 65_507;
    /// The largest packet (header, route and payload) one datagram carries.
    pub const MAX_PACKET: usize = MAX_UDP_PAYLOAD - HEADER_SIZE - MAC_SIZE;
    /// The largest MTU of a link joining two device processes: a packet's
    /// header and a full route must fit beside the payload (65,387).
    pub const MAX_MTU: usize = MAX_PACKET - packet::HEADER_SIZE - packet::MAX_ROUTE;
    /// The shortest datagram that can be valid.
    pub const MIN_LEN: usize = HEADER_SIZE + packet::HEADER_SIZE + MAC_SIZE;
    /// Bytes a fabric's secret (`--key-file`) holds at least; the key is
    /// its SHA-256.
    pub const MIN_SECRET: usize = 16;
    /// Packets the far end of a lane between device processes holds (at
    /// least): credits do not cross processes, and this many carry the
    /// largest message at the smallest MTU.
    pub const FAR_BUFFER: usize = (MAX_MESSAGE / fabric::MIN_MTU) as usize;

    /// The lane of link `link` in `direction` (0: from its first end).
    pub const fn lane(link: usize, direction: usize) -> usize {
        2 * link + direction
    }
    const _: () = assert!(MAX_MTU >= fabric::MIN_MTU as usize);
}

/// The mapper's payloads (spec §10.9): `wire::ProbeReply`, and ROUTES
/// entries of a `wire::RouteEntryHead` and its gate bytes.
pub mod mapping {
    use crate::constants::fabric;
    use crate::wire::ProbeReply;

    /// `ProbeReply::answer`: a switch answered.
    pub const ANSWER_SWITCH: u8 = 1;
    /// `ProbeReply::answer`: a node answered.
    pub const ANSWER_NODE: u8 = 2;
    /// The longest switch name a switch's reply carries.
    pub const MAX_SWITCH_NAME: usize = 64;
    /// The source node of a packet a switch makes.
    pub const FROM_SWITCH: u32 = u32::MAX;
    /// The most payload one ROUTES packet carries.
    pub const ROUTES_ROOM: usize = 240;
    // Both payloads fit in one packet on any link.
    const _: () = assert!(ROUTES_ROOM <= fabric::MIN_MTU as usize);
    const _: () =
        assert!(core::mem::size_of::<ProbeReply>() + MAX_SWITCH_NAME <= fabric::MIN_MTU as usize);
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
    /// An out-of-band message: `user_id` holds its bytes, `len` their
    /// count, `aux` the tag, node/port the sender, `session` its session.
    pub const OOB: u16 = 6;
    /// The fabric's transport gave up on node `node` (spec §10.4).
    pub const UNREACHABLE: u16 = 7;
    /// Posted to an event queue for one of its sources (spec §6.1):
    /// `user_id` is the source's cookie, `aux` its endpoint id, `port`
    /// its bound port.
    pub const QUEUED: u16 = 8;
    /// A PIO window this endpoint imported was revoked (spec §6.2): `aux`
    /// is the import id, `user_id` the window's key, `node` the
    /// exporter's node, `len` the window's bytes.
    pub const PIO_REVOKED: u16 = 9;
}

/// Codes of `TX_ERROR` events.
pub mod tx_error {
    codes!(ALL: u16 {
        /// No endpoint is bound to the destination (node, port), or it went away.
        NO_ENDPOINT = 1,
        /// The receiver had no free buffer or no receive slot (return to sender).
        NO_BUFFER = 2,
        /// The receiver's accept filter refused the message.
        REJECTED = 3,
        /// The message was larger than the receiver's next free buffer.
        BUFFER_TOO_SMALL = 4,
        /// The descriptor was malformed (opcode, flags, length).
        BAD_DESCRIPTOR = 5,
        /// The payload range lies outside the sender's segment.
        BAD_ADDRESS = 6,
        /// The sending endpoint is not bound to a port.
        NOT_BOUND = 7,
        /// RDMA: the cookie names no live aperture (or a wrong key/generation).
        BAD_COOKIE = 8,
        /// RDMA: the aperture does not allow this access.
        PERMISSION_DENIED = 9,
        /// RDMA: the range runs past the aperture's end.
        OUT_OF_RANGE = 10,
        /// UTLB: an entry outside the domain's table, not installed, or a
        /// buffer longer than its entries.
        NO_TRANSLATION = 11,
        /// Redirection: `MAX_REDIRECTS` are active on the endpoint already.
        TOO_MANY_REDIRECTS = 12,
        /// Fabric: no acknowledgement after the configured retries (the
        /// destination is partitioned away or its device is gone).
        UNREACHABLE = 13,
    });

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
