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


def all_setups():
    """the one generator truth.py config_list calls"""
    return setups()
