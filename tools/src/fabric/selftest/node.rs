//! One node of the self-test: an endpoint on port 1 whose whole segment
//! is exported to the others (laid out as `layout` says). It posts its
//! share of the operations round-robin over the kinds asked for and over
//! the other nodes, checks what arrives as it arrives, and once told to
//! stop checks its segment against what the writers say they wrote.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::Duration;

use anyhow::Context;
use ulnic::{
    Address, Cookie, Endpoint, EndpointConfig, Event, Immediate, Nic, Payload, Permissions,
    ProtectionDomain,
};

use super::counts::{Counts, Ledger, Tally};
use super::layout::{
    readable_byte, slot_bytes, Layout, Op, IN_FLIGHT, READABLE, READ_LEN, SLOT, SLOTS,
};

/// The port every node's endpoint binds.
pub const PORT: u32 = 1;
/// The port of the short-lived endpoints that leave close messages.
const CLOSE_PORT: u32 = 2;

/// What every node thread shares.
pub struct Shared {
    /// Nodes.
    pub nodes: u32,
    /// The kinds to mix.
    pub ops: Vec<Op>,
    /// Progress.
    pub tally: Tally,
    /// What writers posted.
    pub ledger: Ledger,
    /// Node `i`'s cookie, once it exported its segment.
    pub cookies: Vec<OnceLock<Cookie>>,
    /// Nobody posts before every node is set up.
    pub ready: Barrier,
    /// Set once everything settled (or nothing moves any more).
    pub stop: AtomicBool,
}

/// An operation with a completion, in flight.
#[derive(Clone, Copy)]
struct Pending {
    op: Op,
    dst: u32,
    /// Its staging slot and landing area.
    slot: usize,
    /// Reads: the offset read in the target's pattern.
    offset: u64,
}

/// A node's state.
struct Node<'a> {
    n: u32,
    s: &'a Shared,
    layout: Layout,
    pd: ProtectionDomain,
    ep: Endpoint,
    cookies: Vec<Cookie>,
    counts: Counts,
    free: Vec<usize>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
    /// Per destination: next send, write, immediate, close number.
    next: [Vec<u64>; 4],
    reads: u64,
    /// Per source: which send numbers and which close numbers arrived.
    seen_sends: Vec<Vec<u64>>,
    highest_send: Vec<Option<u64>>,
    seen_closes: Vec<Vec<u64>>,
    /// Per source and slot: the highest write seen there.
    write_seen: Vec<u64>,
    /// Per source: its immediate word when last looked at.
    counter_seen: Vec<u64>,
    looks: u64,
}

/// Runs node `n` for `quota` operations; its counts.
pub fn run(n: u32, quota: u64, socket: &std::path::Path, s: &Shared) -> anyhow::Result<Counts> {
    let made = setup(n, socket, s);
    // Everyone waits here, failed or not, so no thread waits for ever.
    s.ready.wait();
    let (_nic, pd, ep) = made?;
    let cookies = s
        .cookies
        .iter()
        .enumerate()
        .map(|(i, c)| c.get().copied().with_context(|| format!("node {i} failed")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let nodes = s.nodes as usize;
    let mut node = Node {
        n,
        s,
        layout: Layout::new(s.nodes),
        pd,
        ep,
        cookies,
        counts: Counts::default(),
        free: (0..IN_FLIGHT).collect(),
        pending: HashMap::new(),
        next_id: 1,
        next: std::array::from_fn(|_| vec![0; nodes]),
        reads: 0,
        seen_sends: vec![Vec::new(); nodes],
        highest_send: vec![None; nodes],
        seen_closes: vec![Vec::new(); nodes],
        write_seen: vec![0; nodes * SLOTS as usize],
        counter_seen: vec![0; nodes],
        looks: 0,
    };
    node.main_loop(quota).with_context(|| format!("node {n}"))?;
    node.final_check();
    Ok(node.counts)
}

/// Attaches, binds, fills the readable pattern and exports the segment.
fn setup(
    n: u32,
    socket: &std::path::Path,
    s: &Shared,
) -> anyhow::Result<(Nic, ProtectionDomain, Endpoint)> {
    let layout = Layout::new(s.nodes);
    let nic = Nic::attach(socket).with_context(|| format!("node {n}: attach"))?;
    let pd = nic.alloc_pd()?;
    let mut ep = pd.create_endpoint(&EndpointConfig {
        send_entries: 256,
        recv_entries: 1024,
        free_entries: 16,
        segment_bytes: layout.segment_bytes(),
    })?;
    ep.bind(PORT)?;
    let pattern: Vec<u8> = (0..READABLE).map(|o| readable_byte(n, o)).collect();
    ep.write_segment(layout.readable() as usize, &pattern);
    let cookie = ep.export(0, layout.segment_bytes() as u64, Permissions::READ_WRITE)?;
    // Each node sets only its own.
    let _ = s.cookies[n as usize].set(cookie);
    Ok((nic, pd, ep))
}

/// Records `seq` in a bitmap; false if it was there already.
fn first_time(bits: &mut Vec<u64>, seq: u64) -> bool {
    let (word, bit) = ((seq / 64) as usize, 1u64 << (seq % 64));
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    let new = bits[word] & bit == 0;
    bits[word] |= bit;
    new
}

impl Node<'_> {
    fn main_loop(&mut self, quota: u64) -> anyhow::Result<()> {
        let ops = self.s.ops.clone();
        let mut posted = 0u64;
        let mut told_finished = false;
        while !self.s.stop.load(Ordering::Relaxed) {
            let mut busy = false;
            while posted < quota {
                let round = posted / ops.len() as u64;
                let op = ops[(posted % ops.len() as u64) as usize];
                let dst =
                    (self.n + 1 + (round % u64::from(self.s.nodes - 1)) as u32) % self.s.nodes;
                if !self.post(op, dst)? {
                    break;
                }
                posted += 1;
                self.s.tally.posted();
                busy = true;
            }
            if posted == quota && !told_finished {
                told_finished = true;
                self.s.tally.finished.fetch_add(1, Ordering::Relaxed);
            }
            busy |= self.receive()?;
            busy |= self.events()?;
            self.look();
            if !busy {
                self.ep.wait(Duration::from_millis(1))?;
            }
        }
        Ok(())
    }

    /// Posts one `op` to `dst`; false if it must wait (no room).
    fn post(&mut self, op: Op, dst: u32) -> anyhow::Result<bool> {
        let to = Address {
            node: dst,
            port: PORT,
        };
        let d = dst as usize;
        match op {
            Op::Send => {
                let mut msg = [0u8; 16];
                msg[..4].copy_from_slice(&self.n.to_le_bytes());
                msg[8..].copy_from_slice(&self.next[0][d].to_le_bytes());
                if !room(self.ep.post_send_inline(to, 0, &msg, 0))? {
                    return Ok(false);
                }
                self.next[0][d] += 1;
                self.counts.send.posted += 1;
            }
            Op::Close => {
                let mut ep = self.pd.create_endpoint(&EndpointConfig {
                    send_entries: 16,
                    recv_entries: 16,
                    free_entries: 16,
                    segment_bytes: 4096,
                })?;
                ep.bind(CLOSE_PORT)?;
                let mut msg = [0u8; 16];
                msg[..4].copy_from_slice(&self.n.to_le_bytes());
                msg[4..8].copy_from_slice(&ep.session().to_le_bytes());
                msg[8..].copy_from_slice(&self.next[3][d].to_le_bytes());
                ep.set_close_message(to, 0, &msg)?;
                // Destroyed: the device sends the close message.
                drop(ep);
                self.next[3][d] += 1;
                self.counts.close.posted += 1;
            }
            Op::RdmaWrite | Op::RdmaRead | Op::Immediate => return self.post_rdma(op, dst),
        }
        Ok(true)
    }

    /// Posts an operation with a completion; false if it must wait.
    fn post_rdma(&mut self, op: Op, dst: u32) -> anyhow::Result<bool> {
        // An immediate is two descriptors, posted together.
        if self.ep.send_space() < 2 {
            return Ok(false);
        }
        let Some(slot) = self.free.pop() else {
            return Ok(false);
        };
        let (n, d, l) = (self.n, dst as usize, self.layout);
        let cookie = self.cookies[d];
        let id = self.next_id;
        let staging = l.staging(slot);
        let mut offset = 0;
        let r = match op {
            Op::RdmaWrite => {
                let seq = self.next[1][d];
                let to = l.write_slot(n, seq);
                let r = self.write_from(staging, (&cookie, to), slot_bytes(n, dst, seq), id);
                if r.is_ok() {
                    self.s.ledger.wrote(n, dst, seq);
                    self.next[1][d] += 1;
                    self.counts.rdma_write.posted += 1;
                }
                r
            }
            Op::RdmaRead => {
                offset = (self.reads * u64::from(READ_LEN)) % READABLE;
                let r = self.ep.rdma_read(
                    &cookie,
                    l.readable() + offset,
                    l.landing(slot),
                    READ_LEN,
                    id,
                    true,
                );
                if r.is_ok() {
                    self.reads += 1;
                    self.counts.rdma_read.posted += 1;
                }
                r
            }
            _ => {
                let j = self.next[2][d];
                let to = l.immediate_slot(n, j);
                // Its completion is the immediate's (same endpoint, in order).
                let data = self.write_from(staging, (&cookie, to), slot_bytes(n, dst, j), 0);
                let r = data.and_then(|()| {
                    self.ep
                        .write_immediate(&cookie, l.counter(n), Immediate::U64(j + 1), id, true)
                });
                if r.is_ok() {
                    self.s.ledger.immediate(n, dst, j);
                    self.next[2][d] += 1;
                    self.counts.immediate.posted += 1;
                }
                r
            }
        };
        if !room(r)? {
            self.free.push(slot);
            return Ok(false);
        }
        self.next_id += 1;
        self.pending.insert(
            id,
            Pending {
                op,
                dst,
                slot,
                offset,
            },
        );
        Ok(true)
    }

    /// Stages `bytes` in the segment at `staging` and writes them to `to`
    /// (an aperture and an offset in it); with a completion unless `id` is
    /// 0.
    fn write_from(
        &mut self,
        staging: u64,
        to: (&Cookie, u64),
        bytes: [u8; SLOT as usize],
        id: u64,
    ) -> Result<(), ulnic::Error> {
        self.ep.write_segment(staging as usize, &bytes);
        self.ep
            .rdma_write(to.0, to.1, staging, SLOT as u32, id, id != 0)
    }

    /// Takes what arrived; whether anything did.
    fn receive(&mut self) -> anyhow::Result<bool> {
        let mut any = false;
        while let Some(m) = self.ep.poll_recv() {
            any = true;
            let Payload::Inline(b) = m.payload else {
                anyhow::bail!("a message came in a buffer");
            };
            let src = u32::from_le_bytes(b[..4].try_into()?);
            let word = u32::from_le_bytes(b[4..8].try_into()?);
            let seq = u64::from_le_bytes(b[8..16].try_into()?);
            if m.returned {
                self.counts.send.failed += 1;
                self.s.tally.settled();
                continue;
            }
            anyhow::ensure!(
                src < self.s.nodes && src == m.src.node,
                "a message from {} claims {src}",
                m.src.node
            );
            let s = src as usize;
            if m.close {
                if !first_time(&mut self.seen_closes[s], seq) {
                    self.counts.close.duplicated += 1;
                    continue;
                }
                self.counts.close.completed += 1;
                // The session is the closed endpoint's, not its port's
                // other holders'.
                if word == m.session && m.src.port == CLOSE_PORT {
                    self.counts.close.checked += 1;
                } else {
                    self.counts.close.wrong += 1;
                }
                self.s.tally.settled();
                continue;
            }
            if !first_time(&mut self.seen_sends[s], seq) {
                self.counts.send.duplicated += 1;
                continue;
            }
            if self.highest_send[s].is_some_and(|h| seq < h) {
                self.counts.send.out_of_order += 1;
            }
            self.highest_send[s] = Some(self.highest_send[s].map_or(seq, |h| h.max(seq)));
            self.counts.send.completed += 1;
            self.s.tally.settled();
        }
        Ok(any)
    }

    /// Takes events; whether there were any.
    fn events(&mut self) -> anyhow::Result<bool> {
        let mut any = false;
        while let Some(ev) = self.ep.poll_event() {
            any = true;
            match ev {
                Event::SendDone { id } => {
                    let p = self
                        .pending
                        .remove(&id)
                        .with_context(|| format!("a completion for {id}, never posted"))?;
                    self.completed(p);
                }
                Event::SendFailed { id, .. } => {
                    // Sends (id 0) come back as returned messages.
                    if let Some(p) = self.pending.remove(&id) {
                        self.failed(p);
                    }
                }
                Event::Condition(_) => {}
                Event::Unreachable { .. } => {
                    self.counts.unreachable += 1;
                    self.s.tally.unreachable.fetch_add(1, Ordering::Relaxed);
                }
                other => anyhow::bail!("unexpected event {other:?}"),
            }
        }
        Ok(any)
    }

    fn completed(&mut self, p: Pending) {
        match p.op {
            Op::RdmaWrite => self.counts.rdma_write.completed += 1,
            Op::Immediate => self.counts.immediate.completed += 1,
            _ => {
                self.counts.rdma_read.completed += 1;
                let mut got = vec![0u8; READ_LEN as usize];
                self.ep
                    .read_segment(self.layout.landing(p.slot) as usize, &mut got);
                let right = got
                    .iter()
                    .enumerate()
                    .all(|(i, b)| *b == readable_byte(p.dst, p.offset + i as u64));
                if right {
                    self.counts.rdma_read.checked += 1;
                } else {
                    self.counts.rdma_read.wrong += 1;
                }
            }
        }
        self.free.push(p.slot);
        self.s.tally.settled();
    }

    fn failed(&mut self, p: Pending) {
        match p.op {
            Op::RdmaWrite => {
                self.counts.rdma_write.failed += 1;
                self.s.ledger.write_failed(self.n, p.dst);
            }
            Op::Immediate => {
                self.counts.immediate.failed += 1;
                self.s.ledger.immediate_failed(self.n, p.dst);
            }
            _ => self.counts.rdma_read.failed += 1,
        }
        self.free.push(p.slot);
        self.s.tally.settled();
    }

    /// Looks at what the others wrote here: an immediate word never goes
    /// back and never shows before the data posted ahead of it; (now and
    /// then) a write slot never goes back to an older write.
    fn look(&mut self) {
        let l = self.layout;
        for src in (0..self.s.nodes).filter(|&s| s != self.n) {
            let s = src as usize;
            let v = self.ep.read_u64(l.counter(src));
            if v < self.counter_seen[s] {
                self.counts.immediate.out_of_order += 1;
            } else if v > self.counter_seen[s] {
                // The data of immediate v - 1 (or a later one in its slot).
                let data = self.ep.read_u64(l.immediate_slot(src, v - 1));
                if data < v {
                    self.counts.immediate.wrong += 1;
                }
            }
            self.counter_seen[s] = v;
        }
        self.looks += 1;
        if !self.looks.is_multiple_of(16) {
            return;
        }
        for src in (0..self.s.nodes).filter(|&s| s != self.n) {
            for k in 0..SLOTS {
                let i = src as usize * SLOTS as usize + k as usize;
                let h = self.ep.read_u64(l.write_slot(src, k));
                if h < self.write_seen[i] {
                    self.counts.rdma_write.out_of_order += 1;
                }
                self.write_seen[i] = self.write_seen[i].max(h);
            }
        }
    }

    /// With everything settled: every write slot holds its last write's
    /// bytes, every immediate word its last immediate (for writers none
    /// of whose writes failed: a failed one may or may not have landed).
    fn final_check(&mut self) {
        let l = self.layout;
        for src in (0..self.s.nodes).filter(|&s| s != self.n) {
            let (writes, all_done) = self.s.ledger.writes(src, self.n);
            if all_done {
                for k in 0..SLOTS.min(writes) {
                    let last = k + (writes - 1 - k) / SLOTS * SLOTS;
                    let mut got = [0u8; SLOT as usize];
                    self.ep
                        .read_segment(l.write_slot(src, k) as usize, &mut got);
                    if got == slot_bytes(src, self.n, last) {
                        self.counts.rdma_write.checked += 1;
                    } else {
                        self.counts.rdma_write.wrong += 1;
                    }
                }
            }
            let (immediates, all_done) = self.s.ledger.immediates(src, self.n);
            if all_done && immediates > 0 {
                if self.ep.read_u64(l.counter(src)) == immediates {
                    self.counts.immediate.checked += 1;
                } else {
                    self.counts.immediate.wrong += 1;
                }
            }
        }
    }
}

/// Ok(true) if posted, Ok(false) if the ring had no room.
fn room(r: Result<(), ulnic::Error>) -> anyhow::Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(ulnic::Error::WouldBlock) => Ok(false),
        Err(e) => Err(e).context("post"),
    }
}
