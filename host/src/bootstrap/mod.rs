//! Bootstrap: how ranks find each other and exchange the small messages that set up everything
//! else (memory handles, connection info), over TCP.
//!
//! ```no_run
//! use mscclpp_host::bootstrap::{Bootstrap, BootstrapConfig, TcpBootstrap, UniqueId, local_ip};
//! # fn main() -> mscclpp_host::Result<()> {
//! // Rank 0: bind the root and hand the id (hex) to the others through the launcher.
//! let (id, listener) = UniqueId::bind(std::net::SocketAddr::new(local_ip(None)?, 0))?;
//! println!("MSCCLPP_UNIQUE_ID={id}");
//! let bs = TcpBootstrap::init_with_root_listener(BootstrapConfig::new(0, 4, id), listener)?;
//! // Ranks 1..4: TcpBootstrap::init(BootstrapConfig::from_env()?)
//! let all = bs.all_gather(&(bs.rank() as u32).to_le_bytes())?;
//! bs.send(1, 7, b"hello")?;
//! bs.barrier()?;
//! # let _ = all; Ok(()) }
//! ```
//!
//! | item | what |
//! |---|---|
//! | [`UniqueId`] | root address + random session magic + random 32-byte secret; 144 hex characters through any launcher |
//! | [`BootstrapConfig`] | rank, size, root, secret, deadlines, interface, queue caps; [`BootstrapConfig::from_env`] knows MSCCL++, torchrun, Open MPI and Slurm variables |
//! | [`TcpBootstrap`] | the bootstrap: `send`/`recv` by (peer, tag), `all_gather`, `barrier`, `broadcast`, node layout |
//! | [`Bootstrap`] | the operations as a trait, for other implementations (e.g. in-process) |
//! | [`Decorator`] | a bootstrap over another that overrides only the operations it changes (every other one is the inner bootstrap's) |
//! | [`SubBootstrap`] | a group of ranks (a split's sub-communicator, a node group of a world of several nodes) as a bootstrap of its own, over the parent's links and tags |
//! | [`wire`] | the byte layout of every frame |
//! | [`passphrase_key`] | the key of a world started with a passphrase (`MSCCLPP_SECRET`), from its root address and job nonce |
//!
//! # Protocol
//!
//! Every integer is little-endian; [`wire`] has the byte tables. Set-up, in order (each phase
//! is one function of `TcpBootstrap`):
//!
//! 1. **Listen.** Every rank binds its own listener (ephemeral port on the address that routes
//!    to the root, on `MSCCLPP_SOCKET_IFNAME`'s IPv4 address, or on [`BootstrapConfig::listen`])
//!    and its I/O thread serves it at once. Rank 0 also serves the root address.
//! 2. **Join.** Every rank (rank 0 included, over loopback) connects to the root, retrying while
//!    it is refused, and runs the authenticated handshake ([`crate::auth`]): `HELLO {magic,
//!    purpose, rank, size, nonce}`; the root answers `CHALLENGE {nonce, job nonce, tag}`, its
//!    proof that it knows the world's key, which the rank checks before it says anything more
//!    (with a passphrase, the rank first derives the key from it and the job nonce: `keying`);
//!    the rank keeps the key and sends `JOIN {tag, listen address, host hash, ms left}`, its
//!    own proof covering its registration. A join the root cut (it shed the handshake under a
//!    flood of connections: `REJECT Busy`, or closed) is tried again until the deadline.
//! 3. **Table.** When all `size` ranks have joined, the root sends each `TABLE {magic, size,
//!    (listen address, host hash) × size}` and closes. If a joined rank's connection ends first,
//!    or ranks are missing at the deadline (the earliest of the root's and every joined rank's),
//!    the root sends `ABORT {code, ranks}` instead, also to ranks that join later while its
//!    deadline lasts, so every rank fails naming the same culprits. A second JOIN for a rank
//!    (`REJECT Duplicate`), a different world size, a wrong proof (`REJECT Auth`) are refused
//!    without blocking anything. After the table the root keeps its port until rank 0's
//!    bootstrap is dropped and answers every proven JOIN with `REJECT Duplicate`: a rank whose
//!    place another process took (an impostor where there is no secret, or a second copy of the
//!    rank) fails with `Error::BootstrapRankTaken`, saying so, instead of timing out.
//! 4. **Tree.** Every rank `r > 0` opens a link to its parent `(r − 1) / 2` in a binary tree
//!    (`HELLO`, `CHALLENGE`, `PROOF {tag}`, then `ACCEPT` or `REJECT`), and a barrier over the
//!    tree ends set-up: once `init` returns anywhere, every tree link is up. A rank holds its
//!    listener, at most three tree links and its I/O thread's wake-up descriptor: O(1)
//!    descriptors per rank, not one socket per peer.
//! 5. **Links on first use.** A `send` or `recv` to a rank with no link opens one (the same
//!    handshake) and keeps it. A rank sends to a peer always on one link, so the frames of one
//!    (sender, tag) pair arrive in order; if two ranks open links to each other at once, each
//!    sends on its own and reads both.
//!
//! After the handshake a link carries data frames `{channel, tag, length, payload}`: channel 0
//! for user `send`/`recv`, channel 1 for the bootstrap's collectives (tag = operation, round and
//! a per-bootstrap sequence number, so collectives never see user messages or each other's),
//! 2 for the goodbye, 3 for notices (a rank is gone).
//!
//! **Collectives** run over the tree (barrier: up, then down; all-gather: each rank's subtree
//! up, everything down; broadcast: up from the root along its ancestors, then down): 2·log2(n)
//! hops and 2(n − 1) messages, instead of a ring's n − 1 hops and n(n − 1) messages for an
//! all-gather of small items (the bootstrap's are small: latency and message count matter).
//!
//! # Authentication
//!
//! Every connection a listener admits, the root's and each rank's, proves that its peer
//! knows the world's key, both ways, without sending it ([`crate::auth`]: HMAC-SHA-256 over
//! both nonces, the hello and the job nonce, constant-time comparison). A peer without the key
//! gets a `CHALLENGE` and nothing else: no table, no frames, no link. The key is the
//! [`UniqueId`]'s secret (32 random bytes, made by rank 0), or, when the root is a plain
//! address (`MSCCLPP_BOOTSTRAP`, torchrun's `MASTER_ADDR`), derived from `MSCCLPP_SECRET` with
//! Argon2id salted with the root address and the root's job nonce (about 0.1 s once per
//! process: a challenge captured by an outsider costs it that much per guess of the
//! passphrase, and a weak passphrase is warned about; [`passphrase_key`]). Without either,
//! such a world is **not authenticated** (the key is derived from the address; the first
//! set-up of the process says so on standard error). There is no encryption and no per-frame
//! integrity: an attacker on the path can read and rewrite the traffic (RELIABILITY.md).
//!
//! # Threads
//!
//! | thread | lives | does |
//! |---|---|---|
//! | `bs{r}-io` | until drop | serves rank `r`'s listener (every handshake at once, non-blocking, `poll`) and reads every link into the mailbox; marks peers down; passes notices on |
//! | `bs{r}-notice` | a moment, when a peer is gone | writes the notice to the other linked ranks (so the I/O thread never waits on a writer lock) |
//! | `bs0-root` | until drop, rank 0 (until its verdict when set-up fails) | serves the root address (the same non-blocking handshakes), collects JOINs, decides: table or abort; then answers late JOINs (`REJECT Duplicate`) |
//!
//! One I/O thread per rank, whatever the number of links: a thousand ranks as threads of one
//! process are a thousand I/O threads, not a million readers. Receives happen on the caller's
//! thread: they wait on the mailbox (a mutex and condition variable) for a frame of their
//! (peer, tag), so frames of other tags queue up and can be taken in any order. Sends write the
//! frame under the link's writer lock.
//!
//! # Failure model
//!
//! - Every wait has a deadline: set-up ([`BootstrapConfig::timeout`], default 30 s,
//!   `MSCCLPP_BOOTSTRAP_TIMEOUT_MS`), each handshake ([`BootstrapConfig::handshake_timeout`],
//!   default 5 s, measured from accept to the last byte, so slow drips do not extend it), each
//!   operation ([`BootstrapConfig::op_timeout`]). Socket reads and writes carry the time left.
//! - Errors name the peer ([`Peer`]: rank and/or address) and the operation:
//!   `BootstrapTimeout`, `BootstrapMissingRanks`, `BootstrapPeerClosed`, `BootstrapPeerGone`,
//!   `BootstrapBadMagic`, `BootstrapAuth`, `BootstrapVersion`, `BootstrapMalformed`,
//!   `BootstrapRejected`, `BootstrapQueueFull`, `BootstrapConnect`, … (see
//!   [`Error`](crate::Error)).
//! - **Admission under load.** A listener accepts every connection as it comes and runs every
//!   handshake at once without blocking (no thread per connection, no cap below the world
//!   size); garbage, silence, a wrong magic, version, size or proof is answered with a
//!   `REJECT` and drained in the background. Every listener of the process (the Ethernet
//!   transport's too) follows the intake rules (`intake`): a backlog of 4096; unauthenticated
//!   connections are a budget of the descriptors left under `RLIMIT_NOFILE` (the soft limit is
//!   raised to the hard one once per process; a reserve stays for the library's own work),
//!   half guaranteed to the listeners in equal parts, half a pool they borrow from; at most
//!   max(1024, 2 × size) handshakes are open at once and no more than the budget gives the
//!   listener, the least advanced shed first beyond that once 250 ms old (`REJECT Busy`; a
//!   real rank tries a cut join or link again), newcomers waiting in the kernel's queue while
//!   none is; a listener accepts at most 64 connections per turn, after its thread has read
//!   the handshakes with bytes waiting (a flood that reopens what is shed cannot keep it
//!   accepting while real ranks' handshakes wait); a failed `accept` (out of
//!   descriptors) pauses the listener for 100 ms; refusals and failures are logged at the
//!   warning level a few times, then every hundredth. Hundreds of idle or garbage connections
//!   do not delay a real rank, and a thousand held against a rank limited to 1,024
//!   descriptors do not exhaust it (host/tests/bootstrap_scale.rs, host/tests/descriptors.rs).
//! - A closed link fails every pending and later receive from that peer at once (messages it
//!   sent before closing are still delivered), and every later send to it. **A death reaches
//!   every rank**: when a link ends without a goodbye (or a peer floods or sends garbage), the
//!   rank that saw it sends a notice `{rank, reason}` on all its other links, and each rank that
//!   hears it first passes it on; the tree links connect every rank, so every rank learns
//!   (`Bootstrap::dead_peer`, "… (reported by rank k)"), in a few hops. A link that cannot be
//!   opened because the peer's listener is gone marks the peer down too (not passed on: it
//!   may just have finished).
//! - **Bounded memory.** Each peer may leave at most [`BootstrapConfig::max_queued_bytes`]
//!   (256 MiB) and `max_queued_frames` (65 536) queued at a rank, and all peers of all
//!   bootstraps of a process at most [`BootstrapConfig::max_process_queued_bytes`] (1 GiB) in
//!   it; the I/O thread counts a frame against them as soon as its header arrives, before any
//!   payload is read or allocated. A peer over a cap (for the process's: the sender of the
//!   frame that does not fit) has its link cut: receives from it fail with
//!   `BootstrapQueueFull`, `dead_peer` names it, so a communicator aborts.
//! - Nothing read is trusted: marker, version, magic, kind, every length (handshake bodies are
//!   capped at their exact size, data frames by the caps), every rank, every item of a
//!   collective (ranks of the sender's subtree, each once) are checked before use.
//! - `Drop` sends a goodbye frame on every link (unless [`Bootstrap::forgo_goodbye`] was
//!   called, or the thread is panicking), then FIN, waits briefly (at most 2 s) for the peers'
//!   FINs so nothing unread is reset, then stops the I/O thread; it never panics. A peer tells a
//!   rank that finished ([`Bootstrap::left_peer`]) from one that died
//!   ([`Bootstrap::dead_peer`]) by that goodbye; receives from either fail at once.
//!
//! Collectives (`barrier`, `all_gather`, `broadcast`, and `init`) must be called in the same
//! order on every rank, from one thread at a time per rank; `send`/`recv` may be used from any
//! number of threads.
//!
//! # Watched waits
//!
//! A bootstrap knows only its own links. A communicator also knows of failures the bootstrap
//! does not see on the link it waits on (a *third* rank died, `abort()` was called, a proxy
//! failed). The `*_watched` operations of [`Bootstrap`] take a [`Watch`]: a check called
//! between slices of at most [`WATCH_SLICE`] while the operation waits; its error ends the
//! operation at once. A message already in the mailbox is taken before the watch is consulted,
//! so a watch that fails does not discard a message that had arrived. The watched operations
//! use the same frames, tags and sequence numbers as the plain ones, so ranks may mix them.

mod admit;
mod cancel;
mod config;
mod decorator;
pub(crate) mod intake;
mod keying;
mod mailbox;
mod net;
pub(crate) mod os;
mod root;
mod sub;
mod tcp;
mod unique_id;
pub mod wire;

use std::time::Duration;

pub use cancel::Cancel;
pub use config::{
    BootstrapConfig, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_PROCESS_QUEUED_BYTES,
    DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_FRAMES, DEFAULT_PEER_TIMEOUT, DEFAULT_TIMEOUT,
    Launcher, RootSpec, TORCHRUN_PORT_OFFSET, env, parse_root,
};
pub use decorator::Decorator;
pub use keying::passphrase_key;
pub use net::{interface_ipv4, local_ip};
pub use sub::{MAX_SUB_ID, SUB_TAG, SubBootstrap};
pub use tcp::TcpBootstrap;
pub use unique_id::{RootListener, UNIQUE_ID_BYTES, UniqueId};

pub use crate::socket::Peer;

use crate::error::{Error, Result};

/// Longest a watched wait goes without calling its [`Watch`] (see the module docs).
pub const WATCH_SLICE: Duration = Duration::from_millis(20);

/// Longest pause between two looks of [`Bootstrap::recv_any`]'s default, which polls.
pub const ANY_POLL_MAX: Duration = Duration::from_millis(20);

/// A check a watched wait calls between slices; its error ends the wait (module docs).
pub type Watch<'a> = &'a dyn Fn() -> Result<()>;

/// One phase of a bootstrap's set-up, timed on the trace clock (`CLOCK_MONOTONIC` ns, see
/// `crate::trace`): what a traced communicator shows of how its bootstrap came up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetupPhase {
    /// `listen`, `join root`, `tree`, `barrier`, …
    pub name: &'static str,
    /// When it started.
    pub start_ns: u64,
    /// When it ended.
    pub end_ns: u64,
}

/// The phases of one set-up, in order: each [`mark`](Self::mark) ends the phase under way and
/// starts the next.
#[derive(Clone, Debug, Default)]
pub(crate) struct SetupPhases {
    done: Vec<SetupPhase>,
    current: Option<(&'static str, u64)>,
}

impl SetupPhases {
    /// Ends the phase under way (if any) and starts `name`.
    pub fn mark(&mut self, name: &'static str) {
        let now = mscclpp_device::arch::globaltimer_ns();
        if let Some((n, start)) = self.current.take() {
            self.done.push(SetupPhase {
                name: n,
                start_ns: start,
                end_ns: now,
            });
        }
        self.current = Some((name, now));
    }

    /// The phases, the one under way ended now.
    pub fn finish(mut self) -> Vec<SetupPhase> {
        if let Some((name, start)) = self.current.take() {
            self.done.push(SetupPhase {
                name,
                start_ns: start,
                end_ns: mscclpp_device::arch::globaltimer_ns(),
            });
        }
        self.done
    }
}

/// A watch that never fails: what the plain operations of [`Bootstrap`] pass to the watched
/// ones.
pub fn no_watch() -> Result<()> {
    Ok(())
}

/// The bootstrap operations, for code that should not care how ranks are connected.
/// Collectives must be called in the same order on every rank.
///
/// An implementation provides the node layout, `send`, and the four *watched* waits
/// (`recv_watched`, `barrier_watched`, `all_gather_watched`, `broadcast_watched`: module docs);
/// the plain waits are provided, as the watched ones with [`no_watch`]. So each wait is written
/// once per transport, and a wrapper (a communicator's watched bootstrap, a test's fault
/// injector) that overrides the watched ones changes the plain ones too. A wrapper implements
/// [`Decorator`] instead of this trait, and writes only what it changes.
pub trait Bootstrap: Send + Sync {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// This rank's index among the ranks of its node.
    fn local_rank(&self) -> usize;
    /// Number of ranks on this rank's node.
    fn ranks_per_node(&self) -> usize;
    /// The node of `rank`.
    fn node_of(&self, rank: usize) -> Option<usize>;
    /// Sends `data` to `peer` under `tag` (any rank, this one included). Messages of one
    /// (sender, tag) pair arrive in order; different tags are independent.
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()>;
    /// The next message from `peer` under `tag`, within `timeout`; calls `watch` at least
    /// every [`WATCH_SLICE`] while nothing has arrived and returns its error at once (a message
    /// that has arrived is always taken first).
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>>;
    /// Waits for every rank (collective), within the operation deadline; calls `watch` before
    /// it starts and at least every [`WATCH_SLICE`] while it waits, and returns its error at
    /// once.
    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()>;
    /// Every rank's equal-length `data`, in rank order (collective), watched as
    /// [`barrier_watched`](Self::barrier_watched).
    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>>;
    /// Rank `root`'s `data` replaces `data` on every other rank (any length; collective),
    /// watched as [`barrier_watched`](Self::barrier_watched).
    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()>;
    /// The deadline of one operation (`recv`, collectives).
    fn op_timeout(&self) -> Duration;
    /// A peer whose connection has ended without a goodbye (it crashed, was killed, failed, or
    /// sent garbage), with the reason, if any: what a communicator's health monitor watches.
    /// The default knows of none.
    fn dead_peer(&self) -> Option<(usize, String)> {
        None
    }
    /// Every peer whose connection ended without a goodbye, with the reasons, in the order
    /// they went down (the first is [`dead_peer`](Self::dead_peer)'s): the failure detector's
    /// view that a shrink excludes (`Communicator::failed_ranks`). The default is
    /// `dead_peer`'s one.
    fn dead_peers(&self) -> Vec<(usize, String)> {
        self.dead_peer().into_iter().collect()
    }
    /// The first peer that closed its bootstrap after saying goodbye (it finished normally),
    /// and how long ago. Receives from it fail at once; a communicator aborts for it only
    /// after a grace period (`health::LEAVE_GRACE`), so that ranks finishing their last
    /// collective a little later than it are not failed. The default knows of none.
    fn left_peer(&self) -> Option<(usize, Duration)> {
        None
    }
    /// Makes this rank close its connections without a goodbye (a communicator on it failed),
    /// so that the peers abort at once, as for a rank that died. The default does nothing.
    fn forgo_goodbye(&self) {}
    /// The phases of this bootstrap's set-up, timed (what a traced communicator records). The
    /// default has none.
    fn setup_phases(&self) -> Vec<SetupPhase> {
        Vec::new()
    }
    /// The world's secret, for transports that authenticate their own connections (the
    /// Ethernet transport's handshake, [`crate::auth`]). The default (a bootstrap that never
    /// leaves the process) has none.
    fn secret(&self) -> Option<crate::auth::Secret> {
        None
    }

    /// The next message under `tag` from any rank of `peers`, within `timeout`: the sender
    /// and the message. Messages of one sender arrive in order; which sender's comes first
    /// when several have one waiting is unspecified. A peer whose link is down and who has
    /// nothing queued under `tag` ends the wait with that error. The default waits on each
    /// peer in turn for a short while (from 1 ms, growing to [`ANY_POLL_MAX`] for a round of
    /// all of them): a wait, not a look, because some bootstraps receive only while someone
    /// waits (a [`SubBootstrap`] pulls its parent's frames then). Bootstraps that can wait on
    /// all of them at once override it: the TCP bootstrap does.
    fn recv_any(&self, peers: &[usize], tag: u64, timeout: Duration) -> Result<(usize, Vec<u8>)> {
        let deadline = std::time::Instant::now() + timeout;
        let most = ANY_POLL_MAX / peers.len().max(1) as u32;
        let mut each = Duration::from_millis(1);
        loop {
            for &q in peers {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match self.recv_timeout(q, tag, each.min(left)) {
                    Ok(m) => return Ok((q, m)),
                    Err(Error::BootstrapTimeout { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::BootstrapTimeout {
                    rank: self.rank(),
                    peer: crate::socket::Peer {
                        rank: None,
                        addr: None,
                    },
                    op: "recv_any",
                    after: timeout,
                });
            }
            each = (each * 2).min(most.max(Duration::from_millis(1)));
        }
    }

    /// The next message from `peer` under `tag`, within the operation deadline.
    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.recv_watched(peer, tag, self.op_timeout(), &no_watch)
    }
    /// The next message from `peer` under `tag`, within `timeout`.
    fn recv_timeout(&self, peer: usize, tag: u64, timeout: Duration) -> Result<Vec<u8>> {
        self.recv_watched(peer, tag, timeout, &no_watch)
    }
    /// Waits for every rank (collective).
    fn barrier(&self) -> Result<()> {
        self.barrier_watched(&no_watch)
    }
    /// Every rank's equal-length contribution, in rank order (collective).
    fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.all_gather_watched(data, &no_watch)
    }
    /// `root`'s `data` to every rank (collective).
    fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        self.broadcast_watched(root, data, &no_watch)
    }
}

/// FNV-1a, 64-bit: a small stable hash for host identities and derived magics (not for
/// anything adversarial: the secret is what authenticates).
pub(crate) struct Fnv1a(u64);

impl Fnv1a {
    pub fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}
