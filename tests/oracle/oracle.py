#!/usr/bin/python3
"""CPU ground truth for mmguard: exact peak live tensor bytes of one
steady-state training step of a small LLaVA-style model.

Usage (run with the Debian torch: /usr/bin/python3):
  oracle.py generate [--out tests/oracle/data/cpu_oracle.jsonl] [--count N] [--seed S]
  oracle.py run SPEC.json [--mode M]      measure one mmguard spec (JSON), print JSON

See docs/oracle.md for what is emulated and why.
"""
import argparse
import gc
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:  # pragma: no cover
    print("oracle: skipped: torch not available (run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(0 if os.environ.get("MMGUARD_ORACLE_SKIP_OK") else 2)

import memcount  # noqa: E402
import model as M  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODES = ("pretrain", "finetune", "full", "lora")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# --------------------------------------------------------------------------
def build(spec):
    """Build model + optimizer from an mmguard spec dict (oracle subset)."""
    mods = {m["type"]: m for m in spec["modules"]}
    vit, proj, llm = mods["vit"], mods["mlp"], mods["llama"]
    tr = spec["training"]
    attn = tr.get("attention", "eager")
    dtype = DTYPES[tr.get("precision", "fp32")]
    torch.manual_seed(0)
    model = M.Llava(vit, proj, llm, attn)
    # LoRA adapters (PEFT): wrap target linears of the language model
    lora = llm.get("lora")
    if lora:
        targets = set(lora.get("target_modules", LORA_TARGETS))
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name, child in list(parent.named_children()):
                    if name in targets and isinstance(child, torch.nn.Linear):
                        setattr(parent, name, M.LoraLinear(child, lora["r"], lora["alpha"],
                                                           lora.get("dropout", 0.05)))
    model.to(dtype)
    model.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.float()
    # trainable flags
    model.requires_grad_(False)
    vit_tr = vit.get("trainable", True)
    for p in model.vision_tower.parameters():
        p.requires_grad_(vit_tr)
    for p in model.mm_projector.parameters():
        p.requires_grad_(proj.get("trainable", True))
    llm_tr = llm.get("trainable", True)
    for n, p in list(model.model.named_parameters()) + list(model.lm_head.named_parameters()):
        p.requires_grad_(llm_tr)
    if lora:
        for n, p in model.model.named_parameters():
            if "lora_" in n:
                p.requires_grad_(True)
    model.vision_no_grad = not vit_tr
    gc_on = bool(tr.get("gradient_checkpointing", False))
    if gc_on:
        # HF gradient_checkpointing_enable(): every module with the flag
        model.model.gradient_checkpointing = True
        model.vision_tower.gradient_checkpointing = True
        # LLaVA train.py: model.enable_input_require_grads()
        model.model.embed_tokens.register_forward_hook(
            lambda mod, inp, out: out.requires_grad_(True))
    model.train()
    opt = M.AdamW2x(M.hf_param_groups(model))
    return model, opt


def make_inputs(spec, seed=1):
    mods = {m["type"]: m for m in spec["modules"]}
    vit, llm = mods["vit"], mods["llama"]
    tr = spec["training"]
    dtype = DTYPES[tr.get("precision", "fp32")]
    b, s, n_img = tr["micro_batch_size"], tr["seq_len"], tr.get("images_per_sample", 1)
    P = (vit["image_size"] // vit["patch_size"]) ** 2
    g = torch.Generator().manual_seed(seed)
    n_text = s - n_img * P
    assert n_text >= 2, "seq_len too small for the image tokens"
    L = n_text + n_img
    ids = torch.randint(3, llm["vocab_size"], (b, L), generator=g)
    # image placeholders after a short prefix, spread over the sequence
    for i in range(n_img):
        ids[:, min(L - 1, 4 + i * max(1, (n_text // max(1, n_img)))) + 0] = M.IMAGE_TOKEN_INDEX
    ids[:, 0] = 1
    assert int((ids == M.IMAGE_TOKEN_INDEX).sum()) == b * n_img
    labels = ids.clone()
    labels[labels == M.IMAGE_TOKEN_INDEX] = M.IGNORE_INDEX
    labels[:, :2] = M.IGNORE_INDEX
    attention_mask = torch.ones((b, L), dtype=torch.bool)
    images = None
    if n_img > 0:
        images = torch.randn((b * n_img, vit.get("num_channels", 3), vit["image_size"], vit["image_size"]),
                             generator=g).to(dtype)
    return (ids, labels, attention_mask, images, n_img)


def one_step(model, opt, inputs, ext=None):
    res = {}
    if ext is not None:
        gc.collect()
        ext.reset_peak()
        res["start_bytes"] = ext.live()
    loss = model(*inputs)
    if ext is not None:
        res["fwd_peak"] = ext.reset_peak()
        res["fwd_end"] = ext.live()
    loss.backward()
    lval = float(loss)
    del loss  # HF Trainer: graph freed when training_step returns
    if ext is not None:
        res["bwd_peak"] = ext.reset_peak()
    opt.step()
    opt.zero_grad()
    if ext is not None:
        res["opt_peak"] = ext.reset_peak()
        res["end_bytes"] = ext.live()
    res["loss"] = lval
    return res


def measure(spec):
    ext = memcount.load()
    ext.install()
    torch.set_num_threads(int(os.environ.get("MMGUARD_ORACLE_THREADS", "2")))
    t0 = time.time()
    model, opt = build(spec)
    inputs = make_inputs(spec)
    one_step(model, opt, inputs)             # warm-up: optimizer states now exist
    r = one_step(model, opt, inputs, ext)    # measured steady-state step
    phases = {"forward": r["fwd_peak"], "backward": r["bwd_peak"], "optimizer": r["opt_peak"]}
    peak_phase = max(phases, key=lambda k: phases[k])
    nparams = sum(p.numel() for p in model.parameters())
    ntrain = sum(p.numel() for p in model.parameters() if p.requires_grad)
    states = sum(t.numel() * t.element_size() for st in opt.state.values()
                 for t in st.values() if torch.is_tensor(t))
    out = {
        "peak_bytes": max(phases.values()),
        "phase_peak_bytes": phases,
        "peak_phase": peak_phase,
        "start_bytes": r["start_bytes"],
        "saved_bytes": r["fwd_end"] - r["start_bytes"],
        "end_bytes": r["end_bytes"],
        "param_count": nparams,
        "trainable_param_count": ntrain,
        "optimizer_state_bytes": states,
        "loss": round(r["loss"], 4),
    }
    measure.last_seconds = time.time() - t0
    del model, opt, inputs
    gc.collect()
    return out


# --------------------------------------------------------------------------
def make_spec(cid, mode, attn, gc_on, prec, rnd):
    """One random config of the given combination (mmguard spec schema)."""
    for _ in range(1000):
        h = rnd.choice([256, 384, 512, 768, 1024])
        hd = rnd.choice([32, 64]) if h <= 512 else 64
        heads = h // hd
        kv = heads
        if rnd.random() < 0.5:
            for g in rnd.sample([2, 4], 2):
                if heads % g == 0:
                    kv = heads // g
                    break
        inter = rnd.choice([2 * h, int(h * 8 / 3) // 64 * 64, int(2.6875 * h) // 64 * 64])
        nl = rnd.choice([1, 2, 2, 3])
        vocab = rnd.choice([4096, 8192, 16000, 32000])
        dv = rnd.choice([128, 256, 384])
        vl = rnd.choice([2, 3])
        img, patch = rnd.choice([(64, 16), (112, 14), (224, 16), (224, 14), (336, 14)])
        P = (img // patch) ** 2
        n_img = rnd.choice([1, 1, 2]) if mode == "pretrain" else rnd.choice([0, 1, 1, 2])
        b = rnd.randint(1, 8)
        lo = max(64, n_img * P + 16)
        if lo > 1500:
            continue
        s = rnd.randint(lo, min(1500, lo + rnd.choice([64, 256, 768, 1500])))
        N = b * s
        macs = N * nl * (h * (heads * hd) * 2 + h * kv * hd * 2 + 3 * h * inter)
        macs += b * heads * s * s * hd * 2 * nl
        macs += N * h * vocab
        vt = b * n_img * (P + 1)
        macs += vt * vl * (12 * dv * dv) + b * n_img * (dv // 64) * (P + 1) ** 2 * 64 * 2 * vl
        cap = 20e9 if prec == "fp32" else 50e9
        if macs > cap:
            continue
        if attn == "eager" and b * heads * s * s * 16 > 3e9:
            continue
        if N * vocab * 4 * 4 > 4e9:
            continue
        break
    else:
        raise RuntimeError("no config found")
    llm = {"name": "language_model", "type": "llama", "hidden_size": h, "num_hidden_layers": nl,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "intermediate_size": inter, "vocab_size": vocab, "tie_word_embeddings": False,
           "trainable": mode in ("finetune", "full")}
    if mode == "lora":
        r = rnd.choice([8, 16, 64])
        llm["lora"] = {"r": r, "alpha": 2 * r, "dropout": rnd.choice([0.0, 0.05, 0.05]),
                       "target_modules": list(LORA_TARGETS) if rnd.random() < 0.7
                       else ["q_proj", "v_proj"]}
    spec = {
        "name": cid,
        "modules": [
            {"name": "vision_tower", "type": "vit", "hidden_size": dv, "num_hidden_layers": vl,
             "num_attention_heads": dv // 64, "intermediate_size": 4 * dv, "image_size": img,
             "patch_size": patch, "num_channels": 3, "select_layer": -2, "hidden_act": "quick_gelu",
             "trainable": mode == "full"},
            {"name": "projector", "type": "mlp", "input_size": dv, "hidden_size": h,
             "num_layers": 2, "activation": "gelu", "trainable": True},
            llm,
        ],
        "training": {"micro_batch_size": b, "seq_len": s, "images_per_sample": n_img,
                     "precision": prec, "master_weights": "none", "optimizer": "adamw",
                     "optimizer_impl": "foreach", "zero_stage": 0, "data_parallel": 1,
                     "gradient_accumulation_steps": 1, "gradient_checkpointing": gc_on,
                     "attention": attn},
        "framework": {"transformers_version": "4.46", "torch_version": "2.4"},
    }
    return spec


def torch_version():
    """Debian's python3-torch 1.13.1 reports __version__ 1.13.0a0: prefer the package version."""
    import subprocess
    try:
        v = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3-torch"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True).stdout.strip()
        if v:
            return v.split("+")[0]
    except OSError:
        pass
    return torch.__version__


def config_list(count, seed):
    rnd = random.Random(seed)
    combos = []
    for mode in MODES:
        for prec in ("bf16", "fp32"):
            for attn in ("eager", "sdpa", "flash"):
                if prec == "fp32" and attn == "flash":
                    continue  # flash-attn has no fp32 kernels
                for gc_on in (False, True):
                    combos.append((mode, attn, gc_on, prec))
    out = []
    i = 0
    while len(out) < count:
        mode, attn, gc_on, prec = combos[i % len(combos)]
        cid = "cpu-%03d-%s-%s-%s-%s" % (len(out), mode, attn, "gc" if gc_on else "nogc", prec)
        out.append((cid, mode, make_spec(cid, mode, attn, gc_on, prec, rnd)))
        i += 1
    return out


def mode_of(spec):
    mods = {m["type"]: m for m in spec["modules"]}
    if mods["vit"].get("trainable", True):
        return "full"
    if mods["llama"].get("lora"):
        return "lora"
    return "finetune" if mods["llama"].get("trainable", True) else "pretrain"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", default=os.path.join(HERE, "data", "cpu_oracle.jsonl"))
    g.add_argument("--count", type=int, default=160)
    g.add_argument("--seed", type=int, default=20251121)
    g.add_argument("--only", default=None, help="regex on config ids")
    r = sub.add_parser("run")
    r.add_argument("spec")
    a = ap.parse_args()
    if a.cmd == "run":
        with open(a.spec) as f:
            spec = json.load(f)
        print(json.dumps({"mode": mode_of(spec), "measured": measure(spec)}, indent=1))
        return 0
    import re
    cfgs = config_list(a.count, a.seed)
    if a.only:
        cfgs = [c for c in cfgs if re.search(a.only, c[0])]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    t0 = time.time()
    tver = torch_version()
    with open(tmp, "w") as f:
        for n, (cid, mode, spec) in enumerate(cfgs):
            meas = measure(spec)
            rec = {"id": cid, "mode": mode, "spec": spec, "measured": meas,
                   "torch": tver}
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
            print("[%3d/%d] %-40s peak %12d (%s) %.1fs" % (n + 1, len(cfgs), cid, meas["peak_bytes"],
                                                         meas["peak_phase"], measure.last_seconds), flush=True)
    os.replace(tmp, a.out)
    print("oracle: wrote %d configs to %s in %.0f s" % (len(cfgs), a.out, time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
