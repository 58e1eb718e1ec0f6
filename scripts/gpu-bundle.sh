#!/usr/bin/env bash
# Builds the GPU test bundle here and prints how to run it on the GPU machine.
#
# The GPU machine has no Rust toolchain, so everything is compiled here: the release test
# binaries of the workspace (unit and integration tests) and the release binaries and examples.
# They are copied, each once, with symbols and debug info stripped (a panic message keeps its
# file and line; run-tests.sh asks for no backtraces; the embedded PTX, about 1 MiB in every
# binary that links the library, is most of what is left), into the git-ignored folder
# `gpu-bundle/` together with
# `gpu-bundle/run-tests.sh`, which runs every test binary with
#   MSCCLPP_BACKEND=cuda NCCL_NVLS_ENABLE=0 <binary> --include-ignored --test-threads 1
# (one test at a time: on 2xH200 the channels and collectives binaries hung with the default
# parallel test threads and pass one test at a time; every multi-rank test uses all the GPUs,
# so likely two tests' kernels each held one GPU while waiting for their peer on the other)
# (so tests marked `#[ignore = "needs CUDA"]` run too), prints one PASS/FAIL line per binary and
# exits non-zero if any failed.
#
# Usage:
#   scripts/gpu-bundle.sh                  # the whole workspace
#   scripts/gpu-bundle.sh -p mscclpp-host  # only these packages (any `cargo test` selection)
#   scripts/gpu-bundle.sh -p mscclpp-tools # the tools (mscclpp-bench, …) and their tests
#
# Then run it with the `device` tool (`run`): carry ["gpu-bundle"], command
#   bash gpu-bundle/run-tests.sh [test-name filter] [-- extra test-binary args]
# The binaries travel packed (payload.tar.xz); run-tests.sh unpacks them first, and
# `bash gpu-bundle/unpack.sh` alone does it before running gpu-bundle/bin/* by hand.
# The repository is copied to the GPU machine as well; each binary runs in its package's
# directory with CARGO_MANIFEST_DIR set to it, as `cargo test` would: tests that read the
# repository's files find them there (mscclpp_test_support::package_dir), never at the build
# path, so the bundle runs from a copy of the repository at any path. Full logs go to $OUT/gpu-tests/ when $OUT is set.
#
# The Python package travels too: its release wheel (maturin, from the venv that
# scripts/test-python.sh makes) in gpu-bundle/python/, and gpu-bundle/run-python.sh, which puts
# it on PYTHONPATH there and runs python/tests (PyTorch tensors on CUDA, CUDA graphs, the CuPy
# kernel example; the CPU-backend tests too) and the CuPy example:
#   run(carry: ["gpu-bundle"], command: "bash gpu-bundle/run-python.sh")
# MSCCLPP_BUNDLE_PYTHON=0 leaves it out.
#
# The per-call harness (nccl/bench/percall.c, built here with cc) travels as bin/nccl-percall,
# with gpu-bundle/run-percall.sh, which times every collective at world size 1 with our
# drop-in and NVIDIA's libnccl.so.2 (from PyTorch's wheel) in one run and prints the table:
#   run(carry: ["gpu-bundle"], command: "bash gpu-bundle/run-percall.sh")
#
# Environment: MSCCLPP_BUNDLE_SYMBOLS="NAME ..." keeps the symbols (not the debug info) of the
# executables so named (e.g. "shared_gpu-test mscclpp-bench"), for stacks of a hang
# (scripts/gpu-probe/hang-dump.sh). MSCCLPP_BUNDLE_MAX_MIB (default 60) fails the build of a bigger bundle (the
# device tool carries at most 64 MiB).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bundle="$root/gpu-bundle"
max_mib="${MSCCLPP_BUNDLE_MAX_MIB:-60}"
if [ "$#" -gt 0 ]; then select=("$@"); else select=(--workspace); fi

command -v python3 >/dev/null || { echo "gpu-bundle: python3 is needed to read cargo's JSON" >&2; exit 1; }

# Reads cargo's JSON messages on stdin; prints "<kind>\t<package dir>\t<target name>\t<path>"
# for every executable: kind `test` for test harness binaries, `bin` for the rest; and kind
# `lib` for every shared library a `cdylib` target builds (the drop-in libnccl.so.2's tests
# load it from next to their binary).
list_executables() {
    python3 -c '
import json, os, sys
root = sys.argv[1]
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact":
        continue
    t = m["target"]
    if "cdylib" in t.get("crate_types", []):
        pkg_dir = os.path.relpath(os.path.dirname(m["manifest_path"]), root)
        if pkg_dir == "python":
            continue  # the Python extension travels as a wheel (below), not as a library
        for f in m.get("filenames", []):
            if f.endswith(".so"):
                print("\t".join(["lib", pkg_dir, os.path.basename(f), f]))
    if not m.get("executable"):
        continue
    kind = "test" if m["profile"]["test"] else "bin"
    pkg_dir = os.path.relpath(os.path.dirname(m["manifest_path"]), root)
    name = t["name"] + ("" if kind == "bin" else "-" + "-".join(t["kind"]))
    print("\t".join([kind, pkg_dir, name, m["executable"]]))
' "$root"
}

echo "gpu-bundle: building release test binaries (${select[*]})" >&2
tests_tsv="$(cargo test "${select[@]}" --release --no-run --message-format=json-render-diagnostics | list_executables)"
echo "gpu-bundle: building release binaries and examples" >&2
bins_tsv="$(cargo build "${select[@]}" --release --bins --examples --message-format=json-render-diagnostics | list_executables)"

rm -rf "$bundle"
mkdir -p "$bundle/tests" "$bundle/bin"
: >"$bundle/manifest.tsv"
# `cargo test --no-run` builds the binaries and examples too (integration tests run them), and
# the build pass reports the same files again: each executable is copied once. Two different
# files that would get one name in the bundle are an error, never a silent rename.
declare -A source_of=()
copy() { # kind pkg_dir name path
    local dest="$bundle/tests/$3"
    if [ "$1" = bin ]; then dest="$bundle/bin/$3"; fi
    # A shared library lies next to the test binaries that load it; the test and the build
    # passes report it at two paths (deps/ and its copy): the first is taken.
    local key="${dest#"$bundle"/}"
    if [ "$1" = lib ] && [ -n "${source_of[$key]:-}" ]; then return 0; fi
    if [ -n "${source_of[$key]:-}" ]; then
        [ "${source_of[$key]}" = "$4" ] && return 0
        echo "gpu-bundle: two executables would be $key: ${source_of[$key]} and $4 ($2); rename one target" >&2
        exit 1
    fi
    source_of[$key]="$4"
    cp "$4" "$dest"
    if [[ " ${MSCCLPP_BUNDLE_SYMBOLS:-} " == *" $3 "* ]]; then
        # Named to keep their symbols (a hang's stacks under cuda-gdb): only debug info goes.
        strip --strip-debug "$dest" 2>/dev/null || echo "gpu-bundle: could not strip $dest" >&2
    elif [ "$1" = lib ]; then
        strip --strip-unneeded "$dest" 2>/dev/null || echo "gpu-bundle: could not strip $dest" >&2
    else
        strip --strip-all "$dest" 2>/dev/null || echo "gpu-bundle: could not strip $dest" >&2
    fi
    printf '%s\t%s\t%s\n' "$1" "$2" "$key" >>"$bundle/manifest.tsv"
}
while IFS=$'\t' read -r kind pkg name path; do
    [ -n "$kind" ] && copy "$kind" "$pkg" "$name" "$path"
done <<<"$tests_tsv"$'\n'"$bins_tsv"

# libfabric (the Ofi transport's engine, loaded at run time) and the libraries it needs, so that
# the libfabric tests run on a GPU machine that has only the NVIDIA driver; run-tests.sh puts
# them on the library path. Without libfabric here those tests print NOT RUN there.
fabric=/usr/lib/x86_64-linux-gnu/libfabric.so.1
if [ -e "$fabric" ]; then
    mkdir -p "$bundle/lib"
    cp -L "$fabric" "$bundle/lib/libfabric.so.1"
    ldd "$fabric" | awk '$3 ~ /^\// {print $3}' | while read -r dep; do
        case "$(basename "$dep")" in
            libc.so*|libm.so*|libpthread.so*|libdl.so*|ld-linux*) ;;
            *) cp -L "$dep" "$bundle/lib/" ;;
        esac
    done
    echo "gpu-bundle: libfabric and $(($(ls "$bundle/lib" | wc -l) - 1)) libraries it needs in gpu-bundle/lib" >&2
else
    echo "gpu-bundle: no libfabric here ($fabric): its tests will print NOT RUN on the GPU machine" >&2
fi

# The per-call harness (nccl/bench/percall.c): plain C that opens the CUDA runtime and each
# libnccl.so.2 with dlopen, so the system cc builds it here without CUDA headers; it runs on
# the GPU machine through run-percall.sh (below).
if command -v cc >/dev/null; then
    cc -O2 -std=c11 -Wall -o "$bundle/bin/nccl-percall" "$root/nccl/bench/percall.c" -ldl
    printf 'bin\tnccl\tbin/nccl-percall\n' >>"$bundle/manifest.tsv"
else
    echo "gpu-bundle: no cc here: nccl-percall is left out (run-percall.sh compiles it there if it has cc)" >&2
fi
cat >"$bundle/run-percall.sh" <<'PERCALL'
#!/usr/bin/env bash
# The per-call cost of every collective at world size 1, ours against NVIDIA's libnccl.so.2
# from PyTorch's wheel, same binary, same run (issue 30 item 11; made by scripts/gpu-bundle.sh).
#   bash gpu-bundle/run-percall.sh [extra nccl-percall options, e.g. --dtypes float32,float16,bfloat16]
# JSON lines to $OUT/percall.jsonl (else /tmp), then a table of both and their ratio.
# NCCL_LIB=/path/libnccl.so.2 overrides where NVIDIA's library is looked for.
set -uo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$bundle")"
bash "$bundle/unpack.sh" || { echo "run-percall: cannot unpack $bundle/payload.tar.xz" >&2; exit 1; }
exe="$bundle/bin/nccl-percall"
if [ ! -x "$exe" ]; then
    exe=/tmp/nccl-percall
    cc -O2 -std=c11 -o "$exe" "$root/nccl/bench/percall.c" -ldl || exit 1
fi
ours="$bundle/tests/libmscclpp_nccl.so"
theirs="${NCCL_LIB:-}"
if [ -z "$theirs" ]; then
    theirs="$(python3 - <<'PY' 2>/dev/null
import glob, os
dirs = []
try:
    import nvidia.nccl
    dirs += list(nvidia.nccl.__path__)
except Exception:
    pass
try:
    import torch
    dirs.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
for d in dirs:
    hits = sorted(glob.glob(os.path.join(d, "**", "libnccl.so*"), recursive=True))
    if hits:
        print(hits[0])
        break
PY
)"
fi
[ -n "$theirs" ] || { echo "run-percall: NVIDIA's libnccl.so.2 not found (set NCCL_LIB)" >&2; exit 1; }
echo "run-percall: ours $ours; NVIDIA's $theirs" >&2
out="${OUT:-/tmp}/percall.jsonl"
command -v nvidia-smi >/dev/null && nvidia-smi -L >&2
MSCCLPP_BACKEND=cuda NCCL_NVLS_ENABLE=0 "$exe" --lib "nccl=$theirs" --lib "ours=$ours" "$@" | tee "$out"
rc=${PIPESTATUS[0]}
python3 "$root/scripts/percall-table.py" "$out"
exit "$rc"
PERCALL
chmod +x "$bundle/run-percall.sh"

cat >"$bundle/run-tests.sh" <<'RUNNER'
#!/usr/bin/env bash
# Runs every test binary of this bundle on the CUDA backend (made by scripts/gpu-bundle.sh).
#   bash gpu-bundle/run-tests.sh [filter] [-- args for every test binary]
# Prints one PASS/FAIL line per binary (and the tail of each failing log) and exits non-zero if
# any binary failed. Full logs go to $OUT/gpu-tests/ when $OUT is set, else to /tmp.
# MSCCLPP_TEST_TIMEOUT (seconds per binary, default 300) bounds each run.
set -uo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$bundle")"
bash "$bundle/unpack.sh" || { echo "run-tests: cannot unpack $bundle/payload.tar.xz" >&2; exit 1; }
filter=()
extra=()
while [ "$#" -gt 0 ]; do
    if [ "$1" = "--" ]; then shift; extra=("$@"); break; fi
    filter+=("$1"); shift
done
logs="${OUT:-/tmp}/gpu-tests"
mkdir -p "$logs"
export MSCCLPP_BACKEND=cuda NCCL_NVLS_ENABLE=0
# Ranks sharing a GPU (MSCCLPP_RANKS_PER_GPU) need more of the driver's work queues than its
# default 8 (mscclpp::collectives::WANTED_CONNECTIONS).
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
if [ -d "$bundle/lib" ]; then
    export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export MSCCLPP_OFI_LIBRARY="$bundle/lib/libfabric.so.1"
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
pass=0; fail=0; failed=(); notrun_total=0
while IFS=$'\t' read -r kind pkg file; do
    [ "$kind" = test ] || continue
    name="$(basename "$file")"
    dir="$root/$pkg"; [ -d "$dir" ] || dir="$bundle"
    start=$SECONDS
    ( cd "$dir" && CARGO_MANIFEST_DIR="$dir" timeout "${MSCCLPP_TEST_TIMEOUT:-300}" \
        "$bundle/$file" --include-ignored --test-threads 1 --nocapture "${filter[@]}" "${extra[@]}" ) >"$logs/$name.log" 2>&1
    rc=$?
    summary="$(grep -E '^test result:' "$logs/$name.log" | tail -1)"
    # Tests that need more GPUs than this machine has pass after printing NOT RUN (the test
    # harness shows it with --nocapture): counted and named here, never taken for a run.
    notrun="$(grep -c 'NOT RUN' "$logs/$name.log" || true)"
    notrun_total=$((notrun_total + notrun))
    note=""; [ "$notrun" -gt 0 ] && note=" [$notrun NOT RUN]"
    if [ "$rc" -eq 0 ]; then
        pass=$((pass + 1)); echo "PASS $name ($((SECONDS - start)) s) ${summary#test result: }$note"
        grep -o 'NOT RUN: .*' "$logs/$name.log" | head -5 | sed 's/^/    /'
    else
        fail=$((fail + 1)); failed+=("$name")
        echo "FAIL $name (exit $rc, $((SECONDS - start)) s) ${summary#test result: }"
        grep -E '^test .* FAILED$|^---- ' "$logs/$name.log" | head -20 | sed 's/^/    /'
        tail -n 40 "$logs/$name.log" | sed 's/^/    | /'
    fi
done <"$bundle/manifest.tsv"
echo "gpu-tests: $pass passed, $fail failed${failed[*]:+ (${failed[*]})}; $notrun_total tests printed NOT RUN (too few GPUs); logs in $logs"
[ "$fail" -eq 0 ]
RUNNER
chmod +x "$bundle/run-tests.sh"

if [ "${MSCCLPP_BUNDLE_PYTHON:-1}" != 0 ]; then
    venv="$(bash "$root/scripts/test-python.sh" --venv)"
    echo "gpu-bundle: building the Python package's release wheel" >&2
    "$venv/bin/maturin" build --release --strip --locked -m "$root/python/Cargo.toml" \
        --out "$bundle/python" >&2
    cat >"$bundle/run-python.sh" <<'PYRUNNER'
#!/usr/bin/env bash
# Runs the Python package's tests and the CuPy example on the GPU machine (made by
# scripts/gpu-bundle.sh): the wheel is unpacked into /tmp/mscclpp-site (no pip install: nothing
# is fetched there), then pytest runs python/tests and the package's docstring examples, then
# python/examples/cupy_ping_pong.py. Extra arguments go to pytest. Logs in $OUT/python-tests/.
# With one GPU, worlds of two ranks on CUDA need MSCCLPP_RANKS_PER_GPU=2 (both ranks on
# device 0); without it the CUDA tests use one rank.
set -uo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$bundle")"
site=/tmp/mscclpp-site
rm -rf "$site" && mkdir -p "$site"
wheel="$(ls "$bundle"/python/mscclpp_rs-*.whl | head -n1)"
python3 -m zipfile -e "$wheel" "$site" || { echo "run-python: cannot unpack $wheel" >&2; exit 1; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
logs="${OUT:-/tmp}/python-tests"
mkdir -p "$logs"
command -v nvidia-smi >/dev/null && nvidia-smi -L
python3 -c 'import torch, mscclpp_rs; print("torch", torch.__version__, "GPUs", torch.cuda.device_count(), "mscclpp_rs", mscclpp_rs.__version__, mscclpp_rs.device_count())'
rc=0
(cd /tmp && python3 -m pytest -q -rs -p no:cacheprovider "$root/python/tests" "$@") 2>&1 | tee "$logs/pytest.log" || rc=1
(cd /tmp && MSCCLPP_BACKEND=cpu python3 -m pytest -q -p no:cacheprovider --doctest-modules --pyargs mscclpp_rs) 2>&1 | tee "$logs/doctests.log" || rc=1
python3 "$root/python/examples/cupy_ping_pong.py" 2>&1 | tee "$logs/cupy_ping_pong.log" || rc=1
echo "run-python: $([ "$rc" = 0 ] && echo passed || echo FAILED); logs in $logs"
exit "$rc"
PYRUNNER
    chmod +x "$bundle/run-python.sh"
fi

# The device tool carries at most 64 MiB, and the stripped binaries are several times that
# (each holds the embedded PTX and the library): they travel as one xz archive (the binaries
# share most of their bytes, so it packs them about 10x), unpacked on the GPU machine by
# unpack.sh (tar, or Python's tarfile where tar has no xz), which run-tests.sh calls first.
loose_kib="$(du -sk "$bundle" | cut -f1)"
parts=(manifest.tsv)
for d in tests bin lib; do [ -d "$bundle/$d" ] && parts+=("$d"); done
XZ_OPT="-6 -T0" tar -C "$bundle" -cJf "$bundle/payload.tar.xz" "${parts[@]}"
rm -rf "$bundle/tests" "$bundle/bin" "$bundle/lib"
cat >"$bundle/unpack.sh" <<'UNPACK'
#!/usr/bin/env bash
# Unpacks payload.tar.xz next to this script (tests/, bin/, lib/), once: afterwards
# gpu-bundle/bin/mscclpp-bench and the other binaries are there. Made by scripts/gpu-bundle.sh.
set -euo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
[ -f "$bundle/.unpacked" ] && exit 0
if tar --version >/dev/null 2>&1 && command -v xz >/dev/null; then
    tar -C "$bundle" -xJf "$bundle/payload.tar.xz"
else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$bundle/payload.tar.xz" "$bundle"
fi
touch "$bundle/.unpacked"
UNPACK
chmod +x "$bundle/unpack.sh"

size_kib="$(du -sk "$bundle" | cut -f1)"
echo "gpu-bundle: $(grep -c '^test' "$bundle/manifest.tsv") test binaries, $(grep -c '^bin' "$bundle/manifest.tsv") other binaries, $((loose_kib / 1024)) MiB packed into $((size_kib / 1024)) MiB in gpu-bundle/" >&2
if [ "$size_kib" -gt $((max_mib * 1024)) ]; then
    echo "gpu-bundle: the bundle is over ${max_mib} MiB; the device tool carries at most 64 MiB" >&2
    exit 1
fi
cat <<EOF
Run it on the GPU machine with the device tool:
  run(carry: ["gpu-bundle"], command: "bash gpu-bundle/run-tests.sh")
  (a filter: "bash gpu-bundle/run-tests.sh gpu::cuda"; extra test args after "--")
  run(carry: ["gpu-bundle"], command: "bash gpu-bundle/run-python.sh")   # the Python package
  run(carry: ["gpu-bundle"], command: "bash gpu-bundle/run-percall.sh")   # per-call cost vs NCCL
EOF
