//! What the self-test counts: per kind of operation (a node's own, summed
//! at the end), the progress the nodes share while it runs, and the
//! writers' ledger the targets check their segments against.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

/// One kind of operation's counts. What `completed` and the checks mean
/// depends on the kind (docs/spec.md §10.4 says what each must be):
///
/// - rdma-write: `checked` is every slot of every target whose bytes are
///   the last write into it; `wrong` a slot holding anything else;
///   `out_of_order` a slot seen going back to an older write (a late
///   duplicate or an overtaken write).
/// - rdma-read: `checked`/`wrong` are reads whose bytes were/were not the
///   target's pattern.
/// - immediate: `checked` is a source whose final word at a target is its
///   last immediate; `wrong` a word that is not, or an immediate seen
///   before the data posted ahead of it; `out_of_order` a word seen going
///   back.
/// - close: `completed` is close messages that arrived; `wrong` one whose
///   session is not the closed endpoint's.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct OpCounts {
    /// Posted (for closes: endpoints destroyed with a close message).
    pub posted: u64,
    /// Completed at the initiator (RDMA), or arrived (closes).
    pub completed: u64,
    /// Reported failed to the initiator.
    pub failed: u64,
    /// Posted, neither completed nor failed.
    pub lost: u64,
    /// Checks passed.
    pub checked: u64,
    /// Checks failed.
    pub wrong: u64,
    /// Arrivals of something that had already arrived.
    pub duplicated: u64,
    /// Arrivals behind a later one from the same source.
    pub out_of_order: u64,
}

impl OpCounts {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &OpCounts) {
        self.posted += o.posted;
        self.completed += o.completed;
        self.failed += o.failed;
        self.checked += o.checked;
        self.wrong += o.wrong;
        self.duplicated += o.duplicated;
        self.out_of_order += o.out_of_order;
    }

    /// Sets `lost` from the rest.
    pub fn settle(&mut self) {
        self.lost = self.posted.saturating_sub(self.completed + self.failed);
    }

    /// Nothing lost, repeated, reordered or wrong.
    pub fn clean(&self) -> bool {
        self.lost == 0 && self.wrong == 0 && self.duplicated == 0 && self.out_of_order == 0
    }
}

/// A node's counts. Sends keep the report's first fields: posted = sent,
/// completed = delivered, failed = returned.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Numbered messages.
    pub send: OpCounts,
    /// RDMA writes.
    pub rdma_write: OpCounts,
    /// RDMA reads.
    pub rdma_read: OpCounts,
    /// Write-immediates.
    pub immediate: OpCounts,
    /// Close messages.
    pub close: OpCounts,
    /// UNREACHABLE events.
    pub unreachable: u64,
}

impl Counts {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &Counts) {
        self.send.add(&o.send);
        self.rdma_write.add(&o.rdma_write);
        self.rdma_read.add(&o.rdma_read);
        self.immediate.add(&o.immediate);
        self.close.add(&o.close);
        self.unreachable += o.unreachable;
    }
}

/// Progress the nodes share with the watcher.
pub struct Tally {
    /// Operations posted, every kind.
    pub posted: AtomicU64,
    /// Operations settled: delivered or returned, completed or failed,
    /// arrived.
    pub settled: AtomicU64,
    /// Nodes that posted their whole share.
    pub finished: AtomicU64,
    /// UNREACHABLE events the nodes took.
    pub unreachable: AtomicU64,
    /// Milliseconds from `start` to the last progress.
    pub last_progress_ms: AtomicU64,
    /// When the nodes started.
    pub start: Instant,
}

impl Tally {
    /// A tally starting now.
    pub fn new() -> Tally {
        Tally {
            posted: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            unreachable: AtomicU64::new(0),
            last_progress_ms: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    /// One more operation posted.
    pub fn posted(&self) {
        self.posted.fetch_add(1, Ordering::Relaxed);
    }

    /// One more settled, and progress now.
    pub fn settled(&self) {
        self.settled.fetch_add(1, Ordering::Relaxed);
        self.progress();
    }

    /// Progress now.
    pub fn progress(&self) {
        self.last_progress_ms
            .fetch_max(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// What each writer posted to each target, and whether any failed: the
/// target's final check needs both.
pub struct Ledger {
    nodes: usize,
    writes: Vec<AtomicU64>,
    write_failures: Vec<AtomicU64>,
    immediates: Vec<AtomicU64>,
    immediate_failures: Vec<AtomicU64>,
}

fn zeros(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl Ledger {
    /// For `nodes` nodes.
    pub fn new(nodes: u32) -> Ledger {
        let n = nodes as usize;
        Ledger {
            nodes: n,
            writes: zeros(n * n),
            write_failures: zeros(n * n),
            immediates: zeros(n * n),
            immediate_failures: zeros(n * n),
        }
    }

    fn at(&self, src: u32, dst: u32) -> usize {
        src as usize * self.nodes + dst as usize
    }

    /// `src` posted write number `seq` to `dst` (they go in order).
    pub fn wrote(&self, src: u32, dst: u32, seq: u64) {
        self.writes[self.at(src, dst)].store(seq + 1, Ordering::Release);
    }

    /// One of `src`'s writes to `dst` failed.
    pub fn write_failed(&self, src: u32, dst: u32) {
        self.write_failures[self.at(src, dst)].fetch_add(1, Ordering::Relaxed);
    }

    /// `src` posted immediate number `j` to `dst`.
    pub fn immediate(&self, src: u32, dst: u32, j: u64) {
        self.immediates[self.at(src, dst)].store(j + 1, Ordering::Release);
    }

    /// One of `src`'s immediates to `dst` failed.
    pub fn immediate_failed(&self, src: u32, dst: u32) {
        self.immediate_failures[self.at(src, dst)].fetch_add(1, Ordering::Relaxed);
    }

    /// Writes `src` posted to `dst`, and whether all completed well.
    pub fn writes(&self, src: u32, dst: u32) -> (u64, bool) {
        let i = self.at(src, dst);
        (
            self.writes[i].load(Ordering::Acquire),
            self.write_failures[i].load(Ordering::Relaxed) == 0,
        )
    }

    /// Immediates `src` posted to `dst`, and whether all completed well.
    pub fn immediates(&self, src: u32, dst: u32) -> (u64, bool) {
        let i = self.at(src, dst);
        (
            self.immediates[i].load(Ordering::Acquire),
            self.immediate_failures[i].load(Ordering::Relaxed) == 0,
        )
    }
}
