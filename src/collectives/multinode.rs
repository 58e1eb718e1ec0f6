//! Set-up of collectives on a world of several nodes: the transport to every peer, the port
//! region and its PortChannels (two per peer: data and acknowledgement, over one connection),
//! the proxy that serves them, and, when every node runs the same number of ranks, the node
//! communicator and the collectives of the node's world that the hierarchical all-reduce uses
//! for its phases inside the node.
//!
//! The world composes: [`MultiNode`] holds the node's collectives as a [`NodeWorld`], a trait
//! defined here and implemented by `Collectives` above (whose set-up builds it, through the
//! constructor [`wire`] is given), so nothing here or below imports the top of the tree.
//!
//! # Transports
//!
//! A peer on this node is reached over the backend's same-node transport (CUDA IPC, shared
//! memory): its proxy copies with the copy engine. A peer on another node over the first of
//! `Ofi`, `Ib(0)`, `Ethernet` that both ranks offer. A rank offers what this build and machine
//! can use ([`network_transports`]: libfabric when it loads and lists a usable provider,
//! InfiniBand with the `ib` feature and a device, Ethernet always), or only the one
//! `MSCCLPP_NET_TRANSPORT` (`ofi`, `ib`, `ethernet`) names; the offers cross in one all-gather,
//! so both ends of a pair choose alike. No common transport is
//! [`Error::NoCommonTransport`].
//!
//! # Order of the set-up (every rank the same)
//!
//! The offers' all-gather; the scratch, registered for every transport in use; per peer (in
//! rank order) `connect` and `send_memory` of the scratch (tag `PORT_TAG`); per peer
//! `recv_memory`; per peer the data and acknowledgement semaphores (tags `PORT_TAG + 1`, `+ 2`);
//! the proxy starts; a barrier; then, on uniform worlds with more than one rank per node, the
//! node communicator and its `Collectives` (collective over the node's ranks only).
//!
//! Device words: the channel table (`2 n` handles, written once here before the barrier, read
//! by every port kernel) and the piece counters (`2 n` u64, zeroed here, then written and read
//! only by the port kernel's thread 0: `PortCollectiveParams`).

use std::sync::Arc;

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::{Connection, EndpointConfig};
use mscclpp_host::gpu::DeviceBuffer;
use mscclpp_host::gpu::Stream;
use mscclpp_host::port_channel::PortChannelService;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::topology::Topology;
use mscclpp_host::transport::{Transport, TransportFlags};
use mscclpp_host::{Error, Result};
use mscclpp_shared::{DEFAULT_FIFO_SIZE, MAX_PORT_RANKS, PortChannelDeviceHandle};

use super::call::Call;
use super::node_bootstrap::NodeBootstrap;
use super::scratch::ScratchLayout;

/// The collectives of this rank's node, as a world of its own (module docs): what the
/// hierarchical all-reduce queues its node phases on.
pub(crate) trait NodeWorld: Send + Sync {
    /// Queues `call` on the node's world, its algorithm chosen there.
    ///
    /// # Safety
    /// As `Collectives::queue`: the buffers hold what the call moves until the work queued on
    /// `stream` completes; every rank of the node makes the same call.
    unsafe fn queue(&self, call: &Call, stream: &Stream) -> Result<()>;
}

/// What builds the node's world from the node communicator (`Collectives::with_config`).
pub(crate) type NodeBuilder<'a> = &'a dyn Fn(Arc<Communicator>) -> Result<Box<dyn NodeWorld>>;

const PORT_TAG: u64 = 0x9a_0000;

/// Environment variable forcing the transport between nodes: `ofi`, `ib` or `ethernet`.
pub const ENV_NET_TRANSPORT: &str = "MSCCLPP_NET_TRANSPORT";

/// What collectives on a world of several nodes use besides the common context.
pub(crate) struct MultiNode {
    /// The node communicator's collectives (uniform worlds with more than one rank per node);
    /// dropped first.
    pub node: Option<Box<dyn NodeWorld>>,
    /// The proxy serving the port channels (stopped before the connections go).
    pub service: Option<PortChannelService>,
    /// `2 n` PortChannel handles.
    pub table: DeviceBuffer,
    /// `2 n` piece counters.
    pub counters: DeviceBuffer,
    pub topology: Topology,
    /// Ranks per node when every node has as many.
    pub uniform: Option<usize>,
    /// The transport to every rank (`None` for this one).
    pub transports: Vec<Option<Transport>>,
    pub connections: Vec<Arc<dyn Connection>>,
    _peers: Vec<RegisteredMemory>,
    _scratch: RegisteredMemory,
}

impl Drop for MultiNode {
    fn drop(&mut self) {
        self.node.take();
        if let Some(s) = self.service.take()
            && let Err(e) = s.stop()
        {
            tracing::debug!("collectives: the port proxy had failed: {e}");
        }
    }
}

impl MultiNode {
    /// Payload bytes sent to other nodes over `transport` by this rank's connections so far
    /// (what the tests read to see that traffic crossed it).
    pub(crate) fn bytes_sent(&self, transport: Transport) -> u64 {
        self.connections
            .iter()
            .filter(|c| c.transport() == transport)
            .map(|c| c.bytes_sent())
            .sum()
    }
}

/// The network transports this build and machine can use, best first (module docs).
pub fn network_transports() -> Vec<Transport> {
    let mut out = Vec::new();
    if mscclpp_host::connection::ofi::usable().is_ok() {
        out.push(Transport::Ofi);
    }
    if mscclpp_host::connection::ib_usable() {
        out.push(Transport::Ib(0));
    }
    out.push(Transport::Ethernet);
    out
}

/// What this rank offers between nodes: `MSCCLPP_NET_TRANSPORT`'s transport, else
/// [`network_transports`].
fn offered() -> Result<TransportFlags> {
    match std::env::var(ENV_NET_TRANSPORT)
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "ofi" | "libfabric" => Ok(Transport::Ofi.into()),
            "ib" | "infiniband" => Ok(Transport::Ib(0).into()),
            "ethernet" | "tcp" => Ok(Transport::Ethernet.into()),
            _ => Err(Error::UnknownNetTransport { value: v }),
        },
        None => Ok(network_transports()
            .into_iter()
            .fold(TransportFlags::empty(), TransportFlags::with)),
    }
}

/// The transport to every rank (module docs), from one all-gather of the offers.
fn choose_transports(comm: &Communicator, topo: &Topology) -> Result<Vec<Option<Transport>>> {
    let mine = offered()?;
    let all = comm.all_gather(&mine.bits().to_le_bytes())?;
    let local = Transport::local_for(comm.gpu().kind());
    let mut out = Vec::with_capacity(all.len());
    for (q, theirs) in all.iter().enumerate() {
        let theirs = theirs
            .get(..4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .and_then(TransportFlags::from_bits)
            .ok_or(Error::NoCommonTransport {
                remote_rank: q,
                mine: mine.bits(),
                theirs: 0,
            })?;
        let t = if q == comm.rank() {
            None
        } else if topo.same_node(q) {
            Some(local)
        } else {
            let best = [Transport::Ofi, Transport::Ib(0), Transport::Ethernet]
                .into_iter()
                .find(|&t| mine.has(t) && theirs.has(t));
            Some(best.ok_or(Error::NoCommonTransport {
                remote_rank: q,
                mine: mine.bits(),
                theirs: theirs.bits(),
            })?)
        };
        out.push(t);
    }
    Ok(out)
}

/// Wires a world of several nodes (module docs): returns the scratch and what the port and
/// hierarchical algorithms need; `build_node` builds the node's collectives.
pub(crate) fn wire(
    comm: &Arc<Communicator>,
    layout: &ScratchLayout,
    build_node: NodeBuilder<'_>,
) -> Result<(DeviceBuffer, MultiNode)> {
    let (rank, n) = (comm.rank(), comm.size());
    if n > MAX_PORT_RANKS {
        return Err(Error::Unsupported {
            what: "collectives across nodes on more than 64 ranks",
            backend: comm.gpu().kind(),
        });
    }
    let topology = comm.topology().clone();
    let transports = choose_transports(comm, &topology)?;
    let g = comm.gpu().clone();
    let scratch = g.alloc(layout.len())?;
    let flags = transports
        .iter()
        .flatten()
        .fold(TransportFlags::empty(), |f, t| f.with(*t));
    let reg = comm.register_buffer(&scratch, flags)?;
    let mut connections: Vec<Option<Arc<dyn Connection>>> = vec![None; n];
    for (q, slot) in connections.iter_mut().enumerate() {
        if let Some(t) = transports[q] {
            *slot = Some(comm.connect(EndpointConfig::new(t), q, PORT_TAG)?);
            comm.send_memory(&reg, q, PORT_TAG)?;
        }
    }
    let mut peers: Vec<Option<RegisteredMemory>> = vec![None; n];
    for (q, slot) in peers.iter_mut().enumerate() {
        if q != rank {
            *slot = Some(comm.recv_memory(q, PORT_TAG)?);
        }
    }
    let mut builder = PortChannelService::builder(&g, comm.status(), DEFAULT_FIFO_SIZE)?;
    let own = builder.add_memory(reg.clone())?;
    let mut table = vec![PortChannelDeviceHandle::default(); 2 * n];
    for q in 0..n {
        let (Some(conn), Some(peer)) = (&connections[q], &peers[q]) else {
            continue;
        };
        let dst = builder.add_memory(peer.clone())?;
        for k in 0..2 {
            let sem = comm.build_semaphore(Arc::clone(conn), PORT_TAG + 1 + k as u64)?;
            let id = builder.add_semaphore(sem)?;
            table[2 * q + k] = builder.port_channel(id, dst, own)?;
        }
    }
    let table_buf = g.alloc(std::mem::size_of_val(table.as_slice()))?;
    table_buf.copy_from_host(0, bytemuck::cast_slice(&table))?;
    let counters = g.alloc(16 * n)?;
    counters.copy_from_host(0, &vec![0u8; 16 * n])?;
    let service = builder.start()?;
    comm.bootstrap().barrier()?;
    let uniform = topology.uniform().ok();
    let node = match uniform {
        Some(l) if l > 1 => {
            let members = topology.local_ranks().to_vec();
            let nb = NodeBootstrap::new(
                Arc::clone(comm.bootstrap()),
                Arc::clone(comm.status()),
                members,
            )
            .ok_or(Error::NoNodeLayout { rank })?;
            let node_comm = Arc::new(Communicator::new(Arc::new(nb), g.clone())?);
            Some(build_node(node_comm)?)
        }
        _ => None,
    };
    Ok((
        scratch,
        MultiNode {
            node,
            service: Some(service),
            table: table_buf,
            counters,
            topology,
            uniform,
            transports,
            connections: connections.into_iter().flatten().collect(),
            _peers: peers.into_iter().flatten().collect(),
            _scratch: reg,
        },
    ))
}
