//! The command line of `mscclpp-bench`: an op first, then nccl-tests-style options.

use std::path::PathBuf;

use mscclpp::collectives::Algorithm;
use mscclpp::shared::{DataType, ReduceOp};

use super::BoxError;

/// `--help` text.
pub const USAGE: &str = "\
usage: mscclpp-bench <op> [options]

collectives (nccl-tests style; one row per size, checked with -c):
  allreduce  allgather  reducescatter  broadcast  alltoall  sendrecv
primitives (two ranks; one table of time and GB/s per size):
  signal  packet  fifo  port-put  memory-put  copy-engine

options:
  -b, --minbytes SIZE      smallest size (K/M/G suffixes; default 8)
  -e, --maxbytes SIZE      largest size (default 256M on GPUs, 64K on the CPU backend)
  -f, --stepfactor N       size multiplier (default 2)
  -n, --iters N            timed iterations per size (default: enough for ~5 ms, 20..1000)
  -w, --warmup_iters N     untimed eager iterations first (default 5)
  -c, --check [0|1]        fill rank- and index-dependent data, check every element (#wrong)
  -a, --algo NAME          force an algorithm: put, ll2 (allreduce), ll128 (allreduce,
                           allgather, reducescatter), ll, staged,
                           direct, ce (not reducescatter) | auto
                           (default auto: chosen by size, as Collectives::all_reduce does)
  -d, --datatype T         f32 | f16 | bf16 | i32 | u32 (default f16)
  -o, --op OP              sum | min | max (default sum)
  -r, --root R             broadcast root (default 0)
      --inplace            in place (the default; all-to-all and send/recv are out of place)
      --outofplace         separate input and output buffers
  -G, --cudagraph N        capture the iterations in a CUDA graph, replay it N times
                           (default 1 on GPUs; 0: eager launches; the CPU backend has none);
                           allreduce then rounds -n up to an even number >= 4 (LL flags)
  -g, --ranks N            ranks as threads, one GPU each (default: all GPUs, at least 2;
                           2 on the CPU backend); ignored under a launcher
      --baseline nccl      also run NCCL on the same buffers; print its time and our speed-up
      --json FILE          one JSON object per row
      --plot FILE.svg      time and bus bandwidth against size (ours and the baseline)
  -h, --help

sizes: allreduce, broadcast and sendrecv move SIZE bytes per rank; allgather, reducescatter
and alltoall SIZE bytes in all (SIZE / nranks per rank and part), as in nccl-tests.
busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reducescatter, alltoall), 1 (others).

launchers: under mpirun, torchrun, Slurm or mscclpp-run (MSCCLPP_RANK / RANK /
OMPI_COMM_WORLD_RANK / SLURM_PROCID set) each process is one rank on GPU `local rank`.
NCCL: found through MSCCLPP_NCCL_LIB (file or folder), then libnccl.so.2 / libnccl.so on the
loader path, then Python's site-packages (nvidia/*/lib/libnccl.so.2).";

/// A collective the bench measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `all_reduce`.
    AllReduce,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `broadcast`.
    Broadcast,
    /// `all_to_all`.
    AllToAll,
    /// `send` + `recv` around a ring.
    SendRecv,
}

impl Op {
    /// Parses an op name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "allreduce" | "all_reduce" | "all-reduce" => Self::AllReduce,
            "allgather" | "all_gather" | "all-gather" => Self::AllGather,
            "reducescatter" | "reduce_scatter" | "reduce-scatter" => Self::ReduceScatter,
            "broadcast" => Self::Broadcast,
            "alltoall" | "all_to_all" | "all-to-all" => Self::AllToAll,
            "sendrecv" | "send_recv" | "send-recv" => Self::SendRecv,
            _ => return None,
        })
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "allreduce",
            Self::AllGather => "allgather",
            Self::ReduceScatter => "reducescatter",
            Self::Broadcast => "broadcast",
            Self::AllToAll => "alltoall",
            Self::SendRecv => "sendrecv",
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Self::AllReduce => 2.0 * (n - 1.0) / n,
            Self::AllGather | Self::ReduceScatter | Self::AllToAll => (n - 1.0) / n,
            Self::Broadcast | Self::SendRecv => 1.0,
        }
    }

    /// Whether the op reduces (so `-o` matters).
    pub fn reduces(self) -> bool {
        matches!(self, Self::AllReduce | Self::ReduceScatter)
    }

    /// Whether the op can run in place.
    pub fn has_in_place(self) -> bool {
        !matches!(self, Self::AllToAll | Self::SendRecv)
    }
}

/// The primitives of the original bench (two ranks).
pub const PRIMITIVES: [&str; 6] = [
    "signal",
    "packet",
    "fifo",
    "port-put",
    "memory-put",
    "copy-engine",
];

/// A baseline library measured in the same run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// NCCL, loaded at run time.
    Nccl,
}

/// Options of a collective run (sizes and graph use are resolved per backend later).
#[derive(Clone, Debug)]
pub struct CollArgs {
    /// The collective.
    pub op: Op,
    /// `-b`, bytes.
    pub min: Option<usize>,
    /// `-e`, bytes.
    pub max: Option<usize>,
    /// `-f`.
    pub factor: usize,
    /// `-n` (None: automatic).
    pub iters: Option<u32>,
    /// `-w`.
    pub warmup: u32,
    /// `-c`.
    pub check: bool,
    /// `-a`.
    pub algo: Option<Algorithm>,
    /// `-d`.
    pub dtype: DataType,
    /// `-o`.
    pub redop: ReduceOp,
    /// `-r`.
    pub root: usize,
    /// `--inplace` / `--outofplace`.
    pub inplace: bool,
    /// `-G` (None: the backend's default).
    pub graph_launches: Option<u32>,
    /// `-g`.
    pub ranks: Option<usize>,
    /// `--baseline`.
    pub baseline: Option<Baseline>,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--plot`.
    pub plot: Option<PathBuf>,
}

/// Options of a primitive run (the original bench's).
#[derive(Clone, Debug)]
pub struct PrimArgs {
    /// `signal`, `packet`, …
    pub op: String,
    /// `-b`.
    pub min: usize,
    /// `-e`.
    pub max: usize,
    /// `-f`.
    pub factor: usize,
    /// `-n`.
    pub iters: u32,
    /// `-w`.
    pub warmup: u32,
    /// `--json`.
    pub json: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Clone, Debug)]
pub enum Command {
    /// A collective sweep.
    Collective(CollArgs),
    /// A primitive sweep.
    Primitive(PrimArgs),
    /// `--help`.
    Help,
}

/// Parses `16`, `8K`, `1M`, `1G` (binary multiples; a trailing `B` is allowed).
pub fn parse_size(s: &str) -> Result<usize, BoxError> {
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (a number with an optional K, M or G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} is too large").into())
}

/// A short name of an algorithm (`auto` for none forced).
pub fn algo_name(a: Option<Algorithm>) -> String {
    match a {
        None => "auto".into(),
        Some(Algorithm::LlOneShot) => "ll".into(),
        Some(Algorithm::Staged) => "staged".into(),
        Some(Algorithm::LlTwoShot) => "ll2".into(),
        Some(other) => format!("{other:?}").to_ascii_lowercase(),
    }
}

/// Parses a data type name.
pub fn parse_dtype(s: &str) -> Option<DataType> {
    Some(match s {
        "f32" | "float" | "float32" => DataType::F32,
        "f16" | "half" | "float16" => DataType::F16,
        "bf16" | "bfloat16" => DataType::BF16,
        "i32" | "int" | "int32" => DataType::I32,
        "u32" | "uint32" => DataType::U32,
        // The other types (i8, u8, i64, u64, f64, e4m3, e5m2) are served by the collectives
        // and named by `dtype_name`, and the data check knows them; `-d` takes them with
        // issue 16's bench work (tests/bench_cli.rs uses `-d f64` as a refused type today).
        _ => return None,
    })
}

/// The short name of a data type.
pub fn dtype_name(d: DataType) -> &'static str {
    match d {
        DataType::F32 => "f32",
        DataType::F16 => "f16",
        DataType::BF16 => "bf16",
        DataType::I32 => "i32",
        DataType::U32 => "u32",
        DataType::I8 => "i8",
        DataType::U8 => "u8",
        DataType::I64 => "i64",
        DataType::U64 => "u64",
        DataType::F64 => "f64",
        DataType::F8E4M3 => "e4m3",
        DataType::F8E5M2 => "e5m2",
    }
}

/// Parses a reduction name.
pub fn parse_redop(s: &str) -> Option<ReduceOp> {
    Some(match s {
        "sum" => ReduceOp::Sum,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        _ => return None,
    })
}

/// The name of a reduction.
pub fn redop_name(o: ReduceOp) -> &'static str {
    match o {
        ReduceOp::Sum => "sum",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, BoxError> {
    let mut it = args.iter().peekable();
    let Some(op) = it.next() else {
        return Err("no op given (try --help)".into());
    };
    if op == "-h" || op == "--help" {
        return Ok(Command::Help);
    }
    let coll_op = Op::parse(op);
    if coll_op.is_none() && !PRIMITIVES.contains(&op.as_str()) {
        return Err(format!(
            "unknown op {op:?}: the first argument is one of allreduce, allgather, \
             reducescatter, broadcast, alltoall, sendrecv, {} (try --help)",
            PRIMITIVES.join(", ")
        )
        .into());
    }
    let mut c = CollArgs {
        op: coll_op.unwrap_or(Op::AllReduce),
        min: None,
        max: None,
        factor: 2,
        iters: None,
        warmup: 5,
        check: false,
        algo: None,
        dtype: DataType::F16,
        redop: ReduceOp::Sum,
        root: 0,
        inplace: true,
        graph_launches: None,
        ranks: None,
        baseline: None,
        json: None,
        plot: None,
    };
    // Options only collectives take, to refuse them for primitives.
    let mut collective_only: Option<String> = None;
    let mut warmup_set = false;
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (flag.as_str(), None),
        };
        macro_rules! value {
            () => {
                match &inline {
                    Some(v) => v.clone(),
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| format!("{name} needs a value (try --help)"))?,
                }
            };
        }
        let num = |v: String| -> Result<u64, BoxError> {
            v.parse::<u64>()
                .map_err(|_| format!("{name} {v:?}: not a non-negative integer").into())
        };
        let coll = |c: &mut Option<String>| {
            c.get_or_insert_with(|| name.to_string());
        };
        match name {
            "-h" | "--help" => return Ok(Command::Help),
            "-b" | "--minbytes" => c.min = Some(parse_size(&value!())?),
            "-e" | "--maxbytes" => c.max = Some(parse_size(&value!())?),
            "-f" | "--stepfactor" => c.factor = num(value!())? as usize,
            "-n" | "--iters" => c.iters = Some(num(value!())?.try_into()?),
            "-w" | "--warmup_iters" => {
                c.warmup = num(value!())?.try_into()?;
                warmup_set = true;
            }
            "--json" => c.json = Some(PathBuf::from(value!())),
            "-c" | "--check" => {
                coll(&mut collective_only);
                c.check = match inline.as_deref() {
                    Some(v) => num(v.to_string())? != 0,
                    None => match it.peek().map(|s| s.as_str()) {
                        Some("0") => {
                            it.next();
                            false
                        }
                        Some("1") => {
                            it.next();
                            true
                        }
                        _ => true,
                    },
                };
            }
            "-a" | "--algo" => {
                coll(&mut collective_only);
                let v = value!();
                c.algo = match v.as_str() {
                    "auto" => None,
                    _ => Some(Algorithm::parse(&v).ok_or_else(|| {
                        format!(
                            "-a {v:?}: not an algorithm (ll, ll128, ll2, staged, put, direct, ce, auto)"
                        )
                    })?),
                };
            }
            "-d" | "--datatype" => {
                coll(&mut collective_only);
                let v = value!();
                c.dtype = parse_dtype(&v).ok_or_else(|| {
                    format!("-d {v:?}: the data types are f32, f16, bf16, i32 and u32")
                })?;
            }
            "-o" | "--op" => {
                coll(&mut collective_only);
                let v = value!();
                c.redop = parse_redop(&v)
                    .ok_or_else(|| format!("-o {v:?}: the reductions are sum, min and max"))?;
            }
            "-r" | "--root" => {
                coll(&mut collective_only);
                c.root = num(value!())? as usize;
            }
            "--inplace" => {
                coll(&mut collective_only);
                c.inplace = true;
            }
            "--outofplace" => {
                coll(&mut collective_only);
                c.inplace = false;
            }
            "-G" | "--cudagraph" => {
                coll(&mut collective_only);
                c.graph_launches = Some(num(value!())?.try_into()?);
            }
            "-g" | "--ranks" => {
                coll(&mut collective_only);
                let n = num(value!())? as usize;
                if n == 0 {
                    return Err("-g 0: at least one rank".into());
                }
                c.ranks = Some(n);
            }
            "--baseline" => {
                coll(&mut collective_only);
                let v = value!();
                c.baseline = match v.as_str() {
                    "nccl" => Some(Baseline::Nccl),
                    "none" => None,
                    _ => return Err(format!("--baseline {v:?}: the baseline is nccl").into()),
                };
            }
            "--plot" => {
                coll(&mut collective_only);
                c.plot = Some(PathBuf::from(value!()));
            }
            other => return Err(format!("unknown option {other:?} (try --help)").into()),
        }
    }
    if c.factor < 2 {
        return Err(format!("-f {}: the step factor must be at least 2", c.factor).into());
    }
    if let (Some(b), Some(e)) = (c.min, c.max)
        && e < b
    {
        return Err(format!("-e {e} is below -b {b}").into());
    }
    if c.min == Some(0) {
        return Err("-b 0: sizes start at 1 byte".into());
    }
    if c.iters == Some(0) {
        return Err("-n 0: at least one iteration".into());
    }
    let Some(op) = coll_op else {
        if let Some(flag) = collective_only {
            return Err(format!("{flag} applies to collectives, not to the {op} primitive").into());
        }
        let min = c.min.unwrap_or(8);
        return Ok(Command::Primitive(PrimArgs {
            op: op.clone(),
            min,
            max: c.max.unwrap_or(min.max(8)),
            factor: c.factor,
            iters: c.iters.unwrap_or(100),
            warmup: if warmup_set { c.warmup } else { 10 },
            json: c.json,
        }));
    };
    if let Some(algo) = c.algo {
        let fits = match algo {
            Algorithm::TwoShotPut | Algorithm::LlTwoShot => op == Op::AllReduce,
            Algorithm::Ll128 => matches!(op, Op::AllReduce | Op::AllGather | Op::ReduceScatter),
            Algorithm::LlOneShot => op != Op::SendRecv,
            Algorithm::Staged | Algorithm::Direct => op != Op::SendRecv,
            Algorithm::CopyEngine => {
                matches!(
                    op,
                    Op::AllReduce | Op::AllGather | Op::Broadcast | Op::AllToAll
                )
            }
        };
        if !fits {
            return Err(format!(
                "-a {}: not an algorithm of {} (sendrecv picks its own)",
                algo_name(Some(algo)),
                op.name()
            )
            .into());
        }
    }
    Ok(Command::Collective(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn coll(s: &str) -> CollArgs {
        match parse(&args(s)) {
            Ok(Command::Collective(c)) => c,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1MB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn collective_options() {
        let c = coll(
            "allreduce -b 8 -e 1G -f 4 -n 7 -w 0 -c -a staged -d bf16 -o max --outofplace -G 0 -g 4 --baseline nccl --json a.json --plot p.svg",
        );
        assert_eq!(c.op, Op::AllReduce);
        assert_eq!((c.min, c.max, c.factor), (Some(8), Some(1 << 30), 4));
        assert_eq!((c.iters, c.warmup, c.check), (Some(7), 0, true));
        assert_eq!(c.algo, Some(Algorithm::Staged));
        assert_eq!(
            (c.dtype, c.redop, c.inplace),
            (DataType::BF16, ReduceOp::Max, false)
        );
        assert_eq!((c.graph_launches, c.ranks), (Some(0), Some(4)));
        assert_eq!(c.baseline, Some(Baseline::Nccl));
        assert!(c.json.is_some() && c.plot.is_some());
        let d = coll("allgather");
        assert_eq!(
            (d.dtype, d.redop, d.inplace, d.check),
            (DataType::F16, ReduceOp::Sum, true, false)
        );
        assert!(!coll("sendrecv -c 0").check);
        assert!(coll("sendrecv -c 1 -n 3").check);
        assert!(coll("broadcast --check=1").check);
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        for (line, needle) in [
            ("", "no op"),
            ("allreduc", "unknown op"),
            ("allreduce -x", "unknown option"),
            ("allreduce -b", "needs a value"),
            ("allreduce -d f64", "data types"),
            ("allreduce -o prod", "reductions"),
            ("allreduce -a fast", "not an algorithm"),
            ("broadcast -a put", "not an algorithm of broadcast"),
            ("reducescatter -a ce", "not an algorithm of reducescatter"),
            ("sendrecv -a staged", "sendrecv picks its own"),
            ("allreduce -b 1M -e 1K", "below"),
            ("allreduce -f 1", "step factor"),
            ("allreduce -n 0", "at least one"),
            ("allreduce --baseline mpi", "baseline"),
            ("signal -c", "applies to collectives"),
        ] {
            match parse(&args(line)) {
                Err(e) => assert!(e.to_string().contains(needle), "{line}: {e}"),
                Ok(c) => panic!("{line}: accepted as {c:?}"),
            }
        }
    }

    #[test]
    fn primitives_keep_their_defaults() {
        match parse(&args("packet -e 4K")) {
            Ok(Command::Primitive(p)) => {
                assert_eq!((p.min, p.max, p.iters, p.warmup), (8, 4096, 100, 10));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bus_bandwidth_factors_match_nccl_tests() {
        assert_eq!(Op::AllReduce.busbw_factor(2), 1.0);
        assert_eq!(Op::AllReduce.busbw_factor(8), 1.75);
        assert_eq!(Op::AllGather.busbw_factor(4), 0.75);
        assert_eq!(Op::ReduceScatter.busbw_factor(4), 0.75);
        assert_eq!(Op::AllToAll.busbw_factor(8), 0.875);
        assert_eq!(Op::Broadcast.busbw_factor(8), 1.0);
        assert_eq!(Op::SendRecv.busbw_factor(8), 1.0);
    }
}
