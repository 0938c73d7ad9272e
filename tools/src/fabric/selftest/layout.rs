//! The operations the self-test mixes, and where in a node's segment each
//! lands. Every node exports its whole segment to the others:
//!
//! ```text
//! writes    slot (src, k): rdma-write seq w from src lands in k = w % SLOTS
//! immediate slot (src, k): the data written just before immediate j, k = j % SLOTS
//! counters  word src: j + 1 once src's immediate j landed
//! staging   slot i: bytes this node is writing (one per operation in flight)
//! landing   256 bytes i: bytes this node is reading
//! readable  READABLE bytes the others read, a pattern of (node, offset)
//! ```
//!
//! A written slot holds `seq + 1` in its first word (0: never written),
//! then src and dst, then a fill derived from all three: a slot that holds
//! anything but what its last writer sent, or that goes back to an older
//! write, is caught.

/// Bytes a write (or an immediate's data) carries.
pub const SLOT: u64 = 64;
/// Slots per source for writes, and again for immediates' data.
pub const SLOTS: u64 = 64;
/// Operations with a completion one node has in flight at once (each
/// holds a staging slot and a landing area).
pub const IN_FLIGHT: usize = 32;
/// Bytes one read fetches.
pub const READ_LEN: u32 = 256;
/// Bytes of the readable pattern.
pub const READABLE: u64 = 16 * 1024;
/// Most nodes the operation mixes support (the segment grows with them).
pub const MAX_NODES: u32 = 32;

/// One kind of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// A numbered inline message.
    Send,
    /// An RDMA write of a slot.
    RdmaWrite,
    /// An RDMA read of the readable pattern.
    RdmaRead,
    /// A slot's data, then a write-immediate of the sender's counter.
    Immediate,
    /// An endpoint made, given a close message, and destroyed.
    Close,
}

impl Op {
    /// Every kind, in `--ops` spelling.
    pub const ALL: [(&'static str, Op); 5] = [
        ("send", Op::Send),
        ("rdma-write", Op::RdmaWrite),
        ("rdma-read", Op::RdmaRead),
        ("immediate", Op::Immediate),
        ("close", Op::Close),
    ];

    /// `--ops`' list, e.g. `send,rdma-write`.
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<Op>> {
        let mut ops = Vec::new();
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let op = Op::ALL
                .iter()
                .find(|(name, _)| *name == word)
                .map(|(_, op)| *op)
                .ok_or_else(|| {
                    let names: Vec<&str> = Op::ALL.iter().map(|(n, _)| *n).collect();
                    anyhow::anyhow!("no operation {word:?}: --ops takes {}", names.join(","))
                })?;
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
        anyhow::ensure!(!ops.is_empty(), "--ops names no operation");
        Ok(ops)
    }

    /// Its `--ops` spelling.
    pub fn name(self) -> &'static str {
        Op::ALL
            .iter()
            .find(|(_, op)| *op == self)
            .map_or("?", |(n, _)| n)
    }
}

/// Offsets in a segment of a fabric of `nodes` nodes.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    nodes: u64,
}

impl Layout {
    /// For `nodes` nodes (at most [`MAX_NODES`]).
    pub fn new(nodes: u32) -> Layout {
        Layout {
            nodes: u64::from(nodes),
        }
    }

    /// Where write seq `seq` from `src` lands.
    pub fn write_slot(&self, src: u32, seq: u64) -> u64 {
        (u64::from(src) * SLOTS + seq % SLOTS) * SLOT
    }

    /// Where the data of `src`'s immediate `j` lands.
    pub fn immediate_slot(&self, src: u32, j: u64) -> u64 {
        self.nodes * SLOTS * SLOT + (u64::from(src) * SLOTS + j % SLOTS) * SLOT
    }

    /// `src`'s immediate word.
    pub fn counter(&self, src: u32) -> u64 {
        2 * self.nodes * SLOTS * SLOT + u64::from(src) * 8
    }

    /// Staging slot `i` (what this node writes from).
    pub fn staging(&self, i: usize) -> u64 {
        let counters_end = (self.counter(0) + self.nodes * 8).next_multiple_of(SLOT);
        counters_end + i as u64 * SLOT
    }

    /// Landing area `i` (what this node reads into).
    pub fn landing(&self, i: usize) -> u64 {
        self.staging(IN_FLIGHT) + i as u64 * u64::from(READ_LEN)
    }

    /// The start of the readable pattern.
    pub fn readable(&self) -> u64 {
        self.landing(IN_FLIGHT)
    }

    /// Segment bytes, whole pages.
    pub fn segment_bytes(&self) -> usize {
        (self.readable() + READABLE).next_multiple_of(4096) as usize
    }
}

/// The 64 bytes write (or immediate data) `seq` from `src` to `dst` carries.
pub fn slot_bytes(src: u32, dst: u32, seq: u64) -> [u8; SLOT as usize] {
    let mut b = [0u8; SLOT as usize];
    b[..8].copy_from_slice(&(seq + 1).to_le_bytes());
    b[8..12].copy_from_slice(&src.to_le_bytes());
    b[12..16].copy_from_slice(&dst.to_le_bytes());
    let mix = seq
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(u64::from(src) << 32 | u64::from(dst));
    for (i, x) in b[16..].iter_mut().enumerate() {
        *x = (mix >> ((i % 8) * 8)) as u8 ^ i as u8;
    }
    b
}

/// Byte `offset` of node `node`'s readable pattern.
pub fn readable_byte(node: u32, offset: u64) -> u8 {
    (offset.wrapping_mul(2_654_435_761) >> 7) as u8 ^ (node as u8).wrapping_mul(37)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_areas_do_not_overlap_and_fit_the_segment() {
        for nodes in [2, 4, 32] {
            let l = Layout::new(nodes);
            let last_write = l.write_slot(nodes - 1, SLOTS - 1) + SLOT;
            assert!(last_write <= l.immediate_slot(0, 0));
            assert!(l.immediate_slot(nodes - 1, SLOTS - 1) + SLOT <= l.counter(0));
            assert!(l.counter(nodes - 1) + 8 <= l.staging(0));
            assert!(l.staging(IN_FLIGHT - 1) + SLOT <= l.landing(0));
            assert!(l.landing(IN_FLIGHT - 1) + u64::from(READ_LEN) <= l.readable());
            assert!(l.readable() + READABLE <= l.segment_bytes() as u64);
            assert_eq!(l.counter(1) % 8, 0);
        }
    }

    #[test]
    fn ops_parse_by_name_and_refuse_what_they_do_not_know() {
        assert_eq!(
            Op::parse_list("send,rdma-write,rdma-read,immediate,close").unwrap(),
            Op::ALL.map(|(_, op)| op).to_vec()
        );
        assert_eq!(Op::parse_list("send,send").unwrap(), vec![Op::Send]);
        let e = Op::parse_list("send,atomic").unwrap_err().to_string();
        assert!(e.contains("atomic") && e.contains("rdma-read"), "{e}");
        assert!(Op::parse_list("").is_err());
    }

    #[test]
    fn slots_differ_by_writer_and_sequence() {
        assert_ne!(slot_bytes(0, 1, 5), slot_bytes(0, 1, 5 + SLOTS));
        assert_ne!(slot_bytes(0, 1, 5), slot_bytes(2, 1, 5));
        assert_eq!(
            u64::from_le_bytes(slot_bytes(3, 1, 9)[..8].try_into().unwrap()),
            10
        );
    }
}
