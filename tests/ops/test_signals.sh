#!/usr/bin/env bash
# test_signals.sh SERVER CLI - the daemon's signals (server/signals.c,
# server/reload.c, server/server.c):
#   - SIGTERM during a long restore (EMBPS_TEST_RESTORE_DELAY_MS) exits 0
#     within a second, saying so, also as PID 1 of a PID namespace (a
#     container's init, which the kernel gives no default action: before,
#     the signal was ignored until the restore ended); the data dir then
#     restores normally;
#   - SIGHUP never stops the server: while starting it is done once
#     serving, while serving it reloads and logs one line, while stopping
#     it is ignored; a second SIGTERM while stopping changes nothing;
#   - a token rotation on a cluster of two without downtime: the three
#     steps of README "Security" (OLD+NEW, NEW+OLD, NEW), each member
#     reloaded by SIGHUP: during the window both tokens work on every
#     member, after it only the new one; the members ask each other with
#     the current token (a member restarted after the rotation is asked
#     with NEW); /metrics names tables to a request bearing either token
#     during the window, the new one only after it; a refused file changes
#     nothing;
#   - --log-level-file read again at SIGHUP.
set -u
[ $# -eq 2 ] || { echo "usage: $0 SERVER CLI" >&2; exit 2; }
SERVER=$1
CLI=$2
. "$(dirname "$0")/lib.sh"
umask 077 # token files must be the owner's alone

# wait_for FILE TEXT [SECONDS]: 0 once TEXT is in FILE
wait_for() {
  local deadline=$((SECONDS + ${3:-10}))
  until grep -qF -- "$2" "$1" 2>/dev/null; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.02
  done
}
# exits_within PID MS: 0 when PID has exited within MS milliseconds
exits_within() {
  local i
  for ((i = 0; i < $2 / 10; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.01
  done
  ! kill -0 "$1" 2>/dev/null
}

# ---------------------------------------------------------- SIGTERM, restore
start s --data-dir "$TMP/data"
c() { timeout 30 "$CLI" --servers "$s_ADDR" "$@"; }
c create-table t --dim 2 --rows 10 --lr 1 >"$TMP/out" 2>&1 &&
  c push t --indices 3 --values 1,1 >>"$TMP/out" 2>&1 &&
  ok "a table and a push to restore" || bad "a table and a push" "$(cat "$TMP/out")"
stop s

# as PID 1 of a PID namespace when this host allows (root), else plain
PID1=
if unshare --pid --fork true 2>/dev/null; then PID1="unshare --pid --fork"; fi
for how in ${PID1:+pid1} plain; do
  rm -f "$TMP/r.log"
  launcher=
  [ "$how" = pid1 ] && launcher=$PID1
  EMBPS_TEST_RESTORE_DELAY_MS=30000 $launcher "$SERVER" --listen 127.0.0.1:0 \
    --data-dir "$TMP/data" >"$TMP/r.log" 2>&1 &
  pid=$!
  SERVER_PIDS+=("$pid")
  if ! wait_for "$TMP/r.log" "restore delayed"; then
    bad "$how: the restore begins" "$(cat "$TMP/r.log")"
    continue
  fi
  target=$pid # unshare passes no signal on: the server is its child
  [ "$how" = pid1 ] && target=$(pgrep -P "$pid")
  t0=$(date +%s%N)
  kill -TERM "$target"
  if exits_within "$pid" 1000; then
    wait "$pid"
    st=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ "$st" -eq 0 ] && grep -q "signal 15 while starting (restoring the data dir): exiting without serving" "$TMP/r.log" &&
      ok "$how: SIGTERM during a 30 s restore: exit 0 in $ms ms, said so" ||
      bad "$how: SIGTERM during a restore: exit 0, said so" "status $st" "$(cat "$TMP/r.log")"
  else
    bad "$how: SIGTERM during a restore exits within 1 s" "$(cat "$TMP/r.log")"
    kill -9 "$target" 2>/dev/null
    wait "$pid"
  fi
done
start s2 --data-dir "$TMP/data"
c() { timeout 30 "$CLI" --servers "$s2_ADDR" "$@"; }
c pull t --ids 3 >"$TMP/out" 2>&1 && grep -q -- "-1 -1" "$TMP/out" &&
  ok "the data dir restores after the interrupted start" ||
  bad "the data dir restores after the interrupted start" "$(cat "$TMP/out")"

# ------------------------------------------------------------------ SIGHUP
kill -HUP "$s2_PID"
wait_for "$TMP/s2.log" "SIGHUP: nothing to reload" &&
  c tables >/dev/null 2>&1 && kill -0 "$s2_PID" &&
  ok "SIGHUP while serving: one line, still serving" ||
  bad "SIGHUP while serving: one line, still serving" "$(cat "$TMP/s2.log")"
stop s2
# while starting (the restore delayed 1 s): done once serving
rm -f "$TMP/h.port"
EMBPS_TEST_RESTORE_DELAY_MS=1000 "$SERVER" --listen 127.0.0.1:0 \
  --port-file "$TMP/h.port" --data-dir "$TMP/data" >"$TMP/h.log" 2>&1 &
h_PID=$!
SERVER_PIDS+=("$h_PID")
wait_for "$TMP/h.log" "restore delayed" && kill -HUP "$h_PID"
wait_for "$TMP/h.log" "SIGHUP (while starting): nothing to reload" &&
  kill -0 "$h_PID" && [ -s "$TMP/h.port" ] &&
  ok "SIGHUP while starting: kept, done once serving" ||
  bad "SIGHUP while starting: kept, done once serving" "$(cat "$TMP/h.log")"
# while stopping (a final checkpoint of a slowed table is not needed: the
# signals arrive during the drain or the checkpoint, both are ignored)
kill -TERM "$h_PID"
kill -HUP "$h_PID" 2>/dev/null
kill -TERM "$h_PID" 2>/dev/null
timeout 10 tail --pid="$h_PID" -f /dev/null
wait "$h_PID"
st=$?
[ "$st" -eq 0 ] && ok "SIGHUP and a second SIGTERM while stopping: exit 0" ||
  bad "SIGHUP and a second SIGTERM while stopping: exit 0" "status $st" "$(cat "$TMP/h.log")"

# --------------------------------------------------------- token rotation
printf 'OLD\n' >"$TMP/old"
printf 'NEW\n' >"$TMP/new"
cp "$TMP/old" "$TMP/t0"
cp "$TMP/old" "$TMP/t1"
P=($(/usr/bin/python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'))
PEERS=127.0.0.1:${P[0]},127.0.0.1:${P[1]}
member() { # member I: cluster member I with token file tI
  rm -f "$TMP/m$1.port"
  "$SERVER" --listen "127.0.0.1:${P[$1]}" --port-file "$TMP/m$1.port" \
    --cluster-servers "$PEERS" --cluster-index "$1" \
    --auth-token-file "$TMP/t$1" --metrics-listen 127.0.0.1:0 \
    --metrics-port-file "$TMP/m$1.mport" >"$TMP/m$1.log" 2>&1 &
  printf -v "m$1_PID" '%s' "$!"
  SERVER_PIDS+=("$!")
  for _ in $(seq 1 1000); do [ -s "$TMP/m$1.port" ] && break; sleep 0.01; done
  [ -s "$TMP/m$1.port" ] || { bad "member $1 starts" "$(cat "$TMP/m$1.log")"; finish; }
}
member 0
member 1
# works TOKENFILE: the whole cluster answers a client with that token
works() { timeout 30 "$CLI" --servers "$PEERS" --token-file "$1" tables >"$TMP/out" 2>&1; }
# hup STEP: SIGHUP to both members, then wait for the reload line of STEP
n_reloads=0
hup() {
  n_reloads=$((n_reloads + 1))
  for i in 0 1; do
    local pv="m${i}_PID"
    kill -HUP "${!pv}"
  done
  for i in 0 1; do
    local deadline=$((SECONDS + 10))
    until [ "$(grep -c 'SIGHUP: reloaded' "$TMP/m$i.log")" -ge $n_reloads ]; do
      [ $SECONDS -ge $deadline ] && { bad "$1: member $i reloads" "$(cat "$TMP/m$i.log")"; return; }
      sleep 0.02
    done
  done
}
for _ in $(seq 1 1000); do [ -s "$TMP/m0.mport" ] && break; sleep 0.01; done
M0=http://127.0.0.1:$(cat "$TMP/m0.mport")
# named TOKEN: member 0's /metrics names table "rot" to a request bearing
# TOKEN (to others it says #N)
named() { curl -s -H "Authorization: Bearer $1" "$M0/metrics" | grep -q 'table="rot"'; }
timeout 30 "$CLI" --servers "$PEERS" --token-file "$TMP/old" create-table rot \
  --dim 2 --rows 10 >"$TMP/out" 2>&1 || bad "create rot" "$(cat "$TMP/out")"
works "$TMP/old" && ! works "$TMP/new" && ok "before: OLD works, NEW is refused" ||
  bad "before: OLD works, NEW is refused" "$(cat "$TMP/out")"
printf 'OLD\nNEW\n' | tee "$TMP/t0" >"$TMP/t1"
hup "step 1"
works "$TMP/old" && works "$TMP/new" &&
  ok "step 1 (OLD, NEW): both tokens work on every member" ||
  bad "step 1 (OLD, NEW): both tokens work on every member" "$(cat "$TMP/out")"
named OLD && named NEW && ok "step 1: /metrics names tables for either token" ||
  bad "step 1: /metrics names tables for either token" "$(curl -s -H 'Authorization: Bearer NEW' "$M0/metrics" | grep rot)"
printf 'NEW\r\nOLD\r\n' | tee "$TMP/t0" >"$TMP/t1" # CRLF lines too
hup "step 2"
works "$TMP/old" && works "$TMP/new" &&
  ok "step 2 (NEW, OLD): both tokens work on every member" ||
  bad "step 2 (NEW, OLD): both tokens work on every member" "$(cat "$TMP/out")"
# a client given the member's own file presents its first line
works "$TMP/t0" && ok "a two-line token file: clients present its first line" ||
  bad "a two-line token file: clients present its first line" "$(cat "$TMP/out")"
printf 'NEW\n' | tee "$TMP/t0" >"$TMP/t1"
hup "step 3"
works "$TMP/new" && ok "step 3 (NEW): NEW works" || bad "step 3 (NEW): NEW works" "$(cat "$TMP/out")"
works "$TMP/old" && bad "step 3 (NEW): OLD is refused" ||
  { grep -q "bad or missing auth token" "$TMP/out" && ok "step 3 (NEW): OLD is refused" ||
    bad "step 3 (NEW): OLD is refused" "$(cat "$TMP/out")"; }
named NEW && ! named OLD && ok "step 3: /metrics names tables for NEW only" ||
  bad "step 3: /metrics names tables for NEW only" "$(curl -s -H 'Authorization: Bearer NEW' "$M0/metrics" | grep rot)"
timeout 30 "$CLI" --servers "$PEERS" --token-file "$TMP/new" drop-table rot >"$TMP/out" 2>&1 ||
  bad "drop rot" "$(cat "$TMP/out")"
# member 1 restarts: member 0 asks it again with its current token, NEW
kill -TERM "$m1_PID"
wait "$m1_PID"
member 1
deadline=$((SECONDS + 15))
until curl -s "$M0/metrics" | grep -q '^embps_cluster_peers_unreachable 0$'; do
  [ $SECONDS -ge $deadline ] && break
  sleep 0.1
done
curl -s "$M0/metrics" | grep -q '^embps_cluster_peers_unreachable 0$' &&
  ok "after the rotation, member 0 asks a restarted member 1 with NEW" ||
  bad "after the rotation, member 0 asks a restarted member 1 with NEW" \
    "$(curl -s "$M0/readyz")" "$(tail -5 "$TMP/m0.log")"
# a refused file changes nothing
printf 'NEW\n\nOLD\n' >"$TMP/t0"
kill -HUP "$m0_PID"
wait_for "$TMP/m0.log" "SIGHUP: reload refused in part: --auth-token-file $TMP/t0: line 2: empty" &&
  timeout 30 "$CLI" --servers "$PEERS" --member 0 --token-file "$TMP/new" stats >"$TMP/out" 2>&1 &&
  ok "a refused token file: one ERROR line, the tokens in use stay" ||
  bad "a refused token file: one ERROR line, the tokens in use stay" "$(cat "$TMP/m0.log" "$TMP/out")"
for i in 0 1; do
  pv="m${i}_PID"
  kill -TERM "${!pv}"
  wait "${!pv}"
done

# ------------------------------------------------------------ the log level
echo warn >"$TMP/level"
start l --log-level-file "$TMP/level" --log-level debug
cl() { timeout 30 "$CLI" --servers "$l_ADDR" "$@" >/dev/null 2>&1; }
cl create-table quiet --dim 1 --rows 1
echo info >"$TMP/level"
kill -HUP "$l_PID"
wait_for "$TMP/l.log" "SIGHUP: reloaded --log-level-file $TMP/level: info"
cl create-table loud --dim 1 --rows 1
! grep -q 'created table "quiet"' "$TMP/l.log" && grep -q 'created table "loud"' "$TMP/l.log" &&
  ok "--log-level-file: warn (over --log-level debug), then info after SIGHUP" ||
  bad "--log-level-file: warn, then info after SIGHUP" "$(cat "$TMP/l.log")"
echo loud >"$TMP/level"
"$SERVER" --log-level-file "$TMP/level" >"$TMP/out" 2>&1
[ $? -eq 2 ] && grep -q -- "--log-level-file $TMP/level: \"loud\" is not debug|info|warn|error" "$TMP/out" &&
  ok "a bad --log-level-file at start: exit 2 naming it" ||
  bad "a bad --log-level-file at start: exit 2 naming it" "$(cat "$TMP/out")"
stop l
finish
