//! The dispatcher: [`Engine`], every algorithm's state and the context they share, which turns
//! a [`Call`] into what it runs. [`Engine::record`] checks and lowers a call once (its checks:
//! `Call::check`; its operator as the kernels take it; where its buffers lie in this rank's
//! registrations); [`Engine::run`] executes the plan of a lowered call (`plan::drive`: the
//! planner decides, this only queues), as one `call` span of the trace; [`Engine::end`] queues
//! what a group recorded (the calls made of sends and receives are groups of one batch).
//!
//! What a group runs, in this order: its collectives, in the order they were recorded (each
//! as the same call made alone would run; a gather, scatter or all-to-all-v as a batch of its
//! own, so that its messages never pair with the group's sends and receives); then every send
//! and receive of the group in one batch of the point-to-point engine (`algo/p2p.rs`), where
//! they all progress together. A group whose sends to this rank itself and receives from it
//! do not pair up (`Error::SelfMismatch`) is refused before anything of it is queued.
//!
//! Across nodes (a world of several nodes has no MemoryChannels to every peer, so no
//! point-to-point engine): a batch (a gather, scatter or all-to-all-v, a group's sends and
//! receives) runs as lone sends and receives over the PortChannels, one after the other on the
//! call's stream, distance by distance (`Engine::queue_across_nodes`, [`sends_first`]), so they
//! pair up in the same order on both sides and no ranks wait for each other in a cycle.
//!
//! Traced (`MSCCLPP_TRACE`), each call is one `call` span named after the public call (op,
//! bytes, type, operator, root or peers, algorithm, stream, call id), whose id every launch it
//! makes carries; a group's `end` is one span (`group`, `gather`, `scatter`, `all_to_allv`)
//! with its collectives' spans nested inside.

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_host::trace::{Category, Span};
use mscclpp_shared::{DataType, DevicePtr, MAX_DIRECT_RANKS};

use super::algo::p2p::{self, Dir, P2p, Transfer};
use super::algorithm::{Algorithm, Collective};
use super::call::Call;
use super::context::{
    Args, CallRegs, CallScope, Context, GateScope, Lowered, Peer, copy_if_needed,
};
use super::order::IssueOrder;
use super::plan::{self, Action, Now};
use super::reduction::{KernelOp, Reduction};
use super::unit::{Queue, Queued};

/// Every algorithm's state and their context (module docs).
pub(crate) struct Engine {
    /// Every algorithm's state, indexed by [`Algorithm`] (dropped first: streams, events).
    units: Vec<Box<dyn Queue>>,
    /// The issue order of the calls across streams (`order.rs`).
    pub order: IssueOrder,
    /// What they share.
    pub cx: Context,
}

impl Drop for Engine {
    /// Lets every algorithm tear down (the point-to-point engine waits, bounded, for the
    /// acknowledgements its last sends are owed) before the context's memory is freed.
    fn drop(&mut self) {
        for u in &self.units {
            u.tear_down(&self.cx);
        }
    }
}

/// A call as a group records it ([`Engine::record`]).
pub(crate) enum Recorded {
    /// One that the dispatcher plans (forced to an algorithm or not).
    Call(Args, Option<Algorithm>),
    /// One made of sends and receives (gather, scatter, all-to-all-v): a batch of its own.
    Batch(Vec<Transfer>),
    /// Sends and receives of a group, which run with the group's others.
    Transfers(Vec<Transfer>),
}

/// What forcing an algorithm on a call made of sends and receives is refused as.
const FORCED_P2P: &str = "forcing an algorithm on gather, scatter, all_to_allv or a group's \
     sends and receives (the point-to-point engine runs them)";

/// What the point-to-point engine refuses on a world of several nodes (its batches run as lone
/// port exchanges there instead: [`Engine::queue_across_nodes`]).
pub(crate) const P2P_ACROSS_NODES: &str = "the point-to-point engine on a world of several nodes \
    (it needs MemoryChannels to every peer)";

impl Engine {
    /// The engine of `units` (in [`Algorithm`] order) over `cx`.
    pub fn new(units: Vec<Box<dyn Queue>>, cx: Context) -> Result<Self> {
        Ok(Self {
            units,
            order: IssueOrder::new(cx.comm.gpu())?,
            cx,
        })
    }

    /// Checks `call` (`Call::check`, inside a group or not) and lowers it: what a group
    /// records, or what [`queue`](Self::queue) runs.
    pub fn record(
        &self,
        call: &Call,
        forced: Option<Algorithm>,
        in_group: bool,
    ) -> Result<Recorded> {
        self.lower_call(call, forced, in_group, true)
    }

    /// Checks `call` as [`record`](Self::record) does, without looking its buffers up in the
    /// registrations (what only running it needs): `Collectives::check`, which every call of
    /// the drop-in makes before it queues or records the call.
    pub fn check(&self, call: &Call) -> Result<()> {
        self.lower_call(call, None, true, false).map(drop)
    }

    /// [`record`](Self::record), the registrations looked up when `registrations`.
    fn lower_call(
        &self,
        call: &Call,
        forced: Option<Algorithm>,
        in_group: bool,
        registrations: bool,
    ) -> Result<Recorded> {
        let cx = &self.cx;
        cx.refuse_revoked(call.name())?;
        let (me, n) = (cx.rank(), cx.ranks());
        let b = call.check(me, n, in_group)?;
        if let Some(batch) = p2p::batch_of(call, me, n, b) {
            if forced.is_some() {
                return Err(cx.cannot(FORCED_P2P));
            }
            return Ok(Recorded::Batch(batch));
        }
        use Collective as C;
        let (collective, one_way, peer) = match *call {
            Call::AllReduce { .. } => (C::AllReduce, false, Peer::None),
            Call::AllGather { .. } => (C::AllGather, false, Peer::None),
            Call::ReduceScatter { .. } => (C::ReduceScatter, false, Peer::None),
            Call::Broadcast { root, .. } => (C::Broadcast, false, Peer::Root(root)),
            Call::Reduce { root, .. } => (C::Reduce, false, Peer::Root(root)),
            Call::AllToAll { .. } => (C::AllToAll, false, Peer::None),
            Call::Send { peer, .. } => (C::SendRecv, true, Peer::To(peer)),
            Call::Recv { peer, .. } => (C::SendRecv, true, Peer::From(peer)),
            Call::SendRecv { next, prev, .. } => (C::SendRecv, false, Peer::Pair { next, prev }),
            Call::Gather { .. } | Call::Scatter { .. } | Call::AllToAllv { .. } => {
                return Err(cx.cannot(FORCED_P2P));
            }
        };
        let ((input, output), dtype) = (call.buffers(), call.dtype());
        if in_group && collective == C::SendRecv {
            if forced.is_some() {
                return Err(cx.cannot(FORCED_P2P));
            }
            let t = |dir, peer, buf| Transfer {
                dir,
                peer,
                buf,
                bytes: b,
            };
            return Ok(Recorded::Transfers(match peer {
                Peer::To(q) => vec![t(Dir::Send, q, input)],
                Peer::From(q) => vec![t(Dir::Recv, q, output)],
                Peer::Pair { next, prev } => {
                    vec![t(Dir::Send, next, input), t(Dir::Recv, prev, output)]
                }
                Peer::None | Peer::Root(_) => Vec::new(),
            }));
        }
        let op = match call.op() {
            Some(op) => self.lower(op, dtype)?,
            None => Context::MOVE.1,
        };
        let lowered = Lowered {
            one_way,
            ..self.lowered(collective, b, dtype, op)
        };
        let mut args = Args {
            call: lowered,
            input,
            output,
            peer,
            reg: None,
        };
        if registrations {
            args.reg = self.registered_call(&args);
        }
        Ok(Recorded::Call(args, forced))
    }

    /// Queues `call` (module docs), `forced` to an algorithm or not.
    ///
    /// # Safety
    /// The public call's contract: its buffers hold what it moves until the work queued on
    /// `stream` completes; every rank makes the same call.
    pub unsafe fn queue(
        &self,
        call: &Call,
        forced: Option<Algorithm>,
        stream: &Stream,
    ) -> Result<()> {
        match self.record(call, forced, false)? {
            Recorded::Call(args, forced) => {
                let capturing = stream.is_capturing()?;
                // SAFETY: the caller's contract.
                self.order.run(stream, capturing, || unsafe {
                    self.run(args, forced, stream, capturing)
                })
            }
            batch => self.end(call.name(), call.root(), vec![batch], Vec::new(), stream),
        }
    }

    /// `op` on `dtype` as the kernels take it ([`Reduction::lower`]).
    fn lower(&self, op: Reduction, dtype: DataType) -> Result<KernelOp> {
        op.lower(dtype, self.cx.ranks(), self.cx.comm.gpu().ordinal())
    }

    /// A call of `bytes` (per part) of `collective` on this world, as the planner sees it.
    fn lowered(
        &self,
        collective: Collective,
        bytes: usize,
        dtype: DataType,
        op: KernelOp,
    ) -> Lowered {
        let topology = self.cx.comm.topology();
        Lowered {
            collective,
            one_way: false,
            bytes,
            ranks: self.cx.ranks(),
            nodes: topology.nodes(),
            uniform: topology.uniform().is_ok(),
            dtype,
            op,
        }
    }

    /// Where the buffers the peers access lie in this rank's registrations, if every one does
    /// (`registry.rs`, "On a call").
    fn registered_call(&self, a: &Args) -> Option<CallRegs> {
        let (n, b) = (self.cx.ranks(), a.call.bytes);
        if b == 0 || !(2..=MAX_DIRECT_RANKS).contains(&n) || self.cx.multi.is_some() {
            return None;
        }
        // Point-to-point calls run on the p2p engine through the scratch (no peer buffers to
        // learn); a reduce's non-roots may pass no output, so it keeps the per-call exchange.
        let (input, output) = match (a.call.collective, a.peer) {
            (_, Peer::To(_) | Peer::From(_) | Peer::Pair { .. }) => return None,
            (Collective::AllReduce, _) => (Some(b), Some(b)),
            (Collective::AllGather | Collective::AllToAll, _) => (None, Some(n * b)),
            (Collective::ReduceScatter, _) => (Some(n * b), None),
            (Collective::Broadcast, _) => (None, Some(b)),
            (Collective::Reduce | Collective::SendRecv, _) => return None,
        };
        // Both buffers under one lock of the registry (none while nothing is registered).
        let (i, o) = self.cx.registry.with_lookup(|lookup| {
            let find = |p: DevicePtr<u8>, len: Option<usize>| match len {
                None => Some(None),
                Some(len) => lookup(p, len).map(Some),
            };
            Some((find(a.input, input)?, find(a.output, output)?))
        })?;
        Some(CallRegs {
            input: i.map(|x| x.0),
            output: o.map(|x| x.0),
            windows: i.is_none_or(|x| x.1) && o.is_none_or(|x| x.1),
        })
    }

    /// Queues one lowered call ([`dispatch`](Self::dispatch)), as one `call` span of the trace
    /// (op, bytes, type, operator, algorithm, stream, call id: [`call_span`](Self::call_span))
    /// whose id every launch it makes carries.
    ///
    /// # Safety
    /// The public call's contract for `args`.
    unsafe fn run(
        &self,
        args: Args,
        forced: Option<Algorithm>,
        stream: &Stream,
        capturing: bool,
    ) -> Result<()> {
        let Some((mut span, _scope)) = self.call_span(op_name(&args), stream) else {
            // SAFETY: the caller's contract.
            return unsafe { self.dispatch(args, forced, stream, capturing) };
        };
        let call = &args.call;
        span.set("bytes", call.bytes);
        span.set("dtype", format!("{:?}", call.dtype));
        span.set("op", format!("{:?}", call.op.op));
        match args.peer {
            Peer::Root(r) => span.set("root", r),
            Peer::To(r) | Peer::From(r) => span.set("peer", r),
            Peer::Pair { next, prev } => {
                span.set("next", next);
                span.set("prev", prev);
            }
            Peer::None => {}
        }
        // SAFETY: the caller's contract.
        let result = unsafe { self.dispatch(args, forced, stream, capturing) };
        end_call(&mut span, &result, self.cx.last());
        result
    }

    /// The `call` span of one public call named `name` (call id, ranks, stream; the caller adds
    /// the rest, `bytes` first), with the scope that ties every launch queued while it lives to
    /// the call's id; `None` when tracing is off (one flag check, nothing recorded). The span
    /// is recorded when dropped, after [`end_call`] adds the outcome.
    fn call_span(&self, name: &'static str, stream: &Stream) -> Option<(Span<'_>, CallScope)> {
        let trace = self.cx.comm.trace();
        if !trace.is_on() {
            return None;
        }
        let id = trace.next_call();
        let scope = CallScope::enter(id);
        let span = trace
            .span(Category::Call, name)
            .arg("call", id)
            .arg("ranks", self.cx.ranks())
            .arg(
                "stream",
                stream.cuda_raw().unwrap_or(stream as *const Stream as u64),
            );
        Some((span, scope))
    }

    /// Executes the plan of `args` (`plan::drive`: the planner decides; this copies, or has
    /// the step's algorithm queue the call).
    ///
    /// # Safety
    /// The public call's contract for `args`.
    unsafe fn dispatch(
        &self,
        args: Args,
        forced: Option<Algorithm>,
        stream: &Stream,
        capturing: bool,
    ) -> Result<()> {
        let cx = &self.cx;
        let now = Now {
            capturing,
            ..Now::EAGER
        };
        let mut exec = |a: Action<'_>| match a {
            Action::Copy => {
                // SAFETY: the caller's contract (both buffers hold the call's bytes).
                unsafe { copy_if_needed(stream, args.output, args.input, args.call.bytes) }?;
                Ok(Queued::Ran)
            }
            Action::Run(step, gate) => {
                let _gate = GateScope::enter(gate);
                self.units[step.algorithm as usize].queue(cx, &args, step, stream)
            }
        };
        plan::drive(&cx.cfg, &cx.layout, &args, forced, now, &mut exec, &|w| {
            cx.cannot(w)
        })
    }

    /// Ends a group (module docs): queues `recorded` in order (whose sends and receives a group
    /// keeps in `transfers`, not here), then `transfers` together, on
    /// `stream`, as the public call `name` (`group`, or the call made of one batch, with its
    /// `root`), traced as one `call` span: bytes this rank sends (`recv_bytes`: receives),
    /// distinct `peers`, the root, `collectives` recorded, algorithm `p2p` when a batch was
    /// queued (`port` across nodes), or the error.
    pub fn end(
        &self,
        name: &'static str,
        root: Option<usize>,
        recorded: Vec<Recorded>,
        transfers: Vec<Transfer>,
        stream: &Stream,
    ) -> Result<()> {
        self.cx.refuse_revoked(name)?;
        let capturing = stream.is_capturing()?;
        self.order.run(stream, capturing, || {
            self.end_in_order(name, root, recorded, transfers, stream, capturing)
        })
    }

    /// [`end`](Self::end), in issue order.
    fn end_in_order(
        &self,
        name: &'static str,
        root: Option<usize>,
        recorded: Vec<Recorded>,
        transfers: Vec<Transfer>,
        stream: &Stream,
        capturing: bool,
    ) -> Result<()> {
        let Some((mut span, _scope)) = self.call_span(name, stream) else {
            return self.queue_group(recorded, transfers, stream, capturing);
        };
        let batches = recorded.iter().filter_map(|c| match c {
            Recorded::Batch(b) | Recorded::Transfers(b) => Some(b.as_slice()),
            Recorded::Call(..) => None,
        });
        let all: Vec<&Transfer> = batches.chain([transfers.as_slice()]).flatten().collect();
        let total =
            |dir: Dir| -> usize { all.iter().filter(|t| t.dir == dir).map(|t| t.bytes).sum() };
        span.set("bytes", total(Dir::Send));
        span.set("recv_bytes", total(Dir::Recv));
        let mut peers: Vec<usize> = all.iter().map(|t| t.peer).collect();
        peers.sort_unstable();
        peers.dedup();
        span.set("peers", peers.len());
        if let Some(r) = root {
            span.set("root", r);
        }
        let calls = recorded
            .iter()
            .filter(|c| matches!(c, Recorded::Call(..)))
            .count();
        span.set("collectives", calls);
        let batched = !all.is_empty();
        let result = self.queue_group(recorded, transfers, stream, capturing);
        // Across nodes a batch runs as lone port calls (each its own span inside this one).
        let engine = match self.cx.multi {
            Some(_) => Algorithm::Port,
            None => Algorithm::P2p,
        };
        end_call(&mut span, &result, batched.then_some(engine));
        result
    }

    /// Queues what a group recorded ([`end`](Self::end)).
    fn queue_group(
        &self,
        recorded: Vec<Recorded>,
        transfers: Vec<Transfer>,
        stream: &Stream,
        capturing: bool,
    ) -> Result<()> {
        let cx = &self.cx;
        // Every self-pairing checked before anything is queued.
        let me = cx.rank();
        p2p::self_pairs(me, &transfers)?;
        for c in &recorded {
            if let Recorded::Batch(b) | Recorded::Transfers(b) = c {
                p2p::self_pairs(me, b)?;
            }
        }
        for c in recorded {
            match c {
                // SAFETY: each was recorded under its call's contract, which lasts until the
                // work queued here completes.
                Recorded::Call(args, forced) => {
                    unsafe { self.run(args, forced, stream, capturing) }?
                }
                // A group keeps `Transfers` with its `transfers`.
                Recorded::Batch(b) | Recorded::Transfers(b) => {
                    self.queue_batch(&b, stream, capturing)?
                }
            }
        }
        if transfers.is_empty() {
            return Ok(());
        }
        self.queue_batch(&transfers, stream, capturing)
    }

    /// Queues one batch of sends and receives: on the point-to-point engine, or on a world of
    /// several nodes as lone port exchanges ([`queue_across_nodes`](Self::queue_across_nodes)).
    fn queue_batch(&self, batch: &[Transfer], stream: &Stream, capturing: bool) -> Result<()> {
        if self.cx.multi.is_some() {
            return self.queue_across_nodes(batch, stream, capturing);
        }
        self.p2p()?.queue_batch(&self.cx, batch, stream)
    }

    /// A batch on a world of several nodes (module docs, "Across nodes"): its transfers to this
    /// rank itself as copies, then, distance `s` by distance (1 to `n - 1`), its sends to rank
    /// `me + s` and its receives from rank `me - s`, in their order, each a lone send or
    /// receive over the PortChannels; at each distance, the sends first or the receives first by
    /// [`sends_first`], so that no cycle of ranks waits for each other.
    fn queue_across_nodes(
        &self,
        batch: &[Transfer],
        stream: &Stream,
        capturing: bool,
    ) -> Result<()> {
        let cx = &self.cx;
        let (me, n) = (cx.rank(), cx.ranks());
        for (dst, src, bytes) in p2p::self_pairs(me, batch)? {
            // SAFETY: the batch's call's contract: both buffers hold `bytes` until the queued
            // work completes.
            unsafe { copy_if_needed(stream, dst, src, bytes) }?;
        }
        for s in 1..n {
            let (to, from) = ((me + s) % n, (me + n - s) % n);
            let sends = batch.iter().filter(|t| t.dir == Dir::Send && t.peer == to);
            let recvs = batch
                .iter()
                .filter(|t| t.dir == Dir::Recv && t.peer == from);
            let ordered: Vec<&Transfer> = if sends_first(me, n, s) {
                sends.chain(recvs).collect()
            } else {
                recvs.chain(sends).collect()
            };
            for t in ordered {
                let (input, output, peer) = match t.dir {
                    Dir::Send => (t.buf, DevicePtr::NULL, Peer::To(t.peer)),
                    Dir::Recv => (DevicePtr::NULL, t.buf, Peer::From(t.peer)),
                };
                let lowered = Lowered {
                    one_way: true,
                    ..self.lowered(Collective::SendRecv, t.bytes, DataType::U8, Context::MOVE.1)
                };
                // Lone point-to-point calls never take registered buffers.
                let args = Args {
                    call: lowered,
                    input,
                    output,
                    peer,
                    reg: None,
                };
                // SAFETY: the batch's call's contract for its buffers; every rank runs its
                // batch in this order, so each lone send meets the peer's lone receive.
                unsafe { self.run(args, None, stream, capturing) }?;
            }
        }
        Ok(())
    }

    /// The point-to-point engine (a world of one node only: it needs MemoryChannels to every
    /// peer).
    fn p2p(&self) -> Result<&P2p> {
        if self.cx.multi.is_some() {
            return Err(self.cx.cannot(P2P_ACROSS_NODES));
        }
        self.units[Algorithm::P2p as usize]
            .as_any()
            .downcast_ref::<P2p>()
            .ok_or_else(|| {
                self.cx
                    .cannot("a point-to-point engine registered elsewhere")
            })
    }
}

/// Adds a call's outcome to its `call` span ([`Engine::call_span`]): the algorithm that
/// queued it, or the error.
fn end_call(span: &mut Span<'_>, result: &Result<()>, algorithm: Option<Algorithm>) {
    match (result, algorithm) {
        (Ok(()), Some(a)) => span.set("algorithm", a.name()),
        (Ok(()), None) => {}
        (Err(e), _) => span.set("error", e.to_string()),
    }
}

/// A call's name in the trace: the public function's.
fn op_name(args: &Args) -> &'static str {
    match (args.call.collective, args.peer) {
        (Collective::AllReduce, _) => "all_reduce",
        (Collective::AllGather, _) => "all_gather",
        (Collective::ReduceScatter, _) => "reduce_scatter",
        (Collective::Broadcast, _) => "broadcast",
        (Collective::AllToAll, _) => "all_to_all",
        (Collective::Reduce, _) => "reduce",
        (Collective::SendRecv, Peer::To(_)) => "send",
        (Collective::SendRecv, Peer::From(_)) => "recv",
        (Collective::SendRecv, _) => "send_recv",
    }
}

/// Whether rank `me` of `n` runs its sends to `me + s` before its receives from `me - s` at
/// distance `s` ([`Engine::queue_across_nodes`]). The ranks form cycles under `x -> x + s`
/// (`gcd(n, s)` of them, each of `n / gcd(n, s)` ranks); along a cycle, the ranks at even
/// positions send first and those at odd positions receive first, and the last rank of a
/// cycle of odd length receives first too: every rank that sends first sends to one that
/// receives first, so the waits form no cycle even when a send waits for its receiver.
pub(crate) fn sends_first(me: usize, n: usize, s: usize) -> bool {
    let (mut a, mut b) = (n, s % n);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let (g, len) = (a.max(1), n / a.max(1));
    let start = me % g;
    let mut at = start;
    let mut k = 0;
    while at != me && k < n {
        at = (at + s) % n;
        k += 1;
    }
    k % 2 == 0 && k + 1 != len
}

#[cfg(test)]
mod tests {
    use super::sends_first;

    /// At every distance of every world size, a rank that sends first sends to one that
    /// receives first (what makes the order free of cycles), and some rank sends first.
    #[test]
    fn a_rank_that_sends_first_sends_to_one_that_receives_first() {
        for n in 2..=17 {
            for s in 1..n {
                for a in 0..n {
                    if sends_first(a, n, s) {
                        assert!(!sends_first((a + s) % n, n, s), "n {n}, s {s}, rank {a}");
                    }
                }
                assert!((0..n).any(|a| sends_first(a, n, s)), "n {n}, s {s}");
            }
        }
    }
}
