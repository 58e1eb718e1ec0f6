//! Failures of the host's own services, each a variant of its own kind under one
//! [`Error`](super::Error) variant: binding threads to a NUMA node's CPUs (`numa.rs`,
//! [`Error::Numa`](super::Error::Numa)) and a rank's trace (`trace/`,
//! [`Error::Trace`](super::Error::Trace)). Their messages are the [`Error`](super::Error)'s.

use std::path::PathBuf;

/// Reading a NUMA node's CPUs or binding a thread to them failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NumaError {
    /// A NUMA node's CPU list (sysfs) does not parse.
    #[error("NUMA node {node}: cannot parse {path} ({text:?})")]
    CpuList {
        /// The node.
        node: u32,
        /// The file read.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
    /// Binding a thread to a NUMA node's CPUs failed.
    #[error("binding to NUMA node {node} failed")]
    Bind {
        /// The node.
        node: u32,
        /// The `sched_setaffinity` error.
        #[source]
        source: std::io::Error,
    },
}

/// Setting up, taking or writing a rank's trace failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// A trace variable (`MSCCLPP_TRACE_*`) holds something that is not a positive integer.
    #[error("{var}={value:?} is not a positive integer")]
    Env {
        /// The variable.
        var: &'static str,
        /// What it holds.
        value: String,
    },
    /// Writing a rank's trace file failed.
    #[error("writing the trace file {path} failed")]
    Write {
        /// The file.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The clock-sync kernel did not answer the host's pings in time (the device is busy or
    /// gone): no clock pair was taken.
    #[error("rank {rank}: the trace's clock-sync kernel did not answer within {after:?}")]
    ClockSync {
        /// The rank.
        rank: usize,
        /// The deadline that passed.
        after: std::time::Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn the_messages_and_sources_are_the_inner_errors() {
        let io = || std::io::Error::from_raw_os_error(libc::EINVAL);
        let bind: Error = NumaError::Bind {
            node: 3,
            source: io(),
        }
        .into();
        assert_eq!(bind.to_string(), "binding to NUMA node 3 failed");
        let cause = std::error::Error::source(&bind).map(|s| s.to_string());
        assert_eq!(cause, Some(io().to_string()));
        let env: Error = TraceError::Env {
            var: "MSCCLPP_TRACE_HOST_EVENTS",
            value: "0".into(),
        }
        .into();
        assert_eq!(
            env.to_string(),
            "MSCCLPP_TRACE_HOST_EVENTS=\"0\" is not a positive integer"
        );
        assert!(matches!(env, Error::Trace(TraceError::Env { .. })));
    }
}
