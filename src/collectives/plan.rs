//! The one planner: [`plan`] turns a call into a [`Plan`], as a pure function of the call, the
//! configuration and layout, and the moment ([`Now`]: under CUDA-graph capture or not, which
//! scratch regions are traded with the call's peers, whether an algorithm on the callers'
//! buffers declined the call). [`drive`] is the dispatcher's whole logic: plan, let the
//! executor queue the plan, plan again after a decline. `Collectives` executes plans (the
//! dispatcher, `dispatch.rs`); the pinning test (`select_pin.rs`) drives this same code with
//! an executor that tells what would run.
//!
//! What a call plans to, in this order:
//! 1. **Nothing** for zero bytes (but a point-to-point call, which still pairs with its
//!    peer's).
//! 2. **A copy** (input to output, when they differ) on one rank, whatever the collective, the
//!    size, a forced algorithm or a capture; a pre-multiplied sum still multiplies (as NCCL
//!    does): the direct kernel's local reduction on whole 16-byte vectors of at least
//!    `alone_direct_min_bytes`, else the staged kernel, which serves any size and alignment.
//! 3. **The algorithm** the caller forced, if it serves the call (`select::choose`), else the
//!    selection table's (`select.rs`), among the algorithms usable now: under capture none
//!    that would allocate or wait on the host (the per-call exchange of the callers' buffers,
//!    a scratch region not traded with the call's peers); on buffers registered ahead only
//!    those that take them (`takes_registered`); after a decline, none on the callers'
//!    buffers.
//! 4. Then that algorithm's limit (`max_bytes`) and its `plan`, once: a [`Step`] of itself or
//!    of another algorithm it hands the call to, or **a refusal** (`Error::Unsupported` with
//!    what cannot be done).
//!
//! An algorithm on buffers exchanged per call may still decline when it queues (the exchange
//! finds a rank whose buffers cannot be shared; every rank learns it alike): the call is then
//! planned again without the callers' buffers, unless it was forced (then it is refused, on
//! every rank alike: [`DECLINED`]).

use mscclpp_host::{Error, Result};
use mscclpp_shared::DeviceReduceOp;

use super::algorithm::{Algorithm, Collective};
use super::config::CollectiveConfig;
use super::context::Args;
use super::regions::Ready;
use super::registered::whole_vectors;
use super::scratch::{Region, ScratchLayout};
use super::select;
use super::unit::{Planned, Queued, Step};

/// What a call runs (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Nothing to queue.
    Nothing,
    /// Input to output (one rank).
    Copy,
    /// An algorithm, as its plan says.
    Run(Step),
    /// Refused: what cannot be done.
    Refuse(&'static str),
}

/// What the planner knows of the moment besides the call (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Now {
    /// Whether the call's stream is being captured into a CUDA graph.
    pub capturing: bool,
    /// Which regions allocated on first use are traded with the call's peers (asked only
    /// under capture).
    pub ready: Ready,
    /// Whether an algorithm on the callers' buffers declined the call.
    pub declined: bool,
}

impl Now {
    /// An eager call's moment: not captured, every region may be allocated, nothing declined.
    pub const EAGER: Now = Now {
        capturing: false,
        ready: Ready::ALL,
        declined: false,
    };
}

/// What a forced algorithm on the callers' buffers is refused as when some rank's cannot be
/// shared.
pub(crate) const DECLINED: &str = "the direct path on these buffers";

/// The plan of `args` with `cfg` and `layout`, `forced` to an algorithm or not, at `now`
/// (module docs).
pub(crate) fn plan(
    cfg: &CollectiveConfig,
    layout: &ScratchLayout,
    args: &Args,
    forced: Option<Algorithm>,
    now: Now,
) -> Plan {
    let call = &args.call;
    let p2p = call.collective == Collective::SendRecv;
    if call.bytes == 0 && !p2p {
        return Plan::Nothing;
    }
    let mut forced = forced.filter(|_| !now.declined);
    if call.ranks == 1 && !p2p {
        if call.op.op != DeviceReduceOp::PreMulSum {
            return Plan::Copy;
        }
        if call.bytes >= cfg.alone_direct_min_bytes
            && whole_vectors(&[args.input, args.output], call.bytes)
        {
            return Plan::Run(Step {
                algorithm: Algorithm::Direct,
                planned: Planned::Alone,
            });
        }
        forced = Some(Algorithm::Staged);
    }
    let usable = |a: Algorithm| usable(a, args, now);
    let a = match select::choose(cfg, call, forced, !now.declined, &usable) {
        Ok(a) => a,
        Err(what) => return Plan::Refuse(what),
    };
    let u = a.unit();
    if (u.max_bytes)(cfg).is_some_and(|most| call.bytes > most) {
        return Plan::Refuse(u.too_large);
    }
    match (u.plan)(cfg, layout, call) {
        Ok(step) => Plan::Run(step),
        // Reported after the exchange, which may still decline (module docs).
        Err(what) if u.registered && args.reg.is_none() => Plan::Run(Step {
            algorithm: a,
            planned: Planned::Refused(what),
        }),
        Err(what) => Plan::Refuse(what),
    }
}

/// Whether `a` may take `args` now. On buffers registered ahead (`args.reg`): of the
/// algorithms on the callers' buffers, those that take them. Under CUDA-graph capture, nothing
/// that allocates or waits on the host: no per-call exchange of the callers' buffers, no
/// scratch region not traded with the call's peers (the point-to-point region is checked by
/// the engine itself, with the batch's peers, which refuses a first meeting under capture by
/// name).
fn usable(a: Algorithm, args: &Args, now: Now) -> bool {
    let u = a.unit();
    if u.registered {
        return match args.reg {
            Some(_) => (u.takes_registered)(args),
            None => !now.capturing,
        };
    }
    !now.capturing
        || u.scratch
            .iter()
            .filter(|&&r| r != Region::P2p)
            .all(|&r| now.ready.has(r))
}

/// What [`drive`] asks its executor to do.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Action<'a> {
    /// Copy the input to the output (when they differ).
    Copy,
    /// Queue this step with its algorithm.
    Run(&'a Step),
}

/// The dispatcher (module docs): plans `args` at `now`, has `exec` queue the plan, and plans
/// again after a decline (refused with [`DECLINED`] when the call was forced, or the algorithm
/// may not decline). `cannot` makes the error of a refusal.
pub(crate) fn drive(
    cfg: &CollectiveConfig,
    layout: &ScratchLayout,
    args: &Args,
    forced: Option<Algorithm>,
    mut now: Now,
    exec: &mut dyn FnMut(Action<'_>) -> Result<Queued>,
    cannot: &dyn Fn(&'static str) -> Error,
) -> Result<()> {
    loop {
        let step = match plan(cfg, layout, args, forced, now) {
            Plan::Nothing => return Ok(()),
            Plan::Refuse(what) => return Err(cannot(what)),
            Plan::Copy => return exec(Action::Copy).map(drop),
            Plan::Run(step) => step,
        };
        match exec(Action::Run(&step))? {
            Queued::Ran => return Ok(()),
            Queued::Declined
                if forced.is_some() || now.declined || !step.algorithm.unit().registered =>
            {
                return Err(cannot(DECLINED));
            }
            Queued::Declined => now.declined = true,
        }
    }
}
