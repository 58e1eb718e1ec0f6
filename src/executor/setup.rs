//! The resources of a plan for one (plan, buffers, sizes): scratch, channels, the peers'
//! buffers, semaphores, barriers, the proxy, and every block's program in device memory; made
//! once, collectively, by every rank's first call with that key, then reused by every call.
//!
//! Every rank makes the same bootstrap calls in the same order (tags carry the executor's
//! context number, so contexts set up one after another never mix):
//!
//! 1. one all-gather of each rank's verdict on the call (local checks: sizes, alignment, the
//!    buffers' overlap against the plan's `inplace`; the plan verified at these sizes) and of
//!    its sizes, so that every rank fails together, naming the rank that refused;
//! 2. per peer it has a channel with (either way, any kind; ascending rank) a `connect`;
//! 3. per such peer, per kind (memory, then port), `max(n, m)` semaphores, where `n` and `m`
//!    count the two ranks' channels of that kind to each other: channel `j` of a rank to a
//!    peer (in the order its plan lists them) uses semaphore `j`, which pairs it with the
//!    peer's channel `j` as MSCCL++ pairs them (a rank with fewer channels still builds its
//!    half of the others: that is what makes MSCCL++'s one-way channels set up);
//! 4. per peer that reaches one of this rank's buffers, that buffer's registration (the whole
//!    allocation holding it) and a message with the buffer's offset and length in it; then per
//!    remote buffer of this rank's program, the owner's. A received offset and length are
//!    checked against the registration and against the sizes every rank agreed on.
//!
//! Then, locally: the proxy (when the rank's program uses port channels), and the block
//! programs, copied to device memory. The scratch, the launch flag words, the barrier
//! counters and the semaphores are zeroed (the semaphores' initial values written) before the
//! scratch's registration goes to any peer.

use mscclpp_host::error::PlanError;
use std::sync::Arc;

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::{Connection, EndpointConfig};
use mscclpp_host::gpu::DeviceBuffer;
use mscclpp_host::port_channel::PortChannelService;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::executor::{EXEC_MAX_BARRIERS, EXEC_MAX_SEMAPHORES, ExecBlock, ExecutorParams};
use mscclpp_shared::{
    DEFAULT_FIFO_SIZE, DevicePtr, MemoryChannelDeviceHandle, PortChannelDeviceHandle,
};

use super::lower::{Geometry, Sizes, buf_code, lower_block};
use super::plan::{BlockRefs, BufferKind, ChannelKind, PlanDoc};
use super::verify::{self, Races};

/// User tags of the executor's set-up messages: `BASE | context << 24 | purpose << 20 | index`.
const TAG_BASE: u64 = 0xE7EC << 40;
const PURPOSE_CONNECT: u64 = 1;
const PURPOSE_SEMAPHORE: u64 = 2;
const PURPOSE_MEMORY: u64 = 3;
const PURPOSE_OFFSETS: u64 = 4;

fn tag(context: u64, purpose: u64, index: u64) -> u64 {
    TAG_BASE | (context & 0xffff) << 24 | purpose << 20 | (index & 0xfffff)
}

/// This rank's buffers of one call.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Buffers {
    /// The input.
    pub input: DevicePtr<u8>,
    /// The output.
    pub output: DevicePtr<u8>,
    /// Their sizes.
    pub sizes: Sizes,
}

impl std::hash::Hash for Buffers {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.input.addr(), self.output.addr(), self.sizes).hash(h);
    }
}

/// Everything one (plan, buffers, sizes) needs, alive while calls may use it.
pub(crate) struct Context {
    /// The launch's parameters but the data type and packet type.
    pub params: ExecutorParams,
    /// Blocks per launch.
    pub blocks: u32,
    /// Threads per block the plan asks for.
    pub threads: u32,
    // Owned resources (dropped after the proxy stops, see `Drop`).
    service: Option<PortChannelService>,
    _programs: DeviceBuffer,
    _scratch: DeviceBuffer,
    _words: DeviceBuffer,
    _semaphores: Vec<MemoryDevice2DeviceSemaphore>,
    _connections: Vec<Arc<dyn Connection>>,
    _local: Vec<RegisteredMemory>,
    _remote: Vec<RegisteredMemory>,
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Some(s) = self.service.take()
            && let Err(e) = s.stop()
        {
            tracing::debug!("executor: the plan's proxy had failed: {e}");
        }
    }
}

/// The overlap of this rank's input and output (the input's start in output coordinates), or
/// `None` when they are separate.
fn overlap(b: &Buffers) -> Option<i64> {
    let (i, o) = (b.input.addr(), b.output.addr());
    let (ie, oe) = (i + b.sizes.input, o + b.sizes.output);
    (i < oe && o < ie || i == o).then(|| i as i64 - o as i64)
}

/// The local checks of a call (step 1 of the module docs), as the problem to report.
fn local_checks(doc: &PlanDoc, rank: usize, b: &Buffers, races: Races) -> Result<Geometry> {
    let call = |problem: String| {
        Error::Plan(PlanError::Call {
            plan: doc.name.clone(),
            problem,
        })
    };
    let geom = Geometry::new(doc, b.sizes)?;
    for (what, p) in [("input", b.input), ("output", b.output)] {
        if !p.addr().is_multiple_of(16) || p.is_null() {
            return Err(call(format!(
                "the {what} at {:#x} is not a 16-byte aligned device address",
                p.addr()
            )));
        }
    }
    let declared = verify::declared_aliasing(doc, b.sizes)[rank];
    let actual = overlap(b);
    if declared != actual {
        return Err(call(match declared {
            Some(d) => format!(
                "the plan runs in place: the input must start {d} bytes after the output's start \
                 (they are {} apart{})",
                b.input.addr() as i64 - b.output.addr() as i64,
                if actual.is_none() { ", separate" } else { "" }
            ),
            None => "the plan runs out of place, but the input and output overlap".to_string(),
        }));
    }
    match verify::verify(doc, &geom, &verify::declared_aliasing(doc, b.sizes), races) {
        Ok(_) => {}
        Err(Error::Plan(PlanError::Call { problem, .. }))
            if problem.contains("op steps to verify") =>
        {
            tracing::debug!(plan = %doc.name, "executor: {problem}; verified at load only");
        }
        Err(e) => return Err(e),
    }
    Ok(geom)
}

/// Bytes of a refusal's reason in a verdict (longer reasons are cut at a character boundary).
const REASON: usize = 256;
/// Bytes of one verdict: input and output sizes, the reason's length, the reason (padded: the
/// bootstrap's all-gather takes equal lengths).
const VERDICT: usize = 16 + 2 + REASON;

/// Agrees with every rank on the call: each sends its verdict and sizes; any refusal or any
/// other sizes fail every rank alike.
fn agree(comm: &Communicator, doc: &PlanDoc, mine: &Result<Geometry>, sizes: Sizes) -> Result<()> {
    let mut msg = Vec::with_capacity(VERDICT);
    msg.extend_from_slice(&sizes.input.to_le_bytes());
    msg.extend_from_slice(&sizes.output.to_le_bytes());
    let reason = match mine {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    let mut cut = reason.len().min(REASON);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    msg.extend_from_slice(&(cut as u16).to_le_bytes());
    msg.extend_from_slice(&reason.as_bytes()[..cut]);
    msg.resize(VERDICT, 0);
    let all = comm.all_gather(&msg)?;
    if mine.is_err() {
        return Ok(()); // the caller returns this rank's own reason
    }
    for (q, m) in all.iter().enumerate() {
        let len = match m.get(16..18) {
            Some(b) if m.len() == VERDICT => u16::from_le_bytes([b[0], b[1]]) as usize,
            _ => REASON + 1,
        };
        if len > REASON {
            return Err(Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem: format!("rank {q} sent a malformed verdict ({} bytes)", m.len()),
            }));
        }
        if len > 0 && q != comm.rank() {
            return Err(Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem: format!(
                    "rank {q} refused the call: {}",
                    String::from_utf8_lossy(&m[18..18 + len])
                ),
            }));
        }
        let word = |k: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&m[8 * k..8 * k + 8]);
            u64::from_le_bytes(b)
        };
        let theirs = Sizes {
            input: word(0),
            output: word(1),
        };
        if theirs != sizes {
            return Err(Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem: format!(
                    "rank {q} calls with {} input and {} output bytes, this rank with {} and {}",
                    theirs.input, theirs.output, sizes.input, sizes.output
                ),
            }));
        }
    }
    Ok(())
}

/// Sets up (plan, buffers, sizes) on this rank (module docs); `seq` numbers the executor's
/// contexts (the same on every rank).
pub(crate) fn set_up(
    comm: &Arc<Communicator>,
    doc: &PlanDoc,
    b: &Buffers,
    races: Races,
    seq: u64,
) -> Result<Context> {
    let (rank, n) = (comm.rank(), comm.size());
    if doc.gpus.len() != n {
        return Err(Error::Plan(PlanError::Call {
            plan: doc.name.clone(),
            problem: format!(
                "the plan is for {} ranks, the world has {n}",
                doc.gpus.len()
            ),
        }));
    }
    let checked = local_checks(doc, rank, b, races);
    agree(comm, doc, &checked, b.sizes)?;
    let geom = checked?;
    let me = &doc.gpus[rank];
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());

    // Device words: scratch (zeroed), flags + barriers + semaphores.
    let scratch_bytes = geom.scratch_bytes(me).max(16) as usize;
    let scratch = g.alloc(scratch_bytes)?;
    scratch.copy_from_host(0, &vec![0u8; scratch_bytes])?;
    let nwords = 2 + EXEC_MAX_BARRIERS + 3 * EXEC_MAX_SEMAPHORES;
    let words = g.alloc(8 * nwords)?;
    let mut init = vec![0u64; nwords];
    for (s, &v) in me.semaphores.iter().enumerate() {
        init[2 + EXEC_MAX_BARRIERS + 3 * s + 2] = v;
    }
    words.copy_from_host(0, bytemuck::cast_slice(&init))?;

    // Channels: peers and counts per kind.
    let peers_of = |r: usize, k: ChannelKind| doc.gpus[r].channel_peers(k);
    let count =
        |r: usize, k: ChannelKind, p: usize| peers_of(r, k).iter().filter(|&&x| x == p).count();
    let mut connections: Vec<Option<Arc<dyn Connection>>> = vec![None; n];
    for (p, slot) in connections.iter_mut().enumerate() {
        let linked = p != rank
            && [ChannelKind::Memory, ChannelKind::Port]
                .iter()
                .any(|&k| count(rank, k, p) + count(p, k, rank) > 0);
        if linked {
            if !comm.same_node(p) {
                return Err(Error::CrossNode {
                    what: "an execution plan's channel",
                    remote_rank: p,
                });
            }
            *slot = Some(comm.connect(EndpointConfig::new(t), p, tag(seq, PURPOSE_CONNECT, 0))?);
        }
    }
    // Semaphores: [kind][peer] -> list (j-th pairs with the peer's j-th).
    let mut mem_sems: Vec<Vec<MemoryDevice2DeviceSemaphore>> = (0..n).map(|_| Vec::new()).collect();
    let mut port_sems = Vec::new(); // (peer, j, semaphore)
    for (p, conn) in connections.iter().enumerate() {
        let Some(conn) = conn else { continue };
        for (ki, k) in [ChannelKind::Memory, ChannelKind::Port]
            .into_iter()
            .enumerate()
        {
            let m = count(rank, k, p).max(count(p, k, rank));
            for j in 0..m {
                let tg = tag(seq, PURPOSE_SEMAPHORE, (ki * 4096 + j) as u64);
                if k == ChannelKind::Memory {
                    mem_sems[p].push(comm.build_memory_semaphore(conn.as_ref(), tg)?);
                } else {
                    port_sems.push((p, j, comm.build_semaphore(conn.clone(), tg)?));
                }
            }
        }
    }

    // This rank's buffers, registered whole (their allocations), and where each starts.
    let mut local_regs = Vec::new();
    let mut local_offsets = [0u64; 3];
    let mut local_lens = [0u64; 3];
    for (k, (ptr, len)) in [
        (b.input, b.sizes.input.max(1)),
        (b.output, b.sizes.output.max(1)),
        (scratch.ptr(), scratch_bytes as u64),
    ]
    .into_iter()
    .enumerate()
    {
        let a = g.allocation_of(ptr)?;
        let off = ptr.addr() - a.base.addr();
        if off + len > a.size as u64 {
            return Err(Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem: format!(
                    "the {} ({len} bytes at {:#x}) runs past its allocation",
                    ["input", "output", "scratch"][k],
                    ptr.addr()
                ),
            }));
        }
        local_regs.push(comm.register_allocation(&a)?);
        local_offsets[k] = off;
        local_lens[k] = len;
    }
    let kind_index = |k: BufferKind| buf_code(k) as usize;
    // Send: for every peer's remote buffer that is one of ours.
    for (q, gq) in doc.gpus.iter().enumerate() {
        if q == rank {
            continue;
        }
        for (j, rb) in gq.remote_buffers.iter().enumerate() {
            if rb.rank != rank {
                continue;
            }
            let k = kind_index(rb.kind);
            comm.send_memory(&local_regs[k], q, tag(seq, PURPOSE_MEMORY, j as u64))?;
            let mut msg = local_offsets[k].to_le_bytes().to_vec();
            msg.extend_from_slice(&local_lens[k].to_le_bytes());
            comm.bootstrap()
                .send(q, tag(seq, PURPOSE_OFFSETS, j as u64), &msg)?;
        }
    }
    // Receive ours.
    let mut remote = Vec::new(); // (registered memory, offset, len) per remote buffer
    for (j, rb) in me.remote_buffers.iter().enumerate() {
        let mem = comm.recv_memory(rb.rank, tag(seq, PURPOSE_MEMORY, j as u64))?;
        let msg = comm.recv_checked(rb.rank, tag(seq, PURPOSE_OFFSETS, j as u64))?;
        let bad = |why: String| {
            Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem: format!("rank {}'s {} buffer: {why}", rb.rank, rb.kind.code()),
            })
        };
        if msg.len() != 16 {
            return Err(bad(format!(
                "a malformed offset message ({} bytes)",
                msg.len()
            )));
        }
        let off = u64::from_le_bytes(msg[..8].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(msg[8..].try_into().unwrap_or_default());
        let want = match rb.kind {
            BufferKind::Input => b.sizes.input.max(1),
            BufferKind::Output => b.sizes.output.max(1),
            BufferKind::Scratch => geom.scratch_bytes(&doc.gpus[rb.rank]).max(16),
        };
        if len != want || off.checked_add(len).is_none_or(|e| e > mem.size() as u64) {
            return Err(bad(format!(
                "{len} bytes at offset {off} of a {}-byte registration, where this call needs \
                 {want}",
                mem.size()
            )));
        }
        remote.push((mem, off, len));
    }

    // Memory channel handles by global channel (semaphore only).
    let mut mem_handles = Vec::new();
    let mut used = vec![0usize; n];
    for p in peers_of(rank, ChannelKind::Memory) {
        let sem = &mem_sems[p][used[p]];
        used[p] += 1;
        mem_handles.push(MemoryChannelDeviceHandle {
            semaphore: sem.device_handle()?,
            dst: DevicePtr::NULL,
            src: DevicePtr::NULL,
            packet_buffer: DevicePtr::NULL,
        });
    }

    // The proxy, when this rank's program uses port channels or port-reached buffers.
    let uses_port = !peers_of(rank, ChannelKind::Port).is_empty()
        || me
            .remote_buffers
            .iter()
            .any(|rb| rb.access.contains(&ChannelKind::Port))
        || !port_sems.is_empty();
    let mut port_handles = Vec::new();
    let mut local_ids = [0u32; 3];
    let mut remote_ids = vec![0u32; me.remote_buffers.len()];
    let mut service = None;
    if uses_port {
        let mut builder = PortChannelService::builder(&g, comm.status(), DEFAULT_FIFO_SIZE)?;
        builder.trace(comm.trace());
        for (k, r) in local_regs.iter().enumerate() {
            local_ids[k] = builder.add_memory(r.clone())?;
        }
        for (j, rb) in me.remote_buffers.iter().enumerate() {
            if rb.access.contains(&ChannelKind::Port) {
                remote_ids[j] = builder.add_memory(remote[j].0.clone())?;
            }
        }
        let mut sem_ids = Vec::new(); // (peer, j, id)
        for (p, j, sem) in port_sems {
            sem_ids.push((p, j, builder.add_semaphore(sem)?));
        }
        let mut used = vec![0usize; n];
        for p in peers_of(rank, ChannelKind::Port) {
            let id = sem_ids
                .iter()
                .find(|&&(q, j, _)| q == p && j == used[p])
                .map(|&(_, _, id)| id)
                .ok_or_else(|| {
                    Error::Plan(PlanError::Call {
                        plan: doc.name.clone(),
                        problem: format!("no semaphore for a port channel to rank {p}"),
                    })
                })?;
            used[p] += 1;
            port_handles.push(builder.port_channel(id, local_ids[0], local_ids[0])?);
        }
        service = Some(builder.start()?);
    }

    // Block programs.
    let mut blocks = Vec::with_capacity(me.threadblocks.len());
    for tb in &me.threadblocks {
        let refs = BlockRefs::of(tb);
        let mut blk = ExecBlock::default();
        let ops = lower_block(doc, me, tb, &geom)?;
        blk.n_ops = ops.len() as u32;
        blk.ops[..ops.len()].copy_from_slice(&ops);
        for (i, &c) in refs.memory_channels.iter().enumerate() {
            blk.memory_channels[i] = mem_handles[c];
        }
        for (i, &c) in refs.port_channels.iter().enumerate() {
            blk.port_channels[i] = port_handles
                .get(c)
                .copied()
                .unwrap_or(PortChannelDeviceHandle::default());
        }
        for (s, &j) in refs.memory_buffers.iter().enumerate() {
            let (mem, off, len) = &remote[j];
            blk.memory_buffers[s] = mem.range(*off, *len)?;
            blk.memory_buffer_kinds[s] = buf_code(me.remote_buffers[j].kind);
        }
        for (s, &j) in refs.port_buffers.iter().enumerate() {
            blk.port_buffer_ids[s] = remote_ids[j];
            blk.port_buffer_offsets[s] = remote[j].1;
            blk.port_buffer_kinds[s] = buf_code(me.remote_buffers[j].kind);
        }
        blocks.push(blk);
    }
    let programs = g.alloc((blocks.len().max(1)) * std::mem::size_of::<ExecBlock>())?;
    programs.copy_from_host(0, bytemuck::cast_slice(&blocks))?;

    let wp = words.ptr();
    let word = |i: usize| DevicePtr::from_addr(wp.addr() + 8 * i as u64);
    let params = ExecutorParams {
        status: comm.status().device_ptr(),
        blocks: DevicePtr::from_addr(programs.ptr().addr()),
        buffers: [b.input, b.output, scratch.ptr()],
        local_memory_ids: local_ids,
        dtype: 0,
        local_offsets,
        scratch_half: if doc.use_double_scratch_buffer {
            geom.scratch_half(me)
        } else {
            0
        },
        flags: word(0),
        barriers: word(2),
        semaphores: word(2 + EXEC_MAX_BARRIERS),
        packet: 0,
        reserved: 0,
    };
    let mut all_sems = Vec::new();
    for s in mem_sems {
        all_sems.extend(s);
    }
    Ok(Context {
        params,
        blocks: me.threadblocks.len() as u32,
        threads: doc.num_threads_per_block,
        service,
        _programs: programs,
        _scratch: scratch,
        _words: words,
        _semaphores: all_sems,
        _connections: connections.into_iter().flatten().collect(),
        _local: local_regs,
        _remote: remote.into_iter().map(|r| r.0).collect(),
    })
}
