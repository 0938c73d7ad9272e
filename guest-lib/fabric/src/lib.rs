//! The libfabric provider `ulnic` (docs/libfabric.md): a shared object
//! Debian's libfabric 1.17 loads from `FI_PROVIDER_PATH` as
//! `libulnic-fi.so`, offering reliable-datagram and connected endpoints
//! (FI_EP_RDM, FI_EP_MSG) with FI_MSG and FI_TAGGED over ulnic endpoints.

mod av;
mod cntr;
mod cq;
mod domain;
mod engine;
mod ep;
mod eq;
mod fi;
mod mr;
mod nic;
mod pep;
mod progress;
mod provider;
mod unoffered;
mod wait;
mod wire;

pub use provider::fi_prov_ini;
