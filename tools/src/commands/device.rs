//! `ulnic device`: runs the NIC model (`ulnic-device`) with one vhost-user
//! socket per node, optionally a fabric from a topology file, and the
//! control socket `ulnic stats`, `fabric set` and `capture` use.

use std::path::PathBuf;
use std::time::Duration;

use ulnic_device::{Configuration, Device};

/// `ulnic device`'s options.
#[derive(clap::Args, Debug)]
pub struct DeviceArgs {
    /// Directory for the node sockets: DIR/node0.sock, DIR/node1.sock, ...
    #[arg(long, value_name = "DIR", required_unless_present = "socket")]
    pub socket_dir: Option<PathBuf>,
    /// Number of nodes (sockets) to create in --socket-dir.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub nodes: u32,
    /// Explicit socket path for a node; repeat for more. Socket i is node i.
    #[arg(long, value_name = "PATH", conflicts_with = "socket_dir")]
    pub socket: Vec<PathBuf>,
    /// Endpoints per node, 1 to 4096 (the node's 64 virtqueues do not
    /// depend on it: give QEMU num_vqs=64). The device polls at most 64
    /// of them; the others ring a doorbell when they send (spec §5.8).
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_ENDPOINTS, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(ulnic_abi::MAX_ENDPOINTS_LIMIT)))]
    pub endpoints: u32,
    /// Microseconds the data-path engine keeps polling after its last work
    /// before it sleeps and asks drivers for doorbells.
    #[arg(long, default_value_t = ulnic_device::config::DEFAULT_POLL_US, value_name = "US")]
    pub poll_us: u64,
    /// Tripwires each endpoint may set (their fired flags live in the
    /// endpoint's control block, so at most 3072).
    #[arg(long, default_value_t = ulnic_abi::DEFAULT_TRIPWIRES, value_name = "N")]
    pub tripwires: u32,
    /// Each frontend's PIO aperture in MiB (docs/spec.md §6.2): the
    /// shared-memory region PIO windows are mapped into (a guest's BAR 4).
    /// A power of two from 1 to 1024; 0 turns PIO windows off.
    #[arg(long, default_value_t = ulnic_abi::DEFAULT_PIO_APERTURE >> 20, value_name = "MIB")]
    pub pio_aperture: u64,
    #[command(flatten)]
    pub utlb_cache: UtlbCacheArgs,
    /// Emulate the fabric this topology file describes (docs/spec.md
    /// §10): messages between nodes cross its links as packets, under
    /// the reliable transport, with the file's faults. Without it, nodes
    /// are one copy apart.
    #[arg(long, value_name = "FILE")]
    pub topology: Option<PathBuf>,
    /// The control socket `ulnic stats`, `ulnic fabric set` and `ulnic
    /// capture` use (default: DIR/control.sock with --socket-dir, or
    /// DIR/control-MEMBER.sock with --member; none with --socket unless
    /// given).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// With a topology whose [[device]] entries spread it over several
    /// device processes: which of them this is. It serves the nodes on
    /// its own switches and reaches the rest over UDP.
    #[arg(long, value_name = "NAME", requires = "topology")]
    pub member: Option<String>,
    /// Engine threads. More than one splits the data path by switch
    /// (needs --topology with at least that many switches): each thread
    /// serves its switches and their nodes, with queues between them.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub engine_threads: u32,
    /// The fabric's secret (any file of at least 16 bytes, the same on
    /// every member, e.g. `head -c 32 /dev/urandom > key`): every UDP
    /// datagram carries an HMAC-SHA256 under it.
    #[arg(long, value_name = "FILE", requires = "member")]
    pub key_file: Option<PathBuf>,
}

// `ulnic bench` takes the same options for the device it starts.
/// The device's UTLB translation cache (VMMC-2's NI cache).
#[derive(clap::Args, Debug, Clone)]
pub struct UtlbCacheArgs {
    /// Lines in the device's UTLB translation cache (VMMC-2: 8192).
    #[arg(long, default_value_t = ulnic_abi::DEFAULT_UTLB_CACHE, value_name = "N")]
    pub utlb_cache_entries: u32,
    /// Lines per set: 1 is direct-mapped (VMMC-2), N fully associative.
    #[arg(long, default_value_t = 1, value_name = "WAYS")]
    pub utlb_cache_ways: u32,
    /// Which line of a full set a miss replaces.
    #[arg(long, value_enum, default_value_t = UtlbReplacement::Lru)]
    pub utlb_replacement: UtlbReplacement,
}

/// `--utlb-replacement`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UtlbReplacement {
    /// Least recently used.
    Lru,
    /// Pseudo-random.
    Random,
}

impl UtlbCacheArgs {
    /// The device's cache configuration.
    pub fn config(&self) -> ulnic_device::nic::utlb::CacheConfig {
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

/// Runs the device until the process is stopped.
pub fn run(a: DeviceArgs) -> anyhow::Result<()> {
    let config = configuration(&a)?;
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

/// The device's configuration from the options (creating --socket-dir).
fn configuration(a: &DeviceArgs) -> anyhow::Result<Configuration> {
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
        .pio_aperture(a.pio_aperture.saturating_mul(1 << 20))
        .utlb_cache(a.utlb_cache.config());
    if let Some(t) = &a.topology {
        let fabric = crate::fabric::load(t)?;
        builder = builder.fabric(crate::fabric::file::join(
            fabric,
            a.member.as_deref(),
            a.key_file.as_deref(),
        )?);
    }
    Ok(builder.engine_threads(a.engine_threads).build()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<DeviceArgs, clap::Error> {
        let mut all = vec!["device"];
        all.extend_from_slice(args);
        match try_parse(&all)? {
            Cmd::Device(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let a = parse(&["--socket-dir", "/tmp/u"]).unwrap();
        assert_eq!(a.socket_dir, Some(PathBuf::from("/tmp/u")));
        assert_eq!((a.nodes, a.engine_threads), (2, 1));
        assert_eq!(a.endpoints, ulnic_device::config::DEFAULT_ENDPOINTS);
        assert_eq!(a.poll_us, ulnic_device::config::DEFAULT_POLL_US);
        assert_eq!(a.tripwires, ulnic_abi::DEFAULT_TRIPWIRES);
        assert!(a.socket.is_empty() && a.topology.is_none() && a.control.is_none());
        assert!(a.member.is_none() && a.key_file.is_none());
        let c = a.utlb_cache.config();
        assert_eq!((c.entries, c.ways), (ulnic_abi::DEFAULT_UTLB_CACHE, 1));
        assert_eq!(c.replacement, ulnic_device::nic::utlb::Replacement::Lru);
    }

    #[test]
    fn sockets_by_directory_or_by_path() {
        let a = parse(&["--socket", "/a.sock", "--socket", "/b.sock"]).unwrap();
        assert_eq!(
            a.socket,
            [PathBuf::from("/a.sock"), PathBuf::from("/b.sock")]
        );
        assert_eq!(a.socket_dir, None);
        let e = parse(&[]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        assert!(e.to_string().contains("--socket-dir <DIR>"), "{e}");
        let e = parse(&["--socket-dir", "/d", "--socket", "/a.sock"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn members_need_a_topology_and_keys_a_member() {
        let a = parse(&[
            "--socket-dir",
            "/d",
            "--topology",
            "t.toml",
            "--member",
            "d1",
            "--key-file",
            "k",
        ])
        .unwrap();
        assert_eq!(a.member.as_deref(), Some("d1"));
        assert_eq!(a.key_file, Some(PathBuf::from("k")));
        for args in [
            &["--socket-dir", "/d", "--member", "d1"][..],
            &["--socket-dir", "/d", "--topology", "t", "--key-file", "k"],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument, "{args:?}");
        }
    }

    #[test]
    fn ranges_and_choices() {
        let a = parse(&[
            "--socket-dir",
            "/d",
            "--endpoints",
            "4096",
            "--utlb-cache-entries",
            "64",
            "--utlb-cache-ways",
            "4",
            "--utlb-replacement",
            "random",
        ])
        .unwrap();
        assert_eq!(a.endpoints, 4096);
        let c = a.utlb_cache.config();
        assert_eq!((c.entries, c.ways), (64, 4));
        assert_eq!(c.replacement, ulnic_device::nic::utlb::Replacement::Random);
        let e = parse(&["--socket-dir", "/d", "--endpoints", "0"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        assert!(e.to_string().contains("0 is not in 1..=4096"), "{e}");
        let e = parse(&["--socket-dir", "/d", "--utlb-replacement", "fifo"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert!(
            e.to_string().contains("[possible values: lru, random]"),
            "{e}"
        );
    }

    #[test]
    fn the_configuration_makes_the_socket_directory() {
        let dir = tempfile::tempdir().unwrap();
        let sockets = dir.path().join("new");
        let a = parse(&["--socket-dir", sockets.to_str().unwrap(), "--nodes", "3"]).unwrap();
        configuration(&a).unwrap();
        assert!(sockets.is_dir());
    }
}
