#!/usr/bin/env bash
# The Python package (python/, module mscclpp_rs), as CI checks it on a machine without a GPU:
#   1. a venv under target/ (git-ignored) with pinned maturin, pytest, NumPy, mypy and NVIDIA's
#      NVRTC wheel (it compiles the CuPy example's kernels without a GPU); reused while the pins
#      stay the same;
#   2. the abi3 wheel built by maturin in the dev profile, sharing target/debug with the
#      workspace build (only PyO3 and the extension are compiled again), installed in the venv;
#   3. mypy --strict over the package, its tests and examples, and mypy's stubtest of the
#      extension module's stubs (mscclpp_rs/_native.pyi) against the module itself;
#   4. pytest on the CPU backend: python/tests and the package's docstring examples.
# `bash scripts/test-python.sh` runs it alone; scripts/test.sh runs it last (after the cargo
# tests, so PyO3's build for the extension happens once). `--venv` only makes the venv and
# prints its path (scripts/gpu-bundle.sh builds the release wheel with its maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/python-venv
pins=(maturin==1.16.0 pytest==9.2.0 numpy==2.4.6 mypy==2.4.1 "nvidia-cuda-nvrtc==13.0.88")
stamp="$venv/.mscclpp-pins"

fail() {
  echo "test-python: FAILED: $*" >&2
  exit 1
}

command -v python3 >/dev/null || fail "python3 is missing"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
  echo "test-python: installing ${pins[*]} into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" || fail "could not create the venv $venv (python3 -m venv)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2 ||
    fail "could not install ${pins[*]} with pip"
  printf '%s' "${pins[*]}" >"$stamp"
fi
if [ "${1:-}" = --venv ]; then
  echo "$PWD/$venv"
  exit 0
fi

wheels=target/wheels/python
rm -rf "$wheels"
"$venv/bin/maturin" build --profile dev --locked -m python/Cargo.toml --out "$wheels" ||
  fail "maturin could not build the wheel"
wheel=$(compgen -G "$wheels/mscclpp_rs-*-cp39-abi3-*.whl" | head -n1) ||
  fail "no abi3 wheel in $wheels"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
  --no-deps "$wheel" || fail "could not install $wheel"

(cd python && "../$venv/bin/mypy" mscclpp_rs tests examples) || fail "mypy"
# stubtest imports the installed package: run it away from python/ (whose mscclpp_rs/ has no
# extension module in it).
(cd target && "../$venv/bin/python" -m mypy.stubtest mscclpp_rs._native) || fail "stubtest"

# From target/ too, so that `import mscclpp_rs` is the installed wheel. -rs prints every test
# that did not run, with its reason (NOT RUN: …). The docstring examples run on their own (with
# --doctest-modules over tests/ pytest would import every test file twice).
(cd target && MSCCLPP_BACKEND=cpu "../$venv/bin/pytest" -q -rs -p no:cacheprovider \
  "$PWD/../python/tests") || fail "pytest"
(cd target && MSCCLPP_BACKEND=cpu "../$venv/bin/pytest" -q -rs -p no:cacheprovider \
  --doctest-modules --pyargs mscclpp_rs) || fail "the docstring examples (pytest --doctest-modules)"
