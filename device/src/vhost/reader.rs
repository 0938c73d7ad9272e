//! The thread that reads a frontend's vhost-user socket, watched from
//! outside: the vhost-user-backend crate reads and handles every message
//! on a thread of its own and offers no hook per message, so the device
//! counts the times that thread woke up instead (spec §10.6.1,
//! `vhost_wakeups`). Between messages it sleeps in `recvmsg`; a message
//! wakes it, and it sleeps again once it is handled, which Linux counts
//! as a voluntary context switch. Handling one may sleep more than once
//! (a lock, a reply) and messages queued together may share a wake-up, so
//! the count is not the number of messages; but an unchanged count means
//! the thread never woke, so no message came.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// A thread name for the next reader, unique in this process and short
/// enough for Linux's 15 bytes.
pub fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "ulnic-vh{}",
        NEXT.fetch_add(1, Ordering::Relaxed) % 10_000_000
    )
}

/// The id of this process's thread named `name`, if exactly one has it.
pub fn find_thread(name: &str) -> Option<i32> {
    let mut found = None;
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            if found.is_some() {
                return None;
            }
            found = entry.file_name().to_str()?.parse().ok();
        }
    }
    found
}

/// How many times thread `tid` of this process went to sleep of its own
/// accord, or None if it is gone or /proc does not say.
pub fn wakeups(tid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(
        Path::new("/proc/self/task")
            .join(tid.to_string())
            .join("status"),
    )
    .ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A thread that sleeps in a receive counts no wake-up while nothing
    /// comes, and some once messages came.
    #[test]
    fn a_sleeping_reader_counts_only_what_woke_it() {
        let (tx, rx) = mpsc::channel::<u32>();
        let (ready_tx, ready) = mpsc::channel();
        let t = std::thread::Builder::new()
            .name("ulnic-test-rd".into())
            .spawn(move || {
                ready_tx.send(()).unwrap();
                while rx.recv().is_ok() {}
            })
            .unwrap();
        ready.recv().unwrap();
        let tid = find_thread("ulnic-test-rd").expect("the thread by its name");
        std::thread::sleep(Duration::from_millis(50));
        let before = wakeups(tid).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(wakeups(tid).unwrap(), before, "woke with nothing sent");
        for i in 0..3 {
            tx.send(i).unwrap();
            std::thread::sleep(Duration::from_millis(30));
        }
        // It sleeps again once it took them (however late it runs).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while wakeups(tid).unwrap() == before && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let after = wakeups(tid).unwrap();
        assert!(after > before, "{before} -> {after}");
        drop(tx);
        t.join().unwrap();
        assert_eq!(wakeups(tid), None, "a thread that ended");
        assert_eq!(find_thread("no-such-thread"), None);
    }
}
