//! A real QEMU guest (TCG) boots the default image with a ulnic node; the
//! ulnic kernel module binds the device and talks to it. Builds the image (network: Debian's
//! archive) if the cache lacks it.
use std::time::{Duration, Instant};

use ulnic_testkit::{device, TestChild};

#[test]
fn guest_boots_and_sees_the_ulnic_device() {
    let report = ulnic_images::build(false, &[env!("CARGO_BIN_EXE_ulnic").into()], &mut |l| {
        eprintln!("{l}")
    })
    .expect("image builds");
    let dev = device(1);
    let cfg = ulnic_images::vm::VmConfig {
        ulnic_socket: Some(dev.socket(0)),
        append: "ulnic.selftest ulnic.poweroff".into(),
        ..Default::default()
    };
    let t = Instant::now();
    // Both of QEMU's streams drained as they come; killed past 180 s.
    let qemu = TestChild::spawn("qemu", &mut ulnic_images::vm::command(&report.image, &cfg));
    let done = qemu.finish(Duration::from_secs(180));
    let status = done.status;
    let out = String::from_utf8_lossy(&done.stdout).into_owned();
    let err = String::from_utf8_lossy(&done.stderr).into_owned();
    let tail: String = out.lines().rev().take(20).collect::<Vec<_>>().join("\n");
    assert!(
        out.contains("ulnic-guest: ready"),
        "guest did not boot ({status}); console tail:\n{tail}\nqemu: {err}"
    );
    let id = format!("device={:#06x}", ulnic_abi::VIRTIO_ID_ULNIC);
    assert!(
        out.contains(&id),
        "guest did not see the ulnic device ({id}); console tail:\n{tail}"
    );
    for l in out.lines().filter(|l| l.contains("ulnic-guest")) {
        eprintln!("console: {}", l.trim());
    }
    // The kernel driver bound the device and ran GET_INFO over the control
    // queue, through QEMU and vhost-user, to this device.
    assert!(
        out.contains(&format!("{id} driver=ulnic")),
        "the ulnic driver did not bind; console tail:\n{tail}"
    );
    assert!(
        out.contains(&format!(
            "ulnic: node 0 of 1, 8 endpoints, spec {}.{}",
            ulnic_abi::SPEC_VERSION_MAJOR,
            ulnic_abi::SPEC_VERSION_MINOR
        )),
        "the driver's GET_INFO did not come back; console tail:\n{tail}"
    );
    // The ulnic tool runs inside the guest (same binary, its libraries copied).
    assert!(
        out.contains("ulnic-guest: tool: ulnic 0.1.0"),
        "the ulnic tool did not run in the guest; console tail:\n{tail}"
    );
    for l in out.lines().filter(|l| l.contains("ulnic-selftest")) {
        eprintln!("console: {}", l.trim());
    }
    // The library inside the guest, through /dev/ulnic0 and the driver.
    assert!(
        out.contains("ulnic-guest: selftest exit=0") && out.contains("ulnic-selftest: ok"),
        "the in-guest selftest failed; console tail:\n{tail}"
    );
    eprintln!(
        "guest booted and powered off in {:.1} s (TCG, QEMU {})",
        t.elapsed().as_secs_f64(),
        report.image.qemu.version()
    );
}
