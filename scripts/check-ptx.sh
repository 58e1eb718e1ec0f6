#!/usr/bin/env bash
# Assembles the embedded device PTX with NVIDIA's ptxas, so an asm typo in device/src/arch fails
# here instead of on a GPU day. ptxas comes from the PyPI wheel nvidia-cuda-nvcc (13.0.x), which
# runs on x86-64 Linux without a GPU; it is installed into a venv under target/.
#   scripts/check-ptx.sh           assemble, report the kernel count
#   scripts/check-ptx.sh --table   also print each kernel's registers, stack and spills
#                                  (ptxas -v), sorted by name: the table compared before/after a
#                                  device change
set -euo pipefail
table=0
[ "${1:-}" = "--table" ] && table=1
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
"$ptxas" -arch="$arch" -v "${ptx[0]}" -o "$out/device.cubin" 2>"$out/ptxas.txt" || {
  cat "$out/ptxas.txt" >&2
  exit 1
}
entries=$(grep -c '^\.visible \.entry' "${ptx[0]}")
echo "check-ptx: ptxas -arch=$arch accepted ${ptx[0]} ($entries kernels)"
if [ "$table" -eq 1 ]; then
  # ptxas -v prints, per entry: "Compiling entry function 'NAME'", then "N bytes stack frame,
  # N bytes spill stores, N bytes spill loads", then "Used N registers".
  printf '%-36s %9s %11s %12s\n' kernel registers stack spills
  awk '
    /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
    /bytes stack frame/ { stack = $1; spill = $5 + $9 }
    /Used [0-9]+ registers/ && name != "" {
      for (i = 1; i <= NF; i++) if ($i == "Used") regs = $(i + 1)
      printf "%-36s %9s %11s %12s\n", name, regs, stack, spill; name = ""
    }' "$out/ptxas.txt" | sort
fi
