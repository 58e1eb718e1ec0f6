//! Keepalives: one thread per process (`mscclpp-beat`) writes a keepalive frame
//! ([`wire::CHANNEL_KEEPALIVE`](super::super::wire::CHANNEL_KEEPALIVE)) on every link of every
//! bootstrap of the process that has a peer timeout, each bootstrap's links a quarter of its
//! timeout apart. The peers' I/O threads count any bytes as a sign of life and cut a link that
//! carried nothing for the whole timeout (`reactor.rs`), so a rank whose process stopped
//! (SIGSTOP, a debugger, a hung host) is found, while a rank whose program is busy or blocked
//! is not: this thread runs whatever the program does.
//!
//! A keepalive never waits for a writer or for room: a link whose writer lock is held (a frame
//! is being written, which the peer hears anyway) or whose socket cannot take the frame now
//! (the peer has not read what came before; it hears those bytes when it does) is skipped
//! this time. Only the rest of a keepalive written in part is waited for, at most
//! [`WRITE_TIMEOUT`]; failing then breaks the link as any failed send does (its stream would
//! no longer be framed). So a busy, slow reader is never cut for a keepalive.
//!
//! Shared state: the table of bootstraps to beat for (a mutex and a condition variable: written
//! by [`start`] and read by the thread, which also drops the entries whose bootstrap is gone or
//! stopped), and each entry's stop flag (release by [`Beating`]'s drop, acquire by the
//! thread). The thread ends when the table is empty; the next [`start`] starts another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::links::Links;
use crate::socket::deadline_in;
use crate::sync::{lock, wait_timeout};

/// Longest the rest of a keepalive written in part may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Shortest time between two turns of the thread.
const MIN_TURN: Duration = Duration::from_millis(5);

struct Entry {
    links: Weak<Links>,
    every: Duration,
    next: Instant,
    stop: Arc<AtomicBool>,
}

struct Table {
    entries: Vec<Entry>,
    running: bool,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    entries: Vec::new(),
    running: false,
});
static WAKE: Condvar = Condvar::new();

/// Keepalives being written for one bootstrap; stopped when dropped.
pub(super) struct Beating {
    stop: Arc<AtomicBool>,
}

impl Drop for Beating {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Starts writing keepalives on `links` every `timeout / 4` (at least [`MIN_TURN`]).
pub(super) fn start(links: &Arc<Links>, timeout: Duration) -> Beating {
    let stop = Arc::new(AtomicBool::new(false));
    let every = (timeout / 4).max(MIN_TURN);
    let mut t = lock(&TABLE);
    t.entries.push(Entry {
        links: Arc::downgrade(links),
        every,
        next: Instant::now() + every,
        stop: Arc::clone(&stop),
    });
    if !t.running {
        let spawned = thread::Builder::new()
            .name("mscclpp-beat".into())
            .stack_size(64 << 10)
            .spawn(run);
        match spawned {
            Ok(_) => t.running = true,
            Err(e) => tracing::warn!(
                "bootstrap: no thread for keepalives ({e}); peers may take this process for \
                 stopped after their peer timeout"
            ),
        }
    }
    WAKE.notify_all();
    Beating { stop }
}

/// The thread (module docs).
fn run() {
    let mut t = lock(&TABLE);
    loop {
        t.entries
            .retain(|e| !e.stop.load(Ordering::Acquire) && e.links.strong_count() > 0);
        if t.entries.is_empty() {
            t.running = false;
            return;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        for e in t.entries.iter_mut().filter(|e| e.next <= now) {
            e.next = now + e.every;
            if let Some(l) = e.links.upgrade() {
                due.push(l);
            }
        }
        let next = t.entries.iter().map(|e| e.next).min().unwrap_or(now);
        drop(t);
        for links in due {
            let deadline = deadline_in(WRITE_TIMEOUT);
            for c in links.all() {
                c.beat(deadline);
            }
        }
        t = lock(&TABLE);
        let wait = next.saturating_duration_since(Instant::now()).max(MIN_TURN);
        t = wait_timeout(&WAKE, t, wait);
    }
}
