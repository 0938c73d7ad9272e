//! Endpoints (fi_endpoint): libfabric's message and tagged operations on
//! the engine, completions routed to the bound queues. FI_EP_RDM
//! endpoints address each send through their AV; FI_EP_MSG endpoints
//! talk to the one peer their connection names (connect, accept and
//! shutdown through the bound event queue).

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex};

use ulnic::{Address, Error};

use crate::av::{self, AvTable};
use crate::cntr::CntrShared;
use crate::cq::{self, CqQueue, Entry};
use crate::engine::{Completion, Control, Engine, PeekMode, PostedRecv, CONTROL_CONTEXT};
use crate::eq::{EqQueue, Progress};
use crate::fi::{self, fid_ops, nosys, sys};
use crate::wire::{KIND_ACCEPT, KIND_CONNREQ, KIND_REJECT, KIND_SHUTDOWN};

/// What the operations of one endpoint share with the queues that make
/// it progress.
pub struct EpShared {
    engine: Mutex<Engine>,
    me: Address,
    /// FI_DIRECTED_RECV was asked for: a receive's source address counts
    /// (without it, fi_endpoint(3) says it is ignored).
    directed: bool,
    /// The default flags of operations called without flags
    /// (`fi_tx_attr::op_flags`, `fi_rx_attr::op_flags`): FI_COMPLETION
    /// there makes them report under FI_SELECTIVE_COMPLETION.
    tx_op_flags: u64,
    rx_op_flags: u64,
    bound: Mutex<Bindings>,
    /// The bindings as fi_enable fixed them (binding after it is
    /// refused): the data path reads them without a lock.
    ready: std::sync::OnceLock<Bindings>,
    /// A connection-oriented endpoint's state (None for RDM).
    conn: Option<Mutex<Conn>>,
}

/// Where a connection-oriented endpoint's connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Made, not yet connecting (a client) or accepting (a server).
    Idle,
    /// fi_connect sent the request; waiting for ACCEPT or REJECT.
    Connecting,
    /// Data flows to and from `peer`.
    Connected,
    /// Shut down (by either side), refused, or its peer is gone.
    Down,
}

/// A FI_EP_MSG endpoint's connection.
pub struct Conn {
    state: State,
    /// The other side: the passive endpoint until ACCEPT names the
    /// server's endpoint.
    peer: Option<Address>,
    eq: Option<Arc<EqQueue>>,
    /// This endpoint's fid, for the events it posts.
    fid: usize,
}

impl Conn {
    /// A connection to come; `peer` is the requester when a server's
    /// endpoint is made for a connection request.
    pub fn new(peer: Option<Address>) -> Conn {
        Conn {
            state: State::Idle,
            peer,
            eq: None,
            fid: 0,
        }
    }
}

impl Progress for EpShared {
    fn progress(&self) {
        EpShared::progress(self);
    }

    fn arm(&self) -> bool {
        self.engine.lock().map_or(true, |mut e| e.arm())
    }

    fn watch(&self, w: &ulnic::Watcher) {
        if let Ok(e) = self.engine.lock() {
            e.watch(w);
        }
    }
}

#[derive(Default, Clone)]
struct Bindings {
    av: Option<Arc<AvTable>>,
    tx_cq: Option<Arc<CqQueue>>,
    rx_cq: Option<Arc<CqQueue>>,
    /// FI_SELECTIVE_COMPLETION on the transmit / receive binding.
    tx_selective: bool,
    rx_selective: bool,
    /// Counters bound with FI_SEND / FI_RECV / FI_WRITE / FI_READ.
    tx_cntr: Option<Arc<CntrShared>>,
    rx_cntr: Option<Arc<CntrShared>>,
    write_cntr: Option<Arc<CntrShared>>,
    read_cntr: Option<Arc<CntrShared>>,
    enabled: bool,
}

impl EpShared {
    /// Moves the engine along and routes what finished.
    pub fn progress(&self) {
        self.run(|_, _| Ok(())).ok();
    }

    /// Runs `f` on the engine, then progress, then routes completions.
    fn run<T>(
        &self,
        f: impl FnOnce(&mut Engine, &mut Vec<Completion>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut done = Vec::new();
        let r = {
            let mut e = self.engine.lock().map_err(|_| Error::WouldBlock)?;
            let r = f(&mut e, &mut done);
            e.progress(&mut done);
            r
        };
        self.connection_events(&mut done);
        if let (false, Some(b)) = (done.is_empty(), self.ready.get()) {
            for c in done {
                let counter = if c.flags & fi::RMA == 0 {
                    if c.tx {
                        &b.tx_cntr
                    } else {
                        &b.rx_cntr
                    }
                } else if c.flags & fi::WRITE != 0 {
                    &b.write_cntr
                } else if c.flags & fi::READ != 0 {
                    &b.read_cntr
                } else {
                    &None
                };
                if let Some(n) = counter {
                    n.hit(c.error.is_some());
                }
                if !c.report {
                    continue;
                }
                let q = if c.tx { &b.tx_cq } else { &b.rx_cq };
                let src = match (&b.av, c.tx) {
                    (Some(av), false) => av.reverse(c.src),
                    _ => fi::ADDR_UNSPEC,
                };
                if let Some(q) = q {
                    q.push(Entry { c, src });
                }
            }
        }
        r
    }

    /// Takes connection-management packets and failed ones into the
    /// event queue (FI_EP_MSG).
    fn connection_events(&self, done: &mut Vec<Completion>) {
        let Some(conn) = &self.conn else { return };
        let mut controls: Vec<Control> = Vec::new();
        if let Ok(mut e) = self.engine.lock() {
            while let Some(c) = e.take_control() {
                controls.push(c);
            }
        }
        let failed: Vec<Completion> = done
            .extract_if(.., |c| c.context == CONTROL_CONTEXT)
            .collect();
        if controls.is_empty() && failed.is_empty() {
            return;
        }
        let Ok(mut c) = conn.lock() else { return };
        let Some(eq) = c.eq.clone() else { return };
        for f in failed {
            if f.error.is_some() && c.state == State::Connecting {
                c.state = State::Down;
                eq.error(c.fid, libc::ECONNREFUSED);
            }
        }
        for m in controls {
            match (m.kind, c.state) {
                (KIND_ACCEPT, State::Connecting) => {
                    c.state = State::Connected;
                    c.peer = Some(m.from);
                    if let Ok(mut e) = self.engine.lock() {
                        let _ = e.set_close_message(m.from);
                    }
                    eq.cm(sys::FI_CONNECTED, c.fid, std::ptr::null_mut(), &m.params);
                }
                (KIND_REJECT, State::Connecting) => {
                    c.state = State::Down;
                    eq.error(c.fid, libc::ECONNREFUSED);
                }
                (KIND_SHUTDOWN, State::Connected) if c.peer == Some(m.from) => {
                    c.state = State::Down;
                    eq.cm(sys::FI_SHUTDOWN, c.fid, std::ptr::null_mut(), &[]);
                }
                _ => {} // stale or out of turn: nothing to do
            }
        }
    }

    /// The connected peer of a FI_EP_MSG endpoint.
    fn connected_peer(&self) -> Option<Address> {
        let c = self.conn.as_ref()?.lock().ok()?;
        (c.state == State::Connected).then_some(c.peer).flatten()
    }
}

/// Whether the provider offers endpoints of type `t`.
pub fn offered_type(t: sys::fi_ep_type) -> bool {
    t == sys::fi_ep_type_FI_EP_RDM || t == sys::fi_ep_type_FI_EP_MSG
}

/// An open endpoint.
#[repr(C)]
pub struct Ep {
    fid: sys::fid_ep,
    shared: Arc<EpShared>,
}

/// Opens an RDM endpoint on `engine` (`fi_endpoint`).
///
/// # Safety
/// `out` is libfabric's valid out-pointer.
#[allow(clippy::too_many_arguments)]
pub unsafe fn open(
    engine: Engine,
    me: Address,
    caps: u64,
    op_flags: (u64, u64),
    conn: Option<Conn>,
    out: *mut *mut sys::fid_ep,
    context: *mut c_void,
) -> c_int {
    let ep = Box::new(Ep {
        fid: sys::fid_ep {
            fid: sys::fid {
                fclass: sys::FI_CLASS_EP as usize,
                context,
                ops: &EP_FI_OPS as *const _ as *mut _,
            },
            ops: &EP_OPS as *const _ as *mut _,
            cm: &CM_OPS as *const _ as *mut _,
            msg: &MSG_OPS as *const _ as *mut _,
            rma: &RMA_OPS as *const _ as *mut _,
            tagged: &TAGGED_OPS as *const _ as *mut _,
            atomic: &crate::unoffered::ATOMIC_NOT_OFFERED as *const _ as *mut _,
            collective: &crate::unoffered::COLLECTIVE_NOT_OFFERED as *const _ as *mut _,
        },
        shared: Arc::new(EpShared {
            engine: Mutex::new(engine),
            me,
            directed: caps & fi::DIRECTED_RECV != 0,
            tx_op_flags: op_flags.0,
            rx_op_flags: op_flags.1,
            bound: Mutex::new(Bindings::default()),
            ready: std::sync::OnceLock::new(),
            conn: conn.map(Mutex::new),
        }),
    });
    let shared = ep.shared.clone();
    let raw = Box::into_raw(ep);
    if let Some(Ok(mut c)) = shared.conn.as_ref().map(Mutex::lock) {
        c.fid = raw as usize;
    }
    // SAFETY: the caller's promise.
    unsafe { *out = raw.cast() };
    0
}

/// The endpoint behind a fid.
///
/// # Safety
/// `fid` must be a fid this provider made, not yet closed.
unsafe fn from_fid<'a>(fid: *mut sys::fid) -> Option<&'a Ep> {
    // SAFETY: `Ep` is repr(C) with its fid first; the caller's promise.
    let ep = unsafe { fid.cast::<Ep>().as_ref()? };
    (ep.fid.fid.fclass == sys::FI_CLASS_EP as usize).then_some(ep)
}

/// The endpoint of an `fid_ep` libfabric dispatched through our tables.
fn ep<'a>(p: *mut sys::fid_ep) -> Option<&'a Ep> {
    // SAFETY: libfabric calls an endpoint's ops with that endpoint.
    unsafe { from_fid(p.cast()) }
}

/// A libfabric return value for `r`.
fn status(r: Result<(), Error>) -> isize {
    match r {
        Ok(()) => 0,
        Err(Error::WouldBlock) => -(fi::EAGAIN as isize),
        Err(Error::InvalidArgument(_)) => -(fi::EINVAL as isize),
        Err(e) => -(e.errno() as isize),
    }
}

unsafe extern "C" fn ep_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric closes a fid it got from `open`, once.
    drop(unsafe { Box::from_raw(fid.cast::<Ep>()) });
    0
}

unsafe extern "C" fn ep_bind(fid: *mut sys::fid, bfid: *mut sys::fid, flags: u64) -> c_int {
    // SAFETY: libfabric dispatched through this endpoint's ops.
    let Some(ep) = (unsafe { from_fid(fid) }) else {
        return -fi::EINVAL;
    };
    // SAFETY: `bfid` is a fid libfabric got from a provider.
    let Some(class) = (unsafe { bfid.as_ref() }).map(|f| f.fclass as u32) else {
        return -fi::EINVAL;
    };
    let Ok(mut b) = ep.shared.bound.lock() else {
        return -fi::EIO;
    };
    if b.enabled {
        return -fi::EBUSY;
    }
    match class {
        sys::FI_CLASS_AV => {
            // SAFETY: the class says it is an AV, and only ours reach us.
            let Some(av) = (unsafe { av::from_fid(bfid) }) else {
                return -fi::EINVAL;
            };
            b.av = Some(av.table.clone());
        }
        sys::FI_CLASS_CQ => {
            // SAFETY: as above, a CQ.
            let Some(q) = (unsafe { cq::from_fid(bfid) }) else {
                return -fi::EINVAL;
            };
            let known = fi::TRANSMIT | fi::RECV | fi::SELECTIVE_COMPLETION;
            if flags & !known != 0 || flags & (fi::TRANSMIT | fi::RECV) == 0 {
                return -fi::EINVAL;
            }
            let selective = flags & fi::SELECTIVE_COMPLETION != 0;
            if flags & fi::TRANSMIT != 0 {
                b.tx_cq = Some(q.queue.clone());
                b.tx_selective = selective;
            }
            if flags & fi::RECV != 0 {
                b.rx_cq = Some(q.queue.clone());
                b.rx_selective = selective;
            }
            let me: Arc<dyn Progress> = ep.shared.clone();
            q.queue.attach(Arc::downgrade(&me));
        }
        sys::FI_CLASS_EQ => {
            let Some(conn) = &ep.shared.conn else {
                return -fi::EINVAL; // RDM endpoints post no events
            };
            // SAFETY: the class says it is an EQ, and only ours reach us.
            let Some(q) = (unsafe { crate::eq::from_fid(bfid) }) else {
                return -fi::EINVAL;
            };
            if let Ok(mut c) = conn.lock() {
                c.eq = Some(q.queue.clone());
            }
            let me: Arc<dyn Progress> = ep.shared.clone();
            q.queue.attach(Arc::downgrade(&me));
        }
        sys::FI_CLASS_CNTR => {
            // SAFETY: as above, a counter.
            let Some(n) = (unsafe { crate::cntr::from_fid(bfid) }) else {
                return -fi::EINVAL;
            };
            // Counting the accesses peers make here is not offered.
            let known = fi::SEND | fi::RECV | fi::WRITE | fi::READ;
            if flags & !known != 0 || flags == 0 {
                return -fi::ENOSYS;
            }
            let set = |bit: u64, slot: &mut Option<Arc<CntrShared>>| {
                if flags & bit != 0 {
                    *slot = Some(n.shared.clone());
                }
            };
            set(fi::SEND, &mut b.tx_cntr);
            set(fi::RECV, &mut b.rx_cntr);
            set(fi::WRITE, &mut b.write_cntr);
            set(fi::READ, &mut b.read_cntr);
            let me: Arc<dyn Progress> = ep.shared.clone();
            n.shared.attach(Arc::downgrade(&me));
        }
        _ => return -fi::ENOSYS,
    }
    0
}

unsafe extern "C" fn ep_control(fid: *mut sys::fid, command: c_int, _arg: *mut c_void) -> c_int {
    // SAFETY: libfabric dispatched through this endpoint's ops.
    let Some(ep) = (unsafe { from_fid(fid) }) else {
        return -fi::EINVAL;
    };
    if command as u32 != sys::FI_ENABLE {
        return -fi::ENOSYS;
    }
    let Ok(mut b) = ep.shared.bound.lock() else {
        return -fi::EIO;
    };
    match &ep.shared.conn {
        None if b.av.is_none() => return -fi::ENOENT, // RDM needs its AV (fi_endpoint(3))
        Some(c) if c.lock().map_or(true, |c| c.eq.is_none()) => return -fi::ENOEQ,
        _ => {}
    }
    if b.tx_cq.is_none() || b.rx_cq.is_none() {
        return -fi::ENOCQ;
    }
    b.enabled = true;
    let _ = ep.shared.ready.set(b.clone());
    0
}

unsafe extern "C" fn ep_cancel(fid: sys::fid_t, context: *mut c_void) -> isize {
    // SAFETY: libfabric dispatched through this endpoint's ops.
    let Some(ep) = (unsafe { from_fid(fid) }) else {
        return -(fi::EINVAL as isize);
    };
    let shared = &ep.shared;
    let cancelled = shared
        .run(|e, _| Ok(e.cancel(context as usize)))
        .unwrap_or(false);
    if cancelled {
        if let Some(q) = shared.ready.get().and_then(|b| b.rx_cq.as_ref()) {
            q.push(Entry {
                c: Completion {
                    report: true,
                    tx: false,
                    context: context as usize,
                    flags: fi::RECV,
                    len: 0,
                    buf: 0,
                    data: 0,
                    tag: 0,
                    src: shared.me,
                    error: Some((fi::ECANCELED, 0)),
                },
                src: fi::ADDR_UNSPEC,
            });
        }
    }
    0
}

unsafe extern "C" fn ep_size_left(ep_: *mut sys::fid_ep) -> isize {
    ep(ep_).map_or(-(fi::EINVAL as isize), |ep| {
        ep.shared
            .engine
            .lock()
            .map_or(0, |e| e.tx_room().min(e.rx_room()) as isize)
    })
}

unsafe extern "C" fn cm_getname(fid: sys::fid_t, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    // SAFETY: libfabric dispatched through this endpoint's ops.
    let Some(ep) = (unsafe { from_fid(fid) }) else {
        return -fi::EINVAL;
    };
    // SAFETY: libfabric's buffer and in/out length.
    unsafe { av::copy_name(ep.shared.me, addr, addrlen) }
}

unsafe extern "C" fn cm_getpeer(
    ep_: *mut sys::fid_ep,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    let Some(ep) = ep(ep_) else {
        return -fi::EINVAL;
    };
    match ep.shared.connected_peer() {
        // SAFETY: libfabric's buffer and in/out length.
        Some(p) => unsafe { av::copy_name(p, addr, addrlen) },
        None => -fi::ENOTCONN,
    }
}

/// Moves a FI_EP_MSG endpoint's connection from `want` to `then`
/// (setting its peer when `peer` is given), then runs `f` with the
/// connection's peer, event queue and fid; the state goes back when `f`
/// fails. The connection is not locked while `f` runs: `f` sends, and
/// sending moves the engine, which may post connection events.
fn in_state(
    ep_: *mut sys::fid_ep,
    want: State,
    then: State,
    peer: Option<Address>,
    f: impl FnOnce(&EpShared, Option<Address>, Option<Arc<EqQueue>>, usize) -> Result<(), Error>,
) -> c_int {
    let Some(ep) = ep(ep_) else {
        return -fi::EINVAL;
    };
    let Some(conn) = &ep.shared.conn else {
        return -fi::EOPNOTSUPP; // RDM endpoints have no connection
    };
    let (to, eq, fid) = {
        let Ok(mut c) = conn.lock() else {
            return -fi::EIO;
        };
        if c.state != want || c.eq.is_none() {
            return -fi::EOPBADSTATE;
        }
        c.state = then;
        if peer.is_some() {
            c.peer = peer;
        }
        (c.peer, c.eq.clone(), c.fid)
    };
    match f(&ep.shared, to, eq, fid) {
        Ok(()) => 0,
        Err(e) => {
            if let Ok(mut c) = conn.lock() {
                if c.state == then {
                    c.state = want;
                }
            }
            status(Err(e)) as c_int
        }
    }
}

/// The parameters of a connect, accept or reject.
///
/// # Safety
/// `param` holds `len` bytes when not null.
pub unsafe fn params<'a>(param: *const c_void, len: usize) -> &'a [u8] {
    if param.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(param.cast(), len.min(PARAMS_MAX)) }
    }
}

/// Bytes of connection parameters carried (`fi_cm(3)`'s FI_CM_DATA_SIZE
/// minimum is 256).
pub const PARAMS_MAX: usize = 256;

unsafe extern "C" fn cm_connect(
    ep_: *mut sys::fid_ep,
    addr: *const c_void,
    param: *const c_void,
    paramlen: usize,
) -> c_int {
    if addr.is_null() || paramlen > PARAMS_MAX {
        return -fi::EINVAL;
    }
    // SAFETY: `addr` is a name of NAME_LEN bytes (fi_connect's contract).
    let name = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), av::NAME_LEN) };
    let Some(server) = av::parse_name(name) else {
        return -fi::EINVAL;
    };
    let Some(me) = ep(ep_).map(|e| e.shared.me) else {
        return -fi::EINVAL;
    };
    let server = av::here(server, me);
    // SAFETY: fi_connect's parameters.
    let p = unsafe { params(param, paramlen) };
    in_state(
        ep_,
        State::Idle,
        State::Connecting,
        Some(server),
        |shared, _, _, _| shared.run(|e, _| e.send_control(server, KIND_CONNREQ, p)),
    )
}

unsafe extern "C" fn cm_accept(
    ep_: *mut sys::fid_ep,
    param: *const c_void,
    paramlen: usize,
) -> c_int {
    if paramlen > PARAMS_MAX {
        return -fi::EINVAL;
    }
    // SAFETY: fi_accept's parameters.
    let p = unsafe { params(param, paramlen) };
    in_state(
        ep_,
        State::Idle,
        State::Connected,
        None,
        |shared, peer, eq, fid| {
            let Some(peer) = peer else {
                return Err(Error::InvalidArgument("not made for a connection request"));
            };
            shared.run(|e, _| {
                e.send_control(peer, KIND_ACCEPT, p)?;
                e.set_close_message(peer)
            })?;
            if let Some(eq) = eq {
                eq.cm(sys::FI_CONNECTED, fid, std::ptr::null_mut(), &[]);
            }
            Ok(())
        },
    )
}

unsafe extern "C" fn cm_shutdown(ep_: *mut sys::fid_ep, _flags: u64) -> c_int {
    in_state(
        ep_,
        State::Connected,
        State::Down,
        None,
        |shared, peer, _, _| {
            let Some(peer) = peer else { return Ok(()) };
            shared.run(|e, _| e.send_control(peer, KIND_SHUTDOWN, &[]))
        },
    )
}

/// The endpoint an operation toward `dest` (an fi_addr_t; a connected
/// endpoint's peer) is on, the peer's address, whether it is an inject
/// (copied now, no completion) and whether it reports a completion
/// (unless the binding is selective and `flags` do not ask for one).
fn target<'a>(
    ep_: *mut sys::fid_ep,
    dest: u64,
    flags: Option<u64>,
) -> Result<(&'a Ep, Address, bool, bool), isize> {
    let ep = ep(ep_).ok_or(-(fi::EINVAL as isize))?;
    // Not enabled: no bindings yet.
    let b = ep.shared.ready.get().ok_or(-(fi::EINVAL as isize))?;
    let to = if ep.shared.conn.is_some() {
        ep.shared.connected_peer().ok_or(-(fi::ENOTCONN as isize))?
    } else {
        let a = b.av.as_ref().and_then(|av| av.resolve(dest));
        av::here(a.ok_or(-(fi::EINVAL as isize))?, ep.shared.me)
    };
    let f = flags.unwrap_or(ep.shared.tx_op_flags);
    let inject = f & fi::INJECT != 0;
    let report = !inject && (!b.tx_selective || f & fi::COMPLETION != 0);
    Ok((ep, to, inject, report))
}

/// A send of `len` bytes at `buf` to `dest` (an fi_addr_t).
#[allow(clippy::too_many_arguments)]
fn send(
    ep_: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    tagged: bool,
    tag: u64,
    data: Option<u64>,
    context: *mut c_void,
    flags: Option<u64>,
) -> isize {
    let (ep, to, inject, report) = match target(ep_, dest, flags) {
        Ok(t) => t,
        Err(e) => return e,
    };
    status(ep.shared.run(|e, _| {
        e.send(
            to,
            buf.cast(),
            len,
            inject,
            tagged,
            tag,
            data,
            context as usize,
            report,
        )
    }))
}

/// A receive into `len` bytes at `buf`.
#[allow(clippy::too_many_arguments)]
fn recv(
    ep_: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    src: u64,
    tagged: bool,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
    flags: Option<u64>,
) -> isize {
    let Some(ep) = ep(ep_) else {
        return -(fi::EINVAL as isize);
    };
    let Some(b) = ep.shared.ready.get() else {
        return -(fi::EINVAL as isize); // not enabled
    };
    let from = if src == fi::ADDR_UNSPEC || !ep.shared.directed || ep.shared.conn.is_some() {
        None
    } else {
        match b.av.as_ref().and_then(|av| av.resolve(src)) {
            Some(a) => Some(av::here(a, ep.shared.me)),
            None => return -(fi::EINVAL as isize),
        }
    };
    let report = !b.rx_selective || flags.unwrap_or(ep.shared.rx_op_flags) & fi::COMPLETION != 0;
    let r = PostedRecv {
        buf: buf as usize,
        len: if buf.is_null() { 0 } else { len },
        src: from,
        tagged,
        tag,
        ignore,
        context: context as usize,
        report,
    };
    if let Some(f) = flags {
        if f & fi::CLAIM != 0 && f & fi::PEEK == 0 && r.tagged && f & fi::MULTI_RECV == 0 {
            let discard = f & fi::DISCARD != 0;
            let taken = ep.shared.run(|e, out| Ok(e.take_claimed(r, discard, out)));
            return match taken {
                Ok(true) => 0,
                Ok(false) => -(fi::EINVAL as isize), // nothing claimed with this context
                Err(e) => status(Err(e)),
            };
        }
        if f & (fi::PEEK | fi::CLAIM | fi::DISCARD | fi::MULTI_RECV) != 0 {
            return peek_or_refuse(ep, r, f);
        }
    }
    status(ep.shared.run(|e, out| e.post_recv(r, out)))
}

/// FI_PEEK on a tagged receive: a completion describing the first
/// matching message that has arrived whole, or FI_ENOMSG; with FI_CLAIM
/// the message is kept for the receive with FI_CLAIM and this context,
/// with FI_DISCARD it is dropped. FI_MULTI_RECV is not offered.
fn peek_or_refuse(ep: &Ep, r: PostedRecv, f: u64) -> isize {
    if f & fi::MULTI_RECV != 0 || f & fi::PEEK == 0 || !r.tagged {
        return -(fi::EOPNOTSUPP as isize);
    }
    let how = if f & fi::CLAIM != 0 {
        PeekMode::Claim
    } else if f & fi::DISCARD != 0 {
        PeekMode::Discard
    } else {
        PeekMode::Look
    };
    // What already arrived is taken off the ring first: a message the
    // device delivered before the peek must be seen by it.
    let found = ep
        .shared
        .run(|e, out| {
            e.progress(out);
            Ok(e.peek(&r, how))
        })
        .ok()
        .flatten();
    let Some(b) = ep.shared.ready.get() else {
        return -(fi::EINVAL as isize); // not enabled
    };
    let Some(q) = b.rx_cq.as_ref() else {
        return -(fi::ENOCQ as isize);
    };
    let c = match found {
        Some((len, tag, data, src)) => Completion {
            report: true,
            tx: false,
            context: r.context,
            flags: fi::RECV
                | fi::TAGGED
                | if data.is_some() {
                    fi::REMOTE_CQ_DATA
                } else {
                    0
                },
            len,
            buf: 0,
            data: data.unwrap_or(0),
            tag,
            src,
            error: None,
        },
        None => Completion {
            report: true,
            tx: false,
            context: r.context,
            flags: fi::RECV | fi::TAGGED,
            len: 0,
            buf: 0,
            data: 0,
            tag: r.tag,
            src: ep.shared.me,
            error: Some((fi::ENOMSG, 0)),
        },
    };
    let src = match (&b.av, c.error) {
        (Some(av), None) => av.reverse(c.src),
        _ => fi::ADDR_UNSPEC,
    };
    q.push(Entry { c, src });
    0
}

/// The one buffer of an iov list (longer lists are not offered).
///
/// # Safety
/// `iov` holds `count` entries.
pub(crate) unsafe fn one_iov(
    iov: *const libc::iovec,
    count: usize,
) -> Result<(*mut c_void, usize), isize> {
    match count {
        0 => Ok((std::ptr::null_mut(), 0)),
        // SAFETY: the caller's promise.
        1 => unsafe { iov.as_ref() }
            .map(|v| (v.iov_base, v.iov_len))
            .ok_or(-(fi::EINVAL as isize)),
        _ => Err(-(fi::EINVAL as isize)),
    }
}

unsafe extern "C" fn msg_recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    context: *mut c_void,
) -> isize {
    recv(ep, buf, len, src, false, 0, 0, context, None)
}

unsafe extern "C" fn msg_recvv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: libfabric's iov array of `count`.
    match unsafe { one_iov(iov.cast(), count) } {
        Ok((b, l)) => recv(ep, b, l, src, false, 0, 0, context, None),
        Err(e) => e,
    }
}

unsafe extern "C" fn msg_recvmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg,
    flags: u64,
) -> isize {
    // SAFETY: libfabric passes a valid message description.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(fi::EINVAL as isize);
    };
    // SAFETY: its iov array of `iov_count`.
    match unsafe { one_iov(m.msg_iov.cast(), m.iov_count) } {
        Ok((b, l)) => recv(ep, b, l, m.addr, false, 0, 0, m.context, Some(flags)),
        Err(e) => e,
    }
}

unsafe extern "C" fn msg_send(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    context: *mut c_void,
) -> isize {
    send(ep, buf, len, dest, false, 0, None, context, None)
}

unsafe extern "C" fn msg_sendv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: libfabric's iov array of `count`.
    match unsafe { one_iov(iov.cast(), count) } {
        Ok((b, l)) => send(ep, b, l, dest, false, 0, None, context, None),
        Err(e) => e,
    }
}

unsafe extern "C" fn msg_sendmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg,
    flags: u64,
) -> isize {
    // SAFETY: libfabric passes a valid message description.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(fi::EINVAL as isize);
    };
    let data = (flags & fi::REMOTE_CQ_DATA != 0).then_some(m.data);
    // SAFETY: its iov array of `iov_count`.
    match unsafe { one_iov(m.msg_iov.cast(), m.iov_count) } {
        Ok((b, l)) => send(ep, b, l, m.addr, false, 0, data, m.context, Some(flags)),
        Err(e) => e,
    }
}

unsafe extern "C" fn msg_inject(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
) -> isize {
    send(
        ep,
        buf,
        len,
        dest,
        false,
        0,
        None,
        std::ptr::null_mut(),
        Some(fi::INJECT),
    )
}

unsafe extern "C" fn msg_senddata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    context: *mut c_void,
) -> isize {
    send(ep, buf, len, dest, false, 0, Some(data), context, None)
}

unsafe extern "C" fn msg_injectdata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
) -> isize {
    send(
        ep,
        buf,
        len,
        dest,
        false,
        0,
        Some(data),
        std::ptr::null_mut(),
        Some(fi::INJECT),
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    recv(ep, buf, len, src, true, tag, ignore, context, None)
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_recvv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: libfabric's iov array of `count`.
    match unsafe { one_iov(iov.cast(), count) } {
        Ok((b, l)) => recv(ep, b, l, src, true, tag, ignore, context, None),
        Err(e) => e,
    }
}

unsafe extern "C" fn tagged_recvmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_tagged,
    flags: u64,
) -> isize {
    // SAFETY: libfabric passes a valid message description.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(fi::EINVAL as isize);
    };
    // SAFETY: its iov array of `iov_count`.
    match unsafe { one_iov(m.msg_iov.cast(), m.iov_count) } {
        Ok((b, l)) => recv(
            ep,
            b,
            l,
            m.addr,
            true,
            m.tag,
            m.ignore,
            m.context,
            Some(flags),
        ),
        Err(e) => e,
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_send(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    tag: u64,
    context: *mut c_void,
) -> isize {
    send(ep, buf, len, dest, true, tag, None, context, None)
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_sendv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    tag: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: libfabric's iov array of `count`.
    match unsafe { one_iov(iov.cast(), count) } {
        Ok((b, l)) => send(ep, b, l, dest, true, tag, None, context, None),
        Err(e) => e,
    }
}

unsafe extern "C" fn tagged_sendmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_tagged,
    flags: u64,
) -> isize {
    // SAFETY: libfabric passes a valid message description.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(fi::EINVAL as isize);
    };
    let data = (flags & fi::REMOTE_CQ_DATA != 0).then_some(m.data);
    // SAFETY: its iov array of `iov_count`.
    match unsafe { one_iov(m.msg_iov.cast(), m.iov_count) } {
        Ok((b, l)) => send(ep, b, l, m.addr, true, m.tag, data, m.context, Some(flags)),
        Err(e) => e,
    }
}

unsafe extern "C" fn tagged_inject(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest: u64,
    tag: u64,
) -> isize {
    send(
        ep,
        buf,
        len,
        dest,
        true,
        tag,
        None,
        std::ptr::null_mut(),
        Some(fi::INJECT),
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn tagged_senddata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    tag: u64,
    context: *mut c_void,
) -> isize {
    send(ep, buf, len, dest, true, tag, Some(data), context, None)
}

unsafe extern "C" fn tagged_injectdata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    tag: u64,
) -> isize {
    send(
        ep,
        buf,
        len,
        dest,
        true,
        tag,
        Some(data),
        std::ptr::null_mut(),
        Some(fi::INJECT),
    )
}

fid_ops!(EP_FI_OPS, ep_close, Some(ep_bind), Some(ep_control));

static EP_OPS: sys::fi_ops_ep = sys::fi_ops_ep {
    size: std::mem::size_of::<sys::fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: nosys!(c_int; sys::fid_t, c_int, c_int, *mut c_void, *mut usize),
    setopt: nosys!(c_int; sys::fid_t, c_int, c_int, *const c_void, usize),
    tx_ctx: nosys!(c_int; *mut sys::fid_ep, c_int, *mut sys::fi_tx_attr, *mut *mut sys::fid_ep, *mut c_void),
    rx_ctx: nosys!(c_int; *mut sys::fid_ep, c_int, *mut sys::fi_rx_attr, *mut *mut sys::fid_ep, *mut c_void),
    rx_size_left: Some(ep_size_left),
    tx_size_left: Some(ep_size_left),
};

static CM_OPS: sys::fi_ops_cm = sys::fi_ops_cm {
    size: std::mem::size_of::<sys::fi_ops_cm>(),
    setname: nosys!(c_int; sys::fid_t, *mut c_void, usize),
    getname: Some(cm_getname),
    getpeer: Some(cm_getpeer),
    connect: Some(cm_connect),
    listen: nosys!(c_int; *mut sys::fid_pep),
    accept: Some(cm_accept),
    reject: nosys!(c_int; *mut sys::fid_pep, sys::fid_t, *const c_void, usize),
    shutdown: Some(cm_shutdown),
    join: nosys!(c_int; *mut sys::fid_ep, *const c_void, u64, *mut *mut sys::fid_mc, *mut c_void),
};

static MSG_OPS: sys::fi_ops_msg = sys::fi_ops_msg {
    size: std::mem::size_of::<sys::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

static TAGGED_OPS: sys::fi_ops_tagged = sys::fi_ops_tagged {
    size: std::mem::size_of::<sys::fi_ops_tagged>(),
    recv: Some(tagged_recv),
    recvv: Some(tagged_recvv),
    recvmsg: Some(tagged_recvmsg),
    send: Some(tagged_send),
    sendv: Some(tagged_sendv),
    sendmsg: Some(tagged_sendmsg),
    inject: Some(tagged_inject),
    senddata: Some(tagged_senddata),
    injectdata: Some(tagged_injectdata),
};

/// A remote access: a write of `len` bytes at `buf` (copied now), or a
/// read into them, of region `key` at `addr` of `dest`.
#[allow(clippy::too_many_arguments)]
fn rma(
    ep_: *mut sys::fid_ep,
    write: bool,
    buf: *mut c_void,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
    data: Option<u64>,
    context: *mut c_void,
    flags: Option<u64>,
) -> isize {
    let (ep, to, _, report) = match target(ep_, dest, flags) {
        Ok(t) => t,
        Err(e) => return e,
    };
    if len > 0 && buf.is_null() {
        return -(fi::EINVAL as isize);
    }
    let ctx = context as usize;
    status(ep.shared.run(|e, _| {
        if write {
            e.rma_write(to, buf.cast(), len, key, addr, data, ctx, report)
        } else {
            e.rma_read(to, buf as usize, len, key, addr, ctx, report)
        }
    }))
}

/// `fi_readmsg` / `fi_writemsg`: one local buffer, one remote range.
fn rma_msg(ep_: *mut sys::fid_ep, write: bool, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    // SAFETY: libfabric's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(fi::EINVAL as isize);
    };
    // SAFETY: the message's `iov_count` entries.
    let (buf, len) = match unsafe { one_iov(m.msg_iov.cast(), m.iov_count) } {
        Ok(v) => v,
        Err(e) => return e,
    };
    if m.rma_iov_count != 1 {
        return -(fi::ENOSYS as isize);
    }
    // SAFETY: one remote range, as counted.
    let Some(r) = (unsafe { m.rma_iov.as_ref() }) else {
        return -(fi::EINVAL as isize);
    };
    if r.len != len {
        return -(fi::EINVAL as isize);
    }
    let data = (write && flags & fi::REMOTE_CQ_DATA != 0).then_some(m.data);
    rma(
        ep_,
        write,
        buf,
        len,
        m.addr,
        r.addr,
        r.key,
        data,
        m.context,
        Some(flags),
    )
}

type E = *mut sys::fid_ep;

unsafe extern "C" fn rma_read(
    ep: E,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    rma(ep, false, buf, len, src, addr, key, None, ctx, None)
}

unsafe extern "C" fn rma_readv(
    ep: E,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes `count` entries.
    match unsafe { one_iov(iov.cast(), count) } {
        Ok((buf, len)) => rma(ep, false, buf, len, src, addr, key, None, ctx, None),
        Err(e) => e,
    }
}

unsafe extern "C" fn rma_readmsg(ep: E, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    rma_msg(ep, false, msg, flags)
}

unsafe extern "C" fn rma_write(
    ep: E,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    rma(
        ep,
        true,
        buf.cast_mut(),
        len,
        dest,
        addr,
        key,
        None,
        ctx,
        None,
    )
}

unsafe extern "C" fn rma_writev(
    ep: E,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    // SAFETY: libfabric passes `count` entries.
    match unsafe { one_iov(iov.cast(), count) } {
        Ok((buf, len)) => rma(ep, true, buf, len, dest, addr, key, None, ctx, None),
        Err(e) => e,
    }
}

unsafe extern "C" fn rma_writemsg(ep: E, msg: *const sys::fi_msg_rma, flags: u64) -> isize {
    rma_msg(ep, true, msg, flags)
}

unsafe extern "C" fn rma_inject(
    ep: E,
    buf: *const c_void,
    len: usize,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    let f = Some(fi::INJECT);
    rma(
        ep,
        true,
        buf.cast_mut(),
        len,
        dest,
        addr,
        key,
        None,
        std::ptr::null_mut(),
        f,
    )
}

unsafe extern "C" fn rma_writedata(
    ep: E,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
    ctx: *mut c_void,
) -> isize {
    rma(
        ep,
        true,
        buf.cast_mut(),
        len,
        dest,
        addr,
        key,
        Some(data),
        ctx,
        None,
    )
}

unsafe extern "C" fn rma_injectdata(
    ep: E,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    addr: u64,
    key: u64,
) -> isize {
    let f = Some(fi::INJECT);
    rma(
        ep,
        true,
        buf.cast_mut(),
        len,
        dest,
        addr,
        key,
        Some(data),
        std::ptr::null_mut(),
        f,
    )
}

/// FI_RMA (docs/libfabric.md §2, "Remote memory access").
static RMA_OPS: sys::fi_ops_rma = sys::fi_ops_rma {
    size: std::mem::size_of::<sys::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};
