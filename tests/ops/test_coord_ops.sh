#!/usr/bin/env bash
# test_coord_ops.sh SERVER CLI ETCD - what an operator sees of automatic
# failover (--coordinator) on two real servers of one member and a real
# etcd on loopback: the /metrics coordinator series (promtool-valid, the
# role of each server, a failover counted on the one elected, every
# server's embps_member_primary_epoch naming the member's primary and its
# epoch before and after the failover, every series a row of README.md's
# metrics table), stats
# naming the primary on both servers, the CLI given the member's servers
# follower first reaching the primary for a push (its hello names it), a push
# sent with no retries to the follower alone reaching the primary too (an
# entry of one server is a seed), each applied once, `stats` and `tables`
# on either server naming the member's primary (the text lines and
# --json; `embps --help`, whence the man page, giving those forms),
# `embps promote` refused (etcd elects), and a
# primary stopped with SIGTERM giving its lease
# back (the follower elected at once, well before the lease would end).
set -u
[ $# -eq 3 ] || { echo "usage: $0 SERVER CLI ETCD" >&2; exit 2; }
SERVER=$1
CLI=$2
ETCD=$3
. "$(dirname "$0")/lib.sh"
command -v promtool >/dev/null || { echo "promtool missing (apt-get install prometheus)"; exit 1; }
[ -x "$ETCD" ] || { echo "etcd missing (apt-get install etcd-server)"; exit 1; }

# two free loopback ports for etcd (client, peer)
read -r EC EP < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
"$ETCD" --name ops --data-dir "$TMP/etcd" \
  --listen-client-urls "http://127.0.0.1:$EC" \
  --advertise-client-urls "http://127.0.0.1:$EC" \
  --listen-peer-urls "http://127.0.0.1:$EP" \
  --initial-advertise-peer-urls "http://127.0.0.1:$EP" \
  --initial-cluster "ops=http://127.0.0.1:$EP" >"$TMP/etcd.log" 2>&1 &
SERVER_PIDS+=("$!")
for _ in $(seq 1 1000); do
  curl -s -X POST -d '{}' "http://127.0.0.1:$EC/v3/maintenance/status" \
    >/dev/null 2>&1 && break
  sleep 0.01
done

LEASE=3000
coord=(--coordinator "etcd://127.0.0.1:$EC" --cluster-name ops
       --lease-ms "$LEASE" --sync-followers 1 --metrics-listen 127.0.0.1:0)
start a "${coord[@]}" --metrics-port-file "$TMP/a.mport"
# a is elected (alone) before b starts
for _ in $(seq 1 1000); do
  timeout 10 "$CLI" --servers "$a_ADDR" stats --json >"$TMP/sa" 2>/dev/null &&
    python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))[0]["role"] == 0' \
      "$TMP/sa" 2>/dev/null && break
  sleep 0.01
done
start b "${coord[@]}" --metrics-port-file "$TMP/b.mport"
MA=http://127.0.0.1:$(cat "$TMP/a.mport")
MB=http://127.0.0.1:$(cat "$TMP/b.mport")

# the follower in sync: a push through b's address lands on a
check "create through the primary" timeout 30 "$CLI" --servers "$a_ADDR" \
  create-table t --dim 2 --rows 10 --optimizer sgd --lr 1
check "a push given the member's servers, the follower first, reaches the primary" \
  timeout 30 "$CLI" --servers "$b_ADDR|$a_ADDR" push t --indices 1 --values 1,1
check "a push with no retries given the follower alone reaches the primary it names" \
  timeout 30 "$CLI" --servers "$b_ADDR" --retry-ms 0 push t --indices 1 --values 1,1
timeout 30 "$CLI" --servers "$a_ADDR" pull t --ids 1 >"$TMP/out" 2>&1
grep -q -- "-2" "$TMP/out" && ! grep -q -- "-[13-9]" "$TMP/out" &&
  ok "the redirected pushes applied once each" ||
  bad "the redirected pushes applied once each" "$(cat "$TMP/out")"

for s in a b; do
  timeout 10 "$CLI" --servers "$(eval echo "\$${s}_ADDR")" stats --json \
    >"$TMP/s$s" 2>&1
  python3 -c 'import json,sys; s = json.load(open(sys.argv[1]))[0]
assert s["primary"] == sys.argv[2], s
assert s["members"] == [{"member": 0, "primary": sys.argv[2],
                         "epoch": s["epoch"]}], s["members"]' \
    "$TMP/s$s" "$a_ADDR" &&
    ok "stats --json on $s names the primary, and that of member 0" ||
    bad "stats --json on $s names the primary, and that of member 0" "$(cat "$TMP/s$s")"
  timeout 10 "$CLI" --servers "$(eval echo "\$${s}_ADDR")" stats >"$TMP/t$s" 2>&1
  cp "$TMP/t$s" "$TMP/tstats"
  grep -qx "  member 0: primary $a_ADDR epoch [1-9][0-9]*" "$TMP/t$s" &&
    ok "stats on $s: the line of the primary of member 0" ||
    bad "stats on $s: the line of the primary of member 0" "$(cat "$TMP/t$s")"
  timeout 10 "$CLI" --servers "$(eval echo "\$${s}_ADDR")" tables >"$TMP/t$s" 2>&1
  cp "$TMP/t$s" "$TMP/ttables"
  grep -qx "member 0: primary $a_ADDR epoch [1-9][0-9]*" "$TMP/t$s" &&
    ok "tables on $s: the line of the primary of member 0" ||
    bad "tables on $s: the line of the primary of member 0" "$(cat "$TMP/t$s")"
done

# --help (and so the man page, made from it) says what those lines are:
# the form each of stats and tables gives matches the lines printed above
"$CLI" --help >"$TMP/help.raw"
tr -s ' \n' ' ' <"$TMP/help.raw" >"$TMP/help"
form="member I: primary H:P epoch E"
re='^ *member [0-9]+: primary [^ ]+ epoch [0-9]+$'
for c in stats tables; do
  awk -v c="$c" '/^  [a-z]/ { on = $1 == c } on' "$TMP/help.raw" |
    tr -s ' \n' ' ' >"$TMP/help.$c"
  grep -qF "'$form' (or 'no primary (an election is on)')" "$TMP/help.$c" &&
    grep -qE "$re" "$TMP/t$c" &&
    ok "embps --help: $c's '$form' lines, as printed" ||
    bad "embps --help: $c's '$form' lines, as printed" "$(cat "$TMP/help.$c")"
done
grep -qF '"members": [{"member": I, "primary": "H:P" or null, "epoch": E}, ...]' "$TMP/help" &&
  grep -qF '"primary" and "epoch" in each entry of a table'"'"'s "servers"' "$TMP/help" &&
  ok "embps --help: the --json forms of the member lines" ||
  bad "embps --help: the --json forms of the member lines"
timeout 30 "$CLI" --servers "$b_ADDR" promote >"$TMP/out" 2>&1 &&
  bad "promote by hand refused" ||
  { grep -q "elected in etcd" "$TMP/out" && ok "promote by hand refused" ||
      bad "promote by hand refused" "$(cat "$TMP/out")"; }
curl -s "$MA/metrics" >"$TMP/ma"
curl -s "$MB/metrics" >"$TMP/mb"
check "promtool check metrics (primary)" promtool check metrics <"$TMP/ma"
check "promtool check metrics (follower)" promtool check metrics <"$TMP/mb"
check "README's metrics table: every series a coordinated primary and follower export" \
  python3 "$(dirname "$0")/metrics_documented.py" \
  "$(dirname "$0")/../../README.md" "$TMP/ma" "$TMP/mb"
m() { awk -v k="$2" '$1 == k {print $2}' "$1"; }
[ "$(m "$TMP/ma" 'embps_coord_role{role="primary"}')" = 1 ] &&
  ok "a: embps_coord_role primary" || bad "a: embps_coord_role primary"
[ "$(m "$TMP/mb" 'embps_coord_role{role="follower"}')" = 1 ] &&
  ok "b: embps_coord_role follower" || bad "b: embps_coord_role follower"
[ "$(m "$TMP/ma" embps_coord_failovers_total)" = 1 ] &&
  ok "a: one election won" || bad "a: one election won"
fence=$(m "$TMP/ma" embps_coord_write_fence_seconds)
python3 -c "import sys; f = float(sys.argv[1]); assert 0 < f <= $LEASE / 1000" \
  "$fence" 2>/dev/null && ok "a: write fence $fence s within the lease" ||
  bad "a: write fence within the lease" "got '$fence'"
[ "$(m "$TMP/mb" embps_coord_write_fence_seconds)" = 0.000 ] &&
  ok "b: no write fence" || bad "b: no write fence"
# every server shows the primary of every member it knows (one member
# here); the coordinator reads the slot's key again within a renewal period
# of a change, so each scrape is polled for up to a lease
member_series() { # URL WANT: 0 once /metrics' series is WANT, else 1 (got)
  for _ in $(seq 1 300); do
    got=$(curl -s "$1/metrics" | grep '^embps_member_primary_epoch')
    [ "$got" = "$2" ] && return 0
    sleep 0.01
  done
  return 1
}
epoch=$(m "$TMP/ma" embps_coord_epoch)
for s in a b; do
  want="embps_member_primary_epoch{member=\"0\",primary=\"$a_ADDR\"} $epoch"
  member_series "$(eval echo "\$M${s^^}")" "$want" &&
    ok "$s: embps_member_primary_epoch names a, epoch $epoch" ||
    bad "$s: embps_member_primary_epoch names a, epoch $epoch" "got '$got'"
done
r=$(m "$TMP/ma" embps_coord_lease_renewals_total)
[ -n "$r" ] && [ "$r" -ge 1 ] && ok "a: lease renewed ($r)" ||
  bad "a: lease renewed" "got '$r'"

# a stops: it gives its lease back, and b is elected at once
t0=$(date +%s%N)
stop a
for _ in $(seq 1 1000); do
  timeout 10 "$CLI" --servers "$b_ADDR" stats --json >"$TMP/sb" 2>/dev/null &&
    python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))[0]["role"] == 0' \
      "$TMP/sb" 2>/dev/null && break
  sleep 0.01
done
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$ms" -lt "$LEASE" ] && ok "b elected ${ms} ms after a stopped (lease $LEASE ms)" ||
  bad "b elected before a's lease would have ended" "${ms} ms; $(tail -5 "$TMP/b.log")"
curl -s "$MB/metrics" >"$TMP/mb"
[ "$(m "$TMP/mb" 'embps_coord_role{role="primary"}')" = 1 ] &&
  ok "b: embps_coord_role primary" || bad "b: embps_coord_role primary"
[ "$(m "$TMP/mb" embps_coord_failovers_total)" = 1 ] &&
  ok "b: one election won" || bad "b: one election won"
check "promtool check metrics (b, primary now)" promtool check metrics <"$TMP/mb"
epoch=$(m "$TMP/mb" embps_coord_epoch)
member_series "$MB" \
  "embps_member_primary_epoch{member=\"0\",primary=\"$b_ADDR\"} $epoch" &&
  ok "b: embps_member_primary_epoch names b, epoch $epoch, after the failover" ||
  bad "b: embps_member_primary_epoch names b after the failover" "got '$got'"
stop b
finish
