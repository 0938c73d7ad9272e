//! A hostile frontend: malformed commands, descriptors and ring indices get
//! clear errors for that command or endpoint; the device keeps serving
//! everyone, and nothing lands outside what was granted.
use ulnic_testkit as common;

use std::time::{Duration, Instant};
use ulnic_abi::{
    cmd, condition, ctrl, event, op, send_flags, status, tx_error, wire, CreateEndpoint,
    EventRecord, SendDesc, INLINE_OFFSET,
};
use ulnic_host_attach::HostAttach;
use zerocopy::IntoBytes;

use common::raw::{bind, create_pd, raw_endpoint, status_of};

fn desc(d: SendDesc) -> [u8; 128] {
    let mut b = [0u8; 128];
    d.encode_header(&mut b);
    b
}

fn good(dest_port: u32, len: u32) -> SendDesc {
    SendDesc {
        opcode: op::SEND,
        flags: send_flags::INLINE,
        len,
        dest_node: 1,
        dest_port,
        tag: 0,
        user_id: 99,
        seg_offset: 0,
    }
}

#[test]
fn malformed_commands_get_clear_errors() {
    let dev = common::device(2);
    let hw = HostAttach::connect(&common::socket(&dev, 0), 1 << 20).unwrap();
    assert_eq!(status_of(hw.command(0x7777, &[])), status::UNKNOWN_COMMAND);
    assert_eq!(
        status_of(hw.command(cmd::DESTROY_PD, &[1, 2])),
        status::BAD_LENGTH
    );
    assert_eq!(
        status_of(hw.command(cmd::DESTROY_PD, &9u32.to_le_bytes())),
        status::NOT_FOUND
    );
    assert_eq!(
        status_of(hw.command(cmd::CREATE_ENDPOINT, &[0; 10])),
        status::BAD_LENGTH
    );
    let pd = create_pd(&hw).id;
    let base = CreateEndpoint {
        pd,
        send_entries: 8,
        recv_entries: 8,
        free_entries: 8,
        event_entries: 64,
        ctrl_gpa: 0x80000,
        ctrl_len: 0x10000,
        seg_table_gpa: 0x90000,
        seg_pages: 1,
    };
    let create = |c: CreateEndpoint| status_of(hw.command(cmd::CREATE_ENDPOINT, &c.encode()));
    assert_eq!(create(CreateEndpoint { pd: 77, ..base }), status::NOT_FOUND);
    assert_eq!(
        create(CreateEndpoint {
            send_entries: 6,
            ..base
        }),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        create(CreateEndpoint {
            event_entries: 16,
            ..base
        }),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        create(CreateEndpoint {
            ctrl_gpa: 0x80001,
            ..base
        }),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        create(CreateEndpoint {
            ctrl_len: 100,
            ..base
        }),
        status::INVALID_ARGUMENT
    );
    assert_eq!(
        create(CreateEndpoint {
            ctrl_gpa: 1 << 40,
            ..base
        }),
        status::BAD_ADDRESS
    );
    assert_eq!(
        create(CreateEndpoint {
            ctrl_gpa: !0xfffu64,
            ..base
        }),
        status::BAD_ADDRESS
    );
    assert_eq!(
        create(CreateEndpoint {
            seg_table_gpa: u64::MAX - 3,
            ..base
        }),
        status::BAD_ADDRESS
    );
    assert_eq!(
        create(CreateEndpoint {
            seg_pages: u32::MAX,
            ..base
        }),
        status::INVALID_ARGUMENT
    );
    // A segment page outside the shared memory.
    hw.memory().write(0x90000, &(1u64 << 42).to_le_bytes());
    assert_eq!(create(base), status::BAD_ADDRESS);
    hw.memory().write(0x90000, &0xa0000u64.to_le_bytes());
    assert_eq!(create(base), status::OK);
    // Bindings and filters.
    assert_eq!(
        status_of(hw.command(cmd::BIND_PORT, &[0u8; 8])),
        status::INVALID_ARGUMENT
    );
    let bind = |ep: u32, port: u32| {
        let mut p = ep.to_le_bytes().to_vec();
        p.extend_from_slice(&port.to_le_bytes());
        status_of(hw.command(cmd::BIND_PORT, &p))
    };
    assert_eq!(bind(0, 5), status::OK);
    assert_eq!(bind(40, 6), status::NOT_FOUND);
    // 17 entries announced, none given: the length is wrong first (spec §4).
    let mut f = 0u32.to_le_bytes().to_vec();
    f.extend_from_slice(&17u32.to_le_bytes());
    assert_eq!(
        status_of(hw.command(cmd::SET_FILTER, &f)),
        status::BAD_LENGTH
    );
    let mut f = 0u32.to_le_bytes().to_vec();
    f.extend_from_slice(&2u32.to_le_bytes());
    assert_eq!(
        status_of(hw.command(cmd::SET_FILTER, &f)),
        status::BAD_LENGTH
    );
    assert_eq!(
        status_of(hw.command(cmd::ARM, &50u32.to_le_bytes())),
        status::NOT_FOUND
    );
    assert_eq!(
        status_of(hw.command(cmd::DESTROY_ENDPOINT, &50u32.to_le_bytes())),
        status::NOT_FOUND
    );
    // Another client on the other node is unaffected and sees the binding conflict rules per node.
    let other = HostAttach::connect(&common::socket(&dev, 1), 1 << 20).unwrap();
    assert_eq!(other.info().node, 1);
    assert_eq!(bind(0, 5), status::ADDRESS_IN_USE);
}

/// Sends the device refuses, each with its TX_ERROR code, in the order of
/// spec §5.9 (a bound sender to node 1, port 3 bound, no free buffer).
fn refused_sends() -> Vec<(SendDesc, u16)> {
    vec![
        (
            SendDesc {
                opcode: 9,
                ..good(3, 4)
            },
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            SendDesc {
                flags: 0x80,
                ..good(3, 4)
            },
            tx_error::BAD_DESCRIPTOR,
        ),
        (good(3, 97), tx_error::BAD_DESCRIPTOR),
        (
            SendDesc {
                len: u32::MAX,
                ..good(3, 4)
            },
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            SendDesc {
                flags: 0,
                seg_offset: 8000,
                len: 500,
                ..good(3, 0)
            },
            tx_error::BAD_ADDRESS,
        ),
        (
            SendDesc {
                flags: 0,
                seg_offset: u64::MAX - 10,
                len: 500,
                ..good(3, 0)
            },
            tx_error::BAD_ADDRESS,
        ),
        (
            SendDesc {
                dest_node: 7,
                ..good(3, 4)
            },
            tx_error::NO_ENDPOINT,
        ),
        (
            SendDesc {
                dest_node: u32::MAX,
                ..good(3, 4)
            },
            tx_error::NO_ENDPOINT,
        ),
        (good(4, 4), tx_error::NO_ENDPOINT),
    ]
}

#[test]
fn malformed_descriptors_and_indices_are_contained() {
    let dev = common::device(2);
    let a = HostAttach::connect(&common::socket(&dev, 0), 1 << 20).unwrap();
    let b = HostAttach::connect(&common::socket(&dev, 1), 1 << 20).unwrap();
    let (pa, pb) = (create_pd(&a), create_pd(&b));
    let mut ea = raw_endpoint(&a, pa);
    let eb = raw_endpoint(&b, pb);

    // Unbound sender.
    ea.send_raw(&a, &desc(good(3, 4)));
    let ev = ea.next_event(&a);
    assert_eq!(
        (ev.kind, ev.code, ev.user_id),
        (event::TX_ERROR, tx_error::NOT_BOUND, 99)
    );
    bind(&a, ea.id, 1);
    bind(&b, eb.id, 3);

    let cases = refused_sends();
    for (d, code) in cases {
        ea.send_raw(&a, &desc(d));
        let ev = ea.next_event(&a);
        assert_eq!(
            (ev.kind, ev.code),
            (event::TX_ERROR, code),
            "descriptor {d:?}"
        );
    }
    // Every refusal was the sender's own or immediate: the receiver got nothing.
    assert_eq!(eb.word(&b, ctrl::RECV_PRODUCER), 0);
    assert_eq!(eb.word(&b, ctrl::EVENT_PRODUCER), 0);

    // The receiver has no usable free buffer: the fabric NACKs the message
    // and tries again (spec §10.4). A free buffer outside the receiver's
    // segment is discarded and reported meanwhile; the message lands once
    // a good one is posted.
    let free_slot = eb.ctrl.gpa + eb.layout.free_offset();
    let free = |slot: u64, seg_offset: u64, user_id: u64| {
        let mut fd = [0u8; 32];
        ulnic_abi::FreeDesc {
            seg_offset,
            len: 4096,
            user_id,
        }
        .encode(&mut fd);
        b.memory().write(free_slot + 32 * slot, &fd);
        eb.set(&b, ctrl::FREE_PRODUCER, slot as u32 + 1);
    };
    free(0, 1 << 20, 1);
    ea.send_raw(
        &a,
        &desc(SendDesc {
            flags: send_flags::COMPLETION,
            seg_offset: 0,
            len: 500,
            ..good(3, 0)
        }),
    );
    let dropped = || {
        let n = &dev.snapshot().nodes[1];
        let e = n.endpoints.iter().find(|e| e.port == Some(3));
        e.map_or(0, |e| common::device::stat(e, "rx_dropped_no_buffer"))
    };
    common::wait_until(Duration::from_secs(10), "two tries of the message", || {
        dropped() >= 2
    });
    let mut ev = [0u8; 32];
    b.memory()
        .read(eb.ctrl.gpa + eb.layout.event_offset(), &mut ev);
    assert_eq!(
        EventRecord::decode(&ev).code,
        condition::BAD_FREE_DESCRIPTOR
    );
    free(1, 4096, 2);
    let ev = ea.next_event(&a);
    assert_eq!(
        (ev.kind, ev.code),
        (event::TX_DONE, 0),
        "retried, not refused"
    );
    let mut r = [0u8; 128];
    b.memory()
        .read(eb.ctrl.gpa + eb.layout.recv_offset(), &mut r);
    let rd = ulnic_abi::RecvDesc::decode(&r);
    assert_eq!((rd.len, rd.buf_id, rd.buf_offset), (500, 2, 4096));

    // An impossible producer index: ignored, reported once, endpoint keeps working.
    let before = ea.send_prod;
    a.memory()
        .store_u32(ea.ctrl.gpa + ctrl::SEND_PRODUCER, before + 1000);
    a.ring_doorbell(&ea.domain, ea.id);
    let ev = ea.next_event(&a);
    assert_eq!(
        (ev.kind, ev.code),
        (event::CONDITION, condition::RING_INDEX)
    );
    a.memory()
        .store_u32(ea.ctrl.gpa + ctrl::SEND_PRODUCER, before);

    // A good message still goes through, with the true source stamped.
    let mut d = desc(good(3, 5));
    d[INLINE_OFFSET..INLINE_OFFSET + 5].copy_from_slice(b"hello");
    ea.send_raw(&a, &d);
    common::wait_until(Duration::from_secs(5), "the good message", || {
        eb.word(&b, ctrl::RECV_PRODUCER) == 2
    });
    let mut r = [0u8; 128];
    b.memory()
        .read(eb.ctrl.gpa + eb.layout.recv_offset() + 128, &mut r);
    let rd = ulnic_abi::RecvDesc::decode(&r);
    assert_eq!((rd.src_node, rd.src_port, rd.len), (0, 1, 5));
    assert_eq!(&r[INLINE_OFFSET..INLINE_OFFSET + 5], b"hello");
    // Nothing but the message retried was written into the receiver's
    // segment: no failed send wrote there.
    let mut seg = vec![0u8; 8192];
    b.memory().read(eb.seg.gpa, &mut seg);
    seg[4096..4096 + 500].fill(0);
    assert!(seg.iter().all(|&x| x == 0));
}

/// A send descriptor naming UTLB entries (with a completion event).
fn utlb_send(first: u32, count: u32, offset: u64, len: u32) -> [u8; 128] {
    let mut b = desc(SendDesc {
        flags: send_flags::UTLB | send_flags::COMPLETION,
        seg_offset: offset,
        len,
        ..good(3, 0)
    });
    b[ulnic_abi::SEND_UTLB_REF_OFFSET..][..4].copy_from_slice(&first.to_le_bytes());
    b[ulnic_abi::SEND_UTLB_REF_OFFSET + 4..][..4].copy_from_slice(&count.to_le_bytes());
    b
}

fn stat(hw: &HostAttach, ep: u32, name: &str) -> u64 {
    let r = hw.command(cmd::GET_STATS, &ep.to_le_bytes()).unwrap();
    let i = ulnic_abi::STAT_NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap();
    ulnic_abi::read_le64(&r, i * 8)
}

/// EXPORT_BUFFER on `ea`, whose domain's table (entries 0 and 1 two pages
/// of memory, 2 not installed, 4 outside it) is set: the send path's
/// translation checks, as statuses.
fn exported_buffers_are_checked_as_translations(a: &HostAttach, ea_id: u32) {
    let export = |ep: u32, perms: u32, offset: u64, len: u64, first: u32, count: u32| {
        let p = wire::ExportBuffer {
            endpoint: ep.into(),
            perms: perms.into(),
            page_offset: offset.into(),
            len: len.into(),
            utlb_first: first.into(),
            utlb_count: count.into(),
        };
        status_of(a.command(cmd::EXPORT_BUFFER, p.as_bytes()))
    };
    let rw = ulnic_abi::perm::ALL;
    assert_eq!(export(ea_id, rw, 8, 8000, 0, 2), status::OK);
    assert_eq!(export(77, rw, 0, 8, 0, 1), status::NOT_FOUND);
    assert_eq!(export(ea_id, 0, 0, 8, 0, 1), status::INVALID_ARGUMENT);
    assert_eq!(export(ea_id, 8, 0, 8, 0, 1), status::INVALID_ARGUMENT);
    assert_eq!(export(ea_id, rw, 0, 0, 0, 1), status::INVALID_ARGUMENT);
    assert_eq!(export(ea_id, rw, 4, 8, 0, 1), status::INVALID_ARGUMENT);
    assert_eq!(export(ea_id, rw, 0, 8193, 0, 2), status::INVALID_ARGUMENT);
    assert_eq!(export(ea_id, rw, 0, 8, 2, 1), status::INVALID_ARGUMENT);
    assert_eq!(
        export(ea_id, rw, 0, 8, 7, u32::MAX),
        status::INVALID_ARGUMENT
    );
    assert_eq!(export(ea_id, rw, 0, 8, 4, 1), status::BAD_ADDRESS);
    assert_eq!(
        status_of(a.command(cmd::EXPORT_BUFFER, &[0; 28])),
        status::BAD_LENGTH
    );
}

#[test]
fn utlb_tables_and_references_are_checked() {
    let dev = common::device(2);
    let a = HostAttach::connect(&common::socket(&dev, 0), 1 << 20).unwrap();
    let b = HostAttach::connect(&common::socket(&dev, 1), 1 << 20).unwrap();
    let (pa, pb) = (create_pd(&a), create_pd(&b));
    let mut ea = raw_endpoint(&a, pa);
    let eb = raw_endpoint(&b, pb);
    let pa = pa.id;
    bind(&a, ea.id, 1);
    bind(&b, eb.id, 3);
    let done = (event::TX_DONE, 0);
    let err = |code| (event::TX_ERROR, code);
    let ea_id = ea.id;
    let mut send = |d: [u8; 128]| {
        ea.send_raw(&a, &d);
        let ev = ea.next_event(&a);
        (ev.kind, ev.code)
    };
    assert_eq!(
        send(utlb_send(0, 1, 0, 8)),
        err(tx_error::NO_TRANSLATION),
        "no table yet"
    );

    let set_table = |pd: u32, entries: u32, gpa: u64| {
        let p = wire::UtlbSetTable {
            pd: pd.into(),
            entries: entries.into(),
            table_gpa: gpa.into(),
        };
        status_of(a.command(cmd::UTLB_SET_TABLE, p.as_bytes()))
    };
    let mem = a.memory();
    let table = mem.alloc(4096).unwrap();
    let page = mem.alloc(8192).unwrap();
    assert_eq!(set_table(77, 8, table.gpa), status::NOT_FOUND);
    assert_eq!(set_table(pa, 0, table.gpa), status::INVALID_ARGUMENT);
    assert_eq!(
        set_table(pa, ulnic_abi::MAX_UTLB_ENTRIES + 1, table.gpa),
        status::INVALID_ARGUMENT
    );
    assert_eq!(set_table(pa, 8, table.gpa + 4), status::INVALID_ARGUMENT);
    assert_eq!(set_table(pa, 8, (1 << 20) - 16), status::BAD_ADDRESS);
    assert_eq!(set_table(pa, 8, u64::MAX - 7), status::BAD_ADDRESS);
    assert_eq!(
        status_of(a.command(cmd::UTLB_SET_TABLE, &[0; 8])),
        status::BAD_LENGTH
    );
    assert_eq!(set_table(pa, 8, table.gpa), status::OK);
    let entries: Vec<u8> = [
        page.gpa,
        page.gpa + 4096,
        0,
        0x1234,
        1 << 40,
        page.gpa,
        0,
        0,
    ]
    .iter()
    .flat_map(|e| e.to_le_bytes())
    .collect();
    mem.write(table.gpa, &entries);

    assert_eq!(send(utlb_send(0, 1, 100, 50)), done);
    assert_eq!(send(utlb_send(0, 2, 4000, 96)), done, "across two pages");
    let cases = [
        (utlb_send(8, 1, 0, 8), err(tx_error::NO_TRANSLATION)),
        (utlb_send(7, 2, 0, 8), err(tx_error::NO_TRANSLATION)),
        (utlb_send(0, 0, 0, 0), err(tx_error::NO_TRANSLATION)),
        (utlb_send(u32::MAX, 2, 0, 8), err(tx_error::NO_TRANSLATION)),
        (
            utlb_send(0, ulnic_abi::MAX_UTLB_RUN + 1, 0, 8),
            err(tx_error::NO_TRANSLATION),
        ),
        (utlb_send(0, 1, 4096, 8), err(tx_error::NO_TRANSLATION)),
        (utlb_send(0, 1, 100, 4000), err(tx_error::NO_TRANSLATION)),
        (utlb_send(2, 1, 0, 8), err(tx_error::NO_TRANSLATION)),
        (utlb_send(3, 1, 0, 8), err(tx_error::BAD_ADDRESS)),
        (utlb_send(4, 1, 0, 8), err(tx_error::BAD_ADDRESS)),
        (
            {
                let mut d = utlb_send(0, 1, 0, 8);
                let w: &mut wire::SendDesc = zerocopy::transmute_mut!(&mut d);
                w.flags = (w.flags.get() | send_flags::INLINE).into();
                d
            },
            err(tx_error::BAD_DESCRIPTOR),
        ),
    ];
    for (i, (d, want)) in cases.into_iter().enumerate() {
        assert_eq!(send(d), want, "case {i}");
    }

    // The device caches translations until the driver invalidates them.
    let misses = stat(&a, ea_id, "utlb_misses");
    assert_eq!(send(utlb_send(5, 1, 0, 8)), done);
    assert_eq!(stat(&a, ea_id, "utlb_misses"), misses + 1);
    assert_eq!(send(utlb_send(5, 1, 0, 8)), done);
    assert_eq!(
        stat(&a, ea_id, "utlb_misses"),
        misses + 1,
        "second use hits"
    );
    mem.write(table.gpa + 5 * 8, &0u64.to_le_bytes());
    assert_eq!(send(utlb_send(5, 1, 0, 8)), done, "stale until invalidated");
    let inval = |pd: u32, first: u32, count: u32| {
        let p = wire::UtlbInvalidate {
            pd: pd.into(),
            first: first.into(),
            count: count.into(),
        };
        status_of(a.command(cmd::UTLB_INVALIDATE, p.as_bytes()))
    };
    assert_eq!(inval(77, 5, 1), status::NOT_FOUND);
    assert_eq!(
        status_of(a.command(cmd::UTLB_INVALIDATE, &[0; 4])),
        status::BAD_LENGTH
    );
    assert_eq!(inval(pa, 0, u32::MAX), status::OK, "any range is fine");
    assert_eq!(send(utlb_send(5, 1, 0, 8)), err(tx_error::NO_TRANSLATION));

    // Another domain on the same node does not see this table.
    let mut ec = raw_endpoint(&a, create_pd(&a));
    bind(&a, ec.id, 2);
    ec.send_raw(&a, &utlb_send(0, 1, 0, 8));
    let ev = ec.next_event(&a);
    assert_eq!((ev.kind, ev.code), err(tx_error::NO_TRANSLATION));
    exported_buffers_are_checked_as_translations(&a, ea_id);
    // Everything still works for everyone.
    assert_eq!(send(utlb_send(0, 1, 0, 8)), done);
}

#[test]
fn malformed_control_chains_are_refused_and_the_queue_keeps_working() {
    let dev = common::device(1);
    let a = HostAttach::connect(&common::socket(&dev, 0), 1 << 20).unwrap();
    let mem = a.memory();
    let buf = mem.alloc(8192).unwrap();
    let (req, resp) = (buf.gpa, buf.gpa + 4096);
    // GET_INFO, its 8-byte header split over two readable buffers.
    mem.write(req, &ulnic_abi::cmd::GET_INFO.to_le_bytes());
    mem.write(req + 4, &0u32.to_le_bytes());
    let good = a
        .raw_control_chain(&[(req, 4), (req + 4, 4)], &[(resp, 512)])
        .unwrap();
    assert_eq!(
        good as usize,
        8 + ulnic_abi::DeviceInfo::SIZE,
        "a split request works"
    );
    /// (address, length) buffers of a chain.
    type Bufs<'a> = &'a [(u64, u32)];
    let cases: [(Bufs, Bufs, &str); 6] = [
        (&[(req, 8)], &[], "no writable buffer"),
        (&[(req, 8)], &[(resp, 4)], "no room for a response header"),
        (
            &[(1 << 40, 8)],
            &[(resp, 512)],
            "request outside shared memory",
        ),
        (
            &[(req, 8)],
            &[(1 << 40, 512)],
            "response outside shared memory",
        ),
        (&[(req, 3)], &[(resp, 512)], "request shorter than a header"),
        (
            &[(u64::MAX - 3, 8)],
            &[(resp, 512)],
            "request wrapping the address space",
        ),
    ];
    for (readable, writable, what) in cases {
        let used = a.raw_control_chain(readable, writable).unwrap();
        if used >= 8 {
            let mut st = [0u8; 4];
            mem.read(resp, &mut st);
            assert_ne!(u32::from_le_bytes(st), status::OK, "{what}: executed");
        } else {
            assert_eq!(used, 0, "{what}");
        }
    }
    // A request longer than any command (8 + 512 bytes) is refused unread,
    // and so is a CREATE_PD with a payload it does not take (spec §4).
    let long = vec![0u8; 8 + 600];
    mem.write(req, &long);
    mem.write(req, &ulnic_abi::cmd::CREATE_PD.to_le_bytes());
    for len in [608, 12] {
        let used = a.raw_control_chain(&[(req, len)], &[(resp, 512)]).unwrap();
        let mut st = [0u8; 4];
        mem.read(resp, &mut st);
        assert_eq!((used, u32::from_le_bytes(st)), (8, status::BAD_LENGTH));
    }
    // Everything still works.
    a.create_pd().unwrap();
}

/// CREATE_PD's doorbell bitmap is checked (spec §4.2, §5.8), a node holds
/// one domain per doorbell queue, and a domain's bitmap rings only its own
/// endpoints.
#[test]
fn doorbell_bitmaps_are_checked_and_confined_to_their_domain() {
    let dev = common::device(1);
    let hw = HostAttach::connect(&common::socket(&dev, 0), 4 << 20).unwrap();
    let create = |gpa: u64| status_of(hw.command(cmd::CREATE_PD, &gpa.to_le_bytes()));
    let page = hw.memory().alloc(4096).unwrap();
    let bitmap = ulnic_abi::doorbell_bitmap_bytes(hw.info().max_endpoints);
    assert_eq!(create(page.gpa + 4), status::INVALID_ARGUMENT, "misaligned");
    assert_eq!(
        create(page.gpa + 4096 - 8),
        if bitmap > 8 {
            status::BAD_ADDRESS
        } else {
            status::OK
        },
        "crossing a page"
    );
    assert_eq!(create(u64::MAX - 7), status::BAD_ADDRESS, "outside memory");
    assert_eq!(create(4 << 20), status::BAD_ADDRESS, "just past memory");
    assert_eq!(
        status_of(hw.command(cmd::CREATE_PD, &[0; 4])),
        status::BAD_LENGTH
    );

    // Two domains; the first one's bitmap names the second's endpoint.
    let (p1, p2) = (create_pd(&hw), create_pd(&hw));
    assert_ne!(p1.doorbell_queue, p2.doorbell_queue);
    let mut e2 = raw_endpoint(&hw, p2);
    bind(&hw, e2.id, 9);
    let doorbells = |ep: u32| {
        let s = hw.command(cmd::GET_STATS, &ep.to_le_bytes()).unwrap();
        let i = ulnic_abi::STAT_NAMES
            .iter()
            .position(|n| *n == "doorbells")
            .unwrap();
        ulnic_abi::read_le64(&s, i * 8)
    };
    // Let the engine sleep: every endpoint then wants doorbells.
    let deadline = Instant::now() + Duration::from_secs(10);
    while e2.word(&hw, ctrl::DOORBELL_WANTED) == 0 {
        assert!(
            Instant::now() < deadline,
            "the device never asked for a doorbell"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Rung through the wrong domain: ignored. The device clears a kicked
    // domain's bitmap and counts what it names in one step under the
    // node's lock, so once the bit is gone the count is final.
    hw.ring_doorbell(&p1, e2.id);
    common::wait_until(
        Duration::from_secs(10),
        "the device to take the wrong domain's bitmap",
        || hw.memory().load_u32(p1.doorbell_gpa) == 0,
    );
    assert_eq!(doorbells(e2.id), 0, "counted through another domain");
    assert_eq!(
        e2.word(&hw, ctrl::DOORBELL_WANTED),
        1,
        "made resident by another domain's doorbell"
    );
    // Rung through its own: counted, and the send is served.
    e2.send_raw(
        &hw,
        &desc(SendDesc {
            dest_node: 0,
            flags: send_flags::INLINE | send_flags::COMPLETION,
            ..good(9, 8)
        }),
    );
    let ev = e2.next_event(&hw);
    assert_eq!(ev.kind, event::TX_DONE);
    // (Consuming the event rings once more, which may be counted too.)
    let rung = doorbells(e2.id);
    assert!(matches!(rung, 1..=2), "{rung} doorbells counted");

    // One domain per doorbell queue.
    let mut more = Vec::new();
    loop {
        match hw.create_pd() {
            Ok(p) => more.push(p),
            Err(ulnic_host_attach::Error::Command { status, .. }) => {
                assert_eq!(status, status::NO_RESOURCES);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        dev.shard().lock().nodes[0].pds.len(),
        ulnic_abi::DOORBELL_QUEUES as usize
    );
    // A freed slot is handed out again.
    hw.destroy_pd(&more[0]).unwrap();
    assert_eq!(
        hw.create_pd().unwrap().doorbell_queue,
        more[0].doorbell_queue
    );
}

/// A frontend whose notification eventfd cannot take another signal: it
/// made the fd blocking and filled its counter to the limit, so a plain
/// write(2) of the device's signal would sleep until the frontend reads.
/// That must cost only that frontend, never the device's other nodes.
#[test]
fn a_call_fd_that_would_block_stalls_only_its_frontend() {
    // A device held by the write would hang this test rather than fail
    // it: run it aside and give up on it after a minute.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        call_fd_that_would_block();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the device is still held after 60 s by one frontend's full call fd")
        }
        Err(e) => panic!("the test body failed: {e}"),
    }
}

fn call_fd_that_would_block() {
    use ulnic::{Address, EndpointConfig, Nic};
    let dev = common::device(4);
    let victim = Nic::attach(&common::socket(&dev, 0)).unwrap();
    let sender = Nic::attach(&common::socket(&dev, 1)).unwrap();
    let pv = victim.alloc_pd().unwrap();
    let ps = sender.alloc_pd().unwrap();
    let mut ev = pv.create_endpoint(&EndpointConfig::default()).unwrap();
    ev.bind(100).unwrap();
    let mut es = ps.create_endpoint(&EndpointConfig::default()).unwrap();
    es.bind(101).unwrap();
    let fd = pv.notification_fd().unwrap();
    // SAFETY: fcntl and write on the frontend's own eventfd, with a live
    // 8-byte buffer.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        assert!(libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0);
        let full = (u64::MAX - 1).to_ne_bytes();
        assert_eq!(libc::write(fd, full.as_ptr().cast(), 8), 8);
    }
    assert!(!ev.arm().unwrap());
    let to = Address { node: 0, port: 100 };
    for i in 0..3u64 {
        es.post_send_inline(to, 1, b"wake", i).unwrap();
    }
    // The device stops that frontend's notification queue (and only it).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dev.shard().lock().nodes[0].queue_broken(ulnic_abi::NOTIFY_QUEUE) {
        assert!(
            Instant::now() < deadline,
            "the full call fd was not noticed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The other nodes go on: both directions, blocking waiters notified.
    common::exchange(&dev, 2, 3);
    common::exchange(&dev, 3, 2);
    assert!(!dev.shard().lock().nodes[1].queue_broken(ulnic_abi::NOTIFY_QUEUE));
    // The victim's messages still arrive; it polls instead of blocking.
    let mut got = 0;
    common::wait_until(
        Duration::from_secs(10),
        "the victim's three messages",
        || {
            got += usize::from(ev.poll_recv().is_some());
            got >= 3
        },
    );
    assert!(ev.poll_recv().is_none(), "more than the three sent");
}
