//! A short stable hash of a string (FNV-1a), for cache file names and
//! stamps.

/// The FNV-1a hash of `s`, as 16 hex digits.
pub fn fnv(s: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}
