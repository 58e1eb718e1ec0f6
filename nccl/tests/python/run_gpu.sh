#!/usr/bin/env bash
# On a GPU machine with PyTorch (and its nvidia-nccl-cu12 wheel): runs PyTorch's patterns
# (torch_collectives.py) and vLLM's (vllm_style.py) once with NVIDIA's NCCL and once with
# mscclpp-rs's libnccl.so.2, and compares the results, which must be equal; then PyTorch's
# shrink after a killed rank (torch_shrink.py, ours only; at least 3 GPUs). Also reports which
# library answers when ours is only put first on LD_LIBRARY_PATH (no LD_PRELOAD).
#
#   bash nccl/tests/python/run_gpu.sh [LIBDIR] [WORLD_SIZE]
#
# LIBDIR holds our libnccl.so.2 (default target/nccl/lib, from scripts/build-nccl.sh);
# WORLD_SIZE defaults to every GPU. Needs nothing but python3 with PyTorch (CUDA) and the
# library. Exits non-zero if any run fails or any result differs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
libdir="$(cd "${1:-$here/../../../target/nccl/lib}" && pwd)"
lib="$libdir/libnccl.so.2"
[ -f "$lib" ] || { echo "run_gpu: no $lib (run scripts/build-nccl.sh)" >&2; exit 1; }
ws=()
[ -n "${2:-}" ] && ws=(--world-size "$2")
nv=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))')
out=$(mktemp -d)
echo "run_gpu: ours $lib; NVIDIA's $nv; results in $out"
set -x
python3 "$here/torch_collectives.py" "${ws[@]}" --expect nvidia --out "$out/torch-nvidia"
LD_PRELOAD="$lib" NCCL_DEBUG=VERSION python3 "$here/torch_collectives.py" "${ws[@]}" --expect mscclpp --out "$out/torch-ours"
python3 "$here/torch_collectives.py" --compare "$out/torch-ours" "$out/torch-nvidia"
VLLM_NCCL_SO_PATH="$nv" python3 "$here/vllm_style.py" "${ws[@]}" --expect nvidia --out "$out/vllm-nvidia"
VLLM_NCCL_SO_PATH="$lib" python3 "$here/vllm_style.py" "${ws[@]}" --expect mscclpp --out "$out/vllm-ours"
python3 "$here/vllm_style.py" --compare "$out/vllm-ours" "$out/vllm-nvidia"
# A rank killed, the survivors shrink and go on (ncclCommShrink through PyTorch's shrink_group);
# exit 2 (NOT RUN) on a PyTorch without shrink_group, which is reported and not a failure here.
rc=0
LD_PRELOAD="$lib" python3 "$here/torch_shrink.py" "${ws[@]}" --expect mscclpp || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 2 ] || exit "$rc"
# For the README: does LD_LIBRARY_PATH alone win over the wheel's run path? (informational)
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" python3 "$here/torch_collectives.py" "${ws[@]}" --count 10 || true
