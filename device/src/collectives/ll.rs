//! The LL (low-latency) collectives: every rank writes its payload as LL16 packets into a slot
//! of every peer's LL region and reads what arrives in its own slots; the flags in the packets
//! carry the synchronisation (see the parent module's docs for the double-buffered region and
//! why two halves suffice).
//!
//! Who writes and reads what: rank `q`'s LL region has one slot per peer (none for `q`
//! itself: slot [`slot_of`]`(r, q)` is rank `r`'s), written only by rank `r` (volatile 16-byte
//! stores, data and flag together) and read only by rank `q` (volatile loads until both flags
//! match); `ll_flags` is read by every block of this GPU at its start and
//! written by the last block to finish (after a GPU-scope fence).

use super::{channel, reducer_for, reducer_serving};
use crate::arch;
use crate::packet::{self, Packet};
use crate::reduce::{CommonSum, InlineSum, Reduce, Reducer};
use crate::trace;
use crate::wait::spin_until;
use mscclpp_shared::{
    CollectiveMode, CollectiveParams, DeviceErrorCode, LL16Packet, TraceEventKind, WaitSite,
};

/// Which LL collective a launch runs (from `CollectiveParams::mode`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LlMode {
    /// Reduce everyone's `bytes` into every output.
    AllReduce,
    /// Everyone's `bytes` to part `rank` of every output (parts `stride` apart).
    AllGather,
    /// Reduce part `rank` (of `stride`-spaced parts) of everyone's input into my output.
    ReduceScatter,
    /// Part `q` of my input to part `rank` of rank `q`'s output.
    AllToAll,
    /// My `bytes` to `root`, and `root`'s to my output (a two-rank exchange).
    SendRecv,
    /// `root`'s `bytes` to every output. Every other rank sends every peer one empty packet
    /// (an ack, written first thing) and every rank waits for the acks it is sent, so that,
    /// as in the other modes, every rank hears from every peer in every LL call: that is
    /// what keeps a peer from running more than one call ahead of a slot's reader.
    Broadcast,
    /// Everyone's `bytes` reduced into `root`'s output. The other ranks send their data to the
    /// root and an ack packet to every other peer; the root sends every peer an ack: so, again,
    /// every rank hears from every peer.
    Reduce,
}

impl LlMode {
    /// The mode of an all-mode kernel's launch (not the reduce: `ll_reduce_kernel` alone serves
    /// it, and the all-mode kernels do nothing for it, as for any mode they do not know).
    fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode {
            m if m == CollectiveMode::AllReduce as u32 => Self::AllReduce,
            m if m == CollectiveMode::AllGather as u32 => Self::AllGather,
            m if m == CollectiveMode::ReduceScatter as u32 => Self::ReduceScatter,
            m if m == CollectiveMode::AllToAll as u32 => Self::AllToAll,
            m if m == CollectiveMode::Send as u32 => Self::SendRecv,
            m if m == CollectiveMode::Broadcast as u32 => Self::Broadcast,
            _ => return None,
        })
    }

    /// Whether this launch exchanges packets with `q`.
    fn talks_to(self, p: &CollectiveParams, q: u32) -> bool {
        q != p.rank && (self != Self::SendRecv || q == p.root)
    }

    /// Where the packets for `q` come from (parts for all-to-all and reduce-scatter).
    fn source(self, p: &CollectiveParams, q: u32) -> *const u8 {
        let input = p.input.as_ptr() as *const u8;
        match self {
            // SAFETY: the host sized `input` as `nranks` parts `stride` apart.
            Self::ReduceScatter | Self::AllToAll => unsafe {
                input.add((q as u64 * p.stride) as usize)
            },
            _ => input,
        }
    }
}

/// The LL collectives' body; returns false if a packet wait gave up. `REDUCE`: whether it may
/// be a reduce (only [`ll_reduce_kernel`] serves it; the others compile without its branches,
/// which took the all-mode kernels from 47 and 76 registers to 56 and 82).
#[inline(always)]
fn ll_collective<const REDUCE: bool>(
    p: &CollectiveParams,
    mode: LlMode,
    l: LlLaunch,
    r: impl Reduce,
) -> bool {
    let flag = l.flag;
    let n = packet::packets_for::<LL16Packet>(p.bytes as usize) as u64;
    let half = ll_half(p, flag);
    let (tid, nthreads) = (l.tid, l.nthreads);
    let output = p.output.as_ptr();
    let me = p.rank;
    // 1. My payload for every peer, as packets, into my slot of its region. A thread handles the
    //    same packet index `i` in both steps, so in-place layouts read before they write.
    // Broadcast: the root sends its data, the others one ack packet each. Reduce: the others
    // send their data to the root and an ack to the rest; the root one ack to everyone.
    let ack_only = mode == LlMode::Broadcast && me != p.root;
    let data_to = |q: u32| {
        if REDUCE && mode == LlMode::Reduce {
            me != p.root && q == p.root
        } else {
            !ack_only
        }
    };
    let mut i = tid;
    while i < n {
        let off = i * 8;
        let len = (p.bytes - off) as usize;
        for q in 0..p.nranks {
            let data = data_to(q);
            if !mode.talks_to(p, q) || (!data && i > 0) {
                continue;
            }
            let w = if !data {
                [0; 2]
            } else {
                // SAFETY: `off < bytes` inside the source part.
                unsafe {
                    packet::read_payload::<LL16Packet>(mode.source(p, q).add(off as usize), len)
                }
            };
            ll_send(p, flag, half, q, i, w);
        }
        i += nthreads;
    }
    // 2. What arrives in my slots, reduced into or copied to my output.
    let packet_from = |q: u32, i: u64| ll_receive(p, flag, half, q, i);
    let mut i = tid;
    while i < n {
        let off = i * 8;
        let len = (p.bytes - off) as usize;
        // SAFETY (block): every pointer below is a part of `input` / `output` as the host
        // sized them for the mode, at `off < bytes`.
        unsafe {
            match mode {
                LlMode::AllReduce | LlMode::ReduceScatter => {
                    let mut acc = r.pre(packet::read_payload::<LL16Packet>(
                        mode.source(p, me).add(off as usize),
                        len,
                    ));
                    for q in 0..p.nranks {
                        if !mode.talks_to(p, q) {
                            continue;
                        }
                        let Ok(w) = packet_from(q, i) else {
                            return false;
                        };
                        acc = r.fold(acc, w);
                    }
                    let acc = r.post(acc);
                    packet::write_payload::<LL16Packet>(output.add(off as usize), acc, len);
                }
                LlMode::AllGather | LlMode::AllToAll => {
                    for q in 0..p.nranks {
                        let w = if q == me {
                            packet::read_payload::<LL16Packet>(
                                mode.source(p, me).add(off as usize),
                                len,
                            )
                        } else {
                            let Ok(w) = packet_from(q, i) else {
                                return false;
                            };
                            w
                        };
                        let dst = output.add((q as u64 * p.stride + off) as usize);
                        packet::write_payload::<LL16Packet>(dst, w, len);
                    }
                }
                LlMode::Reduce if REDUCE && me == p.root => {
                    let Ok(acc) = reduce_arrivals(
                        p,
                        flag,
                        half,
                        i,
                        packet::read_payload::<LL16Packet>(
                            mode.source(p, me).add(off as usize),
                            len,
                        ),
                        r,
                    ) else {
                        return false;
                    };
                    packet::write_payload::<LL16Packet>(output.add(off as usize), acc, len);
                }
                LlMode::Reduce if REDUCE => {
                    // The acks (packet 0 of every peer).
                    for q in 0..p.nranks {
                        if i == 0 && q != me && packet_from(q, 0).is_err() {
                            return false;
                        }
                    }
                }
                // Refused by the all-mode kernels' frame.
                LlMode::Reduce => return false,
                LlMode::SendRecv => {
                    let Ok(w) = packet_from(p.root, i) else {
                        return false;
                    };
                    packet::write_payload::<LL16Packet>(output.add(off as usize), w, len);
                }
                LlMode::Broadcast => {
                    let w = if me == p.root {
                        packet::read_payload::<LL16Packet>(
                            mode.source(p, me).add(off as usize),
                            len,
                        )
                    } else {
                        let Ok(w) = packet_from(p.root, i) else {
                            return false;
                        };
                        w
                    };
                    packet::write_payload::<LL16Packet>(output.add(off as usize), w, len);
                    // The acks (packet 0 of every rank but the root and me).
                    for q in 0..p.nranks {
                        if i == 0 && q != me && q != p.root && packet_from(q, 0).is_err() {
                            return false;
                        }
                    }
                }
            }
        }
        i += nthreads;
    }
    true
}

/// Whether an LL call moves whole 8-byte words between 4-byte aligned buffers (every packet
/// full, read and written as two u32).
#[inline(always)]
fn ll_whole_words(p: &CollectiveParams) -> bool {
    p.bytes.is_multiple_of(8)
        && p.input.addr().is_multiple_of(4)
        && p.output.addr().is_multiple_of(4)
}

/// Word pair `i` of `base` (whole words, see [`ll_whole_words`]).
///
/// # Safety
/// `base` holds at least `2 * i + 2` u32.
#[inline(always)]
unsafe fn pair_at(base: *const u32, i: u64) -> [u32; 2] {
    // SAFETY: the caller's contract.
    unsafe {
        [
            base.add(2 * i as usize).read(),
            base.add(2 * i as usize + 1).read(),
        ]
    }
}

/// Step 1 of the whole-word all-reduce and all-gather: this rank's input, packet by packet, into
/// this rank's slot of every peer's region.
#[inline(always)]
fn ll_send_words(p: &CollectiveParams, l: LlLaunch, half: u64) {
    let n = p.bytes / 8;
    let nthreads = l.nthreads;
    let input = p.input.as_ptr() as *const u32;
    let mut i = l.tid;
    while i < n {
        // SAFETY: word pair `i` lies inside `input` (`bytes` long, whole words).
        let w = unsafe { pair_at(input, i) };
        for q in 0..p.nranks {
            if q != p.rank {
                ll_send(p, l.flag, half, q, i, w);
            }
        }
        i += nthreads;
    }
}

/// Offset of this launch's half of the LL region (double-buffered by the flag's parity; each
/// half holds `nranks - 1` slots, one per peer).
#[inline(always)]
pub(super) fn ll_half(p: &CollectiveParams, flag: u32) -> u64 {
    (flag & 1) as u64 * (p.nranks as u64).saturating_sub(1) * p.ll_slot_bytes
}

/// The slot of rank `from`'s packets in rank `to`'s LL region (`from != to`): the peers in rank
/// order, `to` itself left out (it never sends itself packets).
#[inline(always)]
pub fn slot_of(from: u32, to: u32) -> u64 {
    if from < to {
        from as u64
    } else {
        from as u64 - 1
    }
}

/// Packet `i` (payload `w`) into this rank's slot of peer `q`'s LL region.
#[inline(always)]
pub(super) fn ll_send(p: &CollectiveParams, flag: u32, half: u64, q: u32, i: u64, w: [u32; 2]) {
    let at = (half + slot_of(p.rank, q) * p.ll_slot_bytes + i * 16) as usize;
    let dst = channel(p, 0, q).dst.as_ptr();
    // SAFETY: this rank's slot of peer `q`'s LL region (mapped here) holds
    // `ll_slot_bytes >= packets * 16`, and `i` is a packet of this call.
    unsafe { LL16Packet::store(dst.add(at) as *mut LL16Packet, w, flag) };
}

/// Packet `i` from peer `q` (its slot of this rank's LL region), waiting for it.
#[inline(always)]
pub(super) fn ll_receive(
    p: &CollectiveParams,
    flag: u32,
    half: u64,
    q: u32,
    i: u64,
) -> Result<[u32; 2], DeviceErrorCode> {
    let at = (half + slot_of(q, p.rank) * p.ll_slot_bytes + i * 16) as usize;
    // SAFETY: peer `q`'s slot of my LL region (`ll_slot_bytes >= packets * 16`), written by
    // peer `q` only.
    unsafe {
        packet::read_packet(
            p.scratch.as_ptr().add(at) as *const LL16Packet,
            flag,
            p.status,
        )
    }
}

/// `mine` reduced with packet `i` from every peer (slot `q` of this rank's LL region, waiting
/// for each), every contribution pre-multiplied and the result post-divided ([`Reducer`]):
/// the reduction step of the LL all-reduce and reduce-scatter, and of the two-shot
/// all-reduce's reduce-scatter half.
#[inline(always)]
pub(super) fn reduce_arrivals(
    p: &CollectiveParams,
    flag: u32,
    half: u64,
    i: u64,
    mine: [u32; 2],
    r: impl Reduce,
) -> Result<[u32; 2], DeviceErrorCode> {
    let mut acc = r.pre(mine);
    for q in 0..p.nranks {
        if q == p.rank {
            continue;
        }
        let w = ll_receive(p, flag, half, q, i)?;
        acc = r.fold(acc, w);
    }
    Ok(r.post(acc))
}

/// The whole-word LL calls' skeleton: step 1 ([`ll_send_words`]), then `arrived(i, half)` for
/// each packet index `i` of this thread (it reads what the peers sent with [`ll_receive`] and
/// writes the output); false as soon as one gives up.
#[inline(always)]
fn ll_words(p: &CollectiveParams, l: LlLaunch, arrived: impl Fn(u64, u64) -> bool) -> bool {
    let half = ll_half(p, l.flag);
    ll_send_words(p, l, half);
    let n = p.bytes / 8;
    let nthreads = l.nthreads;
    let mut i = l.tid;
    while i < n {
        if !arrived(i, half) {
            return false;
        }
        i += nthreads;
    }
    true
}

/// [`ll_collective`]'s all-reduce for whole words ([`ll_whole_words`]): the same steps with
/// plain u32 loads and stores and no per-mode branches. Callers pass a constant reducer for
/// the inline reductions, so that their loops carry no type dispatch.
#[inline(always)]
fn ll_all_reduce_words(p: &CollectiveParams, l: LlLaunch, r: impl Reduce) -> bool {
    let flag = l.flag;
    let (input, output) = (
        p.input.as_ptr() as *const u32,
        p.output.as_ptr() as *mut u32,
    );
    ll_words(p, l, |i, half| {
        // SAFETY: word pair `i` lies inside `input` and `output` (whole words).
        let mine = unsafe { pair_at(input, i) };
        let Ok(acc) = reduce_arrivals(p, flag, half, i, mine, r) else {
            return false;
        };
        // SAFETY: as above.
        unsafe {
            output.add(2 * i as usize).write(acc[0]);
            output.add(2 * i as usize + 1).write(acc[1]);
        }
        true
    })
}

/// [`ll_collective`]'s all-gather for whole words ([`ll_whole_words`], and a whole-word
/// `stride`): every rank's packet `i` to word pair `i` of its part of the output.
#[inline(always)]
fn ll_all_gather_words(p: &CollectiveParams, l: LlLaunch) -> bool {
    let flag = l.flag;
    let (input, output) = (
        p.input.as_ptr() as *const u32,
        p.output.as_ptr() as *mut u32,
    );
    ll_words(p, l, |i, half| {
        for q in 0..p.nranks {
            let w = if q == p.rank {
                // SAFETY: word pair `i` lies inside `input`.
                unsafe { pair_at(input, i) }
            } else {
                let Ok(w) = ll_receive(p, flag, half, q, i) else {
                    return false;
                };
                w
            };
            // SAFETY: part `q` of the output (`stride` bytes apart, whole words) holds pair `i`.
            unsafe {
                let part = output.add((q as u64 * (p.stride / 4)) as usize);
                part.add(2 * i as usize).write(w[0]);
                part.add(2 * i as usize + 1).write(w[1]);
            }
        }
        true
    })
}

/// One LL launch as a working thread of it sees it (from [`ll_begin`]).
#[derive(Clone, Copy)]
pub(super) struct LlLaunch {
    /// The launch's flag: one more than the last completed launch's.
    pub flag: u32,
    /// This thread's index among the launch's working threads.
    pub tid: u64,
    /// The launch's working threads (every block's but the keeper's).
    pub nthreads: u64,
}

/// The start of every LL launch: every thread reads `ll_flags[0]`, the flag of the last
/// completed launch; the launch's flag is one more. `None` for the threads of the keeper
/// block, which have nothing else to do.
///
/// Who advances the flag, so that the same launch replayed from a CUDA graph uses a fresh one:
/// - One block: its thread 0, in [`ll_finish`], after the block's barrier here (every thread
///   of the block has read the old flag by then).
/// - Several blocks: the last block is the keeper; it moves no data. Thread 0 of every other
///   block adds 1 to `ll_flags[1]` with release right after the barrier (so after every read
///   of its block), and the keeper's thread 0 waits (acquire) until the count equals the
///   working blocks, then resets the count and stores the new flag. The next launch reads the
///   words after the kernel boundary. Nothing is left for the working blocks to do at their
///   end: on 2×H200 the former scheme (every block counted itself with a fenced atomic at its
///   start, and the block that counted last fenced and stored the flag at its end) cost
///   0.33–0.41 µs more a call from 4 KiB to 64 KiB in a CUDA C model of both
///   (`benchmarks/harness/ll_timeline.cu`).
#[inline(always)]
pub(super) fn ll_begin(p: &CollectiveParams) -> Option<LlLaunch> {
    let flags = p.ll_flags.as_ptr();
    // SAFETY: `ll_flags` points at two live u64 words; `[0]` was last written by the previous
    // launch, which completed before this one started (stream order).
    let flag = unsafe { arch::ld_relaxed_sys_u64(flags) } as u32 + 1;
    arch::sync_threads();
    let (grid, block, dim) = (arch::grid_dim_x(), arch::block_idx_x(), arch::block_dim_x());
    let t = arch::thread_idx_x();
    if grid == 1 {
        return Some(LlLaunch {
            flag,
            tid: t as u64,
            nthreads: dim as u64,
        });
    }
    let workers = grid - 1;
    if block == workers {
        if t == 0 {
            // SAFETY: as above (`[1]` is the count).
            let count = unsafe { flags.add(1) };
            let counted = spin_until(p.status, WaitSite::GridBarrier, count as u64, || {
                // SAFETY: as above.
                (unsafe { arch::ld_acquire_gpu_u64(count) }) == workers as u64
            });
            if counted.is_ok() {
                // SAFETY: as above.
                unsafe {
                    arch::st_relaxed_sys_u64(count, 0);
                    arch::st_relaxed_sys_u64(flags, flag as u64);
                }
            }
        }
        return None;
    }
    if t == 0 {
        // SAFETY: as above.
        unsafe { arch::red_add_release_gpu_u64(flags.add(1), 1) };
    }
    Some(LlLaunch {
        flag,
        tid: (block * dim + t) as u64,
        nthreads: (workers * dim) as u64,
    })
}

/// The end of every LL launch: in a single-block launch, thread 0 stores the launch's flag as
/// the flag of the last completed launch, unless it gave up (`ok`). (Several blocks: the
/// keeper did it, see [`ll_begin`].)
#[inline(always)]
pub(super) fn ll_finish(p: &CollectiveParams, l: LlLaunch, ok: bool) {
    if arch::grid_dim_x() == 1 && arch::thread_idx_x() == 0 && ok {
        // SAFETY: as in `ll_begin`.
        unsafe { arch::st_relaxed_sys_u64(p.ll_flags.as_ptr(), l.flag as u64) };
    }
}

/// An LL kernel's frame: reads the call's [`Reducer`] as a kernel of kind `ANY` serves it
/// (`reduces`: whether the launch reduces; see `reducer_for`: a launch with a type or operator
/// the host never sends to this kind does nothing), starts the launch ([`ll_begin`]; the
/// keeper block's threads return there), runs `body` (false: a wait gave up) after the
/// block's `Send` trace event, and finishes it ([`ll_finish`]) before its `End` (no `Recv`:
/// the receive loop is the body's last step, and recording it cost registers; see
/// `crate::trace`).
#[inline(always)]
pub(super) fn ll_kernel<const ANY: bool>(
    p: &CollectiveParams,
    reduces: bool,
    body: impl FnOnce(LlLaunch, Reducer) -> bool,
) {
    let Some(r) = reducer_for::<ANY>(p, reduces) else {
        return;
    };
    let Some(l) = ll_begin(p) else {
        // The keeper block (see `ll_begin`).
        trace::event(&p.trace, TraceEventKind::End);
        return;
    };
    trace::event(&p.trace, TraceEventKind::Send);
    let ok = body(l, r);
    ll_finish(p, l, ok);
    trace::event(&p.trace, TraceEventKind::End);
}

/// The all-mode LL kernels' body (`ANY`: which kind, see `with_reducer!`).
#[inline(always)]
fn ll_collective_entry<const ANY: bool>(p: CollectiveParams) {
    // (Not through `ll_kernel`: reading the mode first took 54 registers on sm_90, not 50.)
    let Some(mode) = LlMode::from_mode(p.mode) else {
        return;
    };
    let reduces = matches!(mode, LlMode::AllReduce | LlMode::ReduceScatter);
    // The main kernel leaves the all-reduce to `ll_all_reduce_kernel` (serving it here too
    // took 55 registers, not 47) and records `InvalidArgument` for it; neither serves the
    // reduce (`ll_reduce_kernel`'s, which `from_mode` never returns).
    let serves = ANY || mode != LlMode::AllReduce;
    let Some(r) = reducer_serving::<ANY>(&p, reduces, serves) else {
        return;
    };
    let Some(l) = ll_begin(&p) else {
        // The keeper block (see `ll_begin`).
        trace::event(&p.trace, TraceEventKind::End);
        return;
    };
    trace::event(&p.trace, TraceEventKind::Send);
    let ok = if !reduces {
        ll_collective::<false>(&p, mode, l, CommonSum::COPY)
    } else if ANY {
        ll_collective::<false>(&p, mode, l, r)
    } else {
        // The main kernel's reduce-scatter (its all-reduce is `ll_all_reduce_kernel`'s): one
        // loop for the three sums and pre-multiplied sums, as the kernel always had one for
        // the sums (`reducer_for` refused the others).
        ll_collective::<false>(&p, LlMode::ReduceScatter, l, InlineSum::of(r.dtype, &r))
    };
    ll_finish(&p, l, ok);
    trace::event(&p.trace, TraceEventKind::End);
}

crate::kernel! {
    /// One-shot collectives with LL16 packets (small messages; `mode`: reduce-scatter,
    /// all-to-all, broadcast, `Send` for a two-rank exchange with `root`, or all-gather, which
    /// the host launches as [`ll_all_gather_kernel`]; the all-reduce is
    /// [`ll_all_reduce_kernel`]'s and [`ll_collective_any_kernel`]'s, and here records
    /// `InvalidArgument`): every working thread sends its share of packets to every
    /// peer, then reduces or copies the packets that arrive. The flag comes from `ll_flags` on
    /// the device (see `CollectiveParams::ll_flags`); a launch of several blocks has one more,
    /// the keeper, which advances it (see `ll_begin`), so the same launch replayed from a CUDA
    /// graph stays correct. Every rank of the communicator takes part in every LL launch (the
    /// flags count launches). Reduces the sums and pre-multiplied sums of f16, bf16 and f32; other reductions run on
    /// [`ll_collective_any_kernel`].
    fn ll_collective_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        ll_collective_entry::<false>(p);
    }
}

crate::kernel! {
    /// [`ll_collective_kernel`] for every type and operator, all-reduce included (the
    /// reductions not inline in the main kernels: see `with_reducer!`).
    fn ll_collective_any_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        ll_collective_entry::<true>(p);
    }
}

crate::kernel! {
    /// The LL all-reduce of the sums and pre-multiplied sums (`mode` is ignored; f16, bf16, f32; every other
    /// reduction: [`ll_collective_any_kernel`]): [`ll_collective_kernel`]'s all-reduce in a
    /// kernel of its own, with a path for whole words, and no type dispatch in its loops. On
    /// 2×H200 this is 0.3–0.6 µs faster per call than the all-mode kernel (16 KiB–1 MiB).
    fn ll_all_reduce_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        ll_kernel::<false>(&p, true, |l, r| {
            let whole = ll_whole_words(&p);
            with_reducer!(
                false,
                r,
                |r| if whole {
                    ll_all_reduce_words(&p, l, r)
                } else {
                    ll_collective::<false>(&p, LlMode::AllReduce, l, r)
                },
                false
            )
        });
    }
}

/// The LL all-gather kernel's body.
#[inline(always)]
fn ll_all_gather(p: &CollectiveParams) {
    let Some(l) = ll_begin(p) else {
        // The keeper block (see `ll_begin`).
        trace::event(&p.trace, TraceEventKind::End);
        return;
    };
    trace::event(&p.trace, TraceEventKind::Send);
    let ok = if ll_whole_words(p) && p.stride.is_multiple_of(8) {
        ll_all_gather_words(p, l)
    } else {
        ll_collective::<false>(p, LlMode::AllGather, l, CommonSum::COPY)
    };
    ll_finish(p, l, ok);
    trace::event(&p.trace, TraceEventKind::End);
}

crate::kernel! {
    /// The LL reduce (`mode` is ignored) of every type and operator: every rank but the root
    /// sends its `bytes` to `root` as packets, and an ack packet to every other peer; the root
    /// reduces them into its output and sends every peer an ack (so that every rank hears
    /// from every peer, as in every LL launch).
    fn ll_reduce_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        ll_kernel::<true>(&p, true, |l, r| ll_collective::<true>(&p, LlMode::Reduce, l, r));
    }
}

crate::kernel! {
    /// The LL all-gather (`mode` is ignored), in a kernel of its own like
    /// [`ll_all_reduce_kernel`], with a path for whole words.
    fn ll_all_gather_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        ll_all_gather(&p);
    }
}
