//! A refused command changes nothing (spec §4 "all or nothing"), inputs
//! that used to be ignored are checked, and features the driver did not
//! accept are not acted on (spec §2).
use ulnic_testkit as common;

use common::raw::{create_pd, raw_endpoint, status_of};
use ulnic_abi::{
    cmd, event, op, perm, send_flags, status, tripwire_flags, tx_error, wire, Cookie, SendDesc,
};
use ulnic_device::nic::node::ObjectCounts;
use ulnic_device::Device;
use ulnic_host_attach::{DmaMemory, HostAttach};
use zerocopy::IntoBytes;

fn counts(dev: &Device, node: usize) -> ObjectCounts {
    dev.shard().lock().nodes[node].object_counts()
}

/// A PD, an endpoint bound to port 5 with an aperture and a tripwire:
/// something for refused commands to leave alone. Returns (pd, ep,
/// aperture, create-endpoint payload).
fn populate(hw: &HostAttach) -> (u32, u32, u32, Vec<u8>) {
    let pd = create_pd(hw);
    let raw = raw_endpoint(hw, pd);
    let ep = raw.id;
    common::raw::bind(hw, ep, 5);
    let cookie = hw.command(cmd::EXPORT, &export_payload(ep)).unwrap();
    let aperture = Cookie::decode(&cookie).aperture;
    hw.command(cmd::SET_TRIPWIRE, &tripwire_payload(ep, aperture))
        .unwrap();
    (pd.id, ep, aperture, raw.create.encode().to_vec())
}

fn export_payload(ep: u32) -> Vec<u8> {
    let p = wire::Export {
        endpoint: ep.into(),
        perms: perm::ALL.into(),
        offset: 0.into(),
        len: 4096.into(),
    };
    p.as_bytes().to_vec()
}

fn tripwire(ep: u32, aperture: u32) -> wire::SetTripwire {
    wire::SetTripwire {
        endpoint: ep.into(),
        aperture: aperture.into(),
        offset: 0.into(),
        len: 64.into(),
        flags: tripwire_flags::WRITE.into(),
        reserved: 0.into(),
        user: 7.into(),
    }
}

fn tripwire_payload(ep: u32, aperture: u32) -> Vec<u8> {
    tripwire(ep, aperture).as_bytes().to_vec()
}

/// Sends `opcode` with `payload` and a response buffer of `room` bytes
/// (header included); returns the status written, if any.
fn raw(hw: &HostAttach, opcode: u32, reserved: u32, payload: &[u8], room: u32) -> Option<u32> {
    let mem = hw.memory();
    let buf = mem.alloc(8192).unwrap();
    let mut req = opcode.to_le_bytes().to_vec();
    req.extend_from_slice(&reserved.to_le_bytes());
    req.extend_from_slice(payload);
    mem.write(buf.gpa, &req);
    let used = hw
        .raw_control_chain(&[(buf.gpa, req.len() as u32)], &[(buf.gpa + 4096, room)])
        .unwrap();
    let mut st = [0u8; 4];
    mem.read(buf.gpa + 4096, &mut st);
    mem.free(buf);
    (used >= 8).then(|| u32::from_le_bytes(st))
}

#[test]
fn refused_commands_of_every_kind_change_nothing() {
    let dev = common::device(1);
    let hw = HostAttach::connect(&common::socket(&dev, 0), 4 << 20).unwrap();
    let (pd, ep, aperture, create) = populate(&hw);
    let stats = |hw: &HostAttach| hw.command(cmd::GET_STATS, &ep.to_le_bytes()).unwrap();
    let before = counts(&dev, 0);
    let stats_before = stats(&hw);
    assert_eq!(
        before,
        ObjectCounts {
            pds: 1,
            endpoints: 1,
            ports: 1,
            apertures: 1,
            tripwires: 1,
            filters: 0
        }
    );
    let mut filter = ep.to_le_bytes().to_vec();
    filter.extend_from_slice(&1u32.to_le_bytes());
    filter.extend_from_slice(&[0xff; 16]);
    let mut revoke = ep.to_le_bytes().to_vec();
    revoke.extend_from_slice(&aperture.to_le_bytes());
    let mut bind = ep.to_le_bytes().to_vec();
    bind.extend_from_slice(&6u32.to_le_bytes());
    let mut utlb_table = pd.to_le_bytes().to_vec();
    utlb_table.extend_from_slice(&8u32.to_le_bytes());
    utlb_table.extend_from_slice(&0x1000u64.to_le_bytes());
    let mut invalidate = pd.to_le_bytes().to_vec();
    invalidate.extend_from_slice(&[0; 8]);
    let mut export_buffer = export_payload(ep);
    export_buffer.extend_from_slice(&[0; 8]);
    let mut clear = ep.to_le_bytes().to_vec();
    clear.extend_from_slice(&0u32.to_le_bytes());
    let doorbell_bits = hw.memory().alloc(4096).unwrap().gpa.to_le_bytes().to_vec();
    // Every command, each valid as written (the device would run it).
    let commands: Vec<(u32, Vec<u8>)> = vec![
        (cmd::GET_INFO, vec![]),
        (cmd::CREATE_PD, doorbell_bits.clone()),
        (cmd::DESTROY_PD, pd.to_le_bytes().to_vec()),
        (cmd::CREATE_ENDPOINT, create.clone()),
        (cmd::DESTROY_ENDPOINT, ep.to_le_bytes().to_vec()),
        (cmd::BIND_PORT, bind),
        (cmd::SET_FILTER, filter),
        (cmd::ARM, ep.to_le_bytes().to_vec()),
        (cmd::DISARM, ep.to_le_bytes().to_vec()),
        (cmd::GET_STATS, ep.to_le_bytes().to_vec()),
        (cmd::UTLB_SET_TABLE, utlb_table),
        (cmd::UTLB_INVALIDATE, invalidate),
        (cmd::EXPORT, export_payload(ep)),
        (cmd::REVOKE, revoke),
        (cmd::EXPORT_BUFFER, export_buffer),
        (cmd::SET_TRIPWIRE, tripwire_payload(ep, aperture)),
        (cmd::CLEAR_TRIPWIRE, clear),
    ];
    for (opcode, payload) in &commands {
        let result = cmd::result_len(*opcode) as u32;
        let mut longer = payload.clone();
        longer.push(0);
        let cases = [
            (
                "a reserved header word",
                raw(&hw, *opcode, 1, payload, 512),
                status::INVALID_ARGUMENT,
            ),
            (
                "a byte too many",
                raw(&hw, *opcode, 0, &longer, 512),
                status::BAD_LENGTH,
            ),
            (
                "a byte too few",
                if payload.is_empty() {
                    Some(status::BAD_LENGTH) // nothing to shorten
                } else {
                    raw(&hw, *opcode, 0, &payload[..payload.len() - 1], 512)
                },
                status::BAD_LENGTH,
            ),
            (
                "no room for the result",
                if result == 0 {
                    Some(status::BAD_LENGTH) // no result to make room for
                } else {
                    raw(&hw, *opcode, 0, payload, 8 + result - 1)
                },
                status::BAD_LENGTH,
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, Some(want), "command {opcode:#x} with {what}");
            assert_eq!(
                counts(&dev, 0),
                before,
                "command {opcode:#x} with {what} changed the device's objects"
            );
        }
    }
    // SET_TRIPWIRE's reserved word, and a control region whose declared
    // length reaches outside shared memory.
    let tw = wire::SetTripwire {
        reserved: 1.into(),
        ..tripwire(ep, aperture)
    };
    assert_eq!(
        status_of(hw.command(cmd::SET_TRIPWIRE, tw.as_bytes())),
        status::INVALID_ARGUMENT
    );
    let mut c: wire::CreateEndpoint = wire::read(&create);
    c.ctrl_len = (1u64 << 40).into();
    assert_eq!(
        status_of(hw.command(cmd::CREATE_ENDPOINT, c.as_bytes())),
        status::BAD_ADDRESS
    );
    c.ctrl_len = (0x10000u64 + 1).into();
    assert_eq!(
        status_of(hw.command(cmd::CREATE_ENDPOINT, c.as_bytes())),
        status::INVALID_ARGUMENT
    );
    assert_eq!(counts(&dev, 0), before);
    // The endpoint's counters too (GET_STATS itself changes none).
    assert_eq!(stats(&hw), stats_before);
    // And the same commands, well formed, still work.
    assert_eq!(
        status_of(hw.command(cmd::CREATE_PD, &doorbell_bits)),
        status::OK
    );
    assert_eq!(counts(&dev, 0).pds, 2);
}

#[test]
fn features_not_accepted_are_refused() {
    let dev = common::device(2);
    let memory = DmaMemory::new(4 << 20).unwrap();
    // Accepts messaging only: no RDMA, UTLB, tripwires or close messages.
    let hw =
        HostAttach::connect_accepting(&common::socket(&dev, 0), memory, ulnic_abi::F_MESSAGING)
            .unwrap();
    let pd = create_pd(&hw);
    let mut table = pd.id.to_le_bytes().to_vec();
    table.extend_from_slice(&8u32.to_le_bytes());
    table.extend_from_slice(&0x1000u64.to_le_bytes());
    assert_eq!(
        status_of(hw.command(cmd::UTLB_SET_TABLE, &table)),
        status::NOT_SUPPORTED
    );
    let mut raw = raw_endpoint(&hw, pd);
    let ep = raw.id;
    assert_eq!(
        status_of(hw.command(cmd::EXPORT, &export_payload(ep))),
        status::NOT_SUPPORTED
    );
    assert_eq!(counts(&dev, 0).apertures, 0);
    // An RDMA write in the send ring fails as a bad descriptor.
    let mut d = [0u8; 128];
    SendDesc {
        opcode: op::RDMA_WRITE,
        flags: send_flags::COMPLETION,
        len: 8,
        dest_node: 1,
        dest_port: 0,
        tag: 0,
        user_id: 42,
        seg_offset: 0,
    }
    .encode_header(&mut d);
    raw.send_raw(&hw, &d);
    let ev = raw.next_event(&hw);
    assert_eq!(
        (ev.kind, ev.code, ev.user_id),
        (event::TX_ERROR, tx_error::BAD_DESCRIPTOR, 42)
    );
}

/// A forked child's copy of an attachment may not post commands: its view
/// of the control queue is the parent's, and a command from it would
/// corrupt the queue for the parent (spec §2.4). The child is refused
/// (EBUSY for the library), and the parent's queue goes on working.
#[test]
fn a_forked_childs_command_is_refused_and_the_parents_queue_works() {
    let dev = common::device(1);
    let hw = HostAttach::connect(&common::socket(&dev, 0), 4 << 20).unwrap();
    create_pd(&hw);
    // SAFETY: the child only makes one refused call (no lock is taken
    // before the check) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let refused = matches!(
            hw.command(cmd::CREATE_PD, &[]),
            Err(ulnic_host_attach::Error::ForkedChild(cmd::CREATE_PD, _))
        );
        // SAFETY: leaving the forked child without running the parent's
        // destructors.
        unsafe { libc::_exit(if refused { 0 } else { 1 }) };
    }
    let mut st = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "the child's command was not refused ({st:#x})"
    );
    for _ in 0..3 {
        create_pd(&hw);
    }
}

/// SET_EVENT_QUEUE (spec §4.2, §6.1) by raw command, below the library's
/// own refusal of another domain's queue: another domain's queue, the
/// source itself, a queue on no endpoint, and one without room are
/// refused and leave no link.
#[test]
fn refused_event_queues_leave_no_link() {
    let dev = common::device(1);
    let hw = HostAttach::connect(&common::socket(&dev, 0), 4 << 20).unwrap();
    let (pd, pd2) = (create_pd(&hw), create_pd(&hw));
    let source = raw_endpoint(&hw, pd).id;
    let queue = raw_endpoint(&hw, pd).id;
    let foreign = raw_endpoint(&hw, pd2).id;
    let attach = |ep: u32, q: u32| {
        let p = wire::SetEventQueue {
            endpoint: ep.into(),
            queue: q.into(),
            cookie: 9.into(),
        };
        status_of(hw.command(cmd::SET_EVENT_QUEUE, p.as_bytes()))
    };
    assert_eq!(attach(source, foreign), status::INVALID_ARGUMENT);
    assert_eq!(attach(source, source), status::INVALID_ARGUMENT);
    assert_eq!(attach(source, 4000), status::NOT_FOUND);
    // A 64-entry event ring leaves no room beyond its own sends,
    // conditions, tripwires and redirections.
    assert_eq!(attach(source, queue), status::NO_RESOURCES);
    assert!(dev.shard().lock().nodes[0].queue_of(source).is_none());
}
