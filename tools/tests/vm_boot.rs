//! A real QEMU guest (TCG) boots the default image with a ulnic node; the
//! ulnic kernel module binds the device and talks to it. Builds the image (network: Debian's
//! archive) if the cache lacks it.
#[path = "../../device/tests/common/mod.rs"]
mod common;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn guest_boots_and_sees_the_ulnic_device() {
    let report = ulnic_images::build(false, &[env!("CARGO_BIN_EXE_ulnic").into()], &mut |l| {
        eprintln!("{l}")
    })
    .expect("image builds");
    let (dev, _dir) = common::device(1);
    let cfg = ulnic_images::vm::VmConfig {
        ulnic_socket: Some(common::socket(&dev, 0)),
        append: "ulnic.selftest ulnic.poweroff".into(),
        ..Default::default()
    };
    let t = Instant::now();
    let mut qemu = ulnic_images::vm::command(&report.image, &cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("qemu starts");
    let mut out = String::new();
    let mut stdout = qemu.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = qemu.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = qemu.kill();
            break qemu.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    out.push_str(&reader.join().unwrap());
    let mut err = String::new();
    let _ = qemu.stderr.take().unwrap().read_to_string(&mut err);
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
