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
    /// its receive buffers posted: the endpoint and `k` of its port.
    pub(crate) fn stream_endpoint(&self) -> Result<(Endpoint, u32), Error> {
        let c = &self.inner.cfg;
        let mut ep = self.endpoint(EndpointConfig {
            send_entries: c.send_slots,
            recv_entries: (c.credits + 16).next_power_of_two(),
            free_entries: c.credits.next_power_of_two(),
            segment_bytes: ((c.credits + c.send_slots) * c.buffer) as usize,
        })?;
        let k = self.bind_free(&mut ep, || {
            let k = self.inner.next_conn.fetch_add(1, Ordering::Relaxed) % (CONN_PORTS - 1) + 1;
            (CONN_BASE + k, k)
        })?;
        for i in 0..c.credits {
            ep.post_free(u64::from(i * c.buffer), c.buffer, u64::from(i))?;
        }
        Ok((ep, k))
    }

    /// Where stream send slot `i` is in the segment.
    pub(crate) fn send_slot(&self, i: u32) -> u64 {
        let c = &self.inner.cfg;
        u64::from(c.credits + i % c.send_slots) * u64::from(c.buffer)
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
