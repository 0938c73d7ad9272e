//! The data-path engine: one thread that polls the resident endpoints while
//! there is work, yields the core between passes, and after `poll_for` of
//! idleness asks every endpoint for doorbells and sleeps; a doorbell rung
//! meanwhile is served by the thread that receives it (`Shard::kicked`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::debug;

use crate::shard::Shard;

/// Longest sleep without a doorbell: a safety net, not part of the protocol.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// A fabric due time nearer than this is waited for spinning on the core.
const SPIN_FOR: Duration = Duration::from_micros(50);

/// A fabric due time nearer than this is waited for by polling, not sleeping
/// (a sleep's wake-up costs tens of microseconds and rounds to
/// milliseconds).
const SPIN_UNDER: Duration = Duration::from_millis(2);

/// Runs until the shard is stopped.
pub fn run(shard: Arc<Shard>, poll_for: Duration) {
    let mut idle_since = Instant::now();
    // The last sleep ended by the safety net alone (no kick, wake,
    // datagram or fabric time): work the next pass finds then was
    // announced by nothing (spec §10.6.1, `found_by_timer`).
    let mut safety_net = false;
    while !shard.stop.load(Ordering::Relaxed) {
        if shard.paused.load(Ordering::Relaxed) {
            // `Device::pause(false)` wakes this at once (a plain sleep
            // would add up to its length to the drain it times).
            shard.sleep(MAX_SLEEP);
            idle_since = Instant::now();
            safety_net = false;
            continue;
        }
        shard.disconnect_faulted();
        let work = shard.lock().poll();
        if std::mem::take(&mut safety_net) && work > 0 {
            shard.count_found_by_timer();
        }
        if work > 0 {
            shard.count_pass(false);
            idle_since = Instant::now();
            shard.mark_busy(idle_since);
            continue;
        }
        // A packet about to arrive on an emulated link: keep polling on
        // the core, not yielding to the scheduler, so the link's latency is
        // what was configured and not a time slice more (and sends posted
        // meanwhile are still seen at once).
        let due = shard.lock().fabric_due();
        shard.count_pass(due.is_none());
        if due.is_some_and(|d| d < SPIN_FOR) {
            std::hint::spin_loop();
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < poll_for {
            std::thread::yield_now();
            continue;
        }
        // Packets in flight or a transport timer: wait for the next of
        // them, polling when it is near (a sleep rounds to milliseconds).
        if due.is_some_and(|d| d < SPIN_UNDER) {
            std::thread::yield_now();
            continue;
        }
        let sleep = due.map_or(MAX_SLEEP, |d| d.min(MAX_SLEEP));
        // Dekker handshake with the drivers: every resident endpoint asks
        // for doorbells, then is looked at again, so a descriptor published
        // meanwhile is never missed (spec §5.8). Doorbells bring them back.
        // Those that had descriptors stay; if one more pass cannot move
        // them either, they wait for the fabric's next due time.
        let stayed = shard.lock().leave_all();
        // While it sleeps, a kick is served by the thread that receives
        // it (`Shard::kicked`).
        if stayed == 0 || shard.lock().poll() == 0 {
            let clock = shard.sleep_for_doorbells(sleep);
            // A fabric time it asked for is no safety net.
            safety_net = clock && due.is_none();
        }
        idle_since = Instant::now();
    }
    debug!("engine stopped");
}
