#!/usr/bin/env python3
"""mmguard accuracy: the predictor against the real-library oracle (stdlib only).

Every row of tests/truth/data/truth.jsonl is a training step of a real
transformers / PEFT / torch.distributed / DeepSpeed job, measured byte-exact on
the CPU (docs/oracle.md).  For each row this script writes the row's own
config.json and preprocessor_config.json to a temporary directory, a spec that
references them (`hf_config:`) and states the row's training setup, runs
`mmguard predict SPEC --json`, and compares allocated_peak_bytes / peak_phase
with the measured peak of the busiest rank.

A row the spec language cannot state is "not describable" and reported with
the reason; no row is dropped.  Errors are signed: (predicted - measured) /
measured, negative = under-prediction (the dangerous direction).

  accuracy.py                     tables by family and by parallel mode
  accuracy.py --worst 15          + the 15 worst rows
  accuracy.py --only REGEX        rows whose id matches
  accuracy.py --json              one JSON object (schema in docs/oracle.md)
  accuracy.py --check BASELINE    exit 1 if a group misses its goal and is not
                                  excused in BASELINE (with a reason and a committed
                                  trace), regresses past it, or is excused but meets it
  accuracy.py --write-baseline F  write today's groups that miss the goal to F
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PHASES = ("forward", "backward", "optimizer")
GOAL = {"mape": 0.01, "max_under": 0.02, "phase_right": 0.95}
SECTIONS = ("families", "parallel", "features")

# the truth runner's "language-linear": PEFT on every q/k/v/o/gate/up/down Linear
# of the language model (a regex there, PEFT's all-linear for text-only models)
LORA_ALL = "all-linear"


def load(path):
    rows = []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    sys.exit("accuracy: %s:%d: bad JSON: %s" % (path, ln, e))
    return rows


def precision_keys(prec, par):
    """training keys for the row's precision: fp32; bf16 = the model in bf16
    (pure bf16 optimizer states, or DeepSpeed's fp32 master copy); amp_bf16 = an
    fp32 model under autocast (accelerate's mixed precision)"""
    if prec == "fp32":
        return {"precision": "fp32"}
    if prec == "amp_bf16":
        return {"precision": "bf16", "master_weights": "fp32", "autocast": True}
    if par.startswith("zero"):
        return {"precision": "bf16", "master_weights": "fp32"}
    return {"precision": "bf16", "master_weights": "none"}


def checkpointing(gc):
    if not gc:
        return False
    out = {"enabled": True, "use_reentrant": bool(gc.get("use_reentrant", True))}
    if gc.get("every_n_layers", 1) != 1:
        out["every_n_layers"] = gc["every_n_layers"]
    if gc.get("selective") == "op":      # torchtitan's op-level policy (tests/truth/feat_compile.py)
        out["granularity"] = "selective_op"
    return out


def parallel_sections(setup, spec):
    par, po, tr = setup["parallel"], setup.get("parallel_options") or {}, spec["training"]
    tr["data_parallel"] = setup["world_size"]
    if par == "tp":                 # tests/truth/tp.py: one tensor-parallel group, no data parallel
        tr["data_parallel"] = 1
        tr["tensor_parallel"] = po["tensor_parallel"]
        if po.get("sequence_parallel"):
            tr["sequence_parallel"] = True
    if setup.get("grad_accum"):     # tests/truth/accum.py rows: micro-batches per optimizer step
        tr["gradient_accumulation_steps"] = setup["grad_accum"]
    if par == "ddp":
        spec["ddp"] = {"gradient_as_bucket_view": bool(po.get("gradient_as_bucket_view")),
                       "bucket_cap_mb": po.get("bucket_cap_mb", 25)}
    elif par.startswith("zero"):
        z = po["deepspeed"]["zero_optimization"]
        tr["zero_stage"] = z["stage"]
        ds = {k: z[k] for k in ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                                "contiguous_gradients", "stage3_prefetch_bucket_size",
                                "stage3_max_live_parameters", "stage3_param_persistence_threshold",
                                "sub_group_size", "stage3_max_reuse_distance", "round_robin_gradients") if k in z}
        spec["deepspeed"] = ds
    elif par in ("fsdp1", "fsdp2"):
        f = {"version": 1 if par == "fsdp1" else 2}
        if par == "fsdp1":
            f["use_orig_params"] = bool(po.get("use_orig_params", True))
            f["sharding_strategy"] = po.get("sharding", "FULL_SHARD")
            if po.get("wrap_policy"):       # tests/truth/feat_wrap.py: PEFT's fsdp_auto_wrap_policy
                f["wrap_policy"] = po["wrap_policy"]
            if "min_num_params" in po:      # feat_wrap.py size rows: size_based_auto_wrap_policy
                f["min_num_params"] = po["min_num_params"]
        else:
            f["reshard_after_forward"] = bool(po.get("reshard_after_forward", True))
        if po.get("mixed_precision") == "bf16":
            f["param_dtype"] = "bf16"
            f["reduce_dtype"] = "bf16" if par == "fsdp1" else "fp32"
        if "sync_each_micro_batch" in setup:
            f["sync_each_micro_batch"] = bool(setup["sync_each_micro_batch"])
        spec["fsdp"] = f


def module_overrides(row):
    """trainable flags and LoRA on the imported modules (names as `mmguard import` writes them)"""
    s = row["setup"]
    tp = s["trainable"]
    mods = [{"name": "vision_tower", "trainable": tp["vision"]},
            {"name": "projector", "trainable": tp["connector"]},
            {"name": "language_model", "trainable": tp["language"]}]
    if "vit_gradient_checkpointing" in s:   # ms-swift's per-tower switch (tests/truth/feat_towers.py)
        mods[0]["gradient_checkpointing"] = bool(s["vit_gradient_checkpointing"])
    if not row["preprocessor"] and not s.get("images_per_sample"):
        mods = mods[2:]
    lc = s.get("lora")
    if s["mode"] == "lora" and lc:
        tm = lc["target_modules"]
        mods[-1]["lora"] = {"r": lc["r"], "lora_alpha": lc["lora_alpha"],
                            "lora_dropout": lc["lora_dropout"],
                            "target_modules": LORA_ALL if tm == "language-linear" else tm,
                            "autocast_adapter_dtype": bool(lc.get("autocast_adapter_dtype", True))}
        if lc.get("modules_to_save"):   # tests/truth/feat_lorahead.py: PEFT's trainable copies
            mods[-1]["lora"]["modules_to_save"] = list(lc["modules_to_save"])
    return mods


def make_spec(row, d):
    s = row["setup"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(row["config"], f)
    if row.get("preprocessor"):
        with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
            json.dump(row["preprocessor"], f)
    tr = {"micro_batch_size": s["micro_batch_size"], "seq_len": s["seq_len"],
          "attention": s["attention"], "optimizer": "adamw",
          "optimizer_impl": "fused" if s["optimizer"] == "adamw_torch_fused" else "foreach",
          "max_grad_norm": s["max_grad_norm"],
          "gradient_checkpointing": checkpointing(s["gradient_checkpointing"])}
    tr.update(precision_keys(s["precision"], s["parallel"]))
    if s.get("torch_compile"):
        tr["torch_compile"] = True
    if s.get("loss_upcast") is False:    # tests/truth/feat_keys.py: the loss on 16-bit logits
        tr["loss_upcast"] = False
    if s.get("video_frames"):       # tests/truth/feat_towers.py: one Qwen-VL video per "image"
        tr["video_frames"] = s["video_frames"]
    for k in ("video_min_pixels", "video_max_pixels"):  # a frame's own bounds (feat_towers.py)
        if s.get(k):
            tr[k] = s[k]
    if any((s.get("liger") or {}).values()):   # tests/truth/feat_liger.py: Liger's kernels,
        # patched as apply_liger_kernel_to_<type>(model=...) does; the rows keep the model's loss
        tr["liger_kernel"] = dict(s["liger"], fused_linear_cross_entropy=False)
    if s.get("images_per_sample"):
        tr["images_per_sample"] = s["images_per_sample"]
        tr["image_size"] = list(s["image_size"])
    else:
        tr["images_per_sample"] = 0
    spec = {"name": row["id"], "hf_config": "config.json", "modules": module_overrides(row),
            "training": tr,
            "framework": {"transformers_version": row["versions"]["transformers"],
                          "torch_version": row["versions"]["torch"].split("+")[0]}}
    parallel_sections(s, spec)
    path = os.path.join(d, "spec.json")
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)
    return path


def measured(row):
    ranks = row["measured"]["ranks"]
    top = max(ranks, key=lambda r: r["peak_bytes"])
    return top["peak_bytes"], top["peak_phase"], top["phase_peak_bytes"]


def run_row(mmguard, row, keep):
    d = tempfile.mkdtemp(prefix="mmacc-")
    try:
        path = make_spec(row, d)
        p = subprocess.run([mmguard, "predict", path, "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        if p.returncode != 0:
            return {"row": row, "error": (p.stderr or p.stdout).strip().replace(d + "/", "")}
        return {"row": row, "pred": json.loads(p.stdout), "dir": d if keep else None}
    except subprocess.TimeoutExpired:
        return {"row": row, "error": "timeout"}
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def score(res):
    row = res["row"]
    peak, phase, phases = measured(row)
    res["measured"], res["measured_phase"], res["measured_phases"] = peak, phase, phases
    if "pred" in res:
        p = res["pred"]
        res["predicted"] = p["allocated_peak_bytes"]
        res["predicted_phase"] = p["peak_phase"]
        res["err"] = (res["predicted"] - peak) / float(peak)
        res["phase_errs"] = {ph: (p["phase_peak_bytes"][ph] - phases[ph]) / float(phases[ph])
                             for ph in PHASES if phases.get(ph)}
    return res


def group_stats(items):
    ok = [r for r in items if "err" in r]
    g = {"n": len(items), "describable": len(ok)}
    if ok:
        errs = [r["err"] for r in ok]
        g["mape"] = sum(abs(e) for e in errs) / len(errs)
        g["max_over"] = max(0.0, max(errs))
        g["max_under"] = max(0.0, -min(errs))
        g["phase_right"] = sum(r["predicted_phase"] == r["measured_phase"] for r in ok) / float(len(ok))
    else:
        g.update({"mape": None, "max_over": None, "max_under": None, "phase_right": None})
    why = sorted({r["error"].split("\n")[0][:160] for r in items if "error" in r})
    if why:
        g["not_describable"] = why
    return g


def meets(g):
    return (g["describable"] == g["n"] and g["mape"] is not None and g["mape"] <= GOAL["mape"]
            and g["max_under"] <= GOAL["max_under"] and g["phase_right"] >= GOAL["phase_right"])


def features(setup):
    """feature groups a row belongs to (beside its family and parallel mode)"""
    out = []
    if setup.get("grad_accum", 1) > 1:
        out.append(("fsdp" if setup["parallel"].startswith("fsdp") else setup["parallel"]) + "+accumulation")
    if (setup.get("gradient_checkpointing") or {}).get("selective") == "op":
        out.append("selective AC")      # torchtitan's op-level policy: modelled, judged by the goal
    if setup.get("loss_upcast") is False:
        out.append("loss without upcast")   # tests/truth/feat_keys.py: modelled, judged by the goal
    if "vit_gradient_checkpointing" in setup:
        out.append("tower checkpointing")   # tests/truth/feat_towers.py: modelled, judged by the goal
    if setup.get("video_frames"):
        out.append("qwen-vl video")         # tests/truth/feat_towers.py
    if setup["parallel"] == "tp":
        out.append("tensor parallel")   # tests/truth/tp.py: modelled, judged by the goal
        if (setup.get("parallel_options") or {}).get("sequence_parallel"):
            out.append("sequence parallel")   # torchtitan's whole plan: modelled, judged by the goal
    if any((setup.get("liger") or {}).values()):
        out.append("liger")             # Liger's kernels, emulated (tests/truth/feat_liger.py)
    if (setup.get("parallel_options") or {}).get("wrap_policy"):
        out.append("fsdp wrap policy")  # tests/truth/feat_wrap.py: modelled, judged by the goal
    if (setup.get("parallel_options") or {}).get("wrap_policy") == "size":
        out.append("fsdp size wrap")    # feat_wrap.py size_setups: min_num_params, judged by the goal
    lc = setup.get("lora") or {}
    if (isinstance(lc.get("target_modules"), list) and {"lm_head", "embed_tokens"} &
            set(lc["target_modules"])) or lc.get("modules_to_save"):
        out.append("lora on head/embeddings")   # tests/truth/feat_lorahead.py
    return out


def is_bound(r):
    """rows the predictor judges by a bound, not a model (torch.compile: the eager prediction)"""
    return bool(bound_name(r))


def bound_name(r):
    """the bound's group: torch.compile (the eager prediction); None: a model"""
    s = r["row"]["setup"]
    if s.get("torch_compile"):
        return "torch.compile"
    if (s.get("parallel_options") or {}).get("wrap_policy") == "peft_lora" and any(s["trainable"].values()):
        return "fsdp peft wrap, trainable connector"   # bound.c: feat_wrap.py's LLaVA rows
    return None


def bound_stats(items):
    """a bound's group: never under on the rows the predictor accepts (the bound holds; rows it
    refuses, with the reason, are where the data shows no safe bound); its worst margin and the
    predictor's own statement of it (the prediction's "bound")"""
    g = group_stats(items)
    ok = [r for r in items if "err" in r]
    g["kind"] = "bound"
    g["min_margin"] = min(r["err"] for r in ok) if ok else None
    g["stated"] = sorted({r["pred"].get("bound", "") for r in ok})
    g["meets_goal"] = bool(ok) and g["min_margin"] >= 0
    return g


def bound_claim_fails(name, g):
    """the predictor's sentence states the row count and the worst margin (bound.c): both
    must be today's, so that data which breaks or moves the bound fails the check"""
    want = ("(%d rows, worst margin %+.1f %%)" % (g["describable"], 100 * g["min_margin"])
            if g["min_margin"] is not None else None)
    if not want or len(g["stated"]) != 1 or want not in g["stated"][0]:
        return ["%s: the predictor states %s, the data says %s" % (name, g["stated"], want)]
    return []


def summarize(results):
    v = results[0]["row"]["versions"] if results else {}
    bounds = [r for r in results if is_bound(r)]
    results = [r for r in results if not is_bound(r)]
    fams, pars, feats = {}, {}, {}
    for r in results:
        fams.setdefault(r["row"]["family"], []).append(r)
        pars.setdefault(r["row"]["setup"]["parallel"], []).append(r)
        for f in features(r["row"]["setup"]):
            feats.setdefault(f, []).append(r)
    out = {"source": {k: v.get(k) for k in ("torch", "transformers", "peft", "accelerate",
                                              "deepspeed")},
           "rows": len(results),
           "families": {k: group_stats(fams[k]) for k in sorted(fams)},
           "parallel": {k: group_stats(pars[k]) for k in sorted(pars)},
           "features": {k: group_stats(feats[k]) for k in sorted(feats)},
           "all": group_stats(results)}
    for sec in SECTIONS:
        for g in out[sec].values():
            g["meets_goal"] = meets(g)
    for name in sorted({bound_name(r) for r in bounds}):   # judged apart: a bound holds or its key is refused
        out["features"][name] = bound_stats([r for r in bounds if bound_name(r) == name])
    return out


def pct(x):
    return "-" if x is None else "%.2f%%" % (100 * x)


def table(title, groups):
    print("%-18s %5s %5s %8s %9s %9s %7s  %s" % (title, "rows", "desc", "MAPE", "max over",
                                                  "max under", "phase", "goal"))
    for k, g in groups.items():
        print("%-18s %5d %5d %8s %9s %9s %7s  %s" % (
            k, g["n"], g["describable"], pct(g["mape"]), pct(g["max_over"]), pct(g["max_under"]),
            pct(g["phase_right"]), "met" if g.get("meets_goal") else "MISSED"))
    print()


def worst(results, n):
    ok = sorted([r for r in results if "err" in r], key=lambda r: -abs(r["err"]))[:n]
    print("worst rows (err = predicted/measured - 1; phases f/b/o)")
    for r in ok:
        pe = r["phase_errs"]
        print("  %+7.2f%%  %-9s %-9s f%+.1f b%+.1f o%+.1f  %s" % (
            100 * r["err"], r["measured_phase"], r["predicted_phase"],
            100 * pe.get("forward", 0), 100 * pe.get("backward", 0), 100 * pe.get("optimizer", 0),
            r["row"]["id"]))
    bad = [r for r in results if "error" in r]
    if bad:
        print("not describable (%d):" % len(bad))
        for r in bad[:n]:
            print("  %s: %s" % (r["row"]["id"], r["error"].split("\n")[0][:200]))
    print()


def check(summary, baseline_path):
    """Every group meets the goal, or is excused in the baseline with its reason and
    may not get worse than the baseline's numbers (+0.05 points of slack)."""
    with open(baseline_path) as f:
        base = json.load(f)
    fails = []
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for k, g in summary.get("features", {}).items():
        if g.get("kind") == "bound":       # a bound is never excused: it holds or the key is refused
            if not g["meets_goal"]:
                fails.append("feature %s: the bound does not hold (worst margin %s)" % (k, pct(g["min_margin"])))
            fails += bound_claim_fails("feature " + k, g)
    for sec in SECTIONS:
        for k in base.get(sec, {}):
            g = summary[sec].get(k)
            if g is None or g["meets_goal"]:
                fails.append("%s %s: excused in the baseline but meets the goal: remove the entry" % (sec, k))
        for k, g in summary[sec].items():
            if g["meets_goal"] or g.get("kind") == "bound":     # bounds: judged above, never excused
                continue
            b = base.get(sec, {}).get(k)
            if not b:
                fails.append("%s %s misses the goal and has no baseline entry" % (sec, k))
                continue
            if not b.get("reason") or b["reason"].startswith("TODO"):
                fails.append("%s %s: the baseline gives no reason" % (sec, k))
            # an excuse rests on a committed trace of a row it names (truth.py run --trace)
            tr = b.get("trace")
            if not tr or not os.path.isfile(os.path.join(root, tr)):
                fails.append("%s %s: the baseline names no committed trace (%s)" % (sec, k, tr))
            if g["describable"] < b["describable"]:
                fails.append("%s %s: %d rows describable, baseline %d" % (sec, k, g["describable"],
                                                                          b["describable"]))
            for m in ("mape", "max_under"):
                if g[m] is not None and b.get(m) is not None and g[m] > b[m] + 0.0005:
                    fails.append("%s %s: %s %s, baseline %s" % (sec, k, m, pct(g[m]), pct(b[m])))
            # the baseline keeps 6 decimals: 27/28 = 0.9642857 is stored as 0.964286
            bp = b.get("phase_right")
            if g["phase_right"] is not None and bp is not None and g["phase_right"] < bp - 1e-5:
                fails.append("%s %s: phase right %s, baseline %s" % (
                    sec, k, pct(g["phase_right"]), pct(b["phase_right"])))
    return fails


def write_baseline(summary, path):
    """groups that miss the goal, with today's numbers; a reason already written
    for a group is kept, a new group gets a placeholder that --check refuses"""
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    out = {"_comment": "groups of tests/accuracy/accuracy.py that do not meet the goal yet: each with "
                       "the reason, a committed trace (truth.py run --trace) of the row it names, and "
                       "the numbers it may not get worse than"}
    for sec in SECTIONS:
        out[sec] = {}
        for k, g in sorted(summary[sec].items()):
            if g["meets_goal"] or g.get("kind") == "bound":
                continue
            reason = old.get(sec, {}).get(k, {}).get("reason", "TODO: say why")
            trace = old.get(sec, {}).get(k, {}).get("trace")
            out[sec][k] = {"reason": reason, "trace": trace, "describable": g["describable"],
                           "mape": round(g["mape"], 6) if g["mape"] is not None else None,
                           "max_under": round(g["max_under"], 6) if g["max_under"] is not None
                           else None,
                           "phase_right": round(g["phase_right"], 6)
                           if g["phase_right"] is not None else None}
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mmguard", default=os.path.join(ROOT, "build", "mmguard"))
    ap.add_argument("--data", default=os.path.join(ROOT, "tests", "truth", "data", "truth.jsonl"))
    ap.add_argument("--prefer", metavar="FILE",
                    help="rows of FILE replace the data's rows of the same id (a regeneration in progress)")
    ap.add_argument("--only", help="regex on row ids")
    ap.add_argument("--worst", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", metavar="BASELINE")
    ap.add_argument("--write-baseline", metavar="FILE",
                    help="write the groups that miss the goal, with their numbers, to FILE")
    ap.add_argument("--keep", action="store_true", help="keep each row's spec directory (printed)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    rows = load(a.data)
    if a.prefer and os.path.exists(a.prefer):
        newer = {r["id"]: r for r in load(a.prefer)}
        rows = [newer.get(r["id"], r) for r in rows]
    if a.only:
        rows = [r for r in rows if re.search(a.only, r["id"])]
    if not rows:
        sys.exit("accuracy: no rows")
    with ThreadPoolExecutor(max_workers=a.jobs) as ex:
        results = [score(r) for r in ex.map(lambda r: run_row(a.mmguard, r, a.keep), rows)]
    summary = summarize(results)
    if a.keep:
        for r in results:
            if r.get("dir"):
                print("%s %s" % (r["dir"], r["row"]["id"]), file=sys.stderr)
    if a.json:
        json.dump(summary, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        print("mmguard vs the real libraries (%s): %d rows\n" % (
            ", ".join("%s %s" % kv for kv in summary["source"].items() if kv[1]), len(results)))
        table("family", summary["families"])
        table("parallel", summary["parallel"])
        if summary["features"]:
            table("feature", summary["features"])
            for k, g in summary["features"].items():
                if g.get("kind") == "bound":
                    print("%s is judged by a bound (never under): worst margin %s; the predictor says %s\n"
                          % (k, pct(g["min_margin"]), "; ".join(g["stated"])))
        table("all", {"all": summary["all"]})
        if a.worst:
            worst(results, a.worst)
    if a.write_baseline:
        write_baseline(summary, a.write_baseline)
        print("accuracy: wrote %s" % a.write_baseline)
    if a.check:
        fails = check(summary, a.check)
        for f in fails:
            print("accuracy: FAIL: " + f, file=sys.stderr)
        print("accuracy: %s (%d rows, goal MAPE <= 1%%, under <= 2%%, phase >= 95%% per group)" % (
            "FAILED" if fails else "passed", len(results)))
        return 1 if fails else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
