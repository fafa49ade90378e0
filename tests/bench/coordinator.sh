#!/usr/bin/env bash
# coordinator.sh BUILD_DIR - what automatic failover costs a member's
# pushes when nothing fails (issue 22's target: >= 0.95 x the same member
# without it). One member of two servers on this machine, a primary and
# its follower, pushed by `embps bench` (8 worker connections, push only,
# dim DIM) listing the member's two servers ("PRIMARY|FOLLOWER", as a job
# lists them: writes go to the primary, and a refusal naming another
# server is followed within the library's retry window; PRIMARY_ONLY=1:
# the primary's address alone, where such a refusal fails the run), in
# two set-ups:
#   follow  the follower started with --follow PRIMARY, no etcd involved;
#   coord   both servers with --coordinator (one etcd on loopback, started
#           here for the whole run), the first one elected, the second
#           following whoever etcd names;
# each with --sync-followers 1 and 0. Every round runs the four, the two
# set-ups of a --sync-followers value back to back in alternating order
# (follow first in odd rounds, coord first in even ones), so a noisy
# neighbour hits both of a pair alike; a pair's ratio is coord / follow.
# Printed per --sync-followers value: the median rows/s of each set-up,
# the median of the paired ratios and their range; and the primary's CPU
# time (user + system, /proc/PID/stat) per million pushed rows, which a
# noisy neighbour moves less than it moves throughput, with the median of
# its paired ratios.
# CALLGRIND=1: instead, one run of each set-up with the primary under
# valgrind --tool=callgrind (one I/O and one OpenMP thread, BENCH_SECONDS
# 5, PUSH_ROWS 100000, LEASE_MS 10000): the primary's instructions per
# pushed row (the rows it counted, `embps stats`), and those of the coordinator's own functions (coord*,
# failover*, etcd*) beside the whole: what the coordinator costs a push,
# counted rather than timed.
# Environment: PUSH_ROWS (1000000, the table), DIM (64), BENCH_SECONDS
# (10), REPEAT (5), SHARDS (16), LEASE_MS (3000, the servers' default),
# CALLGRIND (0), PRIMARY_ONLY (0),
# SMALL=1 for a smoke run (PUSH_ROWS=20000, BENCH_SECONDS=1, REPEAT=1).
# A run that fails (say a primary whose lease lapsed on an overloaded
# machine refused the bench's pushes) is listed at the end and its pair
# left out. Needs etcd (scripts/install-deps.sh installs Debian's etcd-server; ETCD=
# names another binary). Figures only mean something on a quiet machine.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
SRV=$BUILD/embps-server
CLI=$BUILD/embps
PY=/usr/bin/python3
ETCD=${ETCD:-$(command -v etcd || echo /usr/bin/etcd)}
[ -x "$ETCD" ] || { echo "coordinator.sh: no etcd at $ETCD" >&2; exit 2; }
if [ "${CALLGRIND:-0}" = 1 ]; then
  command -v valgrind >/dev/null || { echo "coordinator.sh: CALLGRIND=1 needs valgrind" >&2; exit 2; }
  PUSH_ROWS=${PUSH_ROWS:-100000}; SECONDS_=${BENCH_SECONDS:-5}; REPEAT=1
  # a primary under valgrind renews late: a lease that outlasts that
  LEASE_MS=${LEASE_MS:-10000}
elif [ "${SMALL:-0}" = 1 ]; then
  PUSH_ROWS=${PUSH_ROWS:-20000}; SECONDS_=${BENCH_SECONDS:-1}
  REPEAT=${REPEAT:-1}
else
  PUSH_ROWS=${PUSH_ROWS:-1000000}; SECONDS_=${BENCH_SECONDS:-10}
  REPEAT=${REPEAT:-5}
fi
DIM=${DIM:-64}
SHARDS=${SHARDS:-16}
LEASE_MS=${LEASE_MS:-3000}
TMP=$(mktemp -d)
PIDS=()
ETCD_PID=
cleanup() {
  for p in "${PIDS[@]}" $ETCD_PID; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() {
  $PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"
}

# etcd, alone, on two free loopback ports, for the whole run
EC=$(free_port); EP=$(free_port)
"$ETCD" --name bench --data-dir "$TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$EC" \
  --advertise-client-urls "http://127.0.0.1:$EC" \
  --listen-peer-urls "http://127.0.0.1:$EP" \
  --initial-advertise-peer-urls "http://127.0.0.1:$EP" \
  --initial-cluster "bench=http://127.0.0.1:$EP" \
  --logger zap --log-level warn 2>"$TMP/etcd.log" &
ETCD_PID=$!
disown "$ETCD_PID" # killed at the end without a job notice
for _ in $(seq 1 300); do
  curl -fs "http://127.0.0.1:$EC/health" 2>/dev/null | grep -q true && break
  sleep 0.1
done
curl -fs "http://127.0.0.1:$EC/health" | grep -q true ||
  { echo "coordinator.sh: etcd did not start" >&2; cat "$TMP/etcd.log" >&2; exit 1; }
COORD=etcd://127.0.0.1:$EC

# start NAME [flags...]: a server; its address in $ADDR, pid in PIDS and
# $PID (with CALLGRIND=1 the primary runs under callgrind, its profile in
# $TMP/$CG)
start() {
  local name=$1; shift
  local pre=()
  if [ "${CALLGRIND:-0}" = 1 ] && [ "$name" = primary ]; then
    pre=(env OMP_WAIT_POLICY=passive valgrind --tool=callgrind
         --callgrind-out-file="$TMP/$CG")
    set -- --io-threads 1 --omp-threads 1 "$@"
  fi
  rm -f "$TMP/$name.port"
  "${pre[@]}" "$SRV" --listen 127.0.0.1:0 --port-file "$TMP/$name.port" \
    --shards "$SHARDS" "$@" 2>>"$TMP/$name.log" &
  PID=$!
  PIDS+=($PID)
  for _ in $(seq 1 3000); do
    [ -s "$TMP/$name.port" ] && break
    sleep 0.01
  done
  ADDR=127.0.0.1:$(cat "$TMP/$name.port")
}
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
stat_of() { "$CLI" --servers "$1" stats --json 2>/dev/null |
  $PY -c "import json,sys; print(json.load(sys.stdin)[0]['$2'])" 2>/dev/null || echo -1; }
# wait_for ADDR FIELD VALUE: until the server's stats say so (60 s)
wait_for() {
  for _ in $(seq 1 3000); do
    [ "$(stat_of "$1" "$2")" = "$3" ] && return 0
    sleep 0.02
  done
  echo "coordinator.sh: $1 never had $2 = $3" >&2
  tail -5 "$TMP"/*.log >&2
  exit 1
}
wait_in_sync() {
  for _ in $(seq 1 3000); do
    [ "$(stat_of "$1" followers_in_sync)" -ge 1 ] && return 0
    sleep 0.02
  done
  echo "coordinator.sh: no follower of $1 in sync" >&2
  exit 1
}

RUN=0
# member MODE SYNC: the two servers of the set-up up, the follower in
# sync; the primary's address in $P
member() {
  local mode=$1 sync=$2
  MODE_=$mode SYNC_=$sync
  RUN=$((RUN + 1))
  CG=$mode.$sync.cg
  if [ "$mode" = follow ]; then
    start primary --sync-followers "$sync" --sync-timeout-ms 10000
    P=$ADDR
    PPID_=$PID
    start follower --follow "$P"
    F=$ADDR
  else
    local c=(--coordinator "$COORD" --cluster-name "bench$RUN"
             --lease-ms "$LEASE_MS" --sync-followers "$sync"
             --sync-timeout-ms 10000)
    start primary "${c[@]}"
    P=$ADDR
    PPID_=$PID
    wait_for "$P" role 0 # elected
    start follower "${c[@]}"
    F=$ADDR
  fi
  wait_in_sync "$P"
  L="$P|$F"
  [ "${PRIMARY_ONLY:-0}" = 1 ] && L=$P
  return 0
}

# the primary's user + system CPU time, in clock ticks (over the whole
# bench command, its table's creation and warm-up included, per row the
# primary counted)
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# bench: "ROWS_PER_S CPU_US_PER_MILLION_ROWS" of one run against $P
bench() {
  local c0 c1 n0 n1 out
  n0=$(stat_of "$P" push_rows)
  c0=$(cpu_of "$PPID_")
  if ! out=$("$CLI" --servers "$L" bench --workers 8 --mode push \
      --rows "$PUSH_ROWS" --dim "$DIM" --seconds "$SECONDS_" --json \
      2>"$TMP/bench.err"); then
    echo "$MODE_ --sync-followers $SYNC_: $(tail -1 "$TMP/bench.err")" >>"$TMP/failed"
    echo "fail fail"
    return
  fi
  c1=$(cpu_of "$PPID_")
  n1=$(stat_of "$P" push_rows)
  echo "$out" | $PY -c "
import json, sys, os
r = json.load(sys.stdin)['push_rows_per_s']
print(r, ($c1 - $c0) * 1e6 / os.sysconf('SC_CLK_TCK') / max($n1 - $n0, 1) * 1e6)"
}

# callgrind_run MODE SYNC: instructions per pushed row of the primary
callgrind_run() {
  member "$1" "$2"
  "$CLI" --servers "$L" bench --workers 8 --mode push --rows "$PUSH_ROWS" \
    --dim "$DIM" --seconds "$SECONDS_" --json >/dev/null
  local rows
  rows=$(stat_of "$P" push_rows)
  stop_all
  $PY - "$TMP/$CG" "$rows" "$1" "$2" <<'PYEOF'
import re, subprocess, sys
out = subprocess.run(["callgrind_annotate", "--threshold=100", sys.argv[1]],
                     capture_output=True, text=True).stdout
total = own = 0
funcs = []
for line in out.splitlines():
    m = re.match(r"\s*([\d,]+)\s.*(PROGRAM TOTALS|\S+:(\S+))", line)
    if not m:
        continue
    ir = int(m.group(1).replace(",", ""))
    if m.group(2) == "PROGRAM TOTALS":
        total = ir
    elif re.match(r"embps_(coord|failover|etcd)|coord_|failover_|etcd_",
                  m.group(3) or ""):
        own += ir
        funcs.append((ir, m.group(3)))
rows = max(int(sys.argv[2]), 1)
print("%-6s --sync-followers %s: %d rows pushed, %.0f instructions per row, "
      "of which the coordinator's functions %.2f" % (sys.argv[3], sys.argv[4],
      rows, total / rows, own / rows))
for ir, f in sorted(funcs, reverse=True)[:4]:
    print("         %8.3f  %s" % (ir / rows, f))
PYEOF
}

LISTING="both servers"
[ "${PRIMARY_ONLY:-0}" = 1 ] && LISTING="the primary alone"
echo "# embps coordinator benchmark: $(date -u +%FT%TZ), $(nproc) cores," \
  "8 push workers, dim $DIM, $PUSH_ROWS rows, ${SECONDS_} s per run," \
  "lease $LEASE_MS ms, $REPEAT rounds, the bench listing $LISTING; load: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${CALLGRIND:-0}" = 1 ]; then
  for sync in 1 0; do
    for mode in follow coord; do callgrind_run "$mode" "$sync"; done
  done
  exit 0
fi
declare -A RATES RATIOS CPU CPURATIOS
for round in $(seq 1 "$REPEAT"); do
  for sync in 1 0; do
    if [ $((round % 2)) = 1 ]; then order="follow coord"; else order="coord follow"; fi
    declare -A r=() u=()
    for mode in $order; do
      member "$mode" "$sync"
      read -r r[$mode] u[$mode] < <(bench)
      stop_all
    done
    if [ "${r[follow]}" = fail ] || [ "${r[coord]}" = fail ]; then
      echo "round $round, --sync-followers $sync: a run failed (below); the pair is left out"
      continue
    fi
    for mode in follow coord; do
      RATES[$mode.$sync]+=" ${r[$mode]}"
      CPU[$mode.$sync]+=" ${u[$mode]}"
    done
    RATIOS[$sync]+=" $($PY -c "print(${r[coord]} / max(${r[follow]}, 1))")"
    CPURATIOS[$sync]+=" $($PY -c "print(${u[coord]} / max(${u[follow]}, 1e-9))")"
    printf 'round %d, --sync-followers %d: follow %.0f, coord %.0f rows/s;' \
      "$round" "$sync" "${r[follow]}" "${r[coord]}"
    printf ' primary CPU per 1M rows: follow %.3f s, coord %.3f s\n' \
      "$(echo "${u[follow]} / 1000000" | bc -l)" "$(echo "${u[coord]} / 1000000" | bc -l)"
  done
done
median() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -s "$TMP/failed" ]; then
  echo "# runs that failed ($(wc -l <"$TMP/failed")):"
  sed 's/^/#   /' "$TMP/failed"
fi
printf '%-18s %14s %14s %12s  %s\n' "" "follow rows/s" "coord rows/s" \
  "coord/follow" "(paired ratios: median [min, max])"
for sync in 1 0; do
  rs=$(printf '%s\n' ${RATIOS[$sync]} | sort -g)
  printf '%-18s %14.0f %14.0f %12.3f  [%.3f, %.3f]\n' "--sync-followers $sync" \
    "$(median "${RATES[follow.$sync]}")" "$(median "${RATES[coord.$sync]}")" \
    "$(median "${RATIOS[$sync]}")" "$(echo "$rs" | head -1)" "$(echo "$rs" | tail -1)"
done
printf '%-18s %14s %14s %12s  %s\n' "" "follow CPU s" "coord CPU s" \
  "coord/follow" "(the primary's CPU per 1M rows; paired ratios: median [min, max])"
for sync in 1 0; do
  rs=$(printf '%s\n' ${CPURATIOS[$sync]} | sort -g)
  printf '%-18s %14.3f %14.3f %12.3f  [%.3f, %.3f]\n' "--sync-followers $sync" \
    "$(echo "$(median "${CPU[follow.$sync]}") / 1000000" | bc -l)" \
    "$(echo "$(median "${CPU[coord.$sync]}") / 1000000" | bc -l)" \
    "$(median "${CPURATIOS[$sync]}")" "$(echo "$rs" | head -1)" "$(echo "$rs" | tail -1)"
done
