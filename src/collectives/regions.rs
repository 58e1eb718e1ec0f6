//! The scratch regions allocated on first use (`scratch.rs` says which): each a buffer of its own
//! that every peer maps, with a channel table of its own whose channels point at the peers'
//! buffers of that region (the semaphores are the set-up table's, so the kernels' barriers are
//! unchanged).
//!
//! # The first call that needs a region
//!
//! Every rank runs the same algorithm for the same call, so every rank comes here at the same
//! call: it allocates its buffer, registers it, and sends every peer one bootstrap message under
//! the region's tag (`REGION_TAG + region`):
//!
//! `ok u8 | the registration's wire form (when ok = 1)`
//!
//! then receives every peer's and maps them. A rank that cannot allocate or register sends
//! `ok = 0`; every rank then fails the call with [`Error::RegionUnavailable`] (naming the first
//! rank that could not), and the region stays unallocated on every rank (a later call tries
//! again, alike everywhere). Nothing is queued before the exchange completes, so no kernel
//! waits on a rank that failed.
//!
//! # Under CUDA-graph capture
//!
//! Allocating and waiting for peers have no place in a capture: a call captured before the
//! region exists does not take the algorithms that need it (the dispatch asks
//! [`LazyRegions::is_ready`]); `Collectives::prepare` allocates every region beforehand.
//!
//! Shared state: each region's slot (a mutex, held through the exchange so that two threads
//! of one rank never allocate one region twice; written once, read by every call that uses
//! the region).

use std::sync::{Arc, Mutex};

use mscclpp_host::gpu::DeviceBuffer;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{DevicePtr, MemoryChannelDeviceHandle};

use super::context::Context;
use super::scratch::{Region, ScratchLayout};

/// Bootstrap tag of the exchanges (plus the region's index).
const REGION_TAG: u64 = 0x0d1_e600_0000;

/// The regions allocated on first use.
const LAZY: [Region; 2] = [Region::Ll128, Region::Staging];

/// One region's buffer, its channel table, and the peers' buffers mapped here.
pub(crate) struct RegionBuf {
    /// This rank's buffer of the region.
    pub buffer: DeviceBuffer,
    /// `max_blocks * nranks` channel handles pointing at the peers' buffers of the region.
    pub table: DeviceBuffer,
    _mine: RegisteredMemory,
    _peers: Vec<RegisteredMemory>,
}

/// The regions allocated on first use, by [`LAZY`] index.
#[derive(Default)]
pub(crate) struct LazyRegions {
    slots: [Mutex<Option<Arc<RegionBuf>>>; LAZY.len()],
}

fn index(r: Region) -> Option<usize> {
    LAZY.iter().position(|&l| l == r)
}

impl LazyRegions {
    /// Whether calls that need `r` can run without allocating (the region exists, is not
    /// allocated on first use, or no algorithm asked for it).
    pub fn is_ready(&self, r: Region, layout: &ScratchLayout) -> bool {
        match index(r) {
            Some(i) => layout.region_len(r) == 0 || self.lock(i).is_some(),
            None => true,
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

    fn lock(&self, i: usize) -> std::sync::MutexGuard<'_, Option<Arc<RegionBuf>>> {
        self.slots[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Region `r` (allocated on first use: module docs); `None` for a region that is not
    /// allocated on first use.
    pub fn get(&self, cx: &Context, r: Region) -> Result<Option<Arc<RegionBuf>>> {
        let Some(i) = index(r) else {
            return Ok(None);
        };
        let mut slot = self.lock(i);
        if let Some(b) = slot.as_ref() {
            return Ok(Some(b.clone()));
        }
        let b = Arc::new(exchange(cx, r, i)?);
        *slot = Some(b.clone());
        Ok(Some(b))
    }
}

/// The first call's exchange of region `r` (module docs).
fn exchange(cx: &Context, r: Region, i: usize) -> Result<RegionBuf> {
    let (comm, n, me) = (&cx.comm, cx.ranks(), cx.rank());
    let g = comm.gpu();
    let len = cx.layout.region_len(r).max(16);
    let tag = REGION_TAG + i as u64;
    let mine = g.alloc(len).and_then(|b| {
        let reg = comm.register_buffer(&b, Transport::local_for(g.kind()))?;
        Ok((b, reg))
    });
    let msg = match &mine {
        Ok((_, reg)) => [&[1u8][..], &reg.serialize()].concat(),
        Err(e) => {
            tracing::warn!(region = r.name(), bytes = len, error = %e, "no scratch region");
            vec![0]
        }
    };
    for q in cx.others() {
        comm.bootstrap().send(q, tag, &msg)?;
    }
    let mut peers: Vec<Option<(DevicePtr<u8>, RegisteredMemory)>> = (0..n).map(|_| None).collect();
    let mut refused = None;
    for q in cx.others() {
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
                peers[q] = Some((m.range(0, len as u64)?, m));
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
    let (buffer, reg) = match (mine, refused) {
        (Ok(x), None) => x,
        (Err(e), _) => return Err(e),
        (Ok(_), Some(q)) => {
            return Err(Error::RegionUnavailable {
                region: r.name(),
                rank: q,
            });
        }
    };
    let mut handles: Vec<MemoryChannelDeviceHandle> = cx.handles().to_vec();
    for (k, h) in handles.iter_mut().enumerate() {
        if let Some((peer, _)) = &peers[k % n]
            && k % n != me
        {
            h.dst = *peer;
            h.src = buffer.ptr();
            h.packet_buffer = buffer.ptr();
        }
    }
    let table = g.alloc(std::mem::size_of_val(handles.as_slice()))?;
    table.copy_from_host(0, bytemuck::cast_slice(&handles))?;
    Ok(RegionBuf {
        buffer,
        table,
        _mine: reg,
        _peers: peers.into_iter().flatten().map(|(_, m)| m).collect(),
    })
}
