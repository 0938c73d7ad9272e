//! Shared helpers: a device on temporary sockets.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use ulnic_device::{Configuration, Device};

/// A device with `nodes` ports in a fresh temporary directory.
pub fn device(nodes: u32) -> (Device, tempdir::TempDir) {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempdir::TempDir::new();
    let config = Configuration {
        sockets: Configuration::socket_paths(&dir.0, nodes),
        max_endpoints: 8,
        poll_for: Duration::from_micros(200),
        tripwires: ulnic_abi::DEFAULT_TRIPWIRES,
        utlb_cache: Default::default(),
    };
    (Device::start(config).expect("device starts"), dir)
}

pub fn socket(dev: &Device, node: usize) -> PathBuf {
    dev.sockets()[node].clone()
}

pub mod tempdir {
    use std::path::PathBuf;
    /// A directory removed on drop.
    pub struct TempDir(pub PathBuf);
    impl TempDir {
        pub fn new() -> Self {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "ulnic-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
