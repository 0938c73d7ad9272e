//! The device's side of one endpoint: private ring indices, validation of the
//! values the user publishes, and posting receive descriptors and events.
//!
//! CLAN §4.1: each side keeps its authoritative index privately and publishes
//! a copy; the device reads the user's copies as hostile and never indexes
//! with them except reduced modulo the ring size.

use ulnic_abi::{
    condition, ctrl, event, tripwire_flags, EventRecord, FilterEntry, RingLayout, CONDITION_RESERVE,
};
use vm_memory::GuestMemoryMmap;

use crate::memory::guest::{self, BadAddress, Segment};
use crate::nic::aperture::{Access, Tripwire};
use crate::nic::redirect::{Landing, Redirect};
use crate::nic::stats::Stats;
use crate::nic::utlb::{Tables, TranslationCache};

/// One endpoint as the device sees it.
#[derive(Debug)]
pub struct Endpoint {
    /// Protection domain that owns it.
    pub pd: u32,
    /// Port it is bound to on its node.
    pub port: Option<u32>,
    /// Guest-physical address of the control region.
    pub ctrl: u64,
    /// Ring sizes.
    pub layout: RingLayout,
    /// The registered segment.
    pub segment: Segment,
    /// Accept filter; empty accepts everything.
    pub filters: Vec<FilterEntry>,
    /// Whether notifications are enabled (ARM).
    pub notify_enabled: bool,
    /// Device-private indices.
    pub send_consumer: u32,
    pub free_consumer: u32,
    pub recv_producer: u32,
    pub event_producer: u32,
    /// Last arm request the device honoured.
    pub arm_ack: u32,
    /// Counters.
    pub stats: Stats,
    /// Tripwires by id (at most the device's per-endpoint cap).
    pub tripwires: Vec<Option<Tripwire>>,
    /// Active transfer redirections (at most `MAX_REDIRECTS`).
    pub redirects: Vec<Redirect>,
    /// Sends handed to the fabric's transport and not yet settled: each
    /// may still post an event, so its slot stays reserved.
    pub events_owed: u32,
    /// Its session id (spec §5.4): stamped on what it sends.
    pub session: u32,
    /// The RDMA descriptor at the head of the send ring, while its pieces
    /// are being handed to the fabric: the device's record of it and the
    /// bytes handed over so far.
    pub pieces: Option<(u64, u64)>,
    /// The event queue this endpoint reports to instead of notifying
    /// (spec §6.1).
    pub queue: Option<QueueLink>,
}

/// A source's link to its event queue (spec §6.1): the queue is the
/// endpoint `id` only while its session is still `session` (an id is
/// reused after a destroy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLink {
    /// The queue's endpoint id.
    pub id: u32,
    /// The queue's session id when the source was attached.
    pub session: u32,
    /// What the source's QUEUED events carry.
    pub cookie: u64,
}

impl Endpoint {
    /// A new endpoint; the caller validated `layout`, `ctrl` and `segment`.
    pub fn new(pd: u32, ctrl: u64, layout: RingLayout, segment: Segment) -> Self {
        Endpoint {
            pd,
            port: None,
            ctrl,
            layout,
            segment,
            filters: Vec::new(),
            notify_enabled: false,
            send_consumer: 0,
            free_consumer: 0,
            recv_producer: 0,
            event_producer: 0,
            arm_ack: 0,
            stats: Stats::default(),
            tripwires: Vec::new(),
            redirects: Vec::new(),
            events_owed: 0,
            session: 0,
            queue: None,
            pieces: None,
        }
    }

    /// Zeroes the control block words the device owns, so a recycled region
    /// starts clean, and writes the endpoint's session id into it.
    pub fn init_shared(&self, mem: &GuestMemoryMmap<()>) -> Result<(), BadAddress> {
        guest::write(mem, self.ctrl, &[0u8; ctrl::CONTROL_BLOCK_SIZE as usize])?;
        guest::store_u32(mem, self.word(ctrl::SESSION), self.session)
    }

    fn word(&self, off: u64) -> u64 {
        self.ctrl + off
    }

    /// Number of descriptors the user offers on a ring it produces, or None
    /// (and a ring error) when the published index is impossible.
    fn offered(
        &mut self,
        mem: &GuestMemoryMmap<()>,
        prod_off: u64,
        consumer: u32,
        entries: u32,
    ) -> u32 {
        match guest::load_u32(mem, self.word(prod_off)) {
            Ok(p) => {
                let n = p.wrapping_sub(consumer);
                if n > entries {
                    self.ring_error(mem);
                    0
                } else {
                    n
                }
            }
            Err(_) => 0,
        }
    }

    /// Send descriptors waiting.
    pub fn send_pending(&mut self, mem: &GuestMemoryMmap<()>) -> u32 {
        let (c, n) = (self.send_consumer, self.layout.send_entries);
        self.offered(mem, ctrl::SEND_PRODUCER, c, n)
    }

    /// Free descriptors waiting.
    pub fn free_pending(&mut self, mem: &GuestMemoryMmap<()>) -> u32 {
        let (c, n) = (self.free_consumer, self.layout.free_entries);
        self.offered(mem, ctrl::FREE_PRODUCER, c, n)
    }

    /// Free slots on a ring the device produces, or None when the user's
    /// published consumer index is impossible.
    fn room(
        &mut self,
        mem: &GuestMemoryMmap<()>,
        cons_off: u64,
        producer: u32,
        entries: u32,
    ) -> Option<u32> {
        let c = guest::load_u32(mem, self.word(cons_off)).ok()?;
        let used = producer.wrapping_sub(c);
        if used > entries {
            self.ring_error(mem);
            return None;
        }
        Some(entries - used)
    }

    /// Address of send descriptor at the current consumer index.
    pub fn send_slot(&self) -> u64 {
        let idx = u64::from(self.send_consumer & (self.layout.send_entries - 1));
        self.ctrl + self.layout.send_offset() + idx * ulnic_abi::SEND_DESC_SIZE
    }

    /// Address of the free descriptor at the current consumer index.
    pub fn free_slot(&self) -> u64 {
        let idx = u64::from(self.free_consumer & (self.layout.free_entries - 1));
        self.ctrl + self.layout.free_offset() + idx * ulnic_abi::FREE_DESC_SIZE
    }

    /// Retires one send descriptor and publishes the new consumer index.
    pub fn complete_send(&mut self, mem: &GuestMemoryMmap<()>) {
        self.send_consumer = self.send_consumer.wrapping_add(1);
        let _ = guest::store_u32(mem, self.word(ctrl::SEND_CONSUMER), self.send_consumer);
    }

    /// Retires one free descriptor.
    pub fn consume_free(&mut self, mem: &GuestMemoryMmap<()>) {
        self.free_consumer = self.free_consumer.wrapping_add(1);
        let _ = guest::store_u32(mem, self.word(ctrl::FREE_CONSUMER), self.free_consumer);
    }

    /// Free receive-ring slots (None when the published index is impossible).
    pub fn recv_room(&mut self, mem: &GuestMemoryMmap<()>) -> Option<u32> {
        let (p, n) = (self.recv_producer, self.layout.recv_entries);
        self.room(mem, ctrl::RECV_CONSUMER, p, n)
    }

    /// Free event slots beyond the condition reserve and the slots owed to
    /// sends still in the fabric: a send descriptor is consumed only when
    /// its possible event has a slot.
    pub fn event_room_for_send(&mut self, mem: &GuestMemoryMmap<()>) -> bool {
        let (p, n) = (self.event_producer, self.layout.event_entries);
        let reserved = CONDITION_RESERVE + self.events_owed;
        matches!(self.room(mem, ctrl::EVENT_CONSUMER, p, n), Some(r) if r > reserved)
    }

    /// Address of the receive slot the next message goes to.
    pub fn recv_slot(&self) -> u64 {
        let idx = u64::from(self.recv_producer & (self.layout.recv_entries - 1));
        self.ctrl + self.layout.recv_offset() + idx * ulnic_abi::RECV_DESC_SIZE
    }

    /// Publishes a receive descriptor already written at `recv_slot()`.
    pub fn publish_recv(&mut self, mem: &GuestMemoryMmap<()>) {
        self.recv_producer = self.recv_producer.wrapping_add(1);
        let _ = guest::store_u32(mem, self.word(ctrl::RECV_PRODUCER), self.recv_producer);
    }

    /// Posts an event; counts it lost when the ring is full (the user
    /// published a consumer index that left no room, so it can only hurt
    /// itself).
    pub fn post_event(&mut self, mem: &GuestMemoryMmap<()>, ev: &EventRecord) -> bool {
        let (p, n) = (self.event_producer, self.layout.event_entries);
        if !matches!(self.room(mem, ctrl::EVENT_CONSUMER, p, n), Some(r) if r > 0) {
            self.stats.events_lost += 1;
            return false;
        }
        let idx = u64::from(self.event_producer & (n - 1));
        let mut b = [0u8; ulnic_abi::EVENT_SIZE as usize];
        ev.encode(&mut b);
        if guest::write(
            mem,
            self.ctrl + self.layout.event_offset() + idx * ulnic_abi::EVENT_SIZE,
            &b,
        )
        .is_err()
        {
            self.stats.events_lost += 1;
            return false;
        }
        self.event_producer = self.event_producer.wrapping_add(1);
        let _ = guest::store_u32(mem, self.word(ctrl::EVENT_PRODUCER), self.event_producer);
        true
    }

    /// Posts a condition event unless one of the same kind is still pending
    /// (CLAN's duplicate suppression: the queue cannot overflow with them).
    pub fn post_condition(&mut self, mem: &GuestMemoryMmap<()>, code: u16) -> bool {
        let flag = self.word(ctrl::CONDITION_PENDING + u64::from(code));
        let mut pending = [0u8];
        if guest::read(mem, flag, &mut pending).is_err() || pending[0] != 0 {
            return false;
        }
        let _ = guest::write(mem, flag, &[1]);
        self.post_event(
            mem,
            &EventRecord {
                kind: event::CONDITION,
                code,
                ..Default::default()
            },
        )
    }

    fn ring_error(&mut self, mem: &GuestMemoryMmap<()>) {
        self.stats.ring_errors += 1;
        self.post_condition(mem, condition::RING_INDEX);
    }

    /// Sets or clears the doorbell-wanted word.
    pub fn set_doorbell_wanted(&self, mem: &GuestMemoryMmap<()>, wanted: bool) {
        let _ = guest::store_u32(mem, self.word(ctrl::DOORBELL_WANTED), u32::from(wanted));
    }

    /// Consumes a pending arm request: true when the owner asked to be
    /// notified and has not been since.
    pub fn take_arm(&mut self, mem: &GuestMemoryMmap<()>) -> bool {
        if !self.notify_enabled {
            return false;
        }
        // Dekker with the driver's "arm, fence, re-check the rings": the
        // producer index just published must be visible before the arm
        // request is read, or both sides can miss each other (a store-load
        // reordering that x86 allows) and the owner sleeps through it.
        guest::full_fence();
        match guest::load_u32(mem, self.word(ctrl::ARM_REQUEST)) {
            Ok(req) if req != self.arm_ack => {
                self.arm_ack = req;
                let _ = guest::store_u32(mem, self.word(ctrl::ARM_ACK), req);
                true
            }
            _ => false,
        }
    }

    /// Changes whenever the device posts to the receive or event ring.
    pub fn posted_mark(&self) -> (u32, u32) {
        (self.recv_producer, self.event_producer)
    }

    /// Whether the accept filter takes a message.
    pub fn accepts(&self, node: u32, port: u32, tag: u32) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| f.matches(node, port, tag))
    }
}

impl Endpoint {
    /// Sets a tripwire; None when the endpoint has `cap` already.
    pub fn set_tripwire(&mut self, t: Tripwire, cap: u32) -> Option<u32> {
        let id = match self.tripwires.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None if (self.tripwires.len() as u32) < cap => {
                self.tripwires.push(None);
                self.tripwires.len() - 1
            }
            None => return None,
        };
        self.tripwires[id] = Some(t);
        Some(id as u32)
    }

    /// Deactivates the tripwires set on PIO window `window` (it was
    /// revoked); they keep their ids until cleared.
    pub fn retire_pio_tripwires(&mut self, window: u32) {
        for t in self.tripwires.iter_mut().flatten() {
            if t.flags & tripwire_flags::PIO != 0 && t.aperture == window {
                t.active = false;
            }
        }
    }

    /// Fires every active tripwire `access` matches: sets its fired byte,
    /// posts its event if the byte was clear. True when an event was posted.
    pub fn fire_tripwires(&mut self, mem: &GuestMemoryMmap<()>, access: &Access) -> bool {
        let want = if access.read {
            tripwire_flags::READ
        } else {
            tripwire_flags::WRITE
        };
        let mut fired = Vec::new();
        for (id, slot) in self.tripwires.iter_mut().enumerate() {
            let Some(t) = slot.as_mut() else { continue };
            let pio = t.flags & tripwire_flags::PIO != 0;
            if !t.active
                || t.aperture != access.aperture
                || pio != access.pio
                || t.flags & want == 0
            {
                continue;
            }
            let start = access.offset.max(t.offset);
            let end = (access.offset + access.len).min(t.offset + t.len);
            if start >= end {
                continue;
            }
            if t.flags & tripwire_flags::PERSISTENT == 0 {
                t.active = false;
            }
            fired.push((id as u32, t.user, end - start));
        }
        if fired.is_empty() {
            return false;
        }
        // Dekker with the owner's "clear the flag, fence, read the data": the
        // access's stores must be visible before its flags are read, or the
        // owner can read old data after clearing while the device reads the
        // old flag (set) and posts nothing: a lost wake-up.
        guest::full_fence();
        let mut posted = false;
        for (id, user, bytes) in fired {
            self.stats.tripwires_fired += 1;
            let flag = self.ctrl + ctrl::TRIPWIRE_FIRED + u64::from(id);
            let mut was = [0u8];
            // A driver that unmapped its control block loses the event, not
            // the device its footing.
            if guest::read(mem, flag, &mut was).is_err() {
                continue;
            }
            // Set only a clear flag: re-writing 1 over a flag just read as 1
            // could land after the owner's clear and leave it set with no
            // event behind it, so no later firing would post one.
            if was[0] != 0 || guest::write(mem, flag, &[1]).is_err() {
                continue;
            }
            posted |= self.post_event(
                mem,
                &EventRecord {
                    session: 0,
                    kind: event::TRIPWIRE,
                    code: u16::from(access.read),
                    user_id: user,
                    node: access.from.0,
                    port: access.from.1,
                    len: bytes.min(u64::from(u32::MAX)) as u32,
                    aux: id,
                },
            );
        }
        posted
    }
}

impl Endpoint {
    /// Where writes into aperture `aperture` of this endpoint (on node
    /// `node`, memory `mem`) land: at `ap_seg_offset` of its segment, or
    /// of `buffer` (the translated user buffer of a buffer aperture).
    pub fn landing<'a>(
        &'a mut self,
        utlb: (&'a mut TranslationCache, &'a Tables),
        node: u32,
        mem: &'a GuestMemoryMmap<()>,
        aperture: u32,
        (buffer, ap_seg_offset): (Option<&'a Segment>, u64),
    ) -> Landing<'a> {
        Landing {
            cache: utlb.0,
            tables: utlb.1,
            tag: (node, self.pd),
            mem,
            segment: buffer.unwrap_or(&self.segment),
            redirects: &mut self.redirects,
            stats: &mut self.stats,
            aperture,
            ap_seg_offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::guest::tests::mem;

    fn ep(m: &GuestMemoryMmap<()>) -> Endpoint {
        let layout = RingLayout {
            send_entries: 4,
            recv_entries: 4,
            free_entries: 4,
            event_entries: 64,
        };
        let e = Endpoint::new(1, 0x10000, layout, Segment::default());
        e.init_shared(m).unwrap();
        e
    }

    #[test]
    fn hostile_producer_index_is_clamped_and_reported_once() {
        let m = mem(1 << 20);
        let mut e = ep(&m);
        guest::store_u32(&m, 0x10000 + ctrl::SEND_PRODUCER, 3).unwrap();
        assert_eq!(e.send_pending(&m), 3);
        guest::store_u32(&m, 0x10000 + ctrl::SEND_PRODUCER, 5).unwrap();
        assert_eq!(e.send_pending(&m), 0);
        guest::store_u32(&m, 0x10000 + ctrl::SEND_PRODUCER, u32::MAX).unwrap();
        assert_eq!(e.send_pending(&m), 0);
        assert_eq!(e.stats.ring_errors, 2);
        // Only one condition event: the second is suppressed until the user clears the flag.
        assert_eq!(e.event_producer, 1);
    }

    #[test]
    fn wrapping_indices_work() {
        let m = mem(1 << 20);
        let mut e = ep(&m);
        e.send_consumer = u32::MAX - 1;
        guest::store_u32(&m, 0x10000 + ctrl::SEND_PRODUCER, 1).unwrap();
        assert_eq!(e.send_pending(&m), 3);
    }

    #[test]
    fn event_ring_full_counts_lost_and_condition_reserve_holds() {
        let m = mem(1 << 20);
        let mut e = ep(&m);
        for _ in 0..(64 - CONDITION_RESERVE) {
            assert!(e.event_room_for_send(&m));
            assert!(e.post_event(
                &m,
                &EventRecord {
                    kind: event::TX_DONE,
                    ..Default::default()
                }
            ));
        }
        assert!(!e.event_room_for_send(&m));
        for _ in 0..CONDITION_RESERVE {
            assert!(e.post_event(&m, &EventRecord::default()));
        }
        assert!(!e.post_event(&m, &EventRecord::default()));
        assert_eq!(e.stats.events_lost, 1);
        // A hostile consumer index (ahead of the producer) gives no room.
        guest::store_u32(&m, 0x10000 + ctrl::EVENT_CONSUMER, e.event_producer + 5).unwrap();
        assert!(!e.post_event(&m, &EventRecord::default()));
    }

    #[test]
    fn arm_is_one_shot() {
        let m = mem(1 << 20);
        let mut e = ep(&m);
        assert!(!e.take_arm(&m));
        e.notify_enabled = true;
        assert!(!e.take_arm(&m));
        guest::store_u32(&m, 0x10000 + ctrl::ARM_REQUEST, 1).unwrap();
        assert!(e.take_arm(&m));
        assert!(!e.take_arm(&m));
        assert_eq!(guest::load_u32(&m, 0x10000 + ctrl::ARM_ACK).unwrap(), 1);
    }
}
