"""Truth rows for torch.compile (issue 23): the same training step with the model compiled as the
HF Trainer does it (TrainingArguments(torch_compile=True) -> accelerate's TorchDynamoPlugin ->
`torch.compile(model, backend="inductor", mode=None)` in Accelerator.prepare_model).

Small models (2 layers, hidden 128, a small vocabulary): inductor compiles every row's forward
and backward with its C++ backend on a shared 2-core machine.  Which emulations a compiled row
runs with, and why, is in docs/oracle.md ("torch.compile rows").

    all_setups()    the rows, called by ONE line of truth.py config_list; titan_setups() are
                    FSDP2 steps compiled the torchtitan way (each decoder layer before
                    fully_shard), titan_eager_setups() the same steps eager
"""
import hashlib
import json

# (family, mode, precision, attention, checkpointing, B, S, model)
GC = {"use_reentrant": False, "every_n_layers": 1}
ROWS = [
    ("llama", "full", "bf16", "sdpa", False, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("llama", "full", "bf16", "sdpa", GC, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("llama", "lora", "bf16", "sdpa", False, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("llama", "lora", "bf16", "sdpa", GC, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("llama", "full", "fp32", "eager", False, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("llama", "full", "fp32", "eager", GC, 1, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("llama", "lora", "fp32", "eager", False, 1, 256, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("qwen2", "full", "bf16", "sdpa", False, 2, 128, {"hidden": 128, "layers": 2}),
    ("qwen2", "lora", "bf16", "sdpa", GC, 2, 128, {"hidden": 128, "layers": 2}),
    ("qwen2", "full", "fp32", "eager", GC, 1, 128, {"hidden": 128, "layers": 2}),
    ("qwen2", "lora", "fp32", "eager", False, 2, 128, {"hidden": 128, "layers": 2}),
    ("llava", "finetune", "bf16", "sdpa", False, 1, 128, {"hidden": 128, "layers": 2}),
    ("llava", "lora", "bf16", "sdpa", GC, 1, 128, {"hidden": 128, "layers": 2}),
    ("llava", "full", "fp32", "eager", False, 1, 128, {"hidden": 128, "layers": 2}),
    # HF bf16=True (autocast on fp32 weights), every second layer checkpointed, MoE decoders
    ("llama", "full", "amp_bf16", "sdpa", False, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("llama", "lora", "amp_bf16", "sdpa", GC, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}),
    ("qwen2", "full", "amp_bf16", "sdpa", GC, 1, 256, {"hidden": 128, "layers": 2}),
    ("llama", "full", "bf16", "sdpa", dict(GC, every_n_layers=2), 2, 256,
     {"hidden": 128, "layers": 4, "vocab": 4096}),
    ("mixtral", "full", "bf16", "sdpa", False, 2, 128, {"hidden": 128, "layers": 2}),
    ("qwen3_moe", "lora", "bf16", "sdpa", GC, 2, 128, {"hidden": 128, "layers": 2}),
]


# DDP (2 ranks): accelerate's prepare_model wraps DistributedDataParallel, then compiles the
# wrapper last; dynamo's DDPOptimizer splits the graph at bucket_cap_mb boundaries
# (torch/_dynamo/backends/distributed.py), so a 1 MB bucket splits these small models
DDP_ROWS = [
    ("llama", "full", "bf16", "sdpa", False, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}, 25),
    ("llama", "full", "bf16", "sdpa", GC, 2, 128, {"hidden": 128, "layers": 2, "vocab": 4096}, 1),
    ("qwen2", "lora", "bf16", "sdpa", GC, 2, 128, {"hidden": 128, "layers": 2}, 25),
]


def ddp_setups():
    import truth
    out = []
    for fam, mode, prec, attn, gc_, B, S, model, cap in DDP_ROWS:
        s = truth.make_setup(fam, mode, prec, attn, gc_, B, S, 0, None, "adamw_torch", "ddp", 2,
                             popt={"bucket_cap_mb": cap, "gradient_as_bucket_view": False}, model=model,
                             seed=13)
        s["torch_compile"] = {"backend": "inductor", "mode": None}
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-ddp-2-%s-%s-%s-compile-%s" % (fam, mode, prec, attn, hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out


def setups():
    import truth
    out = []
    for fam, mode, prec, attn, gc_, B, S, model in ROWS:
        k, img = (1, (112, 112)) if fam == "llava" else (0, None)
        s = truth.make_setup(fam, mode, prec, attn, gc_, B, S, k, img, "adamw_torch", "single", 1,
                             model=model, seed=11)
        s["torch_compile"] = {"backend": "inductor", "mode": None}
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-single-1-%s-%s-%s-compile-%s" % (fam, mode, prec, attn,
                                                        hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out


# emul.py's hooks that replace a torch.nn.functional function by Python code that calls memhook
# (a pybind11 builtin dynamo cannot trace): under torch.compile each call would be a graph break,
# splitting the model into graphs a CUDA job does not have.  Compiled rows run without them and
# see the real ops in one graph (docs/oracle.md "torch.compile rows" says what that changes).
NOT_TRACEABLE = ("sdpa_cuda", "layer_norm_cuda", "dropout_cuda", "conv_cudnn")


def compile_stats():
    """dynamo's own counters for the run: graphs compiled and graph breaks (0 = one graph)"""
    from torch._dynamo.utils import counters
    return {"graph_breaks": sum(counters["graph_break"].values()),
            "unique_graphs": int(counters["stats"]["unique_graphs"])}


# ------------------------------------------------------------ op-level selective checkpointing
# torchtitan's "selective" activation checkpointing with selective_ac_option = "op", as its TOML
# configs ran it (torchtitan @ 9810191bb^): torchtitan/distributed/activation_checkpoint.py
# _apply_op_sac (l.98-137) with models/llama3/infra/parallelize.py _op_sac_save_list (l.36-51),
# applied here to each HF decoder layer through transformers' gradient_checkpointing_enable(
# gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": ...}), which passes it to
# torch.utils.checkpoint.checkpoint as torchtitan's ptd_checkpoint_wrapper does.
def _save_list():
    import torch
    ops = [torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_efficient_attention.default,
           torch.ops.aten._scaled_dot_product_flash_attention.default,
           torch.ops.aten._scaled_dot_product_cudnn_attention.default,
           torch.ops.aten._scaled_dot_product_attention_math.default,
           torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
           torch.ops._c10d_functional.reduce_scatter_tensor.default, torch.ops.aten.max.default]
    return set(ops)


def _in_fused_sdpa():
    """inside emul._FusedSDPA.forward: its counted allocations are the outputs of the CUDA
    flash / efficient kernel (_scaled_dot_product_{flash,efficient}_attention, in the save
    list); the CPU kernel that computes the numbers runs uncounted beside them"""
    import sys
    import emul
    code = emul._FusedSDPA.forward.__code__
    f = sys._getframe(2)
    for _ in range(8):
        if f is None:
            return False
        if f.f_code is code:
            return True
        f = f.f_back
    return False


def op_sac_context():
    import collections
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save = _save_list()
    mm = torch.ops.aten.mm.default
    empty = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
             torch.ops.aten.empty_strided.default}
    meta = collections.defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = ("recompute" if ctx.is_recompute else "forward") + "_mm_count"
        if func == mm:
            meta[key] += 1
        # saves the output of all compute ops, except every second mm (torchtitan l.114-117)
        to_save = (func in save or (func in empty and _in_fused_sdpa())) and not (func == mm and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE
    # allow_cache_entry_mutation: the emulated kernel fills its cached outputs in place (copy_)
    return create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation=True)


SAC = {"use_reentrant": False, "every_n_layers": 1, "selective": "op"}
SAC_ROWS = [
    ("llama", "full", "bf16", "sdpa", 2, 256, {"hidden": 256, "layers": 4, "vocab": 8192}),
    ("llama", "full", "fp32", "sdpa", 2, 128, {"hidden": 256, "layers": 3, "vocab": 8192}),
    ("llama", "full", "fp32", "eager", 1, 256, {"hidden": 256, "layers": 3, "vocab": 8192}),
    ("llama", "lora", "bf16", "sdpa", 2, 256, {"hidden": 256, "layers": 4, "vocab": 8192}),
    ("qwen2", "full", "bf16", "sdpa", 2, 256, {"hidden": 256, "layers": 3}),
    ("qwen2", "lora", "bf16", "sdpa", 1, 384, {"hidden": 256, "layers": 3}),
    ("llama", "full", "bf16", "sdpa", 4, 512, {"hidden": 512, "layers": 2, "vocab": 8192}),
    ("llama", "lora", "amp_bf16", "sdpa", 2, 256, {"hidden": 256, "layers": 3, "vocab": 8192}),
    ("mixtral", "full", "bf16", "sdpa", 2, 256, {"hidden": 128, "layers": 3}),
    ("llava", "finetune", "bf16", "sdpa", 2, 256, {"hidden": 256, "layers": 3}),
    ("qwen2", "full", "fp32", "sdpa", 2, 256, {"hidden": 256, "layers": 3}),
]


def sac_setups():
    import truth
    out = []
    for fam, mode, prec, attn, B, S, model in SAC_ROWS:
        k, img = (1, (112, 112)) if fam == "llava" else (0, None)
        lora = None
        if mode == "lora":
            lora = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "language-linear",
                    "on": "language"}
        s = truth.make_setup(fam, mode, prec, attn, dict(SAC), B, S, k, img, "adamw_torch", "single", 1,
                             model=model, lora=lora, seed=12)
        s["id"] = s["id"].replace("-%s-" % attn, "-%s-sacop-" % attn, 1)
        out.append(s)
    return out


def all_setups():
    """the one generator truth.py config_list calls"""
    return setups() + sac_setups() + ddp_setups() + titan_setups() + titan_eager_setups()


# ------------------------------------------------- torchtitan's per-block compile under FSDP2
# torchtitan @ 9810191bb^ (the TOML configs that mmguard imports), models/llama3/infra/parallelize.py
# parallelize_llama l.107-123: activation checkpointing first (apply_ac), then apply_compile
# (l.256-267: each TransformerBlock replaced by torch.compile(block, backend=compile.backend,
# fullgraph=True), model.layers.register_module), then apply_fsdp (fully_shard per block, then the
# root).  compile.components (config/job_config.py l.721-727, default ["model", "loss"]): "model"
# is that per-block compile; "loss" compiles the loss function, torch.compile(loss_fn,
# backend=...) (components/loss.py l.33-35).  Here the HF decoder layers are the blocks (transformers'
# GradientCheckpointingLayer.__call__ holds the checkpoint, so compiling the layer object, as
# torchtitan compiles its checkpoint wrapper, traces the checkpoint into the graph) and the loss is
# the model's loss_function (ForCausalLMLoss: the fp32 upcast and cross-entropy).
TITAN_ROWS = [
    # (precision, fsdp2 mixed_precision, attention, checkpointing, B, S, components[, model])
    ("bf16", None, "sdpa", False, 2, 128, ("model",)),
    ("bf16", None, "sdpa", GC, 2, 128, ("model",)),
    ("fp32", "bf16", "sdpa", False, 2, 128, ("model", "loss")),
    ("fp32", "bf16", "sdpa", GC, 2, 128, ("model", "loss")),
    ("bf16", None, "sdpa", GC, 2, 256, ("model", "loss")),
    ("fp32", None, "eager", GC, 1, 128, ("model",)),
    ("fp32", "bf16", "sdpa", False, 2, 128, ("model",)),
    # torchtitan's layer-level selective AC ("2": every second block), a larger model
    ("fp32", "bf16", "sdpa", dict(GC, every_n_layers=2), 2, 256, ("model", "loss"),
     {"hidden": 128, "layers": 4, "vocab": 4096}),
    ("bf16", None, "sdpa", GC, 2, 256, ("model",), {"hidden": 256, "layers": 3, "vocab": 8192}),
]
TITAN_MODEL = {"hidden": 128, "layers": 2, "vocab": 4096}


def titan_setups():
    import truth
    out = []
    for row in TITAN_ROWS:
        prec, mp, attn, gc_, B, S, comps = row[:7]
        model = row[7] if len(row) > 7 else TITAN_MODEL
        s = truth.make_setup("llama", "full", prec, attn, gc_, B, S, 0, None, "adamw_torch", "fsdp2", 2,
                             popt={"reshard_after_forward": True, "mixed_precision": mp},
                             model=dict(model), seed=14)
        s["torch_compile"] = {"backend": "inductor", "mode": None, "per_block": True, "fullgraph": True,
                              "components": list(comps)}
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "llama-fsdp2-2-full-%s-%s-titancompile-%s" % (prec, attn, hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out


def titan_eager_setups():
    """the same FSDP2 steps run eagerly: the compiled rows' peaks against the eager measurement,
    apart from the eager prediction's own error (docs/oracle.md)"""
    out = []
    for s in titan_setups():
        s = dict(s)
        del s["torch_compile"]
        s["id"] = s["id"].replace("-titancompile-", "-titaneager-")
        out.append(s)
    return out


def per_block(setup):
    """a row compiled torchtitan's way (each block, before fully_shard), not the Trainer's"""
    return bool((setup.get("torch_compile") or {}).get("per_block"))


def compile_blocks(model, setup, classes):
    """torchtitan's apply_compile on the HF decoder layers and, with "loss" in components, its
    loss compile; returns the compiled blocks, which fully_shard then wraps (apply_fsdp)"""
    import torch
    tc = setup["torch_compile"]
    blocks = []
    for name, parent in list(model.named_modules()):
        for cname, child in list(parent.named_children()):
            if isinstance(child, classes):
                c = torch.compile(child, backend=tc["backend"], fullgraph=tc.get("fullgraph", True))
                parent.register_module(cname, c)
                blocks.append(c)
    if "loss" in tc.get("components", ()):
        model.loss_function = torch.compile(model.loss_function, backend=tc["backend"])
    return blocks
