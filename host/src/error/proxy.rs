//! Failures of the FIFO, the proxy thread and the port-channel service (`fifo.rs`,
//! `proxy.rs`, `port_channel.rs`), and of starting a communicator's health monitor, under
//! [`Error::Proxy`](super::Error::Proxy); each message is the [`Error`](super::Error)'s.

use super::{Error, TriggerFault};

/// Why a FIFO, a proxy or a port-channel service failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A FIFO size that is not a power of two.
    #[error("FIFO size {size} is not a power of two")]
    FifoSize {
        /// Size asked for.
        size: u32,
    },
    /// The proxy thread could not be started.
    #[error("starting the proxy thread failed")]
    ProxyStart {
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// A communicator's health-monitor thread could not be started.
    #[error("starting the communicator's health-monitor thread failed")]
    HealthMonitorStart {
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// A port-channel service's table of memories or semaphores is full (the trigger's id
    /// fields are that wide).
    #[error("a port-channel service serves at most {max} {what}")]
    ProxyTableFull {
        /// `memories` or `semaphores`.
        what: &'static str,
        /// The most it can hold.
        max: usize,
    },
    /// A port channel names a memory or semaphore id its service does not have.
    #[error("no {what} id {id} in this port-channel service ({registered} added)")]
    UnknownChannelId {
        /// `memory` or `semaphore`.
        what: &'static str,
        /// The id asked for.
        id: u32,
        /// How many the service has.
        registered: usize,
    },
    /// The proxy thread stopped on an error (sticky; the abort flag was set).
    #[error("the proxy failed")]
    ProxyFailed {
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// A trigger read from a FIFO names something that was not registered (never served).
    #[error("invalid trigger at FIFO position {pos}: {fault}")]
    InvalidTrigger {
        /// FIFO position.
        pos: u64,
        /// Which field is wrong.
        fault: TriggerFault,
    },
}
