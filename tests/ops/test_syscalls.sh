#!/usr/bin/env bash
# test_syscalls.sh SERVER CLI UNIT - what the systemd unit's hardening
# allows, against what the server really does: the server runs under
# strace through a workload that touches every subsystem (a push storm with
# two OpenMP apply threads, pulls, a dynamic table, periodic checkpoints,
# O_DIRECT table files of more than 64 MiB, madvise(MADV_HUGEPAGE) of a
# large array, setrlimit of RLIMIT_NOFILE, the metrics endpoint, sd_notify,
# SIGTERM's final checkpoint, then a restart that restores it all), and the
# trace must show
#   - every system call allowed by the unit's SystemCallFilter= lines
#     (groups expanded by systemd-analyze);
#   - no memory both writable and executable, no mprotect to executable
#     (MemoryDenyWriteExecute=yes);
#   - sockets of RestrictAddressFamilies= only;
#   - no /proc file but the process's own (ProcSubset=pid, ProtectProc);
#   - no realtime scheduling, clock, hostname or kernel log calls
#     (RestrictRealtime, ProtectClock, ProtectHostname, ProtectKernelLogs).
# Needs strace and systemd-analyze (exit 77 otherwise).
set -u
[ $# -eq 3 ] || { echo "usage: $0 SERVER CLI UNIT" >&2; exit 2; }
REAL_SERVER=$1
CLI=$2
UNIT=$3
for t in strace systemd-analyze curl pgrep; do
  command -v $t >/dev/null || { echo "skipped: needs $t"; exit 77; }
done
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3

export NOTIFY_SOCKET=@embps-syscalls-test-$$ # nobody listens: sent anyway
DATA=$TMP/data

# traced N: the server under strace (trace in $TMP/trace.N), until it is
# listening; sets SPID (the server: strace's child) and ADDR
traced() {
  local n=$1
  rm -f "$TMP/port" "$TMP/mport"
  strace -f -q -s 64 -o "$TMP/trace.$n" "$REAL_SERVER" --listen 127.0.0.1:0 \
    --port-file "$TMP/port" --data-dir "$DATA" --omp-threads 2 \
    --checkpoint-every 1 --metrics-listen 127.0.0.1:0 \
    --metrics-port-file "$TMP/mport" >"$TMP/s$n.log" 2>&1 &
  TPID=$!
  SERVER_PIDS+=("$TPID")
  for _ in $(seq 1 2000); do
    [ -s "$TMP/port" ] && [ -s "$TMP/mport" ] && break
    kill -0 "$TPID" 2>/dev/null || break
    sleep 0.01
  done
  SPID=$(pgrep -P "$TPID" | head -1)
  if [ ! -s "$TMP/port" ] || [ -z "$SPID" ]; then
    bad "server $n starts under strace" "$(cat "$TMP/s$n.log")"
    finish
  fi
  SERVER_PIDS+=("$SPID")
  ADDR=127.0.0.1:$(cat "$TMP/port")
  M=http://127.0.0.1:$(cat "$TMP/mport")
}
# untrace N: SIGTERM to the server; it must exit 0 within 60 s (strace
# records the status)
untrace() {
  kill -TERM "$SPID"
  timeout 60 tail --pid="$TPID" -f /dev/null
  if grep -q "^$SPID  *+++ exited with 0 +++" "$TMP/trace.$1"; then
    ok "server $1 exits 0 on SIGTERM under strace"
  else
    bad "server $1 exits 0 on SIGTERM under strace" "$(tail -3 "$TMP/trace.$1")" \
      "$(tail -5 "$TMP/s$1.log")"
    kill -9 "$SPID" "$TPID" 2>/dev/null
  fi
  wait "$TPID" 2>/dev/null
}

traced 1
c() { timeout 120 "$CLI" --servers "$ADDR" "$@"; }
# ~340k distinct rows of 400k x dim 64 (f32, sgd): a ~90 MB table file, past
# the 64 MiB from which checkpoints write and restores read with O_DIRECT
if c bench --rows 400000 --dim 64 --optimizer sgd --seconds 2 --mode both \
     --batch 65536 --batches 12 --zipf 0 \
     --workers 2 >"$TMP/bench" 2>&1 &&
   c create-table dyn --dim 8 --dynamic --max-rows 1000 --evict lru \
     >"$TMP/out" 2>&1 &&
   c push dyn --indices 1,2,3 --values 1,1,1,1,1,1,1,1,2,2,2,2,2,2,2,2,3,3,3,3,3,3,3,3 \
     >>"$TMP/out" 2>&1 &&
   c pull dyn --ids 1,2 >>"$TMP/out" 2>&1 && c checkpoint >>"$TMP/out" 2>&1 &&
   curl -sf "$M/metrics" >/dev/null && curl -sf "$M/readyz" >/dev/null; then
  ok "workload under strace: bench, dynamic table, checkpoint, metrics"
else
  bad "workload under strace" "$(tail -5 "$TMP/bench")" "$(cat "$TMP/out")" \
    "$(tail -5 "$TMP/s1.log")"
fi
untrace 1
traced 2
grep -q 'restored checkpoint' "$TMP/s2.log" &&
  ok "restart restores the data dir under strace" ||
  bad "restart restores the data dir under strace" "$(cat "$TMP/s2.log")"
untrace 2
grep -q 'open.*O_WRONLY.*O_DIRECT' "$TMP/trace.1" &&
  grep -q 'open.*O_RDONLY.*O_DIRECT' "$TMP/trace.2" &&
  ok "the traces include O_DIRECT writes and reads" ||
  bad "the traces include O_DIRECT writes and reads"
grep -q 'MADV_HUGEPAGE' "$TMP/trace.1" &&
  ok "the traces include madvise(MADV_HUGEPAGE)" ||
  bad "the traces include madvise(MADV_HUGEPAGE)"

systemd-analyze syscall-filter >"$TMP/groups" 2>/dev/null
check "every system call, memory map, socket and /proc file is allowed by $(basename "$UNIT")" \
  $PY - "$UNIT" "$TMP/groups" "$TMP/trace.1" "$TMP/trace.2" <<'PY'
import re, sys
unit, groups_file, traces = sys.argv[1], sys.argv[2], sys.argv[3:]

groups, cur = {}, None
for line in open(groups_file):
    if line.startswith("@"):
        cur = groups.setdefault(line.strip(), set())
    elif cur is not None and line.startswith("    ") and \
            not line.strip().startswith("#") and line.strip():
        cur.add(line.strip())
    elif not line.strip() or line.startswith("#"):
        cur = None

def expand(item, seen=()):
    if not item.startswith("@"):
        return {item}
    out = set()
    for x in groups[item]:
        if x not in seen:
            out |= expand(x, seen + (item,))
    return out

settings = {}
for line in open(unit):
    m = re.match(r"^(\w+)=(.*)$", line.strip())
    if m:
        settings.setdefault(m.group(1), []).append(m.group(2))
allowed, denied = set(), set()
for v in settings["SystemCallFilter"]:
    deny = v.startswith("~")
    names = set().union(*(expand(x) for x in v.lstrip("~").split()))
    (denied if deny else allowed).update(names)
allowed -= denied
families = set(settings["RestrictAddressFamilies"][0].split())
for k, want in (("MemoryDenyWriteExecute", "yes"), ("ProcSubset", "pid"),
                ("ProtectProc", "invisible"), ("RestrictRealtime", "yes"),
                ("ProtectClock", "yes"), ("ProtectHostname", "yes"),
                ("ProtectKernelLogs", "yes")):
    assert settings.get(k) == [want], (k, settings.get(k))

call = re.compile(r"^\d+\s+(?:<\.\.\. )?(\w+)(?:\(| resumed>)")
used, problems = {}, []
for t in traces:
    for line in open(t):
        m = call.match(line)
        if not m:
            continue
        name = m.group(1)
        used[name] = used.get(name, 0) + 1
        if name in ("mmap", "mprotect", "pkey_mprotect") and "PROT_EXEC" in line:
            if name != "mmap" or "PROT_WRITE" in line:
                problems.append("writable+executable memory: " + line.strip())
        fam = re.search(r"socket(?:pair)?\((AF_\w+)", line)
        if fam and fam.group(1) not in families:
            problems.append("address family %s: %s" % (fam.group(1), line.strip()))
        for p in re.findall(r'"(/proc/[^"]*)"', line):
            if not re.match(r"/proc/(self|thread-self|\d+)(/|$)", p):
                problems.append("/proc beyond the process's own: " + line.strip())
        if name in ("sched_setscheduler", "sched_setattr") and \
                re.search(r"SCHED_(FIFO|RR|DEADLINE)", line):
            problems.append("realtime scheduling: " + line.strip())
        if name in ("clock_settime", "clock_adjtime", "adjtimex",
                    "settimeofday", "sethostname", "setdomainname", "syslog"):
            problems.append("forbidden by the unit: " + line.strip())
for name in sorted(used):
    if name not in allowed:
        problems.append("%s (%d calls) is not in SystemCallFilter" % (name, used[name]))
print("%d distinct system calls, %d calls" % (len(used), sum(used.values())))
for p in problems[:40]:
    print(p)
sys.exit(1 if problems else 0)
PY
finish
