//! `mscclpp-trace`: a run's trace as one timeline.
//!
//! ```text
//! MSCCLPP_TRACE=run1 my-program            # or: mscclpp-bench allreduce --trace run1
//! mscclpp-trace merge run1 -o trace.json   # open in Perfetto (ui.perfetto.dev) or chrome://tracing
//! mscclpp-trace plot trace.json -o timeline.png
//! ```
//!
//! `merge` reads every `*.jsonl` of the directory (one per rank) and writes one Chrome
//! trace-event JSON: ranks as processes, host threads, the proxy and GPU blocks as threads, with
//! bytes and GB/s in the events' arguments (see `mscclpp_tools::trace::merge`). `plot` draws a
//! merged trace as a PNG or SVG, by default the time span of its calls and kernels.
//!
//! Exit status: 0; 1 when a file cannot be read or written; 2 for a bad command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mscclpp_tools::{BoxError, chain, trace};

/// A run's trace files merged into one Chrome / Perfetto timeline, or drawn.
#[derive(Parser, Debug)]
#[command(name = "mscclpp-trace", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Merge the per-rank files of DIR into one Chrome trace-event JSON
    Merge {
        /// The directory of the run's trace files (MSCCLPP_TRACE)
        dir: PathBuf,
        /// The merged trace
        #[arg(
            short = 'o',
            long = "output",
            value_name = "FILE",
            default_value = "trace.json"
        )]
        output: PathBuf,
    },
    /// Draw a merged trace as a timeline (.png or .svg)
    Plot {
        /// A merged trace (from `merge`)
        trace: PathBuf,
        /// The image
        #[arg(
            short = 'o',
            long = "output",
            value_name = "FILE",
            default_value = "timeline.png"
        )]
        output: PathBuf,
        /// The time window to draw, in µs from the trace's start: FROM:TO [default: the calls
        /// and kernels]
        #[arg(long, value_name = "FROM:TO", value_parser = parse_window)]
        window: Option<std::ops::Range<f64>>,
    },
}

fn parse_window(s: &str) -> Result<std::ops::Range<f64>, String> {
    let (a, b) = s.split_once(':').ok_or("FROM:TO, in µs")?;
    let (a, b): (f64, f64) = (
        a.trim()
            .parse()
            .map_err(|_| format!("{a:?} is not a number"))?,
        b.trim()
            .parse()
            .map_err(|_| format!("{b:?} is not a number"))?,
    );
    if b > a {
        Ok(a..b)
    } else {
        Err(format!("{s}: TO must be after FROM"))
    }
}

fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.cmd {
        Cmd::Merge { dir, output } => {
            let merged = trace::merge_dir(&dir)?;
            for n in &merged.notes {
                eprintln!("mscclpp-trace: note: {n}");
            }
            let text = serde_json::to_string(&merged.json)?;
            std::fs::write(&output, text)
                .map_err(|e| format!("writing {}: {e}", output.display()))?;
            let events = merged.json["traceEvents"].as_array().map_or(0, Vec::len);
            println!("{}: {events} events", output.display());
        }
        Cmd::Plot {
            trace: input,
            output,
            window,
        } => {
            let text = std::fs::read_to_string(&input)
                .map_err(|e| format!("reading {}: {e}", input.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not JSON: {e}", input.display()))?;
            trace::timeline::plot(&json, &output, window)?;
            println!("{}", output.display());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    mscclpp_tools::init_logging("mscclpp-trace");
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mscclpp-trace: {}", chain(&*e));
            ExitCode::FAILURE
        }
    }
}
