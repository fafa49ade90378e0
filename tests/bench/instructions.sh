#!/usr/bin/env bash
# instructions.sh BUILD_A BUILD_B - the server's instructions per pushed and
# per pulled row for two builds, counted by callgrind: a figure the noise of
# a shared machine does not move, to read beside before_after.sh's times.
#
# Each build's embps-server runs under valgrind --tool=callgrind (one I/O
# thread, one OpenMP thread); a table of ROWS rows is primed with one push,
# then the build's own `embps bench` pushes (or pulls) for SECONDS; the
# instructions of the whole run, divided by the rows the server counted
# (`embps stats`), are the figure (the start-up and the priming are the
# same for both builds and small beside the phase). The five functions with the most instructions of
# each run are listed so that a difference can be traced.
#
# Environment (defaults): ROWS=100000 DIM=64 BATCH=8192 OPTIMIZER=adagrad
# SECONDS=3. Needs valgrind. Exit status: 0, 1 when a run failed, 2 on
# usage errors.
set -uo pipefail

usage() { echo "usage: [VAR=value ...] $0 BUILD_A BUILD_B" >&2; exit 2; }
[ $# -eq 2 ] || usage
command -v valgrind > /dev/null || { echo "instructions: needs valgrind" >&2; exit 2; }
env_seconds=$(tr '\0' '\n' < /proc/$$/environ 2>/dev/null | sed -n 's/^SECONDS=//p')
ROWS=${ROWS:-100000}
DIM=${DIM:-64}
BATCH=${BATCH:-8192}
OPTIMIZER=${OPTIMIZER:-adagrad}
PHASE_S=${env_seconds:-3}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# run BUILD MODE NAME: prints "IR ROWS"; the profile is left in $TMP/NAME.cg.
run() {
  local b=$1 mode=$2 name=$3 vp port rows
  rm -f "$TMP/port"
  # OMP_WAIT_POLICY set: no re-exec of the server under valgrind
  OMP_WAIT_POLICY=passive valgrind --tool=callgrind --callgrind-out-file="$TMP/$name.cg" \
    "$b/embps-server" --listen 127.0.0.1:0 --port-file "$TMP/port" --io-threads 1 \
    --omp-threads 1 --log-level warn > "$TMP/$name.log" 2>&1 &
  vp=$!
  for _ in $(seq 600); do
    [ -s "$TMP/port" ] && break
    kill -0 "$vp" 2> /dev/null || break
    sleep 0.05
  done
  port=$(cat "$TMP/port" 2> /dev/null) || { echo "instructions: $b did not start" >&2; return 1; }
  local common=(--servers "127.0.0.1:$port" bench --table t --keep --rows "$ROWS"
                --dim "$DIM" --optimizer "$OPTIMIZER" --warmup 0)
  "$b/embps" "${common[@]}" --mode push --batch 65536 --batches 1 --depth 1 \
    --seconds 0.1 > /dev/null || return 1
  "$b/embps" "${common[@]}" --mode "$mode" --no-prefill --batch "$BATCH" \
    --batches 8 --depth 1 --seconds "$PHASE_S" > /dev/null || return 1
  # the rows the server itself counted (the priming push's included)
  rows=$("$b/embps" --servers "127.0.0.1:$port" stats |
    sed -n "s/.*pulls [0-9]* (\([0-9]*\) rows)  pushes [0-9]* (\([0-9]*\) unique rows).*/\1 \2/p" |
    head -1)
  kill "$vp"
  wait "$vp" 2> /dev/null
  [ "$mode" = pull ] && rows=${rows% *} || rows=${rows#* }
  echo "$(sed -n 's/^summary: *//p' "$TMP/$name.cg") $rows"
}

top() {
  callgrind_annotate "$TMP/$1.cg" 2> /dev/null | grep -E '^ *[0-9,]+ \(' | sed -n 2,6p |
    sed -E 's/ \[[^]]*\]$//; s|/[^ ]*/([a-z_]+/[a-z_0-9.]+:)|\1|; s/^/    /'
}

FAILED=0
echo "embps instructions per row, $(date -u +%FT%TZ); $ROWS x $DIM $OPTIMIZER, batch $BATCH, ${PHASE_S} s under callgrind"
echo "A: $1"
echo "B: $2"
for mode in push pull; do
  a=$(run "$1" "$mode" "A$mode") || { echo "  A $mode failed"; FAILED=1; continue; }
  b=$(run "$2" "$mode" "B$mode") || { echo "  B $mode failed"; FAILED=1; continue; }
  read -r ia ra <<< "$a"
  read -r ib rb <<< "$b"
  awk -v m="$mode" -v ia="$ia" -v ra="$ra" -v ib="$ib" -v rb="$rb" 'BEGIN {
    a = ia / ra; b = ib / rb
    printf "%s: A %.0f, B %.0f instructions per row; B/A %.3f\n", m, a, b, b / a }'
  echo "  A's most:"; top "A$mode"
  echo "  B's most:"; top "B$mode"
done
exit "$FAILED"
