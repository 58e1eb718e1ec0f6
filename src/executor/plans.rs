//! Plans of this repository, written in Rust ([`PlanBuilder`]) in MSCCL++'s schema
//! ([`PlanDoc::to_json`] gives the file MSCCL++'s executor reads too), for any number of ranks.
//! Between them they use every op the parser accepts but the switch ops; the tests run each
//! at 2, 3, 4 and 8 ranks against a host reference, `mscclpp-plan write` prints them.
//!
//! | plan | collective | protocol | what it exercises |
//! |---|---|---|---|
//! | [`allreduce_read`] | all-reduce, in place | Simple | `rres` (reads and writes every peer's chunk), `signal` / `wait`, `rlxsignal` / `rlxwait`, `nop` |
//! | [`allreduce_get`] | all-reduce | Simple | `get`, `re` + `put` and `res`, a threadblock group of two blocks, `barrier` |
//! | [`allreduce_pipeline`] | all-reduce | Simple | `pipeline`, `copy`, `sem_release` / `sem_acquire`, `rres` and `rre` + `put` inside a pipeline |
//! | [`allgather_port`] | all-gather | Simple | port channels: `put` + `signal`, `pws`, `pwsf`, `flush`, `wait` |
//! | [`allreduce_packets`] | all-reduce, in place | LL, double scratch | `ppkt`, `recspkt`, `respkt`, `repkt` + `ppkt`, `recpkt` + `rppkt`, `upkt` |
//! | [`allgather_packets`] | all-gather | LL, double scratch | `cpkt`, `rppkt` over memory and port channels, `ppkt` over port channels, `upkt`, `copy` |

use std::collections::HashMap;

use super::plan::{
    BufferKind, ChannelDecl, ChannelKind, GpuProgram, Op, OpKind, Pipeline, PlanDoc, Protocol,
    ReduceKind, RemoteBufferDecl, Slice, Target, TbRefs, Tbg, Threadblock,
};

/// Builds a plan rank by rank, block by block: channels and remote buffers are declared on
/// first use (one channel of each kind per pair of ranks, so channel `j` pairs with channel
/// `j` of the peer trivially).
pub struct PlanBuilder {
    doc: PlanDoc,
    channels: HashMap<(usize, ChannelKind, usize), usize>,
}

impl PlanBuilder {
    /// A plan for `ranks` ranks with these chunk counts on every rank.
    pub fn new(
        name: &str,
        collective: &str,
        ranks: usize,
        protocol: Protocol,
        inplace: bool,
        chunks: [u64; 3],
    ) -> Self {
        let gpus = (0..ranks)
            .map(|r| GpuProgram {
                id: r,
                input_chunks: chunks[0],
                output_chunks: chunks[1],
                scratch_chunks: chunks[2],
                threadblocks: Vec::new(),
                channels: Vec::new(),
                remote_buffers: Vec::new(),
                semaphores: Vec::new(),
            })
            .collect();
        Self {
            doc: PlanDoc {
                name: name.to_string(),
                collective: collective.to_string(),
                protocol,
                inplace,
                reuse_resources: false,
                gpus,
                num_threads_per_block: 1024,
                use_double_scratch_buffer: false,
                buffer_alignment: 16,
                min_message_size: 0,
                max_message_size: u64::MAX,
            },
            channels: HashMap::new(),
        }
    }

    /// Two scratch halves, alternate launches using each.
    pub fn double_scratch(mut self) -> Self {
        self.doc.use_double_scratch_buffer = true;
        self
    }

    /// A new block of `rank`; returns its index.
    pub fn block(&mut self, rank: usize) -> usize {
        let tbs = &mut self.doc.gpus[rank].threadblocks;
        tbs.push(Threadblock {
            id: tbs.len(),
            ops: Vec::new(),
            channels: Vec::new(),
            remote_buffer_refs: Vec::new(),
        });
        tbs.len() - 1
    }

    /// A device semaphore of `rank` with initial value `init`; returns its id.
    pub fn semaphore(&mut self, rank: usize, init: u64) -> usize {
        let s = &mut self.doc.gpus[rank].semaphores;
        s.push(init);
        s.len() - 1
    }

    /// The global index of `rank`'s channel of `kind` to `peer` (declared on first use, with
    /// its twin on the peer).
    fn global_channel(&mut self, rank: usize, kind: ChannelKind, peer: usize) -> usize {
        for (a, b) in [(rank, peer), (peer, rank)] {
            if !self.channels.contains_key(&(a, kind, b)) {
                let g = &mut self.doc.gpus[a];
                let idx = g.channel_peers(kind).len();
                match g.channels.iter_mut().find(|c| c.kind == kind) {
                    Some(c) => c.connected_to.push(b),
                    None => g.channels.push(ChannelDecl {
                        kind,
                        connected_to: vec![b],
                        buffer: None,
                        rank_groups: Vec::new(),
                    }),
                }
                self.channels.insert((a, kind, b), idx);
            }
        }
        self.channels[&(rank, kind, peer)]
    }

    /// Block `block` of `rank`'s channel id of `kind` to `peer` (what ops' `channel_ids` name).
    pub fn channel(&mut self, rank: usize, block: usize, kind: ChannelKind, peer: usize) -> usize {
        let global = self.global_channel(rank, kind, peer);
        let tb = &mut self.doc.gpus[rank].threadblocks[block];
        let mut local = 0;
        for c in &tb.channels {
            if c.kind == kind {
                if let Some(i) = c.ids.iter().position(|&x| x == global) {
                    return local + i;
                }
                local += c.ids.len();
            }
        }
        match tb.channels.iter_mut().find(|c| c.kind == kind) {
            Some(c) => c.ids.push(global),
            None => tb.channels.push(TbRefs {
                kind,
                ids: vec![global],
            }),
        }
        local
    }

    /// A slice of `peer`'s buffer `buf` as block `block` of `rank` reaches it through `kind`.
    #[allow(clippy::too_many_arguments)]
    pub fn remote(
        &mut self,
        rank: usize,
        block: usize,
        kind: ChannelKind,
        peer: usize,
        buf: BufferKind,
        index: u64,
        size: u64,
    ) -> Slice {
        let g = &mut self.doc.gpus[rank];
        let rb = match g
            .remote_buffers
            .iter()
            .position(|b| b.rank == peer && b.kind == buf)
        {
            Some(i) => {
                if !g.remote_buffers[i].access.contains(&kind) {
                    g.remote_buffers[i].access.push(kind);
                }
                i
            }
            None => {
                g.remote_buffers.push(RemoteBufferDecl {
                    rank: peer,
                    kind: buf,
                    access: vec![kind],
                });
                g.remote_buffers.len() - 1
            }
        };
        let tb = &mut g.threadblocks[block];
        let mut slot = None;
        let mut local = 0;
        for r in &tb.remote_buffer_refs {
            if r.kind == kind {
                if let Some(i) = r.ids.iter().position(|&x| x == rb) {
                    slot = Some(local + i);
                    break;
                }
                local += r.ids.len();
            }
        }
        let slot = slot.unwrap_or_else(|| {
            match tb.remote_buffer_refs.iter_mut().find(|r| r.kind == kind) {
                Some(r) => r.ids.push(rb),
                None => tb.remote_buffer_refs.push(TbRefs {
                    kind,
                    ids: vec![rb],
                }),
            }
            local
        });
        Slice {
            target: Target::Remote(slot),
            index,
            size,
        }
    }

    /// Appends `op` to block `block` of `rank`.
    pub fn op(&mut self, rank: usize, block: usize, op: Op) {
        self.doc.gpus[rank].threadblocks[block].ops.push(op);
    }

    /// The plan.
    pub fn finish(self) -> PlanDoc {
        self.doc
    }
}

/// A slice of a local buffer.
pub fn local(buf: BufferKind, index: u64, size: u64) -> Slice {
    Slice {
        target: Target::Local(buf),
        index,
        size,
    }
}

/// An op moving data from `src` to `dst` over `channel` (if any).
pub fn data(kind: OpKind, src: Vec<Slice>, dst: Vec<Slice>, channel: Option<ChannelKind>) -> Op {
    Op {
        src,
        dst,
        channel_type: channel,
        ..Op::new(kind)
    }
}

/// A signal, wait, flush (or relaxed form) on channels `ids` of `kind`.
pub fn sync(kind: OpKind, channel: ChannelKind, ids: Vec<usize>) -> Op {
    Op {
        channel_ids: ids,
        channel_type: Some(channel),
        ..Op::new(kind)
    }
}

/// `op` with a reduction.
pub fn reducing(op: Op, r: ReduceKind) -> Op {
    Op {
        reduce: Some(r),
        ..op
    }
}

/// `op` as share `k` of `g` of a threadblock group.
pub fn shared(op: Op, k: u64, g: u64) -> Op {
    Op {
        tbg: Some(Tbg {
            tb_id: k,
            tbg_size: g,
        }),
        ..op
    }
}

/// The peers of `r` in a world of `n`, in order from `r + 1`.
fn peers(r: usize, n: usize) -> impl Iterator<Item = usize> + Clone {
    (1..n).map(move |k| (r + k) % n)
}

/// Signals then waits on `r`'s memory channels to every peer, in block `b`.
fn handshake(p: &mut PlanBuilder, r: usize, b: usize, n: usize, relaxed: bool) {
    let ids: Vec<usize> = peers(r, n)
        .map(|q| p.channel(r, b, ChannelKind::Memory, q))
        .collect();
    let (s, w) = if relaxed {
        (OpKind::RelaxedSignal, OpKind::RelaxedWait)
    } else {
        (OpKind::Signal, OpKind::Wait)
    };
    p.op(r, b, sync(s, ChannelKind::Memory, ids.clone()));
    p.op(r, b, sync(w, ChannelKind::Memory, ids));
}

/// All-reduce in place, one block per rank: rank `r` reads chunk `r` of every peer's input,
/// reduces it with its own and writes the result back to every peer (`rres`), between strong
/// handshakes; a relaxed handshake ends it. `op` is the reduction.
pub fn allreduce_read(n: usize, op: ReduceKind) -> PlanDoc {
    let nc = n as u64;
    let mut p = PlanBuilder::new(
        "allreduce_read",
        "allreduce",
        n,
        Protocol::Simple,
        true,
        [nc, nc, 0],
    );
    for r in 0..n {
        let b = p.block(r);
        handshake(&mut p, r, b, n, false);
        let ri = r as u64;
        let mut src = vec![local(BufferKind::Input, ri, 1)];
        let mut dst = vec![local(BufferKind::Input, ri, 1)];
        for q in peers(r, n) {
            src.push(p.remote(r, b, ChannelKind::Memory, q, BufferKind::Input, ri, 1));
            dst.push(p.remote(r, b, ChannelKind::Memory, q, BufferKind::Input, ri, 1));
        }
        p.op(r, b, Op::new(OpKind::Nop));
        p.op(
            r,
            b,
            reducing(
                data(OpKind::ReadReduceSend, src, dst, Some(ChannelKind::Memory)),
                op,
            ),
        );
        p.op(r, b, Op::new(OpKind::Nop));
        handshake(&mut p, r, b, n, false);
        handshake(&mut p, r, b, n, true);
    }
    p.finish()
}

/// All-reduce out of place, two blocks per rank sharing the data (a threadblock group): rank
/// `r` gets chunk `r` of every peer's input into its scratch, reduces it with its own into
/// its output, and puts the result into every peer's output; even ranks with `re` then `put`,
/// odd ones with `res`. Block 0 does the handshakes, barriers hand over to block 1.
pub fn allreduce_get(n: usize) -> PlanDoc {
    let nc = n as u64;
    let mut p = PlanBuilder::new(
        "allreduce_get",
        "allreduce",
        n,
        Protocol::Simple,
        false,
        [nc, nc, nc - 1],
    );
    let barrier = || Op {
        barrier_id: Some(0),
        num_threadblocks: Some(2),
        ..Op::new(OpKind::Barrier)
    };
    for r in 0..n {
        let ri = r as u64;
        let b0 = p.block(r);
        let b1 = p.block(r);
        handshake(&mut p, r, b0, n, false);
        for b in [b0, b1] {
            p.op(r, b, barrier());
            let mut gsrc = Vec::new();
            let mut gdst = Vec::new();
            for (k, q) in peers(r, n).enumerate() {
                gsrc.push(p.remote(r, b, ChannelKind::Memory, q, BufferKind::Input, ri, 1));
                gdst.push(local(BufferKind::Scratch, k as u64, 1));
            }
            let k = b as u64;
            p.op(
                r,
                b,
                shared(
                    data(OpKind::Get, gsrc, gdst, Some(ChannelKind::Memory)),
                    k,
                    2,
                ),
            );
            let mut rsrc = vec![local(BufferKind::Input, ri, 1)];
            rsrc.extend((0..nc - 1).map(|s| local(BufferKind::Scratch, s, 1)));
            let outs: Vec<Slice> = peers(r, n)
                .map(|q| p.remote(r, b, ChannelKind::Memory, q, BufferKind::Output, ri, 1))
                .collect();
            if r % 2 == 0 {
                let re = data(
                    OpKind::Reduce,
                    rsrc,
                    vec![local(BufferKind::Output, ri, 1)],
                    None,
                );
                p.op(r, b, shared(re, k, 2));
                let srcs = vec![local(BufferKind::Output, ri, 1); outs.len()];
                p.op(
                    r,
                    b,
                    shared(
                        data(OpKind::Put, srcs, outs, Some(ChannelKind::Memory)),
                        k,
                        2,
                    ),
                );
            } else {
                let mut dst = vec![local(BufferKind::Output, ri, 1)];
                dst.extend(outs);
                p.op(
                    r,
                    b,
                    shared(
                        data(OpKind::ReduceSend, rsrc, dst, Some(ChannelKind::Memory)),
                        k,
                        2,
                    ),
                );
            }
            p.op(r, b, barrier());
        }
        handshake(&mut p, r, b0, n, false);
    }
    p.finish()
}

/// All-reduce out of place through a pipeline: block 0 copies the input into the scratch in
/// units of `unit` bytes and releases a semaphore; block 1 acquires it, shakes hands, and in
/// units reduces chunk `r` of every rank's scratch into the outputs (`rres` on even ranks,
/// `rre` then `put` on odd ones).
pub fn allreduce_pipeline(n: usize, unit: u64) -> PlanDoc {
    let nc = n as u64;
    let mut p = PlanBuilder::new(
        "allreduce_pipeline",
        "allreduce",
        n,
        Protocol::Simple,
        false,
        [nc, nc, nc],
    );
    for r in 0..n {
        let ri = r as u64;
        let b0 = p.block(r);
        let b1 = p.block(r);
        let sem = p.semaphore(r, 0);
        let copy = data(
            OpKind::Copy,
            vec![local(BufferKind::Input, 0, nc)],
            vec![local(BufferKind::Scratch, 0, nc)],
            None,
        );
        p.op(r, b0, pipelined(unit, nc, vec![copy]));
        p.op(
            r,
            b0,
            Op {
                semaphore_ids: vec![sem],
                ..Op::new(OpKind::SemRelease)
            },
        );
        p.op(
            r,
            b1,
            Op {
                semaphore_ids: vec![sem],
                ..Op::new(OpKind::SemAcquire)
            },
        );
        handshake(&mut p, r, b1, n, false);
        let mut src = vec![local(BufferKind::Scratch, ri, 1)];
        let mut outs = Vec::new();
        for q in peers(r, n) {
            src.push(p.remote(r, b1, ChannelKind::Memory, q, BufferKind::Scratch, ri, 1));
            outs.push(p.remote(r, b1, ChannelKind::Memory, q, BufferKind::Output, ri, 1));
        }
        let mine = local(BufferKind::Output, ri, 1);
        let body = if r % 2 == 0 {
            let mut dst = vec![mine];
            dst.extend(outs);
            vec![data(
                OpKind::ReadReduceSend,
                src,
                dst,
                Some(ChannelKind::Memory),
            )]
        } else {
            let srcs = vec![mine; outs.len()];
            vec![
                data(
                    OpKind::ReadReduce,
                    src,
                    vec![mine],
                    Some(ChannelKind::Memory),
                ),
                data(OpKind::Put, srcs, outs, Some(ChannelKind::Memory)),
            ]
        };
        p.op(r, b1, pipelined(unit, 1, body));
        handshake(&mut p, r, b1, n, false);
    }
    p.finish()
}

fn pipelined(unit: u64, num_chunks: u64, ops: Vec<Op>) -> Op {
    Op {
        pipeline: Some(Pipeline {
            unit_size: unit,
            num_chunks,
            ops,
        }),
        ..Op::new(OpKind::Pipeline)
    }
}

/// All-gather out of place over port channels: every rank signals every peer that its launch
/// has started and waits for theirs; then it copies its input into its part of the output and
/// the proxy puts it into every peer's output (the `k`-th peer by `put` + `signal`, `pws` or
/// `pwsf` as `k % 3` says); then it flushes and waits for every peer.
pub fn allgather_port(n: usize) -> PlanDoc {
    let nc = n as u64;
    let mut p = PlanBuilder::new(
        "allgather_port",
        "allgather",
        n,
        Protocol::Simple,
        false,
        [1, nc, 0],
    );
    for r in 0..n {
        let ri = r as u64;
        let b = p.block(r);
        p.op(
            r,
            b,
            data(
                OpKind::Copy,
                vec![local(BufferKind::Input, 0, 1)],
                vec![local(BufferKind::Output, ri, 1)],
                None,
            ),
        );
        p.op(r, b, Op::new(OpKind::Nop));
        let all: Vec<usize> = peers(r, n)
            .map(|q| p.channel(r, b, ChannelKind::Port, q))
            .collect();
        p.op(r, b, sync(OpKind::Signal, ChannelKind::Port, all.clone()));
        p.op(r, b, sync(OpKind::Wait, ChannelKind::Port, all.clone()));
        for (k, q) in peers(r, n).enumerate() {
            let c = all[k];
            let dst = p.remote(r, b, ChannelKind::Port, q, BufferKind::Output, ri, 1);
            let kind = [
                OpKind::Put,
                OpKind::PutWithSignal,
                OpKind::PutWithSignalAndFlush,
            ][k % 3];
            let put = Op {
                channel_ids: vec![c],
                ..data(
                    kind,
                    vec![local(BufferKind::Output, ri, 1)],
                    vec![dst],
                    Some(ChannelKind::Port),
                )
            };
            p.op(r, b, put);
            if kind == OpKind::Put {
                p.op(r, b, sync(OpKind::Signal, ChannelKind::Port, vec![c]));
            }
        }
        p.op(r, b, sync(OpKind::Flush, ChannelKind::Port, all.clone()));
        p.op(r, b, sync(OpKind::Wait, ChannelKind::Port, all));
    }
    p.finish()
}

/// All-reduce in place with LL packets (double scratch): block 0 sends chunk `q` of the input
/// to peer `q` as packets; block 1 reduces chunk `r` with the packets that came and sends the
/// result back as packets, by one of four routes (`(r + rotation) % 4`: `recspkt`; `respkt`;
/// `repkt` then `ppkt`; `recpkt` then `rppkt`); block 2 unpacks the results.
pub fn allreduce_packets(n: usize, rotation: usize) -> PlanDoc {
    let nc = n as u64;
    let mut p = PlanBuilder::new(
        "allreduce_packets",
        "allreduce",
        n,
        Protocol::Ll,
        true,
        [nc, nc, 2 * nc],
    )
    .double_scratch();
    let mem = Some(ChannelKind::Memory);
    for r in 0..n {
        let ri = r as u64;
        let (b0, b1, b2) = (p.block(r), p.block(r), p.block(r));
        // Block 0: chunk q to peer q's slot r.
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for q in peers(r, n) {
            src.push(local(BufferKind::Input, q as u64, 1));
            dst.push(p.remote(r, b0, ChannelKind::Memory, q, BufferKind::Scratch, ri, 1));
        }
        p.op(r, b0, data(OpKind::PutPackets, src, dst, mem));
        // Block 1: reduce chunk r with the packets in slots q, results to peers' slot n + r.
        let mut src = vec![local(BufferKind::Input, ri, 1)];
        src.extend(peers(r, n).map(|q| local(BufferKind::Scratch, q as u64, 1)));
        let results: Vec<Slice> = peers(r, n)
            .map(|q| {
                p.remote(
                    r,
                    b1,
                    ChannelKind::Memory,
                    q,
                    BufferKind::Scratch,
                    nc + ri,
                    1,
                )
            })
            .collect();
        let mine = local(BufferKind::Input, ri, 1);
        let copy_slot = local(BufferKind::Scratch, ri, 1);
        match (r + rotation) % 4 {
            0 => {
                let mut dst = vec![mine, copy_slot];
                dst.extend(results);
                p.op(r, b1, data(OpKind::ReduceCopySendPackets, src, dst, mem));
            }
            1 => {
                let mut dst = vec![mine];
                dst.extend(results);
                p.op(r, b1, data(OpKind::ReduceSendPackets, src, dst, mem));
            }
            2 => {
                p.op(r, b1, data(OpKind::ReducePackets, src, vec![mine], None));
                p.op(r, b1, Op::new(OpKind::Nop));
                let srcs = vec![mine; results.len()];
                p.op(r, b1, data(OpKind::PutPackets, srcs, results, mem));
            }
            _ => {
                p.op(
                    r,
                    b1,
                    data(OpKind::ReduceCopyPackets, src, vec![mine, copy_slot], None),
                );
                p.op(r, b1, Op::new(OpKind::Nop));
                p.op(
                    r,
                    b1,
                    data(OpKind::ReadPutPackets, vec![copy_slot], results, mem),
                );
            }
        }
        // Block 2: unpack peer q's result into chunk q.
        for q in peers(r, n) {
            let qi = q as u64;
            p.op(
                r,
                b2,
                data(
                    OpKind::UnpackPackets,
                    vec![local(BufferKind::Scratch, nc + qi, 1)],
                    vec![local(BufferKind::Input, qi, 1)],
                    None,
                ),
            );
        }
    }
    p.finish()
}

/// All-gather out of place with LL packets (double scratch): block 0 turns the input into
/// packets in slot `r` of the scratch (`cpkt`) and copies it into the output; the `k`-th peer
/// gets them by `rppkt` over a memory channel (block 1; `k % 3 == 1`), by `ppkt` of the
/// packets over a port channel (block 0; `k % 3 == 2`) or by `rppkt` over a port channel
/// (block 1; `k % 3 == 0`); block 2 unpacks every peer's slot into the output.
pub fn allgather_packets(n: usize) -> PlanDoc {
    let nc = n as u64;
    let mut p = PlanBuilder::new(
        "allgather_packets",
        "allgather",
        n,
        Protocol::Ll,
        false,
        [1, nc, nc],
    )
    .double_scratch();
    for r in 0..n {
        let ri = r as u64;
        let (b0, b1, b2) = (p.block(r), p.block(r), p.block(r));
        let slot = local(BufferKind::Scratch, ri, 1);
        p.op(
            r,
            b0,
            data(
                OpKind::CopyPackets,
                vec![local(BufferKind::Input, 0, 1)],
                vec![slot],
                None,
            ),
        );
        p.op(
            r,
            b0,
            data(
                OpKind::Copy,
                vec![local(BufferKind::Input, 0, 1)],
                vec![local(BufferKind::Output, ri, 1)],
                None,
            ),
        );
        p.op(r, b0, Op::new(OpKind::Nop));
        for (k, q) in peers(r, n).enumerate() {
            let k = k + 1;
            let (b, kind, op) = match k % 3 {
                1 => (b1, ChannelKind::Memory, OpKind::ReadPutPackets),
                2 => (b0, ChannelKind::Port, OpKind::PutPackets),
                _ => (b1, ChannelKind::Port, OpKind::ReadPutPackets),
            };
            let dst = p.remote(r, b, kind, q, BufferKind::Scratch, ri, 1);
            let ids = if kind == ChannelKind::Port {
                vec![p.channel(r, b, kind, q)]
            } else {
                Vec::new()
            };
            p.op(
                r,
                b,
                Op {
                    channel_ids: ids,
                    ..data(op, vec![slot], vec![dst], Some(kind))
                },
            );
        }
        for q in peers(r, n) {
            let qi = q as u64;
            p.op(
                r,
                b2,
                data(
                    OpKind::UnpackPackets,
                    vec![local(BufferKind::Scratch, qi, 1)],
                    vec![local(BufferKind::Output, qi, 1)],
                    None,
                ),
            );
        }
    }
    p.finish()
}

/// A copy on one rank (an all-gather of one rank, out of place): `blocks` blocks each copy
/// their share of the input into the output. The interpreter's cost against a plain copy
/// kernel (`mscclpp-bench allgather -g 1 --outofplace --plan FILE --baseline copy-kernel`).
pub fn copy(blocks: usize) -> PlanDoc {
    let nb = blocks as u64;
    let mut p = PlanBuilder::new("copy", "allgather", 1, Protocol::Simple, false, [nb, nb, 0]);
    for k in 0..nb {
        let b = p.block(0);
        p.op(
            0,
            b,
            data(
                OpKind::Copy,
                vec![local(BufferKind::Input, k, 1)],
                vec![local(BufferKind::Output, k, 1)],
                None,
            ),
        );
    }
    p.finish()
}

/// Every plan of this module at `n` ranks, by name (pipelines in units of `unit` bytes).
pub fn all(n: usize, unit: u64) -> Vec<PlanDoc> {
    vec![
        allreduce_read(n, ReduceKind::Sum),
        allreduce_get(n),
        allreduce_pipeline(n, unit),
        allgather_port(n),
        allreduce_packets(n, 0),
        allgather_packets(n),
    ]
}
