//! Doorbells and resident endpoints (spec §5.8, VN's endpoint
//! virtualization): a node may have thousands of endpoints, the engine
//! polls the send rings of at most `RESIDENT_MAX` of them; the others ask
//! for a doorbell, which names them in their domain's bitmap, so a kick
//! costs the same however many endpoints there are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ulnic_abi::{bitmap, DOORBELL_QUEUES, FIRST_DOORBELL_QUEUE, RESIDENT_MAX};
use vm_memory::GuestMemoryMmap;

use crate::memory::guest::{self, full_fence};
use crate::nic::node::Node;

/// Records a kick of virtqueue `queue` in a node's `kicked` word, if it is
/// a doorbell queue (the engine looks at the domain's bitmap on its next
/// pass). Sequentially consistent: the caller then reads whether the
/// engine sleeps, which the engine wrote before reading these words.
pub fn record_kick(kicked: &AtomicU64, queue: u16) {
    let slot = u32::from(queue).wrapping_sub(u32::from(FIRST_DOORBELL_QUEUE));
    if slot < DOORBELL_QUEUES {
        kicked.fetch_or(1 << slot, Ordering::SeqCst);
    }
}

impl Node {
    /// Whether doorbells wait to be looked at.
    pub fn doorbells_waiting(&self) -> bool {
        self.kicked.load(Ordering::Relaxed) != 0 || !self.rung.is_empty()
    }

    /// Takes the doorbells rung since the last look: clears each kicked
    /// domain's bitmap, word by word with an atomic exchange, and makes
    /// every endpoint of that domain whose bit was set resident. Bits
    /// naming no endpoint, or another domain's, are ignored.
    pub fn take_doorbells(&mut self, mem: &GuestMemoryMmap<()>, now: Instant) {
        let mut kicked = self.kicked.swap(0, Ordering::SeqCst);
        let words = bitmap::words(self.endpoints.len() as u32) as u64;
        // Those that left with work waiting come back first.
        let mut rung = std::mem::take(&mut self.rung);
        while kicked != 0 {
            let slot = kicked.trailing_zeros();
            kicked &= kicked - 1;
            let Some((pd, gpa)) = self.doorbell_of_slot(slot) else {
                continue;
            };
            for w in 0..words {
                // Checked at CREATE_PD; memory that went away reads as no bits.
                let Ok(raw) = guest::swap_u64(mem, gpa + 8 * w, 0) else {
                    break;
                };
                for e in bitmap::endpoints(w as usize, u64::from_le(raw)) {
                    if let Some(ep) = self.endpoint_mut(e).filter(|ep| ep.pd == pd) {
                        ep.stats.doorbells += 1;
                        rung.push(e);
                    }
                }
            }
        }
        // Any pushed out meanwhile with work waiting land in `self.rung`,
        // for the next pass.
        for e in rung {
            self.make_resident(mem, e, now);
        }
    }

    /// Makes endpoint `e` resident: doorbell wanted 0, polled from now on.
    /// When `RESIDENT_MAX` are, the one idle longest leaves first.
    pub fn make_resident(&mut self, mem: &GuestMemoryMmap<()>, e: u32, now: Instant) {
        let Some(ep) = self.endpoint_mut(e) else {
            return;
        };
        // Also for one already resident that still asked (`leave_all`).
        ep.set_doorbell_wanted(mem, false);
        if let Some(r) = self.resident.iter_mut().find(|r| r.0 == e) {
            r.1 = now;
            return;
        }
        if self.resident.len() >= RESIDENT_MAX as usize {
            let oldest = (0..self.resident.len()).min_by_key(|&i| self.resident[i].1);
            if let Some(i) = oldest {
                let (old, _) = self.resident.swap_remove(i);
                if !self.ask_for_doorbells(mem, old) {
                    // It has work after all: it comes back at the next
                    // pass, as if it had rung.
                    self.rung.push(old);
                }
            }
        }
        self.resident.push((e, now));
    }

    /// Resident endpoint number `i` (in `resident`) leaves if it has had no
    /// send descriptor for `idle`; true when it left.
    pub fn leave_if_idle(
        &mut self,
        mem: &GuestMemoryMmap<()>,
        i: usize,
        now: Instant,
        idle: Duration,
    ) -> bool {
        let (e, active) = self.resident[i];
        if now.saturating_duration_since(active) < idle {
            return false;
        }
        if self.ask_for_doorbells(mem, e) {
            self.resident.swap_remove(i);
            true
        } else {
            self.resident[i].1 = now;
            false
        }
    }

    /// Before the engine sleeps: every resident endpoint is asked for
    /// doorbells, then (after one fence) looked at once more. Those with
    /// descriptors waiting stay resident, still asking: the engine polls
    /// them once more and may sleep if they cannot progress (fabric
    /// back-pressure, a full event ring), to be woken by the fabric's next
    /// due time or their doorbell. Returns how many stayed.
    pub fn leave_all(&mut self, mem: &GuestMemoryMmap<()>, now: Instant) -> usize {
        let Node {
            resident,
            endpoints,
            ..
        } = self;
        for &(e, _) in resident.iter() {
            if let Some(Some(ep)) = endpoints.get(e as usize) {
                ep.set_doorbell_wanted(mem, true);
            }
        }
        full_fence();
        resident.retain_mut(|(e, active)| {
            let Some(Some(ep)) = endpoints.get_mut(*e as usize) else {
                return false;
            };
            if ep.send_pending(mem) == 0 {
                return false;
            }
            *active = now;
            true
        });
        resident.len()
    }

    /// Asks endpoint `e` for doorbells (Dekker: the flag, a fence, one
    /// more look at its send ring). False, with the flag cleared again,
    /// when a descriptor arrived meanwhile; true when it left (or is gone).
    fn ask_for_doorbells(&mut self, mem: &GuestMemoryMmap<()>, e: u32) -> bool {
        let Some(ep) = self.endpoint_mut(e) else {
            return true;
        };
        ep.set_doorbell_wanted(mem, true);
        full_fence();
        if ep.send_pending(mem) > 0 {
            ep.set_doorbell_wanted(mem, false);
            false
        } else {
            true
        }
    }
}
