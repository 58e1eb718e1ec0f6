//! `mscclpp-bench`: the collectives (and the primitives under them) measured in the style of
//! nccl-tests / mscclpp-test, optionally against NCCL in the same run.
//!
//! ```text
//! mscclpp-bench allreduce -b 8 -e 1G -f 2 -c --baseline nccl --json ar.json --plot ar.svg
//! mscclpp-bench allgather -d bf16 --outofplace -G 0
//! mscclpp-run -n 2 -- mscclpp-bench reducescatter -c      # one process per rank
//! mscclpp-bench packet -b 8 -e 4K                         # a primitive (two ranks)
//! ```
//! `mscclpp-bench --help` lists the ops, `mscclpp-bench <op> --help` their options. One row per size: size, count, type, algorithm,
//! iterations, time (µs, mean over ranks), algbw and busbw (GB/s, nccl-tests' formulas),
//! `#wrong` (with `-c`), and with `--baseline nccl` NCCL's time and bus bandwidth and our
//! speed-up. See `src/bench/collective.rs` for how times are taken.
//!
//! All local GPUs run from this process by default (one thread per rank); under a launcher
//! (`mscclpp-run`, `mpirun`, `torchrun`, Slurm) each process is one rank. Without a GPU it runs
//! on the CPU backend with 2 ranks, checks data, and says that its times mean nothing; with
//! one GPU as well, saying why and how to use the GPU ([`placement`]).
//! `MSCCLPP_LOG` shows the library's `tracing` events (warnings by default). `--trace DIR`
//! writes one trace file per rank into DIR (as `MSCCLPP_TRACE=DIR`), which `mscclpp-trace
//! merge DIR -o trace.json` turns into one Chrome / Perfetto timeline.
//!
//! Exit status: 0; 1 when a rank failed or `-c` found a wrong element; 2 for a bad command line.

use std::process::ExitCode;

use mscclpp::host::bootstrap::BootstrapConfig;
use mscclpp::host::gpu::{BACKEND_ENV, BackendKind};
use mscclpp_tools::bench::args::{self, Baseline, CollArgs, Command, PlotFormat, PrimArgs};
use mscclpp_tools::bench::collective::{self, Plan};
use mscclpp_tools::bench::placement::{self, Placement};
use mscclpp_tools::bench::{self, BoxError, Ranks, nccl, plot, primitives, report};

fn main() -> ExitCode {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: the first statement of `main`: no other thread exists yet that could read or
        // write the environment concurrently. NVLink multicast stays off (shared machines).
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
    let cmd = match args::parse(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Some(dir) = cmd.trace() {
        // SAFETY: still before any thread of this program exists (parsing starts none), so
        // nothing reads or writes the environment concurrently. Every communicator made from
        // here on (one per rank) traces into `dir`.
        unsafe { std::env::set_var(mscclpp::trace::TRACE_ENV, dir) };
    }
    if mscclpp::collectives::ranks_per_gpu_in_env() > 1
        && std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none()
    {
        // SAFETY: still before any thread of this program exists. Ranks sharing a GPU need
        // more of the driver's work queues than its default 8 (`collectives::WANTED_CONNECTIONS`).
        unsafe {
            std::env::set_var(
                "CUDA_DEVICE_MAX_CONNECTIONS",
                mscclpp::collectives::WANTED_CONNECTIONS.to_string(),
            )
        };
    }
    mscclpp_tools::init_logging("mscclpp-bench");
    let r = match cmd {
        Command::Primitive(p) => run_primitive(&p),
        Command::Collective(c) => run_collective(c),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mscclpp-bench: {}", bench::chain(&*e));
            ExitCode::FAILURE
        }
    }
}

fn run_primitive(p: &PrimArgs) -> Result<ExitCode, BoxError> {
    let backend = BackendKind::select()?;
    let ranks = if bench::launcher_var().is_some() {
        Ranks::Process
    } else {
        Ranks::Threads(2)
    };
    let rows = bench::run_ranks(backend, ranks, |comm| primitives::bench_rank(&comm, p))?;
    let Some(rows) = rows else {
        return Ok(ExitCode::SUCCESS);
    };
    if backend == BackendKind::Cpu {
        println!(
            "# CPU backend (no GPU found): the same kernels on threads; times are not GPU times"
        );
    }
    print!("{}", primitives::table(&rows));
    if let Some(path) = &p.json {
        std::fs::write(path, primitives::json_lines(p, &rows)?)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// How the ranks of a collective run are started, and how many there are.
fn placement(a: &CollArgs) -> Result<(Ranks, usize, Placement), BoxError> {
    let backend = BackendKind::select()?;
    if bench::launcher_var().is_some() {
        let cfg = BootstrapConfig::from_env()?;
        if let Some(g) = a.ranks
            && g != cfg.size
        {
            eprintln!(
                "mscclpp-bench: -g {g} ignored: the launcher started {} ranks",
                cfg.size
            );
        }
        let p = Placement {
            backend,
            ranks: cfg.size,
            note: None,
        };
        return Ok((Ranks::Process, cfg.size, p));
    }
    let forced = std::env::var_os(BACKEND_ENV).is_some();
    let per_gpu = mscclpp::collectives::ranks_per_gpu_in_env();
    let p = placement::place_threads(backend, forced, backend.device_count()?, per_gpu, a.ranks)?;
    Ok((Ranks::Threads(p.ranks), p.ranks, p))
}

/// Refuses what this backend and rank count cannot run; resolves `-G`.
fn check_collective(a: &CollArgs, backend: BackendKind, n: usize) -> Result<u32, BoxError> {
    let graph_launches = match (a.graph_launches, backend) {
        (Some(g), BackendKind::Cpu) if g > 0 => {
            return Err(format!(
                "-G {g}: CUDA graphs need the CUDA backend, and this run is on the CPU backend (use -G 0)"
            )
            .into());
        }
        (Some(g), _) => g,
        (None, BackendKind::Cuda) => 1,
        (None, BackendKind::Cpu) => 0,
    };
    if a.baseline == Some(Baseline::Nccl) {
        if backend != BackendKind::Cuda {
            return Err(
                "--baseline nccl needs the CUDA backend, and this run is on the CPU backend".into(),
            );
        }
        nccl::Nccl::load()?;
    }
    if a.op.rooted() && a.root >= n {
        return Err(format!("-r {}: the root must be below the {n} ranks", a.root).into());
    }
    if n < a.op.min_ranks() {
        return Err(format!("{} needs at least {} ranks", a.op.name(), a.op.min_ranks()).into());
    }
    Ok(graph_launches)
}

fn run_collective(a: CollArgs) -> Result<ExitCode, BoxError> {
    let (ranks, n, placed) = placement(&a)?;
    let backend = placed.backend;
    let graph_launches = check_collective(&a, backend, n)?;
    let min = a.min.unwrap_or(8);
    let default_max = match backend {
        BackendKind::Cuda => 256 << 20,
        BackendKind::Cpu => 64 << 10,
    };
    let max = a.max.unwrap_or(default_max.max(min));
    let plan = Plan {
        sizes: bench::sweep(min, max, a.factor),
        backend,
        graph_launches,
        launch: ranks.describe(n),
        shared_gpus: placed.note == Some(placement::SHARED),
        args: a,
    };
    let out = bench::run_ranks(backend, ranks, |comm| collective::run_rank(comm, &plan))?;
    let Some(Some((info, rows))) = out else {
        return Ok(ExitCode::SUCCESS);
    };
    print!("{}", report::summary(&rows, plan.args.check));
    if let Some(note) = placed.note.filter(|&n| n != placement::SHARED) {
        println!("{note}");
    }
    if let Some(path) = &plan.args.json {
        std::fs::write(path, report::json_lines(&info, &rows)?)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &plan.args.plot {
        let format = PlotFormat::of(path)?;
        plot::write(path, format, &info, &rows)
            .map_err(|e| format!("plotting to {}: {}", path.display(), bench::chain(&*e)))?;
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
