//! [`TcpBootstrap`]: set-up (listen, join at the root, link the tree) and the operations over
//! the links (tagged send/receive, barrier, all-gather, broadcast).
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`TcpBootstrap`], its set-up (one function per phase of the [protocol](super)), node layout, `Drop` |
//! | `connect.rs` | the connector's handshakes: joining at the root, opening a link |
//! | `links.rs` | the rank's links: one socket each, the out link per peer, opened on first use |
//! | `reactor.rs` | the rank's I/O thread: its listener's handshakes, every link's frames, notices, silent peers |
//! | `beat.rs` | the process's keepalive thread (for ranks with a peer timeout) |
//! | `ops.rs` | the [`Bootstrap`] operations: frames out and in, the collectives over the tree |

mod beat;
mod connect;
mod links;
mod ops;
mod reactor;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use self::links::{Links, SendFail};
use self::reactor::{Reactor, Shared};
use super::admit::{Admission, Gate};
use super::keying::{self, KeyCell, Keying, WorldKey};
use super::mailbox::{Caps, LinkDown, Mailbox};
use super::net::{self, Ctx};
use super::root::{RootParams, RootService};
use super::wire::{self, Purpose};
use super::{
    Bootstrap, BootstrapConfig, Cancel, Peer, RootListener, SetupPhase, SetupPhases, UniqueId,
};
use crate::auth::{Nonce, Secret};
use crate::error::{Error, Result};
use crate::socket::{IoFail, deadline_in};

/// Longest a dropped bootstrap waits for its peers to acknowledge the close.
const MAX_LINGER: Duration = Duration::from_secs(2);

/// Which ranks share a node (same host hash), in rank order.
#[derive(Debug, Clone)]
struct NodeMap {
    node_of: Vec<usize>,
    local_rank: Vec<usize>,
    members: Vec<Vec<usize>>,
}

impl NodeMap {
    fn new(host_hashes: &[u64]) -> Self {
        let mut index: HashMap<u64, usize> = HashMap::new();
        let mut map = NodeMap {
            node_of: Vec::new(),
            local_rank: Vec::new(),
            members: Vec::new(),
        };
        for (rank, h) in host_hashes.iter().enumerate() {
            let node = *index.entry(*h).or_insert_with(|| {
                map.members.push(Vec::new());
                map.members.len() - 1
            });
            map.local_rank.push(map.members[node].len());
            map.members[node].push(rank);
            map.node_of.push(node);
        }
        map
    }
}

/// TCP bootstrap: every rank listens, joins at the root (rank 0), learns every rank's address,
/// links to its neighbours in a binary tree for the collectives, and opens a link to any other
/// rank on first use. See the [module docs](super) for the protocol, threads and failure model.
pub struct TcpBootstrap {
    rank: usize,
    size: usize,
    addrs: Vec<SocketAddr>,
    nodes: NodeMap,
    op_timeout: Duration,
    session: UniqueId,
    /// The world's key, once known (`bootstrap::keying`).
    key: KeyCell,
    mailbox: Arc<Mailbox>,
    links: Arc<Links>,
    reactor: Option<Reactor>,
    max_queued_bytes: u64,
    coll_seq: AtomicU64,
    /// Whether `Drop` says goodbye (cleared by [`Bootstrap::forgo_goodbye`]).
    goodbye: AtomicBool,
    /// The set-up's phases ([`Bootstrap::setup_phases`]).
    phases: Vec<SetupPhase>,
    /// Rank 0: the root service, answering late joiners until this bootstrap is dropped.
    root: Option<RootService>,
}

impl std::fmt::Debug for TcpBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpBootstrap")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank())
            .field("nodes", &self.nodes.members.len())
            .finish_non_exhaustive()
    }
}

impl TcpBootstrap {
    /// Sets up the bootstrap (collective: every rank calls it). Rank 0 binds the root address
    /// itself; to avoid a race for the port, bind it early with [`UniqueId::bind`] and use
    /// [`init_with_root_listener`](Self::init_with_root_listener).
    pub fn init(config: BootstrapConfig) -> Result<Self> {
        Self::start(config, None)
    }

    /// [`init`](Self::init) for rank 0 with the listener from [`UniqueId::bind`].
    pub fn init_with_root_listener(
        config: BootstrapConfig,
        listener: RootListener,
    ) -> Result<Self> {
        Self::start(config, Some(listener))
    }

    fn start(config: BootstrapConfig, root_listener: Option<RootListener>) -> Result<Self> {
        let mut phases = SetupPhases::default();
        phases.mark("prepare");
        config.validate()?;
        let (id, keying) = config.keying()?;
        let me = config.rank;
        let deadline = deadline_in(config.timeout);
        if config.size == 1 {
            return Self::solo(&config, id, &keying);
        }
        let root = Self::serve_root(&config, &id, &keying, root_listener, deadline)?;
        let mut joined = false;
        let result = Self::set_up(&config, (id, &keying), deadline, &mut joined, &mut phases);
        // Cancelled: fail, and stop the root without waiting for the ranks that did not come.
        let cancelled = config.cancel.as_ref().is_some_and(Cancel::is_cancelled);
        let result = match result {
            Err(_) if cancelled => Err(Cancel::error()),
            r => r,
        };
        let root = root.and_then(|r| r.finish(joined && !cancelled));
        let result = result.map(|mut bs| {
            bs.phases = phases.finish();
            bs.root = root;
            bs
        });
        match &result {
            Ok(bs) => tracing::debug!(
                "bootstrap rank {me}/{}: ready ({} node(s))",
                bs.size,
                bs.nodes.members.len()
            ),
            Err(e) => tracing::warn!("bootstrap rank {me}: set-up failed: {e}"),
        }
        result
    }

    /// Phase 0 (rank 0): the root service, on the given listener or a fresh one, with a fresh
    /// job nonce (a passphrase's key is derived here: about 0.1 s).
    fn serve_root(
        config: &BootstrapConfig,
        id: &UniqueId,
        keying: &Keying,
        root_listener: Option<RootListener>,
        deadline: Instant,
    ) -> Result<Option<RootService>> {
        let me = config.rank;
        if me != 0 && root_listener.is_some() {
            return Err(Error::BootstrapConfig(format!(
                "rank {me} was given the root listener; only rank 0 serves the root"
            )));
        }
        let listener = match root_listener {
            Some(l) => {
                let bound = l.local_addr().map_err(|source| Error::BootstrapListen {
                    rank: 0,
                    addr: id.root(),
                    source,
                })?;
                if bound != id.root() {
                    return Err(Error::BootstrapConfig(format!(
                        "the root listener is bound to {bound}, but the root address is {}",
                        id.root()
                    )));
                }
                l.into_inner()
            }
            None if me == 0 => net::bind(0, id.root())?,
            None => return Ok(None),
        };
        let params = RootParams {
            magic: id.magic(),
            size: config.size,
            key: world_key(keying, id.root())?,
            deadline,
            handshake_timeout: config.handshake_timeout,
        };
        Ok(Some(RootService::start(listener, params)?))
    }

    /// A world of one: nobody to prove anything to (a passphrase's key is not derived).
    fn solo(config: &BootstrapConfig, session: UniqueId, keying: &Keying) -> Result<Self> {
        let key = match keying {
            Keying::Fixed(_) => world_key(keying, session.root())?,
            Keying::Passphrase(_) => WorldKey {
                key: Secret::random().map_err(|e| Error::BootstrapConfig(e.to_string()))?,
                job: fresh_job()?,
            },
        };
        Ok(Self {
            rank: 0,
            size: 1,
            addrs: Vec::new(),
            nodes: NodeMap::new(&[0]),
            op_timeout: config.op_timeout,
            session,
            key: keying::known(key),
            mailbox: Arc::new(Mailbox::new(caps(config))),
            links: Arc::default(),
            reactor: None,
            max_queued_bytes: config.max_queued_bytes,
            coll_seq: AtomicU64::new(0),
            goodbye: AtomicBool::new(true),
            phases: Vec::new(),
            root: None,
        })
    }

    fn set_up(
        cfg: &BootstrapConfig,
        (id, keying): (UniqueId, &Keying),
        deadline: Instant,
        joined: &mut bool,
        phases: &mut SetupPhases,
    ) -> Result<Self> {
        phases.mark("listen");
        let (listener, listen) = Self::listen(cfg, &id)?;
        let mut bs = Self::serve(cfg, id, listener)?;
        phases.mark("join root");
        let joiner = connect::Joiner {
            id: &id,
            keying,
            key: &bs.key,
            listen,
            host_hash: net::host_hash(cfg.host_id.as_deref()),
        };
        let table = connect::join_root(cfg, &joiner, deadline, joined)?;
        bs.learn(cfg, &table);
        bs.link_tree(deadline, cfg.timeout, phases)?;
        Ok(bs)
    }

    /// Phase 1: this rank's listener, on the address that routes to the root (or the
    /// configured interface or address).
    fn listen(cfg: &BootstrapConfig, id: &UniqueId) -> Result<(TcpListener, SocketAddr)> {
        let me = cfg.rank;
        let want = match cfg.listen {
            Some(a) => a,
            None => SocketAddr::new(net::advertised_ip(cfg.ifname.as_deref(), id.root())?, 0),
        };
        let listener = net::bind(me, want)?;
        let mut listen = listener
            .local_addr()
            .map_err(|source| Error::BootstrapListen {
                rank: me,
                addr: want,
                source,
            })?;
        if listen.ip().is_unspecified() {
            listen.set_ip(net::advertised_ip(cfg.ifname.as_deref(), id.root())?);
        }
        Ok((listener, listen))
    }

    /// Phase 2: the I/O thread serves the listener (links from ranks that finished joining
    /// earlier may arrive before this rank has the table).
    fn serve(cfg: &BootstrapConfig, id: UniqueId, listener: TcpListener) -> Result<Self> {
        let me = cfg.rank;
        let addr = listener.local_addr().ok();
        let key = KeyCell::default();
        let gate = Gate {
            me,
            purpose: Purpose::Link,
            magic: id.magic(),
            size: cfg.size,
            key: Arc::clone(&key),
        };
        let admission = Admission::new(listener, gate, cfg.handshake_timeout, "listener").map_err(
            |source| Error::BootstrapListen {
                rank: me,
                addr: addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
                source,
            },
        )?;
        let mailbox = Arc::new(Mailbox::new(caps(cfg)));
        let links = Arc::new(Links::default());
        let shared = Arc::new(Shared {
            me,
            size: cfg.size,
            magic: id.magic(),
            mailbox: Arc::clone(&mailbox),
            links: Arc::clone(&links),
            peer_timeout: cfg.peer_timeout,
        });
        let reactor = Reactor::start(shared, admission)?;
        Ok(Self {
            rank: me,
            size: cfg.size,
            addrs: Vec::new(),
            nodes: NodeMap::new(&[]),
            op_timeout: cfg.op_timeout,
            session: id,
            key,
            mailbox,
            links,
            reactor: Some(reactor),
            max_queued_bytes: cfg.max_queued_bytes,
            coll_seq: AtomicU64::new(0),
            goodbye: AtomicBool::new(true),
            phases: Vec::new(),
            root: None,
        })
    }

    /// Phase 3 (after joining): every rank's address and node.
    fn learn(&mut self, cfg: &BootstrapConfig, table: &wire::Table) {
        let me = self.rank;
        let hashes: Vec<u64> = table.entries.iter().map(|e| e.host_hash).collect();
        self.nodes = NodeMap::new(&hashes);
        if let Some(l) = cfg.launcher_local_rank
            && l != self.nodes.local_rank[me]
        {
            tracing::warn!(
                "bootstrap rank {me}: the launcher says local rank {l}, host identities say {} (set MSCCLPP_HOSTID to group differently)",
                self.nodes.local_rank[me]
            );
        }
        self.addrs = table.entries.iter().map(|e| e.listen).collect();
    }

    /// Phase 4: the link to the parent in the collectives' tree, then a barrier over the
    /// tree, so that no rank returns before every tree link is up.
    fn link_tree(
        &self,
        deadline: Instant,
        timeout: Duration,
        phases: &mut SetupPhases,
    ) -> Result<()> {
        phases.mark("tree");
        if let Some(parent) = ops::parent(self.rank) {
            self.link(
                parent,
                deadline,
                self.ctx(parent, "link to the tree parent", timeout),
            )?;
        }
        phases.mark("barrier");
        self.barrier_until(deadline, timeout, "set-up barrier", None)
    }

    /// The out link to `peer`, opened now if there is none (module docs of `links.rs`).
    fn link(&self, peer: usize, deadline: Instant, ctx: Ctx) -> Result<Arc<links::LinkConn>> {
        if let Some(down) = self.mailbox.down(peer) {
            return Err(down.to_error(&ctx));
        }
        match self.links.begin(peer, deadline) {
            links::Begin::Ready(l) => return Ok(l),
            links::Begin::Timeout => return Err(ctx.timeout_error()),
            links::Begin::Open => {}
        }
        let Some(&addr) = self.addrs.get(peer) else {
            self.links.end(peer, None);
            return Err(ctx.io(IoFail::Closed));
        };
        let ctx_open = Ctx {
            op: "open a link",
            ..ctx
        };
        let Some(&world) = self.key.get() else {
            self.links.end(peer, None);
            return Err(ctx.auth("this rank has no world key yet (it has not joined)".into()));
        };
        let opened = connect::retry_cut(deadline, |_| {
            let me = (&self.session, world);
            connect::open_link(&ctx_open, me, self.size, peer, addr, deadline)
        });
        match opened {
            Ok(stream) => {
                let conn = links::LinkConn::new(peer, stream);
                self.links.end(peer, Some(Arc::clone(&conn)));
                if let Some(r) = &self.reactor {
                    r.add(Arc::clone(&conn));
                }
                Ok(self.links.out(peer).unwrap_or(conn))
            }
            Err(e) => {
                self.links.end(peer, None);
                // Its listener is gone: so is its bootstrap (set-up is over everywhere). A
                // listener that took the connection and closed it before answering (a
                // bootstrap that was dropping, or one shedding strangers) was tried again
                // above: the retry finds the listener gone, or gets through. Without this a
                // receive from a rank that left waited out its whole deadline.
                let gone = matches!(&e, Error::BootstrapConnect { source, .. }
                    if source.kind() == std::io::ErrorKind::ConnectionRefused);
                if gone {
                    self.mailbox
                        .set_down(peer, LinkDown::Unreachable(e.to_string()));
                }
                Err(e)
            }
        }
    }

    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.nodes.members.len()
    }

    /// The ranks on `node`, in rank order (empty if there is no such node).
    pub fn ranks_on_node(&self, node: usize) -> &[usize] {
        self.nodes.members.get(node).map_or(&[], Vec::as_slice)
    }

    /// How many links this rank holds now (diagnostics: the tree's, plus those opened by
    /// point-to-point traffic).
    pub fn link_count(&self) -> usize {
        self.links.count()
    }

    /// What `peer` has queued at this rank, unreceived: (bytes, frames) (diagnostics; capped
    /// by [`BootstrapConfig::max_queued_bytes`] and `max_queued_frames`).
    pub fn queued_from(&self, peer: usize) -> (u64, u64) {
        self.mailbox.queued(peer)
    }

    /// The address `rank` listened on during set-up (diagnostics).
    pub fn peer_addr(&self, rank: usize) -> Option<SocketAddr> {
        self.addrs.get(rank).copied()
    }

    /// Changes the deadline of each later operation.
    pub fn set_op_timeout(&mut self, timeout: Duration) {
        self.op_timeout = timeout;
    }

    pub(super) fn peer(&self, rank: usize) -> Peer {
        Peer {
            rank: Some(rank),
            addr: self.addrs.get(rank).copied(),
        }
    }

    pub(super) fn ctx(&self, peer: usize, op: &'static str, timeout: Duration) -> Ctx {
        Ctx {
            rank: self.rank,
            peer: self.peer(peer),
            op,
            timeout,
        }
    }

    pub(super) fn check_peer(&self, peer: usize) -> Result<()> {
        if peer < self.size {
            Ok(())
        } else {
            Err(Error::BootstrapInvalidPeer {
                rank: self.rank,
                peer,
                size: self.size,
            })
        }
    }
}

impl Drop for TcpBootstrap {
    /// Closes every link gracefully without waiting on anyone for long: first our FIN (after
    /// everything already sent); each peer's I/O thread answers with its own as soon as it
    /// reads ours, so ours sees EOF with nothing left unread (closing a socket with unread bytes
    /// would reset it and could discard what we sent last). After at most min(op deadline,
    /// 2 s) the I/O thread is stopped and the sockets closed regardless.
    ///
    /// Unless a communicator on it failed ([`Bootstrap::forgo_goodbye`]) or the thread is
    /// panicking, a goodbye frame goes first on every link: the peers then know that this rank
    /// finished rather than died, and do not abort their communicators for it (see
    /// [`Bootstrap::left_peer`]).
    fn drop(&mut self) {
        // Late joiners are no longer told anything: the root address closes.
        drop(self.root.take());
        if let Some(r) = &self.reactor {
            r.settle(MAX_LINGER);
            r.closing();
        }
        let links = self.links.all();
        let goodbye = self.goodbye.load(Ordering::Acquire) && !std::thread::panicking();
        let deadline = deadline_in(self.op_timeout.min(MAX_LINGER));
        for l in &links {
            l.close(goodbye, deadline);
        }
        let mut peers: Vec<usize> = links.iter().map(|l| l.peer).collect();
        peers.dedup();
        self.mailbox.wait_down(&peers, deadline);
        if let Some(mut r) = self.reactor.take() {
            r.stop();
        }
    }
}

/// A fresh job nonce (the root's; module docs of `bootstrap::keying`).
fn fresh_job() -> Result<Nonce> {
    Nonce::random().map_err(|e| Error::BootstrapConfig(format!("no random job nonce: {e}")))
}

/// The world key of a root at `root` with a fresh job nonce.
fn world_key(keying: &Keying, root: SocketAddr) -> Result<WorldKey> {
    let job = fresh_job()?;
    let key = keying.key(root, &job).map_err(|e| {
        Error::BootstrapConfig(format!(
            "deriving the world key from {}: {e}",
            super::env::SECRET
        ))
    })?;
    Ok(WorldKey { key, job })
}

/// The mailbox caps of a configuration.
fn caps(cfg: &BootstrapConfig) -> Caps {
    Caps {
        bytes: cfg.max_queued_bytes,
        frames: cfg.max_queued_frames,
        process_bytes: cfg.max_process_queued_bytes,
    }
}

/// What a failed send means for the caller.
fn send_error(ctx: &Ctx, fail: SendFail) -> Error {
    match fail {
        SendFail::Io(f) => ctx.io(f),
        SendFail::Broken(why) => Error::BootstrapIo {
            rank: ctx.rank,
            peer: ctx.peer,
            op: ctx.op,
            source: std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                format!("the link was cut after an earlier send failed: {why}"),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_map_groups_by_hash_in_rank_order() {
        let m = NodeMap::new(&[7, 9, 7, 9, 5]);
        assert_eq!(m.node_of, vec![0, 1, 0, 1, 2]);
        assert_eq!(m.local_rank, vec![0, 0, 1, 1, 0]);
        assert_eq!(m.members, vec![vec![0, 2], vec![1, 3], vec![4]]);
    }
}
