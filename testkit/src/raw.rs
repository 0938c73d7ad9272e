//! Speaking to the device below the library: a vhost-user frontend of
//! the test's own, raw control commands and hand-built endpoints, for
//! tests that write descriptors and rings themselves (hostile and refused
//! inputs).

use std::time::{Duration, Instant};
use ulnic_abi::{cmd, ctrl, status, CreateEndpoint, EventRecord, RingLayout};
use ulnic_host_attach::{DmaBuffer, Error, HostAttach, ProtectionDomain};

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

/// The status a raw command's result carries.
pub fn status_of(r: Result<Vec<u8>, Error>) -> u32 {
    match r {
        Ok(_) => status::OK,
        Err(Error::Command { status, .. }) => status,
        Err(e) => panic!("unexpected error {e}"),
    }
}

/// A protection domain made by a raw CREATE_PD.
pub fn create_pd(hw: &HostAttach) -> ProtectionDomain {
    hw.create_pd().unwrap()
}

/// BIND_PORT of endpoint `ep` to `port`, which must succeed.
pub fn bind(hw: &HostAttach, ep: u32, port: u32) {
    let mut p = ep.to_le_bytes().to_vec();
    p.extend_from_slice(&port.to_le_bytes());
    hw.command(cmd::BIND_PORT, &p).unwrap();
}

/// An endpoint built by hand, so the test can write raw descriptors.
pub struct RawEp {
    pub id: u32,
    /// Its protection domain (for its doorbell).
    pub domain: ProtectionDomain,
    pub layout: RingLayout,
    pub ctrl: DmaBuffer,
    pub seg: DmaBuffer,
    /// The CREATE_ENDPOINT request that made it.
    pub create: CreateEndpoint,
    pub send_prod: u32,
    pub event_cons: u32,
}

/// An endpoint of `domain` with rings of 8 (64 events) and a 2-page
/// segment, made by a raw CREATE_ENDPOINT.
pub fn raw_endpoint(hw: &HostAttach, domain: ProtectionDomain) -> RawEp {
    let pd = domain.id;
    let layout = RingLayout {
        send_entries: 8,
        recv_entries: 8,
        free_entries: 8,
        event_entries: 64,
    };
    let mem = hw.memory();
    let ctrl = mem.alloc(layout.region_size() as usize).unwrap();
    let seg = mem.alloc(8192).unwrap();
    let table = mem.alloc(16).unwrap();
    let pages: Vec<u8> = [seg.gpa, seg.gpa + 4096]
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .collect();
    mem.write(table.gpa, &pages);
    let c = CreateEndpoint {
        pd,
        send_entries: 8,
        recv_entries: 8,
        free_entries: 8,
        event_entries: 64,
        ctrl_gpa: ctrl.gpa,
        ctrl_len: ctrl.len as u64,
        seg_table_gpa: table.gpa,
        seg_pages: 2,
    };
    let r = hw.command(cmd::CREATE_ENDPOINT, &c.encode()).unwrap();
    RawEp {
        id: ulnic_abi::read_le32(&r, 0),
        domain,
        layout,
        ctrl,
        seg,
        create: c,
        send_prod: 0,
        event_cons: 0,
    }
}

impl RawEp {
    pub fn word(&self, hw: &HostAttach, off: u64) -> u32 {
        hw.memory().load_u32(self.ctrl.gpa + off)
    }
    pub fn set(&self, hw: &HostAttach, off: u64, v: u32) {
        hw.memory().store_u32(self.ctrl.gpa + off, v);
        hw.ring_doorbell(&self.domain, self.id);
    }
    pub fn send_raw(&mut self, hw: &HostAttach, desc: &[u8; 128]) {
        let slot = u64::from(self.send_prod % self.layout.send_entries);
        hw.memory()
            .write(self.ctrl.gpa + self.layout.send_offset() + slot * 128, desc);
        self.send_prod += 1;
        let p = self.send_prod;
        self.set(hw, ctrl::SEND_PRODUCER, p);
    }
    pub fn next_event(&mut self, hw: &HostAttach) -> EventRecord {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.word(hw, ctrl::EVENT_PRODUCER) == self.event_cons {
            assert!(Instant::now() < deadline, "no event within 5 s");
            std::thread::yield_now();
        }
        let slot = u64::from(self.event_cons % self.layout.event_entries);
        let mut b = [0u8; 32];
        hw.memory().read(
            self.ctrl.gpa + self.layout.event_offset() + slot * 32,
            &mut b,
        );
        self.event_cons += 1;
        let c = self.event_cons;
        self.set(hw, ctrl::EVENT_CONSUMER, c);
        EventRecord::decode(&b)
    }
}
