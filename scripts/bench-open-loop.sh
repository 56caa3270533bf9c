#!/usr/bin/env bash
# The durable path's targets in one run, each printed with its figure and a PASS/FAIL verdict:
#
#   1. decision path: dry-run /mutate and /validate CPU per request <= 2.0x the bare HTTPS
#      floor's (examples/bench_floor.rs), median of BENCH_DECIDE_RUNS runs, 16 connections;
#      and a plain HTTP/1.1 load as a user's wrk makes it: nothing pinned, wrk -t2 over
#      BENCH_WIDE_CONNECTIONS keep-alive connections, dry-run /mutate CPU per request <= 2.5x the
#      floor's under the same load (median of BENCH_DECIDE_RUNS, alternating);
#   2. durable, saturated: BENCH_SAT_RUNS runs of BENCH_SAT_SECONDS at 16 connections, each on a
#      fresh server and state dir, every request a new admission with a request uid never used
#      before (the run id is in each uid): the slowest request <= the disk's own slowest
#      fdatasync (a probe of the same dir in this run) + 20 ms in all but one run, and CPU per
#      request <= the dry run's + what a durable answer alone costs on this disk and core + 3 µs
#      (the floor with a group-committed record per request, bench_floor --journal, less the
#      plain floor): after each durable run, one run each of that durable floor, the plain floor
#      and the dry run make that round's budget, and the verdict reads the median round's excess
#      over its own budget (the machine's drift between rounds cancels); beside it, one run
#      committed on the runtime's own thread (--journal-inline);
#   3. durable, open loop: a constant BENCH_RATE admissions/s for BENCH_OPEN_SECONDS
#      (examples/bench_client.rs with a rate: each request's latency counts from when it was due,
#      so a stall counts for every request it held up): p99 <= 2 ms and the slowest <= the
#      probe's slowest + 10 ms;
#   4. memory and restart: a state dir of BENCH_CLAIMS claims (examples/ledger_load.rs), the
#      server started on it: RSS per held claim at ready (against the same server on an empty
#      dir) <= 512 bytes, and restart to ready (/readyz 200) <= 1 s;
#   5. the stalls: the server logs each ledger answer, commit and journal growth slower than
#      20 ms with its stages (queue, commit, write, fdatasync, wake-up); the script prints how
#      many each run had and the slowest, beside the probe's slowest and the run's host steal.
#
# Host steal (from /proc/stat, all CPUs) is printed for every run: a VM whose host took time
# from it shows that here, and a stall that the probe or the floor show in the same run is the
# host's, not the server's.
#
#   scripts/bench-open-loop.sh                 # the full run: about 7 minutes after the build
#   BENCH_SHORT=1 scripts/bench-open-loop.sh   # a quick check that it works (about 1 minute)
#
# Environment: BENCH_PROFILE (cargo profile, default dist: what ships), BENCH_SERVER_CPU /
# BENCH_LOAD_CPU (default 0 / 1), BENCH_DECIDE_RUNS (3), BENCH_DECIDE_SECONDS (5),
# BENCH_WIDE_CONNECTIONS (64), BENCH_SAT_RUNS (5), BENCH_SAT_SECONDS (15), BENCH_PROBE_SECONDS (15), BENCH_RATE (2000),
# BENCH_OPEN_SECONDS (30), BENCH_OPEN_CONNECTIONS (32), BENCH_CLAIMS (200000), BENCH_SHORT (1:
# every run shorter and fewer, for a busy machine; its verdicts mean little), BENCH_BIN (a
# directory with ip-webhook and the examples already built: no cargo build).
# A benchmark, not a test: it exits 0 whatever the verdicts.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

short=${BENCH_SHORT:-0}
if [ "$short" = 1 ]; then
  d_runs=1 d_secs=2 s_runs=2 s_secs=3 p_secs=3 rate=${BENCH_RATE:-2000} o_secs=5 claims=${BENCH_CLAIMS:-50000}
else
  d_runs=3 d_secs=5 s_runs=5 s_secs=15 p_secs=15 rate=2000 o_secs=30 claims=200000
fi
d_runs=${BENCH_DECIDE_RUNS:-$d_runs}
d_secs=${BENCH_DECIDE_SECONDS:-$d_secs}
s_runs=${BENCH_SAT_RUNS:-$s_runs}
s_secs=${BENCH_SAT_SECONDS:-$s_secs}
p_secs=${BENCH_PROBE_SECONDS:-$p_secs}
rate=${BENCH_RATE:-$rate}
o_secs=${BENCH_OPEN_SECONDS:-$o_secs}
o_conns=${BENCH_OPEN_CONNECTIONS:-32}
claims=${BENCH_CLAIMS:-$claims}
server_cpu=${BENCH_SERVER_CPU:-0}
load_cpu=${BENCH_LOAD_CPU:-1}
profile=${BENCH_PROFILE:-dist}
fixture="$root/tests/fixtures/pod-create-v1.json"
lua="$root/scripts/bench-load.lua"
stamp=$(date +%s) # in every durable run id: no two runs, of this script or another, share a uid

if ! command -v wrk >/dev/null; then
  echo "wrk is missing; installing it (Debian package wrk)" >&2
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq wrk >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq wrk >/dev/null
  fi
fi
for tool in taskset curl awk; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

if [ -n "${BENCH_BIN:-}" ]; then
  bin=$BENCH_BIN
else
  echo "building (profile $profile): ip-webhook, examples bench_floor, bench_client, ledger_load" >&2
  cargo build --profile "$profile" --quiet --bin ip-webhook --example bench_floor --example bench_client --example ledger_load
  target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  if [ "$profile" = dev ]; then bin="$target_dir/debug"; else bin="$target_dir/$profile"; fi
fi

work=$(mktemp -d)
# The servers' logs (a line per grant: ~70 MB in a saturated run) go to memory when the machine
# has a tmpfs: written to the disk under test, the kernel writes them back about 30 s later, and
# every fdatasync then waits behind that writeback (40-60 ms on this VM), so a run would time
# the harness's own files. For the same reason the build's output, and each removed state dir,
# are synced before the next measurement starts.
logs=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work" "$logs"
}
trap cleanup EXIT
clk_tck=$(getconf CLK_TCK)
verdicts="$work/verdicts.txt"
runs="$work/runs.txt" # every run's own line, printed again under the table
: >"$verdicts"
: >"$runs"
say() { echo "$*" | tee -a "$runs" >&2; }

# start_server NAME CMD... : CMD on the server core; sets $server_pid, $server_addr, $admin_addr
start_server() {
  local name=$1
  shift
  local log="$logs/$name.log"
  : >"$log"
  taskset -c "${cpus:-$server_cpu}" "$@" >"$log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  for _ in $(seq 1 600); do
    grep -q 'serving https://' "$log" && break
    kill -0 "$server_pid" 2>/dev/null || { echo "$name did not start:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.05
  done
  server_addr=$(sed -n 's|.*serving https://\([0-9.:]*\).*|\1|p' "$log" | head -1)
  admin_addr=$(sed -n 's|.*(admin http://\([0-9.:]*\)).*|\1|p' "$log" | head -1)
  [ -n "$server_addr" ] || { echo "$name printed no address:" >&2; cat "$log" >&2; exit 1; }
}

stop_server() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

ip_webhook() { # ip_webhook NAME STATE_DIR: the server as every cell runs it
  start_server "$1" "$bin/ip-webhook" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --state-dir "$2"
}

cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# The cpu line of /proc/stat: total and steal ticks, all CPUs.
stat_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t, $9 }' /proc/stat; }

# steal BEFORE AFTER: "S s (P %)": seconds of steal over all CPUs, and its share of their time
# (the ternary in parentheses: a bare `>` among awk's printf arguments is a redirection)
steal() {
  awk -v b="$1" -v a="$2" -v t="$clk_tck" 'BEGIN { split(b, x, " "); split(a, y, " ")
    d = y[1] - x[1]; s = y[2] - x[2]; printf "%.2f s (%.1f %%)", s / t, (d > 0 ? 100 * s / d : 0) }'
}

metric() { # metric NAME [FILTER]: a counter family's sum from the admin /metrics
  curl -sf "http://$admin_addr/metrics" |
    awk -v name="$1" -v filter="${2:-}" '$1 ~ "^"name"(\\{|$)" && index($1, filter) { sum += $2 } END { print sum + 0 }'
}

to_us() { # wrk's "1.23ms", "456.00us", "1.02s" in µs
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); print v + 0 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); print v * 1000 }
    else if (v ~ /s$/) { sub(/s$/, "", v); print v * 1000000 }
    else print "nan" }'
}

# wrk_run PID URL MODE CONNS SECONDS RUN_ID OUT: one wrk run on the load core; appends
# "cpu_us rps p99_us max_us requests steal" to OUT
wrk_run() {
  local pid=$1 url=$2 mode=$3 conns=$4 secs=$5 run_id=$6 out=$7
  local before after s0 s1 txt="$work/wrk-$run_id.txt"
  before=$(cpu_ticks "$pid")
  s0=$(stat_ticks)
  taskset -c "${cpus:-$load_cpu}" wrk -t"${wrk_threads:-1}" -c"$conns" -d"${secs}s" --latency -s "$lua" "$url" -- "$fixture" "$mode" "$run_id" >"$txt"
  s1=$(stat_ticks)
  after=$(cpu_ticks "$pid")
  grep -q 'Socket errors' "$txt" && echo "warning: $run_id: $(grep 'Socket errors' "$txt")" >&2
  grep -q 'Non-2xx' "$txt" && echo "warning: $run_id: $(grep 'Non-2xx' "$txt")" >&2
  local requests rps p99 max
  requests=$(awk '/requests in/ { print $1 }' "$txt")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$txt")
  p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$txt")")
  max=$(to_us "$(awk '$1 == "Latency" { print $4 }' "$txt")")
  awk -v d="$((after - before))" -v t="$clk_tck" -v n="$requests" -v r="$rps" -v p="$p99" -v m="$max" -v st="$(steal "$s0" "$s1")" \
    'BEGIN { printf "%.1f %.0f %.0f %.0f %d %s\n", d * 1e6 / t / n, r, p, m, n, st }' >>"$out"
}

# median FILE [COLUMN]: the median of a column (default 1: a run's CPU per request) of FILE's lines
median() {
  local column=${2:-1}
  sort -n -k"$column,$column" "$1" | sed -n "$((($(wc -l <"$1") + 1) / 2))p" | cut -d' ' -f"$column"
}

# log_runs LABEL FIRST < LINES: one logged line per run of wrk_run's LINES, numbered from FIRST
log_runs() {
  awk -v c="$1" -v first="$2" '{ printf "  %-9s run %d: cpu %6.1f µs/req  %7.0f req/s  p99 %7.0f µs  max %8.0f µs  host steal %s %s %s %s\n", c, first + NR - 1, $1, $2, $3, $4, $6, $7, $8, $9 }' | tee -a "$runs" >&2
}

verdict() { # verdict TARGET FIGURE LIMIT PASS?
  local mark=FAIL
  [ "$4" = 1 ] && mark=PASS
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$mark" >>"$verdicts"
  printf '%s  %s: %s (limit %s)\n' "$mark" "$1" "$2" "$3" >&2
}

# The slowest lines of the server's own stall trace in LOG: counts and the worst of each kind.
stall_trace() {
  local log=$1
  awk '
    /slow ledger answer/ { n++; if (match($0, /total_us=[0-9]+/)) { v = substr($0, RSTART + 9, RLENGTH - 9) + 0; if (v > worst) { worst = v; line = $0 } } }
    /slow ledger commit/ { c++ }
    /slow journal commit/ { j++; if (match($0, /sync_us=[0-9]+/)) { v = substr($0, RSTART + 8, RLENGTH - 8) + 0; if (v > ws) ws = v } }
    /slow journal growth/ { g++ }
    /admission decision/ && match($0, /latency_us=[0-9]+/) { v = substr($0, RSTART + 11, RLENGTH - 11) + 0; if (v > 20000) a++ }
    END {
      printf "    server trace: %d decisions over 20 ms; %d ledger answers over 20 ms, %d commits, %d journal writes (slowest fdatasync %.1f ms), %d growths\n", a, n, c, j, ws / 1000, g
      if (line != "") { sub(/^.*slow ledger answer/, "", line); printf "    slowest ledger answer:%s\n", line }
    }' "$log" >&2
}

echo "machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(uname -r); load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "server on core $server_cpu, clients on core $load_cpu; profile $profile" >&2

# --- the disk's own tail, same file system as every state dir below
sync
s0=$(stat_ticks)
probe=$(taskset -c "$server_cpu" "$bin/examples/ledger_load" probe-for "$work/probe" "$p_secs")
s1=$(stat_ticks)
say "  $probe; host steal $(steal "$s0" "$s1")"
probe_max=$(sed -n 's/.* max=\([0-9]*\)us.*/\1/p' <<<"$probe")

# --- 1. the decision path against the floor
start_server floor "$bin/examples/bench_floor" 127.0.0.1:0 --ca-out "$work/floor-ca.pem"
floor_pid=$server_pid floor_url="https://$server_addr/mutate"
ip_webhook decide "$work/decide-state"
decide_pid=$server_pid decide_addr=$server_addr
for cell in floor dry validate; do : >"$work/decide-$cell.txt"; done
for run in $(seq 1 "$d_runs"); do
  # alternating, so a change of the machine's load falls on every cell alike
  wrk_run "$floor_pid" "$floor_url" as-is 16 "$d_secs" "floor-$run" "$work/decide-floor.txt"
  wrk_run "$decide_pid" "https://$decide_addr/mutate" dry-run 16 "$d_secs" "dry-$run" "$work/decide-dry.txt"
  wrk_run "$decide_pid" "https://$decide_addr/validate" as-is 16 "$d_secs" "validate-$run" "$work/decide-validate.txt"
done
stop_server "$floor_pid"
stop_server "$decide_pid"
floor_cpu=$(median "$work/decide-floor.txt")
dry_cpu=$(median "$work/decide-dry.txt")
validate_cpu=$(median "$work/decide-validate.txt")
for cell in floor dry validate; do
  log_runs "$cell" 1 <"$work/decide-$cell.txt"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { print (a <= b) ? 1 : 0 }'; }
verdict "1. dry-run /mutate CPU per request ÷ the floor's (16 conn., median of $d_runs)" \
  "$(ratio "$dry_cpu" "$floor_cpu")× ($dry_cpu / $floor_cpu µs)" "2.0×" "$(le "$(ratio "$dry_cpu" "$floor_cpu")" 2.0)"
verdict "1. /validate CPU per request ÷ the floor's (16 conn., median of $d_runs)" \
  "$(ratio "$validate_cpu" "$floor_cpu")× ($validate_cpu / $floor_cpu µs)" "2.0×" "$(le "$(ratio "$validate_cpu" "$floor_cpu")" 2.0)"

# --- 1b. a plain HTTP/1.1 load as a user's wrk makes it: the servers and wrk on every core,
# wrk's two threads over many keep-alive connections (each a TLS session of its own), the same
# dry-run review; the floor under the same load is the measure, alternating with it
all_cpus="0-$(($(nproc) - 1))"
wide=${BENCH_WIDE_CONNECTIONS:-64}
cpus=$all_cpus start_server wide-floor "$bin/examples/bench_floor" 127.0.0.1:0 --ca-out "$work/wide-floor-ca.pem"
wide_floor_pid=$server_pid wide_floor_url="https://$server_addr/mutate"
cpus=$all_cpus ip_webhook wide "$work/wide-state"
wide_pid=$server_pid wide_url="https://$server_addr/mutate"
for cell in floor dry; do : >"$work/wide-$cell.txt"; done
for run in $(seq 1 "$d_runs"); do
  cpus=$all_cpus wrk_threads=2 wrk_run "$wide_floor_pid" "$wide_floor_url" dry-run "$wide" "$d_secs" "wide-floor-$run" "$work/wide-floor.txt"
  cpus=$all_cpus wrk_threads=2 wrk_run "$wide_pid" "$wide_url" dry-run "$wide" "$d_secs" "wide-dry-$run" "$work/wide-dry.txt"
done
stop_server "$wide_floor_pid"
stop_server "$wide_pid"
wide_floor_cpu=$(median "$work/wide-floor.txt")
wide_dry_cpu=$(median "$work/wide-dry.txt")
for cell in floor dry; do
  log_runs "wide $cell" 1 <"$work/wide-$cell.txt"
done
verdict "1. dry-run /mutate CPU per request ÷ the floor's, plain HTTP/1.1 load (wrk -t2, $wide conn., unpinned, median of $d_runs)" \
  "$(ratio "$wide_dry_cpu" "$wide_floor_cpu")× ($wide_dry_cpu / $wide_floor_cpu µs)" "2.5×" "$(le "$(ratio "$wide_dry_cpu" "$wide_floor_cpu")" 2.5)"

# --- 2. durable, saturated: a fresh server and state dir per run. Each run is followed by the
# cells its budget is made of, so that the machine's drift falls on all of them alike: the floor
# with a group-committed record per request (bench_floor --journal: a durable answer and nothing
# else, on a fresh journal), the plain floor and the dry run (long-lived servers, as in part 1).
# durable_floor NAME FLAG OUT: one run of the floor with FLAG, appended to OUT and logged
durable_floor() {
  start_server "$1" "$bin/examples/bench_floor" 127.0.0.1:0 --ca-out "$work/$1-ca.pem" "$2" "$work/$1-journal"
  wrk_run "$server_pid" "https://$server_addr/mutate" as-is 16 "$s_secs" "$1" "$3"
  stop_server "$server_pid"
  rm -rf "$work/$1-journal"
  local cpu rps max st1 st2 st3 st4
  read -r cpu rps _ max _ st1 st2 st3 st4 < <(tail -1 "$3")
  say "$(printf '  %s: cpu %6.1f µs/req  %7.0f req/s  slowest %8.0f µs  host steal %s %s %s %s' "$1" "$cpu" "$rps" "$max" "$st1" "$st2" "$st3" "$st4")"
}
start_server sat-floor "$bin/examples/bench_floor" 127.0.0.1:0 --ca-out "$work/sat-floor-ca.pem"
sat_floor_pid=$server_pid sat_floor_url="https://$server_addr/mutate"
ip_webhook sat-dry "$work/sat-dry-state"
sat_dry_pid=$server_pid sat_dry_url="https://$server_addr/mutate"
for cell in sat sat-floor sat-dry floor-durable; do : >"$work/$cell.txt"; done
passes=0
for run in $(seq 1 "$s_runs"); do
  ip_webhook "sat-$run" "$work/sat-state-$run"
  rss0=$(rss_kib "$server_pid")
  wrk_run "$server_pid" "https://$server_addr/mutate" durable 16 "$s_secs" "sat-$stamp-$run" "$work/sat.txt"
  held=$(metric ip_webhook_allocations_total 'outcome="allocated"')
  rss1=$(rss_kib "$server_pid")
  read -r cpu rps p99 max requests st1 st2 st3 st4 < <(tail -1 "$work/sat.txt")
  [ "$held" -lt "$requests" ] && echo "warning: sat-$run: $held allocations for $requests requests" >&2
  ok=$(le "$max" "$((probe_max + 20000))")
  passes=$((passes + ok))
  printf '  durable run %d: cpu %6.1f µs/req  %7.0f req/s  wrk p99 (corrected) %8.0f µs  slowest %8.0f µs  %s  claims %d  RSS +%.0f B/claim  host steal %s %s %s %s\n' \
    "$run" "$cpu" "$rps" "$p99" "$max" "$([ "$ok" = 1 ] && echo ok || echo OVER)" "$held" "$(awk -v a="$rss0" -v b="$rss1" -v n="$held" 'BEGIN { print n ? (b - a) * 1024 / n : 0 }')" "$st1" "$st2" "$st3" "$st4" | tee -a "$runs" >&2
  stall_trace "$logs/sat-$run.log" 2>&1 | tee -a "$runs" >&2
  stop_server "$server_pid"
  rm -rf "$work/sat-state-$run"
  sync -f "$work"
  durable_floor "floor-durable-$run" --journal "$work/floor-durable.txt"
  sync -f "$work"
  wrk_run "$sat_floor_pid" "$sat_floor_url" as-is 16 "$d_secs" "sat-floor-$run" "$work/sat-floor.txt"
  wrk_run "$sat_dry_pid" "$sat_dry_url" dry-run 16 "$d_secs" "sat-dry-$run" "$work/sat-dry.txt"
  for cell in sat-floor sat-dry; do
    tail -1 "$work/$cell.txt" | log_runs "$cell" "$run"
  done
done
stop_server "$sat_floor_pid"
stop_server "$sat_dry_pid"
sat_cpu=$(median "$work/sat.txt")
sd_cpu=$(median "$work/sat-dry.txt")
slowest=$(awk '{ print $4 }' "$work/sat.txt" | paste -sd' ')
# beside it, the same commits made on the runtime's own thread (--journal-inline: no hand-over,
# the runtime waits out the sync), one run
: >"$work/floor-inline.txt"
durable_floor floor-inline --journal-inline "$work/floor-inline.txt"
fi_cpu=$(median "$work/floor-inline.txt")
# Round by round (a durable run and the cells run after it, a line each): what a durable answer
# alone costs (the durable floor - the plain floor), the durable CPU's budget (the dry run + that
# + 3 µs for the claim itself: its record, its index entry, its answer's patch), and how far the
# durable run was over it. Each is taken within its round, so that the machine's drift between
# rounds cancels, and the medians of the rounds are what the verdict reads.
paste -d' ' <(cut -d' ' -f1 "$work/sat.txt") <(cut -d' ' -f1 "$work/sat-dry.txt") \
  <(cut -d' ' -f1 "$work/floor-durable.txt") <(cut -d' ' -f1 "$work/sat-floor.txt") |
  awk '{ alone = $3 - $4; budget = $2 + alone + 3; printf "%.1f %.1f %.1f\n", alone, budget, $1 - budget }' >"$work/rounds.txt"
durable_alone=$(median "$work/rounds.txt" 1)
durable_budget=$(median "$work/rounds.txt" 2)
durable_over=$(median "$work/rounds.txt" 3)
over_rounds=$(cut -d' ' -f3 "$work/rounds.txt" | paste -sd' ' | sed 's/ /, /g')
say "$(awk -v a="$durable_alone" -v fi="$fi_cpu" -v f="$(median "$work/sat-floor.txt")" -v s="$sat_cpu" -v d="$sd_cpu" -v o="$over_rounds" 'BEGIN { printf "    a durable answer alone (floor-durable - floor, median of the rounds) costs %.1f µs/req, %.1f committed on the runtime'"'"'s thread (floor-inline, one run); ip-webhook durable - dry run (medians): %.1f µs/req; each round'"'"'s durable run over its budget by %s µs", a, fi - f, s - d, o }')"
need=$((s_runs > 1 ? s_runs - 1 : 1))
ms() { awk -v v="$1" 'BEGIN { printf "%.1f ms", v / 1000 }'; }
verdict "2. durable, 16 conn., ${s_secs} s runs: runs whose slowest request ≤ the probe's slowest fdatasync + 20 ms" \
  "$passes of $s_runs (slowest: $(for v in $slowest; do ms "$v"; echo -n ', '; done | sed 's/, $//'); probe $(ms "$probe_max"))" \
  "$need of $s_runs" "$([ "$passes" -ge "$need" ] && echo 1 || echo 0)"
verdict "2. durable CPU per request ≤ dry run + durable answer alone + 3 µs (16 conn., medians of $s_runs, alternating)" \
  "$sat_cpu µs (dry run $sd_cpu, durable answer alone $durable_alone; over its round's budget by $durable_over µs in the median round)" \
  "$durable_budget µs" "$(le "$durable_over" 0)"

# --- 3. durable, open loop at a constant rate
ip_webhook open "$work/open-state"
s0=$(stat_ticks)
open=$(taskset -c "$load_cpu" "$bin/examples/bench_client" "https://$server_addr/mutate" "$fixture" durable "$o_conns" "$o_secs" "$work/open-state/ca.crt" "open-$stamp" "$rate")
s1=$(stat_ticks)
say "  open loop $rate/s for ${o_secs}s over $o_conns connections: $open; host steal $(steal "$s0" "$s1")"
stall_trace "$logs/open.log" 2>&1 | tee -a "$runs" >&2
stop_server "$server_pid"
o_p99=$(sed -n 's/.* p99_us=\([0-9]*\) .*/\1/p' <<<"$open")
o_max=$(sed -n 's/.* max_us=\([0-9]*\) .*/\1/p' <<<"$open")
o_n=$(sed -n 's/^requests=\([0-9]*\) .*/\1/p' <<<"$open")
verdict "3. durable, open loop at $rate admissions/s for ${o_secs} s: p99 from the due time" \
  "$(awk -v v="$o_p99" 'BEGIN { printf "%.2f ms", v / 1000 }') ($o_n requests)" "2 ms" "$(le "$o_p99" 2000)"
verdict "3. durable, open loop at $rate admissions/s: slowest request" \
  "$(ms "$o_max")" "probe $(ms "$probe_max") + 10 ms" "$(le "$o_max" "$((probe_max + 10000))")"

# --- 4. memory per held claim and restart to ready
ip_webhook empty "$work/empty-state"
for _ in $(seq 1 100); do curl -sf "http://$admin_addr/readyz" >/dev/null && break; sleep 0.05; done
empty_kib=$(rss_kib "$server_pid")
stop_server "$server_pid"
fill=$(taskset -c "$server_cpu" "$bin/examples/ledger_load" restart "$work/full-state" "$claims")
say "  $fill"
started=$(date +%s%N)
ip_webhook full "$work/full-state"
for _ in $(seq 1 2000); do curl -sf "http://$admin_addr/readyz" >/dev/null && break; sleep 0.005; done
ready=$(date +%s%N)
full_kib=$(rss_kib "$server_pid")
ready_cpu=$(awk -v d="$(cpu_ticks "$server_pid")" -v t="$clk_tck" 'BEGIN { printf "%.2f", d / t }')
stop_server "$server_pid"
per_claim=$(awk -v a="$empty_kib" -v b="$full_kib" -v n="$claims" 'BEGIN { printf "%.0f", (b - a) * 1024 / n }')
ready_s=$(awk -v a="$started" -v b="$ready" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
say "  RSS at ready: $((empty_kib / 1024)) MiB empty, $((full_kib / 1024)) MiB with $claims claims; CPU to ready ${ready_cpu} s"
verdict "4. RSS per held claim at $claims claims (at ready, against an empty start)" "$per_claim B" "512 B" "$(le "$per_claim" 512)"
verdict "4. restart to ready (/readyz) at $claims claims" "$ready_s s (CPU $ready_cpu s)" "1 s" "$(le "$ready_s" 1)"

echo
echo "ip-webhook open-loop benchmark ($(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo unknown), profile $profile$([ "$short" = 1 ] && echo ', SHORT: not a measurement'))"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $probe"
printf '| target | figure | limit | verdict |\n|---|---|---|---|\n'
awk -F'\t' '{ printf "| %s | %s | ≤ %s | %s |\n", $1, $2, $3, $4 }' "$verdicts"
echo
echo "runs (host steal from /proc/stat, all CPUs, over each run):"
cat "$runs"
