//! PIO windows as a benchmark link (docs/spec.md §6.2): each peer
//! exports a window holding the ring it receives on and imports the
//! other's, so a message is plain stores into the peer's memory: no
//! descriptor, no doorbell, no device step. The grants cross as ulnic
//! messages. Polling, a receiver spins on its ring; blocking, it sleeps
//! on a tripwire over its ring's head word, which the sender fires with
//! a PIO_SYNC after its stores (one descriptor a message, spec §6.2).

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use ulnic::{Address, Endpoint, Nic, Payload, PioGrant, PioImport, PioWindow};

use super::link::{Link, Mode, ShmLink, ShmRing, SHM_RING};

/// The port each peer's endpoint binds for the grant exchange.
const GRANT_PORT: u32 = 7;
/// The tag of a grant message.
const TAG_GRANT: u32 = 0x9107;

/// A ping-pong link over two PIO windows.
pub struct PioLink {
    link: ShmLink,
    mode: Mode,
    /// The peer's window, for the syncs that wake it.
    peer: PioGrant,
    /// The receive ring's head word (blocking: the tripwire's range).
    head: *const std::sync::atomic::AtomicU64,
    tail: u64,
    // Dropped after `link`: the windows outlive every access.
    _import: PioImport,
    _window: PioWindow,
    ep: Endpoint,
    _nic: Nic,
}

fn os(e: ulnic::Error) -> io::Error {
    io::Error::from(e)
}

/// The peer's grant, if a message with it waits.
fn poll_grant(ep: &mut Endpoint) -> Option<PioGrant> {
    while ep.poll_event().is_some() {}
    let m = ep.poll_recv()?;
    if let (TAG_GRANT, 16, Payload::Inline(data), false) = (m.tag, m.len, m.payload, m.returned) {
        let mut b = [0u8; 16];
        b.copy_from_slice(&data[..16]);
        return Some(PioGrant::from_bytes(&b));
    }
    None
}

/// The peer's grant, once it arrives.
fn take_grant(ep: &mut Endpoint, deadline: Instant) -> io::Result<PioGrant> {
    loop {
        if let Some(g) = poll_grant(ep) {
            return Ok(g);
        }
        if Instant::now() > deadline {
            return Err(io::Error::other("the peer never sent its PIO grant"));
        }
        std::thread::yield_now();
    }
}

impl PioLink {
    /// Attaches to the node socket `sock` (inside a guest, `None`: the
    /// device file), exports this side's window to node `peer`, then (the
    /// server after calling `ready`) trades grants and maps the peer's
    /// window.
    pub fn open(
        sock: Option<&Path>,
        peer: u32,
        server: bool,
        mode: Mode,
        ready: &mut dyn FnMut(),
    ) -> io::Result<PioLink> {
        let nic = match sock {
            Some(s) => Nic::attach(s),
            None => Nic::open(),
        }
        .map_err(os)?;
        let mut ep = nic
            .alloc_pd()
            .and_then(|pd| pd.create_endpoint(&Default::default()))
            .map_err(os)?;
        ep.bind(GRANT_PORT).map_err(os)?;
        let window = ep.export_pio(128 + SHM_RING, Some(peer)).map_err(os)?;
        if mode == Mode::Block {
            // The peer's sync after each message fires it (and wakes us).
            ep.set_pio_tripwire(&window, 0, 8, true, 0).map_err(os)?;
        }
        let to = Address {
            node: peer,
            port: GRANT_PORT,
        };
        let mine = window.grant().to_bytes();
        let deadline = Instant::now() + Duration::from_secs(120);
        let theirs = if server {
            ready();
            let g = take_grant(&mut ep, deadline)?;
            ep.post_send_inline(to, TAG_GRANT, &mine, 0).map_err(os)?;
            g
        } else {
            // Guests come up at different times: the grant is sent again
            // until the server's comes (a copy sent before the server
            // bound its port comes back and is ignored).
            let mut sent = Instant::now() - Duration::from_secs(1);
            loop {
                if sent.elapsed() > Duration::from_millis(200) && ep.send_space() > 0 {
                    ep.post_send_inline(to, TAG_GRANT, &mine, 0).map_err(os)?;
                    sent = Instant::now();
                }
                if let Some(g) = poll_grant(&mut ep) {
                    break g;
                }
                if Instant::now() > deadline {
                    return Err(io::Error::other("the peer never sent its PIO grant"));
                }
                std::thread::yield_now();
            }
        };
        let import = ep.import_pio(theirs).map_err(os)?;
        let link = ShmLink::over(
            ShmRing {
                base: import.as_ptr(),
            },
            ShmRing {
                base: window.as_ptr(),
            },
        );
        Ok(PioLink {
            link,
            mode,
            peer: theirs,
            head: window.word(0),
            tail: 0,
            _import: import,
            _window: window,
            ep,
            _nic: nic,
        })
    }

    /// Blocking: sleeps until the ring's head moves past `self.tail`.
    fn await_data(&mut self) -> io::Result<()> {
        use std::sync::atomic::Ordering;
        // SAFETY: the head word of our own window, mapped while `self` is.
        let head = unsafe { &*self.head };
        loop {
            if head.load(Ordering::Acquire) != self.tail {
                return Ok(());
            }
            // Returns at once while a tripwire event waits; taking the
            // events re-enables the tripwire.
            self.ep.wait(Duration::from_secs(1)).map_err(os)?;
            while self.ep.poll_event().is_some() {}
        }
    }
}

impl Link for PioLink {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        self.link.send(data)?;
        if self.mode == Mode::Block {
            // After the stores: whoever the tripwire wakes sees them.
            loop {
                match self.ep.pio_sync(&self.peer, 0, 8, 0, false) {
                    Ok(()) => break,
                    Err(ulnic::Error::WouldBlock) => std::thread::yield_now(),
                    Err(e) => return Err(os(e)),
                }
            }
        }
        Ok(())
    }
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.mode == Mode::Block {
            self.await_data()?;
        }
        let n = self.link.recv(buf)?;
        self.tail += 4 + n as u64;
        Ok(n)
    }
    fn mode(&self) -> Mode {
        self.mode
    }
}
