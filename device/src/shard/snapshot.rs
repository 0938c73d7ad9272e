//! A device's counters at one moment, as `ulnic stats` shows them: per
//! node, per endpoint, the shards' totals, and the fabric's links,
//! switches and transport.

use crate::fabric::network::FabricCounters;
use crate::shard::counters::Counters;

/// One endpoint's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSnapshot {
    /// Its id on its node.
    pub id: u32,
    /// The port it is bound to.
    pub port: Option<u32>,
    /// Its counters, in the order of `ulnic_abi::STAT_NAMES`.
    pub stats: [u64; ulnic_abi::STAT_NAMES.len()],
    /// Sends in the fabric not yet settled.
    pub in_flight: u32,
}

/// One node's state and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    /// Its number.
    pub node: u32,
    /// Whether a frontend is attached (and has shared its memory).
    pub attached: bool,
    /// Frontends it has had.
    pub connections: u64,
    /// Its live endpoints.
    pub endpoints: Vec<EndpointSnapshot>,
    /// Virtqueue errors it made.
    pub queue_errors: u64,
    /// Times its shared memory shrank under the device.
    pub memory_faults: u64,
    /// Times the thread reading its frontend's vhost-user socket woke up
    /// (`vhost::reader`); None without a frontend.
    pub vhost_wakeups: Option<u64>,
}

/// Everything a device counts.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Per node.
    pub nodes: Vec<NodeSnapshot>,
    /// The shards' totals.
    pub totals: Counters,
    /// The fabric's, when it has one; with the names of its links and
    /// switches.
    pub fabric: Option<(FabricCounters, Vec<String>, Vec<String>)>,
}
