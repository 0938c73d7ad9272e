//! The fabric between nodes (spec §10): its shape (`topology`), the routes
//! through it (`routing`), packets (`packet`), the links that carry them
//! (`link`), VN's reliable transport (`transport`), the wires to other
//! members of a fabric split between processes or engine shards (`span`),
//! and the network of switches and links that moves packets along the
//! routes (`network`).

pub mod link;
pub mod mapping;
pub mod network;
pub mod packet;
pub mod routing;
pub mod span;
pub mod topology;
pub mod transport;
