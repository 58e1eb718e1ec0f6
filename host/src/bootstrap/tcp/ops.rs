//! The [`Bootstrap`] operations of a [`TcpBootstrap`]: data frames out (on the peer's out
//! link, opened on first use) and in (from the mailbox), and the collectives over a binary
//! tree of the ranks.
//!
//! **The tree.** Rank `r`'s parent is `(r − 1) / 2`, its children `2r + 1` and `2r + 2`: every
//! rank holds at most three links for the collectives, whatever the world size, and a
//! collective takes 2·log2(n) hops instead of a ring's n − 1 (at 1024 ranks, 20 hops instead of
//! 1023, and 2(n − 1) messages instead of n(n − 1) for an all-gather of small items; the
//! bootstrap's items are small, so latency and message count matter, not bandwidth).
//!
//! - `barrier`: children report up (round 0); rank 0 releases down (round 1).
//! - `all_gather`: each rank sends up its subtree's items (rank, length, bytes); rank 0 sends
//!   every item down. Unequal lengths travel too, so every rank can name the rank whose
//!   contribution differs from its own instead of waiting for one that gave up.
//! - `broadcast` from `root`: the data climbs from `root` to rank 0 along `root`'s ancestors
//!   (round 0), then goes down the whole tree (round 1).
//!
//! Tags: operation (8 bits) | round (8 bits) | per-bootstrap sequence number (48 bits), on the
//! collective channel, so collectives never see user messages or each other's.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::mailbox::RecvFail;
use super::super::net::Ctx;
use super::super::wire;
use super::super::{WATCH_SLICE, Watch};
use super::{Bootstrap, TcpBootstrap, send_error};
use crate::error::{Error, Result};
use crate::socket::deadline_in;

const OP_BARRIER: u64 = 1;
const OP_ALL_GATHER: u64 = 2;
const OP_BROADCAST: u64 = 3;
const SEQ_MASK: u64 = (1 << 48) - 1;
const UP: u64 = 0;
const DOWN: u64 = 1;

fn coll_tag(op: u64, round: u64, seq: u64) -> u64 {
    (op << 56) | ((round & 0xff) << 48) | (seq & SEQ_MASK)
}

/// Rank `r`'s parent in the collectives' tree.
pub(super) fn parent(r: usize) -> Option<usize> {
    (r > 0).then(|| (r - 1) / 2)
}

/// Rank `r`'s children in a tree of `n` ranks.
fn children(r: usize, n: usize) -> impl Iterator<Item = usize> {
    [2 * r + 1, 2 * r + 2].into_iter().filter(move |&c| c < n)
}

/// Whether `r` is in the subtree of `top`.
fn in_subtree(mut r: usize, top: usize) -> bool {
    loop {
        if r == top {
            return true;
        }
        match parent(r) {
            Some(p) if r > top => r = p,
            _ => return false,
        }
    }
}

/// Ranks in the subtree of `top` in a tree of `n` ranks.
fn subtree_size(top: usize, n: usize) -> usize {
    let (mut lo, mut width, mut count) = (top, 1usize, 0usize);
    while lo < n {
        count += width.min(n - lo);
        lo = lo.saturating_mul(2).saturating_add(1);
        width = width.saturating_mul(2);
    }
    count
}

/// Appends `(rank u32, length u32, bytes)`.
fn put_item(out: &mut Vec<u8>, rank: usize, data: &[u8]) {
    out.extend_from_slice(&u32::try_from(rank).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(data);
}

/// Parses a sequence of items; every rank must pass `ok`, none twice (`seen` is per rank).
fn items(
    msg: &[u8],
    seen: &mut [bool],
    ok: impl Fn(usize) -> bool,
) -> Result<Vec<(usize, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < msg.len() {
        let word = |i: usize| -> Result<usize, String> {
            let b = msg
                .get(i..i + 4)
                .ok_or_else(|| format!("item header cut at byte {i}"))?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        };
        let (rank, len) = (word(at)?, word(at + 4)?);
        at += 8;
        let data = msg
            .get(at..at.saturating_add(len))
            .ok_or_else(|| format!("item of rank {rank} ({len} bytes) cut"))?;
        at += len;
        if rank >= seen.len() || !ok(rank) || std::mem::replace(&mut seen[rank], true) {
            return Err(format!("unexpected item of rank {rank}"));
        }
        out.push((rank, data.to_vec()));
    }
    Ok(out)
}

impl TcpBootstrap {
    pub(super) fn send_frame(
        &self,
        peer: usize,
        channel: u32,
        tag: u64,
        data: &[u8],
        deadline: Instant,
        ctx: Ctx,
    ) -> Result<()> {
        self.check_peer(peer)?;
        let max = self.max_message();
        if data.len() as u64 > max {
            return Err(Error::BootstrapMessageTooLarge {
                rank: self.rank,
                len: data.len(),
                max,
            });
        }
        if peer == self.rank {
            self.mailbox
                .reserve(peer, data.len() as u64)
                .map_err(|d| d.to_error(&ctx))?;
            self.mailbox.push(peer, channel, tag, data.to_vec());
            return Ok(());
        }
        let link = self.link(peer, deadline, ctx)?;
        if let Some(down) = self.mailbox.down(peer) {
            return Err(down.to_error(&ctx));
        }
        link.send(channel, tag, data, deadline)
            .map_err(|f| send_error(&ctx, f))
    }

    /// The largest message a peer with the same caps accepts.
    fn max_message(&self) -> u64 {
        wire::MAX_DATA_LEN.min(self.max_queued_bytes)
    }

    /// The oldest frame of (peer, channel, tag) by `deadline`. With a `watch`, waits in slices
    /// of at most [`WATCH_SLICE`] and calls it after each empty one (a frame that has arrived is
    /// always taken first).
    fn recv_frame(
        &self,
        peer: usize,
        channel: u32,
        tag: u64,
        deadline: Instant,
        ctx: Ctx,
        watch: Option<Watch<'_>>,
    ) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        loop {
            let until = match watch {
                Some(_) => deadline.min(Instant::now() + WATCH_SLICE),
                None => deadline,
            };
            match self.mailbox.recv(peer, channel, tag, until) {
                Ok(m) => return Ok(m),
                Err(RecvFail::Timeout) if until < deadline => {
                    if let Some(w) = watch {
                        w()?;
                    }
                }
                Err(RecvFail::Timeout) => return Err(ctx.timeout_error()),
                Err(RecvFail::Down(d)) => return Err(d.to_error(&ctx)),
            }
        }
    }

    fn next_seq(&self) -> u64 {
        self.coll_seq.fetch_add(1, Ordering::Relaxed)
    }

    fn coll_send(&self, to: usize, tag: u64, data: &[u8], d: Instant, ctx: Ctx) -> Result<()> {
        self.send_frame(to, wire::CHANNEL_COLLECTIVE, tag, data, d, ctx)
    }

    fn coll_recv(
        &self,
        from: usize,
        tag: u64,
        d: Instant,
        ctx: Ctx,
        watch: Option<Watch<'_>>,
    ) -> Result<Vec<u8>> {
        self.recv_frame(from, wire::CHANNEL_COLLECTIVE, tag, d, ctx, watch)
    }

    /// Tree barrier: up from the leaves, release down from rank 0.
    pub(super) fn barrier_until(
        &self,
        deadline: Instant,
        timeout: Duration,
        op: &'static str,
        watch: Option<Watch<'_>>,
    ) -> Result<()> {
        let (n, me) = (self.size, self.rank);
        let seq = self.next_seq();
        let (up, down) = (
            coll_tag(OP_BARRIER, UP, seq),
            coll_tag(OP_BARRIER, DOWN, seq),
        );
        let empty = |from: usize, got: Vec<u8>| {
            if got.is_empty() {
                Ok(())
            } else {
                Err(self.ctx(from, op, timeout).malformed(format!(
                    "{op}: a barrier message carries {} bytes",
                    got.len()
                )))
            }
        };
        for c in children(me, n) {
            empty(
                c,
                self.coll_recv(c, up, deadline, self.ctx(c, op, timeout), watch)?,
            )?;
        }
        if let Some(p) = parent(me) {
            self.coll_send(p, up, &[], deadline, self.ctx(p, op, timeout))?;
            empty(
                p,
                self.coll_recv(p, down, deadline, self.ctx(p, op, timeout), watch)?,
            )?;
        }
        for c in children(me, n) {
            self.coll_send(c, down, &[], deadline, self.ctx(c, op, timeout))?;
        }
        Ok(())
    }

    fn all_gather_with(&self, data: &[u8], watch: Option<Watch<'_>>) -> Result<Vec<Vec<u8>>> {
        const OP: &str = "all_gather";
        let (n, me, t) = (self.size, self.rank, self.op_timeout);
        let deadline = deadline_in(t);
        let seq = self.next_seq();
        let (up, down) = (
            coll_tag(OP_ALL_GATHER, UP, seq),
            coll_tag(OP_ALL_GATHER, DOWN, seq),
        );
        let mut mine = Vec::new();
        put_item(&mut mine, me, data);
        let mut seen = vec![false; n];
        seen[me] = true;
        for c in children(me, n) {
            let ctx = self.ctx(c, OP, t);
            let msg = self.coll_recv(c, up, deadline, ctx, watch)?;
            let got = items(&msg, &mut seen, |r| in_subtree(r, c)).map_err(|r| ctx.malformed(r))?;
            if got.len() != subtree_size(c, n) {
                return Err(ctx.malformed(format!(
                    "all_gather: rank {c} sent {} items for its subtree of {}",
                    got.len(),
                    subtree_size(c, n)
                )));
            }
            for (r, d) in got {
                put_item(&mut mine, r, &d);
            }
        }
        let all = match parent(me) {
            Some(p) => {
                self.coll_send(p, up, &mine, deadline, self.ctx(p, OP, t))?;
                let ctx = self.ctx(p, OP, t);
                self.coll_recv(p, down, deadline, ctx, watch)?
            }
            None => {
                let mut seen = vec![false; n];
                let mut got = items(&mine, &mut seen, |_| true)
                    .map_err(|r| self.ctx(me, OP, t).malformed(r))?;
                got.sort_by_key(|(r, _)| *r);
                let mut all = Vec::with_capacity(mine.len());
                for (r, d) in got {
                    put_item(&mut all, r, &d);
                }
                all
            }
        };
        for c in children(me, n) {
            self.coll_send(c, down, &all, deadline, self.ctx(c, OP, t))?;
        }
        let from = parent(me).unwrap_or(me);
        let ctx = self.ctx(from, OP, t);
        let mut seen = vec![false; n];
        let got = items(&all, &mut seen, |_| true).map_err(|r| ctx.malformed(r))?;
        if got.len() != n || got.iter().enumerate().any(|(i, (r, _))| i != *r) {
            return Err(ctx.malformed(format!(
                "all_gather: the result holds {} items, not one per rank in order",
                got.len()
            )));
        }
        if let Some((r, d)) = got.iter().find(|(_, d)| d.len() != data.len()) {
            return Err(self.ctx(*r, OP, t).malformed(format!(
                "all_gather: rank {r} contributed {} bytes, this rank {}",
                d.len(),
                data.len()
            )));
        }
        Ok(got.into_iter().map(|(_, d)| d).collect())
    }

    /// [`all_gather`](Bootstrap::all_gather) into one buffer of `size × data.len()` bytes.
    pub fn all_gather_flat(&self, data: &[u8]) -> Result<Vec<u8>> {
        Ok(self.all_gather(data)?.concat())
    }

    fn broadcast_with(
        &self,
        root: usize,
        data: &mut Vec<u8>,
        watch: Option<Watch<'_>>,
    ) -> Result<()> {
        const OP: &str = "broadcast";
        self.check_peer(root)?;
        let (n, me, t) = (self.size, self.rank, self.op_timeout);
        let deadline = deadline_in(t);
        let seq = self.next_seq();
        let (up, down) = (
            coll_tag(OP_BROADCAST, UP, seq),
            coll_tag(OP_BROADCAST, DOWN, seq),
        );
        // Up: from `root` to rank 0 along root's ancestors.
        if root != 0 {
            if me == root {
                if let Some(p) = parent(me) {
                    self.coll_send(p, up, data, deadline, self.ctx(p, OP, t))?;
                }
            } else if in_subtree(root, me) {
                let Some(c) = children(me, n).find(|&c| in_subtree(root, c)) else {
                    return Err(self
                        .ctx(root, OP, t)
                        .malformed("no path to the root".into()));
                };
                let got = self.coll_recv(c, up, deadline, self.ctx(c, OP, t), watch)?;
                match parent(me) {
                    Some(p) => self.coll_send(p, up, &got, deadline, self.ctx(p, OP, t))?,
                    None => *data = got,
                }
            }
        }
        // Down: from rank 0 to everyone.
        if let Some(p) = parent(me) {
            let got = self.coll_recv(p, down, deadline, self.ctx(p, OP, t), watch)?;
            if me != root {
                *data = got;
            }
        }
        for c in children(me, n) {
            self.coll_send(c, down, data, deadline, self.ctx(c, OP, t))?;
        }
        Ok(())
    }
}

impl Bootstrap for TcpBootstrap {
    fn setup_phases(&self) -> Vec<super::super::SetupPhase> {
        self.phases.clone()
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// This rank's index among the ranks of its node (ranks with the same host identity, in
    /// rank order).
    fn local_rank(&self) -> usize {
        self.nodes.local_rank.get(self.rank).copied().unwrap_or(0)
    }

    fn ranks_per_node(&self) -> usize {
        self.node_of(self.rank)
            .map_or(1, |n| self.nodes.members[n].len())
    }

    /// The node of `rank` (nodes are numbered in order of their lowest rank).
    fn node_of(&self, rank: usize) -> Option<usize> {
        self.nodes.node_of.get(rank).copied()
    }

    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        let ctx = self.ctx(peer, "send", self.op_timeout);
        self.send_frame(
            peer,
            wire::CHANNEL_USER,
            tag,
            data,
            deadline_in(self.op_timeout),
            ctx,
        )
    }

    /// Opens the link to `peer` first if there is none (so that a peer that has gone is
    /// noticed at once), then waits.
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        let ctx = self.ctx(peer, "recv", timeout);
        let deadline = deadline_in(timeout);
        self.check_peer(peer)?;
        if peer != self.rank && self.links.out(peer).is_none() && self.mailbox.down(peer).is_none()
        {
            // A link that cannot be opened marks the peer down when its listener is gone; the
            // receive then reports that (frames it sent before are still delivered first).
            let _ = self.link(peer, deadline, ctx);
        }
        self.recv_frame(peer, wire::CHANNEL_USER, tag, deadline, ctx, Some(watch))
    }

    /// Waits on every peer's queue at once (the mailbox's condition variable), opening the
    /// links that are not open yet first, as `recv_watched` does.
    fn recv_any(&self, peers: &[usize], tag: u64, timeout: Duration) -> Result<(usize, Vec<u8>)> {
        let deadline = deadline_in(timeout);
        for &peer in peers {
            self.check_peer(peer)?;
            if peer != self.rank
                && self.links.out(peer).is_none()
                && self.mailbox.down(peer).is_none()
            {
                let _ = self.link(peer, deadline, self.ctx(peer, "recv_any", timeout));
            }
        }
        match self
            .mailbox
            .recv_any(peers, wire::CHANNEL_USER, tag, deadline)
        {
            Ok(got) => Ok(got),
            Err((peer, RecvFail::Timeout)) => {
                Err(self.ctx(peer, "recv_any", timeout).timeout_error())
            }
            Err((peer, RecvFail::Down(d))) => Err(d.to_error(&self.ctx(peer, "recv_any", timeout))),
        }
    }

    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        watch()?;
        let deadline = deadline_in(self.op_timeout);
        self.barrier_until(deadline, self.op_timeout, "barrier", Some(watch))
    }

    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        watch()?;
        self.all_gather_with(data, Some(watch))
    }

    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        watch()?;
        self.broadcast_with(root, data, Some(watch))
    }

    fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    fn left_peer(&self) -> Option<(usize, Duration)> {
        self.mailbox
            .first_left()
            .map(|(peer, at)| (peer, at.elapsed()))
    }
    fn forgo_goodbye(&self) {
        self.goodbye.store(false, Ordering::Release);
    }
    fn secret(&self) -> Option<crate::auth::Secret> {
        self.key.get().map(|w| w.key)
    }
    fn dead_peer(&self) -> Option<(usize, String)> {
        self.mailbox
            .first_down()
            .map(|(peer, why)| (peer, why.describe()))
    }
    fn dead_peers(&self) -> Vec<(usize, String)> {
        let all = self.mailbox.all_down().into_iter();
        all.map(|(peer, why)| (peer, why.describe())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_tags_do_not_collide() {
        assert_ne!(coll_tag(OP_BARRIER, 1, 5), coll_tag(OP_BARRIER, 0, 5));
        assert_ne!(coll_tag(OP_BARRIER, 0, 5), coll_tag(OP_ALL_GATHER, 0, 5));
        assert_ne!(coll_tag(OP_BROADCAST, 0, 5), coll_tag(OP_BROADCAST, 0, 6));
    }

    #[test]
    fn the_tree_covers_every_rank_once() {
        for n in [1, 2, 3, 7, 8, 100, 1024, 1025] {
            let mut parents = 0;
            for r in 0..n {
                for c in children(r, n) {
                    assert_eq!(parent(c), Some(r));
                    parents += 1;
                }
                assert!(in_subtree(r, 0));
                assert_eq!(
                    subtree_size(r, n),
                    (0..n).filter(|&x| in_subtree(x, r)).count(),
                    "subtree of {r} in {n}"
                );
            }
            assert_eq!(parents, n - 1, "edges of a tree of {n}");
        }
        assert!(!in_subtree(2, 1));
        assert!(in_subtree(4, 1) && in_subtree(9, 1) && !in_subtree(5, 1));
    }

    #[test]
    fn items_are_checked() {
        let mut m = Vec::new();
        put_item(&mut m, 1, b"ab");
        put_item(&mut m, 3, b"");
        let mut seen = vec![false; 4];
        let got = items(&m, &mut seen, |r| r % 2 == 1).unwrap();
        assert_eq!(got, vec![(1, b"ab".to_vec()), (3, Vec::new())]);
        let mut seen = vec![false; 4];
        assert!(
            items(&m, &mut seen, |r| r == 1).is_err(),
            "rank 3 not allowed"
        );
        let mut seen = vec![false; 4];
        assert!(items(&[m.clone(), m.clone()].concat(), &mut seen, |_| true).is_err());
        for cut in 1..m.len() {
            let mut seen = vec![false; 4];
            let r = items(&m[..cut], &mut seen, |_| true);
            assert!(r.is_err() || cut == 10, "cut at {cut}: {r:?}");
        }
    }
}
