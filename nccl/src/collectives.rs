//! The collectives: NCCL's argument checks ([`check`] and the `*_op` constructors, one per
//! NCCL function) turning a call into an [`Op`], and [`record`], which records an `Op` in a
//! [`Group`] of the library's collectives (`group.rs` ends the group, at once outside an NCCL
//! group, at `ncclGroupEnd` inside one, on the caller's stream or the communicator's own on
//! the CPU backend).
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

use mscclpp::collectives::{Group, Reduction};
use mscclpp::shared::{DataType, DevicePtr};

use crate::abi;
use crate::comm::{Comm, Handle};
use crate::error::NcclError;
use crate::registration;

/// Which collective, with its arguments (addresses as integers, so a group can carry them
/// to another thread).
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `ncclAllReduce`.
    AllReduce {
        /// `sendbuff`.
        send: u64,
        /// `recvbuff`.
        recv: u64,
        /// Elements.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Operator.
        op: Reduction,
    },
    /// `ncclAllGather` (`count` per rank).
    AllGather {
        /// `sendbuff`.
        send: u64,
        /// `recvbuff`.
        recv: u64,
        /// Elements per rank.
        count: usize,
        /// Type.
        dtype: DataType,
    },
    /// `ncclReduceScatter` (`count` per rank).
    ReduceScatter {
        /// `sendbuff`.
        send: u64,
        /// `recvbuff`.
        recv: u64,
        /// Elements per rank.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Operator.
        op: Reduction,
    },
    /// `ncclBroadcast` / `ncclBcast`.
    Broadcast {
        /// `sendbuff` (read on the root).
        send: u64,
        /// `recvbuff`.
        recv: u64,
        /// Elements.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Root rank.
        root: usize,
    },
    /// `ncclAlltoAll` (`count` per pair of ranks).
    AllToAll {
        /// `sendbuff`.
        send: u64,
        /// `recvbuff`.
        recv: u64,
        /// Elements per pair.
        count: usize,
        /// Type.
        dtype: DataType,
    },
    /// `ncclReduce`.
    Reduce {
        /// `sendbuff`.
        send: u64,
        /// `recvbuff` (written on the root).
        recv: u64,
        /// Elements.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Operator.
        op: Reduction,
        /// Root rank.
        root: usize,
    },
    /// `ncclGather` (`count` per rank).
    Gather {
        /// `sendbuff`.
        send: u64,
        /// `recvbuff` (written on the root).
        recv: u64,
        /// Elements per rank.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Root rank.
        root: usize,
    },
    /// `ncclScatter` (`count` per rank).
    Scatter {
        /// `sendbuff` (read on the root).
        send: u64,
        /// `recvbuff`.
        recv: u64,
        /// Elements per rank.
        count: usize,
        /// Type.
        dtype: DataType,
        /// Root rank.
        root: usize,
    },
}

/// What every collective checks first: a ready, usable communicator.
pub fn check(comm: *mut c_void) -> Result<std::sync::Arc<Comm>, NcclError> {
    let c = Handle::ready(comm)?;
    c.check_usable()?;
    Ok(c)
}

/// Bytes of `count` elements of `elem` bytes times `parts`, or [`NcclError::CountOverflow`]
/// (also beyond `isize::MAX`, which no buffer can hold).
pub fn bytes(count: usize, elem: usize, parts: usize) -> Result<usize, NcclError> {
    count
        .checked_mul(elem)
        .and_then(|b| b.checked_mul(parts))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or(NcclError::CountOverflow {
            count,
            elem_bytes: elem,
            parts,
        })
}

/// A buffer that must not be null when the call moves data.
pub fn buffer(p: *const c_void, what: &'static str, needed: bool) -> Result<u64, NcclError> {
    if needed && p.is_null() {
        Err(NcclError::Null { what })
    } else {
        Ok(p as u64)
    }
}

/// A rank argument in `[0, nranks)`.
pub fn rank_arg(what: &'static str, r: c_int, nranks: usize) -> Result<usize, NcclError> {
    usize::try_from(r)
        .ok()
        .filter(|&r| r < nranks)
        .ok_or(NcclError::OutOfRange {
            what,
            value: r.into(),
            expected: format!("a rank of the communicator (0 to {})", nranks - 1),
        })
}

/// `ncclAllReduce`'s checks.
pub fn all_reduce_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> Result<Op, NcclError> {
    let op = registration::reduce_op(c, op, dtype)?;
    let dtype = abi::data_type(dtype)?;
    let n = bytes(count, dtype.size(), 1)? > 0;
    Ok(Op::AllReduce {
        send: buffer(send, "sendbuff", n)?,
        recv: buffer(recv, "recvbuff", n)?,
        count,
        dtype,
        op,
    })
}

/// `ncclAllGather`'s checks.
pub fn all_gather_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
) -> Result<Op, NcclError> {
    let dtype = abi::data_type(dtype)?;
    let n = bytes(count, dtype.size(), c.nranks)? > 0;
    Ok(Op::AllGather {
        send: buffer(send, "sendbuff", n)?,
        recv: buffer(recv, "recvbuff", n)?,
        count,
        dtype,
    })
}

/// `ncclReduceScatter`'s checks.
pub fn reduce_scatter_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> Result<Op, NcclError> {
    let op = registration::reduce_op(c, op, dtype)?;
    let dtype = abi::data_type(dtype)?;
    let n = bytes(count, dtype.size(), c.nranks)? > 0;
    Ok(Op::ReduceScatter {
        send: buffer(send, "sendbuff", n)?,
        recv: buffer(recv, "recvbuff", n)?,
        count,
        dtype,
        op,
    })
}

/// `ncclBroadcast`'s checks (`sendbuff` is needed on the root only).
pub fn broadcast_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> Result<Op, NcclError> {
    let dtype = abi::data_type(dtype)?;
    let root = rank_arg("root", root, c.nranks)?;
    let n = bytes(count, dtype.size(), 1)? > 0;
    Ok(Op::Broadcast {
        send: buffer(send, "sendbuff", n && root == c.rank)?,
        recv: buffer(recv, "recvbuff", n)?,
        count,
        dtype,
        root,
    })
}

/// `ncclAlltoAll`'s checks.
pub fn all_to_all_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
) -> Result<Op, NcclError> {
    let dtype = abi::data_type(dtype)?;
    let n = bytes(count, dtype.size(), c.nranks)? > 0;
    Ok(Op::AllToAll {
        send: buffer(send, "sendbuff", n)?,
        recv: buffer(recv, "recvbuff", n)?,
        count,
        dtype,
    })
}

/// `ncclReduce`'s checks (`recvbuff` is needed on the root only).
#[allow(clippy::too_many_arguments)]
pub fn reduce_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
) -> Result<Op, NcclError> {
    let op = registration::reduce_op(c, op, dtype)?;
    let dtype = abi::data_type(dtype)?;
    let root = rank_arg("root", root, c.nranks)?;
    let n = bytes(count, dtype.size(), 1)? > 0;
    Ok(Op::Reduce {
        send: buffer(send, "sendbuff", n)?,
        recv: buffer(recv, "recvbuff", n && root == c.rank)?,
        count,
        dtype,
        op,
        root,
    })
}

/// `ncclGather`'s checks (`recvbuff`, of `nranks * count`, is needed on the root only).
pub fn gather_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> Result<Op, NcclError> {
    let dtype = abi::data_type(dtype)?;
    let root = rank_arg("root", root, c.nranks)?;
    let n = bytes(count, dtype.size(), c.nranks)? > 0;
    Ok(Op::Gather {
        send: buffer(send, "sendbuff", n)?,
        recv: buffer(recv, "recvbuff", n && root == c.rank)?,
        count,
        dtype,
        root,
    })
}

/// `ncclScatter`'s checks (`sendbuff`, of `nranks * count`, is needed on the root only).
pub fn scatter_op(
    c: &Comm,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> Result<Op, NcclError> {
    let dtype = abi::data_type(dtype)?;
    let root = rank_arg("root", root, c.nranks)?;
    let n = bytes(count, dtype.size(), c.nranks)? > 0;
    Ok(Op::Scatter {
        send: buffer(send, "sendbuff", n && root == c.rank)?,
        recv: buffer(recv, "recvbuff", n)?,
        count,
        dtype,
        root,
    })
}

/// Records `op` in `g`, a group of the library's collectives of the op's communicator
/// (`group.rs` ends it on the caller's stream, or the communicator's own on the CPU backend).
pub fn record(g: &mut Group<'_>, op: &Op) -> Result<(), NcclError> {
    let p = DevicePtr::<u8>::from_addr;
    // SAFETY (every call below): NCCL's contract: the caller's buffers hold what the call
    // reads and writes (checked non-null above when it moves data) until the work queued on
    // its stream completes, and every rank makes the same calls.
    let r = match *op {
        Op::AllReduce {
            send,
            recv,
            count,
            dtype,
            op,
        } => unsafe { g.all_reduce(p(send), p(recv), count, dtype, op, None) },
        Op::AllGather {
            send,
            recv,
            count,
            dtype,
        } => unsafe { g.all_gather(p(send), p(recv), count, dtype, None) },
        Op::ReduceScatter {
            send,
            recv,
            count,
            dtype,
            op,
        } => unsafe { g.reduce_scatter(p(send), p(recv), count, dtype, op, None) },
        Op::Broadcast {
            send,
            recv,
            count,
            dtype,
            root,
        } => unsafe { g.broadcast(p(send), p(recv), count, dtype, root, None) },
        Op::AllToAll {
            send,
            recv,
            count,
            dtype,
        } => unsafe { g.all_to_all(p(send), p(recv), count, dtype, None) },
        Op::Reduce {
            send,
            recv,
            count,
            dtype,
            op,
            root,
        } => unsafe { g.reduce(p(send), p(recv), count, dtype, op, root, None) },
        Op::Gather {
            send,
            recv,
            count,
            dtype,
            root,
        } => unsafe { g.gather(p(send), p(recv), count, dtype, root) },
        Op::Scatter {
            send,
            recv,
            count,
            dtype,
            root,
        } => unsafe { g.scatter(p(send), p(recv), count, dtype, root) },
    };
    r.map_err(NcclError::library(op.name()))
}

impl Op {
    /// The NCCL function.
    pub fn name(&self) -> &'static str {
        match self {
            Op::AllReduce { .. } => "ncclAllReduce",
            Op::AllGather { .. } => "ncclAllGather",
            Op::ReduceScatter { .. } => "ncclReduceScatter",
            Op::Broadcast { .. } => "ncclBroadcast",
            Op::AllToAll { .. } => "ncclAlltoAll",
            Op::Reduce { .. } => "ncclReduce",
            Op::Gather { .. } => "ncclGather",
            Op::Scatter { .. } => "ncclScatter",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_overflow_as_errors() {
        assert_eq!(bytes(10, 4, 3).unwrap(), 120);
        assert_eq!(bytes(0, 8, 8).unwrap(), 0);
        assert!(matches!(
            bytes(usize::MAX / 2, 4, 1),
            Err(NcclError::CountOverflow { .. })
        ));
        assert!(bytes(1 << 61, 2, 4).is_err());
        assert!(bytes(isize::MAX as usize / 2 + 1, 2, 1).is_err());
    }

    #[test]
    fn ranks_and_buffers_are_checked() {
        assert_eq!(rank_arg("root", 3, 4).unwrap(), 3);
        assert!(rank_arg("root", 4, 4).is_err());
        assert!(rank_arg("root", -1, 4).is_err());
        assert!(buffer(std::ptr::null(), "sendbuff", true).is_err());
        assert_eq!(buffer(std::ptr::null(), "sendbuff", false).unwrap(), 0);
    }
}
