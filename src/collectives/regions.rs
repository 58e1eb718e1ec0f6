//! The scratch regions allocated on first use (`scratch.rs` says which): each a buffer of its own
//! that every peer maps, with a channel table of its own whose channels point at the peers'
//! buffers of that region (the semaphores are the set-up table's, so the kernels' barriers are
//! unchanged).
//!
//! # Trading a region, one-sided
//!
//! Every rank of a call runs the same algorithm, so every rank of a call needs the same region
//! with the same peers. A rank that needs region `r` with a peer it has not sent `r` to yet
//! allocates its buffer (once: it registers it and builds its table, whose channels to peers not
//! traded yet point at its own buffer, a harmless place), and sends the peer its registration
//! through the peer's registration service (`registry.rs`, op `region`); it does not wait for
//! anything. The peer's service, whatever the peer's own threads are doing:
//!
//! 1. allocates the peer's own buffer of `r` if it has none yet, and sends its registration
//!    back if it has not sent it to that rank yet (so the two ranks hold each other's buffers
//!    within a round trip of their services, the peer's program being elsewhere);
//! 2. maps the received buffer, checks its length, and points the channels to its sender at it
//!    in its table, with stream writes on the service's stream (waited for);
//! 3. sets the *ready word* of `(r, sender)` (host-mapped memory, a release store of 1).
//!
//! A call's launch in `r` starts only once `r` is ready with every peer of the call: for each
//! peer that is not, the call queues a wait for its ready word on its stream
//! (`Stream::wait_value_u64`), so the host never waits; under CUDA-graph capture it waits on the
//! host instead (bounded by the bootstrap's operation deadline), so that the graph holds no wait
//! and a first captured call needs no eager one before it (`Collectives::prepare` trades every
//! region beforehand, as a convenience).
//!
//! When the registration service ends (the `Collectives` is dropped, or its communicator
//! aborted), every ready word is set to `u64::MAX` ([`LazyRegions::release`]): a launch still
//! waiting then runs, finds the communicator aborted at its first wait and returns, its stores
//! to peers not traded landing in its own buffer.
//!
//! # Several ranks on one GPU
//!
//! When ranks share a GPU (`sharing.rs`), a launch waits for a region's trade on the host
//! too, never with a wait on its stream. A stream's wait for a value holds the head of the
//! hardware queue the stream is mapped to, and the streams of every rank of the process, the
//! services' and the driver's own (the zeroing of a new allocation) share the context's few
//! queues: a wait that needs a service's allocation, queued ahead of that allocation's zeroing
//! in one queue, never ends (seen on an H200 at 8 ranks: the services blocked in the zeroing,
//! no kernel running). The host wait is one round trip of the peers' services, once per region.
//!
//! [`LazyRegions`] holds what it needs (the communicator, the layout, the set-up channel
//! table's handles), set at set-up and never changed, so it asks nothing of the context that
//! owns it.
//!
//! Shared state: each region's state (a mutex: held by a calling thread that allocates and
//! sends, and by the service that receives, maps and writes the table, so a region is allocated
//! once and each peer's entries written once); its device table (the entries of a peer written
//! once, before that peer's ready word, by the service's stream; read by the kernels launched
//! after the ready word); the ready words (host-mapped, `LAZY.len() * nranks` u64: written by
//! the service with release stores, read by the streams' waits and by the calling threads with
//! acquire loads).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{DeviceBuffer, HostMapped, Stream};
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{DevicePtr, MemoryChannelDeviceHandle};

use super::scratch::{Region, ScratchLayout};

/// The regions allocated on first use.
const LAZY: [Region; 3] = [Region::Ll128, Region::Staging, Region::P2p];

/// The `tracing` target of the one-time messages a call sends (a scratch region here, a hint
/// in `registry.rs`), at debug level, with the rank: what a test through the C ABI counts.
pub(crate) const HINT_TARGET: &str = "mscclpp::collectives::sent";

/// How a region's registration reaches rank `q`'s registration service (`registry.rs`, op
/// `region`; given at set-up, so that this module imports nothing above it):
/// `(communicator, q, region index, registration)`.
pub(crate) type SendRegion = fn(&Communicator, usize, usize, &[u8]) -> Result<()>;

/// A ready word's value once the region is traded with its peer.
const READY: u64 = 1;

/// The peers a call needs a region traded with.
#[derive(Clone, Debug)]
pub(crate) enum Peers {
    /// Every other rank (collectives).
    All,
    /// One (a `send` or a `recv`).
    One(usize),
    /// Those of a batch of the point-to-point engine, each once (this rank itself is left
    /// out).
    Some(Vec<usize>),
}

impl Peers {
    /// The ranks other than `me` of `ranks` that this names.
    fn list(self, me: usize, ranks: usize) -> Vec<usize> {
        match self {
            Peers::All => (0..ranks).filter(|&q| q != me).collect(),
            Peers::One(q) => vec![q],
            Peers::Some(list) => list.into_iter().filter(|&q| q != me).collect(),
        }
    }
}

/// One region: this rank's buffer, its channel table, and what was traded so far.
struct RegionState {
    buffer: DeviceBuffer,
    _mine: RegisteredMemory,
    wire: Vec<u8>,
    table: DeviceBuffer,
    /// The peers' buffers mapped here.
    peers: Vec<Option<RegisteredMemory>>,
    /// Whether this rank's registration went to each peer.
    sent: Vec<bool>,
}

/// The regions allocated on first use, by [`LAZY`] index, and what allocating and trading them
/// needs (module docs).
pub(crate) struct LazyRegions {
    comm: Arc<Communicator>,
    layout: ScratchLayout,
    /// The set-up channel table as the host built it (each region's table is a copy of it).
    handles: Vec<MemoryChannelDeviceHandle>,
    slots: [Mutex<Option<RegionState>>; LAZY.len()],
    /// `[region][rank]` ready words (module docs).
    ready: HostMapped,
    /// What sends a region to a peer's service.
    send_region: SendRegion,
    /// Whether a launch waits for a region's trade on the host, never on its stream: when ranks
    /// share a GPU (module docs, "Several ranks on one GPU").
    host_waits: bool,
}

fn index(r: Region) -> Option<usize> {
    LAZY.iter().position(|&l| l == r)
}

impl LazyRegions {
    /// No region yet, for `comm`'s collectives laid out by `layout` with the set-up channel
    /// table `handles`, sending regions to the peers with `send_region`; `host_waits` when
    /// ranks share a GPU.
    pub fn new(
        comm: Arc<Communicator>,
        layout: ScratchLayout,
        handles: Vec<MemoryChannelDeviceHandle>,
        send_region: SendRegion,
        host_waits: bool,
    ) -> Result<Self> {
        let words = LAZY.len() * comm.size();
        let ready = comm.gpu().alloc_host_mapped(8 * words)?;
        // SAFETY: `ready` holds `words` u64, zeroed by nobody else yet.
        unsafe { std::ptr::write_bytes(ready.host_ptr(), 0, 8 * words) };
        Ok(Self {
            comm,
            layout,
            handles,
            slots: Default::default(),
            ready,
            send_region,
            host_waits,
        })
    }

    fn lock(&self, i: usize) -> std::sync::MutexGuard<'_, Option<RegionState>> {
        mscclpp_host::sync::lock(&self.slots[i])
    }

    fn list(&self, peers: Peers) -> Vec<usize> {
        peers.list(self.comm.rank(), self.comm.size())
    }

    /// The ready word of region `i` with rank `q`.
    fn word(&self, i: usize, q: usize) -> &AtomicU64 {
        let at = i * self.comm.size() + q;
        // SAFETY: `ready` holds `LAZY.len() * nranks` aligned u64 (`new`), alive as long as
        // `self`; every access to them is atomic.
        unsafe { AtomicU64::from_ptr((self.ready.host_ptr() as *mut u64).add(at)) }
    }

    /// Whether region `i` is traded with rank `q`.
    fn is_ready_with(&self, i: usize, q: usize) -> bool {
        self.word(i, q).load(Ordering::Acquire) >= READY
    }

    /// Runs `f` on this rank's buffer of region `r` if it is allocated (the point-to-point
    /// region's teardown reads it: `algo::p2p::drain`).
    pub fn with_buffer<T>(&self, r: Region, f: impl FnOnce(&DeviceBuffer) -> T) -> Option<T> {
        let i = index(r)?;
        self.lock(i).as_ref().map(|s| f(&s.buffer))
    }

    /// Never frees region `r`: its buffer, its channel table and its mappings of the peers'
    /// buffers stay allocated for the rest of the process, and are not ours to reach again.
    /// For a region peers may still write into (a peer late to acknowledge, `algo::p2p::drain`):
    /// freed, a late write would land in memory reused for something else, or fault (on the
    /// CPU backend in this process, on a GPU in the peer's kernel). Returns the bytes kept.
    pub fn abandon(&self, r: Region) -> usize {
        let Some(i) = index(r) else {
            return 0;
        };
        match self.lock(i).take() {
            Some(s) => {
                let bytes = s.buffer.len() + s.table.len();
                std::mem::forget(s);
                bytes
            }
            None => 0,
        }
    }

    /// Bytes of the regions allocated so far.
    pub fn allocated(&self, layout: &ScratchLayout) -> usize {
        LAZY.iter()
            .enumerate()
            .filter(|&(i, _)| self.lock(i).is_some())
            .map(|(_, &r)| layout.region_len(r))
            .sum()
    }

    /// Region `r`'s `(scratch, channel table)` for a launch with `peers` on `stream`, sent to
    /// the peers it was not sent to yet, and the launch made to wait for those it is not traded
    /// with yet (module docs: on the stream; under capture, on the host); `None` for a region
    /// that is not allocated on first use.
    pub fn get(
        &self,
        r: Region,
        peers: Peers,
        stream: &Stream,
    ) -> Result<Option<(DevicePtr<u8>, DevicePtr<u8>)>> {
        let Some(i) = index(r) else {
            return Ok(None);
        };
        let list = self.list(peers);
        let (region, unsent) = {
            let mut slot = self.lock(i);
            let s = self.allocated_in(r, &mut slot)?;
            let unsent: Vec<usize> = list.iter().copied().filter(|&q| !s.sent[q]).collect();
            for &q in &unsent {
                s.sent[q] = true;
            }
            ((s.buffer.ptr(), s.table.ptr()), (unsent, s.wire.clone()))
        };
        for &q in &unsent.0 {
            (self.send_region)(&self.comm, q, i, &unsent.1)?;
            tracing::debug!(
                target: HINT_TARGET,
                rank = self.comm.rank(),
                to = q,
                region = r.name(),
                "a scratch region sent to a peer"
            );
        }
        let waiting: Vec<usize> = list
            .into_iter()
            .filter(|&q| !self.is_ready_with(i, q))
            .collect();
        if waiting.is_empty() {
            return Ok(Some(region));
        }
        let timeout = self.comm.bootstrap().op_timeout();
        if self.host_waits || stream.is_capturing()? {
            self.wait_ready(r, i, &waiting, timeout)?;
            return Ok(Some(region));
        }
        for q in waiting {
            let addr = self
                .ready
                .device_ptr()
                .byte_add_cast::<u64>((8 * (i * self.comm.size() + q)) as u64);
            // SAFETY: the ready words live as long as `self`, which outlives every launch of
            // the `Collectives` (its drop waits for them); `release` ends the wait when nothing
            // will trade any more.
            unsafe { stream.wait_value_u64(addr, READY, timeout) }?;
        }
        Ok(Some(region))
    }

    /// Trades every region with every peer, waiting on the host until they are traded
    /// (`Collectives::prepare`).
    pub fn prepare(&self) -> Result<()> {
        let timeout = self.comm.bootstrap().op_timeout();
        let list = self.list(Peers::All);
        for (i, &r) in LAZY.iter().enumerate() {
            if self.layout.region_len(r) == 0 {
                continue;
            }
            let wire = {
                let mut slot = self.lock(i);
                let s = self.allocated_in(r, &mut slot)?;
                let unsent: Vec<usize> = list.iter().copied().filter(|&q| !s.sent[q]).collect();
                for &q in &unsent {
                    s.sent[q] = true;
                }
                (unsent, s.wire.clone())
            };
            for &q in &wire.0 {
                (self.send_region)(&self.comm, q, i, &wire.1)?;
            }
            self.wait_ready(r, i, &list, timeout)?;
        }
        Ok(())
    }

    /// Waits on the host until region `i` is traded with every rank of `peers`, at most
    /// `timeout`, or the communicator failed.
    fn wait_ready(&self, r: Region, i: usize, peers: &[usize], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut backoff = mscclpp_host::backoff::Backoff::new();
        for &q in peers {
            while !self.is_ready_with(i, q) {
                if let Some(e) = self.comm.failure() {
                    return Err(e);
                }
                if Instant::now() >= deadline {
                    return Err(Error::RegionUnavailable {
                        region: r.name(),
                        rank: q,
                    });
                }
                backoff.snooze();
            }
        }
        Ok(())
    }

    /// This rank's region `r`, allocated into `slot` if it holds none.
    fn allocated_in<'s>(
        &self,
        r: Region,
        slot: &'s mut Option<RegionState>,
    ) -> Result<&'s mut RegionState> {
        if slot.is_none() {
            match self.allocate(r) {
                Ok(s) => *slot = Some(s),
                Err(e) => {
                    let len = self.layout.region_len(r);
                    tracing::warn!(region = r.name(), bytes = len, error = %e, "no scratch region");
                    return Err(e);
                }
            }
        }
        slot.as_mut().ok_or(Error::RegionUnavailable {
            region: r.name(),
            rank: self.comm.rank(),
        })
    }

    /// This rank's buffer of region `r`, registered, with its table (no peer traded yet: every
    /// channel points at this buffer).
    fn allocate(&self, r: Region) -> Result<RegionState> {
        let (comm, g) = (&self.comm, self.comm.gpu());
        let len = self.layout.region_len(r).max(16);
        let buffer = g.alloc(len)?;
        let mine = comm.register_buffer(&buffer, Transport::local_for(g.kind()))?;
        let mut handles = self.handles.clone();
        for h in handles.iter_mut() {
            h.src = buffer.ptr();
            h.dst = buffer.ptr();
            h.packet_buffer = buffer.ptr();
        }
        let table = g.alloc(std::mem::size_of_val(handles.as_slice()).max(16))?;
        table.copy_from_host(0, bytemuck::cast_slice(&handles))?;
        let n = comm.size();
        Ok(RegionState {
            wire: mine.serialize(),
            buffer,
            _mine: mine,
            table,
            peers: (0..n).map(|_| None).collect(),
            sent: vec![false; n],
        })
    }

    /// Rank `q`'s registration `wire` of region `index` (the registration service's step,
    /// module docs): this rank's region allocated and sent back if need be, `q`'s mapped into
    /// the table with `stream`, then its ready word set.
    pub fn receive(&self, q: usize, index: usize, wire: &[u8], stream: &Stream) -> Result<()> {
        let (comm, n) = (&self.comm, self.comm.size());
        let Some(&r) = LAZY.get(index) else {
            return Err(Error::MalformedMemory {
                rank: q,
                reason: format!("a scratch region of index {index}"),
            });
        };
        if q >= n || q == comm.rank() {
            return Err(Error::MalformedMemory {
                rank: q,
                reason: format!("a scratch region from rank {q}"),
            });
        }
        let len = self.layout.region_len(r).max(16);
        let mut slot = self.lock(index);
        let s = self.allocated_in(r, &mut slot)?;
        if !s.sent[q] {
            (self.send_region)(comm, q, index, &s.wire)?;
            s.sent[q] = true;
        }
        if s.peers[q].is_some() {
            return Ok(());
        }
        let m = RegisteredMemory::deserialize(wire, comm.gpu(), q, comm.same_node(q))?;
        if m.size() != len {
            return Err(Error::MalformedMemory {
                rank: q,
                reason: format!(
                    "its {} region holds {} bytes, this rank's {len} (another configuration?)",
                    r.name(),
                    m.size()
                ),
            });
        }
        let ptr = m.range(0, len as u64)?;
        let size = std::mem::size_of::<MemoryChannelDeviceHandle>() as u64;
        let dst_at = std::mem::offset_of!(MemoryChannelDeviceHandle, dst) as u64;
        for k in (0..self.handles.len()).filter(|k| k % n == q) {
            let at = s.table.ptr().byte_add_cast::<u64>(k as u64 * size + dst_at);
            // SAFETY: the `dst` word of entry `k` of this region's table (`k < len`), alive
            // with `s`; no launch reads the entries of `q` before its ready word is set.
            unsafe { stream.write_value_u64(at, ptr.addr()) }?;
        }
        if !stream.synchronize_timeout(comm.bootstrap().op_timeout())? {
            return Err(Error::RegionUnavailable {
                region: r.name(),
                rank: q,
            });
        }
        s.peers[q] = Some(m);
        self.word(index, q).store(READY, Ordering::Release);
        Ok(())
    }

    /// Ends every wait for a ready word (module docs): nothing trades any more.
    pub fn release(&self) {
        for i in 0..LAZY.len() {
            for q in 0..self.comm.size() {
                self.word(i, q).fetch_max(u64::MAX, Ordering::Release);
            }
        }
    }
}
