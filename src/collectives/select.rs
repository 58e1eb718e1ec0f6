//! The choice of algorithm, as a pure function of the configuration and the call (no GPU, no
//! communicator), so that it can be tested over every size, rank count and forced algorithm.

use mscclpp_shared::{MAX_DIRECT_RANKS, packet::ll128};

use super::{Algorithm, Collective, CollectiveConfig, ce_all_reduce, up16};

/// One call as the choice sees it.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(test), allow(dead_code))] // the pinning test's entry until the dispatch uses it
pub(crate) struct Call {
    /// The collective (`SendRecv` for `send_recv`, `send` and `recv`).
    pub collective: Collective,
    /// `send` or `recv` alone (with `SendRecv`), not a `send_recv`.
    pub one_way: bool,
    /// Bytes: the whole message of all-reduce, broadcast and the point-to-point calls, one
    /// part of the others.
    pub bytes: usize,
    /// Ranks of the communicator.
    pub ranks: usize,
}

/// What a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))] // the pinning test's entry until the dispatch uses it
pub(crate) enum Decision {
    /// A copy from input to output, no algorithm (an all-reduce on one rank).
    Copy,
    /// This algorithm (what `Collectives::last_algorithm` then reports).
    Run(Algorithm),
}

/// Rows of channels (one per block) every configuration gets: enough for the staged and
/// direct kernels and the copy-engine all-reduce's pipeline.
pub(crate) fn channel_rows(cfg: &CollectiveConfig) -> u32 {
    (cfg.max_blocks.max(cfg.staged_blocks))
        .max(cfg.direct_blocks)
        .max(ce_all_reduce::ROWS)
}

/// `(ll_slot_bytes, ll128_offset, ll128_slot_bytes, stage_offset, total)` of the scratch of
/// `n` ranks: the LL16 region, the LL128 region (each two halves of `n` slots), staging.
pub(crate) fn scratch_layout(cfg: &CollectiveConfig, n: usize) -> (u64, u64, u64, u64, usize) {
    let ll_slot_bytes = (up16(cfg.ll_max_bytes).div_ceil(8) * 16) as u64;
    let ll128_offset = 2 * n as u64 * ll_slot_bytes;
    let ll128_slot_bytes = ll128::line_bytes_for(cfg.ll128_max_bytes) as u64;
    let stage_offset = ll128_offset + 2 * n as u64 * ll128_slot_bytes;
    let total = stage_offset as usize + cfg.stage_bytes + 16 * n;
    (
        ll_slot_bytes,
        ll128_offset,
        ll128_slot_bytes,
        stage_offset,
        total,
    )
}

/// The all-reduce's algorithm for `bytes` when the caller forces none.
pub(crate) fn all_reduce_choice(cfg: &CollectiveConfig, n: usize, bytes: usize) -> Algorithm {
    let many = n >= cfg.ll_two_shot_min_ranks;
    if !many && (cfg.ll128_min_bytes..=cfg.ll128_max_bytes).contains(&bytes) {
        Algorithm::Ll128
    } else if bytes <= cfg.ll_max_bytes {
        if many && bytes >= cfg.ll_two_shot_min_bytes {
            Algorithm::LlTwoShot
        } else {
            Algorithm::LlOneShot
        }
    } else if bytes >= cfg.ce_all_reduce_min_bytes {
        Algorithm::CopyEngine
    } else if bytes >= cfg.direct_min_bytes {
        Algorithm::Direct
    } else {
        Algorithm::Staged
    }
}

/// Whether a per-part collective (all-gather, reduce-scatter) of `part` bytes takes LL128.
pub(crate) fn ll128_part(
    cfg: &CollectiveConfig,
    n: usize,
    part: usize,
    algo: Option<Algorithm>,
) -> bool {
    match algo {
        Some(a) => a == Algorithm::Ll128,
        None => n > 1 && (cfg.ll128_part_min_bytes..=cfg.ll128_max_bytes).contains(&part),
    }
}

/// The path of a per-part collective of `part` bytes.
pub(crate) fn part_algorithm(
    cfg: &CollectiveConfig,
    part: usize,
    ll: bool,
    ce: bool,
    algo: Option<Algorithm>,
) -> Result<Algorithm, &'static str> {
    match algo {
        Some(Algorithm::TwoShotPut | Algorithm::Ll128 | Algorithm::LlTwoShot) => {
            Err("an all-reduce algorithm for this collective")
        }
        Some(Algorithm::LlOneShot) if !ll => Err("an LL variant of this collective"),
        None if ll && part <= cfg.ll_part_max_bytes => Ok(Algorithm::LlOneShot),
        Some(Algorithm::CopyEngine) if !ce => {
            Err("a copy-engine reduction (use `direct` or `staged`)")
        }
        Some(a) => Ok(a),
        None if ce && part >= cfg.ce_min_bytes => Ok(Algorithm::CopyEngine),
        None if part >= cfg.direct_min_bytes => Ok(Algorithm::Direct),
        None => Ok(Algorithm::Staged),
    }
}

/// The two-shot LL all-reduce's part (bytes, whole packets) of `bytes` on `n` ranks, or `None`
/// when the call is too small for every rank to own a non-empty part, or two parts of packets
/// do not fit an LL slot of `ll_slot_bytes` (then the one-shot kernel runs).
pub(crate) fn two_shot_part(n: usize, bytes: u64, ll_slot_bytes: u64) -> Option<u64> {
    let n = n as u64;
    let part = bytes.div_ceil(n).next_multiple_of(8);
    if (n - 1) * part >= bytes || 4 * part > ll_slot_bytes {
        None
    } else {
        Some(part)
    }
}

/// Whether a point-to-point transfer of `bytes` tries the copy engines on registered buffers.
pub(crate) fn p2p_direct(cfg: &CollectiveConfig, n: usize, bytes: usize) -> bool {
    bytes >= cfg.direct_min_bytes && n <= MAX_DIRECT_RANKS
}

/// What `call` runs, forced to `forced` or not, when every rank's buffers can (`registered`)
/// or cannot be shared for the direct and copy-engine paths; `Err` with what is unsupported
/// when a forced algorithm cannot serve it.
#[cfg_attr(not(test), allow(dead_code))] // the pinning test's entry until the dispatch uses it
pub(crate) fn decide(
    cfg: &CollectiveConfig,
    call: Call,
    forced: Option<Algorithm>,
    registered: bool,
) -> Result<Decision, &'static str> {
    let (bytes, n) = (call.bytes, call.ranks);
    let ll = |b: usize| {
        if b > cfg.ll_max_bytes {
            Err("an LL call above ll_max_bytes per part")
        } else {
            Ok(Decision::Run(Algorithm::LlOneShot))
        }
    };
    let ll128 = |b: usize| {
        if b > cfg.ll128_max_bytes {
            Err("an LL128 call above ll128_max_bytes")
        } else {
            Ok(Decision::Run(Algorithm::Ll128))
        }
    };
    let buffers = |a: Algorithm| {
        if a == Algorithm::Staged {
            Ok(Decision::Run(Algorithm::Staged))
        } else if n > MAX_DIRECT_RANKS {
            if forced.is_some() {
                Err("the direct path on more than MAX_DIRECT_RANKS ranks")
            } else {
                Ok(Decision::Run(Algorithm::Staged))
            }
        } else if registered {
            Ok(Decision::Run(a))
        } else if forced.is_some() {
            Err("the direct path on these buffers")
        } else {
            Ok(Decision::Run(Algorithm::Staged))
        }
    };
    let p2p = p2p_direct(cfg, n, bytes) && registered;
    match call.collective {
        Collective::AllReduce => {
            let algo = forced.unwrap_or_else(|| all_reduce_choice(cfg, n, bytes));
            if n == 1 {
                return Ok(Decision::Copy);
            }
            match algo {
                Algorithm::LlOneShot => ll(bytes),
                Algorithm::Ll128 => ll128(bytes),
                Algorithm::LlTwoShot => {
                    if bytes > cfg.ll_max_bytes {
                        return ll(bytes);
                    }
                    let slot = scratch_layout(cfg, n).0;
                    match two_shot_part(n, bytes as u64, slot) {
                        Some(_) => Ok(Decision::Run(Algorithm::LlTwoShot)),
                        None => ll(bytes),
                    }
                }
                Algorithm::Direct => buffers(algo),
                Algorithm::CopyEngine => match buffers(algo)? {
                    Decision::Run(Algorithm::CopyEngine) => {
                        let (_, piece, _, slot) =
                            ce_all_reduce::plan(bytes, n, cfg.ce_scratch_bytes, cfg.ce_min_pieces);
                        if piece > slot {
                            Err("a copy-engine all-reduce with this little scratch")
                        } else {
                            Ok(Decision::Run(Algorithm::CopyEngine))
                        }
                    }
                    other => Ok(other),
                },
                Algorithm::Staged | Algorithm::TwoShotPut => Ok(Decision::Run(algo)),
            }
        }
        Collective::AllGather | Collective::ReduceScatter => {
            if ll128_part(cfg, n, bytes, forced) {
                return ll128(bytes);
            }
            let rs = call.collective == Collective::ReduceScatter;
            let a = if rs && forced.is_none() && bytes <= cfg.ll_max_bytes && n > 1 {
                Algorithm::LlOneShot
            } else {
                part_algorithm(cfg, bytes, true, !rs, forced)?
            };
            if a == Algorithm::LlOneShot {
                return ll(bytes);
            }
            buffers(a)
        }
        Collective::Broadcast | Collective::AllToAll => {
            let a = part_algorithm(cfg, bytes, true, true, forced)?;
            if a == Algorithm::LlOneShot {
                return ll(bytes);
            }
            buffers(a)
        }
        Collective::SendRecv if call.one_way => Ok(Decision::Run(if p2p {
            Algorithm::CopyEngine
        } else {
            Algorithm::Staged
        })),
        Collective::SendRecv => {
            if n == 2 && bytes <= cfg.ll_max_bytes {
                Ok(Decision::Run(Algorithm::LlOneShot))
            } else if p2p && bytes < cfg.ce_min_bytes {
                Ok(Decision::Run(Algorithm::Direct))
            } else if p2p {
                Ok(Decision::Run(Algorithm::CopyEngine))
            } else {
                Ok(Decision::Run(Algorithm::Staged))
            }
        }
    }
}
