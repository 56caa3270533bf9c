#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests. `--all-targets` also builds
# the examples and runs each criterion bench once in its test mode (no timing, never fails on a
# number), so benches cannot rot; the load benchmark (scripts/bench-load.sh) is not run here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets --no-fail-fast
