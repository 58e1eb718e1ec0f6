//! Intake: what every listener of the library does with connections that have proven nothing
//! yet. The bootstrap's root and rank listeners ([`super::admit`]) and the Ethernet transport's
//! (`connection::ethernet::setup`) follow the same rules, so a stranger costs each of them the
//! same bounded amount, however many connections it opens:
//!
//! - **Backlog** [`BACKLOG`] (4096, not std's 128): a burst of connections (a thousand ranks
//!   joining at once, or strays) does not make the kernel drop a real peer's SYN, which it
//!   would retry only after a second.
//! - **Descriptors are a budget.** Every unauthenticated connection a listener holds (in its
//!   handshake, or refused and lingering) costs a descriptor and holds a [`Ticket`]. The first
//!   listener of the process raises the soft `RLIMIT_NOFILE` to the hard limit (once per
//!   process, logged at debug). Of the soft limit, [`reserve`] descriptors are kept for the
//!   library's own work (links, memfds, files) and the application's; what the process holds
//!   besides unauthenticated connections is counted from `/proc/self/fd` (at most every
//!   [`RECOUNT`]). Of the room left, half is *guaranteed*: divided equally between the
//!   listeners alive in the process (at least [`MIN_SHARE`] each), so strangers that flood one
//!   listener cannot take another's; the other half is a *pool* any listener may borrow from
//!   beyond its guarantee (the root takes a thousand ranks' JOINs at once while a thousand
//!   rank listeners share the process). Each ticket records which it was, so the tickets of
//!   the process never exceed the room (as far as the count of other descriptors is fresh: the
//!   reserve absorbs the difference). A listener with neither left, or at its owner's own
//!   bound, sheds one of its own unauthenticated connections for each newcomer: its owner
//!   chooses which ([`Shedding`]: refused ones first, then the oldest of those that have not
//!   said anything valid, and only when there are none of those the oldest of the rest).
//! - **Accepting never starves the handshakes.** A listener accepts at most [`ACCEPT_BATCH`]
//!   connections per turn of its owner's loop ([`Intake::accept_batch`]), and its owner serves
//!   the handshakes that have bytes waiting before the listener in each turn. A handshake is
//!   shed only once it is [`SHED_GRACE`] old (a refused one lingering at once): a listener
//!   whose connections are all younger stops accepting until the oldest is of age, and the
//!   newcomers wait in the kernel's accept queue, which is first come, first served. Before,
//!   the listener accepted until its queue was empty, shedding one connection for each: a
//!   flood that reopened every shed connection at once refilled the queue as fast as it was
//!   emptied, so one call accepted thousands of connections for seconds while no handshake was
//!   read, and a real peer's connection, accepted in that call, was shed before its `HELLO`
//!   was read (a job under 1,200 reopened connections failed to form in a third of the runs
//!   on a loaded 2-core machine). Now a real peer whose connection reaches the front of the
//!   queue is accepted and has its `HELLO` read within [`SHED_GRACE`] (a turn, unless its own
//!   thread is not scheduled for that long), after which it is past every stranger in the
//!   shedding order; it waits in the queue at most (connections queued ahead of it) ×
//!   [`SHED_GRACE`] / (places of the listener), and retries only a handshake cut anyway.
//! - **Accept failures** (out of descriptors, of buffers or of memory): the listener is left
//!   out of `poll` for [`ACCEPT_BACKOFF`] instead of waking its thread again at once; the
//!   warnings, like every refusal's, are rate-limited ([`Notes`]).
//!
//! Shared words, all atomics of the process-wide ledger or of one listener: `held`
//! (unauthenticated connections held by every listener of the process), `borrowed` (those of
//! them taken from the pool), `listeners` (listeners open) and each listener's own count of
//! held connections are written by whichever thread makes or drops a [`Ticket`] or an
//! [`Intake`] (`borrowed` is raised only below the pool's size, by a compare-and-swap loop); `others` and `limit` (the last count of
//! other descriptors, the soft limit) are written by the one thread that wins `recounting` when
//! they are older than [`RECOUNT`], and stamped with `counted_at` (`Release`, read with
//! `Acquire`, so a reader that sees the stamp sees the count); every other access is `Relaxed`:
//! these words size a budget, nothing else is published through them. No lock: a thousand
//! listeners' threads accepting at once never wait for each other (a mutex held across a
//! count of `/proc/self/fd` made a convoy of them under load).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

use super::os;
use crate::socket::{deadline_in, remaining};

/// Accept backlog of every listener of the library.
pub(crate) const BACKLOG: i32 = 4096;
/// How long a listener whose `accept` failed (out of descriptors, …) is left out of `poll`.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Fewest unauthenticated connections guaranteed to each listener, whatever the budget says
/// (a real peer needs a slot to prove itself).
pub(crate) const MIN_SHARE: usize = 4;
/// Most connections a listener accepts in one turn of its owner's loop (module docs).
pub(crate) const ACCEPT_BATCH: usize = 64;
/// How long an accepted connection is kept before it may be shed (module docs): enough for a
/// real peer's `HELLO`, sent as soon as it connected, to be read on a loaded machine.
pub(crate) const SHED_GRACE: Duration = Duration::from_millis(250);
/// How long a count of the process's other descriptors is used before it is made again.
pub(crate) const RECOUNT: Duration = Duration::from_millis(100);
/// Refusals and accept failures logged as warnings before the rest go to the debug level
/// (every hundredth is still a warning): a flood of strangers must not flood the log.
const LOUD: u64 = 8;

/// The descriptors kept for the library's own work out of a soft limit of `limit`: an eighth,
/// at least 64 and at most 4096.
pub(crate) fn reserve(limit: usize) -> usize {
    (limit / 8).clamp(64, 4096)
}

/// The process's descriptors as the listeners see them (module docs).
struct Ledger {
    held: AtomicUsize,
    borrowed: AtomicUsize,
    listeners: AtomicUsize,
    /// Descriptors open besides unauthenticated connections, at the last count.
    others: AtomicUsize,
    /// The soft limit, at the last count.
    limit: AtomicUsize,
    /// When the last count was made (ms since [`epoch`], at least 1); 0 before the first.
    counted_at: AtomicU64,
    recounting: AtomicBool,
}

static LEDGER: Ledger = Ledger {
    held: AtomicUsize::new(0),
    borrowed: AtomicUsize::new(0),
    listeners: AtomicUsize::new(0),
    others: AtomicUsize::new(0),
    limit: AtomicUsize::new(0),
    counted_at: AtomicU64::new(0),
    recounting: AtomicBool::new(false),
};

/// The instant the ledger's stamps count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Descriptors open in this process, if `/proc/self/fd` can be read (the directory's own
/// descriptor, open while it is read, not counted).
fn open_descriptors() -> Option<usize> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count();
    Some(n.saturating_sub(1))
}

/// Counts the other descriptors and reads the limit, and stamps the count.
fn recount() {
    let limit = os::nofile_limit().map_or(1024, |(soft, _)| {
        usize::try_from(soft).unwrap_or(usize::MAX)
    });
    let held = LEDGER.held.load(Ordering::Relaxed);
    let others = open_descriptors().map_or(0, |open| open.saturating_sub(held));
    LEDGER.others.store(others, Ordering::Relaxed);
    LEDGER.limit.store(limit, Ordering::Relaxed);
    LEDGER.counted_at.store(now_ms(), Ordering::Release);
}

/// (other descriptors, soft limit): the last count, made again by this thread if it is stale
/// and no other thread is at it (module docs).
fn counted() -> (usize, usize) {
    let at = LEDGER.counted_at.load(Ordering::Acquire);
    let stale = at == 0 || now_ms().saturating_sub(at) >= RECOUNT.as_millis() as u64;
    if stale && !LEDGER.recounting.swap(true, Ordering::AcqRel) {
        recount();
        LEDGER.recounting.store(false, Ordering::Release);
    } else if at == 0 {
        // Another thread makes the first count: make one too rather than guess.
        recount();
    }
    (
        LEDGER.others.load(Ordering::Relaxed),
        LEDGER.limit.load(Ordering::Relaxed),
    )
}

/// The budget now: (each listener's guarantee, the pool's size) (module docs).
pub(crate) fn budget() -> (usize, usize) {
    let (others, limit) = counted();
    let room = limit.saturating_sub(reserve(limit)).saturating_sub(others);
    let pool = room / 2;
    let each = (room - pool) / LEDGER.listeners.load(Ordering::Relaxed).max(1);
    (each.max(MIN_SHARE), pool)
}

/// Takes one place from the pool if there is one left.
fn borrow(pool: usize) -> bool {
    LEDGER
        .borrowed
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            (b < pool).then_some(b + 1)
        })
        .is_ok()
}

/// Unauthenticated connections held by every listener of the process.
#[cfg(test)]
fn held_in_process() -> usize {
    LEDGER.held.load(Ordering::Relaxed)
}

fn raise_limit_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| match os::raise_nofile_limit() {
        Ok(Some((from, to))) => {
            tracing::debug!("raised the soft descriptor limit from {from} to {to} (the hard limit)")
        }
        Ok(None) => tracing::debug!("the soft descriptor limit is already the hard limit"),
        Err(e) => tracing::debug!("keeping the soft descriptor limit: {e}"),
    });
}

/// One unauthenticated connection's place in the process's budget (its listener's guarantee,
/// or the pool: `borrowed`); given back when dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    mine: Arc<AtomicUsize>,
    borrowed: bool,
}

impl Ticket {
    /// A ticket whose place the caller has secured (a pool place already counted when
    /// `borrowed`).
    fn new(mine: &Arc<AtomicUsize>, borrowed: bool) -> Self {
        mine.fetch_add(1, Ordering::Relaxed);
        LEDGER.held.fetch_add(1, Ordering::Relaxed);
        Self {
            mine: Arc::clone(mine),
            borrowed,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.mine.fetch_sub(1, Ordering::Relaxed);
        LEDGER.held.fetch_sub(1, Ordering::Relaxed);
        if self.borrowed {
            LEDGER.borrowed.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Rate-limited log lines of one listener: refused connections and failed accepts, the
/// first [`LOUD`] of each as warnings, then every hundredth (the rest at the debug level).
#[derive(Debug)]
pub(crate) struct Notes {
    label: String,
    refusals: u64,
    failures: u64,
}

impl Notes {
    /// Logs a refused (or shed, or dropped) connection.
    pub fn refused(&mut self, addr: SocketAddr, why: &str) {
        self.refusals += 1;
        let n = self.refusals;
        let label = &self.label;
        if loud(n) {
            tracing::warn!(
                "{label}: refused the connection from {addr}: {why} ({n} refused so far)"
            );
        } else {
            tracing::debug!("{label}: refused the connection from {addr}: {why}");
        }
    }

    fn accept_failed(&mut self, e: &io::Error) {
        self.failures += 1;
        let n = self.failures;
        let label = &self.label;
        if loud(n) {
            tracing::warn!(
                "{label}: accept failed: {e}; not accepting for {ACCEPT_BACKOFF:?} ({n} failures so far)"
            );
        } else {
            tracing::debug!("{label}: accept failed: {e}");
        }
    }
}

fn loud(n: u64) -> bool {
    n <= LOUD || n.is_multiple_of(100)
}

/// The unauthenticated connections a listener's owner holds, as far as shedding goes (module
/// docs): which one goes next, and when it may.
pub(crate) trait Shedding {
    /// When the connection the owner would shed next may be shed: at once (now) for a refused
    /// one lingering, else `grace` after it was accepted; `None` when it holds none. The
    /// owner's order: refused ones, then the oldest without a valid `HELLO`, and only when
    /// there is none of those, the oldest of the rest.
    fn next_shed(&self, grace: Duration) -> Option<Instant>;
    /// Closes that connection (a handshake is told it was shed, so its connector tries
    /// again), noting it in `notes`.
    fn shed(&mut self, notes: &mut Notes);
}

/// A listener under the intake rules (module docs). The owner runs the handshakes: it asks
/// [`accept_batch`](Self::accept_batch) for connections with their tickets, which sheds the
/// owner's connections ([`Shedding`]) while there is no ticket.
#[derive(Debug)]
pub(crate) struct Intake {
    listener: Option<TcpListener>,
    mine: Arc<AtomicUsize>,
    /// The owner's own bound on what this listener holds.
    max: usize,
    paused_until: Option<Instant>,
    /// How old a held connection must be to be shed ([`SHED_GRACE`]; tests change it).
    grace: Duration,
    notes: Notes,
}

impl Intake {
    /// Serves `listener` (made non-blocking here, its backlog raised) under the rules, holding
    /// at most `max` unauthenticated connections; `label` starts its log lines.
    pub fn new(listener: TcpListener, max: usize, label: String) -> io::Result<Self> {
        raise_limit_once();
        listener.set_nonblocking(true)?;
        if let Err(e) = os::set_backlog(&listener, BACKLOG) {
            tracing::debug!("{label}: keeping the default backlog: {e}");
        }
        LEDGER.listeners.fetch_add(1, Ordering::Relaxed);
        Ok(Self {
            listener: Some(listener),
            mine: Arc::new(AtomicUsize::new(0)),
            max: max.max(MIN_SHARE),
            paused_until: None,
            grace: SHED_GRACE,
            notes: Notes {
                label,
                refusals: 0,
                failures: 0,
            },
        })
    }

    /// Stops accepting: closes the listener (connections already held stay).
    pub fn close(&mut self) {
        if self.listener.take().is_some() {
            LEDGER.listeners.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The listener's poll entry, unless it is closed or backing off after a failed accept.
    pub fn poll_fd(&self) -> Option<libc::pollfd> {
        if self.paused_until.is_some_and(|t| remaining(t).is_some()) {
            return None;
        }
        self.listener.as_ref().map(os::pollin)
    }

    /// When a backing-off listener wants to be polled again.
    pub fn wake_at(&self) -> Option<Instant> {
        self.paused_until.filter(|t| remaining(*t).is_some())
    }

    /// The next connection waiting to be accepted: `None` when there is none, when the
    /// listener is closed or backing off, or when `accept` failed (then it backs off for
    /// [`ACCEPT_BACKOFF`]).
    fn next(&mut self) -> Option<(TcpStream, SocketAddr)> {
        self.poll_fd()?;
        self.paused_until = None;
        let listener = self.listener.as_ref()?;
        loop {
            match listener.accept() {
                Ok((stream, addr)) => {
                    // Handshakes read with MSG_DONTWAIT and write with deadlines: the socket
                    // itself stays blocking.
                    if stream.set_nonblocking(false).is_err() {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    return Some((stream, addr));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // That one connection is gone before it was accepted: the next.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) => {
                    // EMFILE, ENFILE, ENOBUFS, ENOMEM, …: the connection stays queued and the
                    // listener readable; polling it again at once would spin.
                    self.paused_until = Some(deadline_in(ACCEPT_BACKOFF));
                    self.notes.accept_failed(&e);
                    return None;
                }
            }
        }
    }

    /// A ticket for one more connection: within this listener's guarantee, else from the
    /// pool; `None` when neither has a place, or at the owner's bound (the owner sheds one of
    /// its connections and asks again). A listener holding fewer than [`MIN_SHARE`] never
    /// looks at the process's ledger.
    fn take(&self) -> Option<Ticket> {
        let held = self.held();
        if held >= self.max {
            return None;
        }
        if held < MIN_SHARE {
            return Some(Ticket::new(&self.mine, false));
        }
        let (each, pool) = budget();
        if held < each {
            Some(Ticket::new(&self.mine, false))
        } else if borrow(pool) {
            Some(Ticket::new(&self.mine, true))
        } else {
            None
        }
    }

    /// Accepts the connections waiting, each with a ticket, at most [`ACCEPT_BATCH`] (the
    /// owner serves its handshakes before it calls this again): while there is no ticket, the
    /// owner's next connection to shed is shed if it is of age ([`Shedding`]); if it is not,
    /// the listener is left out of `poll` until it is and the newcomers stay in the kernel's
    /// queue. `None` from [`next`](Self::next) (nothing waiting, closed, backing off) ends the
    /// batch too.
    pub fn accept_batch(
        &mut self,
        held: &mut dyn Shedding,
    ) -> Vec<(TcpStream, SocketAddr, Ticket)> {
        let grace = self.grace;
        let ripe =
            |held: &dyn Shedding| held.next_shed(grace).is_some_and(|at| at <= Instant::now());
        let mut out = Vec::new();
        while out.len() < ACCEPT_BATCH {
            let ticket = self.take();
            if ticket.is_none() && !ripe(held) {
                // Everything held is too young to shed: later, in accept order.
                let now = Instant::now();
                let at = held.next_shed(grace).unwrap_or(now + grace);
                self.paused_until = Some(at.max(now + Duration::from_millis(1)));
                break;
            }
            let Some((stream, addr)) = self.next() else {
                break;
            };
            let ticket = ticket.or_else(|| {
                loop {
                    if !ripe(held) {
                        break None;
                    }
                    held.shed(&mut self.notes);
                    if let Some(t) = self.take() {
                        break Some(t);
                    }
                }
            });
            match ticket {
                Some(t) => out.push((stream, addr, t)),
                // Another listener took the pool's place this one made (rare): the newcomer
                // is closed, and its connector tries again.
                None => self.turn_away(stream, addr),
            }
        }
        out
    }

    /// A ticket whatever the budget (a connection already admitted, refused after all).
    pub fn ticket(&self) -> Ticket {
        Ticket::new(&self.mine, false)
    }

    /// Unauthenticated connections this listener holds.
    pub fn held(&self) -> usize {
        self.mine.load(Ordering::Relaxed)
    }

    /// Closes a newcomer for which the owner had nothing to shed.
    fn turn_away(&mut self, stream: TcpStream, addr: SocketAddr) {
        drop(stream);
        self.notes.refused(
            addr,
            "no room: the process's descriptor budget has no place left for this listener",
        );
    }

    /// Changes how old a connection must be to be shed, and polls the listener again at once
    /// (tests).
    #[cfg(test)]
    pub fn set_grace(&mut self, grace: Duration) {
        self.grace = grace;
        self.paused_until = None;
    }

    /// Lowers the owner's bound (tests: a small listener fills quickly).
    #[cfg(test)]
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The listener's rate-limited log (refusals of the owner's handshakes go here too).
    pub fn notes(&mut self) -> &mut Notes {
        &mut self.notes
    }
}

impl Drop for Intake {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_an_eighth_within_bounds() {
        assert_eq!(reserve(256), 64);
        assert_eq!(reserve(1024), 128);
        assert_eq!(reserve(8192), 1024);
        assert_eq!(reserve(1 << 20), 4096);
    }

    #[test]
    fn tickets_count_per_listener_and_per_process_and_are_given_back() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let intake = Intake::new(l, 3, "test".into()).unwrap();
        assert!(
            intake.max >= MIN_SHARE,
            "the bound is at least the minimum guarantee"
        );
        let before = held_in_process();
        let a = intake.take().unwrap();
        let b = intake.ticket();
        assert_eq!(intake.held(), 2);
        assert!(held_in_process() >= before + 2);
        drop(a);
        assert_eq!(intake.held(), 1);
        drop(b);
        assert_eq!(intake.held(), 0);
        let (each, pool) = budget();
        assert!(each >= MIN_SHARE && pool > 0, "{each} {pool}");
    }

    #[test]
    fn a_listener_at_its_bound_gets_no_ticket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let intake = Intake::new(l, MIN_SHARE, "test".into()).unwrap();
        let tickets: Vec<Ticket> = (0..MIN_SHARE).map(|_| intake.take().unwrap()).collect();
        assert!(intake.take().is_none());
        drop(tickets);
        assert!(intake.take().is_some());
    }

    #[test]
    fn beyond_its_guarantee_a_listener_borrows_from_the_pool_and_gives_back() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut intake = Intake::new(l, usize::MAX, "test".into()).unwrap();
        let (each, _) = budget();
        let mine: Vec<Ticket> = (0..each + 3).map(|_| intake.take().unwrap()).collect();
        let borrowed = mine.iter().filter(|t| t.borrowed).count();
        // Other tests of this binary may hold some meanwhile: at least the three beyond.
        assert!(borrowed >= 3, "{borrowed} of {} borrowed", mine.len());
        assert!(LEDGER.borrowed.load(Ordering::Relaxed) >= borrowed);
        drop(mine);
        intake.set_max(1);
        assert!(intake.take().is_some());
    }
}
