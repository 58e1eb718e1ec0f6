//! `Communicator`: a rank's view of the world — its bootstrap, its device, the memories it has
//! registered and the connections it has made.
//!
//! Set-up messages travel over the bootstrap under tags in their own ranges (memory, endpoint,
//! semaphore), so user tags of each kind never collide with each other or with the
//! bootstrap's collectives. Every received message is validated before use.
//!
//! # Pairwise set-up: the same calls, in the same order, on both ends
//!
//! [`connect`](Communicator::connect), the semaphores' set-up
//! ([`build_semaphore`](Communicator::build_semaphore),
//! [`build_memory_semaphore`](Communicator::build_memory_semaphore) and the semaphore types'
//! `new`) and [`send_memory`](Communicator::send_memory) /
//! [`recv_memory`](Communicator::recv_memory) each send this rank's half to the peer and then
//! (all but `send_memory`) wait for the peer's half of the same call, matched by call and tag.
//! So both ranks of a pair must make these calls in the same order with the same tags: if rank
//! 0 waits in `connect` while rank 1 waits in `recv_memory` for a memory rank 0 sends only
//! after its `connect`, each waits for the other until the bootstrap's operation deadline.
//! That wait ends in [`Error::SetupTimeout`], which names the call, the peer and the tag; two
//! calls of one kind with one tag are matched in order (the second `connect` with the peer's
//! second).
//!
//! # Waits watch the communicator
//!
//! Every bootstrap wait of a communicator — its set-up receives ([`Communicator::recv_checked`])
//! and every receive or collective through [`Communicator::bootstrap`] (`barrier`,
//! `all_gather`, `broadcast`, `recv`) — waits in slices of at most
//! [`WATCH_SLICE`](crate::bootstrap::WATCH_SLICE) and checks the communicator between them. So
//! once the health monitor has seen a dead peer, or `abort()` was called (or a proxy failed),
//! the wait ends at once with the communicator's error ([`Error::Remote`] naming the dead rank,
//! or [`Error::Aborted`]) instead of waiting for a live but slow rank or the bootstrap's
//! operation deadline. A bootstrap failure caused by a dead peer is reported the same way.
//!
//! # Registry of network-writable memories
//!
//! Network transports (`Ethernet`, `Ib`) write into this rank's memory on behalf of a peer, which
//! names the destination only by its `local_id`. The communicator therefore keeps a registry
//! (`LocalMemories`): id → (address, size, transports) of every memory registered here for a
//! network transport. A receiver looks the id up, checks the range against it and copies while
//! holding the registry's read lock. The entry belongs to the [`RegisteredMemory`] (and its
//! clones): when the last clone is dropped the entry is removed under the write lock, so once
//! that drop returns no receiver writes into the memory any more. Dropping the underlying buffer
//! while a `RegisteredMemory` of it is still alive is the caller's error (as for every
//! transport): a peer could still write there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use mscclpp_shared::DevicePtr;

use crate::bootstrap::{Bootstrap, Watch};
use crate::connection::ethernet::{self, EthernetConnection};
use crate::connection::p2p::P2pConnection;
use crate::connection::{Connection, Endpoint, EndpointConfig};
use crate::error::{Error, Result};
use crate::gpu::{DeviceBuffer, Gpu, HostMapped};
use crate::registered_memory::RegisteredMemory;
use crate::status::{DEFAULT_SPIN_LIMIT, StatusBlock};
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

/// A memory registered on this rank for a network transport: what a receiver may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalMemory {
    /// Its address in this process (device memory or host-mapped memory of this rank's GPU).
    pub ptr: DevicePtr<u8>,
    /// Its size in bytes.
    pub size: usize,
    /// The transports it was registered for.
    pub transports: TransportFlags,
}

/// The communicator's registry of network-writable memories, by `local_id` (see the module
/// docs).
#[derive(Debug, Default)]
pub(crate) struct LocalMemories {
    map: RwLock<HashMap<u32, LocalMemory>>,
}

impl LocalMemories {
    /// Adds `mem` under `id`; the returned guard removes it when dropped.
    pub(crate) fn insert(self: &Arc<Self>, id: u32, mem: LocalMemory) -> Registration {
        self.map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, mem);
        Registration {
            registry: Arc::clone(self),
            id,
        }
    }

    /// The registry, read-locked: memories stay registered (and alive) while the guard is held.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HashMap<u32, LocalMemory>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A memory's entry in [`LocalMemories`]; held by its `RegisteredMemory`, removed on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    registry: Arc<LocalMemories>,
    id: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry
            .map
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Whether a memory registered for `transports` may be written by peers over the network.
fn network_writable(transports: TransportFlags) -> bool {
    transports.has(Transport::Ethernet) || (0..8).any(|i| transports.has(Transport::Ib(i)))
}

/// A rank's communicator.
pub struct Communicator {
    /// The bootstrap as handed out: its waits watch this communicator.
    bootstrap: Arc<dyn Bootstrap>,
    /// The same, typed (for [`WatchedBootstrap::blame`]).
    watched: Arc<WatchedBootstrap>,
    gpu: Gpu,
    status: Arc<StatusBlock>,
    next_memory_id: AtomicU32,
    local_memories: Arc<LocalMemories>,
    /// Held for its `Drop` (which stops and joins the monitor thread).
    _health: HealthMonitor,
}

impl Drop for Communicator {
    /// A communicator that failed on its own (aborted, or a device wait gave up, with no dead
    /// peer to blame), or one dropped while its thread panics, makes its bootstrap close
    /// without a goodbye, so that the peers abort at once instead of after [`LEAVE_GRACE`].
    /// (After a dead peer, the peers see that peer's death themselves.)
    fn drop(&mut self) {
        let failed = self.watched.alive.dead().is_none()
            && (self.status.is_aborted() || self.status.error().is_some());
        if failed || std::thread::panicking() {
            self.watched.inner.forgo_goodbye();
        }
    }
}

/// What a communicator's waits check: the peer the health monitor found dead (sticky) and the
/// abort flag.
#[derive(Clone)]
struct Alive {
    dead: Arc<std::sync::Mutex<Option<(usize, String)>>>,
    status: Arc<StatusBlock>,
    /// The health monitor's grace for a peer that left, in milliseconds ([`LEAVE_GRACE`]
    /// unless [`Communicator::set_leave_grace`] changed it).
    leave_grace_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Alive {
    fn dead(&self) -> Option<(usize, String)> {
        self.dead.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `Error::Remote` for a dead peer, `Error::Aborted` for an abort, else `Ok`.
    fn check(&self) -> Result<()> {
        if let Some((rank, reason)) = self.dead() {
            return Err(Error::Remote { rank, reason });
        }
        if self.status.is_aborted() {
            return Err(Error::Aborted {
                reason: "abort() was called or a proxy failed".into(),
            });
        }
        Ok(())
    }
}

/// The bootstrap as a communicator hands it out ([`Communicator::bootstrap`]): sends pass
/// through; receives and collectives are the inner bootstrap's watched variants, checking the
/// communicator between slices (module docs).
struct WatchedBootstrap {
    inner: Arc<dyn Bootstrap>,
    alive: Alive,
}

impl WatchedBootstrap {
    /// Runs the wait `op` with the communicator as its watch; fails at once if the
    /// communicator has already failed.
    fn watched<T>(&self, op: impl FnOnce(Watch<'_>) -> Result<T>) -> Result<T> {
        self.alive.check()?;
        let watch = || self.alive.check();
        op(&watch).map_err(|e| self.blame(e))
    }

    /// A failed wait's error as the communicator reports it: a bootstrap failure about a peer
    /// (closed, timed out, I/O) becomes the communicator's error when it has one, or
    /// `Error::Remote` naming the peer whose link went down first when the bootstrap knows one.
    fn blame(&self, e: Error) -> Error {
        if !matches!(
            e,
            Error::BootstrapPeerClosed { .. }
                | Error::BootstrapTimeout { .. }
                | Error::BootstrapIo { .. }
        ) {
            return e;
        }
        if let Err(a) = self.alive.check() {
            return a;
        }
        match self.inner.dead_peer() {
            Some((rank, reason)) => Error::Remote { rank, reason },
            None => e,
        }
    }
}

impl Bootstrap for WatchedBootstrap {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn ranks_per_node(&self) -> usize {
        self.inner.ranks_per_node()
    }
    fn node_of(&self, rank: usize) -> Option<usize> {
        self.inner.node_of(rank)
    }
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.inner.send(peer, tag, data)
    }
    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        let timeout = self.inner.op_timeout();
        self.watched(|w| self.inner.recv_watched(peer, tag, timeout, w))
    }
    fn recv_timeout(&self, peer: usize, tag: u64, timeout: std::time::Duration) -> Result<Vec<u8>> {
        self.watched(|w| self.inner.recv_watched(peer, tag, timeout, w))
    }
    fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.watched(|w| self.inner.all_gather_watched(data, w))
    }
    fn barrier(&self) -> Result<()> {
        self.watched(|w| self.inner.barrier_watched(w))
    }
    fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        self.watched(|w| self.inner.broadcast_watched(root, data, w))
    }
    fn op_timeout(&self) -> std::time::Duration {
        self.inner.op_timeout()
    }
    fn dead_peer(&self) -> Option<(usize, String)> {
        self.inner.dead_peer()
    }
    fn left_peer(&self) -> Option<(usize, std::time::Duration)> {
        self.inner.left_peer()
    }
    fn forgo_goodbye(&self) {
        self.inner.forgo_goodbye()
    }
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: std::time::Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        self.watched(|w| {
            let both = || w().and_then(|()| watch());
            self.inner.recv_watched(peer, tag, timeout, &both)
        })
    }
    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        self.watched(|w| {
            let both = || w().and_then(|()| watch());
            self.inner.barrier_watched(&both)
        })
    }
    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        self.watched(|w| {
            let both = || w().and_then(|()| watch());
            self.inner.all_gather_watched(data, &both)
        })
    }
    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        self.watched(|w| {
            let both = || w().and_then(|()| watch());
            self.inner.broadcast_watched(root, data, &both)
        })
    }
}

/// How often the health monitor looks at the bootstrap links.
pub const HEALTH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// How long a communicator keeps running after a peer closed its bootstrap with a goodbye (it
/// finished normally) before it aborts as for a dead peer. Ranks finish their last collective
/// at slightly different times, and the first to finish leaves first: the others must not
/// fail for it. A rank that left early by mistake (a calls mismatch, an error handled by
/// returning) releases the others' device waits after this long instead of the spin limit;
/// their host waits for a message from it fail at once.
pub const LEAVE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Watches the bootstrap for a dead peer (or one that left more than [`LEAVE_GRACE`] ago); on
/// one, records it (sticky) and aborts the communicator's status, which releases every device
/// wait of this rank.
struct HealthMonitor {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HealthMonitor {
    /// Starts watching `bootstrap`; a dead peer is recorded in `alive` and aborts its status.
    fn start(bootstrap: &Arc<dyn Bootstrap>, alive: &Alive) -> Result<Self> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stop2, dead2) = (stop.clone(), alive.dead.clone());
        let grace = alive.leave_grace_ms.clone();
        let (bs, st) = (Arc::downgrade(bootstrap), alive.status.clone());
        let thread = std::thread::Builder::new()
            .name("mscclpp-health".into())
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    let Some(bs) = bs.upgrade() else { return };
                    let grace = Duration::from_millis(grace.load(Ordering::Relaxed));
                    let left = bs.left_peer().filter(|&(_, ago)| ago >= grace);
                    let gone = bs.dead_peer().or_else(|| {
                        left.map(|(rank, ago)| {
                            let why = format!(
                                "finished and closed its bootstrap {:.1} s ago while this \
                                 communicator was still in use (calls that do not match \
                                 across ranks?)",
                                ago.as_secs_f64()
                            );
                            (rank, why)
                        })
                    });
                    if let Some(d) = gone {
                        tracing::error!(
                            "rank {} is gone ({}); aborting the communicator",
                            d.0,
                            d.1
                        );
                        *dead2.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
                        st.abort();
                        return;
                    }
                    drop(bs);
                    std::thread::sleep(HEALTH_INTERVAL);
                }
            })
            .map_err(|source| Error::ProxyStart { source })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HealthMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Communicator {
    /// A communicator for this rank of `bootstrap`, using `gpu`.
    pub fn new(bootstrap: Arc<dyn Bootstrap>, gpu: Gpu) -> Result<Self> {
        let status = Arc::new(StatusBlock::new(&gpu, DEFAULT_SPIN_LIMIT)?);
        let alive = Alive {
            dead: Arc::default(),
            status: status.clone(),
            leave_grace_ms: Arc::new((LEAVE_GRACE.as_millis() as u64).into()),
        };
        let health = HealthMonitor::start(&bootstrap, &alive)?;
        let watched = Arc::new(WatchedBootstrap {
            inner: bootstrap,
            alive,
        });
        Ok(Self {
            bootstrap: watched.clone(),
            watched,
            gpu,
            status,
            next_memory_id: AtomicU32::new(0),
            local_memories: Arc::default(),
            _health: health,
        })
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
    /// aborts as for a dead peer ([`LEAVE_GRACE`] by default).
    pub fn set_leave_grace(&self, grace: Duration) {
        let ms = grace.as_millis().min(u64::MAX as u128) as u64;
        self.watched
            .alive
            .leave_grace_ms
            .store(ms, Ordering::Relaxed);
    }

    /// The sticky asynchronous error of this communicator: a dead peer (`Error::Remote`), or an
    /// abort (by `abort()` or a failed proxy).
    pub fn async_error(&self) -> Option<Error> {
        self.check_alive().err()
    }

    fn check_alive(&self) -> Result<()> {
        self.watched.alive.check()
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

    /// Whether `rank` runs on this rank's node.
    pub fn same_node(&self, rank: usize) -> bool {
        let me = self.bootstrap.node_of(self.rank());
        me.is_some() && me == self.bootstrap.node_of(rank)
    }

    fn next_id(&self) -> u32 {
        self.next_memory_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers `size` bytes at `ptr` under a new id, entering it in the registry of
    /// network-writable memories when a network transport is asked for.
    fn register(
        &self,
        ptr: DevicePtr<u8>,
        size: usize,
        transports: TransportFlags,
        ipc: Option<mscclpp_shared::IpcMemHandle>,
    ) -> Result<RegisteredMemory> {
        let id = self.next_id();
        let writable = network_writable(transports) && size > 0 && !ptr.is_null();
        let registration = writable.then(|| {
            let mem = LocalMemory {
                ptr,
                size,
                transports,
            };
            self.local_memories.insert(id, mem)
        });
        RegisteredMemory::local(
            &self.gpu,
            self.rank(),
            id,
            ptr,
            size,
            transports,
            ipc,
            registration,
        )
    }

    /// Registers a device buffer for `transports` (its IPC handle is exported when a same-node
    /// transport is asked for).
    pub fn register_buffer(
        &self,
        buf: &DeviceBuffer,
        transports: impl Into<TransportFlags>,
    ) -> Result<RegisteredMemory> {
        let transports = transports.into();
        let local = Transport::local_for(self.gpu.kind());
        let ipc = if transports.has(local) {
            Some(buf.ipc_handle()?)
        } else {
            None
        };
        self.register(buf.ptr(), buf.len(), transports, ipc)
    }

    /// Registers a whole allocation found by [`Gpu::allocation_of`] (memory this process
    /// allocated by any means) for the same-node transport, exporting its IPC handle.
    pub fn register_allocation(&self, a: &crate::gpu::Allocation) -> Result<RegisteredMemory> {
        let ipc = self.gpu.export_allocation(a)?;
        let local = Transport::local_for(self.gpu.kind());
        self.register(a.base, a.size, local.into(), Some(ipc))
    }

    /// Registers host-mapped memory (reachable by network transports, and by peers in this
    /// process).
    pub fn register_host(
        &self,
        mem: &HostMapped,
        transports: impl Into<TransportFlags>,
    ) -> Result<RegisteredMemory> {
        self.register(mem.device_ptr(), mem.len(), transports.into(), None)
    }

    /// Registers `size` bytes at a raw device address that this process can reach (no IPC
    /// export: peers in other processes cannot map it).
    pub fn register_raw(
        &self,
        ptr: DevicePtr<u8>,
        size: usize,
        transports: impl Into<TransportFlags>,
    ) -> Result<RegisteredMemory> {
        self.register(ptr, size, transports.into(), None)
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
        let bytes = self.recv_checked(remote_rank, MEMORY_TAG | (tag & USER_TAG_MASK))?;
        RegisteredMemory::deserialize(&bytes, &self.gpu, remote_rank, self.same_node(remote_rank))
    }

    /// Builds the semaphore a peer's proxy signals through `conn` and a GPU of this rank waits
    /// on (PortChannel); the peer calls it with the same `tag`.
    pub fn build_semaphore(
        &self,
        conn: Arc<dyn Connection>,
        tag: u64,
    ) -> Result<crate::semaphore::Host2DeviceSemaphore> {
        crate::semaphore::Host2DeviceSemaphore::new(self, conn, tag)
    }

    /// Builds a GPU↔GPU semaphore over a same-node `conn` (MemoryChannel); the peer calls it
    /// with the same `tag`.
    pub fn build_memory_semaphore(
        &self,
        conn: &dyn Connection,
        tag: u64,
    ) -> Result<crate::semaphore::MemoryDevice2DeviceSemaphore> {
        crate::semaphore::MemoryDevice2DeviceSemaphore::new(self, conn, tag)
    }

    /// Connects to `remote_rank` (which calls `connect` with this rank and the same tag).
    pub fn connect(
        &self,
        config: EndpointConfig,
        remote_rank: usize,
        tag: u64,
    ) -> Result<Arc<dyn Connection>> {
        self.check_alive()?;
        let transport = config.transport;
        let refuse = |reason: String| Error::Connect {
            remote_rank,
            transport,
            reason,
        };
        if remote_rank >= self.size() {
            return Err(refuse(format!("no such rank (world size {})", self.size())));
        }
        // Network transports prepare before the endpoints cross (a listener, a queue pair) and
        // put what the peer needs into `extra`; a local failure is sent instead, so the peer
        // fails at once with this rank's reason rather than waiting for an endpoint.
        let prepared = self.prepare(transport, remote_rank);
        let extra = match &prepared {
            Ok(p) => encode_extra(Ok(&p.extra())),
            Err(e) => encode_extra(Err(&e.to_string())),
        };
        let mine = Endpoint {
            transport: transport.bit(),
            rank: self.rank() as u32,
            pid: std::process::id(),
            device: self.gpu.ordinal() as u32,
            extra: if matches!(prepared, Ok(Prepared::None)) {
                Vec::new()
            } else {
                extra
            },
        };
        let tag = ENDPOINT_TAG | (tag & USER_TAG_MASK);
        self.bootstrap.send(remote_rank, tag, &mine.serialize())?;
        let theirs = Endpoint::deserialize(&self.recv_checked(remote_rank, tag)?, remote_rank)?;
        if theirs.transport != transport.bit() {
            return Err(refuse(format!(
                "the peer asked for transport bit {:#x}",
                theirs.transport
            )));
        }
        let prepared = prepared?;
        match transport {
            Transport::CudaIpc | Transport::Shm => {
                if transport != Transport::local_for(self.gpu.kind()) {
                    return Err(refuse(format!(
                        "not available on the {:?} backend",
                        self.gpu.kind()
                    )));
                }
                if !self.same_node(remote_rank) {
                    return Err(refuse("the peer is on another node".into()));
                }
                if theirs.pid == std::process::id() && theirs.device as usize != self.gpu.ordinal()
                {
                    // Ranks of one process reach each other's memory by peer access.
                    let peer = Gpu::open(self.gpu.kind(), theirs.device as usize)?;
                    self.gpu.enable_peer_access(&peer)?;
                }
                Ok(Arc::new(P2pConnection::new(
                    &self.gpu,
                    transport,
                    remote_rank,
                )?))
            }
            Transport::Ethernet => {
                let Prepared::Ethernet(listener) = prepared else {
                    return Err(refuse("no listener was prepared".into()));
                };
                let peer_extra = decode_extra(&theirs.extra, remote_rank)?;
                let conn = EthernetConnection::establish(
                    listener,
                    peer_extra,
                    ethernet::Setup {
                        rank: self.rank(),
                        remote_rank,
                        same_node: self.same_node(remote_rank),
                        gpu: &self.gpu,
                        registry: Arc::clone(&self.local_memories),
                        status: Arc::clone(&self.status),
                        timeout: config.flush_timeout,
                    },
                )?;
                Ok(Arc::new(conn))
            }
            #[cfg(feature = "ib")]
            Transport::Ib(_) => {
                let Prepared::Ib(prep) = prepared else {
                    return Err(refuse("no queue pair was prepared".into()));
                };
                let peer_extra = decode_extra(&theirs.extra, remote_rank)?;
                let conn = crate::connection::ib::IbConnection::establish(
                    *prep,
                    peer_extra,
                    remote_rank,
                    config.flush_timeout,
                )?;
                // Both queue pairs are ready to receive before either side writes.
                self.bootstrap.send(remote_rank, tag, b"RTS")?;
                self.recv_checked(remote_rank, tag)?;
                Ok(Arc::new(conn))
            }
            #[cfg(not(feature = "ib"))]
            Transport::Ib(_) => Err(refuse("built without the `ib` feature".into())),
        }
    }

    /// The local half of a network transport's set-up, done before the endpoints cross.
    fn prepare(&self, transport: Transport, remote_rank: usize) -> Result<Prepared> {
        match transport {
            Transport::Ethernet => Ok(Prepared::Ethernet(ethernet::Listener::bind(remote_rank)?)),
            #[cfg(feature = "ib")]
            Transport::Ib(i) => Ok(Prepared::Ib(Box::new(
                crate::connection::ib::Prepared::new(i, &self.local_memories, remote_rank)?,
            ))),
            #[cfg(not(feature = "ib"))]
            Transport::Ib(_) => Err(Error::IbUnavailable {
                reason: "this build has no InfiniBand support (enable the `ib` feature)".into(),
            }),
            Transport::CudaIpc | Transport::Shm => Ok(Prepared::None),
        }
    }
}

/// What a network transport prepared before the endpoints crossed.
enum Prepared {
    /// Nothing (same-node transports).
    None,
    /// A bound listener.
    Ethernet(ethernet::Listener),
    /// A queue pair in INIT and its registrations.
    #[cfg(feature = "ib")]
    Ib(Box<crate::connection::ib::Prepared>),
}

impl Prepared {
    /// The transport's bytes for `Endpoint::extra`.
    fn extra(&self) -> Vec<u8> {
        match self {
            Prepared::None => Vec::new(),
            Prepared::Ethernet(l) => l.info().encode(),
            #[cfg(feature = "ib")]
            Prepared::Ib(p) => p.info().encode(),
        }
    }
}

/// `Endpoint::extra` of a network transport: `status u8`, then for 0 (ready) the transport's
/// bytes, for 1 (failed) the sender's reason (UTF-8, cut to [`MAX_FAILURE_REASON`] bytes).
fn encode_extra(body: std::result::Result<&[u8], &str>) -> Vec<u8> {
    match body {
        Ok(b) => {
            let mut v = Vec::with_capacity(1 + b.len());
            v.push(0);
            v.extend_from_slice(b);
            v
        }
        Err(reason) => {
            let mut end = reason.len().min(MAX_FAILURE_REASON);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            let mut v = Vec::with_capacity(1 + end);
            v.push(1);
            v.extend_from_slice(&reason.as_bytes()[..end]);
            v
        }
    }
}

/// Longest failure reason carried in an endpoint.
const MAX_FAILURE_REASON: usize = 512;

/// The transport's bytes of a peer's `extra`, or the peer's failure as [`Error::Remote`].
fn decode_extra(extra: &[u8], from_rank: usize) -> Result<&[u8]> {
    match extra.split_first() {
        Some((0, body)) => Ok(body),
        Some((1, reason)) => Err(Error::Remote {
            rank: from_rank,
            reason: format!(
                "it could not prepare its end of the connection: {}",
                String::from_utf8_lossy(reason)
            ),
        }),
        Some((s, _)) => Err(Error::MalformedEndpoint {
            rank: from_rank,
            reason: format!("transport status byte {s}"),
        }),
        None => Err(Error::MalformedEndpoint {
            rank: from_rank,
            reason: "no transport bytes".into(),
        }),
    }
}
