#!/usr/bin/env bash
# snapshot_ab.sh OLD NEW [KIND [REPS]] - the snapshot stream of two builds
# side by side (before/after a change): OLD and NEW are directories holding
# each build's embps-server and snapbench (tests/bench/snapbench). One
# server per build, each with a ROWS x 64 Adagrad table of KIND (dense or
# dynamic, every row made), then REPS rounds of: drain of each, raw
# loopback of the same bytes, and load of each (the two loads in turns
# first, as the first to run after a freed load pays more for fresh
# memory in this VM). One line per round: GB/s, and each load's user and
# kernel CPU seconds. Environment: ROWS (10000000). Needs about 3 x ROWS x
# 520 bytes of free memory.
set -euo pipefail
OLD=$(cd "$1" && pwd) NEW=$(cd "$2" && pwd) KIND=${3:-dense} REPS=${4:-3}
ROWS=${ROWS:-10000000}
T=$(mktemp -d)
P1= P2=
cleanup() {
  [ -n "$P1" ] && kill "$P1" 2>/dev/null
  [ -n "$P2" ] && kill "$P2" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
"$OLD/embps-server" --listen 127.0.0.1:0 --port-file "$T/p1" --shards 16 2>"$T/l1" &
P1=$!
"$NEW/embps-server" --listen 127.0.0.1:0 --port-file "$T/p2" --shards 16 2>"$T/l2" &
P2=$!
for _ in $(seq 1 3000); do
  [ -s "$T/p1" ] && [ -s "$T/p2" ] && break
  sleep 0.01
done
A1=127.0.0.1:$(cat "$T/p1") A2=127.0.0.1:$(cat "$T/p2")
"$NEW/snapbench" fill "$A1" t "$ROWS" 64 "$KIND"
"$NEW/snapbench" fill "$A2" t "$ROWS" 64 "$KIND"
f() { awk -v k="$1" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }
load() { OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1 "$@"; }
load "$OLD/snapbench" load "$A1" 16 >/dev/null # warm-up, untimed
for r in $(seq 1 "$REPS"); do
  D1=$("$OLD/snapbench" drain "$A1")
  D2=$("$NEW/snapbench" drain "$A2")
  R=$("$NEW/snapbench" raw "$(echo "$D1" | f bytes)" | f gbps)
  if [ $((r % 2)) = 1 ]; then
    X1=$(load "$OLD/snapbench" load "$A1" 16)
    X2=$(load "$NEW/snapbench" load "$A2" 16)
  else
    X2=$(load "$NEW/snapbench" load "$A2" 16)
    X1=$(load "$OLD/snapbench" load "$A1" 16)
  fi
  echo "$KIND round $r: raw $R; drain old $(echo "$D1" | f gbps) new" \
    "$(echo "$D2" | f gbps); load old $(echo "$X1" | f gbps) (user" \
    "$(echo "$X1" | f user), kernel $(echo "$X1" | f sys)) new" \
    "$(echo "$X2" | f gbps) (user $(echo "$X2" | f user), kernel" \
    "$(echo "$X2" | f sys)); load average $(cut -d' ' -f1 /proc/loadavg)"
done
