#!/usr/bin/env bash
# dynamic.sh BUILD_DIR - what admission and eviction (issue 12) cost.
#
# The standard workload of `embps bench` (Zipf(ZIPF) batches of BATCH ids
# over ROWS ids, dim DIM, OPTIMIZER) into a dynamic table, twice per rep,
# each on a fresh embps-server: plain (`--dynamic`), and with
# `--admit-after ADMIT --max-rows MAX_ROWS` (default 2 and ROWS / 4, so the
# capacity evicts all the time). Prints per case the median push and pull
# rows/s over REPS reps and the ratios policy / plain (issue 12 asks for
# push >= 0.8, pull unaffected). A measurement tool, not a test: run it on
# a quiet machine.
#
# Environment: ROWS=10000000 BATCH=65536 DIM=64 ZIPF=1.05 OPTIMIZER=adagrad
#   ADMIT=2 MAX_ROWS=ROWS/4 SECONDS=5 (or BENCH_SECONDS) WARMUP=1 REPS=3
#   QUICK=1: ROWS=1000000 BATCH=8192 SECONDS=0.5 WARMUP=0.2 REPS=1.
# Exit 0 when every run worked, 1 otherwise, 2 on a usage error.
set -uo pipefail

[ $# -eq 1 ] || { echo "usage: [VAR=value ...] $0 BUILD_DIR" >&2; exit 2; }
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "dynamic.sh: no directory $1" >&2; exit 2; }
[ -x "$BUILD/embps-server" ] && [ -x "$BUILD/embps" ] ||
  { echo "dynamic.sh: $BUILD has no embps-server and embps" >&2; exit 2; }
if [ "${QUICK:-0}" = 1 ]; then
  ROWS=${ROWS:-1000000} BATCH=${BATCH:-8192} REPS=${REPS:-1}
  BENCH_SECONDS=${BENCH_SECONDS:-0.5} WARMUP=${WARMUP:-0.2}
fi
ROWS=${ROWS:-10000000} BATCH=${BATCH:-65536} DIM=${DIM:-64}
ZIPF=${ZIPF:-1.05} OPTIMIZER=${OPTIMIZER:-adagrad} ADMIT=${ADMIT:-2}
MAX_ROWS=${MAX_ROWS:-$((ROWS / 4))} REPS=${REPS:-3} WARMUP=${WARMUP:-1}
BENCH_SECONDS=${BENCH_SECONDS:-5}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# run CASE ARGS...: one bench on a fresh server; appends its JSON line to
# $WORK/CASE.
run() {
  local name=$1; shift
  "$BUILD/embps-server" --listen 127.0.0.1:0 --port-file "$WORK/port" \
    --log-level warn 2>>"$WORK/server.log" &
  local pid=$! i
  for i in $(seq 100); do [ -s "$WORK/port" ] && break; sleep 0.05; done
  EMBPS_SERVERS=127.0.0.1:$(cat "$WORK/port") "$BUILD/embps" bench --json \
    --rows "$ROWS" --batch "$BATCH" --dim "$DIM" --zipf "$ZIPF" \
    --optimizer "$OPTIMIZER" --seconds "$BENCH_SECONDS" --warmup "$WARMUP" \
    --dynamic "$@" >>"$WORK/$name"
  local rc=$?
  kill "$pid"; wait "$pid" 2>/dev/null
  rm -f "$WORK/port"
  return $rc
}

status=0
for rep in $(seq "$REPS"); do
  run plain || status=1
  run policy --admit-after "$ADMIT" --max-rows "$MAX_ROWS" || status=1
done

/usr/bin/python3 - "$WORK" <<'PY'
import json, statistics, sys
work = sys.argv[1]
med = {}
for case in ("plain", "policy"):
    try:
        runs = [json.loads(l) for l in open("%s/%s" % (work, case)) if l.strip()]
    except OSError:
        runs = []
    if not runs:
        print("%s: no result" % case)
        sys.exit(1)
    med[case] = {k: statistics.median(r[k] for r in runs)
                 for k in ("push_rows_per_s", "pull_rows_per_s")}
    print("%-7s push %12.0f rows/s  pull %12.0f rows/s  (%d reps)"
          % (case, med[case]["push_rows_per_s"], med[case]["pull_rows_per_s"],
             len(runs)))
for k in ("push_rows_per_s", "pull_rows_per_s"):
    print("ratio policy/plain %s: %.3f" % (k.split("_")[0],
          med["policy"][k] / med["plain"][k]))
PY
[ $? -eq 0 ] || status=1
exit $status
