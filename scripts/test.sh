#!/usr/bin/env bash
# README's test command: everything CI checks, on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup toolchain install            # components from rust-toolchain.toml
# libfabric for the Ofi transport and the multi-node tests (Debian's libfabric1, opened at run
# time: nothing links it; libfabric-bin brings fi_info). CI runs as root on Debian.
if ! ldconfig -p | grep -q 'libfabric\.so\.1 '; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libfabric1 libfabric-bin
    else
        echo "test.sh: libfabric is missing; install it (Debian/Ubuntu: apt-get install libfabric1 libfabric-bin)" >&2
        exit 1
    fi
fi
export MSCCLPP_REQUIRE_OFI=1         # the libfabric tests fail instead of printing NOT RUN
cargo build --workspace --all-targets --locked
bash scripts/check-ptx.sh           # the embedded PTX must assemble for sm_90
bash scripts/check-cuda-header.sh   # CUDA C++ against mscclpp/device.cuh must compile (nvcc)
bash scripts/fetch-nvidia-nccl.sh   # NVIDIA's nccl.h + symbol list for the drop-in NCCL's ABI test
cargo test --workspace --locked
bash scripts/build-nccl.sh --debug  # the drop-in libnccl.so.2 as installed (SONAME checked)
MSCCLPP_BACKEND=cpu cargo run --locked -q -p user-kernels-demo   # a user kernel crate, built by mscclpp-build
cargo run --locked -q --bin mscclpp-bench -- allreduce -c -n 2 -w 1   # README's main command, from the root
bash scripts/test-python.sh         # the Python package: wheel (maturin), mypy, pytest on the CPU backend
