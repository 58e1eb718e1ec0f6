#!/usr/bin/env bash
# Issue 29's GPU run, part C (one log: $OUT/wave.log; the sweep's JSON packed in $OUT/sweep.tar.gz)
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"; cd "$root"
end=$((SECONDS + ${BUDGET:-450}))
out="${OUT:-/tmp/out}"; mkdir -p "$out"; log="$out/wave.log"; work=/tmp/wave; mkdir -p $work/sweep
exec > >(tee -a "$log") 2>&1
bash gpu-bundle/unpack.sh || exit 1
export NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=32 MSCCLPP_BACKEND=cuda
left() { echo $((end - SECONDS)); }
echo "== examples (2 ranks on the GPU, default module loading)"
nvcc -arch=sm_90 -ptx -I shared/include -o /tmp/port_and_memory.ptx examples/cuda_c/port_and_memory.cu || echo "nvcc failed"
for ex in 01-bootstrap 02-memory-channel-ping-pong 03-port-channel-put 04-cuda-c-kernel 05-collectives-foreign-and-typed user-kernels-demo; do
    arg=(); [ "$ex" = 04-cuda-c-kernel ] && arg=(/tmp/port_and_memory.ptx)
    s=$SECONDS; MSCCLPP_RANKS_PER_GPU=2 timeout 40 gpu-bundle/bin/$ex "${arg[@]}" >$work/ex.log 2>&1; rc=$?
    echo "example $ex: rc=$rc $((SECONDS - s)) s"; tail -4 $work/ex.log | sed 's/^/   | /'
done
echo "== shared_gpu-test, one test at a time (8 ranks per GPU allowed)"
for t in a_kernel_taken_after_its_peer_started_spinning_runs a_rank_frees_while_its_peers_kernel_waits_for_it a_second_rank_on_a_gpu_is_refused_without_the_mode collectives_on_two_ranks_of_one_gpu collectives_on_four_ranks_of_one_gpu collectives_on_eight_ranks_of_one_gpu; do
    s=$SECONDS; MSCCLPP_RANKS_PER_GPU=8 timeout 30 gpu-bundle/tests/shared_gpu-test --include-ignored --exact $t --nocapture >$work/t.log 2>&1; rc=$?
    echo "shared_gpu $t: rc=$rc $((SECONDS - s)) s"; grep -E "ping-pong|frees|panicked|Error|ms|NOT RUN" $work/t.log | head -4 | sed 's/^/   | /'
done
echo "== torch through the drop-in, 2 processes on the GPU"
MSCCLPP_RANKS_PER_GPU=2 LD_PRELOAD="$root/gpu-bundle/tests/libmscclpp_nccl.so" timeout 120 python3 nccl/tests/python/torch_collectives.py \
    --expect mscclpp --world-size 2 --out $work/torch2 >$work/torch.log 2>&1; echo "torch world 2: rc=$?"
grep -ciE "\bok\b|pass" $work/torch.log; grep -iE "fail|error|mismatch|NOT RUN" $work/torch.log | head -8 | sed 's/^/   | /'; tail -5 $work/torch.log | sed 's/^/   | /'
echo "== sweep (data checked)"
run1() { local n=$1 op=$2; shift 2
    [ "$(left)" -lt 100 ] && { echo "NOT STARTED (time) $n $op $*"; return; }
    local tag="$op-g$n$(echo "$*" | tr -c 'a-z0-9' '_')"
    MSCCLPP_RANKS_PER_GPU=$n timeout 40 gpu-bundle/bin/mscclpp-bench "$op" -g "$n" -c -b 1K -e 4M -f 64 -n 5 -w 2 "$@" --json $work/sweep/$tag.json >$work/sweep/$tag.log 2>&1
    echo "rc=$? n=$n $op $* : $(grep -cE '^ *[0-9]' $work/sweep/$tag.log) rows, wrong=$(awk '/^ *[0-9]/{w+=$NF} END{print w+0}' $work/sweep/$tag.log)"
    [ -n "$(grep -m1 -E 'SHARED|shared' $work/sweep/$tag.log)" ] || true
}
for op in allreduce allgather reducescatter broadcast alltoall reduce gather scatter alltoallv sendrecv; do run1 8 $op -d f32; done
head -30 $work/sweep/allreduce-g8_d_f32_.log | sed 's/^/   | /'
for op in allreduce allgather reducescatter broadcast alltoall reduce gather scatter alltoallv sendrecv; do run1 2 $op -d bf16; run1 4 $op -d i32; done
for d in f16 bf16 u8 i64 f64 e4m3 e5m2; do run1 8 allreduce -d $d; done
tar -C $work -czf "$out/sweep.tar.gz" sweep torch2 2>/dev/null
echo "== other test binaries (40 s each)"
for b in reductions-test collectives_nccl_surface-test foreign-test abi-test trace-test; do
    [ "$(left)" -lt 45 ] && { echo "NOT STARTED (time) $b"; continue; }
    OUT=$work MSCCLPP_RANKS_PER_GPU=8 bash scripts/gpu-probe/shared-run.sh 40 $b
done
