//! Cancelling a bootstrap's set-up from another thread ([`BootstrapConfig::with_cancel`]): what
//! NCCL's `ncclCommAbort` does to a communicator whose init still waits for its peers.
//!
//! A [`Cancel`] is shared by whoever may cancel and the set-up. While the set-up waits on a
//! socket for long (joining at the root: the wait for the address table, which lasts until
//! every rank joined), it registers a clone of that socket ([`Cancel::watch`]);
//! [`Cancel::cancel`] marks the token and shuts every registered socket down, so the wait ends
//! at once; the connect loop to a root that is not up yet looks at the mark between attempts.
//! The set-up then fails with `Error::Aborted`, and rank 0's root service is stopped without
//! waiting for the ranks that did not come.
//!
//! Shared state: the mark and the registered sockets, behind one mutex (written by `watch`, the
//! end of a watch and `cancel`; read by `is_cancelled`).
//!
//! [`BootstrapConfig::with_cancel`]: super::BootstrapConfig::with_cancel

use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::sync::lock;

#[derive(Default)]
struct State {
    cancelled: bool,
    next: u64,
    sockets: Vec<(u64, TcpStream)>,
}

/// A token that cancels a bootstrap's set-up (module docs). Clones share the token; two
/// configurations are equal in this field when they share it.
#[derive(Clone, Default)]
pub struct Cancel(Arc<Mutex<State>>);

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl PartialEq for Cancel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Cancel {}

impl Cancel {
    /// A token not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the set-up that holds this token: its socket waits end at once, and it fails
    /// with `Error::Aborted`. Later set-ups with this token fail at their first wait.
    pub fn cancel(&self) {
        let mut s = lock(&self.0);
        s.cancelled = true;
        for (_, socket) in s.sockets.drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        lock(&self.0).cancelled
    }

    /// The set-up's error once cancelled.
    pub(crate) fn error() -> Error {
        Error::Aborted {
            reason: "the bootstrap's set-up was cancelled (the communicator was aborted or \
                     destroyed during its initialisation)"
                .into(),
        }
    }

    /// Registers `socket` for [`cancel`](Self::cancel) to shut down until the returned watch
    /// ends (shut down at once if already cancelled). A socket that cannot be cloned is not
    /// registered: its wait ends at its deadline.
    pub(crate) fn watch(&self, socket: &TcpStream) -> Watching<'_> {
        let mut s = lock(&self.0);
        if s.cancelled {
            let _ = socket.shutdown(Shutdown::Both);
            return Watching {
                cancel: self,
                id: None,
            };
        }
        let Ok(clone) = socket.try_clone() else {
            return Watching {
                cancel: self,
                id: None,
            };
        };
        let id = s.next;
        s.next += 1;
        s.sockets.push((id, clone));
        Watching {
            cancel: self,
            id: Some(id),
        }
    }
}

/// A socket registered with a [`Cancel`] ([`Cancel::watch`]), until dropped.
pub(crate) struct Watching<'a> {
    cancel: &'a Cancel,
    id: Option<u64>,
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            lock(&self.cancel.0).sockets.retain(|(i, _)| *i != id);
        }
    }
}
