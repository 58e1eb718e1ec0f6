//! Running MSCCL++ execution plans: parse, verify, set up, run.
//!
//! MSCCL++'s users write collective algorithms in its Python DSL (`mscclpp.language`), which
//! compiles them to JSON execution plans; MSCCL++'s `Executor` runs a plan with one interpreter
//! kernel. This module runs the same files, in four steps, each its own type:
//!
//! | step | module | what |
//! |---|---|---|
//! | parse | [`plan`] | the JSON into plain data ([`plan::PlanDoc`]); every malformed plan a typed error naming the field |
//! | verify | [`verify`] | a pure function over all ranks' programs: refuses a plan that would hang or race, naming the rank and op |
//! | set up | `setup` | channels, the peers' buffers, semaphores, scratch and block programs, once per (plan, buffers, sizes), cached |
//! | run | [`Executor::execute`] | one launch of `executor_kernel` (`mscclpp_device::executor`) on the caller's stream |
//!
//! [`ExecutionPlan::load`] does the first two (at sizes of its own, [`verify::canonical_sizes`]),
//! [`Executor::execute`] the other two (verifying again at the call's sizes on first use).
//! [`lower`] holds MSCCL++'s offset rules, [`plans`] the repository's own plans.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn demo(comm: Arc<mscclpp::host::communicator::Communicator>,
//! #         input: mscclpp::shared::DevicePtr<u8>, output: mscclpp::shared::DevicePtr<u8>,
//! #         stream: &mscclpp::host::gpu::Stream) -> mscclpp::host::Result<()> {
//! use mscclpp::executor::{ExecutionPlan, Executor, PacketType};
//! use mscclpp::shared::DataType;
//! let plan = ExecutionPlan::load("allreduce.json")?; // parsed and verified
//! let executor = Executor::new(comm.clone())?;
//! let bytes = 1 << 20;
//! // SAFETY: `input` and `output` hold `bytes` each until the stream has run the launch.
//! unsafe {
//!     executor.execute(comm.rank(), input, bytes, output, bytes, DataType::F32, &plan,
//!                      stream, PacketType::LL16)?;
//! }
//! # Ok(()) }
//! ```
//!
//! Every rank calls `execute` with the same plan and sizes in the same order (the first call
//! with new buffers or sizes sets them up together with the peers; later calls only launch).
//! A call must be eager the first time (under CUDA graph capture only known (plan, buffers,
//! sizes) can be queued). Data types: every [`DataType`]; reductions: the plan's (`sum`,
//! `min`, `max`). A call of zero bytes does nothing.

pub mod lower;
pub mod plan;
pub mod plans;
mod setup;
pub mod verify;

use mscclpp_host::error::PlanError;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{Kernel, LaunchConfig, Module, Stream};
use mscclpp_host::{Error, Result};
use mscclpp_shared::executor::{EXEC_PACKET_LL8, EXEC_PACKET_LL16, ExecBlock, ExecutorParams};
use mscclpp_shared::{DataType, DevicePtr};

pub use lower::Sizes;
pub use plan::PlanDoc;
pub use setup::Buffers;
pub use verify::{Races, Summary};

/// The LL packet format a call's packet ops use (MSCCL++'s `PacketType`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum PacketType {
    /// 8 payload bytes in 16 (MSCCL++'s default).
    #[default]
    LL16,
    /// 4 payload bytes in 8.
    LL8,
}

/// A parsed and verified plan (module docs).
#[derive(Clone, Debug)]
pub struct ExecutionPlan {
    doc: Arc<PlanDoc>,
    id: u64,
    races: Races,
    summaries: Vec<Summary>,
}

impl ExecutionPlan {
    /// Reads, parses and verifies the plan in `path` (races refused).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(path, Races::Refuse)
    }

    /// [`load`](Self::load) with a choice about races.
    pub fn load_with(path: impl AsRef<Path>, races: Races) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, &path.display().to_string(), races)
    }

    /// Parses and verifies a plan's JSON text (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &str, races: Races) -> Result<Self> {
        Self::from_doc(PlanDoc::parse(text, origin)?, races)
    }

    /// Verifies a parsed plan at its canonical sizes.
    pub fn from_doc(doc: PlanDoc, races: Races) -> Result<Self> {
        let mut summaries = Vec::new();
        for sizes in verify::canonical_sizes(&doc)? {
            let geom = lower::Geometry::new(&doc, sizes)?;
            let alias = verify::declared_aliasing(&doc, sizes);
            summaries.push(verify::verify(&doc, &geom, &alias, races)?);
        }
        for s in summaries.iter().flat_map(|s| &s.races) {
            tracing::warn!(plan = %doc.name, "executor: a race, allowed: {s}");
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        doc.to_json().to_string().hash(&mut h);
        Ok(Self {
            id: h.finish(),
            doc: Arc::new(doc),
            races,
            summaries,
        })
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.doc.name
    }

    /// The collective it implements (`allreduce`, `allgather`, …).
    pub fn collective(&self) -> &str {
        &self.doc.collective
    }

    /// Smallest message it serves (bytes).
    pub fn min_message_size(&self) -> u64 {
        self.doc.min_message_size
    }

    /// Largest message it serves (bytes).
    pub fn max_message_size(&self) -> u64 {
        self.doc.max_message_size
    }

    /// Whether it runs in place.
    pub fn is_in_place(&self) -> bool {
        self.doc.inplace
    }

    /// The parsed plan.
    pub fn doc(&self) -> &PlanDoc {
        &self.doc
    }

    /// What verification found at each size it verified the plan at.
    pub fn summaries(&self) -> &[Summary] {
        &self.summaries
    }
}

/// Key of a set-up: the plan and this rank's buffers and sizes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    plan: u64,
    buffers: Buffers,
}

/// Runs plans on one communicator (MSCCL++'s `Executor`): the kernel, and the resources of
/// every (plan, buffers, sizes) it has run, kept until it drops. One executor per communicator
/// at a time (their set-up messages would share tags).
pub struct Executor {
    comm: Arc<Communicator>,
    _module: Arc<Module>,
    kernel: Kernel<ExecutorParams>,
    contexts: Mutex<HashMap<Key, Arc<setup::Context>>>,
    threads: Option<u32>,
}

/// Threads per block on the CPU backend unless [`Executor::with_threads_per_block`] says
/// otherwise: each is an OS thread there.
pub const CPU_THREADS_PER_BLOCK: u32 = 64;

impl Executor {
    /// An executor for `comm`'s rank (loads nothing new: the built-in kernels' module).
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        let module = crate::collectives::builtin_module(comm.gpu())?;
        let kernel = module.kernel(crate::kernels::EXECUTOR)?;
        Ok(Self {
            comm,
            _module: module,
            kernel,
            contexts: Mutex::new(HashMap::new()),
            threads: None,
        })
    }

    /// At most `n` threads per block (at least 1): plans ask for up to 1024, which the CPU
    /// backend runs as as many OS threads. Results do not depend on it.
    pub fn with_threads_per_block(mut self, n: u32) -> Self {
        self.threads = Some(n.max(1));
        self
    }

    /// The communicator.
    pub fn comm(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// Queues one launch of `plan` on `stream`: this rank (`rank`, the communicator's) reduces
    /// or moves `input_bytes` at `input` and `output_bytes` at `output` as the plan says,
    /// elements of type `dtype`, packets of type `packet`. The first call with these buffers
    /// and sizes sets them up with every peer (eager only); later calls queue the launch and
    /// return. Every rank makes the same calls in the same order.
    ///
    /// # Safety
    /// `input` and `output` are device memory of this rank's GPU, valid for their sizes until
    /// the launch completes (and, on the first call, for as long as the executor may use them
    /// again with the same sizes: it keeps them registered with the peers).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute(
        &self,
        rank: usize,
        input: DevicePtr<u8>,
        input_bytes: u64,
        output: DevicePtr<u8>,
        output_bytes: u64,
        dtype: DataType,
        plan: &ExecutionPlan,
        stream: &Stream,
        packet: PacketType,
    ) -> Result<()> {
        if rank != self.comm.rank() {
            return Err(Error::Plan(PlanError::Call {
                plan: plan.name().to_string(),
                problem: format!(
                    "called as rank {rank} on the communicator of rank {}",
                    self.comm.rank()
                ),
            }));
        }
        if input_bytes == 0 && output_bytes == 0 {
            return Ok(());
        }
        let key = Key {
            plan: plan.id,
            buffers: Buffers {
                input,
                output,
                sizes: Sizes {
                    input: input_bytes,
                    output: output_bytes,
                },
            },
        };
        let ctx = self.context(key, plan, stream)?;
        if let Some(e) = self.comm.status().error() {
            return Err(e);
        }
        let params = ExecutorParams {
            dtype: dtype as u32,
            packet: match packet {
                PacketType::LL16 => EXEC_PACKET_LL16,
                PacketType::LL8 => EXEC_PACKET_LL8,
            },
            ..ctx.params
        };
        let cfg = LaunchConfig::new(ctx.blocks, self.threads_for(ctx.threads, ctx.blocks)?)
            .with_shared_mem(std::mem::size_of::<ExecBlock>() as u32);
        // SAFETY: the context (programs, scratch, words, channels) lives as long as the
        // executor; the buffers are the caller's contract.
        unsafe { stream.launch(&self.kernel, cfg, params) }
    }

    /// The grid of this rank's launches of `plan`: (blocks, threads per block).
    pub fn launch_shape(&self, plan: &ExecutionPlan) -> Result<(u32, u32)> {
        let blocks = plan
            .doc
            .gpus
            .get(self.comm.rank())
            .map_or(0, |g| g.threadblocks.len() as u32);
        Ok((
            blocks,
            self.threads_for(plan.doc.num_threads_per_block, blocks)?,
        ))
    }

    /// Threads per block for `blocks` blocks of a plan asking for `threads`: capped by the
    /// caller's limit, by what the kernel's registers allow (CUDA), by
    /// [`CPU_THREADS_PER_BLOCK`] on the CPU backend, and by the emulator's threads per launch.
    fn threads_for(&self, threads: u32, blocks: u32) -> Result<u32> {
        let mut t = threads;
        if let Some(cap) = self.threads {
            t = t.min(cap);
        }
        match self.kernel.max_threads_per_block()? {
            Some(max) => t = t.min(max.max(1)),
            None => {
                if self.threads.is_none() {
                    t = t.min(CPU_THREADS_PER_BLOCK);
                }
                let room = mscclpp_device::arch::host::grid::MAX_THREADS / blocks.max(1);
                t = t.min(room.max(1));
            }
        }
        Ok(t.max(1))
    }

    /// The set-up of `key`, made on first use (collectively; never under capture).
    fn context(
        &self,
        key: Key,
        plan: &ExecutionPlan,
        stream: &Stream,
    ) -> Result<Arc<setup::Context>> {
        let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = contexts.get(&key) {
            return Ok(c.clone());
        }
        if stream.is_capturing()? {
            return Err(Error::Plan(PlanError::Call {
                plan: plan.name().to_string(),
                problem: "the first call with these buffers and sizes sets them up with the \
                          peers, which a captured call cannot: make it eagerly first"
                    .to_string(),
            }));
        }
        let seq = contexts.len() as u64;
        let c = Arc::new(setup::set_up(
            &self.comm,
            &plan.doc,
            &key.buffers,
            plan.races,
            seq,
        )?);
        contexts.insert(key, c.clone());
        Ok(c)
    }
}
