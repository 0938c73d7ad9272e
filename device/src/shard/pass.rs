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
use ulnic_abi::{event, tx_error, EventRecord, INLINE_MAX, OOB_MAX};

/// An out-of-band message (spec §5.3): at most `OOB_MAX` bytes.
#[derive(Debug, Clone, Copy)]
pub struct Oob {
    /// The sender's node and port.
    pub src: (u32, u32),
    /// The sender's session id.
    pub session: u32,
    /// The sender's tag.
    pub tag: u32,
    data: [u8; OOB_MAX as usize],
    len: usize,
}

impl Oob {
    /// The OOB message of `bytes` (at most `OOB_MAX`; more are cut off,
    /// the callers checked).
    pub fn new(src: (u32, u32), session: u32, tag: u32, bytes: &[u8]) -> Oob {
        let len = bytes.len().min(OOB_MAX as usize);
        let mut data = [0u8; OOB_MAX as usize];
        data[..len].copy_from_slice(&bytes[..len]);
        Oob {
            src,
            session,
            tag,
            data,
            len,
        }
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

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

    /// The endpoint bound to `port` on node `dst`: its node's memory, its
    /// id and itself (else NO_ENDPOINT).
    pub fn bound(
        &mut self,
        dst: u32,
        port: u32,
    ) -> Result<(&'a GuestMemoryMmap<()>, u32, &mut Endpoint), u16> {
        let dmem = self.mem(dst).ok_or(tx_error::NO_ENDPOINT)?;
        let node = self
            .nodes
            .get_mut(dst as usize)
            .ok_or(tx_error::NO_ENDPOINT)?;
        let de = *node.ports.get(&port).ok_or(tx_error::NO_ENDPOINT)?;
        let rx = node.endpoint_mut(de).ok_or(tx_error::NO_ENDPOINT)?;
        Ok((dmem, de, rx))
    }

    /// How many more messages of `len` bytes the endpoint bound to `port`
    /// on node `dst` could take now: its free receive slots, and for a
    /// message too long to go inline its free buffers too (0 if none).
    pub fn room(&mut self, dst: u32, port: u32, len: usize) -> u32 {
        let Ok((mem, _, rx)) = self.bound(dst, port) else {
            return 0;
        };
        let slots = rx.recv_room(mem).unwrap_or(0);
        if len <= INLINE_MAX as usize {
            slots
        } else {
            slots.min(rx.free_pending(mem))
        }
    }

    /// Delivers `m` to the endpoint bound to `port` on node `dst` and
    /// wakes its owner if armed: the direct path, the fabric's deliveries
    /// and close messages all end here.
    pub fn deliver(&mut self, dst: u32, port: u32, m: &Message<'_>) -> Result<(), u16> {
        let (dmem, de, rx) = self.bound(dst, port)?;
        let (r, woke) = deliver_and_arm(dmem, rx, m);
        if woke {
            self.wake.push((dst, de));
        }
        r
    }
}

impl Pass<'_> {
    /// Posts OOB message `o` as an event to the endpoint bound to `port` on
    /// node `dst`, and wakes its owner if armed: it needs the filter's
    /// consent and an event slot to spare beyond its sends' and
    /// conditions' (else NO_BUFFER, retried by the transport).
    pub fn deliver_oob(&mut self, dst: u32, port: u32, o: &Oob) -> Result<(), u16> {
        let (dmem, de, rx) = self.bound(dst, port)?;
        if !rx.accepts(o.src.0, o.src.1, o.tag) {
            rx.stats.rx_rejected += 1;
            return Err(tx_error::REJECTED);
        }
        if !rx.event_room_for_send(dmem) {
            rx.stats.rx_dropped_no_buffer += 1;
            return Err(tx_error::NO_BUFFER);
        }
        let mut word = [0u8; 8];
        word[..o.len].copy_from_slice(o.bytes());
        let ev = EventRecord {
            kind: event::OOB,
            code: 0,
            aux: o.tag,
            user_id: u64::from_le_bytes(word),
            node: o.src.0,
            port: o.src.1,
            len: o.len as u32,
            session: o.session,
        };
        rx.post_event(dmem, &ev);
        rx.stats.rx_messages += 1;
        rx.stats.rx_bytes += o.len as u64;
        if rx.take_arm(dmem) {
            self.wake.push((dst, de));
        }
        Ok(())
    }

    /// Tells endpoint `e` of node `n` that the fabric gave up on node
    /// `lost` (an UNREACHABLE event), waking its owner if armed.
    pub fn report_unreachable(&mut self, n: u32, e: u32, lost: u32) {
        let Some(mem) = self.mem(n) else {
            return;
        };
        let Some(ep) = self
            .nodes
            .get_mut(n as usize)
            .and_then(|x| x.endpoint_mut(e))
        else {
            return;
        };
        let ev = EventRecord {
            kind: event::UNREACHABLE,
            node: lost,
            ..Default::default()
        };
        if ep.post_event(mem, &ev) && ep.take_arm(mem) {
            self.wake.push((n, e));
        }
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
