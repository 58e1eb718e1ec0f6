//! 06 — Running an MSCCL++ execution plan.
//!
//! MSCCL++'s DSL writes collective algorithms as JSON execution plans; `mscclpp::executor`
//! runs them: `ExecutionPlan::load` parses the file and verifies it across ranks (a plan that
//! would hang or race is refused, naming the rank, threadblock and op), and
//! `Executor::execute` queues one launch of the interpreter kernel on a stream. This program
//! runs an all-reduce plan on 2 ranks (threads), checks the result, then times the host side
//! of a call: what `execute` costs once the (plan, buffers, sizes) are set up.
//!
//! ```sh
//! cargo run --release --example 06-execution-plan [PLAN.json]   # default: a plan it writes
//! ```
//!
//! Without an argument it writes the repository's `allreduce_read` plan for 2 ranks (what
//! `mscclpp-plan write allreduce_read --ranks 2 -o FILE` writes) to a temporary file and
//! loads that. A plan of your own must be an in-place all-reduce for 2 ranks here.

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use common::{Result, check_data, check_device_status, ranks_as_threads};
use mscclpp::executor::plan::ReduceKind;
use mscclpp::executor::{ExecutionPlan, Executor, PacketType, plans};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::BackendKind;
use mscclpp::shared::DataType;

/// Elements of each rank's buffer (f32).
const ELEMS: usize = 64 * 1024;
/// Calls timed for the launch overhead.
const TIMED: usize = 200;

fn rank_main(comm: Communicator, plan: &ExecutionPlan) -> Result<f64> {
    let comm = Arc::new(comm);
    let r = comm.rank();
    let executor = Executor::new(comm.clone())?;
    let g = comm.gpu().clone();
    let stream = g.stream()?;
    let bytes = ELEMS * 4;
    let buf = g.alloc(bytes)?;
    let mine: Vec<f32> = (0..ELEMS).map(|i| (i % 97) as f32 + r as f32).collect();
    buf.copy_from_host(0, bytemuck::cast_slice(&mine))?;
    let call = || {
        // SAFETY: `buf` lives until the stream is synchronised below; every rank makes the
        // same calls in the same order.
        unsafe {
            executor.execute(
                r,
                buf.ptr(),
                bytes as u64,
                buf.ptr(),
                bytes as u64,
                DataType::F32,
                plan,
                &stream,
                PacketType::LL16,
            )
        }
    };
    // First call: sets up the channels and buffers with the peer, then runs.
    call()?;
    stream.synchronize()?;
    check_device_status(&comm)?;
    let mut got = vec![0f32; ELEMS];
    buf.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
    let want: Vec<f32> = (0..ELEMS).map(|i| 2.0 * (i % 97) as f32 + 1.0).collect();
    check_data(
        &format!("rank {r}'s sum"),
        bytemuck::cast_slice(&got),
        bytemuck::cast_slice(&want),
    )?;
    println!(
        "rank {r}: plan {:?}: all-reduce of {bytes} bytes correct",
        plan.name()
    );
    // The host side of a call once set up: queue TIMED launches, then wait for them.
    comm.bootstrap().barrier()?;
    let t = Instant::now();
    for _ in 0..TIMED {
        call()?;
    }
    let host_us = t.elapsed().as_secs_f64() * 1e6 / TIMED as f64;
    stream.synchronize()?;
    check_device_status(&comm)?;
    comm.bootstrap().barrier()?;
    Ok(host_us)
}

fn run() -> Result {
    let path = match std::env::args().nth(1) {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let p =
                std::env::temp_dir().join(format!("allreduce_read-{}.json", std::process::id()));
            let doc = plans::allreduce_read(2, ReduceKind::Sum);
            std::fs::write(&p, serde_json::to_string_pretty(&doc.to_json())?)?;
            p
        }
    };
    let plan = ExecutionPlan::load(&path)?;
    let s = &plan.summaries()[0];
    println!(
        "{}: verified: {} ranks, {} blocks and {} ops on rank 0",
        path.display(),
        s.ranks,
        s.blocks[0],
        s.ops[0]
    );
    let backend = BackendKind::select()?;
    let host_us = ranks_as_threads(2, backend, |comm| rank_main(comm, &plan))?;
    println!(
        "{backend:?} backend: Executor::execute costs {:.2} / {:.2} us of host time per call \
         (ranks 0 / 1, {TIMED} calls queued back to back)",
        host_us[0], host_us[1]
    );
    Ok(())
}

fn main() -> ExitCode {
    mscclpp::exit_code(run())
}
