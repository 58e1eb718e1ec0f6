//! [`Decorator`]: a bootstrap that wraps another and changes only some of its operations.
//!
//! A wrapper (a communicator's watched bootstrap, a node group bound to its world, a test's
//! fault injector or message counter) implements [`Decorator`]: it names the bootstrap it wraps
//! ([`Decorator::inner`]) and overrides the operations it changes; every other operation is
//! the inner bootstrap's. Every `Decorator` is a [`Bootstrap`] (a blanket implementation calls
//! the decorator's methods), so a wrapper is handed out as `Arc<dyn Bootstrap>` like any other.
//!
//! The plain waits of [`Bootstrap`] (`recv`, `barrier`, `all_gather`, `broadcast`) are the
//! trait's provided ones over the *decorator's* watched waits: a wrapper that overrides a
//! watched wait changes the plain one too, as the trait's docs promise.
//!
//! A type that implements `Decorator` has each operation twice, once per trait; where both
//! traits are imported, call them through the inner bootstrap (`self.inner().rank()`) or by
//! path (`Bootstrap::rank(&x)`).

use std::time::Duration;

use super::{Bootstrap, SetupPhase, Watch};
use crate::auth::Secret;
use crate::error::Result;

/// A [`Bootstrap`] over another one: every operation defaults to the inner bootstrap's; a
/// wrapper overrides what it changes (module docs).
pub trait Decorator: Send + Sync {
    /// The bootstrap wrapped.
    fn inner(&self) -> &dyn Bootstrap;

    /// [`Bootstrap::rank`].
    fn rank(&self) -> usize {
        self.inner().rank()
    }
    /// [`Bootstrap::size`].
    fn size(&self) -> usize {
        self.inner().size()
    }
    /// [`Bootstrap::local_rank`].
    fn local_rank(&self) -> usize {
        self.inner().local_rank()
    }
    /// [`Bootstrap::ranks_per_node`].
    fn ranks_per_node(&self) -> usize {
        self.inner().ranks_per_node()
    }
    /// [`Bootstrap::node_of`].
    fn node_of(&self, rank: usize) -> Option<usize> {
        self.inner().node_of(rank)
    }
    /// [`Bootstrap::send`].
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.inner().send(peer, tag, data)
    }
    /// [`Bootstrap::recv_watched`].
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        self.inner().recv_watched(peer, tag, timeout, watch)
    }
    /// [`Bootstrap::recv_any`].
    fn recv_any(&self, peers: &[usize], tag: u64, timeout: Duration) -> Result<(usize, Vec<u8>)> {
        self.inner().recv_any(peers, tag, timeout)
    }
    /// [`Bootstrap::barrier_watched`].
    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        self.inner().barrier_watched(watch)
    }
    /// [`Bootstrap::all_gather_watched`].
    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        self.inner().all_gather_watched(data, watch)
    }
    /// [`Bootstrap::broadcast_watched`].
    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        self.inner().broadcast_watched(root, data, watch)
    }
    /// [`Bootstrap::op_timeout`].
    fn op_timeout(&self) -> Duration {
        self.inner().op_timeout()
    }
    /// [`Bootstrap::dead_peer`].
    fn dead_peer(&self) -> Option<(usize, String)> {
        self.inner().dead_peer()
    }
    /// [`Bootstrap::dead_peers`].
    fn dead_peers(&self) -> Vec<(usize, String)> {
        self.inner().dead_peers()
    }
    /// [`Bootstrap::left_peer`].
    fn left_peer(&self) -> Option<(usize, Duration)> {
        self.inner().left_peer()
    }
    /// [`Bootstrap::forgo_goodbye`].
    fn forgo_goodbye(&self) {
        self.inner().forgo_goodbye()
    }
    /// [`Bootstrap::setup_phases`].
    fn setup_phases(&self) -> Vec<SetupPhase> {
        self.inner().setup_phases()
    }
    /// [`Bootstrap::secret`].
    fn secret(&self) -> Option<Secret> {
        self.inner().secret()
    }
}

impl<D: Decorator> Bootstrap for D {
    fn rank(&self) -> usize {
        Decorator::rank(self)
    }
    fn size(&self) -> usize {
        Decorator::size(self)
    }
    fn local_rank(&self) -> usize {
        Decorator::local_rank(self)
    }
    fn ranks_per_node(&self) -> usize {
        Decorator::ranks_per_node(self)
    }
    fn node_of(&self, rank: usize) -> Option<usize> {
        Decorator::node_of(self, rank)
    }
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        Decorator::send(self, peer, tag, data)
    }
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        Decorator::recv_watched(self, peer, tag, timeout, watch)
    }
    fn recv_any(&self, peers: &[usize], tag: u64, timeout: Duration) -> Result<(usize, Vec<u8>)> {
        Decorator::recv_any(self, peers, tag, timeout)
    }
    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        Decorator::barrier_watched(self, watch)
    }
    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        Decorator::all_gather_watched(self, data, watch)
    }
    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        Decorator::broadcast_watched(self, root, data, watch)
    }
    fn op_timeout(&self) -> Duration {
        Decorator::op_timeout(self)
    }
    fn dead_peer(&self) -> Option<(usize, String)> {
        Decorator::dead_peer(self)
    }
    fn dead_peers(&self) -> Vec<(usize, String)> {
        Decorator::dead_peers(self)
    }
    fn left_peer(&self) -> Option<(usize, Duration)> {
        Decorator::left_peer(self)
    }
    fn forgo_goodbye(&self) {
        Decorator::forgo_goodbye(self)
    }
    fn setup_phases(&self) -> Vec<SetupPhase> {
        Decorator::setup_phases(self)
    }
    fn secret(&self) -> Option<Secret> {
        Decorator::secret(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::error::Error;

    /// A one-rank bootstrap whose operations say who answered.
    struct Plain;

    impl Bootstrap for Plain {
        fn rank(&self) -> usize {
            3
        }
        fn size(&self) -> usize {
            4
        }
        fn local_rank(&self) -> usize {
            1
        }
        fn ranks_per_node(&self) -> usize {
            2
        }
        fn node_of(&self, rank: usize) -> Option<usize> {
            Some(rank / 2)
        }
        fn send(&self, _: usize, _: u64, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn recv_watched(
            &self,
            peer: usize,
            tag: u64,
            _: Duration,
            _: Watch<'_>,
        ) -> Result<Vec<u8>> {
            Ok(vec![peer as u8, tag as u8])
        }
        fn barrier_watched(&self, _: Watch<'_>) -> Result<()> {
            Ok(())
        }
        fn all_gather_watched(&self, data: &[u8], _: Watch<'_>) -> Result<Vec<Vec<u8>>> {
            Ok(vec![data.to_vec()])
        }
        fn broadcast_watched(&self, _: usize, _: &mut Vec<u8>, _: Watch<'_>) -> Result<()> {
            Ok(())
        }
        fn op_timeout(&self) -> Duration {
            Duration::from_millis(1234)
        }
        fn dead_peer(&self) -> Option<(usize, String)> {
            Some((2, "inner".into()))
        }
    }

    /// Counts barriers and refuses all-gathers; everything else is the inner bootstrap's.
    struct Wrapper {
        inner: Plain,
        barriers: Arc<AtomicUsize>,
    }

    impl Decorator for Wrapper {
        fn inner(&self) -> &dyn Bootstrap {
            &self.inner
        }
        fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
            self.barriers.fetch_add(1, Ordering::Relaxed);
            self.inner.barrier_watched(watch)
        }
        fn all_gather_watched(&self, _: &[u8], _: Watch<'_>) -> Result<Vec<Vec<u8>>> {
            Err(Error::BootstrapConfig("refused by the wrapper".into()))
        }
    }

    #[test]
    fn a_decorator_changes_what_it_overrides_and_forwards_the_rest() {
        let barriers = Arc::new(AtomicUsize::new(0));
        let w: Box<dyn Bootstrap> = Box::new(Wrapper {
            inner: Plain,
            barriers: Arc::clone(&barriers),
        });
        // Forwarded.
        assert_eq!(
            (w.rank(), w.size(), w.local_rank(), w.ranks_per_node()),
            (3, 4, 1, 2)
        );
        assert_eq!(w.node_of(3), Some(1));
        assert_eq!(w.recv(5, 6).unwrap(), vec![5, 6]);
        assert_eq!(w.op_timeout(), Duration::from_millis(1234));
        assert_eq!(w.dead_peer(), Some((2, "inner".into())));
        assert_eq!(w.left_peer(), None);
        // Overridden: the plain waits go through the decorator's watched ones.
        w.barrier().unwrap();
        w.barrier_watched(&crate::bootstrap::no_watch).unwrap();
        assert!(w.all_gather(&[1]).is_err());
        assert!(
            w.all_gather_watched(&[1], &crate::bootstrap::no_watch)
                .is_err()
        );
        assert_eq!(barriers.load(Ordering::Relaxed), 2);
    }
}
