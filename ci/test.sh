#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every crate's tests (unit, model-based,
# crash, corruption, bad-input and end-to-end). Installs what the tests need first.
# Random tests print their seed on failure; rerun one with SLUICE_SEED=<seed>.
set -euo pipefail
cd "$(dirname "$0")/.."

ci/install-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test"
cargo test --workspace
