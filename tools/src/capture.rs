//! `ulnic capture`: the packets of a link or a node's link, from a running
//! device's control socket, into a pcap file that Wireshark opens with the
//! dissector in `tools/wireshark/ulnic.lua` (link type USER0, 147: each
//! record is one ulnic packet, its 64-byte header, source route and payload).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use base64::Engine as _;

use crate::control::{CapturedLine, Client, Request};

/// pcap's link type for private use; the dissector registers on it.
pub const LINKTYPE_USER0: u32 = 147;
/// Bytes of each packet kept: the header and up to 64 KiB of payload.
pub const SNAPLEN: u32 = 65536 + ulnic_abi::packet::HEADER_SIZE as u32;

/// A pcap file (nanosecond timestamps) being written.
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header.
    pub fn new(mut out: W) -> std::io::Result<Self> {
        out.write_all(&0xa1b2_3c4du32.to_le_bytes())?; // nanosecond pcap
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&0i32.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        out.write_all(&SNAPLEN.to_le_bytes())?;
        out.write_all(&LINKTYPE_USER0.to_le_bytes())?;
        Ok(PcapWriter { out })
    }

    /// Writes one packet seen at `at` (since the Unix epoch).
    pub fn packet(&mut self, at: Duration, bytes: &[u8]) -> std::io::Result<()> {
        let kept = bytes.len().min(SNAPLEN as usize);
        self.out.write_all(&(at.as_secs() as u32).to_le_bytes())?;
        self.out.write_all(&at.subsec_nanos().to_le_bytes())?;
        self.out.write_all(&(kept as u32).to_le_bytes())?;
        self.out.write_all(&(bytes.len() as u32).to_le_bytes())?;
        self.out.write_all(&bytes[..kept])
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Set by Ctrl-C: the file is finished, not cut off.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Captures from the device in `dir` into `file` until `count` packets or
/// `span` has passed; returns the packets written.
#[allow(clippy::too_many_arguments)]
pub fn run(
    dir: &Path,
    member: Option<&str>,
    link: Option<usize>,
    node: Option<u32>,
    file: &Path,
    count: Option<u64>,
    span: Option<Duration>,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<u64> {
    let mut c = Client::connect(dir, member)?;
    c.send(&Request::Capture { link, node })?;
    c.checked_line()?;
    let f =
        std::fs::File::create(file).with_context(|| format!("cannot create {}", file.display()))?;
    let mut pcap = PcapWriter::new(std::io::BufWriter::new(f))?;
    let wall0 = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let start = Instant::now();
    let mut first_at: Option<u64> = None;
    let mut n = 0u64;
    let b64 = base64::engine::general_purpose::STANDARD;
    say(&format!("capturing to {} (Ctrl-C stops)", file.display()));
    STOP.store(false, Ordering::Relaxed);
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; it replaces SIGINT's default for this process,
    // which is about to end anyway when the capture does.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as *const () as libc::sighandler_t,
        )
    };
    while count.is_none_or(|c| n < c)
        && span.is_none_or(|s| start.elapsed() < s)
        && !STOP.load(Ordering::Relaxed)
    {
        let l = match c.raw_line() {
            Ok(l) if l.trim().is_empty() => continue, // heartbeat
            Ok(l) => l,
            Err(_) if STOP.load(Ordering::Relaxed) => break,
            Err(e) => return Err(e),
        };
        let p: CapturedLine = serde_json::from_str(&l).context("a capture line")?;
        let bytes = b64.decode(&p.packet).context("a captured packet")?;
        let t0 = *first_at.get_or_insert(p.at_ns);
        pcap.packet(
            wall0 + Duration::from_nanos(p.at_ns.saturating_sub(t0)),
            &bytes,
        )?;
        n += 1;
    }
    pcap.finish()?;
    Ok(n)
}
