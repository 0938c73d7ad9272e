//! A fabric split between members (spec §10.7, §10.8): device processes,
//! or the engine shards of one device. Each member owns some switches (and
//! the nodes on them); a link between switches of two members carries its
//! packets over UDP between processes, each datagram authenticated with
//! HMAC-SHA256 under the fabric's key, or through memory between shards. A datagram that is short, from
//! an address that is not the member owning the link's sending end, for a
//! link that does not end here, or whose MAC does not verify, is dropped
//! and counted: only members inject packets, so every source stays
//! stamped by a NIC.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use ulnic_abi::datagram::{self, MAC_SIZE};
use ulnic_abi::wire::DatagramHeader;
use zerocopy::{FromBytes, IntoBytes};

use crate::fabric::packet::Packet;

type HmacSha256 = Hmac<Sha256>;

/// Who is in the fabric and which of them this device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// This device's index in `members`.
    pub me: usize,
    /// Every member's name and UDP address.
    pub members: Vec<(String, SocketAddr)>,
    /// The member owning each switch, by switch index.
    pub switch_owner: Vec<usize>,
    /// The fabric's key (every member has the same).
    pub key: [u8; 32],
}

/// What the UDP side has seen.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpanCounters {
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams that could not be sent (the socket refused).
    pub send_errors: u64,
    /// Datagrams received and accepted.
    pub received: u64,
    /// Datagrams dropped: from an address that is not a member.
    pub rejected_sender: u64,
    /// Datagrams dropped: the MAC did not verify (forged, or another key).
    pub rejected_mac: u64,
    /// Datagrams dropped: too short, bad magic, a lane that does not end
    /// here or is not the sender's, or a packet that does not parse.
    pub rejected_malformed: u64,
    /// Packets dropped because the far end's buffer was full.
    pub overflow: u64,
}

summable!(SpanCounters {
    sent,
    send_errors,
    received,
    rejected_sender,
    rejected_mac,
    rejected_malformed,
    overflow
});

/// The UDP side of a spanning fabric: the socket and the MAC.
pub struct Udp {
    socket: UdpSocket,
    span: Span,
    /// What it has seen.
    pub counters: SpanCounters,
    buf: Vec<u8>,
}

/// The socket buffers a member asks for (each way).
const SOCKET_BUFFER: libc::c_int = 8 << 20;

/// Asks for a socket buffer of `bytes` (`opt`: SO_RCVBUF or SO_SNDBUF). A
/// refusal leaves the default: only more loss under bursts, which the
/// transport recovers from.
fn set_buffer(socket: &UdpSocket, opt: libc::c_int, bytes: libc::c_int) {
    // SAFETY: a valid socket descriptor, and a pointer to an int of the
    // length passed, read during the call only.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        log::warn!(
            "UDP socket buffer of {bytes} bytes refused: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Udp {
    /// Binds this member's address.
    pub fn bind(span: Span) -> std::io::Result<Udp> {
        let addr = span.members[span.me].1;
        let socket = UdpSocket::bind(addr)?;
        socket.set_nonblocking(true)?;
        // A channel's window (16 messages of up to 1 MiB) leaves in a
        // burst that the default 208 KiB would drop; the kernel caps
        // what is asked at net.core.[rw]mem_max (spec §10.7).
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            set_buffer(&socket, opt, SOCKET_BUFFER);
        }
        Ok(Udp {
            socket,
            span,
            counters: SpanCounters::default(),
            buf: vec![0; 65_536],
        })
    }

    /// The membership.
    pub fn span(&self) -> &Span {
        &self.span
    }

    /// The socket, for the engine to wait on.
    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length: this cannot fail.
        <HmacSha256 as Mac>::new_from_slice(&self.span.key).expect("HMAC accepts any key length")
    }

    /// Sends `p`, which crossed lane `lane`, to member `to`.
    pub fn send(&mut self, to: usize, lane: usize, p: &Packet) {
        let mut d = Vec::with_capacity(datagram::HEADER_SIZE + p.wire_len() + MAC_SIZE);
        let header = DatagramHeader {
            magic: datagram::MAGIC.into(),
            lane: (lane as u32).into(),
        };
        d.extend_from_slice(header.as_bytes());
        d.extend_from_slice(&p.to_bytes());
        let mut mac = self.mac();
        mac.update(&d);
        d.extend_from_slice(&mac.finalize().into_bytes());
        match self.socket.send_to(&d, self.span.members[to].1) {
            Ok(_) => self.counters.sent += 1,
            Err(_) => self.counters.send_errors += 1,
        }
    }

    /// The next datagram waiting, checked: (lane, packet). `accepts(lane,
    /// member)` says whether `lane` ends here and starts at `member`.
    /// Rejected datagrams are counted and skipped; None when no more wait.
    pub fn receive(&mut self, accepts: &dyn Fn(usize, usize) -> bool) -> Option<(usize, Packet)> {
        loop {
            let (n, from) = self.socket.recv_from(&mut self.buf).ok()?;
            let Some(member) = self.span.members.iter().position(|m| m.1 == from) else {
                self.counters.rejected_sender += 1;
                continue;
            };
            let d = &self.buf[..n];
            if n < datagram::MIN_LEN {
                self.counters.rejected_malformed += 1;
                continue;
            }
            let (body, tag) = d.split_at(n - MAC_SIZE);
            let mut mac = self.mac();
            mac.update(body);
            if mac.verify_slice(tag).is_err() {
                self.counters.rejected_mac += 1;
                continue;
            }
            let Ok((header, rest)) = DatagramHeader::read_from_prefix(body) else {
                self.counters.rejected_malformed += 1;
                continue;
            };
            let lane = header.lane.get() as usize;
            match Packet::from_bytes(rest) {
                Some(p) if header.magic.get() == datagram::MAGIC && accepts(lane, member) => {
                    self.counters.received += 1;
                    return Some((lane, p));
                }
                _ => self.counters.rejected_malformed += 1,
            }
        }
    }
}

/// The queues joining the shards of one device's engine (spec §10.8): a
/// lane between switches of two shards hands its packets to the owner of
/// the far end through memory, and wakes that shard's engine.
pub struct MemoryShared {
    queues: Vec<std::sync::Mutex<std::collections::VecDeque<(usize, usize, Packet)>>>,
    /// Packets pushed to each shard and not yet looked for: checked before
    /// any lock or system call, so a shard with nothing waiting pays one
    /// atomic load per pass.
    pending: Vec<std::sync::atomic::AtomicUsize>,
    wakes: Vec<vmm_sys_util::eventfd::EventFd>,
    /// Per lane: packets handed to the far shard and not yet passed on
    /// there (the credits of §10.3, shared by the two shards).
    credits: Vec<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
}

impl MemoryShared {
    /// Lane `lane`'s shared credit counter.
    pub fn credit(&self, lane: usize) -> Option<std::sync::Arc<std::sync::atomic::AtomicUsize>> {
        self.credits.get(lane).cloned()
    }

    /// Queues for `shards` shards of a fabric of `lanes` lanes.
    pub fn new(shards: usize, lanes: usize) -> std::io::Result<std::sync::Arc<MemoryShared>> {
        Ok(std::sync::Arc::new(MemoryShared {
            queues: (0..shards).map(|_| Default::default()).collect(),
            pending: (0..shards).map(|_| Default::default()).collect(),
            credits: (0..lanes).map(|_| Default::default()).collect(),
            wakes: (0..shards)
                .map(|_| vmm_sys_util::eventfd::EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK))
                .collect::<Result<_, _>>()?,
        }))
    }
}

/// Packets between a member and the others: over UDP between device
/// processes, or through memory between the shards of one.
pub enum Wire {
    /// Device processes.
    Udp(Udp),
    /// Shards of one device: this shard's number and the queues.
    Memory(usize, std::sync::Arc<MemoryShared>, SpanCounters),
}

impl Wire {
    /// Sends `p`, which crossed lane `lane`, to member `to`.
    pub fn send(&mut self, to: usize, lane: usize, p: Packet) {
        match self {
            Wire::Udp(u) => u.send(to, lane, &p),
            Wire::Memory(me, shared, c) => {
                if let (Some(q), Some(w)) = (shared.queues.get(to), shared.wakes.get(to)) {
                    q.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back((*me, lane, p));
                    shared.pending[to].fetch_add(1, std::sync::atomic::Ordering::Release);
                    let _ = w.write(1);
                    c.sent += 1;
                }
            }
        }
    }

    /// Every packet waiting for this member that `accepts(lane, from)`,
    /// handed to `take` (the others are counted and dropped).
    pub fn receive_all(
        &mut self,
        accepts: &dyn Fn(usize, usize) -> bool,
        take: &mut dyn FnMut(usize, Packet),
    ) {
        match self {
            Wire::Udp(u) => {
                while let Some((lane, p)) = u.receive(accepts) {
                    take(lane, p);
                }
            }
            Wire::Memory(me, shared, c) => {
                // Nothing pushed since the last look: no lock, no system
                // call. Otherwise the count and the wake-up are consumed
                // before the queue is taken: a packet pushed after this
                // counts and wakes the engine again.
                if shared.pending[*me].swap(0, std::sync::atomic::Ordering::Acquire) == 0 {
                    return;
                }
                let _ = shared.wakes[*me].read();
                let waiting = std::mem::take(
                    &mut *shared.queues[*me].lock().unwrap_or_else(|e| e.into_inner()),
                );
                for (from, lane, p) in waiting {
                    if accepts(lane, from) {
                        c.received += 1;
                        take(lane, p);
                    } else {
                        c.rejected_malformed += 1;
                    }
                }
            }
        }
    }

    /// Whether certainly nothing waits (between shards: nothing pushed;
    /// over UDP the socket must be asked, so never certain).
    pub fn quiet(&self) -> bool {
        match self {
            Wire::Udp(_) => false,
            Wire::Memory(me, shared, _) => {
                shared.pending[*me].load(std::sync::atomic::Ordering::Acquire) == 0
            }
        }
    }

    /// What the engine waits on for packets from the others.
    pub fn fd(&self) -> RawFd {
        match self {
            Wire::Udp(u) => u.fd(),
            Wire::Memory(me, shared, _) => shared.wakes[*me].as_raw_fd(),
        }
    }

    /// Its counters.
    pub fn counters(&self) -> SpanCounters {
        match self {
            Wire::Udp(u) => u.counters,
            Wire::Memory(_, _, c) => *c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(me: usize, key: u8, addrs: &[SocketAddr]) -> Span {
        Span {
            me,
            members: addrs
                .iter()
                .enumerate()
                .map(|(i, a)| (format!("m{i}"), *a))
                .collect(),
            switch_owner: vec![0, 1],
            key: [key; 32],
        }
    }

    fn free_addr() -> SocketAddr {
        UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    fn accepts(lane: usize, from: usize) -> bool {
        lane == 3 && from == 0
    }

    /// The next packet `u` accepts, within 5 s.
    fn wait_receive(u: &mut Udp) -> (usize, Packet) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if let Some(r) = u.receive(&accepts) {
                return r;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "nothing received within 5 s ({:?})",
                u.counters
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Takes datagrams until `counter` of `u` is 1 (the one just sent was
    /// dropped and counted), within 5 s; nothing may be accepted meanwhile.
    fn wait_rejected(u: &mut Udp, what: &str, counter: fn(&SpanCounters) -> u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while counter(&u.counters) == 0 {
            if let Some(r) = u.receive(&accepts) {
                panic!("{what} was accepted: {r:?}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} was never rejected ({:?})",
                u.counters
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(counter(&u.counters), 1, "{what}: {:?}", u.counters);
    }

    #[test]
    fn members_with_the_key_get_through_and_nobody_else() {
        let addrs = [free_addr(), free_addr()];
        let mut a = Udp::bind(span(0, 1, &addrs)).unwrap();
        let mut b = Udp::bind(span(1, 1, &addrs)).unwrap();
        let mut p = Packet::new(ulnic_abi::packet::DATA);
        p.payload = b"hello".to_vec();
        p.seal();
        a.send(1, 3, &p);
        assert_eq!(wait_receive(&mut b), (3, p.clone()));

        // The wrong key: dropped, counted.
        let stranger_addr = addrs[0];
        drop(a);
        let mut stranger = Udp::bind(span(0, 2, &[stranger_addr, addrs[1]])).unwrap();
        stranger.send(1, 3, &p);
        wait_rejected(&mut b, "a datagram with another key", |c| c.rejected_mac);
        drop(stranger);

        // The right key, but a lane the sender does not own.
        let mut a = Udp::bind(span(0, 1, &addrs)).unwrap();
        a.send(1, 4, &p);
        wait_rejected(&mut b, "a packet on another's lane", |c| {
            c.rejected_malformed
        });

        // Not a member at all.
        let outsider = UdpSocket::bind("127.0.0.1:0").unwrap();
        outsider.send_to(b"anything at all", addrs[1]).unwrap();
        wait_rejected(&mut b, "a stranger's datagram", |c| c.rejected_sender);
        // Each rejected on its own count, and only the first accepted.
        let c = &b.counters;
        assert_eq!(
            (
                c.received,
                c.rejected_mac,
                c.rejected_malformed,
                c.rejected_sender
            ),
            (1, 1, 1, 1),
            "{c:?}"
        );
    }
}
