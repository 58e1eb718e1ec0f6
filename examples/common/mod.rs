//! What examples 02–04 share: ranks as threads of one process, each with its `Communicator`.
//! (Not an example itself: Cargo only discovers `examples/*.rs` and `examples/*/main.rs`.)
//! Example 01 spells out the bootstrap this helper does.

#![allow(dead_code)]

use std::error::Error;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp::host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, Gpu};

/// An error any rank thread can hand back.
pub type BoxError = Box<dyn Error + Send + Sync>;
/// The result of a rank's body.
pub type Result<T = ()> = std::result::Result<T, BoxError>;

/// Runs `n` ranks as threads of this process: a TCP bootstrap over loopback, then a
/// `Communicator` per rank on device `rank` of `backend` (wrapping around when it has fewer
/// devices). Returns the ranks' results in rank order, or the first rank's error.
pub fn ranks_as_threads<T: Send>(
    n: usize,
    backend: BackendKind,
    body: impl Fn(Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let devices = backend.device_count()?;
    if devices == 0 {
        return Err(format!("the {backend:?} backend has no device").into());
    }
    let (id, listener) = UniqueId::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let listener = Mutex::new(Some(listener));
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|rank| {
                let (body, listener) = (&body, &listener);
                s.spawn(move || -> Result<T> {
                    let cfg =
                        BootstrapConfig::new(rank, n, id).with_timeout(Duration::from_secs(30));
                    let root = if rank == 0 {
                        listener.lock().expect("listener lock").take()
                    } else {
                        None
                    };
                    let bootstrap = match root {
                        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l)?,
                        None => TcpBootstrap::init(cfg)?,
                    };
                    let gpu = Gpu::open(backend, rank % devices)?;
                    body(Communicator::new(Arc::new(bootstrap), gpu)?)
                })
            })
            .collect();
        ranks
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h.join() {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(format!("rank {rank}: {e}").into()),
                Err(_) => Err(format!("rank {rank} panicked").into()),
            })
            .collect()
    })
}

/// Bytes `0, 31, 62, …` offset by `seed` (wrapping): what rank `seed` sends.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The device error a kernel recorded in the communicator's status, as an error.
pub fn check_device_status(comm: &Communicator) -> Result {
    match comm.status().error() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Compares what a rank received with what it expected, naming the first difference.
pub fn check_data(what: &str, got: &[u8], want: &[u8]) -> Result {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!("{what}: {} bytes, expected {}", got.len(), want.len()).into()),
        Some(i) => Err(format!(
            "{what}: byte {i} is {:#04x}, expected {:#04x}",
            got[i], want[i]
        )
        .into()),
    }
}
