#!/usr/bin/env bash
# before_after.sh BUILD_A BUILD_B - the same workload against two builds of
# embps (say, a release and a change), alternating A and B so that the
# machine's drift hits both alike.
#
# Each build runs its own embps-server (--io-threads 2) and is driven by its
# own `embps bench --json` (library and server both count: a client change
# shows too). Both tables are primed (every id of the workload pushed once,
# untimed), then REPS rounds measure pull then push, A then B, then B then A
# in the next round. Besides rows/s it reads the server's CPU time over each
# phase (/proc/PID/stat): CPU microseconds per million rows moves less with
# a noisy neighbour than throughput does. It prints medians per build and
# the ratios B/A, and the median of the ratios within each round (paired).
#
# Environment (defaults): ROWS=10000000 DIM=64 BATCH=65536 ZIPF=1.05
# DEPTH=2 WORKERS=1 OPTIMIZER=adagrad REPS=5 SECONDS=4 WARMUP=1
# Exit status: 0 when every phase ran, 1 when one failed, 2 on usage errors.
set -uo pipefail

usage() { echo "usage: [VAR=value ...] $0 BUILD_A BUILD_B" >&2; exit 2; }
[ $# -eq 2 ] || usage
env_seconds=$(tr '\0' '\n' < /proc/$$/environ 2>/dev/null | sed -n 's/^SECONDS=//p')
ROWS=${ROWS:-10000000}
DIM=${DIM:-64}
BATCH=${BATCH:-65536}
ZIPF=${ZIPF:-1.05}
DEPTH=${DEPTH:-2}
WORKERS=${WORKERS:-1}
OPTIMIZER=${OPTIMIZER:-adagrad}
REPS=${REPS:-5}
PHASE_S=${env_seconds:-4}
WARMUP=${WARMUP:-1}
NB=8 # batches per workload, embps bench's default

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null; done
  wait 2> /dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

declare -A DIR PORT PID
for side in A B; do
  d=$1; shift
  DIR[$side]=$(cd "$d" 2> /dev/null && pwd) || { echo "before_after: no directory $d" >&2; exit 2; }
  for b in embps-server embps; do
    [ -x "${DIR[$side]}/$b" ] || { echo "before_after: ${DIR[$side]}/$b is missing" >&2; exit 2; }
  done
done

# start SIDE: its server on a free port; PORT[SIDE], PID[SIDE].
start() {
  local f=$TMP/$1.port
  "${DIR[$1]}/embps-server" --listen 127.0.0.1:0 --port-file "$f" --io-threads 2 \
    --max-frame-bytes 1073741824 --log-level warn > "$TMP/$1.log" 2>&1 &
  PID[$1]=$!
  PIDS+=("${PID[$1]}")
  for _ in $(seq 200); do
    [ -s "$f" ] && { PORT[$1]=$(cat "$f"); return 0; }
    kill -0 "${PID[$1]}" 2> /dev/null || break
    sleep 0.05
  done
  echo "before_after: the server of ${DIR[$1]} did not start:" >&2
  cat "$TMP/$1.log" >&2
  exit 1
}

cli() { local side=$1; shift; "${DIR[$side]}/embps" --servers "127.0.0.1:${PORT[$side]}" "$@"; }

# cpu_ticks PID: user + system clock ticks of the process so far.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

COMMON=(--table ab --keep --rows "$ROWS" --dim "$DIM" --batch "$BATCH" --zipf "$ZIPF"
        --batches "$NB" --depth "$DEPTH" --workers "$WORKERS" --optimizer "$OPTIMIZER")

# phase SIDE MODE REP: one measurement; appends "rows_per_s cpu_us_per_Mrow
# REP" to $TMP/SIDE.MODE.
phase() {
  local side=$1 mode=$2 rep=$3 t0 t1 out rate rows
  t0=$(cpu_ticks "${PID[$side]}")
  if ! out=$(cli "$side" bench --mode "$mode" "${COMMON[@]}" --no-prefill \
      --seconds "$PHASE_S" --warmup "$WARMUP" --json 2> "$TMP/err"); then
    echo "  $side $mode FAILED: $(head -c 300 "$TMP/err")"
    FAILED=1
    return
  fi
  t1=$(cpu_ticks "${PID[$side]}")
  rate=$(sed -n 's/.*"'"$mode"'_rows_per_s": *\([0-9.eE+]*\).*/\1/p' <<< "$out")
  # CPU over warm-up and measurement, per row of the measured rate over both
  rows=$(awk -v r="$rate" -v s="$PHASE_S" -v w="$WARMUP" 'BEGIN { print r * (s + w) }')
  awk -v r="$rate" -v n="$rows" -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v k="$rep" \
    'BEGIN { printf "%s %.0f %s\n", r, d / hz * 1e6 / (n / 1e6), k }' >> "$TMP/$side.$mode"
  echo "  $side $mode: $(awk -v r="$rate" 'BEGIN { printf "%.2f M rows/s", r / 1e6 }')"
}

# median: of the numbers on stdin, or nan
median() {
  sort -g | awk '{ v[NR] = $1 }
    END { if (!NR) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
          else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# med FILE COLUMN
med() { awk -v c="$2" '{ print $c }' "$1" | median; }
# paired MODE: the median over rounds of B's rows/s over A's in that round
paired() {
  awk 'NR == FNR { a[$3] = $1; next } ($3 in a) && a[$3] > 0 { print $1 / a[$3] }' \
    "$TMP/A.$1" "$TMP/B.$1" | median
}

FAILED=0
start A
start B
echo "embps before/after, $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "A: ${DIR[A]}"
echo "B: ${DIR[B]}"
echo "workload: batch $BATCH Zipf($ZIPF) over $ROWS rows, dim $DIM, depth $DEPTH," \
     "$WORKERS worker(s), $OPTIMIZER; $REPS rounds x ($WARMUP s + $PHASE_S s) per phase"
for side in A B; do
  cli "$side" bench --mode push "${COMMON[@]}" --batch $((NB * BATCH)) --batches 1 \
    --depth 1 --seconds 0.1 --warmup 0 > /dev/null 2> "$TMP/err" ||
    { echo "before_after: priming $side failed: $(head -c 300 "$TMP/err")" >&2; exit 1; }
done
for rep in $(seq "$REPS"); do
  order="A B"; [ $((rep % 2)) = 0 ] && order="B A"
  echo "round $rep/$REPS ($order)"
  for mode in pull push; do
    for side in $order; do phase "$side" "$mode" "$rep"; done
  done
done

echo
printf '%-5s %14s %14s %8s %8s %16s %16s %8s\n' mode "A rows/s" "B rows/s" "B/A" \
  paired "A cpu us/Mrow" "B cpu us/Mrow" "B/A"
for mode in pull push; do
  ra=$(med "$TMP/A.$mode" 1); rb=$(med "$TMP/B.$mode" 1)
  ca=$(med "$TMP/A.$mode" 2); cb=$(med "$TMP/B.$mode" 2)
  awk -v m="$mode" -v ra="$ra" -v rb="$rb" -v ca="$ca" -v cb="$cb" -v p="$(paired "$mode")" 'BEGIN {
    printf "%-5s %12.2f M %12.2f M %8.3f %8.3f %16.0f %16.0f %8.3f\n", m, ra / 1e6, rb / 1e6,
      (ra > 0 ? rb / ra : 0), p, ca, cb, (ca > 0 ? cb / ca : 0) }'
done
echo "paired: the median over rounds of B/A within a round"
exit "$FAILED"
