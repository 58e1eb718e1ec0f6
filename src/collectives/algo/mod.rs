//! The collective algorithms, one unit each, and the one table that registers them
//! ([`UNITS`]); the methods of [`Algorithm`] that answer from the units; the set-up's
//! questions to every unit (rows of channels, the scratch regions, the memory plan).
//!
//! An algorithm is a type implementing `unit::CollectiveAlgorithm` in a file of its own here
//! (`unit.rs` says what each item of the trait is for). Units import the layers below them
//! (`launch/` for the kernels they share, `context.rs`, `unit.rs`), never a sibling.
//!
//! ## Adding an algorithm
//!
//! 1. **Its device kernel**, in `device/src/collectives/<name>.rs`, taking `CollectiveParams` (or
//!    `DirectCollectiveParams`) by value, and its `KernelSpec` in `src/kernels.rs` (listed in
//!    `ALL_NAMES`, which a test checks against the PTX).
//! 2. **One host file**, `src/collectives/algo/<name>.rs`: a struct holding what `set_up`
//!    loads, and its `impl CollectiveAlgorithm`. Parameter blocks come from `Context::params`
//!    (the one place that writes a kernel's mode, type and operator), its scratch region from
//!    `ScratchLayout`, buffers exchanged with the peers from `registered.rs`; a launch it
//!    shares with another unit goes into `launch/`.
//! 3. **One registration line** in [`UNITS`] below, and its public variant in [`Algorithm`]
//!    (`algorithm.rs`; declaration order = registration order; a test checks both).
//! 4. If the automatic choice should pick it: a row in the selection table (`select.rs`), fed
//!    by settings of its own in `CollectiveConfig`'s table (`config.rs`), one row each.
//!
//! Example, the two-shot LL all-reduce (`ll2`): `device/src/collectives/ll_two_shot.rs`, the
//! `LL_TWO_SHOT_ALL_REDUCE` entry of `src/kernels.rs`, `algo/ll_two_shot.rs`, the line
//! `unit::<ll_two_shot::LlTwoShot>()` in [`UNITS`], `Algorithm::LlTwoShot`, one row of
//! `select.rs`, and the settings `ll_two_shot_min_ranks` and `ll_two_shot_min_bytes`.

use mscclpp_host::Result;
use mscclpp_shared::DataType;

use super::algorithm::{Algorithm, Collective};
use super::config::CollectiveConfig;
use super::context::{Args, Lowered, SetUp};
use super::reduction::KernelOp;
use super::scratch::{MemoryPlan, Region, ScratchLayout};
use super::unit::{CollectiveAlgorithm, Queue, Step};

pub(crate) mod copy_engine;
pub(crate) mod direct;
pub(crate) mod hierarchical;
pub(crate) mod ll;
pub(crate) mod ll128;
pub(crate) mod ll_two_shot;
pub(crate) mod p2p;
pub(crate) mod port;
pub(crate) mod staged;
pub(crate) mod two_shot_put;

/// Every algorithm: one line each, in the order of [`Algorithm`]'s variants.
pub(crate) const UNITS: [Unit; Algorithm::ALL.len()] = [
    unit::<ll::Ll>(),
    unit::<staged::Staged>(),
    unit::<two_shot_put::TwoShotPut>(),
    unit::<direct::Direct>(),
    unit::<copy_engine::CopyEngine>(),
    unit::<ll128::Ll128>(),
    unit::<ll_two_shot::LlTwoShot>(),
    unit::<p2p::P2p>(),
    unit::<port::Port>(),
    unit::<hierarchical::Hierarchical>(),
];

impl Algorithm {
    /// Its CLI name: `ll`, `staged`, `put`, `direct`, `ce`, `ll128`, `ll2`, `p2p`, `port` or
    /// `hier`.
    pub fn name(self) -> &'static str {
        self.unit().name
    }

    /// Parses an algorithm's CLI name or another spelling of it (`ll-one-shot`, `rs-ag`,
    /// `two-shot-put`, `zero-copy`, `copy-engine`, `ll-128`, `ll-two-shot`, …).
    pub fn parse(s: &str) -> Option<Self> {
        UNITS
            .iter()
            .find(|u| u.name == s || u.aliases.contains(&s))
            .map(|u| u.algorithm)
    }

    /// Whether a caller may force this algorithm on `collective`. `send_recv`, `send` and
    /// `recv` take no algorithm (they choose their own), so no algorithm serves
    /// [`Collective::SendRecv`] this way.
    pub fn serves(self, collective: Collective) -> bool {
        self.unit().serves.contains(&collective)
    }

    /// Whether it serves a world of `nodes` nodes (`uniform`: the same number of ranks on
    /// each). The single-node algorithms serve one node; `port` several; `hier` several of the
    /// same size.
    pub fn serves_world(self, nodes: usize, uniform: bool) -> bool {
        (self.unit().serves_nodes)(nodes, uniform).is_ok()
    }

    /// The largest call it serves with `cfg`, in bytes per part (the whole message of
    /// all-reduce, broadcast and reduce; one part of all-gather, reduce-scatter and
    /// all-to-all): a larger call forced onto it is refused. `None`: any size.
    pub fn max_bytes(self, cfg: &CollectiveConfig) -> Option<usize> {
        (self.unit().max_bytes)(cfg)
    }

    /// Its registration.
    pub(crate) fn unit(self) -> &'static Unit {
        &UNITS[self as usize]
    }
}

/// An algorithm's registration: its trait's constants and functions, as values.
pub(crate) struct Unit {
    pub algorithm: Algorithm,
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub serves: &'static [Collective],
    pub not_served: &'static str,
    pub point_to_point: bool,
    pub registered: bool,
    pub agrees: bool,
    pub scratch: &'static [Region],
    pub too_large: &'static str,
    pub serves_ranks: fn(usize) -> Result<(), &'static str>,
    pub serves_nodes: fn(usize, bool) -> Result<(), &'static str>,
    pub serves_data: fn(DataType, KernelOp) -> Result<(), &'static str>,
    pub max_bytes: fn(&CollectiveConfig) -> Option<usize>,
    pub takes_registered: fn(&Args) -> bool,
    pub channel_rows: fn(&CollectiveConfig) -> u32,
    pub plan: fn(&CollectiveConfig, &ScratchLayout, &Lowered) -> Result<Step, &'static str>,
    pub set_up: fn(&SetUp<'_>) -> Result<Box<dyn Queue>>,
}

/// The registration of `A`.
const fn unit<A: CollectiveAlgorithm>() -> Unit {
    Unit {
        algorithm: A::ALGORITHM,
        name: A::NAME,
        aliases: A::ALIASES,
        serves: A::SERVES,
        not_served: A::NOT_SERVED,
        point_to_point: A::POINT_TO_POINT,
        registered: A::REGISTERED,
        agrees: A::AGREES,
        scratch: A::SCRATCH,
        too_large: A::TOO_LARGE,
        serves_ranks: A::serves_ranks,
        serves_nodes: A::serves_nodes,
        serves_data: A::serves_data,
        max_bytes: A::max_bytes,
        takes_registered: A::takes_registered,
        channel_rows: A::channel_rows,
        plan: A::plan,
        set_up: boxed::<A>,
    }
}

fn boxed<A: CollectiveAlgorithm>(s: &SetUp<'_>) -> Result<Box<dyn Queue>> {
    Ok(Box::new(A::set_up(s)?))
}

/// Rows of channels for `cfg`: its `max_blocks`, raised to what every algorithm launches with.
pub(crate) fn channel_rows(cfg: &CollectiveConfig) -> u32 {
    UNITS
        .iter()
        .map(|u| (u.channel_rows)(cfg))
        .fold(cfg.max_blocks, u32::max)
}

/// The layout of a world of one node: every region the registered algorithms ask for but the
/// port region.
pub(crate) fn one_node_layout(cfg: &CollectiveConfig, ranks: usize) -> ScratchLayout {
    ScratchLayout::new(cfg, ranks, channel_rows(cfg), |r| {
        r != Region::Port && UNITS.iter().any(|u| u.scratch.contains(&r))
    })
}

/// What the collectives of `ranks` ranks with `cfg` allocate on each rank ([`MemoryPlan`]).
pub fn memory_plan(cfg: &CollectiveConfig, ranks: usize) -> MemoryPlan {
    let layout = one_node_layout(cfg, ranks);
    let rows = channel_rows(cfg) as usize;
    layout.memory_plan(rows)
}

#[cfg(test)]
mod tests {
    use super::{Algorithm, Collective, UNITS};

    #[test]
    fn every_algorithm_is_registered_once_at_its_discriminant() {
        for (i, a) in Algorithm::ALL.iter().enumerate() {
            assert_eq!(*a as usize, i, "{a:?}");
            assert_eq!(UNITS[i].algorithm, *a, "registration {i}");
        }
    }

    #[test]
    fn names_parse_back_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Some(a));
            for alias in a.unit().aliases {
                assert_eq!(Algorithm::parse(alias), Some(a), "{alias}");
                assert!(seen.insert(*alias), "{alias} twice");
            }
            assert!(seen.insert(a.name()), "{} twice", a.name());
        }
        let names: Vec<_> = Algorithm::ALL.map(Algorithm::name).into();
        assert_eq!(
            names,
            [
                "ll", "staged", "put", "direct", "ce", "ll128", "ll2", "p2p", "port", "hier"
            ]
        );
        assert_eq!(Algorithm::parse("nccl"), None);
    }

    /// What `mscclpp-bench -a` accepted per collective before the algorithms answered it
    /// themselves (`src/bench/args.rs`, commit e1cbef2); the reduce, added since, is served
    /// by `ll`, `staged`, `direct` and `port` (`reduce_is_served_by_ll_staged_direct_and_port`).
    #[test]
    fn serves_what_the_bench_accepted() {
        use Algorithm::*;
        use Collective::*;
        let all = [
            AllReduce,
            AllGather,
            ReduceScatter,
            Broadcast,
            AllToAll,
            SendRecv,
        ];
        for a in Algorithm::ALL {
            for c in all {
                let before = match a {
                    TwoShotPut | LlTwoShot => c == AllReduce,
                    Ll128 => matches!(c, AllReduce | AllGather | ReduceScatter),
                    LlOneShot | Staged | Direct => c != SendRecv,
                    CopyEngine => matches!(c, AllReduce | AllGather | Broadcast | AllToAll),
                    // Added after the bench's matrix: forced by nobody.
                    P2p => false,
                    // Added with worlds of several nodes (issue 18).
                    Port => c != SendRecv,
                    Hierarchical => c == AllReduce,
                };
                assert_eq!(a.serves(c), before, "{a:?} {c:?}");
            }
        }
    }

    #[test]
    fn reduce_is_served_by_ll_staged_direct_and_port() {
        for a in Algorithm::ALL {
            let want = matches!(
                a,
                Algorithm::LlOneShot | Algorithm::Staged | Algorithm::Direct | Algorithm::Port
            );
            assert_eq!(a.serves(Collective::Reduce), want, "{a:?}");
        }
    }
}
