//! What socket users name and set: addresses, readiness, the settings of
//! a process's sockets, and the port ranges of docs/sockets.md §1.

use std::time::Duration;

/// Listener ports: a stream listener on port `p` binds `LISTEN_BASE + p`.
pub const LISTEN_BASE: u32 = 0x5300_0000;
/// Connection ports: each side of a connection binds `CONN_BASE + k`,
/// `0 < k < 2^24`.
pub const CONN_BASE: u32 = 0x4300_0000;
/// Datagram ports: a datagram socket on port `p` binds `DGRAM_BASE + p`.
pub const DGRAM_BASE: u32 = 0x4400_0000;
/// Connection ports per node.
pub const CONN_PORTS: u32 = 1 << 24;
/// The first port an unbound datagram socket is given.
pub const EPHEMERAL_FIRST: u16 = 32768;

/// A socket address: a node of the fabric and a 16-bit port, as a host
/// and a TCP or UDP port.
///
/// ```
/// let a = ulnic::sock::SockAddr { node: 1, port: 6379 };
/// assert_eq!(a.to_string(), "1:6379");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SockAddr {
    /// Node.
    pub node: u32,
    /// Port.
    pub port: u16,
}

impl std::fmt::Display for SockAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.node, self.port)
    }
}

/// The program-visible port of connection port `k` (docs/sockets.md §1).
///
/// ```
/// assert_eq!(ulnic::sock::visible_port(1), 32769);
/// ```
pub fn visible_port(k: u32) -> u16 {
    (u32::from(EPHEMERAL_FIRST) + k % 28232) as u16
}

/// What a socket is ready for, as `poll` bits.
///
/// ```
/// use ulnic::sock::Ready;
/// let r = Ready::READ | Ready::WRITE;
/// assert!(r.contains(Ready::READ) && !r.contains(Ready::ERROR));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ready(pub u32);

impl Ready {
    /// Nothing.
    pub const NONE: Ready = Ready(0);
    /// A read (or accept) would not block: data, end of stream, a reset,
    /// or a connection request.
    pub const READ: Ready = Ready(libc::POLLIN as u32);
    /// A write would not block: credit and room, or a broken connection
    /// whose write reports why.
    pub const WRITE: Ready = Ready(libc::POLLOUT as u32);
    /// An error is pending (connect failed, reset).
    pub const ERROR: Ready = Ready(libc::POLLERR as u32);
    /// Both directions are shut: the peer ended and so did we, or a reset.
    pub const HUP: Ready = Ready(libc::POLLHUP as u32);
    /// The peer sent its end of stream (`POLLRDHUP`).
    pub const READ_HUP: Ready = Ready(libc::POLLRDHUP as u32);

    /// Whether every bit of `other` is set.
    ///
    /// ```
    /// use ulnic::sock::Ready;
    /// assert!(Ready::READ.contains(Ready::NONE));
    /// ```
    pub fn contains(self, other: Ready) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any bit of `other` is set.
    ///
    /// ```
    /// use ulnic::sock::Ready;
    /// assert!((Ready::READ | Ready::HUP).intersects(Ready::HUP | Ready::ERROR));
    /// ```
    pub fn intersects(self, other: Ready) -> bool {
        self.0 & other.0 != 0
    }
}

/// What has woken a socket so far, counted as a kernel counts the
/// wake-ups of a TCP socket: something arriving to read (data, a
/// connection request, a datagram), room to write again after a write
/// found none, and changes of state (connected or failed, end of stream
/// from the peer, a reset, our own end delivered). Edge-triggered
/// readiness (epoll's `EPOLLET`) reports a socket when a count moved since
/// it last looked.
///
/// ```
/// let w = ulnic::sock::Wakes::default();
/// assert_eq!(w.input + w.output + w.state, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wakes {
    /// Arrivals to read.
    pub input: u64,
    /// Room to write again after a write found none.
    pub output: u64,
    /// Changes of state (they wake every kind of interest).
    pub state: u64,
}

/// Where a connection is in its life, named after the TCP state a kernel
/// socket would be in (what `getsockopt(TCP_INFO)` reports as
/// `tcpi_state`). A ulnic connection has no TIME_WAIT: once both ends
/// have ended it is [`ConnState::Closed`].
///
/// ```
/// use ulnic::sock::ConnState;
/// assert_eq!(ConnState::LastAck.linux_tcp_state(), 9);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// The CONNECT is on its way (SYN_SENT).
    Connecting,
    /// Connected, neither end ended (ESTABLISHED).
    Established,
    /// We ended; our FIN is not yet delivered (FIN_WAIT1).
    FinWait1,
    /// We ended and our FIN was delivered; the peer has not ended (FIN_WAIT2).
    FinWait2,
    /// The peer ended; we have not (CLOSE_WAIT).
    CloseWait,
    /// Both ended; our FIN is not yet delivered (LAST_ACK).
    LastAck,
    /// Both ends ended and delivered, or reset, or the connect failed (CLOSE).
    Closed,
}

impl ConnState {
    /// The number Linux gives this state (`TCP_ESTABLISHED` = 1, ...).
    ///
    /// ```
    /// assert_eq!(ulnic::sock::ConnState::Established.linux_tcp_state(), 1);
    /// ```
    pub fn linux_tcp_state(self) -> u8 {
        match self {
            ConnState::Established => 1,
            ConnState::Connecting => 2,
            ConnState::FinWait1 => 4,
            ConnState::FinWait2 => 5,
            ConnState::Closed => 7,
            ConnState::CloseWait => 8,
            ConnState::LastAck => 9,
        }
    }
}

impl std::ops::BitOr for Ready {
    type Output = Ready;
    fn bitor(self, r: Ready) -> Ready {
        Ready(self.0 | r.0)
    }
}

impl std::ops::BitOrAssign for Ready {
    fn bitor_assign(&mut self, r: Ready) {
        self.0 |= r.0;
    }
}

/// How a process's sockets are sized and how long they wait
/// (`SockConfig::from_env` reads the environment).
///
/// ```
/// let c = ulnic::sock::SockConfig::default();
/// assert_eq!((c.credits, c.buffer), (8, 65536));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockConfig {
    /// Receive buffers a stream posts per connection: the messages its
    /// peer may have in flight (`ULNIC_SOCK_CREDITS`, 2 to 1024).
    pub credits: u32,
    /// Bytes per stream buffer: the largest DATA message
    /// (`ULNIC_SOCK_BUFFER`, 4096 to 1 MiB, a multiple of 4096).
    pub buffer: u32,
    /// Send slots (and send ring entries) per stream, a power of two; a
    /// stream's segment holds `credits + send_slots` buffers.
    pub send_slots: u32,
    /// Receive buffers (of 64 KiB) per datagram socket.
    pub datagram_buffers: u32,
    /// How long a connect waits for the listener's answer.
    pub connect_timeout: Duration,
    /// How long a blocking call polls before it sleeps in the driver
    /// (`ULNIC_SPIN_US`). Between two TCG guests on 2 cores, where a
    /// polling vCPU cannot yield the host's cores, 0 made sockperf's
    /// round trip 237 us instead of 310 but redis-benchmark 10 % slower.
    pub spin: Duration,
}

impl Default for SockConfig {
    fn default() -> Self {
        SockConfig {
            // A window of 512 KiB: a stream between two TCG guests is
            // bound by window / round trip (iperf3: 1.1 Gbit/s with 16 KiB
            // buffers, 3.4 with 64 KiB, 5.8 with 128 KiB), and a
            // connection's segment is (credits + send_slots) buffers, 1 MiB.
            credits: 8,
            buffer: 64 << 10,
            send_slots: 8,
            datagram_buffers: 8,
            connect_timeout: Duration::from_secs(30),
            spin: Duration::from_micros(50),
        }
    }
}

impl SockConfig {
    /// The defaults, changed by `ULNIC_SOCK_CREDITS`, `ULNIC_SOCK_BUFFER`
    /// and `ULNIC_SPIN_US` where set to an allowed value (others are
    /// ignored, with a log line).
    ///
    /// ```
    /// let c = ulnic::sock::SockConfig::from_env();
    /// assert!(c.credits >= 2);
    /// ```
    pub fn from_env() -> SockConfig {
        let mut c = SockConfig::default();
        let num = |name: &str| -> Option<u64> {
            let v = std::env::var(name).ok()?;
            let n = v.trim().parse().ok();
            if n.is_none() {
                log::warn!("{name}={v:?} is not a number; ignored");
            }
            n
        };
        if let Some(n) = num("ULNIC_SOCK_CREDITS").filter(|n| (2..=1024).contains(n)) {
            c.credits = n as u32;
        }
        if let Some(n) = num("ULNIC_SOCK_BUFFER")
            .filter(|n| (4096..=1 << 20).contains(n) && n.is_multiple_of(4096))
        {
            c.buffer = n as u32;
        }
        if let Some(n) = num("ULNIC_SPIN_US").filter(|n| *n <= 1_000_000) {
            c.spin = Duration::from_micros(n);
        }
        c
    }
}
