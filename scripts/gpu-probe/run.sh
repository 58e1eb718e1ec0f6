#!/usr/bin/env bash
# Runs the shared-GPU probe (shared_gpu.cu) on the GPU machine; see that file. Every step is
# bounded by `timeout`. MPS is started only with its own pipe/log folders under /tmp, and quit
# at the end (no GPU setting changes: compute mode stays as found).
set -u
cd "$(dirname "$0")"
out="${OUT:-/tmp}"
nvcc -O2 -arch=sm_90 -o /tmp/probe shared_gpu.cu -lcuda -lpthread || exit 1
nvcc -arch=sm_90 -ptx -o /tmp/probe_nop.ptx shared_gpu.cu || exit 1
nvidia-smi --query-gpu=name,compute_mode,mig.mode.current,driver_version --format=csv
echo "mps control: $(command -v nvidia-cuda-mps-control || echo none)"
for mode in LAZY EAGER; do
    echo "== threads, CUDA_MODULE_LOADING=$mode"
    CUDA_MODULE_LOADING=$mode timeout 120 /tmp/probe threads /tmp/probe_nop.ptx
done
for n in 8 16 32; do
    for c in "" 32; do
        echo "== queues $n, CUDA_DEVICE_MAX_CONNECTIONS=${c:-default}"
        if [ -n "$c" ]; then CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 60 /tmp/probe queues $n
        else timeout 60 /tmp/probe queues $n; fi
    done
done
echo "== processes, time-sliced (no MPS)"
timeout 120 /tmp/probe procs 2 200
timeout 120 /tmp/probe procs 4 50
timeout 120 /tmp/probe procs 8 20
if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        echo "== processes under MPS"
        timeout 120 /tmp/probe procs 2 200
        timeout 120 /tmp/probe procs 4 50
        timeout 120 /tmp/probe procs 8 20
        echo quit | nvidia-cuda-mps-control
        sleep 1
        cp -r "$CUDA_MPS_LOG_DIRECTORY" "$out/mps-log" 2>/dev/null
    else
        echo "MPS: the control daemon did not start"
    fi
fi
