//! A plan at one pair of message sizes: where every chunk lies ([`Geometry`], MSCCL++'s
//! offset rules) and each threadblock as the interpreter's block program
//! ([`lower_block`] → `mscclpp_shared::ExecBlock`'s ops).
//!
//! The rules, as MSCCL++'s `ExecutionPlan` applies them: a chunk is `input / input_chunks`
//! bytes, the same for every buffer of every rank (the input and output must both be whole
//! multiples of `buffer_alignment` per chunk, with `input / input_chunks == output /
//! output_chunks`); chunk `i` starts at byte `i * chunk`; a threadblock group's share `k` of
//! `g` of an op's range is cut in units of the alignment, the first `units % g` shares one
//! unit longer (MSCCL++ loses the whole range when it has fewer units than shares; here every
//! unit belongs to exactly one share); packets of an LL plan sit at twice the data's offset
//! and span twice its bytes; the scratch holds `scratch_chunks` chunks (twice that in packets,
//! twice again with a double scratch buffer, whose halves alternate by the launch flag's
//! parity); a pipeline over `num_chunks` chunks runs `ceil(num_chunks * chunk / unit_size)`
//! iterations, iteration `i` on bytes `i * unit_size ..` of every reference of its ops (past a
//! reference's end it moves nothing; MSCCL++'s unsigned arithmetic wraps there).
//!
//! The message's size (the input's; the output's for an all-gather) must lie in the plan's
//! `[min_message_size, max_message_size]`.
//!
//! **Threadblock groups** ([`groups`]): the shares of one op of a group (the ops of `g` blocks
//! of a rank that are the same but for `tb_id`, matched in the order they come in each block)
//! end together: the group's blocks meet at a barrier of their own after it. MSCCL++'s executor
//! does not, so a block may go on (signal a peer, say) while its group's other shares of the
//! data are still being written; MSCCL++'s own `reduce_tbg.json` reads data a peer's other
//! block is still copying, and gave wrong sums on the CPU backend at 4 KiB before this rule.
//! With it the DSL's view holds: a group op is one op, done once all of it is done.

use mscclpp_host::error::PlanError;
use std::collections::HashMap;

use mscclpp_host::{Error, Result};
use mscclpp_shared::DeviceReduceOp;
use mscclpp_shared::executor::{
    EXEC_BUF_INPUT, EXEC_BUF_MEMORY, EXEC_BUF_OUTPUT, EXEC_BUF_PORT, EXEC_BUF_SCRATCH,
    EXEC_CHANNEL_MEMORY, EXEC_CHANNEL_NONE, EXEC_CHANNEL_PORT, EXEC_MAX_GROUPS, EXEC_PLAN_BARRIERS,
    ExecBufRef, ExecOp, ExecOpKind,
};

use super::plan::{
    BlockRefs, BufferKind, ChannelKind, GpuProgram, Op, OpKind, PlanDoc, Protocol, ReduceKind,
    Slice, Target, Tbg, Threadblock, is_packet_ref,
};

/// Largest input or output a call may have (256 TiB: far beyond any device, small enough that
/// no offset arithmetic of a plan overflows).
pub const MAX_BUFFER_BYTES: u64 = 1 << 48;

/// The byte sizes of one call: every rank's input and output.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Sizes {
    /// Bytes of the input.
    pub input: u64,
    /// Bytes of the output.
    pub output: u64,
}

/// Where the plan's chunks lie at one pair of sizes (the same on every rank).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Geometry {
    /// The sizes.
    pub sizes: Sizes,
    /// Bytes of one chunk.
    pub chunk: u64,
    /// The plan's buffer alignment.
    pub alignment: u64,
    /// Whether the scratch holds packets (LL plans: twice the data).
    pub packets: bool,
    /// Whether the scratch has two halves, used by alternate launches.
    pub double: bool,
}

impl Geometry {
    /// The geometry of `doc` at `sizes`, or `Error::Plan(PlanError::Call)` saying which rule the sizes break.
    pub fn new(doc: &PlanDoc, sizes: Sizes) -> Result<Self> {
        let a = doc.buffer_alignment;
        let call = |problem: String| {
            Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem,
            })
        };
        let size = if doc.collective == "allgather" {
            sizes.output
        } else {
            sizes.input
        };
        if sizes.input.max(sizes.output) > MAX_BUFFER_BYTES {
            return Err(call(format!(
                "{} bytes: buffers of more than {MAX_BUFFER_BYTES} bytes are not served",
                sizes.input.max(sizes.output)
            )));
        }
        if size < doc.min_message_size || size > doc.max_message_size {
            return Err(call(format!(
                "a message of {size} bytes is outside the plan's range {}..={}",
                doc.min_message_size, doc.max_message_size
            )));
        }
        let mut chunk = None;
        for g in &doc.gpus {
            for (what, bytes, chunks) in [
                ("input", sizes.input, g.input_chunks),
                ("output", sizes.output, g.output_chunks),
            ] {
                if !bytes.is_multiple_of(a) || !(bytes / a).is_multiple_of(chunks) {
                    return Err(call(format!(
                        "the {what} ({bytes} bytes) is not {chunks} chunks of whole \
                         {a}-byte units (rank {})",
                        g.id
                    )));
                }
                let c = bytes / chunks;
                if *chunk.get_or_insert(c) != c {
                    return Err(call(format!(
                        "chunks of {c} bytes ({what} of rank {}) and of {} bytes elsewhere: \
                         every buffer's chunks must be equal",
                        g.id,
                        chunk.unwrap_or(0)
                    )));
                }
            }
        }
        let chunk = chunk.unwrap_or(0);
        for g in &doc.gpus {
            let scratch = chunk
                .checked_mul(g.scratch_chunks)
                .and_then(|b| b.checked_mul(4))
                .filter(|&b| b <= 4 * MAX_BUFFER_BYTES);
            if scratch.is_none() {
                return Err(call(format!(
                    "rank {}'s scratch of {} chunks of {chunk} bytes is too large",
                    g.id, g.scratch_chunks
                )));
            }
        }
        Ok(Self {
            sizes,
            chunk,
            alignment: a,
            packets: doc.protocol == Protocol::Ll,
            double: doc.use_double_scratch_buffer,
        })
    }

    /// Bytes of one half of `g`'s scratch (all of it without a double buffer).
    pub fn scratch_half(&self, g: &GpuProgram) -> u64 {
        self.chunk * g.scratch_chunks * if self.packets { 2 } else { 1 }
    }

    /// Bytes of `g`'s scratch allocation.
    pub fn scratch_bytes(&self, g: &GpuProgram) -> u64 {
        self.scratch_half(g) * if self.double { 2 } else { 1 }
    }

    /// Bytes of buffer `kind` of `g` (a scratch: one half).
    pub fn buffer_bytes(&self, g: &GpuProgram, kind: BufferKind) -> u64 {
        match kind {
            BufferKind::Input => self.sizes.input,
            BufferKind::Output => self.sizes.output,
            BufferKind::Scratch => self.scratch_half(g),
        }
    }

    /// The data bytes `[offset, offset + len)` of slice `s` (this block's share of a group).
    pub fn slice(&self, s: &Slice, tbg: Option<Tbg>) -> (u64, u64) {
        let (off, len) = (s.index * self.chunk, s.size * self.chunk);
        match tbg {
            None => (off, len),
            Some(t) => {
                let (start, end) = share(len / self.alignment, t.tb_id, t.tbg_size);
                (off + start * self.alignment, (end - start) * self.alignment)
            }
        }
    }

    /// Iterations of a pipeline over `num_chunks` chunks in units of `unit` bytes.
    pub fn iterations(&self, num_chunks: u64, unit: u64) -> u64 {
        num_chunks.saturating_mul(self.chunk).div_ceil(unit)
    }
}

/// Units `[start, end)` of share `k` of `g` of `units` (the first `units % g` shares one
/// longer).
pub fn share(units: u64, k: u64, g: u64) -> (u64, u64) {
    let (min, rem) = (units / g, units % g);
    let at = |k: u64| k * min + k.min(rem);
    (at(k), at(k + 1))
}

/// A buffer reference resolved: whose buffer, which, reached how.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Resolved {
    /// The rank owning the buffer.
    pub rank: usize,
    /// Which buffer.
    pub kind: BufferKind,
    /// `None`: local; else the block's remote buffer slot (of the op's channel kind).
    pub slot: Option<usize>,
    /// Whether it holds packets.
    pub packet: bool,
}

/// Resolves reference `i` of `op`'s sources (`dst` false) or destinations in block `refs` of
/// `g` (already checked by the parser).
pub fn resolve(g: &GpuProgram, refs: &BlockRefs, op: &Op, dst: bool, i: usize) -> Resolved {
    let s = if dst { &op.dst[i] } else { &op.src[i] };
    let packet = is_packet_ref(op, dst, i);
    match s.target {
        Target::Local(kind) => Resolved {
            rank: g.id,
            kind,
            slot: None,
            packet,
        },
        Target::Remote(slot) | Target::Switch(slot) => {
            let table = refs.buffers(op.channel_type.unwrap_or(ChannelKind::None));
            let rb = &g.remote_buffers[table[slot]];
            Resolved {
                rank: rb.rank,
                kind: rb.kind,
                slot: Some(slot),
                packet,
            }
        }
    }
}

/// Where reference `i` of `op` lies: `(offset, len)` in its buffer, in packets for a packet
/// reference.
pub fn placed(geom: &Geometry, op: &Op, dst: bool, i: usize) -> (u64, u64) {
    let s = if dst { &op.dst[i] } else { &op.src[i] };
    let (off, len) = geom.slice(s, op.tbg);
    if is_packet_ref(op, dst, i) {
        (2 * off, 2 * len)
    } else {
        (off, len)
    }
}

/// Checks that every reference of block `tb` of rank `g` lies inside its buffer at `geom`.
fn check_bounds(doc: &PlanDoc, g: &GpuProgram, tb: &Threadblock, geom: &Geometry) -> Result<()> {
    let refs = BlockRefs::of(tb);
    let check = |op: &Op, path: String| -> Result<()> {
        for dst in [false, true] {
            let n = if dst { op.dst.len() } else { op.src.len() };
            for i in 0..n {
                let r = resolve(g, &refs, op, dst, i);
                let (off, len) = placed(geom, op, dst, i);
                let have = geom.buffer_bytes(&doc.gpus[r.rank], r.kind);
                if off + len > have {
                    return Err(Error::Plan(PlanError::Call {
                        plan: doc.name.clone(),
                        problem: format!(
                            "rank {}, threadblock {}, {path}: bytes {off}..{} of rank {}'s {} \
                             buffer, which holds {have} at these sizes",
                            g.id,
                            tb.id,
                            off + len,
                            r.rank,
                            r.kind.code()
                        ),
                    }));
                }
            }
        }
        Ok(())
    };
    for (i, op) in tb.ops.iter().enumerate() {
        check(op, format!("ops[{i}]"))?;
        if let Some(p) = &op.pipeline {
            for (j, inner) in p.ops.iter().enumerate() {
                check(inner, format!("ops[{i}].ops[{j}]"))?;
            }
        }
    }
    Ok(())
}

/// The interpreter's kind of a plan op.
fn exec_kind(k: OpKind) -> ExecOpKind {
    match k {
        OpKind::Nop => ExecOpKind::Nop,
        OpKind::Barrier => ExecOpKind::Barrier,
        OpKind::Put => ExecOpKind::Put,
        OpKind::PutWithSignal => ExecOpKind::PutWithSignal,
        OpKind::PutWithSignalAndFlush => ExecOpKind::PutWithSignalAndFlush,
        OpKind::Get => ExecOpKind::Get,
        OpKind::Copy => ExecOpKind::Copy,
        OpKind::Signal => ExecOpKind::Signal,
        OpKind::Wait => ExecOpKind::Wait,
        OpKind::RelaxedSignal => ExecOpKind::RelaxedSignal,
        OpKind::RelaxedWait => ExecOpKind::RelaxedWait,
        OpKind::Flush => ExecOpKind::Flush,
        OpKind::Reduce | OpKind::ReduceSend | OpKind::ReadReduce | OpKind::ReadReduceSend => {
            ExecOpKind::Reduce
        }
        OpKind::PutPackets => ExecOpKind::PutPackets,
        OpKind::ReadPutPackets => ExecOpKind::ReadPutPackets,
        OpKind::CopyPackets => ExecOpKind::CopyPackets,
        OpKind::UnpackPackets => ExecOpKind::UnpackPackets,
        OpKind::ReducePackets
        | OpKind::ReduceSendPackets
        | OpKind::ReduceCopyPackets
        | OpKind::ReduceCopySendPackets => ExecOpKind::ReducePackets,
        OpKind::Pipeline => ExecOpKind::Pipeline,
        OpKind::SemAcquire => ExecOpKind::SemAcquire,
        OpKind::SemRelease => ExecOpKind::SemRelease,
        // Refused by the parser.
        OpKind::MultiLoadReduceStore | OpKind::MultiStore => ExecOpKind::Nop,
    }
}

/// The device code of a buffer kind (`EXEC_BUF_INPUT` …).
pub fn buf_code(k: BufferKind) -> u8 {
    match k {
        BufferKind::Input => EXEC_BUF_INPUT,
        BufferKind::Output => EXEC_BUF_OUTPUT,
        BufferKind::Scratch => EXEC_BUF_SCRATCH,
    }
}

/// Where an op sits in its block: its index, and its index inside its pipeline.
pub type OpAt = (usize, Option<usize>);

/// The threadblock groups of rank `g`'s program: for every share of a group op (by block and
/// place), the barrier counter the group meets at after it and the group's size. Refuses a
/// group whose shares are not exactly `0..tbg_size` on as many blocks, and more than
/// `EXEC_MAX_GROUPS` distinct groups.
pub fn groups(doc: &PlanDoc, g: &GpuProgram) -> Result<HashMap<(usize, OpAt), (usize, usize)>> {
    // (signature, occurrence) -> shares (block, tb_id, place, size).
    type Share = (usize, u64, OpAt, u64);
    let mut shares: HashMap<(String, usize), Vec<Share>> = HashMap::new();
    let mut order = Vec::new();
    for tb in &g.threadblocks {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut visit = |op: &Op, at: OpAt| {
            let Some(t) = op.tbg else { return };
            let mut norm = op.clone();
            norm.tbg = Some(Tbg { tb_id: 0, ..t });
            norm.channel_ids.clear();
            let sig = format!("{norm:?}");
            let n = seen.entry(sig.clone()).or_default();
            let key = (sig, *n);
            *n += 1;
            if !shares.contains_key(&key) {
                order.push(key.clone());
            }
            shares
                .entry(key)
                .or_default()
                .push((tb.id, t.tb_id, at, t.tbg_size));
        };
        for (i, op) in tb.ops.iter().enumerate() {
            visit(op, (i, None));
            if let Some(p) = &op.pipeline {
                for (j, inner) in p.ops.iter().enumerate() {
                    visit(inner, (i, Some(j)));
                }
            }
        }
    }
    let mut sets: Vec<Vec<usize>> = Vec::new();
    let mut out = HashMap::new();
    for key in order {
        let members = &shares[&key];
        let size = members[0].3;
        let mut ids: Vec<u64> = members.iter().map(|m| m.1).collect();
        ids.sort_unstable();
        if ids != (0..size).collect::<Vec<_>>() {
            let (block, _, at, _) = members[0];
            let top = &g.threadblocks[block].ops[at.0];
            let op = match (at.1, &top.pipeline) {
                (Some(j), Some(p)) => &p.ops[j],
                _ => top,
            };
            return Err(Error::Plan(PlanError::Refused {
                plan: doc.name.clone(),
                rank: g.id,
                block,
                op: place(at),
                name: op.kind.name(),
                problem: format!(
                    "a threadblock group of {size} shares this op, but the blocks that do it \
                     hold shares {ids:?}"
                ),
            }));
        }
        if size < 2 {
            continue;
        }
        let mut blocks: Vec<usize> = members.iter().map(|m| m.0).collect();
        blocks.sort_unstable();
        let idx = match sets.iter().position(|s| *s == blocks) {
            Some(i) => i,
            None => {
                sets.push(blocks);
                sets.len() - 1
            }
        };
        if idx >= EXEC_MAX_GROUPS {
            let (block, _, at, _) = members[0];
            return Err(Error::Plan(PlanError::Refused {
                plan: doc.name.clone(),
                rank: g.id,
                block,
                op: place(at),
                name: "",
                problem: format!("more than {EXEC_MAX_GROUPS} threadblock groups on one rank"),
            }));
        }
        for &(block, _, at, _) in members {
            out.insert((block, at), (EXEC_PLAN_BARRIERS + idx, size as usize));
        }
    }
    Ok(out)
}

/// The path of an op in its block (`ops[4]`, `ops[2].ops[1]`).
pub fn place(at: OpAt) -> String {
    match at.1 {
        None => format!("ops[{}]", at.0),
        Some(j) => format!("ops[{}].ops[{j}]", at.0),
    }
}

fn exec_op(
    g: &GpuProgram,
    refs: &BlockRefs,
    geom: &Geometry,
    op: &Op,
    group: Option<(usize, usize)>,
) -> ExecOp {
    let mut e = ExecOp {
        kind: exec_kind(op.kind) as u8,
        channel_type: match op.channel_type {
            Some(ChannelKind::Memory) => EXEC_CHANNEL_MEMORY,
            Some(ChannelKind::Port) => EXEC_CHANNEL_PORT,
            _ => EXEC_CHANNEL_NONE,
        },
        reduce_op: match op.reduce.unwrap_or(ReduceKind::Sum) {
            ReduceKind::Sum => DeviceReduceOp::Sum,
            ReduceKind::Min => DeviceReduceOp::Min,
            ReduceKind::Max => DeviceReduceOp::Max,
        } as u8,
        ..ExecOp::default()
    };
    let ids = if op.semaphore_ids.is_empty() {
        &op.channel_ids
    } else {
        &op.semaphore_ids
    };
    e.n_ids = ids.len() as u8;
    for (k, &id) in ids.iter().enumerate() {
        e.ids[k] = id as u8;
    }
    for dst in [false, true] {
        let n = if dst { op.dst.len() } else { op.src.len() };
        for i in 0..n {
            let r = resolve(g, refs, op, dst, i);
            let (offset, _) = placed(geom, op, dst, i);
            let kind = match (r.slot, op.channel_type) {
                (None, _) => buf_code(r.kind),
                (Some(_), Some(ChannelKind::Port)) => EXEC_BUF_PORT,
                (Some(_), _) => EXEC_BUF_MEMORY,
            };
            let b = ExecBufRef {
                offset,
                kind,
                slot: r.slot.unwrap_or(0) as u8,
                packet: r.packet as u8,
                reserved: [0; 5],
            };
            if dst {
                e.dst[i] = b;
            } else {
                e.src[i] = b;
            }
        }
    }
    e.n_src = op.src.len() as u8;
    e.n_dst = op.dst.len() as u8;
    if let Some(s) = op.src.first().or(op.dst.first()) {
        e.size = geom.slice(s, op.tbg).1;
    }
    if let (Some(id), Some(n)) = (op.barrier_id, op.num_threadblocks) {
        e.aux = id as u64;
        e.count = n as u64;
    }
    if let Some((counter, n)) = group {
        e.aux = counter as u64;
        e.count = n as u64;
    }
    if let Some(p) = &op.pipeline {
        e.size = p.unit_size;
        e.count = geom.iterations(p.num_chunks, p.unit_size);
        e.aux = p.ops.len() as u64;
    }
    e
}

/// Block `tb` of rank `g` as the interpreter's ops at `geom` (a pipeline followed by the ops
/// it repeats), after checking that every reference lies inside its buffer.
pub fn lower_block(
    doc: &PlanDoc,
    g: &GpuProgram,
    tb: &Threadblock,
    geom: &Geometry,
) -> Result<Vec<ExecOp>> {
    check_bounds(doc, g, tb, geom)?;
    let refs = BlockRefs::of(tb);
    let groups = groups(doc, g)?;
    let group = |at: OpAt| groups.get(&(tb.id, at)).copied();
    let mut ops = Vec::new();
    for (i, op) in tb.ops.iter().enumerate() {
        ops.push(exec_op(g, &refs, geom, op, group((i, None))));
        if let Some(p) = &op.pipeline {
            for (j, inner) in p.ops.iter().enumerate() {
                ops.push(exec_op(g, &refs, geom, inner, group((i, Some(j)))));
            }
        }
    }
    Ok(ops)
}
