//! What `Collectives::with_config` does before any algorithm runs: the check every rank makes
//! alike (the same configuration; who shares a GPU is `sharing.rs`), and the wiring of a world of one node
//! (of several: `multinode.rs`, through [`wire_nodes`]): the scratch
//! buffer every peer maps (laid out by `ScratchLayout`), a connection to every peer, and one
//! row of MemoryChannels (one per peer) for each block the kernels may use, in a device
//! table.
//!
//! Every rank makes the same bootstrap calls in the same order: the settings' and the GPUs'
//! (`sharing.rs`) all-gathers, then per peer `connect` and `send_memory` (tag `SCRATCH_TAG`), then per peer
//! `recv_memory`, then per row and peer a semaphore (tag `SEMAPHORE_TAG + row`), then a
//! barrier.

use std::sync::{Arc, Mutex, Weak};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::{Connection, EndpointConfig};
use mscclpp_host::gpu::{BackendKind, Gpu, Module};
use mscclpp_host::memory_channel::MemoryChannel;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::MemoryChannelDeviceHandle;

use super::config::CollectiveConfig;
use super::context::Wiring;
use super::multinode::{self, NodeBuilder};
use super::scratch::ScratchLayout;

const SCRATCH_TAG: u64 = 0x5c_0000;

/// The built-in kernels' modules by device, shared by every `Collectives` on one (a split's
/// collectives reuse their parent's): a mutex, written when a module is loaded, read at every
/// set-up. Weak, so the module unloads with the last `Collectives` of its device.
#[allow(clippy::type_complexity)]
static MODULES: Mutex<Vec<((BackendKind, usize), Weak<Module>)>> = Mutex::new(Vec::new());

/// The built-in kernels' module of `g`'s device (`crate::DEVICE_PTX`), loaded once per device
/// while any `Collectives` on it lives. Loading is what set-up spends most of its time on
/// without this (the CUDA driver compiles the PTX; the CPU backend reads its entry points).
pub(crate) fn builtin_module(g: &Gpu) -> Result<Arc<Module>> {
    let key = (g.kind(), g.ordinal());
    let mut modules = mscclpp_host::sync::lock(&MODULES);
    modules.retain(|(_, m)| m.strong_count() > 0);
    if let Some(m) = modules
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, m)| m.upgrade())
    {
        return Ok(m);
    }
    let m = Arc::new(g.load_ptx(crate::DEVICE_PTX)?);
    modules.push((key, Arc::downgrade(&m)));
    Ok(m)
}
const SEMAPHORE_TAG: u64 = 0x5e_0000;

/// Bytes of the LL flags' words (`CollectiveParams::ll_flags`: the LL kernels' two, then the
/// gate word, and one spare).
const LL_FLAGS_BYTES: usize = 32;

/// The wiring of a world of several nodes: the port region's scratch and the port channels
/// (`multinode.rs`; `node` builds the node's world); no MemoryChannels (their table is left
/// empty).
pub(super) fn wire_nodes(
    comm: &Arc<Communicator>,
    layout: &ScratchLayout,
    node: NodeBuilder<'_>,
) -> Result<Wiring> {
    let (scratch, multi) = multinode::wire(comm, layout, node)?;
    let g = comm.gpu();
    let channel_table = g.alloc(16)?;
    let ll_flags = g.alloc(LL_FLAGS_BYTES)?;
    ll_flags.copy_from_host(0, &[0; LL_FLAGS_BYTES])?;
    Ok(Wiring {
        multi: Some(multi),
        scratch,
        channel_table,
        handles: Vec::new(),
        ll_flags,
        channels: Vec::new(),
        peers: Vec::new(),
        connections: Vec::new(),
    })
}

/// Refuses a configuration that differs from any other rank's (`Error::ConfigMismatch` naming
/// the first setting that differs and the rank), by one all-gather of every setting. A peer's
/// answer of the wrong length counts as a mismatch.
pub(super) fn check_same_config(comm: &Communicator, cfg: &CollectiveConfig) -> Result<()> {
    let settings = cfg.settings();
    let mine: Vec<u8> = settings.iter().flat_map(|(_, v)| v.to_le_bytes()).collect();
    for (rank, theirs) in comm.all_gather(&mine)?.iter().enumerate() {
        if theirs.len() != mine.len() {
            return Err(Error::ConfigMismatch {
                what: "the size of the collectives' settings (bytes)",
                mine: mine.len() as u64,
                rank,
                theirs: theirs.len() as u64,
            });
        }
        for (&(what, v), b) in settings.iter().zip(theirs.chunks_exact(8)) {
            let t = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            if t != v {
                return Err(Error::ConfigMismatch {
                    what,
                    mine: v,
                    rank,
                    theirs: t,
                });
            }
        }
    }
    Ok(())
}

/// Allocates the scratch (`layout`), connects to every peer, maps their scratch and builds
/// `cfg.max_blocks` rows of channels in a device table; ends with a barrier.
pub(super) fn wire(
    comm: &Arc<Communicator>,
    cfg: &CollectiveConfig,
    layout: &ScratchLayout,
) -> Result<Wiring> {
    let (rank, n) = (comm.rank(), comm.size());
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let scratch = g.alloc(layout.len())?;
    let reg = comm.register_buffer(&scratch, t)?;
    let mut connections: Vec<Option<Arc<dyn Connection>>> = vec![None; n];
    for (q, slot) in connections.iter_mut().enumerate() {
        if q != rank {
            *slot = Some(comm.connect(EndpointConfig::new(t), q, SCRATCH_TAG)?);
            comm.send_memory(&reg, q, SCRATCH_TAG)?;
        }
    }
    let mut peers: Vec<Option<RegisteredMemory>> = vec![None; n];
    for (q, slot) in peers.iter_mut().enumerate() {
        if q != rank {
            *slot = Some(comm.recv_memory(q, SCRATCH_TAG)?);
        }
    }
    let mut channels = Vec::new();
    let mut table = vec![MemoryChannelDeviceHandle::default(); cfg.max_blocks as usize * n];
    for b in 0..cfg.max_blocks as usize {
        for q in 0..n {
            let (Some(conn), Some(peer)) = (&connections[q], &peers[q]) else {
                continue;
            };
            let sem = comm.build_memory_semaphore(conn.as_ref(), SEMAPHORE_TAG + b as u64)?;
            let ch = MemoryChannel::new(sem, peer.clone(), scratch.ptr(), scratch.ptr())?;
            table[b * n + q] = ch.device_handle()?;
            channels.push(ch);
        }
    }
    let channel_table = g.alloc(std::mem::size_of_val(table.as_slice()))?;
    let ll_flags = g.alloc(LL_FLAGS_BYTES)?;
    ll_flags.copy_from_host(0, &[0; LL_FLAGS_BYTES])?;
    channel_table.copy_from_host(0, bytemuck::cast_slice(&table))?;
    comm.bootstrap().barrier()?;
    Ok(Wiring {
        multi: None,
        scratch,
        channel_table,
        handles: table,
        ll_flags,
        channels,
        peers: peers.into_iter().flatten().collect(),
        connections: connections.into_iter().flatten().collect(),
    })
}
