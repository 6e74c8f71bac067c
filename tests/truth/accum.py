"""Truth configs: FSDP1 / FSDP2 (and DDP) with gradient accumulation (issue 21 item 5).

Each setup carries `grad_accum` (micro-batches per optimizer step) and
`sync_each_micro_batch`; truth.py run_rank runs the micro-batches the way HF
Trainer does (transformers trainer.py:1823-1842): every micro-batch but the last
under accelerate's no_sync (accelerate accelerator.py:1166-1180: FSDP2
set_requires_gradient_sync(False), FSDP1 / DDP model.no_sync()), unless
sync_each_micro_batch (HF's gradient_accumulation_kwargs.sync_each_batch;
torchtune's loop), when every micro-batch reduce-scatters.  The measured peak
is over the whole optimizer step: all micro-batches, clipping, optimizer.step().

The rows pair with a grad_accum 1 row of the same setup, so that accumulation's
own bytes show.  Small on purpose (2 layers, B 1, S 128): 2 shared CPU cores.
"""

# (family, mode, precision, gc, world, parallel, options, grad_accum, sync_each_micro_batch)
GC = {"use_reentrant": False, "every_n_layers": 1}
U1 = {"use_orig_params": True, "mixed_precision": None}
U0 = {"use_orig_params": False, "mixed_precision": None}
U1MP = {"use_orig_params": True, "mixed_precision": "bf16"}
R1 = {"reshard_after_forward": True, "mixed_precision": None}
R0 = {"reshard_after_forward": False, "mixed_precision": None}
R1MP = {"reshard_after_forward": True, "mixed_precision": "bf16"}
DDP = {"bucket_cap_mb": 25, "gradient_as_bucket_view": False}
DDPV = {"bucket_cap_mb": 25, "gradient_as_bucket_view": True}

ROWS = [
    # FSDP1: use_orig_params both ways, the flat parameters' unsharded .grad under no_sync
    ("llama", "full", "bf16", False, 2, "fsdp1", U1, 1, False),
    ("llama", "full", "bf16", False, 2, "fsdp1", U1, 4, False),
    ("llama", "full", "bf16", False, 2, "fsdp1", U1, 4, True),
    ("llama", "full", "bf16", GC, 2, "fsdp1", U0, 1, False),
    ("llama", "full", "bf16", GC, 2, "fsdp1", U0, 4, False),
    ("llama", "full", "fp32", False, 2, "fsdp1", U1MP, 1, False),
    ("llama", "full", "fp32", False, 2, "fsdp1", U1MP, 2, False),
    ("llama", "lora", "bf16", GC, 4, "fsdp1", U1, 4, False),
    ("llama", "lora", "bf16", GC, 4, "fsdp1", U1, 4, True),
    ("llava", "finetune", "bf16", False, 2, "fsdp1", U1, 1, False),
    ("llava", "finetune", "bf16", False, 2, "fsdp1", U1, 4, False),
    ("llava", "lora", "bf16", GC, 2, "fsdp1", U1, 1, False),
    ("llava", "lora", "bf16", GC, 2, "fsdp1", U1, 4, True),
    # FSDP2: reshard_after_forward both ways, the unsharded .grad (upcast to reduce_dtype
    # with a MixedPrecisionPolicy) under set_requires_gradient_sync(False)
    ("llama", "full", "bf16", False, 2, "fsdp2", R1, 1, False),
    ("llama", "full", "bf16", False, 2, "fsdp2", R1, 4, False),
    ("llama", "full", "bf16", False, 2, "fsdp2", R1, 4, True),
    ("llama", "full", "bf16", GC, 2, "fsdp2", R0, 1, False),
    ("llama", "full", "bf16", GC, 2, "fsdp2", R0, 4, False),
    ("llama", "full", "fp32", False, 2, "fsdp2", R1MP, 1, False),
    ("llama", "full", "fp32", False, 2, "fsdp2", R1MP, 2, False),
    ("llama", "lora", "bf16", GC, 4, "fsdp2", R1, 4, False),
    ("llama", "lora", "bf16", GC, 4, "fsdp2", R1, 4, True),
    ("llava", "finetune", "bf16", False, 2, "fsdp2", R1, 1, False),
    ("llava", "finetune", "bf16", False, 2, "fsdp2", R1, 4, False),
    ("llava", "lora", "bf16", GC, 2, "fsdp2", R0, 4, True),
    # DDP: no_sync keeps .grad outside the buckets between micro-batches
    ("llama", "full", "bf16", False, 2, "ddp", DDP, 1, False),
    ("llama", "full", "bf16", False, 2, "ddp", DDP, 4, False),
    ("llama", "lora", "bf16", GC, 2, "ddp", DDPV, 4, False),
]


_ORIG = {}


def fsdp2_accumulate_cuda():
    """FSDP2 under set_requires_gradient_sync(False) with a MixedPrecisionPolicy whose
    reduce_dtype differs from param_dtype accumulates each new 16-bit gradient into
    the fp32 unsharded_accumulated_grad in place (torch _fully_shard/_fsdp_param.py
    accumulate_unsharded_grad_if_needed: `unsharded_accumulated_grad +=
    unsharded_param.grad`).  On the CPU that mixed-dtype add_ first copies the
    16-bit operand into an fp32 temporary (aten/src/ATen/TensorIterator.cpp
    compute_types: "Creates temporaries for CPU operations", only `if (common_device
    == kCPU)`); the CUDA kernel casts while it loads (no temporary).  The add runs
    uncounted when the dtypes differ, as emul.py's emulations do; the gradient it
    frees is counted as always.  Returns whether it was installed."""
    import memhook
    from torch.distributed.fsdp._fully_shard import _fsdp_param
    cls = _fsdp_param.FSDPParam
    if getattr(cls, "_truth_accumulate_cuda", False):
        return True
    orig = _ORIG.setdefault("accumulate", cls.accumulate_unsharded_grad_if_needed)

    def accumulate(self):
        acc = self.unsharded_accumulated_grad
        grad = self.unsharded_param.grad if acc is not None else None
        if grad is None or grad.dtype == acc.dtype:
            return orig(self)
        with memhook.uncounted():
            return orig(self)
    cls.accumulate_unsharded_grad_if_needed = accumulate
    cls._truth_accumulate_cuda = True
    return True


def install(setup, want=None):
    """the emulations accumulation needs beyond emul.ALL, recorded in the row's emulations;
    want: TRUTH_EMULATIONS (unset: all; else a comma list or "none")"""
    if want is not None and "fsdp2_accumulate_cuda" not in want.split(","):
        return []
    if int(setup.get("grad_accum", 1)) > 1 and setup["parallel"] == "fsdp2":
        return ["fsdp2_accumulate_cuda"] if fsdp2_accumulate_cuda() else []
    return []


def accum_configs():
    import truth
    out = []
    for fam, mode, prec, gc_, world, par, popt, ga, sync in ROWS:
        k, img = (1, (112, 112)) if fam == "llava" else (0, None)
        model = {"layers": 2} if fam == "llama" else {"image": 112, "layers": 2}
        out.append(truth.make_setup(fam, mode, prec, "sdpa", gc_, 1, 128, k, img, "adamw_torch", par, world,
                                    popt=dict(popt), model=model, seed=5, accum=(ga, sync)))
    return out
