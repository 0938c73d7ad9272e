//! `ulnic bench pio`: round trips over PIO windows beside the
//! shared-memory spin ring and ulnic messages, host-attached, in
//! interleaved rounds, with PIO's ratio to each.

use std::io;
use std::path::Path;

use super::link::Mode;

/// One line of `ulnic bench pio`: a transport's round trips, and PIO's
/// over it, each the median of the rounds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PioRow {
    /// The transport.
    pub transport: super::pingpong::Transport,
    /// How its receiver waits (PIO blocking: on a tripwire the sender's
    /// PIO_SYNC fires).
    pub mode: Mode,
    /// Message size in bytes.
    pub size: u32,
    /// Round trips per round.
    pub iters: u64,
    /// Median of the rounds' median round trips, microseconds.
    pub median_us: f64,
    /// Median of the rounds' 95th percentiles, microseconds.
    pub p95_us: f64,
    /// Median of the rounds' PIO median (PIO waiting the same way) over
    /// this transport's (1 for PIO itself).
    pub pio_ratio: f64,
    /// How payloads were touched.
    pub payload: &'static str,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Round trips over PIO windows, the shared-memory spin ring and ulnic
/// messages, polling, then PIO windows and ulnic messages blocking,
/// host-attached, in `rounds` interleaved rounds (each once a round, in
/// turn), every payload byte written and checked. `ulnic_dir` holds a running device's node sockets (0 and 1).
pub fn compare(
    size: u32,
    iters: u64,
    rounds: u32,
    ulnic_dir: &Path,
    scratch: &Path,
    say: &mut dyn FnMut(&str),
) -> io::Result<Vec<PioRow>> {
    use super::pingpong::{run_one, Spec, Transport, Workload};
    let transports = [
        (Transport::Pio, Mode::Poll),
        (Transport::Shm, Mode::Poll),
        (Transport::Ulnic, Mode::Poll),
        (Transport::Pio, Mode::Block),
        (Transport::Ulnic, Mode::Block),
    ];
    // Each row's ratio is to PIO waiting the same way.
    let reference = |mode: Mode| {
        transports
            .iter()
            .position(|&(t, m)| t == Transport::Pio && m == mode)
            .unwrap_or(0)
    };
    let touch = super::payload::Touch::WriteVerify;
    let mut med: Vec<Vec<f64>> = vec![Vec::new(); transports.len()];
    let mut p95: Vec<Vec<f64>> = vec![Vec::new(); transports.len()];
    let mut ratio: Vec<Vec<f64>> = vec![Vec::new(); transports.len()];
    for round in 1..=rounds {
        let mut this = Vec::new();
        for (i, &(t, mode)) in transports.iter().enumerate() {
            say(&format!("round {round}/{rounds}: {t:?} ({mode:?})"));
            let spec = Spec {
                workload: Workload::Pingpong,
                transport: t,
                size,
                iters,
                mode,
                corrupt_at: None,
                nodes: (0, 1),
                payload: touch,
                endpoints: 1,
                event_queue: false,
            };
            let r = run_one(&spec, ulnic_dir, scratch)?;
            let us = |ns: Option<u64>| ns.map_or(f64::NAN, |n| n as f64 / 1000.0);
            med[i].push(us(r.median_ns));
            p95[i].push(us(r.p95_ns));
            this.push(us(r.median_ns));
        }
        for (i, v) in this.iter().enumerate() {
            ratio[i].push(this[reference(transports[i].1)] / v);
        }
    }
    Ok(transports
        .iter()
        .enumerate()
        .map(|(i, &(transport, mode))| PioRow {
            transport,
            mode,
            size,
            iters,
            median_us: median(&mut med[i]),
            p95_us: median(&mut p95[i]),
            pio_ratio: median(&mut ratio[i]),
            payload: touch.label(),
        })
        .collect())
}

/// One figure of CLAN's PIO experiments: an operation's cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PioCost {
    /// Which experiment: "setup" (CLAN Table 4.1) or "transmit" (the
    /// sender's cost per message, CLAN Fig. 3.5).
    pub bench: &'static str,
    /// The operation.
    pub op: String,
    /// Message size (transmit), else 0.
    pub size: u32,
    /// Times measured.
    pub iters: u64,
    /// Median, microseconds.
    pub median_us: f64,
    /// 95th percentile, microseconds.
    pub p95_us: f64,
}

fn cost(bench: &'static str, op: &str, size: u32, samples: &mut [u64]) -> PioCost {
    samples.sort_unstable();
    // The percentiles every benchmark line uses (`Record`'s).
    let at = |p: f64| super::record::percentile(samples, p) as f64 / 1000.0;
    PioCost {
        bench,
        op: op.into(),
        size,
        iters: samples.len() as u64,
        median_us: at(0.5),
        p95_us: at(0.95),
    }
}

/// CLAN Table 4.1's set-up costs on this device, host-attached: export,
/// import, revoke and release of a one-page PIO window (each a control
/// command; import and revoke also one map or unmap+fence at the
/// importer), beside an RDMA aperture's EXPORT and REVOKE.
pub fn setup_costs(ulnic_dir: &Path, n: u64) -> io::Result<Vec<PioCost>> {
    let attach = |i: u32| ulnic::Nic::attach(&ulnic_dir.join(format!("node{i}.sock")));
    let (a, b) = (
        attach(0).map_err(io::Error::from)?,
        attach(1).map_err(io::Error::from)?,
    );
    let ep = |nic: &ulnic::Nic| nic.alloc_pd()?.create_endpoint(&Default::default());
    let (ea, eb) = (
        ep(&a).map_err(io::Error::from)?,
        ep(&b).map_err(io::Error::from)?,
    );
    let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..n {
        let s = std::time::Instant::now();
        let w = ea.export_pio(4096, Some(1)).map_err(io::Error::from)?;
        t[0].push(s.elapsed().as_nanos() as u64);
        let s = std::time::Instant::now();
        let imp = eb.import_pio(w.grant()).map_err(io::Error::from)?;
        t[1].push(s.elapsed().as_nanos() as u64);
        let s = std::time::Instant::now();
        w.revoke().map_err(io::Error::from)?;
        t[2].push(s.elapsed().as_nanos() as u64);
        let s = std::time::Instant::now();
        drop(imp);
        t[3].push(s.elapsed().as_nanos() as u64);
        let s = std::time::Instant::now();
        drop(w);
        t[4].push(s.elapsed().as_nanos() as u64);
    }
    let mut rows: Vec<PioCost> = [
        "export",
        "import",
        "revoke",
        "release import",
        "release window",
    ]
    .iter()
    .zip(t.iter_mut())
    .map(|(op, v)| cost("setup", &format!("pio {op}"), 0, v))
    .collect();
    // At most 64 apertures per endpoint: each export is revoked at once.
    let (mut ex, mut rv) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let s = std::time::Instant::now();
        let c = ea
            .export(0, 4096, ulnic::Permissions::WRITE)
            .map_err(io::Error::from)?;
        ex.push(s.elapsed().as_nanos() as u64);
        let s = std::time::Instant::now();
        ea.revoke(&c).map_err(io::Error::from)?;
        rv.push(s.elapsed().as_nanos() as u64);
    }
    rows.push(cost("setup", "rdma export", 0, &mut ex));
    rows.push(cost("setup", "rdma revoke", 0, &mut rv));
    Ok(rows)
}

/// CLAN Fig. 3.5: what handing one message to the other side costs the
/// sender, by size. PIO: storing the bytes into the imported window and
/// then a release store of a flag. Descriptor: a ulnic send (inline up
/// to `INLINE_MAX`, else written into the segment and posted), with a
/// receiver thread taking the messages; the ring is drained of events
/// untimed when full.
pub fn transmit_costs(ulnic_dir: &Path, sizes: &[u32], n: u64) -> io::Result<Vec<PioCost>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let os = io::Error::from;
    let attach = |i: u32| ulnic::Nic::attach(&ulnic_dir.join(format!("node{i}.sock")));
    let (a, b) = (attach(0).map_err(os)?, attach(1).map_err(os)?);
    let max = sizes.iter().copied().max().unwrap_or(8).max(8) as usize;
    let big = ulnic::EndpointConfig {
        segment_bytes: (64 * max.next_multiple_of(4096)).max(1 << 20),
        ..Default::default()
    };
    let mut tx = a
        .alloc_pd()
        .and_then(|pd| pd.create_endpoint(&big))
        .map_err(os)?;
    let mut rx = b
        .alloc_pd()
        .and_then(|pd| pd.create_endpoint(&big))
        .map_err(os)?;
    rx.bind(9).map_err(os)?;
    let window = rx.export_pio(max + 64, Some(0)).map_err(os)?;
    let import = tx.import_pio(window.grant()).map_err(os)?;
    let slot = max.next_multiple_of(4096);
    for i in 0..64 {
        rx.post_free((i * slot) as u64, slot as u32, i as u64)
            .map_err(os)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let drain = std::thread::spawn(move || {
        while !stopping.load(Ordering::Relaxed) {
            match rx.poll_recv() {
                Some(m) => {
                    if let ulnic::Payload::Buffer { offset, id } = m.payload {
                        let _ = rx.post_free(offset, slot as u32, id);
                    }
                }
                None => std::thread::yield_now(),
            }
        }
        drop(window);
    });
    let to = ulnic::Address { node: 1, port: 9 };
    let mut rows = Vec::new();
    for &size in sizes {
        let data = vec![0x5au8; size as usize];
        let mut pio = Vec::with_capacity(n as usize);
        for i in 0..n {
            let t = std::time::Instant::now();
            import.write(64, &data);
            import.word(0).store(i, Ordering::Release);
            pio.push(t.elapsed().as_nanos() as u64);
        }
        rows.push(cost("transmit", "pio stores", size, &mut pio));
        let mut desc = Vec::with_capacity(n as usize);
        for i in 0..n {
            while tx.send_space() == 0 {
                while tx.poll_event().is_some() {}
                std::thread::yield_now();
            }
            let t = std::time::Instant::now();
            if size <= ulnic::INLINE_MAX {
                tx.post_send_inline(to, 0, &data, i).map_err(os)?;
            } else {
                let at = (i % 64) as usize * slot;
                tx.write_segment(at, &data);
                tx.post_send(to, 0, at as u64, size, i, false).map_err(os)?;
            }
            desc.push(t.elapsed().as_nanos() as u64);
        }
        rows.push(cost("transmit", "ulnic send", size, &mut desc));
        while !tx.sends_done() {
            while tx.poll_event().is_some() {}
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    drain
        .join()
        .map_err(|_| io::Error::other("the receiver panicked"))?;
    Ok(rows)
}
