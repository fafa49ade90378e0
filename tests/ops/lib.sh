# lib.sh - sourced by the operations tests: tap.sh, a temporary directory,
# and real embps-server processes on 127.0.0.1 port 0. Needs $SERVER set.
TMP=$(mktemp -d /tmp/embps-ops-test.XXXXXX)
SERVER_PIDS=()
cleanup() {
  for p in "${SERVER_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
unset EMBPS_SERVERS EMBPS_TOKEN_FILE OMP_WAIT_POLICY

. "$(dirname "${BASH_SOURCE[0]}")/tap.sh"

# start NAME ARGS...: starts embps-server ARGS on 127.0.0.1 port 0; sets
# ${NAME}_PID and ${NAME}_ADDR; its log is $TMP/NAME.log. Fails the test
# (and exits) when the server does not write its port file within 10 s.
start() {
  local name=$1 pf="$TMP/$1.port"
  shift
  "$SERVER" --listen 127.0.0.1:0 --port-file "$pf" "$@" \
    >"$TMP/$name.log" 2>&1 &
  local pid=$!
  SERVER_PIDS+=("$pid")
  for _ in $(seq 1 1000); do
    [ -s "$pf" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  if [ ! -s "$pf" ]; then
    bad "$name starts" "$(cat "$TMP/$name.log")"
    finish
  fi
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_ADDR" '127.0.0.1:%s' "$(cat "$pf")"
}

# stop NAME: SIGTERM, and the server must exit 0 within 10 s
stop() {
  local pidvar="${1}_PID"
  local pid=${!pidvar}
  kill -TERM "$pid" 2>/dev/null
  timeout 10 tail --pid="$pid" -f /dev/null
  if kill -0 "$pid" 2>/dev/null; then
    bad "$1 stops on SIGTERM" "still running after 10 s"
    kill -9 "$pid"
  fi
  wait "$pid"
  local st=$?
  [ "$st" -eq 0 ] && ok "$1 exits 0 on SIGTERM" || bad "$1 exits 0 on SIGTERM" "status $st"
}

# cpu_ticks PID: user + system clock ticks of the whole process so far
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
