//! The per-node NIC: the state of one node and its endpoints, and what an
//! endpoint does on its own (its rings, receiving, counters, UTLB
//! translation, apertures, tripwires, redirection). Nothing here reaches
//! across nodes; `shard` does that.

pub mod aperture;
pub mod doorbell;
pub mod endpoint;
pub mod node;
pub mod receive;
pub mod redirect;
pub mod stats;
pub mod utlb;
