#!/usr/bin/env bash
# Loopback only: what remembering each claim costs a server that does nothing else, by the
# size and shape of what it remembers.
#
#   scripts/measure/remember-floor.sh BENCH_FLOOR [ROUNDS] [SECONDS]
#
# BENCH_FLOOR is a build of examples/bench_floor.rs. Each round runs, one after the other and
# each on a fresh process and journal on core 0 with wrk on core 1 (16 connections, SECONDS
# each, default 10; the durable mode of scripts/bench-load.lua: a fresh request UID each time):
#   durable      --journal: a group-committed record per request and nothing else;
#   lean-hashed  + --remember 0 --remember-hashed: each request UID's hash looked up and filed
#                in a hash map, and a record of the hash and an IP (one 64-byte allocation)
#                filed by a sequential IP;
#   lean-tree    + --remember 0: the same in a B-tree;
#   record-160   + --remember 160: the UID and a token as strings, about 160 bytes in all;
#   record-460   + --remember 460: the same padded to the ~460 bytes one ip-webhook claim takes;
#   hold-32k     + --hold 32768: 32 KiB of fresh heap kept across each request's commit wait.
# Prints each run's CPU per request (user + system, from /proc/PID/stat) and requests, then
# for each variant its excess over `durable` in every round and the median. ROUNDS default 6.
# A benchmark, not a test: it exits 0 whatever the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
floor=${1:?usage: scripts/measure/remember-floor.sh BENCH_FLOOR [ROUNDS] [SECONDS]}
rounds=${2:-6} secs=${3:-10}
fixture=$root/tests/fixtures/pod-create-v1.json lua=$root/scripts/bench-load.lua
for tool in wrk taskset; do
  command -v "$tool" >/dev/null || { echo "$tool is required (Debian packages wrk, util-linux)" >&2; exit 1; }
done
work=$(mktemp -d) server=''
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
clk_tck=$(getconf CLK_TCK)

cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
run() { # run NAME ARG...: "CPU-µs-per-request requests" of one fresh floor under durable load
  local name=$1 before after requests addr
  shift
  taskset -c 0 "$floor" 127.0.0.1:0 --journal "$work/journal" "$@" >"$work/log" 2>&1 &
  server=$!
  for _ in $(seq 1 200); do grep -q 'serving https://' "$work/log" && break; sleep 0.05; done
  addr=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$work/log" | head -1)
  [ -n "$addr" ] || { echo "the floor did not start:" >&2; cat "$work/log" >&2; exit 1; }
  before=$(cpu_ticks "$server")
  taskset -c 1 wrk -t1 -c16 -d"${secs}s" -s "$lua" "https://$addr/mutate" \
    -- "$fixture" durable "remember-$name-$RANDOM-$$" >"$work/wrk.txt"
  after=$(cpu_ticks "$server")
  kill "$server"; wait "$server" 2>/dev/null || true; server=''
  rm -rf "$work/journal"
  requests=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
  awk -v d="$((after - before))" -v t="$clk_tck" -v n="$requests" 'BEGIN { printf "%.2f %d\n", d * 1e6 / t / n, n }'
}
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

names=(durable lean-hashed lean-tree record-160 record-460 hold-32k)
declare -A args=(
  [durable]='' [lean-hashed]='--remember 0 --remember-hashed' [lean-tree]='--remember 0'
  [record-160]='--remember 160' [record-460]='--remember 460' [hold-32k]='--hold 32768'
)
declare -A excess
echo "CPU µs per request (requests) of fresh floors, $rounds rounds of ${secs} s:"
for round in $(seq 1 "$rounds"); do
  line="  round $round:"
  base=''
  for name in "${names[@]}"; do
    # shellcheck disable=SC2086 # the arguments are words
    read -r cpu requests < <(run "$name" ${args[$name]})
    line+=" $name $cpu ($requests)"
    if [ -z "$base" ]; then base=$cpu; else excess[$name]+=" $(awk -v a="$cpu" -v b="$base" 'BEGIN { printf "%.2f", a - b }')"; fi
  done
  echo "$line"
done
echo "above durable, µs per request:"
for name in "${names[@]:1}"; do
  # shellcheck disable=SC2086 # the cell is a list of figures
  printf '  %-12s median %6s  rounds%s\n' "$name" "$(median ${excess[$name]})" "${excess[$name]}"
done
