#!/usr/bin/env bash
# scale.sh BUILD_DIR - does a push cost the same whatever the table's size?
#
# Pushes 65,536-id Zipf batches (`embps bench`) into three tables, each rep
# on a fresh embps-server, and prints per case the push rate, p50/p99, the
# pull rate, and the server's RSS (/proc/PID/status) before the table is
# created and after the pushes (the table is kept), plus the peak (VmHWM):
#   dense SMALL_ROWS (1M) rows, dense LARGE_ROWS (100M) rows, and a dynamic
#   table whose ids span the whole int64 range.
# `embps bench --dynamic` maps each id of [0, --rows) through embps_mix64, a
# bijection of the 64-bit integers, so the ids span the whole int64 range
# (older versions used [0, --rows) itself; the script reads which from
# client/cli_bench.c and labels the case accordingly).
#
# With PRIME=1 (default) every id of the measured batches is pushed once
# first, untimed but reported ("prime s": materialising the rows), so the
# figures are the steady-state cost of a push; the measured run is then
# `--mode both` on the existing table (`embps bench --mode push` on an
# existing table exits 1 without measuring). PRIME=0: a fresh table, push
# only, first-touch costs included.
#
# Memory safety: dense tables are mmap'ed with MADV_HUGEPAGE, so scattered
# pushes make whole 2 MiB pages resident: after a few batches the RSS is the
# whole table (rows x row bytes, 25.6 GB for 100M rows at dim 64). When that
# would pass half of MemAvailable, the case runs with transparent huge pages
# disabled for the server (prctl PR_SET_THP_DISABLE through /usr/bin/python3;
# THP=on keeps the server's own MADV_HUGEPAGE, THP=off disables THP for all),
# and a watchdog kills the server if its RSS passes RSS_CAP_MB (default 60%
# of MemAvailable).
#
# Environment: DIM=64 BATCH=65536 ZIPF=1.05 OPTIMIZER=sgd REPS=3
#   SECONDS=5 (or BENCH_SECONDS) WARMUP=1 SMALL_ROWS=1000000
#   LARGE_ROWS=100000000 DYN_ROWS=$LARGE_ROWS THP=auto|on|off RSS_CAP_MB PRIME=1
#   QUICK=1: SECONDS=0.5 WARMUP=0.2 LARGE_ROWS=20000000 REPS=1.
# Exit 0 when every case ran, 1 otherwise, 2 on a usage error.
set -uo pipefail

[ $# -eq 1 ] || { echo "usage: [VAR=value ...] $0 BUILD_DIR" >&2; exit 2; }
BUILD=$(cd "$1" 2>/dev/null && pwd) || { echo "scale.sh: no directory $1" >&2; exit 2; }
SERVER_BIN=$BUILD/embps-server
CLI_BIN=$BUILD/embps
for b in "$SERVER_BIN" "$CLI_BIN"; do
  [ -x "$b" ] || { echo "scale.sh: $b is missing: build first" >&2; exit 2; }
done
env_seconds=$(tr '\0' '\n' < /proc/$$/environ 2>/dev/null | sed -n 's/^SECONDS=//p')
QUICK=${QUICK:-0}
q() { if [ "$QUICK" = 1 ]; then echo "$1"; else echo "$2"; fi; }
DIM=${DIM:-64}
BATCH=${BATCH:-65536}
ZIPF=${ZIPF:-1.05}
OPTIMIZER=${OPTIMIZER:-sgd}
REPS=${REPS:-$(q 1 3)}
PHASE_S=${BENCH_SECONDS:-${env_seconds:-$(q 0.5 5)}}
WARMUP=${WARMUP:-$(q 0.2 1)}
SMALL_ROWS=${SMALL_ROWS:-1000000}
LARGE_ROWS=${LARGE_ROWS:-$(q 20000000 100000000)}
DYN_ROWS=${DYN_ROWS:-$LARGE_ROWS}
THP=${THP:-auto}
PRIME=${PRIME:-1}
NB=8  # batches per workload, embps bench's default
AVAIL_KB=$(awk '$1 == "MemAvailable:" {print $2}' /proc/meminfo)
RSS_CAP_MB=${RSS_CAP_MB:-$(( AVAIL_KB * 6 / 10 / 1024 ))}
FAILED=0
TMP=$(mktemp -d /tmp/embps-scale.XXXXXX)
SERVER_PID="" WATCH_PID=""
cleanup() {
  [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null
  [ -n "$SERVER_PID" ] && stop_server
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_server() {

  kill -TERM "$SERVER_PID" 2>/dev/null
  for _ in $(seq 300); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
}
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null; }
jget() { sed -n 's/.*"'"$2"'": *\(-\{0,1\}[0-9][0-9.eE+-]*\).*/\1/p' "$1" 2>/dev/null; }
med() {
  jget "$1" "$2" | sort -g | awk '{v[NR] = $1}
    END { if (!NR) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
          else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
mb() { awk -v x="$1" 'BEGIN { if (x == "nan" || x == "") print "n/a"; else printf "%.0f MB", x / 1024 }'; }
rate() { awk -v x="$1" 'BEGIN { if (x == "nan") print "n/a"; else printf "%.2f M", x / 1e6 }'; }
us() { awk -v x="$1" 'BEGIN { if (x == "nan") print "n/a"; else if (x >= 10000) printf "%.1f ms", x / 1000; else printf "%.0f us", x }'; }
row_bytes() {
  local k=0
  case $OPTIMIZER in adagrad) k=1 ;; adam|ftrl) k=2 ;; esac
  echo $(( ( (DIM * (1 + k) + 3) / 4 ) * 16 ))
}

NOTHP=(/usr/bin/python3 -c 'import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(41, 1, 0, 0, 0):  # PR_SET_THP_DISABLE, kept across execve
    sys.exit("prctl(PR_SET_THP_DISABLE): " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[1], sys.argv[1:])')

# Where embps bench puts a dynamic table's ids: spread over int64 (by mixing
# each id with embps_mix64, as client/cli_bench.c does since a450948), or in
# [0, rows). Read from the source beside this script, which should be the
# source of BUILD_DIR.
HERE=$(cd "$(dirname "$0")" && pwd)
INT64_IDS=0
grep -q 'dynamic ? (int64_t)embps_mix64' "$HERE/../../client/cli_bench.c" 2>/dev/null && INT64_IDS=1
# An embps bench that prefills every row of a dense table first would make a
# 100M-row table resident in whole (25.6 GB at dim 64): turn that off.
NO_PREFILL=()
grep -qa -- '--no-prefill' "$CLI_BIN" && NO_PREFILL=(--no-prefill)

# run_case NAME ROWS DYNAMIC: REPS runs, each on a fresh server.
run_case() {
  local name=$1 rows=$2 dyn=$3 thp=madv rep
  local worst_kb=$(( rows / 1024 * $(row_bytes) ))
  # madv: the server's own MADV_HUGEPAGE; off: THP disabled for the server;
  # -: a dynamic table (its rows are malloc'ed, never madvise'd).
  [ "$dyn" = 1 ] && thp=-
  if [ "$THP" = off ] || { [ "$dyn" = 0 ] && [ "$THP" = auto ] && [ "$worst_kb" -gt $(( AVAIL_KB / 2 )) ]; }; then
    thp=off
  fi
  if [ "$thp" = off ] && ! [ -x /usr/bin/python3 ]; then
    echo "  $name: skipped: THP must be off (the table could take $((worst_kb / 1024)) MB) and /usr/bin/python3 is missing"
    FAILED=1; return
  fi
  echo "$thp" > "$TMP/$name.thp"
  for rep in $(seq "$REPS"); do
    echo "  $name, rep $rep/$REPS (THP $thp)"
    local pre=() base=(--rows "$rows" --dim "$DIM" --zipf "$ZIPF" --optimizer "$OPTIMIZER"
      --table scale --keep "${NO_PREFILL[@]}")
    [ "$thp" = off ] && pre=("${NOTHP[@]}")
    [ "$dyn" = 1 ] && base+=(--dynamic)
    local args=("${base[@]}" --batch "$BATCH" --batches "$NB" --seconds "$PHASE_S" --warmup "$WARMUP" --json)
    # The prime's one batch of NB x BATCH ids is exactly the NB measured batches
    # (embps bench draws them one after the other from one random stream).
    local primer=("${base[@]}" --mode push --batch $(( NB * BATCH )) --batches 1 --depth 1
      --seconds 0.1 --warmup 0)
    if [ "$PRIME" = 1 ]; then args+=(--mode both); else args+=(--mode push); fi
    rm -f "$TMP/port"
    "${pre[@]}" "$SERVER_BIN" --listen 127.0.0.1:0 --port-file "$TMP/port" --log-level warn \
      --max-frame-bytes 1073741824 > "$TMP/server.log" 2>&1 &
    SERVER_PID=$!
    local port=""
    for _ in $(seq 200); do [ -s "$TMP/port" ] && port=$(cat "$TMP/port") && break; sleep 0.1; done
    if [ -z "$port" ]; then
      echo "    FAILED: the server did not start"; sed 's/^/    /' "$TMP/server.log" | head -5
      stop_server; FAILED=1; continue
    fi
    status_kb "$SERVER_PID" VmRSS >> "$TMP/$name.before"
    ( while kill -0 "$SERVER_PID" 2>/dev/null; do
        r=$(status_kb "$SERVER_PID" VmRSS)
        if [ -n "$r" ] && [ "$r" -gt $(( RSS_CAP_MB * 1024 )) ]; then
          echo "$r" > "$TMP/killed"; kill -KILL "$SERVER_PID"; exit 0
        fi
        sleep 0.1
      done ) &
    WATCH_PID=$!
    rm -f "$TMP/killed"
    local out rc=0 t0=$EPOCHREALTIME
    if [ "$PRIME" = 1 ]; then
      "$CLI_BIN" --servers "127.0.0.1:$port" bench "${primer[@]}" > /dev/null 2> "$TMP/stderr" || rc=$?
      awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f\n", b - a }' >> "$TMP/$name.prime"
    fi
    [ "$rc" = 0 ] &&
      { out=$("$CLI_BIN" --servers "127.0.0.1:$port" bench "${args[@]}" 2> "$TMP/stderr") || rc=$?; }
    if [ -s "$TMP/killed" ]; then
      echo "    KILLED: the server's RSS reached $(( $(cat "$TMP/killed") / 1024 )) MB (cap $RSS_CAP_MB MB)"
      FAILED=1
    elif [ "$rc" = 0 ] && grep -q '^{' <<< "$out"; then
      grep '^{' <<< "$out" | tail -1 >> "$TMP/$name.jsonl"
      status_kb "$SERVER_PID" VmRSS >> "$TMP/$name.after"
      status_kb "$SERVER_PID" VmHWM >> "$TMP/$name.peak"
    else
      echo "    FAILED (exit $rc):"; sed 's/^/    /' "$TMP/stderr" | head -5
      FAILED=1
    fi
    kill "$WATCH_PID" 2>/dev/null; wait "$WATCH_PID" 2>/dev/null; WATCH_PID=""
    stop_server
  done
}

medf() { [ -f "$1" ] && sort -g "$1" | awk '{v[NR] = $1} END { if (!NR) print "nan"; else print v[int((NR + 1) / 2)] }' || echo nan; }

echo "embps push cost vs table size, $(date -u +%FT%TZ), $(nproc) cores"
echo "push of $BATCH-id Zipf($ZIPF) batches, dim $DIM, $OPTIMIZER, $REPS rep(s) x ($WARMUP s warm-up + $PHASE_S s), fresh server per rep"
echo "MemAvailable $((AVAIL_KB / 1024)) MB; RSS cap $RSS_CAP_MB MB; dense row $(row_bytes) B"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
run_case small "$SMALL_ROWS" 0
run_case large "$LARGE_ROWS" 0
run_case dynamic "$DYN_ROWS" 1

echo
printf '%-30s %-22s %4s %6s %7s | %11s %9s %9s %11s | %8s %8s %8s\n' case ids THP unique "prime" \
  "push rows/s" p50 p99 "pull rows/s" "RSS pre" "RSS post" "RSS peak"
line() {
  local name=$1 label=$2 ids=$3 f=$TMP/$1.jsonl
  local pull=n/a prime=-
  [ "$PRIME" = 1 ] && pull=$(rate "$(med "$f" pull_rows_per_s)")
  [ "$PRIME" = 1 ] && prime="$(medf "$TMP/$name.prime") s"
  printf '%-30s %-22s %4s %6s %7s | %11s %9s %9s %11s | %8s %8s %8s\n' "$label" "$ids" "$(cat "$TMP/$name.thp" 2>/dev/null || echo -)" \
    "$(awk -v r="$(med "$f" unique_ratio)" -v b="$BATCH" 'BEGIN { if (r == "nan") print "n/a"; else printf "%.0f", r * b }')" \
    "$prime" "$(rate "$(med "$f" push_rows_per_s)")" \
    "$(us "$(med "$f" push_p50_us)")" "$(us "$(med "$f" push_p99_us)")" "$pull" \
    "$(mb "$(medf "$TMP/$name.before")")" "$(mb "$(medf "$TMP/$name.after")")" "$(mb "$(medf "$TMP/$name.peak")")"
}
line small "dense, $SMALL_ROWS rows" "[0, $SMALL_ROWS)"
line large "dense, $LARGE_ROWS rows" "[0, $LARGE_ROWS)"
if [ "$INT64_IDS" = 1 ]; then
  line dynamic "dynamic, ids across int64" "mix64 of [0, $DYN_ROWS)"
else
  line dynamic "dynamic (ids NOT across int64)" "[0, $DYN_ROWS)"
  echo "note: this embps bench draws a dynamic table's ids from [0, $DYN_ROWS), not across int64;"
  echo "      see tests/bench/README.md."
fi
echo "RSS pre: the fresh server; post: after the pushes, table kept; peak: VmHWM. Medians over the reps."
echo "push rows/s counts unique rows; embps bench sends all $BATCH ids of a batch (the server merges them)."
if [ "$PRIME" = 1 ]; then
  echo "prime: untimed push of every id of the measured batches first (materialises the rows); the"
  echo "figures are for the warm table. PRIME=0 measures a fresh table."
fi
[ "$(cat "$TMP/large.thp" 2>/dev/null)" = off ] &&
  echo "THP off: with huge pages the $LARGE_ROWS-row table would become resident in whole ($(( LARGE_ROWS / 1024 * $(row_bytes) / 1024 )) MB)."
exit "$FAILED"
