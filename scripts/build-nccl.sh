#!/usr/bin/env bash
# Builds the drop-in NCCL library (crate mscclpp-nccl) and installs it under target/nccl/:
#   target/nccl/lib/libnccl.so.2        what PyTorch, vLLM and C programs load (SONAME libnccl.so.2)
#   target/nccl/lib/libmscclpp_nccl.so  the same library under its own name
#   target/nccl/lib/libnccl.so          a link, for linking C programs with -lnccl
#   target/nccl/include/nccl.h          its header (NCCL 2.32.3's ABI)
# Release by default; --debug takes the dev profile (quicker to build; what CI checks).
# README's "Use from PyTorch and other NCCL programs" says how to load it.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
dir=release
if [ "${1:-}" = "--debug" ]; then
  profile=dev
  dir=debug
fi
fail() {
  echo "build-nccl: FAILED: $*" >&2
  exit 1
}
cargo build --locked --profile "$profile" -p mscclpp-nccl
src="target/$dir/libmscclpp_nccl.so"
[ -f "$src" ] || fail "cargo built no $src"
out=target/nccl
mkdir -p "$out/lib" "$out/include"
rm -f "$out/lib/libnccl.so.2" "$out/lib/libmscclpp_nccl.so" "$out/lib/libnccl.so"
cp "$src" "$out/lib/libmscclpp_nccl.so"
cp "$src" "$out/lib/libnccl.so.2"
ln -s libnccl.so.2 "$out/lib/libnccl.so"
cp nccl/include/nccl.h "$out/include/nccl.h"
if command -v readelf >/dev/null; then
  readelf -d "$out/lib/libnccl.so.2" | grep -q 'SONAME.*\[libnccl\.so\.2\]' ||
    fail "$out/lib/libnccl.so.2 does not carry the SONAME libnccl.so.2"
fi
echo "build-nccl: $out/lib/libnccl.so.2 ($profile) and $out/include/nccl.h"
echo "  PyTorch: LD_PRELOAD=$PWD/$out/lib/libnccl.so.2 python …"
echo "  vLLM:    VLLM_NCCL_SO_PATH=$PWD/$out/lib/libnccl.so.2 vllm …"
