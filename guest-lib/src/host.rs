//! The host-attach backend: memory from the attach's memfd, commands over
//! its control queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ulnic_abi::{cmd, CreateEndpoint, DeviceInfo, RingLayout};
use ulnic_host_attach::{DmaBuffer, HostAttach};

use crate::backend::{Domain, EpMemory};
use crate::Error;

pub(crate) struct HostDomain {
    hw: Arc<HostAttach>,
    pd: u32,
    /// Memory of each endpoint: control, segment, page table.
    buffers: Mutex<HashMap<u32, [DmaBuffer; 3]>>,
}

impl HostDomain {
    pub fn new(hw: Arc<HostAttach>) -> Result<HostDomain, Error> {
        let r = hw.command(cmd::CREATE_PD, &[])?;
        let pd = r
            .get(..4)
            .map(|b| ulnic_abi::read_le32(b, 0))
            .ok_or(ulnic_host_attach::Error::BadResponse(cmd::CREATE_PD))?;
        Ok(HostDomain {
            hw,
            pd,
            buffers: Mutex::new(HashMap::new()),
        })
    }
}

impl Drop for HostDomain {
    fn drop(&mut self) {
        let _ = self.hw.command(cmd::DESTROY_PD, &self.pd.to_le_bytes());
    }
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
        let segment = mem.alloc(segment_bytes.max(4096))?;
        let pages = segment.len / 4096;
        let table = mem.alloc(pages * 8)?;
        let entries: Vec<u8> = (0..pages as u64)
            .flat_map(|p| (segment.gpa + p * 4096).to_le_bytes())
            .collect();
        mem.write(table.gpa, &entries);
        let req = CreateEndpoint {
            pd: self.pd,
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
        let id = r
            .get(..4)
            .map(|b| ulnic_abi::read_le32(b, 0))
            .ok_or(ulnic_host_attach::Error::BadResponse(cmd::CREATE_ENDPOINT))?;
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
            doorbell: std::ptr::null_mut(),
            doorbell_queue: 0,
        })
    }

    fn destroy_endpoint(&self, ep: &EpMemory) {
        if self
            .hw
            .command(cmd::DESTROY_ENDPOINT, &ep.id.to_le_bytes())
            .is_ok()
        {
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
        self.hw.ring_doorbell(ep.id);
    }

    fn wait(&self, ep: u32, timeout: Duration) -> Result<bool, Error> {
        Ok(self.hw.wait_notification(ep, timeout))
    }
}
