//! Address vectors (fi_av): ulnic addresses, (node, port), as fi_addr_t.
//! FI_AV_MAP encodes the address in the fi_addr_t itself (node in the
//! high half, port in the low); FI_AV_TABLE numbers them in insertion
//! order. A name (fi_getname) is 8 bytes: node then port, little-endian.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::{Arc, RwLock};

use ulnic::Address;

use crate::fi::{self, fid_ops, nosys, sys};

/// The node of a name that means "this node" (a name made from
/// 127.0.0.1 or from a service alone): resolved by the endpoint that uses
/// it.
pub const THIS_NODE: u32 = u32::MAX;

/// `a` with "this node" made `me`'s node.
pub fn here(a: Address, me: Address) -> Address {
    if a.node == THIS_NODE {
        Address { node: me.node, ..a }
    } else {
        a
    }
}

/// Bytes of an endpoint's name.
pub const NAME_LEN: usize = 8;

/// The name of `a`.
pub fn name(a: Address) -> [u8; NAME_LEN] {
    let mut b = [0u8; NAME_LEN];
    b[..4].copy_from_slice(&a.node.to_le_bytes());
    b[4..].copy_from_slice(&a.port.to_le_bytes());
    b
}

/// The address a name gives.
pub fn parse_name(b: &[u8]) -> Option<Address> {
    Some(Address {
        node: u32::from_le_bytes(b.get(..4)?.try_into().ok()?),
        port: u32::from_le_bytes(b.get(4..8)?.try_into().ok()?),
    })
}

/// The addresses of one AV, shared with the endpoints bound to it.
pub struct AvTable {
    map: bool,
    table: RwLock<Vec<Option<Address>>>,
}

impl AvTable {
    /// The address `fi_addr` stands for.
    pub fn resolve(&self, fi_addr: u64) -> Option<Address> {
        if self.map {
            let a = Address {
                node: (fi_addr >> 32) as u32,
                port: fi_addr as u32,
            };
            return (fi_addr != fi::ADDR_UNSPEC).then_some(a);
        }
        let t = self.table.read().ok()?;
        *t.get(usize::try_from(fi_addr).ok()?)?
    }

    /// The fi_addr_t of `a` (`FI_ADDR_NOTAVAIL` when not inserted).
    pub fn reverse(&self, a: Address) -> u64 {
        if self.map {
            return u64::from(a.node) << 32 | u64::from(a.port);
        }
        let Ok(t) = self.table.read() else {
            return fi::ADDR_UNSPEC;
        };
        t.iter()
            .position(|x| *x == Some(a))
            .map_or(fi::ADDR_UNSPEC, |i| i as u64)
    }

    fn insert(&self, a: Address) -> u64 {
        if self.map {
            return self.reverse(a);
        }
        let Ok(mut t) = self.table.write() else {
            return fi::ADDR_UNSPEC;
        };
        t.push(Some(a));
        (t.len() - 1) as u64
    }
}

/// An open AV.
#[repr(C)]
pub struct Av {
    fid: sys::fid_av,
    pub(crate) table: Arc<AvTable>,
}

/// The port an fi_info's source address names, if it names one (a
/// service given to fi_getinfo, or an address the program chose).
///
/// # Safety
/// `info.src_addr` holds `info.src_addrlen` bytes when not null.
pub unsafe fn bound_port(info: &sys::fi_info) -> Option<u32> {
    if info.src_addr.is_null() || info.src_addrlen < NAME_LEN {
        return None;
    }
    // SAFETY: the caller's promise.
    let b = unsafe { std::slice::from_raw_parts(info.src_addr.cast::<u8>(), NAME_LEN) };
    parse_name(b).map(|a| a.port).filter(|&p| p != 0)
}

/// Opens an AV (`fi_av_open`).
///
/// # Safety
/// `attr` and `out` are valid pointers from libfabric.
pub unsafe fn open(
    attr: *mut sys::fi_av_attr,
    out: *mut *mut sys::fid_av,
    context: *mut c_void,
) -> c_int {
    // SAFETY: libfabric passes a valid attr (or null).
    let Some(attr) = (unsafe { attr.as_ref() }) else {
        return -fi::EINVAL;
    };
    let map = match attr.type_ {
        sys::fi_av_type_FI_AV_MAP => true,
        sys::fi_av_type_FI_AV_TABLE | sys::fi_av_type_FI_AV_UNSPEC => false,
        _ => return -fi::EINVAL,
    };
    if !attr.name.is_null() || attr.rx_ctx_bits != 0 {
        return -fi::ENOSYS; // shared and scalable AVs are not offered
    }
    let av = Box::new(Av {
        fid: sys::fid_av {
            fid: sys::fid {
                fclass: sys::FI_CLASS_AV as usize,
                context,
                ops: &AV_FI_OPS as *const _ as *mut _,
            },
            ops: &AV_OPS as *const _ as *mut _,
        },
        table: Arc::new(AvTable {
            map,
            table: RwLock::new(Vec::new()),
        }),
    });
    // SAFETY: `out` is libfabric's valid out-pointer.
    unsafe { *out = Box::into_raw(av).cast() };
    0
}

/// The AV behind a fid libfabric hands back.
///
/// # Safety
/// `fid` must be an AV this provider opened and not yet closed.
pub unsafe fn from_fid<'a>(fid: *mut sys::fid) -> Option<&'a Av> {
    // SAFETY: `Av` is repr(C) with its fid first; the caller's promise.
    let av = unsafe { fid.cast::<Av>().as_ref()? };
    (av.fid.fid.fclass == sys::FI_CLASS_AV as usize).then_some(av)
}

unsafe extern "C" fn av_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a fid it got from `open`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Av>()) });
    0
}

unsafe extern "C" fn av_insert(
    av: *mut sys::fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut u64,
    _flags: u64,
    _context: *mut c_void,
) -> c_int {
    // SAFETY: `av` is one of ours (libfabric dispatched through its ops).
    let Some(av) = (unsafe { from_fid(av.cast()) }) else {
        return -fi::EINVAL;
    };
    if addr.is_null() && count > 0 {
        return -fi::EINVAL;
    }
    for i in 0..count {
        // SAFETY: the caller passes `count` names of NAME_LEN bytes.
        let b =
            unsafe { std::slice::from_raw_parts(addr.cast::<u8>().add(i * NAME_LEN), NAME_LEN) };
        let a = parse_name(b).map_or(fi::ADDR_UNSPEC, |a| av.table.insert(a));
        if !fi_addr.is_null() {
            // SAFETY: the caller's array holds `count` entries.
            unsafe { *fi_addr.add(i) = a };
        }
    }
    count as c_int
}

unsafe extern "C" fn av_remove(
    av: *mut sys::fid_av,
    fi_addr: *mut u64,
    count: usize,
    _flags: u64,
) -> c_int {
    // SAFETY: as in av_insert.
    let Some(av) = (unsafe { from_fid(av.cast()) }) else {
        return -fi::EINVAL;
    };
    if av.table.map {
        return 0;
    }
    let Ok(mut t) = av.table.table.write() else {
        return -fi::EINVAL;
    };
    for i in 0..count {
        // SAFETY: the caller's array holds `count` entries.
        let x = unsafe { *fi_addr.add(i) };
        if let Some(e) = usize::try_from(x).ok().and_then(|x| t.get_mut(x)) {
            *e = None;
        }
    }
    0
}

unsafe extern "C" fn av_lookup(
    av: *mut sys::fid_av,
    fi_addr: u64,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    // SAFETY: as in av_insert.
    let Some(av) = (unsafe { from_fid(av.cast()) }) else {
        return -fi::EINVAL;
    };
    let Some(a) = av.table.resolve(fi_addr) else {
        return -fi::ENOENT;
    };
    // SAFETY: libfabric's in/out length and buffer.
    unsafe { copy_name(a, addr, addrlen) }
}

/// Writes `a`'s name to `addr` (room `*addrlen`), setting `*addrlen`.
///
/// # Safety
/// `addrlen` is valid; `addr` holds `*addrlen` bytes.
pub unsafe fn copy_name(a: Address, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    if addrlen.is_null() {
        return -fi::EINVAL;
    }
    // SAFETY: the caller's promise.
    let room = unsafe { *addrlen };
    // SAFETY: as above.
    unsafe { *addrlen = NAME_LEN };
    if room < NAME_LEN || addr.is_null() {
        return -fi::ETOOSMALL;
    }
    // SAFETY: `addr` holds at least NAME_LEN bytes.
    unsafe { std::ptr::copy_nonoverlapping(name(a).as_ptr(), addr.cast(), NAME_LEN) };
    0
}

unsafe extern "C" fn av_straddr(
    _av: *mut sys::fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    if addr.is_null() || len.is_null() {
        return buf;
    }
    // SAFETY: `addr` is a name of NAME_LEN bytes (the caller's promise).
    let b = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), NAME_LEN) };
    let s = parse_name(b).map_or_else(String::new, |a| {
        format!("ulnic://{}:{:#x}\0", a.node, a.port)
    });
    // SAFETY: `len` is valid; `buf` holds `*len` bytes.
    let room = unsafe { *len };
    // SAFETY: as above.
    unsafe { *len = s.len() };
    if !buf.is_null() && room > 0 {
        let n = s.len().min(room);
        // SAFETY: `buf` holds `room >= n` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast(), n);
            *buf.add(room.min(n) - 1) = 0;
        }
    }
    buf
}

fid_ops!(AV_FI_OPS, av_close);

static AV_OPS: sys::fi_ops_av = sys::fi_ops_av {
    size: std::mem::size_of::<sys::fi_ops_av>(),
    insert: Some(av_insert),
    insertsvc: nosys!(c_int; *mut sys::fid_av, *const c_char, *const c_char, *mut u64, u64, *mut c_void),
    insertsym: nosys!(c_int; *mut sys::fid_av, *const c_char, usize, *const c_char, usize, *mut u64, u64, *mut c_void),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: nosys!(c_int; *mut sys::fid_av, *mut sys::fi_av_set_attr, *mut *mut sys::fid_av_set, *mut c_void),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_map_addresses_encode_them() {
        let a = Address {
            node: 3,
            port: 0x4600_0007,
        };
        assert_eq!(parse_name(&name(a)), Some(a));
        assert_eq!(parse_name(&[0; 7]), None);
        let map = AvTable {
            map: true,
            table: RwLock::new(Vec::new()),
        };
        let f = map.insert(a);
        assert_eq!(map.resolve(f), Some(a));
        let table = AvTable {
            map: false,
            table: RwLock::new(Vec::new()),
        };
        assert_eq!(table.insert(a), 0);
        assert_eq!(table.insert(Address { node: 1, port: 2 }), 1);
        assert_eq!(table.resolve(0), Some(a));
        assert_eq!(table.resolve(2), None);
        assert_eq!(table.reverse(Address { node: 1, port: 2 }), 1);
    }
}
