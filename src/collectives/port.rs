//! The pipelined copy-engine all-reduce's host side (`mscclpp_device::collectives::port`): one
//! PortChannel proxy per `Collectives`, with two channels to every peer (each a Host2Device
//! semaphore over the existing connection: one for pieces of input into the peer's scratch
//! ring, one for reduced pieces into its output), set up on first use by every rank in the
//! same call.
//!
//! Who writes what: the proxy thread pops the kernel's triggers and, on each connection's
//! stream, copies and then signals. The proxy names memories by id: this rank's scratch (0),
//! the peers' scratch (mapped here), and the callers' registrations (this rank's, and the
//! peers' mapped here), added to its table on first use and kept for the life of the
//! `Collectives` (as the direct path's caches keep them). The table holds at most 512
//! memories; a rank whose table cannot take one more call's buffers says so in the direct
//! exchange, so every rank stages that call instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::{Connection, EndpointConfig};
use mscclpp_host::gpu::DeviceBuffer;
use mscclpp_host::port_channel::PortChannelService;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::{Error, Result};
use mscclpp_shared::trigger::MAX_MEMORY_ID;
use mscclpp_shared::{MAX_PORT_CHUNKS, PortChannelDeviceHandle};

/// Bootstrap tags of the channels' semaphores (ring pieces, reduced pieces).
const SEMAPHORE_TAGS: [u64; 2] = [0x5f_0000, 0x5f_0001];
/// Bootstrap tag of the second connection to every peer.
const CONNECTION_TAG: u64 = 0x5f_1000;
/// Scratch ring slots per sender (the rings live in the staging region).
pub(super) const RING_SLOTS: usize = 4;
/// FIFO slots of the proxy.
const FIFO_SIZE: u32 = 512;

/// The proxy, its channels and the kernel's counters.
pub(super) struct Ports {
    service: PortChannelService,
    /// Two `PortChannelDeviceHandle`s per rank (entries of this rank unused): `2q` into
    /// rank `q`'s scratch, `2q + 1` for reduced pieces.
    pub table: DeviceBuffer,
    /// `MAX_PORT_CHUNKS` piece counters, zero between calls.
    pub counters: DeviceBuffer,
    /// Proxy memory id by `(rank, address here, size)` of a registration.
    ids: Mutex<HashMap<(usize, u64, usize), u32>>,
}

impl Ports {
    /// Sets up the proxy with two channels to every peer over `connections` (indexed by
    /// rank, `None` for this one); `scratch` is this rank's scratch (memory 0, which the
    /// channels name until a call names its buffers) and `peer_scratch` the peers', mapped
    /// here. Every rank calls it at the same point.
    pub fn new(
        comm: &Communicator,
        connections: &[Option<Arc<dyn Connection>>],
        scratch: RegisteredMemory,
        peer_scratch: &[Option<RegisteredMemory>],
    ) -> Result<Self> {
        let g = comm.gpu();
        let mut service = PortChannelService::new(comm, FIFO_SIZE)?;
        let zero = service.add_memory(scratch)?;
        let mut handles = vec![PortChannelDeviceHandle::default(); 2 * connections.len()];
        for (q, (conn, theirs)) in connections.iter().zip(peer_scratch).enumerate() {
            let (Some(conn), Some(theirs)) = (conn, theirs) else {
                continue;
            };
            let ring = service.add_memory(theirs.clone())?;
            // The reduced pieces go over a second connection (its own stream), so that they
            // do not queue behind the ring pieces and each stream's gaps between copies (a
            // signal waits for the copy before it) overlap the other's copies.
            let second = comm.connect(EndpointConfig::new(conn.transport()), q, CONNECTION_TAG)?;
            for (i, (tag, conn)) in SEMAPHORE_TAGS
                .into_iter()
                .zip([conn.clone(), second])
                .enumerate()
            {
                let sem = service.build_and_add_semaphore(comm, conn, tag)?;
                let dst = if i == 0 { ring } else { zero };
                handles[2 * q + i] = service.port_channel(sem, dst, zero)?;
            }
        }
        let table = g.alloc(std::mem::size_of_val(handles.as_slice()))?;
        table.copy_from_host(0, bytemuck::cast_slice(&handles))?;
        let counters = g.alloc(MAX_PORT_CHUNKS * 8)?;
        counters.copy_from_host(0, &[0u8; MAX_PORT_CHUNKS * 8])?;
        service.start()?;
        Ok(Self {
            service,
            table,
            counters,
            ids: Mutex::default(),
        })
    }

    /// Whether the proxy's memory table can take `more` new memories.
    pub fn has_room(&self, more: usize) -> bool {
        self.service.memories() + more <= MAX_MEMORY_ID as usize + 1
    }

    /// The proxy memory id of `reg` (rank `rank`'s registration as addressed here), added to
    /// the table the first time.
    pub fn memory_id(&self, rank: usize, reg: &RegisteredMemory) -> Result<u32> {
        let addr = reg
            .ptr()
            .map(|p| p.addr())
            .ok_or_else(|| Error::MalformedMemory {
                rank,
                reason: "a registration not mapped here".into(),
            })?;
        let key = (rank, addr, reg.size());
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = ids.get(&key) {
            return Ok(id);
        }
        let id = self.service.add_memory(reg.clone())?;
        ids.insert(key, id);
        Ok(id)
    }
}
