//! What the workspace's tests share: a device in the test's process whose
//! sockets' directory outlives it ([`TestDevice`]), waits on facts with a
//! deadline that fail with what they last saw ([`wait_until`],
//! [`eventually`], [`wait_for_path`], [`until_blocked`]), child processes
//! killed when dropped whose output is always drained ([`TestChild`]),
//! endpoint helpers, and raw vhost-user and control-command access.
//!
//! A dev-dependency of the device's own integration tests (Cargo accepts
//! that circle for tests), of the tools' and of the C API's and the
//! preload layer's.

pub mod device;
pub mod endpoints;
pub mod process;
pub mod raw;
pub mod wait;

pub use device::{
    device, device_polling_for, device_with, endpoint_on, socket, stat, two_nodes, wait_bound,
    TestDevice,
};
pub use endpoints::{attach_again, exchange, next_event, next_message, small_endpoints};
pub use process::{c_program, c_program_with, TestChild};
pub use raw::frontend;
pub use wait::{
    eventually, readable, thread_id, until_blocked, wait_for, wait_for_path, wait_until,
};
