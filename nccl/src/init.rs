//! Communicators' lives: unique ids, the inits (`ncclCommInitRank`, `…Config`, `…Scalable`,
//! `ncclCommInitAll`), `ncclCommSplit`, `ncclCommFinalize`, `ncclCommDestroy`,
//! `ncclCommAbort`, and what a communicator tells about itself (`ncclCommGetAsyncError`,
//! `ncclCommCount`, `ncclCommCuDevice`, `ncclCommUserRank`).
//!
//! # Unique ids
//! `ncclGetUniqueId` binds the bootstrap root's listening socket at once (this host's address
//! on `MSCCLPP_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME`, else its first interface that is up, else
//! loopback; a free port) and keeps it in this process, keyed by the id; rank 0's init in this
//! process takes it. So, as with PyTorch and vLLM, **the process that makes the id must be the
//! one that initialises rank 0**. `NCCL_COMM_ID=ip:port` makes the id from that address
//! instead (every process can then make it; rank 0 binds the port at init). The id is our
//! 40-byte bootstrap id followed by zeros, in NCCL's 128 bytes.
//!
//! # Inits
//! An init makes the rank's bootstrap (`TcpBootstrap`: every rank of the id meets at the
//! root), its communicator on the current device ([`comm::current_device`]) and its
//! collectives. Blocking (the default, or `ncclConfig_t::blocking = 1`, or `NCCL_COMM_BLOCKING`
//! unset or 1): the call returns when it is done. Non-blocking: the call returns
//! `ncclInProgress` at once and the init runs on a thread; `ncclCommGetAsyncError` says
//! `ncclInProgress` until it is done, then `ncclSuccess` or why it failed. Inside a group the
//! init runs at `ncclGroupEnd` (`group.rs`). Bootstrap deadlines: `MSCCLPP_BOOTSTRAP_TIMEOUT_MS`
//! (set-up and operations) and `MSCCLPP_BOOTSTRAP_OP_TIMEOUT_MS` (operations: a split, a
//! window's registration, a scratch region or hint awaited under capture, destroy waiting for
//! the communicator's work), default 10 minutes each ([`DEFAULT_DEADLINE`], PyTorch's default
//! timeout; the library's own default, for Rust callers, stays 30 s). A collective call itself
//! waits for nothing on the host; a dead peer is seen at once (its socket closes), and
//! `ncclCommAbort` ends the waits of a ready communicator at once. A peer silent for
//! `MSCCLPP_BOOTSTRAP_PEER_TIMEOUT_MS` (default 30 s, 0: never) is taken for stopped.
//!
//! # Splits
//! `ncclCommSplit` is the library's `Communicator::split` of the parent (one all-gather over
//! the parent's bootstrap, then a sub-bootstrap over its links: no new sockets), with new
//! collectives on the parent's device. Inside a group it runs at `ncclGroupEnd` with the
//! inits; its handle exists at once (pending; its size unknown until then).
//! `NCCL_SPLIT_NOCOLOR` takes part and gets a null handle.
//!
//! # Ends
//! `ncclCommFinalize` waits for the communicator's queued work, and only its (the marker the
//! library records after its last call, whatever stream it was on: `Comm::flush`), and refuses
//! later calls. `ncclCommDestroy` finalizes if needed and frees the communicator.
//! `ncclCommAbort` sets the abort flag (every kernel of the communicator that waits for a peer
//! returns), returns at once, and frees the communicator on a thread of its own once its work
//! is done ([`comm::retire`]). A non-blocking init whose thread panics fails its communicator
//! (`ncclInternalError`), never leaves it `ncclInProgress`.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp::collectives::Collectives;
use mscclpp::host::Error as HostError;
use mscclpp::host::bootstrap::{
    BootstrapConfig, Cancel, RootListener, TcpBootstrap, UNIQUE_ID_BYTES, UniqueId, env, local_ip,
    parse_root,
};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::BackendKind;

use crate::abi::{
    NCCL_CONFIG_UNDEF_INT, NCCL_SPLIT_NOCOLOR, ncclConfig_t, ncclResult_t, ncclUniqueId,
};
use crate::args::{rank_arg, read_versioned};
use crate::comm::{self, Comm, Handle};
use crate::error::{NcclError, Outcome, set_last_error};
use crate::group;
use crate::sync::lock;

/// Root listeners bound by `ncclGetUniqueId`, by the id's bytes.
static ROOTS: Mutex<Option<HashMap<[u8; UNIQUE_ID_BYTES], RootListener>>> = Mutex::new(None);

fn keep_root(id: &UniqueId, l: RootListener) {
    lock(&ROOTS)
        .get_or_insert_with(HashMap::new)
        .insert(id.to_bytes(), l);
}

fn take_root(id: &UniqueId) -> Option<RootListener> {
    lock(&ROOTS).as_mut()?.remove(&id.to_bytes())
}

/// The interface(s) to use: `MSCCLPP_SOCKET_IFNAME`, else NCCL's `NCCL_SOCKET_IFNAME` when it
/// names interfaces (an exact `=` prefix is dropped; an exclusion list `^…` is not followed).
fn socket_ifname() -> Option<String> {
    let get = |k: &str| {
        std::env::var(k)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(v) = get(env::SOCKET_IFNAME) {
        return Some(v);
    }
    let v = get("NCCL_SOCKET_IFNAME")?;
    if v.starts_with('^') {
        tracing::debug!("NCCL_SOCKET_IFNAME={v}: exclusion lists are not followed");
        return None;
    }
    Some(v.trim_start_matches('=').to_string())
}

/// `ncclGetUniqueId` (module docs).
pub fn get_unique_id(out: *mut ncclUniqueId) -> Outcome {
    if out.is_null() {
        return Err(NcclError::Null { what: "uniqueId" });
    }
    let lib = NcclError::library;
    let id = match std::env::var("NCCL_COMM_ID")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        Some(spec) => {
            let (_, addr) = parse_root(&spec).map_err(lib("reading NCCL_COMM_ID"))?;
            UniqueId::for_addr(addr).map_err(lib("making a unique id"))?
        }
        None => {
            let ip = root_ip()?;
            let (id, l) =
                UniqueId::bind(SocketAddr::new(ip, 0)).map_err(lib("binding the root's socket"))?;
            keep_root(&id, l);
            id
        }
    };
    write_id(out, &id);
    Ok(ncclResult_t::ncclSuccess)
}

/// Writes `id` into the caller's `ncclUniqueId` (our id's bytes, zeros after).
pub fn write_id(out: *mut ncclUniqueId, id: &UniqueId) {
    let mut raw = ncclUniqueId {
        internal: [0; crate::abi::NCCL_UNIQUE_ID_BYTES],
    };
    for (d, s) in raw.internal.iter_mut().zip(id.to_bytes()) {
        *d = s as c_char;
    }
    // SAFETY: checked non-null by every caller; NCCL's contract: a writable `ncclUniqueId`.
    unsafe { out.write(raw) };
}

/// Our id inside an `ncclUniqueId`: its first bytes, zeros after.
pub fn parse_id(id: &ncclUniqueId) -> Result<UniqueId, NcclError> {
    let b: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    let foreign = |source| NcclError::ForeignUniqueId {
        source: Box::new(source),
    };
    if b[UNIQUE_ID_BYTES..].iter().any(|&x| x != 0) {
        return Err(foreign(HostError::BootstrapUniqueId {
            reason: format!("bytes {UNIQUE_ID_BYTES} to 127 are not 0"),
        }));
    }
    UniqueId::from_bytes(&b[..UNIQUE_ID_BYTES]).map_err(foreign)
}

fn env_ms(k: &str) -> Result<Option<Duration>, NcclError> {
    match std::env::var(k).ok().map(|v| v.trim().to_string()) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(Duration::from_millis(n))),
            _ => Err(NcclError::library("reading the bootstrap's deadlines")(
                HostError::BootstrapConfig(format!(
                    "{k}={v:?} is not a positive number of milliseconds"
                )),
            )),
        },
    }
}

/// The drop-in's default bootstrap deadlines: PyTorch's default process-group timeout (10
/// minutes), so that no set-up wait of ours fires before PyTorch's watchdog would: ranks of a
/// real job reach their inits and first calls minutes apart (loading, compiling, checkpoints).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// `(set-up, operation)` deadlines of an init's bootstrap: `MSCCLPP_BOOTSTRAP_TIMEOUT_MS` sets
/// both, `MSCCLPP_BOOTSTRAP_OP_TIMEOUT_MS` the operations' alone; each unset one is
/// [`DEFAULT_DEADLINE`].
fn deadlines(setup: Option<Duration>, op: Option<Duration>) -> (Duration, Duration) {
    let setup = setup.unwrap_or(DEFAULT_DEADLINE);
    (setup, op.unwrap_or(setup))
}

/// `cfg` with what the environment sets of a bootstrap: interface, node identity, deadlines,
/// peer timeout (module docs).
pub fn configure(mut cfg: BootstrapConfig) -> Result<BootstrapConfig, NcclError> {
    if let Some(i) = socket_ifname() {
        cfg = cfg.with_ifname(i);
    }
    if let Ok(h) = std::env::var(env::HOSTID)
        && !h.trim().is_empty()
    {
        cfg = cfg.with_host_id(h.trim());
    }
    let (setup, op) = deadlines(env_ms(env::TIMEOUT_MS)?, env_ms(env::OP_TIMEOUT_MS)?);
    cfg = cfg.with_timeout(setup).with_op_timeout(op);
    if let Ok(v) = std::env::var(env::PEER_TIMEOUT_MS)
        && let Ok(ms) = v.trim().parse::<u64>()
    {
        cfg = cfg.with_peer_timeout(Some(Duration::from_millis(ms)));
    }
    Ok(cfg)
}

/// The address a root listens on: this host's on the configured interface (module docs).
pub fn root_ip() -> Result<std::net::IpAddr, NcclError> {
    local_ip(socket_ifname().as_deref()).map_err(NcclError::library("choosing the root's address"))
}

/// What a split makes its communicator from (`ncclCommSplit`).
#[derive(Clone)]
pub struct SplitFrom {
    /// The communicator split.
    pub parent: Arc<Comm>,
    /// The color (`None`: `NCCL_SPLIT_NOCOLOR`, the rank takes part and gets none).
    pub color: Option<u32>,
    /// The key that orders the new ranks.
    pub key: i64,
}

/// Where a new communicator comes from.
#[derive(Clone)]
pub enum Source {
    /// A bootstrap of this unique id (the inits).
    Id(UniqueId),
    /// A split (`ncclCommSplit`), over its parent's bootstrap links.
    Split(SplitFrom),
}

/// One rank's init, run by the calling thread, a group's end, or a non-blocking init's thread.
#[derive(Clone)]
pub struct InitJob {
    /// This rank.
    pub rank: usize,
    /// Ranks.
    pub nranks: usize,
    /// Where the communicator comes from.
    pub source: Source,
    /// The backend.
    pub kind: BackendKind,
    /// The device ordinal.
    pub device: usize,
    /// `ncclConfig_t::blocking`.
    pub blocking: bool,
    /// The communicator's name (for the log).
    pub name: String,
    /// Cancels the bootstrap's set-up (its handle's: `ncclCommAbort` / `ncclCommDestroy` of a
    /// pending init); `None` for a split (no bootstrap of its own).
    pub cancel: Option<Cancel>,
}

impl group::Init for InitJob {
    fn run(&self) -> Result<Comm, NcclError> {
        InitJob::run(self)
    }
}

impl InitJob {
    /// Bootstrap, communicator, collectives.
    pub fn run(&self) -> Result<Comm, NcclError> {
        let lib = NcclError::library;
        let id = match &self.source {
            Source::Id(id) => *id,
            Source::Split(s) => return self.split(s),
        };
        let gpu = comm::gpu(self.kind, self.device)?;
        let mut cfg = configure(BootstrapConfig::new(self.rank, self.nranks, id))?;
        if let Some(c) = &self.cancel {
            cfg = cfg.with_cancel(c.clone());
        }
        let root = if self.rank == 0 { take_root(&id) } else { None };
        let bs = match root {
            Some(l) => TcpBootstrap::init_with_root_listener(cfg, l),
            None => TcpBootstrap::init(cfg),
        }
        .map_err(lib("the bootstrap (meeting the other ranks)"))?;
        let c = Communicator::new(Arc::new(bs), gpu).map_err(lib("creating the communicator"))?;
        let coll = Collectives::new(Arc::new(c)).map_err(lib("setting up the collectives"))?;
        tracing::info!(
            "{}: rank {} of {} on {:?} device {} ready",
            self.name,
            self.rank,
            self.nranks,
            self.kind,
            self.device
        );
        Comm::new(coll, self.name.clone())
    }

    /// A split's communicator ([`split`]); [`NcclError::SplitWithoutColor`] for a rank that
    /// took part without a color.
    fn split(&self, s: &SplitFrom) -> Result<Comm, NcclError> {
        let lib = NcclError::library;
        let sub = s
            .parent
            .coll
            .communicator()
            .split(s.color, s.key)
            .map_err(lib("splitting the communicator"))?
            .ok_or(NcclError::SplitWithoutColor)?;
        let coll = Collectives::new(Arc::new(sub)).map_err(lib("setting up the collectives"))?;
        let c = Comm::new(coll, self.name.clone())?;
        tracing::info!(
            "{}: rank {} of {} split from {} (color {:?}, key {})",
            self.name,
            c.rank,
            c.nranks,
            s.parent.name,
            s.color,
            s.key
        );
        Ok(c)
    }
}

/// Whether an init blocks: `config.blocking` if set (0 or 1), else `NCCL_COMM_BLOCKING`, else
/// yes.
pub fn blocking_of(cfg: &ncclConfig_t) -> Result<bool, NcclError> {
    match cfg.blocking {
        0 => Ok(false),
        1 => Ok(true),
        NCCL_CONFIG_UNDEF_INT => Ok(std::env::var("NCCL_COMM_BLOCKING")
            .map(|v| v.trim() != "0")
            .unwrap_or(true)),
        v => Err(NcclError::OutOfRange {
            what: "config->blocking",
            value: v.into(),
            expected: "0 or 1".into(),
        }),
    }
}

fn name_of(cfg: &ncclConfig_t, id: &UniqueId, rank: usize) -> String {
    comm_name(cfg).unwrap_or_else(|| format!("comm {:04x} rank {rank}", id.magic() & 0xffff))
}

/// `config.commName`, if set (its first 64 characters).
pub fn comm_name(cfg: &ncclConfig_t) -> Option<String> {
    if cfg.commName.is_null() {
        return None;
    }
    // SAFETY: NCCL's contract: `commName` is null or a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(cfg.commName) }.to_string_lossy();
    Some(s.chars().take(64).collect())
}

/// Writes the `ncclComm_t` a caller asked for.
pub fn write_comm(out: *mut *mut c_void, v: *mut c_void) {
    // SAFETY: `out` was checked non-null by every caller; NCCL's contract: a writable
    // `ncclComm_t`.
    unsafe { out.write(v) };
}

/// Finishes `h` with what `run` returns, or with [`NcclError::Panicked`] if it panics (the
/// non-blocking init's thread: its communicator fails, never stays `ncclInProgress`).
fn finish_guarded(h: &Handle, run: impl FnOnce() -> Result<Comm, NcclError>) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or(Err(
        NcclError::Panicked {
            what: "initialise a communicator",
        },
    ));
    h.finish(result);
}

/// Starts `job` for the handle written to `out`: at the group's end, on a thread of its own
/// (non-blocking), or now.
fn start(out: *mut *mut c_void, mut job: InitJob) -> Outcome {
    if group::in_group() {
        let (h, ptr) = Handle::create(job.rank, job.nranks, job.device, true);
        job.cancel = Some(h.cancel.clone());
        group::defer_init(h, Box::new(job));
        write_comm(out, ptr);
        return Ok(ncclResult_t::ncclSuccess);
    }
    let (h, ptr) = Handle::create(job.rank, job.nranks, job.device, false);
    job.cancel = Some(h.cancel.clone());
    if !job.blocking {
        let h2 = h.clone();
        let spawned = std::thread::Builder::new()
            .name("nccl-init".into())
            .spawn(move || finish_guarded(&h2, || job.run()));
        if let Err(source) = spawned {
            let _ = Handle::remove(ptr);
            return Err(NcclError::Thread {
                what: "initialise a communicator",
                source,
            });
        }
        write_comm(out, ptr);
        return Ok(ncclResult_t::ncclInProgress);
    }
    match job.run() {
        Ok(c) => {
            h.finish(Ok(c));
            write_comm(out, ptr);
            Ok(ncclResult_t::ncclSuccess)
        }
        Err(e) => {
            let _ = Handle::remove(ptr);
            write_comm(out, std::ptr::null_mut());
            Err(e)
        }
    }
}

/// `ncclCommInitRankConfig` (`config` may be null: `ncclCommInitRank`).
pub fn init_rank(
    out: *mut *mut c_void,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> Outcome {
    if out.is_null() {
        return Err(NcclError::Null { what: "comm" });
    }
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or(NcclError::OutOfRange {
            what: "nranks",
            value: nranks.into(),
            expected: "at least 1".into(),
        })?;
    let rank = rank_arg("rank", rank, n)?;
    // SAFETY: NCCL's contract: `config` is null or a struct of its declared size.
    let cfg = unsafe { read_versioned(config, "ncclConfig_t") }?.unwrap_or_default();
    let blocking = blocking_of(&cfg)?;
    let id = parse_id(id)?;
    let kind = comm::backend()?;
    let device = comm::current_device(kind)?;
    let job = InitJob {
        rank,
        nranks: n,
        source: Source::Id(id),
        kind,
        device,
        blocking,
        name: name_of(&cfg, &id, rank),
        cancel: None,
    };
    start(out, job)
}

/// `ncclCommInitRankScalable`: the first id serves (ranks meet at one root); the listeners
/// of the others, if made here, are closed.
pub fn init_rank_scalable(
    out: *mut *mut c_void,
    nranks: c_int,
    rank: c_int,
    n_ids: c_int,
    ids: *const ncclUniqueId,
    config: *const ncclConfig_t,
) -> Outcome {
    if ids.is_null() {
        return Err(NcclError::Null { what: "commIds" });
    }
    let n_ids = usize::try_from(n_ids)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or(NcclError::OutOfRange {
            what: "nId",
            value: n_ids.into(),
            expected: "at least 1".into(),
        })?;
    // SAFETY: NCCL's contract: `commIds` holds `nId` ids.
    let all = unsafe { std::slice::from_raw_parts(ids, n_ids) };
    for other in &all[1..] {
        if let Ok(id) = parse_id(other) {
            drop(take_root(&id));
        }
    }
    init_rank(out, nranks, &all[0], rank, config)
}

/// `ncclCommInitAll`: `ndev` ranks of one process (a loopback root), each initialised on a
/// thread of its own; on any failure none is kept.
pub fn init_all(comms: *mut *mut c_void, ndev: c_int, devlist: *const c_int) -> Outcome {
    if comms.is_null() {
        return Err(NcclError::Null { what: "comm" });
    }
    let n = usize::try_from(ndev)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or(NcclError::OutOfRange {
            what: "ndev",
            value: ndev.into(),
            expected: "at least 1".into(),
        })?;
    let kind = comm::backend()?;
    let count = kind
        .device_count()
        .map_err(NcclError::library("counting the devices"))?;
    let devices: Vec<usize> = if devlist.is_null() {
        (0..n).collect()
    } else {
        // SAFETY: NCCL's contract: `devlist` holds `ndev` ints.
        unsafe { std::slice::from_raw_parts(devlist, n) }
            .iter()
            .map(|&d| d as i64)
            .collect::<Vec<_>>()
            .into_iter()
            .map(|d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect()
    };
    if let Some(&bad) = devices.iter().find(|&&d| d >= count) {
        return Err(NcclError::OutOfRange {
            what: "a device of devlist",
            value: if bad == usize::MAX { -1 } else { bad as i64 },
            expected: format!("a device ordinal below {count}"),
        });
    }
    let (id, l) = UniqueId::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .map_err(NcclError::library("binding the root's socket"))?;
    keep_root(&id, l);
    let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(n);
    let jobs: Vec<group::Deferred> = devices
        .iter()
        .enumerate()
        .map(|(rank, &device)| {
            let (h, ptr) = Handle::create(rank, n, device, true);
            ptrs.push(ptr);
            let job = InitJob {
                rank,
                nranks: n,
                source: Source::Id(id),
                kind,
                device,
                blocking: true,
                name: format!("comm {:04x} rank {rank}", id.magic() & 0xffff),
                cancel: Some(h.cancel.clone()),
            };
            (h, Box::new(job) as Box<dyn group::Init>)
        })
        .collect();
    let handles: Vec<Arc<Handle>> = jobs.iter().map(|(h, _)| h.clone()).collect();
    if let Err(e) = group::run_inits(jobs) {
        drop(take_root(&id));
        for (p, h) in ptrs.iter().zip(&handles) {
            let _ = Handle::remove(*p);
            if let Some(c) = h.release() {
                c.communicator_abort();
                comm::retire(c);
            }
        }
        return Err(e);
    }
    for (i, p) in ptrs.into_iter().enumerate() {
        // SAFETY: NCCL's contract: `comm` holds `ndev` handles.
        unsafe { comms.add(i).write(p) };
    }
    Ok(ncclResult_t::ncclSuccess)
}

/// `ncclCommSplit`: every rank of `comm` calls it; those of one color get a new communicator,
/// ranked by `key` (ties by their rank in `comm`), made by the library's
/// `Communicator::split` over `comm`'s bootstrap links (no new sockets). `NCCL_SPLIT_NOCOLOR`
/// takes part and gets a null `newcomm`. Inside a group the split runs at `ncclGroupEnd` (so
/// one thread can split the communicators of several ranks); outside one it blocks (a
/// non-blocking config too: the split is done when the call returns `ncclSuccess`). The new
/// communicator uses the parent's device; `config` may name it (`commName`).
pub fn split(
    comm: *mut c_void,
    color: c_int,
    key: c_int,
    newcomm: *mut *mut c_void,
    config: *const ncclConfig_t,
) -> Outcome {
    let c = Handle::ready(comm)?;
    c.check_usable()?;
    if newcomm.is_null() {
        return Err(NcclError::Null { what: "newcomm" });
    }
    let color = match color {
        NCCL_SPLIT_NOCOLOR => None,
        c if c >= 0 => Some(c as u32),
        c => {
            return Err(NcclError::OutOfRange {
                what: "color",
                value: c.into(),
                expected: "a color of 0 or more, or NCCL_SPLIT_NOCOLOR".into(),
            });
        }
    };
    // SAFETY: NCCL's contract: `config` is null or a struct of its declared size.
    let cfg = unsafe { read_versioned(config, "ncclConfig_t") }?.unwrap_or_default();
    blocking_of(&cfg)?;
    let name = comm_name(&cfg)
        .unwrap_or_else(|| format!("{} split {}", c.name, color.map_or(-1, i64::from)));
    let job = InitJob {
        rank: c.rank,
        nranks: 0,
        kind: c.gpu().kind(),
        device: c.device,
        blocking: true,
        name,
        cancel: None,
        source: Source::Split(SplitFrom {
            parent: c.clone(),
            color,
            key: key.into(),
        }),
    };
    if group::in_group() {
        // The handle exists at once, as NCCL's does; its rank and size are known at the end.
        let (h, ptr) = Handle::create(c.rank, 0, c.device, true);
        if color.is_none() {
            // No communicator: the handle only carries the rank's part to the group's end.
            let _ = Handle::remove(ptr);
            write_comm(newcomm, std::ptr::null_mut());
        } else {
            write_comm(newcomm, ptr);
        }
        group::defer_init(h, Box::new(job));
        return Ok(ncclResult_t::ncclSuccess);
    }
    match job.run() {
        Ok(sub) => {
            let (h, ptr) = Handle::create(sub.rank, sub.nranks, sub.device, false);
            h.finish(Ok(sub));
            write_comm(newcomm, ptr);
            Ok(ncclResult_t::ncclSuccess)
        }
        Err(NcclError::SplitWithoutColor) => {
            write_comm(newcomm, std::ptr::null_mut());
            Ok(ncclResult_t::ncclSuccess)
        }
        Err(e) => {
            write_comm(newcomm, std::ptr::null_mut());
            Err(e)
        }
    }
}

/// `ncclCommFinalize`.
pub fn finalize(comm: *mut c_void) -> Outcome {
    let c = Handle::ready(comm)?;
    if c.set_finalized() {
        return Err(NcclError::Finalized);
    }
    c.flush()?;
    Ok(ncclResult_t::ncclSuccess)
}

/// `ncclCommDestroy` (null: nothing).
pub fn destroy(comm: *mut c_void) -> Outcome {
    if comm.is_null() {
        return Ok(ncclResult_t::ncclSuccess);
    }
    let h = Handle::remove(comm)?;
    if let Some(c) = h.release()
        && !c.set_finalized()
        && let Err(e) = c.flush()
    {
        tracing::warn!("ncclCommDestroy of {}: {}", c.name, e.text());
    }
    Ok(ncclResult_t::ncclSuccess)
}

/// `ncclCommAbort` (null: nothing).
pub fn abort(comm: *mut c_void) -> Outcome {
    if comm.is_null() {
        return Ok(ncclResult_t::ncclSuccess);
    }
    let h = Handle::remove(comm)?;
    if let Some(c) = h.release() {
        c.communicator_abort();
        comm::retire(c);
    }
    Ok(ncclResult_t::ncclSuccess)
}

/// `ncclCommGetAsyncError`: `ncclInProgress` while initialising, the init's failure, or the
/// communicator's sticky error (whose text also becomes the last error).
pub fn get_async_error(comm: *mut c_void, out: *mut c_int) -> Outcome {
    if out.is_null() {
        return Err(NcclError::Null { what: "asyncError" });
    }
    let h = Handle::find(comm)?;
    let (code, text) = h.with_state(|s| match s {
        comm::State::Pending { .. } => (ncclResult_t::ncclInProgress, None),
        comm::State::Failed(code, text) => (*code, Some(text.clone())),
        comm::State::Ready(c) => match c.async_error() {
            Some((code, text)) => (code, Some(text)),
            None => (ncclResult_t::ncclSuccess, None),
        },
    });
    if let Some(t) = text {
        set_last_error(&format!("ncclCommGetAsyncError: {t}"));
    }
    // SAFETY: checked non-null; NCCL's contract: a writable `ncclResult_t`.
    unsafe { out.write(code as c_int) };
    Ok(ncclResult_t::ncclSuccess)
}

/// What `ncclCommCount`, `ncclCommCuDevice` and `ncclCommUserRank` tell.
#[derive(Clone, Copy)]
pub struct Facts {
    /// The rank.
    pub rank: usize,
    /// Ranks.
    pub nranks: usize,
    /// The device ordinal.
    pub device: usize,
}

/// `ncclCommCount`, `ncclCommCuDevice` and `ncclCommUserRank`: `pick` chooses from the ready
/// communicator, else from the handle (an init's are known from its call on; a split's only
/// once it has run: before, the call fails as a use of a pending communicator does).
pub fn tell(comm: *mut c_void, out: *mut c_int, pick: impl FnOnce(Facts) -> usize) -> Outcome {
    let h = Handle::find(comm)?;
    let facts = match h.comm() {
        Ok(c) => Facts {
            rank: c.rank,
            nranks: c.nranks,
            device: c.device,
        },
        Err(e) if h.nranks == 0 => return Err(e),
        Err(_) => Facts {
            rank: h.rank,
            nranks: h.nranks,
            device: h.device,
        },
    };
    if out.is_null() {
        return Err(NcclError::Null {
            what: "the result pointer",
        });
    }
    // SAFETY: checked non-null; NCCL's contract: a writable int. Ranks and ordinals fit.
    unsafe { out.write(pick(facts) as c_int) };
    Ok(ncclResult_t::ncclSuccess)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_default_to_ten_minutes_and_follow_the_variables() {
        let (m, s) = (Duration::from_secs(60), Duration::from_secs(1));
        assert_eq!(deadlines(None, None), (DEFAULT_DEADLINE, DEFAULT_DEADLINE));
        assert!(DEFAULT_DEADLINE >= Duration::from_secs(600));
        assert_eq!(deadlines(Some(m), None), (m, m));
        assert_eq!(deadlines(None, Some(s)), (DEFAULT_DEADLINE, s));
        assert_eq!(deadlines(Some(m), Some(s)), (m, s));
    }

    /// The non-blocking init's thread: a panic of the init fails the communicator (an internal
    /// error, its text kept), an error fails it with that error; neither stays pending.
    #[test]
    fn a_panicking_init_fails_its_communicator() {
        let (h, ptr) = Handle::create(0, 2, 0, false);
        finish_guarded(&h, || panic!("an init that panics"));
        match h.comm() {
            Err(NcclError::CommFailed { code, reason }) => {
                assert_eq!(code, ncclResult_t::ncclInternalError);
                assert!(reason.contains("initialise a communicator"), "{reason}");
            }
            other => panic!("after a panic: {:?}", other.map(|_| ())),
        }
        Handle::remove(ptr).expect("still in the table");

        let (h, ptr) = Handle::create(0, 2, 0, false);
        finish_guarded(&h, || Err(NcclError::Null { what: "comm" }));
        match h.comm() {
            Err(NcclError::CommFailed { code, .. }) => {
                assert_eq!(code, ncclResult_t::ncclInvalidArgument)
            }
            other => panic!("after an error: {:?}", other.map(|_| ())),
        }
        Handle::remove(ptr).expect("still in the table");
    }
}
