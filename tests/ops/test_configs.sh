#!/usr/bin/env bash
# test_configs.sh ROOT [SERVER] - offline checks of the deployment files:
# yamllint of docker/; every pod spec of both Kubernetes layouts (docker/k8s:
# members elected in etcd, with etcd.yaml; docker/k8s/manual: hand-promoted
# followers) meets the restricted Pod Security Standard, probes over HTTP
# (embps: /readyz, /healthz; etcd: /health), keeps its data on a claim, and
# (embps) mounts its token Secret as required with defaultMode 0440 and an
# fsGroup, with periodic checkpoints; every StatefulSet has a headless
# Service, a PodDisruptionBudget of one pod and a NetworkPolicy admitting
# only workers and servers to 7070, Prometheus to 9464, and (etcd) the
# servers to 2379 and its members to 2380; the coordinated members are
# numbered from 0, alike but for that number, two servers each kept apart
# by a required anti-affinity, each pod's start script electing in
# etcd.yaml's etcd with its own DNS name advertised and --sync-followers 1;
# etcd's flags are ones `etcd --help` lists, its initial cluster every pod;
# both kustomizations render (kubectl kustomize, when installed); both
# compose files and the image default to a token and a data dir (no
# --insecure anywhere), compose.etcd.yaml's servers coordinated through its
# etcd, its demo listing both servers of each member; the image is pinned,
# labelled, health-checked and built FROM scratch; the Prometheus config
# (with its alert rules) passes promtool and every Grafana panel's query
# parses; the systemd unit passes systemd-analyze verify (ExecStart pointed
# at SERVER when given) with the settings it must have; every flag these
# files give the server is one its --help lists (SERVER given); README.md
# and docker/README.md give the same bytes-per-row formula and /readyz
# paragraph; the manual StatefulSet's start script builds --cluster-servers
# and passes the token and checkpoint flags.
set -u
ROOT=$1
SERVER=${2:-}
TMP=$(mktemp -d /tmp/embps-configs-test.XXXXXX)
mkdir "$TMP/token"
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
D=$ROOT/docker

check "yamllint docker/" yamllint -s -c "$D/yamllint.yaml" "$D/k8s" "$D/compose.yaml" \
  "$D/compose.etcd.yaml" "$D/monitoring"

# every pod spec of both layouts: docker/k8s (coordinated, with etcd) and
# docker/k8s/manual (hand-promoted followers, no etcd)
for layout in k8s k8s/manual; do
check "$layout: restricted Pod Security Standard, HTTP probes, claims, auth on, NetworkPolicy" \
  $PY - "$D/$layout" <<'PY'
import glob, os, sys, yaml
files = sorted(glob.glob(sys.argv[1] + "/*.yaml"))
docs = [d for f in files for d in yaml.safe_load_all(open(f)) if d]
kinds = {d["kind"] for d in docs if "kind" in d}
assert {"StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy"} <= kinds, kinds
kust = yaml.safe_load(open(sys.argv[1] + "/kustomization.yaml"))
assert set(kust["resources"]) == {os.path.basename(f) for f in files} - \
    {"kustomization.yaml"}, ("every manifest in kustomization.yaml", kust["resources"])
docs = [d for d in docs if d["kind"] != "Kustomization"]
sets = []  # the StatefulSets' pod labels
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
for d in docs:
    if d["kind"] not in ("StatefulSet", "Deployment", "Pod"):
        continue
    pod = d["spec"]["template"]["spec"] if d["kind"] != "Pod" else d["spec"]
    labels = d["spec"]["template"]["metadata"]["labels"]
    embps = labels["app.kubernetes.io/name"] in ("embps", "embps-follower")
    psc = pod.get("securityContext", {})
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), d
    for v in pod.get("volumes", []):
        kind = set(v) - {"name"}
        assert kind <= ALLOWED_VOLUMES, ("volume type not allowed", v)
    assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", psc
    assert psc.get("fsGroup") and psc.get("runAsUser", 0) != 0, psc
    assert pod.get("automountServiceAccountToken") is False, d["metadata"]["name"]
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c.get("securityContext", {})
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
        assert not set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}
        assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, c["name"]
        assert sc.get("runAsUser", psc.get("runAsUser", 1)) != 0
        assert not sc.get("privileged"), c["name"]
        assert sc.get("readOnlyRootFilesystem") is True, c["name"]
        assert sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type") \
            in ("RuntimeDefault", "Localhost")
        assert all("hostPort" not in p for p in c.get("ports", [])), c["name"]
        named = {p["name"] for p in c["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["port"] in named, (c["name"], probe)
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        r = c["resources"]
        assert r["requests"]["memory"] == r["limits"]["memory"], r
        if not embps:  # etcd: its data dir on its claim, probed on /health
            assert c["readinessProbe"]["httpGet"]["path"] == "/health", c["name"]
            assert c["livenessProbe"]["httpGet"]["path"] == "/health", c["name"]
            dd = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--data-dir=")]
            assert dd and any(dd[0].startswith(m + "/") and n == "data"
                              for m, n in mounts.items()), (dd, mounts)
            continue
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", c["name"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", c["name"]
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz", c["name"]
        assert mounts.get("/var/lib/embps") == "data", mounts
        args = " ".join(c.get("args", []))
        assert "--data-dir /var/lib/embps" in args, c["name"]
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
    if d["kind"] == "StatefulSet":
        t = [v["metadata"]["name"] for v in d["spec"]["volumeClaimTemplates"]]
        assert t == ["data"], t
        aa = pod["affinity"]["podAntiAffinity"]
        terms = aa.get("requiredDuringSchedulingIgnoredDuringExecution", [])
        assert terms and terms[0]["topologyKey"] == "kubernetes.io/hostname", aa
        sel = d["spec"]["selector"]["matchLabels"]
        assert all(labels.get(k) == v for k, v in sel.items()), (sel, labels)
        svc = [s for s in docs if s["kind"] == "Service" and
               s["metadata"]["name"] == d["spec"]["serviceName"]]
        assert svc and svc[0]["spec"]["clusterIP"] == "None", "a headless Service"
        assert svc[0]["spec"]["publishNotReadyAddresses"] is True
        assert all(labels.get(k) == v for k, v in svc[0]["spec"]["selector"].items())
        # a PodDisruptionBudget of one pod at a time, for exactly these pods
        pdbs = [p["spec"] for p in docs if p["kind"] == "PodDisruptionBudget" and
                p["spec"]["selector"]["matchLabels"] == sel]
        assert len(pdbs) == 1 and pdbs[0]["maxUnavailable"] == 1, (sel, pdbs)
        sets.append(labels)
# a NetworkPolicy for every StatefulSet's pods: only ingress rules with a
# source each; the embps protocol port from workers and the embps servers
# (members ask each other; followers fetch from their primaries), metrics
# from Prometheus, nothing else; etcd's client port from the embps servers
nps = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]
for labels in sets:
    assert any(all(labels.get(k) == v for k, v in n["podSelector"]["matchLabels"].items())
               for n in nps), ("no NetworkPolicy selects", labels)
sel = lambda f: f.get("podSelector", {}).get("matchLabels", {})
for np in nps:
    assert np["policyTypes"] == ["Ingress"], np["policyTypes"]
    allowed = {}
    for rule in np["ingress"]:
        assert rule.get("from"), ("a rule without a source admits everyone", rule)
        for p in rule["ports"]:
            allowed.setdefault(p["port"], []).extend(rule["from"])
    assert [sel(f).get("app.kubernetes.io/name") for f in allowed["metrics"]] == ["prometheus"]
    if np["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "embps-etcd":
        assert set(allowed) == {"client", "peer", "metrics"}, allowed
        assert [sel(f) for f in allowed["client"]] == [{"app.kubernetes.io/name": "embps"}]
        assert [sel(f) for f in allowed["peer"]] == [{"app.kubernetes.io/name": "embps-etcd"}]
        continue
    assert set(allowed) == {"embps", "metrics"}, allowed
    assert {"embps-client": "true"} in [sel(f) for f in allowed["embps"]], allowed["embps"]
    assert {"app.kubernetes.io/name": "embps"} in [sel(f) for f in allowed["embps"]], \
        "the primaries reach every server"
if any(l["app.kubernetes.io/name"] == "embps-follower" for l in sets):
    primaries = [n for n in nps if n["podSelector"]["matchLabels"] ==
                 {"app.kubernetes.io/name": "embps"}][0]
    assert {"app.kubernetes.io/name": "embps-follower"} in \
        [sel(f) for r in primaries["ingress"] for f in r["from"]], "followers fetch"
PY
done

# the coordinated members (docker/k8s/members.yaml): one StatefulSet of two
# servers per member, numbered from 0, the same but for that number; each
# pod's start script (run as every pod, with a stub server) elects in the
# etcd of etcd.yaml, advertises its own DNS name, acknowledges through its
# follower; the anti-affinity keeps a member's servers apart
check "k8s: per member two coordinated servers, apart, one PodDisruptionBudget, etcd's URLs" \
  $PY - "$D/k8s" "$TMP" <<'PY'
import copy, os, re, subprocess, sys, yaml
k8s, tmp = sys.argv[1:3]
docs = [d for f in ("members.yaml", "etcd.yaml", "service.yaml")
        for d in yaml.safe_load_all(open(os.path.join(k8s, f))) if d]
members = [d for d in docs if d["kind"] == "StatefulSet" and
           d["metadata"]["labels"]["app.kubernetes.io/name"] == "embps"]
etcd = next(d for d in docs if d["kind"] == "StatefulSet" and d not in members)
n = len(members)
assert n >= 2, n
assert [m["metadata"]["name"] for m in members] == ["embps-%d" % i for i in range(n)]
def generic(obj):  # the member's number taken out of its name and labels
    g = copy.deepcopy(obj)
    spec = g["spec"]
    aa = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    for labels in (g["metadata"]["labels"], spec["selector"]["matchLabels"],
                   spec["template"]["metadata"]["labels"],
                   aa["requiredDuringSchedulingIgnoredDuringExecution"][0]
                   ["labelSelector"]["matchLabels"]):
        labels["embps-member"] = "I"
    g["metadata"]["name"] = "embps-I"
    return g
assert all(generic(m) == generic(members[0]) for m in members), \
    "every member the same but for its number"
pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget" and
        d["metadata"]["labels"]["app.kubernetes.io/name"] == "embps"]
assert len(pdbs) == n, ("a PodDisruptionBudget per member", len(pdbs))
stub = os.path.join(tmp, "embps-server")
with open(stub, "w") as f:
    f.write('#!/bin/sh\nprintf "%s\\n" "$@"\n')
os.chmod(stub, 0o755)
etcd_urls = ",".join("%s-%d.%s:2379" % (etcd["metadata"]["name"], j,
                                         etcd["spec"]["serviceName"])
                     for j in range(etcd["spec"]["replicas"]))
for i, m in enumerate(members):
    sel = {"app.kubernetes.io/name": "embps", "embps-member": str(i)}
    assert m["spec"]["selector"]["matchLabels"] == sel, m["spec"]["selector"]
    assert m["spec"]["replicas"] == 2, "two servers per member"
    assert [p["spec"]["selector"]["matchLabels"] for p in pdbs
            if p["metadata"]["name"] == "embps-%d" % i] == [sel]
    pod = m["spec"]["template"]["spec"]
    aa = pod["affinity"]["podAntiAffinity"]
    req = aa["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["topologyKey"], t["labelSelector"]["matchLabels"]) for t in req] == \
        [("kubernetes.io/hostname", sel)], ("a member's servers never share a node", req)
    pref = aa["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["podAffinityTerm"]["labelSelector"]["matchLabels"] for t in pref] == \
        [{"app.kubernetes.io/name": "embps"}], ("spread across members", pref)
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert int(env["EMBPS_CLUSTER_SIZE"]) == n, (env, n)
    assert env["EMBPS_COORDINATOR"] == "etcd://" + etcd_urls, env["EMBPS_COORDINATOR"]
    assert int(env["EMBPS_LEASE_MS"]) >= 2000, "etcd's minimum TTL is 2 s"
    # a follower restarting (about a lease) must not degrade the member
    assert int(env["EMBPS_SYNC_DEGRADE_MS"]) >= 2 * int(env["EMBPS_LEASE_MS"]), env
    for j in range(m["spec"]["replicas"]):
        name = "embps-%d-%d" % (i, j)
        e = dict(env, HOSTNAME=name, PATH=tmp + ":/usr/bin:/bin")
        args = subprocess.run(c["command"] + c["args"], env=e, check=True,
                              capture_output=True, text=True).stdout.split("\n")
        v = lambda f: args[args.index(f) + 1]
        assert v("--coordinator") == "etcd://" + etcd_urls, args
        assert v("--cluster-name") == env["EMBPS_CLUSTER_NAME"], args
        assert v("--member") == v("--cluster-index") == str(i), args
        assert v("--cluster-size") == str(n), args
        assert v("--advertise") == "%s.%s:7070" % (name, m["spec"]["serviceName"]), args
        assert v("--sync-followers") == "1", args
        assert v("--lease-ms") == env["EMBPS_LEASE_MS"], args
        assert v("--sync-degrade-ms") == env["EMBPS_SYNC_DEGRADE_MS"], args
        assert v("--cluster-servers") == ",".join("embps-%d-0.embps:7070" % k
                                                  for k in range(n)), args
        assert v("--auth-token-file") == "/etc/embps/auth/token", args
        assert "--follow" not in args and "--insecure" not in args, args
# the workers' list in the comments: every member, its servers by |
text = open(os.path.join(k8s, "members.yaml")).read()
m = re.search(r"EMBPS_SERVERS=(\S+),\n#\s+(\S+),\n#\s+(\S+)\s", text)
assert m and ",".join(m.groups()) == ",".join(
    "embps-%d-0.embps:7070|embps-%d-1.embps:7070" % (i, i) for i in range(n)), m
PY

# etcd.yaml: the three members name each other in --initial-cluster by the
# headless Service, each flag one `etcd --help` lists
if command -v etcd >/dev/null; then
  etcd --help >"$TMP/etcd.help" 2>&1
  check "k8s and compose: etcd's flags are etcd's, its initial cluster every pod of the Service" \
    $PY - "$D/k8s/etcd.yaml" "$D/compose.etcd.yaml" "$TMP/etcd.help" <<'PY'
import re, sys, yaml
sts = next(d for d in yaml.safe_load_all(open(sys.argv[1]))
           if d and d["kind"] == "StatefulSet")
compose = yaml.safe_load(open(sys.argv[2]))
known = set(re.findall(r"^\s+(--[a-z0-9-]+)", open(sys.argv[3]).read(), re.M))
assert len(known) > 40, known
c = sts["spec"]["template"]["spec"]["containers"][0]
args = dict(a.split("=", 1) for a in c["args"])
flags = {"etcd.yaml": set(args),
         "compose etcd": {a for a in compose["services"]["etcd"]["command"][1:]
                          if a.startswith("--")}}
unknown = {k: sorted(v - known) for k, v in flags.items() if v - known}
assert not unknown, unknown
name, svc = sts["metadata"]["name"], sts["spec"]["serviceName"]
want = ",".join("%s-%d=http://%s-%d.%s:2380" % (name, i, name, i, svc)
                for i in range(sts["spec"]["replicas"]))
assert args["--initial-cluster"] == want, args["--initial-cluster"]
assert args["--initial-advertise-peer-urls"] == "http://$(POD_NAME).%s:2380" % svc
assert args["--advertise-client-urls"] == "http://$(POD_NAME).%s:2379" % svc
assert args["--name"] == "$(POD_NAME)"
assert [e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]
        if e["name"] == "POD_NAME"] == ["metadata.name"]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
assert args["--listen-client-urls"].endswith(":%d" % ports["client"])
assert args["--listen-peer-urls"].endswith(":%d" % ports["peer"])
assert args["--listen-metrics-urls"].endswith(":%d" % ports["metrics"])
assert sts["spec"]["podManagementPolicy"] == "Parallel", "the bootstrap needs a quorum"
assert sts["spec"]["replicas"] % 2 == 1, "an odd number of members"
PY
else
  bad "etcd installed (apt-get install etcd-server)"
fi

# both kustomizations render as their files say (kubectl's own kustomize,
# offline), when kubectl is installed
if command -v kubectl >/dev/null; then
  for layout in k8s k8s/manual; do
    if kubectl kustomize "$D/$layout" >"$TMP/render.yaml" 2>"$TMP/out"; then
      check "kubectl kustomize docker/$layout: every object of its files" \
        $PY - "$D/$layout" "$TMP/render.yaml" <<'PY'
import sys, yaml
kust = yaml.safe_load(open(sys.argv[1] + "/kustomization.yaml"))
files = [d for f in kust["resources"]
         for d in yaml.safe_load_all(open(sys.argv[1] + "/" + f)) if d]
out = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
key = lambda d: (d["kind"], d["metadata"]["name"])
assert sorted(map(key, out)) == sorted(map(key, files)), (sorted(map(key, out)))
assert all(d == {key(f): f for f in files}[key(d)] for d in out)
PY
    else
      bad "kubectl kustomize docker/$layout" "$(cat "$TMP/out")"
    fi
  done
else
  echo "# kubectl not installed: kustomize rendering not checked"
fi

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

# compose.etcd.yaml: per member two servers elected in its etcd, each
# advertising its service name, acknowledging through the other; the demo
# lists both servers of every member, in member order
check "compose.etcd: an etcd, two coordinated servers per member, the demo lists both" \
  $PY - "$D/compose.etcd.yaml" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
servers = {n: s for n, s in c["services"].items() if n.startswith("embps-")}
assert sorted(servers) == ["embps-%d-%d" % (i, j) for i in range(3) for j in range(2)], \
    list(servers)
etcd = c["services"]["etcd"]
assert etcd["command"][0] == "/usr/local/bin/etcd" and etcd["healthcheck"]["test"], etcd
assert "etcd-data:/var/lib/etcd" in etcd["volumes"], etcd["volumes"]
hostports = set()
for n, s in servers.items():
    i, j = n.split("-")[1:]
    a = s["command"]
    v = lambda f: a[a.index(f) + 1]
    assert v("--coordinator") == "etcd://etcd:2379", n
    assert v("--cluster-index") == v("--member") == i and v("--cluster-size") == "3", n
    assert v("--advertise") == n + ":7070" and v("--sync-followers") == "1", n
    # twice the default lease (3 s): a restarting follower does not degrade
    assert "--lease-ms" not in a and v("--sync-degrade-ms") == "6000", n
    assert v("--cluster-servers") == "embps-0-0:7070,embps-1-0:7070,embps-2-0:7070", n
    assert v("--auth-token-file") == "/etc/embps/auth/token", n
    assert v("--data-dir") == "/var/lib/embps" and "--checkpoint-every" in a, n
    assert "--insecure" not in a and "--follow" not in a, n
    assert "data-%s-%s:/var/lib/embps" % (i, j) in s["volumes"], s["volumes"]
    assert "auth:/etc/embps/auth:ro" in s["volumes"], s["volumes"]
    assert s["depends_on"]["etcd"]["condition"] == "service_healthy", n
    assert s["depends_on"]["token"]["condition"] == "service_completed_successfully"
    assert all(p.startswith("127.0.0.1:") for p in s["ports"]), s["ports"]
    hostports |= set(s["ports"])
assert len(hostports) == 12, hostports
t = c["services"]["token"]
assert t["user"] == "0:10001" and "umask 0227" in t["command"][0], t
demo = c["services"]["demo"]["environment"]
assert demo["EMBPS_SERVERS"] == ",".join("embps-%d-0:7070|embps-%d-1:7070" % (i, i)
                                         for i in range(3)), demo
assert demo["EMBPS_TOKEN_FILE"] == "/etc/embps/auth/token"
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
check "k8s: pod embps-1 gets --cluster-servers of every pod, slot 1, the token" $PY - "$D/k8s/manual/statefulset.yaml" "$TMP" <<'PY'
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
  $PY - "$D/k8s/manual/followers.yaml" "$TMP" <<'PY'
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
# lists: the systemd unit's ExecStart, the image's CMD, both compose files'
# services' commands, the start scripts of the manual StatefulSets and of
# every pod of every member (run as above, with a stub server)
if [ -n "$SERVER" ]; then
  "$SERVER" --help >"$TMP/server.help"
  check "deployment files: every embps-server flag is one --help lists" \
    $PY - "$TMP/server.help" "$UNIT" "$D/Dockerfile" "$D/compose.yaml" \
    "$D/k8s/manual/statefulset.yaml" "$TMP" "$D/compose.etcd.yaml" \
    "$D/k8s/members.yaml" <<'PY'
import json, os, re, subprocess, sys, yaml
help_text, unit, dockerfile, compose, sts_file, tmp, compose2, members = sys.argv[1:]
known = set(re.findall(r"^\s+(--[a-z0-9-]+)", open(help_text).read(), re.M))
assert len(known) > 20, known
used = {}
execstart = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", open(unit).read(), re.M)
used["systemd unit"] = re.findall(r"(?<!\S)(--[a-z0-9-]+)", execstart.group(1))
df = re.sub(r"\\\n", " ", open(dockerfile).read())
cmd = json.loads(re.search(r"^CMD (\[.*\])$", df, re.M).group(1))
used["image CMD"] = [a for a in cmd if a.startswith("--")]
for f in (compose, compose2):
    for name, svc in yaml.safe_load(open(f))["services"].items():
        cmd = svc.get("command")
        if isinstance(cmd, list) and cmd and str(cmd[0]).startswith("--"):
            used[os.path.basename(f) + " " + name] = \
                [a for a in cmd if str(a).startswith("--")]
assert len(used) == 2 + 6 + 6, used
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
for m in yaml.safe_load_all(open(members)):
    if not m or m["kind"] != "StatefulSet":
        continue
    mc = m["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in mc["env"]}
    for j in range(m["spec"]["replicas"]):
        pod = "%s-%d" % (m["metadata"]["name"], j)
        env.update(HOSTNAME=pod, PATH=tmp + ":/usr/bin:/bin")
        args = subprocess.run(mc["command"] + mc["args"], env=env, check=True,
                              capture_output=True, text=True).stdout.split("\n")
        used["pod " + pod] = [a for a in args if a.startswith("--")]
assert all(used.values()) and len(used) >= 4 + 6 + 6, used
assert "--coordinator" in used["pod embps-1-1"], used["pod embps-1-1"]
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
