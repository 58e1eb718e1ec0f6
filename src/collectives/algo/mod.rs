//! The collective algorithms, one unit each, and the one table that registers them.
//!
//! An algorithm is a type implementing [`CollectiveAlgorithm`] in a file of its own here. The
//! trait says everything the rest of the library needs to know about it:
//!
//! | item | what it says | who asks |
//! |---|---|---|
//! | `ALGORITHM`, `NAME`, `ALIASES` | the public [`Algorithm`] a caller forces it by, its CLI name (`mscclpp-bench -a`), other spellings | [`Algorithm::name`], [`Algorithm::parse`] |
//! | `SERVES`, `POINT_TO_POINT`, `serves_ranks`, `serves_nodes`, `serves_data` | the collectives a caller may force it for, whether the choice may use it for `send_recv` / `send` / `recv`, and the rank counts, node layouts (one node, or several with equal or unequal numbers of ranks), element types and operators it serves | [`Algorithm::serves`], the selection table (`select.rs`), the forced-algorithm check |
//! | `REGISTERED` | whether it works on the callers' buffers (registered on first use and exchanged with the peers on every call): such an algorithm may decline a call (some rank's buffers cannot be shared), and the call then takes the next row of the selection table that needs no registration | the dispatch in `collectives/mod.rs` |
//! | `SCRATCH`, `channel_rows` | the regions of the communicator's scratch it uses (the [`ScratchLayout`] holds exactly the regions some algorithm asks for) and the rows of channels (one per block) it launches with | `Collectives::with_config` |
//! | `plan` | what a call of it runs, from sizes alone: itself, another algorithm it hands the call to, or a refusal (the call exceeds its limits) | `select::decide` (and so the pinning test) and its own `queue` |
//! | `set_up` | its per-communicator state: kernels loaded from the module, streams, events | `Collectives::with_config`, once |
//! | `queue` | queues one call on a stream | the dispatch, on every call |
//!
//! ## Adding an algorithm
//!
//! 1. **Its device kernel**, in `device/src/collectives/<name>.rs`, taking `CollectiveParams` (or
//!    `DirectCollectiveParams`) by value, and its `KernelSpec` in `src/kernels.rs` (listed in
//!    `ALL_NAMES`, which a test checks against the PTX).
//! 2. **One host file**, `src/collectives/algo/<name>.rs`: a struct holding what `set_up` loads,
//!    and its `impl CollectiveAlgorithm`. Parameter blocks come from [`Context::params`] (the
//!    one place that writes a kernel's mode, type and operator), its scratch region from
//!    [`ScratchLayout`], buffers exchanged with the peers from `registered.rs`.
//! 3. **One registration line** in [`UNITS`] below, and its public variant in [`Algorithm`]
//!    (declaration order = registration order; a test checks both).
//! 4. If the automatic choice should pick it: a row in the selection table (`select.rs`), fed
//!    by settings of its own in `CollectiveConfig`'s table (`config.rs`), one row each.
//!
//! Example, the two-shot LL all-reduce (`ll2`): `device/src/collectives/ll_two_shot.rs`, the
//! `LL_TWO_SHOT_ALL_REDUCE` entry of `src/kernels.rs`, `algo/ll_two_shot.rs`, the line
//! `unit::<ll_two_shot::LlTwoShot>()` in [`UNITS`], `Algorithm::LlTwoShot`, one row of
//! `select.rs`, and the settings `ll_two_shot_min_ranks` and `ll_two_shot_min_bytes`.

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_shared::DataType;

use super::reduction::KernelOp;

use super::CollectiveConfig;
use super::context::{Args, Context, SetUp};
use super::scratch::{Region, ScratchLayout};
use super::select::Call;

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

/// An algorithm a caller can force (`Collectives::all_reduce(…, Some(algorithm))`,
/// `mscclpp-bench -a NAME`). What each serves is answered by its unit ([`Algorithm::serves`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// The point-to-point engine: `send`, `recv`, `send_recv`, gather, scatter, all-to-all-v
    /// and the point-to-point operations of a group (each pair of ranks in step on its own,
    /// LL16 packets for small messages, pipelined chunks for larger ones). It cannot be
    /// forced on a collective.
    P2p,
    /// Worlds of several nodes: every collective through PortChannels to every rank (the
    /// network between nodes, the copy engines inside one), piece by piece in one block.
    Port,
    /// Worlds of several nodes with the same number of ranks on each: all-reduce as a
    /// reduce-scatter inside each node, an all-reduce of each part between the ranks of the
    /// same local index on every node (PortChannels), and an all-gather inside each node,
    /// pipelined in chunks; small calls take one all-reduce inside the node and one exchange
    /// across nodes.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm, in declaration order (`ALL[a as usize] == a`).
    pub const ALL: [Algorithm; 10] = [
        Self::LlOneShot,
        Self::Staged,
        Self::TwoShotPut,
        Self::Direct,
        Self::CopyEngine,
        Self::Ll128,
        Self::LlTwoShot,
        Self::P2p,
        Self::Port,
        Self::Hierarchical,
    ];

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

    /// Its registration.
    pub(crate) fn unit(self) -> &'static Unit {
        &UNITS[self as usize]
    }
}

/// A collective operation, as the algorithms say what they serve ([`Algorithm::serves`]).
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
    /// [`Collectives::reduce`](super::Collectives::reduce).
    Reduce,
    /// [`Collectives::send_recv`](super::Collectives::send_recv), and
    /// [`send`](super::Collectives::send) / [`recv`](super::Collectives::recv) alone.
    SendRecv,
}

/// What an algorithm did with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    /// Queued (by this algorithm or one it handed the call to, as its `plan` says).
    Ran,
    /// Not queued: some rank's buffers cannot be shared (every rank learns it in the same
    /// exchange, so every rank declines alike). Only algorithms with `REGISTERED` decline.
    Declined,
}

/// One collective algorithm (module docs: what each item is for, and how to add one).
pub(crate) trait CollectiveAlgorithm: Sized + Send + Sync + 'static {
    /// The public name a caller forces it by.
    const ALGORITHM: Algorithm;
    /// Its CLI name.
    const NAME: &'static str;
    /// Other spellings [`Algorithm::parse`] accepts.
    const ALIASES: &'static [&'static str];
    /// The collectives a caller may force it for.
    const SERVES: &'static [Collective];
    /// What a forced call of a collective outside `SERVES` is refused as (`Error::Unsupported`).
    const NOT_SERVED: &'static str;
    /// Whether the selection table may pick it for `send_recv`, `send` or `recv`.
    const POINT_TO_POINT: bool = false;
    /// Whether it works on the callers' registered buffers (and so may decline a call).
    const REGISTERED: bool = false;
    /// The regions of the communicator's scratch it uses.
    const SCRATCH: &'static [Region] = &[];

    /// `Ok` when it serves `ranks` ranks, else what it cannot do.
    fn serves_ranks(_ranks: usize) -> Result<(), &'static str> {
        Ok(())
    }

    /// `Ok` when it serves a world of `nodes` nodes (`uniform`: the same number of ranks on
    /// each), else what it cannot do. By default one node only: the single-node algorithms
    /// load and store the peers' memory.
    fn serves_nodes(nodes: usize, _uniform: bool) -> Result<(), &'static str> {
        if nodes == 1 {
            Ok(())
        } else {
            Err("a world of one node (it loads and stores the peers' memory)")
        }
    }

    /// `Ok` when it serves elements of `dtype` (reduced by `op` where the collective reduces),
    /// else what it cannot do. The types and operators are passed through to the kernels,
    /// which serve every one the shared enums list.
    fn serves_data(_dtype: DataType, _op: KernelOp) -> Result<(), &'static str> {
        Ok(())
    }

    /// Rows of channels (one per block) its kernels launch with, at most.
    fn channel_rows(_cfg: &CollectiveConfig) -> u32 {
        1
    }

    /// What a call of it runs, from sizes alone: `Ok(Self::ALGORITHM)`, `Ok` of another
    /// algorithm it hands the call to, or `Err` with what it cannot do. Algorithms with
    /// `REGISTERED` are asked after their buffer exchange succeeded.
    fn plan(
        _cfg: &CollectiveConfig,
        _layout: &ScratchLayout,
        _call: &Call,
    ) -> Result<Algorithm, &'static str> {
        Ok(Self::ALGORITHM)
    }

    /// Its state for one communicator (kernels, streams, events).
    fn set_up(s: &SetUp<'_>) -> Result<Self>;

    /// Queues one call on `stream`, which the dispatch chose for it (forced or by the
    /// selection table; `serves_*` hold). Records what ran (`Context::record`).
    fn queue(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued>;
}

/// A registered algorithm's queue, behind a pointer (what `Collectives` keeps per algorithm).
pub(crate) trait Queue: Send + Sync {
    /// [`CollectiveAlgorithm::queue`].
    fn queue(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued>;
    /// The algorithm itself, for the calls of its own beyond `queue` (the point-to-point
    /// engine's batches).
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<A: CollectiveAlgorithm> Queue for A {
    fn queue(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued> {
        CollectiveAlgorithm::queue(self, cx, args, stream)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
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
    pub scratch: &'static [Region],
    pub serves_ranks: fn(usize) -> Result<(), &'static str>,
    pub serves_nodes: fn(usize, bool) -> Result<(), &'static str>,
    pub serves_data: fn(DataType, KernelOp) -> Result<(), &'static str>,
    pub channel_rows: fn(&CollectiveConfig) -> u32,
    /// Only `select::decide` (the pinning test's model) asks it from here; at run time each
    /// algorithm's `queue` follows its own `plan`.
    #[cfg(test)]
    pub plan: fn(&CollectiveConfig, &ScratchLayout, &Call) -> Result<Algorithm, &'static str>,
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
        scratch: A::SCRATCH,
        serves_ranks: A::serves_ranks,
        serves_nodes: A::serves_nodes,
        serves_data: A::serves_data,
        channel_rows: A::channel_rows,
        #[cfg(test)]
        plan: A::plan,
        set_up: boxed::<A>,
    }
}

fn boxed<A: CollectiveAlgorithm>(s: &SetUp<'_>) -> Result<Box<dyn Queue>> {
    Ok(Box::new(A::set_up(s)?))
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
    /// by `ll`, `staged` and `direct` (`reduce_is_served_by_ll_staged_and_direct`).
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
    fn reduce_is_served_by_ll_staged_and_direct() {
        for a in Algorithm::ALL {
            let want = matches!(
                a,
                Algorithm::LlOneShot | Algorithm::Staged | Algorithm::Direct
            );
            assert_eq!(a.serves(Collective::Reduce), want, "{a:?}");
        }
    }
}
