//! Test data and host references of the NCCL-surface tests (`tests/p2p.rs`, `tests/reductions.rs`,
//! `tests/collectives_nccl_surface.rs`), over the harness (`mscclpp-test-support`: ranks, the
//! element codec, the hash and marker): values are a hash of (rank, part, index, salt),
//! outputs start as a marker, and every element is compared with a reference computed here, from the types'
//! definitions (nothing of the library's reduction code is used).

#![allow(dead_code)]

pub mod types;

use mscclpp::collectives::{CollectiveConfig, Collectives};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::DeviceBuffer;
pub use mscclpp_test_support::{MARKER, mix};
use std::sync::Arc;

/// `len` bytes of what `rank` contributes as `part` (a hash of rank, part, index and `salt`).
pub fn bytes(rank: usize, part: usize, len: usize, salt: u64) -> Vec<u8> {
    (0..len)
        .map(|i| mix(salt ^ (rank as u64) << 52 ^ (part as u64) << 36 ^ i as u64).to_le_bytes()[3])
        .collect()
}

/// Whether the larger test grids were asked for (`MSCCLPP_TEST_SURFACE_FULL=1`).
pub fn full_grid() -> bool {
    std::env::var("MSCCLPP_TEST_SURFACE_FULL").is_ok_and(|v| v == "1")
}

/// Runs `body` on `n` ranks as threads, each with its collectives (`cfg` edited by `tune`).
pub fn with_collectives(
    n: usize,
    tune: impl Fn(&mut CollectiveConfig) + Sync,
    body: impl Fn(&Collectives) + Sync,
) {
    mscclpp_test_support::ranks_as_threads(n, |comm: Communicator| {
        let mut cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        tune(&mut cfg);
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        body(&c);
        c.communicator().bootstrap().barrier().unwrap();
    });
}

/// A device buffer of `len` bytes (at least 1) holding `data` at `at` and the marker
/// elsewhere.
pub fn buffer(c: &Collectives, len: usize, at: usize, data: &[u8]) -> DeviceBuffer {
    let g = c.communicator().gpu();
    let b = g.alloc(len.max(1)).unwrap();
    let mut all = vec![MARKER; len.max(1)];
    all[at..at + data.len()].copy_from_slice(data);
    b.copy_from_host(0, &all).unwrap();
    b
}

/// The whole content of `b`.
pub fn read(b: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    b.copy_to_host(0, &mut v).unwrap();
    v
}

/// Compares `got` with `want` byte by byte, naming the first difference.
pub fn same(got: &[u8], want: &[u8], what: &dyn Fn() -> String) {
    assert_eq!(got.len(), want.len(), "{}: length", what());
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{}: byte {i} of {} is {:#04x}, want {:#04x}",
            what(),
            want.len(),
            got[i],
            want[i]
        );
    }
}
