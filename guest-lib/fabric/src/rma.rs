//! Operation tables of capabilities the provider does not offer yet:
//! every slot answers -FI_ENOSYS (docs/libfabric.md §4).

use std::ffi::c_void;

use crate::fi::{nosys, sys};

type Ep = *mut sys::fid_ep;

/// FI_RMA: not offered yet.
pub static RMA_NOT_OFFERED: sys::fi_ops_rma = sys::fi_ops_rma {
    size: std::mem::size_of::<sys::fi_ops_rma>(),
    read: nosys!(isize; Ep, *mut c_void, usize, *mut c_void, u64, u64, u64, *mut c_void),
    readv: nosys!(isize; Ep, *const sys::iovec, *mut *mut c_void, usize, u64, u64, u64, *mut c_void),
    readmsg: nosys!(isize; Ep, *const sys::fi_msg_rma, u64),
    write: nosys!(isize; Ep, *const c_void, usize, *mut c_void, u64, u64, u64, *mut c_void),
    writev: nosys!(isize; Ep, *const sys::iovec, *mut *mut c_void, usize, u64, u64, u64, *mut c_void),
    writemsg: nosys!(isize; Ep, *const sys::fi_msg_rma, u64),
    inject: nosys!(isize; Ep, *const c_void, usize, u64, u64, u64),
    writedata: nosys!(isize; Ep, *const c_void, usize, *mut c_void, u64, u64, u64, u64, *mut c_void),
    injectdata: nosys!(isize; Ep, *const c_void, usize, u64, u64, u64, u64),
};
