//! The QEMU command line for one guest with a ulnic node: the piece the
//! cluster launcher builds on.

use std::path::PathBuf;
use std::process::Command;

use ulnic_abi::{CONFIG_SIZE, QUEUE_COUNT, VIRTIO_ID_ULNIC};

use crate::Image;

/// One guest.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Guest RAM in MiB (shared with the device: memfd, share=on).
    pub memory_mb: u32,
    /// The ulnic node socket, if the guest gets a ulnic NIC.
    pub ulnic_socket: Option<PathBuf>,
    /// Give the guest its NIC by hotplug, so that a restarted device can be
    /// plugged in again while the guest runs: the guest starts paused
    /// (`-S`) with a PCIe root port and no NIC; the caller adds it over QMP
    /// ([`ulnic_device_add`]) and continues the guest.
    ///
    /// (QEMU's own reconnect, the chardev's `reconnect-ms`, does not work
    /// with vhost-user-test-device in QEMU 11: the initial connection is
    /// asynchronous, so realize fails ("Failed to set msg fds"), and on a
    /// reconnect vhost_dev_start asserts on `hdev->vhost_ops` and QEMU
    /// aborts.)
    pub ulnic_hotplug: bool,
    /// Accelerator: "tcg" or "kvm".
    pub accel: String,
    /// Extra kernel command line.
    pub append: String,
    /// A virtio-net NIC on this VDE switch (socket dir), with the MAC of
    /// node `.1`.
    pub vde: Option<(PathBuf, u32)>,
    /// The guest agent's channel: a virtio-serial port named `ulnic.agent`
    /// whose host end is a Unix socket QEMU listens on at this path.
    pub agent_socket: Option<PathBuf>,
    /// A QMP monitor socket QEMU listens on at this path (used to reset the
    /// guest).
    pub qmp_socket: Option<PathBuf>,
    /// Let the guest reboot (otherwise QEMU exits when it tries).
    pub allow_reboot: bool,
}

/// The IPv4 network of the cluster segment (eth0 of node `n` is its
/// address `n + 1`), which guests also export as `ULNIC_INET`: the same
/// addresses reach a node over the kernel's TCP, or over ulnic through
/// the preload layer.
pub const GUEST_INET: &str = "10.81.0.0/24";

/// Node `n`'s IPv4 address on the cluster segment.
pub fn node_ipv4(n: u32) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(
        10,
        81,
        (((n + 1) >> 8) & 0xff) as u8,
        ((n + 1) & 0xff) as u8,
    )
}

/// The MAC of node `n` on the cluster segment (locally administered).
pub fn node_mac(n: u32) -> String {
    format!("52:54:00:75:{:02x}:{:02x}", (n >> 8) & 0xff, n & 0xff)
}

/// Node `n`'s IPv6 link-local address on the segment (EUI-64 of its MAC).
pub fn node_link_local(n: u32) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0x00ff, 0xfe75, (n & 0xffff) as u16)
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            memory_mb: 512,
            ulnic_socket: None,
            ulnic_hotplug: false,
            accel: "tcg".into(),
            append: String::new(),
            vde: None,
            agent_socket: None,
            qmp_socket: None,
            allow_reboot: false,
        }
    }
}

/// The PCIe root port a hotplugged NIC is added behind.
pub const ULNIC_ROOT_PORT: &str = "ulnic-rp";
/// QEMU's id of the guest's ulnic NIC (for `device_del`).
pub const ULNIC_DEVICE_ID: &str = "ulnic0dev";
/// QEMU's id of the chardev joining that NIC to its node socket.
pub const ULNIC_CHARDEV_ID: &str = "ulnic0";

/// The QMP `device_add` command of the ulnic NIC of a guest started with
/// `ulnic_hotplug` (see [`VmConfig::ulnic_hotplug`]); the same for every guest.
pub fn ulnic_device_add() -> serde_json::Value {
    serde_json::json!({
        "execute": "device_add",
        "arguments": {
            "driver": "vhost-user-test-device-pci",
            "id": ULNIC_DEVICE_ID,
            "bus": ULNIC_ROOT_PORT,
            "chardev": ULNIC_CHARDEV_ID,
            "virtio-id": VIRTIO_ID_ULNIC,
            "num_vqs": QUEUE_COUNT,
            "config_size": CONFIG_SIZE,
            "page-per-vq": true,
        }
    })
}

/// The QMP `chardev-add` command that connects a guest's NIC chardev to the
/// node socket `sock` again (after `chardev-remove`).
pub fn ulnic_chardev_add(sock: &std::path::Path) -> serde_json::Value {
    serde_json::json!({
        "execute": "chardev-add",
        "arguments": {
            "id": ULNIC_CHARDEV_ID,
            "backend": {
                "type": "socket",
                "data": {
                    "addr": { "type": "unix", "data": { "path": sock.to_string_lossy() } },
                    "server": false
                }
            }
        }
    })
}

/// Why QEMU stopped running the guest, if console line `line` says so.
/// QEMU does not exit then: it keeps the VM paused in an error state, so a
/// caller waiting for the guest must stop it itself. KVM's internal errors
/// (an instruction KVM cannot emulate, as on hosts whose KVM is a software
/// one) print "KVM internal error" or "KVM: entry failed" first.
///
/// ```
/// let why = ulnic_images::vm::guest_stopped_by("KVM internal error. Suberror: 1");
/// assert!(why.unwrap().contains("--accel tcg"));
/// assert!(ulnic_images::vm::guest_stopped_by("[    0.1] Linux version").is_none());
/// ```
pub fn guest_stopped_by(line: &str) -> Option<&'static str> {
    const KVM: &str = "QEMU stopped the guest: KVM internal error (this host's KVM could not \
                       run it; --accel tcg runs it under emulation)";
    if line.starts_with("KVM internal error") || line.starts_with("KVM: entry failed") {
        Some(KVM)
    } else {
        None
    }
}

/// Boot-time work the guests never use, skipped: under TCG these initcalls
/// cost about 0.9 s of a 5.3 s boot (measured with `initcall_debug`). The
/// module is unsigned anyway (no certificates needed), nothing uses BPF
/// congestion control, encrypted keys or trace enums, and the entropy and
/// KDF ones only self-test or seed a DRBG that the kernel seeds otherwise.
const SKIPPED_INITCALLS: &str = "initcall_blacklist=load_system_certificate_list,\
bpf_tcp_ca_kfunc_init,jent_mod_init,bpf_dummy_struct_ops_init,trace_eval_init,\
crypto_kdf108_init,init_encrypted";

/// A command that boots `image` with `cfg`, console on stdio.
pub fn command(image: &Image, cfg: &VmConfig) -> Command {
    let mut c = image.qemu.command();
    let mem = format!(
        "memory-backend-memfd,id=mem,size={}M,share=on",
        cfg.memory_mb
    );
    c.args([
        "-machine",
        &format!("q35,accel={}", cfg.accel),
        "-m",
        &format!("{}M", cfg.memory_mb),
    ]);
    c.args(["-object", &mem, "-numa", "node,memdev=mem"]);
    c.arg("-kernel")
        .arg(&image.kernel)
        .arg("-initrd")
        .arg(&image.initramfs);
    c.args([
        "-append",
        &format!(
            "console=ttyS0 quiet panic=-1 {SKIPPED_INITCALLS} {}",
            cfg.append
        ),
    ]);
    c.args(["-nographic", "-nodefaults", "-serial", "stdio"]);
    if !cfg.allow_reboot {
        c.arg("-no-reboot");
    }
    if let Some(sock) = &cfg.agent_socket {
        c.arg("-chardev").arg(format!(
            "socket,id=agent,path={},server=on,wait=off",
            sock.display()
        ));
        c.args(["-device", "virtio-serial-pci,id=vser0"]);
        c.args(["-device", "virtserialport,chardev=agent,name=ulnic.agent"]);
    }
    if let Some(sock) = &cfg.qmp_socket {
        c.arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", sock.display()));
    }
    if let Some((dir, n)) = &cfg.vde {
        c.arg("-netdev")
            .arg(format!("vde,id=net0,sock={}", dir.display()));
        c.arg("-device")
            // romfile= leaves out iPXE: guests boot from -kernel, never the net.
            .arg(format!(
                "virtio-net-pci,netdev=net0,mac={},romfile=",
                node_mac(*n)
            ));
    }
    if let Some(sock) = &cfg.ulnic_socket {
        c.arg("-chardev").arg(format!(
            "socket,id={ULNIC_CHARDEV_ID},path={}",
            sock.display()
        ));
        if cfg.ulnic_hotplug {
            c.arg("-S");
            c.args([
                "-device",
                &format!("pcie-root-port,id={ULNIC_ROOT_PORT},chassis=9,bus=pcie.0"),
            ]);
        } else {
            c.arg("-device").arg(format!(
                "vhost-user-test-device-pci,chardev={ULNIC_CHARDEV_ID},virtio-id={},num_vqs={},config_size={},page-per-vq=on",
                VIRTIO_ID_ULNIC, QUEUE_COUNT, CONFIG_SIZE
            ));
        }
    }
    c
}
