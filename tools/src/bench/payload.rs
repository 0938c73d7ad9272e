//! How benchmarks touch payloads: every byte written and checked (the
//! message benchmarks), or one byte per cache line (RDMA and UTLB, where
//! touching every byte would measure the loop rather than the transfer).

use std::io;

/// How much of each payload the message benchmarks touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
pub enum Touch {
    /// Neither side touches payloads: the transfer alone (as fabtests do
    /// by default).
    None,
    /// The sender writes every byte of every message; the receiver does
    /// not read them.
    Write,
    /// The sender writes every byte and the receiver checks every byte; a
    /// wrong byte fails the run (the default).
    #[default]
    #[value(name = "write+verify")]
    WriteVerify,
}

impl Touch {
    /// As result lines and `--payload` spell it.
    pub fn label(self) -> &'static str {
        match self {
            Touch::None => "none",
            Touch::Write => "write",
            Touch::WriteVerify => "write+verify",
        }
    }
}

/// Writes every byte of a message with a value derived from its number
/// (a memset).
pub(crate) fn fill_bytes(buf: &mut [u8], seq: u64) {
    let b = seq as u8;
    buf.iter_mut().for_each(|x| *x = b);
}

/// Checks every byte of message `seq` against what `fill_bytes` wrote,
/// at memcmp speed (a slice compare against a block of the expected byte,
/// not a loop over bytes that would measure itself).
pub(crate) fn check_bytes(buf: &[u8], seq: u64) -> io::Result<()> {
    const BLOCK: usize = 4096;
    let expected = [seq as u8; BLOCK];
    if buf.chunks(BLOCK).any(|c| c != &expected[..c.len()]) {
        return Err(io::Error::other(format!(
            "payload corrupted in message {seq}"
        )));
    }
    Ok(())
}

/// Marks every cache line of a buffer with a value derived from `i`.
pub(crate) fn fill_lines(buf: &mut [u8], i: u64) {
    // Touch every cache line (not every byte: that would measure the fill).
    let b = i as u8;
    for chunk in buf.chunks_mut(64) {
        chunk[0] = b;
    }
}

pub(crate) fn touch_lines(buf: &[u8]) -> u64 {
    buf.chunks(64).map(|c| u64::from(c[0])).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_wrong_byte_anywhere_is_caught() {
        for len in [0usize, 1, 4095, 4096, 4097, 65536] {
            let mut buf = vec![0u8; len];
            fill_bytes(&mut buf, 7);
            assert!(check_bytes(&buf, 7).is_ok());
            for at in [0, len / 2, len.saturating_sub(1)] {
                if len == 0 {
                    continue;
                }
                let mut bad = buf.clone();
                bad[at] ^= 1;
                assert!(check_bytes(&bad, 7).is_err(), "len {len}, byte {at}");
            }
            if len > 0 {
                assert!(check_bytes(&buf, 8).is_err());
            }
        }
    }
}
