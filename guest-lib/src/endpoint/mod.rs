//! An endpoint: its rings and segment shared with the device, sending,
//! receiving, events and blocking. Remote memory (`rdma`) and transfers
//! from user buffers (`zero_copy`) add to it in the child modules.

pub(crate) mod pio;
mod queue;
mod rdma;
mod zero_copy;

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ulnic_abi::wire;
use ulnic_abi::{
    cmd, ctrl, event, recv_flags, redirect, send_flags, FreeDesc, RecvDesc, RingLayout, SendDesc,
    CONDITION_RESERVE, EVENT_SIZE, FREE_DESC_SIZE, INLINE_OFFSET, RECV_DESC_SIZE, SEND_DESC_SIZE,
};
use ulnic_abi::{EventRecord, FilterEntry, INLINE_MAX};
use zerocopy::IntoBytes;

use crate::backend::{Domain, EpMemory};
use crate::error::Error;
use crate::reporting::{Reporting, SharedReporting};
use crate::staging::EndpointUtlb;
use crate::types::{Address, Event, Payload, Received, RedirectOutcome, SendError};
use crate::utlb;

/// An endpoint: the application's own send, receive, free and event rings and
/// its communication segment, shared with the device.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// let pd = nic.alloc_pd()?;
/// let mut ep = pd.create_endpoint(&ulnic::EndpointConfig::default())?;
/// ep.bind(5)?;
/// ep.write_segment(0, &[1u8; 4096]);
/// ep.post_send(ulnic::Address { node: 1, port: 5 }, 0, 0, 4096, 42, false)?;
/// # Ok::<(), ulnic::Error>(())
/// ```
pub struct Endpoint {
    pub(crate) dom: Arc<dyn Domain>,
    pub(crate) mem: EpMemory,
    pub(crate) utlb: utlb::SharedTranslations,
    pub(crate) zc: EndpointUtlb,
    pub(crate) id: u32,
    pub(crate) port: Option<u32>,
    pub(crate) layout: RingLayout,
    pub(crate) send_producer: u32,
    pub(crate) recv_consumer: u32,
    pub(crate) free_producer: u32,
    pub(crate) event_consumer: u32,
    pub(crate) arm_seq: u32,
    pub(crate) notify_enabled: bool,
    /// Who is notified for it: itself or an event queue (spec §6.1).
    pub(crate) reporting: SharedReporting,
}

/// Sleeps until an armed endpoint is notified ([`Endpoint::waiter`]).
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
/// let w: ulnic::Waiter = ep.waiter();
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Clone)]
pub struct Waiter {
    dom: Arc<dyn Domain>,
    id: u32,
    reporting: SharedReporting,
}

impl Waiter {
    /// Sleeps until the endpoint is notified (true) or `timeout` passes
    /// (false); a zero timeout only takes a notification that came. A
    /// signal caught meanwhile ends it with an error whose errno is
    /// `EINTR`, as it ends a system call. For an endpoint attached to an
    /// [`crate::EventQueue`] (now, whenever the waiter was made), notified
    /// means reported there; one attached with the raw
    /// [`Endpoint::set_event_queue`] is never notified itself, so this
    /// fails with `EINVAL`.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let notified = ep.waiter().wait(std::time::Duration::ZERO)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        sleep(&self.dom, self.id, &self.reporting, timeout)
    }
}

/// Sleeps until endpoint `id` of `dom` is notified, the way `reporting`
/// says it is.
fn sleep(
    dom: &Arc<dyn Domain>,
    id: u32,
    reporting: &SharedReporting,
    timeout: Duration,
) -> Result<bool, Error> {
    match reporting.get() {
        // Where this process reads the notification queue itself (host
        // attach), each waiter sleeps on a watcher of its own: sleeping
        // on the queue's one eventfd, a waiter could lose its wake-up to
        // another that read the eventfd first (spec §6, "Several
        // waiters").
        Reporting::Itself if dom.watch_feed().is_some() => {
            let w = crate::watcher::Watcher::this_thread(dom)?;
            w.watch_id(dom, id)?;
            let r = w.wait(timeout);
            let _ = w.unwatch_id(dom, id);
            r
        }
        // A forked child under host attach: nothing can notify it (its
        // parent reads the queue), so it can only look again, counted.
        Reporting::Itself if !dom.watchers_fed() => {
            std::thread::sleep(timeout.min(crate::wakes::UNFED_LOOK));
            crate::wakes::count_wake(crate::wakes::WakeKind::Unfed);
            Ok(false)
        }
        Reporting::Itself => dom.wait(id, timeout),
        Reporting::Shared(hub) => hub.wait_source(id, timeout),
        Reporting::Raw if timeout.is_zero() => Ok(false),
        Reporting::Raw => Err(Error::InvalidArgument(
            "the endpoint reports to an event queue, not to itself: wait on the queue (or attach it with EventQueue::attach)",
        )),
    }
}

/// How long dropping an endpoint waits for the device to take its posted
/// sends (like `SO_LINGER`): an orderly close does not lose messages.
pub const LINGER: Duration = Duration::from_secs(1);

impl Drop for Endpoint {
    fn drop(&mut self) {
        let deadline = Instant::now() + LINGER;
        while !self.sends_done() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        self.dom.destroy_endpoint(&self.mem);
        // Destroying detached it (spec §6.1): a report it left goes.
        if let Reporting::Shared(hub) = self.reporting.get() {
            hub.forget(self.id);
        }
        // The device has let go of the endpoint: its UTLB holds can go.
        self.release_utlb();
    }
}

impl Endpoint {
    /// This endpoint, as the commands that name only it take it.
    fn object_id(&self) -> wire::ObjectId {
        wire::ObjectId { id: self.id.into() }
    }

    fn word(&self, off: u64) -> &std::sync::atomic::AtomicU32 {
        self.mem.word(off)
    }

    /// The endpoint's id on its node (its bit in its domain's doorbell bitmap).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// println!("endpoint {}", ep.id());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn id(&self) -> u32 {
        self.id
    }

    /// This endpoint's address, once bound.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(9)?;
    /// assert_eq!(ep.address().unwrap().port, 9);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn address(&self) -> Option<Address> {
        self.port.map(|port| Address {
            node: self.dom.info().node,
            port,
        })
    }

    /// Binds the endpoint to `port` on its node; messages to (node, port) reach it.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(4000)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn bind(&mut self, port: u32) -> Result<(), Error> {
        let p = wire::BindPort {
            endpoint: self.id.into(),
            port: port.into(),
        };
        self.dom.ep_command(cmd::BIND_PORT, p.as_bytes())?;
        self.port = Some(port);
        Ok(())
    }

    /// Accepts only messages matching one of `filters` (empty: accept all).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// use ulnic::{FilterEntry, ANY};
    /// ep.set_filter(&[FilterEntry { node: 0, port: ANY, tag: 0, tag_mask: 0 }])?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_filter(&self, filters: &[FilterEntry]) -> Result<(), Error> {
        let head = wire::SetFilter {
            endpoint: self.id.into(),
            count: (filters.len() as u32).into(),
        };
        let mut p = head.as_bytes().to_vec();
        filters.iter().for_each(|f| f.encode_into(&mut p));
        self.dom.ep_command(cmd::SET_FILTER, &p)?;
        Ok(())
    }

    /// Segment size in bytes.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert!(ep.segment_len() >= 4096);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn segment_len(&self) -> usize {
        self.mem.seg_len
    }

    fn seg_check(&self, offset: usize, len: usize) {
        assert!(
            offset
                .checked_add(len)
                .is_some_and(|e| e <= self.mem.seg_len),
            "segment range {offset}+{len} out of bounds"
        );
    }

    /// Copies `data` into the segment at `offset` (where a send will take it
    /// from). Panics if the range is outside the segment.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.write_segment(0, b"payload");
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn write_segment(&self, offset: usize, data: &[u8]) {
        self.seg_check(offset, data.len());
        self.mem.seg_write(offset, data);
    }

    /// Copies segment bytes at `offset` into `out` (e.g. a received buffer).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let mut out = [0u8; 16];
    /// ep.read_segment(0, &mut out);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn read_segment(&self, offset: usize, out: &mut [u8]) {
        self.seg_check(offset, out.len());
        self.mem.seg_read(offset, out);
    }

    /// The segment bytes at `offset` in place, for building a payload
    /// without a copy (zero-copy sends and RDMA writes).
    ///
    /// # Safety
    ///
    /// While the slice lives the device must not touch the range: it is not
    /// posted as a free buffer, not inside an aperture exported for remote
    /// access, and no send or RDMA from or into it is in flight. The caller
    /// must not create two overlapping slices.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// // SAFETY: bytes 0..4096 are this program's own, nothing in flight.
    /// let buf = unsafe { ep.segment_mut(0, 4096) };
    /// buf.fill(7);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    #[allow(clippy::mut_from_ref)] // shared memory; exclusivity is the caller's promise
    pub unsafe fn segment_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        self.seg_check(offset, len);
        // SAFETY: in bounds (checked); exclusive use is the caller's
        // obligation (see above); the mapping outlives `&self`.
        unsafe { std::slice::from_raw_parts_mut(self.mem.seg.add(offset), len) }
    }

    /// The segment bytes at `offset` in place, for reading a received
    /// buffer or an RDMA read's data without a copy.
    ///
    /// # Safety
    ///
    /// As for [`Endpoint::segment_mut`]: the device must not write the range
    /// while the slice lives.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// // SAFETY: nothing can write bytes 0..16 now.
    /// let first = unsafe { ep.segment(0, 16) }[0];
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub unsafe fn segment(&self, offset: usize, len: usize) -> &[u8] {
        self.seg_check(offset, len);
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.mem.seg.add(offset), len) }
    }

    /// Send descriptors that can be posted now.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert_eq!(ep.send_space(), 256);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn send_space(&self) -> u32 {
        let done = u32::from_le(self.word(ctrl::SEND_CONSUMER).load(Ordering::Acquire));
        let in_flight = self
            .send_producer
            .wrapping_sub(done)
            .min(self.layout.send_entries);
        self.layout.send_entries - in_flight
    }

    /// Whether every posted send has been processed by the device.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert!(ep.sends_done());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn sends_done(&self) -> bool {
        self.send_space() == self.layout.send_entries
    }

    fn push_send(&mut self, desc: &SendDesc, inline: &[u8]) -> Result<(), Error> {
        let mut b = [0u8; SEND_DESC_SIZE as usize];
        desc.encode_header(&mut b);
        b[INLINE_OFFSET..INLINE_OFFSET + inline.len()].copy_from_slice(inline);
        let used = if inline.is_empty() {
            INLINE_OFFSET + 8
        } else {
            INLINE_OFFSET + inline.len()
        };
        self.push_slot(&b[..used])
    }

    /// Writes the first bytes of the next send slot and publishes it.
    fn push_slot(&mut self, b: &[u8]) -> Result<(), Error> {
        if self.send_space() == 0 {
            return Err(Error::WouldBlock);
        }
        let slot = u64::from(self.send_producer & (self.layout.send_entries - 1));
        self.mem
            .ctrl_write(self.layout.send_offset() + slot * SEND_DESC_SIZE, b);
        self.send_producer = self.send_producer.wrapping_add(1);
        self.word(ctrl::SEND_PRODUCER)
            .store(self.send_producer.to_le(), Ordering::Release);
        self.doorbell_if_wanted();
        Ok(())
    }

    /// Rings the endpoint's doorbell now. Posting calls rings it only when
    /// the device asked (it stopped polling); this is for tools and tests.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.ring_doorbell();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn ring_doorbell(&self) {
        self.dom.ring_doorbell(&self.mem);
    }

    /// Whether the doorbell is a page mapped into this process (a store
    /// rings it) rather than a system call.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// println!("doorbell mapped: {}", ep.doorbell_mapped());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn doorbell_mapped(&self) -> bool {
        self.dom.doorbell_mapped()
    }

    fn doorbell_if_wanted(&self) {
        // Pairs with the device's "set wanted, fence, re-poll" before it sleeps.
        fence(Ordering::SeqCst);
        if self.word(ctrl::DOORBELL_WANTED).load(Ordering::Acquire) != 0 {
            self.dom.ring_doorbell(&self.mem);
        }
    }

    /// Sends a small message (at most [`INLINE_MAX`] bytes) carried in the
    /// descriptor itself: no buffer management at all.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.post_send_inline(ulnic::Address { node: 1, port: 5 }, 0, b"ping", 1)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_send_inline(
        &mut self,
        dest: Address,
        tag: u32,
        data: &[u8],
        id: u64,
    ) -> Result<(), Error> {
        self.inline_send(ulnic_abi::op::SEND, dest, tag, data, id, false)
    }

    /// As [`Endpoint::post_send_inline`], with an [`Event::SendDone`]
    /// once the message is delivered (after every earlier message to the
    /// same endpoint).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.post_send_inline_completion(ulnic::Address { node: 1, port: 5 }, 0, b"last", 9)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_send_inline_completion(
        &mut self,
        dest: Address,
        tag: u32,
        data: &[u8],
        id: u64,
    ) -> Result<(), Error> {
        self.inline_send(ulnic_abi::op::SEND, dest, tag, data, id, true)
    }

    /// Sends an out-of-band message of at most [`OOB_MAX`](ulnic_abi::OOB_MAX)
    /// bytes (CLAN's OOB messages, spec §5.3): the receiver gets it as an
    /// [`Event::OutOfBand`], ahead of the messages already waiting in its
    /// receive queue, and it is not held up behind messages the receiver
    /// has no room for. With `completion`, an [`Event::SendDone`] follows
    /// its delivery.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(6)?;
    /// ep.post_oob(ulnic::Address { node: 1, port: 5 }, 0, b"abort", 1, false)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_oob(
        &mut self,
        dest: Address,
        tag: u32,
        data: &[u8],
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        if data.len() > ulnic_abi::OOB_MAX as usize {
            return Err(Error::InvalidArgument(
                "out-of-band message larger than OOB_MAX (8 bytes)",
            ));
        }
        self.inline_send(ulnic_abi::op::OOB, dest, tag, data, id, completion)
    }

    /// This endpoint's session id (spec §5.4): stamped by the device on
    /// everything it sends ([`Received::session`]), and different for
    /// every endpoint a node creates, so a peer can tell this endpoint
    /// from an earlier or later holder of its port.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert_ne!(ep.session(), 0);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn session(&self) -> u32 {
        u32::from_le(self.word(ctrl::SESSION).load(Ordering::Acquire))
    }

    /// Posts `data` inline with `opcode` (SEND or OOB).
    fn inline_send(
        &mut self,
        opcode: u16,
        dest: Address,
        tag: u32,
        data: &[u8],
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        if data.len() > INLINE_MAX as usize {
            return Err(Error::InvalidArgument(
                "inline payload larger than INLINE_MAX",
            ));
        }
        let done = if completion {
            send_flags::COMPLETION
        } else {
            0
        };
        let d = SendDesc {
            opcode,
            flags: send_flags::INLINE | done,
            len: data.len() as u32,
            dest_node: dest.node,
            dest_port: dest.port,
            tag,
            user_id: id,
            seg_offset: 0,
        };
        self.push_send(&d, data)
    }

    /// Leaves a close message (at most [`INLINE_MAX`] bytes) that the device
    /// sends to `dest` when this endpoint is destroyed, however that
    /// happens: dropped, its process killed, its VM rebooted (CLAN's close
    /// message). The receiver sees it with [`Received::close`] set, after
    /// every message this endpoint sent it before. Replaces any earlier one.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.bind(6)?;
    /// ep.set_close_message(ulnic::Address { node: 0, port: 5 }, 0, b"bye")?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_close_message(&mut self, dest: Address, tag: u32, data: &[u8]) -> Result<(), Error> {
        if data.len() > INLINE_MAX as usize {
            return Err(Error::InvalidArgument(
                "close message larger than INLINE_MAX",
            ));
        }
        let mut b = [0u8; SEND_DESC_SIZE as usize];
        SendDesc {
            opcode: 0, // published last, below
            flags: send_flags::INLINE,
            len: data.len() as u32,
            dest_node: dest.node,
            dest_port: dest.port,
            tag,
            user_id: 0,
            seg_offset: 0,
        }
        .encode_header(&mut b);
        b[INLINE_OFFSET..INLINE_OFFSET + data.len()].copy_from_slice(data);
        self.clear_close_message();
        self.mem.ctrl_write(ctrl::CLOSE_MESSAGE, &b);
        let head = u32::from(ulnic_abi::op::SEND) | u32::from(send_flags::INLINE) << 16;
        self.word(ctrl::CLOSE_MESSAGE)
            .store(head.to_le(), Ordering::Release);
        Ok(())
    }

    /// Withdraws the close message, for an orderly close whose peer was
    /// already told.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.clear_close_message();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn clear_close_message(&mut self) {
        self.word(ctrl::CLOSE_MESSAGE).store(0, Ordering::Release);
    }

    /// Sends `len` bytes at `offset` in the segment (zero-copy). With
    /// `completion`, a [`Event::SendDone`] reports delivery; failures are
    /// always reported as [`Event::SendFailed`]. The bytes may be reused once
    /// [`Endpoint::send_space`] shows the descriptor retired.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.write_segment(8192, &[7u8; 1000]);
    /// ep.post_send(ulnic::Address { node: 1, port: 5 }, 3, 8192, 1000, 2, true)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_send(
        &mut self,
        dest: Address,
        tag: u32,
        offset: u64,
        len: u32,
        id: u64,
        completion: bool,
    ) -> Result<(), Error> {
        let d = SendDesc {
            opcode: ulnic_abi::op::SEND,
            flags: if completion {
                send_flags::COMPLETION
            } else {
                0
            },
            len,
            dest_node: dest.node,
            dest_port: dest.port,
            tag,
            user_id: id,
            seg_offset: offset,
        };
        self.push_send(&d, &[])
    }

    /// Posts a receive buffer of `len` bytes at `offset` in the segment.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// for i in 0..16u64 {
    ///     ep.post_free(i * 65536, 65536, i)?;
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn post_free(&mut self, offset: u64, len: u32, id: u64) -> Result<(), Error> {
        let done = u32::from_le(self.word(ctrl::FREE_CONSUMER).load(Ordering::Acquire));
        if self.free_producer.wrapping_sub(done) >= self.layout.free_entries {
            return Err(Error::WouldBlock);
        }
        let slot = u64::from(self.free_producer & (self.layout.free_entries - 1));
        let mut b = [0u8; FREE_DESC_SIZE as usize];
        FreeDesc {
            seg_offset: offset,
            len,
            user_id: id,
        }
        .encode(&mut b);
        self.mem
            .ctrl_write(self.layout.free_offset() + slot * FREE_DESC_SIZE, &b);
        self.free_producer = self.free_producer.wrapping_add(1);
        self.word(ctrl::FREE_PRODUCER)
            .store(self.free_producer.to_le(), Ordering::Release);
        self.doorbell_if_wanted();
        Ok(())
    }

    /// Free buffers posted and not yet filled.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// assert_eq!(ep.free_posted(), 0);
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn free_posted(&self) -> u32 {
        let done = u32::from_le(self.word(ctrl::FREE_CONSUMER).load(Ordering::Acquire));
        self.free_producer.wrapping_sub(done)
    }

    /// The sender of the first close message (spec §5.11) waiting in the
    /// receive queue, if any; nothing is taken off the queue.
    pub(crate) fn close_pending(&self) -> Option<Address> {
        let prod = u32::from_le(self.word(ctrl::RECV_PRODUCER).load(Ordering::Acquire));
        let mut at = self.recv_consumer;
        // At most a ring's worth: a producer index past that is the
        // device's error, not a reason to read for ever.
        for _ in 0..self.layout.recv_entries {
            if at == prod {
                return None;
            }
            let slot = u64::from(at & (self.layout.recv_entries - 1));
            let mut b = [0u8; RECV_DESC_SIZE as usize];
            let addr = self.layout.recv_offset() + slot * RECV_DESC_SIZE;
            self.mem.ctrl_read(addr, &mut b[..INLINE_OFFSET]);
            let d = RecvDesc::decode(&b);
            if d.flags & recv_flags::CLOSE != 0 {
                return Some(Address {
                    node: d.src_node,
                    port: d.src_port,
                });
            }
            at = at.wrapping_add(1);
        }
        None
    }

    /// Takes the next received message, if any (never blocks).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// while let Some(m) = ep.poll_recv() {
    ///     println!("{} bytes", m.len);
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn poll_recv(&mut self) -> Option<Received> {
        let prod = u32::from_le(self.word(ctrl::RECV_PRODUCER).load(Ordering::Acquire));
        if prod == self.recv_consumer {
            return None;
        }
        let slot = u64::from(self.recv_consumer & (self.layout.recv_entries - 1));
        let mut b = [0u8; RECV_DESC_SIZE as usize];
        let addr = self.layout.recv_offset() + slot * RECV_DESC_SIZE;
        self.mem.ctrl_read(addr, &mut b[..INLINE_OFFSET]);
        let d = RecvDesc::decode(&b);
        let payload = if d.flags & recv_flags::INLINE != 0 {
            let n = (d.len as usize).min(INLINE_MAX as usize);
            self.mem.ctrl_read(
                addr + INLINE_OFFSET as u64,
                &mut b[INLINE_OFFSET..INLINE_OFFSET + n],
            );
            let mut data = [0u8; INLINE_MAX as usize];
            data[..n].copy_from_slice(&b[INLINE_OFFSET..INLINE_OFFSET + n]);
            Payload::Inline(data)
        } else {
            self.mem.ctrl_read(
                addr + INLINE_OFFSET as u64,
                &mut b[INLINE_OFFSET..INLINE_OFFSET + 8],
            );
            Payload::Buffer {
                offset: RecvDesc::decode(&b).buf_offset,
                id: d.buf_id,
            }
        };
        self.recv_consumer = self.recv_consumer.wrapping_add(1);
        self.word(ctrl::RECV_CONSUMER)
            .store(self.recv_consumer.to_le(), Ordering::Release);
        Some(Received {
            src: Address {
                node: d.src_node,
                port: d.src_port,
            },
            tag: d.tag,
            len: d.len,
            payload,
            close: d.flags & recv_flags::CLOSE != 0,
            returned: d.flags & recv_flags::RETURNED != 0,
            session: d.session,
        })
    }

    /// Messages waiting in the receive ring (never blocks).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// if ep.recv_ready() >= 16 {
    ///     // a batch is in: take it at once
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn recv_ready(&self) -> u32 {
        let prod = u32::from_le(self.word(ctrl::RECV_PRODUCER).load(Ordering::Acquire));
        prod.wrapping_sub(self.recv_consumer)
            .min(self.layout.recv_entries)
    }

    /// Takes the next event, if any (never blocks).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// while let Some(ev) = ep.poll_event() {
    ///     println!("{ev:?}");
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn poll_event(&mut self) -> Option<Event> {
        let prod = u32::from_le(self.word(ctrl::EVENT_PRODUCER).load(Ordering::Acquire));
        if prod == self.event_consumer {
            return None;
        }
        let slot = u64::from(self.event_consumer & (self.layout.event_entries - 1));
        let mut b = [0u8; EVENT_SIZE as usize];
        self.mem
            .ctrl_read(self.layout.event_offset() + slot * EVENT_SIZE, &mut b);
        let e = EventRecord::decode(&b);
        self.event_consumer = self.event_consumer.wrapping_add(1);
        self.word(ctrl::EVENT_CONSUMER)
            .store(self.event_consumer.to_le(), Ordering::Release);
        if !self.sends_done() {
            // Sends may be held back for want of event slots: a device
            // that stopped polling learns of the room now, not when its
            // engine next wakes (spec §5.6).
            self.doorbell_if_wanted();
        }
        Some(match e.kind {
            event::TX_DONE => Event::SendDone { id: e.user_id },
            event::TX_ERROR => Event::SendFailed {
                id: e.user_id,
                dest: Address {
                    node: e.node,
                    port: e.port,
                },
                len: e.len,
                reason: SendError::from_code(e.code),
            },
            event::CONDITION => {
                if u32::from(e.code) < CONDITION_RESERVE {
                    // Re-enable this condition (CLAN duplicate suppression).
                    self.mem
                        .ctrl_write(ctrl::CONDITION_PENDING + u64::from(e.code), &[0]);
                }
                Event::Condition(e.code)
            }
            event::TRIPWIRE => {
                self.clear_tripwire_flag(e.aux);
                Event::Tripwire {
                    id: e.aux,
                    user: e.user_id,
                    from: Address {
                        node: e.node,
                        port: e.port,
                    },
                    len: e.len,
                    read: e.code != 0,
                }
            }
            event::OOB => Event::OutOfBand {
                from: Address {
                    node: e.node,
                    port: e.port,
                },
                tag: e.aux,
                data: e.user_id.to_le_bytes(),
                len: e.len.min(ulnic_abi::OOB_MAX) as u8,
                session: e.session,
            },
            event::UNREACHABLE => Event::Unreachable { node: e.node },
            event::QUEUED => Event::Queued {
                cookie: e.user_id,
                source: e.aux,
            },
            event::PIO_REVOKED => Event::PioRevoked {
                import: e.aux,
                key: e.user_id,
                node: e.node,
            },
            event::REDIRECTED => {
                self.redirect_ended(e.user_id);
                Event::Redirected {
                    id: e.user_id,
                    outcome: match e.code {
                        redirect::FULL => RedirectOutcome::Full,
                        redirect::PARTIAL => RedirectOutcome::Partial,
                        redirect::NONE => RedirectOutcome::None,
                        _ => RedirectOutcome::Refused(SendError::from_code(e.aux as u16)),
                    },
                    start: u64::from(e.aux) * u64::from(e.code != redirect::REFUSED),
                    bytes: u64::from(e.len),
                    from: Address {
                        node: e.node,
                        port: e.port,
                    },
                }
            }
            _ => Event::Unknown(e),
        })
    }

    fn has_work(&self) -> bool {
        let rp = u32::from_le(self.word(ctrl::RECV_PRODUCER).load(Ordering::Acquire));
        let ep = u32::from_le(self.word(ctrl::EVENT_PRODUCER).load(Ordering::Acquire));
        rp != self.recv_consumer || ep != self.event_consumer
    }

    /// Asks for one notification when the next message or event arrives
    /// (spec §6), for a program that blocks in `poll`, `select` or `epoll`
    /// on [`Endpoint::notification_fd`] rather than in [`Endpoint::wait`].
    /// Returns true when something is already waiting: then poll the
    /// endpoint instead of blocking. After a wake-up, consume the
    /// notification ([`Endpoint::take_notification`]) and poll the endpoint.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// if !ep.arm()? {
    ///     if let Some(fd) = ep.notification_fd() {
    ///         let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    ///         // SAFETY: one valid pollfd.
    ///         unsafe { libc::poll(&mut p, 1, 1000) };
    ///     }
    /// }
    /// let m = ep.poll_recv();
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn arm(&mut self) -> Result<bool, Error> {
        if !self.notify_enabled {
            match self.dom.ep_command(cmd::ARM, self.object_id().as_bytes()) {
                Ok(_) => self.notify_enabled = true,
                // A forked child of a host-attached process: commands and
                // notifications are the parent's (spec §2.4), so its waits
                // look again at each timeout instead.
                Err(e) if e.is_forked_child() => {}
                Err(e) => return Err(e),
            }
        }
        // An atomic add on the shared word, not a store of a private copy
        // plus one: a waiter in another thread or process (after fork)
        // may have armed since, and storing the same value twice would be
        // no arm (spec §6, "Several waiters").
        let word = self.word(ctrl::ARM_REQUEST);
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let next = u32::from_le(cur).wrapping_add(1).to_le();
            match word.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => {
                    self.arm_seq = u32::from_le(next);
                    break;
                }
                Err(now) => cur = now,
            }
        }
        fence(Ordering::SeqCst);
        Ok(self.has_work())
    }

    /// Reloads this process's ring cursors from the ones the endpoint
    /// publishes in its control page: for an endpoint that several
    /// processes use in turn under a lock of their own (a listener shared
    /// across fork), whose private copies go stale when another takes a
    /// turn.
    pub(crate) fn resync_cursors(&mut self) {
        let load = |ep: &Endpoint, off| u32::from_le(ep.word(off).load(Ordering::Acquire));
        self.send_producer = load(self, ctrl::SEND_PRODUCER);
        self.recv_consumer = load(self, ctrl::RECV_CONSUMER);
        self.free_producer = load(self, ctrl::FREE_PRODUCER);
        self.event_consumer = load(self, ctrl::EVENT_CONSUMER);
        self.arm_seq = load(self, ctrl::ARM_REQUEST);
    }

    /// The file descriptor that becomes readable (`POLLIN`) when an armed
    /// endpoint of this endpoint's domain is notified, for `poll`,
    /// `select` and `epoll`: the Linux driver's open file (spec §9), or
    /// under host attach the notification queue's call eventfd, which
    /// every domain of the attachment shares (a wake-up may then be for
    /// another endpoint: poll yours and arm again).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// println!("pollable: {}", ep.notification_fd().is_some());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        self.dom.notification_fd()
    }

    /// Consumes this endpoint's notification, if it has one, so its
    /// [`Endpoint::notification_fd`] stops being readable for it; true if
    /// there was one. Returns at once.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let was_notified = ep.take_notification()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn take_notification(&mut self) -> Result<bool, Error> {
        sleep(&self.dom, self.id, &self.reporting, Duration::ZERO)
    }

    /// A handle that sleeps until this endpoint is notified, for a thread
    /// that arms the endpoint ([`Endpoint::arm`]) and then waits without
    /// holding it (another thread may use the endpoint meanwhile).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let waiter = ep.waiter();
    /// if !ep.arm()? {
    ///     waiter.wait(std::time::Duration::from_millis(100))?;
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn waiter(&self) -> Waiter {
        Waiter {
            dom: self.dom.clone(),
            id: self.id,
            reporting: self.reporting.clone(),
        }
    }

    /// The send ring index the next post takes (free-running): with a
    /// payload area of `send_entries` slots, slot `index % send_entries` is
    /// free whenever a post succeeds, since the ring holds one descriptor
    /// per slot.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// let slot = ep.send_position() % 256;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn send_position(&self) -> u32 {
        self.send_producer
    }

    /// Blocks until a message or event is waiting, or `timeout` passes;
    /// returns whether there is something to poll. Check, arm, re-check,
    /// block: a message arriving at any point is never slept through. A
    /// signal caught meanwhile ends it with an `EINTR` error.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// if ep.wait(std::time::Duration::from_secs(1))? {
    ///     let m = ep.poll_recv();
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, Error> {
        if self.has_work() {
            return Ok(true);
        }
        let deadline = Instant::now() + timeout;
        // Claimed before the arm: a report the arm lets through is ours.
        let _claim = self.reporting.get().claim(self.id);
        loop {
            if self.arm()? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            if sleep(&self.dom, self.id, &self.reporting, left)? && self.has_work() {
                return Ok(true);
            }
        }
    }

    /// Makes `w` watch this endpoint: its notifications wake `w` from now
    /// on (spec §6, "Several waiters"), whatever other waiters do.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # let ep = pd.create_endpoint(&Default::default())?;
    /// let w = pd.new_watcher()?;
    /// ep.watch(&w)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn watch(&self, w: &crate::watcher::Watcher) -> Result<(), Error> {
        w.watch_id(&self.dom, self.id)
    }

    /// Stops `w` watching this endpoint.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # let ep = pd.create_endpoint(&Default::default())?;
    /// # let w = pd.new_watcher()?;
    /// ep.watch(&w)?;
    /// ep.unwatch(&w)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn unwatch(&self, w: &crate::watcher::Watcher) -> Result<(), Error> {
        w.unwatch_id(&self.dom, self.id)
    }

    /// The control block's published words (spec §5.2), for a report of
    /// an endpoint that seems stuck: the rings' indices as each side
    /// published them, `doorbell wanted`, and the arm request and its
    /// acknowledgement.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// eprintln!("{}", ep.control_words());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn control_words(&self) -> String {
        let w = |off| u32::from_le(self.word(off).load(Ordering::Acquire));
        format!(
            "send {}/{} recv {}/{} events {}/{} doorbell_wanted {} arm {}/{}",
            w(ctrl::SEND_PRODUCER),
            w(ctrl::SEND_CONSUMER),
            w(ctrl::RECV_PRODUCER),
            w(ctrl::RECV_CONSUMER),
            w(ctrl::EVENT_PRODUCER),
            w(ctrl::EVENT_CONSUMER),
            w(ctrl::DOORBELL_WANTED),
            w(ctrl::ARM_REQUEST),
            w(ctrl::ARM_ACK)
        )
    }

    /// The device's counters for this endpoint, by name (`ulnic_abi::STAT_NAMES`).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// for (name, value) in ep.stats()? {
    ///     println!("{name} = {value}");
    /// }
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn stats(&self) -> Result<Vec<(&'static str, u64)>, Error> {
        let r = self
            .dom
            .ep_command(cmd::GET_STATS, self.object_id().as_bytes())?;
        Ok(ulnic_abi::STAT_NAMES
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                r.get(i * 8..i * 8 + 8)
                    .map(|b| (*n, ulnic_abi::read_le64(b, 0)))
            })
            .collect())
    }
}
