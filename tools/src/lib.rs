//! # mscclpp-tools
//!
//! The command-line tools of mscclpp-rs, in their own crate so that the library `mscclpp`
//! depends on none of what they use (NCCL's declarations, `clap`, `serde`, `plotters`,
//! `tracing-subscriber`):
//!
//! | binary | what |
//! |---|---|
//! | `mscclpp-bench` (`src/bin/mscclpp-bench.rs`, [`bench`]) | collectives and primitives measured nccl-tests style, optionally against NCCL in the same run |
//! | `mscclpp-run` (`src/bin/mscclpp-run.rs`) | starts N copies of a command as the ranks of one job on this machine |
//! | `mscclpp-info` (`src/bin/mscclpp-info.rs`) | the backend and devices, and a self-check of the embedded kernels |
//! | `mscclpp-trace` (`src/bin/mscclpp-trace.rs`, [`trace`]) | merges a run's per-rank trace files into one Chrome / Perfetto timeline, and draws it |
//!
//! Every tool starts with [`init_logging`], so the libraries' `tracing` events are shown as
//! `MSCCLPP_LOG` asks (warnings by default; see [`mscclpp_log`]).

pub mod bench;
pub mod trace;

/// The tools' error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `e` followed by its sources, `: `-separated.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.ends_with(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// Installs the subscriber that shows the libraries' `tracing` events on standard error,
/// filtered by `MSCCLPP_LOG` ([`mscclpp_log::init`]); a bad `MSCCLPP_LOG` is reported as
/// `<tool>: …` and the default filter used.
pub fn init_logging(tool: &str) {
    if let Err(e) = mscclpp_log::init() {
        eprintln!("{tool}: {}", chain(&e));
    }
}
