//! An MSCCL++ execution plan as plain data: the JSON that MSCCL++'s DSL (`mscclpp.language`)
//! writes and its `ExecutionPlan` reads, parsed with `serde_json` into the types below, and
//! written back by [`PlanDoc::to_json`] in the same form (the repository's own plans are
//! made that way).
//!
//! Parsing checks everything that does not depend on the message size: every field's type and
//! range, every op name (the names of MSCCL++'s parser), the shape of every op (which buffers
//! it reads and writes, local or a peer's, data or packets), every index against what it
//! indexes (peers, channels, remote buffers, semaphores, barriers, chunks), the per-block
//! limits of the interpreter (`mscclpp_shared::executor`), and that every GPU's `id` and every
//! threadblock's `id` equals its position. A malformed plan is `Error::Plan(PlanError::Malformed)` naming
//! the field as a JSON path (`gpus[1].threadblocks[0].ops[3].src_buff[0].index`); a plan that
//! needs switch channels (NVLink multicast: `switch` channels, the `glres` / `gstore` ops) is
//! `Error::Plan(PlanError::Unsupported)`. What the message size decides (chunk sizes, alignment, the
//! plan's size range) is checked when a call's sizes are known (`super::lower`); whether the
//! ranks' programs fit together (signals and waits, races) by `super::verify`.
//!
//! Beyond MSCCL++'s own reader, a few things it leaves to chance are refused here: packet
//! buffers outside a scratch buffer, packet ops in a `Simple` plan (whose scratch is not sized
//! for packets) or inside a pipeline, a pipeline op that covers more than its `num_chunks`,
//! nested pipelines, and the references of one op spanning different numbers of chunks.

use mscclpp_host::error::PlanError;
use std::collections::BTreeMap;

use mscclpp_host::{Error, Result};
use mscclpp_shared::executor::{
    EXEC_MAX_CHANNELS, EXEC_MAX_OP_BUFFERS, EXEC_MAX_OP_IDS, EXEC_MAX_OPS, EXEC_MAX_REMOTE_BUFFERS,
    EXEC_MAX_SEMAPHORES, EXEC_PLAN_BARRIERS,
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// Most threads per block a plan may ask for.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

/// Most chunks a buffer of a rank may be cut into (MSCCL++ counts them in an `int`; far more
/// than any real plan).
pub const MAX_CHUNKS: u64 = 1 << 24;

/// Most threadblocks a rank's program may have.
pub const MAX_THREADBLOCKS: usize = 4096;

/// A buffer of a rank (MSCCL++ `BufferType`: `"i"`, `"o"`, `"s"`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum BufferKind {
    /// The input (`"i"`).
    Input,
    /// The output (`"o"`).
    Output,
    /// The scratch buffer the executor allocates (`"s"`).
    Scratch,
}

impl BufferKind {
    /// The plan's spelling.
    pub const fn code(self) -> &'static str {
        match self {
            Self::Input => "i",
            Self::Output => "o",
            Self::Scratch => "s",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "i" => Some(Self::Input),
            "o" => Some(Self::Output),
            "s" => Some(Self::Scratch),
            _ => None,
        }
    }
}

/// How a buffer or a peer is reached (MSCCL++ `ChannelType`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum ChannelKind {
    /// Loads and stores of the peer's memory (NVLink / PCIe P2P; shared memory on the CPU
    /// backend), signals through a GPU-to-GPU semaphore.
    Memory,
    /// The host proxy (copy engine, network), signals through the proxy.
    Port,
    /// NVLink multicast (NVLS). Parsed, then refused.
    Switch,
    /// No channel.
    None,
}

impl ChannelKind {
    /// The plan's spelling.
    pub const fn code(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Port => "port",
            Self::Switch => "switch",
            Self::None => "none",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "memory" => Some(Self::Memory),
            "port" => Some(Self::Port),
            "switch" => Some(Self::Switch),
            "none" => Some(Self::None),
            _ => None,
        }
    }
}

/// The plan's protocol: `Simple`, or `LL` (its scratch holds LL packets, twice the data).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Protocol {
    /// `"Simple"`.
    Simple,
    /// `"LL"`.
    Ll,
}

/// The reduction a reducing op names (`reduce_op`; the DSL's `ReduceOperationType`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReduceKind {
    /// `"sum"` (also what an op without `reduce_op` does, as in MSCCL++).
    Sum,
    /// `"min"`.
    Min,
    /// `"max"`.
    Max,
}

impl ReduceKind {
    /// The plan's spelling.
    pub const fn code(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Min => "min",
            Self::Max => "max",
        }
    }
}

macro_rules! op_kinds {
    ($($(#[$m:meta])* $v:ident = $name:literal,)*) => {
        /// Every op MSCCL++'s plan reader accepts, by its JSON name.
        #[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
        pub enum OpKind { $($(#[$m])* $v,)* }

        impl OpKind {
            /// Every kind.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$v,)*];

            /// The op's JSON name.
            pub const fn name(self) -> &'static str {
                match self { $(OpKind::$v => $name,)* }
            }

            /// The kind a JSON name denotes.
            pub fn from_name(s: &str) -> Option<Self> {
                match s { $($name => Some(OpKind::$v),)* _ => None }
            }
        }
    };
}

op_kinds! {
    /// `nop`: the block meets (a `__syncthreads`).
    Nop = "nop",
    /// `barrier`: `num_threadblocks` blocks of the rank meet.
    Barrier = "barrier",
    /// `put`: local data to peers' buffers.
    Put = "put",
    /// `pws`: `put` over port channels with a signal.
    PutWithSignal = "pws",
    /// `pwsf`: `pws`, then a flush.
    PutWithSignalAndFlush = "pwsf",
    /// `get`: peers' data into local buffers.
    Get = "get",
    /// `copy`: local to local.
    Copy = "copy",
    /// `signal`.
    Signal = "signal",
    /// `wait`.
    Wait = "wait",
    /// `flush` (port channels).
    Flush = "flush",
    /// `re`: reduce local buffers into a local buffer.
    Reduce = "re",
    /// `res`: `re`, and the result to peers' buffers.
    ReduceSend = "res",
    /// `rre`: reduce a local buffer with peers' buffers into a local buffer.
    ReadReduce = "rre",
    /// `rres`: `rre`, and the result to peers' buffers.
    ReadReduceSend = "rres",
    /// `ppkt`: local data as LL packets into peers' scratch.
    PutPackets = "ppkt",
    /// `rppkt`: local packets forwarded into peers' scratch.
    ReadPutPackets = "rppkt",
    /// `respkt`: local data reduced with local packets, stored and sent as packets.
    ReduceSendPackets = "respkt",
    /// `cpkt`: local data as packets into the local scratch.
    CopyPackets = "cpkt",
    /// `upkt`: local packets' payload into a local buffer.
    UnpackPackets = "upkt",
    /// `repkt`: local data reduced with local packets into a local buffer.
    ReducePackets = "repkt",
    /// `recpkt`: `repkt`, and the result as packets into the local scratch.
    ReduceCopyPackets = "recpkt",
    /// `recspkt`: `recpkt`, and the result as packets into peers' scratch.
    ReduceCopySendPackets = "recspkt",
    /// `glres`: multicast load-reduce-store (switch channels; refused).
    MultiLoadReduceStore = "glres",
    /// `gstore`: multicast store (switch channels; refused).
    MultiStore = "gstore",
    /// `rlxsignal`: a signal that publishes nothing.
    RelaxedSignal = "rlxsignal",
    /// `rlxwait`: a wait that orders nothing.
    RelaxedWait = "rlxwait",
    /// `pipeline`: the ops inside, repeated over units of the data.
    Pipeline = "pipeline",
    /// `sem_acquire`: take a token of a device semaphore of the rank.
    SemAcquire = "sem_acquire",
    /// `sem_release`: give a token to a device semaphore of the rank.
    SemRelease = "sem_release",
}

impl OpKind {
    /// Whether the op reads or writes LL packets.
    pub const fn is_packet(self) -> bool {
        matches!(
            self,
            Self::PutPackets
                | Self::ReadPutPackets
                | Self::ReduceSendPackets
                | Self::CopyPackets
                | Self::UnpackPackets
                | Self::ReducePackets
                | Self::ReduceCopyPackets
                | Self::ReduceCopySendPackets
        )
    }

    /// Whether the op reduces (and so may name `reduce_op`).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Self::Reduce
                | Self::ReduceSend
                | Self::ReadReduce
                | Self::ReadReduceSend
                | Self::ReduceSendPackets
                | Self::ReducePackets
                | Self::ReduceCopyPackets
                | Self::ReduceCopySendPackets
                | Self::MultiLoadReduceStore
        )
    }

    /// Whether the op moves data (and so takes a pipeline's unit offsets and a threadblock
    /// group's share).
    pub const fn moves_data(self) -> bool {
        !matches!(
            self,
            Self::Nop
                | Self::Barrier
                | Self::Signal
                | Self::Wait
                | Self::RelaxedSignal
                | Self::RelaxedWait
                | Self::Flush
                | Self::Pipeline
                | Self::SemAcquire
                | Self::SemRelease
        )
    }
}

/// What a buffer reference of an op names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target {
    /// A buffer of this rank (`"type"`).
    Local(BufferKind),
    /// A peer's buffer (`"buffer_id"`): index into the block's remote buffers reached by the
    /// op's channel type.
    Remote(usize),
    /// A switch channel's buffer (`"switch_channel_id"`; refused).
    Switch(usize),
}

/// One buffer reference of an op: `size` chunks from chunk `index`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slice {
    /// Which buffer.
    pub target: Target,
    /// First chunk.
    pub index: u64,
    /// Chunks.
    pub size: u64,
}

/// A threadblock group (`tbg_info`): this block does share `tb_id` of `tbg_size` of the op's
/// data (MSCCL++'s split, in units of the plan's buffer alignment).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Tbg {
    /// This block's share.
    pub tb_id: u64,
    /// Shares.
    pub tbg_size: u64,
}

/// A pipeline's loop (`iter_context`) and the ops it repeats.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Pipeline {
    /// Bytes of one iteration.
    pub unit_size: u64,
    /// Chunks the loop covers (iterations = `num_chunks` chunks / `unit_size`, rounded up).
    pub num_chunks: u64,
    /// The ops run on every iteration.
    pub ops: Vec<Op>,
}

/// One op of a threadblock.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// Sources (`src_buff`).
    pub src: Vec<Slice>,
    /// Destinations (`dst_buff`).
    pub dst: Vec<Slice>,
    /// Channels of the block (`channel_ids`).
    pub channel_ids: Vec<usize>,
    /// How its remote buffers and channels are reached (`channel_type`).
    pub channel_type: Option<ChannelKind>,
    /// The reduction (`reduce_op`).
    pub reduce: Option<ReduceKind>,
    /// Threadblock group (`tbg_info`).
    pub tbg: Option<Tbg>,
    /// `barrier_id`.
    pub barrier_id: Option<usize>,
    /// `num_threadblocks` of a barrier.
    pub num_threadblocks: Option<usize>,
    /// `semaphore_ids`.
    pub semaphore_ids: Vec<usize>,
    /// A pipeline's loop and ops.
    pub pipeline: Option<Pipeline>,
}

impl Op {
    /// An op of `kind` with nothing else set.
    pub fn new(kind: OpKind) -> Self {
        Self {
            kind,
            src: Vec::new(),
            dst: Vec::new(),
            channel_ids: Vec::new(),
            channel_type: None,
            reduce: None,
            tbg: None,
            barrier_id: None,
            num_threadblocks: None,
            semaphore_ids: Vec::new(),
            pipeline: None,
        }
    }
}

/// Channels or remote buffers of one kind a threadblock names.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TbRefs {
    /// The channel kind (`channel_type` / `access_channel_type`).
    pub kind: ChannelKind,
    /// Indexes into the GPU's channels of that kind / its remote buffers.
    pub ids: Vec<usize>,
}

/// One threadblock of a GPU's program.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Threadblock {
    /// Its position.
    pub id: usize,
    /// Its ops.
    pub ops: Vec<Op>,
    /// `channels`: which of the GPU's channels it uses; an op's `channel_ids` index the
    /// concatenation of the entries of the op's kind.
    pub channels: Vec<TbRefs>,
    /// `remote_buffer_refs`: which of the GPU's remote buffers it reaches; an op's
    /// `buffer_id` indexes the concatenation of the entries of the op's channel kind.
    pub remote_buffer_refs: Vec<TbRefs>,
}

/// A channel declaration of a GPU.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChannelDecl {
    /// Memory, port or switch.
    pub kind: ChannelKind,
    /// Memory and port: one channel per entry, to that rank.
    pub connected_to: Vec<usize>,
    /// Switch: the buffer multicast (`buffer_type`).
    pub buffer: Option<BufferKind>,
    /// Switch: `(size, ranks)` of each rank group.
    pub rank_groups: Vec<(u64, Vec<usize>)>,
}

/// A peer's buffer a GPU's program reaches.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RemoteBufferDecl {
    /// The peer.
    pub rank: usize,
    /// Which of its buffers.
    pub kind: BufferKind,
    /// How (`access_channel_types`).
    pub access: Vec<ChannelKind>,
}

/// One GPU's (rank's) program.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GpuProgram {
    /// The rank (equal to its position).
    pub id: usize,
    /// Chunks the input is cut into.
    pub input_chunks: u64,
    /// Chunks the output is cut into.
    pub output_chunks: u64,
    /// Chunks of scratch the program uses.
    pub scratch_chunks: u64,
    /// The threadblocks.
    pub threadblocks: Vec<Threadblock>,
    /// The channels.
    pub channels: Vec<ChannelDecl>,
    /// The peers' buffers it reaches.
    pub remote_buffers: Vec<RemoteBufferDecl>,
    /// Initial values of its device semaphores.
    pub semaphores: Vec<u64>,
}

impl GpuProgram {
    /// The peers of this GPU's channels of `kind`, one entry per channel, in channel-id order.
    pub fn channel_peers(&self, kind: ChannelKind) -> Vec<usize> {
        self.channels
            .iter()
            .filter(|c| c.kind == kind)
            .flat_map(|c| c.connected_to.iter().copied())
            .collect()
    }

    /// Chunks of a buffer of this rank.
    pub fn chunks(&self, kind: BufferKind) -> u64 {
        match kind {
            BufferKind::Input => self.input_chunks,
            BufferKind::Output => self.output_chunks,
            BufferKind::Scratch => self.scratch_chunks,
        }
    }
}

/// A whole plan: every rank's program and the settings around them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PlanDoc {
    /// The plan's name.
    pub name: String,
    /// The collective it implements (`allreduce`, `allgather`, …): for an all-gather the size
    /// checked against the plan's range is the output's, else the input's.
    pub collective: String,
    /// `Simple` or `LL`.
    pub protocol: Protocol,
    /// Whether the plan runs in place (input and output overlapping as NCCL's in-place calls
    /// do).
    pub inplace: bool,
    /// MSCCL++'s resource sharing between plans (accepted; here every (plan, buffers, sizes)
    /// has its own scratch, which gives the same results).
    pub reuse_resources: bool,
    /// The ranks' programs, rank `r` at position `r`.
    pub gpus: Vec<GpuProgram>,
    /// Threads per block (1 to 1024).
    pub num_threads_per_block: u32,
    /// Two scratch halves, used by alternate launches.
    pub use_double_scratch_buffer: bool,
    /// Chunk boundaries are multiples of this (bytes; a multiple of 16).
    pub buffer_alignment: u64,
    /// Smallest message the plan serves (bytes).
    pub min_message_size: u64,
    /// Largest message the plan serves (bytes).
    pub max_message_size: u64,
}

// ------------------------------------------------------------------------------------------
// Reading
// ------------------------------------------------------------------------------------------

/// Where in the plan: a JSON path, and the plan's name for the error.
#[derive(Clone)]
struct At<'a> {
    plan: &'a str,
    path: String,
}

impl<'a> At<'a> {
    fn key(&self, key: &str) -> At<'a> {
        let path = if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        };
        At {
            plan: self.plan,
            path,
        }
    }

    fn idx(&self, i: usize) -> At<'a> {
        At {
            plan: self.plan,
            path: format!("{}[{i}]", self.path),
        }
    }

    fn err(&self, problem: impl Into<String>) -> Error {
        Error::Plan(PlanError::Malformed {
            plan: self.plan.to_string(),
            field: if self.path.is_empty() {
                "(the plan)".to_string()
            } else {
                self.path.clone()
            },
            problem: problem.into(),
        })
    }

    fn unsupported(&self, what: impl Into<String>) -> Error {
        Error::Plan(PlanError::Unsupported {
            plan: self.plan.to_string(),
            field: self.path.clone(),
            what: what.into(),
        })
    }

    fn obj<'v>(&self, v: &'v Value) -> Result<&'v Map<String, Value>> {
        v.as_object()
            .ok_or_else(|| self.err(format!("expected an object, found {}", kind_of(v))))
    }

    fn arr<'v>(&self, v: &'v Value) -> Result<&'v Vec<Value>> {
        v.as_array()
            .ok_or_else(|| self.err(format!("expected an array, found {}", kind_of(v))))
    }

    /// The field `key` of `m`, deserialized, or `None` when absent.
    fn opt<T: DeserializeOwned>(&self, m: &Map<String, Value>, key: &str) -> Result<Option<T>> {
        match m.get(key) {
            None => Ok(None),
            Some(v) => T::deserialize(v)
                .map(Some)
                .map_err(|e| self.key(key).err(e.to_string())),
        }
    }

    /// The field `key` of `m`, deserialized; missing is an error.
    fn req<T: DeserializeOwned>(&self, m: &Map<String, Value>, key: &str) -> Result<T> {
        self.opt(m, key)?
            .ok_or_else(|| self.key(key).err("missing"))
    }

    /// The array field `key` of `m` (absent: empty).
    fn list<'v>(&self, m: &'v Map<String, Value>, key: &str) -> Result<&'v [Value]> {
        match m.get(key) {
            None => Ok(&[]),
            Some(v) => self.key(key).arr(v).map(|a| a.as_slice()),
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An index field: an unsigned integer below `bound` (what it indexes, for the message).
fn index_below(at: &At, v: u64, bound: usize, what: &str) -> Result<usize> {
    if v < bound as u64 {
        Ok(v as usize)
    } else {
        Err(at.err(format!("{v} is out of range: {what} has {bound}")))
    }
}

impl PlanDoc {
    /// The reduction of the plan's first reducing op (pipelines' ops included; `Sum` where
    /// the op names none, as MSCCL++ writes sums), or `None` for a plan that does not reduce.
    pub fn reduction(&self) -> Option<ReduceKind> {
        self.gpus
            .iter()
            .flat_map(|g| &g.threadblocks)
            .flat_map(|t| &t.ops)
            .flat_map(|o| std::iter::once(o).chain(o.pipeline.iter().flat_map(|p| &p.ops)))
            .find_map(|o| o.reduce.or(o.kind.reduces().then_some(ReduceKind::Sum)))
    }

    /// Parses and checks a plan (module docs). `origin` names it in errors until its own
    /// name has been read (a file path, say).
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            Error::Plan(PlanError::Malformed {
                plan: origin.to_string(),
                field: format!("JSON at line {}, column {}", e.line(), e.column()),
                problem: e.to_string(),
            })
        })?;
        let root = At {
            plan: origin,
            path: String::new(),
        };
        let m = root.obj(&v)?;
        let name: String = root.req(m, "name")?;
        let at = At {
            plan: &name,
            path: String::new(),
        };
        let protocol = match at.req::<String>(m, "protocol")?.as_str() {
            "Simple" => Protocol::Simple,
            "LL" => Protocol::Ll,
            other => {
                return Err(at
                    .key("protocol")
                    .err(format!("{other:?} is not a protocol (Simple or LL)")));
            }
        };
        let doc = PlanDoc {
            collective: at.req(m, "collective")?,
            protocol,
            inplace: at.req(m, "inplace")?,
            reuse_resources: at.opt(m, "reuse_resources")?.unwrap_or(false),
            gpus: Vec::new(),
            num_threads_per_block: at.opt(m, "num_threads_per_block")?.unwrap_or(1024),
            use_double_scratch_buffer: at.opt(m, "use_double_scratch_buffer")?.unwrap_or(false),
            buffer_alignment: at.opt(m, "buffer_alignment")?.unwrap_or(16),
            min_message_size: at.opt(m, "min_message_size")?.unwrap_or(0),
            max_message_size: at.opt(m, "max_message_size")?.unwrap_or(u64::MAX),
            name: name.clone(),
        };
        let mut doc = doc;
        if doc.num_threads_per_block == 0 || doc.num_threads_per_block > MAX_THREADS_PER_BLOCK {
            return Err(at.key("num_threads_per_block").err(format!(
                "{} threads: a block has 1 to {MAX_THREADS_PER_BLOCK}",
                doc.num_threads_per_block
            )));
        }
        if doc.buffer_alignment == 0 || !doc.buffer_alignment.is_multiple_of(16) {
            return Err(at.key("buffer_alignment").err(format!(
                "{} bytes: the interpreter needs a positive multiple of 16",
                doc.buffer_alignment
            )));
        }
        if doc.min_message_size > doc.max_message_size {
            return Err(at.key("min_message_size").err(format!(
                "{} is above max_message_size {}",
                doc.min_message_size, doc.max_message_size
            )));
        }
        let gpus_at = at.key("gpus");
        let gpus = m
            .get("gpus")
            .ok_or_else(|| gpus_at.err("missing"))
            .and_then(|g| gpus_at.arr(g))?;
        if gpus.is_empty() {
            return Err(gpus_at.err("a plan needs at least one GPU"));
        }
        let nranks = gpus.len();
        for (r, g) in gpus.iter().enumerate() {
            doc.gpus.push(read_gpu(&gpus_at.idx(r), g, r, nranks)?);
        }
        check_refs(&doc)?;
        Ok(doc)
    }
}

fn read_gpu(at: &At, v: &Value, rank: usize, nranks: usize) -> Result<GpuProgram> {
    let m = at.obj(v)?;
    let id: u64 = at.req(m, "id")?;
    if id != rank as u64 {
        return Err(at.key("id").err(format!(
            "rank id {id} at position {rank}: ids must equal positions"
        )));
    }
    let mut g = GpuProgram {
        id: rank,
        input_chunks: at.req(m, "input_chunks")?,
        output_chunks: at.req(m, "output_chunks")?,
        scratch_chunks: at.req(m, "scratch_chunks")?,
        threadblocks: Vec::new(),
        channels: Vec::new(),
        remote_buffers: Vec::new(),
        semaphores: Vec::new(),
    };
    for (field, n) in [
        ("input_chunks", g.input_chunks),
        ("output_chunks", g.output_chunks),
        ("scratch_chunks", g.scratch_chunks),
    ] {
        if n == 0 && field != "scratch_chunks" {
            return Err(at.key(field).err("0 chunks: the message could not be cut"));
        }
        if n > MAX_CHUNKS {
            return Err(at
                .key(field)
                .err(format!("{n} chunks: a buffer has at most {MAX_CHUNKS}")));
        }
    }
    let ch_at = at.key("channels");
    for (i, c) in at.list(m, "channels")?.iter().enumerate() {
        g.channels
            .push(read_channel(&ch_at.idx(i), c, rank, nranks)?);
    }
    let rb_at = at.key("remote_buffers");
    for (i, b) in at.list(m, "remote_buffers")?.iter().enumerate() {
        let a = rb_at.idx(i);
        let bm = a.obj(b)?;
        let peer = index_below(
            &a.key("rank"),
            a.req(bm, "rank")?,
            nranks,
            "the plan's GPUs",
        )?;
        if peer == rank {
            return Err(a.key("rank").err("a remote buffer of the rank itself"));
        }
        let kind = read_buffer_kind(&a.key("type"), &a.req::<String>(bm, "type")?)?;
        let mut access = Vec::new();
        let acc_at = a.key("access_channel_types");
        for (j, t) in a.list(bm, "access_channel_types")?.iter().enumerate() {
            let ta = acc_at.idx(j);
            let s: String = String::deserialize_at(&ta, t)?;
            match ChannelKind::parse(&s) {
                Some(k @ (ChannelKind::Memory | ChannelKind::Port)) => access.push(k),
                Some(k) => {
                    return Err(ta.err(format!(
                        "a remote buffer is reached through memory or port channels, not {}",
                        k.code()
                    )));
                }
                None => return Err(ta.err(format!("{s:?} is not a channel type"))),
            }
        }
        if access.is_empty() {
            return Err(acc_at.err("a remote buffer nobody can reach"));
        }
        g.remote_buffers.push(RemoteBufferDecl {
            rank: peer,
            kind,
            access,
        });
    }
    let sem_at = at.key("semaphores");
    for (i, s) in at.list(m, "semaphores")?.iter().enumerate() {
        let a = sem_at.idx(i);
        g.semaphores.push(a.req(a.obj(s)?, "init_value")?);
    }
    if g.semaphores.len() > EXEC_MAX_SEMAPHORES {
        return Err(sem_at.err(format!(
            "{} semaphores: a rank has at most {EXEC_MAX_SEMAPHORES}",
            g.semaphores.len()
        )));
    }
    let tb_at = at.key("threadblocks");
    let tbs = at.list(m, "threadblocks")?;
    if tbs.len() > MAX_THREADBLOCKS {
        return Err(tb_at.err(format!(
            "{} threadblocks: a rank has at most {MAX_THREADBLOCKS}",
            tbs.len()
        )));
    }
    for (i, t) in tbs.iter().enumerate() {
        g.threadblocks.push(read_threadblock(&tb_at.idx(i), t, i)?);
    }
    Ok(g)
}

trait DeserializeAt: Sized {
    fn deserialize_at(at: &At, v: &Value) -> Result<Self>;
}

impl<T: DeserializeOwned> DeserializeAt for T {
    fn deserialize_at(at: &At, v: &Value) -> Result<Self> {
        T::deserialize(v).map_err(|e| at.err(e.to_string()))
    }
}

fn read_buffer_kind(at: &At, s: &str) -> Result<BufferKind> {
    BufferKind::parse(s).ok_or_else(|| at.err(format!("{s:?} is not a buffer type (i, o or s)")))
}

fn read_channel_kind(at: &At, s: &str) -> Result<ChannelKind> {
    ChannelKind::parse(s).ok_or_else(|| {
        at.err(format!(
            "{s:?} is not a channel type (memory, port, switch or none)"
        ))
    })
}

fn read_channel(at: &At, v: &Value, rank: usize, nranks: usize) -> Result<ChannelDecl> {
    let m = at.obj(v)?;
    let kind = read_channel_kind(
        &at.key("channel_type"),
        &at.req::<String>(m, "channel_type")?,
    )?;
    let mut c = ChannelDecl {
        kind,
        connected_to: Vec::new(),
        buffer: None,
        rank_groups: Vec::new(),
    };
    match kind {
        ChannelKind::Memory | ChannelKind::Port => {
            let to_at = at.key("connected_to");
            for (i, p) in at.list(m, "connected_to")?.iter().enumerate() {
                let pa = to_at.idx(i);
                let peer =
                    index_below(&pa, u64::deserialize_at(&pa, p)?, nranks, "the plan's GPUs")?;
                if peer == rank {
                    return Err(pa.err("a channel from a rank to itself"));
                }
                c.connected_to.push(peer);
            }
        }
        ChannelKind::Switch => {
            c.buffer = Some(read_buffer_kind(
                &at.key("buffer_type"),
                &at.req::<String>(m, "buffer_type")?,
            )?);
            let g_at = at.key("rank_groups");
            for (i, grp) in at.list(m, "rank_groups")?.iter().enumerate() {
                let ga = g_at.idx(i);
                let gm = ga.obj(grp)?;
                let ranks: Vec<u64> = ga.req(gm, "ranks")?;
                let mut rs = Vec::new();
                for (j, r) in ranks.into_iter().enumerate() {
                    rs.push(index_below(
                        &ga.key("ranks").idx(j),
                        r,
                        nranks,
                        "the plan's GPUs",
                    )?);
                }
                c.rank_groups.push((ga.req(gm, "size")?, rs));
            }
        }
        ChannelKind::None => return Err(at.key("channel_type").err("a channel of type none")),
    }
    Ok(c)
}

fn read_tb_refs(at: &At, v: &Value, kind_key: &str, ids_key: &str) -> Result<TbRefs> {
    let m = at.obj(v)?;
    let kind = read_channel_kind(&at.key(kind_key), &at.req::<String>(m, kind_key)?)?;
    let ids: Vec<u64> = at.req(m, ids_key)?;
    Ok(TbRefs {
        kind,
        ids: ids.into_iter().map(|i| i as usize).collect(),
    })
}

fn read_threadblock(at: &At, v: &Value, pos: usize) -> Result<Threadblock> {
    let m = at.obj(v)?;
    let id: u64 = at.req(m, "id")?;
    if id != pos as u64 {
        return Err(at.key("id").err(format!(
            "threadblock id {id} at position {pos}: ids must equal positions"
        )));
    }
    let mut tb = Threadblock {
        id: pos,
        ops: Vec::new(),
        channels: Vec::new(),
        remote_buffer_refs: Vec::new(),
    };
    let ch_at = at.key("channels");
    for (i, c) in at.list(m, "channels")?.iter().enumerate() {
        tb.channels.push(read_tb_refs(
            &ch_at.idx(i),
            c,
            "channel_type",
            "channel_ids",
        )?);
    }
    let rb_at = at.key("remote_buffer_refs");
    for (i, r) in at.list(m, "remote_buffer_refs")?.iter().enumerate() {
        tb.remote_buffer_refs.push(read_tb_refs(
            &rb_at.idx(i),
            r,
            "access_channel_type",
            "remote_buffer_ids",
        )?);
    }
    let ops_at = at.key("ops");
    for (i, o) in at.list(m, "ops")?.iter().enumerate() {
        tb.ops.push(read_op(&ops_at.idx(i), o, false)?);
    }
    Ok(tb)
}

fn read_slices(at: &At, m: &Map<String, Value>, key: &str) -> Result<Vec<Slice>> {
    let list_at = at.key(key);
    let mut out = Vec::new();
    for (i, b) in at.list(m, key)?.iter().enumerate() {
        let a = list_at.idx(i);
        let bm = a.obj(b)?;
        let local: Option<String> = a.opt(bm, "type")?;
        let remote: Option<u64> = a.opt(bm, "buffer_id")?;
        let switch: Option<u64> = a.opt(bm, "switch_channel_id")?;
        let target = match (local, remote, switch) {
            (_, Some(id), None) => Target::Remote(id as usize),
            (Some(t), None, None) => Target::Local(read_buffer_kind(&a.key("type"), &t)?),
            (_, None, Some(id)) => Target::Switch(id as usize),
            (_, Some(_), Some(_)) => {
                return Err(a.err("both buffer_id and switch_channel_id"));
            }
            (None, None, None) => {
                return Err(a.err("names no buffer (type, buffer_id or switch_channel_id)"));
            }
        };
        let s = Slice {
            target,
            index: a.req(bm, "index")?,
            size: a.req(bm, "size")?,
        };
        if s.size == 0 {
            return Err(a.key("size").err("0 chunks"));
        }
        out.push(s);
    }
    if out.len() > EXEC_MAX_OP_BUFFERS {
        return Err(list_at.err(format!(
            "{} buffers: an op has at most {EXEC_MAX_OP_BUFFERS} on each side",
            out.len()
        )));
    }
    Ok(out)
}

fn read_ids(at: &At, m: &Map<String, Value>, key: &str) -> Result<Vec<usize>> {
    let ids: Vec<u64> = at.opt(m, key)?.unwrap_or_default();
    if ids.len() > EXEC_MAX_OP_IDS {
        return Err(at.key(key).err(format!(
            "{} ids: an op names at most {EXEC_MAX_OP_IDS}",
            ids.len()
        )));
    }
    Ok(ids.into_iter().map(|i| i as usize).collect())
}

fn read_op(at: &At, v: &Value, in_pipeline: bool) -> Result<Op> {
    let m = at.obj(v)?;
    let name: String = at.req(m, "name")?;
    let kind = OpKind::from_name(&name).ok_or_else(|| {
        at.key("name")
            .err(format!("{name:?} is not an op MSCCL++ knows"))
    })?;
    if matches!(kind, OpKind::MultiLoadReduceStore | OpKind::MultiStore) {
        return Err(at.key("name").unsupported(format!(
            "{name} (NVLink multicast through a switch channel)"
        )));
    }
    let mut op = Op::new(kind);
    op.src = read_slices(at, m, "src_buff")?;
    op.dst = read_slices(at, m, "dst_buff")?;
    op.channel_ids = read_ids(at, m, "channel_ids")?;
    op.semaphore_ids = read_ids(at, m, "semaphore_ids")?;
    if let Some(t) = at.opt::<String>(m, "channel_type")? {
        op.channel_type = Some(read_channel_kind(&at.key("channel_type"), &t)?);
    }
    if let Some(r) = at.opt::<String>(m, "reduce_op")? {
        op.reduce = Some(match r.as_str() {
            "sum" => ReduceKind::Sum,
            "min" => ReduceKind::Min,
            "max" => ReduceKind::Max,
            other => {
                return Err(at
                    .key("reduce_op")
                    .err(format!("{other:?} is not a reduction (sum, min or max)")));
            }
        });
    }
    if let Some(t) = m.get("tbg_info") {
        let ta = at.key("tbg_info");
        let tm = ta.obj(t)?;
        let tbg = Tbg {
            tb_id: ta.req(tm, "tb_id")?,
            tbg_size: ta.req(tm, "tbg_size")?,
        };
        if tbg.tbg_size == 0 || tbg.tb_id >= tbg.tbg_size || tbg.tbg_size > MAX_THREADBLOCKS as u64
        {
            return Err(ta.err(format!(
                "share {} of {}: a group has at least one block and shares below its size",
                tbg.tb_id, tbg.tbg_size
            )));
        }
        op.tbg = Some(tbg);
    }
    op.barrier_id = at.opt::<u64>(m, "barrier_id")?.map(|b| b as usize);
    op.num_threadblocks = at.opt::<u64>(m, "num_threadblocks")?.map(|b| b as usize);
    if kind == OpKind::Pipeline {
        if in_pipeline {
            return Err(at.key("name").err("a pipeline inside a pipeline"));
        }
        let ia = at.key("iter_context");
        let im = m.get("iter_context").ok_or_else(|| ia.err("missing"))?;
        let im = ia.obj(im)?;
        let mut p = Pipeline {
            unit_size: ia.req(im, "unit_size")?,
            num_chunks: ia.req(im, "num_chunks")?,
            ops: Vec::new(),
        };
        if p.unit_size == 0 || !p.unit_size.is_multiple_of(16) {
            return Err(ia.key("unit_size").err(format!(
                "{} bytes: a pipeline's unit is a positive multiple of 16",
                p.unit_size
            )));
        }
        if p.num_chunks == 0 {
            return Err(ia.key("num_chunks").err("0 chunks"));
        }
        let ops_at = at.key("ops");
        for (i, o) in at.list(m, "ops")?.iter().enumerate() {
            p.ops.push(read_op(&ops_at.idx(i), o, true)?);
        }
        if p.ops.is_empty() {
            return Err(ops_at.err("a pipeline with no ops"));
        }
        op.pipeline = Some(p);
    }
    Ok(op)
}

// ------------------------------------------------------------------------------------------
// Cross-references and op shapes
// ------------------------------------------------------------------------------------------

/// A threadblock's channels and remote buffers, resolved: for each kind, indexes into the
/// GPU's channels of that kind / its remote buffers, in the order ops index them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockRefs {
    /// Memory channels (into [`GpuProgram::channel_peers`]`(Memory)`).
    pub memory_channels: Vec<usize>,
    /// Port channels.
    pub port_channels: Vec<usize>,
    /// Remote buffers reached through memory (into [`GpuProgram::remote_buffers`]).
    pub memory_buffers: Vec<usize>,
    /// Remote buffers reached through the proxy.
    pub port_buffers: Vec<usize>,
}

impl BlockRefs {
    /// The resolved tables of `tb`.
    pub fn of(tb: &Threadblock) -> Self {
        let mut r = Self::default();
        for c in &tb.channels {
            match c.kind {
                ChannelKind::Memory => r.memory_channels.extend(&c.ids),
                ChannelKind::Port => r.port_channels.extend(&c.ids),
                _ => {}
            }
        }
        for b in &tb.remote_buffer_refs {
            match b.kind {
                ChannelKind::Memory => r.memory_buffers.extend(&b.ids),
                ChannelKind::Port => r.port_buffers.extend(&b.ids),
                _ => {}
            }
        }
        r
    }

    /// The channels of `kind`.
    pub fn channels(&self, kind: ChannelKind) -> &[usize] {
        match kind {
            ChannelKind::Memory => &self.memory_channels,
            ChannelKind::Port => &self.port_channels,
            _ => &[],
        }
    }

    /// The remote buffers reached by `kind`.
    pub fn buffers(&self, kind: ChannelKind) -> &[usize] {
        match kind {
            ChannelKind::Memory => &self.memory_buffers,
            ChannelKind::Port => &self.port_buffers,
            _ => &[],
        }
    }
}

/// What a side of an op may hold, in order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ref {
    /// A local buffer, data.
    Data,
    /// A local scratch buffer holding packets.
    LocalPackets,
    /// A peer's buffer, data.
    Remote,
    /// A peer's scratch buffer, packets.
    RemotePackets,
}

/// The shape of one side: `first` entries that must come first (one each), then `rest` repeated
/// (`min_rest` at least).
#[derive(Clone, Copy)]
struct Side {
    first: &'static [Ref],
    rest: Option<Ref>,
    min_rest: usize,
}

impl Side {
    /// What entry `i` holds.
    fn at(&self, i: usize) -> Ref {
        self.first
            .get(i)
            .copied()
            .unwrap_or(self.rest.unwrap_or(Ref::Data))
    }
}

/// Whether reference `i` of the sources (`dst` false) or destinations of `op` holds packets.
pub(crate) fn is_packet_ref(op: &Op, dst: bool, i: usize) -> bool {
    let (s, d) = shape(op.kind, op.channel_type);
    matches!(
        if dst { d } else { s }.at(i),
        Ref::LocalPackets | Ref::RemotePackets
    )
}

const NONE: Side = Side {
    first: &[],
    rest: None,
    min_rest: 0,
};

const fn side(first: &'static [Ref], rest: Option<Ref>, min_rest: usize) -> Side {
    Side {
        first,
        rest,
        min_rest,
    }
}

/// (sources, destinations) of an op kind that moves data, over channels of kind `ch`; pairs
/// mean `src[k]` with `dst[k]`.
fn shape(kind: OpKind, ch: Option<ChannelKind>) -> (Side, Side) {
    use Ref::*;
    let port = ch == Some(ChannelKind::Port);
    match kind {
        OpKind::Copy => (side(&[Data], None, 0), side(&[Data], None, 0)),
        OpKind::Put | OpKind::PutWithSignal | OpKind::PutWithSignalAndFlush => {
            (side(&[], Some(Data), 1), side(&[], Some(Remote), 1))
        }
        OpKind::Get => (side(&[], Some(Remote), 1), side(&[], Some(Data), 1)),
        OpKind::Reduce => (side(&[Data], Some(Data), 1), side(&[Data], None, 0)),
        OpKind::ReduceSend => (side(&[Data], Some(Data), 1), side(&[Data], Some(Remote), 1)),
        OpKind::ReadReduce => (side(&[Data], Some(Remote), 1), side(&[Data], None, 0)),
        OpKind::ReadReduceSend => (
            side(&[Data], Some(Remote), 1),
            side(&[Data], Some(Remote), 1),
        ),
        OpKind::PutPackets => (
            side(&[], Some(if port { LocalPackets } else { Data }), 1),
            side(&[], Some(RemotePackets), 1),
        ),
        OpKind::ReadPutPackets => (
            side(&[LocalPackets], None, 0),
            side(&[], Some(RemotePackets), 1),
        ),
        OpKind::CopyPackets => (side(&[Data], None, 0), side(&[LocalPackets], None, 0)),
        OpKind::UnpackPackets => (side(&[LocalPackets], None, 0), side(&[Data], None, 0)),
        OpKind::ReducePackets => (side(&[Data], Some(LocalPackets), 1), side(&[Data], None, 0)),
        OpKind::ReduceSendPackets => (
            side(&[Data], Some(LocalPackets), 1),
            side(&[Data], Some(RemotePackets), 1),
        ),
        OpKind::ReduceCopyPackets => (
            side(&[Data], Some(LocalPackets), 1),
            side(&[Data, LocalPackets], None, 0),
        ),
        OpKind::ReduceCopySendPackets => (
            side(&[Data], Some(LocalPackets), 1),
            side(&[Data, LocalPackets], Some(RemotePackets), 1),
        ),
        _ => (NONE, NONE),
    }
}

/// What an op's sources and destinations are, checked against its kind.
struct OpCheck<'a> {
    plan: &'a PlanDoc,
    gpu: &'a GpuProgram,
    refs: &'a BlockRefs,
    nblocks: usize,
}

impl OpCheck<'_> {
    fn check(&self, at: &At, op: &Op, pipeline: Option<&Pipeline>) -> Result<()> {
        let kind = op.kind;
        if op.kind.is_packet() {
            if self.plan.protocol != Protocol::Ll {
                return Err(at.key("name").err(format!(
                    "{} in a Simple plan: its scratch is not sized for packets (protocol LL)",
                    kind.name()
                )));
            }
            if pipeline.is_some() {
                return Err(at
                    .key("name")
                    .err(format!("{} inside a pipeline", kind.name())));
            }
        }
        if op.reduce.is_some() && !kind.reduces() {
            return Err(at
                .key("reduce_op")
                .err(format!("{} does not reduce", kind.name())));
        }
        if op.tbg.is_some() && !kind.moves_data() {
            return Err(at
                .key("tbg_info")
                .err(format!("{} moves no data", kind.name())));
        }
        let remote_or_channels = op
            .src
            .iter()
            .chain(&op.dst)
            .any(|s| !matches!(s.target, Target::Local(_)))
            || !op.channel_ids.is_empty();
        let ch = op.channel_type;
        if remote_or_channels && !matches!(ch, Some(ChannelKind::Memory | ChannelKind::Port)) {
            return Err(at.key("channel_type").err(format!(
                "{}: {} (memory or port is needed to reach a peer)",
                kind.name(),
                ch.map_or("missing", |c| c.code())
            )));
        }
        match kind {
            OpKind::Nop => self.no_buffers(at, op),
            OpKind::Signal
            | OpKind::Wait
            | OpKind::RelaxedSignal
            | OpKind::RelaxedWait
            | OpKind::Flush => {
                self.no_buffers(at, op)?;
                if kind == OpKind::Flush && ch != Some(ChannelKind::Port) {
                    return Err(at.key("channel_type").err("flush serves port channels"));
                }
                if op.channel_ids.is_empty() {
                    return Err(at.key("channel_ids").err("names no channel"));
                }
                self.channel_ids(at, op)
            }
            OpKind::Barrier => {
                self.no_buffers(at, op)?;
                let id = op
                    .barrier_id
                    .ok_or_else(|| at.key("barrier_id").err("missing"))?;
                index_below(
                    &at.key("barrier_id"),
                    id as u64,
                    EXEC_PLAN_BARRIERS,
                    "the barrier ids",
                )?;
                let n = op
                    .num_threadblocks
                    .ok_or_else(|| at.key("num_threadblocks").err("missing"))?;
                if n == 0 || n > self.nblocks {
                    return Err(at
                        .key("num_threadblocks")
                        .err(format!("{n} blocks: the rank has {}", self.nblocks)));
                }
                Ok(())
            }
            OpKind::SemAcquire | OpKind::SemRelease => {
                self.no_buffers(at, op)?;
                if op.semaphore_ids.is_empty() {
                    return Err(at.key("semaphore_ids").err("names no semaphore"));
                }
                for (i, &s) in op.semaphore_ids.iter().enumerate() {
                    index_below(
                        &at.key("semaphore_ids").idx(i),
                        s as u64,
                        self.gpu.semaphores.len(),
                        "the rank's semaphores",
                    )?;
                }
                Ok(())
            }
            OpKind::Pipeline => {
                self.no_buffers(at, op)?;
                let p = op.pipeline.as_ref().ok_or_else(|| at.err("no loop"))?;
                let most = self
                    .gpu
                    .input_chunks
                    .max(self.gpu.output_chunks)
                    .max(self.gpu.scratch_chunks);
                if p.num_chunks > most {
                    return Err(at.key("iter_context").key("num_chunks").err(format!(
                        "{} chunks: more than any buffer of the rank has ({most})",
                        p.num_chunks
                    )));
                }
                let ops_at = at.key("ops");
                for (i, inner) in p.ops.iter().enumerate() {
                    self.check(&ops_at.idx(i), inner, Some(p))?;
                }
                Ok(())
            }
            OpKind::MultiLoadReduceStore | OpKind::MultiStore => Err(at
                .key("name")
                .unsupported("NVLink multicast through a switch channel")),
            _ => self.data_op(at, op, pipeline),
        }
    }

    fn no_buffers(&self, at: &At, op: &Op) -> Result<()> {
        for (key, list) in [("src_buff", &op.src), ("dst_buff", &op.dst)] {
            if !list.is_empty() {
                return Err(at
                    .key(key)
                    .err(format!("{} takes no buffers", op.kind.name())));
            }
        }
        Ok(())
    }

    fn channel_ids(&self, at: &At, op: &Op) -> Result<()> {
        let ch = op.channel_type.unwrap_or(ChannelKind::None);
        let have = self.refs.channels(ch).len();
        for (i, &c) in op.channel_ids.iter().enumerate() {
            index_below(
                &at.key("channel_ids").idx(i),
                c as u64,
                have,
                &format!("the block's {} channels", ch.code()),
            )?;
        }
        Ok(())
    }

    fn data_op(&self, at: &At, op: &Op, pipeline: Option<&Pipeline>) -> Result<()> {
        let (srcs, dsts) = shape(op.kind, op.channel_type);
        let port = op.channel_type == Some(ChannelKind::Port);
        if matches!(
            op.kind,
            OpKind::PutWithSignal | OpKind::PutWithSignalAndFlush
        ) && !port
        {
            return Err(at
                .key("channel_type")
                .err(format!("{} serves port channels", op.kind.name())));
        }
        let remote_kind_ok = match op.kind {
            OpKind::Get
            | OpKind::Reduce
            | OpKind::ReduceSend
            | OpKind::ReadReduce
            | OpKind::ReadReduceSend
            | OpKind::ReduceSendPackets
            | OpKind::ReduceCopySendPackets => !port,
            _ => true,
        };
        if !remote_kind_ok
            && op
                .src
                .iter()
                .chain(&op.dst)
                .any(|s| matches!(s.target, Target::Remote(_)))
        {
            return Err(at.key("channel_type").err(format!(
                "{} reaches peers through memory channels only",
                op.kind.name()
            )));
        }
        self.side(&at.key("src_buff"), &op.src, srcs, op)?;
        self.side(&at.key("dst_buff"), &op.dst, dsts, op)?;
        // Pairs.
        if matches!(
            op.kind,
            OpKind::Put
                | OpKind::PutWithSignal
                | OpKind::PutWithSignalAndFlush
                | OpKind::Get
                | OpKind::PutPackets
        ) && op.src.len() != op.dst.len()
        {
            return Err(at.key("dst_buff").err(format!(
                "{} destinations for {} sources: {} moves pairs",
                op.dst.len(),
                op.src.len(),
                op.kind.name()
            )));
        }
        // Port ops push one trigger per destination on channel_ids[k].
        let pushes = port
            && matches!(
                op.kind,
                OpKind::Put
                    | OpKind::PutWithSignal
                    | OpKind::PutWithSignalAndFlush
                    | OpKind::PutPackets
                    | OpKind::ReadPutPackets
            );
        if pushes && op.channel_ids.len() != op.dst.len() {
            return Err(at.key("channel_ids").err(format!(
                "{} channels for {} destinations: a port {} pushes on one channel per destination",
                op.channel_ids.len(),
                op.dst.len(),
                op.kind.name()
            )));
        }
        self.channel_ids(at, op)?;
        // Equal spans.
        let span = op.src.first().or(op.dst.first()).map_or(0, |s| s.size);
        for (key, list) in [("src_buff", &op.src), ("dst_buff", &op.dst)] {
            for (i, s) in list.iter().enumerate() {
                if s.size != span {
                    return Err(at.key(key).idx(i).key("size").err(format!(
                        "{} chunks where the op's first buffer spans {span}: every buffer of an \
                         op spans the same number",
                        s.size
                    )));
                }
                if let Some(p) = pipeline
                    && s.size > p.num_chunks
                {
                    return Err(at.key(key).idx(i).key("size").err(format!(
                        "{} chunks in a pipeline over {} (its iterations would not cover them)",
                        s.size, p.num_chunks
                    )));
                }
            }
        }
        Ok(())
    }

    /// Checks one side against its shape and every reference's bounds.
    fn side(&self, at: &At, list: &[Slice], want: Side, op: &Op) -> Result<()> {
        let n_first = want.first.len();
        if list.len() < n_first + want.min_rest || (want.rest.is_none() && list.len() > n_first) {
            let want_n = if want.rest.is_some() {
                format!("at least {}", n_first + want.min_rest)
            } else {
                format!("{n_first}")
            };
            return Err(at.err(format!(
                "{} buffers where {} takes {want_n}",
                list.len(),
                op.kind.name()
            )));
        }
        for (i, s) in list.iter().enumerate() {
            let a = at.idx(i);
            let want_ref = want.at(i);
            let (rank, kind) = match s.target {
                Target::Local(k) => {
                    if matches!(want_ref, Ref::Remote | Ref::RemotePackets) {
                        return Err(a.err(format!(
                            "a local buffer where {} takes a peer's",
                            op.kind.name()
                        )));
                    }
                    (self.gpu.id, k)
                }
                Target::Remote(id) => {
                    if matches!(want_ref, Ref::Data | Ref::LocalPackets) {
                        return Err(a.err(format!(
                            "a peer's buffer where {} takes a local one",
                            op.kind.name()
                        )));
                    }
                    let ch = op.channel_type.unwrap_or(ChannelKind::None);
                    let table = self.refs.buffers(ch);
                    let slot = index_below(
                        &a.key("buffer_id"),
                        id as u64,
                        table.len(),
                        &format!(
                            "the block's remote buffers reached by {} channels",
                            ch.code()
                        ),
                    )?;
                    let rb = &self.plan.gpus[self.gpu.id].remote_buffers[table[slot]];
                    (rb.rank, rb.kind)
                }
                Target::Switch(_) => {
                    return Err(a.unsupported("a switch channel's buffer (NVLink multicast)"));
                }
            };
            if matches!(want_ref, Ref::LocalPackets | Ref::RemotePackets)
                && kind != BufferKind::Scratch
            {
                return Err(a.err(format!(
                    "packets in the {} buffer: {} keeps packets in a scratch buffer",
                    match kind {
                        BufferKind::Input => "input",
                        BufferKind::Output => "output",
                        BufferKind::Scratch => "scratch",
                    },
                    op.kind.name()
                )));
            }
            let chunks = self.plan.gpus[rank].chunks(kind);
            if s.index.checked_add(s.size).is_none_or(|end| end > chunks) {
                return Err(a.err(format!(
                    "chunks {}..{} of rank {rank}'s {} buffer, which has {chunks}",
                    s.index,
                    s.index.saturating_add(s.size),
                    kind.code()
                )));
            }
        }
        Ok(())
    }
}

/// Checks everything that refers to something else: channels, remote buffers, ops.
fn check_refs(doc: &PlanDoc) -> Result<()> {
    for g in &doc.gpus {
        let gat = At {
            plan: &doc.name,
            path: format!("gpus[{}]", g.id),
        };
        for (i, c) in g.channels.iter().enumerate() {
            if c.kind == ChannelKind::Switch {
                return Err(gat
                    .key("channels")
                    .idx(i)
                    .unsupported("a switch channel (NVLink multicast)"));
            }
        }
        let mem = g.channel_peers(ChannelKind::Memory).len();
        let port = g.channel_peers(ChannelKind::Port).len();
        for tb in &g.threadblocks {
            let at = gat.key("threadblocks").idx(tb.id);
            for (i, c) in tb.channels.iter().enumerate() {
                let ca = at.key("channels").idx(i);
                let have = match c.kind {
                    ChannelKind::Memory => mem,
                    ChannelKind::Port => port,
                    ChannelKind::Switch => {
                        return Err(ca.unsupported("a switch channel (NVLink multicast)"));
                    }
                    ChannelKind::None => {
                        return Err(ca.key("channel_type").err("a channel of type none"));
                    }
                };
                for (j, &id) in c.ids.iter().enumerate() {
                    index_below(
                        &ca.key("channel_ids").idx(j),
                        id as u64,
                        have,
                        &format!("rank {}'s {} channels", g.id, c.kind.code()),
                    )?;
                }
            }
            for (i, r) in tb.remote_buffer_refs.iter().enumerate() {
                let ra = at.key("remote_buffer_refs").idx(i);
                if !matches!(r.kind, ChannelKind::Memory | ChannelKind::Port) {
                    return Err(ra.key("access_channel_type").err(format!(
                        "remote buffers are reached through memory or port channels, not {}",
                        r.kind.code()
                    )));
                }
                for (j, &id) in r.ids.iter().enumerate() {
                    let ia = ra.key("remote_buffer_ids").idx(j);
                    let b = index_below(
                        &ia,
                        id as u64,
                        g.remote_buffers.len(),
                        "the rank's remote buffers",
                    )?;
                    if !g.remote_buffers[b].access.contains(&r.kind) {
                        return Err(ia.err(format!(
                            "remote buffer {b} is not declared reachable through {} channels",
                            r.kind.code()
                        )));
                    }
                }
            }
            let refs = BlockRefs::of(tb);
            for kind in [ChannelKind::Memory, ChannelKind::Port] {
                if refs.channels(kind).len() > EXEC_MAX_CHANNELS {
                    return Err(at.key("channels").err(format!(
                        "{} {} channels: a block holds at most {EXEC_MAX_CHANNELS}",
                        refs.channels(kind).len(),
                        kind.code()
                    )));
                }
                if refs.buffers(kind).len() > EXEC_MAX_REMOTE_BUFFERS {
                    return Err(at.key("remote_buffer_refs").err(format!(
                        "{} remote buffers through {} channels: a block holds at most \
                         {EXEC_MAX_REMOTE_BUFFERS}",
                        refs.buffers(kind).len(),
                        kind.code()
                    )));
                }
            }
            let n_ops: usize = tb
                .ops
                .iter()
                .map(|o| 1 + o.pipeline.as_ref().map_or(0, |p| p.ops.len()))
                .sum();
            if n_ops > EXEC_MAX_OPS {
                return Err(at.key("ops").err(format!(
                    "{n_ops} ops (a pipeline and each op inside it count one): a block holds at \
                     most {EXEC_MAX_OPS}"
                )));
            }
            let check = OpCheck {
                plan: doc,
                gpu: g,
                refs: &refs,
                nblocks: g.threadblocks.len(),
            };
            for (i, op) in tb.ops.iter().enumerate() {
                check.check(&at.key("ops").idx(i), op, None)?;
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Writing
// ------------------------------------------------------------------------------------------

impl PlanDoc {
    /// The plan as MSCCL++'s DSL writes it (what [`PlanDoc::parse`] reads back unchanged).
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "collective": self.collective,
            "protocol": match self.protocol { Protocol::Simple => "Simple", Protocol::Ll => "LL" },
            "inplace": self.inplace,
            "reuse_resources": self.reuse_resources,
            "gpus": self.gpus.iter().map(gpu_json).collect::<Vec<_>>(),
            "num_threads_per_block": self.num_threads_per_block,
            "use_double_scratch_buffer": self.use_double_scratch_buffer,
            "buffer_alignment": self.buffer_alignment,
            "min_message_size": self.min_message_size,
            "max_message_size": self.max_message_size,
        })
    }
}

fn gpu_json(g: &GpuProgram) -> Value {
    json!({
        "id": g.id,
        "input_chunks": g.input_chunks,
        "output_chunks": g.output_chunks,
        "scratch_chunks": g.scratch_chunks,
        "threadblocks": g.threadblocks.iter().map(|tb| json!({
            "id": tb.id,
            "ops": tb.ops.iter().map(op_json).collect::<Vec<_>>(),
            "channels": tb.channels.iter().map(|c| json!({
                "channel_type": c.kind.code(), "channel_ids": c.ids,
            })).collect::<Vec<_>>(),
            "remote_buffer_refs": tb.remote_buffer_refs.iter().map(|r| json!({
                "access_channel_type": r.kind.code(), "remote_buffer_ids": r.ids,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "channels": g.channels.iter().map(|c| match c.kind {
            ChannelKind::Switch => json!({
                "channel_type": "switch",
                "buffer_type": c.buffer.map_or("i", |b| b.code()),
                "rank_groups": c.rank_groups.iter().map(|(size, ranks)| json!({
                    "size": size, "ranks": ranks,
                })).collect::<Vec<_>>(),
            }),
            k => json!({ "channel_type": k.code(), "connected_to": c.connected_to }),
        }).collect::<Vec<_>>(),
        "remote_buffers": g.remote_buffers.iter().map(|b| json!({
            "rank": b.rank,
            "type": b.kind.code(),
            "access_channel_types": b.access.iter().map(|a| a.code()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "semaphores": g.semaphores.iter().map(|v| json!({ "init_value": v })).collect::<Vec<_>>(),
    })
}

fn slice_json(s: &Slice) -> Value {
    match s.target {
        Target::Local(k) => json!({ "type": k.code(), "index": s.index, "size": s.size }),
        Target::Remote(id) => json!({ "buffer_id": id, "index": s.index, "size": s.size }),
        Target::Switch(id) => {
            json!({ "switch_channel_id": id, "index": s.index, "size": s.size })
        }
    }
}

fn op_json(op: &Op) -> Value {
    let mut m = BTreeMap::new();
    m.insert("name", json!(op.kind.name()));
    if !op.src.is_empty() {
        m.insert(
            "src_buff",
            json!(op.src.iter().map(slice_json).collect::<Vec<_>>()),
        );
    }
    if !op.dst.is_empty() {
        m.insert(
            "dst_buff",
            json!(op.dst.iter().map(slice_json).collect::<Vec<_>>()),
        );
    }
    if !op.channel_ids.is_empty() {
        m.insert("channel_ids", json!(op.channel_ids));
    }
    if let Some(c) = op.channel_type {
        m.insert("channel_type", json!(c.code()));
    }
    if let Some(r) = op.reduce {
        m.insert("reduce_op", json!(r.code()));
    }
    if let Some(t) = op.tbg {
        m.insert(
            "tbg_info",
            json!({ "tb_id": t.tb_id, "tbg_size": t.tbg_size }),
        );
    }
    if let Some(b) = op.barrier_id {
        m.insert("barrier_id", json!(b));
    }
    if let Some(n) = op.num_threadblocks {
        m.insert("num_threadblocks", json!(n));
    }
    if !op.semaphore_ids.is_empty() {
        m.insert("semaphore_ids", json!(op.semaphore_ids));
    }
    if let Some(p) = &op.pipeline {
        m.insert(
            "iter_context",
            json!({ "unit_size": p.unit_size, "num_chunks": p.num_chunks }),
        );
        m.insert("ops", json!(p.ops.iter().map(op_json).collect::<Vec<_>>()));
    }
    json!(m)
}

#[cfg(test)]
pub(crate) mod tests;
