//! Connections: how a rank's proxy moves bytes into a peer's registered memory.
//!
//! A [`Connection`] joins this rank to one remote rank over one [`Transport`]. Its operations are
//! one-sided and asynchronous; `flush` waits (bounded) until every earlier `write` and
//! `update_and_sync` is complete at the destination. Every operation is checked against the
//! registered sizes before anything is copied.
//!
//! | transport | module | how |
//! |---|---|---|
//! | `CudaIpc`, `Shm` | [`p2p`] | copies on a dedicated stream of the device runtime into peer memory mapped here (CUDA IPC / peer access; the CPU backend's shared memory) |
//! | `Ethernet` | [`ethernet`] | TCP to the peer's receiver thread, which bounds-checks every destination against the memories registered there for `Ethernet` |
//! | `Ib` | `ib` (feature `ib`) | libibverbs RDMA, loaded with `dlopen` at run time; not yet run on hardware |
//! | `Ofi` | [`ofi`] | libfabric (`verbs`, `efa`, `cxi`, `tcp` providers), loaded with `dlopen` at run time: RMA writes into the peer's registered memory, or tagged messages staged through host memory; tested over the `tcp` provider, not yet run on RDMA hardware |
//!
//! The three network transports share one core (`network/`): the receiver's and the sender's
//! destination checks, the failure mapping, the `dlopen` loader.
//!
//! A connection is built here from the local and the remote [`Endpoint`] (`setup.rs`, MSCCL++'s
//! `Context::connect`): `Communicator::connect` only carries the two endpoints between the ranks
//! through the bootstrap.

pub mod ethernet;
#[cfg(feature = "ib")]
pub mod ib;
mod network;
pub mod ofi;
pub mod p2p;
mod setup;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use self::setup::MAX_FAILURE_REASON;
pub(crate) use self::setup::{Context, LocalEndpoint};
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;

/// One-sided data movement to one remote rank.
pub trait Connection: Send + Sync {
    /// The transport it uses.
    fn transport(&self) -> Transport;
    /// The rank at the other end.
    fn remote_rank(&self) -> usize;
    /// Copies `size` bytes from local `src[src_off..]` to the peer's `dst[dst_off..]`
    /// (asynchronous; complete after `flush`).
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        size: u64,
    ) -> Result<()>;
    /// Stores `new_value` into `src` (the local copy of the word) and into the peer's
    /// `dst[dst_off..dst_off + 8]`, after every earlier write of this connection is visible
    /// there (this is how a semaphore is signalled through a proxy).
    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()>;
    /// Waits until every earlier operation is complete at the destination, at most `timeout`.
    fn flush(&self, timeout: Duration) -> Result<()>;
    /// Payload bytes this connection has sent to the peer by `write` (what tests and tools
    /// read to see that traffic crossed a transport); 0 where the transport does not count
    /// (the same-node ones).
    fn bytes_sent(&self) -> u64 {
        0
    }
}

/// Whether the `Ib` transport can be used here: this build has the `ib` feature and
/// libibverbs lists a device.
pub fn ib_usable() -> bool {
    #[cfg(feature = "ib")]
    {
        ib::verbs::device_names(0).is_ok_and(|d| !d.is_empty())
    }
    #[cfg(not(feature = "ib"))]
    {
        false
    }
}

/// What `Communicator::connect` needs to know about the local end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The transport.
    pub transport: Transport,
    /// How long `flush` may wait by default.
    pub flush_timeout: Duration,
}

impl EndpointConfig {
    /// An endpoint for `transport` with the default flush timeout (30 s).
    pub fn new(transport: Transport) -> Self {
        Self {
            transport,
            flush_timeout: Duration::from_secs(30),
        }
    }
}

/// Magic of a serialized endpoint.
pub const ENDPOINT_MAGIC: [u8; 4] = *b"MSEP";
/// Version of the serialized endpoint.
pub const ENDPOINT_VERSION: u16 = 1;

/// What one end of a connection tells the other (sent through the bootstrap).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Transport bit (see `Transport::bit`).
    pub transport: u32,
    /// Rank of the sender.
    pub rank: u32,
    /// Process id of the sender.
    pub pid: u32,
    /// Device ordinal of the sender.
    pub device: u32,
    /// Transport-specific bytes (e.g. a listen address), at most [`Endpoint::MAX_EXTRA`].
    pub extra: Vec<u8>,
}

impl Endpoint {
    /// Largest transport-specific payload accepted.
    pub const MAX_EXTRA: usize = 1024;

    /// Serialized form: `magic | version u16 | transport u32 | rank u32 | pid u32 | device u32 |
    /// extra_len u16 | extra`.
    pub fn serialize(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(&ENDPOINT_MAGIC)
            .u16(ENDPOINT_VERSION)
            .u32(self.transport)
            .u32(self.rank)
            .u32(self.pid)
            .u32(self.device)
            .u16(self.extra.len() as u16)
            .bytes(&self.extra);
        w.0
    }

    /// Parses and validates a peer's endpoint.
    pub fn deserialize(bytes: &[u8], from_rank: usize) -> Result<Self> {
        let bad = |reason: String| Error::MalformedEndpoint {
            rank: from_rank,
            reason,
        };
        let mut r = Reader::new(bytes, "endpoint");
        if r.take(4).map_err(bad)? != ENDPOINT_MAGIC {
            return Err(bad("wrong magic".into()));
        }
        let version = r.u16().map_err(bad)?;
        if version != ENDPOINT_VERSION {
            return Err(bad(format!(
                "version {version}, expected {ENDPOINT_VERSION}"
            )));
        }
        let transport = r.u32().map_err(bad)?;
        let rank = r.u32().map_err(bad)?;
        let pid = r.u32().map_err(bad)?;
        let device = r.u32().map_err(bad)?;
        let len = r.u16().map_err(bad)? as usize;
        if len > Self::MAX_EXTRA {
            return Err(bad(format!("{len} extra bytes")));
        }
        let extra = r.take(len).map_err(bad)?.to_vec();
        r.finish().map_err(bad)?;
        if rank as usize != from_rank {
            return Err(bad(format!("claims rank {rank}")));
        }
        Ok(Self {
            transport,
            rank,
            pid,
            device,
            extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trip_and_rejection() {
        let e = Endpoint {
            transport: Transport::Ethernet.bit(),
            rank: 3,
            pid: 77,
            device: 1,
            extra: b"127.0.0.1:5000".to_vec(),
        };
        let b = e.serialize();
        assert_eq!(Endpoint::deserialize(&b, 3).unwrap(), e);
        assert!(
            Endpoint::deserialize(&b, 2).is_err(),
            "wrong sender accepted"
        );
        for cut in 0..b.len() {
            assert!(
                Endpoint::deserialize(&b[..cut], 3).is_err(),
                "truncated at {cut}"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert!(Endpoint::deserialize(&long, 3).is_err());
        let mut wrong = b;
        wrong[0] ^= 1;
        assert!(Endpoint::deserialize(&wrong, 3).is_err());
    }
}
