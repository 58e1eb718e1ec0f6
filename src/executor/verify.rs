//! Verification: a pure function over all ranks' programs at one pair of sizes, which refuses
//! a plan that would hang or race, naming the rank, threadblock and op at fault.
//!
//! It runs the plan symbolically: every threadblock of every rank is an agent that steps
//! through its ops (a pipeline's ops once per iteration) as the interpreter does, over two
//! launches in a row (three with a double scratch buffer, so that each half is reused once),
//! and every agent carries a vector clock. What orders one agent's ops after another's:
//!
//! - **program order** in a block (the interpreter's block meets after every op);
//! - **signal → wait** on a channel: the `n`-th signal on a rank's channel is what the peer's
//!   `n`-th wait on the paired channel takes (channel `j` of rank `r` to peer `p`, counted
//!   among `r`'s channels of that kind to `p`, pairs with `p`'s `j`-th channel of that kind to
//!   `r`, as MSCCL++ connects them). A relaxed signal or a relaxed wait orders nothing (it is
//!   counted, so it can still hang);
//! - **port channels**: a put is done by the proxy later, in the order of the block's pushes on
//!   that channel (one extra agent per block and port channel, the lane); a signal pushed after
//!   it carries it to the waiter, a flush brings it back to the block;
//! - **barriers**: the `k`-th `barrier` of each of its `num_threadblocks` blocks meet;
//! - **device semaphores**: the `k`-th `sem_acquire` follows the releases that made the `k`-th
//!   token (one releasing and one acquiring block per semaphore, which is what the DSL makes;
//!   other uses are refused: which release an acquire follows would depend on timing);
//! - **LL packets**: a read of packets follows the writes of this launch's flag that cover
//!   them (a read of packets nobody writes in the launch never ends);
//! - **launches**: a rank's next launch starts after all of its blocks ended (stream order;
//!   not after its proxies' unflushed puts).
//!
//! Then it refuses: an agent that can never step on (a wait no signal answers, a packet
//! nobody writes, a barrier short of blocks, a semaphore without tokens: the op it is stuck
//! at); signals or releases that outnumber their waits or acquires over a launch (a later
//! launch's wait would pass on a stale token); and any two accesses to overlapping bytes of one
//! buffer, one a write, that nothing above orders (two writers of a chunk, a read of a peer's
//! chunk not after the signal that publishes it, a buffer reused while a peer or the proxy may
//! still read it). Input and output are one buffer where the call runs in place.
//!
//! Everything is exact at the sizes given: offsets are the ones the interpreter uses
//! (`super::lower`). The executor verifies every plan at load at a few sizes of its own
//! ([`canonical_sizes`]: threadblock groups cut evenly and unevenly, every pipeline looping
//! more than once) and again at every call's sizes when it sets them up, unless the plan has
//! more than [`MAX_STEPS`] op steps at those sizes (long pipelines of small units), where the
//! load-time verification is what it has.

use mscclpp_host::error::PlanError;
use std::collections::HashMap;

use mscclpp_host::{Error, Result};

use super::lower::{Geometry, Sizes, placed, resolve};
use super::plan::{BlockRefs, BufferKind, ChannelKind, Op, OpKind, PlanDoc};

/// Most op steps (all ranks, blocks, launches, pipeline iterations) a verification simulates.
pub const MAX_STEPS: u64 = 1 << 20;

/// What a verified plan does at the sizes it was verified at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The sizes.
    pub sizes: Sizes,
    /// Ranks.
    pub ranks: usize,
    /// Threadblocks of each rank.
    pub blocks: Vec<usize>,
    /// Ops of each rank (a pipeline and each op inside it count one).
    pub ops: Vec<usize>,
    /// Bytes each rank writes into its peers' buffers in one launch (packets counted as
    /// packets).
    pub sent: Vec<u64>,
    /// Bytes each rank reads from its peers' buffers in one launch.
    pub fetched: Vec<u64>,
    /// Launches simulated.
    pub launches: usize,
    /// Op steps simulated.
    pub steps: u64,
    /// The races found when they were allowed ([`Races::Allow`]; at most [`MAX_RACES`]), as
    /// the errors they would have been.
    pub races: Vec<String>,
}

/// What verification does with a race (hangs and unbalanced counts are always refused).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Races {
    /// Refuse the plan (the default).
    #[default]
    Refuse,
    /// Accept it and list the races in the summary: for plans known to rely on timing (one of
    /// MSCCL++'s own test plans does), run at the caller's risk.
    Allow,
}

/// Most races a summary lists.
pub const MAX_RACES: usize = 8;

/// For each rank, where its input starts in its output's coordinates when the two overlap
/// (`None`: separate buffers).
pub type Aliasing = Vec<Option<i64>>;

/// The overlap an in-place plan declares: the same buffer when input and output have one
/// size, else NCCL's in-place offsets (the input is rank `r`'s part of a larger output, or
/// the output rank `r`'s part of a larger input).
pub fn declared_aliasing(doc: &PlanDoc, sizes: Sizes) -> Aliasing {
    (0..doc.gpus.len())
        .map(|r| {
            let r = r as u64;
            if !doc.inplace {
                None
            } else if sizes.input == sizes.output {
                Some(0)
            } else if sizes.output > sizes.input {
                Some((r * sizes.input) as i64)
            } else {
                Some(-((r * sizes.output) as i64))
            }
        })
        .collect()
}

/// Largest number of alignment units per chunk [`canonical_sizes`] picks to cut every group
/// evenly.
const MAX_EVEN_UNITS: u64 = 1 << 12;

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    (a / gcd(a, b)).saturating_mul(b)
}

/// Sizes to verify a plan at when no call's sizes are known: the smallest where every
/// threadblock group's shares are equal, one where they are not, and one where every pipeline
/// runs at least two iterations (each within the plan's message size range where one fits).
pub fn canonical_sizes(doc: &PlanDoc) -> Result<Vec<Sizes>> {
    let g0 = &doc.gpus[0];
    let mut groups = 1u64;
    let mut min_pipeline_chunk = 0u64;
    for g in &doc.gpus {
        for tb in &g.threadblocks {
            for op in &tb.ops {
                let inner = op
                    .pipeline
                    .as_ref()
                    .map(|p| p.ops.as_slice())
                    .unwrap_or(&[]);
                for o in std::iter::once(op).chain(inner) {
                    if let Some(t) = o.tbg {
                        // Shares cut evenly at the lcm of the group sizes (capped: past it
                        // the sizes below cut some groups unevenly, which is checked too).
                        let l = lcm(groups, t.tbg_size);
                        if l <= MAX_EVEN_UNITS {
                            groups = l;
                        }
                    }
                }
                if let Some(p) = &op.pipeline {
                    min_pipeline_chunk = min_pipeline_chunk
                        .max(p.unit_size.saturating_mul(2).div_ceil(p.num_chunks) + 1);
                }
            }
        }
    }
    let a = doc.buffer_alignment;
    // One chunk of `units` alignment units: the sizes every rank's buffers then have.
    let at = |units: u64| -> Option<Sizes> {
        let chunk = units.checked_mul(a)?;
        Some(Sizes {
            input: chunk.checked_mul(g0.input_chunks)?,
            output: chunk.checked_mul(g0.output_chunks)?,
        })
    };
    let message = |s: Sizes| {
        if doc.collective == "allgather" {
            s.output
        } else {
            s.input
        }
    };
    // The smallest multiple of `step` units (plus `extra`) whose message is in range.
    let fit = |step: u64, extra: u64| -> Option<Sizes> {
        let base = at(step)?;
        let per = message(base).max(1);
        let k = doc.min_message_size.div_ceil(per).max(1);
        let s = at(k.checked_mul(step)?.checked_add(extra)?)?;
        (message(s) >= doc.min_message_size && message(s) <= doc.max_message_size).then_some(s)
    };
    let mut out = Vec::new();
    let even = fit(groups, 0).ok_or_else(|| {
        Error::Plan(PlanError::Malformed {
            plan: doc.name.clone(),
            field: "min_message_size".into(),
            problem: format!(
                "no message size in {}..={} cuts into the plan's chunks",
                doc.min_message_size, doc.max_message_size
            ),
        })
    })?;
    out.push(even);
    if groups > 1
        && let Some(s) = fit(groups, 1).or_else(|| fit(groups, groups - 1))
    {
        out.push(s);
    }
    if min_pipeline_chunk > 0 {
        let units = min_pipeline_chunk.div_ceil(a).div_ceil(groups) * groups;
        if let Some(s) = fit(units, 0)
            && !out.contains(&s)
        {
            out.push(s);
        }
    }
    Ok(out)
}

/// One op of the plan, for error messages.
struct OpInfo<'a> {
    rank: usize,
    block: usize,
    path: String,
    op: &'a Op,
    /// Its threadblock group's barrier (counter, blocks), for a share of a group op.
    group: Option<(usize, usize)>,
}

/// One step of a block: an op, shifted to a pipeline iteration's unit.
#[derive(Clone, Copy)]
struct Step {
    op: usize,
    shift: Option<(u64, u64)>,
}

/// A memory location's buffer: `(rank, space)`; space 0 the output (and an input inside it),
/// 1 a separate input, 2 the scratch.
type MemKey = (usize, u8);

/// Packets written: `(lo, hi, the writer's clock)`.
type PacketWrite = (i64, i64, Vec<u32>);

struct Access {
    mem: MemKey,
    lo: i64,
    hi: i64,
    write: bool,
    event: u32,
}

struct Event {
    agent: u32,
    clock: u32,
    op: u32,
    launch: u32,
}

#[derive(Default)]
struct Queue {
    /// Each signal's clock (`None`: relaxed).
    tokens: Vec<Option<Vec<u32>>>,
    taken: usize,
    /// The op that signalled last (whom to blame for a surplus).
    last_signal: Option<usize>,
    /// The op that waited last.
    last_wait: Option<usize>,
}

#[derive(Default)]
struct Generation {
    arrived: Vec<usize>,
}

#[derive(Default)]
struct Semaphore {
    releases: Vec<Vec<u32>>,
    taken: usize,
    last_release: Option<usize>,
    last_acquire: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// About to run `step`.
    Ready,
    /// Arrived at barrier generation `g` of the current step.
    AtBarrier(usize),
    /// At the end of its launch, waiting for the rank's other blocks.
    AtEnd,
    /// Every launch done.
    Done,
}

struct AgentState {
    rank: usize,
    block: usize,
    launch: usize,
    step: usize,
    phase: Phase,
    /// Barrier uses so far per barrier id (generation of the next use).
    barrier_uses: HashMap<usize, usize>,
}

/// Why an agent cannot step.
enum Blocked {
    No,
    Yes(String),
}

struct Sim<'a> {
    doc: &'a PlanDoc,
    geom: &'a Geometry,
    alias: &'a Aliasing,
    launches: usize,
    ops: Vec<OpInfo<'a>>,
    refs: Vec<Vec<BlockRefs>>,
    steps: Vec<Vec<Step>>,
    /// Block agents: `agent_of[rank][block]`.
    agent_of: Vec<Vec<usize>>,
    /// Lanes: (rank, block, global port channel) → agent.
    lanes: HashMap<(usize, usize, usize), usize>,
    n: usize,
    vc: Vec<u32>,
    st: Vec<AgentState>,
    queues: HashMap<(usize, ChannelKind, usize), Queue>,
    orphans: Vec<usize>,
    /// Peers' channels paired with each (rank, kind, channel): (peer, its channel).
    pairs: HashMap<(usize, ChannelKind, usize), Option<(usize, usize)>>,
    barriers: HashMap<(usize, usize), Vec<Generation>>,
    sems: HashMap<(usize, usize), Semaphore>,
    /// Packets written, by (rank, launch): (lo, hi, writer's clock).
    packets: HashMap<(usize, usize), Vec<PacketWrite>>,
    events: Vec<Event>,
    ev_vc: Vec<u32>,
    accesses: Vec<Access>,
    end_arrived: Vec<usize>,
    /// The joined clock of every block of a rank at the end of a launch: (rank, launch).
    ends: HashMap<(usize, usize), Vec<u32>>,
    /// Each block agent's clock at the start of each launch: (agent, launch).
    starts: HashMap<(usize, usize), u32>,
    /// The rank of every agent (lanes: their block's).
    agent_rank: Vec<usize>,
    sent: Vec<u64>,
    fetched: Vec<u64>,
    steps_done: u64,
}

fn max_into(dst: &mut [u32], src: &[u32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = (*d).max(*s);
    }
}

impl<'a> Sim<'a> {
    /// The steps agent `b` has left, as (launch, step) pairs.
    fn remaining(&self, b: usize) -> impl Iterator<Item = (usize, &Step)> + '_ {
        let s = &self.st[b];
        let (from_launch, from_step) = match s.phase {
            Phase::Done => (self.launches, 0),
            Phase::AtEnd => (s.launch + 1, 0),
            _ => (s.launch, s.step),
        };
        (from_launch..self.launches).flat_map(move |l| {
            let start = if l == from_launch { from_step } else { 0 };
            self.steps[b][start.min(self.steps[b].len())..]
                .iter()
                .map(move |st| (l, st))
        })
    }

    /// The block agents that have an op left which could free stuck agent `a`.
    fn producers(&self, a: usize) -> Vec<usize> {
        let s = &self.st[a];
        let rank = s.rank;
        let blocks = self.agent_of[rank].clone();
        let mut out = Vec::new();
        match s.phase {
            Phase::Done => {}
            Phase::AtEnd => {
                out.extend(blocks.iter().filter(|&&b| self.st[b].phase != Phase::AtEnd))
            }
            Phase::AtBarrier(g) => {
                let Step { op, .. } = self.steps[a][s.step];
                let id = self.barrier_of(op).map_or(0, |b| b.0);
                for b in blocks {
                    let used = *self.st[b].barrier_uses.get(&id).unwrap_or(&0);
                    if used <= g
                        && self
                            .remaining(b)
                            .any(|(_, st)| self.barrier_of(st.op).is_some_and(|x| x.0 == id))
                    {
                        out.push(b);
                    }
                }
            }
            Phase::Ready => {
                let Step { op, shift } = self.steps[a][s.step];
                let o = self.ops[op].op;
                match o.kind {
                    OpKind::Wait | OpKind::RelaxedWait => {
                        let keys = self.wait_keys(op);
                        for b in 0..self.st.len() {
                            if self
                                .remaining(b)
                                .any(|(_, st)| self.signals_into(st.op, &keys))
                            {
                                out.push(b);
                            }
                        }
                    }
                    OpKind::SemAcquire => {
                        for b in blocks {
                            if self.remaining(b).any(|(_, st)| {
                                let x = self.ops[st.op].op;
                                x.kind == OpKind::SemRelease
                                    && x.semaphore_ids.iter().any(|i| o.semaphore_ids.contains(i))
                            }) {
                                out.push(b);
                            }
                        }
                    }
                    _ => {
                        let launch = s.launch;
                        let wanted: Vec<(MemKey, i64, i64)> = (0..o.src.len())
                            .map(|i| self.place(op, false, i, shift, launch))
                            .filter(|x| x.4)
                            .map(|x| (x.0, x.1, x.2))
                            .collect();
                        for b in 0..self.st.len() {
                            let writes =
                                self.remaining(b)
                                    .filter(|&(l, _)| l == launch)
                                    .any(|(_, st)| {
                                        let x = self.ops[st.op].op;
                                        (0..x.dst.len()).any(|i| {
                                            let (m, lo, hi, _, packet) =
                                                self.place(st.op, true, i, st.shift, launch);
                                            packet
                                                && wanted
                                                    .iter()
                                                    .any(|w| w.0 == m && lo < w.2 && hi > w.1)
                                        })
                                    });
                            if writes {
                                out.push(b);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Whether op `op` signals into one of the queues `keys`.
    fn signals_into(&self, op: usize, keys: &[(usize, ChannelKind, usize)]) -> bool {
        let o = &self.ops[op];
        let signals = matches!(
            o.op.kind,
            OpKind::Signal
                | OpKind::RelaxedSignal
                | OpKind::PutWithSignal
                | OpKind::PutWithSignalAndFlush
        );
        let Some(kind) = o.op.channel_type.filter(|_| signals) else {
            return false;
        };
        o.op.channel_ids.iter().any(|&c| {
            let ch = self.global_channel(op, kind, c);
            matches!(self.pairs.get(&(o.rank, kind, ch)), Some(Some((p, pc))) if keys.contains(&(*p, kind, *pc)))
        })
    }

    fn refuse(&self, op: usize, problem: String) -> Error {
        let o = &self.ops[op];
        Error::Plan(PlanError::Refused {
            plan: self.doc.name.clone(),
            rank: o.rank,
            block: o.block,
            op: o.path.clone(),
            name: o.op.kind.name(),
            problem,
        })
    }

    fn vc_of(&self, a: usize) -> &[u32] {
        &self.vc[a * self.n..(a + 1) * self.n]
    }

    fn vc_mut(&mut self, a: usize) -> &mut [u32] {
        &mut self.vc[a * self.n..(a + 1) * self.n]
    }

    fn merge(&mut self, a: usize, other: &[u32]) {
        let n = self.n;
        max_into(&mut self.vc[a * n..(a + 1) * n], other);
    }

    /// The barrier (counter, blocks) op `op` meets at: a `barrier`'s, or its threadblock
    /// group's after a share of a group op.
    fn barrier_of(&self, op: usize) -> Option<(usize, usize)> {
        let o = &self.ops[op];
        if o.op.kind == OpKind::Barrier {
            Some((
                o.op.barrier_id.unwrap_or(0),
                o.op.num_threadblocks.unwrap_or(1),
            ))
        } else {
            o.group
        }
    }

    /// Agent `a` arrives (once) at op `op`'s barrier and waits until its generation is
    /// complete; then takes every arrival's clock.
    fn meet(&mut self, a: usize, op: usize, phase: Phase) -> Blocked {
        let rank = self.st[a].rank;
        let Some((id, n)) = self.barrier_of(op) else {
            return Blocked::No;
        };
        let gens = self.barriers.entry((rank, id)).or_default();
        let g = match phase {
            Phase::AtBarrier(g) => g,
            _ => {
                let g = *self.st[a].barrier_uses.get(&id).unwrap_or(&0);
                while gens.len() <= g {
                    gens.push(Generation::default());
                }
                gens[g].arrived.push(a);
                *self.st[a].barrier_uses.entry(id).or_default() += 1;
                self.st[a].phase = Phase::AtBarrier(g);
                g
            }
        };
        let arrived = self.barriers[&(rank, id)][g].arrived.clone();
        if arrived.len() < n {
            let what = if self.ops[op].op.kind == OpKind::Barrier {
                format!("barrier {id}")
            } else {
                "its threadblock group's barrier".to_string()
            };
            return Blocked::Yes(format!(
                "waits at {what} for {n} blocks; {} arrive",
                arrived.len()
            ));
        }
        let mut joined = vec![0u32; self.n];
        for &b in &arrived {
            max_into(&mut joined, self.vc_of(b));
        }
        self.merge(a, &joined);
        self.st[a].phase = Phase::Ready;
        Blocked::No
    }

    /// Agent `a` starts `launch` (after the host's work for it: a tick, remembered).
    fn start(&mut self, a: usize, launch: usize) {
        self.vc_mut(a)[a] += 1;
        let clock = self.vc_of(a)[a];
        self.starts.insert((a, launch), clock);
    }

    /// Ticks agent `a` and records an event of op `op`.
    fn event(&mut self, a: usize, op: usize, launch: usize) -> u32 {
        self.vc_mut(a)[a] += 1;
        let clock = self.vc_of(a)[a];
        let id = self.events.len() as u32;
        self.events.push(Event {
            agent: a as u32,
            clock,
            op: op as u32,
            launch: launch as u32,
        });
        let (s, e) = (a * self.n, (a + 1) * self.n);
        self.ev_vc.extend_from_slice(&self.vc[s..e]);
        id
    }

    /// The buffer and start coordinate of `kind` of `rank` in `launch`.
    fn space(&self, rank: usize, kind: BufferKind, launch: usize) -> (MemKey, i64) {
        match kind {
            BufferKind::Output => ((rank, 0), 0),
            BufferKind::Input => match self.alias[rank] {
                Some(d) => ((rank, 0), d),
                None => ((rank, 1), 0),
            },
            BufferKind::Scratch => {
                let half = if self.geom.double && launch % 2 == 1 {
                    self.geom.scratch_half(&self.doc.gpus[rank])
                } else {
                    0
                };
                ((rank, 2), half as i64)
            }
        }
    }

    /// Reference `i` of op `op` (agent's rank/block) at `launch`, shifted: (buffer, lo, hi,
    /// remote, packet).
    fn place(
        &self,
        op: usize,
        dst: bool,
        i: usize,
        shift: Option<(u64, u64)>,
        launch: usize,
    ) -> (MemKey, i64, i64, bool, bool) {
        let o = &self.ops[op];
        let g = &self.doc.gpus[o.rank];
        let r = resolve(g, &self.refs[o.rank][o.block], o.op, dst, i);
        let (mut off, mut len) = placed(self.geom, o.op, dst, i);
        if let Some((s, unit)) = shift {
            let rest = len.saturating_sub(s);
            off += s;
            len = rest.min(unit);
        }
        let (key, base) = self.space(r.rank, r.kind, launch);
        let lo = base + off as i64;
        (key, lo, lo + len as i64, r.rank != o.rank, r.packet)
    }

    fn access(&mut self, mem: MemKey, lo: i64, hi: i64, write: bool, event: u32) {
        if hi > lo {
            self.accesses.push(Access {
                mem,
                lo,
                hi,
                write,
                event,
            });
        }
    }

    /// Whether the packets `[lo, hi)` of `mem` are all written in `launch`, and the join of
    /// their writers' clocks.
    fn packets_ready(&self, mem: MemKey, lo: i64, hi: i64, launch: usize) -> Option<Vec<u32>> {
        let mut joined = vec![0u32; self.n];
        if hi <= lo {
            return Some(joined);
        }
        let list = self.packets.get(&(mem.0, launch))?;
        let mut covering: Vec<&PacketWrite> =
            list.iter().filter(|w| w.0 < hi && w.1 > lo).collect();
        covering.sort_by_key(|w| w.0);
        let mut at = lo;
        for w in covering {
            if w.0 > at {
                return None;
            }
            at = at.max(w.1);
            max_into(&mut joined, &w.2);
        }
        (at >= hi).then_some(joined)
    }

    /// The global channel index of block-local channel `c` of kind `kind`.
    fn global_channel(&self, op: usize, kind: ChannelKind, c: usize) -> usize {
        let o = &self.ops[op];
        self.refs[o.rank][o.block].channels(kind)[c]
    }

    fn lane(&self, op: usize, c: usize) -> usize {
        let o = &self.ops[op];
        let ch = self.global_channel(op, ChannelKind::Port, c);
        self.lanes[&(o.rank, o.block, ch)]
    }

    /// Sends a signal from op `op` on local channel `c` carrying `clock` (`None`: relaxed).
    fn signal(&mut self, op: usize, kind: ChannelKind, c: usize, clock: Option<Vec<u32>>) {
        let rank = self.ops[op].rank;
        let ch = self.global_channel(op, kind, c);
        match self.pairs[&(rank, kind, ch)] {
            Some((peer, pch)) => {
                let q = self.queues.entry((peer, kind, pch)).or_default();
                q.tokens.push(clock);
                q.last_signal = Some(op);
            }
            None => self.orphans.push(op),
        }
    }

    /// What a wait of op `op` needs: for each of its channels, the queue key.
    fn wait_keys(&self, op: usize) -> Vec<(usize, ChannelKind, usize)> {
        let o = &self.ops[op];
        let kind = o.op.channel_type.unwrap_or(ChannelKind::None);
        o.op.channel_ids
            .iter()
            .map(|&c| (o.rank, kind, self.global_channel(op, kind, c)))
            .collect()
    }

    /// Tries one step of block agent `a`.
    fn try_step(&mut self, a: usize) -> Result<Blocked> {
        let (rank, launch, step, phase) = {
            let s = &self.st[a];
            (s.rank, s.launch, s.step, s.phase)
        };
        if phase == Phase::Done {
            return Ok(Blocked::No);
        }
        if phase == Phase::AtEnd || step >= self.steps[a].len() {
            if phase != Phase::AtEnd {
                self.st[a].phase = Phase::AtEnd;
                self.end_arrived[rank] += 1;
            }
            let nb = self.agent_of[rank].len();
            if self.end_arrived[rank] < nb {
                return Ok(Blocked::Yes("the end of the launch".into()));
            }
            // Every block of the rank ended the launch: the next starts after all of them.
            let mut joined = vec![0u32; self.n];
            for &b in &self.agent_of[rank] {
                max_into(&mut joined, self.vc_of(b));
            }
            self.end_arrived[rank] = 0;
            self.ends.insert((rank, launch), joined.clone());
            for b in self.agent_of[rank].clone() {
                self.merge(b, &joined);
                let s = &mut self.st[b];
                s.launch += 1;
                s.step = 0;
                s.phase = if s.launch == self.launches {
                    Phase::Done
                } else {
                    Phase::Ready
                };
                if s.phase == Phase::Ready {
                    self.start(b, launch + 1);
                }
            }
            return Ok(Blocked::No);
        }
        let Step { op, shift } = self.steps[a][step];
        let kind = self.ops[op].op.kind;
        let ch_kind = self.ops[op].op.channel_type.unwrap_or(ChannelKind::None);
        match kind {
            OpKind::Wait | OpKind::RelaxedWait => {
                let keys = self.wait_keys(op);
                for (i, k) in keys.iter().enumerate() {
                    let need = keys[..i].iter().filter(|x| *x == k).count();
                    let q = self.queues.get(k);
                    let (have, taken) = q.map_or((0, 0), |q| (q.tokens.len(), q.taken));
                    if have <= taken + need {
                        let c = self.ops[op].op.channel_ids[i];
                        let peer = self.doc.gpus[rank].channel_peers(ch_kind)[k.2];
                        let paired = self.pairs.iter().any(|(&(r, kd, _), v)| {
                            r == peer && kd == ch_kind && *v == Some((rank, k.2))
                        });
                        return Ok(Blocked::Yes(if paired {
                            format!(
                                "waits for signal {} on {} channel {c} (to rank {peer}), which rank \
                                 {peer} never sends",
                                taken + need + 1,
                                ch_kind.code()
                            )
                        } else {
                            format!(
                                "waits on {} channel {c} (to rank {peer}), but no {} channel of rank \
                                 {peer} pairs with it",
                                ch_kind.code(),
                                ch_kind.code()
                            )
                        }));
                    }
                }
                let strong = kind == OpKind::Wait;
                for k in keys {
                    let q = self.queues.get_mut(&k).expect("checked above");
                    let tok = q.tokens[q.taken].clone();
                    q.taken += 1;
                    q.last_wait = Some(op);
                    if strong && let Some(t) = tok {
                        self.merge(a, &t);
                    }
                }
                self.event(a, op, launch);
            }
            OpKind::Signal | OpKind::RelaxedSignal => {
                let ids = self.ops[op].op.channel_ids.clone();
                let strong = kind == OpKind::Signal;
                if ch_kind == ChannelKind::Port {
                    for c in ids {
                        let l = self.lane(op, c);
                        let mine = self.vc_of(a).to_vec();
                        self.merge(l, &mine);
                        self.event(l, op, launch);
                        let tok = strong.then(|| self.vc_of(l).to_vec());
                        self.signal(op, ChannelKind::Port, c, tok);
                    }
                } else {
                    self.event(a, op, launch);
                    let tok = strong.then(|| self.vc_of(a).to_vec());
                    for c in ids {
                        self.signal(op, ch_kind, c, tok.clone());
                    }
                }
            }
            OpKind::Flush => {
                for c in self.ops[op].op.channel_ids.clone() {
                    let l = self.lane(op, c);
                    let theirs = self.vc_of(l).to_vec();
                    self.merge(a, &theirs);
                }
                self.event(a, op, launch);
            }
            OpKind::Barrier => {
                if let Blocked::Yes(why) = self.meet(a, op, phase) {
                    return Ok(Blocked::Yes(why));
                }
                self.event(a, op, launch);
            }
            OpKind::SemRelease => {
                self.event(a, op, launch);
                let mine = self.vc_of(a).to_vec();
                for s in self.ops[op].op.semaphore_ids.clone() {
                    let sem = self.sems.entry((rank, s)).or_default();
                    sem.releases.push(mine.clone());
                    sem.last_release = Some(op);
                }
            }
            OpKind::SemAcquire => {
                let ids = self.ops[op].op.semaphore_ids.clone();
                for (i, &s) in ids.iter().enumerate() {
                    let need = ids[..i].iter().filter(|&&x| x == s).count();
                    let init = self.doc.gpus[rank].semaphores[s] as usize;
                    let sem = self.sems.entry((rank, s)).or_default();
                    if init + sem.releases.len() <= sem.taken + need {
                        return Ok(Blocked::Yes(format!(
                            "acquires a token of semaphore {s} (initial value {init}) that no \
                             release gives"
                        )));
                    }
                }
                for s in ids {
                    let init = self.doc.gpus[rank].semaphores[s] as usize;
                    let sem = self.sems.get_mut(&(rank, s)).expect("entered above");
                    let t = sem.taken;
                    sem.taken += 1;
                    sem.last_acquire = Some(op);
                    // Releases `0..=t - init` (a release sequence: all of them).
                    let upto = (t + 1).saturating_sub(init).min(sem.releases.len());
                    let mut joined = vec![0u32; self.n];
                    for r in &sem.releases[..upto] {
                        max_into(&mut joined, r);
                    }
                    self.merge(a, &joined);
                }
                self.event(a, op, launch);
            }
            OpKind::Nop | OpKind::Pipeline => {
                self.event(a, op, launch);
            }
            _ => {
                if !matches!(phase, Phase::AtBarrier(_))
                    && let Blocked::Yes(why) = self.data_step(a, op, shift, launch)
                {
                    return Ok(Blocked::Yes(why));
                }
                // A share of a threadblock group's op: the group meets after it.
                if self.barrier_of(op).is_some()
                    && let Blocked::Yes(why) = self.meet(a, op, self.st[a].phase)
                {
                    return Ok(Blocked::Yes(why));
                }
            }
        }
        self.steps_done += 1;
        self.st[a].step += 1;
        Ok(Blocked::No)
    }

    /// A step of an op that moves data.
    fn data_step(
        &mut self,
        a: usize,
        op: usize,
        shift: Option<(u64, u64)>,
        launch: usize,
    ) -> Blocked {
        let o = &self.ops[op];
        let (rank, kind) = (o.rank, o.op.kind);
        let port = o.op.channel_type == Some(ChannelKind::Port);
        let (nsrc, ndst) = (o.op.src.len(), o.op.dst.len());
        let srcs: Vec<_> = (0..nsrc)
            .map(|i| self.place(op, false, i, shift, launch))
            .collect();
        let dsts: Vec<_> = (0..ndst)
            .map(|i| self.place(op, true, i, shift, launch))
            .collect();
        // Packet sources must be written in this launch first.
        let mut joined = vec![0u32; self.n];
        for &(mem, lo, hi, _, packet) in &srcs {
            if packet {
                match self.packets_ready(mem, lo, hi, launch) {
                    Some(j) => max_into(&mut joined, &j),
                    None => {
                        return Blocked::Yes(format!(
                            "reads packets at bytes {lo}..{hi} of its scratch that no op of \
                             the launch writes"
                        ));
                    }
                }
            }
        }
        self.merge(a, &joined);
        if launch == 0 {
            for &(_, lo, hi, remote, _) in &srcs {
                if remote {
                    self.fetched[rank] += (hi - lo) as u64;
                }
            }
            for &(_, lo, hi, remote, _) in &dsts {
                if remote {
                    self.sent[rank] += (hi - lo) as u64;
                }
            }
        }
        let pushes = port
            && matches!(
                kind,
                OpKind::Put
                    | OpKind::PutWithSignal
                    | OpKind::PutWithSignalAndFlush
                    | OpKind::PutPackets
                    | OpKind::ReadPutPackets
            );
        if !pushes {
            let e = self.event(a, op, launch);
            for &(mem, lo, hi, _, _) in &srcs {
                self.access(mem, lo, hi, false, e);
            }
            for &(mem, lo, hi, _, packet) in &dsts {
                self.access(mem, lo, hi, true, e);
                if packet {
                    let clock = self.vc_of(a).to_vec();
                    self.packets
                        .entry((mem.0, launch))
                        .or_default()
                        .push((lo, hi, clock));
                }
            }
            return Blocked::No;
        }
        // Port: the block reads packet sources itself (rppkt), then pushes; the proxy (the
        // lane) reads the source and writes the destination later.
        if kind == OpKind::ReadPutPackets {
            let e = self.event(a, op, launch);
            let (mem, lo, hi, _, _) = srcs[0];
            self.access(mem, lo, hi, false, e);
        }
        let ids = self.ops[op].op.channel_ids.clone();
        for (k, &c) in ids.iter().enumerate() {
            let l = self.lane(op, c);
            let mine = self.vc_of(a).to_vec();
            self.merge(l, &mine);
            let e = self.event(l, op, launch);
            let (smem, slo, shi, _, _) = srcs[if kind == OpKind::ReadPutPackets { 0 } else { k }];
            self.access(smem, slo, shi, false, e);
            let (dmem, dlo, dhi, _, packet) = dsts[k];
            self.access(dmem, dlo, dhi, true, e);
            if packet {
                let clock = self.vc_of(l).to_vec();
                self.packets
                    .entry((dmem.0, launch))
                    .or_default()
                    .push((dlo, dhi, clock));
            }
            if matches!(kind, OpKind::PutWithSignal | OpKind::PutWithSignalAndFlush) {
                let tok = Some(self.vc_of(l).to_vec());
                self.signal(op, ChannelKind::Port, c, tok);
            }
            if kind == OpKind::PutWithSignalAndFlush {
                let theirs = self.vc_of(l).to_vec();
                self.merge(a, &theirs);
            }
        }
        self.event(a, op, launch);
        Blocked::No
    }
}

/// Verifies `doc` at `geom` with the ranks' buffers overlapping as `alias` says.
pub fn verify(doc: &PlanDoc, geom: &Geometry, alias: &Aliasing, races: Races) -> Result<Summary> {
    let launches = if doc.use_double_scratch_buffer { 3 } else { 2 };
    // Static tables.
    let mut ops = Vec::new();
    let mut refs = Vec::new();
    let mut agent_of = Vec::new();
    let mut steps = Vec::new();
    let mut n = 0usize;
    let mut total_steps = 0u64;
    for g in &doc.gpus {
        let mut rank_refs = Vec::new();
        let mut rank_agents = Vec::new();
        let groups = super::lower::groups(doc, g)?;
        for tb in &g.threadblocks {
            rank_refs.push(BlockRefs::of(tb));
            rank_agents.push(n);
            n += 1;
            let mut list = Vec::new();
            for (i, op) in tb.ops.iter().enumerate() {
                let id = ops.len();
                ops.push(OpInfo {
                    rank: g.id,
                    block: tb.id,
                    path: format!("ops[{i}]"),
                    op,
                    group: groups.get(&(tb.id, (i, None))).copied(),
                });
                match &op.pipeline {
                    None => list.push(Step {
                        op: id,
                        shift: None,
                    }),
                    Some(p) => {
                        let inner: Vec<usize> = (0..p.ops.len())
                            .map(|j| {
                                ops.push(OpInfo {
                                    rank: g.id,
                                    block: tb.id,
                                    path: format!("ops[{i}].ops[{j}]"),
                                    op: &p.ops[j],
                                    group: groups.get(&(tb.id, (i, Some(j)))).copied(),
                                });
                                ops.len() - 1
                            })
                            .collect();
                        let iters = geom.iterations(p.num_chunks, p.unit_size);
                        total_steps += iters * inner.len() as u64;
                        if total_steps * launches as u64 > MAX_STEPS {
                            return Err(Error::Plan(PlanError::Call {
                                plan: doc.name.clone(),
                                problem: format!(
                                    "more than {MAX_STEPS} op steps to verify at these sizes"
                                ),
                            }));
                        }
                        for it in 0..iters {
                            for &j in &inner {
                                list.push(Step {
                                    op: j,
                                    shift: Some((it * p.unit_size, p.unit_size)),
                                });
                            }
                        }
                    }
                }
            }
            total_steps += list.len() as u64;
            steps.push(list);
        }
        refs.push(rank_refs);
        agent_of.push(rank_agents);
    }
    check_static(doc, &ops)?;
    // Lanes: one per (block, port channel) that puts, signals or flushes.
    let mut lanes = HashMap::new();
    let mut agent_rank: Vec<usize> = agent_of
        .iter()
        .enumerate()
        .flat_map(|(r, a)| a.iter().map(move |_| r))
        .collect();
    for o in &ops {
        if o.op.channel_type == Some(ChannelKind::Port) {
            for &c in &o.op.channel_ids {
                let ch = refs[o.rank][o.block].port_channels[c];
                lanes.entry((o.rank, o.block, ch)).or_insert_with(|| {
                    n += 1;
                    agent_rank.push(o.rank);
                    n - 1
                });
            }
        }
    }
    // Channel pairs.
    let mut pairs = HashMap::new();
    for g in &doc.gpus {
        for kind in [ChannelKind::Memory, ChannelKind::Port] {
            let peers = g.channel_peers(kind);
            for (i, &p) in peers.iter().enumerate() {
                let j = peers[..i].iter().filter(|&&x| x == p).count();
                let theirs = doc.gpus[p].channel_peers(kind);
                let pch = theirs
                    .iter()
                    .enumerate()
                    .filter(|&(_, &x)| x == g.id)
                    .nth(j)
                    .map(|(k, _)| (p, k));
                pairs.insert((g.id, kind, i), pch);
            }
        }
    }
    let st = (0..doc.gpus.len())
        .flat_map(|r| {
            (0..doc.gpus[r].threadblocks.len()).map(move |b| AgentState {
                rank: r,
                block: b,
                launch: 0,
                step: 0,
                phase: Phase::Ready,
                barrier_uses: HashMap::new(),
            })
        })
        .collect::<Vec<_>>();
    let nblock_agents = st.len();
    let mut sim = Sim {
        doc,
        geom,
        alias,
        launches,
        ops,
        refs,
        steps,
        agent_of,
        lanes,
        n,
        vc: vec![0; n * n],
        st,
        queues: HashMap::new(),
        orphans: Vec::new(),
        pairs,
        barriers: HashMap::new(),
        sems: HashMap::new(),
        packets: HashMap::new(),
        events: Vec::new(),
        ev_vc: Vec::new(),
        accesses: Vec::new(),
        end_arrived: vec![0; doc.gpus.len()],
        ends: HashMap::new(),
        starts: HashMap::new(),
        agent_rank,
        sent: vec![0; doc.gpus.len()],
        fetched: vec![0; doc.gpus.len()],
        steps_done: 0,
    };
    for a in 0..nblock_agents {
        sim.start(a, 0);
    }
    // Run until nothing moves.
    let mut why: Vec<Option<String>> = vec![None; nblock_agents];
    loop {
        let mut moved = false;
        for (a, why) in why.iter_mut().enumerate() {
            loop {
                let before = (sim.st[a].launch, sim.st[a].step, sim.st[a].phase);
                match sim.try_step(a) {
                    Ok(Blocked::No) => {
                        *why = None;
                        if (sim.st[a].launch, sim.st[a].step, sim.st[a].phase) == before {
                            break;
                        }
                        moved = true;
                    }
                    Ok(Blocked::Yes(reason)) => {
                        if (sim.st[a].launch, sim.st[a].step, sim.st[a].phase) != before {
                            moved = true;
                        }
                        *why = Some(reason);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if !moved {
            break;
        }
    }
    // Stuck agents: blame one that nothing left to run can free (starved), else one in the
    // cycle, never one merely waiting for its siblings to end the launch.
    let stuck: Vec<usize> = (0..nblock_agents)
        .filter(|&a| sim.st[a].phase != Phase::Done)
        .collect();
    if !stuck.is_empty() {
        let waiting = |a: usize| sim.st[a].phase != Phase::AtEnd;
        let a = stuck
            .iter()
            .copied()
            .find(|&a| waiting(a) && sim.producers(a).is_empty())
            .or_else(|| stuck.iter().copied().find(|&a| waiting(a)))
            .unwrap_or(stuck[0]);
        let starved = sim.producers(a).is_empty();
        let s = &sim.st[a];
        let reason = why[a].clone().unwrap_or_else(|| "cannot go on".into());
        if s.step < sim.steps[a].len() {
            let op = sim.steps[a][s.step].op;
            return Err(sim.refuse(
                op,
                format!(
                    "hangs in launch {} of {}: it {reason}{}",
                    s.launch + 1,
                    sim.launches,
                    if starved {
                        ""
                    } else {
                        " (the ops that would free it wait in a cycle with it)"
                    }
                ),
            ));
        }
        return Err(Error::Plan(PlanError::Refused {
            plan: doc.name.clone(),
            rank: s.rank,
            block: s.block,
            op: "(end)".into(),
            name: "",
            problem: "hangs: its rank's other blocks never end the launch".into(),
        }));
    }
    // Balance.
    if let Some(&op) = sim.orphans.first() {
        let o = &sim.ops[op];
        let kind = o.op.channel_type.unwrap_or(ChannelKind::None);
        return Err(sim.refuse(
            op,
            format!(
                "signals a {} channel that no channel of the peer pairs with: nothing ever \
                 waits for it",
                kind.code()
            ),
        ));
    }
    let mut keys: Vec<_> = sim.queues.keys().copied().collect();
    keys.sort();
    for k in keys {
        let q = &sim.queues[&k];
        if q.tokens.len() != q.taken {
            let op = q.last_wait.or(q.last_signal).unwrap_or(0);
            return Err(sim.refuse(
                op,
                format!(
                    "over {} launches rank {} receives {} signals on {} channel {} and waits {} \
                     times: the signals and waits of a channel must balance in every launch \
                     (a surplus lets a later launch's wait pass early)",
                    sim.launches,
                    k.0,
                    q.tokens.len(),
                    k.1.code(),
                    k.2,
                    q.taken
                ),
            ));
        }
    }
    let mut sems: Vec<_> = sim.sems.keys().copied().collect();
    sems.sort();
    for k in sems {
        let s = &sim.sems[&k];
        if s.releases.len() != s.taken {
            let op = s.last_release.or(s.last_acquire).unwrap_or(0);
            return Err(sim.refuse(
                op,
                format!(
                    "semaphore {} of rank {} is released {} times and acquired {} over {} \
                     launches: they must balance in every launch",
                    k.1,
                    k.0,
                    s.releases.len(),
                    s.taken,
                    sim.launches
                ),
            ));
        }
    }
    let mut found = Vec::new();
    find_race(&sim, &mut found);
    find_late(&sim, &mut found);
    find_early(&sim, &mut found);
    if races == Races::Refuse && !found.is_empty() {
        return Err(found.swap_remove(0));
    }
    Ok(Summary {
        sizes: geom.sizes,
        ranks: doc.gpus.len(),
        blocks: doc.gpus.iter().map(|g| g.threadblocks.len()).collect(),
        ops: doc
            .gpus
            .iter()
            .map(|g| {
                g.threadblocks
                    .iter()
                    .flat_map(|tb| &tb.ops)
                    .map(|o| 1 + o.pipeline.as_ref().map_or(0, |p| p.ops.len()))
                    .sum()
            })
            .collect(),
        sent: sim.sent,
        fetched: sim.fetched,
        launches,
        steps: sim.steps_done,
        races: found.iter().map(|e| e.to_string()).collect(),
    })
}

/// Checks what does not need a run: barriers used by as many blocks as they name, semaphores
/// with one releasing and one acquiring block.
fn check_static(doc: &PlanDoc, ops: &[OpInfo]) -> Result<()> {
    let refuse = |o: &OpInfo, problem: String| {
        Error::Plan(PlanError::Refused {
            plan: doc.name.clone(),
            rank: o.rank,
            block: o.block,
            op: o.path.clone(),
            name: o.op.kind.name(),
            problem,
        })
    };
    let mut barriers: HashMap<(usize, usize), (usize, Vec<usize>)> = HashMap::new();
    let mut sems: HashMap<(usize, usize, bool), Vec<usize>> = HashMap::new();
    for o in ops {
        match o.op.kind {
            OpKind::Barrier => {
                let id = o.op.barrier_id.unwrap_or(0);
                let n = o.op.num_threadblocks.unwrap_or(0);
                let e = barriers.entry((o.rank, id)).or_insert((n, Vec::new()));
                if e.0 != n {
                    return Err(refuse(
                        o,
                        format!("barrier {id} names {n} blocks here and {} elsewhere", e.0),
                    ));
                }
                if !e.1.contains(&o.block) {
                    e.1.push(o.block);
                }
            }
            OpKind::SemAcquire | OpKind::SemRelease => {
                for &s in &o.op.semaphore_ids {
                    let e = sems
                        .entry((o.rank, s, o.op.kind == OpKind::SemRelease))
                        .or_default();
                    if !e.contains(&o.block) {
                        e.push(o.block);
                    }
                    if e.len() > 1 {
                        return Err(refuse(
                            o,
                            format!(
                                "semaphore {s} is {} by threadblocks {:?}: which {} an {} \
                                 follows would depend on timing (one releasing and one \
                                 acquiring block per semaphore)",
                                if o.op.kind == OpKind::SemRelease {
                                    "released"
                                } else {
                                    "acquired"
                                },
                                e,
                                "release",
                                "acquire"
                            ),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    for o in ops {
        if o.op.kind == OpKind::Barrier {
            let id = o.op.barrier_id.unwrap_or(0);
            let (n, blocks) = &barriers[&(o.rank, id)];
            if blocks.len() != *n {
                return Err(refuse(
                    o,
                    format!(
                        "barrier {id} of rank {} meets {n} blocks but threadblocks {blocks:?} use \
                         it",
                        o.rank
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Finds (up to [`MAX_RACES`]) two accesses to overlapping bytes, one a write, that nothing
/// orders.
fn find_race(sim: &Sim, found: &mut Vec<Error>) {
    let mut order: Vec<usize> = (0..sim.accesses.len()).collect();
    order.sort_by_key(|&i| {
        let x = &sim.accesses[i];
        (x.mem, x.lo)
    });
    let n = sim.n;
    let before = |e1: u32, e2: u32| -> bool {
        let (a, b) = (&sim.events[e1 as usize], e2 as usize);
        sim.ev_vc[b * n + a.agent as usize] >= a.clock
    };
    let mut active: Vec<usize> = Vec::new();
    let mut mem = None;
    for &i in &order {
        let x = &sim.accesses[i];
        if mem != Some(x.mem) {
            active.clear();
            mem = Some(x.mem);
        }
        active.retain(|&j| sim.accesses[j].hi > x.lo);
        for &j in &active {
            let y = &sim.accesses[j];
            if !(x.write || y.write) || x.event == y.event {
                continue;
            }
            if before(x.event, y.event) || before(y.event, x.event) {
                continue;
            }
            let (ex, ey) = (&sim.events[x.event as usize], &sim.events[y.event as usize]);
            let oy = &sim.ops[ey.op as usize];
            let (lo, hi) = (x.lo.max(y.lo), x.hi.min(y.hi));
            let what = match x.mem.1 {
                0 => "output",
                1 => "input",
                _ => "scratch",
            };
            let verb = |w: bool| if w { "writes" } else { "reads" };
            if found.len() >= MAX_RACES {
                return;
            }
            found.push(sim.refuse(
                ex.op as usize,
                format!(
                    "{} bytes {lo}..{hi} of rank {}'s {what} (launch {}) while rank {}, \
                     threadblock {}, {} ({}) {} them (launch {}), and nothing orders the two",
                    verb(x.write),
                    x.mem.0,
                    ex.launch + 1,
                    oy.rank,
                    oy.block,
                    oy.path,
                    oy.op.kind.name(),
                    verb(y.write),
                    ey.launch + 1
                ),
            ));
        }
        active.push(i);
    }
}

/// Refuses an access to a rank's input or output by anything but its own blocks (a peer, a
/// proxy) that its launch may end before: the caller would read an output not yet written,
/// or write an input a peer or proxy still reads.
fn find_late(sim: &Sim, found: &mut Vec<Error>) {
    for x in &sim.accesses {
        let (owner, space) = x.mem;
        if space == 2 {
            continue;
        }
        let e = &sim.events[x.event as usize];
        let a = e.agent as usize;
        if a < sim.st.len() && sim.agent_rank[a] == owner {
            continue;
        }
        let Some(end) = sim.ends.get(&(owner, e.launch as usize)) else {
            continue;
        };
        if end[a] >= e.clock {
            continue;
        }
        let what = if space == 0 { "output" } else { "input" };
        let by = if a < sim.st.len() {
            "this op"
        } else {
            "the proxy, for this op,"
        };
        if found.len() >= MAX_RACES {
            return;
        }
        found.push(sim.refuse(
            e.op as usize,
            format!(
                "{by} {} bytes {}..{} of rank {owner}'s {what}, and rank {owner}'s launch {} may \
                 end before that (nothing orders the access before its last op): the caller \
                 would see the buffer {}",
                if x.write { "writes" } else { "reads" },
                x.lo,
                x.hi,
                e.launch + 1,
                if x.write {
                    "before it is written"
                } else {
                    "while it is still read"
                }
            ),
        ));
    }
}

#[cfg(test)]
mod tests;

/// Finds an access to a rank's input or output by anything but its own blocks that may come
/// before the rank's launch starts (nothing orders it after one of the rank's ops of that
/// launch): the caller may still be reading the previous results there, or not yet have
/// written the input.
fn find_early(sim: &Sim, found: &mut Vec<Error>) {
    for x in &sim.accesses {
        let (owner, space) = x.mem;
        if space == 2 || found.len() >= MAX_RACES {
            continue;
        }
        let e = &sim.events[x.event as usize];
        let a = e.agent as usize;
        if a < sim.st.len() && sim.agent_rank[a] == owner {
            continue;
        }
        let at = x.event as usize * sim.n;
        let vc = &sim.ev_vc[at..at + sim.n];
        let after_start = sim.agent_of[owner].iter().any(|&b| {
            sim.starts
                .get(&(b, e.launch as usize))
                .is_some_and(|&c| vc[b] >= c)
        });
        if after_start {
            continue;
        }
        let what = if space == 0 { "output" } else { "input" };
        let by = if a < sim.st.len() {
            "this op"
        } else {
            "the proxy, for this op,"
        };
        found.push(sim.refuse(
            e.op as usize,
            format!(
                "{by} {} bytes {}..{} of rank {owner}'s {what} in launch {}, and nothing orders \
                 that after rank {owner}'s launch starts: the caller may still be {}",
                if x.write { "writes" } else { "reads" },
                x.lo,
                x.hi,
                e.launch + 1,
                if x.write {
                    "reading the previous launch's results there"
                } else {
                    "writing the input"
                }
            ),
        ));
    }
}
