#!/usr/bin/env python3
"""Compare measured calibration data with `mmguard predict --json` on the same specs.

    python3 contrib/calibrate/compare.py [--mmguard build/mmguard] [--device-json fit.json]
                                         [--json-out summary.json] [--check-goals] DATA.jsonl...

For every measured config (status ok) the recorded spec is written to a temporary JSON
file (plus the `device:` block from --device-json, e.g. fit.py's output) and predicted:

  allocated error = (allocated_peak_bytes - max_memory_allocated) / max_memory_allocated
  reserved error  = (reserved_peak_bytes - max_memory_reserved) / max_memory_reserved
  device error    = (peak_bytes - device peak) / device peak

where the device peak is what nvidia-smi/NVML showed at the peak of the measured step,
minus what the GPU showed before the worker touched CUDA.  Prints one row per config,
MAPE overall and per mode, the goals (allocated <= 3 %, reserved <= 5 %, device-level
<= 5 %), every device-level under-prediction beyond 5 % as a GAP line, and for OOM points
whether the prediction would have refused the job.  --check-goals exits 1 when a MAPE
goal is missed or a row is refused.  A row recorded without a spec (the Qwen-VL rows
measured before calib_common.spec_for described them) gets its spec rebuilt from its own
config, build and env by the same spec_for (said in the output); every row's predicted
parameter counts must equal the ones counted on the model that ran, or the row is
REFUSED (its spec does not describe that model).  Needs no torch.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import calib_common as cc  # noqa: E402

GOAL_ALLOCATED = 3.0
GOAL_DEVICE = 5.0
GOAL_RESERVED = 5.0
GOAL_UNDER = 5.0   # no device-level under-prediction beyond this (reported, see GAP lines)
GIB = float(1 << 30)


def load_device(path):
    if not path:
        return None
    with open(path) as f:
        d = json.load(f)
    return d.get("device", d)


def record_spec(r):
    """A measurement's spec and where it comes from: ("recorded") the one it carries,
    or ("rebuilt") for one measured before spec_for described its family (the Qwen-VL
    rows of the H100 and H200 files), the same spec_for fed the record's own config,
    build.attention_used and env versions; the data file stays as measured.  Raises
    ValueError when the record has neither."""
    if r.get("spec"):
        return r["spec"], "recorded"
    return cc.spec_from_record(r), "rebuilt"


def predict_spec(spec, device=None, alloc_conf=None):
    """The spec as the run was made (a copy): alloc_conf is the PYTORCH_CUDA_ALLOC_CONF
    the run used (records made before the spec carried it keep it in their config only)."""
    spec = json.loads(json.dumps(spec))
    for m in spec.get("modules", []):
        # records made before the spec had the key: calibrate.py always passed
        # autocast_adapter_dtype=False (bf16 adapters), PEFT's default is True
        if isinstance(m.get("lora"), dict):
            m["lora"].setdefault("autocast_adapter_dtype", False)
    if device:
        spec["device"] = dict(device)
    if alloc_conf and "alloc_conf" not in spec.get("device", {}):
        spec.setdefault("device", {})["alloc_conf"] = alloc_conf
    return spec


def predict(mmguard, spec, device=None, timeout=60, alloc_conf=None):
    """Run `mmguard predict SPEC --json` on predict_spec(spec, device, alloc_conf);
    returns (dict, None) or (None, error text)."""
    spec = predict_spec(spec, device, alloc_conf)
    fd, path = tempfile.mkstemp(prefix="mmcal-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        try:
            out = subprocess.run([mmguard, "predict", path, "--json"], capture_output=True,
                                 text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, "cannot run %s: %s" % (mmguard, e)
        if out.returncode != 0:
            return None, (out.stderr or out.stdout).strip()[:500]
        try:
            return json.loads(out.stdout), None
        except ValueError as e:
            return None, "bad JSON from mmguard: %s" % e
    finally:
        os.unlink(path)


def latest(records):
    """Last measurement record per config id (a resumed file may repeat ids)."""
    last = {}
    for r in cc.measurements(records):
        last[r.get("id")] = r
    return list(last.values())


def pct(pred, meas):
    if pred is None or not meas:
        return None
    return 100.0 * (float(pred) - float(meas)) / float(meas)


def mape(errs):
    errs = [abs(e) for e in errs if e is not None]
    return sum(errs) / len(errs) if errs else None


def compare(records, mmguard, device=None, hooks_removed=False):
    """Returns a summary dict: rows (per config), errors, mape, goals, oom checks.
    hooks_removed: the records come from a harness that removed the input hooks between
    configs but predates config.input_grad_hooks (--hooks-removed)."""
    rows, oom_rows, errors, rebuilt, refused = [], [], [], [], []
    hooked = {} if hooks_removed else cc.leftover_input_hooks(records)
    for r in latest(records):
        st = r.get("status")
        if st not in ("ok", "oom"):
            continue
        try:
            spec, source = record_spec(r)
        except ValueError as e:
            refused.append({"id": r.get("id"), "why": "no spec, none rebuilt: %s" % e})
            continue
        pred, err = predict(mmguard, spec, device,
                            alloc_conf=(r.get("config") or {}).get("alloc_conf"))
        if pred is None:
            errors.append({"id": r.get("id"), "error": err})
            continue
        if r.get("params"):
            # the spec must describe the model that ran: the predictor's parameter
            # counts per module against calibrate.py's count of the real model (a
            # rebuilt spec's trainable counts too)
            bad = cc.params_mismatch(r["params"], pred.get("modules"),
                                     trainable=source == "rebuilt")
            if bad:
                refused.append({"id": r.get("id"), "why": "%s spec's parameter counts "
                                "differ from the model that ran: %s" % (source, "; ".join(bad))})
                continue
        if source == "rebuilt":
            rebuilt.append(r.get("id"))
        mode = (r.get("config") or {}).get("mode")
        if st == "ok":
            m = r.get("measured") or {}
            row = {
                "id": r["id"], "mode": mode, "spec": source,
                "measured_allocated": m.get("max_memory_allocated"),
                "predicted_allocated": pred.get("allocated_peak_bytes"),
                "measured_reserved": m.get("max_memory_reserved"),
                "predicted_reserved": pred.get("reserved_peak_bytes"),
                "measured_device": m.get("device_peak_bytes"),
                "predicted_device": pred.get("peak_bytes"),
                "measured_phase": m.get("peak_phase"),
                "predicted_phase": pred.get("peak_phase"),
            }
            if id(r) in hooked:
                row["leftover_hooks"] = ("frozen_tower" if cc.hooks_reach_frozen_tower(r)
                                         else "embeddings")
            row["allocated_error_pct"] = pct(row["predicted_allocated"], row["measured_allocated"])
            row["reserved_error_pct"] = pct(row["predicted_reserved"], row["measured_reserved"])
            row["device_error_pct"] = pct(row["predicted_device"], row["measured_device"])
            mp = m.get("phase_peak_allocated") or {}
            pp = pred.get("phase_peak_bytes") or {}
            row["phase_error_pct"] = {k: pct(pp.get(k), mp.get(k)) for k in mp if k in pp}
            rows.append(row)
        else:
            total = (r.get("env") or {}).get("gpu_total_bytes") or \
                (r.get("env") or {}).get("nvml_total_bytes")
            p = pred.get("peak_bytes")
            oom_rows.append({"id": r["id"], "mode": mode, "spec": source, "gpu_total_bytes": total,
                             "predicted_device": p,
                             "predicted_refuses": (p is not None and total is not None
                                                   and p > total)})
    # rows whose run the spec cannot state (a frozen tower kept activations because of a
    # hook an earlier config left): shown, not held to the goals
    excluded = [x for x in rows if x.get("leftover_hooks") == "frozen_tower"]
    all_rows, rows = rows, [x for x in rows if x.get("leftover_hooks") != "frozen_tower"]
    a = mape([x["allocated_error_pct"] for x in rows])
    d = mape([x["device_error_pct"] for x in rows])
    res = mape([x["reserved_error_pct"] for x in rows])
    under = [x for x in rows if x["device_error_pct"] is not None
             and x["device_error_pct"] < -GOAL_UNDER]
    by_mode = {}
    for x in rows:
        bm = by_mode.setdefault(x["mode"], {"n": 0, "alloc": [], "dev": []})
        bm["n"] += 1
        bm["alloc"].append(x["allocated_error_pct"])
        bm["dev"].append(x["device_error_pct"])
    by_mode = {k: {"n": v["n"], "allocated_mape_pct": mape(v["alloc"]),
                   "device_mape_pct": mape(v["dev"])} for k, v in by_mode.items()}
    # admission check on measured points: a job that ran must not be refused
    fits_refused = []
    for x in rows:
        r = next((q for q in records if q.get("id") == x["id"] and q.get("env")), {})
        total = (r.get("env") or {}).get("gpu_total_bytes")
        if total and x["predicted_device"] and x["predicted_device"] > total:
            fits_refused.append(x["id"])
    return {
        "rows": rows, "all_rows": all_rows, "oom_rows": oom_rows, "errors": errors,
        "excluded": [{"id": x["id"], "allocated_error_pct": x["allocated_error_pct"],
                      "reserved_error_pct": x["reserved_error_pct"],
                      "device_error_pct": x["device_error_pct"]} for x in excluded],
        "embedding_hook_rows": [x["id"] for x in rows
                                if x.get("leftover_hooks") == "embeddings"],
        "n_measured": len(rows), "n_oom": len(oom_rows),
        "allocated_mape_pct": a, "device_mape_pct": d, "by_mode": by_mode,
        "reserved_mape_pct": res, "goal_reserved_pct": GOAL_RESERVED,
        "reserved_goal_met": res is None or res <= GOAL_RESERVED,
        "under_predicted": [{"id": x["id"], "device_error_pct": x["device_error_pct"]}
                            for x in under],
        "rebuilt": rebuilt, "refused": refused,
        "goal_allocated_pct": GOAL_ALLOCATED, "goal_device_pct": GOAL_DEVICE,
        "allocated_goal_met": a is not None and a <= GOAL_ALLOCATED,
        "device_goal_met": d is not None and d <= GOAL_DEVICE,
        "oom_not_refused": [x["id"] for x in oom_rows if x["predicted_refuses"] is False],
        "ran_but_refused": fits_refused,
        "device_block": device,
    }


def fmt_pct(v):
    return "%+7.2f%%" % v if v is not None else "      -"


def fmt_mape(v):
    return "%.2f%%" % v if v is not None else "-"


def fmt_gib(v):
    return "%7.2f" % (v / GIB) if v is not None else "      -"


def report(s, out=None):
    w = (out or sys.stdout).write
    w("%-44s %-8s %8s %8s %8s %8s %8s %8s %8s %-9s %-9s\n" % (
        "config", "mode", "meas_al", "pred_al", "err_al", "err_res", "meas_dev", "pred_dev",
        "err_dev", "ph_meas", "ph_pred"))
    for x in s["all_rows"]:
        mark = "x" if x.get("leftover_hooks") == "frozen_tower" else " "
        w("%-43s%s %-8s %8s %8s %8s %8s %8s %8s %8s %-9s %-9s\n" % (
            x["id"][:43], mark, x["mode"], fmt_gib(x["measured_allocated"]),
            fmt_gib(x["predicted_allocated"]), fmt_pct(x["allocated_error_pct"]),
            fmt_pct(x["reserved_error_pct"]),
            fmt_gib(x["measured_device"]), fmt_gib(x["predicted_device"]),
            fmt_pct(x["device_error_pct"]), x["measured_phase"] or "-",
            x["predicted_phase"] or "-"))
    w("(GiB; err = (predicted - measured) / measured; x: not held to the goals, below)\n")
    for x in s["oom_rows"]:
        w("OOM %-40s predicted %s GiB of %s GiB: %s\n" % (
            x["id"], fmt_gib(x["predicted_device"]).strip(),
            fmt_gib(x["gpu_total_bytes"]).strip(),
            "refused (correct)" if x["predicted_refuses"] else "ADMITTED (would OOM)"))
    for e in s["errors"]:
        w("PREDICT-ERROR %s: %s\n" % (e["id"], e["error"]))
    for mode, v in sorted(s["by_mode"].items()):
        w("mode %-9s n=%-3d allocated MAPE %s  device MAPE %s\n" % (
            mode, v["n"], fmt_mape(v["allocated_mape_pct"]), fmt_mape(v["device_mape_pct"])))
    w("MAPE allocated_peak_bytes vs max_memory_allocated: %s (goal <= %.0f%%: %s)\n" % (
        fmt_mape(s["allocated_mape_pct"]), s["goal_allocated_pct"],
        "met" if s["allocated_goal_met"] else "NOT met"))
    if s["reserved_mape_pct"] is not None:
        w("MAPE reserved_peak_bytes vs max_memory_reserved: %s (goal <= %.0f%%: %s)\n" % (
            fmt_mape(s["reserved_mape_pct"]), s["goal_reserved_pct"],
            "met" if s["reserved_goal_met"] else "NOT met"))
    for x in s["under_predicted"]:
        w("GAP %-44s device-level under-predicted by %.2f%% (goal: none beyond %.0f%%)\n" % (
            x["id"], -x["device_error_pct"], GOAL_UNDER))
    if s["rebuilt"]:
        w("spec rebuilt for %d rows recorded without one (calib_common.spec_from_record: "
          "the record's config, build.attention_used and env versions; parameter counts "
          "equal to the measured model's)\n" % len(s["rebuilt"]))
    for x in s["refused"]:
        w("REFUSED %s: %s\n" % (x["id"], x["why"]))
    if s["excluded"]:
        w("EXCLUDED from the goals, %d rows (x): measured after a checkpointed config in the "
          "same worker, with transformers' enable_input_require_grads hook still on the "
          "frozen vision tower's patch_embed (calibrate.py's set_checkpointing before it "
          "removed every hook), so the tower kept its activations for backward: no spec "
          "with checkpointing off states that run. Fresh-worker re-measurements: "
          "tests/gpu_data/README.md\n" % len(s["excluded"]))
    if s["embedding_hook_rows"]:
        w("note: %d rows held to the goals ran with such leftover hooks where they reach no "
          "frozen tower running with autograd (LLaVA's runs under no_grad; a trainable "
          "tower or embedding needs no hook): at most the input embeddings' gradient is "
          "extra, which the spec does not state\n" % len(s["embedding_hook_rows"]))
    w("MAPE peak_bytes vs device-level (nvidia-smi) peak: %s (goal <= %.0f%%: %s)\n" % (
        fmt_mape(s["device_mape_pct"]), s["goal_device_pct"],
        "met" if s["device_goal_met"] else "NOT met"))
    w("measured %d (%d excluded), OOM %d (admitted although OOM: %d), ran but refused: %d, "
      "predict errors %d\n"
      % (s["n_measured"] + len(s["excluded"]), len(s["excluded"]), s["n_oom"],
         len(s["oom_not_refused"]), len(s["ran_but_refused"]), len(s["errors"])))


def main(argv=None):
    ap = argparse.ArgumentParser(description="compare calibration data with mmguard predict")
    ap.add_argument("data", nargs="+", help="JSON-lines files from calibrate.py")
    ap.add_argument("--mmguard", default=os.environ.get("MMGUARD", "build/mmguard"))
    ap.add_argument("--device-json", help="device constants (fit.py --json-out) to apply")
    ap.add_argument("--json-out", help="write the summary as JSON here")
    ap.add_argument("--check-goals", action="store_true", help="exit 1 if a goal is missed")
    ap.add_argument("--hooks-removed", action="store_true",
                    help="the data comes from a calibrate.py that removed the input hooks "
                    "between configs but did not record config.input_grad_hooks yet (the "
                    "H200 Qwen-VL re-measurement, tests/gpu_data/README.md)")
    args = ap.parse_args(argv)
    if not (os.path.exists(args.mmguard) and os.access(args.mmguard, os.X_OK)):
        sys.stderr.write("compare: no executable predictor at %s (build it: make)\n" % args.mmguard)
        return 2
    records = []
    for p in args.data:
        records.extend(cc.read_records(p, warn=lambda m: sys.stderr.write(m + "\n")))
    s = compare(records, args.mmguard, load_device(args.device_json), args.hooks_removed)
    report(s)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(s, f, indent=2, sort_keys=True)
            f.write("\n")
    if not s["rows"]:
        sys.stderr.write("compare: no measured (status ok) configs in the data\n")
        return 1 if args.check_goals else 0
    if args.check_goals and not (s["allocated_goal_met"] and s["device_goal_met"]
                                 and s["reserved_goal_met"]):
        return 1
    if args.check_goals and s["refused"]:
        sys.stderr.write("compare: %d rows refused (their spec does not describe the model "
                         "that ran)\n" % len(s["refused"]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
