//! The ulnic device ABI: every constant and wire layout of `docs/spec.md`,
//! defined once and shared by the device, the host-attach driver, the library
//! and (through the generated C header) the Linux driver.
//!
//! All multi-byte fields are little endian. Structures are encoded and decoded
//! explicitly (no transmutes), so a hostile guest can only ever produce a
//! well-formed value of the Rust type, which the device then validates.
//!
//! The modules, bottom up: `wire` (every layout, `#[repr(C)]`),
//! `constants` (numbers and code namespaces), `desc` (decoded values),
//! `uapi` (the Linux driver's ioctls) and `header` (the generated C header).

#![forbid(unsafe_code)]

pub mod constants;
pub mod desc;
pub mod header;
pub mod uapi;
pub mod wire;

pub use constants::*;
pub use desc::*;
pub use header::{c_header, c_structs};
