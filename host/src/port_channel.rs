//! `PortChannelService`: a proxy that serves PortChannels — MSCCL++'s `ProxyService`.
//!
//! Before `start`, callers add the memories and semaphores the channels will name; ids are
//! indices into those tables (memory ids `< 512`, semaphore ids `< 1024`, the trigger's field
//! widths). The proxy thread then serves each trigger of its FIFO:
//!
//! - every field is validated first: the type bits, the semaphore id, both memory ids, and
//!   `offset + size` against both memories' registered sizes. An invalid trigger copies
//!   nothing; it becomes the proxy's sticky error and aborts the communicator;
//! - DATA: `connection.write(dst, dst_offset, src, src_offset, size)` on the semaphore's
//!   connection;
//! - FLAG: the semaphore's `signal` (the connection orders it after the writes before it);
//! - SYNC: `connection.flush(timeout)`, after which the FIFO's flush position is completed.

use std::sync::Arc;
use std::time::Duration;

use mscclpp_shared::trigger::{MAX_MEMORY_ID, MAX_SEMAPHORE_ID};
use mscclpp_shared::{PortChannelDeviceHandle, ProxyTrigger, TriggerType};

use crate::communicator::Communicator;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::fifo::Fifo;
use crate::proxy::{ProxyHandler, ProxyService};
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::Host2DeviceSemaphore;
use crate::status::{DEFAULT_SPIN_LIMIT, StatusBlock};

/// How long a SYNC trigger may wait for its connection's flush.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// The tables the proxy validates triggers against.
struct Tables {
    memories: Vec<RegisteredMemory>,
    semaphores: Vec<Arc<Host2DeviceSemaphore>>,
}

impl Tables {
    fn serve(&self, t: ProxyTrigger, pos: u64) -> Result<()> {
        let bad = |reason: String| Error::InvalidTrigger { pos, reason };
        let kind = t.kind();
        if kind.is_empty() {
            return Err(bad("no type bit set".into()));
        }
        let sem = self
            .semaphores
            .get(t.semaphore_id() as usize)
            .ok_or_else(|| bad(format!("semaphore id {} not registered", t.semaphore_id())))?;
        let conn = sem.connection();
        if kind.contains(TriggerType::DATA) {
            let mem = |id: u32, what: &str| {
                self.memories
                    .get(id as usize)
                    .ok_or_else(|| bad(format!("{what} memory id {id} not registered")))
            };
            let dst = mem(t.dst_memory_id(), "dst")?;
            let src = mem(t.src_memory_id(), "src")?;
            let (size, so, d) = (t.size(), t.src_offset(), t.dst_offset());
            if so + size > src.size() as u64 {
                return Err(bad(format!("src {so}+{size} beyond {} bytes", src.size())));
            }
            if d + size > dst.size() as u64 {
                return Err(bad(format!("dst {d}+{size} beyond {} bytes", dst.size())));
            }
            conn.write(dst, d, src, so, size)?;
        }
        if kind.contains(TriggerType::FLAG) {
            sem.signal()?;
        }
        if kind.contains(TriggerType::SYNC) {
            conn.flush(FLUSH_TIMEOUT)?;
        }
        Ok(())
    }
}

impl ProxyHandler for Tables {
    fn handle(&mut self, trigger: ProxyTrigger, pos: u64) -> Result<()> {
        self.serve(trigger, pos)
    }
}

/// A proxy serving PortChannels of one communicator.
pub struct PortChannelService {
    fifo: Option<Fifo>,
    fifo_status: Arc<StatusBlock>,
    comm_status: Arc<StatusBlock>,
    handle: mscclpp_shared::FifoDeviceHandle,
    tables: Option<Tables>,
    numa_node: Option<u32>,
    backend: crate::gpu::BackendKind,
    proxy: Option<ProxyService>,
}

impl PortChannelService {
    /// A service with a FIFO of `fifo_size` slots on the communicator's device.
    pub fn new(comm: &Communicator, fifo_size: u32) -> Result<Self> {
        let fifo = Fifo::new(comm.gpu(), fifo_size)?;
        let fifo_status = Arc::new(StatusBlock::new(comm.gpu(), DEFAULT_SPIN_LIMIT)?);
        let handle = fifo.device_handle(fifo_status.device_ptr());
        Ok(Self {
            fifo: Some(fifo),
            fifo_status,
            comm_status: comm.status().clone(),
            handle,
            tables: Some(Tables {
                memories: Vec::new(),
                semaphores: Vec::new(),
            }),
            numa_node: comm.gpu().numa_node(),
            backend: comm.gpu().kind(),
            proxy: None,
        })
    }

    fn tables(&mut self) -> Result<&mut Tables> {
        let backend = self.backend;
        self.tables.as_mut().ok_or(Error::Unsupported {
            what: "adding to a PortChannelService after start",
            backend,
        })
    }

    /// Adds a memory channels may name; returns its id.
    pub fn add_memory(&mut self, mem: RegisteredMemory) -> Result<u32> {
        let t = self.tables()?;
        let id = t.memories.len() as u32;
        if id > MAX_MEMORY_ID {
            return Err(Error::RegisterMemory {
                reason: format!("a proxy serves at most {} memories", MAX_MEMORY_ID + 1),
            });
        }
        t.memories.push(mem);
        Ok(id)
    }

    /// Adds a semaphore (and its connection); returns its id.
    pub fn add_semaphore(&mut self, sem: Host2DeviceSemaphore) -> Result<u32> {
        let t = self.tables()?;
        let id = t.semaphores.len() as u32;
        if id > MAX_SEMAPHORE_ID {
            return Err(Error::RegisterMemory {
                reason: format!("a proxy serves at most {} semaphores", MAX_SEMAPHORE_ID + 1),
            });
        }
        t.semaphores.push(Arc::new(sem));
        Ok(id)
    }

    /// Builds a semaphore over `conn` with the peer (which does the same with `tag`) and adds
    /// it; returns its id.
    pub fn build_and_add_semaphore(
        &mut self,
        comm: &Communicator,
        conn: Arc<dyn Connection>,
        tag: u64,
    ) -> Result<u32> {
        let sem = Host2DeviceSemaphore::new(comm, conn, tag)?;
        self.add_semaphore(sem)
    }

    /// The device handle of a channel: semaphore `semaphore_id`, writing into memory `dst` from
    /// memory `src`.
    pub fn port_channel(
        &self,
        semaphore_id: u32,
        dst: u32,
        src: u32,
    ) -> Result<PortChannelDeviceHandle> {
        let t = self.tables.as_ref().ok_or(Error::Unsupported {
            what: "building channels after start (build them before)",
            backend: self.backend,
        })?;
        let sem = t
            .semaphores
            .get(semaphore_id as usize)
            .ok_or_else(|| Error::InvalidTrigger {
                pos: 0,
                reason: format!("semaphore id {semaphore_id} not registered"),
            })?;
        for id in [dst, src] {
            if id as usize >= t.memories.len() {
                return Err(Error::InvalidTrigger {
                    pos: 0,
                    reason: format!("memory id {id} not registered"),
                });
            }
        }
        Ok(PortChannelDeviceHandle {
            semaphore_id,
            dst,
            src,
            reserved: 0,
            semaphore: sem.device_handle(),
            fifo: self.handle,
        })
    }

    /// Starts the proxy thread.
    pub fn start(&mut self) -> Result<()> {
        let (Some(fifo), Some(tables)) = (self.fifo.take(), self.tables.take()) else {
            return Err(Error::Unsupported {
                what: "starting a PortChannelService twice",
                backend: self.backend,
            });
        };
        self.proxy = Some(ProxyService::start(
            fifo,
            Box::new(tables),
            self.fifo_status.clone(),
            vec![self.comm_status.clone()],
            self.numa_node,
        )?);
        Ok(())
    }

    /// The proxy's sticky error, if it failed.
    pub fn error(&self) -> Option<String> {
        self.proxy.as_ref().and_then(|p| p.error())
    }

    /// Stops the proxy (releasing device waits on its FIFO) and returns its error, if any.
    pub fn stop(&mut self) -> Result<()> {
        match self.proxy.take() {
            Some(p) => p.stop(),
            None => Ok(()),
        }
    }
}
