#!/usr/bin/env bash
# test_flags.sh SERVER CLI - the two programs' command lines as a user
# meets them. Every flag a --help lists is one the parser takes (the
# server's with --version after it, so nothing starts; the CLI's, global
# and per command, against a closed port, since flags are checked before
# connecting); the CLI's --help lists every bench flag and names only
# commands that exist; both value forms, --flag value and --flag=value,
# reach a real server (server flags, create-table, push, pull, bench); bad
# values and unknown flags exit 2 naming them.
set -u
[ $# -eq 2 ] || { echo "usage: $0 SERVER CLI" >&2; exit 2; }
SERVER=$1
CLI=$2
. "$(dirname "$0")/lib.sh"
NOWHERE=127.0.0.1:1 # nothing listens there

# listed HELP INDENT: "--flag ARG" of each line of HELP that starts with
# INDENT spaces then "--" (ARG follows one space; the help, two or more)
listed() {
  awk -v ind="$2" 'match($0, "^" sprintf("%" ind "s", "") "--[a-z0-9-]+( [^ ]+)?") {
                     n = split(substr($0, 1, RLENGTH), f, " ")
                     print f[1], (n > 1 ? f[2] : "") }' "$1"
}
# a value for a flag whose --help names its value ARG: the first of a
# choice, an address, or 1
value_for() {
  case "$1" in
    *"|"*) echo "${1%%|*}" ;;
    HOST:PORT) echo 127.0.0.1:0 ;;
    *) echo 1 ;;
  esac
}

# ------------------------------------------------------------ server
"$SERVER" --help >"$TMP/server.help" || bad "embps-server --help exits 0"
unknown=""
n=0
while read -r flag arg; do
  n=$((n + 1))
  v=$(value_for "$arg")
  "$SERVER" "$flag" ${arg:+"$v"} --version >"$TMP/out" 2>&1
  grep -q "unknown option" "$TMP/out" && unknown="$unknown $flag"
done < <(listed "$TMP/server.help" 2)
[ "$n" -ge 27 ] && [ -z "$unknown" ] &&
  ok "embps-server: all $n flags of --help parse" ||
  bad "embps-server: every flag of --help parses" "$n listed; unknown:$unknown"
k=0
for form in "--shards 8 --io-threads 1" "--shards=8 --io-threads=1"; do
  k=$((k + 1))
  # shellcheck disable=SC2086
  start "s$k" $form
  addr=s${k}_ADDR
  timeout 30 "$CLI" --servers "${!addr}" stats --json >"$TMP/stats" 2>&1
  grep -q '"io_threads": 1, "shards": 8' "$TMP/stats" &&
    ok "embps-server $form: the server serves with them" ||
    bad "embps-server $form: the server serves with them" "$(cat "$TMP/stats")"
  stop "s$k"
done
"$SERVER" --shards=0 >"$TMP/out" 2>&1
st=$?
[ "$st" -eq 2 ] && grep -q -- '--shards "0" is not a number in \[1, 4096\]' "$TMP/out" &&
  ok "embps-server --shards=0: exit 2 naming the flag and its range" ||
  bad "embps-server --shards=0: exit 2 naming the flag and its range" "exit $st" "$(cat "$TMP/out")"
"$SERVER" --shard 8 >"$TMP/out" 2>&1
st=$?
[ "$st" -eq 2 ] && grep -q -- 'unknown option --shard (see --help)' "$TMP/out" &&
  ok "embps-server --shard (an abbreviation): unknown, exit 2" ||
  bad "embps-server --shard (an abbreviation): unknown, exit 2" "exit $st" "$(cat "$TMP/out")"

# ------------------------------------------------------------ CLI
"$CLI" --help >"$TMP/cli.help" || bad "embps --help exits 0"
if grep -qw describe "$TMP/cli.help"; then
  bad "embps --help names no describe command" "$(grep -w describe "$TMP/cli.help")"
else
  ok "embps --help names no describe command"
fi
# the commands it lists all exist: none is an unknown command
missing=""
for cmd in $(awk '/^  [a-z]/ { print $1 }' "$TMP/cli.help"); do
  timeout 30 "$CLI" --servers "$NOWHERE" "$cmd" t >"$TMP/out" 2>&1
  grep -q "unknown command" "$TMP/out" && missing="$missing $cmd"
done
[ -z "$missing" ] && ok "embps --help lists only commands that exist" ||
  bad "embps --help lists only commands that exist" "unknown:$missing"
bench_flags=$(awk '/^  bench/ { b = 1; next } b && /^  [a-z]/ { b = 0 }
                   b && /^    --/ { print $1 }' "$TMP/cli.help" | sort | tr '\n' ' ')
want="--admit-after --admit-probability --admit-sketch-bytes --batch --batches --depth --dim --dynamic --evict --evict-l2-below --json --keep --max-rows --mode --no-prefill --optimizer --rows --seconds --table --ttl-steps --unique --warmup --workers --zipf "
[ "$bench_flags" = "$want" ] && ok "embps --help lists every bench flag" ||
  bad "embps --help lists every bench flag" "got:  $bench_flags" "want: $want"
# every flag it lists parses: global ones before a command, the others
# after their command (and a table NAME when the command takes one)
unknown=""
n=0
while read -r flag arg; do
  n=$((n + 1))
  v=$(value_for "$arg")
  timeout 30 "$CLI" --servers "$NOWHERE" --retry-ms 0 "$flag" ${arg:+"$v"} \
    tables >"$TMP/out" 2>&1
  grep -q "unknown option" "$TMP/out" && unknown="$unknown $flag"
done < <(listed "$TMP/cli.help" 2 | grep -v -e '^--help' -e '^--version')
# a command's flags: one level in, under it
awk '/^  [a-z]/ { cmd = $1; name = ($2 == "NAME") }
     match($0, /^    --[a-z0-9-]+( [^ ]+)?/) {
       n = split(substr($0, 1, RLENGTH), f, " ")
       print cmd, (name ? "t" : "-"), f[1], (n > 1 ? f[2] : "") }' \
  "$TMP/cli.help" >"$TMP/cmd.flags"
while read -r cmd name flag arg; do
  n=$((n + 1))
  v=$(value_for "$arg")
  [ "$name" = - ] && name=""
  timeout 30 "$CLI" --servers "$NOWHERE" --retry-ms 0 "$cmd" $name "$flag" \
    ${arg:+"$v"} >"$TMP/out" 2>&1
  grep -q "unknown option" "$TMP/out" && unknown="$unknown $cmd$flag"
done <"$TMP/cmd.flags"
[ "$n" -ge 80 ] && [ -z "$unknown" ] && ok "embps: all $n flags of --help parse" ||
  bad "embps: every flag of --help parses" "$n listed; unknown:$unknown"

start c --io-threads 1
c() { timeout 60 "$CLI" --servers "$c_ADDR" "$@"; }
check "create-table with --flag=value" c create-table t --dim=3 --rows=10 \
  --optimizer=adam --lr=0.5 --beta1 0.8
c tables --json >"$TMP/out" 2>&1
python3 - "$TMP/out" <<'PY' && ok "the table has the flags' spec" || bad "the table has the flags' spec" "$(cat "$TMP/out")"
import json, sys
t = json.load(open(sys.argv[1]))[0]
assert (t["name"], t["dim"], t["rows"], t["optimizer"], t["lr"]) == ("t", 3, 10, "adam", 0.5), t
PY
check "push with --indices=... --values=..." c push t --indices=2,2 --values=1,1,1,1,1,1
c pull t --ids=2 >"$TMP/out" 2>&1
[ "$(cut -f1 "$TMP/out")" = 2 ] && [ "$(cut -f2 "$TMP/out")" != "0 0 0" ] &&
  ok "pull --ids=2: the pushed row" || bad "pull --ids=2: the pushed row" "$(cat "$TMP/out")"
c create-table u --dim=x --rows 1 >"$TMP/out" 2>&1
st=$?
[ "$st" -eq 2 ] && grep -q -- '--dim "x" is not a dimension' "$TMP/out" &&
  ok "create-table --dim=x: exit 2 naming the flag" ||
  bad "create-table --dim=x: exit 2 naming the flag" "exit $st" "$(cat "$TMP/out")"
c tables --jsn >"$TMP/out" 2>&1
st=$?
[ "$st" -eq 2 ] && grep -q -- 'unknown option --jsn for tables' "$TMP/out" &&
  ok "tables --jsn: exit 2, unknown option for tables" ||
  bad "tables --jsn: exit 2, unknown option for tables" "exit $st" "$(cat "$TMP/out")"
c push t --indices 1,x --values 1,2,3 >"$TMP/out" 2>&1
st=$?
[ "$st" -eq 2 ] && grep -q -- '--indices: item "x" is not an integer id' "$TMP/out" &&
  ok "push --indices 1,x: exit 2 naming the flag and the item" ||
  bad "push --indices 1,x: exit 2 naming the flag and the item" "exit $st" "$(cat "$TMP/out")"
c bench --seconds=0.2 --warmup=0 --rows=1000 --batch=64 --dim=4 --batches 2 \
  --mode=push --table=b1 --json >"$TMP/out" 2>&1
python3 - "$TMP/out" <<'PY' && ok "bench --flag=value: the run has them" || bad "bench --flag=value: the run has them" "$(cat "$TMP/out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert (r["rows"], r["batch"], r["dim"], r["batches"], r["dynamic"]) == (1000, 64, 4, 2, False), r
assert r["push_requests"] > 0 and r["pull_requests"] == 0, r
PY
c bench --seconds 0.2 --warmup 0 --rows 1000 --batch 64 --dim 4 --mode push \
  --table b2 --admit-after=2 --json >"$TMP/out" 2>&1
python3 - "$TMP/out" <<'PY' && ok "bench --admit-after=2: a dynamic table with admission" || bad "bench --admit-after=2: a dynamic table with admission" "$(cat "$TMP/out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["dynamic"] is True and r["admit_after"] == 2, r
PY
stop c
finish
