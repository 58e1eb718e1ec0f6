//! The modules of `mscclpp-bench` (the binary is `src/bin/mscclpp-bench.rs`):
//!
//! | module | what |
//! |---|---|
//! | [`args`] | the command line (`clap`) |
//! | [`placement`] | how many ranks as threads, on which backend (one GPU included) |
//! | [`collective`] | one rank of a collective sweep: timing, checking, rows |
//! | [`data`] | rank- and index-dependent test data and its host reference |
//! | [`nccl`] | the NCCL baseline, loaded at run time |
//! | [`report`] | the table, JSON lines (`serde_json`) and summary |
//! | [`plot`] | the SVG or PNG plot (`plotters`) |
//! | [`primitives`] | the primitive benchmarks (signal, packet, fifo, puts, copy engine) |
//!
//! Ranks run as threads of this process (one GPU each, [`mscclpp::world::run_local_ranks`]),
//! or, when a launcher set a rank variable ([`RANK_VARS`]), as this one process of many
//! ([`BootstrapConfig::from_env`]).

pub mod args;
pub mod collective;
pub mod data;
pub mod nccl;
pub mod placement;
pub mod plot;
pub mod primitives;
pub mod report;

use std::sync::Arc;
use std::time::Duration;

use mscclpp::host::bootstrap::{Bootstrap, BootstrapConfig, TcpBootstrap};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, Gpu};

pub use crate::{BoxError, chain};

/// The rank variables of the launchers `BootstrapConfig::from_env` knows (mscclpp-run,
/// torchrun, Open MPI, Slurm): when one is set, this process is one rank.
pub const RANK_VARS: [&str; 4] = [
    "MSCCLPP_RANK",
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "SLURM_PROCID",
];

/// The rank variable set in the environment, if any.
pub fn launcher_var() -> Option<&'static str> {
    RANK_VARS
        .into_iter()
        .find(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// Bootstrap operation deadline when the environment does not set one: a rank may spend a
/// while filling and checking a large buffer before it next meets the others.
const OP_TIMEOUT: Duration = Duration::from_secs(300);

/// How the ranks of this run are started.
#[derive(Clone, Copy, Debug)]
pub enum Ranks {
    /// `n` threads of this process, rank `r` on device `r`.
    Threads(usize),
    /// This process is one rank of a launcher's job; its device is its local rank.
    Process,
}

impl Ranks {
    /// Words for the header.
    pub fn describe(self, n: usize) -> String {
        match self {
            Ranks::Threads(_) => format!("{n} ranks as threads of one process"),
            Ranks::Process => format!(
                "{n} ranks as processes ({} set)",
                launcher_var().unwrap_or("launcher")
            ),
        }
    }
}

/// Runs `body` on every rank; returns rank 0's result (`None` in a process that is another
/// rank). A failing rank fails the run, with every rank's error in the message.
pub fn run_ranks<T: Send>(
    backend: BackendKind,
    ranks: Ranks,
    body: impl Fn(Communicator) -> Result<T, BoxError> + Sync,
) -> Result<Option<T>, BoxError> {
    match ranks {
        Ranks::Threads(n) => {
            let results = mscclpp::world::run_local_ranks(backend, n, |comm| {
                body(comm).map_err(|e| mscclpp::host::Error::Aborted { reason: chain(&*e) })
            });
            let mut first = None;
            let mut errors = Vec::new();
            for (r, res) in results.into_iter().enumerate() {
                match res {
                    Ok(v) if r == 0 => first = Some(v),
                    Ok(_) => {}
                    Err(e) => errors.push(format!("rank {r}: {}", chain(&e))),
                }
            }
            if !errors.is_empty() {
                return Err(errors.join("\n").into());
            }
            Ok(first)
        }
        Ranks::Process => {
            let mut cfg = BootstrapConfig::from_env()?;
            let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
            if !set("MSCCLPP_BOOTSTRAP_TIMEOUT_MS") && !set("MSCCLPP_BOOTSTRAP_OP_TIMEOUT_MS") {
                cfg = cfg.with_op_timeout(OP_TIMEOUT);
            }
            let bs = TcpBootstrap::init(cfg)?;
            let local = bs.local_rank();
            let devices = backend.device_count()?;
            if backend == BackendKind::Cuda && local >= devices {
                return Err(format!(
                    "local rank {local} has no GPU ({devices} on this node): start at most {devices} ranks per node"
                )
                .into());
            }
            let gpu = Gpu::open(backend, local % devices.max(1))?;
            let comm = Communicator::new(Arc::new(bs), gpu)?;
            let rank = comm.rank();
            let out = body(comm)?;
            Ok((rank == 0).then_some(out))
        }
    }
}

/// `min, min·f, min·f², … ≤ max`.
pub fn sweep(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        match s.checked_mul(factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    v
}
