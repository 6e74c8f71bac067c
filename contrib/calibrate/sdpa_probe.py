#!/usr/bin/env python3
"""Which SDPA backend CUDA picks, and what it allocates (GPU only).

    python3 contrib/calibrate/sdpa_probe.py OUT.jsonl

The truth harness runs on the CPU and emulates CUDA's scaled_dot_product_attention
(tests/truth/emul.py: sdpa_backend picks flash / efficient / math the way
sdp_utils.cpp select_sdp_backend does).  This records, for shapes and dtypes the truth
rows use, the backend torch._fused_sdp_choice really returns on this GPU, and the
allocator's view of one forward and backward: bytes kept after the forward (output and
what autograd saves), the forward's and the backward's peak above the inputs.  One JSON
line per case; tests/truth/test_sdpa_backend.py compares the emulation's choice with it.
"""
import json
import sys

CASES = []


def case(name, B, H, L, D, dtype, mask=None, causal=False, Hk=None, S=None, gqa=False):
    CASES.append(dict(name=name, B=B, H=H, L=L, S=S or L, D=D, Hk=Hk or H, dtype=dtype,
                      mask=mask, causal=causal, enable_gqa=gqa))


for dt in ("float32", "bfloat16", "float16"):
    case("clip-577-d64-" + dt, 2, 16, 577, 64, dt)                      # CLIP ViT-L/14-336
    case("llm-causal-d128-" + dt, 2, 8, 512, 128, dt, causal=True)      # HF sdpa, no padding
    case("llm-boolmask-d128-" + dt, 2, 8, 512, 128, dt, mask="bool")    # padded batch
    case("llm-floatmask-d128-" + dt, 2, 8, 512, 128, dt, mask="float")
    case("llm-gqa-d128-" + dt, 2, 8, 512, 128, dt, causal=True, Hk=2, gqa=True)
    case("llm-d80-" + dt, 2, 8, 512, 80, dt, causal=True)               # Qwen2-VL ViT head 80
    case("llm-d72-" + dt, 2, 8, 512, 72, dt, causal=True)
    case("llm-d256-" + dt, 1, 4, 512, 256, dt, causal=True)
    case("causal-LneS-" + dt, 2, 8, 256, 64, dt, causal=True, S=512)
    case("mask-S-not16-" + dt, 2, 8, 300, 64, dt, mask="bool")


def run_case(c):
    import torch
    import torch.nn.functional as F
    dt = getattr(torch, c["dtype"])
    dev = "cuda"
    q = torch.randn(c["B"], c["H"], c["L"], c["D"], device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(c["B"], c["Hk"], c["S"], c["D"], device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(c["B"], c["Hk"], c["S"], c["D"], device=dev, dtype=dt, requires_grad=True)
    m = None
    if c["mask"] == "bool":
        m = torch.ones(c["B"], 1, c["L"], c["S"], device=dev, dtype=torch.bool).tril()
    elif c["mask"] == "float":
        m = torch.zeros(c["B"], 1, c["L"], c["S"], device=dev, dtype=dt)
    kw = {"enable_gqa": True} if c["enable_gqa"] else {}
    out = {"case": c}
    try:
        out["fused_sdp_choice"] = int(torch._fused_sdp_choice(
            q, k, v, m, 0.0, c["causal"], scale=None, enable_gqa=c["enable_gqa"]))
    except Exception as e:  # noqa: BLE001
        out["fused_sdp_choice_error"] = "%s: %s" % (type(e).__name__, e)
    try:
        from torch.nn.attention import SDPBackend
        out["backend"] = SDPBackend(out["fused_sdp_choice"]).name
    except Exception:  # noqa: BLE001
        pass
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=c["causal"], **kw)
        torch.cuda.synchronize()
        out["forward_kept"] = torch.cuda.memory_allocated() - base
        out["forward_peak"] = torch.cuda.max_memory_allocated() - base
        out["out_bytes"] = o.numel() * o.element_size()
        g = torch.randn_like(o)
        after = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        o.backward(g)
        torch.cuda.synchronize()
        out["backward_peak_above_forward"] = torch.cuda.max_memory_allocated() - after
        out["grad_fn"] = type(o.grad_fn).__name__
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["status"] = "error"
        out["error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
    return out


def main():
    import torch
    if not torch.cuda.is_available():
        print("sdpa_probe: no CUDA device (skipped)")
        return 77
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
           "capability": list(torch.cuda.get_device_capability())}
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"kind": "env", **env}, sort_keys=True) + "\n")
        for c in CASES:
            r = run_case(c)
            f.write(json.dumps(r, sort_keys=True) + "\n")
            f.flush()
            print("%-28s %-22s %s" % (c["name"], r.get("backend", r.get("fused_sdp_choice")),
                                      r.get("grad_fn", r.get("error", ""))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
