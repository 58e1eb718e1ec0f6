//! The poison-tolerant lock, the one this crate uses (a panic of another call was already
//! reported as an internal error; the data under these locks stays consistent at every point a
//! call can panic).

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poison.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
