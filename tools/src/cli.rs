//! The command line: `Cli` and its commands (`Cmd`), each variant the
//! options of a module of `commands`. The variants' doc comments are the
//! commands' help.

use clap::{Parser, Subcommand};

use crate::commands::bench::BenchArgs;
use crate::commands::capture::CaptureArgs;
use crate::commands::cluster::ClusterCmd;
use crate::commands::device::DeviceArgs;
use crate::commands::driver::{DriverCheckArgs, DriverFuzzArgs};
use crate::commands::fabric::FabricCmd;
use crate::commands::image::ImageCmd;
use crate::commands::peers::AgentArgs;
use crate::commands::stats::StatsArgs;

/// ulnic: an emulated user-level network interface (U-Net / CLAN / VMMC
/// style) served to QEMU guests and host processes over vhost-user.
#[derive(Parser, Debug)]
#[command(name = "ulnic", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

/// `ulnic`'s commands.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run the device: one vhost-user socket per node, each node attached
    /// to one switch fabric.
    ///
    /// Examples:
    ///   ulnic device --socket-dir /tmp/ulnic --nodes 2
    ///   ULNIC_SOCKET=/tmp/ulnic/node0.sock my-app     # host attach
    ///   qemu-system-x86_64 ... -chardev socket,id=u0,path=/tmp/ulnic/node0.sock
    ///       -device vhost-user-test-device-pci,chardev=u0,virtio-id=21,num_vqs=64,config_size=64,page-per-vq=on
    #[command(verbatim_doc_comment)]
    Device(DeviceArgs),
    /// Measure ping-pong latency or stream bandwidth between two processes,
    /// over ulnic and over baselines in the same run.
    ///
    /// Examples:
    ///   ulnic bench pingpong --size 8 --json
    ///   ulnic bench stream --size 65536 --transport ulnic,shm,tcp
    ///   ulnic bench pingpong --mode block --transport ulnic,unix
    ///   ulnic bench rdma-write --size 65536 --json   # ulnic and memcpy lines
    ///   ulnic bench tripwire                         # remote write -> blocked owner runs
    ///   ulnic bench dmq --json                       # distributed message queue
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
    /// Check the NIC end to end from this machine: inside a guest through
    /// /dev/ulnic0, or host-attached through ULNIC_SOCKET.
    Selftest,
    /// Attack the Linux driver from this process (inside a guest): every
    /// ioctl of the device with random and boundary arguments, random maps
    /// and partial unmaps, scribbled rings, doorbells rung with any value.
    /// Fails if the kernel log then shows an Oops, BUG or WARNING. Follow
    /// it with `ulnic selftest` to show the node still works.
    ///
    /// Examples:
    ///   ulnic driver-fuzz --seed 7 --operations 5000
    ///   ulnic driver-fuzz --device /dev/ulnic0 --json
    #[command(verbatim_doc_comment)]
    DriverFuzz(DriverFuzzArgs),
    /// Check the Linux driver in a situation set up from the host while
    /// the check waits: `stalled-device` (run it, wait for the file given
    /// by --ready, stall the node's control queue, create the --go file;
    /// the check expects a command to time out without holding up
    /// doorbells or data, and EIO after) or `device-removal` (run it, wait
    /// for --ready, restart the device; the check expects ENODEV and
    /// harmless stores to its old doorbell page). Fails on a kernel fault.
    ///
    /// Example (from the host, with a cluster named ci):
    ///   ulnic cluster exec 0 --name ci -- ulnic driver-check stalled-device &
    ///   ulnic cluster exec 0 --name ci -- 'until test -e /tmp/ulnic-check.ready; do sleep 0.1; done'
    ///   ulnic cluster stall-control 0 on --name ci
    ///   ulnic cluster exec 0 --name ci -- touch /tmp/ulnic-check.go
    #[command(verbatim_doc_comment)]
    DriverCheck(DriverCheckArgs),
    /// Send a counted, checked stream of messages to `ulnic recv` (like
    /// nc). Returned messages are resent in order (go-back-N).
    ///
    /// Examples:
    ///   ulnic send --to 1:5 --count 100000 --size 64
    ///   ulnic send --to 1:5 --size 8192 --json
    #[command(verbatim_doc_comment)]
    Send(crate::transfer::SendArgs),
    /// Receive a stream from `ulnic send`, checking every message arrives
    /// once, in order, intact; exits when the sender finishes.
    ///
    /// Examples:
    ///   ulnic recv --port 5
    ///   ulnic recv --port 5 --close-to 0:6   # tell 0:6 if this process dies
    #[command(verbatim_doc_comment)]
    Recv(crate::transfer::RecvArgs),
    /// Clusters of QEMU guests joined by one ulnic device.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Guest images and the QEMU that runs them.
    #[command(subcommand)]
    Image(ImageCmd),
    /// The fabric: topology files and the routes through them.
    #[command(subcommand)]
    Fabric(FabricCmd),
    /// Read a running device's counters (through its control socket,
    /// DIR/control.sock): per node and endpoint, and with a fabric per
    /// link (each direction), per switch and the transport's per node.
    ///
    /// Examples:
    ///   ulnic stats --device /tmp/ulnic
    ///   ulnic stats --device /tmp/ulnic --watch 1
    ///   ulnic stats --device /tmp/ulnic --json
    #[command(verbatim_doc_comment)]
    Stats(StatsArgs),
    /// Write the packets of a running device's link into a pcap file for
    /// Wireshark (dissector: tools/wireshark/ulnic.lua). The device needs
    /// a fabric (`ulnic device --topology`).
    ///
    /// Examples:
    ///   ulnic capture --device /tmp/ulnic --node 1 -o node1.pcap --count 1000
    ///   ulnic capture --device /tmp/ulnic --link 0 -o trunk.pcap --seconds 5
    ///   wireshark -X lua_script:tools/wireshark/ulnic.lua node1.pcap
    #[command(verbatim_doc_comment)]
    Capture(CaptureArgs),
    /// One side of a benchmark (started by `ulnic bench`).
    #[command(hide = true)]
    BenchPeer(crate::bench::PeerArgs),
    /// One guest's side of `cluster bench apps`.
    #[command(hide = true)]
    AppsPeer(crate::bench::apps::PeerArgs),
    /// The guest agent: serves `ulnic cluster exec/put` inside a guest
    /// (started by the guest's init).
    #[command(hide = true)]
    Agent(AgentArgs),
}

impl Cmd {
    /// Whether the command narrates what it does in the log (the device
    /// and the cluster supervisor, at info); the others log warnings only
    /// and print just their results.
    pub fn narrates(&self) -> bool {
        matches!(
            self,
            Cmd::Device(_) | Cmd::Cluster(ClusterCmd::Supervise(_))
        )
    }

    /// Whether the command only prints tables, so that it may end quietly
    /// when its reader goes (`ulnic stats | head`), as other Unix tools
    /// do. Not the rest: a device or launcher must outlive a client that
    /// hangs up.
    pub fn only_prints(&self) -> bool {
        matches!(
            self,
            Cmd::Stats(_) | Cmd::Fabric(FabricCmd::Routes { .. } | FabricCmd::Map { .. })
        )
    }
}

/// Parses `ulnic ARGS`, for the commands' tests.
#[cfg(test)]
pub fn try_parse(args: &[&str]) -> Result<Cmd, clap::Error> {
    Cli::try_parse_from(std::iter::once("ulnic").chain(args.iter().copied())).map(|c| c.command)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_command_is_required() {
        let e = try_parse(&[]).unwrap_err();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        let e = try_parse(&["frobnicate"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidSubcommand);
        let e = try_parse(&["--version"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
    }

    #[test]
    fn peers_are_hidden_from_the_help() {
        let help = Cli::command().render_help().to_string();
        for shown in ["device", "bench", "selftest", "driver-fuzz", "driver-check"] {
            assert!(help.contains(&format!("\n  {shown} ")), "{help}");
        }
        for shown in [
            "send", "recv", "cluster", "image", "fabric", "stats", "capture",
        ] {
            assert!(help.contains(&format!("\n  {shown} ")), "{help}");
        }
        for hidden in ["bench-peer", "apps-peer", "agent"] {
            assert!(!help.contains(hidden), "{help}");
        }
    }

    #[test]
    fn who_narrates() {
        let narrates = |args: &[&str]| try_parse(args).unwrap().narrates();
        assert!(narrates(&["device", "--socket-dir", "/tmp/u"]));
        assert!(narrates(&[
            "cluster",
            "supervise",
            "--dir",
            "/tmp/c",
            "--nodes",
            "2",
            "--accel",
            "tcg",
            "--memory",
            "512",
            "--endpoints",
            "8",
        ]));
        assert!(!narrates(&["bench", "pingpong"]));
        assert!(!narrates(&["cluster", "status"]));
        assert!(!narrates(&["fabric", "up", "--dir", "/tmp/f"]));
    }

    #[test]
    fn who_only_prints() {
        let prints = |args: &[&str]| try_parse(args).unwrap().only_prints();
        assert!(prints(&["stats", "--device", "/tmp/u"]));
        assert!(prints(&["fabric", "routes", "--topology", "t.toml"]));
        assert!(prints(&["fabric", "map", "--device", "/tmp/u"]));
        assert!(!prints(&["fabric", "up", "--dir", "/tmp/f"]));
        assert!(!prints(&["device", "--socket-dir", "/tmp/u"]));
        assert!(!prints(&["bench", "pingpong"]));
    }
}
