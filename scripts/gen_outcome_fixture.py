#!/usr/bin/env python3
"""Generate tests/fixtures/outcome/synthetic-loop.jsonl: a SYNTHETIC decision log
of many jobs (decision lines as the plugin writes them, outcome lines as
outcome.c writes them) for the `mmguard report` outcome tests.  Nothing in it
was measured: the predicted peaks and the "measured" peaks are drawn from a
seeded random generator (one model is under-predicted on purpose, some jobs
run out of memory, some rejected jobs are later run under action=warn).  Every
line carries "synthetic": true.  Deterministic:

    python3 scripts/gen_outcome_fixture.py > tests/fixtures/outcome/synthetic-loop.jsonl
"""
import hashlib
import json
import random

GPUS = {"h100": 85520809984, "a100-40g": 42949672960}
MARGIN = 10.0
# spec path (relative to the repository root), its model name, its bias
# (measured = predicted x (1 + bias + noise)), the fraction of its seq_len jobs reach
MODELS = [
    ("contrib/models/llava-1.5-7b-finetune.yaml", "llava-1.5-7b-finetune", -0.02, 1.0),
    ("contrib/models/qwen2.5-vl-7b-lora.yaml", "qwen2.5-vl-7b-lora", 0.08, 0.6),
    ("contrib/models/llama-3.1-8b-full.yaml", "llama-3.1-8b-full", -0.05, 0.9),
]
USERS = [("alice", 1001), ("bob", 1002), ("carol", 1003), ("dave", 1004)]


def spec_info(path):
    data = open(path, "rb").read()
    seq = mb = None
    for line in data.decode().splitlines():
        s = line.split("#")[0].strip()
        if s.startswith("seq_len:"):
            seq = int(s.split(":")[1])
        if s.startswith("micro_batch_size:"):
            mb = int(s.split(":")[1])
    return hashlib.sha256(data).hexdigest(), seq, mb


def stamp(t):
    return "2026-11-%02dT%02d:%02d:%02dZ" % (1 + t // 86400, t // 3600 % 24, t // 60 % 60, t % 60)


def decision(t, user, uid, spec, sha, model, gpu, dp, peak, decision_name):
    mem = GPUS[gpu]
    return {"synthetic": True, "time": stamp(t), "user": user, "uid": uid, "job_name": None,
            "source": "sbatch", "decision": decision_name, "spec": spec, "spec_sha256": sha,
            "model": model, "margin": {"percent": MARGIN, "bytes": 0, "reserve_bytes": 0},
            "gpu": gpu, "gpu_mem_bytes": mem, "usable_bytes": int(mem * (1 - MARGIN / 100)),
            "data_parallel": dp, "gpus": dp, "peak_bytes": peak}


def outcome(t, job_id, uid, dec, measured):
    pred = {k: dec[k] for k in ("decision", "model", "spec", "spec_sha256", "gpu")}
    pred.update({"gpu_mem_bytes": dec["gpu_mem_bytes"], "usable_bytes": dec["usable_bytes"],
                 "data_parallel": dec["data_parallel"], "peak_bytes": dec["peak_bytes"]})
    return {"synthetic": True, "time": stamp(t), "event": "outcome", "job_id": job_id,
            "step": "batch", "uid": uid, "record": "/tmp/x.json",
            "record_state": "ok", "record_error": None,
            "measured": measured, "predicted": pred}


def measure(rng, peak, bias, mem, seq_frac, spec_seq, spec_mb):
    m = int(peak * (1 + bias + rng.gauss(0, 0.03)))
    oom = m > mem
    return {"status": "oom" if oom else "done", "phase": "backward" if oom else "step",
            "steps": 1 if oom else 500, "world_size": 1, "micro_batch": spec_mb,
            "max_seq_len": int(spec_seq * seq_frac * rng.uniform(0.8, 1.0)),
            "host_peak_rss_bytes": rng.randint(8, 40) << 30, "cuda": True, "device": "synthetic",
            "max_allocated_bytes": int(min(m, mem) * 0.93), "max_reserved_bytes": min(m, mem),
            "num_alloc_retries": 0, "num_ooms": 1 if oom else 0,
            "nvml_peak_used_bytes": min(m, mem), "nvml_total_bytes": mem,
            "oom": {"phase": "backward", "kind": "cuda", "message": "synthetic"} if oom else None,
            "absent": []}


def main():
    rng = random.Random(25)
    specs = {p: spec_info(p) for p, _, _, _ in MODELS}
    lines, t, job_id = [], 0, 1000
    for i in range(400):
        spec, model, bias, seq_frac = MODELS[i % len(MODELS)]
        user, uid = USERS[rng.randrange(len(USERS))]
        gpu = "h100" if rng.random() < 0.7 else "a100-40g"
        mem = GPUS[gpu]
        sha, spec_seq, spec_mb = specs[spec]
        peak = int(mem * rng.uniform(0.35, 1.05))
        dec = decision(t, user, uid, spec, sha, model, gpu, 1, peak,
                       "accept" if peak <= mem * (1 - MARGIN / 100) else "reject")
        lines.append(dec)
        t += rng.randint(30, 600)
        if dec["decision"] == "reject":
            if rng.random() < 0.5:       # run anyway later, under action=warn
                dec = decision(t, user, uid, spec, sha, model, gpu, 1, peak, "warn")
                lines.append(dec)
                t += rng.randint(30, 600)
            else:
                continue
        job_id += 1
        m = measure(rng, peak, bias, mem, seq_frac, spec_seq, spec_mb)
        if rng.random() < 0.04:          # no recorder in the job: no outcome line
            continue
        lines.append(outcome(t, job_id, uid, dec, m))
        t += rng.randint(30, 600)
    for rec in lines:
        print(json.dumps(rec, separators=(",", ":")))


if __name__ == "__main__":
    main()
