//! The [`Bootstrap`] operations of a [`TcpBootstrap`]: data frames out (under the link's
//! writer lock) and in (from the mailbox), and the collectives over them.

use std::io;
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::mailbox::{LinkDown, RecvFail};
use super::super::net::Ctx;
use super::super::wire::{self, DataHeader};
use super::super::{WATCH_SLICE, Watch};
use super::{Bootstrap, TcpBootstrap};
use crate::error::{Error, Result};
use crate::socket::{IoFail, deadline_in, write_full};
use crate::sync::lock;

/// Payloads up to this size are sent in one write together with their header.
const COALESCE_BYTES: usize = 64 << 10;

// Collective tags: operation (8 bits) | round (8 bits) | sequence number (48 bits).
const OP_BARRIER: u64 = 1;
const OP_ALL_GATHER: u64 = 2;
const OP_BROADCAST: u64 = 3;
const SEQ_MASK: u64 = (1 << 48) - 1;

fn coll_tag(op: u64, round: u64, seq: u64) -> u64 {
    (op << 56) | ((round & 0xff) << 48) | (seq & SEQ_MASK)
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
        if data.len() as u64 > wire::MAX_DATA_LEN {
            return Err(Error::BootstrapMessageTooLarge {
                rank: self.rank,
                len: data.len(),
                max: wire::MAX_DATA_LEN,
            });
        }
        if peer == self.rank {
            self.mailbox.push(peer, channel, tag, data.to_vec());
            return Ok(());
        }
        let Some(link) = self.links.get(peer).and_then(Option::as_ref) else {
            return Err(ctx.io(IoFail::Closed));
        };
        if let Some(down) = self.mailbox.down(peer) {
            return Err(down.to_error(&ctx));
        }
        let mut w = lock(&link.writer);
        if let Some(why) = &w.broken {
            let source = io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("the connection was cut after an earlier send failed: {why}"),
            );
            return Err(Error::BootstrapIo {
                rank: self.rank,
                peer: ctx.peer,
                op: ctx.op,
                source,
            });
        }
        let header = DataHeader {
            channel,
            tag,
            len: data.len() as u64,
        }
        .encode();
        let sent = if data.len() <= COALESCE_BYTES {
            let mut frame = Vec::with_capacity(header.len() + data.len());
            frame.extend_from_slice(&header);
            frame.extend_from_slice(data);
            write_full(&w.stream, &frame, deadline)
        } else {
            write_full(&w.stream, &header, deadline)
                .and_then(|()| write_full(&w.stream, data, deadline))
        };
        if let Err(f) = sent {
            w.broken = Some(format!("{f:?}"));
            let _ = link.ctl.shutdown(Shutdown::Both);
            return Err(ctx.io(f));
        }
        Ok(())
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

    /// Dissemination barrier: in round k, send to rank + 2^k and hear from rank − 2^k.
    pub(super) fn barrier_until(
        &self,
        deadline: Instant,
        timeout: Duration,
        op: &'static str,
        watch: Option<Watch<'_>>,
    ) -> Result<()> {
        let (n, me) = (self.size, self.rank);
        let seq = self.next_seq();
        let (mut dist, mut round) = (1usize, 0u64);
        while dist < n {
            let tag = coll_tag(OP_BARRIER, round, seq);
            let (to, from) = ((me + dist) % n, (me + n - dist) % n);
            self.send_frame(
                to,
                wire::CHANNEL_COLLECTIVE,
                tag,
                &[],
                deadline,
                self.ctx(to, op, timeout),
            )?;
            let got = self.recv_frame(
                from,
                wire::CHANNEL_COLLECTIVE,
                tag,
                deadline,
                self.ctx(from, op, timeout),
                watch,
            )?;
            if !got.is_empty() {
                return Err(self.ctx(from, op, timeout).malformed(format!(
                    "{op}: a barrier message carries {} bytes",
                    got.len()
                )));
            }
            dist *= 2;
            round += 1;
        }
        Ok(())
    }

    fn all_gather_with(&self, data: &[u8], watch: Option<Watch<'_>>) -> Result<Vec<Vec<u8>>> {
        const OP: &str = "all_gather";
        let (n, me) = (self.size, self.rank);
        let deadline = deadline_in(self.op_timeout);
        let tag = coll_tag(OP_ALL_GATHER, 0, self.next_seq());
        for k in 1..n {
            let to = (me + k) % n;
            self.send_frame(
                to,
                wire::CHANNEL_COLLECTIVE,
                tag,
                data,
                deadline,
                self.ctx(to, OP, self.op_timeout),
            )?;
        }
        let mut out = vec![Vec::new(); n];
        out[me] = data.to_vec();
        for k in 1..n {
            let from = (me + n - k) % n;
            let ctx = self.ctx(from, OP, self.op_timeout);
            let got = self.recv_frame(from, wire::CHANNEL_COLLECTIVE, tag, deadline, ctx, watch)?;
            if got.len() != data.len() {
                return Err(ctx.malformed(format!(
                    "all_gather: rank {from} contributed {} bytes, this rank {}",
                    got.len(),
                    data.len()
                )));
            }
            out[from] = got;
        }
        Ok(out)
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
        let (n, me) = (self.size, self.rank);
        let deadline = deadline_in(self.op_timeout);
        let tag = coll_tag(OP_BROADCAST, 0, self.next_seq());
        if me == root {
            for k in 1..n {
                let to = (me + k) % n;
                self.send_frame(
                    to,
                    wire::CHANNEL_COLLECTIVE,
                    tag,
                    data,
                    deadline,
                    self.ctx(to, OP, self.op_timeout),
                )?;
            }
        } else {
            *data = self.recv_frame(
                root,
                wire::CHANNEL_COLLECTIVE,
                tag,
                deadline,
                self.ctx(root, OP, self.op_timeout),
                watch,
            )?;
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

    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        let ctx = self.ctx(peer, "recv", timeout);
        let deadline = deadline_in(timeout);
        self.recv_frame(peer, wire::CHANNEL_USER, tag, deadline, ctx, Some(watch))
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
    fn dead_peer(&self) -> Option<(usize, String)> {
        self.mailbox.first_down().map(|(peer, why)| {
            let reason = match why {
                LinkDown::Closed => "closed its bootstrap connection".to_string(),
                // `first_down` never names a peer that left.
                LinkDown::Left => "left after its goodbye".to_string(),
                LinkDown::Io(kind, msg) => {
                    format!("bootstrap link failed: {kind:?} {msg}")
                }
                LinkDown::Malformed(m) => format!("sent a malformed frame: {m}"),
            };
            (peer, reason)
        })
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
}
