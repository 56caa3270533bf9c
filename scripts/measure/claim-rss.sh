#!/usr/bin/env bash
# Loopback only: the resident memory each held claim adds while claims are being made, for one
# or more builds of ip-webhook side by side.
#
#   scripts/measure/claim-rss.sh [ROUNDS] DIR...
#
# Each DIR holds an `ip-webhook` binary. Each round runs every build in turn, each on a fresh
# server and state dir on core 0 (BENCH_SERVER_CPU) with wrk on core 1 (BENCH_LOAD_CPU): 4 s
# of durable /mutate load (16 connections, scripts/bench-load.lua: a fresh UUID-shaped request
# UID each time), then 8 s more. Prints `RssAnon` of /proc/PID/status after each, and its growth
# over the 8 s divided by the claims made in them: the bytes a claim keeps, freed temporaries
# reused, without the start-up's own allocations. ROUNDS default 2.
# A benchmark, not a test: it exits 0 whatever the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage='usage: scripts/measure/claim-rss.sh [ROUNDS] DIR...'
rounds=2
if [[ ${1:-} =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
[ $# -gt 0 ] || { echo "$usage" >&2; exit 1; }
server_cpu=${BENCH_SERVER_CPU:-0} load_cpu=${BENCH_LOAD_CPU:-1}
fixture=$root/tests/fixtures/pod-create-v1.json lua=$root/scripts/bench-load.lua
for tool in wrk taskset curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (Debian packages wrk, util-linux, curl)" >&2; exit 1; }
done
for dir in "$@"; do
  [ -x "$dir/ip-webhook" ] || { echo "$dir/ip-webhook is not an executable" >&2; exit 1; }
done
work=$(mktemp -d) server=''
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

rss_kb() { awk '/^RssAnon:/ { print $2 }' "/proc/$1/status"; }
# load SECONDS RUN_ID: wrk's request count of one durable run
load() {
  taskset -c "$load_cpu" wrk -t1 -c16 -d"$1s" -s "$lua" https://127.0.0.1:18643/mutate \
    -- "$fixture" durable "$2" >"$work/wrk.txt"
  if grep -q 'Non-2xx' "$work/wrk.txt"; then
    echo "warning: non-2xx answers in a durable run: $(grep 'Non-2xx' "$work/wrk.txt")" >&2
  fi
  awk '/requests in/ { print $1 }' "$work/wrk.txt"
}

echo "RssAnon growth per claim between 4 and 12 s of durable load, fresh servers:"
for round in $(seq 1 "$rounds"); do
  for dir in "$@"; do
    rm -rf "$work/state"
    taskset -c "$server_cpu" "$dir/ip-webhook" serve --listen 127.0.0.1:18643 \
      --admin-listen 127.0.0.1:18644 --state-dir "$work/state" >"$work/log" 2>&1 &
    server=$!
    for _ in $(seq 1 200); do curl -sf http://127.0.0.1:18644/readyz >/dev/null && break; sleep 0.05; done
    curl -sf http://127.0.0.1:18644/readyz >/dev/null || { echo "$dir/ip-webhook did not become ready:" >&2; cat "$work/log" >&2; exit 1; }
    first=$(load 4 "rss-a-$round-$RANDOM-$$")
    before=$(rss_kb "$server")
    claims=$(load 8 "rss-b-$round-$RANDOM-$$")
    after=$(rss_kb "$server")
    kill "$server"; wait "$server" 2>/dev/null || true; server=''
    [ "${claims:-0}" -gt 0 ] || { echo "wrk made no requests:" >&2; cat "$work/wrk.txt" >&2; exit 1; }
    awk -v dir="$dir" -v r="$round" -v n0="$first" -v n="$claims" -v a="$before" -v b="$after" 'BEGIN {
      printf "  round %d %s: claims %d + %d, RssAnon %d -> %d kB: %.0f B per claim\n", r, dir, n0, n, a, b, (b - a) * 1024 / n
    }'
  done
done
