#!/usr/bin/env bash
# README's test command: everything CI checks, on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup toolchain install            # components from rust-toolchain.toml
cargo build --workspace --all-targets --locked
bash scripts/check-ptx.sh           # the embedded PTX must assemble for sm_90
bash scripts/check-cuda-header.sh   # CUDA C++ against mscclpp/device.cuh must compile (nvcc)
cargo test --workspace --locked
MSCCLPP_BACKEND=cpu cargo run --locked -q -p user-kernels-demo   # a user kernel crate, built by mscclpp-build
cargo run --locked -q --bin mscclpp-bench -- allreduce -c -n 2 -w 1   # README's main command, from the root
