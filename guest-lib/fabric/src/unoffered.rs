//! Operation tables of capabilities the provider does not offer
//! (atomics, collectives): every slot answers -FI_ENOSYS
//! (docs/libfabric.md §4).

use std::ffi::c_void;

use crate::fi::{nosys, sys};

type Ep = *mut sys::fid_ep;

type V = *mut c_void;
type CV = *const c_void;
type Dt = sys::fi_datatype;
type Op = sys::fi_op;
type Ioc = *const sys::fi_ioc;
type IocM = *mut sys::fi_ioc;
type Descs = *mut *mut c_void;

/// FI_ATOMIC: not offered (fi_getinfo refuses it).
pub static ATOMIC_NOT_OFFERED: sys::fi_ops_atomic = sys::fi_ops_atomic {
    size: std::mem::size_of::<sys::fi_ops_atomic>(),
    write: nosys!(isize; Ep, CV, usize, V, u64, u64, u64, Dt, Op, V),
    writev: nosys!(isize; Ep, Ioc, Descs, usize, u64, u64, u64, Dt, Op, V),
    writemsg: nosys!(isize; Ep, *const sys::fi_msg_atomic, u64),
    inject: nosys!(isize; Ep, CV, usize, u64, u64, u64, Dt, Op),
    readwrite: nosys!(isize; Ep, CV, usize, V, V, V, u64, u64, u64, Dt, Op, V),
    readwritev: nosys!(isize; Ep, Ioc, Descs, usize, IocM, Descs, usize, u64, u64, u64, Dt, Op, V),
    readwritemsg: nosys!(isize; Ep, *const sys::fi_msg_atomic, IocM, Descs, usize, u64),
    compwrite: nosys!(isize; Ep, CV, usize, V, CV, V, V, V, u64, u64, u64, Dt, Op, V),
    compwritev: nosys!(isize; Ep, Ioc, Descs, usize, Ioc, Descs, usize, IocM, Descs, usize, u64, u64, u64, Dt, Op, V),
    compwritemsg: nosys!(isize; Ep, *const sys::fi_msg_atomic, Ioc, Descs, usize, IocM, Descs, usize, u64),
    writevalid: nosys!(std::os::raw::c_int; Ep, Dt, Op, *mut usize),
    readwritevalid: nosys!(std::os::raw::c_int; Ep, Dt, Op, *mut usize),
    compwritevalid: nosys!(std::os::raw::c_int; Ep, Dt, Op, *mut usize),
};

/// Collectives: not offered (fi_getinfo refuses FI_COLLECTIVE).
pub static COLLECTIVE_NOT_OFFERED: sys::fi_ops_collective = sys::fi_ops_collective {
    size: std::mem::size_of::<sys::fi_ops_collective>(),
    barrier: nosys!(isize; Ep, u64, V),
    broadcast: nosys!(isize; Ep, V, usize, V, u64, u64, Dt, u64, V),
    alltoall: nosys!(isize; Ep, CV, usize, V, V, V, u64, Dt, u64, V),
    allreduce: nosys!(isize; Ep, CV, usize, V, V, V, u64, Dt, Op, u64, V),
    allgather: nosys!(isize; Ep, CV, usize, V, V, V, u64, Dt, u64, V),
    reduce_scatter: nosys!(isize; Ep, CV, usize, V, V, V, u64, Dt, Op, u64, V),
    reduce: nosys!(isize; Ep, CV, usize, V, V, V, u64, u64, Dt, Op, u64, V),
    scatter: nosys!(isize; Ep, CV, usize, V, V, V, u64, u64, Dt, u64, V),
    gather: nosys!(isize; Ep, CV, usize, V, V, V, u64, u64, Dt, u64, V),
    msg: nosys!(isize; Ep, *const sys::fi_msg_collective, IocM, Descs, usize, u64),
    barrier2: nosys!(isize; Ep, u64, u64, V),
};
