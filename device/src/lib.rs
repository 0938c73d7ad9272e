//! The ulnic device: a NIC that exists only in software. One process serves
//! many nodes, each a vhost-user socket that a QEMU guest or a host process
//! attaches to, joined by one shard (or several, one per engine thread).
//!
//! The modules, bottom up (a module uses only those above it in this list):
//!
//! - [`memory`]: checked access to a frontend's memory (`guest`), and the
//!   checks and fault containment for the regions it shares (`region`).
//! - [`chain`]: checked popping of virtqueue descriptor chains.
//! - [`notifier`]: signals into a frontend's eventfds, and reads of its
//!   kicks, that never hold the device, however the frontend set them up.
//! - [`vring`]: a node's virtqueue, whose kicks are read through `notifier`.
//! - [`nic`]: the per-node NIC: endpoints and their rings (`endpoint`,
//!   `receive`, `stats`), the UTLB (`utlb`), apertures and tripwires
//!   (`aperture`), transfer redirection (`redirect`), and a node (`node`).
//! - [`fabric`]: the emulated fabric: its topology and deadlock-free
//!   routes, packets, links with their faults, VN's reliable transport,
//!   and the network of switches that moves packets (`network`).
//! - [`config`]: the validated configuration and the errors.
//! - [`shard`]: every node behind one lock, the data path between them
//!   (`nodes`, through the fabric when there is one), remote memory
//!   operations (`rdma`), the engine thread (`engine`), and the counters
//!   at one moment (`snapshot`).
//! - [`pio`]: PIO windows (CLAN's PIO apertures): the memory the device
//!   creates for them (`window`), what it knows of each frontend
//!   (`frontend`), and the commands that map and revoke them.
//! - [`vhost`]: each node's vhost-user face: the backend (`backend`), the
//!   control commands (`control`), the socket (`socket`).
//! - [`device`]: a running device.
//!
//! docs/architecture.md draws the crates and the path of a message.

/// Gives a counters struct `add`, summing the named fields (shards'
/// counters are summed this way), and `named`, the fields by name (what
/// `ulnic stats` prints): the field list is written once.
macro_rules! summable {
    ($t:ty { $($f:ident),* $(,)? }) => {
        impl $t {
            /// Adds `other`'s counts to these.
            pub fn add(&mut self, other: &Self) {
                $(self.$f += other.$f;)*
            }

            /// Every counter with its field name, in declaration order.
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($f), self.$f)),*]
            }
        }
    };
}

pub mod chain;
pub mod config;
pub mod device;
pub mod fabric;
pub mod memory;
pub mod nic;
pub mod notifier;
pub mod pio;
pub mod shard;
pub mod vhost;
pub mod vring;

pub use config::{Configuration, ConfigurationBuilder, Error};
pub use device::Device;
pub use shard::Shard;
