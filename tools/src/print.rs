//! What the commands' printers share: `outln!` (a line into a `String`),
//! `--json` lines, byte counts in human units, and the one argument check
//! several commands make (a positive number of seconds).
//!
//! Printers build `String`s so that tests can read them; a command's `run`
//! prints them (`print!`).

use std::time::Duration;

/// `outln!(out, "...", args)`: `writeln!` into the `String` `out` (which
/// cannot fail); `outln!(out)` ends a line.
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}
pub(crate) use outln;

/// One JSON object per row, one row per line: a benchmark's `--json`
/// output.
pub fn json_lines<T: serde::Serialize>(rows: &[T]) -> anyhow::Result<String> {
    let mut out = String::new();
    for r in rows {
        outln!(out, "{}", serde_json::to_string(r)?);
    }
    Ok(out)
}

/// Prints one JSON object per row (`json_lines`).
pub fn print_json_lines<T: serde::Serialize>(rows: &[T]) -> anyhow::Result<()> {
    print!("{}", json_lines(rows)?);
    Ok(())
}

/// A duration given in seconds on the command line, which must be a
/// positive number.
pub fn positive_secs(v: Option<f64>, flag: &str) -> anyhow::Result<Option<Duration>> {
    v.map(|s| {
        anyhow::ensure!(
            s.is_finite() && s > 0.0,
            "{flag} must be a positive number of seconds"
        );
        Ok(Duration::from_secs_f64(s))
    })
    .transpose()
}

/// Bytes in human units, as fabtests prints them (1k = 1024).
pub fn human_bytes(b: f64) -> String {
    let units = ["", "k", "m", "g", "t"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0}")
    } else {
        format!("{v:.0}{}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_counts_in_powers_of_1024() {
        assert_eq!(human_bytes(0.0), "0");
        assert_eq!(human_bytes(1023.0), "1023");
        assert_eq!(human_bytes(1024.0), "1k");
        assert_eq!(human_bytes(40.0 * 5000.0), "195k");
        assert_eq!(human_bytes(65536.0 * 5000.0), "312m");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3g");
        // Past the last unit, the number grows.
        assert_eq!(human_bytes(2048.0 * 1024f64.powi(4)), "2048t");
    }

    #[test]
    fn positive_secs_takes_positive_numbers_only() {
        assert_eq!(positive_secs(None, "--watch").unwrap(), None);
        assert_eq!(
            positive_secs(Some(0.25), "--watch").unwrap(),
            Some(Duration::from_millis(250))
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = positive_secs(Some(bad), "--seconds").unwrap_err();
            assert_eq!(
                e.to_string(),
                "--seconds must be a positive number of seconds"
            );
        }
    }

    #[test]
    fn json_lines_are_one_object_a_line() {
        #[derive(serde::Serialize)]
        struct Row {
            a: u32,
            b: &'static str,
        }
        let rows = [Row { a: 1, b: "x" }, Row { a: 2, b: "y" }];
        assert_eq!(
            json_lines(&rows).unwrap(),
            "{\"a\":1,\"b\":\"x\"}\n{\"a\":2,\"b\":\"y\"}\n"
        );
        assert_eq!(json_lines::<Row>(&[]).unwrap(), "");
    }

    #[test]
    fn outln_writes_lines() {
        let mut out = String::new();
        outln!(out, "{:>4}|{:<3}|", 7, "ab");
        outln!(out);
        outln!(out, "end");
        assert_eq!(out, "   7|ab |\n\nend\n");
    }
}
