#!/usr/bin/env python3
"""mmguard against published peak-memory measurements (stdlib only).

tests/published/rows.json lists training runs whose peak GPU memory was published
with their setup: the figure as quoted, which quantity it is, the source (repository,
commit, path, line), what is known and unknown, and how well the spec language can
state the run ("evidence"):

  describable       every memory-relevant setting is stated in the spec
  unknown-setup     the spec language could state the run, but a setting was not
                    published (the spec states an assumption, named in the row)
  not-describable   the run used something the spec cannot state (the reason is
                    given); the prediction is for the closest spec and is shown,
                    but it is not a test of the predictor

Each row's spec is tests/published/<id>.yaml.  The figure is compared with the
predicted quantity it measures (docs/published.md, "Which number is compared"):

  max_memory_allocated  allocated_peak_bytes  (also torch's active_bytes peak)
  max_memory_reserved   reserved_peak_bytes
  device                peak_bytes            (nvidia-smi / NVML: reserved + context)

Errors are signed, (predicted - published) / published: negative = under-prediction.
A prediction that mmguard states as a bound (`bound` in its --json: torch.compile is judged
by the eager prediction, an upper bound) is marked "(bound)" and summed apart from the
modelled rows: a bound is tested by not being under the figure, not by its error.
The constants of the predictor are not fitted to these rows; nothing here is a goal.

  published.py                    the table (and the variants of unknown settings)
  published.py --json             one JSON object
  published.py --check            every row complete and sourced, every spec loads
  published.py --write-doc FILE   rewrite the generated part of docs/published.md
  published.py --check-doc FILE   exit 1 if that part is not what --write-doc writes
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ROWS = os.path.join(HERE, "rows.json")
UNITS = {"B": 1, "GB": 10**9, "GiB": 2**30, "MiB": 2**20}
QUANTITY = {"max_memory_allocated": "allocated_peak_bytes",
            "max_memory_reserved": "reserved_peak_bytes",
            "device": "peak_bytes"}
EVIDENCE = ("describable", "unknown-setup", "not-describable")
REQUIRED = ("id", "source", "quote", "figure", "unit", "quantity", "measured_how", "hardware",
            "setup", "unknown", "evidence")
BEGIN, END = "<!-- published.py: begin -->", "<!-- published.py: end -->"
GIB = 2**30


def load_rows(path):
    with open(path) as f:
        data = json.load(f)
    if data.get("schema") != "mmguard-published/1":
        sys.exit("published: %s: schema is not mmguard-published/1" % path)
    return data["rows"]


def spec_path(row):
    return os.path.join(HERE, row["id"] + ".yaml")


def predict(mmguard, spec, sets=()):
    cmd = [mmguard, "predict", spec, "--json"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if p.returncode != 0:
        return None, (p.stderr.strip() or "exit %d" % p.returncode)
    try:
        return json.loads(p.stdout), None
    except ValueError as e:
        return None, "bad JSON from mmguard: %s" % e


def measured_bytes(row):
    return row["figure"] * UNITS[row["unit"]] * row.get("gpus_summed", 1)


def score(mmguard, row):
    out = {"id": row["id"], "evidence": row["evidence"], "quantity": row["quantity"],
           "measured_bytes": int(round(measured_bytes(row)))}
    pred, err = predict(mmguard, spec_path(row))
    if err:
        out["error"] = err
        return out
    key = QUANTITY[row["quantity"]]
    out["predicted_bytes"] = pred[key]
    out["rel_error"] = (pred[key] - out["measured_bytes"]) / out["measured_bytes"]
    if row["unit"] == "GB":  # "GB" is often GiB in practice: the error under that reading too
        alt = row["figure"] * UNITS["GiB"] * row.get("gpus_summed", 1)
        out["rel_error_if_gib"] = (pred[key] - alt) / alt
    f = pred["factors"]
    if pred.get("bound"):  # the predictor judges this job by a bound, not a model (api/bound.c)
        out["bound"] = pred["bound"]
    out["peak_phase"] = pred["peak_phase"]
    out["peak_event"] = pred["peak_event"]
    out["model_states_bytes"] = f["parameters"] + f["gradients"] + f["optimizer_states"]
    out["factors"] = f
    out["variants"] = []
    for v in row.get("variants", []):
        vp, verr = predict(mmguard, spec_path(row), v["set"])
        vo = {"label": v["label"], "set": v["set"]}
        if verr:
            vo["error"] = verr
        else:
            vo["predicted_bytes"] = vp[key]
            vo["rel_error"] = (vp[key] - out["measured_bytes"]) / out["measured_bytes"]
        out["variants"].append(vo)
    return out


def summarize(rows, results):
    """errors of the modelled rows by evidence; rows whose prediction is a bound (its --json
    'bound') are counted apart: an upper bound is tested by never being under, not by its error"""
    groups = {}
    for e in EVIDENCE:
        mine = [r for r in results if r["evidence"] == e and "rel_error" in r]
        errs = [r["rel_error"] for r in mine if not r.get("bound")]
        bnd = [r["rel_error"] for r in mine if r.get("bound")]
        groups[e] = {"rows": sum(1 for r in rows if r["evidence"] == e), "scored": len(errs),
                     "mean_abs_error": sum(abs(x) for x in errs) / len(errs) if errs else None,
                     "max_abs_error": max((abs(x) for x in errs), default=None),
                     "within_10pct": sum(1 for x in errs if abs(x) <= 0.10),
                     "bound_rows": len(bnd), "bound_under": sum(1 for x in bnd if x < 0)}
    return groups


def group_line(e, g):
    s = "%d rows" % g["rows"]
    if g["bound_rows"]:
        s += ", %d modelled" % g["scored"]
    s += ": mean |error| %s, max |error| %s, within 10 %%: %d" % (
        pct(g["mean_abs_error"]).lstrip("+"), pct(g["max_abs_error"]).lstrip("+"), g["within_10pct"])
    if g["bound_rows"]:
        s += "; %d judged by an upper bound, %d of them under the figure" % (g["bound_rows"], g["bound_under"])
    return s


def err_text(r):
    return pct(r.get("rel_error")) + (" (bound)" if r.get("bound") else "")


def pct(x):
    return "—" if x is None else "%+.1f %%" % (100 * x)


def gib(b):
    return "%.2f GiB" % (b / GIB)


def fig(row):
    s = "%s %s" % (row["figure"], row["unit"])
    if row.get("gpus_summed"):
        s = "%d × %s" % (row["gpus_summed"], s)
    return s


def text_table(rows, results, groups):
    w = max(len(r["id"]) for r in rows)
    print("mmguard vs published measurements (tests/published, %d rows)\n" % len(rows))
    print("%-*s  %-15s  %-20s  %14s  %11s  %11s  %8s" % (
        w, "row", "evidence", "quantity", "published", "=", "predicted", "error"))
    for row, r in zip(rows, results):
        if "error" in r:
            print("%-*s  %-15s  %-20s  %14s  ERROR: %s" % (w, row["id"], row["evidence"], row["quantity"],
                                                         fig(row), r["error"]))
            continue
        print("%-*s  %-15s  %-20s  %14s  %11s  %11s  %8s" % (
            w, row["id"], row["evidence"], row["quantity"], fig(row), gib(r["measured_bytes"]),
            gib(r["predicted_bytes"]), err_text(r)))
    print()
    for e in EVIDENCE:
        print("%-15s %s" % (e, group_line(e, groups[e])))
    var = [(row, r, v) for row, r in zip(rows, results) for v in r.get("variants", [])]
    if var:
        print("\nunknown settings, the same rows with another value:")
        for row, r, v in var:
            print("  %-*s  %-44s  %11s  %8s" % (w, row["id"], v["label"],
                                                gib(v["predicted_bytes"]) if "predicted_bytes" in v else "ERROR",
                                                pct(v.get("rel_error"))))
    gb = [(row, r) for row, r in zip(rows, results) if "rel_error_if_gib" in r]
    if gb:
        print("\npublished in \"GB\", read as GiB instead:")
        for row, r in gb:
            print("  %-*s  %-44s  %11s  %8s" % (w, row["id"], "%s GiB" % row["figure"], "",
                                                pct(r["rel_error_if_gib"])))
    print("\n(not-describable rows: the closest spec, not a test of the predictor; docs/published.md)")


def md_escape(s):
    return s.replace("|", "\\|")


def markdown(rows, results, groups):
    L = []
    L.append("| row | evidence | measured | published | predicted | error |")
    L.append("|---|---|---|---:|---:|---:|")
    for row, r in zip(rows, results):
        L.append("| [%s](#%s) | %s | %s | %s (%s) | %s | %s |" % (
            row["id"], row["id"], row["evidence"], row["quantity"], fig(row), gib(r["measured_bytes"]),
            gib(r["predicted_bytes"]) if "predicted_bytes" in r else "error",
            err_text(r)))
    L.append("")
    for e in EVIDENCE:
        L.append("- %s: %s" % (e, group_line(e, groups[e])))
    L.append("")
    for row, r in zip(rows, results):
        s = row["source"]
        L.append('### %s' % row["id"])
        L.append("")
        where = "%s@%s `%s`%s" % (s["repo"], s["commit"][:12], s["path"],
                                  " line %s" % s["lines"] if s.get("lines") else "")
        L.append("- source: [%s](%s)" % (where, s["url"]))
        L.append("- quoted: `%s`" % row["quote"].replace("`", "'"))
        L.append("- measured: %s — %s" % (row["quantity"], row["measured_how"]))
        L.append("- hardware: %s" % row["hardware"])
        L.append("- setup: %s" % row["setup"])
        L.append("- unknown: %s" % ("; ".join(row["unknown"]) if row["unknown"] else "nothing memory-relevant found"))
        L.append("- evidence: **%s**%s" % (row["evidence"], " — " + row["reason"] if row.get("reason") else ""))
        if "predicted_bytes" in r:
            f = r["factors"]
            L.append("- predicted: %s (%s), error %s; peak in %s (`%s`); at the peak: parameters %s, "
                     "gradients %s, optimizer states %s, activations %s, temporaries %s; model states %s" % (
                         gib(r["predicted_bytes"]), QUANTITY[row["quantity"]], pct(r["rel_error"]),
                         r["peak_phase"], r["peak_event"], gib(f["parameters"]), gib(f["gradients"]),
                         gib(f["optimizer_states"]), gib(f["activations"]), gib(f["temporaries"]),
                         gib(r["model_states_bytes"])))
        if r.get("bound"):
            L.append("- judged by a bound: %s" % r["bound"])
        if "rel_error_if_gib" in r:
            L.append("- if the published GB were GiB: error %s" % pct(r["rel_error_if_gib"]))
        for v in r.get("variants", []):
            L.append("- variant, %s (`%s`): %s, error %s" % (
                v["label"], " ".join("--set " + x for x in v["set"]),
                gib(v["predicted_bytes"]) if "predicted_bytes" in v else "error", pct(v.get("rel_error"))))
        if row.get("analysis"):
            L.append("- analysis: %s" % row["analysis"])
        L.append("")
    return "\n".join(L).rstrip("\n") + "\n"


def doc_parts(path):
    with open(path) as f:
        text = f.read()
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        sys.exit("published: %s has no %s ... %s section" % (path, BEGIN, END))
    return text[:i + len(BEGIN)], text[i + len(BEGIN):j], text[j:]


def check_rows(rows, mmguard):
    """every row complete and sourced, every spec loads, every spec belongs to a row"""
    fails = []
    ids = set()
    for row in rows:
        rid = row.get("id", "?")
        for k in REQUIRED:
            if k not in row or row[k] in ("", None):
                fails.append("%s: missing %s" % (rid, k))
        if rid in ids:
            fails.append("%s: duplicate id" % rid)
        ids.add(rid)
        if row.get("evidence") not in EVIDENCE:
            fails.append("%s: evidence must be one of %s" % (rid, ", ".join(EVIDENCE)))
        if row.get("evidence") != "describable" and not row.get("reason"):
            fails.append("%s: a %s row needs its reason" % (rid, row.get("evidence")))
        if row.get("quantity") not in QUANTITY:
            fails.append("%s: quantity must be one of %s" % (rid, ", ".join(QUANTITY)))
        if row.get("unit") not in UNITS:
            fails.append("%s: unit must be one of %s" % (rid, ", ".join(UNITS)))
        if not isinstance(row.get("unknown"), list):
            fails.append("%s: unknown must be a list (empty when nothing is)" % rid)
        s = row.get("source") or {}
        for k in ("repo", "commit", "path", "url"):
            if not s.get(k):
                fails.append("%s: source.%s missing" % (rid, k))
        if s.get("commit") and not re.fullmatch(r"[0-9a-f]{40}", s["commit"]):
            fails.append("%s: source.commit is not a full commit id" % rid)
        sp = spec_path(row)
        if not os.path.isfile(sp):
            fails.append("%s: no spec %s" % (rid, os.path.relpath(sp, ROOT)))
            continue
        with open(sp) as f:
            head = "".join(l for l in f if l.startswith("#"))
        if s.get("commit") and s["commit"][:8] not in head:
            fails.append("%s: the spec's header comment does not name the source commit %s" % (
                rid, s["commit"][:8]))
        pred, err = predict(mmguard, sp)
        if err:
            fails.append("%s: spec does not load: %s" % (rid, err))
        for v in row.get("variants", []):
            _, verr = predict(mmguard, sp, v["set"])
            if verr:
                fails.append("%s: variant %r does not load: %s" % (rid, v["label"], verr))
    for fn in sorted(os.listdir(HERE)):
        if fn.endswith(".yaml") and fn[:-5] not in ids:
            fails.append("%s: a spec with no row in rows.json" % fn)
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mmguard", default=os.path.join(ROOT, "build", "mmguard"))
    ap.add_argument("--rows", default=ROWS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write-doc", metavar="FILE")
    ap.add_argument("--check-doc", metavar="FILE")
    a = ap.parse_args()
    rows = load_rows(a.rows)
    if a.check:
        fails = check_rows(rows, a.mmguard)
        for f in fails:
            print("check-published: FAIL: " + f, file=sys.stderr)
        print("check-published: %s (%d rows, %d specs)" % (
            "FAILED" if fails else "passed", len(rows), len(rows)))
        return 1 if fails else 0
    results = [score(a.mmguard, r) for r in rows]
    groups = summarize(rows, results)
    if a.write_doc or a.check_doc:
        path = a.write_doc or a.check_doc
        pre, mid, post = doc_parts(path)
        new = "\n" + markdown(rows, results, groups)
        if a.write_doc:
            with open(path, "w") as f:
                f.write(pre + new + post)
            print("published: wrote %s" % path)
            return 0
        if mid != new:
            print("published: %s is stale: run `make published-doc`" % path, file=sys.stderr)
            return 1
        print("published: %s matches the predictions" % path)
        return 0
    if a.json:
        json.dump({"rows": results, "summary": groups}, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        text_table(rows, results, groups)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
