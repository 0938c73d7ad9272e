//! The C API of the ulnic user-level library: `libulnic.so.0` and
//! `libulnic.a`, declared by `include/ulnic.h` (generated from this crate
//! by cbindgen; `tests/header.rs` checks it is current).
//!
//! The style of libibverbs and ef_vi: opaque handles made and freed by
//! pairs of calls, plain structs, and `int` results that are 0 (or a
//! count) on success and a negative `errno` on failure, with
//! [`ulnic_last_error`] saying more. No Rust type crosses the boundary.
//!
//! Threads: a `ulnic_nic` and a `ulnic_pd` may be used from any number of
//! threads at once. Everything made from them (an endpoint, a buffer, a
//! queue, a socket) is used by one thread at a time: calls on the same
//! handle must not overlap; calls on different handles may.
//!
//! Inside: `status` (results, errno, the last error), `nic` (NICs,
//! protection domains, user buffers), `endpoint` (rings, messages,
//! events, blocking), `evq` (event queues that blocking calls on
//! their sources share), `rdma` (apertures, RDMA, tripwires, redirection),
//! `pio` (PIO windows: another node's memory written with stores),
//! `dmq` (message queues over RDMA), `am` (Active Messages),
//! `sock` (sockets over endpoints).

// Every exported function takes pointers from C: each checks them for
// NULL and documents what else it relies on in the header.
#![allow(clippy::missing_safety_doc)]
#![allow(non_camel_case_types)]

mod am;
mod dmq;
mod endpoint;
mod evq;
mod nic;
mod pio;
mod rdma;
mod sock;
mod status;

pub use am::*;
pub use dmq::*;
pub use endpoint::*;
pub use evq::*;
pub use nic::*;
pub use pio::*;
pub use rdma::*;
pub use sock::*;
pub use status::*;
