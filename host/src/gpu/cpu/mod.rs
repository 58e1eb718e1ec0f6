//! The CPU backend: "device" memory in shared-memory files, kernels on the grid emulator.
//!
//! It is not a mock: the bootstrap, transports, FIFO, proxy, semaphores, channels and
//! collective kernels above it run unchanged, only slower. CI (no GPU) tests the whole stack
//! through it. See `shm` for memory and IPC, `stream` for asynchronous queues.
//!
//! The number of CPU "devices" is `MSCCLPP_CPU_DEVICES` (default 8); they differ only by
//! ordinal.

mod shm;
mod stream;

pub use shm::{HostAlloc, PeerMap, ShmAlloc};
pub use stream::{Event, Stream, WAIT_VALUE_LIMIT};

use std::sync::Mutex;

use mscclpp_shared::IpcMemHandle;

use crate::error::Result;
use crate::gpu::BackendKind;

/// Environment variable: how many CPU devices exist (default 8).
pub const CPU_DEVICES_ENV: &str = "MSCCLPP_CPU_DEVICES";

/// Devices the CPU backend offers.
pub fn device_count() -> usize {
    std::env::var(CPU_DEVICES_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// One CPU "device".
pub struct Device {
    ordinal: usize,
    streams: Mutex<Vec<stream::StreamWatcher>>,
    /// The stream the default-stream handles `0`, `1` and `2` name (made on first use).
    default_stream: std::sync::OnceLock<Stream>,
}

impl Device {
    /// Opens CPU device `ordinal`.
    pub fn open(ordinal: usize) -> Result<Self> {
        let count = device_count();
        if ordinal >= count {
            return Err(crate::Error::NoSuchDevice {
                backend: BackendKind::Cpu,
                ordinal,
                count,
            });
        }
        Ok(Self {
            ordinal,
            streams: Mutex::new(Vec::new()),
            default_stream: std::sync::OnceLock::new(),
        })
    }

    /// Name shown to users.
    pub fn name(&self) -> String {
        format!("CPU backend device {}", self.ordinal)
    }

    /// Zeroed shared memory that other processes can map.
    pub fn alloc(&self, bytes: usize) -> Result<ShmAlloc> {
        ShmAlloc::new(self.ordinal, bytes)
    }

    /// Zeroed host memory.
    pub fn alloc_host_mapped(&self, bytes: usize) -> Result<HostAlloc> {
        HostAlloc::new(self.ordinal, bytes)
    }

    /// The live allocation of this process holding `addr`: `(base, len, token)`.
    pub fn allocation_of(&self, addr: u64) -> Result<(u64, usize, u64)> {
        shm::allocation_of(self.ordinal, addr)
    }

    /// The IPC handle of the live allocation starting at `base`.
    pub fn export_allocation(&self, base: u64) -> Result<IpcMemHandle> {
        shm::export_allocation(self.ordinal, base)
    }

    /// Maps another process's allocation.
    pub fn open_ipc(&self, h: &IpcMemHandle) -> Result<PeerMap> {
        PeerMap::open(self.ordinal, h)
    }

    /// A new stream.
    pub fn create_stream(&self) -> Result<Stream> {
        let s = Stream::new(self.ordinal)?;
        let mut streams = crate::sync::lock(&self.streams);
        streams.push(s.watcher());
        Ok(s)
    }

    /// The live stream of this device with handle `raw` ([`Stream::raw`]; `0`, `1` and `2`:
    /// the device's default stream, made on first use), used without owning it.
    /// [`Error::StreamDevice`](crate::Error::StreamDevice) for a stream of another device,
    /// [`Error::UnknownStream`](crate::Error::UnknownStream) for a handle no live stream has.
    pub fn borrow_stream(&self, raw: u64) -> Result<Stream> {
        let raw = if raw <= 2 {
            let s = match self.default_stream.get() {
                Some(s) => s,
                None => {
                    let s = self.create_stream()?;
                    // Another thread may have set it first; then `s` is dropped unused.
                    let _ = self.default_stream.set(s);
                    self.default_stream
                        .get()
                        .ok_or(crate::Error::UnknownStream {
                            stream: raw,
                            backend: BackendKind::Cpu,
                        })?
                }
            };
            s.raw()
        } else {
            raw
        };
        match Stream::borrow(raw, self.ordinal) {
            Some(Ok(s)) => Ok(s),
            Some(Err(_)) => Err(crate::Error::StreamDevice {
                stream: raw,
                ordinal: self.ordinal,
            }),
            None => Err(crate::Error::UnknownStream {
                stream: raw,
                backend: BackendKind::Cpu,
            }),
        }
    }

    /// A new event.
    pub fn create_event(&self) -> Event {
        Event::new()
    }

    /// Waits for the queued work of every live stream of this device (and forgets dropped
    /// ones). Errors of queued work stay with their stream's `synchronize`.
    pub fn synchronize(&self) -> Result<()> {
        let mut streams = crate::sync::lock(&self.streams);
        streams.retain(|s| s.wait_idle());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_device::arch::host::grid::{GridDims, GridError};

    #[test]
    fn a_trapping_kernel_is_reported_not_hung() {
        let d = Device::open(0).unwrap();
        let s = d.create_stream().unwrap();
        let dims = GridDims {
            grid: 2,
            block: 8,
            shared_mem_bytes: 0,
        };
        // Thread 3 of block 1 traps while its siblings wait at a barrier: they must be released.
        let body = || {
            use mscclpp_device::arch;
            if arch::block_idx_x() == 1 && arch::thread_idx_x() == 3 {
                panic!("boom");
            }
            arch::sync_threads();
        };
        s.launch("trap_test", dims, Box::new(body)).unwrap();
        let err = s.synchronize().unwrap_err();
        let crate::Error::Stream { source, .. } = err else {
            panic!("unexpected error {err}");
        };
        match source {
            crate::error::BackendError::Kernel {
                name: "trap_test",
                source:
                    GridError::Trap {
                        block,
                        thread,
                        message,
                    },
            } => {
                assert_eq!((block, thread), (1, 3));
                assert_eq!(message, "boom");
            }
            other => panic!("unexpected source {other}"),
        }
        // The error is reported once; the stream keeps working.
        s.synchronize().unwrap();
    }

    #[test]
    fn oversized_grids_are_refused() {
        let d = Device::open(0).unwrap();
        let s = d.create_stream().unwrap();
        let dims = GridDims {
            grid: 1000,
            block: 1000,
            shared_mem_bytes: 0,
        };
        assert!(s.launch("big", dims, Box::new(|| {})).is_err());
        assert!(Device::open(device_count()).is_err());
    }

    #[test]
    fn ipc_handles_are_checked_against_the_file() {
        let d = Device::open(0).unwrap();
        let a = d.alloc(4096).unwrap();
        let mut h = a.ipc_handle(0).unwrap();
        // Same process, second mapping: writes through one are seen through the other.
        let m = d.open_ipc(&h).unwrap();
        // SAFETY: both map the same 4096 bytes.
        unsafe {
            (a.ptr() as *mut u32).write_volatile(0xdead_beef);
            assert_eq!((m.base() as *const u32).read_volatile(), 0xdead_beef);
        }
        // A wrong token (another allocation's, or forged) is refused.
        h.token ^= 1;
        assert!(d.open_ipc(&h).is_err());
        // A claimed size larger than the file is refused.
        let mut h2 = a.ipc_handle(0).unwrap();
        h2.alloc_size = 1 << 30;
        h2.size = 1 << 30;
        assert!(d.open_ipc(&h2).is_err());
        // No file appears in /dev/shm for CPU device memory.
        let leaked = std::fs::read_dir("/dev/shm")
            .map(|it| {
                it.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().contains("mscclpp"))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(leaked, 0);
    }

    #[test]
    fn peer_mapping_outlives_its_owner() {
        let d = Device::open(0).unwrap();
        let a = d.alloc(8192).unwrap();
        let h = a.ipc_handle(0).unwrap();
        let m = d.open_ipc(&h).unwrap();
        // SAFETY: `a` maps 8192 bytes.
        unsafe { (a.ptr() as *mut u64).add(100).write_volatile(77) };
        drop(a);
        // SAFETY: `m` still maps the memory: the mapping keeps it alive.
        assert_eq!(
            unsafe { (m.base() as *const u64).add(100).read_volatile() },
            77
        );
        // The owner is gone: opening again fails with an error, not a crash.
        assert!(d.open_ipc(&h).is_err());
    }

    /// Foreign streams: a stream named by its handle queues on the owner's worker, in order
    /// with the owner's work; dropping the borrowed one leaves the owner working; a handle of
    /// another device, an unknown handle and a dropped owner are errors, never lost work.
    #[test]
    fn streams_are_borrowed_by_handle() {
        let d = Device::open(0).unwrap();
        let a = d.alloc(64).unwrap();
        let word = a.ptr();
        let owner = d.create_stream().unwrap();
        assert!(!owner.is_borrowed());
        let borrowed = d.borrow_stream(owner.raw()).unwrap();
        assert!(borrowed.is_borrowed());
        assert_eq!(borrowed.raw(), owner.raw());
        // SAFETY (all writes): `word` is an aligned u64 of the live allocation `a`.
        unsafe {
            owner.write_value_u64(word, 1).unwrap();
            borrowed.write_value_u64(word, 2).unwrap();
        }
        // One queue: the owner's synchronize covers the borrowed write, which came second.
        owner.synchronize().unwrap();
        // SAFETY: as above; the queue is idle.
        assert_eq!(unsafe { (word as *const u64).read_volatile() }, 2);
        drop(borrowed);
        // SAFETY: as above.
        unsafe { owner.write_value_u64(word, 3).unwrap() };
        owner.synchronize().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { (word as *const u64).read_volatile() }, 3);

        // Every default-stream handle names one stream of the device.
        let d0 = d.borrow_stream(0).unwrap();
        assert_eq!(d.borrow_stream(1).unwrap().raw(), d0.raw());
        assert_eq!(d.borrow_stream(2).unwrap().raw(), d0.raw());
        // SAFETY: as above.
        unsafe { d0.write_value_u64(word, 4).unwrap() };
        d0.synchronize().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { (word as *const u64).read_volatile() }, 4);

        let other = Device::open(1).unwrap();
        match other.borrow_stream(owner.raw()) {
            Err(crate::Error::StreamDevice { ordinal: 1, stream }) => {
                assert_eq!(stream, owner.raw())
            }
            Err(e) => panic!("expected StreamDevice, got {e}"),
            Ok(_) => panic!("a stream of device 0 was borrowed for device 1"),
        }
        match d.borrow_stream(0xdead_0000) {
            Err(crate::Error::UnknownStream { stream, .. }) => assert_eq!(stream, 0xdead_0000),
            Err(e) => panic!("expected UnknownStream, got {e}"),
            Ok(_) => panic!("an unknown handle was borrowed"),
        }

        // The owner goes: the borrowed stream refuses work instead of running it.
        let late = d.borrow_stream(owner.raw()).unwrap();
        let raw = owner.raw();
        drop(owner);
        // SAFETY: as above (the store is refused, not run).
        let refused = unsafe { late.write_value_u64(word, 5) };
        assert!(refused.is_err(), "queued on a dropped stream");
        late.synchronize().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { (word as *const u64).read_volatile() }, 4);
        assert!(matches!(
            d.borrow_stream(raw),
            Err(crate::Error::UnknownStream { .. })
        ));
    }
}
