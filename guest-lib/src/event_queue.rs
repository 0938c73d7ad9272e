//! CLAN's event queue as an object the library's own blocking paths share
//! (spec §6.1): sources attached with [`EventQueue::attach`] report to one
//! queue endpoint, and every wait on one of them ([`Endpoint::wait`], its
//! [`crate::Waiter`], [`Endpoint::wait_tripwire`]) and on the queue
//! itself ([`EventQueue::wait`]) sleeps on the queue's one notification.
//!
//! One thread at a time sleeps in the driver (the *sleeper*); the others
//! wait on a condition variable. Whoever holds the lock takes the queue's
//! QUEUED events into a list of reports, and a waiter takes its own: a
//! thread waiting on a source takes that source's report, and
//! [`EventQueue::wait`] takes the reports of sources nobody waits on, so a
//! source's report is never taken by one and awaited by another.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::Domain;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::nic::ProtectionDomain;
use crate::reporting::{Reporting, SourceWaits};
use crate::types::{EndpointConfig, Event};

/// What every holder of an [`EventQueue`] and its sources share.
struct Hub {
    dom: Arc<dyn Domain>,
    queue_id: u32,
    state: Mutex<HubState>,
    changed: Condvar,
}

struct HubState {
    /// The queue endpoint (its event ring is read here only).
    queue: Endpoint,
    /// Reports taken from the ring and not yet taken by a waiter, in the
    /// order they came: (source, cookie).
    reported: VecDeque<(u32, u64)>,
    /// Threads waiting on each source now.
    waiting: HashMap<u32, u32>,
    /// A thread sleeps in the driver on the queue's notification.
    sleeping: bool,
}

impl HubState {
    /// Moves the QUEUED events from the queue's ring to `reported`: true if
    /// there were any. The queue endpoint sends nothing, so nothing else
    /// comes there but what the device posts to every endpoint (conditions),
    /// which a queue has no use for.
    fn drain(&mut self) -> bool {
        let mut any = false;
        while let Some(e) = self.queue.poll_event() {
            if let Event::Queued { cookie, source } = e {
                push_report(&mut self.reported, source, cookie);
                any = true;
            }
        }
        any
    }

    /// Takes `source`'s report, if there is one.
    fn take(&mut self, source: u32) -> bool {
        take_source(&mut self.reported, source)
    }

    /// Takes the reports of sources nobody is waiting on: their cookies.
    fn take_unclaimed(&mut self) -> Vec<u64> {
        take_unclaimed(&mut self.reported, &self.waiting)
    }
}

/// Lists `source`'s report unless it is listed already.
fn push_report(reported: &mut VecDeque<(u32, u64)>, source: u32, cookie: u64) {
    if !reported.iter().any(|&(s, _)| s == source) {
        reported.push_back((source, cookie));
    }
}

/// Takes `source`'s report from `reported`: whether there was one.
fn take_source(reported: &mut VecDeque<(u32, u64)>, source: u32) -> bool {
    let before = reported.len();
    reported.retain(|&(s, _)| s != source);
    reported.len() != before
}

/// Takes the reports of sources no thread in `waiting` waits on, in
/// order: their cookies.
fn take_unclaimed(reported: &mut VecDeque<(u32, u64)>, waiting: &HashMap<u32, u32>) -> Vec<u64> {
    let mut out = Vec::new();
    reported.retain(|&(s, c)| {
        let claimed = waiting.get(&s).is_some_and(|&n| n > 0);
        if !claimed {
            out.push(c);
        }
        claimed
    });
    out
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until `take` finds what it wants (Some), or `timeout`
    /// passes (None). Takes the queue's events, then sleeps in the driver
    /// when no other thread does, else on the condition variable.
    /// `consumer`: the queue's own consumer, who may have slept on the
    /// queue's descriptor in its own poll: a notification nobody slept
    /// on is taken first, so the descriptor stops being readable for it
    /// (never while a sleeper waits for it). A waiter on a source skips
    /// that system call: such a notification only wakes a sleeper once
    /// for nothing.
    fn wait_for<T>(
        &self,
        timeout: Duration,
        consumer: bool,
        mut take: impl FnMut(&mut HubState) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        if consumer && !st.sleeping {
            self.dom.wait(self.queue_id, Duration::ZERO)?;
        }
        loop {
            if let Some(t) = take(&mut st) {
                return Ok(Some(t));
            }
            if st.drain() {
                // Others may find theirs among what came.
                self.changed.notify_all();
                continue;
            }
            // Check, arm, re-check (spec §6): an event posted meanwhile
            // is seen here or notifies the queue. A zero timeout arms
            // too, for a program that then sleeps on the descriptor.
            if !st.sleeping && st.queue.arm()? {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            if st.sleeping {
                st = match self.changed.wait_timeout(st, left) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
                continue;
            }
            st.sleeping = true;
            drop(st);
            let slept = self.dom.wait(self.queue_id, left);
            st = self.lock();
            st.sleeping = false;
            // Another waiter may take the sleeper's place.
            self.changed.notify_all();
            slept?;
        }
    }
}

impl SourceWaits for Hub {
    fn wait_source(&self, source: u32, timeout: Duration) -> Result<bool, Error> {
        self.claim(source);
        let r = self.wait_for(timeout, false, |st| st.take(source).then_some(()));
        self.unclaim(source);
        r.map(|got| got.is_some())
    }

    fn claim(&self, source: u32) {
        *self.lock().waiting.entry(source).or_insert(0) += 1;
    }

    fn unclaim(&self, source: u32) {
        let mut st = self.lock();
        if let Some(n) = st.waiting.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                st.waiting.remove(&source);
            }
        }
    }

    fn forget(&self, source: u32) {
        let mut st = self.lock();
        st.drain();
        st.take(source);
    }
}

/// CLAN's event queue (spec §6.1): one queue that many endpoints of a
/// protection domain report to, each with a cookie, in the order their
/// activity came, once per arm; one file descriptor and one sleep for all
/// of them. The library's own waits on an attached endpoint
/// ([`Endpoint::wait`], [`crate::Waiter::wait`],
/// [`Endpoint::wait_tripwire`]) sleep on the queue too, so threads that
/// block on single endpoints and a thread that serves the queue can mix.
///
/// Clones share the queue.
///
/// ```no_run
/// # let nic = ulnic::Nic::open()?;
/// let pd = nic.alloc_pd()?;
/// let queue = ulnic::EventQueue::new(&pd)?;
/// let mut eps = Vec::new();
/// for port in 10..13 {
///     let mut ep = pd.create_endpoint(&Default::default())?;
///     ep.bind(port)?;
///     queue.attach(&mut ep, u64::from(port))?;
///     eps.push(ep);
/// }
/// for cookie in queue.wait(std::time::Duration::from_secs(1))? {
///     let ep = &mut eps[cookie as usize - 10];
///     while let Some(m) = ep.poll_recv() {
///         println!("port {cookie}: {} bytes", m.len);
///     }
///     ep.arm()?; // report again on the next arrival
/// }
/// # Ok::<(), ulnic::Error>(())
/// ```
#[derive(Clone)]
pub struct EventQueue {
    hub: Arc<Hub>,
}

impl EventQueue {
    /// A queue in `pd` (its endpoint made with the default configuration:
    /// room for 144 sources on a device with the default tripwires).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let queue = ulnic::EventQueue::new(&nic.alloc_pd()?)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn new(pd: &ProtectionDomain) -> Result<EventQueue, Error> {
        Self::with_config(pd, &EndpointConfig::default())
    }

    /// A queue whose endpoint is made with `cfg` (its event ring bounds
    /// the sources: spec §4.2).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// let cfg = ulnic::EndpointConfig { send_entries: 1024, ..Default::default() };
    /// let queue = ulnic::EventQueue::with_config(&nic.alloc_pd()?, &cfg)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn with_config(pd: &ProtectionDomain, cfg: &EndpointConfig) -> Result<EventQueue, Error> {
        let queue = pd.create_endpoint(cfg)?;
        Ok(EventQueue {
            hub: Arc::new(Hub {
                dom: queue.dom.clone(),
                queue_id: queue.id,
                state: Mutex::new(HubState {
                    queue,
                    reported: VecDeque::new(),
                    waiting: HashMap::new(),
                    sleeping: false,
                }),
                changed: Condvar::new(),
            }),
        })
    }

    /// Attaches `ep` (an endpoint of the queue's domain, with no queue
    /// yet) with `cookie` and arms it: its next message or event reports
    /// `cookie` here. Errors as [`Endpoint::set_event_queue`]'s.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # let queue = ulnic::EventQueue::new(&pd)?;
    /// let mut ep = pd.create_endpoint(&Default::default())?;
    /// queue.attach(&mut ep, 7)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn attach(&self, ep: &mut Endpoint, cookie: u64) -> Result<(), Error> {
        if !Arc::ptr_eq(&ep.dom, &self.hub.dom) {
            return Err(Error::InvalidArgument(
                "the event queue is an endpoint of another protection domain",
            ));
        }
        ep.report_to(
            self.hub.queue_id,
            cookie,
            Reporting::Shared(self.hub.clone()),
        )?;
        ep.arm()?;
        Ok(())
    }

    /// Detaches `ep` from this queue: it is notified itself again.
    /// `EINVAL` if it is not attached here.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let pd = nic.alloc_pd()?;
    /// # let queue = ulnic::EventQueue::new(&pd)?;
    /// # let mut ep = pd.create_endpoint(&Default::default())?;
    /// queue.attach(&mut ep, 7)?;
    /// queue.detach(&mut ep)?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn detach(&self, ep: &mut Endpoint) -> Result<(), Error> {
        if !ep
            .reporting
            .get()
            .is_shared_with(Arc::as_ptr(&self.hub).cast::<()>())
        {
            return Err(Error::InvalidArgument(
                "the endpoint is not attached to this event queue",
            ));
        }
        ep.clear_event_queue()?;
        Ok(())
    }

    /// The cookies of the sources that reported, in the order they came,
    /// once each; waits up to `timeout` when none has (empty: none came).
    /// A source that a thread is waiting on itself ([`Endpoint::wait`])
    /// is that thread's, not reported here. Serve each source, then arm
    /// it again ([`Endpoint::arm`]) so that it reports its next activity.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let queue = ulnic::EventQueue::new(&nic.alloc_pd()?)?;
    /// let ready = queue.wait(std::time::Duration::from_millis(100))?;
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn wait(&self, timeout: Duration) -> Result<Vec<u64>, Error> {
        let got = self.hub.wait_for(timeout, true, |st| {
            let c = st.take_unclaimed();
            (!c.is_empty()).then_some(c)
        })?;
        Ok(got.unwrap_or_default())
    }

    /// The file descriptor that becomes readable when the queue is
    /// notified, for a program that sleeps in its own `poll`/`epoll`:
    /// [`EventQueue::wait`] with a zero timeout takes what came and arms
    /// the queue; sleep only when it returned nothing. Under host attach
    /// the descriptor is shared with the attachment's other endpoints.
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let queue = ulnic::EventQueue::new(&nic.alloc_pd()?)?;
    /// println!("pollable: {}", queue.notification_fd().is_some());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn notification_fd(&self) -> Option<std::os::fd::RawFd> {
        self.hub.dom.notification_fd()
    }

    /// The queue's endpoint id (what its sources' QUEUED events and the
    /// device's counters name).
    ///
    /// ```no_run
    /// # let nic = ulnic::Nic::open()?;
    /// # let queue = ulnic::EventQueue::new(&nic.alloc_pd()?)?;
    /// println!("queue endpoint {}", queue.id());
    /// # Ok::<(), ulnic::Error>(())
    /// ```
    pub fn id(&self) -> u32 {
        self.hub.queue_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(
        reported: &[(u32, u64)],
        waiting: &[(u32, u32)],
    ) -> (VecDeque<(u32, u64)>, HashMap<u32, u32>) {
        (
            reported.iter().copied().collect(),
            waiting.iter().copied().collect(),
        )
    }

    #[test]
    fn the_queue_takes_only_reports_nobody_waits_for_and_a_waiter_its_own() {
        let (mut reported, waiting) = state(&[(4, 40), (5, 50), (6, 60)], &[(5, 1)]);
        assert_eq!(take_unclaimed(&mut reported, &waiting), [40, 60]);
        assert_eq!(reported, [(5, 50)]);
        assert!(take_source(&mut reported, 5));
        assert!(!take_source(&mut reported, 5));
        assert!(reported.is_empty());
        // A source that reported once is listed once.
        let (mut reported, _) = state(&[(4, 40)], &[]);
        push_report(&mut reported, 4, 40);
        push_report(&mut reported, 7, 70);
        assert_eq!(reported, [(4, 40), (7, 70)]);
    }
}
