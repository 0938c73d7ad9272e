//! The hidden commands other commands start: `bench-peer` (one side of a
//! `ulnic bench` or `cluster bench` measurement), `apps-peer` (one
//! guest's side of `cluster bench apps`) and `agent` (the guest agent
//! behind `cluster exec` and `put`, started by the guest's init).

use std::path::PathBuf;

use crate::cluster::agent;

/// `ulnic agent`'s options.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// The virtio-serial port (default: the one named ulnic.agent).
    #[arg(long)]
    pub port: Option<PathBuf>,
}

/// Runs `ulnic bench-peer`.
pub fn run_bench_peer(a: crate::bench::PeerArgs) -> anyhow::Result<()> {
    Ok(crate::bench::peer(&a)?)
}

/// Runs `ulnic apps-peer`.
pub fn run_apps_peer(a: crate::bench::apps::PeerArgs) -> anyhow::Result<()> {
    crate::bench::apps::peer(&a)
}

/// Runs `ulnic agent` until its port closes.
pub fn run_agent(a: AgentArgs) -> anyhow::Result<()> {
    match a.port.or_else(agent::find_port) {
        Some(p) => agent::run(&p),
        None => Err(anyhow::anyhow!(
            "no virtio-serial port named {}",
            agent::PORT_NAME
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::{try_parse, Cmd};

    #[test]
    fn agent_port() {
        let Cmd::Agent(a) = try_parse(&["agent"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.port, None);
        let Cmd::Agent(a) = try_parse(&["agent", "--port", "/dev/vport0p1"]).unwrap() else {
            panic!()
        };
        assert_eq!(a.port.unwrap().to_str(), Some("/dev/vport0p1"));
    }

    #[test]
    fn apps_peer_roles() {
        let Cmd::AppsPeer(a) = try_parse(&[
            "apps-peer",
            "--role",
            "client",
            "--peer-node",
            "1",
            "--apps",
            "iperf3",
            "--seconds",
            "2",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!((a.role.as_str(), a.peer_node), ("client", 1));
        assert_eq!(a.apps.apps, [crate::bench::apps::App::Iperf3]);
        assert_eq!(a.apps.seconds, 2);
        let e = try_parse(&["apps-peer", "--role", "both", "--peer-node", "1"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
    }
}
