//! Shared helpers: a device on temporary sockets, in the test process.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use ulnic_device::{Configuration, Device};

/// A device with `nodes` ports on sockets in a fresh temporary directory
/// (removed when the returned guard drops).
pub fn device(nodes: u32) -> (Device, tempfile::TempDir) {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::Builder::new()
        .prefix("ulnic-test-")
        .tempdir()
        .unwrap();
    let config = Configuration::builder(Configuration::socket_paths(dir.path(), nodes))
        .poll_for(Duration::from_micros(200))
        .build()
        .expect("a valid configuration");
    (Device::start(config).expect("device starts"), dir)
}

/// The socket of port `node`.
pub fn socket(dev: &Device, node: usize) -> PathBuf {
    dev.sockets()[node].clone()
}
