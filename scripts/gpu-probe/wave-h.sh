#!/usr/bin/env bash
# Issue 29/32 re-check after the one-stream copy-engine pipeline and requested_config:
# every_algorithm_2_to_8_ranks (the copy engine at 2-8 ranks among the rest), recovery's kill-and-grow.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$root"
out="${OUT:-/tmp/out}"; mkdir -p "$out"; export WORK=/tmp/waveh; mkdir -p $WORK
exec > >(tee -a "$out/wave-h.log") 2>&1
bash gpu-bundle/unpack.sh >/dev/null || exit 1
export NCCL_NVLS_ENABLE=0 MSCCLPP_BACKEND=cuda CUDA_DEVICE_MAX_CONNECTIONS=32
hd() { bash scripts/gpu-probe/hang-dump.sh "$@"; }
( CARGO_MANIFEST_DIR="$root" MSCCLPP_RANKS_PER_GPU=8 DUMP_LINES=400 hd ${EVALG_S:-100} evalg gpu-bundle/tests/collectives-test --include-ignored --exact every_algorithm_2_to_8_ranks --nocapture ) \
  | grep -E "^rc|^HANG|Thread [0-9]+ |mscclpp::|Active|\| " | grep -v "Mailbox\|recv_any\|decorator\|health\|EvtHandlr\|bs[0-9]-\|beat" | head -40
OUT=$WORK MSCCLPP_RANKS_PER_GPU=8 bash scripts/gpu-probe/shared-run.sh 80 recovery-test
grep -E "^test |recovered|first good|panicked" $WORK/gpu-tests/recovery-test.log | head -12
