#!/usr/bin/env python3
"""The allocator replay's fold is exact (issue 24; predictor/engine/alloc_fold.c).

Every spec below is predicted twice, with the fold (MMGUARD_REPLAY_FOLD=check:
each folded replay says its folds, and replays again unfolded to compare the
allocator's whole state after every fold, by a hash of its blocks, free lists,
statistics and the tensors' blocks, saying any that differs on stderr) and
without it (MMGUARD_REPLAY_FOLD=0), and the two outputs must be byte-identical:
  - every shipped preset (contrib/models/*.yaml) and bench spec (bench/*.yaml):
    `mmguard predict --json`, and `mmguard check --gpu-mem G --margin 0 --json` at
    a card of the preset's own boundaries (the capacity-limited replay, with its
    retries and OOMs) and `mmguard fit --gpu-mem 81559MiB --json` (the searches'
    early-stopped replays);
  - every truth row spec (tests/truth/data/truth.jsonl, as tests/accuracy/accuracy.py
    writes it);
  - every GPU row measured or out of memory (tests/gpu_data/*.jsonl and the files
    one folder down, with its PYTORCH_CUDA_ALLOC_CONF, as contrib/calibrate/compare.py
    writes it; a row recorded without a spec gets the one compare.py rebuilds).
The fold must also fire somewhere (else the comparison proves nothing): the
number of folds (the verbose lines) is printed and must be > 0.

With --ref BIN the same cases compare another build instead (BIN, e.g. main's
mmguard before a change that must not move a byte, against MMGUARD), both
unfolded: what a speed change is held to.

With --golden FILE (make check-fold: tests/fold/golden.txt) every case's plain
result must also be the one whose digest FILE holds (sha256 of exit status, stdout
and stderr, with the checkout's and the temporary files' paths left out): no
prediction of a preset, truth row or GPU row moves unnoticed.  A change meant to move
some rewrites the file with --write-golden FILE; its diff names the cases that moved.

  MMGUARD=build/mmguard python3 tests/fold/fold.py [--only REGEX] [--jobs N] [--ref BIN]
                                                   [--golden FILE] [--write-golden FILE]
"""
import argparse
import hashlib
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "accuracy"))
import accuracy  # noqa: E402  (make_spec: a truth row's spec)
sys.path.insert(0, os.path.join(ROOT, "contrib", "calibrate"))
import compare as calib_compare  # noqa: E402  (a GPU row's spec, as compare.py predicts it)

MM = os.environ.get("MMGUARD", os.path.join(ROOT, "build", "mmguard"))
FOLDED = re.compile(r"^mmguard: replay folded (\d+) periods[^\n]*\n?", re.M)


REF = None  # --ref: the build compared against, unfolded


def run(args, fold):
    env = dict(os.environ)
    env["MMGUARD_REPLAY_FOLD"] = "0"
    if fold and not REF:
        env["MMGUARD_REPLAY_FOLD"] = "check"
    p = subprocess.run([REF if fold and REF else MM] + args, capture_output=True, text=True, env=env, timeout=600)
    folds = [int(n) for n in FOLDED.findall(p.stderr)]
    err = FOLDED.sub("", p.stderr).strip()
    return (p.returncode, p.stdout, err), folds


TMP = None  # the run's temporary directory (spec files written there)


def digest(out):
    """The plain run's result (exit status, stdout, stderr), independent of where the
    checkout and the temporary spec files lie: what --golden holds."""
    text = "%d\n%s\n%s" % out
    text = re.sub(re.escape(TMP) + r"/[A-Za-z0-9_.-]+", "<tmp>", text)
    text = text.replace(ROOT, "<root>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compare(case):
    name, args = case
    plain, none = run(args, False)
    d = digest(plain)
    folded, folds = run(args, True)
    if none:
        return name, "the unfolded run folded", folds, d
    if REF:
        folds = []
    for out in (plain, folded):  # under ASan+UBSan: a report is a failure either way
        if "Sanitizer" in out[2] or "runtime error:" in out[2]:
            return name, "sanitizer: %s" % out[2][:300], folds, d
    if plain != folded:
        return name, "differs: rc %d/%d, stdout %d/%d bytes, stderr %r/%r" % (
            plain[0], folded[0], len(plain[1]), len(folded[1]), plain[2][:200],
            folded[2][:200]), folds, d
    return name, None, folds, d


def preset_cases(tmp):
    cases = []
    for p in sorted(glob.glob(os.path.join(ROOT, "contrib", "models", "*.yaml")) +
                    glob.glob(os.path.join(ROOT, "bench", "*.yaml"))):
        n = os.path.basename(p)
        cases.append(("preset %s predict" % n, ["predict", p, "--json"]))
        cases.append(("preset %s fit" % n, ["fit", p, "--gpu-mem", "81559MiB", "--json"]))
        base = subprocess.run([MM, "check", p, "--gpu-mem", str(1 << 50), "--margin", "0",
                               "--json"], capture_output=True, text=True)
        if base.returncode in (0, 1):
            b = json.loads(base.stdout)
            lo, hi = b["min_usable_runs"], b["min_usable_no_flush"]
            for size in sorted({lo - 2 * 1024 * 1024, (lo + hi) // 2, hi}):
                if size > 0:
                    cases.append(("preset %s check %d" % (n, size),
                                  ["check", p, "--gpu-mem", str(size), "--margin", "0", "--json"]))
    return cases


def truth_cases(tmp, only):
    cases = []
    for row in accuracy.load(os.path.join(ROOT, "tests", "truth", "data", "truth.jsonl")):
        if only and not re.search(only, row["id"]):
            continue
        d = tempfile.mkdtemp(prefix="truth-", dir=tmp)
        cases.append(("truth %s" % row["id"], ["predict", accuracy.make_spec(row, d), "--json"]))
    return cases


def gpu_cases(tmp, only):
    cases = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "gpu_data", "*.jsonl")) +
                       glob.glob(os.path.join(ROOT, "tests", "gpu_data", "*", "*.jsonl"))):
        with open(path) as f:
            for k, line in enumerate(f):
                if not line.strip():
                    continue
                r = json.loads(line)
                if r.get("kind") != "measurement" or r.get("status") not in ("ok", "oom"):
                    continue
                rid = r.get("id") or "?"
                if only and not re.search(only, rid):
                    continue
                # the file and line name it (an id recurs across cards and resumed runs)
                where = "%s:%d" % (os.path.relpath(path, os.path.join(ROOT, "tests", "gpu_data")),
                                   k + 1)
                spec = calib_compare.predict_spec(
                    calib_compare.record_spec(r)[0],
                    alloc_conf=(r.get("config") or {}).get("alloc_conf"))
                fd, sp = tempfile.mkstemp(prefix="gpu-", suffix=".json", dir=tmp)
                with os.fdopen(fd, "w") as f2:
                    json.dump(spec, f2)
                cases.append(("gpu %s %s" % (where, rid), ["predict", sp, "--json"]))
    return cases


def golden_differs(path, results):
    """Say which cases' results are not the ones the golden file holds (changed,
    new or gone); True when any is not."""
    want = {}
    with open(path) as f:
        for line in f:
            d, _, n = line.rstrip("\n").partition(" ")
            want[n] = d
    got = {n: d for n, _, _, d in results}
    changed = sorted(n for n in got if n in want and got[n] != want[n])
    new = sorted(set(got) - set(want))
    gone = sorted(set(want) - set(got))
    for what, names in (("changed", changed), ("new", new), ("gone", gone)):
        for n in names[:20]:
            print("fold: golden: %s: %s" % (what, n))
        if len(names) > 20:
            print("fold: golden: ... and %d more %s" % (len(names) - 20, what))
    if changed or new or gone:
        print("fold: golden: FAILED against %s: %d changed, %d new, %d gone (a change meant "
              "to move predictions rewrites it: fold.py --write-golden %s, and says why)"
              % (path, len(changed), len(new), len(gone), path))
        return True
    print("fold: golden: every one of %d results as %s holds" % (len(got), path))
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="regex on truth and GPU row ids (presets always run)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ref", help="compare this build (unfolded) instead of the fold")
    ap.add_argument("--golden", help="also hold every case's plain result to the digests in "
                    "this file (one 'DIGEST CASE' a line): a prediction that changed fails")
    ap.add_argument("--write-golden", metavar="FILE",
                    help="write the digests of this build's plain results to FILE")
    a = ap.parse_args()
    global REF, TMP
    REF = a.ref
    if a.golden and a.only:
        ap.error("--golden holds every case: not with --only")
    with tempfile.TemporaryDirectory(prefix="mmfold-") as tmp:
        TMP = tmp
        cases = preset_cases(tmp) + truth_cases(tmp, a.only) + gpu_cases(tmp, a.only)
        with ThreadPoolExecutor(max_workers=a.jobs) as ex:
            results = list(ex.map(compare, cases))
    bad = [(n, why) for n, why, _, _ in results if why]
    folds = sum(len(f) for _, _, f, _ in results)
    periods = sum(sum(f) for _, _, f, _ in results)
    cases_folded = sum(1 for _, _, f, _ in results if f)
    for n, why in bad:
        print("fold: FAIL %s: %s" % (n, why))
    print("fold: %d cases (%d presets' runs, truth and GPU rows), %d of them folded: %d folds, "
          "%d periods fast-forwarded" % (len(results), sum(1 for n, _, _, _ in results
                                                           if n.startswith("preset")),
                                         cases_folded, folds, periods))
    if a.write_golden:
        with open(a.write_golden, "w") as f:
            for n, _, _, d in sorted(results, key=lambda x: x[0]):
                f.write("%s %s\n" % (d, n))
        print("fold: wrote %d digests to %s" % (len(results), a.write_golden))
    if a.golden and golden_differs(a.golden, results):
        return 1
    if REF:
        print("fold: %s" % ("FAILED" if bad else "passed: %s and %s byte-identical" % (REF, MM)))
        return 1 if bad else 0
    if not folds:
        print("fold: FAIL: nothing was folded, the comparison proves nothing")
        return 1
    print("fold: %s" % ("FAILED" if bad else "passed: folded and unfolded replays byte-identical"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
