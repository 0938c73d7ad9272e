//! Who is notified for an endpoint (spec §6.1): the endpoint itself, or
//! the event queue it reports to. Kept apart from the queue so that an
//! endpoint's waits can go through a queue that is itself an endpoint.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;

/// An event queue that the waits on its sources go through.
pub(crate) trait SourceWaits: Send + Sync {
    /// Waits until `source` is reported (true) or `timeout` passes.
    fn wait_source(&self, source: u32, timeout: Duration) -> Result<bool, Error>;
    /// Forgets `source` (detached or destroyed): its report goes.
    fn forget(&self, source: u32);
    /// A thread is about to wait on `source`: its reports are that
    /// thread's, not the queue's consumer's, until `unclaim`.
    fn claim(&self, source: u32);
    /// Undoes one `claim`.
    fn unclaim(&self, source: u32);
}

/// Holds a claim on a source (`SourceWaits::claim`) until dropped.
pub(crate) struct Claim(Arc<dyn SourceWaits>, u32);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.unclaim(self.1);
    }
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
    /// Claims `source`'s reports for the calling thread while it waits
    /// (before it arms the source, so a report cannot reach the queue's
    /// consumer in between); None when it reports to no shared queue.
    pub(crate) fn claim(&self, source: u32) -> Option<Claim> {
        match self {
            Reporting::Shared(q) => {
                q.claim(source);
                Some(Claim(q.clone(), source))
            }
            _ => None,
        }
    }

    /// Whether this reports to the queue whose shared part is at `queue`.
    pub(crate) fn is_shared_with(&self, queue: *const ()) -> bool {
        matches!(self, Reporting::Shared(q) if std::ptr::eq(Arc::as_ptr(q).cast::<()>(), queue))
    }
}

/// An endpoint's [`Reporting`], shared with the waiters made from it, so
/// that a waiter made before the endpoint was attached to a queue (or
/// detached) waits the way the endpoint is notified now.
#[derive(Clone, Default)]
pub(crate) struct SharedReporting(Arc<Mutex<Reporting>>);

impl SharedReporting {
    /// How the endpoint is notified now.
    pub(crate) fn get(&self) -> Reporting {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes it; returns what it was.
    pub(crate) fn replace(&self, r: Reporting) -> Reporting {
        std::mem::replace(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()), r)
    }
}
