//! One node's frontend as PIO windows see it (spec §6.2): its backend
//! channel, whether its vhost device runs, its aperture's ranges, and
//! the unmaps it is owed while stopped.

use std::os::fd::AsFd;

use log::warn;
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};

use crate::pio::window::Ranges;

/// What the device knows of one node's frontend.
#[derive(Default)]
pub struct Frontend {
    /// The backend channel (`SET_BACKEND_REQ_FD`); none before it or
    /// after the connection ended.
    pub channel: Option<Backend>,
    /// Between a control-queue kick and a stop, reset or disconnect:
    /// QEMU 11.1.3 crashes reading a map or unmap while stopped.
    pub started: bool,
    /// Its aperture's ranges in use, once it has a channel.
    pub ranges: Option<Ranges>,
    /// Windows mapped into the aperture now.
    pub mapped: u32,
    /// Ranges to unmap once it runs again: offset, length, and whether
    /// the range is free once the unmap is sent.
    pub owed: Vec<(u64, u64, bool)>,
}

impl Frontend {
    /// A new connection's frontend: nothing mapped, nothing owed.
    pub fn connected(&mut self, channel: Backend, aperture: u64) {
        *self = Frontend {
            channel: Some(channel),
            started: self.started,
            ranges: (aperture > 0).then(|| Ranges::new(aperture)),
            ..Frontend::default()
        };
    }
}

fn mmap_request(offset: u64, len: u64) -> VhostUserMMap {
    VhostUserMMap {
        shmid: 0,
        fd_offset: 0,
        shm_offset: offset,
        len,
        flags: VhostUserMMapFlags::WRITABLE.bits(),
        ..Default::default()
    }
}

/// Maps `file` at `offset` of the frontend's aperture; true once the
/// frontend said it did.
pub fn map(channel: &Backend, file: &impl AsFd, offset: u64, len: u64) -> bool {
    match channel.shmem_map(&mmap_request(offset, len), &file.as_fd()) {
        Ok(_) => true,
        Err(e) => {
            warn!("SHMEM_MAP of {len} bytes at {offset:#x} refused: {e}");
            false
        }
    }
}

/// Unmaps the range, then fences: the frontend answers requests in turn
/// and replies to an unmap before the mapping is gone (QEMU 11.1.3), so
/// the second unmap's reply (a failure: nothing is there) proves the
/// first took effect. False when the first was refused.
pub fn unmap(channel: &Backend, offset: u64, len: u64) -> bool {
    let req = mmap_request(offset, len);
    if let Err(e) = channel.shmem_unmap(&req) {
        warn!("SHMEM_UNMAP of {len} bytes at {offset:#x} refused: {e}");
        return false;
    }
    if channel.shmem_unmap(&req).is_ok() {
        warn!("the fence after SHMEM_UNMAP at {offset:#x} found the mapping still there");
    }
    true
}
