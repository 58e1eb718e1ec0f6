//! `mscclpp-bench`: the collectives (and the primitives under them) measured in the style of
//! nccl-tests / mscclpp-test, optionally against NCCL in the same run.
//!
//! ```text
//! mscclpp-bench allreduce -b 8 -e 1G -f 2 -c --baseline nccl --json ar.json --plot ar.svg
//! mscclpp-bench allgather -d bf16 --outofplace -G 0
//! mscclpp-run -n 2 -- mscclpp-bench reducescatter -c      # one process per rank
//! mscclpp-bench packet -b 8 -e 4K                         # a primitive (two ranks)
//! ```
//! `mscclpp-bench --help` lists the options. One row per size: size, count, type, algorithm,
//! iterations, time (µs, mean over ranks), algbw and busbw (GB/s, nccl-tests' formulas),
//! `#wrong` (with `-c`), and with `--baseline nccl` NCCL's time and bus bandwidth and our
//! speed-up. See `src/bench/collective.rs` for how times are taken.
//!
//! All local GPUs run from this process by default (one thread per rank); under a launcher
//! (`mscclpp-run`, `mpirun`, `torchrun`, Slurm) each process is one rank. Without a GPU it runs
//! on the CPU backend with 2 ranks, checks data, and says that its times mean nothing.
//!
//! Exit status: 0; 1 when a rank failed or `-c` found a wrong element; 2 for a bad command line.

#[path = "../bench/mod.rs"]
mod bench;

use std::process::ExitCode;

use bench::args::{self, Baseline, CollArgs, Command, Op, PrimArgs};
use bench::collective::{self, Plan};
use bench::{BoxError, Ranks, nccl, plot, primitives, report};
use mscclpp::host::gpu::BackendKind;

fn main() -> ExitCode {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: the first statement of `main`: no other thread exists yet that could read or
        // write the environment concurrently. NVLink multicast stays off (shared machines).
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let cmd = match args::parse(&argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mscclpp-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let r = match cmd {
        Command::Help => {
            println!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
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
    let (table, json) = primitives::report(p, &rows);
    print!("{table}");
    if let Some(path) = &p.json {
        std::fs::write(path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn run_collective(a: CollArgs) -> Result<ExitCode, BoxError> {
    let backend = BackendKind::select()?;
    let usage = |m: String| -> BoxError { m.into() };
    let (ranks, n) = match bench::launcher_var() {
        Some(_) => {
            let cfg = mscclpp::host::bootstrap::BootstrapConfig::from_env()?;
            if let Some(g) = a.ranks
                && g != cfg.size
            {
                eprintln!(
                    "mscclpp-bench: -g {g} ignored: the launcher started {} ranks",
                    cfg.size
                );
            }
            (Ranks::Process, cfg.size)
        }
        None => {
            let devices = backend.device_count()?;
            let n = match (a.ranks, backend) {
                (Some(n), _) => n,
                (None, BackendKind::Cpu) => 2,
                (None, BackendKind::Cuda) => devices.max(2),
            };
            if backend == BackendKind::Cuda && n > devices {
                return Err(usage(format!(
                    "{n} ranks as threads need {n} GPUs, and {devices} are present{}",
                    if a.ranks.is_none() {
                        " (use -g 1 for one)"
                    } else {
                        ""
                    }
                )));
            }
            (Ranks::Threads(n), n)
        }
    };
    let graph_launches = match (a.graph_launches, backend) {
        (Some(g), BackendKind::Cpu) if g > 0 => {
            return Err(usage(format!(
                "-G {g}: CUDA graphs need the CUDA backend, and this run is on the CPU backend (use -G 0)"
            )));
        }
        (Some(g), _) => g,
        (None, BackendKind::Cuda) => 1,
        (None, BackendKind::Cpu) => 0,
    };
    if a.baseline == Some(Baseline::Nccl) {
        if backend != BackendKind::Cuda {
            return Err(usage(
                "--baseline nccl needs the CUDA backend, and this run is on the CPU backend".into(),
            ));
        }
        nccl::Nccl::load()?;
    }
    if a.op == Op::Broadcast && a.root >= n {
        return Err(usage(format!(
            "-r {}: the root must be below the {n} ranks",
            a.root
        )));
    }
    if a.op == Op::SendRecv && n < 2 {
        return Err(usage("sendrecv needs at least 2 ranks".into()));
    }
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
        args: a,
    };
    let out = bench::run_ranks(backend, ranks, |comm| collective::run_rank(comm, &plan))?;
    let Some(Some((info, rows))) = out else {
        return Ok(ExitCode::SUCCESS);
    };
    print!("{}", report::summary(&rows, plan.args.check));
    if let Some(path) = &plan.args.json {
        std::fs::write(path, report::json_lines(&info, &rows))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &plan.args.plot {
        std::fs::write(path, plot::svg(&info, &rows))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
