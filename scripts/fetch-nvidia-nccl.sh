#!/usr/bin/env bash
# Fetches what the drop-in NCCL library's ABI test (nccl/tests/abi.rs) compares against:
# NVIDIA's nccl.h and the list of symbols NVIDIA's libnccl.so.2 exports, from the PyPI wheel
# nvidia-nccl-cu12 (pinned below), into target/nvidia-nccl/ (git-ignored):
#   target/nvidia-nccl/include/nccl.h, target/nvidia-nccl/symbols.txt, target/nvidia-nccl/VERSION
# The wheel is ~350 MB (pip's cache keeps it; a local copy can be named with
# MSCCLPP_NVIDIA_NCCL_WHEEL=/path/to/nvidia_nccl_cu12-….whl); only the header and the symbol
# table are kept (the 470 MB library is unpacked to a temporary directory, read with nm, and
# deleted). Costs about 350 MB of download the first time (~5-40 s by link speed), then ~10 s
# (pip's cache, unpacking, nm). Needs python3 with venv and pip, and nm (binutils).
set -euo pipefail
cd "$(dirname "$0")/.."
version="2.32.3"
out=target/nvidia-nccl
stamp="$out/VERSION"
fail() {
  echo "fetch-nvidia-nccl: FAILED: $*" >&2
  exit 1
}
if [ "$(cat "$stamp" 2>/dev/null)" = "$version" ] && [ -s "$out/include/nccl.h" ] && [ -s "$out/symbols.txt" ]; then
  echo "fetch-nvidia-nccl: NCCL $version's header and symbols are in $out"
  exit 0
fi
command -v nm >/dev/null || fail "nm (binutils) is needed to list the library's symbols"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wheel="${MSCCLPP_NVIDIA_NCCL_WHEEL:-}"
if [ -z "$wheel" ]; then
  venv=target/pip-venv
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || fail "could not create the venv $venv (python3 -m venv)"
  fi
  echo "fetch-nvidia-nccl: downloading nvidia-nccl-cu12==$version (~350 MB; pip's cache keeps it)"
  "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$tmp/wheel" "nvidia-nccl-cu12==$version" ||
    fail "pip download nvidia-nccl-cu12==$version"
  wheel=$(ls "$tmp"/wheel/nvidia_nccl_cu12-*.whl) || fail "no wheel after the download"
fi
[ -f "$wheel" ] || fail "no wheel at $wheel"
python3 - "$wheel" "$tmp/unpacked" <<'PY' || fail "unpacking $wheel"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("nvidia/nccl/include/nccl.h", "nvidia/nccl/lib/libnccl.so.2"):
        z.extract(name, sys.argv[2])
PY
got=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$tmp/unpacked/nvidia/nccl/include/nccl.h")
[ "$got" = "$(echo "$version" | awk -F. '{print $1*10000+$2*100+$3}')" ] ||
  fail "the wheel's nccl.h says NCCL_VERSION_CODE $got, not $version"
mkdir -p "$out/include"
cp "$tmp/unpacked/nvidia/nccl/include/nccl.h" "$out/include/nccl.h"
nm -D --defined-only "$tmp/unpacked/nvidia/nccl/lib/libnccl.so.2" | awk '{print $3}' |
  grep -E '^p?nccl' | sort -u >"$out/symbols.txt"
[ -s "$out/symbols.txt" ] || fail "no nccl symbols in the wheel's libnccl.so.2"
printf '%s' "$version" >"$stamp"
echo "fetch-nvidia-nccl: NCCL $version: $(wc -l <"$out/symbols.txt") symbols and nccl.h in $out"
