//! One direction of a link (spec §10.3): serialization at the link's rate,
//! its latency, a bounded buffer with credit back-pressure, and the faults
//! it injects from its own seeded generator.
//!
//! A lane holds a packet from the moment its sender hands it over until
//! the far end passes it on; it takes a packet only while it holds fewer
//! than its `queue` (a credit per buffer slot at the far end, as Myrinet's
//! STOP/GO keeps a switch buffer from overflowing). So a congested output
//! pushes back hop by hop to the source, and nothing is dropped for want
//! of room: only the faults drop.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::fabric::packet::Packet;
use crate::fabric::topology::{Faults, LinkParams};

/// Time in the fabric: nanoseconds since the fabric started.
pub type Nanos = u64;

/// How much later than its followers a reordered packet arrives, at least.
const REORDER_BY: Nanos = 20_000;

/// What a lane has carried and done.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LaneCounters {
    /// Packets handed to the lane.
    pub packets: u64,
    /// Their bytes, headers included.
    pub bytes: u64,
    /// Packets lost to the `drop` fault.
    pub dropped: u64,
    /// Packets lost because the link was down.
    pub dropped_down: u64,
    /// Packets corrupted on purpose.
    pub corrupted: u64,
    /// Packets the far end discarded because their CRC did not match.
    pub crc_errors: u64,
    /// Packets sent twice.
    pub duplicated: u64,
    /// Packets held back to be overtaken.
    pub reordered: u64,
    /// Packets delayed.
    pub delayed: u64,
    /// Times the lane refused a packet for want of credit.
    pub stalls: u64,
    /// Packets from another device dropped because this end's buffer was
    /// full (credits do not cross devices; the transport recovers).
    pub overflow: u64,
}

summable!(LaneCounters {
    packets,
    bytes,
    dropped,
    dropped_down,
    corrupted,
    crc_errors,
    duplicated,
    reordered,
    delayed,
    stalls,
    overflow
});

/// A packet on the wire, ordered by arrival time, then by when it was sent.
struct InFlight {
    arrive: Nanos,
    order: u64,
    /// Sent while the lane could corrupt packets: its CRC is checked at
    /// the far end. A lane that corrupts nothing passes packets on as
    /// they came (every corruption is caught where it happened).
    check: bool,
    packet: Packet,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.arrive, self.order) == (o.arrive, o.order)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.arrive, self.order).cmp(&(o.arrive, o.order))
    }
}

/// A lane whose two ends are in different members (spec §10.7, §10.8).
#[derive(Clone)]
pub enum RemoteEnd {
    /// This member sends on it; the counter (shared with the member at the
    /// far end) holds the packets handed over and not yet passed on there.
    Sender(std::sync::Arc<std::sync::atomic::AtomicUsize>),
    /// This member is the far end, and passes on what the counter counts.
    Receiver(std::sync::Arc<std::sync::atomic::AtomicUsize>),
    /// Between processes (UDP): no shared counter; the far end holds up to
    /// `UDP_FAR_BUFFER` packets (or the queue, if larger) and drops beyond.
    Datagrams,
}

/// Packets the far end of a lane between device processes holds before it
/// drops: credits do not cross processes, and this is enough for the
/// largest message at the smallest MTU (1 MiB in 256-byte packets).
pub const UDP_FAR_BUFFER: usize = ulnic_abi::datagram::FAR_BUFFER;

/// One direction of a link.
pub struct Lane {
    params: LinkParams,
    rng: ChaCha8Rng,
    /// When the transmitter finishes the last packet handed to it.
    busy_until: Nanos,
    wire: BinaryHeap<Reverse<InFlight>>,
    /// Arrived at the far end, waiting to be passed on (the far end's
    /// input buffer), each with when it arrived.
    arrived: VecDeque<(Nanos, Packet)>,
    /// When a packet last left the far end's buffer.
    taken_at: Nanos,
    /// When a packet last left the far end's buffer while the lane was
    /// full: no credit was free before.
    freed_at: Nanos,
    order: u64,
    remote: Option<RemoteEnd>,
    /// What it has done.
    pub counters: LaneCounters,
}

impl Lane {
    /// A lane emulating `params`, its faults drawn from `seed`.
    pub fn new(params: LinkParams, seed: u64) -> Lane {
        Lane {
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
            busy_until: 0,
            wire: BinaryHeap::new(),
            arrived: VecDeque::new(),
            taken_at: 0,
            freed_at: 0,
            order: 0,
            remote: None,
            counters: LaneCounters::default(),
        }
    }

    /// The parameters it emulates.
    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// Changes the faults it injects from now on.
    pub fn set_faults(&mut self, faults: Faults) {
        self.params.faults = faults;
    }

    /// Marks the lane as crossing to or from another member.
    pub fn set_remote(&mut self, r: RemoteEnd) {
        self.remote = Some(r);
    }

    /// Packets held (on the wire or waiting at the far end, wherever that
    /// is).
    pub fn held(&self) -> usize {
        let far = match &self.remote {
            Some(RemoteEnd::Sender(c)) => c.load(std::sync::atomic::Ordering::Acquire),
            _ => 0,
        };
        self.wire.len() + self.arrived.len() + far
    }

    /// Whether it takes another packet now.
    pub fn has_credit(&self) -> bool {
        self.held() < self.params.queue_packets as usize
    }

    /// Counts a refusal for want of credit.
    pub fn stalled(&mut self) {
        self.counters.stalls += 1;
    }

    /// Sends `p` at time `now`: it leaves when the transmitter is free and
    /// has clocked it out, and arrives a latency later, unless a fault
    /// says otherwise. The caller checked `has_credit`.
    pub fn send(&mut self, now: Nanos, mut p: Packet) {
        // Always five draws per packet, so which faults are switched on
        // does not shift the others' sequence.
        let draws: [f64; 5] = std::array::from_fn(|_| self.rng.gen());
        let bit: u64 = self.rng.gen();
        let f = self.params.faults;
        let len = p.wire_len() as u64;
        self.counters.packets += 1;
        self.counters.bytes += len;
        let serialize = match self.params.bandwidth_bps {
            Some(bps) => (len * 8 * 1_000_000_000).div_ceil(bps.max(1)),
            None => 0,
        };
        let depart = now.max(self.busy_until) + serialize;
        self.busy_until = depart;
        if f.down {
            self.counters.dropped_down += 1;
            return;
        }
        if draws[0] < f.drop {
            self.counters.dropped += 1;
            return;
        }
        if draws[1] < f.corrupt {
            self.counters.corrupted += 1;
            p.flip_bit(bit);
        }
        let mut arrive = depart + self.params.latency.as_nanos() as Nanos;
        if draws[3] < f.reorder {
            self.counters.reordered += 1;
            arrive += REORDER_BY.max(4 * serialize);
        }
        if draws[4] < f.delay {
            self.counters.delayed += 1;
            arrive += f.delay_by.as_nanos() as Nanos;
        }
        let check = f.corrupt > 0.0;
        if draws[2] < f.duplicate {
            self.counters.duplicated += 1;
            self.put(arrive, check, p.clone());
        }
        self.put(arrive, check, p);
    }

    fn put(&mut self, arrive: Nanos, check: bool, packet: Packet) {
        self.order += 1;
        self.wire.push(Reverse(InFlight {
            arrive,
            order: self.order,
            check,
            packet,
        }));
    }

    /// Moves every packet due by `now` off the wire into the far end's
    /// buffer, discarding those whose CRC does not match (checked on a lane
    /// that may have corrupted them).
    pub fn arrive(&mut self, now: Nanos) {
        while let Some(Reverse(top)) = self.wire.peek() {
            if top.arrive > now {
                break;
            }
            let Some(Reverse(f)) = self.wire.pop() else {
                break;
            };
            if !f.check || f.packet.intact() {
                self.arrived.push_back((f.arrive, f.packet));
            } else {
                self.counters.crc_errors += 1;
            }
        }
    }

    /// Puts a packet that crossed from another member straight into the
    /// far end's buffer (the sending member emulated the link's time and
    /// faults, and checked the CRC if it could corrupt; a datagram's MAC
    /// covers the rest). It arrived at `now` (the members' clocks are
    /// not compared). False, and counted, if the buffer is full.
    pub fn inject(&mut self, now: Nanos, p: Packet) -> bool {
        // A sender sharing our counter kept to the credits; over UDP the
        // buffer is larger, and past it the packet is dropped (counted).
        let limit = match &self.remote {
            Some(RemoteEnd::Receiver(_)) => usize::MAX,
            _ => UDP_FAR_BUFFER.max(self.params.queue_packets as usize),
        };
        if self.arrived.len() >= limit {
            self.counters.overflow += 1;
            return false;
        }
        self.arrived.push_back((now, p));
        true
    }

    /// Takes an arrived packet to hand to the member at the far end,
    /// counting it in the shared credit.
    pub fn hand_over(&mut self) -> Option<Packet> {
        let (_, p) = self.arrived.pop_front()?;
        if let Some(RemoteEnd::Sender(c)) = &self.remote {
            c.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        Some(p)
    }

    /// The packet first in line at the far end, and when it arrived there.
    pub fn front(&self) -> Option<(Nanos, &Packet)> {
        self.arrived.front().map(|(t, p)| (*t, p))
    }

    /// Takes the packet first in line at the far end, passed on at time
    /// `at` (giving its credit back, to a sender in another member too).
    pub fn pop(&mut self, at: Nanos) -> Option<Packet> {
        let full = !self.has_credit();
        let (_, p) = self.arrived.pop_front()?;
        self.taken_at = self.taken_at.max(at);
        if full {
            self.freed_at = self.freed_at.max(at);
        }
        if let Some(RemoteEnd::Receiver(c)) = &self.remote {
            let _ = c.fetch_update(
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
                |v| v.checked_sub(1),
            );
        }
        Some(p)
    }

    /// When a packet last left the far end's buffer: the next one in
    /// line leaves no earlier.
    pub fn taken_at(&self) -> Nanos {
        self.taken_at
    }

    /// When a credit last came free on a full lane: a packet that waited
    /// for it is sent no earlier.
    pub fn freed_at(&self) -> Nanos {
        self.freed_at
    }

    /// When the next packet on the wire arrives.
    pub fn next_arrival(&self) -> Option<Nanos> {
        self.wire.peek().map(|Reverse(f)| f.arrive)
    }

    /// Whether anything is on the wire or waiting at the far end.
    pub fn busy(&self) -> bool {
        self.held() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use ulnic_abi::packet::DATA;

    fn packet(payload: usize) -> Packet {
        let mut p = Packet::new(DATA);
        p.payload = vec![7; payload];
        p.seal();
        p
    }

    fn lane(faults: Faults, seed: u64) -> Lane {
        Lane::new(
            LinkParams {
                latency: Duration::from_micros(10),
                bandwidth_bps: Some(1_000_000_000),
                queue_packets: 1000,
                faults,
                ..LinkParams::default()
            },
            seed,
        )
    }

    #[test]
    fn a_packet_takes_its_serialization_time_and_the_latency() {
        let mut l = lane(Faults::default(), 1);
        // 928 + 72 header bytes at 1 Gb/s: 8 us, then 10 us of latency.
        l.send(0, packet(928));
        l.arrive(17_999);
        assert!(l.front().is_none());
        l.arrive(18_000);
        assert!(l.front().is_some());
        // Back to back, the second waits for the first to be clocked out.
        l.send(0, packet(928));
        assert_eq!(l.next_arrival(), Some(26_000));
    }

    #[test]
    fn credits_bound_what_a_lane_holds() {
        let mut l = Lane::new(
            LinkParams {
                queue_packets: 2,
                ..LinkParams::default()
            },
            1,
        );
        l.send(0, packet(1));
        l.send(0, packet(1));
        assert!(!l.has_credit());
        l.arrive(0);
        l.pop(0);
        assert!(l.has_credit());
    }

    #[test]
    fn the_same_seed_gives_the_same_faults_and_corruption_is_never_passed_on() {
        let faults = Faults {
            drop: 0.1,
            corrupt: 0.1,
            duplicate: 0.1,
            reorder: 0.1,
            ..Faults::default()
        };
        let run = |seed| {
            let mut l = lane(faults, seed);
            for i in 0..2000u32 {
                let mut p = packet(100);
                p.header.seq = i.into();
                p.seal();
                l.send(u64::from(i) * 1000, p);
            }
            l.arrive(u64::MAX);
            let mut seqs = Vec::new();
            while let Some(p) = l.pop(0) {
                assert!(p.intact());
                seqs.push(p.header.seq.get());
            }
            (seqs, l.counters)
        };
        let (a, ca) = run(5);
        assert_eq!(run(5), (a.clone(), ca));
        assert_ne!(run(6).0, a);
        assert!(ca.dropped > 100 && ca.corrupted > 100 && ca.duplicated > 100);
        // A corrupted packet sent twice is caught twice.
        assert!(ca.crc_errors >= ca.corrupted);
        assert!(a.windows(2).any(|w| w[0] > w[1]), "nothing reordered");
    }
}
