//! What a communicator keeps for the C API's registrations (plain tables, owned by `Comm`,
//! changed by `registration.rs` under the communicator's locks): buffers of `ncclCommRegister`
//! and windows of `ncclCommWindowRegister` by handle, operators of `ncclRedOpCreatePreMulSum`
//! by value.

use std::collections::HashMap;
use std::ffi::c_int;

use mscclpp::collectives::{Registration, Scalar};

/// A registered range (`ncclCommRegister`) or window (`ncclCommWindowRegister`).
#[derive(Clone, Copy, Debug)]
pub struct Registered {
    /// First byte.
    pub ptr: usize,
    /// Length.
    pub size: usize,
    /// Window flags (0 for a plain registration).
    pub flags: c_int,
    /// The library's registration (`None` until made).
    pub reg: Option<Registration>,
}

/// A communicator's registrations and windows, by handle.
#[derive(Default)]
pub struct Registrations {
    /// `ncclCommRegister`'s, by handle.
    pub buffers: HashMap<usize, Registered>,
    /// `ncclCommWindowRegister`'s, by handle.
    pub windows: HashMap<usize, Registered>,
}

/// A communicator's operators made by `ncclRedOpCreatePreMulSum`, by value.
#[derive(Default)]
pub struct PreMulSums {
    /// Operator value: (the NCCL type it was made for, its scalar).
    pub ops: HashMap<c_int, (c_int, Scalar)>,
}
