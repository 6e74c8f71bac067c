"""The job-side recorder (python/mmguard) on real torch / transformers steps on
the CPU (the project's venv: make truth-venv).  No mocks: a tiny GPT-2 trained
by the HF Trainer, a plain torch loop, a real allocation failure.

    make check-python      (installs ./python with pip, then runs this)
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch

import mmguard


def tiny_lm():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def read(path):
    with open(path) as f:
        return json.load(f)


class PlainTorch(unittest.TestCase):
    def test_loop_writes_at_second_step_and_exit(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.json")
            model = tiny_lm()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            seen_after_2 = None
            with mmguard.recording(model, opt, path=path) as rec:
                for i, seq in enumerate((8, 24, 16)):
                    ids = torch.randint(0, 64, (3, seq))
                    model(input_ids=ids, labels=ids).loss.backward()
                    opt.step()
                    opt.zero_grad()
                    if i == 1:
                        seen_after_2 = read(path)
            self.assertEqual(rec.written, 2)
            self.assertEqual(seen_after_2["steps"], 2)
            self.assertEqual(seen_after_2["status"], "running")
            r = read(path)
            self.assertEqual(r["v"], 1)
            self.assertEqual(r["status"], "done")
            self.assertEqual(r["steps"], 3)
            self.assertEqual(r["micro_batch"], 3)
            self.assertEqual(r["max_seq_len"], 24)
            self.assertEqual(r["world_size"], 1)
            self.assertFalse(r["cuda"])
            for k in ("max_allocated", "max_reserved", "alloc_retries", "ooms", "nvml_peak_used"):
                self.assertIsNone(r[k], k)
            self.assertIn("cuda: no CUDA device", r["absent"])
            # ru_maxrss of this process, which holds torch: tens of MiB at least
            self.assertGreater(r["host_peak_rss"], 20 << 20)
            self.assertIsNone(r["oom"])

    def test_oom_in_backward_is_recorded_with_its_phase(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.json")
            model = tiny_lm()
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)

            def huge(_m, _gi, _go):  # a real allocation the CPU allocator refuses
                torch.empty(1 << 52, dtype=torch.uint8)

            h = model.transformer.h[0].register_full_backward_hook(huge)
            ids = torch.randint(0, 64, (2, 8))
            with self.assertRaises(RuntimeError):
                with mmguard.recording(model, opt, path=path):
                    model(input_ids=ids, labels=ids).loss.backward()
            h.remove()
            r = read(path)
            self.assertEqual(r["status"], "oom")
            self.assertEqual(r["oom"]["phase"], "backward")
            self.assertEqual(r["oom"]["kind"], "host")
            self.assertIn("allocate", r["oom"]["message"])

    def test_other_error_is_error_and_no_path_writes_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.json")
            with self.assertRaises(ValueError):
                with mmguard.recording(path=path):
                    raise ValueError("x")
            self.assertEqual(read(path)["status"], "error")
            env = dict(os.environ)
            env.pop("MMGUARD_RECORD", None)
            os.environ.pop("MMGUARD_RECORD", None)
            rec = mmguard.Recorder()
            rec.close()
            self.assertEqual(rec.written, 0)
            self.assertEqual(os.listdir(d), ["rec.json"])  # no temporary left

    def test_rank_other_than_zero_writes_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.json")
            rec = mmguard.Recorder(path=path, rank=1)
            rec.close()
            self.assertFalse(os.path.exists(path))


class Accelerate(unittest.TestCase):
    def test_prepared_model_and_optimizer(self):
        from accelerate import Accelerator
        acc = Accelerator(cpu=True)
        model = acc.prepare(tiny_lm())
        opt = acc.prepare(torch.optim.AdamW(model.parameters(), lr=1e-3))
        self.assertIsNot(opt, getattr(opt, "optimizer", opt))  # an AcceleratedOptimizer
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.json")
            with mmguard.recording(model, opt, path=path) as rec:
                for seq in (10, 30):
                    ids = torch.randint(0, 64, (4, seq))
                    acc.backward(model(input_ids=ids, labels=ids).loss)
                    opt.step()
                    opt.zero_grad()
            r = read(path)
            self.assertEqual(rec.written, 2)
            self.assertEqual((r["status"], r["steps"]), ("done", 2))
            self.assertEqual((r["micro_batch"], r["max_seq_len"]), (4, 30))


class Trainer(unittest.TestCase):
    def test_hf_trainer_callback(self):
        from transformers import Trainer as HFTrainer, TrainingArguments
        from mmguard.hf import MmguardCallback

        class Data(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                ids = torch.arange(12) % 64
                return {"input_ids": ids, "labels": ids}

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.json")
            args = TrainingArguments(output_dir=d, per_device_train_batch_size=2, max_steps=3,
                                     report_to=[], save_strategy="no", logging_strategy="no",
                                     use_cpu=True, dataloader_num_workers=0)
            cb = MmguardCallback(path=path)
            HFTrainer(model=tiny_lm(), args=args, train_dataset=Data(), callbacks=[cb]).train()
            r = read(path)
            self.assertEqual(r["status"], "done")
            self.assertEqual(r["steps"], 3)
            self.assertEqual(r["micro_batch"], 2)
            self.assertEqual(r["max_seq_len"], 12)
            self.assertEqual(cb.recorder.written, 2)


class Process(unittest.TestCase):
    def test_uncaught_oom_recorded_at_exit_from_environment_path(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rec.json")
            code = textwrap.dedent("""
                import torch, mmguard
                m = torch.nn.Linear(4, 4)
                opt = torch.optim.SGD(m.parameters(), lr=0.1)
                rec = mmguard.Recorder().watch(m, opt).install_exit_hooks()
                for _ in range(2):
                    m(torch.ones(3, 4)).sum().backward(); opt.step()
                opt.register_step_pre_hook(lambda *a: torch.empty(1 << 52, dtype=torch.uint8))
                m(torch.ones(3, 4)).sum().backward(); opt.step()
            """)
            env = dict(os.environ, MMGUARD_RECORD=path, SLURM_PROCID="0", WORLD_SIZE="4")
            p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("can't allocate memory", p.stderr)
            r = read(path)
            self.assertEqual(r["status"], "oom")
            self.assertEqual(r["oom"]["phase"], "optimizer")
            self.assertEqual(r["steps"], 2)
            self.assertEqual(r["world_size"], 4)
            self.assertEqual(r["micro_batch"], 3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
