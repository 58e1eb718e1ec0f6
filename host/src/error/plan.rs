//! Execution plans refused (the root crate's `executor`), each failure a variant of its own
//! under [`Error::Plan`](super::Error::Plan); its message is the [`Error`](super::Error)'s.

/// Why an execution plan, or a call of one, was refused. Nothing was set up or launched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// An execution plan is malformed: `field` says where, as a JSON path into the plan
    /// (`gpus[1].threadblocks[0].ops[3].src_buff[0].index`), `problem` what is wrong there.
    /// Nothing was set up or launched.
    #[error("execution plan {plan:?}: {field}: {problem}")]
    Malformed {
        /// The plan's name (or its file, when the name could not be read).
        plan: String,
        /// Where in the plan.
        field: String,
        /// What is wrong there.
        problem: String,
    },
    /// An execution plan asks for something this library does not provide (switch channels:
    /// NVLink multicast). Nothing was set up or launched.
    #[error("execution plan {plan:?}: {field}: {what} is not supported")]
    Unsupported {
        /// The plan's name.
        plan: String,
        /// Where in the plan.
        field: String,
        /// What it asks for.
        what: String,
    },
    /// Verification found that a plan would hang or race: the op at fault and why. Nothing was
    /// set up or launched.
    #[error("execution plan {plan:?}: rank {rank}, threadblock {block}, {op} ({name}): {problem}")]
    Refused {
        /// The plan's name.
        plan: String,
        /// The rank of the op at fault.
        rank: usize,
        /// Its threadblock.
        block: usize,
        /// The op's path in the block (`ops[4]`, `ops[2].ops[1]` inside a pipeline).
        op: String,
        /// The op's name as the plan spells it (`wait`, `rres`, …).
        name: &'static str,
        /// What would go wrong.
        problem: String,
    },
    /// A call does not fit the plan (message sizes, rank, world size, buffers, data type).
    /// Nothing was launched.
    #[error("execution plan {plan:?}: {problem}")]
    Call {
        /// The plan's name.
        plan: String,
        /// What does not fit.
        problem: String,
    },
}
