//! Raw calls on the Linux driver's device file (spec §9), for the tools
//! that test the driver rather than use it: `ulnic selftest`,
//! `ulnic driver-fuzz` and `ulnic driver-check`. Programs use the library.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use ulnic_abi::uapi;
use ulnic_abi::wire::IocCreateEp;
use zerocopy::{FromZeros, IntoBytes};

/// The argument size an ioctl request encodes (its `_IOC_SIZE`).
fn arg_size(req: u32) -> usize {
    ((req >> 16) & 0x3fff) as usize
}

/// Calls ioctl `req` on `f` with `arg` as its argument buffer; refuses a
/// buffer shorter than the request encodes (the driver would write past it).
pub fn ioctl(f: &File, req: u32, arg: &mut [u8]) -> io::Result<i32> {
    if arg.len() < arg_size(req) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "ioctl {req:#x} takes {} bytes, got {}",
                arg_size(req),
                arg.len()
            ),
        ));
    }
    // SAFETY: `arg` is a live buffer at least as large as `req` encodes.
    unsafe { ioctl_ptr(f, req, arg.as_mut_ptr()) }
}

/// Calls ioctl `req` on `f` with any pointer, bad ones included: what a
/// hostile process does.
///
/// # Safety
/// `arg` must be null, outside this process's memory, or point to at least
/// as many writable bytes as `req` encodes: the kernel refuses the first
/// two with EFAULT, and writes the third.
pub unsafe fn ioctl_ptr(f: &File, req: u32, arg: *mut u8) -> io::Result<i32> {
    // SAFETY: the caller's contract above.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), req as libc::c_ulong, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Creates the smallest useful endpoint on `f` (rings of 8, an event ring
/// of 64 as spec §5.2 requires, a 4 KiB segment); returns its id.
/// Returns the endpoint's id and its (the file's) doorbell queue.
pub fn create_small_endpoint(f: &File) -> io::Result<(u32, u16)> {
    let mut a = IocCreateEp {
        send_entries: 8.into(),
        recv_entries: 8.into(),
        free_entries: 8.into(),
        event_entries: 64.into(),
        segment_bytes: 4096.into(),
        ..FromZeros::new_zeroed()
    };
    ioctl(f, uapi::IOC_CREATE_EP, a.as_mut_bytes())?;
    Ok((a.id.get(), a.doorbell_queue.get() as u16))
}
