#!/usr/bin/env bash
# Two builds of ip-webhook side by side: CPU per request of each, in alternating runs, so that
# the drift of a shared machine (the floor itself moved by half within a day here) falls on
# both alike. The answer to "did this change make the request path cheaper?", where two runs of
# scripts/bench-open-loop.sh an hour apart cannot tell a 3 % change from the host's.
#
#   scripts/bench-ab.sh DIR_A DIR_B [ROUNDS] [SECONDS] [MODE] [ENDPOINT]
#   scripts/bench-ab.sh /tmp/old /tmp/new 8 3 dry-run mutate
#
# DIR_A and DIR_B each hold an `ip-webhook` binary (e.g. copies of target/dist/ip-webhook
# before and after a change). Both servers run on BENCH_SERVER_CPU (default 0), each with its
# own state dir; wrk runs on BENCH_LOAD_CPU (default 1) with 16 connections and the fixture
# and script of scripts/bench-load.sh (MODE: as-is, dry-run, durable; default dry-run;
# ENDPOINT: mutate or validate). One warm-up run each, then ROUNDS (default 8) rounds of one
# SECONDS-long (default 3) run against A, then one against B. Prints every run's CPU per
# request (user + system, from /proc/PID/stat) and the medians with B ÷ A.
# A benchmark, not a test: it exits 0 whatever the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

[ $# -ge 2 ] || { sed -n '2,17p' "$0" >&2; exit 2; }
dir_a=$1 dir_b=$2
rounds=${3:-8} secs=${4:-3} mode=${5:-dry-run} endpoint=${6:-mutate}
server_cpu=${BENCH_SERVER_CPU:-0}
load_cpu=${BENCH_LOAD_CPU:-1}
fixture="$root/tests/fixtures/pod-create-v1.json"
lua="$root/scripts/bench-load.lua"
for tool in wrk taskset; do
  command -v "$tool" >/dev/null || { echo "$tool is required (Debian packages wrk, util-linux)" >&2; exit 1; }
done
for dir in "$dir_a" "$dir_b"; do
  [ -x "$dir/ip-webhook" ] || { echo "$dir/ip-webhook is not an executable" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
clk_tck=$(getconf CLK_TCK)

declare -A pid_of addr_of
start() { # start NAME DIR
  local log="$work/$1.log"
  taskset -c "$server_cpu" "$2/ip-webhook" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --state-dir "$work/state-$1" >"$log" 2>&1 &
  pid_of[$1]=$!
  pids+=("$!")
  for _ in $(seq 1 600); do
    grep -q 'serving https://' "$log" && break
    kill -0 "${pid_of[$1]}" 2>/dev/null || { echo "$1 did not start:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.05
  done
  addr_of[$1]=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$log" | head -1)
}

cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

one_run() { # one_run NAME RUN: prints CPU µs per request
  local pid=${pid_of[$1]} before after requests
  before=$(cpu_ticks "$pid")
  taskset -c "$load_cpu" wrk -t1 -c16 -d"${secs}s" -s "$lua" "https://${addr_of[$1]}/$endpoint" \
    -- "$fixture" "$mode" "ab-$1-$2-$$" >"$work/wrk.txt"
  after=$(cpu_ticks "$pid")
  requests=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
  awk -v d="$((after - before))" -v t="$clk_tck" -v n="$requests" 'BEGIN { printf "%.2f\n", d * 1e6 / t / n }'
}

median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }

start a "$dir_a"
start b "$dir_b"
one_run a warm >/dev/null
one_run b warm >/dev/null
runs_a=() runs_b=()
for round in $(seq 1 "$rounds"); do
  runs_a+=("$(one_run a "$round")")
  runs_b+=("$(one_run b "$round")")
done
echo "$mode /$endpoint, 16 connections, $rounds rounds of ${secs} s; CPU µs per request:"
echo "  A ($dir_a): ${runs_a[*]}"
echo "  B ($dir_b): ${runs_b[*]}"
awk -v a="$(median "${runs_a[@]}")" -v b="$(median "${runs_b[@]}")" \
  'BEGIN { printf "medians: A %.2f, B %.2f; B / A = %.3f\n", a, b, b / a }'
