#!/usr/bin/env python3
"""mmguard calibration harness: measure real training steps on one GPU.

Run on a GPU node with torch >= 2.1 and transformers (4.4x or 5.x), no network needed:

    python3 contrib/calibrate/calibrate.py --out tests/gpu_data/h100.jsonl --budget-seconds 480

Every grid point (contrib/calibrate/calib_common.py: default_grid) is a LLaVA
(LlavaForConditionalGeneration) or text-only LlamaForCausalLM built from a config made
here (random initialisation, bf16 weights), trained for two steps with AdamW; the second
(steady-state) step is measured: torch.cuda.max_memory_allocated / max_memory_reserved
per phase, NVML/nvidia-smi used memory, plus the GPU, versions, and the exact config as
an mmguard spec.  One JSON line per config, written as soon as it is measured; a second
run with the same --out resumes.  OOM is a data point (status "oom"), and configs that a
recorded OOM dominates are skipped.

The parent process never touches CUDA: each group (one model) runs in a fresh worker
process (`--worker`), so every group starts from a clean CUDA context and allocator.

--dry-run prints the plan and the specs and needs neither torch nor a GPU.
--simulate runs the whole orchestration with a fake, analytic "GPU" (CPU tests only).
"""

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import calib_common as cc  # noqa: E402
import calib_trace as ct  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20

# where models and batches live; the CPU smoke test (tests/calibrate) sets "cpu"
DEVICE = "cuda"


def log(msg):
    sys.stderr.write("[calibrate] %s\n" % msg)
    sys.stderr.flush()


# ===========================================================================
# NVML / nvidia-smi (no CUDA context is created by these)
# ===========================================================================

class Nvml:
    """Device-level used memory of the GPU torch will use as cuda:0."""

    def __init__(self):
        self.kind = None
        self.handle = None
        self.index = 0
        self._nv = None
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        uuid = vis if vis.startswith("GPU-") or vis.startswith("MIG-") else None
        if vis.isdigit():
            self.index = int(vis)
        try:
            import pynvml  # nvidia-ml-py
            pynvml.nvmlInit()
            if uuid:
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            else:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._nv = pynvml
            self.kind = "pynvml"
        except Exception:  # no pynvml, or NVML refused: try nvidia-smi
            if self._smi_query("memory.used") is not None:
                self.kind = "nvidia-smi"

    def _smi_query(self, fields):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits",
                 "-i", str(self.index)], capture_output=True, text=True, timeout=20)
        except Exception:
            return None
        if out.returncode != 0 or not out.stdout.strip():
            return None
        return [x.strip() for x in out.stdout.strip().splitlines()[0].split(",")]

    def used(self):
        if self.kind == "pynvml":
            return int(self._nv.nvmlDeviceGetMemoryInfo(self.handle).used)
        if self.kind == "nvidia-smi":
            v = self._smi_query("memory.used")
            return int(float(v[0]) * MIB) if v else None
        return None

    def info(self):
        d = {"nvml_source": self.kind}
        try:
            if self.kind == "pynvml":
                nv = self._nv
                mem = nv.nvmlDeviceGetMemoryInfo(self.handle)
                name = nv.nvmlDeviceGetName(self.handle)
                drv = nv.nvmlSystemGetDriverVersion()
                d.update({
                    "nvml_gpu_name": name.decode() if isinstance(name, bytes) else name,
                    "nvml_total_bytes": int(mem.total),
                    "driver_version": drv.decode() if isinstance(drv, bytes) else drv,
                })
                try:
                    d["cuda_driver_version"] = nv.nvmlSystemGetCudaDriverVersion()
                except Exception:
                    pass
            elif self.kind == "nvidia-smi":
                v = self._smi_query("name,memory.total,driver_version")
                if v:
                    d.update({"nvml_gpu_name": v[0], "nvml_total_bytes": int(float(v[1]) * MIB),
                              "driver_version": v[2]})
        except Exception as e:  # never fail a measurement for metadata
            d["nvml_error"] = repr(e)
        return d

    def process_used(self, pid):
        """This process's used GPU memory as NVML lists it (None if not listed,
        e.g. in a container with its own PID namespace)."""
        if self.kind != "pynvml":
            return None
        try:
            for p in self._nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if p.pid == pid and p.usedGpuMemory is not None:
                    return int(p.usedGpuMemory)
        except Exception:
            return None
        return None


class Sampler:
    """Polls NVML used memory in a thread while a step runs (nvidia-smi's view of the peak)."""

    def __init__(self, nvml, period=0.002):
        self.nvml, self.period = nvml, period
        self.peak = None
        self._stop = threading.Event()
        self._t = None

    def __enter__(self):
        if self.nvml.kind == "pynvml":
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                u = self.nvml.used()
                if u is not None and (self.peak is None or u > self.peak):
                    self.peak = u
            except Exception:
                return
            time.sleep(self.period)

    def __exit__(self, *a):
        self._stop.set()
        if self._t:
            self._t.join(timeout=2)
        return False


# ===========================================================================
# GPU side: model construction (torch/transformers imported lazily)
# ===========================================================================

def _versions():
    import torch
    v = {"torch_version": torch.__version__, "torch_cuda": torch.version.cuda,
         "python": sys.version.split()[0]}
    try:
        v["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    try:
        import transformers
        v["transformers_version"] = transformers.__version__
    except Exception:
        v["transformers_version"] = None
    try:
        import peft
        v["peft_version"] = peft.__version__
    except Exception:
        v["peft_version"] = None
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDA_MODULE_LOADING",
              "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"):
        if os.environ.get(k) is not None:
            v["env_" + k] = os.environ[k]
    return v


def _tf_major():
    import transformers
    try:
        return int(transformers.__version__.split(".")[0])
    except ValueError:
        return 4


def hf_attn_name(att):
    """Spec attention -> transformers attn_implementation, or None if not installed."""
    if att in ("eager", "sdpa"):
        return att
    try:
        from transformers.utils import is_flash_attn_2_available
        if is_flash_attn_2_available():
            return "flash_attention_2"
    except Exception:
        pass
    try:
        from transformers.utils import is_flash_attn_3_available
        if is_flash_attn_3_available():
            return "flash_attention_3"
    except Exception:
        pass
    return None


def spec_attn_name(impl):
    if not impl:
        return None
    impl = str(impl)
    if impl.startswith("flash") or "flash-attn" in impl:
        return "flash"
    if impl in ("eager", "sdpa"):
        return impl
    return impl


def build_hf_config(group, seq_len_max):
    """LlavaConfig / LlamaConfig for the group, for transformers 4.4x and 5.x.

    Returns (config, legacy_image_merge): legacy is True on transformers versions whose
    LlavaConfig has no image_seq_length (< 4.44), where one <image> token in input_ids is
    expanded to 576 features inside the model instead of being expanded by the processor."""
    import inspect
    from transformers import LlamaConfig
    g = group.llm_geometry()
    if group.model in ("qwen2vl", "qwen25vl"):
        import calib_qwen
        return calib_qwen.build_config(group, seq_len_max), False
    text_kw = dict(
        hidden_size=g["hidden_size"], intermediate_size=g["intermediate_size"],
        num_hidden_layers=g["num_hidden_layers"], num_attention_heads=g["num_attention_heads"],
        num_key_value_heads=g.get("num_key_value_heads", g["num_attention_heads"]),
        vocab_size=g["vocab_size"], max_position_embeddings=max(4096, seq_len_max),
        rms_norm_eps=1e-5, hidden_act="silu", use_cache=False,
        tie_word_embeddings=bool(g.get("tie_word_embeddings", False)),
        initializer_range=0.02,
    )
    if "head_dim" in g:
        text_kw["head_dim"] = g["head_dim"]
    text = LlamaConfig(**text_kw)
    if group.model == "llama":
        return text, False
    from transformers import CLIPVisionConfig, LlavaConfig
    v = cc.CLIP_VIT_L_336
    vision = CLIPVisionConfig(
        hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        num_hidden_layers=v["num_hidden_layers"], num_attention_heads=v["num_attention_heads"],
        image_size=v["image_size"], patch_size=v["patch_size"], num_channels=v["num_channels"],
        hidden_act=v["hidden_act"], projection_dim=768, layer_norm_eps=1e-5,
    )
    params = inspect.signature(LlavaConfig.__init__).parameters
    kw = dict(vision_config=vision, text_config=text,
              image_token_index=g["vocab_size"] - 1, projector_hidden_act="gelu",
              vision_feature_select_strategy="default", vision_feature_layer=-2)
    legacy = "image_seq_length" not in params
    if not legacy:
        kw["image_seq_length"] = cc.image_tokens(v)
    if "multimodal_projector_bias" in params:
        kw["multimodal_projector_bias"] = True
    if "tie_word_embeddings" in params:
        kw["tie_word_embeddings"] = False
    return LlavaConfig(**kw), legacy


def build_model(group, seq_len_max):
    """The model on cuda:0 in bf16, random init, train mode.  Returns (model, info)."""
    import torch
    from transformers import LlamaForCausalLM
    config, legacy = build_hf_config(group, seq_len_max)
    impl = hf_attn_name(group.attention)
    if impl is None:
        raise Unavailable("attention %r: no flash-attn package for transformers here"
                          % group.attention)
    if group.model == "llava":
        from transformers import LlavaForConditionalGeneration as cls
    elif group.model in ("qwen2vl", "qwen25vl"):
        import calib_qwen
        cls = calib_qwen.model_class(group)
    else:
        cls = LlamaForCausalLM
    dtype_kws = ["dtype", "torch_dtype"] if _tf_major() >= 5 else ["torch_dtype", "dtype"]
    t0 = time.time()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what _from_config(dtype=bf16) does itself
    try:
        with torch.device(DEVICE):
            model, err = None, None
            for kw in dtype_kws:
                try:
                    model = cls._from_config(config, attn_implementation=impl,
                                             **{kw: torch.bfloat16})
                    break
                except TypeError as e:  # that keyword is not known to this version
                    err = e
                except (ValueError, ImportError) as e:
                    if group.model != "llava":
                        raise
                    # old 4.4x: CLIP may lack the implementation; keep it eager
                    log("attn_implementation=%s on the whole LLaVA failed (%s); "
                        "retrying with the vision tower eager" % (impl, e))
                    config.vision_config._attn_implementation = "eager"
                    config.text_config._attn_implementation = impl
                    model = cls(config)
                    break
            if model is None:
                raise err
    finally:
        torch.set_default_dtype(prev)
    for p in model.parameters():  # pure bf16 weights, whatever the version did
        if p.is_floating_point() and p.dtype != torch.bfloat16:
            p.data = p.data.to(torch.bfloat16)
    model.train()
    try:
        model.config.use_cache = False
    except Exception:
        pass
    info = {"build_seconds": round(time.time() - t0, 2), "legacy_image_merge": legacy,
            "attn_requested": impl, "attention_used": attention_used(model, group)}
    return model, info


def attention_used(model, group):
    cfg = model.config
    if group.model == "llama":
        return {"language_model": spec_attn_name(getattr(cfg, "_attn_implementation", None))}
    t = getattr(getattr(cfg, "text_config", None), "_attn_implementation", None)
    v = getattr(getattr(cfg, "vision_config", None), "_attn_implementation", None)
    top = getattr(cfg, "_attn_implementation", None)
    return {"language_model": spec_attn_name(t or top), "vision_tower": spec_attn_name(v or top)}


class Unavailable(Exception):
    """The config cannot run on this installation (e.g. no flash-attn)."""


def part_of(name):
    """Which spec module a parameter name belongs to (4.4x and 5.x layouts; Qwen-VL's
    patch merger lives inside `visual` but is the projector)."""
    if "multi_modal_projector" in name or ".merger." in name or name.startswith("merger."):
        return "projector"
    if "vision_tower" in name or "visual." in name:
        return "vision_tower"
    return "language_model"


def vision_tower_of(model):
    best = None
    for name, mod in model.named_modules():
        if name.split(".")[-1] == "vision_tower":
            if best is None or len(name) < len(best[0]):
                best = (name, mod)
    return best[1] if best else None


def wrap_no_grad(module):
    """Run `module` under torch.no_grad(), as LLaVA runs its frozen CLIP tower."""
    import torch
    if getattr(module, "_mmguard_no_grad", False):
        return
    orig = module.forward

    def forward(*a, **k):
        with torch.no_grad():
            return orig(*a, **k)
    module.forward = forward
    module._mmguard_no_grad = True


def lora_linear_class():
    """Built-in LoRA with PEFT semantics: y = base(x) + B(A(dropout(x))) * alpha/r,
    A kaiming-uniform, B zero, dropout nn.Dropout(p) or nn.Identity when p == 0,
    adapters in the base weight's dtype (pure bf16, like peft with
    autocast_adapter_dtype=False)."""
    import math
    from torch import nn

    class LoraLinear(nn.Module):
        def __init__(self, base, r, alpha, dropout):
            super().__init__()
            self.base_layer = base
            w = base.weight
            self.lora_dropout = nn.Dropout(p=dropout) if dropout > 0 else nn.Identity()
            self.lora_A = nn.Linear(base.in_features, r, bias=False, device=w.device, dtype=w.dtype)
            self.lora_B = nn.Linear(r, base.out_features, bias=False, device=w.device, dtype=w.dtype)
            self.scaling = alpha / r
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
            nn.init.zeros_(self.lora_B.weight)

        @property
        def weight(self):
            return self.base_layer.weight

        def forward(self, x):
            result = self.base_layer(x)
            return result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    return LoraLinear


def apply_builtin_lora(model, lora, only_part="language_model"):
    from torch import nn
    LoraLinear = lora_linear_class()
    targets = set(lora["target_modules"])
    todo = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name.split(".")[-1] in targets and part_of(name) == only_part:
            todo.append(name)
    for name in todo:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        setattr(parent, child, LoraLinear(base, lora["r"], lora["alpha"], lora["dropout"]))
    return len(todo)


def apply_lora(model, group, impl):
    """LoRA on the language model only (never the CLIP q/k/v_proj).  Returns
    (model, info).  impl: auto (peft if importable) | peft | builtin."""
    import torch
    lora = group.lora
    used = impl
    if impl in ("auto", "peft"):
        try:
            import peft  # noqa: F401
            used = "peft"
        except ImportError:
            if impl == "peft":
                raise
            used = "builtin"
    if used == "builtin":
        n = apply_builtin_lora(model, lora)
        return model, {"lora_impl": "builtin", "lora_targets": n}
    from peft import LoraConfig, get_peft_model
    names = "|".join(sorted(lora["target_modules"]))
    if group.model != "llama":
        target = r".*language_model.*\.(%s)" % names
    else:
        target = list(lora["target_modules"])
    pc = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                    target_modules=target, bias="none")
    try:
        pm = get_peft_model(model, pc, autocast_adapter_dtype=False)
    except TypeError:  # peft < 0.12 has no autocast_adapter_dtype
        pm = get_peft_model(model, pc)
    n = 0
    for name, p in pm.named_parameters():
        if "lora_" in name:
            n += 1
            if p.dtype != torch.bfloat16:
                p.data = p.data.to(torch.bfloat16)
    import peft as _peft
    return pm, {"lora_impl": "peft", "peft_version": _peft.__version__, "lora_tensors": n}


def set_trainable(model, group):
    """requires_grad per spec module for the group's mode; returns per-part counts."""
    train = {
        "pretrain": {"vision_tower": False, "projector": True, "language_model": False},
        "finetune": {"vision_tower": False, "projector": True, "language_model": True},
        "lora": {"vision_tower": False, "projector": True, "language_model": False},
        "full": {"vision_tower": True, "projector": True, "language_model": True},
    }[group.mode]
    counts = {}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        part = part_of(name)
        is_lora = "lora_" in name
        p.requires_grad_(True if is_lora else train[part])
        key = part + ("_lora" if is_lora else "")
        c = counts.setdefault(key, {"total": 0, "trainable": 0})
        c["total"] += p.numel()
        if p.requires_grad:
            c["trainable"] += p.numel()
    return counts


def make_batch(group, cfg, legacy):
    """input_ids/labels/attention_mask (+ pixel_values) as a LLaVA dataloader would give:
    576 image tokens per sample (or one <image> token on legacy transformers, expanded
    by the model), image positions labelled -100, the rest random text."""
    import torch
    g = group.llm_geometry()
    V = g["vocab_size"]
    b, s = cfg.micro_batch, cfg.seq_len
    dev = DEVICE
    if group.model in ("qwen2vl", "qwen25vl"):
        import calib_qwen
        return calib_qwen.make_batch(group, cfg, dev)
    if group.model == "llama":
        ids = torch.randint(0, V - 1, (b, s), device=dev)
        return {"input_ids": ids, "labels": ids.clone(),
                "attention_mask": torch.ones(b, s, dtype=torch.long, device=dev)}
    n_img = cc.image_tokens(cc.CLIP_VIT_L_336)
    img_tok = V - 1
    L = s - n_img + 1 if legacy else s
    ids = torch.randint(0, V - 1, (b, L), device=dev)
    labels = ids.clone()
    if legacy:
        ids[:, 1] = img_tok
        labels[:, 1] = -100
    else:
        ids[:, 1:1 + n_img] = img_tok
        labels[:, 1:1 + n_img] = -100
    v = cc.CLIP_VIT_L_336
    pix = torch.randn(b, v["num_channels"], v["image_size"], v["image_size"],
                      device=dev, dtype=torch.bfloat16)
    return {"input_ids": ids, "labels": labels, "pixel_values": pix,
            "attention_mask": torch.ones(b, L, dtype=torch.long, device=dev)}


def is_oom(e):
    import torch
    oom_cls = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_cls is not None and isinstance(e, oom_cls):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def _alloc_stats():
    import torch
    st = torch.cuda.memory_stats()
    return {k: st.get(k) for k in (
        "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
        "segment.all.peak", "segment.large_pool.peak", "segment.small_pool.peak",
        "inactive_split_bytes.all.peak", "allocated_bytes.all.peak", "reserved_bytes.all.peak")}


def _mem():
    import torch
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}


class GpuRunner:
    """One worker process: one group, one model, its configs in order."""

    def __init__(self, args, group, nvml):
        self.args, self.group, self.nvml = args, group, nvml
        self.model = None
        self.hf_model = None
        self.grad_hooks = []  # enable_input_require_grads() handles (set_checkpointing)
        self.build_info = {}
        self.param_counts = {}
        self.baseline_used = None
        self.env = {}
        self.capacity = None  # {memory_fraction, device_total, allocator_capacity_bytes}

    # ---- probes -----------------------------------------------------------
    def probe_init(self):
        """Context size at idle-after-init: NVML used minus torch reserved, before and
        after the first cuBLAS matmul (cuBLAS loads its kernels/workspace lazily)."""
        import torch
        self.baseline_used = self.nvml.used()  # before this process touches CUDA
        rec = {"kind": "probe", "probe": "init", "group": self.group.name,
               "nvml_used_baseline": self.baseline_used, "pid": os.getpid(),
               "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
        if self.group.trace:
            start_trace()
        torch.cuda.init()
        self.capacity = None
        if getattr(self.args, "memory_fraction", None):
            # the card as a smaller one: CUDACachingAllocator.cpp setMemoryFraction sets
            # allowed_memory_maximum = size_t(fraction * double(device_total)), device_total
            # from cudaMemGetInfo; alloc_block fails a cudaMalloc that would pass it, and
            # malloc() then frees cache and retries as it does on a full card (issue 21)
            f = self.args.memory_fraction
            torch.cuda.set_per_process_memory_fraction(f)
            total = torch.cuda.mem_get_info()[1]
            self.capacity = {"memory_fraction": f, "device_total": int(total),
                             "allocator_capacity_bytes": int(f * float(total))}
            rec["capacity"] = self.capacity
        x = torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        m = _mem()
        u = self.nvml.used()
        rec.update({"after_init": dict(m, nvml_used=u)})
        a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        (a @ a).sum().item()
        torch.cuda.synchronize()
        m2 = _mem()
        u2 = self.nvml.used()
        rec["after_matmul"] = dict(m2, nvml_used=u2)
        del a, x
        if self.baseline_used is not None and u is not None:
            rec["cuda_context_idle"] = u - self.baseline_used - m["reserved"]
            rec["cuda_context_after_matmul"] = u2 - self.baseline_used - m2["reserved"]
        rec["process_used"] = self.nvml.process_used(os.getpid())
        props = torch.cuda.get_device_properties(0)
        self.env = dict(_versions(), **self.nvml.info())
        self.env.update({"gpu_name": props.name, "gpu_total_bytes": int(props.total_memory),
                         "gpu_sm_count": props.multi_processor_count,
                         "gpu_capability": "%d.%d" % (props.major, props.minor)})
        rec["env"] = self.env
        return rec

    def probe_final(self):
        import torch
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        m = _mem()
        u = self.nvml.used()
        rec = {"kind": "probe", "probe": "final", "group": self.group.name,
               "nvml_used_baseline": self.baseline_used, "nvml_used": u, **m,
               "process_used": self.nvml.process_used(os.getpid())}
        if u is not None and self.baseline_used is not None:
            rec["cuda_context_final"] = u - self.baseline_used - m["reserved"]
        return rec

    # ---- model ------------------------------------------------------------
    def build(self, seq_len_max):
        model, info = build_model(self.group, seq_len_max)
        self.hf_model = model
        if self.group.model == "llava" and self.group.mode != "full":
            vt = vision_tower_of(model)
            if vt is None:
                raise RuntimeError("vision tower not found in %s" % type(model).__name__)
            wrap_no_grad(vt)
            info["vision_no_grad"] = True
        if self.group.mode == "lora":
            model, linfo = apply_lora(model, self.group, self.args.lora_impl)
            info.update(linfo)
        self.model = model
        self.param_counts = set_trainable(model, self.group)
        self.build_info = info

    def set_checkpointing(self, on):
        """Checkpointing on or off for the next config, leaving no trace of the last one.

        transformers 5.17 gradient_checkpointing_enable() itself calls
        enable_input_require_grads() (modeling_utils.py:3191-3199, main_input_name ==
        "input_ids"), which hooks every sub-model's input embeddings, the Qwen-VL vision
        tower's patch_embed included (_input_embed_layer = "patch_embed",
        modeling_qwen2_vl.py:687); gradient_checkpointing_disable() removes them only on a
        model with _hf_peft_config_loaded (:3225-3226), and each enable_input_require_grads()
        replaces the _require_grads_hooks list of the last without removing its hooks
        (:2166).  A config measured without checkpointing after one with it would run with
        a frozen tower whose input requires grad (it then keeps its activations for
        backward), which no spec with checkpointing off describes.  So every hook handle
        registered here is kept and removed when checkpointing goes off."""
        m = self.hf_model
        frozen_embed = self.group.mode in ("pretrain", "lora")
        if on:
            kw = {}
            if self.args.use_reentrant != "default":
                kw["gradient_checkpointing_kwargs"] = {
                    "use_reentrant": self.args.use_reentrant == "true"}
            m.gradient_checkpointing_enable(**kw)
            self._keep_grad_hooks(m)
            if frozen_embed:
                m.enable_input_require_grads()
                self._keep_grad_hooks(m)
        else:
            if getattr(m, "is_gradient_checkpointing", True):
                m.gradient_checkpointing_disable()
            for h in self.grad_hooks:
                h.remove()  # RemovableHandle.remove() is idempotent
            self.grad_hooks = []
            if getattr(m, "_require_grads_hooks", None):
                m._require_grads_hooks = []
            if hasattr(m, "_require_grads_hook"):
                del m._require_grads_hook

    def _keep_grad_hooks(self, m):
        """The handles enable_input_require_grads() left on m: the 5.x list, or the one
        _require_grads_hook of 4.x."""
        hooks = list(getattr(m, "_require_grads_hooks", None) or [])
        one = getattr(m, "_require_grads_hook", None)
        if one is not None and one not in hooks:
            hooks.append(one)
        self.grad_hooks.extend(h for h in hooks if h not in self.grad_hooks)

    # ---- one config ---------------------------------------------------------
    def measure(self, cfg):
        import torch
        g = self.group
        rec = {"kind": "measurement", "id": cfg.id, "group": g.name,
               "config": cfg.harness_dict()}
        rec["config"]["use_reentrant"] = self.args.use_reentrant
        rec["spec"] = cc.spec_for(cfg, framework=cc.framework_of(self.env),
                                  attention_used=self.build_info.get("attention_used"),
                                  use_reentrant=self.args.use_reentrant)
        rec["build"] = self.build_info
        rec["params"] = self.param_counts
        rec["env"] = self.env
        state = {"phase": "setup", "step": 0}
        meas = {}
        opt = batch = None
        t_start = time.time()
        try:
            self.set_checkpointing(cfg.checkpointing)
            rec["config"]["checkpointing_active"] = bool(
                getattr(self.hf_model, "is_gradient_checkpointing", cfg.checkpointing))
            # enable_input_require_grads() hooks live for this config (0 without
            # checkpointing: set_checkpointing removed them; compare.py reads it)
            rec["config"]["input_grad_hooks"] = len(self.grad_hooks)
            params = [p for p in self.model.parameters() if p.requires_grad]
            okw = {"lr": 1e-5}
            if g.optimizer_impl == "fused":
                okw["fused"] = True
            elif g.optimizer_impl == "for_loop":
                okw["foreach"] = False
            opt = torch.optim.AdamW(params, **okw)
            batch = make_batch(g, cfg, self.build_info.get("legacy_image_merge", False))
            torch.cuda.synchronize()
            meas["before_step1"] = dict(_mem(), nvml_used=self.nvml.used())
            # step 1 (warm-up: creates the optimizer states, loads the kernels)
            state["step"] = 1
            t1 = time.time()
            self._step(batch, opt, state, None)
            torch.cuda.synchronize()
            meas["step1_seconds"] = round(time.time() - t1, 3)
            meas["step1_max_allocated"] = torch.cuda.max_memory_allocated()
            meas["step1_max_reserved"] = torch.cuda.max_memory_reserved()
            meas["retries_after_step1"] = torch.cuda.memory_stats().get("num_alloc_retries")
            meas["before_step2"] = dict(_mem(), nvml_used=self.nvml.used())
            # step 2: the steady state, measured per phase
            state["step"] = 2
            phases = {}
            t2 = time.time()
            with Sampler(self.nvml) as smp:
                loss = self._step(batch, opt, state, phases)
                torch.cuda.synchronize()
            meas["step2_seconds"] = round(time.time() - t2, 3)
            meas["loss"] = loss
            after = dict(_mem(), nvml_used=self.nvml.used())
            meas["after_step2"] = after
            meas["phase_peak_allocated"] = {k: v["max_allocated"] for k, v in phases.items()}
            meas["phase_peak_reserved"] = {k: v["max_reserved"] for k, v in phases.items()}
            meas["max_memory_allocated"] = max(v["max_allocated"] for v in phases.values())
            meas["max_memory_reserved"] = max(v["max_reserved"] for v in phases.values())
            meas["peak_phase"] = max(phases, key=lambda k: phases[k]["max_allocated"])
            meas["nvml_peak_sampled"] = smp.peak
            meas["nvml_used_baseline"] = self.baseline_used
            meas["process_used_after_step2"] = self.nvml.process_used(os.getpid())
            meas["allocator"] = _alloc_stats()
            if after["nvml_used"] is not None and self.baseline_used is not None:
                # device-level peak: what nvidia-smi showed at the peak of step 2.  The
                # allocator does not shrink within a step unless a retry freed cache, so
                # used-after-step + (peak reserved - reserved now) is that peak.
                dev = (after["nvml_used"] - self.baseline_used
                       + meas["max_memory_reserved"] - after["reserved"])
                if smp.peak is not None:
                    dev = max(dev, smp.peak - self.baseline_used)
                meas["device_peak_bytes"] = dev
                meas["cuda_context_effective"] = (after["nvml_used"] - self.baseline_used
                                                  - after["reserved"])
            rec["status"] = "ok"
        except Unavailable as e:
            rec["status"] = "unavailable"
            rec["reason"] = str(e)
        except Exception as e:  # noqa: BLE001 - an OOM or a bug is a data point
            if is_oom(e):
                rec["status"] = "oom"
                msg = str(e)
                rec["oom"] = {"phase": state["phase"], "step": state["step"],
                              "message": msg[:600],
                              "max_allocated_at_oom": torch.cuda.max_memory_allocated(),
                              "max_reserved_at_oom": torch.cuda.max_memory_reserved(),
                              "allocator": _alloc_stats()}
            else:
                rec["status"] = "error"
                rec["error"] = {"phase": state["phase"], "step": state["step"],
                                "type": type(e).__name__, "message": str(e)[:600],
                                "traceback": traceback.format_exc()[-3000:]}
        rec["measured"] = meas
        rec["wall_seconds"] = round(time.time() - t_start, 2)
        # free everything before the next config of this process
        opt = batch = None
        for p in self.model.parameters():
            p.grad = None
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        return rec

    def _step(self, batch, opt, state, phases):
        """One training step as HF Trainer does it: only the loss is kept from the
        outputs (the logits are dropped before backward), then AdamW, then zero_grad."""
        import torch

        def mark(name):
            if phases is not None:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()

        def done(name):
            if phases is not None:
                torch.cuda.synchronize()
                phases[name] = {"max_allocated": torch.cuda.max_memory_allocated(),
                                "max_reserved": torch.cuda.max_memory_reserved()}

        state["phase"] = "forward"
        mark("forward")
        loss = self.model(**batch, use_cache=False).loss
        done("forward")
        state["phase"] = "backward"
        mark("backward")
        loss.backward()
        done("backward")
        state["phase"] = "optimizer"
        mark("optimizer")
        opt.step()
        done("optimizer")
        state["phase"] = "zero_grad"
        opt.zero_grad(set_to_none=True)
        return float(loss.detach().float().item())


TRACE_MAX_ENTRIES = 4000000


def start_trace():
    """Record every allocator event from here on, without stacks (small, fast)."""
    import torch
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=TRACE_MAX_ENTRIES)


def save_trace(runner, cfg, rec, trace_dir, out):
    """Snapshot the recorded history, write it as a compact fixture, stop recording.
    Returns a small dict for the measurement record."""
    import torch
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = ct.events_from_snapshot(snap)
    os.makedirs(trace_dir, exist_ok=True)
    path = os.path.join(trace_dir, cfg.id + ".trace.gz")
    st = torch.cuda.memory_stats()
    meta = {"id": cfg.id, "torch_version": runner.env.get("torch_version"),
            "gpu_name": runner.env.get("gpu_name"),
            "gpu_total_bytes": runner.env.get("gpu_total_bytes"),
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "allocator_settings": snap.get("allocator_settings"),
            "max_entries": TRACE_MAX_ENTRIES,
            "truncated": len(snap.get("device_traces", [[]])[0]) >= TRACE_MAX_ENTRIES,
            "whole_process_peaks": {k: st.get(k) for k in (
                "allocated_bytes.all.peak", "reserved_bytes.all.peak",
                "allocated_bytes.all.allocated", "num_device_alloc", "num_device_free",
                "num_alloc_retries")},
            "at_snapshot": ct.segments_summary(snap),
            "step2": {k: (rec.get("measured") or {}).get(k) for k in (
                "max_memory_allocated", "max_memory_reserved")},
            "status": rec.get("status")}
    head = ct.write_trace(path, events, meta)
    return {"path": os.path.relpath(path, os.path.dirname(os.path.abspath(out))),
            "events": head["events"], "truth_reserved_peak": head["truth_reserved_peak"],
            "bytes": os.path.getsize(path), "truncated": meta["truncated"]}


def worker_main(args):
    """Runs one group's configs; appends records to args.out; stops at the deadline."""
    group = cc.Group.from_dict(json.loads(args.group_json))
    cfg_ids = set(args.config_ids.split(",")) if args.config_ids else None
    cfgs = [c for c in group.configs() if cfg_ids is None or c.id in cfg_ids]
    deadline = args.deadline
    if args.simulate:
        return simulate_worker(args, group, cfgs, deadline)
    nvml = Nvml()
    runner = GpuRunner(args, group, nvml)
    probe = runner.probe_init()
    cc.append_record(args.out, probe)
    fw = cc.framework_of(runner.env)
    try:
        runner.build(max(c.seq_len for c in cfgs))
    except Exception as e:  # noqa: BLE001
        status, extra = "error", {}
        if isinstance(e, Unavailable):
            status, extra = "unavailable", {"reason": str(e)}
        elif is_oom(e):
            status, extra = "oom", {"oom": {"phase": "build", "step": 0, "message": str(e)[:600]}}
        else:
            extra = {"error": {"phase": "build", "type": type(e).__name__,
                               "message": str(e)[:600],
                               "traceback": traceback.format_exc()[-3000:]}}
        for c in cfgs:
            rec = {"kind": "measurement", "id": c.id, "group": group.name,
                   "config": c.harness_dict(), "spec": cc.spec_for(c, framework=fw),
                   "status": status, "env": runner.env}
            rec.update(extra)
            cc.append_record(args.out, rec)
        return 0
    oomed = []
    for c in cfgs:
        killer = next((o for o in oomed if c.dominates(o)), None)
        if killer is not None:
            cc.append_record(args.out, cc.skipped_record(c, "dominates OOM " + killer.id, fw))
            continue
        left = deadline - time.time()
        if left < cc.estimate_seconds(c) * 1.5 + 10:
            log("%s: %.0f s left, stopping (resume with the same command)" % (c.id, left))
            break
        rec = runner.measure(c)
        if runner.capacity is not None:
            # a capacity-sweep point: its own id, never a grid measurement (the grid's
            # comparisons read kind "measurement" only)
            rec["kind"] = "capacity_point"
            rec["uncapped_id"] = c.id
            rec["id"] = "%s-cap%d" % (c.id, runner.capacity["allocator_capacity_bytes"])
            rec["capacity"] = runner.capacity
        if group.trace:
            try:
                tdir = args.trace_dir or os.path.join(
                    os.path.dirname(os.path.abspath(args.out)), "traces")
                rec["trace"] = save_trace(runner, c, rec, tdir, args.out)
            except Exception as e:  # noqa: BLE001 - keep the measurement
                rec["trace"] = {"error": "%s: %s" % (type(e).__name__, e),
                                "traceback": traceback.format_exc()[-2000:]}
        cc.append_record(args.out, rec)
        m = rec.get("measured", {})
        log("%-44s %-5s alloc %6.2f GiB  reserved %6.2f GiB  device %s" % (
            c.id, rec["status"], (m.get("max_memory_allocated") or 0) / GIB,
            (m.get("max_memory_reserved") or 0) / GIB,
            "%.2f GiB" % (m["device_peak_bytes"] / GIB) if m.get("device_peak_bytes") else "-"))
        if rec["status"] == "oom":
            oomed.append(c)
    cc.append_record(args.out, runner.probe_final())
    return 0


# ===========================================================================
# --simulate: an analytic fake GPU so the orchestration is testable on CPU
# ===========================================================================

SIM_TOTAL = 80 * GIB
SIM_CONTEXT = 520 * MIB
SIM_FRAC = 0.03
SIM_FIXED = 96 * MIB


def simulated_allocated(cfg):
    """Not a memory model: a deterministic stand-in with plausible magnitudes."""
    g = cfg.group
    n = cc.llm_param_count(g.llm_geometry()) + (0.3e9 if g.model == "llava" else 0)
    states = n * 2
    if g.mode in ("finetune", "full"):
        states += n * 6
    elif g.mode == "lora":
        states += 0.04 * n * 8
    per_tok = g.llm_geometry()["hidden_size"] * g.llm_geometry()["num_hidden_layers"] * 2
    act = cfg.tokens() * per_tok * (1 if cfg.checkpointing else 24)
    logits = cfg.tokens() * g.llm_geometry()["vocab_size"] * 4 * 2
    return int(states + act + logits)


def simulate_worker(args, group, cfgs, deadline):
    time.sleep(float(os.environ.get("MMGUARD_CALIB_SIM_BUILD_S", "0")))
    env = {"gpu_name": "SIMULATED H100 80GB HBM3", "gpu_total_bytes": SIM_TOTAL,
           "torch_version": "0.0-sim", "transformers_version": "0.0-sim",
           "nvml_source": "simulated", "simulated": True}
    base = 0
    cc.append_record(args.out, {"kind": "probe", "probe": "init", "group": group.name,
                                "nvml_used_baseline": base,
                                "after_init": {"allocated": 512, "reserved": 2 * MIB,
                                               "nvml_used": base + 2 * MIB + SIM_CONTEXT - 80 * MIB},
                                "cuda_context_idle": SIM_CONTEXT - 80 * MIB,
                                "env": env, "simulated": True})
    per_cfg = float(os.environ.get("MMGUARD_CALIB_SIM_CONFIG_S", "0"))
    oomed = []
    for c in cfgs:
        killer = next((o for o in oomed if c.dominates(o)), None)
        if killer is not None:
            cc.append_record(args.out, cc.skipped_record(c, "dominates OOM " + killer.id))
            continue
        if deadline - time.time() < per_cfg + 0.5:
            log("%s: deadline, stopping" % c.id)
            break
        time.sleep(per_cfg)
        alloc = simulated_allocated(c)
        reserved = int(alloc * (1 + SIM_FRAC) + SIM_FIXED)
        rec = {"kind": "measurement", "id": c.id, "group": group.name,
               "config": c.harness_dict(), "env": env, "simulated": True,
               "spec": cc.spec_for(c, framework={"transformers_version": "5.17",
                                                 "torch_version": "2.11"})}
        if reserved + SIM_CONTEXT > SIM_TOTAL:
            rec["status"] = "oom"
            rec["oom"] = {"phase": "forward", "step": 1, "message": "simulated OOM"}
            oomed.append(c)
        else:
            rec["status"] = "ok"
            rec["measured"] = {"max_memory_allocated": alloc, "max_memory_reserved": reserved,
                               "after_step2": {"allocated": alloc // 3, "reserved": reserved,
                                               "nvml_used": base + reserved + SIM_CONTEXT},
                               "nvml_used_baseline": base,
                               "device_peak_bytes": reserved + SIM_CONTEXT,
                               "cuda_context_effective": SIM_CONTEXT}
        cc.append_record(args.out, rec)
    return 0


# ===========================================================================
# Parent: plan, spawn one worker per group, respect the budget, summarise
# ===========================================================================

def run_parent(args):
    t0 = time.time()
    deadline = t0 + args.budget_seconds
    groups = cc.GRIDS[args.grid]()
    records = cc.read_records(args.out, warn=log)
    todo, dominated = cc.plan(groups, records, args.only)
    for c, killer in dominated:
        cc.append_record(args.out, cc.skipped_record(c, "dominates OOM " + killer))
    if not todo:
        log("nothing left to measure in %s" % args.out)
    for g, cfgs in todo:
        left = deadline - time.time()
        need = cc.estimate_build_seconds(g) + cc.estimate_seconds(cfgs[0])
        if not args.simulate and left < need:
            log("budget: %.0f s left < %.0f s needed for group %s; stopping here. "
                "Run the same command again to resume." % (left, need, g.name))
            break
        if args.simulate and left <= 0:
            break
        log("group %s: %d configs (%.0f s of budget left)" % (g.name, len(cfgs), left))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--out", args.out,
               "--group-json", json.dumps(g.to_dict()),
               "--config-ids", ",".join(c.id for c in cfgs),
               "--deadline", repr(deadline), "--lora-impl", args.lora_impl,
               "--use-reentrant", args.use_reentrant]
        if args.trace_dir:
            cmd += ["--trace-dir", args.trace_dir]
        if args.simulate:
            cmd.append("--simulate")
        env = dict(os.environ)
        if g.alloc_conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = g.alloc_conf
        # the worker gets until the deadline plus a grace to finish the step in flight
        timeout = max(5.0, deadline - time.time() + args.grace_seconds)
        proc = subprocess.Popen(cmd, start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
        if rc != 0:
            log("worker for %s ended with %s" % (g.name, rc))
            cc.append_record(args.out, {"kind": "worker_exit", "group": g.name,
                                        "returncode": rc})
            if rc == "timeout":
                break
    summarize(args)
    return 0


def summarize(args):
    recs = cc.read_records(args.out)
    ms = cc.measurements(recs)
    last = {}
    for r in ms:
        last[r["id"]] = r
    counts = {}
    for r in last.values():
        counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
    total = len(cc.all_configs(cc.GRIDS[args.grid]()))
    print("calibrate: %s: %d/%d grid configs recorded: %s" % (
        args.out, len(last), total,
        ", ".join("%s %d" % kv for kv in sorted(counts.items())) or "none"))
    mmguard = args.mmguard
    if mmguard and os.path.exists(mmguard) and os.access(mmguard, os.X_OK):
        import compare
        compare.main(["--mmguard", mmguard, args.out])
    else:
        print("calibrate: no mmguard binary at %r; compare later on a build machine with:\n"
              "  python3 contrib/calibrate/compare.py --mmguard build/mmguard %s\n"
              "  python3 contrib/calibrate/fit.py %s" % (mmguard, args.out, args.out))


def dry_run(args):
    groups = cc.GRIDS[args.grid]()
    records = cc.read_records(args.out) if args.out else []
    todo, dominated = cc.plan(groups, records, args.only)
    print("calibrate --dry-run: grid %r, output %s, budget %d s" % (
        args.grid, args.out, args.budget_seconds))
    print(cc.format_plan(todo, dominated, args.budget_seconds))
    if args.write_specs:
        os.makedirs(args.write_specs, exist_ok=True)
    for g, cfgs in todo:
        for c in cfgs:
            spec = cc.spec_for(c)
            if args.write_specs:
                with open(os.path.join(args.write_specs, c.id + ".json"), "w") as f:
                    json.dump(spec, f, indent=2)
                    f.write("\n")
            if args.print_specs:
                print("spec %s %s" % (c.id, json.dumps(spec, sort_keys=True)))
    if args.write_specs:
        print("specs written to %s" % args.write_specs)
    return 0


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/gpu_data/calib.jsonl",
                    help="JSON-lines output; an existing file is resumed (default %(default)s)")
    ap.add_argument("--budget-seconds", type=float, default=480,
                    help="stop starting work after this many seconds (default %(default)s)")
    ap.add_argument("--grace-seconds", type=float, default=45,
                    help="extra time a worker may use to finish the config in flight")
    ap.add_argument("--grid", choices=sorted(cc.GRIDS), default="default")
    ap.add_argument("--only", help="regex: only groups whose name matches")
    ap.add_argument("--lora-impl", choices=("auto", "peft", "builtin"), default="auto")
    ap.add_argument("--use-reentrant", choices=("default", "true", "false"), default="default",
                    help="gradient_checkpointing_kwargs use_reentrant (default: library default)")
    ap.add_argument("--mmguard", default=os.environ.get("MMGUARD", "build/mmguard"),
                    help="predictor binary for the closing comparison, if present")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; no torch needed")
    ap.add_argument("--print-specs", action="store_true", help="with --dry-run: print each spec")
    ap.add_argument("--write-specs", metavar="DIR", help="with --dry-run: write spec JSON files")
    ap.add_argument("--trace-dir", help="where allocator traces go (default: traces/ next "
                    "to --out)")
    ap.add_argument("--memory-fraction", type=float, help="worker: run under "
                    "torch.cuda.set_per_process_memory_fraction (capacity sweeps, capacity.py)")
    ap.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group-json", help=argparse.SUPPRESS)
    ap.add_argument("--config-ids", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        return worker_main(args)
    if args.dry_run:
        return dry_run(args)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
