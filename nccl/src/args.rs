//! The checks of the arguments every concern shares, each the one place that makes its
//! decision: NCCL's data types and built-in operators as the library's ([`data_type`],
//! [`reduce_op`]), rank arguments ([`rank_arg`]), buffers ([`ptr`]) and versioned structs
//! ([`read_versioned`]).
//! What a call's buffers and byte counts must be is the library's decision (`Call::check`),
//! which `collectives.rs` asks.

// NCCL's names of its types and operators, as patterns.
#![allow(non_upper_case_globals)]

use std::ffi::{c_int, c_uint, c_void};

use mscclpp::collectives::Reduction;
use mscclpp::shared::{DataType, DevicePtr};

use crate::abi::*;
use crate::error::NcclError;

/// The library's element type for NCCL's `t`: the one place that maps NCCL's types. Every
/// one of NCCL's 12 types is served; a value that is no NCCL type is [`NcclError::BadType`].
pub fn data_type(t: c_int) -> Result<DataType, NcclError> {
    match t {
        ncclInt8 => Ok(DataType::I8),
        ncclUint8 => Ok(DataType::U8),
        ncclInt32 => Ok(DataType::I32),
        ncclUint32 => Ok(DataType::U32),
        ncclInt64 => Ok(DataType::I64),
        ncclUint64 => Ok(DataType::U64),
        ncclFloat16 => Ok(DataType::F16),
        ncclFloat32 => Ok(DataType::F32),
        ncclFloat64 => Ok(DataType::F64),
        ncclBfloat16 => Ok(DataType::BF16),
        ncclFloat8e4m3 => Ok(DataType::F8E4M3),
        ncclFloat8e5m2 => Ok(DataType::F8E5M2),
        value => Err(NcclError::BadType { value }),
    }
}

/// The library's operator for NCCL's built-in `op`: the one place that maps NCCL's built-in
/// operators (`ncclAvg` is the library's average: a pre-multiplied sum by `1/nranks` for
/// floating types, a sum divided by `nranks` for integers, as NCCL lowers it). A value of
/// `ncclNumOps` or more is an operator made by `ncclRedOpCreatePreMulSum`, which only its
/// communicator knows (`registration::reduce_op` looks it up before calling this), so here
/// it is [`NcclError::UnknownOp`]; a negative value is [`NcclError::BadOp`].
pub fn reduce_op(op: c_int) -> Result<Reduction, NcclError> {
    match op {
        ncclSum => Ok(Reduction::Sum),
        ncclProd => Ok(Reduction::Prod),
        ncclMax => Ok(Reduction::Max),
        ncclMin => Ok(Reduction::Min),
        ncclAvg => Ok(Reduction::Avg),
        v if v >= ncclNumOps => Err(NcclError::UnknownOp { value: v }),
        v => Err(NcclError::BadOp { value: v }),
    }
}

/// A caller's buffer as the library takes it.
pub fn ptr(p: *const c_void) -> DevicePtr<u8> {
    DevicePtr::from_addr(p as u64)
}

/// A rank argument in `[0, nranks)`.
pub fn rank_arg(what: &'static str, r: c_int, nranks: usize) -> Result<usize, NcclError> {
    usize::try_from(r)
        .ok()
        .filter(|&r| r < nranks)
        .ok_or_else(|| NcclError::OutOfRange {
            what,
            value: r.into(),
            expected: format!("a rank of the communicator (0 to {})", nranks - 1),
        })
}

/// A versioned NCCL struct (`size`, `magic`, `version` first) read from the caller: the
/// `size` the caller declares says how many of its bytes exist; those are copied over `T`'s
/// defaults, the rest stays default (an older, shorter struct), and the bytes of a newer,
/// longer one beyond `T` are not read. Refuses a size too small for the header or absurdly
/// large, and a wrong magic.
///
/// # Safety
/// `p` is null or points to at least its own declared `size` readable bytes (at least the 8
/// bytes of `size`).
pub unsafe fn read_versioned<T: Copy + Default>(
    p: *const T,
    what: &'static str,
) -> Result<Option<T>, NcclError> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: every versioned struct starts with its `size_t size`, which the caller has.
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    const HEADER: usize = size_of::<usize>() + 2 * size_of::<c_uint>();
    if !(HEADER..=1 << 20).contains(&size) {
        return Err(NcclError::BadConfig {
            what,
            reason: format!("its size field says {size} bytes"),
        });
    }
    // SAFETY: `size >= HEADER`, so the magic at offset 8 is inside the caller's struct.
    let magic = unsafe { p.cast::<u8>().add(8).cast::<c_uint>().read_unaligned() };
    if magic != NCCL_API_MAGIC {
        return Err(NcclError::BadConfig {
            what,
            reason: format!(
                "its magic is {magic:#x}, not NCCL_API_MAGIC (initialise it with the header's initializer)"
            ),
        });
    }
    let mut out = T::default();
    let n = size.min(size_of::<T>());
    // SAFETY: the caller has `size >= n` readable bytes at `p`; `out` is a `T`, `n` bytes of
    // which are overwritten with bytes of the same layout (every field of these structs is
    // valid for any bit pattern: integers and raw pointers).
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&raw mut out).cast::<u8>(), n);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_maps_to_the_library_type_of_its_size() {
        let mut seen = Vec::new();
        for (v, name, size) in DATA_TYPES {
            let t = data_type(v).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(t.size(), size, "{name}");
            assert!(!seen.contains(&t), "{name} maps onto {t:?} twice");
            seen.push(t);
        }
        assert_eq!(seen.len(), DataType::ALL.len());
        assert_eq!(data_type(ncclFloat32).ok(), Some(DataType::F32));
        assert_eq!(data_type(ncclBfloat16).ok(), Some(DataType::BF16));
        assert_eq!(data_type(ncclInt8).ok(), Some(DataType::I8));
        assert_eq!(data_type(ncclFloat8e4m3).ok(), Some(DataType::F8E4M3));
        assert_eq!(data_type(ncclFloat8e5m2).ok(), Some(DataType::F8E5M2));
        for bad in [-1, ncclNumTypes, 1000] {
            let e = data_type(bad).unwrap_err();
            assert!(matches!(e, NcclError::BadType { .. }));
            assert_eq!(e.code(), ncclResult_t::ncclInvalidArgument);
        }
    }

    #[test]
    fn every_builtin_op_maps() {
        assert_eq!(reduce_op(ncclSum).ok(), Some(Reduction::Sum));
        assert_eq!(reduce_op(ncclProd).ok(), Some(Reduction::Prod));
        assert_eq!(reduce_op(ncclMax).ok(), Some(Reduction::Max));
        assert_eq!(reduce_op(ncclMin).ok(), Some(Reduction::Min));
        assert_eq!(reduce_op(ncclAvg).ok(), Some(Reduction::Avg));
        for (v, _) in BUILTIN_OPS {
            assert!(reduce_op(v).is_ok());
        }
        // A pre-multiplied sum is the communicator's to know.
        assert!(matches!(
            reduce_op(ncclNumOps),
            Err(NcclError::UnknownOp { .. })
        ));
        let e = reduce_op(-3).unwrap_err();
        assert!(matches!(e, NcclError::BadOp { .. }));
        assert_eq!(e.code(), ncclResult_t::ncclInvalidArgument);
    }

    #[test]
    fn configs_are_read_by_their_size() {
        // An old caller's 40-byte struct: the fields after it stay default.
        let mut old = ncclConfig_t {
            blocking: 0,
            commName: c"never read".as_ptr(),
            ..Default::default()
        };
        old.size = 40;
        // SAFETY: `old` is a whole struct, more than its 40 declared bytes.
        let got = unsafe { read_versioned(&old, "ncclConfig_t") }
            .unwrap()
            .unwrap();
        assert_eq!(got.blocking, 0);
        assert!(got.commName.is_null(), "read beyond the declared size");
        // A wrong magic and an impossible size are refused.
        let bad = ncclConfig_t {
            magic: 7,
            ..Default::default()
        };
        // SAFETY: a whole struct.
        assert!(unsafe { read_versioned(&bad, "ncclConfig_t") }.is_err());
        let tiny = ncclConfig_t {
            size: 4,
            ..Default::default()
        };
        // SAFETY: a whole struct.
        assert!(unsafe { read_versioned(&tiny, "ncclConfig_t") }.is_err());
        // SAFETY: null is allowed.
        assert!(
            unsafe { read_versioned::<ncclConfig_t>(std::ptr::null(), "ncclConfig_t") }
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn ranks_are_checked() {
        assert_eq!(rank_arg("root", 3, 4).unwrap(), 3);
        assert!(rank_arg("root", 4, 4).is_err());
        assert!(rank_arg("root", -1, 4).is_err());
    }
}
