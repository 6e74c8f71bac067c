"""scc.py - what the no-circle checks of tests/check/test_structure.sh (the plugin)
and test_layers.sh (the predictor) share: the globals an object file uses and
defines (nm), and the strongly connected components of a directed graph (Tarjan):
a component of more than one file is a circle."""
import subprocess
import sys


def object_symbols(path):
    """(used, defined): the undefined globals of an object file and those it defines
    (text, data, bss, read-only, weak object)"""
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    used, defined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == "U":
            used.add(f[1])
        elif len(f) == 3 and f[1] in "TDBRV":
            defined.add(f[2])
    return used, defined


def components(edges):
    """edges: {node: iterable of nodes}; every node a key.  The components, each sorted."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            c = []
            while True:
                w = stack.pop()
                on.discard(w)
                c.append(w)
                if w == v:
                    break
            out.append(sorted(c))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out
