#!/usr/bin/env bash
# Loopback only: where a durable /mutate spends the CPU a dry run does not, by thread and
# function.
#
#   scripts/measure/durable-profile.sh BINARY [SECONDS]
#
# Starts BINARY (an ip-webhook build with symbols: release or profiling) with a fresh embedded
# ledger on core 0, warms it with 3 s of durable load from wrk on core 1 (the maps hold tens of
# thousands of claims after it), then samples it with `perf record -e cpu-clock -F 4000` over
# SECONDS (default 5) of dry-run load and SECONDS of durable load (the fixture and script of
# scripts/bench-load.sh, 16 connections). Prints, in µs of CPU per request: each thread's user
# and kernel time in both modes, and the 30 functions that grow most from the dry run to the
# durable one. A flat profile (no call graphs: the release profile has no frame pointers).
# cpu-clock, not cycles: this VM exposes no hardware counters to perf.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
bin=${1:?usage: scripts/measure/durable-profile.sh BINARY [SECONDS]}
secs=${2:-5}
for tool in perf wrk taskset python3; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done
work=$(mktemp -d)
fixture="$root/tests/fixtures/pod-create-v1.json" lua="$root/scripts/bench-load.lua"
taskset -c 0 "$bin" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --state-dir "$work/state" >"$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 200); do grep -q 'serving https://' "$work/server.log" && break; sleep 0.05; done
addr=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$work/server.log" | head -1)
taskset -c 1 wrk -t1 -c16 -d3s -s "$lua" "https://$addr/mutate" -- "$fixture" durable "warm-$$" >/dev/null
for mode in dry-run durable; do
  perf record -q -e cpu-clock -F 4000 -p "$server" -o "$work/$mode.data" -- sleep "$((secs + 1))" 2>/dev/null &
  recorder=$!
  taskset -c 1 wrk -t1 -c16 -d"${secs}s" -s "$lua" "https://$addr/mutate" -- "$fixture" "$mode" "$mode-$$" \
    >"$work/wrk-$mode.txt"
  wait "$recorder"
  awk '/requests in/ { print $1 }' "$work/wrk-$mode.txt" >"$work/requests-$mode"
  perf report -i "$work/$mode.data" --no-children -n --sort comm,dso,sym --stdio 2>/dev/null \
    | grep -v '^#' >"$work/$mode.txt"
done
python3 - "$work" <<'PY'
import re, sys
work = sys.argv[1]
line_re = re.compile(r'\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\S+\s+\[(.)\]\s+(.*)$')
def load(mode):
    requests = int(open(f'{work}/requests-{mode}').read())
    by_thread, by_fn = {}, {}
    for line in open(f'{work}/{mode}.txt'):
        m = line_re.match(line)
        if not m:
            continue
        us = int(m.group(1)) * 250 / requests  # one sample is 250 µs of CPU at 4000 Hz
        thread, space = m.group(2), 'kernel' if m.group(3) == 'k' else 'user'
        by_thread[(thread, space)] = by_thread.get((thread, space), 0) + us
        key = (thread, m.group(4).strip()[:100])
        by_fn[key] = by_fn.get(key, 0) + us
    return requests, by_thread, by_fn
(dn, dt, df), (un, ut, uf) = load('dry-run'), load('durable')
print(f'requests: dry run {dn}, durable {un}; µs of CPU per request')
for key in sorted(set(dt) | set(ut)):
    print(f'  {key[0]:<16} {key[1]:<6}  dry run {dt.get(key, 0):6.2f}  durable {ut.get(key, 0):6.2f}')
print('the functions that grow most (durable - dry run, dry run, durable):')
for key in sorted(set(df) | set(uf), key=lambda k: df.get(k, 0) - uf.get(k, 0))[:30]:
    print(f'  {uf.get(key, 0) - df.get(key, 0):6.2f} {df.get(key, 0):6.2f} {uf.get(key, 0):6.2f}  {key[0][:12]:<12} {key[1]}')
PY
