#!/usr/bin/env python3
"""Coverage of tests/truth/data/truth.jsonl: rows per family x parallel mode, per precision,
mode, attention, checkpointing, world size, peak phase.  Stdlib only.

    python3 tests/truth/summary.py [FILE]
"""
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data", "truth.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("%d rows in %s" % (len(rows), path))
    pars = ["single", "ddp", "fsdp1", "fsdp2", "zero1", "zero2", "zero3"]
    fams = sorted({r["family"] for r in rows})
    print("\n%-16s" % "family" + "".join("%7s" % p for p in pars) + "%7s" % "total")
    for f in fams:
        c = collections.Counter(r["setup"]["parallel"] for r in rows if r["family"] == f)
        print("%-16s" % f + "".join("%7d" % c[p] for p in pars) + "%7d" % sum(c.values()))
    c = collections.Counter(r["setup"]["parallel"] for r in rows)
    print("%-16s" % "total" + "".join("%7d" % c[p] for p in pars) + "%7d" % len(rows))

    def tab(name, key):
        c = collections.Counter(key(r) for r in rows)
        print("\n%s: " % name + ", ".join("%s %d" % (k, v) for k, v in sorted(c.items(), key=lambda kv: str(kv[0]))))

    tab("precision", lambda r: r["setup"]["precision"])
    tab("mode", lambda r: r["setup"]["mode"])
    tab("attention", lambda r: r["setup"]["attention"])
    tab("gradient checkpointing", lambda r: "off" if not r["setup"]["gradient_checkpointing"] else
        "reentrant=%s/every %d" % (r["setup"]["gradient_checkpointing"]["use_reentrant"],
                                   r["setup"]["gradient_checkpointing"].get("every_n_layers", 1)))
    tab("optimizer", lambda r: r["setup"]["optimizer"])
    tab("world size", lambda r: r["setup"]["world_size"])
    tab("images per sample", lambda r: r["setup"]["images_per_sample"])
    tab("micro batch", lambda r: r["setup"]["micro_batch_size"])
    tab("lora dropout", lambda r: (r["setup"]["lora"] or {}).get("lora_dropout", "-"))
    tab("peak phase", lambda r: r["measured"]["peak_phase"])
    s = [r["setup"]["seq_len"] for r in rows]
    pk = [r["measured"]["peak_bytes"] for r in rows]
    print("\nseq_len %d..%d, peak %.1f..%.1f MB, total %.0f s measured" % (
        min(s), max(s), min(pk) / 1e6, max(pk) / 1e6, sum(r["seconds"] for r in rows)))


if __name__ == "__main__":
    main()
