#!/usr/bin/env bash
# test_process.sh SERVER CLI - the daemon as a process: libgomp itself sees
# OMP_WAIT_POLICY=passive (spin count 0) unless the environment chose a
# policy, OpenMP threads park after a push (an idle server uses no CPU),
# and the process keeps its name (no re-exec through /proc/self/exe).
set -u
[ $# -eq 2 ] || { echo "usage: $0 SERVER CLI" >&2; exit 2; }
SERVER=$1
CLI=$2
. "$(dirname "$0")/lib.sh"

# libgomp prints the policy it parsed, and its spin count, at load time
OMP_DISPLAY_ENV=verbose "$SERVER" --version >"$TMP/env" 2>&1
if grep -q "OMP_WAIT_POLICY = 'PASSIVE'" "$TMP/env" &&
   grep -q "GOMP_SPINCOUNT = '0'" "$TMP/env"; then
  ok "libgomp starts with the passive policy, spin count 0"
else
  bad "libgomp starts with the passive policy, spin count 0" "$(cat "$TMP/env")"
fi
OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=verbose "$SERVER" --version >"$TMP/env" 2>&1
if grep -q "OMP_WAIT_POLICY = 'ACTIVE'" "$TMP/env"; then
  ok "a policy set in the environment is kept"
else
  bad "a policy set in the environment is kept" "$(cat "$TMP/env")"
fi

start s --omp-threads 2 --io-threads 1
comm=$(ps -o comm= -p "$s_PID")
[ "$comm" = embps-server ] && ok "ps -o comm shows embps-server" ||
  bad "ps -o comm shows embps-server" "comm: $comm"
args=$(ps -o args= -p "$s_PID")
case "$args" in
  "$SERVER "*) ok "ps -o args shows the command line" ;;
  *) bad "ps -o args shows the command line" "args: $args" ;;
esac

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
# the same measure sees the spinning of the active policy
OMP_WAIT_POLICY=active start a --omp-threads 2 --io-threads 1
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
