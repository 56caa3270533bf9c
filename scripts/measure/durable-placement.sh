#!/usr/bin/env bash
# Loopback only: does where the durable path's threads run, or the core's idling between
# commits, explain what a durable /mutate costs above a dry run?
#
#   scripts/measure/durable-placement.sh BINARY [ROUNDS] [SECONDS]
#
# Starts BINARY (an ip-webhook build) with a fresh embedded ledger on core 0, warms it with one
# durable and one dry-run wrk run on core 1 (16 connections, the fixture and script of
# scripts/bench-load.sh), then runs ROUNDS (default 6) rounds of SECONDS (default 3) each, and
# in each round three pairs of runs against the same server, one after the other:
#   dry run and durable, each with and without an idle spinner: a busy loop under SCHED_IDLE
#     on core 0, which runs only when the server's core would otherwise idle, so the vCPU never
#     halts while the server waits for a commit (the spinner's CPU is not the server's);
#   durable with the `ledger-writer` thread on core 0 (as in every benchmark) and on core 1.
# Prints each pair's CPU per request (user + system, all threads, from /proc/PID/stat) and
# the medians. A benchmark, not a test: it exits 0 whatever the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
binary=${1:?usage: scripts/measure/durable-placement.sh BINARY [ROUNDS] [SECONDS]}
rounds=${2:-6} secs=${3:-3}
fixture=$root/tests/fixtures/pod-create-v1.json lua=$root/scripts/bench-load.lua
for tool in wrk taskset chrt; do
  command -v "$tool" >/dev/null || { echo "$tool is required (Debian packages wrk, util-linux)" >&2; exit 1; }
done
work=$(mktemp -d) server='' spinner=''
cleanup() {
  for pid in $server $spinner; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

taskset -c 0 "$binary" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --state-dir "$work/state" >"$work/log" 2>&1 &
server=$!
for _ in $(seq 1 200); do grep -q 'serving https://' "$work/log" && break; sleep 0.05; done
addr=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$work/log" | head -1)
[ -n "$addr" ] || { echo "the server did not start:" >&2; cat "$work/log" >&2; exit 1; }
writer=$(for task in /proc/"$server"/task/*; do
  [ "$(cat "$task/comm")" = ledger-writer ] && basename "$task"; done)
[ -n "$writer" ] || { echo "no ledger-writer thread in $server" >&2; exit 1; }
clk_tck=$(getconf CLK_TCK)

cpu_ticks() { sed 's/^.*) //' "/proc/$server/stat" | awk '{ print $12 + $13 }'; }
run() { # run MODE TAG: CPU µs per request of one wrk run
  local before after requests
  before=$(cpu_ticks)
  taskset -c 1 wrk -t1 -c16 -d"${secs}s" -s "$lua" "https://$addr/mutate" \
    -- "$fixture" "$1" "placement-$2-$$" >"$work/wrk.txt"
  after=$(cpu_ticks)
  requests=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
  awk -v d="$((after - before))" -v t="$clk_tck" -v n="$requests" 'BEGIN { printf "%.2f\n", d * 1e6 / t / n }'
}
spinning() { # spinning TAG MODE: `run` with the idle spinner on core 0
  taskset -c 0 chrt --idle 0 bash -c 'while :; do :; done' &
  spinner=$!
  run "$2" "$1"
  kill "$spinner"; wait "$spinner" 2>/dev/null || true; spinner=''
}
writer_on() { taskset -p -c "$1" "$writer" >/dev/null; }
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

run durable warm >/dev/null
run dry-run warm >/dev/null
declare -A cells
names=(dry dry+spinner durable durable+spinner writer-core0 writer-core1)
for round in $(seq 1 "$rounds"); do
  cells[dry]+=" $(run dry-run "d$round")"
  cells[dry+spinner]+=" $(spinning "ds$round" dry-run)"
  cells[durable]+=" $(run durable "u$round")"
  cells[durable+spinner]+=" $(spinning "us$round" durable)"
  writer_on 0; cells[writer-core0]+=" $(run durable "w0$round")"
  writer_on 1; cells[writer-core1]+=" $(run durable "w1$round")"
  writer_on 0
done
echo "CPU µs per durable or dry-run /mutate, 16 connections, $rounds rounds of ${secs} s:"
for name in "${names[@]}"; do
  # shellcheck disable=SC2086 # the cell is a list of figures
  printf '  %-16s median %6s  runs%s\n' "$name" "$(median ${cells[$name]})" "${cells[$name]}"
done
