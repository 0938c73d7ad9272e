//! A fabric packet (spec §10.3): the wire header and its payload, sealed
//! with a CRC at the source and checked at the far end of every link, so a
//! corrupted packet is discarded and never delivered.

use ulnic_abi::packet::{self, HEADER_SIZE};
use ulnic_abi::wire::PacketHeader;
use zerocopy::{FromZeros, IntoBytes};

/// A packet in the fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The header (little-endian wire fields).
    pub header: PacketHeader,
    /// `header.len` payload bytes.
    pub payload: Vec<u8>,
}

impl Packet {
    /// A packet of `kind` with every other field zero and no payload.
    pub fn new(kind: u16) -> Packet {
        let mut header = PacketHeader::new_zeroed();
        header.magic = packet::MAGIC.into();
        header.version = packet::VERSION.into();
        header.kind = kind.into();
        Packet {
            header,
            payload: Vec::new(),
        }
    }

    /// Sets the payload length and the CRC: the packet is ready to send.
    pub fn seal(&mut self) {
        self.header.len = (self.payload.len() as u32).into();
        self.header.crc = self.crc().into();
    }

    /// Whether the packet is as its source sealed it: the CRC matches,
    /// magic and version are ours and the length is the payload's.
    pub fn intact(&self) -> bool {
        let h = &self.header;
        h.magic.get() == packet::MAGIC
            && h.version.get() == packet::VERSION
            && h.len.get() as usize == self.payload.len()
            && h.crc.get() == self.crc()
    }

    /// Bytes the packet takes on a link.
    pub fn wire_len(&self) -> usize {
        HEADER_SIZE + self.payload.len()
    }

    /// Flips bit `bit` (taken modulo the packet's bits) of the bytes the CRC
    /// covers: what a noisy link does. `hop` is spared, as a real link's
    /// route bytes are checked by their own means.
    pub fn flip_bit(&mut self, bit: u64) {
        let covered = (self.wire_len() * 8) as u64;
        let mut bit = bit % covered;
        const HOP: std::ops::Range<u64> = 6 * 8..8 * 8;
        if HOP.contains(&bit) {
            bit += HOP.end - HOP.start;
        }
        let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
        if byte < HEADER_SIZE {
            self.header.as_mut_bytes()[byte] ^= mask;
        } else {
            self.payload[byte - HEADER_SIZE] ^= mask;
        }
    }

    /// The whole packet as bytes (header then payload), for UDP and captures.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.wire_len());
        b.extend_from_slice(self.header.as_bytes());
        b.extend_from_slice(&self.payload);
        b
    }

    fn crc(&self) -> u32 {
        let mut h = self.header;
        h.hop = 0.into();
        h.crc = 0.into();
        let mut c = crc32fast::Hasher::new();
        c.update(h.as_bytes());
        c.update(&self.payload);
        c.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Packet {
        let mut p = Packet::new(packet::DATA);
        p.header.seq = 7.into();
        p.payload = b"some payload".to_vec();
        p.seal();
        p
    }

    #[test]
    fn every_single_bit_flip_is_caught() {
        let p = sample();
        assert!(p.intact());
        for bit in 0..(p.wire_len() * 8) as u64 {
            let mut q = p.clone();
            q.flip_bit(bit);
            assert!(!q.intact(), "flip of bit {bit} went unnoticed");
        }
    }

    #[test]
    fn the_hop_count_may_change_on_the_way() {
        let mut p = sample();
        p.header.hop = 3.into();
        assert!(p.intact());
    }
}
