#!/usr/bin/env bash
# run.sh [BUILD_DIR] - the container image and the Kubernetes manifests,
# end to end with podman (not part of `make test`: the first run builds a
# Debian base image and the embps image, minutes on 2 cores).
#
#  1. offline checks of docker/ (tests/ops/test_configs.sh: yamllint, the
#     restricted Pod Security Standard, promtool, systemd-analyze);
#  2. podman set-up as ../shared/reference/containers.md describes (runc,
#     cgroupfs, explicit ulimits; storage under $EMBPS_CTR_DIR), and a local
#     Debian 12 base image built with debootstrap when it is missing;
#  3. podman build of docker/Dockerfile;
#  4. two servers (a cluster of 2) in containers, ports on 127.0.0.1 only;
#     the example workers (embps-mf-demo, in a container of the same image)
#     train against them and must reach their RMSE target; both servers'
#     /metrics pass promtool, /readyz answers 200, each member holds part
#     of the rows (embps --member I tables);
#  5. `podman kube play` of the StatefulSet's pod template (podman has no
#     StatefulSet: the pod embps-0 and its PersistentVolumeClaim are cut out
#     of docker/k8s/statefulset.yaml unchanged), which must start as uid
#     10001 with a read-only root, pass --cluster-servers and become ready;
#     then `kube down`.
# Run as root. Prints "N passed, N failed" last.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
CTR=${EMBPS_CTR_DIR:-/tmp/embps-ctr}
IMAGE=localhost/embps:test
BASE=localhost/debian:bookworm-slim
NAME=embps-ctest-$$
AUTH=embps-auth     # the Secret the StatefulSet mounts (optional there)
TMP=$(mktemp -d /tmp/embps-container-test.XXXXXX)

. "$ROOT/tests/ops/tap.sh"

export CONTAINERS_CONF=$CTR/containers.conf
export CONTAINERS_STORAGE_CONF=$CTR/storage.conf
cleanup() {
  podman rm -f -v -t 5 "$NAME-0" "$NAME-1" >/dev/null 2>&1
  [ -f "$TMP/kube.yaml" ] && podman kube down "$TMP/kube.yaml" >/dev/null 2>&1
  podman volume rm -f "$NAME-data" >/dev/null 2>&1
  podman secret rm "$AUTH" >/dev/null 2>&1
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
if podman build --format docker -f "$ROOT/docker/Dockerfile" \
     --build-arg BASE="$BASE" -t "$IMAGE" "$ROOT" >"$TMP/build.log" 2>&1; then
  ok "podman build docker/Dockerfile"
else
  bad "podman build docker/Dockerfile" "$(tail -30 "$TMP/build.log")"; finish
fi
user=$(podman image inspect -f '{{.Config.User}}' "$IMAGE")
[ "$user" = 10001:10001 ] && ok "image runs as 10001:10001" || bad "image runs as 10001:10001" "User: $user"

# ---- 4. a cluster of two, the example workers against it
for i in 0 1; do
  if ! podman run -d --name "$NAME-$i" -p 127.0.0.1::7070 -p 127.0.0.1::9464 \
       "$IMAGE" --listen 0.0.0.0:7070 --metrics-listen 0.0.0.0:9464 \
       --cluster-size 2 --cluster-index "$i" --insecure >"$TMP/out" 2>&1; then
    bad "podman run server $i" "$(cat "$TMP/out")"; finish
  fi
done
port() { podman port "$1" "$2" | head -1 | sed 's/.*://'; }
S0=127.0.0.1:$(port "$NAME-0" 7070/tcp)
S1=127.0.0.1:$(port "$NAME-1" 7070/tcp)
M0=http://127.0.0.1:$(port "$NAME-0" 9464/tcp)
M1=http://127.0.0.1:$(port "$NAME-1" 9464/tcp)
ready=0
for _ in $(seq 1 100); do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' "$M0/readyz")" = 200 ] &&
     [ "$(curl -s -o /dev/null -w '%{http_code}' "$M1/readyz")" = 200 ]; then
    ready=1; break
  fi
  sleep 0.1
done
[ $ready = 1 ] && ok "both servers ready (/readyz 200)" ||
  bad "both servers ready (/readyz 200)" "$(podman logs "$NAME-0" 2>&1 | tail -5)"
comm=$(podman top "$NAME-0" user comm 2>/dev/null | tail -1)
case "$comm" in
  *embps-server*) ok "server process: $comm" ;;
  *) bad "server process named embps-server, not root" "$comm" ;;
esac

if podman run --rm --network host --entrypoint embps-mf-demo "$IMAGE" \
     --servers "$S0,$S1" --workers 2 >"$TMP/demo.log" 2>&1; then
  ok "example workers (embps-mf-demo, 2 workers) reach their target: $(grep -i rmse "$TMP/demo.log" | tail -1)"
else
  bad "example workers (embps-mf-demo) reach their target" "$(tail -15 "$TMP/demo.log")"
fi
rows=()
for i in 0 1; do
  r=$(podman run --rm --network host --entrypoint embps "$IMAGE" \
        --servers "$S0,$S1" --member "$i" tables 2>"$TMP/err" | awk '$1 == "users" {print $6}')
  rows+=("${r:-0}")
done
[ "${rows[0]}" -gt 0 ] && [ "${rows[1]}" -gt 0 ] &&
  ok "each member holds part of the users (${rows[0]} + ${rows[1]} rows)" ||
  bad "each member holds part of the users" "${rows[*]} $(cat "$TMP/err")"
for m in "$M0" "$M1"; do
  curl -s "$m/metrics" >"$TMP/metrics"
  if command -v promtool >/dev/null && promtool check metrics <"$TMP/metrics" >"$TMP/out" 2>&1 &&
     grep -q '^embps_table_rows_total{table="users",op="push"} [1-9]' "$TMP/metrics"; then
    ok "$m/metrics: promtool passes, pushes counted"
  else
    bad "$m/metrics: promtool passes, pushes counted" "$(cat "$TMP/out")" "$(grep users "$TMP/metrics" | head -5)"
  fi
done
podman stop -t 30 "$NAME-0" >/dev/null 2>&1
st=$(podman inspect -f '{{.State.ExitCode}}' "$NAME-0")
[ "$st" = 0 ] && ok "SIGTERM (podman stop): exit 0" || bad "SIGTERM (podman stop): exit 0" "exit $st"

# ---- 5. podman kube play: the StatefulSet's pod, unchanged but for hostPort
if python3 "$ROOT/tests/ops/k8s_pod.py" "$ROOT/docker/k8s/statefulset.yaml" \
     "$IMAGE" "$NAME-data" >"$TMP/kube.yaml" 2>"$TMP/out"; then
  ok "pod embps-0 and its claim cut out of the StatefulSet"
else
  bad "pod embps-0 and its claim cut out of the StatefulSet" "$(cat "$TMP/out")"; finish
fi
# podman 4.3 looks the pod's secret volume up even though it is optional:
# give it the Secret (podman 4.3 then does not show its key as
# /etc/embps/auth/token as Kubernetes does, so the token is not checked)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/token"
podman secret rm "$AUTH" >/dev/null 2>&1
{ cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $AUTH
data:
  token: $(base64 -w0 <"$TMP/token")
---
YAML
  cat "$TMP/kube.yaml"; } >"$TMP/kube-all.yaml" && mv "$TMP/kube-all.yaml" "$TMP/kube.yaml"
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
[ $ready = 1 ] && ok "kube pod: server ready" || bad "kube pod: server ready" "$(podman logs "$ctr" 2>&1 | tail -5)"
# the start script built --cluster-servers from EMBPS_CLUSTER_SIZE (the
# other pods do not exist here: they do not hold back readiness)
if podman logs "$ctr" 2>&1 | grep -q 'cluster: asking the other 2 server(s)'; then
  ok "kube pod: --cluster-servers lists the 3 pods"
else
  bad "kube pod: --cluster-servers lists the 3 pods" "$(podman logs "$ctr" 2>&1 | tail -5)"
fi
uid=$(podman exec "$ctr" id -u 2>&1)
[ "$uid" = 10001 ] && ok "kube pod: runs as uid 10001" || bad "kube pod: runs as uid 10001" "$uid"
if podman exec "$ctr" touch /probe 2>/dev/null; then
  bad "kube pod: root filesystem read-only"
else
  ok "kube pod: root filesystem read-only"
fi
if podman exec "$ctr" sh -c 'touch /var/lib/embps/probe && rm /var/lib/embps/probe' 2>"$TMP/out"; then
  ok "kube pod: data volume writable by the server"
else
  bad "kube pod: data volume writable by the server" "$(cat "$TMP/out")"
fi
if podman logs "$ctr" 2>&1 | grep -q '"event":"ready"'; then
  ok "kube pod: JSON log lines"
else
  bad "kube pod: JSON log lines" "$(podman logs "$ctr" 2>&1 | tail -3)"
fi
podman kube down "$TMP/kube.yaml" >/dev/null 2>&1 && ok "podman kube down" || bad "podman kube down"
finish
