#!/usr/bin/env bash
# Instructions per request of the server, counted by callgrind (valgrind): the figure that a
# shared, noisy machine does not change, for the floor (examples/bench_floor.rs), dry-run
# /mutate and durable /mutate (embedded ledger), over keep-alive HTTPS on loopback driven by wrk
# with the same fixture and script as scripts/bench-load.sh.
#
#   scripts/bench-instructions.sh
#
# Each cell starts its server under `valgrind --tool=callgrind` (a fresh state dir for durable
# cells), starts wrk, zeroes the counters (`callgrind_control -z`) after BENCH_WARMUP seconds,
# dumps them (`callgrind_control -d`) BENCH_DURATION seconds later and divides the
# instructions (Ir, every thread of the server, user space only: the kernel's side of a
# syscall is not counted) by the requests the server answered meanwhile (calls, in the same
# dump, of a function each request makes once). For durable cells it also prints the
# ledger's commits (calls of commit_batch in the dump) over the measured run (callgrind runs
# the server about 50x slower while fdatasync keeps its real duration: compare the requests
# per commit with scripts/bench-load.sh's before reading the per-commit share).
# The dumps are kept in BENCH_OUT (default target/bench-instructions) for callgrind_annotate.
#
# Environment: BENCH_DURATION (default 20), BENCH_WARMUP (default 5), BENCH_CONNECTIONS
# (default "16 64"), BENCH_SCENARIOS (default "floor mutate-dry-run mutate-durable"),
# BENCH_PROFILE (default profiling: release with line tables, for callgrind_annotate; dist is
# what ships), BENCH_OUT, BENCH_BIN (a directory with
# ip-webhook and examples/bench_floor already built: no cargo build).
# A benchmark, not a test: it never fails on a number.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

duration=${BENCH_DURATION:-20}
warmup=${BENCH_WARMUP:-5}
connections=${BENCH_CONNECTIONS:-"16 64"}
scenarios=${BENCH_SCENARIOS:-"floor mutate-dry-run mutate-durable"}
profile=${BENCH_PROFILE:-profiling}
fixture="$root/tests/fixtures/pod-create-v1.json"
lua="$root/scripts/bench-load.lua"

for tool in valgrind callgrind_control wrk taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "$tool is required (apt-get install valgrind wrk)" >&2; exit 1; }
done

target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$BENCH_BIN # ip-webhook and examples/bench_floor already built (a copy, say)
else
  echo "building (profile $profile): ip-webhook, example bench_floor" >&2
  cargo build --profile "$profile" --quiet --bin ip-webhook --example bench_floor
  if [ "$profile" = dev ]; then bin="$target_dir/debug"; else bin="$target_dir/$profile"; fi
fi
out=${BENCH_OUT:-$target_dir/bench-instructions}
mkdir -p "$out"

work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT


# cell SCENARIO CONNS PATH MODE PER_REQUEST CMD...  (PER_REQUEST: a function called once per request)
cell() {
  local scenario=$1 conns=$2 path=$3 mode=$4 per_request=$5
  shift 5
  local log="$work/$scenario-$conns.log" dumps="$out/$scenario-c$conns"
  rm -f "$dumps".*
  : >"$log"
  taskset -c 0 valgrind --tool=callgrind --log-file="$out/valgrind-$scenario-$conns.txt" \
    --callgrind-out-file="$dumps.%p" "$@" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 600); do
    grep -q 'serving https://' "$log" && break
    kill -0 "$server_pid" 2>/dev/null || { echo "$scenario did not start:" >&2; cat "$log" "$out/valgrind-$scenario-$conns.txt" >&2; return 1; }
    sleep 0.1
  done
  local addr
  addr=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$log" | head -1)
  local url="https://$addr$path"
  # one wrk run: the counters are zeroed once its connections are open (their TLS handshakes
  # are not counted) and dumped before it ends; requests are counted in the dump itself (the
  # calls of a function every request makes once), so requests in flight at either end do not
  # skew the ratio
  taskset -c 1 wrk -t1 -c"$conns" -d"$((warmup + duration + 5))s" --timeout 10s -s "$lua" "$url" -- "$fixture" "$mode" "r$conns" >"$work/wrk.txt" &
  local wrk_pid=$!
  sleep "$warmup"
  callgrind_control -z "$server_pid" >/dev/null 2>&1 || { tail -20 "$out/valgrind-$scenario-$conns.txt" >&2; return 1; }
  sleep "$duration"
  callgrind_control -d "$scenario-c$conns" "$server_pid" >/dev/null 2>&1 || { tail -20 "$out/valgrind-$scenario-$conns.txt" >&2; return 1; }
  wait "$wrk_pid" || true
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
  # the dump made by -d (the last one written before the exit dump)
  local dump
  dump=$(grep -l "^desc: Trigger: Client Request: $scenario-c$conns\|^desc: Trigger: .*$scenario-c$conns" "$dumps".* 2>/dev/null | head -1)
  [ -n "$dump" ] || dump=$(ls -t "$dumps".* | tail -1)
  local ir batch="" requests
  ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
  requests=$(awk -v per="$per_request" '
      /^c?fn=/ { s = $0; sub(/^c?fn=/, "", s); cur = s
                 if (match(s, /^\([0-9]+\)/)) { id = substr(s, 1, RLENGTH); rest = substr(s, RLENGTH + 2)
                   if (rest != "") name[id] = rest; cur = name[id] }
                 if ($0 ~ /^cfn=/) callee = cur }
      /^calls=/ { split(substr($0, 7), a, " "); if (index(callee, per) && substr(callee, length(callee) - length(per) + 1) == per) n += a[1] }
      END { print n + 0 }' "$dump")
  if [ "$mode" = durable ]; then
    # ledger commits from the dump's call counts (the admin /metrics cannot be read under
    # valgrind: procfs's auxv check crashes the server there)
    batch=$(awk '
      /^c?fn=/ { s = $0; sub(/^c?fn=/, "", s); cur = s
                 if (match(s, /^\([0-9]+\)/)) { id = substr(s, 1, RLENGTH); rest = substr(s, RLENGTH + 2)
                   if (rest != "") name[id] = rest; cur = name[id] }
                 if ($0 ~ /^fn=/) caller = cur; else callee = cur }
      /^calls=/ { split(substr($0, 7), a, " ")
                  if (callee ~ /embedded::(writer::)?commit_batch$/) commits += a[1] }
      END { printf "commits %d", commits }' "$dump")
    batch=$(awk -v b="$batch" -v n="$requests" 'BEGIN { split(b, a, " "); printf "%s, %.1f requests/commit", b, a[2] ? n / a[2] : 0 }')
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$conns" "$requests" "$ir" "$dump" "$batch" >>"$work/results.tsv"
  awk -v s="$scenario" -v c="$conns" -v n="$requests" -v ir="$ir" -v b="$batch" \
    'BEGIN { printf "  %-15s c=%-3s %7d requests  %8.1fk instructions/request  %s\n", s, c, n, ir / n / 1000, b }' >&2
}

: >"$work/results.tsv"
echo "callgrind, profile $profile, ${duration}s per cell after ${warmup}s warm-up; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for conns in $connections; do
  for scenario in $scenarios; do
    # valgrind itself crashed once in a durable cell (SIGSEGV, not reproduced): one retry
    for attempt in 1 2; do
    if case $scenario in
      floor) cell floor "$conns" /mutate as-is 'hyper::proto::h1::conn::Conn<I,B,T>::write_head' "$bin/examples/bench_floor" 127.0.0.1:0 ;;
      mutate-dry-run) cell mutate-dry-run "$conns" /mutate dry-run 'hyper::proto::h1::conn::Conn<I,B,T>::write_head' "$bin/ip-webhook" serve \
        --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --state-dir "$work/state-dry-$conns" ;;
      mutate-durable) cell mutate-durable "$conns" /mutate durable 'hyper::proto::h1::conn::Conn<I,B,T>::write_head' "$bin/ip-webhook" serve \
        --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --state-dir "$work/state-durable-$conns" ;;
      *) echo "unknown scenario $scenario" >&2; exit 1 ;;
    esac; then break; fi
    kill "$server_pid" 2>/dev/null || true
    server_pid=
    echo "  $scenario c=$conns: the run failed (attempt $attempt)" >&2
    done
  done
done

echo
echo "instructions per request (callgrind, $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo unknown), profile $profile)"
awk -F'\t' '
  { ipr[$1 SUBSEP $2] = $4 / $3; n[$1 SUBSEP $2] = $3; b[$1 SUBSEP $2] = $6
    if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 }
    if (!($2 in cseen)) { cseen[$2] = 1; corder[++m] = $2 } }
  END {
    printf "%-15s %5s %9s %14s %9s %11s  %s\n", "scenario", "conns", "requests", "instr/request", "/floor", "/dry-run", "ledger"
    for (j = 1; j <= m; j++) for (i = 1; i <= k; i++) {
      c = corder[j]; s = order[i]; key = s SUBSEP c
      if (!(key in ipr)) continue
      f = (("floor" SUBSEP c) in ipr) ? sprintf("%.2f", ipr[key] / ipr["floor" SUBSEP c]) : "-"
      d = (("mutate-dry-run" SUBSEP c) in ipr) ? sprintf("%.2f", ipr[key] / ipr["mutate-dry-run" SUBSEP c]) : "-"
      printf "%-15s %5s %9d %13.1fk %9s %11s  %s\n", s, c, n[key], ipr[key] / 1000, f, d, b[key]
    }
  }' "$work/results.tsv"
echo "dumps: $out (callgrind_annotate FILE)"
