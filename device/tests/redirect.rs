//! Transfer redirection (VMMC-2 §3, spec §5.15) through the real
//! vhost-user path: full, partial and no redirection are reported exactly,
//! and bytes land where the report says.
use ulnic_testkit as common;

use common::next_event;

use std::time::{Duration, Instant};

use ulnic::{
    Cookie, Endpoint, EndpointConfig, Event, Nic, Permissions, ProtectionDomain, RedirectOutcome,
    SendError, UserBuffer, UtlbConfig,
};

const SEG: usize = 1 << 20;

struct Receiver {
    pd: ProtectionDomain,
    ep: Endpoint,
    default: Cookie,
}

fn receiver(nic: &Nic) -> Receiver {
    let pd = nic.alloc_pd().unwrap();
    pd.enable_utlb(UtlbConfig::default()).unwrap();
    let mut ep = pd
        .create_endpoint(&EndpointConfig {
            segment_bytes: SEG,
            ..Default::default()
        })
        .unwrap();
    ep.bind(9).unwrap();
    let default = ep.export(0, SEG as u64, Permissions::WRITE).unwrap();
    Receiver { pd, ep, default }
}

fn sender(nic: &Nic) -> Endpoint {
    let mut ep = nic
        .alloc_pd()
        .unwrap()
        .create_endpoint(&EndpointConfig {
            segment_bytes: SEG,
            ..Default::default()
        })
        .unwrap();
    ep.bind(1).unwrap();
    ep
}

/// Waits until the device has taken every posted descriptor.
fn taken(ep: &Endpoint) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ep.sends_done() {
        assert!(Instant::now() < deadline, "descriptors not taken");
        std::thread::yield_now();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

/// Writes `data` at `at` of the receiver's default buffer, and waits for
/// the write to complete.
fn write(s: &mut Endpoint, r: &Receiver, at: u64, data: &[u8], id: u64) {
    s.write_segment(0, data);
    s.rdma_write(&r.default, at, 0, data.len() as u32, id, true)
        .unwrap();
    assert_eq!(next_event(s), Event::SendDone { id });
}

fn report(ep: &mut Endpoint) -> (u64, RedirectOutcome, u64, u64) {
    match next_event(ep) {
        Event::Redirected {
            id,
            outcome,
            start,
            bytes,
            ..
        } => (id, outcome, start, bytes),
        other => panic!("expected a redirection report, got {other:?}"),
    }
}

fn segment(ep: &Endpoint, at: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ep.read_segment(at, &mut v);
    v
}

#[test]
fn full_partial_and_no_redirection_are_exact() {
    let (_dev, a, b) = common::two_nodes();
    let mut r = receiver(&b);
    let mut s = sender(&a);
    let buf: UserBuffer = r.pd.alloc_buffer(64 << 10).unwrap();

    // Full: posted before the data arrives.
    let data = pattern(10_000, 1);
    // SAFETY: `buf` is not touched until the report.
    unsafe { r.ep.post_redirect(&r.default, 4096, &buf, 100..10_100, 1) }.unwrap();
    taken(&r.ep);
    write(&mut s, &r, 4096, &data, 1);
    let (id, outcome, start, bytes) = report(&mut r.ep);
    assert_eq!(
        (id, outcome, start, bytes),
        (1, RedirectOutcome::Full, 0, 10_000)
    );
    assert!(
        buf.as_slice()[100..10_100] == data[..],
        "redirected bytes wrong"
    );
    assert!(
        segment(&r.ep, 4096, 10_000).iter().all(|&x| x == 0),
        "a fully redirected write also landed in the default buffer"
    );

    // None: the data came first; it stays in the default buffer.
    let data = pattern(5000, 2);
    write(&mut s, &r, 65536, &data, 2);
    // SAFETY: as above.
    unsafe {
        r.ep.post_redirect(&r.default, 65536, &buf, 20_000..25_000, 2)
    }
    .unwrap();
    r.ep.end_redirect(2).unwrap();
    assert_eq!(report(&mut r.ep), (2, RedirectOutcome::None, 0, 0));
    assert_eq!(segment(&r.ep, 65536, 5000), data);
    assert!(buf.as_slice()[20_000..25_000].iter().all(|&x| x == 0));

    // Partial: the first part came before the post, the rest after.
    let data = pattern(20_000, 3);
    write(&mut s, &r, 131_072, &data[..8000], 3);
    // SAFETY: as above.
    unsafe {
        r.ep.post_redirect(&r.default, 131_072, &buf, 30_000..50_000, 3)
    }
    .unwrap();
    taken(&r.ep);
    s.write_segment(0, &data[8000..]);
    s.rdma_write(&r.default, 131_072 + 8000, 0, 12_000, 4, true)
        .unwrap();
    assert_eq!(next_event(&mut s), Event::SendDone { id: 4 });
    r.ep.end_redirect(3).unwrap();
    let (id, outcome, start, bytes) = report(&mut r.ep);
    assert_eq!(
        (id, outcome, start, bytes),
        (3, RedirectOutcome::Partial, 8000, 12_000)
    );
    // The report tells the receiver exactly what to copy: the first 8000
    // bytes from the default buffer, the rest is in place already.
    let mut assembled = buf.as_slice()[30_000..50_000].to_vec();
    assembled[..8000].copy_from_slice(&segment(&r.ep, 131_072, 8000));
    assert_eq!(assembled, data);
    assert!(segment(&r.ep, 131_072 + 8000, 12_000)
        .iter()
        .all(|&x| x == 0));
}

#[test]
fn a_write_straddling_a_redirection_is_split() {
    let (_dev, a, b) = common::two_nodes();
    let mut r = receiver(&b);
    let mut s = sender(&a);
    let buf = r.pd.alloc_buffer(4096).unwrap();
    // SAFETY: `buf` is not touched until the report.
    unsafe { r.ep.post_redirect(&r.default, 1000, &buf, 0..1000, 5) }.unwrap();
    taken(&r.ep);
    let data = pattern(3000, 4);
    write(&mut s, &r, 0, &data, 1);
    assert_eq!(report(&mut r.ep), (5, RedirectOutcome::Full, 0, 1000));
    assert_eq!(buf.as_slice()[..1000], data[1000..2000]);
    let landed = segment(&r.ep, 0, 3000);
    assert_eq!(landed[..1000], data[..1000]);
    assert!(landed[1000..2000].iter().all(|&x| x == 0));
    assert_eq!(landed[2000..], data[2000..]);

    // A gap breaks contiguity: bytes past it land in the default buffer.
    // SAFETY: as above.
    unsafe { r.ep.post_redirect(&r.default, 8192, &buf, 0..4000, 6) }.unwrap();
    taken(&r.ep);
    write(&mut s, &r, 8192, &data[..500], 2);
    write(&mut s, &r, 8192 + 1000, &data[..500], 3);
    r.ep.end_redirect(6).unwrap();
    assert_eq!(report(&mut r.ep), (6, RedirectOutcome::Partial, 0, 500));
    assert_eq!(segment(&r.ep, 8192 + 1000, 500), data[..500]);
}

#[test]
fn bad_redirections_are_refused() {
    let (_dev, a, b) = common::two_nodes();
    let mut r = receiver(&b);
    let other = sender(&b);
    let theirs = other.export(0, 4096, Permissions::WRITE).unwrap();
    let buf = r.pd.alloc_buffer(8192).unwrap();
    let refused = |ep: &mut Endpoint| match report(ep) {
        (_, RedirectOutcome::Refused(why), 0, 0) => why,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // SAFETY (all below): `buf` is only read after the reports.
    unsafe { r.ep.post_redirect(&theirs, 0, &buf, 0..100, 1) }.unwrap();
    assert_eq!(refused(&mut r.ep), SendError::BadCookie);
    unsafe {
        r.ep.post_redirect(&r.default, SEG as u64 - 50, &buf, 0..100, 2)
    }
    .unwrap();
    assert_eq!(refused(&mut r.ep), SendError::OutOfRange);
    for id in 10..10 + u64::from(ulnic_abi::MAX_REDIRECTS) {
        unsafe { r.ep.post_redirect(&r.default, 0, &buf, 0..100, id) }.unwrap();
    }
    unsafe { r.ep.post_redirect(&r.default, 0, &buf, 0..100, 99) }.unwrap();
    assert_eq!(refused(&mut r.ep), SendError::TooManyRedirects);
    assert!(unsafe { r.ep.post_redirect(&r.default, 0, &buf, 0..100, 10) }.is_err());
    r.ep.end_redirect(12345).unwrap();
    match next_event(&mut r.ep) {
        Event::SendFailed {
            id: 12345,
            reason: SendError::BadDescriptor,
            ..
        } => {}
        other => panic!("ending an unknown redirection gave {other:?}"),
    }
    for id in 10..10 + u64::from(ulnic_abi::MAX_REDIRECTS) {
        r.ep.end_redirect(id).unwrap();
        assert_eq!(report(&mut r.ep), (id, RedirectOutcome::None, 0, 0));
    }
    // Everything still works.
    let mut s = sender(&a);
    unsafe { r.ep.post_redirect(&r.default, 0, &buf, 0..100, 7) }.unwrap();
    taken(&r.ep);
    write(&mut s, &r, 0, &pattern(100, 9), 1);
    assert_eq!(report(&mut r.ep), (7, RedirectOutcome::Full, 0, 100));
}

#[test]
fn writes_into_ones_own_aperture_are_redirected_too() {
    let (_dev, _a, b) = common::two_nodes();
    let mut r = receiver(&b);
    let buf = r.pd.alloc_buffer(4096).unwrap();
    // SAFETY: `buf` is not touched until the report.
    unsafe { r.ep.post_redirect(&r.default, 200_000, &buf, 10..110, 3) }.unwrap();
    let data = pattern(100, 5);
    r.ep.write_segment(500_000, &data);
    let default = r.default;
    r.ep.rdma_write(&default, 200_000, 500_000, 100, 4, true)
        .unwrap();
    let mut got = vec![next_event(&mut r.ep), next_event(&mut r.ep)];
    got.sort_by_key(|e| matches!(e, Event::SendDone { .. }));
    assert!(
        matches!(
            got[0],
            Event::Redirected {
                id: 3,
                outcome: RedirectOutcome::Full,
                start: 0,
                bytes: 100,
                ..
            }
        ),
        "{got:?}"
    );
    assert_eq!(got[1], Event::SendDone { id: 4 });
    assert_eq!(buf.as_slice()[10..110], data[..]);
    assert!(segment(&r.ep, 200_000, 100).iter().all(|&x| x == 0));
}
