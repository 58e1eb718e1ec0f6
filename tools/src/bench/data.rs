//! Test data for `-c`: every rank's input part is a pseudo-random sequence of small integers
//! that depends on the rank, the part and the element index (period [`PERIOD`], a prime, so
//! a block, piece or chunk landing at a wrong offset is caught), and every output element is
//! checked against a host reference. The integers are small enough that every reduction over
//! all ranks is exact in every type, bf16, 8-bit integers and fp8 included, in any order of
//! reduction: sums (and the pre-multiplied sums, by 2) stay within what the type holds
//! exactly; products multiply values of -1, 1 and 2 (powers of two; integers wrap as the
//! kernels' do). The one inexact reduction is a floating-point average over a rank count that
//! is not a power of two (NCCL multiplies by 1/n rounded to the type): it is checked within
//! `(n + 1)·u·Σ|x|/n` (`u` the type's unit roundoff).
//!
//! Elements are encoded and decoded by the codec the tests use
//! (`mscclpp_test_support::codec`, written from the formats' definitions): the check never
//! goes through the library's own conversions, so a wrong conversion there cannot agree with
//! it. Integers wrap to the type's width, as the kernels' arithmetic does.

use mscclpp::shared::DataType;
use mscclpp_test_support::codec::{decode, encode_into as encode, unit_roundoff};
use mscclpp_test_support::mix;

use super::args::{PREMUL_SCALAR, Redop};

/// Elements before a pattern repeats (prime).
pub const PERIOD: usize = 4093;

/// Byte written into output buffers before a checked run: an element made of it is never one
/// of the expected small integers, so untouched output counts as wrong.
pub const SENTINEL: u8 = 0xA5;

fn unsigned(dtype: DataType) -> bool {
    matches!(dtype, DataType::U32 | DataType::U8 | DataType::U64)
}

/// Element `j` of rank `rank`'s part `part` (of `n` ranks) for reductions by `op`: a small
/// integer whose reductions over the `n` ranks are exact in the type (sums at most 256 in
/// magnitude, exact in bf16; 127 for 8-bit integers, 16 for e4m3 and 8 for e5m2; half of that
/// before a pre-multiplication by 2; on more ranks than that, the ranks past it contribute 0;
/// products of -1, 1 and 2, at most 2^8 on up to 8 ranks), non-negative for unsigned types.
/// Ops that do not reduce use `Redop::Sum`'s values.
pub fn value(dtype: DataType, op: Redop, n: usize, rank: usize, part: usize, j: usize) -> f64 {
    let h = mix(((rank as u64) << 44) ^ ((part as u64) << 24) ^ j as u64);
    if op == Redop::Prod {
        let choices: &[f64] = match (unsigned(dtype), n <= 8) {
            (true, _) => &[1.0, 2.0],
            (false, true) => &[-1.0, 1.0, 2.0],
            (false, false) => &[-1.0, 1.0],
        };
        return choices[(h % choices.len() as u64) as usize];
    }
    let mut most = match dtype {
        DataType::I8 | DataType::U8 => 127,
        DataType::F8E4M3 => 16,
        DataType::F8E5M2 => 8,
        _ => 256,
    };
    if op == Redop::PreMulSum {
        most /= PREMUL_SCALAR as usize;
    }
    // More ranks than the type's exact range: only the first `most` contribute (0 or 1 each).
    if rank >= most {
        return 0.0;
    }
    let span = (most / n.clamp(1, most)).clamp(2, 24) as u64;
    let v = h % span;
    if unsigned(dtype) {
        v as f64
    } else {
        v as f64 - (span / 3) as f64
    }
}

/// The reduction by `op` of every rank's value `xs`, and how far from it a result may be.
fn reduce(dtype: DataType, op: Redop, xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let exact = |v: f64| (v, 0.0);
    match op {
        Redop::Sum => exact(xs.iter().sum()),
        Redop::Prod => exact(xs.iter().product()),
        Redop::Min => exact(xs.iter().copied().fold(f64::INFINITY, f64::min)),
        Redop::Max => exact(xs.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
        Redop::PreMulSum => exact(xs.iter().map(|x| x * PREMUL_SCALAR).sum()),
        // Integers: the sum, divided once, truncating toward zero.
        Redop::Avg if !dtype.is_float() => exact((xs.iter().sum::<f64>() / n).trunc()),
        Redop::Avg => {
            let mass: f64 = xs.iter().map(|x| x.abs()).sum();
            let tol = 1.1 * (n + 1.0) * unit_roundoff(dtype) * mass / n;
            (xs.iter().sum::<f64>() / n, tol)
        }
    }
}

/// One period of a part's elements, encoded; element `i` of the part is element `i % PERIOD`.
/// A pattern of an inexact reduction also holds each element's value and tolerance.
#[derive(Clone, Debug)]
pub struct Pattern {
    dtype: DataType,
    bytes: Vec<u8>,
    within: Option<Vec<(f64, f64)>>,
}

impl Pattern {
    fn from_values(dtype: DataType, values: impl Iterator<Item = (f64, f64)>) -> Self {
        let mut bytes = Vec::with_capacity(PERIOD * dtype.size());
        let mut within = Vec::with_capacity(PERIOD);
        for (v, tol) in values {
            encode(dtype, v, &mut bytes);
            within.push((v, tol));
        }
        let inexact = within.iter().any(|&(_, tol)| tol > 0.0);
        Self {
            dtype,
            bytes,
            within: inexact.then_some(within),
        }
    }

    /// Rank `rank`'s input part `part` for reductions by `op` (`Redop::Sum` for the ops that
    /// do not reduce).
    pub fn input(dtype: DataType, op: Redop, n: usize, rank: usize, part: usize) -> Self {
        Self::from_values(
            dtype,
            (0..PERIOD).map(|j| (value(dtype, op, n, rank, part, j), 0.0)),
        )
    }

    /// The reduction by `op` of part `part` over all `n` ranks.
    pub fn reduced(dtype: DataType, op: Redop, n: usize, part: usize) -> Self {
        Self::from_values(
            dtype,
            (0..PERIOD).map(|j| {
                let xs: Vec<f64> = (0..n).map(|r| value(dtype, op, n, r, part, j)).collect();
                reduce(dtype, op, &xs)
            }),
        )
    }

    fn es(&self) -> usize {
        self.dtype.size()
    }

    /// Calls `f(range of out, range of the pattern)` for the runs of `len` elements starting
    /// at element `first` of the part.
    fn runs(
        &self,
        first: usize,
        len: usize,
        mut f: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
    ) {
        let es = self.es();
        let (mut i, end) = (first, first + len);
        while i < end {
            let j = i % PERIOD;
            let take = (PERIOD - j).min(end - i);
            let o = (i - first) * es;
            f(o..o + take * es, j * es..(j + take) * es);
            i += take;
        }
    }

    /// Writes elements `first ..` of the part into `out` (a whole number of elements).
    pub fn fill(&self, first: usize, out: &mut [u8]) {
        let len = out.len() / self.es();
        self.runs(first, len, |o, p| out[o].copy_from_slice(&self.bytes[p]));
    }

    /// How many elements of `got` (elements `first ..` of the part) differ from the pattern.
    /// Values are compared, so `-0.0` equals `0.0`; NaN never matches; an inexact reduction's
    /// elements may differ by their tolerance.
    pub fn count_wrong(&self, first: usize, got: &[u8]) -> u64 {
        let es = self.es();
        let mut wrong = 0;
        self.runs(first, got.len() / es, |o, p| {
            let (g, w) = (&got[o], &self.bytes[p.clone()]);
            if g == w {
                return;
            }
            for (k, (a, b)) in g.chunks_exact(es).zip(w.chunks_exact(es)).enumerate() {
                let v = decode(self.dtype, a);
                let ok = match &self.within {
                    Some(within) => {
                        let (want, tol) = within[p.start / es + k];
                        (v - want).abs() <= tol
                    }
                    None => v == decode(self.dtype, b),
                };
                wrong += u64::from(!ok);
            }
        });
        wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [DataType; 12] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I32,
        DataType::U32,
        DataType::I8,
        DataType::U8,
        DataType::I64,
        DataType::U64,
        DataType::F64,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Every reduction of every type is exact (the average of floats within its bound) and
    /// survives its encoding: the reference says what exact arithmetic says.
    #[test]
    fn values_are_exact_and_encode_round_trip() {
        for dtype in TYPES {
            for n in [1, 2, 3, 8, 16, 64] {
                for op in Redop::ALL {
                    let p = Pattern::reduced(dtype, op, n, 1);
                    for (j, e) in p.bytes.chunks_exact(dtype.size()).enumerate() {
                        let xs: Vec<f64> = (0..n).map(|r| value(dtype, op, n, r, 1, j)).collect();
                        let (want, tol) = reduce(dtype, op, &xs);
                        let inexact = op == Redop::Avg && dtype.is_float();
                        assert_eq!(tol > 0.0, inexact && xs.iter().any(|&x| x != 0.0));
                        if inexact {
                            continue;
                        }
                        // Integers wrap (products of 2s); everything else is exact.
                        let got = decode(dtype, e);
                        let bits = (dtype.size() * 8) as u32;
                        let wrapped = if dtype.is_float() {
                            want
                        } else {
                            let m = (want as i128).rem_euclid(1i128 << bits);
                            let signed = !unsigned(dtype) && m >= 1i128 << (bits - 1);
                            (if signed { m - (1i128 << bits) } else { m }) as f64
                        };
                        assert_eq!(got, wrapped, "{dtype:?} n={n} {op:?} j={j}");
                        if op != Redop::Prod {
                            assert!(want.abs() <= 256.0 && want.fract() == 0.0);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn data_depends_on_rank_part_and_index() {
        let a = Pattern::input(DataType::F16, Redop::Sum, 2, 0, 0);
        assert_ne!(
            a.bytes,
            Pattern::input(DataType::F16, Redop::Sum, 2, 1, 0).bytes
        );
        assert_ne!(
            a.bytes,
            Pattern::input(DataType::F16, Redop::Sum, 2, 0, 1).bytes
        );
        // Not periodic with any power of two below the period.
        for shift in [1, 2, 4, 8, 16, 64, 1024] {
            assert_ne!(a.bytes[..2 * 512], a.bytes[2 * shift..2 * (shift + 512)]);
        }
    }

    #[test]
    fn fill_and_check_tile_the_period() {
        for dtype in TYPES {
            let es = dtype.size();
            let p = Pattern::input(dtype, Redop::Sum, 4, 3, 2);
            let first = PERIOD - 5;
            let mut buf = vec![0u8; (2 * PERIOD + 17) * es];
            p.fill(first, &mut buf);
            assert_eq!(&buf[..5 * es], &p.bytes[(PERIOD - 5) * es..]);
            assert_eq!(&buf[5 * es..6 * es], &p.bytes[..es]);
            assert_eq!(p.count_wrong(first, &buf), 0);
            buf[7 * es] ^= 0x40;
            buf[(PERIOD + 9) * es + es - 1] ^= 0x01;
            assert_eq!(p.count_wrong(first, &buf), 2, "{dtype:?}");
            // The sentinel is never an expected value.
            let sentinel = vec![SENTINEL; 64 * es];
            assert_eq!(p.count_wrong(0, &sentinel), 64, "{dtype:?}");
            // Shifted by one element: nearly everything is wrong.
            assert!(
                p.count_wrong(first + 1, &buf) > PERIOD as u64 / 2,
                "{dtype:?}"
            );
        }
    }

    /// An inexact average accepts a result within its bound and nothing far from it.
    #[test]
    fn averages_of_floats_are_checked_within_their_bound() {
        let (dtype, n) = (DataType::F16, 3);
        let p = Pattern::reduced(dtype, Redop::Avg, n, 0);
        assert!(p.within.is_some());
        let mut buf = vec![0u8; 100 * 2];
        p.fill(0, &mut buf);
        assert_eq!(p.count_wrong(0, &buf), 0);
        let mut off = Vec::new();
        for j in 0..100 {
            let (v, _) = p.within.as_ref().unwrap()[j];
            encode(dtype, v + 1.0, &mut off);
        }
        assert_eq!(p.count_wrong(0, &off), 100);
    }
}
