"""Development aid: which op (and module, and thread) owns the bytes alive at the peak.

    with Tracer(model) as tr:
        ...one step...
    tr.report()          # live-at-peak by op and by module, top allocations

A TorchDispatchMode tags every allocation with the aten op that made it; module
forward pre-hooks add the module path; memhook adds the thread and the category
(counted, or gloo's collective scratch left out: memhook.py).  Only for finding what the predictor
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

    def _events(self):
        ev = self.ev
        for i in range(0, len(ev), 4):
            yield ev[i], ev[i + 1], ev[i + 2], ev[i + 3] & 0xFFFFFFFF, ev[i + 3] >> 32

    def live_at_peak(self):
        """(peak, {tag: counted bytes alive}, {(category, thread, tag): uncounted gloo bytes alive})
        at the highest point of the log."""
        best, best_i = -1, -1
        for i, (b, tag, live, th, cat) in enumerate(self._events()):
            if cat == memhook.COUNTED and live > best:
                best, best_i = live, i
        alive = collections.Counter()
        gloo = collections.Counter()
        for i, (b, tag, live, th, cat) in enumerate(self._events()):
            if i > best_i:
                break
            if cat == memhook.COUNTED:
                alive[tag] += b
            else:
                gloo[(memhook.CATEGORY[cat], th, self.names[tag])] += b
        return (best, {self.names[k]: v for k, v in alive.items() if v},
                {k: v for k, v in gloo.items() if v})

    def report(self, top=30, out=print):
        best, alive, gloo = self.live_at_peak()
        out("peak %d (live-log maximum)" % best)
        for k, v in sorted(alive.items(), key=lambda kv: -kv[1])[:top]:
            out("%14d  %s" % (v, k))
        out("gloo scratch alive at that peak, not counted (category, thread, tag): %d" % sum(gloo.values()))
        for k, v in sorted(gloo.items(), key=lambda kv: -kv[1])[:top]:
            out("%14d  %s thread %d %s" % (v, k[0], k[1], k[2]))

    def thread_totals(self, out=print):
        """Bytes allocated over the step per (category, thread), and the highest live of each."""
        tot, cnt, hi, cur = collections.Counter(), collections.Counter(), collections.Counter(), collections.Counter()
        for b, tag, live, th, cat in self._events():
            k = (memhook.CATEGORY[cat], th)
            cur[k] += b
            hi[k] = max(hi[k], cur[k])
            if b > 0:
                tot[k] += b
                cnt[k] += 1
        out("allocated per (category, thread): bytes, count, highest live")
        for k in sorted(tot):
            out("%14d %6d %14d  %s thread %d" % (tot[k], cnt[k], hi[k], k[0], k[1]))

    def op_totals(self, top=40, out=print):
        """Bytes allocated over the whole step per (phase, aten op): finds CPU-only ops."""
        tot = collections.Counter()
        cnt = collections.Counter()
        for b, tag, live, th, cat in self._events():
            if b > 0 and cat == memhook.COUNTED:
                name = self.names[tag]
                ph, op = name.partition("|")[0], name.rpartition("|")[2]
                tot[(ph, op)] += b
                cnt[(ph, op)] += 1
        out("allocated per (phase, op): bytes, count")
        for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:top]:
            out("%14d %6d  %s %s" % (v, cnt[k], k[0], k[1]))
