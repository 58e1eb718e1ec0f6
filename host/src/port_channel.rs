//! `PortChannelService`: a proxy that serves PortChannels — MSCCL++'s `ProxyService`.
//!
//! Its lifecycle is two types (as rust-ibverbs' `QueuePairBuilder` → `QueuePair`): a
//! [`PortChannelServiceBuilder`], built from what the service uses (the GPU that holds its FIFO
//! and the communicator's status block, which a failed proxy aborts), takes the memories and
//! semaphores the channels will name and makes the channels' device handles; ids are indices
//! into those tables (memory ids `< 512`, semaphore ids `< 1024`, the trigger's field widths).
//! [`PortChannelServiceBuilder::start`] consumes it and returns the running
//! [`PortChannelService`], which has no way to add anything. Its proxy thread serves each
//! trigger of its FIFO:
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
//!
//! Traced ([`PortChannelServiceBuilder::trace`] with a trace that is on), the proxy records each
//! trigger as a span (see [`crate::proxy`]) holding a `copy` span (bytes, GB/s: the time the
//! connection's `write` took to return, which for an asynchronous transport is the time to
//! issue it), a `signal` span and a `flush` span (its end is the flush's completion).

use crate::error::ProxyError;
use std::sync::Arc;
use std::time::Duration;

use mscclpp_shared::trigger::{MAX_MEMORY_ID, MAX_SEMAPHORE_ID};
use mscclpp_shared::{PortChannelDeviceHandle, ProxyTrigger, TriggerType};

use crate::error::{Error, Result, TriggerFault};
use crate::fifo::Fifo;
use crate::gpu::Gpu;
use crate::proxy::{ProxyHandler, ProxyService};
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::Host2DeviceSemaphore;
use crate::status::{DEFAULT_SPIN_LIMIT, StatusBlock};
use crate::trace::{Category, HostEvent, Trace};

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
/// FIFO owns it). An invalid trigger is `Error::Proxy(ProxyError::InvalidTrigger)` naming the field.
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
    let bad = |fault: TriggerFault| Error::Proxy(ProxyError::InvalidTrigger { pos, fault });
    let kind = t.kind();
    if kind.is_empty() {
        return Err(bad(TriggerFault::NoType));
    }
    let semaphore = t.semaphore_id() as usize;
    if semaphore >= semaphores {
        return Err(bad(TriggerFault::Semaphore {
            id: t.semaphore_id(),
        }));
    }
    let copy = if kind.contains(TriggerType::DATA) {
        let mem = |id: u32, side: &'static str| {
            memory_size(id as usize)
                .map(|size| (id as usize, size))
                .ok_or(bad(TriggerFault::Memory { side, id }))
        };
        let (dst, dst_size) = mem(t.dst_memory_id(), "dst")?;
        let (src, src_size) = mem(t.src_memory_id(), "src")?;
        let (size, src_offset, dst_offset) = (t.size(), t.src_offset(), t.dst_offset());
        let check = |side: &'static str, offset: u64, registered: u64| {
            if offset.checked_add(size).is_some_and(|e| e <= registered) {
                Ok(())
            } else {
                Err(bad(TriggerFault::Range {
                    side,
                    offset,
                    size,
                    registered,
                }))
            }
        };
        check("src", src_offset, src_size)?;
        check("dst", dst_offset, dst_size)?;
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

/// The tables the proxy validates triggers against, and the trace it records into.
struct Tables {
    memories: Vec<RegisteredMemory>,
    semaphores: Vec<Host2DeviceSemaphore>,
    trace: Trace,
}

impl Tables {
    fn memory(&self, id: usize, side: &'static str, pos: u64) -> Result<&RegisteredMemory> {
        self.memories
            .get(id)
            .ok_or(Error::Proxy(ProxyError::InvalidTrigger {
                pos,
                fault: TriggerFault::Memory {
                    side,
                    id: id as u32,
                },
            }))
    }

    fn serve(&self, t: ProxyTrigger, pos: u64) -> Result<()> {
        let v = validate_with(
            t,
            |id| self.memories.get(id).map(|m| m.size() as u64),
            self.semaphores.len(),
            pos,
        )?;
        let sem =
            self.semaphores
                .get(v.semaphore)
                .ok_or(Error::Proxy(ProxyError::InvalidTrigger {
                    pos,
                    fault: TriggerFault::Semaphore {
                        id: v.semaphore as u32,
                    },
                }))?;
        let conn = sem.connection();
        if let Some(c) = v.copy {
            let dst = self.memory(c.dst, "dst", pos)?;
            let src = self.memory(c.src, "src", pos)?;
            let start = crate::trace::now_ns();
            conn.write(dst, c.dst_offset, src, c.src_offset, c.size)?;
            if self.trace.is_on() {
                let end = crate::trace::now_ns();
                let gbps = c.size as f64 / (end - start).max(1) as f64;
                self.trace.record(HostEvent {
                    cat: Category::Proxy,
                    name: "copy".into(),
                    start_ns: start,
                    end_ns: Some(end),
                    args: vec![
                        ("bytes", c.size.into()),
                        ("GB/s", gbps.into()),
                        ("semaphore", v.semaphore.into()),
                    ],
                });
            }
        }
        if v.kind.contains(TriggerType::FLAG) {
            let _span = self
                .trace
                .span(Category::Proxy, "signal")
                .arg("semaphore", v.semaphore);
            sem.signal()?;
        }
        if v.kind.contains(TriggerType::SYNC) {
            let _span = self.trace.span(Category::Proxy, "flush").arg("pos", pos);
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

/// A port-channel service being configured: add memories and semaphores, make the channels'
/// device handles, then [`start`](Self::start) it (module docs).
pub struct PortChannelServiceBuilder {
    fifo: Fifo,
    fifo_status: Arc<StatusBlock>,
    comm_status: Arc<StatusBlock>,
    handle: mscclpp_shared::FifoDeviceHandle,
    tables: Tables,
    numa_node: Option<u32>,
}

impl PortChannelService {
    /// A service to configure, with a FIFO of `fifo_size` slots (a power of two) on `gpu`. A
    /// failed proxy aborts `status` (the communicator's, whose waiters the channels' semaphores
    /// release), and the proxy thread is bound to `gpu`'s NUMA node.
    pub fn builder(
        gpu: &Gpu,
        status: &Arc<StatusBlock>,
        fifo_size: u32,
    ) -> Result<PortChannelServiceBuilder> {
        let fifo = Fifo::new(gpu, fifo_size)?;
        let fifo_status = Arc::new(StatusBlock::new(gpu, DEFAULT_SPIN_LIMIT)?);
        let handle = fifo.device_handle(fifo_status.device_ptr());
        Ok(PortChannelServiceBuilder {
            fifo,
            fifo_status,
            comm_status: Arc::clone(status),
            handle,
            tables: Tables {
                memories: Vec::new(),
                semaphores: Vec::new(),
                trace: Trace::off(),
            },
            numa_node: gpu.numa_node(),
        })
    }
}

impl PortChannelServiceBuilder {
    /// Records the proxy's work into `trace` (a communicator's, `Communicator::trace`; module
    /// docs). Not traced unless called.
    pub fn trace(&mut self, trace: &Trace) -> &mut Self {
        self.tables.trace = trace.clone();
        self
    }

    /// Adds a memory channels may name; returns its id.
    pub fn add_memory(&mut self, mem: RegisteredMemory) -> Result<u32> {
        let memories = &mut self.tables.memories;
        if memories.len() > MAX_MEMORY_ID as usize {
            return Err(Error::Proxy(ProxyError::ProxyTableFull {
                what: "memories",
                max: MAX_MEMORY_ID as usize + 1,
            }));
        }
        memories.push(mem);
        Ok(memories.len() as u32 - 1)
    }

    /// Adds a semaphore (and its connection); returns its id.
    pub fn add_semaphore(&mut self, sem: Host2DeviceSemaphore) -> Result<u32> {
        let semaphores = &mut self.tables.semaphores;
        if semaphores.len() > MAX_SEMAPHORE_ID as usize {
            return Err(Error::Proxy(ProxyError::ProxyTableFull {
                what: "semaphores",
                max: MAX_SEMAPHORE_ID as usize + 1,
            }));
        }
        semaphores.push(sem);
        Ok(semaphores.len() as u32 - 1)
    }

    /// The device handle of a channel: semaphore `semaphore_id`, writing into memory `dst` from
    /// memory `src`.
    pub fn port_channel(
        &self,
        semaphore_id: u32,
        dst: u32,
        src: u32,
    ) -> Result<PortChannelDeviceHandle> {
        let t = &self.tables;
        let sem = t.semaphores.get(semaphore_id as usize).ok_or(Error::Proxy(
            ProxyError::UnknownChannelId {
                what: "semaphore",
                id: semaphore_id,
                registered: t.semaphores.len(),
            },
        ))?;
        for id in [dst, src] {
            if id as usize >= t.memories.len() {
                return Err(Error::Proxy(ProxyError::UnknownChannelId {
                    what: "memory",
                    id,
                    registered: t.memories.len(),
                }));
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

    /// Starts the proxy thread: the tables move to it, and the running service can only report
    /// and stop.
    pub fn start(self) -> Result<PortChannelService> {
        let trace = self.tables.trace.clone();
        let proxy = ProxyService::start_traced(
            self.fifo,
            Box::new(self.tables),
            self.fifo_status,
            vec![self.comm_status],
            self.numa_node,
            trace,
        )?;
        Ok(PortChannelService { proxy })
    }
}

/// A running proxy serving PortChannels of one communicator (made by
/// [`PortChannelServiceBuilder::start`]). Dropping it stops the proxy.
pub struct PortChannelService {
    proxy: ProxyService,
}

impl PortChannelService {
    /// The proxy's sticky error, if it failed.
    pub fn error(&self) -> Option<String> {
        self.proxy.error()
    }

    /// Stops the proxy (releasing device waits on its FIFO) and returns its error, if any.
    pub fn stop(self) -> Result<()> {
        self.proxy.stop()
    }
}
