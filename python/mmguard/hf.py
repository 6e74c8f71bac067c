"""The Hugging Face Trainer callback: ``Trainer(..., callbacks=[MmguardCallback()])``.

It watches the model's forward and backward (phase, micro-batch, longest
sequence), counts optimizer steps, writes the record at the second step and
at the end of training, and, through the interpreter's exit hooks, records an
out-of-memory error that ends ``trainer.train()``."""
from transformers import TrainerCallback

from .recorder import Recorder


class MmguardCallback(TrainerCallback):
    def __init__(self, path=None, **kw):
        self.recorder = Recorder(path=path, **kw)
        self.recorder.install_exit_hooks()
        self._watching = False

    def on_train_begin(self, args, state, control, model=None, **kw):
        if model is not None and not self._watching:
            self.recorder.watch(model)
            self._watching = True
        self.recorder.observe(micro_batch=args.per_device_train_batch_size)

    def on_step_begin(self, args, state, control, **kw):
        self.recorder.set_phase("forward")

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self.recorder.set_phase("optimizer")

    def on_step_end(self, args, state, control, **kw):
        self.recorder.step_done()

    def on_train_end(self, args, state, control, **kw):
        self.recorder.close()
