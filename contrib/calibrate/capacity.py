#!/usr/bin/env python3
"""Capacity sweeps on one GPU (issue 21): where does a job stop fitting?

    python3 contrib/calibrate/capacity.py --dir OUTDIR [--budget-seconds 380] [--slots 8]

For each group of calib_common.capacity_groups() it runs calibrate.py's worker once
without a limit, recording the caching allocator's trace (OUTDIR/traces), then again in
fresh workers under torch.cuda.set_per_process_memory_fraction at capacities spread from
just under the allocated peak A to just over the reserved peak R of that run, and then
at a few more inside the interval where the outcome changed (out of memory -> runs).
Each point records fits / num_alloc_retries / OOM (kind "capacity_point",
tests/gpu_data/README.md).  Small groups run side by side (--slots), within a memory
budget, so a sweep fits in a few minutes of GPU time.  Every worker writes its own
JSON-lines file under OUTDIR/raw; they are joined into OUTDIR/capacity.jsonl at the end.

The measured boundary is compared with the predictor by tests/alloc/sweep.py: the
committed trace replayed at each capacity (`mmguard alloc-replay --capacity`) must give
the same outcome and the same retry count, and the spec's predicted boundary must lie
within 2 % of the measured one.  Workers run side by side, so their NVML (device-level)
figures include the other workers' memory: only the allocator's own counters count here.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import calib_common as cc  # noqa: E402

GIB = 1 << 30
GRID_POINTS = 12      # A*0.97, A*0.995, 9 from A to R, R*1.01
REFINE_POINTS = 4     # more inside (largest OOM, smallest run)


def log(msg):
    sys.stderr.write("[capacity %s] %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def grid_capacities(a, r):
    caps = [a * 0.97, a * 0.995]
    caps += [a + (r - a) * i / 8.0 for i in range(9)]
    caps.append(r * 1.01)
    return sorted(set(int(c) for c in caps))


def refine_capacities(points):
    """points: [(capacity, ok)]; more capacities between the largest OOM and the
    smallest capacity that ran, where the boundary is."""
    oom = [c for c, ok in points if not ok]
    run = [c for c, ok in points if ok]
    if not oom or not run:
        return []
    lo, hi = max(oom), min(run)
    if hi <= lo:
        return []  # not monotone: the data says so, no refinement
    return [int(lo + (hi - lo) * i / (REFINE_POINTS + 1)) for i in range(1, REFINE_POINTS + 1)]


class Task:
    def __init__(self, group, kind, capacity=None, total=None):
        self.group, self.kind, self.capacity = group, kind, capacity
        self.fraction = capacity / float(total) if capacity else None
        self.proc = None
        self.out = None
        self.started = None

    def need(self, est):
        return self.capacity if self.capacity else est


def estimate_bytes(group):
    n = cc.llm_param_count(group.llm_geometry())
    return int(40 * GIB if n > 5e9 else 12 * GIB)


def start(task, args, deadline, n):
    g = task.group
    gd = g.to_dict()
    if task.kind != "uncapped":
        gd["trace"] = False
    raw = os.path.join(args.dir, "raw")
    task.out = os.path.join(raw, "%s-%s-%03d.jsonl" % (g.name, task.kind, n))
    cmd = [sys.executable, os.path.join(HERE, "calibrate.py"), "--worker", "--out", task.out,
           "--group-json", json.dumps(gd), "--config-ids", g.configs()[0].id,
           "--deadline", repr(deadline), "--trace-dir", os.path.join(args.dir, "traces")]
    if task.fraction:
        cmd += ["--memory-fraction", repr(task.fraction)]
    if args.simulate:
        cmd.append("--simulate")
    env = dict(os.environ)
    if g.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = g.alloc_conf
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    logf = open(task.out + ".log", "w")
    task.proc = subprocess.Popen(cmd, start_new_session=True, env=env, stdout=logf,
                                 stderr=subprocess.STDOUT)
    task.started = time.time()


def measurement_of(path):
    try:
        recs = cc.read_records(path)
    except OSError:
        return None
    ms = [r for r in recs if r.get("kind") in ("measurement", "capacity_point")]
    return ms[-1] if ms else None


def peaks(rec):
    m = rec.get("measured") or {}
    a = max(m.get("step1_max_allocated") or 0, m.get("max_memory_allocated") or 0)
    r = max(m.get("step1_max_reserved") or 0, m.get("max_memory_reserved") or 0)
    return a, r


def run(args):
    t0 = time.time()
    deadline = t0 + args.budget_seconds
    os.makedirs(os.path.join(args.dir, "raw"), exist_ok=True)
    groups = cc.select_groups(cc.capacity_groups(), args.only)
    total = None
    # the big uncapped traces first: they take longest
    queue = sorted((Task(g, "uncapped") for g in groups),
                   key=lambda t: -estimate_bytes(t.group))
    running, n = [], 0
    points = {g.name: [] for g in groups}
    refined = set()
    budget = args.memory_budget_gib * GIB
    while (queue or running) and time.time() < deadline + args.grace_seconds:
        for t in list(running):
            rc = t.proc.poll()
            if rc is None and time.time() > deadline + args.grace_seconds - 5:
                os.killpg(t.proc.pid, signal.SIGKILL)
                rc = "killed"
            if rc is None:
                continue
            running.remove(t)
            rec = measurement_of(t.out)
            st = rec.get("status") if rec else None
            log("%-34s %-8s %s -> %s (rc %s, %.0f s)" % (
                t.group.name, t.kind, "%.3f GiB" % (t.capacity / GIB) if t.capacity else "",
                st, rc, time.time() - t.started))
            if t.kind == "uncapped" and st == "ok" and "sweep" in t.group.note:
                total = total or (rec.get("env") or {}).get("gpu_total_bytes")
                a, r = peaks(rec)
                for c in grid_capacities(a, r):
                    queue.append(Task(t.group, "grid", c, total))
            elif t.kind in ("grid", "refine") and st in ("ok", "oom"):
                points[t.group.name].append((t.capacity, st == "ok"))
            g = t.group
            if (t.kind == "grid" and g.name not in refined
                    and not any(q.group is g and q.kind == "grid" for q in queue + running)):
                refined.add(g.name)
                for c in refine_capacities(points[g.name]):
                    queue.append(Task(g, "refine", c, total))
        used = sum(t.need(estimate_bytes(t.group)) for t in running)
        while queue and len(running) < args.slots and time.time() < deadline:
            t = queue[0]
            if running and used + t.need(estimate_bytes(t.group)) > budget:
                break
            queue.pop(0)
            n += 1
            start(t, args, deadline, n)
            running.append(t)
            used += t.need(estimate_bytes(t.group))
        if time.time() >= deadline and queue:
            log("budget: %d tasks not started" % len(queue))
            queue = []
        time.sleep(0.5)
    join(args)
    return 0


def join(args):
    raw = os.path.join(args.dir, "raw")
    with open(os.path.join(args.dir, "capacity.jsonl"), "w") as f:
        for name in sorted(os.listdir(raw)):
            if name.endswith(".jsonl"):
                for r in cc.read_records(os.path.join(raw, name)):
                    r["concurrent_workers"] = True
                    f.write(json.dumps(r, sort_keys=True) + "\n")
    log("joined into %s" % os.path.join(args.dir, "capacity.jsonl"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="output folder (raw/, traces/, capacity.jsonl)")
    ap.add_argument("--budget-seconds", type=float, default=380)
    ap.add_argument("--grace-seconds", type=float, default=60)
    ap.add_argument("--slots", type=int, default=8, help="workers side by side")
    ap.add_argument("--memory-budget-gib", type=float, default=120,
                    help="sum of the running workers' capacities (estimates when uncapped)")
    ap.add_argument("--only", help="regex: only groups whose name matches")
    ap.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
