//! A received message a socket holds until its program reads it: inline
//! bytes, or a receive buffer of the endpoint's to give back afterwards.

use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::types::{Payload, Received};
use ulnic_abi::INLINE_MAX;

/// A held message.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Held {
    /// Carried in the descriptor.
    Inline {
        data: [u8; INLINE_MAX as usize],
        len: u32,
    },
    /// In a receive buffer of the segment.
    Buffer { offset: u64, id: u64, len: u32 },
}

impl Held {
    /// What `m` carries.
    pub fn of(m: &Received) -> Held {
        match m.payload {
            Payload::Inline(data) => Held::Inline {
                data,
                len: m.len.min(INLINE_MAX),
            },
            Payload::Buffer { offset, id } => Held::Buffer {
                offset,
                id,
                len: m.len,
            },
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> u32 {
        match *self {
            Held::Inline { len, .. } | Held::Buffer { len, .. } => len,
        }
    }

    /// Copies its bytes from `from` into `out` (as many as fit).
    pub fn copy_out(&self, ep: &Endpoint, from: u32, out: &mut [u8]) -> usize {
        let n = (self.len().saturating_sub(from) as usize).min(out.len());
        match *self {
            Held::Inline { data, .. } => {
                out[..n].copy_from_slice(&data[from as usize..from as usize + n]);
            }
            Held::Buffer { offset, .. } => {
                let at = offset as usize + from as usize;
                // A buffer the device says it filled lies in the segment;
                // a length past it would be the device's bug, not ours to
                // read beyond.
                if at + n <= ep.segment_len() {
                    ep.read_segment(at, &mut out[..n]);
                } else {
                    return 0;
                }
            }
        }
        n
    }

    /// Gives its receive buffer (if any) back to the device, `size` bytes.
    pub fn release(&self, ep: &mut Endpoint, size: u32) -> Result<(), Error> {
        if let Held::Buffer { offset, id, .. } = *self {
            ep.post_free(offset, size, id)?;
        }
        Ok(())
    }
}
