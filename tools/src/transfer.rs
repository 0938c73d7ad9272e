//! `ulnic send` and `ulnic recv`: move a counted stream of checked messages
//! between two endpoints, like `nc` for ulnic. Used by people to try a
//! cluster and by the VM tests to check delivery across guests.
//!
//! The fabric never drops silently: a message the receiver has no room for
//! is returned to the sender (spec §5.9). The sender turns that into a
//! reliable in-order stream with go-back-N: on a return it resends from the
//! returned message; the receiver accepts only the next expected sequence
//! number and discards anything past a gap (it was sent before the return
//! was known). A duplicate or corrupted message is a hard error: the device
//! must never produce one.

use std::time::{Duration, Instant};

use ulnic::{Address, EndpointConfig, Event, Nic, Payload, Received, SendError};
use ulnic_abi::INLINE_MAX;

/// Tag of data messages.
const TAG_DATA: u32 = 0;
/// Tag of the final message; its payload is the message count.
const TAG_FIN: u32 = 1;
/// Most messages in flight (each has its own segment slot).
const WINDOW: u32 = 64;
/// Payload of the receiver's close message.
pub const CLOSE_TEXT: &[u8] = b"ulnic recv: endpoint closed";

/// Options of `ulnic send`.
#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    /// Destination NODE:PORT.
    #[arg(long)]
    pub to: Address,
    /// Port to bind this endpoint to (replies and close messages come here).
    #[arg(long, default_value_t = 6)]
    pub port: u32,
    /// Number of messages.
    #[arg(long, default_value_t = 10000)]
    pub count: u64,
    /// Bytes per message (at least 8: the sequence number leads).
    #[arg(long, default_value_t = 64)]
    pub size: u32,
    /// Succeed when the receiver's close message arrives instead of the
    /// stream finishing (the peer was expected to be killed).
    #[arg(long)]
    pub expect_close: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Create this file once the endpoint is bound (its protection domain
    /// and endpoint exist).
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<std::path::PathBuf>,
    /// Send nothing until this file exists (meanwhile the endpoint is
    /// idle, so the device stops polling it and its first send rings a
    /// doorbell).
    #[arg(long, value_name = "PATH")]
    pub start_file: Option<std::path::PathBuf>,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Options of `ulnic recv`.
#[derive(Debug, Clone, clap::Args)]
pub struct RecvArgs {
    /// Port to bind.
    #[arg(long, default_value_t = 5)]
    pub port: u32,
    /// Largest message expected (sizes the receive buffers).
    #[arg(long, default_value_t = 65536)]
    pub max_size: u32,
    /// Leave a close message for NODE:PORT: the device sends it when this
    /// endpoint goes away, even if this process is killed.
    #[arg(long)]
    pub close_to: Option<Address>,
    /// Give up after this many seconds without a finished stream.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Create this file once the port is bound and buffers are posted:
    /// a sender started after it appears finds the receiver ready.
    #[arg(long)]
    pub ready_file: Option<std::path::PathBuf>,
    /// Create this file once --progress-after messages have arrived in
    /// order: the stream is flowing (a script can then act mid-stream,
    /// e.g. kill this receiver).
    #[arg(long, value_name = "PATH")]
    pub progress_file: Option<std::path::PathBuf>,
    /// How many messages --progress-file waits for.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub progress_after: u64,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// What the sender saw.
#[derive(Debug, serde::Serialize)]
pub struct SendReport {
    /// "finished" or "peer-closed".
    pub outcome: &'static str,
    /// Messages the receiver confirmed (the count in FIN), or those posted
    /// when the peer closed.
    pub messages: u64,
    /// Bytes per message.
    pub size: u32,
    /// Messages returned by the fabric and sent again.
    pub resent: u64,
    /// Seconds taken.
    pub seconds: f64,
    /// The close message's text, when one came.
    pub close_message: Option<String>,
}

/// What the receiver saw.
#[derive(Debug, serde::Serialize)]
pub struct RecvReport {
    /// The sender.
    pub from: String,
    /// Messages accepted, in order, each exactly once.
    pub messages: u64,
    /// Payload bytes accepted.
    pub bytes: u64,
    /// Messages discarded because they came after a gap (go-back-N).
    pub discarded_after_gap: u64,
    /// Seconds from the first message to FIN.
    pub seconds: f64,
}

fn fill(buf: &mut [u8], seq: u64) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf.iter_mut().enumerate().skip(8) {
        *b = (seq as u8).wrapping_add(i as u8);
    }
}

fn check(buf: &[u8], seq: u64) -> bool {
    buf.iter()
        .enumerate()
        .skip(8)
        .all(|(i, &b)| b == (seq as u8).wrapping_add(i as u8))
}

/// The sender's view of the stream: what to send next and how returns
/// move it back.
struct Cursor {
    next: u64,
    epoch: u32,
    resent: u64,
    fin_sent: bool,
    gone_since: Option<Instant>,
    /// Sends allowed in flight: halved on a return, grown by one per
    /// window sent without one (so a slow receiver is not flooded).
    window: u32,
    sent_in_window: u32,
}

/// How often a sender that never blocks asks the device whether it is
/// still there.
const DEVICE_CHECK: Duration = Duration::from_millis(200);

/// Sequence number used in the id of the FIN message.
const FIN_SEQ: u64 = u32::MAX as u64;

impl Cursor {
    /// Handles the events in the ring; a return of the current epoch
    /// rewinds to the returned message.
    fn drain_events(&mut self, ep: &mut ulnic::Endpoint) -> anyhow::Result<()> {
        while let Some(ev) = ep.poll_event() {
            match ev {
                Event::SendFailed {
                    id,
                    reason: SendError::NoBuffer,
                    ..
                } => {
                    let (e, seq) = ((id >> 32) as u32, id & 0xffff_ffff);
                    if seq == FIN_SEQ {
                        self.fin_sent = false; // FIN returned: send it again
                    } else if e == self.epoch {
                        self.epoch += 1;
                        self.resent += self.next - seq;
                        self.next = seq;
                        self.window = (self.window / 2).max(1);
                        self.sent_in_window = 0;
                    }
                }
                Event::SendFailed {
                    reason: SendError::NoEndpoint,
                    ..
                } => {
                    self.gone_since.get_or_insert_with(Instant::now);
                }
                Event::SendFailed { id, reason, .. } => {
                    return Err(anyhow::anyhow!(
                        "message {} failed: {reason}",
                        id & 0xffff_ffff
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn sent_one(&mut self, most: u32) {
        self.next += 1;
        self.sent_in_window += 1;
        if self.sent_in_window >= self.window {
            self.window = (self.window + 1).min(most);
            self.sent_in_window = 0;
        }
    }
}

/// What message `m`, come to the sender, means: the end of the transfer
/// (outcome, messages confirmed, the close message's text), a failure,
/// or nothing yet.
fn answer(
    m: &ulnic::Received,
    a: &SendArgs,
    c: &mut Cursor,
) -> anyhow::Result<Option<(&'static str, u64, Option<String>)>> {
    // One of ours handed back (its src is where it was going): not the
    // receiver speaking. A returned FIN would otherwise read as the
    // receiver's confirmation of every message.
    if m.returned {
        if m.tag == TAG_FIN {
            c.fin_sent = false;
        }
        return Ok(None);
    }
    if m.close && m.src == a.to {
        let text = close_text(m);
        if a.expect_close {
            return Ok(Some(("peer-closed", c.next, Some(text))));
        }
        anyhow::bail!(
            "the receiver {} closed after {} messages were sent: \"{text}\"",
            a.to,
            c.next
        );
    }
    if m.tag == TAG_FIN && m.src == a.to {
        let confirmed = fin_count(m);
        anyhow::ensure!(
            confirmed == a.count,
            "the receiver confirmed {confirmed} messages, {} were sent",
            a.count
        );
        return Ok(Some(("finished", confirmed, None)));
    }
    Ok(None)
}

/// Waits until `path` exists, at most `timeout`.
fn wait_for_file(path: &std::path::Path, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} did not appear within {} s",
            path.display(),
            timeout.as_secs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Runs the sending side.
pub fn send(a: &SendArgs) -> anyhow::Result<SendReport> {
    if a.size < 8 {
        return Err(anyhow::anyhow!(
            "--size must be at least 8 (the sequence number)"
        ));
    }
    if a.count >= FIN_SEQ {
        return Err(anyhow::anyhow!("--count must be below {FIN_SEQ}"));
    }
    let nic = Nic::open().map_err(|e| anyhow::anyhow!("cannot open the NIC: {e}"))?;
    if a.size > nic.max_message() {
        return Err(anyhow::anyhow!(
            "--size is above the device's {}",
            nic.max_message()
        ));
    }
    let pd = nic.alloc_pd()?;
    let slot = (a.size as usize).next_multiple_of(64);
    let cfg = EndpointConfig {
        segment_bytes: (slot * WINDOW as usize).next_multiple_of(4096),
        ..Default::default()
    };
    let window = WINDOW.min(cfg.send_entries);
    let mut ep = pd.create_endpoint(&cfg)?;
    ep.bind(a.port)
        .map_err(|e| anyhow::anyhow!("cannot bind port {}: {e}", a.port))?;
    if let Some(path) = &a.ready_file {
        std::fs::write(path, b"").map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &a.start_file {
        wait_for_file(path, Duration::from_secs(a.timeout))?;
    }
    let inline = a.size <= INLINE_MAX;
    let mut buf = vec![0u8; a.size as usize];
    let start = Instant::now();
    let deadline = start + Duration::from_secs(a.timeout);
    let mut c = Cursor {
        next: 0,
        epoch: 0,
        resent: 0,
        fin_sent: false,
        gone_since: None,
        window,
        sent_in_window: 0,
    };
    let mut posted = 0u64;
    let report = |c: &Cursor, outcome, messages, close: Option<String>| SendReport {
        outcome,
        messages,
        size: a.size,
        resent: c.resent,
        seconds: start.elapsed().as_secs_f64(),
        close_message: close,
    };
    let mut asked_at = Instant::now();
    loop {
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "timed out after {} s with {} of {} messages sent",
                a.timeout,
                c.next,
                a.count
            ));
        }
        if asked_at.elapsed() > DEVICE_CHECK {
            // This loop never blocks, and a device that went away (or
            // forgot this endpoint, spec §2.5) fails no store to the
            // rings or the doorbell: only a call tells.
            asked_at = Instant::now();
            ep.stats()?;
        }
        if let Some(m) = ep.poll_recv() {
            if let Some((outcome, messages, close)) = answer(&m, a, &mut c)? {
                return Ok(report(&c, outcome, messages, close));
            }
        }
        c.drain_events(&mut ep)?;
        if let Some(t) = c.gone_since {
            // Wait a little for a close message before calling it a loss.
            if t.elapsed() > Duration::from_secs(3) {
                return Err(anyhow::anyhow!(
                    "the receiver {} is gone (no endpoint) and sent no close message",
                    a.to
                ));
            }
        }
        let in_flight = cfg.send_entries - ep.send_space();
        if c.next < a.count {
            if in_flight >= c.window {
                std::thread::yield_now(); // the window moves without an event
                continue;
            }
            fill(&mut buf, c.next);
            let id = u64::from(c.epoch) << 32 | c.next;
            let r = if inline {
                ep.post_send_inline(a.to, TAG_DATA, &buf, id)
            } else {
                let off = (posted % u64::from(WINDOW)) * slot as u64;
                ep.write_segment(off as usize, &buf);
                ep.post_send(a.to, TAG_DATA, off, a.size, id, false)
            };
            if r.is_ok() {
                c.sent_one(window);
                posted += 1;
            }
            continue;
        }
        if !c.fin_sent {
            if !ep.sends_done() {
                std::thread::yield_now();
                continue;
            }
            // Every data send is retired, and a return is posted before its
            // send retires: after this drain nothing can rewind the stream.
            c.drain_events(&mut ep)?;
            if c.next < a.count {
                continue;
            }
            let id = u64::from(c.epoch) << 32 | FIN_SEQ;
            if ep
                .post_send_inline(a.to, TAG_FIN, &a.count.to_le_bytes(), id)
                .is_ok()
            {
                c.fin_sent = true;
            }
            continue;
        }
        ep.wait(Duration::from_millis(50))?;
    }
}

fn close_text(m: &Received) -> String {
    match m.payload {
        Payload::Inline(b) => String::from_utf8_lossy(&b[..m.len as usize]).into_owned(),
        Payload::Buffer { .. } => String::new(),
    }
}

fn fin_count(m: &Received) -> u64 {
    match m.payload {
        Payload::Inline(b) if m.len == 8 => u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
        _ => u64::MAX,
    }
}

/// Runs the receiving side until a sender's FIN.
pub fn recv(a: &RecvArgs) -> anyhow::Result<RecvReport> {
    let nic = Nic::open().map_err(|e| anyhow::anyhow!("cannot open the NIC: {e}"))?;
    let pd = nic.alloc_pd()?;
    let buf_len = a.max_size.max(8).next_multiple_of(64);
    let buffers = 64u32;
    let cfg = EndpointConfig {
        segment_bytes: (buf_len as usize * buffers as usize).next_multiple_of(4096),
        ..Default::default()
    };
    let mut ep = pd.create_endpoint(&cfg)?;
    ep.bind(a.port)
        .map_err(|e| anyhow::anyhow!("cannot bind port {}: {e}", a.port))?;
    for i in 0..buffers.min(cfg.free_entries) {
        ep.post_free(u64::from(i * buf_len), buf_len, u64::from(i))?;
    }
    if let Some(to) = a.close_to {
        ep.set_close_message(to, 0, CLOSE_TEXT)?;
    }
    // Announce readiness so scripts can start the sender.
    eprintln!("ulnic recv: listening on port {}", a.port);
    if let Some(path) = &a.ready_file {
        std::fs::write(path, b"").map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    let deadline = Instant::now() + Duration::from_secs(a.timeout);
    let (mut expected, mut bytes, mut discarded) = (0u64, 0u64, 0u64);
    let mut from: Option<Address> = None;
    let mut first: Option<Instant> = None;
    let mut data = vec![0u8; buf_len as usize];
    loop {
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(
                "timed out after {} s with {expected} messages received",
                a.timeout
            ));
        }
        let Some(m) = ep.poll_recv() else {
            while ep.poll_event().is_some() {}
            ep.wait(Duration::from_millis(100))?;
            continue;
        };
        let src = *from.get_or_insert(m.src);
        if m.src != src {
            return Err(anyhow::anyhow!(
                "a second sender {} (first was {src})",
                m.src
            ));
        }
        first.get_or_insert_with(Instant::now);
        let len = m.len as usize;
        let bytes_in: &[u8] = match m.payload {
            Payload::Inline(ref b) => &b[..len.min(b.len())],
            Payload::Buffer { offset, id } => {
                ep.read_segment(offset as usize, &mut data[..len]);
                ep.post_free(offset, buf_len, id)?;
                &data[..len]
            }
        };
        if m.tag == TAG_FIN {
            let count = if len == 8 {
                u64::from_le_bytes(bytes_in.try_into().unwrap_or([0; 8]))
            } else {
                u64::MAX
            };
            if count != expected {
                return Err(anyhow::anyhow!(
                    "the sender says {count} messages, {expected} arrived in order"
                ));
            }
            // Confirm, so the sender knows the whole stream arrived.
            let mut tries = 0;
            loop {
                ep.post_send_inline(src, TAG_FIN, &expected.to_le_bytes(), 0)?;
                while !ep.sends_done() {
                    std::thread::yield_now();
                }
                match ep.poll_event() {
                    Some(Event::SendFailed { reason, .. }) if tries < 100 => {
                        tries += 1;
                        log::debug!("confirmation returned ({reason}); again");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Some(Event::SendFailed { reason, .. }) => {
                        return Err(anyhow::anyhow!("cannot confirm to {src}: {reason}"))
                    }
                    _ => break,
                }
            }
            ep.clear_close_message();
            return Ok(RecvReport {
                from: src.to_string(),
                messages: expected,
                bytes,
                discarded_after_gap: discarded,
                seconds: first.map_or(0.0, |t| t.elapsed().as_secs_f64()),
            });
        }
        if len < 8 {
            return Err(anyhow::anyhow!(
                "message of {len} bytes: too short for a sequence number"
            ));
        }
        let seq = u64::from_le_bytes(bytes_in[..8].try_into().unwrap_or([0; 8]));
        if seq < expected {
            return Err(anyhow::anyhow!(
                "message {seq} arrived twice or out of order (expected {expected})"
            ));
        }
        if seq > expected {
            discarded += 1; // sent before the sender saw a return; it resends
            continue;
        }
        if !check(bytes_in, seq) {
            return Err(anyhow::anyhow!("message {seq}: payload corrupted"));
        }
        expected += 1;
        bytes += len as u64;
        if expected == a.progress_after {
            if let Some(path) = &a.progress_file {
                std::fs::write(path, b"")
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trip_and_corruption() {
        let mut b = vec![0u8; 300];
        fill(&mut b, 77);
        assert!(check(&b, 77));
        b[200] ^= 1;
        assert!(!check(&b, 77));
    }
}
