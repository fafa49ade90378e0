"""metrics_documented.py README METRICS... - every series the /metrics
dumps METRICS... export (their "# TYPE" lines) is named in the first
column of a row of README.md's metrics table; exits non-zero naming the
missing ones (ops.metrics, integration.coord_ops)."""
import re
import sys

rows = [l for l in open(sys.argv[1]) if re.match(r"\s*\| `(embps|process)_", l)]
documented = set()
for l in rows:
    documented.update(re.findall(r"`((?:embps|process)_\w+)`", l.split("|")[1]))
exported = set()
for f in sys.argv[2:]:
    exported.update(l.split()[2] for l in open(f) if l.startswith("# TYPE "))
assert len(exported) > 40, sorted(exported)
missing = sorted(exported - documented)
assert not missing, "not in the table: " + " ".join(missing)
