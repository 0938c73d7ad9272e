//! What queues move along when they are read (manual progress): the
//! endpoints and passive endpoints bound to them.

/// Something that moves along when a queue it is bound to is read.
pub trait Progress: Send + Sync {
    /// Handles what arrived.
    fn progress(&self);

    /// Takes its old notification and asks for one when something
    /// arrives (the ulnic endpoint's arm): true if something is waiting
    /// already, so the caller must not sleep.
    fn arm(&self) -> bool;

    /// Makes `w` watch its ulnic endpoint (spec §6, "Several waiters").
    fn watch(&self, w: &ulnic::Watcher);
}
