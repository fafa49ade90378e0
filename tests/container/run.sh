#!/usr/bin/env bash
# run.sh [BUILD_DIR] - the container image, compose file and Kubernetes
# manifests, end to end with podman (not part of `make test`: the first run
# builds a Debian base image and the embps image, minutes on 2 cores).
#
#  1. offline checks of docker/ (tests/ops/test_configs.sh);
#  2. podman set-up as ../shared/reference/containers.md describes (runc,
#     cgroupfs, explicit ulimits; storage under $EMBPS_CTR_DIR), and a local
#     Debian 12 base image built with debootstrap when it is missing;
#  3. podman build of docker/Dockerfile (docker format: its HEALTHCHECK),
#     with the revision; the image: uid 10001, OCI labels, its files (the
#     programs, their libraries, sh: no apt, dpkg, perl, coreutils, setuid
#     file or demo), the data volume owned by 10001;
#  4. secure by default: the default command without a token refuses to
#     start, naming the file; a secret of podman's default mode (0444) is
#     refused too;
#  5. durable by default: two servers (a cluster of 2, their default flags:
#     token, data dir on the volume) with a podman secret of uid 10001 and
#     mode 0400, ports on 127.0.0.1 only; the health check passes; a client
#     without the token is refused; the example workers (embps-mf-demo of
#     BUILD_DIR) train against them with the token and reach their target;
#     /metrics passes promtool; each member holds part of the rows; podman
#     stop exits 0, and server 0 started again on its volume restores them;
#  6. `podman kube play` of the StatefulSet's pod template (the pod embps-0
#     and its claim cut out of docker/k8s/manual/statefulset.yaml), its Secret laid
#     out as the kubelet does (root:10001 0440 behind ..data symlinks, in a
#     host directory: podman 4.3 ignores defaultMode and fsGroup): the
#     server runs as uid 10001 with the fsGroup, auth on, read-only root,
#     its data dir on the claim, --cluster-servers and JSON logs;
#  7. with podman-compose: docker/compose.yaml up (token service, three
#     servers, the demo client) and down;
#  8. docker/compose.etcd.yaml with an etcd image built from Debian's
#     etcd-server (tests/container/etcd.Dockerfile: no registry is needed):
#     the demo through both servers of each member; kill -9 of member 0's
#     primary, its other server elected; the killed one started again
#     rejoins as a follower of it, and the demo passes again; down.
# Run as root. Prints "N passed, N failed" last.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
CTR=${EMBPS_CTR_DIR:-/tmp/embps-ctr}
IMAGE=localhost/embps:test
ETCD_IMAGE=localhost/embps-etcd:test
BASE=localhost/debian:bookworm-slim
NAME=embps-ctest-$$
SECRET=embps-token-$$
TMP=$(mktemp -d /tmp/embps-container-test.XXXXXX)

. "$ROOT/tests/ops/tap.sh"

export CONTAINERS_CONF=$CTR/containers.conf
export CONTAINERS_STORAGE_CONF=$CTR/storage.conf
COMPOSE_UP=0
cleanup() {
  podman rm -f -v -t 5 "$NAME-0" "$NAME-1" "$NAME-x" >/dev/null 2>&1
  [ "${COMPOSE_ETCD_UP:-0}" = 1 ] && (cd "$ROOT/docker" && EMBPS_TOKEN_FILE=$TMP/token \
    EMBPS_IMAGE=$IMAGE EMBPS_ETCD_IMAGE=$ETCD_IMAGE \
    podman-compose -p "$NAME-e" -f compose.etcd.yaml down -v >/dev/null 2>&1)
  podman volume rm -f "$NAME-d0" "$NAME-d1" >/dev/null 2>&1
  [ -f "$TMP/kube.yaml" ] && podman kube down "$TMP/kube.yaml" >/dev/null 2>&1
  podman volume rm -f "$NAME-data" >/dev/null 2>&1
  podman secret rm "$SECRET" "$SECRET-open" >/dev/null 2>&1
  [ $COMPOSE_UP = 1 ] && (cd "$ROOT/docker" && EMBPS_TOKEN_FILE=$TMP/token \
    podman-compose -p "$NAME" -f compose.yaml down -v >/dev/null 2>&1)
  rm -rf "$TMP"
}
trap cleanup EXIT

# ---- 1. offline checks
if bash "$ROOT/tests/ops/test_configs.sh" "$ROOT" >"$TMP/out" 2>&1; then
  ok "offline checks of docker/ ($(tail -1 "$TMP/out"))"
else
  bad "offline checks of docker/" "$(cat "$TMP/out")"
fi

# ---- 2. podman and a base image
if [ "$(id -u)" -ne 0 ]; then
  bad "podman needs root here (containers.md)"; finish
fi
for p in podman runc debootstrap catatonit; do
  command -v "$p" >/dev/null || { bad "$p is installed (apt-get install podman runc debootstrap catatonit)"; finish; }
done
mkdir -p "$CTR/root" "$CTR/run"
cat >"$CTR/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cat >"$CTR/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$CTR/root"
runroot = "$CTR/run"
CONF
if ! podman image exists "$BASE"; then
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  rm -rf "$CTR/rootfs"
  if debootstrap --variant=minbase bookworm "$CTR/rootfs" "${MIRROR:-http://deb.debian.org/debian}" \
       >"$TMP/out" 2>&1 &&
     tar -C "$CTR/rootfs" -c . | podman import \
       --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
       - "$BASE" >>"$TMP/out" 2>&1; then
    ok "base image $BASE built with debootstrap"
  else
    bad "base image $BASE built with debootstrap" "$(tail -20 "$TMP/out")"; finish
  fi
  rm -rf "$CTR/rootfs"
else
  ok "base image $BASE present"
fi

# ---- 3. the image
REV=$(git -C "$ROOT" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
if podman build --format docker -f "$ROOT/docker/Dockerfile" \
     --build-arg BASE="$BASE" --build-arg EMBPS_REVISION="$REV" \
     -t "$IMAGE" "$ROOT" >"$TMP/build.log" 2>&1; then
  ok "podman build docker/Dockerfile ($(grep -ci warn "$TMP/build.log") warnings)"
else
  bad "podman build docker/Dockerfile" "$(tail -30 "$TMP/build.log")"; finish
fi
inspect() { podman image inspect -f "$1" "$IMAGE"; }
[ "$(inspect '{{.Config.User}}')" = 10001:10001 ] && ok "image runs as 10001:10001" ||
  bad "image runs as 10001:10001" "$(inspect '{{.Config.User}}')"
[ "$(inspect '{{index .Config.Healthcheck.Test 1}}')" = embps-healthcheck ] &&
  ok "image keeps its HEALTHCHECK" || bad "image keeps its HEALTHCHECK" "$(inspect '{{json .Config.Healthcheck}}')"
version=$(sed -n 's/^project(embps VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
labels=$(inspect '{{json .Config.Labels}}')
for kv in "org.opencontainers.image.version\":\"$version" \
          "org.opencontainers.image.revision\":\"$REV" \
          'org.opencontainers.image.licenses":"Apache-2.0' \
          'org.opencontainers.image.title":"embps'; do
  case $labels in
    *"$kv"*) ;;
    *) bad "OCI label ${kv%%\"*}" "$labels"; kv= ;;
  esac
  [ -n "$kv" ] && ok "OCI label ${kv%%\"*}: ${kv##*\"}"
done
podman create --name "$NAME-x" "$IMAGE" >/dev/null 2>&1 &&
  podman export "$NAME-x" | tar --numeric-owner -tvf - >"$TMP/files" 2>/dev/null
podman rm -f "$NAME-x" >/dev/null 2>&1
/usr/bin/python3 - "$TMP/files" >"$TMP/out" 2>&1 <<'PY'
import re, sys
bins, setuid, bad, n = [], [], [], 0
data_owner = None
for line in open(sys.argv[1]):
    f = line.split()
    mode, owner, path = f[0], f[1], f[5]
    n += 1
    if mode[0] == "-" and ("s" in mode[1:10] or "S" in mode[1:10]):
        setuid.append(path)
    if re.match(r"(\./)?usr/bin/[^/]+$", path):
        bins.append(path.split("/")[-1])
    if re.match(r"(\./)?usr/s?bin/(apt|apt-get|dpkg|perl[0-9.]*|ls|cat|cp|mv|rm|bash|su|"
                r"mount|passwd|embps-mf-demo)$", path) or \
            re.match(r"(\./)?(var/lib/dpkg|var/cache/apt|var/lib/apt|usr/share/perl)", path):
        bad.append(path)
    if re.match(r"(\./)?var/lib/embps/?$", path):
        data_owner = owner
assert not setuid, ("setuid/setgid files", setuid)
assert not bad, ("tools the image must not have", bad)
assert sorted(bins) == ["dash", "embps", "embps-healthcheck", "embps-server", "sh"], bins
assert data_owner and data_owner.startswith("10001/"), ("/var/lib/embps owner", data_owner)
print("%d files; /usr/bin: %s; /var/lib/embps: %s" % (n, " ".join(sorted(bins)), data_owner))
PY
[ $? = 0 ] && ok "image files: $(cat "$TMP/out")" || bad "image files" "$(cat "$TMP/out")"
ok "image size: $(podman image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f MB", $1 / 1e6}')"

# ---- 4. secure by default
podman run --rm "$IMAGE" >"$TMP/out" 2>&1
st=$?
[ $st = 2 ] && grep -q '/run/secrets/embps-token: No such file' "$TMP/out" &&
  ok "no token: the default command refuses to start ($(grep -o 'embps-server: .*' "$TMP/out" | head -1))" ||
  bad "no token: the default command refuses to start" "exit $st" "$(cat "$TMP/out")"
umask 077
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/token"
podman secret create "$SECRET" "$TMP/token" >/dev/null
podman run --rm --secret "$SECRET,target=embps-token" "$IMAGE" >"$TMP/out" 2>&1
st=$?
[ $st = 2 ] && grep -q 'mode 0444 lets every user' "$TMP/out" &&
  ok "a secret of podman's default mode 0444 is refused, naming the fix" ||
  bad "a secret of mode 0444 is refused" "exit $st" "$(cat "$TMP/out")"

# ---- 5. a cluster of two, durable, with the token
server() { # server I: the image's default flags and cluster ones
  podman run -d --name "$NAME-$1" -p 127.0.0.1::7070 -p 127.0.0.1::9464 \
    --secret "$SECRET,target=embps-token,uid=10001,mode=0400" \
    -v "$NAME-d$1:/var/lib/embps" "$IMAGE" \
    --listen 0.0.0.0:7070 --metrics-listen 0.0.0.0:9464 \
    --auth-token-file /run/secrets/embps-token --data-dir /var/lib/embps \
    --checkpoint-every 300 --cluster-size 2 --cluster-index "$1"
}
port() { podman port "$1" "$2" | head -1 | sed 's/.*://'; }
for i in 0 1; do
  server "$i" >"$TMP/out" 2>&1 || { bad "podman run server $i" "$(cat "$TMP/out")"; finish; }
done
S0=127.0.0.1:$(port "$NAME-0" 7070/tcp)
S1=127.0.0.1:$(port "$NAME-1" 7070/tcp)
M0=http://127.0.0.1:$(port "$NAME-0" 9464/tcp)
M1=http://127.0.0.1:$(port "$NAME-1" 9464/tcp)
wait_ready() {
  for _ in $(seq 1 200); do
    local all=1 m
    for m in "$@"; do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "$m/readyz")" = 200 ] || all=0
    done
    [ $all = 1 ] && return 0
    sleep 0.1
  done
  return 1
}
wait_ready "$M0" "$M1" && ok "both servers ready (/readyz 200)" ||
  bad "both servers ready (/readyz 200)" "$(podman logs "$NAME-0" 2>&1 | tail -5)"
podman healthcheck run "$NAME-0" >"$TMP/out" 2>&1 && ok "health check (embps-healthcheck with the secret): healthy" ||
  bad "health check: healthy" "$(cat "$TMP/out")"
comm=$(podman top "$NAME-0" user comm 2>/dev/null | tail -1)
case "$comm" in
  *embps-server*) ok "server process: $comm" ;;
  *) bad "server process named embps-server, not root" "$comm" ;;
esac
if "$BUILD/embps" --servers "$S0,$S1" tables >"$TMP/out" 2>&1; then
  bad "a client without the token is refused" "$(cat "$TMP/out")"
else
  grep -q 'auth token' "$TMP/out" && ok "a client without the token is refused" ||
    bad "a client without the token is refused for its token" "$(cat "$TMP/out")"
fi
export EMBPS_TOKEN_FILE=$TMP/token
if "$BUILD/embps-mf-demo" --servers "$S0,$S1" --workers 2 >"$TMP/demo.log" 2>&1; then
  ok "example workers (embps-mf-demo, 2 workers, the token) reach their target: $(grep -i rmse "$TMP/demo.log" | tail -1)"
else
  bad "example workers (embps-mf-demo) reach their target" "$(tail -15 "$TMP/demo.log")"
fi
rows=()
for i in 0 1; do
  r=$("$BUILD/embps" --servers "$S0,$S1" --member "$i" tables 2>"$TMP/err" | awk '$1 == "users" {print $6}')
  rows+=("${r:-0}")
done
[ "${rows[0]}" -gt 0 ] && [ "${rows[1]}" -gt 0 ] &&
  ok "each member holds part of the users (${rows[0]} + ${rows[1]} rows)" ||
  bad "each member holds part of the users" "${rows[*]} $(cat "$TMP/err")"
for m in "$M0" "$M1"; do
  curl -s -H "Authorization: Bearer $(cat "$TMP/token")" "$m/metrics" >"$TMP/metrics"
  if command -v promtool >/dev/null && promtool check metrics <"$TMP/metrics" >"$TMP/out" 2>&1 &&
     grep -q '^embps_table_rows_total{table="users",op="push"} [1-9]' "$TMP/metrics"; then
    ok "$m/metrics: promtool passes, pushes counted"
  else
    bad "$m/metrics: promtool passes, pushes counted" "$(cat "$TMP/out")" "$(grep users "$TMP/metrics" | head -5)"
  fi
done
podman stop -t 60 "$NAME-0" >/dev/null 2>&1
st=$(podman inspect -f '{{.State.ExitCode}}' "$NAME-0")
[ "$st" = 0 ] && ok "SIGTERM (podman stop): exit 0" || bad "SIGTERM (podman stop): exit 0" "exit $st"
podman rm "$NAME-0" >/dev/null 2>&1
server 0 >"$TMP/out" 2>&1 || bad "server 0 again" "$(cat "$TMP/out")"
S0=127.0.0.1:$(port "$NAME-0" 7070/tcp)
M0=http://127.0.0.1:$(port "$NAME-0" 9464/tcp)
wait_ready "$M0" && podman logs "$NAME-0" 2>&1 | grep -q 'restored checkpoint' &&
  r=$("$BUILD/embps" --servers "$S0,$S1" --member 0 tables 2>"$TMP/err" | awk '$1 == "users" {print $6}') &&
  [ "${r:-0}" = "${rows[0]}" ] &&
  ok "server 0 restarted on its volume restores its ${rows[0]} rows" ||
  bad "server 0 restarted on its volume restores its rows" "${r:-none} of ${rows[0]}" \
    "$(podman logs "$NAME-0" 2>&1 | tail -5)" "$(cat "$TMP/err")"
unset EMBPS_TOKEN_FILE
podman rm -f -t 30 "$NAME-0" "$NAME-1" >/dev/null 2>&1

# ---- 6. podman kube play: the StatefulSet's pod, the Secret as the kubelet
# lays it out (root:fsGroup, defaultMode, ..data links) in a host directory
S=$TMP/secret
TS=..2026_11_25_14_03_12.123456789
mkdir -p "$S/$TS"
cp "$TMP/token" "$S/$TS/token"
ln -s "$TS" "$S/..data"
ln -s ..data/token "$S/token"
chown -hR 0:10001 "$S"
chmod 0755 "$TMP"
chmod 3777 "$S"
chmod 2755 "$S/$TS"
chmod 0440 "$S/$TS/token"
if /usr/bin/python3 "$ROOT/tests/ops/k8s_pod.py" "$ROOT/docker/k8s/manual/statefulset.yaml" \
     "$IMAGE" "$NAME-data" "$S" >"$TMP/kube.yaml" 2>"$TMP/out"; then
  ok "pod embps-0 and its claim cut out of the StatefulSet"
else
  bad "pod embps-0 and its claim cut out of the StatefulSet" "$(cat "$TMP/out")"; finish
fi
if podman kube play "$TMP/kube.yaml" >"$TMP/out" 2>&1; then
  ok "podman kube play"
else
  bad "podman kube play" "$(cat "$TMP/out")"; finish
fi
ctr=embps-0-embps-server
ready=0
for _ in $(seq 1 100); do
  podman logs "$ctr" 2>&1 | grep -q 'ready on' && { ready=1; break; }
  sleep 0.1
done
[ $ready = 1 ] && ok "kube pod: server ready with the kubelet's token layout (root:10001 0440)" ||
  bad "kube pod: server ready" "$(podman logs "$ctr" 2>&1 | tail -5)"
# the start script built --cluster-servers from EMBPS_CLUSTER_SIZE (the
# other pods do not exist here: they do not hold back readiness)
if podman logs "$ctr" 2>&1 | grep -q 'cluster: asking the other 2 server(s)'; then
  ok "kube pod: --cluster-servers lists the 3 pods"
else
  bad "kube pod: --cluster-servers lists the 3 pods" "$(podman logs "$ctr" 2>&1 | tail -5)"
fi
pid=$(podman inspect -f '{{.State.Pid}}' "$ctr")
uid=$(awk '/^Uid:/{print $2}' "/proc/$pid/status" 2>/dev/null)
groups=$(awk '/^Groups:/{$1 = ""; print}' "/proc/$pid/status" 2>/dev/null)
[ "$uid" = 10001 ] && ok "kube pod: runs as uid 10001 (groups:$groups)" || bad "kube pod: runs as uid 10001" "$uid"
if podman exec "$ctr" sh -c ': >/probe' 2>/dev/null; then
  bad "kube pod: root filesystem read-only"
else
  ok "kube pod: root filesystem read-only"
fi
podman logs "$ctr" 2>&1 | grep -q '"data dir /var/lib/embps: --fsync' &&
  ok "kube pod: its data dir on the claim" ||
  bad "kube pod: its data dir on the claim" "$(podman logs "$ctr" 2>&1 | tail -3)"
podman exec "$ctr" embps-healthcheck >"$TMP/out" 2>&1 &&
  ok "kube pod: health check passes with the mounted token" ||
  bad "kube pod: health check passes" "$(cat "$TMP/out")"
podman exec -e EMBPS_TOKEN_FILE= "$ctr" embps --servers 127.0.0.1:7070 tables >"$TMP/out" 2>&1
grep -q 'auth token' "$TMP/out" && ok "kube pod: auth on (no token: refused)" ||
  bad "kube pod: auth on (no token: refused)" "$(cat "$TMP/out")"
if podman logs "$ctr" 2>&1 | grep -q '"event":"ready"'; then
  ok "kube pod: JSON log lines"
else
  bad "kube pod: JSON log lines" "$(podman logs "$ctr" 2>&1 | tail -3)"
fi
podman kube down "$TMP/kube.yaml" >/dev/null 2>&1 && ok "podman kube down" || bad "podman kube down"

# ---- 7. compose
if command -v podman-compose >/dev/null; then
  podman tag "$IMAGE" localhost/embps:latest
  cd "$ROOT/docker"
  export EMBPS_TOKEN_FILE=$TMP/token
  COMPOSE_UP=1
  pc() { podman-compose -p "$NAME" -f compose.yaml "$@" >>"$TMP/compose.log" 2>&1; }
  # the token service first (podman-compose 1.0 does not wait for it)
  pc up -d --no-build token
  for _ in $(seq 1 100); do
    [ "$(podman inspect -f '{{.State.Status}}' "${NAME}_token_1" 2>/dev/null)" = exited ] && break
    sleep 0.1
  done
  pc up -d --no-build
  done=0
  for _ in $(seq 1 300); do
    [ "$(podman inspect -f '{{.State.Status}}' "${NAME}_demo_1" 2>/dev/null)" = exited ] && { done=1; break; }
    sleep 0.2
  done
  podman logs "${NAME}_demo_1" >"$TMP/out" 2>&1
  st=$(podman inspect -f '{{.State.ExitCode}}' "${NAME}_demo_1" 2>/dev/null)
  [ $done = 1 ] && [ "$st" = 0 ] && grep -q '^demo ' "$TMP/out" &&
    ok "compose: token service, 3 servers with auth and data volumes, the demo client" ||
    bad "compose: the demo client" "exit ${st:-none}" "$(tail -5 "$TMP/out")" "$(tail -20 "$TMP/compose.log")"
  tok=$(podman volume inspect -f '{{.Mountpoint}}' "${NAME}_auth" 2>/dev/null)/token
  [ "$(stat -c '%u:%g %a' "$tok" 2>/dev/null)" = "0:10001 440" ] &&
    ok "compose: the token in the auth volume as the kubelet shows it (root:10001 0440)" ||
    bad "compose: the token root:10001 0440" "$(stat -c '%u:%g %a' "$tok" 2>&1)"
  pc down -v && COMPOSE_UP=0
  cd - >/dev/null
  unset EMBPS_TOKEN_FILE
else
  echo "# podman-compose not installed: compose not run (apt-get install podman-compose)"
fi

# ---- 8. compose with etcd: a failover
if command -v podman-compose >/dev/null; then
  if podman build -f "$ROOT/tests/container/etcd.Dockerfile" --build-arg BASE="$BASE" \
       -t "$ETCD_IMAGE" "$ROOT/tests/container" >"$TMP/etcd-build.log" 2>&1; then
    ok "etcd image from Debian's etcd-server"
  else
    bad "etcd image from Debian's etcd-server" "$(tail -20 "$TMP/etcd-build.log")"; finish
  fi
  cd "$ROOT/docker"
  export EMBPS_TOKEN_FILE=$TMP/token EMBPS_IMAGE=$IMAGE EMBPS_ETCD_IMAGE=$ETCD_IMAGE
  COMPOSE_ETCD_UP=1
  pe() { podman-compose -p "$NAME-e" -f compose.etcd.yaml "$@" >>"$TMP/compose-etcd.log" 2>&1; }
  c() { printf '%s_%s_1' "$NAME-e" "$1"; }
  exited() { # exited CONTAINER SECONDS
    for _ in $(seq 1 $(($2 * 5))); do
      [ "$(podman inspect -f '{{.State.Status}}' "$1" 2>/dev/null)" = exited ] && return 0
      sleep 0.2
    done
    return 1
  }
  pe up -d --no-build token
  exited "$(c token)" 20
  pe up -d --no-build
  if exited "$(c demo)" 90 && [ "$(podman inspect -f '{{.State.ExitCode}}' "$(c demo)")" = 0 ] &&
     podman logs "$(c demo)" 2>&1 | grep -q '^demo '; then
    ok "compose.etcd: etcd, six coordinated servers, the demo through both servers per member"
  else
    bad "compose.etcd: the demo" "$(podman logs "$(c demo)" 2>&1 | tail -5)" \
      "$(tail -20 "$TMP/compose-etcd.log")"
  fi
  # who is member 0's primary: its own log says so
  primary=
  for s in embps-0-0 embps-0-1; do
    podman logs "$(c "$s")" 2>&1 | grep -q "elected primary of member 0" && primary=$s
  done
  other=embps-0-0
  [ "$primary" = embps-0-0 ] && other=embps-0-1
  if [ -n "$primary" ]; then
    ok "compose.etcd: $primary elected primary of member 0"
    podman kill -s KILL "$(c "$primary")" >/dev/null 2>&1
    elected=0
    for _ in $(seq 1 100); do
      podman logs "$(c "$other")" 2>&1 | grep -q "elected primary of member 0" && { elected=1; break; }
      sleep 0.1
    done
    [ $elected = 1 ] && ok "compose.etcd: kill -9 of $primary, $other elected within 10 s" ||
      bad "compose.etcd: $other elected after the kill" "$(podman logs "$(c "$other")" 2>&1 | tail -5)"
    # started again (member 0's writes wait for it: --sync-followers 1)
    podman start "$(c "$primary")" >/dev/null 2>&1
    pe run --rm --no-deps demo
    [ $? = 0 ] && ok "compose.etcd: $primary started again, the demo passes again" ||
      bad "compose.etcd: the demo after the failover" "$(tail -10 "$TMP/compose-etcd.log")"
    podman logs "$(c "$primary")" 2>&1 | grep -q "following $other:7070" &&
      ok "compose.etcd: $primary rejoined as a follower of $other" ||
      bad "compose.etcd: $primary rejoined as a follower" "$(podman logs "$(c "$primary")" 2>&1 | tail -5)"
  else
    bad "compose.etcd: a primary elected for member 0" "$(podman logs "$(c embps-0-0)" 2>&1 | tail -5)"
  fi
  pe down -v && COMPOSE_ETCD_UP=0
  cd - >/dev/null
  unset EMBPS_TOKEN_FILE EMBPS_IMAGE EMBPS_ETCD_IMAGE
fi
finish
