//! `ulnic`: the user-level library of the ulnic emulated user-level NIC.
//!
//! Explicit resources in the style of ef_vi and libibverbs: open a [`Nic`],
//! allocate a [`ProtectionDomain`], create an [`Endpoint`] with send, receive,
//! free and event rings in memory shared with the device, then post and poll
//! entirely in user space. Nothing runs behind your back: no threads, no
//! hidden copies; blocking ([`Endpoint::wait`]) is opt-in.
//!
//! ```no_run
//! use ulnic::{Address, EndpointConfig, Nic};
//! # fn main() -> Result<(), ulnic::Error> {
//! let nic = Nic::open()?; // ULNIC_SOCKET names the device node's socket
//! let pd = nic.alloc_pd()?;
//! let mut ep = pd.create_endpoint(&EndpointConfig::default())?;
//! ep.bind(7)?;
//! ep.post_send_inline(Address { node: 1, port: 7 }, 0, b"hello", 1)?;
//! loop {
//!     if let Some(m) = ep.poll_recv() {
//!         println!("{} bytes from {:?}", m.len, m.src);
//!         break;
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Inside: `nic` (opening a NIC, protection domains), `endpoint` (rings,
//! send and receive, events and blocking; `endpoint/rdma` remote memory,
//! `endpoint/zero_copy` transfers from user buffers), `dmq` (message
//! queues over RDMA), `am` (Active Messages, VN's AM-II, over an
//! endpoint), `utlb` (user buffers and their translations),
//! `staging` (an endpoint's zero-copy bookkeeping), `types` and `error`
//! (what applications see), `env` (where the device is found), and the
//! two drivers behind one trait: `backend` (the trait), `kernel`
//! (/dev/ulnicN) and `host` (the host-attach driver).

pub mod am;
mod backend;
mod dmq;
mod endpoint;
mod env;
mod error;
mod event_queue;
mod host;
mod kernel;
mod nic;
mod pio_dmq;
mod reporting;
pub mod sock;
mod staging;
mod types;
mod utlb;
mod wakes;
mod watcher;

pub use dmq::{DmqKind, DmqReceiver, DmqSender};
pub use endpoint::pio::{pio_flush, PioGrant, PioImport, PioWindow};
pub use endpoint::{Endpoint, Waiter, LINGER};
pub use env::{DEFAULT_DEVICE, DEVICE_ENV, MEMORY_ENV, SOCKET_ENV};
pub use error::Error;
pub use event_queue::EventQueue;
pub use nic::{Nic, ProtectionDomain};
pub use pio_dmq::{PioDmqReceiver, PioDmqSender};
pub use types::{
    Address, EndpointConfig, Event, Immediate, Payload, Permissions, Received, RedirectOutcome,
    SendError, TripwireOn,
};
pub use ulnic_abi::{Cookie, EventRecord, FilterEntry, ANY, INLINE_MAX};
pub use utlb::{Registration, Translation, UserBuffer, UtlbConfig, UtlbStats};
pub use watcher::Watcher;
