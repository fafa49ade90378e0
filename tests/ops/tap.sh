# tap.sh - sourced by the shell tests: "ok - NAME" / "FAIL - NAME" lines
# and a closing "N passed, N failed". check() needs $TMP (a directory).
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok - $1"; }
# bad NAME [DETAIL...]: each detail indented under the failure
bad() {
  FAIL=$((FAIL + 1))
  echo "FAIL - $1"
  shift
  for line in "$@"; do printf '%s\n' "$line" | sed 's/^/    /'; done
}
# check NAME COMMAND...: ok when the command succeeds, else its output
check() {
  local name=$1
  shift
  if "$@" >"$TMP/check.out" 2>&1; then ok "$name"; else
    bad "$name" "$(head -c 3000 "$TMP/check.out")"; fi
}
finish() {
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" -eq 0 ]
  exit
}
