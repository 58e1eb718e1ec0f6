//! Where the ranks of a collective sweep go when no launcher started this process: how many
//! threads, on which backend. [`place_threads`] decides from the selected backend, whether
//! `MSCCLPP_BACKEND` forced it, the device count and `-g`; it is pure, so every case is
//! tested without a GPU.
//!
//! `per_gpu` is `MSCCLPP_RANKS_PER_GPU` (1 when unset): the ranks that may share one GPU.
//!
//! | backend | `-g` | devices | ranks |
//! |---|---|---|---|
//! | CPU | none / n | – | 2 / n threads on the CPU backend |
//! | CUDA | n | ≥ n | n, one GPU each |
//! | CUDA | n | < n ≤ devices × per_gpu | n, rank r on GPU r mod devices, with a note ([`SHARED`]) |
//! | CUDA | n | devices × per_gpu < n | refused: one GPU per rank, or a larger `MSCCLPP_RANKS_PER_GPU` |
//! | CUDA | none | ≥ 2, or 1 with per_gpu ≥ 2 | devices × per_gpu (a note when per_gpu ≥ 2) |
//! | CUDA, chosen automatically | none | 1 (per_gpu 1) | 2 on the CPU backend, with a note ([`ONE_GPU`]) |
//! | CUDA, forced | none | 1 (per_gpu 1) | refused, saying `-g 1`, `MSCCLPP_RANKS_PER_GPU` or unset `MSCCLPP_BACKEND` |
//!
//! Why one GPU runs 2 ranks on the CPU backend: README's main command is a two-rank
//! all-reduce with data checks. The other choices on one GPU show less. A world of one rank
//! on the GPU moves nothing between GPUs: an in-place all-reduce of one rank is no work at
//! all, so its row would time empty launches. Two ranks sharing one GPU would need both
//! ranks' kernels resident at once, which a large launch does not get (they would wait for
//! each other until their spin budgets ran out). On the CPU backend the same two ranks run
//! the whole stack (bootstrap, connections, proxy, the very kernels the GPUs run) and check
//! every element, so the newcomer sees the collectives work; the note then gives the
//! commands that use the GPU (`-g 1`, `mscclpp-info`) and says that two or more GPUs are
//! all used.

use mscclpp::host::gpu::BackendKind;

/// What the run does, and why when it is not what the machine suggests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The backend the ranks run on.
    pub backend: BackendKind,
    /// Ranks, as threads of this process (rank `r` on device `r`).
    pub ranks: usize,
    /// Printed after the results: what ran instead of the machine's default, and how to get
    /// more.
    pub note: Option<&'static str>,
}

/// The note of a one-GPU machine.
pub const ONE_GPU: &str = "\
# One GPU found: a collective needs two ranks, one GPU each, so this run checked the two-rank
# collective on the CPU backend (the kernels the GPUs run, on threads; the times are not GPU
# times). On this GPU: `MSCCLPP_RANKS_PER_GPU=8 mscclpp-bench <op> -g 8 -c` (8 ranks sharing
# it: a correctness run), `mscclpp-bench <op> -g 1` (one rank: no data crosses a link) and
# `mscclpp-info` (a self-check of the kernels); with two or more GPUs, every one is used.";

/// The note of ranks sharing GPUs (the header's too).
pub const SHARED: &str = "\
# Several ranks share each GPU (MSCCLPP_RANKS_PER_GPU): each runs on its share of the
# multiprocessors and no data crosses a link, so the data check means what it says and the
# times are not link figures (compare them with nothing measured on one GPU per rank).";

/// Where the ranks go (see the module docs). `forced`: `MSCCLPP_BACKEND` chose `backend`;
/// `per_gpu`: the ranks that may share a GPU. `Err` carries the reason for the command line.
pub fn place_threads(
    backend: BackendKind,
    forced: bool,
    devices: usize,
    per_gpu: usize,
    requested: Option<usize>,
) -> Result<Placement, String> {
    let per_gpu = per_gpu.max(1);
    let on_gpus = |ranks| Placement {
        backend: BackendKind::Cuda,
        ranks,
        note: (ranks > devices).then_some(SHARED),
    };
    match (backend, requested) {
        (BackendKind::Cpu, n) => Ok(Placement {
            backend: BackendKind::Cpu,
            ranks: n.unwrap_or(2),
            note: None,
        }),
        (BackendKind::Cuda, Some(n)) if n > devices * per_gpu => Err(format!(
            "{n} ranks as threads need {n} GPUs, and {devices} {} present (or let ranks share \
             them: MSCCLPP_RANKS_PER_GPU={})",
            if devices == 1 { "is" } else { "are" },
            n.div_ceil(devices.max(1))
        )),
        (BackendKind::Cuda, Some(n)) => Ok(on_gpus(n)),
        (BackendKind::Cuda, None) if devices * per_gpu >= 2 => Ok(on_gpus(devices * per_gpu)),
        (BackendKind::Cuda, None) if devices == 1 && !forced => Ok(Placement {
            backend: BackendKind::Cpu,
            ranks: 2,
            note: Some(ONE_GPU),
        }),
        (BackendKind::Cuda, None) if devices == 1 => Err(
            "2 ranks as threads need 2 GPUs, and 1 is present (-g 1 runs one rank on it; \
             MSCCLPP_RANKS_PER_GPU=2 lets two share it; without MSCCLPP_BACKEND=cuda two ranks \
             run on the CPU backend)"
                .into(),
        ),
        (BackendKind::Cuda, None) => Err("the CUDA backend reports no device".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BackendKind::{Cpu, Cuda};

    fn ranks(p: Result<Placement, String>) -> (BackendKind, usize, bool) {
        let p = p.expect("placed");
        (p.backend, p.ranks, p.note.is_some())
    }

    #[test]
    fn the_cpu_backend_runs_two_ranks_unless_told() {
        assert_eq!(
            ranks(place_threads(Cpu, false, 0, 1, None)),
            (Cpu, 2, false)
        );
        assert_eq!(
            ranks(place_threads(Cpu, true, 1, 1, Some(5))),
            (Cpu, 5, false)
        );
    }

    #[test]
    fn gpus_run_one_rank_each() {
        assert_eq!(
            ranks(place_threads(Cuda, false, 2, 1, None)),
            (Cuda, 2, false)
        );
        assert_eq!(
            ranks(place_threads(Cuda, true, 8, 1, None)),
            (Cuda, 8, false)
        );
        assert_eq!(
            ranks(place_threads(Cuda, false, 8, 1, Some(3))),
            (Cuda, 3, false)
        );
        assert_eq!(
            ranks(place_threads(Cuda, true, 1, 1, Some(1))),
            (Cuda, 1, false)
        );
        let e = place_threads(Cuda, false, 2, 1, Some(4)).expect_err("4 ranks on 2 GPUs");
        assert!(
            e.contains("4 ranks as threads need 4 GPUs, and 2 are present"),
            "{e}"
        );
    }

    #[test]
    fn one_gpu_runs_two_ranks_on_the_cpu_and_says_so() {
        let p = place_threads(Cuda, false, 1, 1, None).expect("placed");
        assert_eq!((p.backend, p.ranks), (Cpu, 2));
        let note = p.note.expect("a note");
        assert!(
            note.contains("One GPU found") && note.contains("-g 1"),
            "{note}"
        );
        assert!(note.lines().all(|l| l.starts_with("# ")), "{note}");
    }

    #[test]
    fn one_gpu_with_cuda_forced_is_refused_with_the_ways_out() {
        let e = place_threads(Cuda, true, 1, 1, None).expect_err("forced CUDA, one GPU");
        assert!(e.contains("-g 1") && e.contains("MSCCLPP_BACKEND"), "{e}");
        let e = place_threads(Cuda, true, 0, 1, None).expect_err("no device");
        assert!(e.contains("no device"), "{e}");
    }

    #[test]
    fn ranks_share_gpus_only_as_far_as_allowed() {
        let p = place_threads(Cuda, true, 1, 8, Some(8)).expect("8 on one GPU");
        assert_eq!((p.backend, p.ranks, p.note), (Cuda, 8, Some(SHARED)));
        let p = place_threads(Cuda, false, 1, 4, None).expect("per_gpu on one GPU");
        assert_eq!((p.backend, p.ranks, p.note), (Cuda, 4, Some(SHARED)));
        let p = place_threads(Cuda, false, 2, 3, None).expect("two GPUs, three each");
        assert_eq!((p.ranks, p.note), (6, Some(SHARED)));
        // No more ranks than GPUs: nothing shared, no note, whatever per_gpu allows.
        let p = place_threads(Cuda, false, 4, 2, Some(3)).expect("3 of 4");
        assert_eq!((p.ranks, p.note), (3, None));
        let e = place_threads(Cuda, false, 1, 4, Some(5)).expect_err("5 on one GPU, 4 allowed");
        assert!(e.contains("MSCCLPP_RANKS_PER_GPU=5"), "{e}");
        // SHARED is a header block: every line a comment.
        assert!(SHARED.lines().all(|l| l.starts_with("# ")), "{SHARED}");
    }
}
