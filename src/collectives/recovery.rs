//! Keeping on when a rank dies: [`Collectives::revoke`] ends and drains what these collectives
//! queued, [`Collectives::shrink`] makes the collectives of the survivors, [`Collectives::grow`]
//! those of a world with newcomers (NCCL's `ncclCommRevoke`, `ncclCommShrink`,
//! `ncclCommGrow`).
//!
//! What a survivor does (RELIABILITY.md, "Recovery"): a call fails, or
//! `communicator().async_error()` says, with `Error::Remote` naming the dead rank (or, for a
//! rank stopped but not dead, once it has been silent past the bootstrap's peer timeout);
//! `revoke()` (the kernels waiting on the dead rank are released by the abort, the streams are
//! waited for, later calls are refused with `Error::Revoked`); `shrink(&failed)` with the
//! ranks every survivor agrees on (`Communicator::failed_ranks`); then the calls go on with
//! the shrunk collectives, and the old ones are dropped (after the revoke nothing of theirs
//! runs, so dropping them frees nothing in use). The calls that were in flight when the rank
//! died are lost: their outputs hold whatever the released kernels left.
//!
//! A shrunk or grown `Collectives` is built from nothing of the old one's: a new communicator
//! (`mscclpp_host::membership`), then the whole set-up of [`Collectives::with_config`] with the
//! old one's configuration — connections, scratch, channels, the registration service, every
//! algorithm. That costs a set-up (its time is RELIABILITY.md's "kill to first good
//! collective") and, while the old one is alive, its memory twice; in exchange the new world
//! cannot inherit a channel, a semaphore count or an LL flag that the dead rank left half
//! advanced. Registrations (`register_buffer`, windows) are not carried over: register again.

use std::sync::Arc;
use std::time::Duration;

use mscclpp_host::bootstrap::BootstrapConfig;
use mscclpp_host::membership::GrowTicket;
use mscclpp_host::{Error, Result};

use super::api::Collectives;

/// How long [`Collectives::revoke`] waits for the work it released to end.
pub const REVOKE_DRAIN: Duration = Duration::from_secs(10);

impl Collectives {
    /// Revokes these collectives (NCCL's `ncclCommRevoke`): later calls are refused with
    /// `Error::Revoked`; the communicator is aborted, which releases every kernel of it that
    /// waits on a peer (queued ones return at their first wait); then this waits, up to
    /// [`REVOKE_DRAIN`], until the work queued on every stream these collectives used has
    /// ended (the issue order's marker after the last collective, `order.rs`, and the
    /// one-sided calls' events, `inflight.rs`). Not collective. On return nothing of these collectives
    /// runs, so they may be dropped or shrunk; `Err(Error::Aborted)` if work still ran at the
    /// deadline (then keep them alive: their memory may still be in use).
    pub fn revoke(&self) -> Result<()> {
        let cx = &self.engine().cx;
        cx.revoke();
        cx.comm.abort();
        let deadline = std::time::Instant::now() + REVOKE_DRAIN;
        if self.engine().order.drain(REVOKE_DRAIN)?
            && cx
                .inflight
                .drain(deadline.saturating_duration_since(std::time::Instant::now()))?
        {
            return Ok(());
        }
        Err(Error::Aborted {
            reason: format!(
                "revoked, but the work queued before had not ended {REVOKE_DRAIN:?} later"
            ),
        })
    }

    /// The collectives of every rank but `exclude` (NCCL's `ncclCommShrink`): a new world
    /// over the survivors' bootstrap links (`Communicator::shrink`), set up afresh with this
    /// one's configuration (module docs). Collective over the survivors, which pass the same
    /// set. Works on revoked or aborted collectives; these are left as they are.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Collectives> {
        let comm = self.communicator().shrink(exclude)?;
        Self::with_config(Arc::new(comm), self.requested_config())
    }

    /// The collectives of a grown world (NCCL's `ncclCommGrow`): this world's ranks keep
    /// their ranks, newcomers join as ranks `size()..new_size` with the ticket's id
    /// (`Communicator::grow`; rank 0 passes the ticket, see `Communicator::grow_ticket`), set up
    /// afresh with this one's configuration. The newcomers make theirs with
    /// [`Collectives::with_config`] and the same configuration
    /// ([`requested_config`](Self::requested_config) of any old rank, not the
    /// [`config`](Self::config) set-up fitted to the old world, which differs when ranks share a
    /// GPU; a different one fails every rank's set-up with `Error::ConfigMismatch`).
    pub fn grow(
        &self,
        new_size: usize,
        ticket: Option<GrowTicket>,
        configure: impl FnOnce(BootstrapConfig) -> BootstrapConfig,
    ) -> Result<Collectives> {
        let comm = self.communicator().grow(new_size, ticket, configure)?;
        Self::with_config(Arc::new(comm), self.requested_config())
    }
}
