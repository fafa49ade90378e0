#!/usr/bin/env bash
# test_layers.sh OBJECT... - the server's files form a DAG: no two server
# files call each other, directly or around a loop.
#
# Read from the object files (ctest passes embps_server_lib's), so macros
# and static inlines cannot hide a call: for each server/*.c object, nm
# lists the global symbols it defines and the ones it leaves undefined;
# file A depends on file B when A needs a symbol B defines. Symbols no
# server file defines (libc, libuv, common/ and client/ objects) are not
# edges. The graph's strongly connected components are computed (Tarjan);
# any component of more than one file fails the test, which prints one
# cycle through it with the symbols behind each call. With -v the whole
# graph and its layers are printed too.
set -u
VERBOSE=0
if [ "${1:-}" = -v ]; then
  VERBOSE=1
  shift
fi
TMP=$(mktemp -d /tmp/embps-layers-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tap.sh"
NM=${NM:-nm}

# one line per symbol: FILE D|U NAME (the server objects only)
n_objs=0
for o in "$@"; do
  case $o in
  */server/*.o) ;;
  *) continue ;;
  esac
  f=$(basename "$o" .o)
  f=${f%.c}
  n_objs=$((n_objs + 1))
  "$NM" -P "$o" | awk -v f="$f" '
    $2 == "U" || $2 == "w" { print f, "U", $1; next }
    $2 ~ /^[A-Z]$/ { print f, "D", $1 }' >>"$TMP/syms" ||
    bad "nm $o"
done

# A vacuous pass (no objects, or objects without symbols) is a failure.
if [ "$n_objs" -lt 10 ] || [ ! -s "$TMP/syms" ]; then
  bad "server objects found" "$n_objs server objects among: $*"
  finish
fi

check "server files form a DAG ($n_objs files)" /usr/bin/python3 - \
  "$TMP/syms" "$VERBOSE" <<'PY'
import sys
from collections import defaultdict

defs, uses = {}, defaultdict(set)
for line in open(sys.argv[1]):
    f, kind, sym = line.split()
    if kind == "D":
        defs[sym] = f
    else:
        uses[f].add(sym)
files = sorted(set(defs.values()) | set(uses))
edges = defaultdict(lambda: defaultdict(list))  # a -> b -> symbols
for a in files:
    for s in sorted(uses[a]):
        b = defs.get(s)
        if b and b != a:
            edges[a][b].append(s)

# Tarjan's strongly connected components (iterative)
index, low, on, stack, sccs, n = {}, {}, set(), [], [], [0]
for root in files:
    if root in index:
        continue
    work = [(root, iter(sorted(edges[root])))]
    index[root] = low[root] = n[0]; n[0] += 1
    stack.append(root); on.add(root)
    while work:
        v, it = work[-1]
        w = next(it, None)
        if w is not None:
            if w not in index:
                index[w] = low[w] = n[0]; n[0] += 1
                stack.append(w); on.add(w)
                work.append((w, iter(sorted(edges[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            sccs.append(sorted(comp))

def loop_of(comp):
    """A shortest loop from comp[0] back to itself inside comp."""
    members, start = set(comp), comp[0]
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]

bad = [c for c in sccs if len(c) > 1]
if sys.argv[2] == "1" or bad:
    # layers: a file's layer is one above the highest it calls
    comp_of = {f: i for i, c in enumerate(sccs) for f in c}
    layer = {}
    for i, c in enumerate(sccs):  # Tarjan emits callees first
        layer[i] = 1 + max([layer[comp_of[w]] for f in c for w in edges[f]
                            if comp_of[w] != i] or [-1])
    by = defaultdict(list)
    for i, c in enumerate(sccs):
        by[layer[i]].append("{" + ", ".join(c) + "}" if len(c) > 1 else c[0])
    print("layers, bottom up:")
    for k in sorted(by):
        print("  %d: %s" % (k, " ".join(sorted(by[k]))))
if sys.argv[2] == "1":
    print("calls (file -> file: symbols):")
    for a in files:
        for b in sorted(edges[a]):
            print("  %s -> %s: %s" % (a, b, " ".join(edges[a][b])))
for c in bad:
    print("cycle among %d files {%s}:" % (len(c), ", ".join(c)))
    p = loop_of(c)
    for a, b in zip(p, p[1:]):
        print("  %s -> %s: %s" % (a, b, " ".join(edges[a][b])))
sys.exit(1 if bad else 0)
PY
if [ "$VERBOSE" = 1 ] && [ "$FAIL" = 0 ]; then cat "$TMP/check.out"; fi
finish
