#!/usr/bin/env python3
"""mmguard accuracy benchmark: predictor vs the CPU oracle (stdlib only).

For every config of the oracle data set (tests/oracle/data/cpu_oracle.jsonl)
the spec is written to a temp JSON file and `$MMGUARD predict FILE --json` is
run; its allocated_peak_bytes / peak_phase / phase_peak_bytes are compared
with the oracle's measured peak_bytes / peak_phase / phase_peak_bytes.

Errors are signed: err = (predicted - measured) / measured; negative = under-
prediction (the dangerous direction).

  accuracy.py                       summary tables
  accuracy.py --worst 15            + the 15 worst configs, per phase
  accuracy.py --details             + every config, per phase
  accuracy.py --only 'lora.*flash'  restrict to config ids matching a regex
  accuracy.py --json                machine-readable output
  accuracy.py --check               exit 1 unless MAPE <= 3 %, no under-prediction
                                    > 5 %, and peak phase right >= 90 %
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PHASES = ("forward", "backward", "optimizer")
MIB = 1024.0 * 1024.0


def load(path):
    recs = []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            line = line.strip()
            if line:
                try:
                    recs.append(json.loads(line))
                except ValueError as e:
                    sys.exit("accuracy: %s:%d: bad JSON: %s" % (path, ln, e))
    return recs


def predict(mmguard, spec, timeout):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        path = f.name
    try:
        p = subprocess.run([mmguard, "predict", path, "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    finally:
        os.unlink(path)
    if p.returncode != 0:
        return None, "exit %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[:300])
    try:
        return json.loads(p.stdout), None
    except ValueError:
        return None, "unparsable output: %s" % p.stdout.strip()[:200]


def features(rec):
    tr = rec["spec"]["training"]
    return {
        "mode": rec.get("mode", "?"),
        "attention": tr.get("attention", "?"),
        "checkpointing": "on" if tr.get("gradient_checkpointing") else "off",
        "precision": tr.get("precision", "?"),
    }


def err(pred, meas):
    return (pred - meas) / float(meas) if meas else 0.0


def stats(rows, under_thr):
    errs = [r["err"] for r in rows]
    if not errs:
        return None
    return {
        "n": len(errs),
        "mape": 100.0 * sum(abs(e) for e in errs) / len(errs),
        "max_abs": 100.0 * max(abs(e) for e in errs),
        "max_under": 100.0 * max([-e for e in errs if e < 0] or [0.0]),
        "under_gt": sum(1 for e in errs if e < -under_thr),
        "phase_ok": 100.0 * sum(1 for r in rows if r["phase_ok"]) / len(rows),
    }


def fmt_stats_table(title, groups, under_pct):
    out = ["", title,
           "  %-14s %4s %8s %9s %10s %9s %9s" % ("", "n", "MAPE%", "max|e|%", "maxUnder%",
                                                 "under>%g%%" % under_pct, "phase-ok%")]
    for name, st in groups:
        if st is None:
            continue
        out.append("  %-14s %4d %8.2f %9.2f %10.2f %9d %9.1f" % (
            name, st["n"], st["mape"], st["max_abs"], st["max_under"], st["under_gt"], st["phase_ok"]))
    return out


def mib(b):
    return "%.2f" % (b / MIB) if b is not None else "-"


def detail_lines(r):
    rec, pred = r["rec"], r["pred"]
    m = rec["measured"]
    tr = rec["spec"]["training"]
    llm = [x for x in rec["spec"]["modules"] if x["type"] == "llama"][0]
    head = ("%s  B=%d S=%d img=%d h=%d L=%d heads=%d/%d V=%d  err %+.2f%%  phase oracle=%s pred=%s" % (
        rec["id"], tr["micro_batch_size"], tr["seq_len"], tr.get("images_per_sample", 1),
        llm["hidden_size"], llm["num_hidden_layers"], llm["num_attention_heads"],
        llm.get("num_key_value_heads", llm["num_attention_heads"]), llm["vocab_size"],
        100 * r["err"], m["peak_phase"], pred.get("peak_phase")))
    lines = [head,
             "    %-10s %12s %12s %9s" % ("MiB", "oracle", "predicted", "err%"),
             "    %-10s %12s %12s %+9.2f" % ("peak", mib(m["peak_bytes"]), mib(r["pred_peak"]), 100 * r["err"])]
    pp = pred.get("phase_peak_bytes") or {}
    for ph in PHASES:
        mv, pv = m["phase_peak_bytes"][ph], pp.get(ph)
        lines.append("    %-10s %12s %12s %9s" % (ph, mib(mv), mib(pv),
                                                  "%+.2f" % (100 * err(pv, mv)) if pv is not None else "-"))
    lines.append("    %-10s %12s   (params + optimizer states + inputs)" % ("start", mib(m["start_bytes"])))
    lines.append("    %-10s %12s   (live at end of forward - start)" % ("saved", mib(m["saved_bytes"])))
    if "optimizer_state_bytes" in m:
        lines.append("    %-10s %12s   params %d, trainable %d" % (
            "opt.state", mib(m["optimizer_state_bytes"]), m.get("param_count", 0),
            m.get("trainable_param_count", 0)))
    fac = pred.get("factors")
    if isinstance(fac, dict) and fac:
        lines.append("    predictor factors: " + ", ".join(
            "%s=%s" % (k, mib(v) if isinstance(v, (int, float)) else v) for k, v in sorted(fac.items())))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mmguard", default=os.environ.get("MMGUARD", os.path.join(ROOT, "build", "mmguard")))
    ap.add_argument("--data", default=os.path.join(ROOT, "tests", "oracle", "data", "cpu_oracle.jsonl"))
    ap.add_argument("--only", default=None, help="regex on config ids")
    ap.add_argument("--worst", type=int, default=0, metavar="N")
    ap.add_argument("--details", action="store_true", help="per-config per-phase listing of every config")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--max-mape", type=float, default=3.0, help="percent (default 3)")
    ap.add_argument("--max-under", type=float, default=5.0, help="percent (default 5)")
    ap.add_argument("--min-phase", type=float, default=90.0, help="percent of configs (default 90)")
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()

    if not (os.path.isfile(a.mmguard) and os.access(a.mmguard, os.X_OK)):
        print("accuracy: predictor binary not found or not executable: %s\n"
              "accuracy: build it first (make BUILD=... ; or set MMGUARD=/path/to/mmguard)" % a.mmguard,
              file=sys.stderr)
        return 2
    if not os.path.isfile(a.data):
        print("accuracy: oracle data set missing: %s (make oracle)" % a.data, file=sys.stderr)
        return 2
    recs = load(a.data)
    if a.only:
        recs = [r for r in recs if re.search(a.only, r["id"])]
    if not recs:
        print("accuracy: no configs selected", file=sys.stderr)
        return 2

    rows, failures = [], []
    for rec in recs:
        pred, e = predict(a.mmguard, rec["spec"], a.timeout)
        if pred is None or not isinstance(pred.get("allocated_peak_bytes"), (int, float)):
            failures.append({"id": rec["id"], "error": e or "no allocated_peak_bytes in output"})
            continue
        meas = rec["measured"]
        pv = pred["allocated_peak_bytes"]
        rows.append({"rec": rec, "pred": pred, "pred_peak": pv, "err": err(pv, meas["peak_bytes"]),
                     "phase_ok": pred.get("peak_phase") == meas["peak_phase"], "f": features(rec)})

    under = a.max_under / 100.0
    report = {"configs": len(recs), "predicted": len(rows), "failures": failures}
    lines = ["mmguard accuracy vs CPU oracle: %d configs, %d predicted, %d failed (%s)" % (
        len(recs), len(rows), len(failures), a.mmguard)]
    overall = stats(rows, under)
    report["overall"] = overall
    if overall:
        lines += fmt_stats_table("peak (allocated_peak_bytes vs measured peak_bytes)",
                                 [("ALL", overall)], a.max_under)
        report["groups"] = {}
        for key, values in (("mode", ("pretrain", "finetune", "full", "lora")),
                            ("attention", ("eager", "sdpa", "flash")),
                            ("checkpointing", ("off", "on")),
                            ("precision", ("fp32", "bf16"))):
            groups = [(v, stats([r for r in rows if r["f"][key] == v], under)) for v in values]
            report["groups"][key] = {v: s for v, s in groups if s}
            lines += fmt_stats_table("by " + key, groups, a.max_under)
        # per phase
        lines += ["", "per phase (each phase's peak, predicted vs measured)",
                  "  %-14s %4s %8s %9s %10s %9s" % ("", "n", "MAPE%", "max|e|%", "maxUnder%",
                                                    "under>%g%%" % a.max_under)]
        report["phases"] = {}
        for ph in PHASES:
            es = []
            for r in rows:
                pv = (r["pred"].get("phase_peak_bytes") or {}).get(ph)
                if isinstance(pv, (int, float)):
                    es.append(err(pv, r["rec"]["measured"]["phase_peak_bytes"][ph]))
            if es:
                st = {"n": len(es), "mape": 100 * sum(map(abs, es)) / len(es),
                      "max_abs": 100 * max(map(abs, es)),
                      "max_under": 100 * max([-e for e in es if e < 0] or [0.0]),
                      "under_gt": sum(1 for e in es if e < -under)}
                report["phases"][ph] = st
                lines.append("  %-14s %4d %8.2f %9.2f %10.2f %9d" % (
                    ph, st["n"], st["mape"], st["max_abs"], st["max_under"], st["under_gt"]))
        # confusion
        conf = {o: {p: 0 for p in PHASES + ("other",)} for o in PHASES}
        for r in rows:
            o = r["rec"]["measured"]["peak_phase"]
            p = r["pred"].get("peak_phase")
            conf[o][p if p in PHASES else "other"] += 1
        report["phase_confusion"] = conf
        lines += ["", "peak phase: rows = oracle, columns = predictor",
                  "  %-10s %9s %9s %9s %7s" % ("", "forward", "backward", "optimizer", "other")]
        for o in PHASES:
            lines.append("  %-10s %9d %9d %9d %7d" % (o, conf[o]["forward"], conf[o]["backward"],
                                                      conf[o]["optimizer"], conf[o]["other"]))
        lines.append("  correct: %.1f %%" % overall["phase_ok"])
    if failures:
        lines += ["", "predictor failures:"] + ["  %s: %s" % (f["id"], f["error"]) for f in failures[:20]]
        if len(failures) > 20:
            lines.append("  ... %d more" % (len(failures) - 20))
    sel = []
    if a.details:
        sel = rows
    elif a.worst:
        sel = sorted(rows, key=lambda r: -abs(r["err"]))[:a.worst]
    if sel:
        lines += ["", "%s configs:" % ("all" if a.details else "worst %d" % len(sel))]
        for r in sel:
            lines += detail_lines(r)
    report["configs_detail"] = [{
        "id": r["rec"]["id"], "err_pct": 100 * r["err"], "measured": r["rec"]["measured"],
        "predicted": {"allocated_peak_bytes": r["pred_peak"], "peak_phase": r["pred"].get("peak_phase"),
                      "phase_peak_bytes": r["pred"].get("phase_peak_bytes"),
                      "factors": r["pred"].get("factors")}} for r in rows]

    ok = True
    reasons = []
    if failures:
        ok = False
        reasons.append("%d predictor failures" % len(failures))
    if overall:
        if overall["mape"] > a.max_mape:
            ok = False
            reasons.append("MAPE %.2f%% > %.2f%%" % (overall["mape"], a.max_mape))
        if overall["under_gt"]:
            ok = False
            reasons.append("%d under-predictions > %g%% (worst %.2f%%)" % (
                overall["under_gt"], a.max_under, overall["max_under"]))
        if overall["phase_ok"] < a.min_phase:
            ok = False
            reasons.append("peak phase right %.1f%% < %.1f%%" % (overall["phase_ok"], a.min_phase))
    else:
        ok = False
    report["check"] = {"ok": ok, "reasons": reasons}
    if a.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print("\n".join(lines))
        if a.check:
            print("\naccuracy check: %s%s" % ("PASS" if ok else "FAIL", "" if ok else ": " + "; ".join(reasons)))
    if a.check and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
