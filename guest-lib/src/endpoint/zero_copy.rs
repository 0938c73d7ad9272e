//! Transfers from user buffers named through the UTLB (spec §5.14): sends
//! and RDMA whose local side is any registered memory, not the segment.
//!
//! Every descriptor that names UTLB entries holds them (a count per entry)
//! until the device's send consumer passes it, so the library never
//! reinstalls an entry the device may still read (VMMC-2's requirement,
//! kept by reference counts rather than Schoinas & Hill's table-size rule).

use std::ops::Range;
use std::sync::atomic::Ordering;

use ulnic_abi::{
    cmd, ctrl, op, send_flags, Cookie, RdmaDesc, SendDesc, RDMA_UTLB_REF_OFFSET, SEND_DESC_SIZE,
    SEND_UTLB_REF_OFFSET,
};

use super::Endpoint;
use crate::error::Error;
use crate::staging::{Bounce, InFlight, Local};
use crate::types::Address;
use crate::utlb::{lock, Translation, UserBuffer, UtlbRef};
use ulnic_abi::wire;
use zerocopy::little_endian::U32;
use zerocopy::{FromZeros, IntoBytes};

impl Endpoint {
    /// Releases everything (the endpoint is going away).
    pub(crate) fn release_utlb(&mut self) {
        let Some(t) = self.utlb.get() else { return };
        let mut t = lock(t);
        for f in self.zc.in_flight.drain(..) {
            t.release(&f.entries);
        }
        for (_, r) in self.zc.redirects.drain() {
            t.release(&r);
        }
        let exports = std::mem::take(self.zc.exports.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (_, r) in exports {
            t.release(&r);
        }
        if let Some(b) = self.zc.bounce.take() {
            t.release(&b.entries);
            let (va, len) = (b.mem.ptr.as_ptr() as usize, b.mem.len);
            t.forget(va, len);
            drop(t);
            self.dom.free_user_memory(&b.mem);
        }
    }

    /// Finds (or makes) the translation of `[va, va+len)`; with `copy`
    /// allowed, a miss may be served by copying into the bounce buffer.
    fn local_for(&mut self, va: usize, len: usize, copy: bool) -> Result<Local, Error> {
        let done = u32::from_le(self.word(ctrl::SEND_CONSUMER).load(Ordering::Acquire));
        let table = self.utlb.get().ok_or(Error::InvalidArgument(
            "no UTLB: call enable_utlb on the domain",
        ))?;
        // One lock per post: retire finished descriptors, then look up.
        let mut t = lock(table);
        self.zc.reap(done, &mut t);
        if self.send_space() == 0 {
            return Err(Error::WouldBlock);
        }
        t.stats.lookups += 1;
        t.transferred(len as u64);
        if let Some(r) = t.lookup(va, len) {
            t.stats.hits += 1;
            t.acquire(&r);
            t.service_deferred(&*self.dom);
            return Ok(Local {
                entries: r,
                bounce: None,
                how: Translation::Hit,
            });
        }
        t.stats.misses += 1;
        let cfg = t.cfg;
        let mut t = if copy && cfg.fallback && len <= cfg.bounce_bytes {
            // The copy needs the endpoint, not the table: unlock meanwhile.
            drop(t);
            let copied = self.copy_to_bounce(va, len)?;
            let mut t = lock(self.utlb.get().ok_or(Error::WouldBlock)?);
            if let Some(local) = copied {
                t.stats.fallback_sends += 1;
                t.stats.fallback_bytes += len as u64;
                t.defer(va, len);
                // After the copy, off this message's critical path.
                t.service_deferred(&*self.dom);
                return Ok(local);
            }
            t
        } else {
            t
        };
        let r = t.install(&*self.dom, va, len)?;
        t.acquire(&r);
        Ok(Local {
            entries: r,
            bounce: None,
            how: Translation::Miss,
        })
    }

    /// Copies the bytes into the bounce ring; `None` when it has no room
    /// now (the caller then services the miss instead).
    fn copy_to_bounce(&mut self, va: usize, len: usize) -> Result<Option<Local>, Error> {
        if self.zc.bounce.is_none() {
            self.zc.bounce = Some(self.make_bounce()?);
        }
        let b = self.zc.bounce.as_mut().ok_or(Error::WouldBlock)?;
        let cap = b.mem.len as u64;
        let mut at = b.head;
        if at % cap + len as u64 > cap {
            at = at.next_multiple_of(cap); // do not split a message
        }
        if at + len as u64 - b.tail > cap {
            return Ok(None);
        }
        let off = (at % cap) as usize;
        // SAFETY: `va..va+len` lies in a live UserBuffer (checked by the
        // caller's `span`); `off + len <= cap` lies in the bounce mapping,
        // which no retired-or-posted descriptor covers (ring accounting).
        unsafe {
            std::ptr::copy_nonoverlapping(va as *const u8, b.mem.ptr.as_ptr().add(off), len);
        }
        let before = b.head;
        b.head = at + len as u64;
        let base = b.entries;
        let page = ulnic_abi::PAGE_SIZE as usize;
        let (first_page, offset) = (off / page, (off % page) as u64);
        let count = (offset as usize + len).div_ceil(page) as u32;
        let entries = UtlbRef {
            first: base.first + first_page as u32,
            count,
            offset,
        };
        // The bounce entries are held for the endpoint's life; take one
        // more hold so the accounting stays uniform.
        if let Some(t) = self.utlb.get() {
            lock(t).acquire(&entries);
        }
        Ok(Some(Local {
            entries,
            bounce: Some((before, at + len as u64)),
            how: Translation::Fallback,
        }))
    }

    /// Registers the bounce buffer ahead of the first miss when the
    /// domain's UTLB falls back (best effort: a table with no room now
    /// gets it registered at the first fallback instead).
    pub(crate) fn prepare_bounce(&mut self) {
        let falls_back = self.utlb.get().is_some_and(|t| lock(t).cfg.fallback);
        if falls_back && self.zc.bounce.is_none() {
            self.zc.bounce = self.make_bounce().ok();
        }
    }

    fn make_bounce(&mut self) -> Result<Bounce, Error> {
        let t = self.utlb.get().ok_or(Error::WouldBlock)?;
        let bytes = lock(t).cfg.bounce_bytes;
        let mem = self.dom.alloc_user_memory(bytes)?;
        let mut t = lock(t);
        let entries = match t.install(&*self.dom, mem.ptr.as_ptr() as usize, mem.len) {
            Ok(r) => r,
            Err(e) => {
                drop(t);
                self.dom.free_user_memory(&mem);
                return Err(e);
            }
        };
        t.acquire(&entries); // never recycled while the endpoint lives
        Ok(Bounce {
            mem,
            entries,
            head: 0,
            tail: 0,
        })
    }

    fn post_with(
        &mut self,
        mut slot: [u8; SEND_DESC_SIZE as usize],
        at: usize,
        local: Local,
    ) -> Result<Translation, Error> {
        // (first entry, entry count), as every layout places them at `at`.
        let entries: [U32; 2] = [local.entries.first.into(), local.entries.count.into()];
        let end = at + entries.as_bytes().len();
        slot[at..end].copy_from_slice(entries.as_bytes());
        let seq = self.send_producer;
        match self.push_slot(&slot[..end]) {
            Ok(()) => {
                self.zc.in_flight.push_back(InFlight {
                    seq,
                    entries: local.entries,
                    bounce_end: local.bounce.map(|(_, end)| end),
                });
                Ok(local.how)
            }
            Err(e) => {
                // Nothing was posted: give back the holds and the copy.
                if let Some(t) = self.utlb.get() {
                    lock(t).release(&local.entries);
                }
                if let (Some(b), Some((before, _))) = (self.zc.bounce.as_mut(), local.bounce) {
                    b.head = before;
                }
                Err(e)
            }
        }
    }

    /// Sends `range` of `buf` to `dest` without copying it into the
    /// segment: the device reads it through the domain's UTLB (VMMC-2's
    /// send from any user buffer). A page not installed yet is a miss:
    /// serviced before sending, or (with fallback) copied through the
    /// bounce buffer; the result says which. Keep `buf` alive until the
    /// send retires ([`Endpoint::sends_done`] or its completion event).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// pd.enable_utlb(Default::default())?;
    /// let mut ep = pd.create_endpoint(&Default::default())?;
    /// let mut buf = pd.alloc_buffer(65536)?;
    /// buf.as_mut_slice()[..5].copy_from_slice(b"hello");
    /// let how = ep.post_send_buffer(ulnic::Address { node: 1, port: 7 }, 0, &buf, 0..5, 1, true)?;
    /// println!("{how:?}");
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_send_buffer(
        &mut self,
        dest: Address,
        tag: u32,
        buf: &UserBuffer,
        range: Range<usize>,
        id: u64,
        completion: bool,
    ) -> Result<Translation, Error> {
        let (va, len) = buf.span(&range)?;
        if len > self.dom.info().max_message as usize {
            return Err(Error::InvalidArgument("message longer than MAX_MESSAGE"));
        }
        let local = self.local_for(va, len, true)?;
        let mut slot = [0u8; SEND_DESC_SIZE as usize];
        SendDesc {
            opcode: op::SEND,
            flags: send_flags::UTLB
                | if completion {
                    send_flags::COMPLETION
                } else {
                    0
                },
            len: len as u32,
            dest_node: dest.node,
            dest_port: dest.port,
            tag,
            user_id: id,
            seg_offset: local.entries.offset,
        }
        .encode_header(&mut slot);
        self.post_with(slot, SEND_UTLB_REF_OFFSET, local)
    }

    /// RDMA-writes `range` of `buf` to `remote_offset` of the aperture
    /// `cookie` names, reading it through the UTLB (misses as for
    /// [`Endpoint::post_send_buffer`]).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # pd.enable_utlb(Default::default())?;
    /// # let mut ep = pd.create_endpoint(&Default::default())?;
    /// # let cookie = ep.export(0, 4096, ulnic::Permissions::WRITE)?;
    /// let buf = pd.alloc_buffer(4096)?;
    /// ep.rdma_write_buffer(&cookie, 0, &buf, 0..4096, 9, true)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn rdma_write_buffer(
        &mut self,
        cookie: &Cookie,
        remote_offset: u64,
        buf: &UserBuffer,
        range: Range<usize>,
        id: u64,
        completion: bool,
    ) -> Result<Translation, Error> {
        self.rdma_buffer(
            op::RDMA_WRITE,
            cookie,
            remote_offset,
            buf,
            range,
            id,
            completion,
        )
    }

    /// RDMA-reads `range.len()` bytes at `remote_offset` of the aperture
    /// into `range` of `buf`, writing it through the UTLB. A miss is
    /// serviced before posting (incoming data has no fallback here).
    ///
    /// # Safety
    /// The device writes into `buf` until the read completes (its
    /// [`crate::Event::SendDone`] with `completion`, or
    /// [`Endpoint::sends_done`]): do not read or write that range
    /// meanwhile, and keep `buf` alive.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # pd.enable_utlb(Default::default())?;
    /// # let mut ep = pd.create_endpoint(&Default::default())?;
    /// # let cookie = ep.export(0, 4096, ulnic::Permissions::READ)?;
    /// let buf = pd.alloc_buffer(4096)?;
    /// // SAFETY: `buf` is not touched until the read completed.
    /// unsafe { ep.rdma_read_buffer(&cookie, 0, &buf, 0..4096, 3, true)? };
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub unsafe fn rdma_read_buffer(
        &mut self,
        cookie: &Cookie,
        remote_offset: u64,
        buf: &UserBuffer,
        range: Range<usize>,
        id: u64,
        completion: bool,
    ) -> Result<Translation, Error> {
        self.rdma_buffer(
            op::RDMA_READ,
            cookie,
            remote_offset,
            buf,
            range,
            id,
            completion,
        )
    }

    /// Redirects `len` bytes at `offset` of this endpoint's aperture
    /// `aperture` (the default receive buffer) into `range` of `buf`
    /// (VMMC-2 transfer redirection): bytes written there by RDMA after
    /// the device takes this go straight to `buf`. An
    /// [`crate::Event::Redirected`] with this `id` reports exactly what was
    /// redirected: at once when all of it was, otherwise after
    /// [`Endpoint::end_redirect`].
    ///
    /// # Safety
    /// The device writes into `range` of `buf` until that event: do not
    /// read or write it meanwhile, and keep `buf` alive.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # pd.enable_utlb(Default::default())?;
    /// # let mut ep = pd.create_endpoint(&ulnic::EndpointConfig { segment_bytes: 1 << 20, ..Default::default() })?;
    /// let default = ep.export(0, 1 << 20, ulnic::Permissions::WRITE)?;
    /// let buf = pd.alloc_buffer(65536)?;
    /// // SAFETY: `buf` is left alone until the Redirected event.
    /// unsafe { ep.post_redirect(&default, 4096, &buf, 0..65536, 7)? };
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub unsafe fn post_redirect(
        &mut self,
        aperture: &Cookie,
        offset: u64,
        buf: &UserBuffer,
        range: Range<usize>,
        id: u64,
    ) -> Result<(), Error> {
        if self.zc.redirects.contains_key(&id) {
            return Err(Error::InvalidArgument(
                "a redirection with this id is active",
            ));
        }
        let (va, len) = buf.span(&range)?;
        let local = self.local_for(va, len, false)?;
        let entries = local.entries;
        let d = wire::RedirectDesc {
            opcode: op::REDIRECT.into(),
            flags: send_flags::UTLB.into(),
            len: (len as u32).into(),
            aperture: aperture.aperture.into(),
            id: id.into(),
            offset: offset.into(),
            page_offset: entries.offset.into(),
            ..FromZeros::new_zeroed()
        };
        let slot: [u8; SEND_DESC_SIZE as usize] = zerocopy::transmute!(d);
        self.post_with(
            slot,
            core::mem::offset_of!(wire::RedirectDesc, utlb_first),
            local,
        )?;
        // Held beyond the descriptor's retirement: until the report.
        if let Some(t) = self.utlb.get() {
            lock(t).acquire(&entries);
        }
        self.zc.redirects.insert(id, entries);
        Ok(())
    }

    /// Ends redirection `id`: the device stops redirecting and reports
    /// (partial or none) with an [`crate::Event::Redirected`]. A
    /// redirection that completed has reported already.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.end_redirect(7)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn end_redirect(&mut self, id: u64) -> Result<(), Error> {
        let d = wire::RedirectDesc {
            opcode: op::REDIRECT_END.into(),
            id: id.into(),
            ..FromZeros::new_zeroed()
        };
        // The fields end with the id; the rest of the slot stays zero.
        let fields = core::mem::offset_of!(wire::RedirectDesc, unused1);
        self.push_slot(&d.as_bytes()[..fields])
    }

    /// Exports `range` of `buf` as an aperture (like [`Endpoint::export`]
    /// for the segment): remote nodes holding the cookie read or write it
    /// directly, through this domain's UTLB. Its entries stay installed
    /// until [`Endpoint::revoke`] (or the endpoint goes).
    ///
    /// # Safety
    /// Keep `buf` alive until the export is revoked, and expect its bytes
    /// to change under any view of them while it is exported with WRITE
    /// (as with [`Endpoint::segment_mut`]).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// pd.enable_utlb(Default::default())?;
    /// let ep = pd.create_endpoint(&Default::default())?;
    /// let buf = pd.alloc_buffer(1 << 20)?;
    /// // SAFETY: `buf` outlives the export; it is read only after writes
    /// // were announced.
    /// let cookie = unsafe { ep.export_buffer(&buf, 0..1 << 20, ulnic::Permissions::READ_WRITE)? };
    /// ep.revoke(&cookie)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub unsafe fn export_buffer(
        &self,
        buf: &UserBuffer,
        range: Range<usize>,
        perms: crate::types::Permissions,
    ) -> Result<Cookie, Error> {
        let (va, len) = buf.span(&range)?;
        if !va.is_multiple_of(8) {
            return Err(Error::InvalidArgument(
                "an exported buffer range must start 8-byte aligned",
            ));
        }
        let table = self.utlb.get().ok_or(Error::InvalidArgument(
            "no UTLB: call enable_utlb on the domain",
        ))?;
        let r = {
            let mut t = lock(table);
            let (r, _) = t.find_or_install(&*self.dom, va, len)?;
            t.acquire(&r);
            r
        };
        let p = wire::ExportBuffer {
            endpoint: self.id().into(),
            perms: perms.bits().into(),
            page_offset: r.offset.into(),
            len: (len as u64).into(),
            utlb_first: r.first.into(),
            utlb_count: r.count.into(),
        };
        let cookie = match self.dom.ep_command(cmd::EXPORT_BUFFER, p.as_bytes()) {
            Ok(resp) if resp.len() >= Cookie::SIZE => Cookie::decode(&resp),
            other => {
                lock(table).release(&r);
                return Err(match other {
                    Err(e) => e,
                    Ok(_) => ulnic_host_attach::Error::BadResponse(cmd::EXPORT_BUFFER).into(),
                });
            }
        };
        self.zc
            .exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cookie.aperture, r);
        Ok(cookie)
    }

    /// An export was revoked: its entries may be reused.
    pub(crate) fn export_revoked(&self, aperture: u32) {
        let held = self
            .zc
            .exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&aperture);
        if let (Some(r), Some(t)) = (held, self.utlb.get()) {
            lock(t).release(&r);
        }
    }

    /// A redirection's report arrived: its entries may be reused.
    pub(crate) fn redirect_ended(&mut self, id: u64) {
        if let (Some(r), Some(t)) = (self.zc.redirects.remove(&id), self.utlb.get()) {
            lock(t).release(&r);
        }
    }

    /// RDMA between `range` of `buf` and the aperture; only writes (the
    /// device reads `buf`) may fall back to a copy.
    #[allow(clippy::too_many_arguments)]
    fn rdma_buffer(
        &mut self,
        opcode: u16,
        cookie: &Cookie,
        remote_offset: u64,
        buf: &UserBuffer,
        range: Range<usize>,
        id: u64,
        completion: bool,
    ) -> Result<Translation, Error> {
        let (va, len) = buf.span(&range)?;
        let local = self.local_for(va, len, opcode == op::RDMA_WRITE)?;
        let mut slot = [0u8; SEND_DESC_SIZE as usize];
        RdmaDesc {
            opcode,
            flags: send_flags::UTLB
                | if completion {
                    send_flags::COMPLETION
                } else {
                    0
                },
            len: len as u32,
            cookie: *cookie,
            user_id: id,
            remote_offset,
            local_offset: local.entries.offset,
            immediate: 0,
        }
        .encode(&mut slot);
        self.post_with(slot, RDMA_UTLB_REF_OFFSET, local)
    }
}
