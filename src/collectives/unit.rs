//! What an algorithm is: the trait every unit implements ([`CollectiveAlgorithm`]), what its
//! `plan` returns ([`Step`], [`Planned`]) and what its `queue` did ([`Queued`]). The units are
//! in `algo/`, one file each, registered in `algo/mod.rs`; `algo/mod.rs` says how to add one.
//!
//! | item | what it says | who asks |
//! |---|---|---|
//! | `ALGORITHM`, `NAME`, `ALIASES` | the public [`Algorithm`] a caller forces it by, its CLI name (`mscclpp-bench -a`), other spellings | `Algorithm::name`, `Algorithm::parse` |
//! | `SERVES`, `NOT_SERVED`, `POINT_TO_POINT`, `serves_ranks`, `serves_nodes`, `serves_data` | the collectives a caller may force it for, whether the selection table may use it for `send_recv` / `send` / `recv`, and the rank counts, node layouts, element types and operators it serves | `Algorithm::serves`, the planner (`plan.rs`, with the table of `select.rs`) |
//! | `max_bytes`, `TOO_LARGE` | the largest call it serves (bytes per part) and what a larger one is refused as | the planner; `Algorithm::max_bytes` (the bench) |
//! | `REGISTERED`, `AGREES`, `takes_registered` | whether it works on the callers' buffers (so it may decline a call: some rank's buffers cannot be shared), whether it decides that with its peers on the device (any call) or needs buffers registered ahead (those `takes_registered` accepts) or a per-call exchange (forced only) | the planner and the dispatcher |
//! | `SCRATCH`, `channel_rows` | the regions of the scratch it uses and the rows of channels (one per block) it launches with | set-up (`algo::one_node_layout`, `algo::channel_rows`), the planner under capture |
//! | `plan` | what a call of it runs, from sizes alone: a [`Step`] of itself, of another algorithm it hands the call to, or a refusal | the planner, once per call |
//! | `set_up` | its per-communicator state: kernels loaded from the module, streams, events | `Collectives::with_config`, once |
//! | `queue` | queues one call on a stream as its step says | the dispatcher, on every call |
//! | `tear_down` | what must happen before the context's memory is freed | `Collectives`' drop |

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_shared::DataType;

use super::algorithm::{Algorithm, Collective};
use super::config::CollectiveConfig;
use super::context::{Args, Context, Lowered, SetUp};
use super::reduction::KernelOp;
use super::scratch::{Region, ScratchLayout};

/// What an algorithm did with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    /// Queued.
    Ran,
    /// Not queued: some rank's buffers cannot be shared (every rank learns it in the same
    /// exchange, so every rank declines alike). Only algorithms with `REGISTERED` decline.
    Declined,
    /// Queued on the callers' buffers, deciding on the device with the peers whether it runs
    /// (`AGREES`): every rank's launch declines alike when some rank's buffers are not shared
    /// yet, and then records this gate. The dispatcher queues the call again without the
    /// callers' buffers, gated on it: that launch runs only where the first declined
    /// (`plan.rs`).
    Gated(u32),
}

/// One step of a plan: the algorithm that queues the call, and what its `plan` worked out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// The unit that queues the call (and what `Collectives::last_algorithm` then reports).
    pub algorithm: Algorithm,
    /// What it follows.
    pub planned: Planned,
    /// Whether the caller forced the algorithm: one on the callers' buffers then does not hand
    /// the call on when it cannot serve it (it settles their registrations first, and refuses,
    /// on every rank alike, what it still cannot serve).
    pub forced: bool,
}

impl Step {
    /// `algorithm` as it is.
    pub const fn itself(algorithm: Algorithm) -> Self {
        Self {
            algorithm,
            planned: Planned::Itself,
            forced: false,
        }
    }
}

/// What a plan worked out for its algorithm, which the algorithm's `queue` follows without
/// deciding again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Planned {
    /// The algorithm as it is.
    Itself,
    /// The two-shot LL all-reduce with parts of this many bytes (whole packets).
    Parts(u64),
    /// The direct kernel's local reduction of a one-rank call (a pre-multiplied sum on whole
    /// vectors): no peer, no registration.
    Alone,
    /// The copy-engine all-reduce cut into `pieces` pieces of `piece` bytes of each rank's
    /// `chunk`, through scratch slots of `slot` bytes.
    Pieces {
        /// Bytes of each rank's chunk.
        chunk: usize,
        /// Bytes of one piece.
        piece: usize,
        /// Pieces per chunk.
        pieces: usize,
        /// Bytes of one scratch slot.
        slot: usize,
    },
    /// Refused, once the per-call exchange found every rank's buffers shareable: the plan of
    /// an algorithm on the callers' buffers refused the call, which is reported after the
    /// exchange (if some rank cannot share its buffers, the call falls back as on any decline).
    Refused(&'static str),
}

/// One collective algorithm (module docs: what each item is for; `algo/mod.rs`: how to add
/// one).
pub(crate) trait CollectiveAlgorithm: Sized + Send + Sync + 'static {
    /// The public name a caller forces it by.
    const ALGORITHM: Algorithm;
    /// Its CLI name.
    const NAME: &'static str;
    /// Other spellings `Algorithm::parse` accepts.
    const ALIASES: &'static [&'static str];
    /// The collectives a caller may force it for.
    const SERVES: &'static [Collective];
    /// What a forced call of a collective outside `SERVES` is refused as (`Error::Unsupported`).
    const NOT_SERVED: &'static str;
    /// Whether the selection table may pick it for `send_recv`, `send` or `recv`.
    const POINT_TO_POINT: bool = false;
    /// Whether it works on the callers' buffers (and so may decline a call).
    const REGISTERED: bool = false;
    /// With `REGISTERED`: whether it learns the peers' buffers on the device, through
    /// registrations traded once (`registry.rs`), and decides there with its peers whether it
    /// runs ([`Queued::Gated`]), so it takes any call, eager or captured; without it, it takes
    /// calls on buffers registered ahead that `takes_registered` accepts, and, forced and
    /// eager, exchanges the callers' buffers on the host per call (`registered.rs`).
    const AGREES: bool = false;
    /// The regions of the communicator's scratch it uses.
    const SCRATCH: &'static [Region] = &[];
    /// What a call above [`max_bytes`](Self::max_bytes) is refused as.
    const TOO_LARGE: &'static str = "";

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

    /// The largest call it serves with `cfg`, in bytes per part (the whole message of
    /// all-reduce, broadcast and reduce); `None`: any size.
    fn max_bytes(_cfg: &CollectiveConfig) -> Option<usize> {
        None
    }

    /// Whether it takes `args`, a call on buffers registered ahead (only asked of algorithms
    /// with `REGISTERED`).
    fn takes_registered(_args: &Args) -> bool {
        false
    }

    /// Rows of channels (one per block) its kernels launch with, at most.
    fn channel_rows(_cfg: &CollectiveConfig) -> u32 {
        1
    }

    /// What a call of it runs, from sizes alone (asked after `serves_*` and `max_bytes`
    /// hold): a step of itself or of another algorithm it hands the call to, or `Err` with
    /// what it cannot do.
    fn plan(
        _cfg: &CollectiveConfig,
        _layout: &ScratchLayout,
        _call: &Lowered,
    ) -> Result<Step, &'static str> {
        Ok(Step::itself(Self::ALGORITHM))
    }

    /// Its state for one communicator (kernels, streams, events).
    fn set_up(s: &SetUp<'_>) -> Result<Self>;

    /// Queues one call on `stream` as `step` (its plan) says. Records what ran
    /// (`Context::record`).
    fn queue(&self, cx: &Context, args: &Args, step: &Step, stream: &Stream) -> Result<Queued>;

    /// What must happen before the context's memory is freed, when the `Collectives` is
    /// dropped (its queued work complete, the caller's contract). Never fails: a problem is
    /// logged.
    fn tear_down(&self, _cx: &Context) {}
}

/// A registered algorithm behind a pointer (what the dispatcher keeps per algorithm).
pub(crate) trait Queue: Send + Sync {
    /// [`CollectiveAlgorithm::queue`].
    fn queue(&self, cx: &Context, args: &Args, step: &Step, stream: &Stream) -> Result<Queued>;
    /// [`CollectiveAlgorithm::tear_down`].
    fn tear_down(&self, cx: &Context);
    /// The algorithm itself, for the calls of its own beyond `queue` (the point-to-point
    /// engine's batches).
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<A: CollectiveAlgorithm> Queue for A {
    fn queue(&self, cx: &Context, args: &Args, step: &Step, stream: &Stream) -> Result<Queued> {
        CollectiveAlgorithm::queue(self, cx, args, step, stream)
    }

    fn tear_down(&self, cx: &Context) {
        CollectiveAlgorithm::tear_down(self, cx)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
