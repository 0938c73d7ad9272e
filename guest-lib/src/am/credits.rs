//! An AM endpoint's credits (VN's k_user, docs/am.md §3): a slot per
//! request in flight, holding a copy of it until its answer comes.

use crate::types::Address;

use super::wire::Kind;

/// A request in flight: what it was, for the error handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outstanding {
    /// Where it went.
    pub dest: Address,
    /// Request or transfer.
    pub kind: Kind,
    /// Its handler index.
    pub handler: u8,
    /// Its words.
    pub words: [u64; 4],
}

/// The slots.
#[derive(Debug)]
pub struct Credits {
    slots: Vec<Option<Outstanding>>,
    generations: Vec<u8>,
}

impl Credits {
    /// `k` slots, all free.
    pub fn new(k: u8) -> Credits {
        Credits {
            slots: vec![None; usize::from(k)],
            generations: vec![0; usize::from(k)],
        }
    }

    /// Free slots.
    pub fn available(&self) -> u32 {
        self.slots.iter().filter(|s| s.is_none()).count() as u32
    }

    /// Takes a free slot for `o`: its index and new generation.
    pub fn take(&mut self, o: Outstanding) -> Option<(u8, u8)> {
        let i = self.slots.iter().position(Option::is_none)?;
        self.generations[i] = self.generations[i].wrapping_add(1);
        self.slots[i] = Some(o);
        Some((i as u8, self.generations[i]))
    }

    /// Frees the slot if it is in flight with this generation and went to
    /// `from` (an answer from anywhere else frees nothing): what it held.
    pub fn settle(
        &mut self,
        slot: u8,
        generation: u8,
        from: Option<Address>,
    ) -> Option<Outstanding> {
        let i = usize::from(slot);
        let o = (*self.slots.get(i)?)?;
        if self.generations[i] != generation || from.is_some_and(|f| f != o.dest) {
            return None;
        }
        self.slots[i] = None;
        Some(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(node: u32) -> Outstanding {
        Outstanding {
            dest: Address { node, port: 1 },
            kind: Kind::Request,
            handler: 3,
            words: [1, 2, 3, 4],
        }
    }

    #[test]
    fn slots_run_out_and_come_back_only_from_their_destination() {
        let mut c = Credits::new(2);
        let (a, ga) = c.take(req(1)).unwrap();
        let (b, gb) = c.take(req(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(c.take(req(3)), None);
        assert_eq!(c.available(), 0);
        // From the wrong node, with a stale generation, for a free or
        // absent slot: nothing.
        assert_eq!(c.settle(a, ga, Some(Address { node: 2, port: 1 })), None);
        assert_eq!(c.settle(a, ga.wrapping_sub(1), None), None);
        assert_eq!(c.settle(9, 0, None), None);
        let got = c.settle(a, ga, Some(Address { node: 1, port: 1 })).unwrap();
        assert_eq!(
            (got.dest.node, got.handler, got.words),
            (1, 3, [1, 2, 3, 4])
        );
        // Settled once only; the freed slot is taken again with a new
        // generation, so the old answer cannot settle the new request.
        assert_eq!(c.settle(a, ga, None), None);
        let (a2, ga2) = c.take(req(4)).unwrap();
        assert_eq!(a2, a);
        assert_ne!(ga2, ga);
        assert_eq!(c.settle(a, ga, None), None);
        assert!(c.settle(b, gb, None).is_some());
        assert_eq!(c.available(), 1);
    }
}
