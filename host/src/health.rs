//! A communicator's health: the bootstrap it hands out, whose waits watch it, and the monitor
//! thread that notices a dead peer; and the bootstrap of a group bound to its world
//! (`WorldBound`: a node group fails with the world it was made from).
//!
//! # Waits watch the communicator
//!
//! Every bootstrap wait of a communicator — its set-up receives and every receive or collective
//! through `Communicator::bootstrap` (`barrier`, `all_gather`, `broadcast`, `recv`) — goes
//! through a `WatchedBootstrap`: it waits in slices of at most
//! [`WATCH_SLICE`](crate::bootstrap::WATCH_SLICE) and checks the communicator between them
//! (`Alive::check`). So once the health monitor has seen a dead peer, or `abort()` was called
//! (or a proxy failed), the wait ends at once with the communicator's error ([`Error::Remote`]
//! naming the dead rank, or [`Error::Aborted`]) instead of waiting for a live but slow rank or
//! the bootstrap's operation deadline. A bootstrap failure caused by a dead peer is reported
//! the same way (`WatchedBootstrap::blame`).
//!
//! # The monitor
//!
//! One thread per process (`mscclpp-health`) looks at the bootstrap of every live
//! communicator every [`HEALTH_INTERVAL`]: a peer whose link died ([`Bootstrap::dead_peer`]),
//! or one that left with a goodbye more than the leave grace ago ([`LEAVE_GRACE`] by default),
//! is recorded and that communicator's status is aborted, which releases every device wait of
//! this rank. It starts with the first communicator and ends when none is left, so a process
//! with many communicators (split process groups) has one such thread, not one each.
//!
//! Shared words: the monitor's table of watched communicators (a mutex: an entry added by
//! `Health::start`, removed by `Health`'s drop or by the monitor once its communicator
//! failed; the monitor looks at every entry under it, so no communicator is looked at after
//! its drop returned), the dead peer (a mutex: written once by the monitor, read by every
//! wait's check once its flag is up; the flag, an atomic, is stored with release by the
//! monitor after the write and loaded with acquire by every check, so a check of a healthy
//! communicator, on every collective call, takes no lock), the leave grace in milliseconds (an
//! atomic, relaxed: written by `Communicator::set_leave_grace`, read by the monitor), and the
//! status block's abort flag (its own protocol, `crate::status`).

use crate::error::ProxyError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::bootstrap::{Bootstrap, Decorator, Watch};
use crate::error::{Error, Result};
use crate::status::StatusBlock;
use crate::sync::lock;

/// How often the health monitor looks at the bootstrap links.
pub const HEALTH_INTERVAL: Duration = Duration::from_millis(20);

/// How long a communicator keeps running after a peer closed its bootstrap with a goodbye (it
/// finished normally) before it aborts as for a dead peer. Ranks finish their last collective
/// at slightly different times, and the first to finish leaves first: the others must not
/// fail for it. A rank that left early by mistake (a calls mismatch, an error handled by
/// returning) releases the others' device waits after this long instead of the spin limit;
/// their host waits for a message from it fail at once.
pub const LEAVE_GRACE: Duration = Duration::from_secs(10);

/// What a communicator's waits check: the peer the health monitor found dead (sticky) and the
/// abort flag.
#[derive(Clone)]
pub(crate) struct Alive {
    dead: Arc<Mutex<Option<(usize, String)>>>,
    /// Whether `dead` holds a peer (module docs).
    any_dead: Arc<AtomicBool>,
    status: Arc<StatusBlock>,
    /// The health monitor's grace for a peer that left, in milliseconds.
    leave_grace_ms: Arc<AtomicU64>,
}

impl Alive {
    /// The dead peer the monitor recorded, if any.
    pub(crate) fn dead(&self) -> Option<(usize, String)> {
        if !self.any_dead.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.dead).clone()
    }

    /// `Error::Remote` for a dead peer, `Error::Aborted` for an abort, else `Ok`.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some((rank, reason)) = self.dead() {
            return Err(Error::Remote { rank, reason });
        }
        if self.status.is_aborted() {
            return Err(Error::Aborted {
                reason: "abort() was called or a proxy failed".into(),
            });
        }
        Ok(())
    }
}

/// The bootstrap as a communicator hands it out: a [`Decorator`] whose watched waits are the
/// inner bootstrap's, also checking the communicator between slices (module docs); the plain
/// waits are the trait's, so they watch too; everything else (sends included) is the inner
/// bootstrap's.
pub(crate) struct WatchedBootstrap {
    inner: Arc<dyn Bootstrap>,
    alive: Alive,
}

impl WatchedBootstrap {
    /// Runs the wait `op` with the communicator as its watch (and `also`); fails at once if
    /// the communicator has already failed.
    fn watched<T>(&self, also: Watch<'_>, op: impl FnOnce(Watch<'_>) -> Result<T>) -> Result<T> {
        self.alive.check()?;
        let both = || self.alive.check().and_then(|()| also());
        op(&both).map_err(|e| self.blame(e))
    }

    /// A failed wait's error as the communicator reports it: a bootstrap failure about a peer
    /// (closed, timed out, I/O) becomes the communicator's error when it has one, or
    /// `Error::Remote` naming the peer whose link went down first when the bootstrap knows one.
    fn blame(&self, e: Error) -> Error {
        if !matches!(
            e,
            Error::BootstrapPeerClosed { .. }
                | Error::BootstrapTimeout { .. }
                | Error::BootstrapIo { .. }
                | Error::BootstrapPeerGone { .. }
                | Error::BootstrapQueueFull { .. }
        ) {
            return e;
        }
        if let Err(a) = self.alive.check() {
            return a;
        }
        match self.inner.dead_peer() {
            Some((rank, reason)) => Error::Remote { rank, reason },
            None => e,
        }
    }
}

impl Decorator for WatchedBootstrap {
    fn inner(&self) -> &dyn Bootstrap {
        self.inner.as_ref()
    }
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        self.watched(watch, |w| self.inner.recv_watched(peer, tag, timeout, w))
    }
    fn recv_any(&self, peers: &[usize], tag: u64, timeout: Duration) -> Result<(usize, Vec<u8>)> {
        self.inner
            .recv_any(peers, tag, timeout)
            .map_err(|e| self.blame(e))
    }
    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        self.watched(watch, |w| self.inner.barrier_watched(w))
    }
    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        self.watched(watch, |w| self.inner.all_gather_watched(data, w))
    }
    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        self.watched(watch, |w| self.inner.broadcast_watched(root, data, w))
    }
}

/// A sub-world bound to the world it was made from (the node group of a world of several
/// nodes, `Communicator::node_group`): its bootstrap is `inner` (a `SubBootstrap` over the
/// world's watched bootstrap, so every wait also watches the world), and the world's failures
/// are its own:
/// - [`dead_peer`](Bootstrap::dead_peer): a rank of the world whose link died, member or not
///   (named by its world rank), or, once the world communicator was aborted (a transport or
///   proxy failed, a peer died, `abort()`), this rank itself: either way the group
///   communicator's health monitor aborts the group's device waits too, within its interval;
/// - [`left_peer`](Bootstrap::left_peer): the world's (a world rank);
/// - [`forgo_goodbye`](Bootstrap::forgo_goodbye): the world's, so a failed group makes this
///   rank leave the world without a goodbye.
pub(crate) struct WorldBound {
    inner: Box<dyn Bootstrap>,
    world: Arc<dyn Bootstrap>,
    world_status: Arc<StatusBlock>,
}

impl WorldBound {
    /// `inner`, a group of the world whose (watched) bootstrap is `world` and whose
    /// communicator's status is `world_status`.
    pub(crate) fn new(
        inner: Box<dyn Bootstrap>,
        world: Arc<dyn Bootstrap>,
        world_status: Arc<StatusBlock>,
    ) -> Self {
        Self {
            inner,
            world,
            world_status,
        }
    }
}

impl Decorator for WorldBound {
    fn inner(&self) -> &dyn Bootstrap {
        self.inner.as_ref()
    }
    fn dead_peer(&self) -> Option<(usize, String)> {
        if let Some((rank, why)) = self.world.dead_peer() {
            return Some((rank, format!("world rank {rank}: {why}")));
        }
        self.world_status.is_aborted().then(|| {
            (
                self.world.rank(),
                "the world communicator of this rank was aborted (a transport or proxy failed, \
                 a peer died, or abort() was called)"
                    .to_owned(),
            )
        })
    }
    /// The one [`dead_peer`](Bootstrap::dead_peer) names (a node group is not shrunk: its
    /// world is).
    fn dead_peers(&self) -> Vec<(usize, String)> {
        Decorator::dead_peer(self).into_iter().collect()
    }
    fn left_peer(&self) -> Option<(usize, Duration)> {
        self.world.left_peer()
    }
    fn forgo_goodbye(&self) {
        self.world.forgo_goodbye();
    }
}

/// A communicator's health: its watched bootstrap and its entry in the monitor's table
/// (module docs).
pub(crate) struct Health {
    watched: Arc<WatchedBootstrap>,
    /// Its entry in [`MONITOR`].
    id: u64,
}

/// A communicator the monitor looks at.
struct Entry {
    id: u64,
    bootstrap: Weak<dyn Bootstrap>,
    alive: Alive,
}

/// The monitor's table (module docs), and whether its thread runs.
struct Monitor {
    entries: Vec<Entry>,
    next_id: u64,
    running: bool,
}

static MONITOR: Mutex<Monitor> = Mutex::new(Monitor {
    entries: Vec::new(),
    next_id: 0,
    running: false,
});

/// The monitor's thread: a look at every entry each [`HEALTH_INTERVAL`], until none is left.
fn monitor() {
    loop {
        {
            let mut m = lock(&MONITOR);
            m.entries.retain(|e| {
                let Some(bs) = e.bootstrap.upgrade() else {
                    return false;
                };
                let Some(d) = gone(bs.as_ref(), &e.alive) else {
                    return true;
                };
                tracing::error!("rank {} is gone ({}); aborting the communicator", d.0, d.1);
                *lock(&e.alive.dead) = Some(d);
                e.alive.any_dead.store(true, Ordering::Release);
                e.alive.status.abort();
                false
            });
            if m.entries.is_empty() {
                m.running = false;
                return;
            }
        }
        std::thread::sleep(HEALTH_INTERVAL);
    }
}

impl Health {
    /// Starts watching `bootstrap` for the communicator whose status is `status`.
    pub(crate) fn start(bootstrap: Arc<dyn Bootstrap>, status: Arc<StatusBlock>) -> Result<Self> {
        let alive = Alive {
            dead: Arc::default(),
            any_dead: Arc::default(),
            status,
            leave_grace_ms: Arc::new(AtomicU64::new(millis(LEAVE_GRACE))),
        };
        let mut m = lock(&MONITOR);
        let id = m.next_id;
        m.next_id += 1;
        m.entries.push(Entry {
            id,
            bootstrap: Arc::downgrade(&bootstrap),
            alive: alive.clone(),
        });
        if !m.running {
            let spawned = std::thread::Builder::new()
                .name("mscclpp-health".into())
                .spawn(monitor);
            if let Err(source) = spawned {
                m.entries.retain(|e| e.id != id);
                return Err(Error::Proxy(ProxyError::HealthMonitorStart { source }));
            }
            m.running = true;
        }
        Ok(Self {
            watched: Arc::new(WatchedBootstrap {
                inner: bootstrap,
                alive,
            }),
            id,
        })
    }

    /// The bootstrap whose waits watch the communicator.
    pub(crate) fn bootstrap(&self) -> Arc<dyn Bootstrap> {
        self.watched.clone()
    }

    /// The bootstrap as it was handed in, without this communicator's watch (what a
    /// sub-communicator's bootstrap is built over: its waits watch the sub-communicator).
    pub(crate) fn unwatched(&self) -> Arc<dyn Bootstrap> {
        self.watched.inner.clone()
    }

    /// `Error::Remote` for a dead peer, `Error::Aborted` for an abort, else `Ok`.
    pub(crate) fn check(&self) -> Result<()> {
        self.watched.alive.check()
    }

    /// Sets how long a peer may have left with a goodbye before the monitor aborts for it.
    pub(crate) fn set_leave_grace(&self, grace: Duration) {
        self.watched
            .alive
            .leave_grace_ms
            .store(millis(grace), Ordering::Relaxed);
    }

    /// Called when the communicator is dropped: a communicator that failed on its own (aborted,
    /// or a device wait gave up, with no dead peer to blame), or one dropped while its thread
    /// panics, makes its bootstrap close without a goodbye, so that the peers abort at once
    /// instead of after the leave grace. (After a dead peer, the peers see that peer's death
    /// themselves.)
    pub(crate) fn on_drop(&self) {
        let alive = &self.watched.alive;
        let failed =
            alive.dead().is_none() && (alive.status.is_aborted() || alive.status.error().is_some());
        if failed || std::thread::panicking() {
            self.watched.inner.forgo_goodbye();
        }
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        lock(&MONITOR).entries.retain(|e| e.id != self.id);
    }
}

/// A peer that died, or that left more than the grace ago, with why.
fn gone(bs: &dyn Bootstrap, alive: &Alive) -> Option<(usize, String)> {
    let grace = Duration::from_millis(alive.leave_grace_ms.load(Ordering::Relaxed));
    bs.dead_peer().or_else(|| {
        let (rank, ago) = bs.left_peer().filter(|&(_, ago)| ago >= grace)?;
        let why = format!(
            "finished and closed its bootstrap {:.1} s ago while this communicator was still in \
             use (calls that do not match across ranks?)",
            ago.as_secs_f64()
        );
        Some((rank, why))
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
