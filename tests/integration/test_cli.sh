#!/usr/bin/env bash
# test_cli.sh SERVER_BIN CLI_BIN - the embps command-line client against a
# real embps-server on 127.0.0.1 port 0: table administration, pushes and
# pulls in text, JSON and binary formats (exact values), stats, and every
# error exiting non-zero with one line on stderr naming the problem.
# Prints "N passed, N failed" last; exits non-zero if anything failed.
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 SERVER_BIN CLI_BIN" >&2
  exit 2
fi
SERVER=$1
CLI=$2
TMP=$(mktemp -d /tmp/embps-cli-test.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
unset EMBPS_SERVERS EMBPS_TOKEN_FILE

PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok - $1"; }
bad() {
  FAIL=$((FAIL + 1))
  echo "FAIL - $1"
  shift
  for line in "$@"; do printf '    %s\n' "$line"; done
}

# start_server NAME [ARGS...]: starts a server (with ARGS), sets ${NAME}_PID
# and ${NAME}_ADDR
start_server() {
  local name=$1 pf="$TMP/$1.port" log="$TMP/$1.log"
  "$SERVER" --listen 127.0.0.1:0 --port-file "$pf" --io-threads 2 "${@:2}" \
    >"$log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 1000); do
    [ -s "$pf" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.01
  done
  if [ ! -s "$pf" ]; then
    echo "embps-server did not start:" >&2
    cat "$log" >&2
    echo "0 passed, 1 failed"
    exit 1
  fi
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_ADDR" '127.0.0.1:%s' "$(cat "$pf")"
}

# stop_server NAME: SIGTERM, expect exit status 0 within 10 s
stop_server() {
  local name=$1 pidvar="${1}_PID" st
  local pid=${!pidvar}
  kill -TERM "$pid"
  for _ in $(seq 1 1000); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  if kill -0 "$pid" 2>/dev/null; then
    bad "$name: SIGTERM ends the server" "still running after 10 s"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    return
  fi
  wait "$pid"
  st=$?
  if [ "$st" -eq 0 ]; then
    ok "$name: SIGTERM ends the server with status 0"
  else
    bad "$name: SIGTERM ends the server with status 0" "status $st" \
      "$(tail -5 "$TMP/$name.log")"
  fi
}

# cli ARGS...: runs the CLI against $ADDR; sets RC, stdout in $TMP/out,
# stderr in $TMP/err
cli() {
  timeout 30 "$CLI" --servers "$ADDR" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
}

# expect_ok NAME ARGS...: exit 0, nothing on stderr
expect_ok() {
  local name=$1
  shift
  cli "$@"
  if [ "$RC" -eq 0 ] && [ ! -s "$TMP/err" ]; then
    ok "$name"
  else
    bad "$name" "exit $RC" "stderr: $(cat "$TMP/err")"
  fi
}

# expect_out NAME EXPECTED ARGS...: exit 0 and stdout exactly EXPECTED
# (a printf format, so \t and \n work)
expect_out() {
  local name=$1 want=$2
  shift 2
  cli "$@"
  printf "$want" >"$TMP/want"
  if [ "$RC" -eq 0 ] && cmp -s "$TMP/out" "$TMP/want"; then
    ok "$name"
  else
    bad "$name" "exit $RC" "stderr: $(cat "$TMP/err")" \
      "got:  $(sed -n l "$TMP/out" | head -20)" \
      "want: $(sed -n l "$TMP/want" | head -20)"
  fi
}

# expect_fail NAME TEXT ARGS...: non-zero exit, nothing on stdout, exactly
# one line on stderr, containing TEXT (fixed string, case-insensitive)
expect_fail_with() {
  local name=$1 text=$2
  shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [ "$RC" -ne 0 ] && [ "$RC" -lt 124 ] && [ "$lines" -eq 1 ] &&
    [ ! -s "$TMP/out" ] && grep -qiF -- "$text" "$TMP/err"; then
    ok "$name"
  else
    bad "$name" "exit $RC, $lines stderr line(s), want text: $text" \
      "stderr: $(cat "$TMP/err")" "stdout: $(head -c 300 "$TMP/out")"
  fi
}
expect_fail() {
  local name=$1 text=$2
  shift 2
  expect_fail_with "$name" "$text" timeout 30 "$CLI" --servers "$ADDR" "$@"
}

# json_check NAME PYTHON_EXPR: stdout of the last command is valid JSON and
# the expression (over `d`, the parsed document) is true
json_check() {
  local name=$1 expr=$2
  if [ "$RC" -ne 0 ]; then
    bad "$name" "exit $RC" "stderr: $(cat "$TMP/err")"
    return
  fi
  if ! python3 -c 'import json,sys; json.load(sys.stdin)' <"$TMP/out" \
    2>"$TMP/pyerr"; then
    bad "$name: valid JSON" "$(cat "$TMP/pyerr")" "$(head -c 500 "$TMP/out")"
    return
  fi
  if python3 -c "
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if ($expr) else 1)" <"$TMP/out" 2>"$TMP/pyerr"; then
    ok "$name"
  else
    bad "$name" "condition: $expr" "$(cat "$TMP/pyerr")" \
      "$(head -c 800 "$TMP/out")"
  fi
}

# ------------------------------------------------------------------ setup
start_server MAIN
ADDR=$MAIN_ADDR
if grep -q ready "$TMP/MAIN.log"; then
  ok "server prints a ready line"
else
  bad "server prints a ready line" "$(cat "$TMP/MAIN.log")"
fi

# ------------------------------------------------------------------ tables
expect_ok "create-table dense sgd" create-table emb --dim 3 --rows 10 \
  --optimizer sgd --lr 0.5 --init constant:0.25 --seed 7
expect_ok "create-table dynamic adagrad with options" create-table dyn \
  --dim 2 --dynamic --optimizer adagrad --lr 0.1 --eps 1e-8 \
  --initial-accumulator 0.1 --init uniform:0.05 --seed 9 --padding-id -1
expect_ok "create-table adam with options" create-table adm --dim 4 \
  --rows 100 --optimizer adam --lr 0.001 --beta1 0.8 --beta2 0.99 \
  --eps 1e-7 --init normal:0.01 --seed 1
expect_ok "create-table ftrl with options" create-table ftr --dim 4 \
  --dynamic --optimizer ftrl --lr 0.05 --l1 0.001 --l2 0.01 \
  --lr-power -0.5 --initial-accumulator 0.2
expect_ok "create-table for binary files" create-table bin --dim 2 --rows 6 \
  --lr 1
expect_ok "create-table for %.9g" create-table prec --dim 2 --rows 4 \
  --init constant:0.1

cli tables
if [ "$RC" -eq 0 ] && grep -qE '^emb +3 +10 +sgd' "$TMP/out" &&
  grep -qE '^dyn +2 +dynamic +adagrad' "$TMP/out" &&
  grep -qE '^adm +4 +100 +adam' "$TMP/out" &&
  grep -qE '^ftr +4 +dynamic +ftrl' "$TMP/out" &&
  [ "$(wc -l <"$TMP/out")" -eq 7 ]; then
  ok "tables (text)"
else
  bad "tables (text)" "exit $RC" "$(cat "$TMP/out" "$TMP/err")"
fi
cli tables --json
json_check "tables --json" \
  "isinstance(d, list) and len(d) == 6 and \
   {t['name'] for t in d} == {'emb','dyn','adm','ftr','bin','prec'} and \
   [t for t in d if t['name']=='emb'][0]['dim'] == 3 and \
   [t for t in d if t['name']=='emb'][0]['rows'] == 10 and \
   [t for t in d if t['name']=='emb'][0]['lr'] == 0.5 and \
   [t for t in d if t['name']=='dyn'][0]['dynamic'] is True and \
   [t for t in d if t['name']=='dyn'][0]['optimizer'] == 'adagrad' and \
   [t for t in d if t['name']=='ftr'][0]['optimizer'] == 'ftrl' and \
   all(t['rows_allocated'] == 0 for t in d)"

# ------------------------------------------------------------------ push/pull
# emb: init 0.25, lr 0.5. Row 1 gets (1,2,3)+(1,1,1) = (2,3,4) once summed:
# 0.25 - 0.5*(2,3,4) = (-0.75,-1.25,-1.75); row 2 gets (0.5,0.25,-1):
# (0,0.125,0.75); row 5 is untouched.
expect_ok "push with duplicate indices" push emb --indices 1,2,1 \
  --values 1,2,3,0.5,0.25,-1,1,1,1
expect_out "pull: request order, duplicates summed, %.9g" \
  '2\t0 0.125 0.75\n1\t-0.75 -1.25 -1.75\n5\t0.25 0.25 0.25\n1\t-0.75 -1.25 -1.75\n' \
  pull emb --ids 2,1,5,1
expect_out "pull prints %.9g (reads back to the same float32)" \
  '3\t0.100000001 0.100000001\n' pull prec --ids 3
cli pull prec --ids 3
if python3 -c "
import struct, sys
line = open('$TMP/out').read().split('\t')[1].split()
v = struct.unpack('<f', struct.pack('<f', float(line[0])))[0]
sys.exit(0 if v == struct.unpack('<f', struct.pack('<f', 0.1))[0] else 1)"; then
  ok "printed value reads back to float32(0.1)"
else
  bad "printed value reads back to float32(0.1)" "$(cat "$TMP/out")"
fi

# dynamic table: ids across int64, padding id -1 reads zeros, pushes to it
# are ignored
expect_ok "push to a dynamic table (int64 extremes, padding id)" push dyn \
  --indices -9223372036854775808,9223372036854775807,-1,-9223372036854775808 \
  --values 1,1,1,1,1,1,1,1
cli pull dyn --ids -1,9223372036854775807,-9223372036854775808
if [ "$RC" -eq 0 ] && [ "$(wc -l <"$TMP/out")" -eq 3 ] &&
  [ "$(sed -n 1p "$TMP/out")" = "$(printf -- '-1\t0 0')" ] &&
  sed -n 2p "$TMP/out" | grep -q '^9223372036854775807	' &&
  sed -n 3p "$TMP/out" | grep -q '^-9223372036854775808	'; then
  ok "pull from a dynamic table"
else
  bad "pull from a dynamic table" "exit $RC" "$(cat "$TMP/out" "$TMP/err")"
fi

# binary files: bin has dim 2, lr 1, zeros. indices 3,4,3 with values
# (1.5,-2) (0.25,0.125) (0.5,1): row 3 = -(2,-1) = (-2,1), row 4 = (-0.25,-0.125)
python3 - "$TMP" <<'EOF'
import struct, sys
d = sys.argv[1]
open(d + "/idx.bin", "wb").write(struct.pack("<3q", 3, 4, 3))
open(d + "/val.bin", "wb").write(struct.pack("<6f", 1.5, -2, 0.25, 0.125, 0.5, 1))
open(d + "/ids.bin", "wb").write(struct.pack("<4q", 4, 0, 3, 3))
open(d + "/want.bin", "wb").write(struct.pack("<8f", -0.25, -0.125, 0, 0, -2, 1, -2, 1))
open(d + "/val5.bin", "wb").write(struct.pack("<5f", 1, 2, 3, 4, 5))
open(d + "/odd.bin", "wb").write(b"\0" * 10)
open(d + "/nan.bin", "wb").write(struct.pack("<6f", 1, 2, float("nan"), 4, 5, 6))
EOF
expect_ok "push --indices-file --values-file" push bin \
  --indices-file "$TMP/idx.bin" --values-file "$TMP/val.bin"
expect_ok "pull --ids-file --out" pull bin --ids-file "$TMP/ids.bin" \
  --out "$TMP/got.bin"
if cmp -s "$TMP/got.bin" "$TMP/want.bin" && [ ! -s "$TMP/out" ]; then
  ok "--out holds float32 little-endian rows, exact"
else
  bad "--out holds float32 little-endian rows, exact" \
    "$(od -An -tf4 "$TMP/got.bin" 2>&1)"
fi
expect_out "pull --ids-file prints rows" \
  '4\t-0.25 -0.125\n0\t0 0\n3\t-2 1\n3\t-2 1\n' pull bin --ids-file "$TMP/ids.bin"
cli pull bin --ids 3,0 --json
json_check "pull --json" \
  "d['table'] == 'bin' and d['dim'] == 2 and \
   [r['id'] for r in d['rows']] == [3, 0] and \
   d['rows'][0]['values'] == [-2, 1] and d['rows'][1]['values'] == [0, 0]"

# ------------------------------------------------------------------ stats
cli stats
if [ "$RC" -eq 0 ] && grep -qF "server $ADDR" "$TMP/out" &&
  grep -qE 'table emb +dim 3 .*rows 2 ' "$TMP/out"; then
  ok "stats (text)"
else
  bad "stats (text)" "exit $RC" "$(cat "$TMP/out" "$TMP/err")"
fi
cli stats --json
json_check "stats --json" \
  "isinstance(d, list) and len(d) == 1 and d[0]['address'] == '$ADDR' and \
   d[0]['cluster_size'] == 1 and d[0]['pushes'] >= 3 and \
   [t for t in d[0]['tables'] if t['name']=='emb'][0]['rows_allocated'] == 2 and \
   [t for t in d[0]['tables'] if t['name']=='bin'][0]['rows_allocated'] == 2 and \
   [t for t in d[0]['tables'] if t['name']=='dyn'][0]['rows_allocated'] == 2"

# ------------------------------------------------------------------ drop
expect_ok "create-table then drop-table" create-table scratch --dim 1 --rows 1
expect_ok "drop-table" drop-table scratch
cli tables --json
json_check "a dropped table is gone" "'scratch' not in {t['name'] for t in d}"
expect_fail "drop-table of an unknown table" 'unknown table "scratch"' \
  drop-table scratch

# ------------------------------------------------------------------ errors
cli pull emb --ids 0,1,2,3,4,5,6,7,8,9 --out "$TMP/before.bin"
expect_fail "pull: unknown table" 'unknown table "nope"' pull nope --ids 1
expect_fail "push: unknown table" 'unknown table "nope"' push nope \
  --indices 1 --values 1,2,3
expect_fail "pull: index out of range" 'index 12 out of range [0, 10)' \
  pull emb --ids 1,12
expect_fail "push: index out of range (last index)" \
  'index 12 out of range [0, 10)' push emb --indices 1,2,12 \
  --values 1,1,1,1,1,1,1,1,1
expect_fail "push: negative index" 'index -3 out of range' push emb \
  --indices -3 --values 1,1,1
expect_fail "push: count mismatch (--values)" '2 indices but 5 values' \
  push emb --indices 1,2 --values 1,2,3,4,5
expect_fail "push: count mismatch (--values-file)" '3 indices but 5 values' \
  push bin --indices-file "$TMP/idx.bin" --values-file "$TMP/val5.bin"
expect_fail "push: values file not whole float32s" 'whole number' \
  push bin --indices-file "$TMP/idx.bin" --values-file "$TMP/odd.bin"
expect_fail "push: NaN value" 'non-finite' push emb --indices 1,2 \
  --values 1,1,1,1,nan,1
expect_fail "push: inf value" 'non-finite' push emb --indices 1,2,3 \
  --values 1,1,1,1,1,1,1,inf,1
expect_fail "push: NaN in --values-file" 'non-finite' push bin \
  --indices-file "$TMP/idx.bin" --values-file "$TMP/nan.bin"
expect_fail "create-table: table exists" 'table "emb" already exists' \
  create-table emb --dim 3 --rows 10
expect_fail "pull: missing --ids-file" "$TMP/missing.bin" pull emb \
  --ids-file "$TMP/missing.bin"
expect_fail_with "bad --servers address" '"nonsense" is not HOST:PORT' \
  timeout 30 "$CLI" --servers nonsense pull emb --ids 1
expect_fail_with "bad --servers port" '127.0.0.1:99999' \
  timeout 30 "$CLI" --servers 127.0.0.1:99999 tables
expect_fail_with "bad server of a member" '("127.0.0.1:7070|"): an empty address' \
  timeout 30 "$CLI" --servers '127.0.0.1:7070|' tables
expect_fail_with "bad second server of a member" '"x" is not HOST:PORT' \
  timeout 30 "$CLI" --servers '127.0.0.1:7070|x' tables
# a member's servers: the unreachable first one is passed over
SAVED_ADDR=$ADDR
ADDR="127.0.0.1:1|$MAIN_ADDR"
expect_ok "a member listed with an unreachable server first" tables
ADDR=$SAVED_ADDR
cli pull emb --ids 0,1,2,3,4,5,6,7,8,9 --out "$TMP/after.bin"
if [ "$RC" -eq 0 ] && cmp -s "$TMP/before.bin" "$TMP/after.bin"; then
  ok "refused requests changed nothing"
else
  bad "refused requests changed nothing" "exit $RC"
fi
cli pull bin --ids-file "$TMP/ids.bin" --out "$TMP/got2.bin"
if [ "$RC" -eq 0 ] && cmp -s "$TMP/got2.bin" "$TMP/want.bin"; then
  ok "refused binary pushes changed nothing"
else
  bad "refused binary pushes changed nothing" "exit $RC"
fi

# server down: a port where a server was, now stopped
start_server GONE
stop_server GONE
expect_fail_with "server down: connection refused" 'refused' \
  timeout 30 "$CLI" --servers "$GONE_ADDR" tables
expect_fail_with "server down: the message names the address" "$GONE_ADDR" \
  timeout 30 "$CLI" --servers "$GONE_ADDR" pull emb --ids 1

# the server still serves after all that
expect_out "server still serves" '5\t0.25 0.25 0.25\n' pull emb --ids 5

# synchronous tables: two workers' pushes for step 1 are averaged into one
# step, acknowledged together; stale and unnumbered pushes are refused
expect_ok "create-table --sync-workers 2" create-table syn --dim 2 --rows 4 \
  --sync-workers 2 --lr 1
"$CLI" --servers "$MAIN_ADDR" push syn --indices 1 --values 2,2 --step 1 &
held=$!
sleep 0.2
expect_ok "second worker completes step 1" push syn --indices 1,2 \
  --values 2,2,4,4 --step 1
if wait "$held"; then ok "first worker acknowledged after the step"; else
  bad "first worker acknowledged after the step" "exit $?"; fi
expect_out "sync step applied the average" '1\t-2 -2\n2\t-2 -2\n' \
  pull syn --ids 1,2
expect_fail "stale step refused" "stale" push syn --indices 1 \
  --values 1,1 --step 1
expect_fail "push without a step refused" "must name its step" \
  push syn --indices 1 --values 1,1

# storage types: f16/bf16 weights are stored rounded to nearest even and
# pulled widened (exactly); 0.1 reads as bf16(0.1) = 0.10009765625 and
# f16(0.1) = 0.0999755859375 before and after a push; lr 1, so a push of g
# stores round(w - g)
expect_ok "create-table --dtype bf16" create-table hb --dim 2 --rows 4 \
  --dtype bf16 --init constant:0.1 --lr 1
expect_ok "create-table --dtype f16 (dynamic)" create-table hf --dim 2 \
  --dynamic --dtype f16 --init constant:0.1 --lr 1
expect_out "bf16: a row never pushed reads as its rounded initial value" \
  '3\t0.100097656 0.100097656\n' pull hb --ids 3
expect_out "f16: a row never pushed reads as its rounded initial value" \
  '7\t0.0999755859 0.0999755859\n' pull hf --ids 7
expect_ok "push to a bf16 table" push hb --indices 3 --values 0.05,-1
expect_ok "push to an f16 table" push hf --indices 7 --values 0.05,-1
expect_out "bf16: pushed weights rounded to nearest even" \
  '3\t0.0500488281 1.1015625\n2\t0.100097656 0.100097656\n' pull hb --ids 3,2
expect_out "f16: pushed weights rounded to nearest even" \
  '7\t0.049987793 1.09960938\n' pull hf --ids 7
cli tables
if [ "$RC" -eq 0 ] && grep -qE '^hb +2 +4 +sgd +bf16 +1 ' "$TMP/out" &&
  grep -qE '^hf +2 +dynamic +sgd +f16 +1 ' "$TMP/out" &&
  grep -qE '^emb +3 +10 +sgd +f32 ' "$TMP/out"; then
  ok "tables shows the dtype"
else
  bad "tables shows the dtype" "exit $RC" "$(cat "$TMP/out" "$TMP/err")"
fi
cli tables --json
json_check "tables --json has the dtype" \
  "[t for t in d if t['name']=='hb'][0]['dtype'] == 'bf16' and \
   [t for t in d if t['name']=='hf'][0]['dtype'] == 'f16' and \
   [t for t in d if t['name']=='emb'][0]['dtype'] == 'f32'"
cli stats
if [ "$RC" -eq 0 ] && grep -qE 'table hb +dim 2 +sgd +bf16 +rows 1 ' "$TMP/out"; then
  ok "stats shows the dtype"
else
  bad "stats shows the dtype" "exit $RC" "$(cat "$TMP/out" "$TMP/err")"
fi
cli stats --json
json_check "stats --json has the dtype" \
  "[t for t in d[0]['tables'] if t['name']=='hf'][0]['dtype'] == 'f16'"
expect_fail "create-table: unknown dtype" '--dtype "f64" is not f32|f16|bf16' \
  create-table h64 --dim 2 --rows 4 --dtype f64

# export and import (issue 10): the f16 table above, to .npy files and back
# into a new table created from spec.json
expect_out "export writes the rows" \
  "exported 1 rows of table \"hf\" to $TMP/hf-out\n" \
  export hf --out "$TMP/hf-out" --with-state
expect_out "import --create makes the table and its rows" \
  "imported 1 rows of table \"hf2\" from $TMP/hf-out\n" \
  import hf2 --from "$TMP/hf-out" --create
expect_out "imported rows read back exactly (f16 widened, rounded back)" \
  '7\t0.049987793 1.09960938\n3\t0.0999755859 0.0999755859\n' \
  pull hf2 --ids 7,3
expect_fail "export needs --out" "export needs --out DIR" export hf
expect_fail "import of a missing table without --create" 'unknown table' \
  import nosuch --from "$TMP/hf-out"
expect_fail "import from a directory without weights.npy" 'weights.npy' \
  import hf2 --from "$TMP"

stop_server MAIN

# ------------------------------------------------- durability under tables
start_server DUR --data-dir "$TMP/data" --fsync always
ADDR=$DUR_ADDR
expect_ok "data dir: create-table" create-table d --dim 2 --rows 4 --lr 0.5
cli tables
if [ "$RC" -eq 0 ] && grep -qF "server $DUR_ADDR: data dir $TMP/data, fsync always, no checkpoint since start (restored up to LSN 0), log " "$TMP/out"; then
  ok "tables shows the data dir before a checkpoint"
else
  bad "tables shows the data dir before a checkpoint" "exit $RC" \
    "$(cat "$TMP/out" "$TMP/err")"
fi
cli checkpoint
if [ "$RC" -eq 0 ] && grep -qE '^server 0: checkpoint at LSN 1 \(ckpt-0000000000000001\), [0-9]+ bytes in [0-9]+ ms$' "$TMP/out" &&
   [ -f "$TMP/data/ckpt-0000000000000001/MANIFEST" ]; then
  ok "checkpoint names the LSN as its directory does"
else
  bad "checkpoint names the LSN as its directory does" "exit $RC" \
    "$(cat "$TMP/out" "$TMP/err")" "$(ls "$TMP/data")"
fi
expect_out "alter --lr (CLI)" \
  'table d: lr 0.25, eps 0, beta1 0.9, beta2 0.999, l1 0, l2 0, lr-power -0.5, weight-decay 0\n' \
  alter d --lr 0.25
expect_fail "alter refuses a bad value and names it" "lr must be > 0 (got -2)" \
  alter d --lr -2
expect_fail "alter of an unknown table names the server" \
  "server 0 ($DUR_ADDR): unknown table \"nope\"" alter nope --lr 1
cli tables
if [ "$RC" -eq 0 ] && grep -qE "^server $DUR_ADDR: data dir $TMP/data, fsync always, last checkpoint at unix time [0-9]{10} \([0-9]+ bytes in [0-9]+ ms, LSN 1: ckpt-0000000000000001\), log [0-9]+ bytes$" "$TMP/out"; then
  ok "tables shows the last checkpoint and the log"
else
  bad "tables shows the last checkpoint and the log" "exit $RC" \
    "$(cat "$TMP/out" "$TMP/err")"
fi
cli tables --json
json_check "tables --json: each holding server's durability figures" \
  "len(d) == 1 and d[0]['lr'] == 0.25 and len(d[0]['servers']) == 1 and \
   d[0]['servers'][0]['address'] == '$DUR_ADDR' and \
   d[0]['servers'][0]['data_dir'] == '$TMP/data' and \
   d[0]['servers'][0]['fsync'] == 'always' and \
   d[0]['servers'][0]['checkpoint_unix_s'] > 1700000000 and \
   d[0]['servers'][0]['checkpoint_bytes'] > 0 and \
   d[0]['servers'][0]['checkpoint_lsn'] == 1 and \
   d[0]['servers'][0]['log_bytes'] > 0 and \
   d[0]['servers'][0]['durability_failed'] == '' and \
   'checkpoint_ms' in d[0]['servers'][0]"
stop_server DUR

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
