//! Remote memory on an endpoint (spec §5.12, §5.13): export parts of the
//! segment as apertures named by cookies, RDMA read, write and
//! write-immediate against cookies from any node, and tripwires.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ulnic_abi::wire;
use ulnic_abi::{cmd, ctrl, op, send_flags, tripwire_flags, Cookie, RdmaDesc};
use zerocopy::{FromBytes, IntoBytes};

use super::Endpoint;
use crate::error::Error;
use crate::types::{Immediate, Permissions, TripwireOn};

impl Endpoint {
    /// Exports `len` bytes of the segment at `offset` (8-byte aligned) and
    /// returns the cookie that names them: give it to peers on any node
    /// (in a message, say) and they may access the bytes with `perms`
    /// until [`Endpoint::revoke`] or until this endpoint goes.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let cookie = ep.export(0, 65536, ulnic::Permissions::READ_WRITE)?;
    /// ep.post_send_inline(ulnic::Address { node: 1, port: 5 }, 0, &cookie.encode(), 1)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn export(&self, offset: u64, len: u64, perms: Permissions) -> Result<Cookie, Error> {
        let p = wire::Export {
            endpoint: self.id().into(),
            perms: perms.0.into(),
            offset: offset.into(),
            len: len.into(),
        };
        let r = self.dom.ep_command(cmd::EXPORT, p.as_bytes())?;
        if r.len() < Cookie::SIZE {
            return Err(ulnic_host_attach::Error::BadResponse(cmd::EXPORT).into());
        }
        Ok(Cookie::decode(&r))
    }

    /// Revokes an aperture this endpoint exported: once this returns, no
    /// access through its cookie lands.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let cookie = ep.export(0, 4096, ulnic::Permissions::WRITE)?;
    /// ep.revoke(&cookie)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn revoke(&self, cookie: &Cookie) -> Result<(), Error> {
        let p = wire::Revoke {
            endpoint: self.id().into(),
            aperture: cookie.aperture.into(),
        };
        self.dom.ep_command(cmd::REVOKE, p.as_bytes())?;
        self.export_revoked(cookie.aperture);
        Ok(())
    }

    pub(super) fn post_rdma(&mut self, d: RdmaDesc) -> Result<(), Error> {
        let mut b = [0u8; 64];
        d.encode(&mut b);
        self.push_slot(&b)
    }

    pub(super) fn rdma_desc(
        opcode: u16,
        cookie: &Cookie,
        remote: u64,
        local: u64,
        len: u32,
        id: u64,
        completion: bool,
    ) -> RdmaDesc {
        RdmaDesc {
            opcode,
            flags: if completion {
                send_flags::COMPLETION
            } else {
                0
            },
            len,
            cookie: *cookie,
            user_id: id,
            remote_offset: remote,
            local_offset: local,
            immediate: 0,
        }
    }

    /// Copies `len` bytes at `local_offset` of this segment to
    /// `remote_offset` in the aperture `cookie` names. Writes from one
    /// endpoint land in the order posted. With `completion`, a
    /// [`crate::Event::SendDone`] says the bytes are in place; failures are
    /// always reported ([`crate::SendError::BadCookie`] and friends) and
    /// write nothing.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let cookie = ep.export(0, 4096, ulnic::Permissions::WRITE)?;
    /// ep.write_segment(8192, b"data");
    /// ep.rdma_write(&cookie, 0, 8192, 4, 1, true)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn rdma_write(
        &mut self,
        cookie: &Cookie,
        remote_offset: u64,
        local_offset: u64,
        len: u32,
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        let d = Self::rdma_desc(
            op::RDMA_WRITE,
            cookie,
            remote_offset,
            local_offset,
            len,
            id,
            completion,
        );
        self.post_rdma(d)
    }

    /// Copies `len` bytes at `remote_offset` of the aperture into this
    /// segment at `local_offset`; with `completion`, a
    /// [`crate::Event::SendDone`] says they arrived.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let cookie = ep.export(0, 4096, ulnic::Permissions::READ)?;
    /// ep.rdma_read(&cookie, 0, 8192, 4096, 2, true)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn rdma_read(
        &mut self,
        cookie: &Cookie,
        remote_offset: u64,
        local_offset: u64,
        len: u32,
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        let d = Self::rdma_desc(
            op::RDMA_READ,
            cookie,
            remote_offset,
            local_offset,
            len,
            id,
            completion,
        );
        self.post_rdma(d)
    }

    /// Stores one word at `remote_offset` (aligned to its size) in the
    /// aperture. It never overtakes writes this endpoint posted before it,
    /// so it can flag that a payload is complete.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let cookie = ep.export(0, 4096, ulnic::Permissions::WRITE)?;
    /// ep.write_immediate(&cookie, 64, ulnic::Immediate::U64(1), 3, false)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn write_immediate(
        &mut self,
        cookie: &Cookie,
        remote_offset: u64,
        value: Immediate,
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        let (len, v) = match value {
            Immediate::U32(v) => (4, u64::from(v)),
            Immediate::U64(v) => (8, v),
        };
        let mut d = Self::rdma_desc(
            op::WRITE_IMMEDIATE,
            cookie,
            remote_offset,
            0,
            len,
            id,
            completion,
        );
        d.immediate = v;
        self.post_rdma(d)
    }

    /// Sets a tripwire on `[offset, offset+len)` of an aperture this
    /// endpoint exported: when a remote access of kind `on` touches it, a
    /// [`crate::Event::Tripwire`] carrying `user` arrives, the fired flag is
    /// set ([`Endpoint::take_tripwire_fired`]) and a blocked owner wakes. A
    /// one-shot tripwire (`persistent = false`) fires once. Returns its id.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let cookie = ep.export(0, 4096, ulnic::Permissions::WRITE)?;
    /// let tw = ep.set_tripwire(&cookie, 0, 8, ulnic::TripwireOn::Writes, false, 99)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_tripwire(
        &self,
        cookie: &Cookie,
        offset: u64,
        len: u64,
        on: TripwireOn,
        persistent: bool,
        user: u64,
    ) -> Result<u32, Error> {
        let mut flags = match on {
            TripwireOn::Writes => tripwire_flags::WRITE,
            TripwireOn::Reads => tripwire_flags::READ,
            TripwireOn::Both => tripwire_flags::WRITE | tripwire_flags::READ,
        };
        if persistent {
            flags |= tripwire_flags::PERSISTENT;
        }
        self.set_tripwire_on(cookie.aperture, offset, len, flags, user)
    }

    /// SET_TRIPWIRE on `aperture` (a PIO window's id with flag PIO).
    pub(super) fn set_tripwire_on(
        &self,
        aperture: u32,
        offset: u64,
        len: u64,
        flags: u32,
        user: u64,
    ) -> Result<u32, Error> {
        let p = wire::SetTripwire {
            endpoint: self.id().into(),
            aperture: aperture.into(),
            offset: offset.into(),
            len: len.into(),
            flags: flags.into(),
            reserved: 0.into(),
            user: user.into(),
        };
        let r = self.dom.ep_command(cmd::SET_TRIPWIRE, p.as_bytes())?;
        wire::ObjectId::read_from_prefix(&r)
            .map(|(id, _)| id.id.get())
            .map_err(|_| ulnic_host_attach::Error::BadResponse(cmd::SET_TRIPWIRE).into())
    }

    /// Removes a tripwire.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let cookie = ep.export(0, 4096, ulnic::Permissions::WRITE)?;
    /// # let tw = ep.set_tripwire(&cookie, 0, 8, ulnic::TripwireOn::Writes, true, 0)?;
    /// ep.clear_tripwire(tw)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn clear_tripwire(&self, id: u32) -> Result<(), Error> {
        let p = wire::ClearTripwire {
            endpoint: self.id().into(),
            tripwire: id.into(),
        };
        self.dom
            .ep_command(cmd::CLEAR_TRIPWIRE, p.as_bytes())
            .map(|_| ())
    }

    pub(crate) fn clear_tripwire_flag(&self, id: u32) {
        if id < ulnic_abi::MAX_TRIPWIRES_LIMIT {
            self.mem
                .ctrl_write(ctrl::TRIPWIRE_FIRED + u64::from(id), &[0]);
            // The clear must be visible before the caller reads the watched
            // data (the device fences between writing data and reading the
            // flag): otherwise both read stale values and the firing is lost.
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }

    /// Whether tripwire `id` fired since last asked (or since its event was
    /// taken); clears the flag, re-enabling its event. No system call.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// if ep.take_tripwire_fired(0) { println!("written to"); }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn take_tripwire_fired(&self, id: u32) -> bool {
        if id >= ulnic_abi::MAX_TRIPWIRES_LIMIT {
            return false;
        }
        let mut b = [0u8];
        self.mem
            .ctrl_read(ctrl::TRIPWIRE_FIRED + u64::from(id), &mut b);
        if b[0] != 0 {
            self.clear_tripwire_flag(id);
        }
        b[0] != 0
    }

    /// The aligned 64-bit word at `offset` in the segment, read atomically
    /// (what a remote write-immediate stores).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let flag = ep.read_u64(64);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn read_u64(&self, offset: u64) -> u64 {
        u64::from_le(self.mem.seg_word64(offset as usize).load(Ordering::Acquire))
    }

    /// CLAN's blocking primitive: returns once the 64-bit word at `offset`
    /// in the segment is no longer `unchanged` or tripwire `id` fired
    /// (true), or after `timeout` (false). The word is the truth and the
    /// flag only a hint: a firing may be reported for a write already seen,
    /// so after `true` read the word again and wait again if it is unchanged. It checks, arms, re-checks and
    /// only then blocks, so a write landing at any moment is never slept
    /// through. Other events stay queued for [`Endpoint::poll_event`]
    /// (while some are, this waits by polling). A close message in the
    /// receive queue ends the wait with [`Error::PeerClosed`] (spec §5.11:
    /// the peer that would have written is gone); it stays queued.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// # let cookie = ep.export(0, 4096, ulnic::Permissions::WRITE)?;
    /// let tw = ep.set_tripwire(&cookie, 64, 8, ulnic::TripwireOn::Writes, true, 0)?;
    /// let woke = ep.wait_tripwire(tw, 64, 0, std::time::Duration::from_secs(1))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn wait_tripwire(
        &mut self,
        id: u32,
        offset: u64,
        unchanged: u64,
        timeout: Duration,
    ) -> Result<bool, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.fired_or_changed(id, offset, unchanged) {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            if let Some(from) = self.close_pending() {
                return Err(Error::PeerClosed { from });
            }
            if self.wait(left)? {
                if self.fired_or_changed(id, offset, unchanged) {
                    return Ok(true);
                }
                if let Some(from) = self.close_pending() {
                    return Err(Error::PeerClosed { from });
                }
                // Other work queued: do not spin hot while unrelated events
                // wait for the application.
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Clears the fired flag first and reads the word second: the device
    /// stores the word, fences, then reads the flag, so either it sees the
    /// clear (and posts an event, waking the owner) or this read sees the
    /// new word. Reading the word first would let a firing slip between.
    fn fired_or_changed(&self, id: u32, offset: u64, unchanged: u64) -> bool {
        let fired = self.take_tripwire_fired(id);
        fired || self.read_u64(offset) != unchanged
    }
}
