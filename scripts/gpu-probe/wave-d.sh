#!/usr/bin/env bash
# Issue 29's hang diagnosis on one GPU: each case bounded; a case still running at its bound
# gets every host thread's stack and the running kernels (hang-dump.sh). One log: $OUT/wave-d.log
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$root"
out="${OUT:-/tmp/out}"; mkdir -p "$out"; export WORK=/tmp/waved; mkdir -p $WORK
exec > >(tee -a "$out/wave-d.log") 2>&1
bash gpu-bundle/unpack.sh >/dev/null || exit 1
export NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=32 MSCCLPP_BACKEND=cuda
id; nvidia-smi -L; cuda-gdb --version | head -1
hd() { bash scripts/gpu-probe/hang-dump.sh "$@"; }
b=gpu-bundle/bin/mscclpp-bench
echo "== bench all-reduce, 2 ranks on the GPU, eager, each algorithm"
for a in ll ll2 ll128 staged put direct ce auto; do
  MSCCLPP_RANKS_PER_GPU=2 hd 15 "eager-$a" $b allreduce -g 2 -G 0 -a $a -c -b 4K -e 4M -f 32 -n 5 -w 2
  grep -E "^ *[0-9]" $WORK/eager-$a.log | head -4 | sed 's/^/     /'
done
echo "== bench all-reduce, 2 ranks, graphs"
for a in ll direct; do
  MSCCLPP_RANKS_PER_GPU=2 hd 15 "graph-$a" $b allreduce -g 2 -G 2 -a $a -c -b 4K -e 1M -f 16 -n 5 -w 2
done
echo "== shared_gpu collectives, 2 ranks"
( cd "$root" && CARGO_MANIFEST_DIR="$root" MSCCLPP_RANKS_PER_GPU=8 hd 25 sg2 gpu-bundle/tests/shared_gpu-test --include-ignored --exact collectives_on_two_ranks_of_one_gpu --nocapture )
echo "== collectives every_algorithm_2_to_8_ranks"
( cd "$root" && CARGO_MANIFEST_DIR="$root" MSCCLPP_RANKS_PER_GPU=8 DUMP_LINES=120 hd 40 evalg gpu-bundle/tests/collectives-test --include-ignored --exact every_algorithm_2_to_8_ranks --nocapture )
echo "== p2p dropping_right_after_sends_is_safe"
( cd "$root" && CARGO_MANIFEST_DIR="$root" MSCCLPP_RANKS_PER_GPU=8 DUMP_LINES=80 hd 30 p2pdrop gpu-bundle/tests/p2p-test --include-ignored --exact dropping_right_after_sends_is_safe --nocapture )
tar -C $WORK -czf "$out/logs.tar.gz" . 2>/dev/null
