"""CPU tests of the calibration harness (contrib/calibrate): no GPU, no torch needed.

Covers grid generation, the emitted mmguard specs (checked against the keys documented
in docs/spec-schema.md and, when built, against `mmguard predict`), JSON-lines writing,
resuming and OOM-dominance skipping, the budget, the --dry-run, the whole orchestration
with a simulated GPU, the comparison with `mmguard predict --json` (with a fake and, when
present, the real predictor) and the constant fitting on synthetic data.  Tests that need
torch or transformers are skipped when those are not importable.

Run:  python3 -m unittest discover -s tests/calibrate -t .    (or make check-calibrate)
"""

import contextlib
import io
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAL = os.path.join(ROOT, "contrib", "calibrate")
sys.path.insert(0, CAL)

import calib_common as cc  # noqa: E402
import calibrate  # noqa: E402
import capacity  # noqa: E402
import compare  # noqa: E402
import fit  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


def find_mmguard():
    """The real predictor: $MMGUARD, else build-calib/mmguard, else build/mmguard."""
    cands = [os.environ.get("MMGUARD")] if os.environ.get("MMGUARD") else []
    cands += [os.path.join(ROOT, "build-calib", "mmguard"), os.path.join(ROOT, "build", "mmguard")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


MMGUARD = find_mmguard()
NO_MMGUARD = ("mmguard predictor binary not built (looked at $MMGUARD, build-calib/mmguard, "
              "build/mmguard): skipping the checks against the real predictor")


def have(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False


# ---------------------------------------------------------------------------
# allowed keys, read from the documented schema
# ---------------------------------------------------------------------------

def schema_keys():
    """Key sets per section from the YAML example in docs/spec-schema.md."""
    path = os.path.join(ROOT, "docs", "spec-schema.md")
    with open(path) as f:
        text = f.read()
    m = re.search(r"```yaml\n(.*?)```", text, re.S)
    keys = {"top": set(), "module": set(), "lora": set(), "training": set(),
            "framework": set(), "device": set()}
    section = None
    for line in m.group(1).splitlines():
        code = line.split("#", 1)[0].rstrip()
        km = re.match(r"^(\s*)(- )?([A-Za-z_][A-Za-z0-9_]*):", code)
        if not km:
            continue
        indent = len(km.group(1)) + (2 if km.group(2) else 0)
        key = km.group(3)
        if indent == 0:
            keys["top"].add(key)
            section = key
        elif section == "modules":
            if indent == 4:
                keys["module"].add(key)
            elif indent == 6:
                keys["lora"].add(key)
        elif section in keys and indent == 2:
            keys[section].add(key)
    return keys


ROLE = {"vit": "vision", "mlp": "connector", "llama": "decoder",
        "vision": "vision", "connector": "connector", "decoder": "decoder"}


def reference_keys():
    """Key sets from docs/spec-keys.md (generated from the loader's own tables): per
    section, and for modules[] the roles each key applies to."""
    path = os.path.join(ROOT, "docs", "spec-keys.md")
    with open(path) as f:
        text = f.read()
    heads = {"modules[] (one entry per module)": "module", "modules[].lora": "lora",
             "modules[].image_processor (vision)": "image_processor",
             "training": "training", "framework": "framework", "device": "device",
             "training.gradient_checkpointing (a map, or true / false)": "gradient_checkpointing"}
    keys = {v: {} for v in heads.values()}
    section = None
    for line in text.splitlines():
        if line.startswith("## "):
            section = heads.get(line[3:].strip())
            continue
        m = re.match(r"^\| `([A-Za-z_0-9]+)` \| ([^|]*)\|", line)
        if section and m:
            roles = {r.strip() for r in m.group(2).split(",")}
            keys[section][m.group(1)] = roles
    top = re.search(r"^Sections: (.*)$", text, re.M).group(1)
    keys["top"] = set(re.findall(r"`([a-z_]+)`", top))
    return keys


def group(name):
    """The default-grid group called NAME (the grid's order changes as groups are added)."""
    return next(g for g in cc.default_grid() if g.name == name)


class TestGrid(unittest.TestCase):
    def setUp(self):
        self.groups = cc.default_grid()
        self.cfgs = cc.all_configs(self.groups)

    def test_ids_unique_and_short(self):
        ids = [c.id for c in self.cfgs]
        self.assertEqual(len(ids), len(set(ids)))
        for i in ids:
            self.assertLessEqual(len(i), 63, i)
            self.assertRegex(i, r"^[A-Za-z0-9.-]+$")
        self.assertEqual(len({g.name for g in self.groups}), len(self.groups))

    def test_coverage_required_by_issue(self):
        c = self.cfgs
        self.assertEqual(min(x.micro_batch for x in c), 1)
        self.assertEqual(max(x.micro_batch for x in c), 16)
        self.assertEqual(min(x.seq_len for x in c), 512)
        self.assertEqual(max(x.seq_len for x in c), 4096)
        self.assertEqual({x.checkpointing for x in c}, {True, False})
        self.assertEqual({x.group.attention for x in c}, {"eager", "sdpa", "flash"})
        self.assertTrue({"pretrain", "finetune", "lora"} <= {x.group.mode for x in c})
        self.assertEqual({x.group.model for x in c}, {"llava", "llama", "qwen2vl", "qwen25vl"})
        # every allocator option the issue names has a traced group
        confs = {g.alloc_conf.split(":")[0] for g in self.groups if g.trace and g.alloc_conf}
        self.assertEqual(confs, {"expandable_segments", "max_split_size_mb",
                                 "roundup_power2_divisions", "garbage_collection_threshold"})
        # LLaVA-1.5-7B geometry (full 32 layers) in pretrain, LoRA and finetune
        full7 = {x.group.mode for x in c if x.group.llm == "vicuna-7b"
                 and x.group.llm_layers is None and x.group.model == "llava"}
        self.assertTrue({"pretrain", "lora", "finetune"} <= full7)
        for x in c:
            self.assertIn(x.group.optimizer_impl, ("foreach", "fused"))

    def test_most_informative_first(self):
        g = sorted(self.groups, key=lambda g: g.priority)
        # allocator traces first (few, cheap, and each one a permanent CI fixture),
        # then the LLaVA-1.5-7B pretrain sweep and LoRA
        ntrace = sum(1 for x in g if x.trace)
        self.assertTrue(all(x.trace for x in g[:ntrace]))
        self.assertEqual(g[0].name, "trace-llava7b-pretrain")
        self.assertEqual(g[ntrace].name, "llava7b-pretrain-sdpa")
        self.assertEqual(g[ntrace + 1].mode, "lora")
        self.assertEqual(len({x.priority for x in self.groups}), len(self.groups))

    def test_llava_seq_leaves_text(self):
        for x in self.cfgs:
            if x.group.model == "llava":
                self.assertGreater(x.seq_len, 576)
        g = group("llava7b-pretrain-sdpa")
        with self.assertRaises(ValueError):
            cc.Config(g, 1, 576, True)

    def test_param_count_vicuna7b(self):
        # 6,738,415,616 (shared/memory-reference.md)
        self.assertEqual(cc.llm_param_count(cc.LLMS["vicuna-7b"]), 6738415616)

    def test_group_roundtrip(self):
        for g in self.groups:
            g2 = cc.Group.from_dict(json.loads(json.dumps(g.to_dict())))
            self.assertEqual([c.id for c in g.configs()], [c.id for c in g2.configs()])
            self.assertEqual(g2.lora, g.lora)

    def test_bad_groups(self):
        with self.assertRaises(ValueError):
            cc.Group("x", "llama", "vicuna-7b", "pretrain", "sdpa", [])
        with self.assertRaises(ValueError):
            cc.Group("x", "llava", "vicuna-7b", "pretrain", "xformers", [])

    def test_dominance(self):
        g = group("llava7b-pretrain-sdpa")
        a = cc.Config(g, 4, 2048, False)
        self.assertTrue(cc.Config(g, 8, 2048, False).dominates(a))
        self.assertTrue(a.dominates(a))
        self.assertFalse(cc.Config(g, 8, 1024, False).dominates(a))
        self.assertFalse(cc.Config(g, 8, 2048, True).dominates(a))

    def test_estimates_fit_device_budget(self):
        # whole default grid inside one session's 30 min of device time, less ~5 min
        # of machine starts: three runs of at most 9 minutes
        total = sum(cc.estimate_build_seconds(g) for g in self.groups) + \
            sum(cc.estimate_seconds(c) for c in self.cfgs)
        self.assertLess(total, 3 * 540)


class TestSpec(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.keys = schema_keys()
        cls.ref = reference_keys()

    def check_reference_keys(self, spec):
        """Every key is one the loader accepts (docs/spec-keys.md), on a module of a role
        it applies to."""
        k = self.ref
        self.assertLessEqual(set(spec), k["top"])
        for m in spec["modules"]:
            role = ROLE[m["type"]]
            for key in m:
                self.assertIn(key, k["module"], "%s: %s" % (spec["name"], key))
                roles = k["module"][key]
                self.assertTrue("all" in roles or role in roles,
                                "%s: %s on a %s module" % (spec["name"], key, role))
            self.assertLessEqual(set(m.get("lora", {})), set(k["lora"]))
            self.assertLessEqual(set(m.get("image_processor", {})), set(k["image_processor"]))
        self.assertLessEqual(set(spec["training"]), set(k["training"]))
        gc = spec["training"].get("gradient_checkpointing")
        if isinstance(gc, dict):
            self.assertLessEqual(set(gc), set(k["gradient_checkpointing"]))
        self.assertLessEqual(set(spec.get("framework", {})), set(k["framework"]))
        self.assertLessEqual(set(spec.get("device", {})), set(k["device"]))

    def check_keys(self, spec):
        k = self.keys
        self.assertLessEqual(set(spec), k["top"])
        for req in ("name", "modules", "training"):
            self.assertIn(req, spec)
        names = [m["name"] for m in spec["modules"]]
        self.assertEqual(len(names), len(set(names)))
        for m in spec["modules"]:
            self.assertLessEqual(set(m), k["module"], m["name"])
            if "lora" in m:
                self.assertLessEqual(set(m["lora"]), k["lora"])
        self.assertLessEqual(set(spec["training"]), k["training"])
        self.assertLessEqual(set(spec.get("framework", {})), k["framework"])

    def test_schema_parse_sane(self):
        self.assertIn("hidden_size", self.keys["module"])
        self.assertIn("target_modules", self.keys["lora"])
        self.assertIn("micro_batch_size", self.keys["training"])
        self.assertIn("cuda_context", self.keys["device"])

    def test_reference_parse_sane(self):
        self.assertEqual(self.ref["module"]["window_size"], {"vision"})
        self.assertEqual(self.ref["module"]["trainable"], {"all"})
        self.assertIn("max_pixels", self.ref["image_processor"])
        self.assertIn("image_size", self.ref["training"])
        self.assertIn("use_reentrant", self.ref["gradient_checkpointing"])
        self.assertIn("modules", self.ref["top"])

    def test_all_specs_use_documented_keys(self):
        for c in cc.all_configs(cc.default_grid() + cc.smoke_grid() + cc.capacity_groups()):
            spec = cc.spec_for(c, framework={"transformers_version": "5.17", "torch_version": "2.11"})
            self.check_reference_keys(spec)
            if c.group.model in ("llava", "llama"):
                self.check_keys(spec)  # the annotated example's keys suffice for these
            self.assertNotIn("spec_unsupported", c.harness_dict())
            json.dumps(spec)

    def test_qwen_specs(self):
        """The towers as calib_qwen builds them, the modes as set_trainable sets them, the
        image as make_batch feeds it."""
        for g in cc.default_grid():
            if g.model not in cc.QWEN_MODELS:
                continue
            c = g.configs()[0]
            s = cc.spec_for(c, attention_used={"language_model": "sdpa", "vision_tower": "eager"})
            vit, merger, llm = s["modules"]
            q25 = g.model == "qwen25vl"
            self.assertEqual(vit["family"], "qwen2_5_vl" if q25 else "qwen2_vl")
            self.assertEqual(merger["family"], "patch_merger_rms" if q25 else "patch_merger")
            self.assertEqual((vit["hidden_size"], vit["num_hidden_layers"],
                              vit["num_attention_heads"]), (1280, 32, 16))
            self.assertEqual(vit["intermediate_size"], 3420 if q25 else 5120)
            self.assertEqual(vit["hidden_act"], "silu" if q25 else "quick_gelu")
            self.assertEqual(vit.get("window_size"), 112 if q25 else None)
            self.assertEqual(vit.get("fullatt_block_indexes"), [7, 15, 23, 31] if q25 else None)
            self.assertEqual(vit["attention"], "eager")  # the tower's own, as it ran
            self.assertEqual(s["training"]["attention"], "sdpa")
            self.assertEqual(vit["trainable"], g.mode == "full")
            self.assertTrue(merger["trainable"])  # part_of: the merger is the projector
            self.assertEqual((merger["input_size"], merger["hidden_size"]),
                             (1280, g.llm_geometry()["hidden_size"]))
            self.assertEqual(llm["family"], "qwen2_vl")
            self.assertEqual(llm["trainable"], g.mode in ("finetune", "full"))
            self.assertEqual(llm["tie_word_embeddings"], g.llm == "qwen2-1.5b")
            if g.mode == "lora":
                self.assertEqual(llm["lora"], {"r": 64, "alpha": 128, "dropout": 0.05,
                                               "target_modules": cc.QWEN_LORA["target_modules"],
                                               "autocast_adapter_dtype": False})
            else:
                self.assertNotIn("lora", llm)
            h, w = g.image_grid
            self.assertEqual(s["training"]["image_size"], [14 * h, 14 * w])
            self.assertEqual(s["training"]["images_per_sample"], 1)
            ip = vit["image_processor"]
            self.assertEqual((ip["min_pixels"], ip["max_pixels"]), (196 * h * w, 196 * h * w))
        s = cc.spec_for(group("qwen25vl7b-lora-img1008").configs()[0])
        self.assertEqual(s["training"]["image_size"], [1008, 1008])
        s = cc.spec_for(group("qwen2vl2b-finetune-eager").configs()[0],
                        attention_used={"language_model": "eager", "vision_tower": "eager"})
        self.assertNotIn("attention", s["modules"][0])
        self.assertEqual(s["training"]["attention"], "eager")

    def test_use_reentrant(self):
        c = group("qwen2vl2b-finetune-sdpa").configs()[0]
        self.assertIs(cc.spec_for(c)["training"]["gradient_checkpointing"], True)
        self.assertEqual(cc.spec_for(c, use_reentrant="true")["training"]["gradient_checkpointing"],
                         {"enabled": True, "use_reentrant": True})
        c0 = [x for x in group("qwen2vl2b-finetune-sdpa").configs() if not x.checkpointing][0]
        self.assertIs(cc.spec_for(c0, use_reentrant="true")["training"]["gradient_checkpointing"],
                      False)

    def test_llava_7b_pretrain_spec(self):
        c = group("llava7b-pretrain-sdpa").configs()[0]
        s = cc.spec_for(c)
        self.assertEqual(s["name"], c.id)
        self.assertEqual([m["type"] for m in s["modules"]], ["vit", "mlp", "llama"])
        vit, mlp, llm = s["modules"]
        self.assertFalse(vit["trainable"])
        self.assertEqual((vit["image_size"], vit["patch_size"], vit["select_layer"]), (336, 14, -2))
        self.assertEqual(vit["hidden_act"], "quick_gelu")
        self.assertTrue(mlp["trainable"])
        self.assertEqual((mlp["input_size"], mlp["hidden_size"], mlp["num_layers"]), (1024, 4096, 2))
        self.assertFalse(llm["trainable"])
        self.assertEqual(llm["num_hidden_layers"], 32)
        t = s["training"]
        self.assertEqual((t["micro_batch_size"], t["seq_len"], t["images_per_sample"]), (16, 2048, 1))
        self.assertEqual((t["precision"], t["master_weights"], t["zero_stage"]), ("bf16", "none", 0))
        self.assertEqual((t["optimizer"], t["optimizer_impl"]), ("adamw", "foreach"))
        self.assertTrue(t["gradient_checkpointing"])
        self.assertNotIn("framework", s)

    def test_modes(self):
        by = {g.name: g for g in cc.default_grid()}
        s = cc.spec_for(by["llava7b-lora-sdpa"].configs()[0])
        llm = s["modules"][2]
        self.assertFalse(llm["trainable"])
        self.assertEqual(llm["lora"], {"r": 128, "alpha": 256, "dropout": 0.05,
                                       "target_modules": cc.LORA_LLAVA["target_modules"],
                                       "autocast_adapter_dtype": False})
        s = cc.spec_for(by["llava7b-L8-finetune-sdpa"].configs()[0])
        self.assertTrue(s["modules"][2]["trainable"])
        self.assertEqual(s["modules"][2]["num_hidden_layers"], 8)
        self.assertFalse(s["modules"][0]["trainable"])
        s = cc.spec_for(by["llava-tiny-full-sdpa"].configs()[0])
        self.assertTrue(all(m["trainable"] for m in s["modules"]))
        self.assertEqual(s["modules"][2]["num_key_value_heads"], 4)
        s = cc.spec_for(by["llama7b-L8-finetune-sdpa"].configs()[0])
        self.assertEqual([m["type"] for m in s["modules"]], ["llama"])
        self.assertEqual(s["training"]["images_per_sample"], 0)
        s = cc.spec_for(by["llava7b-L8-finetune-sdpa-fused"].configs()[0])
        self.assertEqual(s["training"]["optimizer_impl"], "fused")

    def test_attention_used_and_framework(self):
        c = group("llava7b-pretrain-sdpa").configs()[0]
        s = cc.spec_for(c, framework={"transformers_version": cc.major_minor("5.17.0"),
                                      "torch_version": cc.major_minor("2.11.0+cu130")},
                        attention_used={"language_model": "flash", "vision_tower": "sdpa"})
        self.assertEqual(s["framework"], {"transformers_version": "5.17", "torch_version": "2.11"})
        self.assertEqual(s["training"]["attention"], "flash")
        self.assertEqual(s["modules"][0]["attention"], "sdpa")
        s = cc.spec_for(c, attention_used={"language_model": "sdpa", "vision_tower": "sdpa"})
        self.assertNotIn("attention", s["modules"][0])
        self.assertIsNone(cc.major_minor(None))
        self.assertEqual(cc.major_minor("4.46.3"), "4.46")

    @unittest.skipUnless(MMGUARD, NO_MMGUARD)
    def test_real_predictor_accepts_every_spec(self):
        d = tempfile.mkdtemp()
        try:
            for c in cc.all_configs(cc.default_grid() + cc.smoke_grid()):
                spec = cc.spec_for(c, framework={"transformers_version": "5.17",
                                                 "torch_version": "2.11"})
                p = os.path.join(d, c.id + ".json")
                with open(p, "w") as f:
                    json.dump(spec, f)
                out = subprocess.run([MMGUARD, "predict", p, "--json"], capture_output=True,
                                     text=True, timeout=60)
                self.assertEqual(out.returncode, 0, "%s: %s" % (c.id, out.stderr))
                j = json.loads(out.stdout)
                for k in ("name", "peak_bytes", "allocated_peak_bytes", "peak_phase",
                          "phase_peak_bytes"):
                    self.assertIn(k, j, c.id)
                self.assertEqual(j["name"], c.id)
                self.assertGreaterEqual(j["peak_bytes"], j["allocated_peak_bytes"])
                if c.group.model in cc.QWEN_MODELS:
                    # the predictor sees the image make_batch feeds: h x w patches, h*w/4
                    # LLM tokens (the harness's vision_start + pads + vision_end layout)
                    h, w = c.group.image_grid
                    self.assertEqual((j["image"]["patches"], j["image"]["tokens"]),
                                     (h * w, c.group.image_tokens()), c.id)
        finally:
            shutil.rmtree(d)


class TestJsonl(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp()
        self.p = os.path.join(self.d, "sub", "data.jsonl")

    def tearDown(self):
        shutil.rmtree(self.d)

    def test_roundtrip(self):
        cc.append_record(self.p, {"kind": "measurement", "id": "a", "status": "ok"})
        cc.append_record(self.p, {"kind": "probe"})
        r = cc.read_records(self.p)
        self.assertEqual(len(r), 2)
        self.assertEqual(r[0]["schema"], cc.RECORD_SCHEMA)
        self.assertIn("time", r[0])
        with open(self.p) as f:
            self.assertEqual(len(f.read().splitlines()), 2)
        self.assertEqual(cc.read_records(os.path.join(self.d, "missing.jsonl")), [])

    def test_truncated_line_tolerated(self):
        cc.append_record(self.p, {"kind": "measurement", "id": "a", "status": "ok"})
        with open(self.p, "a") as f:
            f.write('{"kind": "measurement", "id": "b", "sta')  # killed mid-write
        warns = []
        self.assertEqual([r["id"] for r in cc.read_records(self.p, warn=warns.append)], ["a"])
        self.assertEqual(len(warns), 1)
        cc.append_record(self.p, {"kind": "measurement", "id": "c", "status": "oom"})
        self.assertEqual([r["id"] for r in cc.read_records(self.p)], ["a", "c"])

    def test_done_ids_last_wins(self):
        recs = [{"kind": "measurement", "id": "a", "status": "error"},
                {"kind": "measurement", "id": "b", "status": "ok"},
                {"kind": "measurement", "id": "b", "status": "error"},
                {"kind": "measurement", "id": "c", "status": "oom"},
                {"kind": "measurement", "id": "d", "status": "unavailable"},
                {"kind": "probe", "id": "e", "status": "ok"}]
        self.assertEqual(cc.done_ids(recs), {"c", "d"})
        self.assertEqual(cc.oom_ids(recs), {"c"})

    def test_plan_resume_and_dominance(self):
        groups = cc.default_grid()
        g = group("llava7b-pretrain-sdpa")
        cfgs = g.configs()
        oom = next(c for c in cfgs if c.id == "llava7b-pretrain-sdpa-b4-s1024-ck0")
        recs = [{"kind": "measurement", "id": cfgs[0].id, "status": "ok"},
                {"kind": "measurement", "id": oom.id, "status": "oom"}]
        todo, dominated = cc.plan(groups, recs)
        left = {c.id for _, cs in todo for c in cs}
        self.assertNotIn(cfgs[0].id, left)
        self.assertNotIn(oom.id, left)
        dom = {c.id for c, k in dominated}
        self.assertEqual(dom, {"llava7b-pretrain-sdpa-b16-s1024-ck0"})
        self.assertIn("llava7b-pretrain-sdpa-b2-s2048-ck0", left)  # not dominated (mbs 2 < 4)
        todo, _ = cc.plan(groups, recs, only="^llava7b-lora")
        self.assertEqual([gg.name for gg, _ in todo], ["llava7b-lora-sdpa", "llava7b-lora-nodrop-sdpa"])
        txt = cc.format_plan(todo, dominated, budget_seconds=10)
        self.assertIn("past budget", txt)
        self.assertIn("dominates OOM", txt)


def run_cal(args, env=None, timeout=120):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, os.path.join(CAL, "calibrate.py")] + args,
                          capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT)


class TestCapacitySweep(unittest.TestCase):
    """contrib/calibrate/capacity.py: where the sweep puts its capacities, and its
    orchestration end to end on the simulated GPU."""

    def test_grid_brackets_the_peaks(self):
        a, r = 7 * GIB, 8 * GIB
        caps = capacity.grid_capacities(a, r)
        self.assertEqual(len(caps), capacity.GRID_POINTS)
        self.assertEqual(caps, sorted(caps))
        self.assertLess(caps[0], a)
        self.assertGreater(caps[-1], r)
        self.assertIn(a, caps)
        self.assertIn(r, caps)

    def test_refine_inside_the_boundary(self):
        pts = [(100, False), (200, False), (300, True), (400, True)]
        ref = capacity.refine_capacities(pts)
        self.assertEqual(len(ref), capacity.REFINE_POINTS)
        self.assertTrue(all(200 < c < 300 for c in ref))
        self.assertEqual(capacity.refine_capacities([(1, True), (2, True)]), [])
        self.assertEqual(capacity.refine_capacities([(1, False)]), [])
        # an outcome that is not monotone is not refined (the data says so)
        self.assertEqual(capacity.refine_capacities([(300, False), (200, True)]), [])

    def test_simulated_sweep(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        r = subprocess.run([sys.executable, os.path.join(CAL, "capacity.py"), "--dir", d,
                            "--simulate", "--only", "^cap-tinyllama-ft$",
                            "--budget-seconds", "60"], capture_output=True, text=True,
                           timeout=180)
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = [json.loads(x) for x in open(os.path.join(d, "capacity.jsonl"))]
        ms = [x for x in recs if x.get("kind") == "measurement"]
        # the uncapped run, then one worker per grid capacity
        self.assertEqual(len(ms), 1 + capacity.GRID_POINTS)
        self.assertTrue(all(x["concurrent_workers"] for x in recs))


class TestHarnessCli(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp()
        self.out = os.path.join(self.d, "cal.jsonl")

    def tearDown(self):
        shutil.rmtree(self.d)

    def test_dry_run_needs_no_torch(self):
        specs = os.path.join(self.d, "specs")
        # a fake `torch` that explodes on import proves the dry run never imports it
        fake = os.path.join(self.d, "fake")
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write("raise ImportError('dry run must not import torch')\n")
        r = run_cal(["--dry-run", "--out", self.out, "--print-specs", "--write-specs", specs],
                    env={"PYTHONPATH": fake})
        self.assertEqual(r.returncode, 0, r.stderr)
        grid = cc.default_grid()
        n = len(cc.all_configs(grid))
        self.assertIn("%d configs in %d groups" % (n, len(grid)), r.stdout)
        lines = [l for l in r.stdout.splitlines() if l.startswith("spec ")]
        self.assertEqual(len(lines), n)
        spec = json.loads(lines[0].split(" ", 2)[2])
        self.assertEqual(spec["name"], "trace-llava7b-pretrain-b4-s1024-ck0")
        self.assertEqual([l for l in lines if l.endswith(" null")], [])  # Qwen-VL too
        self.assertEqual(len(os.listdir(specs)), n)
        self.assertFalse(os.path.exists(self.out))

    def test_simulated_run_resume_and_budget(self):
        env = {"MMGUARD_CALIB_SIM_CONFIG_S": "0.05"}
        # a budget too small for the whole grid: stops early, lines already written
        r = run_cal(["--simulate", "--out", self.out, "--budget-seconds", "1.2",
                     "--grace-seconds", "5", "--mmguard", "/nonexistent"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        first = cc.measurements(cc.read_records(self.out))
        n_all = len(cc.all_configs(cc.default_grid()))
        self.assertGreater(len(first), 0)
        self.assertLess(len(first), n_all)
        self.assertIn("compare later", r.stdout)
        # resume: only the missing configs are measured, nothing twice
        r = run_cal(["--simulate", "--out", self.out, "--budget-seconds", "120",
                     "--mmguard", "/nonexistent"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        ms = cc.measurements(cc.read_records(self.out))
        ids = [m["id"] for m in ms]
        self.assertEqual(len(ids), len(set(ids)), "a config was measured twice")
        self.assertEqual(set(ids), {c.id for c in cc.all_configs(cc.default_grid())})
        self.assertIn("%d/%d grid configs recorded" % (n_all, n_all), r.stdout)
        # OOMs recorded as data points, dominated configs skipped with a reason
        ooms = [m for m in ms if m["status"] == "oom"]
        self.assertTrue(ooms)
        for m in ms:
            self.assertIn("spec", m)
            if m["status"] == "skipped":
                self.assertTrue(m["reason"].startswith("dominates OOM"))
        # a third run has nothing to do
        r = run_cal(["--simulate", "--out", self.out, "--mmguard", "/nonexistent"], env=env)
        self.assertIn("nothing left", r.stderr)
        self.assertEqual(len(cc.measurements(cc.read_records(self.out))), len(ms))
        probes = [x for x in cc.read_records(self.out) if x.get("kind") == "probe"]
        self.assertTrue(probes)

    def test_worker_killed_at_deadline(self):
        # a worker that overruns deadline + grace is killed; the run still ends cleanly
        env = {"MMGUARD_CALIB_SIM_BUILD_S": "30"}
        r = run_cal(["--simulate", "--out", self.out, "--budget-seconds", "0.5",
                     "--grace-seconds", "0.5", "--only", "^llava7b-pretrain-sdpa$",
                     "--mmguard", "/nonexistent"], env=env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = cc.read_records(self.out)
        self.assertTrue(any(x.get("kind") == "worker_exit" and x["returncode"] == "timeout"
                            for x in recs))
        self.assertEqual(cc.measurements(recs), [])


FAKE_MMGUARD = r'''#!%(py)s
import json, sys
# fake predictor: allocated = 1 GiB * micro_batch * seq_len / 1024 (+ layers MiB),
# peak = allocated * 1.05 + 512 MiB (+ device.cuda_context override if given)
args = sys.argv[1:]
if len(args) < 3 or args[0] != "predict" or "--json" not in args:
    sys.stderr.write("usage\n"); sys.exit(2)
spec = json.load(open(args[1]))
if spec["name"].startswith("bad"):
    sys.stderr.write("spec.json: training.foo: unknown key\n"); sys.exit(1)
t = spec["training"]
alloc = (1 << 30) * t["micro_batch_size"] * t["seq_len"] // 1024
ctx = spec.get("device", {}).get("cuda_context", 512 << 20)
peak = int(alloc * 1.05) + ctx
print(json.dumps({"name": spec["name"], "peak_bytes": peak, "allocated_peak_bytes": alloc,
                  "peak_phase": "backward",
                  "phase_peak_bytes": {"forward": alloc // 2, "backward": alloc,
                                       "optimizer": alloc // 3},
                  "factors": {}, "modules": []}))
'''


def fake_measurement(cfg, alloc, device, status="ok", total=80 * GIB):
    r = {"kind": "measurement", "id": cfg.id, "status": status, "group": cfg.group.name,
         "config": cfg.harness_dict(), "spec": cc.spec_for(cfg),
         "env": {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_total_bytes": total}}
    if status == "ok":
        r["measured"] = {"max_memory_allocated": alloc, "max_memory_reserved": alloc,
                         "device_peak_bytes": device, "peak_phase": "backward",
                         "phase_peak_allocated": {"forward": alloc // 2, "backward": alloc,
                                                  "optimizer": alloc // 3}}
    return r


class TestCompare(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp()
        self.fake = os.path.join(self.d, "mmguard")
        with open(self.fake, "w") as f:
            f.write(FAKE_MMGUARD % {"py": sys.executable})
        os.chmod(self.fake, os.stat(self.fake).st_mode | stat.S_IXUSR)
        self.cfgs = group("llava7b-pretrain-sdpa").configs()
        self.data = os.path.join(self.d, "data.jsonl")

    def tearDown(self):
        shutil.rmtree(self.d)

    def pred_alloc(self, c):
        return GIB * c.micro_batch * c.seq_len // 1024

    def test_errors_mape_and_oom(self):
        c0, c1, c2 = self.cfgs[0], self.cfgs[1], self.cfgs[2]
        a0 = self.pred_alloc(c0)
        a1 = self.pred_alloc(c1)
        # c0: measured 2 % above prediction; c1: prediction 3 % above measurement
        cc.append_record(self.data, fake_measurement(c0, int(a0 / 0.98),
                                                     int((a0 * 1.05 + 512 * MIB) / 0.95)))
        cc.append_record(self.data, fake_measurement(c1, int(a1 / 1.03),
                                                     int(a1 * 1.05 + 512 * MIB)))
        # c2 OOMed on a 1 GiB GPU: the fake predicts ~1.5 GiB -> refused, as it should
        cc.append_record(self.data, fake_measurement(c2, 0, 0, status="oom", total=1 * GIB))
        cc.append_record(self.data, {"kind": "measurement", "id": "x", "status": "error"})
        s = compare.compare(cc.read_records(self.data), self.fake)
        self.assertEqual(s["n_measured"], 2)
        rows = {r["id"]: r for r in s["rows"]}
        self.assertAlmostEqual(rows[c0.id]["allocated_error_pct"], -2.0, places=3)
        self.assertAlmostEqual(rows[c1.id]["allocated_error_pct"], 3.0, places=3)
        self.assertAlmostEqual(rows[c0.id]["device_error_pct"], -5.0, places=3)
        self.assertAlmostEqual(rows[c1.id]["device_error_pct"], 0.0, places=3)
        self.assertAlmostEqual(s["allocated_mape_pct"], 2.5, places=3)
        self.assertAlmostEqual(s["device_mape_pct"], 2.5, places=3)
        self.assertTrue(s["allocated_goal_met"])
        self.assertTrue(s["device_goal_met"])
        self.assertEqual(rows[c0.id]["phase_error_pct"]["backward"],
                         rows[c0.id]["allocated_error_pct"])
        self.assertEqual(s["oom_not_refused"], [])
        self.assertEqual(len(s["oom_rows"]), 1)
        self.assertTrue(s["oom_rows"][0]["predicted_refuses"])
        buf = io.StringIO()
        compare.report(s, buf)
        self.assertIn("MAPE allocated_peak_bytes vs max_memory_allocated: 2.50%", buf.getvalue())
        self.assertIn("refused (correct)", buf.getvalue())

    def test_cli_goals_device_json_and_predict_errors(self):
        c0 = self.cfgs[0]
        a0 = self.pred_alloc(c0)
        cc.append_record(self.data, fake_measurement(c0, int(a0 / 0.90), int(a0 * 1.05 + GIB)))
        bad = fake_measurement(self.cfgs[1], GIB, GIB)
        bad["spec"]["name"] = "bad-spec"
        cc.append_record(self.data, bad)
        dev = os.path.join(self.d, "fit.json")
        with open(dev, "w") as f:
            json.dump({"device": {"cuda_context": GIB}}, f)
        js = os.path.join(self.d, "sum.json")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = compare.main(["--mmguard", self.fake, "--device-json", dev, "--json-out", js,
                               "--check-goals", self.data])
        self.assertEqual(rc, 1)  # allocated error -10 %: goal missed
        s = json.load(open(js))
        self.assertAlmostEqual(s["rows"][0]["device_error_pct"], 0.0, places=3)  # ctx applied
        self.assertEqual(len(s["errors"]), 1)
        self.assertIn("unknown key", s["errors"][0]["error"])
        self.assertIn("PREDICT-ERROR", out.getvalue())
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(compare.main(["--mmguard", os.path.join(self.d, "none"), self.data]), 2)

    @unittest.skipUnless(MMGUARD, NO_MMGUARD)
    def test_real_predictor_on_simulated_data(self):
        r = run_cal(["--simulate", "--out", self.data, "--only", "^llava7b-(pretrain|lora)-sdpa$",
                     "--mmguard", MMGUARD])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("MAPE allocated_peak_bytes", r.stdout)
        s = compare.compare(cc.read_records(self.data), MMGUARD)
        self.assertEqual(s["errors"], [])
        self.assertGreater(s["n_measured"], 0)
        for row in s["rows"]:
            self.assertGreater(row["predicted_allocated"], 0)
            self.assertIn(row["predicted_phase"], ("forward", "backward", "optimizer"))


GPU_DATA = os.path.join(ROOT, "tests", "gpu_data")


def gpu_records(name):
    return cc.read_records(os.path.join(GPU_DATA, name))


class TestRecordedQwen(unittest.TestCase):
    """The committed H100 / H200 Qwen-VL rows (recorded before spec_for described them,
    so without a spec): the spec rebuilt from each record describes the model that ran."""

    def qwen_rows(self, name):
        return [r for r in compare.latest(gpu_records(name))
                if r.get("status") == "ok" and (r.get("config") or {}).get("model")
                in cc.QWEN_MODELS]

    def test_rebuilt_spec_matches_record(self):
        rows = self.qwen_rows("h200.jsonl")
        self.assertEqual(len(rows), 20)
        for r in rows:
            self.assertIsNone(r.get("spec"))  # the data file stays as measured
            spec = cc.spec_from_record(r)
            self.assertEqual(spec["name"], r["id"])
            self.assertEqual(spec["framework"], {"transformers_version": "5.17",
                                                 "torch_version": "2.11"})
            c = r["config"]
            self.assertEqual((spec["training"]["micro_batch_size"], spec["training"]["seq_len"],
                              spec["training"]["gradient_checkpointing"]),
                             (c["micro_batch"], c["seq_len"], c["checkpointing"]))
        bad = dict(rows[0], config=dict(rows[0]["config"], micro_batch=3))
        with self.assertRaisesRegex(ValueError, "the record says"):
            cc.spec_from_record(bad)
        bad = dict(rows[0], config={"model": "qwen2vl"})
        with self.assertRaisesRegex(ValueError, "config lacks"):
            cc.spec_from_record(bad)

    @unittest.skipUnless(MMGUARD, NO_MMGUARD)
    def test_params_equal_the_measured_model(self):
        """One row per group and file: the predictor's parameters per module, total and
        trainable, equal what calibrate.py counted on the GPU model."""
        seen = set()
        for name in ("h100-80gb.jsonl", "h200.jsonl"):
            for r in self.qwen_rows(name):
                if (name, r["group"]) in seen:
                    continue
                seen.add((name, r["group"]))
                pred, err = compare.predict(MMGUARD, cc.spec_from_record(r))
                self.assertIsNone(err, r["id"])
                self.assertEqual(cc.params_mismatch(r["params"], pred["modules"]), [], r["id"])
                vt = r["params"]["vision_tower"]
                wrong = dict(r["params"], vision_tower=dict(vt, trainable=vt["trainable"] + 1))
                self.assertIn("vision_tower: %d trainable predicted, %d measured"
                              % (vt["trainable"], vt["trainable"] + 1),
                              cc.params_mismatch(wrong, pred["modules"]))
        self.assertEqual(len(seen), 15)  # 9 groups on the H100, 6 on the H200

    @unittest.skipUnless(MMGUARD, NO_MMGUARD)
    def test_compare_rebuilds_and_refuses(self):
        recs = [r for r in gpu_records("h200.jsonl")
                if r.get("group") == "qwen2vl2b-finetune-sdpa"]
        s = compare.compare(recs, MMGUARD)
        self.assertEqual(len(s["rebuilt"]), 5)
        self.assertEqual(s["refused"], [])
        self.assertEqual({x["spec"] for x in s["all_rows"]}, {"rebuilt"})
        # the spec must describe the model that ran: a record whose model had another
        # depth than its config says is refused, and --check-goals fails on it
        bad = json.loads(json.dumps(recs))
        for r in bad:
            if r.get("kind") == "measurement":
                r["params"]["language_model"]["total"] += 1
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "bad.jsonl")
            for r in bad:
                cc.append_record(path, r)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                rc = compare.main(["--mmguard", MMGUARD, "--check-goals", path])
            self.assertEqual(rc, 1)
            self.assertIn("REFUSED qwen2vl2b-finetune-sdpa-b8-s2048-ck1: rebuilt spec's "
                          "parameter counts differ", out.getvalue())
        finally:
            shutil.rmtree(d)

    @unittest.skipUnless(MMGUARD, NO_MMGUARD)
    def test_leftover_hook_rows_excluded(self):
        s = compare.compare(gpu_records("h200.jsonl"), MMGUARD)
        ex = {x["id"] for x in s["excluded"]}
        self.assertEqual(len(ex), 11)
        for i in ex:
            self.assertTrue(i.startswith("qwen") and i.endswith("-ck0"), i)
        self.assertNotIn("qwen2vl2b-full-sdpa-b2-s1024-ck0", ex)  # trainable tower
        self.assertFalse(ex & {x["id"] for x in s["rows"]})  # not in the goals' rows
        s = compare.compare(gpu_records("h100-80gb.jsonl"), MMGUARD)
        ids = {x["id"] for x in s["rows"]}
        self.assertIn("trace-qwen25vl7b-lora-gc-b2-s2048-ck0", ids)  # a fresh worker
        # the re-measurement removed the hooks but did not record it: --hooks-removed
        rerun = gpu_records(os.path.join("qwen-rerun", "h200.jsonl"))
        self.assertEqual(len(compare.compare(rerun, MMGUARD)["excluded"]), 11)
        s = compare.compare(rerun, MMGUARD, hooks_removed=True)
        self.assertEqual((s["excluded"], s["n_measured"], s["refused"]), ([], 18, []))


class TestLeftoverHooks(unittest.TestCase):
    def rec(self, group, ck, status="ok", **cfg):
        return {"kind": "measurement", "group": group, "id": "%s-%d" % (group, ck),
                "status": status, "config": dict({"checkpointing": bool(ck)}, **cfg)}

    def test_file_order(self):
        init = {"kind": "probe", "probe": "init", "group": "g"}
        a1, a0, b0 = self.rec("g", 1), self.rec("g", 0), self.rec("g", 0)
        other = self.rec("h", 0)
        got = cc.leftover_input_hooks([init, a1, a0, other, dict(init), b0])
        self.assertEqual(set(got), {id(a0)})
        skipped = self.rec("g", 1, status="skipped")
        c0 = self.rec("g", 0)
        self.assertEqual(cc.leftover_input_hooks([init, skipped, c0]), {})
        # the fixed harness says how many hooks were live
        n0 = self.rec("g", 0, input_grad_hooks=0)
        n2 = self.rec("g", 0, input_grad_hooks=2)
        self.assertEqual(set(cc.leftover_input_hooks([init, a1, n0, n2])), {id(n2)})

    def test_reach(self):
        qwen = {"params": {"vision_tower": {"total": 5, "trainable": 0}}, "build": {}}
        llava = {"params": {"vision_tower": {"total": 5, "trainable": 0}},
                 "build": {"vision_no_grad": True}}
        full = {"params": {"vision_tower": {"total": 5, "trainable": 5}}, "build": {}}
        text = {"params": {"language_model": {"total": 5, "trainable": 5}}}
        self.assertEqual([cc.hooks_reach_frozen_tower(r) for r in (qwen, llava, full, text)],
                         [True, False, False, False])


class FakeHandle:
    def __init__(self, live):
        self.live = live
        live.add(self)

    def remove(self):
        self.live.discard(self)


class FakeHfModel:
    """transformers 5.17's hook bookkeeping (modeling_utils.py): enable registers a new
    list and forgets the old one; gradient_checkpointing_enable calls it;
    gradient_checkpointing_disable leaves the hooks (no PEFT integration)."""

    def __init__(self):
        self.live = set()
        self.is_gradient_checkpointing = False

    def enable_input_require_grads(self):
        self._require_grads_hooks = [FakeHandle(self.live), FakeHandle(self.live)]
        self._require_grads_hook = self._require_grads_hooks[0]

    def disable_input_require_grads(self):
        for h in getattr(self, "_require_grads_hooks", []):
            h.remove()
        self._require_grads_hooks = []

    def gradient_checkpointing_enable(self, **kw):
        self.is_gradient_checkpointing = True
        self.enable_input_require_grads()

    def gradient_checkpointing_disable(self):
        self.is_gradient_checkpointing = False


class TestSetCheckpointing(unittest.TestCase):
    def test_no_hook_survives(self):
        class A:
            use_reentrant = "default"
        for mode in ("finetune", "pretrain", "lora", "full"):
            g = cc.Group("g", "qwen2vl", "qwen2-1.5b", mode, "sdpa", [(1, 1024, True)])
            r = calibrate.GpuRunner(A(), g, None)
            r.hf_model = m = FakeHfModel()
            for _ in range(2):
                r.set_checkpointing(True)
                self.assertTrue(m.live)
            self.assertEqual(len(r.grad_hooks), len(m.live))
            r.set_checkpointing(False)
            self.assertEqual(m.live, set(), mode)
            self.assertEqual(r.grad_hooks, [])


def synth_records(ctx=600 * MIB, frac=0.025, fixed=300 * MIB, n=30, seed=7, noise=4 * MIB):
    rnd = random.Random(seed)
    g = cc.default_grid()[2]
    recs = []
    for i in range(n):
        c = cc.Config(g, 1 + i % 16, 1024 + 32 * i, i % 2 == 0)
        a = rnd.randint(1 * GIB, 70 * GIB)
        r = int(a * (1 + frac) + fixed + rnd.uniform(-noise, noise))
        c_eff = ctx - rnd.randint(0, 24) * MIB
        recs.append({"kind": "measurement", "id": c.id + "-%d" % i, "status": "ok",
                     "config": c.harness_dict(), "env": {"gpu_name": "NVIDIA H100 80GB HBM3"},
                     "measured": {"max_memory_allocated": a, "max_memory_reserved": r,
                                  "cuda_context_effective": c_eff,
                                  "device_peak_bytes": r + c_eff}})
        if i % 5 == 0:
            recs.append({"kind": "probe", "probe": "init", "cuda_context_idle": ctx - 100 * MIB,
                         "cuda_context_after_matmul": ctx - 60 * MIB,
                         "env": {"gpu_name": "NVIDIA H100 80GB HBM3"}})
    recs.append({"kind": "measurement", "id": "oom1", "status": "oom", "config": {}})
    return recs


class TestFit(unittest.TestCase):
    def test_recovers_constants(self):
        recs = synth_records()
        device, ev = fit.fit(recs)
        # the largest after-step value, rounded up to a MiB
        top = max(r["measured"]["cuda_context_effective"] for r in recs if "measured" in r)
        self.assertEqual(device["cuda_context"], top)
        self.assertAlmostEqual(device["allocator_fraction"], 0.025, delta=0.0005)
        self.assertAlmostEqual(device["allocator_fixed"], 300 * MIB, delta=24 * MIB)
        self.assertEqual(device["allocator_fixed"] % 512, 0)
        self.assertEqual(ev["allocator"]["chosen"], "least_squares")
        self.assertEqual(ev["n_measured"], 30)
        self.assertLess(ev["device_mape_with_measured_allocated_pct"], 0.2)
        self.assertEqual(ev["cuda_context"]["idle_after_init"]["max"], 500 * MIB)
        buf = io.StringIO()
        fit.report(device, ev, buf)
        txt = buf.getvalue()
        self.assertIn("device:\n  cuda_context: %d" % top, txt)
        self.assertIn("<- chosen", txt)
        self.assertIn("idle_after_init", txt)
        self.assertIn("nccl: not measurable", txt)

    def test_prefers_simple_model(self):
        device, ev = fit.fit(synth_records(frac=0.0, fixed=120 * MIB, noise=0))
        self.assertIn(ev["allocator"]["chosen"], ("fixed_only",))
        self.assertEqual(device["allocator_fraction"], 0.0)
        self.assertEqual(device["allocator_fixed"], 120 * MIB)
        device, ev = fit.fit(synth_records(frac=0.04, fixed=0, noise=0))
        self.assertEqual(ev["allocator"]["chosen"], "fraction_only")

    def test_conservative_covers_every_point(self):
        recs = synth_records()
        device, ev = fit.fit(recs, conservative=True)
        for r in fit.ok_measurements(recs):
            m = r["measured"]
            p = m["max_memory_allocated"] * (1 + device["allocator_fraction"]) + \
                device["allocator_fixed"]
            self.assertGreaterEqual(p + 1, m["max_memory_reserved"])

    def test_no_data_and_simulated_excluded(self):
        with self.assertRaises(fit.FitError):
            fit.fit([])
        sim = synth_records()
        for r in sim:
            r["simulated"] = True
        with self.assertRaises(fit.FitError):
            fit.fit(sim)
        fit.fit(sim, allow_simulated=True)
        with self.assertRaises(fit.FitError):
            fit.fit(synth_records(), gpu="H200")

    def test_idle_only_is_flagged_lower_bound(self):
        recs = synth_records()
        for r in recs:
            if r.get("kind") == "measurement" and "measured" in r:
                del r["measured"]["cuda_context_effective"]
        device, ev = fit.fit(recs)
        self.assertEqual(device["cuda_context"], 540 * MIB)
        self.assertIn("lower bound", ev["cuda_context"]["chosen"])

    def test_cli_json_feeds_compare(self):
        d = tempfile.mkdtemp()
        try:
            p = os.path.join(d, "d.jsonl")
            for r in synth_records():
                cc.append_record(p, r)
            js = os.path.join(d, "fit.json")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(fit.main(["--json-out", js, p]), 0)
            self.assertIn("device:", out.getvalue())
            dev = compare.load_device(js)
            self.assertEqual(set(dev), {"cuda_context", "allocator_fixed", "allocator_fraction"})
            with contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(fit.main([os.path.join(d, "empty.jsonl")]), 1)
        finally:
            shutil.rmtree(d)


@unittest.skipUnless(have("torch"), "torch not importable: skipping the torch-side unit checks")
class TestTorchPieces(unittest.TestCase):
    def test_builtin_lora_peft_semantics(self):
        import torch
        from torch import nn

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.q_proj = nn.Linear(16, 16, bias=False)
                self.o_proj = nn.Linear(16, 16, bias=False)

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.vision_tower = Attn()
                self.language_model = nn.Module()
                self.language_model.self_attn = Attn()

        m = M()
        x = torch.randn(2, 3, 16)
        ref = m.language_model.self_attn.q_proj(x)
        n = calibrate.apply_builtin_lora(m, {"r": 4, "alpha": 8, "dropout": 0.0,
                                             "target_modules": ["q_proj"]})
        self.assertEqual(n, 1)  # the vision tower's q_proj is left alone
        q = m.language_model.self_attn.q_proj
        self.assertIsInstance(q.lora_dropout, nn.Identity)
        self.assertEqual(q.scaling, 2.0)
        self.assertTrue(torch.equal(q(x), ref))  # B = 0 at init
        self.assertIsInstance(m.vision_tower.q_proj, nn.Linear)
        calibrate.apply_builtin_lora(m, {"r": 2, "alpha": 2, "dropout": 0.05,
                                         "target_modules": ["o_proj"]})
        self.assertIsInstance(m.language_model.self_attn.o_proj.lora_dropout, nn.Dropout)

    def test_no_grad_wrapper(self):
        import torch
        from torch import nn
        lin = nn.Linear(4, 4)
        calibrate.wrap_no_grad(lin)
        calibrate.wrap_no_grad(lin)  # idempotent
        y = lin(torch.randn(2, 4))
        self.assertFalse(y.requires_grad)

    def test_part_of_both_layouts(self):
        p = calibrate.part_of
        self.assertEqual(p("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"), "vision_tower")
        self.assertEqual(p("model.vision_tower.vision_model.embeddings.patch_embedding.weight"),
                         "vision_tower")
        self.assertEqual(p("multi_modal_projector.linear_1.weight"), "projector")
        self.assertEqual(p("model.multi_modal_projector.linear_2.bias"), "projector")
        self.assertEqual(p("language_model.model.layers.0.self_attn.q_proj.weight"), "language_model")
        self.assertEqual(p("model.language_model.layers.0.mlp.up_proj.weight"), "language_model")
        self.assertEqual(p("lm_head.weight"), "language_model")


@unittest.skipUnless(have("torch") and have("transformers"),
                     "torch and transformers not both importable: skipping the CPU model smoke test")
class TestCpuModelSmoke(unittest.TestCase):
    """Builds tiny LLaVA / Llama models with the harness's own code on the CPU and runs
    two training steps per mode: the model-building path minus CUDA."""

    def setUp(self):
        self.saved = (dict(cc.CLIP_VIT_L_336), dict(cc.LLMS), calibrate.DEVICE)
        cc.CLIP_VIT_L_336.update({"hidden_size": 32, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "intermediate_size": 64,
                                  "image_size": 28, "patch_size": 14})
        cc.LLMS["tiny-test"] = {"hidden_size": 32, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2,
                                "intermediate_size": 64, "vocab_size": 128}
        calibrate.DEVICE = "cpu"

    def tearDown(self):
        cc.CLIP_VIT_L_336.clear()
        cc.CLIP_VIT_L_336.update(self.saved[0])
        cc.LLMS.clear()
        cc.LLMS.update(self.saved[1])
        calibrate.DEVICE = self.saved[2]

    def run_group(self, model, mode, lora=None):
        import torch

        class A:
            lora_impl = "auto"
            use_reentrant = "default"
        g = cc.Group("t-%s-%s" % (model, mode), model, "tiny-test", mode, "sdpa",
                     [(2, 16, True), (2, 16, False)], lora=lora)
        runner = calibrate.GpuRunner(A(), g, None)
        runner.build(16)
        for c in g.configs():
            runner.set_checkpointing(c.checkpointing)
            opt = torch.optim.AdamW([p for p in runner.model.parameters() if p.requires_grad])
            batch = calibrate.make_batch(g, c, runner.build_info["legacy_image_merge"])
            for _ in range(2):
                loss = runner._step(batch, opt, {"phase": None, "step": 0}, None)
            self.assertEqual(loss, loss)  # not NaN
        return runner

    def test_modes(self):
        r = self.run_group("llava", "pretrain")
        self.assertEqual(r.param_counts["language_model"]["trainable"], 0)
        self.assertGreater(r.param_counts["projector"]["trainable"], 0)
        self.assertEqual(r.param_counts["vision_tower"]["trainable"], 0)
        r = self.run_group("llava", "lora", lora={"r": 4, "alpha": 8, "dropout": 0.05,
                                                  "target_modules": ["q_proj", "v_proj"]})
        self.assertGreater(r.param_counts["language_model_lora"]["trainable"], 0)
        self.assertNotIn("vision_tower_lora", r.param_counts)
        r = self.run_group("llava", "finetune")
        self.assertGreater(r.param_counts["language_model"]["trainable"], 0)
        self.run_group("llama", "finetune")


@unittest.skipUnless(have("torch") and have("transformers"),
                     "torch and transformers not both importable: skipping the Qwen-VL CPU test")
class TestCpuQwenSmoke(unittest.TestCase):
    """A tiny Qwen2-VL / Qwen2.5-VL built by calib_qwen on the CPU: the parameter counts
    of the real model equal the predictor's for spec_for's spec (the check compare.py
    applies to rebuilt rows), and a config without checkpointing measured after one with
    it runs with no input hook left on the vision tower (set_checkpointing)."""

    def setUp(self):
        self.saved = (dict(cc.QWEN2VL_VIT), dict(cc.QWEN25VL_VIT), dict(cc.LLMS),
                      calibrate.DEVICE)
        tiny = {"depth": 2, "num_heads": 2}
        cc.QWEN2VL_VIT.update(tiny, embed_dim=32, mlp_ratio=2)
        cc.QWEN25VL_VIT.update(tiny, hidden_size=32, intermediate_size=48,
                               fullatt_block_indexes=[1])
        cc.LLMS["tiny-qwen"] = {"hidden_size": 64, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2,
                                "intermediate_size": 96, "vocab_size": 151936,
                                "tie_word_embeddings": True}
        calibrate.DEVICE = "cpu"

    def tearDown(self):
        for d, old in zip((cc.QWEN2VL_VIT, cc.QWEN25VL_VIT, cc.LLMS), self.saved):
            d.clear()
            d.update(old)
        calibrate.DEVICE = self.saved[3]

    def runner(self, model, mode, points, lora=None):
        class A:
            lora_impl = "auto"
            use_reentrant = "default"
        g = cc.Group("t-%s-%s" % (model, mode), model, "tiny-qwen", mode, "sdpa", points,
                     lora=lora, image_grid=(4, 4))
        r = calibrate.GpuRunner(A(), g, None)
        r.build(64)
        return g, r

    def saved_bytes(self, r, g, cfg):
        """Bytes autograd saves for backward in one forward of cfg (its own batch)."""
        import torch
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t
        r.set_checkpointing(cfg.checkpointing)
        batch = calibrate.make_batch(g, cfg, False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            r.model(**batch, use_cache=False).loss.backward()
        for p in r.model.parameters():
            p.grad = None
        return total[0]

    def test_no_hook_left_after_checkpointing(self):
        for model, mode in (("qwen2vl", "finetune"), ("qwen25vl", "pretrain")):
            g, r = self.runner(model, mode, [(1, 32, True), (1, 32, False)])
            ck1, ck0 = g.configs()
            visual = next(m for n, m in r.hf_model.named_modules() if n.endswith("visual"))
            fresh = self.saved_bytes(r, g, ck0)
            self.saved_bytes(r, g, ck1)
            self.assertTrue(visual.patch_embed._forward_hooks, "5.x hooks patch_embed")
            after = self.saved_bytes(r, g, ck0)
            self.assertEqual(dict(visual.patch_embed._forward_hooks), {}, model)
            self.assertEqual(after, fresh, "%s: a ck0 config after a ck1 one saves what a "
                             "fresh one does" % model)

    @unittest.skipUnless(MMGUARD, NO_MMGUARD)
    def test_spec_params_equal_the_real_model(self):
        lora = {"r": 4, "alpha": 8, "dropout": 0.05,
                "target_modules": list(cc.QWEN_LORA["target_modules"])}
        for model, mode in (("qwen2vl", "finetune"), ("qwen2vl", "full"),
                            ("qwen25vl", "lora"), ("qwen25vl", "pretrain")):
            g, r = self.runner(model, mode, [(1, 32, False)], lora=lora if mode == "lora" else None)
            spec = cc.spec_for(g.configs()[0], framework={"transformers_version": "5.17",
                                                          "torch_version": "2.11"})
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(spec, f)
            try:
                out = subprocess.run([MMGUARD, "predict", f.name, "--json"],
                                     capture_output=True, text=True, timeout=60)
            finally:
                os.unlink(f.name)
            self.assertEqual(out.returncode, 0, out.stderr)
            mods = json.loads(out.stdout)["modules"]
            self.assertEqual(cc.params_mismatch(r.param_counts, mods), [], (model, mode))


if __name__ == "__main__":
    unittest.main()
