#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests. `--all-targets` also builds
# the examples and runs each criterion bench once in its test mode (no timing, never fails on a
# number), so benches cannot rot; the load benchmark (scripts/bench-load.sh) is not run here.
#
# Everything runs with --all-features, so the etcd ledger (the `etcd` feature) and its tests
# (tests/etcd_*.rs, the etcd cases of ledger_contract and in_cluster) are always built and run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
cargo fmt --all -- --check
# The default build (the README's `cargo run --release -- serve`) needs only the Rust
# toolchain: protoc is needed by etcd-client's build script alone, which only the `etcd`
# feature pulls in. Checked (and linted) in a target dir of its own with protoc made
# unfindable, so that build-script output from a protoc build cannot hide a regression
# (about 3 min cold on 2 cores: every dependency checked once more, without etcd-client).
PROTOC=/nonexistent/protoc cargo clippy --lib --bins --target-dir target/no-protoc -- -D warnings
# The one test that only a build without the feature can run: `--ledger etcd` says how to get it.
PROTOC=/nonexistent/protoc cargo test --target-dir target/no-protoc --test operate \
  -- --exact a_build_without_etcd_says_how_to_get_it
cargo clippy --all-targets --all-features -- -D warnings
cargo test --all-targets --all-features --no-fail-fast
