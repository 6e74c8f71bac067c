"""Truth configs: FSDP1 with PEFT's fsdp_auto_wrap_policy (issue 23).

peft/utils/other.py fsdp_auto_wrap_policy (PEFT 0.21.2 :1271-1308) is the
_or_policy of transformer_auto_wrap_policy over the model's _no_split_modules
and lambda_policy_fn (:1294-1299): every leaf module whose `weight` requires
grad.  With LoRA those leaves are each adapter's lora_A / lora_B Linear (and a
trainable connector's Linears): each one its own FlatParameter unit nested in
its layer's (or the root's) unit, so the layer's flat parameter holds the
frozen weights only.  PEFT's examples/sft/configs/fsdp_config.yaml runs it with
fsdp_use_orig_params false; a use_orig_params true row is here too.  The
harness applies PEFT's own function (truth.py, parallel_options.wrap_policy).
Small (2 layers, B 1, S 128): 2 shared CPU cores.
"""
import hashlib
import json

GC = {"use_reentrant": False, "every_n_layers": 1}

# (family, precision, gc, use_orig_params)
ROWS = [
    ("llama", "bf16", False, False),
    ("llama", "bf16", GC, False),
    ("llama", "fp32", False, False),
    ("llama", "fp32", GC, True),
    ("llava", "bf16", False, False),
    ("llava", "bf16", GC, False),
    ("llava", "fp32", GC, False),
    ("llava", "fp32", False, True),
]


def setups():
    import truth
    out = []
    for fam, prec, gc_, orig in ROWS:
        k, img = (1, (112, 112)) if fam == "llava" else (0, None)
        model = {"layers": 2} if fam == "llama" else {"image": 112, "layers": 2}
        popt = {"use_orig_params": orig, "mixed_precision": None, "wrap_policy": "peft_lora"}
        s = truth.make_setup(fam, "lora", prec, "sdpa", gc_, 1, 128, k, img, "adamw_torch", "fsdp1", 2,
                             popt=popt, model=model, seed=29)
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-fsdp1-2-lora-%s-wrap-peft-%s" % (fam, prec, hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out


# ---- size-based auto-wrap (issue 23) ----------------------------------------------------
# torch/distributed/fsdp/wrap.py size_based_auto_wrap_policy (:341-397) under
# _recursive_wrap (:488-563, only_wrap_children for the root, _wrap_utils.py:76-102), as
# accelerate's SIZE_BASED_WRAP builds it (accelerate/utils/dataclasses.py:2102-2105;
# truth.py applies the same partial).  The test Llama (hidden 256, intermediate 688,
# vocab 32000, untied): q/o 65536, k/v 32768 -> self_attn 196608; each MLP Linear 176128
# -> mlp 528384; a layer 725504; embed_tokens and lm_head 8192000 each.  min_num_params:
#   150000  self_attn and each MLP Linear their own units (sub-layer)
#   300000  each mlp a unit; the layers' attention and norms in the LlamaModel unit
#   600000  one unit per decoder layer; embed_tokens and lm_head units; the root: norm
#  1000000  the LlamaModel unit holds both layers and the norm (ModuleList: never a unit)
#  2000000  embed_tokens and lm_head units; the layers and the norm in the root
#  9000000  the LlamaModel unit holds embed_tokens, the layers and the norm; lm_head: root
# 20000000  nothing wrapped: one root unit
SIZE_ROWS = [
    # (mode, precision, gc, use_orig_params, min_num_params, fsdp mixed_precision)
    ("full", "bf16", False, False, 600000, None),
    ("full", "bf16", GC, False, 600000, None),
    ("full", "bf16", False, False, 300000, None),
    ("full", "bf16", GC, False, 300000, None),
    ("full", "bf16", False, False, 150000, None),
    ("full", "bf16", False, False, 1000000, None),
    ("full", "bf16", GC, False, 1000000, None),
    ("full", "bf16", False, False, 2000000, None),
    ("full", "bf16", False, False, 9000000, None),
    ("full", "bf16", False, False, 20000000, None),
    ("full", "fp32", False, True, 600000, "bf16"),
    ("lora", "bf16", False, True, 600000, None),
    ("lora", "bf16", GC, True, 300000, None),
    ("lora", "bf16", False, True, 2000000, None),
    ("lora", "fp32", GC, True, 600000, None),
    # LoRA Linears' base_layer units: 150000 each MLP base_layer (176128; its lora.Linear's
    # remainder, the adapters, is the LlamaModel's with the attention); 100000 the same,
    # and each self_attn with its adapters
    ("lora", "bf16", False, True, 150000, None),
    ("lora", "bf16", GC, True, 100000, None),
]


# four layers, two sequences of 256, SHARD_GRAD_OP: the same units at other sizes (a layer
# 725504, the four 2902016: min 3000000 leaves them and the norm in the root)
SIZE_ROWS_4 = [
    # (mode, precision, gc, use_orig_params, min_num_params, fsdp mixed_precision, sharding)
    ("full", "bf16", False, False, 600000, None, "FULL_SHARD"),
    ("full", "bf16", GC, False, 1000000, None, "FULL_SHARD"),
    ("full", "bf16", False, False, 300000, None, "FULL_SHARD"),
    ("full", "bf16", False, False, 3000000, None, "FULL_SHARD"),
    ("full", "bf16", False, False, 1000000, None, "SHARD_GRAD_OP"),
    ("full", "fp32", False, False, 1000000, "bf16", "FULL_SHARD"),
    ("lora", "bf16", GC, True, 1000000, None, "FULL_SHARD"),
    ("lora", "fp32", False, True, 300000, None, "FULL_SHARD"),
]


# other decoders (2 layers, B 1, S 128).  Qwen2 (qkv bias; a layer 1203072, its MLP
# 1038336, each MLP Linear 346112, attention 164224, embed_tokens 2785280): 1100000 one
# unit a layer; 300000 each MLP Linear, the attention and norms in the Qwen2Model unit;
# 3000000 the Qwen2Model unit with the embedding.  Mixtral (transformers 5's fused
# MixtralExperts, 1376256 in two Parameters; a layer 1418496): 1400000 one unit a layer;
# 500000 and 1000000 the experts module (its Parameters are no modules); 3000000 nothing.
SIZE_ROWS_FAM = [
    # (family, mode, precision, gc, use_orig_params, min_num_params)
    ("qwen2", "full", "bf16", False, False, 1100000),
    ("qwen2", "full", "bf16", False, False, 300000),
    ("qwen2", "full", "bf16", GC, False, 3000000),
    ("qwen2", "lora", "bf16", False, True, 300000),
    ("mixtral", "full", "bf16", False, False, 1400000),
    ("mixtral", "full", "bf16", False, False, 1000000),
    ("mixtral", "full", "bf16", GC, False, 500000),
    ("mixtral", "full", "fp32", False, False, 3000000),
]


def size_setups():
    import truth
    out = []
    rows = [r + ("FULL_SHARD", 2, 1, 128) for r in SIZE_ROWS] + [r + (4, 2, 256) for r in SIZE_ROWS_4]
    for mode, prec, gc_, orig, n, mp, shard, layers, B, S in rows:
        popt = {"use_orig_params": orig, "mixed_precision": mp, "wrap_policy": "size", "min_num_params": n}
        if shard != "FULL_SHARD":
            popt["sharding"] = shard
        s = truth.make_setup("llama", mode, prec, "sdpa", gc_, B, S, 0, None, "adamw_torch", "fsdp1", 2,
                             popt=popt, model={"layers": layers}, seed=31)
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "llama-fsdp1-2-%s-%s-wrap-size%d-%s" % (mode, prec, n, hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    for fam, mode, prec, gc_, orig, n in SIZE_ROWS_FAM:
        popt = {"use_orig_params": orig, "mixed_precision": None, "wrap_policy": "size", "min_num_params": n}
        s = truth.make_setup(fam, mode, prec, "sdpa", gc_, 1, 128, 0, None, "adamw_torch", "fsdp1", 2,
                             popt=popt, model={"layers": 2}, seed=31)
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-fsdp1-2-%s-%s-wrap-size%d-%s" % (fam, mode, prec, n, hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out


def all_setups():
    """the one generator truth.py config_list calls"""
    return setups() + size_setups()
