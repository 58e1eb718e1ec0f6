//! Sends and receives: NCCL's argument checks ([`send`], [`recv`]: the library's
//! [`Call::Send`] / [`Call::Recv`]) and the check that a group's sends to and receives from
//! the rank itself pair up ([`check_self_pairs`]).
//!
//! NCCL runs every send and receive of a group at once; so does the library's `Group`: its
//! point-to-point engine progresses all of a group's sends and receives together (any peers,
//! any order, the rank itself, zero counts), pairing the k-th send from `a` to `b` with the
//! k-th receive at `b` from `a`, as NCCL matches them. A receive of another size than its
//! send fails on the receiving rank (`ncclInvalidUsage` from that call or the next, and
//! `ncclCommGetAsyncError`).

use std::ffi::{c_int, c_void};

use mscclpp::collectives::Call;

use crate::args::{data_type, ptr, rank_arg};
use crate::comm::{Checked, Comm};
use crate::error::NcclError;

/// `ncclSend`'s checks.
pub fn send(
    c: &Comm,
    buf: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
) -> Result<Checked, NcclError> {
    one_way(c, true, buf, count, dtype, peer)
}

/// `ncclRecv`'s checks.
pub fn recv(
    c: &Comm,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
) -> Result<Checked, NcclError> {
    one_way(c, false, buf, count, dtype, peer)
}

/// A send (`send`) or a receive of `count` elements of `buf` with `peer`.
fn one_way(
    c: &Comm,
    send: bool,
    buf: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
) -> Result<Checked, NcclError> {
    let dtype = data_type(dtype)?;
    let peer = rank_arg("peer", peer, c.nranks)?;
    let buf = ptr(buf);
    if send {
        let input = buf;
        c.check(
            "ncclSend",
            Call::Send {
                input,
                count,
                dtype,
                peer,
            },
        )
    } else {
        let output = buf;
        c.check(
            "ncclRecv",
            Call::Recv {
                output,
                count,
                dtype,
                peer,
            },
        )
    }
}

/// Checks, before anything of a group runs, that one communicator's sends to itself and
/// receives from itself (in call order, among `calls`) pair up: as many of each, pairwise of
/// equal bytes. The library's `Group::end` refuses such a group too, but only for the
/// communicator it ends; checked here for every communicator of an NCCL group first, a group
/// that cannot run leaves every stream untouched.
pub fn check_self_pairs<'a>(
    rank: usize,
    calls: impl IntoIterator<Item = &'a Call>,
) -> Result<(), NcclError> {
    let (mut to_me, mut from_me) = (Vec::new(), Vec::new());
    for call in calls {
        match *call {
            Call::Send {
                count, dtype, peer, ..
            } if peer == rank => to_me.push(count * dtype.size()),
            Call::Recv {
                count, dtype, peer, ..
            } if peer == rank => from_me.push(count * dtype.size()),
            _ => {}
        }
    }
    if to_me.len() != from_me.len() {
        return Err(NcclError::P2pUnmatched {
            why: format!(
                "{} sends to itself and {} receives from itself in one group",
                to_me.len(),
                from_me.len()
            ),
        });
    }
    for (sent, received) in to_me.iter().zip(&from_me) {
        if sent != received {
            return Err(NcclError::P2pUnmatched {
                why: format!(
                    "a send to itself of {sent} bytes meets a receive from itself of {received}"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp::shared::{DataType, DevicePtr};

    fn op(send: bool, peer: usize, count: usize) -> Call {
        let buf = DevicePtr::from_addr(0x1000 + peer as u64 * 0x100);
        let dtype = DataType::F32;
        if send {
            Call::Send {
                input: buf,
                count,
                dtype,
                peer,
            }
        } else {
            Call::Recv {
                output: buf,
                count,
                dtype,
                peer,
            }
        }
    }

    #[test]
    fn sends_to_itself_must_pair() {
        let (s, r) = (true, false);
        let me = [op(r, 2, 8), op(s, 2, 8), op(s, 1, 3)];
        assert!(check_self_pairs(2, &me).is_ok());
        // Sends to others need no partner here.
        assert!(check_self_pairs(0, &[op(s, 1, 3)]).is_ok());
        for bad in [
            vec![op(s, 0, 3)],
            vec![op(r, 0, 3)],
            vec![op(s, 0, 3), op(r, 0, 2)],
            vec![op(s, 0, 3), op(s, 0, 2), op(r, 0, 2), op(r, 0, 3)],
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
