//! The operators of `all_reduce` and `reduce_scatter`, as NCCL users know them, and how they
//! reach the kernels.
//!
//! | NCCL | here |
//! |---|---|
//! | `ncclSum`, `ncclProd`, `ncclMin`, `ncclMax` | [`Reduction::Sum`], [`Reduction::Prod`], [`Reduction::Min`], [`Reduction::Max`] |
//! | `ncclAvg` | [`Reduction::Avg`] |
//! | `ncclRedOpCreatePreMulSum(&op, &scalar, type, ncclScalarHostImmediate, comm)` | [`Reduction::PreMulSum`]`(`[`Scalar::Host`]`)` (or [`Scalar::host`]) |
//! | `ncclRedOpCreatePreMulSum(&op, ptr, type, ncclScalarDevice, comm)` | [`Reduction::PreMulSum`]`(`[`Scalar::Device`]`)` |
//!
//! Every operator works on every [`DataType`], as in NCCL; a `Reduction` needs no creation or
//! destruction (it is a value, given with each call). [`ReduceOp`] (sum, min, max) converts
//! into it, so `all_reduce(…, ReduceOp::Sum, …)` keeps working.
//!
//! The kernels take a [`KernelOp`] ([`Reduction::lower`]): an average becomes a
//! pre-multiplied sum by `1/n` for floating types and a sum divided by `n` for integers, as
//! NCCL lowers `ncclAvg`; `mscclpp_device::reduce` says how each type is reduced and how
//! closely the results match NCCL's.

use mscclpp_device::reduce::{Fp8, f32_to_bf16, f32_to_f16_soft, f32_to_fp8};
use mscclpp_host::error::BackendError;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{CollectiveParams, DataType, DevicePtr, DeviceReduceOp, ReduceOp};

/// What a reducing collective computes element by element over the ranks' contributions `x_r`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Reduction {
    /// `Σ x_r` (integers wrap around).
    Sum,
    /// `Π x_r` (integers wrap around).
    Prod,
    /// The smallest `x_r` (floating types: a NaN contribution is ignored unless all are NaN).
    Min,
    /// The largest `x_r` (floating types: as for `Min`).
    Max,
    /// The mean: floating types `Σ (x_r · 1/n)` with the factor rounded to the element type
    /// first (as NCCL does: f16 `1/3` is 0.33325, fp8 e4m3 `1/3` is 0.34375); integers
    /// `(Σ x_r) / n`, one division truncating toward zero after the (wrapping) sum.
    Avg,
    /// `Σ (s · x_r)`, each product rounded to the element type (integers wrap). Every rank
    /// must pass the same value of `s` (the rank that reduces an element multiplies every
    /// contribution by its own `s`; NCCL multiplies each rank's input by that rank's, which
    /// gives the same result when they agree, as they do for averaging and gradient scaling).
    PreMulSum(Scalar),
}

impl From<ReduceOp> for Reduction {
    fn from(op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => Self::Sum,
            ReduceOp::Min => Self::Min,
            ReduceOp::Max => Self::Max,
        }
    }
}

/// The scalar `s` of a [`Reduction::PreMulSum`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Scalar {
    /// The value itself, as the bits of one element of the call's type in the low bytes
    /// (little-endian; the rest is ignored): NCCL's `ncclScalarHostImmediate`. [`Scalar::host`]
    /// makes one from a number.
    Host(u64),
    /// One element of the call's type in this rank's device memory, read by the kernel when
    /// it runs: NCCL's `ncclScalarDevice`. The value may change from call to call (a CUDA
    /// graph reads it at every replay); the memory must hold it until the call completes.
    Device(DevicePtr<u8>),
}

impl Scalar {
    /// `value` as one element of `dtype`, by value ([`Scalar::Host`]): see [`element_bits`].
    pub fn host(value: f64, dtype: DataType) -> Self {
        Self::Host(element_bits(value, dtype))
    }
}

/// The bits of `value` as one element of `dtype` (little-endian, zero above): floating types
/// round to nearest even through f32 as NCCL's `__float2half(float(x))` does (f64 directly;
/// fp8 saturating at its largest finite value, NaN to NaN); integers as Rust's `as` converts
/// (toward zero, saturating at the type's bounds, NaN to 0).
pub fn element_bits(value: f64, dtype: DataType) -> u64 {
    let f = value as f32;
    match dtype {
        DataType::F64 => value.to_bits(),
        DataType::F32 => f.to_bits() as u64,
        DataType::F16 => f32_to_f16_soft(f) as u64,
        DataType::BF16 => f32_to_bf16(f) as u64,
        DataType::F8E4M3 => f32_to_fp8(f, Fp8::E4M3) as u64,
        DataType::F8E5M2 => f32_to_fp8(f, Fp8::E5M2) as u64,
        DataType::I8 => value as i8 as u8 as u64,
        DataType::U8 => value as u8 as u64,
        DataType::I32 => value as i32 as u32 as u64,
        DataType::U32 => value as u32 as u64,
        DataType::I64 => value as i64 as u64,
        DataType::U64 => value as u64,
    }
}

/// A reduction as the kernels take it (`CollectiveParams::op`, `scalar`, `scalar_ptr`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct KernelOp {
    /// The operator.
    pub op: DeviceReduceOp,
    /// Its scalar by value ([`CollectiveParams::scalar`]).
    pub scalar: u64,
    /// Its scalar in device memory, or null ([`CollectiveParams::scalar_ptr`]).
    pub scalar_ptr: DevicePtr<u8>,
}

impl KernelOp {
    /// An operator without a scalar (also what copies pass).
    pub const fn plain(op: DeviceReduceOp) -> Self {
        Self {
            op,
            scalar: 0,
            scalar_ptr: DevicePtr::NULL,
        }
    }

    /// Writes the operator and `dtype` into a kernel's parameters.
    pub fn apply(&self, p: &mut CollectiveParams, dtype: DataType) {
        p.dtype = dtype as u32;
        p.op = self.op as u32;
        p.scalar = self.scalar;
        p.scalar_ptr = self.scalar_ptr;
    }
}

impl From<ReduceOp> for KernelOp {
    fn from(op: ReduceOp) -> Self {
        Self::plain(op.into())
    }
}

impl Reduction {
    /// The kernels' form of this reduction on `dtype` over `nranks` ranks of device `ordinal`:
    /// averages lowered as NCCL does (module docs). Refuses a device scalar at address 0
    /// (`Error::UnknownAddress`).
    pub fn lower(self, dtype: DataType, nranks: usize, ordinal: usize) -> Result<KernelOp> {
        let plain = |op| Ok(KernelOp::plain(op));
        match self {
            Self::Sum => plain(DeviceReduceOp::Sum),
            Self::Prod => plain(DeviceReduceOp::Prod),
            Self::Min => plain(DeviceReduceOp::Min),
            Self::Max => plain(DeviceReduceOp::Max),
            // The mean of one contribution is itself (`x · 1` is `x` in every floating type,
            // NaN and the signed zeros included): no kernel needs to multiply.
            Self::Avg if nranks <= 1 => plain(DeviceReduceOp::Sum),
            Self::Avg if dtype.is_float() => Ok(KernelOp {
                scalar: element_bits(1.0 / nranks.max(1) as f64, dtype),
                ..KernelOp::plain(DeviceReduceOp::PreMulSum)
            }),
            Self::Avg => Ok(KernelOp {
                scalar: nranks.max(1) as u64,
                ..KernelOp::plain(DeviceReduceOp::SumPostDiv)
            }),
            Self::PreMulSum(Scalar::Host(bits)) => {
                let mask = match dtype.size() {
                    8 => u64::MAX,
                    n => (1 << (8 * n)) - 1,
                };
                Ok(KernelOp {
                    scalar: bits & mask,
                    ..KernelOp::plain(DeviceReduceOp::PreMulSum)
                })
            }
            Self::PreMulSum(Scalar::Device(ptr)) if ptr.is_null() => Err(Error::UnknownAddress {
                ordinal,
                addr: 0,
                source: BackendError::Invalid(format!(
                    "the scalar of a pre-multiplied sum of {dtype:?} (Scalar::Device)"
                )),
            }),
            Self::PreMulSum(Scalar::Device(ptr)) => Ok(KernelOp {
                scalar_ptr: ptr,
                ..KernelOp::plain(DeviceReduceOp::PreMulSum)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_lower_as_nccl_does() {
        for d in [DataType::F16, DataType::F32, DataType::I32] {
            let one = Reduction::Avg.lower(d, 1, 0).unwrap();
            assert_eq!(
                one,
                KernelOp::plain(DeviceReduceOp::Sum),
                "one rank: a copy"
            );
        }
        let avg = |d| Reduction::Avg.lower(d, 3, 0).unwrap();
        assert_eq!(avg(DataType::F32).op, DeviceReduceOp::PreMulSum);
        assert_eq!(avg(DataType::F32).scalar, (1.0f32 / 3.0).to_bits() as u64);
        assert_eq!(avg(DataType::F64).scalar, (1.0f64 / 3.0).to_bits());
        assert_eq!(avg(DataType::F16).scalar, 0x3555); // 0.33325
        assert_eq!(avg(DataType::BF16).scalar, 0x3eab); // 0.333984
        assert_eq!(avg(DataType::F8E4M3).scalar, 0x2b); // 0.34375
        assert_eq!(avg(DataType::F8E5M2).scalar, 0x35); // 0.3125
        for d in [DataType::I8, DataType::U8, DataType::I32, DataType::U64] {
            assert_eq!(
                avg(d),
                KernelOp {
                    scalar: 3,
                    ..KernelOp::plain(DeviceReduceOp::SumPostDiv)
                }
            );
        }
    }

    #[test]
    fn scalars_become_elements_of_the_type() {
        assert_eq!(element_bits(-1.0, DataType::I8), 0xff);
        assert_eq!(element_bits(300.0, DataType::U8), 0xff); // saturates
        assert_eq!(element_bits(-2.5, DataType::I64), (-2i64) as u64);
        assert_eq!(element_bits(1000.0, DataType::F8E4M3), 0x7e); // saturates at 448
        assert_eq!(element_bits(0.5, DataType::F16), 0x3800);
        let host = Reduction::PreMulSum(Scalar::Host(0xdead_beef_0000_3800));
        assert_eq!(host.lower(DataType::F16, 2, 0).unwrap().scalar, 0x3800);
        assert_eq!(
            host.lower(DataType::U64, 2, 0).unwrap().scalar,
            0xdead_beef_0000_3800
        );
        let device = Reduction::PreMulSum(Scalar::Device(DevicePtr::from_addr(0x1000)));
        let k = device.lower(DataType::F32, 2, 0).unwrap();
        assert_eq!(
            (k.op, k.scalar_ptr.addr()),
            (DeviceReduceOp::PreMulSum, 0x1000)
        );
        assert!(
            Reduction::PreMulSum(Scalar::Device(DevicePtr::NULL))
                .lower(DataType::F32, 2, 0)
                .is_err()
        );
        assert_eq!(Reduction::from(ReduceOp::Max), Reduction::Max);
    }
}
