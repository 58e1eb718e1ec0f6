#!/usr/bin/env bash
# Issue 29's GPU run after the region fix: the hangs of wave-d again, the copy-engine hang with
# two queue settings, then the multi-rank test binaries in the mode, most important first,
# within BUDGET seconds. One log: $OUT/wave-e.log (test logs packed in $OUT/logs.tar.gz).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$root"
end=$((SECONDS + ${BUDGET:-540}))
out="${OUT:-/tmp/out}"; mkdir -p "$out"; export WORK=/tmp/wavee; mkdir -p $WORK
exec > >(tee -a "$out/wave-e.log") 2>&1
bash gpu-bundle/unpack.sh >/dev/null || exit 1
# MSCCL++'s conformance plans travel in the (git-ignored) bundle, never in the repository:
# put them where tests/executor.rs looks for them, beside the checkout.
[ -d gpu-bundle/plans ] && [ ! -d ../shared/mscclpp-plans ] && mkdir -p ../shared && cp -r gpu-bundle/plans ../shared/mscclpp-plans
export NCCL_NVLS_ENABLE=0 MSCCLPP_BACKEND=cuda
hd() { bash scripts/gpu-probe/hang-dump.sh "$@"; }
b=gpu-bundle/bin/mscclpp-bench
for conn in 32 8; do
  CUDA_DEVICE_MAX_CONNECTIONS=$conn MSCCLPP_RANKS_PER_GPU=2 DUMP_LINES=400 hd 12 "ce-conn$conn" $b allreduce -g 2 -G 0 -a ce -c -b 4K -e 4M -f 32 -n 5 -w 2 \
    | grep -E "^rc|^HANG|Thread [0-9]+ .*\"(mscclpp-bench|mscclpp-reg)|mscclpp::|mscclpp_host::gpu|mscclpp_tools|cuStream|cuMem|cuEvent|cuLaunch|Active|last output" | grep -v "Mailbox\|recv_any\|decorator" | head -60
  grep -E "^ *[0-9]" $WORK/ce-conn$conn.log | head -3 | sed 's/^/     /'
done
export CUDA_DEVICE_MAX_CONNECTIONS=32
echo "== the hangs of wave-d"
( CARGO_MANIFEST_DIR="$root" MSCCLPP_RANKS_PER_GPU=8 DUMP_LINES=300 hd 60 p2pdrop gpu-bundle/tests/p2p-test --include-ignored --exact dropping_right_after_sends_is_safe --nocapture ) \
  | grep -E "^rc|^HANG|Thread [0-9]+ |mscclpp::|mscclpp_host::gpu|cuStream|cuMem|Active|last output|\| " | grep -v "Mailbox\|recv_any\|decorator\|health\|EvtHandlr" | head -50
( CARGO_MANIFEST_DIR="$root" MSCCLPP_RANKS_PER_GPU=8 DUMP_LINES=400 hd 90 evalg gpu-bundle/tests/collectives-test --include-ignored --exact every_algorithm_2_to_8_ranks --nocapture ) \
  | grep -E "^rc|^HANG|Thread [0-9]+ |mscclpp::|mscclpp_host::gpu|cuStream|cuMem|Active|last output|\| " | grep -v "Mailbox\|recv_any\|decorator\|health\|EvtHandlr" | head -60
echo "== test binaries in the mode (8 ranks per GPU allowed)"
for t in shared_gpu-test collectives-test p2p-test registered-test channels-test split-test one_sided-test recovery-test faults-test executor-test soak-test trace-test multinode-test collectives_nccl_surface-test frameworks-test processes-test api-test mscclpp-lib; do
  left=$((end - SECONDS)); [ $left -lt 30 ] && { echo "NOT STARTED (time) $t"; continue; }
  per=$(( left < 150 ? left - 5 : 150 ))
  OUT=$WORK MSCCLPP_RANKS_PER_GPU=8 bash scripts/gpu-probe/shared-run.sh $per $t
done
tar -C $WORK -czf "$out/logs.tar.gz" . 2>/dev/null
