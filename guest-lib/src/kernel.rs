//! The Linux-driver backend: `/dev/ulnicN`, one open file per protection
//! domain (spec §9).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use ulnic_abi::{uapi, DeviceInfo, RingLayout};

use crate::backend::{Domain, EpMemory, UserMemory};
use crate::error::Error;

fn ioctl(f: &File, req: u32, arg: *mut u8) -> Result<i32, Error> {
    // SAFETY: `arg` points to a buffer of the size encoded in `req`, valid
    // for the call; the driver checks everything it reads.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), req as libc::c_ulong, arg) };
    if r < 0 {
        return Err(os_error(std::io::Error::last_os_error()));
    }
    Ok(r)
}

/// The driver answers ENODEV once its device was removed, ETIMEDOUT for a
/// command the device did not answer and EIO for every command after that
/// (spec §9).
fn os_error(e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENODEV) => Error::DeviceGone,
        Some(libc::ETIMEDOUT | libc::EIO) => Error::DeviceNotAnswering,
        _ => Error::Os(e),
    }
}

/// Reads the device information through a fresh open.
pub(crate) fn device_info(path: &Path) -> Result<DeviceInfo, Error> {
    let f = File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(Error::Os)?;
    let mut b = [0u8; DeviceInfo::SIZE];
    ioctl(&f, uapi::IOC_INFO, b.as_mut_ptr())?;
    Ok(DeviceInfo::decode(&b))
}

pub(crate) struct KernelDomain {
    file: File,
    info: DeviceInfo,
}

impl KernelDomain {
    pub fn open(path: &Path, info: DeviceInfo) -> Result<KernelDomain, Error> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(Error::Os)?;
        Ok(KernelDomain { file, info })
    }

    fn map(&self, offset: u64, len: usize) -> Result<*mut u8, Error> {
        // The driver checks the offset names one of this file's regions.
        ulnic_host_attach::map_shared(self.file.as_raw_fd(), len, offset).map_err(os_error)
    }
}

impl Domain for KernelDomain {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn create_endpoint(
        &self,
        layout: &RingLayout,
        segment_bytes: usize,
    ) -> Result<EpMemory, Error> {
        let mut a = [0u8; uapi::CREATE_EP_SIZE as usize];
        for (i, v) in [
            layout.send_entries,
            layout.recv_entries,
            layout.free_entries,
            layout.event_entries,
        ]
        .iter()
        .enumerate()
        {
            a[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        a[16..24].copy_from_slice(&(segment_bytes as u64).to_le_bytes());
        ioctl(&self.file, uapi::IOC_CREATE_EP, a.as_mut_ptr())?;
        let id = ulnic_abi::read_le32(&a, 24);
        let ctrl_len = ulnic_abi::read_le64(&a, 32) as usize;
        let seg_len = ulnic_abi::read_le64(&a, 40) as usize;
        let ctrl = self.map(uapi::mmap_ctrl(id), ctrl_len)?;
        let seg = match self.map(uapi::mmap_ctrl(id) + uapi::MMAP_SEGMENT, seg_len) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: unmapping the mapping made just above.
                unsafe { libc::munmap(ctrl.cast(), ctrl_len) };
                return Err(e);
            }
        };
        // A doorbell page of its own when the driver can give one; ringing
        // it is then a store, not a system call.
        let doorbell = self
            .map(
                uapi::mmap_ctrl(id) + uapi::MMAP_DOORBELL,
                ulnic_abi::PAGE_SIZE as usize,
            )
            .unwrap_or(std::ptr::null_mut());
        Ok(EpMemory {
            id,
            ctrl,
            ctrl_len,
            seg,
            seg_len,
            doorbell,
            doorbell_queue: ulnic_abi::read_le32(&a, 28) as u16,
        })
    }

    fn destroy_endpoint(&self, ep: &EpMemory) {
        // SAFETY: unmapping the endpoint's own mappings, which no reference
        // outlives (the Endpoint is being dropped).
        unsafe {
            libc::munmap(ep.ctrl.cast(), ep.ctrl_len);
            libc::munmap(ep.seg.cast(), ep.seg_len);
            if !ep.doorbell.is_null() {
                libc::munmap(ep.doorbell.cast(), ulnic_abi::PAGE_SIZE as usize);
            }
        }
        let mut id = ep.id.to_le_bytes();
        let _ = ioctl(&self.file, uapi::IOC_DESTROY_EP, id.as_mut_ptr());
    }

    fn ep_command(&self, opcode: u32, payload: &[u8]) -> Result<Vec<u8>, Error> {
        let mut a = vec![0u8; uapi::COMMAND_SIZE as usize];
        if payload.len() > a.len() - 16 {
            return Err(Error::InvalidArgument("command payload too large"));
        }
        a[0..4].copy_from_slice(&opcode.to_le_bytes());
        a[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        a[16..16 + payload.len()].copy_from_slice(payload);
        ioctl(&self.file, uapi::IOC_COMMAND, a.as_mut_ptr())?;
        let status = ulnic_abi::read_le32(&a, 4);
        if status != ulnic_abi::status::OK {
            return Err(ulnic_host_attach::Error::Command { opcode, status }.into());
        }
        let n = (ulnic_abi::read_le32(&a, 12) as usize).min(a.len() - 16);
        Ok(a[16..16 + n].to_vec())
    }

    fn ring_doorbell(&self, ep: &EpMemory) {
        if !ep.doorbell.is_null() {
            // SAFETY: the endpoint's own doorbell page, mapped for as long
            // as `ep` lives; a 16-bit store of the queue index is the virtio
            // PCI notification (the page is device memory, uncached).
            unsafe {
                std::ptr::write_volatile(ep.doorbell.cast::<u16>(), ep.doorbell_queue.to_le())
            };
            return;
        }
        let mut id = ep.id.to_le_bytes();
        let _ = ioctl(&self.file, uapi::IOC_KICK, id.as_mut_ptr());
    }

    fn wait(&self, ep: u32, timeout: Duration) -> Result<bool, Error> {
        let mut a = [0u8; 8];
        a[..4].copy_from_slice(&ep.to_le_bytes());
        let ms = timeout.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
        a[4..].copy_from_slice(&ms.to_le_bytes());
        match ioctl(&self.file, uapi::IOC_WAIT, a.as_mut_ptr()) {
            Ok(r) => Ok(r > 0),
            Err(Error::Os(e)) if e.kind() == std::io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn alloc_user_memory(&self, bytes: usize) -> Result<UserMemory, Error> {
        let len = bytes.max(1).next_multiple_of(ulnic_abi::PAGE_SIZE as usize);
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Os(std::io::Error::last_os_error()));
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or(Error::InvalidArgument("mmap returned null"))?;
        Ok(UserMemory { ptr, len })
    }

    fn free_user_memory(&self, m: &UserMemory) {
        // SAFETY: the mapping from `alloc_user_memory`, no longer referenced
        // (its UserBuffer is being dropped). Pages the driver pinned stay
        // allocated until their UTLB entries are replaced or the file closes.
        unsafe { libc::munmap(m.ptr.as_ptr().cast(), m.len) };
    }

    fn utlb_init(&self, entries: u32) -> Result<(), Error> {
        let mut a = entries.to_le_bytes();
        ioctl(&self.file, uapi::IOC_UTLB_INIT, a.as_mut_ptr())?;
        Ok(())
    }

    fn utlb_install(&self, first: u32, va: usize, count: u32) -> Result<(), Error> {
        let mut a = [0u8; 16];
        a[0..4].copy_from_slice(&first.to_le_bytes());
        a[4..8].copy_from_slice(&count.to_le_bytes());
        a[8..16].copy_from_slice(&(va as u64).to_le_bytes());
        ioctl(&self.file, uapi::IOC_UTLB_INSTALL, a.as_mut_ptr())?;
        Ok(())
    }
}
