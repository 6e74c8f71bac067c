"""Configs measured by selftest.py (and always first in the generated data set)."""

SMOKE = [
    # (family, mode, precision, attention, gc, B, S, k, image, optimizer, parallel, world, popt, model)
    # the reference: tiny Llama h256 2 layers GQA 4/2, V 32000, B2 S256, pure bf16, AdamW foreach, sdpa
    ("llama", "full", "bf16", "sdpa", False, 2, 256, 0, None, "adamw_torch", "single", 1, {},
     {"hidden": 256, "layers": 2}),
    ("llava", "finetune", "bf16", "sdpa", False, 2, 128, 1, (112, 112), "adamw_torch", "single", 1, {}, {}),
    ("qwen2_vl", "lora", "amp_bf16", "eager", {"use_reentrant": False, "every_n_layers": 1}, 1, 128, 1,
     (112, 112), "adamw_torch_fused", "single", 1, {}, {}),
    ("llama", "full", "bf16", "sdpa", False, 1, 128, 0, None, "adamw_torch", "fsdp2", 2,
     {"reshard_after_forward": True}, {}),
]


def setups():
    import truth
    return [truth.make_setup(*c[:12], popt=c[12], model=c[13] or None) for c in SMOKE]
