//! What the engine carries through one pass: every node's endpoints and
//! memory, the UTLB, and the owners to wake when the pass ends; and the
//! endpoint whose send descriptor is being served. Every operation of the
//! send ring (`send`, `rdma`) and every delivery takes these two instead of
//! a long list of pieces.

use vm_memory::GuestMemoryMmap;

use crate::memory::guest::MemGuard;
use crate::nic::endpoint::Endpoint;
use crate::nic::node::Node;
use crate::nic::receive::{deliver_and_arm, Message};
use crate::nic::utlb::Utlb;
use ulnic_abi::tx_error;

/// The shard as one pass sees it.
pub struct Pass<'a> {
    /// Every node of the shard, by address.
    pub nodes: &'a mut [Node],
    /// Every domain's UTLB table and the device's translation cache.
    pub utlb: &'a mut Utlb,
    /// Each node's memory, taken once for the pass (`None`: no frontend).
    pub mems: &'a [Option<MemGuard>],
    /// Endpoints (node, id) whose armed owner is notified after the pass.
    pub wake: &'a mut Vec<(u32, u32)>,
}

impl<'a> Pass<'a> {
    /// Node `n`'s memory, if a frontend shared some.
    pub fn mem(&self, n: u32) -> Option<&'a GuestMemoryMmap<()>> {
        self.mems.get(n as usize)?.as_deref()
    }

    /// Delivers `m` to the endpoint bound to `port` on node `dst` and
    /// wakes its owner if armed: the direct path, the fabric's deliveries
    /// and close messages all end here.
    pub fn deliver(&mut self, dst: u32, port: u32, m: &Message<'_>) -> Result<(), u16> {
        let dmem = self.mem(dst).ok_or(tx_error::NO_ENDPOINT)?;
        let node = self
            .nodes
            .get_mut(dst as usize)
            .ok_or(tx_error::NO_ENDPOINT)?;
        let de = *node.ports.get(&port).ok_or(tx_error::NO_ENDPOINT)?;
        let rx = node.endpoint_mut(de).ok_or(tx_error::NO_ENDPOINT)?;
        let (r, woke) = deliver_and_arm(dmem, rx, m);
        if woke {
            self.wake.push((dst, de));
        }
        r
    }
}

/// The endpoint whose send descriptor is being served, taken out of its
/// slot meanwhile (so the pass can reach the other endpoints).
pub struct Initiator<'a> {
    /// Its node.
    pub node: u32,
    /// Its id on that node.
    pub id: u32,
    /// The endpoint.
    pub ep: &'a mut Endpoint,
    /// Its node's memory.
    pub mem: &'a GuestMemoryMmap<()>,
}

impl Initiator<'_> {
    /// Its address as a writer: node and bound port (0 when unbound).
    pub fn writer(&self) -> (u32, u32) {
        (self.node, self.ep.port.unwrap_or(0))
    }

    /// Its (node, protection domain): the UTLB table it translates in.
    pub fn domain(&self) -> (u32, u32) {
        (self.node, self.ep.pd)
    }
}
