//! `Communicator`: a rank's view of the world — its bootstrap, its device, the memories it has
//! registered and the connections it has made.
//!
//! Set-up messages travel over the bootstrap under tags in their own ranges (memory, endpoint,
//! semaphore), so user tags of each kind never collide with each other or with the
//! bootstrap's collectives. Every received message is validated before use.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use mscclpp_shared::DevicePtr;

use crate::bootstrap::Bootstrap;
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

/// A rank's communicator.
pub struct Communicator {
    bootstrap: Arc<dyn Bootstrap>,
    gpu: Gpu,
    status: Arc<StatusBlock>,
    next_memory_id: AtomicU32,
}

impl Communicator {
    /// A communicator for this rank of `bootstrap`, using `gpu`.
    pub fn new(bootstrap: Arc<dyn Bootstrap>, gpu: Gpu) -> Result<Self> {
        let status = Arc::new(StatusBlock::new(&gpu, DEFAULT_SPIN_LIMIT)?);
        Ok(Self {
            bootstrap,
            gpu,
            status,
            next_memory_id: AtomicU32::new(0),
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

    /// The bootstrap.
    pub fn bootstrap(&self) -> &Arc<dyn Bootstrap> {
        &self.bootstrap
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

    fn check_alive(&self) -> Result<()> {
        if self.status.is_aborted() {
            return Err(Error::Aborted {
                reason: "abort() was called or a proxy failed".into(),
            });
        }
        Ok(())
    }

    /// Whether `rank` runs on this rank's node.
    pub fn same_node(&self, rank: usize) -> bool {
        let me = self.bootstrap.node_of(self.rank());
        me.is_some() && me == self.bootstrap.node_of(rank)
    }

    fn next_id(&self) -> u32 {
        self.next_memory_id.fetch_add(1, Ordering::Relaxed)
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
        RegisteredMemory::local(
            &self.gpu,
            self.rank(),
            self.next_id(),
            buf.ptr(),
            buf.len(),
            transports,
            ipc,
        )
    }

    /// Registers host-mapped memory (reachable by network transports, and by peers in this
    /// process).
    pub fn register_host(
        &self,
        mem: &HostMapped,
        transports: impl Into<TransportFlags>,
    ) -> Result<RegisteredMemory> {
        RegisteredMemory::local(
            &self.gpu,
            self.rank(),
            self.next_id(),
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
        RegisteredMemory::local(
            &self.gpu,
            self.rank(),
            self.next_id(),
            ptr,
            size,
            transports.into(),
            None,
        )
    }

    /// Sends `mem` to `remote_rank` under `tag`.
    pub fn send_memory(&self, mem: &RegisteredMemory, remote_rank: usize, tag: u64) -> Result<()> {
        self.check_alive()?;
        self.bootstrap
            .send(remote_rank, MEMORY_TAG | (tag & USER_TAG_MASK), &mem.serialize())
    }

    /// Receives the memory `remote_rank` sent under `tag`, mapped here where possible.
    pub fn recv_memory(&self, remote_rank: usize, tag: u64) -> Result<RegisteredMemory> {
        self.check_alive()?;
        let bytes = self
            .bootstrap
            .recv(remote_rank, MEMORY_TAG | (tag & USER_TAG_MASK))?;
        RegisteredMemory::deserialize(&bytes, &self.gpu, remote_rank, self.same_node(remote_rank))
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
        let mine = Endpoint {
            transport: transport.bit(),
            rank: self.rank() as u32,
            pid: std::process::id(),
            device: self.gpu.ordinal() as u32,
            extra: Vec::new(),
        };
        let tag = ENDPOINT_TAG | (tag & USER_TAG_MASK);
        self.bootstrap.send(remote_rank, tag, &mine.serialize())?;
        let theirs = Endpoint::deserialize(&self.bootstrap.recv(remote_rank, tag)?, remote_rank)?;
        if theirs.transport != transport.bit() {
            return Err(refuse(format!(
                "the peer asked for transport bit {:#x}",
                theirs.transport
            )));
        }
        match transport {
            Transport::CudaIpc | Transport::Shm => {
                if transport != Transport::local_for(self.gpu.kind()) {
                    return Err(refuse(format!("not available on the {:?} backend", self.gpu.kind())));
                }
                if !self.same_node(remote_rank) {
                    return Err(refuse("the peer is on another node".into()));
                }
                if theirs.pid == std::process::id() && theirs.device as usize != self.gpu.ordinal() {
                    // Ranks of one process reach each other's memory by peer access.
                    let peer = Gpu::open(self.gpu.kind(), theirs.device as usize)?;
                    self.gpu.enable_peer_access(&peer)?;
                }
                Ok(Arc::new(P2pConnection::new(&self.gpu, transport, remote_rank)?))
            }
            Transport::Ethernet | Transport::Ib(_) => Err(refuse("not implemented yet".into())),
        }
    }
}
