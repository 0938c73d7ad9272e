//! The two nodes a two-sided benchmark attaches to: by default nodes 0 and
//! 1 of the device this process starts, or those `--nodes` names on the
//! device of `--device-dir` (whose sockets may belong to different device
//! processes of one fabric).

use std::path::{Path, PathBuf};

/// The client's (initiator's) and the server's (target's) node sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePair {
    /// The client's socket.
    pub client: PathBuf,
    /// The server's socket.
    pub server: PathBuf,
}

impl NodePair {
    /// The sockets of nodes `client` and `server` in `dir`.
    pub fn of(dir: &Path, (client, server): (u32, u32)) -> NodePair {
        NodePair {
            client: dir.join(format!("node{client}.sock")),
            server: dir.join(format!("node{server}.sock")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_names_its_nodes_sockets() {
        let p = NodePair::of(Path::new("/d"), (0, 2));
        assert_eq!(p.client, Path::new("/d/node0.sock"));
        assert_eq!(p.server, Path::new("/d/node2.sock"));
    }
}
