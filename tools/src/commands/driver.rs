//! `ulnic driver-fuzz` and `ulnic driver-check`: the Linux driver tested
//! from inside a guest (`crate::driver_fuzz`, `crate::driver_check`); each
//! prints its report's table, or the report as one JSON object, and fails
//! on a kernel fault or a failed expectation.

use std::path::PathBuf;
use std::time::Duration;

use crate::driver_check::{self, Check, Handshake};

/// `ulnic driver-fuzz`'s options.
#[derive(clap::Args, Debug)]
pub struct DriverFuzzArgs {
    /// The device file.
    #[arg(long, default_value = "/dev/ulnic0")]
    pub device: String,
    /// Seed of the operation sequence (the same seed, the same calls).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many operations.
    #[arg(long, default_value_t = 3000)]
    pub operations: u64,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `ulnic driver-check`'s options.
#[derive(clap::Args, Debug)]
pub struct DriverCheckArgs {
    /// The situation.
    #[arg(value_enum)]
    pub check: Check,
    /// The device file.
    #[arg(long, default_value = "/dev/ulnic0")]
    pub device: PathBuf,
    /// Created once the check is set up.
    #[arg(long, default_value = "/tmp/ulnic-check.ready")]
    pub ready: PathBuf,
    /// Waited for before a stalled-device check goes on.
    #[arg(long, default_value = "/tmp/ulnic-check.go")]
    pub go: PathBuf,
    /// Seconds to wait for the situation.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ulnic driver-fuzz`.
pub fn run_fuzz(a: DriverFuzzArgs) -> anyhow::Result<()> {
    let report = crate::driver_fuzz::run(&a.device, a.seed, a.operations)?;
    if a.json {
        println!("{}", serde_json::json!(report));
    } else {
        print!("{}", report.table());
    }
    anyhow::ensure!(
        report.kernel_faults.is_empty(),
        "the kernel log shows {} fault line(s) after driver-fuzz (seed {})",
        report.kernel_faults.len(),
        a.seed
    );
    Ok(())
}

/// Runs `ulnic driver-check`.
pub fn run_check(a: DriverCheckArgs) -> anyhow::Result<()> {
    let hs = Handshake {
        ready: &a.ready,
        go: &a.go,
        timeout: Duration::from_secs(a.timeout),
    };
    let report = driver_check::run(a.check, &a.device, &hs)?;
    if a.json {
        println!("{}", serde_json::json!(report));
    } else {
        print!("{}", report.table());
    }
    let bad = report.failures.len() + report.kernel_faults.len();
    anyhow::ensure!(bad == 0, "driver-check {}: {bad} problem(s)", report.check);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};

    #[test]
    fn fuzz_options() {
        let Cmd::DriverFuzz(a) = try_parse(&["driver-fuzz"]).unwrap() else {
            panic!()
        };
        assert_eq!(
            (a.device.as_str(), a.seed, a.operations, a.json),
            ("/dev/ulnic0", 1, 3000, false)
        );
        let Cmd::DriverFuzz(a) = try_parse(&[
            "driver-fuzz",
            "--seed",
            "7",
            "--operations",
            "5000",
            "--json",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!((a.seed, a.operations, a.json), (7, 5000, true));
        let e = try_parse(&["driver-fuzz", "--seed", "-1"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn check_options() {
        let Cmd::DriverCheck(a) = try_parse(&["driver-check", "stalled-device"]).unwrap() else {
            panic!()
        };
        assert!(matches!(a.check, Check::StalledDevice));
        assert_eq!(a.device, PathBuf::from("/dev/ulnic0"));
        assert_eq!(a.ready, PathBuf::from("/tmp/ulnic-check.ready"));
        assert_eq!(a.go, PathBuf::from("/tmp/ulnic-check.go"));
        assert_eq!(a.timeout, 300);
        let Cmd::DriverCheck(a) =
            try_parse(&["driver-check", "device-removal", "--timeout", "5"]).unwrap()
        else {
            panic!()
        };
        assert!(matches!(a.check, Check::DeviceRemoval));
        assert_eq!(a.timeout, 5);
        let e = try_parse(&["driver-check"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let e = try_parse(&["driver-check", "unplugged"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("[possible values: stalled-device, device-removal]"),
            "{e}"
        );
    }

    #[test]
    fn report_tables() {
        let mut r = driver_check::Report {
            check: "stalled-device".into(),
            ..Default::default()
        };
        r.facts.insert("timed_out_after_s".into(), 10.5.into());
        assert_eq!(
            r.table(),
            "driver-check stalled-device\n  timed_out_after_s                  10.5\n  ok\n"
        );
        r.failures.push("no EIO".into());
        assert!(r.table().ends_with("  FAILED: no EIO\n"));
        let f = crate::driver_fuzz::Report {
            seed: 7,
            operations: 2,
            kernel_faults: vec!["BUG: x".into()],
            ..Default::default()
        };
        assert_eq!(
            f.table(),
            "driver-fuzz: 2 operations from seed 7\noperation      outcome         count\n\
             kernel log shows faults:\n  BUG: x\n"
        );
    }
}
