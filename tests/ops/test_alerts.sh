#!/usr/bin/env bash
# test_alerts.sh SERVER CLI ROOT - docker/monitoring/alerts.yml:
#   - promtool check rules, and its unit tests (alerts.test.yml);
#   - every embps_* and process_* series a rule reads is one a live server
#     exports, or is listed as not exported yet in the file's header (and
#     is really absent: the list cannot go stale);
#   - the rules evaluated on a live server's scrape (a data dir, a table,
#     pushes, a refused request, a checkpoint, more pushes), held unchanged for 30 minutes by
#     promtool: nothing fires while the checkpoint is fresh, and
#     EmbpsCheckpointTooOld fires once no checkpoint came for 15 + 5
#     minutes while the log holds pushes.
set -u
[ $# -eq 3 ] || { echo "usage: $0 SERVER CLI ROOT" >&2; exit 2; }
SERVER=$1
CLI=$2
ROOT=$3
M=$ROOT/docker/monitoring
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
command -v promtool >/dev/null || { bad "promtool installed (apt-get install prometheus)"; finish; }

check "promtool check rules alerts.yml" promtool check rules "$M/alerts.yml"
check "promtool test rules alerts.test.yml (each alert, its near misses)" \
  promtool test rules "$M/alerts.test.yml"

# a cluster of one (--cluster-servers: the cluster gauges are exported)
# on a port picked here; an evict of a missing table (one refusal counted)
P=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start s --listen "127.0.0.1:$P" --cluster-servers "127.0.0.1:$P" \
  --data-dir "$TMP/data" --metrics-listen 127.0.0.1:0 \
  --metrics-port-file "$TMP/mport"
c() { timeout 30 "$CLI" --servers "$s_ADDR" "$@"; }
if c create-table t --dim 4 --rows 1000 >"$TMP/out" 2>&1 &&
   ! c evict missing-table >>"$TMP/out" 2>&1 &&
   c push t --indices 1,2 --values 1,1,1,1,2,2,2,2 >>"$TMP/out" 2>&1 &&
   c checkpoint >>"$TMP/out" 2>&1 &&
   c push t --indices 3 --values 3,3,3,3 >>"$TMP/out" 2>&1 &&
   curl -sf "http://127.0.0.1:$(cat "$TMP/mport")/metrics" >"$TMP/scrape"; then
  ok "a live server: table, pushes, checkpoint, more pushes, scraped"
else
  bad "a live server scraped" "$(cat "$TMP/out")"
  finish
fi
stop s

check "every series the rules read is exported, or listed as not yet" \
  $PY - "$M/alerts.yml" "$TMP/scrape" <<'PY'
import re, sys, yaml
text = open(sys.argv[1]).read()
later = set()
for line in text.splitlines():
    if line.startswith("# not-exported-yet:"):
        later |= set(line.split(":", 1)[1].split())
exported = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", l).group(0)
            for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")}
exported |= {m for m in list(exported) for suf in ("_bucket", "_sum", "_count")
             if m.endswith(suf) for m in [m[: -len(suf)]]}
rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
used = set()
for r in rules:
    used |= set(re.findall(r"\b((?:embps|process)_[a-z0-9_]+)", r["expr"]))
problems = []
for name in sorted(used - exported - later):
    problems.append("%s: neither exported nor listed as not exported yet" % name)
for name in sorted(later & exported):
    problems.append("%s is exported now: take it off the not-exported-yet list" % name)
for name in sorted(later - used):
    problems.append("%s listed as not exported yet but no rule reads it" % name)
print("%d series read, %d exported, not yet: %s" % (len(used), len(used & exported),
      " ".join(sorted(used - exported))))
print("\n".join(problems))
sys.exit(1 if problems else 0)
PY

# the scrape as promtool input: every sample held for 30 minutes, the
# instance's labels added, unix times moved so that the checkpoint is at 0
$PY - "$TMP/scrape" "$M/alerts.yml" >"$TMP/live.test.yml" <<'PY'
import re, sys, yaml
lines = [l for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
samples = []
for l in lines:
    m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$", l.strip())
    samples.append((m.group(1), m.group(2) or "{}", float(m.group(3))))
ckpt = next(v for n, _, v in samples if n == "embps_checkpoint_time_seconds")
assert ckpt > 0, "no checkpoint in the scrape"
inst = 'instance="live:9464",job="embps"'
print("rule_files: [%s]" % sys.argv[2])
print("evaluation_interval: 1m")
print("tests:\n  - interval: 1m\n    input_series:")
for n, lab, v in samples:
    if n.endswith("_time_seconds"):
        v -= ckpt
    lab = "{" + inst + ("," + lab[1:-1] if lab != "{}" else "") + "}"
    print("      - series: '%s%s'" % (n, lab))
    print("        values: '%r+0x30'" % v)
print("    alert_rule_test:")
alerts = [r["alert"] for g in yaml.safe_load(open(sys.argv[2]))["groups"]
          for r in g["rules"]]
for a in alerts:
    print("      - {eval_time: 5m, alertname: %s, exp_alerts: []}" % a)
    if a != "EmbpsCheckpointTooOld":
        print("      - {eval_time: 25m, alertname: %s, exp_alerts: []}" % a)
print("""      - eval_time: 25m
        alertname: EmbpsCheckpointTooOld
        exp_alerts:
          - exp_labels: {severity: warning, instance: "live:9464", job: embps}
            exp_annotations:
              summary: "live:9464: no checkpoint for 25m 0s"
              description: >-
                Checkpoints stopped (their error is in the server's log) or were
                never scheduled (--checkpoint-every). The log since the last one is
                what a restart replays and what the disk must hold.""")
PY
check "the rules on the live scrape: none fires at 5 min; at 25 min without a checkpoint, EmbpsCheckpointTooOld" \
  promtool test rules "$TMP/live.test.yml"
finish
