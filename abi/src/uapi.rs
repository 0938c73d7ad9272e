//! The Linux driver's character device interface (spec §9): ioctl
//! numbers and argument layouts shared by `ulnic_main.c` and the library.

/// ioctl type byte ('U').
pub const IOC_TYPE: u32 = 0x55;
use crate::wire::{
    DeviceInfo, IocCommand, IocCreateEp, IocNotified, IocUtlbInstall, IocWait, IocWatch,
};

/// `_IOC(dir, 'U', nr, sizeof(T))`: the argument's size is its type's.
const fn ioc<T>(dir: u32, nr: u32) -> u32 {
    (dir << 30) | ((core::mem::size_of::<T>() as u32) << 16) | (IOC_TYPE << 8) | nr
}
const WRITE: u32 = 1;
const READ: u32 = 2;

/// Read the device information (`wire::DeviceInfo`).
pub const IOC_INFO: u32 = ioc::<DeviceInfo>(READ, 1);
/// Create an endpoint in the file's protection domain
/// (`wire::IocCreateEp`).
pub const IOC_CREATE_EP: u32 = ioc::<IocCreateEp>(READ | WRITE, 2);
/// Destroy one of the file's endpoints (u32 id).
pub const IOC_DESTROY_EP: u32 = ioc::<u32>(WRITE, 3);
/// Run BIND_PORT, SET_FILTER, ARM, DISARM, GET_STATS, SET_EVENT_QUEUE,
/// EXPORT, REVOKE, EXPORT_BUFFER, SET_TRIPWIRE or CLEAR_TRIPWIRE on an endpoint the
/// file owns (the payload's first u32; `wire::IocCommand`).
pub const IOC_COMMAND: u32 = ioc::<IocCommand>(READ | WRITE, 4);
/// Ring an owned endpoint's doorbell (u32 id): set its bit in the
/// file's doorbell bitmap and kick the file's doorbell queue.
pub const IOC_KICK: u32 = ioc::<u32>(WRITE, 5);
/// Block until an owned endpoint is notified (`wire::IocWait`);
/// returns 1 when notified, 0 on timeout.
pub const IOC_WAIT: u32 = ioc::<IocWait>(WRITE, 6);
/// mmap offset of endpoint `e`'s control region; its segment is at
/// `+ MMAP_SEGMENT`.
pub const fn mmap_ctrl(e: u32) -> u64 {
    (e as u64) << MMAP_ID_SHIFT
}
/// An mmap offset's endpoint id is the offset shifted right by this.
pub const MMAP_ID_SHIFT: u32 = 32;
/// Added to `mmap_ctrl(e)` for the segment.
pub const MMAP_SEGMENT: u64 = 1 << 31;
/// Added to `mmap_ctrl(e)`, with a PIO window's offset in the aperture
/// (below 1 GiB, page-aligned), for that window or import of endpoint
/// `e` (spec §9).
pub const MMAP_PIO: u64 = 1 << 30;
/// mmap offset of endpoint `e`'s PIO window or import at `offset` of the
/// aperture (spec §9).
pub const fn mmap_pio(e: u32, offset: u64) -> u64 {
    mmap_ctrl(e) | MMAP_PIO | offset
}
/// The bits of an mmap offset below the endpoint id: 0 (control region),
/// `MMAP_SEGMENT`, or `MMAP_PIO` plus an aperture offset.
pub const MMAP_OFFSET_MASK: u64 = (1 << MMAP_ID_SHIFT) - 1;
/// mmap offset of the open file's doorbell page, one page; writing
/// the doorbell queue index (u16) to its start rings the doorbell
/// without a system call (spec §9).
pub const MMAP_DOORBELL: u64 = 1 << 48;
/// mmap offset of the page holding the open file's doorbell bitmap (at
/// its start; spec §5.8).
pub const MMAP_DOORBELL_BITS: u64 = MMAP_DOORBELL + crate::constants::PAGE_SIZE;
/// Give the file's protection domain a UTLB of `entries` (u32) entries.
pub const IOC_UTLB_INIT: u32 = ioc::<u32>(WRITE, 7);
/// Pin `count` pages of this process from virtual address `va` (page
/// aligned) and install them at UTLB entries `first..first+count`,
/// unpinning what was there: u32 first, u32 count, u64 va.
pub const IOC_UTLB_INSTALL: u32 = ioc::<IocUtlbInstall>(WRITE, 8);
/// Take every notification of the file's endpoints at once
/// (`wire::IocNotified`): for a program that sleeps in `poll` or
/// `epoll` on the file for many endpoints.
pub const IOC_TAKE_NOTIFIED: u32 = ioc::<IocNotified>(READ, 9);
/// Make a watcher of the device (u32 flags, `WATCHER_CLOEXEC`): the
/// ioctl returns its new file descriptor (spec §9).
pub const IOC_WATCHER: u32 = ioc::<u32>(WRITE, 10);
/// Make a watcher watch one of the file's endpoints, or stop
/// (`wire::IocWatch`, spec §9).
pub const IOC_WATCH: u32 = ioc::<IocWatch>(WRITE, 11);
/// `IOC_WATCHER` flag: the new descriptor is closed on exec.
pub const WATCHER_CLOEXEC: u32 = 1;
/// `IocWatch` flag: stop watching.
pub const WATCH_REMOVE: u32 = 1;
/// Direction of an ioctl's argument, as `_IOR`, `_IOW`, `_IOWR` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// The driver writes the argument.
    Read,
    /// The driver reads the argument.
    Write,
    /// Both.
    ReadWrite,
}

/// Every ioctl: name, direction, number, C argument type, and the
/// number Rust computes (which the C header asserts equal to its own).
pub fn ioctls() -> [(&'static str, Dir, u32, &'static str, u32); 11] {
    [
        (
            "IOC_INFO",
            Dir::Read,
            1,
            "struct ulnic_device_info",
            IOC_INFO,
        ),
        (
            "IOC_CREATE_EP",
            Dir::ReadWrite,
            2,
            "struct ulnic_ioc_create_ep",
            IOC_CREATE_EP,
        ),
        ("IOC_DESTROY_EP", Dir::Write, 3, "__u32", IOC_DESTROY_EP),
        (
            "IOC_COMMAND",
            Dir::ReadWrite,
            4,
            "struct ulnic_ioc_command",
            IOC_COMMAND,
        ),
        ("IOC_KICK", Dir::Write, 5, "__u32", IOC_KICK),
        ("IOC_WAIT", Dir::Write, 6, "struct ulnic_ioc_wait", IOC_WAIT),
        ("IOC_UTLB_INIT", Dir::Write, 7, "__u32", IOC_UTLB_INIT),
        (
            "IOC_UTLB_INSTALL",
            Dir::Write,
            8,
            "struct ulnic_ioc_utlb_install",
            IOC_UTLB_INSTALL,
        ),
        (
            "IOC_TAKE_NOTIFIED",
            Dir::Read,
            9,
            "struct ulnic_ioc_notified",
            IOC_TAKE_NOTIFIED,
        ),
        ("IOC_WATCHER", Dir::Write, 10, "__u32", IOC_WATCHER),
        (
            "IOC_WATCH",
            Dir::Write,
            11,
            "struct ulnic_ioc_watch",
            IOC_WATCH,
        ),
    ]
}

/// Largest control region the driver allocates (physically contiguous).
pub const MAX_CTRL_BYTES: u64 = 4 << 20;
/// Largest segment the driver allocates.
pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;
/// Largest UTLB table the driver allocates (physically contiguous):
/// 65536 entries.
pub const MAX_UTLB_TABLE_BYTES: u64 = 512 << 10;
