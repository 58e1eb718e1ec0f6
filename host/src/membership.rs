//! A world that loses ranks and gains them: [`Communicator::shrink`] (a new world of the
//! survivors, over the links they already have), [`Communicator::grow`] with a
//! [`GrowTicket`] (a new world of the old ranks and newcomers), and what the failure detector
//! knows ([`Communicator::failed_ranks`]).
//!
//! # Shrink
//!
//! Every survivor calls `shrink` with the ranks to exclude (the same set everywhere; the ranks
//! the failure detector found dead are [`Communicator::failed_ranks`]). The new world is a
//! [`SubBootstrap`] of the survivors over this communicator's bootstrap links, so it opens no
//! socket and needs no root: a dead rank 0 does not matter. First every member sends its
//! exclusion set (a bitmap of the parent's ranks, under [`SHRINK_TAG`] with the sub-world's
//! number) to every member and to every excluded rank the failure detector does not know dead,
//! and receives every member's: a set that differs fails the rank that receives it with
//! [`Error::MembershipMismatch`] naming the sender (so with different sets every member that
//! disagrees fails at once, and so does an excluded rank that called `shrink` as a member),
//! and nothing else happens. Then a [`Communicator`] is built over it: its own status word,
//! health monitor
//! and registered memories — fresh resources; nothing of the parent's communicator is shared,
//! so the parent (aborted, revoked, or still healthy) may be dropped before or after.
//!
//! The parent's bootstrap keeps knowing the excluded ranks dead; the new world's bootstrap
//! reports only its members' deaths ([`Bootstrap::dead_peers`](crate::bootstrap::Bootstrap::dead_peers) filtered by the sub-bootstrap),
//! so its monitor does not abort it for a rank it excluded.
//!
//! A rank that dies *during* a shrink: a member waiting for its exclusion set fails at once
//! (the link is down) with the bootstrap's error about it, or, if the set had already come,
//! the new communicator's monitor aborts it as for any death; either way the survivors shrink
//! again. A rank excluded by every member that calls `shrink` with the same set is refused (it
//! is not a member of its own world: [`Error::BootstrapConfig`]); one that does not call it
//! is left out (the set sent to it waits in its bootstrap's mailbox, a few bytes).
//!
//! # Grow
//!
//! Rank 0 of a (healthy) world makes a [`GrowTicket`]: a root listener bound at an address it
//! chooses and the [`UniqueId`] naming it (a fresh magic and a fresh random secret, so the
//! newcomers authenticate exactly as the ranks of any unique-id world do). The application
//! hands the id to the newcomers; every rank of the world calls `grow` with the new size (rank
//! 0 with the ticket), and every newcomer joins as a rank of a new world of that size with the
//! id (`TcpBootstrap::init` with `BootstrapConfig::new(rank, new_size, id)`, then
//! `Communicator::new`), its rank between the old size and the new. The world's ranks agree
//! in one all-gather over their bootstrap (one id, one size: [`Error::MembershipMismatch`]
//! otherwise), then each keeps its rank in the new world. The new world is a new bootstrap
//! (every rank's listener and tree links: O(1) sockets per rank, as any world) and a new
//! communicator; the old world's stay as they are until dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::bootstrap::{
    BootstrapConfig, RootListener, SubBootstrap, TcpBootstrap, UNIQUE_ID_BYTES, UniqueId,
};
use crate::communicator::Communicator;
use crate::error::{Error, Result};

/// The range of bootstrap tags of the shrinks' agreements: `SHRINK_TAG | id`, `id` the
/// sub-world's number (below [`MAX_SUB_ID`](crate::bootstrap::MAX_SUB_ID), so within the range;
/// no other tag of the crate has the top nibble `0xD`).
pub const SHRINK_TAG: u64 = 0xD << 60;

/// What rank 0 of a world needs to grow it: the root listener of the grown world and the id
/// that names it, for the newcomers ([`Communicator::grow_ticket`]). Used by one grow.
pub struct GrowTicket {
    id: UniqueId,
    listener: RootListener,
    /// The size of the world that made it.
    from_size: usize,
}

impl std::fmt::Debug for GrowTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrowTicket")
            .field("id", &self.id)
            .field("from_size", &self.from_size)
            .finish()
    }
}

impl GrowTicket {
    /// The id the newcomers join with (it carries the grown world's secret: hand it to them as
    /// a password).
    pub fn id(&self) -> UniqueId {
        self.id
    }
}

impl Communicator {
    /// The ranks the failure detector knows dead (their bootstrap links ended without a
    /// goodbye, they flooded or were silent past the peer timeout, or another rank reported
    /// them), sorted: what every survivor passes to [`shrink`](Self::shrink) once they agree.
    /// Ranks learn of a death at slightly different times (a few milliseconds apart); a shrink
    /// whose sets differ fails with [`Error::MembershipMismatch`] and can be retried.
    pub fn failed_ranks(&self) -> Vec<usize> {
        let mut dead: Vec<usize> = self
            .bootstrap()
            .dead_peers()
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        dead.sort_unstable();
        dead.dedup();
        dead
    }

    /// A new world of every rank but `exclude` (NCCL's `ncclCommShrink`), ranked in the
    /// order of this one (module docs). Collective over the survivors, which pass the same
    /// set; works on an aborted communicator (that is what it is for). This communicator is
    /// left as it is.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let n = self.size();
        let mut ex = exclude.to_vec();
        ex.sort_unstable();
        ex.dedup();
        if let Some(&r) = ex.iter().find(|&&r| r >= n) {
            return Err(Error::NoSuchRank { rank: r, size: n });
        }
        let members: Vec<usize> = (0..n).filter(|r| ex.binary_search(r).is_err()).collect();
        let (links, id) = self.sub_world_base();
        let sub = SubBootstrap::new(links.clone(), members.clone(), id)?;
        let mut mine = vec![0u8; n.div_ceil(8)];
        for &r in &ex {
            mine[r / 8] |= 1 << (r % 8);
        }
        // Every member's set, to every rank that may be waiting for it (module docs): the
        // members, and the excluded ranks not known dead (one that thinks itself a member
        // hears at once that it is not).
        let dead: Vec<usize> = links.dead_peers().into_iter().map(|(r, _)| r).collect();
        let me = self.rank();
        let tag = SHRINK_TAG | id;
        for r in (0..n).filter(|&r| r != me && !dead.contains(&r)) {
            if let Err(e) = links.send(r, tag, &mine)
                && members.contains(&r)
            {
                return Err(e);
            }
        }
        let set = |b: &[u8]| -> Vec<usize> {
            (0..n)
                .filter(|&r| b.get(r / 8).is_some_and(|x| x & (1 << (r % 8)) != 0))
                .collect()
        };
        for &r in members.iter().filter(|&&r| r != me) {
            let theirs = links.recv(r, tag)?;
            if theirs != mine {
                return Err(Error::MembershipMismatch {
                    rank: r,
                    what: "excluded ranks",
                    mine: format!("{ex:?}"),
                    theirs: format!("{:?}", set(&theirs)),
                });
            }
        }
        Communicator::new(Arc::new(sub), self.gpu().clone())
    }

    /// On rank 0 of this world: binds the root of a grown world at `addr` (a concrete IP; port
    /// 0 picks one) and returns the ticket whose id the newcomers join with
    /// ([`grow`](Self::grow)). Not collective.
    pub fn grow_ticket(&self, addr: SocketAddr) -> Result<GrowTicket> {
        if self.rank() != 0 {
            return Err(Error::BootstrapConfig(format!(
                "rank {} asked for a grow ticket: rank 0 makes it (it serves the grown world's \
                 root)",
                self.rank()
            )));
        }
        let (id, listener) = UniqueId::bind(addr)?;
        Ok(GrowTicket {
            id,
            listener,
            from_size: self.size(),
        })
    }

    /// A new world of `new_size` ranks: this world's ranks, each keeping its rank, and the
    /// newcomers that join with the ticket's id as ranks `size()..new_size` (NCCL's
    /// `ncclCommGrow`; module docs). Every rank of this world calls it, rank 0 with the ticket
    /// it made, the others with `None`. `configure` may adjust the new bootstrap's
    /// configuration (host identity, interface, deadlines; it starts as
    /// `BootstrapConfig::new(rank, new_size, id)` with this world's operation deadline); rank
    /// and size must stay. This communicator is left as it is.
    pub fn grow(
        &self,
        new_size: usize,
        ticket: Option<GrowTicket>,
        configure: impl FnOnce(BootstrapConfig) -> BootstrapConfig,
    ) -> Result<Communicator> {
        let (me, n) = (self.rank(), self.size());
        if new_size <= n {
            return Err(Error::BootstrapConfig(format!(
                "growing a world of {n} ranks to {new_size}: the new size must be larger"
            )));
        }
        if let Some(t) = &ticket
            && (me != 0 || t.from_size != n)
        {
            return Err(Error::BootstrapConfig(format!(
                "rank {me} of {n} passed a grow ticket made by rank 0 of a world of {}: only \
                 rank 0 of the world that made it passes it",
                t.from_size
            )));
        }
        // `has id u8 | new size u64 | id`: rank 0's id and everyone's size, agreed.
        let mut word = vec![0u8; 9 + UNIQUE_ID_BYTES];
        if let Some(t) = &ticket {
            word[0] = 1;
            word[9..].copy_from_slice(&t.id.to_bytes());
        }
        word[1..9].copy_from_slice(&(new_size as u64).to_le_bytes());
        let all = self.bootstrap().all_gather(&word)?;
        let mismatch = |rank, what, mine: String, theirs: String| Error::MembershipMismatch {
            rank,
            what,
            mine,
            theirs,
        };
        let mut id = None;
        for (r, theirs) in all.iter().enumerate() {
            if theirs.len() != word.len() {
                let len = |l: usize| format!("a request of {l} bytes");
                return Err(mismatch(
                    r,
                    "grow request",
                    len(word.len()),
                    len(theirs.len()),
                ));
            }
            let size = u64::from_le_bytes(theirs[1..9].try_into().unwrap_or_default());
            if size != new_size as u64 {
                return Err(mismatch(r, "size", new_size.to_string(), size.to_string()));
            }
            match (r, theirs[0]) {
                (0, 1) => id = Some(UniqueId::from_bytes(&theirs[9..])?),
                (_, 0) => {}
                _ => {
                    let has = |yes: bool| format!("{}a grow ticket", if yes { "" } else { "no " });
                    return Err(mismatch(r, "grow ticket", has(r == 0), has(r != 0)));
                }
            }
        }
        let Some(id) = id else {
            return Err(mismatch(
                0,
                "grow ticket",
                "a ticket from rank 0".into(),
                "none".into(),
            ));
        };
        let base =
            BootstrapConfig::new(me, new_size, id).with_timeout(self.bootstrap().op_timeout());
        let cfg = configure(base);
        if cfg.rank != me || cfg.size != new_size {
            return Err(Error::BootstrapConfig(format!(
                "a grow's configuration must keep rank {me} and size {new_size} (it has rank {} \
                 of {})",
                cfg.rank, cfg.size
            )));
        }
        let bs = match ticket {
            Some(t) => TcpBootstrap::init_with_root_listener(cfg, t.listener)?,
            None => TcpBootstrap::init(cfg)?,
        };
        Communicator::new(Arc::new(bs), self.gpu().clone())
    }
}
