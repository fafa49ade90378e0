#!/usr/bin/env bash
# test_configs.sh ROOT [SERVER] - offline checks of the deployment files:
# yamllint of docker/; every pod spec in docker/k8s/ meets the restricted
# Pod Security Standard and probes /readyz and /healthz over HTTP, mounts
# its token Secret as required with defaultMode 0440 and an fsGroup, keeps
# its data on a claim with periodic checkpoints; the NetworkPolicy admits
# only workers and members to 7070 and Prometheus to 9464; compose and the
# image default to a token and a data dir (no --insecure anywhere), the
# image is pinned, labelled, health-checked and built FROM scratch; the
# Prometheus config (with its alert rules) passes promtool and every
# Grafana panel's query parses; the systemd unit passes systemd-analyze
# verify (ExecStart pointed at SERVER when given) with the settings it must
# have; every flag these files give the server is one its --help lists
# (SERVER given); README.md and docker/README.md give the same
# bytes-per-row formula and /readyz paragraph; the StatefulSet's start
# script builds --cluster-servers and passes the token and checkpoint
# flags.
set -u
ROOT=$1
SERVER=${2:-}
TMP=$(mktemp -d /tmp/embps-configs-test.XXXXXX)
mkdir "$TMP/token"
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
D=$ROOT/docker

check "yamllint docker/" yamllint -s -c "$D/yamllint.yaml" "$D/k8s" "$D/compose.yaml" "$D/monitoring"

check "k8s: restricted Pod Security Standard, HTTP probes, claims, auth on, NetworkPolicy" $PY - "$D/k8s" <<'PY'
import glob, sys, yaml
docs = [d for f in sorted(glob.glob(sys.argv[1] + "/*.yaml"))
        for d in yaml.safe_load_all(open(f)) if d]
kinds = {d["kind"] for d in docs}
assert {"StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= kinds, kinds
sets = []  # the StatefulSets' pod selectors
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
for d in docs:
    if d["kind"] not in ("StatefulSet", "Deployment", "Pod"):
        continue
    pod = d["spec"]["template"]["spec"] if d["kind"] != "Pod" else d["spec"]
    psc = pod.get("securityContext", {})
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), d
    for v in pod.get("volumes", []):
        kind = set(v) - {"name"}
        assert kind <= ALLOWED_VOLUMES, ("volume type not allowed", v)
    assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", psc
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c.get("securityContext", {})
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert not set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}
        assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, c["name"]
        assert sc.get("runAsUser", psc.get("runAsUser", 1)) != 0
        assert not sc.get("privileged"), c["name"]
        assert sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type") \
            in ("RuntimeDefault", "Localhost")
        assert all("hostPort" not in p for p in c.get("ports", [])), c["name"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", c["name"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", c["name"]
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert mounts.get("/var/lib/embps") == "data", mounts
        assert "--data-dir /var/lib/embps" in " ".join(c.get("args", [])), c["name"]
        r = c["resources"]
        assert r["requests"]["memory"] == r["limits"]["memory"], r
        args = " ".join(c.get("args", []))
        assert "--insecure" not in args, "auth is on by default"
        assert "--auth-token-file /etc/embps/auth/token" in args, args
        assert "--checkpoint-every " in args, "periodic checkpoints bound the log"
        assert "--checkpoint-log-bytes " in args, "so does the log's size"
        assert mounts.get("/etc/embps/auth") == "auth", mounts
    # the token Secret: required, shown 0440 to the pod's fsGroup, which
    # the server's uid holds (README, Security)
    auth = [v for v in pod["volumes"] if v["name"] == "auth"][0]["secret"]
    assert auth.get("optional") is False, ("the Secret is required", auth)
    assert auth.get("defaultMode") == 0o440, oct(auth.get("defaultMode", 0))
    assert psc.get("fsGroup") and psc.get("runAsUser", 0) != 0, psc
    if d["kind"] == "StatefulSet":
        t = [v["metadata"]["name"] for v in d["spec"]["volumeClaimTemplates"]]
        assert t == ["data"], t
        aa = pod["affinity"]["podAntiAffinity"]
        terms = aa.get("requiredDuringSchedulingIgnoredDuringExecution", [])
        assert terms and terms[0]["topologyKey"] == "kubernetes.io/hostname", aa
        sets.append(d["spec"]["selector"]["matchLabels"])
# a NetworkPolicy per StatefulSet (primaries, followers): selects its pods,
# only ingress rules with a source each, the protocol port from workers and
# the embps servers (members ask each other; followers fetch from their
# primaries), metrics from Prometheus, nothing else
nps = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]
assert sorted(str(n["podSelector"]["matchLabels"]) for n in nps) == \
    sorted(str(p) for p in sets), (nps, sets)
sel = lambda f: f.get("podSelector", {}).get("matchLabels", {})
for np in nps:
    assert np["policyTypes"] == ["Ingress"], np["policyTypes"]
    allowed = {}
    for rule in np["ingress"]:
        assert rule.get("from"), ("a rule without a source admits everyone", rule)
        for p in rule["ports"]:
            allowed.setdefault(p["port"], []).extend(rule["from"])
    assert set(allowed) == {"embps", "metrics"}, allowed
    assert {"embps-client": "true"} in [sel(f) for f in allowed["embps"]], allowed["embps"]
    assert {"app.kubernetes.io/name": "embps"} in [sel(f) for f in allowed["embps"]], \
        "the primaries reach every server"
    assert [sel(f).get("app.kubernetes.io/name") for f in allowed["metrics"]] == ["prometheus"]
primaries = [n for n in nps if n["podSelector"]["matchLabels"] ==
             {"app.kubernetes.io/name": "embps"}][0]
assert {"app.kubernetes.io/name": "embps-follower"} in \
    [sel(f) for r in primaries["ingress"] for f in r["from"]], "followers fetch"
kust = yaml.safe_load(open(sys.argv[1] + "/kustomization.yaml"))
assert {"networkpolicy.yaml", "followers.yaml"} <= set(kust["resources"]), kust
PY

check "compose: a token secret laid out root:10001 0440, data volumes, no --insecure" \
  $PY - "$D/compose.yaml" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
servers = {n: s for n, s in c["services"].items() if n.startswith("embps-")}
assert len(servers) == 6, list(c["services"])  # 3 primaries, 3 followers
for n, s in servers.items():
    args = s["command"]
    assert "--insecure" not in args, n
    assert args[args.index("--auth-token-file") + 1] == "/etc/embps/auth/token", n
    assert args[args.index("--data-dir") + 1] == "/var/lib/embps", n
    assert "--checkpoint-every" in args, n
    assert "--checkpoint-log-bytes" in args, n
    vols = dict(v.split(":", 1) for v in s["volumes"])
    assert vols["data-" + n.split("-", 1)[1]] == "/var/lib/embps", vols
    slot = args[args.index("--cluster-index") + 1]
    if n.startswith("embps-f"):  # follows the primary of its slot
        assert slot == n[-1] and args[args.index("--follow") + 1] == "embps-%s:7070" % slot, n
    assert vols["auth"] == "/etc/embps/auth:ro", vols
    assert s["depends_on"]["token"]["condition"] == "service_completed_successfully"
    assert all(p.startswith("127.0.0.1:") for p in s["ports"]), s["ports"]
t = c["services"]["token"]
assert t["user"] == "0:10001" and "umask 0227" in t["command"][0], t
assert c["secrets"]["embps-token"]["file"], c["secrets"]
assert c["services"]["demo"]["environment"]["EMBPS_TOKEN_FILE"] == "/etc/embps/auth/token"
PY

check "image: pinned base, FROM scratch, token and data dir by default, labels, health check" \
  $PY - "$D/Dockerfile" "$ROOT/CMakeLists.txt" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
df = re.sub(r"\\\n", " ", text)
lines = [l.strip() for l in df.splitlines() if l.strip() and not l.lstrip().startswith("#")]
base = re.search(r"^ARG BASE=(\S+)", df, re.M).group(1)
assert re.search(r"@sha256:[0-9a-f]{64}$|:[a-z]+-\d{8}-slim$|:\d+\.\d+-slim$", base), \
    ("the base image is pinned (a dated tag or a digest)", base)
froms = [l for l in lines if l.startswith("FROM ")]
assert froms[-1] == "FROM scratch", froms
for l in lines:
    if "apt-get install" in l:
        assert "rm -rf /var/lib/apt/lists/*" in l, ("no apt lists left", l)
cmd = json.loads(re.search(r"^CMD (\[.*\])$", df, re.M).group(1))
assert "--insecure" not in cmd, cmd
assert cmd[cmd.index("--auth-token-file") + 1] == "/run/secrets/embps-token", cmd
vol = json.loads(re.search(r"^VOLUME (\[.*\])$", df, re.M).group(1))
assert cmd[cmd.index("--data-dir") + 1] in vol, (cmd, vol)
assert "--checkpoint-log-bytes" in cmd, ("the log bounded by its size", cmd)
assert re.search(r"^HEALTHCHECK .*CMD \[\"embps-healthcheck\"\]", df, re.M), "health check"
assert re.search(r"^USER 10001:10001$", df, re.M)
labels = dict(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=\"([^\"]*)\"", df))
for k in ("title", "description", "version", "revision", "licenses", "base.name"):
    assert "org.opencontainers.image." + k in labels, ("OCI label", k, labels)
version = re.search(r"project\(embps VERSION ([0-9.]+)", open(sys.argv[2]).read()).group(1)
assert re.search(r"^ARG EMBPS_VERSION=%s$" % re.escape(version), df, re.M), \
    ("the image version label follows CMakeLists.txt", version)
assert "embps-mf-demo" not in df, "no demo binary in the image"
PY

# the StatefulSet's start script, run as pod embps-1 with embps-server
# replaced by a stub that prints its arguments
check "k8s: pod embps-1 gets --cluster-servers of every pod, slot 1, the token" $PY - "$D/k8s/statefulset.yaml" "$TMP" <<'PY'
import os, subprocess, sys, yaml
sts = next(d for d in yaml.safe_load_all(open(sys.argv[1]))
           if d and d["kind"] == "StatefulSet")
c = sts["spec"]["template"]["spec"]["containers"][0]
stub = os.path.join(sys.argv[2], "embps-server")
with open(stub, "w") as f:
    f.write('#!/bin/sh\nprintf "%s\\n" "$@"\n')
os.chmod(stub, 0o755)
env = {e["name"]: e["value"] for e in c["env"]}
env.update(HOSTNAME=sts["metadata"]["name"] + "-1",
           PATH=sys.argv[2] + ":/usr/bin:/bin")
args = subprocess.run(c["command"] + c["args"], env=env, check=True,
                      capture_output=True, text=True).stdout.split("\n")
n = int(env["EMBPS_CLUSTER_SIZE"])
assert n == sts["spec"]["replicas"], (n, sts["spec"]["replicas"])
svc = sts["spec"]["serviceName"]
want = ",".join("%s-%d.%s:7070" % (sts["metadata"]["name"], i, svc)
                for i in range(n))
assert args[args.index("--cluster-servers") + 1] == want, args
assert args[args.index("--cluster-index") + 1] == "1", args
assert args[args.index("--auth-token-file") + 1] == "/etc/embps/auth/token", args
assert "--insecure" not in args and "--checkpoint-every" in args, args
assert "--checkpoint-log-bytes" in args, args
assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
PY

# the followers' start script, run as pod embps-follower-1 (stub server)
check "k8s: pod embps-follower-1 follows embps-1 in slot 1, the token, never beside a server" \
  $PY - "$D/k8s/followers.yaml" "$TMP" <<'PY'
import os, subprocess, sys, yaml
sts = next(d for d in yaml.safe_load_all(open(sys.argv[1]))
           if d and d["kind"] == "StatefulSet")
pod = sts["spec"]["template"]["spec"]
c = pod["containers"][0]
stub = os.path.join(sys.argv[2], "embps-server")
with open(stub, "w") as f:
    f.write('#!/bin/sh\nprintf "%s\\n" "$@"\n')
os.chmod(stub, 0o755)
env = {e["name"]: e["value"] for e in c["env"]}
env.update(HOSTNAME=sts["metadata"]["name"] + "-1",
           PATH=sys.argv[2] + ":/usr/bin:/bin")
args = subprocess.run(c["command"] + c["args"], env=env, check=True,
                      capture_output=True, text=True).stdout.split("\n")
assert int(env["EMBPS_CLUSTER_SIZE"]) == sts["spec"]["replicas"]
assert args[args.index("--follow") + 1] == "embps-1.embps:7070", args
assert args[args.index("--cluster-index") + 1] == "1", args
assert args[args.index("--auth-token-file") + 1] == "/etc/embps/auth/token", args
assert "--insecure" not in args and "--checkpoint-log-bytes" in args, args
term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
names = term["labelSelector"]["matchExpressions"][0]
assert names["operator"] == "In" and {"embps", "embps-follower"} <= set(names["values"]), term
PY

if command -v promtool >/dev/null; then
  check "promtool check config docker/monitoring/prometheus.yml" \
    promtool check config "$D/monitoring/prometheus.yml"
  # every panel query, dashboard variables filled in, as a recording rule
  if $PY - "$D/monitoring/grafana-dashboard.json" >"$TMP/rules.yml" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
assert len(exprs) >= 8, exprs
for m in ("embps_checkpoint_time_seconds", "embps_log_bytes",
          "embps_durability_failed", "embps_cluster_missing_tables"):
    assert any(m in e for e in exprs), ("no panel shows", m)
print("groups:\n  - name: dashboard\n    rules:")
for i, e in enumerate(exprs):
    e = e.replace("$__rate_interval", "5m").replace("$job", ".*").replace("$instance", ".*")
    print("      - record: dashboard:q%d\n        expr: %s" % (i, json.dumps(e)))
PY
  then
    check "Grafana dashboard: every query parses (promtool check rules)" \
      promtool check rules "$TMP/rules.yml"
  else
    bad "Grafana dashboard: valid JSON with its panels"
  fi
else
  bad "promtool installed (apt-get install prometheus)"
fi

UNIT=$ROOT/server/embps-server.service
missing=
for want in 'Type=notify' 'LimitNOFILE=' 'NoNewPrivileges=yes' 'ProtectSystem=strict' \
            'StateDirectory=embps' '--data-dir %S/embps/data' '--metrics-listen' \
            '--checkpoint-every ' '--checkpoint-log-bytes auto' 'UMask=0077' 'SystemCallFilter=@system-service' \
            'MemoryDenyWriteExecute=yes' 'ProtectClock=yes' 'ProtectKernelLogs=yes' \
            'ProtectHostname=yes' 'ProtectProc=invisible' 'ProcSubset=pid' \
            'RestrictRealtime=yes' '#LoadCredential=token:' '--auth-token-file %d/token' \
            'ExecStart=/opt/embps/bin/embps-server' 'ExecReload=/bin/kill -HUP $MAINPID'; do
  grep -qF -- "$want" "$UNIT" || missing="$missing $want"
done
[ -z "$missing" ] && ok "systemd unit has its settings" || bad "systemd unit has its settings" "missing:$missing"
if command -v systemd-analyze >/dev/null && [ -n "$SERVER" ]; then
  sed "s|/opt/embps/bin/embps-server|$SERVER|" "$UNIT" >"$TMP/embps-server.service"
  check "systemd-analyze verify embps-server.service" \
    systemd-analyze verify --man=no "$TMP/embps-server.service"
  # the token variant its comments describe: LoadCredential= and the
  # commented ExecStart= in place of the first
  $PY - "$TMP/embps-server.service" >"$TMP/token/embps-server.service" 2>"$TMP/out" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
first = re.search(r"^ExecStart=.*?[^\\]\n", s, re.M | re.S)
s = s[:first.start()] + s[first.end():]
s = re.sub(r"^#(LoadCredential=.*\n)", r"\1", s, flags=re.M)
s = re.sub(r"^#(ExecStart=.*?\n)((?:#  .*\n)*)",
           lambda m: m.group(1) + re.sub(r"^#", "", m.group(2), flags=re.M),
           s, flags=re.M)
assert s.count("\nExecStart=") == 1 and "\nLoadCredential=token:" in s, s
print(s, end="")
PY
  check "systemd-analyze verify: the LoadCredential= variant" \
    systemd-analyze verify --man=no "$TMP/token/embps-server.service"
  exposure=$(systemd-analyze security --offline=yes "$TMP/embps-server.service" 2>/dev/null |
             sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
  awk -v e="${exposure:-99}" 'BEGIN { exit !(e <= 2.0) }' &&
    ok "systemd-analyze security: exposure $exposure (at most 2.0)" ||
    bad "systemd-analyze security: exposure at most 2.0" "${exposure:-none}"
fi

# every flag the deployment files give embps-server is one its --help
# lists: the systemd unit's ExecStart, the image's CMD, the compose
# services' commands, the StatefulSet's start script (run as above, with a
# stub server)
if [ -n "$SERVER" ]; then
  "$SERVER" --help >"$TMP/server.help"
  check "deployment files: every embps-server flag is one --help lists" \
    $PY - "$TMP/server.help" "$UNIT" "$D/Dockerfile" "$D/compose.yaml" \
    "$D/k8s/statefulset.yaml" "$TMP" <<'PY'
import json, os, re, subprocess, sys, yaml
help_text, unit, dockerfile, compose, sts_file, tmp = sys.argv[1:]
known = set(re.findall(r"^\s+(--[a-z0-9-]+)", open(help_text).read(), re.M))
assert len(known) > 20, known
used = {}
execstart = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", open(unit).read(), re.M)
used["systemd unit"] = re.findall(r"(?<!\S)(--[a-z0-9-]+)", execstart.group(1))
df = re.sub(r"\\\n", " ", open(dockerfile).read())
cmd = json.loads(re.search(r"^CMD (\[.*\])$", df, re.M).group(1))
used["image CMD"] = [a for a in cmd if a.startswith("--")]
for name, svc in yaml.safe_load(open(compose))["services"].items():
    cmd = svc.get("command")
    if isinstance(cmd, list) and cmd and str(cmd[0]).startswith("--"):
        used["compose " + name] = [a for a in cmd if str(a).startswith("--")]
sts = next(d for d in yaml.safe_load_all(open(sts_file))
           if d and d["kind"] == "StatefulSet")
c = sts["spec"]["template"]["spec"]["containers"][0]
stub = os.path.join(tmp, "embps-server")
with open(stub, "w") as f:
    f.write('#!/bin/sh\nprintf "%s\\n" "$@"\n')
os.chmod(stub, 0o755)
env = {e["name"]: e["value"] for e in c["env"]}
env.update(HOSTNAME=sts["metadata"]["name"] + "-0", PATH=tmp + ":/usr/bin:/bin")
args = subprocess.run(c["command"] + c["args"], env=env, check=True,
                      capture_output=True, text=True).stdout.split("\n")
used["StatefulSet"] = [a for a in args if a.startswith("--")]
fol = next(d for d in yaml.safe_load_all(open(os.path.join(os.path.dirname(sts_file),
                                                           "followers.yaml")))
           if d and d["kind"] == "StatefulSet")
fc = fol["spec"]["template"]["spec"]["containers"][0]
env.update(HOSTNAME=fol["metadata"]["name"] + "-0")
args = subprocess.run(fc["command"] + fc["args"], env=env, check=True,
                      capture_output=True, text=True).stdout.split("\n")
used["follower StatefulSet"] = [a for a in args if a.startswith("--")]
assert all(used.values()) and len(used) >= 4, used
unknown = {k: sorted(set(v) - known) for k, v in used.items() if set(v) - known}
assert not unknown, unknown
PY
fi

# the formula: the fenced lines after "Bytes per row" in each README
formula() { awk '/Bytes per row/{f=1} f && /^```/{n++; next} f && n==1' "$1"; }
formula "$ROOT/README.md" >"$TMP/f1"
formula "$D/README.md" >"$TMP/f2"
if [ -s "$TMP/f1" ] && cmp -s "$TMP/f1" "$TMP/f2"; then
  ok "README.md and docker/README.md: the same bytes-per-row formula"
else
  bad "README.md and docker/README.md: the same bytes-per-row formula" \
    "$(diff "$TMP/f1" "$TMP/f2")"
fi
# what /readyz checks: the same paragraph in both READMEs
readyz_para() {
  $PY -c '
import re, sys
t = " ".join(open(sys.argv[1]).read().split())
m = re.search(r"`/readyz` answers 200 when .*?data dir restored\.", t)
print(m.group(0) if m else "")' "$1"
}
readyz_para "$ROOT/README.md" >"$TMP/r1"
readyz_para "$D/README.md" >"$TMP/r2"
if [ -n "$(cat "$TMP/r1")" ] && cmp -s "$TMP/r1" "$TMP/r2"; then
  ok "README.md and docker/README.md: the same /readyz paragraph"
else
  bad "README.md and docker/README.md: the same /readyz paragraph" \
    "$(cat "$TMP/r1")" "$(cat "$TMP/r2")"
fi
finish
