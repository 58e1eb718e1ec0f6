//! `NodeBootstrap`: the ranks of one node as a world of their own, over the world's bootstrap
//! — what the hierarchical collectives build their node communicator (and its single-node
//! `Collectives`) on.
//!
//! It implements [`Bootstrap`] on top of another one (the world communicator's watched
//! bootstrap, so every wait also watches the world): member `i` is world rank `members[i]`.
//!
//! - `send` / `recv` go to the member's world rank with the tag's bit 63 flipped: the world's
//!   own tags never set it (the communicator's ranges use bits 60–61), so a node message never
//!   meets a world message of the same pair.
//! - `barrier`, `all_gather` and `broadcast` are made of those sends and receives, under tags
//!   with bits 63 and 62 set and a per-bootstrap sequence number (members call them in the same
//!   order, so they agree on it), bounded by the world's operation deadline and watched.
//! - A dead peer is the world's (named by its world rank), or, once the world communicator was
//!   aborted (a transport or proxy failed, `abort()`), this rank itself: either way the node
//!   communicator's health monitor aborts the node's device waits too, within its interval.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mscclpp_host::Result;
use mscclpp_host::bootstrap::{Bootstrap, Watch};
use mscclpp_host::status::StatusBlock;

/// Flipped in every tag of a node message (module docs).
const NODE_TAG: u64 = 1 << 63;
/// Set (with [`NODE_TAG`]) in the tags of the node's own collectives.
const NODE_COLLECTIVE: u64 = 1 << 62;

/// The ranks of one node as a world (module docs).
pub(crate) struct NodeBootstrap {
    world: Arc<dyn Bootstrap>,
    world_status: Arc<StatusBlock>,
    members: Vec<usize>,
    me: usize,
    seq: AtomicU64,
}

impl NodeBootstrap {
    /// The node of `members` (world ranks, in node order; this rank among them) over `world`,
    /// whose communicator's status is `world_status`.
    pub(crate) fn new(
        world: Arc<dyn Bootstrap>,
        world_status: Arc<StatusBlock>,
        members: Vec<usize>,
    ) -> Option<Self> {
        let me = members.iter().position(|&r| r == world.rank())?;
        Some(Self {
            world,
            world_status,
            members,
            me,
            seq: AtomicU64::new(0),
        })
    }

    /// The tag of the next collective operation's round `round`.
    fn collective_tag(&self, seq: u64, round: u64) -> u64 {
        NODE_TAG | NODE_COLLECTIVE | (seq & ((1 << 40) - 1)) << 8 | (round & 0xff)
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}

impl Bootstrap for NodeBootstrap {
    fn rank(&self) -> usize {
        self.me
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn local_rank(&self) -> usize {
        self.me
    }

    fn ranks_per_node(&self) -> usize {
        self.members.len()
    }

    fn node_of(&self, rank: usize) -> Option<usize> {
        (rank < self.members.len()).then_some(0)
    }

    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        let to = self.world_rank(peer)?;
        self.world.send(to, tag ^ NODE_TAG, data)
    }

    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        let from = self.world_rank(peer)?;
        self.world
            .recv_watched(from, tag ^ NODE_TAG, timeout, watch)
    }

    fn recv_any(&self, peers: &[usize], tag: u64, timeout: Duration) -> Result<(usize, Vec<u8>)> {
        let world = peers
            .iter()
            .map(|&p| self.world_rank(p))
            .collect::<Result<Vec<_>>>()?;
        let (from, m) = self.world.recv_any(&world, tag ^ NODE_TAG, timeout)?;
        let peer = world.iter().position(|&w| w == from).map(|i| peers[i]);
        Ok((peer.unwrap_or(from), m))
    }

    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        self.all_gather_watched(&[], watch).map(|_| ())
    }

    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        watch()?;
        let tag = self.collective_tag(self.next_seq(), 0);
        for (i, &r) in self.members.iter().enumerate() {
            if i != self.me {
                self.world.send(r, tag, data)?;
            }
        }
        let mut all = Vec::with_capacity(self.members.len());
        for (i, &r) in self.members.iter().enumerate() {
            if i == self.me {
                all.push(data.to_vec());
            } else {
                all.push(
                    self.world
                        .recv_watched(r, tag, self.world.op_timeout(), watch)?,
                );
            }
        }
        Ok(all)
    }

    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        watch()?;
        let tag = self.collective_tag(self.next_seq(), 1);
        let from = self.world_rank(root)?;
        if root == self.me {
            for (i, &r) in self.members.iter().enumerate() {
                if i != self.me {
                    self.world.send(r, tag, data)?;
                }
            }
        } else {
            *data = self
                .world
                .recv_watched(from, tag, self.world.op_timeout(), watch)?;
        }
        Ok(())
    }

    fn op_timeout(&self) -> Duration {
        self.world.op_timeout()
    }

    fn dead_peer(&self) -> Option<(usize, String)> {
        if let Some((rank, why)) = self.world.dead_peer() {
            return Some((rank, format!("world rank {rank}: {why}")));
        }
        self.world_status.is_aborted().then(|| {
            (
                self.world.rank(),
                "the world communicator of this rank was aborted (a transport or proxy failed, a peer died, or abort() was called)"
                    .to_owned(),
            )
        })
    }

    fn left_peer(&self) -> Option<(usize, Duration)> {
        self.world.left_peer()
    }

    fn forgo_goodbye(&self) {
        self.world.forgo_goodbye();
    }
}

impl NodeBootstrap {
    fn world_rank(&self, peer: usize) -> Result<usize> {
        self.members
            .get(peer)
            .copied()
            .ok_or(mscclpp_host::Error::NoSuchRank {
                rank: peer,
                size: self.members.len(),
            })
    }
}
