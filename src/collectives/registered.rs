//! The callers' allocations as the peers see them: this rank's exports (one per allocation,
//! cached), the peers' allocations mapped here (one per `(rank, token)`, counted), and the
//! per-call exchange that only a call forced onto the copy engines still makes
//! (`algo/copy_engine.rs`; every other call on the callers' buffers learns the peers'
//! allocations through the registration service once: `registry.rs`).
//!
//! The per-call exchange: every participating rank sends each peer one bootstrap message:
//!
//! `magic "MSDX" | version u8 | ok u8 | count u8 | reserved u8 |
//!  count × (offset u64 | len u64 | registered memory (its wire form))`
//!
//! `ok` says whether this rank can share its buffers (device allocations it can export,
//! 16-byte aligned, and its cache has room); `count` buffers follow only when it can. Every rank
//! sees every `ok` flag, so all of them take the same path. The registration names the whole
//! allocation that holds the buffer.
//!
//! Caches (each guarded by a mutex; `local` is touched by the calling threads of this rank,
//! `remote` by them and by the registration service):
//! - `local`: this rank's exports by allocation id (CUDA buffer id / CPU token), so an
//!   allocation is exported once. At most [`MAX_ALLOCATIONS`]; when full, the exports of
//!   allocations that were freed since (their base no longer holds an allocation of that id)
//!   are evicted first ([`RegisteredBuffers::export`]); a rank whose cache is still full cannot
//!   share a buffer in a new allocation.
//! - `remote`: peers' allocations by `(rank, token)`, mapped the first time they are seen and
//!   counted: each registration of the service that maps one holds a count, unmapping it gives
//!   it back, and the mapping goes with the last ([`RegisteredBuffers::unmap`]). The per-call
//!   exchange holds its mappings for the life of the caches (a captured graph keeps using
//!   them). A peer's allocation freed and reallocated comes with a new token, so a stale mapping
//!   is never used for new memory.
//!
//! A message that cannot be decoded or mapped is an error; the rank then aborts the
//! communicator, because its peers may already be waiting in the kernel for it. So is, in a
//! symmetric call, a declared length other than this rank's own ([`same_len`]): another count
//! or configuration on that peer.

use std::collections::HashMap;
use std::sync::Mutex;

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::Allocation;
use mscclpp_host::registered_memory::{self, RegisteredMemory};
use mscclpp_host::sync::lock;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{DevicePtr, MAX_DIRECT_RANKS};

/// Most allocations one rank registers for direct collectives.
pub const MAX_ALLOCATIONS: usize = 256;

const MAGIC: [u8; 4] = *b"MSDX";
const VERSION: u8 = 1;
const HEADER: usize = 8;
const ENTRY: usize = 16 + registered_memory::WIRE_LEN;
/// Bootstrap tag of the per-call messages.
const TAG: u64 = 0x0d1_ec70_0000;

/// Whether parts of `part` bytes at every pointer in `ptrs` move as whole 16-byte vectors
/// (what the direct kernel requires of the buffers it does not receive through the exchange,
/// and of every part: a buffer of whole vectors can still hold parts that are not).
pub fn whole_vectors(ptrs: &[DevicePtr<u8>], part: usize) -> bool {
    part.is_multiple_of(16) && ptrs.iter().all(|p| p.addr().is_multiple_of(16))
}

/// A buffer a peer shared: its address here and the length it declared.
pub type Shared = (DevicePtr<u8>, usize);

/// Checks that peer `q` shared exactly `mine` bytes for `what`, as every rank of a symmetric
/// call does (a different length means another count or configuration there, e.g. another
/// CE scratch size, which would also cut the work differently).
pub fn same_len(
    comm: &Communicator,
    q: usize,
    shared: usize,
    mine: usize,
    what: &str,
) -> Result<()> {
    if shared == mine {
        return Ok(());
    }
    Err(refuse(
        comm,
        q,
        format!(
            "{what}: {shared} bytes shared where this rank shares {mine} (same call and \
             configuration on every rank?)"
        ),
    ))
}

/// The error of a peer's shared buffer that cannot be used; aborts the communicator first,
/// because the peers may already wait in a kernel for this rank.
fn refuse(comm: &Communicator, q: usize, reason: String) -> Error {
    comm.abort();
    Error::MalformedMemory { rank: q, reason }
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` are disjoint, or `a` is exactly `b + at` (the
/// in-place layouts the direct kernels serve: every element is read and written by one
/// thread, or only ever by its owner).
pub fn disjoint_or_at(
    a: DevicePtr<u8>,
    a_len: usize,
    b: DevicePtr<u8>,
    b_len: usize,
    at: Option<usize>,
) -> bool {
    let (a0, b0) = (a.addr(), b.addr());
    let disjoint = a0 + a_len as u64 <= b0 || b0 + b_len as u64 <= a0;
    disjoint || at.is_some_and(|at| a0 == b0 + at as u64)
}

/// One allocation of this rank as exported: its base, its registration (kept alive) and its
/// wire form.
type LocalExport = (DevicePtr<u8>, RegisteredMemory, Vec<u8>);

/// The caches of one `Collectives`.
#[derive(Default)]
pub struct RegisteredBuffers {
    /// The allocation's base, its registration (kept alive) and its wire form, by allocation
    /// id.
    local: Mutex<HashMap<u64, LocalExport>>,
    /// The mapping and how many hold it, by `(rank, token)`.
    remote: Mutex<HashMap<(usize, u64), (RegisteredMemory, usize)>>,
}

/// One buffer of this rank as exported ([`RegisteredBuffers::export`]).
pub struct Export {
    /// The allocation that holds it.
    pub allocation: Allocation,
    /// Its offset in the allocation.
    pub offset: u64,
    /// The allocation's registration, in its wire form.
    pub wire: Vec<u8>,
}

impl RegisteredBuffers {
    /// Shares `mine` (this rank's buffers the peers need: address and length) with `peers`,
    /// and returns every peer's shared buffers as addressed here, with the lengths the peer
    /// declared (checked against its registration, not against what the caller needs: see
    /// [`same_len`]), in `peers` order; `None` when some rank cannot go direct (then every rank
    /// returns `None`), e.g. because it passed `eligible = false` (its buffers overlap in a way
    /// the direct path cannot serve). Every rank in `peers` makes the matching call with this
    /// rank in its `peers`.
    pub fn exchange(
        &self,
        comm: &Communicator,
        peers: &[usize],
        mine: &[(DevicePtr<u8>, usize)],
        eligible: bool,
    ) -> Result<Option<Vec<Vec<Shared>>>> {
        let msg = self.message(comm, mine, eligible);
        for &q in peers {
            comm.bootstrap().send(q, TAG, &msg)?;
        }
        let mut all_ok = msg[5] == 1;
        let mut got = Vec::with_capacity(peers.len());
        for &q in peers {
            let bytes = comm.recv_checked(q, TAG)?;
            match self.decode(comm, q, &bytes) {
                Ok(Some(ptrs)) => got.push(ptrs),
                Ok(None) => all_ok = false,
                Err(e) => {
                    // The peers may already wait for this rank inside a kernel.
                    comm.abort();
                    return Err(e);
                }
            }
        }
        Ok(all_ok.then_some(got))
    }

    /// `(this rank's allocations registered, peers' allocations mapped)`.
    pub fn counts(&self) -> (usize, usize) {
        (lock(&self.local).len(), lock(&self.remote).len())
    }

    /// This rank's message: `ok = 0` (and no entries) unless every buffer can be shared.
    fn message(
        &self,
        comm: &Communicator,
        mine: &[(DevicePtr<u8>, usize)],
        eligible: bool,
    ) -> Vec<u8> {
        let entries: Option<Vec<(u64, u64, Vec<u8>)>> = if eligible {
            mine.iter()
                .map(|&(p, len)| self.share(comm, p, len))
                .collect()
        } else {
            None
        };
        let mut msg = Vec::with_capacity(HEADER + mine.len() * ENTRY);
        msg.extend_from_slice(&MAGIC);
        msg.push(VERSION);
        match entries {
            Some(entries) if mine.len() <= u8::MAX as usize => {
                msg.extend_from_slice(&[1, mine.len() as u8, 0]);
                for (offset, len, reg) in entries {
                    msg.extend_from_slice(&offset.to_le_bytes());
                    msg.extend_from_slice(&len.to_le_bytes());
                    msg.extend_from_slice(&reg);
                }
            }
            _ => msg.extend_from_slice(&[0, 0, 0]),
        }
        msg
    }

    /// `(offset in its allocation, len, the allocation's registration)` of one buffer, or
    /// `None` if it cannot be shared (not exportable, misaligned, or the cache is full).
    fn share(
        &self,
        comm: &Communicator,
        ptr: DevicePtr<u8>,
        len: usize,
    ) -> Option<(u64, u64, Vec<u8>)> {
        if !ptr.addr().is_multiple_of(16) || !len.is_multiple_of(16) || len == 0 {
            return None;
        }
        match self.export(comm, ptr, len) {
            Ok(x) => Some((x.offset, len as u64, x.wire)),
            Err(e) => {
                tracing::debug!(error = %e, "buffer not registrable; collectives stage it");
                None
            }
        }
    }

    /// The buffer `[ptr, ptr + len)` as exported: its allocation is exported once (cached by
    /// allocation id, at most [`MAX_ALLOCATIONS`]; when the cache is full, the exports of
    /// allocations freed since are evicted first), for the per-call exchange and for the
    /// registry alike.
    pub fn export(&self, comm: &Communicator, ptr: DevicePtr<u8>, len: usize) -> Result<Export> {
        let refuse = |reason: String| Error::NotRegistrable {
            ptr: ptr.addr(),
            len,
            reason,
        };
        if len == 0 {
            return Err(refuse("it is empty".into()));
        }
        let a = comm
            .gpu()
            .allocation_of(ptr)
            .map_err(|e| refuse(e.to_string()))?;
        let offset = ptr.addr() - a.base.addr();
        if offset.saturating_add(len as u64) > a.size as u64 {
            return Err(refuse(format!(
                "it runs past its {}-byte allocation",
                a.size
            )));
        }
        let mut local = lock(&self.local);
        if !local.contains_key(&a.id) {
            if local.len() >= MAX_ALLOCATIONS {
                // Evict the exports of allocations that are gone (freed, or reused by another).
                let g = comm.gpu();
                local.retain(|&id, (base, _, _)| g.allocation_of(*base).is_ok_and(|x| x.id == id));
            }
            if local.len() >= MAX_ALLOCATIONS {
                return Err(refuse(format!(
                    "{MAX_ALLOCATIONS} live allocations are registered already"
                )));
            }
            let reg = comm
                .register_allocation(&a)
                .map_err(|e| refuse(e.to_string()))?;
            let wire = reg.serialize();
            local.insert(a.id, (a.base, reg, wire));
        }
        let (_, _, wire) = local
            .get(&a.id)
            .ok_or_else(|| refuse("its export vanished".into()))?;
        Ok(Export {
            offset,
            wire: wire.clone(),
            allocation: a,
        })
    }

    /// Forgets this rank's export of allocation `id` (freed: `registry.rs` evicts it).
    pub fn forget(&self, id: u64) {
        lock(&self.local).remove(&id);
    }

    /// Peer `q`'s allocation `reg` (its wire form) mapped here, and its token: once per
    /// allocation (cached by `(q, token)`, at most [`MAX_ALLOCATIONS`] per rank), counted: each
    /// call holds one count until [`unmap`](Self::unmap) gives it back.
    pub fn map(
        &self,
        comm: &Communicator,
        q: usize,
        reg: &[u8],
    ) -> Result<(RegisteredMemory, u64)> {
        let bad = |reason: String| Error::MalformedMemory { rank: q, reason };
        let token = RegisteredMemory::wire_token(reg)
            .ok_or_else(|| bad("registration with a wrong length or magic".into()))?;
        let mut remote = lock(&self.remote);
        if let Some((m, refs)) = remote.get_mut(&(q, token)) {
            *refs = refs.saturating_add(1);
            return Ok((m.clone(), token));
        }
        if remote.len() >= MAX_ALLOCATIONS * comm.size() {
            return Err(bad("more allocations than any rank registers".into()));
        }
        let m = RegisteredMemory::deserialize(reg, comm.gpu(), q, comm.same_node(q))?;
        remote.insert((q, token), (m.clone(), 1));
        Ok((m, token))
    }

    /// Gives back one count of peer `q`'s allocation `token`; the mapping goes with the last
    /// (the registration service calls this once no kernel of this rank can use it).
    pub fn unmap(&self, q: usize, token: u64) {
        let mut remote = lock(&self.remote);
        if let Some((_, refs)) = remote.get_mut(&(q, token)) {
            *refs -= 1;
            if *refs == 0 {
                remote.remove(&(q, token));
            }
        }
    }

    /// A peer's message: `None` if it cannot go direct, else its buffers mapped here.
    fn decode(&self, comm: &Communicator, q: usize, b: &[u8]) -> Result<Option<Vec<Shared>>> {
        let bad = |reason: String| Error::MalformedMemory { rank: q, reason };
        if b.len() < HEADER || b[..4] != MAGIC || b[4] != VERSION {
            return Err(bad("not a direct-collective message of this version".into()));
        }
        if b[5] != 1 {
            return Ok(None);
        }
        let count = b[6] as usize;
        if b.len() != HEADER + count * ENTRY {
            return Err(bad(format!("{} bytes for {count} buffers", b.len())));
        }
        let mut ptrs = Vec::with_capacity(count);
        for e in b[HEADER..].chunks_exact(ENTRY) {
            let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or_default());
            let (offset, len, reg) = (word(0), word(8), &e[16..]);
            let (mem, _) = self.map(comm, q, reg)?;
            ptrs.push((mem.range(offset, len)?, len as usize));
        }
        Ok(Some(ptrs))
    }
}

/// Every rank's copy of each shared buffer, as addressed here, indexed by rank.
pub type Table = Vec<[DevicePtr<u8>; MAX_DIRECT_RANKS]>;

/// Registers and exchanges the buffers of a symmetric call: every rank of `comm` shares `mine`
/// with every other through `buffers`, with the same lengths (checked: another length is an
/// error). `eligible`: whether this rank's buffers suit the path (an ineligible rank still
/// takes part in the exchange, so that every rank learns that it cannot). Returns the [`Table`]
/// of every shared buffer, or `None` when some rank cannot go this way (then every rank gets
/// `None`).
pub fn share_all(
    comm: &Communicator,
    buffers: &RegisteredBuffers,
    mine: &[(DevicePtr<u8>, usize)],
    eligible: bool,
) -> Result<Option<Table>> {
    let (n, me) = (comm.size(), comm.rank());
    if n > MAX_DIRECT_RANKS {
        // Decided alike on every rank, with no exchange (the algorithms refuse such
        // communicators before they get here).
        return Ok(None);
    }
    let peers: Vec<usize> = (0..n).filter(|&q| q != me).collect();
    if !eligible {
        buffers.exchange(comm, &peers, mine, false)?;
        return Ok(None);
    }
    let Some(got) = buffers.exchange(comm, &peers, mine, true)? else {
        return Ok(None);
    };
    let mut table = vec![[DevicePtr::NULL; MAX_DIRECT_RANKS]; mine.len()];
    for (k, &(p, _)) in mine.iter().enumerate() {
        table[k][me] = p;
    }
    for (&q, theirs) in peers.iter().zip(&got) {
        if theirs.len() != mine.len() {
            comm.abort();
            return Err(Error::MalformedMemory {
                rank: q,
                reason: format!("{} buffers for a call sharing {}", theirs.len(), mine.len()),
            });
        }
        for (k, (&(p, len), &(_, need))) in theirs.iter().zip(mine).enumerate() {
            same_len(comm, q, len, need, "a direct collective's buffer")?;
            table[k][q] = p;
        }
    }
    Ok(Some(table))
}
