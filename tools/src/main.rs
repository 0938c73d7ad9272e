//! The `ulnic` command: everything a user runs, on top of the NIC model
//! (`ulnic-device`), the library and the image builder.
//!
//! Here: the command line (clap) and what each command prints. Modules:
//! `bench` (the benchmarks: `pingpong` with its peer processes, `rdma`,
//! `utlb`, and their `record` and `payload` rules), `cluster` (QEMU
//! clusters: one-shot runs in `mod`, the persistent cluster's
//! `supervisor`, its `client`, the in-guest `agent` and their typed
//! `protocol`), `transfer` (`ulnic send` / `recv`), `selftest`, and the
//! driver checks (`driver_fuzz`, `driver_check`, over `raw_driver`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ulnic_device::{Configuration, Device};

use crate::bench::{Mode, PeerArgs, Spec, Transport, Workload};
use crate::cluster::client;
use crate::cluster::supervisor::state_dir;

mod bench;
mod capture;
mod cluster;
mod control;
mod driver_check;
mod driver_fuzz;
mod fabric;
mod raw_driver;
mod selftest;
mod transfer;

/// ulnic: an emulated user-level network interface (U-Net / CLAN / VMMC
/// style) served to QEMU guests and host processes over vhost-user.
#[derive(Parser, Debug)]
#[command(name = "ulnic", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
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
    DriverFuzz {
        /// The device file.
        #[arg(long, default_value = "/dev/ulnic0")]
        device: String,
        /// Seed of the operation sequence (the same seed, the same calls).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How many operations.
        #[arg(long, default_value_t = 3000)]
        operations: u64,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
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
    DriverCheck {
        /// The situation.
        #[arg(value_enum)]
        check: crate::driver_check::Check,
        /// The device file.
        #[arg(long, default_value = "/dev/ulnic0")]
        device: PathBuf,
        /// Created once the check is set up.
        #[arg(long, default_value = "/tmp/ulnic-check.ready")]
        ready: PathBuf,
        /// Waited for before a stalled-device check goes on.
        #[arg(long, default_value = "/tmp/ulnic-check.go")]
        go: PathBuf,
        /// Seconds to wait for the situation.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
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
    Stats {
        /// The device's socket directory (as given to `ulnic device --socket-dir`).
        #[arg(long, value_name = "DIR")]
        device: PathBuf,
        /// With a fabric spread over devices: which member's counters.
        #[arg(long, value_name = "NAME")]
        member: Option<String>,
        /// Print again every SECS seconds, until interrupted.
        #[arg(long, value_name = "SECS")]
        watch: Option<f64>,
        /// One JSON object (per print).
        #[arg(long)]
        json: bool,
    },
    /// Write the packets of a running device's link into a pcap file for
    /// Wireshark (dissector: tools/wireshark/ulnic.lua). The device needs
    /// a fabric (`ulnic device --topology`).
    ///
    /// Examples:
    ///   ulnic capture --device /tmp/ulnic --node 1 -o node1.pcap --count 1000
    ///   ulnic capture --device /tmp/ulnic --link 0 -o trunk.pcap --seconds 5
    ///   wireshark -X lua_script:tools/wireshark/ulnic.lua node1.pcap
    #[command(verbatim_doc_comment)]
    Capture {
        #[command(flatten)]
        at: LinkTarget,
        /// The pcap file to write.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// Stop after this many packets.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<f64>,
    },
    /// One side of a benchmark (started by `ulnic bench`).
    #[command(hide = true)]
    BenchPeer(PeerArgs),
    /// One guest's side of `cluster bench apps`.
    #[command(hide = true)]
    AppsPeer(crate::bench::apps::PeerArgs),
    /// The guest agent: serves `ulnic cluster exec/put` inside a guest
    /// (started by the guest's init).
    #[command(hide = true)]
    Agent {
        /// The virtio-serial port (default: the one named ulnic.agent).
        #[arg(long)]
        port: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct ClusterName {
    /// Which cluster (several may be up at once).
    #[arg(long, default_value = "default")]
    name: String,
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Boot N guests on one device and keep them running (a supervisor
    /// process holds them) until `ulnic cluster down`.
    ///
    /// Each guest has a ulnic node and a virtio-net NIC on a private
    /// segment (IPv6 link-local, no uplink); console logs are kept per node
    /// in the cluster's directory (shown by `status`).
    ///
    /// Examples:
    ///   ulnic cluster up --nodes 3
    ///   ulnic cluster exec all -- 'ulnic selftest'
    ///   ulnic cluster down
    #[command(verbatim_doc_comment)]
    Up {
        #[command(flatten)]
        opts: ClusterOpts,
        #[command(flatten)]
        name: ClusterName,
        /// Print the cluster's status as JSON when it is up.
        #[arg(long)]
        json: bool,
    },
    /// Run a shell command on one guest or all, with its output streamed
    /// (prefixed by node when several) and its exit status returned (with
    /// several nodes: the first non-zero). ULNIC_NODE and ULNIC_NODES are
    /// set. Ctrl-C kills the command in the guest.
    ///
    /// Examples:
    ///   ulnic cluster exec 1 -- ulnic recv --port 5
    ///   ulnic cluster exec all -- 'echo $ULNIC_NODE; uname -r'
    #[command(verbatim_doc_comment)]
    Exec {
        /// A node number, or `all`.
        target: String,
        #[command(flatten)]
        name: ClusterName,
        /// The command (a shell command line; words are joined).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Copy a file into guests (e.g. your own program; it runs with the
    /// guest's libc, the one `ulnic` uses, or link it statically).
    ///
    /// Example: ulnic cluster put all ./target/release/my-app /bin/my-app
    Put {
        /// A node number, or `all`.
        target: String,
        /// The local file.
        local: PathBuf,
        /// Where it goes in the guest (default: /bin/<file name>).
        remote: Option<String>,
        #[command(flatten)]
        name: ClusterName,
    },
    /// Reset one guest (like pressing its reset button) and wait until it
    /// is ready again. Its ulnic node is reset: its endpoints go, their
    /// close messages are sent; the other guests keep running.
    Reboot {
        /// The node.
        node: u32,
        #[command(flatten)]
        name: ClusterName,
        /// Seconds to wait for the guest.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Stop the cluster's device and start a new one while the guests run
    /// (as after a device crash). Each guest's NIC is unplugged and plugged
    /// again over QMP: its driver sees the old NIC removed, so what was open
    /// fails with ENODEV (the library says "the ulnic device went away")
    /// and blocked waiters wake; new endpoints work at once, without a
    /// reboot.
    ///
    /// Examples:
    ///   ulnic cluster restart-device
    ///   ulnic cluster restart-device --name ci --json
    #[command(verbatim_doc_comment)]
    RestartDevice {
        #[command(flatten)]
        name: ClusterName,
        /// Seconds to wait for every guest to reconnect.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make one guest's NIC stop answering control commands (`on`), or
    /// answer them again (`off`): an injected fault, to see how drivers and
    /// programs cope with a device that hangs. Commands wait in the queue;
    /// data, doorbells and the other nodes go on. The Linux driver gives up
    /// on a command after 10 s (ETIMEDOUT) and then fails every later one
    /// with EIO until the device is plugged again (`restart-device`).
    ///
    /// Examples:
    ///   ulnic cluster stall-control 1 on
    ///   ulnic cluster stall-control 1 off
    #[command(verbatim_doc_comment)]
    StallControl {
        /// The node.
        node: u32,
        /// `on` stalls the control queue, `off` serves it again (commands
        /// that waited run then).
        #[arg(value_parser = ["on", "off"])]
        state: String,
        #[command(flatten)]
        name: ClusterName,
    },
    /// Show the guests' state, boot times and log paths.
    Status {
        #[command(flatten)]
        name: ClusterName,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop every guest, the device and the supervisor.
    Down {
        #[command(flatten)]
        name: ClusterName,
    },
    /// The supervisor process (started by `cluster up`).
    #[command(hide = true)]
    Supervise(crate::cluster::supervisor::SuperviseArgs),
    /// Boot N guests on one device, run CMD on every node (with ULNIC_NODE
    /// and ULNIC_NODES set), stream its output, tear down; exit non-zero if
    /// any node failed.
    ///
    /// Examples:
    ///   ulnic cluster run --nodes 2 -- ulnic selftest
    ///   ulnic cluster run --nodes 2 -- 'echo node $ULNIC_NODE of $ULNIC_NODES'
    #[command(verbatim_doc_comment)]
    Run {
        #[command(flatten)]
        opts: ClusterOpts,
        /// The command (a shell command line; words are joined).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Ping-pong, stream or RDMA writes between processes on pairs of
    /// guests, over ulnic and over kernel TCP on the guests' virtio-net
    /// link. Every node takes part: nodes 0 and 1, 2 and 3, ... run at
    /// once, the even node of each pair the client (an odd last node sits
    /// out); each result line names its pair.
    ///
    /// rdma-write: the odd node exports, the even one writes and the odd
    /// one checks every byte that landed; its TCP baseline is a stream of
    /// the same sizes.
    ///
    /// Examples:
    ///   ulnic cluster bench pingpong --size 8 --json
    ///   ulnic cluster bench pingpong --nodes 8 --size 4096
    ///   ulnic cluster bench rdma-write --size 65536 --iters 200
    Bench {
        /// Workload.
        #[arg(value_enum)]
        workload: Workload,
        #[command(flatten)]
        opts: ClusterOpts,
        /// Message sizes.
        #[arg(long, value_delimiter = ',', default_value = "8")]
        size: Vec<u32>,
        /// Iterations per size.
        #[arg(long, default_value_t = 2000)]
        iters: u64,
        /// How ulnic receivers wait: block (in the driver; halted vCPUs
        /// leave the cores to others, best under TCG) or poll.
        #[arg(long, value_enum, default_value = "block")]
        mode: Mode,
        /// Print the JSON result lines only.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        apps: crate::bench::apps::AppsArgs,
    },
}

#[derive(clap::Args, Debug)]
struct ClusterOpts {
    /// Number of guests.
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Accelerator: auto probes whether KVM really runs a guest here.
    #[arg(long, value_enum, default_value = "auto")]
    accel: crate::cluster::Accel,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 512)]
    memory: u32,
    /// Seconds before the run is abandoned.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Endpoints per guest NIC, 1 to 4096.
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_ENDPOINTS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(ulnic_abi::MAX_ENDPOINTS_LIMIT)))]
    endpoints: u32,
    /// Device processes to spread the guests' NICs over: more than 1 is a
    /// star fabric (one switch per device, nodes in contiguous blocks)
    /// of `ulnic device` processes joined over loopback UDP with a fresh
    /// key, as `ulnic fabric up` makes (docs/spec.md §10.7). A cluster
    /// up this way cannot `restart-device`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    devices: u32,
    /// Debian (bookworm) packages to add to the guests, with the shared
    /// libraries their programs need; fetched once into the cache.
    /// Example: --packages redis-server,redis-tools,iperf3,sockperf
    #[arg(long, value_delimiter = ',', value_name = "PKG,...")]
    packages: Vec<String>,
    /// A host directory to copy into the guests: HOST_DIR[:GUEST_DIR]
    /// (default /opt/<its name>). May be given more than once.
    #[arg(long = "add", value_name = "HOST_DIR[:GUEST_DIR]")]
    add: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum FabricCmd {
    /// Read a topology file (docs/spec.md §10.1), check it, and print the
    /// route every node takes to every other: up*/down* routes, free of
    /// deadlock on any connected topology.
    ///
    /// Examples:
    ///   ulnic fabric routes --topology two-switches.toml
    ///   ulnic fabric routes --topology two-switches.toml --json
    #[command(verbatim_doc_comment)]
    Routes {
        /// The topology file (TOML).
        #[arg(long, value_name = "FILE")]
        topology: PathBuf,
        /// Print one JSON object per route.
        #[arg(long)]
        json: bool,
    },
    /// Check the fabric's reliable transport end to end: start a device
    /// whose links drop, corrupt, duplicate and reorder packets (seeded,
    /// so a run can be repeated), attach one host process per node, have
    /// every node send numbered messages to every other, and count what
    /// arrives. With the transport working, lost, duplicated and
    /// out_of_order are 0 and delivered equals sent. Exits 1 otherwise.
    ///
    /// Examples:
    ///   ulnic fabric selftest --nodes 4 --messages 100000 --drop 0.05 --corrupt 0.01 \
    ///       --duplicate 0.01 --reorder 0.05 --seed 7
    ///   ulnic fabric selftest --nodes 4 --messages 20000 --partition-ms 50:200 --json
    ///   ulnic fabric selftest --topology docs/topologies/two-switches.toml --nodes 4 --drop 0.01
    #[command(verbatim_doc_comment)]
    Selftest(SelftestArgs),
    /// Benchmark the emulated fabric, on a device started in this process
    /// with host-attached nodes.
    ///
    /// link: is a link what it was configured to be? Its one-way latency
    /// (half the median ping-pong difference against an ideal link, in
    /// interleaved rounds) and the rate bytes leave on it while 64 KiB
    /// messages stream over it, against the configured values.
    ///
    /// hotspot (VN Figs. 7-8): N clients send to one server endpoint; the
    /// aggregate rate and every client's share as N grows.
    ///
    /// hops, loss, reliability: 8-byte ping-pong and a 64 KiB stream between
    /// two nodes across 1, 2 and 3 switches; with 0 to 10 % packet loss on
    /// every link; without a fabric and with an ideal one (the cost of the
    /// transport, after VMMC-2 Table 2). Links are 10 Gb/s, 1 us, 4 KiB
    /// packets. Payloads are not touched.
    ///
    /// Examples:
    ///   ulnic fabric bench link --link 1:10,10:5
    ///   ulnic fabric bench hotspot --clients 1,4,16,64 --json
    ///   ulnic fabric bench loss
    ///   ulnic fabric bench drain --engine-threads 1,2
    ///   ulnic fabric bench logp
    ///   ulnic fabric bench permutation
    ///
    /// drain: the engine alone. Send rings are filled while the engine is
    /// held (8-byte messages from node 0 to 1 and from node 2 to 3, on two
    /// switches), then the time for it to deliver them all, with each
    /// number of engine threads, in interleaved rounds.
    #[command(verbatim_doc_comment)]
    Bench(FabricBenchArgs),
    /// Change the faults of a link of a running device (one started with
    /// --topology). The link's faults become exactly those given: what is
    /// not given is 0 (so `--up` alone heals a link completely).
    ///
    /// Examples:
    ///   ulnic fabric set --device /tmp/ulnic --node 1 --down      # partition node 1
    ///   ulnic fabric set --device /tmp/ulnic --node 1 --up        # and heal it
    ///   ulnic fabric set --device /tmp/ulnic --link 0 --drop 0.01 --reorder 0.05
    #[command(verbatim_doc_comment)]
    Set(FabricSetArgs),
    /// Start the device processes of a fabric spread over machines
    /// (docs/spec.md §10.7): one `ulnic device --member` per member, here
    /// or on the hosts of an MPI-style hostfile through ssh. Writes
    /// DIR/fabric.toml and a fresh key DIR/fabric.key (mode 0600), copies
    /// both to each remote host (same path), starts every member
    /// detached, waits for each to be up and records them in
    /// DIR/members.json for `ulnic fabric down`. Node i's socket is
    /// DIR/node{i}.sock on the host of the member serving it.
    ///
    /// Without --topology the fabric is a star: one switch per device,
    /// joined to the first, nodes in contiguous blocks, member dK at
    /// host K's address, UDP port --port + K.
    ///
    /// Hostfile lines: HOST [slots=N] [address=IP]  (member k runs on the
    /// k-th slot; a host whose address is this machine's is started here
    /// without ssh). Hosts need `ulnic` (--remote-ulnic) and ssh access.
    ///
    /// Under Slurm, write the files with --dry-run and let srun start the
    /// members (one task per node, member dK on the K-th node):
    ///   scontrol show hostnames "$SLURM_JOB_NODELIST" > hosts
    ///   ulnic fabric up --nodes 16 --devices "$SLURM_NNODES" --hostfile hosts \
    ///       --dir "$PWD/ulnic" --dry-run
    ///   srun --ntasks-per-node=1 bash -c 'ulnic device --nodes 16 \
    ///       --topology "$PWD/ulnic/fabric.toml" --member "d$SLURM_PROCID" \
    ///       --key-file "$PWD/ulnic/fabric.key" --socket-dir /tmp/ulnic'
    ///
    /// Examples:
    ///   ulnic fabric up --nodes 4 --devices 2 --dir /tmp/ulnic      # both here
    ///   ulnic fabric up --nodes 8 --devices 2 --hostfile hosts --dir /tmp/ulnic
    ///   ulnic bench pingpong --device-dir /tmp/ulnic --nodes 0,7 --transport ulnic
    ///   ulnic fabric down --dir /tmp/ulnic
    #[command(verbatim_doc_comment)]
    Up(FabricUpArgs),
    /// Stop the device processes `ulnic fabric up` started from DIR (here
    /// and, through ssh, on other hosts).
    ///
    /// Example: ulnic fabric down --dir /tmp/ulnic
    #[command(verbatim_doc_comment)]
    Down {
        /// The state directory given to `fabric up`.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The ssh command for members on other hosts.
        #[arg(long, default_value = "ssh -o BatchMode=yes", value_name = "CMD")]
        ssh: String,
    },
    /// Map a running device's fabric over the fabric itself (docs/spec.md
    /// §10.9): the mapper's node sends probes through every switch gate,
    /// switches and nodes answer, and what answered is printed with how it
    /// compares to the topology file. On a fabric with a [mapping] section
    /// the routes every node uses come from these rounds (run on their own
    /// every interval, and this one); otherwise the round only looks.
    ///
    /// Exits 0 when the map matches the topology file with every link up,
    /// 3 when it differs (a link down, a switch cut off), 1 on error.
    ///
    /// Examples:
    ///   ulnic fabric map --device /tmp/ulnic
    ///   ulnic fabric map --device /tmp/ulnic --json
    #[command(verbatim_doc_comment)]
    Map {
        /// The device's socket directory.
        #[arg(long, value_name = "DIR")]
        device: PathBuf,
        /// With a fabric spread over devices: which member to ask (the one
        /// serving the mapper's node maps; others look from their first
        /// node).
        #[arg(long, value_name = "NAME")]
        member: Option<String>,
        /// Print the map as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// A link of a running device, named by index or by the node on it.
#[derive(clap::Args, Debug)]
struct LinkTarget {
    /// The device's socket directory.
    #[arg(long, value_name = "DIR")]
    device: PathBuf,
    /// The link, by index in the topology (`ulnic stats` lists them).
    #[arg(long, conflicts_with = "node", required_unless_present = "node")]
    link: Option<usize>,
    /// Or the link this node hangs on.
    #[arg(long)]
    node: Option<u32>,
    /// With a fabric spread over devices: which member (each emulates the
    /// lanes it sends on).
    #[arg(long, value_name = "NAME")]
    member: Option<String>,
}

#[derive(clap::Args, Debug)]
struct FabricSetArgs {
    #[command(flatten)]
    at: LinkTarget,
    /// Probability a packet is lost.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    drop: f64,
    /// Probability a bit of a packet flips.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    corrupt: f64,
    /// Probability a packet arrives twice.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    duplicate: f64,
    /// Probability later packets overtake a packet.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    reorder: f64,
    /// Probability a packet is delayed by --delay-us.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    delay: f64,
    /// How late a delayed packet is.
    #[arg(long, default_value_t = 100.0, value_name = "US")]
    delay_us: f64,
    /// Cut the link (a partition).
    #[arg(long, conflicts_with = "up")]
    down: bool,
    /// The link works (the default; says so explicitly).
    #[arg(long)]
    up: bool,
}

#[derive(clap::Args, Debug)]
struct FabricUpArgs {
    /// State directory: the topology, key, logs, members.json and the
    /// node sockets (the same path on every host).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// A topology file with [[device]] entries (else a star of --devices).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["nodes", "devices"])]
    topology: Option<PathBuf>,
    /// Nodes of the star fabric.
    #[arg(long, default_value_t = 4, value_name = "N")]
    nodes: u32,
    /// Device processes of the star fabric.
    #[arg(long, default_value_t = 2, value_name = "D")]
    devices: u32,
    /// Hosts to run the members on (HOST [slots=N] [address=IP] per line);
    /// default: all on this host, on loopback.
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// How to reach a host (split like a shell command; the host and the
    /// remote command are appended).
    #[arg(long, default_value = "ssh -o BatchMode=yes", value_name = "CMD")]
    ssh: String,
    /// The ulnic binary on remote hosts.
    #[arg(long, default_value = "ulnic", value_name = "PATH")]
    remote_ulnic: String,
    /// First UDP port of the star's members (member K: PORT + K).
    #[arg(long, default_value_t = 7300, value_name = "PORT")]
    port: u16,
    /// Endpoints per node.
    #[arg(long, default_value_t = 16, value_name = "N")]
    endpoints: u32,
    /// Write the topology and key, print each member's command, start
    /// nothing (for srun or your own launcher).
    #[arg(long)]
    dry_run: bool,
    /// Print the members as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum FabricBenchKind {
    /// Achieved against configured bandwidth and latency of a link.
    Link,
    /// N clients to one server endpoint.
    Hotspot,
    /// Ping-pong and stream across 1, 2 and 3 switches.
    Hops,
    /// Throughput and round trip against packet loss.
    Loss,
    /// VMMC-2 Table 2: no fabric (no transport) against an ideal fabric
    /// with the transport.
    Reliability,
    /// The engine alone, with 1 and 2 (or --engine-threads) threads.
    Drain,
    /// VN Fig. 5: LogP (o_s, o_r, g, L) of 8-byte messages, without a
    /// fabric and with an ideal one.
    Logp,
    /// VN Table 1: four streams at once between neighbours, then across
    /// the bisection of two switches.
    Permutation,
}

#[derive(clap::Args, Debug)]
struct FabricBenchArgs {
    /// Which benchmark.
    #[arg(value_enum)]
    which: FabricBenchKind,
    /// link: the links to measure, as GBPS:LATENCY_US pairs.
    #[arg(long, value_delimiter = ',', default_value = "1:10,10:5")]
    link: Vec<String>,
    /// link: interleaved rounds (ideal link, measured link, ...).
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// link: round trips per ping-pong measurement.
    #[arg(long, default_value_t = 2000)]
    iters: usize,
    /// drain: engine threads to compare.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    engine_threads: Vec<u32>,
    /// drain: messages per pair of nodes (two pairs; at most 32000).
    #[arg(long, default_value_t = 30_000)]
    messages: u32,
    /// hotspot: numbers of clients to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    clients: Vec<u32>,
    /// Seconds each stream (link) or each N (hotspot) runs, after a
    /// warm-up of a fifth of that.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Print one JSON object per result.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct SelftestArgs {
    /// Nodes (attached from host processes).
    #[arg(long, default_value_t = 4)]
    nodes: u32,
    /// Messages in all, spread over the nodes.
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Probability that a link loses a packet.
    #[arg(long, value_name = "P")]
    drop: Option<f64>,
    /// Probability that a link flips a bit of a packet (the CRC catches it).
    #[arg(long, value_name = "P")]
    corrupt: Option<f64>,
    /// Probability that a link delivers a packet twice.
    #[arg(long, value_name = "P")]
    duplicate: Option<f64>,
    /// Probability that a link holds a packet back so later ones pass it.
    #[arg(long, value_name = "P")]
    reorder: Option<f64>,
    /// Seed of the faults: the same seed, the same faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Cut node 1's link at START ms for LEN ms, then heal it.
    #[arg(long, value_name = "START:LEN")]
    partition_ms: Option<String>,
    /// A topology file (docs/spec.md §10.1) instead of one switch; the
    /// fault flags, when given, replace its links' faults.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum ImageCmd {
    /// Fetch and build the default guest (Debian cloud kernel, busybox
    /// initramfs) and QEMU into the cache; rebuilds only when an input
    /// changed. Package versions are resolved with apt at most once a day
    /// (kept in the cache's resolved.json); without network the last
    /// resolution is used.
    ///
    /// Examples:
    ///   ulnic image build
    ///   ulnic image build --json
    #[command(verbatim_doc_comment)]
    Build {
        /// Ask apt for the newest packages now and rebuild even when the
        /// cache is current.
        #[arg(long)]
        force: bool,
        /// Print the result as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args, Debug)]
struct DeviceArgs {
    /// Directory for the node sockets: DIR/node0.sock, DIR/node1.sock, ...
    #[arg(long, value_name = "DIR", required_unless_present = "socket")]
    socket_dir: Option<PathBuf>,
    /// Number of nodes (sockets) to create in --socket-dir.
    #[arg(long, default_value_t = 2, value_name = "N")]
    nodes: u32,
    /// Explicit socket path for a node; repeat for more. Socket i is node i.
    #[arg(long, value_name = "PATH", conflicts_with = "socket_dir")]
    socket: Vec<PathBuf>,
    /// Endpoints per node, 1 to 4096 (the node's 64 virtqueues do not
    /// depend on it: give QEMU num_vqs=64). The device polls at most 64
    /// of them; the others ring a doorbell when they send (spec §5.8).
    #[arg(long, default_value_t = 16, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(ulnic_abi::MAX_ENDPOINTS_LIMIT)))]
    endpoints: u32,
    /// Microseconds the data-path engine keeps polling after its last work
    /// before it sleeps and asks drivers for doorbells.
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_POLL_FOR.as_micros() as u64, value_name = "US")]
    poll_us: u64,
    /// Tripwires each endpoint may set (their fired flags live in the
    /// endpoint's control block, so at most 3072).
    #[arg(long, default_value_t = ulnic_abi::DEFAULT_TRIPWIRES, value_name = "N")]
    tripwires: u32,
    #[command(flatten)]
    utlb_cache: UtlbCacheArgs,
    /// Emulate the fabric this topology file describes (docs/spec.md
    /// §10): messages between nodes cross its links as packets, under
    /// the reliable transport, with the file's faults. Without it, nodes
    /// are one copy apart.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// The control socket `ulnic stats`, `ulnic fabric set` and `ulnic
    /// capture` use (default: DIR/control.sock with --socket-dir, or
    /// DIR/control-MEMBER.sock with --member; none with --socket unless
    /// given).
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// With a topology whose [[device]] entries spread it over several
    /// device processes: which of them this is. It serves the nodes on
    /// its own switches and reaches the rest over UDP.
    #[arg(long, value_name = "NAME", requires = "topology")]
    member: Option<String>,
    /// Engine threads. More than one splits the data path by switch
    /// (needs --topology with at least that many switches): each thread
    /// serves its switches and their nodes, with queues between them.
    #[arg(long, default_value_t = 1, value_name = "N")]
    engine_threads: u32,
    /// The fabric's secret (any file of at least 16 bytes, the same on
    /// every member, e.g. `head -c 32 /dev/urandom > key`): every UDP
    /// datagram carries an HMAC-SHA256 under it.
    #[arg(long, value_name = "FILE", requires = "member")]
    key_file: Option<PathBuf>,
}

/// The device's UTLB translation cache (VMMC-2's NI cache).
#[derive(clap::Args, Debug, Clone)]
struct UtlbCacheArgs {
    /// Lines in the device's UTLB translation cache (VMMC-2: 8192).
    #[arg(long, default_value_t = ulnic_abi::DEFAULT_UTLB_CACHE, value_name = "N")]
    utlb_cache_entries: u32,
    /// Lines per set: 1 is direct-mapped (VMMC-2), N fully associative.
    #[arg(long, default_value_t = 1, value_name = "WAYS")]
    utlb_cache_ways: u32,
    /// Which line of a full set a miss replaces.
    #[arg(long, value_enum, default_value_t = UtlbReplacement::Lru)]
    utlb_replacement: UtlbReplacement,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum UtlbReplacement {
    /// Least recently used.
    Lru,
    /// Pseudo-random.
    Random,
}

impl UtlbCacheArgs {
    fn config(&self) -> ulnic_device::nic::utlb::CacheConfig {
        ulnic_device::nic::utlb::CacheConfig {
            entries: self.utlb_cache_entries,
            ways: self.utlb_cache_ways,
            replacement: match self.utlb_replacement {
                UtlbReplacement::Lru => ulnic_device::nic::utlb::Replacement::Lru,
                UtlbReplacement::Random => ulnic_device::nic::utlb::Replacement::Random,
            },
        }
    }
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// Workload.
    #[arg(value_enum)]
    workload: Workload,
    /// Transports to compare, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ulnic,shm,unix,tcp"
    )]
    transport: Vec<Transport>,
    /// Message sizes in bytes (RDMA workloads sweep 4096..1048576 unless
    /// sizes are given).
    #[arg(long, value_delimiter = ',', default_value = "0,4,40,400,4096,65536")]
    size: Vec<u32>,
    /// Measured iterations per size (default: 5000 round trips; for stream,
    /// about 256 MB of payload, at least 2000 messages).
    #[arg(long)]
    iters: Option<u64>,
    /// How receivers wait: busy-poll (yielding) or block in the kernel.
    /// Sockets always block; shm always polls; each line says what ran.
    #[arg(long, value_enum, default_value = "poll")]
    mode: Mode,
    /// Use a running device's socket directory (nodes 0 and 1, or
    /// --nodes) instead of starting one.
    #[arg(long, value_name = "DIR")]
    device_dir: Option<PathBuf>,
    /// With --device-dir: the client's and the server's nodes (their
    /// sockets nodeN.sock may belong to different devices of one fabric).
    #[arg(long, value_parser = parse_node_pair, default_value = "0,1",
          value_name = "CLIENT,SERVER", requires = "device_dir")]
    nodes: (u32, u32),
    /// Print one JSON object per result line.
    #[arg(long)]
    json: bool,
    /// The device this benchmark starts (not with --device-dir).
    #[command(flatten)]
    utlb_cache: UtlbCacheArgs,
    /// utlb stress: numbers of distinct one-page buffers to sweep.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,1024")]
    buffers: Vec<u32>,
    /// utlb stress: entries in the sender's UTLB table (the "cache" the
    /// buffers are swept past).
    #[arg(long, default_value_t = 256, value_name = "N")]
    utlb_entries: u32,
    /// pingpong and stream: flip one byte of measured message N (from 0)
    /// after the sender wrote it. The receiver checks every byte of every
    /// message, so the run must fail: a check that the checks run.
    #[arg(long, value_name = "N")]
    corrupt_at: Option<u64>,
    /// pingpong and stream: how payloads are touched. write+verify (the
    /// default): the sender writes every byte of every message and the
    /// receiver checks every byte. write: the sender writes, the receiver
    /// does not read. none: neither (the transfer alone, as fabtests by
    /// default). Every result line says which ran. ulnic payloads are
    /// written and read in place in the registered segment, the others'
    /// through a user buffer; a ping-pong's answer is written afresh, so
    /// both directions are touched, and round trips include the touching.
    /// With none, ulnic sends every message from one buffer into one, as
    /// fabtests do; otherwise each message in flight has its own slot (64
    /// a side). Lines say which ("buffers" in --json).
    #[arg(long, value_enum, default_value = "write+verify")]
    payload: crate::bench::payload::Touch,
    /// compare: interleaved rounds (each peer once per round).
    #[arg(long, default_value_t = 5, value_name = "N")]
    rounds: u32,
    /// pingpong and stream over ulnic: endpoints each peer keeps open on
    /// its node, all but the measured one having exchanged a message
    /// first. The device polls at most 64 per node and the others wait
    /// for doorbells (spec §5.8), so this shows what a node's endpoint
    /// count costs the one in use. Lines say "ulnic:Nep".
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(ulnic_abi::MAX_ENDPOINTS_LIMIT)))]
    endpoints: u32,
    /// compare: also boot QEMU guests (TCG unless KVM works here; the
    /// guest image is built on first use): 8-byte round trips between two
    /// guests over ulnic against kernel TCP on their virtio-net link, and
    /// how long `cluster up` takes for 2 and for 8 guests. Adds minutes.
    #[arg(long)]
    guests: bool,
    #[command(flatten)]
    apps: crate::bench::apps::AppsArgs,
}

/// "A,B": two node numbers.
fn parse_node_pair(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("'{s}' is not CLIENT,SERVER (e.g. 0,2)"))?;
    let n = |x: &str| x.trim().parse::<u32>().map_err(|e| format!("'{x}': {e}"));
    let (a, b) = (n(a)?, n(b)?);
    if a == b {
        return Err("the client and the server need different nodes".into());
    }
    Ok((a, b))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The device narrates; benchmarks print only their results.
    let level = if matches!(
        cli.command,
        Cmd::Device(_) | Cmd::Cluster(ClusterCmd::Supervise(_))
    ) {
        "info"
    } else {
        "warn"
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    // Commands that only print tables end quietly when their reader goes
    // (`ulnic stats | head`), as other Unix tools do. Not the rest: a
    // device or launcher must outlive a client that hangs up.
    if matches!(
        cli.command,
        Cmd::Stats { .. } | Cmd::Fabric(FabricCmd::Routes { .. } | FabricCmd::Map { .. })
    ) {
        // SAFETY: restoring the default disposition of SIGPIPE before any
        // thread starts has no other effect.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let r = match cli.command {
        Cmd::Device(a) => run_device(a),
        Cmd::Bench(a) => run_bench(a),
        Cmd::Image(ImageCmd::Build { force, json }) => run_image_build(force, json),
        Cmd::Fabric(FabricCmd::Routes { topology, json }) => fabric_routes(&topology, json),
        Cmd::Fabric(FabricCmd::Selftest(a)) => fabric_selftest(a),
        Cmd::Fabric(FabricCmd::Bench(a)) => fabric_bench(a),
        Cmd::Fabric(FabricCmd::Set(a)) => fabric_set(a),
        Cmd::Fabric(FabricCmd::Up(a)) => fabric_up(a),
        Cmd::Fabric(FabricCmd::Down { dir, ssh }) => {
            fabric::launch::down(&dir, &ssh, &mut |l| eprintln!("ulnic fabric down: {l}")).map(|_| ())
        }
        Cmd::Fabric(FabricCmd::Map {
            device,
            member,
            json,
        }) => fabric_map(&device, member.as_deref(), json),
        Cmd::Stats {
            device,
            member,
            watch,
            json,
        } => run_stats(&device, member.as_deref(), watch, json),
        Cmd::Capture {
            at,
            output,
            count,
            seconds,
        } => run_capture(&at, &output, count, seconds),
        Cmd::Cluster(ClusterCmd::Run { opts, command }) => {
            crate::cluster::shell_join(&command)
                .and_then(|c| run_cluster(&opts, &c, false).map(|_| ()))
        }
        Cmd::Cluster(ClusterCmd::Bench {
            workload: Workload::Apps,
            opts,
            json,
            apps,
            ..
        }) => run_cluster_apps(&opts, &apps, json),
        Cmd::Cluster(ClusterCmd::Bench {
            workload,
            opts,
            size,
            iters,
            mode,
            json,
            apps: _,
        }) => run_cluster_bench(&opts, workload, &size, iters, mode, json),
        Cmd::Selftest => match crate::selftest::run() {
            Ok(lines) => {
                lines.iter().for_each(|l| println!("ulnic-selftest: {l}"));
                println!("ulnic-selftest: ok");
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("selftest failed: {e}")),
        },
        Cmd::DriverFuzz {
            device,
            seed,
            operations,
            json,
        } => crate::driver_fuzz::run(&device, seed, operations).and_then(|report| {
            if json {
                println!("{}", serde_json::json!(report));
            } else {
                print!("{}", report.table());
            }
            if report.kernel_faults.is_empty() {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "the kernel log shows {} fault line(s) after driver-fuzz (seed {seed})",
                    report.kernel_faults.len()
                ))
            }
        }),
        Cmd::DriverCheck {
            check,
            device,
            ready,
            go,
            timeout,
            json,
        } => {
            let hs = crate::driver_check::Handshake {
                ready: &ready,
                go: &go,
                timeout: Duration::from_secs(timeout),
            };
            crate::driver_check::run(check, &device, &hs).and_then(|report| {
                if json {
                    println!("{}", serde_json::json!(report));
                } else {
                    print!("{}", report.table());
                }
                let bad = report.failures.len() + report.kernel_faults.len();
                if bad == 0 {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("driver-check {}: {bad} problem(s)", report.check))
                }
            })
        }
        Cmd::BenchPeer(a) => bench::peer(&a).map_err(anyhow::Error::from),
        Cmd::AppsPeer(a) => crate::bench::apps::peer(&a),
        Cmd::Agent { port } => {
            match port.or_else(crate::cluster::agent::find_port) {
                Some(p) => crate::cluster::agent::run(&p),
                None => Err(anyhow::anyhow!(
                    "no virtio-serial port named {}",
                    crate::cluster::agent::PORT_NAME
                )),
            }
        }
        Cmd::Cluster(ClusterCmd::Up { opts, name, json }) => cluster_up(&opts, &name.name, json),
        Cmd::Cluster(ClusterCmd::Exec {
            target,
            name,
            command,
        }) => crate::cluster::shell_join(&command)
            .and_then(|c| cluster_exec(&name.name, &target, &c)),
        Cmd::Cluster(ClusterCmd::Put {
            target,
            local,
            remote,
            name,
        }) => cluster_put(&name.name, &target, &local, remote),
        Cmd::Cluster(ClusterCmd::Reboot {
            node,
            name,
            timeout,
        }) => {
            let dir = state_dir(&name.name);
            eprintln!("[node {node}] resetting");
            client::reboot(&dir, node, Duration::from_secs(timeout)).map(|s| {
                eprintln!("[node {node}] ready again after {s:.1} s");
            })
        }
        Cmd::Cluster(ClusterCmd::StallControl { node, state, name }) => {
            let stalled = state == "on";
            client::stall_control(&state_dir(&name.name), node, stalled).map(|()| {
                eprintln!(
                    "[node {node}] control queue {}",
                    if stalled { "stalled" } else { "served again" }
                )
            })
        }
        Cmd::Cluster(ClusterCmd::RestartDevice {
            name,
            timeout,
            json,
        }) => client::restart_device(&state_dir(&name.name), Duration::from_secs(timeout)).map(
            |r| {
                if json {
                    println!("{}", serde_json::to_string(&r).unwrap_or_default());
                } else {
                    eprintln!(
                        "device restarted: stopped in {:.2} s, {} guest(s) reconnected after {:.2} s",
                        r.stopped_seconds,
                        r.nodes.len(),
                        r.reconnected_seconds
                    );
                }
            },
        ),
        Cmd::Cluster(ClusterCmd::Status { name, json }) => cluster_status(&name.name, json),
        Cmd::Cluster(ClusterCmd::Down { name }) => {
            client::down(&state_dir(&name.name)).map(|()| eprintln!("cluster '{}' is down", name.name))
        }
        Cmd::Cluster(ClusterCmd::Supervise(a)) => crate::cluster::supervisor::supervise(&a),
        Cmd::Send(a) => crate::transfer::send(&a).map(|r| {
            if a.json {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
            } else {
                println!(
                    "ulnic send: {}: {} messages of {} bytes to {} in {:.2} s ({:.0} msg/s), {} returned and resent{}",
                    r.outcome,
                    r.messages,
                    r.size,
                    a.to,
                    r.seconds,
                    r.messages as f64 / r.seconds.max(1e-9),
                    r.resent,
                    r.close_message
                        .as_deref()
                        .map(|t| format!("; close message: \"{t}\""))
                        .unwrap_or_default()
                );
            }
        }),
        Cmd::Recv(a) => crate::transfer::recv(&a).map(|r| {
            if a.json {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
            } else {
                println!(
                    "ulnic recv: {} messages ({} bytes) from {} in order, each once, intact, in {:.2} s; {} discarded after a gap and resent",
                    r.messages, r.bytes, r.from, r.seconds, r.discarded_after_gap
                );
            }
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ulnic: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn fabric_selftest(a: SelftestArgs) -> anyhow::Result<()> {
    use ulnic_device::fabric::topology::Faults;
    let given = [a.drop, a.corrupt, a.duplicate, a.reorder];
    let faults = given.iter().any(Option::is_some).then(|| Faults {
        drop: a.drop.unwrap_or(0.0),
        corrupt: a.corrupt.unwrap_or(0.0),
        duplicate: a.duplicate.unwrap_or(0.0),
        reorder: a.reorder.unwrap_or(0.0),
        ..Faults::default()
    });
    let partition = match &a.partition_ms {
        None => None,
        Some(s) => {
            let (at, len) = s
                .split_once(':')
                .and_then(|(x, y)| Some((x.parse::<u64>().ok()?, y.parse::<u64>().ok()?)))
                .ok_or_else(|| {
                    anyhow::anyhow!("--partition-ms takes START:LEN in milliseconds, e.g. 50:200")
                })?;
            Some((Duration::from_millis(at), Duration::from_millis(len)))
        }
    };
    let fabric = a.topology.as_deref().map(crate::fabric::load).transpose()?;
    let opts = crate::fabric::selftest::Options {
        nodes: a.nodes,
        messages: a.messages,
        faults,
        fabric,
        seed: a.seed,
        partition,
        quiet: Duration::from_secs(30),
    };
    let json = a.json;
    let r = crate::fabric::selftest::run(&opts, &mut |l| {
        if !json {
            eprintln!("{l}")
        }
    })?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("{:<22} {:>12}", "sent", r.sent);
        println!("{:<22} {:>12}", "delivered", r.delivered);
        println!("{:<22} {:>12}", "lost", r.lost);
        println!("{:<22} {:>12}", "duplicated", r.duplicated);
        println!("{:<22} {:>12}", "out_of_order", r.out_of_order);
        println!("{:<22} {:>12}", "returned", r.returned);
        println!("{:<22} {:>12.2}", "seconds", r.seconds);
        println!("{:<22} {:>12.0}", "messages/s", r.rate);
        println!("transport:");
        println!("{:<22} {:>12}", "  retransmissions", r.retransmissions);
        println!("{:<22} {:>12}", "  timeouts", r.timeouts);
        println!("{:<22} {:>12}", "  nacks", r.nacks);
        println!(
            "{:<22} {:>12}",
            "  duplicates dropped", r.duplicates_dropped
        );
        println!(
            "{:<22} {:>12}",
            "  early packets dropped", r.out_of_order_dropped
        );
        println!("links:");
        println!("{:<22} {:>12}", "  packets", r.packets);
        println!("{:<22} {:>12}", "  dropped", r.packets_dropped);
        println!("{:<22} {:>12}", "  corrupted", r.packets_corrupted);
        println!("{:<22} {:>12}", "  crc errors", r.crc_errors);
        println!("{:<22} {:>12}", "  duplicated", r.packets_duplicated);
        println!("{:<22} {:>12}", "  reordered", r.packets_reordered);
    }
    let clean = r.lost == 0 && r.duplicated == 0 && r.out_of_order == 0;
    if !clean || (partition.is_none() && r.returned > 0) {
        anyhow::bail!("the fabric lost, repeated or reordered messages");
    }
    Ok(())
}

fn run_capture(
    at: &LinkTarget,
    output: &std::path::Path,
    count: Option<u64>,
    seconds: Option<f64>,
) -> anyhow::Result<()> {
    let span = positive_secs(seconds, "--seconds")?;
    let member = at.member.as_deref();
    let n = crate::capture::run(
        &at.device,
        member,
        at.link,
        at.node,
        output,
        count,
        span,
        &mut |l| eprintln!("{l}"),
    )?;
    eprintln!("{n} packets written to {}", output.display());
    Ok(())
}

fn fabric_set(a: FabricSetArgs) -> anyhow::Result<()> {
    use crate::control::{Client, FaultSpec, Request};
    let mut c = Client::connect(&a.at.device, a.at.member.as_deref())?;
    c.send(&Request::SetFaults {
        link: a.at.link,
        node: a.at.node,
        faults: FaultSpec {
            drop: a.drop,
            corrupt: a.corrupt,
            duplicate: a.duplicate,
            reorder: a.reorder,
            delay: a.delay,
            delay_us: a.delay_us,
            down: a.down,
        },
    })?;
    c.checked_line()?;
    Ok(())
}

fn fabric_up(a: FabricUpArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    use fabric::launch::{parse_hostfile, up, UpOptions};
    let hosts = match &a.hostfile {
        None => Vec::new(),
        Some(p) => parse_hostfile(
            &std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
        )
        .with_context(|| p.display().to_string())?,
    };
    let dir = std::path::absolute(&a.dir)?;
    let o = UpOptions {
        dir: dir.clone(),
        topology: a.topology,
        nodes: a.nodes,
        devices: a.devices,
        hosts,
        ssh: a.ssh,
        remote_ulnic: a.remote_ulnic,
        port: a.port,
        endpoints: a.endpoints,
        dry_run: a.dry_run,
    };
    let members = up(&o, &mut |l| eprintln!("ulnic fabric up: {l}"))?;
    if a.dry_run {
        return Ok(());
    }
    if a.json {
        println!("{}", serde_json::to_string(&members)?);
        return Ok(());
    }
    println!(
        "{:<8} {:<22} {:<16} {:>8}  nodes",
        "member", "udp address", "host", "pid"
    );
    for m in &members {
        let nodes: Vec<String> = m.nodes.iter().map(u32::to_string).collect();
        println!(
            "{:<8} {:<22} {:<16} {:>8}  {}",
            m.name,
            m.address,
            m.host.as_deref().unwrap_or("(here)"),
            m.pid,
            nodes.join(",")
        );
    }
    println!(
        "node sockets: {}/node<N>.sock on each member's host; stop with `ulnic fabric down --dir {}`",
        dir.display(),
        dir.display()
    );
    Ok(())
}

fn fabric_map(dir: &std::path::Path, member: Option<&str>, json: bool) -> anyhow::Result<()> {
    use crate::control::{Client, MapReport, Request};
    let mut c = Client::connect(dir, member)?;
    c.send(&Request::Map)?;
    let line = c.checked_line()?;
    let m: MapReport = serde_json::from_str(&line)?;
    if json {
        println!("{line}");
    } else {
        println!(
            "round {} from node {}: {} switches, {} links, {} nodes, {} probes ({} unanswered), {:.0} us",
            m.round,
            m.mapper,
            m.switches.len(),
            m.links.len(),
            m.nodes.len(),
            m.probes,
            m.timeouts,
            m.took_us
        );
        if m.generation > 0 {
            println!(
                "routes: generation {} (the fabric routes by this map)",
                m.generation
            );
        } else {
            println!("routes: from the topology file (no [mapping]; this round only looked)");
        }
        println!(
            "\n{:<16} {:>4} {:>6}  route from the mapper",
            "switch", "id", "gates"
        );
        for s in &m.switches {
            let route: Vec<String> = s.route.iter().map(u8::to_string).collect();
            let route = if route.is_empty() {
                "-".to_string()
            } else {
                route.join(",")
            };
            println!("{:<16} {:>4} {:>6}  {route}", s.name, s.id, s.gates);
        }
        println!("\nlinks");
        for l in &m.links {
            println!("  {}:{} - {}:{}", l.a.0, l.a.1, l.b.0, l.b.1);
        }
        println!("\nnodes");
        for (n, s, p) in &m.nodes {
            println!("  node {n} on {s}:{p}");
        }
        if m.matches_topology {
            println!("\nmatches the topology file");
        } else {
            println!("\ndiffers from the topology file:");
            for d in &m.differences {
                println!("  {d}");
            }
        }
    }
    if !m.matches_topology {
        std::process::exit(3);
    }
    Ok(())
}

fn run_stats(
    dir: &std::path::Path,
    member: Option<&str>,
    watch: Option<f64>,
    json: bool,
) -> anyhow::Result<()> {
    use crate::control::{Client, Request, Stats};
    let every = positive_secs(watch, "--watch")?;
    let mut c = Client::connect(dir, member)?;
    loop {
        c.send(&Request::Stats)?;
        let line = c.checked_line()?;
        if json {
            println!("{line}");
        } else {
            let s: Stats = serde_json::from_str(&line)?;
            print_stats(&s);
        }
        match every {
            Some(d) => std::thread::sleep(d),
            None => return Ok(()),
        }
    }
}

fn print_stats(s: &crate::control::Stats) {
    let get = |m: &std::collections::BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    println!("nodes:");
    println!(
        "  {:>4} {:>9} {:>3} {:>12} {:>12} {:>10} {:>10} {:>8} {:>8}",
        "node",
        "attached",
        "eps",
        "tx msgs",
        "rx msgs",
        "tx errors",
        "retrans",
        "timeouts",
        "returned"
    );
    for n in &s.nodes {
        let (mut tx, mut rx, mut err) = (0, 0, 0);
        for e in &n.endpoints {
            tx += get(&e.counters, "tx_messages");
            rx += get(&e.counters, "rx_messages");
            err += get(&e.counters, "tx_errors");
        }
        let t = n.transport.clone().unwrap_or_default();
        println!(
            "  {:>4} {:>9} {:>3} {:>12} {:>12} {:>10} {:>10} {:>8} {:>8}",
            n.node,
            if n.connected { "yes" } else { "no" },
            n.endpoints.len(),
            tx,
            rx,
            err,
            get(&t, "retransmissions"),
            get(&t, "timeouts"),
            get(&t, "returned")
        );
    }
    let eps: Vec<_> = s
        .nodes
        .iter()
        .flat_map(|n| n.endpoints.iter().map(move |e| (n.node, e)))
        .collect();
    if !eps.is_empty() {
        println!("endpoints:");
        println!(
            "  {:>4} {:>4} {:>6} {:>12} {:>14} {:>12} {:>14} {:>9} {:>7}",
            "node",
            "ep",
            "port",
            "tx msgs",
            "tx bytes",
            "rx msgs",
            "rx bytes",
            "no buffer",
            "flight"
        );
        for (n, e) in eps {
            println!(
                "  {:>4} {:>4} {:>6} {:>12} {:>14} {:>12} {:>14} {:>9} {:>7}",
                n,
                e.id,
                e.port.map_or("-".to_string(), |p| p.to_string()),
                get(&e.counters, "tx_messages"),
                get(&e.counters, "tx_bytes"),
                get(&e.counters, "rx_messages"),
                get(&e.counters, "rx_bytes"),
                get(&e.counters, "rx_dropped_no_buffer"),
                e.in_flight
            );
        }
    }
    if !s.links.is_empty() {
        println!("links (each direction: packets, bytes, dropped, crc errors, stalls):");
        for l in &s.links {
            let d = |m: &std::collections::BTreeMap<String, u64>| {
                format!(
                    "{:>10} {:>13} {:>8} {:>6} {:>8}",
                    get(m, "packets"),
                    get(m, "bytes"),
                    get(m, "dropped") + get(m, "dropped_down"),
                    get(m, "crc_errors"),
                    get(m, "stalls")
                )
            };
            let state = if l.faults.down { " DOWN" } else { "" };
            println!("  {:>3} {:<14}{state}", l.link, l.name);
            println!("        -> {}", d(&l.directions[0]));
            println!("        <- {}", d(&l.directions[1]));
        }
        println!("switches:");
        for (name, fwd, mis) in &s.switches {
            println!("  {name:<14} forwarded {fwd:>12}  misrouted {mis}");
        }
    }
    if let Some(u) = &s.udp {
        println!(
            "udp: sent {}, received {}, rejected: not a member {}, bad MAC {}, malformed {}; overflow {}",
            get(u, "sent"),
            get(u, "received"),
            get(u, "rejected_sender"),
            get(u, "rejected_mac"),
            get(u, "rejected_malformed"),
            get(u, "overflow")
        );
    }
    println!(
        "totals: delivered {}, returned {}, notifications {}",
        get(&s.totals, "delivered"),
        get(&s.totals, "returned"),
        get(&s.totals, "notifications")
    );
}

/// A duration given in seconds on the command line, which must be a
/// positive number.
fn positive_secs(v: Option<f64>, flag: &str) -> anyhow::Result<Option<Duration>> {
    v.map(|s| {
        anyhow::ensure!(
            s.is_finite() && s > 0.0,
            "{flag} must be a positive number of seconds"
        );
        Ok(Duration::from_secs_f64(s))
    })
    .transpose()
}

/// Prints one JSON object per row: a benchmark's `--json` output.
fn print_json_lines<T: serde::Serialize>(rows: &[T]) -> anyhow::Result<()> {
    for r in rows {
        println!("{}", serde_json::to_string(r)?);
    }
    Ok(())
}

fn fabric_bench(a: FabricBenchArgs) -> anyhow::Result<()> {
    let span = positive_secs(Some(a.seconds), "--seconds")?.unwrap_or_default();
    let json = a.json;
    let mut say = |l: &str| {
        if !json {
            eprintln!("{l}")
        }
    };
    match a.which {
        FabricBenchKind::Link => {
            let cases = a
                .link
                .iter()
                .map(|c| {
                    let (g, l) = c
                        .split_once(':')
                        .and_then(|(g, l)| Some((g.parse().ok()?, l.parse().ok()?)))
                        .ok_or_else(|| {
                            anyhow::anyhow!("--link takes GBPS:LATENCY_US, e.g. 1:10; got {c}")
                        })?;
                    Ok(crate::fabric::bench::LinkCase {
                        gbps: g,
                        latency_us: l,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            anyhow::ensure!(
                a.rounds >= 1 && a.iters >= 10,
                "--rounds >= 1 and --iters >= 10"
            );
            let results = crate::fabric::bench::link(&cases, a.rounds, a.iters, span, &mut say)?;
            if json {
                return print_json_lines(&results);
            }
            println!(
                "link accuracy ({} interleaved rounds, medians; payloads not touched)",
                a.rounds
            );
            println!(
                "{:>10} {:>10} {:>7} {:>10} | {:>12} {:>12} {:>7} | {:>10} {:>9} {:>9}",
                "Gb/s set",
                "achieved",
                "ratio",
                "MB/s",
                "one-way set",
                "achieved",
                "ratio",
                "app sees",
                "RTT ideal",
                "RTT link"
            );
            for r in &results {
                println!(
                    "{:>10.3} {:>10.3} {:>7.3} {:>10.1} | {:>10.2}us {:>10.2}us {:>7.3} | {:>8.2}us {:>7.2}us {:>7.2}us",
                    r.configured_gbps,
                    r.achieved_gbps,
                    r.bandwidth_ratio,
                    r.payload_mbytes_per_s,
                    r.configured_one_way_us,
                    r.achieved_one_way_us,
                    r.latency_ratio,
                    r.app_one_way_us,
                    r.ideal_rtt_us,
                    r.link_rtt_us
                );
            }
        }
        FabricBenchKind::Hotspot => {
            let results = crate::fabric::bench::hotspot(&a.clients, span, &mut say)?;
            if json {
                return print_json_lines(&results);
            }
            println!("hot spot: N clients to one server endpoint (VN Figs. 7-8)");
            println!(
                "{:>8} {:>14} {:>12} {:>12} {:>8}",
                "clients", "aggregate/s", "min share*N", "max share*N", "Jain"
            );
            for r in &results {
                println!(
                    "{:>8} {:>14.0} {:>12.3} {:>12.3} {:>8.4}",
                    r.clients, r.aggregate_per_s, r.min_share_x_n, r.max_share_x_n, r.jain
                );
            }
            if let Some(r) = results.iter().max_by_key(|r| r.clients) {
                if r.clients < 2 {
                    return Ok(());
                }
                println!("per-client shares with {} clients (%):", r.clients);
                for (i, chunk) in r.shares.chunks(8).enumerate() {
                    let cells: Vec<String> =
                        chunk.iter().map(|s| format!("{:6.3}", s * 100.0)).collect();
                    println!(
                        "  clients {:>3}-{:<3} {}",
                        i * 8 + 1,
                        i * 8 + chunk.len(),
                        cells.join(" ")
                    );
                }
            }
        }
        FabricBenchKind::Permutation => {
            let results = crate::fabric::bench::permutations(span, &mut say)?;
            if json {
                return print_json_lines(&results);
            }
            println!("permutations (VN Table 1): 8 nodes, 4 per switch, 1 Gb/s 2 us links, one trunk; four 64 KiB streams");
            println!(
                "{:<11} {:>16} {:>40}",
                "pattern", "aggregate MB/s", "per stream MB/s"
            );
            for r in &results {
                let per: Vec<String> = r
                    .per_stream_mbytes_per_s
                    .iter()
                    .map(|x| format!("{x:.1}"))
                    .collect();
                println!(
                    "{:<11} {:>16.1} {:>40}",
                    r.pattern,
                    r.aggregate_mbytes_per_s,
                    per.join(" ")
                );
            }
        }
        FabricBenchKind::Logp => {
            let results = crate::fabric::bench::logp(a.iters, span, &mut say)?;
            if json {
                return print_json_lines(&results);
            }
            println!("LogP of 8-byte messages (VN Fig. 5; RTT = 2 (o_s + o_r + L)), microseconds");
            println!(
                "{:<14} {:>8} {:>8} {:>8} {:>8} {:>8}",
                "case", "o_s", "o_r", "g", "L", "RTT"
            );
            for r in &results {
                println!(
                    "{:<14} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                    r.case, r.o_s_us, r.o_r_us, r.g_us, r.l_us, r.rtt_us
                );
            }
        }
        FabricBenchKind::Drain => {
            let results =
                crate::fabric::bench::drain(&a.engine_threads, a.messages, a.rounds, &mut say)?;
            if json {
                return print_json_lines(&results);
            }
            println!(
                "drain: the engine alone, {} messages, {} interleaved rounds (medians)",
                results.first().map_or(0, |r| r.messages),
                a.rounds
            );
            println!(
                "{:>8} {:>14} {:>10} {:>14}",
                "threads", "messages/s", "speed-up", "CPU ns/msg"
            );
            for r in &results {
                println!(
                    "{:>8} {:>14.0} {:>9.2}x {:>14.0}",
                    r.engine_threads, r.messages_per_s, r.speedup, r.cpu_ns_per_message
                );
            }
            println!("(speed-up: median of each round's ratio to the first thread count)");
        }
        FabricBenchKind::Hops | FabricBenchKind::Loss | FabricBenchKind::Reliability => {
            use crate::fabric::bench::Sweep;
            let which = match a.which {
                FabricBenchKind::Hops => Sweep::Hops,
                FabricBenchKind::Loss => Sweep::Loss,
                _ => Sweep::Reliability,
            };
            let results = crate::fabric::bench::sweep(which, a.iters, span, &mut say)?;
            if json {
                return print_json_lines(&results);
            }
            if let Some(r) = results.first() {
                println!("{}: {} (payloads not touched)", r.bench, r.after);
            }
            println!(
                "{:<40} {:>10} {:>10} {:>12} {:>10} {:>9}",
                "case", "RTT p50", "RTT p95", "stream MB/s", "retrans", "timeouts"
            );
            for r in &results {
                println!(
                    "{:<40} {:>8.2}us {:>8.2}us {:>12.1} {:>10} {:>9}",
                    r.case,
                    r.rtt_median_us,
                    r.rtt_p95_us,
                    r.stream_mbytes_per_s,
                    r.retransmissions,
                    r.timeouts
                );
            }
        }
    }
    Ok(())
}

fn fabric_routes(path: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let topo = crate::fabric::load(path)?.topology;
    let lines = crate::fabric::route_lines(&topo);
    if json {
        for l in &lines {
            println!("{}", serde_json::to_string(l)?);
        }
        return Ok(());
    }
    println!(
        "{} nodes, {} switches, {} links; routes (up*/down*):",
        topo.nodes(),
        topo.switches().len(),
        topo.links().len()
    );
    for l in &lines {
        println!(
            "  {:>4} -> {:<4} via {}",
            l.src,
            l.dst,
            l.switches.join(" -> ")
        );
    }
    Ok(())
}

fn cluster_up(o: &ClusterOpts, name: &str, json: bool) -> anyhow::Result<()> {
    let dir = state_dir(name);
    let image = cluster_image(o, &mut |l| eprintln!("{l}"))?;
    let accel = crate::cluster::choose_accel(&image, o.accel, &mut |l| eprintln!("{l}"));
    let args = crate::cluster::supervisor::SuperviseArgs {
        dir: dir.clone(),
        nodes: o.nodes,
        accel: accel.into(),
        memory: o.memory,
        endpoints: o.endpoints,
        devices: o.devices,
    };
    eprintln!("cluster '{name}': booting {} guests ({accel})", o.nodes);
    let status = client::up(
        &dir,
        &image,
        &args,
        Duration::from_secs(o.timeout),
        &mut |l| eprintln!("{l}"),
    )?;
    if json {
        println!("{}", serde_json::to_string(&status)?);
    } else {
        eprintln!(
            "cluster '{name}' is up: {} nodes ({accel}); logs in {}\n  ulnic cluster exec all -- CMD    run a command\n  ulnic cluster put all FILE       copy a program in\n  ulnic cluster down               stop it",
            o.nodes,
            dir.display()
        );
    }
    Ok(())
}

fn cluster_exec(name: &str, target: &str, command: &str) -> anyhow::Result<()> {
    let dir = state_dir(name);
    let nodes = client::nodes_of(&dir, target)?;
    let results = client::exec(&dir, &nodes, command);
    let mut code = 0;
    for (n, r) in results {
        match r {
            Ok(0) => {}
            Ok(c) => {
                if nodes.len() > 1 {
                    eprintln!("[node {n}] exit {c}");
                }
                if code == 0 {
                    code = c;
                }
            }
            Err(e) => {
                eprintln!("[node {n}] {e}");
                if code == 0 {
                    code = 255;
                }
            }
        }
    }
    if code != 0 {
        // The remote status, like ssh (clamped into an exit code).
        std::process::exit(code.clamp(1, 255));
    }
    Ok(())
}

fn cluster_put(
    name: &str,
    target: &str,
    local: &std::path::Path,
    remote: Option<String>,
) -> anyhow::Result<()> {
    let dir = state_dir(name);
    let remote = match remote {
        Some(r) => r,
        None => format!(
            "/bin/{}",
            local
                .file_name()
                .ok_or_else(|| anyhow::anyhow!("the local path names no file"))?
                .to_string_lossy()
        ),
    };
    for n in client::nodes_of(&dir, target)? {
        client::put(&dir, n, local, &remote)?;
        eprintln!("[node {n}] {} -> {remote}", local.display());
    }
    Ok(())
}

fn cluster_status(name: &str, json: bool) -> anyhow::Result<()> {
    let s = crate::cluster::supervisor::status(&state_dir(name))?;
    if json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    println!("cluster '{name}' ({}), {}", s.accel, s.dir.display());
    for n in &s.nodes {
        println!(
            "  node {}: {}{}{}  boots {}  log {}",
            n.node,
            n.state,
            n.boot_seconds
                .map(|b| format!(" (booted in {b:.1} s)"))
                .unwrap_or_default(),
            n.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default(),
            n.boots,
            n.console_log.display()
        );
    }
    Ok(())
}

fn run_device(a: DeviceArgs) -> anyhow::Result<()> {
    let sockets = match &a.socket_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
            Configuration::socket_paths(dir, a.nodes)
        }
        None => a.socket.clone(),
    };
    let mut builder = Configuration::builder(sockets)
        .max_endpoints(a.endpoints)
        .poll_for(Duration::from_micros(a.poll_us))
        .tripwires(a.tripwires)
        .utlb_cache(a.utlb_cache.config());
    if let Some(t) = &a.topology {
        let fabric = crate::fabric::load(t)?;
        builder = builder.fabric(crate::fabric::file::join(
            fabric,
            a.member.as_deref(),
            a.key_file.as_deref(),
        )?);
    }
    let config = builder.engine_threads(a.engine_threads).build()?;
    let dev = std::sync::Arc::new(Device::start(config)?);
    let control = a.control.clone().or_else(|| {
        let dir = a.socket_dir.as_deref()?;
        Some(crate::control::socket_path(dir, a.member.as_deref()))
    });
    if let Some(path) = &control {
        crate::control::serve(dev.clone(), path)?;
        eprintln!(
            "ulnic: control socket {} (ulnic stats / fabric set / capture)",
            path.display()
        );
    }
    eprintln!(
        "ulnic: serving {} nodes, {} endpoints each (QEMU: num_vqs={}, config_size={}, virtio-id={}); Ctrl-C stops",
        dev.sockets().len(),
        a.endpoints,
        ulnic_abi::QUEUE_COUNT,
        ulnic_abi::CONFIG_SIZE,
        ulnic_abi::VIRTIO_ID_ULNIC
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// What goes into guest images from this host: this `ulnic` binary, and
/// the preload layer and C library built beside it (when they were).
fn image_tools() -> Vec<std::path::PathBuf> {
    let exe = std::env::current_exe().ok();
    let dir = exe
        .as_ref()
        .and_then(|e| e.parent().map(|d| d.to_path_buf()));
    let mut tools: Vec<std::path::PathBuf> = exe.into_iter().collect();
    for lib in ["libulnic_preload.so", "libulnic.so"] {
        if let Some(p) = dir.as_ref().map(|d| d.join(lib)).filter(|p| p.exists()) {
            tools.push(p);
        }
    }
    tools
}

/// The guests' image: the base one, with the packages and host
/// directories `o` asks for unpacked after it.
fn cluster_image(
    o: &ClusterOpts,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<ulnic_images::Image> {
    let r = ulnic_images::build(false, &image_tools(), say)?;
    let mut pieces = Vec::new();
    if !o.packages.is_empty() {
        say(&format!("[+] packages: {}", o.packages.join(", ")));
        pieces.push(ulnic_images::packages(&o.packages, say)?);
    }
    for a in &o.add {
        let (host, guest) = match a.split_once(':') {
            Some((h, g)) => (PathBuf::from(h), g.to_string()),
            None => {
                let h = PathBuf::from(a);
                let name = h
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .ok_or_else(|| anyhow::anyhow!("--add {a}: name a directory"))?;
                (h, format!("/opt/{name}"))
            }
        };
        anyhow::ensure!(
            host.is_dir(),
            "--add {a}: {} is not a directory",
            host.display()
        );
        say(&format!("[+] {} -> {guest}", host.display()));
        pieces.push(ulnic_images::directory_piece(&host, &guest)?);
    }
    Ok(ulnic_images::with_pieces(&r.image, &pieces)?)
}

/// Runs `command` on a cluster; returns each node's output lines.
fn run_cluster(o: &ClusterOpts, command: &str, quiet: bool) -> anyhow::Result<Vec<Vec<String>>> {
    let mut outputs: Vec<Vec<String>> = vec![Vec::new(); o.nodes as usize];
    let mut say = |l: &str| {
        if let Some(rest) = l.strip_prefix("[node ") {
            if let Some((n, text)) = rest.split_once("] ") {
                if let Ok(n) = n.parse::<usize>() {
                    if let Some(v) = outputs.get_mut(n) {
                        v.push(text.to_string());
                    }
                }
            }
        }
        if !quiet {
            eprintln!("{l}");
        }
    };
    let image = cluster_image(o, &mut |l| {
        if !quiet {
            eprintln!("{l}")
        }
    })?;
    let opts = crate::cluster::RunOptions {
        nodes: o.nodes,
        accel: o.accel,
        memory_mb: o.memory,
        timeout: Duration::from_secs(o.timeout),
        endpoints: o.endpoints,
        devices: o.devices,
    };
    let results = crate::cluster::run(&opts, &image, command, &mut say)?;
    let mut failed = 0;
    for r in &results {
        match &r.error {
            None => eprintln!(
                "[node {}] exit 0 (booted in {:.1} s)",
                r.node,
                r.boot_seconds.unwrap_or(0.0)
            ),
            Some(e) => {
                failed += 1;
                eprintln!(
                    "[node {}] FAILED: {e}\n  full console log: {}",
                    r.node,
                    r.console_log.display()
                );
            }
        }
    }
    if failed > 0 {
        return Err(anyhow::anyhow!(
            "{failed} of {} nodes failed",
            results.len()
        ));
    }
    Ok(outputs)
}

fn run_cluster_bench(
    o: &ClusterOpts,
    w: Workload,
    sizes: &[u32],
    iters: u64,
    mode: Mode,
    json: bool,
) -> anyhow::Result<()> {
    if o.nodes < 2 {
        return Err(anyhow::anyhow!(
            "a cluster benchmark needs --nodes 2 or more (nodes pair up: 0 with 1, 2 with 3, ...)"
        ));
    }
    // Every node takes part: pairs (0, 1), (2, 3), ... run at once, each
    // even node the client of the odd one after it.
    let pairs = o.nodes / 2;
    if !matches!(
        w,
        Workload::Pingpong | Workload::Stream | Workload::RdmaWrite
    ) {
        return Err(anyhow::anyhow!(
            "cluster bench runs pingpong, stream and rdma-write between guests, not {w:?}"
        ));
    }
    // Same VMs, same sizes: ulnic through the device, then kernel TCP over
    // the virtio-net segment. The script rides on the kernel command line,
    // so one shell function `b` holds what every line shares: the even
    // node of a pair is the client, its server the next node; a last odd
    // node sits out.
    let m = format!("{mode:?}").to_lowercase();
    let mut script = format!(
        "set -e\nP=$((ULNIC_NODE+1)); Q=$((ULNIC_NODE-1))\n\
         b() {{ if [ $ULNIC_NODE -ge {last} ]; then :; \
         elif [ $((ULNIC_NODE%2)) = 0 ]; then ulnic bench-peer --role client --workload $1 --transport $2 --size $3 --iters {iters} --mode {m} --at $4 --peer-node $P; \
         else ulnic bench-peer --role server --workload $1 --transport $2 --size $3 --iters {iters} --mode {m} --at $5 --peer-node $Q >/dev/null; fi; }}\n",
        last = pairs * 2
    );
    let wl = clap::ValueEnum::to_possible_value(&w)
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    for s in sizes {
        for (t, client_at, server_at) in
            [("ulnic", "device", "device"), ("tcp", "node=$P", "listen")]
        {
            // RDMA's baseline is a TCP stream of the same buffers.
            let wl = if t == "tcp" && w == Workload::RdmaWrite {
                "stream"
            } else {
                &wl
            };
            script.push_str(&format!("b {wl} {t} {s} {client_at} {server_at}\n"));
        }
    }
    let outputs = run_cluster(o, &script, json)?;
    if !json {
        print_header();
    }
    for (pair, lines) in outputs.iter().step_by(2).take(pairs as usize).enumerate() {
        if !json && pairs > 1 {
            println!("node {} -> node {}:", pair * 2, pair * 2 + 1);
        }
        for line in lines {
            let Some(rec) = line.strip_prefix("RESULT ") else {
                continue;
            };
            let r: bench::Record = serde_json::from_str(rec)?;
            if json {
                let mut v = serde_json::to_value(&r)?;
                v["where"] = "guests".into();
                v["pair"] = pair.into();
                v["pairs"] = pairs.into();
                v["devices"] = o.devices.into();
                println!("{v}");
            } else {
                print_record(&r, false);
            }
        }
    }
    Ok(())
}

/// `ulnic bench apps`: the programs between two host processes attached
/// to nodes 0 and 1 of a device this process starts, against loopback TCP.
fn run_apps_host(a: &BenchArgs) -> anyhow::Result<()> {
    use crate::bench::apps;
    anyhow::ensure!(
        a.device_dir.is_none(),
        "bench apps starts its own device (one connection is one endpoint: redis-benchmark's \
         --clients need as many), so it takes no --device-dir"
    );
    let scratch = tempfile::Builder::new().prefix("ulnic-apps-").tempdir()?;
    let nodes = apps::Attach::host_nodes(a.apps.apps.len(), a.apps.app_rounds);
    let sockets = Configuration::socket_paths(scratch.path(), nodes);
    let config = Configuration::builder(sockets.clone())
        .max_endpoints(apps_endpoints(&a.apps))
        .build()?;
    let device = Device::start(config)?;
    let quiet = a.json;
    let mut say = |l: &str| {
        if !quiet {
            eprintln!("{l}")
        }
    };
    let results = apps::run_local(&a.apps, &sockets, scratch.path(), &mut say);
    drop(device);
    let results = results?;
    let extra = serde_json::json!({"where": "host"});
    apps::print(&results, &a.apps, &extra, a.json);
    Ok(())
}

/// Endpoints a node needs for `bench apps`: one per connection (the
/// benchmark's, the servers' listeners, their accepted ones) with room
/// for connections still closing.
fn apps_endpoints(a: &crate::bench::apps::AppsArgs) -> u32 {
    (a.clients * 2 + 64).clamp(256, ulnic_abi::MAX_ENDPOINTS_LIMIT)
}

/// `ulnic cluster bench apps`: node 1 serves, node 0 runs the clients;
/// the guests get the programs' packages.
fn run_cluster_apps(
    o: &ClusterOpts,
    a: &crate::bench::apps::AppsArgs,
    json: bool,
) -> anyhow::Result<()> {
    use crate::bench::apps;
    anyhow::ensure!(
        o.nodes >= 2,
        "cluster bench apps needs --nodes 2 or more (node 1 serves, node 0 runs the clients)"
    );
    let mut o = ClusterOpts {
        packages: o.packages.clone(),
        add: o.add.clone(),
        ..*o
    };
    for p in a.apps.iter().flat_map(|app| app.packages()) {
        if !o.packages.iter().any(|q| q == p) {
            o.packages.push(p.to_string());
        }
    }
    let need = apps_endpoints(a);
    if o.endpoints < need {
        if !json {
            eprintln!(
                "ulnic: bench apps gives each guest {need} endpoints (one per connection), not {}",
                o.endpoints
            );
        }
        o.endpoints = need;
    }
    let args = apps_peer_args(a);
    let script = format!(
        "case $ULNIC_NODE in
         0) ulnic apps-peer --role client --peer-node 1 {args};;
         1) ulnic apps-peer --role server --peer-node 0 {args};;
         esac
"
    );
    let outputs = run_cluster(&o, &script, json)?;
    let mut results = Vec::new();
    for line in outputs.first().into_iter().flatten() {
        if let Some(rec) = line.strip_prefix("RESULT ") {
            results.push(serde_json::from_str::<apps::AppResult>(rec)?);
        }
    }
    anyhow::ensure!(!results.is_empty(), "node 0 reported no results");
    let extra = serde_json::json!({"where": "guests", "nodes": [0, 1]});
    apps::print(&results, a, &extra, json);
    Ok(())
}

/// The apps options again, as `ulnic apps-peer` takes them.
fn apps_peer_args(a: &crate::bench::apps::AppsArgs) -> String {
    let names: Vec<String> = a
        .apps
        .iter()
        .filter_map(|x| clap::ValueEnum::to_possible_value(x).map(|v| v.get_name().to_string()))
        .collect();
    format!(
        "--apps {} --requests {} --clients {} --seconds {} --app-rounds {}",
        names.join(","),
        a.requests,
        a.clients,
        a.seconds,
        a.app_rounds
    )
}

fn run_image_build(force: bool, json: bool) -> anyhow::Result<()> {
    // The guest gets this very binary (so `ulnic` runs the same inside),
    // the preload layer and the C library.
    let tools = image_tools();
    eprintln!(
        "ulnic: building the guest image in {}",
        ulnic_images::cache_dir().display()
    );
    let r = ulnic_images::build(force, &tools, &mut |line| eprintln!("{line}"))?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "image ready in {:.1} s ({}; {} packages, {:.1} MB fetched)\n  kernel    {} ({})\n  initramfs {}\n  qemu      {}",
            r.seconds,
            if r.rebuilt { "built" } else { "cached" },
            r.packages.len(),
            r.downloaded_bytes as f64 / 1e6,
            r.image.kernel.display(),
            r.image.kernel_release,
            r.image.initramfs.display(),
            r.image.qemu.version()
        );
    }
    Ok(())
}

/// `--size`'s default, as parsed.
const DEFAULT_SIZES: [u32; 6] = [0, 4, 40, 400, 4096, 65536];

fn default_iters(w: Workload, size: u32) -> u64 {
    match w {
        Workload::Pingpong => 5000,
        Workload::Stream => (256_000_000 / u64::from(size.max(1))).clamp(2000, 200_000),
        Workload::RdmaWrite | Workload::RdmaRead => {
            (512_000_000 / u64::from(size.max(1))).clamp(200, 100_000)
        }
        Workload::Tripwire => 2000,
        Workload::Dmq => 2000,
        Workload::Utlb => 20_000,
        Workload::Compare | Workload::Apps => 2000,
    }
}

/// Prints one result line: JSON, or a row of the table.
/// The human table's header: fabtests' columns (bytes, iters, total,
/// time, MB/s, usec/xfer, Mxfers/s), then the latency percentiles.
fn print_header() {
    println!(
        "{:<12} {:<6} {:<5} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9} {:>9} {:>9}",
        "bench",
        "trans",
        "mode",
        "bytes",
        "iters",
        "total",
        "time",
        "MB/s",
        "usec/xfer",
        "Mxfers/s",
        "p50_us",
        "p95_us"
    );
}

/// Bytes in human units, as fabtests prints them (1k = 1024).
fn human_bytes(b: f64) -> String {
    let units = ["", "k", "m", "g", "t"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0}")
    } else {
        format!("{v:.0}{}", units[u])
    }
}

/// One result: a JSON object with `--json`, else a table row.
fn print_record(r: &bench::Record, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
        return;
    }
    let total = f64::from(r.size) * r.iters as f64;
    let secs = r.seconds.unwrap_or(0.0);
    let per = |v: f64| if secs > 0.0 { v / secs } else { 0.0 };
    let mbps = r.mbytes_per_s.unwrap_or_else(|| per(total) / 1e6);
    let usec = |v: Option<u64>| {
        v.map(|ns| format!("{:.2}", ns as f64 / 1e3))
            .unwrap_or_default()
    };
    println!(
        "{:<12} {:<6} {:<5} {:>8} {:>8} {:>8} {:>7.2}s {:>9.1} {:>10.2} {:>9.3} {:>9} {:>9}",
        r.bench,
        r.transport,
        r.mode,
        r.size,
        r.iters,
        human_bytes(total),
        secs,
        mbps,
        if r.iters > 0 {
            secs * 1e6 / r.iters as f64
        } else {
            0.0
        },
        per(r.iters as f64) / 1e6,
        usec(r.median_ns),
        usec(r.p95_ns),
    );
}

/// The one-process workloads (RDMA, tripwire, DMQ): per size, the ulnic
/// lines and their baseline from the same run. Returns whether something
/// failed.
fn run_rdma_bench(a: &BenchArgs, dir: &std::path::Path) -> bool {
    use crate::bench::rdma::{self as bench_rdma, Direction};
    // The message-size default means nothing here: each workload has its own.
    if a.workload == Workload::Utlb {
        return run_utlb_bench(a, dir);
    }
    let sizes: Vec<u32> = match a.workload {
        Workload::Tripwire => vec![8], // one word is written
        _ if a.size != DEFAULT_SIZES => a.size.clone(),
        Workload::Dmq => vec![8, 1024, 16384],
        _ => vec![4096, 16384, 65536, 262144, 1 << 20],
    };
    let mut failed = false;
    for size in sizes {
        let iters = a.iters.unwrap_or(default_iters(a.workload, size));
        let lines: std::io::Result<Vec<bench::Record>> = match a.workload {
            Workload::Tripwire => bench_rdma::tripwire_line(iters, dir)
                .and_then(|u| Ok(vec![u, bench_rdma::unix_wake_line(iters)?])),
            Workload::Dmq => bench_rdma::dmq_lines(size, iters, dir),
            w if size == 0 || size > ulnic_abi::MAX_RDMA => Err(std::io::Error::other(format!(
                "{w:?} sizes are 1..={} bytes",
                ulnic_abi::MAX_RDMA
            ))),
            w => {
                let d = if w == Workload::RdmaWrite {
                    Direction::Write
                } else {
                    Direction::Read
                };
                bench_rdma::ulnic_line(d, size, iters, dir)
                    .map(|u| vec![u, bench_rdma::memcpy_line(d, size, iters)])
            }
        };
        match lines {
            Ok(lines) => lines.iter().for_each(|r| print_record(r, a.json)),
            Err(e) => {
                failed = true;
                eprintln!("ulnic: {:?} at {size} bytes: {e}", a.workload);
            }
        }
    }
    failed
}

/// `bench utlb`: the translation cost table, then the stress sweep;
/// inside a guest (its device file present, no --device-dir) through the
/// kernel driver, sender and receiver on this node.
fn run_utlb_bench(a: &BenchArgs, dir: &std::path::Path) -> bool {
    use crate::bench::utlb as bench_utlb;
    let dir = (!in_guest(a)).then_some(dir);
    let mut failed = false;
    let mut report = |what: String, lines: std::io::Result<Vec<bench::Record>>| match lines {
        Ok(lines) => lines.iter().for_each(|r| print_record(r, a.json)),
        Err(e) => {
            failed = true;
            eprintln!("ulnic: utlb {what}: {e}");
        }
    };
    let iters = a.iters.unwrap_or(default_iters(Workload::Utlb, 0));
    for pages in [1, 4, 16] {
        report(
            format!("table, {pages} pages"),
            bench_utlb::table_lines(pages, iters, dir),
        );
    }
    let sizes = if a.size == DEFAULT_SIZES {
        vec![512, 2048]
    } else {
        a.size.clone()
    };
    for size in sizes {
        for &n in &a.buffers {
            report(
                format!("stress, {size} bytes from {n} buffers"),
                bench_utlb::stress_lines(size, n, a.utlb_entries, iters, dir),
            );
        }
    }
    failed
}

/// Whether `bench utlb` runs through this guest's kernel driver.
fn in_guest(a: &BenchArgs) -> bool {
    a.workload == Workload::Utlb
        && a.device_dir.is_none()
        && std::path::Path::new(
            &std::env::var_os("ULNIC_DEVICE").unwrap_or_else(|| "/dev/ulnic0".into()),
        )
        .exists()
}

/// `ulnic bench compare`: ulnic against the baselines and Debian's peers.
fn run_compare(
    a: &BenchArgs,
    dir: &std::path::Path,
    scratch: &std::path::Path,
) -> anyhow::Result<()> {
    use crate::bench::compare::{compare, Options};
    anyhow::ensure!(a.rounds > 0, "--rounds must be at least 1");
    // Without --size: 8-byte and 64 KiB round trips, 8-byte blocking
    // round trips and message rate, 64 KiB streams and RDMA writes (the
    // rows of the performance issue's table); with it, every section at
    // those sizes.
    let given = a.size != DEFAULT_SIZES;
    let sizes = |default: &[u32]| {
        if given {
            a.size.clone()
        } else {
            default.to_vec()
        }
    };
    // The endpoints section: round trips with thousands of endpoints open
    // on each node against one, on a device whose nodes have room for
    // them (or on the one given with --device-dir).
    let many = if a.endpoints > 1 {
        a.endpoints
    } else {
        ulnic_abi::MAX_ENDPOINTS_LIMIT
    };
    let mut _endpoints_device = None;
    let endpoints_dir = match &a.device_dir {
        Some(d) => d.clone(),
        None => {
            let d = scratch.join("endpoints");
            std::fs::create_dir_all(&d)?;
            let config = Configuration::builder(Configuration::socket_paths(&d, 2))
                .max_endpoints((many + 4).min(ulnic_abi::MAX_ENDPOINTS_LIMIT))
                .build()?;
            _endpoints_device = Some(Device::start(config)?);
            d
        }
    };
    let o = Options {
        pingpong_sizes: sizes(&[8, 65536]),
        block_sizes: sizes(&[8]),
        stream_sizes: sizes(&[65536]),
        rate_sizes: sizes(&[8]),
        rdma_sizes: sizes(&[65536]),
        endpoint_sizes: sizes(&[8]),
        rounds: a.rounds,
        iters: a.iters.unwrap_or(2000),
        stream_iters: a.iters.unwrap_or(3000),
        rate_iters: a.iters.unwrap_or(100_000),
        touch: a.payload,
        endpoints: Some((many, endpoints_dir)),
        guests: a.guests,
    };
    let rows = compare(&o, dir, scratch, &mut |l| eprintln!("{l}"))?;
    if a.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    println!(
        "compare: {} interleaved rounds; each figure the median of the rounds; ulnic/peer the median of each round's ratio",
        a.rounds
    );
    println!(
        "{:<11} {:>6}  {:<21} {:<16} {:<7} {:>14}  {:>10}",
        "workload", "bytes", "peer", "payload", "stat", "figure", "ulnic/peer"
    );
    for r in &rows {
        let figure = r.value.map_or("-".into(), |v| r.workload.show(v));
        let ratio = r.ulnic_ratio.map_or("-".into(), |x| format!("{x:.2}x"));
        let size = if r.workload == crate::bench::compare::Kind::ClusterUp {
            "-".to_string()
        } else {
            r.size.to_string()
        };
        println!(
            "{:<11} {:>6}  {:<21} {:<16} {:<7} {:>14}  {:>10}{}",
            r.workload.label(),
            size,
            r.peer,
            r.payload,
            r.statistic,
            figure,
            ratio,
            r.missing
                .as_ref()
                .map_or(String::new(), |m| format!("  missing: {m}"))
        );
    }
    println!("(pingpong, block-cpu, endpoints and vm-pingpong: ulnic/peer below 1 is ulnic ahead (endpoints: RTT with the many over RTT with one); stream, rate and rdma-write: above 1 is. block-cpu: user+system time of both peers and the device per round trip, warm-up and start-up included; cluster-up: seconds until every guest is ready, guest image cached)");
    Ok(())
}

fn run_bench(a: BenchArgs) -> anyhow::Result<()> {
    if a.workload == Workload::Apps {
        return run_apps_host(&a);
    }
    // Sockets, shm files and the device of this run; removed when done.
    let scratch_dir = tempfile::Builder::new()
        .prefix("ulnic-bench-")
        .tempdir()
        .map_err(|e| anyhow::anyhow!("cannot make a scratch directory: {e}"))?;
    let scratch = scratch_dir.path().to_path_buf();
    let mut own = None;
    let dir = match &a.device_dir {
        Some(d) => d.clone(),
        None if a.transport.contains(&Transport::Ulnic) && !in_guest(&a) => {
            let config = Configuration::builder(Configuration::socket_paths(&scratch, 2))
                .max_endpoints((a.endpoints + 4).min(ulnic_abi::MAX_ENDPOINTS_LIMIT))
                .utlb_cache(a.utlb_cache.config())
                .build()?;
            own = Some(Device::start(config)?);
            scratch.clone()
        }
        None => scratch.clone(),
    };
    if a.workload == Workload::Compare {
        return run_compare(&a, &dir, &scratch);
    }

    anyhow::ensure!(
        a.corrupt_at.is_none() || a.payload == crate::bench::payload::Touch::WriteVerify,
        "--corrupt-at needs --payload write+verify: only a receiver that checks can catch the flipped byte"
    );
    if !a.json {
        print_header();
    }
    let mut failed = false;
    if a.workload.is_rdma() {
        failed = run_rdma_bench(&a, &dir);
    }
    for &size in &a.size {
        for &t in &a.transport {
            if a.workload.is_rdma() {
                break; // done above: ulnic and memcpy lines per size
            }
            let spec = Spec {
                workload: a.workload,
                transport: t,
                size,
                iters: a.iters.unwrap_or(default_iters(a.workload, size)),
                mode: a.mode,
                corrupt_at: a.corrupt_at,
                nodes: a.nodes,
                payload: a.payload,
                endpoints: a.endpoints,
            };
            let progress = !a.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
            if progress {
                eprint!("running {:?} over {:?}, {} bytes...\r", a.workload, t, size);
            }
            let result = bench::run_one(&spec, &dir, &scratch);
            if progress {
                eprint!("{:60}\r", "");
            }
            match result {
                Ok(r) => print_record(&r, a.json),
                Err(e) => {
                    failed = true;
                    eprintln!(
                        "ulnic: {:?} over {:?} at {} bytes failed: {e}",
                        a.workload, t, size
                    );
                }
            }
        }
    }
    drop(own);
    drop(scratch_dir);
    if failed {
        Err(anyhow::anyhow!("some benchmarks failed"))
    } else {
        Ok(())
    }
}
