//! Open MPI (Debian's 4.1) over the provider, as MPI programs use it:
//! `--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include ulnic`,
//! four ranks on four host-attached nodes of one device (a wrapper gives
//! rank N node N's socket), running `tests/progs/mpi_check.c`: a
//! ping-pong checked from 1 B to 1 MiB, allreduce, alltoall and a ring,
//! every result compared with what it must be.

use std::path::Path;
use std::time::Duration;

use ulnic_testkit::TestChild;

#[test]
fn open_mpi_runs_checked_collectives_over_the_ofi_mtl() {
    let exe = std::env::current_exe().unwrap();
    let built = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let prov = tempfile::tempdir().unwrap();
    std::fs::copy(
        built.join("libulnic_fabric.so"),
        prov.path().join("libulnic-fi.so"),
    )
    .expect("libulnic_fabric.so built");
    let dev = ulnic_testkit::device_with(4, |b| b.max_endpoints(64));
    // Rank N runs on node N.
    let mut wrapper = String::from("#!/bin/sh\ncase \"$OMPI_COMM_WORLD_RANK\" in\n");
    for n in 0..4 {
        wrapper.push_str(&format!(
            "{n}) export ULNIC_SOCKET={} ;;\n",
            dev.socket(n).display()
        ));
    }
    wrapper.push_str(
        "*) echo no node for rank $OMPI_COMM_WORLD_RANK >&2; exit 1 ;;\nesac\nexec \"$@\"\n",
    );
    let on_node = prov.path().join("on-node.sh");
    std::fs::write(&on_node, wrapper).unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&on_node)
        .status()
        .unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/mpi_check.c");
    let prog = prov.path().join("mpi_check");
    let cc = std::process::Command::new("mpicc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&prog)
        .output()
        .expect("mpicc (Debian's libopenmpi-dev)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = TestChild::spawn(
        "mpirun",
        std::process::Command::new("mpirun")
            .env("FI_PROVIDER_PATH", prov.path())
            .env_remove("ULNIC_SOCKET")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
            ])
            .args(["-x", "FI_PROVIDER_PATH"])
            .args(["--mca", "pml", "cm", "--mca", "mtl", "ofi"])
            .args(["--mca", "mtl_ofi_provider_include", "ulnic"])
            .args(["-np", "4"])
            .arg(&on_node)
            .arg(&prog),
    );
    let out = run.finish(Duration::from_secs(300));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "ok pingpong",
        "ok allreduce",
        "ok alltoall",
        "ok ring",
        "ok all",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
}
