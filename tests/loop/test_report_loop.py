#!/usr/bin/env python3
"""`mmguard report --json` on a recorded log of many jobs
(tests/fixtures/outcome/synthetic-loop.jsonl: SYNTHETIC, made by
scripts/gen_outcome_fixture.py): every number of the "outcomes" object is
recomputed here from the log's lines by a second, independent reading of the
rules in docs/report.md ("Outcomes") and compared.

    python3 tests/loop/test_report_loop.py build/mmguard
"""
import json
import math
import subprocess
import sys

MMGUARD = sys.argv[1] if len(sys.argv) > 1 else "build/mmguard"
LOG = "tests/fixtures/outcome/synthetic-loop.jsonl"
MARGINS = [0, 2.5, 5, 7.5, 10, 15, 20, 25, 30, 40]
passed = failed = 0


def check(name, got, want):
    global passed, failed
    if got == want:
        passed += 1
    else:
        failed += 1
        print("FAIL %s: got %r, want %r" % (name, got, want))


lines = [json.loads(l) for l in open(LOG)]
assert all(l.get("synthetic") is True for l in lines), "the fixture must be labelled synthetic"
outs = [l for l in lines if l.get("event") == "outcome"]
decs = [l for l in lines if "decision" in l]
rep = json.loads(subprocess.run([MMGUARD, "report", "--json", LOG], check=True,
                                capture_output=True, text=True).stdout)
o = rep["outcomes"]

check("decision records", rep["records"], len(decs))
check("no malformed line", rep["malformed"], 0)
check("jobs", o["jobs_total"], len(outs))
check("records ok", o["records"]["ok"], sum(l["record_state"] == "ok" for l in outs))
check("records missing", o["records"]["missing"], sum(l["record_state"] == "missing" for l in outs))


def dev_peak(m):
    if not m:
        return None
    return m["nvml_peak_used_bytes"] if m.get("nvml_peak_used_bytes") is not None else m.get("max_reserved_bytes")


def oomed(m):
    return bool(m) and (m["status"] == "oom" or (m.get("num_ooms") or 0) > 0 or m.get("oom") is not None)


errs = {}
for l in outs:
    d = dev_peak(l["measured"])
    if d:
        errs[l["job_id"]] = l["predicted"]["peak_bytes"] / d - 1
check("jobs with an error", o["error"]["jobs"], len(errs))
check("under-predicted jobs", o["error"]["under"], sum(e < 0 for e in errs.values()))
v = sorted(errs.values())
check("worst error", o["error"]["min"], round(v[0] * 1e4) / 1e4)
check("median error", round(o["error"]["median"], 3), round((v[len(v) // 2 - 1] + v[len(v) // 2]) / 2 if len(v) % 2 == 0 else v[len(v) // 2], 3))
check("histogram sums to the jobs", sum(b["count"] for b in o["error"]["histogram"]), len(errs))
under = [u["job_id"] for u in o["under_predictions"]]
want_under = [j for j, e in sorted(errs.items(), key=lambda x: x[1]) if e < 0][:10]
check("under-predictions worst first (top 10)", under, want_under)
check("the under-predicted model first", o["by_model"][0]["key"], "qwen2.5-vl-7b-lora")

let_through = [l["job_id"] for l in outs
               if oomed(l["measured"]) and l["predicted"]["decision"] in ("accept", "warn", "resize")]
check("OOMs let through", sorted(j["job_id"] for j in o["ooms_let_through"]), sorted(let_through))
check("OOMs let through count", o["ooms_let_through_count"], len(let_through))
assert let_through, "the fixture must have OOMs"

# margin advice: accepted iff predicted <= card x (1 - m/100); would OOM iff it did or measured > card
adv = o["margin_advice"]["candidates"]
for k, m in enumerate(MARGINS):
    acc = ooms = fit_rej = 0
    for l in outs:
        p, meas = l["predicted"], l["measured"]
        d = dev_peak(meas)
        if not d and not oomed(meas):
            continue
        dies = oomed(meas) or (d or 0) > p["gpu_mem_bytes"]
        inside = p["peak_bytes"] <= p["gpu_mem_bytes"] * (1 - m / 100)
        acc += inside
        ooms += inside and dies
        fit_rej += (not inside) and not dies
    check("margin %g%%: margin" % m, adv[k]["margin_percent"], m)
    check("margin %g%%: accepted" % m, adv[k]["accepted"], acc)
    check("margin %g%%: accepted that OOM" % m, adv[k]["accepted_oom"], ooms)
    check("margin %g%%: rejected that fit" % m, adv[k]["rejected_would_fit"], fit_rej)
safe = [a["margin_percent"] for a in adv if a["accepted_oom"] == 0]
check("smallest safe margin", o["margin_advice"]["smallest_safe_margin_percent"], safe[0] if safe else None)
check("advice is monotone", [a["accepted"] for a in adv], sorted((a["accepted"] for a in adv), reverse=True))

# false rejections: a reject contradicted by a later job of the same uid, spec, GPU, degree
fr = 0
for d in decs:
    if d["decision"] != "reject":
        continue
    for l in outs:
        p, meas = l["predicted"], l["measured"]
        dp = dev_peak(meas)
        if (dp and not oomed(meas) and l["uid"] == d["uid"] and p["spec_sha256"] == d["spec_sha256"]
                and p["gpu"] == d["gpu"] and p["data_parallel"] == d["data_parallel"]
                and dp <= d["usable_bytes"] and d["time"] <= l["time"]):
            fr += 1
            break
check("false rejections", o["false_rejections_count"], fr)
assert fr > 0, "the fixture must have false rejections"

seen = {}
for l in outs:
    if l["measured"]:
        s = l["predicted"]["spec_sha256"]
        seen[s] = max(seen.get(s, 0), l["measured"]["max_seq_len"])
check("sequences per spec", {r["spec_sha256"]: r["max_seq_len_seen"] for r in o["sequences"]}, seen)
check("spec worst case read from the spec", sorted(r["spec_seq_len"] for r in o["sequences"]), [2048, 2048, 2048])

# every job joins a decision line: its own (the warn line for a job run after a reject)
joined = {j["job_id"]: j["decision"] for j in o["jobs"]}
check("every job joined", o["joined"], len(outs))
check("joined to the decision it was published with",
      sum(joined[l["job_id"]]["decision"] == l["predicted"]["decision"] for l in outs), len(outs))
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
