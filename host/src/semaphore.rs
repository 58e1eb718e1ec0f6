//! Host side of the semaphores: the token words, the two serializable halves a semaphore is
//! built from, and the device handles (`mscclpp_shared::semaphore` documents every word).
//!
//! Each end owns one device buffer of two cache lines ([`SemaphoreStub::BYTES`]): `inbound` at
//! 0 (written by the peer: by its GPU through the mapping, or by its proxy through the
//! connection), `expected` at 64 (the local waiter's counter, written and read only here).
//!
//! As MSCCL++'s `SemaphoreStub`: a semaphore is built from two halves, never from a
//! communicator. The local half ([`SemaphoreStub`]) is this end's words, registered for the
//! connection's transport; its serialized form crosses to the peer, where it becomes the remote
//! half ([`RemoteSemaphoreStub`]: the peer's `inbound`). `Communicator::build_semaphore`,
//! `build_memory_semaphore` and `build_host_semaphore` make the local half, trade it with the
//! peer under a tag, and build the semaphore; both ends call the same one with the same tag.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_shared::{
    DevicePtr, Host2DeviceSemaphoreDeviceHandle, Host2HostSemaphoreHandle,
    MemoryDevice2DeviceSemaphoreDeviceHandle,
};

use crate::backoff::Backoff;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::gpu::{DeviceBuffer, Gpu};
use crate::registered_memory::{LocalMemories, RegisteredMemory};
use crate::status::StatusBlock;
use crate::transport::Transport;

const INBOUND_OFF: u64 = 0;
const EXPECTED_OFF: u64 = 64;

/// The local half of a semaphore: this end's token words, registered for a transport.
pub struct SemaphoreStub {
    // Declared (and so dropped) before `words`: the registration goes before the memory.
    registered: RegisteredMemory,
    words: DeviceBuffer,
}

impl std::fmt::Debug for SemaphoreStub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SemaphoreStub({:?})", self.registered)
    }
}

impl SemaphoreStub {
    /// Bytes of one end's words: `inbound` and `expected`, a cache line each.
    pub const BYTES: usize = 128;

    /// Allocates zeroed words on `gpu` and registers them in `registry` for `transport`.
    pub(crate) fn new(
        gpu: &Gpu,
        registry: &Arc<LocalMemories>,
        transport: Transport,
    ) -> Result<Self> {
        let words = gpu.alloc(Self::BYTES)?;
        let registered = registry.register_buffer(&words, transport.into())?;
        Ok(Self { registered, words })
    }

    /// What the peer needs: the serialized registration of these words.
    pub fn serialize(&self) -> Vec<u8> {
        self.registered.serialize()
    }

    fn inbound(&self) -> DevicePtr<u64> {
        self.words.ptr().byte_add_cast(INBOUND_OFF)
    }

    fn expected(&self) -> DevicePtr<u64> {
        self.words.ptr().byte_add_cast(EXPECTED_OFF)
    }

    fn backend(&self) -> crate::gpu::BackendKind {
        self.words.gpu().kind()
    }
}

/// The remote half of a semaphore: the peer's words, as received (their `inbound` is what this
/// end signals).
#[derive(Debug, Clone)]
pub struct RemoteSemaphoreStub {
    memory: RegisteredMemory,
}

impl RemoteSemaphoreStub {
    /// Decodes the peer's [`SemaphoreStub::serialize`] (it came from `from_rank`), mapping its
    /// words when `same_node` allows (as `RegisteredMemory::deserialize`); refuses words
    /// shorter than [`SemaphoreStub::BYTES`].
    pub fn deserialize(bytes: &[u8], gpu: &Gpu, from_rank: usize, same_node: bool) -> Result<Self> {
        let memory = RegisteredMemory::deserialize(bytes, gpu, from_rank, same_node)?;
        if memory.size() < SemaphoreStub::BYTES {
            return Err(Error::MalformedMemory {
                rank: from_rank,
                reason: format!("semaphore words of {} bytes", memory.size()),
            });
        }
        Ok(Self { memory })
    }

    /// The rank that owns these words.
    pub fn rank(&self) -> usize {
        self.memory.rank()
    }
}

/// GPU↔GPU semaphore of a MemoryChannel: the peer's `inbound` must be mapped here (same node).
pub struct MemoryDevice2DeviceSemaphore {
    local: SemaphoreStub,
    remote: RemoteSemaphoreStub,
    status: Arc<StatusBlock>,
}

impl MemoryDevice2DeviceSemaphore {
    /// One end, from this end's words and the peer's (which must be mapped here: same node);
    /// device waits watch `status`.
    pub fn new(
        local: SemaphoreStub,
        remote: RemoteSemaphoreStub,
        status: Arc<StatusBlock>,
    ) -> Result<Self> {
        remote.memory.range(INBOUND_OFF, 8)?;
        Ok(Self {
            local,
            remote,
            status,
        })
    }

    /// The device handle.
    pub fn device_handle(&self) -> Result<MemoryDevice2DeviceSemaphoreDeviceHandle> {
        Ok(MemoryDevice2DeviceSemaphoreDeviceHandle {
            inbound: self.local.inbound(),
            remote_inbound: self.remote.memory.range(INBOUND_OFF, 8)?.cast(),
            expected: self.local.expected(),
            status: self.status.device_ptr(),
        })
    }
}

/// Semaphore a peer's proxy signals through a connection and a GPU waits on (PortChannel).
pub struct Host2DeviceSemaphore {
    local: SemaphoreStub,
    remote: RemoteSemaphoreStub,
    conn: Arc<dyn Connection>,
    outbound: AtomicU64,
    status: Arc<StatusBlock>,
}

impl Host2DeviceSemaphore {
    /// One end, from this end's words and the peer's, signalling over `conn` (whose peer owns
    /// `remote`); device waits watch `status`.
    pub fn new(
        local: SemaphoreStub,
        remote: RemoteSemaphoreStub,
        conn: Arc<dyn Connection>,
        status: Arc<StatusBlock>,
    ) -> Result<Self> {
        check_peer(&remote, conn.as_ref())?;
        Ok(Self {
            local,
            remote,
            conn,
            outbound: AtomicU64::new(0),
            status,
        })
    }

    /// The connection it signals over.
    pub fn connection(&self) -> &Arc<dyn Connection> {
        &self.conn
    }

    /// Gives the peer one token, after every earlier write of the connection (proxy side).
    pub fn signal(&self) -> Result<()> {
        let next = self.outbound.load(Ordering::Relaxed) + 1;
        self.conn
            .update_and_sync(&self.remote.memory, INBOUND_OFF, &self.outbound, next)
    }

    /// The device handle.
    pub fn device_handle(&self) -> Host2DeviceSemaphoreDeviceHandle {
        Host2DeviceSemaphoreDeviceHandle {
            inbound: self.local.inbound(),
            expected: self.local.expected(),
            status: self.status.device_ptr(),
        }
    }
}

/// Semaphore between two host threads or processes: the waiter polls its `inbound` from the
/// host, so it needs host-readable device memory (the CPU backend) or a network transport that
/// writes host memory.
pub struct Host2HostSemaphore {
    local: SemaphoreStub,
    remote: RemoteSemaphoreStub,
    conn: Arc<dyn Connection>,
    outbound: AtomicU64,
    expected: u64,
}

impl Host2HostSemaphore {
    /// One end, from this end's words and the peer's, signalling over `conn` (whose peer owns
    /// `remote`). The words must be host-readable: the CPU backend only.
    pub fn new(
        local: SemaphoreStub,
        remote: RemoteSemaphoreStub,
        conn: Arc<dyn Connection>,
    ) -> Result<Self> {
        if local.backend() != crate::gpu::BackendKind::Cpu {
            return Err(Error::Unsupported {
                what: "a host-to-host semaphore over device memory the host cannot read",
                backend: local.backend(),
            });
        }
        check_peer(&remote, conn.as_ref())?;
        Ok(Self {
            local,
            remote,
            conn,
            outbound: AtomicU64::new(0),
            expected: 0,
        })
    }

    /// Gives the peer one token.
    pub fn signal(&self) -> Result<()> {
        let next = self.outbound.load(Ordering::Relaxed) + 1;
        self.conn
            .update_and_sync(&self.remote.memory, INBOUND_OFF, &self.outbound, next)
    }

    fn inbound(&self) -> &AtomicU64 {
        // SAFETY: on the CPU backend device memory is host memory; `inbound` is an aligned u64
        // in our live buffer, written by the peer only through atomics.
        unsafe { AtomicU64::from_ptr(self.local.inbound().as_ptr()) }
    }

    /// Takes one token if it has arrived.
    pub fn poll(&mut self) -> bool {
        if self.inbound().load(Ordering::Acquire) > self.expected {
            self.expected += 1;
            true
        } else {
            false
        }
    }

    /// Takes one token, waiting at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut backoff = Backoff::new();
        while !self.poll() {
            if Instant::now() >= deadline {
                return Err(Error::SemaphoreTimeout {
                    expected: self.expected + 1,
                    after: timeout,
                });
            }
            backoff.snooze();
        }
        Ok(())
    }

    /// The handle (addresses of this end's words).
    pub fn handle(&self) -> Host2HostSemaphoreHandle {
        Host2HostSemaphoreHandle {
            inbound: self.local.inbound(),
            expected: self.local.expected(),
        }
    }
}

/// The remote half must belong to the connection's peer.
fn check_peer(remote: &RemoteSemaphoreStub, conn: &dyn Connection) -> Result<()> {
    if remote.rank() == conn.remote_rank() {
        Ok(())
    } else {
        Err(Error::SemaphorePeer {
            stub_rank: remote.rank(),
            connection_rank: conn.remote_rank(),
        })
    }
}
