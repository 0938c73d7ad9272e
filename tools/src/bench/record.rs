//! One benchmark result line, as every `ulnic bench` workload prints it.

use serde::Serialize;

/// One result line.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Record {
    /// "pingpong" or "stream".
    pub bench: String,
    /// Transport name.
    pub transport: String,
    /// Message size.
    pub size: u32,
    /// Iterations measured.
    pub iters: u64,
    /// The receive mode that actually ran.
    pub mode: String,
    /// Ping-pong: median round-trip time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_ns: Option<u64>,
    /// Ping-pong: 95th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p95_ns: Option<u64>,
    /// Ping-pong: 99th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ns: Option<u64>,
    /// Ping-pong: minimum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_ns: Option<u64>,
    /// Ping-pong: maximum.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_ns: Option<u64>,
    /// Time measured, in seconds (for latency lines, the sum of the
    /// samples).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub seconds: Option<f64>,
    /// How payloads were touched: "write+verify" (the sender writes every
    /// byte of every message, the receiver checks every byte, and a wrong
    /// byte fails the run) or "lines" (one byte per 64-byte line written
    /// and read: touching every byte would measure the loop).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload: Option<String>,
    /// Stream: payload megabytes (10^6) per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mbytes_per_s: Option<f64>,
    /// Stream: messages per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msgs_per_s: Option<f64>,
    /// ulnic: doorbells the client's endpoint rang per measured operation
    /// (round trip or message): 0 when the device polled its send ring,
    /// 1 when every send rang (an MMIO write, an exit, in a guest).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub doorbells_per_op: Option<f64>,
    /// UTLB: pages per buffer.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub pages: Option<u32>,
    /// Ping-pong and stream over ulnic: distinct payload buffers each
    /// side cycles through (1, or one per message in flight: see
    /// `--payload`). UTLB stress: distinct one-page buffers swept.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub buffers: Option<u32>,
    /// UTLB stress: entries in the domain's table.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub table_entries: Option<u32>,
    /// UTLB: share of the library's lookups that hit.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hit_ratio: Option<f64>,
    /// UTLB: misses the driver serviced.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub misses_serviced: Option<u64>,
    /// UTLB: bytes copied through the bounce buffer.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fallback_bytes: Option<u64>,
}

impl Record {
    /// Sets `iters` and the latency fields (median, p95, p99, minimum)
    /// from per-operation samples in nanoseconds, sorting them.
    pub(crate) fn set_latencies(&mut self, samples: &mut [u64]) {
        samples.sort_unstable();
        self.iters = samples.len() as u64;
        self.median_ns = Some(percentile(samples, 0.5));
        self.p95_ns = Some(percentile(samples, 0.95));
        self.p99_ns = Some(percentile(samples, 0.99));
        self.min_ns = samples.first().copied();
        self.max_ns = samples.last().copied();
        if self.seconds.is_none() {
            self.seconds = Some(samples.iter().sum::<u64>() as f64 / 1e9);
        }
    }
}

/// The `p` quantile (0 to 1) of sorted samples.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
