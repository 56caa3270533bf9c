#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests. `--all-targets` also builds
# the examples and runs each criterion bench once in its test mode (no timing, never fails on a
# number), so benches cannot rot; the load benchmark (scripts/bench-load.sh) is not run here.
#
# Everything runs with --all-features, so the etcd ledger (the `etcd` feature) and its tests
# (tests/etcd_*.rs, the etcd cases of ledger_contract and in_cluster) are always built and run.
#
# Each step says its name and how long it takes on a 2-core machine from a fresh clone (cold:
# an empty target/) and again (warm), then how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=7 step_number=0 step_name='' step_started=$SECONDS suite_started=$SECONDS
# step NAME COLD AGAIN: the previous step's time, then this one's name and expected durations
# (measured on 2 cores shared with other builds, load 4 to 5; less on an idle machine)
step() {
  finish_step
  step_number=$((step_number + 1)) step_name=$1 step_started=$SECONDS
  echo "==> [$step_number/$steps] $step_name (about $2 cold, $3 again)" >&2
}
finish_step() {
  [ -z "$step_name" ] || echo "    $step_name: $((SECONDS - step_started)) s" >&2
}
# A build that stops on a full disk says so in cargo's error alone; the disk's state and
# target/'s size, printed on any failure, tell that case from the others at a glance.
trap 'finish_step; echo "==> the suite stopped at step $step_number ($step_name) after $((SECONDS - suite_started)) s" >&2
  df -h . >&2; du -sh target 2>/dev/null >&2 || true' ERR

step "test tools: apt packages (as root), Python tools, helm and kubectl into .tools/" \
  "15 s plus apt-get" "1 s"
bash scripts/install-test-deps.sh
step "cargo fmt --check" "2 s" "2 s"
cargo fmt --all -- --check
step "clippy of the default build without protoc (target/no-protoc)" "2 min" "1 s"
# The default build (the README's `cargo run --release -- serve`) needs only the Rust
# toolchain: protoc is needed by etcd-client's build script alone, which only the `etcd`
# feature pulls in. Checked (and linted) in a target dir of its own with protoc made
# unfindable, so that build-script output from a protoc build cannot hide a regression
# (every dependency checked once more, without etcd-client). Every target: a plain `cargo test`
# builds too, the tests that need etcd marked (`required-features`, `cfg(feature = "etcd")`).
PROTOC=/nonexistent/protoc cargo clippy --workspace --all-targets --target-dir target/no-protoc -- -D warnings
step "clippy of every target, all features" "4.5 min" "2 s"
cargo clippy --workspace --all-targets --all-features -- -D warnings
step "cargo install of docs/install.md, run as installed" "3 min" "2 s"
# The binary install of docs/install.md, `cargo install --locked --path .` (protoc made
# unfindable, as a user without it runs it), the installed binary run, and its plugin link
# found by real kubectl. --debug into target/. Cold, this is about 3 CPU-minutes on top of the
# test build, whose dependencies resolve other features (the dev-dependencies'), so it cannot
# share them; `--features etcd` is the same install with one more crate and is left to the
# test build, which has it.
install_root=$(mktemp -d)
trap 'rm -rf "$install_root"' EXIT
PROTOC=/nonexistent/protoc cargo install --locked --offline --path . --debug --quiet \
  --target-dir target --root "$install_root"
"$install_root/bin/ip-webhook" --version
# What only a build without the feature can show (tests/operate.rs
# a_build_without_etcd_says_how_to_get_it, which `cargo test` without features runs): asked for
# the etcd ledger, it says how to get it, in one line, exit 1.
if no_etcd=$("$install_root/bin/ip-webhook" status --ledger etcd 2>&1); then
  echo "a build without etcd accepted --ledger etcd: $no_etcd" >&2; exit 1
fi
[ "$no_etcd" = "Error: this build has no etcd support; rebuild with --features etcd" ] \
  || { echo "unexpected answer of a build without etcd: $no_etcd" >&2; exit 1; }
PATH="$install_root/bin:$PATH" "$install_root/bin/ip-webhook" plugin install
PATH="$install_root/bin:$PATH" .tools/kubectl ipw --help >/dev/null
step "cargo test: every unit, integration and chart test, the benches once" \
  "16 min (10 to build)" "6 to 10 min"
cargo test --workspace --all-targets --all-features --no-fail-fast
step "cargo test --doc: the library crates' contracts, by example" "1 min" "20 s"
cargo test --workspace --all-features --doc --no-fail-fast
finish_step
echo "==> the suite passed in $((SECONDS - suite_started)) s" >&2
