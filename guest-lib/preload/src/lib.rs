//! `libulnic_preload.so`: runs unmodified programs' TCP and UDP sockets
//! over ulnic (docs/sockets.md), by interposing the C library's socket
//! calls with `LD_PRELOAD`:
//!
//! ```sh
//! ULNIC_INET=10.81.0.0/24 LD_PRELOAD=libulnic_preload.so redis-server
//! ULNIC_INET=10.81.0.0/24 LD_PRELOAD=libulnic_preload.so redis-benchmark -h 10.81.0.2
//! ```
//!
//! `ULNIC_INET` names the network whose addresses are ulnic nodes (node
//! `n` is the network address plus `n + 1`). A connection to one of them
//! goes over ulnic; a listener or UDP socket bound to any address (or to
//! this node's) takes ulnic peers and kernel peers alike. Everything else
//! — other addresses, other kinds of sockets, files, pipes — and
//! everything when no NIC can be opened goes to the kernel untouched.
//!
//! Inside: `real` (the C library's functions behind the interposed
//! ones), `config` (addresses), `share` (counts across fork), `env` (the
//! process's socket context), `sock` (one socket and its calls), `table`
//! (which descriptors are sockets), `epoll` and `poll` (waiting on
//! sockets and kernel descriptors together), `context` (the state and
//! what the calls share), `calls` (the interposed functions).

mod calls;
mod config;
mod context;
mod env;
mod epoll;
mod poll;
mod real;
mod share;
mod sock;
mod table;
