#!/usr/bin/env bash
# Mutation testing: cargo-mutants breaks one line at a time of the files where a wrong line means
# wrong data or a hang, and runs the tests that cover that file; a mutant no test fails is
# "missed". CPU backend only. Not part of CI (hours, not minutes; see RELIABILITY.md).
#
#   bash scripts/mutants.sh                      # every file of DEFAULT_FILES below
#   bash scripts/mutants.sh device/src/copy.rs 'device/src/collectives/*.rs'
#
# Writes the run's record, one compact file (scripts/mutants-record.py): $MUTANTS_RECORD,
# default benchmarks/mutants/run-<date>.md: the summary (one row per file: mutants, caught,
# missed, timeout, unviable, score, minutes, tests) and every mutant's outcome. The raw output
# stays out of the repository, under $MUTANTS_OUT (default target/mutants-out/run-<date>):
#   <file>/{caught,missed,unviable,timeout}.txt and outcomes.json   (cargo-mutants' own lists)
#   <file>/run.log, baseline.log, summary.md
#
# What keeps it finite:
#   MSCCLPP_SKIP_PTX=1         the root build.rs embeds an empty PTX instead of recompiling
#                              device/ for nvptx64 after every device mutant
#   MSCCLPP_SPIN_TIMEOUT_MS    every device wait of the CPU backend gives up after this long
#                              (default here 20000), so a mutant that loses a signal fails in
#                              seconds instead of after the iteration limit (days on the host)
#   per-file test selection    only the test binaries that exercise the file (tests_for below)
#   MUTANTS_TIMEOUT            seconds one mutant's tests may run (default 300)
#   MUTANTS_JOBS               mutants built and tested at once (default 1: 2 cores)
#   CARGO_TARGET_DIR           default target/mutants: dependencies are built once and reused
#   MUTANTS_TESTS              "packages|cargo test arguments" for every file of this run,
#                              instead of tests_for's choice (e.g. a quicker subset)
#   MUTANTS_SRC                the working copy (default target/mutants-src): two runs at once
#                              need one each (and a CARGO_TARGET_DIR each)
#   MUTANTS_ONLY               an earlier run's record (benchmarks/mutants/*.md: its missed
#                              mutants) or a file of mutant names, one a line as in missed.txt:
#                              test only those of each file (re-testing what a run missed)
#
# cargo-mutants leaves `unsafe fn` bodies alone, and the device's data movers are `unsafe fn`
# (copy, the packet and LL128 line accessors, the direct kernel's loads): so the run works on
# a copy of the tree (target/mutants-src, what git tracks plus untracked files it does not
# ignore) in which the files under test have `unsafe fn` turned into `fn`. Their bodies
# already wrap every unsafe operation in `unsafe {}` (the workspace denies
# unsafe_op_in_unsafe_fn), so the copy compiles the same code; callers' `unsafe {}` blocks
# just become unused (lints are capped).
set -euo pipefail
cd "$(dirname "$0")/.."

# The files where a wrong line means wrong data or a hang: the one place this list lives.
DEFAULT_FILES=(
  device/src/copy.rs
  device/src/reduce.rs
  device/src/reduce/convert.rs
  device/src/packet.rs
  device/src/ll128.rs
  device/src/fifo.rs
  'device/src/collectives/*.rs'
  host/src/fifo.rs
  host/src/proxy.rs
  shared/src/trigger.rs
  'host/src/registered_memory/*.rs'
)

# The tests that exercise a file, as "packages|cargo test arguments" (the packages whose tests
# run; the arguments select their test targets).
tests_for() {
  case "$1" in
    device/src/copy.rs) echo "mscclpp|--test runtime --test channels --test collectives" ;;
    # The conversions are checked code by code by the device crate's unit tests
    # (reduce/tests.rs); the reductions binary would rebuild the root crate per mutant.
    device/src/reduce/convert.rs) echo "mscclpp-device|--lib" ;;
    # Every type x operator on edge values in the device crate's unit tests; the reductions
    # binary (every algorithm on 2-3 ranks) would rebuild the root crate per mutant.
    device/src/reduce.rs) echo "mscclpp-device|--lib" ;;
    device/src/packet.rs) echo "mscclpp-device,mscclpp|--lib --test channels --test collectives" ;;
    # The line protocol's unit tests (host build: emulated lanes); the GPU's whole-line path
    # is the collectives' (and the GPU bundle's) to test.
    device/src/ll128.rs) echo "mscclpp-device|--lib" ;;
    device/src/fifo.rs) echo "mscclpp|--test runtime --test channels" ;;
    # The kernels on the grid emulator, every rank in one process (collectives/tests): the
    # root crate's collectives binary would rebuild it for every mutant (2-4 minutes each).
    device/src/collectives/*) echo "mscclpp-device|--lib -- collectives::tests" ;;
    # The host crate's FIFO and proxy unit tests (producers on host threads, the sticky error,
    # stop and drop); the channels binary would rebuild the root crate per mutant.
    host/src/fifo.rs | host/src/proxy.rs) echo "mscclpp-host|--lib" ;;
    # The layout and its checks: the shared crate's unit tests and the proxy's validator
    # against an independent oracle. (The channels binary would rebuild the root crate for
    # every mutant, minutes each, and a layout slip shows in these first.)
    shared/src/trigger.rs) echo "mscclpp-shared,mscclpp-host|--lib --test trigger_properties" ;;
    # The host crate's own tests that register, send, decode and write into memories (the
    # root crate's channels/collectives would rebuild it for every mutant, minutes each).
    host/src/registered_memory/*)
      echo "mscclpp-host|--lib --test wire_properties --test semaphores --test ethernet" ;;
    *) echo "mscclpp|--tests" ;;
  esac
}

# The package a file belongs to (cargo-mutants mutates one package's files at a time).
package_of() {
  case "$1" in
    device/*) echo mscclpp-device ;;
    host/*) echo mscclpp-host ;;
    shared/*) echo mscclpp-shared ;;
    builder/*) echo mscclpp-build ;;
    *) echo mscclpp ;;
  esac
}

if ! command -v cargo-mutants >/dev/null; then
  echo "mutants: installing cargo-mutants (cargo install --locked cargo-mutants)"
  cargo install --locked cargo-mutants
fi

run="run-$(date +%Y-%m-%d)"
out="${MUTANTS_OUT:-target/mutants-out/$run}"
record="${MUTANTS_RECORD:-benchmarks/mutants/$run.md}"
mkdir -p "$out" "$(dirname "$record")"
out=$(cd "$out" && pwd)
record="$(cd "$(dirname "$record")" && pwd)/$(basename "$record")"
# MUTANTS_ONLY: a record's missed mutants, or a list of names as it is.
only_list=""
if [ -n "${MUTANTS_ONLY:-}" ]; then
  only_list="$out/only.txt"
  case "$MUTANTS_ONLY" in
    *.md) python3 scripts/mutants-record.py names "$MUTANTS_ONLY" missed >"$only_list" ;;
    *) cp "$MUTANTS_ONLY" "$only_list" ;;
  esac
fi
export MSCCLPP_BACKEND=cpu
export MSCCLPP_SKIP_PTX=1
export MSCCLPP_SPIN_TIMEOUT_MS="${MSCCLPP_SPIN_TIMEOUT_MS:-20000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/mutants}"
# Mutants must build even where a lint would deny them; the same flags for the baseline and
# every mutant, so that neither rebuilds the other's dependencies.
export CARGO_ENCODED_RUSTFLAGS=--cap-lints=warn
timeout_s="${MUTANTS_TIMEOUT:-300}"
jobs="${MUTANTS_JOBS:-1}"

globs=("$@")
[ "${#globs[@]}" -gt 0 ] || globs=("${DEFAULT_FILES[@]}")
files=()
for g in "${globs[@]}"; do
  # shellcheck disable=SC2206 # the glob is meant to expand here
  matched=($g)
  for f in "${matched[@]}"; do
    if [ -f "$f" ]; then files+=("$f"); else echo "mutants: no file matches $g" >&2; exit 2; fi
  done
done

# The working copy (see the top of this file).
src="${MUTANTS_SRC:-$PWD/target/mutants-src}"
rm -rf "$src"
mkdir -p "$src"
git ls-files -co --exclude-standard -z -- ':!benchmarks/mutants' | xargs -0 cp --parents -t "$src"
for f in "${files[@]}"; do
  sed -i -E 's/\bunsafe fn\b/fn/g' "$src/$f"
done

for f in "${files[@]}"; do
  spec=${MUTANTS_TESTS:-$(tests_for "$f")}
  pkgs=${spec%%|*}
  read -r -a args <<<"${spec#*|}"
  # MUTANTS_ONLY: this file's names, each as an exact regex (cargo-mutants' --re).
  only=()
  if [ -n "$only_list" ]; then
    while IFS= read -r m; do
      only+=(--re "^$(python3 -c 'import re, sys; print(re.escape(sys.argv[1]))' "$m")\$")
    done < <(grep -F "$f:" "$only_list" || true)
    if [ "${#only[@]}" -eq 0 ]; then
      echo "mutants: $f: none of its mutants is named in $MUTANTS_ONLY; skipped"
      continue
    fi
  fi
  dir="$out/${f//\//_}"
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ "${#only[@]}" -gt 0 ]; then echo $((${#only[@]} / 2)) >"$dir/only"; fi
  echo "mutants: $f (tests: $pkgs ${args[*]}; log: $dir/run.log)"
  start=$(date +%s)
  # Exit status 2 means "some mutants were missed", 3 "some timed out": results, not failures.
  status=0
  echo "$pkgs ${args[*]}" >"$dir/tests"
  # One job works in place; several need a copy each.
  if [ "$jobs" -eq 1 ]; then where=(--in-place); else where=(--jobs "$jobs"); fi
  test_pkgs=()
  cargo_pkgs=()
  for p in ${pkgs//,/ }; do
    test_pkgs+=(--test-package "$p")
    cargo_pkgs+=(--package "$p")
  done
  # The target selectors (`--lib --test x`) go to every cargo call, so that a mutant builds
  # only those test binaries; what follows `--` goes to the test harness.
  targets=()
  harness=()
  seen_sep=0
  for a in "${args[@]}"; do
    if [ "$seen_sep" -eq 1 ]; then harness+=("$a")
    elif [ "$a" = "--" ]; then seen_sep=1
    else targets+=("$a"); fi
  done
  cargo_args=()
  for a in "${targets[@]}"; do cargo_args+=("--cargo-arg=$a"); done
  # The baseline: cargo-mutants' own tests the mutated package only (not --test-package's), so
  # it runs here, on the unmutated working copy, with the same tests.
  if ! (cd "$src" && cargo test "${cargo_pkgs[@]}" "${args[@]}") >"$dir/baseline.log" 2>&1; then
    echo "mutants: the tests fail on the unmutated tree; see $dir/baseline.log" >&2
    tail -n 30 "$dir/baseline.log" >&2
    exit 1
  fi
  cargo mutants --dir "$src" "${where[@]}" --package "$(package_of "$f")" --file "$f" \
    "${test_pkgs[@]}" "${cargo_args[@]}" --baseline skip --timeout "$timeout_s" \
    --cap-lints false --no-shuffle ${only[@]+"${only[@]}"} --output "$dir" \
    -- ${harness[@]+--} "${harness[@]}" \
    >"$dir/run.log" 2>&1 || status=$?
  echo "$(( $(date +%s) - start ))" >"$dir/seconds"
  echo "$f" >"$dir/file"
  if [ "$status" -ne 0 ] && [ "$status" -ne 2 ] && [ "$status" -ne 3 ]; then
    echo "mutants: cargo-mutants failed on $f (exit $status); the end of $dir/run.log:" >&2
    tail -n 30 "$dir/run.log" >&2
    exit 1
  fi
  # Keep the outcome lists; drop the per-mutant logs and the copied tree (large).
  for k in caught.txt missed.txt unviable.txt timeout.txt outcomes.json; do
    if [ -f "$dir/mutants.out/$k" ]; then cp "$dir/mutants.out/$k" "$dir/"; fi
  done
  rm -rf "$dir/mutants.out"
  # outcomes.json: one line per mutant (name, outcome, build and test seconds), not the
  # argument lists and paths cargo-mutants writes for each (0.5 MB for 300 mutants).
  if [ -f "$dir/outcomes.json" ]; then
    python3 - "$dir/outcomes.json" <<'EOF_COMPACT'
import json, sys
p = sys.argv[1]
d = json.load(open(p))
rows = []
for o in d["outcomes"]:
    sc = o["scenario"]
    name = sc["Mutant"]["name"] if isinstance(sc, dict) and "Mutant" in sc else str(sc)
    secs = {r["phase"].lower(): round(r["duration"], 1) for r in o.get("phase_results", [])}
    rows.append({"mutant": name, "outcome": o["summary"], "seconds": secs})
head = {k: d.get(k) for k in ("cargo_mutants_version", "start_time", "end_time")}
with open(p, "w") as f:
    f.write(json.dumps(head)[:-1] + ', "outcomes": [\n')
    f.write(",\n".join(json.dumps(r) for r in rows))
    f.write("\n]}\n")
EOF_COMPACT
  fi
  # A log over 1 MB is cut to its last 200 lines.
  if [ "$(stat -c %s "$dir/run.log")" -gt 1000000 ]; then
    tail -n 200 "$dir/run.log" >"$dir/run.log.tail" && mv "$dir/run.log.tail" "$dir/run.log"
  fi
done

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = []
for d in sorted(os.listdir(out)):
    p = os.path.join(out, d)
    if not os.path.isdir(p):
        continue
    def count(k):
        f = os.path.join(p, k + ".txt")
        return sum(1 for l in open(f) if l.strip()) if os.path.exists(f) else 0
    c, m, u, t = (count(k) for k in ("caught", "missed", "unviable", "timeout"))
    secs = int(open(os.path.join(p, "seconds")).read()) if os.path.exists(os.path.join(p, "seconds")) else 0
    viable = c + m + t
    # A timeout is a hang the tests turned into a failure: caught.
    score = f"{100 * (c + t) / viable:.0f}%" if viable else "-"
    name = open(os.path.join(p, "file")).read().strip() if os.path.exists(os.path.join(p, "file")) else d
    tests = open(os.path.join(p, "tests")).read().strip() if os.path.exists(os.path.join(p, "tests")) else ""
    if os.path.exists(os.path.join(p, "only")):
        name += f" (only the {open(os.path.join(p, 'only')).read().strip()} named in MUTANTS_ONLY)"
    rows.append((name, c + m + u + t, c, m, u, t, score, secs, tests))
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("| file | mutants | caught | missed | unviable | timeout | caught of viable | minutes | tests run |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
    for r in rows:
        f.write(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7] / 60:.0f} | `{r[8]}` |\n")
print(open(os.path.join(out, "summary.md")).read())
EOF
python3 scripts/mutants-record.py write "$out" "$record" --title "$(basename "$record" .md)"
echo "mutants: the run's record is $record (raw output in $out)"
