//! Buffers registered ahead (NCCL's `ncclCommRegister`, windows of `ncclCommWindowRegister`,
//! memory of `ncclMemAlloc`): each exchanged with every peer once, at registration, so that a
//! call on them sends no bootstrap message and waits for nothing on the host, eagerly or under
//! CUDA-graph capture. The direct kernel learns the peers' buffers by itself
//! (`mscclpp_device::collectives::direct`, "Registered buffers").
//!
//! # What each rank holds
//!
//! - **Its registrations** (`Local`): up to [`REGISTRY_SLOTS`] ranges of its device memory,
//!   each in a slot with a generation (a counter, never 0, so that a slot reused is told from
//!   its former occupant). Slots below [`FIRST_WINDOW_SLOT`] are this rank's own choice
//!   ([`Collectives::register_buffer`](super::Collectives::register_buffer),
//!   [`Collectives::mem_alloc`](super::Collectives::mem_alloc)); windows take the lowest free
//!   slot above, which is the same on every rank because windows are registered and
//!   deregistered collectively, in the same order (checked).
//! - **The peers' registrations** (`PeerTable`): a device table of [`RegistrySlot`]s,
//!   `[peer][slot]`, that the direct kernel reads, and its host mirror.
//!
//! # Registering (one-sided, once)
//!
//! The registering rank exports the range's allocation (cached per allocation by
//! `registered.rs`, which the per-call exchange shares) and sends every peer, under the tag
//! `REG_TAG`:
//!
//! `magic "MSRG" | version u8 | op u8 (1 map, 2 unmap) | slot u16 | generation u32 |
//!  offset u64 | len u64 | the allocation's registration (map only)`
//!
//! Each peer's **registration service** (a thread per `Collectives`, `mscclpp-reg{rank}`)
//! receives it, whatever its own thread is doing: it maps the allocation (once per allocation,
//! the same cache as the per-call exchange), checks the range, writes the table slot with
//! stream writes on its own stream (`write_value_u64`, waited for), and answers under
//! `ACK_TAG`:
//!
//! `magic "MSRA" | version u8 | op u8 | slot u16 | generation u32 | ok u8 | reason (utf-8)`
//!
//! The registering rank waits for every peer's answer (a bounded host wait, once per
//! registration, on the peers' service threads, not on their programs) and only then records
//! the registration, so no kernel names a slot a peer has not written. A peer that refuses
//! makes the registration fail ([`Error::RegistrationRefused`]); the peers that accepted it
//! are told to unmap it again. Unmapping clears the slot the same way; the peer's mapping of
//! the allocation stays cached (as the per-call exchange's) until the `Collectives` is
//! dropped. Registrations and deregistrations of one rank are serialized (a mutex), so
//! answers are matched by `(op, slot, generation)`.
//!
//! The service polls the peers in turn, each for at most `SERVICE_SLICE`, and stops when the
//! `Collectives` is dropped (a flag, release/acquire; joined) or its communicator fails.
//!
//! # On a call
//!
//! A call is **registered** when every buffer its peers access lies in one of this rank's
//! registrations (all-reduce: input and output; all-gather, broadcast, all-to-all: the output;
//! reduce-scatter: the input; never a reduce to a root, whose non-roots may pass no output, nor
//! a point-to-point call, which the p2p engine moves through the scratch). NCCL's rule holds here too: every rank
//! passes registered buffers, or none does (a rank whose buffers are registered takes the
//! registered path without asking the others: a mismatch leaves the other side waiting in its
//! exchange until the deadline, and the kernel of this side gives up at its spin limit; both
//! fail, typed, and nothing is written). The direct kernel takes registered calls; the copy
//! engines take those whose outputs are windows (all-gather, broadcast), copying
//! into the peers' windows at this rank's offset (NCCL's symmetric rule; the length is
//! checked against the window, so nothing lands outside it). Registered calls never decline:
//! a rank whose buffers
//! do not suit the direct kernel (misaligned, overlapping the wrong way) says so in its
//! descriptor and every rank's kernel refuses the launch
//! ([`RegisteredRefusal`](mscclpp_shared::RegisteredRefusal)), recorded as
//! the communicator's error.
//!
//! Shared state: `Local` (a mutex; written by registration calls, read by every call's
//! lookup), the host mirror of the peer table (a mutex; written by the service, read by
//! tools), the device table (written by the service's stream, read by kernels: protocol
//! above), the operation lock (a mutex held through a registration's messages).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{BackendKind, DeviceBuffer, LazyStream};
use mscclpp_host::{Error, Result};
use mscclpp_shared::{BufferRef, DevicePtr, FIRST_WINDOW_SLOT, REGISTRY_SLOTS, RegistrySlot};

use super::registered::RegisteredBuffers;

/// Bootstrap tag of registration requests.
const REG_TAG: u64 = 0x0d1_e700_0000;
/// Bootstrap tag of their answers.
const ACK_TAG: u64 = 0x0d1_e700_0001;
const REG_MAGIC: [u8; 4] = *b"MSRG";
const ACK_MAGIC: [u8; 4] = *b"MSRA";
const VERSION: u8 = 1;
const OP_MAP: u8 = 1;
const OP_UNMAP: u8 = 2;
/// Bytes of a request before the registration's wire form.
const REG_HEADER: usize = 4 + 1 + 1 + 2 + 4 + 8 + 8;
/// Bytes of an answer before its reason.
const ACK_HEADER: usize = 4 + 1 + 1 + 2 + 4 + 1;
/// How long the service waits on one peer before looking at the next.
const SERVICE_SLICE: Duration = Duration::from_millis(5);

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
        self.slot as usize >= FIRST_WINDOW_SLOT
    }
}

/// One of this rank's registrations.
struct LocalEntry {
    reg: Registration,
    /// Memory of `mem_alloc`, freed with the registration.
    owned: Option<DeviceBuffer>,
}

/// The peers' registrations: the device table the direct kernel reads, and its host mirror.
pub(crate) struct PeerTable {
    /// `[rank][slot]` of [`RegistrySlot`] (`nranks * REGISTRY_SLOTS`).
    table: DeviceBuffer,
    /// Written by the service only.
    mirror: Mutex<Vec<Vec<Option<RegistrySlot>>>>,
}

/// This rank's registrations and the peers' (module docs).
pub(crate) struct Registry {
    local: Mutex<Vec<Option<LocalEntry>>>,
    next_generation: Mutex<u32>,
    /// Held through a registration's messages and answers.
    ops: Mutex<()>,
    peers: Arc<PeerTable>,
    stop: Arc<AtomicBool>,
    service: Option<JoinHandle<()>>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.service.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Registry {
    /// The registry of `comm`'s collectives, its service started; `buffers` are the caches
    /// shared with the per-call exchange.
    pub fn new(comm: &Arc<Communicator>, buffers: &Arc<RegisteredBuffers>) -> Result<Self> {
        let n = comm.size();
        let g = comm.gpu();
        let table = g.alloc((n * REGISTRY_SLOTS * std::mem::size_of::<RegistrySlot>()).max(16))?;
        let peers = Arc::new(PeerTable {
            table,
            mirror: Mutex::new(vec![vec![None; REGISTRY_SLOTS]; n]),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let service = if n > 1 {
            // Made at the first registration it serves (`LazyStream`).
            let stream = LazyStream::new(g);
            let (comm, buffers, peers, stop) =
                (comm.clone(), buffers.clone(), peers.clone(), stop.clone());
            let rank = comm.rank();
            Some(
                std::thread::Builder::new()
                    .name(format!("mscclpp-reg{rank}"))
                    .spawn(move || serve(&comm, &buffers, &peers, &stream, &stop))
                    .map_err(|source| Error::RegistrationServiceStart { source })?,
            )
        } else {
            None
        };
        Ok(Self {
            local: Mutex::new((0..REGISTRY_SLOTS).map(|_| None).collect()),
            next_generation: Mutex::new(1),
            ops: Mutex::new(()),
            peers,
            stop,
            service,
        })
    }

    /// The device table of the peers' registrations (`DirectCollectiveParams::registry`).
    pub fn table(&self) -> DevicePtr<RegistrySlot> {
        self.peers.table.ptr().cast()
    }

    /// `(this rank's registrations, the peers' registrations mapped here)`.
    pub fn counts(&self) -> (usize, usize) {
        let mine = lock(&self.local).iter().flatten().count();
        let theirs = lock(&self.peers.mirror)
            .iter()
            .map(|r| r.iter().flatten().count())
            .sum();
        (mine, theirs)
    }

    /// Where `[ptr, ptr + len)` lies in this rank's registrations, if it lies in one (and
    /// whether that one is a window).
    pub fn lookup(&self, ptr: DevicePtr<u8>, len: usize) -> Option<(BufferRef, bool)> {
        let (a, end) = (ptr.addr(), ptr.addr().checked_add(len as u64)?);
        lock(&self.local).iter().flatten().find_map(|e| {
            let (b, n) = (e.reg.ptr.addr(), e.reg.len as u64);
            (a >= b && end <= b + n).then(|| {
                (
                    BufferRef {
                        slot: e.reg.slot,
                        generation: e.reg.generation,
                        offset: a - b,
                    },
                    e.reg.is_window(),
                )
            })
        })
    }

    /// Peer `q`'s window in window slot `slot` as mapped here: `(base, len)` (the copy
    /// engines need the peers' addresses on the host). Windows come and go collectively, so
    /// the peer's window in a slot is the one this rank registered in the same call.
    pub fn peer_window(&self, q: usize, slot: u32) -> Option<(DevicePtr<u8>, usize)> {
        if (slot as usize) < FIRST_WINDOW_SLOT {
            return None;
        }
        let m = lock(&self.peers.mirror);
        let s = m.get(q)?.get(slot as usize)?.as_ref()?;
        Some((s.base, s.len as usize))
    }

    /// Registers `[ptr, ptr + len)` in a free slot below [`FIRST_WINDOW_SLOT`] (or, for a
    /// window, in `window_slot`) with every peer (module docs), keeping `owned` with it.
    pub fn register(
        &self,
        comm: &Communicator,
        buffers: &RegisteredBuffers,
        ptr: DevicePtr<u8>,
        len: usize,
        window_slot: Option<usize>,
        owned: Option<DeviceBuffer>,
    ) -> Result<Registration> {
        let _op = lock(&self.ops);
        let (offset, _, wire) = buffers.export(comm, ptr, len)?;
        let slot = match window_slot {
            Some(s) => s,
            None => lock(&self.local)[..FIRST_WINDOW_SLOT]
                .iter()
                .position(Option::is_none)
                .ok_or(Error::RegistryFull {
                    slots: FIRST_WINDOW_SLOT,
                    what: "buffers",
                })?,
        };
        let generation = {
            let mut g = lock(&self.next_generation);
            let v = *g;
            *g = g.wrapping_add(1).max(1);
            v
        };
        let reg = Registration {
            slot: slot as u32,
            generation,
            ptr,
            len,
        };
        let mut msg = request(OP_MAP, &reg, offset);
        msg.extend_from_slice(&wire);
        let peers: Vec<usize> = (0..comm.size()).filter(|&q| q != comm.rank()).collect();
        if let Err(e) = self.ask(comm, &peers, &msg, OP_MAP, &reg) {
            // Undo it where it was accepted (an answer of `unmap` for a slot a peer never
            // mapped is harmless).
            let undo = request(OP_UNMAP, &reg, 0);
            let _ = self.ask(comm, &peers, &undo, OP_UNMAP, &reg);
            return Err(e);
        }
        lock(&self.local)[slot] = Some(LocalEntry { reg, owned });
        Ok(reg)
    }

    /// Takes `reg` back from every peer and forgets it; returns the memory `mem_alloc` gave
    /// it, if any (the caller drops it after this returns).
    pub fn deregister(
        &self,
        comm: &Communicator,
        reg: Registration,
    ) -> Result<Option<DeviceBuffer>> {
        let _op = lock(&self.ops);
        let known = lock(&self.local)
            .get(reg.slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|e| e.reg == reg);
        if !known {
            return Err(Error::UnknownRegistration {
                slot: reg.slot as usize,
                generation: reg.generation,
            });
        }
        let peers: Vec<usize> = (0..comm.size()).filter(|&q| q != comm.rank()).collect();
        let msg = request(OP_UNMAP, &reg, 0);
        let answered = self.ask(comm, &peers, &msg, OP_UNMAP, &reg);
        // Forgotten here whatever the peers answered: no call of this rank names it again.
        let entry = lock(&self.local)[reg.slot as usize].take();
        answered?;
        Ok(entry.and_then(|e| e.owned))
    }

    /// The lowest free window slot (the same on every rank: windows come and go collectively).
    pub fn free_window_slot(&self) -> Result<usize> {
        lock(&self.local)[FIRST_WINDOW_SLOT..]
            .iter()
            .position(Option::is_none)
            .map(|i| FIRST_WINDOW_SLOT + i)
            .ok_or(Error::RegistryFull {
                slots: REGISTRY_SLOTS - FIRST_WINDOW_SLOT,
                what: "windows",
            })
    }

    /// The registration `ptr` starts, if this rank holds one that starts there.
    pub fn starting_at(&self, ptr: DevicePtr<u8>) -> Option<Registration> {
        lock(&self.local)
            .iter()
            .flatten()
            .find(|e| e.reg.ptr == ptr)
            .map(|e| e.reg)
    }

    /// Sends `msg` to every peer of `peers` and waits for each one's answer to `(op, reg)`.
    fn ask(
        &self,
        comm: &Communicator,
        peers: &[usize],
        msg: &[u8],
        op: u8,
        reg: &Registration,
    ) -> Result<()> {
        for &q in peers {
            comm.bootstrap().send(q, REG_TAG, msg)?;
        }
        let mut first_err = None;
        for &q in peers {
            let got = comm.recv_checked(q, ACK_TAG)?;
            if let Err(reason) = answer_ok(&got, op, reg) {
                first_err.get_or_insert(Error::RegistrationRefused {
                    rank: q,
                    slot: reg.slot as usize,
                    reason,
                });
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// A request (module docs) without the registration's wire form.
fn request(op: u8, reg: &Registration, offset: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(REG_HEADER + 128);
    m.extend_from_slice(&REG_MAGIC);
    m.extend_from_slice(&[VERSION, op]);
    m.extend_from_slice(&(reg.slot as u16).to_le_bytes());
    m.extend_from_slice(&reg.generation.to_le_bytes());
    m.extend_from_slice(&offset.to_le_bytes());
    m.extend_from_slice(&(reg.len as u64).to_le_bytes());
    m
}

/// `Ok` if `got` is a positive answer to `(op, reg)`, else why not.
fn answer_ok(got: &[u8], op: u8, reg: &Registration) -> std::result::Result<(), String> {
    if got.len() < ACK_HEADER || got[..4] != ACK_MAGIC || got[4] != VERSION {
        return Err(format!("an answer of {} bytes that is not one", got.len()));
    }
    let slot = u16::from_le_bytes([got[6], got[7]]) as u32;
    let generation = u32::from_le_bytes([got[8], got[9], got[10], got[11]]);
    if got[5] != op || slot != reg.slot || generation != reg.generation {
        return Err(format!(
            "an answer to another request (op {}, slot {slot}, generation {generation})",
            got[5]
        ));
    }
    if got[12] != 1 {
        return Err(String::from_utf8_lossy(&got[ACK_HEADER..]).into_owned());
    }
    Ok(())
}

/// The registration service's loop (module docs): serves the peers in turn until `stop` or a
/// failed communicator.
fn serve(
    comm: &Communicator,
    buffers: &RegisteredBuffers,
    peers: &PeerTable,
    stream: &LazyStream,
    stop: &AtomicBool,
) {
    // Map and write as outside any capture, whatever another thread of this process captures.
    let _relaxed = (comm.gpu().kind() == BackendKind::Cuda)
        .then(mscclpp_host::gpu::cuda::RelaxedCapture::new)
        .and_then(|r| r.ok());
    if let Err(e) = comm.gpu().bind_to_thread() {
        tracing::warn!(error = %e, "registration service: no device; not serving");
        return;
    }
    let stopped = || {
        if stop.load(Ordering::Acquire) {
            Err(Error::Aborted {
                reason: "the collectives were dropped".into(),
            })
        } else {
            Ok(())
        }
    };
    let others: Vec<usize> = (0..comm.size()).filter(|&q| q != comm.rank()).collect();
    while !stop.load(Ordering::Acquire) {
        for &q in &others {
            match comm
                .bootstrap()
                .recv_watched(q, REG_TAG, SERVICE_SLICE, &stopped)
            {
                Ok(msg) => {
                    let (head, result) = handle(comm, buffers, peers, stream, q, &msg);
                    let mut ack = Vec::with_capacity(ACK_HEADER + 64);
                    ack.extend_from_slice(&ACK_MAGIC);
                    ack.push(VERSION);
                    ack.extend_from_slice(&head);
                    match result {
                        Ok(()) => ack.push(1),
                        Err(why) => {
                            ack.push(0);
                            ack.extend_from_slice(why.as_bytes());
                        }
                    }
                    if comm.bootstrap().send(q, ACK_TAG, &ack).is_err() {
                        return;
                    }
                }
                Err(Error::BootstrapTimeout { .. }) => {}
                Err(e) => {
                    if !stop.load(Ordering::Acquire) {
                        tracing::debug!(error = %e, "registration service stops");
                    }
                    return;
                }
            }
        }
    }
}

/// One request from peer `q`: `(op, slot, generation)` as received (for the answer), and what
/// became of it.
fn handle(
    comm: &Communicator,
    buffers: &RegisteredBuffers,
    peers: &PeerTable,
    stream: &LazyStream,
    q: usize,
    msg: &[u8],
) -> ([u8; 7], std::result::Result<(), String>) {
    let mut head = [0u8; 7];
    if msg.len() < REG_HEADER || msg[..4] != REG_MAGIC || msg[4] != VERSION {
        return (
            head,
            Err(format!("a request of {} bytes that is not one", msg.len())),
        );
    }
    head.copy_from_slice(&msg[5..12]);
    let op = msg[5];
    let slot = u16::from_le_bytes([msg[6], msg[7]]) as usize;
    let generation = u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]);
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&msg[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let (offset, len) = (word(12), word(20));
    if slot >= REGISTRY_SLOTS || generation == 0 {
        return (head, Err(format!("slot {slot} generation {generation}")));
    }
    let entry = match op {
        OP_MAP => {
            let mapped = buffers
                .map(comm, q, &msg[REG_HEADER..])
                .and_then(|m| m.range(offset, len));
            match mapped {
                Ok(base) if base.addr() != 0 && len > 0 => RegistrySlot {
                    base,
                    len,
                    generation,
                    ..Default::default()
                },
                Ok(_) => return (head, Err("an empty range".into())),
                Err(e) => return (head, Err(e.to_string())),
            }
        }
        OP_UNMAP => RegistrySlot::default(),
        _ => return (head, Err(format!("unknown operation {op}"))),
    };
    let at = (q * REGISTRY_SLOTS + slot) * std::mem::size_of::<RegistrySlot>();
    let words: [u64; 4] = bytemuck::cast(entry);
    let dst = peers.table.ptr().byte_add_cast::<u64>(at as u64);
    let stream = match stream.get() {
        Ok(s) => s,
        Err(e) => return (head, Err(e.to_string())),
    };
    for (i, w) in words.iter().enumerate() {
        // SAFETY: slot `(q, slot)` of our own table (`q < nranks`, `slot < REGISTRY_SLOTS`),
        // four aligned words, alive as long as `peers`.
        if let Err(e) = unsafe { stream.write_value_u64(dst.byte_add_cast(8 * i as u64), *w) } {
            return (head, Err(e.to_string()));
        }
    }
    match stream.synchronize_timeout(comm.bootstrap().op_timeout()) {
        Ok(true) => {}
        Ok(false) => return (head, Err("the table write did not complete".into())),
        Err(e) => return (head, Err(e.to_string())),
    }
    lock(&peers.mirror)[q][slot] = (op == OP_MAP).then_some(entry);
    (head, Ok(()))
}
