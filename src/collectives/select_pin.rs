//! Pins what every call runs: the algorithm (after every fallback), the launch shapes and the
//! scratch layout, over a grid of configurations, sizes, rank counts, forced algorithms and
//! registration outcomes, against a reference transcribed from the code before the
//! algorithms became units (commit e1cbef2: `Collectives::all_reduce` … `send_recv`,
//! `part_algorithm`, `ll128_part`, `launch_ll_two_shot`, `try_direct`, `ll_shape`,
//! `launch_ll128`, `staged_config`, `launch_direct`). The reference is written on its own and
//! must not be changed with the library: a difference is a change of behaviour.
//!
//! Changed on purpose since (each marked `Changed:` below): the point-to-point calls
//! (`send`, `recv`, `send_recv`) run on the point-to-point engine (`p2p`), whatever their size
//! and buffers, and the scratch ends with its region; the reduce to a root was added; every
//! collective on one rank is a copy (all-reduce and reduce were; the others ran an algorithm).
//!
//! The library's side is the real planner and dispatcher loop (`plan::drive`), with an
//! executor that queues nothing: it records the step the dispatcher would queue, and stands
//! for the algorithms on the callers' buffers, which run when every rank's buffers can be
//! shared (`reg`) and otherwise decline (the direct kernel on the device, handing the call to
//! the launch behind it, or refusing it when forced; a forced copy engine in its exchange).

use mscclpp_host::Error;
use mscclpp_host::gpu::{BackendKind, LaunchConfig};
use mscclpp_shared::{DataType, DevicePtr, MAX_DIRECT_RANKS, ReduceOp};

use super::algorithm::{Algorithm, Collective};
use super::config::CollectiveConfig;
use super::context::{Args, Lowered, Peer};
use super::plan::{self, Action, Now};
use super::scratch::ScratchLayout;
use super::unit::{Planned, Queued};

/// What a call ran: `Ok(None)` a plain copy, `Err(())` a refusal (a typed error, nothing queued).
type Outcome = Result<Option<Algorithm>, ()>;

// ---- The library's answers (the only part that follows the library's structure) ----

fn library(cfg: &CollectiveConfig, call: Lowered, forced: Option<Algorithm>, reg: bool) -> Outcome {
    let layout = if call.nodes > 1 {
        ScratchLayout::for_nodes(cfg, call.ranks)
    } else {
        super::algo::one_node_layout(cfg, call.ranks)
    };
    let peer = match (call.collective, call.one_way) {
        (Collective::SendRecv, true) => Peer::To(0),
        (Collective::SendRecv, false) => Peer::Pair { next: 0, prev: 0 },
        _ => Peer::None,
    };
    let args = Args {
        call,
        input: DevicePtr::NULL,
        output: DevicePtr::NULL,
        peer,
        reg: None,
    };
    let mut ran = None;
    let mut exec = |a: Action<'_>| -> mscclpp_host::Result<Queued> {
        let step = match a {
            Action::Copy => {
                ran = Some(None);
                return Ok(Queued::Ran);
            }
            Action::Run(step, _) => step,
        };
        let u = step.algorithm.unit();
        if u.registered && !reg {
            return match (u.agrees, step.forced) {
                // Declined on the device: the dispatcher queues the call behind it.
                (true, false) => Ok(Queued::Gated(1)),
                // Refused on the device, on every rank.
                (true, true) => Err(unsupported("the direct kernel on these buffers")),
                (false, _) => Ok(Queued::Declined),
            };
        }
        if let Planned::Refused(what) = step.planned {
            return Err(unsupported(what));
        }
        ran = Some(Some(step.algorithm));
        Ok(Queued::Ran)
    };
    match plan::drive(
        cfg,
        &layout,
        &args,
        forced,
        Now::EAGER,
        &mut exec,
        &unsupported,
    ) {
        Ok(()) => ran.ok_or(()),
        Err(_) => Err(()),
    }
}

fn unsupported(what: &'static str) -> Error {
    Error::Unsupported {
        what,
        backend: BackendKind::Cpu,
    }
}

fn library_shapes(cfg: &CollectiveConfig, backend: BackendKind, x: u64) -> [LaunchConfig; 4] {
    use super::algo::ll128;
    use super::launch::{direct, ll, staged};
    [
        ll::shape(cfg, x),
        ll128::shape(cfg, x),
        staged::shape(cfg, backend, x),
        direct::shape(cfg, x as usize),
    ]
}

/// The regions' sizes, as the offsets of the one buffer that held them all before the regions
/// became buffers of their own: (LL slot, LL128 offset, LL128 slot, staging offset, total). The
/// LL16 region had a slot for every rank then, and has one for every peer now; the
/// point-to-point region (in the set-up scratch now, after the descriptors) ended it.
fn library_layout(cfg: &CollectiveConfig, n: usize) -> (u64, u64, u64, u64, usize) {
    use super::scratch::Region;
    let l = super::algo::one_node_layout(cfg, n);
    let ll_now = l.region_len(Region::Ll) as u64;
    assert_eq!(ll_now, 2 * (n as u64 - 1) * l.ll_slot_bytes(), "{n} ranks");
    let ll128_offset = ll_now + 2 * l.ll_slot_bytes();
    let stage = ll128_offset + l.region_len(Region::Ll128) as u64;
    (
        l.ll_slot_bytes(),
        ll128_offset,
        l.ll128_slot_bytes(),
        stage,
        super::scratch::up16(stage as usize + l.region_len(Region::Staging))
            + l.region_len(Region::P2p),
    )
}

fn library_rows(cfg: &CollectiveConfig) -> u32 {
    super::algo::channel_rows(cfg)
}

// ---- The reference (the code of e1cbef2, restated) ----

use Algorithm::*;

fn up16(x: usize) -> usize {
    (x + 15) & !15
}

fn ref_ll_slot(cfg: &CollectiveConfig) -> u64 {
    (up16(cfg.ll_max_bytes).div_ceil(8) * 16) as u64
}

/// `launch_ll`: refuses more than `ll_max_bytes` per part.
fn ref_ll(cfg: &CollectiveConfig, bytes: usize) -> Outcome {
    if bytes > cfg.ll_max_bytes {
        Err(())
    } else {
        Ok(Some(LlOneShot))
    }
}

/// `launch_ll128`: refuses more than `ll128_max_bytes`.
fn ref_ll128(cfg: &CollectiveConfig, bytes: usize) -> Outcome {
    if bytes > cfg.ll128_max_bytes {
        Err(())
    } else {
        Ok(Some(Ll128))
    }
}

/// `part_algorithm`.
fn ref_part_algorithm(
    cfg: &CollectiveConfig,
    part: usize,
    ll: bool,
    ce: bool,
    algo: Option<Algorithm>,
) -> Result<Algorithm, ()> {
    match algo {
        Some(TwoShotPut | Ll128 | LlTwoShot) => Err(()),
        Some(LlOneShot) if !ll => Err(()),
        None if ll && part <= cfg.ll_part_max_bytes => Ok(LlOneShot),
        Some(CopyEngine) if !ce => Err(()),
        Some(P2p) => Err(()),
        Some(a) => Ok(a),
        // Changed: not the copy engines unless forced (see `ref_all_reduce`).
        None if ce && part >= cfg.ce_min_bytes && part >= cfg.direct_min_bytes => Ok(Direct),
        None if part >= cfg.direct_min_bytes => Ok(Direct),
        None => Ok(Staged),
    }
}

/// `try_direct` followed by the caller's staging when it declines.
fn ref_try_direct(n: usize, a: Algorithm, forced: bool, registered: bool) -> Outcome {
    if a == Staged {
        return Ok(Some(Staged));
    }
    if n > MAX_DIRECT_RANKS {
        return if forced { Err(()) } else { Ok(Some(Staged)) };
    }
    match (registered, forced) {
        (true, _) => Ok(Some(a)),
        (false, true) => Err(()),
        (false, false) => Ok(Some(Staged)),
    }
}

/// `ce_all_reduce::plan`'s piece and slot, restated.
fn ref_ce_fits(cfg: &CollectiveConfig, bytes: usize, n: usize) -> bool {
    let chunk = up16(bytes.div_ceil(n));
    let slot = (cfg.ce_scratch_bytes / ((n - 1).max(1) * 2)) & !15;
    let pieces = chunk.div_ceil(slot.max(16)).max(cfg.ce_min_pieces).max(1);
    let piece = up16(chunk.div_ceil(pieces));
    piece <= slot
}

fn ref_all_reduce(
    cfg: &CollectiveConfig,
    n: usize,
    bytes: usize,
    algo: Option<Algorithm>,
    reg: bool,
) -> Outcome {
    let forced = algo.is_some();
    let algo = algo.unwrap_or_else(|| {
        let many = n >= cfg.ll_two_shot_min_ranks;
        if !many && (cfg.ll128_min_bytes..=cfg.ll128_max_bytes).contains(&bytes) {
            Ll128
        } else if bytes <= cfg.ll_max_bytes {
            if many && bytes >= cfg.ll_two_shot_min_bytes {
                LlTwoShot
            } else {
                LlOneShot
            }
        // Changed: the copy engines are taken on buffers registered ahead as windows (or
        // forced) only; unregistered calls of their range take the direct kernel, which needs
        // no per-call exchange.
        } else if bytes >= cfg.direct_min_bytes {
            Direct
        } else {
            Staged
        }
    });
    if n == 1 {
        return Ok(None);
    }
    match algo {
        LlOneShot => ref_ll(cfg, bytes),
        Ll128 => ref_ll128(cfg, bytes),
        LlTwoShot => {
            if bytes > cfg.ll_max_bytes {
                return Err(());
            }
            let nn = n as u64;
            let part = (bytes as u64).div_ceil(nn).next_multiple_of(8);
            if (nn - 1) * part >= bytes as u64 || 4 * part > ref_ll_slot(cfg) {
                ref_ll(cfg, bytes)
            } else {
                Ok(Some(LlTwoShot))
            }
        }
        Direct | CopyEngine => match ref_try_direct(n, algo, forced, reg)? {
            Some(CopyEngine) if !ref_ce_fits(cfg, bytes, n) => Err(()),
            other => Ok(other),
        },
        Staged | TwoShotPut => Ok(Some(algo)),
        Port | Hierarchical => Err(()),
        P2p => Err(()),
    }
}

fn ref_all_gather(
    cfg: &CollectiveConfig,
    n: usize,
    bytes: usize,
    algo: Option<Algorithm>,
    reg: bool,
) -> Outcome {
    let ll128 = match algo {
        Some(a) => a == Ll128,
        None => n > 1 && (cfg.ll128_part_min_bytes..=cfg.ll128_max_bytes).contains(&bytes),
    };
    if ll128 {
        return ref_ll128(cfg, bytes);
    }
    let a = ref_part_algorithm(cfg, bytes, true, true, algo)?;
    if a == LlOneShot {
        return ref_ll(cfg, bytes);
    }
    ref_try_direct(n, a, algo.is_some(), reg)
}

fn ref_reduce_scatter(
    cfg: &CollectiveConfig,
    n: usize,
    bytes: usize,
    algo: Option<Algorithm>,
    reg: bool,
) -> Outcome {
    let ll128 = match algo {
        Some(a) => a == Ll128,
        None => n > 1 && (cfg.ll128_part_min_bytes..=cfg.ll128_max_bytes).contains(&bytes),
    };
    if ll128 {
        return ref_ll128(cfg, bytes);
    }
    let ll_fits = algo.is_none() && bytes <= cfg.ll_max_bytes && n > 1;
    let a = if ll_fits {
        LlOneShot
    } else {
        ref_part_algorithm(cfg, bytes, true, false, algo)?
    };
    if a == LlOneShot {
        return ref_ll(cfg, bytes);
    }
    ref_try_direct(n, a, algo.is_some(), reg)
}

/// Broadcast and all-to-all.
fn ref_broadcast(
    cfg: &CollectiveConfig,
    n: usize,
    bytes: usize,
    algo: Option<Algorithm>,
    reg: bool,
) -> Outcome {
    let a = ref_part_algorithm(cfg, bytes, true, true, algo)?;
    if a == LlOneShot {
        return ref_ll(cfg, bytes);
    }
    ref_try_direct(n, a, algo.is_some(), reg)
}

/// `send`, `recv` and `send_recv`. Changed: the point-to-point engine, always (before: the
/// copy engines for `send` / `recv` from `direct_min_bytes` on registered buffers, else
/// staging; `send_recv` LL on two ranks up to `ll_max_bytes`, then the direct kernel and the
/// copy engines on registered buffers, else a staged send and recv, even ranks first).
fn ref_point_to_point() -> Outcome {
    Ok(Some(P2p))
}

/// The reduce to a root (added with the surface of NCCL): LL up to `ll_part_max_bytes`, the
/// direct kernel from `direct_min_bytes` on registered buffers, else staging; forced: `ll`
/// (within `ll_max_bytes`), `staged` or `direct`; a copy on one rank.
fn ref_reduce(
    cfg: &CollectiveConfig,
    n: usize,
    bytes: usize,
    algo: Option<Algorithm>,
    reg: bool,
) -> Outcome {
    if n == 1 {
        return Ok(None);
    }
    let a = match algo {
        Some(a @ (LlOneShot | Staged | Direct)) => a,
        Some(_) => return Err(()),
        None if bytes <= cfg.ll_part_max_bytes => LlOneShot,
        None if bytes >= cfg.direct_min_bytes => Direct,
        None => Staged,
    };
    if a == LlOneShot {
        return ref_ll(cfg, bytes);
    }
    ref_try_direct(n, a, algo.is_some(), reg)
}

fn reference(cfg: &CollectiveConfig, call: Lowered, algo: Option<Algorithm>, reg: bool) -> Outcome {
    let (n, b) = (call.ranks, call.bytes);
    // Changed: every collective on one rank is a copy, whatever was forced (all-reduce and
    // reduce were already, below; all-gather, reduce-scatter, broadcast and all-to-all ran the
    // algorithm chosen for their size). Point-to-point calls on one rank are refused before.
    if n == 1 && call.collective != Collective::SendRecv {
        return Ok(None);
    }
    match call.collective {
        Collective::AllReduce => ref_all_reduce(cfg, n, b, algo, reg),
        Collective::AllGather => ref_all_gather(cfg, n, b, algo, reg),
        Collective::ReduceScatter => ref_reduce_scatter(cfg, n, b, algo, reg),
        Collective::Broadcast | Collective::AllToAll => ref_broadcast(cfg, n, b, algo, reg),
        Collective::Reduce => ref_reduce(cfg, n, b, algo, reg),
        Collective::SendRecv => ref_point_to_point(),
    }
}

fn ref_shapes(cfg: &CollectiveConfig, backend: BackendKind, x: u64) -> [LaunchConfig; 4] {
    let keeper = |b: u32| if b > 1 { b + 1 } else { b };
    // `ll_shape(packets = x)`.
    let packets = x.min(u32::MAX as u64) as u32;
    let (b, t) = if packets <= cfg.ll_single_block_packets {
        (1, packets.next_multiple_of(32).clamp(32, 1024))
    } else {
        (
            packets.div_ceil(cfg.ll_threads).clamp(1, cfg.ll_blocks),
            cfg.ll_threads,
        )
    };
    let ll = LaunchConfig::new(keeper(b), t);
    // `launch_ll128(bytes = x)`: 480-byte warp steps.
    let steps = x.div_ceil(480);
    let mut threads = (cfg.ll128_threads / 32).max(1) * 32;
    while threads > 32 && steps.div_ceil((threads / 32) as u64) < cfg.ll128_blocks as u64 {
        threads /= 2;
    }
    threads = (threads / 32).max(1) * 32;
    let blocks = steps
        .div_ceil((threads / 32) as u64)
        .clamp(1, cfg.ll128_max_blocks.max(1) as u64) as u32;
    let ll128 = LaunchConfig::new(keeper(blocks), threads);
    // `staged_config(bytes = x)`.
    let per_block: u64 = if backend == BackendKind::Cuda {
        64 << 10
    } else {
        1 << 20
    };
    let blocks = x
        .div_ceil(per_block)
        .clamp(1, cfg.staged_blocks.min(cfg.max_blocks) as u64) as u32;
    let staged = LaunchConfig::new(blocks, cfg.threads).with_shared_mem(16);
    // `launch_direct(work = x)`.
    let most = cfg.direct_blocks.min(cfg.max_blocks) as usize;
    let blocks = (x as usize).div_ceil(cfg.direct_block_bytes).clamp(1, most) as u32;
    // The direct kernel keeps every rank's buffers in shared memory since registered buffers
    // (16 bytes before: `mscclpp_shared::DIRECT_SHARED_BYTES`, 16 + 16 * MAX_DIRECT_RANKS).
    let direct = LaunchConfig::new(blocks, cfg.direct_threads).with_shared_mem(16 + 16 * 8);
    [ll, ll128, staged, direct]
}

fn ref_layout(cfg: &CollectiveConfig, n: usize) -> (u64, u64, u64, u64, usize) {
    let ll_slot = ref_ll_slot(cfg);
    let ll128_offset = 2 * n as u64 * ll_slot;
    // `ll128::line_bytes_for`: whole warp steps of 480 data bytes in four 128-byte lines.
    let ll128_slot = (cfg.ll128_max_bytes.div_ceil(480) * 512) as u64;
    let stage_offset = ll128_offset + 2 * n as u64 * ll128_slot;
    let total = stage_offset as usize + cfg.stage_bytes + 16 * n;
    // Changed: the point-to-point region follows the staging (16-byte aligned): per peer an
    // inbox (per lane two 16-byte headers, an 8-byte counter (all of them padded to 16
    // bytes), two chunk slots; two halves of LL packets, 16 bytes per 8), 16 bytes of
    // acknowledgements and 32 bytes of counters per lane.
    let lanes = cfg.p2p_lanes as usize;
    let ll_half = cfg.p2p_ll_bytes / 8 * 16;
    let inbox = lanes * 32 + up16(lanes * 8) + 2 * ll_half + 2 * lanes * up16(cfg.p2p_chunk_bytes);
    let total = up16(total) + n * (inbox + lanes * 16 + lanes * 32);
    (ll_slot, ll128_offset, ll128_slot, stage_offset, total)
}

fn ref_rows(cfg: &CollectiveConfig) -> u32 {
    cfg.max_blocks
        .max(cfg.staged_blocks)
        .max(cfg.direct_blocks)
        .max(3)
}

// ---- The grid ----

/// The defaults of both backends, and variants whose thresholds overlap differently (direct
/// and copy-engine sizes inside the LL ranges, two-shot from 2 ranks, a small CE scratch).
fn configs() -> Vec<(BackendKind, CollectiveConfig)> {
    let cuda = CollectiveConfig::for_backend(BackendKind::Cuda);
    let cpu = CollectiveConfig::for_backend(BackendKind::Cpu);
    let mut tight = cuda;
    tight.ll_two_shot_min_ranks = 2;
    tight.ll_part_max_bytes = tight.ll_max_bytes;
    tight.direct_min_bytes = 256 << 10;
    tight.ce_min_bytes = 512 << 10;
    tight.ce_all_reduce_min_bytes = 2 << 20;
    tight.ce_scratch_bytes = 64 << 10;
    tight.ce_min_pieces = 3;
    tight.ll_single_block_packets = 0;
    tight.ll128_blocks = 1;
    let mut odd = cpu;
    odd.ll_two_shot_min_ranks = 3;
    odd.ll_part_max_bytes = 100 << 10; // above ll_max_bytes (a config built by hand)
    odd.ll128_part_min_bytes = 0;
    odd.ce_scratch_bytes = 16;
    odd.max_blocks = 1;
    odd.ll_single_block_packets = 700;
    vec![
        (BackendKind::Cuda, cuda),
        (BackendKind::Cpu, cpu),
        (BackendKind::Cuda, tight),
        (BackendKind::Cpu, odd),
    ]
}

/// Sizes: small ones, powers of two and their neighbours, and every threshold of `cfg` with
/// its neighbours.
fn sizes(cfg: &CollectiveConfig) -> Vec<usize> {
    let mut s: Vec<usize> = (1..=17).collect();
    for k in 5..=31 {
        let p = 1usize << k;
        s.extend([p - 8, p - 1, p, p + 1, p + 16]);
    }
    for t in [
        cfg.ll_max_bytes,
        cfg.ll_part_max_bytes,
        cfg.ll128_min_bytes,
        cfg.ll128_max_bytes,
        cfg.ll128_part_min_bytes,
        cfg.ll_two_shot_min_bytes,
        cfg.direct_min_bytes,
        cfg.ce_min_bytes,
        cfg.ce_all_reduce_min_bytes,
    ] {
        s.extend([t.saturating_sub(1).max(1), t.max(1), t + 1]);
    }
    s.sort_unstable();
    s.dedup();
    s
}

const RANKS: [usize; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 16];

fn calls() -> Vec<(Collective, bool)> {
    vec![
        (Collective::AllReduce, false),
        (Collective::AllGather, false),
        (Collective::ReduceScatter, false),
        (Collective::Broadcast, false),
        (Collective::AllToAll, false),
        (Collective::Reduce, false),
        (Collective::SendRecv, false),
        (Collective::SendRecv, true),
    ]
}

#[test]
fn every_call_runs_what_it_ran_before_the_units() {
    let mut checked = 0usize;
    for (_, cfg) in configs() {
        for bytes in sizes(&cfg) {
            for n in RANKS {
                for (collective, one_way) in calls() {
                    if collective == Collective::SendRecv && n == 1 {
                        continue; // send/recv to oneself is refused before any choice
                    }
                    let call = Lowered {
                        collective,
                        one_way,
                        bytes,
                        ranks: n,
                        nodes: 1,
                        uniform: true,
                        dtype: DataType::F32,
                        op: ReduceOp::Sum.into(),
                    };
                    let forcings: Vec<Option<Algorithm>> = if collective == Collective::SendRecv {
                        vec![None] // send_recv, send and recv take no algorithm
                    } else {
                        // The algorithms of worlds of several nodes are refused on one
                        // (checked below), which the reference predates.
                        std::iter::once(None)
                            .chain(
                                Algorithm::ALL
                                    .into_iter()
                                    .filter(|a| !matches!(a, Port | Hierarchical))
                                    .map(Some),
                            )
                            .collect()
                    };
                    for a in [Port, Hierarchical] {
                        // (Every collective on one rank copies, whatever was forced.)
                        if n > 1 {
                            let got = library(&cfg, call, Some(a), true);
                            assert_eq!(got, Err(()), "{a:?} on one node: {call:?}");
                        }
                    }
                    for forced in forcings {
                        for reg in [true, false] {
                            let want = reference(&cfg, call, forced, reg);
                            let got = library(&cfg, call, forced, reg);
                            assert_eq!(
                                got, want,
                                "{call:?} forced {forced:?} registered {reg} with {cfg:?}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "only {checked} cases");
}

/// The README's table (2×H200 defaults and CPU defaults), so that the reference itself is
/// known to say what the documentation says.
#[test]
fn the_reference_says_what_the_readme_says() {
    let cuda = CollectiveConfig::for_backend(BackendKind::Cuda);
    let cpu = CollectiveConfig::for_backend(BackendKind::Cpu);
    let call = |collective, bytes, ranks| Lowered {
        collective,
        one_way: false,
        bytes,
        ranks,
        nodes: 1,
        uniform: true,
        dtype: DataType::F32,
        op: ReduceOp::Sum.into(),
    };
    let auto = |cfg: &CollectiveConfig, c: Lowered, reg| reference(cfg, c, None, reg);
    let ar = Collective::AllReduce;
    assert_eq!(
        auto(&cuda, call(ar, 64 << 10, 2), true),
        Ok(Some(LlOneShot))
    );
    assert_eq!(auto(&cuda, call(ar, 256 << 10, 2), true), Ok(Some(Ll128)));
    assert_eq!(
        auto(&cuda, call(ar, 256 << 10, 8), true),
        Ok(Some(LlTwoShot))
    );
    assert_eq!(auto(&cuda, call(ar, 8 << 10, 8), true), Ok(Some(LlOneShot)));
    assert_eq!(auto(&cuda, call(ar, 8 << 20, 2), true), Ok(Some(Direct)));
    assert_eq!(auto(&cuda, call(ar, 8 << 20, 2), false), Ok(Some(Staged)));
    // The copy engines take windows only (or a forced call): `CopyEngine` forced here.
    assert_eq!(auto(&cuda, call(ar, 256 << 20, 8), true), Ok(Some(Direct)));
    assert_eq!(
        reference(&cuda, call(ar, 256 << 20, 8), Some(CopyEngine), true),
        Ok(Some(CopyEngine))
    );
    assert_eq!(auto(&cuda, call(ar, 256 << 20, 9), true), Ok(Some(Staged)));
    assert_eq!(auto(&cuda, call(ar, 100, 1), true), Ok(None));
    let ag = Collective::AllGather;
    assert_eq!(
        auto(&cuda, call(ag, 64 << 10, 4), true),
        Ok(Some(LlOneShot))
    );
    assert_eq!(auto(&cuda, call(ag, 1 << 20, 4), true), Ok(Some(Ll128)));
    assert_eq!(auto(&cuda, call(ag, 8 << 20, 4), true), Ok(Some(Direct)));
    assert_eq!(auto(&cuda, call(ag, 32 << 20, 4), true), Ok(Some(Direct)));
    let rs = Collective::ReduceScatter;
    assert_eq!(auto(&cuda, call(rs, 32 << 20, 4), true), Ok(Some(Direct)));
    let sr = Collective::SendRecv;
    assert_eq!(auto(&cuda, call(sr, 1 << 20, 2), true), Ok(Some(P2p)));
    assert_eq!(auto(&cuda, call(sr, 16 << 20, 3), true), Ok(Some(P2p)));
    let rd = Collective::Reduce;
    assert_eq!(
        auto(&cuda, call(rd, 64 << 10, 4), true),
        Ok(Some(LlOneShot))
    );
    assert_eq!(auto(&cuda, call(rd, 8 << 20, 4), true), Ok(Some(Direct)));
    assert_eq!(auto(&cuda, call(rd, 8 << 20, 4), false), Ok(Some(Staged)));
    assert_eq!(auto(&cuda, call(rd, 800 << 10, 4), true), Ok(Some(Staged)));
    assert_eq!(auto(&cpu, call(ar, 4 << 10, 2), true), Ok(Some(Ll128)));
    let bc = Collective::Broadcast;
    assert_eq!(
        reference(&cuda, call(bc, 64, 2), Some(Ll128), true),
        Err(())
    );
    assert_eq!(
        reference(&cuda, call(rs, 64, 2), Some(CopyEngine), true),
        Err(())
    );
    assert_eq!(
        reference(&cuda, call(ar, 2 << 20, 2), Some(LlOneShot), true),
        Err(())
    );
    assert_eq!(
        reference(&cuda, call(ar, 100, 8), Some(LlTwoShot), true),
        Ok(Some(LlOneShot))
    );
    assert_eq!(
        reference(&cuda, call(ar, 64 << 20, 9), Some(Direct), true),
        Err(())
    );
    assert_eq!(
        reference(&cuda, call(ar, 64 << 20, 4), Some(Direct), false),
        Err(())
    );
}

#[test]
fn launch_shapes_and_scratch_layout_are_what_they_were() {
    for (backend, cfg) in configs() {
        let mut xs: Vec<u64> = (0..=40).collect();
        for k in 5..=34 {
            let p = 1u64 << k;
            xs.extend([p - 1, p, p + 1, p * 3 / 2]);
        }
        xs.extend([479, 480, 481, 960, 961, 1 << 40]);
        for x in xs {
            assert_eq!(
                library_shapes(&cfg, backend, x),
                ref_shapes(&cfg, backend, x),
                "{x} with {cfg:?}"
            );
        }
        for n in RANKS {
            assert_eq!(library_layout(&cfg, n), ref_layout(&cfg, n), "{n} ranks");
        }
        assert_eq!(library_rows(&cfg), ref_rows(&cfg));
    }
}
