"""Truth rows for LoRA on lm_head and embed_tokens (issue 23, helper lorahead).

PEFT 0.21.2 wraps the output layer as lora.Linear (peft/tuners/lora/layer.py:910, forward :1074-1114)
and the token embedding as lora.Embedding (:1150, forward :1487-1537); setup.lora.target_modules is
then a list of names (the spec's names, as accuracy.py passes them on); on a VLM truth.py turns it
into a regex over the language model (lora_names_regex).  The rows cover the adapters' dtype (fp32
by PEFT's autocast_adapter_dtype, or bf16), checkpointing, a tied embedding (qwen2 `tied`, Gemma 3:
PEFT wraps lm_head alone, the shared base weight stays one), Gemma 3's scaled embedding (PEFT's
embed_scale multiply), modules_to_save copies (the existing spec key), DDP, ZeRO-2/3, FSDP1/2.  Each row
runs PEFT's mixed-dtype sums as CUDA does, without the CPU's promotion copy (emul_peft.py): for a
LoRA lm_head with fp32 adapters on a bf16 model that copy is a whole fp32 logits tensor.

    all_setups()    the rows, called by ONE line of truth.py config_list
"""
import hashlib
import json

GC = {"use_reentrant": False, "every_n_layers": 1}
LIN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMALL = {"hidden": 128, "layers": 2}
# (family, precision, checkpointing, B, S, model, targets, lora extras, parallel, world)
ROWS = [
    ("llama", "bf16", False, 2, 256, SMALL, LIN + ["lm_head"], {}, "single", 1),
    ("llama", "bf16", GC, 2, 256, SMALL, LIN + ["lm_head"], {}, "single", 1),
    ("llama", "fp32", False, 2, 192, SMALL, LIN + ["lm_head"], {}, "single", 1),
    ("llama", "amp_bf16", GC, 2, 192, SMALL, LIN + ["lm_head"], {}, "single", 1),
    ("llama", "bf16", GC, 2, 256, SMALL, LIN + ["embed_tokens"], {}, "single", 1),
    ("llama", "bf16", False, 1, 384, SMALL, ["q_proj", "v_proj", "lm_head", "embed_tokens"],
     {"autocast_adapter_dtype": False}, "single", 1),
    ("llama", "bf16", False, 2, 256, SMALL, ["q_proj", "v_proj", "lm_head", "embed_tokens"],
     {"lora_dropout": 0.05}, "single", 1),
    ("llama", "fp32", GC, 2, 256, SMALL, ["lm_head", "embed_tokens"], {}, "single", 1),
    ("llama", "bf16", False, 2, 256, SMALL, LIN, {"modules_to_save": ["embed_tokens", "lm_head"]},
     "single", 1),
    ("llama", "bf16", False, 2, 256, SMALL, LIN + ["embed_tokens"], {"modules_to_save": ["lm_head"]},
     "single", 1),
    ("qwen2", "bf16", False, 2, 256, dict(SMALL, tied=True), LIN + ["lm_head"], {}, "single", 1),
    ("qwen2", "bf16", GC, 2, 256, dict(SMALL, tied=True), LIN + ["lm_head", "embed_tokens"], {},
     "single", 1),
    ("qwen2", "fp32", False, 2, 192, SMALL, ["embed_tokens"], {}, "single", 1),
    ("llava", "bf16", False, 1, 256, SMALL, LIN + ["lm_head"], {}, "single", 1),
    ("llava", "bf16", GC, 2, 256, SMALL, LIN + ["lm_head", "embed_tokens"], {}, "single", 1),
    ("qwen2_vl", "bf16", False, 1, 256, SMALL, LIN + ["lm_head"], {}, "single", 1),
    ("gemma3", "bf16", False, 1, 128, {}, LIN + ["lm_head", "embed_tokens"], {}, "single", 1),
    ("llama", "bf16", False, 2, 256, SMALL, LIN + ["lm_head"], {}, "ddp", 2),
    ("llama", "bf16", GC, 2, 256, SMALL, LIN + ["lm_head", "embed_tokens"], {}, "zero2", 2),
    ("llama", "bf16", False, 2, 256, SMALL, LIN + ["lm_head", "embed_tokens"], {}, "zero3", 2),
    ("llama", "bf16", False, 2, 256, SMALL, LIN + ["lm_head", "embed_tokens"], {}, "fsdp2", 2),
    ("qwen2", "fp32", GC, 2, 256, dict(SMALL, tied=True), LIN + ["lm_head"], {}, "fsdp1", 2),
]
POPT = {"ddp": {"bucket_cap_mb": 25, "gradient_as_bucket_view": False},
        "fsdp1": {"use_orig_params": True, "mixed_precision": None},
        "fsdp2": {"reshard_after_forward": True, "mixed_precision": None}}


def setups():
    import truth
    out = []
    for fam, prec, gc_, B, S, model, targets, extra, par, world in ROWS:
        k, img = (1, tuple(truth.FAM_GRID[fam][1][0])) if truth.FAM_GRID[fam][1][0] else (0, None)
        lora = dict({"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": list(targets),
                     "on": "language"}, **extra)
        popt = POPT.get(par)
        s = truth.make_setup(fam, "lora", prec, "sdpa", gc_, B, S, k, img, "adamw_torch", par, world,
                             popt=popt, model=dict(model), lora=lora, seed=23)
        s["cuda_mixed_add"] = True      # emul_peft.py: no CPU promotion copy in PEFT's sums
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-%s-%d-lora-%s-lorahead-%s" % (fam, par, world, prec,
                                                    hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out


def all_setups():
    """the one generator truth.py config_list calls"""
    return setups()
