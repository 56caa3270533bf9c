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
# The binary install of docs/install.md, `cargo install --locked --path .` with `--features
# etcd` and without (protoc made unfindable, as a user without it runs it), each installed
# binary run. --debug into target/: the second reuses all but the crates the feature changes.
# Warm, this block takes about 6 s; cold, about 4 CPU-minutes on top of the test build, whose
# dependencies resolve other features (the dev-dependencies'), so it cannot share them.
install_root=$(mktemp -d)
trap 'rm -rf "$install_root"' EXIT
cargo install --locked --offline --path . --debug --quiet --features etcd \
  --target-dir target --root "$install_root/etcd"
"$install_root/etcd/bin/ip-webhook" --version
PROTOC=/nonexistent/protoc cargo install --locked --offline --path . --debug --quiet \
  --target-dir target --root "$install_root/default"
"$install_root/default/bin/ip-webhook" --version
# docs/install.md's next step: the plugin link next to the binary, found by real kubectl.
PATH="$install_root/etcd/bin:$PATH" "$install_root/etcd/bin/ip-webhook" plugin install
PATH="$install_root/etcd/bin:$PATH" .tools/kubectl ipw --help >/dev/null
cargo test --all-targets --all-features --no-fail-fast
