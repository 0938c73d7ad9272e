//! The host-attach backend: memory from the attach's memfd, commands over
//! its control queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ulnic_abi::{cmd, wire, CreateEndpoint, DeviceInfo, RingLayout, PAGE_SIZE};
use ulnic_host_attach::{DmaBuffer, HostAttach, ProtectionDomain};
use zerocopy::{FromBytes, IntoBytes};

use crate::backend::{Domain, EpMemory, UserMemory};
use crate::error::Error;

/// A page, as a length.
const PAGE: usize = PAGE_SIZE as usize;
/// Bytes of one page address in a UTLB or segment page table.
const PAGE_ENTRY: usize = ulnic_abi::PAGE_ENTRY_SIZE as usize;

pub(crate) struct HostDomain {
    hw: Arc<HostAttach>,
    domain: ProtectionDomain,
    /// Memory of each endpoint: control, segment, page table.
    buffers: Mutex<HashMap<u32, [DmaBuffer; 3]>>,
    /// User buffers by address, and the UTLB table once created.
    user: Mutex<HashMap<usize, DmaBuffer>>,
    utlb_table: Mutex<Option<(DmaBuffer, u32)>>,
}

impl HostDomain {
    pub fn new(hw: Arc<HostAttach>) -> Result<HostDomain, Error> {
        let domain = hw.create_pd()?;
        Ok(HostDomain {
            hw,
            domain,
            buffers: Mutex::new(HashMap::new()),
            user: Mutex::new(HashMap::new()),
            utlb_table: Mutex::new(None),
        })
    }
}

impl Drop for HostDomain {
    fn drop(&mut self) {
        if self.hw.destroy_pd(&self.domain).is_ok() {
            // The device has let go of the table; user buffers were freed
            // by their owners.
            if let Some((t, _)) = lock(&self.utlb_table).take() {
                self.hw.memory().free(t);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Domain for HostDomain {
    fn info(&self) -> &DeviceInfo {
        self.hw.info()
    }

    fn create_endpoint(
        &self,
        layout: &RingLayout,
        segment_bytes: usize,
    ) -> Result<EpMemory, Error> {
        let mem = self.hw.memory();
        let ctrl = mem.alloc(layout.region_size() as usize)?;
        let segment = mem.alloc(segment_bytes.max(PAGE))?;
        let pages = segment.len / PAGE;
        let table = mem.alloc(pages * PAGE_ENTRY)?;
        let entries: Vec<u8> = (0..pages as u64)
            .flat_map(|p| (segment.gpa + p * PAGE_SIZE).to_le_bytes())
            .collect();
        mem.write(table.gpa, &entries);
        let req = CreateEndpoint {
            pd: self.domain.id,
            send_entries: layout.send_entries,
            recv_entries: layout.recv_entries,
            free_entries: layout.free_entries,
            event_entries: layout.event_entries,
            ctrl_gpa: ctrl.gpa,
            ctrl_len: ctrl.len as u64,
            seg_table_gpa: table.gpa,
            seg_pages: pages as u32,
        };
        let r = match self.hw.command(cmd::CREATE_ENDPOINT, &req.encode()) {
            Ok(r) => r,
            Err(e) => {
                mem.free(ctrl);
                mem.free(segment);
                mem.free(table);
                return Err(e.into());
            }
        };
        let id = wire::EndpointCreated::read_from_prefix(&r)
            .map(|(created, _)| created.id.get())
            .map_err(|_| ulnic_host_attach::Error::BadResponse(cmd::CREATE_ENDPOINT))?;
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, [ctrl, segment, table]);
        Ok(EpMemory {
            id,
            ctrl: ctrl.ptr.as_ptr(),
            ctrl_len: ctrl.len,
            seg: segment.ptr.as_ptr(),
            seg_len: segment.len,
            // The device's kick eventfd is this process's: rung by a call.
            doorbell_queue: 0,
        })
    }

    fn destroy_endpoint(&self, ep: &EpMemory) {
        if self
            .hw
            .command(
                cmd::DESTROY_ENDPOINT,
                wire::ObjectId { id: ep.id.into() }.as_bytes(),
            )
            .is_ok()
        {
            // Its watches go with it, as the driver's do (spec §9).
            self.hw.unwatch_endpoint(ep.id);
            // Only reuse the memory once the device has let go of it.
            if let Some(bufs) = self
                .buffers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&ep.id)
            {
                bufs.into_iter().for_each(|b| self.hw.memory().free(b));
            }
        }
    }

    fn ep_command(&self, opcode: u32, payload: &[u8]) -> Result<Vec<u8>, Error> {
        Ok(self.hw.command(opcode, payload)?)
    }

    fn ring_doorbell(&self, ep: &EpMemory) {
        self.hw.ring_doorbell(&self.domain, ep.id);
    }

    fn wait(&self, ep: u32, timeout: Duration) -> Result<bool, Error> {
        // A signal ends the wait with EINTR, as it ends the system call
        // the caller stands for.
        self.hw
            .wait_notification_interruptible(ep, timeout)
            .map_err(Error::Os)
    }

    fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.hw.notification_fd())
    }

    fn take_notified(&self) -> Result<Vec<u32>, Error> {
        Ok(self.hw.take_notified())
    }

    fn new_watcher(&self) -> Result<std::os::fd::OwnedFd, Error> {
        // SAFETY: plain system call; the descriptor it returns is new.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::Os(std::io::Error::last_os_error()));
        }
        // SAFETY: a new descriptor nothing else owns.
        Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
    }

    fn watch(&self, ep: u32, watcher: std::os::fd::RawFd, on: bool) -> Result<(), Error> {
        self.hw.watch(ep, watcher, on);
        Ok(())
    }

    fn watch_feed(&self) -> Option<std::os::fd::RawFd> {
        self.hw.watch_feedable().then(|| self.hw.notification_fd())
    }

    fn feed_watchers(&self) {
        self.hw.feed_watchers();
    }

    fn watchers_fed(&self) -> bool {
        self.hw.watch_feedable()
    }

    fn has_pio(&self) -> bool {
        self.hw.pio_aperture().is_some()
    }

    fn map_pio(&self, _ep: u32, offset: u64, len: u64) -> Result<*mut u8, Error> {
        // The device mapped it into the aperture already.
        let (base, size) = self
            .hw
            .pio_aperture()
            .ok_or(Error::NotSupported("no PIO aperture"))?;
        match offset.checked_add(len) {
            // SAFETY: inside the aperture (checked), which lives as long
            // as the attachment this domain holds.
            Some(end) if end <= size => Ok(unsafe { base.add(offset as usize) }),
            _ => Err(Error::InvalidArgument(
                "the device placed a window past the aperture",
            )),
        }
    }

    fn memory_use(&self) -> Option<(u64, u64)> {
        let m = self.hw.memory();
        Some((m.in_use() as u64, m.len() as u64))
    }

    fn alloc_user_memory(&self, bytes: usize) -> Result<UserMemory, Error> {
        let b = self.hw.memory().alloc(bytes)?;
        lock(&self.user).insert(b.ptr.as_ptr() as usize, b);
        Ok(UserMemory {
            ptr: b.ptr,
            len: b.len,
        })
    }

    fn free_user_memory(&self, m: &UserMemory) {
        if let Some(b) = lock(&self.user).remove(&(m.ptr.as_ptr() as usize)) {
            self.hw.memory().free(b);
        }
    }

    fn utlb_init(&self, entries: u32) -> Result<(), Error> {
        let mut t = lock(&self.utlb_table);
        if t.is_some() {
            return Err(Error::InvalidArgument("this domain already has a UTLB"));
        }
        let table = self.hw.memory().alloc(entries as usize * PAGE_ENTRY)?;
        let req = wire::UtlbSetTable {
            pd: self.domain.id.into(),
            entries: entries.into(),
            table_gpa: table.gpa.into(),
        };
        if let Err(e) = self.hw.command(cmd::UTLB_SET_TABLE, req.as_bytes()) {
            self.hw.memory().free(table);
            return Err(e.into());
        }
        *t = Some((table, entries));
        Ok(())
    }

    fn utlb_install(&self, first: u32, va: usize, count: u32) -> Result<(), Error> {
        let t = lock(&self.utlb_table);
        let Some((table, entries)) = t.as_ref() else {
            return Err(Error::InvalidArgument("no UTLB: call enable_utlb first"));
        };
        if u64::from(first) + u64::from(count) > u64::from(*entries) {
            return Err(Error::InvalidArgument("UTLB entries past the table"));
        }
        // Host attach "pins" nothing: the device can reach exactly the
        // shared memory, so a page is translatable iff it lies there.
        let mem = self.hw.memory();
        let base = mem.host_base() as usize;
        let end = va.checked_add(count as usize * PAGE);
        if va < base || !va.is_multiple_of(PAGE) || end.is_none_or(|e| e > base + mem.len()) {
            return Err(Error::InvalidArgument(
                "host attach: a UTLB buffer must come from alloc_buffer",
            ));
        }
        let gpas: Vec<u8> = (0..count as usize)
            .flat_map(|k| ((va - base + k * PAGE) as u64).to_le_bytes())
            .collect();
        mem.write(table.gpa + u64::from(first) * PAGE_ENTRY as u64, &gpas);
        let req = wire::UtlbInvalidate {
            pd: self.domain.id.into(),
            first: first.into(),
            count: count.into(),
        };
        self.hw.command(cmd::UTLB_INVALIDATE, req.as_bytes())?;
        Ok(())
    }
}
