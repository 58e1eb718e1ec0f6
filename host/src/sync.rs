//! Poison-tolerant locking: the one place the workspace (this crate, the library above it, the
//! drop-in NCCL library, the tools) turns a poisoned `Mutex`, `RwLock` or `Condvar` wait into
//! its guard.
//!
//! No library code panics while holding a lock, but a user callback (a proxy handler, a log
//! handler, a rank's body) or a test thread may. A poisoned lock still protects consistent data
//! there (every critical section leaves it consistent before anything that can panic), so
//! taking the guard is right, and it keeps `Drop` paths panic-free whatever happened elsewhere.
//!
//! Every lock taken through [`lock`], [`read`] or [`write`] is counted per thread
//! ([`locks_taken`]: a thread-local counter, written and read by its own thread only), so a
//! test can see how many locks a call takes (the drop-in's hot path: at most one). The CPU
//! backend's streams and events, which stand for the GPU driver's queue (a launch on a GPU
//! takes none of our locks), lock through [`lock_uncounted`].

use std::cell::Cell;
use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use std::time::Duration;

thread_local! {
    static TAKEN: Cell<u64> = const { Cell::new(0) };
}

fn taken() {
    // A thread being torn down has no counter left: nothing to count.
    let _ = TAKEN.try_with(|t| t.set(t.get().wrapping_add(1)));
}

/// How many locks the calling thread has taken through this module so far (module docs).
pub fn locks_taken() -> u64 {
    TAKEN.try_with(Cell::get).unwrap_or(0)
}

/// Locks `m`, taking the data even if a panicking thread poisoned it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    taken();
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] without counting it (module docs: the CPU backend's stand-ins for the driver).
pub fn lock_uncounted<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `l`, poison-tolerant.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    taken();
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `l`, poison-tolerant.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    taken();
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard`, poison-tolerant.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard` for at most `timeout`, poison-tolerant (whether it timed out is
/// for the caller to find out from the guarded state and its own clock).
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, timeout) {
        Ok((g, _)) => g,
        Err(p) => p.into_inner().0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_lock_still_yields_its_data() {
        let m = Arc::new(Mutex::new(5));
        let l = Arc::new(RwLock::new(7));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            let _w = l2.write().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 6);
        assert_eq!(*read(&l), 7);
        *write(&l) = 8;
        assert_eq!(*read(&l), 8);
        let cv = Condvar::new();
        let g = wait_timeout(&cv, lock(&m), Duration::from_millis(1));
        assert_eq!(*g, 6);
    }
}
