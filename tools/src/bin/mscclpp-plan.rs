//! `mscclpp-plan`: MSCCL++ execution plans as `mscclpp::executor` sees them.
//!
//! ```text
//! mscclpp-plan check reduce.json allgather.json   # parse and verify; a summary of each
//! mscclpp-plan write allreduce_read --ranks 4 -o ar4.json   # one of the repository's plans
//! mscclpp-plan write copy --ranks 1 --blocks 128 -o copy.json   # one rank: the interpreter's copy
//! mscclpp-plan list                                # the repository's plans
//! ```
//!
//! `check` does what `ExecutionPlan::load` does (parse, then verify at the plan's canonical
//! sizes, or at `--bytes`) and prints per file either `ok` and a summary (ranks, blocks and ops
//! per rank, bytes each rank moves to and from its peers per call, at the sizes verified) or
//! the error that the executor would refuse the plan with. Switch channels (NVLink
//! multicast) are refused, as the executor refuses them.
//!
//! Exit status: 0 when every plan passes; 1 when any is refused (or a file cannot be read);
//! 2 for a bad command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mscclpp::executor::lower::{Geometry, Sizes};
use mscclpp::executor::plan::{self, PlanDoc, Protocol, ReduceKind};
use mscclpp::executor::verify::{self, Races, Summary};
use mscclpp::executor::{ExecutionPlan, plans};
use mscclpp_tools::{BoxError, chain};

/// MSCCL++ execution plans: check them, or write the repository's own.
#[derive(Parser, Debug)]
#[command(name = "mscclpp-plan", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Parse and verify plans as the executor would; print a summary of each
    Check {
        /// Plan files (JSON, as MSCCL++'s DSL writes them)
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Verify at this message size (bytes of the input; of the output for an all-gather)
        /// instead of the plan's canonical sizes
        #[arg(long, value_name = "BYTES")]
        bytes: Option<u64>,
        /// Accept plans whose only fault is a race (they run on timing alone)
        #[arg(long)]
        allow_races: bool,
    },
    /// Write one of the repository's plans (see `list`) as JSON
    Write {
        /// The plan's name
        name: String,
        /// Ranks
        #[arg(long, default_value_t = 2)]
        ranks: usize,
        /// Bytes of a pipeline's unit (allreduce_pipeline)
        #[arg(long, default_value_t = 1 << 20)]
        unit: u64,
        /// Blocks (copy)
        #[arg(long, default_value_t = 128)]
        blocks: usize,
        /// Where (default: standard output)
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// List the repository's plans
    List,
}

/// The repository's plans by name at `ranks` ranks.
fn own_plan(name: &str, ranks: usize, unit: u64) -> Option<PlanDoc> {
    if name == "allreduce_read_max" {
        return Some(plans::allreduce_read(ranks, ReduceKind::Max));
    }
    plans::all(ranks, unit).into_iter().find(|p| p.name == name)
}

/// Verifies `doc` at one message size: the call's sizes derived from it.
fn at_size(doc: &PlanDoc, bytes: u64, races: Races) -> mscclpp::host::Result<Summary> {
    let g = &doc.gpus[0];
    let sizes = if doc.collective == "allgather" {
        Sizes {
            input: bytes / g.output_chunks * g.input_chunks,
            output: bytes,
        }
    } else {
        Sizes {
            input: bytes,
            output: bytes / g.input_chunks * g.output_chunks,
        }
    };
    let geom = Geometry::new(doc, sizes)?;
    verify::verify(doc, &geom, &verify::declared_aliasing(doc, sizes), races)
}

fn print_summary(s: &Summary) {
    println!(
        "  at {} input / {} output bytes: {} ranks, {} launches and {} op steps simulated",
        s.sizes.input, s.sizes.output, s.ranks, s.launches, s.steps
    );
    for r in 0..s.ranks {
        println!(
            "  rank {r}: {} blocks, {} ops, {} bytes to peers, {} bytes from peers per call",
            s.blocks[r], s.ops[r], s.sent[r], s.fetched[r]
        );
    }
    for race in &s.races {
        println!("  race (allowed): {race}");
    }
}

fn check(files: &[PathBuf], bytes: Option<u64>, races: Races) -> bool {
    let mut all_ok = true;
    for f in files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                println!("{}: cannot be read: {e}", f.display());
                all_ok = false;
                continue;
            }
        };
        let origin = f.display().to_string();
        let result = PlanDoc::parse(&text, &origin).and_then(|doc| match bytes {
            Some(b) => at_size(&doc, b, races).map(|s| (doc, vec![s])),
            None => {
                ExecutionPlan::from_doc(doc.clone(), races).map(|p| (doc, p.summaries().to_vec()))
            }
        });
        match result {
            Ok((doc, summaries)) => {
                println!(
                    "{}: ok: plan {:?}, {}, {} protocol, {}",
                    f.display(),
                    doc.name,
                    doc.collective,
                    match doc.protocol {
                        Protocol::Simple => "Simple",
                        Protocol::Ll => "LL",
                    },
                    if doc.inplace {
                        "in place"
                    } else {
                        "out of place"
                    }
                );
                for s in &summaries {
                    print_summary(s);
                }
            }
            Err(e) => {
                all_ok = false;
                println!("{}: refused: {}", f.display(), chain(&e));
            }
        }
    }
    all_ok
}

fn run(cli: Cli) -> Result<bool, BoxError> {
    match cli.cmd {
        Cmd::Check {
            files,
            bytes,
            allow_races,
        } => {
            let races = if allow_races {
                Races::Allow
            } else {
                Races::Refuse
            };
            Ok(check(&files, bytes, races))
        }
        Cmd::Write {
            name,
            ranks,
            unit,
            blocks,
            output,
        } => {
            let doc = if name == "copy" {
                if ranks != 1 || !(1..=plan::MAX_THREADBLOCKS).contains(&blocks) {
                    return Err(format!(
                        "copy is a plan of one rank and 1..={} blocks: --ranks 1 [--blocks N]",
                        plan::MAX_THREADBLOCKS
                    )
                    .into());
                }
                plans::copy(blocks)
            } else {
                if ranks < 2 {
                    return Err("a plan needs at least 2 ranks".into());
                }
                own_plan(&name, ranks, unit)
                    .ok_or_else(|| format!("no plan {name:?} (mscclpp-plan list)"))?
            };
            let text = serde_json::to_string_pretty(&doc.to_json())?;
            match output {
                Some(p) => std::fs::write(&p, text + "\n")
                    .map_err(|e| format!("writing {}: {e}", p.display()))?,
                None => println!("{text}"),
            }
            Ok(true)
        }
        Cmd::List => {
            for doc in plans::all(2, 1 << 20) {
                println!("{} ({})", doc.name, doc.collective);
            }
            println!("allreduce_read_max (allreduce)");
            println!("copy (allgather of one rank: --ranks 1 [--blocks N])");
            Ok(true)
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    mscclpp_tools::init_logging("mscclpp-plan");
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mscclpp-plan: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}
