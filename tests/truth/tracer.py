"""Development aid: which op (and module) owns the bytes alive at the peak.

    with Tracer(model) as tr:
        ...one step...
    tr.report()          # live-at-peak by op and by module, top allocations

A TorchDispatchMode tags every allocation with the aten op that made it; module
forward pre-hooks add the module path.  Only for finding what the predictor
misses: the extra Python references it takes are dropped before returning, so
measured peaks are the same with and without it (checked by the selftest).
"""
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memhook


class Tracer(TorchDispatchMode):
    def __init__(self, model=None):
        super().__init__()
        self.names = ["(none)"]
        self.index = {"(none)": 0}
        self.module = "-"
        self.phase = "?"
        self.hooks = []
        if model is not None:
            for name, mod in model.named_modules():
                self.hooks.append(mod.register_forward_pre_hook(self._enter(name)))

    def _enter(self, name):
        def hook(mod, args):
            self.module = name
        return hook

    def tag(self, label):
        t = self.index.get(label)
        if t is None:
            t = self.index[label] = len(self.names)
            self.names.append(label)
        return t

    def set_phase(self, p):
        self.phase = p

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t = self.tag("%s|%s|%s" % (self.phase, self.module, func.__name__))
        old = memhook._mod.set_tag(t)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            memhook._mod.set_tag(old)

    def __enter__(self):
        memhook._mod.set_log(True)
        return super().__enter__()

    def __exit__(self, *a):
        r = super().__exit__(*a)
        self.ev = memhook._mod.take_log()
        memhook._mod.set_log(False)
        for h in self.hooks:
            h.remove()
        return r

    def live_at_peak(self):
        """{tag: bytes} alive at the highest point of the log."""
        ev = self.ev
        best, best_i = -1, -1
        for i in range(0, len(ev), 3):
            if ev[i + 2] > best:
                best, best_i = ev[i + 2], i
        alive = collections.Counter()
        for i in range(0, best_i + 3, 3):
            alive[ev[i + 1]] += ev[i]
        return best, {self.names[k]: v for k, v in alive.items() if v}

    def report(self, top=30, out=print):
        best, alive = self.live_at_peak()
        out("peak %d (live-log maximum)" % best)
        for k, v in sorted(alive.items(), key=lambda kv: -kv[1])[:top]:
            out("%14d  %s" % (v, k))

    def op_totals(self, top=40, out=print):
        """Bytes allocated over the whole step per (phase, aten op): finds CPU-only ops."""
        tot = collections.Counter()
        cnt = collections.Counter()
        for i in range(0, len(self.ev), 3):
            if self.ev[i] > 0:
                ph, _, op = self.names[self.ev[i + 1]].partition("|")[0], None, self.names[self.ev[i + 1]].rpartition("|")[2]
                tot[(ph, op)] += self.ev[i]
                cnt[(ph, op)] += 1
        out("allocated per (phase, op): bytes, count")
        for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:top]:
            out("%14d %6d  %s %s" % (v, cnt[k], k[0], k[1]))
