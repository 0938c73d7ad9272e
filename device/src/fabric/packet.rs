//! A fabric packet (spec §10.3): the wire header, its source route and
//! its payload, sealed with a CRC at the source and checked at the far end
//! of links that may corrupt, so a corrupted packet is discarded and never
//! delivered.

use std::mem::offset_of;

use ulnic_abi::packet::{self, HEADER_SIZE, MAX_ROUTE};
use ulnic_abi::wire::{self, PacketHeader};
use zerocopy::{FromZeros, IntoBytes};

/// A source route: the gate to leave by at each switch, in order (as
/// a Myrinet packet carries one route byte per switch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Route {
    len: u8,
    gates: [u8; MAX_ROUTE],
}

impl Route {
    /// The route through `gates`, if it crosses at most `MAX_ROUTE`
    /// switches.
    pub fn new(gates: &[u8]) -> Option<Route> {
        let mut r = Route::default();
        for &p in gates {
            if !r.push(p) {
                return None;
            }
        }
        Some(r)
    }

    /// The gates, first switch first.
    pub fn gates(&self) -> &[u8] {
        &self.gates[..usize::from(self.len)]
    }

    /// The gate to leave by at switch `i` of the route.
    pub fn gate(&self, i: usize) -> Option<u8> {
        self.gates().get(i).copied()
    }

    /// Switches crossed.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether the route crosses no switch.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a gate; false when the route is already as long as a route
    /// may be.
    pub fn push(&mut self, gate: u8) -> bool {
        let Some(slot) = self.gates.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = gate;
        self.len += 1;
        true
    }

    /// The same gates, last first.
    pub fn reversed(&self) -> Route {
        let mut r = *self;
        r.gates[..usize::from(self.len)].reverse();
        r
    }
}

/// A packet in the fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The header (little-endian wire fields).
    pub header: PacketHeader,
    /// The gates it takes at each switch; `header.hop` says how many it
    /// has used.
    pub route: Route,
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
            route: Route::default(),
            payload: Vec::new(),
        }
    }

    /// Gives the packet its route from the start: no switch passed yet.
    pub fn set_route(&mut self, route: Route) {
        self.route = route;
        self.header.route_len = (route.len() as u16).into();
        self.header.hop = 0.into();
    }

    /// The packet in `bytes` (header, route, payload), if its lengths hold
    /// together; the CRC is the far end's business.
    pub fn from_bytes(bytes: &[u8]) -> Option<Packet> {
        let header: PacketHeader = wire::read(bytes.get(..HEADER_SIZE)?);
        let route_len = usize::from(header.route_len.get());
        if route_len > MAX_ROUTE {
            return None;
        }
        let route = Route::new(bytes.get(HEADER_SIZE..HEADER_SIZE + route_len)?)?;
        let payload = bytes.get(HEADER_SIZE + route_len..)?.to_vec();
        (header.len.get() as usize == payload.len()).then_some(Packet {
            header,
            route,
            payload,
        })
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
        HEADER_SIZE + self.route.len() + self.payload.len()
    }

    /// Flips bit `bit` (taken modulo the bits the CRC covers) of the header
    /// or payload: what a noisy link does. `hop`, `route_len` and the route
    /// are spared: switches consume and rewrite them in flight, as a
    /// Myrinet switch strips its route byte and checks it by its own means.
    pub fn flip_bit(&mut self, bit: u64) {
        /// The bits of a header field (which the CRC does not cover).
        const fn bits(offset: usize, size: usize) -> std::ops::Range<u64> {
            (offset as u64 * 8)..((offset + size) as u64 * 8)
        }
        const HOP: std::ops::Range<u64> = bits(offset_of!(PacketHeader, hop), 2);
        const ROUTE_LEN: std::ops::Range<u64> = bits(offset_of!(PacketHeader, route_len), 2);
        let spared = (HOP.end - HOP.start) + (ROUTE_LEN.end - ROUTE_LEN.start);
        let covered = ((HEADER_SIZE + self.payload.len()) * 8) as u64 - spared;
        let mut bit = bit % covered;
        if bit >= HOP.start {
            bit += HOP.end - HOP.start;
        }
        if bit >= ROUTE_LEN.start {
            bit += ROUTE_LEN.end - ROUTE_LEN.start;
        }
        let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
        if byte < HEADER_SIZE {
            self.header.as_mut_bytes()[byte] ^= mask;
        } else {
            self.payload[byte - HEADER_SIZE] ^= mask;
        }
    }

    /// The whole packet as bytes (header, route, payload), for UDP and
    /// captures.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.wire_len());
        b.extend_from_slice(self.header.as_bytes());
        b.extend_from_slice(self.route.gates());
        b.extend_from_slice(&self.payload);
        b
    }

    fn crc(&self) -> u32 {
        let mut h = self.header;
        h.hop = 0.into();
        h.route_len = 0.into();
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
    fn the_hop_count_and_route_may_change_on_the_way() {
        let mut p = sample();
        p.set_route(Route::new(&[3, 1, 4]).unwrap());
        p.header.hop = 3.into();
        assert!(p.intact());
    }

    #[test]
    fn bytes_round_trip_with_the_route() {
        let mut p = sample();
        p.set_route(Route::new(&[2, 7]).unwrap());
        let b = p.to_bytes();
        assert_eq!(b.len(), p.wire_len());
        assert_eq!(Packet::from_bytes(&b), Some(p.clone()));
        assert_eq!(Packet::from_bytes(&b[..b.len() - 1]), None);
        let mut long = b.clone();
        long[offset_of!(PacketHeader, route_len)] = (MAX_ROUTE + 1) as u8;
        assert_eq!(Packet::from_bytes(&long), None);
    }

    #[test]
    fn a_route_is_bounded_and_reverses() {
        let r = Route::new(&[1, 2, 3]).unwrap();
        assert_eq!(r.reversed().gates(), [3, 2, 1]);
        assert_eq!(r.gate(1), Some(2));
        assert_eq!(r.gate(3), None);
        assert!(Route::new(&[0; MAX_ROUTE]).is_some());
        assert!(Route::new(&[0; MAX_ROUTE + 1]).is_none());
    }
}
