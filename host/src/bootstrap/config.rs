//! [`BootstrapConfig`]: who this rank is, where the root is, and how long to wait; built by hand
//! or from the environment of the common launchers.
//!
//! | what | variables, in order of precedence |
//! |---|---|
//! | rank, size, local rank | `MSCCLPP_RANK`/`MSCCLPP_WORLD_SIZE`/`MSCCLPP_LOCAL_RANK`; torchrun's `RANK`/`WORLD_SIZE`/`LOCAL_RANK`; Open MPI's `OMPI_COMM_WORLD_RANK`/`_SIZE`/`_LOCAL_RANK`; Slurm's `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID`. The first launcher whose rank variable is set supplies all three. |
//! | root | `MSCCLPP_UNIQUE_ID` (hex); `MSCCLPP_BOOTSTRAP` (`ip:port`, `host:port` or `ifname:ip:port`); torchrun's `MASTER_ADDR` with `MASTER_PORT` + [`TORCHRUN_PORT_OFFSET`] (torchrun's own store already listens on `MASTER_PORT`) |
//! | secret | `MSCCLPP_SECRET`: the world's passphrase when the root is a plain address (`MSCCLPP_BOOTSTRAP`, torchrun's); a unique id carries its own secret. It should be 32 random bytes as 64 hex characters (`mscclpp-run --bootstrap` makes one; `openssl rand -hex 32`); at least 16 characters are required, and the first set-up of the process warns when it is weak ([`Passphrase::weakness`]). The key is derived from it with Argon2id (about 0.1 s once per process), salted with the root address and the root's job nonce. Without it such a world is **not authenticated**, and the first set-up of the process says so on standard error |
//! | timeouts | `MSCCLPP_BOOTSTRAP_TIMEOUT_MS` (set-up, and operations unless `MSCCLPP_BOOTSTRAP_OP_TIMEOUT_MS` is set); `MSCCLPP_BOOTSTRAP_PEER_TIMEOUT_MS`: how long a link may stay silent before its peer counts as stopped ([`BootstrapConfig::peer_timeout`], 0: never) |
//! | queue caps | `MSCCLPP_BOOTSTRAP_MAX_QUEUED_BYTES`, `MSCCLPP_BOOTSTRAP_MAX_QUEUED_FRAMES`: what one peer may leave queued at this rank ([`BootstrapConfig::max_queued_bytes`]); `MSCCLPP_BOOTSTRAP_MAX_PROCESS_QUEUED_BYTES`: what every peer of every bootstrap of this process may leave queued in all ([`BootstrapConfig::max_process_queued_bytes`]) |
//! | interface | `MSCCLPP_SOCKET_IFNAME` (comma-separated names; the first with an IPv4 address wins) |
//! | node identity | `MSCCLPP_HOSTID` (else host name + boot id) |

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::keying::Keying;
use super::{Cancel, UniqueId, wire};
use crate::auth::{Passphrase, Secret};
use crate::error::{Error, Result};

/// Default deadline for set-up (and, unless set apart, for each operation).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`BootstrapConfig::peer_timeout`]: a peer silent on a link this long (its
/// keepalives included) is taken for stopped.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default deadline for an accepted connection to complete its handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default cap on the bytes one peer may leave queued (unreceived) at a rank.
pub const DEFAULT_MAX_QUEUED_BYTES: u64 = 256 << 20;
/// Default cap on the frames one peer may leave queued (unreceived) at a rank.
pub const DEFAULT_MAX_QUEUED_FRAMES: u64 = 65_536;
/// Default cap on the bytes every peer of every bootstrap of a process may leave queued
/// (unreceived) in it, together: four peers at their own cap.
pub const DEFAULT_MAX_PROCESS_QUEUED_BYTES: u64 = 1 << 30;
/// Under torchrun the root listens at `MASTER_PORT` + this, because torchrun's agent already
/// serves its TCP store at `MASTER_PORT`.
pub const TORCHRUN_PORT_OFFSET: u16 = 1;

/// Names of the environment variables this module reads.
pub mod env {
    /// This rank.
    pub const RANK: &str = "MSCCLPP_RANK";
    /// Number of ranks.
    pub const WORLD_SIZE: &str = "MSCCLPP_WORLD_SIZE";
    /// Rank within the node (informational; the bootstrap computes its own).
    pub const LOCAL_RANK: &str = "MSCCLPP_LOCAL_RANK";
    /// Root as `ip:port`, `host:port` or `ifname:ip:port`.
    pub const BOOTSTRAP: &str = "MSCCLPP_BOOTSTRAP";
    /// Root as a [`UniqueId`](super::UniqueId) in hex.
    pub const UNIQUE_ID: &str = "MSCCLPP_UNIQUE_ID";
    /// Set-up (and default operation) deadline in milliseconds.
    pub const TIMEOUT_MS: &str = "MSCCLPP_BOOTSTRAP_TIMEOUT_MS";
    /// Operation deadline in milliseconds.
    pub const OP_TIMEOUT_MS: &str = "MSCCLPP_BOOTSTRAP_OP_TIMEOUT_MS";
    /// Peer timeout in milliseconds (0: none).
    pub const PEER_TIMEOUT_MS: &str = "MSCCLPP_BOOTSTRAP_PEER_TIMEOUT_MS";
    /// Network interface(s) whose IPv4 address this rank listens on.
    pub const SOCKET_IFNAME: &str = "MSCCLPP_SOCKET_IFNAME";
    /// Overrides the host identity used to group ranks into nodes.
    pub const HOSTID: &str = "MSCCLPP_HOSTID";
    /// The world's passphrase for plain-address roots (32 random bytes as hex; at least 16
    /// characters).
    pub const SECRET: &str = "MSCCLPP_SECRET";
    /// Cap on the bytes one peer may leave queued at a rank.
    pub const MAX_QUEUED_BYTES: &str = "MSCCLPP_BOOTSTRAP_MAX_QUEUED_BYTES";
    /// Cap on the frames one peer may leave queued at a rank.
    pub const MAX_QUEUED_FRAMES: &str = "MSCCLPP_BOOTSTRAP_MAX_QUEUED_FRAMES";
    /// Cap on the bytes all peers of all bootstraps may leave queued in this process.
    pub const MAX_PROCESS_QUEUED_BYTES: &str = "MSCCLPP_BOOTSTRAP_MAX_PROCESS_QUEUED_BYTES";
    /// torchrun: root host.
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    /// torchrun: root port (the bootstrap uses this + [`TORCHRUN_PORT_OFFSET`](super::TORCHRUN_PORT_OFFSET)).
    pub const MASTER_PORT: &str = "MASTER_PORT";
}

/// Where rank, size and local rank came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Launcher {
    /// `MSCCLPP_RANK`/`MSCCLPP_WORLD_SIZE`/`MSCCLPP_LOCAL_RANK`.
    Mscclpp,
    /// torchrun: `RANK`/`WORLD_SIZE`/`LOCAL_RANK`.
    Torchrun,
    /// Open MPI: `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`/`OMPI_COMM_WORLD_LOCAL_RANK`.
    OpenMpi,
    /// Slurm: `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID`.
    Slurm,
    /// Set in code.
    Manual,
}

/// (launcher, rank variable, size variable, local-rank variable), in order of precedence.
const LAUNCHERS: [(Launcher, &str, &str, &str); 4] = [
    (
        Launcher::Mscclpp,
        env::RANK,
        env::WORLD_SIZE,
        env::LOCAL_RANK,
    ),
    (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    (
        Launcher::OpenMpi,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
    ),
    (
        Launcher::Slurm,
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
    ),
];

/// How ranks find the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootSpec {
    /// A [`UniqueId`] made by rank 0 (random magic and secret).
    UniqueId(UniqueId),
    /// A plain `ip:port`; rank 0 listens there and the magic is derived from the address; the
    /// key comes from [`BootstrapConfig::passphrase`] or [`BootstrapConfig::secret`].
    Addr(SocketAddr),
}

impl RootSpec {
    /// The root's address.
    pub fn addr(&self) -> SocketAddr {
        match self {
            RootSpec::UniqueId(id) => id.root(),
            RootSpec::Addr(a) => *a,
        }
    }

    /// The session id every rank uses, without a secret for a plain address (see
    /// [`BootstrapConfig::session`], which adds it).
    pub fn unique_id(&self) -> Result<UniqueId> {
        match self {
            RootSpec::UniqueId(id) => Ok(*id),
            RootSpec::Addr(a) => UniqueId::for_addr(*a),
        }
    }
}

impl From<UniqueId> for RootSpec {
    fn from(id: UniqueId) -> Self {
        RootSpec::UniqueId(id)
    }
}

impl From<SocketAddr> for RootSpec {
    fn from(a: SocketAddr) -> Self {
        RootSpec::Addr(a)
    }
}

/// Everything [`TcpBootstrap::init`](super::TcpBootstrap::init) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BootstrapConfig {
    /// This rank, `< size`.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Where the root is.
    pub root: RootSpec,
    /// Where rank and size came from.
    pub launcher: Launcher,
    /// The launcher's idea of the local rank, if it said; the bootstrap computes its own from
    /// host identities and warns when they differ.
    pub launcher_local_rank: Option<usize>,
    /// Deadline for the whole set-up.
    pub timeout: Duration,
    /// Default deadline of each operation after set-up (`recv`, collectives, `send`).
    pub op_timeout: Duration,
    /// Deadline for an accepted connection to send its complete first frame.
    pub handshake_timeout: Duration,
    /// How long a link may carry nothing before its peer is taken for stopped (a process that
    /// does not run, though its sockets are open: SIGSTOP, a debugger, a hung host): its link
    /// is cut and it is reported gone like a dead rank (`Bootstrap::dead_peer`). This rank
    /// writes a keepalive on each of its links a quarter of it apart, from a thread of its own
    /// (so a busy program is never taken for stopped). `None`: links are never timed out and
    /// no keepalives are written.
    pub peer_timeout: Option<Duration>,
    /// Network interface(s) to listen on (comma-separated); default: the address that routes to
    /// the root.
    pub ifname: Option<String>,
    /// Exact address for this rank's listener (port 0: any); overrides `ifname`.
    pub listen: Option<SocketAddr>,
    /// Host identity for grouping ranks into nodes; default: host name + kernel boot id.
    pub host_id: Option<String>,
    /// The world's key when [`root`](Self::root) is a plain address, used as it is (32 random
    /// bytes; a unique id carries its own and ignores this). Not together with
    /// [`passphrase`](Self::passphrase). Neither: the world is not authenticated (module docs).
    pub secret: Option<Secret>,
    /// The world's passphrase when [`root`](Self::root) is a plain address (`MSCCLPP_SECRET`):
    /// the key is derived from it at set-up with Argon2id, salted with the root address and
    /// the root's job nonce (`crate::auth::Passphrase`).
    pub passphrase: Option<Passphrase>,
    /// Most bytes one peer may leave queued (sent, not yet received) at this rank; a peer
    /// that sends more has its link cut and is reported as gone
    /// (`Error::BootstrapQueueFull`). It also caps the length of one message.
    pub max_queued_bytes: u64,
    /// Most frames one peer may leave queued at this rank (as above).
    pub max_queued_frames: u64,
    /// Cancels the set-up from another thread ([`Cancel`]); `None`: it waits until done or its
    /// deadline.
    pub cancel: Option<Cancel>,
    /// Most bytes every peer of every bootstrap of this process may leave queued in it
    /// together (ranks as threads of one process share it); a frame that does not fit has its
    /// sender's link cut and the sender reported as gone (`Error::BootstrapQueueFull`). Each
    /// rank checks the process's count against its own configuration's value.
    pub max_process_queued_bytes: u64,
}

impl BootstrapConfig {
    /// A configuration with default deadlines.
    pub fn new(rank: usize, size: usize, root: impl Into<RootSpec>) -> Self {
        Self {
            rank,
            size,
            root: root.into(),
            launcher: Launcher::Manual,
            launcher_local_rank: None,
            timeout: DEFAULT_TIMEOUT,
            op_timeout: DEFAULT_TIMEOUT,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            peer_timeout: Some(DEFAULT_PEER_TIMEOUT),
            ifname: None,
            listen: None,
            host_id: None,
            secret: None,
            passphrase: None,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            max_queued_frames: DEFAULT_MAX_QUEUED_FRAMES,
            max_process_queued_bytes: DEFAULT_MAX_PROCESS_QUEUED_BYTES,
            cancel: None,
        }
    }

    /// Sets the world's key for a plain-address root (32 bytes, used as they are).
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Sets the world's passphrase for a plain-address root (as `MSCCLPP_SECRET` does).
    pub fn with_passphrase(mut self, passphrase: Passphrase) -> Self {
        self.passphrase = Some(passphrase);
        self
    }

    /// Sets the caps on what one peer may leave queued at this rank.
    pub fn with_queue_caps(mut self, bytes: u64, frames: u64) -> Self {
        self.max_queued_bytes = bytes;
        self.max_queued_frames = frames;
        self
    }

    /// Sets the cap on what every peer of every bootstrap may leave queued in this process.
    pub fn with_process_queue_cap(mut self, bytes: u64) -> Self {
        self.max_process_queued_bytes = bytes;
        self
    }

    /// The session every rank of this world uses: the unique id, or, for a plain address, the
    /// id derived from it and [`secret`](Self::secret). Without a secret the world is not
    /// authenticated, and the first such set-up of the process says so on standard error. A
    /// world with a [`passphrase`](Self::passphrase) has no such id (its key is derived at
    /// set-up from the root's job nonce): an error.
    pub fn session(&self) -> Result<UniqueId> {
        match self.keying()? {
            (_, Keying::Passphrase(_)) => Err(Error::BootstrapConfig(format!(
                "a world with a passphrase ({}) has no unique id: its key is derived at set-up",
                env::SECRET
            ))),
            (id, Keying::Fixed(_)) => Ok(id),
        }
    }

    /// The session (its magic and root) and where its key comes from (module docs); warns
    /// once per process about a world without a secret, and about a weak passphrase.
    pub(crate) fn keying(&self) -> Result<(UniqueId, Keying)> {
        match (&self.root, self.secret, &self.passphrase) {
            (RootSpec::UniqueId(id), _, _) => Ok((*id, Keying::Fixed(*id.secret()))),
            (RootSpec::Addr(_), Some(_), Some(_)) => Err(Error::BootstrapConfig(
                "both a secret and a passphrase are set: give one".into(),
            )),
            (RootSpec::Addr(a), Some(s), None) => {
                Ok((UniqueId::for_addr_with_secret(*a, s)?, Keying::Fixed(s)))
            }
            (RootSpec::Addr(a), None, Some(p)) => {
                if let Some(why) = p.weakness() {
                    warn_weak(&why);
                }
                // The id carries the magic and the root; its secret is never used (the key
                // comes from the passphrase).
                let id = UniqueId::for_addr_with_secret(*a, Secret::public(b"passphrase world"))?;
                Ok((id, Keying::Passphrase(p.clone())))
            }
            (RootSpec::Addr(a), None, None) => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    eprintln!(
                        "mscclpp: WARNING: the bootstrap root is a plain address ({a}) and {} is not set: this world is NOT authenticated; anyone who can reach its ports can join it, read its set-up messages and write into its Ethernet memories. Set {} (the same 32 random bytes as hex on every rank: `openssl rand -hex 32`; mscclpp-run does this) or use a unique id.",
                        env::SECRET,
                        env::SECRET
                    );
                });
                tracing::warn!(
                    "bootstrap: plain root address {a} without {}: no authentication",
                    env::SECRET
                );
                let id = UniqueId::for_addr(*a)?;
                Ok((id, Keying::Fixed(*id.secret())))
            }
        }
    }

    /// Sets the set-up deadline and the operation deadline (and caps the handshake deadline).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.op_timeout = timeout;
        self.handshake_timeout = self.handshake_timeout.min(timeout);
        self
    }

    /// Lets `cancel` end the set-up from another thread ([`Cancel::cancel`]).
    pub fn with_cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Sets the operation deadline only.
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// Sets the peer timeout ([`peer_timeout`](Self::peer_timeout); `None`: off).
    pub fn with_peer_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.peer_timeout = timeout.filter(|t| !t.is_zero());
        self
    }

    /// Sets the handshake deadline for accepted connections.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Listens on the IPv4 address of this interface (or the first of a comma-separated list).
    pub fn with_ifname(mut self, ifname: impl Into<String>) -> Self {
        self.ifname = Some(ifname.into());
        self
    }

    /// Listens at exactly this address.
    pub fn with_listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// Uses this host identity for node grouping.
    pub fn with_host_id(mut self, id: impl Into<String>) -> Self {
        self.host_id = Some(id.into());
        self
    }

    /// Reads the process environment (see the module docs for the variables).
    pub fn from_env() -> Result<Self> {
        let vars: HashMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Self::from_vars(&vars)
    }

    /// [`from_env`](Self::from_env) over a given map instead of the process environment.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Self> {
        let get = |k: &str| vars.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let num = |k: &str| -> Result<Option<usize>> {
            get(k)
                .map(|v| {
                    v.parse::<usize>().map_err(|_| {
                        Error::BootstrapConfig(format!("{k}={v:?} is not a non-negative integer"))
                    })
                })
                .transpose()
        };

        let Some((launcher, rank_var, size_var, local_var)) =
            LAUNCHERS.iter().copied().find(|l| get(l.1).is_some())
        else {
            return Err(Error::BootstrapConfig(format!(
                "no rank in the environment: set {} and {} (or run under torchrun, Open MPI or Slurm)",
                env::RANK,
                env::WORLD_SIZE
            )));
        };
        let rank = num(rank_var)?.unwrap_or_default();
        let size = num(size_var)?.ok_or_else(|| {
            Error::BootstrapConfig(format!("{rank_var} is set but {size_var} is not"))
        })?;
        let launcher_local_rank = num(local_var)?;

        let mut ifname = get(env::SOCKET_IFNAME).map(str::to_owned);
        let root = if let Some(hex) = get(env::UNIQUE_ID) {
            RootSpec::UniqueId(UniqueId::from_hex(hex)?)
        } else if let Some(spec) = get(env::BOOTSTRAP) {
            let (iface, addr) = parse_root(spec)?;
            if ifname.is_none() {
                ifname = iface;
            }
            RootSpec::Addr(addr)
        } else if let Some(host) = get(env::MASTER_ADDR) {
            let port = get(env::MASTER_PORT).ok_or_else(|| {
                Error::BootstrapConfig(format!(
                    "{} is set but {} is not",
                    env::MASTER_ADDR,
                    env::MASTER_PORT
                ))
            })?;
            let port: u16 = port.parse().map_err(|_| {
                Error::BootstrapConfig(format!("{}={port:?} is not a port", env::MASTER_PORT))
            })?;
            let port = port.checked_add(TORCHRUN_PORT_OFFSET).ok_or_else(|| {
                Error::BootstrapConfig(format!("{}={port} leaves no room for the bootstrap's port {port}+{TORCHRUN_PORT_OFFSET}", env::MASTER_PORT))
            })?;
            RootSpec::Addr(resolve(host, port)?)
        } else {
            return Err(Error::BootstrapConfig(format!(
                "no root address in the environment: set {} (hex from rank 0) or {} (ip:port)",
                env::UNIQUE_ID,
                env::BOOTSTRAP
            )));
        };

        let ms = |k: &str| -> Result<Option<Duration>> {
            match get(k) {
                None => Ok(None),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Some(Duration::from_millis(n))),
                    _ => Err(Error::BootstrapConfig(format!(
                        "{k}={v:?} is not a positive number of milliseconds"
                    ))),
                },
            }
        };
        let mut cfg = Self::new(rank, size, root);
        cfg.launcher = launcher;
        cfg.launcher_local_rank = launcher_local_rank;
        cfg.ifname = ifname;
        cfg.host_id = get(env::HOSTID).map(str::to_owned);
        if let Some(t) = ms(env::TIMEOUT_MS)? {
            cfg = cfg.with_timeout(t);
        }
        if let Some(t) = ms(env::OP_TIMEOUT_MS)? {
            cfg.op_timeout = t;
        }
        if let Some(v) = get(env::PEER_TIMEOUT_MS) {
            let t = v.parse::<u64>().map_err(|_| {
                Error::BootstrapConfig(format!(
                    "{}={v:?} is not a number of milliseconds (0: no peer timeout)",
                    env::PEER_TIMEOUT_MS
                ))
            })?;
            cfg = cfg.with_peer_timeout(Some(Duration::from_millis(t)));
        }
        if let Some(p) = get(env::SECRET) {
            cfg.passphrase = Some(Passphrase::new(p).ok_or_else(|| {
                Error::BootstrapConfig(format!(
                    "{} is shorter than {} characters (use 32 random bytes as hex: `openssl rand -hex 32`)",
                    env::SECRET,
                    crate::auth::MIN_PASSPHRASE_LEN
                ))
            })?);
        }
        if let Some(n) = num(env::MAX_QUEUED_BYTES)? {
            cfg.max_queued_bytes = n as u64;
        }
        if let Some(n) = num(env::MAX_QUEUED_FRAMES)? {
            cfg.max_queued_frames = n as u64;
        }
        if let Some(n) = num(env::MAX_PROCESS_QUEUED_BYTES)? {
            cfg.max_process_queued_bytes = n as u64;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks ranges: `rank < size <= MAX_RANKS`, nonzero deadlines, a connectable root, not
    /// both a secret and a passphrase.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::BootstrapConfig(m));
        if self.size == 0 || self.size > wire::MAX_RANKS {
            return bad(format!(
                "world size {} is outside 1..={}",
                self.size,
                wire::MAX_RANKS
            ));
        }
        if self.rank >= self.size {
            return bad(format!(
                "rank {} is not below the world size {}",
                self.rank, self.size
            ));
        }
        if let Some(l) = self.launcher_local_rank.filter(|&l| l >= self.size) {
            return bad(format!(
                "local rank {l} is not below the world size {}",
                self.size
            ));
        }
        if self.timeout.is_zero() || self.op_timeout.is_zero() || self.handshake_timeout.is_zero() {
            return bad("deadlines must be nonzero".into());
        }
        if self.max_queued_bytes == 0
            || self.max_queued_frames == 0
            || self.max_process_queued_bytes == 0
        {
            return bad("queue caps must be nonzero".into());
        }
        if self.secret.is_some() && self.passphrase.is_some() {
            return bad("both a secret and a passphrase are set: give one".into());
        }
        let root = self.root.addr();
        if !wire::is_connectable(&root) {
            return bad(format!(
                "root address {root} is not connectable (needs a concrete IP and a nonzero port)"
            ));
        }
        Ok(())
    }
}

/// Says once per process, on standard error and in the log, that `MSCCLPP_SECRET` is weak.
fn warn_weak(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "mscclpp: WARNING: {} is weak: {why}. Anyone who can reach the root's port can take one challenge from it and guess the passphrase offline (each guess costs one Argon2id derivation, about 0.1 s; a guessable passphrase still falls). Use 32 random bytes as hex (`openssl rand -hex 32`; mscclpp-run --bootstrap makes one).",
            env::SECRET
        );
    });
    tracing::warn!("bootstrap: {} is weak: {why}", env::SECRET);
}

/// Parses `ip:port`, `[v6]:port`, `host:port` (resolved) or `ifname:ip:port` / `ifname:host:port`
/// (MSCCL++'s "interface:ip:port" form), returning the interface, if any, and the address.
pub fn parse_root(spec: &str) -> Result<(Option<String>, SocketAddr)> {
    let spec = spec.trim();
    if let Ok(a) = spec.parse::<SocketAddr>() {
        return Ok((None, a));
    }
    let bad = || {
        Error::BootstrapConfig(format!(
            "{spec:?} is not ip:port, host:port or ifname:ip:port"
        ))
    };
    let (iface, rest) = match spec.split_once(':') {
        Some((i, rest)) if rest.contains(':') && !i.is_empty() && !i.starts_with('[') => {
            (Some(i.to_owned()), rest)
        }
        _ => (None, spec),
    };
    if let Ok(a) = rest.parse::<SocketAddr>() {
        return Ok((iface, a));
    }
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((iface, resolve(host, port)?))
}

/// `host` as an IP literal, or resolved (IPv4 preferred).
fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::BootstrapConfig(format!("cannot resolve root host {host:?}: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| Error::BootstrapConfig(format!("root host {host:?} resolves to no address")))
}
