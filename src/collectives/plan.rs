//! The one planner: [`plan`] turns a call into a [`Plan`], as a pure function of the call, the
//! configuration and layout, and the moment ([`Now`]: under CUDA-graph capture or not, whether
//! an algorithm on the callers' buffers declined the call). [`drive`] is the dispatcher's whole
//! logic: plan, let the executor queue the plan, plan again after a decline. `Collectives`
//! executes plans (the dispatcher, `dispatch.rs`); the pinning test (`select_pin.rs`) drives
//! this same code with an executor that tells what would run.
//!
//! What a call plans to, in this order:
//! 1. **Nothing** for zero bytes (but a point-to-point call, which still pairs with its
//!    peer's).
//! 2. **A copy** (input to output, when they differ) on one rank, whatever the collective, the
//!    size, a forced algorithm or a capture; a pre-multiplied sum still multiplies (as NCCL
//!    does): the direct kernel's local reduction on whole 16-byte vectors of at least
//!    `alone_direct_min_bytes`, else the staged kernel, which serves any size and alignment.
//! 3. **The algorithm** the caller forced, if it serves the call (`select::choose`), else the
//!    selection table's (`select.rs`), among the algorithms usable now: of those on the
//!    callers' buffers, the ones that agree on the device (the direct kernel) always, the
//!    others (the copy engines) on buffers registered ahead that they take, or forced and
//!    eager (a per-call exchange on the host); after a decline, none on the callers' buffers.
//! 4. Then that algorithm's limit (`max_bytes`) and its `plan`, once: a [`Step`] of itself or
//!    of another algorithm it hands the call to, or **a refusal** (`Error::Unsupported` with
//!    what cannot be done).
//!
//! An algorithm on the callers' buffers may decline when it queues:
//! - one that agrees on the device queues its launch anyway and returns a gate
//!   ([`Queued::Gated`]): the call is planned again without the callers' buffers and queued
//!   right behind it with that gate (`CollectiveParams::gate`), so that on every rank exactly
//!   one of the two runs, as the first launch decided on the device for all of them. No host
//!   waits for a peer; a forced call is never handed on (its launch refuses instead);
//! - one that exchanges the callers' buffers per call (a forced copy-engine call) declines
//!   before queuing anything when some rank's buffers cannot be shared (every rank learns it
//!   alike): the call is then refused on every rank alike ([`DECLINED`]).

use mscclpp_host::{Error, Result};
use mscclpp_shared::DeviceReduceOp;

use super::algorithm::{Algorithm, Collective};
use super::config::CollectiveConfig;
use super::context::Args;
use super::registered::whole_vectors;
use super::scratch::ScratchLayout;
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
    /// Whether an algorithm on the callers' buffers declined the call.
    pub declined: bool,
    /// The gate the call's launches run under (0: none): an agreeing algorithm's, queued
    /// ahead of them ([`Queued::Gated`]).
    pub gate: u32,
}

impl Now {
    /// An eager call's moment: not captured, nothing declined.
    pub const EAGER: Now = Now {
        capturing: false,
        declined: false,
        gate: 0,
    };
}

/// What a forced algorithm on the callers' buffers is refused as when some rank's cannot be
/// shared.
pub(crate) const DECLINED: &str = "the copy engines on these buffers (some rank's cannot be \
    shared)";

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
                forced: false,
            });
        }
        forced = Some(Algorithm::Staged);
    }
    let usable = |a: Algorithm| usable(a, args, now, forced == Some(a));
    let a = match select::choose(cfg, call, forced, !now.declined, &usable) {
        Ok(a) => a,
        Err(what) => return Plan::Refuse(what),
    };
    let u = a.unit();
    if (u.max_bytes)(cfg).is_some_and(|most| call.bytes > most) {
        return Plan::Refuse(u.too_large);
    }
    let forced = forced.is_some();
    match (u.plan)(cfg, layout, call) {
        Ok(step) => Plan::Run(Step { forced, ..step }),
        // Reported after the exchange, which may still decline (module docs).
        Err(what) if u.registered && !u.agrees && args.reg.is_none() => Plan::Run(Step {
            algorithm: a,
            planned: Planned::Refused(what),
            forced,
        }),
        Err(what) => Plan::Refuse(what),
    }
}

/// Whether `a` may take `args` now (module docs, step 3): every algorithm that works on
/// scratch regions (traded on first use without a host wait, or, under capture, with one);
/// of those on the callers' buffers, the ones that agree on the device, else on buffers
/// registered ahead those that take them, else (`forced`, eager) the per-call exchange.
fn usable(a: Algorithm, args: &Args, now: Now, forced: bool) -> bool {
    let u = a.unit();
    if !u.registered || u.agrees {
        return true;
    }
    match args.reg {
        Some(_) if (u.takes_registered)(args) => true,
        _ => forced && !now.capturing,
    }
}

/// What [`drive`] asks its executor to do.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Action<'a> {
    /// Copy the input to the output (when they differ).
    Copy,
    /// Queue this step with its algorithm, its launches under this gate (0: none).
    Run(&'a Step, u32),
}

/// The dispatcher (module docs): plans `args` at `now`, has `exec` queue the plan, and plans
/// again after a decline (gated behind an agreeing algorithm's launch; refused with
/// [`DECLINED`] when the call was forced, or the algorithm may not decline). `cannot` makes the
/// error of a refusal.
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
        match exec(Action::Run(&step, now.gate))? {
            Queued::Ran => return Ok(()),
            Queued::Gated(gate) if !now.declined && step.algorithm.unit().agrees => {
                now.declined = true;
                now.gate = gate;
            }
            Queued::Declined
                if forced.is_some() || now.declined || !step.algorithm.unit().registered =>
            {
                return Err(cannot(DECLINED));
            }
            Queued::Declined => now.declined = true,
            Queued::Gated(_) => return Err(cannot(DECLINED)),
        }
    }
}
