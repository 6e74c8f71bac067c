"""Truth configs: the wide grid of issue 22 ("What to build").

Every parallel mode (single, ddp, fsdp1, fsdp2, zero1, zero2, zero3) crossed with
every way of choosing what trains -- full, finetune (tower frozen), pretrain
(connector only), frozen LLM (tower + connector train), LoRA with dropout 0 and
0.05 -- each with and without gradient checkpointing, at world sizes 2, 3 and 4
(cycled, so each parallel mode meets all three), on multimodal families whose
widths and image sizes are drawn afresh from a seed of their own, from values
the first grid (truth.py config_list) never used.  7 x 6 x 2 = 84 setups.

Small on purpose (2 text layers, B 1, one image): a row runs in seconds on the
shared CPU.

Combinations left out, each because the library refuses it:
  - FSDP1 with use_orig_params=False needs uniform requires_grad inside each
    flat parameter (torch 2.13 fsdp/_flat_param.py:819-825, _validate_tensors_to_flatten:
    "Must flatten tensors with uniform `requires_grad` when use_orig_params=False"),
    so it is drawn only in mode full; every other mode runs use_orig_params=True.
  - Mllama with an FSDP1 MixedPrecision policy and SmolVLM under amp_bf16 are
    refused by the models (make_setup rewrites them); neither family is drawn here.
"""
import random

GC = {"use_reentrant": False, "every_n_layers": 1}
PARALLEL = ("single", "ddp", "fsdp1", "fsdp2", "zero1", "zero2", "zero3")
# (mode, lora_dropout or None)
TRAINS = (("full", None), ("finetune", None), ("pretrain", None), ("frozen_llm", None),
          ("lora", 0.0), ("lora", 0.05))
WORLDS = (2, 3, 4)

# per family: fresh widths and image sizes (the first grid used llava hidden 256 / vhidden 128 /
# image 112, qwen2_vl hidden 128 / vhidden 64, internvl hidden 128 / vhidden 96 / tile 112)
FRESH = {
    "llava": lambda r: ({"hidden": r.choice([192, 320]), "vhidden": r.choice([64, 192]),
                         "image": r.choice([84, 140, 168]), "layers": 2}, None),
    "qwen2_vl": lambda r: ({"hidden": r.choice([96, 160]), "vhidden": r.choice([96, 128]), "layers": 2},
                           r.choice([(84, 112), (140, 84), (168, 140)])),
    "internvl": lambda r: ({"hidden": r.choice([96, 160]), "vhidden": r.choice([64, 160]),
                            "tile": r.choice([84, 140]), "layers": 2}, None),
}


def wide_grid():
    import truth
    rng = random.Random(20261126)
    fams = list(FRESH)
    out = []
    n = 0
    for pi, par in enumerate(PARALLEL):
        for mode, drop in TRAINS:
            for gc_ in (False, GC):
                # family and world size rotate at different rates, so that each parallel mode meets
                # every family and world size, and each family every world size
                fam = fams[(n + pi) % len(fams)]
                world = 1 if par == "single" else WORLDS[(n // len(fams) + n) % len(WORLDS)]
                n += 1
                model, img = FRESH[fam](rng)
                if img is None:
                    side = model.get("image") or model.get("tile")
                    img = (side, side)
                precs = ["bf16", "fp32", "amp_bf16"] if par == "single" else ["bf16", "fp32"]
                prec = rng.choice(precs)
                popt = {}
                if par == "fsdp1":
                    popt = {"use_orig_params": True if mode != "full" else rng.choice([True, False]),
                            "mixed_precision": "bf16" if prec == "fp32" and rng.random() < 0.5 else None}
                elif par == "fsdp2":
                    popt = {"reshard_after_forward": rng.choice([True, False]),
                            "mixed_precision": "bf16" if prec == "fp32" and rng.random() < 0.5 else None}
                elif par == "ddp":
                    popt = {"bucket_cap_mb": 25, "gradient_as_bucket_view": rng.choice([False, True])}
                lora = None
                if mode == "lora":
                    lora = {"r": rng.choice([4, 8]), "lora_alpha": 16, "lora_dropout": drop,
                            "target_modules": "language-linear", "on": "language"}
                S = 128
                if fam == "llava":  # (image/14)^2 tokens; truth.visual_upper_bound assumes the 112-pixel tower
                    need = 4 + (model["image"] // 14) ** 2 + 2 + 16
                    S = max(S, (need + 63) // 64 * 64)
                out.append(truth.make_setup(fam, mode, prec, "sdpa", gc_, 1, S, 1, img, "adamw_torch", par,
                                            world, popt=popt, model=model, lora=lora, seed=11))
    return out
