//! A rank's registry of its own memories: the ids it hands out, and the memories network
//! transports may write.
//!
//! Every local registration gets the next id of this rank ([`LocalMemories::register`]); peers
//! and proxies name the memory by it.
//!
//! Network transports (`Ethernet`, `Ib`, `Ofi`) write into this rank's memory on behalf of a peer,
//! which names the destination only by its id. The registry therefore also keeps a map id →
//! [`LocalMemory`] (address, size, transports, network key) of every memory registered here for a
//! network transport:
//! - **written** by registration (insert, under the write lock) and by the drop of the
//!   [`Registration`] that the memory's last [`RegisteredMemory`] clone holds (remove, under
//!   the write lock);
//! - **read** by the network receivers, which look the id up, check the range against it and
//!   copy while holding the read lock ([`LocalMemories::read`]). So once the last clone's drop
//!   returns, no receiver writes into the memory any more.
//!
//! Dropping the underlying buffer while a `RegisteredMemory` of it is still alive is the
//! caller's error (as for every transport): a peer could still write there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use mscclpp_shared::{DevicePtr, IpcMemHandle};

use super::{LocalId, RegisteredMemory};
use crate::error::{Error, Result};
use crate::gpu::{DeviceBuffer, Gpu};
use crate::sync::{read, write};
use crate::transport::{Transport, TransportFlags};

/// A memory registered on this rank for a network transport: what a receiver may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalMemory {
    /// Its address in this process (device memory or host-mapped memory of this rank's GPU).
    pub ptr: DevicePtr<u8>,
    /// Its size in bytes.
    pub size: usize,
    /// The transports it was registered for.
    pub transports: TransportFlags,
    /// Its network key ([`RegisteredMemory::key`]): a write must carry it.
    pub key: u64,
}

/// The registry of one rank (module docs).
#[derive(Debug)]
pub(crate) struct LocalMemories {
    rank: usize,
    next_id: AtomicU32,
    map: RwLock<HashMap<u32, LocalMemory>>,
}

impl LocalMemories {
    /// An empty registry of `rank`.
    pub(crate) fn new(rank: usize) -> Arc<Self> {
        Arc::new(Self {
            rank,
            next_id: AtomicU32::new(0),
            map: RwLock::default(),
        })
    }

    /// Registers `size` bytes at `ptr` (device memory of `gpu`, or host-mapped memory) for
    /// `transports` under a new id, entering it in the map of network-writable memories when a
    /// network transport is asked for. `ipc` is the buffer's IPC handle when it was exported.
    pub(crate) fn register(
        self: &Arc<Self>,
        gpu: &Gpu,
        ptr: DevicePtr<u8>,
        size: usize,
        transports: TransportFlags,
        ipc: Option<IpcMemHandle>,
    ) -> Result<RegisteredMemory> {
        if size == 0 || ptr.is_null() {
            return Err(Error::RegisterEmpty {
                addr: ptr.addr(),
                size,
            });
        }
        if transports.is_empty() {
            return Err(Error::RegisterNoTransport {
                addr: ptr.addr(),
                size,
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let key = crate::random::token();
        let registration = network_writable(transports).then(|| {
            let mem = LocalMemory {
                ptr,
                size,
                transports,
                key,
            };
            self.insert(id, mem)
        });
        let id = LocalId {
            rank: self.rank,
            id,
            key,
        };
        Ok(RegisteredMemory::local(
            gpu,
            id,
            ptr,
            size,
            transports,
            ipc,
            registration,
        ))
    }

    /// Registers a device buffer of `gpu` for `transports`, exporting its IPC handle when the
    /// backend's same-node transport is asked for.
    pub(crate) fn register_buffer(
        self: &Arc<Self>,
        buf: &DeviceBuffer,
        transports: TransportFlags,
    ) -> Result<RegisteredMemory> {
        let local = Transport::local_for(buf.gpu().kind());
        let ipc = if transports.has(local) {
            Some(buf.ipc_handle()?)
        } else {
            None
        };
        self.register(buf.gpu(), buf.ptr(), buf.len(), transports, ipc)
    }

    /// Adds `mem` under `id`; the returned guard removes it when dropped.
    fn insert(self: &Arc<Self>, id: u32, mem: LocalMemory) -> Registration {
        write(&self.map).insert(id, mem);
        Registration {
            registry: Arc::clone(self),
            id,
        }
    }

    /// The network-writable memories, read-locked: they stay registered (and alive) while the
    /// guard is held.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HashMap<u32, LocalMemory>> {
        read(&self.map)
    }
}

/// A memory's entry in [`LocalMemories`]; held by its `RegisteredMemory`, removed on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    registry: Arc<LocalMemories>,
    id: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        write(&self.registry.map).remove(&self.id);
    }
}

/// Whether a memory registered for `transports` may be written by peers over the network.
fn network_writable(transports: TransportFlags) -> bool {
    transports.has(Transport::Ethernet)
        || transports.has(Transport::Ofi)
        || (0..8).any(|i| transports.has(Transport::Ib(i)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::BackendKind;

    #[test]
    fn network_memories_are_entered_and_leave_with_their_last_clone() {
        let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let buf = gpu.alloc(256).unwrap();
        let reg = LocalMemories::new(3);
        let shm = reg
            .register(&gpu, buf.ptr(), 256, Transport::Shm.into(), None)
            .unwrap();
        let eth = reg
            .register(&gpu, buf.ptr(), 128, Transport::Ethernet.into(), None)
            .unwrap();
        assert_eq!((shm.rank(), shm.local_id()), (3, 0));
        assert_eq!((eth.rank(), eth.local_id()), (3, 1));
        assert!(
            !reg.read().contains_key(&0),
            "an Shm memory is network-writable"
        );
        let entry = reg.read().get(&1).copied().unwrap();
        assert_eq!((entry.ptr, entry.size), (buf.ptr(), 128));
        let clone = eth.clone();
        drop(eth);
        assert!(reg.read().contains_key(&1), "removed while a clone lives");
        drop(clone);
        assert!(
            reg.read().is_empty(),
            "the last clone's drop left the entry"
        );
        assert!(matches!(
            reg.register(&gpu, buf.ptr(), 0, Transport::Shm.into(), None),
            Err(Error::RegisterEmpty { size: 0, .. })
        ));
        assert!(matches!(
            reg.register(&gpu, buf.ptr(), 8, TransportFlags::default(), None),
            Err(Error::RegisterNoTransport { size: 8, .. })
        ));
    }

    #[test]
    fn exactly_the_network_transports_make_a_memory_network_writable() {
        let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let buf = gpu.alloc(64).unwrap();
        let reg = LocalMemories::new(0);
        let cases = [
            (TransportFlags::from(Transport::Shm), false),
            (Transport::CudaIpc.into(), false),
            (
                TransportFlags::from(Transport::CudaIpc).with(Transport::Shm),
                false,
            ),
            (Transport::Ethernet.into(), true),
            (Transport::Ofi.into(), true),
            (Transport::Ib(0).into(), true),
            (Transport::Ib(7).into(), true),
            (
                TransportFlags::from(Transport::Shm).with(Transport::Ib(3)),
                true,
            ),
            (
                TransportFlags::from(Transport::Shm).with(Transport::Ethernet),
                true,
            ),
        ];
        for (flags, writable) in cases {
            assert_eq!(network_writable(flags), writable, "{flags:?}");
            let m = reg.register(&gpu, buf.ptr(), 48, flags, None).unwrap();
            let entry = reg.read().get(&m.local_id()).copied();
            let want = writable.then_some(LocalMemory {
                ptr: buf.ptr(),
                size: 48,
                transports: flags,
                key: m.key(),
            });
            assert_eq!(entry, want, "{flags:?}");
        }
        // A null address is refused whatever its size.
        assert!(matches!(
            reg.register(&gpu, DevicePtr::NULL, 8, Transport::Ethernet.into(), None),
            Err(Error::RegisterEmpty { addr: 0, size: 8 })
        ));
        assert!(reg.read().is_empty(), "dropped memories stayed registered");
    }

    #[test]
    fn a_buffer_exports_its_handle_only_for_the_same_node_transport() {
        let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let buf = gpu.alloc(128).unwrap();
        let reg = LocalMemories::new(1);
        let shm = reg.register_buffer(&buf, Transport::Shm.into()).unwrap();
        let eth = reg
            .register_buffer(&buf, Transport::Ethernet.into())
            .unwrap();
        assert_eq!(shm.inner.ipc.map(|h| h.size), Some(128));
        assert!(eth.inner.ipc.is_none());
        assert_eq!((shm.size(), eth.size()), (128, 128));
    }
}
