#!/usr/bin/env bash
# test_cluster_ready.sh SERVER CLI - /readyz with --cluster-servers: two
# real servers with an auth token and data dirs; member 1 restarted without
# its data dir is not ready (the body names the table and who holds it,
# embps_cluster_missing_tables says 1); `create-table --exist-ok` refuses
# to refill it (naming it, creating nothing) until `complete-table`
# completes it; a peer down does not make the other unready (said in the
# body, logged once); --complete-tables creates the missing table itself;
# inconsistent flags are refused.
set -u
[ $# -eq 2 ] || { echo "usage: $0 SERVER CLI" >&2; exit 2; }
SERVER=$1
CLI=$2
. "$(dirname "$0")/lib.sh"
command -v promtool >/dev/null || { echo "promtool missing (apt-get install prometheus)"; exit 1; }

# two free ports for the cluster list (the servers must know them up front)
read -r P0 P1 < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
L=127.0.0.1:$P0,127.0.0.1:$P1
umask 077
printf 'cluster-secret\n' >"$TMP/token"
c() { timeout 30 "$CLI" --servers "$L" --token-file "$TMP/token" "$@"; }

# member NAME I DIR [ARGS...]: server I of the cluster, data in DIR
# (--fsync never: this test is about tables, not about syncing them)
member() {
  local name=$1 i=$2 dir=$3 port
  shift 3
  port=$([ "$i" = 0 ] && echo "$P0" || echo "$P1")
  rm -f "$TMP/$name.mport" "$TMP/$name.port" # start waits for new ones
  start "$name" --listen "127.0.0.1:$port" --cluster-servers "$L" \
    --cluster-index "$i" --auth-token-file "$TMP/token" --data-dir "$dir" \
    --fsync never \
    --metrics-listen 127.0.0.1:0 --metrics-port-file "$TMP/$name.mport" "$@"
  printf -v "${name}_M" 'http://127.0.0.1:%s' "$(cat "$TMP/$name.mport")"
}
# readyz URL: the status code; the body (which names tables for a
# request with the token only) in $TMP/body
readyz() { curl -s -H "Authorization: Bearer cluster-secret" -o "$TMP/body" \
             -w '%{http_code}' "$1/readyz"; }
# wait_readyz URL CODE [PATTERN]: up to 15 s for that code (and a body
# matching PATTERN); 0 when it came
wait_readyz() {
  for _ in $(seq 1 150); do
    if [ "$(readyz "$1")" = "$2" ] && grep -q -- "${3:-.}" "$TMP/body"; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}
gauge() { curl -s "$1/metrics" | awk -v k="$2" '$1 == k {print $2}'; }

member a0 0 "$TMP/d0"
member a1 1 "$TMP/d1"
wait_readyz "$a0_M" 200 && wait_readyz "$a1_M" 200 &&
  ok "both ready (no tables yet)" || bad "both ready" "$(cat "$TMP/body")"
check "create user on both" c create-table user --dim 4 --dynamic --optimizer adagrad
check "push" c push user --indices 1,2,3 --values "$(seq -s, 1 12)"
wait_readyz "$a1_M" 200 '^ready$' && ok "member 1 ready holding user" ||
  bad "member 1 ready holding user" "$(cat "$TMP/body")"

# member 1 loses its disk
stop a1
member a1 1 "$TMP/d1-empty"
want="missing table \"user\" held by server 0 (127.0.0.1:$P0)"
wait_readyz "$a1_M" 503 "$want" && ok "restarted empty: /readyz 503 naming user" ||
  bad "restarted empty: /readyz 503 naming user" "$(cat "$TMP/body")"
[ "$(curl -s -o "$TMP/body" -w '%{http_code}' "$a1_M/readyz")" = 503 ] &&
  ! grep -q user "$TMP/body" && ok "without the token: 503 naming no table" ||
  bad "without the token: 503 naming no table" "$(cat "$TMP/body")"
[ "$(gauge "$a1_M" embps_cluster_missing_tables)" = 1 ] &&
  ok "embps_cluster_missing_tables 1" || bad "embps_cluster_missing_tables 1"
curl -s "$a1_M/metrics" >"$TMP/metrics"
check "promtool check metrics (--cluster-servers)" promtool check metrics <"$TMP/metrics"
[ "$(readyz "$a0_M")" = 200 ] && ok "member 0 stays ready" ||
  bad "member 0 stays ready" "$(cat "$TMP/body")"
c create-table user --dim 4 --dynamic --optimizer adagrad --exist-ok \
  >"$TMP/out" 2>&1 && bad "create-table --exist-ok refuses" "exit 0" ||
  { grep -q "missing on server 1 (127.0.0.1:$P1) but held by server 0" "$TMP/out" &&
    grep -q "embps complete-table user" "$TMP/out" &&
    ok "create-table --exist-ok refuses, naming member 1 and complete-table" ||
    bad "create-table --exist-ok refuses" "$(cat "$TMP/out")"; }
[ "$(readyz "$a1_M")" = 503 ] && ok "refused: member 1 still not ready" ||
  bad "refused: member 1 still not ready" "$(cat "$TMP/body")"
check "complete-table completes member 1" c complete-table user
[ "$(readyz "$a1_M")" = 200 ] && ok "completed: /readyz 200 at once" ||
  bad "completed: /readyz 200 at once" "$(cat "$TMP/body")"
[ "$(gauge "$a1_M" embps_cluster_missing_tables)" = 0 ] &&
  ok "embps_cluster_missing_tables 0" || bad "embps_cluster_missing_tables 0"

# a peer down: member 0 stays ready, says so, logs it once
stop a1
wait_readyz "$a0_M" 200 "server 1 (127.0.0.1:$P1) not asked" &&
  ok "peer down: member 0 ready, body says server 1 was not asked" ||
  bad "peer down: member 0 ready" "$(cat "$TMP/body")"
[ "$(gauge "$a0_M" embps_cluster_peers_unreachable)" = 1 ] &&
  ok "embps_cluster_peers_unreachable 1" || bad "embps_cluster_peers_unreachable 1"
sleep 0.2
n=$(grep -c 'cannot ask server 1' "$TMP/a0.log")
sleep 3.5 # one more round: no second line
n2=$(grep -c 'cannot ask server 1' "$TMP/a0.log")
[ "$n" -ge 1 ] && [ "$n2" = "$n" ] && ok "unreachable peer logged, not again" ||
  bad "unreachable peer logged, not again" "$n then $n2 lines"

# --complete-tables: the empty member creates user from member 0's spec
member a1 1 "$TMP/d1-complete" --complete-tables
wait_readyz "$a1_M" 200 '^ready$' && ok "--complete-tables: ready by itself" ||
  bad "--complete-tables: ready by itself" "$(cat "$TMP/body")" "$(cat "$TMP/a1.log")"
grep -q 'complete-tables: CREATED table "user"' "$TMP/a1.log" &&
  ok "--complete-tables: logged" || bad "--complete-tables: logged" "$(cat "$TMP/a1.log")"
c --member 1 tables >"$TMP/out" 2>&1 && grep -q '^user ' "$TMP/out" &&
  ok "--complete-tables: member 1 holds user" ||
  bad "--complete-tables: member 1 holds user" "$(cat "$TMP/out")"
check "same spec: create-table --exist-ok is a no-op" \
  c create-table user --dim 4 --dynamic --optimizer adagrad --exist-ok
check "push after completion" c push user --indices 1,2,3 --values "$(seq -s, 1 12)"
stop a0
stop a1

# flags that do not fit together are refused by name
refused() {
  "$SERVER" "${@:2}" >"$TMP/out" 2>&1 && bad "$1" "accepted" ||
    { grep -q -- "$1" "$TMP/out" && ok "refused: $1" || bad "refused: $1" "$(cat "$TMP/out")"; }
}
refused "lists 2 servers but --cluster-size is 3" \
  --listen 127.0.0.1:$P0 --cluster-servers "$L" --cluster-size 3
refused "has port $P1 but --listen has port $P0" \
  --listen 127.0.0.1:$P0 --cluster-servers "$L" --cluster-index 1
refused "is past the 2 servers" --cluster-servers "$L" --cluster-index 2
refused "is not HOST:PORT" --cluster-servers "127.0.0.1:$P0,nonsense"
refused "--complete-tables needs --cluster-servers" --complete-tables
finish
