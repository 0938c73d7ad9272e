//! The process's PIO aperture (spec §6.2): an address range reserved
//! inaccessible, into which the device maps PIO windows over the
//! backend channel, served by a thread of its own.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use log::{debug, warn};
use ulnic_abi::PAGE_SIZE;
use vhost::vhost_user::message::VhostUserMMap;
use vhost::vhost_user::{
    Frontend, FrontendReqHandler, HandlerResult, VhostUserFrontend, VhostUserFrontendReqHandler,
};

use crate::error::Error;

/// The reserved range and the windows mapped in it.
struct Range {
    base: usize,
    len: u64,
    /// Offset to length of each mapping.
    maps: Mutex<BTreeMap<u64, u64>>,
}

fn refuse(why: &str) -> io::Error {
    warn!("PIO aperture: {why}");
    io::Error::from_raw_os_error(libc::EINVAL)
}

impl VhostUserFrontendReqHandler for Range {
    fn shmem_map(&self, req: &VhostUserMMap, fd: &dyn AsRawFd) -> HandlerResult<u64> {
        let (shmid, off, len, fd_off) = (req.shmid, req.shm_offset, req.len, req.fd_offset);
        let aligned = |v: u64| v.is_multiple_of(PAGE_SIZE);
        if shmid != 0 || len == 0 || !aligned(off) || !aligned(len) || !aligned(fd_off) {
            return Err(refuse("a map that is not page-aligned or not in region 0"));
        }
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(refuse("a map past the aperture's end"));
        }
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        let before = maps.range(..off + len).next_back();
        if before.is_some_and(|(&o, &l)| o + l > off) {
            return Err(refuse("a map over another"));
        }
        // SAFETY: [base + off, + len) lies in the range this process
        // reserved for the aperture and maps nothing else (checked above),
        // so MAP_FIXED replaces only the reservation's own pages.
        let p = unsafe {
            libc::mmap(
                (self.base + off as usize) as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                fd_off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Not inherited by a forked child: only this process's handler
        // can take the window away again (spec §6.2), as the guest
        // driver's VM_DONTCOPY does. A failure leaves the copy inherited.
        // SAFETY: the range just mapped; advice changes no contents.
        unsafe { libc::madvise(p, len as usize, libc::MADV_DONTFORK) };
        maps.insert(off, len);
        debug!("PIO aperture: {len} bytes mapped at {off:#x}");
        Ok(0)
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> HandlerResult<u64> {
        let (off, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if maps.get(&off) != Some(&len) {
            // The device's fence after an unmap lands here, as it should.
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        // SAFETY: the range is one mapping this handler made inside the
        // reservation; it becomes reserved and inaccessible again, so a
        // store through a stale pointer faults instead of reaching anything.
        let p = unsafe {
            libc::mmap(
                (self.base + off as usize) as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        maps.remove(&off);
        debug!("PIO aperture: {len} bytes at {off:#x} unmapped");
        Ok(0)
    }
}

/// The aperture and the thread serving the device's requests on it.
pub struct Aperture {
    range: Arc<Range>,
    /// Our end of the backend channel, shut down to end the thread.
    channel: RawFd,
    /// Told before the channel is shut down: the thread may return.
    closing: std::sync::mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
    /// The process that serves the channel (a forked child's copy of
    /// this has no thread, and must not shut the parent's channel).
    owner: u32,
}

impl Aperture {
    /// Reserves `len` bytes, gives the device the backend channel and
    /// starts serving it.
    pub fn serve(fe: &mut Frontend, len: u64) -> Result<Aperture, Error> {
        // SAFETY: a fresh anonymous reservation; nothing is at its address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::Os {
                what: "PIO aperture reservation",
                source: io::Error::last_os_error(),
            });
        }
        let range = Arc::new(Range {
            base: base as usize,
            len,
            maps: Mutex::new(BTreeMap::new()),
        });
        let mut handler = FrontendReqHandler::new(range.clone()).map_err(|e| Error::Protocol {
            step: "backend channel",
            source: vhost::Error::VhostUserProtocol(e),
        })?;
        handler.set_reply_ack_flag(true);
        fe.set_backend_request_fd(&handler.get_tx_raw_fd())
            .map_err(|source| Error::Protocol {
                step: "SET_BACKEND_REQ_FD",
                source,
            })?;
        let channel = handler.as_raw_fd();
        let (closing, closed) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ulnic-pio".into())
            .spawn(move || serve_requests(handler, closed))
            .map_err(|source| Error::Os {
                what: "PIO aperture thread",
                source,
            })?;
        Ok(Aperture {
            range,
            channel,
            closing,
            thread: Some(thread),
            owner: std::process::id(),
        })
    }

    /// The aperture's first byte; windows are at offsets the device
    /// names.
    pub fn base(&self) -> *mut u8 {
        self.range.base as *mut u8
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.range.len
    }
}

/// Answers the device's map and unmap requests until `Aperture`'s drop
/// shuts the channel down. (The handler keeps the channel's other end
/// open, so the device's leaving does not end it.) The handler, and so
/// the channel's descriptor, lives until `closed` says the drop is done
/// with it.
fn serve_requests(mut handler: FrontendReqHandler<Range>, closed: std::sync::mpsc::Receiver<()>) {
    use vhost::vhost_user::Error as E;
    loop {
        match handler.handle_request() {
            Ok(_) | Err(E::ReqHandlerError(_)) => {}
            Err(E::InvalidMessage | E::InvalidParam) => {
                warn!("PIO aperture: a malformed request from the device, ignored");
            }
            Err(e) => {
                debug!("PIO aperture: the backend channel ended: {e}");
                let _ = closed.recv();
                return;
            }
        }
    }
}

impl Drop for Aperture {
    fn drop(&mut self) {
        if std::process::id() != self.owner {
            // A forked child: the thread and the channel are the parent's
            // (the socket is shared; shutting it down would cut the
            // parent's). Its copy of the windows goes with its exit.
            std::mem::forget(self.thread.take());
            return;
        }
        // SAFETY: `channel` belongs to the handler, which the thread owns
        // until it returns; it returns only after `closing` is dropped
        // (below), so the descriptor is still open here.
        unsafe { libc::shutdown(self.channel, libc::SHUT_RDWR) };
        let (gone, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.closing, gone));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: the reservation is this process's own; nothing else
        // lives in it, and no window pointer outlives the attachment
        // (the library's windows borrow it).
        unsafe {
            libc::munmap(
                self.range.base as *mut libc::c_void,
                self.range.len as usize,
            )
        };
    }
}
