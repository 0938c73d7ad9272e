//! The supervisor's control protocol, typed: a client writes one JSON
//! [`Request`] line on the control socket, then reads frames (`agent`'s
//! framing) back; a status request is answered with a [`ClusterStatus`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One request to the supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// The cluster's [`ClusterStatus`].
    Status,
    /// Run a shell command on a node; its output and exit status follow.
    /// Detached, it becomes a [`JobStatus`]: the answer is an INFO with the
    /// job, then EXIT 0, and the command keeps running, its output going
    /// to the job's log on the host.
    Exec {
        /// The node.
        node: u32,
        /// A shell command line.
        command: String,
        /// Run it as a background job.
        #[serde(default)]
        detach: bool,
    },
    /// Send a signal to a background job's process group.
    Signal {
        /// The job.
        job: u32,
        /// The signal number.
        signal: i32,
    },
    /// Copy `len` bytes, sent after the request, to `path` on a node.
    Put {
        /// The node.
        node: u32,
        /// Where in the guest.
        path: String,
        /// File mode.
        mode: u32,
        /// Bytes that follow.
        len: u64,
    },
    /// Reset a node and wait until it is ready again.
    Reboot {
        /// The node.
        node: u32,
        /// Seconds to wait.
        timeout: u64,
    },
    /// Restart the device under the running guests.
    RestartDevice {
        /// Seconds to wait for every guest's driver.
        timeout: u64,
    },
    /// Stall a node's control queue, or serve it again.
    StallControl {
        /// The node.
        node: u32,
        /// Stalled or served.
        stalled: bool,
    },
    /// Pause a guest (QMP `stop`) or resume it (`cont`).
    Pause {
        /// The node.
        node: u32,
        /// Paused or resumed.
        paused: bool,
    },
    /// Stop every guest and the supervisor.
    Down,
}

impl Request {
    /// The node the request names, if any.
    pub fn node(&self) -> Option<u32> {
        match self {
            Request::Exec { node, .. }
            | Request::Put { node, .. }
            | Request::Reboot { node, .. }
            | Request::StallControl { node, .. }
            | Request::Pause { node, .. } => Some(*node),
            Request::Status
            | Request::Signal { .. }
            | Request::RestartDevice { .. }
            | Request::Down => None,
        }
    }
}

/// Where a guest is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Started or reset, not ready yet.
    Booting,
    /// Its agent answered: commands can run.
    Ready,
    /// QEMU exited.
    Stopped,
    /// Paused (`cluster pause`): its vCPUs and its NIC's rings stopped.
    Paused,
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeState::Booting => "booting",
            NodeState::Ready => "ready",
            NodeState::Stopped => "stopped",
            NodeState::Paused => "paused",
        })
    }
}

/// One guest in a [`ClusterStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node number.
    pub node: u32,
    /// Its state.
    pub state: NodeState,
    /// Seconds its last boot took, when ready.
    pub boot_seconds: Option<f64>,
    /// Boots so far, the first included (resets and reboots it did itself
    /// count).
    pub boots: u32,
    /// Why it stopped, when stopped.
    pub reason: Option<String>,
    /// Its console log.
    pub console_log: PathBuf,
}

/// Where a background job is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum JobState {
    /// Its command (or what still holds its output) runs.
    Running,
    /// It ended with this status (128 + signal when killed).
    Exited {
        /// The exit status.
        code: i32,
    },
    /// Its node stopped or rebooted, or the agent could not run it.
    Lost {
        /// Why.
        reason: String,
    },
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobState::Running => f.write_str("running"),
            JobState::Exited { code } => write!(f, "exited {code}"),
            JobState::Lost { reason } => write!(f, "lost ({reason})"),
        }
    }
}

/// A command started with `cluster exec --detach`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Job number (for `cluster kill`).
    pub job: u32,
    /// The node it runs on.
    pub node: u32,
    /// Its command line.
    pub command: String,
    /// Where it is.
    #[serde(flatten)]
    pub state: JobState,
    /// Seconds since it started.
    pub seconds: f64,
    /// Its standard output and error, on the host.
    pub log: PathBuf,
}

/// A persistent cluster's status (`ulnic cluster status --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The cluster's state directory.
    pub dir: PathBuf,
    /// kvm or tcg.
    pub accel: String,
    /// The supervisor's process id.
    pub pid: u32,
    /// The fabric the guests sit behind: its topology and faults.
    #[serde(default)]
    pub fabric: String,
    /// Every guest.
    pub nodes: Vec<NodeStatus>,
    /// Background jobs (`cluster exec --detach`), oldest first.
    #[serde(default)]
    pub jobs: Vec<JobStatus>,
}

/// The answer to [`Request::Reboot`], before its exit status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rebooted {
    /// Seconds until the guest was ready again.
    pub boot_seconds: f64,
}

/// The answer to [`Request::RestartDevice`], before its exit status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceRestarted {
    /// Seconds to stop the old device.
    pub stopped_seconds: f64,
    /// Seconds until every running guest's driver had the new NIC.
    pub reconnected_seconds: f64,
    /// The nodes whose NIC was plugged again.
    pub nodes: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_tagged_json_object() {
        let r = Request::StallControl {
            node: 1,
            stalled: true,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(line, r#"{"op":"stall-control","node":1,"stalled":true}"#);
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        assert_eq!(r.node(), Some(1));
        assert!(serde_json::from_str::<Request>(r#"{"op":"reboot"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"fly"}"#).is_err());
        // `detach` is optional: older clients send plain exec requests.
        let old = r#"{"op":"exec","node":0,"command":"true"}"#;
        assert_eq!(
            serde_json::from_str::<Request>(old).unwrap(),
            Request::Exec {
                node: 0,
                command: "true".into(),
                detach: false
            }
        );
    }

    #[test]
    fn job_states_flatten_into_the_job() {
        let j = JobStatus {
            job: 3,
            node: 1,
            command: "nginx".into(),
            state: JobState::Exited { code: 0 },
            seconds: 1.5,
            log: "/tmp/x.log".into(),
        };
        let v: serde_json::Value = serde_json::to_value(&j).unwrap();
        assert_eq!(v["state"], "exited");
        assert_eq!(v["code"], 0);
        assert_eq!(serde_json::from_value::<JobStatus>(v).unwrap(), j);
        assert_eq!(JobState::Exited { code: 137 }.to_string(), "exited 137");
    }
}
