//! CPU-backend "device" memory: one `memfd` per allocation, mapped shared.
//!
//! The owner keeps the file descriptor open and the mapping alive until it drops the
//! allocation. Another process maps it by opening `/proc/<owner pid>/fd/<fd>` (same user, no
//! privileges needed) after checking that the link names this allocation's random token, so a
//! recycled fd number or pid cannot map the wrong memory. Because a memfd has no name in any
//! file system, nothing is left in `/dev/shm` when the owner exits or is killed: the memory
//! lives exactly as long as the last mapping.

use std::ffi::CString;
use std::io;

use mscclpp_shared::IpcMemHandle;
use mscclpp_shared::ipc::IPC_KIND_CPU;

use crate::error::{BackendError, Error, Result};

fn os(call: &'static str) -> BackendError {
    BackendError::Os {
        call,
        source: io::Error::last_os_error(),
    }
}

fn memfd_name(token: u64) -> String {
    format!("mscclpp-{token:016x}")
}

/// A shared mapping of `len` bytes of `fd`.
///
/// # Safety
/// `fd` must be a valid descriptor of a file at least `len` bytes long.
unsafe fn map_shared(fd: libc::c_int, len: usize) -> std::result::Result<*mut u8, BackendError> {
    // SAFETY: a fresh mapping chosen by the kernel; the caller vouches for `fd` and `len`.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os("mmap"));
    }
    Ok(p.cast())
}

/// Every live [`ShmAlloc`] of this process by start address: `(len, fd, token)`. Written by
/// `ShmAlloc::create` and `Drop`; read by [`allocation_of`] (a collective registering a caller's
/// buffer). Guarded by its mutex; entries never outlive their allocation.
static LIVE: std::sync::Mutex<std::collections::BTreeMap<u64, (usize, libc::c_int, u64)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn live()
-> std::sync::MutexGuard<'static, std::collections::BTreeMap<u64, (usize, libc::c_int, u64)>> {
    crate::sync::lock(&LIVE)
}

/// The live allocation of this process that `addr` lies in: `(base, len, token)`. The token is
/// random per allocation, so it names the allocation, not the address.
pub fn allocation_of(ordinal: usize, addr: u64) -> Result<(u64, usize, u64)> {
    let map = live();
    match map.range(..=addr).next_back() {
        Some((&base, &(len, _, token))) if addr < base + len.max(1) as u64 && len > 0 => {
            Ok((base, len, token))
        }
        _ => Err(Error::UnknownAddress {
            ordinal,
            addr,
            source: BackendError::Invalid("no live CPU-backend allocation holds it".into()),
        }),
    }
}

/// The IPC handle of the live allocation starting at `base` (as [`allocation_of`] reported).
pub fn export_allocation(ordinal: usize, base: u64) -> Result<IpcMemHandle> {
    let map = live();
    let Some(&(len, fd, token)) = map.get(&base) else {
        return Err(Error::IpcExport {
            ordinal,
            bytes: 0,
            source: BackendError::Invalid(format!("no live allocation starts at {base:#x}")),
        });
    };
    Ok(handle(ordinal, len, fd, token))
}

fn handle(ordinal: usize, len: usize, fd: libc::c_int, token: u64) -> IpcMemHandle {
    IpcMemHandle {
        kind: IPC_KIND_CPU,
        device: ordinal as u32,
        owner_pid: std::process::id(),
        owner_fd: fd as u32,
        token,
        alloc_size: len as u64,
        offset: 0,
        size: len as u64,
        cuda: [0; 64],
    }
}

/// Device memory of the CPU backend (owner side).
pub struct ShmAlloc {
    ptr: *mut u8,
    len: usize,
    map_len: usize,
    fd: libc::c_int,
    token: u64,
}

// SAFETY: the allocation is plain shared memory; the raw pointer is only an address that users
// access under the same rules as GPU memory (the protocol layers order the accesses).
unsafe impl Send for ShmAlloc {}
// SAFETY: as above; `&ShmAlloc` only hands out the address and metadata.
unsafe impl Sync for ShmAlloc {}

impl ShmAlloc {
    /// Allocates `bytes` zeroed bytes (a zero-byte request maps one page, reported as 0 bytes).
    pub fn new(ordinal: usize, bytes: usize) -> Result<Self> {
        Self::create(bytes).map_err(|source| Error::Alloc {
            ordinal,
            bytes,
            source,
        })
    }

    fn create(bytes: usize) -> std::result::Result<Self, BackendError> {
        let token = crate::random::u64().map_err(|source| BackendError::Os {
            call: "getrandom",
            source,
        })?;
        let name = CString::new(memfd_name(token))
            .map_err(|_| BackendError::Invalid("memfd name with NUL".into()))?;
        // SAFETY: `name` is a valid C string.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os("memfd_create"));
        }
        let map_len = bytes.max(1);
        let close_on_err = |e: BackendError| {
            // SAFETY: `fd` is ours and not yet shared.
            unsafe { libc::close(fd) };
            e
        };
        // SAFETY: `fd` is a fresh memfd; the new size is zero-filled by the kernel.
        if unsafe { libc::ftruncate(fd, map_len as libc::off_t) } != 0 {
            return Err(close_on_err(os("ftruncate")));
        }
        // SAFETY: the file is `map_len` bytes long.
        let ptr = unsafe { map_shared(fd, map_len) }.map_err(close_on_err)?;
        live().insert(ptr as u64, (bytes, fd, token));
        Ok(Self {
            ptr,
            len: bytes,
            map_len,
            fd,
            token,
        })
    }

    /// Address of the first byte (valid in this process).
    pub fn ptr(&self) -> u64 {
        self.ptr as u64
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The handle another process opens with [`PeerMap::open`].
    pub fn ipc_handle(&self, ordinal: usize) -> Result<IpcMemHandle> {
        if self.len == 0 {
            return Err(Error::IpcExport {
                ordinal,
                bytes: 0,
                source: BackendError::Invalid("an empty buffer cannot be exported".into()),
            });
        }
        Ok(handle(ordinal, self.len, self.fd, self.token))
    }
}

impl Drop for ShmAlloc {
    fn drop(&mut self) {
        live().remove(&(self.ptr as u64));
        // SAFETY: `ptr`/`map_len` is our mapping and `fd` our descriptor; both are released
        // exactly once, here. Peers' mappings keep the memory alive on their own.
        unsafe {
            if libc::munmap(self.ptr.cast(), self.map_len) != 0 {
                tracing::warn!(
                    "munmap of CPU device memory failed: {}",
                    io::Error::last_os_error()
                );
            }
            libc::close(self.fd);
        }
    }
}

/// A peer's CPU-backend memory mapped into this process.
pub struct PeerMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: as for `ShmAlloc`.
unsafe impl Send for PeerMap {}
// SAFETY: as for `ShmAlloc`.
unsafe impl Sync for PeerMap {}

impl PeerMap {
    /// Maps the allocation `h` names (already validated by `gpu::validate_ipc_handle`).
    pub fn open(ordinal: usize, h: &IpcMemHandle) -> Result<Self> {
        let err = |source| Error::IpcOpen {
            ordinal,
            owner_device: h.device,
            owner_pid: h.owner_pid,
            source,
        };
        let expect = memfd_name(h.token);
        let path = format!("/proc/{}/fd/{}", h.owner_pid, h.owner_fd);
        check_link(&path, &expect).map_err(err)?;
        let cpath = CString::new(path.clone())
            .map_err(|_| err(BackendError::Invalid("path with NUL".into())))?;
        // SAFETY: `cpath` is a valid C string.
        let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(err(os("open /proc/<pid>/fd/<fd>")));
        }
        let result = (|| {
            // The fd number could have been reused between the check and the open: check the
            // file we actually hold.
            check_link(&format!("/proc/self/fd/{fd}"), &expect)?;
            // SAFETY: `stat` is plain data the kernel fills.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `fd` is open; `st` is writable.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return Err(os("fstat"));
            }
            let len = h.alloc_size as usize;
            if (st.st_size as u64) < h.alloc_size {
                return Err(BackendError::Invalid(format!(
                    "the shared file holds {} bytes, the handle claims {}",
                    st.st_size, h.alloc_size
                )));
            }
            // SAFETY: the file is at least `len` bytes long (checked above).
            let ptr = unsafe { map_shared(fd, len.max(1)) }?;
            Ok(Self { ptr, len })
        })();
        // SAFETY: `fd` is ours; the mapping (if any) does not need it.
        unsafe { libc::close(fd) };
        result.map_err(err)
    }

    /// Address of the allocation's first byte in this process.
    pub fn base(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for PeerMap {
    fn drop(&mut self) {
        // SAFETY: our mapping, released once.
        if unsafe { libc::munmap(self.ptr.cast(), self.len.max(1)) } != 0 {
            tracing::warn!(
                "munmap of a peer mapping failed: {}",
                io::Error::last_os_error()
            );
        }
    }
}

fn check_link(path: &str, expect: &str) -> std::result::Result<(), BackendError> {
    let target = std::fs::read_link(path).map_err(|source| BackendError::Os {
        call: "readlink /proc/<pid>/fd/<fd> (is the owner alive?)",
        source,
    })?;
    let target = target.to_string_lossy();
    // A memfd link reads "/memfd:<name> (deleted)".
    if target.starts_with(&format!("/memfd:{expect}")) {
        Ok(())
    } else {
        Err(BackendError::Invalid(format!(
            "{path} is {target:?}, not the memory {expect}"
        )))
    }
}

/// Host memory "mapped" for the CPU backend: ordinary, page-aligned, zeroed.
pub struct HostAlloc {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: as for `ShmAlloc`.
unsafe impl Send for HostAlloc {}
// SAFETY: as for `ShmAlloc`.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// Allocates `bytes` zeroed bytes, page aligned.
    pub fn new(ordinal: usize, bytes: usize) -> Result<Self> {
        let err = |reason: &str| Error::HostAlloc {
            ordinal,
            bytes,
            source: BackendError::Invalid(reason.to_string()),
        };
        let layout =
            std::alloc::Layout::from_size_align(bytes.max(1), 4096).map_err(|_| err("bad size"))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(err("out of memory"));
        }
        Ok(Self { ptr, layout })
    }

    /// Address (host and "device" alike).
    pub fn host_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}
