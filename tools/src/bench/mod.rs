//! `ulnic bench`: the benchmarks. `link` (the message link and the
//! shared-memory ring), `pingpong` (ping-pong and stream over
//! ulnic and the baselines, and the peer processes), `rdma` (RDMA, the
//! tripwire wake-up, the message queues), `utlb` (UTLB hits, misses and
//! stress); `record` is the result line, `payload` how payloads are
//! touched; `apps` unmodified programs over the LD_PRELOAD layer;
//! `compare` ulnic against the baselines and Debian's peers, round by
//! round; `fabric` the emulated fabric's benchmarks (`ulnic fabric
//! bench`), on a device with a fabric started in this process; `am`
//! Virtual Networks' Active Message figures over `ulnic::am`, and `plot`
//! their SVG drawings.

pub mod am;
pub mod apps;
pub mod compare;
pub mod fabric;
pub mod link;
pub mod nodes;
pub mod payload;
pub mod pingpong;
pub mod pio;
pub mod pio_rounds;
pub mod plot;
pub mod rdma;
pub mod record;
pub mod servers;
pub mod utlb;

pub use link::Mode;
pub use pingpong::{peer, run_one, PeerArgs, Spec, Transport, Workload};
pub use record::Record;
