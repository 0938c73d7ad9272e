//! CLAN's event queues (spec §6.1): an endpoint that other endpoints of
//! its domain report to with a cookie, so that one ring, one descriptor
//! and one sleep serve many sources.

use std::sync::Arc;

use ulnic_abi::{cmd, wire, EVENT_QUEUE_DETACH};
use zerocopy::IntoBytes;

use super::Endpoint;
use crate::error::Error;
use crate::reporting::Reporting;

impl Endpoint {
    /// Makes `queue` (an endpoint of the same domain) this endpoint's
    /// event queue: from now on, when this endpoint is armed
    /// ([`Endpoint::arm`]) and a message or event reaches it, `queue`
    /// gets one [`crate::Event::Queued`] carrying `cookie` instead of this
    /// endpoint being notified, and `queue` is notified if it is armed.
    /// Each arm reports once (more messages before the next arm add
    /// nothing), so serve this endpoint, then arm it again. A queue holds
    /// as many sources as its event ring has room for beyond its own
    /// sends, conditions, tripwires and redirections (spec §6.1: 144 for
    /// an endpoint made with the default [`crate::EndpointConfig`] on a
    /// device with the default 64 tripwires per endpoint; `ENOSPC`
    /// beyond); it cannot be this endpoint, have a queue itself, or be
    /// another domain's (`EINVAL`).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let pd = nic.alloc_pd()?;
    /// let queue = pd.create_endpoint(&Default::default())?;
    /// let mut ep = pd.create_endpoint(&Default::default())?;
    /// ep.set_event_queue(&queue, 7)?;
    /// ep.arm()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn set_event_queue(&mut self, queue: &Endpoint, cookie: u64) -> Result<(), Error> {
        // An endpoint id means something only in its own domain (and on
        // its own NIC): another's would name a stranger here.
        if !Arc::ptr_eq(&self.dom, &queue.dom) {
            return Err(Error::InvalidArgument(
                "the event queue is an endpoint of another protection domain",
            ));
        }
        self.report_to(queue.id, cookie, Reporting::Raw)
    }

    /// Attaches this endpoint to queue endpoint `queue` with `cookie`;
    /// its waits then go the way `reporting` says.
    pub(crate) fn report_to(
        &mut self,
        queue: u32,
        cookie: u64,
        reporting: Reporting,
    ) -> Result<(), Error> {
        self.queue_command(queue, cookie)?;
        self.leave_shared_queue(reporting);
        Ok(())
    }

    /// Detaches this endpoint from its event queue, if it has one: it is
    /// notified itself again.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let mut ep = nic.alloc_pd()?.create_endpoint(&Default::default())?;
    /// ep.clear_event_queue()?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn clear_event_queue(&mut self) -> Result<(), Error> {
        self.queue_command(EVENT_QUEUE_DETACH, 0)?;
        self.leave_shared_queue(Reporting::Itself);
        Ok(())
    }

    /// Makes `now` how this endpoint is notified, and drops a report
    /// the [`crate::EventQueue`] it leaves, if any, holds for it.
    fn leave_shared_queue(&mut self, now: Reporting) {
        if let Reporting::Shared(hub) = self.reporting.replace(now) {
            hub.forget(self.id);
        }
    }

    fn queue_command(&mut self, queue: u32, cookie: u64) -> Result<(), Error> {
        let p = wire::SetEventQueue {
            endpoint: self.id.into(),
            queue: queue.into(),
            cookie: cookie.into(),
        };
        self.dom.ep_command(cmd::SET_EVENT_QUEUE, p.as_bytes())?;
        Ok(())
    }
}
