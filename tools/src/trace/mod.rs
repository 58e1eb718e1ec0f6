//! `mscclpp-trace`: the per-rank trace files of a run (`MSCCLPP_TRACE=dir`, `mscclpp-bench
//! --trace dir`; the format is documented in `mscclpp_host::trace`) merged into one Chrome
//! trace-event JSON ([`merge`]), and drawn as a timeline image ([`timeline`]).

pub mod file;
pub mod merge;
pub mod timeline;

pub use file::RankTrace;
pub use merge::{Merged, merge, merge_dir};
