#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests, benches compile.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets
