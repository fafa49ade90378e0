#!/usr/bin/env bash
# durability.sh BUILD_DIR - what --data-dir costs (issue 8's performance
# targets), all in one run on the same disk:
#   1. push throughput of `embps bench` (8 worker connections, push only)
#      with --fsync never, everysec and always, and the ratios to never
#      (targets: always >= 0.5, everysec >= 0.9);
#   2. the disk's sequential write speed, through the page cache (dd
#      conv=fdatasync) and around it (dd oflag=direct, 16 MiB blocks: the
#      way checkpoints write), the faster of the two being "the disk", and
#      its read speed (dd iflag=direct), in the data dir's file system;
#   3. a checkpoint of a ROWS x 64 Adagrad table with every row materialised
#      (default 10M: ~5.1 GB of records), seconds and GB/s, and its restore
#      (start to ready: checkpoint load, no log tail), against dd (target
#      >= 0.5 x the disk);
#   4. the longest push stall while checkpoints run: `embps bench` pushes
#      (8 workers) while `embps checkpoint` is taken every second; push_max_us
#      next to the push p50 and p99.9, the longest a shard was held for its
#      copy (the server logs it per checkpoint) and the checkpoint time per
#      shard.
# Environment: ROWS (10000000), PUSH_ROWS (1000000, the table of step 1),
# DIM (64), BENCH_SECONDS (10 per bench phase), REPEAT (3 rounds of step 1),
# SHARDS (16), DATA (a directory on
# the disk to measure; default a mktemp -d under /var/tmp), SMALL=1 for a
# smoke run (ROWS=20000, PUSH_ROWS=20000, BENCH_SECONDS=1). Needs /usr/bin/python3
# with numpy for the bulk load. Figures only mean something on a quiet
# machine.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
SRV=$BUILD/embps-server
CLI=$BUILD/embps
LIB=$(ls "$BUILD"/libembps.so* 2>/dev/null | head -1)
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
if [ "${SMALL:-0}" = 1 ]; then
  ROWS=${ROWS:-20000}; PUSH_ROWS=${PUSH_ROWS:-20000}; SECONDS_=${BENCH_SECONDS:-1}
  REPEAT=${REPEAT:-1}
else
  ROWS=${ROWS:-10000000}; PUSH_ROWS=${PUSH_ROWS:-1000000}
  SECONDS_=${BENCH_SECONDS:-10}
  REPEAT=${REPEAT:-3}
fi
DIM=${DIM:-64}
SHARDS=${SHARDS:-16}
DATA=${DATA:-$(mktemp -d /var/tmp/embps-durbench-XXXXXX)}
TMP=$(mktemp -d)
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
  rm -rf "$TMP" "$DATA"/d "$DATA"/dd.bin
}
trap cleanup EXIT

start() { # start MODE [extra server flags...]: a server on $DATA/d
  local mode=$1; shift
  rm -f "$TMP/port"
  "$SRV" --listen 127.0.0.1:0 --port-file "$TMP/port" --data-dir "$DATA/d" \
    --fsync "$mode" --shards "$SHARDS" "$@" 2>>"$TMP/server.log" &
  PID=$!
  for _ in $(seq 1 3000); do
    [ -s "$TMP/port" ] && break
    kill -0 "$PID" 2>/dev/null || { cat "$TMP/server.log"; exit 1; }
    sleep 0.01
  done
  ADDR=127.0.0.1:$(cat "$TMP/port")
}
stop() { kill "$PID"; wait "$PID" || true; PID=; }
json() { $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

echo "# embps durability benchmark: $(date -u +%FT%TZ), $(nproc) cores," \
  "data dir on $(df -P "$DATA" | awk 'NR==2 {print $1}')"

# 1. push throughput per --fsync mode: REPEAT rounds of the three modes in
#    turn (a noisy neighbour then hits every mode alike), medians
declare -A RATES
for round in $(seq 1 "$REPEAT"); do
  for mode in never everysec always; do
    rm -rf "$DATA/d"
    start "$mode"
    RATES[$mode]+=" $("$CLI" --servers "$ADDR" bench --workers 8 --mode push \
      --rows "$PUSH_ROWS" --dim "$DIM" --seconds "$SECONDS_" --json |
      json push_rows_per_s)"
    stop
  done
done
median() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
printf '%-9s %16s %8s   %s\n' fsync "push rows/s" "x never" "(median of: ...)"
for mode in never everysec always; do
  printf '%-9s %16.0f %8.2f   (%s)\n' "$mode" "$(median "${RATES[$mode]}")" \
    "$($PY -c "print($(median "${RATES[$mode]}") / max($(median "${RATES[never]}"), 1))")" \
    "$(echo ${RATES[$mode]} | xargs printf '%.0f ')"
done

# 2. the disk
BYTES=$((ROWS * (8 + DIM * 4 * 2)))
MB=$(( (BYTES >> 20) + 1 ))
W=$(dd if=/dev/zero of="$DATA/dd.bin" bs=1M count=$MB conv=fdatasync 2>&1 |
    tail -1)
rm -f "$DATA/dd.bin"
WD=$(dd if=/dev/zero of="$DATA/dd.bin" bs=16M count=$(( (MB + 15) / 16 )) \
     oflag=direct conv=fdatasync 2>&1 | tail -1)
R=$(dd if="$DATA/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1)
rm -f "$DATA/dd.bin"
ddrate() { # "N bytes ... copied, S s, ..." -> GB/s
  echo "$1" | awk '{for (i = 1; i <= NF; i++) if ($i == "copied,") s = $(i+1);
                    printf "%.3f", $1 / s / 1e9}'
}
DISK_W=$($PY -c "print(max($(ddrate "$W"), $(ddrate "$WD")))")
DISK_R=$(ddrate "$R")
echo "dd write: page cache (conv=fdatasync) $(ddrate "$W") GB/s, direct" \
  "(oflag=direct) $(ddrate "$WD") GB/s; read (iflag=direct) $DISK_R GB/s;" \
  "$MB MiB"

# 3. checkpoint and restore of a ROWS x DIM Adagrad table, every row set
rm -rf "$DATA/d"
start everysec
"$CLI" --servers "$ADDR" create-table big --dim "$DIM" --rows "$ROWS" \
  --optimizer adagrad --init uniform:0.01 >/dev/null
EMBPS_LIBRARY=$LIB PYTHONPATH=$HERE/../../client/python $PY - "$ADDR" \
  "$ROWS" "$DIM" <<'PYEOF'
import sys, numpy as np, embps
addr, rows, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = embps.Client(servers=addr)
step = max(1, (48 << 20) // (dim * 4 + 8))
g = np.full((step, dim), 0.01, np.float32)
for lo in range(0, rows, step):
    ids = np.arange(lo, min(rows, lo + step), dtype=np.int64)
    c.push("big", ids, g[:len(ids)])
PYEOF
T0=$(date +%s.%N)
OUT=$("$CLI" --servers "$ADDR" --timeout-ms 3600000 checkpoint)
T1=$(date +%s.%N)
CB=$(echo "$OUT" | awk '{print $7}')
CMS=$(echo "$OUT" | awk '{print $10}')
CK=$($PY -c "print($CB / max($CMS, 1) / 1e6)")
echo "checkpoint: $CB bytes in $CMS ms (CLI wall $($PY -c "print(round($T1 - $T0, 2))") s):" \
  "$($PY -c "print(round($CK, 2))") GB/s = $($PY -c "print(round($CK / $DISK_W, 2))") x the disk's write"

# 4. push stalls while checkpoints run (one a second)
"$CLI" --servers "$ADDR" bench --workers 8 --mode both --rows "$ROWS" \
  --dim "$DIM" --optimizer adagrad --seconds "$SECONDS_" --no-prefill --json \
  >"$TMP/stall.json" &
BENCH=$!
N=0
while kill -0 "$BENCH" 2>/dev/null; do
  "$CLI" --servers "$ADDR" --timeout-ms 3600000 checkpoint >/dev/null
  N=$((N + 1))
  sleep 1
done
wait "$BENCH"
COPY=$(grep -o 'longest shard copy [0-9.]* ms' "$TMP/server.log" | tail -n "$N" |
       awk '$4 > m {m = $4} END {print m + 0}')
echo "during $N checkpoints: push p50 $(json push_p50_us <"$TMP/stall.json") us," \
  "p99.9 $(json push_p999_us <"$TMP/stall.json") us, longest push" \
  "$(json push_max_us <"$TMP/stall.json") us; longest shard copy (the server's" \
  "log) $COPY ms; copy+write time per shard ~$($PY -c "print(round($CMS / $SHARDS, 1))") ms"

# restore: a last checkpoint, kill -9 (no log tail), time to ready
"$CLI" --servers "$ADDR" --timeout-ms 3600000 checkpoint >/dev/null
CB=$(du -sb "$DATA"/d/ckpt-* | awk '{s += $1} END {print s}')
kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=
T0=$(date +%s.%N)
start everysec
T1=$(date +%s.%N)
RS=$($PY -c "print($T1 - $T0)")
echo "restore (start to ready; checkpoints bypass the page cache): $CB bytes in" \
  "$($PY -c "print(round($RS, 2))") s: $($PY -c "print(round($CB / $RS / 1e9, 2))") GB/s" \
  "= $($PY -c "print(round($CB / $RS / 1e9 / $DISK_R, 2))") x the disk's read"
stop
