//! `ulnic selftest`: checks the NIC end to end from this machine (inside a
//! guest through /dev/ulnic0, or host-attached): two protection domains on
//! this node exchange inline, buffered and many ordered messages, blocking
//! through the driver; and one domain must not be able to touch the other's
//! endpoint.

use crate::raw_driver::{create_small_endpoint, ioctl};
use std::time::{Duration, Instant};

use ulnic::{
    Address, Cookie, EndpointConfig, Event, Immediate, Nic, Payload, Permissions, SendError,
    TripwireOn,
};

const WAIT: Duration = Duration::from_secs(10);

fn recv(ep: &mut ulnic::Endpoint) -> anyhow::Result<ulnic::Received> {
    loop {
        if let Some(m) = ep.poll_recv() {
            return Ok(m);
        }
        if let Some(ev) = ep.poll_event() {
            return Err(anyhow::anyhow!("unexpected event {ev:?}"));
        }
        if !ep.wait(WAIT)? {
            return Err(anyhow::anyhow!("no message within 10 s"));
        }
    }
}

/// Runs the checks; returns one line per check passed.
pub fn run() -> anyhow::Result<Vec<String>> {
    let mut report = Vec::new();
    let nic = Nic::open()?;
    let node = nic.node();
    report.push(format!("opened node {node} of {}", nic.nodes()));
    let pd_a = nic.alloc_pd()?;
    let pd_b = nic.alloc_pd()?;
    let cfg = EndpointConfig {
        send_entries: 64,
        recv_entries: 128,
        free_entries: 64,
        segment_bytes: 1 << 20,
    };
    let mut a = pd_a.create_endpoint(&cfg)?;
    let mut b = pd_b.create_endpoint(&cfg)?;
    a.bind(1)?;
    b.bind(2)?;
    let to_b = Address { node, port: 2 };
    for i in 0..16u64 {
        b.post_free(i * 16384, 16384, i)?;
    }

    a.post_send_inline(to_b, 7, b"hello", 1)?;
    let m = recv(&mut b)?;
    let ok = matches!(m.payload, Payload::Inline(d) if &d[..5] == b"hello");
    if !ok || m.src != (Address { node, port: 1 }) || m.tag != 7 {
        return Err(anyhow::anyhow!("inline message wrong: {m:?}"));
    }
    report.push("inline message delivered, source stamped".into());

    let big: Vec<u8> = (0..10_000u32).map(|i| (i * 13) as u8).collect();
    a.write_segment(65536, &big);
    a.post_send(to_b, 8, 65536, big.len() as u32, 2, true)?;
    let m = recv(&mut b)?;
    let Payload::Buffer { offset, id } = m.payload else {
        return Err(anyhow::anyhow!("large message came inline"));
    };
    let mut out = vec![0u8; big.len()];
    b.read_segment(offset as usize, &mut out);
    if out != big {
        return Err(anyhow::anyhow!("buffered message contents differ"));
    }
    b.post_free(offset, 16384, id)?;
    if !a.wait(WAIT)? || a.poll_event() != Some(Event::SendDone { id: 2 }) {
        return Err(anyhow::anyhow!("no completion for the buffered send"));
    }
    report.push("10000-byte message delivered into a free buffer, completion seen".into());

    let n = 2000u64;
    let mut sent = 0u64;
    let mut got = 0u64;
    while got < n {
        while sent < n && sent - got < 32 {
            if a.post_send_inline(to_b, sent as u32, &sent.to_le_bytes(), sent)
                .is_err()
            {
                break;
            }
            sent += 1;
        }
        let m = recv(&mut b)?;
        let Payload::Inline(d) = m.payload else {
            return Err(anyhow::anyhow!("expected inline"));
        };
        if m.tag != got as u32 || d[..8] != got.to_le_bytes() {
            return Err(anyhow::anyhow!("message {got} out of order or corrupted"));
        }
        got += 1;
    }
    report.push(format!("{n} messages in order, exactly once"));

    // The doorbell reaches the device: its counter for this endpoint rises.
    let doorbells = |ep: &ulnic::Endpoint| -> anyhow::Result<u64> {
        let s = ep.stats()?;
        Ok(s.iter()
            .find(|(k, _)| *k == "doorbells")
            .map_or(0, |(_, v)| *v))
    };
    let before = doorbells(&a)?;
    a.ring_doorbell();
    let deadline = std::time::Instant::now() + WAIT;
    while doorbells(&a)? == before {
        if std::time::Instant::now() > deadline {
            return Err(anyhow::anyhow!("a rung doorbell never reached the device"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    report.push(format!(
        "doorbell reaches the device ({})",
        if a.doorbell_mapped() {
            "a page mapped into this process: a store, no system call"
        } else {
            "by a call"
        }
    ));

    report.push(poll_check(&mut a, &mut b, to_b)?);
    report.push(rdma_check(&mut a, &mut b)?);
    report.push(utlb_check(&nic, &mut b, to_b)?);

    // Ownership: a fresh open (another domain) cannot touch endpoint `a`.
    #[cfg(target_os = "linux")]
    if let Some(msg) = ownership_check(a.id())? {
        report.push(msg);
    }
    Ok(report)
}

/// Waits until thread `tid` of this process sleeps (state `S` in
/// /proc/self/task/TID/stat): a thread that is about to block in a system
/// call is blocked in it, not merely started.
pub fn until_blocked(tid: i32) -> anyhow::Result<()> {
    let path = format!("/proc/self/task/{tid}/stat");
    let deadline = Instant::now() + WAIT;
    loop {
        let stat = std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
        // The state follows the command name, which is in parentheses.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state == Some('S') {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "thread {tid} did not block within 10 s (state {state:?})"
            ));
        }
        std::thread::yield_now();
    }
}

/// With the Linux driver: a thread blocked in poll() on an armed
/// endpoint's file is woken by a message to it, and the file is quiet
/// again once the notification was taken.
fn poll_check(
    a: &mut ulnic::Endpoint,
    b: &mut ulnic::Endpoint,
    to_b: Address,
) -> anyhow::Result<String> {
    let Some(fd) = b.notification_fd() else {
        return Ok("poll: not checked (host attach has no file to poll)".into());
    };
    while b.poll_recv().is_some() || b.poll_event().is_some() {}
    b.take_notification()?;
    if b.arm()? {
        return Err(anyhow::anyhow!(
            "poll: work was waiting before anything was sent"
        ));
    }
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let poller = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        let _ = tid_tx.send(unsafe { libc::gettid() });
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let t = Instant::now();
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, WAIT.as_millis() as i32) };
        (n, p.revents, t.elapsed())
    });
    let tid = tid_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("poll: the poller did not start"))?;
    until_blocked(tid)?;
    a.post_send_inline(to_b, 7, b"poll", 77)?;
    let (n, revents, blocked) = poller
        .join()
        .map_err(|_| anyhow::anyhow!("poll: the poller panicked"))?;
    if n != 1 || revents & libc::POLLIN == 0 {
        return Err(anyhow::anyhow!(
            "poll: returned {n} with revents {revents:#x} after {blocked:?}, not readable"
        ));
    }
    let m = recv(b)?;
    if !matches!(m.payload, Payload::Inline(d) if &d[..4] == b"poll") {
        return Err(anyhow::anyhow!(
            "poll: woken, but the message is wrong: {m:?}"
        ));
    }
    if !b.take_notification()? {
        return Err(anyhow::anyhow!(
            "poll: readable, but no notification to take"
        ));
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout only looks.
    let still = unsafe { libc::poll(&mut p, 1, 0) };
    if still != 0 {
        return Err(anyhow::anyhow!(
            "poll: still readable after the notification was taken"
        ));
    }
    Ok(format!(
        "poll: a thread blocked in poll() for {:.1} ms was woken by a message; quiet once taken",
        blocked.as_secs_f64() * 1e3
    ))
}

/// With the Linux driver: another open of the device cannot kick, wait on
/// or map this endpoint.
fn ownership_check(ep: u32) -> anyhow::Result<Option<String>> {
    use std::os::fd::AsRawFd;
    let path = std::env::var(ulnic::DEVICE_ENV).unwrap_or_else(|_| ulnic::DEFAULT_DEVICE.into());
    let Ok(f) = std::fs::File::options().read(true).write(true).open(&path) else {
        return Ok(None); // host attach: processes do not share a node
    };
    let mut id = ep.to_le_bytes();
    let kick = match ioctl(&f, ulnic_abi::uapi::IOC_KICK, &mut id) {
        Ok(_) => std::io::Error::other("it succeeded"),
        Err(e) => e,
    };
    if kick.raw_os_error() != Some(libc::EPERM) {
        return Err(anyhow::anyhow!(
            "another domain could ring endpoint {ep}'s doorbell ({kick})"
        ));
    }
    let map = |id: u32| {
        ulnic_host_attach::map_shared(f.as_raw_fd(), 4096, ulnic_abi::uapi::mmap_ctrl(id))
    };
    // SAFETY (for both munmaps below): each unmaps exactly a 4096-byte
    // mapping `map` just made.
    let unmap = |p: *mut u8| unsafe { libc::munmap(p.cast(), 4096) };
    if let Ok(p) = map(ep) {
        unmap(p);
        return Err(anyhow::anyhow!(
            "another domain could map endpoint {ep}'s rings"
        ));
    }
    let mut report = format!("another domain cannot kick or map endpoint {ep}'s rings (EPERM)");

    // A failed allocation is a clean ENOMEM (it used to free a NULL
    // control region and crash the guest kernel): the driver's fault
    // injection parameter makes the next allocations fail.
    let inject = "/sys/module/ulnic/parameters/fail_alloc";
    let mut injected = false;
    if std::fs::write(inject, "1").is_ok() {
        let r = create_small_endpoint(&f);
        std::fs::write(inject, "0").map_err(|e| anyhow::anyhow!("{inject}: {e}"))?;
        if r.as_ref().err().and_then(|e| e.raw_os_error()) != Some(libc::ENOMEM) {
            return Err(anyhow::anyhow!(
                "CREATE_EP with a failing allocation gave {r:?}, not ENOMEM"
            ));
        }
        injected = true;
    }
    // Its own endpoint: destroying it while mapped is refused (the pages
    // would otherwise be freed under the process's feet).
    let (id, _) = create_small_endpoint(&f).map_err(|e| anyhow::anyhow!("raw CREATE_EP: {e}"))?;
    let p = map(id).map_err(|e| anyhow::anyhow!("own endpoint {id} could not be mapped: {e}"))?;
    let mut idb = id.to_le_bytes();
    let busy = ioctl(&f, ulnic_abi::uapi::IOC_DESTROY_EP, &mut idb);
    unmap(p);
    if busy.as_ref().err().and_then(|e| e.raw_os_error()) != Some(libc::EBUSY) {
        return Err(anyhow::anyhow!(
            "destroying a mapped endpoint gave {busy:?}, not EBUSY"
        ));
    }
    ioctl(&f, ulnic_abi::uapi::IOC_DESTROY_EP, &mut idb)
        .map_err(|e| anyhow::anyhow!("destroy after unmap: {e}"))?;
    report.push_str("; a mapped endpoint cannot be destroyed (EBUSY) until unmapped");
    if injected {
        report.push_str("; a failed endpoint allocation is ENOMEM");
    }
    Ok(Some(report))
}

/// The UTLB: a third domain sends and RDMA-reads through user buffers
/// (pinned by the driver in a guest) to and from `b`, with a table smaller
/// than its buffers so that entries are replaced (and old pages unpinned).
fn utlb_check(nic: &Nic, b: &mut ulnic::Endpoint, to_b: Address) -> anyhow::Result<String> {
    let pd = nic.alloc_pd()?;
    pd.enable_utlb(ulnic::UtlbConfig {
        entries: 8,
        fallback: false,
        ..Default::default()
    })?;
    let mut u = pd.create_endpoint(&EndpointConfig {
        send_entries: 64,
        recv_entries: 64,
        free_entries: 16,
        segment_bytes: 65536,
    })?;
    u.bind(3)?;
    // The RDMA check's tripwire event is of no interest here.
    while b.poll_event().is_some() {}
    utlb_sends(&pd, &mut u, b, to_b)?;
    let data: Vec<u8> = (0..9000u32).map(|i| (i * 3 + 1) as u8).collect();
    utlb_rdma_read(&pd, &mut u, b, &data)?;
    utlb_redirect(&pd, &mut u, b, &data)?;
    utlb_export(&pd, &mut u, b, &data)?;
    let lib = pd.utlb_stats();
    let dev = u.stats()?;
    let get = |n: &str| dev.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
    // Device hits are not required: other domains (other guests) share
    // the device's cache and may evict these lines meanwhile.
    if lib.evictions == 0 || get("utlb_misses") == 0 {
        return Err(anyhow::anyhow!(
            "UTLB counters did not move: {lib:?}, device hits {} misses {}",
            get("utlb_hits"),
            get("utlb_misses")
        ));
    }
    Ok(format!(
        "UTLB: sends and an RDMA read through user buffers, a write redirected into one, one exported; {} misses serviced, {} entries replaced; device cache {} hits, {} misses",
        lib.misses_serviced,
        lib.evictions,
        get("utlb_hits"),
        get("utlb_misses")
    ))
}

/// The next message `b` receives: its tag and bytes (a buffer it came in
/// is given back).
fn take_message(b: &mut ulnic::Endpoint) -> anyhow::Result<(u32, Vec<u8>)> {
    let m = recv(b)?;
    let n = m.len as usize;
    Ok((
        m.tag,
        match m.payload {
            Payload::Inline(d) => d[..n].to_vec(),
            Payload::Buffer { offset, id } => {
                let mut v = vec![0u8; n];
                b.read_segment(offset as usize, &mut v);
                b.post_free(offset, 16384, id)?;
                v
            }
        },
    ))
}

/// Sends from user buffers: the same buffer twice (a miss, then a hit),
/// then 12 one-page buffers through the table's 8 entries (misses replace
/// entries).
fn utlb_sends(
    pd: &ulnic::ProtectionDomain,
    u: &mut ulnic::Endpoint,
    b: &mut ulnic::Endpoint,
    to_b: Address,
) -> anyhow::Result<()> {
    let mut big = pd.alloc_buffer(3 * 4096)?;
    for (i, x) in big.as_mut_slice().iter_mut().enumerate() {
        *x = (i * 29 + 5) as u8;
    }
    let mut how = Vec::new();
    for id in 0..2 {
        how.push(u.post_send_buffer(to_b, 50, &big, 1000..11_000, id, false)?);
        if take_message(b)? != (50, big.as_slice()[1000..11_000].to_vec()) {
            return Err(anyhow::anyhow!(
                "a send from a user buffer delivered other bytes"
            ));
        }
    }
    if how != [ulnic::Translation::Miss, ulnic::Translation::Hit] {
        return Err(anyhow::anyhow!("expected a miss then a hit, got {how:?}"));
    }
    // 12 one-page buffers through 8 entries: misses replace entries.
    let bufs: Vec<ulnic::UserBuffer> = (0..12u8)
        .map(|k| {
            let mut x = pd.alloc_buffer(4096)?;
            x.as_mut_slice().fill(k);
            Ok(x)
        })
        .collect::<Result<_, ulnic::Error>>()?;
    for i in 0..60usize {
        let k = i * 5 % bufs.len();
        u.post_send_buffer(to_b, k as u32, &bufs[k], 0..4096, i as u64, false)?;
        let (tag, bytes) = take_message(b)?;
        if tag != k as u32 || bytes.iter().any(|&x| x != k as u8) {
            return Err(anyhow::anyhow!(
                "send {i} from buffer {k} delivered other bytes"
            ));
        }
    }
    Ok(())
}

/// RDMA-reads `data`, which `b` exports, into a user buffer.
fn utlb_rdma_read(
    pd: &ulnic::ProtectionDomain,
    u: &mut ulnic::Endpoint,
    b: &mut ulnic::Endpoint,
    data: &[u8],
) -> anyhow::Result<()> {
    b.write_segment(600_000, data);
    let cookie = b.export(600_000, 16384, Permissions::READ)?;
    let dst = pd.alloc_buffer(3 * 4096)?;
    // SAFETY: `dst` is not read until the read's completion below.
    unsafe { u.rdma_read_buffer(&cookie, 0, &dst, 100..9100, 99, true) }?;
    loop {
        match u.poll_event() {
            Some(Event::SendDone { id: 99 }) => break,
            Some(other) => return Err(anyhow::anyhow!("RDMA read into a user buffer: {other:?}")),
            None => {
                if !u.wait(WAIT)? {
                    return Err(anyhow::anyhow!(
                        "no completion for the RDMA read into a user buffer"
                    ));
                }
            }
        }
    }
    if dst.as_slice()[100..9100] != data[..] {
        return Err(anyhow::anyhow!(
            "RDMA read into a user buffer brought other bytes"
        ));
    }
    b.revoke(&cookie)?;
    Ok(())
}

/// Transfer redirection: `u`'s default buffer, part of it redirected into
/// a user buffer before `b` writes there (the start of `data`, which `b`
/// holds at 600,000).
fn utlb_redirect(
    pd: &ulnic::ProtectionDomain,
    u: &mut ulnic::Endpoint,
    b: &mut ulnic::Endpoint,
    data: &[u8],
) -> anyhow::Result<()> {
    let default = u.export(0, 65536, Permissions::WRITE)?;
    let landing = pd.alloc_buffer(2 * 4096)?;
    // SAFETY: `landing` is not read before the redirection's report.
    unsafe { u.post_redirect(&default, 1024, &landing, 300..5300, 77) }?;
    let deadline = std::time::Instant::now() + WAIT;
    while !u.sends_done() {
        if std::time::Instant::now() > deadline {
            return Err(anyhow::anyhow!("the device did not take the redirection"));
        }
        std::thread::yield_now();
    }
    b.rdma_write(&default, 1024, 600_000, 5000, 78, true)?;
    let mut seen = (false, false);
    while seen != (true, true) {
        if let Some(ev) = u.poll_event() {
            match ev {
                Event::Redirected {
                    id: 77,
                    outcome: ulnic::RedirectOutcome::Full,
                    start: 0,
                    bytes: 5000,
                    ..
                } => seen.0 = true,
                other => return Err(anyhow::anyhow!("redirection reported {other:?}")),
            }
        } else if let Some(ev) = b.poll_event() {
            match ev {
                Event::SendDone { id: 78 } => seen.1 = true,
                other => {
                    return Err(anyhow::anyhow!(
                        "RDMA write into the default buffer: {other:?}"
                    ))
                }
            }
        } else {
            let woke = if seen.0 { b.wait(WAIT) } else { u.wait(WAIT) };
            if !woke? {
                return Err(anyhow::anyhow!(
                    "no redirection report or completion within 10 s"
                ));
            }
        }
    }
    if landing.as_slice()[300..5300] != data[..5000] {
        return Err(anyhow::anyhow!("redirected bytes differ"));
    }
    Ok(())
}

/// A user buffer exported as an aperture: `b` writes `data` into it and
/// reads it back, through `u`'s UTLB.
fn utlb_export(
    pd: &ulnic::ProtectionDomain,
    u: &mut ulnic::Endpoint,
    b: &mut ulnic::Endpoint,
    data: &[u8],
) -> anyhow::Result<()> {
    let exported = pd.alloc_buffer(3 * 4096)?;
    // SAFETY: `exported` outlives the export (revoked below) and is read
    // only after the write completed.
    let c = unsafe { u.export_buffer(&exported, 104..9104, Permissions::READ_WRITE) }?;
    b.rdma_write(&c, 0, 600_000, 9000, 80, true)?;
    b.rdma_read(&c, 0, 700_000, 9000, 81, true)?;
    for want in [80, 81] {
        loop {
            match b.poll_event() {
                Some(Event::SendDone { id }) if id == want => break,
                Some(other) => {
                    return Err(anyhow::anyhow!(
                        "RDMA on an exported user buffer: {other:?}"
                    ))
                }
                None => {
                    if !b.wait(WAIT)? {
                        return Err(anyhow::anyhow!(
                            "no completion for RDMA on an exported user buffer"
                        ));
                    }
                }
            }
        }
    }
    let mut back = vec![0u8; 9000];
    b.read_segment(700_000, &mut back);
    if exported.as_slice()[104..9104] != data[..] || back != data {
        return Err(anyhow::anyhow!(
            "RDMA on an exported user buffer moved other bytes"
        ));
    }
    u.revoke(&c)?;
    Ok(())
}

/// Remote memory between the two domains: `b` exports part of its segment,
/// `a` writes, flags with an immediate (a tripwire wakes `b`), reads back;
/// wrong and revoked cookies are refused.
fn rdma_check(a: &mut ulnic::Endpoint, b: &mut ulnic::Endpoint) -> anyhow::Result<String> {
    let base = 512 * 1024u64; // clear of b's free buffers
    let cookie = b.export(base, 65536, Permissions::READ_WRITE)?;
    let tw = b.set_tripwire(&cookie, 0, 8, TripwireOn::Writes, false, 42)?;
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    a.write_segment(200_000, &data);
    let next = |a: &mut ulnic::Endpoint| -> anyhow::Result<Event> {
        loop {
            if let Some(ev) = a.poll_event() {
                return Ok(ev);
            }
            if !a.wait(WAIT)? {
                return Err(anyhow::anyhow!("no RDMA completion within 10 s"));
            }
        }
    };
    a.rdma_write(&cookie, 4096, 200_000, data.len() as u32, 1, false)?;
    a.write_immediate(&cookie, 0, Immediate::U64(1), 2, true)?;
    if !b.wait_tripwire(tw, base, 0, WAIT)? {
        return Err(anyhow::anyhow!("the tripwire did not wake the owner"));
    }
    let mut got = vec![0u8; data.len()];
    b.read_segment((base + 4096) as usize, &mut got);
    if got != data || b.read_u64(base) != 1 {
        return Err(anyhow::anyhow!(
            "RDMA write or immediate wrong at the target"
        ));
    }
    if next(a)? != (Event::SendDone { id: 2 }) {
        return Err(anyhow::anyhow!("no completion for the immediate"));
    }
    a.rdma_read(&cookie, 4096, 300_000, data.len() as u32, 3, true)?;
    if next(a)? != (Event::SendDone { id: 3 }) {
        return Err(anyhow::anyhow!("no completion for the RDMA read"));
    }
    a.read_segment(300_000, &mut got);
    if got != data {
        return Err(anyhow::anyhow!("RDMA read brought back other bytes"));
    }
    let forged = Cookie {
        key: cookie.key ^ 1,
        ..cookie
    };
    b.revoke(&cookie)?;
    for (c, id) in [(forged, 4), (cookie, 5)] {
        a.rdma_write(&c, 0, 200_000, 8, id, true)?;
        match next(a)? {
            Event::SendFailed {
                reason: SendError::BadCookie,
                ..
            } => {}
            other => return Err(anyhow::anyhow!("a bad cookie gave {other:?}")),
        }
    }
    Ok("RDMA write, immediate and read through a cookie; the tripwire woke the owner; forged and revoked cookies refused".into())
}
