//! Element-wise reduction for the collective kernels: every [`DataType`] × [`DeviceReduceOp`],
//! with the operator's scalar, on 8-byte units.
//!
//! ## Units
//!
//! The kernels move data in 8-byte units: an LL16 packet's payload, half of a 16-byte vector,
//! one or two per LL128 lane. Every boundary the host and the kernels cut a buffer at (parts,
//! chunks, sub-slices, packets, LL128 steps and lanes) is a multiple of 8 bytes from the
//! buffer's start, so a unit always holds whole elements: one 64-bit, two 32-bit, four 16-bit
//! or eight 8-bit lanes (a buffer's last unit may be cut short; its missing bytes read as zero
//! and are never written). Reducers work on units (`[u32; 2]`, low word first); below 64 bits
//! each 32-bit word is reduced on its own, so the sums of f16, bf16 and f32 compile to the
//! instructions they always did (`add.rn.f16x2`, `add.rn.bf16x2`, `add.f32`).
//!
//! A reduction is `post(pre(x₀) ⊕ pre(x₁) ⊕ …)` ([`Reduce`]): `pre` multiplies a contribution
//! by the scalar (pre-multiplied sums), `fold` is `⊕` with `pre` applied to its second operand,
//! and `post` divides the result (integer averages). Every algorithm reduces each element at
//! exactly one place (its owner in the two-shot ones, which then forward the result), applying
//! `pre` to each contribution as it enters that reduction and `post` once before the result is
//! stored or forwarded: each contribution is multiplied once and each result divided once.
//!
//! Three reducers implement [`Reduce`]. [`CommonSum`] adds f16, bf16 or f32 inline, and
//! [`InlineSum`] does the same or first multiplies each contribution by the scalar (the
//! pre-multiplied sums and floating averages of those types), and nothing else: the main
//! collective kernels use them, with a constant type, so that neither their loops nor their
//! registers pay for the other types. [`Reducer`] serves every type and operator: the
//! common sums inline, everything else through one out-of-line call per unit (`fold_any`,
//! `pre_any`, `post_any`, with scalar arguments only, so that no call touches the stack): the
//! `_any` twins of the collective kernels use it (`crate::collectives`).
//!
//! ## What NCCL does, and what this does
//!
//! From NCCL 2.2x (`src/device/reduce_kernel.h`, `hostToDevRedOp` in `src/enqueue.cc`), the
//! ring and tree kernels, which are the reference here:
//!
//! - **Every operator on every type**: sum, product, min, max, average and pre-multiplied sum
//!   on all twelve types.
//! - **In the element type**: f16 sums and products with `__hadd2` / `__hmul2`; bf16 with the
//!   bf16 forms on sm_80 and newer (through f32 before); fp8 (sm_90) by widening both operands
//!   to half, one half2 add or multiply, and converting back with round-to-nearest-even,
//!   saturating to the largest finite value (`cvt.rn.satfinite`). So every step of a
//!   reduction rounds to the element type (fp8 saturates at ±448 / ±57344 at every step, and
//!   an e5m2 infinity comes out of any operation as ±57344). The
//!   same here: `add.rn.f16x2`, `mul.rn.f16x2`, `add.rn.bf16x2` / `mul.rn.bf16x2` (sm_90
//!   builds), `cvt.rn.f16x2.e4m3x2` and `cvt.rn.satfinite.e4m3x2.f16x2` and their e5m2 forms
//!   (sm_90 builds); the software path (the CPU backend, older targets) gives the same bits,
//!   see below.
//! - **Min and max**: `fminf`/`fmaxf`, `fmin`/`fmax`, `__hmin2`/`__hmax2`: a NaN operand yields
//!   the other one, two NaNs a NaN, and −0 counts below +0; fp8 through half. Integers compare
//!   as signed or unsigned values (NCCL's xor-mask compare). The same here.
//! - **Integers** wrap: sums, products and pre-multiplications are modulo 2^bits.
//! - **Average**: a pre-multiplied sum by `1/n` for floating types, the scalar rounded to the
//!   element type first (f16 `1/3` → 0.33325, e4m3 `1/3` → 0.34375: NCCL's fp8 averages are
//!   that coarse), and for integers a sum followed by one division by `n`, truncating toward
//!   zero (signed values by magnitude). The lowering is the host's
//!   (`mscclpp::collectives::Reduction`); the kernels see [`DeviceReduceOp::PreMulSum`] and
//!   [`DeviceReduceOp::SumPostDiv`]. (NCCL 2.27's symmetric-memory kernels instead sum 16-bit
//!   floats in f32 and multiply by `1/n` at the end.)
//! - **Pre-multiplied sum** (`ncclRedOpCreatePreMulSum`): every contribution times the scalar
//!   in the element type (fp8: the scalar widened to half, the product rounded back to fp8),
//!   then summed. The scalar comes by value or from device memory (`ncclScalarDevice`), which
//!   a kernel reads when it starts ([`Reducer::from_params`]). NCCL multiplies each rank's
//!   input by that rank's scalar; here the rank that reduces an element multiplies every
//!   contribution by its own, so every rank must pass the same value (as averaging and
//!   gradient scaling do), and then the two agree.
//!
//! ## Tolerance against NCCL
//!
//! Integer operators, min and max: identical bits (the order of a reduction does not matter
//! to them). Floating sums, products, averages and pre-multiplied sums round at every step in
//! the element type as NCCL does, but in another order (here: the reducing rank's own
//! contribution first, then the others by rank; NCCL: its ring's order), so for `n` ranks each
//! result lies within `(n − 1)·u·Σ|x_r|` of the exact one (`x_r` the contributions after any
//! pre-multiplication, which itself rounds once; `u` = 2⁻²⁴ f32, 2⁻⁵³ f64, 2⁻¹¹ f16, 2⁻⁸
//! bf16, 2⁻⁴ e4m3, 2⁻³ e5m2; fp8 also saturates) and the two results within twice that. With
//! two ranks, or any order-free case, they are identical. NaN payloads are not specified (both
//! give a NaN).
//!
//! ## The software path
//!
//! It computes f16 and bf16 operations in f32 and rounds once to the type. A sum or product of
//! two halves (or bfloat16s) is exact in f32 or rounded there with 24 ≥ 2·11 + 2 bits, so the
//! second rounding gives the correctly rounded result that the GPU's `.rn` instructions give
//! (one exception: bfloat16 products smaller than 2⁻¹²⁶, where f32 is subnormal, may differ
//! in their last bit). fp8 conversions follow NVIDIA's own emulation (`cuda_fp8.hpp`): NaN to
//! `0x7f`, beyond the largest finite value (infinities too) to it, ties to even, below half
//! the smallest subnormal to a signed zero; fp8 to half is exact (a NaN becomes `0x7fff`).

use crate::arch;
use mscclpp_shared::{CollectiveParams, DataType, DeviceReduceOp};

mod convert;

pub use convert::{
    Fp8, bf16_to_f32, f16_to_f32_soft, f16_to_fp8_soft, f16x2_to_fp8x2_soft, f32_to_bf16,
    f32_to_f16_soft, f32_to_fp8, fp8_format, fp8_to_f16_soft, fp8_to_f32, fp8x2_to_f16x2_soft,
};
use convert::{narrow, widen};

// ------------------------------------------------------------------------------------------
// Lanes
// ------------------------------------------------------------------------------------------

/// NCCL's floating min / max on raw bits: a NaN operand yields the other, two NaNs `nan`;
/// equal values are the same bits or two zeros, of which min takes −0 (the bits or'ed) and
/// max +0 (and'ed).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn min_max<T>(
    a: T,
    b: T,
    a_nan: bool,
    b_nan: bool,
    a_lt_b: bool,
    b_lt_a: bool,
    max: bool,
    nan: T,
) -> T
where
    T: Copy + core::ops::BitAnd<Output = T> + core::ops::BitOr<Output = T>,
{
    if a_nan && b_nan {
        nan
    } else if a_nan {
        b
    } else if b_nan {
        a
    } else if a_lt_b {
        if max { b } else { a }
    } else if b_lt_a {
        if max { a } else { b }
    } else if max {
        a & b
    } else {
        a | b
    }
}

macro_rules! int_op {
    ($name:ident, $u:ty, $i:ty) => {
        /// `op` on two integer lanes (signed or not); the sums of pre-multiplied sums and
        /// averages are sums.
        #[inline(always)]
        fn $name(a: $u, b: $u, op: DeviceReduceOp, signed: bool) -> $u {
            match op {
                DeviceReduceOp::Min | DeviceReduceOp::Max => {
                    let a_lt_b = if signed { (a as $i) < (b as $i) } else { a < b };
                    if a_lt_b == (op == DeviceReduceOp::Min) {
                        a
                    } else {
                        b
                    }
                }
                DeviceReduceOp::Prod => a.wrapping_mul(b),
                _ => a.wrapping_add(b),
            }
        }
    };
}
int_op!(int8_op, u8, i8);
int_op!(int32_op, u32, i32);
int_op!(int64_op, u64, i64);

/// `f` on each of the four bytes of `a` and `b`.
#[inline(always)]
fn bytes(a: u32, b: u32, f: impl Fn(u8, u8) -> u8) -> u32 {
    let mut r = 0;
    for k in 0..4 {
        r |= (f((a >> (8 * k)) as u8, (b >> (8 * k)) as u8) as u32) << (8 * k);
    }
    r
}

/// `f` on each of the two 16-bit halves of `a` and `b`.
#[inline(always)]
fn halves(a: u32, b: u32, f: impl Fn(u16, u16) -> u16) -> u32 {
    f(a as u16, b as u16) as u32 | (f((a >> 16) as u16, (b >> 16) as u16) as u32) << 16
}

#[inline(always)]
fn f32_op(a: u32, b: u32, op: DeviceReduceOp) -> u32 {
    let (x, y) = (f32::from_bits(a), f32::from_bits(b));
    match op {
        DeviceReduceOp::Min | DeviceReduceOp::Max => {
            let max = op == DeviceReduceOp::Max;
            min_max(a, b, x.is_nan(), y.is_nan(), x < y, y < x, max, 0x7fff_ffff)
        }
        DeviceReduceOp::Prod => (x * y).to_bits(),
        _ => (x + y).to_bits(),
    }
}

#[inline(always)]
fn f64_op(a: u64, b: u64, op: DeviceReduceOp) -> u64 {
    let (x, y) = (f64::from_bits(a), f64::from_bits(b));
    match op {
        DeviceReduceOp::Min | DeviceReduceOp::Max => {
            let max = op == DeviceReduceOp::Max;
            min_max(
                a,
                b,
                x.is_nan(),
                y.is_nan(),
                x < y,
                y < x,
                max,
                0x7fff_ffff_ffff_ffff,
            )
        }
        DeviceReduceOp::Prod => (x * y).to_bits(),
        _ => (x + y).to_bits(),
    }
}

/// `op` on one 16-bit float lane of either kind, through f32 (`to` / `from` convert).
#[inline(always)]
fn half_lane(a: u16, b: u16, op: DeviceReduceOp, to: fn(u16) -> f32, from: fn(f32) -> u16) -> u16 {
    let (x, y) = (to(a), to(b));
    match op {
        DeviceReduceOp::Min | DeviceReduceOp::Max => {
            let max = op == DeviceReduceOp::Max;
            min_max(a, b, x.is_nan(), y.is_nan(), x < y, y < x, max, 0x7fff)
        }
        DeviceReduceOp::Prod => from(x * y),
        _ => from(x + y),
    }
}

/// `op` on two f16 lanes: the packed GPU instructions for sums and products, else through f32.
#[inline(always)]
fn f16x2_op(a: u32, b: u32, op: DeviceReduceOp) -> u32 {
    let hw = match op {
        DeviceReduceOp::Min | DeviceReduceOp::Max => None,
        DeviceReduceOp::Prod => arch::mul_f16x2(a, b),
        _ => arch::add_f16x2(a, b),
    };
    if let Some(r) = hw {
        return r;
    }
    halves(a, b, |x, y| {
        half_lane(x, y, op, arch::cvt_f32_f16, arch::cvt_rn_f16_f32)
    })
}

/// `op` on two bf16 lanes: the packed GPU instructions (sm_90) for sums and products, else
/// through f32.
#[inline(always)]
fn bf16x2_op(a: u32, b: u32, op: DeviceReduceOp) -> u32 {
    let hw = match op {
        DeviceReduceOp::Min | DeviceReduceOp::Max => None,
        DeviceReduceOp::Prod => arch::mul_bf16x2(a, b),
        _ => arch::add_bf16x2(a, b),
    };
    if let Some(r) = hw {
        return r;
    }
    halves(a, b, |x, y| half_lane(x, y, op, bf16_to_f32, f32_to_bf16))
}

/// `op` on four fp8 lanes: each pair widened to halves, one f16x2 operation, narrowed back
/// (NCCL's sm_90 path). `b` is already widened when `b_is_f16x2` (the pre-multiplication's
/// scalar pair), for both pairs.
#[inline(always)]
fn fp8_word(a: u32, b: u32, op: DeviceReduceOp, f: Fp8, b_is_f16x2: bool) -> u32 {
    let pair = |x: u16, y: u16| {
        let wy = if b_is_f16x2 { b } else { widen(y, f) };
        narrow(f16x2_op(widen(x, f), wy, op), f)
    };
    pair(a as u16, b as u16) as u32 | (pair((a >> 16) as u16, (b >> 16) as u16) as u32) << 16
}

/// `x / d` for `recip = (2^64 - 1) / d` (`d >= 1`): one high multiplication and one
/// correction, as NCCL divides (the estimate is at most one short).
#[inline(always)]
fn div_u64(x: u64, d: u64, recip: u64) -> u64 {
    let q = ((x as u128 * recip as u128) >> 64) as u64;
    if x.wrapping_sub(q.wrapping_mul(d)) >= d {
        q.wrapping_add(1)
    } else {
        q
    }
}

/// `x / d` truncated toward zero, `x` signed when `signed` (as a sign-extended `i64`).
#[inline(always)]
fn div_lane(x: u64, signed: bool, d: u64, recip: u64) -> u64 {
    let negative = signed && (x as i64) < 0;
    let magnitude = if negative {
        (x as i64).unsigned_abs()
    } else {
        x
    };
    let q = div_u64(magnitude, d, recip);
    if negative { q.wrapping_neg() } else { q }
}

// ------------------------------------------------------------------------------------------
// The reducer
// ------------------------------------------------------------------------------------------

/// How an `_any` kernel reduces: the call's type, operator and scalar, decoded once when it
/// starts; every type and operator ([`Reduce`], and the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Reducer {
    /// The element type.
    pub dtype: DataType,
    /// The operator.
    pub op: DeviceReduceOp,
    /// [`DeviceReduceOp::PreMulSum`]: the scalar as the lanes use it (8-bit integers: in every
    /// byte; 16-bit floats: a pair of it; fp8: it widened to a pair of halves; others: its
    /// bits); [`DeviceReduceOp::SumPostDiv`]: the divisor.
    arg: u64,
    /// [`DeviceReduceOp::SumPostDiv`]: `(2^64 - 1) / divisor` (0 for a zero divisor).
    recip: u64,
}

impl Reducer {
    /// A reducer for an operator without a scalar (sum, min, max, product), or a copy (any
    /// type with `Sum`, whose [`pre`](Self::pre) and [`post`](Self::post) do nothing).
    #[inline(always)]
    pub const fn plain(dtype: DataType, op: DeviceReduceOp) -> Self {
        Self {
            dtype,
            op,
            arg: 0,
            recip: 0,
        }
    }

    /// A reducer for `op` on `dtype` with its `scalar` ([`CollectiveParams::scalar`]'s
    /// meaning), or `None` for a pair no kernel serves (a post-division of a float).
    #[inline(always)]
    pub fn new(dtype: DataType, op: DeviceReduceOp, scalar: u64) -> Option<Self> {
        if !op.serves(dtype) {
            return None;
        }
        let mut r = Self::plain(dtype, op);
        match op {
            DeviceReduceOp::PreMulSum => {
                let s16 = scalar & 0xffff;
                r.arg = match dtype {
                    DataType::F16 | DataType::BF16 => s16 | s16 << 16,
                    DataType::F8E4M3 => widen((scalar as u16 & 0xff) * 0x101, Fp8::E4M3) as u64,
                    DataType::F8E5M2 => widen((scalar as u16 & 0xff) * 0x101, Fp8::E5M2) as u64,
                    DataType::I8 | DataType::U8 => (scalar & 0xff) * 0x0101_0101_0101_0101,
                    DataType::F32 | DataType::I32 | DataType::U32 => scalar & 0xffff_ffff,
                    DataType::I64 | DataType::U64 | DataType::F64 => scalar,
                };
            }
            DeviceReduceOp::SumPostDiv => {
                r.arg = scalar;
                r.recip = u64::MAX.checked_div(scalar).unwrap_or(0);
            }
            _ => {}
        }
        Some(r)
    }

    /// The reducer a collective kernel's parameters ask for: `None` when the type or operator
    /// is one this build does not know, or a pair no kernel serves (the kernel then does
    /// nothing). A pre-multiplied sum with `scalar_ptr` set reads its scalar there.
    #[inline(always)]
    pub fn from_params(p: &CollectiveParams) -> Option<Self> {
        let dtype = DataType::from_u32(p.dtype)?;
        let op = DeviceReduceOp::from_u32(p.op)?;
        let mut scalar = p.scalar;
        if op == DeviceReduceOp::PreMulSum && !p.scalar_ptr.is_null() {
            let at = p.scalar_ptr.as_ptr() as *const u8;
            scalar = 0;
            for k in 0..dtype.size() {
                // SAFETY: the host passes the address of one element of `dtype` in device
                // memory, valid while the kernel runs (`CollectiveParams::scalar_ptr`); read
                // byte by byte, so any alignment will do.
                scalar |= (unsafe { at.add(k).read() } as u64) << (8 * k);
            }
        }
        Self::new(dtype, op, scalar)
    }

    /// Whether [`pre`](Self::pre) changes anything.
    #[inline(always)]
    fn multiplies(&self) -> bool {
        self.op == DeviceReduceOp::PreMulSum
    }

    /// Whether [`post`](Self::post) changes anything.
    #[inline(always)]
    fn divides(&self) -> bool {
        self.op == DeviceReduceOp::SumPostDiv
    }

    /// Whether this is one of the common sums (f16, bf16, f32), which kernels reduce inline;
    /// every other pair goes through one call of `fold_any` and its kin, so that the type
    /// dispatch of all the others does not weigh on the kernels' registers.
    #[inline(always)]
    fn inline_sum(&self) -> bool {
        self.op.is_common_sum(self.dtype)
    }
}

/// A reduction as the kernels' loops apply it (see the module docs): [`Reducer`] serves every
/// type and operator, [`CommonSum`] the common sums only, inline and without calls (what the
/// main collective kernels use, so that nothing else weighs on their registers).
pub trait Reduce: Copy {
    /// One contribution as it enters a reduction: multiplied by the scalar for a
    /// pre-multiplied sum, else unchanged.
    fn pre(&self, w: [u32; 2]) -> [u32; 2];

    /// `acc` combined (sum, product, min or max, lane by lane) with the contribution `w`,
    /// which [`pre`](Self::pre) is applied to first.
    fn fold(&self, acc: [u32; 2], w: [u32; 2]) -> [u32; 2];

    /// The result of a reduction, divided once by the divisor for an integer average, else
    /// unchanged.
    fn post(&self, w: [u32; 2]) -> [u32; 2];

    /// [`pre`](Self::pre) on a 16-byte vector (two units).
    #[inline(always)]
    fn pre_v4(&self, v: [u32; 4]) -> [u32; 4] {
        let (a, b) = (self.pre([v[0], v[1]]), self.pre([v[2], v[3]]));
        [a[0], a[1], b[0], b[1]]
    }

    /// [`fold`](Self::fold) on a 16-byte vector (two units).
    #[inline(always)]
    fn fold_v4(&self, acc: [u32; 4], w: [u32; 4]) -> [u32; 4] {
        let a = self.fold([acc[0], acc[1]], [w[0], w[1]]);
        let b = self.fold([acc[2], acc[3]], [w[2], w[3]]);
        [a[0], a[1], b[0], b[1]]
    }

    /// [`post`](Self::post) on a 16-byte vector (two units).
    #[inline(always)]
    fn post_v4(&self, v: [u32; 4]) -> [u32; 4] {
        let (a, b) = (self.post([v[0], v[1]]), self.post([v[2], v[3]]));
        [a[0], a[1], b[0], b[1]]
    }
}

/// A sum of f16, bf16 or f32 ([`DeviceReduceOp::is_common_sum`]; any other type adds as f32),
/// inline: the packed GPU additions, no calls. With a constant type (the main kernels'
/// loops, see `with_reducer!` in `crate::collectives`) it compiles to the additions alone.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CommonSum(pub DataType);

impl CommonSum {
    /// The reducer of a copy: [`pre`](Reduce::pre) and [`post`](Reduce::post) change nothing
    /// (code that copies never folds).
    pub const COPY: Self = Self(DataType::F32);
}

/// One word of a common sum.
#[inline(always)]
fn sum_word(dtype: DataType, a: u32, b: u32) -> u32 {
    match dtype {
        DataType::F16 => f16x2_op(a, b, DeviceReduceOp::Sum),
        DataType::BF16 => bf16x2_op(a, b, DeviceReduceOp::Sum),
        _ => f32_op(a, b, DeviceReduceOp::Sum),
    }
}

impl Reduce for CommonSum {
    #[inline(always)]
    fn pre(&self, w: [u32; 2]) -> [u32; 2] {
        w
    }

    #[inline(always)]
    fn fold(&self, acc: [u32; 2], w: [u32; 2]) -> [u32; 2] {
        [
            sum_word(self.0, acc[0], w[0]),
            sum_word(self.0, acc[1], w[1]),
        ]
    }

    #[inline(always)]
    fn post(&self, w: [u32; 2]) -> [u32; 2] {
        w
    }
}

/// A sum or a pre-multiplied sum of f16, bf16 or f32 ([`DeviceReduceOp::is_inline`]: the
/// sums, NCCL's `ncclRedOpCreatePreMulSum` and the floating averages), inline: a pre-multiplied
/// sum multiplies every contribution by the scalar with the packed GPU multiplications
/// (`mul.rn.f16x2`, `mul.rn.bf16x2`, `mul.f32`), then both add as [`CommonSum`] does; no
/// calls. Whether it multiplies is one flag, the same for every unit of a launch, so one loop
/// of a kernel serves both (its registers pay for the scalar and the flag, not for a second
/// loop). The main kernels use it with a constant type (`with_reducer!` in
/// `crate::collectives`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct InlineSum {
    /// The element type (f16, bf16 or f32).
    pub dtype: DataType,
    /// Whether this is a pre-multiplied sum.
    pub multiplies: bool,
    /// Its scalar as one 32-bit word of lanes: f16 and bf16 a pair of it, f32 its bits.
    pub scalar: u32,
}

impl InlineSum {
    /// The inline form of `r`, a sum or pre-multiplied sum of f16, bf16 or f32, with its type
    /// fixed to `dtype` (the constant the caller's branch knows; `r.dtype` is the same).
    #[inline(always)]
    pub fn of(dtype: DataType, r: &Reducer) -> Self {
        Self {
            dtype,
            multiplies: r.multiplies(),
            scalar: r.arg as u32,
        }
    }

    #[inline(always)]
    fn times(&self, x: u32) -> u32 {
        match self.dtype {
            DataType::F16 => f16x2_op(x, self.scalar, DeviceReduceOp::Prod),
            DataType::BF16 => bf16x2_op(x, self.scalar, DeviceReduceOp::Prod),
            _ => (f32::from_bits(x) * f32::from_bits(self.scalar)).to_bits(),
        }
    }
}

impl Reduce for InlineSum {
    #[inline(always)]
    fn pre(&self, w: [u32; 2]) -> [u32; 2] {
        if self.multiplies {
            [self.times(w[0]), self.times(w[1])]
        } else {
            w
        }
    }

    #[inline(always)]
    fn fold(&self, acc: [u32; 2], w: [u32; 2]) -> [u32; 2] {
        let w = self.pre(w);
        [
            sum_word(self.dtype, acc[0], w[0]),
            sum_word(self.dtype, acc[1], w[1]),
        ]
    }

    #[inline(always)]
    fn post(&self, w: [u32; 2]) -> [u32; 2] {
        w
    }
}

impl Reduce for Reducer {
    #[inline(always)]
    fn pre(&self, w: [u32; 2]) -> [u32; 2] {
        if self.multiplies() {
            self.pre_call(w)
        } else {
            w
        }
    }

    #[inline(always)]
    fn fold(&self, acc: [u32; 2], w: [u32; 2]) -> [u32; 2] {
        if self.inline_sum() {
            CommonSum(self.dtype).fold(acc, w)
        } else {
            self.fold_call(acc, w)
        }
    }

    #[inline(always)]
    fn post(&self, w: [u32; 2]) -> [u32; 2] {
        if self.divides() { self.post_call(w) } else { w }
    }
}

// The out-of-line reductions: every type and operator but the common sums. On nvptx these are
// real calls (`#[inline(never)]`), made only by the kernels' generic paths, with scalar
// parameters only (an aggregate argument would go through the stack).

/// The reducer's fields as a call passes them.
#[inline(always)]
fn unpack(dtype: u32, op: u32, arg: u64, recip: u64) -> Reducer {
    Reducer {
        dtype: DataType::from_u32(dtype).unwrap_or(DataType::U32),
        op: DeviceReduceOp::from_u32(op).unwrap_or(DeviceReduceOp::Sum),
        arg,
        recip,
    }
}

impl Reducer {
    /// [`Reducer::pre`] out of line.
    #[inline(always)]
    fn pre_call(&self, w: [u32; 2]) -> [u32; 2] {
        split(pre_any(
            self.dtype as u32,
            self.op as u32,
            self.arg,
            join(w),
        ))
    }

    /// [`Reducer::fold`] out of line.
    #[inline(always)]
    fn fold_call(&self, acc: [u32; 2], w: [u32; 2]) -> [u32; 2] {
        let (d, o) = (self.dtype as u32, self.op as u32);
        split(fold_any(d, o, self.arg, join(acc), join(w)))
    }

    /// [`Reducer::post`] out of line.
    #[inline(always)]
    fn post_call(&self, w: [u32; 2]) -> [u32; 2] {
        let (d, o) = (self.dtype as u32, self.op as u32);
        split(post_any(d, o, self.arg, self.recip, join(w)))
    }
}

/// [`Reducer::pre`] for a pre-multiplied sum.
#[inline(never)]
fn pre_any(dtype: u32, op: u32, arg: u64, w: u64) -> u64 {
    pre_unit(unpack(dtype, op, arg, 0), w)
}

/// [`Reducer::fold`] for every type and operator.
#[inline(never)]
fn fold_any(dtype: u32, op: u32, arg: u64, acc: u64, w: u64) -> u64 {
    let r = unpack(dtype, op, arg, 0);
    let w = if r.multiplies() { pre_unit(r, w) } else { w };
    combine_unit(r, acc, w)
}

/// [`Reducer::post`] for an integer average.
#[inline(never)]
fn post_any(dtype: u32, op: u32, arg: u64, recip: u64, w: u64) -> u64 {
    post_unit(unpack(dtype, op, arg, recip), w)
}

/// One unit times the scalar.
#[inline(always)]
fn pre_unit(r: Reducer, w: u64) -> u64 {
    let s = r.arg;
    let word = |x: u32| {
        let s = s as u32;
        match r.dtype {
            DataType::F32 => (f32::from_bits(x) * f32::from_bits(s)).to_bits(),
            DataType::I32 | DataType::U32 => x.wrapping_mul(s),
            DataType::I8 | DataType::U8 => bytes(x, s, |v, k| v.wrapping_mul(k)),
            DataType::F16 => f16x2_op(x, s, DeviceReduceOp::Prod),
            DataType::BF16 => bf16x2_op(x, s, DeviceReduceOp::Prod),
            DataType::F8E4M3 => fp8_word(x, s, DeviceReduceOp::Prod, Fp8::E4M3, true),
            DataType::F8E5M2 => fp8_word(x, s, DeviceReduceOp::Prod, Fp8::E5M2, true),
            DataType::I64 | DataType::U64 | DataType::F64 => x, // whole units, below
        }
    };
    match r.dtype {
        DataType::F64 => (f64::from_bits(w) * f64::from_bits(s)).to_bits(),
        DataType::I64 | DataType::U64 => w.wrapping_mul(s),
        _ => word(w as u32) as u64 | (word((w >> 32) as u32) as u64) << 32,
    }
}

/// Two units combined, by type.
#[inline(always)]
fn combine_unit(r: Reducer, a: u64, b: u64) -> u64 {
    let op = r.op;
    let word = |a: u32, b: u32| match r.dtype {
        DataType::F32 => f32_op(a, b, op),
        DataType::F16 => f16x2_op(a, b, op),
        DataType::BF16 => bf16x2_op(a, b, op),
        DataType::I32 => int32_op(a, b, op, true),
        DataType::U32 => int32_op(a, b, op, false),
        DataType::I8 => bytes(a, b, |x, y| int8_op(x, y, op, true)),
        DataType::U8 => bytes(a, b, |x, y| int8_op(x, y, op, false)),
        DataType::F8E4M3 => fp8_word(a, b, op, Fp8::E4M3, false),
        DataType::F8E5M2 => fp8_word(a, b, op, Fp8::E5M2, false),
        DataType::I64 | DataType::U64 | DataType::F64 => a, // whole units, below
    };
    match r.dtype {
        DataType::F64 => f64_op(a, b, op),
        DataType::I64 => int64_op(a, b, op, true),
        DataType::U64 => int64_op(a, b, op, false),
        _ => {
            word(a as u32, b as u32) as u64
                | (word((a >> 32) as u32, (b >> 32) as u32) as u64) << 32
        }
    }
}

/// One unit divided by the divisor, lane by lane.
#[inline(always)]
fn post_unit(r: Reducer, w: u64) -> u64 {
    let (d, recip) = (r.arg, r.recip);
    let signed = r.dtype.is_signed_int();
    let word = |x: u32| match r.dtype {
        DataType::I32 | DataType::U32 => {
            let v = if signed {
                x as i32 as i64 as u64
            } else {
                x as u64
            };
            div_lane(v, signed, d, recip) as u32
        }
        _ => bytes(x, 0, |v, _| {
            let v = if signed {
                v as i8 as i64 as u64
            } else {
                v as u64
            };
            div_lane(v, signed, d, recip) as u8
        }),
    };
    match r.dtype {
        DataType::I64 | DataType::U64 => div_lane(w, signed, d, recip),
        DataType::I32 | DataType::U32 | DataType::I8 | DataType::U8 => {
            word(w as u32) as u64 | (word((w >> 32) as u32) as u64) << 32
        }
        _ => w, // floats never divide (`DeviceReduceOp::serves`)
    }
}

/// A unit's two words as one little-endian u64.
#[inline(always)]
fn join(w: [u32; 2]) -> u64 {
    w[0] as u64 | (w[1] as u64) << 32
}

/// A u64 as a unit's two words.
#[inline(always)]
fn split(x: u64) -> [u32; 2] {
    [x as u32, (x >> 32) as u32]
}

#[cfg(test)]
mod tests;
