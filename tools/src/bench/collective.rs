//! One rank of a collective sweep: for every size, time our collective (and the baseline's,
//! on the same buffers), check the data with `-c`, and gather the numbers on rank 0, which
//! prints the row at once.
//!
//! Timing (both libraries alike): on a GPU, before the first row only, about 200 ms of the
//! first size's operation, untimed, so that the GPUs leave their idle clocks. Then, per row,
//! `-w` eager iterations first (untimed; they also estimate the
//! time per operation when `-n` is automatic), then, with CUDA graphs, the `-n` iterations are
//! captured into one graph that is replayed once untimed and `-G` times between two events;
//! without graphs the `-n` iterations are launched between the events. Ranks meet at a
//! bootstrap barrier just before the first event. The time of a rank is the events' interval
//! divided by the operations in it; a row shows the mean over ranks (as nccl-tests does).
//!
//! Checking (`-c`), after the timing: output buffers are filled with a sentinel, inputs with
//! [`Pattern`]s, ranks meet at a barrier, the operation runs once (through a one-operation
//! graph when graphs are on), and every output element is compared with the host reference;
//! `#wrong` is the sum over ranks.

use std::sync::Arc;

use mscclpp::collectives::{Call, CollectiveConfig, Collectives};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, DeviceBuffer, Event, Stream};
use mscclpp::shared::DevicePtr;

use super::BoxError;
use super::args::{Baseline, CollArgs, Op, Redop, algo_name, dtype_name, redop_name};
use super::data::{Pattern, SENTINEL};
use super::nccl;
use super::report::{self, BaseRow, Row, RunInfo};

/// Automatic `-n`: iterations for about this long per timed run, within the bounds below.
const AUTO_TARGET_US: f64 = 5_000.0;
const AUTO_MIN_ITERS: u32 = 20;
const AUTO_MAX_ITERS: u32 = 1000;
/// Microseconds since the Unix epoch (host wall clock: comparable across the ranks of a node).
fn wall_us() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_micros() as f64)
}

/// Untimed work before the first timed row of a GPU run (see `Rank::warm_gpus`).
const WARM_GPUS: std::time::Duration = std::time::Duration::from_millis(200);
/// Calls per round of that work.
const WARM_ROUND: u32 = 32;
/// Host staging for filling and checking, bytes.
const CHUNK: usize = 16 << 20;

/// Everything every rank agrees on before the sweep.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The command line.
    pub args: CollArgs,
    /// The backend.
    pub backend: BackendKind,
    /// Requested sizes, bytes.
    pub sizes: Vec<usize>,
    /// Graph replays per timing (0: eager launches).
    pub graph_launches: u32,
    /// How the ranks were started (for the header).
    pub launch: String,
    /// Whether ranks share GPUs (the header says the times are not link figures).
    pub shared_gpus: bool,
}

/// The buffers an operation uses at one size (nccl-tests' conventions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    /// Bytes of the row.
    size: usize,
    /// Elements of the row.
    count: usize,
    /// Elements per part (the API's `count`).
    part: usize,
    /// Parts of the input.
    in_parts: usize,
    /// Parts of the output.
    out_parts: usize,
}

impl Shape {
    fn new(op: Op, bytes: usize, n: usize, es: usize) -> Option<Self> {
        let c = bytes / es;
        let p = c / n;
        let (part, in_parts, out_parts) = match op {
            Op::AllReduce | Op::Broadcast | Op::Reduce | Op::SendRecv => (c, 1, 1),
            Op::AllGather | Op::Gather => (p, 1, n),
            Op::ReduceScatter | Op::Scatter => (p, n, 1),
            Op::AllToAll | Op::AllToAllv => (p, n, n),
        };
        let count = part * in_parts.max(out_parts);
        (part > 0).then_some(Self {
            size: count * es,
            count,
            part,
            in_parts,
            out_parts,
        })
    }
}

/// Elements rank `from` sends rank `to` in the all-to-all-v of parts of `part` elements: none,
/// a third, two thirds or all of the part, by `(from + 2 to + 1) mod 4` (uneven in every row
/// and column, zero for some pairs).
pub fn alltoallv_count(part: usize, from: usize, to: usize) -> usize {
    part * ((from + 2 * to + 1) % 4) / 3
}

/// Where a buffer of the operation starts: in the receive buffer or the send buffer, at a
/// byte offset.
#[derive(Clone, Copy, Debug)]
struct Place {
    recv: bool,
    off: usize,
}

struct Rank<'a> {
    plan: &'a Plan,
    comm: Arc<Communicator>,
    stream: Stream,
    e0: Event,
    e1: Event,
    send: DeviceBuffer,
    recv: DeviceBuffer,
    inplace: bool,
    /// Whether [`Rank::warm_gpus`] ran.
    warmed: std::cell::Cell<bool>,
}

impl Rank<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn n(&self) -> usize {
        self.comm.size()
    }

    fn buf(&self, p: Place) -> &DeviceBuffer {
        if p.recv { &self.recv } else { &self.send }
    }

    fn ptr(&self, p: Place) -> DevicePtr<u8> {
        self.buf(p).ptr().byte_add_cast(p.off as u64)
    }

    fn places(&self, sh: &Shape) -> (Place, Place) {
        let es = self.plan.args.dtype.size();
        let mine = self.rank() * sh.part * es;
        let op = self.plan.args.op;
        if !self.inplace {
            return (
                Place {
                    recv: false,
                    off: 0,
                },
                Place { recv: true, off: 0 },
            );
        }
        match op {
            Op::AllGather | Op::Gather => (
                Place {
                    recv: true,
                    off: mine,
                },
                Place { recv: true, off: 0 },
            ),
            Op::ReduceScatter | Op::Scatter => (
                Place { recv: true, off: 0 },
                Place {
                    recv: true,
                    off: mine,
                },
            ),
            _ => (Place { recv: true, off: 0 }, Place { recv: true, off: 0 }),
        }
    }

    fn failed(&self) -> Result<(), BoxError> {
        match self.comm.status().error() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Times `run` (one operation queued on `self.stream`); returns µs per operation on this
    /// rank, the iterations per timed run, and the host's wall-clock time (µs since the Unix
    /// epoch) when it launched the timed work.
    fn measure(&self, run: &dyn Fn() -> Result<(), BoxError>) -> Result<(f64, u32, f64), BoxError> {
        if !self.warmed.replace(true) && self.plan.backend == BackendKind::Cuda {
            self.warm_gpus(run)?;
        }
        let a = &self.plan.args;
        let bs = self.comm.bootstrap();
        let warm = if a.iters.is_none() {
            a.warmup.max(1)
        } else {
            a.warmup
        };
        bs.barrier()?;
        self.stream.record(&self.e0)?;
        for _ in 0..warm {
            run()?;
        }
        self.stream.record(&self.e1)?;
        self.stream.synchronize()?;
        self.failed()?;
        let est_us = self.e1.elapsed_ms(&self.e0)? as f64 * 1e3 / warm.max(1) as f64;
        let iters = match a.iters {
            Some(n) => n,
            None => {
                // Every rank must run the same number: take the slowest estimate.
                let all = bs.all_gather(&est_us.to_le_bytes())?;
                let slowest = all
                    .iter()
                    .filter_map(|b| Some(f64::from_le_bytes(b.as_slice().try_into().ok()?)))
                    .fold(0.0, f64::max);
                let n = (AUTO_TARGET_US / slowest.max(0.1)).ceil();
                n.clamp(AUTO_MIN_ITERS as f64, AUTO_MAX_ITERS as f64) as u32
            }
        };
        let launches = self.plan.graph_launches;
        let launched;
        let per_run = if launches > 0 {
            let graph = self.stream.capture(|| -> Result<(), BoxError> {
                for _ in 0..iters {
                    run()?;
                }
                Ok(())
            })?;
            // SAFETY: the graph uses our buffers and the collectives' scratch, all alive
            // until the stream is synchronised below.
            unsafe { graph.launch(&self.stream) }?;
            self.stream.synchronize()?;
            bs.barrier()?;
            launched = wall_us();
            self.stream.record(&self.e0)?;
            for _ in 0..launches {
                // SAFETY: as above.
                unsafe { graph.launch(&self.stream) }?;
            }
            self.stream.record(&self.e1)?;
            self.stream.synchronize()?;
            iters as f64 * launches as f64
        } else {
            bs.barrier()?;
            launched = wall_us();
            self.stream.record(&self.e0)?;
            for _ in 0..iters {
                run()?;
            }
            self.stream.record(&self.e1)?;
            self.stream.synchronize()?;
            iters as f64
        };
        self.failed()?;
        let us = self.e1.elapsed_ms(&self.e0)? as f64 * 1e3 / per_run;
        Ok((us, iters, launched))
    }

    /// Runs `run` untimed, in rounds of [`WARM_ROUND`] calls, until some rank has spent
    /// [`WARM_GPUS`] in them (the ranks agree after every round, so they run the same calls):
    /// before the first timed row, so that the GPUs have left their idle clocks. Without it the
    /// first row of every sweep on 2×H200 was 1.2–2.8× slow, ours and NCCL's alike.
    fn warm_gpus(&self, run: &dyn Fn() -> Result<(), BoxError>) -> Result<(), BoxError> {
        let start = std::time::Instant::now();
        loop {
            for _ in 0..WARM_ROUND {
                run()?;
            }
            self.stream.synchronize()?;
            self.failed()?;
            let done = [(start.elapsed() >= WARM_GPUS) as u8];
            let all = self.comm.bootstrap().all_gather(&done)?;
            if all.iter().any(|d| d.first() == Some(&1)) {
                return Ok(());
            }
        }
    }

    fn write_bytes(
        &self,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
        byte: u8,
    ) -> Result<(), BoxError> {
        let tmp = vec![byte; len.min(CHUNK)];
        let mut done = 0;
        while done < len {
            let k = tmp.len().min(len - done);
            buf.copy_from_host(off + done, &tmp[..k])?;
            done += k;
        }
        Ok(())
    }

    fn write_part(&self, at: Place, pat: &Pattern, elems: usize) -> Result<(), BoxError> {
        let es = self.plan.args.dtype.size();
        let per = CHUNK / es;
        let mut tmp = vec![0u8; elems.min(per) * es];
        let mut i = 0;
        while i < elems {
            let k = per.min(elems - i);
            pat.fill(i, &mut tmp[..k * es]);
            self.buf(at)
                .copy_from_host(at.off + i * es, &tmp[..k * es])?;
            i += k;
        }
        Ok(())
    }

    fn count_wrong(&self, at: Place, pat: &Pattern, elems: usize) -> Result<u64, BoxError> {
        let es = self.plan.args.dtype.size();
        let per = CHUNK / es;
        let mut tmp = vec![0u8; elems.min(per) * es];
        let (mut i, mut wrong) = (0, 0);
        while i < elems {
            let k = per.min(elems - i);
            self.buf(at)
                .copy_to_host(at.off + i * es, &mut tmp[..k * es])?;
            wrong += pat.count_wrong(i, &tmp[..k * es]);
            i += k;
        }
        Ok(wrong)
    }

    /// Fills, runs `run` once (as it is timed), and counts wrong output elements.
    fn check(&self, sh: &Shape, run: &dyn Fn() -> Result<(), BoxError>) -> Result<u64, BoxError> {
        let a = &self.plan.args;
        let (dt, n, rank) = (a.dtype, self.n(), self.rank());
        let es = dt.size();
        let (input, output) = self.places(sh);
        let span = sh.part * sh.in_parts.max(sh.out_parts) * es;
        self.write_bytes(&self.recv, 0, span, SENTINEL)?;
        let op = if a.op.reduces() { a.redop } else { Redop::Sum };
        for p in 0..sh.in_parts {
            let at = Place {
                off: input.off + p * sh.part * es,
                ..input
            };
            self.write_part(at, &Pattern::input(dt, op, n, rank, p), sh.part)?;
        }
        self.comm.bootstrap().barrier()?;
        if self.plan.graph_launches > 0 {
            let graph = self.stream.capture(run)?;
            // SAFETY: the buffers outlive the synchronisation below.
            unsafe { graph.launch(&self.stream) }?;
        } else {
            run()?;
        }
        self.stream.synchronize()?;
        self.failed()?;
        let mut wrong = 0;
        // Rooted ops: only the root's output is defined (NCCL's too).
        let defined = !matches!(a.op, Op::Reduce | Op::Gather) || rank == a.root;
        for q in (0..sh.out_parts).filter(|_| defined) {
            let (input, reduced) = (
                |r, p| Pattern::input(dt, Redop::Sum, n, r, p),
                |p| Pattern::reduced(dt, a.redop, n, p),
            );
            let (want, elems) = match a.op {
                Op::AllReduce | Op::Reduce => (reduced(0), sh.part),
                Op::AllGather | Op::Gather => (input(q, 0), sh.part),
                Op::ReduceScatter => (reduced(rank), sh.part),
                Op::Broadcast => (input(a.root, 0), sh.part),
                Op::Scatter => (input(a.root, rank), sh.part),
                Op::AllToAll => (input(q, rank), sh.part),
                Op::AllToAllv => (input(q, rank), alltoallv_count(sh.part, q, rank)),
                Op::SendRecv => (input((rank + n - 1) % n, 0), sh.part),
            };
            let at = Place {
                off: output.off + q * sh.part * es,
                ..output
            };
            wrong += self.count_wrong(at, &want, elems)?;
        }
        self.comm.bootstrap().barrier()?;
        Ok(wrong)
    }
}

/// One library's numbers for one size on this rank.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// µs per operation.
    time_us: f64,
    /// Wrong output elements (with `-c`).
    wrong: Option<u64>,
    /// Host wall-clock time of the timed launch, µs since the Unix epoch.
    launched_us: f64,
}

impl Sample {
    /// A library that did not run.
    const NONE: Sample = Sample {
        time_us: f64::NAN,
        wrong: None,
        launched_us: f64::NAN,
    };
}

/// The sizes that run: one [`Shape`] per distinct size, without the sizes a forced LL
/// algorithm cannot serve; and a note (`# …`) for each size left out.
fn shapes_to_run(
    a: &CollArgs,
    sizes: &[usize],
    n: usize,
    cfg: &CollectiveConfig,
) -> (Vec<Shape>, Vec<String>) {
    let es = a.dtype.size();
    let mut shapes: Vec<Shape> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for &bytes in sizes {
        match Shape::new(a.op, bytes, n, es) {
            Some(s) if shapes.last() != Some(&s) => shapes.push(s),
            Some(_) => {}
            None => notes.push(format!(
                "# {bytes} B skipped: less than one {} element per rank and part",
                dtype_name(a.dtype)
            )),
        }
    }
    // The forced algorithm's own limit (`Algorithm::max_bytes`), per part (the whole message
    // for all-reduce, broadcast and send/recv).
    let limit = a
        .algo
        .and_then(|x| x.max_bytes(cfg).map(|most| (x.name(), most)));
    if let Some((name, max)) = limit
        && shapes.iter().any(|s| s.part * es > max)
    {
        notes.push(format!(
            "# -a {name}: sizes with parts above {max} B (its limit) skipped"
        ));
        shapes.retain(|s| s.part * es <= max);
    }
    (shapes, notes)
}

/// What every row of the run shares (rank 0's view).
fn run_info(plan: &Plan, inplace: bool, n: usize, device: String, baseline: bool) -> RunInfo {
    let a = &plan.args;
    RunInfo {
        op: a.op.name(),
        dtype: dtype_name(a.dtype),
        redop: redop_name(a.redop),
        inplace,
        nranks: n,
        backend: match plan.backend {
            BackendKind::Cuda => "cuda",
            BackendKind::Cpu => "cpu",
        },
        device,
        graph_launches: plan.graph_launches,
        baseline: baseline.then(|| match nccl::Nccl::load() {
            Ok(l) => format!("NCCL {}", l.version),
            Err(_) => "NCCL".into(),
        }),
    }
}

impl<'a> Rank<'a> {
    /// This rank's stream, events and buffers, sized for the largest of `shapes`.
    fn new(plan: &'a Plan, comm: Arc<Communicator>, shapes: &[Shape]) -> Result<Self, BoxError> {
        let es = plan.args.dtype.size();
        let inplace = plan.args.inplace
            && plan.args.op.has_in_place()
            && !alone_in_place_is_idle(plan, &comm);
        let max_bytes = shapes
            .iter()
            .map(|s| s.part * s.in_parts.max(s.out_parts) * es)
            .max()
            .unwrap_or(0);
        let g = comm.gpu().clone();
        Ok(Self {
            plan,
            comm,
            stream: g.stream()?,
            e0: g.event()?,
            e1: g.event()?,
            send: g.alloc(if inplace { 0 } else { max_bytes })?,
            recv: g.alloc(max_bytes)?,
            inplace,
            warmed: std::cell::Cell::new(false),
        })
    }

    /// Times `run`, then checks it with `-c`; also returns the iterations per timed run.
    fn sample(
        &self,
        sh: &Shape,
        run: &dyn Fn() -> Result<(), BoxError>,
    ) -> Result<(Sample, u32), BoxError> {
        let (time_us, iters, launched_us) = self.measure(run)?;
        let wrong = if self.plan.args.check {
            Some(self.check(sh, run)?)
        } else {
            None
        };
        let s = Sample {
            time_us,
            wrong,
            launched_us,
        };
        Ok((s, iters))
    }

    /// Our collective and, with a baseline, the baseline's, at one size.
    fn sample_size(
        &self,
        sh: &Shape,
        coll: &Collectives,
        base: Option<&nccl::Comm>,
    ) -> Result<(Sample, Sample, u32), BoxError> {
        let a = &self.plan.args;
        let (rank, n) = (self.rank(), self.n());
        let (input, output) = self.places(sh);
        let (inp, out) = (self.ptr(input), self.ptr(output));
        let (stream, part, dt) = (&self.stream, sh.part, a.dtype);
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let op = a.redop.reduction(dt);
        let (input, output, count, dtype, root) = (inp, out, part, dt, a.root);
        // All-to-all-v: parts `part` apart, the counts of `alltoallv_count`.
        let displs: Vec<usize> = (0..n).map(|q| q * part).collect();
        let call = match a.op {
            Op::AllReduce => Call::AllReduce {
                input,
                output,
                count,
                dtype,
                op,
            },
            Op::AllGather => Call::AllGather {
                input,
                output,
                count,
                dtype,
            },
            Op::ReduceScatter => Call::ReduceScatter {
                input,
                output,
                count,
                dtype,
                op,
            },
            Op::Broadcast => Call::Broadcast {
                input,
                output,
                count,
                dtype,
                root,
            },
            Op::AllToAll => Call::AllToAll {
                input,
                output,
                count,
                dtype,
            },
            Op::Reduce => Call::Reduce {
                input,
                output,
                count,
                dtype,
                op,
                root,
            },
            Op::Gather => Call::Gather {
                input,
                output,
                count,
                dtype,
                root,
            },
            Op::Scatter => Call::Scatter {
                input,
                output,
                count,
                dtype,
                root,
            },
            Op::AllToAllv => Call::AllToAllv {
                input,
                output,
                send_counts: (0..n).map(|q| alltoallv_count(part, rank, q)).collect(),
                send_displs: displs.clone(),
                recv_counts: (0..n).map(|q| alltoallv_count(part, q, rank)).collect(),
                recv_displs: displs,
                dtype,
            },
            Op::SendRecv => Call::SendRecv {
                input,
                next,
                output,
                prev,
                count,
                dtype,
            },
        };
        let ours = || -> Result<(), BoxError> {
            // SAFETY: `inp` and `out` address the parts `Shape` sized the buffers for, alive
            // for the whole sweep; every rank makes the same calls in the same order.
            Ok(unsafe { coll.queue(&call, stream, a.algo) }?)
        };
        let (mine, iters) = self.sample(sh, &ours)?;
        let Some(b) = base else {
            return Ok((mine, Sample::NONE, iters));
        };
        // SAFETY: as for `ours`.
        let theirs = || unsafe { b.queue(&call, stream) };
        Ok((mine, self.sample(sh, &theirs)?.0, iters))
    }
}

/// Every rank's two samples of one size, as rank 0 gathers them: per rank, [time, wrong,
/// baseline time, baseline wrong, launch time, baseline launch time] as little-endian f64
/// (-1: not checked; NaN: not run).
fn gather_samples(
    comm: &Communicator,
    ours: Sample,
    theirs: Sample,
) -> Result<Vec<Vec<u8>>, BoxError> {
    let wrong = |s: Sample| s.wrong.map_or(-1.0, |w| w as f64);
    let mine: Vec<u8> = [
        ours.time_us,
        wrong(ours),
        theirs.time_us,
        wrong(theirs),
        ours.launched_us,
        theirs.launched_us,
    ]
    .iter()
    .flat_map(|x| x.to_le_bytes())
    .collect();
    Ok(comm.bootstrap().all_gather(&mine)?)
}

/// Rank 0's row from every rank's samples ([`gather_samples`]).
fn row_of(
    all: &[Vec<u8>],
    sh: &Shape,
    op: Op,
    algo: String,
    iters: u32,
    checked: (bool, bool),
    baseline: bool,
) -> Row {
    let n = all.len();
    let field = |k: usize| -> Vec<f64> {
        all.iter()
            .filter_map(|b| {
                Some(f64::from_le_bytes(
                    b.get(8 * k..8 * k + 8)?.try_into().ok()?,
                ))
            })
            .collect()
    };
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let total = |v: Vec<f64>| {
        v.iter()
            .all(|&w| w >= 0.0)
            .then(|| v.iter().sum::<f64>() as u64)
    };
    let factor = op.busbw_factor(n);
    let bw = |us: f64| sh.size as f64 / (us * 1e-6) / 1e9;
    let spread = |time: usize, launch: usize| {
        let ranks: Vec<(f64, f64)> = field(time).into_iter().zip(field(launch)).collect();
        report::Spread::of(&ranks)
    };
    let time_us = mean(field(0));
    Row {
        size: sh.size,
        count: sh.count,
        algo,
        iters,
        spread: spread(0, 4),
        time_us,
        algbw: bw(time_us),
        busbw: bw(time_us) * factor,
        wrong: total(field(1)).filter(|_| checked.0),
        base: baseline.then(|| {
            let bt = mean(field(2));
            BaseRow {
                time_us: bt,
                spread: spread(2, 5),
                algbw: bw(bt),
                busbw: bw(bt) * factor,
                wrong: total(field(3)).filter(|_| checked.1),
            }
        }),
    }
}

/// Prints `row`, and a comment for each library whose ranks took very different times.
fn print_row(row: &Row, dtype: &str) {
    println!("{}", report::line(row, dtype));
    let spreads = [
        ("ours", Some(row.spread)),
        ("baseline", row.base.as_ref().map(|b| b.spread)),
    ];
    for (who, s) in spreads {
        if let Some(s) = s.filter(|s| s.uneven()) {
            println!(
                "# {} B, {who}: ranks took {:.2} to {:.2} us; their hosts launched the timed \
                 work {:.0} us apart (a late launch makes the others wait inside their timing)",
                row.size, s.fastest_us, s.slowest_us, s.launch_skew_us
            );
        }
    }
}

/// Runs the sweep on this rank; rank 0 prints the table and returns the rows.
pub fn run_rank(comm: Communicator, plan: &Plan) -> Result<Option<(RunInfo, Vec<Row>)>, BoxError> {
    let a = &plan.args;
    let comm = Arc::new(comm);
    let (rank, n) = (comm.rank(), comm.size());
    let held = comm.gpu().allocated_bytes();
    let t0 = std::time::Instant::now();
    let coll = Collectives::new(comm.clone())?;
    let setup = (
        t0.elapsed(),
        comm.gpu().allocated_bytes().saturating_sub(held),
    );
    let base = match a.baseline {
        Some(Baseline::Nccl) => Some(nccl::Comm::new(&comm)?),
        None => None,
    };
    let (shapes, notes) = shapes_to_run(a, &plan.sizes, n, &coll.config());
    let r = Rank::new(plan, comm.clone(), &shapes)?;
    let mut registrations = Vec::new();
    if a.registered {
        for buf in [&r.send, &r.recv] {
            if !buf.is_empty() {
                // Windows (every rank's buffers have the same size): the copy engines take
                // them too. SAFETY: the buffers live until after the deregistration below.
                registrations.push(unsafe { coll.register_window(buf.ptr(), buf.len()) }?);
            }
        }
        comm.bootstrap().barrier()?;
    } else if plan.graph_launches > 0 {
        // Captured calls on unregistered buffers take only algorithms that neither allocate
        // nor trade buffers inside the capture: allocate and trade the scratch regions first
        // (collective: every rank runs this).
        coll.prepare()?;
    }
    let info = run_info(plan, r.inplace, n, comm.gpu().name(), base.is_some());
    if rank == 0 {
        print_header(plan, &info);
        if alone_in_place_is_idle(plan, &comm) {
            println!("{IDLE_IN_PLACE}");
        }
        print_setup(setup, &coll, n);
        for note in &notes {
            println!("{note}");
        }
        println!("{}", report::header(base.is_some()));
    }
    let mut rows = Vec::new();
    for sh in &shapes {
        let (ours, theirs, iters) = r.sample_size(sh, &coll, base.as_ref())?;
        let all = gather_samples(&comm, ours, theirs)?;
        if rank != 0 {
            continue;
        }
        let algo = match a.op {
            // One rank copies (a pre-multiplied sum, an average of floats included, stages).
            Op::AllGather | Op::Broadcast | Op::AllToAll if n == 1 => "copy".to_string(),
            Op::AllReduce | Op::Reduce | Op::ReduceScatter
                if n == 1
                    && a.redop != Redop::PreMulSum
                    && !(a.redop == Redop::Avg && a.dtype.is_float()) =>
            {
                "copy".to_string()
            }
            _ => algo_name(coll.last_algorithm()).to_string(),
        };
        let checked = (ours.wrong.is_some(), theirs.wrong.is_some());
        let row = row_of(&all, sh, a.op, algo, iters, checked, base.is_some());
        print_row(&row, info.dtype);
        rows.push(row);
    }
    comm.bootstrap().barrier()?;
    for reg in registrations.into_iter().rev() {
        coll.deregister_window(reg)?;
    }
    drop(base);
    Ok((rank == 0).then_some((info, rows)))
}

/// Whether the run has one rank, in place, and an operation that then does nothing: every
/// collective of one rank is its own input (ours and NCCL's queue no work), but a
/// pre-multiplied sum, which still multiplies. Such a run is timed out of place (a copy)
/// instead of timing empty calls ([`IDLE_IN_PLACE`]).
fn alone_in_place_is_idle(plan: &Plan, comm: &Communicator) -> bool {
    let a = &plan.args;
    comm.size() == 1 && a.inplace && !(a.op.reduces() && a.redop == Redop::PreMulSum)
}

/// The header's note for [`alone_in_place_is_idle`].
const IDLE_IN_PLACE: &str = "# one rank in place is no work (every collective is its own input: \
    neither library queues anything, nothing to time): timed out of place instead (a copy)";

/// The header's line on what setting the collectives up cost rank 0 (`setup`: time, device
/// memory), and what the regions allocated on first use will add (`memory_plan`).
fn print_setup(setup: (std::time::Duration, usize), coll: &Collectives, n: usize) {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let plan = mscclpp::collectives::memory_plan(&coll.config(), n);
    let later: Vec<String> = plan
        .on_first_use
        .iter()
        .map(|(what, who, b)| format!("{:.1} MiB {what} ({who})", mib(*b)))
        .collect();
    println!(
        "# collectives set up in {:.1} ms with {:.2} MiB of device memory; on first use: {}",
        setup.0.as_secs_f64() * 1e3,
        mib(setup.1),
        later.join(", ")
    );
}

fn print_header(plan: &Plan, info: &RunInfo) {
    let a = &plan.args;
    if plan.backend == BackendKind::Cpu {
        println!(
            "# CPU backend: the same kernels on OS threads; \
             times are not GPU times, only the data check means something"
        );
    }
    println!(
        "# mscclpp-bench {}: {}, {} backend, {}",
        info.op, plan.launch, info.backend, info.device
    );
    if plan.shared_gpus {
        println!("{}", super::placement::SHARED);
    }
    // The selection's rules are the library's (its selection table); each row says what ran.
    let algo = match a.algo {
        Some(x) => format!("{} (forced)", algo_name(Some(x))),
        None => "by size (the algo column)".to_string(),
    };
    let timing = if plan.graph_launches > 0 {
        format!(
            "CUDA graph of the iterations, replayed {}x",
            plan.graph_launches
        )
    } else {
        "eager launches".to_string()
    };
    let timing = if a.registered {
        format!("{timing}, buffers registered once")
    } else {
        timing
    };
    let iters = a
        .iters
        .map_or_else(|| "auto".to_string(), |i| i.to_string());
    println!(
        "# {}{}, {}, algorithm {algo}, {timing}, iterations {iters}, warmup {}, check {}",
        info.dtype,
        if a.op.reduces() {
            format!(" {}", info.redop)
        } else {
            String::new()
        },
        if info.inplace {
            "in place"
        } else {
            "out of place"
        },
        a.warmup,
        if a.check { "on" } else { "off" }
    );
    if a.op.rooted() {
        println!("# root {}", a.root);
    }
    if let Some(b) = &info.baseline {
        let path = nccl::Nccl::load()
            .map(|l| l.path.clone())
            .unwrap_or_default();
        let nvls = std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default();
        println!(
            "# baseline: {b} ({path}, NCCL_NVLS_ENABLE={nvls}), timed the same way on the same \
             buffers; speedup = baseline time / ours"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_nccl_tests() {
        let s = Shape::new(Op::AllReduce, 1000, 4, 2).unwrap();
        assert_eq!(
            (s.size, s.count, s.part, s.in_parts, s.out_parts),
            (1000, 500, 500, 1, 1)
        );
        // Per-rank parts, rounded down to whole elements.
        let s = Shape::new(Op::AllGather, 1000, 3, 4).unwrap();
        assert_eq!(
            (s.size, s.count, s.part, s.in_parts, s.out_parts),
            (996, 249, 83, 1, 3)
        );
        let s = Shape::new(Op::ReduceScatter, 64, 2, 4).unwrap();
        assert_eq!((s.size, s.part, s.in_parts, s.out_parts), (64, 8, 2, 1));
        let s = Shape::new(Op::AllToAll, 64, 4, 2).unwrap();
        assert_eq!((s.size, s.part, s.in_parts, s.out_parts), (64, 8, 4, 4));
        assert!(Shape::new(Op::AllGather, 8, 8, 2).is_none());
        let s = Shape::new(Op::Gather, 1000, 3, 4).unwrap();
        assert_eq!((s.size, s.part, s.in_parts, s.out_parts), (996, 83, 1, 3));
        let s = Shape::new(Op::Scatter, 64, 2, 4).unwrap();
        assert_eq!((s.size, s.part, s.in_parts, s.out_parts), (64, 8, 2, 1));
        let s = Shape::new(Op::Reduce, 64, 2, 4).unwrap();
        assert_eq!((s.size, s.part, s.in_parts, s.out_parts), (64, 16, 1, 1));
        let s = Shape::new(Op::AllToAllv, 64, 4, 2).unwrap();
        assert_eq!((s.size, s.part, s.in_parts, s.out_parts), (64, 8, 4, 4));
        assert!(Shape::new(Op::SendRecv, 1, 2, 2).is_none());
    }
}
