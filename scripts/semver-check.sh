#!/usr/bin/env bash
# Compares the public Rust API of the library crates with a baseline release (default: the
# v0.1.0 tag) using cargo-semver-checks, and names every breaking change it finds. Not part of
# CI (it builds the rustdoc of every crate twice: minutes). A break it reports is a decision:
# record it in CHANGELOG.md ("Unreleased", with a migration line) in the same commit.
#
#   bash scripts/semver-check.sh                 # against v0.1.0
#   SEMVER_BASELINE=<tag or commit> bash scripts/semver-check.sh
#   bash scripts/semver-check.sh --verbose       # more arguments go to cargo semver-checks
#
# Needs cargo-semver-checks: cargo install --locked cargo-semver-checks
# (the C ABI of the drop-in libnccl.so.2 is checked by nccl/tests/abi.rs, not here).
set -euo pipefail
cd "$(dirname "$0")/.."

baseline="${SEMVER_BASELINE:-v0.1.0}"
if ! command -v cargo-semver-checks >/dev/null; then
    echo "semver-check: cargo-semver-checks is not installed; install it with" >&2
    echo "    cargo install --locked cargo-semver-checks" >&2
    exit 2
fi
if ! git rev-parse -q --verify "$baseline^{commit}" >/dev/null; then
    echo "semver-check: no $baseline in this clone (git fetch --tags, or set SEMVER_BASELINE)" >&2
    exit 2
fi

# The library crates (the tools, the drop-in library and the test support are not a Rust API
# anyone depends on). The API does not depend on the device PTX: skip building it, on both
# sides.
crates=(mscclpp-shared mscclpp-device mscclpp-host mscclpp-build mscclpp-log mscclpp)
export MSCCLPP_SKIP_PTX=1
args=()
for c in "${crates[@]}"; do args+=(--package "$c"); done
echo "semver-check: ${crates[*]} against $baseline ($(git rev-parse --short "$baseline^{commit}"))" >&2
cargo semver-checks check-release "${args[@]}" --baseline-rev "$baseline" "$@"
