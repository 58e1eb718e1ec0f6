//! # mscclpp-shared
//!
//! The only home of every layout that crosses host↔device or process↔process in mscclpp-rs.
//! Each struct is `#[repr(C)]`, `Copy`, `bytemuck::Pod`, has compile-time size and alignment
//! assertions, and has a C twin in `include/mscclpp/layout.h` (checked by `tests/c_header.rs`).
//!
//! | module | holds |
//! |---|---|
//! | [`ptr`] | [`DevicePtr`], the typed device address every handle uses |
//! | [`trigger`] | [`ProxyTrigger`], the 128-bit FIFO element, and its bit fields |
//! | [`fifo`] | [`FifoDeviceHandle`] and the FIFO protocol |
//! | [`semaphore`] | the three semaphore handles |
//! | [`port_channel`] / [`memory_channel`] | the channel device handles |
//! | [`packet`] | LL8 / LL16 packets |
//! | [`status`] | [`DeviceStatus`]: abort flag and first-error record |
//! | [`kernel_params`] | the built-in kernels' parameter structs |
//! | [`trace`] | where traced kernels write block events ([`TraceDeviceHandle`]), the clock-sync words |
//! | [`p2p`] | the point-to-point engine's parameters and scratch layout |
//! | [`executor`] | the plan interpreter's parameters and block programs |
//! | [`layout`] | a table of every struct's size, alignment and field offsets (for the C check) |
#![no_std]

pub mod executor;
pub mod fifo;
pub mod ipc;
pub mod kernel_params;
pub mod layout;
pub mod memory_channel;
pub mod p2p;
pub mod packet;
pub mod port_channel;
pub mod ptr;
pub mod registry;
pub mod semaphore;
pub mod status;
pub mod trace;
pub mod trigger;

pub use executor::{ExecBlock, ExecBufRef, ExecOp, ExecOpKind, ExecutorParams};
pub use fifo::{DEFAULT_FIFO_SIZE, FifoDeviceHandle};
pub use ipc::IpcMemHandle;
pub use kernel_params::{
    BlockSumParams, BlockVoteParams, CollectiveMode, CollectiveParams, CopyParams,
    DIRECT_SHARED_BYTES, DataType, DeviceReduceOp, DirectCollectiveParams, FifoPushParams,
    MAX_DIRECT_RANKS, MAX_PORT_RANKS, PingPongParams, PortCollectiveParams, PortPingPongParams,
    ReduceOp, TestKernelParams,
};
pub use memory_channel::MemoryChannelDeviceHandle;
pub use p2p::{P2P_MAX_LANES, P2P_MAX_OPS, P2P_RECV, P2P_SEND, P2pLayout, P2pOp, P2pParams};
pub use packet::{LL8Packet, LL16Packet};
pub use port_channel::PortChannelDeviceHandle;
pub use ptr::DevicePtr;
pub use registry::{
    BufferRef, FIRST_WINDOW_SLOT, REGISTERED_CALL_BYTES, REGISTRY_SLOTS, RegisteredCall,
    RegisteredRefusal, RegistrySlot, WINDOW_SLOTS,
};
pub use semaphore::{
    Host2DeviceSemaphoreDeviceHandle, Host2HostSemaphoreHandle,
    MemoryDevice2DeviceSemaphoreDeviceHandle,
};
pub use status::{DeviceErrorCode, DeviceStatus, WaitSite};
pub use trace::{TraceClockParams, TraceDeviceHandle, TraceEvent, TraceEventKind};
pub use trigger::{ProxyTrigger, TriggerError, TriggerFields, TriggerType};
