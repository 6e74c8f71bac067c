"""The job-side recorder: what a training step really used (docs/outcome.md).

The record is one JSON object (format version 1) written atomically (a
temporary file in the same directory, then rename) to ``$MMGUARD_RECORD``,
which the mmguard SPANK plugin sets for the tasks of a checked job.  It is
written at the second completed step and at exit.  Only rank 0 (``RANK``,
else ``SLURM_PROCID``) writes; the others record nothing.

Nothing here needs the network, and nothing but the standard library is
required: torch, the NVML bindings (nvidia-ml-py) and transformers are used
when importable.  On a machine without CUDA the CUDA fields are ``null`` and
``absent`` says why.
"""
import atexit
import contextlib
import datetime
import json
import os
import resource
import sys
import tempfile
import threading

FORMAT_VERSION = 1
PHASES = ("setup", "forward", "backward", "optimizer", "step", "exit")
MAX_TEXT = 200  # the plugin refuses longer strings


def _torch():
    try:
        import torch
        return torch
    except Exception:  # no torch: host memory only
        return None


def _rank():
    for var in ("RANK", "SLURM_PROCID"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0


def _world_size(torch):
    try:
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            return int(torch.distributed.get_world_size())
    except Exception:
        pass
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    return 1


def host_peak_rss():
    """Peak resident set size of this process, bytes (Linux: ru_maxrss is KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def is_oom(exc):
    """'cuda' for torch.OutOfMemoryError, 'host' for the CPU allocator's
    failure (a RuntimeError in torch), else None."""
    torch = _torch()
    if torch is not None and isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return "cuda"
    if isinstance(exc, MemoryError):
        return "host"
    if isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc):
        return "host"
    return None


def _tensors(out, depth=0):
    """The tensors of a forward's output (tensor, tuple/list, dict/ModelOutput)."""
    if depth > 3:
        return
    if hasattr(out, "register_hook") and hasattr(out, "shape"):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from _tensors(v, depth + 1)
    elif isinstance(out, (tuple, list)):
        for v in out:
            yield from _tensors(v, depth + 1)


class _NvmlSampler:
    """Device-level used memory (all processes on the GPU), sampled."""

    def __init__(self, torch, interval):
        self.peak = None
        self.total = None
        self.why = None
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = self._device_handle(torch, pynvml)
            self.total = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).total)
        except Exception as e:  # no bindings, no driver, no device
            self.why = "nvml: %s" % (type(e).__name__,)
            return
        self._interval = interval
        self.sample()
        self._thread = threading.Thread(target=self._run, name="mmguard-nvml", daemon=True)
        self._thread.start()

    @staticmethod
    def _device_handle(torch, pynvml):
        idx = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        if hasattr(p, "pci_bus_id"):
            bus = "%08x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        return pynvml.nvmlDeviceGetHandleByIndex(idx)

    def sample(self):
        try:
            used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception:
            return
        if self.peak is None or used > self.peak:
            self.peak = used

    def _run(self):
        while not self._stop.wait(self._interval):
            self.sample()

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=1.0)
            self.sample()
            self._thread = None


class Recorder:
    """Collects the job's memory facts and writes the record file.

    ``path`` defaults to ``$MMGUARD_RECORD``; without one (and on ranks other
    than 0) nothing is written, so the recorder can stay in a script that
    runs outside Slurm."""

    def __init__(self, path=None, nvml=True, nvml_interval=0.05, rank=None):
        self.path = path if path is not None else os.environ.get("MMGUARD_RECORD") or None
        self.rank = _rank() if rank is None else rank
        self.steps = 0
        self.phase = "setup"
        self.max_seq_len = None
        self.micro_batch = None
        self.oom = None
        self.status = "running"
        self.written = 0
        self._torch = _torch()
        self._cuda = bool(self._torch is not None and self._torch.cuda.is_available())
        self._nvml = _NvmlSampler(self._torch, nvml_interval) if (nvml and self._cuda) else None
        self._hooks = []
        self._closed = False

    # ---- what the job tells us ------------------------------------------------
    def set_phase(self, phase):
        self.phase = phase if phase in PHASES else "step"

    def observe(self, micro_batch=None, seq_len=None):
        """The shape of one micro-batch: keeps the largest seen."""
        if micro_batch is not None and (self.micro_batch is None or micro_batch > self.micro_batch):
            self.micro_batch = int(micro_batch)
        if seq_len is not None and (self.max_seq_len is None or seq_len > self.max_seq_len):
            self.max_seq_len = int(seq_len)

    def observe_inputs(self, args, kwargs):
        """Micro-batch and sequence length from a forward call's input_ids (or
        its first tensor argument of two or more dimensions)."""
        t = kwargs.get("input_ids") if kwargs else None
        if t is None:
            for a in list(args) + list((kwargs or {}).values()):
                if hasattr(a, "shape") and len(a.shape) >= 2:
                    t = a
                    break
        if t is not None and hasattr(t, "shape") and len(t.shape) >= 2:
            self.observe(int(t.shape[0]), int(t.shape[1]))

    def step_done(self):
        """One optimizer step completed: the record is written at the second."""
        self.steps += 1
        self.phase = "step"
        if self.steps == 2:
            self.write()

    def record_oom(self, exc, phase=None):
        kind = is_oom(exc)
        if kind is None:
            return False
        msg = " ".join(str(exc).split())[:MAX_TEXT]
        self.oom = {"phase": phase or self.phase, "kind": kind, "message": msg}
        self.status = "oom"
        return True

    # ---- hooks ------------------------------------------------------------------
    def watch(self, model=None, optimizer=None):
        """Plain torch / Accelerate: phases and shapes from module and
        optimizer hooks (an Accelerate-prepared optimizer is unwrapped)."""
        if model is not None:
            model = getattr(model, "module", model)

            def pre_forward(_m, args, kwargs):
                # the model's own forward (a checkpointed layer's re-run in
                # the backward runs inner modules only)
                self.phase = "forward"
                self.observe_inputs(args, kwargs)

            def post_forward(_m, _args, out):
                # the backward starts where the gradient of an output is
                # computed: a hook on each output tensor (module backward hooks
                # do not fire for HF's ModelOutput dicts)
                for t in _tensors(out):
                    if getattr(t, "requires_grad", False):
                        t.register_hook(self._backward_started)

            self._hooks.append(model.register_forward_pre_hook(pre_forward, with_kwargs=True))
            self._hooks.append(model.register_forward_hook(post_forward))
        if optimizer is not None:
            opt = getattr(optimizer, "optimizer", optimizer)
            self._hooks.append(opt.register_step_pre_hook(lambda *_: self.set_phase("optimizer")))
            self._hooks.append(opt.register_step_post_hook(lambda *_: self.step_done()))
        return self

    def _backward_started(self, _grad):
        self.phase = "backward"

    def unwatch(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def install_exit_hooks(self):
        """Record at interpreter exit, and an OOM that nobody caught."""
        prev = sys.excepthook

        def hook(tp, value, tb):
            if value is not None and self.record_oom(value):
                self.close()
            elif value is not None and not isinstance(value, KeyboardInterrupt):
                self.close("error")
            prev(tp, value, tb)

        sys.excepthook = hook
        atexit.register(self.close)
        return self

    # ---- the record -------------------------------------------------------------
    def _cuda_fields(self):
        keys = ("max_allocated", "max_reserved", "alloc_retries", "ooms", "device")
        f = dict.fromkeys(keys)
        if not self._cuda:
            return f
        try:
            s = self._torch.cuda.memory_stats()
            f["max_allocated"] = int(s.get("allocated_bytes.all.peak", 0))
            f["max_reserved"] = int(s.get("reserved_bytes.all.peak", 0))
            f["alloc_retries"] = int(s.get("num_alloc_retries", 0))
            f["ooms"] = int(s.get("num_ooms", 0))
            f["device"] = str(self._torch.cuda.get_device_name())[:MAX_TEXT]
        except Exception:
            pass
        return f

    def _absent(self):
        out = []
        if self._torch is None:
            out.append("cuda: torch is not importable")
        elif not self._cuda:
            out.append("cuda: no CUDA device")
        if self._nvml is None or self._nvml.peak is None:
            out.append(self._nvml.why if (self._nvml and self._nvml.why) else "nvml: no CUDA device")
        return out

    def snapshot(self):
        """The record as a dict (what write() stores)."""
        if self._nvml is not None:
            self._nvml.sample()
        rec = {"v": FORMAT_VERSION, "status": self.status, "phase": self.phase,
               "steps": self.steps,
               "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "rank": self.rank, "world_size": _world_size(self._torch),
               "micro_batch": self.micro_batch, "max_seq_len": self.max_seq_len,
               "host_peak_rss": host_peak_rss(), "cuda": self._cuda}
        rec.update(self._cuda_fields())
        nv = self._nvml
        rec["nvml_peak_used"] = nv.peak if nv is not None else None
        rec["nvml_total"] = nv.total if nv is not None else None
        rec["oom"] = self.oom
        rec["absent"] = self._absent()
        return rec

    def write(self):
        """Write the record now (rank 0 with a path only); never raises."""
        if not self.path or self.rank != 0:
            return False
        try:
            data = json.dumps(self.snapshot(), sort_keys=True, separators=(",", ":")) + "\n"
            d = os.path.dirname(os.path.abspath(self.path))
            fd, tmp = tempfile.mkstemp(prefix=".mmguard-", dir=d)
            with os.fdopen(fd, "w") as f:
                f.write(data)
            os.replace(tmp, self.path)
            self.written += 1
            return True
        except Exception as e:  # a recorder must never break the job
            print("mmguard: cannot write the record %s: %s" % (self.path, e), file=sys.stderr)
            return False

    def close(self, status=None):
        """The final record: done, oom (if one was recorded) or error."""
        if self._closed:
            return
        self._closed = True
        if status is not None and self.status != "oom":
            self.status = status
        elif self.status == "running":
            self.status = "done"
        if self._nvml is not None:
            self._nvml.stop()
        self.unwatch()
        self.write()


@contextlib.contextmanager
def recording(model=None, optimizer=None, path=None, **kw):
    """``with mmguard.recording(model, optimizer) as rec:`` -- records the
    block; an OOM raised inside it is recorded with its phase and re-raised."""
    rec = Recorder(path=path, **kw)
    rec.watch(model, optimizer)
    try:
        yield rec
    except BaseException as e:
        if not rec.record_oom(e):
            rec.close("error")
        raise
    finally:
        rec.close()
