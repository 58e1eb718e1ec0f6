//! [`TcpBootstrap`]: set-up (listen, join at the root, build the mesh) and the operations over
//! the mesh (tagged send/receive, barrier, all-gather, broadcast).
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | [`TcpBootstrap`], its set-up (steps 1–5 of the [protocol](super)), node layout, `Drop` |
//! | `mesh.rs` | joining at the root, connecting to lower ranks, the handshake of this rank's listener |
//! | `link.rs` | one mesh connection: its writer and the reader thread that feeds the mailbox |
//! | `ops.rs` | the [`Bootstrap`] operations: frames out and in, the collectives |

mod link;
mod mesh;
mod ops;

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::link::Link;
use self::mesh::{Incoming, PeerHandshake, connect_peer, join_root};
use super::mailbox::Mailbox;
use super::net::{self, Acceptor, Ctx};
use super::root::{RootParams, RootService};
use super::wire;
use super::{Bootstrap, BootstrapConfig, Peer, RootListener, SetupPhase, SetupPhases, UniqueId};
use crate::error::{Error, Result};
use crate::socket::{deadline_in, remaining};

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
/// and keeps one connection per pair of ranks for tagged messages and small collectives.
/// See the [module docs](super) for the protocol, threads and failure model.
pub struct TcpBootstrap {
    rank: usize,
    size: usize,
    addrs: Vec<SocketAddr>,
    nodes: NodeMap,
    op_timeout: Duration,
    mailbox: Arc<Mailbox>,
    links: Vec<Option<Link>>,
    coll_seq: AtomicU64,
    /// Whether `Drop` says goodbye (cleared by [`Bootstrap::forgo_goodbye`]).
    goodbye: AtomicBool,
    /// The set-up's phases ([`Bootstrap::setup_phases`]).
    phases: Vec<SetupPhase>,
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
        let id = config.root.unique_id()?;
        let me = config.rank;
        let deadline = deadline_in(config.timeout);
        if config.size == 1 {
            return Ok(Self::solo(&config));
        }
        if me != 0 && root_listener.is_some() {
            return Err(Error::BootstrapConfig(format!(
                "rank {me} was given the root listener; only rank 0 serves the root"
            )));
        }
        let root = match root_listener {
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
                Some(l.into_inner())
            }
            None if me == 0 => Some(net::bind(0, id.root())?),
            None => None,
        };
        let root = match root {
            Some(listener) => {
                let params = RootParams {
                    magic: id.magic(),
                    size: config.size,
                    deadline,
                    handshake_timeout: config.handshake_timeout,
                };
                Some(RootService::start(listener, params)?)
            }
            None => None,
        };
        let mut joined = false;
        let result = Self::set_up(&config, id, deadline, &mut joined, &mut phases);
        if let Some(root) = root {
            root.finish(joined);
        }
        let result = result.map(|mut bs| {
            bs.phases = phases.finish();
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

    fn solo(config: &BootstrapConfig) -> Self {
        Self {
            rank: 0,
            size: 1,
            addrs: Vec::new(),
            nodes: NodeMap::new(&[0]),
            op_timeout: config.op_timeout,
            mailbox: Arc::new(Mailbox::new(1)),
            links: Vec::new(),
            coll_seq: AtomicU64::new(0),
            goodbye: AtomicBool::new(true),
            phases: Vec::new(),
        }
    }

    fn set_up(
        cfg: &BootstrapConfig,
        id: UniqueId,
        deadline: Instant,
        joined: &mut bool,
        phases: &mut SetupPhases,
    ) -> Result<Self> {
        let (me, size) = (cfg.rank, cfg.size);

        // 1. This rank's listener, serving handshakes from the start.
        phases.mark("listen");
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
        let (tx, rx) = mpsc::channel();
        let handshake = PeerHandshake {
            magic: id.magic(),
            me,
            size,
            timeout: cfg.handshake_timeout,
            claimed: Mutex::new(vec![false; size]),
            tx,
        };
        let mut acceptor = Acceptor::start(me, listener, "mesh", Arc::new(handshake))?;

        // 2. Join at the root; learn every rank's address and host.
        phases.mark("join root");
        let host_hash = net::host_hash(cfg.host_id.as_deref());
        let table = join_root(cfg, id, listen, host_hash, deadline, joined)?;
        let hashes: Vec<u64> = table.entries.iter().map(|e| e.host_hash).collect();
        let nodes = NodeMap::new(&hashes);
        if let Some(l) = cfg.launcher_local_rank
            && l != nodes.local_rank[me]
        {
            tracing::warn!(
                "bootstrap rank {me}: the launcher says local rank {l}, host identities say {} (set MSCCLPP_HOSTID to group differently)",
                nodes.local_rank[me]
            );
        }
        let addrs: Vec<SocketAddr> = table.entries.iter().map(|e| e.listen).collect();

        // 3. Mesh: connect to every lower rank; take connections from every higher rank.
        phases.mark("mesh");
        let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        for (j, slot) in streams.iter_mut().enumerate().take(me) {
            *slot = Some(connect_peer(cfg, id, j, addrs[j], deadline)?);
        }
        let mut waiting = size - 1 - me;
        while waiting > 0 {
            let timed_out = match remaining(deadline) {
                None => true,
                Some(left) => match rx.recv_timeout(left) {
                    Ok(Incoming { from, stream }) => {
                        if let Some(slot) = streams.get_mut(from).filter(|s| s.is_none()) {
                            *slot = Some(stream);
                            waiting -= 1;
                        }
                        false
                    }
                    Err(RecvTimeoutError::Timeout) => false,
                    Err(RecvTimeoutError::Disconnected) => true,
                },
            };
            if timed_out {
                let missing = (me + 1..size).filter(|&r| streams[r].is_none()).collect();
                return Err(Error::BootstrapMissingRanks {
                    rank: me,
                    missing,
                    op: "mesh set-up (waiting for higher ranks to connect)",
                    after: cfg.timeout,
                });
            }
        }
        acceptor.stop();

        // 4. A reader thread per connection; then a barrier, so that no rank returns before
        //    every rank is connected.
        let mut bs = TcpBootstrap {
            rank: me,
            size,
            addrs,
            nodes,
            op_timeout: cfg.op_timeout,
            mailbox: Arc::new(Mailbox::new(size)),
            links: Vec::with_capacity(size),
            coll_seq: AtomicU64::new(0),
            goodbye: AtomicBool::new(true),
            phases: Vec::new(),
        };
        for (p, s) in streams.into_iter().enumerate() {
            let link = match s {
                Some(s) => Some(Link::start(
                    me,
                    p,
                    bs.addrs.get(p).copied(),
                    s,
                    Arc::clone(&bs.mailbox),
                )?),
                None => None,
            };
            bs.links.push(link);
        }
        phases.mark("barrier");
        bs.barrier_until(deadline, cfg.timeout, "set-up barrier", None)?;
        Ok(bs)
    }

    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.nodes.members.len()
    }

    /// The ranks on `node`, in rank order (empty if there is no such node).
    pub fn ranks_on_node(&self, node: usize) -> &[usize] {
        self.nodes.members.get(node).map_or(&[], Vec::as_slice)
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
    /// Closes every connection gracefully without waiting on anyone for long: first our FIN
    /// (after everything already sent); each peer's reader answers with its own as soon as it
    /// reads ours, so our readers see EOF with nothing left unread (closing a socket with unread
    /// bytes would reset it and could discard what we sent last). After at most
    /// min(op deadline, 2 s) the sockets are shut down regardless and the reader threads joined.
    ///
    /// Unless a communicator on it failed ([`Bootstrap::forgo_goodbye`]) or the thread is
    /// panicking, a goodbye frame goes first on every connection: the peers then know that this
    /// rank finished rather than died, and do not abort their communicators for it (see
    /// [`Bootstrap::left_peer`]).
    fn drop(&mut self) {
        let peers: Vec<usize> = self
            .links
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_some())
            .map(|(p, _)| p)
            .collect();
        if self.goodbye.load(Ordering::Acquire) && !std::thread::panicking() {
            let deadline = deadline_in(self.op_timeout.min(MAX_LINGER));
            for &p in &peers {
                let ctx = self.ctx(p, "goodbye", MAX_LINGER);
                // Best effort: a peer already gone needs no goodbye.
                let _ = self.send_frame(p, wire::CHANNEL_GOODBYE, 0, &[], deadline, ctx);
            }
        }
        for l in self.links.iter().flatten() {
            let _ = l.ctl.shutdown(Shutdown::Write);
        }
        self.mailbox
            .wait_down(&peers, deadline_in(self.op_timeout.min(MAX_LINGER)));
        self.links.clear();
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
