#!/usr/bin/env bash
# README's test command: everything CI checks, on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup toolchain install            # components from rust-toolchain.toml
cargo build --workspace --all-targets --locked
bash scripts/check-ptx.sh           # the embedded PTX must assemble for sm_90
bash scripts/check-cuda-header.sh   # CUDA C++ against mscclpp/device.cuh must compile (nvcc)
bash scripts/fetch-nvidia-nccl.sh   # NVIDIA's nccl.h + symbol list for the drop-in NCCL's ABI test
cargo test --workspace --locked
bash scripts/build-nccl.sh --debug  # the drop-in libnccl.so.2 as installed (SONAME checked)
MSCCLPP_BACKEND=cpu cargo run --locked -q -p user-kernels-demo   # a user kernel crate, built by mscclpp-build
cargo run --locked -q --bin mscclpp-bench -- allreduce -c -n 2 -w 1   # README's main command, from the root
