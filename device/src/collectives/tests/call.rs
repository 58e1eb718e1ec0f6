//! One collective call on every rank of a [`World`]: its inputs (hashed data), its outputs
//! (all [`MARK`]), the launch, and the comparison of every output byte with the host
//! reference of its mode (`CollectiveMode`'s meaning of `bytes`, `stride` and `root`).

use std::format;
use std::time::Duration;
use std::vec;
use std::vec::Vec;

use super::world::{Buf, MARK, World, data, reduce};
use mscclpp_shared::{CollectiveMode, CollectiveParams, DataType, DeviceReduceOp};

/// Every operator the `_any` kernels serve, on the types the host reference knows: (type,
/// operator, scalar: the pre-multiplied sum's factor as f32 bits, the post-division's divisor).
pub const EVERY_REDUCTION: [(DataType, DeviceReduceOp, u32); 6] = [
    (DataType::I32, DeviceReduceOp::Min, 0),
    (DataType::I32, DeviceReduceOp::Max, 0),
    (DataType::I32, DeviceReduceOp::Prod, 0),
    (DataType::I32, DeviceReduceOp::SumPostDiv, 3),
    (DataType::F32, DeviceReduceOp::PreMulSum, 0x4020_0000), // 2.5
    (DataType::F32, DeviceReduceOp::Sum, 0),
];

/// A call: what every rank's parameters say.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub mode: CollectiveMode,
    pub dtype: DataType,
    pub op: DeviceReduceOp,
    /// The pre-multiplied sum's factor (f32 bits) or the post-division's divisor.
    pub scalar: u32,
    pub bytes: u64,
    /// Distance of the parts (0: `bytes`, the host's whole calls).
    pub stride: u64,
    pub root: u32,
    /// A different data seed per call of one test.
    pub seed: u32,
    /// Bytes from each buffer's (128-byte aligned) start to where the call's input and output
    /// begin (the kernels' paths for unaligned buffers).
    pub offset: u64,
}

impl Call {
    /// A call of `mode` on `bytes` of f32 sums.
    pub fn new(mode: CollectiveMode, bytes: u64) -> Self {
        Self {
            mode,
            dtype: DataType::F32,
            op: DeviceReduceOp::Sum,
            scalar: 0,
            bytes,
            stride: 0,
            root: 0,
            seed: 1,
            offset: 0,
        }
    }

    pub fn with(self, dtype: DataType, op: DeviceReduceOp) -> Self {
        Self { dtype, op, ..self }
    }

    pub fn stride(self, stride: u64) -> Self {
        Self { stride, ..self }
    }

    pub fn root(self, root: u32) -> Self {
        Self { root, ..self }
    }

    pub fn scalar(self, scalar: u32) -> Self {
        Self { scalar, ..self }
    }

    pub fn seed(self, seed: u32) -> Self {
        Self { seed, ..self }
    }

    pub fn offset(self, offset: u64) -> Self {
        Self { offset, ..self }
    }

    /// Rank `r`'s `root` (a two-rank exchange names its pair, `r ^ 1`; other calls name `root`).
    pub fn root_of(&self, r: u32) -> u32 {
        if self.mode == CollectiveMode::Send {
            r ^ 1
        } else {
            self.root
        }
    }

    fn stride_bytes(&self) -> usize {
        if self.stride == 0 {
            self.bytes as usize
        } else {
            self.stride as usize
        }
    }

    /// Parts of (input, output) of every rank.
    fn parts(&self, n: u32) -> (u32, u32) {
        use CollectiveMode::*;
        match self.mode {
            AllGather => (1, n),
            ReduceScatter => (n, 1),
            AllToAll => (n, n),
            _ => (1, 1),
        }
    }
}

/// Rounds up to 16.
fn up16(x: usize) -> usize {
    x.div_ceil(16) * 16
}

/// The buffers of one call on every rank, and the parameters that name them.
pub struct Buffers {
    pub inputs: Vec<Buf>,
    pub outputs: Vec<Buf>,
    pub params: Vec<CollectiveParams>,
    /// Every rank's input data (what the reference reads).
    data: Vec<Vec<u8>>,
}

/// Builds `c`'s buffers and parameters on every rank of `w` (`in_place`: the output is the
/// input, as NCCL allows for every collective whose output holds the input).
pub fn buffers(w: &World, c: &Call, in_place: bool) -> Buffers {
    let (pin, pout) = c.parts(w.n);
    let (len, stride) = (c.bytes as usize, c.stride_bytes());
    let extent = |parts: u32| up16(stride * (parts as usize - 1) + len);
    let mut data_of = Vec::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for r in 0..w.n {
        let d = data(c.dtype, c.seed, r, pin, len, stride);
        let mut padded = vec![MARK; c.offset as usize];
        padded.extend_from_slice(&d);
        padded.resize(c.offset as usize + extent(pin), MARK);
        inputs.push(Buf::from(&padded));
        data_of.push(d);
        if !in_place {
            outputs.push(Buf::new(c.offset as usize + extent(pout), MARK));
        }
    }
    let params = (0..w.n)
        .map(|r| {
            let input = inputs[r as usize].ptr().wrapping_add(c.offset);
            let output = if in_place {
                input
            } else {
                outputs[r as usize].ptr().wrapping_add(c.offset)
            };
            CollectiveParams {
                input,
                output,
                stride: stride as u64,
                dtype: c.dtype as u32,
                op: c.op as u32,
                root: c.root_of(r),
                scalar: c.scalar as u64,
                ..w.params(r, c.mode as u32, c.bytes)
            }
        })
        .collect();
    Buffers {
        inputs,
        outputs,
        params,
        data: data_of,
    }
}

impl Buffers {
    /// Rank `r`'s output (the input when in place).
    pub fn output(&self, r: u32) -> &Buf {
        self.outputs
            .get(r as usize)
            .unwrap_or(&self.inputs[r as usize])
    }

    /// Part `p` (of `len` bytes, `stride` apart) of rank `r`'s input data.
    fn part(&self, c: &Call, r: u32, p: u32) -> &[u8] {
        let (len, stride) = (c.bytes as usize, c.stride_bytes());
        &self.data[r as usize][p as usize * stride..p as usize * stride + len]
    }

    /// Compares every rank's output with the reference of `c` (`ranks`: the ranks that took
    /// part; the others' outputs must be untouched), and the slack after every buffer.
    pub fn check(&self, w: &World, c: &Call, ranks: &[u32]) {
        use CollectiveMode::*;
        let n = w.n;
        let len = c.bytes as usize;
        let stride = c.stride_bytes();
        let red = |parts: Vec<&[u8]>| reduce(c.dtype, c.op, c.scalar, &parts);
        let all_part = |p: u32| -> Vec<&[u8]> { (0..n).map(|q| self.part(c, q, p)).collect() };
        for r in 0..n {
            let got = self.output(r);
            let what = format!("{c:?}, rank {r} of {n}");
            got.check_slack(&what);
            // (offset, expected bytes) of every part this rank's output must hold.
            let want: Vec<(usize, Vec<u8>)> = if !ranks.contains(&r) {
                vec![]
            } else {
                match c.mode {
                    AllReduce | AllReducePut => vec![(0, red(all_part(0)))],
                    Reduce if r == c.root => vec![(0, red(all_part(0)))],
                    Reduce => vec![],
                    ReduceScatter => vec![(0, red(all_part(r)))],
                    AllGather => (0..n)
                        .map(|q| (q as usize * stride, self.part(c, q, 0).to_vec()))
                        .collect(),
                    AllToAll => (0..n)
                        .map(|q| (q as usize * stride, self.part(c, q, r).to_vec()))
                        .collect(),
                    Broadcast => vec![(0, self.part(c, c.root, 0).to_vec())],
                    // The LL kernels' two-rank exchange: each gets the other's data.
                    Send => vec![(0, self.part(c, c.root_of(r), 0).to_vec())],
                    _ => unreachable!("no reference for {:?}", c.mode),
                }
            };
            let in_place = self.outputs.is_empty();
            let bytes = &got.get()[c.offset as usize..];
            for (at, w) in &want {
                if let Some(i) = (0..len).find(|&i| bytes[at + i] != w[i]) {
                    panic!(
                        "{what}: byte {i} of the part at {at}: {:#04x}, expected {:#04x}",
                        bytes[at + i],
                        w[i]
                    );
                }
            }
            if !in_place {
                let head = &got.get()[..c.offset as usize];
                assert!(
                    head.iter().all(|&x| x == MARK),
                    "{what}: written before the output"
                );
                // Every byte outside the parts must still be the marker: a kernel writes
                // exactly `bytes` of each part of a caller's output, never its 16-byte
                // round-up (NCCL's callers pass buffers of exactly their count).
                let mut ok = vec![false; bytes.len()];
                for (at, _) in &want {
                    let end = (*at + len).min(bytes.len());
                    ok[*at..end].fill(true);
                }
                if let Some(i) = (0..bytes.len()).find(|&i| !ok[i] && bytes[i] != MARK) {
                    panic!(
                        "{what}: byte {i} outside every part was written ({:#04x})",
                        bytes[i]
                    );
                }
            }
        }
        for (r, b) in self.inputs.iter().enumerate() {
            b.check_slack(&format!("{c:?}, input of rank {r}"));
            if !self.outputs.is_empty() {
                let d = &self.data[r];
                assert_eq!(
                    &b.get()[c.offset as usize..][..d.len()],
                    &d[..],
                    "{c:?}: rank {r}'s input changed"
                );
            }
        }
    }
}

/// Runs `c` with `kernel` on every rank of `w` (`grid` blocks of `block` threads), in and out
/// of place where the mode allows it, and checks every output.
pub fn run(w: &World, kernel: unsafe fn(CollectiveParams), c: Call, grid: u32, block: u32) {
    let all: Vec<u32> = (0..w.n).collect();
    let b = buffers(w, &c, false);
    w.launch(kernel, &b.params, grid, block, 0);
    b.check(w, &c, &all);
}

/// [`run`] in place (the output is the input).
pub fn run_in_place(
    w: &World,
    kernel: unsafe fn(CollectiveParams),
    c: Call,
    grid: u32,
    block: u32,
) {
    let all: Vec<u32> = (0..w.n).collect();
    let b = buffers(w, &c, true);
    w.launch(kernel, &b.params, grid, block, 0);
    b.check(w, &c, &all);
}

/// `calls` calls of `c` (fresh buffers and data each) queued back to back on every rank as
/// on its own stream, rank `late` starting 50 ms after the others: every output right, so
/// no rank ran so far ahead that it overwrote packets a late reader had not read yet (what
/// the acks and the two halves guarantee: the module docs of `collectives`).
pub fn back_to_back(
    w: &World,
    k: unsafe fn(CollectiveParams),
    c: Call,
    late: u32,
    grid: u32,
    block: u32,
) {
    let calls: Vec<Buffers> = (0..4)
        .map(|i| buffers(w, &c.seed(c.seed + i), false))
        .collect();
    let streams: Vec<(Duration, Vec<CollectiveParams>)> = (0..w.n)
        .map(|r| {
            let delay = if r == late {
                Duration::from_millis(50)
            } else {
                Duration::ZERO
            };
            (delay, calls.iter().map(|b| b.params[r as usize]).collect())
        })
        .collect();
    let st = w.try_launch_streams(k, &streams, grid, block, 0);
    assert!(st.iter().all(|s| s.error_code == 0), "{c:?}: {st:?}");
    let all: Vec<u32> = (0..w.n).collect();
    for (i, b) in calls.iter().enumerate() {
        b.check(w, &c.seed(c.seed + i as u32), &all);
    }
}
