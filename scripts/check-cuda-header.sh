#!/usr/bin/env bash
# Compiles CUDA C++ against shared/include/mscclpp/device.cuh with NVIDIA's nvcc, so a typo in the
# header (C++ or inline PTX) fails here, on a machine without a GPU, instead of on a GPU day:
#   1. examples/cuda_c/port_and_memory.cu -> PTX (nvcc -arch=$arch -ptx), then ptxas -Werror on
#      it, and every kernel examples/04-cuda-c-kernel.rs names (KernelSpec::ptx_only) must be an
#      entry point of it. The PTX is left in target/cuda_c/port_and_memory.ptx.
#   2. a translation unit that calls EVERY function of the header (templates are only checked
#      when instantiated), compiled to an object (nvcc -c: device code through cicc and ptxas,
#      host code through the host C++ compiler) as C++11 and C++17, all warnings as errors.
#
# nvcc comes from PyPI wheels, which run on x86-64 Linux without a GPU or a CUDA install, in a
# venv under target/ (git-ignored). All pinned to CUDA 13.0 (nvcc's unpinned dependencies would
# otherwise pull a newer cicc): nvidia-cuda-nvcc (nvcc, ptxas; 37 MB), nvidia-nvvm (cicc; 62 MB),
# nvidia-cuda-crt (crt headers; 0.1 MB), nvidia-cuda-runtime (cuda_runtime.h; 2 MB) and
# nvidia-cuda-cccl (libcu++/CUB headers; 3 MB): about 105 MB downloaded once (pip's cache keeps
# them), about 300 MB installed, about 10 s to install on a fast link; each later run takes about
# 5 s on 2 cores. Fails (non-zero, with a message) if nvcc cannot be installed or anything fails
# to compile.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${MSCCLPP_CUDA_ARCH:-sm_90}"
venv=target/nvcc-venv
pins=("nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*"
  "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*")
bin_glob="$venv/lib/python3*/site-packages/nvidia/cu13/bin"
stamp="$venv/.mscclpp-pins"

fail() {
  echo "check-cuda-header: FAILED: $*" >&2
  exit 1
}

if ! compgen -G "$bin_glob/nvcc" >/dev/null || [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
  echo "check-cuda-header: installing nvcc (CUDA 13.0 wheels, ~105 MB) into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || fail "could not create the venv $venv (python3 -m venv)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" ||
    fail "could not install ${pins[*]} with pip"
  printf '%s' "${pins[*]}" >"$stamp"
fi
bin=$(compgen -G "$bin_glob" | head -n1) || fail "no nvcc in $venv after the install"
nvcc="$bin/nvcc"
ptxas="$bin/ptxas"
[ -x "$nvcc" ] && [ -x "$ptxas" ] || fail "nvcc or ptxas missing in $bin"
command -v c++ >/dev/null || fail "nvcc needs a host C++ compiler (c++) on PATH"

flags=(-arch="$arch" -I shared/include -Werror all-warnings)

# 1. The example the Rust host program loads.
example=examples/cuda_c/port_and_memory.cu
mkdir -p target/cuda_c
ptx=target/cuda_c/port_and_memory.ptx
"$nvcc" "${flags[@]}" -std=c++17 -ptx "$example" -o "$ptx" || fail "nvcc -ptx $example"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$ptxas" -arch="$arch" -Werror "$ptx" -o "$out/example.cubin" || fail "ptxas on $ptx"
# Every kernel the Rust host program names must be an entry point of the PTX.
host=examples/04-cuda-c-kernel.rs
mapfile -t entries < <(sed -n 's/.*ptx_only("\([A-Za-z0-9_]*\)").*/\1/p' "$host")
[ "${#entries[@]}" -gt 0 ] || fail "found no KernelSpec::ptx_only(\"...\") names in $host"
for entry in "${entries[@]}"; do
  grep -q "^\.visible \.entry $entry(" "$ptx" || fail "$ptx has no entry point $entry ($host names it)"
done

# 2. Every function of the header, instantiated. Compile-only: never launched.
cat >"$out/api_check.cu" <<'CUDA'
#include <mscclpp/device.cuh>

using namespace mscclpp;

extern "C" __global__ void api_check(PortPingPongParams pp, PingPongParams mp,
                                     Host2DeviceSemaphoreDeviceHandle h2d, uint64_t* out) {
  const FifoDeviceHandle& fifo = pp.channel.fifo;
  const PortChannelDeviceHandle& port = pp.channel;
  const MemoryChannelDeviceHandle& mem = mp.channel;
  const uint32_t t = threadIdx.x, n = blockDim.x;
  uint64_t acc = 0, pos = 0;
  ProxyTrigger trig = {0, 0};
  if (mscclpp_trigger_pack(&trig, 64, 0, 0, 1, 2, MSCCLPP_TRIGGER_DATA, 3)) {
    acc += fifo_push(fifo, trig, &pos);
    acc += fifo_push(fifo, trig);
  }
  acc += fifo_poll(fifo, pos) + fifo_sync(fifo, pos) + fifo_wait_flushed(fifo, pos);
  semaphore_signal(mem.semaphore);
  semaphore_relaxed_signal(mem.semaphore);
  acc += semaphore_wait(mem.semaphore) + semaphore_relaxed_wait(mem.semaphore) +
         semaphore_poll(mem.semaphore);
  acc += semaphore_wait(h2d) + semaphore_relaxed_wait(h2d) + semaphore_poll(h2d);
  acc += port_put(port, 0, 0, pp.bytes, &pos) + port_put(port, 16, 32, 1ULL << 33);
  acc += port_signal(port, &pos) + port_signal(port);
  acc += port_put_with_signal(port, 0, 0, pp.bytes, &pos) + port_put_with_signal(port, 0, 0, 0);
  acc += port_put_with_signal_and_flush(port, 0, 0, pp.bytes) + port_flush(port);
  acc += port_wait(port) + port_poll(port);
  memory_put(mem, 0, 0, mp.bytes, t, n);
  memory_get(mem, 0, 0, mp.bytes, t, n);
  memory_write<uint64_t>(mem, t, acc);
  memory_write<float>(mem, t, 1.0f);
  acc += memory_read<uint32_t>(mem, t) + memory_read<uint64_t>(mem, t);
  memory_put_packets<LL16Packet>(mem, 0, 0, mp.bytes, t, n, mp.flag_base);
  memory_put_packets<LL8Packet>(mem, 0, 0, mp.bytes, t, n, mp.flag_base);
  acc += memory_unpack_packets<LL16Packet>(mem, 0, 0, mp.bytes, t, n, mp.flag_base);
  acc += memory_unpack_packets<LL8Packet>(mem, 0, 0, mp.bytes, t, n, mp.flag_base);
  memory_signal(mem);
  memory_relaxed_signal(mem);
  acc += memory_wait(mem) + memory_relaxed_wait(mem) + memory_poll(mem);
  acc += packets_for<LL16Packet>(mp.bytes) + packets_for<LL8Packet>(mp.bytes);
  uint32_t w[2];
  acc += read_packet(as_ptr<const LL16Packet>(mem.packet_buffer), 1, mp.status, w) + w[0];
  acc += read_packet(as_ptr<const LL8Packet>(mem.packet_buffer), 1, mp.status, w) + w[0];
  put_packets(as_ptr<LL8Packet>(mem.dst), as_ptr<const uint8_t>(mem.src), 13, t, n, 2);
  acc += unpack_packets(as_ptr<uint8_t>(mem.src), as_ptr<const LL16Packet>(mem.packet_buffer),
                        13, t, n, 2, mp.status);
  copy(as_ptr<uint8_t>(mem.dst), as_ptr<const uint8_t>(mem.src), 100, t, n);
  acc += aborted(mp.status);
  record_error(mp.status, MSCCLPP_DEVICE_ERROR_INVALID_ARGUMENT,
               mscclpp_error_detail(MSCCLPP_WAIT_SITE_UNKNOWN, 0));
  acc += spin_until(mp.status, MSCCLPP_WAIT_SITE_GRID_BARRIER, 0, [&]() -> bool { return acc > 1; });
  ptx::fence_acq_rel_sys();
  ptx::st_release_sys_u64(out + 1, acc);
  out[t] = acc;
}
CUDA
for std in c++11 c++17; do
  "$nvcc" "${flags[@]}" -std="$std" -Xcompiler -Wall,-Wextra,-Werror -c "$out/api_check.cu" \
    -o "$out/api_check.o" || fail "nvcc -std=$std -c (every function of device.cuh)"
done

echo "check-cuda-header: nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') -arch=$arch accepted $example (${#entries[@]} kernels, $ptx) and every function of shared/include/mscclpp/device.cuh (C++11, C++17)"
