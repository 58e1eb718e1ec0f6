#!/usr/bin/env bash
# This wave's second GPU run: the per-call cost against NCCL (issue 30 item 11), PyTorch
# through the drop-in at 4 and 8 processes on the one GPU (issue 29), PyTorch's shrink after a
# killed rank (issue 32), within BUDGET seconds. One log: $OUT/wave-f.log; JSON in $OUT.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$root"
end=$((SECONDS + ${BUDGET:-540}))
out="${OUT:-/tmp/out}"; mkdir -p "$out"; work=/tmp/wavef; mkdir -p $work
exec > >(tee -a "$out/wave-f.log") 2>&1
bash gpu-bundle/unpack.sh >/dev/null || exit 1
export NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=32
lib="$root/gpu-bundle/tests/libmscclpp_nccl.so"
left() { echo $((end - SECONDS)); }
for n in 4 8; do
  [ "$(left)" -lt 60 ] && { echo "NOT STARTED (time) torch world $n"; continue; }
  s=$SECONDS
  MSCCLPP_RANKS_PER_GPU=$n LD_PRELOAD="$lib" timeout 80 python3 nccl/tests/python/torch_collectives.py \
    --expect mscclpp --world-size $n --out $work/torch$n >$work/torch$n.log 2>&1; rc=$?
  echo "torch world $n through the drop-in on one GPU: rc=$rc $((SECONDS - s)) s; ok lines: $(grep -ciE '\bok\b' $work/torch$n.log)"
  grep -iE "fail|error|mismatch|NOT RUN|Traceback" $work/torch$n.log | head -6 | sed 's/^/   | /'; tail -3 $work/torch$n.log | sed 's/^/   | /'
done
echo "== per-call cost, world size 1 (ours vs NVIDIA's NCCL)"
OUT=$out timeout ${PERCALL_S:-110} bash gpu-bundle/run-percall.sh --dtypes float32 --step 8 --reps 5 --iters 20 2>&1 | tail -70
echo "== test binaries in the mode (issues 32, 33, 30)"
[ -d gpu-bundle/plans ] && [ ! -d ../shared/mscclpp-plans ] && mkdir -p ../shared && cp -r gpu-bundle/plans ../shared/mscclpp-plans
for t in executor-test recovery-test frameworks-test; do
  [ "$(left)" -lt 40 ] && { echo "NOT STARTED (time) $t"; continue; }
  OUT=$work MSCCLPP_RANKS_PER_GPU=8 bash scripts/gpu-probe/shared-run.sh 70 $t
done
if [ "$(left)" -gt 50 ]; then
  s=$SECONDS
  MSCCLPP_RANKS_PER_GPU=3 LD_PRELOAD="$lib" timeout 90 python3 nccl/tests/python/torch_shrink.py --world-size 3 --expect mscclpp >$work/shrink.log 2>&1; rc=$?
  echo "torch shrink after a kill, 3 processes on one GPU: rc=$rc $((SECONDS - s)) s"; tail -8 $work/shrink.log | sed 's/^/   | /'
fi
tar -C $work -czf "$out/wavef-logs.tar.gz" . 2>/dev/null
