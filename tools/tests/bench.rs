//! The benchmarks through the `ulnic` command: each prints the lines it
//! promises, and every line obeys what a working benchmark cannot break.

use std::process::Command;

/// Runs `ulnic ARGS` (a benchmark with `--json`), checks it succeeded,
/// and returns its JSON lines.
pub fn bench_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ulnic"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn dmq_benchmark_prints_queue_and_socket_lines() {
    let got: Vec<(String, String)> =
        bench_json(&["bench", "dmq", "--size", "1024", "--iters", "50", "--json"])
            .iter()
            .map(|v| {
                (
                    v["bench"].as_str().unwrap().to_string(),
                    v["transport"].as_str().unwrap().to_string(),
                )
            })
            .collect();
    let want: Vec<(String, String)> = [
        ("dmq-pingpong", "ulnic"),
        ("dmq-pingpong", "unix"),
        ("dmq-stream", "ulnic"),
        ("dmq-stream", "unix"),
    ]
    .iter()
    .map(|(b, t)| (b.to_string(), t.to_string()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn rdma_benchmarks_print_ulnic_and_memcpy_lines() {
    for workload in ["rdma-write", "rdma-read"] {
        let lines = bench_json(&[
            "bench",
            workload,
            "--size",
            "65536,4096",
            "--iters",
            "300",
            "--json",
        ]);
        let got: Vec<(String, u64)> = lines
            .iter()
            .map(|l| {
                (
                    l["transport"].as_str().unwrap().to_string(),
                    l["size"].as_u64().unwrap(),
                )
            })
            .collect();
        let want: Vec<(String, u64)> = [
            ("ulnic", 65536),
            ("memcpy", 65536),
            ("ulnic", 4096),
            ("memcpy", 4096),
        ]
        .iter()
        .map(|(t, s)| (t.to_string(), *s))
        .collect();
        assert_eq!(got, want, "{workload}");
        for l in &lines {
            assert_eq!(l["bench"], workload);
            assert_eq!(l["iters"], 300);
            assert!(
                l["mbytes_per_s"].as_f64().unwrap() > 0.0 && l["median_ns"].as_u64().unwrap() > 0,
                "{l}"
            );
        }
    }
}

#[test]
fn tripwire_benchmark_prints_ulnic_and_unix_lines() {
    let lines = bench_json(&["bench", "tripwire", "--iters", "200", "--json"]);
    let transports: Vec<&str> = lines
        .iter()
        .map(|l| l["transport"].as_str().unwrap())
        .collect();
    assert_eq!(transports, ["ulnic", "unix"]);
    for l in &lines {
        assert_eq!(
            (l["bench"].as_str(), l["iters"].as_u64()),
            (Some("tripwire"), Some(200))
        );
        assert!(l["median_ns"].as_u64().unwrap() > 0, "{l}");
    }
}

#[test]
fn utlb_benchmark_prints_the_table_and_the_stress() {
    let lines = bench_json(&[
        "bench",
        "utlb",
        "--iters",
        "200",
        "--size",
        "512",
        "--buffers",
        "16,64",
        "--utlb-entries",
        "32",
        "--json",
    ]);
    let table: Vec<(&str, u64, u64)> = lines
        .iter()
        .filter(|l| l["bench"] == "utlb")
        .map(|l| {
            (
                l["mode"].as_str().unwrap(),
                l["pages"].as_u64().unwrap(),
                l["size"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut want = Vec::new();
    for p in [1u64, 4, 16] {
        for m in ["hit", "miss-library", "miss-driver", "device-miss", "copy"] {
            want.push((m, p, p * 4096));
        }
    }
    assert_eq!(table, want);
    let stress: Vec<(&str, u64)> = lines
        .iter()
        .filter(|l| l["bench"] == "utlb-stress")
        .map(|l| (l["mode"].as_str().unwrap(), l["buffers"].as_u64().unwrap()))
        .collect();
    let policies = [
        "single-copy",
        "miss-inline",
        "fallback-every",
        "fallback-16k",
        "fallback-64k",
    ];
    let want: Vec<(&str, u64)> = [16u64, 64]
        .iter()
        .flat_map(|&n| policies.iter().map(move |p| (*p, n)))
        .collect();
    assert_eq!(stress, want);
    for l in lines.iter().filter(|l| l["bench"] == "utlb-stress") {
        assert_eq!(l["iters"], 200, "{l}");
        assert!(l["mbytes_per_s"].as_f64().unwrap() > 0.0, "{l}");
        if l["mode"] != "single-copy" {
            let ratio = l["hit_ratio"].as_f64().unwrap();
            // 16 buffers fit in 32 entries: once each miss is serviced all
            // hit (rate control services them more slowly); 64 do not fit,
            // and round robin past LRU never hits without fallback.
            match (l["buffers"].as_u64().unwrap(), l["mode"].as_str().unwrap()) {
                (16, "miss-inline" | "fallback-every") => assert!(ratio > 0.9, "{l}"),
                (64, "miss-inline") => assert_eq!(ratio, 0.0, "{l}"),
                _ => {}
            }
        }
    }
}
