#!/usr/bin/env python3
"""spec_keys.py - docs/spec-keys.md from the key tables the spec loader decodes with.

The loader is table driven (predictor/spec/spec_module.c, spec_parts.c, spec_train.c,
spec.c, spec_refs.c, family.c): every accepted key is one `keydesc` row with its
type, range, choices, the module kinds it applies to and whether it is required.
This script reads those rows, so the reference cannot list a key the loader
refuses or miss one it accepts; the meanings are the short texts below.

  spec_keys.py            print the page
  spec_keys.py --write    rewrite docs/spec-keys.md
  spec_keys.py --check    exit 1 if docs/spec-keys.md is not what --write would write
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "spec-keys.md")
SRC = ["spec.c", "spec_refs.c", "spec_module.c", "spec_parts.c", "spec_train.c", "spec_liger.c",
       "family.c"]

# what a key does, where its name does not say it all (section.key or key)
MEANING = {
    "family": "building-block preset the module starts from (its defaults); the keys below override it",
    "type": "the module's role; vit, mlp, llama are the 0.1 names (clip, mlp, llama families)",
    "trainable": "false: frozen (a frozen vision tower runs under no_grad, LLaVA's way)",
    "attention": "per-module override of training.attention",
    "num_key_value_heads": "GQA / MQA",
    "hidden_act": "MLP activation",
    "activation": "connector activation",
    "norm": "layernorm | rmsnorm (LLaMA) | gemma_rmsnorm (1 + w) | none",
    "sandwich_norm": "Gemma 2/3: a norm after attention and after the MLP too",
    "qkv": "separate q/k/v Linears or one fused qkv Linear (Qwen ViT, InternViT)",
    "attention_bias": "bias on q/k/v/o",
    "qkv_bias": "bias on q/k/v only (Qwen2)",
    "qk_norm": "RMSNorm on q and k: per head (Qwen3, Gemma 3) or over the full width (InternViT)",
    "layer_scale": "InternViT's learned per-channel residual scales",
    "mlp": "fc (Linear-act-Linear) | gated (SwiGLU/GeGLU: gate, up, down)",
    "softmax_fp32": "eager softmax in fp32 then cast back (most HF models)",
    "rope_fp32": "vision RoPE computed in fp32",
    "position_embedding": "none | learned | rope | mrope (Qwen2-VL 3-D) | rope2d | learned_rope2d",
    "embedding_rows": "rows of embed_tokens when it differs from vocab_size (resized tokenizers)",
    "scale_embeddings": "Gemma: embeddings times sqrt(hidden)",
    "sliding_window": "tokens a sliding-window layer attends to",
    "sliding_layers": "which decoder layers use the sliding window",
    "sliding_window_pattern": "every Nth layer is global (Gemma 3: 6)",
    "layer_types": "HF's per-layer list (full_attention / sliding_attention)",
    "image_merge": "how image features enter: masked_scatter (in place of placeholder tokens), "
                   "llava (concatenated, LLaVA-1.5), cross_attention (Mllama)",
    "bidirectional_images": "Gemma 3: image tokens attend to each other (a dense mask)",
    "num_experts": "MoE: routed experts per MoE layer (0 = dense)",
    "num_experts_per_tok": "MoE top-k",
    "lora_targets_experts": "LoRA's target_modules also adapt the experts' projections "
                            "(PEFT's all-linear does on Mixtral, not on Qwen3-VL-MoE's fused experts)",
    "moe_intermediate_size": "width of one expert",
    "shared_expert_intermediate_size": "Qwen2-MoE style shared expert (0 = none)",
    "dense_layers": "decoder layers that are dense, not MoE",
    "experts_implementation": "grouped_mm (one batched GEMM, transformers 5) | eager (a loop over experts)",
    "moe_imbalance": "tokens of the busiest expert relative to a uniform router (>= 1)",
    "output_router_logits": "router logits kept for the load-balancing loss",
    "cross_attention_layers": "Mllama: decoder layers that cross-attend to the image",
    "image_size": "input resolution the tower was trained at (fixed-size towers)",
    "temporal_patch_size": "Qwen-VL: frames per 3-D patch",
    "spatial_merge_size": "Qwen-VL: patches merged per side by the merger",
    "class_token": "a CLS token is prepended",
    "packed": "all images of the batch run as one packed sequence (Qwen-VL: cu_seqlens)",
    "select_layer": "image features = hidden_states[select_layer] (LLaVA: -2)",
    "feature_select": "default (CLS dropped) | full",
    "output_hidden_states": "the tower returns every hidden state (kept until it returns)",
    "feature_post_norm": "the selected features go through the post-layernorm",
    "window_size": "Qwen2.5-VL: window attention size in pixels",
    "fullatt_block_indexes": "Qwen2.5-VL: layers with full attention",
    "deepstack_visual_indexes": "Qwen3-VL: layers whose features are also merged into the decoder",
    "deepstack_trainable": "Qwen3-VL: whether the DeepStack mergers train with the connector "
                           "(Qwen's tune_mm_mlp trains visual.merger only)",
    "num_global_layers": "Mllama: global transformer layers after the local ones",
    "intermediate_layers_indices": "Mllama: local layers whose outputs are concatenated",
    "max_num_tiles": "Mllama: tiles per image",
    "aspect_ratio_ids": "Mllama: aspect-ratio embeddings",
    "pooling_head": "SigLIP's attention-pooling head (run, unused by VLMs)",
    "image_processor": "the processor that decides patches per image (map below)",
    "input_size": "connector input width (the vision hidden size, times merge_size^2 after a merge)",
    "num_layers": "Linears in the connector (mlp2x_gelu = 2)",
    "norm_after_merge": "the connector's norm comes after the patch merge",
    "merge_size": "pixel-shuffle / patch-merge factor per side",
    "pool_kernel": "Gemma 3: average-pool kernel",
    "image_newline": "LLaVA-OneVision: a learned newline token per row of the image grid",
    "quantization": "bitsandbytes weights (QLoRA): map below",
    "lora": "PEFT LoRA adapters on this module: map below",
    "lora.r": "rank",
    "lora.dropout": "0: PEFT uses nn.Identity (nothing saved)",
    "lora.target_modules": "list of Linear names (a decoder also lm_head, embed_tokens), or all-linear",
    "lora.autocast_adapter_dtype": "PEFT's default true: fp32 adapter weights on a 16-bit model "
                                   "(fp32 grads and states, the input cast to fp32)",
    "lora.modules_to_save": "[embed_tokens, lm_head]: trained full copies beside the frozen originals",
    "quantization.bits": "4 (nf4/fp4) or 8 (int8)",
    "quantization.block_size": "values per absmax block",
    "image_processor.kind": "fixed | dynamic (Qwen min/max_pixels) | tiles (InternVL) | "
                            "anyres (LLaVA-OneVision) | mllama | split (Idefics3) | "
                            "pixtral (own size, longest side <= longest_edge)",
    "image_processor.image_grid_pinpoints": "anyres: the candidate resolutions",
    "training.micro_batch_size": "samples per GPU per micro-step",
    "training.seq_len": "tokens per sample entering the language model, image tokens included",
    "training.image_size": "the worst-case image, [height, width] or one side",
    "training.video_frames": "frames of each video: a sample's `images_per_sample` are videos "
                             "of this many frames (Qwen-VL towers only, refused elsewhere)",
    "training.video_min_pixels": "a video frame's smart_resize lower bound (with video_frames); "
                                 "default: the image processor's min_pixels",
    "training.video_max_pixels": "a video frame's smart_resize upper bound (with video_frames); "
                                 "default: the image processor's max_pixels",
    "training.precision": "dtype of weights and activations",
    "training.master_weights": "fp32: fp32 weights under autocast, fp32 grads and states",
    "training.autocast": "torch.autocast around the forward (AMP)",
    "training.optimizer_impl": "foreach (torch CUDA default) | fused | for_loop",
    "training.zero_stage": "DeepSpeed ZeRO stage (0 = no DeepSpeed)",
    "training.data_parallel": "GPUs the model is replicated or sharded over "
                              "(the plugin replaces it by the job's GPU request)",
    "training.gradient_checkpointing": "true | false, or the map below",
    "training.loss": "standard (full logits) | chunked | fused_linear (Liger)",
    "training.logits_to_keep": "logits only for the last N tokens",
    "training.packing": "samples packed into one sequence (flash-attention varlen)",
    "training.use_cache": "a training forward without checkpointing fills a KV cache "
                          "(transformers' default true); false drops it",
    "training.max_grad_norm": "gradient clipping (0 = off): clip_grad_norm_'s 0-dim norm per "
                              "gradient, their stack and the clip coefficient before the step; "
                              "the Trainer of transformers >= 5 computes the norm even at 0; "
                              "DeepSpeed's in-engine clip: three 0-dim scales",
    "training.loss_upcast": "standard loss: true (default) = transformers' logits.float() before "
                            "cross_entropy; false = cross_entropy on the 16-bit logits (a custom "
                            "loop's nn.CrossEntropyLoss); refused under autocast and for the "
                            "chunked / fused losses",
    "framework.torch_version": "accepted for 2.11-2.13, the versions the model follows; others refused",
    "framework.deepspeed_version": "accepted for 0.19.x, the version the ZeRO layouts follow; others refused",
    "deepspeed.allgather_bucket_size": "elements; ZeRO-1/2 must be even (DeepSpeed asserts); "
                                       "allocates nothing: the updated partitions are "
                                       "all-gathered in place (all_gather_into_tensor)",
    "deepspeed.pin_memory": "offload_optimizer buffers pinned: the host prediction rounds each "
                            "pinned buffer up to a power of two (torch's CachingHostAllocator)",
    "fsdp.limit_all_gathers": "FSDP1 only, true only (the rate limiter the model follows); "
                              "false has no bound and is refused",
    "fsdp.buffer_dtype": "refused: buffers are not counted (one 512-byte block each in any "
                         "dtype), so no value could change the prediction",
    "fsdp.sync_each_micro_batch": "with gradient accumulation, reduce-scatter every micro-batch "
                                  "(torchtune, HF sync_each_batch); false: the HF "
                                  "Trainer / Accelerate way, no_sync until the last one, the "
                                  "unsharded gradients alive in between (docs/parallel.md)",
    "fsdp.wrap_policy": "the FSDP units: transformer_layer (one per _no_split_modules layer), "
                        "peft_lora (PEFT's fsdp_auto_wrap_policy, FSDP1), size (torch's "
                        "size_based_auto_wrap_policy with min_num_params, FSDP1, a text decoder; "
                        "docs/parallel.md)",
    "fsdp.min_num_params": "wrap_policy size only (required there): the parameters a module's "
                           "not-yet-wrapped subtree must reach to be a unit",
    "training.activation_offloading": "forward saves of >= 1 KiB wait on the host "
                                      "(torchtune / TRL activation offloading)",
    "training.torch_compile": "torch.compile(model), inductor, default mode: the eager prediction as a "
                              "bound (the prediction says so), also under FSDP2 (compiled per block, "
                              "as torchtitan does); refused with a vision tower, DDP, ZeRO, FSDP1 or "
                              "selective_op checkpointing (docs/oracle.md)",
    "training.liger_kernel": "Liger-Kernel (HF use_liger_kernel / liger_kernel_config): true = the "
                             "apply function's defaults, or the map below; Llama, Qwen2, LLaVA "
                             "over either, Qwen2-VL, Qwen2.5-VL and Gemma 3; refused elsewhere with the reason",
    "liger_kernel.rope": "LigerRopeFunction: q and k rotated in place, only cos / sin saved; Qwen-VL's "
                         "M-RoPE swap names a function transformers 5.17 no longer calls: no change",
    "liger_kernel.rms_norm": "LigerRMSNormFunction on the decoder's norms (and Qwen2.5-VL's vision "
                             "blocks', Gemma 3's q/k, sandwich and projector norms): saves its input "
                             "and one fp32 rstd per row, dX written over dY (Gemma: a new dX), "
                             "(132, hidden) fp32 dW partials",
    "liger_kernel.swiglu": "LigerSiLUMulFunction: saves gate and up only (no silu product), their "
                           "gradients written over them",
    "liger_kernel.fused_linear_cross_entropy": "the loss becomes loss: fused_linear (no logits; "
                                               "a conflicting training.loss is refused)",
    "liger_kernel.cross_entropy": "true refused: Liger's non-fused cross-entropy is not modelled",
    "liger_kernel.layer_norm": "Qwen2-VL, Gemma 3 (default true): LigerLayerNormFunction on the "
                               "vision blocks' LayerNorms (Mean / RSTD in X's dtype, (132, H) fp32 "
                               "dW / dB partials); true refused elsewhere (Liger drops it)",
    "liger_kernel.geglu": "Gemma 3 (default true): LigerGELUMulFunction, gate and up saved (no "
                          "gelu product), their gradients written over them; true refused elsewhere",
    "training.tensor_parallel": "torch.distributed.tensor.parallel degree (torchtitan's block "
                                "plan: q/k/v/gate/up colwise, o/down rowwise), one TP group per "
                                "rank set, no data parallel beside it; refused with ZeRO, FSDP, "
                                "LoRA, autocast, compile, VLM towers, MoE (docs/parallel.md)",
    "training.sequence_parallel": "with tensor_parallel: torchtitan's SequenceParallel norms "
                                  "and residuals at tokens/tp, the all-gathers / reduce-scatters "
                                  "around attention, MLP, embedding and lm_head, vocabulary-"
                                  "sharded embedding / lm_head and loss_parallel; sdpa, the "
                                  "standard fp32 loss, untied divisible vocabulary",
    "training.optimizer_in_backward": "the step runs per parameter inside backward "
                                      "(no full set of gradients)",
    "gradient_checkpointing.use_reentrant": "default: false with transformers >= 5, else true",
    "gradient_checkpointing.every_n_layers": "checkpoint one layer in N",
    "gradient_checkpointing.granularity": "full layer; selective_op: torchtitan's op policy (every "
                                          "other mm output and the SDPA kernel's outputs kept, the rest "
                                          "recomputed; needs use_reentrant false); attention / mlp: refused",
    "gradient_checkpointing.offload": "checkpointed inputs kept on the host",
    "deepspeed.reduce_bucket_size": "elements; 0 = auto = decoder hidden^2",
    "deepspeed.stage3_prefetch_bucket_size": "0 = auto (0.9 hidden^2)",
    "deepspeed.stage3_param_persistence_threshold": "0 = auto (10 x hidden): smaller tensors stay whole",
    "deepspeed.sub_group_size": "stage 3: elements per optimizer sub-group",
    "deepspeed.round_robin_gradients": "stage 2: tensors reordered round-robin before partitioning",
    "ddp.gradient_as_bucket_view": "true: .grad are views of the buckets (one copy, not two)",
    "ddp.find_unused_parameters": "default: not gradient_checkpointing (the Trainer's); "
                                  "true clones the outputs",
    "fsdp.version": "1 (FullyShardedDataParallel) | 2 (fully_shard)",
    "fsdp.model_dtype": "the dtype the model is sharded in",
    "fsdp.param_dtype": "MixedPrecision gather/compute dtype",
    "fsdp.reshard_after_forward": "FSDP2 (FSDP1: sharding_strategy)",
    "device.cuda_context": "CUDA context and kernel images: nvidia-smi beyond the reserved bytes "
                           "(default 771 MiB, measured on H100)",
    "device.nccl": "NCCL buffers when data_parallel > 1 (default 1 GiB, not measured)",
    "device.allocator_fixed": "extra slack on top of the allocator model",
    "device.allocator_fraction": "extra slack, a fraction of allocated",
    "device.alloc_conf": "the job's PYTORCH_CUDA_ALLOC_CONF (docs/allocator.md)",
    "device.cublas_workspace": "one cuBLAS handle's workspace, held twice (forward thread and "
                               "autograd) in the caching allocator for the whole job (default "
                               "32 MiB, sm90; other GPUs 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 B; "
                               "0 = none)",
    "framework.transformers_version": "changes the loss, checkpointing and attention defaults",
    "hf_config": "a model directory or config.json: imported (mmguard import) under the spec's own keys",
    "trainer": "HF TrainingArguments (YAML/JSON) to import",
    "llamafactory": "a LLaMA-Factory training YAML to import",
    "deepspeed": "a DeepSpeed JSON config path, or the section itself",
}

# Keys the loader accepts that nothing past the loader reads (found by unread_keys()
# below): each says so on the page.  --check fails when a key is unread and not
# listed here (a new key accepted and ignored), or listed and read after all.
UNREAD = {}

KINDS = {"V": "vision", "C": "connector", "D": "decoder"}
ENUM_TYPES = []


def read(name):
    with open(os.path.join(ROOT, "predictor", "spec", name)) as f:
        return f.read()


def enums(text):
    out = {}
    for m in re.finditer(r"static const char \*const (\w+)\[\] = \{(.*?)\};", text, re.S):
        out[m.group(1)] = [v for v in re.findall(r'"([^"]*)"', m.group(2))]
    return out


def num(s):
    s = s.strip().replace("ull", "").replace("u", "")
    s = s.replace("MM_MAX_LAYERS", "4096")
    try:
        v = eval(s, {"__builtins__": {}})
    except Exception:
        return s
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v


def fmt_num(v):
    if isinstance(v, float) and v >= 1e6:
        return ("%.0e" % v).replace("e+", "e")
    if isinstance(v, int) and v >= 1 << 16:
        for p in range(60, 9, -1):
            if v == 1 << p:
                return "2^%d" % p
        if v % 10 ** 9 == 0:
            return "%de%d" % (v // 10 ** 9, 9) if v // 10 ** 9 < 10 else "%g" % v
    return str(v)


ROW = re.compile(r'\{"(\w+)",\s*(K_\w+),\s*([^,]*(?:\([^)]*\))?),\s*([^,]+),\s*([^,]+),\s*(\w+),'
                 r'\s*([A-Z0-9| ]+),\s*(\d),\s*(\d)\}', re.S)


def table(text, name, ens):
    m = re.search(r"static const keydesc %s\[\] = \{(.*?)\n\};" % name, text, re.S)
    rows = []
    for r in ROW.finditer(m.group(1)):
        key, kind, _off, lo, hi, en, kinds, req, _nver = r.groups()
        kinds = kinds.replace(" ", "")
        where = "all" if kinds in ("0", "ALL") else \
            ", ".join(KINDS[k] for k in kinds.split("|"))
        rows.append(dict(key=key, kind=kind, lo=num(lo), hi=num(hi),
                         enum=ens.get(en) if en != "NULL" else None, where=where,
                         req=req == "1", nver=int(_nver)))
    return rows


def unread_keys():
    """keys whose field nothing reads past the loader: no read of `->field` / `.field`
    (an assignment is not a read) in predictor/ outside the importers, the key-table
    row itself aside"""
    src = {}
    for layer in sorted(os.listdir(os.path.join(ROOT, "predictor"))):
        d = os.path.join(ROOT, "predictor", layer)
        if os.path.isdir(d) and layer != "import":
            for n in sorted(os.listdir(d)):
                if n.endswith(".c"):
                    src[os.path.join(layer, n)] = open(os.path.join(d, n)).read()
    row = re.compile(r'\{"(\w+)",\s*K_\w+,\s*\w+\(([\w.]+)\)[^}]*\}')
    out = set()
    for name in SRC:
        for m in row.finditer(src[os.path.join("spec", name)]):
            field = m.group(2).split(".")[-1]
            pat = re.compile(r"(->|\.)" + re.escape(field) + r"\b(?!\s*=[^=])")
            if not any(pat.search(t.replace(m.group(0), "")) for t in src.values()):
                out.add(m.group(1))
    return out


def describe(r):
    k = r["kind"]
    if k == "K_ENUM":
        return " \\| ".join("`%s`" % v for v in r["enum"])
    if k == "K_BOOL":
        return "bool"
    if k in ("K_UINT", "K_INT", "K_INT32", "K_FLOAT"):
        t = {"K_UINT": "integer", "K_INT": "integer", "K_INT32": "integer", "K_FLOAT": "number"}[k]
        return "%s %s..%s" % (t, fmt_num(r["lo"]), fmt_num(r["hi"]))
    if k == "K_LAYERS":
        return "list of layer indices"
    if k == "K_SIZE":
        return "size (`771MiB`, bytes)"
    if k == "K_STRING":
        return "string"
    if k == "K_VERSION":
        return "version string, %s parts" % ("3" if r["nver"] == 3 else "2")
    if k == "K_NAME":
        return "name (letters, digits, `_`, `-`)"
    if r["key"] == "type":
        return " \\| ".join("`%s`" % v for v in ENUM_TYPES)
    return "map, below" if r["key"] in ("lora", "quantization", "image_processor",
                                        "gradient_checkpointing", "liger_kernel") else "see meaning"


def merge_dups(rows):
    """a key listed once per module kind (intermediate_size, norm) becomes one row"""
    out = []
    for r in rows:
        same = [o for o in out if o["key"] == r["key"]]
        if same and describe(same[0]) == describe(r):
            if same[0]["req"] != r["req"]:
                same[0]["reqtext"] = "yes (%s)" % (same[0]["where"] if same[0]["req"] else r["where"])
            same[0]["where"] += ", " + r["where"]
            same[0]["req"] = same[0]["req"] or r["req"]
            continue
        out.append(r)
    return out


def section(title, rows, prefix, with_where=False):
    lines = ["## %s" % title, ""]
    if with_where:
        lines += ["| key | modules | type / values | required | meaning |", "|---|---|---|---|---|"]
    else:
        lines += ["| key | type / values | required | meaning |", "|---|---|---|---|"]
    for r in rows:
        mean = MEANING.get(prefix + r["key"], MEANING.get(r["key"], "")) if prefix != "" or \
            with_where else MEANING.get(r["key"], "")
        if prefix and (prefix + r["key"]) not in MEANING and r["key"] in MEANING and not with_where:
            mean = ""
        req = r.get("reqtext", "yes" if r["req"] else "")
        if r["key"] in UNREAD:
            mean = ((mean + ". ") if mean else "") + \
                "**Accepted, not read: no effect on the prediction** (%s)" % UNREAD[r["key"]]
        mean = mean.replace("|", "\\|")
        if with_where:
            lines.append("| `%s` | %s | %s | %s | %s |" % (r["key"], r["where"], describe(r), req,
                                                           mean))
        else:
            lines.append("| `%s` | %s | %s | %s |" % (r["key"], describe(r), req, mean))
    return lines + [""]


def page():
    txt = {n: read(n) for n in SRC}
    ens = {}
    for t in txt.values():
        ens.update(enums(t))
    ENUM_TYPES[:] = ens["type_names"]
    top = re.search(r"top_keys\[\] = \{(.*?)\};", txt["spec.c"], re.S).group(1)
    refs = re.search(r"ref_keys\[\] = \{(.*?)\};", txt["spec_refs.c"], re.S).group(1)
    fams = {}
    for name, kind in re.findall(r'\{"(\w+)", MOD_(\w+), "', txt["family.c"]):
        fams.setdefault(kind.lower(), []).append(name)
    out = ["# Spec keys: the reference", "",
           "<!-- generated by scripts/spec_keys.py from the loader's key tables "
           "(predictor/spec/spec*.c); `make spec-doc` rewrites it, `make check` compares -->", "",
           "Every key the spec loader accepts, with its type, range and where it applies; "
           "anything else is an error naming file, line and key. "
           "[spec-schema.md](spec-schema.md) shows them in an annotated example, "
           "[import.md](import.md) how `mmguard import` fills them from a model's `config.json`.", "",
           "## Top level", "",
           "Sections: " + ", ".join("`%s`" % k for k in re.findall(r'"(\w+)"', top)) +
           ". References to the user's own files (imported, then the spec's keys laid over them): " +
           ", ".join("`%s` (%s)" % (k, MEANING[k]) for k in re.findall(r'"(\w+)"', refs)) + ".", "",
           "## Module families", ""]
    for kind in ("vision", "connector", "decoder"):
        out.append("- %s: %s" % (kind, ", ".join("`%s`" % f for f in fams.get(kind, []))))
    out.append("")
    mod = merge_dups(table(txt["spec_module.c"], "module_keys", ens))
    out += section("modules[] (one entry per module)", mod, "", with_where=True)
    for title, src, name, pre in [
            ("modules[].lora", "spec_parts.c", "lora_keys", "lora."),
            ("modules[].quantization", "spec_parts.c", "quant_keys", "quantization."),
            ("modules[].image_processor (vision)", "spec_parts.c", "img_keys", "image_processor."),
            ("training", "spec_train.c", "training_keys", "training."),
            ("training.gradient_checkpointing (a map, or true / false)", "spec_train.c",
             "ckpt_keys", "gradient_checkpointing."),
            ("training.liger_kernel (a map, or true / false)", "spec_liger.c", "liger_keys",
             "liger_kernel."),
            ("framework", "spec_train.c", "framework_keys", "framework."),
            ("deepspeed (with training.zero_stage 1..3)", "spec_train.c", "deepspeed_keys",
             "deepspeed."),
            ("ddp (zero_stage 0, no fsdp)", "spec_train.c", "ddp_keys", "ddp."),
            ("fsdp (zero_stage 0)", "spec_train.c", "fsdp_keys", "fsdp."),
            ("device", "spec_train.c", "device_keys", "device.")]:
        out += section(title, table(txt[src], name, ens), pre)
    return "\n".join(out).rstrip() + "\n"


def main():
    text = page()
    if "--write" in sys.argv:
        with open(DOC, "w") as f:
            f.write(text)
    elif "--check" in sys.argv:
        try:
            cur = open(DOC).read()
        except OSError:
            cur = ""
        if cur != text:
            print("FAIL: docs/spec-keys.md is stale: `make spec-doc` rewrites it")
            return 1
        got = unread_keys()
        if got != set(UNREAD):
            for k in sorted(got - set(UNREAD)):
                print("FAIL: key '%s' is accepted but nothing reads it: model it, refuse it, "
                      "or list it in UNREAD with the reason" % k)
            for k in sorted(set(UNREAD) - got):
                print("FAIL: key '%s' is read now: take it out of UNREAD" % k)
            return 1
        print("spec-doc: docs/spec-keys.md matches the key tables")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
