//! The typed details of [`Error`](super::Error) variants: the lower-level causes of GPU-layer
//! errors, what exactly is wrong with a trigger or a memory, and the wording of a full
//! bootstrap queue.

use crate::transport::Transport;

/// A CUDA driver call that returned an error (the source of the GPU variants).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct DriverError {
    /// The driver function, e.g. `cuIpcOpenMemHandle_v2`.
    pub call: &'static str,
    /// The `CUresult` value.
    pub code: u32,
    /// The `CUresult` name, e.g. `CUDA_ERROR_INVALID_VALUE`.
    pub name: String,
}

/// What is wrong with a trigger (see `port_channel::validate_trigger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TriggerFault {
    /// No type bit is set.
    #[error("no type bit set")]
    NoType,
    /// The semaphore id is not registered.
    #[error("semaphore id {id} not registered")]
    Semaphore {
        /// The id.
        id: u32,
    },
    /// A memory id is not registered.
    #[error("{side} memory id {id} not registered")]
    Memory {
        /// `dst` or `src`.
        side: &'static str,
        /// The id.
        id: u32,
    },
    /// `offset + size` is beyond a memory's registered size.
    #[error("{side} {offset}+{size} beyond {registered} bytes")]
    Range {
        /// `dst` or `src`.
        side: &'static str,
        /// The offset.
        offset: u64,
        /// The copy's size.
        size: u64,
        /// The memory's registered size.
        registered: u64,
    },
}

/// Why a memory cannot be used on a network connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryMisuse {
    /// The destination belongs to another rank than the connection's peer.
    #[error("the destination belongs to rank {owner}, not to this connection's peer")]
    NotThePeers {
        /// Its owner.
        owner: usize,
    },
    /// The destination was not registered for the connection's transport.
    #[error("the destination (memory {id}) is not registered for {transport}")]
    NotRegistered {
        /// The owner's id of the memory.
        id: u32,
        /// The transport.
        transport: Transport,
    },
    /// A word update at an offset that is not 8-byte aligned.
    #[error("update_and_sync at offset {offset}, which is not 8-byte aligned")]
    Misaligned {
        /// The offset.
        offset: u64,
    },
    /// A memory the connection does not know: its keys travel in the endpoints, so only
    /// memories registered for the transport before the connection was made can be used.
    #[error(
        "the {side} (memory {id}) was not registered for {transport} before this connection was made (its keys are exchanged at connect)"
    )]
    AfterConnect {
        /// `source` or `destination`.
        side: &'static str,
        /// The owner's id of the memory.
        id: u32,
        /// The transport.
        transport: Transport,
    },
}

/// The lower-level cause of a GPU-layer error: the CUDA driver, the OS, or the grid emulator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A CUDA driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// An OS call failed (CPU backend).
    #[error("{call} failed")]
    Os {
        /// The call, e.g. `memfd_create`.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The grid emulator failed (CPU backend).
    #[error(transparent)]
    Grid(#[from] mscclpp_device::arch::host::grid::GridError),
    /// A kernel failed on the grid emulator (CPU backend): a trap, a failed assertion, or
    /// shared memory its launch did not give.
    #[error("kernel {name:?} failed")]
    Kernel {
        /// Its entry point.
        name: &'static str,
        /// What the emulator saw.
        #[source]
        source: mscclpp_device::arch::host::grid::GridError,
    },
    /// The driver's JIT rejected a module (CUDA); `log` is its error log.
    #[error("the CUDA JIT rejected the module: {log}")]
    Jit {
        /// The failing load call.
        #[source]
        source: DriverError,
        /// The JIT error log.
        log: String,
    },
    /// A check of ours failed (the message says which).
    #[error("{0}")]
    Invalid(String),
}

/// The caps a `BootstrapQueueFull` went over, for its message.
pub(super) fn queue_caps(process: bool, max_bytes: u64, max_frames: u64) -> String {
    if process {
        format!(
            "the cap of {max_bytes} bytes queued in this whole process (from every peer of every bootstrap; the bytes count them all)"
        )
    } else {
        format!("the caps of {max_bytes} bytes and {max_frames} frames per peer")
    }
}
