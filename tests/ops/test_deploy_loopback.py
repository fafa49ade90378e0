#!/usr/bin/env python3
"""test_deploy_loopback.py ROOT SERVER CLI ETCD - docker/k8s run on loopback,
without Kubernetes: the processes its manifests start, with their flags.

Each pod gets a loopback address of its own (127.0.0.x, as a pod network
gives each pod an IP) and its DNS name maps to it; every port of the
manifests (7070, 9464, 2379, 2380, 2381) becomes one free port, the same on
every address. Then:
- the three etcd members of etcd.yaml, started with its args ($(POD_NAME)
  substituted as the kubelet does), form a cluster: each answers its probe
  (the probe's path on the probe's port) with 200;
- the six embps servers of members.yaml, started by running the pods' start
  script (HOSTNAME embps-I-J, the template's env; a data dir and a token
  file of their own), elect one primary per member, and every server's
  /readyz is 200 (primary: serving; follower: in sync);
- the workers' server list of the manifests' comments (names mapped)
  creates a table, pushes and pulls;
- kill -9 of member 1's primary, left down: the follower is elected within
  the manifests' lease + 2 s, its /healthz 200 all along (liveness would
  never restart it); member 1's part of a push is refused, unapplied,
  while it has no follower (--sync-followers 1), the other members'
  applied (a push across members is not atomic); once it has had none for
  --sync-degrade-ms it is degraded (recorded in etcd) and a push is
  acknowledged without its follower;
- the killed server started again with the same flags: a push through the
  workers' list acknowledged, the server ready as a follower of the new
  primary;
- kill -9 of the new primary and an immediate restart (what the kubelet
  does to a crashed container): a push acknowledged within the lease + 2 s;
- kill -9 of member 1's follower, left down: a push (retried by the
  library) acknowledged once the primary degraded, after --sync-degrade-ms;
- after each, every row holds exactly the acknowledged pushes.
A fresh CLI that finds no primary among a member's servers (an election
under way) fails before sending anything; the pushes that measure a
failover are run again until their deadline.
Prints "N passed, N failed" last."""
import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

ROOT, SERVER, CLI, ETCD = sys.argv[1:5]
K8S = os.path.join(ROOT, "docker", "k8s")
TMP = tempfile.mkdtemp(prefix="embps-deploy-test.")
PROCS = {}
results = [0, 0]


def check(name, cond, detail=""):
    results[0 if cond else 1] += 1
    print(("ok - " if cond else "FAIL - ") + name)
    if not cond and detail:
        print("    " + str(detail).replace("\n", "\n    "))
    return cond


def cleanup():
    """Every process started here killed, TMP removed (EMBPS_KEEP_TMP: kept);
    also at exit on an exception, so none outlives the test."""
    for p in PROCS.values():
        if p.poll() is None:
            p.kill()
            p.wait()
    if not os.environ.get("EMBPS_KEEP_TMP"):
        shutil.rmtree(TMP, ignore_errors=True)
    elif os.path.isdir(TMP):
        print("# kept " + TMP)


atexit.register(cleanup)


def finish():
    cleanup()
    print("%d passed, %d failed" % tuple(results))
    sys.exit(1 if results[1] else 0)


def docs(name):
    return [d for d in yaml.safe_load_all(open(os.path.join(K8S, name))) if d]


def free_port(hosts):
    """A port free on every address of hosts (bound and released)."""
    for _ in range(100):
        s = socket.socket()
        s.bind((hosts[0], 0))
        port = s.getsockname()[1]
        s.close()
        try:
            for h in hosts:
                t = socket.socket()
                t.bind((h, port))
                t.close()
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every address")


def http(url):
    """(status, body) of a GET, (0, why) when it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def wait(cond, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    return cond()


def probe_port(container, probe):
    port = container[probe]["httpGet"]["port"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    return named.get(port, port), container[probe]["httpGet"]["path"]


# ---- addresses: one loopback address per pod
etcd_sts = next(d for d in docs("etcd.yaml") if d["kind"] == "StatefulSet")
members = [d for d in docs("members.yaml") if d["kind"] == "StatefulSet"]
etcd_pods = ["%s-%d" % (etcd_sts["metadata"]["name"], i)
             for i in range(etcd_sts["spec"]["replicas"])]
embps_pods = ["%s-%d" % (m["metadata"]["name"], j)
              for m in members for j in range(m["spec"]["replicas"])]
ip = {}
for n, pod in enumerate(etcd_pods):
    ip[pod] = "127.0.0.%d" % (11 + n)
for n, pod in enumerate(embps_pods):
    ip[pod] = "127.0.0.%d" % (21 + n)
ports = {}  # the manifests' port -> the port used here
for p in (2379, 2380, 2381):
    ports[p] = free_port([ip[x] for x in etcd_pods])
for p in (7070, 9464):
    ports[p] = free_port([ip[x] for x in embps_pods])
etcd_svc = etcd_sts["spec"]["serviceName"]
embps_svc = members[0]["spec"]["serviceName"]


def addr(host_port, pod=None):
    """NAME.SERVICE:PORT or 0.0.0.0:PORT (of pod) -> loopback address."""
    host, port = host_port.rsplit(":", 1)
    if host == "0.0.0.0":
        host = ip[pod]
    else:
        name = host.split(".")[0]
        # a pod that is not run here: an address nobody listens on
        host = ip.get(name, "127.0.0.254")
    return "%s:%d" % (host, ports.get(int(port), int(port)))


def map_urls(text, pod=None):
    return re.sub(r"(?<=://)([A-Za-z0-9.-]+:\d+)",
                  lambda m: addr(m.group(1), pod), text)


# ---- etcd: etcd.yaml's args
c = etcd_sts["spec"]["template"]["spec"]["containers"][0]
for pod in etcd_pods:
    args = []
    for a in c["args"]:
        a = a.replace("$(POD_NAME)", pod)
        if a.startswith("--data-dir="):
            a = "--data-dir=" + os.path.join(TMP, pod)
        args.append(map_urls(a, pod))
    log = open(os.path.join(TMP, pod + ".log"), "w")
    PROCS[pod] = subprocess.Popen([ETCD] + args, stdout=log, stderr=log)
hport, hpath = probe_port(c, "readinessProbe")
up = wait(lambda: all(http("http://%s:%d%s" % (ip[p], ports[hport], hpath))[0]
                      == 200 for p in etcd_pods), 30)
check("etcd.yaml: %d members from its args form a cluster, each %s 200"
      % (len(etcd_pods), hpath), up,
      open(os.path.join(TMP, etcd_pods[0] + ".log")).read()[-2000:])
if not up:
    finish()

# ---- embps: members.yaml's start script, per pod
token = os.path.join(TMP, "token")
with open(token, "w") as f:
    f.write("deploy-test-token\n")
os.chmod(token, 0o600)
stub_dir = os.path.join(TMP, "stub")
os.mkdir(stub_dir)
with open(os.path.join(stub_dir, "embps-server"), "w") as f:
    f.write('#!/bin/sh\nprintf "%s\\n" "$@"\n')
os.chmod(os.path.join(stub_dir, "embps-server"), 0o755)


def server_args(sts, pod):
    """The flags pod's start script gives embps-server, mapped here."""
    ctr = sts["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in ctr["env"]}
    env.update(HOSTNAME=pod, PATH=stub_dir + ":/usr/bin:/bin")
    out = subprocess.run(ctr["command"] + ctr["args"], env=env, check=True,
                         capture_output=True, text=True).stdout
    args = out.split("\n")[:-1]
    for i, a in enumerate(args[:-1]):
        v = args[i + 1]
        if a in ("--listen", "--metrics-listen", "--advertise"):
            args[i + 1] = addr(v, pod)
        elif a == "--cluster-servers":
            args[i + 1] = ",".join("|".join(addr(s) for s in m.split("|"))
                                   for m in v.split(","))
        elif a == "--coordinator":
            args[i + 1] = "etcd://" + ",".join(
                addr(s) for s in v[len("etcd://"):].split(","))
        elif a == "--data-dir":
            args[i + 1] = os.path.join(TMP, pod)
        elif a == "--auth-token-file":
            args[i + 1] = token
    return args


ARGS = {}
for sts in members:
    for j in range(sts["spec"]["replicas"]):
        pod = "%s-%d" % (sts["metadata"]["name"], j)
        ARGS[pod] = server_args(sts, pod)


def start(pod):
    log = open(os.path.join(TMP, pod + ".log"), "a")
    PROCS[pod] = subprocess.Popen([SERVER] + ARGS[pod], stdout=log,
                                  stderr=subprocess.STDOUT)


for pod in embps_pods:
    start(pod)
lease_ms = int(ARGS[embps_pods[0]][ARGS[embps_pods[0]].index("--lease-ms") + 1])
degrade_ms = int(ARGS[embps_pods[0]][ARGS[embps_pods[0]].index("--sync-degrade-ms") + 1])
c = members[0]["spec"]["template"]["spec"]["containers"][0]
rport, rpath = probe_port(c, "readinessProbe")
lport, lpath = probe_port(c, "livenessProbe")


def probe(pod, port, path):
    return http("http://%s:%d%s" % (ip[pod], ports[port], path))


# the workers' list: the manifests' comment, names mapped
m = re.search(r"EMBPS_SERVERS=(\S+),\n#\s+(\S+),\n#\s+(\S+)",
              open(os.path.join(K8S, "members.yaml")).read())
servers = ",".join("|".join(addr(s) for s in e.split("|"))
                   for e in (m.group(1) + "," + m.group(2) + "," + m.group(3))
                   .split(","))
env = dict(os.environ, EMBPS_TOKEN_FILE=token, EMBPS_SERVERS=servers)
env.pop("EMBPS_READ_FOLLOWER", None)


def cli(*a, timeout=30):
    return subprocess.run([CLI] + list(a), env=env, capture_output=True,
                          text=True, timeout=timeout)


def push_until(seconds, value="1"):
    """Pushes 1 to every id's row (each id once) with the workers' list; a
    fresh CLI that finds no primary among a member's servers fails before
    sending anything, so it is run again until the deadline. The last
    result."""
    end = time.monotonic() + seconds
    while True:
        r = cli("push", "t", "--indices", ids, "--values",
                ",".join([value] * 60), timeout=max(1, end - time.monotonic()) + 30)
        if r.returncode == 0 or time.monotonic() > end or \
                not re.search(r"no primary among|cannot connect", r.stderr):
            return r
        time.sleep(0.05)


def primaries():
    """{member: primary address} from stats --json, or None."""
    r = cli("stats", "--json", timeout=10)
    if r.returncode:
        return None
    try:
        return {i: s.get("primary") for i, s in enumerate(json.loads(r.stdout))}
    except ValueError:
        return None


by_addr = {addr(p + "." + embps_svc + ":7070"): p for p in embps_pods}
elected = wait(lambda: (lambda p: p if p and all(v in by_addr for v in p.values())
                        else None)(primaries()), 30)
check("members.yaml: %d servers, one primary elected per member (%s)"
      % (len(embps_pods), elected and ", ".join(by_addr[v] for v in elected.values())),
      elected and len(elected) == len(members),
      "\n".join(open(os.path.join(TMP, p + ".log")).read()[-600:]
                for p in embps_pods[:2]))
if not elected:
    finish()
ready = wait(lambda: all(probe(p, rport, rpath)[0] == 200 for p in embps_pods), 30)
check("every server's %s 200 (primaries serving, followers in sync)" % rpath,
      ready, "; ".join("%s: %s" % (p, probe(p, rport, rpath)) for p in embps_pods))
r = cli("create-table", "t", "--dim", "2", "--rows", "100", "--optimizer", "sgd",
        "--lr", "1")
check("the workers' list of members.yaml: create-table", r.returncode == 0, r.stderr)
ids = ",".join(str(i) for i in range(30))
r = cli("push", "t", "--indices", ids, "--values", ",".join(["1"] * 60))
check("a push through the workers' list", r.returncode == 0, r.stderr)

# ---- kill -9 of member 1's primary, left down
def member_primary():
    p = primaries()
    return p and by_addr.get(p.get(1))


def values():
    r = cli("pull", "t", "--ids", ids)
    return [l.split("\t")[1] for l in r.stdout.splitlines() if "\t" in l]


old = by_addr[elected[1]]
other = next(p for p in embps_pods if p.startswith(old[:-1]) and p != old)
PROCS[old].send_signal(signal.SIGKILL)
PROCS[old].wait()
t0 = time.monotonic()
# the survivor: /readyz 503 until elected, /healthz 200 all along
seen503, health_ok = False, True
while time.monotonic() - t0 < lease_ms / 1000 + 5:
    seen503 |= probe(other, rport, rpath)[0] == 503
    health_ok &= probe(other, lport, lpath)[0] == 200
    if member_primary() == other:
        break
    time.sleep(0.05)
t_elected = time.monotonic() - t0
check("kill -9 of %s: %s elected %.2f s after (lease %d ms: at most lease + 2 s)"
      % (old, other, t_elected, lease_ms),
      member_primary() == other and t_elected <= lease_ms / 1000 + 2,
      open(os.path.join(TMP, other + ".log")).read()[-1500:])
check("meanwhile %s's %s stayed 200 (never restarted), %s %s"
      % (other, lpath, rpath, "503 until elected" if seen503 else "200"), health_ok)
# --sync-followers 1 and no follower: member 1's part of a write waits,
# then is refused unapplied (the other members apply theirs: a push across
# members is not atomic); its writes need its other server back
r = cli("--retry-ms", "0", "push", "t", "--indices", ids, "--values",
        ",".join(["5"] * 60))
v = values()
kept = [i for i, x in enumerate(v) if x == "-1 -1"]
check("with its follower down, member 1's part of a push is refused, nothing "
      "changed there (%d of 30 rows; the other members' applied)" % len(kept),
      r.returncode != 0 and "--sync-followers 1" in r.stderr and kept and
      all(x in ("-1 -1", "-6 -6") for x in v), r.stdout + r.stderr + str(v))


def metric(pod, name):
    st, body = probe(pod, lport, "/metrics")
    m = re.search(r"^%s (\S+)$" % re.escape(name), body, re.M) if st == 200 else None
    return float(m.group(1)) if m else None


# --sync-degrade-ms: once the new primary has had no follower in sync that
# long, it records in etcd that its epoch is degraded and acknowledges alone
deg = wait(lambda: metric(other, "embps_sync_degraded") == 1,
           degrade_ms / 1000 + lease_ms / 1000 + 10)
t_deg = time.monotonic() - t0
r = cli("--retry-ms", "0", "push", "t", "--indices", ids, "--values",
        ",".join(["1"] * 60))
check("its follower still down: %s degraded %.2f s after the kill (lease %d "
      "ms + --sync-degrade-ms %d ms), then a push acknowledged" %
      (other, t_deg, lease_ms, degrade_ms),
      deg and r.returncode == 0 and
      t_deg <= (lease_ms + degrade_ms) / 1000 + 1.5 + 3,
      r.stderr + open(os.path.join(TMP, other + ".log")).read()[-1500:])


def rows_are(n):
    """Member 1's rows -n, the others' -n - 5 (the refused push)."""
    v = values()
    want = ["%d %d" % (-n, -n) if i in kept else "%d %d" % (-n - 5, -n - 5)
            for i in range(30)]
    return v == want, v


# ---- the killed server comes back with the same flags: a follower
t1 = time.monotonic()
start(old)
r = push_until(30)
t_ack = time.monotonic() - t1
check("%s started again: a push acknowledged %.2f s after its start" % (old, t_ack),
      r.returncode == 0, r.stderr)
back = wait(lambda: probe(old, rport, rpath)[0] == 200, 30)
check("%s rejoins as a follower of %s, ready (in sync)" % (old, other),
      back and member_primary() == other,
      "%s\n%s" % (probe(old, rport, rpath),
                  open(os.path.join(TMP, old + ".log")).read()[-1500:]))
ok_, v = rows_are(3)
check("every row: each acknowledged push applied once", ok_, v)

# ---- kill -9 of the new primary and an immediate restart (a crashed
# container, restarted by the kubelet): writes resume within the lease + 2 s
PROCS[other].send_signal(signal.SIGKILL)
PROCS[other].wait()
t0 = time.monotonic()
start(other)
r = push_until(lease_ms / 1000 + 2)
t_ack = time.monotonic() - t0
check("kill -9 of %s and its restart: first push acknowledged %.2f s after the "
      "kill (primary now %s)" % (other, t_ack, member_primary()),
      r.returncode == 0 and t_ack <= lease_ms / 1000 + 2, r.stderr)
ok_, v = rows_are(4)
check("every row: each acknowledged push applied once", ok_, v)

# ---- the follower of member 1 lost for good (its node): one push, retried
# by the library, is acknowledged once the primary has found it out of
# sync (1.5 s) and degraded (--sync-degrade-ms), recorded in etcd
prim = member_primary()
fol = next(p for p in embps_pods if p.startswith(old[:-1]) and p != prim)
PROCS[fol].send_signal(signal.SIGKILL)
PROCS[fol].wait()
t0 = time.monotonic()
r = cli("--retry-ms", "60000", "push", "t", "--indices", ids, "--values",
        ",".join(["1"] * 60), timeout=90)
t_ack = time.monotonic() - t0
check("kill -9 of the follower %s: a push acknowledged %.2f s after, by %s "
      "degraded (--sync-degrade-ms %d ms, plus 1.5 s to find it out of sync)"
      % (fol, t_ack, prim, degrade_ms),
      r.returncode == 0 and metric(prim, "embps_sync_degraded") == 1 and
      degrade_ms / 1000 <= t_ack <= degrade_ms / 1000 + 1.5 + 3,
      r.stderr + open(os.path.join(TMP, prim + ".log")).read()[-1500:])
ok_, v = rows_are(5)
check("every row: each acknowledged push applied once", ok_, v)
finish()
