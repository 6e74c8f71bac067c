"""Truth configs: FSDP1 with use_orig_params, a frozen part in a unit that trains.

FSDP1 flattens each unit's parameters into one FlatParameter that requires grad
when any of them does (torch distributed/fsdp/_flat_param.py
_validate_tensors_to_flatten); in forward every module sees a view of it that
requires grad like it (_use_unsharded_views, as_params=False).  A frozen weight
there gets a weight gradient, kept until the views' gradients are concatenated
into the flat one, and its outputs require grad.  These rows isolate that
(docs/parallel.md "FSDP1 use_orig_params: frozen weights in a unit that trains"):
- llava finetune: the frozen CLIP tower's pre-norm sits in the root beside the
  trainable projector and LLM: the frozen tower keeps a graph;
- llama / llava LoRA: each decoder layer's frozen base weights share the layer's
  flat parameter with the adapters; llava's root also holds the frozen lm_head and
  embed_tokens beside the trainable projector.
2 and 4 ranks, with and without checkpointing.  Small (2 layers, B 1, S 128):
2 shared CPU cores.
"""

GC = {"use_reentrant": False, "every_n_layers": 1}
U1 = {"use_orig_params": True, "mixed_precision": None}

# (family, mode, precision, gc, world)
ROWS = [
    ("llava", "finetune", "bf16", GC, 2),
    ("llava", "finetune", "fp32", False, 4),
    ("llama", "lora", "bf16", False, 2),
    ("llama", "lora", "fp32", GC, 4),
    ("llava", "lora", "bf16", False, 4),
]


def configs():
    import truth
    out = []
    for fam, mode, prec, gc_, world in ROWS:
        k, img = (1, (112, 112)) if fam == "llava" else (0, None)
        model = {"layers": 2} if fam == "llama" else {"image": 112, "layers": 2}
        out.append(truth.make_setup(fam, mode, prec, "sdpa", gc_, 1, 128, k, img, "adamw_torch", "fsdp1",
                                    world, popt=dict(U1), model=model, seed=11))
    return out
