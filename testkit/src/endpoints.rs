//! Endpoints through the library: many small ones, the next event, a
//! message exchanged to show nodes still serve, a node attached again.

use std::time::Duration;

use ulnic_device::Device;

use crate::device::socket;

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

/// The next message `ep` receives, waiting up to 10 s.
pub fn next_message(ep: &mut ulnic::Endpoint) -> ulnic::Received {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(m) = ep.poll_recv() {
            return m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no message within 10 s"
        );
        ep.wait(Duration::from_millis(50)).unwrap();
    }
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
    let m = next_message(&mut eb);
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
