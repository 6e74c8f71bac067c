"""The Hugging Face Trainer callback: ``Trainer(..., callbacks=[MmguardCallback()])``.

It watches the model's forward and backward (phase, micro-batch, longest
sequence), counts optimizer steps, writes the record at the second step and
at the end of training, and, through the interpreter's exit hooks, records an
out-of-memory error that ends ``trainer.train()``.

With ``check="warn"`` or ``check="stop"`` it also predicts, at
``on_train_begin``, the step of this very job (the model's config, the
Trainer's arguments, its world size) through libmmguard and compares the
predicted device peak with the card (``gpu_mem`` bytes, default: the CUDA
device's total memory; no card known: no check): "warn" warns, "stop"
raises WontFit from on_train_begin, before the first step runs."""
import sys
import warnings

from transformers import TrainerCallback

from .predict import predict
from .recorder import Recorder


class WontFit(RuntimeError):
    """The predicted peak does not fit the card (check="stop")."""


class MmguardCallback(TrainerCallback):
    def __init__(self, path=None, check=None, gpu_mem=None, set=None, **kw):
        if check not in (None, "warn", "stop"):
            raise ValueError("check: None, 'warn' or 'stop'")
        self.recorder = Recorder(path=path, **kw)
        self.recorder.install_exit_hooks()
        self.check, self.gpu_mem, self.set = check, gpu_mem, set
        self.prediction = None
        self._watching = False

    def _card(self):
        if self.gpu_mem:
            return int(self.gpu_mem)
        try:
            import torch
            if torch.cuda.is_available():
                return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        except Exception:
            pass
        return None

    def _check(self, args, model, control):
        card = self._card()
        if card is None or model is None or not hasattr(model, "config"):
            return
        try:
            self.prediction = predict(hf_config=model.config, training_args=args,
                                      world_size=args.world_size, set=self.set)
        except (OSError, ValueError) as e:
            warnings.warn("mmguard: no prediction for this job: %s" % e)
            return
        peak = self.prediction["peak_bytes"]
        if peak <= card:
            return
        msg = ("mmguard: predicted peak %.1f GiB per GPU does not fit the card's %.1f GiB "
               "(world size %d)" % (peak / 2**30, card / 2**30, args.world_size))
        warnings.warn(msg)
        print(msg, file=sys.stderr)
        if self.check == "stop":
            raise WontFit(msg)

    def on_train_begin(self, args, state, control, model=None, **kw):
        if model is not None and not self._watching:
            self.recorder.watch(model)
            self._watching = True
        self.recorder.observe(micro_batch=args.per_device_train_batch_size)
        if self.check:
            self._check(args, model, control)

    def on_step_begin(self, args, state, control, **kw):
        self.recorder.set_phase("forward")

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self.recorder.set_phase("optimizer")

    def on_step_end(self, args, state, control, **kw):
        self.recorder.step_done()

    def on_train_end(self, args, state, control, **kw):
        self.recorder.close()
