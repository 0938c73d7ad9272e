//! `ulnic fabric bench`: benchmarks of the emulated fabric, run on a
//! device started in this process with host-attached nodes.
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
//! - `hotspot`: N clients send one-way 8-byte messages to one server
//!   endpoint as fast as flow control allows (VN Figs. 7-8 load a server
//!   with request/reply Active Messages instead); the aggregate rate and
//!   each client's share of it, as N grows. The clients are driven
//!   round-robin by one thread (on a 2-core machine, 64 spinning threads
//!   would measure the scheduler), so an unequal share is the fabric's
//!   doing: switch arbitration, transport windows, NACKs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use ulnic::{Address, EndpointConfig, Nic, Payload};
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::topology::{End, Link, LinkParams, Topology};
use ulnic_device::fabric::transport::TransportConfig;

use crate::fabric::InProcess;

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
        mapping: None,
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

/// What a ping-pong measured.
struct PingPong {
    /// Round trips, sorted.
    rtt: Vec<Duration>,
    /// The median one-way delay the device measured (taking a message
    /// from the send ring to delivering it); `None` without a fabric.
    delay: Option<Duration>,
}

impl PingPong {
    fn rtt_at(&self, q: f64) -> Duration {
        self.rtt[((self.rtt.len() - 1) as f64 * q) as usize]
    }
}

/// `iters` 8-byte ping-pongs between nodes 0 and 1 (after a tenth as
/// many to warm up).
fn pingpong(run: &InProcess, iters: usize) -> anyhow::Result<PingPong> {
    run.device.take_fabric_delays();
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
    let mut delays = run.device.take_fabric_delays();
    delays.sort_unstable();
    // On an ideal path the messages take the shortcut (spec §10): no
    // fabric time, so no delay is recorded; theirs is 0.
    let shortcuts = run
        .device
        .fabric_counters()
        .is_some_and(|c| c.transport.iter().any(|t| t.shortcuts > 0));
    let delay = match delays.get(delays.len() / 2) {
        Some(&d) => Some(Duration::from_nanos(d)),
        None if shortcuts => Some(Duration::ZERO),
        None => None,
    };
    Ok(PingPong {
        rtt: samples,
        delay,
    })
}

/// Streams 64 KiB messages from node 0 to node 1 for `span`; returns the
/// rate bytes left on link 0 in direction 0 in bits/s, measured after a
/// warm-up (0 without a fabric), and the payload bytes/s delivered.
fn stream(run: &InProcess, span: Duration) -> anyhow::Result<(f64, f64)> {
    let a = Nic::attach(&run.sockets[0])?;
    let b = Nic::attach(&run.sockets[1])?;
    let mut tx = endpoint(&a)?;
    let mut rx = endpoint(&b)?;
    let bufs = (rx.segment_len() / STREAM_MSG as usize).min(256) as u64;
    for i in 0..bufs {
        rx.post_free(i * u64::from(STREAM_MSG), STREAM_MSG, i)?;
    }
    // The number of messages sent, once the sender is done (until then
    // RUNNING): the receiver takes them all before it stops, so that the
    // transport's counters are not inflated by messages refused at the end
    // (and goodput counts every byte sent).
    const RUNNING: u64 = u64::MAX;
    let sent_total = Arc::new(AtomicU64::new(RUNNING));
    let total = sent_total.clone();
    let receiver = std::thread::spawn(move || -> anyhow::Result<u64> {
        let (mut got, mut msgs) = (0u64, 0u64);
        let mut drain_deadline = None;
        loop {
            match rx.poll_recv() {
                Some(m) => {
                    let Payload::Buffer { offset, id } = m.payload else {
                        anyhow::bail!("a 64 KiB message came inline");
                    };
                    got += u64::from(m.len);
                    msgs += 1;
                    rx.post_free(offset, STREAM_MSG, id)?;
                }
                None => {
                    let sent = total.load(Ordering::Acquire);
                    if sent != RUNNING {
                        if msgs >= sent {
                            return Ok(got);
                        }
                        let d = *drain_deadline
                            .get_or_insert_with(|| Instant::now() + Duration::from_secs(10));
                        anyhow::ensure!(
                            Instant::now() < d,
                            "{} of {sent} streamed messages arrived",
                            msgs
                        );
                    }
                    std::thread::yield_now();
                }
            }
        }
    });
    let to = Address {
        node: 1,
        port: PORT,
    };
    let lane_bytes = || -> anyhow::Result<u64> {
        // 0 without a fabric: only the payload rate is measured then.
        Ok(run.device.fabric_counters().map_or(0, |c| c.lanes[0].bytes))
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
    sent_total.store(sent, Ordering::Release);
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
            let i = pingpong(&ideal, iters)?;
            let l = pingpong(&real, iters)?;
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let (i_rtt, l_rtt) = (us(i.rtt_at(0.5)), us(l.rtt_at(0.5)));
            ideal_rtt.push(i_rtt);
            link_rtt.push(l_rtt);
            app.push((l_rtt - i_rtt) / 2.0);
            let (Some(di), Some(dl)) = (i.delay, l.delay) else {
                anyhow::bail!("the device recorded no delays");
            };
            diff.push(us(dl) - us(di));
            let (bps, payload) = stream(&real, span)?;
            rate.push(bps / 1e9);
            goodput.push(payload / 1e6);
        }
        // One 8-byte message is one packet: a 64-byte header, its route
        // (a gate for each of the two switches) and 8 bytes.
        let serialise_us = (64.0 + 2.0 + 8.0) * 8.0 / (c.gbps * 1e9) * 1e6;
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
        mapping: None,
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
        let (min_share_x_n, max_share_x_n, jain) =
            spread(&counts.iter().map(|&c| c as f64).collect::<Vec<_>>());
        out.push(HotspotResult {
            bench: "hotspot",
            clients: n,
            aggregate_per_s: total as f64 / seconds.max(1e-9),
            min_share_x_n,
            max_share_x_n,
            shares,
            jain,
            seconds,
        });
    }
    Ok(out)
}

/// How evenly `values` (one per client) share their sum: the smallest
/// and largest share times the number of clients, and Jain's fairness
/// index (each 1 when perfectly even; 0 when the sum is 0).
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    let total: f64 = values.iter().sum();
    let sq: f64 = values.iter().map(|v| v * v).sum();
    let n = values.len() as f64;
    if total <= 0.0 || sq <= 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let share = |v: f64| v * n / total;
    (
        share(values.iter().copied().fold(f64::MAX, f64::min)),
        share(values.iter().copied().fold(0.0, f64::max)),
        total * total / (n * sq),
    )
}

/// One case of a sweep: ping-pong and stream between nodes 0 and 1.
#[derive(Debug, Clone, Serialize)]
pub struct SweepResult {
    /// "hops", "loss" or "reliability".
    pub bench: &'static str,
    /// The seed experiment this follows.
    pub after: &'static str,
    /// What this case is.
    pub case: String,
    /// Median 8-byte round trip, microseconds.
    pub rtt_median_us: f64,
    /// 95th percentile, microseconds.
    pub rtt_p95_us: f64,
    /// 64 KiB messages streamed, payload MB/s (10^6).
    pub stream_mbytes_per_s: f64,
    /// The stream's payload rate over (1 - path loss) times the link
    /// rate: what the transport makes of the capacity loss leaves (packet
    /// headers count against it). None without rated links.
    pub of_lossy_link_rate: Option<f64>,
    /// DATA packets the transport sent during the case (first sends and
    /// retransmissions).
    pub data_packets: u64,
    /// Transport retransmissions during the case.
    pub retransmissions: u64,
    /// Transport timeouts during the case.
    pub timeouts: u64,
    /// NACKs the senders received (a receiver without room).
    pub nacks: u64,
    /// ROOM packets the senders sent: held by a receiver's room, they
    /// asked instead of sending (spec §10.4).
    pub room_asks: u64,
    /// "none": the programs write and read no payload bytes.
    pub payload: &'static str,
}

/// Which sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// 1, 2 and 3 switches between the two nodes.
    Hops,
    /// Packet loss along the path from 0 to 10 %.
    Loss,
    /// No fabric (no transport) against an ideal fabric with the
    /// transport.
    Reliability,
}

/// Node 0 on the first of `k` switches in a chain, node 1 on the last,
/// every link with `params`.
fn chain(k: usize, params: LinkParams) -> FabricConfig {
    let mut links: Vec<Link> = (1..k)
        .map(|i| Link {
            a: End::Switch(i - 1),
            b: End::Switch(i),
            params,
        })
        .collect();
    links.push(Link {
        a: End::Node(0),
        b: End::Switch(0),
        params,
    });
    links.push(Link {
        a: End::Node(1),
        b: End::Switch(k - 1),
        params,
    });
    FabricConfig {
        topology: Topology::new(2, (0..k).map(|i| format!("s{i}")).collect(), links)
            .expect("a chain of switches is a valid topology"),
        seed: 1,
        transport: TransportConfig::default(),
        span: None,
        mapping: None,
    }
}

/// Runs a sweep; `say` gets progress.
pub fn sweep(
    which: Sweep,
    iters: usize,
    span: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<SweepResult>> {
    // Links of 10 Gb/s, 1 us, 4 KiB packets: a 64 KiB message is 16.
    let link = LinkParams {
        latency: Duration::from_micros(1),
        bandwidth_bps: Some(10_000_000_000),
        mtu: 4096,
        ..LinkParams::default()
    };
    // Each case: its name, its fabric, and the share of the data packets
    // sent that cross the whole path (None without a rated fabric).
    type Case = (String, Option<FabricConfig>, Option<f64>);
    let (bench, after, cases): (&str, &str, Vec<Case>) = match which {
        Sweep::Hops => (
            "hops",
            "ping-pong and stream across switch hops",
            (1..=3)
                .map(|k| {
                    (
                        format!("{k} switch(es), 10 Gb/s 1 us links"),
                        Some(chain(k, link)),
                        Some(1.0),
                    )
                })
                .collect(),
        ),
        Sweep::Loss => (
            "loss",
            "throughput against loss rate",
            // The loss of the whole path (two links, each dropping
            // independently), so that "5 % loss" means what a user means.
            [0.0, 0.001, 0.01, 0.05, 0.1]
                .into_iter()
                .map(|path_loss: f64| {
                    let drop = 1.0 - (1.0 - path_loss).sqrt();
                    let lossy = LinkParams {
                        faults: ulnic_device::fabric::topology::Faults {
                            drop,
                            ..Default::default()
                        },
                        ..link
                    };
                    (
                        format!("path loss {path_loss} ({drop:.4} per link)"),
                        Some(chain(1, lossy)),
                        Some(1.0 - path_loss),
                    )
                })
                .collect(),
        ),
        Sweep::Reliability => (
            "reliability",
            "the cost of the transport",
            vec![
                ("transport off (no fabric)".to_string(), None, None),
                (
                    "transport on (ideal fabric)".to_string(),
                    Some(chain(1, LinkParams::default())),
                    None,
                ),
            ],
        ),
    };
    let mut out = Vec::new();
    let link_mbytes_per_s = link.bandwidth_bps.unwrap_or(0) as f64 / 8e6;
    for (case, fabric, delivered) in cases {
        say(&format!("{bench}: {case}"));
        let run = InProcess::start_with(2, fabric, 4)?;
        let pp = pingpong(&run, iters)?;
        let (_, payload) = stream(&run, span)?;
        let t = run
            .device
            .fabric_counters()
            .map(|c| c.transport)
            .unwrap_or_default();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        out.push(SweepResult {
            bench: match which {
                Sweep::Hops => "hops",
                Sweep::Loss => "loss",
                Sweep::Reliability => "reliability",
            },
            after,
            case,
            rtt_median_us: us(pp.rtt_at(0.5)),
            rtt_p95_us: us(pp.rtt_at(0.95)),
            stream_mbytes_per_s: payload / 1e6,
            of_lossy_link_rate: delivered.map(|d| payload / 1e6 / (d * link_mbytes_per_s)),
            data_packets: t.iter().map(|c| c.data_packets).sum(),
            retransmissions: t.iter().map(|c| c.retransmissions).sum(),
            timeouts: t.iter().map(|c| c.timeouts).sum(),
            nacks: t.iter().map(|c| c.nacks_received).sum(),
            room_asks: t.iter().map(|c| c.room_asks).sum(),
            payload: "none",
        });
    }
    Ok(out)
}

/// One drain measurement.
#[derive(Debug, Clone, Serialize)]
pub struct DrainResult {
    /// "drain".
    pub bench: &'static str,
    /// Engine threads.
    pub engine_threads: u32,
    /// Messages drained (every pair's).
    pub messages: u64,
    /// Median over the rounds of messages delivered per second.
    pub messages_per_s: f64,
    /// Every round's rate.
    pub rounds: Vec<f64>,
    /// CPU time of the whole process (engines, mostly) per message, in
    /// nanoseconds, median over the rounds.
    pub cpu_ns_per_message: f64,
    /// Median over the rounds of this rate divided by the first thread
    /// count's rate in the same round (paired, so a noisy round counts
    /// once for both).
    pub speedup: f64,
}

/// The process's user plus system CPU time.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass; RUSAGE_SELF
    // is always valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// The engine alone: send rings filled in advance (engines paused) with
/// `per_pair` 8-byte messages from node 0 to 1 and from node 2 to 3 (on
/// switches s0 and s1), then the time for the engine to deliver them all,
/// with each number of engine threads in `threads`, in interleaved rounds.
pub fn drain(
    threads: &[u32],
    per_pair: u32,
    rounds: u32,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<DrainResult>> {
    anyhow::ensure!(
        (1..=32_000).contains(&per_pair),
        "--messages must be 1 to 32000 per pair (a receive ring holds them all)"
    );
    let host = LinkParams::default();
    let link = |a, b| Link { a, b, params: host };
    let topology = Topology::new(
        4,
        vec!["s0".into(), "s1".into()],
        vec![
            link(End::Switch(0), End::Switch(1)),
            link(End::Node(0), End::Switch(0)),
            link(End::Node(1), End::Switch(0)),
            link(End::Node(2), End::Switch(1)),
            link(End::Node(3), End::Switch(1)),
        ],
    )
    .expect("a two-switch topology is valid");
    let fabric = FabricConfig {
        topology,
        seed: 0,
        transport: TransportConfig::default(),
        span: None,
        mapping: None,
    };
    let ring = (per_pair + 16).next_power_of_two();
    let cfg = EndpointConfig {
        send_entries: ring,
        recv_entries: ring,
        free_entries: 16,
        segment_bytes: 1 << 16,
    };
    let mut rates: Vec<Vec<(f64, f64)>> = vec![Vec::new(); threads.len()];
    for r in 0..rounds {
        for (i, &k) in threads.iter().enumerate() {
            say(&format!(
                "drain: {k} engine thread(s), round {} of {rounds}",
                r + 1
            ));
            let run = InProcess::start_sharded(fabric.clone(), 2, k)?;
            let nics: Vec<Nic> = run
                .sockets
                .iter()
                .map(|s| Nic::attach(s))
                .collect::<Result<_, _>>()?;
            let mut eps = Vec::new();
            for nic in &nics {
                let mut ep = nic.alloc_pd()?.create_endpoint(&cfg)?;
                ep.bind(PORT)?;
                eps.push(ep);
            }
            run.device.pause(true);
            for (from, to) in [(0usize, 1u32), (2, 3)] {
                let dest = Address {
                    node: to,
                    port: PORT,
                };
                for m in 0..per_pair {
                    eps[from].post_send_inline(dest, 0, &m.to_le_bytes(), 0)?;
                }
            }
            let want = 2 * u64::from(per_pair);
            // Read from the receive rings' producer indexes, in shared
            // memory: taking the device's locks to read its counters would
            // stall the engine being measured.
            let delivered = || -> u64 {
                [1usize, 3]
                    .iter()
                    .map(|&i| u64::from(eps[i].recv_ready()))
                    .sum()
            };
            let (c0, t0) = (cpu_time(), Instant::now());
            run.device.pause(false);
            let deadline = t0 + Duration::from_secs(120);
            // Naps, so that this thread takes no core from the engines;
            // the drain ends when the last engine pass that moved
            // something did (the nap it landed in is not counted).
            while delivered() < want {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the engine did not drain within 120 s"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            let cpu = (cpu_time() - c0).as_secs_f64();
            // The pass that published the last message records its end
            // just after: give it time to.
            std::thread::sleep(Duration::from_millis(2));
            let secs = run
                .device
                .last_busy()
                .saturating_duration_since(t0)
                .as_secs_f64();
            anyhow::ensure!(secs > 0.0, "no engine pass was recorded");
            // Every message is in its receiver's ring, in order.
            for to in [1usize, 3] {
                for m in 0..per_pair {
                    let got = eps[to].poll_recv().context("a message is missing")?;
                    let Payload::Inline(d) = got.payload else {
                        anyhow::bail!("an 8-byte message came in a buffer");
                    };
                    anyhow::ensure!(d[..4] == m.to_le_bytes(), "message {m} out of order");
                }
            }
            rates[i].push((want as f64 / secs, cpu * 1e9 / want as f64));
        }
    }
    let base: Vec<f64> = rates
        .first()
        .map_or_else(Vec::new, |r| r.iter().map(|x| x.0).collect());
    Ok(threads
        .iter()
        .zip(rates)
        .map(|(&k, r)| DrainResult {
            bench: "drain",
            engine_threads: k,
            messages: 2 * u64::from(per_pair),
            messages_per_s: median(r.iter().map(|x| x.0).collect()),
            rounds: r.iter().map(|x| x.0).collect(),
            cpu_ns_per_message: median(r.iter().map(|x| x.1).collect()),
            speedup: median(r.iter().zip(&base).map(|(x, b)| x.0 / b).collect()),
        })
        .collect())
}

/// LogP parameters (as VN Fig. 5 gives them) of one-way 8-byte messages
/// between two nodes.
#[derive(Debug, Clone, Serialize)]
pub struct LogPResult {
    /// "logp".
    pub bench: &'static str,
    /// "no fabric" or "ideal fabric".
    pub case: String,
    /// Send overhead: the median time of one post (in bursts of 200),
    /// microseconds.
    pub o_s_us: f64,
    /// Receive overhead: the median time to take one waiting message,
    /// microseconds.
    pub o_r_us: f64,
    /// Gap: time per message when streaming as fast as possible,
    /// microseconds.
    pub g_us: f64,
    /// Latency: RTT / 2 - o_s - o_r, microseconds.
    pub l_us: f64,
    /// Median round trip, microseconds.
    pub rtt_us: f64,
}

/// Measures LogP between nodes 0 and 1, without a fabric and with an
/// ideal one.
pub fn logp(
    iters: usize,
    span: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<LogPResult>> {
    // Fits the send ring (256) and the receive ring (512) of `endpoint`.
    const BURST: u32 = 200;
    let mut out = Vec::new();
    for (case, fabric) in [
        ("no fabric", None),
        ("ideal fabric", Some(chain(1, LinkParams::default()))),
    ] {
        say(&format!("logp: {case}"));
        let run = InProcess::start_with(2, fabric, 4)?;
        let rtt = pingpong(&run, iters)?.rtt_at(0.5);
        let a = Nic::attach(&run.sockets[0])?;
        let b = Nic::attach(&run.sockets[1])?;
        let mut tx = endpoint(&a)?;
        let mut rx = endpoint(&b)?;
        let to = Address {
            node: 1,
            port: PORT,
        };
        // o_s and o_r: bursts of BURST, timed call by call.
        let (mut posts, mut takes) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            for m in 0..BURST {
                let t = Instant::now();
                tx.post_send_inline(to, 0, &m.to_le_bytes(), 0)?;
                posts.push(t.elapsed());
            }
            // Wait until the whole burst is in the receive ring.
            let deadline = Instant::now() + Duration::from_secs(10);
            while rx.recv_ready() < BURST {
                anyhow::ensure!(Instant::now() < deadline, "a burst did not arrive");
                std::thread::yield_now();
            }
            for _ in 0..BURST {
                let t = Instant::now();
                rx.poll_recv().context("a message vanished")?;
                takes.push(t.elapsed());
            }
        }
        posts.sort();
        takes.sort();
        // g: a stream of 8-byte messages, the receiver taking them as they come.
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let receiver = std::thread::spawn(move || -> u64 {
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                if rx.poll_recv().is_some() {
                    n += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            n
        });
        let t0 = Instant::now();
        let mut m = 0u64;
        while t0.elapsed() < span {
            match tx.post_send_inline(to, 0, &m.to_le_bytes(), 0) {
                Ok(()) => m += 1,
                Err(ulnic::Error::WouldBlock) => std::thread::yield_now(),
                Err(e) => return Err(e.into()),
            }
            // Without a fabric a message the receiver had no room for
            // comes back as an event at once: take those (g counts only
            // what was delivered).
            while tx.poll_event().is_some() {}
        }
        let secs = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let got = receiver
            .join()
            .map_err(|_| anyhow::anyhow!("the receiver panicked"))?;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (o_s, o_r) = (us(posts[posts.len() / 2]), us(takes[takes.len() / 2]));
        out.push(LogPResult {
            bench: "logp",
            case: case.to_string(),
            o_s_us: o_s,
            o_r_us: o_r,
            g_us: secs * 1e6 / got.max(1) as f64,
            l_us: us(rtt) / 2.0 - o_s - o_r,
            rtt_us: us(rtt),
        });
    }
    Ok(out)
}

/// One permutation's aggregate bandwidth (VN Table 1).
#[derive(Debug, Clone, Serialize)]
pub struct PermutationResult {
    /// "permutation".
    pub bench: &'static str,
    /// "neighbour" or "bisection".
    pub pattern: String,
    /// Sender and receiver of every stream.
    pub pairs: Vec<(u32, u32)>,
    /// Payload MB/s (10^6) delivered by all streams together.
    pub aggregate_mbytes_per_s: f64,
    /// The same per stream.
    pub per_stream_mbytes_per_s: Vec<f64>,
    /// Seconds measured.
    pub seconds: f64,
}

/// VN Table 1: 8 nodes, four on each of two switches joined by one trunk,
/// every link 1 Gb/s and 2 us. Four 64 KiB streams at once: between
/// neighbours on the same switch, then across the bisection (the trunk).
/// All senders are driven by one thread and all receivers by another, so
/// the programs are not what limits.
pub fn permutations(
    span: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<PermutationResult>> {
    let params = LinkParams {
        latency: Duration::from_micros(2),
        bandwidth_bps: Some(1_000_000_000),
        mtu: 8192,
        ..LinkParams::default()
    };
    let link = |a, b| Link { a, b, params };
    let mut links = vec![link(End::Switch(0), End::Switch(1))];
    for n in 0..8u32 {
        links.push(link(End::Node(n), End::Switch((n / 4) as usize)));
    }
    let fabric = FabricConfig {
        topology: Topology::new(8, vec!["left".into(), "right".into()], links)
            .expect("two switches of four nodes are a valid topology"),
        seed: 0,
        transport: TransportConfig::default(),
        span: None,
        mapping: None,
    };
    let mut out = Vec::new();
    for (pattern, pairs) in [
        ("neighbour", vec![(0u32, 1u32), (2, 3), (4, 5), (6, 7)]),
        ("bisection", vec![(0, 4), (1, 5), (2, 6), (3, 7)]),
    ] {
        say(&format!("permutation: {pattern}"));
        let run = InProcess::start(fabric.clone(), 2)?;
        let nics: Vec<Nic> = run
            .sockets
            .iter()
            .map(|s| Nic::attach(s))
            .collect::<Result<_, _>>()?;
        let mut senders = Vec::new();
        let mut receivers = Vec::new();
        for &(s, r) in &pairs {
            senders.push(endpoint(&nics[s as usize])?);
            let mut rx = endpoint(&nics[r as usize])?;
            // More buffers than a channel's window: the receiver never
            // runs dry, so no NACK makes the sender go back.
            for i in 0..256u64 {
                rx.post_free(i * u64::from(STREAM_MSG), STREAM_MSG, i)?;
            }
            receivers.push(rx);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let warm = span / 5;
        let receiving = std::thread::spawn(move || -> anyhow::Result<Vec<u64>> {
            let start = Instant::now();
            let mut got = vec![0u64; receivers.len()];
            while !stop2.load(Ordering::Relaxed) {
                let mut any = false;
                for (i, rx) in receivers.iter_mut().enumerate() {
                    while let Some(m) = rx.poll_recv() {
                        any = true;
                        let Payload::Buffer { offset, id } = m.payload else {
                            anyhow::bail!("a 64 KiB message came inline");
                        };
                        if start.elapsed() >= warm {
                            got[i] += u64::from(m.len);
                        }
                        rx.post_free(offset, STREAM_MSG, id)?;
                    }
                }
                if !any {
                    std::thread::yield_now();
                }
            }
            Ok(got)
        });
        let start = Instant::now();
        let mut seq = 0u64;
        while start.elapsed() < span + warm {
            let mut any = false;
            for (i, tx) in senders.iter_mut().enumerate() {
                let to = Address {
                    node: pairs[i].1,
                    port: PORT,
                };
                match tx.post_send(
                    to,
                    0,
                    (seq % 64) * u64::from(STREAM_MSG),
                    STREAM_MSG,
                    seq,
                    false,
                ) {
                    Ok(()) => {
                        any = true;
                        seq += 1;
                    }
                    Err(ulnic::Error::WouldBlock) => {}
                    Err(e) => return Err(e.into()),
                }
                while tx.poll_event().is_some() {}
            }
            if !any {
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let got = receiving
            .join()
            .map_err(|_| anyhow::anyhow!("the receiving thread panicked"))??;
        let secs = (start.elapsed() - warm).as_secs_f64();
        let per: Vec<f64> = got.iter().map(|&b| b as f64 / secs / 1e6).collect();
        out.push(PermutationResult {
            bench: "permutation",
            pattern: pattern.to_string(),
            pairs,
            aggregate_mbytes_per_s: per.iter().sum(),
            per_stream_mbytes_per_s: per,
            seconds: secs,
        });
    }
    Ok(out)
}
