//! Arguments as the Python package passes them to the native calls, checked and turned into
//! the library's types: element types by their `DataType` number (`MSCCLPP_DTYPE_*` in
//! `layout.h`; `mscclpp_rs.dtypes` maps NumPy/PyTorch names to it), reductions by name,
//! algorithms and transports by name.

use mscclpp::collectives::{Algorithm, Reduction, Scalar};
use mscclpp::host::gpu::BackendKind;
use mscclpp::host::transport::Transport;
use mscclpp::shared::{DataType, DevicePtr};
use pyo3::prelude::*;

use crate::errors::invalid;

/// The element type numbered `code`.
pub fn dtype(code: u32) -> PyResult<DataType> {
    DataType::from_u32(code).ok_or_else(|| {
        invalid(format!(
            "data type {code} is not one of the library's (0 to {})",
            DataType::ALL.len() - 1
        ))
    })
}

/// A reduction by name (`sum`, `prod`, `min`, `max`, `avg`, `premul_sum`). A pre-multiplied sum
/// takes its scalar by value (`scalar`, converted to one element of `dt`) or in device memory
/// (`scalar_ptr`, one element of `dt` read when the kernel runs), exactly one of the two.
pub fn reduction(
    name: &str,
    scalar: Option<f64>,
    scalar_ptr: Option<u64>,
    dt: DataType,
) -> PyResult<Reduction> {
    let plain = |r: Reduction| match (scalar, scalar_ptr) {
        (None, None) => Ok(r),
        _ => Err(invalid(format!("reduction {name:?} takes no scalar"))),
    };
    match name {
        "sum" => plain(Reduction::Sum),
        "prod" => plain(Reduction::Prod),
        "min" => plain(Reduction::Min),
        "max" => plain(Reduction::Max),
        "avg" => plain(Reduction::Avg),
        "premul_sum" => match (scalar, scalar_ptr) {
            (Some(v), None) => Ok(Reduction::PreMulSum(Scalar::host(v, dt))),
            (None, Some(p)) if p != 0 => Ok(Reduction::PreMulSum(Scalar::Device(
                DevicePtr::from_addr(p),
            ))),
            _ => Err(invalid(
                "premul_sum takes exactly one scalar: a number, or the address of one element in device memory",
            )),
        },
        _ => Err(invalid(format!(
            "{name:?} is not a reduction (sum, prod, min, max, avg, premul_sum)"
        ))),
    }
}

/// An algorithm by name (`None`: the selection table chooses).
pub fn algorithm(name: Option<&str>) -> PyResult<Option<Algorithm>> {
    name.map(|n| {
        Algorithm::parse(n).ok_or_else(|| {
            let known: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            invalid(format!(
                "{n:?} is not an algorithm (one of {})",
                known.join(", ")
            ))
        })
    })
    .transpose()
}

/// A transport by name (`None`: the same-node transport of `backend`).
pub fn transport(name: Option<&str>, backend: BackendKind) -> PyResult<Transport> {
    match name {
        None => Ok(Transport::local_for(backend)),
        Some("cuda_ipc") => Ok(Transport::CudaIpc),
        Some("shm") => Ok(Transport::Shm),
        Some("ethernet") => Ok(Transport::Ethernet),
        Some("ofi") => Ok(Transport::Ofi),
        Some(s) => match s.strip_prefix("ib").map(str::parse::<u8>) {
            Some(Ok(i)) if i < 8 => Ok(Transport::Ib(i)),
            _ => Err(invalid(format!(
                "{s:?} is not a transport (cuda_ipc, shm, ethernet, ofi, ib0 … ib7)"
            ))),
        },
    }
}

/// The backend's name as the package spells it.
pub fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cuda => "cuda",
        BackendKind::Cpu => "cpu",
    }
}
