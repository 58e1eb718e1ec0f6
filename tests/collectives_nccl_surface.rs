//! NCCL's collective surface beyond the original five: `reduce` (every type × reduction ×
//! algorithm that serves it), `gather`, `scatter`, `all_to_allv` (every size class of element,
//! awkward and zero counts), NCCL's edge cases for every collective (zero elements touch
//! nothing and leave the ranks in step; one element; in place at NCCL's offsets; null buffers
//! where NCCL allows them), and groups mixing collectives (PyTorch's uneven all-gather and
//! reduce-scatter as groups of broadcasts and reduces) with sends and receives. Ranks as
//! threads (2 to 8) and as processes (3); inputs are hashes of (rank, part, index), outputs
//! start as a marker, every element is compared with a reference computed here
//! (`tests/surface`).
//!
//! `MSCCLPP_TEST_SURFACE_FULL=1` runs every count of every reduce case and more rank counts.

mod surface;

use mscclpp::collectives::{Algorithm, Collectives};
use mscclpp::host::gpu::{DeviceBuffer, Stream};
use mscclpp::shared::{DataType, DevicePtr};
use mscclpp_test_support as harness;
use mscclpp_test_support::enough_gpus;
use surface::types::{self, OPS, Op, TYPES};
use surface::{MARKER, bytes, full_grid, read, same, with_collectives};

const NULL: DevicePtr<u8> = DevicePtr::NULL;

fn sync(c: &Collectives, stream: &Stream) {
    stream.synchronize().unwrap();
    let comm = c.communicator();
    assert!(
        comm.status().error().is_none(),
        "rank {}: {:?}",
        comm.rank(),
        comm.status().error()
    );
}

/// A buffer of `len` bytes (at least 16) filled with the marker.
fn marked(c: &Collectives, len: usize) -> DeviceBuffer {
    surface::buffer(c, len.max(16), 0, &[])
}

// ------------------------------------------------------------------------------------------
// Reduce
// ------------------------------------------------------------------------------------------

/// The most elements a reduce case uses.
const MAX_COUNT: usize = 1040;

/// One rank's buffers for the reduce cases (allocated once: the registered paths cache each
/// allocation they see).
struct ReduceBuffers {
    stream: Stream,
    input: DeviceBuffer,
    output: DeviceBuffer,
    scalar: DeviceBuffer,
}

impl ReduceBuffers {
    fn new(c: &Collectives) -> Self {
        let g = c.communicator().gpu();
        Self {
            stream: g.stream().unwrap(),
            input: g.alloc(16 + MAX_COUNT * 8).unwrap(),
            output: g.alloc(16 + MAX_COUNT * 8).unwrap(),
            scalar: g.alloc(8).unwrap(),
        }
    }
}

/// How a reduce case lays out its buffers.
#[derive(Clone, Copy, Debug)]
struct Layout {
    root: usize,
    /// The root reduces in place (its input is its output).
    in_place: bool,
    /// The other ranks pass a null output (else a marked one that must stay untouched).
    null_out: bool,
}

/// One reduce of `count` elements of `d` by `op` with `algo`, checked on this rank.
#[allow(clippy::too_many_arguments)]
fn reduce_case(
    c: &Collectives,
    b: &ReduceBuffers,
    algo: Option<Algorithm>,
    d: DataType,
    op: Op,
    count: usize,
    l: Layout,
) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let es = d.size();
    let registered = algo == Some(Algorithm::Direct);
    let off = if registered { 16 } else { es };
    let salt = (count as u64) << 20 ^ (l.root as u64) << 12 ^ op as u64;
    let x = |r: usize, j: usize| types::element(d, op, r, j, salt);
    let mine = types::bytes_of((0..count).map(|j| x(rank, j)), es);
    let marker = vec![MARKER; b.output.len()];
    b.output.copy_from_host(0, &marker).unwrap();
    let root = rank == l.root;
    let (src, dst) = if root && l.in_place {
        b.output.copy_from_host(off, &mine).unwrap();
        let p = b.output.ptr().byte_add_cast(off as u64);
        (p, p)
    } else {
        b.input.copy_from_host(off, &mine).unwrap();
        let src = b.input.ptr().byte_add_cast(off as u64);
        let dst = if !root && l.null_out {
            NULL
        } else {
            b.output.ptr().byte_add_cast(off as u64)
        };
        (src, dst)
    };
    let red = types::reduction(d, op, &b.scalar);
    let what = || format!("reduce by {algo:?}, {op:?} of {count} {d:?} on {n} ranks, {l:?}");
    // SAFETY: `src` and `dst` hold `count` elements until the synchronize below.
    unsafe { c.reduce(src, dst, count, d, red, l.root, &b.stream, algo) }
        .unwrap_or_else(|e| panic!("{}: {e}", what()));
    sync(c, &b.stream);
    let got = read(&b.output);
    if !root {
        same(&got, &marker, &|| {
            format!("{} (a non-root's output)", what())
        });
        return;
    }
    same(&got[..off], &marker[..off], &|| {
        format!("{} (before)", what())
    });
    let end = off + count * es;
    same(&got[end..], &marker[end..], &|| {
        format!("{} (after)", what())
    });
    let scale = types::scale(d, op, n);
    for j in 0..count {
        let xs: Vec<u64> = (0..n).map(|r| x(r, j)).collect();
        let want = types::reference_scaled(d, op, &xs, scale);
        let g = types::element_at(&got[off..], es, j);
        types::check(d, g, &want, &|| format!("{}, element {j}", what()));
    }
}

/// Every algorithm that serves the reduce (and the automatic choice), every type and
/// reduction, at counts that rotate (all of them with the full grid); roots, in-place and
/// null outputs rotate too.
fn reduce_grid(c: &Collectives) {
    let n = c.communicator().size();
    let b = ReduceBuffers::new(c);
    let mut k = n;
    for algo in [
        None,
        Some(Algorithm::LlOneShot),
        Some(Algorithm::Staged),
        Some(Algorithm::Direct),
    ] {
        let counts: &[usize] = if algo == Some(Algorithm::Direct) {
            &[1040, 16]
        } else {
            &[1, 1009, 37, 1040]
        };
        for d in TYPES {
            for op in OPS {
                k += 1;
                let picked = if full_grid() {
                    counts
                } else {
                    &counts[k % counts.len()..][..1]
                };
                for &count in picked {
                    let l = Layout {
                        root: k % n,
                        in_place: k.is_multiple_of(3),
                        null_out: k.is_multiple_of(2),
                    };
                    reduce_case(c, &b, algo, d, op, count, l);
                }
            }
        }
    }
}

#[test]
fn reduce_every_type_reduction_and_algorithm_2_and_3_ranks() {
    for n in [2, 3] {
        if enough_gpus("the reduce grid", n) {
            with_collectives(n, |_| {}, reduce_grid);
        }
    }
}

/// On one rank a reduce is a copy, except that a pre-multiplied sum (an average of floats
/// included) still multiplies.
#[test]
fn reduce_on_one_rank() {
    with_collectives(
        1,
        |_| {},
        |c| {
            let b = ReduceBuffers::new(c);
            for d in TYPES {
                for op in OPS {
                    let l = Layout {
                        root: 0,
                        in_place: op == Op::Avg,
                        null_out: false,
                    };
                    reduce_case(c, &b, None, d, op, 37, l);
                }
            }
        },
    );
}

// ------------------------------------------------------------------------------------------
// Gather, scatter, all-to-all-v
// ------------------------------------------------------------------------------------------

/// One of each size class of element.
const CLASSES: [DataType; 4] = [DataType::U8, DataType::F16, DataType::F32, DataType::U64];

/// Element counts for the data movers: none, one, a prime, and several chunks of the
/// point-to-point engine with a ragged end.
fn counts(c: &Collectives, d: DataType) -> Vec<usize> {
    let cfg = c.config();
    let big = (cfg.p2p_chunk_bytes * cfg.p2p_lanes as usize * 2) / d.size() + 3;
    let mut v = vec![0, 1, 13, big];
    if full_grid() {
        v.extend([2, 1009, cfg.p2p_ll_bytes / d.size() + 1]);
    }
    v
}

/// What `rank` contributes (part `part`, `len` bytes) in case `k`.
fn data(k: usize, rank: usize, part: usize, len: usize) -> Vec<u8> {
    bytes(rank, part, len, 0xda7a ^ (k as u64) << 8)
}

/// Gather to every root in turn: in place on the root every other time, and the other ranks'
/// outputs null or marked (and left untouched).
fn gather_case(c: &Collectives, d: DataType, count: usize, k: usize) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.gpu().stream().unwrap();
    let len = count * d.size();
    let root = k % n;
    let in_place = k % 2 == 1 && rank == root;
    let out = marked(c, n * len + 8);
    let at = d.size();
    let mine = data(k, rank, 0, len);
    let (_keep, src) = if in_place {
        out.copy_from_host(at + rank * len, &mine).unwrap();
        (None, out.ptr().byte_add_cast((at + rank * len) as u64))
    } else {
        let b = surface::buffer(c, len + 5, 5, &mine);
        let p = b.ptr().byte_add_cast(5);
        (Some(b), p)
    };
    let dst = if rank != root && k.is_multiple_of(3) {
        NULL
    } else {
        out.ptr().byte_add_cast(at as u64)
    };
    let what = || format!("gather of {count} {d:?} to {root} on {n} ranks (rank {rank}, case {k})");
    // SAFETY: held until `sync`.
    unsafe { c.gather(src, dst, count, d, root, &stream) }.unwrap();
    sync(c, &stream);
    let mut want = vec![MARKER; out.len()];
    if rank == root {
        for q in 0..n {
            want[at + q * len..][..len].copy_from_slice(&data(k, q, 0, len));
        }
    }
    same(&read(&out), &want, &what);
}

/// Scatter from every root in turn: in place on the root every other time, the other ranks'
/// inputs null.
fn scatter_case(c: &Collectives, d: DataType, count: usize, k: usize) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.gpu().stream().unwrap();
    let len = count * d.size();
    let root = k % n;
    let at = 2 * d.size();
    let parts: Vec<u8> = (0..n).flat_map(|q| data(k, root, q, len)).collect();
    let inp = if rank == root {
        surface::buffer(c, at + n * len, at, &parts)
    } else {
        marked(c, 16)
    };
    let in_place = k % 2 == 1 && rank == root;
    let out = marked(c, len + 8);
    let src = if rank == root {
        inp.ptr().byte_add_cast(at as u64)
    } else {
        NULL
    };
    let dst = if in_place {
        inp.ptr().byte_add_cast((at + rank * len) as u64)
    } else {
        out.ptr().byte_add_cast(3)
    };
    let what =
        || format!("scatter of {count} {d:?} from {root} on {n} ranks (rank {rank}, case {k})");
    // SAFETY: held until `sync`.
    unsafe { c.scatter(src, dst, count, d, root, &stream) }.unwrap();
    sync(c, &stream);
    let mine = data(k, root, rank, len);
    if in_place {
        let mut want = vec![MARKER; inp.len()];
        want[at..at + n * len].copy_from_slice(&parts);
        same(&read(&inp), &want, &what);
        same(&read(&out), &vec![MARKER; out.len()], &what);
    } else {
        let mut want = vec![MARKER; out.len()];
        want[3..3 + len].copy_from_slice(&mine);
        same(&read(&out), &want, &what);
    }
}

/// The elements `from` sends `to` in all-to-all-v case `k` (uneven, zero for some pairs).
fn alltoallv_count(c: &Collectives, d: DataType, k: usize, from: usize, to: usize) -> usize {
    let h = surface::mix((k * 1000 + from * 37 + to) as u64) as usize;
    match h % 3 {
        0 => 0,
        1 => h % 29 + 1,
        _ => counts(c, d)[3] / 2 + h % 17,
    }
}

/// All-to-all-v with uneven counts (zeros included) and displacements with gaps (which keep
/// the marker) in both buffers.
fn all_to_allv_case(c: &Collectives, d: DataType, k: usize) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let es = d.size();
    let stream = comm.gpu().stream().unwrap();
    let send_counts: Vec<usize> = (0..n).map(|q| alltoallv_count(c, d, k, rank, q)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|q| alltoallv_count(c, d, k, q, rank)).collect();
    // Displacements in a rank-dependent order with a gap of 3 elements before each part.
    let displs = |counts: &[usize]| {
        let mut d = vec![0; n];
        let mut at = 0;
        for i in 0..n {
            let q = (rank + i) % n;
            at += 3;
            d[q] = at;
            at += counts[q];
        }
        (d, at + 3)
    };
    let (send_displs, send_len) = displs(&send_counts);
    let (recv_displs, recv_len) = displs(&recv_counts);
    let mut src = vec![MARKER; send_len * es];
    for q in 0..n {
        let part = data(k, rank, q, send_counts[q] * es);
        src[send_displs[q] * es..][..part.len()].copy_from_slice(&part);
    }
    let inp = surface::buffer(c, src.len(), 0, &src);
    let out = marked(c, recv_len * es);
    let what = || format!("all_to_allv of {d:?} on {n} ranks (rank {rank}, case {k})");
    // SAFETY: every part lies inside its buffer; held until `sync`.
    unsafe {
        c.all_to_allv(
            inp.ptr(),
            &send_counts,
            &send_displs,
            out.ptr(),
            &recv_counts,
            &recv_displs,
            d,
            &stream,
        )
    }
    .unwrap();
    sync(c, &stream);
    let mut want = vec![MARKER; out.len()];
    for q in 0..n {
        let part = data(k, q, rank, recv_counts[q] * es);
        want[recv_displs[q] * es..][..part.len()].copy_from_slice(&part);
    }
    same(&read(&out), &want, &what);
}

fn data_movers(c: &Collectives) {
    let mut k = 0;
    for d in CLASSES {
        for count in counts(c, d) {
            gather_case(c, d, count, k);
            scatter_case(c, d, count, k);
            k += 1;
        }
        all_to_allv_case(c, d, k);
        k += 1;
    }
}

#[test]
fn gather_scatter_and_all_to_allv_2_to_8_ranks() {
    let ranks: &[usize] = if full_grid() {
        &[2, 3, 4, 5, 6, 7, 8]
    } else {
        &[2, 3, 5, 8]
    };
    for &n in ranks {
        if enough_gpus("gather, scatter and all-to-all-v", n) {
            with_collectives(n, |_| {}, data_movers);
        }
    }
}

// ------------------------------------------------------------------------------------------
// NCCL's edge cases, every collective
// ------------------------------------------------------------------------------------------

/// Every algorithm forced for `coll` (and the automatic choice), on `count` elements whose
/// buffers suit it: the registered ones only at whole 16-byte vectors.
fn algos(serving: &[Algorithm], count_bytes: usize) -> Vec<Option<Algorithm>> {
    let registered = |a: &Algorithm| matches!(a, Algorithm::Direct | Algorithm::CopyEngine);
    std::iter::once(None)
        .chain(
            serving
                .iter()
                .filter(|a| !registered(a) || count_bytes.is_multiple_of(16))
                .map(|&a| Some(a)),
        )
        .collect()
}

use mscclpp::collectives::Collective;

/// The algorithms a caller may force on `coll`.
fn serving(coll: Collective) -> Vec<Algorithm> {
    // A world of one node: the algorithms of several nodes (`port`, `hier`) are refused here
    // (tests/multinode.rs runs them).
    Algorithm::ALL
        .into_iter()
        .filter(|a| a.serves(coll) && a.serves_world(1, true))
        .collect()
}

/// A call of every collective with zero elements (every algorithm that serves it), into
/// marked outputs: nothing is touched; then the same collective with `count` elements,
/// checked, so the ranks are known to be in step.
fn zero_then_count(c: &Collectives, count: usize) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.gpu().stream().unwrap();
    let d = DataType::I32;
    let es = 4;
    let len = count * es;
    let inp = surface::buffer(c, n * len + 16, 0, &data(count, rank, 0, n * len + 16));
    let out = marked(c, n * len + 16);
    let untouched = |what: &str| {
        same(&read(&out), &vec![MARKER; out.len()], &|| {
            format!("zero-element {what} on {n} ranks touched its output")
        })
    };
    let (i, o) = (inp.ptr(), out.ptr());
    let red = mscclpp::collectives::Reduction::Sum;
    for coll in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
        Collective::Reduce,
    ] {
        for algo in algos(&serving(coll), 16) {
            // SAFETY: nothing is read or written (zero elements); buffers outlive the calls.
            unsafe {
                match coll {
                    Collective::AllReduce => c.all_reduce(i, o, 0, d, red, &stream, algo),
                    Collective::AllGather => c.all_gather(i, o, 0, d, &stream, algo),
                    Collective::ReduceScatter => c.reduce_scatter(i, o, 0, d, red, &stream, algo),
                    Collective::Broadcast => c.broadcast(i, o, 0, d, 1 % n, &stream, algo),
                    Collective::AllToAll => c.all_to_all(i, o, 0, d, &stream, algo),
                    _ => c.reduce(i, o, 0, d, red, 0, &stream, algo),
                }
            }
            .unwrap_or_else(|e| panic!("zero-element {coll:?} by {algo:?}: {e}"));
            sync(c, &stream);
            untouched(&format!("{coll:?} by {algo:?}"));
        }
    }
    // SAFETY: as above.
    unsafe {
        c.gather(i, o, 0, d, 0, &stream).unwrap();
        c.scatter(i, o, 0, d, n - 1, &stream).unwrap();
        let zeros = vec![0; n];
        c.all_to_allv(i, &zeros, &zeros, o, &zeros, &zeros, d, &stream)
            .unwrap();
        c.send_recv(i, (rank + 1) % n, o, (rank + n - 1) % n, 0, d, &stream)
            .unwrap();
        c.group().end(&stream).unwrap();
    }
    sync(c, &stream);
    untouched("gather, scatter, all_to_allv, send_recv");
    // In step: one call of each with `count` elements, checked.
    one_of_each(c, count);
}

/// Every collective once with `count` elements (the automatic choice), checked.
fn one_of_each(c: &Collectives, count: usize) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.gpu().stream().unwrap();
    let d = DataType::I32;
    let b = ReduceBuffers::new(c);
    let l = Layout {
        root: n - 1,
        in_place: false,
        null_out: true,
    };
    reduce_case(c, &b, None, d, Op::Sum, count, l);
    // All-reduce and reduce-scatter through the group, checked against the reference.
    let len = count * 4;
    let x = |r: usize, j: usize| types::element(d, Op::Sum, r, j, 77);
    let inp_vals = types::bytes_of((0..n * count).map(|j| x(rank, j)), 4);
    let inp = surface::buffer(c, n * len, 0, &inp_vals);
    let ar = marked(c, len);
    let rs = marked(c, len);
    let ag = marked(c, n * len);
    let mut g = c.group();
    // SAFETY: held until `sync`.
    unsafe {
        g.all_reduce(
            inp.ptr(),
            ar.ptr(),
            count,
            d,
            mscclpp::collectives::Reduction::Sum,
            None,
        )
        .unwrap();
        g.reduce_scatter(
            inp.ptr(),
            rs.ptr(),
            count,
            d,
            mscclpp::collectives::Reduction::Sum,
            None,
        )
        .unwrap();
        g.all_gather(inp.ptr(), ag.ptr(), count, d, None).unwrap();
    }
    g.end(&stream).unwrap();
    sync(c, &stream);
    let (ar, rs, ag) = (read(&ar), read(&rs), read(&ag));
    for j in 0..count {
        let sum = |idx: usize| {
            types::reference(d, Op::Sum, &(0..n).map(|r| x(r, idx)).collect::<Vec<_>>())
        };
        let what = |s: &str| format!("{s} of {count} on {n} ranks, element {j}");
        types::check(d, types::element_at(&ar, 4, j), &sum(j), &|| {
            what("all_reduce")
        });
        types::check(
            d,
            types::element_at(&rs, 4, j),
            &sum(rank * count + j),
            &|| what("reduce_scatter"),
        );
        for q in 0..n {
            let want = types::Want::Bits(x(q, j));
            types::check(d, types::element_at(&ag, 4, q * count + j), &want, &|| {
                what("all_gather")
            });
        }
    }
    gather_case(c, d, count, 1);
    scatter_case(c, d, count, 2);
    all_to_allv_case(c, d, 3);
}

/// In place at NCCL's offsets, every algorithm that serves each: all-gather with
/// `input = output + rank * count`, reduce-scatter with `output = input + rank * count`,
/// all-reduce and broadcast with `input = output`; and a broadcast whose non-roots pass a null
/// input.
fn in_place_and_null(c: &Collectives, count: usize) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.gpu().stream().unwrap();
    let d = DataType::I32;
    let len = count * 4;
    let x = |r: usize, j: usize| types::element(d, Op::Sum, r, j, 99 + count as u64);
    let vals = |r: usize| types::bytes_of((0..n * count).map(|j| x(r, j)), 4);
    for algo in algos(&serving(Collective::AllGather), len) {
        let what = || format!("in-place all_gather of {count} by {algo:?} on {n} ranks");
        let buf = marked(c, n * len);
        buf.copy_from_host(rank * len, &vals(rank)[..len]).unwrap();
        let (o, i) = (buf.ptr(), buf.ptr().byte_add_cast((rank * len) as u64));
        // SAFETY: `buf` holds `n * count` elements until `sync`.
        unsafe { c.all_gather(i, o, count, d, &stream, algo) }
            .unwrap_or_else(|e| panic!("{}: {e}", what()));
        sync(c, &stream);
        let mut want = vec![MARKER; buf.len()];
        for q in 0..n {
            want[q * len..][..len].copy_from_slice(&vals(q)[..len]);
        }
        same(&read(&buf), &want, &what);
    }
    for algo in algos(&serving(Collective::ReduceScatter), len) {
        let what = || format!("in-place reduce_scatter of {count} by {algo:?} on {n} ranks");
        let buf = surface::buffer(c, n * len, 0, &vals(rank));
        let (i, o) = (buf.ptr(), buf.ptr().byte_add_cast((rank * len) as u64));
        let red = mscclpp::collectives::Reduction::Sum;
        // SAFETY: as above.
        unsafe { c.reduce_scatter(i, o, count, d, red, &stream, algo) }
            .unwrap_or_else(|e| panic!("{}: {e}", what()));
        sync(c, &stream);
        let got = read(&buf);
        for j in 0..count {
            let xs: Vec<u64> = (0..n).map(|r| x(r, rank * count + j)).collect();
            let g = types::element_at(&got[rank * len..], 4, j);
            types::check(d, g, &types::reference(d, Op::Sum, &xs), &|| {
                format!("{}, element {j}", what())
            });
        }
    }
    for algo in algos(&serving(Collective::AllReduce), len) {
        let what = || format!("in-place all_reduce of {count} by {algo:?} on {n} ranks");
        let buf = surface::buffer(c, len, 0, &vals(rank)[..len]);
        let red = mscclpp::collectives::Reduction::Sum;
        // SAFETY: as above.
        unsafe { c.all_reduce(buf.ptr(), buf.ptr(), count, d, red, &stream, algo) }
            .unwrap_or_else(|e| panic!("{}: {e}", what()));
        sync(c, &stream);
        let got = read(&buf);
        for j in 0..count {
            let xs: Vec<u64> = (0..n).map(|r| x(r, j)).collect();
            let g = types::element_at(&got, 4, j);
            types::check(d, g, &types::reference(d, Op::Sum, &xs), &|| {
                format!("{}, element {j}", what())
            });
        }
    }
    for algo in algos(&serving(Collective::Broadcast), len) {
        let root = (count + 1) % n;
        let what = || format!("broadcast of {count} from {root} by {algo:?} on {n} ranks");
        let buf = marked(c, len);
        let i = if rank == root {
            buf.copy_from_host(0, &vals(root)[..len]).unwrap();
            buf.ptr()
        } else {
            NULL
        };
        // SAFETY: as above; the non-roots' input is not read.
        unsafe { c.broadcast(i, buf.ptr(), count, d, root, &stream, algo) }
            .unwrap_or_else(|e| panic!("{}: {e}", what()));
        sync(c, &stream);
        let mut want = vec![MARKER; buf.len()];
        want[..len].copy_from_slice(&vals(root)[..len]);
        same(&read(&buf), &want, &what);
    }
}

#[test]
fn edge_cases_of_every_collective_2_and_3_ranks() {
    for n in [2, 3] {
        if !enough_gpus("the edge cases", n) {
            continue;
        }
        with_collectives(
            n,
            |_| {},
            |c| {
                zero_then_count(c, 1);
                zero_then_count(c, 1031);
                // One element, and whole vectors (which the registered paths serve).
                in_place_and_null(c, 1);
                in_place_and_null(c, 1024);
            },
        );
    }
}

// ------------------------------------------------------------------------------------------
// Groups
// ------------------------------------------------------------------------------------------

/// One group holding an all-reduce, an uneven all-gather as broadcasts from every root, an
/// uneven reduce-scatter as reduces to every root, a gather, and a ring of sends and receives;
/// every result checked.
fn mixed_group(c: &Collectives) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let stream = comm.gpu().stream().unwrap();
    let d = DataType::I32;
    let sum = mscclpp::collectives::Reduction::Sum;
    let x = |r: usize, j: usize| types::element(d, Op::Sum, r, j, 0x6709);
    // Uneven parts: rank q owns `part(q)` elements.
    let part = |q: usize| [5, 0, 300, 1, 77, 2048, 13, 9][q % 8];
    let total: usize = (0..n).map(part).sum();
    let start = |q: usize| (0..q).map(part).sum::<usize>();
    let mine = types::bytes_of((0..total).map(|j| x(rank, j)), 4);
    let inp = surface::buffer(c, total * 4, 0, &mine);
    let gathered = marked(c, total * 4);
    let reduced = marked(c, part(rank) * 4);
    let ar = marked(c, total * 4);
    let ring_in = surface::buffer(c, 4 * 123, 0, &data(5, rank, 0, 4 * 123));
    let ring_out = marked(c, 4 * 123);
    let gat = marked(c, n * 4 * 3);
    let mut g = c.group();
    // SAFETY: every buffer is held until `sync`.
    unsafe {
        g.all_reduce(inp.ptr(), ar.ptr(), total, d, sum, None)
            .unwrap();
        for q in 0..n {
            let at = (start(q) * 4) as u64;
            let src = if q == rank {
                inp.ptr().byte_add_cast(at)
            } else {
                NULL
            };
            g.broadcast(src, gathered.ptr().byte_add_cast(at), part(q), d, q, None)
                .unwrap();
            let dst = if q == rank { reduced.ptr() } else { NULL };
            g.reduce(inp.ptr().byte_add_cast(at), dst, part(q), d, sum, q, None)
                .unwrap();
        }
        g.send(ring_in.ptr(), 123, d, (rank + 1) % n).unwrap();
        g.gather(inp.ptr(), gat.ptr(), 3, d, n - 1).unwrap();
        g.recv(ring_out.ptr(), 123, d, (rank + n - 1) % n).unwrap();
    }
    g.end(&stream).unwrap();
    sync(c, &stream);
    let what = |s: &str| format!("group on {n} ranks (rank {rank}): {s}");
    let all: Vec<u8> = (0..n)
        .flat_map(|q| types::bytes_of((start(q)..start(q) + part(q)).map(|j| x(q, j)), 4))
        .collect();
    same(&read(&gathered), &all, &|| what("uneven all-gather"));
    let red = read(&reduced);
    let ar = read(&ar);
    for j in 0..total {
        let want = types::reference(d, Op::Sum, &(0..n).map(|r| x(r, j)).collect::<Vec<_>>());
        types::check(d, types::element_at(&ar, 4, j), &want, &|| {
            what("all-reduce")
        });
        let k = j.wrapping_sub(start(rank));
        if k < part(rank) {
            types::check(d, types::element_at(&red, 4, k), &want, &|| {
                what("uneven reduce-scatter")
            });
        }
    }
    same(
        &read(&ring_out),
        &data(5, (rank + n - 1) % n, 0, 4 * 123),
        &|| what("ring"),
    );
    let mut want = vec![MARKER; n * 12];
    if rank == n - 1 {
        want = (0..n)
            .flat_map(|q| types::bytes_of((0..3).map(|j| x(q, j)), 4))
            .collect();
    }
    same(&read(&gat), &want[..], &|| what("gather"));
}

#[test]
fn groups_of_mixed_collectives_2_3_and_4_ranks() {
    for n in [2, 3, 4] {
        if enough_gpus("mixed groups", n) {
            with_collectives(n, |_| {}, mixed_group);
        }
    }
}

/// The data movers, a reduce of each algorithm and a mixed group with ranks as processes.
#[test]
fn surface_as_processes_3_ranks() {
    const TEST: &str = "surface_as_processes_3_ranks";
    match harness::child_communicator() {
        Some(comm) => {
            let c = Collectives::new(std::sync::Arc::new(comm)).expect("collectives");
            data_movers(&c);
            let b = ReduceBuffers::new(&c);
            for (k, algo) in [
                None,
                Some(Algorithm::LlOneShot),
                Some(Algorithm::Staged),
                Some(Algorithm::Direct),
            ]
            .into_iter()
            .enumerate()
            {
                let l = Layout {
                    root: k % 3,
                    in_place: k == 1,
                    null_out: true,
                };
                reduce_case(&c, &b, algo, DataType::BF16, Op::Avg, 1040, l);
            }
            mixed_group(&c);
            c.communicator().bootstrap().barrier().unwrap();
        }
        None => {
            if enough_gpus("the surface as processes", 3) {
                harness::ranks_as_processes(3, TEST);
            }
        }
    }
}
