//! docs/spec.md §3 and §4 (limits, the control queue, status codes,
//! commands, CREATE_ENDPOINT), walked in spec order through the frontend of
//! device/tests/common/spec.rs. See conformance.rs for the whole walk.
use ulnic_testkit as common;
#[path = "common/spec.rs"]
mod spec;

use spec::{
    counts, desc, pattern, released, send_segment, Raw, COMMANDS, F_NEXT, F_WRITE, MEM, REQ, RESP,
    SMALL,
};
use ulnic_abi::wire::{
    BindPort, ClearTripwire, CmdHeader, Cookie, CreateEndpoint, CreatePd, DeviceInfo,
    EndpointCreated, Export, ExportBuffer, FilterEntry, ObjectId, PdCreated, Revoke, SetEventQueue,
    SetFilter, SetTripwire, UtlbInvalidate, UtlbSetTable,
};
use ulnic_abi::{cmd, perm, recv_flags, status, tripwire_flags, RingLayout, F_MESSAGING};
use vm_memory::ByteValued;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// A wire struct's bytes.
fn bytes(v: &(impl IntoBytes + zerocopy::Immutable)) -> Vec<u8> {
    v.as_bytes().to_vec()
}

/// A request's (used length, status).
fn code(raw: &mut Raw, opcode: u32, reserved: u32, payload: &[u8], room: u32) -> (u32, u32) {
    let (used, code, _) = raw.request(opcode, reserved, payload, room);
    (used, code)
}

/// §3: the limits table, as the contract crate holds them.
#[test]
fn s3_limits_are_the_contracts() {
    use ulnic_abi::*;
    assert_eq!((INLINE_MAX, MAX_MESSAGE), (96, 1 << 20));
    assert_eq!((MIN_RING_ENTRIES, MAX_RING_ENTRIES), (2, 65536));
    assert_eq!(CONDITION_RESERVE, 32);
    assert_eq!((MAX_SEGMENT_PAGES, PAGE_SIZE), (262_144, 4096));
    assert_eq!((MAX_FILTERS, MAX_APERTURES), (16, 64));
    assert_eq!((MAX_TRIPWIRES_LIMIT, DEFAULT_TRIPWIRES), (3072, 64));
    assert_eq!(MAX_RDMA, 16 << 20);
    assert_eq!((MAX_UTLB_ENTRIES, MAX_UTLB_RUN), (1 << 20, 4097));
    assert_eq!((DOORBELL_QUEUES, MAX_ENDPOINTS_LIMIT), (62, 4096));
    assert_eq!((RESIDENT_MAX, ANY), (64, 0xffff_ffff));
}

/// §4 step 1: more than 8 + 512 readable bytes, or fewer than 8, is
/// BAD_LENGTH, before the opcode is looked at.
#[test]
fn s4_step_1_more_than_520_or_fewer_than_8_readable_bytes() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let unknown = 0x60;
    let at_most = code(&mut raw, unknown, 0, &[0; 512], 0);
    assert_eq!(at_most, (8, status::UNKNOWN_COMMAND));
    let over = code(&mut raw, unknown, 0, &[0; 513], 0);
    assert_eq!(over, (8, status::BAD_LENGTH));
    let seven = raw.request_bytes(&[0x60, 0, 0, 0, 0, 0, 0], 0);
    assert_eq!((seven.0, seven.1), (8, status::BAD_LENGTH));
    let opcode_only = raw.request_bytes(&cmd::GET_INFO.to_le_bytes(), 40);
    assert_eq!((opcode_only.0, opcode_only.1), (8, status::BAD_LENGTH));
}

/// §4 step 2 before 3: an opcode the device does not know answers
/// NOT_SUPPORTED in the reserved ranges (0x22-0x2f, 0x50-0x5f) and
/// UNKNOWN_COMMAND elsewhere, whatever the header's reserved word; a known
/// one with that word set answers INVALID_ARGUMENT.
#[test]
fn s4_step_2_unknown_opcodes_and_the_reserved_ranges() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let known: Vec<u32> = COMMANDS.iter().map(|c| c.0).collect();
    for opcode in (0..=0x100).chain([0x1000, 0x8000_0022, u32::MAX]) {
        let want = if known.contains(&opcode) {
            status::INVALID_ARGUMENT
        } else if (0x22..=0x2f).contains(&opcode) || (0x50..=0x5f).contains(&opcode) {
            status::NOT_SUPPORTED
        } else {
            status::UNKNOWN_COMMAND
        };
        assert_eq!(code(&mut raw, opcode, 1, &[], 0), (8, want), "{opcode:#x}");
    }
}

/// §4 steps 3 to 7 in order: the header's reserved word, then the
/// features, then the result's room, then the payload's length, then the
/// command's own checks; a request failing two gets the earlier code, and
/// changes nothing.
#[test]
fn s4_steps_3_to_7_come_in_order() {
    let dev = common::device(1);
    let sock = common::socket(&dev, 0);
    let mut raw = Raw::with_features(&sock, F_MESSAGING);
    // EXPORT without F_RDMA, with a short payload and no room.
    let short = [0u8; 23];
    assert_eq!(
        code(&mut raw, cmd::EXPORT, 1, &short, 0),
        (8, status::INVALID_ARGUMENT)
    );
    assert_eq!(
        code(&mut raw, cmd::EXPORT, 0, &short, 0),
        (8, status::NOT_SUPPORTED)
    );
    drop(raw);
    released(&dev, 0);
    let mut raw = Raw::new(&sock);
    let ep = raw.bound(5);
    let before = counts(&dev, 0);
    // CREATE_PD with an unaligned bitmap: room first, then its own check.
    let pd = CreatePd {
        doorbell_gpa: 0x9_0004.into(),
    };
    assert_eq!(
        code(&mut raw, cmd::CREATE_PD, 0, pd.as_bytes(), 7),
        (8, status::BAD_LENGTH)
    );
    assert_eq!(
        code(&mut raw, cmd::CREATE_PD, 0, pd.as_bytes(), 8),
        (8, status::INVALID_ARGUMENT)
    );
    // BIND_PORT to port 0: length first, then the endpoint, then the port.
    let bind = BindPort {
        endpoint: ep.id.into(),
        port: 0.into(),
    };
    let mut long = bind.as_bytes().to_vec();
    long.push(0);
    assert_eq!(raw.command(cmd::BIND_PORT, &long).0, status::BAD_LENGTH);
    assert_eq!(raw.status(cmd::BIND_PORT, &bind), status::INVALID_ARGUMENT);
    let nobody = BindPort {
        endpoint: (ep.id + 1).into(),
        port: 0.into(),
    };
    assert_eq!(raw.status(cmd::BIND_PORT, &nobody), status::NOT_FOUND);
    assert_eq!(raw.command(cmd::DESTROY_PD, &[0; 3]).0, status::BAD_LENGTH);
    assert_eq!(raw.command(cmd::DESTROY_PD, &[0; 4]).0, status::NOT_FOUND);
    assert_eq!(counts(&dev, 0), before, "a refused command acted");
}

/// §4 "all or nothing": refused commands of every kind create, change and
/// count nothing, and the objects they named go on working.
#[test]
fn s4_a_refused_command_changes_nothing() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let ep = raw.bound(5);
    let cookie = raw.export(&ep, 0, 4096, perm::ALL);
    let filter = [
        SetFilter {
            endpoint: ep.id.into(),
            count: 1.into(),
        }
        .as_bytes(),
        FilterEntry::new_zeroed().as_bytes(),
    ]
    .concat();
    raw.ok(cmd::SET_FILTER, &filter);
    let mut tw = tripwire(ep.id, cookie.aperture.get());
    raw.ok(cmd::SET_TRIPWIRE, tw.as_bytes());
    let before = counts(&dev, 0);
    let args = raw.endpoint_args(ep.pd.id, SMALL, 1);
    let mut long_args = args.as_bytes().to_vec();
    long_args.push(0);
    let pd = CreatePd {
        doorbell_gpa: raw.alloc(4096).into(),
    };
    let bind = BindPort {
        endpoint: ep.id.into(),
        port: 6.into(),
    };
    let mut bad_ring = args;
    bad_ring.send_entries = 3.into();
    let mut count17 = bytes(&SetFilter {
        endpoint: ep.id.into(),
        count: 17.into(),
    });
    count17.resize(8 + 17 * FilterEntry::new_zeroed().as_bytes().len(), 0);
    tw.reserved = 1.into();
    let refusals: Vec<(u32, u32, Vec<u8>, u32, u32)> = vec![
        (
            cmd::CREATE_PD,
            0,
            pd.as_bytes().to_vec(),
            7,
            status::BAD_LENGTH,
        ),
        (cmd::CREATE_ENDPOINT, 0, long_args, 8, status::BAD_LENGTH),
        (
            cmd::CREATE_ENDPOINT,
            0,
            bad_ring.as_bytes().to_vec(),
            8,
            status::INVALID_ARGUMENT,
        ),
        (
            cmd::BIND_PORT,
            1,
            bind.as_bytes().to_vec(),
            0,
            status::INVALID_ARGUMENT,
        ),
        (cmd::SET_FILTER, 0, count17, 0, status::INVALID_ARGUMENT),
        (
            cmd::SET_TRIPWIRE,
            0,
            tw.as_bytes().to_vec(),
            4,
            status::INVALID_ARGUMENT,
        ),
        (cmd::DESTROY_PD, 0, vec![0; 5], 0, status::BAD_LENGTH),
        (
            cmd::DESTROY_ENDPOINT,
            1,
            bytes(&ObjectId { id: ep.id.into() }),
            0,
            status::INVALID_ARGUMENT,
        ),
        (cmd::REVOKE, 0, vec![0; 7], 0, status::BAD_LENGTH),
    ];
    for (opcode, reserved, payload, room, want) in refusals {
        let got = code(&mut raw, opcode, reserved, &payload, room);
        assert_eq!(got, (8, want), "{opcode:#x}");
        assert_eq!(counts(&dev, 0), before, "{opcode:#x} refused but acted");
    }
    assert_eq!(
        raw.status(cmd::GET_STATS, &ObjectId { id: ep.id.into() }),
        status::OK
    );
    assert_eq!(raw.status(cmd::BIND_PORT, &bind), status::OK);
}

fn tripwire(ep: u32, aperture: u32) -> SetTripwire {
    SetTripwire {
        endpoint: ep.into(),
        aperture: aperture.into(),
        offset: 0.into(),
        len: 64.into(),
        flags: tripwire_flags::WRITE.into(),
        reserved: 0.into(),
        user: 7.into(),
    }
}

/// §4 chain rules: the readable descriptors are the request and the
/// writable ones the response, wherever each stands, each part possibly
/// split; fewer than 8 writable bytes or a descriptor outside shared
/// memory is malformed (used length 0, nothing done); no readable bytes is
/// BAD_LENGTH with used length 8.
#[test]
fn s4_malformed_chains_and_split_parts() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let header = |opcode: u32| CmdHeader {
        opcode: opcode.into(),
        reserved: 0.into(),
    };
    let before = counts(&dev, 0);
    let pd = CreatePd {
        doorbell_gpa: 0x9_0000.into(),
    };
    raw.write(REQ, header(cmd::CREATE_PD).as_bytes());
    raw.write_obj(REQ + 8, &pd);
    raw.fill(RESP, 64, 0xee);
    let seven = [desc(REQ, 16, F_NEXT, 1), desc(RESP, 7, F_WRITE, 0)];
    assert_eq!(raw.control_chain(&seven, 0), 0);
    assert_eq!(
        raw.read(RESP, 64),
        vec![0xee; 64],
        "wrote into a short buffer"
    );
    let outside = [
        desc(REQ, 16, F_NEXT, 1),
        desc(MEM as u64 - 4, 8, F_WRITE, 0),
    ];
    assert_eq!(raw.control_chain(&outside, 0), 0);
    let outside = [desc(MEM as u64, 16, F_NEXT, 1), desc(RESP, 64, F_WRITE, 0)];
    assert_eq!(raw.control_chain(&outside, 0), 0);
    assert_eq!(counts(&dev, 0), before, "a malformed chain was executed");
    let none = [desc(RESP, 64, F_WRITE, 0)];
    let used = raw.control_chain(&none, 0);
    assert_eq!(
        (raw.response(used).0, raw.response(used).1),
        (8, status::BAD_LENGTH)
    );
    // GET_INFO's response split 4 + 44, the writable part first.
    raw.write(REQ, header(cmd::GET_INFO).as_bytes());
    raw.fill(RESP, 0x200, 0xee);
    let split = [
        desc(RESP, 4, F_WRITE | F_NEXT, 1),
        desc(RESP + 0x100, 44, F_WRITE | F_NEXT, 2),
        desc(REQ, 8, 0, 0),
    ];
    assert_eq!(raw.control_chain(&split, 0), 48);
    assert_eq!(raw.read_obj::<U32>(RESP).get(), status::OK);
    let rest = [raw.read(RESP + 0x100, 44)].concat();
    assert_eq!(&rest[..4], &[0; 4], "reserved word");
    let info = DeviceInfo::read_from_bytes(&rest[4..]).unwrap();
    assert_eq!(info.inline_max.get(), 96);
    // A request split over three readable buffers.
    raw.write(REQ, header(cmd::CREATE_PD).as_bytes());
    raw.write_obj(REQ + 0x100, &pd);
    let three = [
        desc(REQ, 8, F_NEXT, 1),
        desc(REQ + 0x100, 3, F_NEXT, 2),
        desc(REQ + 0x103, 5, F_NEXT, 3),
        desc(RESP, 16, F_WRITE, 0),
    ];
    assert_eq!(raw.control_chain(&three, 0), 16);
    assert_eq!(raw.response(16).1, status::OK);
    assert_eq!(counts(&dev, 0).pds, before.pds + 1);
}

/// §4: the device serves the control queue in ring order: three chains
/// made available at once complete in that order, each with its answer.
#[test]
fn s4_commands_are_served_in_ring_order() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let header = |opcode: u32| CmdHeader {
        opcode: opcode.into(),
        reserved: 0.into(),
    };
    let requests = [header(cmd::GET_INFO), header(0x60), header(cmd::CREATE_PD)];
    raw.fill(RESP, 0x1000, 0xee);
    for (i, h) in requests.iter().enumerate() {
        let (req, resp) = (REQ + 0x100 * i as u64, RESP + 0x100 * i as u64);
        let mut bytes = h.as_bytes().to_vec();
        if i == 2 {
            bytes.extend_from_slice(&[1; 8]); // an unaligned bitmap
        }
        raw.write(req, &bytes);
        let first = 2 * i as u64 * 16;
        let next = 2 * i as u16 + 1;
        raw.write(
            spec::RINGS + first,
            desc(req, bytes.len() as u32, F_NEXT, next).as_slice(),
        );
        raw.write(
            spec::RINGS + first + 16,
            desc(resp, 64, F_WRITE, 0).as_slice(),
        );
    }
    for i in 0..3 {
        raw.publish_avail(0, 2 * i);
    }
    raw.kick(0);
    let want = [
        (0, 48, status::OK),
        (2, 8, status::UNKNOWN_COMMAND),
        (4, 8, status::INVALID_ARGUMENT),
    ];
    for (i, (id, len, code)) in want.into_iter().enumerate() {
        let mut used = None;
        spec::until("a completion", || {
            used = raw.take_used(0);
            used.is_some()
        });
        assert_eq!(used, Some((id, len)), "completion {i}");
        assert_eq!(raw.read_obj::<U32>(RESP + 0x100 * i as u64).get(), code);
    }
}

/// §4.1: the status codes are the spec's numbers.
#[test]
fn s4_1_status_codes_are_the_spec_numbers() {
    use ulnic_abi::status::*;
    assert_eq!(
        (OK, UNKNOWN_COMMAND, BAD_LENGTH, INVALID_ARGUMENT),
        (0, 1, 2, 3)
    );
    assert_eq!((NO_RESOURCES, NOT_FOUND, ADDRESS_IN_USE), (4, 5, 6));
    assert_eq!((BAD_ADDRESS, NOT_SUPPORTED), (7, 8));
}

/// §4.2: the opcodes and every payload and result as long as the table
/// says (the wire structs too); one byte more or less is BAD_LENGTH.
#[test]
fn s4_2_every_payload_length_is_exact() {
    use std::mem::size_of;
    let names = [
        cmd::GET_INFO,
        cmd::CREATE_PD,
        cmd::DESTROY_PD,
        cmd::ACK_RESET,
        cmd::CREATE_ENDPOINT,
        cmd::DESTROY_ENDPOINT,
        cmd::BIND_PORT,
        cmd::SET_FILTER,
        cmd::ARM,
        cmd::DISARM,
        cmd::GET_STATS,
        cmd::SET_EVENT_QUEUE,
        cmd::EXPORT_PIO,
        cmd::IMPORT_PIO,
        cmd::REVOKE_PIO,
        cmd::RELEASE_PIO,
        cmd::UTLB_SET_TABLE,
        cmd::UTLB_INVALIDATE,
        cmd::EXPORT,
        cmd::REVOKE,
        cmd::EXPORT_BUFFER,
        cmd::SET_TRIPWIRE,
        cmd::CLEAR_TRIPWIRE,
    ];
    assert_eq!(names, COMMANDS.map(|c| c.0));
    let payloads = [
        size_of::<CreatePd>(),
        size_of::<ObjectId>(),
        size_of::<CreateEndpoint>(),
        size_of::<BindPort>(),
        size_of::<SetFilter>(),
        size_of::<SetEventQueue>(),
        size_of::<UtlbSetTable>(),
        size_of::<UtlbInvalidate>(),
        size_of::<Export>(),
        size_of::<Revoke>(),
        size_of::<ExportBuffer>(),
        size_of::<SetTripwire>(),
        size_of::<ClearTripwire>(),
        size_of::<FilterEntry>(),
        size_of::<ulnic_abi::wire::ExportPio>(),
        size_of::<ulnic_abi::wire::ImportPio>(),
        size_of::<ulnic_abi::wire::PioObject>(),
    ];
    assert_eq!(
        payloads,
        [8, 4, 48, 8, 8, 16, 16, 12, 24, 8, 32, 40, 8, 16, 16, 24, 8]
    );
    let results = [
        size_of::<DeviceInfo>(),
        size_of::<PdCreated>(),
        size_of::<EndpointCreated>(),
        size_of::<Cookie>(),
        size_of::<ulnic_abi::wire::PioExported>(),
        size_of::<ulnic_abi::wire::PioImported>(),
    ];
    assert_eq!(results, [40, 8, 8, 24, 24, 16]);
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    for (opcode, len, _, _) in COMMANDS {
        if len > 0 {
            assert_eq!(raw.command(opcode, &vec![0; len - 1]).0, status::BAD_LENGTH);
        }
        let long = raw.command(opcode, &vec![0; len + 1]).0;
        assert_eq!(long, status::BAD_LENGTH, "{opcode:#x}");
        assert_ne!(raw.command(opcode, &vec![0; len]).0, status::BAD_LENGTH);
    }
    let mut one = SetFilter {
        endpoint: 0.into(),
        count: 1.into(),
    }
    .as_bytes()
    .to_vec();
    one.resize(8 + 16 - 1, 0);
    assert_eq!(raw.command(cmd::SET_FILTER, &one).0, status::BAD_LENGTH);
    one.resize(8 + 16 + 1, 0);
    assert_eq!(raw.command(cmd::SET_FILTER, &one).0, status::BAD_LENGTH);
    one.truncate(8 + 16);
    assert_eq!(raw.command(cmd::SET_FILTER, &one).0, status::NOT_FOUND);
}

/// §4 step 5, §4.2: a command with a result needs the whole of it as room
/// after the response header (one byte short: BAD_LENGTH, nothing done);
/// with it, the used length is 8 + the result.
#[test]
fn s4_2_every_result_needs_its_room() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let ep = raw.endpoint_in(pd, SMALL, 2);
    let (table, page) = (raw.alloc(4096), raw.alloc(4096));
    raw.write_obj(table, &U64::new(page));
    let set = UtlbSetTable {
        pd: pd.id.into(),
        entries: 1.into(),
        table_gpa: table.into(),
    };
    raw.ok(cmd::UTLB_SET_TABLE, set.as_bytes());
    let cookie = raw.export(&ep, 0, 4096, perm::ALL);
    let buffer = ExportBuffer {
        endpoint: ep.id.into(),
        perms: perm::READ.into(),
        page_offset: 0.into(),
        len: 64.into(),
        utlb_first: 0.into(),
        utlb_count: 1.into(),
    };
    let new_pd = CreatePd {
        doorbell_gpa: raw.alloc(4096).into(),
    };
    let export = Export {
        endpoint: ep.id.into(),
        perms: perm::ALL.into(),
        offset: 0.into(),
        len: 8.into(),
    };
    let cases: Vec<(u32, Vec<u8>, u32)> = vec![
        (cmd::GET_INFO, vec![], 40),
        (cmd::CREATE_PD, new_pd.as_bytes().to_vec(), 8),
        (
            cmd::CREATE_ENDPOINT,
            raw.endpoint_args(pd.id, SMALL, 1).as_bytes().to_vec(),
            8,
        ),
        (cmd::GET_STATS, bytes(&ObjectId { id: ep.id.into() }), 136),
        (cmd::EXPORT, export.as_bytes().to_vec(), 24),
        (cmd::EXPORT_BUFFER, buffer.as_bytes().to_vec(), 24),
        (
            cmd::SET_TRIPWIRE,
            tripwire(ep.id, cookie.aperture.get()).as_bytes().to_vec(),
            4,
        ),
    ];
    for (opcode, payload, result) in cases {
        let before = counts(&dev, 0);
        let short = code(&mut raw, opcode, 0, &payload, result - 1);
        assert_eq!(short, (8, status::BAD_LENGTH), "{opcode:#x}");
        assert_eq!(counts(&dev, 0), before, "{opcode:#x} refused but acted");
        let (used, st, r) = raw.request(opcode, 0, &payload, result);
        assert_eq!((used, st), (8 + result, status::OK), "{opcode:#x}");
        assert_eq!(r.len(), result as usize);
    }
}

/// §4.2: the commands without a result answer with the response header
/// alone, in a buffer of just 8 bytes.
#[test]
fn s4_2_commands_without_a_result_need_only_the_header() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let ep = raw.endpoint_in(pd, SMALL, 2);
    let cookie = raw.export(&ep, 0, 4096, perm::ALL);
    let tw = raw.ok(
        cmd::SET_TRIPWIRE,
        tripwire(ep.id, cookie.aperture.get()).as_bytes(),
    );
    let tw = ObjectId::read_from_bytes(&tw).unwrap().id;
    let table = raw.alloc(4096);
    let (e, p) = (ep.id, pd.id);
    let set = UtlbSetTable {
        pd: p.into(),
        entries: 1.into(),
        table_gpa: table.into(),
    };
    let invalidate = UtlbInvalidate {
        pd: p.into(),
        first: 0.into(),
        count: 1.into(),
    };
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (
            cmd::BIND_PORT,
            bytes(&BindPort {
                endpoint: e.into(),
                port: 9.into(),
            }),
        ),
        (
            cmd::SET_FILTER,
            bytes(&SetFilter {
                endpoint: e.into(),
                count: 0.into(),
            }),
        ),
        (cmd::ARM, bytes(&ObjectId { id: e.into() })),
        (cmd::DISARM, bytes(&ObjectId { id: e.into() })),
        (cmd::UTLB_SET_TABLE, bytes(&set)),
        (cmd::UTLB_INVALIDATE, bytes(&invalidate)),
        (
            cmd::CLEAR_TRIPWIRE,
            bytes(&ClearTripwire {
                endpoint: e.into(),
                tripwire: tw,
            }),
        ),
        (
            cmd::REVOKE,
            bytes(&Revoke {
                endpoint: e.into(),
                aperture: cookie.aperture,
            }),
        ),
        (cmd::DESTROY_ENDPOINT, bytes(&ObjectId { id: e.into() })),
        (cmd::DESTROY_PD, bytes(&ObjectId { id: p.into() })),
    ];
    for (opcode, payload) in cases {
        let r = raw.request(opcode, 0, &payload, 0);
        assert_eq!(r, (8, status::OK, vec![]), "{opcode:#x}");
    }
}

/// §4.2 CREATE_PD, §3: a node has 62 domains, each with a doorbell queue
/// of its own in 2..=63; the 63rd is NO_RESOURCES; destroying one frees
/// its slot for the next.
#[test]
fn s4_2_create_pd_hands_out_62_doorbell_queues() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pds: Vec<spec::Pd> = (0..62).map(|_| raw.pd()).collect();
    let mut queues: Vec<u32> = pds.iter().map(|p| p.queue).collect();
    queues.sort_unstable();
    assert_eq!(queues, (2..64).collect::<Vec<u32>>());
    let mut ids: Vec<u32> = pds.iter().map(|p| p.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 62, "domain ids repeat");
    let extra = CreatePd {
        doorbell_gpa: raw.alloc(4096).into(),
    };
    assert_eq!(raw.status(cmd::CREATE_PD, &extra), status::NO_RESOURCES);
    raw.ok(
        cmd::DESTROY_PD,
        ObjectId {
            id: pds[17].id.into(),
        }
        .as_bytes(),
    );
    let r = raw.ok(cmd::CREATE_PD, extra.as_bytes());
    let created = PdCreated::read_from_bytes(&r).unwrap();
    assert_eq!(created.doorbell_queue.get(), pds[17].queue);
}

/// §4.2 DESTROY_PD destroys the domain's endpoints (and so frees their
/// ports); other domains keep theirs.
#[test]
fn s4_2_destroy_pd_destroys_its_endpoints() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let a = raw.pd();
    let (a1, a2) = (raw.endpoint_in(a, SMALL, 1), raw.endpoint_in(a, SMALL, 1));
    raw.bind(&a1, 5);
    let b1 = raw.bound(7);
    raw.ok(cmd::DESTROY_PD, ObjectId { id: a.id.into() }.as_bytes());
    for gone in [&a1, &a2] {
        let id = ObjectId { id: gone.id.into() };
        assert_eq!(raw.status(cmd::GET_STATS, &id), status::NOT_FOUND);
    }
    assert_eq!(
        raw.status(cmd::GET_STATS, &ObjectId { id: b1.id.into() }),
        status::OK
    );
    raw.bind(&b1, 5);
    let again = ObjectId { id: a.id.into() };
    assert_eq!(raw.status(cmd::DESTROY_PD, &again), status::NOT_FOUND);
    let args = raw.endpoint_args(a.id, SMALL, 1);
    assert_eq!(raw.status(cmd::CREATE_ENDPOINT, &args), status::NOT_FOUND);
    assert_eq!(counts(&dev, 0).endpoints, 1);
}

/// §4.2 BIND_PORT, §3: ports are 1..=0xfffffffe; a port already bound,
/// even by the same endpoint, is ADDRESS_IN_USE; binding another port
/// releases the old one.
#[test]
fn s4_2_bind_port() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let (a, b) = (raw.endpoint_in(pd, SMALL, 1), raw.endpoint_in(pd, SMALL, 1));
    let bind = |ep: u32, port: u32| BindPort {
        endpoint: ep.into(),
        port: port.into(),
    };
    let top = 0xffff_fffe;
    assert_eq!(
        raw.status(cmd::BIND_PORT, &bind(a.id, 0)),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        raw.status(cmd::BIND_PORT, &bind(a.id, u32::MAX)),
        status::INVALID_ARGUMENT
    );
    assert_eq!(raw.status(cmd::BIND_PORT, &bind(a.id, top)), status::OK);
    assert_eq!(
        raw.status(cmd::BIND_PORT, &bind(a.id, top)),
        status::ADDRESS_IN_USE
    );
    assert_eq!(
        raw.status(cmd::BIND_PORT, &bind(b.id, top)),
        status::ADDRESS_IN_USE
    );
    // The endpoint is looked for first: a bound port does not hide it.
    assert_eq!(
        raw.status(cmd::BIND_PORT, &bind(b.id + 1, top)),
        status::NOT_FOUND
    );
    assert_eq!(raw.status(cmd::BIND_PORT, &bind(a.id, 1)), status::OK);
    assert_eq!(raw.status(cmd::BIND_PORT, &bind(b.id, top)), status::OK);
    assert_eq!(counts(&dev, 0).ports, 2);
    assert_eq!(
        raw.status(cmd::BIND_PORT, &bind(1000, 9)),
        status::NOT_FOUND
    );
}

/// §4.2: commands naming an endpoint check that it exists on this node
/// (NOT_FOUND), here one just destroyed.
#[test]
fn s4_2_commands_check_that_the_endpoint_exists() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let ep = raw.bound(5);
    let cookie = raw.export(&ep, 0, 4096, perm::ALL);
    let tw = raw.ok(
        cmd::SET_TRIPWIRE,
        tripwire(ep.id, cookie.aperture.get()).as_bytes(),
    );
    let tw = ObjectId::read_from_bytes(&tw).unwrap().id;
    raw.destroy(&ep);
    let e = ep.id.into();
    let export = Export {
        endpoint: e,
        perms: perm::ALL.into(),
        offset: 0.into(),
        len: 8.into(),
    };
    let buffer = ExportBuffer {
        endpoint: e,
        perms: perm::ALL.into(),
        page_offset: 0.into(),
        len: 8.into(),
        utlb_first: 0.into(),
        utlb_count: 1.into(),
    };
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (cmd::DESTROY_ENDPOINT, bytes(&ObjectId { id: e })),
        (
            cmd::BIND_PORT,
            bytes(&BindPort {
                endpoint: e,
                port: 6.into(),
            }),
        ),
        (
            cmd::SET_FILTER,
            bytes(&SetFilter {
                endpoint: e,
                count: 0.into(),
            }),
        ),
        (cmd::ARM, bytes(&ObjectId { id: e })),
        (cmd::DISARM, bytes(&ObjectId { id: e })),
        (cmd::GET_STATS, bytes(&ObjectId { id: e })),
        (cmd::EXPORT, bytes(&export)),
        (
            cmd::REVOKE,
            bytes(&Revoke {
                endpoint: e,
                aperture: cookie.aperture,
            }),
        ),
        (cmd::EXPORT_BUFFER, bytes(&buffer)),
        (
            cmd::SET_TRIPWIRE,
            bytes(&tripwire(ep.id, cookie.aperture.get())),
        ),
        (
            cmd::CLEAR_TRIPWIRE,
            bytes(&ClearTripwire {
                endpoint: e,
                tripwire: tw,
            }),
        ),
    ];
    for (opcode, payload) in cases {
        assert_eq!(
            raw.command(opcode, &payload).0,
            status::NOT_FOUND,
            "{opcode:#x}"
        );
    }
}

/// §4 step 6 before 7: SET_FILTER's length is checked against its count
/// before the count itself (at most 16).
#[test]
fn s4_2_set_filter_checks_its_length_before_its_count() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let ep = raw.bound(9);
    let filter = |count: u32, entries: usize| {
        let mut p = bytes(&SetFilter {
            endpoint: ep.id.into(),
            count: count.into(),
        });
        for _ in 0..entries {
            p.extend_from_slice(FilterEntry::new_zeroed().as_bytes());
        }
        p
    };
    assert_eq!(
        raw.command(cmd::SET_FILTER, &filter(17, 0)).0,
        status::BAD_LENGTH
    );
    assert_eq!(
        raw.command(cmd::SET_FILTER, &filter(17, 17)).0,
        status::INVALID_ARGUMENT
    );
    assert_eq!(raw.command(cmd::SET_FILTER, &filter(16, 16)).0, status::OK);
    assert_eq!(counts(&dev, 0).filters, 16);
}

/// §4.2 EXPORT and REVOKE, §5.12 cookies: permissions non-zero and known,
/// len > 0, offset 8-byte aligned, range inside the segment
/// (INVALID_ARGUMENT), 64 apertures per endpoint (NO_RESOURCES); a cookie
/// names the node, has a zero reserved word and a fresh key; REVOKE takes
/// only the endpoint's own apertures, once.
#[test]
fn s4_2_export_and_revoke() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 1));
    let ep = raw.bound(5);
    let other = raw.bound(6);
    let export = |perms: u32, offset: u64, len: u64| Export {
        endpoint: ep.id.into(),
        perms: perms.into(),
        offset: offset.into(),
        len: len.into(),
    };
    let invalid = [
        export(0, 0, 8),
        export(4, 0, 8),
        export(perm::ALL, 0, 0),
        export(perm::ALL, 4, 8),
        export(perm::ALL, 8192 - 8, 16),
        export(perm::ALL, u64::MAX - 7, 16),
    ];
    for a in invalid {
        assert_eq!(
            raw.status(cmd::EXPORT, &a),
            status::INVALID_ARGUMENT,
            "{a:?}"
        );
    }
    let cookies: Vec<Cookie> = (0..64)
        .map(|i| raw.export(&ep, 8 * i, 8, perm::READ))
        .collect();
    let mut keys: Vec<u64> = cookies.iter().map(|c| c.key.get()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 64, "keys repeat");
    for c in &cookies {
        assert_eq!((c.node.get(), c.reserved.get()), (1, 0));
    }
    assert_eq!(
        raw.status(cmd::EXPORT, &export(perm::ALL, 0, 8)),
        status::NO_RESOURCES
    );
    raw.export(&other, 0, 8, perm::READ);
    let revoke = |ep: &spec::Ep, c: &Cookie| Revoke {
        endpoint: ep.id.into(),
        aperture: c.aperture,
    };
    assert_eq!(
        raw.status(cmd::REVOKE, &revoke(&other, &cookies[3])),
        status::NOT_FOUND
    );
    assert_eq!(
        raw.status(cmd::REVOKE, &revoke(&ep, &cookies[3])),
        status::OK
    );
    assert_eq!(
        raw.status(cmd::REVOKE, &revoke(&ep, &cookies[3])),
        status::NOT_FOUND
    );
    let again = raw.export(&ep, 0, 8, perm::WRITE);
    assert!(
        again.aperture != cookies[3].aperture || again.generation != cookies[3].generation,
        "a reused slot kept its generation"
    );
}

/// §4.2 SET_TRIPWIRE and CLEAR_TRIPWIRE: the aperture is the endpoint's
/// (NOT_FOUND), flags known and naming READ or WRITE, len > 0, range
/// inside the aperture, reserved word 0 (INVALID_ARGUMENT), below the
/// device's tripwire cap (NO_RESOURCES); SET_TRIPWIRE zeroes the new id's
/// fired byte; CLEAR_TRIPWIRE takes the endpoint's own tripwires, once.
#[test]
fn s4_2_set_and_clear_tripwire() {
    let dev = common::device_with(1, |b| b.tripwires(3));
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let ep = raw.bound(5);
    let other = raw.bound(6);
    let mine = raw.export(&ep, 0, 4096, perm::ALL).aperture.get();
    let theirs = raw.export(&other, 0, 4096, perm::ALL).aperture.get();
    let tw = |aperture: u32, offset: u64, len: u64, flags: u32| SetTripwire {
        offset: offset.into(),
        len: len.into(),
        flags: flags.into(),
        ..tripwire(ep.id, aperture)
    };
    let w = tripwire_flags::WRITE;
    assert_eq!(
        raw.status(cmd::SET_TRIPWIRE, &tw(theirs, 0, 8, w)),
        status::NOT_FOUND
    );
    assert_eq!(
        raw.status(cmd::SET_TRIPWIRE, &tw(63, 0, 8, w)),
        status::NOT_FOUND
    );
    // With PIO the aperture field names a PIO window: none has id 0.
    assert_eq!(
        raw.status(cmd::SET_TRIPWIRE, &tw(mine, 0, 8, w | tripwire_flags::PIO)),
        status::NOT_FOUND
    );
    let mut reserved = tw(mine, 0, 8, w);
    reserved.reserved = 1.into();
    let invalid = [
        tw(mine, 0, 8, 0),
        tw(mine, 0, 8, tripwire_flags::PERSISTENT),
        tw(mine, 0, 8, w | 16),
        tw(mine, 0, 0, w),
        tw(mine, 4090, 7, w),
        tw(mine, u64::MAX, 2, w),
        reserved,
    ];
    for a in invalid {
        assert_eq!(
            raw.status(cmd::SET_TRIPWIRE, &a),
            status::INVALID_ARGUMENT,
            "{a:?}"
        );
    }
    raw.write(ep.ctrl + ulnic_abi::ctrl::TRIPWIRE_FIRED, &[1; 3]);
    let mut ids = Vec::new();
    for flags in [w, tripwire_flags::READ, w | tripwire_flags::PERSISTENT] {
        let r = raw.ok(cmd::SET_TRIPWIRE, tw(mine, 0, 4096, flags).as_bytes());
        let id = ObjectId::read_from_bytes(&r).unwrap().id.get();
        let fired = raw.read(ep.ctrl + ulnic_abi::ctrl::TRIPWIRE_FIRED + u64::from(id), 1);
        assert_eq!(fired, [0], "tripwire {id}'s fired byte");
        ids.push(id);
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    assert_eq!(
        raw.status(cmd::SET_TRIPWIRE, &tw(mine, 0, 8, w)),
        status::NO_RESOURCES
    );
    let per_endpoint = SetTripwire {
        endpoint: other.id.into(),
        ..tw(theirs, 0, 8, w)
    };
    assert_eq!(raw.status(cmd::SET_TRIPWIRE, &per_endpoint), status::OK);
    let clear = |ep: &spec::Ep, id: u32| ClearTripwire {
        endpoint: ep.id.into(),
        tripwire: id.into(),
    };
    assert_eq!(
        raw.status(cmd::CLEAR_TRIPWIRE, &clear(&other, ids[1])),
        status::NOT_FOUND
    );
    assert_eq!(
        raw.status(cmd::CLEAR_TRIPWIRE, &clear(&ep, ids[1])),
        status::OK
    );
    assert_eq!(
        raw.status(cmd::CLEAR_TRIPWIRE, &clear(&ep, ids[1])),
        status::NOT_FOUND
    );
    assert_eq!(
        raw.status(cmd::SET_TRIPWIRE, &tw(mine, 0, 8, w)),
        status::OK
    );
}

/// §4.2 UTLB_SET_TABLE and UTLB_INVALIDATE: the domain exists
/// (NOT_FOUND); 1 <= entries <= 2^20 and the table 8-byte aligned
/// (INVALID_ARGUMENT); the whole table in shared memory (BAD_ADDRESS);
/// any range may be invalidated.
#[test]
fn s4_2_utlb_set_table_and_invalidate() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let set = |pd: u32, entries: u32, gpa: u64| UtlbSetTable {
        pd: pd.into(),
        entries: entries.into(),
        table_gpa: gpa.into(),
    };
    let t = raw.alloc(4096);
    assert_eq!(
        raw.status(cmd::UTLB_SET_TABLE, &set(pd.id + 100, 1, t)),
        status::NOT_FOUND
    );
    for bad in [
        set(pd.id, 0, t),
        set(pd.id, (1 << 20) + 1, 0),
        set(pd.id, 1, t + 4),
    ] {
        assert_eq!(
            raw.status(cmd::UTLB_SET_TABLE, &bad),
            status::INVALID_ARGUMENT
        );
    }
    let end = MEM as u64;
    for bad in [
        set(pd.id, 2, end - 8),
        set(pd.id, 1, end),
        set(pd.id, 1 << 20, 8),
    ] {
        assert_eq!(raw.status(cmd::UTLB_SET_TABLE, &bad), status::BAD_ADDRESS);
    }
    // 2^20 entries of 8 bytes: the whole 8 MiB of shared memory.
    assert_eq!(
        raw.status(cmd::UTLB_SET_TABLE, &set(pd.id, 1 << 20, 0)),
        status::OK
    );
    assert_eq!(
        raw.status(cmd::UTLB_SET_TABLE, &set(pd.id, 1, t)),
        status::OK
    );
    let inv = |pd: u32, first: u32, count: u32| UtlbInvalidate {
        pd: pd.into(),
        first: first.into(),
        count: count.into(),
    };
    assert_eq!(
        raw.status(cmd::UTLB_INVALIDATE, &inv(pd.id, u32::MAX, u32::MAX)),
        status::OK
    );
    assert_eq!(
        raw.status(cmd::UTLB_INVALIDATE, &inv(pd.id + 100, 0, 1)),
        status::NOT_FOUND
    );
}

/// §4.2 EXPORT_BUFFER: as EXPORT, the range a user buffer named through
/// the domain's UTLB (offset 8-byte aligned), which must translate now:
/// INVALID_ARGUMENT as for NO_TRANSLATION, BAD_ADDRESS for an entry
/// outside shared memory.
#[test]
fn s4_2_export_buffer() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let ep = raw.endpoint_in(pd, SMALL, 1);
    let buffer = |perms: u32, offset: u64, len: u64, first: u32, count: u32| ExportBuffer {
        endpoint: ep.id.into(),
        perms: perms.into(),
        page_offset: offset.into(),
        len: len.into(),
        utlb_first: first.into(),
        utlb_count: count.into(),
    };
    let good = buffer(perm::ALL, 0, 64, 0, 1);
    assert_eq!(
        raw.status(cmd::EXPORT_BUFFER, &good),
        status::INVALID_ARGUMENT,
        "no table"
    );
    let (table, page) = (raw.alloc(4096), raw.alloc(4096));
    let entries = [U64::new(page), U64::new(0), U64::new(1 << 40)];
    raw.write(table, entries.as_bytes());
    let set = UtlbSetTable {
        pd: pd.id.into(),
        entries: 3.into(),
        table_gpa: table.into(),
    };
    raw.ok(cmd::UTLB_SET_TABLE, set.as_bytes());
    let invalid = [
        buffer(0, 0, 64, 0, 1),
        buffer(8, 0, 64, 0, 1),
        buffer(perm::ALL, 0, 0, 0, 1),
        buffer(perm::ALL, 4, 64, 0, 1),
        buffer(perm::ALL, 0, 4097, 0, 1),
        buffer(perm::ALL, 0, 64, 1, 1),
        buffer(perm::ALL, 0, 64, 3, 1),
        buffer(perm::ALL, 0, 64, 0, 0),
    ];
    for a in invalid {
        assert_eq!(
            raw.status(cmd::EXPORT_BUFFER, &a),
            status::INVALID_ARGUMENT,
            "{a:?}"
        );
    }
    let outside = buffer(perm::ALL, 0, 64, 2, 1);
    assert_eq!(
        raw.status(cmd::EXPORT_BUFFER, &outside),
        status::BAD_ADDRESS
    );
    let r = raw.ok(cmd::EXPORT_BUFFER, good.as_bytes());
    let c = Cookie::read_from_bytes(&r).unwrap();
    assert_eq!((c.node.get(), c.reserved.get()), (0, 0));
}

/// §4.3: CREATE_ENDPOINT's checks in the spec's order, each request
/// failing two of them and getting the earlier one's code.
#[test]
fn s4_3_create_endpoint_checks_in_order() {
    let dev = common::device_with(1, |b| b.max_endpoints(2));
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    raw.endpoint_in(pd, SMALL, 1);
    raw.endpoint_in(pd, SMALL, 1);
    let good = raw.endpoint_args(pd.id, SMALL, 1);
    let end = MEM as u64;
    let with = |f: &dyn Fn(&mut CreateEndpoint)| {
        let mut a = good;
        f(&mut a);
        a
    };
    let cases = [
        // PD, then ring sizes.
        (
            with(&|a| {
                a.pd = (pd.id + 100).into();
                a.send_entries = 3.into();
            }),
            status::NOT_FOUND,
        ),
        // Ring sizes, then the control region's address in memory.
        (
            with(&|a| {
                a.recv_entries = 3.into();
                a.ctrl_gpa = end.into();
            }),
            status::INVALID_ARGUMENT,
        ),
        // Alignment and length of the control region, then memory.
        (
            with(&|a| a.ctrl_gpa = (end + 8).into()),
            status::INVALID_ARGUMENT,
        ),
        (
            with(&|a| {
                a.ctrl_len = (a.ctrl_len.get() + 8).into();
                a.ctrl_gpa = end.into();
            }),
            status::INVALID_ARGUMENT,
        ),
        (
            with(&|a| {
                a.ctrl_len = (a.ctrl_len.get() - 4096).into();
                a.ctrl_gpa = end.into();
            }),
            status::INVALID_ARGUMENT,
        ),
        // The control region in memory, then seg_pages.
        (
            with(&|a| {
                a.ctrl_gpa = (end - 4096).into();
                a.seg_pages = 262_145.into();
            }),
            status::BAD_ADDRESS,
        ),
        // seg_pages, then the table in memory.
        (
            with(&|a| {
                a.seg_pages = 262_145.into();
                a.seg_table_gpa = end.into();
            }),
            status::INVALID_ARGUMENT,
        ),
        // The table and its entries, then a free slot.
        (
            with(&|a| a.seg_table_gpa = (end - 4).into()),
            status::BAD_ADDRESS,
        ),
        (good, status::NO_RESOURCES),
    ];
    let before = counts(&dev, 0);
    for (i, (args, want)) in cases.iter().enumerate() {
        assert_eq!(raw.status(cmd::CREATE_ENDPOINT, args), *want, "case {i}");
    }
    for entry in [1, 4095, end, !4095] {
        raw.write_obj(good.seg_table_gpa.get(), &U64::new(entry));
        let got = raw.status(cmd::CREATE_ENDPOINT, &good);
        assert_eq!(got, status::BAD_ADDRESS, "page {entry:#x}");
    }
    assert_eq!(counts(&dev, 0), before);
}

/// §4.3, §3: ring entries are powers of two in 2..=65536 and the event
/// ring holds at least send_entries + 32; the control region is page
/// aligned, a whole number of pages, and at least the layout (§5.1).
#[test]
fn s4_3_ring_sizes_and_the_control_region() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let layout = |s: u32, r: u32, f: u32, e: u32| RingLayout {
        send_entries: s,
        recv_entries: r,
        free_entries: f,
        event_entries: e,
    };
    let refused = [
        layout(0, 8, 8, 64),
        layout(1, 8, 8, 64),
        layout(3, 8, 8, 64),
        layout(8, 3, 8, 64),
        layout(8, 8, 6, 64),
        layout(8, 8, 8, 48),
        layout(64, 8, 8, 64),
        layout(2, 2, 2, 32),
        layout(8, 8, 131_072, 64),
    ];
    for l in refused {
        let mut args = raw.endpoint_args(pd.id, SMALL, 1);
        args.send_entries = l.send_entries.into();
        args.recv_entries = l.recv_entries.into();
        args.free_entries = l.free_entries.into();
        args.event_entries = l.event_entries.into();
        let got = raw.status(cmd::CREATE_ENDPOINT, &args);
        assert_eq!(got, status::INVALID_ARGUMENT, "{l:?}");
    }
    for l in [layout(2, 2, 2, 64), layout(32, 2, 65_536, 64)] {
        let args = raw.endpoint_args(pd.id, l, 1);
        assert_eq!(raw.status(cmd::CREATE_ENDPOINT, &args), status::OK, "{l:?}");
    }
    // The region exactly as long as the layout, in whole pages, and not.
    let exact = raw.endpoint_args(pd.id, SMALL, 1);
    let size = 4096 + 8 * 128 + 8 * 128 + 8 * 32 + 64 * 32;
    assert_eq!(SMALL.region_size(), size);
    assert_eq!(exact.ctrl_len.get(), size.next_multiple_of(4096));
    let mut unpaged = exact;
    unpaged.ctrl_len = size.into();
    assert_eq!(
        raw.status(cmd::CREATE_ENDPOINT, &unpaged),
        status::INVALID_ARGUMENT
    );
    assert_eq!(raw.status(cmd::CREATE_ENDPOINT, &exact), status::OK);
}

/// §4.3: `seg_pages` = 0 is valid with any `seg_table_gpa`; such an
/// endpoint cannot EXPORT, sends and receives inline messages, and
/// discards every free descriptor (outside its empty segment, §5.5), so
/// longer messages meet NO_BUFFER.
#[test]
fn s4_3_zero_segment_pages_accept_any_table_address() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let mut args = raw.endpoint_args(pd.id, SMALL, 0);
    args.seg_table_gpa = u64::MAX.into();
    let mut z = raw.create(pd, &args);
    raw.bind(&z, 9);
    let export = Export {
        endpoint: z.id.into(),
        perms: perm::ALL.into(),
        offset: 0.into(),
        len: 8.into(),
    };
    assert_eq!(raw.status(cmd::EXPORT, &export), status::INVALID_ARGUMENT);
    let mut s = raw.bound(5);
    raw.post(&mut s, &spec::send_inline((0, 9), 1, 0, b"hi"));
    let m = raw.recv(&mut z);
    assert_eq!(
        (m.flags.get(), spec::payload(&m)),
        (recv_flags::INLINE, &b"hi"[..])
    );
    raw.give(&mut z, 0, 4096, 7);
    raw.post(&mut s, &send_segment((0, 9), 2, 11, 0, 200));
    let e = raw.event(&mut s);
    assert_eq!(
        (e.kind.get(), e.code.get()),
        (ulnic_abi::event::TX_ERROR, 2)
    );
    let mut conditions =
        [raw.event(&mut z), raw.event(&mut z)].map(|e| (e.kind.get(), e.code.get()));
    conditions.sort_unstable();
    assert_eq!(
        conditions,
        [(3, 1), (3, 2)],
        "BAD_FREE_DESCRIPTOR and RECV_DROPPED"
    );
    assert_eq!(raw.stat(&z, "bad_descriptors"), 1);
    raw.post(&mut z, &spec::send_inline((0, 5), 3, 0, b"back"));
    assert_eq!(spec::payload(&raw.recv(&mut s)), b"back");
}

/// §4.3: the page table is copied at creation, byte by byte (it needs no
/// alignment; later changes to it have no effect).
#[test]
fn s4_3_the_page_table_is_copied_at_creation() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let (p, q) = (raw.alloc(4096), raw.alloc(4096));
    raw.write(p, &pattern(4096, 1));
    raw.write(q, &pattern(4096, 2));
    let mut args = raw.endpoint_args(pd.id, SMALL, 1);
    let table = raw.alloc(4096) + 3;
    raw.write_obj(table, &U64::new(p));
    args.seg_table_gpa = table.into();
    let mut s = raw.create(pd, &args);
    raw.bind(&s, 5);
    raw.write_obj(table, &U64::new(q));
    let mut r = raw.bound(9);
    raw.give(&mut r, 0, 4096, 1);
    raw.post(&mut s, &send_segment((0, 9), 0, 0, 100, 300));
    let m = raw.recv(&mut r);
    assert_eq!((m.flags.get(), m.buf_id.get()), (0, 1));
    assert_eq!(
        raw.read(r.seg + spec::buffer_offset(&m), 300),
        pattern(4096, 1)[100..400]
    );
}

/// §4.3: the segment is the concatenation of its pages in table order.
#[test]
fn s4_3_the_segment_is_its_pages_in_table_order() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let a = raw.alloc(4096);
    let b = raw.alloc(8192) + 4096;
    raw.write(a, &pattern(4096, 1));
    raw.write(b, &pattern(4096, 2));
    let mut args = raw.endpoint_args(pd.id, SMALL, 2);
    raw.write(
        args.seg_table_gpa.get(),
        [U64::new(b), U64::new(a)].as_bytes(),
    );
    args.seg_pages = 2.into();
    let mut s = raw.create(pd, &args);
    raw.bind(&s, 5);
    let mut r = raw.bound(9);
    raw.give(&mut r, 0, 4096, 1);
    raw.post(&mut s, &send_segment((0, 9), 0, 0, 4000, 200));
    let m = raw.recv(&mut r);
    let want = [&pattern(4096, 2)[4000..], &pattern(4096, 1)[..104]].concat();
    assert_eq!(raw.read(r.seg + spec::buffer_offset(&m), 200), want);
}

/// §4.3, §5.2: the device zeroes the control block at creation but for
/// the endpoint's session id (§5.4; nonzero, and another for the next
/// endpoint) and the doorbell wanted word (the device's to set again at
/// once, §5.8).
#[test]
fn s4_3_the_control_block_is_zeroed() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let args = raw.endpoint_args(pd.id, SMALL, 1);
        raw.fill(args.ctrl_gpa.get(), 4096, 0xff);
        let ep = raw.create(pd, &args);
        let mut block = raw.read(ep.ctrl, 4096);
        let wanted = ulnic_abi::ctrl::DOORBELL_WANTED as usize;
        block[wanted..wanted + 4].fill(0);
        let at = ulnic_abi::ctrl::SESSION as usize;
        let session = u32::from_le_bytes(block[at..at + 4].try_into().unwrap());
        block[at..at + 4].fill(0);
        assert!(block.iter().all(|&b| b == 0), "control block not zeroed");
        assert_ne!(session, 0, "no session id");
        sessions.push(session);
    }
    assert_ne!(sessions[0], sessions[1], "a session id used twice");
}

/// §4.3, §3: a segment of 262144 pages (1 GiB) is accepted and one page
/// more is not (every entry may name the same page); the segment is then
/// 1 GiB long.
#[test]
fn s4_3_a_segment_of_262144_pages() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let pd = raw.pd();
    let page = raw.alloc(4096);
    let pages = 262_144u32;
    let table = raw.alloc(u64::from(pages + 1) * 8);
    let entries = vec![U64::new(page); pages as usize + 1];
    raw.write(table, entries.as_bytes());
    let mut args = raw.endpoint_args(pd.id, SMALL, 1);
    args.seg_table_gpa = table.into();
    args.seg_pages = (pages + 1).into();
    assert_eq!(
        raw.status(cmd::CREATE_ENDPOINT, &args),
        status::INVALID_ARGUMENT
    );
    args.seg_pages = pages.into();
    let ep = raw.create(pd, &args);
    let export = |offset: u64| Export {
        endpoint: ep.id.into(),
        perms: perm::READ.into(),
        offset: offset.into(),
        len: 8.into(),
    };
    assert_eq!(raw.status(cmd::EXPORT, &export((1 << 30) - 8)), status::OK);
    assert_eq!(
        raw.status(cmd::EXPORT, &export(1 << 30)),
        status::INVALID_ARGUMENT
    );
}
