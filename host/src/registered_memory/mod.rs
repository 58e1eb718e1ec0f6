//! `RegisteredMemory`: a buffer made known to the communicator, locally or as a peer's.
//!
//! The owner registers a buffer (`Communicator::register_buffer` and friends, through the
//! rank's `LocalMemories`, `registry.rs`) and sends its serialized form to peers
//! (`send_memory`); a peer deserializes it (`recv_memory`), mapping it when a same-node
//! transport allows (CUDA IPC or the CPU backend's shared memory; within one process the
//! owner's address is used directly). Proxies and connections name memories by these objects,
//! and every access they make is checked against `size`.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`RegisteredMemory`], the process's table of its own registrations (by token) |
//! | `registry.rs` | the rank's registry: memory ids, and the memories network transports may write |
//! | `wire.rs` | the serialized form and its checks |
//!
//! Who writes and reads the shared state here:
//! - the token table (`LIVE`) is written by every local registration and read by
//!   `deserialize` when a message claims memory of this very process; a mutex guards it;
//! - the registry of network-writable memories is written by registration and by the last
//!   drop of a `RegisteredMemory`, and read by the network receivers (registry module docs).

mod registry;
mod wire;

use std::sync::Arc;

use mscclpp_shared::{DevicePtr, IpcMemHandle};

use self::registry::Registration;
pub(crate) use self::registry::{LocalMemories, LocalMemory};
pub use self::wire::{WIRE_LEN, WIRE_MAGIC, WIRE_VERSION};
use crate::error::{Error, Result};
use crate::gpu::{BackendKind, Gpu, PeerBuffer};
use crate::sync::lock;
use crate::transport::TransportFlags;

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
    /// The network key: random per registration, sent only inside this memory's serialized
    /// form; a network transport's write into the memory must name it ([`RegisteredMemory::key`]).
    key: u64,
    /// The entry in the communicator's registry of network-writable memories (local memories
    /// registered for `Ethernet`/`Ib`/`Ofi`); dropping the last clone removes it, after which no
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
    lock(&LIVE)
}

/// A fresh token: a per-process random key mixed with a counter (never 0).
fn fresh_token() -> u64 {
    static KEY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let key = *KEY.get_or_init(crate::random::token);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (key ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1
}

/// Who registered a local memory, under which id and network key.
#[derive(Clone, Copy, Debug)]
struct LocalId {
    rank: usize,
    id: u32,
    key: u64,
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
    /// The handle of a local registration ([`LocalMemories::register`] made `local_id` and
    /// checked the arguments): `size` bytes at `ptr` (device memory of `gpu`, or host-mapped
    /// memory) for `transports`. `ipc` is the buffer's IPC handle when it can be exported;
    /// `registration` is its entry in the registry of network-writable memories, if any.
    fn local(
        gpu: &Gpu,
        id: LocalId,
        ptr: DevicePtr<u8>,
        size: usize,
        transports: TransportFlags,
        ipc: Option<IpcMemHandle>,
        registration: Option<Registration>,
    ) -> Self {
        let token = fresh_token();
        live()
            .get_or_insert_with(Default::default)
            .insert(token, (ptr.addr(), size as u64));
        Self {
            inner: Arc::new(Inner {
                owner_rank: id.rank,
                owner_pid: std::process::id(),
                local_id: id.id,
                backend: gpu.kind(),
                size,
                transports,
                owner_addr: ptr.addr(),
                ipc,
                mapping: Mapping::Direct,
                token,
                key: id.key,
                _registration: registration,
            }),
        }
    }

    /// A peer's memory as this rank would receive it from another node (reachable only through
    /// a connection), for tests of the code that checks a destination.
    #[cfg(test)]
    pub(crate) fn remote_for_test(
        owner: usize,
        id: u32,
        size: usize,
        transports: TransportFlags,
        key: u64,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                owner_rank: owner,
                owner_pid: 0,
                local_id: id,
                backend: BackendKind::Cpu,
                size,
                transports,
                owner_addr: 0x1000,
                ipc: None,
                mapping: Mapping::Remote,
                token: 1,
                key,
                _registration: None,
            }),
        }
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

    /// The memory's network key: a random value made at registration and sent to a peer only
    /// inside this memory's serialized form. Every write or signal that a network transport
    /// (Ethernet; the multi-node transports) makes into the memory carries it, and the owner
    /// refuses one whose key does not match, so a peer can write only into memories that were
    /// sent to it. (Like InfiniBand's rkey; `Ib` uses its own rkeys.)
    pub fn key(&self) -> u64 {
        self.inner.key
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::Transport;

    #[test]
    fn range_admits_exactly_the_registered_bytes() {
        let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let buf = gpu.alloc(512).unwrap();
        let reg = LocalMemories::new(2);
        let _first = reg
            .register(&gpu, buf.ptr(), 64, Transport::Shm.into(), None)
            .unwrap();
        let m = reg
            .register(&gpu, buf.ptr(), 256, Transport::Shm.into(), None)
            .unwrap();
        let base = buf.ptr().addr();
        assert_eq!(m.ptr(), Some(buf.ptr()));
        for (offset, len) in [(0, 256), (0, 0), (255, 1), (100, 156), (256, 0), (7, 9)] {
            let p = m.range(offset, len).unwrap();
            assert_eq!(p.addr(), base + offset, "range({offset}, {len})");
        }
        for (offset, len) in [(0, 257), (1, 256), (256, 1), (257, 0), (200, 100)] {
            assert!(
                matches!(
                    m.range(offset, len),
                    Err(Error::OutOfRange { offset: o, len: l, size: 256 })
                        if (o as u64, l as u64) == (offset, len)
                ),
                "range({offset}, {len}) was not refused"
            );
        }
        // An end past u64::MAX is out of range, not wrapped around.
        assert!(matches!(
            m.range(u64::MAX, 2),
            Err(Error::OutOfRange { size: 256, .. })
        ));
        assert!(matches!(
            m.range(2, u64::MAX),
            Err(Error::OutOfRange { size: 256, .. })
        ));
    }

    #[test]
    fn a_local_memory_reports_what_was_registered() {
        let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let buf = gpu.alloc(512).unwrap();
        let reg = LocalMemories::new(7);
        let flags = TransportFlags::from(Transport::Shm).with(Transport::Ethernet);
        let a = reg.register(&gpu, buf.ptr(), 512, flags, None).unwrap();
        let b = reg
            .register(&gpu, buf.ptr(), 300, Transport::Shm.into(), None)
            .unwrap();
        assert_eq!((a.rank(), a.local_id(), a.size()), (7, 0, 512));
        assert_eq!((b.rank(), b.local_id(), b.size()), (7, 1, 300));
        assert_eq!((a.transports(), a.owner_addr()), (flags, buf.ptr()));
        assert_ne!(a.key(), b.key(), "network keys repeat");
        assert_eq!(format!("{a:?}"), "RegisteredMemory(rank 7 id 0 512 bytes)");
        // Each registration is in the process's table under its own token.
        let table = live();
        let table = table.as_ref().unwrap();
        assert_ne!(a.inner.token, b.inner.token);
        assert_eq!(table.get(&a.inner.token), Some(&(buf.ptr().addr(), 512)));
        assert_eq!(table.get(&b.inner.token), Some(&(buf.ptr().addr(), 300)));
    }

    #[test]
    fn tokens_are_odd_and_do_not_repeat() {
        let tokens: Vec<u64> = (0..1000).map(|_| fresh_token()).collect();
        assert!(tokens.iter().all(|t| t & 1 == 1));
        let distinct: std::collections::HashSet<_> = tokens.iter().collect();
        assert_eq!(distinct.len(), tokens.len());
        // Not a counter, nor a key's bits forced on or off: apart from the lowest, every bit
        // is 0 in some token and 1 in another (the counter times an odd constant changes
        // every bit within a few steps; the key only flips them).
        let all = tokens.iter().fold(u64::MAX, |a, t| a & t);
        let any = tokens.iter().fold(0, |a, t| a | t);
        assert_eq!((all, any), (1, u64::MAX));
    }
}
