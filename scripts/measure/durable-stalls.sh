#!/usr/bin/env bash
# Loopback only: where the durable tail's long stalls come from.
#
#   scripts/measure/durable-stalls.sh BINARY [CONNECTIONS] [SECONDS]
#
# Starts BINARY (an ip-webhook build) with a fresh embedded ledger on core 0, warms it up for
# 1 s, then runs examples/bench_client (durable /mutate, a fresh request UID per request) on
# core 1 while `perf sched record` traces core 0 for 3 s. Prints bench_client's line and:
#   cpu_us            server CPU per request (utime + stime, all threads)
#   thp_faults        transparent huge pages faulted in during the run (/proc/vmstat
#                     thp_fault_alloc, whole machine)
#   writer_over_1ms   runs of the ledger writer thread longer than 1 ms (a commit needs ~0.1 ms
#                     of CPU), and its longest run
#   worker_over_4ms   runs of the request thread longer than 4 ms without a switch
#   steal             ticks the host took from this VM during the run (/proc/stat): the noise
# Needs perf (Debian linux-perf), taskset and a release build of examples/bench_client.
# Compare builds by alternating runs: the host's noise moves every figure between runs.
set -euo pipefail
binary=$1
conns=${2:-16}
seconds=${3:-5}
root=$(cd "$(dirname "$0")/../.." && pwd)
client=${BENCH_CLIENT:-$root/target/release/examples/bench_client}
fixture=$root/tests/fixtures/pod-create-v1.json
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

taskset -c 0 "$binary" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --ledger embedded --state-dir "$work/state" >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q 'serving https://' "$work/log" && break; sleep 0.05; done
addr=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$work/log" | head -1)
[ -n "$addr" ] || { cat "$work/log" >&2; exit 1; }
url="https://$addr/mutate"
ca="$work/state/ca.crt"

taskset -c 1 "$client" "$url" "$fixture" durable "$conns" 1 "$ca" warm >/dev/null
ticks() { sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }'; }
thp() { awk '/^thp_fault_alloc / { print $2 }' /proc/vmstat; }
steal() { awk '/^cpu / { print $9 }' /proc/stat; }
(sleep 1 && perf sched record -C 0 -o "$work/sched.data" -- sleep 3 >/dev/null 2>&1) &
tracer=$!
t0=$(ticks) h0=$(thp) s0=$(steal)
out=$(taskset -c 1 "$client" "$url" "$fixture" durable "$conns" "$seconds" "$ca" "run$$")
t1=$(ticks) h1=$(thp) s1=$(steal)
wait "$tracer"
requests=$(sed -n 's/^requests=\([0-9]*\) .*/\1/p' <<<"$out")
echo "$out"
perf sched timehist -i "$work/sched.data" 2>/dev/null | awk \
  -v cpu="$(awk -v d=$((t1 - t0)) -v t="$(getconf CLK_TCK)" -v n="$requests" 'BEGIN { printf "%.1f", d * 1e6 / t / n }')" \
  -v thp=$((h1 - h0)) -v steal=$((s1 - s0)) '
  # columns: time cpu task wait-time sch-delay run-time (ms)
  $3 ~ /^ledger-writer/ && NF >= 6 { if ($6 > 1.0) w++; if ($6 > wmax) wmax = $6 }
  $3 ~ /^tokio-rt-worker/ && NF >= 6 { if ($6 > 4.0) k++ }
  END { printf "cpu_us=%s thp_faults=%d writer_over_1ms=%d writer_longest_ms=%.2f worker_over_4ms=%d steal=%d\n",
        cpu, thp, w, wmax, k, steal }'
