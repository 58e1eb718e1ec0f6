//! Running MSCCL++ execution plans: parse, verify, set up, run.
//!
//! MSCCL++'s users write collective algorithms in its Python DSL (`mscclpp.language`), which
//! compiles them to JSON execution plans; MSCCL++'s `Executor` runs a plan with one interpreter
//! kernel. This module runs the same files, in four steps, each its own type:
//!
//! | step | module | what |
//! |---|---|---|
//! | parse | [`plan`] | the JSON into plain data; every malformed plan a typed error naming the field |
//! | verify | [`verify`] | a pure function over all ranks' programs: refuses a plan that would hang or race |
pub mod lower;
pub mod plan;
pub mod plans;
pub mod verify;
