//! Sends and receives: NCCL's argument checks ([`p2p_op`]), and [`plan`] + [`run`], which map
//! one communicator's sends and receives of a group (or a lone one) onto the library's
//! `send`, `recv` and `send_recv`.
//!
//! NCCL runs every send and receive of a group at once. The library offers a lone `send` /
//! `recv` and `send_recv` (a send to `next` and a receive from `prev` that move together), so
//! a group is run in NCCL's own schedule of rounds: in round `k` (1 to `nranks - 1`) this rank
//! sends to `rank + k` and receives from `rank - k` (mod `nranks`), which is the round in
//! which those peers receive from and send to it, so every pair meets in the same round. A
//! round's send and receive run as one `send_recv`. Sends to and receives from itself are
//! copies. What this serves, by NCCL's rule that each receive matches the peer's send in
//! count and type:
//!
//! - every round that has a send or a receive has both, of the same type and count (an
//!   all-to-all by sends and receives, a ring exchange, a pairwise exchange): `send_recv`s;
//! - a single send or receive to one peer (with any copies to itself): `send` / `recv`.
//!
//! Other shapes (rounds with sends and receives of different sizes, several sends to one
//! peer in one group) wait for the library's grouped sends and receives:
//! [`NcclError::P2pShapeNotServed`].

use std::ffi::{c_int, c_void};

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
    /// One round's send and receive, as one `send_recv`.
    Exchange {
        /// To `rank + k`.
        send: P2p,
        /// From `rank - k`.
        recv: P2p,
    },
    /// A lone send or receive.
    One(P2p),
}

/// The steps that run `ops` (one communicator's sends and receives, in call order) on rank
/// `rank` of `nranks` (module docs).
pub fn plan(rank: usize, nranks: usize, ops: &[P2p]) -> Result<Vec<Step>, NcclError> {
    let mut sends: Vec<Option<P2p>> = vec![None; nranks];
    let mut recvs: Vec<Option<P2p>> = vec![None; nranks];
    for op in ops {
        let slot = match op.dir {
            Dir::Send => &mut sends[op.peer],
            Dir::Recv => &mut recvs[op.peer],
        };
        if slot.is_some() {
            return Err(NcclError::P2pShapeNotServed {
                why: format!(
                    "more than one {} {} rank {} in one group",
                    if op.dir == Dir::Send {
                        "send"
                    } else {
                        "receive"
                    },
                    if op.dir == Dir::Send { "to" } else { "from" },
                    op.peer
                ),
            });
        }
        *slot = Some(*op);
    }
    let mut steps = Vec::new();
    match (sends[rank].take(), recvs[rank].take()) {
        (None, None) => {}
        (Some(send), Some(recv)) if send.bytes() == recv.bytes() => {
            steps.push(Step::Copy { send, recv })
        }
        (Some(s), Some(r)) => {
            return Err(NcclError::P2pUnmatched {
                why: format!(
                    "the send to itself moves {} bytes, the receive from itself {}",
                    s.bytes(),
                    r.bytes()
                ),
            });
        }
        (s, _) => {
            return Err(NcclError::P2pUnmatched {
                why: format!(
                    "a {} itself without the matching {} in the same group",
                    if s.is_some() {
                        "send to"
                    } else {
                        "receive from"
                    },
                    if s.is_some() { "receive" } else { "send" },
                ),
            });
        }
    }
    let rounds: Vec<(Option<P2p>, Option<P2p>)> = (1..nranks)
        .map(|k| {
            (
                sends[(rank + k) % nranks],
                recvs[(rank + nranks - k) % nranks],
            )
        })
        .filter(|(s, r)| s.is_some() || r.is_some())
        .collect();
    let paired = rounds.iter().all(|(s, r)| match (s, r) {
        (Some(s), Some(r)) => s.dtype == r.dtype && s.count == r.count,
        _ => false,
    });
    if paired {
        for (s, r) in rounds {
            if let (Some(send), Some(recv)) = (s, r) {
                steps.push(Step::Exchange { send, recv });
            }
        }
        return Ok(steps);
    }
    let lone: Vec<P2p> = rounds
        .iter()
        .flat_map(|(s, r)| s.iter().chain(r.iter()).copied())
        .collect();
    match lone.as_slice() {
        [one] => {
            steps.push(Step::One(*one));
            Ok(steps)
        }
        _ => Err(NcclError::P2pShapeNotServed {
            why: format!(
                "{} sends and receives to {} peers whose rounds do not pair a send and a receive of one size",
                lone.len(),
                nranks - 1
            ),
        }),
    }
}

/// Runs `steps` on `c`.
pub fn run(c: &Comm, steps: &[Step]) -> Result<(), NcclError> {
    let p = DevicePtr::<u8>::from_addr;
    for step in steps {
        match *step {
            Step::Copy { send, recv } => joined(c, recv.stream, send.stream, |s| {
                if send.buf == recv.buf || send.bytes() == 0 {
                    return Ok(());
                }
                // SAFETY: NCCL's contract: both buffers hold `bytes` until the queued work
                // completes; a send and a receive of one rank do not overlap unless equal.
                unsafe { s.copy_dtod(p(recv.buf), p(send.buf), send.bytes()) }
                    .map_err(NcclError::library("a send to itself"))
            })?,
            Step::Exchange { send, recv } => joined(c, send.stream, recv.stream, |s| {
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
                        s,
                    )
                }
                .map_err(NcclError::library("grouped ncclSend and ncclRecv"))
            })?,
            Step::One(op) => {
                let s = c.stream(op.stream as *mut c_void)?;
                // SAFETY: as above, for one buffer.
                let r = unsafe {
                    match op.dir {
                        Dir::Send => c.coll.send(p(op.buf), op.count, op.dtype, op.peer, &s),
                        Dir::Recv => c.coll.recv(p(op.buf), op.count, op.dtype, op.peer, &s),
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

/// Runs `f` on stream `a`, ordered after the work queued so far on stream `b` too, and makes
/// `b`'s later work wait for it (two events; nothing when `a` and `b` are one stream, as on
/// the CPU backend).
fn joined(
    c: &Comm,
    a: u64,
    b: u64,
    f: impl FnOnce(&mscclpp::host::gpu::Stream) -> Result<(), NcclError>,
) -> Result<(), NcclError> {
    let sa = c.stream(a as *mut c_void)?;
    if a == b || matches!(sa, crate::comm::CallStream::Own(_)) {
        return f(&sa);
    }
    let sb = c.stream(b as *mut c_void)?;
    let g = c.gpu();
    let ev = || g.event().map_err(NcclError::library("joining two streams"));
    let before = ev()?;
    sb.record(&before)
        .and_then(|()| sa.wait_event(&before))
        .map_err(NcclError::library("joining two streams"))?;
    f(&sa)?;
    let after = ev()?;
    sa.record(&after)
        .and_then(|()| sb.wait_event(&after))
        .map_err(NcclError::library("joining two streams"))
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
    fn an_all_to_all_pairs_every_round() {
        // Rank 1 of 4, every peer and itself, 5 elements each.
        let ops: Vec<P2p> = (0..4)
            .flat_map(|q| [op(Dir::Send, q, 5), op(Dir::Recv, q, 5)])
            .collect();
        let steps = plan(1, 4, &ops).unwrap();
        assert_eq!(shape(&steps), ["copy", "x2/0", "x3/3", "x0/2"]);
    }

    #[test]
    fn lone_sends_and_ring_exchanges() {
        assert_eq!(
            shape(&plan(0, 2, &[op(Dir::Send, 1, 3)]).unwrap()),
            ["Send1"]
        );
        assert_eq!(
            shape(&plan(2, 3, &[op(Dir::Recv, 0, 3)]).unwrap()),
            ["Recv0"]
        );
        // Ring: send to the next, receive from the previous.
        let ring = [op(Dir::Send, 3, 8), op(Dir::Recv, 1, 8)];
        assert_eq!(shape(&plan(2, 4, &ring).unwrap()), ["x3/1"]);
        // Self only.
        let me = [op(Dir::Recv, 2, 8), op(Dir::Send, 2, 8)];
        assert_eq!(shape(&plan(2, 4, &me).unwrap()), ["copy"]);
    }

    #[test]
    fn other_shapes_say_why() {
        // Different sizes in one round.
        let uneven = [op(Dir::Send, 1, 3), op(Dir::Recv, 1, 4)];
        assert!(matches!(
            plan(0, 2, &uneven),
            Err(NcclError::P2pShapeNotServed { .. })
        ));
        // Two sends to one peer.
        let twice = [op(Dir::Send, 1, 3), op(Dir::Send, 1, 3)];
        assert!(matches!(
            plan(0, 2, &twice),
            Err(NcclError::P2pShapeNotServed { .. })
        ));
        // A send to itself without its receive.
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
