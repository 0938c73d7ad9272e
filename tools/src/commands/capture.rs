//! `ulnic capture`: a running device's link into a pcap file, through
//! `crate::capture`.

use std::path::PathBuf;

use crate::commands::fabric::LinkTarget;
use crate::print::positive_secs;

/// `ulnic capture`'s options.
#[derive(clap::Args, Debug)]
pub struct CaptureArgs {
    #[command(flatten)]
    pub at: LinkTarget,
    /// The pcap file to write.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Stop after this many packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub seconds: Option<f64>,
}

/// Runs `ulnic capture`.
pub fn run(a: CaptureArgs) -> anyhow::Result<()> {
    let span = positive_secs(a.seconds, "--seconds")?;
    let n = crate::capture::run(
        &a.at.device,
        a.at.member.as_deref(),
        a.at.link,
        a.at.node,
        &a.output,
        a.count,
        span,
        &mut |l| eprintln!("{l}"),
    )?;
    eprintln!("{n} packets written to {}", a.output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};
    use clap::error::ErrorKind;

    #[test]
    fn options() {
        let Cmd::Capture(a) = try_parse(&[
            "capture", "--device", "/d", "--node", "1", "-o", "n1.pcap", "--count", "10",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            (a.at.device, a.at.link, a.at.node),
            (PathBuf::from("/d"), None, Some(1))
        );
        assert_eq!(
            (a.output, a.count, a.seconds),
            (PathBuf::from("n1.pcap"), Some(10), None)
        );
        let Cmd::Capture(a) = try_parse(&[
            "capture",
            "--device",
            "/d",
            "--link",
            "0",
            "--output",
            "t.pcap",
            "--seconds",
            "5",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!((a.at.link, a.seconds), (Some(0), Some(5.0)));
        for (args, kind) in [
            (
                &["capture", "--device", "/d", "--node", "1"][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["capture", "--device", "/d", "-o", "x"],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &[
                    "capture", "--device", "/d", "--link", "0", "--node", "1", "-o", "x",
                ],
                ErrorKind::ArgumentConflict,
            ),
        ] {
            assert_eq!(try_parse(args).unwrap_err().kind(), kind, "{args:?}");
        }
    }

    #[test]
    fn seconds_must_be_positive() {
        let Cmd::Capture(a) = try_parse(&[
            "capture",
            "--device",
            "/nonexistent",
            "--link",
            "0",
            "-o",
            "x",
            "--seconds",
            "0",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            run(a).unwrap_err().to_string(),
            "--seconds must be a positive number of seconds"
        );
    }
}
