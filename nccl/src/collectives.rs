//! The collectives: NCCL's argument checks, one function per NCCL function, each turning a
//! call into the library's [`Call`] (NCCL's integers mapped by `args.rs`; the byte counts and
//! buffers checked by the library, `Comm::check`). `group.rs` runs the call: at once outside
//! an NCCL group, at `ncclGroupEnd` inside one.
//!
//! In place is NCCL's convention, which the library shares: all-reduce and broadcast with
//! `sendbuff == recvbuff`; all-gather with `sendbuff == recvbuff + rank * count`;
//! reduce-scatter with `recvbuff == sendbuff + rank * count`; all-to-all with `sendbuff ==
//! recvbuff`; gather with `sendbuff == recvbuff + root * count` on the root; scatter with
//! `recvbuff == sendbuff + root * count` on the root; reduce with `sendbuff == recvbuff`. A
//! call of 0 elements checks its arguments and moves nothing. Buffers that only the root reads
//! or writes (reduce's and gather's `recvbuff`, scatter's and broadcast's `sendbuff`) may be
//! null on the other ranks.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use mscclpp::collectives::Call;

use crate::args::{data_type, ptr, rank_arg};
use crate::comm::{Checked, Comm, Handle};
use crate::error::NcclError;
use crate::registration;

/// What every collective and send/receive checks first: a ready, usable communicator.
pub fn check(comm: *mut c_void) -> Result<Arc<Comm>, NcclError> {
    let c = Handle::ready(comm)?;
    c.check_usable()?;
    Ok(c)
}

/// `ncclAllReduce`'s checks.
pub fn all_reduce(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> Result<Checked, NcclError> {
    let op = registration::reduce_op(c, op, dtype)?;
    c.check(
        "ncclAllReduce",
        Call::AllReduce {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype: data_type(dtype)?,
            op,
        },
    )
}

/// `ncclAllGather`'s checks.
pub fn all_gather(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
) -> Result<Checked, NcclError> {
    c.check(
        "ncclAllGather",
        Call::AllGather {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype: data_type(dtype)?,
        },
    )
}

/// `ncclReduceScatter`'s checks.
pub fn reduce_scatter(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> Result<Checked, NcclError> {
    let op = registration::reduce_op(c, op, dtype)?;
    c.check(
        "ncclReduceScatter",
        Call::ReduceScatter {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype: data_type(dtype)?,
            op,
        },
    )
}

/// `ncclBroadcast`'s checks (`sendbuff` is read on the root only).
pub fn broadcast(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> Result<Checked, NcclError> {
    let dtype = data_type(dtype)?;
    c.check(
        "ncclBroadcast",
        Call::Broadcast {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype,
            root: rank_arg("root", root, c.nranks)?,
        },
    )
}

/// `ncclAlltoAll`'s checks.
pub fn all_to_all(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
) -> Result<Checked, NcclError> {
    c.check(
        "ncclAlltoAll",
        Call::AllToAll {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype: data_type(dtype)?,
        },
    )
}

/// `ncclReduce`'s checks (`recvbuff` is written on the root only).
pub fn reduce(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
) -> Result<Checked, NcclError> {
    let op = registration::reduce_op(c, op, dtype)?;
    let dtype = data_type(dtype)?;
    c.check(
        "ncclReduce",
        Call::Reduce {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype,
            op,
            root: rank_arg("root", root, c.nranks)?,
        },
    )
}

/// `ncclGather`'s checks (`recvbuff`, of `nranks * count`, is written on the root only).
pub fn gather(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> Result<Checked, NcclError> {
    let dtype = data_type(dtype)?;
    c.check(
        "ncclGather",
        Call::Gather {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype,
            root: rank_arg("root", root, c.nranks)?,
        },
    )
}

/// `ncclScatter`'s checks (`sendbuff`, of `nranks * count`, is read on the root only).
pub fn scatter(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> Result<Checked, NcclError> {
    let dtype = data_type(dtype)?;
    c.check(
        "ncclScatter",
        Call::Scatter {
            input: ptr(send),
            output: ptr(recv),
            count,
            dtype,
            root: rank_arg("root", root, c.nranks)?,
        },
    )
}
