#!/usr/bin/env bash
# Runs chosen test binaries of gpu-bundle/ with every rank on the one GPU (issue 29's mode).
#   bash scripts/gpu-probe/shared-run.sh SECONDS_PER_BINARY NAME... (NAME: a test binary, e.g. collectives-test)
set -u
per="$1"; shift
root="$(cd "$(dirname "$0")/../.." && pwd)"
bundle="$root/gpu-bundle"
bash "$bundle/unpack.sh" || exit 1
export MSCCLPP_BACKEND=cuda NCCL_NVLS_ENABLE=0 MSCCLPP_RANKS_PER_GPU="${MSCCLPP_RANKS_PER_GPU:-8}"
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
[ -d "$bundle/lib" ] && export LD_LIBRARY_PATH="$bundle/lib" MSCCLPP_OFI_LIBRARY="$bundle/lib/libfabric.so.1"
logs="${OUT:-/tmp}/gpu-tests"; mkdir -p "$logs"
for name in "$@"; do
    line="$(awk -F'\t' -v n="tests/$name" '$1=="test" && $3==n' "$bundle/manifest.tsv")"
    [ -n "$line" ] || { echo "MISSING $name"; continue; }
    pkg="$(echo "$line" | cut -f2)"; dir="$root/$pkg"
    start=$SECONDS
    ( cd "$dir" && CARGO_MANIFEST_DIR="$dir" timeout "$per" "$bundle/tests/$name" --include-ignored --test-threads 1 --nocapture ) >"$logs/$name.log" 2>&1
    rc=$?
    sum="$(grep -E '^test result:' "$logs/$name.log" | tail -1)"
    nr="$(grep -c 'NOT RUN' "$logs/$name.log")"
    echo "$([ $rc -eq 0 ] && echo PASS || echo "FAIL($rc)") $name $((SECONDS-start))s ${sum#test result: } [$nr NOT RUN]"
    if [ $rc -ne 0 ]; then grep -E '^test .* (FAILED|ok)$' "$logs/$name.log" | grep FAILED | head -8 | sed 's/^/   /'; grep -E "panicked|Error|error" "$logs/$name.log" | head -6 | sed 's/^/   | /'; fi
done
