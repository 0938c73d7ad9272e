//! `ulnic selftest`: the NIC checked end to end from this machine
//! (`crate::selftest`), a line per check.

/// Runs `ulnic selftest`.
pub fn run() -> anyhow::Result<()> {
    match crate::selftest::run() {
        Ok(lines) => {
            print!("{}", report(&lines));
            Ok(())
        }
        Err(e) => Err(anyhow::anyhow!("selftest failed: {e}")),
    }
}

/// What the checks said, then "ok".
fn report(lines: &[String]) -> String {
    let mut out = String::new();
    for l in lines {
        crate::print::outln!(out, "ulnic-selftest: {l}");
    }
    out.push_str("ulnic-selftest: ok\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};

    #[test]
    fn takes_no_arguments() {
        assert!(matches!(try_parse(&["selftest"]).unwrap(), Cmd::Selftest));
        let e = try_parse(&["selftest", "--json"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn every_line_is_prefixed() {
        assert_eq!(
            report(&["a".into(), "b c".into()]),
            "ulnic-selftest: a\nulnic-selftest: b c\nulnic-selftest: ok\n"
        );
    }
}
