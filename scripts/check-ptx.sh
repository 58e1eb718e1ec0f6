#!/usr/bin/env bash
# Assembles the embedded device PTX with NVIDIA's ptxas, so an asm typo in device/src/arch fails
# here instead of on a GPU day. ptxas comes from the PyPI wheel nvidia-cuda-nvcc (13.0.x), which
# runs on x86-64 Linux without a GPU; it is installed into a venv under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${MSCCLPP_CUDA_ARCH:-sm_90}"
venv=target/ptxas-venv
ptxas="$venv/lib/python3*/site-packages/nvidia/cu13/bin/ptxas"
if ! compgen -G "$ptxas" >/dev/null; then
  echo "check-ptx: installing ptxas (nvidia-cuda-nvcc 13.0.x) into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "nvidia-cuda-nvcc==13.0.*"
fi
ptxas=$(compgen -G "$ptxas" | head -n1)
# The PTX the library embeds: the newest one the build wrote (release or debug).
mapfile -t ptx < <(ls -t target/*/build/mscclpp-*/out/mscclpp_device.ptx 2>/dev/null)
if [ "${#ptx[@]}" -eq 0 ]; then
  echo "check-ptx: no embedded PTX found; run cargo build first" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$ptxas" -arch="$arch" "${ptx[0]}" -o "$out/device.cubin"
entries=$(grep -c '^\.visible \.entry' "${ptx[0]}")
echo "check-ptx: ptxas -arch=$arch accepted ${ptx[0]} ($entries kernels)"
