//! `ulnic send` and `ulnic recv` (`crate::transfer`, whose `SendArgs` and
//! `RecvArgs` are their options): a line saying what went through, or
//! the report as one JSON object with `--json`.

use crate::print::outln;
use crate::transfer::{RecvArgs, RecvReport, SendArgs, SendReport};

/// Runs `ulnic send`.
pub fn run_send(a: SendArgs) -> anyhow::Result<()> {
    let r = crate::transfer::send(&a)?;
    if a.json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        print!("{}", send_line(&a, &r));
    }
    Ok(())
}

/// Runs `ulnic recv`.
pub fn run_recv(a: RecvArgs) -> anyhow::Result<()> {
    let r = crate::transfer::recv(&a)?;
    if a.json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        print!("{}", recv_line(&r));
    }
    Ok(())
}

/// What the sender saw, for people.
fn send_line(a: &SendArgs, r: &SendReport) -> String {
    let mut out = String::new();
    outln!(
        out,
        "ulnic send: {}: {} messages of {} bytes to {} in {:.2} s ({:.0} msg/s), {} returned and resent{}",
        r.outcome,
        r.messages,
        r.size,
        a.to,
        r.seconds,
        r.messages as f64 / r.seconds.max(1e-9),
        r.resent,
        r.close_message
            .as_deref()
            .map(|t| format!("; close message: \"{t}\""))
            .unwrap_or_default()
    );
    out
}

/// What the receiver saw, for people.
fn recv_line(r: &RecvReport) -> String {
    let mut out = String::new();
    outln!(
        out,
        "ulnic recv: {} messages ({} bytes) from {} in order, each once, intact, in {:.2} s; {} discarded after a gap and resent",
        r.messages,
        r.bytes,
        r.from,
        r.seconds,
        r.discarded_after_gap
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{try_parse, Cmd};

    fn send_args(args: &[&str]) -> Result<SendArgs, clap::Error> {
        let mut all = vec!["send"];
        all.extend_from_slice(args);
        match try_parse(&all)? {
            Cmd::Send(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    fn recv_args(args: &[&str]) -> Result<RecvArgs, clap::Error> {
        let mut all = vec!["recv"];
        all.extend_from_slice(args);
        match try_parse(&all)? {
            Cmd::Recv(a) => Ok(a),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn send_options() {
        let a = send_args(&["--to", "1:5"]).unwrap();
        assert_eq!(a.to, ulnic::Address { node: 1, port: 5 });
        assert_eq!((a.port, a.count, a.size, a.timeout), (6, 10000, 64, 300));
        assert!(!a.expect_close && !a.json);
        let e = send_args(&[]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let e = send_args(&["--to", "15"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(
            e.to_string().contains("'15': expected NODE:PORT, e.g. 1:5"),
            "{e}"
        );
        let e = send_args(&["--to", "x:5"]).unwrap_err();
        assert!(e.to_string().contains("'x' is not a node number"), "{e}");
    }

    #[test]
    fn recv_options() {
        let a = recv_args(&[]).unwrap();
        assert_eq!((a.port, a.max_size, a.timeout), (5, 65536, 300));
        assert_eq!(a.close_to, None);
        assert_eq!(a.ready_file, None);
        assert_eq!((a.progress_file, a.progress_after), (None, 1000));
        let a = recv_args(&["--port", "7", "--close-to", "0:6", "--json"]).unwrap();
        assert_eq!(a.port, 7);
        assert_eq!(a.close_to, Some(ulnic::Address { node: 0, port: 6 }));
        assert!(a.json);
        let a = recv_args(&["--progress-file", "/tmp/p", "--progress-after", "50"]).unwrap();
        assert_eq!(a.progress_file, Some("/tmp/p".into()));
        assert_eq!(a.progress_after, 50);
    }

    #[test]
    fn lines() {
        let a = send_args(&["--to", "1:5"]).unwrap();
        let r = SendReport {
            outcome: "finished",
            messages: 1000,
            size: 64,
            resent: 3,
            seconds: 0.5,
            close_message: None,
        };
        assert_eq!(
            send_line(&a, &r),
            "ulnic send: finished: 1000 messages of 64 bytes to 1:5 in 0.50 s (2000 msg/s), 3 returned and resent\n"
        );
        let r = SendReport {
            outcome: "peer-closed",
            close_message: Some("bye".into()),
            ..r
        };
        assert!(send_line(&a, &r).ends_with("3 returned and resent; close message: \"bye\"\n"));
        let r = RecvReport {
            from: "0:6".into(),
            messages: 10,
            bytes: 640,
            discarded_after_gap: 2,
            seconds: 1.234,
        };
        assert_eq!(
            recv_line(&r),
            "ulnic recv: 10 messages (640 bytes) from 0:6 in order, each once, intact, in 1.23 s; 2 discarded after a gap and resent\n"
        );
    }
}
