//! `Communicator`: a rank's view of the world — its bootstrap, its device, the memories it has
//! registered, and the set-up exchanges with its peers.
//!
//! The communicator trades serializable halves between ranks and lets the lower modules build
//! the objects (MSCCL++'s `Communicator` / `Context` split):
//!
//! | call | trades | built by |
//! |---|---|---|
//! | [`send_memory`](Communicator::send_memory) / [`recv_memory`](Communicator::recv_memory) | a `RegisteredMemory`'s serialized form | `registered_memory` |
//! | [`connect`](Communicator::connect) | [`Endpoint`](crate::connection::Endpoint)s | `connection` (the transport from the local and the remote endpoint) |
//! | [`build_semaphore`](Communicator::build_semaphore) and friends | [`SemaphoreStub`]s | `semaphore` (from the local and the remote stub) |
//! | [`split`](Communicator::split) | every rank's color and key (one all-gather) | a communicator over a [`SubBootstrap`] of its group |
//! | [`node_group`](Communicator::node_group) | nothing (every member names the group) | a communicator over a [`SubBootstrap`] of the group, bound to this world's failures |
//! | [`shrink`](Communicator::shrink), [`grow`](Communicator::grow) | the new world's members (one all-gather) | a communicator over a [`SubBootstrap`] of the survivors, or over a new bootstrap with the newcomers (`crate::membership`) |
//!
//! Set-up messages travel over the bootstrap under tags in their own ranges (memory, endpoint,
//! semaphore), so user tags of each kind never collide with each other or with the
//! bootstrap's collectives. Every received message is validated before use. Both ends must make
//! their pairwise set-up calls with a peer in the same order.
//!
//! # Pairwise set-up: the same calls, in the same order, on both ends
//!
//! [`connect`](Communicator::connect), the semaphores' set-up
//! ([`build_semaphore`](Communicator::build_semaphore),
//! [`build_memory_semaphore`](Communicator::build_memory_semaphore),
//! [`build_host_semaphore`](Communicator::build_host_semaphore)) and [`send_memory`](Communicator::send_memory) /
//! [`recv_memory`](Communicator::recv_memory) each send this rank's half to the peer and then
//! (all but `send_memory`) wait for the peer's half of the same call, matched by call and tag.
//! So both ranks of a pair must make these calls in the same order with the same tags: if rank
//! 0 waits in `connect` while rank 1 waits in `recv_memory` for a memory rank 0 sends only
//! after its `connect`, each waits for the other until the bootstrap's operation deadline.
//! That wait ends in [`Error::SetupTimeout`], which names the call, the peer and the tag; two
//! calls of one kind with one tag are matched in order (the second `connect` with the peer's
//! second).
//!
//! Every bootstrap wait of a communicator watches it (a dead peer, `abort()`, a failed proxy end
//! it at once): see [`crate::health`].
//!
//! A communicator carries its rank's [`Trace`] (off unless `MSCCLPP_TRACE` is set, or
//! [`traced`](Communicator::traced) turns it on): it records the bootstrap's set-up phases,
//! and writes the rank's trace file on [`trace_dump`](Communicator::trace_dump) and when it is
//! dropped (see [`crate::trace`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mscclpp_shared::DevicePtr;

use crate::bootstrap::{Bootstrap, SubBootstrap};
use crate::connection::{Connection, Context, EndpointConfig, LocalEndpoint};
use crate::error::{Error, Result};
use crate::gpu::{DeviceBuffer, Gpu, HostMapped};
use crate::health::{Health, WorldBound};
use crate::registered_memory::{LocalMemories, RegisteredMemory};
use crate::semaphore::{
    Host2DeviceSemaphore, Host2HostSemaphore, MemoryDevice2DeviceSemaphore, RemoteSemaphoreStub,
    SemaphoreStub,
};
use crate::status::{DEFAULT_SPIN_LIMIT, StatusBlock};
use crate::topology::Topology;
use crate::trace::{Category, Trace, TraceConfig};
use crate::transport::{Transport, TransportFlags};

/// Tag range of `send_memory`/`recv_memory`.
pub const MEMORY_TAG: u64 = 1 << 60;
/// Tag range of `connect`.
pub const ENDPOINT_TAG: u64 = 2 << 60;
/// Tag range of semaphore set-up.
pub const SEMAPHORE_TAG: u64 = 3 << 60;
const USER_TAG_MASK: u64 = (1 << 60) - 1;

/// The set-up call a bootstrap tag belongs to, and the caller's tag within it.
fn setup_call(tag: u64) -> (&'static str, u64) {
    match tag & !USER_TAG_MASK {
        MEMORY_TAG => ("recv_memory", tag & USER_TAG_MASK),
        ENDPOINT_TAG => ("connect", tag & USER_TAG_MASK),
        SEMAPHORE_TAG => ("semaphore set-up", tag & USER_TAG_MASK),
        _ => ("set-up receive", tag),
    }
}

/// A rank's communicator.
pub struct Communicator {
    /// The bootstrap as handed out: its waits watch this communicator.
    bootstrap: Arc<dyn Bootstrap>,
    gpu: Gpu,
    status: Arc<StatusBlock>,
    registry: Arc<LocalMemories>,
    /// The node layout, from the bootstrap's host grouping.
    topology: Topology,
    /// The watched bootstrap and the monitor thread (joined on drop).
    health: Health,
    /// This rank's trace (off by default).
    trace: Trace,
    /// The bootstrap's and this communicator's set-up phases, kept for a trace turned on later
    /// ([`traced`](Self::traced)).
    setup: Vec<crate::bootstrap::SetupPhase>,
    /// Sub-worlds made so far ([`split`](Communicator::split),
    /// [`node_group`](Communicator::node_group)): numbers each one's tags, the same on every
    /// rank (both are collective).
    splits: AtomicU64,
    /// This rank counted on its device ([`Gpu::enter_rank`]): while other ranks of this
    /// process share it, frees wait until one is left. Dropped last.
    on_device: crate::gpu::RankOnDevice,
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // The trace first: its clock sample and read-back need nothing the monitor holds.
        if let Err(e) = self.trace.dump() {
            tracing::warn!("communicator rank {}: {e}", self.rank());
        }
        self.health.on_drop();
    }
}

impl Communicator {
    /// A communicator for this rank of `bootstrap`, using `gpu`; traced when `MSCCLPP_TRACE`
    /// says so ([`TraceConfig::from_env`]).
    pub fn new(bootstrap: Arc<dyn Bootstrap>, gpu: Gpu) -> Result<Self> {
        let started = crate::trace::now_ns();
        let on_device = gpu.enter_rank();
        let mut setup = bootstrap.setup_phases();
        let status = Arc::new(StatusBlock::new(&gpu, DEFAULT_SPIN_LIMIT)?);
        let registry = LocalMemories::new(bootstrap.rank());
        let topology = Topology::from_bootstrap(bootstrap.as_ref())?;
        let health = Health::start(bootstrap, status.clone())?;
        setup.push(crate::bootstrap::SetupPhase {
            name: "communicator",
            start_ns: started,
            end_ns: crate::trace::now_ns(),
        });
        let comm = Self {
            bootstrap: health.bootstrap(),
            gpu,
            status,
            registry,
            topology,
            health,
            trace: Trace::off(),
            setup,
            splits: AtomicU64::new(0),
            on_device,
        };
        Ok(match TraceConfig::from_env()? {
            Some(cfg) => comm.traced(cfg),
            None => comm,
        })
    }

    /// This communicator with its trace on, into `config` (the set-up phases so far are
    /// recorded at once). Replaces a trace that was on (which is dumped first).
    pub fn traced(mut self, config: TraceConfig) -> Self {
        if let Err(e) = self.trace.dump() {
            tracing::warn!("communicator rank {}: {e}", self.rank());
        }
        self.trace = Trace::new(self.rank(), self.size(), config);
        self.trace.note_gpu(&self.gpu);
        self.trace.record_setup(&self.setup);
        self
    }

    /// Ranks of this process on this communicator's device now (communicators alive on it):
    /// more than one means they share a GPU, and releases that wait for every kernel of the
    /// device are held back (`Gpu::enter_rank`).
    pub fn ranks_on_device(&self) -> usize {
        self.on_device.ranks()
    }

    /// This rank's trace (off unless `MSCCLPP_TRACE` or [`traced`](Self::traced) turned it on):
    /// what the collectives, the proxy and your own code record into.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Writes this rank's trace file now (it is also written when the communicator is
    /// dropped); returns its path, or `None` when tracing is off. Synchronize the streams
    /// first: kernels still running may be missing events.
    pub fn trace_dump(&self) -> Result<Option<std::path::PathBuf>> {
        self.trace.dump()
    }

    /// Splits this communicator (NCCL's `ncclCommSplit`): every rank calls it, and the ranks
    /// that pass the same `color` form a new communicator, ranked by `key` (ties by their rank
    /// here). `None` for `color` (NCCL's `NCCL_SPLIT_NOCOLOR`) takes part in the split and gets
    /// no communicator (`Ok(None)`).
    ///
    /// The new communicator uses the same device and this communicator's bootstrap links:
    /// its bootstrap is a [`SubBootstrap`] (no new sockets),
    /// with tags of its own. It has its own status (abort flag), registered memories and
    /// health monitor: aborting or dropping this communicator leaves it running (the links
    /// stay open while either uses them). One all-gather of 16 bytes per rank over this
    /// communicator decides the groups.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        self.check_alive()?;
        let id = self.splits.fetch_add(1, Ordering::Relaxed);
        let mut mine = [0u8; 16];
        if let Some(c) = color {
            mine[0] = 1;
            mine[4..8].copy_from_slice(&c.to_le_bytes());
        }
        mine[8..].copy_from_slice(&key.to_le_bytes());
        let all = self.bootstrap.all_gather(&mine)?;
        let Some(color) = color else {
            return Ok(None);
        };
        let mut group = Vec::new();
        for (rank, theirs) in all.iter().enumerate() {
            let b: &[u8; 16] = theirs
                .as_slice()
                .try_into()
                .map_err(|_| Error::MalformedSplit {
                    rank,
                    reason: format!("{} bytes, 16 expected", theirs.len()),
                })?;
            let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
            let their_key =
                i64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
            if b[0] == 1 && u32::from_le_bytes(word(4)) == color {
                group.push((their_key, rank));
            }
        }
        group.sort_unstable();
        let members = group.into_iter().map(|(_, r)| r).collect();
        let sub = SubBootstrap::new(self.health.unwatched(), members, id)?;
        Communicator::new(Arc::new(sub), self.gpu.clone()).map(Some)
    }

    /// The ranks `members` of this communicator (this rank among them, in the group's rank
    /// order) as a communicator of their own that is **bound to this one**: what a world of
    /// several nodes builds for the ranks of each node (the hierarchical collectives' phases
    /// inside a node). Its bootstrap is a [`SubBootstrap`] over this communicator's watched
    /// bootstrap (no new sockets, tags of its own), so its waits also watch this communicator;
    /// a rank of this world that dies (a member or not) or an abort of this communicator fails
    /// it too (its health monitor aborts its device waits), and a failure of the group makes
    /// this rank leave this world without a goodbye.
    ///
    /// No exchange: every member passes the same `members`. Collective over this
    /// communicator nonetheless: every rank calls it (each with its own group) in the same
    /// order as its [`split`](Self::split)s, which number the sub-worlds' tags alike.
    /// [`Error::BootstrapConfig`] if this rank is not a member, or a member is not a rank of
    /// this world or appears twice.
    pub fn node_group(&self, members: Vec<usize>) -> Result<Communicator> {
        self.check_alive()?;
        let id = self.splits.fetch_add(1, Ordering::Relaxed);
        let sub = SubBootstrap::new(Arc::clone(&self.bootstrap), members, id)?;
        let bound = WorldBound::new(
            Box::new(sub),
            Arc::clone(&self.bootstrap),
            Arc::clone(&self.status),
        );
        Communicator::new(Arc::new(bound), self.gpu.clone())
    }

    /// The bootstrap without this communicator's watch, and the next group number of its
    /// sub-bootstraps (what a shrink builds its world over: `crate::membership`).
    pub(crate) fn sub_world_base(&self) -> (Arc<dyn Bootstrap>, u64) {
        let id = self.splits.fetch_add(1, Ordering::Relaxed);
        (self.health.unwatched(), id)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.bootstrap.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.bootstrap.size()
    }

    /// The bootstrap, as this communicator hands it out: its receives and collectives
    /// (`recv`, `barrier`, `all_gather`, `broadcast`) watch the communicator, so a dead peer or
    /// an abort ends them at once with [`Error::Remote`] or [`Error::Aborted`] (module docs).
    /// Sends pass through unchanged.
    pub fn bootstrap(&self) -> &Arc<dyn Bootstrap> {
        &self.bootstrap
    }

    /// Waits until every rank has called `barrier` (the bootstrap's barrier, watching this
    /// communicator: see [`bootstrap`](Self::bootstrap)).
    pub fn barrier(&self) -> Result<()> {
        self.bootstrap.barrier()
    }

    /// Every rank's equal-length `data`, in rank order (the bootstrap's all-gather, watching
    /// this communicator).
    pub fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.bootstrap.all_gather(data)
    }

    /// Rank `root`'s `data` on every rank (the bootstrap's broadcast, watching this
    /// communicator).
    pub fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        self.bootstrap.broadcast(root, data)
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The abort flag and device error record every handle of this communicator carries.
    pub fn status(&self) -> &Arc<StatusBlock> {
        &self.status
    }

    /// Releases every device wait of this communicator and makes later set-up calls fail.
    pub fn abort(&self) {
        self.status.abort();
    }

    /// How long this communicator keeps running after a peer left with a goodbye before it
    /// aborts as for a dead peer ([`LEAVE_GRACE`](crate::health::LEAVE_GRACE) by default).
    pub fn set_leave_grace(&self, grace: Duration) {
        self.health.set_leave_grace(grace);
    }

    /// The sticky asynchronous error of this communicator: a dead peer (`Error::Remote`), or an
    /// abort (by `abort()` or a failed proxy).
    pub fn async_error(&self) -> Option<Error> {
        self.check_alive().err()
    }

    /// Why this communicator can do no more work, if it cannot: the status block's error (a
    /// device wait that gave up, an abort), else the sticky asynchronous error
    /// ([`async_error`](Self::async_error)).
    pub fn failure(&self) -> Option<Error> {
        self.status().error().or_else(|| self.async_error())
    }

    fn check_alive(&self) -> Result<()> {
        self.health.check()
    }

    /// Receives the set-up message `peer` sent under `tag`, within the bootstrap's operation
    /// deadline, but in slices of at most [`WATCH_SLICE`](crate::bootstrap::WATCH_SLICE) so
    /// that an abort (a dead third rank seen by the health monitor, or `abort()`) ends the wait
    /// at once instead of at the deadline (module docs). A deadline that passes is
    /// [`Error::SetupTimeout`], naming the call (from the tag's range), the peer and the tag.
    pub fn recv_checked(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.bootstrap.recv(peer, tag).map_err(|e| match e {
            Error::BootstrapTimeout { after, .. } => {
                let (op, tag) = setup_call(tag);
                Error::SetupTimeout {
                    rank: self.rank(),
                    peer,
                    op,
                    tag,
                    after,
                    source: Box::new(e),
                }
            }
            e => e,
        })
    }

    /// The node layout: nodes, local indices, same-index columns ([`Topology`]).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether `rank` runs on this rank's node.
    pub fn same_node(&self, rank: usize) -> bool {
        self.topology.same_node(rank)
    }

    /// Registers a device buffer for `transports` (its IPC handle is exported when a same-node
    /// transport is asked for).
    pub fn register_buffer(
        &self,
        buf: &DeviceBuffer,
        transports: impl Into<TransportFlags>,
    ) -> Result<RegisteredMemory> {
        self.registry.register_buffer(buf, transports.into())
    }

    /// Registers a whole allocation found by [`Gpu::allocation_of`] (memory this process
    /// allocated by any means) for the same-node transport, exporting its IPC handle.
    pub fn register_allocation(&self, a: &crate::gpu::Allocation) -> Result<RegisteredMemory> {
        let ipc = self.gpu.export_allocation(a)?;
        let local = Transport::local_for(self.gpu.kind());
        self.registry
            .register(&self.gpu, a.base, a.size, local.into(), Some(ipc))
    }

    /// Registers host-mapped memory (reachable by network transports, and by peers in this
    /// process).
    pub fn register_host(
        &self,
        mem: &HostMapped,
        transports: impl Into<TransportFlags>,
    ) -> Result<RegisteredMemory> {
        self.registry.register(
            &self.gpu,
            mem.device_ptr(),
            mem.len(),
            transports.into(),
            None,
        )
    }

    /// Registers `size` bytes at a raw device address that this process can reach (no IPC
    /// export: peers in other processes cannot map it).
    pub fn register_raw(
        &self,
        ptr: DevicePtr<u8>,
        size: usize,
        transports: impl Into<TransportFlags>,
    ) -> Result<RegisteredMemory> {
        self.registry
            .register(&self.gpu, ptr, size, transports.into(), None)
    }

    /// Sends `mem` to `remote_rank` under `tag`.
    pub fn send_memory(&self, mem: &RegisteredMemory, remote_rank: usize, tag: u64) -> Result<()> {
        self.check_alive()?;
        self.bootstrap.send(
            remote_rank,
            MEMORY_TAG | (tag & USER_TAG_MASK),
            &mem.serialize(),
        )
    }

    /// Receives the memory `remote_rank` sent under `tag`, mapped here where possible.
    pub fn recv_memory(&self, remote_rank: usize, tag: u64) -> Result<RegisteredMemory> {
        self.check_alive()?;
        let _span = self
            .trace
            .span(Category::Setup, "recv_memory")
            .arg("peer", remote_rank)
            .arg("tag", tag);
        let bytes = self.recv_checked(remote_rank, MEMORY_TAG | (tag & USER_TAG_MASK))?;
        RegisteredMemory::deserialize(&bytes, &self.gpu, remote_rank, self.same_node(remote_rank))
    }

    /// The local half of a semaphore over a connection of `transport`: this end's token words,
    /// registered for it. Its serialized form is what the peer needs
    /// ([`RemoteSemaphoreStub::deserialize`]).
    pub fn semaphore_stub(&self, transport: Transport) -> Result<SemaphoreStub> {
        SemaphoreStub::new(&self.gpu, &self.registry, transport)
    }

    /// Makes the local half of a semaphore over `conn` and trades it with the peer under `tag`.
    fn trade_semaphore_stubs(
        &self,
        conn: &dyn Connection,
        tag: u64,
    ) -> Result<(SemaphoreStub, RemoteSemaphoreStub)> {
        let local = self.semaphore_stub(conn.transport())?;
        let peer = conn.remote_rank();
        let tag = SEMAPHORE_TAG | (tag & USER_TAG_MASK);
        self.bootstrap.send(peer, tag, &local.serialize())?;
        let bytes = self.recv_checked(peer, tag)?;
        let remote =
            RemoteSemaphoreStub::deserialize(&bytes, &self.gpu, peer, self.same_node(peer))?;
        Ok((local, remote))
    }

    /// Builds the semaphore a peer's proxy signals through `conn` and a GPU of this rank waits
    /// on (PortChannel); the peer calls it with the same `tag`.
    pub fn build_semaphore(
        &self,
        conn: Arc<dyn Connection>,
        tag: u64,
    ) -> Result<Host2DeviceSemaphore> {
        let (local, remote) = self.trade_semaphore_stubs(conn.as_ref(), tag)?;
        Host2DeviceSemaphore::new(local, remote, conn, self.status.clone())
    }

    /// Builds a GPU↔GPU semaphore over a same-node `conn` (MemoryChannel); the peer calls it
    /// with the same `tag`.
    pub fn build_memory_semaphore(
        &self,
        conn: &dyn Connection,
        tag: u64,
    ) -> Result<MemoryDevice2DeviceSemaphore> {
        let (local, remote) = self.trade_semaphore_stubs(conn, tag)?;
        MemoryDevice2DeviceSemaphore::new(local, remote, self.status.clone())
    }

    /// Builds a semaphore between two host threads or processes over `conn` (CPU backend, or a
    /// network transport that writes host memory); the peer calls it with the same `tag`.
    pub fn build_host_semaphore(
        &self,
        conn: Arc<dyn Connection>,
        tag: u64,
    ) -> Result<Host2HostSemaphore> {
        let (local, remote) = self.trade_semaphore_stubs(conn.as_ref(), tag)?;
        Host2HostSemaphore::new(local, remote, conn)
    }

    /// Connects to `remote_rank` (which calls `connect` with this rank and the same tag): the
    /// two ranks trade endpoints, and `connection` builds the transport from both.
    pub fn connect(
        &self,
        config: EndpointConfig,
        remote_rank: usize,
        tag: u64,
    ) -> Result<Arc<dyn Connection>> {
        self.check_alive()?;
        let _span = self
            .trace
            .span(Category::Setup, "connect")
            .arg("peer", remote_rank)
            .arg("tag", tag);
        if remote_rank >= self.size() {
            return Err(Error::NoSuchRank {
                rank: remote_rank,
                size: self.size(),
            });
        }
        let ctx = Context {
            rank: self.rank(),
            gpu: &self.gpu,
            registry: &self.registry,
            status: &self.status,
            secret: self.bootstrap.secret(),
        };
        // Network transports prepare before the endpoints cross (a listener, a queue pair); a
        // local failure travels in the endpoint, so the peer fails at once with this rank's
        // reason rather than waiting.
        let local = LocalEndpoint::prepare(&ctx, config, remote_rank);
        let tag = ENDPOINT_TAG | (tag & USER_TAG_MASK);
        self.bootstrap
            .send(remote_rank, tag, &local.endpoint().serialize())?;
        let bytes = self.recv_checked(remote_rank, tag)?;
        let theirs = crate::connection::Endpoint::deserialize(&bytes, remote_rank)?;
        let built = local.connect(&ctx, &theirs, self.same_node(remote_rank))?;
        if built.exchange_ready {
            self.bootstrap.send(remote_rank, tag, b"RTS")?;
            self.recv_checked(remote_rank, tag)?;
        }
        Ok(built.connection)
    }
}
