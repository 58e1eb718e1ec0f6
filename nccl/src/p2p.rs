//! Sends and receives: NCCL's argument checks ([`p2p_op`]), the check that a group's sends to
//! and receives from the rank itself pair up ([`check_self_pairs`]), and [`record`], which
//! records one in a [`Group`] of the library's collectives.
//!
//! NCCL runs every send and receive of a group at once; so does the library's `Group`: its
//! point-to-point engine progresses all of a group's sends and receives together (any peers,
//! any order, the rank itself, zero counts), pairing the k-th send from `a` to `b` with the
//! k-th receive at `b` from `a`, as NCCL matches them. A receive of another size than its
//! send fails on the receiving rank (`ncclInvalidUsage` from that call or the next, and
//! `ncclCommGetAsyncError`).

use std::ffi::{c_int, c_void};

use mscclpp::collectives::Group;
use mscclpp::shared::{DataType, DevicePtr};

use crate::abi;
use crate::collectives::{buffer, bytes, rank_arg};
use crate::comm::Comm;
use crate::error::NcclError;

/// Send or receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// `ncclSend`.
    Send,
    /// `ncclRecv`.
    Recv,
}

/// One `ncclSend` / `ncclRecv` (addresses as integers).
#[derive(Clone, Copy, Debug)]
pub struct P2p {
    /// Which.
    pub dir: Dir,
    /// The buffer.
    pub buf: u64,
    /// Elements.
    pub count: usize,
    /// Type.
    pub dtype: DataType,
    /// The peer.
    pub peer: usize,
    /// The caller's stream.
    pub stream: u64,
}

impl P2p {
    fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

/// `ncclSend` / `ncclRecv`'s checks.
pub fn p2p_op(
    c: &Comm,
    dir: Dir,
    buf: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    stream: *mut c_void,
) -> Result<P2p, NcclError> {
    let dtype = abi::data_type(dtype)?;
    let peer = rank_arg("peer", peer, c.nranks)?;
    let what = if dir == Dir::Send {
        "sendbuff"
    } else {
        "recvbuff"
    };
    let n = bytes(count, dtype.size(), 1)? > 0;
    Ok(P2p {
        dir,
        buf: buffer(buf, what, n)?,
        count,
        dtype,
        peer,
        stream: stream as u64,
    })
}

/// Checks, before anything of a group runs, that one communicator's sends to itself and
/// receives from itself (in call order, `ops`) pair up: as many of each, pairwise of equal
/// bytes. The library's `Group::end` refuses such a group too, but only for the communicator
/// it ends; checked here for every communicator of an NCCL group first, a group that cannot
/// run leaves every stream untouched.
pub fn check_self_pairs(rank: usize, ops: &[P2p]) -> Result<(), NcclError> {
    let to_me: Vec<&P2p> = ops
        .iter()
        .filter(|o| o.dir == Dir::Send && o.peer == rank)
        .collect();
    let from_me: Vec<&P2p> = ops
        .iter()
        .filter(|o| o.dir == Dir::Recv && o.peer == rank)
        .collect();
    if to_me.len() != from_me.len() {
        return Err(NcclError::P2pUnmatched {
            why: format!(
                "{} sends to itself and {} receives from itself in one group",
                to_me.len(),
                from_me.len()
            ),
        });
    }
    for (send, recv) in to_me.iter().zip(&from_me) {
        if send.bytes() != recv.bytes() {
            return Err(NcclError::P2pUnmatched {
                why: format!(
                    "a send to itself of {} bytes meets a receive from itself of {}",
                    send.bytes(),
                    recv.bytes()
                ),
            });
        }
    }
    Ok(())
}

/// Records `op` in `g`, a group of the library's collectives of the op's communicator.
pub fn record(g: &mut Group<'_>, op: &P2p) -> Result<(), NcclError> {
    let buf = DevicePtr::<u8>::from_addr(op.buf);
    // SAFETY: NCCL's contract: the buffer holds `count` elements until the work queued on the
    // caller's stream completes; the peer makes the matching call.
    let r = unsafe {
        match op.dir {
            Dir::Send => g.send(buf, op.count, op.dtype, op.peer),
            Dir::Recv => g.recv(buf, op.count, op.dtype, op.peer),
        }
    };
    r.map_err(NcclError::library(match op.dir {
        Dir::Send => "ncclSend",
        Dir::Recv => "ncclRecv",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(dir: Dir, peer: usize, count: usize) -> P2p {
        P2p {
            dir,
            buf: 0x1000 + peer as u64 * 0x100,
            count,
            dtype: DataType::F32,
            peer,
            stream: 0,
        }
    }

    #[test]
    fn sends_to_itself_must_pair() {
        let me = [
            op(Dir::Recv, 2, 8),
            op(Dir::Send, 2, 8),
            op(Dir::Send, 1, 3),
        ];
        assert!(check_self_pairs(2, &me).is_ok());
        // Sends to others need no partner here.
        assert!(check_self_pairs(0, &[op(Dir::Send, 1, 3)]).is_ok());
        for bad in [
            vec![op(Dir::Send, 0, 3)],
            vec![op(Dir::Recv, 0, 3)],
            vec![op(Dir::Send, 0, 3), op(Dir::Recv, 0, 2)],
            vec![
                op(Dir::Send, 0, 3),
                op(Dir::Send, 0, 2),
                op(Dir::Recv, 0, 2),
                op(Dir::Recv, 0, 3),
            ],
        ] {
            assert!(
                matches!(
                    check_self_pairs(0, &bad),
                    Err(NcclError::P2pUnmatched { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
