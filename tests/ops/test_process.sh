#!/usr/bin/env bash
# test_process.sh SERVER CLI - the daemon as a process. Started without
# OMP_WAIT_POLICY, it re-executes itself once with OMP_WAIT_POLICY=passive
# (main.c): the variable is in /proc/PID/environ, the OpenMP runtime itself
# reports the passive policy (libgomp: spin count 0; LLVM's libomp, the
# TSan build's: block time 0), and the PID the shell started is the one
# listening, with its name and command line. A policy set in the
# environment is kept. The apply runs a team of --omp-threads 2 (under
# ThreadSanitizer: with Archer active, so TSan checks the shards applied in
# parallel), whose threads park after a push (an idle server uses no CPU)
# and spin under the active policy.
set -u
[ $# -eq 2 ] || { echo "usage: $0 SERVER CLI" >&2; exit 2; }
SERVER=$1
CLI=$2
. "$(dirname "$0")/lib.sh"

# environ_has PID VAR=VALUE: the process's environment holds exactly that
environ_has() { tr '\0' '\n' <"/proc/$1/environ" | grep -qx -- "$2"; }
# omp_env LOG: the last block the OpenMP runtime printed for
# OMP_DISPLAY_ENV=verbose, one NAME='VALUE' a line (libgomp writes
# "  NAME = 'VALUE'", libomp "  [host] NAME='VALUE'")
omp_env() {
  awk '/OPENMP DISPLAY ENVIRONMENT BEGIN/ { n = 0; next }
       /OPENMP DISPLAY ENVIRONMENT END/ { last = block; next }
       { gsub(/\[host\]| /, ""); block = (n++ ? block "\n" : "") $0 }
       END { print last }' "$1"
}
# listens PID PORT: PID itself holds the socket listening on 127.0.0.1:PORT
listens() {
  python3 - "$@" <<'PY'
import os, sys
pid, port = sys.argv[1], int(sys.argv[2])
inodes = set()
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    f = line.split()
    if f[3] == "0A" and int(f[1].split(":")[1], 16) == port:
        inodes.add("socket:[%s]" % f[9])
fds = {os.readlink("/proc/%s/fd/%s" % (pid, fd))
       for fd in os.listdir("/proc/%s/fd" % pid)}
sys.exit(0 if inodes and inodes & fds else 1)
PY
}

# wait_log LOG TEXT: until LOG holds TEXT (10 s at most); 1 if it never does
wait_log() {
  for _ in $(seq 1 1000); do
    grep -qF -- "$2" "$1" && return 0
    sleep 0.01
  done
  return 1
}

[ -z "${OMP_WAIT_POLICY+set}" ] || { echo "lib.sh left OMP_WAIT_POLICY set" >&2; exit 1; }
OMP_DISPLAY_ENV=verbose ARCHER_OPTIONS=verbose=1 \
  start s --omp-threads 2 --io-threads 1
# the apply thread's first parallel region starts the runtime (libomp
# prints its environment then) and logs the team it got
wait_log "$TMP/s.log" "apply thread: OpenMP team of" &&
  grep -q "apply thread: OpenMP team of 2 threads" "$TMP/s.log" &&
  ok "the apply runs a team of 2 OpenMP threads" ||
  bad "the apply runs a team of 2 OpenMP threads" "$(cat "$TMP/s.log")"
environ_has "$s_PID" OMP_WAIT_POLICY=passive &&
  ok "started without a policy: OMP_WAIT_POLICY=passive in /proc/PID/environ" ||
  bad "started without a policy: OMP_WAIT_POLICY=passive in /proc/PID/environ" \
    "$(tr '\0' '\n' <"/proc/$s_PID/environ" | grep OMP_)"
omp_env "$TMP/s.log" >"$TMP/env"
if grep -qx "OMP_WAIT_POLICY='PASSIVE'" "$TMP/env" &&
   grep -qxE "GOMP_SPINCOUNT='0'|KMP_BLOCKTIME='0'" "$TMP/env"; then
  ok "the OpenMP runtime runs the passive policy ($(grep -E 'SPINCOUNT|BLOCKTIME' "$TMP/env"))"
else
  bad "the OpenMP runtime runs the passive policy (spin count or block time 0)" \
    "$(cat "$TMP/env")" "$(cat "$TMP/s.log")"
fi
[ "$(readlink "/proc/$s_PID/exe")" = "$(readlink -f "$SERVER")" ] &&
  listens "$s_PID" "${s_ADDR##*:}" &&
  ok "the PID the shell started is the server listening on ${s_ADDR##*:}" ||
  bad "the PID the shell started is the server listening on ${s_ADDR##*:}" \
    "$(ls -l "/proc/$s_PID/exe" "/proc/$s_PID/fd")"
comm=$(ps -o comm= -p "$s_PID")
[ "$comm" = embps-server ] && ok "ps -o comm shows embps-server" ||
  bad "ps -o comm shows embps-server" "comm: $comm"
args=$(ps -o args= -p "$s_PID")
case "$args" in
  "$SERVER --listen 127.0.0.1:0 --port-file "*" --omp-threads 2 --io-threads 1")
    ok "ps -o args shows the command line" ;;
  *) bad "ps -o args shows the command line" "args: $args" ;;
esac
if [ -n "${TSAN_OPTIONS:-}" ]; then # make test-tsan: libomp with Archer
  grep -q "Archer detected OpenMP application with TSan" "$TMP/s.log" &&
    ok "ThreadSanitizer: Archer is active in the server" ||
    bad "ThreadSanitizer: Archer is active in the server" "$(cat "$TMP/s.log")"
fi

# pushes wake the OpenMP team; afterwards its threads must sleep, not spin
c() { timeout 30 "$CLI" --servers "$s_ADDR" "$@"; }
check "create a table" c create-table t --dim 64 --rows 40000
python3 -c 'import struct, sys
n = 8192  # past table.c PARALLEL_MIN_ROWS: the push runs on the OpenMP team
open(sys.argv[1], "wb").write(struct.pack("<%dq" % n, *range(0, 4 * n, 4)))
open(sys.argv[2], "wb").write(struct.pack("<%df" % (n * 64), *[0.5] * (n * 64)))
' "$TMP/idx" "$TMP/vals"
for i in 1 2 3; do
  check "push $i (8192 rows)" c push t --indices-file "$TMP/idx" --values-file "$TMP/vals"
done
# its log shows why if not (under TSan: the report of a race in the apply)
kill -0 "$s_PID" 2>/dev/null && ok "the server runs on after the pushes" ||
  bad "the server runs on after the pushes" "$(cat "$TMP/s.log")"
# after_push ADDR PID: pushes, waits 0.3 s, then prints the server's CPU
# ticks over 1 s and the most samples (of 20, 50 ms apart) in which one and
# the same thread was running or runnable (state R). A spinning thread is R
# whatever the machine's load; a parked one sleeps (S), and a thread woken
# by a timer is R for a moment only.
after_push() {
  timeout 30 "$CLI" --servers "$1" push t --indices-file "$TMP/idx" \
    --values-file "$TMP/vals" || return
  sleep 0.3
  local t0 running
  t0=$(cpu_ticks "$2")
  running=$(python3 -c '
import glob, sys, time
seen = {}
for _ in range(20):
    for f in glob.glob("/proc/%s/task/*/stat" % sys.argv[1]):
        try:
            state = open(f).read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        seen[f] = seen.get(f, 0) + (state == "R")
    time.sleep(0.05)
print(max(seen.values(), default=0))
' "$2")
  echo "$(($(cpu_ticks "$2") - t0)) $running"
}
hz=$(getconf CLK_TCK)
read -r ticks running < <(after_push "$s_ADDR" "$s_PID")
if [ -n "$running" ] && [ "$running" -le 5 ] && [ "$ticks" -le $((hz / 5)) ]; then
  ok "idle after a push: no thread running in more than $running/20 samples, $ticks CPU ticks"
else
  bad "idle after a push: threads asleep (at most 5/20 samples running)" \
    "running in '$running'/20 samples, '$ticks' ticks (hz $hz)"
fi
# a policy the environment sets is the one the runtime runs, and the same
# measure sees the spinning of the active policy
OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=verbose start a --omp-threads 2 --io-threads 1
wait_log "$TMP/a.log" "apply thread: OpenMP team of"
omp_env "$TMP/a.log" >"$TMP/env"
environ_has "$a_PID" OMP_WAIT_POLICY=active && ! environ_has "$a_PID" OMP_WAIT_POLICY=passive &&
  grep -qx "OMP_WAIT_POLICY='ACTIVE'" "$TMP/env" &&
  ok "OMP_WAIT_POLICY=active from the environment is kept" ||
  bad "OMP_WAIT_POLICY=active from the environment is kept" \
    "$(tr '\0' '\n' <"/proc/$a_PID/environ" | grep OMP_)" "$(cat "$TMP/env")"
check "create a table (active)" timeout 30 "$CLI" --servers "$a_ADDR" \
  create-table t --dim 64 --rows 40000
read -r ticks running < <(after_push "$a_ADDR" "$a_PID")
if [ -n "$running" ] && [ "$running" -ge 15 ]; then
  ok "OMP_WAIT_POLICY=active spins after a push: running in $running/20 samples, $ticks ticks"
else
  bad "OMP_WAIT_POLICY=active spins after a push (at least 15/20 samples running)" \
    "running in '$running'/20 samples, '$ticks' ticks"
fi
stop a
stop s
finish
