//! An endpoint's zero-copy bookkeeping (spec §5.14): the UTLB entries its
//! posted descriptors hold, its bounce buffer, and the entries redirections
//! and exported buffers hold.

use std::collections::{HashMap, VecDeque};

use crate::backend::UserMemory;
use crate::utlb::{Translation, Translations, UtlbRef};

/// A posted descriptor's hold on UTLB entries.
pub(crate) struct InFlight {
    pub(crate) seq: u32,
    pub(crate) entries: UtlbRef,
    /// For a fallback: where its copy ends in the bounce ring.
    pub(crate) bounce_end: Option<u64>,
}

/// An endpoint's bounce buffer: registered once, used as a ring.
pub(crate) struct Bounce {
    pub(crate) mem: UserMemory,
    pub(crate) entries: UtlbRef,
    /// Bytes ever allocated / ever released (positions in the ring).
    pub(crate) head: u64,
    pub(crate) tail: u64,
}

/// The UTLB state an endpoint keeps.
#[derive(Default)]
pub(crate) struct EndpointUtlb {
    pub(crate) in_flight: VecDeque<InFlight>,
    pub(crate) bounce: Option<Bounce>,
    /// Entries held by active redirections, until their REDIRECTED event.
    pub(crate) redirects: HashMap<u64, UtlbRef>,
    /// Entries held by exported buffers, by aperture, until revoked.
    /// (`revoke` takes `&self`, hence the lock.)
    pub(crate) exports: std::sync::Mutex<HashMap<u32, UtlbRef>>,
}

/// Where a transfer's local bytes are.
pub(crate) struct Local {
    pub(crate) entries: UtlbRef,
    /// For a fallback: the bounce ring's head before and after the copy.
    pub(crate) bounce: Option<(u64, u64)>,
    pub(crate) how: Translation,
}

impl EndpointUtlb {
    /// Releases the entries of descriptors the device has retired (the
    /// send consumer index is `done`).
    pub(crate) fn reap(&mut self, done: u32, t: &mut Translations) {
        while let Some(f) = self.in_flight.front() {
            // Retired when the consumer has moved past its slot.
            if (done.wrapping_sub(f.seq) as i32) <= 0 {
                break;
            }
            t.release(&f.entries);
            if let (Some(end), Some(b)) = (f.bounce_end, self.bounce.as_mut()) {
                b.tail = end;
            }
            self.in_flight.pop_front();
        }
    }
}
