//! Buffers the peers know ahead of a call: registered by the caller (NCCL's
//! `ncclCommRegister`, windows of `ncclCommWindowRegister`, memory of `ncclMemAlloc`), or
//! registered by the library itself the first time a call on unregistered buffers wants the
//! direct kernel (a *hint*: the whole allocation that holds the buffer). Each is sent to every
//! peer once, through the peers' registration services; a call on them sends no bootstrap
//! message and waits for nothing on the host, eagerly or under CUDA-graph capture. The direct
//! kernel learns the peers' buffers by itself and every rank decides alike, on the device,
//! whether the call runs there (`mscclpp_device::collectives::direct`, "Registered buffers").
//!
//! # What each rank holds
//!
//! - **Its registrations** (`Local`): up to [`REGISTRY_SLOTS`] ranges of its device memory,
//!   each in a slot with a generation (a counter, never 0, so that a slot reused is told from
//!   its former occupant), and, for each peer, whether it acknowledged the registration. Slots
//!   below [`FIRST_WINDOW_SLOT`] are this rank's own choice (buffers, `mem_alloc` memory,
//!   hints); windows take the lowest free slot above, which is the same on every rank because
//!   windows are registered and deregistered collectively, in the same order (checked).
//! - **The peers' registrations** (`PeerTable`): a device table of [`RegistrySlot`]s,
//!   `[peer][slot]`, that the direct kernel reads, and its host mirror (with the token of each
//!   peer allocation mapped, to give the mapping back when the peer unmaps it).
//!
//! # Messages (one tag, [`REG_TAG`]; every rank's service receives them)
//!
//! `magic "MSRG" | version u8 | op u8 | slot u16 | generation u32 | offset u64 | len u64 |
//!  payload`
//!
//! | op | from | payload | what the receiving service does |
//! |---|---|---|---|
//! | map (1) | the registering rank | the allocation's registration (wire form) | maps the allocation (once: `registered.rs`), checks the range, writes table slot `[sender][slot]` with stream writes on its own stream (waited for), and answers `ack` |
//! | unmap (2) | the registering rank | none | clears the slot the same way and gives the mapping back |
//! | ack (3) | a peer's service | `ok u8`, then why not (utf-8) | records the peer's answer to `(slot, generation)` in `Local` and wakes whoever waits for it |
//! | region (4) | a rank's service or calling thread | the region's registration (`regions.rs`; `slot` is the region's index) | hands it to the scratch regions (`LazyRegions::receive`) |
//! | stop (5) | this rank itself | none | ends the service |
//!
//! A registration is *settled* once every peer answered; it is *ready* when every answer said
//! yes. A call names only ready registrations as usable (`ok = 1` in its descriptor), so no
//! kernel ever names a slot a peer has not written; a call on a registration that is not ready
//! (yet, or ever: a peer refused) says `ok = 0`, and every rank's kernel then declines the call
//! alike, to the algorithm the dispatcher queued behind it (`plan.rs`). Registering a buffer or
//! memory of `mem_alloc` returns at once; registering a window waits (bounded by the set-up
//! deadline) until it is settled, because windows are collective and the copy engines need
//! them on the host. Deregistering returns at once (NCCL's contract: nothing queued uses it).
//!
//! # Hints (no registration by the caller)
//!
//! A direct call on a buffer in no registration registers the allocation that holds it
//! ([`Registry::resolve`]): the first call says `ok = 0` (the peers do not have it yet), the
//! calls after it, once every peer answered, go direct. Under capture the hint is waited for
//! before the launch is captured (the capture replays, the wait does not). A hint is checked on
//! every use: an allocation freed (its base holds no allocation of that id any more) is
//! unmapped and its export forgotten. When the buffer slots are full, hints of freed
//! allocations go first, then the least recently used hint, once the work queued so far has
//! completed (the caller's `drain`); a rank that cannot make room says `ok = 0`.
//!
//! # Threads and shared state
//!
//! The registration service (a thread per `Collectives` of more than one rank,
//! `mscclpp-reg{rank}`) waits on every peer's messages at once
//! (`Bootstrap::recv_any`), whatever the rank's own threads do, in slices of `SERVICE_SLICE`
//! after which it looks at its stop flag and the communicator's health: it sleeps while
//! nothing arrives. Dropping the registry sets the flag (release; read with acquire), sends the
//! service `stop` and joins it.
//!
//! `Local` (a mutex and a condition variable: written by registration calls, by calls that
//! hint, and by the service's acknowledgements; read by every direct call's
//! [`resolve`](Registry::resolve)); the number of the caller's registrations in `Local`
//! (buffers and windows, not hints: an atomic, updated under `Local`'s lock with release,
//! loaded with acquire by every call's [`with_lookup`](Registry::with_lookup), which takes no lock while
//! it is 0: a call of a rank that registered nothing takes only the issue order's lock); the
//! host mirror of the peer table (a mutex; written by the
//! service, read by the copy engines and tools); the device table (written by the service's
//! stream, read by kernels: protocol above).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{BackendKind, DeviceBuffer, LazyStream};
use mscclpp_host::sync::lock;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{BufferRef, DevicePtr, FIRST_WINDOW_SLOT, REGISTRY_SLOTS, RegistrySlot};

use super::regions::{HINT_TARGET, LazyRegions};
use super::registered::RegisteredBuffers;

/// Bootstrap tag of every message of the registration services.
const REG_TAG: u64 = 0x0d1_e700_0000;
const MAGIC: [u8; 4] = *b"MSRG";
const VERSION: u8 = 2;
const OP_MAP: u8 = 1;
const OP_UNMAP: u8 = 2;
const OP_ACK: u8 = 3;
/// A scratch region's registration (`regions.rs`).
pub(crate) const OP_REGION: u8 = 4;
const OP_STOP: u8 = 5;
/// Bytes of a message before its payload.
const HEADER: usize = 4 + 1 + 1 + 2 + 4 + 8 + 8;
/// How long the service waits for a message before it looks at its stop flag and the
/// communicator's health.
const SERVICE_SLICE: Duration = Duration::from_millis(500);
/// The slot of a registration that holds no slot ([`Registration::declined`]).
const NO_SLOT: u32 = u32::MAX;

/// A registered buffer or window of one `Collectives`: what deregistering takes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    slot: u32,
    generation: u32,
    ptr: DevicePtr<u8>,
    len: usize,
}

impl Registration {
    /// The registered range's first byte.
    pub fn ptr(&self) -> DevicePtr<u8> {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: registrations hold at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is a window (registered collectively).
    pub fn is_window(&self) -> bool {
        self.slot != NO_SLOT && self.slot as usize >= FIRST_WINDOW_SLOT
    }

    /// Whether the peers were told of it: `false` for a registration that the library
    /// declined (memory it cannot share, no slot free, a world of several nodes), which changes
    /// nothing (calls on the buffer take the paths of unregistered buffers).
    pub fn is_shared(&self) -> bool {
        self.slot != NO_SLOT
    }

    /// A registration that holds nothing (see [`is_shared`](Self::is_shared)).
    fn declined(ptr: DevicePtr<u8>, len: usize) -> Self {
        Self {
            slot: NO_SLOT,
            generation: 0,
            ptr,
            len,
        }
    }
}

/// What a registration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The caller's buffer (or `mem_alloc` memory).
    Buffer,
    /// A window.
    Window,
    /// A hint: the allocation of id `allocation`, last used at tick `used`.
    Hint { allocation: u64, used: u64 },
}

/// One of this rank's registrations.
struct LocalEntry {
    reg: Registration,
    kind: Kind,
    /// Memory of `mem_alloc`, freed with the registration.
    owned: Option<DeviceBuffer>,
    /// Which ranks answered (this rank counts as answered).
    answered: Vec<bool>,
    /// Ranks that have not answered yet.
    waiting: usize,
    /// The first refusal: who and why.
    refused: Option<(usize, String)>,
}

impl LocalEntry {
    fn state(&self) -> Resolved {
        let at = |offset: u64| BufferRef {
            slot: self.reg.slot,
            generation: self.reg.generation,
            offset,
        };
        match (&self.refused, self.waiting) {
            (Some(_), _) => Resolved::Unusable,
            (None, 0) => Resolved::Ready(at(0)),
            (None, _) => Resolved::Pending,
        }
    }

    fn covers(&self, a: u64, end: u64) -> bool {
        let (b, n) = (self.reg.ptr.addr(), self.reg.len as u64);
        a >= b && end <= b + n
    }
}

/// This rank's registrations.
struct Local {
    entries: Vec<Option<LocalEntry>>,
    next_generation: u32,
    /// Counts hint uses (their last-use order).
    tick: u64,
}

/// A buffer of a direct call as the registrations give it ([`Registry::resolve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// In a registration every peer has: where.
    Ready(BufferRef),
    /// In a registration not every peer has answered yet.
    Pending,
    /// In none that can be used (memory that cannot be shared, no room, a peer refused).
    Unusable,
}

/// A peer's slot as the host mirrors it, with the token of the allocation mapped for it.
type MirrorSlot = (RegistrySlot, u64);

/// The peers' registrations: the device table the direct kernel reads, and its host mirror.
struct PeerTable {
    /// `[rank][slot]` of [`RegistrySlot`] (`nranks * REGISTRY_SLOTS`).
    table: DeviceBuffer,
    /// Written by the service only: each slot and the token of the allocation mapped for it.
    mirror: Mutex<Vec<Vec<Option<MirrorSlot>>>>,
}

/// What the calling threads and the service share.
struct Shared {
    local: Mutex<Local>,
    /// How many of `local`'s entries are the caller's (module docs).
    callers: AtomicUsize,
    /// Notified when an answer arrives.
    answered: Condvar,
    peers: PeerTable,
}

/// This rank's registrations and the peers' (module docs).
pub(crate) struct Registry {
    comm: Arc<Communicator>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    service: Option<JoinHandle<()>>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.service.take() {
            let me = self.comm.rank();
            let msg = message(OP_STOP, NO_SLOT, 0, 0, 0, &[]);
            // Without it the service still stops at its next slice.
            let _ = self.comm.bootstrap().send(me, REG_TAG, &msg);
            let _ = t.join();
        }
    }
}

/// A message (module docs).
fn message(op: u8, slot: u32, generation: u32, offset: u64, len: u64, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER + payload.len());
    m.extend_from_slice(&MAGIC);
    m.extend_from_slice(&[VERSION, op]);
    m.extend_from_slice(&(slot as u16).to_le_bytes());
    m.extend_from_slice(&generation.to_le_bytes());
    m.extend_from_slice(&offset.to_le_bytes());
    m.extend_from_slice(&len.to_le_bytes());
    m.extend_from_slice(payload);
    m
}

/// A message's fields: `(op, slot, generation, offset, len, payload)`.
type Fields<'a> = (u8, usize, u32, u64, u64, &'a [u8]);

/// Reads a message (module docs), or why it is not one.
fn fields(msg: &[u8]) -> std::result::Result<Fields<'_>, String> {
    if msg.len() < HEADER || msg[..4] != MAGIC || msg[4] != VERSION {
        return Err(format!(
            "a message of {} bytes that is not a registration service's of this version",
            msg.len()
        ));
    }
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&msg[i..i + 8]);
        u64::from_le_bytes(b)
    };
    Ok((
        msg[5],
        u16::from_le_bytes([msg[6], msg[7]]) as usize,
        u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]),
        word(12),
        word(20),
        &msg[HEADER..],
    ))
}

impl Registry {
    /// The registry of `comm`'s collectives, its service started; `buffers` are the export
    /// and mapping caches, `regions` the scratch regions whose registrations it receives.
    pub fn new(
        comm: &Arc<Communicator>,
        buffers: &Arc<RegisteredBuffers>,
        regions: &Arc<LazyRegions>,
    ) -> Result<Self> {
        let n = comm.size();
        let g = comm.gpu();
        let table = g.alloc((n * REGISTRY_SLOTS * std::mem::size_of::<RegistrySlot>()).max(16))?;
        let shared = Arc::new(Shared {
            local: Mutex::new(Local {
                entries: (0..REGISTRY_SLOTS).map(|_| None).collect(),
                next_generation: 1,
                tick: 0,
            }),
            callers: AtomicUsize::new(0),
            answered: Condvar::new(),
            peers: PeerTable {
                table,
                mirror: Mutex::new(vec![vec![None; REGISTRY_SLOTS]; n]),
            },
        });
        let stop = Arc::new(AtomicBool::new(false));
        let service = if n > 1 {
            // Made at the first message that needs it (`LazyStream`).
            let stream = LazyStream::new(g);
            let s = Service {
                comm: comm.clone(),
                buffers: buffers.clone(),
                regions: regions.clone(),
                shared: shared.clone(),
                stop: stop.clone(),
                stream,
            };
            Some(
                std::thread::Builder::new()
                    .name(format!("mscclpp-reg{}", comm.rank()))
                    .spawn(move || s.serve())
                    .map_err(|source| Error::RegistrationServiceStart { source })?,
            )
        } else {
            None
        };
        Ok(Self {
            comm: comm.clone(),
            shared,
            stop,
            service,
        })
    }

    /// The device table of the peers' registrations (`DirectCollectiveParams::registry`).
    pub fn table(&self) -> DevicePtr<RegistrySlot> {
        self.shared.peers.table.ptr().cast()
    }

    /// `(this rank's registrations by the caller; the peers' registrations mapped here, hints
    /// included)`.
    pub fn counts(&self) -> (usize, usize) {
        let mine = lock(&self.shared.local)
            .entries
            .iter()
            .flatten()
            .filter(|e| !matches!(e.kind, Kind::Hint { .. }))
            .count();
        let theirs = lock(&self.shared.peers.mirror)
            .iter()
            .map(|r| r.iter().flatten().count())
            .sum();
        (mine, theirs)
    }

    /// Whether every peer answered every registration of this rank (hints included).
    pub fn settled(&self) -> bool {
        lock(&self.shared.local)
            .entries
            .iter()
            .flatten()
            .all(|e| e.waiting == 0)
    }

    /// `(hints, of which ready)` of this rank.
    pub fn hints(&self) -> (usize, usize) {
        let l = lock(&self.shared.local);
        let hints = l
            .entries
            .iter()
            .flatten()
            .filter(|e| matches!(e.kind, Kind::Hint { .. }));
        hints.fold((0, 0), |(n, r), e| {
            (n + 1, r + matches!(e.state(), Resolved::Ready(_)) as usize)
        })
    }

    /// Runs `f` with a lookup function, which says where `[ptr, ptr + len)` lies in one of
    /// this rank's registrations by the caller (not hints), if it lies in one, and whether
    /// that one is a window: every buffer `f` looks up under one lock (none while the rank
    /// registered nothing: module docs).
    pub fn with_lookup<T>(&self, f: impl FnOnce(&dyn Fn(DevicePtr<u8>, usize) -> Found) -> T) -> T {
        if self.shared.callers.load(Ordering::Acquire) == 0 {
            return f(&|_, _| None);
        }
        let l = lock(&self.shared.local);
        f(&|ptr, len| find_in(&l, ptr, len))
    }
}

/// What [`Registry::with_lookup`]'s function finds: where a buffer lies in a caller's
/// registration, and whether that one is a window.
pub(crate) type Found = Option<(BufferRef, bool)>;

/// [`Registry::with_lookup`]'s lookup in `l`.
fn find_in(l: &Local, ptr: DevicePtr<u8>, len: usize) -> Found {
    let (a, end) = (ptr.addr(), ptr.addr().checked_add(len as u64)?);
    l.entries.iter().flatten().find_map(|e| {
        if matches!(e.kind, Kind::Hint { .. }) {
            return None;
        }
        e.covers(a, end).then(|| {
            (
                BufferRef {
                    slot: e.reg.slot,
                    generation: e.reg.generation,
                    offset: a - e.reg.ptr.addr(),
                },
                e.kind == Kind::Window,
            )
        })
    })
}

impl Registry {
    /// Peer `q`'s window in window slot `slot` as mapped here: `(base, len)` (the copy
    /// engines need the peers' addresses on the host). Windows come and go collectively, so
    /// the peer's window in a slot is the one this rank registered in the same call.
    pub fn peer_window(&self, q: usize, slot: u32) -> Option<(DevicePtr<u8>, usize)> {
        if (slot as usize) < FIRST_WINDOW_SLOT {
            return None;
        }
        let m = lock(&self.shared.peers.mirror);
        let (s, _) = m.get(q)?.get(slot as usize)?.as_ref()?;
        Some((s.base, s.len as usize))
    }

    /// Registers `[ptr, ptr + len)` with every peer (module docs): in a free slot below
    /// [`FIRST_WINDOW_SLOT`], returning at once (a registration this rank cannot share, or for
    /// which no slot is free, is declined: [`Registration::is_shared`]); or, for a window, in
    /// `window_slot`, waiting until every peer answered. `owned` (memory of `mem_alloc`, which
    /// must get a slot) is freed with the registration.
    pub fn register(
        &self,
        buffers: &RegisteredBuffers,
        ptr: DevicePtr<u8>,
        len: usize,
        window_slot: Option<usize>,
        owned: Option<DeviceBuffer>,
    ) -> Result<Registration> {
        let comm = &*self.comm;
        let must = window_slot.is_some() || owned.is_some();
        let export = match buffers.export(comm, ptr, len) {
            Ok(x) => x,
            Err(e) if !must => {
                tracing::debug!(error = %e, "registration declined: calls on it stage");
                return Ok(Registration::declined(ptr, len));
            }
            Err(e) => return Err(e),
        };
        let kind = if window_slot.is_some() {
            Kind::Window
        } else {
            Kind::Buffer
        };
        let reg = {
            let mut l = lock(&self.shared.local);
            let slot = match window_slot {
                Some(s) => Some(s),
                None => self.free_buffer_slot(&mut l, buffers),
            };
            let Some(slot) = slot else {
                if must {
                    return Err(Error::RegistryFull {
                        slots: FIRST_WINDOW_SLOT,
                        what: "buffers",
                    });
                }
                tracing::debug!("registration declined: every buffer slot is taken");
                return Ok(Registration::declined(ptr, len));
            };
            self.insert(&mut l, slot, ptr, len, kind, owned)
        };
        self.send_map(&reg, export.offset, &export.wire)?;
        if window_slot.is_some() {
            self.wait_settled(&reg, comm.bootstrap().op_timeout())?;
        }
        Ok(reg)
    }

    /// Takes `reg` back from every peer and forgets it; returns the memory `mem_alloc` gave
    /// it, if any (the caller drops it after this returns). Does not wait for the peers.
    pub fn deregister(&self, reg: Registration) -> Result<Option<DeviceBuffer>> {
        if !reg.is_shared() {
            return Ok(None);
        }
        let entry = {
            let mut l = lock(&self.shared.local);
            let known = l
                .entries
                .get(reg.slot as usize)
                .and_then(Option::as_ref)
                .is_some_and(|e| e.reg == reg && !matches!(e.kind, Kind::Hint { .. }));
            if !known {
                return Err(Error::UnknownRegistration {
                    slot: reg.slot as usize,
                    generation: reg.generation,
                });
            }
            let e = l.entries[reg.slot as usize].take();
            self.shared.callers.fetch_sub(1, Ordering::Release);
            e
        };
        self.send_unmap(&reg)?;
        Ok(entry.and_then(|e| e.owned))
    }

    /// The lowest free window slot (the same on every rank: windows come and go collectively).
    pub fn free_window_slot(&self) -> Result<usize> {
        lock(&self.shared.local).entries[FIRST_WINDOW_SLOT..]
            .iter()
            .position(Option::is_none)
            .map(|i| FIRST_WINDOW_SLOT + i)
            .ok_or(Error::RegistryFull {
                slots: REGISTRY_SLOTS - FIRST_WINDOW_SLOT,
                what: "windows",
            })
    }

    /// The registration by the caller that `ptr` starts, if this rank holds one.
    pub fn starting_at(&self, ptr: DevicePtr<u8>) -> Option<Registration> {
        lock(&self.shared.local)
            .entries
            .iter()
            .flatten()
            .find(|e| e.reg.ptr == ptr && !matches!(e.kind, Kind::Hint { .. }))
            .map(|e| e.reg)
    }

    /// Where `[ptr, ptr + len)` lies in a registration every peer has (module docs): in one
    /// by the caller, else in a hint, made now if there is none (the allocation that holds the
    /// buffer, sent to the peers without waiting for them). `settle`: wait (bounded) until the
    /// registration is settled (under capture); `drain`: waits until the work this rank
    /// queued so far has completed (before a hint in use is given up for room).
    pub fn resolve(
        &self,
        buffers: &RegisteredBuffers,
        ptr: DevicePtr<u8>,
        len: usize,
        settle: Option<Duration>,
        drain: &dyn Fn() -> Result<()>,
    ) -> Resolved {
        match self.try_resolve(buffers, ptr, len, settle, drain) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "buffer not shared with the peers; calls stage it");
                Resolved::Unusable
            }
        }
    }

    fn try_resolve(
        &self,
        buffers: &RegisteredBuffers,
        ptr: DevicePtr<u8>,
        len: usize,
        settle: Option<Duration>,
        drain: &dyn Fn() -> Result<()>,
    ) -> Result<Resolved> {
        let (a, end) = (ptr.addr(), ptr.addr().saturating_add(len as u64));
        let comm = &*self.comm;
        let mut stale = None;
        let found = {
            let mut l = lock(&self.shared.local);
            l.tick += 1;
            let tick = l.tick;
            // The caller's registrations first, then the hints.
            let mut hit = None;
            for (i, e) in l.entries.iter().enumerate() {
                if let Some(e) = e
                    && e.covers(a, end)
                    && (hit.is_none() || !matches!(e.kind, Kind::Hint { .. }))
                {
                    hit = Some(i);
                }
            }
            match hit.and_then(|i| l.entries[i].as_mut()) {
                Some(e) => {
                    if let Kind::Hint { allocation, used } = &mut e.kind {
                        // A hint is for one allocation: gone (freed, its address reused), it
                        // is given up and a new one made.
                        let live = comm.gpu().allocation_of(ptr).ok();
                        if live.is_some_and(|x| x.id == *allocation) {
                            *used = tick;
                            Some((e.reg, e.state()))
                        } else {
                            stale = Some((e.reg, *allocation));
                            None
                        }
                    } else {
                        Some((e.reg, e.state()))
                    }
                }
                None => None,
            }
        };
        if let Some((old, allocation)) = stale {
            self.forget_hint(buffers, old, allocation)?;
        }
        let (reg, state) = match found {
            Some(x) => x,
            None => match self.hint(buffers, ptr, len, drain)? {
                Some(x) => x,
                None => return Ok(Resolved::Unusable),
            },
        };
        let state = match (state, settle) {
            (Resolved::Pending, Some(t)) => {
                self.wait_settled(&reg, t)?;
                self.state_of(&reg)
            }
            (s, _) => s,
        };
        Ok(match state {
            Resolved::Ready(r) => Resolved::Ready(BufferRef {
                offset: a - reg.ptr.addr(),
                ..r
            }),
            s => s,
        })
    }

    /// Makes a hint for the allocation that holds `[ptr, ptr + len)` (module docs): `None`
    /// when no slot can be made free.
    fn hint(
        &self,
        buffers: &RegisteredBuffers,
        ptr: DevicePtr<u8>,
        len: usize,
        drain: &dyn Fn() -> Result<()>,
    ) -> Result<Option<(Registration, Resolved)>> {
        let export = buffers.export(&self.comm, ptr, len)?;
        let a = export.allocation;
        let kind = |used| Kind::Hint {
            allocation: a.id,
            used,
        };
        let mut l = lock(&self.shared.local);
        let slot = match self.free_buffer_slot(&mut l, buffers) {
            Some(s) => s,
            None => {
                // The least recently used hint, once nothing queued can still name it.
                let lru = l
                    .entries
                    .iter()
                    .flatten()
                    .filter_map(|e| match e.kind {
                        Kind::Hint { used, allocation } => Some((used, e.reg, allocation)),
                        _ => None,
                    })
                    .min_by_key(|x| x.0);
                let Some((_, old, allocation)) = lru else {
                    return Ok(None);
                };
                drop(l);
                drain()?;
                self.forget_hint(buffers, old, allocation)?;
                l = lock(&self.shared.local);
                match self.free_buffer_slot(&mut l, buffers) {
                    Some(s) => s,
                    None => return Ok(None),
                }
            }
        };
        let tick = l.tick;
        let reg = self.insert(&mut l, slot, a.base, a.size, kind(tick), None);
        let state = l.entries[slot]
            .as_ref()
            .map_or(Resolved::Unusable, LocalEntry::state);
        drop(l);
        self.send_map(&reg, 0, &export.wire)?;
        tracing::debug!(
            target: HINT_TARGET,
            rank = self.comm.rank(),
            slot,
            bytes = a.size,
            "an allocation sent to the peers (a hint)"
        );
        Ok(Some((reg, state)))
    }

    /// Gives up hint `reg` of allocation `allocation`: the peers unmap it, its export is
    /// forgotten.
    fn forget_hint(
        &self,
        buffers: &RegisteredBuffers,
        reg: Registration,
        allocation: u64,
    ) -> Result<()> {
        {
            let mut l = lock(&self.shared.local);
            let slot = &mut l.entries[reg.slot as usize];
            if slot.as_ref().is_some_and(|e| e.reg == reg) {
                *slot = None;
            }
        }
        // (A registration by the caller in the same allocation keeps its peers' mappings:
        // the export only makes new ones.)
        buffers.forget(allocation);
        self.send_unmap(&reg)
    }

    /// A free slot below [`FIRST_WINDOW_SLOT`], making one by giving up hints of allocations
    /// that are gone when none is free.
    fn free_buffer_slot(&self, l: &mut Local, buffers: &RegisteredBuffers) -> Option<usize> {
        if let Some(s) = l.entries[..FIRST_WINDOW_SLOT]
            .iter()
            .position(Option::is_none)
        {
            return Some(s);
        }
        let g = self.comm.gpu();
        let mut freed = None;
        for slot in l.entries[..FIRST_WINDOW_SLOT].iter_mut() {
            if let Some(LocalEntry {
                kind: Kind::Hint { allocation, .. },
                reg,
                ..
            }) = slot
                && !g.allocation_of(reg.ptr).is_ok_and(|x| x.id == *allocation)
            {
                let (reg, allocation) = (*reg, *allocation);
                *slot = None;
                buffers.forget(allocation);
                // Best effort: a peer that misses it keeps a mapping until it drops.
                let _ = self.send_unmap(&reg);
                freed = freed.or(Some(reg.slot as usize));
            }
        }
        freed
    }

    /// Enters a new registration in `slot` (answered by no peer yet).
    fn insert(
        &self,
        l: &mut Local,
        slot: usize,
        ptr: DevicePtr<u8>,
        len: usize,
        kind: Kind,
        owned: Option<DeviceBuffer>,
    ) -> Registration {
        let generation = l.next_generation;
        l.next_generation = l.next_generation.wrapping_add(1).max(1);
        let reg = Registration {
            slot: slot as u32,
            generation,
            ptr,
            len,
        };
        let (n, me) = (self.comm.size(), self.comm.rank());
        let caller = |k: &Kind| !matches!(k, Kind::Hint { .. });
        if l.entries[slot].as_ref().is_some_and(|e| caller(&e.kind)) {
            self.shared.callers.fetch_sub(1, Ordering::Release);
        }
        if caller(&kind) {
            self.shared.callers.fetch_add(1, Ordering::Release);
        }
        l.entries[slot] = Some(LocalEntry {
            reg,
            kind,
            owned,
            answered: (0..n).map(|q| q == me).collect(),
            waiting: n - 1,
            refused: None,
        });
        reg
    }

    /// Sends every peer `map` for `reg` (`offset` and `wire`: where it lies in its
    /// allocation, and the allocation's registration).
    fn send_map(&self, reg: &Registration, offset: u64, wire: &[u8]) -> Result<()> {
        let msg = message(
            OP_MAP,
            reg.slot,
            reg.generation,
            offset,
            reg.len as u64,
            wire,
        );
        self.to_peers(&msg)
    }

    /// Sends every peer `unmap` for `reg`.
    /// Tells every peer to unmap `reg`. A peer whose bootstrap connection has closed (it
    /// destroyed its communicator first, as ranks tearing down in any order do) maps nothing
    /// any more: it is skipped, not an error of this deregistration. Every peer is told
    /// whatever one of them answers; the first other failure is returned.
    fn send_unmap(&self, reg: &Registration) -> Result<()> {
        let msg = message(OP_UNMAP, reg.slot, reg.generation, 0, 0, &[]);
        let (n, me) = (self.comm.size(), self.comm.rank());
        let mut first = None;
        for q in (0..n).filter(|&q| q != me) {
            match self.comm.bootstrap().send(q, REG_TAG, &msg) {
                Ok(()) => {}
                Err(Error::BootstrapPeerClosed { .. }) => {
                    tracing::debug!(rank = me, peer = q, "an unmap for a peer that has left");
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn to_peers(&self, msg: &[u8]) -> Result<()> {
        let (n, me) = (self.comm.size(), self.comm.rank());
        for q in (0..n).filter(|&q| q != me) {
            self.comm.bootstrap().send(q, REG_TAG, msg)?;
        }
        Ok(())
    }

    /// `reg`'s state now (`Unusable` once it is gone).
    fn state_of(&self, reg: &Registration) -> Resolved {
        lock(&self.shared.local)
            .entries
            .get(reg.slot as usize)
            .and_then(Option::as_ref)
            .filter(|e| e.reg == *reg)
            .map_or(Resolved::Unusable, LocalEntry::state)
    }

    /// Waits until every peer answered `reg`, at most `timeout`, or the communicator failed;
    /// a refusal is [`Error::RegistrationRefused`].
    fn wait_settled(&self, reg: &Registration, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut l = lock(&self.shared.local);
        loop {
            let e = l
                .entries
                .get(reg.slot as usize)
                .and_then(Option::as_ref)
                .filter(|e| e.reg == *reg);
            match e {
                None => {
                    return Err(Error::UnknownRegistration {
                        slot: reg.slot as usize,
                        generation: reg.generation,
                    });
                }
                Some(LocalEntry {
                    refused: Some((rank, reason)),
                    ..
                }) => {
                    return Err(Error::RegistrationRefused {
                        rank: *rank,
                        slot: reg.slot as usize,
                        reason: reason.clone(),
                    });
                }
                Some(e) if e.waiting == 0 => return Ok(()),
                Some(_) => {}
            }
            if let Some(e) = self.comm.failure() {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Aborted {
                    reason: format!(
                        "registration in slot {} not answered by every peer within {timeout:?}",
                        reg.slot
                    ),
                });
            }
            let slice = left.min(Duration::from_millis(20));
            l = self
                .shared
                .answered
                .wait_timeout(l, slice)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// The registration service (module docs).
struct Service {
    comm: Arc<Communicator>,
    buffers: Arc<RegisteredBuffers>,
    regions: Arc<LazyRegions>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    stream: LazyStream,
}

impl Service {
    /// Serves until `stop`, a `stop` message or a failed communicator.
    fn serve(self) {
        // Map and write as outside any capture, whatever another thread of this process captures.
        let _relaxed = (self.comm.gpu().kind() == BackendKind::Cuda)
            .then(mscclpp_host::gpu::cuda::RelaxedCapture::new)
            .and_then(|r| r.ok());
        if let Err(e) = self.comm.gpu().bind_to_thread() {
            tracing::warn!(error = %e, "registration service: no device; not serving");
            return;
        }
        let everyone: Vec<usize> = (0..self.comm.size()).collect();
        while !self.stop.load(Ordering::Acquire) {
            match self
                .comm
                .bootstrap()
                .recv_any(&everyone, REG_TAG, SERVICE_SLICE)
            {
                Ok((q, msg)) => {
                    if !self.handle(q, &msg) {
                        break;
                    }
                }
                Err(Error::BootstrapTimeout { .. }) => {
                    if self.comm.status().is_aborted() {
                        self.regions.release();
                    }
                }
                Err(e) => {
                    if !self.stop.load(Ordering::Acquire) {
                        tracing::debug!(error = %e, "registration service stops");
                    }
                    break;
                }
            }
        }
        // Nothing will write the regions' tables any more: nothing may wait for them.
        self.regions.release();
    }

    /// One message from rank `q`; `false` to stop.
    fn handle(&self, q: usize, msg: &[u8]) -> bool {
        let (op, slot, generation, offset, len, payload) = match fields(msg) {
            Ok(f) => f,
            Err(why) => {
                tracing::warn!(from = q, "registration service: {why}");
                return true;
            }
        };
        let me = self.comm.rank();
        match op {
            OP_STOP if q == me => false,
            OP_MAP | OP_UNMAP => {
                let result = self.map(q, op, slot, generation, offset, len, payload);
                let mut body = vec![result.is_ok() as u8];
                if let Err(why) = result {
                    body.extend_from_slice(why.as_bytes());
                }
                if op == OP_MAP {
                    let ack = message(OP_ACK, slot as u32, generation, 0, 0, &body);
                    return self.comm.bootstrap().send(q, REG_TAG, &ack).is_ok();
                }
                true
            }
            OP_ACK => {
                self.answer(q, slot, generation, payload);
                true
            }
            OP_REGION => {
                let received = self
                    .stream
                    .get()
                    .and_then(|st| self.regions.receive(q, slot, payload, st));
                if let Err(e) = received {
                    tracing::warn!(from = q, error = %e, "registration service: a scratch region");
                }
                true
            }
            _ => {
                tracing::warn!(from = q, op, "registration service: unknown operation");
                true
            }
        }
    }

    /// Peer `q`'s answer to this rank's registration `(slot, generation)`.
    fn answer(&self, q: usize, slot: usize, generation: u32, payload: &[u8]) {
        let mut l = lock(&self.shared.local);
        let Some(e) = l
            .entries
            .get_mut(slot)
            .and_then(Option::as_mut)
            .filter(|e| e.reg.generation == generation)
        else {
            // Deregistered meanwhile.
            return;
        };
        if let Some(seen) = e.answered.get_mut(q)
            && !*seen
        {
            *seen = true;
            e.waiting -= 1;
        }
        if payload.first() != Some(&1) && e.refused.is_none() {
            let why = String::from_utf8_lossy(payload.get(1..).unwrap_or_default()).into_owned();
            e.refused = Some((q, why));
        }
        drop(l);
        self.shared.answered.notify_all();
    }

    /// Maps (or unmaps) peer `q`'s registration in its slot of the device table.
    #[allow(clippy::too_many_arguments)]
    fn map(
        &self,
        q: usize,
        op: u8,
        slot: usize,
        generation: u32,
        offset: u64,
        len: u64,
        wire: &[u8],
    ) -> std::result::Result<(), String> {
        if slot >= REGISTRY_SLOTS || generation == 0 {
            return Err(format!("slot {slot} generation {generation}"));
        }
        let (entry, token) = if op == OP_MAP {
            let (m, token) = self
                .buffers
                .map(&self.comm, q, wire)
                .map_err(|e| e.to_string())?;
            match m.range(offset, len) {
                Ok(base) if base.addr() != 0 && len > 0 => (
                    RegistrySlot {
                        base,
                        len,
                        generation,
                        ..Default::default()
                    },
                    Some(token),
                ),
                Ok(_) => {
                    self.buffers.unmap(q, token);
                    return Err("an empty range".into());
                }
                Err(e) => {
                    self.buffers.unmap(q, token);
                    return Err(e.to_string());
                }
            }
        } else {
            (RegistrySlot::default(), None)
        };
        let written = self.write_slot(q, slot, entry);
        let old = {
            let mut mirror = lock(&self.shared.peers.mirror);
            let cell = &mut mirror[q][slot];
            let old = cell.take();
            if written.is_ok() {
                *cell = token.map(|t| (entry, t));
            }
            old
        };
        // The mapping this slot held (a registration replaced or unmapped), given back.
        if let Some((_, t)) = old {
            self.buffers.unmap(q, t);
        }
        if written.is_err()
            && let Some(t) = token
        {
            self.buffers.unmap(q, t);
        }
        written
    }

    /// Writes table slot `[q][slot]` with stream writes on the service's stream, waited for.
    fn write_slot(
        &self,
        q: usize,
        slot: usize,
        entry: RegistrySlot,
    ) -> std::result::Result<(), String> {
        let at = (q * REGISTRY_SLOTS + slot) * std::mem::size_of::<RegistrySlot>();
        let words: [u64; 4] = bytemuck::cast(entry);
        let dst = self
            .shared
            .peers
            .table
            .ptr()
            .byte_add_cast::<u64>(at as u64);
        let stream = self.stream.get().map_err(|e| e.to_string())?;
        for (i, w) in words.iter().enumerate() {
            // SAFETY: slot `(q, slot)` of our own table (`q < nranks`, `slot < REGISTRY_SLOTS`),
            // four aligned words, alive as long as `shared`.
            unsafe { stream.write_value_u64(dst.byte_add_cast(8 * i as u64), *w) }
                .map_err(|e| e.to_string())?;
        }
        match stream.synchronize_timeout(self.comm.bootstrap().op_timeout()) {
            Ok(true) => Ok(()),
            Ok(false) => Err("the table write did not complete".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Sends rank `q`'s registration service a message of op [`OP_REGION`] (`regions.rs`):
/// region `index`'s registration `wire` (the regions' [`SendRegion`](super::regions::SendRegion),
/// given them at set-up).
pub(crate) fn send_region(comm: &Communicator, q: usize, index: usize, wire: &[u8]) -> Result<()> {
    let msg = message(OP_REGION, index as u32, 1, 0, 0, wire);
    comm.bootstrap().send(q, REG_TAG, &msg)
}
