//! What Python needs to read and build the shared layouts: Rust's own table of every shared
//! struct's size, alignment and field offsets (`mscclpp_shared::layout::LAYOUTS`, the table the
//! C header's test checks `layout.h` against), its constants, and the C headers themselves
//! (`layout.h`, `device.cuh`), embedded so that a kernel compiled at run time (CuPy, NVRTC)
//! includes exactly the headers this build was made with.

use mscclpp::shared::layout::{LAYOUTS, TRIGGER_CONSTANTS};
use pyo3::prelude::*;

/// One struct: `(name, size, align, [(field, offset), …])`.
type StructRow = (&'static str, usize, usize, Vec<(&'static str, usize)>);

/// Every shared struct as Rust lays it out, in header order.
#[pyfunction]
pub fn layouts() -> Vec<StructRow> {
    LAYOUTS
        .iter()
        .map(|l| (l.name, l.size, l.align, l.fields.to_vec()))
        .collect()
}

/// The constants `layout.h` defines with the same values (`MSCCLPP_TRIGGER_*`,
/// `MSCCLPP_DTYPE_*`, …).
#[pyfunction]
pub fn constants() -> Vec<(&'static str, u64)> {
    TRIGGER_CONSTANTS.to_vec()
}

/// `{file name: text}` of the C headers under `shared/include/mscclpp/`.
#[pyfunction]
pub fn headers() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "layout.h",
            include_str!("../../shared/include/mscclpp/layout.h"),
        ),
        (
            "device.cuh",
            include_str!("../../shared/include/mscclpp/device.cuh"),
        ),
    ]
}
