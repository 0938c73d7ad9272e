//! PIO windows (spec §6.2), CLAN's PIO apertures: memory the device
//! creates for an exporter and maps into importers' apertures with
//! vhost-user `SHMEM_MAP`, so their stores land with no device step.
//!
//! One `Pio` serves every node of the device process. Its commands run
//! on the commanding node's control-queue thread, outside the shard
//! locks: a map waits for the frontend's reply, and QEMU sends the
//! device a new memory table (through the node's other thread) while
//! it maps. `ops` keeps them one at a time; `books` is held only
//! briefly and never across a reply.

pub mod frontend;
pub mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use log::{debug, warn};
use ulnic_abi::wire::{self, ExportPio, ImportPio, PioExported, PioImported, PioObject};
use ulnic_abi::{event, status, EventRecord, ANY, MAX_PIO_MAPPINGS, MAX_PIO_PAGES, PAGE_SIZE};
use vhost::vhost_user::Backend;
use zerocopy::{FromBytes, IntoBytes};

use crate::nic::aperture::WindowRef;
use crate::pio::frontend::Frontend;
use crate::pio::window::WindowFile;
use crate::shard::Shard;

/// An endpoint that owns a window or an import: alive while its node
/// still has it under the same session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    node: u32,
    ep: u32,
    session: u32,
}

/// Ids of one node's windows or imports, with their owners.
type Owned = Vec<(u32, Owner)>;

/// An exported window.
struct Window {
    file: Arc<WindowFile>,
    owner: Owner,
    /// The node allowed to import it, or `ANY`.
    importer: u32,
    key: u64,
    /// Its range in the exporter's aperture.
    offset: u64,
    /// No importer maps it any more, and none may.
    revoked: bool,
}

/// A window mapped into an importer's aperture.
struct Import {
    owner: Owner,
    /// (exporter node, window id) while the window lives.
    window: Option<(u32, u32)>,
    key: u64,
    offset: u64,
    bytes: u64,
    /// Still mapped (until a revoke or a release).
    mapped: bool,
}

/// The device's books on windows and imports.
#[derive(Default)]
struct Books {
    frontends: Vec<Frontend>,
    /// By (exporter node, window id).
    windows: HashMap<(u32, u32), Window>,
    /// By (importer node, import id).
    imports: HashMap<(u32, u32), Import>,
    /// The last window or import id given (ids start at 1).
    next_id: u32,
}

/// What PIO windows cost the frontends (spec §6.2), for tests and
/// `ulnic stats`.
#[derive(Debug, Default)]
pub struct PioCounters {
    /// `SHMEM_MAP` requests sent.
    pub maps: AtomicU64,
    /// `SHMEM_UNMAP` requests sent (fences included).
    pub unmaps: AtomicU64,
    /// PIO commands served.
    pub commands: AtomicU64,
}

/// Every node's PIO windows.
pub struct Pio {
    ops: Mutex<()>,
    books: Mutex<Books>,
    /// The shard serving each node; `None` for a node of another device
    /// process (it shares no memory with this one).
    shards: Vec<Option<Arc<Shard>>>,
    aperture: u64,
    /// What the frontends were sent.
    pub counters: PioCounters,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn payload<T: FromBytes + IntoBytes>(p: &[u8]) -> Result<T, Fail> {
    if p.len() != size_of::<T>() {
        return Err(Fail(status::BAD_LENGTH));
    }
    Ok(wire::read(p))
}

/// A refused PIO command's status (`status::*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fail(pub u32);

fn ok(bytes: &[u8]) -> Vec<u8> {
    bytes.to_vec()
}

impl Pio {
    /// PIO windows for nodes served by `shards` (`None` for a node of
    /// another device process), each frontend's aperture `aperture` bytes.
    pub fn new(shards: Vec<Option<Arc<Shard>>>, aperture: u64) -> Pio {
        let frontends = shards.iter().map(|_| Frontend::default()).collect();
        Pio {
            ops: Mutex::new(()),
            books: Mutex::new(Books {
                frontends,
                ..Books::default()
            }),
            shards,
            aperture,
            counters: PioCounters::default(),
        }
    }

    /// The aperture each frontend is told of (`GET_SHMEM_CONFIG`).
    pub fn aperture(&self) -> u64 {
        self.aperture
    }

    /// Node `node`'s frontend gave its backend channel.
    pub fn connected(&self, node: u32, channel: Backend) {
        if let Some(f) = lock(&self.books).frontends.get_mut(node as usize) {
            f.connected(channel, self.aperture);
        }
    }

    /// Node `node`'s frontend stopped its control queue, reset or left:
    /// nothing more is sent to it until it runs again. Never waits.
    pub fn stopped(&self, node: u32) {
        if let Some(f) = lock(&self.books).frontends.get_mut(node as usize) {
            f.started = false;
        }
    }

    /// Node `node`'s frontend kicked its control queue: it runs, and
    /// gets the unmaps it is owed (on a thread of their own: the kick's
    /// thread must not wait for `ops`).
    pub fn started(self: &Arc<Self>, node: u32) {
        {
            let mut b = lock(&self.books);
            let Some(f) = b.frontends.get_mut(node as usize) else {
                return;
            };
            f.started = true;
            if f.owed.is_empty() {
                return;
            }
        }
        let pio = self.clone();
        let sent = std::thread::Builder::new()
            .name(format!("ulnic-pio{node}"))
            .spawn(move || pio.send_owed(node));
        if let Err(e) = sent {
            warn!("node {node}: cannot start sending owed unmaps: {e}");
        }
    }

    /// Sends node `node`'s frontend the unmaps it is owed, if it still
    /// runs. Under `ops`, so no command maps a range meanwhile.
    fn send_owed(&self, node: u32) {
        let _ops = lock(&self.ops);
        let (owed, ch) = {
            let mut b = lock(&self.books);
            let Some(f) = b.frontends.get_mut(node as usize) else {
                return;
            };
            match (&f.channel, f.started) {
                (Some(ch), true) => (std::mem::take(&mut f.owed), ch.clone()),
                _ => return, // stopped again: the next start sends them
            }
        };
        for (offset, len, free) in owed {
            self.counters.unmaps.fetch_add(2, Ordering::Relaxed);
            // After a reset QEMU has dropped them already: a refusal
            // then is expected.
            frontend::unmap(&ch, offset, len);
            // Only now may a new window take the range: an unmap sent
            // after its map would remove it.
            if free {
                self.free_range(node, offset);
            }
        }
    }

    /// Node `node`'s connection ended: nothing is sent to it again, and
    /// whatever its endpoints held is revoked or released.
    pub fn disconnected(&self, node: u32) {
        if let Some(f) = lock(&self.books).frontends.get_mut(node as usize) {
            *f = Frontend::default();
        }
        self.sweep(node);
    }

    /// Whether node `node` holds any window or import (what a sweep
    /// would look at): most nodes never do, and need no sweep.
    pub fn holds_any(&self, node: u32) -> bool {
        let b = lock(&self.books);
        b.windows.keys().any(|&(n, _)| n == node) || b.imports.keys().any(|&(n, _)| n == node)
    }

    /// Revokes the windows and releases the imports of node `node`'s
    /// endpoints that no longer exist (after DESTROY_ENDPOINT,
    /// DESTROY_PD, a reset).
    pub fn sweep(&self, node: u32) {
        let _ops = lock(&self.ops);
        let (windows, imports): (Owned, Owned) = {
            let b = lock(&self.books);
            (
                b.windows
                    .iter()
                    .filter(|((n, _), _)| *n == node)
                    .map(|((_, id), w)| (*id, w.owner))
                    .collect(),
                b.imports
                    .iter()
                    .filter(|((n, _), _)| *n == node)
                    .map(|((_, id), i)| (*id, i.owner))
                    .collect(),
            )
        };
        for (id, owner) in windows {
            if !self.alive(owner) {
                self.drop_window(node, id);
            }
        }
        for (id, owner) in imports {
            if !self.alive(owner) {
                self.release_import(node, id);
            }
        }
    }

    fn shard(&self, node: u32) -> Option<&Arc<Shard>> {
        self.shards.get(node as usize)?.as_ref()
    }

    fn alive(&self, o: Owner) -> bool {
        self.shard(o.node)
            .is_some_and(|s| s.lock().session_of(o.node, o.ep) == Some(o.session))
    }

    /// The endpoint `ep` of `node` as an owner, or `NOT_FOUND`.
    fn owner(&self, node: u32, ep: u32) -> Result<Owner, Fail> {
        let session = self
            .shard(node)
            .and_then(|s| s.lock().session_of(node, ep))
            .ok_or(Fail(status::NOT_FOUND))?;
        Ok(Owner { node, ep, session })
    }

    /// Runs PIO command `opcode` of node `node` (its generic checks done,
    /// spec §4).
    /// Its result payload, or the status refusing it.
    pub fn execute(&self, node: u32, opcode: u32, p: &[u8]) -> Result<Vec<u8>, Fail> {
        self.counters.commands.fetch_add(1, Ordering::Relaxed);
        let _ops = lock(&self.ops);
        let r = match opcode {
            ulnic_abi::cmd::EXPORT_PIO => self.export(node, p),
            ulnic_abi::cmd::IMPORT_PIO => self.import(node, p),
            ulnic_abi::cmd::REVOKE_PIO => self.revoke(node, p),
            ulnic_abi::cmd::RELEASE_PIO => self.release(node, p),
            _ => Err(Fail(status::UNKNOWN_COMMAND)),
        };
        if let Err(Fail(s)) = r {
            debug!(
                "node {node}: PIO command {opcode:#x} failed: {}",
                status::name(s)
            );
        }
        r
    }

    /// A range of `bytes` in node `node`'s aperture and its channel, or
    /// why not (spec §6.2): `NOT_SUPPORTED` without an aperture,
    /// `NO_RESOURCES` when full.
    fn reserve(&self, b: &mut Books, node: u32, bytes: u64) -> Result<(u64, Backend), Fail> {
        let f = b
            .frontends
            .get_mut(node as usize)
            .ok_or(Fail(status::NOT_SUPPORTED))?;
        let (Some(ch), Some(ranges)) = (f.channel.clone(), f.ranges.as_mut()) else {
            return Err(Fail(status::NOT_SUPPORTED));
        };
        if f.mapped >= MAX_PIO_MAPPINGS {
            return Err(Fail(status::NO_RESOURCES));
        }
        let offset = ranges.take(bytes).ok_or(Fail(status::NO_RESOURCES))?;
        f.mapped += 1;
        Ok((offset, ch))
    }

    /// Undoes `reserve` after the frontend refused the map.
    fn unreserve(&self, node: u32, offset: u64) {
        let mut b = lock(&self.books);
        if let Some(f) = b.frontends.get_mut(node as usize) {
            f.mapped = f.mapped.saturating_sub(1);
            if let Some(r) = f.ranges.as_mut() {
                r.free(offset);
            }
        }
    }

    /// Maps `file` at `offset` of `node`'s aperture, or gives the range
    /// back (`NO_RESOURCES`: the frontend refused).
    fn map_or_unreserve(
        &self,
        node: u32,
        ch: &Backend,
        file: &WindowFile,
        offset: u64,
    ) -> Result<(), Fail> {
        self.counters.maps.fetch_add(1, Ordering::Relaxed);
        if frontend::map(ch, &file.fd, offset, file.bytes) {
            return Ok(());
        }
        self.unreserve(node, offset);
        Err(Fail(status::NO_RESOURCES))
    }

    fn export(&self, node: u32, p: &[u8]) -> Result<Vec<u8>, Fail> {
        let req: ExportPio = payload(p)?;
        let owner = self.owner(node, req.endpoint.get())?;
        let pages = req.pages.get();
        let importer = req.importer.get();
        if req.reserved.get() != 0
            || !(1..=MAX_PIO_PAGES).contains(&pages)
            || (importer != ANY && importer as usize >= self.shards.len())
        {
            return Err(Fail(status::INVALID_ARGUMENT));
        }
        let bytes = u64::from(pages) * PAGE_SIZE;
        let (offset, ch) = self.reserve(&mut lock(&self.books), node, bytes)?;
        let file = match WindowFile::create(pages) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                warn!("node {node}: cannot create a PIO window of {pages} pages: {e}");
                self.unreserve(node, offset);
                return Err(Fail(status::NO_RESOURCES));
            }
        };
        self.map_or_unreserve(node, &ch, &file, offset)?;
        let key = rand::RngCore::next_u64(&mut rand::rngs::OsRng);
        let mut b = lock(&self.books);
        b.next_id = b.next_id.wrapping_add(1).max(1); // 0 names nothing
        let id = b.next_id;
        let bytes = file.bytes;
        b.windows.insert(
            (node, id),
            Window {
                file,
                owner,
                importer,
                key,
                offset,
                revoked: false,
            },
        );
        drop(b);
        // What the NIC checks a PIO_SYNC and a PIO tripwire against.
        let seen = WindowRef {
            ep: owner.ep,
            session: owner.session,
            key,
            len: bytes,
            importer,
        };
        if let Some(s) = self.shard(node) {
            s.lock().nodes[node as usize].windows.insert(id, seen);
        }
        let out = PioExported {
            window: id.into(),
            reserved: 0.into(),
            key: key.into(),
            offset: offset.into(),
        };
        Ok(ok(out.as_bytes()))
    }

    fn import(&self, node: u32, p: &[u8]) -> Result<Vec<u8>, Fail> {
        let req: ImportPio = payload(p)?;
        let owner = self.owner(node, req.endpoint.get())?;
        if req.reserved.get() != 0 {
            return Err(Fail(status::INVALID_ARGUMENT));
        }
        let from = req.node.get();
        if from as usize >= self.shards.len() {
            return Err(Fail(status::NOT_FOUND));
        }
        if self.shard(from).is_none() {
            // A node of another device process shares no memory with us.
            return Err(Fail(status::NOT_SUPPORTED));
        }
        let key = req.key.get();
        let id = (from, req.window.get());
        let mut b = lock(&self.books);
        let file = match b.windows.get(&id) {
            Some(w) if w.key == key && !w.revoked && (w.importer == ANY || w.importer == node) => {
                w.file.clone()
            }
            _ => return Err(Fail(status::NOT_FOUND)),
        };
        let (offset, ch) = self.reserve(&mut b, node, file.bytes)?;
        drop(b);
        self.map_or_unreserve(node, &ch, &file, offset)?;
        let mut b = lock(&self.books);
        if !b.windows.contains_key(&id) {
            // Cannot happen: revocations wait for `ops`, which we hold.
            warn!("node {node}: window {id:?} went away while being imported");
        }
        b.next_id = b.next_id.wrapping_add(1).max(1); // 0 names nothing
        let import = b.next_id;
        b.imports.insert(
            (node, import),
            Import {
                owner,
                window: Some(id),
                key,
                offset,
                bytes: file.bytes,
                mapped: true,
            },
        );
        let out = PioImported {
            import: import.into(),
            pages: ((file.bytes / PAGE_SIZE) as u32).into(),
            offset: offset.into(),
        };
        Ok(ok(out.as_bytes()))
    }

    fn revoke(&self, node: u32, p: &[u8]) -> Result<Vec<u8>, Fail> {
        let req: PioObject = payload(p)?;
        let owner = self.owner(node, req.endpoint.get())?;
        let id = req.id.get();
        match lock(&self.books).windows.get(&(node, id)) {
            Some(w) if w.owner == owner => {}
            _ => return Err(Fail(status::NOT_FOUND)),
        }
        self.revoke_window(node, id);
        Ok(ok(&[]))
    }

    fn release(&self, node: u32, p: &[u8]) -> Result<Vec<u8>, Fail> {
        let req: PioObject = payload(p)?;
        let owner = self.owner(node, req.endpoint.get())?;
        let id = req.id.get();
        let (import, window) = {
            let b = lock(&self.books);
            let mine = |o: Owner| o == owner;
            (
                b.imports.get(&(node, id)).is_some_and(|i| mine(i.owner)),
                b.windows.get(&(node, id)).is_some_and(|w| mine(w.owner)),
            )
        };
        match (import, window) {
            (true, _) => self.release_import(node, id),
            (_, true) => self.drop_window(node, id),
            _ => return Err(Fail(status::NOT_FOUND)),
        }
        Ok(ok(&[]))
    }

    /// Removes `[offset, +len)` (import or window `id`) from node
    /// `node`'s aperture: at once if
    /// its frontend runs, at its next start if stopped, never if gone.
    /// If `free`, its range is free again once the unmap was sent (or at
    /// once if nothing is sent). The caller holds `ops`.
    fn unmap(&self, node: u32, id: u32, offset: u64, len: u64, free: bool) {
        // A guest's driver zaps its processes' mappings of it (spec §6):
        // from now on a store through them faults instead of reaching
        // whatever the range holds next.
        if let Some(s) = self.shard(node) {
            s.lock().tell_pio_unmapped(node, id);
        }
        let ch = {
            let mut b = lock(&self.books);
            let Some(f) = b.frontends.get_mut(node as usize) else {
                return;
            };
            f.mapped = f.mapped.saturating_sub(1);
            match (&f.channel, f.started) {
                (None, _) => None,
                (Some(_), false) => {
                    // The owed unmap frees the range when it is sent.
                    f.owed.push((offset, len, free));
                    return;
                }
                (Some(ch), true) => Some(ch.clone()),
            }
        };
        if let Some(ch) = ch {
            self.counters.unmaps.fetch_add(2, Ordering::Relaxed);
            frontend::unmap(&ch, offset, len);
        }
        if free {
            self.free_range(node, offset);
        }
    }

    /// Frees the range at `offset` of node `node`'s aperture, or, if an
    /// unmap of it is still owed, once that is sent.
    fn free_range(&self, node: u32, offset: u64) {
        let mut b = lock(&self.books);
        let Some(f) = b.frontends.get_mut(node as usize) else {
            return;
        };
        if let Some(o) = f.owed.iter_mut().find(|o| o.0 == offset) {
            o.2 = true;
        } else if let Some(r) = f.ranges.as_mut() {
            r.free(offset);
        }
    }

    /// Unmaps window `id` of node `node` from every importer and tells
    /// each importing endpoint; it stays mapped in its exporter. The
    /// caller holds `ops`.
    fn revoke_window(&self, node: u32, id: u32) {
        let (file, key, exporter) = {
            let mut b = lock(&self.books);
            let Some(w) = b.windows.get_mut(&(node, id)) else {
                return;
            };
            w.revoked = true;
            (w.file.clone(), w.key, w.owner)
        };
        // Its grant syncs nothing from now on, no tripwire is set on it,
        // and those set on it never fire again (even on a later window
        // that would get its id).
        if let Some(s) = self.shard(node) {
            let mut f = s.lock();
            let n = &mut f.nodes[node as usize];
            n.windows.remove(&id);
            if let Some(ep) = n
                .endpoint_mut(exporter.ep)
                .filter(|e| e.session == exporter.session)
            {
                ep.retire_pio_tripwires(id);
            }
        }
        let importers: Vec<(u32, u32, Owner, u64)> = lock(&self.books)
            .imports
            .iter_mut()
            .filter(|(_, i)| i.window == Some((node, id)))
            .map(|(&(n, imp), i)| {
                i.window = None;
                let was = i.mapped;
                i.mapped = false;
                (n, imp, i.owner, if was { i.offset } else { u64::MAX })
            })
            .collect();
        for (n, imp, owner, offset) in importers {
            if offset != u64::MAX {
                // The range stays the importer's until it releases it.
                self.unmap(n, imp, offset, file.bytes, false);
            }
            let ev = EventRecord {
                kind: event::PIO_REVOKED,
                aux: imp,
                user_id: key,
                node,
                len: file.bytes as u32,
                ..EventRecord::default()
            };
            if let Some(s) = self.shard(n) {
                s.lock().post_event_to(n, owner.ep, owner.session, &ev);
                s.wake();
            }
        }
    }

    /// Revokes window `id` of node `node`, unmaps it from its exporter
    /// and forgets it. The caller holds `ops`.
    fn drop_window(&self, node: u32, id: u32) {
        self.revoke_window(node, id);
        let Some(w) = lock(&self.books).windows.remove(&(node, id)) else {
            return;
        };
        self.unmap(node, id, w.offset, w.file.bytes, true);
    }

    /// Unmaps import `id` of node `node` if still mapped and frees its
    /// range. The caller holds `ops`.
    fn release_import(&self, node: u32, id: u32) {
        let Some(i) = lock(&self.books).imports.remove(&(node, id)) else {
            return;
        };
        debug!("node {node}: import {id} (key {:#x}) released", i.key);
        if i.mapped {
            self.unmap(node, id, i.offset, i.bytes, true);
        } else {
            // Unmapped at its revocation; a stopped frontend may still be
            // owed that unmap (it was sent without freeing: see `unmap`).
            self.free_range(node, i.offset);
        }
    }
}
