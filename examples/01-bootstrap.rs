//! 01 — Bootstrap: how ranks find each other.
//!
//! Every mscclpp program starts here. Rank 0 binds a root address, which together with a random
//! session magic and a random secret makes the `UniqueId`; every rank (rank 0 included) calls
//! `TcpBootstrap::init` with its rank, the world size and that id, proves that it holds the
//! secret, and the ranks end up linked to each other over TCP (a tree, plus links opened on
//! first use). The bootstrap then carries the small set-up messages of everything else (memory handles,
//! connection info), plus a few collectives: `all_gather`, `barrier`, `broadcast`.
//!
//! Here the ranks are threads of one process on loopback. In a real job they are processes, and
//! the id travels through the launcher: rank 0 prints `id.to_hex()`, the others read it back with
//! `BootstrapConfig::from_env()` (which also knows torchrun's, Open MPI's and Slurm's variables).
//! No GPU is involved yet.
//!
//! ```sh
//! cargo run --example 01-bootstrap
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use mscclpp::host::bootstrap::{Bootstrap, BootstrapConfig, RootListener, TcpBootstrap, UniqueId};

const RANKS: usize = 4;

/// One rank: join, contribute `(rank, rank²)` to an all-gather, meet at a barrier.
fn rank_main(
    rank: usize,
    id: UniqueId,
    root: &Mutex<Option<RootListener>>,
) -> Result<Vec<(u32, u32)>, Box<dyn Error + Send + Sync>> {
    let cfg = BootstrapConfig::new(rank, RANKS, id).with_timeout(Duration::from_secs(30));
    // Rank 0 serves the root on the listener bound in `main`; the others connect to it.
    let listener = if rank == 0 {
        root.lock().expect("root lock").take()
    } else {
        None
    };
    let bootstrap = match listener {
        Some(listener) => TcpBootstrap::init_with_root_listener(cfg, listener)?,
        None => TcpBootstrap::init(cfg)?,
    };

    // Every rank contributes the same number of bytes and receives all contributions in rank
    // order.
    let r = rank as u32;
    let mine = [r.to_le_bytes(), (r * r).to_le_bytes()].concat();
    let all = bootstrap.all_gather(&mine)?;
    let gathered = all
        .iter()
        .map(|b| {
            let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            (word(0), word(4))
        })
        .collect();

    // Nobody leaves before everybody has arrived.
    bootstrap.barrier()?;
    Ok(gathered)
}

/// Prints an error with its causes and exits with a failure (`mscclpp::exit_code`).
fn main() -> ExitCode {
    mscclpp::exit_code(run())
}

fn run() -> Result<(), Box<dyn Error + Send + Sync>> {
    let (id, listener) = UniqueId::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    println!("root at {}; unique id {}", id.root(), id.to_hex());
    let root = Mutex::new(Some(listener));

    let results: Vec<_> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..RANKS)
            .map(|rank| {
                let root = &root;
                s.spawn(move || rank_main(rank, id, root))
            })
            .collect();
        ranks.into_iter().map(|h| h.join()).collect()
    });

    let expected: Vec<(u32, u32)> = (0..RANKS as u32).map(|r| (r, r * r)).collect();
    for (rank, result) in results.into_iter().enumerate() {
        let gathered = result
            .map_err(|_| format!("rank {rank} panicked"))?
            .map_err(|e| format!("rank {rank}: {e}"))?;
        println!("rank {rank} gathered {gathered:?}");
        if gathered != expected {
            return Err(format!("rank {rank} gathered {gathered:?}, expected {expected:?}").into());
        }
    }
    println!("all {RANKS} ranks agree; barrier passed");
    Ok(())
}
