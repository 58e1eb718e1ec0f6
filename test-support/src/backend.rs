//! The backend under test and how many ranks it can hold.
//!
//! The backend is chosen as users get it: `MSCCLPP_BACKEND=cuda|cpu`, else CUDA when a GPU is
//! present, else the CPU backend (`BackendKind::select`). Rank `r` runs on device
//! `r % devices`.
//!
//! On the CPU backend every rank count runs (its ranks share its one device). On CUDA a test
//! of `R` ranks needs a GPU per rank, unless the several-ranks-per-GPU mode is on:
//! `MSCCLPP_RANKS_PER_GPU=N` (an integer of at least 1, default 1) lets `N` ranks share a GPU,
//! so the test runs when `devices * N >= R`. The library's side of the mode reads the same
//! variable; child processes get it from the parent ([`crate::process`] passes it on).

use mscclpp_host::gpu::{BackendKind, Gpu, Module};

/// The environment variable of the several-ranks-per-GPU mode.
pub const RANKS_PER_GPU: &str = "MSCCLPP_RANKS_PER_GPU";

/// The backend under test. Panics (failing the test) when `MSCCLPP_BACKEND` names none.
pub fn backend() -> BackendKind {
    BackendKind::select().unwrap_or_else(|e| panic!("choosing the backend under test: {e}"))
}

/// Devices of the backend under test (at least 1 on the CPU backend).
pub fn device_count() -> usize {
    let kind = backend();
    kind.device_count()
        .unwrap_or_else(|e| panic!("counting the devices of the {kind:?} backend: {e}"))
}

/// Ranks that may share one GPU: `MSCCLPP_RANKS_PER_GPU`, 1 when unset. Panics (failing the
/// test) on a value that is not an integer of at least 1: a run meant for the mode must not
/// quietly run without it.
pub fn ranks_per_gpu() -> usize {
    parse_ranks_per_gpu(std::env::var(RANKS_PER_GPU).ok().as_deref())
        .unwrap_or_else(|bad| panic!("{RANKS_PER_GPU}={bad:?} is not an integer of at least 1"))
}

/// [`ranks_per_gpu`] of the variable's value (`None`: unset); `Err` holds a bad value.
fn parse_ranks_per_gpu(value: Option<&str>) -> Result<usize, String> {
    match value {
        None => Ok(1),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(v.to_string()),
        },
    }
}

/// Device `ordinal` of the backend under test, wrapping around when it has fewer devices
/// (rank `r` on device `r % devices`).
pub fn gpu(ordinal: usize) -> Gpu {
    let kind = backend();
    let count = device_count();
    assert!(count > 0, "the {kind:?} backend has no device");
    Gpu::open(kind, ordinal % count).unwrap_or_else(|e| {
        panic!(
            "opening device {} of the {kind:?} backend: {e}",
            ordinal % count
        )
    })
}

/// `ptx` (e.g. `mscclpp::DEVICE_PTX`, the built-in kernels) loaded on `gpu`.
pub fn module(gpu: &Gpu, ptx: &str) -> Module {
    gpu.load_ptx(ptx)
        .unwrap_or_else(|e| panic!("loading the PTX on {:?}: {e}", gpu.kind()))
}

/// Whether the backend under test can run `ranks` ranks (module docs); prints
/// `NOT RUN: <test> needs R GPUs …` on standard error when not, so the caller returns and the
/// test passes without running.
pub fn enough_gpus(test: &str, ranks: usize) -> bool {
    let kind = backend();
    if kind == BackendKind::Cpu {
        return true;
    }
    match shortfall(ranks, device_count(), ranks_per_gpu()) {
        None => true,
        Some(why) => {
            eprintln!("NOT RUN: {test} {why}");
            false
        }
    }
}

/// Whether the backend under test can run `ranks` ranks, saying nothing (the CPU backend
/// always can; CUDA: module docs).
pub fn gpus_suffice(ranks: usize) -> bool {
    backend() == BackendKind::Cpu || shortfall(ranks, device_count(), ranks_per_gpu()).is_none()
}

/// Why `ranks` ranks cannot run on `devices` GPUs of which `per_gpu` ranks may share each, or
/// `None` when they can.
fn shortfall(ranks: usize, devices: usize, per_gpu: usize) -> Option<String> {
    if devices.saturating_mul(per_gpu) >= ranks {
        return None;
    }
    let mode = if per_gpu > 1 {
        format!(" ({RANKS_PER_GPU}={per_gpu})")
    } else {
        String::new()
    };
    Some(format!(
        "needs {ranks} GPUs (one per rank; or set {RANKS_PER_GPU}), the cuda backend has {devices}{mode}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_counts_shared_gpus() {
        assert_eq!(shortfall(2, 2, 1), None);
        assert_eq!(shortfall(8, 1, 8), None);
        assert_eq!(shortfall(4, 2, 2), None);
        assert_eq!(
            shortfall(2, 1, 1).as_deref(),
            Some(
                "needs 2 GPUs (one per rank; or set MSCCLPP_RANKS_PER_GPU), the cuda backend has 1"
            )
        );
        assert_eq!(
            shortfall(5, 2, 2).as_deref(),
            Some(
                "needs 5 GPUs (one per rank; or set MSCCLPP_RANKS_PER_GPU), the cuda backend has 2 (MSCCLPP_RANKS_PER_GPU=2)"
            )
        );
        assert_eq!(
            shortfall(1, 0, 1).as_deref().map(|s| s.contains("has 0")),
            Some(true)
        );
    }

    #[test]
    fn ranks_per_gpu_is_an_integer_of_at_least_one() {
        assert_eq!(parse_ranks_per_gpu(None), Ok(1));
        assert_eq!(parse_ranks_per_gpu(Some("4")), Ok(4));
        assert_eq!(parse_ranks_per_gpu(Some(" 2 ")), Ok(2));
        assert_eq!(parse_ranks_per_gpu(Some("0")), Err("0".into()));
        assert_eq!(parse_ranks_per_gpu(Some("two")), Err("two".into()));
        assert_eq!(parse_ranks_per_gpu(Some("-1")), Err("-1".into()));
    }
}
