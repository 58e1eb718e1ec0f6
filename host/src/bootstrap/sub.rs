//! A sub-bootstrap: a group of a bootstrap's ranks as a [`Bootstrap`] of their own, over the
//! parent's links. It serves both kinds of sub-world: a split's sub-communicator
//! (`Communicator::split`, over the parent's unwatched bootstrap) and the node group of a world
//! of several nodes (`Communicator::node_group`, over the world's watched bootstrap, with the
//! world's failures added by a decorator, `health::WorldBound`). It opens no socket: every
//! message travels as a message of the parent, so it works over any [`Bootstrap`] (TCP,
//! another sub-bootstrap, a test's wrapper).
//!
//! # Tags
//!
//! A sub-bootstrap owns two tags of its parent, both in the range [`SUB_TAG`] (top nibble
//! `0xE`, which no other user of a bootstrap in this crate takes): `SUB_TAG | id << 1` carries
//! its `send` / `recv` messages, `SUB_TAG | id << 1 | 1` its collectives. `id` is the parent
//! communicator's count of sub-worlds so far (splits and node groups), the same on every rank
//! because both are collective over the parent (ranks of different colors of one split, or of
//! different nodes, use the same tags, but never exchange messages). Each message of the
//! parent is a frame:
//!
//! `inner tag u64 (little-endian) | payload`
//!
//! so a sub-bootstrap keeps the whole `u64` tag space of a bootstrap: what its users send
//! under one tag can never be taken by a receive of another.
//!
//! # Receiving
//!
//! Frames from one peer arrive in the parent's mailbox in order, under one of the two tags. A
//! receive of `(peer, tag)` takes the first frame of that tag from the peer's stash if there is
//! one; otherwise one waiting receiver at a time (the *puller*) receives the next frame from
//! the parent and files it in the stash by its inner tag, waking the others; the rest wait on
//! the stash's condition variable in slices of at most [`WATCH_SLICE`], checking their watch
//! and their deadline. So frames of one `(peer, tag)` are taken in the order they were sent,
//! and any number of threads may receive at once, as with the parent. A frame shorter than its
//! tag is an error ([`Error::BootstrapMalformed`]).
//!
//! A receive from any of several peers (`recv_any`, the registration service's wait) takes a
//! stashed frame of its tag from any of them if there is one; otherwise it becomes the puller
//! of every one of them that has none and waits on all of those at once with the parent's
//! `recv_any`, files what arrives and wakes that peer's waiters (while another receiver pulls
//! from some of them, it looks at their stashes every [`WATCH_SLICE`]). So an idle service sleeps in the
//! parent's wait instead of polling its peers in turn.
//!
//! Shared state: each peer's stash (a mutex: the frames by tag, and whether a puller is
//! receiving; written by the puller, read by every receiver) and its condition variable;
//! the collectives' sequence number (an atomic, relaxed: collectives run from one thread at a
//! time per rank, as on every bootstrap).
//!
//! # Collectives
//!
//! `all_gather` sends this rank's data to every member and receives theirs (tag: the call's
//! sequence number); `barrier` is an all-gather of nothing; `broadcast` is the root's data sent
//! to every other member. Each waits within the parent's operation deadline and checks its
//! watch as a receive does. Every contribution to an all-gather (so also to a barrier) must be
//! as long as this rank's: one of another length is [`Error::BootstrapMalformed`] naming the
//! member that sent it.
//!
//! # Failures
//!
//! A member's link going down is the parent's to see: [`Bootstrap::dead_peer`],
//! [`Bootstrap::dead_peers`] and [`Bootstrap::left_peer`] report the parent's, renumbered, when
//! the rank is a member (a non-member's death does not concern this group: a world shrunk
//! without a dead rank, `Communicator::shrink`, runs on while the parent knows it dead, and its
//! monitor blames the first *member* that goes down after it). `forgo_goodbye` does nothing: the links
//! are the parent's, and a failed sub-communicator must not cut them. (A node group is bound to
//! its world instead: its decorator reports every death of the world and the world's abort,
//! and passes `forgo_goodbye` on to the world.)

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Bootstrap, WATCH_SLICE, Watch};
use crate::error::{Error, Result};
use crate::socket::Peer;
use crate::sync::{lock, wait_timeout};

/// The range of parent tags sub-bootstraps use (module docs).
pub const SUB_TAG: u64 = 0xE << 60;
/// Most sub-bootstraps one parent can number (`id` fits below [`SUB_TAG`] with its kind bit).
pub const MAX_SUB_ID: u64 = (1 << 59) - 1;

/// The frames one peer sent under one parent tag, not yet taken.
#[derive(Default)]
struct Stash {
    frames: HashMap<u64, VecDeque<Vec<u8>>>,
    /// Whether a receiver is receiving from the parent for this peer and tag.
    pulling: bool,
}

/// One parent tag's stashes, one per member.
struct Channel {
    parent_tag: u64,
    peers: Vec<(Mutex<Stash>, Condvar)>,
}

/// The members of a sub-communicator as a [`Bootstrap`] (module docs).
pub struct SubBootstrap {
    parent: Arc<dyn Bootstrap>,
    /// Parent rank of each member, in this group's rank order.
    members: Vec<usize>,
    rank: usize,
    user: Channel,
    coll: Channel,
    seq: AtomicU64,
    local_rank: usize,
    ranks_per_node: usize,
}

impl std::fmt::Debug for SubBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubBootstrap")
            .field("rank", &self.rank)
            .field("members", &self.members)
            .finish()
    }
}

impl SubBootstrap {
    /// The group of `members` (parent ranks, in this group's rank order; this rank among them)
    /// over `parent`, numbered `id` among the parent's groups (module docs: the same `id` on
    /// every member). [`Error::BootstrapConfig`] if this rank is not a member, a member is not
    /// a rank of the parent or appears twice, or `id` exceeds [`MAX_SUB_ID`].
    pub fn new(parent: Arc<dyn Bootstrap>, members: Vec<usize>, id: u64) -> Result<Self> {
        let me = parent.rank();
        let bad = |why: String| Err(Error::BootstrapConfig(format!("sub-bootstrap: {why}")));
        if id > MAX_SUB_ID {
            return bad(format!("group number {id} is out of range"));
        }
        if let Some(&r) = members.iter().find(|&&r| r >= parent.size()) {
            return bad(format!("rank {r} is not a rank of the parent"));
        }
        let mut seen = members.clone();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return bad(format!("a rank appears twice in {members:?}"));
        }
        let Some(rank) = members.iter().position(|&r| r == me) else {
            return bad(format!("rank {me} is not one of {members:?}"));
        };
        let node = parent.node_of(me);
        let same_node: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&r| node.is_some() && parent.node_of(r) == node)
            .collect();
        let local_rank = same_node.iter().position(|&r| r == me).unwrap_or(0);
        let channel = |kind: u64| Channel {
            parent_tag: SUB_TAG | id << 1 | kind,
            peers: members.iter().map(|_| Default::default()).collect(),
        };
        Ok(Self {
            user: channel(0),
            coll: channel(1),
            ranks_per_node: same_node.len().max(1),
            local_rank,
            parent,
            members,
            rank,
            seq: AtomicU64::new(0),
        })
    }

    /// The parent rank of each member, in this group's rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// The parent rank of member `peer`, or [`Error::NoSuchRank`].
    fn parent_rank(&self, peer: usize) -> Result<usize> {
        self.members.get(peer).copied().ok_or(Error::NoSuchRank {
            rank: peer,
            size: self.members.len(),
        })
    }

    /// The member that parent rank `r` is, if any.
    fn member(&self, r: usize) -> Option<usize> {
        self.members.iter().position(|&m| m == r)
    }

    fn send_on(&self, ch: &Channel, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        let to = self.parent_rank(peer)?;
        let mut frame = Vec::with_capacity(8 + data.len());
        frame.extend_from_slice(&tag.to_le_bytes());
        frame.extend_from_slice(data);
        self.parent.send(to, ch.parent_tag, &frame)
    }

    /// The next frame of `tag` from `peer` on `ch` (module docs: receiving).
    fn recv_on(
        &self,
        ch: &Channel,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
        op: &'static str,
    ) -> Result<Vec<u8>> {
        let from = self.parent_rank(peer)?;
        let (stash, cv) = &ch.peers[peer];
        let deadline = Instant::now() + timeout;
        let timed_out = || Error::BootstrapTimeout {
            rank: self.rank,
            peer: Peer {
                rank: Some(peer),
                addr: None,
            },
            op,
            after: timeout,
        };
        let mut s = lock(stash);
        loop {
            if let Some(frame) = s.frames.get_mut(&tag).and_then(VecDeque::pop_front) {
                return Ok(frame);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            if s.pulling {
                s = wait_timeout(cv, s, left.min(WATCH_SLICE));
                if s.frames.get(&tag).is_none_or(|q| q.is_empty()) {
                    drop(s);
                    watch()?;
                    s = lock(stash);
                }
                continue;
            }
            s.pulling = true;
            drop(s);
            let got = self.parent.recv_watched(from, ch.parent_tag, left, watch);
            s = lock(stash);
            s.pulling = false;
            cv.notify_all();
            match got {
                Ok(frame) if file(&mut s, &frame).is_some() => {}
                Ok(frame) => {
                    return Err(self.malformed(
                        Some(peer),
                        format!("a sub-bootstrap frame of {} bytes", frame.len()),
                    ));
                }
                // The parent's deadline is ours: loop to report it as this group's.
                Err(Error::BootstrapTimeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next frame of `tag` from any of `peers` on `ch` (module docs: receiving from any):
    /// the sender and the frame.
    fn recv_any_on(
        &self,
        ch: &Channel,
        peers: &[usize],
        tag: u64,
        timeout: Duration,
    ) -> Result<(usize, Vec<u8>)> {
        for &p in peers {
            self.parent_rank(p)?;
        }
        let deadline = Instant::now() + timeout;
        loop {
            // A frame already stashed, else the peers nobody pulls from, marked as pulled by
            // this thread (under the lock that shows the stash empty: no frame slips by).
            let mut mine = Vec::with_capacity(peers.len());
            for &p in peers {
                let mut s = lock(&ch.peers[p].0);
                if let Some(frame) = s.frames.get_mut(&tag).and_then(VecDeque::pop_front) {
                    drop(s);
                    self.stop_pulling(ch, &mine);
                    return Ok((p, frame));
                }
                if !s.pulling {
                    s.pulling = true;
                    mine.push(p);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.stop_pulling(ch, &mine);
                return Err(Error::BootstrapTimeout {
                    rank: self.rank,
                    peer: Peer {
                        rank: None,
                        addr: None,
                    },
                    op: "recv_any",
                    after: timeout,
                });
            }
            let Some(&first) = peers.first() else {
                std::thread::sleep(left);
                continue;
            };
            if mine.is_empty() {
                // Every peer is pulled by another receiver, which files what it gets and
                // wakes the waiters of that peer: wait on the first one, a slice at a time.
                let (stash, cv) = &ch.peers[first];
                drop(wait_timeout(cv, lock(stash), left.min(WATCH_SLICE)));
                continue;
            }
            let from: Vec<usize> = mine.iter().map(|&p| self.members[p]).collect();
            // While another receiver pulls from some of the peers, what it files for this tag
            // is looked at every slice.
            let wait = if mine.len() < peers.len() {
                left.min(WATCH_SLICE)
            } else {
                left
            };
            let got = self.parent.recv_any(&from, ch.parent_tag, wait);
            match got {
                Ok((r, frame)) => {
                    let q = self.member(r).filter(|q| mine.contains(q));
                    let Some(q) = q else {
                        self.stop_pulling(ch, &mine);
                        return Err(self.malformed(
                            None,
                            format!("a frame from parent rank {r}, not waited for"),
                        ));
                    };
                    let filed = file(&mut lock(&ch.peers[q].0), &frame);
                    self.stop_pulling(ch, &mine);
                    filed.ok_or_else(|| {
                        self.malformed(
                            Some(q),
                            format!("a sub-bootstrap frame of {} bytes", frame.len()),
                        )
                    })?;
                }
                // The parent's deadline is ours: loop to report it as this group's.
                Err(Error::BootstrapTimeout { .. }) => {
                    self.stop_pulling(ch, &mine);
                }
                Err(e) => {
                    self.stop_pulling(ch, &mine);
                    return Err(e);
                }
            }
        }
    }

    /// Ends this thread's pulling from `peers` of `ch` and wakes every waiter of those peers.
    fn stop_pulling(&self, ch: &Channel, peers: &[usize]) {
        for &p in peers {
            let (stash, cv) = &ch.peers[p];
            lock(stash).pulling = false;
            cv.notify_all();
        }
    }

    /// [`Error::BootstrapMalformed`] from this rank about member `peer` (if known).
    fn malformed(&self, peer: Option<usize>, reason: String) -> Error {
        Error::BootstrapMalformed {
            rank: self.rank,
            peer: Peer {
                rank: peer,
                addr: None,
            },
            reason,
        }
    }

    /// The next collective's tag: its sequence number.
    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}

/// Files a parent's frame (`inner tag | payload`) in `s` by its inner tag; `None` for a frame
/// shorter than its tag.
fn file(s: &mut Stash, frame: &[u8]) -> Option<()> {
    let t: [u8; 8] = frame.get(..8)?.try_into().ok()?;
    s.frames
        .entry(u64::from_le_bytes(t))
        .or_default()
        .push_back(frame[8..].to_vec());
    Some(())
}

impl Bootstrap for SubBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn ranks_per_node(&self) -> usize {
        self.ranks_per_node
    }

    fn node_of(&self, rank: usize) -> Option<usize> {
        self.parent.node_of(*self.members.get(rank)?)
    }

    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.send_on(&self.user, peer, tag, data)
    }

    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        self.recv_on(&self.user, peer, tag, timeout, watch, "recv")
    }

    fn recv_any(&self, peers: &[usize], tag: u64, timeout: Duration) -> Result<(usize, Vec<u8>)> {
        self.recv_any_on(&self.user, peers, tag, timeout)
    }

    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        self.all_gather_watched(&[], watch).map(|_| ())
    }

    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        watch()?;
        let tag = self.next_seq();
        let n = self.size();
        for q in (0..n).filter(|&q| q != self.rank) {
            self.send_on(&self.coll, q, tag, data)?;
        }
        let timeout = self.op_timeout();
        let mut all = Vec::with_capacity(n);
        for q in 0..n {
            if q == self.rank {
                all.push(data.to_vec());
                continue;
            }
            let got = self.recv_on(&self.coll, q, tag, timeout, watch, "all_gather")?;
            if got.len() != data.len() {
                return Err(self.malformed(
                    Some(q),
                    format!(
                        "all_gather contribution of {} bytes, {} expected",
                        got.len(),
                        data.len()
                    ),
                ));
            }
            all.push(got);
        }
        Ok(all)
    }

    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        watch()?;
        self.parent_rank(root)?;
        let tag = self.next_seq();
        if self.rank == root {
            for q in (0..self.size()).filter(|&q| q != root) {
                self.send_on(&self.coll, q, tag, data)?;
            }
            return Ok(());
        }
        *data = self.recv_on(&self.coll, root, tag, self.op_timeout(), watch, "broadcast")?;
        Ok(())
    }

    fn op_timeout(&self) -> Duration {
        self.parent.op_timeout()
    }

    fn dead_peer(&self) -> Option<(usize, String)> {
        self.dead_peers().into_iter().next()
    }

    fn dead_peers(&self) -> Vec<(usize, String)> {
        let all = self.parent.dead_peers().into_iter();
        all.filter_map(|(r, why)| Some((self.member(r)?, why)))
            .collect()
    }

    fn left_peer(&self) -> Option<(usize, Duration)> {
        let (r, ago) = self.parent.left_peer()?;
        Some((self.member(r)?, ago))
    }
}
