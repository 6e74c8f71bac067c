"""Truth rows for the keys of issue 23 owned by the keys helper.

training.loss_upcast: false -- a custom loop that calls nn.CrossEntropyLoss on the model's 16-bit
logits, without transformers' upcast.  transformers 5.17 ForCausalLMLoss (loss/loss_utils.py:49-71)
starts with `logits = logits.float()` (:59); these rows give the model (its `loss_function`
setter, modeling_utils.py:4642-4644) the same function without that line, so the labels are padded
and shifted as before and F.cross_entropy runs on the bf16 logits.  No autocast rows: CUDA's autocast runs log_softmax
with dtype=float32 (ATen/autocast_mode.h AT_FORALL_FP32_SET_OPT_DTYPE), CPU's autocast leaves it in
bf16 and casts nll_loss's input instead, so a CPU row would not show the CUDA step (the spec
refuses loss_upcast false under autocast).

    all_setups()    the rows, called by ONE line of truth.py config_list
    no_upcast(model) installs the loss without the upcast (truth.py run_rank, setup loss_upcast False)
"""
import hashlib
import json

GC = {"use_reentrant": False, "every_n_layers": 1}
# (family, mode, precision, attention, checkpointing, B, S, model)
NO_UPCAST_ROWS = [
    ("llama", "full", "bf16", "sdpa", False, 2, 256, {"hidden": 128, "layers": 2, "vocab": 16384}),
    ("llama", "full", "bf16", "sdpa", GC, 2, 256, {"hidden": 128, "layers": 2, "vocab": 16384}),
    ("llama", "lora", "bf16", "sdpa", False, 2, 256, {"hidden": 128, "layers": 2, "vocab": 16384}),
    ("llama", "lora", "bf16", "eager", GC, 1, 384, {"hidden": 128, "layers": 2, "vocab": 16384}),
    ("qwen2", "full", "bf16", "sdpa", False, 2, 256, {"hidden": 128, "layers": 2}),
    ("qwen2", "lora", "bf16", "sdpa", GC, 2, 256, {"hidden": 128, "layers": 2}),
    ("llava", "finetune", "bf16", "sdpa", False, 1, 256, {"hidden": 128, "layers": 2}),
    ("llava", "finetune", "bf16", "sdpa", GC, 1, 256, {"hidden": 128, "layers": 2, "vocab": 16384}),
    ("llava", "lora", "bf16", "sdpa", False, 2, 256, {"hidden": 128, "layers": 2, "vocab": 16384}),
]


def no_upcast(model):
    import torch.nn as nn

    def loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
             **kwargs):
        # ForCausalLMLoss (loss_utils.py:49-71) without `logits = logits.float()` (:59)
        from transformers.loss.loss_utils import fixed_cross_entropy
        if shift_labels is None:
            labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1).to(logits.device)
        return fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)
    model.loss_function = loss


def no_upcast_setups():
    import truth
    out = []
    for fam, mode, prec, attn, gc_, B, S, model in NO_UPCAST_ROWS:
        k, img = (1, (112, 112)) if fam == "llava" else (0, None)
        s = truth.make_setup(fam, mode, prec, attn, gc_, B, S, k, img, "adamw_torch", "single", 1,
                             model=model, seed=23)
        s["loss_upcast"] = False
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-single-1-%s-%s-%s-noupcast-%s" % (fam, mode, prec, attn,
                                                         hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out


def all_setups():
    """the one generator truth.py config_list calls"""
    return no_upcast_setups()
