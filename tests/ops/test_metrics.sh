#!/usr/bin/env bash
# test_metrics.sh SERVER CLI - the --metrics-listen endpoint of a real
# server: exact figures after known pushes, pulls and refusals, promtool's
# check of the exposition, /healthz, /readyz, unknown paths and methods;
# request kinds by name; the process_* figures against /proc and the
# clock; the memory limits (a cgroup's from a fake tree); the data dir's
# disk; every series exported a row of README.md's metrics table;
# --log-format json; the rate-limited log of refused connections.
set -u
[ $# -eq 2 ] || { echo "usage: $0 SERVER CLI" >&2; exit 2; }
SERVER=$1
CLI=$2
. "$(dirname "$0")/lib.sh"
command -v promtool >/dev/null || { echo "promtool missing (apt-get install prometheus)"; exit 1; }

started=$(date +%s)
start s --metrics-listen 127.0.0.1:0 --metrics-port-file "$TMP/mport" \
  --log-format json --max-connections 3
M=http://127.0.0.1:$(cat "$TMP/mport")
c() { timeout 30 "$CLI" --servers "$s_ADDR" "$@"; }

code() { curl -s -o "$TMP/body" -w '%{http_code}' "$@"; }
[ "$(code "$M/healthz")" = 200 ] && ok "/healthz 200" || bad "/healthz 200"
[ "$(code "$M/readyz")" = 200 ] && ok "/readyz 200 once serving" || bad "/readyz 200 once serving"
[ "$(code "$M/nope")" = 404 ] && ok "unknown path 404" || bad "unknown path 404"
[ "$(code -X POST "$M/metrics")" = 405 ] && ok "POST 405" || bad "POST 405"

check "create emb" c create-table emb --dim 2 --rows 1000 --optimizer sgd --lr 1
check "create other" c create-table other --dim 3 --dynamic
# 5 rows with 2 duplicates (3 merged away... 3 unique: 1, 2, 9)
check "push 1" c push emb --indices 1,2,1,9,2 --values 1,1,1,1,1,1,1,1,1,1
check "push 2" c push emb --indices 4 --values 0.5,0.5
check "push other" c push other --indices 77,77 --values 1,1,1,1,1,1
check "pull" c pull emb --ids 1,2,9,4
check "pull again" c pull emb --ids 1
c pull emb --ids 5000 >/dev/null 2>&1 && bad "out of range pull refused" || ok "out of range pull refused"
c pull nosuch --ids 1 >/dev/null 2>&1 && bad "unknown table refused" || ok "unknown table refused"
c evict nosuch >/dev/null 2>&1 && bad "evict of an unknown table refused" ||
  ok "evict of an unknown table refused"
# admission and eviction: 5 and 6 admitted by their 2nd push, 7 pending,
# 5 and 6 expired one step later and evicted (the sweep or `evict`)
check "create dyn" c create-table dyn --dim 1 --dynamic --admit-after 2 \
  --ttl-steps 1 --max-rows 100
check "push dyn 1" c push dyn --indices 5,6 --values 1,1
check "push dyn 2" c push dyn --indices 5,6 --values 1,1
check "push dyn 3" c push dyn --indices 7 --values 1
check "evict dyn" c evict dyn
c stats --json >"$TMP/stats" 2>&1
check "stats: 2 errors (ERANGE, evict nosuch; not the DESCRIBE probes)" \
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); assert s[0]["errors"] == 2, s' "$TMP/stats"

if [ "$(code "$M/metrics")" = 200 ]; then ok "/metrics 200"; else bad "/metrics 200"; fi
cp "$TMP/body" "$TMP/metrics"
curl -s -D "$TMP/headers" -o /dev/null "$M/metrics"
grep -qi '^content-type: text/plain; version=0.0.4' "$TMP/headers" &&
  ok "exposition content type" || bad "exposition content type" "$(cat "$TMP/headers")"
check "promtool check metrics" promtool check metrics <"$TMP/metrics"

# metric LINE: the value of the sample whose name and labels are LINE
metric() { awk -v k="$1" '$1 == k {print $2}' "$TMP/metrics"; }
expect() {
  local got
  got=$(metric "$1")
  [ "$got" = "$2" ] && ok "$1 = $2" || bad "$1 = $2" "got '$got'"
}
expect 'embps_table_rows_total{table="emb",op="push"}' 6
expect 'embps_push_merged_duplicates_total{table="emb"}' 2
expect 'embps_push_merged_duplicates_total{table="other"}' 1
expect 'embps_table_requests_total{table="emb",op="push"}' 2
expect 'embps_table_requests_total{table="emb",op="pull"}' 2
expect 'embps_table_rows_total{table="emb",op="pull"}' 5
expect 'embps_table_rows{table="emb"}' 4
expect 'embps_table_rows{table="other"}' 1
expect 'embps_table_dim{table="other"}' 3
expect 'embps_errors_total{code="EMBPS_ERANGE",table="emb"}' 1
# create-table (to create a table everywhere or nowhere) and the pull of
# "nosuch" (for its dim) first describe the table: those ENOTABLE answers
# are no errors; the evict of "nosuch" is one
expect 'embps_errors_total{code="EMBPS_ENOTABLE",table=""}' 1
expect 'embps_table_rows_admitted_total{table="dyn"}' 2
expect 'embps_table_rows_pending{table="dyn"}' 1
expect 'embps_table_rows_evicted_total{table="dyn",reason="ttl"}' 2
expect 'embps_table_rows_evicted_total{table="dyn",reason="capacity"}' 0
expect 'embps_table_rows_evicted_total{table="dyn",reason="l2"}' 0
expect 'embps_table_capacity_rows{table="dyn"}' 100
expect 'embps_table_rows{table="dyn"}' 0
expect 'embps_requests_total{kind="push"}' 6  # 3, and 3 to dyn
expect 'embps_request_duration_seconds_count{op="push"}' 6
expect 'embps_request_duration_seconds_count{op="pull"}' 2
expect 'embps_request_duration_seconds_bucket{op="pull",le="+Inf"}' 2
expect 'embps_apply_queue_depth' 0
expect 'embps_connections' 0
expect 'embps_ready' 1
expect 'embps_requests_total{kind="evict"}' 2
expect 'embps_requests_total{kind="stats"}' 1
grep -q '^embps_requests_total{kind="[0-9]' "$TMP/metrics" &&
  bad "request kinds by name" "$(grep '^embps_requests_total' "$TMP/metrics")" ||
  ok "request kinds by name, none by number"
expect 'embps_max_memory_bytes' 0
check "process_*: resident memory, CPU, descriptors, start time" python3 - \
  "$TMP/metrics" "$s_PID" "$started" <<'PY'
import os, sys, time
m = {l.split()[0]: float(l.split()[1]) for l in open(sys.argv[1])
     if l.strip() and not l.startswith("#")}
pid, started = sys.argv[2], int(sys.argv[3])
rss = int(open("/proc/%s/statm" % pid).read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
assert 0.5 * rss < m["process_resident_memory_bytes"] < 2 * rss, (m, rss)
assert m["process_virtual_memory_bytes"] >= m["process_resident_memory_bytes"], m
assert m["process_cpu_seconds_total"] > 0, m
fds = len(os.listdir("/proc/%s/fd" % pid))
assert abs(m["process_open_fds"] - fds) <= 3, (m["process_open_fds"], fds)
limit = [l for l in open("/proc/%s/limits" % pid) if l.startswith("Max open files")][0]
assert m["process_max_fds"] == float(limit.split()[3]), (m["process_max_fds"], limit)
assert started - 2 <= m["process_start_time_seconds"] <= time.time(), \
    (m["process_start_time_seconds"], started)
for t in ("apply", "io-0", "io-1"):
    assert 'embps_thread_stall_seconds{thread="%s"}' % t in m, (t, m.keys())
PY
bytes=$(metric 'embps_table_bytes{table="emb"}')
[ -n "$bytes" ] && [ "$bytes" -ge 32 ] && ok "embps_table_bytes emb = $bytes" ||
  bad "embps_table_bytes emb >= 4 rows x 8 bytes" "got '$bytes'"

# --max-connections 3: hold 3 (after a hello: connections without one
# would be closed to make room), then 20 more are refused; one log line
python3 - "$s_ADDR" >"$TMP/py" 2>&1 <<'PY'
import socket, struct, sys, time
host, port = sys.argv[1].rsplit(":", 1)
# HELLO{version: 1}: 16-byte header, 2 bytes of protobuf padded to 8
hello = struct.pack("<IIIHH", 8, 2, 1, 1, 0x5045) + b"\x08\x01" + bytes(6)
held = []
for _ in range(3):
    s = socket.create_connection((host, int(port)))
    s.sendall(hello)
    s.settimeout(5)
    s.recv(4096)  # the hello reply
    held.append(s)
time.sleep(0.3)
for _ in range(20):
    s = socket.create_connection((host, int(port)))
    s.settimeout(5)
    s.recv(4096)  # the ELIMIT error frame, then the close
    s.close()
for s in held:
    s.close()
PY
[ $? -eq 0 ] && ok "20 connections past the limit refused" || bad "connections refused" "$(cat "$TMP/py")"
curl -s "$M/metrics" >"$TMP/metrics"
expect 'embps_connections_refused_total' 20
lines=$(grep -c 'max-connections' "$TMP/s.log")
[ "$lines" -ge 1 ] && [ "$lines" -le 2 ] && ok "refusals logged at most once a second ($lines line(s))" ||
  bad "refusals logged at most once a second" "$lines lines"

# every log line is one JSON object; the ready line has "event":"ready"
kill -TERM "$s_PID"
wait "$s_PID"
st=$?
[ "$st" -eq 0 ] && ok "SIGTERM: exit 0" || bad "SIGTERM: exit 0" "status $st"
check "--log-format json: every line is a JSON object" python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines, "no log"
docs = [json.loads(l) for l in lines]
assert all({"ts", "level", "msg"} <= d.keys() for d in docs), docs
assert any(d.get("event") == "ready" and "ready on" in d["msg"] for d in docs), docs
' "$TMP/s.log"

# a cluster of 2: --member I asks one member; members' figures add up
start m0 --cluster-size 2 --cluster-index 0
start m1 --cluster-size 2 --cluster-index 1
C="$m0_ADDR,$m1_ADDR"
cc() { timeout 30 "$CLI" --servers "$C" "$@"; }
check "cluster: create" cc create-table d --dim 1 --dynamic
check "cluster: push 40 ids" cc push d --indices "$(seq -s, 1 40)" --values "$(seq -s, 1 40)"
for i in 0 1; do
  cc --member $i stats --json >"$TMP/st$i" 2>"$TMP/err" || bad "--member $i stats" "$(cat "$TMP/err")"
  cc --member $i tables >"$TMP/tb$i" 2>"$TMP/err" || bad "--member $i tables" "$(cat "$TMP/err")"
done
check "--member I stats: one server, slot I, rows adding up to 40" python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert len(a) == 1 and len(b) == 1, (a, b)
assert a[0]["cluster_index"] == 0 and b[0]["cluster_index"] == 1, (a, b)
r = [x[0]["tables"][0]["rows_allocated"] for x in (a, b)]
assert all(r) and sum(r) == 40, r
' "$TMP/st0" "$TMP/st1"
r0=$(awk '$1 == "d" {print $6}' "$TMP/tb0")
r1=$(awk '$1 == "d" {print $6}' "$TMP/tb1")
[ -n "$r0" ] && [ -n "$r1" ] && [ $((r0 + r1)) -eq 40 ] && [ "$r0" -ne 40 ] &&
  ok "--member I tables: this member's rows ($r0 + $r1)" ||
  bad "--member I tables: this member's rows" "$(cat "$TMP/tb0" "$TMP/tb1")"
cc --member 2 stats >"$TMP/out" 2>&1 && bad "--member past the list refused" ||
  { grep -q "member 2" "$TMP/out" && ok "--member past the list refused" ||
    bad "--member past the list refused" "$(cat "$TMP/out")"; }
stop m0
stop m1

# --data-dir: /healthz answers and /readyz says 503 while the restore runs
# (slowed down for the test), 200 once the server is ready; checkpoint and
# log figures are exposed
start d --data-dir "$TMP/data" --metrics-listen 127.0.0.1:0 \
  --metrics-port-file "$TMP/dport"
cd_() { timeout 30 "$CLI" --servers "$d_ADDR" "$@"; }
check "durable create" cd_ create-table dt --dim 2 --rows 100 --optimizer sgd
check "durable push" cd_ push dt --indices 1 --values 1,1
check "durable checkpoint" cd_ checkpoint
DM=http://127.0.0.1:$(cat "$TMP/dport")
code "$DM/metrics" >/dev/null
cp "$TMP/body" "$TMP/dmetrics"
check "promtool check metrics (--data-dir)" promtool check metrics <"$TMP/dmetrics"
lsn=$(awk '$1 == "embps_checkpoint_lsn" {print $2}' "$TMP/dmetrics")
[ -n "$lsn" ] && [ "$lsn" -ge 2 ] && ok "embps_checkpoint_lsn $lsn" ||
  bad "embps_checkpoint_lsn >= 2" "got '$lsn'"
grep -q '^embps_durability_failed 0$' "$TMP/dmetrics" &&
  ok "embps_durability_failed 0" || bad "embps_durability_failed 0"
check "the data dir's disk: free, size, reserve, log limit, refusals" \
  python3 - "$TMP/dmetrics" "$TMP/data" <<'PY'
import os, sys
m = {l.split()[0]: float(l.split()[1]) for l in open(sys.argv[1])
     if l.strip() and not l.startswith("#")}
st = os.statvfs(sys.argv[2])
assert m["embps_data_dir_size_bytes"] == st.f_blocks * st.f_frsize, m
assert abs(m["embps_data_dir_free_bytes"] - st.f_bavail * st.f_frsize) < 64 << 20, m
assert m["embps_checkpoint_reserve_bytes"] >= 64 << 10, m
limit = max(64 << 20, m["embps_checkpoint_bytes"])
limit = min(limit, m["embps_data_dir_size_bytes"] // 4)
assert m["embps_checkpoint_log_limit_bytes"] == limit, (m, limit)
assert m["embps_log_refused_total"] == 0, m
PY
stop d
# the memory limit of a cgroup (a fake tree): exported, and a quarter of
# it is the default --max-buffer-bytes, said at start
mkdir -p "$TMP/cg/proc/self" "$TMP/cg/sys/fs/cgroup"
echo "0::/" >"$TMP/cg/proc/self/cgroup"
echo "cpu memory" >"$TMP/cg/sys/fs/cgroup/cgroup.controllers"
echo 805306368 >"$TMP/cg/sys/fs/cgroup/memory.max"
EMBPS_TEST_CGROUP_ROOT=$TMP/cg start g --metrics-listen 127.0.0.1:0 \
  --metrics-port-file "$TMP/gport" --max-memory 512M
curl -s "http://127.0.0.1:$(cat "$TMP/gport")/metrics" >"$TMP/metrics"
expect 'embps_memory_limit_bytes' 805306368
expect 'embps_max_buffer_bytes' 201326592
expect 'embps_max_memory_bytes' 536870912
grep -q "max-buffer-bytes 201326592: a quarter of the cgroup's memory limit, 805306368 bytes ($TMP/cg/sys/fs/cgroup/memory.max)" "$TMP/g.log" &&
  ok "the budget's origin logged at start" || bad "the budget's origin logged at start" "$(cat "$TMP/g.log")"
stop g
# every series these servers export (a data dir, tables, a cgroup's limit)
# is a row of README.md's metrics table
check "README's metrics table: every exported series" \
  python3 "$(dirname "$0")/metrics_documented.py" \
  "$(dirname "$0")/../../README.md" "$TMP/dmetrics" "$TMP/metrics"
rm -f "$TMP/dport" "$TMP/d2.port"
EMBPS_TEST_RESTORE_DELAY_MS=3000 "$SERVER" --listen 127.0.0.1:0 \
  --port-file "$TMP/d2.port" --data-dir "$TMP/data" \
  --metrics-listen 127.0.0.1:0 --metrics-port-file "$TMP/dport" \
  >"$TMP/d2.log" 2>&1 &
d2_PID=$!
SERVER_PIDS+=("$d2_PID")
for _ in $(seq 1 500); do [ -s "$TMP/dport" ] && break; sleep 0.01; done
DM=http://127.0.0.1:$(cat "$TMP/dport")
[ ! -s "$TMP/d2.port" ] && [ "$(code "$DM/readyz")" = 503 ] &&
  ok "/readyz 503 while restoring" || bad "/readyz 503 while restoring"
[ "$(code "$DM/healthz")" = 200 ] && ok "/healthz 200 while restoring" ||
  bad "/healthz 200 while restoring"
for _ in $(seq 1 1000); do [ -s "$TMP/d2.port" ] && break; sleep 0.01; done
[ "$(code "$DM/readyz")" = 200 ] && ok "/readyz 200 once restored" ||
  bad "/readyz 200 once restored" "$(cat "$TMP/d2.log")"
d2_ADDR=127.0.0.1:$(cat "$TMP/d2.port")
timeout 30 "$CLI" --servers "$d2_ADDR" pull dt --ids 1 >"$TMP/out" 2>&1 &&
  grep -q -- "-0.0099999" "$TMP/out" && ok "restored row pulled" ||
  bad "restored row pulled" "$(cat "$TMP/out")"
stop d2

# bad values are refused by name
"$SERVER" --metrics-listen nonsense >"$TMP/out" 2>&1
grep -q -- '--metrics-listen' "$TMP/out" && ok "bad --metrics-listen refused" ||
  bad "bad --metrics-listen refused" "$(cat "$TMP/out")"
"$SERVER" --log-format xml >"$TMP/out" 2>&1
grep -q -- '--log-format' "$TMP/out" && ok "bad --log-format refused" ||
  bad "bad --log-format refused" "$(cat "$TMP/out")"
finish
