#!/usr/bin/env python3
"""Fit mmguard's device-level constants from calibration JSON lines.

    python3 contrib/calibrate/fit.py [--gpu REGEX] [--json-out fit.json] DATA.jsonl...

The predictor's device-level peak is (predictor/base/mmguard.h, mm_overheads):

    peak = allocated * (1 + allocator_fraction) + allocator_fixed + cuda_context
           (+ nccl when data_parallel > 1)

Each constant is fitted once over all measured configs of one GPU model, never per
config, and printed with the evidence behind it:

* cuda_context: NVML used memory minus torch's reserved bytes, with the GPU's used
  memory before the worker touched CUDA subtracted.  Shown at idle right after init
  (probe records), after the first cuBLAS matmul, and right after each measured step
  (kernels for attention, cuBLAS and the optimizer loaded: the context at the peak).
  The value proposed is the largest after-step value (covers every config; the
  spread is printed so a reader sees whether one constant is justified).
* allocator_fixed / allocator_fraction: max_memory_reserved versus
  max_memory_allocated of the same step.  Three models are fitted (fixed only,
  fraction only, both by least squares, non-negative) and compared on MAPE and worst
  under-estimate; the simpler model wins unless the two-parameter one is clearly better.
* nccl: cannot be measured on one GPU (no peers); left to the predictor's default.

Needs no torch.  Prints a `device:` block for specs (docs/spec-schema.md) and, with
--json-out, the same as JSON for compare.py --device-json.
"""

import argparse
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import calib_common as cc  # noqa: E402

MIB = float(1 << 20)
# the two-parameter allocator model must beat the best one-parameter model by this
# many MAPE percentage points to be chosen
PREFER_SIMPLE_MARGIN = 0.1


class FitError(Exception):
    pass


def mib(v):
    return "%.1f MiB" % (v / MIB) if v is not None else "-"


def ok_measurements(records, gpu=None, allow_simulated=False):
    last = {}
    for r in cc.measurements(records):
        last[r.get("id")] = r
    out = []
    for r in last.values():
        if r.get("status") != "ok":
            continue
        if r.get("simulated") and not allow_simulated:
            continue
        if gpu and not re.search(gpu, str((r.get("env") or {}).get("gpu_name", ""))):
            continue
        m = r.get("measured") or {}
        if not m.get("max_memory_allocated") or not m.get("max_memory_reserved"):
            continue
        out.append(r)
    return out


def probes(records, gpu=None, allow_simulated=False):
    out = []
    for r in records:
        if r.get("kind") != "probe":
            continue
        if r.get("simulated") and not allow_simulated:
            continue
        if gpu and r.get("env") and not re.search(gpu, str(r["env"].get("gpu_name", ""))):
            continue
        out.append(r)
    return out


def summary_stats(vals):
    vals = sorted(vals)
    return {"n": len(vals), "min": vals[0], "median": statistics.median(vals), "max": vals[-1]}


def fit_context(ms, prs):
    """Returns (value, evidence dict)."""
    ev = {}
    idle = [p["cuda_context_idle"] for p in prs
            if p.get("probe") == "init" and p.get("cuda_context_idle") is not None]
    mm = [p["cuda_context_after_matmul"] for p in prs
          if p.get("probe") == "init" and p.get("cuda_context_after_matmul") is not None]
    final = [p["cuda_context_final"] for p in prs
             if p.get("probe") == "final" and p.get("cuda_context_final") is not None]
    eff = [(r["id"], r["measured"]["cuda_context_effective"]) for r in ms
           if (r.get("measured") or {}).get("cuda_context_effective") is not None]
    if idle:
        ev["idle_after_init"] = summary_stats(idle)
    if mm:
        ev["after_first_matmul"] = summary_stats(mm)
    if final:
        ev["worker_end"] = summary_stats(final)
    if eff:
        ev["after_measured_step"] = summary_stats([v for _, v in eff])
        by_att = {}
        for r in ms:
            v = (r.get("measured") or {}).get("cuda_context_effective")
            if v is None:
                continue
            a = (r.get("config") or {}).get("attention", "?")
            by_att.setdefault(a, []).append(v)
        ev["after_measured_step_by_attention"] = {a: summary_stats(v) for a, v in by_att.items()}
        value = max(v for _, v in eff)
        ev["chosen"] = "max over measured steps (the context present at each peak)"
    elif mm or idle:
        value = max(mm or idle)
        ev["chosen"] = ("max idle probe: no after-step NVML values, so lazily loaded kernels "
                        "are NOT included; treat as a lower bound")
    else:
        raise FitError("no NVML data: cuda_context cannot be fitted (pynvml/nvidia-smi missing?)")
    # round up to whole MiB
    value = int(-(-value // (1 << 20)) * (1 << 20))
    return value, ev


def _eval(points, f, c):
    errs, under = [], 0.0
    for a, r in points:
        p = a * (1.0 + f) + c
        errs.append(abs(p - r) / r * 100.0)
        under = max(under, r - p)
    return {"mape_pct": sum(errs) / len(errs), "max_abs_err_pct": max(errs),
            "worst_underestimate_bytes": under}


def fit_allocator(ms):
    """points: (max_memory_allocated, max_memory_reserved).  Returns (f, c, evidence)."""
    pts = [(float(r["measured"]["max_memory_allocated"]), float(r["measured"]["max_memory_reserved"]))
           for r in ms]
    if not pts:
        raise FitError("no measured (status ok) configs: nothing to fit")
    over = [r - a for a, r in pts]
    ratio = [r / a - 1.0 for a, r in pts]
    models = {}
    c0 = max(0.0, statistics.median(over))
    models["fixed_only"] = (0.0, c0)
    f0 = max(0.0, statistics.median(ratio))
    models["fraction_only"] = (f0, 0.0)
    if len(pts) >= 3:
        n = len(pts)
        ma = sum(a for a, _ in pts) / n
        mo = sum(over) / n
        sxx = sum((a - ma) ** 2 for a, _ in pts)
        if sxx > 0:
            f = sum((a - ma) * (o - mo) for (a, _), o in zip(pts, over)) / sxx
            c = mo - f * ma
            if f < 0:
                f, c = 0.0, max(0.0, mo)
            if c < 0:  # refit through the origin
                c = 0.0
                f = max(0.0, sum(a * o for (a, _), o in zip(pts, over)) / sum(a * a for a, _ in pts))
            models["least_squares"] = (f, c)
    ev = {"n": len(pts),
          "reserved_minus_allocated": summary_stats(over),
          "reserved_over_allocated_minus_1": summary_stats(ratio),
          "models": {}}
    for k, (f, c) in models.items():
        ev["models"][k] = dict(_eval(pts, f, c), allocator_fraction=f, allocator_fixed=c)
    simple = min(("fixed_only", "fraction_only"), key=lambda k: ev["models"][k]["mape_pct"])
    chosen = simple
    if "least_squares" in ev["models"] and (
            ev["models"]["least_squares"]["mape_pct"] + PREFER_SIMPLE_MARGIN
            < ev["models"][simple]["mape_pct"]):
        chosen = "least_squares"
    f, c = models[chosen]
    ev["chosen"] = chosen
    return f, c, ev


def fit(records, gpu=None, allow_simulated=False, conservative=False):
    ms = ok_measurements(records, gpu, allow_simulated)
    prs = probes(records, gpu, allow_simulated)
    gpus = sorted({str((r.get("env") or {}).get("gpu_name")) for r in ms})
    f, c, aev = fit_allocator(ms)
    f = round(f, 5)
    # the conservative variant: the fixed term that leaves no measured point under-estimated
    # with the rounded fraction
    env = max(float(r["measured"]["max_memory_reserved"])
              - float(r["measured"]["max_memory_allocated"]) * (1.0 + f) for r in ms)
    aev["envelope_allocator_fixed"] = max(c, env)
    if conservative:
        c = aev["envelope_allocator_fixed"]
    ctx, cev = fit_context(ms, prs)
    # allocator_fixed rounded up to the allocator's 512-byte granularity
    device = {"cuda_context": ctx, "allocator_fixed": int(-(-round(c, 3) // 512) * 512),
              "allocator_fraction": f}
    # what the device-level model reaches with perfect allocated predictions
    check = []
    for r in ms:
        m = r["measured"]
        if m.get("device_peak_bytes"):
            p = m["max_memory_allocated"] * (1 + device["allocator_fraction"]) \
                + device["allocator_fixed"] + device["cuda_context"]
            check.append(abs(p - m["device_peak_bytes"]) / m["device_peak_bytes"] * 100.0)
    evidence = {"gpus": gpus, "n_measured": len(ms), "n_probes": len(prs),
                "cuda_context": cev, "allocator": aev,
                "device_mape_with_measured_allocated_pct":
                    (sum(check) / len(check)) if check else None,
                "nccl": "not measurable on one GPU; keep the predictor's default",
                "conservative": conservative}
    if len(gpus) > 1:
        evidence["warning"] = "data from several GPU models; use --gpu to fit one"
    return device, evidence


def report(device, ev, out=None):
    w = (out or sys.stdout).write
    w("fit: %d measured configs, %d probes, GPU %s\n" % (
        ev["n_measured"], ev["n_probes"], ", ".join(ev["gpus"])))
    if ev.get("warning"):
        w("fit: WARNING: %s\n" % ev["warning"])
    c = ev["cuda_context"]
    w("\n== cuda_context (NVML used - baseline - torch reserved) ==\n")
    for k in ("idle_after_init", "after_first_matmul", "after_measured_step", "worker_end"):
        if k in c:
            s = c[k]
            w("  %-22s n=%-3d min %s  median %s  max %s\n" % (
                k, s["n"], mib(s["min"]), mib(s["median"]), mib(s["max"])))
    for a, s in sorted(c.get("after_measured_step_by_attention", {}).items()):
        w("    attention %-8s n=%-3d min %s  max %s\n" % (a, s["n"], mib(s["min"]), mib(s["max"])))
    w("  chosen: %s -> %s\n" % (c["chosen"], mib(device["cuda_context"])))
    a = ev["allocator"]
    w("\n== allocator (max_memory_reserved vs max_memory_allocated, n=%d) ==\n" % a["n"])
    s = a["reserved_minus_allocated"]
    w("  reserved - allocated     min %s  median %s  max %s\n" % (
        mib(s["min"]), mib(s["median"]), mib(s["max"])))
    s = a["reserved_over_allocated_minus_1"]
    w("  reserved/allocated - 1   min %.4f  median %.4f  max %.4f\n" % (
        s["min"], s["median"], s["max"]))
    for k, m in a["models"].items():
        w("  model %-14s fraction %.5f fixed %s: MAPE %.2f%%, max %.2f%%, worst under %s%s\n" % (
            k, m["allocator_fraction"], mib(m["allocator_fixed"]), m["mape_pct"],
            m["max_abs_err_pct"], mib(m["worst_underestimate_bytes"]),
            "   <- chosen" if k == a["chosen"] else ""))
    w("  conservative (no point under-estimated): allocator_fixed %s\n"
      % mib(a["envelope_allocator_fixed"]))
    if ev.get("device_mape_with_measured_allocated_pct") is not None:
        w("\ndevice-level MAPE with these constants and the measured allocated peak: %.2f%%\n"
          "(the floor for peak_bytes: the rest of its error is allocated_peak_bytes')\n"
          % ev["device_mape_with_measured_allocated_pct"])
    w("nccl: %s\n" % ev["nccl"])
    w("\n# device constants for mmguard specs (docs/spec-schema.md); fold into the\n"
      "# predictor's defaults or put in a spec / `--set device.KEY=VALUE`\n")
    w("device:\n")
    w("  cuda_context: %d          # %s\n" % (device["cuda_context"], mib(device["cuda_context"])))
    w("  allocator_fixed: %d       # %s\n" % (device["allocator_fixed"],
                                            mib(device["allocator_fixed"])))
    w("  allocator_fraction: %s\n" % repr(device["allocator_fraction"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description="fit mmguard device constants from calibration data")
    ap.add_argument("data", nargs="+")
    ap.add_argument("--gpu", help="regex on the GPU name: fit only that GPU's records")
    ap.add_argument("--json-out", help="write {device, evidence} as JSON")
    ap.add_argument("--conservative", action="store_true",
                    help="allocator_fixed covers the worst measured point")
    ap.add_argument("--allow-simulated", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    records = []
    for p in args.data:
        records.extend(cc.read_records(p, warn=lambda m: sys.stderr.write(m + "\n")))
    try:
        device, ev = fit(records, args.gpu, args.allow_simulated, args.conservative)
    except FitError as e:
        sys.stderr.write("fit: %s\n" % e)
        return 1
    report(device, ev)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": device, "evidence": ev}, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
