//! Sends and receives: NCCL's argument checks ([`p2p_op`]), and [`plan`] + [`run`], which map
//! one communicator's sends and receives of a group (or a lone one) onto the library's
//! `send`, `recv` and `send_recv`.
//!
//! NCCL runs every send and receive of a group at once. The library offers sends and receives
//! that run one after the other on a stream, each waiting for its peer's matching call, and
//! `send_recv` (a send to `next` and a receive from `prev` that move together), so a group is
//! run in NCCL's own schedule of rounds: in round `k` (1 to `nranks - 1`) this rank sends to
//! `rank + k` and receives from `rank - k` (mod `nranks`), which is the round in which those
//! peers receive from and send to it, so every pair meets in the same round. Inside a round
//! the sends of the ranks form cycles (`i -> i + k`; the cycle of `i` is `i + gcd(nranks, k) *
//! Z`): the smallest rank of each cycle (`rank < gcd(nranks, k)`) receives first and every
//! other rank sends first, so no cycle waits on itself and every chain unwinds from its end.
//! Several sends to (receives from) one peer keep their order, as NCCL matches them. Sends to
//! and receives from the rank itself are copies, paired in order. On two ranks a round with
//! one send and one receive of the same size is one `send_recv` (the library's fastest
//! exchange, which orders its halves by rank parity, right for two ranks). Every shape NCCL
//! allows is served this way.

use std::ffi::{c_int, c_void};

use mscclpp::host::gpu::Stream;
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

/// One step of a plan.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// A send to and a receive from this rank: a copy.
    Copy {
        /// The send.
        send: P2p,
        /// The receive.
        recv: P2p,
    },
    /// A round of two ranks with one send and one receive of one size: one `send_recv`.
    Exchange {
        /// To the peer.
        send: P2p,
        /// From the peer.
        recv: P2p,
    },
    /// One send or receive.
    One(P2p),
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The steps that run `ops` (one communicator's sends and receives, in call order) on rank
/// `rank` of `nranks` (module docs).
pub fn plan(rank: usize, nranks: usize, ops: &[P2p]) -> Result<Vec<Step>, NcclError> {
    let mut sends: Vec<Vec<P2p>> = vec![Vec::new(); nranks];
    let mut recvs: Vec<Vec<P2p>> = vec![Vec::new(); nranks];
    for op in ops {
        match op.dir {
            Dir::Send => sends[op.peer].push(*op),
            Dir::Recv => recvs[op.peer].push(*op),
        }
    }
    let mut steps = Vec::new();
    let (to_me, from_me) = (&sends[rank], &recvs[rank]);
    if to_me.len() != from_me.len() {
        return Err(NcclError::P2pUnmatched {
            why: format!(
                "{} sends to itself and {} receives from itself in one group",
                to_me.len(),
                from_me.len()
            ),
        });
    }
    for (send, recv) in to_me.iter().zip(from_me) {
        if send.bytes() != recv.bytes() {
            return Err(NcclError::P2pUnmatched {
                why: format!(
                    "a send to itself of {} bytes meets a receive from itself of {}",
                    send.bytes(),
                    recv.bytes()
                ),
            });
        }
        steps.push(Step::Copy {
            send: *send,
            recv: *recv,
        });
    }
    for k in 1..nranks {
        let (s, r) = (
            &sends[(rank + k) % nranks],
            &recvs[(rank + nranks - k) % nranks],
        );
        if let ([send], [recv], 2) = (s.as_slice(), r.as_slice(), nranks)
            && send.dtype == recv.dtype
            && send.count == recv.count
        {
            steps.push(Step::Exchange {
                send: *send,
                recv: *recv,
            });
            continue;
        }
        let (first, second) = if rank < gcd(nranks, k) {
            (r, s)
        } else {
            (s, r)
        };
        steps.extend(first.iter().chain(second).map(|op| Step::One(*op)));
    }
    Ok(steps)
}

/// Queues `steps` on `c`, in order, on `stream` (every step of a batch runs on one stream:
/// `group.rs` joins the callers' streams).
pub fn run(c: &Comm, steps: &[Step], stream: &Stream) -> Result<(), NcclError> {
    let p = DevicePtr::<u8>::from_addr;
    for step in steps {
        match *step {
            Step::Copy { send, recv } => {
                if send.buf != recv.buf && send.bytes() > 0 {
                    // SAFETY: NCCL's contract: both buffers hold `bytes` until the queued work
                    // completes; a send and a receive of one rank do not overlap unless equal.
                    unsafe { stream.copy_dtod(p(recv.buf), p(send.buf), send.bytes()) }
                        .map_err(NcclError::library("a send to itself"))?;
                }
            }
            Step::Exchange { send, recv } => {
                // SAFETY: NCCL's contract: the buffers hold `count` elements until the queued
                // work completes; the peers run the matching round (module docs).
                unsafe {
                    c.coll.send_recv(
                        p(send.buf),
                        send.peer,
                        p(recv.buf),
                        recv.peer,
                        send.count,
                        send.dtype,
                        stream,
                    )
                }
                .map_err(NcclError::library("grouped ncclSend and ncclRecv"))?
            }
            Step::One(op) => {
                // SAFETY: as above, for one buffer.
                let r = unsafe {
                    match op.dir {
                        Dir::Send => c.coll.send(p(op.buf), op.count, op.dtype, op.peer, stream),
                        Dir::Recv => c.coll.recv(p(op.buf), op.count, op.dtype, op.peer, stream),
                    }
                };
                r.map_err(NcclError::library(match op.dir {
                    Dir::Send => "ncclSend",
                    Dir::Recv => "ncclRecv",
                }))?
            }
        }
    }
    Ok(())
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

    fn shape(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::Copy { .. } => "copy".to_string(),
                Step::Exchange { send, recv } => format!("x{}/{}", send.peer, recv.peer),
                Step::One(o) => format!("{:?}{}", o.dir, o.peer),
            })
            .collect()
    }

    #[test]
    fn an_all_to_all_runs_round_by_round() {
        // Rank 1 of 4, every peer and itself, 5 elements each. Round 1 (cycle of 4, rank 1
        // is not its smallest): send to 2 first; round 2 (cycles {0, 2}, {1, 3}, rank 1 is
        // the smallest of its own): receive from 3 first; round 3: send to 0 first.
        let ops: Vec<P2p> = (0..4)
            .flat_map(|q| [op(Dir::Send, q, 5), op(Dir::Recv, q, 5)])
            .collect();
        let steps = plan(1, 4, &ops).unwrap();
        assert_eq!(
            shape(&steps),
            ["copy", "Send2", "Recv0", "Recv3", "Send3", "Send0", "Recv2"]
        );
        // Rank 0 is the smallest of every cycle: it receives first in every round.
        let steps = plan(0, 4, &ops).unwrap();
        assert_eq!(
            shape(&steps),
            ["copy", "Recv3", "Send1", "Recv2", "Send2", "Recv1", "Send3"]
        );
    }

    #[test]
    fn two_ranks_exchange_and_uneven_shapes_run_one_by_one() {
        let pair = [op(Dir::Recv, 1, 8), op(Dir::Send, 1, 8)];
        assert_eq!(shape(&plan(0, 2, &pair).unwrap()), ["x1/1"]);
        // Different sizes: one by one, rank 0 receiving first, rank 1 sending first.
        let uneven = [op(Dir::Send, 1, 3), op(Dir::Recv, 1, 4)];
        assert_eq!(shape(&plan(0, 2, &uneven).unwrap()), ["Recv1", "Send1"]);
        assert_eq!(
            shape(&plan(1, 2, &[op(Dir::Send, 0, 4), op(Dir::Recv, 0, 3)]).unwrap()),
            ["Send0", "Recv0"]
        );
        // Two sends to one peer keep their order.
        let twice = [op(Dir::Send, 2, 3), op(Dir::Send, 2, 5)];
        let steps = plan(0, 3, &twice).unwrap();
        let counts: Vec<usize> = steps
            .iter()
            .map(|s| match s {
                Step::One(o) => o.count,
                _ => 0,
            })
            .collect();
        assert_eq!(counts, [3, 5]);
        // Lone ones.
        assert_eq!(
            shape(&plan(2, 3, &[op(Dir::Recv, 0, 3)]).unwrap()),
            ["Recv0"]
        );
    }

    #[test]
    fn sends_to_itself_must_pair() {
        let me = [op(Dir::Recv, 2, 8), op(Dir::Send, 2, 8)];
        assert_eq!(shape(&plan(2, 4, &me).unwrap()), ["copy"]);
        assert!(matches!(
            plan(0, 2, &[op(Dir::Send, 0, 3)]),
            Err(NcclError::P2pUnmatched { .. })
        ));
        assert!(matches!(
            plan(0, 2, &[op(Dir::Send, 0, 3), op(Dir::Recv, 0, 2)]),
            Err(NcclError::P2pUnmatched { .. })
        ));
    }
}
