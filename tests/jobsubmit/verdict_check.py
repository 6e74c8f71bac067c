#!/usr/bin/env python3
"""verdict_check.py - `make check-dp-verdict`: job_submit.lua's verdict of the
published record equals a direct `mmguard check --json` at every (GPU type,
count) the record covers.

For each case (a spec, settings, cards, a count range, a margin) the record's
cards= part is built as the plugin builds it (tests/jobsubmit/verdict_tool,
record.c mmg_cards_add); job_submit.lua reads it and decides each (type, count)
under flush=accept|warn|reject (tests/jobsubmit/verdict_cards.lua, the real
M.submit path); each is held against `mmguard check SPEC --gpu-mem MEM
--margin M --set training.data_parallel=N --json`: the same verdict, retries
per step, peak on the card and usable bytes, and the decision each policy
implies (fits: accept; fits with cache flushes: accept / warn / reject;
out of memory: reject).  The cases must produce all three verdicts.

The largest micro-batch the record publishes (mmb=, the plugin's answer for
the card and count it judged, under its flush= policy) is what a rejection
names: where job_submit.lua names one ("to fit: training.micro_batch_size=M"),
M is the published one, only at the plugin's own card and count, and `mmguard
check` at M fits under that policy while M + 1 does not.

  verdict_check.py MMGUARD VERDICT_TOOL LUA JOB_SUBMIT_LUA
"""
import json
import subprocess
import sys

GiB = 1 << 30
MiB = 1 << 20
M7 = "contrib/models/llava-1.5-7b-finetune.yaml"
# (spec, settings, cards {type: bytes}, counts, margin as mmguard.conf and as --margin,
#  the plugin's judged count and flush= policy for the published mmb= on the first type)
CASES = [
    (M7, [], {"c40": 40 * GiB, "c50": 50 * GiB, "c60": 60 * GiB}, (1, 8), ("0", "0"),
     (8, "warn")),
    (M7, ["device.alloc_conf=expandable_segments:True"], {"c40": 40 * GiB, "c50": 50 * GiB},
     (6, 8), ("0", "0"), None),
    (M7, ["training.zero_stage=2"], {"h100": 81559 * MiB, "h200": 143771 * MiB}, (1, 8),
     ("10%", "10%"), (2, "reject")),
    ("contrib/models/llava-1.5-7b-lora.yaml", [], {"c32": 32 * GiB, "l40s": 46068 * MiB,
                                                   "a100-40g": 40 * GiB}, (1, 4), ("0", "0"),
     (1, "reject")),
    ("contrib/models/llava-1.5-13b-finetune.yaml", [], {"h100": 81559 * MiB}, (1, 8),
     ("5%", "5%"), (4, "accept")),
]
KIND = {"fits": "fits", "flushes": "flushes", "oom": "oom"}


def run(cmd, ok=(0,)):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode not in ok:
        sys.exit("FAIL %s: rc %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return p.stdout


def expected_decisions(kind):
    if kind == "fits":
        return {"accept": "accept", "warn": "accept", "reject": "accept"}
    if kind == "flushes":
        return {"accept": "accept", "warn": "warn", "reject": "reject"}
    return {"accept": "reject", "warn": "reject", "reject": "reject"}


def check_mmb(mmguard, spec, sets, mem, margin, n, mb, policy):
    """the named micro-batch fits under the policy and one more does not: failures"""
    ok_kinds = {"fits"} if policy == "reject" else {"fits", "flushes"}
    bad = 0
    for x, want in ((mb, True), (mb + 1, False)):
        d = json.loads(run([mmguard, "check", spec, "--gpu-mem", "%dMiB" % (mem // MiB),
                            "--margin", margin, "--json", "--set", "training.data_parallel=%d" % n,
                            "--set", "training.micro_batch_size=%d" % x] +
                           sum([["--set", s] for s in sets], []), ok=(0, 1)))
        if (d["verdict"] in ok_kinds) != want:
            bad += 1
            print("FAIL %s %s at %d GPUs flush=%s: micro-batch %d is %s" % (spec, sets, n, policy,
                                                                            x, d["verdict"]))
    if not bad:
        print("named micro-batch %d (%s, %d GPUs, flush=%s): %s, %d does not"
              % (mb, spec, n, policy, "fits" if policy == "reject" else "runs", mb + 1))
    return bad


def main():
    mmguard, tool, lua, script = sys.argv[1:5]
    passed, failed, seen = 0, 0, set()
    hints = set()
    for spec, sets, cards, (lo, hi), (conf_margin, cli_margin), mmb in CASES:
        conf = "|".join(["margin=" + conf_margin] + ["gpu.%s=%dMiB" % (t, b // MiB) for t, b in cards.items()])
        # the usable bytes the plugin's mmguard.conf gives (job_submit.lua computes the same)
        usable = {}
        for line in run([lua, "-e", "slurm={log_info=function() end}; dofile(%r); "
                         "local M=mmguard_jobsubmit; local c=assert(M.parse_conf((%r):gsub('|','\\n'),'C')); "
                         "for t in (%r):gmatch('%%S+') do print(t, M.istr(M.usable_bytes(c.gpus[t], c))) end"
                         % (script, conf, " ".join(cards))]).split("\n"):
            if line.strip():
                t, u = line.split()
                usable[t] = int(u)
        rec = run([tool, spec, "%d-%d" % (lo, hi)] +
                  ["%s=%d:%d" % (t, b, usable[t]) for t, b in cards.items()] + sets +
                  (["mmb=%d:%s" % mmb] if mmb else [])).strip()
        published = int(dict(kv.split("=", 1) for kv in rec.split()).get("mmb", "0"))
        pairs = ["%s:%d" % (t, n) for n in range(lo, hi + 1) for t in cards]
        out = run([lua, "tests/jobsubmit/verdict_cards.lua", script, conf, rec] + pairs)
        for line in out.strip().split("\n"):
            f = line.split()
            t, n = f[0], int(f[1])
            if f[2] == "none":
                failed += 1
                print("FAIL %s %s:%d: not covered: %s" % (spec, t, n, line))
                continue
            lua_usable, kind, retries, peak = int(f[2]), f[3], int(f[4]), int(f[5])
            dec = dict(x.split("=") for x in f[6:9])
            d = json.loads(run([mmguard, "check", spec, "--gpu-mem", "%dMiB" % (cards[t] // MiB),
                                "--margin", cli_margin, "--json", "--set",
                                "training.data_parallel=%d" % n] +
                               sum([["--set", s] for s in sets], []), ok=(0, 1)))
            want = (d["usable_bytes"], d["verdict"], d["alloc_retries_per_step"], d["peak_bytes"],
                    expected_decisions(d["verdict"]))
            got = (lua_usable, kind, retries, peak, dec)
            if d["gpus"] != n or got != want:
                failed += 1
                print("FAIL %s %s %s:%d: lua %s, mmguard check %s" % (spec, sets, t, n, got, want))
            else:
                passed += 1
                seen.add(kind)
            named = dict(x.split("=") for x in f[9:12])
            own = mmb and t == next(iter(cards)) and n == mmb[0]
            for policy, mb in named.items():
                mb, policy = int(mb), policy[3:]
                if mb == 0:
                    continue
                if not own or mb != published:
                    failed += 1
                    print("FAIL %s %s %s:%d flush=%s: lua names micro-batch %d, the record's is "
                          "%d for %s" % (spec, sets, t, n, policy, mb, published, mmb))
                elif policy == mmb[1]:
                    failed += check_mmb(mmguard, spec, sets, cards[t], cli_margin, n, mb, policy)
                    hints.add(policy == "reject")
    print("verdicts: %d (type, count) pairs equal mmguard check --json, %d differ; seen %s"
          % (passed, failed, ", ".join(sorted(seen))))
    if hints != {False, True}:
        print("FAIL the cases do not name a micro-batch under flush=reject and another policy: %s"
              % hints)
        return 1
    if seen != {"fits", "flushes", "oom"}:
        print("FAIL the cases do not produce all three verdicts")
        return 1
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
