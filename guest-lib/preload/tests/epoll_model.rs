//! The epoll model test: random sequences of `epoll_ctl` (ADD, MOD, DEL
//! with level- and edge-triggered, one-shot and RDHUP interests, in two
//! sets), writes, reads, half-closes, closes, `epoll_wait` (with room
//! for all, and one entry at a time: ready entries take turns) and `poll` on
//! two connection pairs and a pipe, run by `tests/progs/epollmodel.c`
//! over ulnic (under the layer, host-attached, the pairs connected to the
//! process's own node) and over kernel TCP on 127.0.0.1. Both must print
//! the same: every call's result and every readiness reported. The number
//! of sequences is `ULNIC_EPOLL_MODEL_CASES` (default 10,000).
//!
//! A second run mixes in blocking waits (`bwait`, `bpoll`, `fwait`)
//! during which another thread, or a forked child, writes to a stream
//! the wait watches, and `tread`: a thread blocked in a read (150 ms
//! `SO_RCVTIMEO`) while another writes to it and a third waits in
//! `epoll_wait` on other sockets, which must not take the reader's
//! wake-up, and `dwait`: two threads in two epoll sets, a write waking
//! one of them, which the other must not take. A wake-up lost there leaves the wait asleep to its timeout,
//! so it reports less than the kernel's. That run also requires
//! the layer's wake counters (`ULNIC_STATS=1`) to say that no wake-up was
//! found by timer.

use std::cell::{Cell, RefCell};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// One `epollmodel` process, fed sequences.
struct Model {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Model {
    fn start(cmd: &mut Command) -> Model {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("epollmodel starts");
        let input = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n", "epollmodel did not start");
        Model {
            child,
            input: Some(input),
            output,
        }
    }

    /// Feeds a sequence; a process that exited reads nothing (its
    /// transcript says so).
    fn send(&mut self, seq: &[String]) {
        let input = self.input.as_mut().expect("still running");
        let _ = seq
            .iter()
            .try_for_each(|l| writeln!(input, "{l}"))
            .and_then(|()| writeln!(input, "end"))
            .and_then(|()| input.flush());
    }

    /// What the sequence printed, up to its "end".
    fn transcript(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let mut line = String::new();
            if self.output.read_line(&mut line).unwrap() == 0 {
                out.push("(epollmodel exited)".into());
                return out;
            }
            let line = line.trim_end().to_string();
            if line == "end" {
                return out;
            }
            out.push(line);
        }
    }
}

impl Model {
    /// Ends the process as a program ends (its stdin closed, so it
    /// returns from main and `exit` runs its handlers).
    fn finish(mut self) {
        drop(self.input.take());
        let _ = self.child.wait();
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const STREAMS: [&str; 4] = ["c0", "s0", "c1", "s1"];
const NAMES: [&str; 5] = ["c0", "s0", "c1", "s1", "p"];

fn line() -> impl Strategy<Value = String> {
    let name = proptest::sample::select(&NAMES[..]);
    let stream = proptest::sample::select(&STREAMS[..]);
    let mask = (
        proptest::bool::ANY,
        proptest::bool::ANY,
        proptest::bool::weighted(0.3),
        proptest::bool::weighted(0.4),
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(i, o, r, e, one)| {
            let m: String = [(i, 'i'), (o, 'o'), (r, 'r'), (e, 'e'), (one, '1')]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, c)| *c)
                .collect();
            if m.is_empty() {
                "-".to_string()
            } else {
                m
            }
        });
    let how = proptest::sample::select(&["add", "add", "mod", "del"][..]);
    prop_oneof![
        5 => (0..2u8, how, name.clone(), mask).prop_map(|(s, h, n, m)| format!("ctl {s} {h} {n} {m}")),
        3 => (proptest::sample::select(&["c0", "s0", "c1", "s1", "q"][..]), 1..3000u32)
            .prop_map(|(n, b)| format!("write {n} {b}")),
        2 => (name, 1..4000u32).prop_map(|(n, b)| format!("read {n} {b}")),
        5 => (0..2u8).prop_map(|s| format!("wait {s}")),
        1 => Just("poll".to_string()),
        1 => (0..2u8).prop_map(|s| format!("turns {s}")),
        1 => stream.clone().prop_map(|n| format!("shut {n}")),
        1 => stream.prop_map(|n| format!("close {n}")),
    ]
}

/// Lines of the second run: the first run's, and blocking waits while
/// another thread or process writes.
fn blocking_line() -> impl Strategy<Value = String> {
    let stream = proptest::sample::select(&STREAMS[..]);
    prop_oneof![
        6 => line(),
        1 => (0..2u8, stream.clone(), 1..3000u32).prop_map(|(s, n, b)| format!("bwait {s} {n} {b}")),
        1 => (stream.clone(), 1..3000u32).prop_map(|(n, b)| format!("bpoll {n} {b}")),
        1 => (0..2u8, stream.clone(), 1..3000u32).prop_map(|(s, n, b)| format!("fwait {s} {n} {b}")),
        1 => (0..2u8, stream.clone(), 1..3000u32).prop_map(|(s, n, b)| format!("tread {s} {n} {b}")),
        1 => (stream, 1..3000u32).prop_map(|(n, b)| format!("dwait {n} {b}")),
    ]
}

fn built() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

#[test]
fn epoll_over_ulnic_reports_what_the_kernel_reports() {
    let cases: u32 = std::env::var("ULNIC_EPOLL_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    compare(cases, line(), false);
}

#[test]
fn blocked_waits_see_what_other_threads_and_processes_change() {
    let cases: u32 = std::env::var("ULNIC_EPOLL_MODEL_BLOCKING_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    compare(cases, blocking_line(), true);
}

/// Runs `cases` sequences of `lines` over ulnic and the kernel and
/// requires the same transcripts; with `wakes`, also that the layer found
/// no wake-up by timer.
fn compare(cases: u32, lines_of: impl Strategy<Value = String>, wakes: bool) {
    let prog = ulnic_testkit::c_program(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/epollmodel.c"),
    );
    let preload = built().join("libulnic_preload.so");
    assert!(preload.exists(), "{} not built", preload.display());
    // A host-attached child's closed connections keep their endpoints
    // until the parent detaches (docs/sockets.md §7 "fork"): `fwait`
    // leaves one behind each time.
    let endpoints = if wakes { 1024 } else { 64 };
    let dev = ulnic_testkit::device_with(1, |b| b.max_endpoints(endpoints));
    // Two free ports (the layer binds a listener on any address in the
    // kernel too).
    let free = || {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        (l.local_addr().unwrap().port().to_string(), l)
    };
    let ((port, a), (uport, b)) = (free(), free());
    drop((a, b));
    let stats = tempfile::NamedTempFile::new().unwrap();
    let kernel = RefCell::new(Model::start(Command::new(prog).args(["127.0.0.1", &port])));
    let ulnic = RefCell::new(Model::start(
        Command::new(prog)
            .args(["10.81.0.1", &uport])
            .env("LD_PRELOAD", &preload)
            .env("ULNIC_INET", "10.81.0.0/24")
            .env("ULNIC_SOCKET", &dev.sockets()[0])
            .env("ULNIC_STATS", "1")
            .stderr(stats.reopen().unwrap()),
    ));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        // Blocking waits leave children and threads behind a failure:
        // the sequence that failed is reported as it ran, not shrunk.
        max_shrink_iters: if wakes {
            0
        } else {
            Config::default().max_shrink_iters
        },
        ..Config::default()
    });
    let lines = Cell::new(0usize);
    let result = runner.run(&proptest::collection::vec(lines_of, 1..24), |seq| {
        let (mut kernel, mut ulnic) = (kernel.borrow_mut(), ulnic.borrow_mut());
        kernel.send(&seq);
        ulnic.send(&seq);
        let (k, u) = (kernel.transcript(), ulnic.transcript());
        lines.set(lines.get() + seq.len());
        if k != u {
            let mut report = String::from("sequence | kernel | ulnic\n");
            let width = k.len().max(u.len());
            for i in 0..width {
                report += &format!(
                    "{:<22} | {:<28} | {}{}\n",
                    seq.get(i).map_or("", String::as_str),
                    k.get(i).map_or("", String::as_str),
                    u.get(i).map_or("", String::as_str),
                    if k.get(i) != u.get(i) { "   <--" } else { "" }
                );
            }
            return Err(TestCaseError::fail(report));
        }
        Ok(())
    });
    if let Err(e) = result {
        let stderr = std::fs::read_to_string(stats.path()).unwrap_or_default();
        panic!("{e}\nthe ulnic model's stderr:\n{stderr}");
    }
    eprintln!(
        "epoll model: {cases} sequences, {} calls, ulnic and kernel agree",
        lines.get()
    );
    ulnic.into_inner().finish();
    let report = std::fs::read_to_string(stats.path()).unwrap();
    eprint!("{report}");
    if wakes {
        let found: Vec<&str> = report
            .lines()
            .filter(|l| l.contains("wakes pid"))
            .filter(|l| !l.contains("found_by_timer 0 "))
            .collect();
        assert!(
            report.contains("wakes pid") && found.is_empty(),
            "the layer found wake-ups by timer (lost wake-ups): {found:?}\n{report}"
        );
    }
}
