//! The command line of `mscclpp-bench`, parsed by `clap`: one subcommand per collective or
//! primitive (`mscclpp-bench allreduce -b 8 -e 1G -c`), then nccl-tests-style options.
//! [`parse`] turns it into a [`Command`] with every default resolved that does not depend on
//! the backend (sizes and CUDA graphs are resolved per backend in the binary).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use mscclpp::collectives::{Algorithm, Collective, Reduction, Scalar, element_bits};
use mscclpp::shared::DataType;

/// What every collective's `--help` ends with.
const COLLECTIVE_NOTES: &str = "\
sizes: allreduce, reduce, broadcast and sendrecv move SIZE bytes per rank; allgather,
reducescatter, gather, scatter, alltoall and alltoallv SIZE bytes in all (SIZE / nranks per
rank and part), as in nccl-tests. alltoallv: rank r sends rank q a share of its part of
(r + 2q + 1) mod 4 thirds (none, a third, two thirds or all of it; counts per pair).
busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reducescatter, gather, scatter,
alltoall, alltoallv), 1 (others). -o premulsum multiplies every contribution by 2.
sendrecv, gather, scatter and alltoallv are groups of sends and receives (NCCL: grouped
ncclSend / ncclRecv, and ncclGather / ncclScatter from NCCL 2.28).

launchers: under mpirun, torchrun, Slurm or mscclpp-run (MSCCLPP_RANK / RANK /
OMPI_COMM_WORLD_RANK / SLURM_PROCID set) each process is one rank on GPU `local rank`.
NCCL: found through MSCCLPP_NCCL_LIB (file or folder), then libnccl.so.2 / libnccl.so on the
loader path, then Python's site-packages (nvidia/*/lib/libnccl.so.2).
Logging: MSCCLPP_LOG=debug (or e.g. mscclpp_host=trace) shows the library's events.";

/// What the top-level `--help` ends with.
const NOTES: &str = "\
Each op takes its own options: mscclpp-bench allreduce --help.
Collectives: one row per size (size, count, type, algo, iters, time, algbw, busbw, #wrong;
with --baseline nccl, NCCL's time and busbw and our speed-up). Primitives: two ranks, one
row of time and GB/s per size. Without a GPU everything runs on the CPU backend (the same
kernels on threads: the data check means something, the times do not).

Exit status: 0; 1 when a rank failed or -c found a wrong element; 2 for a bad command line.";

/// The command line as clap reads it.
#[derive(Parser, Debug)]
#[command(
    name = "mscclpp-bench",
    about = "mscclpp-rs's collectives and primitives measured nccl-tests style, optionally against NCCL",
    after_help = NOTES,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

/// The collectives (nccl-tests style) and the primitives (two ranks).
#[derive(Subcommand, Debug)]
enum Bench {
    /// all_reduce: SIZE bytes per rank, reduced over all ranks
    #[command(aliases = ["all_reduce", "all-reduce"], after_help = COLLECTIVE_NOTES)]
    Allreduce(CollOpts),
    /// all_gather: SIZE bytes in all, SIZE / nranks from each rank
    #[command(aliases = ["all_gather", "all-gather"], after_help = COLLECTIVE_NOTES)]
    Allgather(CollOpts),
    /// reduce_scatter: SIZE bytes in all, SIZE / nranks reduced onto each rank
    #[command(aliases = ["reduce_scatter", "reduce-scatter"], after_help = COLLECTIVE_NOTES)]
    Reducescatter(CollOpts),
    /// broadcast: SIZE bytes from the root (-r) to every rank
    #[command(after_help = COLLECTIVE_NOTES)]
    Broadcast(CollOpts),
    /// all_to_all: SIZE bytes in all, SIZE / nranks from each rank to each rank
    #[command(aliases = ["all_to_all", "all-to-all"], after_help = COLLECTIVE_NOTES)]
    Alltoall(CollOpts),
    /// reduce: SIZE bytes per rank, reduced onto the root (-r)
    #[command(after_help = COLLECTIVE_NOTES)]
    Reduce(CollOpts),
    /// gather: SIZE bytes in all, SIZE / nranks from each rank onto the root (-r)
    #[command(after_help = COLLECTIVE_NOTES)]
    Gather(CollOpts),
    /// scatter: SIZE bytes in all on the root (-r), SIZE / nranks to each rank
    #[command(after_help = COLLECTIVE_NOTES)]
    Scatter(CollOpts),
    /// all_to_allv: as alltoall with a count per pair of ranks (uneven, some zero)
    #[command(aliases = ["all_to_allv", "all-to-allv"], after_help = COLLECTIVE_NOTES)]
    Alltoallv(CollOpts),
    /// send and receive around a ring, in one group: SIZE bytes to the next rank, from the
    /// previous
    #[command(aliases = ["send_recv", "send-recv"], after_help = COLLECTIVE_NOTES)]
    Sendrecv(CollOpts),
    /// MemoryChannel signal + wait round trip (us)
    Signal(SweepOpts),
    /// LL16 packet round trip of SIZE bytes (us)
    Packet(SweepOpts),
    /// FIFO push -> pop per trigger (us): one GPU thread pushes, a host thread pops
    Fifo(SweepOpts),
    /// PortChannel put_with_signal ping-pong: one-way GB/s per SIZE (--transport: over the
    /// network transports too)
    PortPut(PortOpts),
    /// MemoryChannel put (SM copy into peer memory): GB/s per SIZE
    MemoryPut(SweepOpts),
    /// cuMemcpyAsync into peer memory (the copy-engine line): GB/s per SIZE
    CopyEngine(SweepOpts),
}

/// The sweep: sizes, iterations and the JSON file (collectives and primitives).
#[derive(Args, Clone, Debug)]
struct SweepOpts {
    /// Smallest size, bytes (K, M, G suffixes) [default: 8]
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", value_parser = parse_size)]
    min: Option<usize>,
    /// Largest size [default: 256M on GPUs, 64K on the CPU backend; primitives: -b]
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", value_parser = parse_size)]
    max: Option<usize>,
    /// Size multiplier
    #[arg(short = 'f', long = "stepfactor", value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(2..))]
    factor: u64,
    /// Timed iterations per size [default: enough for ~5 ms, 20..1000; primitives: 100]
    #[arg(short = 'n', long = "iters", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    iters: Option<u32>,
    /// Untimed eager iterations first [default: 5; primitives: 10]
    #[arg(short = 'w', long = "warmup_iters", value_name = "N")]
    warmup: Option<u32>,
    /// Write one JSON object per row to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Trace the run: one file per rank in DIR (as MSCCLPP_TRACE=DIR does); `mscclpp-trace
    /// merge DIR -o trace.json` makes one timeline of them
    #[arg(long, value_name = "DIR")]
    trace: Option<PathBuf>,
}

/// Options of `port-put`.
#[derive(Args, Clone, Debug)]
struct PortOpts {
    #[command(flatten)]
    sweep: SweepOpts,
    /// The connection's transport: local (CUDA IPC / shared memory), ofi (libfabric; its
    /// provider as MSCCLPP_OFI_PROVIDER / FI_PROVIDER say) or ethernet (TCP)
    #[arg(short = 't', long, value_name = "local|ofi|ethernet", default_value = "local",
          value_parser = parse_transport)]
    transport: PortTransport,
}

/// The transport of `port-put`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortTransport {
    /// The backend's same-node transport.
    Local,
    /// libfabric.
    Ofi,
    /// TCP between the proxies.
    Ethernet,
}

fn parse_transport(s: &str) -> Result<PortTransport, String> {
    match s {
        "local" => Ok(PortTransport::Local),
        "ofi" | "libfabric" => Ok(PortTransport::Ofi),
        "ethernet" | "tcp" => Ok(PortTransport::Ethernet),
        _ => Err(format!("{s:?} is not local, ofi or ethernet")),
    }
}

/// Options of the collectives.
#[derive(Args, Clone, Debug)]
struct CollOpts {
    #[command(flatten)]
    sweep: SweepOpts,
    /// Fill rank- and index-dependent data, check every element (#wrong); -c 0: off
    #[arg(short = 'c', long = "check", value_name = "0|1", num_args = 0..=1,
          default_missing_value = "1", value_parser = clap::value_parser!(u64))]
    check: Option<u64>,
    /// Force an algorithm (ll, ll128, ll2, staged, put, direct, ce), or auto: chosen by size
    /// as the library does [default: auto]
    #[arg(short = 'a', long = "algo", value_name = "NAME", value_parser = parse_algo)]
    algo: Option<AlgoChoice>,
    /// Data type
    #[arg(short = 'd', long = "datatype", value_name = "T", value_enum, default_value_t = Dtype::F16)]
    dtype: Dtype,
    /// Reduction (allreduce, reducescatter, reduce)
    #[arg(short = 'o', long = "op", value_name = "OP", value_enum, default_value_t = Redop::Sum)]
    redop: Redop,
    /// Root (broadcast, reduce, gather, scatter)
    #[arg(short = 'r', long = "root", value_name = "R", default_value_t = 0)]
    root: usize,
    /// In place (the default; all-to-all and send/recv are always out of place)
    #[arg(long, overrides_with = "outofplace")]
    inplace: bool,
    /// Separate input and output buffers
    #[arg(long, overrides_with = "inplace")]
    outofplace: bool,
    /// Capture the iterations in a CUDA graph and replay it N times; 0: eager launches
    /// (allreduce then rounds -n up to an even number >= 4: LL flags) [default: 1 on GPUs,
    /// 0 on the CPU backend, which has no graphs]
    #[arg(short = 'G', long = "cudagraph", value_name = "N")]
    graph_launches: Option<u32>,
    /// Register the buffers with the collectives once, before the sweep, as windows
    /// (`Collectives::register_window`, NCCL's `ncclCommWindowRegister`): no call then sends a
    /// bootstrap message or waits on the host, eager (`-G 0`) or captured (the direct kernel
    /// learns the peers' buffers itself; the copy engines find them in the windows)
    #[arg(long)]
    registered: bool,
    /// Ranks as threads, one GPU each; ignored under a launcher [default: every GPU when
    /// there are two or more; else 2 on the CPU backend]
    #[arg(short = 'g', long = "ranks", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    ranks: Option<u64>,
    /// Also run this library on the same buffers; print its time and our speed-up
    #[arg(long, value_name = "LIB", value_enum)]
    baseline: Option<BaselineArg>,
    /// Run an MSCCL++ execution plan (JSON, as MSCCL++'s DSL writes it) instead of the
    /// library's algorithms: `mscclpp::executor`, verified at load; its collective must be
    /// this op's, its `inplace` the run's (--inplace / --outofplace), its reduction -o's;
    /// sizes the plan does not serve are skipped with a note
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    /// Plot time and bus bandwidth against size (ours and the baseline's) to FILE.svg or
    /// FILE.png
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// `-a`: an algorithm, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AlgoChoice {
    Auto,
    Forced(Algorithm),
}

/// `-d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dtype {
    #[value(name = "f32", aliases = ["float", "float32"])]
    F32,
    #[value(name = "f16", aliases = ["half", "float16"])]
    F16,
    #[value(name = "bf16", alias = "bfloat16")]
    Bf16,
    #[value(name = "i32", aliases = ["int", "int32"])]
    I32,
    #[value(name = "u32", alias = "uint32")]
    U32,
    #[value(name = "i8", aliases = ["int8", "char"])]
    I8,
    #[value(name = "u8", alias = "uint8")]
    U8,
    #[value(name = "i64", alias = "int64")]
    I64,
    #[value(name = "u64", alias = "uint64")]
    U64,
    #[value(name = "f64", aliases = ["double", "float64"])]
    F64,
    #[value(name = "e4m3", aliases = ["fp8_e4m3", "f8e4m3"])]
    E4m3,
    #[value(name = "e5m2", aliases = ["fp8_e5m2", "f8e5m2"])]
    E5m2,
}

impl Dtype {
    fn data_type(self) -> DataType {
        match self {
            Self::F32 => DataType::F32,
            Self::F16 => DataType::F16,
            Self::Bf16 => DataType::BF16,
            Self::I32 => DataType::I32,
            Self::U32 => DataType::U32,
            Self::I8 => DataType::I8,
            Self::U8 => DataType::U8,
            Self::I64 => DataType::I64,
            Self::U64 => DataType::U64,
            Self::F64 => DataType::F64,
            Self::E4m3 => DataType::F8E4M3,
            Self::E5m2 => DataType::F8E5M2,
        }
    }
}

/// `-o`: NCCL's reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Redop {
    /// Sum
    Sum,
    /// Product
    Prod,
    /// Minimum
    Min,
    /// Maximum
    Max,
    /// Average (NCCL's ncclAvg)
    Avg,
    /// Sum of every contribution times 2 (NCCL's ncclRedOpCreatePreMulSum, host scalar)
    #[value(name = "premulsum", alias = "pre-mul-sum")]
    PreMulSum,
}

impl Redop {
    /// Every reduction.
    pub const ALL: [Redop; 6] = [
        Self::Sum,
        Self::Prod,
        Self::Min,
        Self::Max,
        Self::Avg,
        Self::PreMulSum,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Min => "min",
            Self::Max => "max",
            Self::Avg => "avg",
            Self::PreMulSum => "premulsum",
        }
    }

    /// The library's reduction on `dtype`.
    pub fn reduction(self, dtype: DataType) -> Reduction {
        match self {
            Self::Sum => Reduction::Sum,
            Self::Prod => Reduction::Prod,
            Self::Min => Reduction::Min,
            Self::Max => Reduction::Max,
            Self::Avg => Reduction::Avg,
            Self::PreMulSum => {
                Reduction::PreMulSum(Scalar::Host(element_bits(PREMUL_SCALAR, dtype)))
            }
        }
    }
}

/// The scalar of `-o premulsum`.
pub const PREMUL_SCALAR: f64 = 2.0;

/// `--baseline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BaselineArg {
    /// NCCL, loaded at run time
    Nccl,
    /// The library's plain copy kernel moving the output's bytes from the input (one rank,
    /// out of place: what a copy-only plan does, without the interpreter)
    CopyKernel,
    /// No baseline
    None,
}

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
    /// `reduce` to a root.
    Reduce,
    /// `gather` to a root.
    Gather,
    /// `scatter` from a root.
    Scatter,
    /// `all_to_allv` (uneven counts).
    AllToAllv,
    /// `send` + `recv` around a ring, in one group.
    SendRecv,
}

impl Op {
    /// The collective it benchmarks, as the algorithms say what they serve (the ops made of
    /// sends and receives are point-to-point calls, which choose their own).
    pub fn collective(self) -> Collective {
        match self {
            Self::AllReduce => Collective::AllReduce,
            Self::AllGather => Collective::AllGather,
            Self::ReduceScatter => Collective::ReduceScatter,
            Self::Broadcast => Collective::Broadcast,
            Self::AllToAll => Collective::AllToAll,
            Self::Reduce => Collective::Reduce,
            Self::Gather | Self::Scatter | Self::AllToAllv | Self::SendRecv => Collective::SendRecv,
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "allreduce",
            Self::AllGather => "allgather",
            Self::ReduceScatter => "reducescatter",
            Self::Broadcast => "broadcast",
            Self::AllToAll => "alltoall",
            Self::Reduce => "reduce",
            Self::Gather => "gather",
            Self::Scatter => "scatter",
            Self::AllToAllv => "alltoallv",
            Self::SendRecv => "sendrecv",
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Self::AllReduce => 2.0 * (n - 1.0) / n,
            Self::AllGather
            | Self::ReduceScatter
            | Self::AllToAll
            | Self::Gather
            | Self::Scatter
            | Self::AllToAllv => (n - 1.0) / n,
            Self::Broadcast | Self::Reduce | Self::SendRecv => 1.0,
        }
    }

    /// Whether the op reduces (so `-o` matters).
    pub fn reduces(self) -> bool {
        matches!(self, Self::AllReduce | Self::ReduceScatter | Self::Reduce)
    }

    /// Whether the op has a root (`-r`).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Self::Broadcast | Self::Reduce | Self::Gather | Self::Scatter
        )
    }

    /// Whether the op can run in place.
    pub fn has_in_place(self) -> bool {
        !matches!(self, Self::AllToAll | Self::AllToAllv | Self::SendRecv)
    }

    /// The fewest ranks the op runs on.
    pub fn min_ranks(self) -> usize {
        match self {
            Self::SendRecv => 2,
            _ => 1,
        }
    }
}

/// A primitive of the original bench (two ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    /// MemoryChannel signal + wait round trip.
    Signal,
    /// LL16 packet round trip.
    Packet,
    /// FIFO push -> pop.
    Fifo,
    /// PortChannel put ping-pong.
    PortPut,
    /// MemoryChannel put.
    MemoryPut,
    /// Copy-engine copy into peer memory.
    CopyEngine,
}

impl Primitive {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Signal => "signal",
            Self::Packet => "packet",
            Self::Fifo => "fifo",
            Self::PortPut => "port-put",
            Self::MemoryPut => "memory-put",
            Self::CopyEngine => "copy-engine",
        }
    }
}

/// A baseline library measured in the same run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// NCCL, loaded at run time.
    Nccl,
    /// The copy kernel (`kernels::COPY`), one rank.
    CopyKernel,
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
    /// `-a` (None: by size).
    pub algo: Option<Algorithm>,
    /// `-d`.
    pub dtype: DataType,
    /// `-o`.
    pub redop: Redop,
    /// `-r`.
    pub root: usize,
    /// `--inplace` / `--outofplace`.
    pub inplace: bool,
    /// `-G` (None: the backend's default).
    pub graph_launches: Option<u32>,
    /// `--registered`.
    pub registered: bool,
    /// `-g`.
    pub ranks: Option<usize>,
    /// `--baseline`.
    pub baseline: Option<Baseline>,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--plot`.
    pub plot: Option<PathBuf>,
    /// `--trace`.
    pub trace: Option<PathBuf>,
    /// `--plan`: an MSCCL++ execution plan to run instead of the library's algorithms.
    pub plan: Option<PathBuf>,
}

/// Options of a primitive run (the original bench's).
#[derive(Clone, Debug)]
pub struct PrimArgs {
    /// The primitive.
    pub op: Primitive,
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
    /// `--trace`.
    pub trace: Option<PathBuf>,
    /// `port-put --transport`.
    pub transport: PortTransport,
}

/// What the command line asks for.
#[derive(Clone, Debug)]
pub enum Command {
    /// A collective sweep.
    Collective(CollArgs),
    /// A primitive sweep.
    Primitive(PrimArgs),
}

impl Command {
    /// `--trace`: the directory of the run's trace files.
    pub fn trace(&self) -> Option<&PathBuf> {
        match self {
            Self::Collective(c) => c.trace.as_ref(),
            Self::Primitive(p) => p.trace.as_ref(),
        }
    }
}

/// Parses the whole command line (program name first). `--help` and every refusal come back
/// as a [`clap::Error`]: its `exit()` prints it and exits with 0 (help) or 2 (bad usage).
pub fn parse<I, T>(argv: I) -> Result<Command, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(argv)?;
    cli.bench
        .resolve()
        .map_err(|m| Cli::command().error(ErrorKind::ArgumentConflict, m))
}

impl Bench {
    /// The command with the op named and the defaults of its kind filled in.
    fn resolve(self) -> Result<Command, String> {
        let (op, opts) = match self {
            Self::Allreduce(o) => (Op::AllReduce, o),
            Self::Allgather(o) => (Op::AllGather, o),
            Self::Reducescatter(o) => (Op::ReduceScatter, o),
            Self::Broadcast(o) => (Op::Broadcast, o),
            Self::Alltoall(o) => (Op::AllToAll, o),
            Self::Reduce(o) => (Op::Reduce, o),
            Self::Gather(o) => (Op::Gather, o),
            Self::Scatter(o) => (Op::Scatter, o),
            Self::Alltoallv(o) => (Op::AllToAllv, o),
            Self::Sendrecv(o) => (Op::SendRecv, o),
            Self::Signal(s) => return s.primitive(Primitive::Signal),
            Self::Packet(s) => return s.primitive(Primitive::Packet),
            Self::Fifo(s) => return s.primitive(Primitive::Fifo),
            Self::PortPut(p) => {
                let mut c = p.sweep.primitive(Primitive::PortPut)?;
                if let Command::Primitive(a) = &mut c {
                    a.transport = p.transport;
                }
                return Ok(c);
            }
            Self::MemoryPut(s) => return s.primitive(Primitive::MemoryPut),
            Self::CopyEngine(s) => return s.primitive(Primitive::CopyEngine),
        };
        opts.collective(op).map(Command::Collective)
    }
}

impl SweepOpts {
    /// `-e` not below `-b`.
    fn check_sizes(&self) -> Result<(), String> {
        match (self.min, self.max) {
            (Some(b), Some(e)) if e < b => Err(format!("-e {e} is below -b {b}")),
            _ => Ok(()),
        }
    }

    fn primitive(self, op: Primitive) -> Result<Command, String> {
        self.check_sizes()?;
        let min = self.min.unwrap_or(8);
        Ok(Command::Primitive(PrimArgs {
            op,
            min,
            max: self.max.unwrap_or(min.max(8)),
            factor: self.factor as usize,
            iters: self.iters.unwrap_or(100),
            warmup: self.warmup.unwrap_or(10),
            json: self.json,
            trace: self.trace,
            transport: PortTransport::Local,
        }))
    }
}

impl CollOpts {
    fn collective(self, op: Op) -> Result<CollArgs, String> {
        self.sweep.check_sizes()?;
        let algo = match self.algo {
            Some(AlgoChoice::Forced(a)) if !a.serves(op.collective()) => {
                return Err(format!(
                    "-a {}: not an algorithm of {} (sendrecv, gather, scatter and alltoallv \
                     run on the point-to-point engine)",
                    algo_name(Some(a)),
                    op.name()
                ));
            }
            Some(AlgoChoice::Forced(a)) => Some(a),
            Some(AlgoChoice::Auto) | None => None,
        };
        if let Some(p) = &self.plot {
            PlotFormat::of(p)?;
        }
        Ok(CollArgs {
            op,
            min: self.sweep.min,
            max: self.sweep.max,
            factor: self.sweep.factor as usize,
            iters: self.sweep.iters,
            warmup: self.sweep.warmup.unwrap_or(5),
            check: self.check.is_some_and(|c| c != 0),
            algo,
            dtype: self.dtype.data_type(),
            redop: self.redop,
            root: self.root,
            inplace: !self.outofplace,
            graph_launches: self.graph_launches,
            registered: self.registered,
            ranks: self.ranks.map(|n| n as usize),
            baseline: match self.baseline {
                Some(BaselineArg::Nccl) => Some(Baseline::Nccl),
                Some(BaselineArg::CopyKernel) => Some(Baseline::CopyKernel),
                Some(BaselineArg::None) | None => None,
            },
            json: self.sweep.json,
            plot: self.plot,
            trace: self.sweep.trace,
            plan: self.plan,
        })
    }
}

/// The image format of `--plot`, from the file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlotFormat {
    /// `.svg`.
    Svg,
    /// `.png`.
    Png,
}

impl PlotFormat {
    /// The format `path` names, or why none.
    pub fn of(path: &Path) -> Result<Self, String> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext.to_ascii_lowercase().as_str() {
            "svg" => Ok(Self::Svg),
            "png" => Ok(Self::Png),
            _ => Err(format!(
                "--plot {}: the file name ends in .svg or .png",
                path.display()
            )),
        }
    }
}

/// A short name of an algorithm (`auto` for none forced): [`Algorithm::name`].
pub fn algo_name(a: Option<Algorithm>) -> &'static str {
    a.map_or("auto", Algorithm::name)
}

/// `-a NAME`: `auto`, or a name [`Algorithm::parse`] knows.
fn parse_algo(s: &str) -> Result<AlgoChoice, String> {
    if s == "auto" {
        return Ok(AlgoChoice::Auto);
    }
    Algorithm::parse(s).map(AlgoChoice::Forced).ok_or_else(|| {
        "not an algorithm (ll, ll128, ll2, staged, put, direct, ce, p2p, auto)".into()
    })
}

/// Parses `16`, `8K`, `1M`, `1G` (binary multiples; a trailing `B` is allowed); at least 1.
pub fn parse_size(s: &str) -> Result<usize, String> {
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
    match n.checked_mul(1 << shift) {
        Some(0) => Err("sizes start at 1 byte".into()),
        Some(b) => Ok(b),
        None => Err(format!("size {s:?} is too large")),
    }
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

/// The name of a reduction.
pub fn redop_name(o: Redop) -> &'static str {
    o.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line(s: &str) -> Result<Command, clap::Error> {
        parse(std::iter::once("mscclpp-bench").chain(s.split_whitespace()))
    }

    fn coll(s: &str) -> CollArgs {
        match parse_line(s) {
            Ok(Command::Collective(c)) => c,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn trace_takes_a_directory_for_collectives_and_primitives() {
        let dir = |s: &str| parse_line(s).unwrap().trace().cloned();
        assert_eq!(
            dir("allreduce --trace /tmp/t"),
            Some(PathBuf::from("/tmp/t"))
        );
        assert_eq!(dir("port-put -b 64K --trace d"), Some(PathBuf::from("d")));
        assert_eq!(dir("allgather -c"), None);
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1MB"), Ok(1 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
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
            (DataType::BF16, Redop::Max, false)
        );
        assert_eq!((c.graph_launches, c.ranks), (Some(0), Some(4)));
        assert!(!c.registered);
        assert!(coll("allreduce --registered -G 0").registered);
        assert_eq!(c.baseline, Some(Baseline::Nccl));
        assert!(c.json.is_some() && c.plot.is_some());
        let d = coll("allgather");
        assert_eq!(
            (d.dtype, d.redop, d.inplace, d.check, d.warmup, d.factor),
            (DataType::F16, Redop::Sum, true, false, 5, 2)
        );
        assert_eq!(
            (d.min, d.max, d.iters, d.algo, d.baseline),
            (None, None, None, None, None)
        );
        assert!(!coll("sendrecv -c 0").check);
        assert!(coll("sendrecv -c 1 -n 3").check);
        assert!(coll("broadcast --check=1").check);
        assert!(coll("broadcast -c -r 1").check);
        assert!(!coll("broadcast --check 0").check);
        // The last of --inplace / --outofplace wins; aliases name the same op.
        assert!(coll("allgather --outofplace --inplace").inplace);
        assert!(!coll("allgather --inplace --outofplace").inplace);
        assert_eq!(coll("all_reduce").op, Op::AllReduce);
        assert_eq!(coll("reduce-scatter").op, Op::ReduceScatter);
        assert_eq!(coll("allreduce -d float -o min").dtype, DataType::F32);
        assert_eq!(coll("allreduce -a auto --baseline none").algo, None);
        assert_eq!(coll("allreduce -a ll2").algo, Some(Algorithm::LlTwoShot));
        assert!(coll("allreduce --plot x.PNG").plot.is_some());
        // The ops of the whole NCCL surface, every type and reduction.
        assert_eq!(coll("reduce -r 1 -o avg").op, Op::Reduce);
        assert_eq!(coll("gather").op, Op::Gather);
        assert_eq!(coll("scatter").op, Op::Scatter);
        assert_eq!(coll("all_to_allv").op, Op::AllToAllv);
        assert_eq!(coll("reduce -a direct").algo, Some(Algorithm::Direct));
        for d in [
            "f32", "f16", "bf16", "i32", "u32", "i8", "u8", "i64", "u64", "f64", "e4m3", "e5m2",
        ] {
            assert_eq!(dtype_name(coll(&format!("allreduce -d {d}")).dtype), d);
        }
        for o in Redop::ALL {
            assert_eq!(coll(&format!("reduce -o {}", o.name())).redop, o);
        }
        assert_eq!(coll("allreduce -o pre-mul-sum").redop, Redop::PreMulSum);
    }

    #[test]
    fn bad_arguments_are_refused_with_a_reason() {
        for (line, needle) in [
            ("allreduc", "unrecognized subcommand 'allreduc'"),
            ("allreduce -x", "unexpected argument '-x'"),
            (
                "allreduce -b",
                "a value is required for '--minbytes <SIZE>'",
            ),
            ("allreduce -b 0", "sizes start at 1 byte"),
            (
                "allreduce -d f128",
                "invalid value 'f128' for '--datatype <T>'",
            ),
            ("allreduce -o xor", "invalid value 'xor' for '--op <OP>'"),
            ("allreduce -a fast", "not an algorithm (ll, ll128"),
            ("broadcast -a put", "not an algorithm of broadcast"),
            ("reducescatter -a ce", "not an algorithm of reducescatter"),
            ("sendrecv -a staged", "run on the point-to-point engine"),
            ("gather -a ll", "not an algorithm of gather"),
            ("reduce -a ce", "not an algorithm of reduce"),
            ("allreduce -a p2p", "not an algorithm of allreduce"),
            ("allreduce -b 1M -e 1K", "-e 1024 is below -b 1048576"),
            ("allreduce -f 1", "invalid value '1' for '--stepfactor <N>'"),
            ("allreduce -n 0", "invalid value '0' for '--iters <N>'"),
            ("allreduce -g 0", "invalid value '0' for '--ranks <N>'"),
            (
                "allreduce --baseline mpi",
                "invalid value 'mpi' for '--baseline <LIB>'",
            ),
            ("allreduce --plot p.pdf", "ends in .svg or .png"),
            ("allreduce -c 2x", "invalid value '2x' for '--check"),
            ("signal -c", "unexpected argument '-c'"),
            ("packet -e 1K -b 4K", "below"),
        ] {
            match parse_line(line) {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(needle), "{line}: {msg}");
                    assert_eq!(e.exit_code(), 2, "{line}");
                }
                Ok(c) => panic!("{line}: accepted as {c:?}"),
            }
        }
        // No op: the help, on standard error, with exit status 2.
        let e = parse_line("").expect_err("no op");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("allreduce"), "{e}");
        assert_eq!(parse_line("--help").expect_err("help").exit_code(), 0);
        assert_eq!(parse_line("allreduce -h").expect_err("help").exit_code(), 0);
    }

    #[test]
    fn primitives_keep_their_defaults() {
        match parse_line("packet -e 4K") {
            Ok(Command::Primitive(p)) => {
                assert_eq!(p.op, Primitive::Packet);
                assert_eq!((p.min, p.max, p.iters, p.warmup), (8, 4096, 100, 10));
            }
            other => panic!("{other:?}"),
        }
        match parse_line("port-put -b 64K -n 3 -w 2 -f 4 --json p.json -t ofi") {
            Ok(Command::Primitive(p)) => {
                assert_eq!(p.op, Primitive::PortPut);
                assert_eq!(p.transport, PortTransport::Ofi);
                assert_eq!(
                    (p.min, p.max, p.iters, p.warmup, p.factor),
                    (65536, 65536, 3, 2, 4)
                );
                assert!(p.json.is_some());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_forcible_algorithm_serves_all_reduce() {
        // The point-to-point engine serves no collective: nothing can be forced onto it.
        for a in Algorithm::ALL.into_iter().filter(|&a| a != Algorithm::P2p) {
            assert!(a.serves(Op::AllReduce.collective()), "{a:?}");
            assert!(!a.serves(Op::SendRecv.collective()), "{a:?}");
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
        assert_eq!(Op::Reduce.busbw_factor(8), 1.0);
        assert_eq!(Op::Gather.busbw_factor(4), 0.75);
        assert_eq!(Op::Scatter.busbw_factor(4), 0.75);
        assert_eq!(Op::AllToAllv.busbw_factor(8), 0.875);
    }
}
