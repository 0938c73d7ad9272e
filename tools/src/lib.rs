//! The `ulnic` command: everything a user runs, on top of the NIC model
//! (`ulnic-device`), the library (`ulnic`) and the image builder
//! (`ulnic-images`). The binary (`main.rs`) parses the command line and
//! calls the command's module.
//!
//! Modules, bottom-up (each uses only those above it):
//!
//! - `print`: what printers share (`outln!`, JSON lines, human units);
//! - `raw_driver`: raw calls on the Linux driver's device file;
//! - `control`: a running device's control socket (stats, faults, map,
//!   capture), server and client;
//! - `capture`: a link's packets into a pcap file;
//! - `fabric`: topology files (`file`), fabrics spread over machines
//!   (`launch`), the transport's self-test (`selftest`);
//! - `bench`: the benchmarks: `pingpong` (with the peer processes),
//!   `rdma`, `utlb`, `compare`, `apps`, `fabric`, and their `record` and
//!   `payload` rules;
//! - `cluster`: QEMU clusters: one-shot runs (`mod`), the persistent
//!   cluster's `supervisor`, its `client`, the in-guest `agent` and their
//!   typed `protocol`;
//! - `transfer`: `ulnic send` / `recv`;
//! - `selftest`, `driver_fuzz`, `driver_check`: the NIC and the Linux
//!   driver checked from inside a guest;
//! - `commands`: one module per command: its options, its `run` and what
//!   it prints;
//! - `cli`: the command line, `Cli` and `Cmd`.

pub mod cli;
pub mod commands;

mod bench;
mod capture;
mod cluster;
mod control;
mod driver_check;
mod driver_fuzz;
mod fabric;
mod print;
mod raw_driver;
mod selftest;
mod transfer;
