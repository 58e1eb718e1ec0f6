#!/usr/bin/env bash
# Issue 29: runs one command with a bound; if it is still running after SECONDS, prints every
# host thread's stack and the running kernels (cuda-gdb attached), then kills it.
#   bash scripts/gpu-probe/hang-dump.sh SECONDS LABEL command args...
# Binaries keep their symbols for this only when the bundle was built with
# MSCCLPP_BUNDLE_KEEP_SYMBOLS=1 (gpu-bundle.sh strips them otherwise).
set -u
bound="$1"; label="$2"; shift 2
log="${WORK:-/tmp}/$label.log"
start=$SECONDS
"$@" >"$log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - start)) -lt "$bound" ]; do sleep 0.5; done
if kill -0 "$pid" 2>/dev/null; then
    echo "HANG $label after ${bound}s; stacks:"
    timeout 90 cuda-gdb -p "$pid" -batch -nx -ex "set pagination off" -ex "info cuda kernels" \
        -ex "thread apply all bt 25" -ex "detach" 2>&1 \
        | grep -vE "^\[New LWP|^Reading symbols|^warning: |No symbol table|Download failed|^\s*$" \
        | grep -E "^#|^Thread|Kernel|^\s+[0-9*]+ |Dev|Grid" | sed 's/^/   > /' | head -${DUMP_LINES:-220}
    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    echo "   last output:"; tail -6 "$log" | sed 's/^/   | /'
else
    wait "$pid"; rc=$?
    echo "rc=$rc $label $((SECONDS - start))s"
    [ $rc -ne 0 ] && tail -8 "$log" | sed 's/^/   | /'
fi
