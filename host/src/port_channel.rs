//! `PortChannelService`: a proxy that serves PortChannels — MSCCL++'s `ProxyService`.
//!
//! Before `start`, callers add the memories and semaphores the channels will name; ids are
//! indices into those tables (memory ids `< 512`, semaphore ids `< 1024`, the trigger's field
//! widths). The proxy thread then serves each trigger of its FIFO:
//!
//! - every field is validated first ([`validate_trigger`]): the type bits, the semaphore id,
//!   and for DATA both memory ids and `offset + size` against both memories' registered sizes.
//!   An invalid trigger copies nothing; it becomes the proxy's sticky error and aborts the
//!   communicator (`host/tests/trigger_properties.rs` and the fuzz target `trigger` check the
//!   validator with random and mutated triggers);
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

/// The copy a valid DATA trigger asks for: ids index the proxy's memory table, and both
/// ranges lie inside their memories.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TriggerCopy {
    /// Destination memory id.
    pub dst: usize,
    /// Byte offset into the destination.
    pub dst_offset: u64,
    /// Source memory id.
    pub src: usize,
    /// Byte offset into the source.
    pub src_offset: u64,
    /// Bytes to copy.
    pub size: u64,
}

/// What a trigger that passed [`validate_trigger`] asks of the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidTrigger {
    /// The type bits (never empty).
    pub kind: TriggerType,
    /// The semaphore (and its connection), an index into the semaphore table.
    pub semaphore: usize,
    /// The copy, for a DATA trigger.
    pub copy: Option<TriggerCopy>,
}

/// Checks trigger `t` (read at FIFO position `pos`) against a proxy's tables: the sizes of its
/// registered memories, by id, and how many semaphores it has. Every rule the proxy applies
/// before acting: a type bit is set; the semaphore id is registered; for DATA, both memory ids
/// are registered and `offset + size` fits each memory. The commit bit is not looked at (the
/// FIFO owns it). An invalid trigger is `Error::InvalidTrigger` naming the field.
pub fn validate_trigger(
    t: ProxyTrigger,
    memory_sizes: &[u64],
    semaphores: usize,
    pos: u64,
) -> Result<ValidTrigger> {
    validate_with(t, |id| memory_sizes.get(id).copied(), semaphores, pos)
}

/// [`validate_trigger`] with the memory table as a lookup (id → registered size).
fn validate_with(
    t: ProxyTrigger,
    memory_size: impl Fn(usize) -> Option<u64>,
    semaphores: usize,
    pos: u64,
) -> Result<ValidTrigger> {
    let bad = |reason: String| Error::InvalidTrigger { pos, reason };
    let kind = t.kind();
    if kind.is_empty() {
        return Err(bad("no type bit set".into()));
    }
    let semaphore = t.semaphore_id() as usize;
    if semaphore >= semaphores {
        return Err(bad(format!("semaphore id {semaphore} not registered")));
    }
    let copy = if kind.contains(TriggerType::DATA) {
        let mem = |id: u32, what: &str| {
            let id = id as usize;
            memory_size(id)
                .map(|size| (id, size))
                .ok_or_else(|| bad(format!("{what} memory id {id} not registered")))
        };
        let (dst, dst_size) = mem(t.dst_memory_id(), "dst")?;
        let (src, src_size) = mem(t.src_memory_id(), "src")?;
        let (size, src_offset, dst_offset) = (t.size(), t.src_offset(), t.dst_offset());
        let fits = |offset: u64, len: u64| offset.checked_add(size).is_some_and(|e| e <= len);
        if !fits(src_offset, src_size) {
            return Err(bad(format!(
                "src {src_offset}+{size} beyond {src_size} bytes"
            )));
        }
        if !fits(dst_offset, dst_size) {
            return Err(bad(format!(
                "dst {dst_offset}+{size} beyond {dst_size} bytes"
            )));
        }
        Some(TriggerCopy {
            dst,
            dst_offset,
            src,
            src_offset,
            size,
        })
    } else {
        None
    };
    Ok(ValidTrigger {
        kind,
        semaphore,
        copy,
    })
}

/// The tables the proxy validates triggers against.
struct Tables {
    memories: Vec<RegisteredMemory>,
    semaphores: Vec<Arc<Host2DeviceSemaphore>>,
}

impl Tables {
    fn serve(&self, t: ProxyTrigger, pos: u64) -> Result<()> {
        let v = validate_with(
            t,
            |id| self.memories.get(id).map(|m| m.size() as u64),
            self.semaphores.len(),
            pos,
        )?;
        let missing = || Error::InvalidTrigger {
            pos,
            reason: "a validated id is not in the table".into(),
        };
        let sem = self.semaphores.get(v.semaphore).ok_or_else(missing)?;
        let conn = sem.connection();
        if let Some(c) = v.copy {
            let dst = self.memories.get(c.dst).ok_or_else(missing)?;
            let src = self.memories.get(c.src).ok_or_else(missing)?;
            conn.write(dst, c.dst_offset, src, c.src_offset, c.size)?;
        }
        if v.kind.contains(TriggerType::FLAG) {
            sem.signal()?;
        }
        if v.kind.contains(TriggerType::SYNC) {
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
