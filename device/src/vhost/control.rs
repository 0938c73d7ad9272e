//! Control-queue commands (spec §4): parsing, validation and execution
//! against one node of its shard.

use log::debug;
use ulnic_abi::wire::{
    self, BindPort, ClearTripwire, CmdHeader, CreatePd, EndpointCreated, Export, ExportBuffer,
    ObjectId, PdCreated, RespHeader, Revoke, SetEventQueue, SetFilter, SetTripwire, UtlbInvalidate,
    UtlbSetTable,
};
use ulnic_abi::{
    cmd, perm, status, tripwire_flags, CreateEndpoint, DeviceInfo, FilterEntry, CMD_HEADER_SIZE,
    CONDITION_RESERVE, EVENT_QUEUE_DETACH, F_IMPLEMENTED, INLINE_MAX, MAX_FILTERS, MAX_MESSAGE,
    MAX_REDIRECTS, MAX_SEGMENT_PAGES, PAGE_SIZE, SPEC_VERSION_MAJOR, SPEC_VERSION_MINOR,
};
use vm_memory::GuestMemoryMmap;
use zerocopy::{FromBytes, IntoBytes};

use crate::memory::guest::{self, Segment};
use crate::nic::aperture::Tripwire;
use crate::nic::endpoint::{Endpoint, QueueLink};
use crate::nic::node::Pd;
use crate::nic::utlb::{Table, UtlbRef};
use crate::shard::nodes::Nodes;

/// The outcome of one command: a status and a result payload.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    /// `status::*`.
    pub status: u32,
    /// Result payload (empty on error).
    pub payload: Vec<u8>,
}

impl Response {
    fn ok(payload: Vec<u8>) -> Self {
        Response {
            status: status::OK,
            payload,
        }
    }
    /// A failure with no payload.
    pub fn err(status: u32) -> Self {
        Response {
            status,
            payload: Vec::new(),
        }
    }
    /// The bytes written into the driver's response buffer.
    pub fn encode(&self) -> Vec<u8> {
        let header = RespHeader {
            status: self.status.into(),
            reserved: 0.into(),
        };
        let mut b = Vec::with_capacity(size_of::<RespHeader>() + self.payload.len());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(&self.payload);
        b
    }
}

/// A payload must be exactly as long as its command's (spec §4): shorter
/// cannot be read, longer would be ignored and so could never be given a
/// meaning later.
fn need(payload: &[u8], n: usize) -> Result<(), Response> {
    if payload.len() != n {
        Err(Response::err(status::BAD_LENGTH))
    } else {
        Ok(())
    }
}

/// The payload of a command whose payload is exactly one `T`.
fn payload<T: FromBytes + IntoBytes>(p: &[u8]) -> Result<T, Response> {
    need(p, size_of::<T>())?;
    Ok(wire::read(p))
}

/// What runs one command: (the shard's nodes, node, guest memory, payload).
type Handler = fn(&mut Nodes, u32, &GuestMemoryMmap<()>, &[u8]) -> Result<Response, Response>;

/// The handler of every command this device implements; `None` for any
/// other opcode. The one list of implemented commands.
fn handler(opcode: u32) -> Option<Handler> {
    Some(match opcode {
        cmd::GET_INFO => |f, n, _, p| need(p, 0).map(|()| get_info(f, n)),
        cmd::CREATE_PD => create_pd,
        cmd::DESTROY_PD => |f, n, _, p| destroy_pd(f, n, p),
        cmd::ACK_RESET => |f, n, _, p| ack_reset(f, n, p),
        cmd::CREATE_ENDPOINT => create_endpoint,
        cmd::DESTROY_ENDPOINT => |f, n, _, p| destroy_endpoint(f, n, p),
        cmd::BIND_PORT => |f, n, _, p| bind_port(f, n, p),
        cmd::SET_FILTER => |f, n, _, p| set_filter(f, n, p),
        cmd::ARM => |f, n, _, p| arm(f, n, p, true),
        cmd::DISARM => |f, n, _, p| arm(f, n, p, false),
        cmd::GET_STATS => |f, n, _, p| get_stats(f, n, p),
        cmd::SET_EVENT_QUEUE => |f, n, _, p| set_event_queue(f, n, p),
        cmd::EXPORT => |f, n, _, p| export(f, n, p),
        cmd::REVOKE => |f, n, _, p| revoke(f, n, p),
        cmd::EXPORT_BUFFER => export_buffer,
        cmd::SET_TRIPWIRE => set_tripwire,
        cmd::CLEAR_TRIPWIRE => |f, n, _, p| clear_tripwire(f, n, p),
        cmd::UTLB_SET_TABLE => utlb_set_table,
        cmd::UTLB_INVALIDATE => |f, n, _, p| utlb_invalidate(f, n, p),
        // Served outside the shard's lock (`pio_request`); a caller that
        // runs them here has no frontend to map into.
        cmd::EXPORT_PIO | cmd::IMPORT_PIO | cmd::REVOKE_PIO | cmd::RELEASE_PIO => {
            |_, _, _, _| Err(Response::err(status::NOT_SUPPORTED))
        }
        _ => return None,
    })
}

/// Executes the request `req` (header + payload) from node `node`, whose
/// response buffer has `room` bytes after the response header. Every check
/// comes before any effect, in the order of spec §4: a refused command
/// changes nothing.
pub fn execute(
    nodes: &mut Nodes,
    node: u32,
    mem: &GuestMemoryMmap<()>,
    req: &[u8],
    room: usize,
) -> Response {
    if req.len() < CMD_HEADER_SIZE {
        return Response::err(status::BAD_LENGTH);
    }
    let header: CmdHeader = wire::read(req);
    let opcode = header.opcode.get();
    let p = &req[CMD_HEADER_SIZE..];
    let r = admit(nodes, node, &header, room).and_then(|run| run(nodes, node, mem, p));
    let r = r.unwrap_or_else(|e| e);
    if r.status != status::OK {
        debug!(
            "node {node}: command {opcode:#x} failed: {}",
            status::name(r.status)
        );
    }
    r
}

/// The checks every command passes before its own (spec §4): known,
/// reserved word 0, no RESET unacknowledged, features accepted, room
/// for the result. Its handler, or the refusal.
fn admit(nodes: &Nodes, node: u32, header: &CmdHeader, room: usize) -> Result<Handler, Response> {
    let opcode = header.opcode.get();
    match handler(opcode) {
        None if cmd::is_reserved(opcode) => Err(Response::err(status::NOT_SUPPORTED)),
        None => Err(Response::err(status::UNKNOWN_COMMAND)),
        Some(_) if header.reserved.get() != 0 => Err(Response::err(status::INVALID_ARGUMENT)),
        // The driver has not yet taken the RESET record (spec §2.5): no
        // number of the forgotten state may act on the new one.
        Some(_) if nodes.nodes[node as usize].reset_unacked && opcode != cmd::ACK_RESET => {
            Err(Response::err(status::RESET))
        }
        Some(_) if cmd::required_features(opcode) & !nodes.nodes[node as usize].features != 0 => {
            Err(Response::err(status::NOT_SUPPORTED))
        }
        Some(_) if cmd::result_len(opcode) > room => Err(Response::err(status::BAD_LENGTH)),
        Some(run) => Ok(run),
    }
}

/// A PIO command (spec §6.2) that passed the checks every command
/// passes: its opcode and payload, to run outside the shard's lock;
/// `None` for any other command (run it with `execute`).
pub fn pio_request<'r>(
    nodes: &Nodes,
    node: u32,
    req: &'r [u8],
    room: usize,
) -> Option<Result<(u32, &'r [u8]), Response>> {
    if req.len() < CMD_HEADER_SIZE {
        return None;
    }
    let header: CmdHeader = wire::read(req);
    let opcode = header.opcode.get();
    if !matches!(
        opcode,
        cmd::EXPORT_PIO | cmd::IMPORT_PIO | cmd::REVOKE_PIO | cmd::RELEASE_PIO
    ) {
        return None;
    }
    Some(admit(nodes, node, &header, room).map(|_| (opcode, &req[CMD_HEADER_SIZE..])))
}

/// `ACK_RESET` R: the driver took RESET record R; the latest lifts the
/// refusal, an earlier one (a second pause came first) changes nothing.
fn ack_reset(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let r = payload::<ObjectId>(p)?.id.get();
    let n = &mut nodes.nodes[node as usize];
    if r == n.resets_told {
        n.reset_unacked = false;
    }
    Ok(Response::ok(Vec::new()))
}

fn get_info(nodes: &Nodes, node: u32) -> Response {
    let n = &nodes.nodes[node as usize];
    Response::ok(
        DeviceInfo {
            version_major: SPEC_VERSION_MAJOR,
            version_minor: SPEC_VERSION_MINOR,
            node,
            max_endpoints: n.endpoints.len() as u32,
            inline_max: INLINE_MAX,
            max_message: MAX_MESSAGE,
            nodes: nodes.nodes.len() as u32,
            features: F_IMPLEMENTED,
            max_tripwires: nodes.max_tripwires,
            max_apertures: ulnic_abi::MAX_APERTURES,
        }
        .encode(),
    )
}

/// CREATE_PD (spec §4.2, §5.8): a domain, its doorbell slot and bitmap.
fn create_pd(
    nodes: &mut Nodes,
    node: u32,
    mem: &GuestMemoryMmap<()>,
    p: &[u8],
) -> Result<Response, Response> {
    let gpa = payload::<CreatePd>(p)?.doorbell_gpa.get();
    let n = &mut nodes.nodes[node as usize];
    if !gpa.is_multiple_of(8) {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    let len = ulnic_abi::doorbell_bitmap_bytes(n.endpoints.len() as u32);
    // Within one page, so within one region: each word is one atomic.
    if gpa % PAGE_SIZE + len > PAGE_SIZE || !guest::range_ok(mem, gpa, len) {
        return Err(Response::err(status::BAD_ADDRESS));
    }
    let Some(slot) = n.free_doorbell_slot() else {
        return Err(Response::err(status::NO_RESOURCES));
    };
    let pd = n.next_pd;
    n.next_pd = n.next_pd.wrapping_add(1).max(1);
    n.pds.insert(
        pd,
        Pd {
            slot,
            doorbell_gpa: gpa,
        },
    );
    let created = PdCreated {
        id: pd.into(),
        doorbell_queue: ulnic_abi::doorbell_queue(slot).into(),
    };
    Ok(Response::ok(created.as_bytes().to_vec()))
}

fn destroy_pd(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let pd = payload::<ObjectId>(p)?.id.get();
    let n = &mut nodes.nodes[node as usize];
    if n.pds.remove(&pd).is_none() {
        return Err(Response::err(status::NOT_FOUND));
    }
    let ids: Vec<u32> = (0..n.endpoints.len() as u32)
        .filter(|&i| n.endpoints[i as usize].as_ref().is_some_and(|e| e.pd == pd))
        .collect();
    for id in ids {
        nodes.close_endpoint(node, id);
    }
    nodes.utlb.tables.remove((node, pd));
    nodes.utlb.cache.invalidate_domain((node, pd));
    Ok(Response::ok(Vec::new()))
}

/// UTLB_SET_TABLE (spec §5.14).
fn utlb_set_table(
    nodes: &mut Nodes,
    node: u32,
    mem: &GuestMemoryMmap<()>,
    p: &[u8],
) -> Result<Response, Response> {
    let a: UtlbSetTable = payload(p)?;
    let (pd, entries, gpa) = (a.pd.get(), a.entries.get(), a.table_gpa.get());
    if !nodes.nodes[node as usize].pds.contains_key(&pd) {
        return Err(Response::err(status::NOT_FOUND));
    }
    if entries == 0
        || entries > ulnic_abi::MAX_UTLB_ENTRIES
        || !gpa.is_multiple_of(ulnic_abi::PAGE_ENTRY_SIZE)
    {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    if !guest::range_ok(mem, gpa, u64::from(entries) * ulnic_abi::PAGE_ENTRY_SIZE) {
        return Err(Response::err(status::BAD_ADDRESS));
    }
    nodes.utlb.cache.invalidate_domain((node, pd));
    nodes.utlb.tables.set((node, pd), Table { gpa, entries });
    Ok(Response::ok(Vec::new()))
}

/// UTLB_INVALIDATE. Runs under the shard
/// lock, so once it returns no descriptor uses the old translations.
fn utlb_invalidate(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let a: UtlbInvalidate = payload(p)?;
    let (pd, first, count) = (a.pd.get(), a.first.get(), a.count.get());
    if !nodes.nodes[node as usize].pds.contains_key(&pd) {
        return Err(Response::err(status::NOT_FOUND));
    }
    nodes.utlb.cache.invalidate((node, pd), first, count);
    Ok(Response::ok(Vec::new()))
}

fn create_endpoint(
    nodes: &mut Nodes,
    node: u32,
    mem: &GuestMemoryMmap<()>,
    p: &[u8],
) -> Result<Response, Response> {
    need(p, CreateEndpoint::SIZE)?;
    let c = CreateEndpoint::decode(p);
    let n = &mut nodes.nodes[node as usize];
    let Some(domain) = n.pds.get(&c.pd).copied() else {
        return Err(Response::err(status::NOT_FOUND));
    };
    let layout = c.layout();
    layout
        .validate()
        .map_err(|_| Response::err(status::INVALID_ARGUMENT))?;
    if !c.ctrl_gpa.is_multiple_of(PAGE_SIZE)
        || !c.ctrl_len.is_multiple_of(PAGE_SIZE)
        || c.ctrl_len < layout.region_size()
    {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    if !guest::range_ok(mem, c.ctrl_gpa, c.ctrl_len) {
        return Err(Response::err(status::BAD_ADDRESS));
    }
    if c.seg_pages > MAX_SEGMENT_PAGES {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    let table_len = u64::from(c.seg_pages) * ulnic_abi::PAGE_ENTRY_SIZE;
    if !guest::range_ok(mem, c.seg_table_gpa, table_len) {
        return Err(Response::err(status::BAD_ADDRESS));
    }
    let mut table = vec![0u8; table_len as usize];
    guest::read(mem, c.seg_table_gpa, &mut table)
        .map_err(|_| Response::err(status::BAD_ADDRESS))?;
    let pages = table
        .chunks_exact(ulnic_abi::PAGE_ENTRY_SIZE as usize)
        .map(|b| ulnic_abi::read_le64(b, 0));
    let segment =
        Segment::from_pages(mem, pages).map_err(|_| Response::err(status::BAD_ADDRESS))?;
    let Some(id) = n.endpoints.iter().position(|e| e.is_none()) else {
        return Err(Response::err(status::NO_RESOURCES));
    };
    let mut ep = Endpoint::new(c.pd, c.ctrl_gpa, layout, segment);
    ep.session = n.next_session();
    ep.init_shared(mem)
        .map_err(|_| Response::err(status::BAD_ADDRESS))?;
    n.last_session = ep.session;
    debug!(
        "node {node}: endpoint {id} created (pd {}, rings {}/{}/{}/{}, segment {} KiB in {} extents)",
        c.pd,
        layout.send_entries,
        layout.recv_entries,
        layout.free_entries,
        layout.event_entries,
        ep.segment.len() / 1024,
        ep.segment.extents()
    );
    n.endpoints[id] = Some(ep);
    n.make_resident(mem, id as u32, std::time::Instant::now());
    let created = EndpointCreated {
        id: (id as u32).into(),
        doorbell_queue: ulnic_abi::doorbell_queue(domain.slot).into(),
    };
    Ok(Response::ok(created.as_bytes().to_vec()))
}

fn destroy_endpoint(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let id = payload::<ObjectId>(p)?.id.get();
    if !nodes.close_endpoint(node, id) {
        return Err(Response::err(status::NOT_FOUND));
    }
    debug!("node {node}: endpoint {id} destroyed");
    Ok(Response::ok(Vec::new()))
}

fn bind_port(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let a: BindPort = payload(p)?;
    let (id, port) = (a.endpoint.get(), a.port.get());
    let n = &mut nodes.nodes[node as usize];
    n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    if port == 0 || port == ulnic_abi::ANY {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    // A port already bound, even by this endpoint, is in use.
    if n.ports.contains_key(&port) {
        return Err(Response::err(status::ADDRESS_IN_USE));
    }
    let ep = n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    let old = ep.port.replace(port);
    if let Some(old) = old {
        n.ports.remove(&old);
    }
    n.ports.insert(port, id);
    Ok(Response::ok(Vec::new()))
}

fn set_filter(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let head = size_of::<SetFilter>();
    if p.len() < head {
        return Err(Response::err(status::BAD_LENGTH));
    }
    let a: SetFilter = wire::read(p);
    let (id, count) = (a.endpoint.get(), a.count.get() as usize);
    // The length first (spec §4 step 6), then the endpoint and the count
    // (step 7).
    need(p, head + count * FilterEntry::SIZE)?;
    let ep = nodes.nodes[node as usize]
        .endpoint_mut(id)
        .ok_or(Response::err(status::NOT_FOUND))?;
    if count > MAX_FILTERS {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    ep.filters = p[head..]
        .chunks_exact(FilterEntry::SIZE)
        .map(FilterEntry::decode)
        .collect();
    Ok(Response::ok(Vec::new()))
}

fn arm(nodes: &mut Nodes, node: u32, p: &[u8], on: bool) -> Result<Response, Response> {
    let id = payload::<ObjectId>(p)?.id.get();
    let ep = nodes.nodes[node as usize]
        .endpoint_mut(id)
        .ok_or(Response::err(status::NOT_FOUND))?;
    ep.notify_enabled = on;
    Ok(Response::ok(Vec::new()))
}

/// SET_EVENT_QUEUE (spec §4.2, §6.1): every check before the link changes.
fn set_event_queue(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let a: SetEventQueue = payload(p)?;
    let (id, queue, cookie) = (a.endpoint.get(), a.queue.get(), a.cookie.get());
    let reserved = CONDITION_RESERVE + nodes.max_tripwires + MAX_REDIRECTS;
    let n = &mut nodes.nodes[node as usize];
    let source = n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    if queue == EVENT_QUEUE_DETACH {
        source.queue = None;
        return Ok(Response::ok(Vec::new()));
    }
    let pd = source.pd;
    let q = n
        .endpoint_mut(queue)
        .ok_or(Response::err(status::NOT_FOUND))?;
    let (q_pd, q_session) = (q.pd, q.session);
    let room = q
        .layout
        .event_entries
        .saturating_sub(q.layout.send_entries + reserved);
    // Links to a queue since destroyed count for nothing (spec §6.1).
    let q_linked = n.queue_of(queue).is_some();
    let source_is_a_queue = n.sources_of(id).next().is_some();
    if queue == id || q_pd != pd || q_linked || source_is_a_queue {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    let already = n.queue_of(id).is_some_and(|l| l.id == queue);
    let sources = n.sources_of(queue).count() as u32;
    if !already && sources + 1 > room {
        return Err(Response::err(status::NO_RESOURCES));
    }
    let source = n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    source.queue = Some(QueueLink {
        id: queue,
        session: q_session,
        cookie,
    });
    Ok(Response::ok(Vec::new()))
}

fn get_stats(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let id = payload::<ObjectId>(p)?.id.get();
    let ep = nodes.nodes[node as usize]
        .endpoint_mut(id)
        .ok_or(Response::err(status::NOT_FOUND))?;
    Ok(Response::ok(
        ep.stats
            .to_array()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    ))
}

fn export(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let a: Export = payload(p)?;
    let (id, perms) = (a.endpoint.get(), a.perms.get());
    let (offset, len) = (a.offset.get(), a.len.get());
    let n = &mut nodes.nodes[node as usize];
    let ep = n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    if perms == 0
        || perms & !perm::ALL != 0
        || len == 0
        || !offset.is_multiple_of(8)
        || !ep.segment.contains(offset, len)
    {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    let mut cookie = n
        .apertures
        .export(id, offset, len, perms, None)
        .ok_or(Response::err(status::NO_RESOURCES))?;
    cookie.node = node;
    debug!("node {node} ep {id}: exported aperture {}", cookie.aperture);
    Ok(Response::ok(cookie.encode().to_vec()))
}

/// EXPORT_BUFFER (spec §5.12, §5.14).
fn export_buffer(
    nodes: &mut Nodes,
    node: u32,
    mem: &GuestMemoryMmap<()>,
    p: &[u8],
) -> Result<Response, Response> {
    let a: ExportBuffer = payload(p)?;
    let (id, perms) = (a.endpoint.get(), a.perms.get());
    let r = UtlbRef {
        first: a.utlb_first.get(),
        count: a.utlb_count.get(),
        offset: a.page_offset.get(),
    };
    let len = a.len.get();
    let n = &mut nodes.nodes[node as usize];
    let ep = n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    if perms == 0 || perms & !perm::ALL != 0 || len == 0 || !r.offset.is_multiple_of(8) {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    // The entries must translate now; each access translates them again.
    let tag = (node, ep.pd);
    let seg = nodes
        .utlb
        .cache
        .translate(mem, nodes.utlb.tables.get(tag), tag, r, len, &mut ep.stats)
        .map_err(|code| {
            Response::err(if code == ulnic_abi::tx_error::BAD_ADDRESS {
                status::BAD_ADDRESS
            } else {
                status::INVALID_ARGUMENT
            })
        })?;
    nodes.utlb.cache.recycle(seg);
    let mut cookie = n
        .apertures
        .export(id, r.offset, len, perms, Some(r))
        .ok_or(Response::err(status::NO_RESOURCES))?;
    cookie.node = node;
    debug!(
        "node {node} ep {id}: exported a user buffer as aperture {}",
        cookie.aperture
    );
    Ok(Response::ok(cookie.encode().to_vec()))
}

fn revoke(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let a: Revoke = payload(p)?;
    let (id, aperture) = (a.endpoint.get(), a.aperture.get());
    let n = &mut nodes.nodes[node as usize];
    n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    if !n.apertures.revoke(id, aperture) {
        return Err(Response::err(status::NOT_FOUND));
    }
    Ok(Response::ok(Vec::new()))
}

fn set_tripwire(
    nodes: &mut Nodes,
    node: u32,
    mem: &GuestMemoryMmap<()>,
    p: &[u8],
) -> Result<Response, Response> {
    let a: SetTripwire = payload(p)?;
    let (id, aperture) = (a.endpoint.get(), a.aperture.get());
    let (offset, len, flags) = (a.offset.get(), a.len.get(), a.flags.get());
    let user = a.user.get();
    let cap = nodes.max_tripwires;
    let n = &mut nodes.nodes[node as usize];
    n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    if a.reserved.get() != 0 {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    let session = n.endpoint_mut(id).map(|e| e.session);
    // With PIO the range is in one of the endpoint's PIO windows (spec
    // §6.2), else in one of its apertures.
    let range = if flags & tripwire_flags::PIO != 0 {
        n.windows
            .get(&aperture)
            .filter(|_| n.features & ulnic_abi::F_PIO != 0)
            .filter(|w| w.ep == id && Some(w.session) == session)
            .map(|w| w.len)
    } else {
        n.apertures
            .get(aperture)
            .filter(|a| a.ep == id)
            .map(|a| a.len)
    };
    let range = range.ok_or(Response::err(status::NOT_FOUND))?;
    let ep = n.endpoint_mut(id).ok_or(Response::err(status::NOT_FOUND))?;
    if flags & !tripwire_flags::ALL != 0
        || flags & (tripwire_flags::READ | tripwire_flags::WRITE) == 0
        || len == 0
        || offset.checked_add(len).is_none_or(|end| end > range)
    {
        return Err(Response::err(status::INVALID_ARGUMENT));
    }
    let t = Tripwire {
        aperture,
        offset,
        len,
        flags,
        user,
        active: true,
    };
    let tid = ep
        .set_tripwire(t, cap)
        .ok_or(Response::err(status::NO_RESOURCES))?;
    // A reused id starts unfired, so its first firing posts an event.
    let flag = ep.ctrl + ulnic_abi::ctrl::TRIPWIRE_FIRED + u64::from(tid);
    let _ = guest::write(mem, flag, &[0]);
    Ok(Response::ok(
        ObjectId { id: tid.into() }.as_bytes().to_vec(),
    ))
}

fn clear_tripwire(nodes: &mut Nodes, node: u32, p: &[u8]) -> Result<Response, Response> {
    let a: ClearTripwire = payload(p)?;
    let (id, tid) = (a.endpoint.get(), a.tripwire.get());
    let ep = nodes.nodes[node as usize]
        .endpoint_mut(id)
        .ok_or(Response::err(status::NOT_FOUND))?;
    match ep.tripwires.get_mut(tid as usize) {
        Some(slot) if slot.is_some() => {
            *slot = None;
            Ok(Response::ok(Vec::new()))
        }
        _ => Err(Response::err(status::NOT_FOUND)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::guest::tests::mem;
    use ulnic_abi::{cmd, status, CreateEndpoint};

    /// Runs a request from node 1 with a response buffer of 512 bytes.
    fn exec(f: &mut Nodes, m: &GuestMemoryMmap<()>, r: &[u8]) -> Response {
        execute(f, 1, m, r, 512)
    }

    /// A CREATE_PD payload: a doorbell bitmap at 0xf000.
    const PD: [u8; 8] = 0xf000u64.to_le_bytes();

    fn req(opcode: u32, payload: &[u8]) -> Vec<u8> {
        let mut r = opcode.to_le_bytes().to_vec();
        r.extend_from_slice(&[0; 4]);
        r.extend_from_slice(payload);
        r
    }

    #[test]
    fn commands_on_mock_memory() {
        let m = mem(1 << 20);
        let mut f = Nodes::new(2, 4);
        // Nothing but GET_INFO before the driver accepted the features.
        assert_eq!(
            exec(&mut f, &m, &req(cmd::CREATE_PD, &PD)).status,
            status::NOT_SUPPORTED
        );
        assert_eq!(
            exec(&mut f, &m, &req(cmd::GET_INFO, &[])).status,
            status::OK
        );
        f.nodes[1].features = ulnic_abi::F_MESSAGING;
        assert_eq!(
            exec(&mut f, &m, &req(cmd::EXPORT, &[0; 24])).status,
            status::NOT_SUPPORTED,
            "RDMA was not accepted"
        );
        f.nodes[1].features = F_IMPLEMENTED;
        // A reserved header word must be zero; a payload must be exact.
        let mut bad = req(cmd::CREATE_PD, &PD);
        bad[4] = 1;
        assert_eq!(exec(&mut f, &m, &bad).status, status::INVALID_ARGUMENT);
        assert_eq!(
            exec(&mut f, &m, &req(cmd::CREATE_PD, &[0; 9])).status,
            status::BAD_LENGTH
        );
        // No room for the result: refused before it runs, after the
        // header and feature checks (spec §4 order).
        assert_eq!(
            execute(&mut f, 1, &m, &req(cmd::CREATE_PD, &PD), 7).status,
            status::BAD_LENGTH
        );
        assert_eq!(
            execute(&mut f, 1, &m, &bad, 0).status,
            status::INVALID_ARGUMENT
        );
        assert!(
            f.nodes[1].pds.is_empty(),
            "refused commands created nothing"
        );
        assert_eq!(exec(&mut f, &m, &[1, 2]).status, status::BAD_LENGTH);
        for reserved in [0x22, 0x55] {
            assert_eq!(
                exec(&mut f, &m, &req(reserved, &[])).status,
                status::NOT_SUPPORTED
            );
        }
        assert_eq!(
            exec(&mut f, &m, &req(cmd::REVOKE, &[])).status,
            status::BAD_LENGTH
        );
        assert_eq!(
            exec(&mut f, &m, &req(0x60, &[])).status,
            status::UNKNOWN_COMMAND
        );
        let info = exec(&mut f, &m, &req(cmd::GET_INFO, &[]));
        let info = DeviceInfo::decode(&info.payload);
        assert_eq!((info.node, info.nodes, info.max_endpoints), (1, 2, 4));
        let pd = ulnic_abi::read_le32(&exec(&mut f, &m, &req(cmd::CREATE_PD, &PD)).payload, 0);
        guest::write(&m, 0x80000, &0x90000u64.to_le_bytes()).unwrap();
        let c = CreateEndpoint {
            pd,
            send_entries: 4,
            recv_entries: 4,
            free_entries: 4,
            event_entries: 64,
            ctrl_gpa: 0x10000,
            ctrl_len: 0x10000,
            seg_table_gpa: 0x80000,
            seg_pages: 1,
        };
        for _ in 0..4 {
            assert_eq!(
                exec(&mut f, &m, &req(cmd::CREATE_ENDPOINT, &c.encode())).status,
                status::OK
            );
        }
        assert_eq!(
            exec(&mut f, &m, &req(cmd::CREATE_ENDPOINT, &c.encode())).status,
            status::NO_RESOURCES
        );
        let mut bind = 2u32.to_le_bytes().to_vec();
        bind.extend_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            exec(&mut f, &m, &req(cmd::BIND_PORT, &bind)).status,
            status::OK
        );
        assert_eq!(f.nodes[1].ports.get(&9), Some(&2));
        // A bound port is in use: for this endpoint again, and for another.
        assert_eq!(
            exec(&mut f, &m, &req(cmd::BIND_PORT, &bind)).status,
            status::ADDRESS_IN_USE
        );
        let mut other = 1u32.to_le_bytes().to_vec();
        other.extend_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            exec(&mut f, &m, &req(cmd::BIND_PORT, &other)).status,
            status::ADDRESS_IN_USE
        );
        // Destroying the PD frees its endpoints and their ports.
        assert_eq!(
            exec(&mut f, &m, &req(cmd::DESTROY_PD, &pd.to_le_bytes())).status,
            status::OK
        );
        assert!(f.nodes[1].endpoints.iter().all(|e| e.is_none()));
        assert!(f.nodes[1].ports.is_empty());
        // Other node untouched throughout.
        assert!(f.nodes[0].pds.is_empty());
    }

    #[test]
    fn response_encoding() {
        let r = Response {
            status: status::NOT_FOUND,
            payload: vec![],
        };
        assert_eq!(r.encode(), vec![5, 0, 0, 0, 0, 0, 0, 0]);
    }
}
