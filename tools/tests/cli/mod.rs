//! Running the `ulnic` command from the tools' tests.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `ulnic ARGS` and returns what it did.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ulnic"))
        .args(args)
        .output()
        .expect("ulnic runs")
}

/// Takes the named cluster down when dropped (a test's clusters go even
/// when it fails).
pub struct Down(pub String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = run(&["cluster", "down", "--name", &self.0]);
    }
}

/// Runs `cmd` on `node` of `cluster`, checks it succeeded, and returns
/// its stdout.
pub fn exec_ok(cluster: &str, node: &str, cmd: &str) -> String {
    let o = run(&["cluster", "exec", node, "--name", cluster, "--", cmd]);
    assert!(o.status.success(), "{cmd}:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// An output's exit status, stdout and stderr, for a failure message.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `ulnic ARGS`, checks it succeeded, and returns its stdout as
/// JSON lines (the command's `--json` output).
pub fn json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ulnic"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ulnic {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Checks `bench apps --json` lines: for each of redis (SET, GET),
/// iperf3 and sockperf one measurement over ulnic and one over the
/// kernel, each with positive figures, then the paired ratios.
pub fn assert_apps_lines(rows: &[serde_json::Value], place: &str) {
    // A server shape beside the three programs (nginx between guests):
    // measured over both transports, its throughput judged.
    let shapes: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["bench"] == "apps" && r["app"] == "nginx")
        .collect();
    if !shapes.is_empty() {
        let mut t: Vec<&str> = shapes
            .iter()
            .map(|r| {
                assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
                assert!(r["mean_us"].as_f64().unwrap() > 0.0, "{r}");
                r["transport"].as_str().unwrap()
            })
            .collect();
        t.sort();
        assert_eq!(t, ["tcp", "ulnic"], "{shapes:?}");
    }
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .filter(|r| r["app"] != "nginx")
        .cloned()
        .collect();
    let rows = &rows[..];
    let measured: Vec<(&str, &str, &str)> = rows
        .iter()
        .filter(|r| r["bench"] == "apps")
        .map(|r| {
            assert_eq!(r["where"], place, "{r}");
            assert_eq!(r["round"], 0, "{r}");
            (
                r["app"].as_str().unwrap(),
                r["test"].as_str().unwrap(),
                r["transport"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        measured,
        [
            ("redis", "SET", "ulnic"),
            ("redis", "GET", "ulnic"),
            ("redis", "SET", "tcp"),
            ("redis", "GET", "tcp"),
            ("iperf3", "stream", "ulnic"),
            ("iperf3", "stream", "tcp"),
            ("sockperf", "ping-pong", "ulnic"),
            ("sockperf", "ping-pong", "tcp"),
        ]
    );
    for r in rows.iter().filter(|r| r["bench"] == "apps") {
        let positive = |k: &str| r[k].as_f64().is_some_and(|v| v > 0.0);
        match r["app"].as_str().unwrap() {
            "iperf3" => assert!(positive("gbit_per_s"), "{r}"),
            _ => assert!(
                positive("ops_per_s")
                    && positive("p50_us")
                    && r["p99_us"].as_f64() >= r["p50_us"].as_f64(),
                "{r}"
            ),
        }
    }
    let ratios: Vec<(&str, &str, &str)> = rows
        .iter()
        .filter(|r| r["bench"] == "apps-ratio")
        .map(|r| {
            let (u, t) = (r["ulnic"].as_f64().unwrap(), r["tcp"].as_f64().unwrap());
            let ratio = r["ratio"].as_f64().unwrap();
            assert!((ratio - u / t).abs() <= 1e-9 * ratio.max(1.0), "{r}");
            (
                r["app"].as_str().unwrap(),
                r["test"].as_str().unwrap(),
                r["metric"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ratios,
        [
            ("redis", "SET", "ops/s"),
            ("redis", "SET", "p50 us"),
            ("redis", "GET", "ops/s"),
            ("redis", "GET", "p50 us"),
            ("iperf3", "stream", "Gbit/s"),
            ("sockperf", "ping-pong", "RTT p50 us"),
            ("sockperf", "ping-pong", "RTT p99 us"),
        ]
    );
    assert_no_lost_wakeup(rows);
}

/// `bench apps`' wake-up line: the programs under the layer reported,
/// and none of their sleeps found work that no notification announced.
pub fn assert_no_lost_wakeup(rows: &[serde_json::Value]) {
    let w = rows
        .iter()
        .find(|r| r["bench"] == "apps-wakes")
        .unwrap_or_else(|| panic!("no apps-wakes line: {rows:?}"));
    assert!(w["processes"].as_u64().unwrap() > 0, "{w}");
    assert_eq!(w["found_by_timer"], 0, "a wake-up found by a timer: {w}");
}

/// The benchmarks' median: the middle of the sorted values (the upper one
/// of an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Checks a `bench compare` row against the rounds it carries: `value` is
/// their median, and `ulnic_ratio` (when there is one) the median, round
/// by round, of the section's ulnic row (its first: same workload and
/// size) over this row.
pub fn assert_compare_row(rows: &[serde_json::Value], r: &serde_json::Value) {
    let rounds = |r: &serde_json::Value| -> Vec<f64> {
        let v: Vec<f64> = r["rounds"]
            .as_array()
            .unwrap_or_else(|| panic!("no rounds: {r}"))
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(
            !v.is_empty() && v.iter().all(|x| x.is_finite() && *x > 0.0),
            "{r}"
        );
        v
    };
    let close = |got: f64, want: f64| {
        assert!(
            (got - want).abs() <= 1e-9 * want.abs().max(1.0),
            "{got} is not {want}: {r}"
        )
    };
    let mine = rounds(r);
    close(r["value"].as_f64().unwrap(), median(mine.clone()));
    if let Some(ratio) = r["ulnic_ratio"].as_f64() {
        let ulnic = rows
            .iter()
            .find(|u| u["workload"] == r["workload"] && u["size"] == r["size"])
            .unwrap();
        let paired = rounds(ulnic)
            .iter()
            .zip(&mine)
            .map(|(u, p)| u / p)
            .collect();
        close(ratio, median(paired));
    }
}
