//! Groups (NCCL's `ncclGroupStart` … `ncclGroupEnd`): [`Collectives::group`] returns a
//! [`Group`] that records calls ([`Group::add`], and one method per call, each a line that
//! builds its [`Call`]); [`Group::end`] queues them all on one stream, as the dispatcher's
//! `Engine::end` says (`dispatch.rs`): the collectives in order, then every send and receive
//! together on the point-to-point engine, so that a group may send to and receive from any
//! peers in any order (a ring, all pairs, this rank itself) without deadlock, which is what a
//! group is for. As in NCCL, the operations of one group must not depend on each other's data.
//!
//! Every rank records the same collectives in the same order (as with NCCL); sends and
//! receives pair up between two ranks in the order each rank recorded them (the k-th send from
//! `a` to `b` with the k-th receive at `b` from `a`), whatever group or call each was made in,
//! with equal byte counts (a receive of another count gets `Error::CountMismatch`, found by
//! the receiving kernel; on this rank itself, `Error::SelfMismatch`, found at `end`). Zero
//! counts are messages too: they pair like any other and move nothing.

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_shared::{DataType, DevicePtr};

use super::algo::p2p::Transfer;
use super::algorithm::Algorithm;
use super::api::Collectives;
use super::call::Call;
use super::dispatch::Recorded;
use super::reduction::Reduction;

/// Calls recorded together and queued by [`end`] (NCCL's group: module docs). Record with
/// [`add`](Group::add) or its methods, which check their arguments at once; nothing is queued
/// before `end`. A group dropped without `end` queues nothing.
///
/// [`end`]: Group::end
#[must_use = "a group queues nothing until `end`"]
pub struct Group<'c> {
    c: &'c Collectives,
    recorded: Vec<Recorded>,
    transfers: Vec<Transfer>,
}

impl Collectives {
    /// Starts a group (NCCL's `ncclGroupStart`; its end is [`Group::end`]).
    pub fn group(&self) -> Group<'_> {
        Group {
            c: self,
            recorded: Vec::new(),
            transfers: Vec::new(),
        }
    }
}

impl Group<'_> {
    /// Records `call` (checked now: [`Call::check`]; a send or receive may name this rank
    /// itself, pairing with its opposite in the group). `algo` forces an algorithm on a
    /// collective (none on the calls made of sends and receives).
    ///
    /// # Safety
    /// As [`Collectives::queue`], until the work queued by [`end`](Group::end) completes;
    /// a receive's buffer is touched by no other operation of the group.
    pub unsafe fn add(&mut self, call: &Call, algo: Option<Algorithm>) -> Result<()> {
        match self.c.engine().record(call, algo, true)? {
            Recorded::Transfers(t) => self.transfers.extend(t),
            r => self.recorded.push(r),
        }
        Ok(())
    }

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
        let call = Call::Send {
            input,
            count,
            dtype,
            peer,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, None) }
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
        let call = Call::Recv {
            output,
            count,
            dtype,
            peer,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, None) }
    }

    /// Records [`Collectives::all_reduce`].
    ///
    /// # Safety
    /// As [`Collectives::all_reduce`], until the work queued by [`end`](Group::end) completes.
    pub unsafe fn all_reduce(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let op = op.into();
        let call = Call::AllReduce {
            input,
            output,
            count,
            dtype,
            op,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, algo) }
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
        let call = Call::AllGather {
            input,
            output,
            count,
            dtype,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, algo) }
    }

    /// Records [`Collectives::reduce_scatter`].
    ///
    /// # Safety
    /// As [`Collectives::reduce_scatter`], until the work queued by [`end`](Group::end)
    /// completes.
    pub unsafe fn reduce_scatter(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let op = op.into();
        let call = Call::ReduceScatter {
            input,
            output,
            count,
            dtype,
            op,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, algo) }
    }

    /// Records [`Collectives::broadcast`] (a group of broadcasts from different roots is
    /// PyTorch's uneven all-gather).
    ///
    /// # Safety
    /// As [`Collectives::broadcast`], until the work queued by [`end`](Group::end) completes.
    pub unsafe fn broadcast(
        &mut self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let call = Call::Broadcast {
            input,
            output,
            count,
            dtype,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, algo) }
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
        let op = op.into();
        let call = Call::Reduce {
            input,
            output,
            count,
            dtype,
            op,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, algo) }
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
        let call = Call::AllToAll {
            input,
            output,
            count,
            dtype,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, algo) }
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
        let call = Call::Gather {
            input,
            output,
            count,
            dtype,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, None) }
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
        let call = Call::Scatter {
            input,
            output,
            count,
            dtype,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, None) }
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
        let call = Call::AllToAllv {
            input,
            output,
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.to_vec(),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.to_vec(),
            dtype,
        };
        // SAFETY: the caller's contract.
        unsafe { self.add(&call, None) }
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.recorded.is_empty() && self.transfers.is_empty()
    }

    /// Ends the group (NCCL's `ncclGroupEnd`): queues its collectives in order, then all of its
    /// sends and receives together (module docs), on `stream`. A send to this rank itself and
    /// its receive that differ in size are refused before anything of the group is queued.
    /// Traced as one `call` span named `group` (its collectives' own spans nested inside).
    pub fn end(mut self, stream: &Stream) -> Result<()> {
        let recorded = std::mem::take(&mut self.recorded);
        let transfers = std::mem::take(&mut self.transfers);
        self.c
            .engine()
            .end("group", None, recorded, transfers, stream)
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if !self.is_empty() {
            tracing::warn!(
                collectives = self.recorded.len(),
                transfers = self.transfers.len(),
                "a group was dropped without end(): nothing of it was queued"
            );
        }
    }
}
