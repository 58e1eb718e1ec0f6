//! `IpcMemHandle`: what one process sends another so it can map a buffer of its "device" memory.
//!
//! Written by the owner (`DeviceBuffer::ipc_handle` on the host), sent over the bootstrap as
//! bytes, validated and opened by the receiver (`Gpu::open_ipc`). Nothing in it is trusted on
//! receipt: the kind must be known, `offset + size <= alloc_size`, and the CPU backend checks
//! that the file it opens is the memory the token names.
//!
//! - `IPC_KIND_CUDA`: `cuda` holds the driver's `CUipcMemHandle` of the whole allocation;
//!   `offset`/`size` select the buffer inside it.
//! - `IPC_KIND_CPU`: the CPU backend's memory is a `memfd` of the owner process; the receiver
//!   opens `/proc/<owner_pid>/fd/<owner_fd>` and checks that its name carries `token`. When
//!   the owner dies the file disappears with it, so nothing leaks in `/dev/shm`.

/// CUDA IPC (`cuIpcGetMemHandle`).
pub const IPC_KIND_CUDA: u32 = 1;
/// CPU backend: a memfd of the owner process.
pub const IPC_KIND_CPU: u32 = 2;

/// Handle to export a device buffer to another process.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct IpcMemHandle {
    /// `IPC_KIND_*`.
    pub kind: u32,
    /// Owner's device ordinal.
    pub device: u32,
    /// Owner's process id (CPU backend).
    pub owner_pid: u32,
    /// Owner's file descriptor of the memfd (CPU backend).
    pub owner_fd: u32,
    /// Random per-allocation token (CPU backend: part of the memfd's name).
    pub token: u64,
    /// Size of the whole allocation.
    pub alloc_size: u64,
    /// Offset of the buffer in the allocation.
    pub offset: u64,
    /// Size of the buffer.
    pub size: u64,
    /// `CUipcMemHandle` (CUDA backend), zero otherwise.
    pub cuda: [u8; 64],
}

impl Default for IpcMemHandle {
    fn default() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}

static_assertions::assert_eq_size!(IpcMemHandle, [u64; 14]);
static_assertions::const_assert_eq!(core::mem::align_of::<IpcMemHandle>(), 8);
