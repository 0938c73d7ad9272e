//! Open MPI (Debian's 4.1) between TCG guests over the libfabric provider
//! (docs/libfabric.md, "MPI between guests"): `--mca pml cm --mca mtl ofi
//! --mca mtl_ofi_provider_include ulnic`. The launcher is the one MPI
//! clusters use, a remote shell: Debian's dropbear (`dropbear-bin`, from
//! `--packages`) serves on every node but node 0, where `mpirun` runs and
//! starts the other nodes' `orted` with `dbclient`; Open MPI's own
//! control traffic crosses the guests' virtio-net, the MPI messages cross
//! ulnic. The programs: `mpi_check` (guest-lib/fabric/tests/progs: a
//! ping-pong checked from 1 B to 1 MiB, allreduce, alltoall, a ring, and
//! Intel MPI Benchmarks' PingPong, Sendrecv, Exchange and Bcast patterns,
//! `ULNIC_IMB_ROUNDS` times, default 1) and
//! NetPIPE's `NPopenmpi -i` (its integrity check at every size to 1 MiB).
//! Two guests in the test command; eight behind `--ignored`.
mod cli;
use cli::{exec_ok as exec, run as ulnic, text, Down};

/// Boots `nodes` guests with Open MPI, NetPIPE and dropbear, puts
/// `mpi_check` (built here with mpicc) on each, and starts dropbear on
/// every node but 0 with node 0's key authorised.
fn mpi_cluster(nodes: u32) -> Down {
    let cluster = format!("test-mpi{nodes}-{}", std::process::id());
    let down = Down(cluster.clone());
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("mpi_check");
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../guest-lib/fabric/tests/progs/mpi_check.c"
    );
    let cc = std::process::Command::new("mpicc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", src, "-o"])
        .arg(&prog)
        .output()
        .expect("mpicc (Debian's libopenmpi-dev)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let up = ulnic(&[
        "cluster",
        "up",
        "--nodes",
        &nodes.to_string(),
        "--accel",
        "tcg",
        "--packages",
        "openmpi-bin,netpipe-openmpi,dropbear-bin,libfabric-bin",
        "--name",
        &cluster,
    ]);
    assert!(up.status.success(), "cluster up:\n{}", text(&up));
    let put = ulnic(&[
        "cluster",
        "put",
        "all",
        prog.to_str().unwrap(),
        "/root/mpi_check",
        "--name",
        &cluster,
    ]);
    assert!(put.status.success(), "put:\n{}", text(&put));
    let key = exec(
        &cluster,
        "0",
        "mkdir -p /root/.ssh && chmod 700 /root/.ssh && \
         dropbearkey -t ed25519 -f /root/.ssh/id_dropbear >/dev/null && \
         dropbearkey -y -f /root/.ssh/id_dropbear | grep '^ssh-ed25519'",
    );
    let key = key.trim();
    assert!(key.starts_with("ssh-ed25519 "), "{key}");
    for n in 1..nodes {
        let node = n.to_string();
        exec(
            &cluster,
            &node,
            &format!(
                "mkdir -p /etc/dropbear /root/.ssh && chmod 700 /root/.ssh && \
                 echo '{key}' > /root/.ssh/authorized_keys && \
                 chmod 600 /root/.ssh/authorized_keys"
            ),
        );
        let o = ulnic(&[
            "cluster",
            "exec",
            "--detach",
            &node,
            "--name",
            &cluster,
            "--",
            "dropbear -F -E -R -p 22",
        ]);
        assert!(o.status.success(), "dropbear:\n{}", text(&o));
    }
    down
}

/// `mpirun` on node 0 across every node, one rank each, over the ulnic
/// mtl; the remote shell is retried until every dropbear answers.
fn mpirun(cluster: &str, nodes: u32, program: &str) -> String {
    let hosts: Vec<String> = (0..nodes).map(|n| format!("node{n}:1")).collect();
    let mut wait = String::new();
    for n in 1..nodes {
        wait.push_str(&format!(
            "for i in $(seq 60); do dbclient -y -y -i /root/.ssh/id_dropbear node{n} true \
             2>/dev/null && break; sleep 1; done; "
        ));
    }
    let cmd = format!(
        "{wait}mpirun --allow-run-as-root --host {} -np {nodes} \
         --mca plm_rsh_agent 'dbclient -y -y -i /root/.ssh/id_dropbear' \
         --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include 10.81.0.0/24 \
         --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include ulnic {program} 2>&1",
        hosts.join(",")
    );
    exec(cluster, "0", &cmd)
}

fn checked_programs(nodes: u32) {
    let down = mpi_cluster(nodes);
    let out = mpirun(&down.0, nodes, "/root/mpi_check");
    eprintln!("mpi_check across {nodes} guests:\n{out}");
    for want in [
        "ok pingpong",
        "ok allreduce",
        "ok alltoall",
        "ok ring",
        "ok all",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    if nodes == 2 {
        // Intel MPI Benchmarks' patterns (IMB-MPI1's PingPong, Sendrecv,
        // Exchange and Bcast, 0 B..1 MiB): four runs in seven of IMB-MPI1
        // once stopped after a small size between guests, every message
        // sent received, nothing in flight (issue 46). Every payload is
        // checked; a stall fails the run at its time limit.
        let rounds = std::env::var("ULNIC_IMB_ROUNDS").unwrap_or_else(|_| "1".into());
        let imb = mpirun(&down.0, 2, &format!("/root/mpi_check imb {rounds}"));
        eprintln!("IMB patterns between two guests:\n{imb}");
        let done = imb.matches("ok imb round").count();
        assert_eq!(done.to_string(), rounds, "{imb}");
        let np = mpirun(&down.0, 2, "NPopenmpi -i -u 1048577");
        eprintln!("NetPIPE integrity check between two guests:\n{np}");
        let sizes = np.lines().filter(|l| l.contains(" bytes ")).count();
        let passed = np.matches("Integrity check passed").count();
        assert!(sizes > 30 && passed == sizes, "{passed} of {sizes}:\n{np}");
        assert!(np.contains(" 1048577 bytes"), "{np}");
    }
}

#[test]
fn open_mpi_between_two_guests_over_the_ofi_mtl() {
    checked_programs(2);
}

/// Eight TCG guests: about 8 GB of guest memory and several minutes of
/// boot on two cores, so opt-in:
/// `cargo test --release -p ulnic-tools --test mpi_guests -- --ignored`.
#[test]
#[ignore]
fn open_mpi_across_eight_guests_over_the_ofi_mtl() {
    checked_programs(8);
}
