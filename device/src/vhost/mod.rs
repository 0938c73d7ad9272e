//! Each node's vhost-user face: the backend QEMU or the host-attach driver
//! talks to, the control commands it carries, and the node's socket.

pub mod backend;
pub mod control;
pub mod reader;
pub mod socket;
