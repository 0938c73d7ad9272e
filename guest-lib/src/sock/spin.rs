//! How long a blocking call polls before it sleeps in the driver
//! (`SockConfig::spin`, `ULNIC_SPIN_US`, 50 us by default): what a peer
//! answers within that is taken without a wake-up. Measured between two
//! TCG guests on 2 cores, where a polling vCPU cannot yield the host's
//! cores: sockperf's TCP round trip was 310 us with 50 us of polling and
//! 237 us without, but redis-benchmark's 50 connections ran 10 % slower
//! without, so the default stays; a learned budget (polling only while
//! polls found something) was tried and dropped: on a host it turned
//! polling off for redis-benchmark, which then ran half as fast.

use std::time::{Duration, Instant};

/// One wait's polling budget.
///
/// ```
/// use std::time::Duration;
/// let mut spin = ulnic::sock::Spin::start(Duration::from_micros(50));
/// // A wait loop: poll while `spinning` says so, else sleep.
/// while spin.spinning() {
///     std::thread::yield_now();
/// }
/// ```
#[derive(Debug)]
pub struct Spin {
    until: Instant,
}

impl Spin {
    /// Starts a wait that polls for `budget`.
    ///
    /// ```
    /// let spin = ulnic::sock::Spin::start(std::time::Duration::ZERO);
    /// assert!(!spin.within());
    /// ```
    pub fn start(budget: Duration) -> Spin {
        Spin {
            until: Instant::now() + budget,
        }
    }

    /// Whether the budget lasts still.
    ///
    /// ```
    /// let spin = ulnic::sock::Spin::start(std::time::Duration::from_secs(1));
    /// assert!(spin.within());
    /// ```
    pub fn within(&self) -> bool {
        Instant::now() < self.until
    }

    /// The call has to wait: true while it should poll, false once it
    /// should sleep.
    ///
    /// ```
    /// let mut spin = ulnic::sock::Spin::start(std::time::Duration::ZERO);
    /// assert!(!spin.spinning());
    /// ```
    pub fn spinning(&mut self) -> bool {
        self.within()
    }
}
