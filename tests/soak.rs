//! Soak test: 10 000 back-to-back collectives of random types and sizes on one pair of
//! communicators (2 ranks as threads), every result checked exactly against a host reference.
//! All-reduce with a random data type, operator, algorithm (or the automatic choice) and in or
//! out of place; all-gather, reduce-scatter, broadcast (random root), all-to-all, send/recv
//! (random direction) and send_recv, each with a random algorithm where it takes one. Mostly
//! small sizes (so that it is quick on the CPU backend), now and then up to 64 KiB a rank.
//! Both ranks draw the same sequence from one seed, so they make the same calls. The stream is
//! synchronized with a bound after every call, so a hang fails the test instead of stalling it.
//!
//! `cargo test --test soak -- --nocapture` prints the count, the time and which algorithms ran.
//! `MSCCLPP_SOAK_OPS` changes the count (e.g. for a longer run); with
//! `MSCCLPP_SOAK_KEEP_GOING` set, a wrong result is printed (`SOAK MISMATCH`) and the run goes
//! on, failing at the end, instead of failing at the first.

mod values;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::collectives::{Algorithm, CollectiveConfig, Collectives};
use mscclpp::host::Error;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::DeviceBuffer;
use mscclpp::shared::{DataType, DevicePtr, ReduceOp};
use mscclpp_test_support as harness;
use mscclpp_test_support::ranks_as_threads;
use values::{REDUCE_OPS, TYPES, decode, encode_into as encode};

/// Collectives per run (unless `MSCCLPP_SOAK_OPS` says otherwise).
const OPS: usize = 10_000;
/// The seed both ranks draw from (printed, with the failing call, on a mismatch).
const SEED: u64 = 0x50a6_2026_1130;
/// Largest count per rank (elements; 64 KiB of 4-byte elements).
const MAX_COUNT: usize = 16 << 10;
/// Largest byte offset of a buffer's start into its allocation (a multiple of 16: the direct
/// path needs 16-byte alignment).
const MAX_OFFSET: usize = 64;
/// Longest one collective may take before the test calls it a hang.
const HANG: Duration = Duration::from_secs(60);

/// xorshift64*: deterministic, the same sequence on both ranks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    /// Mostly small counts: 90 % up to 256 elements, 9 % up to 4096, 1 % up to [`MAX_COUNT`].
    fn count(&mut self) -> usize {
        match self.below(100) {
            0 => 1 + self.below(MAX_COUNT),
            1..=9 => 1 + self.below(4096),
            _ => 1 + self.below(256),
        }
    }
}

/// A small integer for element `i` of `rank`'s input of call `call` (a hash of the three, see
/// [`values::value`]): exact in every type, also summed over the ranks.
fn value(call: usize, rank: usize, i: usize) -> f64 {
    values::value(rank, call, i)
}

/// `rank`'s input of call `call`: `count` elements.
fn input(call: usize, dtype: DataType, rank: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        encode(dtype, value(call, rank, i), &mut out);
    }
    out
}

fn reduce(op: ReduceOp, dtype: DataType, vals: impl Iterator<Item = f64>) -> f64 {
    match op {
        // U32 values are shifted by 10 each: the sum of n of them is shifted by 10 n.
        ReduceOp::Sum if dtype == DataType::U32 => vals.map(|v| v + 10.0).sum::<f64>() - 10.0,
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
    }
}

/// One collective, as drawn.
#[derive(Clone, Copy, Debug)]
enum Call {
    AllReduce {
        op: ReduceOp,
        algo: Option<Algorithm>,
        in_place: bool,
    },
    AllGather(Option<Algorithm>),
    ReduceScatter(ReduceOp, Option<Algorithm>),
    Broadcast(usize, Option<Algorithm>),
    AllToAll(Option<Algorithm>),
    /// Rank `from` sends, the other receives.
    SendRecv {
        from: usize,
    },
    /// Both directions at once (`send_recv`).
    Exchange,
}

impl Call {
    fn draw(rng: &mut Rng, n: usize, bytes: usize, (ll_max, ll128_max): (usize, usize)) -> Self {
        let any = |rng: &mut Rng, algos: &[Algorithm]| {
            let i = rng.below(algos.len() + 1);
            algos.get(i).copied() // one past the end: the automatic choice
        };
        use Algorithm::*;
        match rng.below(8) {
            0..=2 => {
                let mut algos = vec![Staged, TwoShotPut, Direct];
                if bytes <= ll_max {
                    algos.extend([LlOneShot, LlTwoShot]);
                }
                if bytes <= ll128_max {
                    algos.push(Ll128);
                }
                Call::AllReduce {
                    op: rng.pick(&REDUCE_OPS),
                    algo: any(rng, &algos),
                    in_place: rng.below(2) == 0,
                }
            }
            3 => {
                let mut algos = vec![Staged, Direct, CopyEngine];
                if bytes <= ll128_max {
                    algos.push(Ll128);
                }
                Call::AllGather(any(rng, &algos))
            }
            4 => {
                let mut algos = vec![Staged, Direct];
                if bytes <= ll128_max {
                    algos.push(Ll128);
                }
                Call::ReduceScatter(rng.pick(&REDUCE_OPS), any(rng, &algos))
            }
            5 => Call::Broadcast(rng.below(n), any(rng, &[Staged, Direct, CopyEngine])),
            6 => Call::AllToAll(any(rng, &[Staged, Direct, CopyEngine])),
            _ => match rng.below(3) {
                0 => Call::Exchange,
                r => Call::SendRecv { from: r - 1 },
            },
        }
    }

    /// The algorithm forced, if any.
    fn algorithm(self) -> Option<Algorithm> {
        match self {
            Call::AllReduce { algo, .. }
            | Call::AllGather(algo)
            | Call::ReduceScatter(_, algo)
            | Call::Broadcast(_, algo)
            | Call::AllToAll(algo) => algo,
            Call::SendRecv { .. } | Call::Exchange => None,
        }
    }

    /// Whether it forces a path on the callers' own buffers (which may refuse them).
    fn forces_buffer_path(self) -> bool {
        matches!(
            self.algorithm(),
            Some(Algorithm::Direct | Algorithm::CopyEngine)
        )
    }

    fn name(self) -> &'static str {
        match self {
            Call::AllReduce { .. } => "all_reduce",
            Call::AllGather(_) => "all_gather",
            Call::ReduceScatter(..) => "reduce_scatter",
            Call::Broadcast(..) => "broadcast",
            Call::AllToAll(_) => "all_to_all",
            Call::SendRecv { .. } => "send/recv",
            Call::Exchange => "send_recv",
        }
    }
}

/// `buf`'s address `offset` bytes in.
fn at(buf: &DeviceBuffer, offset: usize) -> DevicePtr<u8> {
    buf.ptr().byte_add_cast(offset as u64)
}

/// What one rank did: calls made, how often each (collective, algorithm) ran, and the forced
/// paths refused (with the reason).
struct Tally {
    calls: usize,
    algorithms: BTreeMap<String, usize>,
    refused: BTreeMap<String, usize>,
    /// Calls whose result was wrong (only counted with `MSCCLPP_SOAK_KEEP_GOING`; else the
    /// first one fails the test at once).
    mismatches: usize,
}

fn soak(c: &Collectives, ops: usize) -> Tally {
    let comm = c.communicator();
    let (me, n) = (comm.rank(), comm.size());
    let g = comm.gpu();
    let stream = g.stream().unwrap();
    let cap = n * MAX_COUNT * 4 + MAX_OFFSET;
    let (inb, outb) = (g.alloc(cap).unwrap(), g.alloc(cap).unwrap());
    let cfg = c.config();
    let ll_limits = (cfg.ll_max_bytes, cfg.ll128_max_bytes);
    let mut rng = Rng(SEED);
    let mut tally = Tally {
        calls: 0,
        algorithms: BTreeMap::new(),
        refused: BTreeMap::new(),
        mismatches: 0,
    };
    let keep_going = std::env::var_os("MSCCLPP_SOAK_KEEP_GOING").is_some();
    for call_no in 0..ops {
        let dtype = rng.pick(&TYPES);
        let es = dtype.size();
        let mut count = rng.count();
        let call = Call::draw(&mut rng, n, count * es, ll_limits);
        // Mostly give a forced buffer path a length it can take (a multiple of 16 bytes).
        if call.forces_buffer_path() && rng.below(4) != 0 {
            count = (count * es).next_multiple_of(16) / es;
        }
        let (in_off, out_off) = (16 * rng.below(MAX_OFFSET / 16 + 1), 16 * rng.below(5));
        let what = format!(
            "call {call_no} (seed {SEED:#x}): {call:?} {dtype:?} count {count}, offsets \
             {in_off}/{out_off}, rank {me}"
        );
        // This rank's input of `parts` parts of `count` elements: element `idx` of rank r's
        // input is `v(r, idx)`.
        let mine = |parts: usize| input(call_no, dtype, me, count * parts);
        let v = |r: usize, idx: usize| value(call_no, r, idx);
        // Poison the output, so that an element the collective forgets is caught.
        outb.copy_from_host(out_off, &vec![harness::MARKER; n * count * es])
            .unwrap();
        let (queued, want, out_len): (_, Vec<f64>, usize) = match call {
            Call::AllReduce { op, algo, in_place } => {
                let data = mine(1);
                let (src, dst) = if in_place {
                    outb.copy_from_host(out_off, &data).unwrap();
                    (at(&outb, out_off), at(&outb, out_off))
                } else {
                    inb.copy_from_host(in_off, &data).unwrap();
                    (at(&inb, in_off), at(&outb, out_off))
                };
                // SAFETY: both buffers hold `count` elements from their offsets until the
                // stream is synchronized below.
                let q = unsafe { c.all_reduce(src, dst, count, dtype, op, &stream, algo) };
                let want = (0..count)
                    .map(|i| reduce(op, dtype, (0..n).map(|r| v(r, i))))
                    .collect();
                (q, want, count)
            }
            Call::AllGather(algo) => {
                inb.copy_from_host(in_off, &mine(1)).unwrap();
                // SAFETY: `count` elements in, `n * count` out, until synchronized.
                let q = unsafe {
                    c.all_gather(
                        at(&inb, in_off),
                        at(&outb, out_off),
                        count,
                        dtype,
                        &stream,
                        algo,
                    )
                };
                let want = (0..n * count).map(|j| v(j / count, j % count)).collect();
                (q, want, n * count)
            }
            Call::ReduceScatter(op, algo) => {
                inb.copy_from_host(in_off, &mine(n)).unwrap();
                // SAFETY: `n * count` elements in, `count` out, until synchronized.
                let q = unsafe {
                    c.reduce_scatter(
                        at(&inb, in_off),
                        at(&outb, out_off),
                        count,
                        dtype,
                        op,
                        &stream,
                        algo,
                    )
                };
                let want = (0..count)
                    .map(|i| reduce(op, dtype, (0..n).map(|r| v(r, me * count + i))))
                    .collect();
                (q, want, count)
            }
            Call::Broadcast(root, algo) => {
                inb.copy_from_host(in_off, &mine(1)).unwrap();
                // SAFETY: `count` elements in and out, until synchronized.
                let q = unsafe {
                    c.broadcast(
                        at(&inb, in_off),
                        at(&outb, out_off),
                        count,
                        dtype,
                        root,
                        &stream,
                        algo,
                    )
                };
                (q, (0..count).map(|i| v(root, i)).collect(), count)
            }
            Call::AllToAll(algo) => {
                inb.copy_from_host(in_off, &mine(n)).unwrap();
                // SAFETY: `n * count` elements in and out (disjoint), until synchronized.
                let q = unsafe {
                    c.all_to_all(
                        at(&inb, in_off),
                        at(&outb, out_off),
                        count,
                        dtype,
                        &stream,
                        algo,
                    )
                };
                // Part r of this rank's output is part `me` of rank r's input.
                let want = (0..n * count)
                    .map(|j| v(j / count, me * count + j % count))
                    .collect();
                (q, want, n * count)
            }
            Call::SendRecv { from } => {
                let peer = 1 - me;
                if me == from {
                    inb.copy_from_host(in_off, &mine(1)).unwrap();
                    // SAFETY: `count` elements, until synchronized.
                    let q = unsafe { c.send(at(&inb, in_off), count, dtype, peer, &stream) };
                    (q, Vec::new(), 0)
                } else {
                    // SAFETY: `count` elements, until synchronized.
                    let q = unsafe { c.recv(at(&outb, out_off), count, dtype, peer, &stream) };
                    (q, (0..count).map(|i| v(peer, i)).collect(), count)
                }
            }
            Call::Exchange => {
                let peer = 1 - me;
                inb.copy_from_host(in_off, &mine(1)).unwrap();
                // SAFETY: `count` elements each, disjoint, until synchronized.
                let q = unsafe {
                    c.send_recv(
                        at(&inb, in_off),
                        peer,
                        at(&outb, out_off),
                        peer,
                        count,
                        dtype,
                        &stream,
                    )
                };
                (q, (0..count).map(|i| v(peer, i)).collect(), count)
            }
        };
        // A forced path on the callers' buffers is refused (on every rank alike) when the
        // buffers do not suit it (e.g. a length that is not a multiple of 16 bytes): counted,
        // nothing to check.
        let refused = queued.is_err();
        let (want, out_len) = match queued {
            Ok(()) => (want, out_len),
            Err(Error::Unsupported { what: why, .. }) if call.forces_buffer_path() => {
                *tally
                    .refused
                    .entry(format!("{} {:?}: {why}", call.name(), call.algorithm()))
                    .or_default() += 1;
                (Vec::new(), 0)
            }
            Err(e) => panic!("{what}: {e}"),
        };
        let done = stream
            .synchronize_timeout(HANG)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(done, "{what}: still running after {HANG:?}");
        let algorithm = c.last_algorithm().filter(|_| !refused);
        if let Some(a) = algorithm {
            *tally
                .algorithms
                .entry(format!("{} {a:?}", call.name()))
                .or_default() += 1;
        }
        let mut got = vec![0u8; out_len * es];
        outb.copy_to_host(out_off, &mut got).unwrap();
        let wrong: Vec<usize> = (0..want.len())
            .filter(|&i| decode(dtype, &got[i * es..(i + 1) * es]) != want[i])
            .collect();
        if let Some(&i) = wrong.first() {
            let g = decode(dtype, &got[i * es..(i + 1) * es]);
            let report = format!(
                "{what} (ran as {algorithm:?}): {} of {out_len} elements wrong, the first is \
                 element {i}: {g}, expected {}",
                wrong.len(),
                want[i]
            );
            assert!(keep_going, "{report}");
            println!("SOAK MISMATCH {report}");
            tally.mismatches += 1;
        }
        tally.calls += 1;
    }
    assert!(
        comm.status().error().is_none(),
        "a device error was recorded: {:?}",
        comm.status().error()
    );
    tally
}

#[test]
fn ten_thousand_random_collectives() {
    let ops = std::env::var("MSCCLPP_SOAK_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(OPS);
    if !harness::enough_gpus("ten_thousand_random_collectives", 2) {
        return;
    }
    let kind = harness::backend();
    let start = Instant::now();
    let tallies = ranks_as_threads(2, |comm: Communicator| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        let t = soak(&c, ops);
        c.communicator().barrier().expect("the closing barrier");
        t
    });
    let took = start.elapsed();
    for (r, t) in tallies.iter().enumerate() {
        assert_eq!(t.calls, ops, "rank {r} made {} calls", t.calls);
        assert_eq!(
            t.mismatches, 0,
            "rank {r}: wrong results (SOAK MISMATCH lines)"
        );
    }
    println!(
        "soak: {ops} collectives on 2 ranks ({kind:?}), every result checked, in {took:.2?} \
         ({:.0} µs each)",
        took.as_secs_f64() * 1e6 / ops as f64
    );
    for (what, k) in &tallies[0].algorithms {
        println!("soak:   {what}: {k}");
    }
    for (what, k) in &tallies[0].refused {
        println!("soak:   refused, {what}: {k}");
    }
}
