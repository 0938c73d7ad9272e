//! A node serves connection after connection without keeping a file
//! descriptor from each: the vhost_user fuzz target found one eventfd
//! leaked per connection (vhost-user-backend 0.24 never closes the exit
//! eventfd it is given), which ran the device out of descriptors after about
//! 20,000 frontends. Alone in its binary: it counts this process's fds.
use ulnic_testkit as common;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// This process's open descriptors once node 0's thread waits in accept
/// for its next frontend, its next connection's daemon made: counted at
/// the same point every time (counting while that daemon is being made
/// would see its descriptors come and go).
fn settled_fds() -> usize {
    let tid = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| t.ok())
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "ulnic-node0")
        })
        .and_then(|t| t.file_name().to_str()?.parse().ok())
        .expect("the node thread");
    common::until_blocked(tid);
    open_fds()
}

/// Connects to node 0, leaves at once, and waits until the device let go.
fn connect_and_leave(dev: &ulnic_device::Device) {
    let before = dev.shard().lock().nodes[0].connections;
    drop(UnixStream::connect(common::socket(dev, 0)).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        {
            let f = dev.shard().lock();
            let n = &f.nodes[0];
            if n.connections > before && n.disconnect.is_none() {
                return;
            }
        }
        assert!(Instant::now() < deadline, "node 0 never released");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn connections_leave_no_descriptors_behind() {
    let dev = common::device(1);
    connect_and_leave(&dev);
    let before = settled_fds();
    for _ in 0..200 {
        connect_and_leave(&dev);
    }
    let after = settled_fds();
    assert!(
        after <= before + 2,
        "{} descriptors more after 200 connections ({before} -> {after})",
        after.saturating_sub(before)
    );
}
