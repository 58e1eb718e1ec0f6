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
//!   [`RECOUNT`]); the rest is shared equally between the listeners alive in the process (at
//!   least [`MIN_SHARE`] each, at most the owner's own bound). A listener at its share sheds
//!   one of its own unauthenticated connections for each newcomer: its owner chooses which
//!   (the oldest first: refused ones, then those that have not said anything valid, then the
//!   rest); a listener with nothing left to shed closes the newcomer. A real peer finishes its
//!   handshake in a few round trips, and retries one that was cut.
//! - **Accept failures** (out of descriptors, of buffers or of memory): the listener is left
//!   out of `poll` for [`ACCEPT_BACKOFF`] instead of waking its thread again at once; the
//!   warnings, like every refusal's, are rate-limited ([`Notes`]).
//!
//! Shared words: the process-wide ledger's `held` (unauthenticated connections held by every
//! listener of the process) and `listeners` (listeners open), and each listener's own count of
//! held connections, are atomics written by whichever thread makes or drops a [`Ticket`] or an
//! [`Intake`] and read by the threads that size a share (`Relaxed`: they size a budget; nothing
//! is published through them). The count of other descriptors and the limit sit behind one
//! mutex, recounted by whichever thread finds them stale.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use super::os;
use crate::socket::{deadline_in, remaining};
use crate::sync::lock;

/// Accept backlog of every listener of the library.
pub(crate) const BACKLOG: i32 = 4096;
/// How long a listener whose `accept` failed (out of descriptors, …) is left out of `poll`.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Fewest unauthenticated connections a listener may hold, whatever the budget says (a real
/// peer needs a slot to prove itself).
pub(crate) const MIN_SHARE: usize = 4;
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
    listeners: AtomicUsize,
    counted: Mutex<Option<Counted>>,
}

#[derive(Clone, Copy, Debug)]
struct Counted {
    at: Instant,
    /// Descriptors open besides unauthenticated connections.
    others: usize,
    /// The soft limit.
    limit: usize,
}

static LEDGER: Ledger = Ledger {
    held: AtomicUsize::new(0),
    listeners: AtomicUsize::new(0),
    counted: Mutex::new(None),
};

/// Descriptors open in this process, if `/proc/self/fd` can be read (the directory's own
/// descriptor, open while it is read, not counted).
fn open_descriptors() -> Option<usize> {
    let n = std::fs::read_dir("/proc/self/fd").ok()?.count();
    Some(n.saturating_sub(1))
}

fn counted() -> Counted {
    let mut c = lock(&LEDGER.counted);
    if let Some(k) = *c
        && k.at.elapsed() < RECOUNT
    {
        return k;
    }
    let limit = os::nofile_limit().map_or(1024, |(soft, _)| {
        usize::try_from(soft).unwrap_or(usize::MAX)
    });
    let held = LEDGER.held.load(Ordering::Relaxed);
    let others = open_descriptors().map_or(0, |open| open.saturating_sub(held));
    let k = Counted {
        at: Instant::now(),
        others,
        limit,
    };
    *c = Some(k);
    k
}

/// How many unauthenticated connections each listener of the process may hold now.
pub(crate) fn share() -> usize {
    let k = counted();
    let room = k
        .limit
        .saturating_sub(reserve(k.limit))
        .saturating_sub(k.others);
    (room / LEDGER.listeners.load(Ordering::Relaxed).max(1)).max(MIN_SHARE)
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

/// One unauthenticated connection's place in its listener's share and in the process's
/// budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    mine: Arc<AtomicUsize>,
}

impl Ticket {
    fn new(mine: &Arc<AtomicUsize>) -> Self {
        mine.fetch_add(1, Ordering::Relaxed);
        LEDGER.held.fetch_add(1, Ordering::Relaxed);
        Self {
            mine: Arc::clone(mine),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.mine.fetch_sub(1, Ordering::Relaxed);
        LEDGER.held.fetch_sub(1, Ordering::Relaxed);
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

/// A listener under the intake rules (module docs). The owner runs the handshakes: it asks
/// [`next`](Self::next) for connections, sheds its own while [`full`](Self::full), and gives
/// each connection it keeps a [`ticket`](Self::ticket).
#[derive(Debug)]
pub(crate) struct Intake {
    listener: Option<TcpListener>,
    mine: Arc<AtomicUsize>,
    /// The owner's own bound on what this listener holds.
    max: usize,
    paused_until: Option<Instant>,
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
    pub fn next(&mut self) -> Option<(TcpStream, SocketAddr)> {
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

    /// Whether this listener holds its share (or its owner's bound): the owner must shed one
    /// of its connections before it keeps another.
    pub fn full(&self) -> bool {
        self.held() >= share().min(self.max)
    }

    /// Unauthenticated connections this listener holds.
    pub fn held(&self) -> usize {
        self.mine.load(Ordering::Relaxed)
    }

    /// A ticket for a connection the owner keeps.
    pub fn ticket(&self) -> Ticket {
        Ticket::new(&self.mine)
    }

    /// Closes a newcomer for which the owner had nothing to shed.
    pub fn turn_away(&mut self, stream: TcpStream, addr: SocketAddr) {
        drop(stream);
        self.notes.refused(
            addr,
            "no room: this listener's share of the process's descriptors is taken",
        );
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
            "the bound is at least the minimum share"
        );
        let before = held_in_process();
        let a = intake.ticket();
        let b = intake.ticket();
        assert_eq!(intake.held(), 2);
        assert!(held_in_process() >= before + 2);
        drop(a);
        assert_eq!(intake.held(), 1);
        drop(b);
        assert_eq!(intake.held(), 0);
        assert!(share() >= MIN_SHARE);
    }

    #[test]
    fn a_full_listener_is_reported_full_at_its_bound() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let intake = Intake::new(l, MIN_SHARE, "test".into()).unwrap();
        let tickets: Vec<Ticket> = (0..MIN_SHARE).map(|_| intake.ticket()).collect();
        assert!(intake.full());
        drop(tickets);
        assert!(!intake.full());
    }
}
