//! MSCCL++ execution plans run by `mscclpp::executor` on the backend under test: the
//! repository's own plans (every op the parser accepts but the switch ops) at 2, 3, 4 and 8
//! ranks, and MSCCL++'s conformance plans from `../shared/mscclpp-plans/` (the six without
//! NVLink multicast run and give the collective's result; the two NVLS ones are refused at
//! load). Every rank's input is a hash of (rank, launch, index), outputs start as a marker,
//! every element is compared with a host reference, launch after launch (both halves of a
//! double scratch buffer, flags advancing).

use mscclpp::host::error::PlanError;
use std::sync::Arc;

use mscclpp::executor::plan::{PlanDoc, ReduceKind};
use mscclpp::executor::{ExecutionPlan, Executor, PacketType, Races, plans};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::{Error, Result};
use mscclpp::shared::DataType;
use mscclpp_test_support::{self as harness, MARKER, codec};

/// What one run checks.
#[derive(Clone, Copy)]
struct Run {
    dtype: DataType,
    /// Bytes of one chunk.
    chunk: u64,
    launches: usize,
    packet: PacketType,
}

impl Run {
    fn new(dtype: DataType, chunk: u64) -> Self {
        Self {
            dtype,
            chunk,
            launches: 3,
            packet: PacketType::LL16,
        }
    }
}

/// The value of element `i` of rank `r`'s input in launch `l`: an integer in [-10, 13] from a
/// hash of the three (one multiply-xorshift round, cheap enough for 32 MiB of debug-built test
/// data), exact in every type, and so are sums of up to 9 ranks.
fn value(r: usize, l: usize, i: usize) -> i64 {
    let mut h = (i as u64) ^ ((r as u64) << 40) ^ ((l as u64) << 56);
    h = h
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 29;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 32;
    (h % 24) as i64 - 10
}

/// Bytes of the stored number `x` (unsigned types shifted into range by +10 per value) as
/// `dtype`, for every `x` a test produces: `table[x + OFFSET]`.
struct Encodings {
    dtype: DataType,
    table: Vec<Vec<u8>>,
}

const OFFSET: i64 = 300;

impl Encodings {
    fn new(dtype: DataType) -> Self {
        let table = (-OFFSET..=OFFSET)
            .map(|x| codec::encode(dtype, x as f64))
            .collect();
        Self { dtype, table }
    }

    /// The stored number of value `v`.
    fn stored(&self, v: i64) -> i64 {
        if self.dtype == DataType::U32 {
            v + 10
        } else {
            v
        }
    }

    fn push(&self, x: i64, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.table[(x + OFFSET) as usize]);
    }
}

/// Rank `r`'s input of launch `l`: `elems` elements.
fn input(enc: &Encodings, r: usize, l: usize, elems: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(elems * enc.dtype.size());
    for i in 0..elems {
        enc.push(enc.stored(value(r, l, i)), &mut out);
    }
    out
}

/// What rank `r`'s output holds after launch `l` of `doc` on `n` ranks.
fn reference(doc: &PlanDoc, enc: &Encodings, n: usize, l: usize, in_elems: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(in_elems * enc.dtype.size() * n);
    match doc.collective.as_str() {
        "allreduce" => {
            let op = doc.reduction().unwrap_or(ReduceKind::Sum);
            for i in 0..in_elems {
                let mut acc = enc.stored(value(0, l, i));
                for q in 1..n {
                    let x = enc.stored(value(q, l, i));
                    acc = match op {
                        ReduceKind::Sum => acc + x,
                        ReduceKind::Min => acc.min(x),
                        ReduceKind::Max => acc.max(x),
                    };
                }
                enc.push(acc, &mut out);
            }
        }
        "allgather" => {
            for q in 0..n {
                out.extend(input(enc, q, l, in_elems));
            }
        }
        other => panic!("no reference for {other}"),
    }
    out
}

/// One rank's part of [`run_plan`]: its executor and buffers go into `keep`.
#[allow(clippy::too_many_arguments)]
fn rank_body(
    doc: &PlanDoc,
    n: usize,
    run: Run,
    comm: &Arc<Communicator>,
    in_bytes: u64,
    out_bytes: u64,
    keep: &mut Vec<Box<dyn std::any::Any + Send>>,
) -> Result<()> {
    let esize = run.dtype.size();
    let enc = Encodings::new(run.dtype);
    let r = comm.rank();
    let plan = ExecutionPlan::from_doc(doc.clone(), Races::Refuse)?;
    let exec = Arc::new(Executor::new(comm.clone())?);
    keep.push(Box::new(exec.clone()));
    let g = comm.gpu().clone();
    let stream = g.stream()?;
    let out = Arc::new(g.alloc(out_bytes as usize)?);
    keep.push(Box::new(out.clone()));
    let (sep, in_ptr, in_off) = if doc.inplace {
        let off = if out_bytes > in_bytes {
            r as u64 * in_bytes
        } else {
            0
        };
        (None, out.ptr().addr() + off, off)
    } else {
        let b = Arc::new(g.alloc(in_bytes as usize)?);
        keep.push(Box::new(b.clone()));
        let p = b.ptr().addr();
        (Some(b), p, 0)
    };
    let in_elems = (in_bytes as usize) / esize;
    for l in 0..run.launches {
        let data = input(&enc, r, l, in_elems);
        out.copy_from_host(0, &vec![MARKER; out_bytes as usize])?;
        match &sep {
            Some(b) => b.copy_from_host(0, &data)?,
            None => out.copy_from_host(in_off as usize, &data)?,
        }
        // SAFETY: both buffers live until every rank has joined (`keep`).
        unsafe {
            exec.execute(
                r,
                mscclpp::shared::DevicePtr::from_addr(in_ptr),
                in_bytes,
                out.ptr(),
                out_bytes,
                run.dtype,
                &plan,
                &stream,
                run.packet,
            )?
        };
        stream.synchronize()?;
        if let Some(e) = comm.status().error() {
            return Err(e);
        }
        let mut got = vec![0u8; out_bytes as usize];
        out.copy_to_host(0, &mut got)?;
        let want = reference(doc, &enc, n, l, in_elems);
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            return Err(Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem: format!(
                    "rank {r}, launch {l}: byte {i} of {} (element {}) is {:#04x}, want {:#04x}",
                    got.len(),
                    i / esize,
                    got[i],
                    want[i]
                ),
            }));
        }
    }
    comm.bootstrap().barrier()
}

/// Runs `doc` on `n` ranks for `run.launches` launches, checking every output.
fn run_plan(doc: &PlanDoc, n: usize, run: Run) -> Result<()> {
    let g0 = &doc.gpus[0];
    let in_bytes = run.chunk * g0.input_chunks;
    let out_bytes = run.chunk * g0.output_chunks;
    // Each rank hands its executor and buffers back to be dropped after every rank has
    // joined: a rank that fails must not free memory its peers' kernels and proxies may still
    // write (ranks as threads reach each other's buffers at their own addresses).
    let results = mscclpp::world::run_local_ranks(harness::backend(), n, |comm: Communicator| {
        let comm = Arc::new(comm);
        let mut keep: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
        let outcome = rank_body(doc, n, run, &comm, in_bytes, out_bytes, &mut keep);
        if outcome.is_err() {
            comm.abort();
        }
        Ok((keep, outcome))
    });
    let mut kept = Vec::new();
    let results: Vec<Result<()>> = results
        .into_iter()
        .map(|r| {
            r.and_then(|(keep, outcome)| {
                kept.push(keep);
                outcome
            })
        })
        .collect();
    drop(kept);
    for (r, res) in results.into_iter().enumerate() {
        res.map_err(|e| {
            Error::Plan(PlanError::Call {
                plan: doc.name.clone(),
                problem: format!("rank {r} of {n}: {e}"),
            })
        })?;
    }
    Ok(())
}

const RANKS: [usize; 4] = [2, 3, 4, 8];

#[test]
fn own_plans_at_2_3_4_and_8_ranks() {
    for n in RANKS {
        if !harness::enough_gpus("own_plans_at_2_3_4_and_8_ranks", n) {
            continue;
        }
        // Chunks of 1 KiB (pipelines of 256-byte units: four iterations), three launches.
        for (i, doc) in plans::all(n, 256).into_iter().enumerate() {
            let dtype = [DataType::F32, DataType::I32, DataType::F16, DataType::U32][i % 4];
            let t = std::time::Instant::now();
            run_plan(&doc, n, Run::new(dtype, 1024))
                .unwrap_or_else(|e| panic!("{} on {n} ranks ({dtype:?}): {e}", doc.name));
            println!("{} on {n} ranks: {:?}", doc.name, t.elapsed());
        }
    }
}

#[test]
fn copy_plan_on_one_rank() {
    // The interpreter's copy against nothing else: one rank, 4 blocks.
    run_plan(&plans::copy(4), 1, Run::new(DataType::F32, 4096)).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn packet_routes_types_and_ll8() {
    // Every route of the packet all-reduce on 4 ranks, LL8 packets included; min and max.
    for rot in 0..4 {
        let doc = plans::allreduce_packets(4, rot);
        let mut run = Run::new(DataType::BF16, 512);
        run.packet = if rot % 2 == 0 {
            PacketType::LL8
        } else {
            PacketType::LL16
        };
        run_plan(&doc, 4, run).unwrap_or_else(|e| panic!("rotation {rot}: {e}"));
    }
    for (op, dtype) in [
        (ReduceKind::Min, DataType::I32),
        (ReduceKind::Max, DataType::F16),
    ] {
        run_plan(&plans::allreduce_read(3, op), 3, Run::new(dtype, 256))
            .unwrap_or_else(|e| panic!("{op:?}: {e}"));
    }
}

/// Ranks whose calls disagree are refused alike, before anything is set up or launched: other
/// sizes on one rank, then a call one rank refuses locally (out of place, for an in-place
/// plan: every other rank names that rank and its reason); the same executor then runs the
/// agreed call.
#[test]
fn ranks_that_disagree_are_refused_alike() {
    let doc = plans::allreduce_read(2, ReduceKind::Sum);
    assert!(doc.inplace);
    let bytes = 1024 * doc.gpus[0].input_chunks;
    let results = mscclpp::world::run_local_ranks(harness::backend(), 2, |comm: Communicator| {
        let comm = Arc::new(comm);
        let r = comm.rank();
        let plan = ExecutionPlan::from_doc(doc.clone(), Races::Refuse)?;
        let exec = Executor::new(comm.clone())?;
        let g = comm.gpu().clone();
        let stream = g.stream()?;
        let buf = g.alloc(2 * bytes as usize)?;
        let other = g.alloc(2 * bytes as usize)?;
        // SAFETY: the buffers outlive every call (synchronized and met at the barrier below).
        let call = |out: &mscclpp::host::gpu::DeviceBuffer, len: u64| unsafe {
            exec.execute(
                r,
                buf.ptr(),
                len,
                out.ptr(),
                len,
                DataType::F32,
                &plan,
                &stream,
                PacketType::LL16,
            )
        };
        let sizes = call(&buf, bytes * (1 + r as u64)).map_err(|e| e.to_string());
        let local = call(if r == 1 { &other } else { &buf }, bytes).map_err(|e| e.to_string());
        buf.copy_from_host(0, &vec![0u8; bytes as usize])?;
        call(&buf, bytes)?;
        stream.synchronize()?;
        comm.bootstrap().barrier()?;
        Ok((sizes, local))
    });
    for (r, res) in results.into_iter().enumerate() {
        let (sizes, local) = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        let sizes = sizes.expect_err("other sizes are refused");
        let q = 1 - r;
        assert!(
            sizes.contains(&format!("rank {q} calls with")),
            "rank {r}: {sizes}"
        );
        let local = local.expect_err("a local refusal fails every rank");
        if r == 1 {
            assert!(local.contains("in place"), "rank 1: {local}");
        } else {
            assert!(local.contains("rank 1 refused the call"), "rank 0: {local}");
            assert!(local.contains("in place"), "rank 0: {local}");
        }
    }
}

/// The conformance plans in `../shared/mscclpp-plans/` (beside the repository's checkout, or
/// its copy in the GPU bundle), or `None` (and `NOT RUN`).
fn conformance(test: &str) -> Option<std::path::PathBuf> {
    let d = harness::package_dir(env!("CARGO_MANIFEST_DIR")).join("../shared/mscclpp-plans");
    if d.is_dir() {
        Some(d)
    } else {
        eprintln!(
            "NOT RUN: {test}: ../shared/mscclpp-plans (MSCCL++'s conformance plans) is absent"
        );
        None
    }
}

const RUNNABLE: [&str; 6] = [
    "reduce.json",
    "reduce_tbg.json",
    "reduce_pack.json",
    "reduce_pack_tbg.json",
    "transfer_pack.json",
    "transfer_pack_tbg.json",
];

/// Runs conformance plan `f` at each (message bytes, launches, type) of `runs` on 2 ranks.
fn run_conformance(dir: &std::path::Path, f: &str, runs: &[(u64, usize, DataType)]) {
    let text = std::fs::read_to_string(dir.join(f)).unwrap();
    let doc = PlanDoc::parse(&text, f).unwrap();
    let g = &doc.gpus[0];
    let chunks = if doc.collective == "allgather" {
        g.output_chunks
    } else {
        g.input_chunks
    };
    for &(message, launches, dtype) in runs {
        let mut run = Run::new(dtype, message / chunks);
        run.launches = launches;
        let t = std::time::Instant::now();
        run_plan(&doc, 2, run).unwrap_or_else(|e| panic!("{f} at {message} bytes: {e}"));
        println!("{f} at {message} bytes: {:?}", t.elapsed());
    }
}

/// The conformance plans in place (as MSCCL++'s CI runs them) at sizes the CPU backend's
/// debug build runs in seconds: chunks of 32 KiB and of 2 KiB (threadblock groups share 2
/// KiB unevenly at 16-byte alignment: 64 units of 16 bytes cut in two), three launches each
/// (both halves of their double scratch buffers); `reduce.json` also at MSCCL++'s 32 MiB. The
/// other five at 32 MiB: `conformance_plans_at_32_mib`.
#[test]
fn conformance_plans_run_in_place() {
    let Some(dir) = conformance("conformance_plans_run_in_place") else {
        return;
    };
    if !harness::enough_gpus("conformance_plans_run_in_place", 2) {
        return;
    }
    run_conformance(&dir, "reduce.json", &[(32 << 20, 1, DataType::F32)]);
    for f in RUNNABLE {
        run_conformance(
            &dir,
            f,
            &[(64 << 10, 3, DataType::F16), (4 << 10, 3, DataType::BF16)],
        );
    }
}

/// Every runnable conformance plan at MSCCL++'s 32 MiB: minutes on the CPU backend's debug
/// build (LL plans move twice the bytes as packets, each read through a flag check), seconds
/// on a GPU: the GPU bundle (`scripts/gpu-bundle.sh`) runs it with the ignored tests.
#[test]
#[ignore = "32 MiB conformance runs take minutes on the CPU backend's debug build; run by the GPU bundle and --ignored"]
fn conformance_plans_at_32_mib() {
    let Some(dir) = conformance("conformance_plans_at_32_mib") else {
        return;
    };
    if !harness::enough_gpus("conformance_plans_at_32_mib", 2) {
        return;
    }
    for f in RUNNABLE {
        run_conformance(&dir, f, &[(32 << 20, 2, DataType::F16)]);
    }
}

#[test]
fn nvls_plans_are_refused_at_load() {
    let Some(dir) = conformance("nvls_plans_are_refused_at_load") else {
        return;
    };
    for f in ["reduce_nvls.json", "reduce_nvls_pipeline.json"] {
        match ExecutionPlan::load(dir.join(f)) {
            Err(Error::Plan(PlanError::Unsupported { what, .. })) => {
                assert!(what.contains("multicast"), "{what}")
            }
            other => panic!("{f}: {other:?}"),
        }
    }
}
