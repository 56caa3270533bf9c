#!/usr/bin/env bash
# A rollout through three replicas of a release build sharing IPClaims (tests/rollout.rs):
# the pods of one StatefulSet and one Deployment (ROLLOUT_PODS in all, default 1,000) created
# at once through the stand-in API server (tests/support/fakeapi.py), ROLLOUT_CONCURRENCY
# creates in flight (default 16). It fails unless every create is admitted, every pod has an
# IP of its own from its app's list, and every claim ends Bound to its pod; it prints the
# webhooks' own latency (p50, p99, slowest, from each replica's decision lines), the latency
# the API server saw, and the time until every claim is Bound.
#
#   scripts/bench-rollout.sh
#   ROLLOUT_PODS=2000 ROLLOUT_CONCURRENCY=32 BIN=/path/to/ip-webhook scripts/bench-rollout.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/ip-webhook}
if [ ! -x "$BIN" ]; then
    echo "building $BIN (release)" >&2
    cargo build --release --bin ip-webhook >&2
fi
IP_WEBHOOK_TEST_BINARY=$(realpath "$BIN") ROLLOUT_PODS=${ROLLOUT_PODS:-1000} \
    cargo test --all-features --test rollout -- --nocapture 2>&1 |
    grep -vE '^(running|test result|$)|Finished|Running|Compiling|Blocking'
