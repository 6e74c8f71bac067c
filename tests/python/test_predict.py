"""mmguard.predict (python/mmguard/predict.py): the C predictor through
build/libmmguard.so with ctypes, no second implementation.  It must give what
`mmguard predict --json` gives for the same files, take transformers' own
config and TrainingArguments objects, and the Trainer callback must stop a
job whose predicted peak does not fit the card before its first step.

    make check-python   (MMGUARD_LIB=build/libmmguard.so, MMGUARD=build/mmguard)
"""
import json
import os
import subprocess
import tempfile
import unittest
import warnings

import torch

import mmguard
import mmguard.hf as mmguard_hf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("MMGUARD", os.path.join(ROOT, "build", "mmguard"))
LLAVA = os.path.join(ROOT, "tests", "fixtures", "import", "llava-1.5-7b-hf")


def cli(spec, *sets):
    args = [CLI, "predict", spec, "--json"]
    for s in sets:
        args += ["--set", s]
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        max_position_embeddings=256, bos_token_id=0, eos_token_id=0,
                                        pad_token_id=0))


class Predict(unittest.TestCase):
    def test_same_as_the_cli_for_the_same_files(self):
        ta = {"per_device_train_batch_size": 2, "bf16": True, "gradient_checkpointing": True}
        got = mmguard.predict(hf_config=LLAVA, training_args=ta, world_size=4,
                              set={"training.seq_len": 2048})
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "ta.json"), "w") as f:
                json.dump(ta, f)
            with open(os.path.join(d, "s.yaml"), "w") as f:
                f.write("name: python\nhf_config: %s\ntrainer: %s/ta.json\n" % (LLAVA, d))
            want = cli(os.path.join(d, "s.yaml"), "training.seq_len=2048", "training.data_parallel=4")
        for k in ("peak_bytes", "allocated_peak_bytes", "reserved_peak_bytes", "peak_event",
                  "data_parallel", "micro_batch_size", "seq_len"):
            self.assertEqual(got[k], want[k], k)
        self.assertEqual(got["data_parallel"], 4)

    def test_spec_file_and_overrides(self):
        spec = os.path.join(ROOT, "contrib", "models", "llava-1.5-7b-lora.yaml")
        got = mmguard.predict(spec=spec, set={"training.micro_batch_size": 3})
        self.assertEqual(got["peak_bytes"], cli(spec, "training.micro_batch_size=3")["peak_bytes"])
        self.assertEqual(got["micro_batch_size"], 3)

    def test_transformers_objects(self):
        from transformers import TrainingArguments
        model = tiny_llama()
        with tempfile.TemporaryDirectory() as d:
            args = TrainingArguments(output_dir=d, per_device_train_batch_size=2,
                                     gradient_checkpointing=True, report_to=[])
            p = mmguard.predict(hf_config=model.config, training_args=args, world_size=2,
                                set={"training.seq_len": 64})
        self.assertEqual(p["micro_batch_size"], 2)
        self.assertEqual(p["data_parallel"], 2)
        self.assertEqual(p["parameters_count"], sum(t.numel() for t in model.parameters()))
        self.assertGreater(p["peak_bytes"], p["allocated_peak_bytes"])

    def test_bad_input_names_the_key(self):
        with self.assertRaises(ValueError) as e:
            mmguard.predict(hf_config=LLAVA, training_args={"use_cpu": True})
        self.assertIn("use_cpu", str(e.exception))
        with self.assertRaises(ValueError):
            mmguard.predict(spec="/nonexistent.yaml")


class Callback(unittest.TestCase):
    def run_trainer(self, **kw):
        from transformers import Trainer, TrainingArguments
        from mmguard.hf import MmguardCallback

        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                ids = torch.arange(16) % 128
                return {"input_ids": ids, "labels": ids}

        with tempfile.TemporaryDirectory() as d:
            args = TrainingArguments(output_dir=d, per_device_train_batch_size=2, max_steps=2,
                                     report_to=[], save_strategy="no", logging_strategy="no")
            cb = MmguardCallback(path=os.path.join(d, "rec.json"), set={"training.seq_len": 16}, **kw)
            t = Trainer(model=tiny_llama(), args=args, train_dataset=Data(), callbacks=[cb])
            stopped = None
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                try:
                    t.train()
                except mmguard_hf.WontFit as e:
                    stopped = e
            self.stopped = stopped
            return t.state.global_step, cb, [str(x.message) for x in w if "mmguard" in str(x.message)]

    def test_stop_before_the_first_step_when_it_does_not_fit(self):
        steps, cb, warned = self.run_trainer(check="stop", gpu_mem=1 << 20)
        self.assertEqual(steps, 0)
        self.assertIn("does not fit the card's 0.0 GiB", str(self.stopped))
        self.assertTrue(any("does not fit" in m for m in warned), warned)
        self.assertGreater(cb.prediction["peak_bytes"], 1 << 20)

    def test_fits_trains_without_warning(self):
        steps, cb, warned = self.run_trainer(check="stop", gpu_mem=80 << 30)
        self.assertIsNone(self.stopped)
        self.assertEqual(steps, 2)
        self.assertEqual(warned, [])
        self.assertEqual(cb.prediction["micro_batch_size"], 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
