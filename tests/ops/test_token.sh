#!/usr/bin/env bash
# test_token.sh SERVER CLI - a Kubernetes Secret as the kubelet mounts it,
# read by a server that is not root: the volume directory root-owned with
# the pod's fsGroup, token -> ..data/token -> ..<timestamp>/token, the file
# root:fsGroup mode 0440 (defaultMode 0440). The server runs as uid 10001
# with the fsGroup as a supplementary group (setpriv, as the container
# runtime starts it) and must start with auth on: a client without the
# token is refused, one with it served. The same file world-readable,
# group-writable, or in a group the server does not hold is refused at
# start with a message naming the fix. Needs root (exit 77 otherwise).
set -u
[ $# -eq 2 ] || { echo "usage: $0 SERVER CLI" >&2; exit 2; }
REAL_SERVER=$1
CLI=$2
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null ||
  { echo "skipped: needs root and setpriv (util-linux)"; exit 77; }
SERVER_UID=10001
FS_GROUP=2000
. "$(dirname "$0")/lib.sh"
# the server (a copy anyone may run) and its port file live in $TMP
chmod 0755 "$TMP"
chown "$SERVER_UID" "$TMP"
install -m 0755 "$REAL_SERVER" "$TMP/embps-server.bin"

# a secret volume as the kubelet writes it (atomic writer + fsGroup)
SECRET=$TMP/secret
TS=..2026_11_25_14_03_12.123456789
mkdir -p "$SECRET/$TS"
printf 'kube-token-%s\n' "$$" >"$SECRET/$TS/token"
ln -s "$TS" "$SECRET/..data"
ln -s ..data/token "$SECRET/token"
chown -hR "0:$FS_GROUP" "$SECRET"
chmod 3777 "$SECRET"
chmod 2755 "$SECRET/$TS"
chmod 0440 "$SECRET/$TS/token"

# as_pod ARGS...: the server as the pod's user (uid and gid 10001, the
# fsGroup supplementary, no capabilities); lib.sh's start runs $SERVER
cat >"$TMP/as-pod" <<EOF
#!/bin/sh
exec setpriv --reuid $SERVER_UID --regid $SERVER_UID --groups $FS_GROUP \
  --inh-caps=-all --bounding-set=-all -- "$TMP/embps-server.bin" "\$@"
EOF
chmod 0755 "$TMP/as-pod"
SERVER=$TMP/as-pod

start pod --auth-token-file "$SECRET/token"
uid=$(awk '/^Uid:/{print $2}' "/proc/$pod_PID/status")
groups=$(awk '/^Groups:/{$1=""; print}' "/proc/$pod_PID/status")
[ "$uid" = "$SERVER_UID" ] && ok "server runs as uid $uid (groups:$groups)" ||
  bad "server runs as uid $SERVER_UID" "uid $uid"
ls -lL "$SECRET/token" | grep -q '^-r--r----- 1 root 2000 ' &&
  ok "the token is root:$FS_GROUP 0440 behind ..data" ||
  bad "the token is root:$FS_GROUP 0440 behind ..data" "$(ls -laL "$SECRET")"
if timeout 10 "$CLI" --servers "$pod_ADDR" tables >"$TMP/out" 2>&1; then
  bad "a client without the token is refused (auth is on)" "$(cat "$TMP/out")"
else
  grep -qi 'auth\|token' "$TMP/out" &&
    ok "a client without the token is refused: $(head -1 "$TMP/out")" ||
    bad "a client without the token is refused for its token" "$(cat "$TMP/out")"
fi
if timeout 10 "$CLI" --servers "$pod_ADDR" --token-file "$SECRET/token" \
     create-table t --dim 2 --rows 10 >"$TMP/out" 2>&1 &&
   timeout 10 "$CLI" --servers "$pod_ADDR" --token-file "$SECRET/token" \
     tables >"$TMP/out" 2>&1 && grep -q '^t ' "$TMP/out"; then
  ok "a client with the Secret's token is served"
else
  bad "a client with the Secret's token is served" "$(cat "$TMP/out")"
fi
stop pod

# refused_with MODE|- GROUPS PATTERN NAME: the server started with the
# file at MODE (and the pod's groups GROUPS) exits 2 and says PATTERN
refused_with() {
  local mode=$1 groups=$2 pattern=$3 name=$4
  [ "$mode" = - ] || chmod "$mode" "$SECRET/$TS/token"
  timeout 10 setpriv --reuid "$SERVER_UID" --regid "$SERVER_UID" $groups -- \
    "$TMP/embps-server.bin" --listen 127.0.0.1:0 \
    --auth-token-file "$SECRET/token" >"$TMP/out" 2>&1
  local st=$?
  if [ "$st" = 2 ] && grep -q -- "$pattern" "$TMP/out"; then
    ok "$name: refused ($(grep -o -- "$pattern" "$TMP/out" | head -1))"
  else
    bad "$name: refused, saying \"$pattern\"" "status $st" "$(cat "$TMP/out")"
  fi
}
refused_with 0444 "--groups $FS_GROUP" \
  'mode 0444 lets every user of the machine read the token;.*defaultMode: 0440' \
  "world-readable (defaultMode 0444)"
refused_with 0644 "--groups $FS_GROUP" 'mode 0644 .*defaultMode: 0440' \
  "world-readable (defaultMode 0644)"
refused_with 0460 "--groups $FS_GROUP" "mode 0460 lets group $FS_GROUP change the token" \
  "group-writable"
refused_with 0440 --clear-groups "a group the server (uid $SERVER_UID) does not hold" \
  "the pod's fsGroup not held by the server"
# the same file owned by a third user: a group grant is no longer enough
chmod 0440 "$SECRET/$TS/token"
chown 4242 "$SECRET/$TS/token"
refused_with - "--groups $FS_GROUP" 'belongs to uid 4242' "owned by a third user"
finish
