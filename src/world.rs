//! Running several ranks in one process: one thread per rank, rank `r` on device `r`, joined by a
//! `TcpBootstrap` on loopback. This is how `mscclpp-bench` drives all local GPUs by default.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp_host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{BackendKind, Gpu};
use mscclpp_host::{Error, Result};

/// Runs `body` on `n` ranks (threads of this process) of `backend`, rank `r` on device
/// `r % device_count`; returns the results in rank order. A rank that fails (an error or a
/// panic) aborts every rank's communicator first, so the others' kernels stop waiting for it;
/// a panic is reported as an error for that rank.
pub fn run_local_ranks<T: Send>(
    backend: BackendKind,
    n: usize,
    body: impl Fn(Communicator) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let devices = backend.device_count().unwrap_or(1).max(1);
    run_local_ranks_on(backend, n, |r| r % devices, body)
}

/// As [`run_local_ranks`], rank `r` on device `device(r)`: e.g. every rank on device 0, for
/// several ranks on one GPU (`MSCCLPP_RANKS_PER_GPU`).
pub fn run_local_ranks_on<T: Send>(
    backend: BackendKind,
    n: usize,
    device: impl Fn(usize) -> usize + Sync,
    body: impl Fn(Communicator) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let loopback: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let (id, listener) = match UniqueId::bind(loopback) {
        Ok(x) => x,
        Err(e) => {
            let msg = e.to_string();
            return (0..n)
                .map(|_| {
                    Err(Error::Aborted {
                        reason: msg.clone(),
                    })
                })
                .collect();
        }
    };
    let listener = Mutex::new(Some(listener));
    let statuses = Mutex::new(Vec::new());
    let abort_all = |statuses: &Mutex<Vec<Arc<mscclpp_host::status::StatusBlock>>>| {
        for s in statuses.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            s.abort();
        }
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (body, listener, statuses, abort_all, device) =
                    (&body, &listener, &statuses, &abort_all, &device);
                s.spawn(move || -> Result<T> {
                    let cfg = BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(60));
                    let root = if r == 0 {
                        listener.lock().unwrap_or_else(|e| e.into_inner()).take()
                    } else {
                        None
                    };
                    let bs = match root {
                        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l)?,
                        None => TcpBootstrap::init(cfg)?,
                    };
                    let gpu = Gpu::open(backend, device(r))?;
                    let comm = Communicator::new(Arc::new(bs), gpu)?;
                    statuses
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(comm.status().clone());
                    let result =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(comm)));
                    match result {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(e)) => {
                            abort_all(statuses);
                            Err(e)
                        }
                        Err(_) => {
                            abort_all(statuses);
                            Err(Error::Aborted {
                                reason: format!("rank {r} panicked"),
                            })
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Aborted {
                        reason: format!("rank {r} panicked"),
                    })
                })
            })
            .collect()
    })
}
