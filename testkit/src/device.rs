//! A device in the test's process, on sockets in a temporary directory
//! that outlives it, and the facts its counters give a test to wait on.

use std::path::PathBuf;
use std::time::Duration;

use ulnic_device::shard::snapshot::EndpointSnapshot;
use ulnic_device::{Configuration, ConfigurationBuilder, Device};

use crate::wait::eventually;

/// A device and the directory of its sockets. The fields drop in order:
/// the device stops while its sockets still exist, then the directory
/// goes. Derefs to the [`Device`].
pub struct TestDevice {
    /// The device.
    pub dev: Device,
    /// Its sockets' directory.
    pub dir: tempfile::TempDir,
}

impl std::ops::Deref for TestDevice {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.dev
    }
}

impl TestDevice {
    /// Node `n`'s vhost-user socket.
    pub fn socket(&self, n: usize) -> PathBuf {
        socket(&self.dev, n)
    }
}

/// A device with `nodes` nodes on sockets in a fresh temporary directory.
pub fn device(nodes: u32) -> TestDevice {
    device_polling_for(nodes, Duration::from_micros(200))
}

/// As `device`, with an engine that polls for `poll_for` after its last
/// work before it sleeps.
pub fn device_polling_for(nodes: u32, poll_for: Duration) -> TestDevice {
    device_with(nodes, |b| b.poll_for(poll_for))
}

/// Endpoints a node of a test device has unless a test says otherwise.
pub const TEST_ENDPOINTS: u32 = 8;

/// As `device`, with the configuration's other settings from `set`.
pub fn device_with(
    nodes: u32,
    set: impl FnOnce(ConfigurationBuilder) -> ConfigurationBuilder,
) -> TestDevice {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::Builder::new()
        .prefix("ulnic-test-")
        .tempdir()
        .unwrap();
    // Test devices have 8 endpoints a node unless `set` says otherwise
    // (the product's default is larger): conformance tests name slots past
    // the last one and fill a node on purpose.
    let builder = Configuration::builder(Configuration::socket_paths(dir.path(), nodes))
        .max_endpoints(TEST_ENDPOINTS);
    let config = set(builder).build().expect("a valid configuration");
    TestDevice {
        dev: Device::start(config).expect("device starts"),
        dir,
    }
}

/// Node `node`'s socket.
pub fn socket(dev: &Device, node: usize) -> PathBuf {
    dev.sockets()[node].clone()
}

/// A two-node device and a host attachment to each node. Bind as
/// `let (_dev, a, b)`: the attachments drop first, then the device, then
/// its directory.
pub fn two_nodes() -> (TestDevice, ulnic::Nic, ulnic::Nic) {
    let dev = device(2);
    let a = ulnic::Nic::attach(&dev.socket(0)).unwrap();
    let b = ulnic::Nic::attach(&dev.socket(1)).unwrap();
    (dev, a, b)
}

/// The counters of the endpoint of node `node` bound to `port`, if there
/// is one.
pub fn endpoint_on(dev: &Device, node: usize, port: u32) -> Option<EndpointSnapshot> {
    dev.snapshot().nodes[node]
        .endpoints
        .iter()
        .find(|e| e.port == Some(port))
        .cloned()
}

/// Waits (up to `timeout`) until an endpoint of node `node` is bound to
/// `port`: a program's receiver or listener is ready. Returns its counters.
pub fn wait_bound(dev: &Device, node: usize, port: u32, timeout: Duration) -> EndpointSnapshot {
    eventually(
        timeout,
        &format!("an endpoint of node {node} bound to port {port:#x}"),
        || endpoint_on(dev, node, port),
    )
}

/// Counter `name` (one of `ulnic_abi::STAT_NAMES`) of endpoint `e`.
pub fn stat(e: &EndpointSnapshot, name: &str) -> u64 {
    let i = ulnic_abi::STAT_NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("no counter {name}"));
    e.stats[i]
}
