//! NCCL's calls for a world that loses and gains ranks: `ncclCommRevoke`, `ncclCommShrink`
//! (`NCCL_SHRINK_DEFAULT`, `NCCL_SHRINK_ABORT`), `ncclCommGetUniqueId` and `ncclCommGrow`,
//! each the library's (`mscclpp::collectives`' `revoke`, `shrink`, `grow`; the host's
//! `Communicator::grow_ticket`).
//!
//! - **Revoke** ends the communicator's work: the library refuses its later calls
//!   (`ncclInvalidUsage`, "revoked"), aborts it (every kernel waiting on a peer returns) and
//!   waits until the work it queued has ended (`REVOKE_DRAIN`, 10 s at most). NCCL reports
//!   `ncclInProgress` until the communicator is quiescent; here the call returns once it is,
//!   so it never says `ncclInProgress`. `ncclCommGetAsyncError` keeps saying why the
//!   communicator failed (a dead peer: `ncclRemoteError`), if it did. `revokeFlags` must be
//!   `NCCL_REVOKE_DEFAULT`.
//! - **Shrink** makes a communicator of every rank but `excludeRanksList`, numbered in the
//!   parent's order, over the survivors' bootstrap links, with new resources (the library's
//!   `Collectives::shrink`); every survivor passes the same list (one that differs fails every
//!   rank that hears it: `ncclInvalidUsage`). `NCCL_SHRINK_ABORT` revokes the parent first
//!   (the way to shrink a communicator whose peer died mid-call); `NCCL_SHRINK_DEFAULT` leaves
//!   it as it is. A rank that lists itself takes no part and gets a null `newcomm` (an
//!   excluded rank need not call it). Inside a group it runs at `ncclGroupEnd`; otherwise it
//!   blocks, whatever `config->blocking` says. The new communicator keeps the parent's device;
//!   `config` may name it (`commName`).
//! - **Grow**: `ncclCommGetUniqueId` on rank 0 of a communicator binds the root of a grown
//!   world and returns its id (one at a time: a second before the grow consumed the first is
//!   `ncclInvalidUsage`). Every rank of the communicator calls `ncclCommGrow(comm, nRanks,
//!   id, -1, …)`, rank 0 with the id, the others with `NULL`; each newcomer calls
//!   `ncclCommGrow(NULL, nRanks, &id, rank, …)` with its rank (the old size or more), which is
//!   the init of a rank of that world (`ncclCommInitRankConfig`). The old ranks keep their
//!   ranks. The id is consumed by the grow, which succeeds or not.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use mscclpp::host::membership::GrowTicket;

use crate::abi::{
    NCCL_REVOKE_DEFAULT, NCCL_SHRINK_ABORT, NCCL_SHRINK_DEFAULT, ncclConfig_t, ncclResult_t,
    ncclUniqueId,
};
use crate::args::{rank_arg, read_versioned};
use crate::comm::{Comm, Handle};
use crate::error::{NcclError, Outcome};
use crate::group;
use crate::init;
use crate::sync::lock;

/// Grow tickets made by `ncclCommGetUniqueId` and not consumed yet, by communicator handle.
static TICKETS: Mutex<Option<HashMap<usize, GrowTicket>>> = Mutex::new(None);

/// `ncclCommRevoke` (module docs).
pub fn revoke(comm: *mut c_void, flags: c_int) -> Outcome {
    if flags != NCCL_REVOKE_DEFAULT {
        return Err(NcclError::OutOfRange {
            what: "revokeFlags",
            value: flags.into(),
            expected: "NCCL_REVOKE_DEFAULT (0)".into(),
        });
    }
    let c = Handle::ready(comm)?;
    c.coll
        .revoke()
        .map_err(NcclError::library("revoking the communicator"))?;
    Ok(ncclResult_t::ncclSuccess)
}

/// A shrink's new communicator, made now or at the group's end.
struct ShrinkJob {
    parent: Arc<Comm>,
    exclude: Vec<usize>,
    name: String,
}

impl group::Init for ShrinkJob {
    fn run(&self) -> Result<Comm, NcclError> {
        let coll = self
            .parent
            .coll
            .shrink(&self.exclude)
            .map_err(NcclError::library("shrinking the communicator"))?;
        let c = Comm::new(coll, self.name.clone())?;
        tracing::info!(
            "{}: rank {} of {} shrunk from {} (without {:?})",
            self.name,
            c.rank,
            c.nranks,
            self.parent.name,
            self.exclude
        );
        Ok(c)
    }
}

/// A grow's new communicator for a rank of the old world, made now or at the group's end.
struct GrowJob {
    parent: Arc<Comm>,
    nranks: usize,
    ticket: Mutex<Option<GrowTicket>>,
    name: String,
}

impl group::Init for GrowJob {
    fn run(&self) -> Result<Comm, NcclError> {
        let ticket = lock(&self.ticket).take();
        let mut env = None;
        let coll = self.parent.coll.grow(self.nranks, ticket, |cfg| {
            init::configure(cfg.clone()).unwrap_or_else(|e| {
                env = Some(e);
                cfg
            })
        });
        if let Some(e) = env {
            return Err(e);
        }
        let coll = coll.map_err(NcclError::library("growing the communicator"))?;
        Comm::new(coll, self.name.clone())
    }
}

/// The name of a communicator made from `parent` by `what` (`config->commName` if set).
fn name(config: *const ncclConfig_t, parent: &Comm, what: &str) -> Result<String, NcclError> {
    // SAFETY: NCCL's contract: `config` is null or a struct of its declared size.
    let cfg = unsafe { read_versioned(config, "ncclConfig_t") }?.unwrap_or_default();
    Ok(init::comm_name(&cfg).unwrap_or_else(|| format!("{} {what}", parent.name)))
}

/// Makes the communicator of `job` for the handle written to `newcomm`: at the group's end
/// (the handle at once, its size known then), or now.
fn make(job: Box<dyn group::Init>, parent: &Comm, newcomm: *mut *mut c_void) -> Outcome {
    if group::in_group() {
        let (h, ptr) = Handle::create(parent.rank, 0, parent.device, true);
        init::write_comm(newcomm, ptr);
        group::defer_init(h, job);
        return Ok(ncclResult_t::ncclSuccess);
    }
    match job.run() {
        Ok(c) => {
            let (h, ptr) = Handle::create(c.rank, c.nranks, c.device, false);
            h.finish(Ok(c));
            init::write_comm(newcomm, ptr);
            Ok(ncclResult_t::ncclSuccess)
        }
        Err(e) => {
            init::write_comm(newcomm, std::ptr::null_mut());
            Err(e)
        }
    }
}

/// `ncclCommShrink` (module docs).
pub fn shrink(
    comm: *mut c_void,
    exclude: *const c_int,
    count: c_int,
    newcomm: *mut *mut c_void,
    config: *const ncclConfig_t,
    flags: c_int,
) -> Outcome {
    let c = Handle::ready(comm)?;
    if newcomm.is_null() {
        return Err(NcclError::Null { what: "newcomm" });
    }
    if flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT {
        return Err(NcclError::OutOfRange {
            what: "shrinkFlags",
            value: flags.into(),
            expected: "NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)".into(),
        });
    }
    let count = usize::try_from(count).map_err(|_| NcclError::OutOfRange {
        what: "excludeRanksCount",
        value: count.into(),
        expected: "0 or more".into(),
    })?;
    if count > 0 && exclude.is_null() {
        return Err(NcclError::Null {
            what: "excludeRanksList",
        });
    }
    let listed = if count == 0 {
        &[][..]
    } else {
        // SAFETY: NCCL's contract: `excludeRanksList` holds `excludeRanksCount` ints.
        unsafe { std::slice::from_raw_parts(exclude, count) }
    };
    let ranks = listed
        .iter()
        .map(|&r| rank_arg("a rank of excludeRanksList", r, c.nranks))
        .collect::<Result<Vec<_>, _>>()?;
    let name = name(config, &c, "shrunk")?;
    if flags == NCCL_SHRINK_ABORT {
        revoke(comm, NCCL_REVOKE_DEFAULT)?;
    }
    if ranks.contains(&c.rank) {
        init::write_comm(newcomm, std::ptr::null_mut());
        return Ok(ncclResult_t::ncclSuccess);
    }
    let job = ShrinkJob {
        parent: c.clone(),
        exclude: ranks,
        name,
    };
    make(Box::new(job), &c, newcomm)
}

/// `ncclCommGetUniqueId` (module docs).
pub fn get_unique_id(comm: *mut c_void, out: *mut ncclUniqueId) -> Outcome {
    let c = Handle::ready(comm)?;
    if out.is_null() {
        return Err(NcclError::Null { what: "uniqueId" });
    }
    let mut tickets = lock(&TICKETS);
    let tickets = tickets.get_or_insert_with(HashMap::new);
    if tickets.contains_key(&(comm as usize)) {
        return Err(NcclError::Usage {
            what: "ncclCommGetUniqueId: the id made before has not been consumed by \
                   ncclCommGrow yet",
        });
    }
    let addr = SocketAddr::new(init::root_ip()?, 0);
    let ticket = c
        .coll
        .communicator()
        .grow_ticket(addr)
        .map_err(NcclError::library("making the grown world's id"))?;
    init::write_id(out, &ticket.id());
    tickets.insert(comm as usize, ticket);
    Ok(ncclResult_t::ncclSuccess)
}

/// `ncclCommGrow` (module docs).
pub fn grow(
    comm: *mut c_void,
    nranks: c_int,
    id: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut *mut c_void,
    config: *const ncclConfig_t,
) -> Outcome {
    if newcomm.is_null() {
        return Err(NcclError::Null { what: "newcomm" });
    }
    if comm.is_null() {
        // A newcomer: the init of a rank of the grown world.
        if id.is_null() {
            return Err(NcclError::Null { what: "uniqueId" });
        }
        // SAFETY: checked non-null; NCCL's contract: a readable `ncclUniqueId`.
        let id = unsafe { &*id };
        return init::init_rank(newcomm, nranks, id, rank, config);
    }
    let c = Handle::ready(comm)?;
    if rank != -1 {
        return Err(NcclError::OutOfRange {
            what: "rank",
            value: rank.into(),
            expected: "-1 for a rank of the communicator grown (it keeps its rank)".into(),
        });
    }
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n > c.nranks)
        .ok_or(NcclError::OutOfRange {
            what: "nRanks",
            value: nranks.into(),
            expected: format!("more than the communicator's {} ranks", c.nranks),
        })?;
    let ticket = lock(&TICKETS)
        .as_mut()
        .and_then(|t| t.remove(&(comm as usize)));
    let ticket = match (id.is_null(), ticket) {
        (true, None) => None,
        (false, Some(t)) => {
            // SAFETY: checked non-null; NCCL's contract: a readable `ncclUniqueId`.
            let given = init::parse_id(unsafe { &*id })?;
            if given != t.id() {
                return Err(NcclError::Usage {
                    what: "ncclCommGrow: uniqueId is not the id ncclCommGetUniqueId made on \
                           this communicator",
                });
            }
            Some(t)
        }
        (false, None) => {
            return Err(NcclError::Usage {
                what: "ncclCommGrow: a uniqueId was passed, but ncclCommGetUniqueId made none \
                       on this communicator (rank 0 makes it and passes it; the others pass \
                       NULL)",
            });
        }
        (true, Some(_)) => {
            return Err(NcclError::Usage {
                what: "ncclCommGrow: this rank made the grow id with ncclCommGetUniqueId and \
                       must pass it (it is consumed now)",
            });
        }
    };
    let job = GrowJob {
        name: name(config, &c, "grown")?,
        parent: c.clone(),
        nranks: n,
        ticket: Mutex::new(ticket),
    };
    make(Box::new(job), &c, newcomm)
}
