//! `RegisteredMemory`: a buffer made known to the communicator, locally or as a peer's.
//!
//! The owner registers a buffer (`Communicator::register_memory`) and sends its serialized form
//! to peers (`send_memory`); a peer deserializes it (`recv_memory`), mapping it when a
//! same-node transport allows (CUDA IPC or the CPU backend's shared memory; within one process
//! the owner's address is used directly). Proxies and connections name memories by these
//! objects, and every access they make is checked against `size`.
//!
//! Wire form (little-endian, version [`WIRE_VERSION`]):
//! `magic "MSRM" | version u16 | backend u8 | flags u8 | owner_rank u32 | owner_pid u32 |
//!  transports u32 | local_id u32 | size u64 | owner_addr u64 | token u64 |
//!  ipc IpcMemHandle (112 bytes)`.
//! A memory claimed by this very process is used directly only if its token names a
//! registration this process made, of exactly that address and size.
//! The receiver checks the magic, the version, the exact length, the transport bits, that the
//! size is non-zero and matches the IPC handle, and the handle itself (`validate_ipc_handle`).

use std::sync::Arc;

use mscclpp_shared::{DevicePtr, IpcMemHandle};

use crate::codec::{Reader, Writer};
use crate::communicator::Registration;
use crate::error::{Error, Result};
use crate::gpu::{BackendKind, Gpu, PeerBuffer};
use crate::transport::{Transport, TransportFlags};

/// Magic of a serialized registered memory.
pub const WIRE_MAGIC: [u8; 4] = *b"MSRM";
/// Version of the serialized form.
pub const WIRE_VERSION: u16 = 2;
const FLAG_HAS_IPC: u8 = 1;
/// Length of the serialized form.
pub const WIRE_LEN: usize = 4 + 2 + 1 + 1 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 112;

enum Mapping {
    /// This process owns the buffer (or shares its address space with the owner).
    Direct,
    /// Mapped from the owner through IPC.
    Mapped(PeerBuffer),
    /// Not reachable by load/store from here (another node): only through a connection.
    Remote,
}

struct Inner {
    owner_rank: usize,
    owner_pid: u32,
    local_id: u32,
    backend: BackendKind,
    size: usize,
    transports: TransportFlags,
    owner_addr: u64,
    ipc: Option<IpcMemHandle>,
    mapping: Mapping,
    /// Random per registration; for memory of this process, its key in [`LIVE`].
    token: u64,
    /// The entry in the communicator's registry of network-writable memories (local memories
    /// registered for `Ethernet`/`Ib`); dropping the last clone removes it, after which no
    /// receiver writes here.
    _registration: Option<Registration>,
}

/// Every memory registered by this process, by token: `(address, size)`. A registration that
/// claims to come from this process is used directly only if it names an entry exactly, so a
/// forged or corrupted message cannot point a rank at arbitrary memory of its own process.
/// Entries stay for the life of the process (24 bytes each): peers may receive a registration
/// after the sender dropped its handle (the buffer itself is what must stay alive), so a
/// forged message can still name memory that was registered here and freed since.
static LIVE: std::sync::Mutex<Option<std::collections::HashMap<u64, (u64, u64)>>> =
    std::sync::Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<std::collections::HashMap<u64, (u64, u64)>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh token: a per-process random key mixed with a counter (never 0).
fn fresh_token() -> u64 {
    static KEY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let key = *KEY.get_or_init(|| {
        let mut v = [0u8; 8];
        // SAFETY: `getrandom` writes at most 8 bytes into `v`.
        let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), v.len(), 0) };
        if n == 8 {
            u64::from_ne_bytes(v)
        } else {
            // No kernel randomness: fall back to time and pid (tokens stay unique).
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ ((std::process::id() as u64) << 32)
        }
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (key ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
}

/// A registered buffer (ours or a peer's). Cheap to clone.
#[derive(Clone)]
pub struct RegisteredMemory {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RegisteredMemory(rank {} id {} {} bytes)",
            self.inner.owner_rank, self.inner.local_id, self.inner.size
        )
    }
}

impl RegisteredMemory {
    /// Registers `size` bytes at `ptr` (device memory of `gpu`, or host-mapped memory) for
    /// `transports`. `ipc` is the buffer's IPC handle when it can be exported; `registration`
    /// is its entry in the communicator's registry of network-writable memories, if any.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn local(
        gpu: &Gpu,
        rank: usize,
        local_id: u32,
        ptr: DevicePtr<u8>,
        size: usize,
        transports: TransportFlags,
        ipc: Option<IpcMemHandle>,
        registration: Option<Registration>,
    ) -> Result<Self> {
        if size == 0 || ptr.is_null() {
            return Err(Error::RegisterMemory {
                reason: format!("empty or null buffer ({size} bytes at {ptr:?})"),
            });
        }
        if transports.is_empty() {
            return Err(Error::RegisterMemory {
                reason: "no transport given".into(),
            });
        }
        let token = fresh_token();
        live()
            .get_or_insert_with(Default::default)
            .insert(token, (ptr.addr(), size as u64));
        Ok(Self {
            inner: Arc::new(Inner {
                owner_rank: rank,
                owner_pid: std::process::id(),
                local_id,
                backend: gpu.kind(),
                size,
                transports,
                owner_addr: ptr.addr(),
                ipc,
                mapping: Mapping::Direct,
                token,
                _registration: registration,
            }),
        })
    }

    /// The owning rank.
    pub fn rank(&self) -> usize {
        self.inner.owner_rank
    }

    /// The owner's id for this memory (what Ethernet frames name).
    pub fn local_id(&self) -> u32 {
        self.inner.local_id
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The transports it was registered for.
    pub fn transports(&self) -> TransportFlags {
        self.inner.transports
    }

    /// The owner's address of the buffer (valid in the owner's process).
    pub fn owner_addr(&self) -> DevicePtr<u8> {
        DevicePtr::from_addr(self.inner.owner_addr)
    }

    /// Its address in this process, when it can be reached by load/store or copy from here.
    pub fn ptr(&self) -> Option<DevicePtr<u8>> {
        match &self.inner.mapping {
            Mapping::Direct => Some(DevicePtr::from_addr(self.inner.owner_addr)),
            Mapping::Mapped(p) => Some(p.ptr()),
            Mapping::Remote => None,
        }
    }

    /// `ptr() + offset`, checking that `[offset, offset + len)` lies inside the memory.
    pub fn range(&self, offset: u64, len: u64) -> Result<DevicePtr<u8>> {
        let end = offset.checked_add(len);
        match (end, self.ptr()) {
            (Some(end), Some(p)) if end <= self.inner.size as u64 => Ok(p.byte_add_cast(offset)),
            (_, None) => Err(Error::MemoryNotMapped {
                rank: self.inner.owner_rank,
                id: self.inner.local_id,
            }),
            _ => Err(Error::OutOfRange {
                offset: offset as usize,
                len: len as usize,
                size: self.inner.size,
            }),
        }
    }

    /// The serialized form.
    pub fn serialize(&self) -> Vec<u8> {
        let i = &self.inner;
        let mut w = Writer::default();
        w.bytes(&WIRE_MAGIC)
            .u16(WIRE_VERSION)
            .u8(match i.backend {
                BackendKind::Cuda => 1,
                BackendKind::Cpu => 2,
            })
            .u8(if i.ipc.is_some() { FLAG_HAS_IPC } else { 0 })
            .u32(i.owner_rank as u32)
            .u32(i.owner_pid)
            .u32(i.transports.bits())
            .u32(i.local_id)
            .u64(i.size as u64)
            .u64(i.owner_addr)
            .u64(i.token)
            .bytes(bytemuck::bytes_of(&i.ipc.unwrap_or_default()));
        debug_assert_eq!(w.0.len(), WIRE_LEN);
        w.0
    }

    /// The token of a serialized memory (random per registration), without decoding or mapping
    /// it: a receiver that caches mapped memories looks it up first. `None` unless `bytes` has
    /// the wire length and magic; the full checks happen in [`RegisteredMemory::deserialize`].
    pub fn wire_token(bytes: &[u8]) -> Option<u64> {
        const TOKEN_AT: usize = 4 + 2 + 1 + 1 + 4 + 4 + 4 + 4 + 8 + 8;
        if bytes.len() != WIRE_LEN || bytes[..4] != WIRE_MAGIC {
            return None;
        }
        let t: [u8; 8] = bytes[TOKEN_AT..TOKEN_AT + 8].try_into().ok()?;
        Some(u64::from_le_bytes(t))
    }

    /// Decodes a peer's memory and maps it when `same_node` and a load/store transport allow.
    /// `from_rank` is the rank it came from (it must be the owner).
    pub fn deserialize(bytes: &[u8], gpu: &Gpu, from_rank: usize, same_node: bool) -> Result<Self> {
        let bad = |reason: String| Error::MalformedMemory {
            rank: from_rank,
            reason,
        };
        let mut r = Reader::new(bytes, "registered memory");
        if r.take(4).map_err(bad)? != WIRE_MAGIC {
            return Err(bad("wrong magic".into()));
        }
        let version = r.u16().map_err(bad)?;
        if version != WIRE_VERSION {
            return Err(bad(format!("version {version}, expected {WIRE_VERSION}")));
        }
        let backend = match r.u8().map_err(bad)? {
            1 => BackendKind::Cuda,
            2 => BackendKind::Cpu,
            b => return Err(bad(format!("unknown backend {b}"))),
        };
        let flags = r.u8().map_err(bad)?;
        let owner_rank = r.u32().map_err(bad)? as usize;
        let owner_pid = r.u32().map_err(bad)?;
        let transports = TransportFlags::from_bits(r.u32().map_err(bad)?)
            .ok_or_else(|| bad("unknown transport bits".into()))?;
        let local_id = r.u32().map_err(bad)?;
        let size = r.u64().map_err(bad)?;
        let owner_addr = r.u64().map_err(bad)?;
        let token = r.u64().map_err(bad)?;
        let ipc: IpcMemHandle = bytemuck::pod_read_unaligned(r.take(112).map_err(bad)?);
        r.finish().map_err(bad)?;
        if owner_rank != from_rank {
            return Err(bad(format!("claims to be owned by rank {owner_rank}")));
        }
        if size == 0 || size > isize::MAX as u64 || owner_addr == 0 || transports.is_empty() {
            return Err(bad(format!(
                "size {size}, address {owner_addr:#x}, transports {transports:?}"
            )));
        }
        if backend != gpu.kind() {
            return Err(bad(format!(
                "{backend:?} memory sent to a {:?} rank",
                gpu.kind()
            )));
        }
        if flags & !FLAG_HAS_IPC != 0 {
            return Err(bad(format!("unknown flag bits {flags:#04x}")));
        }
        if flags & FLAG_HAS_IPC == 0 && bytemuck::bytes_of(&ipc).iter().any(|&b| b != 0) {
            // Nothing on the wire is ignored: an absent handle is all zero (found by the
            // `registered_memory` fuzz target).
            return Err(bad(
                "an IPC handle without the flag that says it is there".into()
            ));
        }
        let ipc = if flags & FLAG_HAS_IPC != 0 {
            crate::gpu::validate_ipc_handle(&ipc, backend)?;
            if ipc.size != size {
                return Err(bad(format!(
                    "IPC handle covers {} bytes, not {size}",
                    ipc.size
                )));
            }
            Some(ipc)
        } else {
            None
        };
        let local_transport = Transport::local_for(backend);
        let mapping = if same_node && owner_pid == std::process::id() {
            // Ranks that share this process share its address space (peer access is enabled
            // by the connection) — for memory this process really registered.
            let known = live().as_ref().and_then(|m| m.get(&token).copied());
            if known != Some((owner_addr, size)) {
                return Err(bad(format!(
                    "claims {size} bytes at {owner_addr:#x} of this process, which it never registered"
                )));
            }
            Mapping::Direct
        } else if same_node && transports.has(local_transport) {
            match &ipc {
                Some(h) => Mapping::Mapped(gpu.open_ipc(h)?),
                None => Mapping::Remote,
            }
        } else {
            Mapping::Remote
        };
        Ok(Self {
            inner: Arc::new(Inner {
                owner_rank,
                owner_pid,
                local_id,
                backend,
                size: size as usize,
                transports,
                owner_addr,
                ipc,
                mapping,
                token,
                _registration: None,
            }),
        })
    }
}
