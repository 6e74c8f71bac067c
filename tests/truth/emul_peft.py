"""CUDA's mixed-dtype add inside PEFT's LoRA forwards (rows of feat_lorahead.py, opt-in).

PEFT's lora.Linear.forward sums `result = result + lora_B(lora_A(dropout(x))) * scaling`
(peft/tuners/lora/layer.py:1102, PEFT 0.21.2) and lora.Embedding.forward `result = result +
adapter_output` (:1526).  With fp32 adapters on a bf16 model (autocast_adapter_dtype, PEFT's
default) the two operands differ in dtype.  On the CPU, TensorIterator's compute_types makes a
temporary copy of the bf16 operand in the common dtype before the kernel runs ("Creates
temporaries for CPU operations, if needed and requested": `if (common_device.is_cpu())` ...
`promote_inputs_to_common_dtype_` -> `op.tensor().to(common_dtype_)`, aten/src/ATen/TensorIterator.cpp
compute_types); on CUDA there is no such copy: the elementwise kernels cast each element as they
load it (needs_dynamic_casting, aten/src/ATen/native/cuda/Loops.cuh / CUDALoops.cuh).  For the
lm_head the CPU copy is a whole fp32 logits tensor that a GPU never allocates.

patch_model(model) marks each PEFT LoRA layer's forward; inside it, a `+` of two floating
tensors of different dtypes (no 0-dim operand) runs under a dispatch mode that allocates the
output (counted) and computes into it with add.out inside memhook.uncounted(): the CPU's
promotion copy is left out, as the CUDA kernel makes none.  Every other op runs as it is.
Autograd is above the mode: the recorded AddBackward0 is unchanged.
"""
import functools
import threading

import memhook


def _mixed(a, b):
    import torch
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() > 0 and b.dim() > 0
            and a.dtype != b.dtype and a.dtype.is_floating_point and b.dtype.is_floating_point)


def _mode_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class CudaMixedAdd(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten.add.Tensor and _mixed(args[0], args[1]):
                a, b = args[0], args[1]
                out = torch.empty(torch.broadcast_shapes(a.shape, b.shape),
                                  dtype=torch.promote_types(a.dtype, b.dtype), device=a.device)
                with memhook.uncounted():
                    torch.ops.aten.add.out(a, b, alpha=kwargs.get("alpha", 1), out=out)
                return out
            return func(*args, **kwargs)
    return CudaMixedAdd


_STATE = threading.local()
_ORIG = {}


def _install_add():
    """Tensor.__add__: inside a PEFT LoRA forward, a mixed-dtype sum runs under the mode (only
    that add: a mode around the whole forward would itself hold the wrapped Python scalars of
    `* scaling` a moment longer)"""
    import torch
    if "add" in _ORIG:
        return
    _ORIG["add"] = orig = torch.Tensor.__add__
    mode = _mode_class()

    def add(a, b):
        if getattr(_STATE, "depth", 0) and _mixed(a, b):
            with mode():
                return orig(a, b)
        return orig(a, b)
    torch.Tensor.__add__ = add


def patch_model(model):
    """wrap every PEFT LoRA layer's forward; returns the emulation names applied"""
    from peft.tuners.lora.layer import LoraLayer
    _install_add()
    n = 0
    for m in model.modules():
        if not isinstance(m, LoraLayer):
            continue
        orig = m.forward

        @functools.wraps(orig)
        def fwd(*a, _orig=orig, **k):
            _STATE.depth = getattr(_STATE, "depth", 0) + 1
            try:
                return _orig(*a, **k)
            finally:
                _STATE.depth -= 1
        m.forward = fwd
        n += 1
    return ["peft_mixed_add_cuda"] if n else []
