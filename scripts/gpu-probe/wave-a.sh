#!/usr/bin/env bash
# Issue 29's GPU run, part A: the multi-rank test binaries with every rank on the one GPU,
# most important first, each bounded; stops starting new ones when the call's time runs out.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
end=$((SECONDS + ${BUDGET:-540}))
per="${PER:-100}"
nvidia-smi -L
bash gpu-bundle/unpack.sh || exit 1
for name in "$@"; do
    left=$((end - SECONDS))
    if [ "$left" -lt 15 ]; then echo "NOT STARTED (time) $name"; continue; fi
    t=$(( left < per ? left : per ))
    bash scripts/gpu-probe/shared-run.sh "$t" "$name"
done
