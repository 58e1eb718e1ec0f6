//! The scratch regions allocated on first use (`scratch.rs` says which): each a buffer of its own
//! that every peer maps, with a channel table of its own whose channels point at the peers'
//! buffers of that region (the semaphores are the set-up table's, so the kernels' barriers are
//! unchanged).
//!
//! # The first call that needs a region, with each peer
//!
//! Every rank of a call runs the same algorithm, so the ranks of a call come here at the same
//! call: each allocates its buffer (once) and registers it, and trades it with every peer of
//! the call it has not traded it with yet (all peers for a collective, the one peer of a
//! `send` / `recv`, the peers of a batch of the point-to-point engine: a pair that traded stays
//! traded, on both sides), one bootstrap message each way under the region's tag
//! (`REGION_TAG + region`), all sent before any is awaited:
//!
//! `ok u8 | the registration's wire form (when ok = 1)`
//!
//! It maps what it receives and points its region table's channels to those peers at their
//! buffers (the table is rewritten, entries in use unchanged). A rank that cannot allocate or
//! register sends `ok = 0`; the call then fails on every rank of it with
//! [`Error::RegionUnavailable`] (naming a rank that could not), and nothing is recorded for
//! those peers (a later call tries again, alike on both sides). Nothing is queued before the
//! exchange completes, so no kernel waits on a rank that failed.
//!
//! The point-to-point region is traded pairwise, at the first batch in which two ranks meet:
//! that call waits on the host until the peer reaches its matching call (as NCCL's first
//! send / receive between two ranks waits for the peer to connect). Sends and receives that
//! only complete together (a cycle of them) must be in one group, as NCCL requires; a first
//! meeting that never comes fails at the bootstrap's deadline with the peer named.
//!
//! # Under CUDA-graph capture
//!
//! Allocating and waiting for peers have no place in a capture: a call captured before the
//! region is traded with its peers does not take the algorithms that need it (the planner
//! asks [`LazyRegions::ready`]); `Collectives::prepare` trades every region with every peer
//! beforehand.
//!
//! [`LazyRegions`] holds what it needs (the communicator, the layout, the set-up channel
//! table's handles), set at set-up and never changed, so it asks nothing of the context that
//! owns it.
//!
//! Shared state: each region's state (a mutex, held through the exchange so that two threads
//! of one rank never allocate or trade one region twice; read by every call that uses the
//! region); its device table (written by the host only between the exchanges of a call and
//! its launch, in entries of peers no queued kernel uses yet).

use std::sync::{Arc, Mutex};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::DeviceBuffer;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{DevicePtr, MemoryChannelDeviceHandle};

use super::scratch::{Region, ScratchLayout};

/// Bootstrap tag of the exchanges (plus the region's index).
const REGION_TAG: u64 = 0x0d1_e600_0000;

/// The regions allocated on first use.
const LAZY: [Region; 3] = [Region::Ll128, Region::Staging, Region::P2p];

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

/// Which of the regions allocated on first use are traded with a call's peers (or not
/// allocated on first use, or taking no space: ready alike): what the planner asks under
/// CUDA-graph capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ready(u8);

impl Ready {
    /// Every region ready (what an eager call sees: it may allocate and trade).
    pub const ALL: Ready = Ready(u8::MAX);

    /// Whether `r` is ready.
    pub fn has(self, r: Region) -> bool {
        index(r).is_none_or(|i| self.0 & (1 << i) != 0)
    }
}

/// One region: this rank's buffer, its channel table, and the peers' buffers traded so far.
struct RegionState {
    buffer: DeviceBuffer,
    _mine: RegisteredMemory,
    wire: Vec<u8>,
    table: DeviceBuffer,
    handles: Vec<MemoryChannelDeviceHandle>,
    peers: Vec<Option<RegisteredMemory>>,
}

/// The regions allocated on first use, by [`LAZY`] index, and what allocating and trading them
/// needs (module docs).
pub(crate) struct LazyRegions {
    comm: Arc<Communicator>,
    layout: ScratchLayout,
    /// The set-up channel table as the host built it (each region's table is a copy of it).
    handles: Vec<MemoryChannelDeviceHandle>,
    slots: [Mutex<Option<RegionState>>; LAZY.len()],
}

fn index(r: Region) -> Option<usize> {
    LAZY.iter().position(|&l| l == r)
}

impl LazyRegions {
    /// No region yet, for `comm`'s collectives laid out by `layout` with the set-up channel
    /// table `handles`.
    pub fn new(
        comm: Arc<Communicator>,
        layout: ScratchLayout,
        handles: Vec<MemoryChannelDeviceHandle>,
    ) -> Self {
        Self {
            comm,
            layout,
            handles,
            slots: Default::default(),
        }
    }

    fn lock(&self, i: usize) -> std::sync::MutexGuard<'_, Option<RegionState>> {
        self.slots[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn list(&self, peers: Peers) -> Vec<usize> {
        peers.list(self.comm.rank(), self.comm.size())
    }

    /// Whether a call with `peers` that needs `r` can run without allocating or trading (the
    /// region is traded with them, is not allocated on first use, or no algorithm asked for
    /// it).
    pub fn is_ready(&self, r: Region, peers: Peers) -> bool {
        let Some(i) = index(r) else {
            return true;
        };
        if self.layout.region_len(r) == 0 {
            return true;
        }
        let list = self.list(peers);
        if list.is_empty() {
            return true;
        }
        let s = self.lock(i);
        s.as_ref()
            .is_some_and(|s| list.iter().all(|&q| s.peers[q].is_some()))
    }

    /// [`is_ready`](Self::is_ready) of every region, for a call with `peers`.
    pub fn ready(&self, peers: &Peers) -> Ready {
        LAZY.iter().enumerate().fold(Ready(0), |m, (i, &r)| {
            if self.is_ready(r, peers.clone()) {
                Ready(m.0 | 1 << i)
            } else {
                m
            }
        })
    }

    /// Runs `f` on this rank's buffer of region `r` if it is allocated (the point-to-point
    /// region's teardown reads it: `algo::p2p::drain`).
    pub fn with_buffer(&self, r: Region, f: impl FnOnce(&DeviceBuffer)) {
        if let Some(i) = index(r)
            && let Some(s) = self.lock(i).as_ref()
        {
            f(&s.buffer);
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

    /// Region `r`'s `(scratch, channel table)`, traded with `peers` first where it was not
    /// (module docs); `None` for a region that is not allocated on first use.
    pub fn get(&self, r: Region, peers: Peers) -> Result<Option<(DevicePtr<u8>, DevicePtr<u8>)>> {
        let Some(i) = index(r) else {
            return Ok(None);
        };
        let mut slot = self.lock(i);
        let wanted: Vec<usize> = self
            .list(peers)
            .into_iter()
            .filter(|&q| slot.as_ref().is_none_or(|s| s.peers[q].is_none()))
            .collect();
        if slot.is_none() || !wanted.is_empty() {
            self.exchange(r, i, &mut slot, &wanted)?;
        }
        Ok(slot.as_ref().map(|s| (s.buffer.ptr(), s.table.ptr())))
    }

    /// This rank's buffer of region `r`, registered, with its table (no peer traded yet).
    fn allocate(&self, r: Region) -> Result<RegionState> {
        let (comm, g) = (&self.comm, self.comm.gpu());
        let len = self.layout.region_len(r).max(16);
        let buffer = g.alloc(len)?;
        let mine = comm.register_buffer(&buffer, Transport::local_for(g.kind()))?;
        let mut handles = self.handles.clone();
        for h in handles.iter_mut() {
            h.src = buffer.ptr();
            h.packet_buffer = buffer.ptr();
        }
        let table = g.alloc(std::mem::size_of_val(handles.as_slice()).max(16))?;
        Ok(RegionState {
            wire: mine.serialize(),
            buffer,
            _mine: mine,
            table,
            handles,
            peers: (0..comm.size()).map(|_| None).collect(),
        })
    }

    /// Trades region `r` (index `i`) with `wanted` (module docs), allocating it first if
    /// `slot` holds none.
    fn exchange(
        &self,
        r: Region,
        i: usize,
        slot: &mut Option<RegionState>,
        wanted: &[usize],
    ) -> Result<()> {
        let (comm, g, n) = (&self.comm, self.comm.gpu(), self.comm.size());
        let len = self.layout.region_len(r).max(16);
        let tag = REGION_TAG + i as u64;
        let mut failed = None;
        if slot.is_none() {
            match self.allocate(r) {
                Ok(s) => *slot = Some(s),
                Err(e) => {
                    tracing::warn!(region = r.name(), bytes = len, error = %e, "no scratch region");
                    failed = Some(e);
                }
            }
        }
        let msg = match slot.as_ref() {
            Some(s) => [&[1u8][..], &s.wire].concat(),
            None => vec![0],
        };
        for &q in wanted {
            comm.bootstrap().send(q, tag, &msg)?;
        }
        let mut got = Vec::with_capacity(wanted.len());
        let mut refused = None;
        for &q in wanted {
            let b = comm.recv_checked(q, tag)?;
            match b.split_first() {
                Some((1, wire)) => {
                    let m = RegisteredMemory::deserialize(wire, g, q, comm.same_node(q))?;
                    if m.size() != len {
                        return Err(Error::MalformedMemory {
                            rank: q,
                            reason: format!(
                                "its {} region holds {} bytes, this rank's {len} (another \
                             configuration?)",
                                r.name(),
                                m.size()
                            ),
                        });
                    }
                    got.push((q, m.range(0, len as u64)?, m));
                }
                Some((0, [])) => refused = refused.or(Some(q)),
                _ => {
                    return Err(Error::MalformedMemory {
                        rank: q,
                        reason: format!("a scratch region message of {} bytes", b.len()),
                    });
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some(q) = refused {
            return Err(Error::RegionUnavailable {
                region: r.name(),
                rank: q,
            });
        }
        let Some(s) = slot.as_mut() else {
            return Err(Error::RegionUnavailable {
                region: r.name(),
                rank: comm.rank(),
            });
        };
        for (q, ptr, m) in got {
            for (k, h) in s.handles.iter_mut().enumerate() {
                if k % n == q {
                    h.dst = ptr;
                }
            }
            s.peers[q] = Some(m);
        }
        s.table.copy_from_host(0, bytemuck::cast_slice(&s.handles))
    }
}
