//! The sizes and launch shapes of one `Collectives` ([`CollectiveConfig`]), from one table.
//!
//! Every setting is one row of the `settings!` invocation below: its documentation, its type,
//! its default on the CUDA and on the CPU backend, the environment variable that overrides it
//! (if any) and the limits such a value is clamped to. The macro derives from the rows the
//! struct and its field docs, [`CollectiveConfig::for_backend`], [`CollectiveConfig::with_env`],
//! [`CollectiveConfig::settings`] (what `Collectives::with_config` checks is the same on every
//! rank) and [`CollectiveConfig::TABLE`] (the rows as data, for tools). A new setting is one new
//! row.

use mscclpp_host::gpu::BackendKind;

/// What an environment value of a setting is clamped to (the defaults are not: the CPU
/// backend's thread counts are below the GPU's warp-sized minimums, on purpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Any value.
    None,
    /// At least this much.
    AtLeast(u64),
    /// At most the value of the named setting (applied after that setting's own).
    AtMost(&'static str),
    /// Between the two, inclusive.
    Range(u64, u64),
    /// Between the first two, inclusive, rounded down to a multiple of the third.
    RangeStep(u64, u64, u64),
}

impl Limit {
    /// `v` within this limit, in `cfg`.
    pub fn apply(self, v: u64, cfg: &CollectiveConfig) -> u64 {
        match self {
            Limit::None => v,
            Limit::AtLeast(lo) => v.max(lo),
            Limit::AtMost(name) => match cfg.settings().iter().find(|(n, _)| *n == name) {
                Some(&(_, hi)) => v.min(hi),
                None => v,
            },
            Limit::Range(lo, hi) => v.clamp(lo, hi),
            Limit::RangeStep(lo, hi, step) => v.clamp(lo, hi) / step.max(1) * step.max(1),
        }
    }
}

/// One setting of [`CollectiveConfig`], as data.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The field's name.
    pub name: &'static str,
    /// Its default on the CUDA backend.
    pub cuda: u64,
    /// Its default on the CPU backend.
    pub cpu: u64,
    /// The environment variable [`CollectiveConfig::with_env`] reads for it.
    pub env: Option<&'static str>,
    /// What an environment value is clamped to.
    pub limit: Limit,
    set: fn(&mut CollectiveConfig, u64),
}

impl Setting {
    /// Its default on `backend`.
    pub fn default_for(&self, backend: BackendKind) -> u64 {
        match backend {
            BackendKind::Cuda => self.cuda,
            BackendKind::Cpu => self.cpu,
        }
    }
}

macro_rules! settings {
    (@env) => { None };
    (@env $env:literal) => { Some($env) };
    (@limit) => { Limit::None };
    (@limit $limit:expr) => { $limit };
    (@env_doc) => { "" };
    (@env_doc $env:literal) => { concat!("; environment variable `", $env, "`") };
    (@limit_doc) => { "" };
    (@limit_doc $limit:expr) => { concat!(" (clamped: `", stringify!($limit), "`)") };
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty {
            cuda: $cuda:expr,
            cpu: $cpu:expr
            $(, env: $env:literal)?
            $(, limit: $limit:expr)?
            $(,)?
        }
    ),* $(,)?) => {
        /// Sizes of the communicator-owned buffers, the thresholds of the automatic choice of
        /// algorithm, and launch shapes. Every rank must use the same values
        /// (`Collectives::with_config` checks). Built from one table (`config.rs`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct CollectiveConfig {
            $(
                $(#[doc = $doc])*
                ///
                #[doc = concat!(
                    "Default `", stringify!($cuda), "` on CUDA, `", stringify!($cpu),
                    "` on the CPU backend", settings!(@env_doc $($env)?),
                    settings!(@limit_doc $($limit)?), "."
                )]
                pub $name: $ty,
            )*
        }

        impl CollectiveConfig {
            /// Every setting as data, in declaration order.
            pub const TABLE: [Setting; [$(stringify!($name)),*].len()] = [$(
                Setting {
                    name: stringify!($name),
                    cuda: ($cuda) as u64,
                    cpu: ($cpu) as u64,
                    env: settings!(@env $($env)?),
                    limit: settings!(@limit $($limit)?),
                    set: |c: &mut CollectiveConfig, v: u64| {
                        c.$name = <$ty>::try_from(v).unwrap_or(<$ty>::MAX)
                    },
                },
            )*];

            /// Defaults for a backend: GPU-sized on CUDA, small on the CPU backend (threads
            /// are OS threads there).
            pub fn for_backend(kind: BackendKind) -> Self {
                match kind {
                    BackendKind::Cuda => Self { $($name: $cuda,)* },
                    BackendKind::Cpu => Self { $($name: $cpu,)* },
                }
            }

            /// Every setting with its name, in [`TABLE`](Self::TABLE) order: what every rank
            /// must share (checked at `Collectives::with_config`).
            pub fn settings(&self) -> [(&'static str, u64); Self::TABLE.len()] {
                [$((stringify!($name), self.$name as u64)),*]
            }
        }
    };
}

settings! {
    /// Largest all-reduce the LL algorithm serves, bytes (also the most any LL call may move
    /// per part: the size of an LL slot).
    ll_max_bytes: usize { cuda: 1 << 20, cpu: 64 << 10 },
    /// Largest part for which all-gather, reduce-scatter, all-to-all and broadcast take the LL
    /// algorithm unless another is forced (at most `ll_max_bytes`; a two-rank `send_recv`
    /// takes it up to `ll_max_bytes`).
    ll_part_max_bytes: usize {
        cuda: 512 << 10,
        cpu: 16 << 10,
        env: "MSCCLPP_LL_PART_MAX_BYTES",
        limit: Limit::AtMost("ll_max_bytes"),
    },
    /// Smallest all-reduce that takes the LL128 algorithm unless one is forced.
    ll128_min_bytes: usize {
        // 2xH200: LL16 is as fast to 128 KiB (3.4 us), LL128 faster from 256 KiB. CPU:
        // between LL16's small sizes and the direct kernel, as on the GPU.
        cuda: 128 << 10,
        cpu: 2 << 10,
        env: "MSCCLPP_LL128_MIN_BYTES",
    },
    /// Largest all-reduce (or all-gather or reduce-scatter part) the LL128 algorithm serves,
    /// bytes (sizes its slots).
    ll128_max_bytes: usize {
        // 2xH200, sixth session: LL128 beats the direct kernel up to the largest size
        // measured, 4 MiB (all-reduce 16.1 us against 22.4; all-gather and reduce-scatter
        // 4 MiB parts 15.9 against 19.9-26.3).
        cuda: 4 << 20,
        cpu: 16 << 10,
    },
    /// Smallest part of an all-gather or reduce-scatter that takes the LL128 algorithm unless
    /// one is forced (up to `ll128_max_bytes`).
    ll128_part_min_bytes: usize {
        // 2xH200: LL128 from 128 KiB parts (all-gather 256 KiB in all: 3.16 us, LL16 3.26;
        // 64 KiB parts: LL16 2.94, LL128 3.07).
        cuda: 128 << 10,
        cpu: 2 << 10,
        env: "MSCCLPP_LL128_PART_MIN_BYTES",
    },
    /// Most threads per block of the LL128 kernel (a multiple of 32).
    ll128_threads: u32 {
        // 2xH200, 1 MiB: 6.11 us with 512-thread blocks, 6.28-6.51 with 1024 (the keeper
        // block is as large as the others).
        cuda: 512,
        cpu: 32,
        env: "MSCCLPP_LL128_THREADS",
        limit: Limit::RangeStep(32, 1024, 32),
    },
    /// Blocks the LL128 kernel aims for: its blocks shrink (by halves, down to one warp) until
    /// the call's 480-byte warp steps give it at least this many.
    ll128_blocks: u32 {
        cuda: 64,
        cpu: 2,
        env: "MSCCLPP_LL128_BLOCKS",
        limit: Limit::Range(1, 1024),
    },
    /// Most blocks of the LL128 kernel (its warps loop over the steps beyond).
    ll128_max_blocks: u32 { cuda: 1024, cpu: 2 },
    /// Fewest ranks on which all-reduce takes the two-shot LL algorithm (unless one is
    /// forced): from `ll_two_shot_min_bytes` to `ll_max_bytes`, instead of the one-shot LL16
    /// and LL128 ones, which send `n - 1` copies of the data where it sends `2 (n - 1) / n`.
    ll_two_shot_min_ranks: usize {
        // Not measured on more than 2 GPUs yet: the traffic argument and MSCCL++'s choice on
        // 8 Hopper GPUs (all-pairs packets to 16 KiB, two-shot packets to 1 MiB). CPU: as on
        // the GPU, at the CPU backend's sizes.
        cuda: 4,
        cpu: 4,
        env: "MSCCLPP_LL_TWO_SHOT_MIN_RANKS",
    },
    /// Smallest all-reduce that takes the two-shot LL algorithm on `ll_two_shot_min_ranks`
    /// ranks or more (below, the one-shot's single hop wins).
    ll_two_shot_min_bytes: usize {
        cuda: 16 << 10,
        cpu: 1 << 10,
        env: "MSCCLPP_LL_TWO_SHOT_MIN_BYTES",
    },
    /// Ranks that may share one GPU (the several-ranks-per-GPU mode, `sharing.rs`): 1 refuses
    /// a second rank on a GPU (`Error::DuplicateGpu`), as NCCL does; N lets up to N ranks
    /// share one, each rank's launches then sized to its share of the GPU's multiprocessors so
    /// that every rank's blocks are resident at once. No effect on the CPU backend.
    ranks_per_gpu: usize {
        cuda: 1,
        cpu: 1,
        env: "MSCCLPP_RANKS_PER_GPU",
        limit: Limit::Range(1, 64),
    },
    /// Staging bytes per rank (an operation larger than fits runs in pieces).
    stage_bytes: usize { cuda: 64 << 20, cpu: 1 << 20 },
    /// Rows of channels (one per block): raised by `Collectives::with_config` to what every
    /// algorithm asks for (`staged_blocks`, `direct_blocks`, the copy-engine all-reduce's 3).
    max_blocks: u32 { cuda: 128, cpu: 2 },
    /// Most blocks of the staged kernel.
    staged_blocks: u32 { cuda: 64, cpu: 2 },
    /// Smallest operation (bytes per rank, or per part) that takes the direct path unless an
    /// algorithm is forced.
    direct_min_bytes: usize {
        cuda: 1 << 20,
        cpu: 4 << 10,
        env: "MSCCLPP_DIRECT_MIN_BYTES",
    },
    /// Smallest operation that moves by copy engine (all-gather, broadcast, all-to-all,
    /// `send_recv`).
    ce_min_bytes: usize {
        cuda: 16 << 20,
        cpu: 128 << 10,
        env: "MSCCLPP_CE_MIN_BYTES",
    },
    /// Smallest all-reduce that takes the copy-engine algorithm unless one is forced.
    ce_all_reduce_min_bytes: usize {
        cuda: 128 << 20,
        cpu: 256 << 10,
        env: "MSCCLPP_CE_ALL_REDUCE_MIN_BYTES",
    },
    /// Scratch bytes per rank of the copy-engine all-reduce, allocated on its first call: two
    /// slots per peer, each receiving one piece (so it bounds the piece size).
    ce_scratch_bytes: usize {
        // CPU: small, so that the tests' all-reduces run in many pieces through both slots.
        cuda: 256 << 20,
        cpu: 8 << 10,
        env: "MSCCLPP_CE_SCRATCH_BYTES",
        limit: Limit::AtLeast(1 << 10),
    },
    /// Fewest pieces the copy-engine all-reduce cuts each rank's chunk into (pieces overlap
    /// the copies with the reduction; each costs a few microseconds of synchronisation).
    ce_min_pieces: usize {
        cuda: 2,
        cpu: 2,
        env: "MSCCLPP_CE_PIECES",
        limit: Limit::Range(1, 1 << 10),
    },
    /// Most blocks of the direct kernel.
    direct_blocks: u32 {
        cuda: 128,
        cpu: 2,
        env: "MSCCLPP_DIRECT_BLOCKS",
        limit: Limit::Range(1, 1024),
    },
    /// Bytes (of what one rank moves) per block of the direct kernel, up to `direct_blocks`.
    direct_block_bytes: usize {
        cuda: 64 << 10,
        cpu: 1 << 20,
        env: "MSCCLPP_DIRECT_BLOCK_BYTES",
        limit: Limit::AtLeast(16),
    },
    /// Smallest one-rank pre-multiplied sum (bytes, whole 16-byte vectors) that runs the
    /// direct kernel's local reduction instead of staging.
    alone_direct_min_bytes: usize {
        // One H200, f16, CUDA graphs: staged 3.90 / 10.88 / 11.28 / 213.9 us at 1 KiB / 1 MiB
        // / 4 MiB / 64 MiB, the direct kernel's local reduction 7.47 / 12.85 / 13.43 / 87.3
        // (NCCL: 1.49 / ~4 / 4.26 / 48.7): the lines cross near 5 MiB. CPU: every whole
        // vector, so that the tests take both paths.
        cuda: 8 << 20,
        cpu: 16,
    },
    /// Threads per block of the direct kernel.
    direct_threads: u32 {
        cuda: 512,
        cpu: 16,
        env: "MSCCLPP_DIRECT_THREADS",
        limit: Limit::Range(32, 1024),
    },
    /// Threads per block of the staged kernel (it uses 80 registers a thread on sm_90, so at
    /// most 768 fit a block).
    threads: u32 { cuda: 512, cpu: 16 },
    /// Blocks of the LL kernel.
    ll_blocks: u32 {
        cuda: 512,
        cpu: 2,
        env: "MSCCLPP_LL_BLOCKS",
        limit: Limit::Range(1, 1024),
    },
    /// Threads per block of the LL kernel.
    ll_threads: u32 {
        cuda: 256,
        cpu: 16,
        env: "MSCCLPP_LL_THREADS",
        limit: Limit::Range(32, 1024),
    },
    /// Most packets an LL call sends per peer in a single block (one thread a packet).
    ll_single_block_packets: u32 { cuda: 512, cpu: 0 },
    /// Bytes of one slot of the port region (worlds of several nodes): the largest piece the
    /// port collective moves to a peer at a time; each rank's scratch holds `3 n + 1` slots.
    port_slot_bytes: usize {
        // CPU: small, so that the tests' calls run in several pieces through both slots.
        cuda: 4 << 20,
        cpu: 8 << 10,
        env: "MSCCLPP_PORT_SLOT_BYTES",
        limit: Limit::RangeStep(1 << 10, 1 << 30, 16),
    },
    /// Threads of the port collective's one block (ptxas gives its kernel 144 registers a
    /// thread on sm_90, so at most 448 fit a block).
    port_threads: u32 {
        cuda: 256,
        cpu: 16,
        env: "MSCCLPP_PORT_THREADS",
        limit: Limit::RangeStep(32, 448, 32),
    },
    /// Chunk of the hierarchical all-reduce (bytes of the whole buffer): each chunk is
    /// reduce-scattered inside the node, all-reduced across nodes between same-index ranks,
    /// and all-gathered inside the node, so that the node and network phases of consecutive
    /// chunks overlap.
    hier_chunk_bytes: usize {
        cuda: 32 << 20,
        cpu: 32 << 10,
        env: "MSCCLPP_HIER_CHUNK_BYTES",
        limit: Limit::AtLeast(1 << 10),
    },
    /// Chunks of the hierarchical all-reduce in flight: chunk `c`'s network phase runs while
    /// the node reduce-scatters the next `depth - 1` chunks (1: no overlap).
    hier_pipeline_depth: usize {
        cuda: 2,
        cpu: 2,
        env: "MSCCLPP_HIER_PIPELINE_DEPTH",
        limit: Limit::Range(1, 64),
    },
    /// Largest all-reduce the hierarchical algorithm runs on its latency path: an all-reduce
    /// inside the node (LL packets for small sizes), then one exchange with the same-index
    /// rank of every other node, instead of the pipelined reduce-scatter / all-gather.
    hier_small_max_bytes: usize {
        cuda: 256 << 10,
        cpu: 4 << 10,
        env: "MSCCLPP_HIER_SMALL_MAX_BYTES",
    },
    /// Largest point-to-point message (send, receive, and every collective built on them)
    /// sent as LL16 packets in one block; larger ones travel in chunks on every lane. A
    /// multiple of 8 (0: every message in chunks). Sizes the scratch: `4 × p2p_ll_bytes` per
    /// peer.
    p2p_ll_bytes: usize {
        // Not measured on GPUs yet: NCCL's LL protocol serves point-to-point messages up to a
        // few tens of KiB. CPU: small, so that the tests cross it.
        cuda: 32 << 10,
        cpu: 1 << 10,
        env: "MSCCLPP_P2P_LL_BYTES",
        limit: Limit::RangeStep(0, 1 << 20, 8),
    },
    /// Bytes of a chunk of a larger point-to-point message (a multiple of 16). Sizes the
    /// scratch: `2 × p2p_lanes × p2p_chunk_bytes` per peer.
    p2p_chunk_bytes: usize {
        // Not measured on GPUs yet (NCCL's NVLink point-to-point chunk is 512 KiB with 8
        // channels); CPU: small, so that the tests' messages run in many chunks.
        cuda: 128 << 10,
        cpu: 2 << 10,
        env: "MSCCLPP_P2P_CHUNK_BYTES",
        limit: Limit::RangeStep(16, 64 << 20, 16),
    },
    /// Lanes (blocks, each with its own chunk slots and counters) a larger point-to-point
    /// message travels on, at most `P2P_MAX_LANES`.
    p2p_lanes: u32 {
        cuda: 4,
        cpu: 2,
        env: "MSCCLPP_P2P_LANES",
        limit: Limit::Range(1, mscclpp_shared::P2P_MAX_LANES as u64),
    },
    /// Threads per block of the point-to-point engine (`p2p_kernel`, 88 registers a thread on
    /// sm_90: at most 736 fit a block).
    p2p_threads: u32 { cuda: 512, cpu: 16 },
}

impl CollectiveConfig {
    /// Applies every setting's environment variable that is set (the rows of
    /// [`TABLE`](Self::TABLE) with an `env`, listed in each field's docs: `MSCCLPP_LL_BLOCKS`,
    /// `MSCCLPP_DIRECT_MIN_BYTES`, `MSCCLPP_CE_SCRATCH_BYTES`, …), clamped to the row's
    /// [`Limit`]. Every rank must see the same values: `Collectives::with_config` refuses a
    /// configuration that differs from another rank's with `Error::ConfigMismatch`.
    /// Unparsable values are ignored with a warning.
    pub fn with_env(self) -> Self {
        self.with_vars(|name| std::env::var(name).ok())
    }

    /// [`with_env`](Self::with_env) with the variables `var` answers.
    pub fn with_vars(mut self, var: impl Fn(&str) -> Option<String>) -> Self {
        for s in &Self::TABLE {
            let Some(name) = s.env else { continue };
            let Some(v) = var(name) else { continue };
            match v.trim().parse::<u64>() {
                Ok(x) => {
                    let x = s.limit.apply(x, &self);
                    (s.set)(&mut self, x);
                }
                Err(_) => tracing::warn!("{name}={v:?} is not a number; ignored"),
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use mscclpp_host::gpu::BackendKind;

    use super::CollectiveConfig;

    /// `with_env` before the table (commit e1cbef2), restated: one `if let` per variable.
    fn reference(mut c: CollectiveConfig, vars: &HashMap<&str, String>) -> CollectiveConfig {
        let var = |name: &str| -> Option<usize> { vars.get(name)?.trim().parse().ok() };
        if let Some(v) = var("MSCCLPP_DIRECT_MIN_BYTES") {
            c.direct_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_CE_MIN_BYTES") {
            c.ce_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL_PART_MAX_BYTES") {
            c.ll_part_max_bytes = v.min(c.ll_max_bytes);
        }
        if let Some(v) = var("MSCCLPP_LL128_MIN_BYTES") {
            c.ll128_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL128_PART_MIN_BYTES") {
            c.ll128_part_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL128_THREADS") {
            c.ll128_threads = (v as u32).clamp(32, 1024) & !31;
        }
        if let Some(v) = var("MSCCLPP_LL128_BLOCKS") {
            c.ll128_blocks = (v as u32).clamp(1, 1024);
        }
        if let Some(v) = var("MSCCLPP_LL_TWO_SHOT_MIN_RANKS") {
            c.ll_two_shot_min_ranks = v;
        }
        if let Some(v) = var("MSCCLPP_LL_TWO_SHOT_MIN_BYTES") {
            c.ll_two_shot_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL_BLOCKS") {
            c.ll_blocks = (v as u32).clamp(1, 1024);
        }
        if let Some(v) = var("MSCCLPP_LL_THREADS") {
            c.ll_threads = (v as u32).clamp(32, 1024);
        }
        if let Some(v) = var("MSCCLPP_CE_ALL_REDUCE_MIN_BYTES") {
            c.ce_all_reduce_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_CE_SCRATCH_BYTES") {
            c.ce_scratch_bytes = v.max(1 << 10);
        }
        if let Some(v) = var("MSCCLPP_CE_PIECES") {
            c.ce_min_pieces = v.clamp(1, 1 << 10);
        }
        if let Some(v) = var("MSCCLPP_DIRECT_BLOCKS") {
            c.direct_blocks = (v as u32).clamp(1, 1024);
        }
        if let Some(v) = var("MSCCLPP_DIRECT_BLOCK_BYTES") {
            c.direct_block_bytes = v.max(16);
        }
        if let Some(v) = var("MSCCLPP_DIRECT_THREADS") {
            c.direct_threads = (v as u32).clamp(32, 1024);
        }
        // Settings added after the table, with their limits.
        if let Some(v) = var("MSCCLPP_PORT_SLOT_BYTES") {
            c.port_slot_bytes = v.clamp(1 << 10, 1 << 30) / 16 * 16;
        }
        if let Some(v) = var("MSCCLPP_PORT_THREADS") {
            c.port_threads = (v as u32).clamp(32, 448) / 32 * 32;
        }
        if let Some(v) = var("MSCCLPP_HIER_CHUNK_BYTES") {
            c.hier_chunk_bytes = v.max(1 << 10);
        }
        if let Some(v) = var("MSCCLPP_HIER_PIPELINE_DEPTH") {
            c.hier_pipeline_depth = v.clamp(1, 64);
        }
        if let Some(v) = var("MSCCLPP_HIER_SMALL_MAX_BYTES") {
            c.hier_small_max_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_P2P_LL_BYTES") {
            c.p2p_ll_bytes = v.min(1 << 20) / 8 * 8;
        }
        if let Some(v) = var("MSCCLPP_P2P_CHUNK_BYTES") {
            c.p2p_chunk_bytes = v.clamp(16, 64 << 20) / 16 * 16;
        }
        if let Some(v) = var("MSCCLPP_P2P_LANES") {
            c.p2p_lanes = (v as u32).clamp(1, 8);
        }
        c
    }

    const VARS: [&str; 25] = [
        "MSCCLPP_DIRECT_MIN_BYTES",
        "MSCCLPP_CE_MIN_BYTES",
        "MSCCLPP_LL_PART_MAX_BYTES",
        "MSCCLPP_LL128_MIN_BYTES",
        "MSCCLPP_LL128_PART_MIN_BYTES",
        "MSCCLPP_LL128_THREADS",
        "MSCCLPP_LL128_BLOCKS",
        "MSCCLPP_LL_TWO_SHOT_MIN_RANKS",
        "MSCCLPP_LL_TWO_SHOT_MIN_BYTES",
        "MSCCLPP_LL_BLOCKS",
        "MSCCLPP_LL_THREADS",
        "MSCCLPP_CE_ALL_REDUCE_MIN_BYTES",
        "MSCCLPP_CE_SCRATCH_BYTES",
        "MSCCLPP_CE_PIECES",
        "MSCCLPP_DIRECT_BLOCKS",
        "MSCCLPP_DIRECT_BLOCK_BYTES",
        "MSCCLPP_DIRECT_THREADS",
        "MSCCLPP_PORT_SLOT_BYTES",
        "MSCCLPP_PORT_THREADS",
        "MSCCLPP_HIER_CHUNK_BYTES",
        "MSCCLPP_HIER_PIPELINE_DEPTH",
        "MSCCLPP_HIER_SMALL_MAX_BYTES",
        "MSCCLPP_P2P_LL_BYTES",
        "MSCCLPP_P2P_CHUNK_BYTES",
        "MSCCLPP_P2P_LANES",
    ];

    #[test]
    fn the_table_lists_the_same_variables() {
        let mut mine: Vec<_> = CollectiveConfig::TABLE
            .iter()
            .filter_map(|s| s.env)
            .collect();
        let mut before = VARS.to_vec();
        mine.sort_unstable();
        before.sort_unstable();
        assert_eq!(mine, before);
    }

    /// Every variable alone and all together, at values around every limit (and unparsable
    /// ones), on both backends' defaults: the same configuration as before the table.
    #[test]
    fn environment_values_land_as_before() {
        let values = [
            "0", "1", "15", "16", "17", "31", "33", "100", "1023", "1024", "1025", "4096", " 77 ",
            "70000", "1048576", "x", "", "-3", "12k",
        ];
        for backend in [BackendKind::Cuda, BackendKind::Cpu] {
            let base = CollectiveConfig::for_backend(backend);
            for (k, value) in values.iter().enumerate() {
                let mut all = HashMap::new();
                for (i, name) in VARS.iter().enumerate() {
                    let one = HashMap::from([(*name, value.to_string())]);
                    let got = base.with_vars(|n| one.get(n).cloned());
                    assert_eq!(got, reference(base, &one), "{name}={value:?}");
                    all.insert(*name, values[(k + i) % values.len()].to_string());
                }
                let got = base.with_vars(|n| all.get(n).cloned());
                assert_eq!(got, reference(base, &all), "{all:?}");
            }
            assert_eq!(base.with_vars(|_| None), base);
        }
    }

    #[test]
    fn limits_name_settings_of_the_table() {
        for row in CollectiveConfig::TABLE {
            if let super::Limit::AtMost(other) = row.limit {
                let found = CollectiveConfig::TABLE.iter().any(|r| r.name == other);
                assert!(
                    found,
                    "{} is at most {other}, which is no setting",
                    row.name
                );
            }
        }
    }

    #[test]
    fn defaults_and_settings_follow_the_table() {
        for backend in [BackendKind::Cuda, BackendKind::Cpu] {
            let c = CollectiveConfig::for_backend(backend);
            let s = c.settings();
            assert_eq!(s.len(), CollectiveConfig::TABLE.len());
            for (row, (name, value)) in CollectiveConfig::TABLE.iter().zip(s) {
                assert_eq!(row.name, name);
                assert_eq!(row.default_for(backend), value, "{name}");
            }
        }
        let c = CollectiveConfig::for_backend(BackendKind::Cuda);
        assert_eq!((c.ll_max_bytes, c.ll_single_block_packets), (1 << 20, 512));
        let c = CollectiveConfig::for_backend(BackendKind::Cpu);
        assert_eq!((c.ll_max_bytes, c.ll_single_block_packets), (64 << 10, 0));
    }
}
