#!/usr/bin/env bash
# One in-cluster replica (IPClaim ledger) against a cluster of N pods, for each N given
# (default: 5000 20000 50000 100000). The API server is examples/scale_apiserver.rs (generated
# pods, nodes, Deployments, ReplicaSets, Calico IPAMBlocks; 100 fixed-IP apps with 350 bound
# claims; FIXED_APPS=A FIXED_PER_APP=P in the environment: A apps of P pods instead): it counts
# the bytes it sends. ip-webhook's own CPU comes from a cpuacct cgroup
# made for it (nanoseconds, all its threads, also those that ended; needs root and cgroup v1's
# cpuacct) or else from /proc/PID/stat (10 ms steps: an admission's figure is then good to
# +-0.2 ms), its memory from /proc/PID/status (VmHWM: peak RSS; VmRSS: now). Prints one
# table, a column per N, and the growth exponent of each row between the smallest and the
# largest N (1.0: grows with the cluster; 0: flat).
#
#   scripts/bench-scale.sh [N ...]
#   BIN=target/release/ip-webhook scripts/bench-scale.sh 5000 20000
#   OPS_ONLY=1 scripts/bench-scale.sh 5000 150000
#   FIXED_APPS=2000 FIXED_PER_APP=10 scripts/bench-scale.sh 50000
#
# OPS_ONLY=1 starts no replica: it runs `status` and `check --drift` against the stand-in
# three times each and prints their peak RSS, CPU and bytes read (each cell: the three runs;
# the growth exponent: of their medians).
#
# Rows:
#   start bytes      bytes the API server sent the replica until its first leader pass settled
#   start CPU        the replica's CPU from exec until then (lists, index, the leader's pass)
#   peak RSS         VmHWM at the end of the run (start, pass, churn, admissions)
#   steady RSS       VmRSS at the end of the run, and per pod of the cluster
#   churn CPU        1,000 plain pods (no fixed IP) each ADDED, Terminating, DELETED
#   admission CPU    per fixed-IP admission as the cluster sees it (claim Reserved, pod ADDED,
#                    claim Bound), 50 at one per 0.56 s after one to start with, with all the
#                    work it triggers: the replica's whole CPU over the admissions ÷ 50, and
#                    the same beyond what it spends idle over as long (measured just before)
#   full pass CPU    one timed resync (the leader's full pass), RESYNC (90s) after start, with
#                    the rebuild of the leader's view from its caches that the next change
#                    makes (one admission after it, less an admission's figure)
#   status           `ip-webhook status`: own CPU (user+sys), peak RSS, bytes read
#   drift            `ip-webhook check --drift`: same
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(5000 20000 50000 100000)
BIN=${BIN:-target/release/ip-webhook}
SERVER=${SERVER:-target/release/examples/scale_apiserver}
# long enough that the churn and the admissions are over before the first timed resync
RESYNC=${RESYNC:-90s}
if [ ! -x "$BIN" ] || [ ! -x "$SERVER" ]; then
    echo "building $BIN and $SERVER (release)" >&2
    cargo build --release --bin ip-webhook --example scale_apiserver >&2
fi
TICKS=$(getconf CLK_TCK)
WORK=$(mktemp -d)
PIDS=()
CGROUPS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for cg in "${CGROUPS[@]}"; do rmdir "$cg" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CG=""  # the replica's cpuacct cgroup, when one could be made
cpu_of() {
    if [ -n "$CG" ]; then
        awk '{printf "%.4f", $1/1e9}' "$CG/cpuacct.usage"
    else
        awk -v t="$TICKS" '{printf "%.2f", ($14+$15)/t}' "/proc/$1/stat"
    fi
}
kib_of() { awk -v k="$2:" '$1==k {print $2}' "/proc/$1/status"; }
bytes_sent() { curl -s "http://127.0.0.1:$1/bench/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])'; }
# Wait until the replica's CPU has not moved by more than 0.02 s for 3 s (at most $2 s).
settle() {
    local pid=$1 limit=$2 last now still=0 waited=0
    last=$(cpu_of "$pid")
    while [ "$still" -lt 6 ] && [ "$waited" -lt $((limit * 2)) ]; do
        sleep 0.5
        now=$(cpu_of "$pid")
        if awk -v a="$last" -v b="$now" 'BEGIN{exit !(b-a<=0.02)}'; then still=$((still + 1)); else still=0; fi
        last=$now
        waited=$((waited + 1))
    done
}
# Own CPU seconds, peak RSS (MiB) and the bytes the API server sent, of one command.
measure_cmd() {
    local port=$1; shift
    curl -s -X POST "http://127.0.0.1:$port/bench/reset" >/dev/null
    # `check --drift` exits 1 when it finds drift (the run's churn leaves some): not a failure
    /usr/bin/time -f "%U %S %M" -o "$WORK/time" "$@" >"$WORK/out" 2>"$WORK/err" || true
    if ! grep -qE '^[0-9.]+ [0-9.]+ [0-9]+$' "$WORK/time"; then
        echo "command failed: $*" >&2; tail -3 "$WORK/err" >&2
    fi
    local bytes
    bytes=$(bytes_sent "$port")
    grep -E '^[0-9.]+ [0-9.]+ [0-9]+$' "$WORK/time" |
        awk -v b="$bytes" '{printf "%.2f s, %.0f MiB, %.1f MB", $1+$2, $3/1024, b/1e6}'
}

# The median of the numbers in "a / b / c".
median() { tr '/' '\n' <<<"$1" | grep -oE '[0-9.]+' | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
# `status` and `check --drift` against the stand-in at $1, three runs each, into ROW.
ops_only() {
    local api=$1 n=$2 cmd rss cpu bytes
    for cmd in status drift; do
        rss="" cpu="" bytes=""
        for _ in 1 2 3; do
            local args=(status)
            [ "$cmd" = drift ] && args=(check --drift)
            curl -s -X POST "http://127.0.0.1:$api/bench/reset" >/dev/null
            /usr/bin/time -f "%U %S %M" -o "$WORK/time" "$BIN" "${args[@]}" \
                --kubeconfig "$WORK/kubeconfig" --ledger kubernetes >"$WORK/out" 2>"$WORK/err" || true
            grep -qE '^[0-9.]+ [0-9.]+ [0-9]+$' "$WORK/time" || { echo "$cmd failed" >&2; tail -3 "$WORK/err" >&2; }
            rss+="${rss:+ / }$(awk '/^[0-9.]+ [0-9.]+ [0-9]+$/ {printf "%.0f", $3/1024}' "$WORK/time")"
            cpu+="${cpu:+ / }$(awk '/^[0-9.]+ [0-9.]+ [0-9]+$/ {printf "%.2f", $1+$2}' "$WORK/time")"
            bytes=$(awk -v b="$(bytes_sent "$api")" 'BEGIN{printf "%.1f", b/1e6}')
        done
        ROW[${cmd}rss,$n]="$rss MiB"
        ROW[${cmd}cpu,$n]="$cpu s"
        ROW[${cmd}bytes,$n]="$bytes MB"
    done
}

echo "fixed-IP apps: ${FIXED_APPS:-100} of ${FIXED_PER_APP:-3 or 4} pods" >&2
declare -A ROW
for n in "${SIZES[@]}"; do
    api=$(free_port)
    "$SERVER" "$api" "$n" 2>"$WORK/server-$n.log" &
    PIDS+=($!)
    for _ in $(seq 50); do curl -s "http://127.0.0.1:$api/bench/stats" >/dev/null && break; sleep 0.1; done
    cat >"$WORK/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster:
    server: http://127.0.0.1:$api
contexts:
- name: bench
  context: {cluster: bench, user: bench}
current-context: bench
users:
- name: bench
  user: {}
EOF
    if [ -n "${OPS_ONLY:-}" ]; then
        ops_only "$api" "$n"
        kill "${PIDS[-1]}" 2>/dev/null || true
        echo "done: $n pods" >&2
        continue
    fi
    admin=$(free_port)
    CG=/sys/fs/cgroup/cpuacct/ip-webhook-bench-$$-$n
    if mkdir "$CG" 2>/dev/null; then CGROUPS+=("$CG"); else CG=""; fi
    echo "replica CPU from: ${CG:-/proc/PID/stat (10 ms steps)}" >&2
    # in its cgroup from exec on, so that every thread it starts counts
    sh -c 'if [ -n "$1" ]; then echo $$ >"$1/cgroup.procs"; fi; shift; exec "$@"' sh "$CG" \
        "$BIN" serve --kubeconfig "$WORK/kubeconfig" --ledger kubernetes --listen 127.0.0.1:0 \
        --admin-listen "127.0.0.1:$admin" --state-dir "$WORK/state-$n" --lease-namespace default \
        --resync-period "$RESYNC" >"$WORK/serve-$n.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1200); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break
        kill -0 "$pid" 2>/dev/null || { echo "serve died:" >&2; tail "$WORK/serve-$n.log" >&2; exit 1; }
        sleep 0.25
    done
    ready_at=$SECONDS
    # The Lease is taken within a renew interval; the first pass follows.
    # (read whole before grep: `grep -q` leaving early fails a large scrape's pipe)
    until grep -q '^ip_webhook_leader{.*} 1' <<<"$(curl -s "http://127.0.0.1:$admin/metrics")"; do sleep 0.25; done
    settle "$pid" 120
    start_cpu=$(awk -v c="$(cpu_of "$pid")" 'BEGIN{printf "%.2f", c}')
    start_bytes=$(bytes_sent "$api")
    # where the start's bytes went, largest first (to stderr: the table stays one table)
    curl -s "http://127.0.0.1:$api/bench/stats" | python3 -c '
import json, sys
by = json.load(sys.stdin)["bytes_by"]
print("start bytes, '"$n"' pods: " + ", ".join(
    f"{k} {v/1e6:.1f} MB" for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 1e5))' >&2
    start_hwm=$(kib_of "$pid" VmHWM)

    before=$(cpu_of "$pid")
    curl -s -X POST "http://127.0.0.1:$api/bench/churn?n=1000" >/dev/null
    settle "$pid" 120
    churn=$(awk -v a="$before" -v b="$(cpu_of "$pid")" 'BEGIN{printf "%.2f", b-a}')

    # One admission first: the first change after a full pass (here the leader's first) has
    # the leader rebuild its view from the watch caches, which belongs to the full pass (the
    # row below counts it there), not to the admissions.
    curl -s -X POST "http://127.0.0.1:$api/bench/admit?n=1&interval_ms=0&from=1000" >/dev/null
    settle "$pid" 120

    # What the replica spends with nothing happening (lease renewals, the leader's
    # once-a-second checks) over as long as the admissions take, to tell it apart from what
    # the admissions trigger.
    before=$(cpu_of "$pid")
    sleep 28
    idle=$(awk -v a="$before" -v b="$(cpu_of "$pid")" 'BEGIN{printf "%.3f", b-a}')

    before=$(cpu_of "$pid")
    started=$SECONDS
    curl -s -X POST "http://127.0.0.1:$api/bench/admit?n=50&interval_ms=560" >/dev/null
    settle "$pid" 120
    admit=$(awk -v a="$before" -v b="$(cpu_of "$pid")" -v i="$idle" -v t=$((SECONDS - started)) \
        'BEGIN{w=(b-a)*1000/50; n=(b-a-i*t/28)*1000/50; if (n<0) n=0; printf "%.2f ms (%.2f ms beyond idle)", w, n}')
    admit_s=$(awk -v a="$before" -v b="$(cpu_of "$pid")" 'BEGIN{printf "%.6f", (b-a)/50}')

    # The next resync is a full pass, RESYNC after the replica became ready: wait for it,
    # then make one admission (the first change after it rebuilds the leader's view from
    # the caches) and measure both, less what an admission costs.
    before=$(cpu_of "$pid")
    resync_s=${RESYNC%s}
    left=$((ready_at + resync_s - SECONDS))
    [ "$left" -gt 0 ] && sleep "$left"
    sleep 1
    settle "$pid" 120
    curl -s -X POST "http://127.0.0.1:$api/bench/admit?n=1&interval_ms=0&from=2000" >/dev/null
    settle "$pid" 120
    pass=$(awk -v a="$before" -v b="$(cpu_of "$pid")" -v x="$admit_s" 'BEGIN{p=b-a-x; if (p<0) p=0; printf "%.2f", p}')

    hwm=$(kib_of "$pid" VmHWM)
    rss=$(kib_of "$pid" VmRSS)
    status=$(measure_cmd "$api" "$BIN" status --kubeconfig "$WORK/kubeconfig" --ledger kubernetes)
    drift=$(measure_cmd "$api" "$BIN" check --drift --kubeconfig "$WORK/kubeconfig" --ledger kubernetes)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    kill "${PIDS[-2]}" 2>/dev/null || true

    ROW[bytes,$n]=$(awk -v b="$start_bytes" 'BEGIN{printf "%.1f MB", b/1e6}')
    ROW[startcpu,$n]="$start_cpu s"
    ROW[starthwm,$n]="$((start_hwm / 1024)) MiB"
    ROW[hwm,$n]="$((hwm / 1024)) MiB"
    ROW[rss,$n]="$((rss / 1024)) MiB ($((rss * 1024 / n)) B/pod)"
    ROW[churn,$n]="$churn s"
    ROW[admit,$n]=$admit
    ROW[pass,$n]="$pass s"
    ROW[status,$n]=$status
    ROW[drift,$n]=$drift
    echo "done: $n pods" >&2
done

first=${SIZES[0]}
last=${SIZES[-1]}
num() { grep -oE '^[0-9.]+' <<<"$1"; }
exponent() {
    local a b
    a=$(num "${ROW[$1,$first]}")
    b=$(num "${ROW[$1,$last]}")
    awk -v a="$a" -v b="$b" -v x="$first" -v y="$last" \
        'BEGIN{ if (a<=0||b<=0||x==y) print "-"; else printf "%.2f", log(b/a)/log(y/x) }'
}
printf '| pods in the cluster |'
for n in "${SIZES[@]}"; do printf ' %s |' "$n"; done
printf ' growth exponent |\n|---|'
for _ in "${SIZES[@]}"; do printf -- '---|'; done
printf -- '---|\n'
ROWS=("bytes:bytes read while starting" "startcpu:CPU until the first leader pass settled"
    "starthwm:peak RSS after the leader pass" "hwm:peak RSS through churn and admissions"
    "rss:steady RSS at the end" "churn:CPU for 1,000 plain pods created and deleted"
    "admit:CPU per fixed-IP admission with the work it triggers" "pass:CPU of one full resync pass"
    "status:status (CPU, peak RSS, bytes read)" "drift:check --drift (CPU, peak RSS, bytes read)")
if [ -n "${OPS_ONLY:-}" ]; then
    num() { median "$1"; }
    ROWS=("statusrss:status peak RSS" "statuscpu:status CPU" "statusbytes:status bytes read"
        "driftrss:check --drift peak RSS" "driftcpu:check --drift CPU"
        "driftbytes:check --drift bytes read")
fi
for row in "${ROWS[@]}"; do
    key=${row%%:*}
    printf '| %s |' "${row#*:}"
    for n in "${SIZES[@]}"; do printf ' %s |' "${ROW[$key,$n]}"; done
    printf ' %s |\n' "$(exponent "$key")"
done
