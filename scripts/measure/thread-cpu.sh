#!/usr/bin/env bash
# Loopback only: where a durable answer's CPU goes, by thread, in ip-webhook and in the floor.
#
#   scripts/measure/thread-cpu.sh BIN_DIR [ROUNDS] [SECONDS]
#
# BIN_DIR holds an `ip-webhook` build and examples/bench_floor (a `dist` or `release` target
# directory, or BENCH_BIN's layout: BIN_DIR/ip-webhook, BIN_DIR/examples/bench_floor). Each
# round runs, one after the other and each on a fresh process (and a fresh journal or state
# dir) on core 0 with wrk on core 1 (16 connections, SECONDS each, default 10; the fixture and
# script of scripts/bench-load.sh):
#   floor          bench_floor: the bare HTTPS answer;
#   floor-journal  bench_floor --journal: the same with a group-committed record per request;
#   dry            ip-webhook, dry-run /mutate;
#   durable        ip-webhook, durable /mutate (a fresh request UID every time).
# Prints, for each run, every thread's user and kernel CPU per request in µs (from
# /proc/PID/task/*/stat, threads of one name summed) and the process's total. ROUNDS default 2.
# A benchmark, not a test: it exits 0 whatever the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: scripts/measure/thread-cpu.sh BIN_DIR [ROUNDS] [SECONDS]}
rounds=${2:-2} secs=${3:-10}
fixture=$root/tests/fixtures/pod-create-v1.json lua=$root/scripts/bench-load.lua
for tool in wrk taskset; do
  command -v "$tool" >/dev/null || { echo "$tool is required (Debian packages wrk, util-linux)" >&2; exit 1; }
done
for file in "$bin/ip-webhook" "$bin/examples/bench_floor"; do
  [ -x "$file" ] || { echo "$file is not an executable" >&2; exit 1; }
done
work=$(mktemp -d) server=''
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
tick=$(getconf CLK_TCK)

# ticks PID: one line per thread name, "name user system" in clock ticks, names summed
ticks() {
  for task in /proc/"$1"/task/*; do
    # the fields after the command's closing parenthesis: utime and stime are the 12th and 13th
    printf '%s %s\n' "$(tr ' ' '_' <"$task/comm")" "$(sed 's/^.*) //' "$task/stat" | cut -d' ' -f12,13)"
  done | awk '{ usr[$1] += $2; sys[$1] += $3 } END { for (n in usr) print n, usr[n], sys[n] }' | sort
}

# run NAME MODE COMMAND...: start COMMAND on core 0, load it for SECONDS, print its threads
run() {
  local name=$1 mode=$2
  shift 2
  local log="$work/$name.log"
  taskset -c 0 "$@" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 1 200); do grep -q 'serving https://' "$log" && break; sleep 0.05; done
  local addr
  addr=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$log" | head -1)
  [ -n "$addr" ] || { echo "$name did not start:" >&2; cat "$log" >&2; exit 1; }
  ticks "$server" >"$work/before"
  taskset -c 1 wrk -t1 -c16 -d"${secs}s" -s "$lua" "https://$addr/mutate" -- "$fixture" "$mode" "$name-$$-$RANDOM" >"$work/wrk.txt"
  ticks "$server" >"$work/after"
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=''
  local requests
  requests=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
  [ "${requests:-0}" -gt 0 ] || { echo "$name: wrk made no requests:" >&2; cat "$work/wrk.txt" >&2; exit 1; }
  grep -q 'Non-2xx' "$work/wrk.txt" && echo "warning: $name: $(grep 'Non-2xx' "$work/wrk.txt")" >&2
  join "$work/before" "$work/after" | awk -v n="$requests" -v t="$tick" -v cell="$name" '
    { usr = ($4 - $2) * 1e6 / t / n; sys = ($5 - $3) * 1e6 / t / n; all_usr += usr; all_sys += sys
      if (usr + sys > 0) printf "  %-14s %-16s user %6.2f  kernel %6.2f\n", cell, $1, usr, sys }
    END { printf "  %-14s %-16s user %6.2f  kernel %6.2f  total %6.2f µs/req (%d requests)\n", cell, "(all)", all_usr, all_sys, all_usr + all_sys, n }'
}

for round in $(seq 1 "$rounds"); do
  echo "round $round"
  run floor as-is "$bin/examples/bench_floor" 127.0.0.1:0 --ca-out "$work/floor-ca.pem"
  run floor-journal as-is "$bin/examples/bench_floor" 127.0.0.1:0 --ca-out "$work/journal-ca.pem" --journal "$work/journal-$round"
  run dry dry-run "$bin/ip-webhook" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --state-dir "$work/dry-$round"
  run durable durable "$bin/ip-webhook" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --state-dir "$work/durable-$round"
  rm -rf "$work/journal-$round" "$work/dry-$round" "$work/durable-$round"
done
