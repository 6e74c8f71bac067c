#!/usr/bin/env python3
"""Real-library CPU oracle: peak memory of one training step of real HF models.

    truth.py run SETUP.json|'{...}' [--trace]   measure one setup, print the JSON row
    truth.py list [--count N]                   print the deterministic config list
    truth.py generate --out FILE [--timeout S] [--only REGEX] [--limit N]
                                                append the missing rows (one subprocess each)

What runs (docs/oracle.md): transformers' own model classes built from tiny
configs, the family's real image processor, transformers.Trainer's
training_step / create_optimizer / gradient clipping, torch.optim.AdamW,
PEFT LoRA, torch.distributed (gloo) DDP / FSDP1 / FSDP2 with one process per
rank.  Counted: every live CPU-allocator storage of the process (memhook),
with the CUDA-kernel emulations of emul.py.  Phases: forward = step start to
entering accelerator.backward; backward = until training_step returns;
optimizer = clipping + optimizer.step() + model.zero_grad().  The SECOND step
is measured (the first creates the optimizer state), gc.collect() before it.
"""
import argparse
import contextlib
import gc
import hashlib
import itertools
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODES = ("full", "finetune", "pretrain", "lora", "frozen_llm")
PHASES = ("forward", "backward", "optimizer")

# Which official recipe each family's freezing / LoRA follows.
#   llava-style (haotian-liu/LLaVA train.py): pretrain = only mm_projector; finetune = vision frozen;
#       lora = LoRA on all LLM linears + projector trainable.
#   LLaMA-Factory (freeze_vision_tower=True, freeze_multi_modal_projector=True by default for lora;
#       full: vision frozen, projector + LLM train): used for the Qwen-VL, InternVL, Gemma3, Mllama,
#       Idefics3/SmolVLM families.
RECIPE = {
    "llava": "llava", "llava_onevision": "llava",
    "qwen2_vl": "llamafactory", "qwen2_5_vl": "llamafactory", "qwen3_vl": "llamafactory",
    "qwen3_vl_moe": "llamafactory", "internvl": "llamafactory", "gemma3": "llamafactory",
    "mllama": "llamafactory", "idefics3": "llamafactory", "smolvlm": "llamafactory",
    "llama": "text", "qwen2": "text", "mixtral": "text", "qwen3_moe": "text",
    "pixtral": "llava",     # pixtral-12b is a LlavaForConditionalGeneration (tests/truth/pixtral.py)
    "mistral3": "llava",    # Mistral-Small-3.1's layout, the same recipe (tests/truth/pixtral.py)
}

CONNECTOR_RE = re.compile(r"(multi_modal_projector|\.merger\.|deepstack_merger|\bconnector\b|image_newline|"
                          r"visual\.merger|mlp1)")
VISION_RE = re.compile(r"(vision_tower|vision_model|\bvisual\b|model\.visual)")


def part_of(name):
    if CONNECTOR_RE.search(name):
        return "connector"
    if VISION_RE.search(name):
        return "vision"
    return "language"


def trainable_parts(mode, fam_multimodal, recipe):
    if not fam_multimodal:
        return {"vision": False, "connector": False, "language": mode != "lora"}
    return {
        "full": {"vision": True, "connector": True, "language": True},
        "finetune": {"vision": False, "connector": True, "language": True},
        "pretrain": {"vision": False, "connector": True, "language": False},
        "lora": {"vision": False, "connector": recipe == "llava", "language": False},
        "frozen_llm": {"vision": True, "connector": True, "language": False},
    }[mode]


# =========================================================== one process
def _seed(s):
    import numpy as np
    import torch
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def build_inputs(fam, spec, cfg, model, setup, seed):
    """Host-side batch exactly as the family's processor would make it (uncounted: it is
    host memory on a GPU job; the Trainer's _prepare_inputs copy is what is counted)."""
    import torch
    import families
    import memhook
    B, S = setup["micro_batch_size"], setup["seq_len"]
    k = setup["images_per_sample"] if families.FAMILIES[fam]["multimodal"] else 0
    g = torch.Generator().manual_seed(seed)
    vocab = cfg.get_text_config().vocab_size
    text_hi = vocab - 16                               # ordinary text ids stay below the special ids
    batch = {}
    per_image, patches = [], []
    with memhook.uncounted():
        proc = families.make_processor(spec)
        extra = {}
        if k:
            H, W = setup["image_size"]
            imgs = families.synthetic_images(B * k, (H, W), seed) if not setup.get("video_frames") else None
            if setup.get("video_frames"):           # Qwen-VL video (feat_towers.py)
                out, per_image, patches, vtok = __import__("feat_towers").video_inputs(spec, cfg, setup, B, k, seed)
            elif spec["layout"] == "mllama":
                out = proc(images=[imgs[i * k:(i + 1) * k] for i in range(B)], return_tensors="pt")
            elif spec["layout"] == "plain_pos":
                out = proc(images=[imgs[i * k:(i + 1) * k] for i in range(B)], return_tensors="pt")
            else:
                out = proc(images=imgs, return_tensors="pt")
            out = dict(out)
            if not setup.get("video_frames"):
                per_image, patches = count_visual_tokens(fam, spec, cfg, model, out, B, k)
            extra = out
        ids = torch.randint(3, text_hi, (B, S), generator=g)
        labels = ids.clone()
        tt = torch.zeros((B, S), dtype=torch.long) if (spec.get("token_type_ids") or spec.get("mm_token_type_ids")) else None
        xmask = None
        if spec.get("layout") == "mllama" and k:
            tiles = extra["aspect_ratio_mask"].shape[-1]
            xmask = torch.zeros((B, S, k, tiles), dtype=torch.long)
        for b in range(B):
            pos = 4
            for j in range(k):
                n = per_image[b * k + j]
                if spec["layout"] == "mllama":
                    ids[b, pos] = spec["image_token"]
                    ntiles = int(extra["num_tiles"][b][j]) if "num_tiles" in extra else tiles
                    xmask[b, pos:, j, :ntiles] = 1
                    pos += 1
                    continue
                if spec.get("wrap"):
                    ids[b, pos] = spec["wrap"][0]
                    pos += 1
                ids[b, pos:pos + n] = spec["image_token"] if not setup.get("video_frames") else vtok
                if tt is not None:
                    tt[b, pos:pos + n] = 2 if setup.get("video_frames") else 1   # Qwen-VL: video == 2
                pos += n
                if spec.get("wrap"):
                    ids[b, pos] = spec["wrap"][1]
                    pos += 1
                pos += 2                                 # text between images
            if pos + 8 > S:
                raise ValueError("seq_len %d too short for %d visual tokens" % (S, pos))
            answer = pos + (S - pos) // 2                # prompt = first half of the remaining text
            labels[b, :answer] = -100
        batch["input_ids"] = ids
        batch["attention_mask"] = torch.ones((B, S), dtype=torch.long)
        batch["labels"] = labels
        if tt is not None:
            batch["mm_token_type_ids" if spec.get("mm_token_type_ids") else "token_type_ids"] = tt
        if k:
            for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "image_sizes", "aspect_ratio_ids", "aspect_ratio_mask",
                        "pixel_attention_mask"):
                if key in extra and extra[key] is not None:
                    batch[key] = extra[key]
            if xmask is not None:
                batch["cross_attention_mask"] = xmask
    tokens = {"total_per_sample": S, "visual_per_image": per_image[:k] if k else [],
              "patches_per_image": patches[:k] if k else []}
    return batch, tokens


def count_visual_tokens(fam, spec, cfg, model, out, B, k):
    """Visual tokens per image as the model itself produces them (get_image_features), and the
    pre-merge patch count."""
    import torch
    n_img = B * k
    vc = cfg.vision_config
    if fam in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"):
        thw = out["image_grid_thw"]
        patches = [int(x) for x in thw.prod(-1)]
        m = vc.spatial_merge_size ** 2
        return [p // m for p in patches], patches
    if fam == "mllama":
        nt = out.get("num_tiles")
        ps = (vc.image_size // vc.patch_size) ** 2 + 1
        tiles = [int(t) for row in nt for t in row] if nt is not None else [vc.max_num_tiles] * n_img
        return [1] * n_img, [t * ps for t in tiles]
    with torch.no_grad():
        if fam == "mistral3":           # per-image features after the 2x2 merge (modeling_mistral3.py)
            feats = model.model.get_image_features(pixel_values=out["pixel_values"], image_sizes=out["image_sizes"],
                                                   vision_feature_layer=cfg.vision_feature_layer)
        elif fam == "pixtral":          # per-image features: split by image_sizes (modeling_llava.py)
            feats = model.model.get_image_features(pixel_values=out["pixel_values"], image_sizes=out["image_sizes"],
                                                   vision_feature_layer=cfg.vision_feature_layer,
                                                   vision_feature_select_strategy=cfg.vision_feature_select_strategy)
        elif fam == "llava_onevision":
            feats = model.model.get_image_features(pixel_values=out["pixel_values"], image_sizes=out["image_sizes"],
                                                   vision_feature_layer=cfg.vision_feature_layer,
                                                   vision_feature_select_strategy=cfg.vision_feature_select_strategy)
        elif fam in ("idefics3", "smolvlm"):
            feats = model.model.get_image_features(pixel_values=out["pixel_values"],
                                                   pixel_attention_mask=out.get("pixel_attention_mask"))
        else:
            feats = model.model.get_image_features(pixel_values=out["pixel_values"])
    if hasattr(feats, "pooler_output") and feats.pooler_output is not None:
        feats = feats.pooler_output
    elif hasattr(feats, "last_hidden_state"):
        feats = feats.last_hidden_state
    if isinstance(feats, (list, tuple)):
        counts = [int(f.shape[0]) if f.dim() == 2 else int(f.shape[0] * f.shape[1]) for f in feats]
    else:
        f = feats
        total = f.shape[0] * f.shape[1] if f.dim() == 3 else f.shape[0]
        counts = None
        if f.dim() == 3 and f.shape[0] == n_img:
            counts = [int(f.shape[1])] * n_img
        else:
            counts = [int(total) // n_img] * n_img
    if fam == "pixtral":                # one patch per [IMG] feature
        patches = list(counts)
    elif fam == "mistral3":             # spatial_merge_size^2 patches per feature
        patches = [n * cfg.spatial_merge_size ** 2 for n in counts]
    elif fam == "llava_onevision":
        patches = [int(out["pixel_values"].shape[1]) * (vc.image_size // vc.patch_size) ** 2] * n_img
    elif fam in ("idefics3", "smolvlm"):
        pv = out["pixel_values"]
        real = int((pv.flatten(2).abs().sum(-1) != 0).sum())
        per = real // n_img
        patches = [per * (vc.image_size // vc.patch_size) ** 2] * n_img
    elif fam == "internvl":
        tiles = out["pixel_values"].shape[0] // n_img
        patches = [tiles * (vc.image_size[0] // vc.patch_size[0]) ** 2] * n_img
    else:
        vs = vc.image_size if isinstance(vc.image_size, int) else vc.image_size[0]
        ps = vc.patch_size if isinstance(vc.patch_size, int) else vc.patch_size[0]
        patches = [(vs // ps) ** 2] * n_img
    return counts, patches


def set_trainable(model, fam, setup):
    import families
    tp = setup["trainable"]
    for n, p in model.named_parameters():
        p.requires_grad_(bool(tp[part_of(n)]) if families.FAMILIES[fam]["multimodal"] else bool(tp["language"]))


LORA_TARGETS = r".*(language_model|text_model).*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"


def lora_names_regex(names):
    """named LoRA targets on a VLM's language model only: its Linears and embed_tokens under
    language_model / text_model, lm_head at the top (transformers 5 VLM layout)"""
    inner = [n for n in names if n != "lm_head"]
    alts = [r".*(language_model|text_model).*\.(%s)" % "|".join(inner)] if inner else []
    return "(%s)$" % "|".join(alts + (["lm_head"] if "lm_head" in names else []))


def apply_lora(model, fam, setup):
    import families
    from peft import LoraConfig, get_peft_model
    lc = setup["lora"]
    tm = lc["target_modules"]
    if tm == "language-linear":
        tm = LORA_TARGETS if families.FAMILIES[fam]["multimodal"] else "all-linear"
    elif isinstance(tm, list) and families.FAMILIES[fam]["multimodal"]:
        tm = lora_names_regex(tm)       # named targets of the language model (feat_lorahead.py)
    conf = LoraConfig(r=lc["r"], lora_alpha=lc["lora_alpha"], lora_dropout=lc["lora_dropout"],
                      target_modules=tm, bias="none", task_type="CAUSAL_LM",
                      modules_to_save=lc.get("modules_to_save"))
    # PEFT's default autocast_adapter_dtype=True keeps LoRA weights in fp32 on a 16-bit base;
    # FSDP1 flat parameters need one dtype, so FSDP1 rows turn it off (recorded in setup.lora)
    pm = get_peft_model(model, conf, autocast_adapter_dtype=lc.get("autocast_adapter_dtype", True))
    # the recipe's extra trainable modules (LLaVA: mm_projector stays trainable with LoRA)
    tp = setup["trainable"]
    for n, p in pm.named_parameters():
        if "lora_" in n:
            continue
        part = part_of(n)
        if part != "language" and tp[part]:
            p.requires_grad_(True)
    return pm


def decoder_layer_classes(model):
    """Classes FSDP wraps per layer: decoder layers and vision blocks (HF _no_split_modules)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    for m in model.modules():
        ns = getattr(m, "_no_split_modules", None)
        if ns:
            names.update(ns)
    classes = set()
    for m in model.modules():
        if type(m).__name__ in names:
            classes.add(type(m))
    return classes


memhook_GLOO_CALL, memhook_GLOO_THREAD = 3, 2     # memhook.GLOO_CALL, memhook.GLOO_THREAD


class Meter:
    def __init__(self):
        import memhook
        self.m = memhook._mod
        self.phase = None
        self.peaks = {}

    def start(self):
        gc.collect()
        self.start_bytes = self.m.live()
        self.m.reset_peak()
        self.m.reset_category_peaks()
        self.m.collective_calls(True)          # the measured step's collectives only
        self.phase = "forward"

    def switch(self, to):
        # a phase seen again (the next micro-batch's forward) keeps its highest peak
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), self.m.reset_peak())
        self.phase = to

    def stop(self):
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), self.m.reset_peak())
        self.end_bytes = self.m.live()
        # gloo's collective scratch, not counted (memhook categories GLOO_CALL / GLOO_THREAD):
        # bytes allocated over the step, and the step's peak had it been counted
        call, thread = self.m.category_stats(memhook_GLOO_CALL), self.m.category_stats(memhook_GLOO_THREAD)
        self.gloo = {"call_bytes": call[2], "thread_bytes": thread[2], "peak_with_scratch": self.m.shadow_peak(),
                     "calls": dict(sorted(self.m.collective_calls(False).items()))}


def compile_args(setup):
    """TrainingArguments' torch_compile keys of a compiled row (tests/truth/feat_compile.py)"""
    tc = setup.get("torch_compile")
    if not tc:
        return {}
    return {"torch_compile": True, "torch_compile_backend": tc.get("backend"), "torch_compile_mode": tc.get("mode")}


def run_rank(setup, rank=0, world=1, trace=False):
    """Build, train two steps, measure the second.  Returns this rank's dict."""
    t0 = time.time()
    import memhook
    memhook.load()
    import torch
    torch.set_num_threads(int(os.environ.get("TRUTH_THREADS", "1" if world > 1 else "2")))
    import emul
    import families
    fam = setup["family"]
    # TRUTH_EMULATIONS=a,b,... (or "none") narrows the emulations, for investigation only
    want = os.environ.get("TRUTH_EMULATIONS")
    want = emul.ALL if want is None else [w for w in want.split(",") if w in emul.ALL]
    if setup.get("torch_compile"):
        import feat_compile                  # dynamo traces Python: the Python-level hooks would split the graph
        want = [w for w in want if w not in feat_compile.NOT_TRACEABLE]
    emus = emul.install(want)
    if int(setup.get("grad_accum", 1)) > 1:
        import accum                      # only rows with gradient accumulation (tests/truth/accum.py)
        emus = emus + accum.install(setup, os.environ.get("TRUTH_EMULATIONS"))
    import transformers
    from transformers import Trainer, TrainingArguments
    transformers.logging.set_verbosity_error()

    _seed(setup["seed"])
    cfg, spec = families.make_config(fam, setup["model"])
    prec = setup["precision"]
    dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    cls = getattr(transformers, families.FAMILIES[fam]["hf_class"])
    cfg._attn_implementation = setup["attention"]
    model = cls._from_config(cfg, attn_implementation=setup["attention"], dtype=dtype)
    model.config.use_cache = False
    if prec == "bf16":
        model.to(torch.bfloat16)
    if setup.get("loss_upcast") is False:
        import feat_keys                   # the loss on 16-bit logits without the upcast (feat_keys.py)
        feat_keys.no_upcast(model)

    batch, tokens = build_inputs(fam, spec, model.config, model, setup, setup["seed"] + 1)

    set_trainable(model, fam, setup)
    if setup["mode"] == "lora":
        model = apply_lora(model, fam, setup)
    if setup.get("liger"):                      # Liger kernels, emulated (tests/truth/emul_liger.py)
        import emul_liger
        emus = emus + ["liger_" + k for k, n in emul_liger.patch_model(model, **setup["liger"]).items() if n]
    if setup.get("cuda_mixed_add"):             # PEFT's bf16 + fp32 sums without the CPU's copy (emul_peft.py)
        emus = emus + __import__("emul_peft").patch_model(model)
    gcfg = setup["gradient_checkpointing"]
    if gcfg:
        kw = {"use_reentrant": gcfg["use_reentrant"]}
        if gcfg.get("selective") == "op":       # torchtitan's op-level policy (feat_compile.py)
            import feat_compile
            kw["context_fn"] = feat_compile.op_sac_context
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw,
                                            every_n_layers=gcfg.get("every_n_layers", 1))
    if setup.get("vit_gradient_checkpointing") is not None:   # ms-swift's per-tower switch (feat_towers.py)
        __import__("feat_towers").apply(model, setup)
    model.train()
    # counted before any wrapper shards the parameters (FSDP1 use_orig_params views, ZeRO-3 partitions)
    _base = model.get_base_model() if hasattr(model, "get_base_model") else model
    nparams = sum(p.numel() for p in _base.parameters())
    ntrain = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del _base

    par = setup["parallel"]
    popt = setup.get("parallel_options") or {}
    ga = int(setup.get("grad_accum", 1))                 # micro-batches per optimizer step
    sync_each = bool(setup.get("sync_each_micro_batch", False))
    tmp = tempfile.mkdtemp(prefix="truth-")
    args = TrainingArguments(output_dir=tmp, use_cpu=True, optim=setup["optimizer"], report_to=[],
                             max_grad_norm=setup["max_grad_norm"], learning_rate=1e-5, weight_decay=0.0,
                             per_device_train_batch_size=setup["micro_batch_size"],
                             bf16=(prec == "amp_bf16"), ddp_backend="gloo" if world > 1 else None,
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             gradient_checkpointing=False, gradient_accumulation_steps=ga,
                             **compile_args(setup))

    # the device copy of the batch a GPU job holds (device_batch_copy): accelerate's
    # DataLoaderShard sends each batch to the device (data_loader.py __iter__,
    # send_to_device) and Trainer._inner_training_loop keeps the micro-batches of the
    # step in `batch_samples` until after optimizer.step(); the copies are kept here
    # and released after the step
    device_batch = []
    on_device = set()           # ids of the copies made up front (grad_accum > 1): already "on the device"

    class TruthTrainer(Trainer):
        def _prepare_input(self, data):
            if isinstance(data, torch.Tensor) and id(data) in on_device:
                return data
            if isinstance(data, torch.Tensor) and "device_batch_copy" in emus:
                c = data.clone()
                device_batch.append(c)
                return c
            return super()._prepare_input(data)

    trainer = TruthTrainer(model=model, args=args)
    trainer.current_gradient_accumulation_steps = ga
    wrapped = model
    if par == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(model, find_unused_parameters=not gcfg,
                      bucket_cap_mb=popt.get("bucket_cap_mb", 25),
                      gradient_as_bucket_view=popt.get("gradient_as_bucket_view", False))
    elif par == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        mp = None
        if popt.get("mixed_precision") == "bf16":
            mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
        policy = ModuleWrapPolicy(decoder_layer_classes(model))
        if popt.get("wrap_policy") == "peft_lora":      # PEFT's own policy (feat_wrap.py)
            from peft.utils.other import fsdp_auto_wrap_policy
            # the layer classes as accelerate's fsdp_transformer_layer_cls_to_wrap passes
            # them (PEFT reads FSDP_TRANSFORMER_CLS_TO_WRAP, other.py:1281-1283): the
            # default _no_split_modules of a VLM names classes absent from it (TypeError :1290)
            os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = ",".join(
                sorted(c.__name__ for c in decoder_layer_classes(model)))
            policy = fsdp_auto_wrap_policy(model)
        elif popt.get("wrap_policy") == "size":         # size-based auto-wrap (feat_wrap.py)
            # accelerate's SIZE_BASED_WRAP: functools.partial(size_based_auto_wrap_policy,
            # min_num_params=N) (accelerate/utils/dataclasses.py:2102-2105)
            import functools
            from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
            policy = functools.partial(size_based_auto_wrap_policy, min_num_params=popt["min_num_params"])
        wrapped = FSDP(model, auto_wrap_policy=policy,
                       use_orig_params=popt.get("use_orig_params", True), mixed_precision=mp,
                       sharding_strategy=getattr(ShardingStrategy, popt.get("sharding", "FULL_SHARD")),
                       device_id=torch.device("cpu"), limit_all_gathers=True, sync_module_states=False)
    elif par == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
        mesh = init_device_mesh("cpu", (world,))
        mp = MixedPrecisionPolicy()
        if popt.get("mixed_precision") == "bf16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        raf = popt.get("reshard_after_forward", True)
        classes = tuple(decoder_layer_classes(model))
        for m in list(model.modules()):
            if isinstance(m, classes):
                fully_shard(m, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=raf, mp_policy=mp)
    elif par == "tp":                           # tensor parallelism, DTensor on gloo (tests/truth/tp.py)
        wrapped = __import__("tp").apply(model, setup, world)
        batch = __import__("tp").adjust_batch(batch, setup)
    if prec == "amp_bf16" or setup.get("torch_compile"):
        # torch_compile: accelerate's prepare_model compiles last, torch.compile(model, backend=, mode=)
        # from the Trainer's TorchDynamoPlugin (accelerator.py l.2068-2073, trainer.py l.765-769)
        wrapped = trainer.accelerator.prepare_model(wrapped, device_placement=False)
    trainer.model_wrapped = wrapped
    trainer.model = model if par != "fsdp1" else wrapped
    trainer.create_optimizer()
    opt = trainer.optimizer
    if setup["optimizer"] == "adamw_torch" and "adamw_foreach" in emus:
        for g in opt.param_groups:          # CUDA default: foreach (optimizer.py _default_to_fused_or_foreach)
            g["foreach"] = True
    trainer.create_scheduler(num_training_steps=10, optimizer=opt)
    engine = None
    if par.startswith("zero"):
        # DeepSpeed engine around the Trainer's optimizer (zero_allow_untested_optimizer), as
        # accelerate's DeepSpeed plugin does with a client optimizer; bf16 => bf16 model + fp32 master
        import deepspeed
        dsc = dict(popt["deepspeed"])
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=dsc, dist_init_required=False)
        wrapped = engine
        trainer.model_wrapped = engine
        trainer.optimizer = opt

    meter = Meter()
    orig_backward = trainer.accelerator.backward

    trace_box = []

    def backward(loss, **kw):
        if meter.phase == "forward":
            meter.switch("backward")
            if trace_box:
                trace_box[0].set_phase("backward")
        if engine is not None:
            # accelerate DeepSpeedEngineWrapper.backward: engine.backward(loss) then engine.step();
            # the step (clipping, optimizer, zero_grad inside DeepSpeed) runs after training_step here
            # so that it is counted in the optimizer phase
            return engine.backward(loss)
        return orig_backward(loss, **kw)
    trainer.accelerator.backward = backward

    def clip():
        mg = setup["max_grad_norm"]
        if not mg or mg <= 0:
            return
        if par == "fsdp1":
            wrapped.clip_grad_norm_(mg)
        elif par == "fsdp2":
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], mg)
        else:
            trainer._clip_grad_norm(wrapped)

    num_items = trainer._get_num_items_in_batch([batch] * ga, torch.device("cpu"))

    def micro_batches():
        """transformers trainer.py:1809 get_batch_samples fetches the step's micro-batches
        before the first forward; accelerate's DataLoaderShard has sent each to the device
        (data_loader.py __iter__, send_to_device): with grad_accum > 1 all their device
        copies exist from the step's start (one micro-batch keeps the lazy copy above)"""
        if ga == 1:
            return [batch]
        out = []
        for _ in range(ga):
            mb = {}
            for k_, v in batch.items():
                if isinstance(v, torch.Tensor) and "device_batch_copy" in emus:
                    v = v.clone()
                    device_batch.append(v)
                    on_device.add(id(v))
                mb[k_] = v
            out.append(mb)
        return out

    def sync_context(i):
        """transformers trainer.py:1831-1840: every micro-batch but the last runs under
        accelerator.no_sync(model) unless gradient_accumulation_kwargs.sync_each_batch;
        accelerate accelerator.py:1166-1180 no_sync: FSDP2 set_requires_gradient_sync(False)
        (True again after), else the wrapper's own no_sync (FSDP1 / DDP).  The truth wraps
        FSDP itself (no accelerate FSDP plugin), so the same calls are made here.  Neither
        accelerate 1.15 nor the Trainer calls set_is_last_backward or set_reshard_after_backward:
        every micro-batch's post-backward reshards and its final callback is the last backward's
        (torch _fully_shard/_fsdp_state.py is_last_backward, default True)."""
        if ga == 1 or sync_each or i == ga - 1 or world == 1 or par == "tp":
            return contextlib.nullcontext()     # tp: no gradient reduction to skip (tests/truth/tp.py)
        if par == "fsdp2":
            @contextlib.contextmanager
            def fsdp2_no_sync():
                model.set_requires_gradient_sync(False)
                try:
                    yield
                finally:
                    model.set_requires_gradient_sync(True)
            return fsdp2_no_sync()
        if par in ("fsdp1", "ddp"):
            return wrapped.no_sync()
        raise ValueError("grad_accum > 1 is not set up for %s" % par)
    tracer = None
    result = None
    for step in range(2):
        measure = step == 1
        if measure:
            if "adamw_step_host" in emus:
                emul.hostify_adam_steps(opt.optimizer if engine is not None and hasattr(opt, "optimizer") else opt)
            if trace:
                import tracer as tracer_mod
                tracer = tracer_mod.Tracer(model)
                tracer.set_phase("forward")
                trace_box.append(tracer)
                tracer.__enter__()
            meter.start()
        for i, mb in enumerate(micro_batches()):
            if i and measure:
                meter.switch("forward")
                if tracer:
                    tracer.set_phase("forward")
            with sync_context(i), (__import__("tp").step_context(setup) if par == "tp" else contextlib.nullcontext()):
                loss = trainer.training_step(wrapped, mb, num_items)
        mb = None
        if measure:
            meter.switch("optimizer")
            if tracer:
                tracer.set_phase("optimizer")
        if engine is not None:
            engine.step()
        else:
            clip()
            opt.step()
            trainer.lr_scheduler.step()
            wrapped.zero_grad() if par == "fsdp1" else model.zero_grad()
        lossv = float(loss)
        del loss
        device_batch.clear()
        on_device.clear()
        if measure:
            meter.stop()
            if tracer:
                tracer.__exit__(None, None, None)
    peaks = meter.peaks
    peak_phase = max(PHASES, key=lambda p: peaks.get(p, -1))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    r = {"rank": rank, "start_bytes": meter.start_bytes, "end_bytes": meter.end_bytes,
         "phase_peak_bytes": {p: peaks[p] for p in PHASES}, "peak_bytes": max(peaks.values()),
         "peak_phase": peak_phase, "param_count": nparams, "trainable_count": ntrain, "loss": lossv,
         "seconds": round(time.time() - t0, 2)}
    if world > 1:
        r["gloo_scratch"] = meter.gloo
    if setup.get("torch_compile"):
        import feat_compile
        r["compile"] = feat_compile.compile_stats()
    result = {"rank": r, "tokens": tokens, "config": json.loads(base.config.to_json_string(use_diff=False)),
              "preprocessor": None, "emulations": emus}
    if spec.get("processor"):
        p = families.make_processor(spec)
        result["preprocessor"] = json.loads(p.to_json_string())
    if tracer:
        lines = []
        tracer.report(out=lines.append, top=int(os.environ.get("TRUTH_TRACE_TOP", "40")))
        tracer.thread_totals(out=lines.append)
        tracer.op_totals(out=lines.append, top=40)
        if world > 1:
            lines.append("c10d ops of the measured step: %s" % meter.gloo["calls"])
        result["trace"] = lines
    return result


# =========================================================== distributed
def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _rank_main(setup_json, rank, world, port, out):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    setup = json.loads(setup_json)
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    res = run_rank(setup, rank, world, trace=os.environ.get("TRUTH_TRACE") == "1")
    with open(out, "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_setup(setup, trace=False):
    t0 = time.time()
    world = setup["world_size"]
    if world == 1:
        res = run_rank(setup, trace=trace)
        ranks = [res["rank"]]
    else:
        port = _free_port()
        tmpd = tempfile.mkdtemp(prefix="truth-ranks-")
        procs = []
        outs = []
        for r in range(world):
            out = os.path.join(tmpd, "rank%d.json" % r)
            outs.append(out)
            code = ("import sys; sys.path.insert(0, %r); import truth; truth._rank_main(%r, %d, %d, %d, %r)"
                    % (HERE, json.dumps(setup), r, world, port, out))
            env = dict(os.environ, TRUTH_TRACE="1" if trace else "0")
            procs.append(subprocess.Popen([sys.executable, "-c", code], env=env))
        rcs = [p.wait() for p in procs]
        if any(rcs):
            raise RuntimeError("rank exit codes %s" % rcs)
        ranks, res, traces = [], None, []
        for r, out in enumerate(outs):
            with open(out) as f:
                d = json.load(f)
            ranks.append(d["rank"])
            res = res or d
            traces += ["== rank %d" % r] + d.get("trace", [])
        if trace:
            res["trace"] = traces
    peak = max(r["peak_bytes"] for r in ranks)
    top = max(ranks, key=lambda r: r["peak_bytes"])
    row = {
        "id": setup["id"], "family": setup["family"], "hf_class": setup["hf_class"],
        "config": res["config"], "preprocessor": res["preprocessor"], "setup": public_setup(setup),
        "tokens": res["tokens"], "versions": versions(), "emulations": res["emulations"],
        "measured": {"ranks": ranks, "peak_bytes": peak, "peak_phase": top["peak_phase"],
                     "phase_peak_bytes": {p: max(r["phase_peak_bytes"][p] for r in ranks) for p in PHASES}},
        "seconds": round(time.time() - t0, 2),
    }
    if trace and "trace" in res:
        row["trace"] = res["trace"]
    return row


SETUP_KEYS = ("mode", "trainable", "lora", "precision", "attention", "gradient_checkpointing", "micro_batch_size",
              "seq_len", "images_per_sample", "image_size", "optimizer", "max_grad_norm", "parallel", "world_size",
              "parallel_options", "torch_compile")
# only in setups that set them (tests/truth/accum.py, feat_towers.py): the older rows stay byte-identical
ACCUM_KEYS = ("grad_accum", "sync_each_micro_batch", "vit_gradient_checkpointing", "video_frames",
              "liger", "video_min_pixels", "video_max_pixels")
FEAT_KEYS = ("loss_upcast",)              # tests/truth/feat_keys.py


def public_setup(s):
    d = {k: s.get(k) for k in SETUP_KEYS}
    d.update({k: s[k] for k in ACCUM_KEYS if k in s})
    d.update({k: s[k] for k in FEAT_KEYS if k in s})
    d["recipe"] = RECIPE[s["family"]]
    d["seed"] = s["seed"]
    return d


def versions():
    import importlib.metadata as md
    out = {}
    for k in ("torch", "transformers", "peft", "accelerate", "deepspeed"):
        try:
            out[k] = md.version(k)
        except md.PackageNotFoundError:
            out[k] = None
    return out


# =========================================================== config list
def visual_upper_bound(fam, img):
    """An upper bound of the visual (+ wrapper) tokens per image, to keep seq_len feasible."""
    H, W = img
    if fam in ("pixtral", "mistral3"):
        return __import__("pixtral").visual_upper_bound(img)
    return {
        "llava": 64, "llava_onevision": 172, "internvl": 7 * 16 + 2, "gemma3": 18, "mllama": 1,
        "idefics3": 5 * 4 + 2, "smolvlm": 5 * 4 + 2,
        "qwen2_vl": (H // 28 + 1) * (W // 28 + 1) + 2, "qwen2_5_vl": (H // 28 + 1) * (W // 28 + 1) + 2,
        "qwen3_vl": (H // 32 + 1) * (W // 32 + 1) + 2, "qwen3_vl_moe": (H // 32 + 1) * (W // 32 + 1) + 2,
    }[fam]


def make_setup(fam, mode, prec, attn, gc_, B, S, k, img, opt, par, world, popt=None, model=None, lora=None,
               seed=0, accum=None, vit_gc=None, video=None, video_px=None):
    import families
    mm = families.FAMILIES[fam]["multimodal"]
    if not mm:
        k = 0
        if mode in ("pretrain", "frozen_llm", "finetune"):
            mode = "full"
    # combinations the real libraries refuse (docs/oracle.md "Refused by the libraries"):
    if fam == "smolvlm" and prec == "amp_bf16":
        prec = "bf16"       # SmolVLM inputs_merger: index_put_ fp32 <- bf16 under autocast raises
    if fam == "mllama" and par == "fsdp1" and (popt or {}).get("mixed_precision"):
        popt = dict(popt, mixed_precision=None)   # dtype mismatch in the text self-attention
    if k:
        need = 4 + k * (visual_upper_bound(fam, img) + 2) + 16
        if need > S:
            S = (need + 63) // 64 * 64
    s = dict(family=fam, hf_class=families.FAMILIES[fam]["hf_class"], mode=mode,
             trainable=trainable_parts(mode, mm, RECIPE[fam]), lora=None, precision=prec, attention=attn,
             gradient_checkpointing=gc_, micro_batch_size=B, seq_len=S, images_per_sample=k,
             image_size=list(img) if (img and k) else None, optimizer=opt, max_grad_norm=1.0, parallel=par,
             world_size=world, parallel_options=popt or {}, model=model or {}, seed=seed)
    if par.startswith("zero"):
        # LLaMA-Factory ds_z{2,3}_config.json with HF's "auto" values resolved (Trainer:
        # reduce_bucket_size = hidden^2, stage3_prefetch_bucket_size = 0.9 hidden^2,
        # stage3_param_persistence_threshold = 10 hidden)
        h = (model or {}).get("hidden") or FAMILY_HIDDEN.get(fam, 128)
        stage = int(par[-1])
        zo = {"stage": stage, "overlap_comm": False, "contiguous_gradients": True,
              "reduce_bucket_size": (popt or {}).get("reduce_bucket_size", h * h)}
        if stage < 3:
            zo.update(allgather_partitions=True, allgather_bucket_size=zo["reduce_bucket_size"], reduce_scatter=True,
                      round_robin_gradients=stage == 2)
        else:
            zo.update(sub_group_size=int(1e9), stage3_prefetch_bucket_size=int(0.9 * h * h),
                      stage3_param_persistence_threshold=10 * h, stage3_max_live_parameters=int(1e9),
                      stage3_max_reuse_distance=int(1e9))
        s["parallel_options"] = {"deepspeed": {
            "train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_allow_untested_optimizer": True, "bf16": {"enabled": prec == "bf16"},
            "zero_optimization": zo}}
        s["optimizer"] = "adamw_torch"
    if mode == "lora":
        s["lora"] = lora or {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "language-linear",
                             "on": "language"}
    if mode == "lora" and fam in ("mixtral", "qwen3_moe"):
        # PEFT 0.21 "all-linear" also wraps the fused 3-D expert weights (lora.ParamWrapper),
        # which refuses lora_dropout != 0
        s["lora"] = dict(s["lora"], lora_dropout=0.0)
    if mode == "lora" and par == "fsdp1":
        s["lora"] = dict(s["lora"], autocast_adapter_dtype=False)
    ga = ""
    if accum is not None:   # (grad_accum, sync_each_micro_batch); None: the keys stay out (older ids unchanged)
        s["grad_accum"], s["sync_each_micro_batch"] = int(accum[0]), bool(accum[1])
        ga = "ga%d%s-" % (accum[0], "sync" if accum[1] else "")
    if video is not None:   # Qwen-VL video frames per sample (feat_towers.py); None: the key stays out
        s["video_frames"] = int(video)
        ga += "video%d-" % int(video)
    if video_px is not None:  # a frame's own (min, max) pixels, qwen_vl_utils' VIDEO_MIN/MAX_PIXELS
        s["video_min_pixels"], s["video_max_pixels"] = int(video_px[0]), int(video_px[1])
        ga += "vpx%d-%d-" % (video_px[0], video_px[1])
    if vit_gc is not None:  # ms-swift vit_gradient_checkpointing (feat_towers.py); None: the key stays out
        s["vit_gradient_checkpointing"] = bool(vit_gc)
        ga += "vit%s-" % ("gc" if vit_gc else "nogc")
    key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 != "hf_class"}, sort_keys=True)
    s["id"] = "%s-%s-%s-%s-%s-%s-%s%s" % (fam, par, world, mode, prec, attn, ga,
                                         hashlib.sha1(key.encode()).hexdigest()[:10])
    return s


FAMILY_HIDDEN = {"llama": 256, "qwen2": 256, "mixtral": 128, "qwen3_moe": 128, "llava": 256, "gemma3": 64}

# per family: (model params, image sizes to draw from, visual budget)
FAM_GRID = {
    "llama": ({}, [None]),
    "qwen2": ({}, [None]),
    "mixtral": ({}, [None]),
    "qwen3_moe": ({}, [None]),
    "llava": ({"image": 112}, [(112, 112)]),
    "llava_onevision": ({}, [(56, 112), (112, 112), (84, 56)]),
    "qwen2_vl": ({}, [(112, 112), (112, 168), (224, 168)]),
    "qwen2_5_vl": ({}, [(224, 224), (112, 168), (336, 224)]),
    "qwen3_vl": ({}, [(128, 128), (128, 192), (256, 192)]),
    "qwen3_vl_moe": ({}, [(128, 128), (128, 192)]),
    "internvl": ({}, [(112, 112), (112, 224), (224, 224)]),
    "gemma3": ({}, [(64, 64), (128, 96)]),
    "mllama": ({}, [(56, 56), (56, 112), (112, 112)]),
    "idefics3": ({}, [(64, 64), (128, 96)]),
    "smolvlm": ({}, [(64, 64), (128, 128)]),
}


def config_list(count=None):
    rng = random.Random(20261123)
    fams = list(FAM_GRID)
    out = []
    seen = set()

    def add(s):
        if s["id"] not in seen:
            seen.add(s["id"])
            out.append(s)

    # single-process grid: family x mode x precision x attention x checkpointing, random sizes
    for rep in range(4):
        for fam in fams:
            mm = fam not in ("llama", "qwen2", "mixtral", "qwen3_moe")
            modes = MODES if mm else ("full", "lora")
            for mode in modes:
                prec = rng.choice(["bf16", "bf16", "fp32", "amp_bf16"])
                attn = rng.choice(["sdpa", "sdpa", "eager"])
                gc_ = rng.choice([False, False, {"use_reentrant": False, "every_n_layers": 1},
                                  {"use_reentrant": True, "every_n_layers": 1},
                                  {"use_reentrant": False, "every_n_layers": 2}])
                B = rng.choice([1, 2, 2, 4])
                k = rng.choice([1, 1, 2]) if mm else 0
                img = rng.choice(FAM_GRID[fam][1])
                S = rng.choice([128, 192, 256, 384])
                opt = rng.choice(["adamw_torch", "adamw_torch", "adamw_torch_fused"])
                lora = None
                if mode == "lora":
                    lora = {"r": rng.choice([8, 16]), "lora_alpha": 32, "lora_dropout": rng.choice([0.0, 0.05]),
                            "target_modules": "language-linear", "on": "language"}
                model = dict(FAM_GRID[fam][0])
                model["layers"] = rng.choice([2, 3]) if fam not in ("gemma3", "mllama") else None
                model = {a: b for a, b in model.items() if b is not None}
                add(make_setup(fam, mode, prec, attn, gc_, B, S, k, img, opt, "single", 1, model=model, lora=lora,
                               seed=rep))
    # parallel modes: 2 and 4 ranks
    pfams = ["llama", "llava", "qwen2_vl", "qwen2_5_vl", "internvl", "gemma3", "qwen3_moe", "idefics3", "mixtral",
             "llava_onevision", "qwen3_vl", "mllama", "smolvlm", "qwen2"]
    for rep in range(2):
        for i, fam in enumerate(pfams):
            mm = fam not in ("llama", "qwen2", "mixtral", "qwen3_moe")
            for par in ("ddp", "fsdp1", "fsdp2", "zero1", "zero2", "zero3"):
                world = rng.choice([2, 2, 4])
                mode = rng.choice(["finetune", "full", "lora"] if mm else ["full", "lora"])
                popt = {}
                prec = rng.choice(["bf16", "fp32"])
                if par == "fsdp1":
                    popt = {"use_orig_params": rng.choice([True, False]),
                            "mixed_precision": "bf16" if prec == "fp32" and rng.random() < 0.5 else None}
                    if not popt["use_orig_params"] and mode != "full":
                        mode = "full"       # flat params need uniform requires_grad (FSDP1 raises otherwise)
                elif par == "fsdp2":
                    popt = {"reshard_after_forward": rng.choice([True, False]),
                            "mixed_precision": "bf16" if prec == "fp32" and rng.random() < 0.5 else None}
                elif par == "ddp":
                    popt = {"bucket_cap_mb": 25, "gradient_as_bucket_view": rng.choice([False, True])}
                gc_ = rng.choice([False, {"use_reentrant": False, "every_n_layers": 1}])
                B = rng.choice([1, 2])
                k = 1 if mm else 0
                img = FAM_GRID[fam][1][0]
                S = rng.choice([128, 256])
                add(make_setup(fam, mode, prec, "sdpa", gc_, B, S, k, img, "adamw_torch", par, world, popt=popt,
                               seed=rep))
    # long sequences: > 3072 tokens per step (CUDA embedding backward's sort/segment path)
    for fam, B, S, prec in (("llama", 8, 512, "bf16"), ("qwen2", 4, 1024, "fp32"), ("llama", 4, 1024, "amp_bf16"),
                            ("qwen2", 8, 512, "bf16")):
        add(make_setup(fam, "full", prec, "sdpa", False, B, S, 0, None, "adamw_torch", "single", 1, seed=7))
    rng.shuffle(out)                    # interleave families and parallel modes (resumable runs)
    list(map(add, __import__("accum").accum_configs()))     # FSDP / DDP + gradient accumulation (accum.py)
    import feat_compile; [add(s) for s in feat_compile.all_setups()]  # torch.compile, op-level SAC (issue 23)
    list(map(add, __import__("grid2").wide_grid()))     # parallel mode x what trains x checkpointing (issue 22)
    list(map(add, __import__("fsdp1_frozen").configs()))   # FSDP1: frozen weights in a unit that trains
    import feat_keys; [add(s) for s in feat_keys.all_setups()]  # loss without the upcast (issue 23)
    list(map(add, __import__("feat_towers").all_setups()))  # per-tower checkpointing, Qwen-VL video (issue 23, feat_towers.py)
    import feat_liger; [add(s) for s in feat_liger.setups()]  # Liger RMSNorm/SwiGLU/RoPE, emulated (issue 23)
    import feat_lorahead; [add(s) for s in feat_lorahead.all_setups()]  # LoRA on lm_head / embed_tokens (issue 23)
    list(map(add, __import__("feat_wrap").all_setups()))   # FSDP1 + PEFT's fsdp_auto_wrap_policy (issue 23)
    list(map(add, __import__("tp").setups()))   # tensor parallelism, torchtitan's block plan (issue 23, tp.py)
    import feat_eager_ckpt; [add(s) for s in feat_eager_ckpt.setups()]  # LLaVA stage 1, eager + checkpointing (issue 21/22)
    list(map(add, __import__("pixtral").setups()))   # the Pixtral family (issue 23, tests/truth/pixtral.py)
    # first: the brief's reference config and the selftest's smoke configs
    import selftest_configs
    for s in reversed(selftest_configs.setups()):
        if s["id"] not in seen:
            seen.add(s["id"])
            out.insert(0, s)
    if count:
        out = out[:count]
    return out


# =========================================================== CLI
def cmd_run(a):
    src = a.setup
    setup = json.loads(src) if src.lstrip().startswith("{") else json.load(open(src))
    if "id" not in setup:
        raise SystemExit("setup needs an id (use `list` output)")
    row = run_setup(setup, trace=a.trace)
    if a.trace and "trace" in row:
        for line in row.pop("trace"):
            print(line, file=sys.stderr)
    print(json.dumps(row, sort_keys=True))


def cmd_list(a):
    for s in config_list(a.count):
        print(json.dumps(s, sort_keys=True))


def cmd_generate(a):
    done = set()
    if os.path.exists(a.out):
        with open(a.out) as f:
            for line in f:
                line = line.strip()
                if line:
                    done.add(json.loads(line)["id"])
    todo = [s for s in config_list(a.count) if s["id"] not in done
            and (not a.only or re.search(a.only, s["id"]))]
    if a.limit:
        todo = todo[:a.limit]
    print("truth: %d done, %d to run" % (len(done), len(todo)), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    fails = 0
    for i, s in enumerate(todo):
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "run", json.dumps(s)],
                               capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print("[%d/%d] %s TIMEOUT" % (i + 1, len(todo), s["id"]), flush=True)
            fails += 1
            continue
        if p.returncode != 0:
            fails += 1
            print("[%d/%d] %s FAILED rc=%d\n%s" % (i + 1, len(todo), s["id"], p.returncode, p.stderr[-3000:]),
                  flush=True)
            continue
        line = p.stdout.strip().splitlines()[-1]
        row = json.loads(line)
        with open(a.out, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        print("[%d/%d] %s peak %d (%s) %.1fs" % (i + 1, len(todo), s["id"], row["measured"]["peak_bytes"],
                                                  row["measured"]["peak_phase"], time.time() - t0), flush=True)
    print("truth: %d failed" % fails)
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("setup")
    r.add_argument("--trace", action="store_true")
    l_ = sub.add_parser("list")
    l_.add_argument("--count", type=int)
    g = sub.add_parser("generate")
    g.add_argument("--out", required=True)
    g.add_argument("--timeout", type=int, default=600)
    g.add_argument("--count", type=int)
    g.add_argument("--only")
    g.add_argument("--limit", type=int)
    a = ap.parse_args()
    return {"run": cmd_run, "list": cmd_list, "generate": cmd_generate}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
