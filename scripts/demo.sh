#!/usr/bin/env bash
# demo.sh BUILD_DIR [mf-demo options...] - the demo that `make demo` runs.
#
# Starts a throw-away embps-server on a free port of 127.0.0.1, runs the
# matrix-factorization demo (two worker processes training against it),
# prints the server's stats, stops the server with SIGTERM and exits with the
# demo's status. The server and the temporary files are cleaned up on any
# failure and on Ctrl-C.
set -euo pipefail

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 BUILD_DIR [embps-mf-demo options...]" >&2
  exit 2
fi
build=$1
shift

server_bin=$build/embps-server
demo_bin=$build/embps-mf-demo
cli_bin=$build/embps
for bin in "$server_bin" "$demo_bin" "$cli_bin"; do
  if [[ ! -x $bin ]]; then
    echo "demo: $bin is missing; build first (make build)" >&2
    exit 1
  fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/embps-demo.XXXXXX")
port_file=$tmp/port
server_log=$tmp/server.log
server_pid=

# shellcheck disable=SC2317  # invoked by the traps
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    # give it a moment to stop cleanly, then insist
    for _ in $(seq 50); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT
trap 'echo "demo: interrupted" >&2; exit 130' INT
trap 'echo "demo: terminated" >&2; exit 143' TERM

show_server_log() {
  if [[ -s $server_log ]]; then
    echo "demo: server log:" >&2
    sed 's/^/  | /' "$server_log" >&2
  fi
}

"$server_bin" --listen 127.0.0.1:0 --port-file "$port_file" \
  --log-level warn 2>"$server_log" &
server_pid=$!

# wait up to 10 s for the server to write its port
for _ in $(seq 100); do
  [[ -s $port_file ]] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "demo: embps-server exited before it was ready" >&2
    show_server_log
    exit 1
  fi
  sleep 0.1
done
if [[ ! -s $port_file ]]; then
  echo "demo: embps-server wrote no port file within 10 s" >&2
  show_server_log
  exit 1
fi
port=$(<"$port_file")
servers=127.0.0.1:$port
echo "demo: embps-server (pid $server_pid) listening on $servers"
echo

demo_status=0
"$demo_bin" --servers "$servers" "$@" || demo_status=$?

echo
echo "demo: server stats"
if ! "$cli_bin" --servers "$servers" stats; then
  echo "demo: could not read the server's stats" >&2
  [[ $demo_status -ne 0 ]] || demo_status=1
fi

kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=
if [[ $server_status -ne 0 ]]; then
  echo "demo: embps-server exited with status $server_status" >&2
  show_server_log
  [[ $demo_status -ne 0 ]] || demo_status=1
fi
if [[ $demo_status -ne 0 ]]; then
  echo "demo: FAILED (mf-demo exit status $demo_status)" >&2
  show_server_log
fi
exit "$demo_status"
