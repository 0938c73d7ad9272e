//! Who is notified for an endpoint (spec §6.1): the endpoint itself, or
//! the event queue it reports to. Kept apart from the queue so that an
//! endpoint's waits can go through a queue that is itself an endpoint.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

/// An event queue that the waits on its sources go through.
pub(crate) trait SourceWaits: Send + Sync {
    /// Waits until `source` is reported (true) or `timeout` passes.
    fn wait_source(&self, source: u32, timeout: Duration) -> Result<bool, Error>;
    /// Forgets `source` (detached or destroyed): its report goes.
    fn forget(&self, source: u32);
}

/// How an endpoint is notified.
#[derive(Clone, Default)]
pub(crate) enum Reporting {
    /// Its own notification.
    #[default]
    Itself,
    /// To a queue endpoint the application serves itself (the raw
    /// `Endpoint::set_event_queue`): its own waits would never wake.
    Raw,
    /// To a `crate::EventQueue`, which its waits share.
    Shared(Arc<dyn SourceWaits>),
}

impl Reporting {
    /// Whether this reports to the queue whose shared part is at `queue`.
    pub(crate) fn is_shared_with(&self, queue: *const ()) -> bool {
        matches!(self, Reporting::Shared(q) if std::ptr::eq(Arc::as_ptr(q).cast::<()>(), queue))
    }
}
