//! The public names of the algorithms ([`Algorithm`]) and of the collectives they serve
//! ([`Collective`]): plain values, defined here below everything that uses them. What each
//! algorithm serves, its CLI name and its limits are answered by its unit (the methods of
//! [`Algorithm`] are implemented by the registry, `algo/mod.rs`).

/// An algorithm a caller can force (`Collectives::all_reduce(…, Some(algorithm))`,
/// `mscclpp-bench -a NAME`). What each serves is answered by its unit
/// ([`Algorithm::serves`]); new algorithms are added without a major version (match with a
/// `_` arm).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// One-shot LL16 packets (small messages; every collective).
    LlOneShot,
    /// Through the staging buffers, reading the peers' staging (every collective).
    Staged,
    /// All-reduce where only writes cross the links: reduce-scatter by puts into the peers'
    /// staging, a local reduction, and an all-gather by puts.
    TwoShotPut,
    /// On the callers' buffers (registered on first use and exchanged per call, or
    /// registered ahead), by one kernel (every collective but the point-to-point ones).
    Direct,
    /// On the callers' registered buffers, by the copy engines (all-gather, broadcast,
    /// all-to-all; all-reduce: the direct kernel reduces each rank's chunk, the copy engines
    /// spread it).
    CopyEngine,
    /// One-shot all-reduce, all-gather and reduce-scatter with LL128 lines (medium messages:
    /// 120 of every 128 bytes on the links are data, against 8 of 16 for LL16).
    Ll128,
    /// All-reduce as an LL16 reduce-scatter and all-gather in one launch: each rank reduces
    /// one part and sends it on, so it sends `2 (n - 1) / n` of the data instead of the
    /// one-shot's `n - 1` times, for one more hop (medium messages on more than a few ranks).
    /// All-reduce only; a call too small for every rank to own a part runs one-shot.
    LlTwoShot,
    /// The point-to-point engine: `send`, `recv`, `send_recv`, gather, scatter, all-to-all-v
    /// and the point-to-point operations of a group (each pair of ranks in step on its own,
    /// LL16 packets for small messages, pipelined chunks for larger ones). It cannot be
    /// forced on a collective.
    P2p,
    /// Worlds of several nodes: every collective through PortChannels to every rank (the
    /// network between nodes, the copy engines inside one), piece by piece in one block.
    Port,
    /// Worlds of several nodes with the same number of ranks on each: all-reduce as a
    /// reduce-scatter inside each node, an all-reduce of each part between the ranks of the
    /// same local index on every node (PortChannels), and an all-gather inside each node,
    /// pipelined in chunks; small calls take one all-reduce inside the node and one exchange
    /// across nodes.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm, in declaration order (`ALL[a as usize] == a`).
    pub const ALL: [Algorithm; 10] = [
        Self::LlOneShot,
        Self::Staged,
        Self::TwoShotPut,
        Self::Direct,
        Self::CopyEngine,
        Self::Ll128,
        Self::LlTwoShot,
        Self::P2p,
        Self::Port,
        Self::Hierarchical,
    ];
}

/// A collective operation, as the algorithms say what they serve ([`Algorithm::serves`]).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// [`Call::AllReduce`](super::Call::AllReduce).
    AllReduce,
    /// [`Call::AllGather`](super::Call::AllGather).
    AllGather,
    /// [`Call::ReduceScatter`](super::Call::ReduceScatter).
    ReduceScatter,
    /// [`Call::Broadcast`](super::Call::Broadcast).
    Broadcast,
    /// [`Call::AllToAll`](super::Call::AllToAll).
    AllToAll,
    /// [`Call::Reduce`](super::Call::Reduce).
    Reduce,
    /// [`Call::SendRecv`](super::Call::SendRecv), and [`Call::Send`](super::Call::Send) /
    /// [`Call::Recv`](super::Call::Recv) alone.
    SendRecv,
}
