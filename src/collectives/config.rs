//! What a caller chooses: the algorithms ([`Algorithm`]) and the sizes and launch shapes
//! ([`CollectiveConfig`]) of one `Collectives`.

use mscclpp_host::gpu::BackendKind;

/// An algorithm a caller can force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// One-shot LL16 packets (small messages; every collective, `send_recv` on two ranks).
    LlOneShot,
    /// Through the staging buffers, reading the peers' staging (every collective).
    Staged,
    /// All-reduce where only writes cross the links: reduce-scatter by puts into the peers'
    /// staging, a local reduction, and an all-gather by puts.
    TwoShotPut,
    /// On the callers' registered buffers, by one kernel (every collective but send/recv).
    Direct,
    /// On the callers' registered buffers, by the copy engines (all-gather, broadcast,
    /// all-to-all, send/recv; all-reduce: the direct kernel reduces each rank's chunk, the copy
    /// engines spread it).
    CopyEngine,
    /// One-shot all-reduce, all-gather and reduce-scatter with LL128 lines (medium messages:
    /// 120 of every 128 bytes on the links are data, against 8 of 16 for LL16).
    Ll128,
    /// All-reduce as an LL16 reduce-scatter and all-gather in one launch: each rank reduces
    /// one part and sends it on, so it sends `2 (n - 1) / n` of the data instead of the
    /// one-shot's `n - 1` times, for one more hop (medium messages on more than a few ranks).
    /// All-reduce only; a call too small for every rank to own a part runs one-shot.
    LlTwoShot,
}

impl Algorithm {
    /// Every algorithm, in declaration order (`ALL[a as usize] == a`).
    pub const ALL: [Algorithm; 7] = [
        Self::LlOneShot,
        Self::Staged,
        Self::TwoShotPut,
        Self::Direct,
        Self::CopyEngine,
        Self::Ll128,
        Self::LlTwoShot,
    ];

    /// Parses an algorithm name (`ll`, `staged`, `put`, `direct`, `ce`, `ll128`, `ll2`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ll" | "ll-one-shot" | "ll_one_shot" => Some(Self::LlOneShot),
            "staged" | "rs-ag" => Some(Self::Staged),
            "put" | "two-shot-put" => Some(Self::TwoShotPut),
            "direct" | "zero-copy" => Some(Self::Direct),
            "ce" | "copy-engine" => Some(Self::CopyEngine),
            "ll128" | "ll-128" => Some(Self::Ll128),
            "ll2" | "ll-two-shot" => Some(Self::LlTwoShot),
            _ => None,
        }
    }
}

/// A collective operation, as the algorithms declare what they serve
/// ([`Algorithm::serves`]).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// [`Collectives::all_reduce`](super::Collectives::all_reduce).
    AllReduce,
    /// [`Collectives::all_gather`](super::Collectives::all_gather).
    AllGather,
    /// [`Collectives::reduce_scatter`](super::Collectives::reduce_scatter).
    ReduceScatter,
    /// [`Collectives::broadcast`](super::Collectives::broadcast).
    Broadcast,
    /// [`Collectives::all_to_all`](super::Collectives::all_to_all).
    AllToAll,
    /// [`Collectives::send_recv`](super::Collectives::send_recv) (and `send` / `recv`).
    SendRecv,
}

/// Sizes of the communicator-owned buffers and launch shapes.
#[derive(Clone, Copy, Debug)]
pub struct CollectiveConfig {
    /// Largest all-reduce the LL algorithm serves, bytes (also the most any LL call may move
    /// per part: the size of an LL slot).
    pub ll_max_bytes: usize,
    /// Largest part for which all-gather, reduce-scatter, all-to-all and broadcast take the LL
    /// algorithm unless another is forced (at most `ll_max_bytes`; a two-rank `send_recv`
    /// takes it up to `ll_max_bytes`).
    pub ll_part_max_bytes: usize,
    /// Smallest all-reduce that takes the LL128 algorithm unless one is forced.
    pub ll128_min_bytes: usize,
    /// Largest all-reduce (or all-gather or reduce-scatter part) the LL128 algorithm serves,
    /// bytes (sizes its slots).
    pub ll128_max_bytes: usize,
    /// Smallest part of an all-gather or reduce-scatter that takes the LL128 algorithm unless
    /// one is forced (up to `ll128_max_bytes`).
    pub ll128_part_min_bytes: usize,
    /// Most threads per block of the LL128 kernel (a multiple of 32).
    pub ll128_threads: u32,
    /// Blocks the LL128 kernel aims for: its blocks shrink (by halves, down to one warp) until
    /// the call's 480-byte warp steps give it at least this many.
    pub ll128_blocks: u32,
    /// Most blocks of the LL128 kernel (its warps loop over the steps beyond).
    pub ll128_max_blocks: u32,
    /// Fewest ranks on which all-reduce takes the two-shot LL algorithm (unless one is
    /// forced): from `ll_two_shot_min_bytes` to `ll_max_bytes`, instead of the one-shot LL16
    /// and LL128 ones, which send `n - 1` copies of the data where it sends `2 (n - 1) / n`.
    pub ll_two_shot_min_ranks: usize,
    /// Smallest all-reduce that takes the two-shot LL algorithm on `ll_two_shot_min_ranks`
    /// ranks or more (below, the one-shot's single hop wins).
    pub ll_two_shot_min_bytes: usize,
    /// Staging bytes per rank (an operation larger than fits runs in pieces).
    pub stage_bytes: usize,
    /// Rows of channels (one per block): at least `staged_blocks` and `direct_blocks`.
    pub max_blocks: u32,
    /// Most blocks of the staged kernel.
    pub staged_blocks: u32,
    /// Smallest operation (bytes per rank, or per part) that takes the direct path unless an
    /// algorithm is forced.
    pub direct_min_bytes: usize,
    /// Smallest operation that moves by copy engine (all-gather, broadcast, all-to-all).
    pub ce_min_bytes: usize,
    /// Smallest all-reduce that takes the copy-engine algorithm unless one is forced.
    pub ce_all_reduce_min_bytes: usize,
    /// Scratch bytes per rank of the copy-engine all-reduce, allocated on its first call: two
    /// slots per peer, each receiving one piece (so it bounds the piece size).
    pub ce_scratch_bytes: usize,
    /// Fewest pieces the copy-engine all-reduce cuts each rank's chunk into (pieces overlap
    /// the copies with the reduction; each costs a few microseconds of synchronisation).
    pub ce_min_pieces: usize,
    /// Most blocks of the direct kernel.
    pub direct_blocks: u32,
    /// Bytes (of what one rank moves) per block of the direct kernel, up to `direct_blocks`.
    pub direct_block_bytes: usize,
    /// Threads per block of the direct kernel.
    pub direct_threads: u32,
    /// Threads per block of the staged kernel (it uses 80 registers a thread on sm_90, so at
    /// most 768 fit a block).
    pub threads: u32,
    /// Blocks of the LL kernel.
    pub ll_blocks: u32,
    /// Threads per block of the LL kernel.
    pub ll_threads: u32,
    /// Most packets an LL call sends per peer in a single block (one thread a packet).
    pub ll_single_block_packets: u32,
}

impl CollectiveConfig {
    /// Defaults for a backend: GPU-sized on CUDA, small on the CPU backend (threads are OS
    /// threads there).
    pub fn for_backend(kind: BackendKind) -> Self {
        match kind {
            BackendKind::Cuda => Self {
                ll_max_bytes: 1 << 20,
                ll_part_max_bytes: 512 << 10,
                // 2xH200: LL16 is as fast to 128 KiB (3.4 us), LL128 faster from 256 KiB.
                ll128_min_bytes: 128 << 10,
                // 2xH200, sixth session: LL128 beats the direct kernel up to the largest size
                // measured, 4 MiB (all-reduce 16.1 us against 22.4; all-gather and
                // reduce-scatter 4 MiB parts 15.9 against 19.9-26.3).
                ll128_max_bytes: 4 << 20,
                // 2xH200: LL128 from 128 KiB parts (all-gather 256 KiB in all: 3.16 us, LL16
                // 3.26; 64 KiB parts: LL16 2.94, LL128 3.07).
                ll128_part_min_bytes: 128 << 10,
                // 2xH200, 1 MiB: 6.11 us with 512-thread blocks, 6.28-6.51 with 1024 (the
                // keeper block is as large as the others).
                ll128_threads: 512,
                ll128_blocks: 64,
                ll128_max_blocks: 1024,
                // Not measured on more than 2 GPUs yet: the traffic argument (see
                // `ll_two_shot_min_ranks`) and MSCCL++'s choice on 8 Hopper GPUs (all-pairs
                // packets to 16 KiB, two-shot packets to 1 MiB).
                ll_two_shot_min_ranks: 4,
                ll_two_shot_min_bytes: 16 << 10,
                stage_bytes: 64 << 20,
                max_blocks: 128,
                staged_blocks: 64,
                direct_min_bytes: 1 << 20,
                ce_min_bytes: 16 << 20,
                ce_all_reduce_min_bytes: 128 << 20,
                ce_scratch_bytes: 256 << 20,
                ce_min_pieces: 2,
                direct_blocks: 128,
                direct_block_bytes: 64 << 10,
                direct_threads: 512,
                threads: 512,
                ll_blocks: 512,
                ll_threads: 256,
                ll_single_block_packets: 512,
            },
            BackendKind::Cpu => Self {
                ll_max_bytes: 64 << 10,
                ll_part_max_bytes: 16 << 10,
                // Between LL16's small sizes and the direct kernel, as on the GPU.
                ll128_min_bytes: 2 << 10,
                ll128_max_bytes: 16 << 10,
                ll128_part_min_bytes: 2 << 10,
                ll128_threads: 32,
                ll128_blocks: 2,
                ll128_max_blocks: 2,
                // As on the GPU, at the CPU backend's sizes.
                ll_two_shot_min_ranks: 4,
                ll_two_shot_min_bytes: 1 << 10,
                stage_bytes: 1 << 20,
                max_blocks: 2,
                staged_blocks: 2,
                direct_min_bytes: 4 << 10,
                ce_min_bytes: 128 << 10,
                ce_all_reduce_min_bytes: 256 << 10,
                // Small, so that the tests' all-reduces run in many pieces through both slots.
                ce_scratch_bytes: 8 << 10,
                ce_min_pieces: 2,
                direct_blocks: 2,
                direct_block_bytes: 1 << 20,
                direct_threads: 16,
                threads: 16,
                ll_blocks: 2,
                ll_threads: 16,
                ll_single_block_packets: 0,
            },
        }
    }

    /// Every setting with its name, in a fixed order: what every rank must share (checked at
    /// `Collectives::with_config`).
    pub fn settings(&self) -> [(&'static str, u64); 25] {
        // Destructured, so that a new field cannot be left out.
        let Self {
            ll_max_bytes,
            ll_part_max_bytes,
            ll128_min_bytes,
            ll128_max_bytes,
            ll128_part_min_bytes,
            ll128_threads,
            ll128_blocks,
            ll128_max_blocks,
            ll_two_shot_min_ranks,
            ll_two_shot_min_bytes,
            stage_bytes,
            max_blocks,
            staged_blocks,
            direct_min_bytes,
            ce_min_bytes,
            ce_all_reduce_min_bytes,
            ce_scratch_bytes,
            ce_min_pieces,
            direct_blocks,
            direct_block_bytes,
            direct_threads,
            threads,
            ll_blocks,
            ll_threads,
            ll_single_block_packets,
        } = *self;
        [
            ("ll_max_bytes", ll_max_bytes as u64),
            ("ll_part_max_bytes", ll_part_max_bytes as u64),
            ("ll128_min_bytes", ll128_min_bytes as u64),
            ("ll128_max_bytes", ll128_max_bytes as u64),
            ("ll128_part_min_bytes", ll128_part_min_bytes as u64),
            ("ll128_threads", ll128_threads as u64),
            ("ll128_blocks", ll128_blocks as u64),
            ("ll128_max_blocks", ll128_max_blocks as u64),
            ("ll_two_shot_min_ranks", ll_two_shot_min_ranks as u64),
            ("ll_two_shot_min_bytes", ll_two_shot_min_bytes as u64),
            ("stage_bytes", stage_bytes as u64),
            ("max_blocks", max_blocks as u64),
            ("staged_blocks", staged_blocks as u64),
            ("direct_min_bytes", direct_min_bytes as u64),
            ("ce_min_bytes", ce_min_bytes as u64),
            ("ce_all_reduce_min_bytes", ce_all_reduce_min_bytes as u64),
            ("ce_scratch_bytes", ce_scratch_bytes as u64),
            ("ce_min_pieces", ce_min_pieces as u64),
            ("direct_blocks", direct_blocks as u64),
            ("direct_block_bytes", direct_block_bytes as u64),
            ("direct_threads", direct_threads as u64),
            ("threads", threads as u64),
            ("ll_blocks", ll_blocks as u64),
            ("ll_threads", ll_threads as u64),
            ("ll_single_block_packets", ll_single_block_packets as u64),
        ]
    }

    /// Applies the tuning variables `MSCCLPP_LL_BLOCKS`, `MSCCLPP_LL_THREADS`,
    /// `MSCCLPP_LL_PART_MAX_BYTES`, `MSCCLPP_LL128_MIN_BYTES`, `MSCCLPP_LL128_PART_MIN_BYTES`,
    /// `MSCCLPP_LL128_THREADS`,
    /// `MSCCLPP_LL128_BLOCKS`, `MSCCLPP_LL_TWO_SHOT_MIN_RANKS`, `MSCCLPP_LL_TWO_SHOT_MIN_BYTES`,
    /// `MSCCLPP_DIRECT_MIN_BYTES`,
    /// `MSCCLPP_CE_MIN_BYTES`, `MSCCLPP_CE_ALL_REDUCE_MIN_BYTES`, `MSCCLPP_CE_SCRATCH_BYTES`,
    /// `MSCCLPP_CE_PIECES` (`ce_min_pieces`), `MSCCLPP_DIRECT_BLOCKS`,
    /// `MSCCLPP_DIRECT_BLOCK_BYTES` and `MSCCLPP_DIRECT_THREADS` where set (every rank must
    /// see the same values: `Collectives::with_config` refuses a configuration that differs
    /// from another rank's with `Error::ConfigMismatch`). Unparsable values are ignored with a warning.
    pub fn with_env(mut self) -> Self {
        fn var(name: &str) -> Option<usize> {
            let v = std::env::var(name).ok()?;
            let parsed = v.trim().parse().ok();
            if parsed.is_none() {
                tracing::warn!("{name}={v:?} is not a number; ignored");
            }
            parsed
        }
        if let Some(v) = var("MSCCLPP_DIRECT_MIN_BYTES") {
            self.direct_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_CE_MIN_BYTES") {
            self.ce_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL_PART_MAX_BYTES") {
            self.ll_part_max_bytes = v.min(self.ll_max_bytes);
        }
        if let Some(v) = var("MSCCLPP_LL128_MIN_BYTES") {
            self.ll128_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL128_PART_MIN_BYTES") {
            self.ll128_part_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL128_THREADS") {
            self.ll128_threads = (v as u32).clamp(32, 1024) & !31;
        }
        if let Some(v) = var("MSCCLPP_LL128_BLOCKS") {
            self.ll128_blocks = (v as u32).clamp(1, 1024);
        }
        if let Some(v) = var("MSCCLPP_LL_TWO_SHOT_MIN_RANKS") {
            self.ll_two_shot_min_ranks = v;
        }
        if let Some(v) = var("MSCCLPP_LL_TWO_SHOT_MIN_BYTES") {
            self.ll_two_shot_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_LL_BLOCKS") {
            self.ll_blocks = (v as u32).clamp(1, 1024);
        }
        if let Some(v) = var("MSCCLPP_LL_THREADS") {
            self.ll_threads = (v as u32).clamp(32, 1024);
        }
        if let Some(v) = var("MSCCLPP_CE_ALL_REDUCE_MIN_BYTES") {
            self.ce_all_reduce_min_bytes = v;
        }
        if let Some(v) = var("MSCCLPP_CE_SCRATCH_BYTES") {
            self.ce_scratch_bytes = v.max(1 << 10);
        }
        if let Some(v) = var("MSCCLPP_CE_PIECES") {
            self.ce_min_pieces = v.clamp(1, 1 << 10);
        }
        if let Some(v) = var("MSCCLPP_DIRECT_BLOCKS") {
            self.direct_blocks = (v as u32).clamp(1, 1024);
        }
        if let Some(v) = var("MSCCLPP_DIRECT_BLOCK_BYTES") {
            self.direct_block_bytes = v.max(16);
        }
        if let Some(v) = var("MSCCLPP_DIRECT_THREADS") {
            self.direct_threads = (v as u32).clamp(32, 1024);
        }
        // `max_blocks` follows in `Collectives::with_config`, which every configuration passes.
        self
    }
}

#[cfg(test)]
mod tests {
    use super::Algorithm;

    #[test]
    fn all_lists_every_algorithm_at_its_discriminant() {
        for (i, a) in Algorithm::ALL.iter().enumerate() {
            assert_eq!(*a as usize, i, "{a:?}");
        }
    }
}
