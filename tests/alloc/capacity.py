#!/usr/bin/env python3
"""tests/alloc/capacity.py - the allocator model on a card of limited memory.

Without a GPU, the invariants a capacity-aware replay must hold, on the real
H100 allocator traces (tests/gpu_data/traces) and on every shipped preset:
  traces  - a capacity at or above the uncapped reserved peak changes nothing
            (same peak, no retry, no OOM); below it the reserved peak never exceeds
            the capacity; OOM is monotone (if a capacity runs, every larger one
            does); no OOM while the capacity holds the requested peak plus what a
            flushed cache can still give (at least the live peak rounded); under the
            live (requested) peak every replay runs out of memory.
  presets - `mmguard check --gpu-mem SIZE --json` is monotone in SIZE (oom, then
            flushes, then fits); the boundaries it reports lie between the live bytes
            plus context/NCCL and the uncapped peak; a direct verdict at each size
            agrees with those boundaries (what job_submit.lua may rely on); the
            reserved peak on the card never exceeds the allocator's capacity.
  fit     - `mmguard fit --gpu-mem SIZE --json`'s answers hold by `mmguard check` on
            every preset on a 40 GiB and an 80 GiB card: its largest micro-batch runs
            and one more does not (as given, with expandable segments, with
            checkpointing); its largest without a flush fits and one more does not;
            its verdicts of those remedies are check's; its GPU count (with its ZeRO
            stage and checkpointing) runs and one GPU fewer does not; its verdict of
            the spec is check's.
MMGUARD=path/to/mmguard.  Prints "capacity: N passed, N failed".
"""
import glob
import gzip
import json
import os
import subprocess
import sys

from tally import MM, Tally, replay as replay_opts

MiB = 1 << 20
T = Tally()
ok = T.ok


def replay(data, cap=None):
    return replay_opts(data, *(["--capacity", str(cap)] if cap else []))


def traces():
    for t in sorted(glob.glob("tests/gpu_data/traces/*.trace.gz")):
        name = os.path.basename(t)
        data = gzip.open(t).read()
        free = replay(data)
        R, live = free["reserved_peak_bytes"], free["requested_peak_bytes"]
        above = replay(data, R + 2 * MiB)
        ok(above["reserved_peak_bytes"] == R and above["num_ooms"] == 0
           and above["num_alloc_retries"] == free["num_alloc_retries"],
           f"{name}: a capacity above the uncapped peak changed the replay: {above}")
        at = replay(data, R)
        ok(at["num_ooms"] == 0 and at["reserved_peak_bytes"] == R,
           f"{name}: at exactly the uncapped peak: {at}")
        ok(replay(data, live - MiB)["num_ooms"] > 0, f"{name}: no OOM below the live peak")
        caps = [live + (R - live) * k // 8 for k in range(0, 9)]
        ran = []
        for c in caps:
            j = replay(data, c)
            ok(j["reserved_peak_bytes"] <= c, f"{name}: reserved {j['reserved_peak_bytes']} > "
               f"capacity {c}")
            ran.append(j["num_ooms"] == 0)
        first = ran.index(True) if True in ran else len(ran)
        ok(all(ran[first:]), f"{name}: OOM is not monotone in capacity: {list(zip(caps, ran))}")


def check(preset, size, *sets):
    r = subprocess.run([MM, "check", preset, "--gpu-mem", str(size), "--margin", "0", "--json"]
                       + [a for kv in sets for a in ("--set", kv)],
                       capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"mmguard check {preset} --gpu-mem {size}: {r.stderr}")
    return json.loads(r.stdout)


RANK = {"oom": 0, "flushes": 1, "fits": 2}


def presets():
    for p in sorted(glob.glob("contrib/models/*.yaml")):
        name = os.path.basename(p)
        base = check(p, 1 << 50)
        ok(base["verdict"] == "fits" and base["alloc_retries_per_step"] == 0
           and base["reserved_peak_bytes"] == base["reserved_uncapped_bytes"],
           f"{name}: on a card without limit: {base}")
        lo, hi = base["min_usable_runs"], base["min_usable_no_flush"]
        out = base["outside_allocator_bytes"]
        ok(base["allocated_peak_bytes"] + out <= lo <= hi <= base["reserved_uncapped_bytes"] + out,
           f"{name}: boundaries {lo}, {hi} outside [live + context, uncapped peak]")
        sizes = sorted({max(out, lo - 64 * MiB), lo - 2 * MiB, lo, (lo + hi) // 2, hi - 2 * MiB,
                        hi, hi + 2 * MiB, base["reserved_uncapped_bytes"] + out + 8 * MiB})
        last = -1
        for s in sizes:
            if s <= 0:
                continue
            v = check(p, s)
            want = "fits" if s >= hi else "flushes" if s >= lo else "oom"
            ok(v["verdict"] == want, f"{name}: at {s} the verdict is {v['verdict']}, the "
               f"boundaries ({lo}, {hi}) say {want}")
            ok(RANK[v["verdict"]] >= last, f"{name}: verdict not monotone at {s}")
            last = RANK[v["verdict"]]
            ok(v["reserved_peak_bytes"] <= max(v["allocator_capacity"], 1) or v["verdict"] == "oom",
               f"{name}: reserved {v['reserved_peak_bytes']} above capacity "
               f"{v['allocator_capacity']}")


def fit_answers(p, size):
    name = os.path.basename(p)
    r = subprocess.run([MM, "fit", p, "--gpu-mem", str(size), "--margin", "0", "--json"],
                       capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"mmguard fit {p} --gpu-mem {size}: {r.stderr}")
    f = json.loads(r.stdout)
    ok(f["verdict"] == check(p, size)["verdict"], f"{name} at {size}: fit's verdict {f['verdict']}")
    xs = "device.alloc_conf=expandable_segments:True"
    for key, worst, sets, judged in (
            ("max_micro_batch", "flushes", [], True),
            ("max_micro_batch_no_flush", "fits", [], True),
            ("max_micro_batch_expandable_segments", "flushes", [xs], f["expandable_segments"]),
            ("max_micro_batch_checkpointing", "flushes", ["training.gradient_checkpointing=true"],
             f["checkpointing"])):
        m = f[key]
        if not judged:
            continue
        if m:
            v = check(p, size, *sets, f"training.micro_batch_size={m}")["verdict"]
            ok(RANK[v] >= RANK[worst], f"{name} at {size}: {key} {m} is {v}")
        if m < 65536:
            v = check(p, size, *sets, f"training.micro_batch_size={m + 1}")["verdict"]
            ok(RANK[v] < RANK[worst], f"{name} at {size}: {key} {m} + 1 is {v}")
    for key, sets in (("expandable_segments", [xs]),
                      ("checkpointing", ["training.gradient_checkpointing=true"])):
        if f[key]:
            v = check(p, size, *sets)["verdict"]
            ok(v == f[key]["verdict"], f"{name} at {size}: fit says {key} {f[key]}, check {v}")
    n = f["min_data_parallel"]
    if n:
        sets = [f"training.zero_stage={f['min_data_parallel_zero_stage']}"]
        if f["min_data_parallel_needs_checkpointing"]:
            sets.append("training.gradient_checkpointing=true")
        v = check(p, size, *sets, f"training.data_parallel={n}")["verdict"]
        ok(v != "oom", f"{name} at {size}: fit's {n} GPUs ({sets}) are {v}")
        if n > 1:
            v = check(p, size, *sets, f"training.data_parallel={n - 1}")["verdict"]
            ok(v == "oom", f"{name} at {size}: {n - 1} GPUs, one fewer than fit's, are {v}")


def fits():
    for p in sorted(glob.glob("contrib/models/*.yaml")):
        for size in (40 << 30, 80 << 30):
            fit_answers(p, size)


if __name__ == "__main__":
    which = sys.argv[1:] or ["traces", "presets", "fit"]
    if "traces" in which:
        traces()
    if "presets" in which:
        presets()
    if "fit" in which:
        fits()
    sys.exit(T.done("capacity"))
