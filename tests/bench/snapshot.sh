#!/usr/bin/env bash
# snapshot.sh BUILD_DIR - a follower's initial copy (issue 21: "initial
# snapshot of a 10M x 64 Adagrad table to a follower >= 0.5 x the raw
# loopback throughput measured in the same run"), for a ROWS x DIM Adagrad
# table with every row made, dense and then dynamic, on a server without a
# data dir (the table in memory, --shards SHARDS). REPS interleaved rounds
# of:
#   raw    snapbench raw: the stream's bytes written from memory into a
#          loopback TCP connection and read into an 8 MiB buffer (the limit)
#   drain  snapbench drain: the snapshot stream read whole and thrown away
#          (the server's shard copies, CRCs and framing, and the wire)
#   load   snapbench load: the stream loaded into tables of SHARDS shards
#          in the client's process as it arrives (embps_ckpt_load_stream:
#          CRCs checked, rows placed; nothing written to disk) - the
#          follower's path, the figure the target is about; with the
#          OpenMP team a server's apply thread has by default (half the
#          cores, passive waits: server/main.c)
# and then once, per table:
#   follower  a real follower (embps-server --follow, no data dir) started
#          against the server: from its start to its log saying the copy
#          replaced its state (snapshot session, load, catch-up, install:
#          server/copy.h), the stream's bytes over that time
# A first, untimed load runs before the rounds. A load's tables are fresh
# memory, and in this VM the kernel's first touch of fresh memory (zeroed
# pages the host backs anew) costs from 0.4 to 4 s per GB: the loads' user
# and kernel CPU seconds are printed to tell the two apart.
# Prints the medians and load / raw. Environment: ROWS (10000000), DIM (64),
# REPS (3), SHARDS (16), CHUNK (bytes per READ; 0: the default 8 MiB),
# DEPTH (READs in flight; 0: 4), QUICK=1 (ROWS=200000, REPS=1: a smoke
# run). Needs about 3 x ROWS x (8 + 8 x DIM) bytes of free memory (the
# server's table, the loaded copy, the dynamic table's index). Figures only
# mean something on a quiet machine.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
SRV=$BUILD/embps-server
CLI=$BUILD/embps
BENCH=$BUILD/tests/bench/snapbench
[ -x "$BENCH" ] || BENCH=$(find "$BUILD" -name snapbench -type f | head -1)
if [ "${QUICK:-0}" = 1 ]; then
  ROWS=${ROWS:-200000}
  REPS=${REPS:-1}
else
  ROWS=${ROWS:-10000000}
  REPS=${REPS:-3}
fi
DIM=${DIM:-64}
SHARDS=${SHARDS:-16}
CHUNK=${CHUNK:-0}
DEPTH=${DEPTH:-0}
NEED=$((3 * ROWS * (8 + 8 * DIM)))
AVAIL=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
if [ "$AVAIL" -lt "$NEED" ]; then
  echo "snapshot.sh: needs about $((NEED >> 20)) MiB of free memory," \
    "$((AVAIL >> 20)) MiB available: set ROWS lower" >&2
  exit 1
fi
TMP=$(mktemp -d)
PID=
FPID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  [ -n "$FPID" ] && kill "$FPID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

"$SRV" --listen 127.0.0.1:0 --port-file "$TMP/port" --shards "$SHARDS" \
  2>>"$TMP/server.log" &
PID=$!
for _ in $(seq 1 3000); do
  [ -s "$TMP/port" ] && break
  kill -0 "$PID" 2>/dev/null || { cat "$TMP/server.log"; exit 1; }
  sleep 0.01
done
ADDR=127.0.0.1:$(cat "$TMP/port")

median() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
field() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }
TEAM=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
load() { OMP_WAIT_POLICY=passive OMP_NUM_THREADS=$TEAM "$BENCH" load "$ADDR" "$SHARDS" "$CHUNK" "$DEPTH"; }
# A follower's initial copy: prints its seconds and GB/s (bytes $1).
follower() {
  rm -f "$TMP/fport" "$TMP/follower.log"
  local t0 t1
  t0=$(date +%s.%N)
  "$SRV" --listen 127.0.0.1:0 --port-file "$TMP/fport" --shards "$SHARDS" \
    --follow "$ADDR" 2>"$TMP/follower.log" &
  FPID=$!
  until grep -q "replaces this server's state" "$TMP/follower.log" 2>/dev/null; do
    kill -0 "$FPID" 2>/dev/null || { cat "$TMP/follower.log" >&2; exit 1; }
    sleep 0.02
  done
  t1=$(date +%s.%N)
  kill "$FPID"
  wait "$FPID" || true
  FPID=
  awk -v a="$t0" -v b="$t1" -v n="$1" \
    'BEGIN {printf "seconds %.2f gbps %.3f\n", b - a, n / (b - a) / 1e9}'
}

echo "# embps snapshot benchmark: $(date -u +%FT%TZ), $(nproc) cores," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg); $ROWS x $DIM Adagrad," \
  "--shards $SHARDS, $REPS rounds, medians"
for kind in dense dynamic; do
  T0=$(date +%s.%N)
  "$BENCH" fill "$ADDR" t "$ROWS" "$DIM" "$kind"
  echo "($kind table filled in $(awk -v a="$T0" -v b="$(date +%s.%N)" \
    'BEGIN {printf "%.1f", b - a}') s)"
  RAW= DRAIN= LOAD= LSYS= LUSER= BYTES=0 LROWS=0
  load >/dev/null # warm-up, untimed
  for _ in $(seq 1 "$REPS"); do
    D=$("$BENCH" drain "$ADDR" "$CHUNK" "$DEPTH")
    BYTES=$(echo "$D" | field bytes)
    DRAIN+=" $(echo "$D" | field gbps)"
    RAW+=" $("$BENCH" raw "$BYTES" | field gbps)"
    L=$(load)
    LOAD+=" $(echo "$L" | field gbps)"
    LROWS=$(echo "$L" | field rows)
    LSYS+=" $(echo "$L" | field sys)"
    LUSER+=" $(echo "$L" | field user)"
  done
  [ "$LROWS" = "$ROWS" ] || { echo "loaded $LROWS rows of $ROWS" >&2; exit 1; }
  R=$(median "$RAW") D=$(median "$DRAIN") L=$(median "$LOAD")
  printf '%-8s %10s rows, %12s stream bytes: raw %.2f GB/s, drain %.2f GB/s (%.2f x raw), load %.2f GB/s (%.2f x raw)   [raw:%s; drain:%s; load:%s]\n' \
    "$kind" "$ROWS" "$BYTES" "$R" "$D" "$(awk -v a="$D" -v b="$R" 'BEGIN {print a / b}')" \
    "$L" "$(awk -v a="$L" -v b="$R" 'BEGIN {print a / b}')" "$RAW" "$DRAIN" "$LOAD"
  echo "         the loads' CPU seconds, user:$LUSER; kernel (the first touch of the tables' fresh memory, mostly):$LSYS"
  F=$(follower "$BYTES")
  printf '         a follower copying it: %.1f s, %.2f GB/s (%.2f x raw)\n' \
    "$(echo "$F" | field seconds)" "$(echo "$F" | field gbps)" \
    "$(awk -v a="$(echo "$F" | field gbps)" -v b="$R" 'BEGIN {print a / b}')"
  "$CLI" --servers "$ADDR" drop-table t >/dev/null
done
grep -o 'longest shard copy [0-9.]* ms' "$TMP/server.log" |
  awk '$4 > m {m = $4} END {print "longest shard copy (the server'"'"'s log): " m + 0 " ms"}'
kill "$PID"
wait "$PID" || true
PID=
