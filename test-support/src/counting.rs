//! A bootstrap that counts the messages a rank's program sends: the registered-buffer and
//! split tests check that a call costs no bootstrap message (or exactly the ones it should).
//!
//! [`Sends`] is one counter shared (`Arc<AtomicU64>`, sequentially consistent) between the
//! [`Counting`] bootstrap, which adds to it on the thread that made it (the rank's own
//! thread), and the test, which reads it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mscclpp_host::Result;
use mscclpp_host::bootstrap::{Bootstrap, Watch};

/// How many messages a rank's program has sent through its bootstrap (every `send` and
/// collective made on the thread that made the [`Counting`] bootstrap: the rank's own thread;
/// the registration service's answers to other ranks' registrations, on its own thread, are
/// not the rank's calls).
#[derive(Clone, Default)]
pub struct Sends(Arc<AtomicU64>);

impl Sends {
    /// Messages sent so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A bootstrap that counts what it sends and otherwise is `inner`.
pub struct Counting {
    inner: Arc<dyn Bootstrap>,
    sends: Sends,
    thread: std::thread::ThreadId,
}

impl Counting {
    /// `inner`, counted in `sends` when sent from the calling thread.
    pub fn new(inner: Arc<dyn Bootstrap>, sends: Sends) -> Self {
        Self {
            inner,
            sends,
            thread: std::thread::current().id(),
        }
    }

    fn count(&self) {
        if std::thread::current().id() == self.thread {
            self.sends.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Bootstrap for Counting {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn ranks_per_node(&self) -> usize {
        self.inner.ranks_per_node()
    }
    fn node_of(&self, rank: usize) -> Option<usize> {
        self.inner.node_of(rank)
    }
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.count();
        self.inner.send(peer, tag, data)
    }
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        self.inner.recv_watched(peer, tag, timeout, watch)
    }
    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        self.count();
        self.inner.barrier_watched(watch)
    }
    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        self.count();
        self.inner.all_gather_watched(data, watch)
    }
    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        self.count();
        self.inner.broadcast_watched(root, data, watch)
    }
    fn op_timeout(&self) -> Duration {
        self.inner.op_timeout()
    }
    fn dead_peer(&self) -> Option<(usize, String)> {
        self.inner.dead_peer()
    }
    fn left_peer(&self) -> Option<(usize, Duration)> {
        self.inner.left_peer()
    }
    fn forgo_goodbye(&self) {
        self.inner.forgo_goodbye()
    }
}
