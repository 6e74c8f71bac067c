#!/bin/sh
# test_structure.sh OBJDIR - no two files of the SPANK plugin call each other,
# directly or through others: the graph "A uses a function defined in B" over
# OBJDIR/*.o (nm) has no cycle.  A cycle (check.c <-> publish.c, check.c <->
# explain.c) means the decision and the way it is handed on cannot be read,
# tested or changed one at a time.  Prints "N passed, N failed".
objdir=${1:-build/plugin}
python3 - "$objdir" "$(dirname "$0")" <<'PY'
import glob, os, sys
sys.path.insert(0, sys.argv[2])
import scc
objs = sorted(glob.glob(os.path.join(sys.argv[1], "*.o")))
if not objs:
    print("no objects in", sys.argv[1]); print("0 passed, 1 failed"); sys.exit(1)
defined, used = {}, {}
for o in objs:
    name = os.path.basename(o)[:-2]
    used[name], defs = scc.object_symbols(o)
    for d in defs:
        defined[d] = name
edges = {a: sorted({defined[s] for s in used[a] if s in defined and defined[s] != a}) for a in used}
sccs = scc.components(edges)  # tests/check/scc.py
cycles = [c for c in sccs if len(c) > 1]
for c in cycles:
    print("not ok - files calling each other: " + " <-> ".join(x + ".c" for x in c))
if not cycles:
    print("ok - no call cycle among %d files of the plugin" % len(objs))
print("%d passed, %d failed" % (0 if cycles else 1, len(cycles)))
sys.exit(1 if cycles else 0)
PY
