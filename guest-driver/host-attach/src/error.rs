//! The host-attach driver's errors.

use std::time::Duration;

use ulnic_abi::status;

/// How long a control command may take before the driver gives up.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the host-attach driver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting or talking vhost-user failed.
    #[error("vhost-user {step} failed: {source}")]
    Protocol {
        /// Which step.
        step: &'static str,
        /// Why.
        source: vhost::Error,
    },
    /// The device lacks something this driver needs.
    #[error("device incompatible: {0}")]
    Incompatible(String),
    /// An OS call failed.
    #[error("{what}: {source}")]
    Os {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The shared memory is exhausted.
    #[error("out of shared memory: {0} bytes requested; raise ULNIC_MEMORY")]
    OutOfMemory(usize),
    /// A command failed with a device status.
    #[error("command {opcode:#x} failed: {} (status {status})", status::name(*status))]
    Command {
        /// Opcode.
        opcode: u32,
        /// `ulnic_abi::status` code.
        status: u32,
    },
    /// The device did not answer in time.
    #[error("device did not answer command {0:#x} within {COMMAND_TIMEOUT:?}; this attachment runs no more commands (attach again)")]
    Timeout(u32),
    /// An earlier command timed out, so no command is sent any more: the
    /// device may still answer the old one late, and that answer must not
    /// be read as this one's (spec §4). Data and doorbells go on.
    #[error("command {0:#x} not sent: an earlier command timed out and this attachment runs no more commands (attach again)")]
    ControlQueueDead(u32),
    /// The device answered with a malformed response.
    #[error("malformed response to command {0:#x}")]
    BadResponse(u32),
    /// A forked child called: the attachment's queues are its parent's
    /// (copied memory the parent keeps using), so a command or a look at
    /// the notification queue from the child would corrupt them.
    #[error("command {0:#x} not sent: this attachment belongs to process {1} (a forked child cannot use its parent's attachment; attach on its own node)")]
    ForkedChild(u32, u32),
    /// The node closed the connection at once: another frontend (a VM or
    /// a process) is attached to it, and a node serves one at a time.
    #[error("node {0} is in use by another frontend (one VM or process per node)")]
    NodeBusy(std::path::PathBuf),
}
