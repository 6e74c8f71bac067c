"""Pure-Python core of the mmguard calibration harness (no torch, no transformers).

Why this module exists: everything that can be checked without a GPU lives here so the
CPU test suite (tests/calibrate) covers it: the measurement grid, the mmguard spec that
describes each grid point exactly, the JSON-lines record format, resuming, and the
"dominated by an OOM" skipping rule.  calibrate.py (GPU worker), compare.py and fit.py
all import it.
"""

import json
import os
import re
import time

RECORD_SCHEMA = "mmguard-calib/1"

# Statuses that are final: a resumed run never measures such a config again.
FINAL_STATUSES = ("ok", "oom", "skipped", "unavailable")

# ---------------------------------------------------------------------------
# Geometries (public model configs; see shared/memory-reference.md)
# ---------------------------------------------------------------------------

CLIP_VIT_L_336 = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "image_size": 336,
    "patch_size": 14,
    "num_channels": 3,
    "select_layer": -2,
    "hidden_act": "quick_gelu",
}

LLMS = {
    # Vicuna-7B v1.5 (LLaMA-2-7B geometry): 6,738,415,616 parameters
    "vicuna-7b": {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
    },
    # Vicuna-13B v1.5
    "vicuna-13b": {
        "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
        "num_key_value_heads": 40, "intermediate_size": 13824, "vocab_size": 32000,
    },
    # TinyLlama-1.1B geometry: grouped-query attention (4 KV heads)
    "tinyllama-1.1b": {
        "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32,
        "num_key_value_heads": 4, "intermediate_size": 5632, "vocab_size": 32000,
    },
    # meta-llama/Llama-3.2-1B: GQA (8 KV heads), 128k vocabulary, tied embeddings
    "llama3.2-1b": {
        "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
        "head_dim": 64, "tie_word_embeddings": True,
    },
    # the Qwen2 decoder of Qwen/Qwen2-VL-2B-Instruct (q/k/v bias, tied embeddings)
    "qwen2-1.5b": {
        "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "intermediate_size": 8960, "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    # the Qwen2 decoder of Qwen/Qwen2-VL-7B-Instruct and Qwen/Qwen2.5-VL-7B-Instruct
    "qwen2-7b": {
        "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
    },
}

# Vision towers of the Qwen-VL families (their config.json "vision_config"); the
# output width (hidden_size / out_hidden_size) is the LLM's hidden size.
QWEN2VL_VIT = {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
               "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
               "hidden_act": "quick_gelu"}
QWEN25VL_VIT = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                "hidden_act": "silu"}

MODELS = ("llava", "llama", "qwen2vl", "qwen25vl")
QWEN_MODELS = ("qwen2vl", "qwen25vl")

LORA_LLAVA = {
    "r": 128, "alpha": 256, "dropout": 0.05,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}

MODES = ("pretrain", "finetune", "lora", "full")
ATTENTIONS = ("eager", "sdpa", "flash")


def image_tokens(vit):
    """Image tokens one image contributes to the LLM sequence (CLS dropped)."""
    return (vit["image_size"] // vit["patch_size"]) ** 2


def qwen_image_tokens(grid):
    """Qwen-VL: an image of grid (h, w) patches of 14 px becomes h*w/4 LLM tokens (2x2
    merger); the ViT itself runs on all h*w patches."""
    h, w = grid
    return (h // 2) * (w // 2)


# ---------------------------------------------------------------------------
# Grid
# ---------------------------------------------------------------------------

class Group:
    """Configs sharing one model instance (one worker process on the GPU).

    Within a group only micro-batch, sequence length and checkpointing change, so
    the model is built once; mode, attention, geometry and optimizer are fixed."""

    def __init__(self, name, model, llm, mode, attention, points, llm_layers=None,
                 optimizer_impl="foreach", lora=None, priority=0, note="",
                 image_grid=None, trace=False, alloc_conf=None):
        if model not in MODELS:
            raise ValueError("model must be one of %s" % ", ".join(MODELS))
        if mode not in MODES:
            raise ValueError("bad mode %r" % mode)
        if attention not in ATTENTIONS:
            raise ValueError("bad attention %r" % attention)
        if model == "llama" and mode in ("pretrain", "full"):
            raise ValueError("text-only llama supports finetune and lora only")
        if mode == "lora" and lora is None:
            lora = dict(LORA_LLAVA)
        self.name = name
        self.model = model
        self.llm = llm
        self.llm_layers = llm_layers
        self.mode = mode
        self.attention = attention
        self.optimizer_impl = optimizer_impl
        self.lora = lora if mode == "lora" else None
        self.points = list(points)  # (micro_batch, seq_len, checkpointing)
        self.priority = priority
        self.note = note
        # Qwen-VL: the image's patch grid (h, w), 14 px patches; 48x48 = 672 px square
        self.image_grid = tuple(image_grid) if image_grid else (
            (48, 48) if model in ("qwen2vl", "qwen25vl") else None)
        # record the caching allocator's own trace (torch.cuda.memory._record_memory_history)
        # from before the first CUDA allocation of the worker
        self.trace = bool(trace)
        # PYTORCH_CUDA_ALLOC_CONF for this group's worker (None: the environment's)
        self.alloc_conf = alloc_conf

    def image_tokens(self):
        """LLM tokens of the one image per sample (0 for text-only)."""
        if self.model == "llava":
            return image_tokens(CLIP_VIT_L_336)
        if self.model in ("qwen2vl", "qwen25vl"):
            return qwen_image_tokens(self.image_grid)
        return 0

    def llm_geometry(self):
        g = dict(LLMS[self.llm])
        if self.llm_layers is not None:
            g["num_hidden_layers"] = self.llm_layers
        return g

    def configs(self):
        out = []
        for order, (mbs, seq, ckpt) in enumerate(self.points):
            out.append(Config(self, mbs, seq, bool(ckpt), order))
        return out

    def to_dict(self):
        return {
            "name": self.name, "model": self.model, "llm": self.llm,
            "llm_layers": self.llm_layers, "mode": self.mode, "attention": self.attention,
            "optimizer_impl": self.optimizer_impl, "lora": self.lora,
            "points": [list(p) for p in self.points], "priority": self.priority,
            "note": self.note, "image_grid": list(self.image_grid) if self.image_grid else None,
            "trace": self.trace, "alloc_conf": self.alloc_conf,
        }

    @classmethod
    def from_dict(cls, d):
        return cls(d["name"], d["model"], d["llm"], d["mode"], d["attention"],
                   [tuple(p) for p in d["points"]], llm_layers=d.get("llm_layers"),
                   optimizer_impl=d.get("optimizer_impl", "foreach"), lora=d.get("lora"),
                   priority=d.get("priority", 0), note=d.get("note", ""),
                   image_grid=d.get("image_grid"), trace=d.get("trace", False),
                   alloc_conf=d.get("alloc_conf"))


class Config:
    """One grid point: a group plus (micro_batch, seq_len, checkpointing)."""

    def __init__(self, group, micro_batch, seq_len, checkpointing, order=0):
        self.group = group
        self.micro_batch = int(micro_batch)
        self.seq_len = int(seq_len)
        self.checkpointing = bool(checkpointing)
        self.order = order
        if self.micro_batch < 1 or self.seq_len < 1:
            raise ValueError("micro_batch and seq_len must be >= 1")
        n_img = group.image_tokens()
        if n_img and self.seq_len <= n_img + 2:
            raise ValueError("%s: seq_len %d leaves no text tokens next to %d image tokens"
                             % (group.name, self.seq_len, n_img))

    @property
    def id(self):
        return "%s-b%d-s%d-ck%d" % (self.group.name, self.micro_batch, self.seq_len,
                                    1 if self.checkpointing else 0)

    def harness_dict(self):
        """What the harness does for this point (besides the spec)."""
        d = self.group.to_dict()
        del d["points"]
        d.update({"group": self.group.name, "micro_batch": self.micro_batch,
                  "seq_len": self.seq_len, "checkpointing": self.checkpointing,
                  "precision": "bf16", "optimizer": "adamw", "steps": 2,
                  "measured_step": 2, "image_tokens": self.group.image_tokens()})
        return d

    def dominates(self, other):
        """True if `self` needs at least as much memory as `other` for sure:
        same group and checkpointing, micro-batch and sequence not smaller."""
        return (self.group.name == other.group.name
                and self.checkpointing == other.checkpointing
                and self.micro_batch >= other.micro_batch
                and self.seq_len >= other.seq_len)

    def tokens(self):
        return self.micro_batch * self.seq_len


def llm_param_count(g):
    h, i, v, L = g["hidden_size"], g["intermediate_size"], g["vocab_size"], g["num_hidden_layers"]
    heads = g["num_attention_heads"]
    kv = g.get("num_key_value_heads", heads)
    hd = g.get("head_dim", h // heads)
    layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * i + 2 * h
    return (1 if g.get("tie_word_embeddings") else 2) * v * h + L * layer + h


def estimate_seconds(cfg, tflops=350.0):
    """Rough wall time of one config (two steps) on an H100; used for planning only."""
    g = cfg.group.llm_geometry()
    n = llm_param_count(g)
    trainable_llm = cfg.group.mode in ("finetune", "full")
    flops_per_tok = n * (6.0 if trainable_llm else 4.0)
    if cfg.checkpointing:
        flops_per_tok += 2.0 * n
    t = 2 * cfg.tokens() * flops_per_tok / (tflops * 1e12)
    if cfg.group.attention == "eager":
        t *= 1.4
    if cfg.group.trace:
        t *= 1.3  # recording every allocation, then the snapshot and its conversion
    return 3.0 + t


def estimate_build_seconds(group):
    n = llm_param_count(group.llm_geometry())
    return 15.0 + n / 1e9 * 3.0  # python/transformers import + random init on the GPU


QWEN_LORA = {"r": 64, "alpha": 128, "dropout": 0.05,
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj"]}


def trace_groups():
    """One config each, in a fresh worker that records every allocation from before the
    first CUDA call: the fixtures the allocator-model replay test reproduces."""
    T, F = True, False
    return [
        Group("trace-llava7b-pretrain", "llava", "vicuna-7b", "pretrain", "sdpa",
              [(4, 1024, F)], trace=True, priority=1, note="allocator trace"),
        Group("trace-llava7b-lora", "llava", "vicuna-7b", "lora", "sdpa",
              [(4, 1024, T)], trace=True, priority=2, note="allocator trace, PEFT LoRA"),
        Group("trace-llama1b-finetune", "llama", "llama3.2-1b", "finetune", "sdpa",
              [(4, 2048, F)], trace=True, priority=3, note="allocator trace, full FT"),
        Group("trace-qwen2vl2b-finetune", "qwen2vl", "qwen2-1.5b", "finetune", "sdpa",
              [(2, 2048, T)], trace=True, priority=4, note="allocator trace, Qwen2-VL"),
        Group("trace-llava7b-pretrain-expseg", "llava", "vicuna-7b", "pretrain", "sdpa",
              [(4, 1024, F)], trace=True, alloc_conf="expandable_segments:True",
              priority=5, note="allocator trace, expandable segments"),
        Group("trace-llava7b-finetune", "llava", "vicuna-7b", "finetune", "sdpa",
              [(1, 1024, F)], trace=True, priority=6,
              note="allocator trace, 7B full fine-tune near the 80 GB limit"),
        Group("trace-qwen25vl7b-lora", "qwen25vl", "qwen2-7b", "lora", "sdpa",
              [(2, 2048, T)], lora=dict(QWEN_LORA), trace=True, priority=7,
              note="allocator trace, Qwen2.5-VL window attention"),
        Group("trace-llava7b-pretrain-maxsplit", "llava", "vicuna-7b", "pretrain", "sdpa",
              [(4, 1024, F)], trace=True, alloc_conf="max_split_size_mb:128",
              priority=8, note="allocator trace, max_split_size_mb"),
        Group("trace-llava7b-pretrain-rup4", "llava", "vicuna-7b", "pretrain", "sdpa",
              [(4, 1024, F)], trace=True, alloc_conf="roundup_power2_divisions:4",
              priority=9, note="allocator trace, roundup_power2_divisions"),
        Group("trace-qwen25vl7b-lora-gc", "qwen25vl", "qwen2-7b", "lora", "sdpa",
              [(2, 2048, F)], lora=dict(QWEN_LORA), trace=True,
              alloc_conf="garbage_collection_threshold:0.6", priority=9.5,
              note="allocator trace, garbage collection above 60 % of the GPU"),
    ]


def default_grid():
    """Ordered most informative first: the allocator traces, LLaVA-1.5-7B in the stages
    that fit one 80 GB GPU, Qwen2.5-VL-7B LoRA/frozen, Qwen2-VL-2B and Llama-3.2-1B full
    fine-tunes, then attention variants and other sizes."""
    T, F = True, False
    groups = trace_groups() + [
        Group("llava7b-pretrain-sdpa", "llava", "vicuna-7b", "pretrain", "sdpa",
              [(16, 2048, T), (4, 2048, T), (1, 1024, T), (8, 768, T),
               (1, 2048, F), (4, 1024, F), (8, 768, F), (2, 2048, F), (16, 1024, F)],
              priority=10, note="LLaVA-1.5-7B stage 1 (projector only)"),
        Group("llava7b-lora-sdpa", "llava", "vicuna-7b", "lora", "sdpa",
              [(16, 2048, T), (4, 2048, T), (1, 1024, T),
               (1, 2048, F), (4, 1024, F), (2, 2048, F), (8, 2048, F)],
              priority=11, note="LLaVA-1.5-7B LoRA r128 (finetune_lora.sh)"),
        Group("qwen25vl7b-lora-sdpa", "qwen25vl", "qwen2-7b", "lora", "sdpa",
              [(8, 2048, T), (2, 4096, T), (1, 1024, F), (2, 2048, F), (4, 1024, F)],
              lora=dict(QWEN_LORA), priority=12,
              note="Qwen2.5-VL-7B LoRA r64 on the LLM, ViT frozen, merger trained"),
        Group("qwen25vl7b-pretrain-sdpa", "qwen25vl", "qwen2-7b", "pretrain", "sdpa",
              [(8, 2048, T), (1, 2048, F), (4, 1024, F)],
              priority=13, note="Qwen2.5-VL-7B, ViT and LLM frozen, merger trained"),
        Group("qwen2vl2b-finetune-sdpa", "qwen2vl", "qwen2-1.5b", "finetune", "sdpa",
              [(8, 2048, T), (2, 4096, T), (1, 2048, F), (4, 1024, F), (4, 2048, F)],
              priority=14, note="Qwen2-VL-2B full LLM fine-tune, ViT frozen"),
        Group("llama1b-finetune-sdpa", "llama", "llama3.2-1b", "finetune", "sdpa",
              [(16, 2048, T), (4, 4096, T), (1, 2048, F), (4, 1024, F), (8, 2048, F)],
              priority=15, note="Llama-3.2-1B full fine-tune, 128k vocabulary, tied"),
        Group("llava7b-L8-finetune-sdpa", "llava", "vicuna-7b", "finetune", "sdpa",
              [(16, 2048, T), (8, 1024, T), (1, 768, T),
               (1, 2048, F), (4, 2048, F), (8, 1024, F), (16, 768, F), (16, 2048, F)],
              llm_layers=8, priority=16, note="full fine-tune, 7B geometry cut to 8 layers"),
        Group("llava7b-pretrain-eager", "llava", "vicuna-7b", "pretrain", "eager",
              [(4, 2048, T), (16, 1024, T), (1, 768, T), (1, 2048, F), (2, 1024, F)],
              priority=17, note="eager attention: s^2 scores"),
        Group("qwen2vl2b-finetune-eager", "qwen2vl", "qwen2-1.5b", "finetune", "eager",
              [(4, 2048, T), (1, 2048, F), (2, 1024, F)],
              priority=18, note="Qwen2-VL-2B, eager attention in ViT and LLM"),
        Group("llama1b-finetune-eager", "llama", "llama3.2-1b", "finetune", "eager",
              [(4, 2048, T), (1, 2048, F), (2, 1024, F)],
              priority=19, note="Llama-3.2-1B, eager attention"),
        Group("llava7b-finetune-sdpa", "llava", "vicuna-7b", "finetune", "sdpa",
              [(1, 2048, T), (2, 2048, T), (4, 2048, T), (1, 1024, F), (1, 2048, F)],
              priority=20, note="full 7B fine-tune: ~54 GB of states, near the limit"),
        Group("llama7b-L8-finetune-sdpa", "llama", "vicuna-7b", "finetune", "sdpa",
              [(16, 2048, T), (4, 1024, T), (1, 2048, F), (4, 2048, F), (8, 512, F)],
              llm_layers=8, priority=21, note="LlamaForCausalLM alone (text only)"),
        Group("llava-tiny-finetune-sdpa", "llava", "tinyllama-1.1b", "finetune", "sdpa",
              [(16, 2048, T), (4, 1024, T), (1, 2048, F), (4, 2048, F), (16, 768, F)],
              priority=22, note="smaller LLM with GQA"),
        Group("llava-tiny-full-sdpa", "llava", "tinyllama-1.1b", "full", "sdpa",
              [(8, 2048, T), (2, 1024, F), (16, 768, F)],
              priority=23, note="vision tower trainable too"),
        Group("llama-tiny-lora-sdpa", "llama", "tinyllama-1.1b", "lora", "sdpa",
              [(16, 2048, T), (4, 2048, F), (16, 1024, F)],
              lora={"r": 64, "alpha": 16, "dropout": 0.0,
                    "target_modules": ["q_proj", "v_proj"]},
              priority=24, note="text-only LoRA, no dropout, 2 targets"),
        Group("llava7b-L8-finetune-sdpa-fused", "llava", "vicuna-7b", "finetune", "sdpa",
              [(8, 2048, T), (4, 1024, F)], llm_layers=8, optimizer_impl="fused",
              priority=25, note="fused AdamW"),
        Group("llava7b-pretrain-flash", "llava", "vicuna-7b", "pretrain", "flash",
              [(16, 2048, T), (4, 2048, T), (1, 2048, F), (4, 1024, F)],
              priority=26, note="FlashAttention-2 where installed"),
        Group("llava13b-pretrain-sdpa", "llava", "vicuna-13b", "pretrain", "sdpa",
              [(16, 2048, T), (4, 2048, T), (1, 2048, F)],
              priority=27, note="LLaVA-1.5-13B stage 1"),
        Group("qwen25vl7b-lora-img1008", "qwen25vl", "qwen2-7b", "lora", "sdpa",
              [(2, 2048, T), (1, 4096, F)], lora=dict(QWEN_LORA), image_grid=(72, 72),
              priority=28, note="Qwen2.5-VL-7B, 1008 px image: 5184 ViT patches"),
        Group("llava7b-lora-nodrop-sdpa", "llava", "vicuna-7b", "lora", "sdpa",
              [(4, 2048, T), (4, 1024, F)],
              lora=dict(LORA_LLAVA, dropout=0.0), priority=29,
              note="LoRA dropout 0: PEFT's nn.Identity saves no dropout mask"),
        Group("qwen2vl2b-full-sdpa", "qwen2vl", "qwen2-1.5b", "full", "sdpa",
              [(4, 2048, T), (2, 1024, F)], priority=30,
              note="Qwen2-VL-2B, ViT trainable too"),
    ]
    return groups


def smoke_grid():
    """Two tiny-LLM groups: checks the harness end to end in about a minute."""
    return [
        Group("llava-tiny-pretrain-sdpa", "llava", "tinyllama-1.1b", "pretrain", "sdpa",
              [(2, 1024, T_) for T_ in (True, False)], priority=1),
        Group("llama-tiny-lora-sdpa", "llama", "tinyllama-1.1b", "lora", "sdpa",
              [(2, 512, True), (2, 512, False)],
              lora={"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
              priority=2),
    ]


def capacity_groups():
    """Issue 21's capacity sweeps (contrib/calibrate/capacity.py): small enough that eight
    run side by side on one GPU, each once uncapped with its allocator trace, then under
    torch.cuda.set_per_process_memory_fraction at capacities around its boundary.  Dense,
    LoRA and ViT+LLM, with and without checkpointing, with and without expandable
    segments.  Plus the LLaVA-7B eager + checkpointing traces (uncapped only) whose
    device-level misses the H100 grid could not explain."""
    T, F = True, False
    tiny = "tinyllama-1.1b"
    lora = {"r": 16, "alpha": 32, "dropout": 0.05,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                               "down_proj"]}
    exp = "expandable_segments:True"
    sweep = "capacity sweep"
    return [
        Group("cap-tinyllama-ft", "llama", tiny, "finetune", "sdpa", [(4, 1024, F)],
              llm_layers=8, trace=True, priority=1, note=sweep + ", dense full fine-tune"),
        Group("cap-tinyllama-ft-ck", "llama", tiny, "finetune", "sdpa", [(8, 2048, T)],
              llm_layers=8, trace=True, priority=2, note=sweep + ", dense, checkpointing"),
        Group("cap-tinyllama-lora-ck", "llama", tiny, "lora", "sdpa", [(8, 2048, T)],
              lora=dict(lora), trace=True, priority=3, note=sweep + ", PEFT LoRA, checkpointing"),
        Group("cap-llava-tiny-pretrain", "llava", tiny, "pretrain", "sdpa", [(4, 1024, F)],
              trace=True, priority=4, note=sweep + ", ViT+LLM, projector trains"),
        Group("cap-llava-tiny-ft-ck", "llava", tiny, "finetune", "sdpa", [(8, 2048, T)],
              llm_layers=8, trace=True, priority=5, note=sweep + ", ViT+LLM fine-tune, ckpt"),
        Group("cap-tinyllama-ft-expseg", "llama", tiny, "finetune", "sdpa", [(4, 1024, F)],
              llm_layers=8, trace=True, alloc_conf=exp, priority=6,
              note=sweep + ", dense, expandable segments"),
        Group("cap-llava-tiny-pretrain-expseg", "llava", tiny, "pretrain", "sdpa",
              [(4, 1024, F)], trace=True, alloc_conf=exp, priority=7,
              note=sweep + ", ViT+LLM, expandable segments"),
        Group("cap-tinyllama-ft-maxsplit", "llama", tiny, "finetune", "sdpa", [(4, 1024, F)],
              llm_layers=8, trace=True, alloc_conf="max_split_size_mb:64", priority=7.1,
              note=sweep + ", dense, max_split_size_mb (release_available_cached_blocks)"),
        Group("cap-tinyllama-lora-ck-maxsplit", "llama", tiny, "lora", "sdpa", [(8, 2048, T)],
              lora=dict(lora), trace=True, alloc_conf="max_split_size_mb:128", priority=7.2,
              note=sweep + ", PEFT LoRA, checkpointing, max_split_size_mb"),
        Group("cap-tinyllama-ft-maxsplit-expseg", "llama", tiny, "finetune", "sdpa",
              [(4, 1024, F)], llm_layers=8, trace=True,
              alloc_conf="max_split_size_mb:64,expandable_segments:True", priority=7.15,
              note=sweep + ", dense, max_split_size_mb with expandable segments"),
        Group("cap-llava-tiny-pretrain-gc", "llava", tiny, "pretrain", "sdpa", [(4, 1024, F)],
              trace=True, alloc_conf="garbage_collection_threshold:0.7", priority=7.3,
              note=sweep + ", ViT+LLM, garbage collection (with a memory fraction)"),
        Group("trace-llava7b-pretrain-eager-ck", "llava", "vicuna-7b", "pretrain", "eager",
              [(4, 2048, T)], trace=True, priority=8,
              note="allocator trace, eager + checkpointing (H100 device-level miss -7.4 %)"),
        Group("trace-llava7b-pretrain-eager-ck16", "llava", "vicuna-7b", "pretrain", "eager",
              [(16, 1024, T)], trace=True, priority=9,
              note="allocator trace, eager + checkpointing (H100 device-level miss -13.4 %)"),
    ]


GRIDS = {"default": default_grid, "smoke": smoke_grid, "capacity": capacity_groups}


def all_configs(groups):
    out = []
    for g in sorted(groups, key=lambda g: g.priority):
        out.extend(g.configs())
    return out


def select_groups(groups, pattern=None):
    if not pattern:
        return groups
    rx = re.compile(pattern)
    return [g for g in groups if rx.search(g.name)]


# ---------------------------------------------------------------------------
# mmguard spec (docs/spec-schema.md)
# ---------------------------------------------------------------------------

def spec_for(cfg, framework=None, attention_used=None, use_reentrant="default"):
    """The mmguard spec (a dict, JSON-serialisable) that describes `cfg` exactly.

    framework: {"transformers_version": "5.17", "torch_version": "2.11"} once known.
    attention_used: {"language_model": impl, "vision_tower": impl} as the run used it
    (spec names eager|sdpa|flash); a tower that differs from the training attention
    gets a per-module override.  use_reentrant: calibrate.py's --use-reentrant
    (default: the library's, which the spec's default follows too)."""
    g = cfg.group
    att = g.attention
    if attention_used and attention_used.get("language_model"):
        att = attention_used["language_model"]
    v_att = (attention_used or {}).get("vision_tower")
    modules = []
    if g.model == "llava":
        modules = llava_tower_modules(g)
    elif g.model in QWEN_MODELS:
        modules = qwen_tower_modules(g)
    if modules and v_att and v_att != att:
        modules[0]["attention"] = v_att
    modules.append(llm_module(g))
    training = {
        "micro_batch_size": cfg.micro_batch,
        "seq_len": cfg.seq_len,
        "images_per_sample": 1 if g.model != "llama" else 0,
        "precision": "bf16",
        "master_weights": "none",
        "optimizer": "adamw",
        "optimizer_impl": g.optimizer_impl,
        "zero_stage": 0,
        "data_parallel": 1,
        "gradient_accumulation_steps": 1,
        "gradient_checkpointing": cfg.checkpointing,
        "attention": att,
    }
    if cfg.checkpointing and use_reentrant in ("true", "false"):
        training["gradient_checkpointing"] = {"enabled": True,
                                              "use_reentrant": use_reentrant == "true"}
    if g.model in QWEN_MODELS:
        # calib_qwen.make_batch: one image of image_grid h x w patches of 14 px per sample
        p = QWEN_VIT[g.model]["patch_size"]
        training["image_size"] = [g.image_grid[0] * p, g.image_grid[1] * p]
    spec = {"name": cfg.id, "modules": modules, "training": training}
    if framework:
        spec["framework"] = {k: v for k, v in framework.items() if v}
    if cfg.group.alloc_conf:  # PYTORCH_CUDA_ALLOC_CONF the run used
        spec["device"] = {"alloc_conf": cfg.group.alloc_conf}
    return spec


def llava_tower_modules(g):
    """CLIP ViT-L/336 (frozen unless mode full; calibrate.py runs a frozen one under
    no_grad, as LLaVA does) and the 2-layer GELU projector (always trained)."""
    vit = {"name": "vision_tower", "type": "vit"}
    vit.update(CLIP_VIT_L_336)
    vit["trainable"] = g.mode == "full"
    proj = {"name": "projector", "type": "mlp", "input_size": CLIP_VIT_L_336["hidden_size"],
            "hidden_size": g.llm_geometry()["hidden_size"], "num_layers": 2,
            "activation": "gelu", "trainable": True}
    return [vit, proj]


QWEN_VIT = {"qwen2vl": QWEN2VL_VIT, "qwen25vl": QWEN25VL_VIT}


def qwen_tower_modules(g):
    """The Qwen2-VL / Qwen2.5-VL vision transformer as calib_qwen.build_config builds it
    (QWEN2VL_VIT / QWEN25VL_VIT) and its patch merger, which calibrate.py's part_of
    counts as the projector and set_trainable trains in every mode; the blocks train in
    mode full only.  The batch (calib_qwen.make_batch) hands the tower one image of
    image_grid h x w patches per sample, no image processor: min_pixels = max_pixels =
    the image's own pixels keeps smart_resize from changing it (h*w patches, h*w/4
    LLM tokens)."""
    v = QWEN_VIT[g.model]
    mlp = v["embed_dim"] * v["mlp_ratio"] if g.model == "qwen2vl" else v["intermediate_size"]
    width = v["embed_dim"] if g.model == "qwen2vl" else v["hidden_size"]
    pixels = g.image_grid[0] * g.image_grid[1] * v["patch_size"] ** 2
    vit = {"name": "vision_tower", "type": "vision",
           "family": "qwen2_vl" if g.model == "qwen2vl" else "qwen2_5_vl",
           "hidden_size": width, "num_hidden_layers": v["depth"],
           "num_attention_heads": v["num_heads"], "intermediate_size": mlp,
           "patch_size": v["patch_size"], "temporal_patch_size": v["temporal_patch_size"],
           "spatial_merge_size": v["spatial_merge_size"], "num_channels": 3,
           "hidden_act": v["hidden_act"],
           "image_processor": {"kind": "dynamic", "min_pixels": pixels, "max_pixels": pixels},
           "trainable": g.mode == "full"}
    if g.model == "qwen25vl":
        vit["window_size"] = v["window_size"]
        vit["fullatt_block_indexes"] = list(v["fullatt_block_indexes"])
    merger = {"name": "projector", "type": "connector",
              "family": "patch_merger" if g.model == "qwen2vl" else "patch_merger_rms",
              "input_size": width, "hidden_size": g.llm_geometry()["hidden_size"],
              "trainable": True}
    return [vit, merger]


def llm_module(g):
    """The language model: LlamaForCausalLM's decoder, or Qwen2-VL's (the Qwen2 decoder
    with multimodal RoPE); LoRA as calibrate.py's apply_lora gives it to PEFT."""
    if g.model in QWEN_MODELS:
        llm = {"name": "language_model", "type": "decoder", "family": "qwen2_vl",
               "hidden_act": "silu"}
    else:
        llm = {"name": "language_model", "type": "llama"}
    llm.update(g.llm_geometry())
    llm["tie_word_embeddings"] = bool(llm.get("tie_word_embeddings", False))
    llm["trainable"] = g.mode in ("finetune", "full")
    if g.mode == "lora":
        # target_modules only inside the language model (apply_lora's regex), never the
        # vision tower's own q/k/v or gate/up/down Linears
        llm["lora"] = {"r": g.lora["r"], "alpha": g.lora["alpha"],
                       "dropout": g.lora["dropout"],
                       "target_modules": list(g.lora["target_modules"]),
                       # calibrate.py passes get_peft_model(..., autocast_adapter_dtype=False):
                       # the adapters stay bf16 (LLaVA's train.py casts them to bf16 too)
                       "autocast_adapter_dtype": False}
    return llm


def spec_from_record(rec):
    """Rebuild the spec of a measurement recorded without one (the Qwen-VL rows measured
    before spec_for described them) from the record itself: its `config` (the group and
    the point), `build.attention_used`, and the versions in `env`.  Returns the spec;
    raises ValueError naming what the record lacks."""
    c = rec.get("config") or {}
    need = ("name", "model", "llm", "mode", "attention", "micro_batch", "seq_len",
            "checkpointing")
    missing = [k for k in need if k not in c]
    if missing:
        raise ValueError("config lacks %s" % ", ".join(missing))
    g = Group(c["name"], c["model"], c["llm"], c["mode"], c["attention"],
              [(c["micro_batch"], c["seq_len"], c["checkpointing"])],
              llm_layers=c.get("llm_layers"), optimizer_impl=c.get("optimizer_impl", "foreach"),
              lora=c.get("lora"), image_grid=c.get("image_grid"),
              alloc_conf=c.get("alloc_conf"))
    cfg = g.configs()[0]
    if cfg.id != rec.get("id"):
        raise ValueError("config gives id %s, the record says %s" % (cfg.id, rec.get("id")))
    return spec_for(cfg, framework=framework_of(rec.get("env")),
                    attention_used=(rec.get("build") or {}).get("attention_used"),
                    use_reentrant=c.get("use_reentrant", "default"))


def params_mismatch(rec_params, modules, trainable=True):
    """Where the predictor's parameter counts (`mmguard predict --json` modules[]:
    name, parameters_count, trainable_count) differ from the ones calibrate.py counted
    on the model that ran (record `params`: per spec module, LoRA adapters under
    <module>_lora).  Returns a list of "module: what" strings, empty when they agree.
    trainable=False compares totals only (the predictor counts as trainable what gets
    a gradient: a trainable CLIP tower's unused last layer is not)."""
    want = {}
    for key, v in (rec_params or {}).items():
        name = key[:-5] if key.endswith("_lora") else key
        w = want.setdefault(name, [0, 0])
        w[0] += int(v.get("total", 0))
        w[1] += int(v.get("trainable", 0))
    got = {m.get("name"): (m.get("parameters_count"), m.get("trainable_count"))
           for m in modules or []}
    out = []
    for name in sorted(set(want) | set(got)):
        if name not in got:
            out.append("%s: measured, not in the spec" % name)
        elif name not in want:
            out.append("%s: in the spec, not measured" % name)
        elif got[name][0] != want[name][0]:
            out.append("%s: %s parameters predicted, %d measured" % (name, got[name][0],
                                                                    want[name][0]))
        elif trainable and got[name][1] != want[name][1]:
            out.append("%s: %s trainable predicted, %d measured" % (name, got[name][1],
                                                                   want[name][1]))
    return out


def leftover_input_hooks(records):
    """Measurements that ran with the input-embedding hooks of an earlier checkpointed
    config of the same worker still registered: {id(record): True} for each.

    transformers 5.17 gradient_checkpointing_enable() hooks every sub-model's input
    embeddings (enable_input_require_grads, modeling_utils.py:3191-3199; the Qwen-VL
    vision tower's patch_embed too) and gradient_checkpointing_disable() does not remove
    them (:3225-3226 only with PEFT's integration); calibrate.py before the fix in
    set_checkpointing removed at most the last hook list.  A record written by the fixed
    harness says how many hooks were live (config.input_grad_hooks); for older ones the
    file order tells: a worker starts with a probe "init" record of its group, and every
    config after one with checkpointing in that worker inherits its hooks."""
    out = {}
    ckpt_ran = {}
    for r in records:
        grp = r.get("group")
        if r.get("kind") == "probe" and r.get("probe") == "init":
            ckpt_ran[grp] = False
            continue
        if r.get("kind") != "measurement":
            continue
        c = r.get("config") or {}
        if "input_grad_hooks" in c:
            if c["input_grad_hooks"] and not c.get("checkpointing"):
                out[id(r)] = True
        elif not c.get("checkpointing") and ckpt_ran.get(grp):
            out[id(r)] = True
        if c.get("checkpointing") and r.get("status") in ("ok", "oom", "error"):
            ckpt_ran[grp] = True
    return out


def hooks_reach_frozen_tower(rec):
    """True when a leftover input hook changes what the spec states: a frozen vision
    tower that runs with autograd on (Qwen-VL; calibrate.py runs LLaVA's frozen CLIP under
    no_grad, where the hooked patch embedding records nothing) then keeps its
    activations for a backward into its input, which no spec with checkpointing off
    describes."""
    vt = (rec.get("params") or {}).get("vision_tower")
    return bool(vt) and not vt.get("trainable") and \
        not (rec.get("build") or {}).get("vision_no_grad")


def major_minor(version):
    """'5.17.0.dev0' -> '5.17', '2.11.0+cu130' -> '2.11'."""
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)", str(version))
    return "%s.%s" % (m.group(1), m.group(2)) if m else None


def framework_of(env):
    """A spec's `framework` versions from a record's `env` (torch and transformers,
    major.minor)."""
    env = env or {}
    return {"transformers_version": major_minor(env.get("transformers_version")),
            "torch_version": major_minor(env.get("torch_version"))}


# ---------------------------------------------------------------------------
# JSON lines
# ---------------------------------------------------------------------------

def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def append_record(path, record):
    """Append one record as one line, flushed and fsync'ed: a run killed at any
    moment loses at most the line being written (read_records skips it)."""
    rec = dict(record)
    rec.setdefault("schema", RECORD_SCHEMA)
    rec.setdefault("time", now_iso())
    line = json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n"
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    # a previous run killed mid-line leaves no newline: start on a fresh line
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
    return rec


def read_records(path, warn=None):
    """All parseable records of a JSON-lines file (missing file -> []).
    Unparseable lines (a line cut by a kill) are skipped and reported to warn()."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if warn:
                    warn("%s:%d: skipping unparseable line" % (path, n))
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def measurements(records):
    return [r for r in records if r.get("kind") == "measurement"]


def done_ids(records):
    """Config ids with a final status (last record per id wins)."""
    last = {}
    for r in measurements(records):
        last[r.get("id")] = r.get("status")
    return {i for i, s in last.items() if s in FINAL_STATUSES}


def oom_ids(records):
    last = {}
    for r in measurements(records):
        last[r.get("id")] = r.get("status")
    return {i for i, s in last.items() if s == "oom"}


def plan(groups, records, only=None):
    """What is left to do, in order.

    Returns (todo_groups, dominated): todo_groups is a list of (group, [configs]) with
    the configs not yet final; dominated is a list of (config, oom_config_id) for configs
    that an already recorded OOM proves would OOM too (they are recorded as skipped, not
    run)."""
    groups = select_groups(groups, only)
    done = done_ids(records)
    ooms = oom_ids(records)
    by_id = {c.id: c for g in groups for c in g.configs()}
    oom_cfgs = [by_id[i] for i in ooms if i in by_id]
    todo, dominated = [], []
    for g in sorted(groups, key=lambda g: g.priority):
        left = []
        for c in g.configs():
            if c.id in done:
                continue
            killer = next((o for o in oom_cfgs if c.dominates(o)), None)
            if killer is not None:
                dominated.append((c, killer.id))
                continue
            left.append(c)
        if left:
            todo.append((g, left))
    return todo, dominated


def skipped_record(cfg, reason, framework=None):
    return {
        "kind": "measurement", "id": cfg.id, "status": "skipped", "reason": reason,
        "group": cfg.group.name, "config": cfg.harness_dict(),
        "spec": spec_for(cfg, framework=framework),
    }


def format_plan(todo, dominated, budget_seconds=None):
    lines = []
    total = 0.0
    lines.append("%-3s %-44s %-9s %4s %5s %4s %-6s %7s %8s" % (
        "#", "config id", "mode", "mbs", "seq", "ckpt", "attn", "est_s", "cum_s"))
    n = 0
    for g, cfgs in todo:
        total += estimate_build_seconds(g)
        for c in cfgs:
            n += 1
            total += estimate_seconds(c)
            mark = ""
            if budget_seconds is not None and total > budget_seconds:
                mark = "  (past budget: next run)"
            lines.append("%-3d %-44s %-9s %4d %5d %4s %-6s %7.0f %8.0f%s" % (
                n, c.id, g.mode, c.micro_batch, c.seq_len, "on" if c.checkpointing else "off",
                g.attention, estimate_seconds(c), total, mark))
    for c, killer in dominated:
        lines.append("    skip %s (dominates OOM %s)" % (c.id, killer))
    lines.append("%d configs in %d groups to run, estimated %.0f s (%.1f min) of GPU time"
                 % (n, len(todo), total, total / 60.0))
    return "\n".join(lines)
