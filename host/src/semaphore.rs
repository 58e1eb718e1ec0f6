//! Host side of the semaphores: allocate the token words, exchange them with the peer, build
//! the device handles (`mscclpp_shared::semaphore` documents every word).
//!
//! Each semaphore owns one device buffer of two cache lines: `inbound` at 0 (written by the
//! peer), `expected` at 64 (the local waiter's counter). Both ends call the same constructor
//! with the same tag; the constructor registers `inbound`, sends it, and receives the peer's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_shared::{
    DevicePtr, Host2DeviceSemaphoreDeviceHandle, Host2HostSemaphoreHandle,
    MemoryDevice2DeviceSemaphoreDeviceHandle,
};

use crate::communicator::{Communicator, SEMAPHORE_TAG};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::gpu::DeviceBuffer;
use crate::proxy::Backoff;
use crate::registered_memory::RegisteredMemory;
use crate::status::StatusBlock;

const INBOUND_OFF: u64 = 0;
const EXPECTED_OFF: u64 = 64;
const WORDS_BYTES: usize = 128;

/// The token words of one end and the peer's `inbound`.
struct Words {
    // Declared (and so dropped) before `local`: the registration goes before the memory.
    _local_reg: RegisteredMemory,
    local: DeviceBuffer,
    remote_inbound: RegisteredMemory,
}

impl Words {
    fn exchange(comm: &Communicator, conn: &dyn Connection, tag: u64) -> Result<Self> {
        let local = comm.gpu().alloc(WORDS_BYTES)?;
        let reg = comm.register_buffer(&local, conn.transport())?;
        let peer = conn.remote_rank();
        let tag = SEMAPHORE_TAG | (tag & ((1 << 60) - 1));
        comm.bootstrap().send(peer, tag, &reg.serialize())?;
        let bytes = comm.recv_checked(peer, tag)?;
        let remote_inbound =
            RegisteredMemory::deserialize(&bytes, comm.gpu(), peer, comm.same_node(peer))?;
        if remote_inbound.size() < WORDS_BYTES {
            return Err(Error::MalformedMemory {
                rank: peer,
                reason: format!("semaphore words of {} bytes", remote_inbound.size()),
            });
        }
        Ok(Self {
            _local_reg: reg,
            local,
            remote_inbound,
        })
    }

    fn inbound(&self) -> DevicePtr<u64> {
        self.local.ptr().byte_add_cast(INBOUND_OFF)
    }

    fn expected(&self) -> DevicePtr<u64> {
        self.local.ptr().byte_add_cast(EXPECTED_OFF)
    }
}

/// GPU↔GPU semaphore of a MemoryChannel: the peer's `inbound` must be mapped here (same node).
pub struct MemoryDevice2DeviceSemaphore {
    words: Words,
    status: Arc<StatusBlock>,
}

impl MemoryDevice2DeviceSemaphore {
    /// Builds one end (the peer builds the other with the same `tag`).
    pub fn new(comm: &Communicator, conn: &dyn Connection, tag: u64) -> Result<Self> {
        let words = Words::exchange(comm, conn, tag)?;
        words.remote_inbound.range(INBOUND_OFF, 8)?;
        Ok(Self {
            words,
            status: comm.status().clone(),
        })
    }

    /// The device handle.
    pub fn device_handle(&self) -> Result<MemoryDevice2DeviceSemaphoreDeviceHandle> {
        Ok(MemoryDevice2DeviceSemaphoreDeviceHandle {
            inbound: self.words.inbound(),
            remote_inbound: self.words.remote_inbound.range(INBOUND_OFF, 8)?.cast(),
            expected: self.words.expected(),
            status: self.status.device_ptr(),
        })
    }
}

/// Semaphore a peer's proxy signals through a connection and a GPU waits on (PortChannel).
pub struct Host2DeviceSemaphore {
    words: Words,
    conn: Arc<dyn Connection>,
    outbound: AtomicU64,
    status: Arc<StatusBlock>,
}

impl Host2DeviceSemaphore {
    /// Builds one end over `conn` (the peer builds the other with the same `tag`).
    pub fn new(comm: &Communicator, conn: Arc<dyn Connection>, tag: u64) -> Result<Self> {
        let words = Words::exchange(comm, conn.as_ref(), tag)?;
        Ok(Self {
            words,
            conn,
            outbound: AtomicU64::new(0),
            status: comm.status().clone(),
        })
    }

    /// The connection it signals over.
    pub fn connection(&self) -> &Arc<dyn Connection> {
        &self.conn
    }

    /// Gives the peer one token, after every earlier write of the connection (proxy side).
    pub fn signal(&self) -> Result<()> {
        let next = self.outbound.load(Ordering::Relaxed) + 1;
        self.conn.update_and_sync(
            &self.words.remote_inbound,
            INBOUND_OFF,
            &self.outbound,
            next,
        )
    }

    /// The device handle.
    pub fn device_handle(&self) -> Host2DeviceSemaphoreDeviceHandle {
        Host2DeviceSemaphoreDeviceHandle {
            inbound: self.words.inbound(),
            expected: self.words.expected(),
            status: self.status.device_ptr(),
        }
    }
}

/// Semaphore between two host threads or processes: the waiter polls its `inbound` from the
/// host, so it needs host-readable device memory (the CPU backend) or a network transport that
/// writes host memory.
pub struct Host2HostSemaphore {
    words: Words,
    conn: Arc<dyn Connection>,
    outbound: AtomicU64,
    expected: u64,
}

impl Host2HostSemaphore {
    /// Builds one end over `conn` (the peer builds the other with the same `tag`).
    pub fn new(comm: &Communicator, conn: Arc<dyn Connection>, tag: u64) -> Result<Self> {
        if comm.gpu().kind() != crate::gpu::BackendKind::Cpu {
            return Err(Error::Unsupported {
                what: "a host-to-host semaphore over device memory the host cannot read",
                backend: comm.gpu().kind(),
            });
        }
        let words = Words::exchange(comm, conn.as_ref(), tag)?;
        Ok(Self {
            words,
            conn,
            outbound: AtomicU64::new(0),
            expected: 0,
        })
    }

    /// Gives the peer one token.
    pub fn signal(&self) -> Result<()> {
        let next = self.outbound.load(Ordering::Relaxed) + 1;
        self.conn.update_and_sync(
            &self.words.remote_inbound,
            INBOUND_OFF,
            &self.outbound,
            next,
        )
    }

    fn inbound(&self) -> &AtomicU64 {
        // SAFETY: on the CPU backend device memory is host memory; `inbound` is an aligned u64
        // in our live buffer, written by the peer only through atomics.
        unsafe { AtomicU64::from_ptr(self.words.inbound().as_ptr()) }
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
        let mut backoff = Backoff::default();
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
            inbound: self.words.inbound(),
            expected: self.words.expected(),
        }
    }
}
