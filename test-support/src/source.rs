//! Where a test finds the repository's files (sources, headers, scripts) at run time.
//!
//! A test binary of the GPU bundle (`scripts/gpu-bundle.sh`) is built here and run from a copy
//! of the repository at another path, where the build path that `env!("CARGO_MANIFEST_DIR")`
//! holds does not exist (or, worse, holds another checkout). The bundle's `run-tests.sh` sets
//! `CARGO_MANIFEST_DIR` to the package's directory in the copy it runs in, as `cargo test`
//! sets it to the package's directory here; only a binary run by hand, with neither, falls back
//! to the build path.

use std::path::PathBuf;

/// The package directory of the running test: the run-time `CARGO_MANIFEST_DIR` when set,
/// else `built`, the caller's `env!("CARGO_MANIFEST_DIR")`.
pub fn package_dir(built: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(built), PathBuf::from)
}
