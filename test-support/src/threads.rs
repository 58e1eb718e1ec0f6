//! Ranks as threads of the test process: one thread per rank, joined by a `TcpBootstrap` on
//! loopback (set-up bounded by [`SETUP_TIMEOUT`]), rank `r` on device `r % devices` of the
//! backend under test ([`ranks_as_threads_on`]: of a given backend).
//!
//! A rank that fails (an error or a panic, a failed assertion say) aborts
//! every rank's communicator first, so kernels of the others waiting for it return instead of
//! hanging the test; the test then fails naming every rank that failed and why (a panic's message
//! included), the first cause first.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use mscclpp_host::bootstrap::{Bootstrap, BootstrapConfig, RootListener, TcpBootstrap, UniqueId};
use mscclpp_host::communicator::Communicator;
use mscclpp_host::status::StatusBlock;
use mscclpp_host::{Error, Result};

use mscclpp_host::gpu::BackendKind;

use crate::backend::backend;
use crate::counting::{Counting, Sends};

/// How long a rank's bootstrap set-up may take (every other wait is the library's own,
/// bounded by the bootstrap's operation timeout or the communicator's abort).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// A world's id and its root's listener, on loopback (rank 0 takes the listener).
fn root() -> (UniqueId, Mutex<Option<RootListener>>) {
    match UniqueId::bind(([127, 0, 0, 1], 0).into()) {
        Ok((id, listener)) => (id, Mutex::new(Some(listener))),
        Err(e) => panic!("binding the bootstrap root on loopback: {e}"),
    }
}

/// Rank `r`'s bootstrap of a world of `n` (rank 0 serves the root with `listener`'s).
fn bootstrap(
    r: usize,
    n: usize,
    id: UniqueId,
    listener: &Mutex<Option<RootListener>>,
) -> Result<TcpBootstrap> {
    let cfg = BootstrapConfig::new(r, n, id).with_timeout(SETUP_TIMEOUT);
    let root = match r {
        0 => listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(),
        _ => None,
    };
    match root {
        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l),
        None => TcpBootstrap::init(cfg),
    }
}

/// Runs `body` on `n` ranks as threads; each rank's bootstrap is `wrap`ped first (the second
/// half of `wrap`'s answer goes to `body`). Returns every rank's result in rank order; a
/// panic is reported as `Error::Aborted` with its message.
pub fn ranks_as_threads_over<W, T: Send>(
    n: usize,
    wrap: impl Fn(TcpBootstrap) -> (Arc<dyn Bootstrap>, W) + Sync,
    body: impl Fn(Communicator, W) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    ranks_on(backend(), n, wrap, body)
}

/// [`ranks_as_threads_over`] on backend `kind`.
fn ranks_on<W, T: Send>(
    kind: BackendKind,
    n: usize,
    wrap: impl Fn(TcpBootstrap) -> (Arc<dyn Bootstrap>, W) + Sync,
    body: impl Fn(Communicator, W) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let (id, listener) = root();
    let statuses: Mutex<Vec<Arc<StatusBlock>>> = Mutex::new(Vec::new());
    let abort_all = || {
        for s in statuses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            s.abort();
        }
    };
    let devices = kind
        .device_count()
        .unwrap_or_else(|e| panic!("counting the devices of the {kind:?} backend: {e}"))
        .max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (wrap, body, listener, statuses, abort_all) =
                    (&wrap, &body, &listener, &statuses, &abort_all);
                s.spawn(move || -> Result<T> {
                    let (bs, w) = wrap(bootstrap(r, n, id, listener)?);
                    let gpu = mscclpp_host::gpu::Gpu::open(kind, r % devices)?;
                    let comm = Communicator::new(bs, gpu)?;
                    statuses
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(comm.status().clone());
                    let out =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(comm, w)))
                            .unwrap_or_else(|p| {
                                Err(Error::Aborted {
                                    reason: format!("rank {r} panicked: {}", panic_message(&*p)),
                                })
                            });
                    if out.is_err() {
                        abort_all();
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|p| {
                    Err(Error::Aborted {
                        reason: format!("rank {r} panicked: {}", panic_message(&*p)),
                    })
                })
            })
            .collect()
    })
}

/// The text of a panic's payload.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// An error and its causes on one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(&format!(": {c}"));
        cause = c.source();
    }
    s
}

/// Every rank's value, or a panic naming every rank that failed: those that failed on their
/// own first, then those aborted because another failed.
fn all_ok<T>(results: Vec<Result<T>>) -> Vec<T> {
    let mut own = Vec::new();
    let mut aborted = Vec::new();
    let mut values = Vec::new();
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(v) => values.push(v),
            Err(e) => {
                let line = format!("rank {r}: {}", chain(&e));
                let by_another = matches!(&e, Error::Aborted { reason } if !reason.contains("panicked"))
                    || matches!(e, Error::Remote { .. });
                if by_another { &mut aborted } else { &mut own }.push(line);
            }
        }
    }
    own.extend(aborted);
    assert!(own.is_empty(), "{}", own.join("\n"));
    values
}

/// Runs `body` on `n` ranks as threads; returns their values in rank order, or panics naming
/// every rank that failed (module docs).
pub fn try_ranks_as_threads<T: Send>(
    n: usize,
    body: impl Fn(Communicator) -> Result<T> + Sync,
) -> Vec<T> {
    all_ok(ranks_as_threads_over(
        n,
        |bs| (Arc::new(bs) as Arc<dyn Bootstrap>, ()),
        |comm, ()| body(comm),
    ))
}

/// [`ranks_as_threads`] on backend `kind` rather than the one under test (a test of host-side
/// machinery that the CPU backend serves alike everywhere).
pub fn ranks_as_threads_on<T: Send>(
    kind: BackendKind,
    n: usize,
    body: impl Fn(Communicator) -> T + Sync,
) -> Vec<T> {
    all_ok(ranks_on(
        kind,
        n,
        |bs| (Arc::new(bs) as Arc<dyn Bootstrap>, ()),
        |comm, ()| Ok(body(comm)),
    ))
}

/// [`try_ranks_as_threads`] of a body that fails by panicking.
pub fn ranks_as_threads<T: Send>(n: usize, body: impl Fn(Communicator) -> T + Sync) -> Vec<T> {
    try_ranks_as_threads(n, |comm| Ok(body(comm)))
}

/// [`try_ranks_as_threads`] over bootstraps that count what each rank sends ([`Counting`]).
pub fn counted_ranks_as_threads<T: Send>(
    n: usize,
    body: impl Fn(Communicator, Sends) -> Result<T> + Sync,
) -> Vec<T> {
    all_ok(ranks_as_threads_over(
        n,
        |bs| {
            let sends = Sends::default();
            let counted = Counting::new(Arc::new(bs), sends.clone());
            (Arc::new(counted) as Arc<dyn Bootstrap>, sends)
        },
        body,
    ))
}
