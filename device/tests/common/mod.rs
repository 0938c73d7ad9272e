//! Shared helpers: a device on temporary sockets.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use ulnic_device::{Configuration, ConfigurationBuilder, Device};

pub mod raw;

/// A device with `nodes` nodes on sockets in a fresh temporary directory
/// (removed when the returned guard drops).
pub fn device(nodes: u32) -> (Device, tempfile::TempDir) {
    device_polling_for(nodes, Duration::from_micros(200))
}

/// As `device`, with an engine that polls for `poll_for` after its last
/// work before it sleeps.
pub fn device_polling_for(nodes: u32, poll_for: Duration) -> (Device, tempfile::TempDir) {
    device_with(nodes, |b| b.poll_for(poll_for))
}

/// As `device`, with the configuration's other settings from `set`.
pub fn device_with(
    nodes: u32,
    set: impl FnOnce(ConfigurationBuilder) -> ConfigurationBuilder,
) -> (Device, tempfile::TempDir) {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::Builder::new()
        .prefix("ulnic-test-")
        .tempdir()
        .unwrap();
    let builder = Configuration::builder(Configuration::socket_paths(dir.path(), nodes));
    let config = set(builder).build().expect("a valid configuration");
    (Device::start(config).expect("device starts"), dir)
}

pub fn socket(dev: &Device, node: usize) -> PathBuf {
    dev.sockets()[node].clone()
}

/// `n` endpoints of `pd` with the smallest rings (2 entries each, a 2-page
/// control region and a 1-page segment), bound to ports `first_port..`:
/// where a test needs many.
pub fn small_endpoints(
    pd: &ulnic::ProtectionDomain,
    n: u32,
    first_port: u32,
) -> Vec<ulnic::Endpoint> {
    let small = ulnic::EndpointConfig {
        send_entries: 2,
        recv_entries: 2,
        free_entries: 2,
        segment_bytes: 4096,
    };
    (0..n)
        .map(|i| {
            let mut e = pd.create_endpoint(&small).unwrap();
            e.bind(first_port + i).unwrap();
            e
        })
        .collect()
}

/// The next event of `ep`, waiting up to 10 s.
pub fn next_event(ep: &mut ulnic::Endpoint) -> ulnic::Event {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(e) = ep.poll_event() {
            return e;
        }
        assert!(std::time::Instant::now() < deadline, "no event within 10 s");
        ep.wait(Duration::from_millis(100)).unwrap();
    }
}

/// A two-node device and a host attachment to each node. Bind as
/// `let (_dir, _dev, a, b)`: the attachments drop first, the directory last.
pub fn two_nodes() -> (tempfile::TempDir, Device, ulnic::Nic, ulnic::Nic) {
    let (dev, dir) = device(2);
    let a = ulnic::Nic::attach(&socket(&dev, 0)).unwrap();
    let b = ulnic::Nic::attach(&socket(&dev, 1)).unwrap();
    (dir, dev, a, b)
}

/// A raw vhost-user frontend on `path` that has negotiated version 1,
/// protocol features and messaging, and the protocol features of
/// `protocols` the device offers: where tests speak vhost-user themselves.
pub fn frontend(
    path: &std::path::Path,
    protocols: vhost::vhost_user::message::VhostUserProtocolFeatures,
) -> vhost::vhost_user::Frontend {
    use vhost::vhost_user::message::VhostUserVirtioFeatures;
    use vhost::vhost_user::{Frontend, VhostUserFrontend};
    use vhost::VhostBackend;
    let mut fe = Frontend::connect(path, 64).unwrap();
    let features = fe.get_features().unwrap();
    fe.set_owner().unwrap();
    fe.set_features(
        (1 << 32)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | (features & ulnic_abi::F_MESSAGING),
    )
    .unwrap();
    let pf = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(pf & protocols).unwrap();
    fe
}

/// Node `from` sends a message to node `to` through fresh attachments and
/// endpoints, and `to` receives it: the device still serves those nodes.
pub fn exchange(dev: &Device, from: usize, to: usize) {
    use ulnic::{Address, EndpointConfig, Nic};
    let a = Nic::attach(&socket(dev, from)).unwrap();
    let b = Nic::attach(&socket(dev, to)).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut ea = pa.create_endpoint(&EndpointConfig::default()).unwrap();
    let mut eb = pb.create_endpoint(&EndpointConfig::default()).unwrap();
    ea.bind(11).unwrap();
    eb.bind(12).unwrap();
    let dest = Address {
        node: to as u32,
        port: 12,
    };
    ea.post_send_inline(dest, 3, b"still here", 1).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let m = loop {
        if let Some(m) = eb.poll_recv() {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no message within 10 s"
        );
        eb.wait(Duration::from_millis(50)).unwrap();
    };
    assert_eq!((m.src.node, m.src.port, m.len), (from as u32, 11, 10));
}

/// Attaches to node `node` once the device has seen its last frontend
/// leave (a node serves one at a time), waiting up to 10 s.
pub fn attach_again(dev: &Device, node: usize) -> ulnic::Nic {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match ulnic::Nic::attach(&socket(dev, node)) {
            Ok(nic) => return nic,
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "node {node} unusable: {e}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The calling thread's id, for [`until_blocked`].
pub fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Waits (up to 10 s) until thread `tid` of this process sleeps, state `S`
/// in /proc/self/task/TID/stat: a thread about to block in a call is then
/// blocked in it. Readiness by observation, not by a guessed sleep.
pub fn until_blocked(tid: i32) {
    let path = format!("/proc/self/task/{tid}/stat");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(&path).unwrap();
        // The state follows the command name, which is in parentheses.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state == Some('S') {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "thread {tid} did not block (state {state:?})"
        );
        std::thread::yield_now();
    }
}
