//! `Backoff`: how host threads wait for a word another agent writes — a few pure spins, then
//! `yield_now`, then short sleeps (the idea of crossbeam-utils' `Backoff`, with a sleep stage,
//! because the CPU backend runs hundreds of emulated GPU threads on a few cores and a spinning
//! proxy would starve the very threads it waits for).
//!
//! | stage | steps | each step |
//! |---|---|---|
//! | spin | `0 .. SPIN_LIMIT` | [`std::hint::spin_loop`] |
//! | yield | `SPIN_LIMIT .. YIELD_LIMIT` | [`std::thread::yield_now`] |
//! | sleep | `YIELD_LIMIT ..` | [`std::thread::sleep`] for [`SLEEP`](Backoff::SLEEP) |
//!
//! A `Backoff` only paces a loop; it never ends one. Every loop that uses it has its own
//! deadline or stop flag.
//!
//! ```
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::time::{Duration, Instant};
//! use mscclpp_host::backoff::Backoff;
//!
//! let ready = AtomicBool::new(false);
//! std::thread::scope(|s| {
//!     s.spawn(|| ready.store(true, Ordering::Release));
//!     let deadline = Instant::now() + Duration::from_secs(10);
//!     let mut backoff = Backoff::new();
//!     while !ready.load(Ordering::Acquire) {
//!         assert!(Instant::now() < deadline, "never became ready");
//!         backoff.snooze();
//!     }
//! });
//! ```

use std::time::Duration;

/// Paces a polling loop: spin, then yield, then sleep (module docs).
///
/// ```
/// use mscclpp_host::backoff::Backoff;
///
/// let mut b = Backoff::new();
/// for _ in 0..Backoff::SPIN_LIMIT {
///     b.snooze(); // pure spins: no system call
/// }
/// assert!(!b.is_sleeping());
/// for _ in Backoff::SPIN_LIMIT..Backoff::YIELD_LIMIT {
///     b.snooze(); // yields
/// }
/// assert!(b.is_sleeping()); // from now on each snooze sleeps `Backoff::SLEEP`
/// b.reset(); // work arrived: spin again
/// assert!(!b.is_sleeping());
/// ```
#[derive(Debug, Default, Clone)]
pub struct Backoff {
    step: u32,
}

impl Backoff {
    /// Steps that only spin ([`std::hint::spin_loop`]).
    pub const SPIN_LIMIT: u32 = 64;
    /// Steps before sleeping: from [`SPIN_LIMIT`](Self::SPIN_LIMIT) up to this, each step
    /// yields the thread.
    pub const YIELD_LIMIT: u32 = 256;
    /// How long each step of the sleep stage sleeps.
    pub const SLEEP: Duration = Duration::from_micros(20);

    /// A backoff at its first (spinning) step.
    pub const fn new() -> Self {
        Self { step: 0 }
    }

    /// Waits a little, longer as the steps go by (module docs).
    pub fn snooze(&mut self) {
        if self.step < Self::SPIN_LIMIT {
            std::hint::spin_loop();
        } else if self.step < Self::YIELD_LIMIT {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Self::SLEEP);
        }
        self.step = self.step.saturating_add(1);
    }

    /// Whether the next [`snooze`](Self::snooze) sleeps (the waited-for word is slow to come:
    /// a caller may check other things between snoozes).
    pub fn is_sleeping(&self) -> bool {
        self.step >= Self::YIELD_LIMIT
    }

    /// Work arrived: spin again next time.
    pub fn reset(&mut self) {
        self.step = 0;
    }
}
