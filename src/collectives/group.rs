//! Groups (NCCL's `ncclGroupStart` … `ncclGroupEnd`) and the collectives made of sends and
//! receives: [`Collectives::group`] returns a [`Group`] that records collectives and
//! point-to-point operations; [`Group::end`] queues them all on one stream. `gather`,
//! `scatter` and `all_to_allv` are groups of one call each.
//!
//! What a group runs, in this order: its collectives, in the order they were recorded (each
//! as the same call made alone would run; a gather, scatter or all-to-all-v as a batch of its
//! own, so that its messages never pair with the group's sends and receives); then every send
//! and receive of the group in one batch of the point-to-point engine (`algo/p2p.rs`), where
//! they all progress together: a group may send to and receive from any peers in any order (a
//! ring, all pairs, this rank itself) without deadlock, which is what a group is for. As in
//! NCCL, the operations of one group must not depend on each other's data.
//!
//! Every rank records the same collectives in the same order (as with NCCL); sends and
//! receives pair up between two ranks in the order each rank recorded them (the k-th send from
//! `a` to `b` with the k-th receive at `b` from `a`), whatever group or call each was made in,
//! with equal byte counts (a receive of another count gets `Error::CountMismatch`, found by
//! the receiving kernel; on this rank itself, `Error::SelfMismatch`, found here). Zero counts
//! are messages too: they pair like any other and move nothing.
//!
//! Traced (`MSCCLPP_TRACE`), each `end` is one `call` span named after the public call
//! (`group`, `gather`, `scatter`, `all_to_allv`) whose id the point-to-point engine's launches
//! carry; a group's collectives are `call` spans of their own inside it.

use mscclpp_host::gpu::Stream;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{DataType, DevicePtr};

use super::algo::p2p::{self, Dir, Transfer};
use super::context::{Args, Peer};
use super::reduction::Reduction;
use super::{Algorithm, Collective, Collectives};

/// Collectives and point-to-point operations recorded together and queued by [`end`]
/// (NCCL's group: module docs). Record with its methods, which check their arguments at once;
/// nothing is queued before `end`. A group dropped without `end` queues nothing.
///
/// [`end`]: Group::end
#[must_use = "a group queues nothing until `end`"]
pub struct Group<'c> {
    c: &'c Collectives,
    collectives: Vec<Recorded>,
    transfers: Vec<Transfer>,
}

/// A collective of a group.
enum Recorded {
    /// One that the dispatch queues (forced to an algorithm or not).
    Call(Args, Option<Algorithm>),
    /// One made of sends and receives (gather, scatter, all-to-all-v): a batch of its own.
    Batch(Vec<Transfer>),
}

impl Collectives {
    /// Starts a group (NCCL's `ncclGroupStart`; its end is [`Group::end`]).
    pub fn group(&self) -> Group<'_> {
        Group {
            c: self,
            collectives: Vec::new(),
            transfers: Vec::new(),
        }
    }

    /// Gather to `root` (NCCL's `ncclGather`): every rank's `count` elements of `input` land
    /// at `output[rank * count ..]` on the root. Other ranks' `output` is not touched and may
    /// be null; in place on the root when `input` is `output + root * count`.
    ///
    /// # Safety
    /// `input` holds `count` elements, the root's `output` `nranks * count`; both valid until
    /// the queued work completes; every rank makes the same call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let mut g = self.group();
        // SAFETY: the caller's contract.
        unsafe { g.gather(input, output, count, dtype, root) }?;
        g.end_as("gather", Some(root), stream)
    }

    /// Scatter from `root` (NCCL's `ncclScatter`): part `r` (`count` elements at
    /// `input[r * count ..]`) of the root's input lands in rank `r`'s `output`. Other ranks'
    /// `input` is not read and may be null; in place on the root when `output` is
    /// `input + root * count`.
    ///
    /// # Safety
    /// The root's `input` holds `nranks * count` elements, every `output` `count`; valid until
    /// the queued work completes; every rank makes the same call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scatter(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let mut g = self.group();
        // SAFETY: the caller's contract.
        unsafe { g.scatter(input, output, count, dtype, root) }?;
        g.end_as("scatter", Some(root), stream)
    }

    /// All-to-all with a count and a displacement per peer (PyTorch's `all_to_all_single`
    /// with splits, MPI's `Alltoallv`): `send_counts[q]` elements at
    /// `input[send_displs[q] ..]` go to rank `q`, which receives them at
    /// `output[recv_displs[r] ..]` (`recv_counts[r]` elements, equal to what `r` sends it,
    /// else the receiving rank gets `Error::CountMismatch`). Counts and displacements are in
    /// elements, one per rank; zero counts are allowed.
    ///
    /// # Safety
    /// Every range named by the counts and displacements lies inside `input` / `output`, the
    /// receive ranges do not overlap each other or the send ranges, and all stay valid until
    /// the queued work completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv(
        &self,
        input: DevicePtr<u8>,
        send_counts: &[usize],
        send_displs: &[usize],
        output: DevicePtr<u8>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        let mut g = self.group();
        // SAFETY: the caller's contract.
        unsafe {
            g.all_to_allv(
                input,
                send_counts,
                send_displs,
                output,
                recv_counts,
                recv_displs,
                dtype,
            )
        }?;
        g.end_as("all_to_allv", None, stream)
    }
}

impl Group<'_> {
    /// Records a send of `count` elements of `input` to `peer` (this rank itself included: it
    /// pairs with a receive from itself in the same group).
    ///
    /// # Safety
    /// `input` holds `count` elements until the work queued by [`end`](Group::end) completes.
    pub unsafe fn send(
        &mut self,
        input: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        self.transfer(Dir::Send, input, count, dtype, peer)
    }

    /// Records a receive of `count` elements into `output` from `peer` (this rank itself
    /// included).
    ///
    /// # Safety
    /// `output` holds `count` elements until the work queued by [`end`](Group::end)
    /// completes, and no other operation of the group touches it.
    pub unsafe fn recv(
        &mut self,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        self.transfer(Dir::Recv, output, count, dtype, peer)
    }

    /// Records [`Collectives::all_reduce`].
    ///
    /// # Safety
    /// As [`Collectives::all_reduce`], until the work queued by [`end`](Group::end) completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let op = self.c.lower(op.into(), dtype)?;
        let call = self.c.call(Collective::AllReduce, count, dtype, op);
        self.collective(self.c.args(call, input, output, Peer::None), algo)
    }

    /// Records [`Collectives::all_gather`].
    ///
    /// # Safety
    /// As [`Collectives::all_gather`], until the work queued by [`end`](Group::end) completes.
    pub unsafe fn all_gather(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let call = self.c.call(Collective::AllGather, count, dtype, MOVE);
        self.collective(self.c.args(call, input, output, Peer::None), algo)
    }

    /// Records [`Collectives::reduce_scatter`].
    ///
    /// # Safety
    /// As [`Collectives::reduce_scatter`], until the work queued by [`end`](Group::end)
    /// completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let op = self.c.lower(op.into(), dtype)?;
        let call = self.c.call(Collective::ReduceScatter, count, dtype, op);
        self.collective(self.c.args(call, input, output, Peer::None), algo)
    }

    /// Records [`Collectives::broadcast`] (a group of broadcasts from different roots is
    /// PyTorch's uneven all-gather).
    ///
    /// # Safety
    /// As [`Collectives::broadcast`], until the work queued by [`end`](Group::end) completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn broadcast(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        self.c.check_rank(root)?;
        let call = self.c.call(Collective::Broadcast, count, dtype, MOVE);
        self.collective(self.c.args(call, input, output, Peer::Root(root)), algo)
    }

    /// Records [`Collectives::reduce`] (a group of reduces to different roots is PyTorch's
    /// uneven reduce-scatter).
    ///
    /// # Safety
    /// As [`Collectives::reduce`], until the work queued by [`end`](Group::end) completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        root: usize,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        self.c.check_rank(root)?;
        let op = self.c.lower(op.into(), dtype)?;
        let call = self.c.call(Collective::Reduce, count, dtype, op);
        self.collective(self.c.args(call, input, output, Peer::Root(root)), algo)
    }

    /// Records [`Collectives::all_to_all`].
    ///
    /// # Safety
    /// As [`Collectives::all_to_all`], until the work queued by [`end`](Group::end) completes.
    pub unsafe fn all_to_all(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let call = self.c.call(Collective::AllToAll, count, dtype, MOVE);
        self.collective(self.c.args(call, input, output, Peer::None), algo)
    }

    /// Records [`Collectives::gather`]'s sends and receives.
    ///
    /// # Safety
    /// As [`Collectives::gather`], until the work queued by [`end`](Group::end) completes.
    pub unsafe fn gather(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.c.check_rank(root)?;
        let bytes = count * dtype.size();
        let mut add = Vec::new();
        if self.c.cx.rank() == root {
            for q in 0..self.c.cx.ranks() {
                add.push(Transfer::recv(
                    q,
                    output.byte_add_cast((q * bytes) as u64),
                    bytes,
                ));
            }
        }
        add.push(Transfer::send(root, input, bytes));
        self.batch(add)
    }

    /// Records [`Collectives::scatter`]'s sends and receives.
    ///
    /// # Safety
    /// As [`Collectives::scatter`], until the work queued by [`end`](Group::end) completes.
    pub unsafe fn scatter(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<()> {
        self.c.check_rank(root)?;
        let bytes = count * dtype.size();
        let mut add = Vec::new();
        if self.c.cx.rank() == root {
            for q in 0..self.c.cx.ranks() {
                add.push(Transfer::send(
                    q,
                    input.byte_add_cast((q * bytes) as u64),
                    bytes,
                ));
            }
        }
        add.push(Transfer::recv(root, output, bytes));
        self.batch(add)
    }

    /// Records [`Collectives::all_to_allv`]'s sends and receives.
    ///
    /// # Safety
    /// As [`Collectives::all_to_allv`], until the work queued by [`end`](Group::end)
    /// completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv(
        &mut self,
        input: DevicePtr<u8>,
        send_counts: &[usize],
        send_displs: &[usize],
        output: DevicePtr<u8>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
    ) -> Result<()> {
        let n = self.c.cx.ranks();
        for (what, v) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            if v.len() != n {
                return Err(Error::PerRankLength {
                    what,
                    len: v.len(),
                    ranks: n,
                });
            }
        }
        let es = dtype.size();
        let at = |p: DevicePtr<u8>, elements: usize| p.byte_add_cast((elements * es) as u64);
        let mut batch = Vec::with_capacity(2 * n);
        for q in 0..n {
            batch.push(Transfer::send(
                q,
                at(input, send_displs[q]),
                send_counts[q] * es,
            ));
            batch.push(Transfer::recv(
                q,
                at(output, recv_displs[q]),
                recv_counts[q] * es,
            ));
        }
        self.batch(batch)
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.collectives.is_empty() && self.transfers.is_empty()
    }

    /// Ends the group (NCCL's `ncclGroupEnd`): queues its collectives in order, then all of its
    /// sends and receives together (module docs), on `stream`. A send to this rank itself and
    /// its receive that differ in size are refused before anything of the group is queued.
    /// Traced as one `call` span named `group` (its collectives' own spans nested inside).
    pub fn end(self, stream: &Stream) -> Result<()> {
        self.end_as("group", None, stream)
    }

    /// [`end`](Self::end) of the public call `name` (`group`, or the call made of one batch:
    /// `gather`, `scatter`, `all_to_allv`, with its `root`), traced as one `call` span: bytes
    /// this rank sends (`recv_bytes`: receives), distinct `peers`, the root, `collectives`
    /// recorded, algorithm `p2p` when a batch was queued, or the error. Every launch of the
    /// point-to-point engine it makes carries the span's call id.
    fn end_as(mut self, name: &'static str, root: Option<usize>, stream: &Stream) -> Result<()> {
        let collectives = std::mem::take(&mut self.collectives);
        let transfers = std::mem::take(&mut self.transfers);
        let Some((mut span, _scope)) = self.c.call_span(name, stream) else {
            return self.queue(collectives, transfers, stream);
        };
        let batches = collectives.iter().filter_map(|c| match c {
            Recorded::Batch(b) => Some(b.as_slice()),
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
        let calls = collectives
            .iter()
            .filter(|c| matches!(c, Recorded::Call(..)))
            .count();
        span.set("collectives", calls);
        let batched = !all.is_empty();
        let result = self.queue(collectives, transfers, stream);
        super::end_call(&mut span, &result, batched.then_some(Algorithm::P2p));
        result
    }

    /// Queues what the group recorded ([`end`](Self::end)).
    fn queue(
        &self,
        collectives: Vec<Recorded>,
        transfers: Vec<Transfer>,
        stream: &Stream,
    ) -> Result<()> {
        let batched =
            !transfers.is_empty() || collectives.iter().any(|c| matches!(c, Recorded::Batch(_)));
        if batched && self.c.cx.multi.is_some() {
            // Refused before anything of the group is queued, on every rank alike (each makes
            // the same calls): the point-to-point engine needs MemoryChannels to every peer.
            return Err(self.c.cx.cannot(super::P2P_ACROSS_NODES));
        }
        let me = self.c.cx.rank();
        p2p::self_pairs(me, &transfers)?;
        let mut met = p2p::peers_of(me, &transfers);
        for c in &collectives {
            if let Recorded::Batch(b) = c {
                p2p::self_pairs(me, b)?;
                met.extend(p2p::peers_of(me, b));
            }
        }
        if batched {
            // Every peer the group meets, traded with before anything is queued (or refused
            // under capture, on every rank alike): no launch waits for a later exchange.
            met.sort_unstable();
            met.dedup();
            p2p::region(&self.c.cx, &met, stream.is_capturing()?)?;
        }
        for c in collectives {
            match c {
                // SAFETY: each was recorded under its call's contract, which lasts until the
                // work queued here completes.
                Recorded::Call(args, algo) => unsafe { self.c.run(args, algo, stream) }?,
                Recorded::Batch(b) => self.c.p2p()?.queue_batch(&self.c.cx, &b, stream)?,
            }
        }
        if transfers.is_empty() {
            return Ok(());
        }
        self.c.p2p()?.queue_batch(&self.c.cx, &transfers, stream)
    }

    fn transfer(
        &mut self,
        dir: Dir,
        buf: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<()> {
        self.c.check_rank(peer)?;
        self.transfers.push(Transfer {
            dir,
            peer,
            buf,
            bytes: count * dtype.size(),
        });
        Ok(())
    }

    fn collective(&mut self, args: Args, algo: Option<Algorithm>) -> Result<()> {
        self.collectives.push(Recorded::Call(args, algo));
        Ok(())
    }

    fn batch(&mut self, batch: Vec<Transfer>) -> Result<()> {
        self.collectives.push(Recorded::Batch(batch));
        Ok(())
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if !self.is_empty() {
            tracing::warn!(
                collectives = self.collectives.len(),
                transfers = self.transfers.len(),
                "a group was dropped without end(): nothing of it was queued"
            );
        }
    }
}

/// The type and operator of a call that moves data.
const MOVE: super::reduction::KernelOp = super::context::Context::MOVE.1;
