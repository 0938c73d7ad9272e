//! `ulnic driver-check`: the Linux driver (spec §9) in two situations a
//! program cannot bring about alone; whoever runs the check brings them
//! about from the host while it waits (`ulnic cluster stall-control`,
//! `ulnic cluster restart-device`).
//!
//! - `stalled-device`: the device stops answering commands. A command in
//!   flight times out (ETIMEDOUT) without holding up `IOC_KICK` or the
//!   data path behind it, and every later command fails with EIO (the
//!   device may still answer the old one late).
//! - `device-removal`: the device goes away under a mapped doorbell page.
//!   Calls fail with ENODEV, and stores to the old doorbell land in a
//!   scratch page (they read back, which no device register would): no
//!   fault, nothing reaches whatever takes the BAR's place.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ulnic::{Address, Endpoint, EndpointConfig, Nic, Payload};
use ulnic_abi::uapi;

use crate::driver_fuzz::{errno_name, kernel_faults};
use crate::raw_driver::{create_small_endpoint, ioctl};

/// Which situation to check.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Check {
    /// Run while the node's control queue is stalled (after `--go` exists).
    StalledDevice,
    /// Run while the node's NIC is removed (or the device restarted).
    DeviceRemoval,
}

/// What a check saw; `failures` empty means it passed.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    /// The check's name.
    pub check: String,
    /// Measured facts, by name.
    pub facts: serde_json::Map<String, serde_json::Value>,
    /// Kernel log lines that show a driver or kernel fault.
    pub kernel_faults: Vec<String>,
    /// What did not hold.
    pub failures: Vec<String>,
}

impl Report {
    fn fact(&mut self, name: &str, value: impl Into<serde_json::Value>) {
        self.facts.insert(name.into(), value.into());
    }

    /// The human form: one fact per line, then the verdict.
    pub fn table(&self) -> String {
        let mut s = format!("driver-check {}\n", self.check);
        for (k, v) in &self.facts {
            s += &format!("  {k:<34} {v}\n");
        }
        for f in &self.kernel_faults {
            s += &format!("  kernel fault: {f}\n");
        }
        for f in &self.failures {
            s += &format!("  FAILED: {f}\n");
        }
        if self.failures.is_empty() && self.kernel_faults.is_empty() {
            s += "  ok\n";
        }
        s
    }
}

/// Where the check signals and waits.
pub struct Handshake<'a> {
    /// Created once the check is set up.
    pub ready: &'a Path,
    /// Waited for before the stalled-device check goes on.
    pub go: &'a Path,
    /// How long to wait for the situation.
    pub timeout: Duration,
}

/// Runs `check` against the driver's device file `device`.
pub fn run(check: Check, device: &Path, hs: &Handshake<'_>) -> anyhow::Result<Report> {
    // Files left by an earlier run would start the situation too early.
    for stale in [hs.ready, hs.go] {
        match std::fs::remove_file(stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(anyhow::anyhow!("{}: {e}", stale.display()))
            }
            _ => {}
        }
    }
    let mut report = match check {
        Check::StalledDevice => stalled_device(device, hs)?,
        Check::DeviceRemoval => device_removal(device, hs)?,
    };
    report.kernel_faults = kernel_faults();
    Ok(report)
}

fn outcome(r: &Result<i32, std::io::Error>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => errno_name(e),
    }
}

fn open_raw(device: &Path) -> anyhow::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open(device)
        .map_err(|e| anyhow::anyhow!("{}: {e}", device.display()))
}

/// Two endpoints of one domain bound to two free ports: (a, b, b's address).
fn pair(nic: &Nic) -> anyhow::Result<(ulnic::ProtectionDomain, Endpoint, Endpoint, Address)> {
    let pd = nic.alloc_pd()?;
    let mut a = pd.create_endpoint(&EndpointConfig::default())?;
    let mut b = pd.create_endpoint(&EndpointConfig::default())?;
    // Ports that are free on this node, from a range tools leave alone.
    let mut port = 60_000 + std::process::id() % 1000 * 4;
    a.bind(port)?;
    port += 1;
    b.bind(port)?;
    let to = Address {
        node: nic.node(),
        port,
    };
    Ok((pd, a, b, to))
}

/// One inline message from `a` to `b`, checked; false if it did not come
/// back within 5 s.
fn exchange(a: &mut Endpoint, b: &mut Endpoint, to: Address, seq: u64) -> bool {
    if a.post_send_inline(to, 1, &seq.to_le_bytes(), seq).is_err() {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        while a.poll_event().is_some() {}
        if let Some(m) = b.poll_recv() {
            return matches!(m.payload, Payload::Inline(d) if d[..8] == seq.to_le_bytes());
        }
        std::thread::yield_now();
    }
    false
}

fn wait_for(path: &Path, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        if Instant::now() >= deadline {
            return Err(anyhow::anyhow!(
                "{} did not appear within {} s",
                path.display(),
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn signal_ready(path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, b"ready\n").map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn stalled_device(device: &Path, hs: &Handshake<'_>) -> anyhow::Result<Report> {
    let mut report = Report {
        check: "stalled-device".into(),
        ..Default::default()
    };
    let raw = open_raw(device)?;
    let (kicked, _) =
        create_small_endpoint(&raw).map_err(|e| anyhow::anyhow!("IOC_CREATE_EP: {e}"))?;
    let nic = Nic::open_device(device)?;
    let (_pd, mut a, mut b, to) = pair(&nic)?;
    if !exchange(&mut a, &mut b, to, 0) {
        return Err(anyhow::anyhow!("no message crossed before the stall"));
    }
    signal_ready(hs.ready)?;
    wait_for(hs.go, hs.timeout)?;

    // A command that the stalled device will never answer...
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let (command, command_secs) = std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let r = create_small_endpoint(&raw);
            done.store(true, Ordering::Release);
            (r, start.elapsed())
        });
        // ...must not hold up doorbells or data. Counted once the command
        // surely holds the driver's command lock (a second in).
        let (mut kicks, mut messages, mut seq) = (0u64, 0u64, 1u64);
        while !done.load(Ordering::Acquire) {
            let mut id = kicked.to_le_bytes();
            let kick = ioctl(&raw, uapi::IOC_KICK, &mut id);
            let crossed = exchange(&mut a, &mut b, to, seq);
            seq += 1;
            if start.elapsed() > Duration::from_secs(1) && !done.load(Ordering::Acquire) {
                kicks += u64::from(kick.is_ok());
                messages += u64::from(crossed);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        report.fact("kicks_while_command_waited", kicks);
        report.fact("messages_while_command_waited", messages);
        let (r, secs) = waiting.join().unwrap_or_else(|_| {
            (
                Err(std::io::Error::other("the command thread panicked")),
                Duration::ZERO,
            )
        });
        (outcome(&r.map(|_| 0)), secs)
    });
    report.fact("stalled_command", command.clone());
    report.fact("stalled_command_seconds", command_secs.as_secs_f64());
    let mut info = [0u8; ulnic_abi::DeviceInfo::SIZE];
    let later = outcome(&ioctl(&raw, uapi::IOC_INFO, &mut info));
    report.fact("later_command", later.clone());
    let after = (0..20)
        .filter(|i| exchange(&mut a, &mut b, to, 1_000_000 + i))
        .count();
    report.fact("messages_after_timeout", after as u64);

    let f = &mut report.failures;
    if command != "ETIMEDOUT" {
        f.push(format!(
            "the stalled command ended with {command}, not ETIMEDOUT"
        ));
    }
    if report.facts["kicks_while_command_waited"] == 0 {
        f.push("IOC_KICK waited behind the stalled command".into());
    }
    if report.facts["messages_while_command_waited"] == 0 {
        f.push("no message crossed while the command waited".into());
    }
    if later != "EIO" {
        f.push(format!("a command after the timeout gave {later}, not EIO"));
    }
    if after != 20 {
        f.push(format!(
            "only {after} of 20 messages crossed after the timeout"
        ));
    }
    Ok(report)
}

fn device_removal(device: &Path, hs: &Handshake<'_>) -> anyhow::Result<Report> {
    let mut report = Report {
        check: "device-removal".into(),
        ..Default::default()
    };
    let raw = open_raw(device)?;
    let (_, queue) =
        create_small_endpoint(&raw).map_err(|e| anyhow::anyhow!("IOC_CREATE_EP: {e}"))?;
    let page = ulnic_abi::PAGE_SIZE as usize;
    let doorbell = ulnic_host_attach::map_shared(raw.as_raw_fd(), page, uapi::MMAP_DOORBELL)
        .map_err(|e| {
            anyhow::anyhow!("the doorbell page cannot be mapped (needs page-per-vq): {e}")
        })?
        .cast::<u16>();
    // SAFETY: `doorbell` is our live mapping of one page; the driver gives
    // a doorbell page only to the file it belongs to, which is ours.
    let ring = |v: u16| unsafe { std::ptr::write_volatile(doorbell, v.to_le()) };
    signal_ready(hs.ready)?;
    // Ring while the device is there; the first call to fail says it left.
    let deadline = Instant::now() + hs.timeout;
    let gone = loop {
        ring(queue);
        let mut info = [0u8; ulnic_abi::DeviceInfo::SIZE];
        if let Err(e) = ioctl(&raw, uapi::IOC_INFO, &mut info) {
            break e;
        }
        if Instant::now() >= deadline {
            return Err(anyhow::anyhow!(
                "the device was not removed within {} s",
                hs.timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    report.fact("errno_after_removal", errno_name(&gone));
    // Stores to the old doorbell: each must land harmlessly. remove()
    // revokes the mapping just after calls start failing, and before it
    // returns (so before the BAR can go to anyone else): from then on the
    // page is a scratch page, which (unlike a device register, or nothing)
    // reads back what was stored.
    let stores = 1000u16;
    let revoked_by = Instant::now() + Duration::from_secs(10);
    let last = loop {
        for v in 0..stores {
            ring(v);
        }
        // SAFETY: as for `ring`; reading our own mapping.
        let last = u16::from_le(unsafe { std::ptr::read_volatile(doorbell) });
        if last == stores - 1 || Instant::now() >= revoked_by {
            break last;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    report.fact("doorbell_stores_after_removal", stores);
    report.fact("doorbell_reads_back_last_store", last == stores - 1);
    // SAFETY: unmapping the page mapped above; nothing uses it after.
    unsafe { libc::munmap(doorbell.cast(), page) };
    if gone.raw_os_error() != Some(libc::ENODEV) {
        report.failures.push(format!(
            "calls after removal fail with {}, not ENODEV",
            errno_name(&gone)
        ));
    }
    if last != stores - 1 {
        report.failures.push(format!(
            "the old doorbell page read back {last:#x} after removal, not the last store: it was not replaced by a scratch page"
        ));
    }
    Ok(report)
}
