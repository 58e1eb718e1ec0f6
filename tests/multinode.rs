//! Collectives on worlds of several nodes, emulated on this host: ranks run as processes, each
//! told its node by its host identity (`BootstrapConfig::with_host_id`, what
//! `MSCCLPP_HOSTID` sets), and all traffic stays on loopback — libfabric's `tcp` provider on
//! `lo` (`FI_PROVIDER=tcp`, `FI_TCP_IFACE=lo`), the Ethernet transport and the bootstrap on
//! `lo` (`MSCCLPP_SOCKET_IFNAME=lo`).
//!
//! Shapes: 2 nodes × 1, 2 and 4 ranks and 3 nodes × 2 ranks (placed round-robin, so that a
//! node's ranks are not contiguous) over libfabric; 2 × 2 over the Ethernet transport; 2 × 1
//! over libfabric with every write in messages (`MSCCLPP_OFI_STAGED=1`); nodes of different
//! sizes (2 + 1); the Ethernet case also with a deeper pipeline of smaller chunks. Every
//! collective (all-reduce, reduce-scatter, all-gather, broadcast,
//! all-to-all, `send_recv` around a ring, `send` / `recv` pairs) on every type class (f32, f16,
//! bf16, fp8, i8, u8, i32, u64, f64) and size class (a few elements: the latency path; below
//! `hier_small_max_bytes`; a prime count of several pipeline chunks with a tail), and every
//! reduction (sum, product, min, max, average, pre-multiplied sums by value and in device
//! memory), is checked element by element against a reference computed here; outputs start as
//! a marker and the bytes past them must stay untouched. Each rank prints the bytes its
//! connections sent over each transport and the test checks that the traffic between nodes
//! crossed the transport under test, and only it. Gather, scatter, all-to-all-v (parts of
//! different sizes) and a group's sends and receives run as lone sends and receives over the
//! PortChannels, checked the same way, and so does reduce (the port collective's reduce mode:
//! the non-roots pass no output and write none).
//!
//! Failures: a node killed mid-collective (both its ranks, SIGKILL by the test) ends every
//! survivor's collective with a typed error within [`RELEASE_WITHIN`]; ranks that force
//! different transports fail their set-up with `Error::NoCommonTransport`.
//!
//! Without libfabric (`scripts/test.sh` installs Debian's `libfabric1`) the libfabric cases
//! print NOT RUN and why (and fail with `MSCCLPP_REQUIRE_OFI=1`, as CI sets).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::collectives::{Algorithm, CollectiveConfig, Collectives, Reduction, Scalar};
use mscclpp::host::Error;
use mscclpp::host::bootstrap::Bootstrap;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::error::TransportErrorKind;
use mscclpp::host::gpu::{BackendKind, DeviceBuffer, Gpu, Stream};
use mscclpp::host::transport::Transport;
use mscclpp::shared::DataType;
use mscclpp_test_support::{self as harness, ChildEnd, codec};

/// How long a survivor may take to learn that a node died.
const RELEASE_WITHIN: Duration = Duration::from_secs(10);
/// The parent's hang guard for a whole world.
const WORLD_BOUND: Duration = Duration::from_secs(150);
/// How long one collective may take before the child fails.
const CALL_BOUND: Duration = Duration::from_secs(60);

/// A child's node (the rest of its place is the harness's).
const ENV_NODE: &str = "MSCCLPP_MN_NODE";

// ------------------------------------------------------------------------------------------
// Worlds of processes
// ------------------------------------------------------------------------------------------

/// A child's place in the world, in the child (`None` in the test process): rank, node.
fn me() -> Option<(usize, usize)> {
    let place = harness::child_place()?;
    let node = std::env::var(ENV_NODE).ok()?.parse().ok()?;
    Some((place.rank, node))
}

/// Runs test `test` as a world of processes, rank `r` on node `nodes[r]` with `env` (and
/// `per_rank(r)`), loopback only; `watch(rank, line)` sees every line of every child's output
/// as it comes (the node-kill test kills from there). Every child is waited for; one still
/// running after [`WORLD_BOUND`] is killed and reported.
fn world(
    test: &str,
    nodes: &[usize],
    env: &[(&str, &str)],
    per_rank: &(dyn Fn(usize) -> Vec<(String, String)> + Sync),
    watch: &(dyn Fn(usize, &str) + Sync),
) -> Vec<ChildEnd> {
    let mut p = harness::Processes::new(test, nodes.len())
        .bound(WORLD_BOUND)
        .env("FI_PROVIDER", "tcp")
        .env("FI_TCP_IFACE", "lo")
        .env("MSCCLPP_SOCKET_IFNAME", "lo")
        .env_remove("MSCCLPP_HOSTID")
        .env_remove("MSCCLPP_NET_TRANSPORT")
        .env_remove("MSCCLPP_OFI_STAGED")
        .env_remove("MSCCLPP_OFI_PROVIDER");
    for (k, v) in env {
        p = p.env(k, v);
    }
    let with_node = |r: usize| {
        let mut vars = vec![(ENV_NODE.to_string(), nodes[r].to_string())];
        vars.extend(per_rank(r));
        vars
    };
    p.per_rank(&with_node).watch(watch).run()
}

/// In a child: its communicator, its node set by host identity, on loopback.
fn child_communicator(node: usize) -> Communicator {
    let host = format!("mscclpp-emulated-node-{node}");
    let bs = harness::child_bootstrap_with(|cfg| cfg.with_host_id(host))
        .expect("called in a child of a world");
    let rank = bs.rank();
    Communicator::new(Arc::new(bs), harness::gpu(rank)).unwrap()
}

/// Whether libfabric can be used by children of this test (they probe it themselves: the
/// parent must not initialise libfabric with another environment). `None`: run.
fn ofi_missing(test: &str, ends: &[ChildEnd]) -> bool {
    if let Some(line) = ends
        .iter()
        .flat_map(|e| e.stdout.lines())
        .find(|l| l.contains("NOT RUN"))
    {
        println!("{line} ({test})");
        return true;
    }
    false
}

/// In a child that needs libfabric: `false` (after printing NOT RUN) when it is not usable.
fn child_has_ofi() -> bool {
    match mscclpp::host::connection::ofi::usable() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var("MSCCLPP_REQUIRE_OFI").as_deref() != Ok("1"),
                "libfabric is required here (MSCCLPP_REQUIRE_OFI=1): {e}"
            );
            println!("NOT RUN: libfabric is not usable here ({e}); scripts/test.sh installs it");
            false
        }
    }
}

/// Checks every child passed and the traffic between nodes crossed `over` only.
fn expect_passed(test: &str, ends: &[ChildEnd], over: Transport, nodes: &[usize]) {
    let failures: Vec<String> = ends
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.success())
        .map(|(r, e)| format!("rank {r}:\n{}", e.text()))
        .collect();
    assert!(failures.is_empty(), "{test}:\n{}", failures.join("\n"));
    for (r, e) in ends.iter().enumerate() {
        let line = e
            .stdout
            .lines()
            .find(|l| l.contains("MN_BYTES"))
            .unwrap_or_else(|| panic!("rank {r} printed no traffic:\n{}", e.text()));
        let field = |k: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap()
        };
        let (ofi, eth) = (field("ofi="), field("ethernet="));
        let other_nodes = nodes.iter().any(|&n| n != nodes[r]);
        let (used, unused) = match over {
            Transport::Ofi => (ofi, eth),
            _ => (eth, ofi),
        };
        assert!(
            !other_nodes || used > 0,
            "rank {r} sent nothing over {over}: {line}"
        );
        assert_eq!(unused, 0, "rank {r} used another network transport: {line}");
        println!("rank {r} (node {}): {line}", nodes[r]);
    }
}

// ------------------------------------------------------------------------------------------
// Values and the reference
// ------------------------------------------------------------------------------------------

/// Every type class.
const TYPES: [DataType; 9] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::F8E4M3,
    DataType::I8,
    DataType::U8,
    DataType::I32,
    DataType::U64,
    DataType::F64,
];

fn unsigned(d: DataType) -> bool {
    matches!(d, DataType::U8 | DataType::U32 | DataType::U64)
}

/// A hash of (rank, part, index) with no short period.
fn mix(r: usize, part: usize, i: usize) -> u64 {
    let mut x = (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (part as u64 + 7).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ (i as u64 + 3).wrapping_mul(0x1656_67b1_9e37_79f9);
    x ^= x >> 31;
    x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^ (x >> 32)
}

/// What the ranks contribute: small integers every type holds exactly, and whose sums (of up
/// to 8) and products (at most two factors of 2) every type holds exactly too.
#[derive(Clone, Copy, PartialEq)]
enum Vals {
    Sum,
    Prod,
}

fn value(kind: Vals, d: DataType, r: usize, part: usize, i: usize) -> f64 {
    let h = mix(r, part, i);
    match kind {
        Vals::Sum => {
            let span: u64 = if matches!(d, DataType::F8E4M3 | DataType::F8E5M2) {
                3
            } else {
                7
            };
            let v = (h % span) as f64;
            if unsigned(d) {
                v
            } else {
                v - (span / 2) as f64
            }
        }
        Vals::Prod => {
            let mag = if (r + i) % 4 < 2 && h.is_multiple_of(3) {
                2.0
            } else {
                1.0
            };
            if !unsigned(d) && h >> 40 & 1 == 1 {
                -mag
            } else {
                mag
            }
        }
    }
}

fn bytes_of(kind: Vals, d: DataType, r: usize, part: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * d.size());
    for i in 0..count {
        codec::encode_into(d, value(kind, d, r, part, i), &mut out);
    }
    out
}

/// The reduction of the ranks' contributions to element `i` of part `part`.
fn reference(op: &Op, d: DataType, n: usize, part: usize, i: usize) -> f64 {
    let xs: Vec<f64> = (0..n).map(|r| value(op.vals(), d, r, part, i)).collect();
    match op {
        Op::Sum => xs.iter().sum(),
        Op::Prod => xs.iter().product(),
        Op::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
        Op::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Op::PreMul2 | Op::PreMul2Device => xs.iter().map(|x| 2.0 * x).sum(),
        Op::Avg if d.is_float() => xs.iter().sum::<f64>() / n as f64,
        Op::Avg => (xs.iter().sum::<f64>() / n as f64).trunc(),
    }
}

/// Operators as the tests ask them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
    PreMul2,
    PreMul2Device,
}

impl Op {
    fn vals(&self) -> Vals {
        if *self == Op::Prod {
            Vals::Prod
        } else {
            Vals::Sum
        }
    }
}

// ------------------------------------------------------------------------------------------
// The checks every world runs
// ------------------------------------------------------------------------------------------

/// One rank's collectives and buffers.
struct Rank {
    c: Collectives,
    stream: Stream,
    gpu: Gpu,
    rank: usize,
    n: usize,
    /// The device scalar of the pre-multiplied sums (2 as f32).
    two: DeviceBuffer,
}

/// Marker bytes outputs start as (and bytes past an output keep).
const MARK: u8 = 0xa5;
const PAD: usize = 64;

impl Rank {
    fn buffer(&self, bytes: &[u8], len: usize) -> DeviceBuffer {
        let b = self.gpu.alloc(len + PAD).unwrap();
        let mut init = vec![MARK; len + PAD];
        init[..bytes.len()].copy_from_slice(bytes);
        b.copy_from_host(0, &init).unwrap();
        b
    }

    fn finish(&self, what: &str) {
        let done = self.stream.synchronize_timeout(CALL_BOUND);
        match done {
            Ok(true) => {}
            other => panic!("rank {}: {what} did not finish: {other:?}", self.rank),
        }
        if let Some(e) = self.c.communicator().status().error() {
            panic!("rank {}: {what}: {e}", self.rank);
        }
    }

    fn read(&self, b: &DeviceBuffer, len: usize, what: &str) -> Vec<u8> {
        let mut v = vec![0u8; len + PAD];
        b.copy_to_host(0, &mut v).unwrap();
        assert!(
            v[len..].iter().all(|&x| x == MARK),
            "rank {}: {what} wrote past its output",
            self.rank
        );
        v.truncate(len);
        v
    }

    fn check(&self, what: &str, d: DataType, got: &[u8], want: impl Fn(usize) -> f64, tol: f64) {
        for (i, e) in got.chunks_exact(d.size()).enumerate() {
            let (g, w) = (codec::decode(d, e), want(i));
            if (g - w).abs() > tol || g.is_nan() {
                panic!(
                    "rank {}: {what}: element {i} is {g}, expected {w}",
                    self.rank
                );
            }
        }
    }

    fn reduction(&self, op: Op, d: DataType) -> Reduction {
        match op {
            Op::Sum => Reduction::Sum,
            Op::Prod => Reduction::Prod,
            Op::Min => Reduction::Min,
            Op::Max => Reduction::Max,
            Op::Avg => Reduction::Avg,
            Op::PreMul2 => Reduction::PreMulSum(Scalar::host(2.0, d)),
            Op::PreMul2Device => Reduction::PreMulSum(Scalar::Device(self.two.ptr())),
        }
    }

    /// Tolerance of a floating average whose `1/n` does not round exactly.
    fn tolerance(&self, op: Op, d: DataType) -> f64 {
        if op == Op::Avg && d.is_float() && !self.n.is_power_of_two() {
            let u = match d {
                DataType::F32 => 2f64.powi(-24),
                DataType::F64 => 2f64.powi(-53),
                DataType::F16 => 2f64.powi(-11),
                DataType::BF16 => 2f64.powi(-8),
                _ => 2f64.powi(-3),
            };
            // n terms of magnitude at most 3/n, each rounded, plus the scalar's rounding.
            (self.n as f64 + 2.0) * u * 3.0
        } else {
            0.0
        }
    }

    fn all_reduce(&self, op: Op, d: DataType, count: usize, in_place: bool) {
        let what = format!(
            "all-reduce {op:?} {d:?} x{count}{}",
            if in_place { " in place" } else { "" }
        );
        let len = count * d.size();
        let input = self.buffer(&bytes_of(op.vals(), d, self.rank, 0, count), len);
        let output = if in_place {
            None
        } else {
            Some(self.buffer(&[], len))
        };
        let out = output.as_ref().unwrap_or(&input);
        // SAFETY: both buffers hold `count` elements and outlive the synchronize below.
        unsafe {
            self.c.all_reduce(
                input.ptr(),
                out.ptr(),
                count,
                d,
                self.reduction(op, d),
                &self.stream,
                None,
            )
        }
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", self.rank));
        self.finish(&what);
        let got = self.read(out, len, &what);
        let tol = self.tolerance(op, d);
        self.check(&what, d, &got, |i| reference(&op, d, self.n, 0, i), tol);
    }

    fn reduce_scatter(&self, op: Op, d: DataType, count: usize) {
        let what = format!("reduce-scatter {op:?} {d:?} x{count}");
        let (n, es) = (self.n, d.size());
        let mut all = Vec::new();
        for part in 0..n {
            all.extend(bytes_of(op.vals(), d, self.rank, part, count));
        }
        let input = self.buffer(&all, n * count * es);
        let output = self.buffer(&[], count * es);
        // SAFETY: sizes as the call needs; synchronized below.
        unsafe {
            self.c.reduce_scatter(
                input.ptr(),
                output.ptr(),
                count,
                d,
                self.reduction(op, d),
                &self.stream,
                None,
            )
        }
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", self.rank));
        self.finish(&what);
        let got = self.read(&output, count * es, &what);
        let tol = self.tolerance(op, d);
        self.check(&what, d, &got, |i| reference(&op, d, n, self.rank, i), tol);
    }

    fn all_gather(&self, d: DataType, count: usize) {
        let what = format!("all-gather {d:?} x{count}");
        let (n, es) = (self.n, d.size());
        let input = self.buffer(&bytes_of(Vals::Sum, d, self.rank, 0, count), count * es);
        let output = self.buffer(&[], n * count * es);
        // SAFETY: sizes as the call needs; synchronized below.
        unsafe {
            self.c
                .all_gather(input.ptr(), output.ptr(), count, d, &self.stream, None)
        }
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", self.rank));
        self.finish(&what);
        let got = self.read(&output, n * count * es, &what);
        self.check(
            &what,
            d,
            &got,
            |i| value(Vals::Sum, d, i / count, 0, i % count),
            0.0,
        );
    }

    fn broadcast(&self, d: DataType, count: usize, root: usize) {
        let what = format!("broadcast {d:?} x{count} from {root}");
        let len = count * d.size();
        let input = self.buffer(&bytes_of(Vals::Sum, d, self.rank, 0, count), len);
        let output = self.buffer(&[], len);
        // SAFETY: sizes as the call needs; synchronized below.
        unsafe {
            self.c.broadcast(
                input.ptr(),
                output.ptr(),
                count,
                d,
                root,
                &self.stream,
                None,
            )
        }
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", self.rank));
        self.finish(&what);
        let got = self.read(&output, len, &what);
        self.check(&what, d, &got, |i| value(Vals::Sum, d, root, 0, i), 0.0);
    }

    fn all_to_all(&self, d: DataType, count: usize) {
        let what = format!("all-to-all {d:?} x{count}");
        let (n, es) = (self.n, d.size());
        let mut all = Vec::new();
        for part in 0..n {
            all.extend(bytes_of(Vals::Sum, d, self.rank, part, count));
        }
        let input = self.buffer(&all, n * count * es);
        let output = self.buffer(&[], n * count * es);
        // SAFETY: sizes as the call needs; synchronized below.
        unsafe {
            self.c
                .all_to_all(input.ptr(), output.ptr(), count, d, &self.stream, None)
        }
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", self.rank));
        self.finish(&what);
        let got = self.read(&output, n * count * es, &what);
        // Part q of the output is part `rank` of rank q's input.
        self.check(
            &what,
            d,
            &got,
            |i| value(Vals::Sum, d, i / count, self.rank, i % count),
            0.0,
        );
    }

    fn send_recv_ring(&self, d: DataType, count: usize) {
        let what = format!("send_recv around the ring {d:?} x{count}");
        let (n, me) = (self.n, self.rank);
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let len = count * d.size();
        let input = self.buffer(&bytes_of(Vals::Sum, d, me, 0, count), len);
        let output = self.buffer(&[], len);
        // SAFETY: sizes as the call needs; synchronized below.
        unsafe {
            self.c.send_recv(
                input.ptr(),
                next,
                output.ptr(),
                prev,
                count,
                d,
                &self.stream,
            )
        }
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", self.rank));
        self.finish(&what);
        let got = self.read(&output, len, &what);
        self.check(&what, d, &got, |i| value(Vals::Sum, d, prev, 0, i), 0.0);
    }

    /// A reduce to `root` through the port collective: the non-roots pass no output (NCCL
    /// allows it) and write nothing; the root's output is the reference, bytes past it
    /// untouched.
    fn reduce(&self, op: Op, d: DataType, count: usize, root: usize) {
        let what = format!("reduce {op:?} {d:?} x{count} to {root}");
        let len = count * d.size();
        let input = self.buffer(&bytes_of(op.vals(), d, self.rank, 0, count), len);
        let output = self.buffer(&[], len);
        let out = if self.rank == root {
            output.ptr()
        } else {
            mscclpp::shared::DevicePtr::NULL
        };
        // SAFETY: the buffers hold `count` elements and outlive the synchronize below.
        unsafe {
            self.c.reduce(
                input.ptr(),
                out,
                count,
                d,
                self.reduction(op, d),
                root,
                &self.stream,
                None,
            )
        }
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", self.rank));
        self.finish(&what);
        let got = self.read(&output, len, &what);
        if self.rank == root {
            let tol = self.tolerance(op, d);
            self.check(&what, d, &got, |i| reference(&op, d, self.n, 0, i), tol);
        } else {
            assert!(
                got.iter().all(|&b| b == MARK),
                "rank {}: {what}: a non-root wrote",
                self.rank
            );
        }
    }

    /// What the point-to-point engine serves on one node, served across nodes as lone sends
    /// and receives over the PortChannels: gather and scatter (root `n - 1`), an all-to-all-v
    /// of parts of different sizes, and a group's sends to the next two ranks and receives from
    /// the previous two (of different sizes), every element checked.
    fn sends_and_receives_across_nodes(&self, d: DataType) {
        let (n, me, count) = (self.n, self.rank, 37);
        let (es, part) = (d.size(), count + 2 * n);
        let len = n * part * es;
        let mine = bytes_of(Vals::Sum, d, me, 0, n * part);
        let root = n - 1;
        let what = format!("gather {d:?} x{count} to {root}");
        let (input, output) = (self.buffer(&mine, len), self.buffer(&[], len));
        // SAFETY (each call): the buffers hold what the call moves and outlive the
        // synchronization after it.
        unsafe {
            self.c
                .gather(input.ptr(), output.ptr(), count, d, root, &self.stream)
        }
        .unwrap_or_else(|e| panic!("rank {me}: {what}: {e}"));
        self.finish(&what);
        if me == root {
            let got = self.read(&output, n * count * es, &what);
            self.check(
                &what,
                d,
                &got,
                |i| value(Vals::Sum, d, i / count, 0, i % count),
                0.0,
            );
        }
        let what = format!("scatter {d:?} x{count} from {root}");
        let output = self.buffer(&[], len);
        unsafe {
            self.c
                .scatter(input.ptr(), output.ptr(), count, d, root, &self.stream)
        }
        .unwrap_or_else(|e| panic!("rank {me}: {what}: {e}"));
        self.finish(&what);
        let got = self.read(&output, count * es, &what);
        self.check(
            &what,
            d,
            &got,
            |i| value(Vals::Sum, d, root, 0, me * count + i),
            0.0,
        );
        // All-to-all-v: rank q sends rank p `count + q + p` elements from offset `p * part`,
        // into offset `q * part` of rank p.
        let what = format!("all_to_allv {d:?}");
        let sizes = |q: usize| -> Vec<usize> { (0..n).map(|p| count + q + p).collect() };
        let displs: Vec<usize> = (0..n).map(|p| p * part).collect();
        let recv_sizes: Vec<usize> = (0..n).map(|q| count + q + me).collect();
        let output = self.buffer(&[], len);
        unsafe {
            self.c.all_to_allv(
                input.ptr(),
                &sizes(me),
                &displs,
                output.ptr(),
                &recv_sizes,
                &displs,
                d,
                &self.stream,
            )
        }
        .unwrap_or_else(|e| panic!("rank {me}: {what}: {e}"));
        self.finish(&what);
        let got = self.read(&output, len, &what);
        for q in 0..n {
            let at = q * part * es;
            self.check(
                &format!("{what} from {q}"),
                d,
                &got[at..at + recv_sizes[q] * es],
                |i| value(Vals::Sum, d, q, 0, me * part + i),
                0.0,
            );
        }
        // A group: to the next two ranks and from the previous two, `count + distance`
        // elements each.
        let what = format!("a group's sends and receives {d:?}");
        let output = self.buffer(&[], len);
        let mut g = self.c.group();
        for k in 1..=2.min(n - 1) {
            let (to, from) = ((me + k) % n, (me + n - k) % n);
            unsafe { g.send(input.ptr(), count + k, d, to) }.unwrap();
            let at = output.ptr().byte_add_cast(((k - 1) * part * es) as u64);
            unsafe { g.recv(at, count + k, d, from) }.unwrap();
        }
        g.end(&self.stream)
            .unwrap_or_else(|e| panic!("rank {me}: {what}: {e}"));
        self.finish(&what);
        let got = self.read(&output, len, &what);
        for k in 1..=2.min(n - 1) {
            let from = (me + n - k) % n;
            let at = (k - 1) * part * es;
            self.check(
                &format!("{what} from {from}"),
                d,
                &got[at..at + (count + k) * es],
                |i| value(Vals::Sum, d, from, 0, i),
                0.0,
            );
        }
    }

    /// Pairs (0, n-1), (1, n-2), …: the lower rank sends, the higher receives.
    fn send_then_recv(&self, d: DataType, count: usize) {
        let (n, me) = (self.n, self.rank);
        let partner = n - 1 - me;
        if partner == me {
            return;
        }
        let what = format!("send/recv {d:?} x{count} with {partner}");
        let len = count * d.size();
        let buf = if me < partner {
            let input = self.buffer(&bytes_of(Vals::Sum, d, me, 0, count), len);
            // SAFETY: `input` holds `count` elements; synchronized below.
            unsafe { self.c.send(input.ptr(), count, d, partner, &self.stream) }
                .unwrap_or_else(|e| panic!("rank {me}: {what}: {e}"));
            input
        } else {
            let output = self.buffer(&[], len);
            // SAFETY: as above.
            unsafe { self.c.recv(output.ptr(), count, d, partner, &self.stream) }
                .unwrap_or_else(|e| panic!("rank {me}: {what}: {e}"));
            output
        };
        self.finish(&what);
        if me > partner {
            let got = self.read(&buf, len, &what);
            self.check(&what, d, &got, |i| value(Vals::Sum, d, partner, 0, i), 0.0);
        }
    }
}

/// Counts of the size classes: a few elements (the latency path), below
/// `hier_small_max_bytes` on the CPU backend, and a prime count of several pipeline chunks of
/// `hier_chunk_bytes` with a tail.
const FEW: usize = 7;
const SMALL: usize = 600;
const LARGE: usize = 20_011;

/// Every check (module docs), the same calls in the same order on every rank; `light` runs
/// fewer sizes (the eight-rank world).
fn suite(comm: Communicator, light: bool, expect_hier: bool) {
    let comm = Arc::new(comm);
    let (rank, n) = (comm.rank(), comm.size());
    let cfg = CollectiveConfig::for_backend(comm.gpu().kind()).with_env();
    let c = Collectives::with_config(comm.clone(), cfg).expect("collectives");
    let gpu = comm.gpu().clone();
    // Registration maps the peers' memory: a world of one node only, refused (typed) here.
    let buf = gpu.alloc(64).unwrap();
    // SAFETY: `buf` outlives the (refused) registration.
    let got = unsafe { c.register_buffer(buf.ptr(), 64) };
    assert!(
        matches!(got, Err(Error::Unsupported { .. })),
        "register_buffer across nodes: {got:?}"
    );
    assert!(matches!(c.mem_alloc(64), Err(Error::Unsupported { .. })));
    let two = gpu.alloc(4).unwrap();
    two.copy_from_host(0, &2f32.to_le_bytes()).unwrap();
    let r = Rank {
        stream: gpu.stream().unwrap(),
        gpu,
        c,
        rank,
        n,
        two,
    };
    let t0 = Instant::now();
    // All-reduce: every type class at a size class each (rotating), f32 at every one.
    for (k, &d) in TYPES.iter().enumerate() {
        let counts = if light {
            [FEW, SMALL, LARGE][k % 3..k % 3 + 1].to_vec()
        } else {
            vec![[FEW, SMALL, LARGE][k % 3], [SMALL, LARGE, FEW][k % 3]]
        };
        for count in counts {
            r.all_reduce(Op::Sum, d, count, false);
        }
    }
    let algo = r.c.last_algorithm();
    let want = if expect_hier {
        Algorithm::Hierarchical
    } else {
        Algorithm::Port
    };
    assert_eq!(algo, Some(want), "rank {rank}: the all-reduce ran {algo:?}");
    r.all_reduce(Op::Sum, DataType::F32, LARGE, true);
    // Every operator, on a float and an integer type.
    for (k, op) in [
        Op::Prod,
        Op::Min,
        Op::Max,
        Op::Avg,
        Op::PreMul2,
        Op::PreMul2Device,
    ]
    .into_iter()
    .enumerate()
    {
        let counts = if light {
            vec![[SMALL, LARGE][k % 2]]
        } else {
            vec![FEW, LARGE]
        };
        for count in counts {
            r.all_reduce(op, DataType::F32, count, false);
            if op != Op::PreMul2Device {
                let d = [DataType::I32, DataType::BF16, DataType::I8][k % 3];
                r.all_reduce(op, d, count, false);
            }
        }
    }
    // Reduce-scatter.
    for (k, d) in [
        DataType::F32,
        DataType::F16,
        DataType::F8E4M3,
        DataType::I8,
        DataType::U64,
    ]
    .into_iter()
    .enumerate()
    {
        r.reduce_scatter(Op::Sum, d, [5, 1500][k % 2]);
    }
    r.reduce_scatter(Op::Avg, DataType::I32, 1501);
    r.reduce_scatter(Op::PreMul2, DataType::F64, 33);
    r.reduce_scatter(Op::Max, DataType::BF16, 700);
    // Moving data: two size classes each.
    r.all_gather(DataType::U8, 13);
    r.all_gather(DataType::F32, 3001);
    r.broadcast(DataType::F32, 3001, n - 1);
    r.broadcast(DataType::I8, 17, 0);
    r.all_to_all(DataType::F32, 1001);
    r.all_to_all(DataType::U8, 9);
    r.send_recv_ring(DataType::F32, 2500);
    r.send_recv_ring(DataType::U64, 3);
    r.send_then_recv(DataType::F16, 4099);
    r.reduce(Op::Sum, DataType::F32, 1001, 0);
    r.reduce(Op::Max, DataType::I32, 7, n - 1);
    r.reduce(Op::Sum, DataType::F16, LARGE, n / 2);
    r.reduce(Op::PreMul2, DataType::F32, SMALL, 1 % n);
    r.sends_and_receives_across_nodes(DataType::F32);
    r.send_recv_ring(DataType::I32, 5);
    comm.barrier().unwrap();
    println!(
        "MN_BYTES ofi={} ethernet={} transports={:?} in {:.1} s",
        r.c.network_bytes_sent(Transport::Ofi),
        r.c.network_bytes_sent(Transport::Ethernet),
        r.c.transports(),
        t0.elapsed().as_secs_f64()
    );
}

fn run_suite(test: &str, nodes: &[usize], over: Transport, env: &[(&str, &str)], light: bool) {
    if let Some((_, node)) = me() {
        if over == Transport::Ofi && !child_has_ofi() {
            return;
        }
        let sizes: Vec<usize> = (0..=*nodes.iter().max().unwrap())
            .map(|k| nodes.iter().filter(|&&x| x == k).count())
            .collect();
        let uniform = sizes.iter().all(|&s| s == sizes[0]);
        suite(child_communicator(node), light, uniform);
        return;
    }
    if !enough_gpus(test, nodes) {
        return;
    }
    let ends = world(test, nodes, env, &|_| Vec::new(), &|_, _| {});
    if over == Transport::Ofi && ofi_missing(test, &ends) {
        return;
    }
    expect_passed(test, &ends, over, nodes);
}

/// On the CUDA backend every rank of a node needs a GPU of its own (or a share of one,
/// `MSCCLPP_RANKS_PER_GPU`); ranks of different nodes may share one: they are different hosts
/// to the library. Prints NOT RUN and why when not.
fn enough_gpus(test: &str, nodes: &[usize]) -> bool {
    let per_node = nodes
        .iter()
        .map(|&k| nodes.iter().filter(|&&x| x == k).count())
        .max()
        .unwrap_or(0);
    harness::enough_gpus(&format!("{test} ({per_node} ranks on a node)"), per_node)
}

/// The CUDA paths of the transports between nodes with one GPU: two processes on GPU 0,
/// declared on two nodes, move GPU memory over `over` (libfabric: registered with `FI_HMEM`
/// where the provider has it, else staged through pinned host memory on both ends; Ethernet:
/// staged on both ends).
fn cuda_two_nodes(test: &str, over: Transport, env: &[(&str, &str)]) {
    if me().is_none() {
        match BackendKind::select() {
            Ok(BackendKind::Cuda) => {}
            _ => {
                println!("NOT RUN: {test}: needs CUDA (MSCCLPP_BACKEND=cuda and a GPU)");
                return;
            }
        }
    } else {
        assert_eq!(
            BackendKind::select().unwrap(),
            BackendKind::Cuda,
            "the child runs on the CUDA backend"
        );
    }
    run_suite(test, &[0, 1], over, env, true);
}

// ------------------------------------------------------------------------------------------
// The worlds
// ------------------------------------------------------------------------------------------

#[test]
fn two_nodes_of_one_rank_over_libfabric() {
    run_suite(
        "two_nodes_of_one_rank_over_libfabric",
        &[0, 1],
        Transport::Ofi,
        &[],
        false,
    );
}

#[test]
fn two_nodes_of_two_ranks_over_libfabric() {
    run_suite(
        "two_nodes_of_two_ranks_over_libfabric",
        &[0, 0, 1, 1],
        Transport::Ofi,
        &[],
        false,
    );
}

#[test]
fn two_nodes_of_four_ranks_over_libfabric() {
    run_suite(
        "two_nodes_of_four_ranks_over_libfabric",
        &[0, 0, 0, 0, 1, 1, 1, 1],
        Transport::Ofi,
        &[],
        true,
    );
}

#[test]
fn three_nodes_of_two_ranks_round_robin_over_libfabric() {
    run_suite(
        "three_nodes_of_two_ranks_round_robin_over_libfabric",
        &[0, 1, 2, 0, 1, 2],
        Transport::Ofi,
        &[],
        true,
    );
}

#[test]
fn two_nodes_of_two_ranks_over_ethernet() {
    run_suite(
        "two_nodes_of_two_ranks_over_ethernet",
        &[0, 0, 1, 1],
        Transport::Ethernet,
        // And a deeper pipeline of smaller chunks than the default.
        &[
            ("MSCCLPP_NET_TRANSPORT", "ethernet"),
            ("MSCCLPP_HIER_PIPELINE_DEPTH", "3"),
            ("MSCCLPP_HIER_CHUNK_BYTES", "8192"),
        ],
        false,
    );
}

#[test]
fn two_nodes_over_libfabric_in_messages_only() {
    run_suite(
        "two_nodes_over_libfabric_in_messages_only",
        &[0, 1],
        Transport::Ofi,
        &[("MSCCLPP_OFI_STAGED", "1")],
        true,
    );
}

#[test]
fn nodes_of_different_sizes_over_libfabric() {
    run_suite(
        "nodes_of_different_sizes_over_libfabric",
        &[0, 1, 0],
        Transport::Ofi,
        &[],
        true,
    );
}

#[test]
#[ignore = "needs CUDA"]
fn cuda_two_nodes_on_one_gpu_over_libfabric() {
    cuda_two_nodes(
        "cuda_two_nodes_on_one_gpu_over_libfabric",
        Transport::Ofi,
        &[],
    );
}

#[test]
#[ignore = "needs CUDA"]
fn cuda_two_nodes_on_one_gpu_over_libfabric_messages_only() {
    cuda_two_nodes(
        "cuda_two_nodes_on_one_gpu_over_libfabric_messages_only",
        Transport::Ofi,
        &[("MSCCLPP_OFI_STAGED", "1")],
    );
}

#[test]
#[ignore = "needs CUDA"]
fn cuda_two_nodes_on_one_gpu_over_ethernet() {
    cuda_two_nodes(
        "cuda_two_nodes_on_one_gpu_over_ethernet",
        Transport::Ethernet,
        &[("MSCCLPP_NET_TRANSPORT", "ethernet")],
    );
}

/// Both ranks of node 1 are killed (SIGKILL, by the test) while every rank is inside a stream
/// of large all-reduces; the survivors' collectives must end with a typed error within
/// [`RELEASE_WITHIN`], and a later call must fail or end at once.
#[test]
fn a_node_killed_mid_collective_aborts_the_survivors() {
    let test = "a_node_killed_mid_collective_aborts_the_survivors";
    let nodes = [0, 0, 1, 1];
    if let Some((rank, node)) = me() {
        if !child_has_ofi() {
            return;
        }
        let comm = Arc::new(child_communicator(node));
        let c = Collectives::new(comm.clone()).expect("collectives");
        let g = comm.gpu().clone();
        let stream = g.stream().unwrap();
        let count = 64 << 10;
        let buf = g.alloc(count * 4).unwrap();
        buf.copy_from_host(0, &vec![0u8; count * 4]).unwrap();
        let queue = || {
            // SAFETY: `buf` holds `count` f32 and outlives every wait below.
            unsafe {
                c.all_reduce(
                    buf.ptr(),
                    buf.ptr(),
                    count,
                    DataType::F32,
                    Reduction::Sum,
                    &stream,
                    None,
                )
            }
        };
        queue().unwrap();
        assert!(
            stream.synchronize_timeout(CALL_BOUND).unwrap(),
            "a good all-reduce hung"
        );
        comm.barrier().unwrap();
        println!("MN_INSIDE");
        let start = Instant::now();
        let ended = loop {
            if let Err(e) = queue() {
                break Some(e);
            }
            match stream.synchronize_timeout(RELEASE_WITHIN) {
                Ok(true) => {}
                Ok(false) => break None,
                Err(e) => break Some(e),
            }
            if let Some(e) = comm.status().error().or_else(|| comm.async_error()) {
                break Some(e);
            }
            assert!(start.elapsed() < WORLD_BOUND, "node 1 was never killed");
        };
        let waited = start.elapsed();
        let Some(e) = ended else {
            panic!(
                "rank {rank}: the all-reduce still waits for the dead node after {RELEASE_WITHIN:?}"
            );
        };
        let e = comm.async_error().unwrap_or(e);
        match &e {
            Error::Remote { rank: dead, .. } => assert!(*dead >= 2, "blames rank {dead}: {e}"),
            Error::Aborted { .. }
            | Error::Transport {
                kind: TransportErrorKind::PeerClosed,
                ..
            }
            | Error::Device { .. } => {}
            other => panic!("rank {rank}: not a typed death: {other}"),
        }
        let at_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        println!(
            "MN_RELEASED at_ns={at_ns} after {} ms: {e}",
            waited.as_millis()
        );
        let again = Instant::now();
        let finished = queue().is_err() || stream.synchronize_timeout(RELEASE_WITHIN).is_ok();
        assert!(finished, "a later all-reduce hung");
        println!("MN_LATER ended in {} ms", again.elapsed().as_millis());
        return;
    }
    if !enough_gpus(test, &nodes) {
        return;
    }
    let inside = std::sync::Mutex::new(0usize);
    let killed_at = std::sync::Mutex::new(0u128);
    let ends = world(test, &nodes, &[], &|_| Vec::new(), &|_, line| {
        if line.contains("MN_INSIDE") {
            let mut k = inside.lock().unwrap();
            *k += 1;
            if *k == 4 {
                std::thread::sleep(Duration::from_millis(300));
                *killed_at.lock().unwrap() = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                kill_node_one(test);
            }
        }
    });
    let killed_at = *killed_at.lock().unwrap();
    if ofi_missing(test, &ends) {
        return;
    }
    for r in [0, 1] {
        assert!(
            ends[r].success(),
            "survivor {r}:\n{}\nthe killed node's ranks:\n{}\n{}",
            ends[r].text(),
            ends[2].text(),
            ends[3].text()
        );
        let line = ends[r]
            .stdout
            .lines()
            .find(|l| l.contains("MN_RELEASED"))
            .unwrap();
        let at: u128 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("at_ns="))
            .and_then(|v| v.parse().ok())
            .unwrap();
        let after = Duration::from_nanos(at.saturating_sub(killed_at) as u64);
        assert!(
            after < RELEASE_WITHIN,
            "survivor {r} released {after:?} after the kill"
        );
        println!(
            "survivor {r}: released {} ms after the kill: {line}",
            after.as_millis()
        );
    }
    for r in [2, 3] {
        assert!(
            !ends[r].success(),
            "rank {r} of the killed node exited normally"
        );
    }
}

/// Kills the ranks of node 1 of the world started by `test` (their pids from /proc: children
/// of this process whose environment says node 1).
fn kill_node_one(test: &str) {
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid != Some(me) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let node_one = env
            .split(|&b| b == 0)
            .any(|kv| kv == format!("{ENV_NODE}=1").as_bytes());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let ours = cmdline.split(|&b| b == 0).any(|a| a == test.as_bytes());
        if node_one && ours {
            // SAFETY: SIGKILL of a child process of this test (checked by its parent pid).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// One rank forces Ethernet, the others libfabric: every rank's set-up fails with
/// `Error::NoCommonTransport` naming a rank of the other node (or `Error::Remote` from a peer
/// that failed first).
#[test]
fn ranks_forcing_different_transports_fail_typed() {
    let test = "ranks_forcing_different_transports_fail_typed";
    if let Some((rank, node)) = me() {
        if !child_has_ofi() {
            return;
        }
        let comm = Arc::new(child_communicator(node));
        match Collectives::new(comm.clone()) {
            Err(Error::NoCommonTransport { remote_rank, .. }) => {
                println!("MN_REFUSED rank {rank}: no common transport with {remote_rank}")
            }
            Err(Error::Remote { .. }) => println!("MN_REFUSED rank {rank}: a peer failed first"),
            Err(e) => panic!("rank {rank}: {e}"),
            Ok(_) => panic!("rank {rank}: set up without a common transport"),
        }
        return;
    }
    let per_rank = |r: usize| {
        let t = if r == 0 { "ethernet" } else { "ofi" };
        vec![("MSCCLPP_NET_TRANSPORT".to_string(), t.to_string())]
    };
    let ends = world(test, &[0, 1], &[], &per_rank, &|_, _| {});
    if ofi_missing(test, &ends) {
        return;
    }
    for (r, e) in ends.iter().enumerate() {
        assert!(
            e.success() && e.stdout.contains("MN_REFUSED"),
            "rank {r}:\n{}",
            e.text()
        );
    }
}
