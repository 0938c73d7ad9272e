//! A node's virtqueue: the vhost-user crate's `VringRwLock`, except that a
//! kick is read so that the frontend cannot hold the device (spec §8).
//!
//! The crate reads a kicked queue's eventfd with a plain read while it holds
//! the queue's lock. A frontend that made its kick eventfd blocking and reads
//! it itself between the device's epoll and that read leaves the read asleep
//! with the lock held; the engine, which takes the same lock to post a
//! notification, would then wait for ever, holding the shard. Here the read
//! goes through [`notifier::consume`], which the watchdog ends: an empty
//! non-blocking eventfd is a kick already taken (nothing to do), and a read
//! that slept, or failed otherwise, marks the queue (`kick_failed`); the
//! node's backend then frees the node's state and ends the connection
//! (spec §8). Only that frontend's node stops being served.
//!
//! Kicks are checked when they are given (spec §2.4): only an eventfd is a
//! kick, and only for a queue that has not started. The crate registers a
//! kick with its epoll only when it starts the queue, so a kick of another
//! kind would fail there and one for a started queue would never be read:
//! either is replaced by a file epoll refuses, so the message that starts
//! the queue fails and the connection ends, instead of being acknowledged
//! for a queue that never runs.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use log::warn;
use vhost_user_backend::{VringRwLock, VringState, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as VirtQueError, QueueT};
use vm_memory::GuestAddressSpace;

use crate::notifier::{self, ConsumeError};

/// Kicks read from their eventfd and not yet acted on, in this process:
/// `Device::settle` waits for none (a kick taken but not yet recorded
/// would otherwise look like no kick at all).
static KICKS_IN_HAND: AtomicU64 = AtomicU64::new(0);

/// Kicks read and not yet acted on (see `KICKS_IN_HAND`).
pub fn kicks_in_hand() -> u64 {
    KICKS_IN_HAND.load(Ordering::SeqCst)
}

/// A kick read by `read_kick` was acted on (the backend's `handle_event`
/// ran for it).
pub fn kick_served() {
    let _ = KICKS_IN_HAND.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
}

/// A node's virtqueue (see the module's comment).
#[derive(Clone)]
pub struct NodeVring<M: GuestAddressSpace>(VringRwLock<M>, Arc<AtomicBool>);

impl<M: GuestAddressSpace> NodeVring<M> {
    /// Whether reading this queue's kick failed (the frontend made the
    /// read sleep, or the kick cannot be read): its connection must end.
    pub fn kick_failed(&self) -> bool {
        self.1.load(Ordering::Acquire)
    }
}

impl<M: 'static + GuestAddressSpace> NodeVring<M> {
    /// `read_kick`'s work, once the kick is counted in hand.
    fn read_kick_counted(&self) -> io::Result<bool> {
        let state = self.0.get_ref();
        if let Some(kick) = state.get_kick() {
            match notifier::consume(kick.as_raw_fd()) {
                Ok(()) | Err(ConsumeError::Empty) => {}
                Err(e) => {
                    warn!("a queue's kick: {e}; ending this connection");
                    self.1.store(true, Ordering::Release);
                    return Ok(true);
                }
            }
        }
        Ok(state.is_enabled())
    }
}

/// Whether `file` is an eventfd (what Linux shows for it in /proc).
fn is_eventfd(file: &impl AsRawFd) -> bool {
    match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(target) => target.as_os_str() == "anon_inode:[eventfd]",
        // Without /proc the kind cannot be told: accepted, as before.
        Err(_) => true,
    }
}

/// A file epoll refuses to watch (a memfd, a regular file): given to a
/// queue instead of a kick the device refuses, so that starting the queue
/// fails.
fn unwatchable() -> Option<File> {
    // SAFETY: a valid NUL-terminated name; the descriptor returned is new
    // and owned by nothing else.
    let fd = unsafe { libc::memfd_create(c"ulnic-refused-kick".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: as above; checked non-negative.
    (fd >= 0).then(|| unsafe { File::from_raw_fd(fd) })
}

impl<'a, M: 'a + GuestAddressSpace> VringStateGuard<'a, M> for NodeVring<M> {
    type G = <VringRwLock<M> as VringStateGuard<'a, M>>::G;
}

impl<'a, M: 'a + GuestAddressSpace> VringStateMutGuard<'a, M> for NodeVring<M> {
    type G = <VringRwLock<M> as VringStateMutGuard<'a, M>>::G;
}

impl<M: 'static + GuestAddressSpace> VringT<M> for NodeVring<M> {
    fn new(mem: M, max_queue_size: u16) -> Result<Self, VirtQueError> {
        VringRwLock::new(mem, max_queue_size).map(|v| NodeVring(v, Arc::default()))
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, M>>::G {
        self.0.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, M>>::G {
        self.0.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        self.0.add_used(desc_index, len)
    }

    /// Through the notifier, like every signal the device sends.
    fn signal_used_queue(&self) -> io::Result<()> {
        signal_call(&self.0.get_ref()).map_err(io::Error::other)
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        self.0.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        self.0.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        self.0.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.0.set_enabled(enabled)
    }

    fn set_queue_info(
        &self,
        desc_table: u64,
        avail_ring: u64,
        used_ring: u64,
    ) -> Result<(), VirtQueError> {
        self.0.set_queue_info(desc_table, avail_ring, used_ring)
    }

    fn queue_next_avail(&self) -> u16 {
        self.0.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.0.set_queue_next_avail(base)
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.0.set_queue_next_used(idx)
    }

    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        self.0.queue_used_idx()
    }

    fn set_queue_size(&self, num: u16) {
        self.0.set_queue_size(num)
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.0.set_queue_event_idx(enabled)
    }

    fn set_queue_ready(&self, ready: bool) {
        self.0.set_queue_ready(ready)
    }

    /// Checks a new kick (see the module's comment). `None` also comes
    /// from the crate itself when a queue stops, so it cannot be refused:
    /// a queue given no kick (vhost-user's polling) never starts.
    fn set_kick(&self, file: Option<File>) {
        let Some(file) = file else {
            return self.0.set_kick(None);
        };
        let refused = if !is_eventfd(&file) {
            Some("is not an eventfd")
        } else if self.0.get_ref().get_queue().ready() {
            Some("is for a queue that has started (stop it first)")
        } else {
            None
        };
        let Some(why) = refused else {
            return self.0.set_kick(Some(file));
        };
        warn!("a queue's new kick {why}: refused; starting the queue will fail");
        match unwatchable() {
            Some(refusal) => {
                // Started again on the refusal, whose registration fails.
                self.0.set_queue_ready(false);
                self.0.set_kick(Some(refusal));
            }
            None => self.0.set_kick(Some(file)),
        }
    }

    /// Takes the kick through [`notifier::consume`] (see the module's
    /// comment); whether the queue is enabled. A read that slept or failed
    /// marks the queue and reports it enabled, so that the backend's
    /// `handle_event` runs and ends the connection.
    fn read_kick(&self) -> io::Result<bool> {
        // Counted before the read, so that from the moment the frontend
        // sees its kick taken, the kick is either in hand or acted on.
        KICKS_IN_HAND.fetch_add(1, Ordering::SeqCst);
        let enabled = self.read_kick_counted();
        if !matches!(enabled, Ok(true)) {
            // `handle_event` will not run for it.
            kick_served();
        }
        enabled
    }

    fn set_call(&self, file: Option<File>) {
        self.0.set_call(file)
    }

    fn set_err(&self, file: Option<File>) {
        self.0.set_err(file)
    }
}

/// Signals the queue's call eventfd, if it has one, through the notifier.
pub fn signal_call<M: GuestAddressSpace>(
    state: &VringState<M>,
) -> Result<(), notifier::SignalError> {
    match state.get_call() {
        Some(call) => notifier::signal(call.as_raw_fd()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    type Mem = GuestMemoryAtomic<GuestMemoryMmap<()>>;

    fn vring() -> NodeVring<Mem> {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let v = NodeVring::new(GuestMemoryAtomic::new(mem), 16).unwrap();
        v.set_enabled(true);
        v
    }

    fn file(e: &EventFd) -> File {
        use std::os::fd::{FromRawFd, IntoRawFd};
        // SAFETY: the clone's descriptor is fresh and owned by nothing else
        // once into_raw_fd gives it up.
        unsafe { File::from_raw_fd(e.try_clone().unwrap().into_raw_fd()) }
    }

    #[test]
    fn a_kick_is_taken_and_one_already_taken_is_nothing() {
        notifier::install();
        let v = vring();
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        v.set_kick(Some(file(&kick)));
        kick.write(1).unwrap();
        assert!(v.read_kick().unwrap());
        // Empty now (as if the frontend had read it first): not an error.
        assert!(v.read_kick().unwrap());
    }

    #[test]
    fn a_kick_read_the_frontend_made_sleep_ends_and_lets_the_queue_go() {
        notifier::install();
        // Run aside: a read that is never ended would hang, not fail.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let v = vring();
            // Blocking and empty: the frontend took the count after epoll
            // saw it.
            let kick = EventFd::new(0).unwrap();
            v.set_kick(Some(file(&kick)));
            let failed = v.read_kick().unwrap() && v.kick_failed();
            // The queue's lock was let go: the engine can take it.
            drop(v.get_mut());
            let _ = done.send(failed);
        });
        let failed = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the kick read still sleeps after 60 s");
        assert!(failed);
    }

    /// Whether the queue's kick is `e` (the same eventfd, by its count).
    fn kick_is(v: &NodeVring<Mem>, e: &EventFd) -> bool {
        let state = v.get_ref();
        let Some(kick) = state.get_kick() else {
            return false;
        };
        e.write(1).unwrap();
        let mut b = [0u8; 8];
        let same = nix_read(kick.as_raw_fd(), &mut b) == 8 && u64::from_ne_bytes(b) == 1;
        let _ = e.read();
        same
    }

    fn nix_read(fd: i32, b: &mut [u8; 8]) -> isize {
        // SAFETY: `b` is 8 writable bytes for the duration of the call.
        unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) }
    }

    #[test]
    fn only_an_eventfd_for_a_queue_not_started_is_a_kick() {
        let v = vring();
        // An eventfd for a queue that has not started: taken.
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        v.set_kick(Some(file(&kick)));
        assert!(kick_is(&v, &kick));
        assert!(!v.get_ref().get_queue().ready());
        // A regular file: replaced by one epoll refuses.
        let regular = tempfile::tempfile().unwrap();
        v.set_kick(Some(regular));
        let refused = v.get_ref().get_kick().as_ref().map(is_eventfd);
        assert_eq!(refused, Some(false), "a kick that is no eventfd");
        assert!(!v.get_ref().get_queue().ready());
        // A new eventfd for a started queue: refused the same way, and the
        // queue is not started any more (starting it again fails).
        v.set_kick(Some(file(&kick)));
        v.set_queue_ready(true);
        let other = EventFd::new(EFD_NONBLOCK).unwrap();
        v.set_kick(Some(file(&other)));
        assert!(!kick_is(&v, &other));
        assert!(!v.get_ref().get_queue().ready());
        let epoll = vmm_sys_util::epoll::Epoll::new().unwrap();
        let fd = v.get_ref().get_kick().as_ref().unwrap().as_raw_fd();
        let watched = epoll.ctl(
            vmm_sys_util::epoll::ControlOperation::Add,
            fd,
            vmm_sys_util::epoll::EpollEvent::new(vmm_sys_util::epoll::EventSet::IN, 0),
        );
        assert!(watched.is_err(), "epoll watched the refusal");
        // No kick at all (the crate stopping the queue): accepted.
        v.set_kick(None);
        assert!(v.get_ref().get_kick().is_none());
    }

    #[test]
    fn signals_go_through_the_notifier() {
        notifier::install();
        let v = vring();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        v.set_call(Some(file(&call)));
        v.signal_used_queue().unwrap();
        assert_eq!(call.read().unwrap(), 1);
        call.write(u64::MAX - 1).unwrap();
        assert!(v.signal_used_queue().is_err());
    }
}
