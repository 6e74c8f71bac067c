#!/usr/bin/env python3
"""tests/presets/presets.py - the shipped model presets (contrib/models) against facts.

  presets.py check          every check below; exit 1 when one fails
  presets.py doc            print docs/models.md as it must read
  presets.py doc --write    rewrite docs/models.md

Environment: MMGUARD (default build/mmguard), IMPORT_DATA (default tests/fixtures/import, the
published configs and recipe files; relative to the repository root, where this runs).

What `check` asserts, for every contrib/models/*.yaml (a preset without facts here fails):
  - it predicts (`mmguard predict PRESET --json`, exit 0);
  - parameters_count is the model's exact count (FACTS below: transformers' count of the
    model built from its config, with its source), plus the LoRA adapters its recipe adds;
  - where the model's checkpoint index is published in IMPORT_DATA (its metadata.total_size,
    every tensor in one 2-byte dtype), the exact count is total_size / 2;
  - trainable_count is what its mode trains: the trainable modules' exact counts, and for
    LoRA the adapters, r * (in + out) summed over the targeted linear layers, computed here
    from the config's dimensions (not from mmguard);
  - its HF id is in contrib/models/catalog.txt, `mmguard import --hf ID` resolves it with no
    network and gives the model's exact count;
  - where its config is published in IMPORT_DATA, its modules are the ones `mmguard import
    --hf` writes (the recipe's own keys aside: trainable, image_processor, lora, ...);
  - round trips: where the recipe's files are published in IMPORT_DATA, importing the HF
    config with them predicts the preset within 0.1 % (peak and allocated peak);
  - the catalog from a spec: `hf_config: ID`, `llamafactory: FILE` alone, and a trainer
    file's `model_name_or_path` predict;
  - docs/models.md is what `presets.py doc` prints.
Only the standard library: this runs on the build machine.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

MM = os.environ.get("MMGUARD", "build/mmguard")
DATA = os.environ.get("IMPORT_DATA", "tests/fixtures/import")
MODELS = "contrib/models"
DOC = "docs/models.md"

# ---- facts -----------------------------------------------------------------------------
# Exact parameter counts: transformers 5.17.0, the model built on the meta device from its
# config (/work/scratch/catalog/<model>.json "params", made by count_params.py there), unless
# said otherwise; for the ones with `index`, check_index holds it to total_size / 2 of the
# published checkpoint index (IMPORT_DATA/<index>/model.safetensors.index.json).  Per-module counts are the same
# script's (model.<child> + lm_head).
#
# LoRA layers: (in, out) of each targeted nn.Linear in one layer, from the config.


def decoder_linears(h, heads, kv, head_dim, inter):
    return {"q_proj": (h, heads * head_dim), "k_proj": (h, kv * head_dim),
            "v_proj": (h, kv * head_dim), "o_proj": (heads * head_dim, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def siglip_linears(h, inter):
    return {"q_proj": (h, h), "k_proj": (h, h), "v_proj": (h, h), "out_proj": (h, h),
            "fc1": (h, inter), "fc2": (inter, h)}


ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def adapters(linears, r, layers, targets):
    """PEFT LoRA: A is r x in, B is out x r, for each targeted linear of each layer"""
    return layers * sum(r * (linears[t][0] + linears[t][1]) for t in targets)


# LLaVA-1.5 (liuhaotian, vocab 32000): count_params.py on llava-hf/llava-1.5-7b-hf's config
# (tests/fixtures/import/llava-1.5-7b-hf) with text_config.vocab_size 32000, and for 13B also
# hidden 5120, 40 layers, 40 heads, intermediate 13824 (vicuna-13b-v1.5): transformers 5.17.0.
# The decoders' LoRA layers: lmsys/vicuna-{7,13}b-v1.5's config.json.
LLAVA = {
    "7b": dict(vision=303507456, projector=20979712, lm=6607343616 + 131072000,
               dec=decoder_linears(4096, 32, 32, 128, 11008), layers=32),
    "13b": dict(vision=303507456, projector=31467520, lm=12852024320 + 163840000,
                dec=decoder_linears(5120, 40, 40, 128, 13824), layers=40),
}
LLAVA_SRC = ("transformers 5.17.0 meta-device count of llava-hf/llava-1.5-7b-hf's config with "
             "vicuna's vocab 32000 (LLaVA adds no token for v1.5)")


def llava(size, mode):
    """finetune: projector + LLM; lora: projector + r 128 adapters on the 7 projections
    (scripts/v1_5/finetune_lora.sh); pretrain: the projector"""
    c = LLAVA[size]
    f = dict(id=f"liuhaotian/llava-v1.5-{size}", params=c["vision"] + c["projector"] + c["lm"],
             src=LLAVA_SRC, trainable=c["projector"] + (c["lm"] if mode == "finetune" else 0))
    if mode == "lora":
        f["adapters"] = adapters(c["dec"], 128, c["layers"], ALL7)
    return f


FACTS = {
    # preset: hf id, exact base count, its source, trainable (exact), adapters (exact)
    **{f"llava-1.5-{s}-{m}.yaml": llava(s, m)
       for s in LLAVA for m in ("finetune", "lora", "pretrain")},
    "qwen2-vl-7b-full.yaml": dict(
        id="Qwen/Qwen2-VL-7B-Instruct", params=8291375616, index="qwen2-vl-7b-instruct",
        src="catalog qwen2-vl-7b-instruct.json; the published checkpoint index",
        trainable=7070619136 + 544997376),  # language_model + lm_head
    "qwen2.5-vl-7b-full.yaml": dict(
        id="Qwen/Qwen2.5-VL-7B-Instruct", params=8292166656, index="qwen2.5-vl-7b-instruct",
        src="catalog qwen2.5-vl-7b-instruct.json; the published checkpoint index",
        trainable=44574464 + 7070619136 + 544997376),  # visual.merger + language model
    "qwen2.5-vl-7b-lora.yaml": dict(
        id="Qwen/Qwen2.5-VL-7B-Instruct", params=8292166656, index="qwen2.5-vl-7b-instruct",
        src="catalog qwen2.5-vl-7b-instruct.json; the published checkpoint index",
        adapters=adapters(decoder_linears(3584, 28, 4, 128, 18944), 8, 28, ALL7), trainable=0),
    "qwen2.5-vl-72b-lora.yaml": dict(
        id="Qwen/Qwen2.5-VL-72B-Instruct", params=73410777344,
        src="catalog qwen2.5-vl-72b-instruct.json (a reconstructed config)",
        adapters=adapters(decoder_linears(8192, 64, 8, 128, 29568), 8, 80, ALL7), trainable=0),
    # the spec's connector holds visual.merger + the 3 DeepStack mergers; the recipe trains
    # the merger only (deepstack_trainable: false)
    "qwen3-vl-8b-full.yaml": dict(
        id="Qwen/Qwen3-VL-8B-Instruct", params=8767123696,
        src="catalog qwen3-vl-8b-instruct.json",
        trainable=40119040 + 7568405504 + 622329856),
    "qwen3-vl-30b-a3b-full.yaml": dict(
        id="Qwen/Qwen3-VL-30B-A3B-Instruct", params=31070754032,
        src="catalog qwen3-vl-30b-a3b-instruct.json",
        trainable=30679808 + 30220957696 + 311164928),
    # catalog internvl3-8b.json (the converted InternVLConfig)
    "internvl3-8b-full.yaml": dict(
        id="OpenGVLab/InternVL3-8B", params=7944373760, index="internvl3-8b",
        src="catalog internvl3-8b.json; the published checkpoint index",
        trainable=27540480 + 7069221376 + 543599616),  # projector + language model
    # everything trains but SigLIP's post_layernorm (2 x 1152): the features are the last
    # layer's output before it (vision_feature_layer -1), so it gets no gradient
    "llava-onevision-qwen2-7b-ov.yaml": dict(
        id="llava-hf/llava-onevision-qwen2-7b-ov-hf", params=8030807584,
        src="catalog llava-onevision-qwen2-7b-ov-hf.json (a reconstructed config)",
        trainable=8030807584 - 2 * 1152),
    "gemma-3-27b-qlora.yaml": dict(
        id="google/gemma-3-27b-it", params=27432406640, src="catalog gemma-3-27b-it.json",
        adapters=adapters(decoder_linears(5376, 32, 16, 128, 21504), 16, 62, ALL7)
        + adapters(siglip_linears(1152, 4304), 16, 27, ["q_proj", "k_proj", "v_proj",
                                                         "out_proj", "fc1", "fc2"]),
        # modules_to_save: trainable copies of embed_tokens and of the (tied) lm_head
        saved=2 * 262208 * 5376, trainable=0),
    "llama-3.2-11b-vision-full.yaml": dict(
        id="meta-llama/Llama-3.2-11B-Vision-Instruct", params=10670220835,
        src="catalog llama-3.2-11b-vision-instruct.json", trainable=10670220835),
    "smolvlm-qlora.yaml": dict(
        id="HuggingFaceTB/SmolVLM-Instruct", params=2246272880,
        src="catalog smolvlm-instruct.json (a reconstructed config)",
        adapters=adapters(decoder_linears(2048, 32, 32, 64, 8192), 8, 24, ALL7)
        + adapters(siglip_linears(1152, 4304), 8, 27, ["q_proj", "k_proj", "v_proj"]),
        trainable=0),
    "llama-3.1-8b-full.yaml": dict(
        id="meta-llama/Llama-3.1-8B-Instruct", params=8030261248,
        src="catalog llama-3.1-8b-instruct.json", trainable=8030261248),
    # LlavaForConditionalGeneration built on the meta device (transformers 5.17) from the
    # presets' geometry (a reconstructed config: PixtralVisionConfig's defaults, silu, and
    # Mistral-Nemo's text shapes; no published config.json is committed):
    # vision_tower 403,489,792 + projector 31,467,520 + language_model 11,576,693,760 + lm_head
    # 671,088,640
    "pixtral-12b-full.yaml": dict(
        id="mistral-community/pixtral-12b", params=12682739712,
        src="LlavaForConditionalGeneration of the presets' reconstructed config", trainable=12682739712),
    "pixtral-12b-lora.yaml": dict(
        id="mistral-community/pixtral-12b", params=12682739712,
        src="LlavaForConditionalGeneration of the presets' reconstructed config",
        adapters=adapters(decoder_linears(5120, 32, 8, 128, 14336), 16, 40, ALL7),
        trainable=31467520),  # the projector
    # attention adapters only: the spec cannot adapt MoE experts (the preset says so)
    "mixtral-8x7b-lora.yaml": dict(
        id="mistralai/Mixtral-8x7B-v0.1", params=46702792704,
        src="catalog mixtral-8x7b-instruct-v0.1.json (the base v0.1 has the same shapes)",
        adapters=adapters(decoder_linears(4096, 32, 8, 128, 14336), 64, 32,
                          ["q_proj", "k_proj", "v_proj", "o_proj"]),
        trainable=0),
}

# short recipe names for docs/models.md (each preset's header cites file and commit)
RECIPES = {
    "llava-1.5-7b-finetune.yaml": "LLaVA scripts/v1_5/finetune.sh",
    "llava-1.5-7b-lora.yaml": "LLaVA scripts/v1_5/finetune_lora.sh",
    "llava-1.5-7b-pretrain.yaml": "LLaVA scripts/v1_5/pretrain.sh",
    "llava-1.5-13b-finetune.yaml": "LLaVA scripts/v1_5/finetune.sh",
    "llava-1.5-13b-lora.yaml": "LLaVA scripts/v1_5/finetune_lora.sh",
    "llava-1.5-13b-pretrain.yaml": "LLaVA scripts/v1_5/pretrain.sh",
    "qwen2-vl-7b-full.yaml": "LLaMA-Factory qwen2vl_full_sft.yaml (Qwen's README)",
    "qwen2.5-vl-7b-full.yaml": "Qwen qwen-vl-finetune sft_7b.sh",
    "qwen2.5-vl-7b-lora.yaml": "LLaMA-Factory qwen2_5vl_lora_sft.yaml",
    "qwen2.5-vl-72b-lora.yaml": "none official; ms-swift device_map LoRA (stand-in)",
    "qwen3-vl-8b-full.yaml": "Qwen qwen-vl-finetune sft_qwen3_4b.sh (no 8B script)",
    "qwen3-vl-30b-a3b-full.yaml": "Qwen qwen-vl-finetune sft_30a3b.sh",
    "internvl3-8b-full.yaml": "InternVL internvl3_8b_dynamic_res_2nd_finetune_full.sh",
    "llava-onevision-qwen2-7b-ov.yaml": "LLaVA-NeXT finetune_ov.sh",
    "gemma-3-27b-qlora.yaml": "Google's Gemma vision QLoRA guide",
    "llama-3.2-11b-vision-full.yaml": "llama-cookbook finetune_vision_model.md",
    "smolvlm-qlora.yaml": "smollm Smol_VLM_FT.ipynb",
    "llama-3.1-8b-full.yaml": "torchtune llama3_1/8B_full.yaml",
    "mixtral-8x7b-lora.yaml": "mistral-finetune (example/7B.yaml settings)",
    "pixtral-12b-full.yaml": "none official; ZeRO-3 full fine-tune (stand-in)",
    "pixtral-12b-lora.yaml": "none official; LLaVA-style LoRA + projector (stand-in)",
}

# presets whose model config is published in IMPORT_DATA: their modules are the import's
PUBLISHED_CONFIG = {
    "qwen2-vl-7b-full.yaml": "qwen2-vl-7b-instruct",
    "qwen2.5-vl-7b-full.yaml": "qwen2.5-vl-7b-instruct",
    "qwen2.5-vl-7b-lora.yaml": "qwen2.5-vl-7b-instruct",
    "internvl3-8b-full.yaml": "internvl3-8b",
}
# keys a preset states from its recipe, not from the config
RECIPE_KEYS = {"trainable", "image_processor", "lora", "quantization", "experts_implementation",
               "output_router_logits", "attention"}


def round_trips():
    """(preset, import arguments): the recipe's files as published in IMPORT_DATA"""
    L, F = f"{DATA}/llava-scripts", f"{DATA}/llamafactory"
    return [
        # the published finetune.sh is the 13B one: its model_name_or_path goes through the catalog
        ("llava-1.5-13b-finetune.yaml", ["--args", f"@{L}/finetune_v1_5_flags.txt",
                                         "--deepspeed", f"{L}/zero3.json"]),
        # 7B: the same flags on the HF config (llava-hf pads the vocabulary to 32064; LLaVA's own
        # checkpoint, the preset's, has vicuna's 32000)
        ("llava-1.5-7b-finetune.yaml", ["--hf", f"{DATA}/llava-1.5-7b-hf",
                                        "--args", f"@{L}/finetune_v1_5_flags.txt",
                                        "--deepspeed", f"{L}/zero3.json",
                                        "--set", "language_model.vocab_size=32000"]),
        ("qwen2-vl-7b-full.yaml", ["--hf", f"{DATA}/qwen2-vl-7b-instruct",
                                   "--llamafactory", f"{F}/qwen2vl_full_sft.yaml",
                                   "--deepspeed", f"{F}/ds_z3_config.json"]),
        ("qwen2-vl-7b-full.yaml", ["--llamafactory", f"{F}/qwen2vl_full_sft.yaml",
                                   "--deepspeed", f"{F}/ds_z3_config.json"]),  # via the catalog
        ("qwen2.5-vl-7b-lora.yaml", ["--hf", f"{DATA}/qwen2.5-vl-7b-instruct",
                                     "--llamafactory", f"{F}/qwen2_5vl_lora_sft.yaml"]),
        ("qwen2.5-vl-7b-lora.yaml", ["--llamafactory", f"{F}/qwen2_5vl_lora_sft.yaml"]),
        # qwen2vl_lora_sft.yaml as published names Qwen2.5-VL-7B too
        ("qwen2.5-vl-7b-lora.yaml", ["--llamafactory", f"{F}/qwen2vl_lora_sft.yaml"]),
    ]


# ---- helpers ---------------------------------------------------------------------------
class Run:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = []

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL: {what}")
        return cond


def mm(*args, env=None):
    e = dict(os.environ)
    e["MMGUARD_CATALOG"] = os.path.abspath(MODELS)  # the shipped catalog, not an installed one
    if env:
        e.update(env)
    p = subprocess.run([MM, *args], capture_output=True, text=True, env=e)
    return p.returncode, p.stdout, p.stderr


def predict(path, *sets):
    args = ["predict", path, "--json"]
    for s in sets:
        args += ["--set", s]
    rc, out, err = mm(*args)
    if rc != 0:
        return None, (err or out).strip()
    return json.loads(out), ""


def strip_comment(v):
    """a YAML scalar or flow value without its trailing comment"""
    q = None
    for i, ch in enumerate(v):
        if q:
            q = None if ch == q else q
        elif ch in "\"'":
            q = ch
        elif ch == "#" and (i == 0 or v[i - 1] in " \t"):
            return v[:i].strip()
    return v.strip()


def read_preset(path):
    """the subset of YAML the presets use: top-level sections of `key: value` lines, and
    `modules:` as a list of such mappings; values are raw text (flow values kept whole)"""
    doc = {"modules": [], "_header": []}
    sec = None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("#"):
            doc["_header"].append(line[1:].strip())
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\S[^:]*):\s*(.*)$", line)
        if m:
            sec = m.group(1)
            val = strip_comment(m.group(2))
            if sec != "modules":
                doc[sec] = val if val else {}
            continue
        m = re.match(r"^  - (\w+):\s*(.*)$", line)
        if m and sec == "modules":
            doc["modules"].append({m.group(1): strip_comment(m.group(2))})
            continue
        m = re.match(r"^ {2,4}(\w+):\s*(.*)$", line)
        if m and sec == "modules" and doc["modules"]:
            doc["modules"][-1][m.group(1)] = strip_comment(m.group(2))
        elif m and isinstance(doc.get(sec), dict):
            doc[sec][m.group(1)] = strip_comment(m.group(2))
    return doc


def hf_id(doc):
    for h in doc["_header"]:
        if h.startswith("HF id:"):
            return h.split()[2]
    return None


def presets():
    return sorted(f for f in os.listdir(MODELS) if f.endswith(".yaml"))


def catalog():
    ids = {}
    for line in open(f"{MODELS}/catalog.txt"):
        w = line.split("#")[0].split()
        if len(w) == 2:
            ids[w[0]] = w[1]
    return ids


def close(a, b, what, run):
    for k in ("peak_bytes", "allocated_peak_bytes"):
        if not run.ok(abs(a[k] - b[k]) <= 0.001 * b[k],
                      f"{what}: {k} {a[k]} vs the preset's {b[k]} "
                      f"({100.0 * (a[k] - b[k]) / b[k]:+.3f} %)"):
            return


# ---- the checks ------------------------------------------------------------------------
def check(run):
    cat = catalog()
    names = presets()
    run.ok(set(names) == set(FACTS), f"contrib/models presets {sorted(set(names) ^ set(FACTS))} "
           "have no facts in tests/presets/presets.py (or the facts name a missing preset)")
    with tempfile.TemporaryDirectory(prefix="mmguard-presets.") as tmp:
        check_with_tmp(run, tmp, names, cat)


def check_with_tmp(run, tmp, names, cat):
    """every check that writes files, in the temporary directory tmp (removed after)"""
    for name in names:
        path = f"{MODELS}/{name}"
        d, err = predict(path)
        if not run.ok(d is not None, f"{name}: mmguard predict failed: {err}"):
            continue
        fact = FACTS.get(name)
        if not fact:
            continue
        want = fact["params"] + fact.get("adapters", 0) + fact.get("saved", 0)
        run.ok(d["parameters_count"] == want,
               f"{name}: parameters_count {d['parameters_count']}, the model has "
               f"{fact['params']} ({fact['src']}) + {fact.get('adapters', 0)} adapter parameters")
        want_t = fact["trainable"] + fact.get("adapters", 0) + fact.get("saved", 0)
        run.ok(d["trainable_count"] == want_t,
               f"{name}: trainable_count {d['trainable_count']}, its mode trains {want_t}")
        doc = read_preset(path)
        run.ok(hf_id(doc) == fact["id"], f"{name}: its header's HF id is {hf_id(doc)}, "
               f"not {fact['id']}")
        run.ok(fact["id"] in cat, f"{name}: {fact['id']} is not in {MODELS}/catalog.txt")
    # every catalog id resolves with no network and gives the model's exact count
    base = {}
    for f in FACTS.values():
        base.setdefault(f["id"], f["params"])
    for ident, target in sorted(cat.items()):
        run.ok(os.path.exists(f"{MODELS}/{target}"), f"catalog: {ident}: {target} is missing")
        out = f"{tmp}/cat.yaml"
        rc, _, err = mm("import", "--hf", ident, "-o", out)
        if not run.ok(rc == 0, f"catalog: mmguard import --hf {ident}: {err.strip()}"):
            continue
        d, err = predict(out)
        if not run.ok(d is not None, f"catalog: {ident}: the import does not predict: {err}"):
            continue
        want = base.get(ident) or base.get(FACTS.get(target, {}).get("id"))
        run.ok(want is None or d["parameters_count"] == want,
               f"catalog: {ident}: parameters_count {d['parameters_count']}, not {want}")
        # a LoRA preset's modules come without its adapters and without the
        # `trainable: false` that froze the base for them (import_preset.c): the
        # imported model trains in full unless the job's files say otherwise
        if FACTS.get(target, {}).get("adapters"):
            run.ok(d["trainable_count"] > 0, f"catalog: {ident} ({target}) imports with nothing "
                   "trainable: the preset's trainable: false came without its lora")
    check_index(run)
    check_modules(run, tmp)
    check_round_trips(run, tmp)
    check_specs(run, tmp)
    check_doc(run)


def check_index(run):
    """an exact count with a published checkpoint index is its total_size / 2 (one 2-byte dtype)"""
    for name, fact in sorted(FACTS.items()):
        if "index" not in fact:
            continue
        path = f"{DATA}/{fact['index']}/model.safetensors.index.json"
        if not run.ok(os.path.isfile(path), f"{name}: {path} missing (IMPORT_DATA)"):
            continue
        with open(path) as f:
            total = json.load(f)["metadata"]["total_size"]
        run.ok(total == 2 * fact["params"], f"{name}: params {fact['params']} but {path} says "
               f"total_size {total} = {total // 2} 2-byte parameters")


def check_modules(run, tmp):
    """the preset's modules are `mmguard import --hf` of the published config"""
    for name, cfg in sorted(PUBLISHED_CONFIG.items()):
        src = f"{DATA}/{cfg}"
        if not run.ok(os.path.isdir(src), f"{name}: {src} missing (IMPORT_DATA)"):
            continue
        out = f"{tmp}/mods.yaml"
        rc, _, err = mm("import", "--hf", src, "-o", out)
        if not run.ok(rc == 0, f"{name}: mmguard import --hf {src}: {err.strip()}"):
            continue
        got = {m["name"]: m for m in read_preset(f"{MODELS}/{name}")["modules"]}
        imp = {m["name"]: m for m in read_preset(out)["modules"]}
        run.ok(sorted(got) == sorted(imp), f"{name}: modules {sorted(got)} vs the import's "
               f"{sorted(imp)}")
        for mod in imp:
            a = {k: v for k, v in got.get(mod, {}).items() if k not in RECIPE_KEYS}
            b = {k: v for k, v in imp[mod].items() if k not in RECIPE_KEYS}
            run.ok(a == b, f"{name}: module {mod} differs from `mmguard import --hf {src}`: "
                   f"{sorted(set(a.items()) ^ set(b.items()))}")


def check_round_trips(run, tmp):
    """the recipe's published files, imported, predict what the preset predicts"""
    for name, args in round_trips():
        pre, err = predict(f"{MODELS}/{name}")
        if pre is None:
            run.ok(False, f"round trip {name}: the preset does not predict: {err}")
            continue
        out = f"{tmp}/rt.yaml"
        rc, _, err = mm("import", *args, "-o", out)
        what = f"round trip {name} <- mmguard import {' '.join(args)}"
        if not run.ok(rc == 0, f"{what}: {err.strip()}"):
            continue
        # the data-parallel degree is the job's GPU request, never in these files
        d, err = predict(out, f"training.data_parallel={pre['data_parallel']}")
        if run.ok(d is not None, f"{what}: does not predict: {err}"):
            close(d, pre, what, run)


def check_specs(run, tmp):
    """HF ids in a spec go through the shipped catalog"""
    lf = os.path.abspath(f"{DATA}/llamafactory/qwen2_5vl_lora_sft.yaml")
    cases = {
        "lf-only.yaml": f"llamafactory: {lf}\n",
        "hf-id.yaml": "name: hf-id\nhf_config: Qwen/Qwen2.5-VL-7B-Instruct\n"
                      "training:\n  micro_batch_size: 2\n  seq_len: 4096\n",
        "trainer.yaml": "name: trainer\ntrainer: sft.yaml\n",
    }
    with open(f"{tmp}/sft.yaml", "w") as f:
        f.write("model_name_or_path: meta-llama/Llama-3.1-8B-Instruct\n"
                "per_device_train_batch_size: 2\nmax_length: 2048\nbf16: true\n")
    for fn, text in cases.items():
        with open(f"{tmp}/{fn}", "w") as f:
            f.write(text)
        d, err = predict(f"{tmp}/{fn}")
        run.ok(d is not None, f"spec {text.strip()!r}: does not predict: {err}")
    d, _ = predict(f"{tmp}/lf-only.yaml")
    if d:
        run.ok(d["parameters_count"] == FACTS["qwen2.5-vl-7b-lora.yaml"]["params"]
               + FACTS["qwen2.5-vl-7b-lora.yaml"]["adapters"],
               f"spec llamafactory: qwen2_5vl_lora_sft.yaml: parameters_count "
               f"{d['parameters_count']}")
    d, _ = predict(f"{tmp}/trainer.yaml")
    if d:
        run.ok(d["parameters_count"] == FACTS["llama-3.1-8b-full.yaml"]["params"],
               f"spec trainer: model_name_or_path Llama-3.1-8B: {d['parameters_count']}")


# ---- docs/models.md --------------------------------------------------------------------
BEGIN = "<!-- generated by tests/presets/presets.py doc: do not edit between these lines -->"
END = "<!-- end of generated table -->"


def gib(b):
    return f"{b / 2**30:.1f} GiB"


def tokens_per_image(path, doc):
    """the spec's own worst case: mmguard names it when seq_len cannot hold it"""
    vis = [m for m in doc["modules"] if m.get("type") in ("vision", "vit")]
    if not vis:
        return "—"
    dec = [m for m in doc["modules"] if m.get("type") in ("decoder", "llama")][0]
    if dec.get("family") == "mllama":
        v = vis[0]
        side = int(v["image_size"]) // int(v["patch_size"])
        return (f"0 in the sequence; {v['max_num_tiles']} tiles x {side * side + 1} patches "
                "cross-attended")
    d, err = predict(path)
    im = d.get("image") if d else None
    if not im:
        raise SystemExit(f"{path}: no image in mmguard's prediction: {err}")
    return f"{im['tokens']} ({im['height']}x{im['width']})"


def blocks(doc):
    parts = []
    for m in doc["modules"]:
        kind = {"vit": "vision", "mlp": "connector", "llama": "decoder"}.get(m["type"], m["type"])
        fam = m.get("family") or {"vision": "clip", "connector": "mlp",
                                  "decoder": "llava_llama"}[kind]
        s = f"{kind} {fam}"
        if kind != "connector":
            s += f" {m['num_hidden_layers']}x{m['hidden_size']}"
        if m.get("num_experts") and m["num_experts"] != "0":
            s += f", MoE {m['num_experts']} experts top-{m['num_experts_per_tok']}"
        mode = []
        if m.get("quantization"):
            bits = re.search(r"bits: (\d+)", m["quantization"])
            mode.append(f"{bits.group(1) if bits else '?'}-bit")
        if m.get("lora"):
            r = re.search(r"\br: (\d+)", m["lora"])
            mode.append(f"LoRA r{r.group(1) if r else '?'}")
        elif m.get("trainable", "true") == "false":
            mode.append("frozen")
        else:
            mode.append("trained")
        parts.append(f"{s} ({', '.join(mode)})")
    return "; ".join(parts)


def setup(doc, d):
    t = doc.get("training", {})
    fs = doc.get("fsdp") if isinstance(doc.get("fsdp"), dict) else None
    if fs:
        par = f"FSDP{fs.get('version', '1')}"
    elif t.get("zero_stage", "0") != "0":
        par = f"ZeRO-{t['zero_stage']}"
    elif d["data_parallel"] == 1:
        return f"1 GPU, batch {d['micro_batch_size']} x {d['seq_len']}"
    else:
        par = "DDP"
    return f"{par} x {d['data_parallel']}, batch {d['micro_batch_size']} x {d['seq_len']}"


def doc_text():
    rows = []
    for name in presets():
        path = f"{MODELS}/{name}"
        doc = read_preset(path)
        d, err = predict(path)
        if d is None:
            raise SystemExit(f"{name}: {err}")
        rows.append("| " + " | ".join([
            f"[{name[:-5]}](../contrib/models/{name})", f"`{hf_id(doc)}`",
            RECIPES.get(name, "?"), blocks(doc), tokens_per_image(path, doc),
            f"{d['parameters_count']:,}", f"{d['trainable_count']:,}", setup(doc, d),
            gib(d["peak_bytes"])]) + " |")
    head = ("| preset | HF id | recipe | blocks (layers x width) | tokens per image (worst image) "
            "| parameters | trainable | GPUs, micro-batch x tokens | predicted peak per GPU |\n"
            "|---|---|---|---|---|---:|---:|---|---:|")
    return f"{BEGIN}\n{head}\n" + "\n".join(rows) + f"\n{END}\n"


def doc_file(table):
    text = open(DOC).read() if os.path.exists(DOC) else ""
    if BEGIN in text and END in text:
        a = text.index(BEGIN)
        b = text.index(END) + len(END) + 1
        return text[:a] + table + text[b:]
    return None


def check_doc(run):
    if not run.ok(os.path.exists(DOC), f"{DOC} is missing"):
        return
    want = doc_file(doc_text())
    run.ok(want is not None and want == open(DOC).read(),
           f"{DOC} is stale or its markers are gone: `make models-doc` rewrites its table")


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else "check"
    if cmd == "doc":
        table = doc_text()
        if "--write" in sys.argv:
            text = doc_file(table)
            if text is None:
                raise SystemExit(f"{DOC}: the generated-table markers are missing")
            with open(DOC, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(table)
        return
    if not os.path.isfile(f"{DATA}/SOURCES.md"):
        raise SystemExit(f"presets: {DATA}/SOURCES.md missing (the published files; IMPORT_DATA)")
    run = Run()
    check(run)
    for s in run.skipped:
        print(f"presets: skipped: {s}")
    print(f"presets: {run.passed} passed, {run.failed} failed, {len(run.skipped)} skipped")
    sys.exit(1 if run.failed else 0)


if __name__ == "__main__":
    main()
