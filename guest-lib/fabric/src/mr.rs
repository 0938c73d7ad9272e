//! Memory registrations of a domain (fi_mr_reg) as remote memory access
//! sees them (docs/libfabric.md §2, RMA): each has a key the provider
//! draws at random (FI_MR_PROV_KEY), so a peer can only guess one, and
//! every access is checked against the region's bounds and rights by
//! the target's provider before a byte moves.

use std::collections::HashMap;
use std::sync::Mutex;

/// A registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrEntry {
    /// Its first byte in this process.
    pub base: usize,
    /// Its length.
    pub len: usize,
    /// FI_REMOTE_READ and FI_REMOTE_WRITE, as registered.
    pub access: u64,
}

/// A domain's registrations by key.
#[derive(Debug, Default)]
pub struct MrTable {
    map: Mutex<HashMap<u64, MrEntry>>,
}

/// A random non-zero key.
fn random_key() -> u64 {
    let mut k = [0u8; 8];
    // SAFETY: 8 writable bytes.
    let n = unsafe { libc::getrandom(k.as_mut_ptr().cast(), 8, 0) };
    let v = u64::from_le_bytes(k);
    if n == 8 && v != 0 {
        return v;
    }
    // getrandom cannot fail for 8 bytes once the pool is ready; should it,
    // a clock-and-address mix is still no sequence a peer can count along.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (&k as *const _ as u64).rotate_left(17)) | 1
}

impl MrTable {
    /// Registers `e`: its key.
    pub fn register(&self, e: MrEntry) -> u64 {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let k = random_key();
            if let std::collections::hash_map::Entry::Vacant(v) = m.entry(k) {
                v.insert(e);
                return k;
            }
        }
    }

    /// Forgets `key`.
    pub fn remove(&self, key: u64) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    }

    /// The address of `len` bytes at `offset` of region `key`, if the
    /// region exists, allows `access` and holds the whole range.
    pub fn reach(&self, key: u64, offset: u64, len: usize, access: u64) -> Option<usize> {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.get(&key)?;
        let off = usize::try_from(offset).ok()?;
        let end = off.checked_add(len)?;
        (e.access & access == access && end <= e.len).then_some(e.base + off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_accesses_are_bounded() {
        let t = MrTable::default();
        let e = MrEntry {
            base: 0x1000,
            len: 100,
            access: 1,
        };
        let a = t.register(e);
        let b = t.register(e);
        assert_ne!(a, b);
        assert_ne!(a, 0);
        assert_ne!(b.wrapping_sub(a), 1, "keys do not count up");
        assert_eq!(t.reach(a, 10, 90, 1), Some(0x100a));
        assert_eq!(t.reach(a, 10, 91, 1), None, "past the end");
        assert_eq!(t.reach(a, u64::MAX, 1, 1), None, "offset overflow");
        assert_eq!(t.reach(a, 0, 1, 2), None, "access not granted");
        assert_eq!(t.reach(a ^ 1, 0, 1, 1), None, "another key");
        t.remove(a);
        assert_eq!(t.reach(a, 0, 1, 1), None, "removed");
        assert!(t.reach(b, 0, 100, 1).is_some());
    }
}
