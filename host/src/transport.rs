//! Transports: how a connection moves bytes to a peer.

use std::fmt;

/// One way of reaching a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Same node, GPU memory mapped through CUDA IPC / peer access (NVLink, PCIe P2P).
    CudaIpc,
    /// Same node, the CPU backend's shared memory (and host buffers).
    Shm,
    /// TCP between the two ranks' proxies; any nodes.
    Ethernet,
    /// InfiniBand / RoCE RDMA through libibverbs (feature `ib`), HCA index.
    Ib(u8),
    /// libfabric (OFI): RMA writes and tagged messages through whatever provider the
    /// machine has (`verbs`, `efa`, `cxi`, `tcp`), loaded at run time; any nodes.
    Ofi,
}

impl Transport {
    /// The bit of this transport in [`TransportFlags`].
    pub const fn bit(self) -> u32 {
        match self {
            Self::CudaIpc => 1,
            Self::Shm => 2,
            Self::Ethernet => 4,
            Self::Ib(i) => 1 << (8 + (i as u32 & 7)),
            Self::Ofi => 8,
        }
    }

    /// The name messages give it, as people know it: `CUDA IPC`, `shared-memory`, `Ethernet`,
    /// `InfiniBand`, `libfabric`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::CudaIpc => "CUDA IPC",
            Self::Shm => "shared-memory",
            Self::Ethernet => "Ethernet",
            Self::Ib(_) => "InfiniBand",
            Self::Ofi => "libfabric",
        }
    }

    /// The transport a same-node peer on `backend` uses.
    pub const fn local_for(backend: crate::backend::BackendKind) -> Self {
        match backend {
            crate::backend::BackendKind::Cuda => Self::CudaIpc,
            crate::backend::BackendKind::Cpu => Self::Shm,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CudaIpc => write!(f, "CudaIpc"),
            Self::Shm => write!(f, "Shm"),
            Self::Ethernet => write!(f, "Ethernet"),
            Self::Ib(i) => write!(f, "Ib{i}"),
            Self::Ofi => write!(f, "Ofi"),
        }
    }
}

/// A set of transports (bit set; see [`Transport::bit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TransportFlags(u32);

impl TransportFlags {
    /// Every bit a known transport can set.
    pub const KNOWN: u32 = 0xf | (0xff << 8);

    /// The empty set.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// From raw bits; `None` when an unknown bit is set.
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::KNOWN == 0 {
            Some(Self(bits))
        } else {
            None
        }
    }

    /// With `t` added.
    #[must_use]
    pub const fn with(self, t: Transport) -> Self {
        Self(self.0 | t.bit())
    }

    /// Whether `t` is in the set.
    pub const fn has(self, t: Transport) -> bool {
        self.0 & t.bit() != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl From<Transport> for TransportFlags {
    fn from(t: Transport) -> Self {
        Self(t.bit())
    }
}

impl<const N: usize> From<[Transport; N]> for TransportFlags {
    fn from(ts: [Transport; N]) -> Self {
        ts.into_iter().fold(Self::empty(), Self::with)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let f = TransportFlags::from([Transport::CudaIpc, Transport::Ib(3)]);
        assert!(f.has(Transport::CudaIpc) && f.has(Transport::Ib(3)));
        assert!(!f.has(Transport::Ib(2)) && !f.has(Transport::Ethernet));
        assert!(!f.has(Transport::Ofi) && f.with(Transport::Ofi).has(Transport::Ofi));
        let bits: Vec<u32> = [Transport::CudaIpc, Transport::Shm, Transport::Ethernet]
            .into_iter()
            .chain((0..8).map(Transport::Ib))
            .chain([Transport::Ofi])
            .map(Transport::bit)
            .collect();
        for (i, b) in bits.iter().enumerate() {
            assert_eq!(b.count_ones(), 1);
            assert!(bits[..i].iter().all(|c| c != b), "bit {b:#x} twice");
            assert_eq!(TransportFlags::from_bits(*b).map(|f| f.bits()), Some(*b));
        }
        assert_eq!(TransportFlags::from_bits(f.bits()), Some(f));
        assert_eq!(TransportFlags::from_bits(1 << 20), None);
    }
}
