"""The recorder's CUDA path on a real GPU (issue 25): one tiny training step
under mmguard.recording(), then the record's peaks must equal torch's own
counters for the same step, and NVML's sampled peak must lie between the
reserved peak and the card.  Needs a CUDA device (and nvidia-ml-py for the
NVML part); prints one JSON line of the measured values (to commit under
tests/gpu_data/) and exits 1 on a mismatch, 77 without CUDA.

    PYTHONPATH=build/python python tests/python/gpu_recorder.py [OUT.jsonl]
"""
import json
import os
import sys
import tempfile

import torch

import mmguard


def main():
    if not torch.cuda.is_available():
        print("gpu_recorder: no CUDA device (skipped)")
        return 77
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 4096)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rec.json")
        with mmguard.recording(model, opt, path=path, nvml_interval=0.005):
            for _ in range(3):
                x = torch.randn(64, 512, 4096, device=dev)
                model(x).float().pow(2).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        rec = json.load(open(path))
    want = {"max_allocated": stats["allocated_bytes.all.peak"],
            "max_reserved": stats["reserved_bytes.all.peak"],
            "alloc_retries": stats["num_alloc_retries"], "ooms": stats["num_ooms"]}
    got = {k: rec[k] for k in want}
    total = torch.cuda.get_device_properties(dev).total_memory
    row = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "record": rec,
           "torch_counters": want, "card_bytes": total}
    print(json.dumps(row, sort_keys=True))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    bad = []
    if got != want:
        bad.append("record %r != torch %r" % (got, want))
    if rec["status"] != "done" or rec["steps"] != 3 or not rec["cuda"]:
        bad.append("status/steps/cuda: %r" % ((rec["status"], rec["steps"], rec["cuda"]),))
    if rec["micro_batch"] != 64 or rec["max_seq_len"] != 512:
        bad.append("shapes: %r" % ((rec["micro_batch"], rec["max_seq_len"]),))
    nv = rec["nvml_peak_used"]
    if nv is not None and not (want["max_reserved"] <= nv <= total):
        bad.append("NVML peak %d outside [reserved peak %d, card %d]" % (nv, want["max_reserved"], total))
    for b in bad:
        print("gpu_recorder: FAIL " + b)
    print("gpu_recorder: %s (NVML %s)" % ("FAIL" if bad else "ok",
                                          "measured" if nv is not None else "absent"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
