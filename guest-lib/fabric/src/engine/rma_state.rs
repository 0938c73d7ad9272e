//! What an endpoint keeps for remote memory access (`rma` does it): the
//! domain's registrations, reads and writes in flight, and the write a
//! peer is sending.

use std::collections::HashMap;
use std::sync::Arc;

use ulnic::Address;

use crate::mr::MrTable;

/// A read in flight.
pub struct ReadOp {
    pub buf: usize,
    pub len: usize,
    pub context: usize,
    pub report: bool,
    pub dest: Address,
}

/// A write delivered, waiting for its acknowledgement.
pub struct Waiting {
    pub len: usize,
    pub context: usize,
    pub report: bool,
    pub dest: Address,
}

/// A write arriving from a peer (its packets are contiguous).
pub struct Incoming {
    /// The region's key and the write's offset in it: each packet's
    /// range is looked up again, so a region closed while a write is
    /// arriving takes no more of it.
    pub key: u64,
    pub offset: u64,
    /// Still allowed (false once the access was refused).
    pub ok: bool,
    /// Bytes of it handled.
    pub got: usize,
    /// Its bytes (the payload less the prefix).
    pub total: usize,
    /// The writer's operation id, for the acknowledgement.
    pub op: u64,
    pub cq_data: Option<u64>,
}

/// An endpoint's remote-access state.
pub struct RmaTarget {
    pub mrs: Arc<MrTable>,
    pub reads: HashMap<u64, ReadOp>,
    pub acks: HashMap<u64, Waiting>,
    /// Acknowledgements that came before the device reported the
    /// write's last packet delivered (the target can be that quick):
    /// the outcome, kept for `write_delivered`.
    pub early: HashMap<u64, Option<i32>>,
}

impl RmaTarget {
    /// The state of an endpoint whose domain registers into `mrs`.
    pub fn new(mrs: Arc<MrTable>) -> RmaTarget {
        RmaTarget {
            mrs,
            reads: HashMap::new(),
            acks: HashMap::new(),
            early: HashMap::new(),
        }
    }
}
