//! Which addresses go over ulnic: `ULNIC_INET=10.81.0.0/24` makes node
//! `n` the IPv4 address `10.81.0.(n + 1)` (the network address plus
//! `n + 1`), also as an IPv4-mapped IPv6 address. Everything else, and
//! everything when `ULNIC_INET` is unset, stays with the kernel.
//!
//! Loopback mode, `ULNIC_INET=127.0.0.0/8`: every 127.x.x.x address is
//! this node, which sends to itself through the device (docs/sockets.md
//! §7); other nodes have no address.

use std::ffi::c_int;
use std::net::Ipv4Addr;

use libc::{sockaddr, sockaddr_in, sockaddr_in6, socklen_t, AF_INET, AF_INET6};

/// The variable naming the network.
pub const INET_ENV: &str = "ULNIC_INET";

/// The ulnic network's IPv4 range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inet {
    /// The network address (host order).
    base: u32,
    /// Addresses in the range.
    size: u32,
    /// Loopback mode: 127.0.0.0/8 is this node.
    loopback: bool,
}

/// Where a socket address points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A node of the fabric, and a port.
    Node(u32, u16),
    /// Any address (`INADDR_ANY`, `in6addr_any`), and a port: this node
    /// and the kernel both.
    Any(u16),
    /// This node, whichever number it has (loopback mode), and a port:
    /// [`crate::env::Env::target`] makes it a `Node`.
    Local(u16),
    /// Something for the kernel.
    Kernel,
}

impl Inet {
    /// Parses `a.b.c.d/len` (len 8..=30); a network inside 127.0.0.0/8
    /// is loopback mode.
    pub fn parse(s: &str) -> Option<Inet> {
        let (addr, len) = s.trim().split_once('/')?;
        let ip: Ipv4Addr = addr.parse().ok()?;
        let len: u32 = len.parse().ok()?;
        if !(8..=30).contains(&len) {
            return None;
        }
        let mask = u32::MAX << (32 - len);
        if ip.is_loopback() {
            return Some(Inet {
                base: u32::from(Ipv4Addr::new(127, 0, 0, 0)),
                size: 1 << 24,
                loopback: true,
            });
        }
        Some(Inet {
            base: u32::from(ip) & mask,
            size: 1 << (32 - len),
            loopback: false,
        })
    }

    /// The range `ULNIC_INET` names, if it is set and valid.
    pub fn from_env() -> Option<Inet> {
        let v = std::env::var(INET_ENV).ok()?;
        let inet = Inet::parse(&v);
        if inet.is_none() {
            crate::real::warn(&format!(
                "{INET_ENV}={v:?} is not a network like 10.81.0.0/24; ulnic sockets are off"
            ));
        }
        inet
    }

    /// The node an address stands for.
    pub fn node_of(&self, ip: Ipv4Addr) -> Option<u32> {
        let off = u32::from(ip).wrapping_sub(self.base);
        (off >= 1 && off < self.size - 1).then(|| off - 1)
    }

    /// The address of node `n` (in loopback mode 127.0.0.1, the only
    /// node there is).
    pub fn addr_of(&self, n: u32) -> Ipv4Addr {
        if self.loopback {
            return Ipv4Addr::LOCALHOST;
        }
        Ipv4Addr::from(self.base.wrapping_add(n + 1))
    }

    /// Where the socket address at `addr` (`len` bytes) points.
    ///
    /// # Safety
    /// `addr` is NULL or points to `len` readable bytes.
    pub unsafe fn target(&self, addr: *const sockaddr, len: socklen_t) -> Target {
        match read_addr(addr, len) {
            Some((ip, port)) if ip.is_unspecified() => Target::Any(port),
            Some((ip, port)) if self.loopback => {
                if ip.is_loopback() {
                    Target::Local(port)
                } else {
                    Target::Kernel
                }
            }
            Some((ip, port)) => match self.node_of(ip) {
                Some(n) => Target::Node(n, port),
                None => Target::Kernel,
            },
            None => Target::Kernel,
        }
    }
}

/// The IPv4 address and port a socket address holds (IPv4, or IPv6 that
/// is IPv4-mapped or unspecified).
fn read_addr(addr: *const sockaddr, len: socklen_t) -> Option<(Ipv4Addr, u16)> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family field is readable (checked above); the
    // family says which struct follows, and its size is checked before it
    // is read. Unaligned reads: the caller's buffer may be any bytes.
    let family = c_int::from(unsafe { std::ptr::read_unaligned(addr.cast::<libc::sa_family_t>()) });
    match family {
        AF_INET if len as usize >= std::mem::size_of::<sockaddr_in>() => {
            // SAFETY: as above.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<sockaddr_in>()) };
            Some((
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            ))
        }
        AF_INET6 if len as usize >= std::mem::size_of::<sockaddr_in6>() => {
            // SAFETY: as above.
            let a = unsafe { std::ptr::read_unaligned(addr.cast::<sockaddr_in6>()) };
            let ip6 = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            let port = u16::from_be(a.sin6_port);
            if ip6.is_unspecified() {
                Some((Ipv4Addr::UNSPECIFIED, port))
            } else {
                ip6.to_ipv4_mapped().map(|ip| (ip, port))
            }
        }
        _ => None,
    }
}

/// Writes `ip:port` as a socket address of `family` (IPv6: IPv4-mapped)
/// into `addr`, as `getsockname` does: at most `*len` bytes, and `*len`
/// set to the full size.
///
/// # Safety
/// `addr` and `len` are NULL or writable (`*len` bytes at `addr`).
pub unsafe fn write_addr(
    family: c_int,
    ip: Ipv4Addr,
    port: u16,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let mut buf = [0u8; std::mem::size_of::<sockaddr_in6>()];
    let size = if family == AF_INET6 {
        let mut a: sockaddr_in6 = unsafe { std::mem::zeroed() };
        a.sin6_family = AF_INET6 as libc::sa_family_t;
        a.sin6_port = port.to_be();
        a.sin6_addr.s6_addr = ip.to_ipv6_mapped().octets();
        // SAFETY: `a` is plain data of this size.
        buf.copy_from_slice(unsafe {
            std::slice::from_raw_parts(
                (&a as *const sockaddr_in6).cast::<u8>(),
                std::mem::size_of::<sockaddr_in6>(),
            )
        });
        std::mem::size_of::<sockaddr_in6>()
    } else {
        let mut a: sockaddr_in = unsafe { std::mem::zeroed() };
        a.sin_family = AF_INET as libc::sa_family_t;
        a.sin_port = port.to_be();
        a.sin_addr.s_addr = u32::from(ip).to_be();
        let n = std::mem::size_of::<sockaddr_in>();
        // SAFETY: `a` is plain data of this size.
        buf[..n].copy_from_slice(unsafe {
            std::slice::from_raw_parts((&a as *const sockaddr_in).cast::<u8>(), n)
        });
        n
    };
    // SAFETY: the caller gives `*len` writable bytes at `addr`.
    unsafe {
        let room = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping(buf.as_ptr(), addr.cast::<u8>(), room);
        *len = size as socklen_t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: [u8; 4], port: u16) -> sockaddr_in {
        let mut a: sockaddr_in = unsafe { std::mem::zeroed() };
        a.sin_family = AF_INET as libc::sa_family_t;
        a.sin_port = port.to_be();
        a.sin_addr.s_addr = u32::from(Ipv4Addr::from(ip)).to_be();
        a
    }

    #[test]
    fn nodes_are_the_range_after_its_network_address() {
        let inet = Inet::parse("10.81.0.0/24").unwrap();
        assert_eq!(inet.node_of(Ipv4Addr::new(10, 81, 0, 1)), Some(0));
        assert_eq!(inet.node_of(Ipv4Addr::new(10, 81, 0, 8)), Some(7));
        assert_eq!(inet.node_of(Ipv4Addr::new(10, 81, 0, 0)), None);
        assert_eq!(
            inet.node_of(Ipv4Addr::new(10, 81, 0, 255)),
            None,
            "broadcast"
        );
        assert_eq!(inet.node_of(Ipv4Addr::new(10, 81, 1, 1)), None);
        assert_eq!(inet.addr_of(3), Ipv4Addr::new(10, 81, 0, 4));
        assert_eq!(Inet::parse("10.81.0.7/24"), Inet::parse("10.81.0.0/24"));
        assert!(Inet::parse("10.81.0.0").is_none() && Inet::parse("10.81.0.0/31").is_none());
    }

    #[test]
    fn loopback_mode_is_this_node_at_every_127_address() {
        let inet = Inet::parse("127.0.0.0/8").unwrap();
        let t =
            |a: &sockaddr_in, len| unsafe { inet.target((a as *const sockaddr_in).cast(), len) };
        let full = std::mem::size_of::<sockaddr_in>() as socklen_t;
        assert_eq!(t(&v4([127, 0, 0, 1], 80), full), Target::Local(80));
        assert_eq!(t(&v4([127, 3, 2, 1], 81), full), Target::Local(81));
        assert_eq!(t(&v4([0, 0, 0, 0], 82), full), Target::Any(82));
        assert_eq!(t(&v4([10, 81, 0, 1], 83), full), Target::Kernel);
        assert_eq!(inet.addr_of(5), Ipv4Addr::LOCALHOST);
        assert_eq!(Inet::parse("127.0.0.1/8"), Some(inet));
    }

    #[test]
    fn socket_addresses_map_to_nodes_any_or_the_kernel() {
        let inet = Inet::parse("10.81.0.0/24").unwrap();
        let t =
            |a: &sockaddr_in, len| unsafe { inet.target((a as *const sockaddr_in).cast(), len) };
        let full = std::mem::size_of::<sockaddr_in>() as socklen_t;
        assert_eq!(t(&v4([10, 81, 0, 2], 6379), full), Target::Node(1, 6379));
        assert_eq!(t(&v4([0, 0, 0, 0], 80), full), Target::Any(80));
        assert_eq!(t(&v4([127, 0, 0, 1], 80), full), Target::Kernel);
        assert_eq!(t(&v4([10, 81, 0, 2], 1), 4), Target::Kernel, "too short");
        // IPv4-mapped IPv6, written and read back.
        let mut buf = [0u8; 64];
        let mut len = buf.len() as socklen_t;
        unsafe {
            write_addr(
                AF_INET6,
                Ipv4Addr::new(10, 81, 0, 3),
                5201,
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        assert_eq!(len as usize, std::mem::size_of::<sockaddr_in6>());
        assert_eq!(
            unsafe { inet.target(buf.as_ptr().cast(), len) },
            Target::Node(2, 5201)
        );
        // A short buffer gets what fits and the full length.
        let mut small = [0u8; 8];
        let mut len = small.len() as socklen_t;
        unsafe {
            write_addr(
                AF_INET,
                Ipv4Addr::new(10, 81, 0, 3),
                1,
                small.as_mut_ptr().cast(),
                &mut len,
            )
        };
        assert_eq!(len as usize, std::mem::size_of::<sockaddr_in>());
    }
}
