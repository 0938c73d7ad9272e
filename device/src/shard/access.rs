//! An RDMA descriptor once its initiator's side is checked (spec §5.12):
//! what it does and on which bytes. Shared by the engine's local path
//! (`rdma`) and its fabric path (`remote`).

use ulnic_abi::{op, Cookie};

use crate::memory::guest::Segment;

/// What an RDMA descriptor does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Write,
    Read,
    Immediate,
    /// PIO_SYNC: no bytes, the window's tripwires fired (spec §6.2).
    Sync,
}

impl Kind {
    /// The kind of an RDMA opcode (any other is a write).
    pub fn of(opcode: u16) -> Kind {
        match opcode {
            op::WRITE_IMMEDIATE => Kind::Immediate,
            op::RDMA_READ => Kind::Read,
            op::PIO_SYNC => Kind::Sync,
            _ => Kind::Write,
        }
    }
}

/// An RDMA descriptor, checked at its initiator.
pub struct Request {
    pub kind: Kind,
    pub opcode: u16,
    pub cookie: Cookie,
    pub remote_offset: u64,
    pub len: u64,
    pub local_offset: u64,
    /// The local buffer when the descriptor names it through the UTLB
    /// (else the initiator's segment).
    pub translated: Option<Segment>,
    pub immediate: u64,
    pub user_id: u64,
    pub completion: bool,
}
