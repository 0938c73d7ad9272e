//! `ulnic fabric bench`: benchmarks of the emulated fabric, run on a
//! device started in this process with host-attached ports.
//!
//! - `link`: is an emulated link what it was configured to be? Two
//!   switches joined by the link under test, one node on each. The
//!   one-way latency the link adds is the difference of the median delays
//!   the device measures for 8-byte ping-pong messages (send ring to
//!   delivery) over that link and over an ideal one, in interleaved
//!   rounds (the programs' own view, half the round-trip difference, is
//!   reported beside it); the bandwidth is the rate
//!   at which bytes (headers included) leave on the link while one node
//!   streams 64 KiB messages to the other. Payloads are not touched (the
//!   device copies them; the programs write and read nothing): this
//!   measures the link, not the programs.
//! - `hotspot` (VN, IEEE Micro 1998, Figs. 7-8): N clients send to one
//!   server endpoint as fast as flow control allows; the aggregate rate and
//!   each client's share of it, as N grows. The clients are driven
//!   round-robin by one thread (on a 2-core machine, 64 spinning threads
//!   would measure the scheduler), so an unequal share is the fabric's
//!   doing: switch arbitration, transport windows, NACKs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use ulnic::{Address, EndpointConfig, Nic, Payload};
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::topology::{End, Link, LinkParams, Topology};
use ulnic_device::fabric::transport::TransportConfig;

use super::InProcess;

/// The port every benchmark endpoint binds.
const PORT: u32 = 1;
/// Stream message size for the bandwidth measurement.
const STREAM_MSG: u32 = 65536;

/// A link to measure.
#[derive(Debug, Clone, Copy)]
pub struct LinkCase {
    /// Configured rate, Gb/s.
    pub gbps: f64,
    /// Configured one-way latency, microseconds.
    pub latency_us: f64,
}

/// What a link measured.
#[derive(Debug, Clone, Serialize)]
pub struct LinkResult {
    /// "link".
    pub bench: &'static str,
    /// Configured rate, Gb/s.
    pub configured_gbps: f64,
    /// Rate at which bytes (headers included) left on the link, Gb/s
    /// (median of the rounds).
    pub achieved_gbps: f64,
    /// achieved / configured.
    pub bandwidth_ratio: f64,
    /// Payload rate delivered, MB/s (10^6), median of the rounds.
    pub payload_mbytes_per_s: f64,
    /// Configured one-way latency plus the serialisation of one 8-byte
    /// message's packet at the configured rate, microseconds.
    pub configured_one_way_us: f64,
    /// The one-way delay the link adds as the device measured it: the
    /// median time from taking a message from the send ring to delivering
    /// it, over the link minus over an ideal link, microseconds (median of
    /// the rounds).
    pub achieved_one_way_us: f64,
    /// achieved / configured.
    pub latency_ratio: f64,
    /// What the programs saw: half the median round-trip difference, link
    /// minus ideal (includes their scheduling on a busy machine).
    pub app_one_way_us: f64,
    /// Median round trip over an ideal link, microseconds (the baseline).
    pub ideal_rtt_us: f64,
    /// Median round trip over the link, microseconds.
    pub link_rtt_us: f64,
    /// Interleaved rounds.
    pub rounds: u32,
    /// "none": the programs neither write nor read payloads.
    pub payload: &'static str,
}

/// Two switches, node 0 on the first and node 1 on the second by ideal
/// links, the switches joined by `trunk`.
fn two_switches(trunk: LinkParams) -> FabricConfig {
    let host = LinkParams::default();
    let links = vec![
        Link {
            a: End::Switch(0),
            b: End::Switch(1),
            params: trunk,
        },
        Link {
            a: End::Node(0),
            b: End::Switch(0),
            params: host,
        },
        Link {
            a: End::Node(1),
            b: End::Switch(1),
            params: host,
        },
    ];
    FabricConfig {
        // Both shapes are fixed and valid.
        topology: Topology::new(2, vec!["s0".into(), "s1".into()], links)
            .expect("a two-switch topology is valid"),
        seed: 0,
        transport: TransportConfig::default(),
        span: None,
    }
}

fn endpoint(nic: &Nic) -> anyhow::Result<ulnic::Endpoint> {
    let mut ep = nic.alloc_pd()?.create_endpoint(&EndpointConfig {
        send_entries: 256,
        recv_entries: 512,
        free_entries: 256,
        segment_bytes: 32 << 20,
    })?;
    ep.bind(PORT)?;
    Ok(ep)
}

/// Median round trip of `iters` 8-byte ping-pongs between nodes 0 and 1,
/// and the median one-way delay the device measured for those messages
/// (from taking one from the send ring to delivering it).
fn pingpong(run: &InProcess, iters: usize) -> anyhow::Result<(Duration, Duration)> {
    run.device.switch().take_fabric_delays();
    let a = Nic::attach(&run.sockets[0])?;
    let b = Nic::attach(&run.sockets[1])?;
    let mut pinger = endpoint(&a)?;
    let mut echo = endpoint(&b)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let echoer = std::thread::spawn(move || -> anyhow::Result<()> {
        let back = Address {
            node: 0,
            port: PORT,
        };
        while !stop2.load(Ordering::Relaxed) {
            match echo.poll_recv() {
                Some(m) => {
                    let Payload::Inline(d) = m.payload else {
                        anyhow::bail!("a ping came in a buffer");
                    };
                    while let Err(ulnic::Error::WouldBlock) =
                        echo.post_send_inline(back, 0, &d[..m.len as usize], 0)
                    {
                        std::thread::yield_now();
                    }
                }
                None => std::thread::yield_now(),
            }
        }
        Ok(())
    });
    let to = Address {
        node: 1,
        port: PORT,
    };
    let mut samples = Vec::with_capacity(iters);
    let warmup = iters / 10;
    for i in 0..iters + warmup {
        let t = Instant::now();
        pinger.post_send_inline(to, 0, &(i as u64).to_le_bytes(), 0)?;
        let deadline = t + Duration::from_secs(10);
        loop {
            if pinger.poll_recv().is_some() {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "no echo within 10 s");
            std::thread::yield_now();
        }
        if i >= warmup {
            samples.push(t.elapsed());
        }
    }
    stop.store(true, Ordering::Relaxed);
    echoer
        .join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    samples.sort();
    let mut delays = run.device.switch().take_fabric_delays();
    anyhow::ensure!(!delays.is_empty(), "the device recorded no delays");
    delays.sort_unstable();
    Ok((
        samples[samples.len() / 2],
        Duration::from_nanos(delays[delays.len() / 2]),
    ))
}

/// Streams 64 KiB messages from node 0 to node 1 for `span`; returns the
/// rate bytes left on the trunk (link 0, direction 0) in bits/s, measured
/// after a warm-up, and the payload bytes/s delivered.
fn stream(run: &InProcess, span: Duration) -> anyhow::Result<(f64, f64)> {
    let a = Nic::attach(&run.sockets[0])?;
    let b = Nic::attach(&run.sockets[1])?;
    let mut tx = endpoint(&a)?;
    let mut rx = endpoint(&b)?;
    let bufs = (rx.segment_len() / STREAM_MSG as usize).min(256) as u64;
    for i in 0..bufs {
        rx.post_free(i * u64::from(STREAM_MSG), STREAM_MSG, i)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let receiver = std::thread::spawn(move || -> anyhow::Result<u64> {
        let mut got = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            match rx.poll_recv() {
                Some(m) => {
                    let Payload::Buffer { offset, id } = m.payload else {
                        anyhow::bail!("a 64 KiB message came inline");
                    };
                    got += u64::from(m.len);
                    rx.post_free(offset, STREAM_MSG, id)?;
                }
                None => std::thread::yield_now(),
            }
        }
        Ok(got)
    });
    let to = Address {
        node: 1,
        port: PORT,
    };
    let lane_bytes = || -> anyhow::Result<u64> {
        let c = run.device.switch().fabric_counters().context("no fabric")?;
        Ok(c.lanes[0].bytes)
    };
    let start = Instant::now();
    let warm = span / 5;
    let mut first: Option<(Instant, u64)> = None;
    let mut sent = 0u64;
    while start.elapsed() < span + warm {
        match tx.post_send(
            to,
            0,
            (sent % 64) * u64::from(STREAM_MSG),
            STREAM_MSG,
            sent,
            false,
        ) {
            Ok(()) => sent += 1,
            Err(ulnic::Error::WouldBlock) => std::thread::yield_now(),
            Err(e) => return Err(e.into()),
        }
        while tx.poll_event().is_some() {}
        if first.is_none() && start.elapsed() >= warm {
            first = Some((Instant::now(), lane_bytes()?));
        }
    }
    let (t0, b0) = first.context("the stream never warmed up")?;
    let (t1, b1) = (Instant::now(), lane_bytes()?);
    stop.store(true, Ordering::Relaxed);
    let payload = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver panicked"))??;
    let secs = (t1 - t0).as_secs_f64();
    Ok((
        (b1 - b0) as f64 * 8.0 / secs,
        payload as f64 / (start.elapsed().as_secs_f64()),
    ))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures each case in `rounds` interleaved rounds (ideal, link, ideal,
/// link, ...); `say` gets progress.
pub fn link(
    cases: &[LinkCase],
    rounds: u32,
    iters: usize,
    span: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<LinkResult>> {
    let mut out = Vec::new();
    for c in cases {
        anyhow::ensure!(
            c.gbps > 0.0 && c.latency_us >= 0.0,
            "a link needs a positive rate and a latency of 0 or more"
        );
        let trunk = LinkParams {
            latency: Duration::from_secs_f64(c.latency_us / 1e6),
            bandwidth_bps: Some((c.gbps * 1e9) as u64),
            ..LinkParams::default()
        };
        let ideal = InProcess::start(two_switches(LinkParams::default()), 4)?;
        let real = InProcess::start(two_switches(trunk), 4)?;
        let (mut ideal_rtt, mut link_rtt, mut diff, mut rate, mut goodput, mut app) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for r in 0..rounds {
            say(&format!(
                "link {} Gb/s {} us: round {} of {rounds}",
                c.gbps,
                c.latency_us,
                r + 1
            ));
            let (i, di) = pingpong(&ideal, iters)?;
            let (l, dl) = pingpong(&real, iters)?;
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            ideal_rtt.push(us(i));
            link_rtt.push(us(l));
            app.push((us(l) - us(i)) / 2.0);
            diff.push(us(dl) - us(di));
            let (bps, payload) = stream(&real, span)?;
            rate.push(bps / 1e9);
            goodput.push(payload / 1e6);
        }
        // One 8-byte message is one packet of a 64-byte header and 8 bytes.
        let serialise_us = (64.0 + 8.0) * 8.0 / (c.gbps * 1e9) * 1e6;
        let configured_one_way_us = c.latency_us + serialise_us;
        let achieved_gbps = median(rate);
        let achieved_one_way_us = median(diff);
        out.push(LinkResult {
            bench: "link",
            configured_gbps: c.gbps,
            achieved_gbps,
            bandwidth_ratio: achieved_gbps / c.gbps,
            payload_mbytes_per_s: median(goodput),
            configured_one_way_us,
            achieved_one_way_us,
            latency_ratio: achieved_one_way_us / configured_one_way_us,
            app_one_way_us: median(app),
            ideal_rtt_us: median(ideal_rtt),
            link_rtt_us: median(link_rtt),
            rounds,
            payload: "none",
        });
    }
    Ok(out)
}

/// One hot-spot measurement.
#[derive(Debug, Clone, Serialize)]
pub struct HotspotResult {
    /// "hotspot".
    pub bench: &'static str,
    /// Clients sending to the one server endpoint.
    pub clients: u32,
    /// Messages the server received per second, all clients together.
    pub aggregate_per_s: f64,
    /// Each client's share of what the server received, by client.
    pub shares: Vec<f64>,
    /// Smallest share times the number of clients (1 is perfectly fair).
    pub min_share_x_n: f64,
    /// Largest share times the number of clients.
    pub max_share_x_n: f64,
    /// Jain's fairness index of the per-client counts (1 is fair).
    pub jain: f64,
    /// Seconds measured.
    pub seconds: f64,
}

/// Hot spot: for each N in `clients`, N clients (nodes 1..=N, one switch)
/// send 16-byte messages to node 0's one endpoint for `span`.
pub fn hotspot(
    clients: &[u32],
    span: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<HotspotResult>> {
    let most = clients.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(
        (1..=256).contains(&most) && !clients.contains(&0),
        "--clients must be 1 to 256"
    );
    let fabric = FabricConfig {
        topology: Topology::single_switch(most + 1),
        seed: 0,
        transport: TransportConfig::default(),
        span: None,
    };
    let run = InProcess::start(fabric, 2)?;
    let small = EndpointConfig {
        send_entries: 64,
        recv_entries: 64,
        free_entries: 16,
        segment_bytes: 1 << 16,
    };
    let nics: Vec<Nic> = run
        .sockets
        .iter()
        .map(|s| Nic::attach(s))
        .collect::<Result<_, _>>()?;
    let mut server = nics[0].alloc_pd()?.create_endpoint(&EndpointConfig {
        recv_entries: 4096,
        ..small
    })?;
    server.bind(PORT)?;
    let mut eps = Vec::new();
    for nic in &nics[1..] {
        let mut ep = nic.alloc_pd()?.create_endpoint(&small)?;
        ep.bind(PORT)?;
        eps.push(ep);
    }
    let mut out = Vec::new();
    for &n in clients {
        say(&format!("hot spot: {n} client(s)"));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let mut active: Vec<ulnic::Endpoint> = eps.drain(..n as usize).collect();
        let driver = std::thread::spawn(move || -> anyhow::Result<Vec<ulnic::Endpoint>> {
            let to = Address {
                node: 0,
                port: PORT,
            };
            let msg = [7u8; 16];
            while !stop2.load(Ordering::Relaxed) {
                let mut posted = false;
                for ep in active.iter_mut() {
                    match ep.post_send_inline(to, 0, &msg, 0) {
                        Ok(()) => posted = true,
                        Err(ulnic::Error::WouldBlock) => {}
                        Err(e) => return Err(e.into()),
                    }
                    while ep.poll_event().is_some() {}
                }
                if !posted {
                    std::thread::yield_now();
                }
            }
            Ok(active)
        });
        let mut counts = vec![0u64; n as usize];
        let warm = span / 5;
        let start = Instant::now();
        let mut measuring: Option<Instant> = None;
        while start.elapsed() < span + warm {
            if measuring.is_none() && start.elapsed() >= warm {
                measuring = Some(Instant::now());
                counts.iter_mut().for_each(|c| *c = 0);
            }
            match server.poll_recv() {
                Some(m) => {
                    let c = (m.src.node as usize).wrapping_sub(1);
                    if let Some(c) = counts.get_mut(c) {
                        *c += 1;
                    }
                }
                None => std::thread::yield_now(),
            }
        }
        let seconds = measuring.map_or(0.0, |t| t.elapsed().as_secs_f64());
        stop.store(true, Ordering::Relaxed);
        let mut back = driver
            .join()
            .map_err(|_| anyhow::anyhow!("the client thread panicked"))??;
        // Drain what is still in flight before the next N.
        let quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(200) {
            if server.poll_recv().is_none() {
                std::thread::yield_now();
            }
        }
        back.append(&mut eps);
        eps = back;
        let total: u64 = counts.iter().sum();
        let shares: Vec<f64> = counts
            .iter()
            .map(|&c| c as f64 / total.max(1) as f64)
            .collect();
        let sum: f64 = counts.iter().map(|&c| c as f64).sum();
        let sq: f64 = counts.iter().map(|&c| (c as f64).powi(2)).sum();
        let nf = f64::from(n);
        out.push(HotspotResult {
            bench: "hotspot",
            clients: n,
            aggregate_per_s: total as f64 / seconds.max(1e-9),
            min_share_x_n: shares.iter().copied().fold(f64::MAX, f64::min) * nf,
            max_share_x_n: shares.iter().copied().fold(0.0, f64::max) * nf,
            shares,
            jain: if sq > 0.0 { sum * sum / (nf * sq) } else { 0.0 },
            seconds,
        });
    }
    Ok(out)
}
