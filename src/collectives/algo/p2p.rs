//! `p2p`: the point-to-point engine. Every `send`, `recv` and `send_recv`, and every
//! collective built of sends and receives (gather, scatter, all-to-all-v, a group's
//! point-to-point operations), runs here: a batch of [`Transfer`]s to any peers, queued on one
//! stream and run together by `p2p_kernel` (`mscclpp_device::collectives::p2p`; the protocol
//! and the scratch layout are in `mscclpp_shared::p2p`).
//!
//! - Each pair of ranks keeps its own sequence numbers and counters in device memory, so only
//!   the two ranks of a transfer take part in it (ranks outside a batch launch nothing) and a
//!   call captured in a CUDA graph replays correctly. No call makes a host round trip: the
//!   first in which two ranks meet allocates this rank's point-to-point region (once, for
//!   every peer: `P2pLayout::bytes`) and sends it to the peer, whose registration service
//!   sends its own back; the launch waits on its stream until they are traded ([`region`],
//!   `regions.rs`; under CUDA-graph capture the host waits instead), so a communicator that
//!   never sends holds none.
//! - The sender's byte count travels in every message's header; a receive posted with another
//!   count consumes the message, writes nothing and records `Error::CountMismatch` (what the
//!   receiving rank's next call, or `comm.status().error()`, returns).
//! - Messages up to `p2p_ll_bytes` go as LL16 packets (one block); larger ones in chunks of
//!   `p2p_chunk_bytes` on `p2p_lanes` lanes (a block each), double-buffered per lane.
//! - Sends to this rank itself pair with its receives from itself in order (the k-th with the
//!   k-th; their sizes are checked here, `Error::SelfMismatch`) and are copies on the stream.
//!
//! The schedule ([`schedule`]): the k-th transfer to (or from) a peer goes into round k; in a
//! round, a send to the rank `d` places ahead (`d = peer - rank mod n`) and a receive from the
//! rank `d` places behind share launch `(d - 1) / 8`, whose table holds a send and a receive
//! for each of its 8 distances. Both ends of a message compute the same (round, launch) for it,
//! and every rank runs its launches in that order, so every launch waits only for peers that
//! run the same launch, all of whose blocks are resident together: no ordering of sends and
//! receives (such as "even ranks send first") can deadlock it, whatever the pairs.
//!
//! Teardown ([`drain`], this unit's `tear_down`, run when the `Collectives` owning the region
//! is dropped, before its memory goes): a receiver acknowledges in its *sender's* scratch,
//! possibly after the sender's call returned; before the scratch is freed, the sender waits
//! (at most [`DRAIN_TIMEOUT`]) until every acknowledgement its sends are owed has landed
//! (`mscclpp_shared::p2p`, "Teardown"). When one has not by then (a receive never posted, a
//! dead or very slow peer), the region is never freed (`LazyRegions::abandon`): a late
//! acknowledgement must land in live memory, not in memory freed and reused (which faulted
//! the CPU backend's process under load, and would fault the peer's kernel on a GPU).
//!
//! The calls made of sends and receives (gather, scatter, all-to-all-v) become batches here
//! too ([`batch_of`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_host::backoff::Backoff;
use mscclpp_host::gpu::{BackendKind, DeviceBuffer, Kernel, LaunchConfig, Stream};
use mscclpp_host::{Error, Result};
use mscclpp_shared::p2p::state;
use mscclpp_shared::{DevicePtr, P2P_MAX_OPS, P2P_RECV, P2P_SEND, P2pLayout, P2pOp, P2pParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::call::Call;
use crate::collectives::context::{Args, Context, Peer, SetUp, copy_if_needed, current_call};
use crate::collectives::regions::Peers;
use crate::collectives::scratch::Region;
use crate::collectives::unit::{CollectiveAlgorithm, Queued, Step};
use crate::kernels;

/// Whether a [`Transfer`] sends or receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// From `buf` to the peer.
    Send,
    /// From the peer into `buf`.
    Recv,
}

/// One send or receive of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Transfer {
    /// Send or receive.
    pub dir: Dir,
    /// The peer (this rank itself: a copy, paired with a transfer the other way).
    pub peer: usize,
    /// Input (send) or output (receive), `bytes` long.
    pub buf: DevicePtr<u8>,
    /// Bytes.
    pub bytes: usize,
}

impl Transfer {
    /// A send of `bytes` at `buf` to `peer`.
    pub fn send(peer: usize, buf: DevicePtr<u8>, bytes: usize) -> Self {
        Self {
            dir: Dir::Send,
            peer,
            buf,
            bytes,
        }
    }

    /// A receive of `bytes` into `buf` from `peer`.
    pub fn recv(peer: usize, buf: DevicePtr<u8>, bytes: usize) -> Self {
        Self {
            dir: Dir::Recv,
            peer,
            buf,
            bytes,
        }
    }
}

/// Peers whose distances share a launch (the op table holds a send and a receive for each).
const DISTANCES_PER_LAUNCH: usize = P2P_MAX_OPS / 2;

pub(crate) struct P2p {
    kernel: Kernel<P2pParams>,
}

impl CollectiveAlgorithm for P2p {
    const ALGORITHM: Algorithm = Algorithm::P2p;
    const NAME: &'static str = "p2p";
    const ALIASES: &'static [&'static str] = &["point-to-point"];
    // Point-to-point calls take no algorithm: nothing can be forced onto this one.
    const SERVES: &'static [Collective] = &[];
    const NOT_SERVED: &'static str = "the point-to-point engine for a collective (it serves \
                                      send, recv, send_recv, gather, scatter, all_to_allv and \
                                      groups, which choose it themselves)";
    const POINT_TO_POINT: bool = true;
    const SCRATCH: &'static [Region] = &[Region::P2p];

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            kernel: s.kernel(kernels::P2P)?,
        })
    }

    /// Waits (bounded) for the acknowledgements the peers still owe this rank's last sends,
    /// which they store into its point-to-point region, if it was allocated ([`drain`]).
    fn tear_down(&self, cx: &Context) {
        let lay = cx.layout.p2p();
        let me = cx.rank() as u64;
        let drained = cx
            .regions
            .with_buffer(Region::P2p, |b| drain(b, 0, &lay, me));
        if drained == Some(false) {
            let bytes = cx.regions.abandon(Region::P2p);
            tracing::warn!(
                rank = me,
                bytes,
                "p2p teardown: the point-to-point region stays allocated (a peer may still \
                 acknowledge into it)"
            );
        }
    }

    fn queue(&self, cx: &Context, args: &Args, _: &Step, stream: &Stream) -> Result<Queued> {
        let bytes = args.call.bytes;
        let send = |peer| Transfer::send(peer, args.input, bytes);
        let recv = |peer| Transfer::recv(peer, args.output, bytes);
        let batch = match args.peer {
            Peer::To(q) => vec![send(q)],
            Peer::From(q) => vec![recv(q)],
            Peer::Pair { next, prev } => vec![send(next), recv(prev)],
            Peer::None | Peer::Root(_) => return Err(cx.cannot(Self::NOT_SERVED)),
        };
        self.queue_batch(cx, &batch, stream)?;
        Ok(Queued::Ran)
    }
}

impl P2p {
    /// Queues `batch` on `stream` (module docs). Every transfer's peer is a rank of the
    /// communicator (the callers check).
    pub fn queue_batch(&self, cx: &Context, batch: &[Transfer], stream: &Stream) -> Result<()> {
        let me = cx.rank();
        let copies = self_pairs(me, batch)?;
        cx.ensure_healthy()?;
        let region = region(cx, &peers_of(me, batch), stream)?;
        cx.record(Algorithm::P2p);
        for (dst, src, bytes) in copies {
            if bytes > 0 {
                // SAFETY: the callers' contract (both hold `bytes` until the stream reaches
                // this copy's end).
                unsafe { copy_if_needed(stream, dst, src, bytes)? };
            }
        }
        let Some((scratch, table)) = region else {
            return Ok(());
        };
        let base = cx.p2p_params(scratch, table);
        let ll = base.ll_bytes as usize;
        let lanes = base.lanes;
        for (_, ops) in schedule(me, cx.ranks(), batch) {
            let mut p = base;
            let mut blocks = 0;
            for (slot, t) in p.ops.iter_mut().zip(&ops) {
                let n = if t.bytes <= ll { 1 } else { lanes };
                *slot = P2pOp {
                    buf: t.buf,
                    bytes: t.bytes as u64,
                    peer: t.peer as u32,
                    kind: match t.dir {
                        Dir::Send => P2P_SEND,
                        Dir::Recv => P2P_RECV,
                    },
                    first_block: blocks,
                    blocks: n,
                };
                blocks += n;
            }
            p.nops = ops.len() as u32;
            p.trace = cx.comm.trace().launch(current_call());
            let shape = LaunchConfig::new(blocks, cx.cfg.p2p_threads);
            // SAFETY: the callers' contract (every buffer holds its bytes until the queued work
            // completes); the scratch and the channel table live as long as the `Collectives`.
            unsafe { stream.launch(&self.kernel, shape, p) }?;
        }
        Ok(())
    }
}

/// The other ranks `batch` meets, each once, in order.
pub(crate) fn peers_of(me: usize, batch: &[Transfer]) -> Vec<usize> {
    let mut peers: Vec<usize> = batch.iter().map(|t| t.peer).filter(|&q| q != me).collect();
    peers.sort_unstable();
    peers.dedup();
    peers
}

/// This rank's point-to-point region and its channel table for a launch with `peers` on
/// `stream` (`regions.rs`: sent to the peers it was not sent to yet; the launch waits for the
/// peers' to be traded); `None` when `peers` is empty (a batch of copies to this rank itself
/// needs no region).
pub(crate) fn region(
    cx: &Context,
    peers: &[usize],
    stream: &Stream,
) -> Result<Option<(DevicePtr<u8>, DevicePtr<u8>)>> {
    if peers.is_empty() {
        return Ok(None);
    }
    match cx
        .regions
        .get(Region::P2p, Peers::Some(peers.to_vec()), stream)?
    {
        Some(region) => Ok(Some(region)),
        None => Err(cx.cannot("a point-to-point call without a point-to-point region")),
    }
}

/// Longest a dropped `Collectives` waits for the acknowledgements its last sends are owed
/// ([`drain`]); a receiver that never posted its receive, or died, costs this much at drop.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// An acknowledgement a peer still owes this rank's sends: (peer, lane, which word, the value
/// owed, the value seen).
type Owed = (u64, u64, &'static str, u64, u64);

/// Waits, at most [`DRAIN_TIMEOUT`], until every peer this rank sent to has acknowledged all
/// it was sent: for every peer `q` and lane `l`, `hdr_done(q, l) >= send_seq` and
/// `chunk_done(q, l) >= send_chunks` (this rank's own words, region `lay` at `offset` of
/// `scratch`). A pair never used has all four words 0 and costs nothing. Called before the
/// scratch is freed, when this rank's queued work has completed (the caller's contract for
/// dropping a `Collectives`). Never fails: a read that fails, or a wait that expires, is
/// logged (`tracing::warn!`) and `false` returned: a peer may still write its
/// acknowledgements into the scratch, which the caller must then not free
/// (`LazyRegions::abandon`). `true`: nothing is owed, the scratch may go.
pub(crate) fn drain(scratch: &DeviceBuffer, offset: u64, lay: &P2pLayout, me: u64) -> bool {
    if lay.nranks < 2 || offset + lay.bytes() > scratch.len() as u64 {
        return true;
    }
    // The acknowledgements and the state: everything after the inboxes.
    let first = lay.hdr_done(0, 0);
    let words = ((lay.bytes() - first) / 8) as usize;
    let mut buf = vec![0u64; words];
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut backoff = Backoff::new();
    loop {
        if let Err(e) = read_words(scratch, offset + first, &mut buf) {
            tracing::warn!(
                rank = me,
                error = %e,
                "p2p teardown: cannot read the acknowledgements"
            );
            return false;
        }
        let at = |off: u64| buf[((off - first) / 8) as usize];
        let owed = (0..lay.nranks)
            .filter(|&q| q != me)
            .flat_map(|q| (0..lay.lanes).map(move |l| (q, l)))
            .find_map(|(q, l)| -> Option<Owed> {
                let (seq, chunks) = (
                    at(lay.state(q, l, state::SEND_SEQ)),
                    at(lay.state(q, l, state::SEND_CHUNKS)),
                );
                let (hdr, done) = (at(lay.hdr_done(q, l)), at(lay.chunk_done(q, l)));
                if hdr < seq {
                    Some((q, l, "hdr_done", seq, hdr))
                } else if done < chunks {
                    Some((q, l, "chunk_done", chunks, done))
                } else {
                    None
                }
            });
        let Some((peer, lane, word, expected, seen)) = owed else {
            return true;
        };
        if Instant::now() >= deadline {
            tracing::warn!(
                rank = me,
                peer,
                lane,
                word,
                expected,
                seen,
                timeout = ?DRAIN_TIMEOUT,
                "p2p teardown: a peer never acknowledged this rank's last sends (no matching \
                 receive, or the peer failed, or is slow)"
            );
            return false;
        }
        backoff.snooze();
    }
}

/// Reads `out.len()` u64 words of `scratch` from byte `offset` (in range: the caller checks).
fn read_words(scratch: &DeviceBuffer, offset: u64, out: &mut [u64]) -> Result<()> {
    match scratch.gpu().kind() {
        BackendKind::Cpu => {
            let base = scratch.ptr().byte_add_cast::<u64>(offset).as_ptr();
            for (i, w) in out.iter_mut().enumerate() {
                // SAFETY: the CPU backend's device memory is this process's memory; the word
                // lies in the live scratch (the caller's range check) and is 8-byte aligned
                // (`P2pLayout`, in a 16-byte aligned region); peers store it atomically
                // (`st.release.sys`), so it is read atomically too.
                *w = unsafe { AtomicU64::from_ptr(base.add(i)) }.load(Ordering::Acquire);
            }
            Ok(())
        }
        BackendKind::Cuda => {
            let mut bytes = vec![0u8; out.len() * 8];
            scratch.copy_to_host(offset as usize, &mut bytes)?;
            for (w, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut le = [0u8; 8];
                le.copy_from_slice(b);
                *w = u64::from_le_bytes(le);
            }
            Ok(())
        }
    }
}

/// The batch of sends and receives `call` is on rank `me` of `n` when it is made of them
/// (gather, scatter, all-to-all-v; `None` for another call), from the bytes of one part
/// (`part_bytes`; the call's checks passed).
pub(crate) fn batch_of(
    call: &Call,
    me: usize,
    n: usize,
    part_bytes: usize,
) -> Option<Vec<Transfer>> {
    let at = |p: DevicePtr<u8>, bytes: usize| p.byte_add_cast::<u8>(bytes as u64);
    let b = part_bytes;
    // A rooted batch: the root's transfer with every rank (`each`), then every rank's `own`.
    let rooted = |root: usize, own: Transfer, each: &dyn Fn(usize) -> Transfer| {
        let mut batch: Vec<Transfer> = Vec::with_capacity(n + 1);
        if me == root {
            batch.extend((0..n).map(each));
        }
        batch.push(own);
        batch
    };
    Some(match *call {
        Call::Gather {
            input,
            output,
            root,
            ..
        } => rooted(root, Transfer::send(root, input, b), &|q| {
            Transfer::recv(q, at(output, q * b), b)
        }),
        Call::Scatter {
            input,
            output,
            root,
            ..
        } => rooted(root, Transfer::recv(root, output, b), &|q| {
            Transfer::send(q, at(input, q * b), b)
        }),
        Call::AllToAllv {
            input,
            output,
            ref send_counts,
            ref send_displs,
            ref recv_counts,
            ref recv_displs,
            dtype,
        } => {
            let es = dtype.size();
            let mut batch = Vec::with_capacity(2 * n);
            for q in 0..n {
                let (sent, got) = (send_counts[q] * es, recv_counts[q] * es);
                batch.push(Transfer::send(q, at(input, send_displs[q] * es), sent));
                batch.push(Transfer::recv(q, at(output, recv_displs[q] * es), got));
            }
            batch
        }
        _ => return None,
    })
}

/// A copy of a send to this rank itself into its receive: (destination, source, bytes).
pub(crate) type SelfCopy = (DevicePtr<u8>, DevicePtr<u8>, usize);

/// The copies of `batch`'s transfers to this rank itself: the k-th send to self with the k-th
/// receive from self, as (destination, source, bytes); `Error::SelfMismatch` when their sizes
/// differ or one is missing.
pub(crate) fn self_pairs(me: usize, batch: &[Transfer]) -> Result<Vec<SelfCopy>> {
    let mine = |dir| batch.iter().filter(move |t| t.peer == me && t.dir == dir);
    let (sends, recvs): (Vec<_>, Vec<_>) = (mine(Dir::Send).collect(), mine(Dir::Recv).collect());
    let mut copies = Vec::with_capacity(sends.len());
    for index in 0..sends.len().max(recvs.len()) {
        match (sends.get(index), recvs.get(index)) {
            (Some(s), Some(r)) if s.bytes == r.bytes => copies.push((r.buf, s.buf, s.bytes)),
            (s, r) => {
                return Err(Error::SelfMismatch {
                    index,
                    sent_bytes: s.map(|t| t.bytes as u64),
                    recv_bytes: r.map(|t| t.bytes as u64),
                });
            }
        }
    }
    Ok(copies)
}

/// The launches of `batch`'s transfers to other ranks, each with its key (round, distance
/// group), in the order every rank runs them (module docs): by round (the k-th transfer to or
/// from a peer), then by distance group; each launch holds at most one send and one receive
/// per peer, `P2P_MAX_OPS` in all.
pub(crate) fn schedule(
    me: usize,
    n: usize,
    batch: &[Transfer],
) -> Vec<((usize, usize), Vec<Transfer>)> {
    let mut seen: BTreeMap<(usize, bool), usize> = BTreeMap::new();
    let mut launches: BTreeMap<(usize, usize), Vec<Transfer>> = BTreeMap::new();
    for t in batch.iter().filter(|t| t.peer != me) {
        let sends = t.dir == Dir::Send;
        let round = seen.entry((t.peer, sends)).or_insert(0);
        let distance = if sends {
            (t.peer + n - me) % n
        } else {
            (me + n - t.peer) % n
        };
        let group = (distance - 1) / DISTANCES_PER_LAUNCH;
        launches.entry((*round, group)).or_default().push(*t);
        *round += 1;
    }
    launches.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::{Dir, Transfer, schedule, self_pairs};
    use mscclpp_shared::{DevicePtr, P2P_MAX_OPS};

    fn t(dir: Dir, peer: usize, bytes: usize) -> Transfer {
        Transfer {
            dir,
            peer,
            buf: DevicePtr::NULL,
            bytes,
        }
    }

    /// The launch keys of the transfers `dir` with `peer`, in order.
    fn keys(
        plan: &[((usize, usize), Vec<Transfer>)],
        dir: Dir,
        peer: usize,
    ) -> Vec<(usize, usize)> {
        plan.iter()
            .flat_map(|(k, l)| {
                l.iter()
                    .filter(|x| x.dir == dir && x.peer == peer)
                    .map(|_| *k)
            })
            .collect()
    }

    /// On 2 to 20 ranks, every rank sends 3 messages to every other (and receives 3 from each),
    /// recorded in an order of its own: both ends of every message give it the same launch
    /// key, every rank runs its launches in key order, and no launch holds two sends or two
    /// receives for a peer, or more than `P2P_MAX_OPS` transfers.
    #[test]
    fn both_ends_schedule_a_message_alike() {
        for n in 2..=20 {
            let batches: Vec<Vec<Transfer>> = (0..n)
                .map(|r| {
                    let mut b = Vec::new();
                    for _ in 0..3 {
                        for i in 1..n {
                            b.push(t(Dir::Send, (r + i) % n, 8));
                        }
                    }
                    // The receives, interleaved at places that differ per rank.
                    for q in (0..n).filter(|&q| q != r) {
                        for _ in 0..3 {
                            let at = (q * 5 + r) % (b.len() + 1);
                            b.insert(at, t(Dir::Recv, q, 8));
                        }
                    }
                    b
                })
                .collect();
            let plans: Vec<_> = (0..n).map(|r| schedule(r, n, &batches[r])).collect();
            for (r, plan) in plans.iter().enumerate() {
                assert!(
                    plan.windows(2).all(|w| w[0].0 < w[1].0),
                    "{n}: keys out of order"
                );
                for (_, l) in plan {
                    assert!(l.len() <= P2P_MAX_OPS, "{n} ranks: a launch of {}", l.len());
                    for dir in [Dir::Send, Dir::Recv] {
                        let mut peers: Vec<_> =
                            l.iter().filter(|x| x.dir == dir).map(|x| x.peer).collect();
                        let all = peers.len();
                        peers.sort_unstable();
                        peers.dedup();
                        assert_eq!(peers.len(), all, "{n} ranks: a peer twice in a launch");
                    }
                }
                for q in (0..n).filter(|&q| q != r) {
                    let mine = keys(plan, Dir::Send, q);
                    assert_eq!(mine.len(), 3);
                    assert_eq!(mine, keys(&plans[q], Dir::Recv, r), "{n}: {r} -> {q}");
                }
            }
        }
    }

    #[test]
    fn self_transfers_pair_in_order_and_mismatches_are_refused() {
        let b = [
            t(Dir::Send, 1, 4),
            t(Dir::Recv, 1, 8),
            t(Dir::Send, 1, 8),
            t(Dir::Recv, 1, 4),
            t(Dir::Send, 0, 8),
        ];
        assert!(matches!(
            self_pairs(1, &b),
            Err(mscclpp_host::Error::SelfMismatch {
                index: 0,
                sent_bytes: Some(4),
                recv_bytes: Some(8)
            })
        ));
        assert_eq!(self_pairs(1, &b[..0]).unwrap().len(), 0);
        let ok = [t(Dir::Recv, 1, 8), t(Dir::Send, 1, 8)];
        assert_eq!(
            self_pairs(1, &ok).unwrap(),
            vec![(DevicePtr::NULL, DevicePtr::NULL, 8)]
        );
        assert!(matches!(
            self_pairs(1, &ok[..1]),
            Err(mscclpp_host::Error::SelfMismatch {
                index: 0,
                sent_bytes: None,
                recv_bytes: Some(8)
            })
        ));
    }
}
