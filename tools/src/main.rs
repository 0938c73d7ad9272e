//! `ulnic`: parses the command line and runs the command (the crate's
//! library, `ulnic_tools`, holds the commands: see its `commands` and
//! `cli` modules).

use std::process::ExitCode;

use clap::Parser;
use ulnic_tools::cli::{Cli, Cmd};
use ulnic_tools::commands::{self, ExitStatus};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The device narrates; benchmarks print only their results.
    let level = if cli.command.narrates() {
        "info"
    } else {
        "warn"
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    // Commands that only print tables end quietly when their reader goes
    // (`ulnic stats | head`), as other Unix tools do. Not the rest: a
    // device or launcher must outlive a client that hangs up.
    if cli.command.only_prints() {
        // SAFETY: restoring the default disposition of SIGPIPE before any
        // thread starts has no other effect.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let r = match cli.command {
        Cmd::Device(a) => commands::device::run(a),
        Cmd::Bench(a) => commands::bench::run(a),
        Cmd::Selftest => commands::selftest::run(),
        Cmd::DriverFuzz(a) => commands::driver::run_fuzz(a),
        Cmd::DriverCheck(a) => commands::driver::run_check(a),
        Cmd::Send(a) => commands::transfer::run_send(a),
        Cmd::Recv(a) => commands::transfer::run_recv(a),
        Cmd::Cluster(c) => commands::cluster::run(c),
        Cmd::Image(c) => commands::image::run(c),
        Cmd::Fabric(c) => commands::fabric::run(c),
        Cmd::Stats(a) => commands::stats::run(a),
        Cmd::Capture(a) => commands::capture::run(a),
        Cmd::BenchPeer(a) => commands::peers::run_bench_peer(a),
        Cmd::AppsPeer(a) => commands::peers::run_apps_peer(a),
        Cmd::Agent(a) => commands::peers::run_agent(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<ExitStatus>() {
            // `fabric map` (3: the map differs), `cluster exec` (the
            // remote status): their own status, already explained.
            Some(status) => ExitCode::from(status.0),
            None => {
                eprintln!("ulnic: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
