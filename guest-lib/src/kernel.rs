//! The Linux-driver backend: `/dev/ulnicN`, one open file per protection
//! domain (spec §9).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ulnic_abi::bitmap;
use ulnic_abi::wire::{self, IocCommand, IocCreateEp, IocUtlbInstall, IocWait, IocWatch};
use ulnic_abi::{uapi, DeviceInfo, RingLayout};
use zerocopy::{FromZeros, IntoBytes};

use crate::backend::{Domain, EpMemory, UserMemory};
use crate::error::Error;

/// Runs ioctl `req` on `arg`, the argument struct `req` names (its size is
/// encoded in `req`, and ulnic_abi.h asserts both agree).
fn ioctl<T: IntoBytes + zerocopy::FromBytes>(
    f: &File,
    req: u32,
    arg: &mut T,
) -> Result<i32, Error> {
    let bytes = arg.as_mut_bytes();
    // SAFETY: `bytes` is the argument struct, live and writable for the
    // call, of the size encoded in `req`; the driver checks what it reads.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), req as libc::c_ulong, bytes.as_mut_ptr()) };
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

impl Drop for KernelDomain {
    fn drop(&mut self) {
        if !self.doorbell.is_null() {
            let page = ulnic_abi::PAGE_SIZE as usize;
            // SAFETY: the domain's own mappings; endpoints, which copy the
            // doorbell pointer, hold the domain alive until they are gone.
            unsafe {
                libc::munmap(self.doorbell.cast(), page);
                libc::munmap(self.doorbell_bits.cast(), page);
            }
        }
    }
}

/// Reads the device information through a fresh open.
pub(crate) fn device_info(path: &Path) -> Result<DeviceInfo, Error> {
    let f = File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(Error::Os)?;
    let mut info = wire::DeviceInfo::new_zeroed();
    ioctl(&f, uapi::IOC_INFO, &mut info)?;
    Ok(DeviceInfo::decode(info.as_bytes()))
}

pub(crate) struct KernelDomain {
    file: File,
    info: DeviceInfo,
    /// The device's sysfs directory (`/sys/class/misc/ulnicN`).
    sysfs: std::path::PathBuf,
    /// The file's doorbell page and doorbell bitmap mapped here (spec §9),
    /// both or neither; null when doorbells go through `IOC_KICK`.
    doorbell: *mut u8,
    doorbell_bits: *mut u8,
    /// The device number of the file (its watchers' pool).
    rdev: u64,
}

// SAFETY: the pointers name shared mappings owned by the domain for its
// whole life; the bitmap is only touched with atomics, the doorbell page
// with single volatile stores.
unsafe impl Send for KernelDomain {}
// SAFETY: as above.
unsafe impl Sync for KernelDomain {}

impl KernelDomain {
    pub fn open(path: &Path, info: DeviceInfo) -> Result<KernelDomain, Error> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(Error::Os)?;
        let name = path.file_name().unwrap_or_default();
        let rdev = std::os::unix::fs::MetadataExt::rdev(&file.metadata().map_err(Error::Os)?);
        let mut domain = KernelDomain {
            rdev,
            file,
            info,
            sysfs: Path::new("/sys/class/misc").join(name),
            doorbell: std::ptr::null_mut(),
            doorbell_bits: std::ptr::null_mut(),
        };
        // A doorbell page of its own when the driver can give one; ringing
        // is then an atomic OR and a store, not a system call.
        let page = ulnic_abi::PAGE_SIZE as usize;
        if let Ok(bits) = domain.map(uapi::MMAP_DOORBELL_BITS, page) {
            match domain.map(uapi::MMAP_DOORBELL, page) {
                Ok(db) => (domain.doorbell, domain.doorbell_bits) = (db, bits),
                // SAFETY: unmapping the mapping made just above.
                Err(_) => unsafe {
                    libc::munmap(bits.cast(), page);
                },
            }
        }
        Ok(domain)
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
        let mut a = IocCreateEp {
            send_entries: layout.send_entries.into(),
            recv_entries: layout.recv_entries.into(),
            free_entries: layout.free_entries.into(),
            event_entries: layout.event_entries.into(),
            segment_bytes: (segment_bytes as u64).into(),
            ..FromZeros::new_zeroed()
        };
        ioctl(&self.file, uapi::IOC_CREATE_EP, &mut a)?;
        let id = a.id.get();
        let ctrl_len = a.ctrl_len.get() as usize;
        let seg_len = a.segment_len.get() as usize;
        let ctrl = self.map(uapi::mmap_ctrl(id), ctrl_len)?;
        let seg = match self.map(uapi::mmap_ctrl(id) + uapi::MMAP_SEGMENT, seg_len) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: unmapping the mapping made just above.
                unsafe { libc::munmap(ctrl.cast(), ctrl_len) };
                return Err(e);
            }
        };
        Ok(EpMemory {
            id,
            ctrl,
            ctrl_len,
            seg,
            seg_len,
            doorbell_queue: a.doorbell_queue.get() as u16,
        })
    }

    fn destroy_endpoint(&self, ep: &EpMemory) {
        // SAFETY: unmapping the endpoint's own mappings, which no reference
        // outlives (the Endpoint is being dropped).
        unsafe {
            libc::munmap(ep.ctrl.cast(), ep.ctrl_len);
            libc::munmap(ep.seg.cast(), ep.seg_len);
        }
        let mut id = ep.id;
        let _ = ioctl(&self.file, uapi::IOC_DESTROY_EP, &mut id);
    }

    fn ep_command(&self, opcode: u32, payload: &[u8]) -> Result<Vec<u8>, Error> {
        let mut a = IocCommand::new_zeroed();
        let Some(data) = a.data.get_mut(..payload.len()) else {
            return Err(Error::InvalidArgument("command payload too large"));
        };
        data.copy_from_slice(payload);
        a.opcode = opcode.into();
        a.in_len = (payload.len() as u32).into();
        ioctl(&self.file, uapi::IOC_COMMAND, &mut a)?;
        let status = a.status.get();
        if status != ulnic_abi::status::OK {
            return Err(ulnic_host_attach::Error::Command { opcode, status }.into());
        }
        let n = (a.out_len.get() as usize).min(a.data.len());
        Ok(a.data[..n].to_vec())
    }

    fn has_pio(&self) -> bool {
        true // the driver says otherwise (EOPNOTSUPP) when there is none
    }

    fn map_pio(&self, ep: u32, offset: u64, len: u64) -> Result<*mut u8, Error> {
        // The driver maps only a window or import of this file's endpoint
        // at that offset, and no longer than it.
        self.map(uapi::mmap_pio(ep, offset), len as usize)
    }

    fn unmap_pio(&self, ptr: *mut u8, len: usize) {
        // SAFETY: a mapping `map_pio` made, no longer referenced (its
        // window or import is being dropped).
        unsafe { libc::munmap(ptr.cast(), len) };
    }

    fn doorbell_mapped(&self) -> bool {
        !self.doorbell.is_null()
    }

    fn ring_doorbell(&self, ep: &EpMemory) {
        let word = bitmap::word_offset(ep.id) as usize;
        if !self.doorbell.is_null() && word < ulnic_abi::PAGE_SIZE as usize {
            // SAFETY: the file's bitmap page, mapped for the domain's life;
            // `word` is an aligned u64 inside it (checked above); the device
            // clears bits with atomic exchanges, so this is an atomic OR.
            let bits = unsafe { &*self.doorbell_bits.add(word).cast::<AtomicU64>() };
            bits.fetch_or(bitmap::mask(ep.id).to_le(), Ordering::AcqRel);
            // SAFETY: the file's doorbell page, mapped for the domain's
            // life; a 16-bit store of the queue index is the virtio PCI
            // notification (the page is device memory, uncached).
            unsafe {
                std::ptr::write_volatile(self.doorbell.cast::<u16>(), ep.doorbell_queue.to_le())
            };
            return;
        }
        let mut id = ep.id;
        let _ = ioctl(&self.file, uapi::IOC_KICK, &mut id);
    }

    fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn memory_use(&self) -> Option<(u64, u64)> {
        let read = |f: &str| -> Option<u64> {
            std::fs::read_to_string(self.sysfs.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some((read("mem_bytes")?, read("mem_limit_bytes")?))
    }

    fn take_notified(&self) -> Result<Vec<u32>, Error> {
        let mut n = ulnic_abi::wire::IocNotified::new_zeroed();
        ioctl(&self.file, uapi::IOC_TAKE_NOTIFIED, &mut n)?;
        let words = n.bits.iter().enumerate();
        Ok(words
            .flat_map(|(i, w)| bitmap::endpoints(i, w.get()))
            .collect())
    }

    fn wait(&self, ep: u32, timeout: Duration) -> Result<bool, Error> {
        // Zero is a look (the driver does not sleep); anything shorter
        // than a millisecond still waits one.
        let ms = if timeout.is_zero() {
            0
        } else {
            timeout.as_millis().clamp(1, u128::from(u32::MAX)) as u32
        };
        let mut a = IocWait {
            id: ep.into(),
            timeout_ms: ms.into(),
        };
        match ioctl(&self.file, uapi::IOC_WAIT, &mut a) {
            Ok(r) => Ok(r > 0),
            // EINTR stays: a signal ends the wait, as it ends the system
            // call the caller stands for.
            Err(e) => Err(e),
        }
    }

    fn new_watcher(&self) -> Result<std::os::fd::OwnedFd, Error> {
        let mut flags = uapi::WATCHER_CLOEXEC;
        let fd = ioctl(&self.file, uapi::IOC_WATCHER, &mut flags)?;
        // SAFETY: the driver returned a new descriptor that nothing else
        // owns.
        Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
    }

    fn watcher_pool(&self) -> u64 {
        // The device the file belongs to: the driver refuses a watcher of
        // another device.
        self.rdev
    }

    fn watch(&self, ep: u32, watcher: std::os::fd::RawFd, on: bool) -> Result<(), Error> {
        let mut a = IocWatch {
            id: ep.into(),
            watcher: (watcher as u32).into(),
            flags: if on { 0 } else { uapi::WATCH_REMOVE }.into(),
            reserved: 0.into(),
        };
        ioctl(&self.file, uapi::IOC_WATCH, &mut a)?;
        Ok(())
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
        let mut a = entries;
        ioctl(&self.file, uapi::IOC_UTLB_INIT, &mut a)?;
        Ok(())
    }

    fn utlb_install(&self, first: u32, va: usize, count: u32) -> Result<(), Error> {
        let mut a = IocUtlbInstall {
            first: first.into(),
            count: count.into(),
            va: (va as u64).into(),
        };
        ioctl(&self.file, uapi::IOC_UTLB_INSTALL, &mut a)?;
        Ok(())
    }
}
