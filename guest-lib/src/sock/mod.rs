//! Sockets over endpoints (docs/sockets.md): byte streams with credit
//! flow control and orderly or abortive ends, and datagrams, one endpoint
//! per socket, addressed by (node, port) like TCP and UDP.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use ulnic::sock::{Listener, Net, SockAddr, Stream};
//! let net = Net::open()?;
//! if net.node() == 0 {
//!     let mut l = Listener::bind(&net, 7, 16)?;
//!     let (mut s, _) = l.accept()?;
//!     let mut buf = [0u8; 5];
//!     s.read_exact(&mut buf)?;
//!     s.write_all(&buf)?;
//! } else {
//!     let mut s = Stream::connect(&net, SockAddr { node: 0, port: 7 })?;
//!     s.write_all(b"hello")?;
//! }
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Inside: `addr` (addresses, readiness, settings, port ranges), `wire`
//! (the protocol's messages), `held` (received messages a socket keeps),
//! `net` (a process's sockets: domain, sizes, ports), `stream`,
//! `listener`, `datagram`; `wait` the poll-then-sleep loop they share.

mod addr;
mod datagram;
mod flusher;
mod held;
mod listener;
mod net;
mod shared_requests;
mod stream;
mod wait;
mod wire;

pub use crate::wakes::{count_wake, wake_report, wake_stats, WakeKind, WakeStats, UNFED_LOOK};
pub use addr::{
    visible_port, ConnState, Ready, SockAddr, SockConfig, Wakes, CONN_BASE, CONN_PORTS, DGRAM_BASE,
    EPHEMERAL_FIRST, LISTEN_BASE,
};
pub use datagram::{Datagram, MAX_DATAGRAM};
pub use listener::Listener;
pub use net::Net;
pub use stream::handle::Stream;
pub use stream::Shutdown;
pub use wait::count_clock;
pub use wire::PROTOCOL_VERSION;
