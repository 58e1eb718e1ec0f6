//! The call descriptor: [`Call`], one collective or point-to-point operation with its buffers,
//! element count, element type, operator and root or peer. Every way of calling builds one:
//! the public calls of `Collectives` and of `Group` (one line each), the typed calls, the
//! drop-in NCCL library and the bench; `Collectives::queue` and `Group::add` take it.
//!
//! [`Call::check`] is the one place that checks a call's arguments, so every caller gets the
//! same decisions: the ranks it names, its byte counts (`count ×` the element size, times the
//! parts its largest buffer holds, must fit the address space: `Error::CountOverflow`, never a
//! wrap) and its buffers (null where the call moves data on this rank: `Error::NullBuffer`; a
//! call of zero elements moves nothing, so any buffer may be null).
//!
//! Counts are elements; "per rank" is NCCL's: all-gather, reduce-scatter, all-to-all, gather
//! and scatter move `count` elements per rank, so one of their buffers holds `ranks` parts
//! (all-gather `input = output + rank * count` in place, and so on: module docs of
//! `collectives`).

use mscclpp_host::{Error, Result};
use mscclpp_shared::{DataType, DevicePtr};

use super::reduction::Reduction;

/// One call (module docs). Built by value; queued with `Collectives::queue` or recorded with
/// `Group::add` (both `unsafe`: the buffers must hold what the call moves).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// All-reduce of `count` elements from `input` into `output` (they may be the same).
    AllReduce {
        /// Read by every rank.
        input: DevicePtr<u8>,
        /// Written on every rank.
        output: DevicePtr<u8>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Operator.
        op: Reduction,
    },
    /// All-gather: every rank's `count` elements land at `output[rank * count ..]`.
    AllGather {
        /// `count` elements.
        input: DevicePtr<u8>,
        /// `ranks * count` elements.
        output: DevicePtr<u8>,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DataType,
    },
    /// Reduce-scatter: rank r receives the reduction of every rank's part r.
    ReduceScatter {
        /// `ranks * count` elements.
        input: DevicePtr<u8>,
        /// `count` elements.
        output: DevicePtr<u8>,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Operator.
        op: Reduction,
    },
    /// Broadcast of `root`'s `count` elements into every rank's `output`.
    Broadcast {
        /// Read on the root only (may be null elsewhere).
        input: DevicePtr<u8>,
        /// Written on every rank.
        output: DevicePtr<u8>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The rank whose input is broadcast.
        root: usize,
    },
    /// Reduce to `root`: every rank's `count` elements reduced into the root's `output`.
    Reduce {
        /// Read by every rank.
        input: DevicePtr<u8>,
        /// Written on the root only (may be null elsewhere).
        output: DevicePtr<u8>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// Operator.
        op: Reduction,
        /// The rank that receives the result.
        root: usize,
    },
    /// All-to-all: part p (`count` elements) of every rank's `input` lands as part r of rank
    /// p's `output`.
    AllToAll {
        /// `ranks * count` elements.
        input: DevicePtr<u8>,
        /// `ranks * count` elements.
        output: DevicePtr<u8>,
        /// Elements per pair of ranks.
        count: usize,
        /// Element type.
        dtype: DataType,
    },
    /// Gather to `root`: every rank's `count` elements land at `output[rank * count ..]` on
    /// the root.
    Gather {
        /// `count` elements, read by every rank.
        input: DevicePtr<u8>,
        /// `ranks * count` elements, written on the root only (may be null elsewhere).
        output: DevicePtr<u8>,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The rank that gathers.
        root: usize,
    },
    /// Scatter from `root`: part r of the root's input lands in rank r's `output`.
    Scatter {
        /// `ranks * count` elements, read on the root only (may be null elsewhere).
        input: DevicePtr<u8>,
        /// `count` elements, written on every rank.
        output: DevicePtr<u8>,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The rank that scatters.
        root: usize,
    },
    /// All-to-all with a count and a displacement (both in elements) per rank:
    /// `send_counts[q]` elements at `input[send_displs[q] ..]` go to rank `q`, which receives
    /// them at `output[recv_displs[r] ..]` (`recv_counts[r]` elements).
    AllToAllv {
        /// Read where the send counts say.
        input: DevicePtr<u8>,
        /// Written where the receive counts say.
        output: DevicePtr<u8>,
        /// Elements to each rank.
        send_counts: Vec<usize>,
        /// Where each rank's elements start in `input`.
        send_displs: Vec<usize>,
        /// Elements from each rank.
        recv_counts: Vec<usize>,
        /// Where each rank's elements land in `output`.
        recv_displs: Vec<usize>,
        /// Element type.
        dtype: DataType,
    },
    /// A send of `count` elements to `peer` (this rank itself only inside a group).
    Send {
        /// `count` elements.
        input: DevicePtr<u8>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The receiving rank.
        peer: usize,
    },
    /// A receive of `count` elements from `peer` (this rank itself only inside a group).
    Recv {
        /// `count` elements.
        output: DevicePtr<u8>,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DataType,
        /// The sending rank.
        peer: usize,
    },
    /// A send of `input` to `next` and a receive from `prev` into `output`, at once.
    SendRecv {
        /// `count` elements sent to `next`.
        input: DevicePtr<u8>,
        /// The rank sent to.
        next: usize,
        /// `count` elements received from `prev`.
        output: DevicePtr<u8>,
        /// The rank received from.
        prev: usize,
        /// Elements each way.
        count: usize,
        /// Element type.
        dtype: DataType,
    },
}

impl Call {
    /// The public call's name (`all_reduce`, `send`, …), as traces name it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::AllReduce { .. } => "all_reduce",
            Self::AllGather { .. } => "all_gather",
            Self::ReduceScatter { .. } => "reduce_scatter",
            Self::Broadcast { .. } => "broadcast",
            Self::Reduce { .. } => "reduce",
            Self::AllToAll { .. } => "all_to_all",
            Self::Gather { .. } => "gather",
            Self::Scatter { .. } => "scatter",
            Self::AllToAllv { .. } => "all_to_allv",
            Self::Send { .. } => "send",
            Self::Recv { .. } => "recv",
            Self::SendRecv { .. } => "send_recv",
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        match self {
            Self::AllReduce { dtype, .. }
            | Self::AllGather { dtype, .. }
            | Self::ReduceScatter { dtype, .. }
            | Self::Broadcast { dtype, .. }
            | Self::Reduce { dtype, .. }
            | Self::AllToAll { dtype, .. }
            | Self::Gather { dtype, .. }
            | Self::Scatter { dtype, .. }
            | Self::AllToAllv { dtype, .. }
            | Self::Send { dtype, .. }
            | Self::Recv { dtype, .. }
            | Self::SendRecv { dtype, .. } => *dtype,
        }
    }

    /// The root of a rooted call (broadcast, reduce, gather, scatter).
    pub fn root(&self) -> Option<usize> {
        match self {
            Self::Broadcast { root, .. }
            | Self::Reduce { root, .. }
            | Self::Gather { root, .. }
            | Self::Scatter { root, .. } => Some(*root),
            _ => None,
        }
    }

    /// The operator of a reducing call (all-reduce, reduce-scatter, reduce).
    pub fn op(&self) -> Option<Reduction> {
        match self {
            Self::AllReduce { op, .. }
            | Self::ReduceScatter { op, .. }
            | Self::Reduce { op, .. } => Some(*op),
            _ => None,
        }
    }

    /// `(input, output)`: the buffers this rank reads and writes (null for the side a call
    /// has not: a receive's input, a send's output).
    pub fn buffers(&self) -> (DevicePtr<u8>, DevicePtr<u8>) {
        match self {
            Self::AllReduce { input, output, .. }
            | Self::AllGather { input, output, .. }
            | Self::ReduceScatter { input, output, .. }
            | Self::Broadcast { input, output, .. }
            | Self::Reduce { input, output, .. }
            | Self::AllToAll { input, output, .. }
            | Self::Gather { input, output, .. }
            | Self::Scatter { input, output, .. }
            | Self::AllToAllv { input, output, .. }
            | Self::SendRecv { input, output, .. } => (*input, *output),
            Self::Send { input, .. } => (*input, DevicePtr::NULL),
            Self::Recv { output, .. } => (DevicePtr::NULL, *output),
        }
    }

    /// The element count (per rank for the calls whose buffers hold a part per rank; 0 for an
    /// all-to-all-v, whose counts are per peer).
    pub fn count(&self) -> usize {
        match self {
            Self::AllReduce { count, .. }
            | Self::AllGather { count, .. }
            | Self::ReduceScatter { count, .. }
            | Self::Broadcast { count, .. }
            | Self::Reduce { count, .. }
            | Self::AllToAll { count, .. }
            | Self::Gather { count, .. }
            | Self::Scatter { count, .. }
            | Self::Send { count, .. }
            | Self::Recv { count, .. }
            | Self::SendRecv { count, .. } => *count,
            Self::AllToAllv { .. } => 0,
        }
    }

    /// Checks the call as rank `rank` of `ranks` makes it (module docs), inside a group or
    /// not (only a group's sends and receives may name this rank itself); returns the bytes of
    /// one part (`count ×` the element size; 0 for an all-to-all-v, whose parts differ).
    /// `Error::NoSuchRank`, `Error::PeerIsSelf`, `Error::PerRankLength`,
    /// `Error::CountOverflow`, `Error::NullBuffer`, in that order of checking.
    pub fn check(&self, rank: usize, ranks: usize, in_group: bool) -> Result<usize> {
        let is_rank = |r: usize| {
            if r < ranks {
                Ok(())
            } else {
                Err(Error::NoSuchRank {
                    rank: r,
                    size: ranks,
                })
            }
        };
        let is_peer = |r: usize| {
            is_rank(r)?;
            if r == rank && !in_group {
                return Err(Error::PeerIsSelf { rank: r });
            }
            Ok(())
        };
        let es = self.dtype().size();
        match *self {
            Self::Send { peer, .. } | Self::Recv { peer, .. } => is_peer(peer)?,
            Self::SendRecv { next, prev, .. } => {
                is_peer(next)?;
                is_peer(prev)?;
            }
            Self::AllToAllv { .. } => return self.check_v(ranks, es).map(|()| 0),
            _ => {
                if let Some(root) = self.root() {
                    is_rank(root)?;
                }
            }
        }
        // The parts the largest buffer holds.
        let parts = match self {
            Self::AllGather { .. }
            | Self::ReduceScatter { .. }
            | Self::AllToAll { .. }
            | Self::Gather { .. }
            | Self::Scatter { .. } => ranks,
            _ => 1,
        };
        let (input, output) = self.buffers();
        let part = bytes(self.count(), es, 1)?;
        bytes(self.count(), es, parts)?;
        let (reads, writes) = match *self {
            Self::Broadcast { root, .. } | Self::Scatter { root, .. } => (rank == root, true),
            Self::Reduce { root, .. } | Self::Gather { root, .. } => (true, rank == root),
            Self::Send { .. } => (true, false),
            Self::Recv { .. } => (false, true),
            _ => (true, true),
        };
        non_null(part > 0 && reads, input, part > 0 && writes, output)?;
        Ok(part)
    }

    /// [`check`](Self::check) of an all-to-all-v: one count and displacement per rank, every
    /// range inside the address space, the buffers not null where a count is not zero.
    fn check_v(&self, ranks: usize, es: usize) -> Result<()> {
        let Self::AllToAllv {
            input,
            output,
            send_counts,
            send_displs,
            recv_counts,
            recv_displs,
            ..
        } = self
        else {
            return Ok(());
        };
        let lists = [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ];
        for (what, v) in lists {
            if v.len() != ranks {
                return Err(Error::PerRankLength {
                    what,
                    len: v.len(),
                    ranks,
                });
            }
        }
        for (counts, displs) in [(send_counts, send_displs), (recv_counts, recv_displs)] {
            for (&c, &d) in counts.iter().zip(displs.iter()) {
                bytes(c.saturating_add(d), es, 1)?;
            }
        }
        let moves = |counts: &[usize]| counts.iter().any(|&c| c > 0);
        non_null(moves(send_counts), *input, moves(recv_counts), *output)
    }
}

/// Bytes of `count` elements of `elem_bytes` times `parts`, or `Error::CountOverflow` (also
/// beyond `isize::MAX`, which no buffer can hold).
pub(crate) fn bytes(count: usize, elem_bytes: usize, parts: usize) -> Result<usize> {
    count
        .checked_mul(elem_bytes)
        .and_then(|b| b.checked_mul(parts))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or(Error::CountOverflow {
            count,
            elem_bytes,
            parts,
        })
}

/// `Error::NullBuffer` for the first of the needed buffers that is null.
fn non_null(
    input_needed: bool,
    input: DevicePtr<u8>,
    output_needed: bool,
    output: DevicePtr<u8>,
) -> Result<()> {
    if input_needed && input.is_null() {
        return Err(Error::NullBuffer { what: "input" });
    }
    if output_needed && output.is_null() {
        return Err(Error::NullBuffer { what: "output" });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: u64) -> DevicePtr<u8> {
        DevicePtr::from_addr(a)
    }

    #[test]
    fn byte_counts_overflow_as_errors() {
        assert_eq!(bytes(10, 4, 3).unwrap(), 120);
        assert_eq!(bytes(0, 8, 8).unwrap(), 0);
        for (c, e, n) in [
            (usize::MAX / 2, 4, 1),
            (1 << 61, 2, 4),
            (isize::MAX as usize / 2 + 1, 2, 1),
        ] {
            assert!(
                matches!(bytes(c, e, n), Err(Error::CountOverflow { count, elem_bytes, parts })
                    if (count, elem_bytes, parts) == (c, e, n)),
                "{c} {e} {n}"
            );
        }
        // The whole output of an all-gather counts, not only one part.
        let ag = Call::AllGather {
            input: p(16),
            output: p(32),
            count: isize::MAX as usize / 6,
            dtype: DataType::F32,
        };
        assert!(matches!(
            ag.check(0, 2, false),
            Err(Error::CountOverflow { parts: 2, .. })
        ));
        assert!(ag.check(0, 1, false).is_ok(), "one part fits");
    }

    #[test]
    fn ranks_and_peers_are_checked() {
        let send = |peer| Call::Send {
            input: p(16),
            count: 4,
            dtype: DataType::U8,
            peer,
        };
        assert_eq!(send(1).check(0, 2, false).unwrap(), 4);
        assert!(matches!(
            send(2).check(0, 2, false),
            Err(Error::NoSuchRank { rank: 2, size: 2 })
        ));
        assert!(matches!(
            send(0).check(0, 2, false),
            Err(Error::PeerIsSelf { rank: 0 })
        ));
        assert!(
            send(0).check(0, 2, true).is_ok(),
            "a group may send to itself"
        );
        let bc = Call::Broadcast {
            input: p(0),
            output: p(16),
            count: 1,
            dtype: DataType::F64,
            root: 3,
        };
        assert!(matches!(
            bc.check(0, 3, false),
            Err(Error::NoSuchRank { rank: 3, .. })
        ));
        let v = Call::AllToAllv {
            input: p(16),
            output: p(32),
            send_counts: vec![1, 2],
            send_displs: vec![0, 1],
            recv_counts: vec![1],
            recv_displs: vec![0, 1],
            dtype: DataType::I32,
        };
        assert!(matches!(
            v.check(0, 2, false),
            Err(Error::PerRankLength {
                what: "recv_counts",
                len: 1,
                ranks: 2
            })
        ));
    }

    #[test]
    fn null_buffers_are_refused_only_where_data_moves() {
        let bc = |rank, input: u64| {
            Call::Broadcast {
                input: p(input),
                output: p(64),
                count: 4,
                dtype: DataType::F32,
                root: 1,
            }
            .check(rank, 2, false)
        };
        assert!(bc(0, 0).is_ok(), "a non-root's broadcast input is not read");
        assert!(matches!(bc(1, 0), Err(Error::NullBuffer { what: "input" })));
        let reduce = |rank| {
            Call::Reduce {
                input: p(16),
                output: p(0),
                count: 4,
                dtype: DataType::F32,
                op: Reduction::Sum,
                root: 0,
            }
            .check(rank, 2, false)
        };
        assert!(reduce(1).is_ok());
        assert!(matches!(
            reduce(0),
            Err(Error::NullBuffer { what: "output" })
        ));
        let empty = Call::AllReduce {
            input: p(0),
            output: p(0),
            count: 0,
            dtype: DataType::F32,
            op: Reduction::Sum,
        };
        assert_eq!(
            empty.check(0, 2, false).unwrap(),
            0,
            "zero elements move nothing"
        );
        let v = |send_counts: Vec<usize>, input| Call::AllToAllv {
            input: p(input),
            output: p(64),
            send_counts,
            send_displs: vec![0, 0],
            recv_counts: vec![0, 1],
            recv_displs: vec![0, 0],
            dtype: DataType::U8,
        };
        assert!(v(vec![0, 0], 0).check(0, 2, false).is_ok());
        assert!(matches!(
            v(vec![0, 1], 0).check(0, 2, false),
            Err(Error::NullBuffer { what: "input" })
        ));
        assert!(matches!(
            Call::AllToAllv {
                input: p(16),
                output: p(16),
                send_counts: vec![1, 1],
                send_displs: vec![0, usize::MAX],
                recv_counts: vec![0, 0],
                recv_displs: vec![0, 0],
                dtype: DataType::U8,
            }
            .check(0, 2, false),
            Err(Error::CountOverflow { .. })
        ));
    }
}
