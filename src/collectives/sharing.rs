//! Several ranks on one GPU (opt-in: [`CollectiveConfig::ranks_per_gpu`],
//! `MSCCLPP_RANKS_PER_GPU`).
//!
//! The mode is a property of how a job places its ranks, not a tuning: set-up reads
//! `MSCCLPP_RANKS_PER_GPU` whatever configuration it was given, and takes the larger of it and
//! the configuration's `ranks_per_gpu`; every rank must end with the same value
//! (`Error::ConfigMismatch` otherwise, on every rank alike).
//!
//! A kernel of one rank may wait for a kernel of another (every collective kernel does). On a
//! GPU of its own each rank's blocks are all resident; when ranks share a GPU, a rank's grid
//! that filled the GPU would leave the peer's kernel, which it waits for, nowhere to run. So
//! set-up learns, by one all-gather, which ranks share which GPU ([`check`]): more than
//! `ranks_per_gpu` on one GPU is refused (`Error::DuplicateGpu`, the default of 1 being NCCL's
//! rule); otherwise every rank gets the same budget of blocks per launch, the fewest
//! multiprocessors any sharing rank gets (`multiprocessors / ranks on that GPU`), and
//! [`Sharing::cap`] lowers every launch-shape setting to it. One block never needs more than
//! one multiprocessor, so at most one block per multiprocessor per rank keeps the blocks of
//! every rank's launch resident together whatever their registers and shared memory; the
//! budget is the same on every rank because blocks of the same index meet across ranks.
//!
//! The CPU backend's grid emulator runs every block on a thread of its own: its devices are
//! never shared in this sense (no PCI id), and nothing is capped there.

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::BackendKind;
use mscclpp_host::{Error, Result};
use mscclpp_shared::P2P_MAX_OPS;

use super::config::CollectiveConfig;

/// Blocks a rank needs resident at once: the point-to-point engine's launch serves up to
/// `P2P_MAX_OPS` transfers with a block each (at one lane).
pub(crate) const MIN_BLOCKS: u32 = P2P_MAX_OPS as u32;

/// Who shares a GPU with whom, as set-up learnt it (the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sharing {
    /// The most ranks on any one GPU (1: no GPU is shared).
    pub most_on_one_gpu: usize,
    /// Blocks per launch of every rank when some GPU is shared (its share of multiprocessors).
    pub blocks: Option<u32>,
}

impl Sharing {
    /// `cfg` with every launch shape within [`blocks`](Self::blocks): the staged, direct and
    /// LL kernels' block counts (the LL kernels add a keeper block, so one fewer), and the
    /// point-to-point engine's lanes (a launch holds up to `P2P_MAX_OPS` transfers of `lanes`
    /// blocks each).
    pub fn cap(&self, mut cfg: CollectiveConfig) -> CollectiveConfig {
        let Some(b) = self.blocks else {
            return cfg;
        };
        cfg.staged_blocks = cfg.staged_blocks.min(b);
        cfg.direct_blocks = cfg.direct_blocks.min(b);
        cfg.ll_blocks = cfg.ll_blocks.min(b - 1);
        cfg.ll128_max_blocks = cfg.ll128_max_blocks.min(b - 1);
        cfg.ll128_blocks = cfg.ll128_blocks.min(cfg.ll128_max_blocks);
        cfg.p2p_lanes = cfg.p2p_lanes.min((b / MIN_BLOCKS).max(1));
        cfg
    }
}

/// The environment variable of the mode (also `CollectiveConfig::ranks_per_gpu`'s).
pub const ENV_RANKS_PER_GPU: &str = "MSCCLPP_RANKS_PER_GPU";

/// Ranks allowed per GPU: the larger of `cfg.ranks_per_gpu` and [`ENV_RANKS_PER_GPU`] (module
/// docs), the variable read and clamped by the settings table as every setting is.
pub(crate) fn allowed(cfg: &CollectiveConfig) -> usize {
    let only_this = |name: &str| {
        (name == ENV_RANKS_PER_GPU)
            .then(|| std::env::var(name).ok())
            .flatten()
    };
    cfg.ranks_per_gpu
        .max(cfg.with_vars(only_this).ranks_per_gpu)
}

/// Ranks per GPU the environment allows ([`ENV_RANKS_PER_GPU`]; 1 when unset), as set-up reads
/// it: for programs that place ranks before they have a configuration (the bench).
pub fn ranks_per_gpu_in_env() -> usize {
    // Both backends' default is 1.
    allowed(&CollectiveConfig::for_backend(BackendKind::Cpu))
}

/// One rank as the all-gather carries it: `allowed machine/pci-bus-id multiprocessors`
/// (`allowed -` on the CPU backend). The machine is the running kernel's boot id, not the
/// bootstrap's node: nodes emulated on one host (`MSCCLPP_HOSTID`) share its GPUs, and
/// containers of one host see the same boot id, as they see the same GPUs.
fn describe(comm: &Communicator, allowed: usize) -> String {
    let g = comm.gpu();
    match (g.pci_bus_id(), g.multiprocessors()) {
        (Some(id), Some(sms)) => format!("{allowed} {}/{id} {sms}", machine_id()),
        _ => format!("{allowed} -"),
    }
}

/// This machine: its kernel's boot id, else its host name.
fn machine_id() -> String {
    [
        "/proc/sys/kernel/random/boot_id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .find_map(|p| {
        let s = std::fs::read_to_string(p).ok()?;
        let s = s.trim();
        (!s.is_empty()).then(|| s.replace([' ', '/'], "_"))
    })
    .unwrap_or_else(|| "this-machine".to_string())
}

/// Learns which ranks share a GPU (one all-gather, on every rank alike) and refuses more than
/// [`allowed`] on one, a share too small for the kernels ([`MIN_BLOCKS`]), or ranks that
/// allow different numbers.
pub(crate) fn check(comm: &Communicator, cfg: &CollectiveConfig) -> Result<Sharing> {
    let allowed = allowed(cfg);
    let all = comm.all_gather(describe(comm, allowed).as_bytes())?;
    let all: Vec<String> = all
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    let sharing = decide(&all, allowed)?;
    if comm.ranks_on_device() > 1 {
        warn_on_few_connections(comm.ranks_on_device());
    }
    Ok(sharing)
}

/// Streams the driver gives work queues of their own (`CUDA_DEVICE_MAX_CONNECTIONS`, default
/// 8): beyond, streams share queues, and a kernel queued behind a spinning one on a shared
/// queue cannot start — measured on an H200: 16 streams each with a waiting kernel and one
/// behind it met in 8 of 16 at the default, 16 of 16 at 32 (`scripts/gpu-probe/`). Ranks as
/// threads on one GPU each bring a few streams, so the mode wants the most, 32, set before
/// the process first uses CUDA.
pub const WANTED_CONNECTIONS: u32 = 32;

/// Warns (once per process) when `ranks` ranks of this process share a device and
/// `CUDA_DEVICE_MAX_CONNECTIONS` is below [`WANTED_CONNECTIONS`].
fn warn_on_few_connections(ranks: usize) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let set = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok());
    if set.is_some_and(|n| n >= WANTED_CONNECTIONS) {
        return;
    }
    WARNED.call_once(|| {
        tracing::warn!(
            "{ranks} ranks of this process share a GPU and CUDA_DEVICE_MAX_CONNECTIONS is {}: \
             kernels of different ranks may queue behind each other's and wait for ever; set \
             CUDA_DEVICE_MAX_CONNECTIONS={WANTED_CONNECTIONS} before the process first uses CUDA",
            set.map_or_else(|| "unset (8)".to_string(), |n| n.to_string())
        );
    });
}

/// One rank's description, parsed: (allowed, GPU, multiprocessors); no GPU on the CPU backend.
fn parse(d: &str) -> Option<(u64, Option<(&str, u32)>)> {
    let mut it = d.split(' ');
    let allowed = it.next()?.parse().ok()?;
    match (it.next()?, it.next()) {
        ("-", None) => Some((allowed, None)),
        (gpu, Some(sms)) if gpu != "-" && it.next().is_none() => {
            Some((allowed, Some((gpu, sms.parse().ok()?))))
        }
        _ => None,
    }
}

/// [`check`]'s decision over every rank's description, `mine` allowing `allowed` (pure, for
/// the tests).
pub(crate) fn decide(all: &[String], allowed: usize) -> Result<Sharing> {
    let mut parsed = Vec::with_capacity(all.len());
    for (rank, d) in all.iter().enumerate() {
        match parse(d) {
            Some((theirs, gpu)) if theirs == allowed as u64 => parsed.push(gpu),
            Some((theirs, _)) => {
                return Err(Error::ConfigMismatch {
                    what: "ranks_per_gpu (MSCCLPP_RANKS_PER_GPU)",
                    mine: allowed as u64,
                    rank,
                    theirs,
                });
            }
            None => {
                return Err(Error::ConfigMismatch {
                    what: "the GPU description's length (bytes)",
                    mine: 0,
                    rank,
                    theirs: d.len() as u64,
                });
            }
        }
    }
    let mut most = 1;
    let mut blocks: Option<u32> = None;
    for (first, gpu) in parsed.iter().enumerate() {
        let Some((gpu, sms)) = *gpu else { continue };
        let on_it = |g: &Option<(&str, u32)>| g.is_some_and(|(other, _)| other == gpu);
        // Each GPU once: at its lowest rank.
        if parsed[..first].iter().any(on_it) {
            continue;
        }
        let ranks: Vec<usize> = (first..parsed.len())
            .filter(|&r| on_it(&parsed[r]))
            .collect();
        let device = gpu.rsplit('/').next().unwrap_or_default().to_string();
        if ranks.len() > allowed {
            return Err(Error::DuplicateGpu {
                first,
                second: ranks[1],
                device,
                ranks: ranks.len(),
                allowed,
            });
        }
        if ranks.len() < 2 {
            continue;
        }
        most = most.max(ranks.len());
        let share = sms / ranks.len() as u32;
        if share < MIN_BLOCKS {
            return Err(Error::GpuShareTooSmall {
                device,
                ranks: ranks.len(),
                multiprocessors: sms,
                share,
                needed: MIN_BLOCKS,
                most: sms / MIN_BLOCKS,
            });
        }
        blocks = Some(blocks.map_or(share, |b| b.min(share)));
    }
    Ok(Sharing {
        most_on_one_gpu: most,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use mscclpp_host::Error;
    use mscclpp_host::gpu::BackendKind;

    use super::{CollectiveConfig, MIN_BLOCKS, Sharing, decide};

    /// Descriptions of ranks that all allow `allowed` (`-`: the CPU backend).
    fn gpus(allowed: usize, list: &[&str]) -> Vec<String> {
        list.iter().map(|s| format!("{allowed} {s}")).collect()
    }

    #[test]
    fn one_rank_per_gpu_and_the_cpu_backend_share_nothing() {
        for allowed in [1, 4] {
            let one_each = gpus(allowed, &["m/0000:18:00.0 132", "m/0000:2a:00.0 132"]);
            let s = decide(&one_each, allowed).expect("one rank per GPU");
            assert_eq!((s.most_on_one_gpu, s.blocks), (1, None));
            let cpu = gpus(allowed, &["-", "-", "-"]);
            assert_eq!(decide(&cpu, allowed).expect("cpu").blocks, None);
        }
    }

    #[test]
    fn a_second_rank_on_a_gpu_is_refused_unless_allowed() {
        match decide(&gpus(1, &["m/0000:18:00.0 132", "m/0000:18:00.0 132"]), 1) {
            Err(Error::DuplicateGpu {
                first: 0,
                second: 1,
                ranks: 2,
                allowed: 1,
                device,
            }) => assert_eq!(device, "0000:18:00.0"),
            other => panic!("{other:?}"),
        }
        let two = gpus(2, &["m/0000:18:00.0 132", "m/0000:18:00.0 132"]);
        let s = decide(&two, 2).expect("allowed");
        assert_eq!((s.most_on_one_gpu, s.blocks), (2, Some(66)));
        // The same bus id on another machine is another GPU.
        let machines = gpus(1, &["m/0000:18:00.0 132", "n/0000:18:00.0 132"]);
        assert_eq!(decide(&machines, 1).expect("two machines").blocks, None);
    }

    #[test]
    fn the_budget_is_the_smallest_share_of_any_shared_gpu() {
        // GPU A: ranks 0, 2, 3 (132 SMs: 44 each); GPU B: ranks 1, 4 (78 SMs: 39 each).
        let list = [
            "m/A 132", "m/B 78", "m/A 132", "m/A 132", "m/B 78", "m/C 16",
        ];
        match decide(&gpus(2, &list), 2) {
            Err(Error::DuplicateGpu {
                first: 0,
                second: 2,
                ranks: 3,
                allowed: 2,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let s = decide(&gpus(3, &list), 3).expect("allowed");
        assert_eq!((s.most_on_one_gpu, s.blocks), (3, Some(39)));
    }

    #[test]
    fn a_share_below_what_the_kernels_need_is_refused() {
        match decide(&gpus(9, &["m/A 132"; 9]), 9) {
            Err(Error::GpuShareTooSmall {
                ranks: 9,
                multiprocessors: 132,
                share: 14,
                needed,
                most: 8,
                ..
            }) => assert_eq!(needed, MIN_BLOCKS),
            other => panic!("{other:?}"),
        }
        let eight = decide(&gpus(8, &["m/A 132"; 8]), 8).expect("8 fit");
        assert_eq!((eight.most_on_one_gpu, eight.blocks), (8, Some(16)));
    }

    #[test]
    fn ranks_that_allow_different_numbers_or_send_garbage_are_refused_alike() {
        let mut all = gpus(2, &["m/A 132", "m/A 132"]);
        all[1] = "1 m/A 132".to_string();
        for mine in [1, 2] {
            match decide(&all, mine) {
                Err(Error::ConfigMismatch { rank, .. }) => assert_eq!(rank, mine - 1),
                other => panic!("{other:?}"),
            }
        }
        for garbage in ["", "2", "x m/A 132", "2 m/A", "2 m/A x", "2 - 7"] {
            let mut all = gpus(2, &["m/A 132", "m/A 132"]);
            all[1] = garbage.to_string();
            assert!(
                matches!(decide(&all, 2), Err(Error::ConfigMismatch { rank: 1, .. })),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn caps_bound_every_launch_shape() {
        let cfg = CollectiveConfig::for_backend(BackendKind::Cuda);
        let none = Sharing {
            most_on_one_gpu: 1,
            blocks: None,
        };
        assert_eq!(none.cap(cfg), cfg);
        for b in [MIN_BLOCKS, 33, 66] {
            let c = Sharing {
                most_on_one_gpu: 2,
                blocks: Some(b),
            }
            .cap(cfg);
            assert!(c.staged_blocks <= b && c.direct_blocks <= b);
            assert!(c.ll_blocks < b && c.ll128_max_blocks < b && c.ll128_blocks < b);
            assert!(c.p2p_lanes * MIN_BLOCKS <= b && c.p2p_lanes >= 1);
            // Settings that shape no grid stay.
            assert_eq!(c.ll_threads, cfg.ll_threads);
            assert_eq!(c.direct_min_bytes, cfg.direct_min_bytes);
        }
    }
}
