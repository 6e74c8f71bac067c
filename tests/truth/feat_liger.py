"""Truth rows for Liger's kernels (issue 23): the training step with the decoder's RMSNorm,
SwiGLU MLP and RoPE replaced as Liger's apply_liger_kernel_to_llama / _qwen2 (model=...) does
(what HF TrainingArguments(use_liger_kernel=True) applies, less the fused linear cross-entropy).
Triton does not run on the CPU: the kernels are emulated by tests/truth/emul_liger.py (their
allocations from Liger's source; docs/oracle.md "Liger kernels").  LLaVA rows: the patch reaches
the Llama decoder only (the CLIP tower has LayerNorm and a GELU MLP).

    setups()    the rows, called by ONE line of truth.py config_list
"""
import hashlib
import json

ALL = {"rms_norm": True, "swiglu": True, "rope": True}
GC = {"use_reentrant": False, "every_n_layers": 1}
SMALL = {"hidden": 128, "layers": 2, "vocab": 4096}
# (family, mode, precision, checkpointing, B, S, model, liger)
ROWS = [
    ("llama", "full", "bf16", False, 2, 256, SMALL, ALL),
    ("llama", "full", "bf16", GC, 2, 256, SMALL, ALL),
    ("llama", "lora", "bf16", False, 2, 256, SMALL, ALL),
    ("llama", "lora", "bf16", GC, 2, 256, SMALL, ALL),
    ("llama", "full", "fp32", False, 1, 256, SMALL, ALL),
    ("llama", "full", "bf16", False, 2, 256, SMALL, {"rms_norm": True, "swiglu": False, "rope": False}),
    ("llama", "full", "bf16", False, 2, 256, SMALL, {"rms_norm": False, "swiglu": True, "rope": False}),
    ("llama", "full", "bf16", False, 2, 256, SMALL, {"rms_norm": False, "swiglu": False, "rope": True}),
    ("qwen2", "full", "bf16", False, 2, 256, {"hidden": 128, "layers": 2}, ALL),
    ("qwen2", "lora", "fp32", GC, 1, 256, {"hidden": 128, "layers": 2}, ALL),
    ("llava", "lora", "bf16", False, 1, 128, {"hidden": 128, "layers": 2}, ALL),
    ("llava", "full", "bf16", GC, 1, 128, {"hidden": 128, "layers": 2}, ALL),
]
# (issue 23) Qwen2-VL / Qwen2.5-VL: apply_liger_kernel_to_qwen2_vl / _qwen2_5_vl(model=...), which
# also patch the vision blocks' norms (Qwen2-VL LayerNorm, Qwen2.5-VL RMSNorm): one image each,
# frozen tower + LoRA on the language model and full fine-tuning, with and without checkpointing
VL = {"hidden": 128, "layers": 2}
VL_ROWS = [(f, mode, "bf16", gc_, 1, 256, VL, ALL) for f in ("qwen2_vl", "qwen2_5_vl")
           for mode in ("full", "lora") for gc_ in (False, GC)] + [
    ("qwen2_vl", "full", "bf16", False, 2, 256, VL, dict(ALL, layer_norm=False)),
    ("qwen2_5_vl", "full", "bf16", GC, 2, 256, VL, {"rms_norm": True, "swiglu": False, "rope": True}),
]
VL_IMAGE = {"qwen2_vl": (112, 168), "qwen2_5_vl": (112, 168), "gemma3": (64, 64)}
# Gemma 3 (apply_liger_kernel_to_gemma3: GeGLU, Gemma-cast RMSNorm not in place, RoPE, the SigLIP
# tower's LayerNorms): frozen tower + LoRA and full fine-tuning, with and without checkpointing
G3 = {"rms_norm": True, "geglu": True, "rope": True, "layer_norm": True}
VL_ROWS += [("gemma3", mode, "bf16", gc_, 1, 256, {}, G3) for mode in ("full", "lora") for gc_ in (False, GC)] + [
    ("gemma3", "full", "bf16", False, 2, 256, {}, {"rms_norm": False, "geglu": True, "rope": False,
                                                   "layer_norm": False}),
]
# (issue 23, with the spec key) the kernels under autocast (fp32 weights and residual stream)
# and beside the data-parallel strategies: (family, mode, precision, checkpointing, B, S,
# model, liger, parallel, world)
PAR_ROWS = [
    ("llama", "full", "amp_bf16", False, 2, 256, SMALL, ALL, "single", 1),
    ("llama", "lora", "bf16", False, 2, 256, SMALL, ALL, "ddp", 2),
    ("qwen2", "full", "bf16", GC, 2, 256, {"hidden": 128, "layers": 2}, ALL, "zero2", 2),
]


def setups():
    import truth
    out = []
    rows = [r + ("single", 1) for r in ROWS] + PAR_ROWS + [r + ("single", 1) for r in VL_ROWS]
    for fam, mode, prec, gc_, B, S, model, lig, par, world in rows:
        k, img = (1, (112, 112)) if fam == "llava" else (1, VL_IMAGE[fam]) if fam in VL_IMAGE else (0, None)
        s = truth.make_setup(fam, mode, prec, "sdpa", gc_, B, S, k, img, "adamw_torch", par, world,
                             model=model, seed=17)
        s["liger"] = dict(lig)
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-%s-%d-%s-%s-sdpa-liger-%s" % (fam, par, world, mode, prec,
                                                     hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out
