//! A process's socket context: the NIC and protection domain its sockets'
//! endpoints live in, their sizes, and the ports they bind.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::nic::{Nic, ProtectionDomain};
use crate::sock::addr::{
    SockConfig, CONN_BASE, CONN_PORTS, DGRAM_BASE, EPHEMERAL_FIRST, LISTEN_BASE,
};
use crate::types::EndpointConfig;

/// Bytes of a datagram socket's buffers: the largest UDP payload fits.
pub const DATAGRAM_BUFFER: u32 = 64 << 10;
/// Send slots of a datagram socket.
const DATAGRAM_SEND_SLOTS: u32 = 8;
/// Tries at finding a free port before giving up.
const PORT_TRIES: u32 = 512;

/// The sizes of one stream connection's buffers, chosen by its side when
/// it is made (docs/sockets.md §3, "Sizes"); its hello tells the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Receive buffers posted: messages the peer may have in flight.
    pub credits: u32,
    /// Bytes per buffer (receive and send alike).
    pub buffer: u32,
    /// Send slots, a power of two.
    pub send_slots: u32,
}

/// A connection's buffers when the device's endpoint memory is a quarter
/// used or more (a cap: smaller settings stay).
const SMALLEST: Shape = Shape {
    credits: 4,
    buffer: 8 << 10,
    send_slots: 2,
};

impl Shape {
    /// The configured sizes: what a connection gets while memory is
    /// plentiful.
    fn full(c: &SockConfig) -> Shape {
        Shape {
            credits: c.credits,
            buffer: c.buffer,
            send_slots: c.send_slots,
        }
    }

    /// The smallest connection `self` allows.
    fn smallest(self) -> Shape {
        Shape {
            credits: self.credits.min(SMALLEST.credits),
            buffer: self.buffer.min(SMALLEST.buffer),
            send_slots: self.send_slots.min(SMALLEST.send_slots),
        }
    }

    /// What a new connection gets when the device's endpoint memory is
    /// `used` of `limit` bytes, as a kernel shrinks socket buffers under
    /// memory pressure: the full size below an eighth, buffers a quarter
    /// the size (at least 8 KiB) below a quarter, the smallest beyond (a
    /// 512 MiB guest then holds about 1,400 connections).
    pub fn for_pressure(self, used: u64, limit: u64) -> Shape {
        if used.saturating_mul(8) < limit {
            self
        } else if used.saturating_mul(4) < limit {
            Shape {
                buffer: (self.buffer / 4).max(SMALLEST.buffer).min(self.buffer) & !4095,
                ..self
            }
        } else {
            self.smallest()
        }
    }

    /// The segment: receive buffers, then send slots.
    fn segment_bytes(&self) -> usize {
        ((self.credits + self.send_slots) * self.buffer) as usize
    }

    /// Where send slot `i` is in the segment.
    pub fn send_slot(&self, i: u32) -> u64 {
        u64::from(self.credits + i % self.send_slots) * u64::from(self.buffer)
    }
}

/// The sockets of one process: made from one NIC and one protection
/// domain. Cheap to clone; every socket keeps its own.
///
/// ```no_run
/// let net = ulnic::sock::Net::open()?;
/// println!("node {} of {}", net.node(), net.nodes());
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Clone)]
pub struct Net {
    inner: Arc<Inner>,
}

struct Inner {
    pd: ProtectionDomain,
    node: u32,
    nodes: u32,
    cfg: SockConfig,
    /// The next connection port to try (`CONN_BASE + k`).
    next_conn: AtomicU32,
    /// The next ephemeral datagram port to try.
    next_ephemeral: AtomicU32,
}

/// Whether `e` is the device's "port already bound".
fn in_use(e: &Error) -> bool {
    e.errno() == libc::EADDRINUSE
}

impl Net {
    /// Sockets on the NIC the environment names (`Nic::open`), sized by
    /// `SockConfig::from_env`.
    ///
    /// ```no_run
    /// let net = ulnic::sock::Net::open()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn open() -> Result<Net, Error> {
        Net::new(&Nic::open()?, SockConfig::from_env())
    }

    /// Sockets on `nic`, in a protection domain of their own.
    ///
    /// ```no_run
    /// let nic = ulnic::Nic::open()?;
    /// let net = ulnic::sock::Net::new(&nic, ulnic::sock::SockConfig::default())?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new(nic: &Nic, cfg: SockConfig) -> Result<Net, Error> {
        if cfg.credits < 2
            || !cfg.send_slots.is_power_of_two()
            || cfg.buffer <= ulnic_abi::INLINE_MAX
        {
            return Err(Error::InvalidArgument(
                "socket credits must be at least 2, send slots a power of two, buffers above INLINE_MAX",
            ));
        }
        // Start the port searches somewhere new for each process, so a
        // restarted program does not reuse the ports of its last life at
        // once (its old peers' filters would still name them).
        let seed = std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        Ok(Net {
            inner: Arc::new(Inner {
                pd: nic.alloc_pd()?,
                node: nic.node(),
                nodes: nic.nodes(),
                cfg,
                next_conn: AtomicU32::new(seed % (CONN_PORTS - 1)),
                next_ephemeral: AtomicU32::new(seed),
            }),
        })
    }

    /// This node.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let me = net.node();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn node(&self) -> u32 {
        self.inner.node
    }

    /// Nodes in the fabric.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// assert!(net.node() < net.nodes());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn nodes(&self) -> u32 {
        self.inner.nodes
    }

    /// The sockets' settings.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let buffer = net.config().buffer;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn config(&self) -> &SockConfig {
        &self.inner.cfg
    }

    /// This thread's watcher (spec §6 "Several waiters"), made the first
    /// time: what a thread blocked on sockets sleeps on.
    ///
    /// ```no_run
    /// let net = ulnic::sock::Net::open()?;
    /// let w = net.watcher()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn watcher(&self) -> std::io::Result<Arc<crate::watcher::Watcher>> {
        crate::sock::wait::thread_watcher(&self.inner.pd.inner)
    }

    /// A new watcher of this NIC, for a waiter of its own (an `epoll`
    /// set).
    ///
    /// ```no_run
    /// let net = ulnic::sock::Net::open()?;
    /// let w = net.new_watcher()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new_watcher(&self) -> std::io::Result<Arc<crate::watcher::Watcher>> {
        crate::watcher::Watcher::of(&self.inner.pd.inner)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }

    /// The descriptor that becomes readable when one of these sockets,
    /// armed, has something new (`poll`, `select`, `epoll`).
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// let fd = net.notification_fd();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.pd.notification_fd()
    }

    /// Takes every notification of these sockets at once: after a wake-up
    /// on `notification_fd`, before looking at the sockets.
    ///
    /// ```no_run
    /// # let net = ulnic::sock::Net::open()?;
    /// net.take_notified()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn take_notified(&self) -> Result<Vec<u32>, Error> {
        self.inner.pd.take_notified()
    }

    fn endpoint(&self, cfg: EndpointConfig) -> Result<Endpoint, Error> {
        self.inner.pd.create_endpoint(&cfg)
    }

    /// A stream connection's endpoint, bound to a free connection port,
    /// its receive buffers posted: the endpoint, `k` of its port and its
    /// buffers' sizes (smaller as the device's endpoint memory fills; the
    /// smallest when the full one is refused for memory).
    pub(crate) fn stream_endpoint(&self) -> Result<(Endpoint, u32, Shape), Error> {
        let full = Shape::full(&self.inner.cfg);
        let shape = match self.inner.pd.memory_use() {
            Some((used, limit)) => full.for_pressure(used, limit),
            None => full,
        };
        match self.stream_endpoint_of(shape) {
            Err(e) if e.errno() == libc::ENOMEM && shape != shape.smallest() => {
                self.stream_endpoint_of(shape.smallest())
            }
            r => r,
        }
    }

    fn stream_endpoint_of(&self, c: Shape) -> Result<(Endpoint, u32, Shape), Error> {
        let mut ep = self.endpoint(EndpointConfig {
            send_entries: c.send_slots,
            recv_entries: (c.credits + 16).next_power_of_two(),
            free_entries: c.credits.next_power_of_two(),
            segment_bytes: c.segment_bytes(),
        })?;
        let k = self.bind_free(&mut ep, || {
            let k = self.inner.next_conn.fetch_add(1, Ordering::Relaxed) % (CONN_PORTS - 1) + 1;
            (CONN_BASE + k, k)
        })?;
        for i in 0..c.credits {
            ep.post_free(u64::from(i * c.buffer), c.buffer, u64::from(i))?;
        }
        Ok((ep, k, c))
    }

    /// A listener's endpoint on port `port`, receiving up to `backlog`
    /// requests.
    pub(crate) fn listener_endpoint(&self, port: u16, backlog: u32) -> Result<Endpoint, Error> {
        let mut ep = self.endpoint(EndpointConfig {
            send_entries: 16,
            recv_entries: (backlog + 16).clamp(32, 4096).next_power_of_two(),
            free_entries: 2,
            segment_bytes: 4096,
        })?;
        ep.bind(LISTEN_BASE + u32::from(port))?;
        Ok(ep)
    }

    /// A datagram socket's endpoint, bound to `port` or to a free one from
    /// `EPHEMERAL_FIRST`, its buffers posted: the endpoint and its port.
    pub(crate) fn datagram_endpoint(&self, port: Option<u16>) -> Result<(Endpoint, u16), Error> {
        let buffers = self.inner.cfg.datagram_buffers;
        let mut ep = self.endpoint(EndpointConfig {
            send_entries: DATAGRAM_SEND_SLOTS,
            recv_entries: 256,
            free_entries: buffers.next_power_of_two(),
            segment_bytes: ((buffers + DATAGRAM_SEND_SLOTS) * DATAGRAM_BUFFER) as usize,
        })?;
        let port = match port {
            Some(p) => {
                ep.bind(DGRAM_BASE + u32::from(p))?;
                p
            }
            None => self.bind_free(&mut ep, || {
                let span = u32::from(u16::MAX - EPHEMERAL_FIRST) + 1;
                let p = (u32::from(EPHEMERAL_FIRST)
                    + self.inner.next_ephemeral.fetch_add(1, Ordering::Relaxed) % span)
                    as u16;
                (DGRAM_BASE + u32::from(p), p)
            })?,
        };
        for i in 0..buffers {
            ep.post_free(
                u64::from(i * DATAGRAM_BUFFER),
                DATAGRAM_BUFFER,
                u64::from(i),
            )?;
        }
        Ok((ep, port))
    }

    /// Where datagram send slot `i` is in the segment.
    pub(crate) fn datagram_slot(&self, i: u32) -> u64 {
        u64::from(self.inner.cfg.datagram_buffers + i % DATAGRAM_SEND_SLOTS)
            * u64::from(DATAGRAM_BUFFER)
    }

    /// Binds `ep` to the first port `pick` offers that is free.
    fn bind_free<T>(&self, ep: &mut Endpoint, pick: impl Fn() -> (u32, T)) -> Result<T, Error> {
        let mut last = None;
        for _ in 0..PORT_TRIES {
            let (port, v) = pick();
            match ep.bind(port) {
                Ok(()) => return Ok(v),
                Err(e) if in_use(&e) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(Error::InvalidArgument("no free port")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_shrink_as_endpoint_memory_fills() {
        let full = Shape::full(&SockConfig::default());
        assert_eq!(full.segment_bytes(), 1 << 20);
        let limit = 128 << 20;
        assert_eq!(full.for_pressure(0, limit), full);
        assert_eq!(full.for_pressure(limit / 8 - 1, limit), full);
        let quarter = full.for_pressure(limit / 8, limit);
        assert_eq!((quarter.credits, quarter.buffer), (8, 16 << 10));
        assert_eq!(quarter.segment_bytes(), 256 << 10);
        assert_eq!(full.for_pressure(limit / 4 - 1, limit), quarter);
        let small = full.for_pressure(limit / 4, limit);
        assert_eq!(small, SMALLEST);
        assert_eq!(small.segment_bytes(), 48 << 10);
        assert_eq!(full.for_pressure(limit * 2, limit), SMALLEST);
        assert_eq!(full.for_pressure(1, 0), SMALLEST);
        // Settings already below a tier stay as they are.
        let tiny = Shape {
            credits: 2,
            buffer: 4096,
            send_slots: 1,
        };
        for used in [0, limit / 3, limit] {
            assert_eq!(tiny.for_pressure(used, limit), tiny);
        }
        // Send slots follow the receive buffers in the segment.
        assert_eq!(small.send_slot(0), 4 * 8192);
        assert_eq!(small.send_slot(3), 5 * 8192);
    }
}
