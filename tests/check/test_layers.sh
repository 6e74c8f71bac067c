#!/bin/sh
# test_layers.sh OBJDIR SRCDIR - the predictor's layers hold (issue 24).
# SRCDIR/layers.txt lists the layers, lowest first; each is a folder of SRCDIR
# with its objects in OBJDIR/<layer>/.  Checks:
#   - every folder of SRCDIR is a listed layer and holds its sources;
#   - docs/architecture.md's table lists the same layers in the same order;
#   - no file uses a function or variable defined in a higher layer (from the
#     objects' own symbols: nm's U against T/D/B/R);
#   - no file #includes a header of a higher layer;
#   - no two files use each other, directly or through others (no cycle in
#     "A uses a global defined in B"), whether or not they share a layer;
#   - no function is longer than 80 lines (its body, from the "{" to the "}"
#     that open and close it in the first column).
# A lower layer that needs something from above is handed it (a table of
# functions) instead of calling up.  Prints "N passed, N failed".
objdir=${1:-build/obj}
srcdir=${2:-predictor}
doc=${3:-$(dirname "$0")/../../docs/architecture.md}
python3 - "$objdir" "$srcdir" "$doc" "$(dirname "$0")" <<'PY'
import glob, os, re, sys
sys.path.insert(0, sys.argv[4])
import scc
objdir, srcdir, doc = sys.argv[1], sys.argv[2], sys.argv[3]
layers = [l.split("#")[0].strip() for l in open(os.path.join(srcdir, "layers.txt"))]
layers = [l for l in layers if l]
rank = {l: i for i, l in enumerate(layers)}
checks = []                      # (name, [problems])

def check(name, problems):
    checks.append((name, problems))

# 1. folders are the layers
folders = sorted(d for d in os.listdir(srcdir) if os.path.isdir(os.path.join(srcdir, d)))
loose = sorted(f for f in os.listdir(srcdir) if f.endswith((".c", ".h")))
check("every folder of %s/ is a layer of layers.txt (%s)" % (srcdir, " < ".join(layers)),
      ["folder %s/ is not in layers.txt" % d for d in folders if d not in rank] +
      ["layer %s has no folder" % l for l in layers if l not in folders] +
      ["%s is in no layer folder" % f for f in loose])

# the page that says why each layer exists lists them, in the same order
rows = re.findall(r"^\| `(\w+)/` \|", open(doc).read(), re.M) if os.path.exists(doc) else []
check("%s lists the layers in the order of layers.txt" % os.path.basename(doc),
      [] if rows == layers else ["its table lists %s" % (" < ".join(rows) or "none")])

# 2. symbols: A uses a global that B defines
layer_of, defined, used, missing = {}, {}, {}, []
for l in layers:
    for c in sorted(glob.glob(os.path.join(srcdir, l, "*.c"))):
        base = os.path.basename(c)[:-2]
        name = l + "/" + base           # a file is known by its layer and name
        o = os.path.join(objdir, l, base + ".o")
        if not os.path.exists(o):
            missing.append("no object %s for %s" % (o, c))
            continue
        layer_of[name] = l
        used[name], defs = scc.object_symbols(o)
        for d in defs:
            defined[d] = name
check("every source has its object in %s/<layer>/ (%d objects)" % (objdir, len(used)), missing)
edges = {a: {} for a in used}
for a in used:
    for s in sorted(used[a]):
        b = defined.get(s)
        if b and b != a:
            edges[a].setdefault(b, []).append(s)
up = []
for a in sorted(edges):
    for b in sorted(edges[a]):
        if rank[layer_of[b]] > rank[layer_of[a]]:
            up.append("%s.c (%s) uses %s.c (%s): %s" % (a, layer_of[a], b, layer_of[b],
                      " ".join(edges[a][b])))
check("no file uses a symbol of a higher layer", up)

# 3. includes
where = {}
for l in layers:
    for h in glob.glob(os.path.join(srcdir, l, "*.h")):
        where.setdefault(os.path.basename(h), []).append(l)
inc = []
inc_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
for l in layers:
    for p in sorted(glob.glob(os.path.join(srcdir, l, "*.[ch]"))):
        for h in inc_re.findall(open(p).read()):
            hl = where.get(os.path.basename(h))
            if not hl:
                inc.append("%s includes %s, a header of no layer" % (p, h))
            elif len(hl) > 1:
                inc.append("%s includes %s, a name in several layers (%s)" % (p, h, ", ".join(hl)))
            elif rank[hl[0]] > rank[l]:
                inc.append("%s (%s) includes %s/%s (%s)" % (p, l, hl[0], h, hl[0]))
check("no file includes a header of a higher layer", inc)

# 4. cycles (strongly connected components, tests/check/scc.py)
sccs = scc.components(edges)
check("no two files use each other, directly or through others",
      ["files using each other: " + " <-> ".join(x + ".c" for x in c)
       for c in sccs if len(c) > 1])

# 5. function length
MAX_LINES = 80
long_fns = []
for l in layers:
    for p in sorted(glob.glob(os.path.join(srcdir, l, "*.c"))):
        lines = open(p).read().split("\n")
        start = sig = None
        for i, text in enumerate(lines):
            if text == "{":
                j = i - 1
                while j > 0 and not re.match(r"^[A-Za-z_].*\(", lines[j]):
                    j -= 1
                start, sig = i, lines[j]
            elif text == "}" and start is not None:
                if i - start + 1 > MAX_LINES:
                    name = re.search(r"(\w+)\s*\(", sig)
                    long_fns.append("%s:%d: %s is %d lines" % (p, start + 1,
                                    name.group(1) if name else "?", i - start + 1))
                start = None
check("no function is longer than %d lines" % MAX_LINES, long_fns)

passed = failed = 0
for name, problems in checks:
    if problems:
        failed += 1
        print("not ok - " + name)
        for p in problems:
            print("    " + p)
    else:
        passed += 1
        print("ok - " + name)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
PY
