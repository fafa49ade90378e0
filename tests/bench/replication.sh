#!/usr/bin/env bash
# replication.sh BUILD_DIR - what a follower costs its primary (issue 21's
# performance targets), all in one run on this machine:
#   push throughput of `embps bench` (8 worker connections, push only,
#   dim DIM) against a primary
#     none   alone (no follower, no feed),
#     async  with a follower on the same machine, --sync-followers 0,
#     sync   with that follower and --sync-followers 1,
#   REPEAT rounds of the three in turn (a noisy neighbour then hits every
#   one alike), the medians and their ratios to none (targets: async >=
#   0.9, sync >= 0.6); and the follower's lag under that load, sampled from
#   the primary's stats (lag_ms: the age of the oldest record the follower
#   has not applied) every SAMPLE_MS, its median and p99 over the rounds
#   (target p99 <= 100 ms).
# Environment: PUSH_ROWS (1000000, the table), DIM (64), BENCH_SECONDS
# (10), REPEAT (3), SHARDS (16), SAMPLE_MS (20), DATA=1 to give both
# servers a data dir (--fsync everysec) under /var/tmp, SMALL=1 for a
# smoke run (PUSH_ROWS=20000, BENCH_SECONDS=1, REPEAT=1). Figures only
# mean something on a quiet machine.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
SRV=$BUILD/embps-server
CLI=$BUILD/embps
PY=/usr/bin/python3
if [ "${SMALL:-0}" = 1 ]; then
  PUSH_ROWS=${PUSH_ROWS:-20000}; SECONDS_=${BENCH_SECONDS:-1}
  REPEAT=${REPEAT:-1}
else
  PUSH_ROWS=${PUSH_ROWS:-1000000}; SECONDS_=${BENCH_SECONDS:-10}
  REPEAT=${REPEAT:-3}
fi
DIM=${DIM:-64}
SHARDS=${SHARDS:-16}
SAMPLE_MS=${SAMPLE_MS:-20}
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# start NAME [flags...]: a server; its address in $ADDR, pid in PIDS
start() {
  local name=$1; shift
  local dir=()
  if [ "${DATA:-0}" = 1 ]; then
    mkdir -p "$TMP/$name.d"
    dir=(--data-dir "$TMP/$name.d" --fsync everysec)
  fi
  rm -f "$TMP/$name.port"
  "$SRV" --listen 127.0.0.1:0 --port-file "$TMP/$name.port" \
    --shards "$SHARDS" "${dir[@]}" "$@" 2>>"$TMP/$name.log" &
  PIDS+=($!)
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
  rm -rf "$TMP"/*.d
}
json() { $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
jstat() { $PY -c "import json,sys; print(json.load(sys.stdin)[0]['$1'])"; }

# sample PRIMARY FILE: the primary's largest follower lag (ms), one a
# line, every SAMPLE_MS while the bench runs (until $TMP/stop exists)
sample() {
  while [ ! -e "$TMP/stop" ]; do
    "$CLI" --servers "$1" stats --json 2>/dev/null |
      $PY -c "import json,sys; s=json.load(sys.stdin)[0]; print(s['lag_ms'] if s['followers'] else '')" \
      >>"$2" || true
    sleep "$($PY -c "print($SAMPLE_MS / 1000)")"
  done
}

echo "# embps replication benchmark: $(date -u +%FT%TZ), $(nproc) cores," \
  "8 push workers, dim $DIM, $PUSH_ROWS rows, ${SECONDS_} s per run," \
  "data dirs: ${DATA:-0}"
declare -A RATES
: >"$TMP/lag.async"
: >"$TMP/lag.sync"
for round in $(seq 1 "$REPEAT"); do
  for mode in none async sync; do
    sync=0
    [ "$mode" = sync ] && sync=1
    start primary --sync-followers "$sync" --sync-timeout-ms 10000
    P=$ADDR
    if [ "$mode" != none ]; then
      start follower --follow "$P"
      for _ in $(seq 1 500); do # fetching before the bench's first record
        n=$("$CLI" --servers "$P" stats --json | jstat followers_in_sync)
        [ "$n" -ge 1 ] && break
        sleep 0.02
      done
      rm -f "$TMP/stop"
      sample "$P" "$TMP/lag.$mode" &
      SAMPLER=$!
    fi
    RATES[$mode]+=" $("$CLI" --servers "$P" bench --workers 8 --mode push \
      --rows "$PUSH_ROWS" --dim "$DIM" --seconds "$SECONDS_" --json |
      json push_rows_per_s)"
    if [ "$mode" != none ]; then
      touch "$TMP/stop"
      wait "$SAMPLER"
    fi
    stop_all
  done
done
median() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
printf '%-6s %16s %8s   %s\n' mode "push rows/s" "x none" "(median of: ...)"
for mode in none async sync; do
  printf '%-6s %16.0f %8.2f   (%s)\n' "$mode" "$(median "${RATES[$mode]}")" \
    "$($PY -c "print($(median "${RATES[$mode]}") / max($(median "${RATES[none]}"), 1))")" \
    "$(echo ${RATES[$mode]} | xargs printf '%.0f ')"
done
for mode in async sync; do
  $PY - "$TMP/lag.$mode" "$mode" <<'PYEOF'
import sys
v = sorted(float(x) for x in open(sys.argv[1]) if x.strip())
if not v:
    print("%s: no lag sample" % sys.argv[2])
else:
    p = lambda q: v[min(len(v) - 1, int(q * len(v)))]
    print("follower lag (%s): median %.0f ms, p99 %.0f ms, max %.0f ms over "
          "%d samples" % (sys.argv[2], p(0.5), p(0.99), v[-1], len(v)))
PYEOF
done
