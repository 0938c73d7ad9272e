//! The commands: one module per command of `ulnic`, each with its clap
//! options, its `run` (called by the binary's `main`) and what it prints
//! (a table by default, one JSON object per line with `--json`). The work
//! itself is done by the crate's other modules.
//!
//! - `device`: `ulnic device` (and the UTLB cache options `bench` shares);
//! - `bench`: `ulnic bench` and the benchmark result tables `cluster`
//!   prints too;
//! - `cluster`: `ulnic cluster ...`, the persistent cluster and the
//!   one-shot `run` and `bench`;
//! - `fabric`: `ulnic fabric ...`, with `fabric::bench`;
//! - `image`: `ulnic image build`;
//! - `stats`, `capture`: a running device's counters and packets;
//! - `transfer`: `ulnic send` and `ulnic recv`;
//! - `selftest`, `driver`: `ulnic selftest`, `driver-fuzz`, `driver-check`;
//! - `peers`: the hidden `bench-peer`, `apps-peer` and `agent`.

pub mod bench;
pub mod capture;
pub mod cluster;
pub mod device;
pub mod driver;
pub mod fabric;
pub mod image;
pub mod peers;
pub mod selftest;
pub mod stats;
pub mod transfer;

/// A command's own exit status, neither success (0) nor a failure (1):
/// `fabric map`'s 3 when the map differs from the topology file, and
/// `cluster exec`'s remote status. Returned as the command's error; the
/// binary exits with it, printing nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus(pub u8);

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for ExitStatus {}
