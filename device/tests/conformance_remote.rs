//! docs/spec.md §5.12 and §5.13 (apertures, cookies, RDMA, tripwires), §6
//! (notifications) and §8 (validation rules), walked in spec order through
//! the frontend of device/tests/common/spec.rs. See conformance.rs for the
//! whole walk.
use ulnic_testkit as common;
#[path = "common/spec.rs"]
mod spec;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use spec::{node_state, pattern, released, send_inline, until, Ep, Raw, SMALL, WAIT};
use ulnic_abi::wire::{
    ClearTripwire, Cookie, EventRecord, ObjectId, RdmaDesc, RedirectDesc, Revoke, SendBuffer,
    SendDesc, SetTripwire, UtlbInvalidate, UtlbSetTable,
};
use ulnic_abi::{
    cmd, condition, ctrl, event, op, perm, send_flags, status, tripwire_flags, tx_error, MAX_RDMA,
};
use vhost::VhostBackend;
use vmm_sys_util::eventfd::EventFd;
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// (kind, code) of an event.
fn kc(e: &EventRecord) -> (u16, u16) {
    (e.kind.get(), e.code.get())
}

/// An RDMA descriptor (§5.12) of `opcode` on `cookie`: `len` bytes at
/// `remote` in the aperture, `local` in the initiator's segment.
fn rdma(opcode: u16, c: &Cookie, remote: u64, local: u64, len: u32, user: u64) -> RdmaDesc {
    let mut d = RdmaDesc::new_zeroed();
    d.opcode = opcode.into();
    d.flags = send_flags::COMPLETION.into();
    d.len = len.into();
    d.cookie_node = c.node;
    d.cookie_aperture = c.aperture;
    d.cookie_generation = c.generation;
    d.cookie_key = c.key;
    d.remote_offset = remote.into();
    d.local_offset = local.into();
    d.user_id = user.into();
    d
}

/// An endpoint of its own domain that is not bound to any port.
fn unbound(raw: &mut Raw) -> Ep {
    let pd = raw.pd();
    raw.endpoint_in(pd, SMALL, 2)
}

/// §5.12: an RDMA write copies bytes into the target's aperture, a read
/// copies them back, immediates store their 4 or 8 bytes; with COMPLETION
/// a TX_DONE names the cookie's node and aperture; the initiator need not
/// be bound; the target is not told (one-sided).
#[test]
fn s5_12_rdma_writes_reads_and_immediates_land() {
    let dev = common::device(2);
    let mut r0 = Raw::new(&common::socket(&dev, 0));
    let t = r0.bound(9);
    let c = r0.export(&t, 4096, 4096, perm::ALL);
    assert_eq!((c.node.get(), c.reserved.get()), (0, 0));
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut i = unbound(&mut r1);
    r1.write(i.seg, &pattern(300, 7));
    r1.post(&mut i, &rdma(op::RDMA_WRITE, &c, 8, 0, 300, 1));
    let e = r1.event(&mut i);
    let fields = (e.user_id.get(), e.node.get(), e.port.get(), e.len.get());
    assert_eq!((kc(&e), e.aux.get()), ((event::TX_DONE, 0), 0));
    assert_eq!(fields, (1, 0, c.aperture.get(), 300));
    assert_eq!(r0.read(t.seg + 4096 + 8, 300), pattern(300, 7));
    r1.post(&mut i, &rdma(op::RDMA_READ, &c, 8, 1000, 300, 2));
    assert_eq!(kc(&r1.event(&mut i)), (event::TX_DONE, 0));
    assert_eq!(r1.read(i.seg + 1000, 300), pattern(300, 7));
    let mut imm8 = rdma(op::WRITE_IMMEDIATE, &c, 512, 0, 8, 3);
    imm8.immediate = 0x1122_3344_5566_7788.into();
    let mut imm4 = rdma(op::WRITE_IMMEDIATE, &c, 604, 0, 4, 4);
    imm4.immediate = 0xaabb_ccdd_0102_0304.into();
    r0.write(t.seg + 4096 + 600, &[0xee; 12]);
    r1.post(&mut i, &imm8);
    r1.post(&mut i, &imm4);
    assert_eq!(kc(&r1.event(&mut i)), (event::TX_DONE, 0));
    assert_eq!(kc(&r1.event(&mut i)), (event::TX_DONE, 0));
    assert_eq!(r0.load64(t.seg + 4096 + 512), 0x1122_3344_5566_7788);
    let around = r0.read(t.seg + 4096 + 600, 12);
    assert_eq!(
        around,
        [[0xee; 4], 0x0102_0304u32.to_le_bytes(), [0xee; 4]].concat()
    );
    assert_eq!(
        (r0.received(&t), r0.events(&t)),
        (0, 0),
        "the target was told"
    );
}

/// §5.12: the checks in order, the first failure posting TX_ERROR and
/// touching nothing: BAD_DESCRIPTOR (flags, len, alignment), BAD_ADDRESS
/// (local range), BAD_COOKIE (node, aperture, generation, key, revoked,
/// destroyed), PERMISSION_DENIED, OUT_OF_RANGE.
#[test]
fn s5_12_rdma_checks_in_order() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let t = raw.bound(9);
    let all = raw.export(&t, 0, 4096, perm::ALL);
    let wo = raw.export(&t, 4096, 64, perm::WRITE);
    raw.write(t.seg, &pattern(8192, 3));
    let mut i = unbound(&mut raw);
    let with = |mut d: RdmaDesc, f: &dyn Fn(&mut RdmaDesc)| {
        f(&mut d);
        d
    };
    let write = rdma(op::RDMA_WRITE, &all, 0, 0, 64, 0);
    let bad_cookie = with(write, &|d| d.cookie_key = (all.key.get() ^ 1).into());
    let range = |d: &mut RdmaDesc| d.remote_offset = 4090.into();
    let imm = rdma(op::WRITE_IMMEDIATE, &all, 8, 0, 8, 0);
    let cases = [
        (
            with(bad_cookie, &|d| d.flags = (send_flags::INLINE).into()),
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            with(write, &|d| d.flags = 8.into()),
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            with(bad_cookie, &|d| d.len = 0.into()),
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            with(write, &|d| d.len = (MAX_RDMA + 1).into()),
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            with(write, &|d| d.reserved = 1.into()),
            tx_error::BAD_DESCRIPTOR,
        ),
        (with(imm, &|d| d.len = 5.into()), tx_error::BAD_DESCRIPTOR),
        (
            with(imm, &|d| d.remote_offset = 4.into()),
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            with(imm, &|d| d.flags = send_flags::UTLB.into()),
            tx_error::BAD_DESCRIPTOR,
        ),
        (
            with(bad_cookie, &|d| d.local_offset = (8192 - 8).into()),
            tx_error::BAD_ADDRESS,
        ),
        (with(bad_cookie, &range), tx_error::BAD_COOKIE),
        (
            with(write, &|d| {
                d.cookie_generation = (all.generation.get() + 1).into()
            }),
            tx_error::BAD_COOKIE,
        ),
        (
            with(write, &|d| d.cookie_aperture = 63.into()),
            tx_error::BAD_COOKIE,
        ),
        (
            with(write, &|d| d.cookie_node = 7.into()),
            tx_error::BAD_COOKIE,
        ),
        (
            with(rdma(op::RDMA_READ, &wo, 0, 0, 64, 0), &range),
            tx_error::PERMISSION_DENIED,
        ),
        (
            rdma(op::RDMA_WRITE, &wo, 60, 0, 8, 0),
            tx_error::OUT_OF_RANGE,
        ),
        (
            rdma(op::RDMA_WRITE, &wo, u64::MAX, 0, 8, 0),
            tx_error::OUT_OF_RANGE,
        ),
    ];
    for (n, (d, want)) in cases.iter().enumerate() {
        let d = with(*d, &|d| d.user_id = (100 + n as u64).into());
        raw.post(&mut i, &d);
        let e = raw.event(&mut i);
        assert_eq!(kc(&e), (event::TX_ERROR, *want), "case {n}");
        let f = (e.user_id.get(), e.node.get(), e.port.get(), e.len.get());
        let want = (
            100 + n as u64,
            d.cookie_node.get(),
            d.cookie_aperture.get(),
            d.len.get(),
        );
        assert_eq!(f, want, "case {n}");
    }
    let revoke = Revoke {
        endpoint: t.id.into(),
        aperture: all.aperture,
    };
    raw.ok(cmd::REVOKE, revoke.as_bytes());
    raw.post(&mut i, &write);
    assert_eq!(
        kc(&raw.event(&mut i)),
        (event::TX_ERROR, tx_error::BAD_COOKIE)
    );
    raw.destroy(&t);
    raw.post(&mut i, &rdma(op::RDMA_WRITE, &wo, 0, 0, 8, 0));
    assert_eq!(
        kc(&raw.event(&mut i)),
        (event::TX_ERROR, tx_error::BAD_COOKIE)
    );
    assert_eq!(
        raw.read(t.seg, 8192),
        pattern(8192, 3),
        "a refused access wrote"
    );
}

/// §5.13: a tripwire fires after an overlapping access: its fired byte
/// set and a TRIPWIRE event (code 0 write, 1 read; user id its cookie,
/// aux its id, node/port the initiator's, len the bytes inside its range);
/// a one-shot one fires once, a persistent one on every access while its
/// byte is clear; the event names port 0 for an unbound initiator.
#[test]
fn s5_13_tripwires_fire_as_set() {
    let dev = common::device(2);
    let mut r0 = Raw::new(&common::socket(&dev, 0));
    let mut t = r0.bound(9);
    let c = r0.export(&t, 0, 4096, perm::ALL);
    let set = |offset: u64, len: u64, flags: u32, user: u64| SetTripwire {
        endpoint: t.id.into(),
        aperture: c.aperture,
        offset: offset.into(),
        len: len.into(),
        flags: flags.into(),
        reserved: 0.into(),
        user: user.into(),
    };
    let id = |r: Vec<u8>| ObjectId::read_from_bytes(&r).unwrap().id.get();
    let w = id(r0.ok(
        cmd::SET_TRIPWIRE,
        set(100, 100, tripwire_flags::WRITE, 0xabc).as_bytes(),
    ));
    let rd = tripwire_flags::READ | tripwire_flags::PERSISTENT;
    let r = id(r0.ok(cmd::SET_TRIPWIRE, set(0, 8, rd, 0xdef).as_bytes()));
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut i = r1.bound(33);
    r1.post(&mut i, &rdma(op::RDMA_WRITE, &c, 150, 0, 100, 1));
    let e = r0.event(&mut t);
    let f = (
        e.user_id.get(),
        e.aux.get(),
        e.node.get(),
        e.port.get(),
        e.len.get(),
    );
    assert_eq!((kc(&e), f), ((event::TRIPWIRE, 0), (0xabc, w, 1, 33, 50)));
    let flags = t.ctrl + ctrl::TRIPWIRE_FIRED;
    let fired = |raw: &Raw, id: u32| raw.read(flags + u64::from(id), 1)[0];
    assert_eq!(fired(&r0, w), 1);
    r1.post(&mut i, &rdma(op::RDMA_WRITE, &c, 100, 0, 8, 2));
    r1.until_sent(&i, 2);
    let mut u = unbound(&mut r1);
    r1.post(&mut u, &rdma(op::RDMA_READ, &c, 4, 0, 16, 3));
    let e = r0.event(&mut t);
    let f = (
        e.user_id.get(),
        e.aux.get(),
        e.node.get(),
        e.port.get(),
        e.len.get(),
    );
    assert_eq!((kc(&e), f), ((event::TRIPWIRE, 1), (0xdef, r, 1, 0, 4)));
    r0.write(flags + u64::from(r), &[0]);
    r1.post(&mut u, &rdma(op::RDMA_READ, &c, 0, 0, 2, 4));
    assert_eq!(
        r0.event(&mut t).len.get(),
        2,
        "a persistent tripwire fired once"
    );
    spec::settled(&dev, &[&r0, &r1]);
    assert_eq!(r0.events(&t), 0, "a one-shot tripwire fired twice");
    assert_eq!(r0.stat(&t, "tripwires_fired"), 3);
    let clear = ClearTripwire {
        endpoint: t.id.into(),
        tripwire: w.into(),
    };
    r0.ok(cmd::CLEAR_TRIPWIRE, clear.as_bytes());
}

/// A SEND of `len` bytes from a user buffer named through the UTLB
/// (§5.3, §5.14): `count` entries from `first`, `offset` into the first
/// page.
fn utlb_send(first: u32, count: u32, offset: u64, len: u32, user: u64) -> SendDesc {
    let mut d = spec::send_segment((0, 9), 0, user, offset, len);
    d.flags = send_flags::UTLB.into();
    let b = SendBuffer {
        offset: offset.into(),
        utlb_first: first.into(),
        utlb_count: count.into(),
    };
    d.data[..std::mem::size_of::<SendBuffer>()].copy_from_slice(b.as_bytes());
    d
}

/// §5.14, §5.9: a SEND with flag UTLB reads its buffer from the pages of
/// the sending endpoint's domain's table; every way the reference can
/// miss is NO_TRANSLATION (checked before BAD_ADDRESS and NOT_BOUND), an
/// entry outside shared memory BAD_ADDRESS; one descriptor names up to
/// MAX_UTLB_RUN (4097) entries; another domain's table is never consulted;
/// after UTLB_INVALIDATE a rewritten entry is used, and a second
/// UTLB_SET_TABLE replaces the table.
#[test]
fn s5_14_sends_from_user_buffers_named_by_the_utlb() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut r = raw.bound(9);
    let pd = raw.pd();
    let mut s = raw.endpoint_in(pd, SMALL, 1);
    raw.bind(&s, 5);
    let mut u = raw.endpoint_in(pd, SMALL, 1);
    let mut o = raw.bound(6);
    let (p0, p1, q) = (raw.alloc(4096), raw.alloc(4096), raw.alloc(4096));
    raw.write(p0, &pattern(4096, 1));
    raw.write(p1, &pattern(4096, 2));
    raw.write(q, &pattern(4096, 3));
    // Entries 0-3: p0, p1, not installed, outside memory; 4..4104: p0.
    let mut entries = vec![U64::new(p0); 4104];
    entries[1..4].copy_from_slice(&[p1, 0, 1 << 40].map(U64::new));
    let table = raw.alloc(4104 * 8);
    raw.write(table, entries.as_bytes());
    let set = UtlbSetTable {
        pd: pd.id.into(),
        entries: 4104.into(),
        table_gpa: table.into(),
    };
    raw.ok(cmd::UTLB_SET_TABLE, set.as_bytes());
    raw.give(&mut r, 0, 4096, 1);
    raw.post(&mut s, &utlb_send(0, 2, 4000, 200, 1));
    let m = raw.recv(&mut r);
    let want = [&pattern(4096, 1)[4000..], &pattern(4096, 2)[..104]].concat();
    assert_eq!(raw.read(r.seg + spec::buffer_offset(&m), 200), want);
    let missing = tx_error::NO_TRANSLATION;
    let cases = [
        (utlb_send(0, 0, 0, 8, 2), missing),
        (utlb_send(4, 4098, 0, 8, 3), missing),
        (utlb_send(4103, 2, 0, 8, 4), missing),
        (utlb_send(0, 1, 4096, 8, 5), missing),
        (utlb_send(0, 1, 4000, 200, 6), missing),
        (utlb_send(2, 1, 0, 8, 7), missing),
        (utlb_send(3, 1, 0, 8, 8), tx_error::BAD_ADDRESS),
    ];
    for (d, want) in cases {
        raw.post(&mut s, &d);
        let e = raw.event(&mut s);
        assert_eq!(
            (kc(&e), e.user_id.get()),
            ((event::TX_ERROR, want), d.user_id.get())
        );
    }
    raw.post(&mut s, &utlb_send(4, 4097, 0, 8, 13));
    assert_eq!(spec::payload(&raw.recv(&mut r)), &pattern(4096, 1)[..8]);
    raw.post(&mut u, &utlb_send(2, 1, 0, 8, 9));
    assert_eq!(kc(&raw.event(&mut u)), (event::TX_ERROR, missing));
    raw.post(&mut u, &utlb_send(0, 1, 0, 8, 10));
    assert_eq!(
        kc(&raw.event(&mut u)),
        (event::TX_ERROR, tx_error::NOT_BOUND)
    );
    raw.post(&mut o, &utlb_send(0, 1, 0, 8, 11));
    assert_eq!(
        kc(&raw.event(&mut o)),
        (event::TX_ERROR, missing),
        "another domain's table"
    );
    raw.write_obj(table, &U64::new(q));
    let invalidate = UtlbInvalidate {
        pd: pd.id.into(),
        first: 0.into(),
        count: 1.into(),
    };
    raw.ok(cmd::UTLB_INVALIDATE, invalidate.as_bytes());
    raw.post(&mut s, &utlb_send(0, 1, 0, 50, 12));
    assert_eq!(spec::payload(&raw.recv(&mut r)), &pattern(4096, 3)[..50]);
    // A second UTLB_SET_TABLE replaces the table.
    let second = raw.alloc(4096);
    raw.write_obj(second, &U64::new(p1));
    let set = UtlbSetTable {
        entries: 1.into(),
        table_gpa: second.into(),
        ..set
    };
    raw.ok(cmd::UTLB_SET_TABLE, set.as_bytes());
    raw.post(&mut s, &utlb_send(0, 1, 0, 50, 14));
    assert_eq!(spec::payload(&raw.recv(&mut r)), &pattern(4096, 2)[..50]);
    raw.post(&mut s, &utlb_send(1, 1, 0, 8, 15));
    assert_eq!(kc(&raw.event(&mut s)), (event::TX_ERROR, missing));
}

/// A REDIRECT (§5.15) of `len` bytes at `offset` of `aperture` into the
/// user buffer at UTLB entry 0, 8 bytes into its page.
fn redirect(aperture: u32, offset: u64, len: u32, id: u64) -> RedirectDesc {
    let mut d = RedirectDesc::new_zeroed();
    d.opcode = op::REDIRECT.into();
    d.flags = send_flags::UTLB.into();
    d.len = len.into();
    d.aperture = aperture.into();
    d.id = id.into();
    d.offset = offset.into();
    d.page_offset = 8.into();
    d.utlb_first = 0.into();
    d.utlb_count = 1.into();
    d
}

/// §5.15: bytes RDMA-written into a redirected part of an aperture go to
/// the user buffer; a redirection ends with one REDIRECTED event (FULL at
/// once, PARTIAL at REDIRECT_END; user id its id, len the bytes
/// redirected, aux their offset, node/port the writer); a refused one
/// ends at once (REFUSED, the TX_ERROR code in aux); REDIRECT_END for an
/// id not active is TX_ERROR BAD_DESCRIPTOR.
#[test]
fn s5_15_redirections_end_with_one_event() {
    let dev = common::device(2);
    let mut r0 = Raw::new(&common::socket(&dev, 0));
    let mut t = r0.bound(9);
    let (table, page) = (r0.alloc(4096), r0.alloc(4096));
    r0.write_obj(table, &U64::new(page));
    let set = UtlbSetTable {
        pd: t.pd.id.into(),
        entries: 1.into(),
        table_gpa: table.into(),
    };
    r0.ok(cmd::UTLB_SET_TABLE, set.as_bytes());
    let c = r0.export(&t, 0, 4096, perm::WRITE);
    let a = c.aperture.get();
    r0.post(&mut t, &redirect(a, 200, 100, 77));
    r0.until_sent(&t, 1);
    let mut r1 = Raw::new(&common::socket(&dev, 1));
    let mut i = r1.bound(33);
    r1.write(i.seg, &pattern(100, 5));
    r1.post(&mut i, &rdma(op::RDMA_WRITE, &c, 200, 0, 100, 1));
    assert_eq!(kc(&r1.event(&mut i)), (event::TX_DONE, 0));
    let e = r0.event(&mut t);
    let f = (
        e.user_id.get(),
        e.len.get(),
        e.aux.get(),
        e.node.get(),
        e.port.get(),
    );
    assert_eq!((kc(&e), f), ((event::REDIRECTED, 0), (77, 100, 0, 1, 33)));
    assert_eq!(r0.read(page + 8, 100), pattern(100, 5));
    assert_eq!(
        r0.read(t.seg + 200, 100),
        vec![0; 100],
        "landed in the aperture too"
    );
    let mut end = RedirectDesc::new_zeroed();
    end.opcode = op::REDIRECT_END.into();
    end.id = 77.into();
    r0.post(&mut t, &end);
    assert_eq!(
        kc(&r0.event(&mut t)),
        (event::TX_ERROR, tx_error::BAD_DESCRIPTOR)
    );
    let mut no_utlb = redirect(a, 0, 100, 78);
    no_utlb.flags = 0.into();
    let refusals = [
        (no_utlb, tx_error::BAD_DESCRIPTOR),
        (redirect(63, 0, 100, 79), tx_error::BAD_COOKIE),
        (redirect(a, 4090, 100, 80), tx_error::OUT_OF_RANGE),
    ];
    for (d, code) in refusals {
        r0.post(&mut t, &d);
        let e = r0.event(&mut t);
        let f = (e.user_id.get(), e.aux.get());
        assert_eq!(
            (kc(&e), f),
            ((event::REDIRECTED, 3), (d.id.get(), u32::from(code)))
        );
    }
    r0.post(&mut t, &redirect(a, 0, 100, 81));
    r0.until_sent(&t, 6);
    r1.post(&mut i, &rdma(op::RDMA_WRITE, &c, 0, 0, 40, 2));
    assert_eq!(kc(&r1.event(&mut i)), (event::TX_DONE, 0));
    end.id = 81.into();
    r0.post(&mut t, &end);
    let e = r0.event(&mut t);
    let f = (e.user_id.get(), e.len.get(), e.aux.get());
    assert_eq!((kc(&e), f), ((event::REDIRECTED, 1), (81, 40, 0)));
}

/// §6: with ARM, a receive descriptor or an event for an endpoint whose
/// arm request differs from its acknowledgement sets the acknowledgement
/// and puts one record {endpoint, 0} into the notification queue, then
/// signals it; each arm yields at most one notification.
#[test]
fn s6_an_armed_endpoint_is_notified_once_per_arm_request() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let mut r = raw.bound(9);
    raw.ok(cmd::ARM, ObjectId { id: r.id.into() }.as_bytes());
    raw.ok(cmd::ARM, ObjectId { id: s.id.into() }.as_bytes());
    let _ = raw.calls[1].read();
    raw.set_word(&r, ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"wake"));
    let (len, rec) = raw.notification(WAIT).expect("a notification");
    assert_eq!((len, rec.endpoint.get(), rec.reason.get()), (8, r.id, 0));
    assert_eq!(raw.word(&r, ctrl::ARM_ACK), 1);
    assert_eq!(
        raw.calls[1].read().ok(),
        Some(1),
        "the queue was not signalled"
    );
    raw.recv(&mut r);
    raw.post(&mut s, &send_inline((0, 9), 2, 0, b"again"));
    raw.recv(&mut r);
    assert!(
        raw.notification_once_settled(&dev).is_none(),
        "two notifications for one arm"
    );
    raw.set_word(&r, ctrl::ARM_REQUEST, 2);
    raw.post(&mut s, &send_inline((0, 9), 3, 0, b"third"));
    assert_eq!(
        raw.notification(WAIT).map(|n| n.1.endpoint.get()),
        Some(r.id)
    );
    assert_eq!(raw.word(&r, ctrl::ARM_ACK), 2);
    // An event notifies too: the sender's TX_ERROR.
    raw.set_word(&s, ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &send_inline((0, 99), 4, 0, b"lost"));
    assert_eq!(
        raw.notification(WAIT).map(|n| n.1.endpoint.get()),
        Some(s.id)
    );
    assert_eq!(raw.word(&s, ctrl::ARM_ACK), 1);
}

/// §6, §5.10, §5.13: any event posted to an armed endpoint notifies it:
/// a condition (RECV_DROPPED) and a tripwire's event.
#[test]
fn s6_conditions_and_tripwire_events_notify_too() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = (raw.bound(5), raw.bound(9));
    raw.ok(cmd::ARM, ObjectId { id: r.id.into() }.as_bytes());
    raw.set_word(&r, ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &spec::send_segment((0, 9), 1, 0, 0, 200));
    assert_eq!(
        kc(&raw.event(&mut r)),
        (event::CONDITION, condition::RECV_DROPPED)
    );
    assert_eq!(
        raw.notification(WAIT).map(|n| n.1.endpoint.get()),
        Some(r.id)
    );
    let c = raw.export(&r, 0, 4096, perm::ALL);
    let tw = SetTripwire {
        endpoint: r.id.into(),
        aperture: c.aperture,
        offset: 0.into(),
        len: 8.into(),
        flags: tripwire_flags::WRITE.into(),
        reserved: 0.into(),
        user: 5.into(),
    };
    raw.ok(cmd::SET_TRIPWIRE, tw.as_bytes());
    raw.set_word(&r, ctrl::ARM_REQUEST, 2);
    raw.post(&mut s, &rdma(op::RDMA_WRITE, &c, 0, 0, 8, 2));
    assert_eq!(kc(&raw.event(&mut r)), (event::TRIPWIRE, 0));
    assert_eq!(
        raw.notification(WAIT).map(|n| n.1.endpoint.get()),
        Some(r.id)
    );
    assert_eq!(raw.word(&r, ctrl::ARM_ACK), 2);
}

/// §6: notifications are off by default and after DISARM.
#[test]
fn s6_without_arm_nothing_is_notified() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let r = raw.bound(9);
    raw.set_word(&r, ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"polling"));
    until("delivered", || raw.received(&r) == 1);
    assert!(
        raw.notification_once_settled(&dev).is_none(),
        "notified without ARM"
    );
    assert_eq!(raw.word(&r, ctrl::ARM_ACK), 0);
    raw.ok(cmd::ARM, ObjectId { id: r.id.into() }.as_bytes());
    raw.ok(cmd::DISARM, ObjectId { id: r.id.into() }.as_bytes());
    raw.post(&mut s, &send_inline((0, 9), 2, 0, b"polling"));
    until("delivered", || raw.received(&r) == 2);
    assert!(
        raw.notification_once_settled(&dev).is_none(),
        "notified after DISARM"
    );
}

/// §6, §2.1: with no notification buffer posted the device keeps the
/// notification, at most one per endpoint, and delivers it when buffers
/// come; one kept for an endpoint destroyed meanwhile is dropped.
#[test]
fn s6_a_notification_waits_for_a_buffer() {
    let dev = common::device(1);
    let mut raw = Raw::bare(&common::socket(&dev, 0), ulnic_abi::F_IMPLEMENTED);
    let mut s = raw.bound(5);
    let (r, gone) = (raw.bound(9), raw.bound(10));
    for ep in [&r, &gone] {
        raw.ok(cmd::ARM, ObjectId { id: ep.id.into() }.as_bytes());
    }
    for (arm, port) in [(1, 9), (1, 10), (2, 9)] {
        let ep = if port == 9 { &r } else { &gone };
        raw.set_word(ep, ctrl::ARM_REQUEST, arm);
        raw.post(&mut s, &send_inline((0, port), 0, 0, b"x"));
        until("acknowledged", || raw.word(ep, ctrl::ARM_ACK) == arm);
    }
    raw.destroy(&gone);
    raw.post_notification_buffers();
    assert_eq!(
        raw.notification(WAIT).map(|n| n.1.endpoint.get()),
        Some(r.id)
    );
    assert!(
        raw.notification_once_settled(&dev).is_none(),
        "kept more than one per endpoint"
    );
}

/// §8: a send producer index claiming more entries than the ring holds is
/// not used (nothing taken), counted in ring_errors and reported with one
/// RING_INDEX condition; a possible value later works again.
#[test]
fn s8_an_impossible_send_producer_takes_nothing() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = (raw.bound(5), raw.bound(9));
    raw.set_word(&s, ctrl::SEND_PRODUCER, 9);
    raw.ring(&s);
    let e = raw.event(&mut s);
    assert_eq!(kc(&e), (event::CONDITION, condition::RING_INDEX));
    assert_eq!(raw.pending(&s, condition::RING_INDEX), 1);
    spec::settled(&dev, &[&raw]);
    assert_eq!(raw.word(&s, ctrl::SEND_CONSUMER), 0, "descriptors taken");
    assert_eq!(raw.events(&s), 0, "a second RING_INDEX");
    assert!(raw.stat(&s, "ring_errors") >= 1);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"fine"));
    assert_eq!(raw.recv(&mut r).tag.get(), 1);
    assert_eq!(raw.received(&r), 0);
}

/// §8: an impossible receive consumer makes the ring count as full: the
/// message is refused with NO_BUFFER and counted in rx_dropped_no_buffer;
/// an impossible free producer is an empty free ring. Both are reported
/// (ring_errors, RING_INDEX), and possible values work again.
#[test]
fn s8_impossible_receive_and_free_indices_refuse_messages() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = (raw.bound(5), raw.bound(9));
    raw.set_word(&r, ctrl::RECV_CONSUMER, 5);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"x"));
    assert_eq!(
        kc(&raw.event(&mut s)),
        (event::TX_ERROR, tx_error::NO_BUFFER)
    );
    let mut codes = [raw.event(&mut r), raw.event(&mut r)].map(|e| kc(&e));
    codes.sort_unstable();
    let c = event::CONDITION;
    assert_eq!(
        codes,
        [(c, condition::RING_INDEX), (c, condition::RECV_DROPPED)]
    );
    assert_eq!(raw.stat(&r, "rx_dropped_no_buffer"), 1);
    assert!(raw.stat(&r, "ring_errors") >= 1);
    raw.set_word(&r, ctrl::RECV_CONSUMER, 0);
    raw.clear_pending(&r, condition::RECV_DROPPED);
    raw.set_word(&r, ctrl::FREE_PRODUCER, 100);
    raw.post(&mut s, &spec::send_segment((0, 9), 2, 0, 0, 200));
    assert_eq!(
        kc(&raw.event(&mut s)),
        (event::TX_ERROR, tx_error::NO_BUFFER)
    );
    assert_eq!(kc(&raw.event(&mut r)), (c, condition::RECV_DROPPED));
    raw.set_word(&r, ctrl::FREE_PRODUCER, 0);
    raw.give(&mut r, 0, 4096, 6);
    raw.post(&mut s, &spec::send_segment((0, 9), 3, 0, 0, 200));
    let m = raw.recv(&mut r);
    assert_eq!((m.tag.get(), m.buf_id.get()), (3, 6));
}

/// §8, §5.6: an impossible event consumer makes the event ring count as
/// full: send descriptors stay in the ring, and the RING_INDEX condition
/// is dropped (events_lost) with its pending byte set; a possible value
/// lets the sends go.
#[test]
fn s8_an_impossible_event_consumer_holds_sends() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    raw.set_word(&s, ctrl::EVENT_CONSUMER, 40);
    raw.post(&mut s, &send_inline((0, 99), 0, 1, b"x"));
    until("reported", || raw.pending(&s, condition::RING_INDEX) == 1);
    spec::settled(&dev, &[&raw]);
    assert_eq!(
        raw.word(&s, ctrl::SEND_CONSUMER),
        0,
        "taken with no event room"
    );
    assert_eq!(raw.word(&s, ctrl::EVENT_PRODUCER), 0);
    assert!(raw.stat(&s, "events_lost") >= 1);
    raw.set_word(&s, ctrl::EVENT_CONSUMER, 0);
    raw.ring(&s);
    let e = raw.event(&mut s);
    assert_eq!(
        (kc(&e), e.user_id.get()),
        ((event::TX_ERROR, tx_error::NO_ENDPOINT), 1)
    );
}

/// §8, §2.1, §2.2: a call eventfd that cannot take another signal (its
/// counter full) breaks its queue: the notification queue (bit 1) after
/// the record is written, the control queue (bit 0) after the answer;
/// the data path goes on, and stopping a queue clears its bit.
#[test]
fn s8_a_full_call_eventfd_breaks_its_queue() {
    let dev = common::device(1);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let (mut s, mut r) = (raw.bound(5), raw.bound(9));
    raw.ok(cmd::ARM, ObjectId { id: r.id.into() }.as_bytes());
    spec::fill_counter(&raw.calls[1]);
    raw.set_word(&r, ctrl::ARM_REQUEST, 1);
    raw.post(&mut s, &send_inline((0, 9), 1, 0, b"x"));
    assert_eq!(
        raw.notification(WAIT).map(|n| n.1.endpoint.get()),
        Some(r.id)
    );
    until("queue 1 broken", || raw.config_word(52) == 2);
    raw.post(&mut s, &send_inline((0, 9), 2, 0, b"y"));
    raw.recv(&mut r);
    assert_eq!(raw.recv(&mut r).tag.get(), 2);
    spec::fill_counter(&raw.calls[0]);
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
    until("queue 0 broken", || raw.config_word(52) == 3);
    let used = raw.used_index(0);
    raw.submit(
        &[
            spec::desc(spec::REQ, 8, spec::F_NEXT, 1),
            spec::desc(spec::RESP, 48, spec::F_WRITE, 0),
        ],
        0,
    );
    spec::settled(&dev, &[&raw]);
    assert_eq!(raw.used_index(0), used, "a broken queue was served");
    raw.fe.get_vring_base(1).unwrap();
    assert_eq!(
        raw.config_word(52),
        1,
        "stopping queue 1 cleared another bit"
    );
}

/// §8: a node's state is freed when its frontend disconnects; peers
/// sending to it then get NO_ENDPOINT.
#[test]
fn s8_peers_of_a_node_that_left_get_no_endpoint() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    let mut s = raw.bound(5);
    let mut other = Raw::new(&common::socket(&dev, 1));
    let mut r = other.bound(9);
    raw.post(&mut s, &send_inline((1, 9), 1, 0, b"x"));
    assert_eq!(other.recv(&mut r).tag.get(), 1);
    drop(other);
    released(&dev, 1);
    assert_eq!(node_state(&dev, 1).0, 0);
    raw.post(&mut s, &send_inline((1, 9), 2, 0, b"x"));
    assert_eq!(
        kc(&raw.event(&mut s)),
        (event::TX_ERROR, tx_error::NO_ENDPOINT)
    );
}

/// §8: a control-queue call the device cannot signal ends the connection;
/// the node's state is freed (counted in its queue errors) before the
/// frontend sees the connection end.
#[test]
fn s8_a_call_that_cannot_be_signalled_ends_the_connection() {
    let dev = common::device(2);
    let mut raw = Raw::new(&common::socket(&dev, 0));
    raw.bound(9);
    // The read end of a pipe: a write to it fails (EBADF).
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh and owned here from now on.
    let (r, _w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: as above; the borrowed EventFd is never dropped.
    let unwritable = std::mem::ManuallyDrop::new(unsafe { EventFd::from_raw_fd(r.as_raw_fd()) });
    raw.fe.set_vring_call(0, &unwritable).unwrap();
    let (_, epoch, before) = node_state(&dev, 0);
    // Served and answered in the ring, then the signal fails.
    assert_eq!(raw.command(cmd::GET_INFO, &[]).0, status::OK);
    assert!(raw.closed(), "the connection stays open");
    let (live, now, errors) = node_state(&dev, 0);
    assert_eq!(live, 0, "endpoints outlived the end of the connection");
    assert_ne!(now, epoch, "the epoch did not change (§2.2)");
    assert_eq!(errors, before + 1, "not counted in the node's queue errors");
    drop(raw);
    common::exchange(&dev, 1, 0);
}
