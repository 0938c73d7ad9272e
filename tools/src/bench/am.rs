//! `ulnic fabric bench am-*`: Virtual Networks' Active Message
//! experiments (docs/am.md §6) with `ulnic::am` on a device started in
//! this process, host-attached nodes on one switch.
//!
//! - `am-logp` (VN Fig. 5): LogP of a 4-word request and its reply,
//!   without a fabric and with an ideal one (the transport: VN Fig. 5's
//!   "+ reliability" step is the difference).
//! - `am-hotspot` (VN Fig. 7), `am-bulk` (Fig. 8), `am-rtt` (Fig. 9): N
//!   clients (nodes 1..=N, 4 credits each) load one server endpoint on
//!   node 0 with 4-word requests (Fig. 8: 1 KB transfers into its region)
//!   that it answers with a 4-word reply; the clients are driven
//!   round-robin by one thread and the server by another (as
//!   `fabric bench hotspot`), so an unequal share is the NIC's doing.
//!   Each reply echoes its request's send time, so every client's round
//!   trip is measured under the load (Fig. 9).
//!
//! Payloads: the 4 words are written and read by the handlers; a
//! transfer's 1 KB is copied into the server's region by the layer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use ulnic::am::{AmConfig, AmEndpoint};
use ulnic::{Address, EndpointConfig, Nic};
use ulnic_device::fabric::network::FabricConfig;
use ulnic_device::fabric::topology::Topology;
use ulnic_device::fabric::transport::TransportConfig;

use crate::bench::fabric::spread;
use crate::fabric::InProcess;

/// The port every AM endpoint binds.
const PORT: u32 = 1;
/// The server's request handler and the clients' reply handler.
const ECHO: u8 = 1;
/// Fig. 8's transfer size.
const BULK: usize = 1024;
/// Credits per client (VN's k_user).
const CREDITS: u8 = 4;

/// VN Fig. 5: LogP of AM request/reply.
#[derive(Debug, Clone, Serialize)]
pub struct AmLogPResult {
    /// "am-logp".
    pub bench: &'static str,
    /// "VN Fig. 5".
    pub figure: &'static str,
    /// "no fabric" or "ideal fabric".
    pub case: String,
    /// Send overhead: median time of one `try_request4`, microseconds.
    pub o_s_us: f64,
    /// Receive overhead: median time of a `poll` that runs one reply
    /// handler, microseconds.
    pub o_r_us: f64,
    /// Gap: time per request-reply when one endpoint keeps its 4 credits
    /// busy, microseconds.
    pub g_us: f64,
    /// Latency: RTT / 2 - o_s - o_r, microseconds.
    pub l_us: f64,
    /// Median request-reply round trip, microseconds.
    pub rtt_us: f64,
    /// Its 95th percentile, microseconds.
    pub rtt_p95_us: f64,
}

/// VN Figs. 7-9: one N of the hot spot.
#[derive(Debug, Clone, Serialize)]
pub struct AmHotspotResult {
    /// "am-hotspot", "am-bulk" or "am-rtt".
    pub bench: &'static str,
    /// "VN Fig. 7", "VN Fig. 8" or "VN Fig. 9".
    pub figure: &'static str,
    /// Clients loading the server.
    pub clients: u32,
    /// Requests the server answered per second, all clients together.
    pub aggregate_per_s: f64,
    /// Transfer payload into the server per second, MB/s (10^6); 0 for
    /// 4-word requests.
    pub aggregate_mbytes_per_s: f64,
    /// Each client's completed requests per second.
    pub per_client_per_s: Vec<f64>,
    /// Smallest client rate times N over the aggregate (1 is fair).
    pub min_share_x_n: f64,
    /// Largest client rate times N over the aggregate.
    pub max_share_x_n: f64,
    /// Jain's fairness index of the client rates.
    pub jain: f64,
    /// Median round trip a client saw, microseconds.
    pub rtt_median_us: f64,
    /// Its 95th percentile, microseconds.
    pub rtt_p95_us: f64,
    /// Seconds measured.
    pub seconds: f64,
}

/// Which hot-spot figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotspotFigure {
    /// Fig. 7: 4-word requests, rates.
    Rate,
    /// Fig. 8: 1 KB transfers, bandwidth.
    Bulk,
    /// Fig. 9: 4-word requests, round trips.
    Rtt,
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// An AM endpoint on `nic`.
fn am_endpoint(nic: &Nic, ep: EndpointConfig, cfg: AmConfig) -> anyhow::Result<AmEndpoint> {
    let mut e = nic.alloc_pd()?.create_endpoint(&ep)?;
    e.bind(PORT)?;
    Ok(AmEndpoint::new(e, cfg)?)
}

/// The server on `nic`, answering every request with its words, until
/// `stop`; polled by its own thread.
fn serve(nic: &Nic, stop: Arc<AtomicBool>) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let ep = EndpointConfig {
        send_entries: 1024,
        recv_entries: 4096,
        free_entries: 512,
        segment_bytes: 1 << 20,
    };
    let cfg = AmConfig {
        credits: 1,
        bulk_max: BULK as u32,
        bulk_buffers: 512,
        region_bytes: 64 * BULK,
    };
    let mut server = am_endpoint(nic, ep, cfg)?;
    server.set_request_handler(ECHO, |t, m| {
        let _ = t.reply4(ECHO, m.words);
    });
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match server.poll() {
                Ok(0) => std::thread::yield_now(),
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }))
}

/// A client: 4 credits, its reply handler recording round trips
/// (microseconds) from the echoed send time (ns since `epoch`).
fn client(nic: &Nic, epoch: Instant, rtts: Arc<Mutex<Vec<f64>>>) -> anyhow::Result<AmEndpoint> {
    let ep = EndpointConfig {
        send_entries: 64,
        recv_entries: 64,
        free_entries: 16,
        segment_bytes: 1 << 16,
    };
    let cfg = AmConfig {
        credits: CREDITS,
        bulk_max: BULK as u32,
        bulk_buffers: 1,
        region_bytes: 4096,
    };
    let mut c = am_endpoint(nic, ep, cfg)?;
    c.set_reply_handler(ECHO, move |m| {
        let now = epoch.elapsed().as_nanos() as u64;
        if let Ok(mut v) = rtts.lock() {
            v.push(now.saturating_sub(m.words[0]) as f64 / 1e3);
        }
    });
    Ok(c)
}

fn fabric_of(nodes: u32) -> FabricConfig {
    FabricConfig {
        topology: Topology::single_switch(nodes),
        seed: 0,
        transport: TransportConfig::default(),
        span: None,
        mapping: None,
    }
}

/// VN Fig. 5 between nodes 0 (client) and 1 (server), without a fabric
/// and with an ideal one, in `rounds` interleaved rounds: each figure is
/// the median of the rounds' (the RTT's p95 too).
pub fn logp(
    rounds: u32,
    iters: usize,
    span: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<AmLogPResult>> {
    let cases = [("no fabric", None), ("ideal fabric", Some(fabric_of(2)))];
    let mut all: Vec<Vec<AmLogPResult>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds.max(1) {
        for (i, (case, fabric)) in cases.iter().enumerate() {
            say(&format!("am-logp (VN Fig. 5): round {}, {case}", round + 1));
            all[i].push(logp_once(case, fabric.clone(), iters, span)?);
        }
    }
    Ok(all
        .into_iter()
        .map(|rs| {
            let med = |f: fn(&AmLogPResult) -> f64| {
                quantile(&mut rs.iter().map(f).collect::<Vec<_>>(), 0.5)
            };
            AmLogPResult {
                bench: "am-logp",
                figure: "VN Fig. 5",
                case: rs[0].case.clone(),
                o_s_us: med(|r| r.o_s_us),
                o_r_us: med(|r| r.o_r_us),
                g_us: med(|r| r.g_us),
                l_us: med(|r| r.l_us),
                rtt_us: med(|r| r.rtt_us),
                rtt_p95_us: med(|r| r.rtt_p95_us),
            }
        })
        .collect())
}

/// One round of one case.
fn logp_once(
    case: &str,
    fabric: Option<FabricConfig>,
    iters: usize,
    span: Duration,
) -> anyhow::Result<AmLogPResult> {
    let run = InProcess::start_with(2, fabric, 4)?;
    let a = Nic::attach(&run.sockets[0])?;
    let b = Nic::attach(&run.sockets[1])?;
    let stop = Arc::new(AtomicBool::new(false));
    let server = serve(&b, stop.clone())?;
    let epoch = Instant::now();
    let rtts = Arc::new(Mutex::new(Vec::new()));
    let mut c = client(&a, epoch, rtts.clone())?;
    let to = Address {
        node: 1,
        port: PORT,
    };
    let now = || epoch.elapsed().as_nanos() as u64;
    let settle = |c: &mut AmEndpoint| -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.credits() < u32::from(CREDITS) {
            anyhow::ensure!(Instant::now() < deadline, "replies did not come");
            if c.poll()? == 0 {
                std::thread::yield_now();
            }
        }
        Ok(())
    };
    // RTT: one request at a time.
    for _ in 0..iters {
        c.request4(to, ECHO, [now(), 0, 0, 0])?;
        settle(&mut c)?;
    }
    let mut rtt: Vec<f64> = std::mem::take(&mut *lock(&rtts));
    // o_s: bursts of 4, each call timed; o_r: a poll that runs one
    // reply handler, timed once the reply is waiting.
    let (mut posts, mut polls) = (Vec::new(), Vec::new());
    for _ in 0..iters.div_ceil(4) {
        for _ in 0..CREDITS {
            let t = Instant::now();
            c.try_request4(to, ECHO, [now(), 0, 0, 0])?;
            posts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        settle(&mut c)?;
        c.try_request4(to, ECHO, [now(), 0, 0, 0])?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.endpoint().recv_ready() == 0 {
            anyhow::ensure!(Instant::now() < deadline, "a reply did not come");
            std::thread::yield_now();
        }
        let t = Instant::now();
        c.poll()?;
        polls.push(t.elapsed().as_secs_f64() * 1e6);
        settle(&mut c)?;
    }
    // g: the credits kept busy for `span`.
    let before = c.stats().replies_handled;
    let t0 = Instant::now();
    while t0.elapsed() < span {
        match c.try_request4(to, ECHO, [now(), 0, 0, 0]) {
            Ok(()) => {}
            Err(ulnic::Error::WouldBlock) => {
                c.poll()?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let done = c.stats().replies_handled - before;
    settle(&mut c)?;
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    let (o_s, o_r) = (quantile(&mut posts, 0.5), quantile(&mut polls, 0.5));
    let (rtt_us, rtt_p95_us) = (quantile(&mut rtt, 0.5), quantile(&mut rtt, 0.95));
    Ok(AmLogPResult {
        bench: "am-logp",
        figure: "VN Fig. 5",
        case: case.to_string(),
        o_s_us: o_s,
        o_r_us: o_r,
        g_us: secs * 1e6 / done.max(1) as f64,
        l_us: rtt_us / 2.0 - o_s - o_r,
        rtt_us,
        rtt_p95_us,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// VN Figs. 7, 8 and 9: for each N in `clients`, N clients load the
/// server for `span` (after a fifth of it to warm up).
pub fn hotspot(
    figure: HotspotFigure,
    clients: &[u32],
    span: Duration,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<AmHotspotResult>> {
    let most = clients.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(
        (1..=128).contains(&most) && !clients.contains(&0),
        "--clients must be 1 to 128 (the server's 512 receive buffers hold 4 requests of each)"
    );
    let run = InProcess::start(fabric_of(most + 1), 2)?;
    let nics: Vec<Nic> = run
        .sockets
        .iter()
        .map(|s| Nic::attach(s))
        .collect::<Result<_, _>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let server = serve(&nics[0], stop.clone())?;
    let epoch = Instant::now();
    let mut out = Vec::new();
    for &n in clients {
        say(&format!("am hot spot: {n} client(s)"));
        let rtts: Vec<Arc<Mutex<Vec<f64>>>> =
            (0..n).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
        let mut eps = Vec::new();
        for (i, r) in rtts.iter().enumerate() {
            eps.push(client(&nics[i + 1], epoch, r.clone())?);
        }
        let warm = span / 5;
        let driver = std::thread::spawn(move || drive(figure, eps, epoch, warm, span));
        let (counts, seconds) = driver
            .join()
            .map_err(|_| anyhow::anyhow!("the client thread panicked"))??;
        let mut rtt: Vec<f64> = rtts.iter().flat_map(|r| lock(r).clone()).collect();
        out.push(summarise(figure, n, &counts, seconds, &mut rtt));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    Ok(out)
}

/// Drives the clients round-robin: warms up, clears their round trips,
/// then counts each one's replies for `span`; every client's credits
/// come back before it returns. Its replies per client and the seconds.
fn drive(
    figure: HotspotFigure,
    mut eps: Vec<AmEndpoint>,
    epoch: Instant,
    warm: Duration,
    span: Duration,
) -> anyhow::Result<(Vec<u64>, f64)> {
    let to = Address {
        node: 0,
        port: PORT,
    };
    let data = [0x5au8; BULK];
    let start = Instant::now();
    let mut from: Option<(Instant, Vec<u64>)> = None;
    let mut i = 0u64;
    while start.elapsed() < warm + span {
        if from.is_none() && start.elapsed() >= warm {
            from = Some((
                Instant::now(),
                eps.iter().map(|e| e.stats().replies_handled).collect(),
            ));
        }
        let mut moved = 0;
        for (c, e) in eps.iter_mut().enumerate() {
            let words = [epoch.elapsed().as_nanos() as u64, c as u64, 0, 0];
            let sent = match figure {
                HotspotFigure::Bulk => {
                    let at = ((c as u64 + i) % 64) * BULK as u64;
                    e.try_xfer(to, at, ECHO, &data, words)
                }
                _ => e.try_request4(to, ECHO, words),
            };
            match sent {
                Ok(()) => moved += 1,
                Err(ulnic::Error::WouldBlock) => {}
                Err(err) => return Err(err.into()),
            }
            moved += e.poll()?;
        }
        i += 1;
        if moved == 0 {
            std::thread::yield_now();
        }
    }
    let (t0, base) = from.unwrap_or_else(|| (Instant::now(), vec![0; eps.len()]));
    let seconds = t0.elapsed().as_secs_f64();
    let counts = eps
        .iter()
        .zip(&base)
        .map(|(e, b)| e.stats().replies_handled - b)
        .collect();
    // Let every request in flight be answered before the next N.
    let deadline = Instant::now() + Duration::from_secs(10);
    for e in eps.iter_mut() {
        while e.credits() < u32::from(CREDITS) && Instant::now() < deadline {
            if e.poll()? == 0 {
                std::thread::yield_now();
            }
        }
    }
    Ok((counts, seconds))
}

fn summarise(
    figure: HotspotFigure,
    n: u32,
    counts: &[u64],
    seconds: f64,
    rtt: &mut [f64],
) -> AmHotspotResult {
    let secs = seconds.max(1e-9);
    let rates: Vec<f64> = counts.iter().map(|&c| c as f64 / secs).collect();
    let total: f64 = rates.iter().sum();
    let (min_share_x_n, max_share_x_n, jain) = spread(&rates);
    let (bench, label) = match figure {
        HotspotFigure::Rate => ("am-hotspot", "VN Fig. 7"),
        HotspotFigure::Bulk => ("am-bulk", "VN Fig. 8"),
        HotspotFigure::Rtt => ("am-rtt", "VN Fig. 9"),
    };
    AmHotspotResult {
        bench,
        figure: label,
        clients: n,
        aggregate_per_s: total,
        aggregate_mbytes_per_s: if figure == HotspotFigure::Bulk {
            total * BULK as f64 / 1e6
        } else {
            0.0
        },
        min_share_x_n,
        max_share_x_n,
        jain,
        per_client_per_s: rates,
        rtt_median_us: quantile(rtt, 0.5),
        rtt_p95_us: quantile(rtt, 0.95),
        seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_summaries() {
        assert_eq!(quantile(&mut [], 0.5), 0.0);
        assert_eq!(quantile(&mut [3.0, 1.0, 2.0], 0.5), 2.0);
        let r = summarise(HotspotFigure::Bulk, 2, &[100, 300], 2.0, &mut [5.0]);
        assert_eq!(r.per_client_per_s, [50.0, 150.0]);
        assert_eq!(r.aggregate_per_s, 200.0);
        assert!((r.aggregate_mbytes_per_s - 200.0 * 1024.0 / 1e6).abs() < 1e-12);
        assert_eq!((r.min_share_x_n, r.max_share_x_n), (0.5, 1.5));
        assert!((r.jain - 0.8).abs() < 1e-12);
        assert_eq!((r.bench, r.figure), ("am-bulk", "VN Fig. 8"));
    }
}
